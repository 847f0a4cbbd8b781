//! Segment files: naming, listing, and creating pre-zeroed segments.
//!
//! A segment is named after the sequence number of its first record and its salt
//! (`<20 digits>-<8 hex digits>.wal`; `<20 digits>.wal`, salt 0, for segments made before salts,
//! which are read as they are; an unsalted last segment is sealed at open). The name is built and parsed by [`SegmentName`]
//! and nowhere else. The salt is new each time a file becomes a segment (see [`crate::record`]).
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

/// A segment's file name: the seq of its first record and its salt (0: unsalted).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentName {
    pub first_seq: u64,
    /// XORed into every record's CRC in this segment (see [`crate::record`]).
    pub salt: u32,
}

impl SegmentName {
    /// A name for a file about to become the segment starting at `first_seq`, with a fresh salt.
    pub(crate) fn fresh(first_seq: u64) -> SegmentName {
        let salt = loop {
            let salt: u32 = rand::random();
            if salt != 0 {
                break salt;
            }
        };
        SegmentName { first_seq, salt }
    }

    /// The one place a segment's file name is built.
    pub fn file_name(&self) -> String {
        if self.salt == 0 {
            format!("{:020}.{SEGMENT_EXT}", self.first_seq)
        } else {
            format!("{:020}-{:08x}.{SEGMENT_EXT}", self.first_seq, self.salt)
        }
    }

    /// The inverse of [`SegmentName::file_name`]; `None` for any other file.
    pub fn parse(name: &str) -> Option<SegmentName> {
        let stem = name.strip_suffix(".wal")?;
        let (digits, salt) = match stem.split_once('-') {
            Some((digits, hex)) => {
                if hex.len() != 8 || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
                    return None;
                }
                let salt = u32::from_str_radix(hex, 16).ok().filter(|s| *s != 0)?;
                (digits, salt)
            }
            None => (stem, 0),
        };
        if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        Some(SegmentName {
            first_seq: digits.parse().ok()?,
            salt,
        })
    }
}

/// The segment of the shard in `dir` whose first record is `first_seq`, if there is one.
pub fn find_segment(dir: &Path, first_seq: u64) -> io::Result<Option<PathBuf>> {
    first_segment_where(dir, |name, _| Ok(name.first_seq == first_seq))
}

/// The first segment file of `dir` (in directory order) for which `pick` holds; none for a
/// directory that does not exist.
fn first_segment_where(
    dir: &Path,
    mut pick: impl FnMut(SegmentName, &fs::DirEntry) -> io::Result<bool>,
) -> io::Result<Option<PathBuf>> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name();
        if let Some(segment) = name.to_str().and_then(SegmentName::parse)
            && pick(segment, &entry)?
        {
            return Ok(Some(entry.path()));
        }
    }
    Ok(None)
}

/// Replace every segment (and pre-zeroed spare) of a closed shard's directory by one empty
/// segment named after `next_seq` (one already there, emptied, or a new salted one: it holds no
/// record, stays the last segment through the next open, and the first append replaces it),
/// then sync the directory. Only for
/// a log the state store's checkpoint covers entirely (`next_seq` = checkpoint seq + 1): the next open reads nothing,
/// instead of reading the last segment through to skip records it no longer needs. The empty
/// segment keeps the log's position on disk, so a state store older than the checkpoint (a
/// restored copy) is still refused at open (`records ... are missing`) rather than silently
/// continuing the log from its own, older seq. A crash part way leaves covered segments, which
/// recovery skips.
/// A failed fsync (of the marker or of the directory) is [`WalError::is_failed_sync`]: the
/// caller must not reopen the log in this process (see `shard.rs`, `delete_through`).
pub fn remove_covered_log(dir: &Path, next_seq: u64) -> Result<usize, crate::WalError> {
    use crate::WalError as E;
    let sync_dir = || sync_dir_after_removal(dir, "syncing wal directory");
    // A segment named after `next_seq` holds no record (the checkpoint covers the log): it is
    // emptied and kept as the marker, so no two segments ever start at the same seq.
    let listing = E::io("listing wal directory");
    let marker = match find_segment(dir, next_seq).map_err(listing)? {
        Some(existing) => {
            let file = OpenOptions::new()
                .write(true)
                .open(&existing)
                .map_err(E::io("opening the log's marker segment"))?;
            file.set_len(0)
                .map_err(E::io("emptying the log's marker segment"))?;
            file.sync_all()
                .map_err(E::io("syncing the log's marker segment"))?;
            existing
        }
        None => {
            // Salted, like every segment this build names: an open then keeps it as it is
            // (an unsalted segment with room would be sealed, which takes a new file).
            let fresh = dir.join(SegmentName::fresh(next_seq).file_name());
            File::create(&fresh)
                .map_err(E::io("creating the log's marker segment"))?
                .sync_all()
                .map_err(E::io("syncing the log's marker segment"))?;
            fresh
        }
    };
    let marker_name = marker
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    sync_dir()?;
    let spare_suffix = format!(".{SPARE_EXT}");
    let mut removed = 0;
    for entry in std::fs::read_dir(dir).map_err(E::io("listing wal directory"))? {
        let entry = entry.map_err(E::io("listing wal directory"))?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        // Every segment but the marker (also a second one named after `next_seq`).
        let ours = (SegmentName::parse(&name).is_some() && name != marker_name)
            || name == RECYCLED_NAME
            || name
                .strip_suffix(&spare_suffix)
                .is_some_and(|d| d.len() == 20);
        if ours {
            match std::fs::remove_file(entry.path()) {
                Ok(()) => removed += 1,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(E::io("deleting segment")(e)),
            }
        }
    }
    if removed > 0 {
        sync_dir()?;
    }
    Ok(removed)
}

/// Whether the shard in `dir` may hold records an open would replay: some segment file is not
/// empty. A shard closed cleanly (see [`remove_covered_log`]) or never opened has none; one that
/// was open when its process died has its preallocated active segment at least. Conservative:
/// a non-empty segment whose records a checkpoint already covers also counts.
pub fn log_may_need_replay(dir: &Path) -> io::Result<bool> {
    Ok(first_segment_where(dir, |_, entry| Ok(entry.metadata()?.len() > 0))?.is_some())
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
pub(crate) fn list_segments(dir: &Path) -> io::Result<Vec<(SegmentName, PathBuf)>> {
    let mut segments = Vec::new();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if let Some(parsed) = SegmentName::parse(name) {
            segments.push((parsed, entry.path()));
        } else if name.ends_with(SPARE_EXT) {
            fs::remove_file(entry.path())?;
        }
    }
    segments.sort_unstable_by_key(|(name, _)| name.first_seq);
    Ok(segments)
}

/// How [`create_zeroed`] failed: filling the file (a full disk, say: the caller may go on
/// without it) or fsyncing it, which, like any failed fsync of a segment, stops its shard for
/// good.
#[derive(Debug)]
pub(crate) enum ZeroedError {
    Filling(io::Error),
    Syncing(io::Error),
}

impl ZeroedError {
    /// As the shard reports it: a failed fsync is one ([`crate::WalError::is_failed_sync`]).
    pub(crate) fn into_wal(self) -> crate::WalError {
        match self {
            ZeroedError::Filling(e) => crate::WalError::io("creating segment")(e),
            ZeroedError::Syncing(e) => crate::WalError::io("syncing a new segment")(e),
        }
    }
}

/// Create `path` with `size` zero bytes written (not a sparse hole) and fsynced.
pub(crate) fn create_zeroed(path: &Path, size: u64) -> Result<File, ZeroedError> {
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(ZeroedError::Filling)?;
    let zeros = vec![0u8; ZERO_CHUNK];
    let filled = (|| {
        let mut left = size;
        while left > 0 {
            let n = left.min(ZERO_CHUNK as u64) as usize;
            file.write_all(&zeros[..n]).map_err(ZeroedError::Filling)?;
            left -= n as u64;
        }
        let dir = path.parent().unwrap_or(Path::new("."));
        if crate::failpoint::injected_new_segment_sync_failure(dir) {
            return Err(ZeroedError::Syncing(io::Error::other(
                "injected fsync failure of a new segment",
            )));
        }
        file.sync_all().map_err(ZeroedError::Syncing)
    })();
    if let Err(e) = filled {
        // A part-made segment (a full disk, say) must not stay behind as the log's newest
        // segment: too short for the next record, it would make the tenant's next open rotate,
        // and so need new space, before it could serve even a read.
        drop(file);
        let _ = fs::remove_file(path);
        return Err(e);
    }
    Ok(file)
}

/// fsync the WAL directory `dir` after entries were removed from it. A failed open (no
/// descriptor left) is told from a failed fsync (`sync_op`, which
/// [`crate::WalError::is_failed_sync`] recognizes: the caller must then not trust the directory
/// again in this process). Tests make the fsync fail with
/// [`crate::failpoint::fail_next_dir_sync_after_delete`].
pub(crate) fn sync_dir_after_removal(
    dir: &Path,
    sync_op: &'static str,
) -> Result<(), crate::WalError> {
    use crate::WalError as E;
    let opened = File::open(dir).map_err(E::io("opening wal directory"))?;
    if crate::failpoint::injected_dir_sync_failure(dir) {
        return Err(E::io(sync_op)(io::Error::other(
            "injected directory fsync failure",
        )));
    }
    opened.sync_all().map_err(E::io(sync_op))
}

/// fsync a directory so a created, renamed or deleted entry survives power loss.
pub(crate) fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Replace the file at `path` with `contents`, durably and whole: a temporary file beside it
/// (`<name>.tmp`, mode 0600) is written and fsynced, renamed over `path`, and the directory
/// fsynced. A crash leaves the old file or the new one, never a truncated one. For small files
/// read whole at start (operator credentials, certificates, the replay floors).
pub fn replace_file_durably(path: &Path, contents: &[u8]) -> io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut tmp_name = path.file_name().unwrap_or_default().to_os_string();
    tmp_name.push(".tmp");
    let tmp = path.with_file_name(tmp_name);
    // A leftover from a crash goes first. The new file is created exclusively (`O_EXCL`, which
    // also refuses to follow a symlink there): in a directory others can write to (`cubed key
    // cert --out /tmp`, say), a file or link planted under the temporary name between the two
    // steps makes this fail rather than write a private key where the planter chose.
    let _ = fs::remove_file(&tmp);
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|e| io::Error::new(e.kind(), format!("creating {}: {e}", tmp.display())))?;
    file.write_all(contents)?;
    file.sync_all()?;
    drop(file);
    fs::rename(&tmp, path)?;
    sync_parent(path)
}

/// fsync the directory holding `path` (its entry list).
pub(crate) fn sync_parent(path: &Path) -> io::Result<()> {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => sync_dir(dir),
        _ => sync_dir(Path::new(".")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replace_file_durably_swaps_the_whole_file_privately() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("creds.json");
        fs::write(&path, b"an older and much longer content").unwrap();
        replace_file_durably(&path, b"new").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"new");
        let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "mode {mode:o}");
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("creds.json")]);
    }

    fn name(first_seq: u64, salt: u32) -> String {
        SegmentName { first_seq, salt }.file_name()
    }

    #[test]
    fn names_round_trip_and_sort_numerically() {
        assert_eq!(name(42, 0), "00000000000000000042.wal");
        assert_eq!(name(42, 0xab), "00000000000000000042-000000ab.wal");
        for (first_seq, salt) in [(u64::MAX, 0), (u64::MAX, u32::MAX), (1, 7)] {
            assert_eq!(
                SegmentName::parse(&name(first_seq, salt)),
                Some(SegmentName { first_seq, salt })
            );
        }
        for bad in [
            "42.wal",
            "0000000000000000004x.wal",
            "00000000000000000042-00000000.wal",
            "00000000000000000042-000000AB.wal",
            "00000000000000000042-0000ab.wal",
            "00000000000000000042-.wal",
            "00000000000000000042.spare",
        ] {
            assert_eq!(SegmentName::parse(bad), None, "{bad}");
        }
        assert!(name(9, 0) < name(10, 0));
        assert!(name(9, u32::MAX) < name(10, 1));
    }

    #[test]
    fn fresh_names_have_a_nonzero_salt_and_differ() {
        let a = SegmentName::fresh(5);
        let b = SegmentName::fresh(5);
        assert_eq!(a.first_seq, 5);
        assert!(a.salt != 0 && b.salt != 0);
        // Equal by chance once in 2^32.
        assert_ne!(a.salt, b.salt);
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
