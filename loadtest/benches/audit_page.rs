//! What the load driver spends checking one `Tenant.Audit` page of 100 entries: decoding each
//! entry into `cube.v1.AuditEntry` (owned strings and byte vectors) and verifying the chain, as
//! it did, against reading each entry in place (`verify_encoded_audit_entries`, through
//! `audit_link_of`) and verifying the same chain, as it does now. Both verify every hash; only
//! the decoding differs. Both start from the entries' bytes as the driver's decoder hands them
//! over; gRPC framing is in neither.
//!
//! `cargo bench -p cube-load --bench audit_page`

// A benchmark: a panic is a failed run with a backtrace.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use criterion::{Criterion, black_box, criterion_group, criterion_main};
use cube_api::v1::AuditEntry;
use cube_auth::client::{verify_audit_entries, verify_encoded_audit_entries};
use cube_auth::{AUDIT_GENESIS, audit_hash};
use prost::Message;
use prost::bytes::Bytes;

/// A page as the server sends it: 100 chained entries like the A/B mix's (a principal, an op,
/// a short detail), each encoded on its own.
fn page() -> Vec<Bytes> {
    let mut prev = AUDIT_GENESIS.to_vec();
    (1..=100u64)
        .map(|seq| {
            let (principal, op) = ("key-1", "write");
            let detail = format!("({seq},7,1) v{seq} 100 bytes");
            let ts_ms = 1_764_700_000_000 + seq as i64;
            let hash = audit_hash(&prev, seq, ts_ms, principal, op, &detail).to_vec();
            let e = AuditEntry {
                seq,
                ts_ms,
                principal: principal.into(),
                op: op.into(),
                detail,
                prev_hash: std::mem::replace(&mut prev, hash.clone()),
                hash,
            };
            Bytes::from(e.encode_to_vec())
        })
        .collect()
}

fn decoded(page: &[Bytes]) -> usize {
    let entries: Vec<AuditEntry> = page
        .iter()
        .map(|b| AuditEntry::decode(b.as_ref()).unwrap())
        .collect();
    verify_audit_entries(&entries).unwrap()
}

fn in_place(page: &[Bytes]) -> usize {
    verify_encoded_audit_entries(page).unwrap().unwrap()
}

fn bench(c: &mut Criterion) {
    let page = page();
    assert_eq!(decoded(&page), 100);
    assert_eq!(in_place(&page), 100);
    let mut g = c.benchmark_group("audit page of 100, check the chain");
    g.bench_function("decode to AuditEntry", |b| {
        b.iter(|| decoded(black_box(&page)))
    });
    g.bench_function("read in place", |b| b.iter(|| in_place(black_box(&page))));
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
