//! Segment files: naming, listing, and creating pre-zeroed segments.
//!
//! A segment is named after the sequence number of its first record (`<20 digits>.wal`); the name
//! is built in [`segment_file_name`] and parsed in [`parse_segment_file_name`] and nowhere else.
//! Segments are created full-size and zero-filled, then fsynced, before any record goes in: on
//! this class of disk an fdatasync after appending to a growing file costs about twice as much as
//! one after overwriting allocated blocks, because the file size (metadata) changes every time.
//! Zero-filling writes every segment's bytes twice, so a segment a checkpoint no longer needs is
//! kept for reuse instead ([`RECYCLED_NAME`]): its old records carry sequence numbers below the
//! new segment's first, which recovery can never take for new ones, and every write is followed
//! by a zero header ([`crate::record`]), so the end of data stays recognisable.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

const SEGMENT_EXT: &str = "wal";
const SPARE_EXT: &str = "spare";
const ZERO_CHUNK: usize = 1 << 20;
/// A segment covered by a checkpoint, kept (allocated, fsynced) to become the next segment
/// instead of zero-filling a new one. At most one per shard; deleted at open like any spare.
pub(crate) const RECYCLED_NAME: &str = "recycled.spare";

/// The one place a segment's file name is built.
pub fn segment_file_name(first_seq: u64) -> String {
    format!("{first_seq:020}.{SEGMENT_EXT}")
}

/// The inverse of [`segment_file_name`]; `None` for any other file.
pub(crate) fn parse_segment_file_name(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(".wal")?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Replace every segment (and pre-zeroed spare) of a closed shard's directory by one empty
/// segment named `next_seq`, then sync the directory. Only for a log the state store's
/// checkpoint covers entirely (`next_seq` = checkpoint seq + 1): the next open reads nothing,
/// instead of reading the last segment through to skip records it no longer needs. The empty
/// segment keeps the log's position on disk, so a state store older than the checkpoint (a
/// restored copy) is still refused at open (`records ... are missing`) rather than silently
/// continuing the log from its own, older seq. A crash part way leaves covered segments, which
/// recovery skips.
pub fn remove_covered_log(dir: &Path, next_seq: u64) -> io::Result<usize> {
    let marker = dir.join(segment_file_name(next_seq));
    std::fs::File::create(&marker)?.sync_all()?;
    sync_dir(dir)?;
    let spare_suffix = format!(".{SPARE_EXT}");
    let mut removed = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let ours = parse_segment_file_name(&name).is_some_and(|first| first != next_seq)
            || name == RECYCLED_NAME
            || name
                .strip_suffix(&spare_suffix)
                .is_some_and(|d| d.len() == 20);
        if ours {
            match std::fs::remove_file(entry.path()) {
                Ok(()) => removed += 1,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
    }
    if removed > 0 {
        sync_dir(dir)?;
    }
    Ok(removed)
}

/// Whether the shard in `dir` may hold records an open would replay: some segment file is not
/// empty. A shard closed cleanly (see [`remove_covered_log`]) or never opened has none; one that
/// was open when its process died has its preallocated active segment at least. Conservative:
/// a non-empty segment whose records a checkpoint already covers also counts.
pub fn log_may_need_replay(dir: &Path) -> io::Result<bool> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name();
        if name.to_str().and_then(parse_segment_file_name).is_some() && entry.metadata()?.len() > 0
        {
            return Ok(true);
        }
    }
    Ok(false)
}

pub(crate) fn spare_path(dir: &Path, first_seq_hint: u64) -> PathBuf {
    dir.join(format!("{first_seq_hint:020}.{SPARE_EXT}"))
}

/// How big segments are. A shard starts small (so 10,000 idle tenants do not reserve gigabytes)
/// and doubles each new segment up to `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentSizing {
    pub initial: u64,
    pub max: u64,
}

impl Default for SegmentSizing {
    fn default() -> Self {
        SegmentSizing {
            initial: 256 << 10,
            max: 64 << 20,
        }
    }
}

impl SegmentSizing {
    /// Size of the segment after one of `prev` bytes, big enough for a record of `need` bytes.
    pub(crate) fn next(&self, prev: Option<u64>, need: u64) -> u64 {
        let base = match prev {
            None => self.initial,
            Some(p) => p.saturating_mul(2).min(self.max).max(self.initial),
        };
        // Round a too-big record up to whole MiB so odd sizes do not fragment the disk.
        if need > base {
            need.div_ceil(1 << 20) * (1 << 20)
        } else {
            base
        }
    }
}

/// Segment files of `dir` sorted by first sequence number. Leftover spares are deleted.
pub(crate) fn list_segments(dir: &Path) -> io::Result<Vec<(u64, PathBuf)>> {
    let mut segments = Vec::new();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if let Some(first) = parse_segment_file_name(name) {
            segments.push((first, entry.path()));
        } else if name.ends_with(SPARE_EXT) {
            fs::remove_file(entry.path())?;
        }
    }
    segments.sort_unstable_by_key(|(first, _)| *first);
    Ok(segments)
}

/// Create `path` with `size` zero bytes written (not a sparse hole) and fsynced.
pub(crate) fn create_zeroed(path: &Path, size: u64) -> io::Result<File> {
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(path)?;
    let zeros = vec![0u8; ZERO_CHUNK];
    let mut left = size;
    while left > 0 {
        let n = left.min(ZERO_CHUNK as u64) as usize;
        file.write_all(&zeros[..n])?;
        left -= n as u64;
    }
    file.sync_all()?;
    Ok(file)
}

/// fsync a directory so a created, renamed or deleted entry survives power loss.
pub(crate) fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_sort_numerically() {
        assert_eq!(segment_file_name(42), "00000000000000000042.wal");
        assert_eq!(
            parse_segment_file_name(&segment_file_name(u64::MAX)),
            Some(u64::MAX)
        );
        assert_eq!(parse_segment_file_name("42.wal"), None);
        assert_eq!(parse_segment_file_name("0000000000000000004x.wal"), None);
        assert!(segment_file_name(9) < segment_file_name(10));
    }

    #[test]
    fn sizing_doubles_up_to_max_and_fits_big_records() {
        let s = SegmentSizing {
            initial: 1024,
            max: 4096,
        };
        assert_eq!(s.next(None, 10), 1024);
        assert_eq!(s.next(Some(1024), 10), 2048);
        assert_eq!(s.next(Some(4096), 10), 4096);
        assert_eq!(s.next(Some(1024), 3 << 20), 3 << 20);
    }

    #[test]
    fn zeroed_file_is_allocated_and_zero() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x");
        create_zeroed(&p, 3 * ZERO_CHUNK as u64 + 5).unwrap();
        let data = fs::read(&p).unwrap();
        assert_eq!(data.len(), 3 * ZERO_CHUNK + 5);
        assert!(data.iter().all(|b| *b == 0));
    }
}
