//! `cubec load`: write the cells of a JSON Lines file, many calls in flight on the one
//! connection, with progress on a terminal.
//!
//! Each line is one cell: `{"x":1,"y":-2,"z":3,"value":"text"}`, or `"value_hex"` for any bytes
//! (the shape `cubec read` prints), and optionally `"expected_version"` as for `cubec write`.
//! Every line is one `Cells.Write`, acknowledged once durable. The first failure stops the load:
//! no line after it is sent, the calls in flight are let finish, and the error names the line
//! and the longest prefix of the input that is written, from which the load can be resumed.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use cube_api::v1::cells_client::CellsClient;
use cube_api::v1::{Coord, WriteRequest};
use tokio::io::{AsyncBufRead, AsyncBufReadExt as _, BufReader};
use tokio::task::JoinSet;

use crate::Transport;

/// How often a call refused as busy is sent again, and the waits between (doubling).
const BUSY_ATTEMPTS: u32 = 12;
const FIRST_BUSY_WAIT: Duration = Duration::from_millis(5);
const LAST_BUSY_WAIT: Duration = Duration::from_secs(1);

/// One line of the input.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    x: i32,
    y: i32,
    z: i32,
    #[serde(default)]
    value: Option<String>,
    #[serde(default)]
    value_hex: Option<String>,
    #[serde(default)]
    expected_version: Option<u64>,
}

/// The write a line asks for, or why it is not one.
fn parse_line(text: &str) -> Result<WriteRequest, String> {
    let line: Line = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let value = match (line.value, line.value_hex) {
        (Some(text), None) => text.into_bytes(),
        (None, Some(hex)) => unhex(&hex).ok_or_else(|| {
            "\"value_hex\" must be an even number of hex digits (0-9, a-f, A-F)".to_string()
        })?,
        (Some(_), Some(_)) => return Err("give \"value\" or \"value_hex\", not both".into()),
        (None, None) => return Err("give the cell's \"value\" (text) or \"value_hex\"".into()),
    };
    Ok(WriteRequest {
        coord: Some(Coord {
            x: line.x,
            y: line.y,
            z: line.z,
        }),
        value,
        expected_version: line.expected_version,
    })
}

/// Hex digits to bytes (a table lookup per digit: a line holds up to twice the largest value).
fn unhex(s: &str) -> Option<Vec<u8>> {
    const INVALID: u8 = 0xff;
    const TABLE: [u8; 256] = {
        let mut t = [INVALID; 256];
        let mut i = 0;
        while i < 10 {
            t[b'0' as usize + i] = i as u8;
            i += 1;
        }
        let mut i = 0;
        while i < 6 {
            t[b'a' as usize + i] = 10 + i as u8;
            t[b'A' as usize + i] = 10 + i as u8;
            i += 1;
        }
        t
    };
    let digits = s.as_bytes();
    if !digits.len().is_multiple_of(2) {
        return None;
    }
    let mut out = Vec::with_capacity(digits.len() / 2);
    for pair in digits.chunks_exact(2) {
        let (hi, lo) = (TABLE[usize::from(pair[0])], TABLE[usize::from(pair[1])]);
        if hi == INVALID || lo == INVALID {
            return None;
        }
        out.push((hi << 4) | lo);
    }
    Some(out)
}

/// What a finished load wrote.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Loaded {
    pub cells: u64,
    pub value_bytes: u64,
    /// Calls sent again after the tenant answered that it was busy.
    pub busy_retries: u64,
}

/// Lines 1..=`prefix` are all written (or blank); the others written, out of order.
#[derive(Debug, Default)]
struct Written {
    prefix: u64,
    beyond: BTreeSet<u64>,
}

impl Written {
    fn done(&mut self, line: u64) {
        self.beyond.insert(line);
        while self.beyond.remove(&(self.prefix + 1)) {
            self.prefix += 1;
        }
    }
}

/// Write every line of `file` (`-`: standard input) through `cells`, `concurrency` calls at a
/// time. `status` turns a refusal into the error cubec prints.
pub(crate) async fn load(
    cells: CellsClient<Transport>,
    file: &Path,
    concurrency: usize,
    status: fn(tonic::Status) -> anyhow::Error,
) -> anyhow::Result<Loaded> {
    let (input, total): (Box<dyn AsyncBufRead + Unpin + Send>, Option<u64>) =
        if file == Path::new("-") {
            (Box::new(BufReader::new(tokio::io::stdin())), None)
        } else {
            let f = tokio::fs::File::open(file)
                .await
                .with_context(|| format!("cannot open {}", file.display()))?;
            let len = f
                .metadata()
                .await
                .ok()
                .filter(|m| m.is_file())
                .map(|m| m.len());
            (Box::new(BufReader::with_capacity(1 << 20, f)), len)
        };
    let progress = Progress::new(total);
    let result = run(cells, input, concurrency, status, &progress).await;
    progress.finish();
    result.map_err(|failure| failure.into_error(file))
}

/// Why a load stopped, with what it had written.
struct Failure {
    line: u64,
    why: anyhow::Error,
    written: Written,
}

impl Failure {
    fn into_error(self, file: &Path) -> anyhow::Error {
        let Failure { line, why, written } = self;
        let resume = written.prefix + 1;
        let from = if file == Path::new("-") {
            format!("the input from line {resume} on")
        } else {
            format!(
                "`tail -n +{resume} {} | cubec load -`",
                shell_word(&file.to_string_lossy())
            )
        };
        let later = if written.beyond.is_empty() {
            String::new()
        } else {
            format!(
                " ({} later lines too, written before the load stopped: loading them again \
                 writes their cells again, as new versions of the same values)",
                written.beyond.len()
            )
        };
        let prefix = match written.prefix {
            0 => "No line before it is written".to_string(),
            n => format!("Lines 1 to {n} are written, every one durable"),
        };
        why.context(format!(
            "line {line}: the load stopped there. {prefix}{later}; no line after {line} was sent. \
             Resume with {from}"
        ))
    }
}

fn shell_word(s: &str) -> String {
    if s.chars()
        .all(|c| c.is_ascii_alphanumeric() || "/._-+,:=@".contains(c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

async fn run(
    cells: CellsClient<Transport>,
    mut input: Box<dyn AsyncBufRead + Unpin + Send>,
    concurrency: usize,
    status: fn(tonic::Status) -> anyhow::Error,
    progress: &Progress,
) -> Result<Loaded, Failure> {
    let mut written = Written::default();
    let mut loaded = Loaded {
        cells: 0,
        value_bytes: 0,
        busy_retries: 0,
    };
    let mut in_flight: JoinSet<(u64, u64, Result<u32, tonic::Status>)> = JoinSet::new();
    let mut failure: Option<(u64, anyhow::Error)> = None;
    let mut text = String::new();
    let mut line_no = 0u64;
    let mut read_bytes = 0u64;
    loop {
        // Take answers while the window is full, or the input has ended, or a line failed.
        while in_flight.len() >= concurrency || (failure.is_some() && !in_flight.is_empty()) {
            let Some(joined) = in_flight.join_next().await else {
                break;
            };
            settle(joined, &mut written, &mut loaded, &mut failure, status);
            progress.show(read_bytes, &loaded);
        }
        if failure.is_some() {
            break;
        }
        text.clear();
        let n = match input.read_line(&mut text).await {
            Ok(n) => n,
            Err(e) => {
                failure = Some((
                    line_no + 1,
                    anyhow::Error::new(e).context("reading the input"),
                ));
                continue;
            }
        };
        if n == 0 {
            break;
        }
        line_no += 1;
        read_bytes += n as u64;
        let trimmed = text.trim();
        if trimmed.is_empty() {
            written.done(line_no);
            continue;
        }
        let request = match parse_line(trimmed) {
            Ok(r) => r,
            Err(why) => {
                failure = Some((line_no, anyhow::anyhow!("not a cell: {why}")));
                continue;
            }
        };
        let bytes = request.value.len() as u64;
        let mut cells = cells.clone();
        let line = line_no;
        in_flight.spawn(async move { (line, bytes, write(&mut cells, request).await) });
    }
    while let Some(joined) = in_flight.join_next().await {
        settle(joined, &mut written, &mut loaded, &mut failure, status);
        progress.show(read_bytes, &loaded);
    }
    match failure {
        // Several calls in flight can fail: the first line among them is named.
        Some((line, why)) => Err(Failure { line, why, written }),
        None => Ok(loaded),
    }
}

fn settle(
    joined: Result<(u64, u64, Result<u32, tonic::Status>), tokio::task::JoinError>,
    written: &mut Written,
    loaded: &mut Loaded,
    failure: &mut Option<(u64, anyhow::Error)>,
    status: fn(tonic::Status) -> anyhow::Error,
) {
    let (line, bytes, result) = match joined {
        Ok(done) => done,
        // NOTE: a write task neither panics nor is aborted; should one, the load fails at a
        // line it cannot name.
        Err(e) => {
            failure.get_or_insert((0, anyhow::anyhow!("a write task failed: {e}")));
            return;
        }
    };
    match result {
        Ok(retries) => {
            written.done(line);
            loaded.cells += 1;
            loaded.value_bytes += bytes;
            loaded.busy_retries += u64::from(retries);
        }
        Err(s) => {
            if failure.as_ref().is_none_or(|(first, _)| line < *first) {
                *failure = Some((line, status(s)));
            }
        }
    }
}

/// Whether a refusal had no effect and passes with time: the tenant was busy, or the
/// connection's calls were receiving too much at once (cells.proto, "RESOURCE_EXHAUSTED").
fn passes_with_time(s: &tonic::Status) -> bool {
    s.code() == tonic::Code::ResourceExhausted
        && !s.message().contains("outcome is unknown")
        && (s.message().contains("' is busy")
            || s.message()
                .starts_with("this connection's calls are already receiving"))
}

/// One line's write, sent again (freshly signed) while it is refused as busy. Ok: how many
/// times it was sent again.
async fn write(
    cells: &mut CellsClient<Transport>,
    request: WriteRequest,
) -> Result<u32, tonic::Status> {
    let mut wait = FIRST_BUSY_WAIT;
    let mut retries = 0;
    loop {
        match cells.write(request.clone()).await {
            Ok(_) => return Ok(retries),
            Err(s) if passes_with_time(&s) && retries + 1 < BUSY_ATTEMPTS => {
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(LAST_BUSY_WAIT);
                retries += 1;
            }
            Err(s) => return Err(s),
        }
    }
}

/// The load's progress on standard error, drawn only when it is a terminal.
struct Progress {
    bar: indicatif::ProgressBar,
    started: Instant,
}

impl Progress {
    fn new(total: Option<u64>) -> Progress {
        let bar = match total {
            Some(len) => indicatif::ProgressBar::new(len).with_style(
                // The bar takes what the terminal's width leaves.
                indicatif::ProgressStyle::with_template("{msg} {wide_bar} {percent:>3}% eta {eta}")
                    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            ),
            None => indicatif::ProgressBar::new_spinner().with_style(
                indicatif::ProgressStyle::with_template("{spinner} {msg}")
                    .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
            ),
        };
        bar.set_draw_target(indicatif::ProgressDrawTarget::stderr_with_hz(5));
        Progress {
            bar,
            started: Instant::now(),
        }
    }

    fn show(&self, read_bytes: u64, loaded: &Loaded) {
        if self.bar.is_hidden() {
            return;
        }
        self.bar.set_position(read_bytes);
        let secs = self.started.elapsed().as_secs_f64().max(1e-3);
        self.bar.set_message(format!(
            "{} cells, {:.1} MiB, {:.0}/s",
            loaded.cells,
            loaded.value_bytes as f64 / (1 << 20) as f64,
            loaded.cells as f64 / secs
        ));
    }

    fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_cells_with_text_or_hex_values() {
        let w = parse_line(r#"{"x":1,"y":-2,"z":3,"value":"hi"}"#).unwrap();
        assert_eq!(w.coord, Some(Coord { x: 1, y: -2, z: 3 }));
        assert_eq!(w.value, b"hi");
        assert_eq!(w.expected_version, None);
        let w =
            parse_line(r#"{"x":0,"y":0,"z":0,"value_hex":"00fFa1","expected_version":0}"#).unwrap();
        assert_eq!(w.value, [0x00, 0xff, 0xa1]);
        assert_eq!(w.expected_version, Some(0));
        for (bad, why) in [
            (r#"{"x":1,"y":2,"z":3}"#, "give the cell's \"value\""),
            (
                r#"{"x":1,"y":2,"z":3,"value":"a","value_hex":"00"}"#,
                "not both",
            ),
            (r#"{"x":1,"y":2,"z":3,"value_hex":"0"}"#, "even number"),
            (r#"{"x":1,"y":2,"z":3,"value_hex":"zz"}"#, "even number"),
            (
                r#"{"x":1,"y":2,"z":3,"vlaue":"a"}"#,
                "unknown field `vlaue`",
            ),
            (r#"{"x":1,"y":2,"value":"a"}"#, "missing field `z`"),
            (
                r#"{"x":4294967296,"y":2,"z":3,"value":"a"}"#,
                "invalid value",
            ),
            ("x,y,z", "expected value"),
        ] {
            let e = parse_line(bad).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn the_written_prefix_ends_at_the_first_line_not_written() {
        let mut w = Written::default();
        for line in [2, 3, 1, 5] {
            w.done(line);
        }
        assert_eq!(w.prefix, 3);
        assert_eq!(w.beyond.iter().copied().collect::<Vec<_>>(), [5]);
        w.done(4);
        assert_eq!((w.prefix, w.beyond.len()), (5, 0));
    }

    #[test]
    fn only_refusals_that_had_no_effect_and_pass_with_time_are_sent_again() {
        let busy = tonic::Status::resource_exhausted(
            "tenant 'demo' is busy: its mailbox is full; retry with backoff",
        );
        assert!(passes_with_time(&busy));
        let receiving = tonic::Status::resource_exhausted(
            "this connection's calls are already receiving close to 67108864 bytes of request \
             messages",
        );
        assert!(passes_with_time(&receiving));
        for other in [
            tonic::Status::resource_exhausted("the tenant has reached its storage quota"),
            tonic::Status::resource_exhausted(
                "tenant 'demo' is busy … This change was already in the tenant's log, so its \
                 outcome is unknown",
            ),
            tonic::Status::unavailable("tenant 'demo' is busy"),
        ] {
            assert!(!passes_with_time(&other), "{other:?}");
        }
    }

    #[test]
    fn a_failure_names_the_written_prefix_and_the_lines_written_past_it() {
        let first = Failure {
            line: 1,
            why: anyhow::anyhow!("not a cell"),
            written: Written::default(),
        };
        let text = format!("{:#}", first.into_error(Path::new("-")));
        assert!(
            text.starts_with(
                "line 1: the load stopped there. No line before it is written; no line after 1 \
                 was sent. Resume with the input from line 1 on: not a cell"
            ),
            "{text}"
        );
        let mut written = Written::default();
        for line in [1, 2, 4, 6] {
            written.done(line);
        }
        let later = Failure {
            line: 3,
            why: anyhow::anyhow!("refused"),
            written,
        };
        let text = format!("{:#}", later.into_error(Path::new("in.jsonl")));
        assert!(
            text.starts_with(
                "line 3: the load stopped there. Lines 1 to 2 are written, every one durable (2 \
                 later lines too,"
            ),
            "{text}"
        );
        assert!(
            text.contains("Resume with `tail -n +3 in.jsonl | cubec load -`: refused"),
            "{text}"
        );
    }

    #[test]
    fn a_file_name_is_quoted_for_the_shell_when_it_needs_it() {
        assert_eq!(shell_word("data/cells.jsonl"), "data/cells.jsonl");
        assert_eq!(shell_word("my cells.jsonl"), "'my cells.jsonl'");
        assert_eq!(shell_word("it's"), r"'it'\''s'");
    }
}
