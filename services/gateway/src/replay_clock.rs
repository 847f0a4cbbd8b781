//! The replay cache's clock mark: a bound, kept on disk, on the timestamps the server accepted.
//!
//! The replay cache is empty after a restart, so the new server refuses every timestamp at or
//! below a start watermark. Taking that watermark from the new server's own clock (its start
//! plus a second) is right only if the clock did not step backwards across the restart: after a
//! step back of *d*, calls the old server accepted in its last *d* would be accepted again. So
//! the server keeps a **mark** on disk, a timestamp at or above every one it accepts at most
//! [`AHEAD_MS`] ahead of its clock, and accepts such a call stamped above the mark only once a
//! higher mark is durable. (A call stamped further ahead has its key's floor written first, in
//! the floors file, and a floor is dropped from it only once both the clock and the durable mark
//! have passed it.) The next server starts its watermark at the mark at least, whatever its
//! clock says.
//!
//! The mark is renewed ahead of need: every [`RENEW_EVERY`] it becomes the clock plus
//! [`LEASE_MS`] (beyond the second the cache admits ahead of the clock), so a call waits for no
//! write; only a renewal stalled for most of a lease (a disk that takes that long to fdatasync
//! a few bytes) makes calls wait for it (the auth layer's `MARK_WAIT`), and one stalled longer
//! still refuses them, with `UNAVAILABLE`. A graceful stop lowers the mark to
//! the clock plus a second, or the highest timestamp accepted within a second of the clock, or
//! the highest floor dropped from the floors file, if either is higher (a call stamped further
//! ahead keeps its key's floor, which covers it: counted in the mark, it would refuse every
//! key's calls after the restart until the clock reached it), so only a crash costs the next
//! start up to [`LEASE_MS`] more before it is ready. A mark never goes down below one read at start: a server that crashes soon after
//! starting leaves a mark that still covers its predecessor.
//!
//! The file holds two 24-byte slots 4 KiB apart (in different sectors and pages), written in
//! turn, each a little-endian `u64` write number, the `i64` mark, a CRC-32C of both and 4 zero
//! bytes; the valid slot with the higher write number holds the mark (a lowered one included).
//! A torn write (a power cut) spoils at most the slot being written, and the other still holds
//! the previous mark. Renewals overwrite bytes already allocated, so they keep working on a
//! full disk.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;

use crate::replay::AHEAD_MS;

/// How far past the clock (beyond [`AHEAD_MS`]) a renewal sets the mark.
pub const LEASE_MS: i64 = 1_000;

/// How often the mark is renewed: a renewal may stall for a lease less this before calls wait
/// for it (and are refused if it stalls on).
pub const RENEW_EVERY: Duration = Duration::from_millis(200);

/// Slots are a page apart (a 4 KiB sector or page holds one of them).
const SLOT: u64 = 4096;
const RECORD: usize = 24;

/// See the module docs.
#[derive(Debug)]
pub(crate) struct ClockMark {
    path: PathBuf,
    file: Mutex<Writer>,
    /// The durable mark: ordinary calls stamped above it are refused.
    covered: AtomicI64,
    /// The highest timestamp accepted within [`AHEAD_MS`] of the clock, or floor dropped from
    /// the floors file (so a graceful stop's mark covers it even if the clock stepped back while
    /// serving).
    accepted: AtomicI64,
    /// The mark read at start: later marks never go below it.
    inherited: i64,
    /// Set by [`ClockMark::settle`]: renewals stop.
    settled: AtomicBool,
    /// Woken by every renewal that raised the mark: calls refused for want of one wait here.
    renewed: tokio::sync::Notify,
}

#[derive(Debug)]
struct Writer {
    file: File,
    /// The slot the next write goes to.
    next: u64,
    /// The write number of the last write.
    seq: u64,
    /// The highest mark written.
    written: i64,
}

fn encode(seq: u64, mark: i64) -> [u8; RECORD] {
    let mut record = [0u8; RECORD];
    record[..8].copy_from_slice(&seq.to_le_bytes());
    record[8..16].copy_from_slice(&mark.to_le_bytes());
    let crc = crc32c::crc32c(&record[..16]);
    record[16..20].copy_from_slice(&crc.to_le_bytes());
    record
}

/// (write number, mark) of a valid slot.
fn decode(record: &[u8]) -> Option<(u64, i64)> {
    let seq = u64::from_le_bytes(record.get(..8)?.try_into().ok()?);
    let mark = i64::from_le_bytes(record.get(8..16)?.try_into().ok()?);
    let crc = u32::from_le_bytes(record.get(16..20)?.try_into().ok()?);
    (crc == crc32c::crc32c(&record[..16])).then_some((seq, mark))
}

impl ClockMark {
    /// Open (or create) the mark file at `path` and read the previous servers' mark (`None`
    /// if there was no file). A file with no valid slot is an error: it is refused rather than
    /// served without the protection.
    pub(crate) fn open(path: PathBuf) -> io::Result<(ClockMark, Option<i64>)> {
        // Every error names the file.
        let naming = |what: &str| {
            let path = path.display().to_string();
            let what = what.to_string();
            move |e: io::Error| io::Error::new(e.kind(), format!("{what} {path}: {e}"))
        };
        if !path.exists() {
            // Made whole or not at all (a crash cannot leave a file with no valid slot), with
            // both slots allocated, holding a mark that covers nothing.
            let mut blank = vec![0u8; SLOT as usize + RECORD];
            blank[..RECORD].copy_from_slice(&encode(0, i64::MIN));
            blank[SLOT as usize..].copy_from_slice(&encode(0, i64::MIN));
            cube_wal::replace_file_durably(&path, &blank).map_err(naming("creating"))?;
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(naming("opening"))?;
        let mut inherited;
        let (next, seq);
        {
            let bytes = std::fs::read(&path).map_err(naming("reading"))?;
            let slots = [0, SLOT as usize].map(|at| bytes.get(at..at + RECORD).and_then(decode));
            let last = slots.iter().flatten().copied().max();
            inherited = last.map(|(_, mark)| mark);
            seq = last.map_or(0, |(seq, _)| seq);
            if inherited == Some(i64::MIN) {
                inherited = None;
            } else if inherited.is_none() {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "{} holds no valid clock mark; if the server clock is known not to have \
                         gone backwards since the last server stopped, delete it",
                        path.display()
                    ),
                ));
            }
            // Overwrite the older (or spoiled) slot first.
            next = match slots {
                [Some(a), Some(b)] if a.0 > b.0 => SLOT,
                [Some(_), None] => SLOT,
                _ => 0,
            };
        }
        let floor = inherited.unwrap_or(i64::MIN);
        let mark = ClockMark {
            path,
            file: Mutex::new(Writer {
                file,
                next,
                seq,
                written: floor,
            }),
            covered: AtomicI64::new(floor),
            accepted: AtomicI64::new(i64::MIN),
            inherited: floor,
            settled: AtomicBool::new(false),
            renewed: tokio::sync::Notify::new(),
        };
        Ok((mark, inherited))
    }

    /// Whether a call stamped `ts_ms` may be accepted; if so, it counts as accepted. (Counted
    /// before the second look at the mark, so that [`ClockMark::settle`], which closes the mark
    /// before it reads what was accepted, sees every call admitted; all `SeqCst`.)
    pub(crate) fn admit(&self, ts_ms: i64) -> bool {
        if ts_ms > self.covered.load(Ordering::SeqCst) {
            return false;
        }
        self.accepted.fetch_max(ts_ms, Ordering::SeqCst);
        ts_ms <= self.covered.load(Ordering::SeqCst)
    }

    /// Count a key's replay floor that the floors file no longer holds (dropped once the clock
    /// had passed it), so that a graceful stop's mark covers it, should the clock step back
    /// before the stop. (Far-ahead calls themselves are not counted: their floors cover them.)
    pub(crate) fn note(&self, ts_ms: i64) {
        self.accepted.fetch_max(ts_ms, Ordering::SeqCst);
    }

    /// Whether [`ClockMark::settle`] has run.
    pub(crate) fn is_settled(&self) -> bool {
        self.settled.load(Ordering::SeqCst)
    }

    /// The durable mark: calls stamped up to it may be accepted.
    pub(crate) fn covered(&self) -> i64 {
        self.covered.load(Ordering::SeqCst)
    }

    /// Make the mark cover calls stamped up to `now_ms` plus [`AHEAD_MS`] and [`LEASE_MS`].
    pub(crate) fn renew(&self, now_ms: i64) -> io::Result<()> {
        self.write(now_ms.saturating_add(AHEAD_MS + LEASE_MS))
    }

    /// At a stop, once no call can be accepted any more: lower the mark to what was accepted,
    /// so that the next start need not wait out the lease.
    /// Calls admitted afterwards are refused.
    pub(crate) fn settle(&self, now_ms: i64) -> io::Result<()> {
        let mut writer = self.file.lock().unwrap_or_else(|p| p.into_inner());
        // Renewals stop; no call is admitted any more; then what was admitted is read.
        self.settled.store(true, Ordering::SeqCst);
        self.covered.store(i64::MIN, Ordering::SeqCst);
        let mark = now_ms
            .saturating_add(AHEAD_MS)
            .max(self.accepted.load(Ordering::SeqCst))
            .max(self.inherited);
        let written = self.write_locked(&mut writer, mark);
        // Calls still waiting for a renewal stop waiting: none will come.
        self.renewed.notify_waiters();
        written
    }

    fn write(&self, mark: i64) -> io::Result<()> {
        let mut writer = self.file.lock().unwrap_or_else(|p| p.into_inner());
        if mark <= writer.written || self.settled.load(Ordering::SeqCst) {
            return Ok(());
        }
        self.write_locked(&mut writer, mark)?;
        self.covered.fetch_max(mark, Ordering::SeqCst);
        self.renewed.notify_waiters();
        Ok(())
    }

    /// Wait until the mark is above `seen` (a renewal came through after a call found `seen`
    /// too low), at most `within`; at once if the mark was settled (no renewal will come).
    pub(crate) async fn renewal_after(&self, seen: i64, within: Duration) {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let renewed = self.renewed.notified();
            tokio::pin!(renewed);
            // Registered before the look at the mark: a renewal in between still wakes it.
            renewed.as_mut().enable();
            if self.covered() > seen || self.settled.load(Ordering::SeqCst) {
                return;
            }
            if tokio::time::timeout_at(deadline, renewed).await.is_err() {
                return;
            }
        }
    }

    fn write_locked(&self, writer: &mut Writer, mark: i64) -> io::Result<()> {
        let at = writer.next;
        writer
            .file
            .write_all_at(&encode(writer.seq + 1, mark), at)
            .and_then(|()| writer.file.sync_data())
            .map_err(|e| {
                io::Error::new(e.kind(), format!("writing {}: {e}", self.path.display()))
            })?;
        writer.next = SLOT - at;
        writer.seq += 1;
        writer.written = mark;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mark_survives_reopening_and_only_rises_through_renewals() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("replay-clock");
        let (mark, inherited) = ClockMark::open(path.clone()).unwrap();
        assert_eq!(inherited, None);
        assert!(
            !mark.admit(0),
            "nothing is covered before the first renewal"
        );
        mark.renew(10_000).unwrap();
        assert!(mark.admit(10_000 + AHEAD_MS + LEASE_MS));
        assert!(!mark.admit(10_000 + AHEAD_MS + LEASE_MS + 1));
        // A clock that stepped back does not lower it.
        mark.renew(5_000).unwrap();
        drop(mark);
        let (mark, inherited) = ClockMark::open(path.clone()).unwrap();
        assert_eq!(inherited, Some(10_000 + AHEAD_MS + LEASE_MS));
        // Settling never goes below what was inherited, even with the clock far behind.
        mark.settle(0).unwrap();
        drop(mark);
        let (_, inherited) = ClockMark::open(path).unwrap();
        assert_eq!(inherited, Some(10_000 + AHEAD_MS + LEASE_MS));
    }

    #[test]
    fn settling_lowers_the_mark_to_what_was_accepted() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("replay-clock");
        let (mark, _) = ClockMark::open(path.clone()).unwrap();
        mark.renew(10_000).unwrap();
        assert!(mark.admit(11_500));
        // The clock stepped back to 9,000 while serving: the mark still covers 11,500.
        mark.settle(9_000).unwrap();
        assert!(!mark.admit(0), "nothing is accepted after settling");
        drop(mark);
        let (_, inherited) = ClockMark::open(path.clone()).unwrap();
        assert_eq!(inherited, Some(11_500));
        let (mark, _) = ClockMark::open(path.clone()).unwrap();
        mark.settle(20_000).unwrap();
        drop(mark);
        assert_eq!(ClockMark::open(path).unwrap().1, Some(20_000 + AHEAD_MS));
    }

    #[test]
    fn a_torn_slot_leaves_the_other_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("replay-clock");
        let (mark, _) = ClockMark::open(path.clone()).unwrap();
        mark.renew(10_000).unwrap(); // slot 0
        mark.renew(20_000).unwrap(); // slot 1
        drop(mark);
        // A power cut tears the write of slot 1.
        let file = OpenOptions::new().write(true).open(&path).unwrap();
        file.write_all_at(&[0xAB; 5], SLOT + 3).unwrap();
        drop(file);
        let (mark, inherited) = ClockMark::open(path.clone()).unwrap();
        assert_eq!(inherited, Some(10_000 + AHEAD_MS + LEASE_MS));
        // The spoiled slot is the one written next.
        mark.renew(30_000).unwrap();
        drop(mark);
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(
            decode(&bytes[SLOT as usize..]).map(|(_, mark)| mark),
            Some(30_000 + AHEAD_MS + LEASE_MS)
        );
        assert_eq!(
            decode(&bytes[..RECORD]).map(|(_, mark)| mark),
            Some(10_000 + AHEAD_MS + LEASE_MS)
        );
        // Both spoiled: refused, naming the file.
        std::fs::write(&path, [0u8; 600]).unwrap();
        let err = ClockMark::open(path).unwrap_err();
        assert!(err.to_string().contains("replay-clock"), "{err}");
    }
}
