//! The raw disk under the data directory: the fdatasync floor (4 KiB pwrite + fdatasync, one
//! after another) and sequential write-and-fsync throughput (4 MiB writes into a new file,
//! fdatasync after every 4 MiB and, in a second pass, after every 64 MiB; the faster pass is
//! the reference, since a batch path may sync that rarely). These are the ceilings every
//! durable system on this disk works under.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use anyhow::Context;
use hdrhistogram::Histogram;
use serde::Serialize;

use super::{Settings, progress, remove_data};

const BLOCK: usize = 4 << 10;
const CHUNK: usize = 4 << 20;
/// Bytes written between fdatasyncs in the sequential passes.
const SYNC_EVERY: [u64; 2] = [4 << 20, 64 << 20];
/// The fsync-floor file is written in full first, so the loop measures fdatasync of data
/// blocks, not of a growing file's metadata (Cube's WAL segments are pre-zeroed for the same
/// reason, docs/benchmarks.md); the loop wraps around inside it.
const FLOOR_FILE_BYTES: u64 = 64 << 20;

#[derive(Debug, Clone, Serialize)]
pub struct DiskResult {
    pub fsyncs_per_sec: f64,
    pub fsync_p50_us: u64,
    pub fsync_p99_us: u64,
    pub seq_bytes: u64,
    /// The faster of the passes: the reference for bulk loads.
    pub seq_seconds: f64,
    pub seq_mib_per_sec: f64,
    /// Each pass: bytes between fdatasyncs, MiB/s.
    pub seq_by_sync: Vec<(u64, f64)>,
}

pub fn run(s: &Settings, root: &Path) -> anyhow::Result<DiskResult> {
    let dir = root.join("disk");
    // Inside the run's directory, never recreating it (`create_dir_all`) after a signal's
    // cleanup removed it.
    std::fs::create_dir(&dir)?;
    let result = measure(s, &dir);
    remove_data(&dir);
    result
}

fn measure(s: &Settings, dir: &Path) -> anyhow::Result<DiskResult> {
    // 1. fdatasync floor.
    let path = dir.join("floor");
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .with_context(|| format!("creating {}", path.display()))?;
    let zeros = vec![0u8; CHUNK];
    for off in (0..FLOOR_FILE_BYTES).step_by(CHUNK) {
        file.write_all_at(&zeros, off)?;
    }
    file.sync_all()?;
    let block = vec![0x5Au8; BLOCK];
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    let calls = Arc::new(AtomicU64::new(0));
    let bar = progress::Timed::start(
        "disk fdatasync 4 KiB",
        s.window.warmup + s.window.measure,
        Arc::clone(&calls),
    );
    let start = Instant::now();
    let (measure_from, end) = (
        start + s.window.warmup,
        start + s.window.warmup + s.window.measure,
    );
    let mut off = 0u64;
    loop {
        let t = Instant::now();
        file.write_all_at(&block, off)?;
        file.sync_data()?;
        let now = Instant::now();
        calls.fetch_add(1, Ordering::Relaxed);
        if now >= end {
            break;
        }
        if t >= measure_from {
            let _ = hist.record((now - t).as_micros().max(1) as u64);
        }
        off = (off + BLOCK as u64) % FLOOR_FILE_BYTES;
    }
    drop(bar);
    drop(file);
    std::fs::remove_file(&path)?;
    let fsyncs_per_sec = hist.len() as f64 / s.window.measure.as_secs_f64();

    // 2. Sequential write-and-fsync into a new file, as a bulk load into a fresh store does.
    let chunk = vec![0xA5u8; CHUNK];
    let (mut written, mut seq_seconds, mut seq_by_sync) = (0u64, f64::MAX, Vec::new());
    for every in SYNC_EVERY {
        let path = dir.join("sequential");
        let mut file =
            File::create_new(&path).with_context(|| format!("creating {}", path.display()))?;
        let bar = progress::bytes_or_items(
            &format!("disk sequential, fdatasync per {} MiB", every >> 20),
            s.bulk_bytes,
            1,
        );
        let t = Instant::now();
        let (mut done, mut unsynced) = (0u64, 0u64);
        while done < s.bulk_bytes {
            let n = (s.bulk_bytes - done).min(CHUNK as u64) as usize;
            file.write_all(&chunk[..n])?;
            done += n as u64;
            unsynced += n as u64;
            if unsynced >= every || done == s.bulk_bytes {
                file.sync_data()?;
                unsynced = 0;
            }
            bar.inc(n as u64);
        }
        let seconds = t.elapsed().as_secs_f64();
        bar.finish_and_clear();
        drop(file);
        std::fs::remove_file(&path)?;
        seq_by_sync.push((every, done as f64 / f64::from(1u32 << 20) / seconds));
        written = done;
        seq_seconds = seq_seconds.min(seconds);
    }
    let r = DiskResult {
        fsyncs_per_sec,
        fsync_p50_us: hist.value_at_quantile(0.5),
        fsync_p99_us: hist.value_at_quantile(0.99),
        seq_bytes: written,
        seq_seconds,
        seq_mib_per_sec: written as f64 / f64::from(1u32 << 20) / seq_seconds,
        seq_by_sync,
    };
    eprintln!(
        "disk             fdatasync {:.0}/s p50 {} µs p99 {} µs; sequential {:.0} MiB at {} MiB/s (fdatasync per 4 / 64 MiB), reference {:.1} MiB/s",
        r.fsyncs_per_sec,
        r.fsync_p50_us,
        r.fsync_p99_us,
        written as f64 / f64::from(1u32 << 20),
        r.seq_by_sync
            .iter()
            .map(|(_, m)| format!("{m:.1}"))
            .collect::<Vec<_>>()
            .join(" / "),
        r.seq_mib_per_sec
    );
    Ok(r)
}
