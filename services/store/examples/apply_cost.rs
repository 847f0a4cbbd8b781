//! Where a durable write's time goes on the tenant's actor: prepare (checks against the logical
//! state) and apply (the state-store batch), on sled, on the in-memory backend, and on fjall (an
//! LSM tree, a candidate replacement for sled measured here before any decision).
//!
//! `cargo run --release -p cube-store --example apply_cost`

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Instant;

use cube_store::{
    BatchOp, Caller, Command, Coord, FjallBackend, MemBackend, SledBackend, StateBackend,
    StateLimits, TenantState,
};

fn run(name: &str, backend: Arc<dyn StateBackend>, n: u64, batch: usize) {
    let mut s = TenantState::open(backend, StateLimits::default()).unwrap();
    let caller = Caller {
        principal: "t/k".into(),
        ts_ms: 1,
    };
    let (mut prep, mut apply) = (0f64, 0f64);
    let mut seq = 0u64;
    let mut group = Vec::with_capacity(batch);
    let mut hints = Vec::with_capacity(batch);
    for i in 0..n {
        let cmd = Command::Write {
            coord: Coord {
                x: (i % 256) as i32,
                y: (i / 256) as i32,
                z: 0,
            },
            value: vec![0xA5; 100],
            expected_version: None,
        };
        let t = Instant::now();
        let p = s.prepare(cmd, &caller).unwrap();
        let cube_store::Prepared::Log {
            op, effect, growth, ..
        } = p
        else {
            panic!()
        };
        seq += 1;
        if let Some(h) = s.note_pending(seq, &op, effect, growth) {
            hints.push(h);
        }
        prep += t.elapsed().as_secs_f64();
        group.push((seq, op));
        if group.len() == batch {
            let t = Instant::now();
            s.apply_hinted(std::mem::take(&mut group), std::mem::take(&mut hints))
                .unwrap();
            apply += t.elapsed().as_secs_f64();
        }
    }
    println!(
        "{name:>6}: prepare {:.2} µs/write, apply {:.2} µs/write (batches of {batch})",
        prep / n as f64 * 1e6,
        apply / n as f64 * 1e6
    );
}

const CACHE: u64 = 256 << 20;

fn main() {
    let n = 100_000;
    let dir = tempfile::tempdir().unwrap();
    run("memory", Arc::new(MemBackend::default()), n, 64);
    run(
        "sled",
        Arc::new(SledBackend::open(dir.path(), CACHE).unwrap()),
        n,
        64,
    );
    let dir = tempfile::tempdir().unwrap();
    run(
        "fjall",
        Arc::new(FjallBackend::open(dir.path(), CACHE).unwrap()),
        n,
        64,
    );
    raw_sled(n);
    open_cost(100);
}

fn status(field: &str) -> String {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(field))
        .unwrap_or_default()
        .split_whitespace()
        .nth(1)
        .unwrap_or_default()
        .to_string()
}

/// What keeping `n` tenants open costs with each store: open time, threads, resident memory.
fn open_cost(n: usize) {
    for name in ["sled", "fjall"] {
        let dir = tempfile::tempdir().unwrap();
        let (threads0, rss0) = (status("Threads:"), status("VmRSS:"));
        let t = Instant::now();
        let mut open: Vec<Arc<dyn StateBackend>> = Vec::new();
        for i in 0..n {
            let path = dir.path().join(i.to_string());
            let b: Arc<dyn StateBackend> = if name == "sled" {
                Arc::new(SledBackend::open(&path, 8 << 20).unwrap())
            } else {
                Arc::new(FjallBackend::open(&path, 8 << 20).unwrap())
            };
            b.apply(vec![BatchOp::Put(b"k".to_vec(), vec![1; 100])])
                .unwrap();
            open.push(b);
        }
        let per_open = t.elapsed().as_secs_f64() / n as f64 * 1e3;
        println!(
            "{name:>6}: {n} open stores: {per_open:.2} ms per open, threads {threads0} -> {}, RSS {rss0} -> {} KiB",
            status("Threads:"),
            status("VmRSS:")
        );
    }
}

/// Raw sled batches shaped like the apply: random 13-byte cell keys with ~130-byte values, with
/// and without a sequential ~200-byte audit entry per write.
fn raw_sled(n: u64) {
    use cube_store::BatchOp;
    for audit in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let db = SledBackend::open(dir.path(), CACHE).unwrap();
        let t = Instant::now();
        let mut batch = Vec::new();
        for i in 0..n {
            let mut k = vec![b'c'];
            k.extend_from_slice(&(i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32).to_be_bytes()[..]);
            k.extend_from_slice(&[0; 4]);
            batch.push(BatchOp::Put(k, vec![1; 130]));
            if audit {
                let mut a = vec![b'a'];
                a.extend_from_slice(&i.to_be_bytes());
                batch.push(BatchOp::Put(a, vec![2; 200]));
            }
            if batch.len() >= 64 {
                db.apply(std::mem::take(&mut batch)).unwrap();
            }
        }
        println!(
            "raw sled, audit={audit}: {:.2} µs/write",
            t.elapsed().as_secs_f64() / n as f64 * 1e6
        );
    }
}
