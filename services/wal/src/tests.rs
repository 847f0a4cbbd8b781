//! Shard-level tests: torn, garbage and zero-filled tails, mid-log corruption, repeated reopen,
//! rotation, concurrent group commit, segment deletion after a checkpoint, a checkpoint ahead of
//! the log, and the relaxed sync policy.

use std::fs;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::{
    DurableEvent, SegmentName, SegmentSizing, SyncPolicy, WalError, WalOptions, WalShard,
    find_segment,
};

fn small() -> WalOptions {
    WalOptions {
        segments: SegmentSizing {
            initial: 4096,
            max: 16384,
        },
        max_record: 64 << 10,
        sync: SyncPolicy::Always,
        max_unsynced_bytes: 64 << 20,
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
    open_after(dir, opts, 0)
}

/// Open with a checkpoint, collecting every replayed record.
fn open_after(
    dir: &Path,
    opts: WalOptions,
    start_after: u64,
) -> Result<(WalShard, Seen, crate::RecoveryReport), WalError> {
    let mut seen = Vec::new();
    let (wal, report) = WalShard::open(
        dir,
        opts,
        start_after,
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

/// Append `n` records, each in a batch of its own (durable before the next is appended).
fn write_each(wal: &WalShard, n: u64) -> u64 {
    let mut last = 0;
    for _ in 0..n {
        last = write_n(wal, 1);
    }
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
        .filter(|p| p.extension().is_some_and(|x| x == "wal"))
        .collect();
    segs.sort();
    segs.pop().unwrap()
}

/// The segment of `dir` that starts at `first` (its name holds a salt the test cannot guess).
fn segment(dir: &Path, first: u64) -> std::path::PathBuf {
    find_segment(dir, first).unwrap().expect("no such segment")
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
    // Under the default policy a record is durable as soon as it is written.
    assert_eq!(wal.written_seq(), 10);
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
    // Each its own batch: record 4 is of a batch written after record 3's was durable.
    write_each(&wal, 8);
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
            assert_eq!(SegmentName::parse(&segment).map(|n| n.first_seq), Some(1));
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
    assert_eq!(SegmentName::parse(&names[0]).map(|n| n.first_seq), Some(1));
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
fn a_log_whose_last_segment_is_exactly_full_opens_without_a_new_segment() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _, _) = open(dir.path(), small()).unwrap();
    let fills = vec![3u8; 4096 - crate::RECORD_HEADER_LEN];
    wal.wait_durable(wal.append(&fills).unwrap()).unwrap();
    wal.close().unwrap();
    assert_eq!(wal_files(dir.path()), vec![(1, 4096)]);
    // Reopening only reads: on a full disk it must not need a file it cannot create.
    let (wal, seen, _) = open(dir.path(), small()).unwrap();
    assert_eq!(seen, vec![(1, fills.clone())]);
    assert_eq!(wal_files(dir.path()), vec![(1, 4096)]);
    // The first append rotates past the full segment.
    let s2 = wal.append(b"after").unwrap();
    wal.wait_durable(s2).unwrap();
    wal.close().unwrap();
    assert_eq!(segment_firsts(dir.path()), [1, 2]);
    let (_, seen, _) = open(dir.path(), small()).unwrap();
    assert_eq!(seen, vec![(1, fills), (2, b"after".to_vec())]);
}

#[test]
fn concurrent_writers_share_batches_and_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, events) = open_recording(dir.path(), WalOptions::default());
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

// ---- Segment deletion after a checkpoint ----

/// The `.wal` files in `dir`, oldest first: (first seq, size). Spares are not segments.
/// The first seqs of the segments of `dir`, in order.
fn segment_firsts(dir: &Path) -> Vec<u64> {
    wal_files(dir).iter().map(|f| f.0).collect()
}

fn wal_files(dir: &Path) -> Vec<(u64, u64)> {
    let mut files: Vec<(u64, u64)> = fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| {
            let e = e.unwrap();
            let name = SegmentName::parse(e.file_name().to_str()?)?;
            Some((name.first_seq, e.metadata().unwrap().len()))
        })
        .collect();
    files.sort_unstable();
    files
}

/// Replayed seqs, each checked against the payload it was written with.
fn seqs_checked(seen: &[(u64, Vec<u8>)]) -> Vec<u64> {
    for (seq, p) in seen {
        assert_eq!(p, &payload(*seq), "payload of record {seq}");
    }
    seen.iter().map(|(s, _)| *s).collect()
}

/// The open was refused: the records between the checkpoint and the log's oldest segment are
/// in neither.
fn expect_missing_records(result: Result<(WalShard, Seen, crate::RecoveryReport), WalError>) {
    match result {
        Err(e @ WalError::StateBehindLog { .. }) => {
            assert!(e.to_string().contains("are in neither"), "{e}")
        }
        other => panic!(
            "expected missing records, got {:?}",
            other.map(|(_, s, r)| (s.len(), r))
        ),
    }
}

/// The open was refused as corruption, with `needle` in the finding.
fn expect_corrupt(result: Result<(WalShard, Seen, crate::RecoveryReport), WalError>, needle: &str) {
    match result {
        Err(WalError::Corrupt { detail, .. }) => assert!(detail.contains(needle), "{detail}"),
        other => panic!(
            "expected corruption ({needle}), got {:?}",
            other.map(|(_, s, r)| (s.len(), r))
        ),
    }
}

#[test]
fn delete_segments_through_removes_exactly_the_covered_sealed_segments() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _, _) = open(dir.path(), small()).unwrap();
    write_n(&wal, 800);
    let files = wal_files(dir.path());
    assert!(files.len() >= 4, "{files:?}");
    // The shared table follows rotations.
    assert_eq!(wal.segment_count(), files.len());
    assert_eq!(wal.wal_bytes(), files.iter().map(|f| f.1).sum::<u64>());

    // One short of the last record of segment 1: only segment 0 is wholly covered.
    let through = files[2].0 - 2;
    assert_eq!(
        wal.delete_segments_through(through).unwrap(),
        (1, files[0].1)
    );
    assert_eq!(wal_files(dir.path()), files[1..]);
    // The last record of segment 1: now segment 1 goes too.
    let through = files[2].0 - 1;
    assert_eq!(
        wal.delete_segments_through(through).unwrap(),
        (1, files[1].1)
    );
    assert_eq!(wal.delete_segments_through(through).unwrap(), (0, 0));
    assert_eq!(wal_files(dir.path()), files[2..]);
    assert_eq!(wal.segment_count(), files.len() - 2);
    assert_eq!(
        wal.wal_bytes(),
        wal_files(dir.path()).iter().map(|f| f.1).sum::<u64>()
    );

    // Appends carry on; the log replays exactly the records after the checkpoint.
    let last = write_n(&wal, 50);
    wal.close().unwrap();
    let (_, seen, _) = open_after(dir.path(), small(), through).unwrap();
    assert_eq!(
        seqs_checked(&seen),
        (through + 1..=last).collect::<Vec<_>>()
    );
    // A checkpoint older than the deleted records cannot be served, and says so.
    expect_missing_records(open(dir.path(), small()));
}

/// A failed fsync of the directory after deleting covered segments poisons the shard, as the
/// syncer's failed fdatasync does (its owner hears `Poisoned`; nothing more is appended): a
/// later fsync of the directory could report success without the failed block written.
#[test]
fn a_failed_directory_fsync_after_deleting_segments_poisons_the_shard() {
    let dir = tempfile::tempdir().unwrap();
    let events = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&events);
    let wal = open_notifying(dir.path(), small(), move |e| sink.lock().unwrap().push(e));
    write_n(&wal, 800);
    let files = wal_files(dir.path());
    assert!(files.len() >= 4, "{files:?}");
    crate::failpoint::fail_next_dir_sync_after_delete(dir.path());
    let e = wal.delete_segments_through(files[1].0 - 1).unwrap_err();
    assert!(e.is_failed_sync(), "{e}");
    assert!(events.lock().unwrap().contains(&DurableEvent::Poisoned));
    assert!(matches!(wal.append(b"y"), Err(WalError::Poisoned)));
}

/// A batch whose fdatasync is under way when a failed directory fsync (after deleting covered
/// segments) poisons the shard is not reported durable: poisoning promises nothing more is, and
/// the batch may sit in a segment it rotated into, whose name only a later fsync of the
/// directory (which proves nothing after a failed one) made durable.
#[test]
fn a_batch_syncing_while_the_shard_is_poisoned_is_not_reported_durable() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, events) = open_recording(dir.path(), small());
    write_n(&wal, 800);
    let files = wal_files(dir.path());
    assert!(files.len() >= 4, "{files:?}");
    crate::failpoint::delay_next_fdatasync(dir.path(), Duration::from_millis(500));
    let seq = wal.append(b"x").unwrap();
    // The syncer took the record and is held in its fdatasync.
    assert!(eventually(|| crate::failpoint::fdatasync_delay_taken(
        dir.path()
    )));
    crate::failpoint::fail_next_dir_sync_after_delete(dir.path());
    let e = wal.delete_segments_through(files[1].0 - 1).unwrap_err();
    assert!(e.is_failed_sync(), "{e}");
    assert!(
        !wait_durable_returns(&wal, seq),
        "reported durable after the poison"
    );
    // Closing joins the syncer, once out of its held fdatasync: every event is in then.
    match Arc::try_unwrap(wal) {
        Ok(wal) => drop(wal),
        Err(_) => panic!("another holder of the shard"),
    }
    let seen = events.lock().unwrap().clone();
    assert!(seen.contains(&DurableEvent::Poisoned), "{seen:?}");
    assert!(!seen.contains(&DurableEvent::Durable(seq)), "{seen:?}");
}

/// After a failed fsync of the directory (deleting covered segments), the syncer's next
/// rotation fails too, however long the deleting thread takes to poison the shard: the
/// rotation's own fsync of the directory comes after the failed one and vouches for nothing, so
/// a batch written into the new segment must not be reported durable (it was, when the poison
/// came after its fdatasync; found by review).
#[test]
fn a_rotation_after_a_failed_directory_fsync_reports_nothing_in_it_durable() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, events) = open_recording(dir.path(), small());
    write_n(&wal, 800);
    let files = wal_files(dir.path());
    assert!(files.len() >= 4, "{files:?}");
    crate::failpoint::fail_next_dir_sync_after_delete(dir.path());
    crate::failpoint::delay_poison_after_dir_sync_failure(dir.path(), Duration::from_secs(2));
    let deleter = {
        let wal = Arc::clone(&wal);
        let through = files[1].0 - 1;
        std::thread::spawn(move || wal.delete_segments_through(through))
    };
    // The fsync has failed; the shard is not poisoned yet.
    assert!(eventually(|| crate::failpoint::poison_delay_taken(
        dir.path()
    )));
    let newest_before = wal_files(dir.path()).last().unwrap().0;
    // Enough for more than one 16-KiB segment, if the shard takes them.
    for _ in 0..600 {
        let seq = wal.next_seq();
        if wal.append(&payload(seq)).is_err() {
            break;
        }
    }
    let e = deleter.join().unwrap().unwrap_err();
    assert!(e.is_failed_sync(), "{e}");
    let rotated_into = wal_files(dir.path())
        .into_iter()
        .map(|(first, _)| first)
        .find(|&first| first > newest_before)
        .expect("the syncer went on to a new segment");
    match Arc::try_unwrap(wal) {
        Ok(wal) => drop(wal),
        Err(_) => panic!("another holder of the shard"),
    }
    let seen = events.lock().unwrap().clone();
    assert!(seen.contains(&DurableEvent::Poisoned), "{seen:?}");
    assert!(
        seen.iter()
            .all(|e| !matches!(e, DurableEvent::Durable(s) if *s >= rotated_into)),
        "records of segment {rotated_into} reported durable: {seen:?}"
    );
}

/// A batch that a rotation splits, whose sealing fdatasync of the full segment fails: none of
/// it is reported durable, though its first records were written into that segment before the
/// failure; the shard is poisoned, no new segment is left behind, and a reopen replays a
/// contiguous log that holds every record reported durable (those of the failed batch it
/// replays are ones whose callers were told the outcome is unknown).
#[test]
fn a_batch_split_by_a_rotation_whose_seal_fails_is_not_reported_durable() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, events) = open_recording(dir.path(), small());
    write_n(&wal, 3);
    // Hold the syncer in the next batch's fdatasync, so that what is appended meanwhile is
    // taken as one batch after it: far more than the active segment's room.
    crate::failpoint::delay_next_fdatasync(dir.path(), Duration::from_secs(2));
    let held = wal.append(&payload(wal.next_seq())).unwrap();
    assert!(eventually(|| crate::failpoint::fdatasync_delay_taken(
        dir.path()
    )));
    crate::failpoint::fail_next_fdatasync(dir.path());
    let files_before = wal_files(dir.path());
    assert_eq!(files_before.len(), 1, "{files_before:?}");
    let mut last = held;
    for _ in 0..300 {
        last = wal.append(&payload(wal.next_seq())).unwrap();
    }
    assert!(wal.wait_durable(held).is_ok());
    assert!(wal.wait_durable(last).is_err());
    assert!(eventually(|| events
        .lock()
        .unwrap()
        .contains(&DurableEvent::Poisoned)));
    assert_eq!(wal.durable_seq(), held);
    // The failure was the seal's: the batch's own fdatasync comes after its rotation, which
    // would have left the next segment in place.
    assert_eq!(wal_files(dir.path()).len(), 1);
    let seen = events.lock().unwrap().clone();
    assert!(
        seen.iter()
            .all(|e| !matches!(e, DurableEvent::Durable(s) if *s > held)),
        "records of the failed batch reported durable: {seen:?}"
    );
    match Arc::try_unwrap(wal) {
        Ok(wal) => drop(wal),
        Err(_) => panic!("another holder of the shard"),
    }
    let (wal, replayed, _) = open(dir.path(), small()).unwrap();
    let seqs = seqs_checked(&replayed);
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>());
    // Every record reported durable, and some of the failed batch: written before the seal.
    assert!(seqs.len() as u64 > held, "{} replayed", seqs.len());
    assert!((seqs.len() as u64) < last);
    wal.close().unwrap();
}

/// A checkpoint ahead of the log whose covered segments' deletion at open ends in a failed
/// fsync of the directory fails the open: the shard is poisoned for good, and an open that
/// went on handed its owner a log that takes nothing (found by review).
#[test]
fn a_failed_directory_fsync_deleting_at_open_fails_the_open() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _, _) = open(dir.path(), small()).unwrap();
    write_n(&wal, 10);
    wal.close().unwrap();
    crate::failpoint::fail_next_dir_sync_after_delete(dir.path());
    let Err(e) = open_after(dir.path(), small(), 25) else {
        panic!("opened on a failed fsync of its directory");
    };
    assert!(e.is_failed_sync(), "{e}");
    // A later open (the restart) is served.
    let (wal, _, report) = open_after(dir.path(), small(), 25).unwrap();
    assert_eq!(report.last_seq, 25);
    wal.close().unwrap();
}

/// A failed fsync of a segment the shard prepared for its next rotation (the recycled one
/// reused, or a new pre-zeroed one) stops the shard like any failed fsync of a segment:
/// `Poisoned`, nothing more appended or reported durable; it used to be logged and passed over.
#[test]
fn a_failed_fsync_of_a_reused_segment_poisons_the_shard() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, events) = open_recording(dir.path(), small());
    write_n(&wal, 800);
    let files = wal_files(dir.path());
    wal.delete_segments_through(files[files.len() - 1].0 - 1)
        .unwrap();
    assert!(dir.path().join(crate::segment::RECYCLED_NAME).exists());
    crate::failpoint::fail_next_new_segment_sync(dir.path());
    expect_poisoned_at_the_next_rotation(&wal, dir.path(), &events);
}

/// The same for a new segment zero-filled for the next rotation.
#[test]
fn a_failed_fsync_of_a_new_segment_poisons_the_shard() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, events) = open_recording(dir.path(), small());
    write_n(&wal, 1);
    crate::failpoint::fail_next_new_segment_sync(dir.path());
    expect_poisoned_at_the_next_rotation(&wal, dir.path(), &events);
}

/// Append until the shard fails (it must, at its next rotation, whose new segment's fsync is
/// to fail); then nothing past the last durable seq is ever reported durable.
fn expect_poisoned_at_the_next_rotation(
    wal: &WalShard,
    dir: &Path,
    events: &Mutex<Vec<DurableEvent>>,
) {
    let first = wal_files(dir).last().unwrap().0;
    let mut last_durable = 0;
    for _ in 0..2000 {
        let Ok(seq) = wal.append(&payload(wal.next_seq())) else {
            break;
        };
        match wal.wait_durable(seq) {
            Ok(()) => last_durable = seq,
            Err(_) => break,
        }
    }
    // The owner hears it right after the waiters do.
    assert!(
        eventually(|| events.lock().unwrap().contains(&DurableEvent::Poisoned)),
        "no Poisoned event: {:?}",
        events.lock().unwrap().last()
    );
    assert!(matches!(wal.append(b"y"), Err(WalError::Poisoned)));
    assert!(wal.durable_seq() <= last_durable);
    assert_eq!(
        wal_files(dir).last().unwrap().0,
        first,
        "no segment past the one active before the failure is in use"
    );
}

#[test]
fn delete_segments_through_never_deletes_the_active_segment() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _, _) = open(dir.path(), small()).unwrap();
    // A single (active) segment is never deleted, even if every record is covered.
    write_n(&wal, 5);
    assert_eq!(wal.delete_segments_through(u64::MAX).unwrap(), (0, 0));
    write_n(&wal, 395);
    let files = wal_files(dir.path());
    let (active_first, active_size) = *files.last().unwrap();
    let freed: u64 = files[..files.len() - 1].iter().map(|f| f.1).sum();
    assert_eq!(
        wal.delete_segments_through(u64::MAX).unwrap(),
        (files.len() - 1, freed)
    );
    assert_eq!(wal_files(dir.path()), vec![(active_first, active_size)]);
    assert_eq!((wal.segment_count(), wal.wal_bytes()), (1, active_size));
    let last = write_n(&wal, 10);
    wal.close().unwrap();
    let (_, seen, _) = open_after(dir.path(), small(), active_first - 1).unwrap();
    assert_eq!(
        seqs_checked(&seen),
        (active_first..=last).collect::<Vec<_>>()
    );
}

#[test]
fn deleting_while_appending_leaves_a_log_that_recovers_after_the_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _, _) = open(dir.path(), small()).unwrap();
    let wal = Arc::new(wal);
    let writer = {
        let wal = Arc::clone(&wal);
        std::thread::spawn(move || {
            let mut last = 0;
            for _ in 0..1500 {
                let seq = wal.next_seq();
                last = wal.append(&payload(seq)).unwrap();
                if last % 50 == 0 {
                    wal.wait_durable(last).unwrap();
                }
            }
            wal.wait_durable(last).unwrap();
            last
        })
    };
    // Checkpoint at whatever is durable, as a store would, while the writer keeps rotating.
    let mut deleted = 0;
    while !writer.is_finished() {
        deleted += wal.delete_segments_through(wal.durable_seq()).unwrap().0;
        std::thread::sleep(Duration::from_micros(200));
    }
    let last = writer.join().unwrap();
    let through = wal.durable_seq();
    deleted += wal.delete_segments_through(through).unwrap().0;
    assert_eq!(through, last);
    assert!(deleted > 0);
    // Exactly the active segment is left, and the table agrees with the directory.
    let files = wal_files(dir.path());
    assert_eq!(files.len(), 1);
    assert_eq!(wal.segment_count(), 1);
    assert_eq!(wal.wal_bytes(), files[0].1);
    let active_first = files[0].0;
    Arc::try_unwrap(wal).unwrap().close().unwrap();
    let (_, seen, _) = open_after(dir.path(), small(), active_first - 1).unwrap();
    assert_eq!(
        seqs_checked(&seen),
        (active_first..=last).collect::<Vec<_>>()
    );
}

#[test]
fn crash_between_deletions_leaves_a_recoverable_log() {
    // What an interrupted deletion (or a power cut that persisted only some unlinks) leaves:
    // some covered segments gone, others still there.
    let dir = tempfile::tempdir().unwrap();
    let (wal, _, _) = open(dir.path(), small()).unwrap();
    write_n(&wal, 800);
    wal.close().unwrap();
    let files = wal_files(dir.path());
    assert!(files.len() >= 4, "{files:?}");
    let through = files[3].0 - 1;
    // Oldest first, interrupted after the first: a contiguous suffix is left.
    fs::remove_file(segment(dir.path(), files[0].0)).unwrap();
    let (wal, seen, _) = open_after(dir.path(), small(), through).unwrap();
    assert_eq!(seqs_checked(&seen), (through + 1..=800).collect::<Vec<_>>());
    // The rest of the deletion completes later.
    assert_eq!(wal.delete_segments_through(through).unwrap().0, 2);
    wal.close().unwrap();
    // Out of order (unlinks persisted in any order): still only covered segments are missing.
    let dir = tempfile::tempdir().unwrap();
    let (wal, _, _) = open(dir.path(), small()).unwrap();
    write_n(&wal, 800);
    wal.close().unwrap();
    fs::remove_file(segment(dir.path(), files[1].0)).unwrap();
    let (_, seen, _) = open_after(dir.path(), small(), through).unwrap();
    assert_eq!(seqs_checked(&seen), (through + 1..=800).collect::<Vec<_>>());
}

// ---- Checkpoint ahead of the log ----

#[test]
fn checkpoint_ahead_of_the_log_continues_in_a_new_segment() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _, _) = open(dir.path(), small()).unwrap();
    write_n(&wal, 10);
    wal.close().unwrap();

    // The caller's state holds records up to 25; the WAL lost 11..=25.
    let (wal, seen, report) = open_after(dir.path(), small(), 25).unwrap();
    assert!(seen.is_empty());
    assert_eq!(report.last_seq, 25);
    assert_eq!((wal.next_seq(), wal.durable_seq()), (26, 25));
    // A new segment named after the first new record; the covered one is gone.
    assert_eq!(segment_firsts(dir.path()), vec![26]);
    assert_eq!(wal.segment_count(), 1);
    assert_eq!(write_n(&wal, 3), 28);
    wal.close().unwrap();

    let (wal, seen, report) = open_after(dir.path(), small(), 25).unwrap();
    assert_eq!(seqs_checked(&seen), vec![26, 27, 28]);
    assert_eq!(report.truncated_bytes, 0);
    assert_eq!(wal.next_seq(), 29);
    wal.close().unwrap();
    let (wal, seen, _) = open_after(dir.path(), small(), 26).unwrap();
    assert_eq!(seqs_checked(&seen), vec![27, 28]);
    wal.close().unwrap();
    // Records 1..=25 are not in the log any more.
    expect_missing_records(open(dir.path(), small()));
}

#[test]
fn checkpoint_ahead_of_a_torn_multi_segment_log() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _, _) = open(dir.path(), small()).unwrap();
    write_n(&wal, 400);
    wal.close().unwrap();
    let files = wal_files(dir.path());
    assert!(files.len() >= 3, "{files:?}");
    // Power cut under the relaxed policy: the tail of the last segment is garbage.
    let (last_first, _) = *files.last().unwrap();
    let f = fs::OpenOptions::new()
        .write(true)
        .open(segment(dir.path(), last_first))
        .unwrap();
    let tail_at = (last_first..=400)
        .map(|s| (crate::RECORD_HEADER_LEN + payload(s).len()) as u64)
        .sum::<u64>();
    f.write_all_at(&[0x5A; 100], tail_at).unwrap();

    let (wal, seen, report) = open_after(dir.path(), small(), 500).unwrap();
    assert!(seen.is_empty());
    assert_eq!(report.torn_tails, 1);
    assert_eq!(segment_firsts(dir.path()), vec![501]);
    assert_eq!(write_n(&wal, 5), 505);
    wal.close().unwrap();
    let (_, seen, report) = open_after(dir.path(), small(), 500).unwrap();
    assert_eq!(seqs_checked(&seen), (501..=505).collect::<Vec<_>>());
    assert_eq!(report.torn_tails, 0);
}

#[test]
fn checkpoint_at_the_log_end_continues_in_the_same_segment() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _, _) = open(dir.path(), small()).unwrap();
    write_n(&wal, 10);
    wal.close().unwrap();
    let (wal, seen, _) = open_after(dir.path(), small(), 10).unwrap();
    assert!(seen.is_empty());
    assert_eq!(write_n(&wal, 2), 12);
    wal.close().unwrap();
    assert_eq!(segment_firsts(dir.path()), vec![1]);
    let (_, seen, _) = open(dir.path(), small()).unwrap();
    assert_records(&seen, 12);
}

// ---- Relaxed sync policy ----

fn relaxed(max_delay: Duration, max_records: u64) -> WalOptions {
    WalOptions {
        sync: SyncPolicy::Relaxed {
            max_delay,
            max_records,
        },
        ..small()
    }
}

/// Bound for things that must happen but whose speed is not under test (a loaded CI machine).
const GENEROUS: Duration = Duration::from_secs(30);

/// Poll `cond` until it holds; false if it did not within `GENEROUS`.
fn eventually(mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + GENEROUS;
    while Instant::now() < deadline {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    cond()
}

/// `wait_durable(seq)` on another thread; false if it has not returned within `GENEROUS` (the
/// thread is then left blocked, and the test fails instead of hanging).
fn wait_durable_returns(wal: &Arc<WalShard>, seq: u64) -> bool {
    let (tx, rx) = std::sync::mpsc::channel();
    let wal = Arc::clone(wal);
    std::thread::spawn(move || {
        let result = wal.wait_durable(seq);
        // Release the shard before reporting, so the caller can unwrap its Arc right after.
        drop(wal);
        let _ = tx.send(result);
    });
    matches!(rx.recv_timeout(GENEROUS), Ok(Ok(())))
}

/// Open with a notify callback that records every event.
fn open_recording(dir: &Path, opts: WalOptions) -> (Arc<WalShard>, Arc<Mutex<Vec<DurableEvent>>>) {
    let events = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&events);
    let wal = open_notifying(dir, opts, move |e| sink.lock().unwrap().push(e));
    (Arc::new(wal), events)
}

/// Open (nothing to replay) with `notify` as the notify callback.
fn open_notifying(
    dir: &Path,
    opts: WalOptions,
    notify: impl Fn(DurableEvent) + Send + Sync + 'static,
) -> WalShard {
    WalShard::open(dir, opts, 0, &mut |_, _| Ok(()), Some(Box::new(notify)))
        .unwrap()
        .0
}

fn append_n(wal: &WalShard, n: u64) -> u64 {
    let mut last = 0;
    for _ in 0..n {
        let seq = wal.next_seq();
        last = wal.append(&payload(seq)).unwrap();
    }
    last
}

#[test]
fn relaxed_sync_timer_makes_records_durable_without_further_appends() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, events) = open_recording(dir.path(), relaxed(Duration::from_millis(50), 1_000_000));
    assert_eq!(append_n(&wal, 10), 10);
    // Far below max_records and nothing else arrives: only the deadline can sync these.
    assert!(
        wait_durable_returns(&wal, 10),
        "records never became durable"
    );
    assert_eq!((wal.durable_seq(), wal.written_seq()), (10, 10));
    assert!(eventually(
        || events.lock().unwrap().last() == Some(&DurableEvent::Durable(10))
    ));
    Arc::try_unwrap(wal).unwrap().close().unwrap();
    let (_, seen, _) = open(dir.path(), small()).unwrap();
    assert_records(&seen, 10);
}

#[test]
fn relaxed_sync_waits_for_max_records_and_close_syncs_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, events) = open_recording(dir.path(), relaxed(Duration::from_secs(3600), 5));
    append_n(&wal, 4);
    // Written promptly (a kill -9 would not lose them) ...
    assert!(
        eventually(|| wal.written_seq() == 4),
        "records never written"
    );
    // ... but not synced: 4 < max_records and the deadline is an hour away.
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(wal.durable_seq(), 0);
    assert!(events.lock().unwrap().is_empty());
    // The fifth record triggers the fdatasync.
    append_n(&wal, 1);
    assert!(wait_durable_returns(&wal, 5), "max_records did not sync");
    assert_eq!(wal.durable_seq(), 5);
    append_n(&wal, 2);
    assert!(
        eventually(|| wal.written_seq() == 7),
        "records never written"
    );
    assert_eq!(wal.durable_seq(), 5);
    // Close syncs what is left.
    assert_eq!(Arc::try_unwrap(wal).unwrap().close().unwrap(), 7);
    assert_eq!(
        *events.lock().unwrap(),
        vec![DurableEvent::Durable(5), DurableEvent::Durable(7)]
    );
    let (_, seen, _) = open(dir.path(), small()).unwrap();
    assert_records(&seen, 7);
}

/// A narrower policy set on an open shard holds at once: records written under an hour's
/// relaxed delay are synced as soon as the shard is narrowed to `Always`, and every later batch
/// is synced as it is written; a wider policy changes nothing.
#[test]
fn a_narrower_policy_holds_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let hour = relaxed(Duration::from_secs(3600), 1_000_000);
    let (wal, _) = open_recording(dir.path(), hour.clone());
    append_n(&wal, 3);
    assert!(
        eventually(|| wal.written_seq() == 3),
        "records never written"
    );
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(wal.durable_seq(), 0, "synced before the deadline");
    assert_eq!(
        wal.narrow_policy(hour.sync),
        hour.sync,
        "the same policy changes nothing"
    );
    // The log records the policy it runs under for its recovery, and forgets it once narrowed.
    let ran_under = dir.path().join(crate::shard::RAN_UNDER);
    assert_eq!(fs::read_to_string(&ran_under).unwrap(), "1000000\n");
    // A shorter delay leaves the window as it is; fewer records narrow it.
    let shorter = |max_records| SyncPolicy::Relaxed {
        max_delay: Duration::from_secs(1800),
        max_records,
    };
    assert_eq!(wal.narrow_policy(shorter(1_000_000)), shorter(1_000_000));
    assert_eq!(wal.narrow_policy(shorter(500)), shorter(500));
    assert!(
        eventually(|| fs::read_to_string(&ran_under).is_ok_and(|t| t == "500\n")),
        "the narrowed window was not recorded"
    );
    // Only once what was written under the wider window is synced: recovery takes the file's
    // window as a bound on what was unsynced.
    assert_eq!(
        wal.durable_seq(),
        3,
        "recorded before the wider window's tail was synced"
    );
    assert_eq!(wal.narrow_policy(SyncPolicy::Always), SyncPolicy::Always);
    assert!(
        eventually(|| !ran_under.exists()),
        "the policy file was kept"
    );
    assert!(wait_durable_returns(&wal, 3), "not synced once narrowed");
    append_n(&wal, 2);
    assert!(wait_durable_returns(&wal, 5), "a later batch not synced");
    assert_eq!(wal.narrow_policy(hour.sync), SyncPolicy::Always, "widened");
    Arc::try_unwrap(wal).unwrap().close().unwrap();
}

/// Under a relaxed policy, written-but-unsynced bytes reaching `max_unsynced_bytes` trigger an
/// fdatasync however far the delay and record count are: large records cannot pile up unsynced
/// (and, for a caller that acknowledges before fdatasync, acknowledged) without a bound in
/// bytes. `unsynced_bytes` counts them until they are synced.
#[test]
fn relaxed_sync_at_max_unsynced_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let opts = WalOptions {
        max_unsynced_bytes: 4096,
        ..relaxed(Duration::from_secs(3600), 1_000_000)
    };
    let (wal, _) = open_recording(dir.path(), opts);
    let value = vec![7u8; 1100];
    for _ in 0..3 {
        wal.append(&value).unwrap();
    }
    assert!(
        eventually(|| wal.written_seq() == 3),
        "records never written"
    );
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(wal.durable_seq(), 0, "synced below the byte bound");
    let three = wal.unsynced_bytes();
    assert!((3300..4096).contains(&three), "{three}");
    // The fourth passes 4096 bytes.
    wal.append(&value).unwrap();
    assert!(wait_durable_returns(&wal, 4), "the byte bound did not sync");
    assert_eq!(wal.unsynced_bytes(), 0);
    assert_eq!(wal.max_unsynced_bytes(), 4096);
    Arc::try_unwrap(wal).unwrap().close().unwrap();
}

#[test]
fn relaxed_sync_across_rotations_replays_everything() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, events) = open_recording(dir.path(), relaxed(Duration::from_secs(3600), 1_000_000));
    assert_eq!(append_n(&wal, 400), 400);
    assert!(
        eventually(|| wal.written_seq() == 400),
        "records never written"
    );
    // Sealing a segment fdatasyncs it, but durability is reported only by the policy's syncs.
    assert_eq!(wal.durable_seq(), 0);
    assert!(events.lock().unwrap().is_empty());
    assert!(wal.segment_count() >= 3);
    assert_eq!(Arc::try_unwrap(wal).unwrap().close().unwrap(), 400);
    assert_eq!(*events.lock().unwrap(), vec![DurableEvent::Durable(400)]);
    let (_, seen, report) =
        open(dir.path(), relaxed(Duration::from_secs(3600), 1_000_000)).unwrap();
    assert_records(&seen, 400);
    assert_eq!(report.segments, wal_files(dir.path()).len());
    assert_eq!(report.truncated_bytes, 0);
}

#[test]
fn relaxed_policy_is_not_the_default() {
    assert_eq!(WalOptions::default().sync, SyncPolicy::Always);
    assert_eq!(SyncPolicy::default(), SyncPolicy::Always);
}

#[test]
fn a_failed_fsync_poisons_for_good_and_a_failed_write_leaves_the_shard_reopenable() {
    let io = |op: &'static str, errno: i32| WalError::Io {
        op,
        source: std::io::Error::from_raw_os_error(errno),
    };
    assert_eq!(
        io("fdatasync", 5).after_syncer_failure(),
        DurableEvent::Poisoned
    );
    assert_eq!(
        io("fdatasync", 28).after_syncer_failure(),
        DurableEvent::Poisoned
    );
    assert_eq!(
        io("syncing wal directory", 5).after_syncer_failure(),
        DurableEvent::Poisoned
    );
    assert_eq!(
        io("creating segment", 28).after_syncer_failure(),
        DurableEvent::WriteFailed { no_space: true }
    );
    assert_eq!(
        io("writing batch", 5).after_syncer_failure(),
        DurableEvent::WriteFailed { no_space: false }
    );
    assert_eq!(
        WalError::Closed.after_syncer_failure(),
        DurableEvent::Poisoned
    );
}

// ---- Recycled segments ----

/// Offset in the segment starting at `first` where record `seq` starts.
fn offset_in_segment(first: u64, seq: u64) -> u64 {
    (first..seq)
        .map(|s| (crate::RECORD_HEADER_LEN + payload(s).len()) as u64)
        .sum()
}

/// Write until the log has rotated into the recycled segment kept by a deletion; returns (the
/// checkpoint the deletion used, the recycled segment's first seq, the last seq written).
fn fill_into_a_recycled_segment(wal: &WalShard, dir: &Path) -> (u64, u64, u64) {
    write_n(wal, 800);
    let files = wal_files(dir);
    let through = files[files.len() - 1].0 - 1;
    let (deleted, _) = wal.delete_segments_through(through).unwrap();
    assert_eq!(deleted, files.len() - 1);
    assert!(dir.join(crate::segment::RECYCLED_NAME).exists());
    let active_first = files[files.len() - 1].0;
    while wal_files(dir).last().unwrap().0 == active_first {
        write_n(wal, 1);
    }
    assert!(
        !dir.join(crate::segment::RECYCLED_NAME).exists(),
        "the rotation reused the recycled segment"
    );
    let recycled_first = wal_files(dir).last().unwrap().0;
    let last = write_each(wal, 5);
    (through, recycled_first, last)
}

/// A closed log whose last segment is a reused one: (checkpoint, its first seq, last seq).
fn closed_log_in_a_recycled_segment(dir: &Path) -> (u64, u64, u64) {
    let (wal, _, _) = open(dir, small()).unwrap();
    let found = fill_into_a_recycled_segment(&wal, dir);
    wal.close().unwrap();
    found
}

/// Overwrite two bytes of segment `first` at `at`.
fn damage(dir: &Path, first: u64, at: u64) {
    fs::OpenOptions::new()
        .write(true)
        .open(segment(dir, first))
        .unwrap()
        .write_all_at(b"\xde\xad", at)
        .unwrap();
}

#[test]
fn a_recycled_segment_holds_old_records_after_the_new_ones_and_replays_only_the_new() {
    let dir = tempfile::tempdir().unwrap();
    let (through, recycled_first, last) = closed_log_in_a_recycled_segment(dir.path());

    // The old records are still there past the end of the new ones (it was not zero-filled).
    let seg = segment(dir.path(), recycled_first);
    let data = fs::read(&seg).unwrap();
    let end = offset_in_segment(recycled_first, last + 1) as usize;
    assert_eq!(&data[end..end + crate::RECORD_HEADER_LEN], &[0u8; 16][..]);
    assert!(
        data[end + crate::RECORD_HEADER_LEN..]
            .iter()
            .any(|b| *b != 0)
    );

    for _ in 0..2 {
        let (wal, seen, report) = open_after(dir.path(), small(), through).unwrap();
        assert_eq!(
            seqs_checked(&seen),
            (through + 1..=last).collect::<Vec<_>>()
        );
        assert_eq!((report.torn_tails, report.truncated_bytes), (0, 0));
        assert_eq!(wal.next_seq(), last + 1);
        wal.close().unwrap();
    }
}

#[test]
fn a_torn_tail_in_a_recycled_segment_is_cut_and_appending_carries_on() {
    let dir = tempfile::tempdir().unwrap();
    let (through, recycled_first, last) = closed_log_in_a_recycled_segment(dir.path());
    // The last record's payload never fully reached the disk.
    let at = offset_in_segment(recycled_first, last) + crate::RECORD_HEADER_LEN as u64 + 3;
    damage(dir.path(), recycled_first, at);

    let (wal, seen, report) = open_after(dir.path(), small(), through).unwrap();
    assert_eq!(seqs_checked(&seen), (through + 1..last).collect::<Vec<_>>());
    assert_eq!(report.torn_tails, 1);
    assert_eq!(wal.next_seq(), last);
    let newest = write_n(&wal, 30);
    wal.close().unwrap();
    let (_, seen, report) = open_after(dir.path(), small(), through).unwrap();
    assert_eq!(
        seqs_checked(&seen),
        (through + 1..=newest).collect::<Vec<_>>()
    );
    assert_eq!(report.torn_tails, 0);
}

#[test]
fn a_damaged_record_before_valid_ones_in_a_recycled_segment_is_corruption() {
    let dir = tempfile::tempdir().unwrap();
    let (through, recycled_first, last) = closed_log_in_a_recycled_segment(dir.path());
    assert!(last >= recycled_first + 3);
    let at =
        offset_in_segment(recycled_first, recycled_first + 1) + crate::RECORD_HEADER_LEN as u64;
    damage(dir.path(), recycled_first, at);
    expect_corrupt(
        open_after(dir.path(), small(), through),
        "followed by valid record",
    );
}

/// A 16-byte frame with an empty payload and a valid *unsalted* CRC for `seq`: what a client can
/// plant inside a value, since values reach the log byte for byte.
fn planted_frame(seq: u64) -> Vec<u8> {
    let mut frame = Vec::new();
    crate::record::encode(&mut frame, seq, 0, b"");
    frame
}

#[test]
fn a_frame_planted_in_old_bytes_of_a_recycled_segment_does_not_stop_it_opening() {
    let dir = tempfile::tempdir().unwrap();
    let (through, recycled_first, last) = closed_log_in_a_recycled_segment(dir.path());
    let seg = segment(dir.path(), recycled_first);
    let salt = SegmentName::parse(seg.file_name().unwrap().to_str().unwrap())
        .unwrap()
        .salt;
    assert_ne!(salt, 0);
    // Past the end of the new records and their end marker lie the old use's bytes: put a frame
    // for the next seq there, as a value written during that use could have.
    let old_bytes_at = offset_in_segment(recycled_first, last + 1) + 2 * 16;
    assert!(old_bytes_at + 16 <= fs::metadata(&seg).unwrap().len());
    let file = fs::OpenOptions::new().write(true).open(&seg).unwrap();
    file.write_all_at(&planted_frame(last + 1), old_bytes_at)
        .unwrap();
    drop(file);
    let (wal, seen, report) = open_after(dir.path(), small(), through).unwrap();
    assert_eq!(
        seqs_checked(&seen),
        (through + 1..=last).collect::<Vec<_>>()
    );
    assert_eq!((report.torn_tails, report.truncated_bytes), (0, 0));
    wal.close().unwrap();

    // The same frame salted for this segment (which needs the salt, never sent to clients) is
    // a later record behind a gap, and refused as such: the check is still on.
    let mut sealed = planted_frame(last + 1);
    crate::record::seal(&mut sealed, salt);
    let file = fs::OpenOptions::new().write(true).open(&seg).unwrap();
    file.write_all_at(&sealed, old_bytes_at).unwrap();
    drop(file);
    expect_corrupt(
        open_after(dir.path(), small(), through),
        "followed by valid record",
    );
}

/// A 4 KiB segment starting at seq 1, written by hand: the records of `batches` (each a run of
/// seqs appended as one batch) with `payload(seq)`, then zeros where bytes `zeroed` were (the
/// pages of a write that never reached the disk).
fn handmade_log(
    dir: &Path,
    batches: &[std::ops::RangeInclusive<u64>],
    zeroed: std::ops::Range<u64>,
) {
    const SALT: u32 = 0x5a17_c0de;
    let mut data = Vec::new();
    for batch in batches {
        for seq in batch.clone() {
            let start = data.len();
            crate::record::encode(&mut data, seq, seq - batch.start(), &payload(seq));
            crate::record::seal(&mut data[start..], SALT);
        }
    }
    data.resize(4096, 0);
    data[zeroed.start as usize..zeroed.end as usize].fill(0);
    let name = SegmentName {
        first_seq: 1,
        salt: SALT,
    };
    fs::write(dir.join(name.file_name()), data).unwrap();
}

/// A whole record where another belongs (record 4 right after 2) is a gap, refused: it was cut
/// as a torn tail, dropping a record the writer had written.
#[test]
fn a_whole_record_where_another_belongs_is_refused_not_cut() {
    let dir = tempfile::tempdir().unwrap();
    handmade_log(dir.path(), &[1..=1, 2..=2, 4..=4], 0..0);
    expect_corrupt(open(dir.path(), small()), "record 4 where record 3 belongs");
    // The same with a later record after it (the batch of 4..=5).
    let dir = tempfile::tempdir().unwrap();
    handmade_log(dir.path(), &[1..=1, 2..=2, 4..=5], 0..0);
    expect_corrupt(open(dir.path(), small()), "record 4 where record 3 belongs");
}

/// A power cut during a batch's fdatasync can leave its later pages on disk and an earlier one
/// not (nothing orders them). Those later records are of the batch that should have held the
/// first missing one, so none of it was acknowledged: it is cut as a torn tail, and the log
/// carries on from there. (Before batch positions it was refused as corruption.)
#[test]
fn the_rest_of_a_torn_write_is_cut_as_a_torn_tail() {
    let dir = tempfile::tempdir().unwrap();
    // Batches 1, 2 and 3..=10; the write of 3..=10 lost its first bytes (records 3 and 4).
    handmade_log(
        dir.path(),
        &[1..=1, 2..=2, 3..=10],
        offset_of(3)..offset_of(5),
    );
    let (wal, seen, report) = open(dir.path(), small()).unwrap();
    assert_eq!(seqs_checked(&seen), vec![1, 2]);
    assert_eq!(report.torn_tails, 1);
    assert_eq!(report.truncated_bytes, offset_of(11) - offset_of(3));
    assert_eq!(wal.next_seq(), 3);
    write_each(&wal, 4);
    wal.close().unwrap();
    let (_, seen, report) = open(dir.path(), small()).unwrap();
    assert_eq!(seqs_checked(&seen), vec![1, 2, 3, 4, 5, 6]);
    assert_eq!(report.torn_tails, 0);

    // A sector lost further into the write (the expected header intact, a whole 512-byte
    // sector of zeros before the surviving records): the records before it are whole and
    // replayed; from the first damaged one on, the write is cut.
    let dir = tempfile::tempdir().unwrap();
    assert!(offset_of(3) + 16 < 1024 && offset_of(41) > 1536 + 64);
    handmade_log(dir.path(), &[1..=1, 2..=2, 3..=40], 1024..1536);
    let whole = (1..40).take_while(|s| offset_of(s + 1) <= 1024).count() as u64;
    let (_, seen, report) = open(dir.path(), small()).unwrap();
    assert_eq!(seqs_checked(&seen), (1..=whole).collect::<Vec<_>>());
    assert_eq!(report.torn_tails, 1);
}

/// Valid records of a *later* batch after a damaged one mean the damaged record's batch was
/// durable before they were written: corruption, as before, even when records of its own batch
/// come first. Nothing is cut.
#[test]
fn a_damaged_record_followed_by_a_later_batch_is_corruption() {
    let dir = tempfile::tempdir().unwrap();
    handmade_log(
        dir.path(),
        &[1..=1, 2..=2, 3..=6, 7..=8],
        offset_of(4)..offset_of(5),
    );
    let seg = only_segment(dir.path());
    let before = fs::read(&seg).unwrap();
    expect_corrupt(open(dir.path(), small()), "followed by valid record 7");
    assert_eq!(fs::read(&seg).unwrap(), before);
    // A flipped byte in record 4, with only its own batch after it: no sector was lost, so it
    // is damage to written data, not a torn write, and is refused too.
    handmade_log(dir.path(), &[1..=1, 2..=2, 3..=6], 0..0);
    damage(dir.path(), 1, offset_of(4) + 20);
    expect_corrupt(open(dir.path(), small()), "followed by valid record 5");
    // The same batch with record 4's sector lost (its header reads as zeros) is a torn write.
    handmade_log(
        dir.path(),
        &[1..=1, 2..=2, 3..=6],
        offset_of(4)..offset_of(5),
    );
    let (_, seen, report) = open(dir.path(), small()).unwrap();
    assert_eq!(seqs_checked(&seen), vec![1, 2, 3]);
    assert_eq!(report.torn_tails, 1);
}

/// Under the relaxed policy several writes are unsynced at once, and a power cut can keep a
/// later one and lose an earlier one: records of later batches after a lost sector are the
/// unsynced tail, cut from the hole (the policy allows losing them), when the lost record's
/// batch began within the policy's window of the newest batch's start (fewer than
/// `max_records` records before that batch were unsynced when it was written, and a lost
/// record's whole batch was unsynced with it). Further back, or without the mark of a lost
/// sector, it is still corruption; under `sync` it always is
/// (`a_damaged_record_followed_by_a_later_batch_is_corruption`).
#[test]
fn a_relaxed_logs_unsynced_tail_with_a_hole_is_cut_within_its_window() {
    let hour = Duration::from_secs(3600);
    let dir = tempfile::tempdir().unwrap();
    // Batches 1..=3, 4..=5, 6..=8 and 9; record 4's sector never reached the disk. Its batch
    // began at 4 (record 5 says so), the newest at 9: unsynced together only if fewer than
    // max_records records before 9 could be, so with max_records 6 and not 5.
    // The log ran under a relaxed policy of 1000 records (the opening policy is narrower).
    let ran_relaxed = || fs::write(dir.path().join(crate::shard::RAN_UNDER), "1000\n").unwrap();
    let lost_4 = || {
        handmade_log(
            dir.path(),
            &[1..=3, 4..=5, 6..=8, 9..=9],
            offset_of(4)..offset_of(5),
        );
        ran_relaxed();
    };
    lost_4();
    let seg = only_segment(dir.path());
    let before = fs::read(&seg).unwrap();
    expect_corrupt(
        open(dir.path(), relaxed(hour, 5)),
        "followed by valid record 6",
    );
    assert_eq!(fs::read(&seg).unwrap(), before, "nothing cut");
    // Under `sync` it is corruption whatever the distance.
    expect_corrupt(open(dir.path(), small()), "followed by valid record 6");
    let (wal, seen, report) = open(dir.path(), relaxed(hour, 6)).unwrap();
    assert_eq!(seqs_checked(&seen), vec![1, 2, 3]);
    assert_eq!(report.torn_tails, 1);
    assert_eq!(report.truncated_bytes, offset_of(10) - offset_of(4));
    assert_eq!(wal.next_seq(), 4);
    // Appending carries on from the hole (the close syncs them: the delay is an hour).
    append_n(&wal, 3);
    wal.close().unwrap();
    let (_, seen, report) = open(dir.path(), small()).unwrap();
    assert_eq!(seqs_checked(&seen), vec![1, 2, 3, 4, 5, 6]);
    assert_eq!(report.torn_tails, 0);

    // The lost record's batch, not the record, counts: record 4 of a batch that began at 3
    // (batches 1, 2, 3..=6, 7..=8, 9) was synced with 3..=6 once 6 records were unsynced
    // under max_records 6, so losing it is damage; under max_records 7 it may not have been.
    let lost_4_of_3 = || {
        handmade_log(
            dir.path(),
            &[1..=1, 2..=2, 3..=6, 7..=8, 9..=9],
            offset_of(4)..offset_of(5),
        );
        ran_relaxed();
    };
    lost_4_of_3();
    expect_corrupt(
        open(dir.path(), relaxed(hour, 6)),
        "followed by valid record 7",
    );
    let (_, seen, _) = open(dir.path(), relaxed(hour, 7)).unwrap();
    assert_eq!(seqs_checked(&seen), vec![1, 2, 3]);
    // The policy the log ran under bounds the cut too: one that ran under 6 records (or under
    // `sync`: no file), opened under a policy widened since, is refused.
    lost_4_of_3();
    fs::write(dir.path().join(crate::shard::RAN_UNDER), "6\n").unwrap();
    expect_corrupt(
        open(dir.path(), relaxed(hour, 1000)),
        "followed by valid record 7",
    );
    fs::remove_file(dir.path().join(crate::shard::RAN_UNDER)).unwrap();
    expect_corrupt(
        open(dir.path(), relaxed(hour, 1000)),
        "followed by valid record 7",
    );
    // A flipped byte in record 4 (no lost sector) is damage under `relaxed` too.
    handmade_log(dir.path(), &[1..=1, 2..=2, 3..=6, 7..=8, 9..=9], 0..0);
    ran_relaxed();
    damage(dir.path(), 1, offset_of(4) + 20);
    expect_corrupt(
        open(dir.path(), relaxed(hour, 1000)),
        "followed by valid record 7",
    );
}

#[test]
fn an_unsalted_segment_from_before_salts_is_read_then_sealed() {
    // A log written before segment names carried a salt: records with plain CRCs, `<seq>.wal`.
    let dir = tempfile::tempdir().unwrap();
    let mut data = Vec::new();
    for seq in 1..=5 {
        crate::record::encode(&mut data, seq, 0, &payload(seq));
    }
    data.resize(4096, 0);
    let legacy = dir.path().join(
        SegmentName {
            first_seq: 1,
            salt: 0,
        }
        .file_name(),
    );
    fs::write(&legacy, &data).unwrap();
    let (wal, seen, report) = open(dir.path(), small()).unwrap();
    assert_eq!(seqs_checked(&seen), vec![1, 2, 3, 4, 5]);
    assert_eq!(report.torn_tails, 0);
    // Appending goes on in a new, salted segment; the old one stays, sealed, and the whole log
    // reads back.
    assert_eq!(write_n(&wal, 3), 8);
    wal.close().unwrap();
    assert_eq!(
        fs::read(&legacy).unwrap(),
        data,
        "the unsalted segment is not written to"
    );
    let next = SegmentName::parse(
        segment(dir.path(), 6)
            .file_name()
            .unwrap()
            .to_str()
            .unwrap(),
    );
    assert!(next.is_some_and(|n| n.salt != 0), "{next:?}");
    let (_, seen, _) = open(dir.path(), small()).unwrap();
    assert_eq!(seqs_checked(&seen), (1..=8).collect::<Vec<_>>());
}

#[test]
fn an_empty_segment_left_beside_its_replacement_is_removed_at_open() {
    // What a crash can leave when a rotation replaces an empty segment (or a close replaces the
    // log by its marker): the empty one's unlink lost, its replacement there, same first seq.
    let dir = tempfile::tempdir().unwrap();
    let (wal, _, _) = open(dir.path(), small()).unwrap();
    let last = write_n(&wal, 4);
    wal.close().unwrap();
    let full = segment(dir.path(), 1);
    let empty = dir.path().join(
        SegmentName {
            first_seq: 1,
            salt: 0x0000_0001,
        }
        .file_name(),
    );
    fs::write(&empty, vec![0u8; 4096]).unwrap();
    let (wal, seen, _) = open(dir.path(), small()).unwrap();
    assert_eq!(seqs_checked(&seen), (1..=last).collect::<Vec<_>>());
    assert!(!empty.exists() && full.exists());
    wal.close().unwrap();

    // Two that both hold records are refused, and both kept.
    fs::copy(&full, &empty).unwrap();
    expect_corrupt(open(dir.path(), small()), "two segments start at seq 1");
    assert!(empty.exists() && full.exists());
}

#[test]
fn a_spare_being_prepared_does_not_outlive_the_closed_shard() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _, _) = open(dir.path(), small()).unwrap();
    // Past half of the first 4 KiB segment: the next one is being zero-filled in the background.
    write_n(&wal, 40);
    wal.close().unwrap();
    let names: Vec<String> = fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(names.iter().all(|n| n.ends_with(".wal")), "{names:?}");
}

#[test]
fn a_log_needs_replay_until_it_is_closed_and_removed() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("wal");
    assert!(!crate::log_may_need_replay(&dir).unwrap(), "no directory");
    let (wal, _, _) = open(&dir, small()).unwrap();
    let seq = wal.append(b"x").unwrap();
    wal.wait_durable(seq).unwrap();
    // Open (or killed while open): the active segment holds records.
    assert!(crate::log_may_need_replay(&dir).unwrap());
    let last = wal.close().unwrap();
    assert!(
        crate::log_may_need_replay(&dir).unwrap(),
        "closed, not removed"
    );
    // What a clean close does once the checkpoint covers the log: one empty marker segment.
    crate::remove_covered_log(&dir, last + 1).unwrap();
    assert!(!crate::log_may_need_replay(&dir).unwrap());
    // Reopening it alone leaves nothing to replay; its first record does.
    let (wal, seen, _) = open_after(&dir, small(), last).unwrap();
    assert!(seen.is_empty());
    assert!(!crate::log_may_need_replay(&dir).unwrap());
    wal.wait_durable(wal.append(b"y").unwrap()).unwrap();
    assert!(crate::log_may_need_replay(&dir).unwrap());
    drop(wal);
}

/// The empty marker a clean close leaves (salted; or unsalted, as older builds made it) stays
/// the log's last segment when the log is reopened: opening needs no new file, which on a full
/// disk it could not create, and the marker's seq keeps guarding against an older state store.
/// The first append replaces it.
#[test]
fn a_cleanly_closed_log_reopens_on_its_marker_and_the_first_append_replaces_it() {
    for unsalted in [false, true] {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("wal");
        let (wal, _, _) = open(&dir, small()).unwrap();
        let last = write_n(&wal, 5);
        wal.close().unwrap();
        crate::remove_covered_log(&dir, last + 1).unwrap();
        let marker = segment(&dir, last + 1);
        if unsalted {
            let old_name = SegmentName {
                first_seq: last + 1,
                salt: 0,
            };
            fs::rename(&marker, dir.join(old_name.file_name())).unwrap();
        }
        let names = || -> Vec<String> {
            let mut names: Vec<String> = fs::read_dir(&dir)
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect();
            names.sort();
            names
        };
        let before = names();
        assert_eq!(wal_files(&dir), vec![(last + 1, 0)], "unsalted: {unsalted}");
        let (wal, seen, _) = open_after(&dir, small(), last).unwrap();
        assert!(seen.is_empty());
        assert_eq!(
            names(),
            before,
            "the open changed the directory (unsalted: {unsalted})"
        );
        let seq = wal.append(b"after").unwrap();
        assert_eq!(seq, last + 1);
        wal.wait_durable(seq).unwrap();
        wal.close().unwrap();
        assert_eq!(
            wal_files(&dir),
            vec![(last + 1, 4096)],
            "unsalted: {unsalted}"
        );
        let salt = SegmentName::parse(&names()[0]).unwrap().salt;
        assert_ne!(salt, 0, "the replacement is salted");
        let (_, seen, _) = open_after(&dir, small(), last).unwrap();
        assert_eq!(seen, vec![(last + 1, b"after".to_vec())]);
    }
}

/// A bug that panics the syncer (here: in the notify callback) poisons the shard: without that
/// it looked healthy while appends queued for a thread that was gone.
#[test]
fn a_panicking_syncer_poisons_the_shard_instead_of_leaving_it_hanging() {
    let dir = tempfile::tempdir().unwrap();
    let events = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&events);
    let wal = open_notifying(dir.path(), small(), move |e| {
        assert!(
            !matches!(e, DurableEvent::Durable(_)),
            "injected: the notify callback panics"
        );
        sink.lock().unwrap().push(e);
    });
    wal.append(b"x").unwrap();
    assert!(
        eventually(|| events.lock().unwrap().contains(&DurableEvent::Poisoned)),
        "{:?}",
        events.lock().unwrap()
    );
    assert!(matches!(wal.append(b"y"), Err(WalError::Poisoned)));
    assert!(matches!(wal.close(), Err(WalError::Poisoned)));
}

/// Bytes after the end of data that look like a long record at every offset (client values in
/// a recycled segment's old tail can be made to) would cost recovery a checksum of up to the
/// rest of the segment per offset, hours for a large segment. Each candidate's checksum now
/// comes from running checksums of the tail, whatever its length: none checks, and the tail is
/// cut as the torn write it is. (Until 2026-12-05 the scan had a budget, and past it the
/// segment was refused, which a tenant's own writer could bring about at will.)
#[test]
fn a_tail_of_crafted_record_headers_is_checked_and_cut() {
    const SALT: u32 = 0x5a17_c0de;
    const SIZE: usize = 256 << 10;
    let dir = tempfile::tempdir().unwrap();
    let mut data = Vec::new();
    for seq in 1..=2 {
        let start = data.len();
        crate::record::encode(&mut data, seq, 0, &payload(seq));
        crate::record::seal(&mut data[start..], SALT);
    }
    // A header claiming record 3 with a length reaching the end, at every 16th byte.
    let end = data.len();
    data.resize(SIZE, 0);
    crafted_headers(&mut data[end..], 3);
    let name = SegmentName {
        first_seq: 1,
        salt: SALT,
    };
    let seg = dir.path().join(name.file_name());
    fs::write(&seg, &data).unwrap();
    let (wal, seen, report) = open(dir.path(), small()).unwrap();
    assert_eq!(seqs_checked(&seen), vec![1, 2]);
    assert_eq!(report.torn_tails, 1);
    assert_eq!(wal.next_seq(), 3);
    wal.close().unwrap();
    assert!(fs::read(&seg).unwrap()[end..].iter().all(|b| *b == 0));
}

/// Fill `tail` with headers claiming record `seq` (and later ones) with a length reaching the
/// end of `tail`, a wrong checksum, at every 16th byte.
fn crafted_headers(tail: &mut [u8], seq: u64) {
    let mut off = 0;
    while off + 16 <= tail.len() {
        let len = (tail.len() - off - 16) as u32;
        let seq = seq + (off / 4096) as u64;
        tail[off..off + 4].copy_from_slice(&len.to_le_bytes());
        tail[off + 4..off + 8].copy_from_slice(&0xdead_beef_u32.to_le_bytes());
        tail[off + 8..off + 16].copy_from_slice(&seq.to_le_bytes());
        off += 16;
    }
}

/// In a recycled segment, old bytes follow every end of data, and a client's values can fill
/// them with record-like headers: after a crash (a clean end marker, no torn write) the log
/// opens, replays what it holds and cuts nothing (found by review: past the checksum budget the
/// tenant was refused).
#[test]
fn crafted_headers_after_a_clean_end_in_a_recycled_segment_do_not_stop_it_opening() {
    let dir = tempfile::tempdir().unwrap();
    let (through, recycled_first, last) = closed_log_in_a_recycled_segment(dir.path());
    let seg = segment(dir.path(), recycled_first);
    let mut data = fs::read(&seg).unwrap();
    let end = offset_in_segment(recycled_first, last + 1) as usize;
    assert_eq!(&data[end..end + 16], &[0u8; 16][..]);
    crafted_headers(&mut data[end + 16..], last + 1);
    fs::write(&seg, &data).unwrap();
    let (wal, seen, report) = open_after(dir.path(), small(), through).unwrap();
    assert_eq!(
        seqs_checked(&seen),
        (through + 1..=last).collect::<Vec<_>>()
    );
    assert_eq!((report.torn_tails, report.truncated_bytes), (0, 0));
    assert_eq!(wal.next_seq(), last + 1);
    wal.close().unwrap();
}

/// One flipped bit in an acknowledged record is damage, not a torn write, and is refused, not
/// cut: even when its value holds a zero sector (which passes for the mark of a lost write when
/// later records of its batch follow), and even when it is the log's last record (where nothing
/// follows it to tell).
#[test]
fn a_flipped_bit_in_the_last_batch_is_refused_even_beside_a_zero_sector() {
    const SALT: u32 = 0x5a17_c0de;
    // Record 3 holds 2 KiB of zeros (an aligned 512-byte sector of them, wherever it starts).
    let value = |seq: u64| {
        if seq == 3 {
            let mut v = b"zeros:".to_vec();
            v.resize(2048 + 6, 0);
            v.extend_from_slice(b":end");
            v
        } else {
            payload(seq)
        }
    };
    // `flip`: (offset in record 3's frame, bit mask).
    let write_log = |dir: &Path, batches: &[std::ops::RangeInclusive<u64>], flip: (usize, u8)| {
        let mut data = Vec::new();
        let mut at3 = 0;
        for batch in batches {
            for seq in batch.clone() {
                let start = data.len();
                if seq == 3 {
                    at3 = start;
                }
                crate::record::encode(&mut data, seq, seq - batch.start(), &value(seq));
                crate::record::seal(&mut data[start..], SALT);
            }
        }
        data.resize(16384, 0);
        data[at3 + flip.0] ^= flip.1;
        let name = SegmentName {
            first_seq: 1,
            salt: SALT,
        };
        fs::write(dir.join(name.file_name()), &data).unwrap();
        data
    };
    // One bit of record 3's value (outside its zeros), and one of each field of its header: the
    // length (low byte, and a bit that makes it longer than the segment), the stored checksum,
    // the sequence number (lowest and highest bit), the batch position.
    let flips = [
        (16 + 2, 0x10),
        (0, 0x04),
        (3, 0x40),
        (6, 0x01),
        (8, 0x01),
        (13, 0x80),
        (15, 0x02),
    ];
    for flip in flips {
        for batches in [&[1..=1, 2..=2, 3..=6][..], &[1..=1, 2..=2, 3..=3]] {
            let dir = tempfile::tempdir().unwrap();
            let before = write_log(dir.path(), batches, flip);
            expect_corrupt(open(dir.path(), small()), "one flipped bit");
            assert_eq!(
                fs::read(only_segment(dir.path())).unwrap(),
                before,
                "flip {flip:?}, batches {batches:?}"
            );
        }
    }
}

/// A torn write whose lost sector held exactly one set bit of a value (a sparse bitmap, say):
/// in a pre-zeroed segment the sector reads as zeros, so the record fails its checksum by that
/// one bit. It is cut as the torn write it is (nothing in it was acknowledged), not refused as
/// damaged data, whether the rest of its batch follows or not.
#[test]
fn a_torn_write_losing_a_sector_with_one_set_bit_is_cut() {
    const SALT: u32 = 0x0b17_5ec7;
    for batches in [&[1..=1, 2..=2, 3..=4][..], &[1..=1, 2..=2, 3..=3]] {
        let mut data = Vec::new();
        let mut lost = 0;
        for batch in batches {
            for seq in batch.clone() {
                let start = data.len();
                let value = if seq == 3 {
                    // 2 KiB of zeros but for one byte, in the middle: its 512-byte sector of
                    // the file is whole inside the value, wherever the record starts.
                    let mut v = vec![0u8; 2048];
                    v[1024] = 0x01;
                    lost = start + 16 + 1024;
                    v
                } else {
                    payload(seq)
                };
                crate::record::encode(&mut data, seq, seq - batch.start(), &value);
                crate::record::seal(&mut data[start..], SALT);
            }
        }
        data.resize(16384, 0);
        // The sector holding that byte never reached the disk.
        data[lost] = 0;
        let dir = tempfile::tempdir().unwrap();
        let name = SegmentName {
            first_seq: 1,
            salt: SALT,
        };
        fs::write(dir.path().join(name.file_name()), &data).unwrap();
        let (wal, seen, report) = open(dir.path(), small()).unwrap();
        let seqs: Vec<u64> = seen.iter().map(|(seq, _)| *seq).collect();
        assert_eq!(seqs, [1, 2], "batches {batches:?}");
        assert_eq!(report.torn_tails, 1);
        drop(wal);
    }
}
