//! What `cubed` and `cubec` share on the command line: how an error reaches the user, and which
//! signals the process was started with ignored.

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

/// Print clap's error `e` for the command line `argv` of `command` and exit with its code
/// (2 for a usage error), adding which environment variable a refused value came from when it
/// was not on the command line: clap names only the flag, which the user may never have typed.
pub fn exit_naming_the_variable(
    e: &clap::Error,
    argv: &[std::ffi::OsString],
    command: &clap::Command,
) -> ! {
    use clap::error::{ContextKind, ContextValue};
    let _ = e.print();
    if let Some(ContextValue::String(shown)) = e.get(ContextKind::InvalidArg)
        && let Some(long) = shown.strip_prefix("--").and_then(|s| s.split(' ').next())
    {
        let flag = format!("--{long}");
        let on_command_line = argv.iter().filter_map(|a| a.to_str()).any(|a| {
            a == flag
                || a.strip_prefix(flag.as_str())
                    .is_some_and(|r| r.starts_with('='))
        });
        if let Some(var) = find_arg(command, long)
            .and_then(|a| a.get_env())
            .and_then(|v| v.to_str())
            && !on_command_line
            && std::env::var_os(var).is_some()
        {
            eprintln!("note: the value of {flag} came from the environment variable {var}");
        }
    }
    std::process::exit(e.exit_code())
}

/// The argument `--long` of `command` or of any of its subcommands.
fn find_arg<'a>(command: &'a clap::Command, long: &str) -> Option<&'a clap::Arg> {
    command
        .get_arguments()
        .find(|a| a.get_long() == Some(long))
        .or_else(|| {
            command
                .get_subcommands()
                .find_map(|sub| find_arg(sub, long))
        })
}

/// Whether the signal numbered `signal` was ignored when the process started (inherited from
/// its parent, as `nohup` does for SIGHUP), from the kernel's `SigIgn` mask in
/// /proc/self/status (the workspace has no `unsafe` for `sigaction`). Ask before installing a
/// handler for it, which replaces the inherited disposition.
pub fn ignored_at_start(signal: i32) -> bool {
    let Ok(bit) = u32::try_from(signal - 1) else {
        return false;
    };
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let mask = status.lines().find_map(|l| l.strip_prefix("SigIgn:"))?;
            u64::from_str_radix(mask.trim(), 16).ok()
        })
        .is_some_and(|mask| bit < 64 && mask & (1 << bit) != 0)
}

#[cfg(test)]
mod tests {
    use super::{error_chain, ignored_at_start};

    #[test]
    fn signals_ignored_at_start_are_known() {
        // Every Rust program ignores SIGPIPE (13); SIGKILL (9) cannot be ignored. (Whether
        // SIGHUP is depends on how the tests were started: `nohup` ignores it.)
        assert!(ignored_at_start(13));
        assert!(!ignored_at_start(9));
        assert!(!ignored_at_start(0), "no signal 0");
        assert!(!ignored_at_start(99), "past the mask");
    }

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
