//! `cubec load`: write the cells of a JSON Lines file, many calls in flight on the one
//! connection, with progress on a terminal.
//!
//! Each line is one cell: `{"x":1,"y":-2,"z":3,"value":"text"}`, or `"value_hex"` for any bytes
//! (the shape `cubec read` prints), and optionally `"expected_version"` as for `cubec write`.
//! Every line is one `Cells.Write`. Lines are read and parsed by a task of their own, one ahead
//! of the writes; two lines for one cell are written in file order (the later one is sent once
//! the earlier is answered). The first failure stops the load: no further line is sent, the
//! calls in flight finish, and the error names the line, what is acknowledged, what may be
//! written, and where to resume.

use std::collections::{BTreeSet, HashSet, VecDeque};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use cube_api::v1::cells_client::CellsClient;
use cube_api::v1::{Coord, WriteRequest};
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, BufReader};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use crate::Transport;

/// The longest line taken: the largest value a server can be configured to take
/// (`--max-value-bytes` 268435456) as hex, and room for the rest of the line. A longer one (a
/// file with no line breaks, say) is refused before it is read whole.
const MAX_LINE_BYTES: u64 = 2 * 268_435_456 + 65_536;

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
    /// What `cubec region` prints besides, taken and not restored: a loaded cell gets its own
    /// next version (1 for a new cell), unsealed.
    #[serde(default, rename = "version")]
    _version: Option<serde::de::IgnoredAny>,
    #[serde(default)]
    sealed: Option<bool>,
}

/// A line's write, and whether the line says its cell was sealed (which a load does not do).
#[derive(Debug)]
struct Cell {
    request: WriteRequest,
    sealed: bool,
}

/// The write a line asks for, or why it is not one.
fn parse_line(text: &str) -> Result<Cell, String> {
    let line: Line = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let value = match (line.value, line.value_hex) {
        (Some(text), None) => text.into_bytes(),
        (None, Some(hex)) => cube_auth::decode_hex_bytes(hex.as_bytes()).ok_or_else(|| {
            "\"value_hex\" must be an even number of hex digits (0-9, a-f, A-F)".to_string()
        })?,
        (Some(_), Some(_)) => return Err("give \"value\" or \"value_hex\", not both".into()),
        (None, None) => return Err("give the cell's \"value\" (text) or \"value_hex\"".into()),
    };
    Ok(Cell {
        request: WriteRequest {
            coord: Some(Coord {
                x: line.x,
                y: line.y,
                z: line.z,
            }),
            value,
            expected_version: line.expected_version,
        },
        sealed: line.sealed == Some(true),
    })
}

/// What a finished load wrote.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Loaded {
    pub cells: u64,
    pub value_bytes: u64,
    /// Calls sent again after the tenant answered that it was busy.
    pub busy_retries: u64,
    /// Cells written from lines that say `"sealed":true` (as `cubec region` prints a sealed
    /// cell): written, not sealed.
    pub sealed_not_restored: u64,
}

/// The lines done: 1..=`prefix` all acknowledged or blank; past it, those acknowledged in
/// `beyond` and the blank ones in `blank`.
#[derive(Debug, Default)]
struct Written {
    prefix: u64,
    beyond: BTreeSet<u64>,
    blank: BTreeSet<u64>,
}

impl Written {
    /// `line` was acknowledged.
    fn done(&mut self, line: u64) {
        self.beyond.insert(line);
        self.advance();
    }

    /// `line` is blank: nothing to write.
    fn blank(&mut self, line: u64) {
        self.blank.insert(line);
        self.advance();
    }

    fn advance(&mut self) {
        while self.beyond.remove(&(self.prefix + 1)) || self.blank.remove(&(self.prefix + 1)) {
            self.prefix += 1;
        }
    }
}

/// The load stopped: the message `cubec` prints above the cause (kept when `run` explains a
/// failed connection).
#[derive(Debug, Clone)]
pub(crate) struct Stopped(String);

impl std::fmt::Display for Stopped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
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
    let (input, total): (Input, Option<u64>) = if file == Path::new("-") {
        (BufReader::new(Box::new(tokio::io::stdin())), None)
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
        (BufReader::with_capacity(1 << 20, Box::new(f)), len)
    };
    let progress = Progress::new(total);
    // One batch (up to 1 MiB of values, or one longer line) parsed ahead of the writes, and one
    // more the reader holds while it waits to hand it over.
    let (tx, rx) = mpsc::channel(1);
    let reader = tokio::spawn(read_lines(input, tx, MAX_LINE_BYTES));
    let send = move |request| {
        let mut cells = cells.clone();
        async move { write(&mut cells, request).await }
    };
    let result = run(send, rx, concurrency, status, &progress).await;
    reader.abort();
    progress.finish();
    result.map_err(|failure| failure.into_error(file))
}

/// The input, buffered.
type Input = BufReader<Box<dyn tokio::io::AsyncRead + Unpin + Send>>;

/// Lines handed over at once, at most: one hand-over (a task wake-up) per line cost the client
/// about a fifth of its CPU per small cell (docs/benchmarks.md, "cubec load").
const BATCH_LINES: usize = 256;
/// Bytes of values handed over at once, at most (a single line can be larger).
const BATCH_BYTES: usize = 1 << 20;

/// One line of the input, read and parsed.
struct Parsed {
    line: u64,
    /// Bytes of the input read up to and with this line.
    read: u64,
    item: Item,
}

enum Item {
    Blank,
    Cell(Cell),
    /// Not a cell, not UTF-8, too long, or the input could not be read: the load stops here.
    Bad(anyhow::Error),
}

/// Read, parse and send the lines of `input` (each at most `max_line` bytes) until its end, a
/// bad line, or a receiver that has gone: in batches of up to [`BATCH_LINES`] lines or
/// [`BATCH_BYTES`] of values, and whatever is parsed whenever the input has nothing more
/// buffered (so a slow producer's lines are not held back).
async fn read_lines(mut input: Input, tx: mpsc::Sender<Vec<Parsed>>, max_line: u64) {
    let mut buf = Vec::new();
    let (mut line, mut read) = (0u64, 0u64);
    let (mut batch, mut batch_bytes) = (Vec::new(), 0usize);
    loop {
        if !batch.is_empty()
            && (input.buffer().is_empty()
                || batch.len() >= BATCH_LINES
                || batch_bytes >= BATCH_BYTES)
        {
            batch_bytes = 0;
            if tx.send(std::mem::take(&mut batch)).await.is_err() {
                return;
            }
        }
        buf.clear();
        let got = (&mut input)
            .take(max_line + 1)
            .read_until(b'\n', &mut buf)
            .await;
        line += 1;
        let item = match got {
            Ok(0) => {
                if !batch.is_empty() {
                    let _ = tx.send(batch).await;
                }
                return;
            }
            Ok(n) => {
                read += n as u64;
                if n as u64 > max_line {
                    Item::Bad(anyhow::anyhow!(
                        "the line is longer than {max_line} bytes (twice the largest value a \
                         server takes, as hex, and 64 KiB): is the input JSON Lines?"
                    ))
                } else {
                    match std::str::from_utf8(&buf) {
                        Err(e) => {
                            Item::Bad(anyhow::anyhow!("not a cell: the line is not UTF-8 ({e})"))
                        }
                        Ok(text) if text.trim().is_empty() => Item::Blank,
                        Ok(text) => match parse_line(text.trim()) {
                            Ok(cell) => Item::Cell(cell),
                            Err(why) => Item::Bad(anyhow::anyhow!("not a cell: {why}")),
                        },
                    }
                }
            }
            Err(e) => Item::Bad(anyhow::Error::new(e).context("reading the input")),
        };
        if let Item::Cell(c) = &item {
            batch_bytes += c.request.value.len();
        }
        let last = matches!(item, Item::Bad(_));
        batch.push(Parsed { line, read, item });
        if last {
            let _ = tx.send(batch).await;
            return;
        }
    }
}

/// Why a load stopped, with what it had written.
#[derive(Debug)]
struct Failure {
    line: u64,
    why: anyhow::Error,
    written: Written,
    /// Lines whose write failed without saying whether it took effect (the connection failed,
    /// UNAVAILABLE, a deadline): they may be written.
    unknown: BTreeSet<u64>,
}

impl Failure {
    fn into_error(self, file: &Path) -> anyhow::Error {
        let Failure {
            line,
            why,
            written,
            unknown,
        } = self;
        let mut parts = vec![match written.prefix {
            0 => "Acknowledged: no line before it".to_string(),
            n => format!("Acknowledged: lines 1 to {n}"),
        }];
        if !written.beyond.is_empty() {
            parts.push(format!(
                "and after it {} {}",
                plural(written.beyond.len(), "line", "lines"),
                ranges(&written.beyond)
            ));
        }
        let unknown_part = if unknown.is_empty() {
            String::new()
        } else {
            format!(
                "; whether {} {} {} written is unknown (read {} back)",
                plural(unknown.len(), "line", "lines"),
                ranges(&unknown),
                plural(unknown.len(), "was", "were"),
                plural(unknown.len(), "it", "them")
            )
        };
        let resume = written.prefix + 1;
        let from = if file == Path::new("-") {
            format!("the input from line {resume} on")
        } else {
            let name = file.to_string_lossy();
            let name = if name.starts_with('-') {
                format!("./{name}")
            } else {
                name.into_owned()
            };
            format!(
                "`tail -n +{resume} {} | cubec load -` (with this command's options)",
                shell_word(&name)
            )
        };
        why.context(Stopped(format!(
            "line {line}: the load stopped there. {}{unknown_part}. Resume with {from}; a line \
             written again gets a new version of the same value",
            parts.join(", ")
        )))
    }
}

fn plural<'a>(n: usize, one: &'a str, many: &'a str) -> &'a str {
    if n == 1 { one } else { many }
}

/// `1, 3-5, 9`, the first 10 runs and how many more lines.
fn ranges(lines: &BTreeSet<u64>) -> String {
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for &l in lines {
        match runs.last_mut() {
            Some((_, end)) if *end + 1 == l => *end = l,
            _ => runs.push((l, l)),
        }
    }
    let mut shown: Vec<String> = runs
        .iter()
        .take(10)
        .map(|&(a, b)| {
            if a == b {
                a.to_string()
            } else {
                format!("{a}-{b}")
            }
        })
        .collect();
    if runs.len() > 10 {
        let more: u64 = runs[10..].iter().map(|(a, b)| b - a + 1).sum();
        shown.push(format!("and {more} more"));
    }
    shown.join(", ")
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

/// A line's write, answered.
struct Answer {
    line: u64,
    cell: (i32, i32, i32),
    value_bytes: u64,
    sealed: bool,
    /// Busy retries, or the failure.
    result: Result<u32, tonic::Status>,
}

/// Send the lines `rx` gives with `send` (a line's write, busy retries included).
async fn run<S, F>(
    send: S,
    mut rx: mpsc::Receiver<Vec<Parsed>>,
    concurrency: usize,
    status: fn(tonic::Status) -> anyhow::Error,
    progress: &Progress,
) -> Result<Loaded, Failure>
where
    S: Fn(WriteRequest) -> F,
    F: std::future::Future<Output = Result<u32, tonic::Status>> + Send + 'static,
{
    let mut st = State {
        written: Written::default(),
        loaded: Loaded {
            cells: 0,
            value_bytes: 0,
            busy_retries: 0,
            sealed_not_restored: 0,
        },
        failure: None,
        unknown: BTreeSet::new(),
        busy_cells: HashSet::new(),
    };
    let mut in_flight: JoinSet<Answer> = JoinSet::new();
    // Lines taken from the reader and not yet sent, in order: the first waits while its
    // cell's earlier write is in flight or every place is taken, and the others behind it.
    let mut pending: VecDeque<Parsed> = VecDeque::new();
    let (mut input_done, mut read) = (false, 0u64);
    loop {
        while st.failure.is_none()
            && let Some(next) = pending.pop_front()
        {
            read = next.read;
            match next.item {
                Item::Blank => st.written.blank(next.line),
                Item::Bad(why) => st.fail(next.line, why),
                Item::Cell(c) => {
                    let cell = cell_of(&c.request);
                    if in_flight.len() >= concurrency || st.busy_cells.contains(&cell) {
                        pending.push_front(Parsed {
                            item: Item::Cell(c),
                            ..next
                        });
                        break;
                    }
                    st.busy_cells.insert(cell);
                    let (line, value_bytes, sealed) =
                        (next.line, c.request.value.len() as u64, c.sealed);
                    let answer = send(c.request);
                    in_flight.spawn(async move {
                        Answer {
                            line,
                            cell,
                            value_bytes,
                            sealed,
                            result: answer.await,
                        }
                    });
                }
            }
        }
        let take_lines = st.failure.is_none() && pending.is_empty() && !input_done;
        if !take_lines && in_flight.is_empty() {
            break;
        }
        tokio::select! {
            Some(joined) = in_flight.join_next(), if !in_flight.is_empty() => {
                st.settle(joined, status);
            }
            next = rx.recv(), if take_lines => match next {
                None => input_done = true,
                Some(batch) => pending.extend(batch),
            },
        }
        progress.show(read, &st.loaded);
    }
    match st.failure {
        // Several calls in flight can fail: the first line among them is named.
        Some((line, why)) => Err(Failure {
            line,
            why,
            written: st.written,
            unknown: st.unknown,
        }),
        None => Ok(st.loaded),
    }
}

fn cell_of(request: &WriteRequest) -> (i32, i32, i32) {
    let c = request.coord.unwrap_or_default();
    (c.x, c.y, c.z)
}

/// What `run` keeps while it goes.
struct State {
    written: Written,
    loaded: Loaded,
    /// The first line (lowest) that failed, and why.
    failure: Option<(u64, anyhow::Error)>,
    unknown: BTreeSet<u64>,
    /// Cells with a write in flight.
    busy_cells: HashSet<(i32, i32, i32)>,
}

impl State {
    fn fail(&mut self, line: u64, why: anyhow::Error) {
        if self.failure.as_ref().is_none_or(|(first, _)| line < *first) {
            self.failure = Some((line, why));
        }
    }

    fn settle(
        &mut self,
        joined: Result<Answer, tokio::task::JoinError>,
        status: fn(tonic::Status) -> anyhow::Error,
    ) {
        let Answer {
            line,
            cell,
            value_bytes,
            sealed,
            result,
        } = match joined {
            Ok(done) => done,
            // NOTE: a write task neither panics nor is aborted; should one, the load fails at a
            // line it cannot name.
            Err(e) => {
                self.fail(0, anyhow::anyhow!("a write task failed: {e}"));
                return;
            }
        };
        self.busy_cells.remove(&cell);
        match result {
            Ok(retries) => {
                self.written.done(line);
                self.loaded.cells += 1;
                self.loaded.value_bytes += value_bytes;
                self.loaded.busy_retries += u64::from(retries);
                self.loaded.sealed_not_restored += u64::from(sealed);
            }
            Err(s) => {
                if outcome_unknown(&s) {
                    self.unknown.insert(line);
                }
                self.fail(line, status(s));
            }
        }
    }
}

/// Whether a failed write may still have taken effect: the connection failed under it (a
/// status of the client's own, with a source), or the server could not say (cells.proto).
fn outcome_unknown(s: &tonic::Status) -> bool {
    use tonic::Code;
    std::error::Error::source(s).is_some()
        || matches!(
            s.code(),
            Code::Unavailable
                | Code::DeadlineExceeded
                | Code::Cancelled
                | Code::Unknown
                | Code::Internal
                | Code::Aborted
        )
        || s.message().contains("outcome is unknown")
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
        let w = parse_line(r#"{"x":1,"y":-2,"z":3,"value":"hi"}"#)
            .unwrap()
            .request;
        assert_eq!(w.coord, Some(Coord { x: 1, y: -2, z: 3 }));
        assert_eq!(w.value, b"hi");
        assert_eq!(w.expected_version, None);
        let line = r#"{"x":0,"y":0,"z":0,"value_hex":"00fFa1","expected_version":0}"#;
        let w = parse_line(line).unwrap().request;
        assert_eq!(w.value, [0x00, 0xff, 0xa1]);
        assert_eq!(w.expected_version, Some(0));
        // What `cubec region` prints: its version is taken and left, "sealed" noted.
        let region = r#"{"sealed":true,"value":"t","version":7,"x":1,"y":2,"z":3}"#;
        let c = parse_line(region).unwrap();
        assert!(c.sealed);
        assert_eq!(
            (c.request.value, c.request.expected_version),
            (b"t".to_vec(), None)
        );
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
        // Blank lines carry the prefix over them and are kept apart past it.
        w.blank(7);
        w.blank(6);
        assert_eq!((w.prefix, w.beyond.len(), w.blank.len()), (7, 0, 0));
        w.blank(9);
        assert_eq!((w.prefix, w.beyond.len(), w.blank.len()), (7, 0, 1));
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
    fn a_failure_names_what_is_acknowledged_what_may_be_written_and_where_to_resume() {
        let first = Failure {
            line: 1,
            why: anyhow::anyhow!("not a cell"),
            written: Written::default(),
            unknown: BTreeSet::new(),
        };
        let text = format!("{:#}", first.into_error(Path::new("-")));
        assert_eq!(
            text,
            "line 1: the load stopped there. Acknowledged: no line before it. Resume with the \
             input from line 1 on; a line written again gets a new version of the same value: \
             not a cell"
        );
        let mut written = Written::default();
        for line in [1, 2, 4, 6, 7, 8] {
            written.done(line);
        }
        // A blank line past the prefix is not named as written.
        written.blank(9);
        let later = Failure {
            line: 3,
            why: anyhow::anyhow!("refused"),
            written,
            unknown: BTreeSet::from([3, 5]),
        };
        let text = format!("{:#}", later.into_error(Path::new("-in.jsonl")));
        assert_eq!(
            text,
            "line 3: the load stopped there. Acknowledged: lines 1 to 2, and after it lines 4, \
             6-8; whether lines 3, 5 were written is unknown (read them back). Resume with `tail \
             -n +3 ./-in.jsonl | cubec load -` (with this command's options); a line written \
             again gets a new version of the same value: refused"
        );
    }

    /// Two lines for one cell are written in file order: the later one is sent only once the
    /// earlier one is answered, while lines for other cells go on meanwhile.
    #[tokio::test]
    async fn a_cells_second_line_waits_for_its_first_and_others_pass() {
        use std::sync::{Arc, Mutex};
        let events = Arc::new(Mutex::new(Vec::<String>::new()));
        let log = Arc::clone(&events);
        let send = move |request: WriteRequest| {
            let log = Arc::clone(&log);
            async move {
                let v = String::from_utf8(request.value).unwrap_or_default();
                log.lock().unwrap().push(format!("start {v}"));
                if v == "a" {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                log.lock().unwrap().push(format!("end {v}"));
                Ok(0)
            }
        };
        let (tx, rx) = mpsc::channel(1);
        let lines = [
            r#"{"x":0,"y":0,"z":0,"value":"a"}"#,
            r#"{"x":1,"y":0,"z":0,"value":"c"}"#,
            r#"{"x":0,"y":0,"z":0,"value":"b"}"#,
        ];
        let input = input_of(lines.join("\n").into_bytes());
        tokio::spawn(read_lines(input, tx, MAX_LINE_BYTES));
        let loaded = run(
            send,
            rx,
            8,
            |s| anyhow::anyhow!("{s:?}"),
            &Progress::new(None),
        )
        .await
        .unwrap();
        assert_eq!(loaded.cells, 3);
        let events = events.lock().unwrap().clone();
        let at = |e: &str| events.iter().position(|x| x == e).unwrap();
        assert!(at("end a") < at("start b"), "{events:?}");
        assert!(at("start c") < at("end a"), "{events:?}");
    }

    /// A line over the limit stops the reading there, before it is read whole; blank lines
    /// and a last line without a line break are lines too.
    #[tokio::test]
    async fn lines_are_read_up_to_a_limit() {
        let text = "\r\n{\"x\":1,\"y\":2,\"z\":3,\"value\":\"v\"}\r\n0123456789abcdef\nnever read";
        let (tx, mut rx) = mpsc::channel(8);
        read_lines(input_of(text.as_bytes().to_vec()), tx, 40).await;
        let mut got = Vec::new();
        while let Some(batch) = rx.recv().await {
            got.extend(batch.into_iter().map(|p| match p.item {
                Item::Blank => format!("{} blank", p.line),
                Item::Cell(c) => format!("{} cell {:?}", p.line, c.request.coord),
                Item::Bad(e) => format!("{} bad {e}", p.line),
            }));
        }
        assert_eq!(
            got[..2],
            ["1 blank", "2 cell Some(Coord { x: 1, y: 2, z: 3 })"]
        );
        assert_eq!(got.len(), 3, "{got:?}");
        assert!(got[2].starts_with("3 bad not a cell"), "{got:?}");

        let (tx, mut rx) = mpsc::channel(8);
        read_lines(input_of(vec![b'x'; 100]), tx, 40).await;
        let batch = rx.recv().await.unwrap();
        let [first] = &batch[..] else {
            panic!("one line, not {}", batch.len())
        };
        assert!(
            matches!(&first.item, Item::Bad(e) if e.to_string().starts_with("the line is longer than 40 bytes")),
        );
        assert_eq!(first.read, 41);
        assert!(rx.recv().await.is_none());
    }

    fn input_of(bytes: Vec<u8>) -> Input {
        BufReader::new(Box::new(std::io::Cursor::new(bytes)))
    }

    /// Lines go over in batches, a batch ending at BATCH_LINES lines, and at whatever is read
    /// when the input has nothing more yet: a slow producer's line is not held back.
    #[tokio::test]
    async fn lines_go_over_in_batches_and_none_waits_for_a_slow_producer() {
        let line = |i: usize| format!("{{\"x\":{i},\"y\":0,\"z\":0,\"value\":\"v\"}}\n");
        let many: String = (0..BATCH_LINES + 10).map(line).collect();
        let (tx, mut rx) = mpsc::channel(8);
        read_lines(input_of(many.into_bytes()), tx, MAX_LINE_BYTES).await;
        let mut sizes = Vec::new();
        while let Some(batch) = rx.recv().await {
            sizes.push(batch.len());
        }
        assert_eq!(sizes.iter().sum::<usize>(), BATCH_LINES + 10);
        assert!(sizes.iter().all(|&n| n <= BATCH_LINES), "{sizes:?}");

        let (mut writer, reader) = tokio::io::duplex(1 << 16);
        let (tx, mut rx) = mpsc::channel(8);
        tokio::spawn(read_lines(
            BufReader::new(Box::new(reader)),
            tx,
            MAX_LINE_BYTES,
        ));
        use tokio::io::AsyncWriteExt as _;
        writer.write_all(line(1).as_bytes()).await.unwrap();
        let first = tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .expect("the first line is handed over before the second is written")
            .unwrap();
        assert_eq!(first.len(), 1);
        writer.write_all(line(2).as_bytes()).await.unwrap();
        drop(writer);
        assert_eq!(rx.recv().await.unwrap()[0].line, 2);
        assert!(rx.recv().await.is_none());
    }

    #[test]
    fn line_ranges_are_shortened() {
        let lines: BTreeSet<u64> = [1, 2, 3, 5]
            .into_iter()
            .chain((10..40).step_by(2))
            .collect();
        assert_eq!(
            ranges(&lines),
            "1-3, 5, 10, 12, 14, 16, 18, 20, 22, 24, and 7 more"
        );
    }

    #[test]
    fn a_file_name_is_quoted_for_the_shell_when_it_needs_it() {
        assert_eq!(shell_word("data/cells.jsonl"), "data/cells.jsonl");
        assert_eq!(shell_word("my cells.jsonl"), "'my cells.jsonl'");
        assert_eq!(shell_word("it's"), r"'it'\''s'");
    }
}
