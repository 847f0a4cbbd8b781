//! The catalog's write-ahead journal: how a catalog change becomes durable without a sled flush.
//!
//! A change (a key created, revoked or given other capabilities, a tenant created, a durability
//! policy set) is written here as one record and inserted into sled, whose own flushes are off;
//! it is acknowledged, and becomes visible to authentication, once an fdatasync of the journal
//! that started after its write has completed (group commit: concurrent changes share one).
//! Changes made from a tenant's log (sled only) are restated here by that tenant's checkpoint:
//! their records' current values, in records of at most [`LARGEST_RESTATEMENT`] bytes, each
//! synced before the next is written. When the journal passes [`RESET_AT`] bytes past its
//! snapshot, sled is flushed and its files fsynced, and the journal starts over with a
//! **snapshot**: every pair of the catalog, as records, then nothing. Opening the catalog replays
//! every whole record into sled, in order, makes sled durable the same way and starts over:
//! replaying a record twice is harmless, since each one carries the whole new value of what it
//! changes, and the last record for a key is the latest change.
//!
//! Why a snapshot rather than starting over empty: the journal alone then holds the whole
//! catalog, so it does not matter what becomes of sled's files after the flush the reset follows.
//! sled 0.34 counts a write as stable after a `sync_file_range` (no device cache flush, no file
//! metadata), and reuses a segment once the pages in it were written again elsewhere that way, so
//! a power cut after such a reuse could lose keys (or revocations) that were durable at the
//! reset. A catalog is small (a few hundred bytes a tenant and a key), so is its snapshot.
//!
//! Why not sled's flush per change: sled 0.34 ends a flush with `sync_file_range`, which neither
//! flushes the device's write cache nor writes the file's metadata, so a change it "flushed" could
//! be lost on power loss; and it cost more CPU (`cargo run --release -p cube-store --example
//! catalog_cost`: ~110 µs per change against ~50 µs; docs/benchmarks.md, "Catalog changes").
//!
//! NOTE: on-disk format. The file holds a header record, the snapshot's records, and is
//! zero-filled for [`PREALLOC`] bytes after them (an fdatasync of a write inside the file need
//! not update its size). A record is
//! `[u32 LE payload length][u32 LE CRC32C of the payload][payload]`, the payload one or more ops
//! `[u8 tree][u32 LE key length][key][u32 LE value length][value]`; the header's payload is
//! [`HEADER_TAG`] and the u64 LE offset where the snapshot's records end. A zero length, a bad
//! CRC or a short read ends the journal: past the snapshot, the first record that is not whole,
//! and everything after it, was never acknowledged, and is zeroed when the journal is opened;
//! in the header or the snapshot (written and fsynced before the file took its name) it is
//! damage, and the journal is refused. Journals of builds before 2026-12-05 have no header:
//! their snapshot's extent is unknown, and they get one at their first open that starts over.

use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Bytes the journal file is zero-filled to past its snapshot when it starts over.
pub(crate) const PREALLOC: u64 = 1 << 20;
/// Journal bytes past its snapshot after which sled is flushed and the journal starts over.
pub(crate) const RESET_AT: u64 = PREALLOC - (64 << 10);
/// Most payload bytes of one snapshot record (a snapshot takes as many records as it needs).
const SNAPSHOT_RECORD: usize = 1 << 20;
/// More than one change's record can hold (a tenant and its key, a key, a policy: hundreds of
/// bytes), or a checkpoint's restatement ([`LARGEST_RESTATEMENT`]): what a torn last write can
/// leave after the last whole record.
const LARGEST_TORN: usize = 64 << 10;
/// Most payload bytes a checkpoint restates in one record; more go in several, each synced
/// before the next is written (a torn write of a larger record could leave more than
/// [`LARGEST_TORN`] behind, and the catalog would not open).
pub(crate) const LARGEST_RESTATEMENT: usize = LARGEST_TORN / 2;

/// The payload bytes a record of `ops` takes.
pub(crate) fn payload_bytes(ops: &[Op]) -> usize {
    ops.iter().map(|o| 9 + o.key.len() + o.value.len()).sum()
}
/// Longest record accepted when reading (a corrupt length must not allocate gigabytes).
const MAX_RECORD: u32 = 16 << 20;
/// How a header record's payload starts (no op starts with 0xff), then the u64 LE end of the
/// snapshot's records (0: no snapshot was taken, in a journal created empty).
const HEADER_TAG: &[u8] = b"\xffcube catalog journal v2; snapshot ends at:";

/// Which sled tree an op writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Tree {
    Tenants = 0,
    Keys = 1,
}

/// One insert: `key` in `tree` gets `value`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Op {
    pub tree: Tree,
    pub key: Vec<u8>,
    pub value: Vec<u8>,
}

/// An open journal. Not synchronized: the catalog holds it under its change lock, and syncs
/// [`Journal::file`] under a lock of its own (group commit: one fdatasync covers every record
/// written before it started).
#[derive(Debug)]
pub(crate) struct Journal {
    path: PathBuf,
    file: Arc<File>,
    len: u64,
    /// Bytes of the snapshot the journal started over with (0 for one opened as found: where
    /// its snapshot ends is not known then).
    snapshot: u64,
    /// Whether its records hold the whole catalog: it started over with a snapshot, here or
    /// before it was opened (a header says so). Not a journal created at the open, nor one
    /// from before headers.
    whole_catalog: bool,
    /// How far writes may have put bytes (a failed write can leave part of a record after
    /// `len`): the next record is written with zeros up to here, for the reason given in
    /// [`Journal::open`].
    dirty_to: u64,
}

impl Journal {
    /// Open the journal at `path` (creating it if missing) and return it with the ops of every
    /// whole record in it, in order. Appends go after the last whole record.
    pub(crate) fn open(path: &Path) -> io::Result<(Journal, Vec<Op>)> {
        let mut bytes = Vec::new();
        match File::open(path) {
            Ok(mut f) => {
                f.read_to_end(&mut bytes)?;
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let (ops, len, snapshot_end) = decode_all(&bytes);
        let damaged = |what: String| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{} is damaged: {what}; restore the catalog (the journal and the catalog \
                     directory) from a backup",
                    path.display()
                ),
            )
        };
        // The header and the snapshot were fsynced before the file took its name: no crash
        // tears them.
        if let Some(end) = snapshot_end
            && len < end
        {
            return Err(damaged(format!(
                "the record at offset {len}, inside its snapshot (which ends at {end}), does \
                 not check"
            )));
        }
        // A first record that does not check is a damaged header, unless it is shaped like an
        // older journal's first change, torn (journals before the header started empty): then
        // it is taken as torn below.
        if len == 0 && bytes.iter().any(|b| *b != 0) && !torn_first_change(&bytes) {
            return Err(damaged(
                "its first record (its header) does not check".to_owned(),
            ));
        }
        let fresh = bytes.iter().all(|b| *b == 0);
        let started_over = if fresh {
            match prepare_fresh(path, &header(0)) {
                Ok((tmp, file)) => {
                    std::fs::rename(&tmp, path)?;
                    sync_parent(path)?;
                    Some(file)
                }
                // An empty journal of an older build on a full disk: used as it is, without a
                // header (until a reset gives it one), rather than fail the catalog's open.
                // Only before the rename: after it, the name is the new file's.
                Err(e) if !bytes.is_empty() => {
                    tracing::warn!(journal = %path.display(), error = %e, "catalog journal: could not start an empty journal over with a header; using it as it is");
                    None
                }
                Err(e) => return Err(e),
            }
        } else {
            None
        };
        let (file, len) = match started_over {
            Some(file) => (file, header(0).len() as u64),
            None => (File::options().write(true).open(path)?, len),
        };
        // What follows the last whole record (a torn one, never acknowledged) is zeroed before
        // anything is appended there: a shorter record written over it would otherwise leave
        // the torn one's tail behind it, and a whole record inside that tail would be read as
        // a change nobody made at the next open. So if it cannot be done, the open fails.
        // A torn write leaves at most one record's bytes there. More is damage to records that
        // were written whole (and acknowledged, or part of the snapshot, fsynced before the
        // journal took its name): refused, not zeroed, which would drop them without a word.
        if let Some(dirty_end) = bytes.iter().rposition(|b| *b != 0).map(|p| p + 1)
            && dirty_end as u64 > len
        {
            let tail = dirty_end - len as usize;
            if tail > LARGEST_TORN {
                return Err(damaged(format!(
                    "the record at offset {len} does not check, and {tail} bytes follow it, \
                     more than one torn write leaves"
                )));
            }
            tracing::warn!(journal = %path.display(), offset = len, bytes = tail, "catalog journal: a torn last record (never acknowledged) zeroed");
            file.write_all_at(&vec![0u8; tail], len)?;
            file.sync_data()?;
        }
        Ok((
            Journal {
                path: path.to_path_buf(),
                file: Arc::new(file),
                len,
                // Only what this process appends counts towards the next start-over: a journal
                // that could not start over at the open is not started over at every change.
                snapshot: len,
                whole_catalog: !fresh && snapshot_end.is_some_and(|end| end > 0),
                dirty_to: len,
            },
            ops,
        ))
    }

    /// Whether its records hold the whole catalog (see the field): when not, the catalog
    /// starts it over with a snapshot of sled at its open.
    pub(crate) fn whole_catalog(&self) -> bool {
        self.whole_catalog
    }

    /// Bytes of whole records.
    #[cfg(test)]
    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    /// Bytes of the records written since it started over with its snapshot.
    pub(crate) fn since_snapshot(&self) -> u64 {
        self.len - self.snapshot
    }

    /// The file, for syncing what was written (`sync_data` covers every completed write).
    pub(crate) fn file(&self) -> Arc<File> {
        Arc::clone(&self.file)
    }

    /// Write `ops` as one record after the last one, without syncing it; returns the bytes
    /// written. After an error (the disk full, say) nothing was added, and the next record is
    /// written at the same offset.
    pub(crate) fn write(&mut self, ops: &[Op]) -> io::Result<u64> {
        let mut record = encode_record(ops);
        let written = record.len() as u64;
        let end = self.len + written;
        if self.dirty_to > end {
            record.resize((self.dirty_to - self.len) as usize, 0);
        }
        self.dirty_to = self.dirty_to.max(self.len + record.len() as u64);
        self.file.write_all_at(&record, self.len)?;
        self.len = end;
        self.dirty_to = end;
        Ok(written)
    }

    /// [`Journal::write`], then fdatasync (the catalog syncs under a lock of its own instead).
    #[cfg(test)]
    fn append(&mut self, ops: &[Op]) -> io::Result<()> {
        self.write(ops)?;
        self.file.sync_data()
    }

    /// Start over with `snapshot` (every pair of the catalog, as ops) as its first records: the
    /// journal alone then holds the whole catalog, whatever becomes of sled's files (see the
    /// module doc). A fresh file, the snapshot written and fsynced, replaces the journal by
    /// rename, so a crash leaves either the old journal whole or the new one with its snapshot.
    pub(crate) fn reset(&mut self, snapshot: &[Op]) -> Result<(), ResetError> {
        let head = encode_snapshot(snapshot);
        let (tmp, file) = prepare_fresh(&self.path, &head).map_err(ResetError::NotStarted)?;
        if let Err(e) = std::fs::rename(&tmp, &self.path) {
            let _ = std::fs::remove_file(&tmp);
            return Err(ResetError::NotStarted(e));
        }
        self.file = Arc::new(file);
        self.len = head.len() as u64;
        self.snapshot = self.len;
        self.whole_catalog = true;
        self.dirty_to = self.len;
        sync_parent(&self.path).map_err(ResetError::Unsynced)
    }
}

/// Why a reset failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ResetError {
    /// The old journal is still in place and in use; a later reset may succeed.
    #[error("preparing a fresh journal: {0}")]
    NotStarted(io::Error),
    /// The fresh journal replaced the old one and is in use, but the rename may not survive a
    /// crash (the directory's fsync failed): appends to it cannot be promised durable.
    #[error("syncing the directory after the rename: {0}")]
    Unsynced(io::Error),
}

/// Write a journal next to `path` holding `head` and zero-filled for [`PREALLOC`] bytes after
/// it, and fsync it; return its path and the file.
fn prepare_fresh(path: &Path, head: &[u8]) -> io::Result<(PathBuf, File)> {
    let tmp = path.with_extension("journal-new");
    let file = File::options()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(&tmp)?;
    let mut bytes = head.to_vec();
    bytes.resize(head.len() + PREALLOC as usize, 0);
    if let Err(e) = file.write_all_at(&bytes, 0).and_then(|()| file.sync_all()) {
        // Not left to take the space a full disk lacks.
        drop(file);
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    Ok((tmp, file))
}

fn sync_parent(path: &Path) -> io::Result<()> {
    match path.parent() {
        Some(dir) => File::open(dir)?.sync_all(),
        None => Ok(()),
    }
}

/// Whether `bytes` (whose first record does not check) begin like an older journal's first
/// change torn by a crash: a plausible length, an op's tree tag where a header has 0xff, and
/// nothing past the length it claims. A header damaged in any other way (a zeroed first
/// sector, a flipped tag) is not.
fn torn_first_change(bytes: &[u8]) -> bool {
    let Some(claimed) = bytes
        .get(..4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    else {
        return false;
    };
    let last = bytes.iter().rposition(|b| *b != 0).unwrap_or(0);
    claimed != 0
        && claimed <= MAX_RECORD
        && matches!(bytes.get(8), Some(0 | 1))
        && last < 8 + claimed as usize
}

/// The header record of a journal whose snapshot's records end at `snapshot_end`.
fn header(snapshot_end: u64) -> Vec<u8> {
    let mut payload = HEADER_TAG.to_vec();
    payload.extend_from_slice(&snapshot_end.to_le_bytes());
    frame(&payload)
}

/// The header, then `ops` as records of at most about [`SNAPSHOT_RECORD`] payload bytes each,
/// one after another.
fn encode_snapshot(ops: &[Op]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut from = 0;
    let mut size = 0;
    for (i, op) in ops.iter().enumerate() {
        size += 9 + op.key.len() + op.value.len();
        if size >= SNAPSHOT_RECORD {
            out.extend(encode_record(&ops[from..=i]));
            (from, size) = (i + 1, 0);
        }
    }
    if from < ops.len() {
        out.extend(encode_record(&ops[from..]));
    }
    let mut head = header(0);
    let end = (head.len() + out.len()) as u64;
    head = header(end);
    head.extend(out);
    head
}

fn encode_record(ops: &[Op]) -> Vec<u8> {
    let mut payload = Vec::new();
    for op in ops {
        payload.push(op.tree as u8);
        payload.extend_from_slice(&(op.key.len() as u32).to_le_bytes());
        payload.extend_from_slice(&op.key);
        payload.extend_from_slice(&(op.value.len() as u32).to_le_bytes());
        payload.extend_from_slice(&op.value);
    }
    frame(&payload)
}

/// `payload` as a record: its length and CRC32C, then itself.
fn frame(payload: &[u8]) -> Vec<u8> {
    let mut record = Vec::with_capacity(8 + payload.len());
    record.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    record.extend_from_slice(&crc32c::crc32c(payload).to_le_bytes());
    record.extend_from_slice(payload);
    record
}

/// The ops of every whole record from the start of `bytes`, the bytes they take, and where
/// the snapshot's records end if the first record is a header.
fn decode_all(bytes: &[u8]) -> (Vec<Op>, u64, Option<u64>) {
    let mut ops = Vec::new();
    let mut snapshot_end = None;
    let mut at = 0usize;
    while let Some(header) = bytes.get(at..at + 8) {
        let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]);
        let crc = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
        if len == 0 || len > MAX_RECORD {
            break;
        }
        let Some(payload) = bytes.get(at + 8..at + 8 + len as usize) else {
            break;
        };
        if crc32c::crc32c(payload) != crc {
            break;
        }
        if at == 0
            && let Some(end) = payload.strip_prefix(HEADER_TAG)
            && let Ok(end) = <[u8; 8]>::try_from(end)
        {
            snapshot_end = Some(u64::from_le_bytes(end));
            at += 8 + len as usize;
            continue;
        }
        let Some(decoded) = decode_payload(payload) else {
            break;
        };
        ops.extend(decoded);
        at += 8 + len as usize;
    }
    (ops, at as u64, snapshot_end)
}

fn decode_payload(mut p: &[u8]) -> Option<Vec<Op>> {
    fn take<'a>(p: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
        let (head, tail) = (p.get(..n)?, p.get(n..)?);
        *p = tail;
        Some(head)
    }
    fn take_u32(p: &mut &[u8]) -> Option<usize> {
        let b = take(p, 4)?;
        Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
    }
    let mut ops = Vec::new();
    while !p.is_empty() {
        let tree = match take(&mut p, 1)?[0] {
            0 => Tree::Tenants,
            1 => Tree::Keys,
            _ => return None,
        };
        let n = take_u32(&mut p)?;
        let key = take(&mut p, n)?.to_vec();
        let n = take_u32(&mut p)?;
        let value = take(&mut p, n)?.to_vec();
        ops.push(Op { tree, key, value });
    }
    Some(ops)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(tree: Tree, key: &str, value: &str) -> Op {
        Op {
            tree,
            key: key.as_bytes().to_vec(),
            value: value.as_bytes().to_vec(),
        }
    }

    #[test]
    fn records_come_back_in_order_after_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("catalog.journal");
        let (mut j, ops) = Journal::open(&path).unwrap();
        assert!(ops.is_empty());
        assert_eq!(
            std::fs::metadata(&path).unwrap().len(),
            header(0).len() as u64 + PREALLOC
        );
        let a = [
            op(Tree::Tenants, "acme", "{}"),
            op(Tree::Keys, "acme/k-1", "v1"),
        ];
        let b = [op(Tree::Keys, "acme/k-1", "v2")];
        j.append(&a).unwrap();
        j.append(&b).unwrap();
        let written = j.len();
        drop(j);
        let (mut j, ops) = Journal::open(&path).unwrap();
        assert_eq!(ops, [&a[..], &b[..]].concat());
        assert_eq!(j.len(), written);
        // Appends continue after the last whole record.
        let c = [op(Tree::Keys, "acme/k-2", "v3")];
        j.append(&c).unwrap();
        drop(j);
        let (_, ops) = Journal::open(&path).unwrap();
        assert_eq!(ops, [&a[..], &b[..], &c[..]].concat());
    }

    #[test]
    fn a_torn_or_corrupt_record_ends_the_journal() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("catalog.journal");
        let (mut j, _) = Journal::open(&path).unwrap();
        let first = [op(Tree::Keys, "t/k", "first")];
        j.append(&first).unwrap();
        let end_of_first = j.len();
        j.append(&[op(Tree::Keys, "t/k", "second")]).unwrap();
        j.append(&[op(Tree::Keys, "t/k", "third")]).unwrap();
        drop(j);
        let whole = std::fs::read(&path).unwrap();

        // Torn: the second record's last byte never reached the disk (zero, as preallocated).
        let mut torn = whole.clone();
        let second_len = encode_record(&[op(Tree::Keys, "t/k", "second")]).len();
        torn[end_of_first as usize + second_len - 1] = 0;
        std::fs::write(&path, &torn).unwrap();
        let (j, ops) = Journal::open(&path).unwrap();
        assert_eq!(ops, first);
        assert_eq!(j.len(), end_of_first);

        // Corrupt length: far past the end of the file.
        let mut bad = whole.clone();
        bad[end_of_first as usize..end_of_first as usize + 4]
            .copy_from_slice(&u32::MAX.to_le_bytes());
        std::fs::write(&path, &bad).unwrap();
        assert_eq!(Journal::open(&path).unwrap().1, first);

        // An unknown tree tag under a valid CRC is not replayed either.
        let mut payload = vec![9u8];
        payload.extend_from_slice(&1u32.to_le_bytes());
        payload.push(b'k');
        payload.extend_from_slice(&1u32.to_le_bytes());
        payload.push(b'v');
        let mut bad = whole[..end_of_first as usize].to_vec();
        bad.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        bad.extend_from_slice(&crc32c::crc32c(&payload).to_le_bytes());
        bad.extend_from_slice(&payload);
        std::fs::write(&path, &bad).unwrap();
        assert_eq!(Journal::open(&path).unwrap().1, first);
    }

    /// A torn record (its CRC does not match) whose bytes hold a whole record, placed where
    /// `next`, written at the same offset, will stop.
    fn torn_hiding_a_record(next: &[Op]) -> Vec<u8> {
        let next_len = encode_record(next).len();
        let phantom = encode_record(&[op(Tree::Keys, "t/admin", "granted")]);
        let mut torn = vec![0u8; next_len + phantom.len()];
        let torn_payload = (torn.len() - 8) as u32;
        torn[..4].copy_from_slice(&torn_payload.to_le_bytes());
        torn[4..8].copy_from_slice(&0xbad0_c0deu32.to_le_bytes());
        torn[next_len..].copy_from_slice(&phantom);
        torn
    }

    #[test]
    fn what_a_failed_write_left_is_overwritten_by_the_next_record() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("catalog.journal");
        let (mut j, _) = Journal::open(&path).unwrap();
        let first = [op(Tree::Keys, "t/k", "first")];
        j.append(&first).unwrap();
        // What a write that failed part way may leave after the end, as far as it reached.
        let next = [op(Tree::Keys, "t/k", "next")];
        let torn = torn_hiding_a_record(&next);
        j.file.write_all_at(&torn, j.len()).unwrap();
        j.dirty_to = j.len() + torn.len() as u64;
        j.append(&next).unwrap();
        drop(j);
        let (_, ops) = Journal::open(&path).unwrap();
        assert_eq!(ops, [first[0].clone(), next[0].clone()]);
    }

    #[test]
    fn a_torn_record_is_zeroed_so_a_record_inside_it_never_comes_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("catalog.journal");
        let (mut j, _) = Journal::open(&path).unwrap();
        let first = [op(Tree::Keys, "t/k", "first")];
        j.append(&first).unwrap();
        let end_of_first = j.len() as usize;
        drop(j);
        let next = [op(Tree::Keys, "t/k", "next")];
        let torn = torn_hiding_a_record(&next);
        let file = File::options().write(true).open(&path).unwrap();
        file.write_all_at(&torn, end_of_first as u64).unwrap();
        drop(file);

        let (mut j, ops) = Journal::open(&path).unwrap();
        assert_eq!(ops, first);
        j.append(&next).unwrap();
        drop(j);
        let (_, ops) = Journal::open(&path).unwrap();
        assert_eq!(ops, [first[0].clone(), next[0].clone()]);
    }

    /// Damage to records written whole (more non-zero bytes after the first bad record than a
    /// torn write leaves) refuses the journal instead of zeroing them; a torn last record is
    /// still zeroed and the journal opens.
    #[test]
    fn damage_before_later_records_is_refused_not_zeroed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("catalog.journal");
        let (mut j, _) = Journal::open(&path).unwrap();
        let snapshot: Vec<Op> = (0..400)
            .map(|i| op(Tree::Keys, &format!("t/k{i}"), &"v".repeat(400)))
            .collect();
        j.reset(&snapshot).unwrap();
        j.append(&[op(Tree::Keys, "t/k", "later")]).unwrap();
        drop(j);
        let mut bytes = std::fs::read(&path).unwrap();
        let whole = bytes.clone();
        bytes[100] ^= 0x40;
        std::fs::write(&path, &bytes).unwrap();
        let e = Journal::open(&path).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(e.to_string().contains("is damaged"), "{e}");
        assert_eq!(std::fs::read(&path).unwrap(), bytes, "left as it was");
        // A torn last record: the journal opens without it.
        let end = whole.iter().rposition(|b| *b != 0).unwrap();
        let mut torn = whole;
        torn[end] ^= 0x01;
        std::fs::write(&path, &torn).unwrap();
        let (_, ops) = Journal::open(&path).unwrap();
        assert_eq!(ops, snapshot);
    }

    /// A reset starts the journal over with the snapshot it is given (the whole catalog) and
    /// nothing else; records written after it follow the snapshot. A snapshot bigger than one
    /// record's worth takes several.
    #[test]
    fn reset_starts_over_with_its_snapshot() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("catalog.journal");
        let (mut j, _) = Journal::open(&path).unwrap();
        j.append(&[op(Tree::Keys, "t/k", "old")]).unwrap();
        let big = "v".repeat(300 << 10);
        let snapshot: Vec<Op> = (0..8)
            .map(|i| op(Tree::Tenants, &format!("t{i}"), &big))
            .chain([op(Tree::Keys, "t/k", "newest")])
            .collect();
        j.reset(&snapshot).unwrap();
        assert_eq!(j.since_snapshot(), 0);
        assert!(j.len() > (8 * 300) << 10);
        let new = [op(Tree::Keys, "t/k2", "new")];
        j.append(&new).unwrap();
        drop(j);
        let (j, ops) = Journal::open(&path).unwrap();
        assert_eq!(ops, [snapshot, new.to_vec()].concat());
        assert!(!path.with_extension("journal-new").exists());
        drop(j);
        // An empty snapshot (an empty catalog) is a journal of its header alone.
        let (mut j, _) = Journal::open(&path).unwrap();
        j.reset(&[]).unwrap();
        assert_eq!(j.len(), header(0).len() as u64);
        drop(j);
        assert!(Journal::open(&path).unwrap().1.is_empty());
    }

    /// The header and the snapshot were fsynced before the journal took its name, so a record
    /// there that does not check is damage, refused however small the catalog: it used to be
    /// taken for a torn last write (less than 64 KiB followed it) and zeroed, and the catalog
    /// fell back to sled's older files without a word. A torn record after the snapshot is
    /// still zeroed.
    #[test]
    fn damage_in_the_header_or_a_small_snapshot_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("catalog.journal");
        let (mut j, _) = Journal::open(&path).unwrap();
        let snapshot = [op(Tree::Tenants, "t", "{}"), op(Tree::Keys, "t/k", "v")];
        j.reset(&snapshot).unwrap();
        let later = [op(Tree::Keys, "t/k", "revoked")];
        j.append(&later).unwrap();
        drop(j);
        let whole = std::fs::read(&path).unwrap();
        let in_header = 12;
        let in_snapshot = header(0).len() + 12;
        for at in [in_header, in_snapshot, usize::MAX] {
            let mut bytes = whole.clone();
            if at == usize::MAX {
                // A zeroed first sector's worth: nothing there says "header" any more.
                bytes[..9].fill(0);
            } else {
                bytes[at] ^= 0x40;
            }
            std::fs::write(&path, &bytes).unwrap();
            let e = Journal::open(&path).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidData, "byte {at}");
            assert!(e.to_string().contains("is damaged"), "{e}");
            assert_eq!(std::fs::read(&path).unwrap(), bytes, "left as it was");
        }
        let mut torn = whole.clone();
        let end = whole.iter().rposition(|b| *b != 0).unwrap();
        torn[end] ^= 0x01;
        std::fs::write(&path, &torn).unwrap();
        let (j, ops) = Journal::open(&path).unwrap();
        assert_eq!(ops, snapshot);
        assert!(j.whole_catalog());
    }

    /// A journal of a build before the header started empty, so its first record was a change
    /// that a crash could tear: such a first record is zeroed as torn, not refused as a
    /// damaged header.
    #[test]
    fn an_older_journals_torn_first_change_is_zeroed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("catalog.journal");
        // The second is as long as a header's payload (51 bytes), and still a change.
        for value in ["first".to_owned(), "v".repeat(39)] {
            let mut bytes = encode_record(&[op(Tree::Keys, "t/k", &value)]);
            let n = bytes.len();
            bytes[n - 3..].fill(0);
            bytes.resize(PREALLOC as usize, 0);
            std::fs::write(&path, &bytes).unwrap();
            let (j, ops) = Journal::open(&path).unwrap();
            assert!(ops.is_empty());
            assert!(!j.whole_catalog());
            assert!(std::fs::read(&path).unwrap().iter().all(|b| *b == 0));
        }
    }

    /// A journal created at the open holds nothing of a catalog that sled may hold already;
    /// one started over with a snapshot holds it all, also after a reopen.
    #[test]
    fn only_a_journal_with_a_snapshot_holds_the_whole_catalog() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("catalog.journal");
        let (mut j, _) = Journal::open(&path).unwrap();
        assert!(!j.whole_catalog());
        j.append(&[op(Tree::Keys, "t/k", "v")]).unwrap();
        drop(j);
        let (mut j, _) = Journal::open(&path).unwrap();
        assert!(!j.whole_catalog(), "nor after a reopen");
        j.reset(&[op(Tree::Keys, "t/k", "v")]).unwrap();
        assert!(j.whole_catalog());
        drop(j);
        assert!(Journal::open(&path).unwrap().0.whole_catalog());
    }
}
