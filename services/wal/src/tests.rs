//! Shard-level tests: torn, garbage and zero-filled tails, mid-log corruption, repeated reopen,
//! rotation, and concurrent group commit.

use std::fs;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::{Arc, Mutex};

use crate::{DurableEvent, SegmentSizing, WalError, WalOptions, WalShard, segment_file_name};

fn small() -> WalOptions {
    WalOptions {
        segments: SegmentSizing {
            initial: 4096,
            max: 16384,
        },
        max_record: 64 << 10,
    }
}

fn payload(seq: u64) -> Vec<u8> {
    format!("record-{seq}-")
        .repeat((seq % 7 + 1) as usize)
        .into_bytes()
}

/// Replayed (seq, payload) pairs.
type Seen = Vec<(u64, Vec<u8>)>;

/// Open, collecting every replayed record.
fn open(dir: &Path, opts: WalOptions) -> Result<(WalShard, Seen, crate::RecoveryReport), WalError> {
    let mut seen = Vec::new();
    let (wal, report) = WalShard::open(
        dir,
        opts,
        0,
        &mut |seq, p| {
            seen.push((seq, p.to_vec()));
            Ok(())
        },
        None,
    )?;
    Ok((wal, seen, report))
}

fn write_n(wal: &WalShard, n: u64) -> u64 {
    let mut last = 0;
    for _ in 0..n {
        let seq = wal.next_seq();
        last = wal.append(&payload(seq)).unwrap();
        assert_eq!(last, seq);
    }
    wal.wait_durable(last).unwrap();
    last
}

fn assert_records(seen: &[(u64, Vec<u8>)], n: u64) {
    assert_eq!(seen.len() as u64, n);
    for (i, (seq, p)) in seen.iter().enumerate() {
        assert_eq!(*seq, i as u64 + 1);
        assert_eq!(p, &payload(*seq));
    }
}

fn only_segment(dir: &Path) -> std::path::PathBuf {
    let mut segs: Vec<_> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    segs.sort();
    segs.pop().unwrap()
}

/// Offset where the record with sequence number `seq` starts (records 1..seq-1 precede it).
fn offset_of(seq: u64) -> u64 {
    (1..seq)
        .map(|s| (crate::RECORD_HEADER_LEN + payload(s).len()) as u64)
        .sum()
}

#[test]
fn records_survive_close_and_reopen_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, seen, _) = open(dir.path(), small()).unwrap();
    assert!(seen.is_empty());
    write_n(&wal, 10);
    assert_eq!(wal.close().unwrap(), 10);
    let (wal, seen, report) = open(dir.path(), small()).unwrap();
    assert_records(&seen, 10);
    assert_eq!(report.truncated_bytes, 0);
    assert_eq!(wal.next_seq(), 11);
}

#[test]
fn torn_tail_is_truncated_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _, _) = open(dir.path(), small()).unwrap();
    write_n(&wal, 5);
    wal.close().unwrap();
    // Cut the last record in half, as a crash in the middle of its write would.
    let seg = only_segment(dir.path());
    let f = fs::OpenOptions::new().write(true).open(&seg).unwrap();
    let start = offset_of(5);
    let len = (crate::RECORD_HEADER_LEN + payload(5).len()) as u64;
    f.write_all_at(&vec![0u8; (len / 2) as usize], start + len / 2)
        .unwrap();
    let (wal, seen, report) = open(dir.path(), small()).unwrap();
    assert_records(&seen, 4);
    assert_eq!(report.torn_tails, 1);
    assert!(report.truncated_bytes > 0);
    // Appending continues at the first lost sequence number, and a second reopen is clean.
    assert_eq!(write_n(&wal, 1), 5);
    wal.close().unwrap();
    let (_, seen, report) = open(dir.path(), small()).unwrap();
    assert_records(&seen, 5);
    assert_eq!(report.torn_tails, 0);
}

#[test]
fn garbage_tail_is_truncated() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _, _) = open(dir.path(), small()).unwrap();
    write_n(&wal, 6);
    wal.close().unwrap();
    let seg = only_segment(dir.path());
    let f = fs::OpenOptions::new().write(true).open(&seg).unwrap();
    f.write_all_at(&[0xA5; 300], offset_of(7)).unwrap();
    let (_, seen, report) = open(dir.path(), small()).unwrap();
    assert_records(&seen, 6);
    assert_eq!(report.truncated_bytes, 300);
    // The garbage really is gone from the file.
    let data = fs::read(&seg).unwrap();
    assert!(data[offset_of(7) as usize..].iter().all(|b| *b == 0));
}

#[test]
fn zero_filled_tail_inside_a_record_is_truncated_but_a_clean_zero_tail_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _, _) = open(dir.path(), small()).unwrap();
    write_n(&wal, 4);
    wal.close().unwrap();
    // Clean: the preallocated zeros after the last record are simply the end of data.
    let (wal, seen, report) = open(dir.path(), small()).unwrap();
    assert_records(&seen, 4);
    assert_eq!(report.truncated_bytes, 0);
    wal.close().unwrap();
    // The last record's header survived but its payload reads back as zeros (a block that was
    // allocated but never written).
    let seg = only_segment(dir.path());
    let f = fs::OpenOptions::new().write(true).open(&seg).unwrap();
    let payload_at = offset_of(4) + crate::RECORD_HEADER_LEN as u64;
    f.write_all_at(&vec![0u8; payload(4).len()], payload_at)
        .unwrap();
    let (_, seen, report) = open(dir.path(), small()).unwrap();
    assert_records(&seen, 3);
    assert_eq!(report.torn_tails, 1);
    // What is left of the record is its header (minus trailing zero bytes of the seq field).
    assert!(
        report.truncated_bytes > 8 && report.truncated_bytes <= crate::RECORD_HEADER_LEN as u64
    );
}

#[test]
fn corrupt_middle_record_refuses_to_open_and_keeps_the_data() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _, _) = open(dir.path(), small()).unwrap();
    write_n(&wal, 8);
    wal.close().unwrap();
    let seg = only_segment(dir.path());
    let before = fs::read(&seg).unwrap();
    let f = fs::OpenOptions::new().write(true).open(&seg).unwrap();
    f.write_all_at(&[0xFF], offset_of(3) + 20).unwrap();
    match open(dir.path(), small()) {
        Err(WalError::Corrupt {
            segment,
            offset,
            detail,
        }) => {
            assert_eq!(segment, segment_file_name(1));
            assert_eq!(offset, offset_of(3));
            assert!(detail.contains("followed by valid record 4"), "{detail}");
        }
        other => panic!(
            "expected corruption, got {:?}",
            other.map(|(_, s, r)| (s.len(), r))
        ),
    }
    // Nothing was truncated: an operator can still inspect or repair every record.
    let after = fs::read(&seg).unwrap();
    let diff = before.iter().zip(&after).filter(|(a, b)| a != b).count();
    assert_eq!(diff, 1);
}

#[test]
fn reopen_twenty_times_keeps_every_record() {
    let dir = tempfile::tempdir().unwrap();
    let mut total = 0;
    for round in 0..20 {
        let (wal, seen, report) = open(dir.path(), small()).unwrap();
        assert_records(&seen, total);
        assert_eq!(report.truncated_bytes, 0, "round {round}");
        total = write_n(&wal, round % 5 + 3);
        wal.close().unwrap();
    }
    let (_, seen, _) = open(dir.path(), small()).unwrap();
    assert_records(&seen, total);
}

#[test]
fn rotation_splits_into_named_segments_that_replay_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _, _) = open(dir.path(), small()).unwrap();
    write_n(&wal, 400);
    wal.close().unwrap();
    let mut names: Vec<String> = fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    // A pre-zeroed spare may be waiting for the next rotation; it is not a segment yet.
    names.retain(|n| n.ends_with(".wal"));
    names.sort();
    assert!(names.len() >= 3, "{names:?}");
    assert_eq!(names[0], segment_file_name(1));
    // Segment sizes double from 4 KiB to the 16 KiB maximum.
    let sizes: Vec<u64> = names
        .iter()
        .map(|n| fs::metadata(dir.path().join(n)).unwrap().len())
        .collect();
    assert_eq!(&sizes[..3], &[4096, 8192, 16384]);
    let (_, seen, report) = open(dir.path(), small()).unwrap();
    assert_records(&seen, 400);
    assert_eq!(report.segments, names.len());
}

#[test]
fn record_larger_than_a_segment_gets_a_segment_of_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _, _) = open(dir.path(), small()).unwrap();
    let big = vec![7u8; 40_000];
    let s1 = wal.append(b"small").unwrap();
    let s2 = wal.append(&big).unwrap();
    let s3 = wal.append(b"after").unwrap();
    wal.wait_durable(s3).unwrap();
    wal.close().unwrap();
    let (_, seen, _) = open(dir.path(), small()).unwrap();
    assert_eq!(
        seen,
        vec![(s1, b"small".to_vec()), (s2, big), (s3, b"after".to_vec())]
    );
    assert!(matches!(
        WalShard::open(dir.path(), small(), 0, &mut |_, _| Ok(()), None)
            .unwrap()
            .0
            .append(&vec![0; 70_000]),
        Err(WalError::RecordTooLarge { len: 70_000, .. })
    ));
}

#[test]
fn concurrent_writers_share_batches_and_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let events = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&events);
    let (wal, _) = WalShard::open(
        dir.path(),
        WalOptions::default(),
        0,
        &mut |_, _| Ok(()),
        Some(Box::new(move |e| {
            sink.lock().unwrap().push(e);
        })),
    )
    .unwrap();
    let wal = Arc::new(wal);
    let threads: Vec<_> = (0..16u8)
        .map(|t| {
            let wal = Arc::clone(&wal);
            std::thread::spawn(move || {
                for i in 0..50u8 {
                    let seq = wal.append(&[t, i]).unwrap();
                    wal.wait_durable(seq).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    // The callback runs just after waiters are released: close (joining the syncer) before
    // looking at what it reported.
    Arc::try_unwrap(wal).unwrap().close().unwrap();
    let events = events.lock().unwrap().clone();
    assert_eq!(events.last(), Some(&DurableEvent::Durable(800)));
    // Group commit: fewer batches than records, and the durable watermark only moves forward.
    assert!(events.len() < 800, "{} batches", events.len());
    assert!(events.windows(2).all(
        |w| matches!((w[0], w[1]), (DurableEvent::Durable(a), DurableEvent::Durable(b)) if a < b)
    ));
    let mut seen = std::collections::HashSet::new();
    WalShard::open(
        dir.path(),
        WalOptions::default(),
        0,
        &mut |_, p| {
            assert!(seen.insert(p.to_vec()));
            Ok(())
        },
        None,
    )
    .unwrap();
    assert_eq!(seen.len(), 800);
}

#[test]
fn replay_skips_records_covered_by_a_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _, _) = open(dir.path(), small()).unwrap();
    write_n(&wal, 300);
    wal.close().unwrap();
    let mut seqs = Vec::new();
    let (wal, report) = WalShard::open(
        dir.path(),
        small(),
        250,
        &mut |s, _| {
            seqs.push(s);
            Ok(())
        },
        None,
    )
    .unwrap();
    assert_eq!(seqs, (251..=300).collect::<Vec<_>>());
    assert_eq!(report.records_replayed, 50);
    assert_eq!(wal.next_seq(), 301);
}
