//! WAL group commit on one shard vs. the raw fdatasync rate of the same disk, in one run.
//!
//! `cargo bench -p cube-wal --bench group_commit [-- SECONDS_PER_CASE]`
//!
//! Cases:
//! - raw: one thread, one 128-byte pwrite + fdatasync per "commit", into a pre-zeroed file
//!   (the floor a non-grouping WAL would hit), and the same appending to a growing file;
//! - grouped: 1, 16, 128 concurrent writers (async tasks), each appending a 128-byte record and
//!   waiting until it is durable, through `WalShard` and its durability callback (the production
//!   code path).
//!
//! Prints a Markdown table: commits/s, p50/p99 commit latency, records per fdatasync, and the
//! ratios the walking-skeleton targets are stated in.

// A benchmark: a panic is a failed run with a backtrace.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::VecDeque;
use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cube_wal::{DurableEvent, WalOptions, WalShard};
use hdrhistogram::Histogram;
use tokio::sync::oneshot;

const RECORD: usize = 128;

struct Row {
    name: String,
    commits: u64,
    secs: f64,
    hist: Histogram<u64>,
    fsyncs: u64,
}

impl Row {
    fn rate(&self) -> f64 {
        self.commits as f64 / self.secs
    }
    fn p(&self, q: f64) -> f64 {
        self.hist.value_at_quantile(q) as f64 / 1000.0
    }
}

fn hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid histogram bounds")
}

fn raw(dir: &std::path::Path, secs: f64, preallocated: bool) -> Row {
    let path = dir.join(if preallocated {
        "raw-prealloc"
    } else {
        "raw-append"
    });
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    let size = 256u64 << 20;
    if preallocated {
        let zeros = vec![0u8; 1 << 20];
        for _ in 0..(size >> 20) {
            file.write_all(&zeros).unwrap();
        }
        file.sync_all().unwrap();
    }
    let buf = [0xABu8; RECORD];
    let mut h = hist();
    let (mut n, mut off) = (0u64, 0u64);
    let start = Instant::now();
    while start.elapsed().as_secs_f64() < secs && off + (RECORD as u64) < size {
        let t = Instant::now();
        file.write_all_at(&buf, off).unwrap();
        file.sync_data().unwrap();
        h.record(t.elapsed().as_nanos() as u64).unwrap();
        off += RECORD as u64;
        n += 1;
    }
    let name = if preallocated {
        "raw fdatasync, pre-zeroed file"
    } else {
        "raw fdatasync, growing file"
    };
    Row {
        name: name.into(),
        commits: n,
        secs: start.elapsed().as_secs_f64(),
        hist: h,
        fsyncs: n,
    }
}

/// Writers are async tasks on one thread, each appending and then awaiting a oneshot that the
/// shard's durability callback completes: the same shape as the server, where the tenant actor
/// appends and the syncer's callback releases the callers of a batch.
fn grouped(dir: &std::path::Path, writers: usize, secs: f64) -> Row {
    type Waiters = Arc<Mutex<VecDeque<(u64, oneshot::Sender<()>)>>>;
    let waiters: Waiters = Arc::new(Mutex::new(VecDeque::new()));
    let batches = Arc::new(AtomicU64::new(0));
    let (w2, b2) = (Arc::clone(&waiters), Arc::clone(&batches));
    let notify = Box::new(move |e| {
        if let DurableEvent::Durable(upto) = e {
            b2.fetch_add(1, Ordering::Relaxed);
            let mut q = w2.lock().unwrap();
            while q.front().is_some_and(|(s, _)| *s <= upto) {
                let (_, tx) = q.pop_front().unwrap();
                let _ = tx.send(());
            }
        }
    });
    let wal_dir = dir.join(format!("grouped-{writers}"));
    let (wal, _) = WalShard::open(
        &wal_dir,
        WalOptions::default(),
        0,
        &mut |_, _| Ok(()),
        Some(notify),
    )
    .unwrap();
    let wal = Arc::new(wal);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let start = Instant::now();
    let results: Vec<(u64, Histogram<u64>)> = rt.block_on(async {
        let tasks: Vec<_> = (0..writers)
            .map(|_| {
                let (wal, waiters) = (Arc::clone(&wal), Arc::clone(&waiters));
                tokio::spawn(async move {
                    let mut h = hist();
                    let payload = [0x5Au8; RECORD];
                    let mut n = 0u64;
                    while Instant::now() < deadline {
                        let t = Instant::now();
                        let (tx, rx) = oneshot::channel();
                        {
                            // Append and enqueue under one lock so the queue stays in seq order.
                            let mut q = waiters.lock().unwrap();
                            let seq = wal.append(&payload).unwrap();
                            q.push_back((seq, tx));
                        }
                        rx.await.unwrap();
                        h.record(t.elapsed().as_nanos() as u64).unwrap();
                        n += 1;
                    }
                    (n, h)
                })
            })
            .collect();
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await.unwrap());
        }
        out
    });
    let secs = start.elapsed().as_secs_f64();
    let mut merged = hist();
    let mut total = 0;
    for (n, h) in &results {
        total += n;
        merged.add(h).unwrap();
    }
    Row {
        name: format!("WalShard group commit, {writers} writers"),
        commits: total,
        secs,
        hist: merged,
        fsyncs: batches.load(Ordering::Relaxed),
    }
}

fn main() {
    // `cargo bench` passes `--bench`; the first numeric argument, if any, is seconds per case.
    let secs: f64 = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(3.0);
    let base = std::env::var_os("CUBE_BENCH_DIR").map_or_else(
        || std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")),
        Into::into,
    );
    std::fs::create_dir_all(&base).unwrap();
    let dir = tempfile::tempdir_in(&base).unwrap();
    eprintln!(
        "benchmark directory: {} ({secs} s per case)",
        dir.path().display()
    );

    let raw_pre = raw(dir.path(), secs, true);
    let raw_grow = raw(dir.path(), secs, false);
    let rows: Vec<Row> = [1, 16, 128]
        .into_iter()
        .map(|w| grouped(dir.path(), w, secs))
        .collect();

    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "| case | commits/s | p50 µs | p99 µs | records per fdatasync | commits/s ÷ raw |"
    )
    .unwrap();
    writeln!(out, "|---|---:|---:|---:|---:|---:|").unwrap();
    for r in [&raw_pre, &raw_grow].into_iter().chain(rows.iter()) {
        writeln!(
            out,
            "| {} | {:.0} | {:.1} | {:.1} | {:.1} | {:.2}× |",
            r.name,
            r.rate(),
            r.p(0.5),
            r.p(0.99),
            r.commits as f64 / r.fsyncs.max(1) as f64,
            r.rate() / raw_pre.rate()
        )
        .unwrap();
    }
    writeln!(out).unwrap();
    writeln!(
        out,
        "Targets: 128 writers ≥ 20× raw → {:.1}×; single-writer p50 ≤ 1.5× raw p50 → {:.2}×",
        rows[2].rate() / raw_pre.rate(),
        rows[0].p(0.5) / raw_pre.p(0.5)
    )
    .unwrap();
}
