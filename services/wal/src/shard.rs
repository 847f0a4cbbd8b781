//! The shard: appends from any thread, one syncer thread doing group commit.
//!
//! `append` frames a record into the pending buffer under a mutex and returns its sequence number
//! at once. The syncer thread takes the whole pending buffer, writes it with one `pwrite` (two
//! around a segment rotation) and, under [`SyncPolicy::Always`], one `fdatasync`, then reports the
//! highest durable sequence number. While one fdatasync runs, new records gather into the next
//! batch, so batches grow with load without any artificial delay. The fsync never runs on the
//! caller's thread. Under [`SyncPolicy::Relaxed`] the syncer still writes every batch at once but
//! defers the fdatasync (see there).
//!
//! Segments no longer needed after a checkpoint are deleted by
//! [`WalShard::delete_segments_through`], from any thread, while appends continue.

use std::collections::VecDeque;
use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::record;
use crate::recovery::{RecoveryReport, recover};
use crate::segment::{
    RECYCLED_NAME, SegmentName, SegmentSizing, ZeroedError, create_zeroed, spare_path, sync_dir,
    sync_dir_after_removal,
};
use crate::{ReplayVisitor, WalError};

/// What the syncer reports after each fdatasync.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DurableEvent {
    /// Every record with a sequence number `<=` this is durable (fdatasync'ed).
    Durable(u64),
    /// An fdatasync failed; records after the last `Durable` are not durable and never will
    /// be. The shard is poisoned for good: after a failed fsync the kernel may have dropped the
    /// dirty pages, so a reopen could read back data that is not on disk.
    Poisoned,
    /// A write failed before any fdatasync of it (creating a segment on a full disk, say). The
    /// shard accepts nothing more, but nothing it reported durable is in doubt and no fsync
    /// failed, so reopening it (recovery cuts the torn tail) is safe once the cause is gone.
    /// `no_space` when the file system was full (ENOSPC or EDQUOT).
    WriteFailed { no_space: bool },
}

/// Called on the syncer thread after each fdatasync. Must be quick (send a message, wake a task).
pub type DurableNotify = Box<dyn Fn(DurableEvent) + Send + Sync>;

/// When the syncer calls fdatasync.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SyncPolicy {
    /// fdatasync every batch before reporting it durable (group commit). A record reported
    /// durable survives power loss.
    #[default]
    Always,
    /// Write every batch to the segment file as soon as it is there, so a process crash
    /// (kill -9) loses nothing the syncer has written, but fdatasync only when the oldest
    /// written-but-unsynced record was written `max_delay` ago, when at least `max_records`
    /// records or [`WalOptions::max_unsynced_bytes`] bytes are unsynced, when a segment is
    /// sealed, or at close. A power failure can lose what was not yet synced: about `max_delay`,
    /// and at most `max_records` and `max_unsynced_bytes`, worth of records.
    ///
    /// `Durable` events, [`WalShard::durable_seq`] and [`WalShard::wait_durable`] still mean
    /// "fdatasync'ed", so they advance only at those syncs; [`WalShard::written_seq`] tells how
    /// far the syncer has written. Trading that window for fewer fdatasyncs is the point: a
    /// caller that acknowledges on `written_seq` gets page-cache latency instead of disk latency.
    Relaxed {
        /// Longest a written record waits for its fdatasync. The syncer wakes up by itself for
        /// this deadline; it does not wait for the next append.
        max_delay: Duration,
        /// Unsynced records that trigger an fdatasync at once.
        max_records: u64,
    },
}

impl SyncPolicy {
    /// Whether `unsynced` must be fdatasync'ed now; `max_bytes` is the shard's
    /// [`WalOptions::max_unsynced_bytes`].
    fn due(self, unsynced: &Unsynced, now: Instant, max_bytes: u64) -> bool {
        if unsynced.records == 0 {
            return false;
        }
        match self {
            SyncPolicy::Always => true,
            SyncPolicy::Relaxed {
                max_delay,
                max_records,
            } => {
                unsynced.records >= max_records
                    || unsynced.bytes >= max_bytes
                    || unsynced
                        .since
                        .is_none_or(|t| now.saturating_duration_since(t) >= max_delay)
            }
        }
    }

    /// How many records it lets stay unsynced (`max_records`); `None` under `Always`.
    pub fn unsynced_records(self) -> Option<u64> {
        match self {
            SyncPolicy::Always => None,
            SyncPolicy::Relaxed { max_records, .. } => Some(max_records),
        }
    }

    /// The narrower of the two: `Always` if either is, else the smaller delay and record count.
    pub fn narrowest(self, other: SyncPolicy) -> SyncPolicy {
        match (self, other) {
            (
                SyncPolicy::Relaxed {
                    max_delay: a,
                    max_records: m,
                },
                SyncPolicy::Relaxed {
                    max_delay: b,
                    max_records: n,
                },
            ) => SyncPolicy::Relaxed {
                max_delay: a.min(b),
                max_records: m.min(n),
            },
            _ => SyncPolicy::Always,
        }
    }

    /// When `unsynced` becomes due by age; `None` if it never does by itself (nothing unsynced,
    /// or a delay too large to represent).
    fn deadline(self, unsynced: &Unsynced) -> Option<Instant> {
        match self {
            SyncPolicy::Relaxed { max_delay, .. } if unsynced.records > 0 => {
                unsynced.since?.checked_add(max_delay)
            }
            _ => None,
        }
    }
}

/// How a shard is laid out and bounded.
#[derive(Debug, Clone)]
pub struct WalOptions {
    pub segments: SegmentSizing,
    /// Largest payload accepted by `append`.
    pub max_record: usize,
    /// When records are fdatasync'ed.
    pub sync: SyncPolicy,
    /// Under [`SyncPolicy::Relaxed`], written-but-unsynced bytes (records as framed) that
    /// trigger an fdatasync at once, whatever the policy's delay and record count: with
    /// [`WalShard::unsynced_bytes`], what bounds the memory and the loss window of a caller
    /// acknowledging before fdatasync when values are large or the disk stalls.
    pub max_unsynced_bytes: u64,
}

impl Default for WalOptions {
    fn default() -> Self {
        WalOptions {
            segments: SegmentSizing::default(),
            max_record: 4 << 20,
            sync: SyncPolicy::Always,
            max_unsynced_bytes: 64 << 20,
        }
    }
}

/// A write-ahead log in one directory, with its syncer thread.
pub struct WalShard {
    shared: Arc<Shared>,
    syncer: Option<JoinHandle<()>>,
    max_record: usize,
    max_unsynced_bytes: u64,
}

impl std::fmt::Debug for WalShard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WalShard")
            .field("dir", &self.shared.dir)
            .finish_non_exhaustive()
    }
}

struct Shared {
    dir: PathBuf,
    state: Mutex<State>,
    /// The syncer waits here for records (or close, or a relaxed sync deadline).
    work: Condvar,
    /// `wait_durable` callers wait here.
    durable_cv: Condvar,
    notify: Option<DurableNotify>,
    /// The segment files. A lock of its own, not part of `State`: deleting files must not hold
    /// up appends, and the syncer touches it only at rotation.
    segments: Arc<Mutex<SegmentTable>>,
    /// Held for the whole of a deletion, so two concurrent callers cannot pick the same files.
    deleting: Mutex<()>,
    /// The writer's, shared: see [`DirSync`].
    dir_sync: DirSync,
}

struct State {
    pending: Vec<u8>,
    /// Records in `pending`: the next one's batch position (see `crate::record`).
    pending_records: u64,
    next_seq: u64,
    last_appended: u64,
    /// Highest seq the syncer has written to a segment file (handed to the OS).
    written: u64,
    /// Highest seq fdatasync'ed.
    durable: u64,
    syncer_idle: bool,
    durable_waiters: usize,
    closing: bool,
    poisoned: bool,
    /// What poisoned it (set with `poisoned`).
    failure: Option<DurableEvent>,
    /// The policy the syncer follows: the one the shard was opened with, or a narrower one set
    /// since ([`WalShard::narrow_policy`]).
    policy: SyncPolicy,
    /// Bytes (records as framed) appended since the shard was opened, and of them those
    /// fdatasync'ed: [`WalShard::unsynced_bytes`] is the difference.
    appended_bytes: u64,
    durable_bytes: u64,
    /// A window for [`RAN_UNDER`] the syncer is to record before its next write (a narrowed
    /// policy's; `Some(None)`: remove the file).
    ran_under_update: Option<Option<u64>>,
}

/// Every segment file of the shard, oldest first; the last one is the active segment. Shared
/// between the syncer (which adds a segment at rotation) and
/// [`WalShard::delete_segments_through`] (which removes the oldest).
struct SegmentTable {
    /// (name, size in bytes).
    files: VecDeque<(SegmentName, u64)>,
    /// Sum of the sizes, for [`WalShard::wal_bytes`].
    bytes: u64,
    /// Size of the covered segment kept as [`RECYCLED_NAME`] for the next rotation, if one is.
    /// The file is renamed (to it by a deletion, from it by a rotation) only under this table's
    /// lock, so the two never race.
    recycled: Option<u64>,
}

/// Held across every fsync of the WAL directory while the shard is open (a deletion's, the
/// syncer's at a rotation); true once one of them failed. So a rotation's fsync either comes
/// wholly before a failed one or sees it and fails too: one after a failed fsync vouches for
/// nothing, and the batch written after it must not be reported durable, however long the
/// deleting thread takes to poison the shard. A lock of its own, not the segment table's: the
/// actor reads the table (`wal_bytes`) and must not wait for a directory fsync.
type DirSync = Arc<Mutex<bool>>;

/// Run `sync`, an fsync of the WAL directory, under its fsync lock ([`DirSync`]): refused
/// without trying after an earlier failed one (a later fsync vouches for nothing), and a failed
/// one ([`WalError::is_failed_sync`]) recorded for the next. The caller poisons the shard on a
/// failed sync.
fn sync_dir_locked(
    dir_sync: &Mutex<bool>,
    sync: impl FnOnce() -> Result<(), WalError>,
) -> Result<(), WalError> {
    let mut failed = dir_sync.lock().unwrap_or_else(|p| p.into_inner());
    if *failed {
        return Err(WalError::io("syncing wal directory")(
            std::io::Error::other("an earlier fsync of the wal directory failed"),
        ));
    }
    let synced = sync();
    if synced.as_ref().is_err_and(WalError::is_failed_sync) {
        *failed = true;
    }
    synced
}

impl SegmentTable {
    fn new(files: impl IntoIterator<Item = (SegmentName, u64)>) -> SegmentTable {
        let files: VecDeque<(SegmentName, u64)> = files.into_iter().collect();
        let bytes = files.iter().map(|(_, size)| size).sum();
        SegmentTable {
            files,
            bytes,
            recycled: None,
        }
    }

    /// A new active segment. `replaced_empty`: it took the place (and first seq) of the empty
    /// active segment, whose file was removed.
    fn push(&mut self, name: SegmentName, size: u64, replaced_empty: bool) {
        if replaced_empty && let Some((_, old)) = self.files.pop_back() {
            self.bytes = self.bytes.saturating_sub(old);
        }
        self.files.push_back((name, size));
        self.bytes += size;
    }

    /// Sealed segments (never the active one) whose records are all `<= seq`, oldest first: a
    /// sealed segment qualifies iff the segment after it starts at or before `seq + 1`. Segments
    /// start at increasing seqs, so they form a prefix, and deleting them in order leaves a
    /// contiguous suffix of the log at every step.
    fn covered_through(&self, seq: u64) -> Vec<(SegmentName, u64)> {
        self.files
            .iter()
            .zip(self.files.iter().skip(1))
            .take_while(|(_, next)| next.0.first_seq <= seq.saturating_add(1))
            .map(|(seg, _)| *seg)
            .collect()
    }
}

fn lock_table(table: &Mutex<SegmentTable>) -> MutexGuard<'_, SegmentTable> {
    // Plain data; a panic elsewhere cannot leave it half-updated in a way that matters.
    table.lock().unwrap_or_else(|p| p.into_inner())
}

impl WalShard {
    /// Recover `dir` (created if missing) and start the syncer. Records with a sequence number
    /// above `start_after` (the caller's checkpoint) are passed to `visit` in order first.
    ///
    /// The checkpoint may be ahead of the log: after a power cut under [`SyncPolicy::Relaxed`],
    /// the caller's state can hold records whose WAL tail was lost. Appending then continues at
    /// `start_after + 1` in a new segment of that name (continuing in the old last segment would
    /// leave a gap in it, which a later recovery refuses as corruption), and the old segments,
    /// all covered by the checkpoint, are deleted.
    pub fn open(
        dir: &Path,
        options: WalOptions,
        start_after: u64,
        visit: &mut ReplayVisitor<'_>,
        notify: Option<DurableNotify>,
    ) -> Result<(WalShard, RecoveryReport), WalError> {
        let mut notify = notify;
        let opened = Self::open_with(dir, options, start_after, visit, &mut notify);
        if let Err(e) = &opened
            && e.is_failed_sync()
            && let Some(notify) = &notify
        {
            // Reported as the syncer's failed fdatasync is: what a crash left in the page cache
            // and this sync could not write would read back as durable at a retried open (the
            // kernel reports a writeback error once), so the shard must not be reopened.
            notify(DurableEvent::Poisoned);
        }
        opened
    }

    fn open_with(
        dir: &Path,
        options: WalOptions,
        start_after: u64,
        visit: &mut ReplayVisitor<'_>,
        notify: &mut Option<DurableNotify>,
    ) -> Result<(WalShard, RecoveryReport), WalError> {
        // A frame's length field is 32 bits: a larger payload is refused by `append`
        // (`RecordTooLarge`), whatever the options ask, not framed with a wrong length.
        let options = WalOptions {
            max_record: options.max_record.min(u32::MAX as usize),
            ..options
        };
        create_dir_durably(dir)?;
        // The window within which recovery may cut a hole a power cut left across unsynced
        // batches: the narrower of the policy opening the log and the one it last ran under
        // (a policy widened since, while the tenant stayed open under the old one, must not
        // widen the cut), none if either is `sync` or the latter is unknown.
        let relaxed_window = match (options.sync.unsynced_records(), ran_under(dir)) {
            (Some(max_records), Ok(Some(ran))) => Some(max_records.min(ran)),
            _ => None,
        };
        let (mut resume, report) = recover(dir, start_after, visit, relaxed_window)?;
        // What a killed process wrote but did not fsync (its last batch; a segment whose name it
        // had not synced yet) survives in the page cache only, yet from here on it is treated as
        // durable: the caller serves reads from the replayed records and the relaxed window
        // counts from them. Make the last segment (earlier ones were synced before the next was
        // created) and the directory's names durable first.
        if let Some((_, path, _)) = resume.segments.last() {
            if crate::failpoint::injected_sync_failure(dir) {
                return Err(WalError::io("syncing the recovered last segment")(
                    std::io::Error::other("injected fdatasync failure"),
                ));
            }
            File::open(path)
                .and_then(|f| f.sync_data())
                .map_err(WalError::io("syncing the recovered last segment"))?;
            sync_dir(dir).map_err(WalError::io("syncing the wal directory"))?;
        }
        // Before anything is written under it.
        record_ran_under(dir, options.sync)?;
        let (max_record, max_unsynced_bytes) = (options.max_record, options.max_unsynced_bytes);
        let table = Arc::new(Mutex::new(SegmentTable::new(
            resume.segments.iter().map(|(name, _, size)| (*name, *size)),
        )));
        // An unsalted last segment with room (named by an older build) is sealed rather than
        // continued, so every segment this build writes into is salted (see `crate::record`).
        // One with no room (an empty marker left by `remove_covered_log`) is never written into:
        // the first append replaces it.
        let last_unsalted = resume
            .segments
            .last()
            .is_some_and(|(name, _, size)| name.salt == 0 && *size > resume.write_offset);
        let mut writer = SegmentWriter::resume(
            dir,
            options.segments,
            resume.segments.pop(),
            resume.write_offset,
            Arc::clone(&table),
        )?;
        let last = resume.next_seq - 1;
        if resume.checkpoint_ahead || last_unsalted || writer.active.is_none() {
            writer.rotate(resume.next_seq, 0)?;
        }
        // A last segment with no room left (full, or the empty marker of a cleanly closed log)
        // stays active: the first append rotates past it. Doing so here would make opening (and
        // so reading) fail on a full disk.
        let shared = Arc::new(Shared {
            dir: dir.to_path_buf(),
            state: Mutex::new(State {
                pending: Vec::with_capacity(64 << 10),
                pending_records: 0,
                next_seq: resume.next_seq,
                last_appended: last,
                written: last,
                durable: last,
                syncer_idle: false,
                durable_waiters: 0,
                closing: false,
                poisoned: false,
                failure: None,
                policy: options.sync,
                appended_bytes: 0,
                durable_bytes: 0,
                ran_under_update: None,
            }),
            work: Condvar::new(),
            durable_cv: Condvar::new(),
            notify: notify.take(),
            segments: table,
            deleting: Mutex::new(()),
            dir_sync: Arc::clone(&writer.dir_sync),
        });
        if resume.checkpoint_ahead {
            // The new segment is in place and its name durable, so these are garbage. Failing to
            // delete them is harmless (recovery skips covered segments, and a later
            // `delete_segments_through` retries), so it does not fail the open; a failed fsync
            // of the directory after deleting does, as it poisoned the shard (and as the store's
            // own deletion at an open does).
            match shared.delete_through(start_after) {
                Ok((n, bytes)) => tracing::info!(
                    dir = %dir.display(), segments = n, bytes, start_after,
                    "checkpoint ahead of the wal; deleted covered segments"
                ),
                Err(e) if e.is_failed_sync() => return Err(e),
                Err(e) => tracing::warn!(
                    dir = %dir.display(), error = %e,
                    "could not delete wal segments covered by the checkpoint"
                ),
            }
        }
        let thread_shared = Arc::clone(&shared);
        let syncer = std::thread::Builder::new()
            .name("wal-syncer".into())
            .spawn(move || {
                let run = std::panic::AssertUnwindSafe(|| {
                    syncer_loop(&thread_shared, writer, last, max_unsynced_bytes);
                });
                if std::panic::catch_unwind(run).is_err() {
                    // A bug (here or in the notify callback). Without this the shard would look
                    // healthy: appends queued for a syncer that is gone, waits never ending.
                    // The callback may be what panicked: a second panic must not stop it here.
                    let run = std::panic::AssertUnwindSafe(|| {
                        poison(
                            &thread_shared,
                            &WalError::Io {
                                op: crate::error::SYNCER_PANICKED,
                                source: std::io::Error::other("the wal syncer thread panicked"),
                            },
                        );
                    });
                    let _ = std::panic::catch_unwind(run);
                }
            })
            .map_err(WalError::io("spawning syncer thread"))?;
        Ok((
            WalShard {
                shared,
                syncer: Some(syncer),
                max_record,
                max_unsynced_bytes,
            },
            report,
        ))
    }

    /// Frame `payload` into the next batch and return its sequence number. Durability is reported
    /// later through the notify callback or [`WalShard::wait_durable`].
    pub fn append(&self, payload: &[u8]) -> Result<u64, WalError> {
        if payload.len() > self.max_record {
            return Err(WalError::RecordTooLarge {
                len: payload.len(),
                max: self.max_record,
            });
        }
        let mut st = self.shared.lock();
        if st.poisoned {
            return Err(WalError::Poisoned);
        }
        if st.closing {
            return Err(WalError::Closed);
        }
        let seq = st.next_seq;
        if seq > record::MAX_SEQ {
            return Err(WalError::Io {
                op: "appending",
                source: std::io::Error::other("the log's sequence numbers are used up"),
            });
        }
        st.next_seq += 1;
        st.last_appended = seq;
        let position = st.pending_records;
        st.pending_records += 1;
        let before = st.pending.len();
        record::encode(&mut st.pending, seq, position, payload);
        st.appended_bytes += (st.pending.len() - before) as u64;
        if st.syncer_idle {
            st.syncer_idle = false;
            self.shared.work.notify_one();
        }
        Ok(seq)
    }

    /// Block until `seq` is durable (or the shard is poisoned). Under [`SyncPolicy::Relaxed`]
    /// this can take up to `max_delay` after the record was written.
    pub fn wait_durable(&self, seq: u64) -> Result<(), WalError> {
        let mut st = self.shared.lock();
        st.durable_waiters += 1;
        while st.durable < seq && !st.poisoned {
            st = self
                .shared
                .durable_cv
                .wait(st)
                .unwrap_or_else(|p| p.into_inner());
        }
        st.durable_waiters -= 1;
        if st.durable >= seq {
            Ok(())
        } else {
            Err(WalError::Poisoned)
        }
    }

    /// Follow `policy` from now on where it is narrower than the one in force (see
    /// [`SyncPolicy::narrowest`]): what is written but not synced is synced as soon as the new
    /// policy says it is due, which under `Always` is at once. A wider policy waits for the
    /// shard to be opened again under it. Returns the policy in force now.
    pub fn narrow_policy(&self, policy: SyncPolicy) -> SyncPolicy {
        let mut st = self.shared.lock();
        let before = st.policy;
        st.policy = st.policy.narrowest(policy);
        let now = st.policy;
        if now.unsynced_records() != before.unsynced_records() {
            // The syncer records it ([`RAN_UNDER`]) before its next write.
            st.ran_under_update = Some(now.unsynced_records());
        }
        drop(st);
        // A syncer asleep until an old deadline looks again.
        self.shared.work.notify_one();
        now
    }

    /// Bytes appended (records as framed) and not yet reported durable, whether still queued
    /// for the syncer or written to the page cache (a sealed segment's sync at a rotation
    /// counts only once the syncer's next sync reports them).
    pub fn unsynced_bytes(&self) -> u64 {
        let st = self.shared.lock();
        st.appended_bytes - st.durable_bytes
    }

    /// The shard's [`WalOptions::max_unsynced_bytes`].
    pub fn max_unsynced_bytes(&self) -> u64 {
        self.max_unsynced_bytes
    }

    /// Highest durable (fdatasync'ed) sequence number.
    pub fn durable_seq(&self) -> u64 {
        self.shared.lock().durable
    }

    /// Highest sequence number the syncer has written to a segment file: it survives a crash of
    /// this process, but not a power failure until it is also durable. Under
    /// [`SyncPolicy::Always`] it moves together with [`WalShard::durable_seq`].
    /// What poisoned the shard, if it is poisoned: [`DurableEvent::Poisoned`] (a failed
    /// fdatasync) or [`DurableEvent::WriteFailed`].
    pub fn failure(&self) -> Option<DurableEvent> {
        self.shared.lock().failure
    }

    pub fn written_seq(&self) -> u64 {
        self.shared.lock().written
    }

    /// Sequence number the next append will get.
    pub fn next_seq(&self) -> u64 {
        self.shared.lock().next_seq
    }

    /// Bytes of segment files on disk (a spare segment being prepared is not counted).
    pub fn wal_bytes(&self) -> u64 {
        lock_table(&self.shared.segments).bytes
    }

    /// Segment files on disk, the active one included.
    pub fn segment_count(&self) -> usize {
        lock_table(&self.shared.segments).files.len()
    }

    /// Delete, oldest first, every sealed segment whose records all have a sequence number
    /// `<= seq`, then fsync the directory once. Returns (segments deleted, bytes freed).
    ///
    /// Call it once the caller's state up to `seq` is durable elsewhere (a checkpoint): from then
    /// on the shard must be opened with `start_after >= seq`, and opening it with an older
    /// checkpoint fails with [`WalError::StateBehindLog`]. The active segment is never
    /// deleted, nor any segment that may hold a record above `seq`. Safe to call from any thread
    /// while appends continue.
    ///
    /// Crash safety: every deleted segment is covered by the checkpoint and recovery skips
    /// covered segments without reading them, so a crash between two deletions, or one that
    /// persists only some of the unlinks (they are made durable by the single directory fsync at
    /// the end), still leaves a log that recovers with `start_after >= seq`.
    ///
    /// On an error, the segments deleted before it stay deleted (and are no longer counted); the
    /// call can simply be repeated.
    pub fn delete_segments_through(&self, seq: u64) -> Result<(usize, u64), WalError> {
        self.shared.delete_through(seq)
    }

    /// A handle that runs [`WalShard::delete_segments_through`] from another thread (a
    /// checkpoint job on the blocking pool: the unlinks and the directory fsync stay off the
    /// thread the tenant's actor shares with others).
    pub fn segment_deleter(&self) -> SegmentDeleter {
        SegmentDeleter(Arc::clone(&self.shared))
    }

    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }

    /// Write and sync everything appended so far and stop the syncer. Returns the final durable
    /// sequence number. Appends after this fail with [`WalError::Closed`].
    pub fn close(mut self) -> Result<u64, WalError> {
        self.shutdown()
    }

    /// [`WalShard::close`], failing with what stopped the shard (a failed write leaves it
    /// reopenable, a failed fdatasync does not) and the last sequence number it wrote: under a
    /// relaxed policy, changes acknowledged after that one are lost.
    pub fn close_or_failure(mut self) -> Result<u64, (DurableEvent, u64)> {
        self.shutdown().map_err(|_| {
            (
                self.failure().unwrap_or(DurableEvent::Poisoned),
                self.written_seq(),
            )
        })
    }

    fn shutdown(&mut self) -> Result<u64, WalError> {
        {
            let mut st = self.shared.lock();
            st.closing = true;
            self.shared.work.notify_one();
        }
        if let Some(handle) = self.syncer.take() {
            let _ = handle.join();
        }
        let st = self.shared.lock();
        if st.poisoned {
            Err(WalError::Poisoned)
        } else {
            Ok(st.durable)
        }
    }
}

/// The file in a shard's directory that names the `max_records` of the relaxed policy the log
/// runs under (absent under `sync`): recovery cuts a hole a power cut left across unsynced
/// batches only within the narrower of it and the opening policy (`crate::recovery`).
pub(crate) const RAN_UNDER: &str = "relaxed-window";

/// The `max_records` [`RAN_UNDER`] names in `dir`: `Ok(None)` if there is no such file (the
/// log ran under `sync`, or was last opened by a build that kept none) or it holds no number;
/// an error if it cannot be read (recovery then takes no window).
fn ran_under(dir: &Path) -> std::io::Result<Option<u64>> {
    match fs::read_to_string(dir.join(RAN_UNDER)) {
        Ok(text) => Ok(text.trim().parse().ok()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Make [`RAN_UNDER`] in `dir` name `window` (`None`: no file), unless it already does; returns
/// whether the directory's entries changed (the caller makes that durable its own way). A file
/// that cannot be written (a full disk) is removed instead, so that no stale, wider window
/// stays; an error only if that fails too.
fn set_ran_under(dir: &Path, window: Option<u64>) -> std::io::Result<bool> {
    let path = dir.join(RAN_UNDER);
    let remove = || match fs::remove_file(&path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    };
    let Some(max_records) = window else {
        return remove();
    };
    // Kept only when it is known to name the window already: one that could not be read may
    // name a wider one, and is replaced.
    if ran_under(dir).is_ok_and(|now| now == window) {
        return Ok(false);
    }
    let tmp = dir.join(format!("{RAN_UNDER}.tmp"));
    let written = (|| {
        let file = File::create(&tmp)?;
        file.write_all_at(format!("{max_records}\n").as_bytes(), 0)?;
        file.sync_all()?;
        fs::rename(&tmp, &path)
    })();
    match written {
        Ok(()) => Ok(true),
        Err(e) => {
            tracing::warn!(dir = %dir.display(), error = %e, "could not record the wal's policy; a recovery will cut no hole across its unsynced batches");
            let _ = fs::remove_file(&tmp);
            remove()
        }
    }
}

/// [`set_ran_under`] for the policy an open runs the log under, before the syncer starts. Only
/// a failed fsync of the directory fails the open, as any failed sync of an open does.
fn record_ran_under(dir: &Path, policy: SyncPolicy) -> Result<(), WalError> {
    match set_ran_under(dir, policy.unsynced_records()) {
        Ok(false) => Ok(()),
        Ok(true) => sync_dir(dir).map_err(WalError::io("syncing the wal directory")),
        Err(e) => {
            tracing::warn!(dir = %dir.display(), error = %e, "could not remove the wal's policy file; a recovery may cut a hole in its unsynced tail by the policy it names");
            Ok(())
        }
    }
}

/// [`set_ran_under`] for a policy narrowed on the open log, from the syncer before its next
/// write (not on the caller's thread: the actor must not wait for a directory fsync). Made
/// durable under the directory's fsync lock; a failed fsync poisons the shard as any failed
/// directory fsync does ([`DirSync`]). Returns false if it did.
fn update_ran_under(shared: &Shared, window: Option<u64>) -> bool {
    let warn = |e: &dyn std::fmt::Display| {
        tracing::warn!(dir = %shared.dir.display(), error = %e, "could not record the wal's narrowed policy; a recovery may cut a hole in its unsynced tail by the wider one");
    };
    match set_ran_under(&shared.dir, window) {
        Ok(false) => true,
        Ok(true) => {
            let synced = sync_dir_locked(&shared.dir_sync, || {
                sync_dir_after_removal(&shared.dir, "syncing wal directory after a policy change")
            });
            match synced {
                Ok(()) => true,
                Err(e) if e.is_failed_sync() => {
                    poison(shared, &e);
                    false
                }
                Err(e) => {
                    warn(&e);
                    true
                }
            }
        }
        Err(e) => {
            warn(&e);
            true
        }
    }
}

/// fsync `dir` after a change to its entries, from the syncer. Failing to open it (no descriptor
/// left, say) is a failed write, which leaves the shard reopenable; only a failed fsync poisons
/// it for good.
fn sync_dir_entries(dir: &Path) -> Result<(), WalError> {
    File::open(dir)
        .map_err(WalError::io("opening wal directory"))?
        .sync_all()
        .map_err(WalError::io("syncing wal directory"))
}

/// `create_dir_all`, then fsync every directory whose entry list changed, so a new shard's
/// directory survives power loss before its first acknowledged record. For an existing
/// directory, the three directories above it (`tenants/<tenant>/`, `tenants/` and the data
/// directory, for a tenant's `wal/` or `state/`) are fsynced instead: a process killed between
/// a creation and those fsyncs would otherwise leave the entries unsynced for good (the first
/// tenant's creation makes `tenants` itself).
pub fn create_dir_durably(dir: &Path) -> Result<(), WalError> {
    let mut existing = dir;
    while !existing.exists() {
        match existing.parent() {
            Some(p) => existing = p,
            None => break,
        }
    }
    if existing == dir {
        for d in dir.ancestors().take(3) {
            let above = match d.parent() {
                Some(p) if !p.as_os_str().is_empty() => p,
                _ => Path::new("."),
            };
            // Failing to open one (no descriptor left) is a failed write, which a reopen may
            // retry; only a failed fsync is a failed sync.
            File::open(above)
                .map_err(WalError::io("opening the directories above the wal"))?
                .sync_all()
                .map_err(WalError::io("syncing the directories above the wal"))?;
        }
        return Ok(());
    }
    fs::create_dir_all(dir).map_err(WalError::io("creating wal directory"))?;
    let mut d = dir;
    loop {
        sync_dir(d).map_err(WalError::io("syncing new wal directory"))?;
        if d == existing {
            break;
        }
        match d.parent() {
            Some(p) => d = p,
            None => break,
        }
    }
    Ok(())
}

/// See [`WalShard::segment_deleter`].
pub struct SegmentDeleter(Arc<Shared>);

impl std::fmt::Debug for SegmentDeleter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SegmentDeleter").finish_non_exhaustive()
    }
}

impl SegmentDeleter {
    /// [`WalShard::delete_segments_through`].
    pub fn delete_through(&self, seq: u64) -> Result<(usize, u64), WalError> {
        self.0.delete_through(seq)
    }
}

impl Drop for WalShard {
    fn drop(&mut self) {
        if self.syncer.is_some() {
            let _ = self.shutdown();
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock leaves only plain data behind; keep going.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// See [`WalShard::delete_segments_through`].
    fn delete_through(&self, seq: u64) -> Result<(usize, u64), WalError> {
        let _one_at_a_time = self.deleting.lock().unwrap_or_else(|p| p.into_inner());
        // Decide under the table lock, delete without it: the syncer needs the table at rotation
        // and must not wait for unlinks. Only the syncer adds segments, at the end, so the
        // victims (a prefix of the table, never its last entry) stay valid meanwhile.
        let victims = lock_table(&self.segments).covered_through(seq);
        let (mut deleted, mut freed) = (0usize, 0u64);
        let mut failure = None;
        let newest = victims.last().map(|(segment, _)| *segment);
        for (segment, size) in victims {
            let name = segment.file_name();
            let path = self.dir.join(&name);
            let gone = if Some(segment) == newest && self.recycle(&path, size) {
                Ok(())
            } else {
                fs::remove_file(&path)
            };
            match gone {
                Ok(()) => {}
                // Already gone (an operator?): the end state is the one wanted.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(source) => {
                    failure = Some(WalError::Io {
                        op: "deleting segment",
                        source,
                    });
                    break;
                }
            }
            let mut table = lock_table(&self.segments);
            if table.files.front().map(|(front, _)| *front) == Some(segment) {
                table.files.pop_front();
                table.bytes = table.bytes.saturating_sub(size);
            }
            drop(table);
            tracing::debug!(segment = %name, bytes = size, through = seq, "deleted wal segment");
            deleted += 1;
            freed += size;
            cube_metrics::WAL_SEGMENTS_DELETED.inc();
            crate::failpoint::hit("wal-between-deletes");
        }
        if deleted > 0 {
            // Make the unlinks durable. Should the fsync fail, the unlinked segments may come
            // back after a power cut, which is harmless (the checkpoint covers them); but like
            // any failed fsync it is not retried: a later fsync of this directory, on another
            // descriptor, may report success without the failed block ever written. So, as for
            // the syncer's failed fdatasync, the shard accepts nothing more and its owner hears
            // `Poisoned` (the tenant is not reopened before a restart), whoever called this (a
            // checkpoint, an open). Under the directory's fsync lock: see [`DirSync`].
            let synced = sync_dir_locked(&self.dir_sync, || {
                sync_dir_after_removal(&self.dir, "syncing wal directory after deletion")
            });
            if let Err(e) = synced {
                if e.is_failed_sync() {
                    crate::failpoint::injected_poison_delay(&self.dir);
                    poison(self, &e);
                }
                return Err(e);
            }
        }
        match failure {
            Some(e) => Err(e),
            None => Ok((deleted, freed)),
        }
    }

    /// Keep the covered segment at `path` (`size` bytes) as the shard's recycled segment,
    /// renamed to [`RECYCLED_NAME`], unless one at least as large is kept already. Returns
    /// whether it did; if not (or if the rename failed: a full directory block, say), the caller
    /// deletes the file. The rename is made durable by the caller's directory fsync; a crash
    /// before leaves either name, both harmless (a covered segment, or a spare that open
    /// deletes).
    fn recycle(&self, path: &Path, size: u64) -> bool {
        let mut table = lock_table(&self.segments);
        if table.recycled.is_some_and(|kept| kept >= size) {
            return false;
        }
        // Replaces a smaller recycled file atomically.
        match fs::rename(path, self.dir.join(RECYCLED_NAME)) {
            Ok(()) => {
                table.recycled = Some(size);
                true
            }
            Err(e) => {
                tracing::warn!(dir = %self.dir.display(), error = %e, "could not keep a covered wal segment for reuse; deleting it");
                false
            }
        }
    }
}

/// Records written to the active segment but not yet fdatasync'ed (relaxed policy; under
/// `Always` they are synced in the same step as they are written).
#[derive(Debug, Default)]
struct Unsynced {
    records: u64,
    /// Their bytes, as framed.
    bytes: u64,
    /// When the oldest of them was written.
    since: Option<Instant>,
}

/// What the syncer does next.
enum Step {
    /// Write the batch just taken from `pending`, whose last record is this seq.
    Write(u64),
    /// fdatasync what was written.
    Sync,
    /// Closing, and everything is durable.
    Exit,
    /// Record a narrowed policy's window ([`update_ran_under`]).
    RanUnder(Option<u64>),
}

fn syncer_loop(shared: &Shared, mut writer: SegmentWriter, mut written: u64, max_bytes: u64) {
    let mut batch: Vec<u8> = Vec::with_capacity(64 << 10);
    let mut unsynced = Unsynced::default();
    // Bytes written since the open (as `State::appended_bytes` counts them).
    let mut written_bytes = 0u64;
    let mut policy;
    loop {
        let step = {
            let mut st = shared.lock();
            let step = loop {
                // Read again at every turn: a narrower policy set meanwhile holds at once.
                policy = st.policy;
                if st.ran_under_update.is_some() {
                    // What was written under the wider window is synced first: recovery takes
                    // the file's window as a bound on what was unsynced at each write.
                    if unsynced.records > 0 {
                        break Step::Sync;
                    }
                    if let Some(window) = st.ran_under_update.take() {
                        break Step::RanUnder(window);
                    }
                }
                let now = Instant::now();
                // Checked before pending records, so a steady stream of appends cannot hold a
                // relaxed sync off past its deadline.
                if policy.due(&unsynced, now, max_bytes) {
                    break Step::Sync;
                }
                if !st.pending.is_empty() {
                    std::mem::swap(&mut st.pending, &mut batch);
                    st.pending_records = 0;
                    break Step::Write(st.last_appended);
                }
                if st.closing {
                    break if unsynced.records > 0 {
                        Step::Sync
                    } else {
                        Step::Exit
                    };
                }
                st.syncer_idle = true;
                st = match policy.deadline(&unsynced) {
                    // Sleep until the oldest unsynced record is due (or an append or close wakes
                    // us); `due` was false, so the timeout is not zero and this does not spin.
                    Some(deadline) => {
                        shared
                            .work
                            .wait_timeout(st, deadline.saturating_duration_since(now))
                            .unwrap_or_else(|p| p.into_inner())
                            .0
                    }
                    None => shared.work.wait(st).unwrap_or_else(|p| p.into_inner()),
                };
            };
            st.syncer_idle = false;
            step
        };
        let started = Instant::now();
        match step {
            Step::Exit => return,
            Step::RanUnder(window) => {
                if update_ran_under(shared, window) {
                    continue;
                }
                return;
            }
            Step::Sync => {}
            Step::Write(last_seq) => {
                let records = count_records(&batch);
                let first_seq = last_seq + 1 - records;
                if let Err(e) = writer.write(&mut batch, first_seq) {
                    poison(shared, &e);
                    return;
                }
                cube_metrics::WAL_BYTES.inc_by(batch.len() as u64);
                written_bytes += batch.len() as u64;
                unsynced.bytes += batch.len() as u64;
                batch.clear();
                unsynced.records += records;
                unsynced.since.get_or_insert(started);
                written = last_seq;
                if !policy.due(&unsynced, Instant::now(), max_bytes) {
                    // Relaxed and not due yet: only publish how far the file now reaches.
                    shared.lock().written = written;
                    continue;
                }
            }
        }
        // fdatasync. Under `Always` this directly follows the write, as one group commit, and
        // the time observed covers both, as it always has.
        if let Err(e) = writer.sync() {
            poison(shared, &e);
            return;
        }
        cube_metrics::WAL_FSYNC_SECONDS.observe(started.elapsed().as_secs_f64());
        cube_metrics::WAL_BATCH_RECORDS.observe(unsynced.records as f64);
        unsynced = Unsynced::default();
        let mut st = shared.lock();
        if st.poisoned {
            // Poisoned meanwhile by another thread (a failed directory fsync after deleting
            // covered segments): nothing more is reported durable, this batch included. Its
            // segment may be one this batch rotated into, whose name only a directory fsync
            // after the failed one vouched for, which proves nothing.
            return;
        }
        st.written = written;
        st.durable = written;
        st.durable_bytes = written_bytes;
        if st.durable_waiters > 0 {
            shared.durable_cv.notify_all();
        }
        drop(st);
        if let Some(notify) = &shared.notify {
            notify(DurableEvent::Durable(written));
        }
    }
}

/// A write or fdatasync failed: nothing after the last durable seq will ever be reported durable.
fn poison(shared: &Shared, e: &WalError) {
    let event = e.after_syncer_failure();
    tracing::error!(dir = %shared.dir.display(), error = %e, reopenable = event != DurableEvent::Poisoned, "wal write failed; shard poisoned");
    let mut st = shared.lock();
    st.poisoned = true;
    // A permanent failure stays the answer: a later reopenable one (the syncer's failed write
    // after a failed directory fsync of `delete_through`) must not make the shard reopenable.
    if st.failure != Some(DurableEvent::Poisoned) {
        st.failure = Some(event);
    }
    st.pending.clear();
    st.pending_records = 0;
    shared.durable_cv.notify_all();
    drop(st);
    if let Some(notify) = &shared.notify {
        notify(event);
    }
}

fn count_records(mut buf: &[u8]) -> u64 {
    let mut n = 0;
    while let Some(total) = record::framed_len(buf) {
        buf = &buf[total..];
        n += 1;
    }
    n
}

/// Write `data` at `offset` followed, if `room` allows, by [`record::END_MARKER`], in one
/// `pwritev` where the kernel takes it all (the marker is overwritten by the next write).
fn write_with_end_marker(file: &File, data: &[u8], offset: u64, room: u64) -> std::io::Result<()> {
    use std::io::IoSlice;
    let with_marker = data.len() + record::HEADER_LEN;
    if with_marker as u64 > room {
        return file.write_all_at(data, offset);
    }
    let iov = [IoSlice::new(data), IoSlice::new(&record::END_MARKER)];
    let offset_arg = i64::try_from(offset).map_err(std::io::Error::other)?;
    let done = loop {
        match nix::sys::uio::pwritev(file, &iov, offset_arg) {
            Err(nix::errno::Errno::EINTR) => continue,
            r => break r.map_err(std::io::Error::from)?,
        }
    };
    if done < with_marker {
        finish_short_write(file, data, offset, done)?;
    }
    Ok(())
}

/// A write of `data` and the end marker at `offset` of which only the first `done` bytes
/// reached the file (a short `pwritev`): the rest of both parts, with plain writes.
fn finish_short_write(file: &File, data: &[u8], offset: u64, done: usize) -> std::io::Result<()> {
    let mut all = Vec::with_capacity(data.len() + record::HEADER_LEN - done);
    all.extend_from_slice(data.get(done..).unwrap_or_default());
    let marker_from = done.saturating_sub(data.len());
    all.extend_from_slice(&record::END_MARKER[marker_from..]);
    file.write_all_at(&all, offset + done as u64)
}

/// A pre-zeroed spare segment: its path, its file and its size.
type Spare = (PathBuf, File, u64);

/// The syncer's exclusive view of the active segment, plus its share of the segment table.
struct SegmentWriter {
    dir: PathBuf,
    sizing: SegmentSizing,
    /// Shared with [`WalShard::delete_segments_through`]; the writer only adds to it.
    table: Arc<Mutex<SegmentTable>>,
    /// Shared with [`WalShard::delete_segments_through`]: see [`DirSync`].
    dir_sync: DirSync,
    active: Option<Active>,
    /// A pre-zeroed segment being prepared in the background for the next rotation.
    spare: Option<JoinHandle<Result<Spare, ZeroedError>>>,
}

struct Active {
    name: SegmentName,
    file: File,
    capacity: u64,
    offset: u64,
    /// Written since its last fdatasync.
    dirty: bool,
}

impl Drop for SegmentWriter {
    /// A spare still being zero-filled must not outlive the shard: a close's removal of the
    /// covered log, which runs right after, would miss a file created after it. Its file goes
    /// too (an open deletes spares anyway).
    fn drop(&mut self) {
        if let Some(Ok(Ok((path, _, _)))) = self.spare.take().map(JoinHandle::join) {
            let _ = fs::remove_file(path);
        }
    }
}

impl SegmentWriter {
    /// `last`: the newest segment found by recovery (name, path, size), if any.
    fn resume(
        dir: &Path,
        sizing: SegmentSizing,
        last: Option<(SegmentName, PathBuf, u64)>,
        write_offset: u64,
        table: Arc<Mutex<SegmentTable>>,
    ) -> Result<SegmentWriter, WalError> {
        let active = match last {
            Some((name, path, size)) => {
                let file = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(&path)
                    .map_err(WalError::io("opening active segment"))?;
                Some(Active {
                    name,
                    file,
                    capacity: size,
                    offset: write_offset,
                    dirty: false,
                })
            }
            None => None,
        };
        Ok(SegmentWriter {
            dir: dir.to_path_buf(),
            sizing,
            table,
            dir_sync: DirSync::default(),
            active,
            spare: None,
        })
    }

    /// Make sure there is an active segment with room for `need` bytes, rotating if not.
    fn ensure_active(&mut self, first_seq: u64, need: u64) -> Result<(), WalError> {
        if let Some(a) = &self.active
            && a.capacity - a.offset >= need.max(1)
        {
            return Ok(());
        }
        self.rotate(first_seq, need)
    }

    /// Seal the active segment (if any) and start a new one named after `first_seq`, with room
    /// for `need` bytes.
    fn rotate(&mut self, first_seq: u64, need: u64) -> Result<(), WalError> {
        // A sealed segment must be whole on disk before any later segment exists: recovery
        // treats a bad record in a sealed segment as corruption, not as a torn tail. Under the
        // relaxed policy the active segment may hold unsynced records from earlier batches.
        self.sync()?;
        let prev = self.active.as_ref().map(|a| a.capacity);
        let size = self.sizing.next(prev, need);
        // An empty segment with no room for this record (the marker of a cleanly closed log, say)
        // would start at the new one's seq: it is replaced. (An empty segment with an older name,
        // left behind by a checkpoint ahead of the log, is sealed like any other.)
        let replaced = self
            .active
            .as_ref()
            .filter(|a| a.offset == 0 && a.name.first_seq == first_seq)
            .map(|a| a.name);
        let name = loop {
            let name = SegmentName::fresh(first_seq);
            if Some(name) != replaced {
                break name;
            }
        };
        let path = self.dir.join(name.file_name());
        let ready = match self.take_recycled(&path, size.max(need))? {
            Some(reused) => Some(reused),
            None => self.take_spare(&path, size.max(need))?,
        };
        let (file, capacity) = match ready {
            Some(s) => s,
            None => (
                create_zeroed(&path, size).map_err(ZeroedError::into_wal)?,
                size,
            ),
        };
        // Under the directory's fsync lock, as a deletion's fsync of it is ([`DirSync`]).
        sync_dir_locked(&self.dir_sync, || sync_dir_entries(&self.dir))?;
        if let Some(old) = replaced {
            // Only once the replacement is durably named, so that a failure or crash before
            // never leaves the log without its last segment. A crash between leaves both, and
            // recovery removes the empty one; so does the next open if this removal fails.
            if let Err(e) = fs::remove_file(self.dir.join(old.file_name())) {
                tracing::warn!(dir = %self.dir.display(), error = %e, "could not remove the empty segment just replaced; the next open does");
            }
        }
        lock_table(&self.table).push(name, capacity, replaced.is_some());
        self.active = Some(Active {
            name,
            file,
            capacity,
            offset: 0,
            dirty: false,
        });
        Ok(())
    }

    /// The recycled segment, renamed to `path`, if there is one of at least `size` bytes, with a
    /// zero header written and synced at its start (so that, before its first write, it reads as
    /// an empty segment rather than a torn one). A failure to rename, open or write it just
    /// means a fresh segment instead; a failed fsync is one like any other: it stops the shard.
    fn take_recycled(&mut self, path: &Path, size: u64) -> Result<Option<(File, u64)>, WalError> {
        let from = self.dir.join(RECYCLED_NAME);
        // Only the bookkeeping and the rename under the table's lock (a deletion may be about to
        // recycle another file); the fdatasync after it, which the actor's `wal_bytes` would
        // otherwise wait for, outside.
        let renamed = {
            let mut table = lock_table(&self.table);
            let Some(kept) = table.recycled.filter(|kept| *kept >= size) else {
                return Ok(None);
            };
            table.recycled = None;
            fs::rename(&from, path).map(|()| kept)
        };
        let opened = renamed.and_then(|kept| {
            let file = OpenOptions::new().read(true).write(true).open(path)?;
            file.write_all_at(&record::END_MARKER, 0)?;
            Ok((file, kept))
        });
        let (file, kept) = match opened {
            Ok(opened) => opened,
            Err(e) => {
                tracing::warn!(dir = %self.dir.display(), error = %e, "could not reuse a recycled wal segment; creating a new one");
                // Whatever of it is at `path` (nothing, if the rename failed: then the file
                // still at `from` may already be another recycled one, put there since the
                // lock was let go, and stays).
                let _ = fs::remove_file(path);
                return Ok(None);
            }
        };
        let synced = if crate::failpoint::injected_new_segment_sync_failure(&self.dir) {
            Err(std::io::Error::other(
                "injected fsync failure of a new segment",
            ))
        } else {
            file.sync_data()
        };
        if let Err(e) = synced {
            let _ = fs::remove_file(path);
            return Err(WalError::io("fdatasync of a reused segment")(e));
        }
        cube_metrics::WAL_SEGMENTS_RECYCLED.inc();
        Ok(Some((file, kept)))
    }

    /// The pre-zeroed spare, renamed to `path`, if one was prepared and has at least `size`
    /// bytes. A spare that could not be filled is no matter (a fresh segment is made instead);
    /// one whose fsync failed stops the shard, as any failed fsync of a segment does.
    fn take_spare(&mut self, path: &Path, size: u64) -> Result<Option<(File, u64)>, WalError> {
        Ok(match self.spare.take().map(JoinHandle::join) {
            Some(Ok(Ok((spare_path, file, spare_size)))) if spare_size >= size => {
                fs::rename(&spare_path, path).map_err(WalError::io("activating spare segment"))?;
                Some((file, spare_size))
            }
            Some(Ok(Ok((spare_path, _, _)))) => {
                let _ = fs::remove_file(spare_path);
                None
            }
            Some(Ok(Err(e @ ZeroedError::Syncing(_)))) => return Err(e.into_wal()),
            Some(Ok(Err(ZeroedError::Filling(e)))) => {
                tracing::debug!(dir = %self.dir.display(), error = %e, "could not prepare a spare wal segment; creating one now");
                None
            }
            Some(Err(_)) | None => None,
        })
    }

    /// Start pre-zeroing the next segment once the active one is half full.
    fn maybe_prepare_spare(&mut self, next_first_hint: u64) {
        let Some(a) = &self.active else { return };
        if self.spare.is_some() || a.offset < a.capacity / 2 {
            return;
        }
        let size = self.sizing.next(Some(a.capacity), 0);
        if lock_table(&self.table)
            .recycled
            .is_some_and(|kept| kept >= size)
        {
            return;
        }
        let path = spare_path(&self.dir, next_first_hint);
        self.spare = std::thread::Builder::new()
            .name("wal-prealloc".into())
            .spawn(move || create_zeroed(&path, size).map(|f| (path, f, size)))
            .ok();
    }

    /// Write a batch of framed, unsalted records starting at `first_seq`, rotating as needed
    /// (which fdatasyncs the segment being sealed); each record is salted for the segment it goes
    /// to. Records never straddle segments. The active segment is left unsynced: see
    /// [`SegmentWriter::sync`].
    fn write(&mut self, batch: &mut [u8], first_seq: u64) -> Result<(), WalError> {
        if crate::failpoint::injected_write_failure(&self.dir) {
            return Err(WalError::io("writing batch")(std::io::Error::other(
                "injected write failure",
            )));
        }
        let mut rest = batch;
        let mut seq = first_seq;
        while !rest.is_empty() {
            let first_len = record::framed_len(rest).unwrap_or(rest.len()) as u64;
            self.ensure_active(seq, first_len)?;
            let Some(active) = self.active.as_mut() else {
                return Err(WalError::Closed);
            };
            // Take as many whole records as fit.
            let room = active.capacity - active.offset;
            let (mut fit, mut n) = (0usize, 0u64);
            while let Some(len) = record::framed_len(&rest[fit..]) {
                if (fit + len) as u64 > room {
                    break;
                }
                record::seal(&mut rest[fit..], active.name.salt);
                fit += len;
                n += 1;
            }
            if fit == 0 {
                // ensure_active guarantees room for the first record; never loop forever.
                return Err(WalError::Io {
                    op: "writing batch",
                    source: std::io::Error::other("record does not fit a fresh segment"),
                });
            }
            write_with_end_marker(&active.file, &rest[..fit], active.offset, room)
                .map_err(WalError::io("writing batch"))?;
            active.offset += fit as u64;
            active.dirty = true;
            rest = &mut std::mem::take(&mut rest)[fit..];
            seq += n;
        }
        self.maybe_prepare_spare(seq);
        Ok(())
    }

    /// fdatasync the active segment if anything was written to it since its last sync. Earlier
    /// segments were synced when they were sealed, so afterwards everything written is durable.
    fn sync(&mut self) -> Result<(), WalError> {
        if let Some(a) = &mut self.active
            && a.dirty
        {
            if crate::failpoint::injected_sync_failure(&self.dir) {
                return Err(WalError::io("fdatasync")(std::io::Error::other(
                    "injected fdatasync failure",
                )));
            }
            crate::failpoint::injected_sync_delay(&self.dir);
            a.file.sync_data().map_err(WalError::io("fdatasync"))?;
            a.dirty = false;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// However far a short `pwritev` got (inside the data, at its end, inside the marker), the
    /// file ends up with the whole data and the whole end marker after it, and nothing else
    /// changed.
    #[test]
    fn a_short_write_is_finished_whole_marker_included() {
        let data: Vec<u8> = (1..=40).collect();
        let offset = 7u64;
        let whole = [&data[..], &record::END_MARKER[..]].concat();
        for done in [0, 1, 39, 40, 41, whole.len() - 1] {
            let dir = tempfile::tempdir().unwrap();
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(dir.path().join("seg"))
                .unwrap();
            // Not zeros: a marker byte left unwritten would show.
            let len = offset as usize + whole.len() + 5;
            file.write_all_at(&vec![0xEE; len], 0).unwrap();
            // What the short pwritev wrote.
            file.write_all_at(&whole[..done], offset).unwrap();
            finish_short_write(&file, &data, offset, done).unwrap();
            let got = std::fs::read(dir.path().join("seg")).unwrap();
            let at = offset as usize;
            assert_eq!(&got[at..at + whole.len()], &whole[..], "done = {done}");
            assert!(
                got[..at]
                    .iter()
                    .chain(&got[at + whole.len()..])
                    .all(|&b| b == 0xEE),
                "done = {done}: bytes outside the write changed"
            );
        }
    }
}
