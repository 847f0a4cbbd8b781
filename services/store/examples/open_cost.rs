//! Time to open a tenant state store (fjall) after a checkpoint, by number of keys.
//!
//! `cargo run --release -p cube-store --example open_cost -- DIR N`

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Instant;

use cube_store::{BatchOp, FjallBackend, StateBackend, StateRead};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let dir = std::path::PathBuf::from(&args[1]);
    let n: u64 = args[2].parse().unwrap();
    if !dir.exists() {
        let b = FjallBackend::open(&dir, 32 << 20).unwrap();
        let mut batch = Vec::new();
        for i in 0..n {
            let k = i.wrapping_mul(0x9E37_79B9_7F4A_7C15).to_be_bytes();
            batch.push(BatchOp::Put(
                [b"c:".as_slice(), &k, &k].concat(),
                vec![(i & 0xff) as u8; 140],
            ));
            if batch.len() == 1000 {
                b.apply(std::mem::take(&mut batch)).unwrap();
            }
        }
        b.apply(batch).unwrap();
        b.flush().unwrap();
        drop(b);
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    let mut times = Vec::new();
    for _ in 0..15 {
        let t = Instant::now();
        let b = loop {
            match FjallBackend::open(&dir, 32 << 20) {
                Err(e) if FjallBackend::is_locked(&e) => {
                    std::thread::sleep(std::time::Duration::from_millis(5))
                }
                r => break r.unwrap(),
            }
        };
        let opened = t.elapsed();
        let k = 7u64.wrapping_mul(0x9E37_79B9_7F4A_7C15).to_be_bytes();
        let v = b.get(&[b"c:".as_slice(), &k, &k].concat()).unwrap();
        assert!(v.is_some() || n <= 7);
        times.push((opened.as_secs_f64() * 1e3, t.elapsed().as_secs_f64() * 1e3));
        drop(b);
        std::thread::sleep(std::time::Duration::from_millis(400));
    }
    times.sort_by(|a, b| a.0.total_cmp(&b.0));
    println!("n={n} open ms (sorted, with first get): {times:.2?}");
}
