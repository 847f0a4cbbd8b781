//! The load shapes every system gets: closed-loop single-cell phases (one connection per client,
//! a warm-up, then a measured window into an HDR histogram) and bulk loads (writers taking
//! batches from one shared counter until the bytes are written).
//!
//! Systems plug in through [`SingleCell`] (async), [`SingleCellBlocking`] (SQLite's own threads)
//! and [`BatchWriter`]; nothing here knows any system's protocol.

use std::future::Future;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use super::progress;

/// How long one call of a single-cell phase or one batch of a load may take: past it the call
/// counts as failed and its client stops (its connection's state is unknown after a call given
/// up half-way), so a system that stops answering ends its phase instead of hanging the bench.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// How long one scan (every page of it) may take.
pub const SCAN_TIMEOUT: Duration = Duration::from_secs(600);

/// `fut`, or an error naming `what` and `limit` if it has not finished within `limit`.
pub async fn within<T>(
    limit: Duration,
    what: &str,
    fut: impl Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<T> {
    match tokio::time::timeout(limit, fut).await {
        Ok(result) => result,
        Err(_) => Err(anyhow::anyhow!(
            "{what}: no answer within {} s",
            limit.as_secs()
        )),
    }
}

/// Warm-up, then the measured window, of each single-cell phase.
#[derive(Debug, Clone, Copy)]
pub struct Window {
    pub warmup: Duration,
    pub measure: Duration,
}

/// What a single-cell phase does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    Write,
    Read,
}

/// The cell a call touches: each client writes its own cells (`client`, 0), (`client`, 1), …
/// and reads back cells it wrote before.
#[derive(Debug, Clone, Copy)]
pub struct CellKey {
    pub client: u32,
    pub i: u64,
}

/// One client (one connection) of an async system.
pub trait SingleCell: Send + 'static {
    /// A durable single-cell write (acknowledged only once it is on disk).
    fn write(
        &mut self,
        key: CellKey,
        value: &[u8],
    ) -> impl Future<Output = anyhow::Result<()>> + Send;
    /// A point read of a cell written before; a missing cell is an error.
    fn read(&mut self, key: CellKey) -> impl Future<Output = anyhow::Result<()>> + Send;
}

/// One client of a system driven from its own OS thread (SQLite's connections are blocking).
pub trait SingleCellBlocking: Send {
    fn write(&mut self, key: CellKey, value: &[u8]) -> anyhow::Result<()>;
    fn read(&mut self, key: CellKey) -> anyhow::Result<()>;
}

/// A client and the cells it has written so far (the read phase reads among them).
pub struct Conn<C> {
    pub id: u32,
    pub client: C,
    written: u64,
    /// A call on it was given up (`CALL_TIMEOUT`): what the connection holds is unknown (a
    /// RESP reply left unread would answer the next call), so it makes no more calls.
    broken: bool,
}

impl<C> Conn<C> {
    pub fn numbered(clients: Vec<C>) -> Vec<Conn<C>> {
        clients
            .into_iter()
            .enumerate()
            .map(|(id, client)| Conn {
                id: id as u32,
                client,
                written: 0,
                broken: false,
            })
            .collect()
    }

    /// The next cell this client writes, or a random one it wrote for a read.
    fn key(&self, op: Op, rng: &mut StdRng) -> CellKey {
        let i = match op {
            Op::Write => self.written,
            Op::Read if self.written == 0 => 0,
            Op::Read => rng.gen_range(0..self.written),
        };
        CellKey { client: self.id, i }
    }
}

/// The result of one closed-loop phase.
#[derive(Debug, Clone, Serialize)]
pub struct SinglePhase {
    pub system: String,
    pub op: Op,
    pub clients: usize,
    /// Calls that finished inside the window (after the warm-up), successfully; the latency
    /// columns are of those among them that also started inside it.
    pub ops: u64,
    pub seconds: f64,
    pub ops_per_sec: f64,
    pub p50_us: u64,
    pub p99_us: u64,
    pub max_us: u64,
    pub errors: u64,
    /// The first error seen in the window, so a failing system is diagnosable from the report.
    pub first_error: Option<String>,
}

/// One client's record of a phase.
struct Recorder {
    /// Latency of the successful calls that started and ended inside the window.
    hist: Histogram<u64>,
    /// Successful calls that ended inside the window, whenever they started: the rate.
    completed: u64,
    errors: u64,
    first_error: Option<String>,
    measure_from: Instant,
    end: Instant,
    started: Arc<AtomicU64>,
}

impl Recorder {
    fn new(start: Instant, window: Window, started: Arc<AtomicU64>) -> Recorder {
        let measure_from = start + window.warmup;
        Recorder {
            hist: Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid bounds"),
            completed: 0,
            errors: 0,
            first_error: None,
            measure_from,
            end: measure_from + window.measure,
            started,
        }
    }

    /// Record a call that started at `t` and just finished; false once the window is over
    /// (a call finishing after the end is not timed: the window is exactly `measure`). Errors
    /// count whenever they happen, in the warm-up or after the end too: a failed call is a
    /// failure of the phase.
    fn record(&mut self, t: Instant, result: anyhow::Result<()>) -> bool {
        let now = Instant::now();
        self.started.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = &result {
            self.errors += 1;
            if self.first_error.is_none() {
                self.first_error = Some(format!("{e:#}"));
            }
        }
        if now >= self.end {
            return false;
        }
        if now >= self.measure_from && result.is_ok() {
            self.completed += 1;
            if t >= self.measure_from {
                let _ = self.hist.record((now - t).as_micros().max(1) as u64);
            }
        }
        true
    }
}

fn summarize(
    system: &str,
    op: Op,
    clients: usize,
    window: Window,
    recs: Vec<Recorder>,
) -> SinglePhase {
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("valid bounds");
    let (mut completed, mut errors, mut first_error) = (0, 0, None);
    for r in recs {
        let _ = hist.add(&r.hist);
        completed += r.completed;
        errors += r.errors;
        first_error = first_error.or(r.first_error);
    }
    let seconds = window.measure.as_secs_f64();
    let p = SinglePhase {
        system: system.to_string(),
        op,
        clients,
        ops: completed,
        seconds,
        ops_per_sec: completed as f64 / seconds,
        p50_us: hist.value_at_quantile(0.5),
        p99_us: hist.value_at_quantile(0.99),
        max_us: hist.max(),
        errors,
        first_error,
    };
    let what = match op {
        Op::Write => "write",
        Op::Read => "read",
    };
    eprintln!(
        "{:<17} {what:<5} {:>3} clients {:>9.0} ops/s  p50 {:>6} µs  p99 {:>6} µs  errors {}{}",
        p.system,
        p.clients,
        p.ops_per_sec,
        p.p50_us,
        p.p99_us,
        p.errors,
        p.first_error
            .as_deref()
            .map(|e| format!(" (first: {e})"))
            .unwrap_or_default()
    );
    p
}

/// One closed-loop phase over async clients, one task per client: each finished call starts
/// the next. Returns the clients (for the next phase) and the result.
pub async fn closed_loop<C: SingleCell>(
    system: &str,
    op: Op,
    conns: Vec<Conn<C>>,
    window: Window,
    value: Arc<[u8]>,
) -> (Vec<Conn<C>>, SinglePhase) {
    let n = conns.len();
    let started = Arc::new(AtomicU64::new(0));
    let bar = progress::Timed::start(
        &format!("{system} {op:?} ×{n}"),
        window.warmup + window.measure,
        Arc::clone(&started),
    );
    let start = Instant::now();
    let tasks: Vec<_> = conns
        .into_iter()
        .map(|mut conn| {
            let value = Arc::clone(&value);
            let mut rec = Recorder::new(start, window, Arc::clone(&started));
            tokio::spawn(async move {
                let mut rng = StdRng::from_entropy();
                if conn.broken {
                    let e =
                        anyhow::anyhow!("no calls: this client gave up a call in an earlier phase");
                    rec.record(Instant::now(), Err(e));
                    return (conn, rec);
                }
                loop {
                    let key = conn.key(op, &mut rng);
                    let t = Instant::now();
                    let call = async {
                        match op {
                            Op::Write => conn.client.write(key, &value).await,
                            Op::Read => conn.client.read(key).await,
                        }
                    };
                    let result = tokio::time::timeout(CALL_TIMEOUT, call).await;
                    let Ok(result) = result else {
                        let e = anyhow::anyhow!(
                            "no answer within {} s (this client stopped)",
                            CALL_TIMEOUT.as_secs()
                        );
                        rec.record(t, Err(e));
                        conn.broken = true;
                        return (conn, rec);
                    };
                    if op == Op::Write && result.is_ok() {
                        conn.written += 1;
                    }
                    if !rec.record(t, result) {
                        return (conn, rec);
                    }
                }
            })
        })
        .collect();
    let (mut conns, mut recs) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for t in tasks {
        let (conn, rec) = t.await.expect("load task panicked");
        conns.push(conn);
        recs.push(rec);
    }
    drop(bar);
    (conns, summarize(system, op, n, window, recs))
}

/// [`closed_loop`] for blocking clients, one OS thread per client.
pub fn closed_loop_blocking<C: SingleCellBlocking>(
    system: &str,
    op: Op,
    conns: Vec<Conn<C>>,
    window: Window,
    value: &[u8],
) -> (Vec<Conn<C>>, SinglePhase) {
    let n = conns.len();
    let started = Arc::new(AtomicU64::new(0));
    let bar = progress::Timed::start(
        &format!("{system} {op:?} ×{n}"),
        window.warmup + window.measure,
        Arc::clone(&started),
    );
    let start = Instant::now();
    let (conns, recs): (Vec<_>, Vec<_>) = std::thread::scope(|scope| {
        let threads: Vec<_> = conns
            .into_iter()
            .map(|mut conn| {
                let mut rec = Recorder::new(start, window, Arc::clone(&started));
                scope.spawn(move || {
                    let mut rng = StdRng::from_entropy();
                    loop {
                        let key = conn.key(op, &mut rng);
                        let t = Instant::now();
                        let result = match op {
                            Op::Write => conn.client.write(key, value),
                            Op::Read => conn.client.read(key),
                        };
                        if op == Op::Write && result.is_ok() {
                            conn.written += 1;
                        }
                        if !rec.record(t, result) {
                            return (conn, rec);
                        }
                    }
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("load thread panicked"))
            .unzip()
    });
    drop(bar);
    (conns, summarize(system, op, n, window, recs))
}

/// Durable writes, then reads of what was written, over the same clients (one connection
/// each): one closed-loop phase each, appended to `out`. Returns the clients with what each
/// wrote, for more phases.
pub async fn write_then_read<C: SingleCell>(
    system: &str,
    clients: Vec<C>,
    window: Window,
    value: &Arc<[u8]>,
    out: &mut Vec<SinglePhase>,
) -> Vec<Conn<C>> {
    let conns = Conn::numbered(clients);
    let (conns, w) = closed_loop(system, Op::Write, conns, window, Arc::clone(value)).await;
    out.push(w);
    let (conns, r) = closed_loop(system, Op::Read, conns, window, Arc::clone(value)).await;
    out.push(r);
    conns
}

/// [`write_then_read`] for blocking clients.
pub fn write_then_read_blocking<C: SingleCellBlocking>(
    system: &str,
    clients: Vec<C>,
    window: Window,
    value: &[u8],
    out: &mut Vec<SinglePhase>,
) {
    let conns = Conn::numbered(clients);
    let (conns, w) = closed_loop_blocking(system, Op::Write, conns, window, value);
    out.push(w);
    let (_, r) = closed_loop_blocking(system, Op::Read, conns, window, value);
    out.push(r);
}

/// A bulk load of `bytes` in values of `value_bytes`, `batch` values per call, from every
/// writer at once; `method` says how, for the report.
pub async fn bulk<W: BatchWriter>(
    system: &str,
    method: String,
    writers: Vec<W>,
    bytes: u64,
    value_bytes: usize,
    batch: u64,
) -> anyhow::Result<BulkResult> {
    let items = bytes.div_ceil(value_bytes as u64);
    let label = format!("{system} bulk");
    let elapsed = load(&label, writers, items, batch, value_bytes as u64).await?;
    Ok(BulkResult::new(
        system,
        method,
        items * value_bytes as u64,
        elapsed,
    ))
}

/// A writer of a bulk or scan load: writes items `range` (indexes into the load) durably.
pub trait BatchWriter: Send + 'static {
    fn write_batch(&mut self, range: Range<u64>)
    -> impl Future<Output = anyhow::Result<()>> + Send;
}

/// A bulk load's result.
#[derive(Debug, Clone, Serialize)]
pub struct BulkResult {
    pub system: String,
    /// How the system was loaded (its fastest durable batch path).
    pub method: String,
    pub bytes: u64,
    pub seconds: f64,
    pub mib_per_sec: f64,
}

impl BulkResult {
    pub fn new(system: &str, method: String, bytes: u64, elapsed: Duration) -> BulkResult {
        let seconds = elapsed.as_secs_f64();
        let r = BulkResult {
            system: system.into(),
            method,
            bytes,
            seconds,
            mib_per_sec: bytes as f64 / f64::from(1u32 << 20) / seconds,
        };
        eprintln!(
            "{:<16} bulk  {:.0} MiB in {:.2} s = {:.1} MiB/s ({})",
            r.system,
            r.bytes as f64 / f64::from(1u32 << 20),
            r.seconds,
            r.mib_per_sec,
            r.method
        );
        r
    }
}

/// Scan results of one system.
#[derive(Debug, Clone, Serialize)]
pub struct ScanResult {
    pub system: String,
    /// How the full scan and the range read were done.
    pub method: String,
    pub load_seconds: f64,
    pub full_rows: u64,
    pub full_rows_per_sec: f64,
    pub range_rows: u64,
    pub range_rows_per_sec: f64,
}

impl ScanResult {
    /// Build (and print) a system's scan result from its rounds.
    pub fn new(
        system: &str,
        method: String,
        load_seconds: f64,
        full: Rates,
        part: Rates,
    ) -> ScanResult {
        let (full_rows, full_rows_per_sec) = full.result();
        let (range_rows, range_rows_per_sec) = part.result();
        let r = ScanResult {
            system: system.into(),
            method,
            load_seconds,
            full_rows,
            full_rows_per_sec,
            range_rows,
            range_rows_per_sec,
        };
        eprintln!(
            "{:<16} scan  loaded in {:.1} s; full {} rows at {:.0} rows/s; range {} rows at {:.0} rows/s",
            r.system,
            r.load_seconds,
            r.full_rows,
            r.full_rows_per_sec,
            r.range_rows,
            r.range_rows_per_sec
        );
        r
    }
}

/// Write `items` items, `batch` per call, from every writer at once, taking batches from one
/// shared counter; `item_bytes` only feeds the progress bar. Returns the elapsed time; the
/// first error fails the load (a bulk load must complete to mean anything).
pub async fn load<W: BatchWriter>(
    label: &str,
    writers: Vec<W>,
    items: u64,
    batch: u64,
    item_bytes: u64,
) -> anyhow::Result<Duration> {
    let bar = progress::bytes_or_items(label, items, item_bytes);
    let next = Arc::new(AtomicU64::new(0));
    let batch = batch.max(1);
    let start = Instant::now();
    let tasks: Vec<_> = writers
        .into_iter()
        .map(|mut w| {
            let (next, bar) = (Arc::clone(&next), bar.clone());
            tokio::spawn(async move {
                loop {
                    let from = next.fetch_add(batch, Ordering::Relaxed);
                    if from >= items {
                        return Ok::<_, anyhow::Error>(());
                    }
                    let to = (from + batch).min(items);
                    within(CALL_TIMEOUT, "a batch", w.write_batch(from..to)).await?;
                    bar.inc((to - from) * item_bytes);
                }
            })
        })
        .collect();
    let mut first_err = None;
    for t in tasks {
        if let Err(e) = t.await? {
            first_err.get_or_insert(e);
        }
    }
    let elapsed = start.elapsed();
    bar.finish_and_clear();
    match first_err {
        Some(e) => Err(e.context(format!("{label} failed"))),
        None => Ok(elapsed),
    }
}

/// Rows per second over the rounds of a scan: the median rate and the rows of the last round.
#[derive(Debug, Default)]
pub struct Rates {
    rows: u64,
    rates: Vec<f64>,
}

impl Rates {
    /// One round of `what`: `rows` read in `elapsed`, which must be the `expected` rows (a
    /// short or duplicated result is an error, not a rate).
    pub fn push(
        &mut self,
        what: &str,
        rows: u64,
        expected: u64,
        elapsed: Duration,
    ) -> anyhow::Result<()> {
        anyhow::ensure!(
            rows == expected,
            "{what} returned {rows} rows, {expected} expected"
        );
        self.rows = rows;
        self.rates.push(rows as f64 / elapsed.as_secs_f64());
        Ok(())
    }

    /// (rows of the last round, median rows/s).
    pub fn result(self) -> (u64, f64) {
        (self.rows, crate::drive::median(self.rates))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A system that never answers.
    struct Silent;

    impl SingleCell for Silent {
        async fn write(&mut self, _: CellKey, _: &[u8]) -> anyhow::Result<()> {
            std::future::pending().await
        }
        async fn read(&mut self, _: CellKey) -> anyhow::Result<()> {
            std::future::pending().await
        }
    }

    impl BatchWriter for Silent {
        async fn write_batch(&mut self, _: Range<u64>) -> anyhow::Result<()> {
            std::future::pending().await
        }
    }

    /// A phase against a system that stopped answering ends (each client's call counted as
    /// failed once it has waited `CALL_TIMEOUT`), and so does a load: the bench does not hang.
    #[tokio::test(start_paused = true)]
    async fn a_system_that_never_answers_fails_its_phase_instead_of_hanging() {
        let window = Window {
            warmup: Duration::ZERO,
            measure: Duration::from_secs(1),
        };
        let conns = Conn::numbered(vec![Silent, Silent]);
        let started = tokio::time::Instant::now();
        // Bounded here too, so that without the timeouts this test fails rather than hangs.
        let bound = Duration::from_secs(120);
        let phase = closed_loop("silent", Op::Write, conns, window, Arc::from(&b"v"[..]));
        let (conns, phase) = tokio::time::timeout(bound, phase)
            .await
            .expect("the phase hung");
        assert_eq!(conns.len(), 2);
        assert_eq!((phase.ops, phase.errors), (0, 2));
        assert!(phase.first_error.unwrap().contains("no answer within 30 s"));
        assert!(started.elapsed() >= CALL_TIMEOUT);
        // The next phase makes no call on a connection whose call was given up.
        let (_, phase) = closed_loop("silent", Op::Read, conns, window, Arc::from(&b"v"[..])).await;
        assert_eq!((phase.ops, phase.errors), (0, 2));
        assert!(phase.first_error.unwrap().contains("earlier phase"));
        let e = tokio::time::timeout(bound, load("silent bulk", vec![Silent], 10, 5, 1))
            .await
            .expect("the load hung")
            .unwrap_err();
        assert!(
            format!("{e:#}").contains("a batch: no answer within 30 s"),
            "{e:#}"
        );
    }
}
