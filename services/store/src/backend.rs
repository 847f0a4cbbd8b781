//! Where a tenant's applied state lives: a small ordered key-value interface and its
//! implementations.
//!
//! The rest of the store sees only [`StateBackend`]: ordered keys, atomic batches, range scans
//! and an explicit flush (the checkpoint). [`FjallBackend`] (an LSM tree) is what cubed uses;
//! [`SledBackend`] is what it used before, kept to migrate old state directories and for
//! comparison (sled is beta and unmaintained upstream, and its apply cost 3-4x fjall's: the
//! measurements are in docs/benchmarks.md). [`MemBackend`] serves the state machine's tests.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::RwLock;

/// A storage failure. The text is for the server log only; clients see a generic message.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct BackendError(pub String);

/// How a [`BackendError`] for stored data that failed its checks when read begins (a damaged
/// block, one that does not decompress or decode): no retry reads it.
const CORRUPT: &str = "the state store's data is damaged";

/// How a [`BackendError`] for a write refused for lack of space or quota (ENOSPC, EDQUOT)
/// begins.
const NO_SPACE: &str = "no space left for the state store";

impl BackendError {
    /// Whether stored data failed its checks when read (corrupt: DATA_LOSS), as opposed to a
    /// read that failed (I/O, a poisoned store: worth a retry).
    pub fn is_corrupt(&self) -> bool {
        self.0.starts_with(CORRUPT)
    }

    /// Whether the store's open failed because a write found no space (or quota) left.
    pub fn is_no_space(&self) -> bool {
        self.0.starts_with(NO_SPACE)
    }
}

/// One change in an atomic batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchOp {
    Put(Vec<u8>, Vec<u8>),
    Remove(Vec<u8>),
}

/// Pairs in ascending key order.
pub type RangeIter<'a> = Box<dyn Iterator<Item = Result<(Vec<u8>, Vec<u8>), BackendError>> + 'a>;

/// Reads of ordered keys: a [`StateBackend`], or a snapshot of one
/// ([`StateBackend::snapshot`]).
pub trait StateRead: Send + Sync {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, BackendError>;
    /// Pairs with `start <= key < end`, ascending.
    fn range(&self, start: &[u8], end: &[u8]) -> RangeIter<'_>;
    /// The pair with the greatest key below `key`.
    #[allow(clippy::type_complexity)]
    fn get_lt(&self, key: &[u8]) -> Result<Option<(Vec<u8>, Vec<u8>)>, BackendError>;
}

/// An ordered key-value store with atomic batches and an explicit durability point.
///
/// Contract the recovery design relies on: after a crash the store comes back as of some prefix
/// of the applied batches (each batch all or nothing), and everything applied before a
/// successful [`StateBackend::flush`] started is in that prefix.
///
/// Its own reads ([`StateRead`]) may see a batch being applied in part (fjall inserts a batch
/// key by key); [`StateBackend::snapshot`] sees whole batches only.
pub trait StateBackend: StateRead + std::fmt::Debug {
    /// A view of what is applied now that sees only whole batches, for a reader that needs
    /// several keys to agree; `None` where the store's own reads already do (its apply is
    /// atomic to readers).
    fn snapshot(&self) -> Option<Box<dyn StateRead + '_>> {
        None
    }
    /// Apply every op or none.
    fn apply(&self, batch: Vec<BatchOp>) -> Result<(), BackendError>;
    /// Make everything applied so far durable.
    fn flush(&self) -> Result<(), BackendError>;
    /// Bytes on disk (approximate; for stats).
    fn size_on_disk(&self) -> u64;
    /// Whether an [`StateBackend::apply`] now would go ahead without waiting for the store to
    /// write memory out (its write buffers within their budget) or to seal a full memtable.
    /// Never blocks: a tenant's actor asks this before it applies, and holds its applies while
    /// the answer is no, so that it does not wait on the thread it shares with other tenants.
    /// May start work that makes room on a thread of its own (sealing a full memtable). Fails
    /// once the store has failed for good (no room will ever come).
    fn has_room(&self) -> Result<bool, BackendError> {
        self.room_as_is()
    }
    /// [`StateBackend::has_room`] without starting anything: for a closing tenant, whose last
    /// applies do whatever sealing they need themselves.
    fn room_as_is(&self) -> Result<bool, BackendError> {
        Ok(true)
    }
    /// Notified when work that [`StateBackend::has_room`] started has ended (a seal), so that
    /// a caller holding its applies may ask again before its next poll. A notification may
    /// also come early, or late; the caller polls anyway.
    fn room_notify(&self) -> Option<std::sync::Arc<tokio::sync::Notify>> {
        None
    }
    /// Block until [`StateBackend::has_room`] (for threads that may block: a tenant's close on
    /// the blocking pool), for at most [`APPLY_STALL_LIMIT`].
    fn wait_for_room(&self) -> Result<(), BackendError> {
        Ok(())
    }
}

/// sled's segment (and write-buffer) size. NOTE: fixed when a database is created; sled refuses
/// to open a database with a different one, so changing it needs a migration.
const SEGMENT_BYTES: usize = 1 << 16;

/// A tenant's state in its own sled database.
#[derive(Debug)]
pub struct SledBackend {
    db: sled::Db,
}

impl SledBackend {
    /// Open (or create) the database in `dir` with a page cache of `cache_bytes`. sled's own
    /// periodic flush is off: data is made durable by the WAL first and by checkpoints later, so
    /// background flushes would only add I/O.
    pub fn open(dir: &Path, cache_bytes: u64) -> Result<SledBackend, BackendError> {
        let db = sled::Config::new()
            .path(dir)
            .cache_capacity(cache_bytes)
            .flush_every_ms(None)
            // sled's write buffer, allocated per open database: its 512 KiB default dominated
            // the memory of many small open tenants (docs/benchmarks.md).
            .segment_size(SEGMENT_BYTES)
            .open()
            .map_err(|e| BackendError(format!("opening state database: {e}")))?;
        Ok(SledBackend { db })
    }

    /// Whether an open failed because another handle still holds the database's lock (a
    /// passivated tenant whose last reader has not finished yet).
    pub fn is_locked(e: &BackendError) -> bool {
        e.0.contains("WouldBlock") || e.0.contains("lock") || e.0.contains("temporarily")
    }
}

fn sled_err(e: sled::Error) -> BackendError {
    BackendError(e.to_string())
}

impl StateRead for SledBackend {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, BackendError> {
        Ok(self.db.get(key).map_err(sled_err)?.map(|v| v.to_vec()))
    }

    fn range(&self, start: &[u8], end: &[u8]) -> RangeIter<'_> {
        Box::new(
            self.db
                .range(start.to_vec()..end.to_vec())
                .map(|r| r.map(|(k, v)| (k.to_vec(), v.to_vec())).map_err(sled_err)),
        )
    }

    fn get_lt(&self, key: &[u8]) -> Result<Option<(Vec<u8>, Vec<u8>)>, BackendError> {
        Ok(self
            .db
            .get_lt(key)
            .map_err(sled_err)?
            .map(|(k, v)| (k.to_vec(), v.to_vec())))
    }
}

impl StateBackend for SledBackend {
    fn apply(&self, batch: Vec<BatchOp>) -> Result<(), BackendError> {
        let mut b = sled::Batch::default();
        for op in batch {
            match op {
                BatchOp::Put(k, v) => b.insert(k, v),
                BatchOp::Remove(k) => b.remove(k),
            }
        }
        self.db.apply_batch(b).map_err(sled_err)
    }

    fn flush(&self) -> Result<(), BackendError> {
        self.db.flush().map(|_| ()).map_err(sled_err)
    }

    fn size_on_disk(&self) -> u64 {
        self.db.size_on_disk().unwrap_or(0)
    }
}

/// Memtable size of a tenant's state partition: writes are absorbed here and flushed to sorted
/// segment files by fjall's flush worker. Up to `--max-open-tenants` of them live at once, but a
/// memtable only takes the memory of what was written into it.
/// 16 MiB rather than 4: fewer, larger level-0 runs for compaction to merge (a 1 GiB bulk load of
/// 64 KiB values: 76-82 -> 96-101 MiB/s, docs/benchmarks.md).
/// NOTE: fjall records a partition's options (this size, the compaction strategy) when it is
/// created; a state store created by an earlier build keeps its own (4 MiB or leveled).
const FJALL_MEMTABLE_BYTES: u32 = 16 << 20;
/// Sealed memtables (waiting for fjall's flush worker) above which an apply waits for flushes.
/// Counted as memtables, not as fjall's journal files: batches do not go to the journal (see
/// [`FjallBackend`]), and an empty journal found at open is deleted only after some later flush,
/// so a journal count can stay over any budget with nothing left to flush. fjall's own
/// byte-based journal stall at its minimum (24 MiB) stopped writes for 100 ms at every rotation.
const SEALED_MEMTABLE_BUDGET: usize = 2;
/// fjall's size of a preallocated journal file, which its own journal limit counts.
const FJALL_JOURNAL_FILE_BYTES: u64 = 32 << 20;
/// Memtables (active + sealed) per tenant above which an apply waits for a flush.
const WRITE_BUFFER_BUDGET: u64 = 48 << 20;
/// fjall's own limits, a backstop only: [`FjallBackend::wait_for_room`] keeps below the budgets
/// above. fjall's stalls wait for its flush worker without ever looking at whether that worker
/// failed (a full disk), so an apply caught in one would hang on the actor's thread for good.
const FJALL_JOURNAL_LIMIT: u64 = 4 * (SEALED_MEMTABLE_BUDGET as u64 + 1) * FJALL_JOURNAL_FILE_BYTES;
const FJALL_WRITE_BUFFER_LIMIT: u64 = 4 * WRITE_BUFFER_BUDGET;
/// Longest a tenant's applies wait for flushes to bring it back under its budgets before they
/// fail (and the tenant is poisoned, reopenably): a flush worker making no progress for this
/// long is stuck, not slow.
pub(crate) const APPLY_STALL_LIMIT: std::time::Duration = std::time::Duration::from_secs(30);
/// How often a flush, or an apply waiting for room, looks whether fjall has written memtables
/// out (a tenant's actor holding its applies asks again this often).
pub(crate) const FLUSH_POLL: std::time::Duration = std::time::Duration::from_millis(2);

/// A tenant's state in its own fjall keyspace (an LSM tree): one partition, one flush and one
/// compaction worker. Batches go to the memtable only, not to fjall's journal (a patched fjall,
/// `Batch::without_journal`, vendor/fjall/CUBE-PATCH.md): the WAL is the log, and writing every
/// byte a second time into a journal nobody needs cost a 1 GiB bulk load of 64 KiB values about a
/// sixth of its throughput (docs/benchmarks.md). After a crash the store holds what its flushed
/// memtables hold; fjall registers flushes oldest first, so that is a prefix of whole batches,
/// and [`crate::state::TenantState::applied_seq`] (written in every batch) says where the WAL
/// replay starts. fjall takes no lock on its directory, so this backend holds one (`LOCK`, an
/// advisory file lock) for as long as it lives.
pub struct FjallBackend {
    /// Always `Some` until drop, which hands it to a thread of its own (see `Drop`).
    open: Option<OpenKeyspace>,
    /// The state directory: tests make its flush fail (`cube_wal::failpoint`).
    dir: std::path::PathBuf,
    /// Set while a memtable seal runs, on any thread: the one `has_room` starts
    /// ([`FjallBackend::seal_off_thread`]), a caller that may block
    /// ([`FjallBackend::seal_here`]), a checkpoint's rotation. A rotation holds fjall's journal
    /// lock, which every apply takes too, so `has_room` answers no meanwhile.
    sealing: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// The seal thread `has_room` started last, joined for its outcome. Locked only briefly
    /// (never across a rotation or a join).
    seal: std::sync::Mutex<Option<Seal>>,
    /// Notified as a seal thread ends ([`StateBackend::room_notify`]): a seal takes a fraction
    /// of the actor's 2-ms poll here, and a bulk load seals every 16 MiB.
    sealed: std::sync::Arc<tokio::sync::Notify>,
    /// fjall's level-0 write stall, taken as holds ([`FjallBackend::stalled`]). Locked only by
    /// `has_room`'s caller, the tenant's actor.
    stall: std::sync::Mutex<Stall>,
}

/// What [`FjallBackend::stalled`] keeps between applies.
#[derive(Default)]
struct Stall {
    /// Sleeps fjall would have made the applies so far, not yet held for.
    owed: std::time::Duration,
    /// The end of the hold under way.
    until: Option<std::time::Instant>,
}

/// A memtable seal on its own thread: `rotate_memtable`'s result.
type Seal = std::thread::JoinHandle<Result<bool, fjall::Error>>;

/// A flag held (here [`FjallBackend::sealing`], a tenant directory's idle pass): cleared on
/// drop, a panic's unwinding included.
pub(crate) struct FlagHeld(pub(crate) std::sync::Arc<std::sync::atomic::AtomicBool>);

impl Drop for FlagHeld {
    fn drop(&mut self) {
        self.0.store(false, std::sync::atomic::Ordering::Release);
    }
}

/// What a drop of [`FjallBackend`] closes, in this order: a seal thread still running (it
/// writes fjall's journal files) ends, then the keyspace closes and its lock is let go.
struct Closing {
    seal: Option<Seal>,
    open: Option<OpenKeyspace>,
}

impl Drop for Closing {
    fn drop(&mut self) {
        if let Some(seal) = self.seal.take() {
            let _ = seal.join();
        }
        drop(self.open.take());
    }
}

struct OpenKeyspace {
    part: fjall::PartitionHandle,
    keyspace: fjall::Keyspace,
    // Declared last: released only after the keyspace has stopped its threads and closed its
    // files.
    _lock: std::fs::File,
}

impl Drop for FjallBackend {
    /// Closing a keyspace waits for its background threads, and its monitor thread sleeps 250
    /// ms between rounds: done on the actor's thread, every passivation would stall the other
    /// tenants of that thread for up to a quarter second. So the close (and the release of the
    /// lock after it) happens on a short-lived thread; a reopen waits for the lock.
    fn drop(&mut self) {
        if self.open.is_some() {
            let closing = self.closing();
            // When no thread can be had, the closure (and `closing` in it) is dropped here.
            let spawned = std::thread::Builder::new()
                .name("fjall-close".into())
                .spawn(move || drop(closing));
            if let Err(e) = spawned {
                tracing::warn!(error = %e, "no thread to close a state store on; closing inline");
            }
        }
    }
}

impl std::fmt::Debug for FjallBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FjallBackend").finish_non_exhaustive()
    }
}

fn fjall_err(e: impl std::fmt::Display) -> BackendError {
    BackendError(e.to_string())
}

/// An error of opening the store, `what` failing: one refused for lack of space is told apart.
fn open_err(what: &str, e: fjall::Error) -> BackendError {
    let io = match &e {
        fjall::Error::Io(io) | fjall::Error::Storage(lsm_tree::Error::Io(io)) => Some(io),
        _ => None,
    };
    if io.is_some_and(cube_wal::is_no_space) {
        BackendError(format!("{NO_SPACE}: {what}: {e}"))
    } else {
        BackendError(format!("{what}: {e}"))
    }
}

/// A read's error: stored data that failed its checks (the block checksum the vendored
/// lsm-tree verifies, decompression, decoding) is told apart as corrupt. A failed read of the
/// file (EIO) is not, even where it surfaces as a decoding error (a block header is decoded
/// straight from the file); a block cut short (`UnexpectedEof`) is.
fn read_err(e: impl Into<fjall::Error>) -> BackendError {
    use lsm_tree::{DecodeError as D, Error as L};
    let e: fjall::Error = e.into();
    let damaged = |d: &D| !matches!(d, D::Io(io) if io.kind() != std::io::ErrorKind::UnexpectedEof);
    let corrupt = match &e {
        fjall::Error::Decode(d) | fjall::Error::Storage(L::Decode(d)) => damaged(d),
        fjall::Error::InvalidVersion(_)
        | fjall::Error::Storage(
            L::InvalidChecksum(_) | L::Decompress(_) | L::InvalidVersion(_) | L::Unrecoverable,
        ) => true,
        _ => false,
    };
    if corrupt {
        BackendError(format!("{CORRUPT}: {e}"))
    } else {
        fjall_err(e)
    }
}

/// The message [`FjallBackend::open`] fails with while another handle holds the directory.
const LOCKED: &str = "state directory is locked by another open handle";
/// What [`FjallBackend::open`]'s failure starts with when the sync of its partition's directory
/// failed ([`FjallBackend::is_failed_sync`]).
const DIR_SYNC_FAILED: &str = "syncing the state partition's directory";

impl FjallBackend {
    /// Open (or create) the keyspace in `dir` with a block cache of `cache_bytes`.
    pub fn open(dir: &Path, cache_bytes: u64) -> Result<FjallBackend, BackendError> {
        Self::open_with(dir, cache_bytes, 1)
    }

    /// [`FjallBackend::open`] with `compaction_workers` (tests: none, so that level-0 runs
    /// pile up).
    fn open_with(
        dir: &Path,
        cache_bytes: u64,
        compaction_workers: usize,
    ) -> Result<FjallBackend, BackendError> {
        // Failed merges counted in a metric; the first open sets it for the process.
        let _ = fjall::compaction::ON_FAILURE.set(|| cube_metrics::STATE_COMPACTIONS_FAILED.inc());
        std::fs::create_dir_all(dir).map_err(fjall_err)?;
        let lock = std::fs::File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join("LOCK"))
            .map_err(|e| BackendError(format!("opening the state lock file: {e}")))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => return Err(BackendError(LOCKED.into())),
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(BackendError(format!("locking the state directory: {e}")));
            }
        }
        let keyspace = fjall::Config::new(dir)
            .cache_size(cache_bytes)
            .flush_workers(1)
            .compaction_workers(compaction_workers)
            .manual_journal_persist(true)
            .max_journaling_size(FJALL_JOURNAL_LIMIT)
            .max_write_buffer_size(FJALL_WRITE_BUFFER_LIMIT)
            .open()
            .map_err(|e| open_err("opening state keyspace", e))?;
        let part = keyspace
            .open_partition(
                "state",
                fjall::PartitionCreateOptions::default()
                    .manual_journal_persist(true)
                    .max_memtable_size(FJALL_MEMTABLE_BYTES)
                    // Size-tiered rather than fjall's default leveled compaction: leveled
                    // rewrote each value many times on its way down the levels; a 1 GiB bulk
                    // load of 64 KiB values went from 109-112 to 149-158 MiB/s
                    // (docs/benchmarks.md). Point reads check more runs (bloom filters skip
                    // most); 64-client reads, writes and scans measured within their spread.
                    // The patched lsm-tree also merges a slowly written tenant's small level-0
                    // runs early (vendor/lsm-tree/CUBE-PATCH.md, change 4).
                    .compaction_strategy(fjall::compaction::Strategy::SizeTiered(
                        fjall::compaction::SizeTiered::default(),
                    )),
            )
            .map_err(|e| open_err("opening state partition", e))?;
        // A write that fills the memtable does not seal it (fjall would, on the writer's thread,
        // with two or three fsyncs of its journal files: the thread a tenant's actor shares
        // with other tenants). `has_room` seals it on a thread of its own, `apply` where no
        // `has_room` came first (vendor/fjall/CUBE-PATCH.md, change 5).
        part.set_rotate_on_overflow(false);
        // Nor does a write sleep while level 0 has many runs (fjall's write stall, on the same
        // thread): `has_room` holds the tenant's applies off the thread instead (change 6).
        part.set_write_stall(false);
        // fjall creates a new partition's directory without fsyncing the directory that names
        // it; a power cut could then lose the whole partition (docs/durability.md). Synced at
        // every open, not only at the one that created it: a kill -9 or a failed sync between
        // the creation and this sync would otherwise leave it unsynced for good (as would fjall
        // replacing a partition it found without a manifest). So are the partition's own
        // directory (its `levels` manifest is replaced by a rename, then the directory synced)
        // and its `segments/`: a kill -9 between such a rename and its directory's fsync leaves
        // a manifest this boot reads from the page cache, and an open whose replay has nothing
        // to flush would otherwise delete the log segments it covers with that manifest not
        // yet durable. Three small fsyncs per open.
        for sub in [
            "partitions",
            "partitions/state",
            "partitions/state/segments",
        ] {
            match std::fs::File::open(dir.join(sub)) {
                Ok(d) => d
                    .sync_all()
                    .map_err(|e| BackendError(format!("{DIR_SYNC_FAILED}: {e}")))?,
                // Nothing of the partition's to name (a layout without that level).
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && sub != "partitions" => {}
                // Not a failed sync (no descriptor left, say): an open a retry may get past.
                Err(e) => {
                    return Err(BackendError(format!(
                        "opening the state partition's directory {sub}: {e}"
                    )));
                }
            }
        }
        Ok(FjallBackend {
            open: Some(OpenKeyspace {
                part,
                keyspace,
                _lock: lock,
            }),
            dir: dir.to_path_buf(),
            sealing: Default::default(),
            seal: std::sync::Mutex::new(None),
            sealed: Default::default(),
            stall: Default::default(),
        })
    }

    /// Whether an open failed because another handle still holds the directory (a passivated
    /// tenant whose last reader has not finished yet).
    pub fn is_locked(e: &BackendError) -> bool {
        e.0 == LOCKED
    }

    /// Whether an open failed because a sync failed (which a retry must not take for a
    /// success: the kernel reports a writeback error once).
    pub fn is_failed_sync(e: &BackendError) -> bool {
        e.0.starts_with(DIR_SYNC_FAILED)
    }

    /// Close now, on this thread: when returning, the files are closed and the lock released.
    pub fn close(mut self) {
        drop(self.closing());
    }

    fn closing(&mut self) -> Closing {
        let seal = self.seal_handle().take();
        Closing {
            seal,
            open: self.open.take(),
        }
    }

    fn seal_handle(&self) -> std::sync::MutexGuard<'_, Option<Seal>> {
        self.seal
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether the active memtable is past [`FJALL_MEMTABLE_BYTES`], where fjall would have
    /// sealed it (at the size recorded when the partition was created: a store created by an
    /// earlier build with 4 MiB memtables now seals them at 16 MiB too).
    fn memtable_full(&self, ks: &OpenKeyspace) -> bool {
        use fjall::AbstractTree;
        ks.part.tree.active_memtable_size() > FJALL_MEMTABLE_BYTES
    }

    /// The outcome of a seal thread (a failed seal has poisoned the keyspace too).
    fn sealed(seal: Seal) -> Result<(), BackendError> {
        match seal.join() {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(BackendError(format!("sealing a full memtable: {e}"))),
            Err(_) => Err(BackendError("sealing a full memtable panicked".into())),
        }
    }

    /// Take [`FjallBackend::sealing`] for this thread, which may block: waits here for a seal
    /// running elsewhere to end (and takes the outcome of the last seal thread).
    fn take_sealing(&self) -> Result<FlagHeld, BackendError> {
        use std::sync::atomic::Ordering;
        loop {
            let ended = self.seal_handle().take();
            if let Some(seal) = ended {
                Self::sealed(seal)?;
            }
            if !self.sealing.swap(true, Ordering::AcqRel) {
                return Ok(FlagHeld(std::sync::Arc::clone(&self.sealing)));
            }
            std::thread::sleep(FLUSH_POLL);
        }
    }

    /// For a caller that must not block (a tenant's actor): `false` while a memtable seal
    /// runs anywhere, or when the active memtable is full, whose seal is then started on a
    /// thread of its own (inline only if no thread can be had); `true` when neither.
    fn seal_off_thread(&self) -> Result<bool, BackendError> {
        use std::sync::atomic::Ordering;
        if self.sealing.load(Ordering::Acquire) {
            return Ok(false);
        }
        // Held elsewhere only for a moment (a blocking caller taking a seal's outcome); this
        // thread does not wait even that.
        let mut slot = match self.seal.try_lock() {
            Ok(slot) => slot,
            Err(std::sync::TryLockError::WouldBlock) => return Ok(false),
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
        };
        // With `sealing` clear, a seal thread has done its work (and notified): the join
        // waits at most for the thread's exit.
        if let Some(ended) = slot.take() {
            Self::sealed(ended)?;
        }
        let ks = self.ks();
        if !self.memtable_full(ks) {
            return Ok(true);
        }
        if self.sealing.swap(true, Ordering::AcqRel) {
            return Ok(false);
        }
        let sealing = FlagHeld(std::sync::Arc::clone(&self.sealing));
        let part = ks.part.clone();
        let notify = std::sync::Arc::clone(&self.sealed);
        let spawned = std::thread::Builder::new()
            .name("fjall-seal".into())
            .spawn(move || {
                // What fjall's own seal does next, here rather than on the actor's thread: it
                // waits while level 0 has 32 runs or more (compaction far behind) or fjall's
                // journals are near their limit, and the tenant's applies stay held meanwhile
                // (at most `APPLY_STALL_LIMIT`).
                let sealed = part
                    .rotate_memtable()
                    .inspect(|_| part.stall_after_rotation());
                drop(sealing);
                notify.notify_one();
                sealed
            });
        match spawned {
            Ok(running) => {
                *slot = Some(running);
                Ok(false)
            }
            Err(e) => {
                // The closure, and the flag it held, is gone: seal here, holding it again.
                self.sealing.store(true, Ordering::Release);
                let _sealing = FlagHeld(std::sync::Arc::clone(&self.sealing));
                // No `stall_after_rotation` here: the actor's thread must not wait on it.
                tracing::warn!(error = %e, "no thread to seal a memtable on; sealing inline");
                ks.part.rotate_memtable().map_err(fjall_err)?;
                Ok(true)
            }
        }
    }

    /// fjall's write stall, off the thread: fjall would sleep before every write while level
    /// 0 has 20 to 29 runs (compaction behind: 1 µs at 20, doubling to 512 µs at 29), on the
    /// actor's thread that the tenant shares with other tenants. Instead each apply asked for
    /// adds that sleep to what is owed, and while [`FLUSH_POLL`] or more is owed the applies
    /// are held for one [`FLUSH_POLL`] at a time, which is paid off (`true` until it has
    /// passed): the same pace on average, in waits of the actor's own poll. Writes that do not
    /// ask (a replay, a close) are not slowed; level 0's hard limit (32 runs) still halts them
    /// at their memtable's seal.
    fn stalled(&self) -> bool {
        let mut stall = self
            .stall
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let now = std::time::Instant::now();
        if let Some(until) = stall.until {
            if now < until {
                return true;
            }
            stall.until = None;
        }
        if stall.owed >= FLUSH_POLL {
            stall.owed -= FLUSH_POLL;
            stall.until = Some(now + FLUSH_POLL);
            return true;
        }
        // This apply goes ahead, and owes its delay.
        stall.owed += self.ks().part.write_stall_delay();
        false
    }

    /// For a caller that may block: waits for a seal running elsewhere, then seals a full
    /// memtable here.
    fn seal_here(&self) -> Result<(), BackendError> {
        let _sealing = self.take_sealing()?;
        let ks = self.ks();
        if self.memtable_full(ks) {
            ks.part.rotate_memtable().map_err(fjall_err)?;
            ks.part.stall_after_rotation();
        }
        Ok(())
    }

    /// Poll until `done` while fjall's flush worker writes memtables out. Fails as soon as the
    /// keyspace is poisoned (that worker failed and will not come back), and after `limit` if
    /// one is given. fjall's own waits (`rotate_memtable_and_wait`, its write stalls) loop
    /// until the flush happens, whatever became of the worker.
    fn wait_for_flushes(
        &self,
        done: impl Fn(&OpenKeyspace) -> bool,
        limit: Option<std::time::Duration>,
    ) -> Result<(), BackendError> {
        let ks = self.ks();
        let deadline = limit.map(|l| std::time::Instant::now() + l);
        while !done(ks) {
            // `Buffer` only hands fjall's journal buffer to the OS; it fails once poisoned.
            ks.keyspace
                .persist(fjall::PersistMode::Buffer)
                .map_err(fjall_err)?;
            if deadline.is_some_and(|d| std::time::Instant::now() >= d) {
                use fjall::AbstractTree;
                return Err(BackendError(format!(
                    "state store flushes made no room in {} s (memtables {} bytes, {} sealed)",
                    limit.unwrap_or_default().as_secs(),
                    ks.keyspace.write_buffer_size(),
                    ks.part.tree.sealed_memtable_count()
                )));
            }
            std::thread::sleep(FLUSH_POLL);
        }
        Ok(())
    }

    /// The tenant's write stall, in place of fjall's: whether its memtables are within budget
    /// (in bytes, and sealed ones in number), with `slack` more sealed ones allowed.
    fn room(&self, ks: &OpenKeyspace, slack: usize) -> bool {
        use fjall::AbstractTree;
        ks.keyspace.write_buffer_size() <= WRITE_BUFFER_BUDGET
            && ks.part.tree.sealed_memtable_count() <= SEALED_MEMTABLE_BUDGET + slack
            && !cube_wal::failpoint::state_room_withheld(&self.dir)
    }

    fn ks(&self) -> &OpenKeyspace {
        // INVARIANT: `open` is Some from construction until drop.
        self.open
            .as_ref()
            .unwrap_or_else(|| unreachable!("used after drop"))
    }
}

impl StateRead for FjallBackend {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, BackendError> {
        Ok(self
            .ks()
            .part
            .get(key)
            .map_err(read_err)?
            .map(|v| v.to_vec()))
    }

    fn range(&self, start: &[u8], end: &[u8]) -> RangeIter<'_> {
        Box::new(
            self.ks()
                .part
                .range(start.to_vec()..end.to_vec())
                .map(|r| r.map(|(k, v)| (k.to_vec(), v.to_vec())).map_err(read_err)),
        )
    }

    fn get_lt(&self, key: &[u8]) -> Result<Option<(Vec<u8>, Vec<u8>)>, BackendError> {
        match self.ks().part.range(..key.to_vec()).next_back() {
            None => Ok(None),
            Some(r) => r
                .map(|(k, v)| Some((k.to_vec(), v.to_vec())))
                .map_err(read_err),
        }
    }
}

/// A fjall snapshot at the keyspace's visible seqno ([`StateBackend::snapshot`]): fjall raises
/// that seqno only once a batch's last key is in, so the snapshot sees whole batches only, and
/// it keeps reading them while later batches are applied, flushed and compacted (the patched
/// fjall and lsm-tree: vendor/fjall/CUBE-PATCH.md change 7, vendor/lsm-tree/CUBE-PATCH.md
/// change 6).
struct FjallSnapshot(fjall::Snapshot);

impl StateRead for FjallSnapshot {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, BackendError> {
        Ok(self.0.get(key).map_err(read_err)?.map(|v| v.to_vec()))
    }

    fn range(&self, start: &[u8], end: &[u8]) -> RangeIter<'_> {
        Box::new(
            self.0
                .range(start.to_vec()..end.to_vec())
                .map(|r| r.map(|(k, v)| (k.to_vec(), v.to_vec())).map_err(read_err)),
        )
    }

    fn get_lt(&self, key: &[u8]) -> Result<Option<(Vec<u8>, Vec<u8>)>, BackendError> {
        match self.0.range(..key.to_vec()).next_back() {
            None => Ok(None),
            Some(r) => r
                .map(|(k, v)| Some((k.to_vec(), v.to_vec())))
                .map_err(read_err),
        }
    }
}

impl StateBackend for FjallBackend {
    fn snapshot(&self) -> Option<Box<dyn StateRead + '_>> {
        Some(Box::new(FjallSnapshot(self.ks().part.snapshot_visible())))
    }

    fn apply(&self, batch: Vec<BatchOp>) -> Result<(), BackendError> {
        // Immediate when the caller asked `has_room` first (a tenant's actor does: no seal
        // ran then, and the memtable was not full); a replay at open and a checkpoint's
        // release of catalog changes, on the blocking pool, seal and wait here, and so does
        // the last apply of a closing tenant (not asked: it asks `room_as_is`) that finds its
        // memtable full. With one sealed memtable of slack over `has_room`'s budget: a
        // checkpoint's flush, on another thread, may seal the active memtable between an
        // actor's `has_room` and its apply (adding a sealed memtable, not bytes), and that
        // apply must still not wait on the actor's thread.
        if self.memtable_full(self.ks()) {
            self.seal_here()?;
        }
        self.wait_for_flushes(|ks| self.room(ks, 1), Some(APPLY_STALL_LIMIT))?;
        let mut b = self.ks().keyspace.batch().without_journal();
        for op in batch {
            match op {
                BatchOp::Put(k, v) => b.insert(&self.ks().part, k, v),
                BatchOp::Remove(k) => b.remove(&self.ks().part, k),
            }
        }
        b.commit().map_err(fjall_err)
    }

    /// The checkpoint: the memtables are written out as segments (fsynced by fjall), then
    /// fjall's journal is synced (it holds no batches of ours, see [`FjallBackend`], only what
    /// fjall itself records there). Afterwards everything applied so far is durable without the
    /// WAL.
    ///
    /// fjall's own `rotate_memtable_and_wait` polls its flush queue with no way out: a flush
    /// worker that fails (ENOSPC, say) poisons the keyspace and stops, and the queue never
    /// empties, so a checkpoint, or the flush of an open on a still-full disk, would wait
    /// forever. This waits for the sealed memtables to be written out and gives up as soon as
    /// the keyspace is poisoned.
    fn flush(&self) -> Result<(), BackendError> {
        use fjall::AbstractTree;
        let ks = self.ks();
        // Everything applied so far has a seqno up to `target`. Wait until the written files
        // reach it, even when there was nothing to seal (a memtable fjall sealed by itself just
        // before may still be on its way out, and without fjall's journal it is durable only
        // once written), but not for memtables sealed later, which a steady load would keep
        // coming. Or until no sealed memtable is left at all: that too covers `target`, and it
        // ends the wait should compaction ever drop the item that carried `target` (a
        // tombstone) before this looks.
        let target = ks.part.tree.get_highest_seqno();
        {
            // Marked as a seal: `has_room` answers no while this rotation holds the journal
            // lock (an apply would wait for it on the actor's thread).
            let _sealing = self.take_sealing()?;
            ks.part.rotate_memtable().map_err(fjall_err)?;
        }
        if let Some(target) = target {
            self.wait_for_flushes(
                |ks| {
                    ks.part.tree.sealed_memtable_count() == 0
                        || ks
                            .part
                            .tree
                            .get_highest_persisted_seqno()
                            .is_some_and(|p| p >= target)
                },
                None,
            )?;
        }
        if cube_wal::failpoint::injected_sync_failure(&self.dir) {
            return Err(BackendError("injected fsync failure (test)".into()));
        }
        ks.keyspace
            .persist(fjall::PersistMode::SyncAll)
            .map_err(fjall_err)
    }

    fn has_room(&self) -> Result<bool, BackendError> {
        if !self.seal_off_thread()? {
            return Ok(false);
        }
        Ok(self.room_as_is()? && !self.stalled())
    }

    fn room_as_is(&self) -> Result<bool, BackendError> {
        let ks = self.ks();
        if self.room(ks, 0) {
            return Ok(true);
        }
        // Over budget: no room will come if fjall's flush worker failed (its keyspace is then
        // poisoned, and `Buffer`, which only hands fjall's journal buffer to the OS, says so).
        ks.keyspace
            .persist(fjall::PersistMode::Buffer)
            .map_err(fjall_err)?;
        Ok(false)
    }

    fn room_notify(&self) -> Option<std::sync::Arc<tokio::sync::Notify>> {
        Some(std::sync::Arc::clone(&self.sealed))
    }

    fn wait_for_room(&self) -> Result<(), BackendError> {
        self.seal_here()?;
        self.wait_for_flushes(|ks| self.room(ks, 0), Some(APPLY_STALL_LIMIT))
    }

    fn size_on_disk(&self) -> u64 {
        self.ks().keyspace.disk_space()
    }
}

/// How long an open waits for a just-closed handle of the same store to release its lock.
pub const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Open with `open`, retrying for up to [`LOCK_WAIT`] while `locked` says another handle still
/// holds the store: both fjall (here, see `Drop for FjallBackend`) and sled (the state stores
/// and the catalog) let go of their lock on a thread of their own shortly after a handle is
/// dropped, and a passivated tenant's last reader may still hold one.
pub fn open_waiting<B, E>(
    open: impl Fn() -> Result<B, E>,
    locked: impl Fn(&E) -> bool,
) -> Result<B, E> {
    let deadline = std::time::Instant::now() + LOCK_WAIT;
    loop {
        match open() {
            Err(e) if locked(&e) && std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            r => return r,
        }
    }
}

/// Convert a tenant state directory written by an earlier build (sled) to fjall, in place:
/// every pair is copied into a new keyspace beside it (`state.migrating`), synced, and the
/// directories are swapped (`state` → `state.sled-old`, `state.migrating` → `state`). A crash at
/// any point leaves a state the next call finishes or redoes. Returns whether it migrated.
pub fn migrate_sled_state(dir: &Path, cache_bytes: u64) -> Result<bool, BackendError> {
    let io = |what: &str, e: std::io::Error| BackendError(format!("migrating state: {what}: {e}"));
    let tmp = dir.with_extension("migrating");
    let old = dir.with_extension("sled-old");
    if old.exists() {
        // Crashed after the first rename: finish the swap, then drop the old copy.
        if !dir.exists() {
            std::fs::rename(&tmp, dir).map_err(|e| io("finishing the swap", e))?;
            sync_parent(dir).map_err(|e| io("syncing the tenant directory", e))?;
        }
        std::fs::remove_dir_all(&old).map_err(|e| io("removing the old store", e))?;
        return Ok(true);
    }
    if !dir.join("conf").exists() || dir.join("version").exists() {
        return Ok(false);
    }
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(|e| io("removing an unfinished copy", e))?;
    }
    {
        let from = open_waiting(
            || SledBackend::open(dir, cache_bytes),
            SledBackend::is_locked,
        )?;
        let to = FjallBackend::open(&tmp, cache_bytes)?;
        // Batches of at most 4096 pairs and 16 MiB: by count alone, 4096 values of 1 MiB made
        // a 4-GiB batch, held twice in memory, and past 4 GiB fjall's 32-bit memtable size
        // wrapped and its write-buffer accounting never drained (the open spun for ever).
        const MIGRATION_BATCH_BYTES: usize = 16 << 20;
        let mut batch = Vec::with_capacity(4096);
        let mut batch_bytes = 0;
        for pair in from.range(b"", b"\xff") {
            let (k, v) = pair?;
            batch_bytes += k.len() + v.len();
            batch.push(BatchOp::Put(k, v));
            if batch.len() == 4096 || batch_bytes >= MIGRATION_BATCH_BYTES {
                to.apply(std::mem::take(&mut batch))?;
                batch_bytes = 0;
            }
        }
        to.apply(batch)?;
        to.flush()?;
        // Closed before the rename, not on the background thread a drop would use.
        to.close();
    }
    std::fs::rename(dir, &old).map_err(|e| io("moving the old store aside", e))?;
    std::fs::rename(&tmp, dir).map_err(|e| io("moving the new store in", e))?;
    sync_parent(dir).map_err(|e| io("syncing the tenant directory", e))?;
    std::fs::remove_dir_all(&old).map_err(|e| io("removing the old store", e))?;
    Ok(true)
}

fn sync_parent(dir: &Path) -> std::io::Result<()> {
    match dir.parent() {
        Some(p) => std::fs::File::open(p)?.sync_all(),
        None => Ok(()),
    }
}

/// An in-memory backend: the same contract with nothing on disk (flush is a no-op). For tests
/// of the state machine, which would otherwise spend their time in sled.
#[derive(Debug, Default)]
pub struct MemBackend {
    map: RwLock<BTreeMap<Vec<u8>, Vec<u8>>>,
}

impl StateRead for MemBackend {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, BackendError> {
        let map = self.map.read().unwrap_or_else(|p| p.into_inner());
        Ok(map.get(key).cloned())
    }

    fn range(&self, start: &[u8], end: &[u8]) -> RangeIter<'_> {
        // Copied out so no lock is held while the caller iterates.
        let map = self.map.read().unwrap_or_else(|p| p.into_inner());
        let items: Vec<_> = map
            .range(start.to_vec()..end.to_vec())
            .map(|(k, v)| Ok((k.clone(), v.clone())))
            .collect();
        Box::new(items.into_iter())
    }

    fn get_lt(&self, key: &[u8]) -> Result<Option<(Vec<u8>, Vec<u8>)>, BackendError> {
        let map = self.map.read().unwrap_or_else(|p| p.into_inner());
        Ok(map
            .range(..key.to_vec())
            .next_back()
            .map(|(k, v)| (k.clone(), v.clone())))
    }
}

impl StateBackend for MemBackend {
    fn apply(&self, batch: Vec<BatchOp>) -> Result<(), BackendError> {
        let mut map = self.map.write().unwrap_or_else(|p| p.into_inner());
        for op in batch {
            match op {
                BatchOp::Put(k, v) => {
                    map.insert(k, v);
                }
                BatchOp::Remove(k) => {
                    map.remove(&k);
                }
            }
        }
        Ok(())
    }

    fn flush(&self) -> Result<(), BackendError> {
        Ok(())
    }

    fn size_on_disk(&self) -> u64 {
        0
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Open, waiting (as `TenantCore` does) for a just-dropped handle to release the lock.
    fn fjall(dir: &Path) -> FjallBackend {
        open_waiting(|| FjallBackend::open(dir, 1 << 20), FjallBackend::is_locked).unwrap()
    }

    fn sled(dir: &Path) -> SledBackend {
        open_waiting(|| SledBackend::open(dir, 1 << 20), SledBackend::is_locked).unwrap()
    }

    fn pairs(b: &dyn StateBackend) -> Vec<(Vec<u8>, Vec<u8>)> {
        b.range(b"", b"\xff").map(|r| r.unwrap()).collect()
    }

    #[test]
    fn a_sled_state_directory_is_migrated_to_fjall_with_every_pair() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("state");
        let want: Vec<(Vec<u8>, Vec<u8>)> = (0..10_000u32)
            .map(|i| (format!("c{i:08}").into_bytes(), i.to_le_bytes().repeat(9)))
            .collect();
        {
            let sled = sled(&dir);
            sled.apply(
                want.iter()
                    .cloned()
                    .map(|(k, v)| BatchOp::Put(k, v))
                    .collect(),
            )
            .unwrap();
            sled.flush().unwrap();
        }
        assert!(migrate_sled_state(&dir, 1 << 20).unwrap());
        assert!(!migrate_sled_state(&dir, 1 << 20).unwrap(), "only once");
        let f = fjall(&dir);
        assert_eq!(pairs(&f), want);
        assert!(!root.path().join("state.sled-old").exists());
        assert!(!root.path().join("state.migrating").exists());
    }

    #[test]
    fn a_migration_interrupted_between_the_renames_is_finished() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("state");
        {
            let f = fjall(&root.path().join("state.migrating"));
            f.apply(vec![BatchOp::Put(b"k".to_vec(), b"v".to_vec())])
                .unwrap();
            f.flush().unwrap();
        }
        std::fs::create_dir_all(root.path().join("state.sled-old")).unwrap();
        assert!(migrate_sled_state(&dir, 1 << 20).unwrap());
        let f = fjall(&dir);
        assert_eq!(f.get(b"k").unwrap(), Some(b"v".to_vec()));
        assert!(!root.path().join("state.sled-old").exists());
    }

    #[test]
    fn a_second_open_of_one_fjall_directory_is_refused_while_the_first_lives() {
        let root = tempfile::tempdir().unwrap();
        let first = FjallBackend::open(root.path(), 1 << 20).unwrap();
        let e = FjallBackend::open(root.path(), 1 << 20).unwrap_err();
        assert!(FjallBackend::is_locked(&e), "{e}");
        drop(first);
        fjall(root.path());
    }

    /// A byte of a stored value damaged on disk (bit rot) is an error when read, not the damaged
    /// value served as the cell's: the state store's blocks are checksummed, and the vendored
    /// lsm-tree now checks the checksum (upstream stored it and never checked it).
    #[test]
    fn a_damaged_block_is_an_error_not_data() {
        let root = tempfile::tempdir().unwrap();
        // An error that says so (DATA_LOSS to the caller), not one worth a retry.
        let e = damaged_read_error(root.path());
        assert!(e.is_corrupt(), "{e}");
        let f = fjall(root.path());
        let e = f
            .range(b"k", b"l")
            .find_map(Result::err)
            .expect("a scan read the damaged block as data");
        assert!(e.is_corrupt(), "{e}");
        let snapshot = f.snapshot().unwrap();
        let e = snapshot
            .get(b"k000500")
            .expect_err("a snapshot read the damaged block");
        assert!(e.is_corrupt(), "{e}");
    }

    /// A compaction that fails on a damaged input block leaves none of the files it wrote:
    /// they were left until the next open, and each retry (at every flush) left more, until
    /// the disk was full (vendored lsm-tree's `discard_segments`). Each failure is counted in
    /// `cube_state_compactions_failed_total` (it was in the log only).
    #[test]
    fn a_failed_compaction_leaves_no_files_behind() {
        let root = tempfile::tempdir().unwrap();
        damaged_store(root.path(), 4);
        let f = fjall(root.path());
        let part = &f.open.as_ref().unwrap().part;
        let segment_files = || {
            walk(root.path())
                .into_iter()
                .filter(|p| p.parent().is_some_and(|d| d.ends_with("segments")))
                .count()
        };
        let before = segment_files();
        assert_eq!(before, part.segment_count());
        let failures = || cube_metrics::STATE_COMPACTIONS_FAILED.get();
        let failed_before = failures();
        for _ in 0..3 {
            // The merge meets the damaged block and gives up (fjall logs it).
            let _ = part.major_compact();
        }
        // Counted for the operator (other tests may add theirs: at least these three).
        assert!(
            failures() >= failed_before + 3,
            "{} failed merges counted, 3 expected",
            failures() - failed_before
        );
        assert_eq!(
            segment_files(),
            before,
            "files left behind by failed merges"
        );
        assert_eq!(part.segment_count(), before);
    }

    /// An open refused for lack of space or quota is told apart (RESOURCE_EXHAUSTED to the
    /// caller), wherever fjall wraps the I/O error; another I/O error is not.
    #[test]
    fn an_open_out_of_space_is_told_apart() {
        let full = || std::io::Error::from_raw_os_error(28);
        assert!(open_err("x", fjall::Error::Io(full())).is_no_space());
        assert!(open_err("x", fjall::Error::Storage(lsm_tree::Error::Io(full()))).is_no_space());
        let eio = std::io::Error::from_raw_os_error(5);
        assert!(!open_err("x", fjall::Error::Io(eio)).is_no_space());
        assert!(!open_err("x", fjall::Error::Poisoned).is_no_space());
    }

    /// The error of reading a key whose block was damaged on disk, in a new store at `dir` (for
    /// other modules' tests).
    pub(crate) fn damaged_read_error(dir: &Path) -> BackendError {
        damaged_store(dir, 1);
        fjall(dir)
            .get(b"k000500")
            .expect_err("a damaged block was read as data")
    }

    /// A state store at `dir` of keys `k000000`..`k000999`, written in `runs` flushed runs, with
    /// a byte of key 500's value flipped in the segment file holding it.
    fn damaged_store(dir: &Path, runs: u32) {
        let value = |i: u32| format!("value-{i:06}-").repeat(8).into_bytes();
        {
            let f = fjall(dir);
            let per_run = 1000 / runs;
            for run in 0..runs {
                f.apply(
                    (run * per_run..(run + 1) * per_run)
                        .map(|i| BatchOp::Put(format!("k{i:06}").into_bytes(), value(i)))
                        .collect(),
                )
                .unwrap();
                f.flush().unwrap();
            }
        }
        let needle = value(500);
        let mut damaged = false;
        for entry in walk(dir) {
            // (Some files are mapped or locked by nothing now; one that cannot be read is skipped.)
            let Ok(mut bytes) = std::fs::read(&entry) else {
                continue;
            };
            if let Some(at) = bytes.windows(needle.len()).position(|w| w == needle) {
                bytes[at + 3] ^= 0x20;
                std::fs::write(&entry, &bytes).unwrap();
                damaged = true;
            }
        }
        assert!(damaged, "no segment file holds the value");
    }

    /// Every file under `dir`.
    fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
        let mut files = Vec::new();
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                files.extend(walk(&path));
            } else {
                files.push(path);
            }
        }
        files
    }

    #[test]
    fn fjall_survives_reopen_with_what_was_flushed() {
        let root = tempfile::tempdir().unwrap();
        {
            let f = fjall(root.path());
            exercise(&f);
            f.flush().unwrap();
        }
        let f = fjall(root.path());
        assert_eq!(f.get(b"a2").unwrap(), Some(b"y".to_vec()));
        assert_eq!(f.get(b"a1").unwrap(), None);
    }

    /// A store whose process died before fjall wrote its memtables out: without fjall's journal
    /// (batches skip it) nothing of them comes back, which is a prefix (empty here), and the
    /// empty journal files they leave behind must not stall the next applies. (They did when
    /// the write stall counted journal files: every apply waited 30 s and failed, so the tenant
    /// could not replay its log; `cube-durability` scenario E found it.)
    #[test]
    fn a_store_killed_before_its_flushes_reopens_as_a_prefix_and_takes_writes() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path();
        {
            // No flush worker: sealed memtables stay in memory, as in a process killed before
            // its flushes ran.
            let ks = fjall::Config::new(dir)
                .flush_workers(0)
                .manual_journal_persist(true)
                .open()
                .unwrap();
            let part = ks
                .open_partition(
                    "state",
                    fjall::PartitionCreateOptions::default().manual_journal_persist(true),
                )
                .unwrap();
            for i in 0..(SEALED_MEMTABLE_BUDGET + 3) {
                let mut b = ks.batch().without_journal();
                b.insert(&part, format!("k{i}"), "v");
                b.commit().unwrap();
                assert!(part.rotate_memtable().unwrap());
            }
            assert!(ks.journal_count() > SEALED_MEMTABLE_BUDGET + 2);
        }
        let f = fjall(dir);
        assert_eq!(pairs(&f), Vec::<(Vec<u8>, Vec<u8>)>::new());
        f.apply(vec![BatchOp::Put(b"a".to_vec(), b"1".to_vec())])
            .unwrap();
        f.flush().unwrap();
        drop(f);
        let f = fjall(dir);
        assert_eq!(pairs(&f), vec![(b"a".to_vec(), b"1".to_vec())]);
    }

    /// Keys spread over the key space, so that consecutive `i` land in different blocks.
    fn scattered_key(i: u32) -> Vec<u8> {
        format!("c:{:08x}", i.wrapping_mul(2_654_435_761)).into_bytes()
    }

    /// One flushed run of overlapping changes, mirrored in `model`: keys `round * step` up to
    /// `round * step + 2 * step` get this round's values, and every `remove_every`th key below
    /// them is removed.
    fn write_run(f: &FjallBackend, model: &mut Model, round: u32, step: u32, remove_every: usize) {
        let mut ops = Vec::new();
        for i in (round * step)..(round * step + 2 * step) {
            let v = format!("{round}:{i}").into_bytes();
            model.insert(scattered_key(i), v.clone());
            ops.push(BatchOp::Put(scattered_key(i), v));
        }
        for i in (0..(round * step)).step_by(remove_every) {
            model.remove(&scattered_key(i));
            ops.push(BatchOp::Remove(scattered_key(i)));
        }
        f.apply(ops).unwrap();
        f.flush().unwrap();
    }

    type Model = std::collections::BTreeMap<Vec<u8>, Vec<u8>>;

    /// Every key below `end` reads back as `model` has it, and a full scan gives exactly `model`.
    fn reads_back(f: &FjallBackend, model: Model, end: u32) {
        for i in 0..end {
            let k = scattered_key(i);
            assert_eq!(f.get(&k).unwrap(), model.get(&k).cloned(), "key {i}");
        }
        let all = pairs(f);
        assert_eq!(all.len(), model.len());
        assert!(all.into_iter().eq(model));
    }

    /// After a reopen, segments use the patched lsm-tree (vendor/lsm-tree/CUBE-PATCH.md): bloom
    /// filters mapped from the files and two-level block indexes at every level. Every key of
    /// several overlapping segments must still read back as last written, and absent or removed
    /// keys as absent.
    #[test]
    fn a_reopened_store_of_several_segments_answers_every_key() {
        let root = tempfile::tempdir().unwrap();
        let mut model = Model::new();
        {
            let f = fjall(root.path());
            for round in 0..5 {
                write_run(&f, &mut model, round, 1500, 7);
            }
        }
        reads_back(&fjall(root.path()), model, 10_000);
    }

    /// The patched size-tiered rule (vendor/lsm-tree/CUBE-PATCH.md, change 4): small runs
    /// flushed [`fjall::compaction::SLOW_RUN_MIN_GAP`] apart are merged into one within level 0;
    /// the same runs flushed back to back (a bulk load) stay as they are. Either way every key
    /// reads back as last written.
    #[test]
    fn slowly_flushed_small_runs_are_merged_and_fast_ones_are_not() {
        let runs = fjall::compaction::SLOW_RUNS_TO_MERGE as u32;
        let write_runs = |f: &FjallBackend, gap: std::time::Duration| {
            let mut model = Model::new();
            for round in 0..runs {
                if round > 0 {
                    std::thread::sleep(gap);
                }
                write_run(f, &mut model, round, 1000, 5);
            }
            model
        };
        let segments = |f: &FjallBackend| f.ks().part.segment_count();

        let root = tempfile::tempdir().unwrap();
        let fast = fjall(&root.path().join("fast"));
        let model = write_runs(&fast, std::time::Duration::ZERO);
        std::thread::sleep(std::time::Duration::from_secs(1));
        assert_eq!(
            segments(&fast),
            runs as usize,
            "runs flushed back to back are left alone"
        );
        reads_back(&fast, model, runs * 1000 + 1000);

        let slow = fjall(&root.path().join("slow"));
        let model = write_runs(
            &slow,
            fjall::compaction::SLOW_RUN_MIN_GAP + std::time::Duration::from_millis(50),
        );
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while segments(&slow) != 1 {
            assert!(
                std::time::Instant::now() < deadline,
                "{runs} runs flushed slowly were not merged: {} segments",
                segments(&slow)
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        reads_back(&slow, model, runs * 1000 + 1000);
    }

    #[test]
    fn applies_wait_for_flushes_to_stay_within_the_write_budget() {
        // Eight times the budget in 1 MiB batches. Without the wait in `apply`, fjall's own limit
        // (four times the budget) lets the memtables grow past it whenever its flushes fall
        // behind (to 51 MiB in one run; in others they kept up).
        let root = tempfile::tempdir().unwrap();
        let f = fjall(root.path());
        let value = vec![7u8; 64 << 10];
        let batches = ((8 * WRITE_BUFFER_BUDGET) >> 20) as u32;
        let mut peak = 0;
        for batch in 0..batches {
            let ops = (0..16u32)
                .map(|i| BatchOp::Put(format!("k{batch:04}{i:02}").into_bytes(), value.clone()))
                .collect();
            f.apply(ops).unwrap();
            peak = peak.max(f.ks().keyspace.write_buffer_size());
        }
        // The budget, plus the batch that crossed it (1 MiB and the entries' overhead).
        assert!(
            peak <= WRITE_BUFFER_BUDGET + (1 << 20) + (64 << 10),
            "memtables reached {peak} bytes"
        );
        let last = format!("k{:04}15", batches - 1).into_bytes();
        assert_eq!(f.get(&last).unwrap(), Some(value.clone()));
        f.flush().unwrap();
        drop(f);
        let f = fjall(root.path());
        assert_eq!(f.get(b"k000000").unwrap(), Some(value));
        assert_eq!(pairs(&f).len(), batches as usize * 16);
    }

    /// A write that fills the memtable does not seal it on the writer's thread: fjall would
    /// (rotating its journal files, with two or three fsyncs), on the thread a tenant's actor
    /// shares with other tenants. `has_room` answers no, seals it on a thread of its own, and
    /// answers yes again once that is done; every key reads back.
    #[test]
    fn a_full_memtable_is_sealed_off_the_writers_thread() {
        use fjall::AbstractTree;
        let root = tempfile::tempdir().unwrap();
        let f = fjall(root.path());
        let value = vec![7u8; 64 << 10];
        let key = |batch: u32, i: u32| format!("k{batch:04}{i:02}").into_bytes();
        // 1 MiB of values per batch, each after `has_room` said yes, as a tenant's actor
        // applies them: the last one takes the memtable past its size (keys and fjall's
        // per-entry overhead come on top of the values).
        let batches = FJALL_MEMTABLE_BYTES >> 20;
        for batch in 0..batches {
            assert!(f.has_room().unwrap(), "batch {batch}: no room");
            f.apply(
                (0..16)
                    .map(|i| BatchOp::Put(key(batch, i), value.clone()))
                    .collect(),
            )
            .unwrap();
        }
        let active = || f.ks().part.tree.active_memtable_size();
        assert!(
            active() > FJALL_MEMTABLE_BYTES,
            "the write that filled the memtable sealed it (active memtable {} bytes)",
            active()
        );
        assert!(!f.has_room().unwrap(), "room with a full memtable");
        // The seal's end is notified, and then there is room at once.
        let notify = f.room_notify().unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async {
            tokio::time::timeout(std::time::Duration::from_secs(10), notify.notified()).await
        })
        .expect("the seal's end was not notified");
        assert!(f.has_room().unwrap(), "no room once the seal ended");
        assert!(active() < (1 << 20), "active memtable {} bytes", active());
        for batch in 0..batches {
            assert_eq!(f.get(&key(batch, 15)).unwrap(), Some(value.clone()));
        }
        f.flush().unwrap();
        drop(f);
        let f = fjall(root.path());
        assert_eq!(pairs(&f).len(), batches as usize * 16);
    }

    /// fjall's own reads see a batch being applied key by key; a snapshot sees whole batches
    /// only (one taken at the keyspace's next seqno, as `PartitionHandle::snapshot` does,
    /// would see the batch under way too).
    #[test]
    fn a_snapshot_sees_whole_batches_only() {
        let root = tempfile::tempdir().unwrap();
        let f = std::sync::Arc::new(fjall(root.path()));
        let keys = 2000u32;
        let batch = move |n: u32| {
            (0..keys)
                .map(|k| BatchOp::Put(format!("k{k:05}").into_bytes(), n.to_le_bytes().to_vec()))
                .collect::<Vec<_>>()
        };
        f.apply(batch(0)).unwrap();
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writer = {
            let (f, done) = (std::sync::Arc::clone(&f), std::sync::Arc::clone(&done));
            std::thread::spawn(move || {
                for n in 1..=300 {
                    f.apply(batch(n)).unwrap();
                }
                done.store(true, std::sync::atomic::Ordering::Release);
            })
        };
        let mut scans = 0;
        while !done.load(std::sync::atomic::Ordering::Acquire) {
            // The batch's first and last keys (fjall inserts them in the batch's order).
            let snapshot = f.snapshot().expect("fjall has snapshots");
            let last = snapshot.get(b"k01999").unwrap();
            let first = snapshot.get(b"k00000").unwrap();
            assert_eq!(first, last, "a read saw part of a batch");
            scans += 1;
        }
        writer.join().unwrap();
        assert!(scans > 0);
        let last = f.snapshot().unwrap().get(b"k01999").unwrap();
        assert_eq!(last, Some(300u32.to_le_bytes().to_vec()));
    }

    /// A snapshot once taken and dropped (an audit page) does not keep old versions from
    /// compaction: fjall's monitor raises the watermark below which compaction drops them only
    /// while no snapshot entry is left (vendor/fjall/CUBE-PATCH.md, change 7).
    #[test]
    fn a_closed_snapshot_leaves_old_versions_to_compaction() {
        use fjall::AbstractTree;
        let root = tempfile::tempdir().unwrap();
        let f = fjall(root.path());
        drop(f.snapshot());
        for i in 0..1000u32 {
            f.apply(vec![BatchOp::Put(b"k".to_vec(), i.to_le_bytes().to_vec())])
                .unwrap();
        }
        let part = &f.ks().part;
        // The monitor looks every 250 ms.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            f.flush().unwrap();
            part.major_compact().unwrap();
            let versions = part.tree.approximate_len();
            if versions < 500 {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{versions} versions of one key kept after compaction"
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        assert_eq!(f.get(b"k").unwrap(), Some(999u32.to_le_bytes().to_vec()));
    }

    /// A snapshot keeps reading the version it saw after the key is overwritten, its memtable
    /// flushed and the store compacted (the patched lsm-tree, vendor/lsm-tree/CUBE-PATCH.md
    /// change 6: upstream drained every version under the newest once the next was below the
    /// GC watermark, also one an open snapshot still reads).
    #[test]
    fn a_snapshot_reads_its_version_across_flushes_and_compactions() {
        let root = tempfile::tempdir().unwrap();
        let f = fjall(root.path());
        f.apply(vec![BatchOp::Put(b"k".to_vec(), b"old".to_vec())])
            .unwrap();
        for i in 0..300u32 {
            f.apply(vec![BatchOp::Put(
                b"other".to_vec(),
                i.to_le_bytes().to_vec(),
            )])
            .unwrap();
        }
        // fjall's monitor, every 250 ms while no snapshot is open, raises the GC watermark to
        // 100 below the newest seqno: past the old version.
        std::thread::sleep(std::time::Duration::from_millis(800));
        let snapshot = f.snapshot().unwrap();
        f.apply(vec![BatchOp::Put(b"k".to_vec(), b"new".to_vec())])
            .unwrap();
        f.flush().unwrap();
        f.ks().part.major_compact().unwrap();
        assert_eq!(snapshot.get(b"k").unwrap(), Some(b"old".to_vec()));
        drop(snapshot);
        assert_eq!(f.get(b"k").unwrap(), Some(b"new".to_vec()));
    }

    /// A deleted key stays deleted through a compaction into the last level (upstream dropped
    /// the tombstone there even when the value under it was above the GC watermark and so
    /// kept: the value came back; vendor/lsm-tree/CUBE-PATCH.md change 6).
    #[test]
    fn a_deleted_key_stays_deleted_through_a_last_level_compaction() {
        let root = tempfile::tempdir().unwrap();
        let f = fjall(root.path());
        f.apply(vec![BatchOp::Put(b"k".to_vec(), b"v".to_vec())])
            .unwrap();
        f.apply(vec![BatchOp::Remove(b"k".to_vec())]).unwrap();
        f.flush().unwrap();
        f.ks().part.major_compact().unwrap();
        assert_eq!(f.get(b"k").unwrap(), None);
        assert!(pairs(&f).is_empty(), "{:?}", pairs(&f));
    }

    /// fjall's level-0 write stall does not sleep in the apply, on the actor's thread other
    /// tenants share: `has_room` adds up the sleeps it owes and holds the applies, one
    /// [`FLUSH_POLL`] at a time, while that much is owed. Before, each apply slept 512 µs at
    /// 29 runs.
    #[test]
    fn a_level_zero_stall_holds_applies_instead_of_sleeping_in_them() {
        use fjall::AbstractTree;
        use std::time::{Duration, Instant};
        let root = tempfile::tempdir().unwrap();
        // No compaction worker: each flush adds a level-0 run (overlapping keys, so none are
        // disjoint and every one counts).
        let f = FjallBackend::open_with(root.path(), 1 << 20, 0).unwrap();
        let put = |i: u32| {
            vec![
                BatchOp::Put(b"a".to_vec(), i.to_le_bytes().to_vec()),
                BatchOp::Put(b"z".to_vec(), i.to_le_bytes().to_vec()),
            ]
        };
        for run in 0..29 {
            f.apply(put(run)).unwrap();
            f.flush().unwrap();
        }
        assert_eq!(f.ks().part.tree.l0_run_count(), 29);
        let applies = 40u32;
        let (mut fastest, mut holds) = (Duration::MAX, 0);
        let started = Instant::now();
        let mut applied = 0;
        while applied < applies {
            if !f.has_room().unwrap() {
                holds += 1;
                std::thread::sleep(Duration::from_micros(200));
                continue;
            }
            let apply = Instant::now();
            f.apply(put(applied)).unwrap();
            fastest = fastest.min(apply.elapsed());
            applied += 1;
        }
        let stall = Duration::from_micros(512);
        assert!(
            fastest < stall,
            "every apply slept (the fastest took {fastest:?})"
        );
        assert!(holds > 0, "no hold at 29 level-0 runs");
        // What fjall would have slept, less what the last applies still owe (under
        // `FLUSH_POLL`, plus the last one's delay).
        assert!(
            started.elapsed() >= stall * applies - FLUSH_POLL - stall,
            "held {:?} in all for {applies} applies",
            started.elapsed()
        );
        assert_eq!(
            f.get(b"z").unwrap(),
            Some((applies - 1).to_le_bytes().to_vec())
        );
    }

    /// `has_room` answers at once, no, while a seal runs on another thread (a checkpoint's
    /// rotation, a replay's seal), or while another thread holds the seal slot for a moment:
    /// the actor's thread must not wait for either. Before, it took the slot's lock, held by
    /// a blocking caller across its whole rotation.
    #[test]
    fn has_room_never_waits_for_a_seal_elsewhere() {
        let root = tempfile::tempdir().unwrap();
        let f = std::sync::Arc::new(fjall(root.path()));
        // Asked on a thread of its own; a thread left waiting (the failure) is not joined.
        let asked_elsewhere = |f: &std::sync::Arc<FjallBackend>| {
            let (tx, rx) = std::sync::mpsc::channel();
            let f = std::sync::Arc::clone(f);
            std::thread::spawn(move || tx.send(f.has_room().unwrap()));
            rx.recv_timeout(std::time::Duration::from_secs(2))
                .expect("has_room waited for the seal")
        };
        assert!(asked_elsewhere(&f));
        let sealing = f.take_sealing().unwrap();
        assert!(!asked_elsewhere(&f), "room while a seal runs");
        drop(sealing);
        let slot = f.seal_handle();
        assert!(!asked_elsewhere(&f), "room while the slot is taken");
        drop(slot);
        assert!(f.has_room().unwrap());
    }

    fn exercise(b: &dyn StateBackend) {
        b.apply(vec![
            BatchOp::Put(b"a1".to_vec(), b"x".to_vec()),
            BatchOp::Put(b"a2".to_vec(), b"y".to_vec()),
            BatchOp::Put(b"b1".to_vec(), b"z".to_vec()),
        ])
        .unwrap();
        b.apply(vec![BatchOp::Remove(b"a1".to_vec())]).unwrap();
        assert_eq!(b.get(b"a1").unwrap(), None);
        assert_eq!(b.get(b"a2").unwrap(), Some(b"y".to_vec()));
        let keys: Vec<_> = b.range(b"a", b"b").map(|r| r.unwrap().0).collect();
        assert_eq!(keys, vec![b"a2".to_vec()]);
        let all: Vec<_> = b.range(b"", b"\xff").map(|r| r.unwrap().0).collect();
        assert_eq!(all, vec![b"a2".to_vec(), b"b1".to_vec()]);
        assert_eq!(b.get_lt(b"b1").unwrap().unwrap().0, b"a2".to_vec());
        assert_eq!(b.get_lt(b"a2").unwrap(), None);
        b.flush().unwrap();
    }

    #[test]
    fn every_backend_agrees() {
        exercise(&MemBackend::default());
        let dir = tempfile::tempdir().unwrap();
        exercise(&SledBackend::open(dir.path(), 1 << 20).unwrap());
        let dir = tempfile::tempdir().unwrap();
        exercise(&FjallBackend::open(dir.path(), 1 << 20).unwrap());
    }

    #[test]
    fn sled_state_survives_reopen_after_flush() {
        let dir = tempfile::tempdir().unwrap();
        {
            let b = SledBackend::open(dir.path(), 1 << 20).unwrap();
            b.apply(vec![BatchOp::Put(b"k".to_vec(), b"v".to_vec())])
                .unwrap();
            b.flush().unwrap();
        }
        let b = sled(dir.path());
        assert_eq!(b.get(b"k").unwrap(), Some(b"v".to_vec()));
    }
}
