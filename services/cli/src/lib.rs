//! What `cubed` and `cubec` share on the command line: how an error reaches the user.

/// The error and its causes, `: `-separated like `{:#}`, but without a cause that only repeats
/// the one before it (tonic's and hyper's transport errors wrap an error with the same text:
/// "tcp connect error: tcp connect error: Connection refused").
pub fn error_chain(e: &anyhow::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    for cause in e.chain() {
        let text = without_os_code(&cause.to_string());
        if parts.last() != Some(&text) {
            parts.push(text);
        }
    }
    parts.join(": ")
}

/// `text` without the ` (os error N)` that Rust appends to an operating-system error: the
/// words before it ("No such file or directory") are what a user reads.
pub fn without_os_code(text: &str) -> String {
    match text.rfind(" (os error ") {
        Some(at)
            if text[at + " (os error ".len()..]
                .strip_suffix(')')
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())) =>
        {
            text[..at].to_string()
        }
        _ => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::error_chain;

    #[test]
    fn an_os_error_is_printed_without_its_number() {
        let e = anyhow::anyhow!("No such file or directory (os error 2)")
            .context("cannot read credentials from x.json");
        assert_eq!(
            error_chain(&e),
            "cannot read credentials from x.json: No such file or directory"
        );
        // Only a trailing "(os error N)" goes.
        for kept in [
            "a (os error x)",
            "a (os error )",
            "(os error 2) b",
            "os error 2",
        ] {
            assert_eq!(error_chain(&anyhow::anyhow!(kept.to_string())), kept);
        }
    }

    #[test]
    fn a_cause_that_repeats_the_one_before_is_printed_once() {
        let e = anyhow::anyhow!("Connection refused (os error 111)")
            .context("tcp connect error")
            .context("tcp connect error")
            .context("transport error")
            .context("cannot connect to http://127.0.0.1:1");
        assert_eq!(
            error_chain(&e),
            "cannot connect to http://127.0.0.1:1: transport error: tcp connect error: Connection refused"
        );
    }
}
