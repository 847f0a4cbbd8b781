//! A tenant's state machine joined to its WAL shard and state store: the writes waiting for
//! durability, and checkpoints.
//!
//! Plain Rust with no actor or runtime types, so it is unit-tested directly. `T` is whatever the
//! shell uses to answer a caller later (a oneshot sender in the actor); the core only hands it
//! back with the result once the caller's change is applied.
//!
//! Lifecycle of a change: prepare (checked against the logical state) → WAL append → durable
//! (policy `sync`) or inside the relaxed window → applied to the state store in one batch with
//! its group → answered. Under `sync`, a change whose answer is settled when it is logged is
//! answered by the WAL's syncer as soon as it is durable, while the apply runs (see
//! [`EarlyAnswers`]). A checkpoint flushes the state store and then deletes the WAL segments
//! it covers; recovery opens the state store and replays only the WAL after its applied seq.

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cube_wal::{
    DurableEvent, DurableNotify, RecoveryReport, SyncPolicy, WalError, WalOptions, WalShard,
};
use prost::Message;

use crate::backend::{
    APPLY_STALL_LIMIT, BackendError, FjallBackend, StateBackend, migrate_sled_state, open_waiting,
};
use crate::state::{
    ApplyError, Caller, Command, Coord, Effect, Hint, Prepared, Reply, StateLimits, TenantState,
};
use crate::walop::{self, Op, WalOp};
use crate::{Capability, Catalog, StoreError};

/// An answer for a caller: its token and the result.
pub type Answer<T> = (T, Result<Reply, StoreError>);

/// Answers of durable changes that the WAL's syncer may send itself, right after the
/// fdatasync that made them durable, instead of waiting for the tenant's actor to apply them
/// first (one thread hand-off less per durable write). Only a change whose answer is settled
/// when it is logged goes here (a cell change under the `sync` policy, or a relaxed one a logged
/// change narrowed to it; not a catalog change):
/// what it answers does not depend on its apply.
///
/// Readers that do not go through the actor's mailbox (scans, walks, audit pages, totals) wait
/// until the state holds every change answered from here ([`EarlyAnswers::answered`]); a call
/// that does go through the mailbox is queued behind the syncer's `Durable` report, which is
/// sent before these answers.
pub struct EarlyAnswers<T> {
    queue: Mutex<VecDeque<(u64, T, Reply)>>,
    /// Highest seq answered from here (by the syncer, or by the actor).
    answered: AtomicU64,
}

impl<T> std::fmt::Debug for EarlyAnswers<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EarlyAnswers")
            .field("answered", &self.answered())
            .finish_non_exhaustive()
    }
}

impl<T> Default for EarlyAnswers<T> {
    fn default() -> Self {
        EarlyAnswers {
            queue: Mutex::new(VecDeque::new()),
            answered: AtomicU64::new(0),
        }
    }
}

impl<T> EarlyAnswers<T> {
    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<(u64, T, Reply)>> {
        // Plain data: a panic elsewhere cannot leave it half-updated in a way that matters.
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn push(&self, seq: u64, token: T, reply: Reply) {
        self.lock().push_back((seq, token, reply));
    }

    /// Take the answers of every change `<= upto` (durable), and count them as answered.
    pub fn take_through(&self, upto: u64) -> Vec<(T, Reply)> {
        let mut queue = self.lock();
        let n = queue.iter().take_while(|(seq, _, _)| *seq <= upto).count();
        if n == 0 {
            return Vec::new();
        }
        let taken: Vec<(u64, T, Reply)> = queue.drain(..n).collect();
        drop(queue);
        if let Some((last, _, _)) = taken.last() {
            self.answered.fetch_max(*last, Ordering::AcqRel);
        }
        taken.into_iter().map(|(_, t, r)| (t, r)).collect()
    }

    /// Take every answer still queued (the tenant failed or closed).
    fn take_all(&self) -> Vec<(u64, T, Reply)> {
        self.lock().drain(..).collect()
    }

    /// Highest seq whose change was answered from here.
    pub fn answered(&self) -> u64 {
        self.answered.load(Ordering::Acquire)
    }
}

/// When to checkpoint: whichever comes first.
#[derive(Debug, Clone, Copy)]
pub struct CheckpointPolicy {
    /// WAL payload bytes appended since the last checkpoint.
    pub every_bytes: u64,
    /// Time since the last checkpoint (when anything changed).
    pub every: Duration,
}

impl Default for CheckpointPolicy {
    fn default() -> Self {
        CheckpointPolicy {
            every_bytes: 64 << 20,
            every: Duration::from_secs(60),
        }
    }
}

/// Everything a tenant is opened with.
#[derive(Debug, Clone)]
pub struct CoreConfig {
    pub wal: WalOptions,
    pub limits: StateLimits,
    pub checkpoint: CheckpointPolicy,
    /// Page cache of the tenant's state store.
    pub state_cache_bytes: u64,
    /// Writes are refused while this says the disk is nearly full (none: never).
    pub space: Option<Arc<crate::SpaceGuard>>,
    /// Where the tenant's keys live: capability changes (`Command::ChangeCapabilities`) are
    /// read from and applied to it. Without one they are refused, and opening a log that holds
    /// one fails.
    pub catalog: Option<Arc<Catalog>>,
    /// Woken when the tenant is poisoned *reopenable* (a failed write or apply), so that the
    /// directory's janitor closes it at once and its next call reopens it, instead of within
    /// its next round (about a second). Set by the directory for the tenants it opens.
    pub janitor: Option<Arc<tokio::sync::Notify>>,
    /// Told of a tenant that lost changes it had acknowledged (a relaxed one whose log failed
    /// a write before writing them), so that the server's stop reports it. Set by the directory.
    pub lost_acknowledged: Option<Arc<TenantSet>>,
}

/// A set of tenant names shared between threads (tenants whose log failed, or that lost
/// acknowledged changes, since the server started).
#[derive(Debug, Default)]
pub struct TenantSet(std::sync::Mutex<std::collections::BTreeSet<String>>);

impl TenantSet {
    /// Add `tenant`; whether it was not there yet.
    pub fn insert(&self, tenant: &str) -> bool {
        self.lock().insert(tenant.to_string())
    }

    pub fn contains(&self, tenant: &str) -> bool {
        self.lock().contains(tenant)
    }

    /// Take `tenant` out; whether it was there.
    pub fn remove(&self, tenant: &str) -> bool {
        self.lock().remove(tenant)
    }

    /// Every tenant in it, in order.
    pub fn tenants(&self) -> Vec<String> {
        self.lock().iter().cloned().collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::BTreeSet<String>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Default for CoreConfig {
    fn default() -> Self {
        CoreConfig {
            wal: WalOptions::default(),
            limits: StateLimits::default(),
            checkpoint: CheckpointPolicy::default(),
            state_cache_bytes: 32 << 20,
            space: None,
            catalog: None,
            janitor: None,
            lost_acknowledged: None,
        }
    }
}

/// Numbers other threads read without asking the actor (Tenant.Stats).
#[derive(Debug, Default)]
pub struct SharedStats {
    pub wal_bytes: AtomicU64,
    /// Highest seq acknowledged to a caller.
    pub last_seq: AtomicU64,
    pub checkpoint_seq: AtomicU64,
    /// The tenant refuses writes. Unless `reopenable`, until the server restarts (it is never
    /// passivated, so reopening cannot clear this).
    pub poisoned: std::sync::atomic::AtomicBool,
    /// What poisoned it left nothing in doubt (a failed write or apply, not a failed fsync):
    /// the directory closes the tenant so that its next call reopens it, replaying its log.
    pub reopenable: std::sync::atomic::AtomicBool,
    /// It was poisoned because the file system was full: writes answer RESOURCE_EXHAUSTED.
    pub no_space: std::sync::atomic::AtomicBool,
    /// A file or directory fsync of its own failed outside the WAL's syncer (removing its
    /// checkpointed log at a close): not reopened before a restart, whatever the free space.
    pub sync_failed: std::sync::atomic::AtomicBool,
    /// Its actor was told to stop (a shutdown or passivation). An actor that is gone without
    /// this stopped because a handler panicked (see `TenantHandle::crashed`).
    pub stopping: std::sync::atomic::AtomicBool,
    /// A periodic checkpoint's job is running on the blocking pool. It outlives an actor that
    /// crashed meanwhile (and holds the state store): the close of a crashed tenant waits for
    /// it and reads `checkpoint_failed`, since the job's result went with the actor.
    pub checkpoint_running: std::sync::atomic::AtomicBool,
    /// A periodic checkpoint's job failed (also reported to the actor, which poisons the
    /// tenant for good; see `checkpoint_running` for when that report is lost).
    pub checkpoint_failed: std::sync::atomic::AtomicBool,
    /// Key revocations and capability changes logged but not applied yet.
    pub pending_rights: PendingRights,
    /// Woken when a group was applied or the tenant failed, for readers waiting until the state
    /// holds what the syncer answered ([`EarlyAnswers`]).
    pub applied: tokio::sync::Notify,
    /// The durability policy in force as `Tenant.Stats` shows it, once a logged change narrowed
    /// it since the open (`None`: the one the tenant was opened with).
    pub narrowed_policy: std::sync::Mutex<Option<Arc<str>>>,
}

/// Why a reader could not wait until the applied state caught up (see [`EarlyAnswers`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lag {
    /// The tenant failed (poisoned) or its actor is gone: only its reopen (or, for a tenant
    /// poisoned for good, the restart) applies the changes.
    Failed,
    /// Still not applied after the reader's patience (a state store stalled on its flushes).
    Slow,
}

impl SharedStats {
    /// The policy in force, described, if a change narrowed it since the open.
    pub fn narrowed_policy(&self) -> Option<Arc<str>> {
        self.narrowed_policy
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Wait until the tenant's applied state holds every change up to `need` (see
    /// [`EarlyAnswers`]), for at most `patience`; `gone` says whether its actor is gone.
    pub async fn applied_through(
        &self,
        need: u64,
        gone: impl Fn() -> bool,
        patience: Duration,
    ) -> Result<(), Lag> {
        self.applied_through_polling(need, gone, patience, Duration::from_millis(10))
            .await
    }

    /// [`SharedStats::applied_through`], re-checking every `poll` without a wake-up (only an
    /// actor that stopped without a word, a panic, needs that).
    async fn applied_through_polling(
        &self,
        need: u64,
        gone: impl Fn() -> bool,
        patience: Duration,
        poll: Duration,
    ) -> Result<(), Lag> {
        if self.last_seq.load(Ordering::Acquire) >= need {
            return Ok(());
        }
        let deadline = tokio::time::Instant::now() + patience;
        loop {
            let woken = self.applied.notified();
            tokio::pin!(woken);
            // Registered before the checks, so an apply between them still wakes it.
            woken.as_mut().enable();
            if self.last_seq.load(Ordering::Acquire) >= need {
                return Ok(());
            }
            if self.poisoned.load(Ordering::SeqCst) || gone() {
                return Err(Lag::Failed);
            }
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return Err(Lag::Slow);
            }
            let _ = tokio::time::timeout_at(deadline.min(now + poll), woken).await;
        }
    }
}

/// The tenant's key revocations and capability changes that are logged but not yet applied to
/// the catalog (they wait for their fdatasync), as its core has them: the catalog, which
/// authenticated the call, still shows the old rights until then. Published for the reads
/// answered off the core's thread (a Read, a scan), which check it as the core checks changes.
#[derive(Debug, Default)]
pub struct PendingRights {
    /// Anything pending (the common case is not: one load and no lock).
    any: std::sync::atomic::AtomicBool,
    keys: std::sync::RwLock<PendingKeys>,
}

/// Revoked key ids, and each changed key's newest logged capability set.
#[derive(Debug, Default)]
struct PendingKeys {
    revoked: HashSet<String>,
    caps: HashMap<String, Vec<Capability>>,
}

impl PendingRights {
    fn publish(&self, revokes: &HashSet<String>, caps: &HashMap<String, (u64, Vec<Capability>)>) {
        let mut keys = self.keys.write().unwrap_or_else(|p| p.into_inner());
        keys.revoked.clone_from(revokes);
        keys.caps = caps
            .iter()
            .map(|(k, (_, c))| (k.clone(), c.clone()))
            .collect();
        self.any
            .store(!revokes.is_empty() || !caps.is_empty(), Ordering::SeqCst);
    }

    /// Why a call of key `key_id` that needs `needed` (None: only an unrevoked key) must be
    /// refused under what is pending, if it must.
    pub fn refusal(&self, key_id: &str, needed: Option<Capability>) -> Option<StoreError> {
        if !self.any.load(Ordering::SeqCst) {
            return None;
        }
        let keys = self.keys.read().unwrap_or_else(|p| p.into_inner());
        rights_refusal(
            key_id,
            keys.revoked.contains(key_id),
            keys.caps.get(key_id).map(Vec::as_slice),
            needed,
        )
    }
}

/// Why a call of key `key_id` of `tenant` that needs `needed` must be refused now, if it must:
/// under the revocations and capability changes logged but not yet applied (`pending`), then
/// under the catalog as it is (`None` in tests of the store alone). In that order: applying such
/// a record changes the catalog before it leaves `pending`, so a check never falls between them.
/// The gateway checked the key when the call came in; this is for a call that may have waited
/// since (for its request's body, a tenant's open, a scan place, the tenant's mailbox).
pub(crate) fn rights_now(
    pending: &PendingRights,
    catalog: Option<&Catalog>,
    tenant: &str,
    key_id: &str,
    needed: Option<Capability>,
) -> Option<StoreError> {
    if let Some(e) = pending.refusal(key_id, needed) {
        return Some(e);
    }
    // A revoked key stays in the catalog, marked; a principal the catalog has never known was
    // not authenticated by the gateway (tests and tools name their own).
    catalog?
        .key(tenant, key_id)
        .and_then(|key| rights_refusal(key_id, key.revoked, Some(&key.capabilities), needed))
}

/// Why a call of key `key_id` that needs `needed` must be refused, if the key is `revoked` or
/// its capabilities are `caps` (`None`: not known to differ from what the gateway checked).
fn rights_refusal(
    key_id: &str,
    revoked: bool,
    caps: Option<&[Capability]>,
    needed: Option<Capability>,
) -> Option<StoreError> {
    if revoked {
        return Some(StoreError::Unauthenticated(
            "the key this call authenticated with was revoked; authenticate again".into(),
        ));
    }
    match (needed, caps) {
        (Some(needed), Some(caps)) if !caps.contains(&needed) => {
            Some(StoreError::PermissionDenied(format!(
                "key '{key_id}' lacks the {needed} capability for this call"
            )))
        }
        _ => None,
    }
}

/// The key id of `principal` (`tenant/key_id`) if it is a key of `tenant` (the operator is not).
pub(crate) fn key_of<'p>(tenant: &str, principal: &'p str) -> Option<&'p str> {
    principal
        .strip_prefix(tenant)
        .and_then(|rest| rest.strip_prefix('/'))
}

/// A relaxed policy's `max_delay` (`None` under sync).
fn relaxed_delay(policy: &SyncPolicy) -> Option<Duration> {
    match policy {
        SyncPolicy::Always => None,
        SyncPolicy::Relaxed { max_delay, .. } => Some(*max_delay),
    }
}

/// The durability policy as Stats shows it.
pub fn describe_policy(p: &SyncPolicy) -> String {
    match p {
        SyncPolicy::Always => "sync".into(),
        SyncPolicy::Relaxed {
            max_delay,
            max_records,
        } => format!(
            "relaxed(max_delay_ms={}, max_records={max_records})",
            max_delay.as_millis()
        ),
    }
}

struct Waiting<T> {
    seq: u64,
    /// When it went into the WAL (for `cube_change_stage_seconds{stage="durable"}`).
    appended: Instant,
    op: WalOp,
    hint: Option<(Coord, Hint)>,
    /// The caller and its answer; `None` when the answer went to [`EarlyAnswers`].
    answer: Option<(T, Reply)>,
}

/// A checkpoint to run off the actor's thread: flush the state store as of `seq`.
pub struct CheckpointJob {
    backend: Arc<dyn StateBackend>,
    /// Set when catalog changes were applied since the last checkpoint: they are durable only
    /// in the WAL and the state store until the catalog is synced, which must happen before the
    /// WAL goes and before the store lets them go.
    catalog: Option<Arc<Catalog>>,
    /// The catalog changes the state store keeps (by seq) that the synced catalog covers.
    release: Vec<u64>,
    /// Deletes the WAL segments the checkpoint covers once the flush is done (`None` once the
    /// log was taken for closing: the close removes it whole).
    deleter: Option<(String, cube_wal::SegmentDeleter)>,
    pub seq: u64,
}

impl CheckpointJob {
    /// Blocking: make the state store durable up to at least `seq`.
    pub fn run(self) -> Result<Duration, BackendError> {
        cube_wal::failpoint::hit("checkpoint-before-flush");
        let started = Instant::now();
        if let Some(catalog) = &self.catalog {
            catalog
                .make_durable()
                .map_err(|e| BackendError(format!("syncing the catalog: {e}")))?;
            crate::state::release_catalog_changes(&*self.backend, &self.release)?;
        }
        self.backend.flush()?;
        cube_wal::failpoint::hit("checkpoint-after-flush");
        let took = started.elapsed();
        // Off the actor's thread: unlinks and a directory fsync. A failed unlink only leaves
        // covered segments behind (recovery skips them), and the next checkpoint retries; a
        // failed directory fsync fails the checkpoint, which poisons the tenant until the
        // restart, as every failed fsync does (a later one could report success falsely).
        if let Some((tenant, deleter)) = &self.deleter {
            match deleter.delete_through(self.seq) {
                Ok((n, bytes)) if n > 0 => {
                    tracing::debug!(tenant = %tenant, seq = self.seq, segments = n, bytes, "wal segments deleted after checkpoint");
                }
                Ok(_) => {}
                Err(e) if e.is_failed_sync() => {
                    return Err(BackendError(format!(
                        "the wal directory's fsync after deleting checkpointed segments: {e}"
                    )));
                }
                Err(e) => {
                    tracing::warn!(tenant = %tenant, error = %e, "deleting checkpointed wal segments failed");
                }
            }
        }
        Ok(took)
    }
}

/// One tenant: state, WAL shard, and the callers whose changes are not applied yet.
pub struct TenantCore<T> {
    tenant: String,
    state: TenantState,
    /// `None` once closed for shutdown.
    wal: Option<WalShard>,
    // INVARIANT: ordered by seq, all above `state.applied_seq()`.
    waiting: VecDeque<Waiting<T>>,
    /// Answers that need no record of their own but were decided while changes were waiting
    /// (a second Seal of a cell whose first is not durable yet): each goes out once the changes
    /// up to its seq are answered, and fails if they fail.
    deferred: VecDeque<(u64, T, Result<Reply, StoreError>)>,
    /// Highest seq the WAL reported durable.
    durable: u64,
    /// Records that may be acknowledged beyond `durable` (0 = policy sync).
    window: u64,
    /// The relaxed policy's `max_delay` in force (narrowed with the window; `None` under sync).
    max_delay: Option<Duration>,
    /// Changes acknowledged before their fdatasync and not reported durable yet, in buckets of
    /// about a millisecond: (first seq of the bucket, when it was acknowledged). See
    /// [`TenantCore::early_acks_within_delay`].
    early_acked: VecDeque<(u64, Instant)>,
    /// The newest seq in `early_acked`'s last bucket.
    last_early_acked: u64,
    policy: SyncPolicy,
    checkpoint: CheckpointPolicy,
    checkpoint_seq: u64,
    checkpoint_running: bool,
    bytes_since_checkpoint: u64,
    last_checkpoint: Instant,
    stats: Arc<SharedStats>,
    space: Option<Arc<crate::SpaceGuard>>,
    /// Reused encoding buffer (one allocation per core, not per write).
    scratch: Vec<u8>,
    catalog: Option<Arc<Catalog>>,
    /// See [`CoreConfig::janitor`].
    janitor: Option<Arc<tokio::sync::Notify>>,
    /// See [`CoreConfig::lost_acknowledged`].
    lost_acknowledged: Option<Arc<TenantSet>>,
    /// This tenant's loss of acknowledged changes was logged and told (once is enough).
    lost_noted: bool,
    /// Per key, the capability set of its newest logged but unapplied change, with that
    /// change's seq: the next change of the key starts from it.
    pending_caps: HashMap<String, (u64, Vec<Capability>)>,
    /// The seq of a durable record this server could not apply, if one poisoned the tenant: a
    /// restart would meet it again, so writers are told an operator must repair it.
    unappliable: Option<u64>,
    /// Keys whose revocation is logged but not applied yet.
    pending_revokes: HashSet<String>,
    /// Where answers the syncer may send itself go (none: every answer comes from here).
    early: Option<Arc<EarlyAnswers<T>>>,
    /// Whether, since when and why durable changes wait unapplied: see
    /// [`TenantCore::room_to_apply`].
    held: Option<Held>,
}

/// Applies held rather than waited for on the actor's thread ([`TenantCore::room_to_apply`]).
#[derive(Debug, Clone, Copy)]
struct Held {
    since: Instant,
    why: cube_metrics::ApplyHold,
}

/// Longest a hold waits for a catalog sync ([`crate::Catalog::syncing`]) before the apply takes
/// the catalog's lock: a sync holds it for one journal fdatasync (~0.1 ms on a fast disk).
const CATALOG_HOLD_LIMIT: Duration = Duration::from_millis(20);

impl<T> Drop for TenantCore<T> {
    fn drop(&mut self) {
        // The log first: its final fdatasync lets the syncer send the early answers it covers.
        // Those left were not made durable; dropping them tells their callers so.
        drop(self.wal.take());
        if let Some(early) = &self.early {
            drop(early.take_all());
        }
    }
}

impl<T> std::fmt::Debug for TenantCore<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TenantCore")
            .field("tenant", &self.tenant)
            .field("waiting", &self.waiting.len())
            .finish()
    }
}

/// Records replayed per state-store batch during recovery...
const REPLAY_BATCH: usize = 4096;
/// ...and at most about this many record bytes: 4096 records of 1 MiB values would be a 4 GiB
/// batch, held in memory and, past the state store's write-buffer limit (192 MiB), waited on
/// inside it until a flush makes room (forever, if the flush fails).
const REPLAY_BATCH_BYTES: usize = 16 << 20;
/// Longest key id a capability change accepts (INVALID_ARGUMENT beyond): the same cap as the
/// handshake's names.
const MAX_KEY_ID_BYTES: usize = 128;

/// The shape of a `key_id` a caller names (`Access.Grant`/`Revoke`): present, and not longer
/// than [`MAX_KEY_ID_BYTES`]. Key ids are `k-` and 12 hex digits; the cap keeps the NOT_FOUND
/// message that quotes an unknown id far under what gRPC clients accept as trailing metadata.
/// Checked by the gateway too, before the call reaches a (perhaps busy) tenant.
pub fn check_key_id(key_id: &str) -> Result<(), StoreError> {
    if key_id.is_empty() {
        return Err(StoreError::InvalidArgument("key_id is required".into()));
    }
    if key_id.len() > MAX_KEY_ID_BYTES {
        return Err(StoreError::InvalidArgument(format!(
            "key_id is at most {MAX_KEY_ID_BYTES} bytes; got {}",
            key_id.len()
        )));
    }
    Ok(())
}

/// A state-store failure with less than this free on the tenant's file system is reported as
/// a full disk (fjall's errors do not say ENOSPC once its keyspace is poisoned).
const FULL_DISK_HINT_BYTES: u64 = 16 << 20;

/// Whether `dir`'s file system has less than [`FULL_DISK_HINT_BYTES`] free.
pub(crate) fn nearly_full(dir: &Path) -> bool {
    nix::sys::statvfs::statvfs(dir).is_ok_and(|s| {
        s.blocks_available().saturating_mul(s.fragment_size()) < FULL_DISK_HINT_BYTES
    })
}

/// Open the tenant's state store; `sync_failed` is called if what failed is a sync (of its
/// partition's directory), which is not retried.
fn open_backend(
    tenant: &str,
    dir: &Path,
    cache: u64,
    sync_failed: impl FnOnce(),
) -> Result<FjallBackend, StoreError> {
    open_waiting(|| FjallBackend::open(dir, cache), FjallBackend::is_locked).map_err(|e| {
        if FjallBackend::is_failed_sync(&e) {
            sync_failed();
        }
        tracing::error!(tenant, error = %e, "tenant state store failed to open");
        // Only a write refused for space or quota is "disk full" (not a held lock, a damaged
        // manifest, or a failed sync on a nearly full disk).
        if e.is_no_space() {
            return no_space_to_open(tenant);
        }
        StoreError::Unavailable(format!(
            "tenant '{tenant}' is unavailable: its state store could not be opened (see the \
             server log)"
        ))
    })
}

/// What a tenant's open that failed for lack of disk space answers.
fn no_space_to_open(tenant: &str) -> StoreError {
    StoreError::ResourceExhausted(format!(
        "tenant '{tenant}' cannot be opened now: the server's disk is full. Nothing acknowledged \
         is lost; retry after space is freed"
    ))
}

impl<T> TenantCore<T> {
    /// Open the tenant's state store in `state_dir`, replay its WAL in `wal_dir` after the
    /// store's applied seq, and start the WAL's syncer.
    pub fn open(
        tenant: &str,
        wal_dir: &Path,
        state_dir: &Path,
        config: &CoreConfig,
        notify: Option<DurableNotify>,
    ) -> Result<(TenantCore<T>, RecoveryReport), StoreError> {
        let started = Instant::now();
        // A state directory from a build that kept tenant state in sled is converted once.
        match migrate_sled_state(state_dir, config.state_cache_bytes) {
            Ok(true) => tracing::info!(tenant, "tenant state migrated from sled to fjall"),
            Ok(false) => {}
            Err(e) => {
                tracing::error!(tenant, error = %e, "tenant state migration failed");
                return Err(StoreError::Unavailable(format!(
                    "tenant '{tenant}' is unavailable: its state store could not be migrated \
                     (see the server log)"
                )));
            }
        }
        // A sync that fails here is reported as the WAL reports its own (`DurableEvent::Poisoned`
        // through `notify`): the tenant is then not reopened before a restart, since a retried
        // open would find what the failed sync left in the page cache and take it for durable.
        let notify: Option<Arc<dyn Fn(DurableEvent) + Send + Sync>> = notify.map(Arc::from);
        let sync_failed = || {
            if let Some(notify) = &notify {
                notify(DurableEvent::Poisoned);
            }
        };
        // The store's directory (and the tenant's directory entry) is created durably first:
        // fjall does not fsync the parents of the directories it creates.
        cube_wal::create_dir_durably(state_dir).map_err(|e| {
            if e.is_failed_sync() {
                sync_failed();
            }
            open_error(tenant, &e)
        })?;
        let backend: Arc<dyn StateBackend> = Arc::new(open_backend(
            tenant,
            state_dir,
            config.state_cache_bytes,
            sync_failed,
        )?);
        let mut state = TenantState::open(backend, config.limits).map_err(|e| {
            tracing::error!(tenant, error = %e, "tenant state unreadable");
            StoreError::Unavailable(format!(
                "tenant '{tenant}' is unavailable: its state store is unreadable (see the server \
                 log)"
            ))
        })?;
        let store_opened = started.elapsed();
        let start_after = state.applied_seq();
        let mut buffered: Vec<(u64, WalOp)> = Vec::with_capacity(REPLAY_BATCH);
        let mut buffered_bytes = 0usize;
        // Why a replay batch could not be applied, if one could not: stops the WAL's reading,
        // and is reported by `replay_error` rather than as the WAL's error.
        let mut apply_failed: Option<ApplyError> = None;
        // Catalog changes to make again (keys, durability), in log order: first those the store
        // kept (applied, their records possibly gone from the log, the catalog's write of them
        // possibly lost), then those replayed from the log.
        let mut replayed_changes: Vec<CatalogChange> = state
            .catalog_pending()
            .map_err(|e| {
                tracing::error!(tenant, error = %e, "tenant state store's kept catalog changes unreadable");
                StoreError::Unavailable(format!(
                    "tenant '{tenant}' is unavailable: its state store is unreadable (see the \
                     server log)"
                ))
            })?
            .iter()
            .filter_map(|(seq, op)| catalog_change(*seq, op))
            .collect();
        if !replayed_changes.is_empty() && config.catalog.is_none() {
            tracing::error!(
                tenant,
                "the state store keeps catalog changes and no catalog was given to apply them to"
            );
            return Err(StoreError::Unavailable(format!(
                "tenant '{tenant}' is unavailable: it cannot be opened without the server's \
                 catalog"
            )));
        }
        let opened = WalShard::open(
            wal_dir,
            config.wal.clone(),
            start_after,
            &mut |seq, payload| {
                let op = WalOp::decode(payload).map_err(|e| format!("undecodable record: {e}"))?;
                if let Some(change) = catalog_change(seq, &op) {
                    // Checked before the record's batch is applied: without the catalog the
                    // change would be lost once a checkpoint covered its record.
                    if config.catalog.is_none() {
                        return Err(
                            "the log holds a catalog change and no catalog was given to apply it to"
                                .into(),
                        );
                    }
                    replayed_changes.push(change);
                }
                buffered.push((seq, op));
                buffered_bytes += payload.len();
                if buffered.len() >= REPLAY_BATCH || buffered_bytes >= REPLAY_BATCH_BYTES {
                    buffered_bytes = 0;
                    if let Err(e) = state.apply_all(std::mem::take(&mut buffered)) {
                        let detail = e.to_string();
                        apply_failed = Some(e);
                        return Err(detail);
                    }
                }
                Ok(())
            },
            notify
                .clone()
                .map(|notify| Box::new(move |event| notify(event)) as DurableNotify),
        );
        if let Some(e) = apply_failed {
            return Err(replay_error(tenant, e));
        }
        let (wal, report) = opened.map_err(|e| open_error(tenant, &e))?;
        state
            .apply_all(buffered)
            .map_err(|e| replay_error(tenant, e))?;
        // Catalog changes applied since the last checkpoint may not have reached the catalog's
        // disk: make them again; the checkpoint below makes the catalog durable before it lets
        // their records and the store's copies go.
        let catalog_to_sync = config
            .catalog
            .as_ref()
            .filter(|_| !replayed_changes.is_empty());
        if let Some(catalog) = catalog_to_sync {
            for (seq, key_id, edit) in &replayed_changes {
                apply_catalog_edit(catalog, tenant, key_id, edit, Replaying::Yes).map_err(|e| {
                    match e {
                        // The catalog's own failures (its journal, its files) say what they are.
                        StoreError::Unavailable(_) | StoreError::ResourceExhausted(_) => e,
                        // Anything else (a policy outside this build's bounds, a tenant the
                        // catalog lacks) is no fault of the caller that opened the tenant.
                        other => {
                            tracing::error!(tenant, seq, key = %key_id, error = %other, "a catalog change in the tenant's log could not be made again in the catalog");
                            StoreError::Unavailable(format!(
                                "tenant '{tenant}' is unavailable: the catalog change of its \
                                 write-ahead-log record {seq} could not be made again in the \
                                 catalog (see the server log); an operator must repair it \
                                 before it can serve"
                            ))
                        }
                    }
                })?;
            }
            tracing::info!(
                tenant,
                changes = replayed_changes.len(),
                "catalog changes replayed into the catalog"
            );
        }
        // The replayed batches are only in memtables: flush before anything relies on them.
        // Only then are the WAL segments the store covers not needed any more.
        let replayed = started.elapsed();
        // On a full disk the flush fails, but the state recovered above is whole (the WAL holds
        // everything acknowledged): the tenant opens for reads only, refusing changes with
        // RESOURCE_EXHAUSTED, and no WAL segment is deleted. The directory closes it once
        // there is room, and the next call opens it again (see `close_failed`).
        let mut read_only = false;
        // Which failed: the state store's flush (its own fsyncs) or the catalog's part (the
        // catalog keeps its own failure: a failed journal fsync fails it for every tenant).
        let synced = match catalog_to_sync {
            Some(catalog) => catalog
                .make_durable()
                .map_err(|e| e.to_string())
                .and_then(|()| {
                    let kept = state.take_catalog_changes();
                    crate::state::release_catalog_changes(&*state.backend(), &kept)
                        .map_err(|e| e.to_string())
                }),
            None => Ok(()),
        }
        .map_err(|e| (e, false))
        .and_then(|()| state.backend().flush().map_err(|e| (e.to_string(), true)));
        let checkpoint_seq = match synced {
            Ok(()) => state.applied_seq(),
            Err((e, _)) if nearly_full(state_dir) => {
                tracing::warn!(tenant, error = %e, "tenant state store or catalog could not be synced: the disk is full; serving reads only until space is freed");
                read_only = true;
                start_after
            }
            Err((e, store_flush)) => {
                tracing::error!(tenant, error = %e, "tenant state store or catalog could not be synced");
                if store_flush {
                    sync_failed();
                }
                return Err(StoreError::Unavailable(format!(
                    "tenant '{tenant}' is unavailable: its state store could not be synced (see \
                     the server log)"
                )));
            }
        };
        if !read_only && let Err(e) = wal.delete_segments_through(checkpoint_seq) {
            if e.is_failed_sync() {
                // The shard poisoned itself (and told its owner, who keeps the tenant closed
                // until the restart): the open fails rather than serve as healthy.
                return Err(open_error(tenant, &e));
            }
            tracing::warn!(tenant, error = %e, "could not delete checkpointed wal segments");
        }
        // Every logged change older than a policy pinned in the catalog is now applied and
        // covered by the store: none can be replayed again, so the pin has done its work.
        if !read_only
            && let Some(catalog) = &config.catalog
            && let Err(e) = catalog.release_durability_pin(tenant)
        {
            tracing::warn!(tenant, error = %e, "could not release the durability policy's pin; a policy change logged from now on and cut off by a crash before the catalog takes it would not be made again by recovery");
        }
        cube_metrics::RECOVERY_SECONDS.observe(started.elapsed().as_secs_f64());
        cube_metrics::RECOVERY_TRUNCATED_BYTES.inc_by(report.truncated_bytes);
        tracing::info!(
            tenant,
            checkpoint_seq,
            records = report.records_replayed,
            last_seq = report.last_seq,
            truncated_bytes = report.truncated_bytes,
            store_open_ms = store_opened.as_millis() as u64,
            replay_ms = (replayed - store_opened).as_millis() as u64,
            total_ms = started.elapsed().as_millis() as u64,
            "tenant recovered"
        );
        let durable = wal.durable_seq();
        let stats = Arc::new(SharedStats::default());
        stats.wal_bytes.store(wal.wal_bytes(), Ordering::Relaxed);
        stats.last_seq.store(state.applied_seq(), Ordering::Relaxed);
        stats
            .checkpoint_seq
            .store(checkpoint_seq, Ordering::Relaxed);
        let policy = config.wal.sync;
        let window = policy.unsynced_records().unwrap_or(0);
        let mut core = TenantCore {
            max_delay: relaxed_delay(&policy),
            early_acked: VecDeque::new(),
            last_early_acked: 0,
            tenant: tenant.to_string(),
            state,
            wal: Some(wal),
            waiting: VecDeque::new(),
            deferred: VecDeque::new(),
            durable,
            window,
            policy,
            checkpoint: config.checkpoint,
            space: config.space.clone(),
            checkpoint_seq,
            checkpoint_running: false,
            // The open just flushed everything applied.
            bytes_since_checkpoint: 0,
            last_checkpoint: Instant::now(),
            stats,
            scratch: Vec::with_capacity(256),
            catalog: config.catalog.clone(),
            janitor: config.janitor.clone(),
            lost_acknowledged: config.lost_acknowledged.clone(),
            lost_noted: false,
            pending_caps: HashMap::new(),
            unappliable: None,
            pending_revokes: HashSet::new(),
            early: None,
            held: None,
        };
        if read_only {
            core.poison_after(DurableEvent::WriteFailed { no_space: true });
        }
        Ok((core, report))
    }

    /// Let the syncer answer settled durable changes itself (see [`EarlyAnswers`]); the WAL's
    /// notify callback must send what [`EarlyAnswers::take_through`] gives it, after it reported
    /// the event to this core's shell.
    pub fn answer_early_through(&mut self, early: Arc<EarlyAnswers<T>>) {
        self.early = Some(early);
    }

    /// Highest WAL seq the state store holds durably.
    pub fn checkpoint_seq(&self) -> u64 {
        self.checkpoint_seq
    }

    pub fn tenant(&self) -> &str {
        &self.tenant
    }

    pub fn state(&self) -> &TenantState {
        &self.state
    }

    pub fn stats(&self) -> Arc<SharedStats> {
        Arc::clone(&self.stats)
    }

    pub fn policy(&self) -> SyncPolicy {
        self.policy
    }

    /// Callers waiting for their change to be applied.
    pub fn waiting(&self) -> usize {
        self.waiting.len() + self.deferred.len()
    }

    /// Refuse a caller whose key is revoked, or lacks the capability `cmd` needs, as the log has
    /// it: the gateway checked the key against the catalog when the call came in, and the
    /// catalog changes only when a revocation's or a capability change's record is applied.
    /// Such a record may be logged but not applied yet (the pending rights), or applied after
    /// the gateway's check and before this call reached the actor (the catalog as it is now);
    /// either way, without this the caller's change would be logged (and audited) after the
    /// record that took its right away.
    fn check_rights(&self, cmd: &Command, caller: &Caller) -> Result<(), StoreError> {
        // The operator (the admin socket) is no key of the tenant's.
        let Some(key_id) = key_of(&self.tenant, &caller.principal) else {
            return Ok(());
        };
        let needed = match cmd {
            Command::Read { .. } => Some(Capability::Read),
            Command::ChangeCapabilities { .. } => Some(Capability::Admin),
            Command::Write { .. }
            | Command::Delete { .. }
            | Command::Prog { .. }
            | Command::Run { .. }
            | Command::Link { .. }
            | Command::Unlink { .. }
            | Command::Seal { .. } => Some(Capability::Write),
            // Security events and the operator's own changes need no capability of the caller.
            Command::Event { .. }
            | Command::RevokeKey { .. }
            | Command::CreateKey { .. }
            | Command::SetDurability { .. }
            | Command::RecordCertificate { .. } => None,
        };
        match rights_now(
            &self.stats.pending_rights,
            self.catalog.as_deref(),
            &self.tenant,
            key_id,
            needed,
        ) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Publish the pending revocations and capability changes after they changed.
    fn publish_pending_rights(&self) {
        self.stats
            .pending_rights
            .publish(&self.pending_revokes, &self.pending_caps);
    }

    /// Handle a command. Returns an answer now, or `None` when the answer waits for durability
    /// (it then comes out of [`TenantCore::on_durable`]).
    pub fn handle(&mut self, cmd: Command, caller: &Caller, token: T) -> Option<Answer<T>> {
        // Tests only (this crate's): nothing on the call path of a real server.
        #[cfg(test)]
        if let Some(delay) = self
            .wal
            .as_ref()
            .and_then(|w| cube_wal::failpoint::handling_delay(w.dir()))
        {
            std::thread::sleep(delay);
        }
        if cmd.is_mutation()
            && let Err(e) = self.writable(cmd.passes_space_guard())
        {
            return Some((token, Err(e)));
        }
        if let Err(e) = self.check_rights(&cmd, caller) {
            return Some((token, Err(e)));
        }
        let prepared = match cmd {
            Command::ChangeCapabilities {
                key_id,
                grant,
                revoke,
            } => self.prepare_capabilities(key_id, &grant, &revoke, caller),
            Command::RevokeKey { key_id } => self.prepare_key_revocation(key_id, caller),
            Command::CreateKey { admin } => self.prepare_key_creation(admin, caller),
            Command::SetDurability { policy } => self.prepare_durability(policy, caller),
            Command::RecordCertificate {
                key_id,
                sha256,
                not_after_ms,
            } => self.prepare_certificate(&key_id, &sha256, not_after_ms, caller),
            cmd => self.state.prepare(cmd, caller),
        };
        let (op, reply, effect, growth) = match prepared {
            Err(e) => return self.answer_after_waiting(token, Err(e)),
            // A read answers from the applied state alone, never from what is pending.
            Ok(Prepared::Immediate(reply @ Reply::Read(_))) => return Some((token, Ok(reply))),
            Ok(Prepared::Immediate(reply)) => return self.answer_after_waiting(token, Ok(reply)),
            Ok(Prepared::Log {
                op,
                reply,
                effect,
                growth,
            }) => (op, reply, effect, growth),
        };
        self.scratch.clear();
        // NOTE: encoding into a Vec cannot fail (prost only fails on a too-small fixed buffer).
        let _ = op.encode(&mut self.scratch);
        let Some(wal) = &self.wal else {
            return Some((token, Err(shutting_down())));
        };
        let seq = match wal.append(&self.scratch) {
            Ok(seq) => seq,
            Err(e) => return Some((token, Err(self.append_error(&e)))),
        };
        self.bytes_since_checkpoint += self.scratch.len() as u64;
        // A catalog change (a key's capabilities, a key created or revoked, a durability policy)
        // and a certificate's entry are never acknowledged before they are durable, whatever
        // the tenant's policy; the changes after one wait behind it.
        let relaxed_ok = match catalog_change(seq, &op) {
            None => !is_certificate_entry(&op),
            Some((_, key_id, CatalogEdit::Caps(caps))) => {
                self.pending_caps.insert(key_id, (seq, caps));
                self.publish_pending_rights();
                false
            }
            Some((_, key_id, CatalogEdit::Revoke)) => {
                self.pending_revokes.insert(key_id);
                self.publish_pending_rights();
                false
            }
            Some((_, _, CatalogEdit::Durability(policy))) => {
                // A narrower policy holds from this change on, without waiting for the reopen
                // that makes it the log's own: the changes logged after it are acknowledged
                // only as it allows (under `sync`, after their fdatasync), and the syncer syncs
                // as it says. So a tenant switched back to `sync` while busy (never idle long
                // enough to be closed and reopened) stops acknowledging before fdatasync at
                // once. A wider policy waits for the reopen. (The log is open: the append above
                // succeeded.)
                if let Some(wal) = &self.wal {
                    let now = wal.narrow_policy(policy);
                    self.window = now.unsynced_records().unwrap_or(0);
                    self.max_delay = relaxed_delay(&now);
                    if now != self.policy {
                        *self
                            .stats
                            .narrowed_policy
                            .lock()
                            .unwrap_or_else(|p| p.into_inner()) =
                            Some(describe_policy(&now).into());
                    }
                }
                false
            }
            Some((_, _, CatalogEdit::Create { .. })) => false,
        };
        let room = (relaxed_ok
            && self.waiting.is_empty()
            && seq <= self.durable + self.window
            && self.unsynced_within_bound()
            && self.early_acks_within_delay())
        .then(|| self.state.has_room());
        if matches!(room, Some(Ok(false))) {
            // Queued below, and applied when there is room (the actor asks again shortly).
            self.hold(cube_metrics::ApplyHold::StateStore);
        }
        if matches!(room, Some(Ok(true))) {
            // Relaxed policy, inside the window: apply and answer before the fsync.
            let hints = match effect {
                Effect::Cell(c, _, hint) => vec![(c, hint)],
                _ => Vec::new(),
            };
            return Some(match self.state.apply_hinted(vec![(seq, op)], hints) {
                Ok(()) => {
                    self.note_early_ack(seq);
                    self.stats.last_seq.store(seq, Ordering::Relaxed);
                    (token, Ok(Prepared::seal(reply, seq)))
                }
                // The record is in the log: the reopen replays it.
                Err(e) => (token, Err(self.apply_failed(&e).outcome_unknown())),
            });
        }
        let hint = self.state.note_pending(seq, &op, effect, growth);
        let answer = match &self.early {
            // Settled now, and not a catalog change (which must reach the catalog first).
            Some(early) if relaxed_ok && self.window == 0 => {
                early.push(seq, token, Prepared::seal(reply, seq));
                None
            }
            _ => Some((token, reply)),
        };
        self.waiting.push_back(Waiting {
            seq,
            appended: Instant::now(),
            op,
            hint,
            answer,
        });
        None
    }

    /// Whether the log's unsynced bytes (every change appended past its last fdatasync, the one
    /// being decided included) are within its byte bound, so a relaxed tenant may acknowledge
    /// them before their fdatasync: the relaxed window is `max_records` changes *and* at most
    /// `max_unsynced_bytes` (the server's `--max-in-flight-bytes`). Past it, changes wait for
    /// their fdatasync as under `sync`, and their requests stay counted in flight, so a tenant
    /// writing large values, or one whose disk stalls, holds no more than that in acknowledged
    /// but unsynced changes (the log's syncer syncs as soon as its written bytes reach it).
    fn unsynced_within_bound(&self) -> bool {
        self.wal
            .as_ref()
            .is_some_and(|w| w.unsynced_bytes() <= w.max_unsynced_bytes())
    }

    /// Whether the oldest change acknowledged before its fdatasync, and not reported durable
    /// since, was acknowledged less than twice the policy's `max_delay` ago: one `max_delay`
    /// for the syncer's own deadline (it syncs once its oldest unsynced write is that old), one
    /// for that write, the fdatasync and its report. Past that the syncer is held up (a slow
    /// fdatasync, a rotation waiting for its next segment), and changes wait for their
    /// fdatasync as under `sync`: every change a power cut can lose was acknowledged within
    /// 2 × `max_delay` of the oldest of them. (With the bound at one `max_delay`, a healthy
    /// tenant stalled at every sync: its oldest acknowledgement is older than that when the
    /// syncer's deadline starts the fdatasync.) Until 2026-12-06 the time bound counted only
    /// from the syncer's write, and a held-up syncer let acknowledgements go on for as long as
    /// it was held (within the record and byte bounds).
    fn early_acks_within_delay(&self) -> bool {
        match (self.max_delay, self.early_acked.front()) {
            (Some(delay), Some(&(_, at))) => at.elapsed() < delay.saturating_mul(2),
            _ => true,
        }
    }

    /// Record `seq` as acknowledged before its fdatasync, now.
    fn note_early_ack(&mut self, seq: u64) {
        let now = Instant::now();
        // Buckets of ~1 ms, each dated by its first change: older than any change in it, so
        // the bound errs towards waiting, and at most ~10,000 of them for the largest delay.
        if self
            .early_acked
            .back()
            .is_none_or(|&(_, at)| now.duration_since(at) >= Duration::from_millis(1))
        {
            self.early_acked.push_back((seq, now));
        }
        self.last_early_acked = seq;
    }

    /// Forget the early acknowledgements up to `durable`.
    fn forget_early_acks(&mut self, durable: u64) {
        if self.last_early_acked <= durable {
            self.early_acked.clear();
            return;
        }
        // A bucket is wholly durable once the next one starts at most one past `durable`.
        while self.early_acked.len() >= 2 && self.early_acked[1].0 <= durable + 1 {
            self.early_acked.pop_front();
        }
    }

    /// An answer decided without a record of its own. It may rest on changes still waiting for
    /// their fsync (the pending state they leave), so while any is waiting it goes out after
    /// them, and fails with them.
    fn answer_after_waiting(
        &mut self,
        token: T,
        result: Result<Reply, StoreError>,
    ) -> Option<Answer<T>> {
        match self.waiting.back() {
            None => Some((token, result)),
            Some(last) => {
                self.deferred.push_back((last.seq, token, result));
                None
            }
        }
    }

    /// Fail every caller still waiting, changes and deferred answers alike.
    fn fail_all_waiting(&mut self, err: &StoreError) -> Vec<Answer<T>> {
        // Nothing is left to apply.
        self.held = None;
        // A waiting change is in the log already; a deferred answer logged nothing.
        let logged = err.outcome_unknown();
        // An early answer whose change is durable is answered as such (the reopen replays it),
        // and counted as answered, so reads wait for it (see `EarlyAnswers`); the rest fail.
        let (durable, not_durable) = match &self.early {
            Some(e) => (e.take_through(self.durable), e.take_all()),
            None => (Vec::new(), Vec::new()),
        };
        let early = durable
            .into_iter()
            .map(|(token, reply)| (token, Ok(reply)))
            .chain(
                not_durable
                    .into_iter()
                    .map(|(_, token, _)| (token, Err(logged.clone()))),
            );
        let waiting = self
            .waiting
            .drain(..)
            .filter_map(|w| w.answer)
            .map(|(token, _)| (token, Err(logged.clone())));
        let deferred = self
            .deferred
            .drain(..)
            .map(|(_, token, _)| (token, Err(err.clone())));
        early.chain(waiting).chain(deferred).collect()
    }

    /// Apply what may now be answered and answer its callers, or fail every waiting caller if
    /// the shard was poisoned.
    pub fn on_durable(&mut self, event: DurableEvent) -> Vec<Answer<T>> {
        match event {
            DurableEvent::Durable(upto) => {
                self.durable = self.durable.max(upto);
                self.forget_early_acks(self.durable);
                if self.is_poisoned() {
                    // A group failed to apply (or the tenant failed otherwise): nothing behind
                    // it may be applied over the gap, so its waiting callers get the error too.
                    let err = self.poisoned_error();
                    return self.fail_all_waiting(&err);
                }
                if let Some(wal) = &self.wal {
                    self.stats
                        .wal_bytes
                        .store(wal.wal_bytes(), Ordering::Relaxed);
                }
                // Inside the relaxed window, except a catalog change or a certificate's entry:
                // that waits for its own fdatasync, and everything after it waits behind it.
                let durable = self.durable;
                // (Under `sync` the window is empty: no look at the log's byte count.)
                let limit = if self.window > 0
                    && self.unsynced_within_bound()
                    && self.early_acks_within_delay()
                {
                    durable + self.window
                } else {
                    durable
                };
                let n = self
                    .waiting
                    .iter()
                    .take_while(|w| {
                        w.seq <= durable
                            || (w.seq <= limit
                                && catalog_change(w.seq, &w.op).is_none()
                                && !is_certificate_entry(&w.op))
                    })
                    .count();
                if n == 0 {
                    self.held = None;
                    return Vec::new();
                }
                // A held group became durable before its hold began: its `durable` stage ends
                // there (the hold is the state store's wait, not the log's).
                let held_since = self.held.map(|h| h.since);
                let no_room = match self.room_to_apply(n) {
                    Ok(true) => None,
                    // Held: the actor asks again shortly ([`TenantCore::apply_held`]). Early
                    // answers the syncer left to this core (it reported before they were
                    // queued) go out now, durable: readers wait for the apply all the same.
                    Ok(false) => {
                        let early = self.early.as_ref().map(|e| e.take_through(durable));
                        return early
                            .into_iter()
                            .flatten()
                            .map(|(token, reply)| (token, Ok(reply)))
                            .collect();
                    }
                    Err(e) => Some(e),
                };
                // Changes past `durable` answered now count as acknowledged early, as in
                // `handle` (seqs ascend: the first of them opens a bucket, the last closes it).
                if let Some(first) = self
                    .waiting
                    .iter()
                    .take(n)
                    .map(|w| w.seq)
                    .find(|&seq| seq > durable)
                {
                    self.note_early_ack(first);
                    self.last_early_acked = self.waiting[n - 1].seq;
                }
                let injected = self
                    .wal
                    .as_ref()
                    .is_some_and(|w| cube_wal::failpoint::before_apply(w.dir()));
                let group: Vec<Waiting<T>> = self.waiting.drain(..n).collect();
                let (upto, applied_records) = (group.last().map_or(0, |w| w.seq), group.len());
                let now = Instant::now();
                let durable_at = held_since.unwrap_or(now);
                let mut records = Vec::with_capacity(group.len());
                let mut replies = Vec::with_capacity(group.len());
                let mut hints = Vec::with_capacity(group.len());
                let mut catalog_changes = Vec::new();
                for w in group {
                    cube_metrics::CHANGE_DURABLE.observe(
                        durable_at
                            .saturating_duration_since(w.appended)
                            .as_secs_f64(),
                    );
                    catalog_changes.extend(catalog_change(w.seq, &w.op));
                    records.push((w.seq, w.op));
                    if let Some((token, reply)) = w.answer {
                        replies.push((token, reply, w.seq));
                    }
                    hints.extend(w.hint);
                }
                let applied = if let Some(e) = no_room {
                    Err(ApplyError::Backend(e))
                } else if injected {
                    Err(ApplyError::Backend(BackendError("injected (test)".into())))
                } else {
                    self.state.apply_hinted(records, hints)
                };
                let applied = applied
                    .map_err(|e| self.apply_failed(&e))
                    .and_then(|()| self.apply_catalog_changes(catalog_changes));
                let took = now.elapsed().as_secs_f64();
                for _ in 0..applied_records {
                    cube_metrics::CHANGE_APPLY.observe(took);
                }
                match applied {
                    Ok(()) => {
                        // Release: a reader that sees this seq sees the state it names.
                        self.stats.last_seq.store(upto, Ordering::Release);
                        if self.early.is_some() {
                            self.stats.applied.notify_waiters();
                        }
                        // Early answers the syncer has not sent yet (it reported the event
                        // before this core queued them): durable, so sent from here.
                        let early = self.early.as_ref().map(|e| e.take_through(upto));
                        let mut answers: Vec<Answer<T>> = early
                            .into_iter()
                            .flatten()
                            .map(|(token, reply)| (token, Ok(reply)))
                            .collect();
                        answers.extend(
                            replies
                                .into_iter()
                                .map(|(token, reply, seq)| (token, Ok(Prepared::seal(reply, seq)))),
                        );
                        let ready = self
                            .deferred
                            .iter()
                            .take_while(|(after, _, _)| *after <= upto)
                            .count();
                        answers.extend(self.deferred.drain(..ready).map(|(_, t, r)| (t, r)));
                        answers
                    }
                    Err(err) => {
                        // The records behind the failed group must not be applied over it.
                        // The group's own are durable: the reopen's replay applies them.
                        let logged = err.outcome_unknown();
                        let mut answers: Vec<Answer<T>> = replies
                            .into_iter()
                            .map(|(token, _, _)| (token, Err(logged.clone())))
                            .collect();
                        answers.extend(self.fail_all_waiting(&err));
                        answers
                    }
                }
            }
            DurableEvent::Poisoned | DurableEvent::WriteFailed { .. } => {
                if matches!(event, DurableEvent::WriteFailed { .. }) {
                    self.note_lost_acknowledged();
                }
                self.poison_after(event);
                let err = self.poisoned_error();
                self.fail_all_waiting(&err)
            }
        }
    }

    /// Whether the first `n` waiting changes can be applied now without waiting on the actor's
    /// thread, which other tenants share: the state store has room for them (else its apply
    /// would wait, up to [`APPLY_STALL_LIMIT`], for its flushes), and, if they hold a catalog
    /// change, the catalog is not syncing (else that change would wait for the catalog's
    /// change lock: [`Catalog::syncing`]). When not, the changes stay in `waiting`, unapplied
    /// and unanswered as if not yet durable (a reader after an early answer already waits for
    /// the apply, with its own patience), and the actor stops taking its messages for
    /// [`crate::backend::FLUSH_POLL`], then asks again ([`TenantCore::retry_apply`]); its thread
    /// serves other tenants meanwhile, and this tenant's calls queue in its mailbox, held to
    /// its in-flight caps. `Err` when no room will come: the keyspace failed, or no room came
    /// in [`APPLY_STALL_LIMIT`]; the apply then fails as one would. A catalog sync is waited
    /// for at most [`CATALOG_HOLD_LIMIT`] per hold (syncs of many tenants could otherwise keep
    /// [`Catalog::syncing`] up for good, though each is short); then the apply takes the lock.
    /// A closing core (its WAL taken) does not hold: its closer waited for room where it may
    /// block ([`TenantCore::state_room_waiter`]), and a catalog sync ends by itself.
    fn room_to_apply(&mut self, n: usize) -> Result<bool, BackendError> {
        use cube_metrics::ApplyHold;
        if self.wal.is_none() {
            self.held = None;
            return match self.state.room_as_is() {
                Ok(false) => Err(BackendError(
                    "state store flushes made no room before the tenant closed".into(),
                )),
                room => room,
            };
        }
        let catalog_busy = self.catalog.as_ref().is_some_and(|c| c.syncing())
            && self
                .held
                .is_none_or(|h| h.since.elapsed() < CATALOG_HOLD_LIMIT)
            && self
                .waiting
                .iter()
                .take(n)
                .any(|w| catalog_change(w.seq, &w.op).is_some());
        let why = if catalog_busy {
            ApplyHold::Catalog
        } else {
            match self.state.has_room() {
                Ok(false) => ApplyHold::StateStore,
                room => {
                    self.held = None;
                    return room;
                }
            }
        };
        let since = self.hold(why);
        if since.elapsed() < APPLY_STALL_LIMIT {
            return Ok(false);
        }
        self.held = None;
        Err(BackendError(format!(
            "state store flushes made no room in {} s",
            APPLY_STALL_LIMIT.as_secs()
        )))
    }

    /// Hold applies for `why` (counted once per hold and reason); returns since when they are
    /// held.
    fn hold(&mut self, why: cube_metrics::ApplyHold) -> Instant {
        match &mut self.held {
            Some(h) => {
                if h.why != why {
                    why.counter().inc();
                    h.why = why;
                }
                h.since
            }
            None => {
                why.counter().inc();
                let since = Instant::now();
                self.held = Some(Held { since, why });
                since
            }
        }
    }

    /// Notified when the state store may have room again before the next poll
    /// ([`crate::backend::StateBackend::room_notify`]).
    pub fn room_notify(&self) -> Option<std::sync::Arc<tokio::sync::Notify>> {
        self.state.room_notify()
    }

    /// Whether durable changes wait unapplied ([`TenantCore::room_to_apply`]); the actor then
    /// calls [`TenantCore::retry_apply`] after [`crate::backend::FLUSH_POLL`].
    pub fn apply_held(&self) -> bool {
        self.held.is_some()
    }

    /// Try again to apply what is durable (see [`TenantCore::room_to_apply`]). A failure of
    /// the log is taken at once: its report waits in the mailbox the hold does not read.
    pub fn retry_apply(&mut self) -> Vec<Answer<T>> {
        if let Some(failed) = self.wal.as_ref().and_then(|w| w.failure()) {
            return self.on_durable(failed);
        }
        self.on_durable(DurableEvent::Durable(self.durable))
    }

    /// Block until the state store has room for the applies a close makes (for at most
    /// [`APPLY_STALL_LIMIT`]): for a thread that may block, before the core's WAL is taken.
    /// Waits for nothing when the close will apply nothing: no change waits, or the tenant is
    /// poisoned (a close after a hold that failed must not wait out the same stall again).
    pub(crate) fn state_room_waiter(&self) -> impl FnOnce() + Send + 'static {
        let backend =
            (!self.is_poisoned() && !self.waiting.is_empty()).then(|| self.state.backend());
        move || {
            // A failure shows again at the apply, which fails the tenant then.
            if let Some(backend) = backend {
                let _ = backend.wait_for_room();
            }
        }
    }

    /// Whether a checkpoint should start now.
    pub fn checkpoint_due(&self) -> bool {
        !self.checkpoint_running
            && !self.is_poisoned()
            // Not while closing (the close makes its own) or holding applies (a periodic tick
            // can still run as a hold begins).
            && self.wal.is_some()
            && self.held.is_none()
            && self.state.applied_seq() > self.checkpoint_seq
            && (self.bytes_since_checkpoint >= self.checkpoint.every_bytes
                || self.last_checkpoint.elapsed() >= self.checkpoint.every)
    }

    /// Start a checkpoint of everything applied so far; run the job off this thread and hand its
    /// result to [`TenantCore::finish_checkpoint`].
    pub fn begin_checkpoint(&mut self) -> Option<CheckpointJob> {
        if self.checkpoint_running || self.is_poisoned() {
            return None;
        }
        self.checkpoint_running = true;
        self.bytes_since_checkpoint = 0;
        // Catalog changes applied since the last checkpoint began: the catalog is synced, then
        // the store's copies go. A failed checkpoint poisons the tenant, whose reopen reads the
        // copies again, so they need not come back to the list.
        let (catalog, release) = match &self.catalog {
            Some(c) if self.state.has_catalog_changes() => {
                (Some(Arc::clone(c)), self.state.take_catalog_changes())
            }
            _ => (None, Vec::new()),
        };
        Some(CheckpointJob {
            backend: self.state.backend(),
            catalog,
            release,
            deleter: self
                .wal
                .as_ref()
                .map(|w| (self.tenant.clone(), w.segment_deleter())),
            seq: self.state.applied_seq(),
        })
    }

    /// Record a finished checkpoint and delete the WAL segments it covers.
    pub fn finish_checkpoint(&mut self, seq: u64, result: Result<Duration, BackendError>) {
        self.checkpoint_running = false;
        self.last_checkpoint = Instant::now();
        match result {
            Ok(took) => {
                cube_metrics::CHECKPOINT_SECONDS.observe(took.as_secs_f64());
                self.checkpoint_seq = self.checkpoint_seq.max(seq);
                self.stats
                    .checkpoint_seq
                    .store(self.checkpoint_seq, Ordering::Relaxed);
                // The job deleted the segments it covers (off this thread).
                if let Some(wal) = &self.wal {
                    self.stats
                        .wal_bytes
                        .store(wal.wal_bytes(), Ordering::Relaxed);
                }
            }
            Err(e) => {
                tracing::error!(tenant = %self.tenant, error = %e, "checkpoint failed; tenant poisoned");
                self.poison();
            }
        }
    }

    /// Close on this thread: the log's final fdatasync, the answers it releases, then a
    /// checkpoint. For a core no actor runs (the CLI's offline changes, a reopen during an open).
    pub fn close_here(&mut self) -> Result<Vec<Answer<T>>, StoreError> {
        if self.wal.is_some() {
            self.state_room_waiter()();
        }
        let Some(wal) = self.take_wal() else {
            return Ok(Vec::new());
        };
        let wal_dir = wal.dir().to_path_buf();
        let durable = wal.close().map_err(|e| {
            tracing::error!(tenant = %self.tenant, error = %e, "tenant log could not be synced at close");
            StoreError::Unavailable(format!(
                "tenant '{}': its log could not be synced (see the server log)",
                self.tenant
            ))
        })?;
        let answers = self.on_durable(DurableEvent::Durable(durable));
        let prior = self.checkpoint_seq();
        let mut checkpoint = None;
        if let Some(job) = self.begin_checkpoint() {
            let seq = job.seq;
            let r = job.run();
            checkpoint = Some((seq, r.is_ok()));
            self.finish_checkpoint(seq, r);
        }
        if let Err(e) = remove_checkpointed_log(
            &self.tenant,
            &wal_dir,
            Some(durable),
            prior,
            checkpoint,
            self.is_poisoned(),
        ) {
            self.poison_after_failed_sync(&e);
        }
        Ok(answers)
    }

    /// Take the WAL shard out for a final sync on another thread; later writes are refused.
    pub fn take_wal(&mut self) -> Option<WalShard> {
        self.wal.take()
    }

    /// The outcome of the close of the shard [`TenantCore::take_wal`] took
    /// ([`WalShard::close_or_failure`]): the answers it releases, and the final durable seq if
    /// it closed well. A failed write it reports is checked for acknowledged changes it lost
    /// (the shard is gone by now, so its written seq comes with the failure).
    pub fn on_log_closed(
        &mut self,
        closed: Result<u64, (DurableEvent, u64)>,
    ) -> (Vec<Answer<T>>, Option<u64>) {
        match closed {
            Ok(durable) => (
                self.on_durable(DurableEvent::Durable(durable)),
                Some(durable),
            ),
            Err((failure, written)) => {
                if matches!(failure, DurableEvent::WriteFailed { .. }) {
                    self.note_lost_acknowledged_after(written);
                }
                (self.on_durable(failure), None)
            }
        }
    }

    /// Whether a change may be logged now. `creation` (the tenant's creation entry) is not held
    /// to the free-space minimum: one small record, logged once at the first open, without
    /// which the trail would start without its entry 1 for good.
    fn writable(&self, passes_space_guard: bool) -> Result<(), StoreError> {
        if self.is_poisoned() {
            return Err(self.poisoned_error());
        }
        if let Some(g) = self
            .space
            .as_ref()
            .filter(|g| g.low() && !passes_space_guard)
        {
            return Err(StoreError::ResourceExhausted(format!(
                "tenant '{}' cannot take writes now: the server's data directory has less than \
                 {} free. Nothing acknowledged is lost and reads still work; writes resume by \
                 themselves once space is freed",
                self.tenant,
                match g.min_free() {
                    m if m >= 1 << 20 => format!("{} MiB", m >> 20),
                    m => format!("{m} bytes"),
                }
            )));
        }
        if self.wal.is_none() {
            return Err(shutting_down());
        }
        Ok(())
    }

    /// Compute a key's new capability set from its newest one (a logged change not applied yet,
    /// or the catalog's) and prepare the record that logs it.
    fn prepare_capabilities(
        &self,
        key_id: String,
        grant: &[Capability],
        revoke: &[Capability],
        caller: &Caller,
    ) -> Result<Prepared, StoreError> {
        check_key_id(&key_id)?;
        let Some(catalog) = &self.catalog else {
            return Err(StoreError::FailedPrecondition(
                "capabilities cannot be changed here: no catalog".into(),
            ));
        };
        // Only keys of this tenant: another tenant's key id is simply not found.
        let Some(key) = catalog
            .key(&self.tenant, &key_id)
            .filter(|k| !k.revoked && !self.pending_revokes.contains(&key_id))
        else {
            return Err(StoreError::NotFound(format!(
                "tenant '{}' has no active key '{key_id}'",
                self.tenant
            )));
        };
        let mut caps = self.newest_capabilities(&key_id, &key);
        // Never the tenant's last ADMIN: no call grants ADMIN back (only the operator can make
        // the tenant a new ADMIN key, `cubed key create --admin`), so the tenant could not
        // change a key's capabilities again on its own.
        if revoke.contains(&Capability::Admin)
            && caps.contains(&Capability::Admin)
            && !self.another_admin(catalog, &key_id)
        {
            return Err(StoreError::FailedPrecondition(format!(
                "key '{key_id}' holds the last ADMIN capability of tenant '{}': without it no key \
                 could call Access again until the operator makes one (`cubed key create {} \
                 --admin`); grant ADMIN to another key of the tenant first",
                self.tenant, self.tenant
            )));
        }
        caps.retain(|c| !revoke.contains(c));
        for c in grant {
            if !caps.contains(c) {
                caps.push(*c);
            }
        }
        caps.sort();
        let (audit_op, named) = if grant.is_empty() {
            ("revoke", revoke)
        } else {
            ("grant", grant)
        };
        let detail = format!("key={key_id} capabilities={named:?}");
        Ok(self
            .state
            .prepare_capabilities(key_id, caps, audit_op, detail, caller))
    }

    /// A key's capabilities as its newest change left them: a logged change not applied yet,
    /// or the catalog's.
    fn newest_capabilities(&self, key_id: &str, key: &crate::catalog::KeyInfo) -> Vec<Capability> {
        match self.pending_caps.get(key_id) {
            Some((_, caps)) => caps.clone(),
            None => key.capabilities.clone(),
        }
    }

    /// Whether an active key of this tenant other than `key_id` holds ADMIN, as the newest
    /// changes (applied or only logged) leave them.
    fn another_admin(&self, catalog: &crate::Catalog, key_id: &str) -> bool {
        catalog
            .active_key_ids(&self.tenant)
            .into_iter()
            .filter(|id| id != key_id && !self.pending_revokes.contains(id))
            .filter_map(|id| catalog.key(&self.tenant, &id).map(|k| (id, k)))
            .any(|(id, k)| {
                !k.revoked
                    && self
                        .newest_capabilities(&id, &k)
                        .contains(&Capability::Admin)
            })
    }

    /// Prepare the creation of a key for this tenant (a fresh id and secret).
    fn prepare_key_creation(&self, admin: bool, caller: &Caller) -> Result<Prepared, StoreError> {
        let Some(catalog) = &self.catalog else {
            return Err(StoreError::FailedPrecondition(
                "keys cannot be created here: no catalog".into(),
            ));
        };
        let key = catalog.draft_key(&self.tenant, admin)?;
        Ok(self.state.prepare_key_creation(&key, caller))
    }

    /// Prepare a change of the tenant's durability policy (checked as the catalog checks it).
    fn prepare_durability(
        &self,
        policy: SyncPolicy,
        caller: &Caller,
    ) -> Result<Prepared, StoreError> {
        if self.catalog.is_none() {
            return Err(StoreError::FailedPrecondition(
                "the durability cannot be changed here: no catalog".into(),
            ));
        }
        crate::catalog::check_policy(&policy)?;
        Ok(self.state.prepare_durability(policy, caller))
    }

    /// Prepare the `key.cert` entry of a certificate for `key_id`, an active key of the tenant
    /// (neither revoked nor with its revocation logged).
    fn prepare_certificate(
        &mut self,
        key_id: &str,
        sha256: &[u8; 32],
        not_after_ms: i64,
        caller: &Caller,
    ) -> Result<Prepared, StoreError> {
        let Some(catalog) = &self.catalog else {
            return Err(StoreError::FailedPrecondition(
                "certificates cannot be recorded here: no catalog".into(),
            ));
        };
        let active = catalog
            .key(&self.tenant, key_id)
            .is_some_and(|k| !k.revoked && !self.pending_revokes.contains(key_id));
        if !active {
            return Err(StoreError::NotFound(format!(
                "tenant '{}' has no active key '{key_id}'",
                self.tenant
            )));
        }
        let event = crate::state::certificate_event(key_id, sha256, not_after_ms);
        self.state.prepare(event, caller)
    }

    /// Prepare the revocation of `key_id`, or answer at once that it was revoked already.
    fn prepare_key_revocation(
        &self,
        key_id: String,
        caller: &Caller,
    ) -> Result<Prepared, StoreError> {
        let Some(catalog) = &self.catalog else {
            return Err(StoreError::FailedPrecondition(
                "keys cannot be revoked here: no catalog".into(),
            ));
        };
        let Some(key) = catalog.key(&self.tenant, &key_id) else {
            return Err(StoreError::NotFound(format!(
                "tenant '{}' has no key '{key_id}'",
                self.tenant
            )));
        };
        if key.revoked || self.pending_revokes.contains(&key_id) {
            return Ok(Prepared::Immediate(Reply::KeyRevoked {
                revoked: false,
                seq: 0,
            }));
        }
        Ok(self.state.prepare_key_revocation(key_id, caller))
    }

    /// Make in the catalog the changes (keys, durability) of records just applied, in log order,
    /// so the next call sees them. A catalog that cannot take one poisons the tenant: its
    /// record is durable, and reopening replays it.
    fn apply_catalog_changes(&mut self, changes: Vec<CatalogChange>) -> Result<(), StoreError> {
        if changes.is_empty() {
            return Ok(());
        }
        let Some(catalog) = self.catalog.clone() else {
            // Catalog changes are refused without a catalog, so none was logged.
            return Ok(());
        };
        for (seq, key_id, edit) in changes {
            if let Err(e) =
                apply_catalog_edit(&catalog, &self.tenant, &key_id, &edit, Replaying::No)
            {
                tracing::error!(tenant = %self.tenant, error = %e, "a catalog change could not be applied to the catalog; tenant poisoned until it is reopened");
                self.poison_after(DurableEvent::WriteFailed { no_space: false });
                return Err(self.poisoned_error());
            }
            match edit {
                CatalogEdit::Caps(_) => {
                    if self
                        .pending_caps
                        .get(&key_id)
                        .is_some_and(|(s, _)| *s <= seq)
                    {
                        self.pending_caps.remove(&key_id);
                    }
                }
                CatalogEdit::Revoke => {
                    self.pending_revokes.remove(&key_id);
                }
                CatalogEdit::Create { .. } | CatalogEdit::Durability(_) => {}
            }
            self.publish_pending_rights();
        }
        Ok(())
    }

    /// The one flag, shared with the directory so a poisoned tenant is never passivated.
    pub fn is_poisoned(&self) -> bool {
        self.stats.poisoned.load(Ordering::Relaxed)
    }

    /// Poisoned for good by a failed fsync outside the WAL's syncer (`e`): see
    /// [`SharedStats::sync_failed`].
    pub(crate) fn poison_after_failed_sync(&mut self, e: &BackendError) {
        tracing::error!(tenant = %self.tenant, error = %e, "an fsync failed; tenant poisoned until the server restarts");
        self.stats.sync_failed.store(true, Ordering::Relaxed);
        self.poison();
    }

    /// After a failed write of the log, which drops the records it had not written: under a
    /// relaxed policy some of them may have been acknowledged (inside the window), and are lost.
    /// Logged, and told to [`CoreConfig::lost_acknowledged`] for the server's stop to report.
    fn note_lost_acknowledged(&mut self) {
        if let Some(written) = self.wal.as_ref().map(|wal| wal.written_seq()) {
            self.note_lost_acknowledged_after(written);
        }
    }

    /// [`TenantCore::note_lost_acknowledged`], `written` the last record the log wrote; once.
    fn note_lost_acknowledged_after(&mut self, written: u64) {
        let acknowledged = self.stats.last_seq.load(Ordering::Acquire);
        if acknowledged <= written || self.lost_noted {
            return;
        }
        self.lost_noted = true;
        tracing::error!(
            tenant = %self.tenant,
            written,
            acknowledged,
            "a failed write of the tenant's log lost changes acknowledged inside its relaxed durability window (records after the last one written)"
        );
        if let Some(lost) = &self.lost_acknowledged {
            lost.insert(&self.tenant);
        }
    }

    /// Poisoned for good (a failed fsync, a failed checkpoint).
    fn poison(&mut self) {
        self.poison_after(DurableEvent::Poisoned);
    }

    /// Poisoned by `event`: for good, or reopenable after a failed write. The first cause
    /// decides, except that a later permanent one makes it permanent.
    fn poison_after(&mut self, event: DurableEvent) {
        let (reopenable, no_space) = match event {
            DurableEvent::WriteFailed { no_space } => (true, no_space),
            _ => (false, false),
        };
        // Only the actor poisons its tenant. How is published before `poisoned` (Release):
        // another thread that sees `poisoned` must not read a not-yet-set `reopenable` as "for
        // good" (a read would then say an operator has to act).
        if !self.stats.poisoned.load(Ordering::Acquire) {
            cube_metrics::TENANTS_UNAVAILABLE.inc();
            self.stats.reopenable.store(reopenable, Ordering::Relaxed);
            self.stats.no_space.store(no_space, Ordering::Relaxed);
            self.stats.poisoned.store(true, Ordering::Release);
            if reopenable && let Some(janitor) = &self.janitor {
                janitor.notify_one();
            }
        } else if !reopenable {
            self.stats.reopenable.store(false, Ordering::Relaxed);
        }
        self.state.discard_pending();
        // The pending revocations and capability changes stay in force: a record among them may
        // be on the disk (its outcome is unknown; a durable one may even be left unapplied), and
        // a poisoned tenant still serves reads. Its reopen (or the restart) finds out from the
        // log; until then the keys they name are refused what they would take away.
        self.stats.applied.notify_waiters();
    }

    /// Applying records to the state store failed (fjall's keyspace poisoned by a memtable flush
    /// that failed on a full disk, say, or no room after 30 s). The records are in the WAL, so
    /// the tenant is poisoned *reopenable*: the janitor closes it and its next call reopens it,
    /// which recovers exactly as a restart would (the store's written files, then the WAL after
    /// their applied seq). A restart is no safer: files fjall failed to write were never
    /// registered, so a new process starts from the same ones. While the disk stays full, the
    /// reopen fails or fails again, and the tenant keeps answering RESOURCE_EXHAUSTED /
    /// UNAVAILABLE.
    /// A record that cannot be applied (`ApplyError::Record`) would fail again after a reopen: it
    /// poisons the tenant for good.
    fn apply_failed(&mut self, e: &ApplyError) -> StoreError {
        if let ApplyError::Record { seq, .. } = e {
            tracing::error!(tenant = %self.tenant, error = %e, "a durable record cannot be applied; tenant poisoned");
            self.unappliable.get_or_insert(*seq);
            self.poison();
            return self.poisoned_error();
        }
        let no_space = self.wal.as_ref().is_some_and(|w| nearly_full(w.dir()));
        tracing::error!(tenant = %self.tenant, error = %e, no_space, "applying durable records failed; tenant poisoned until it is reopened");
        self.poison_after(DurableEvent::WriteFailed { no_space });
        self.poisoned_error()
    }

    /// What a write to a poisoned tenant is answered with.
    fn poisoned_error(&self) -> StoreError {
        if self.stats.no_space.load(Ordering::Relaxed)
            && self.stats.reopenable.load(Ordering::Relaxed)
        {
            StoreError::ResourceExhausted(format!(
                "tenant '{}' cannot take writes: the server's disk is full. {} and reads still \
                 work; retry after space is freed (the tenant reopens by itself within seconds)",
                self.tenant,
                self.what_is_kept()
            ))
        } else if self.stats.reopenable.load(Ordering::Relaxed) {
            StoreError::Unavailable(format!(
                "tenant '{}' is unavailable: a write to its storage failed. {}; it reopens by \
                 itself within seconds, retry then",
                self.tenant,
                self.what_is_kept()
            ))
        } else if let Some(seq) = self.unappliable {
            // As the open after a restart will say (`open_error`, `WalError::Replay`).
            StoreError::DataLoss(format!(
                "tenant '{}' is unavailable: write-ahead-log record {seq} cannot be applied (see \
                 the server log); an operator must repair it before it can serve. {}",
                self.tenant,
                self.what_is_kept()
            ))
        } else {
            StoreError::Unavailable(self.poisoned_message())
        }
    }

    /// What a failed write leaves of the acknowledged changes: all of them under `sync`; under
    /// `relaxed` those inside the window may never have reached the log.
    fn what_is_kept(&self) -> &'static str {
        match self.policy {
            SyncPolicy::Always => "Nothing acknowledged is lost",
            SyncPolicy::Relaxed { .. } => {
                "Changes acknowledged inside the tenant's relaxed durability window may be lost, \
                 older ones are kept"
            }
        }
    }

    fn poisoned_message(&self) -> String {
        format!(
            "tenant '{}' is unavailable: a write to its storage failed, so it accepts no writes \
             until the server restarts; {}",
            self.tenant,
            match self.policy {
                SyncPolicy::Always => "acknowledged data is safe",
                SyncPolicy::Relaxed { .. } => {
                    "acknowledged data is safe but for changes still inside its relaxed \
                     durability window"
                }
            }
        )
    }

    fn append_error(&mut self, e: &WalError) -> StoreError {
        match e {
            WalError::RecordTooLarge { max, .. } => StoreError::InvalidArgument(format!(
                "the encoded change exceeds the {max}-byte record limit"
            )),
            WalError::Closed => shutting_down(),
            // The syncer failed and its event is on the way: take the cause from the shard.
            WalError::Poisoned => {
                let event = self
                    .wal
                    .as_ref()
                    .and_then(|w| w.failure())
                    .unwrap_or(DurableEvent::Poisoned);
                self.poison_after(event);
                self.poisoned_error()
            }
            _ => {
                self.poison();
                self.poisoned_error()
            }
        }
    }
}

/// What a record changes in the catalog: one of the tenant's keys, or the tenant's durability.
/// (No `Debug`: it may hold a secret.)
#[derive(Clone)]
enum CatalogEdit {
    /// The key's whole new capability set.
    Caps(Vec<Capability>),
    Revoke,
    /// A new key.
    Create {
        secret: [u8; 32],
        capabilities: Vec<Capability>,
    },
    /// The tenant's durability policy (the key id of its change is empty).
    Durability(SyncPolicy),
}

/// Whether a record is a client certificate's `key.cert` entry. Like a catalog change, it is
/// answered only once durable itself, whatever the tenant's policy: `cubed key cert` writes the
/// certificate out on that answer, and the certificate must not outlive an entry a power cut
/// took.
fn is_certificate_entry(op: &WalOp) -> bool {
    matches!(op.op, Some(Op::Event(_)))
        && op
            .audit
            .as_ref()
            .is_some_and(|a| a.op == crate::state::CERTIFICATE_OP)
}

/// A catalog change of a record: (seq, key id, what).
type CatalogChange = (u64, String, CatalogEdit);

/// The catalog change a record makes, if it makes one.
fn catalog_change(seq: u64, op: &WalOp) -> Option<CatalogChange> {
    match &op.op {
        Some(Op::Durability(d)) => d
            .policy()
            .map(|p| (seq, String::new(), CatalogEdit::Durability(p))),
        Some(Op::Caps(c)) => walop::caps_from_wire(&c.capabilities)
            .map(|caps| (seq, c.key_id.clone(), CatalogEdit::Caps(caps))),
        Some(Op::KeyRevoke(r)) => Some((seq, r.key_id.clone(), CatalogEdit::Revoke)),
        Some(Op::KeyCreate(k)) => {
            let secret: [u8; 32] = k.secret.as_slice().try_into().ok()?;
            let capabilities = walop::caps_from_wire(&k.capabilities)?;
            Some((
                seq,
                k.key_id.clone(),
                CatalogEdit::Create {
                    secret,
                    capabilities,
                },
            ))
        }
        _ => None,
    }
}

/// Whether a catalog change is made again by a tenant's recovery, or for the first time.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Replaying {
    Yes,
    No,
}

/// Make one catalog change. Made again by recovery, a durability change does not override a
/// policy set through the catalog since ([`Catalog::reapply_logged_durability`]); key changes
/// are idempotent either way (a revoked key stays revoked, an existing key is not created
/// again).
fn apply_catalog_edit(
    catalog: &Catalog,
    tenant: &str,
    key_id: &str,
    edit: &CatalogEdit,
    replaying: Replaying,
) -> Result<bool, StoreError> {
    match edit {
        CatalogEdit::Caps(caps) => catalog.apply_logged_capabilities(tenant, key_id, caps),
        CatalogEdit::Revoke => catalog.apply_logged_revocation(tenant, key_id),
        CatalogEdit::Create {
            secret,
            capabilities,
        } => catalog.apply_logged_key_creation(&crate::KeyInfo {
            tenant: tenant.to_string(),
            key_id: key_id.to_string(),
            secret: *secret,
            capabilities: capabilities.clone(),
            revoked: false,
            prepared: Default::default(),
        }),
        CatalogEdit::Durability(policy) if replaying == Replaying::Yes => {
            catalog.reapply_logged_durability(tenant, *policy)
        }
        CatalogEdit::Durability(policy) => catalog.apply_logged_durability(tenant, *policy),
    }
}

/// A replayed record that could not be applied. A bad record needs an operator; a state store
/// that failed to take it (a full disk, say) does not: the log is fine, and a later open replays
/// it again.
fn replay_error(tenant: &str, e: ApplyError) -> StoreError {
    match e {
        ApplyError::Record { seq, detail } => open_error(tenant, &WalError::Replay { seq, detail }),
        ApplyError::Backend(b) => {
            tracing::error!(tenant, error = %b, "tenant state store failed while replaying the wal");
            StoreError::Unavailable(format!(
                "tenant '{tenant}' is unavailable: its state store could not take the replayed \
                 log (see the server log); it is retried"
            ))
        }
    }
}

/// After a tenant's final checkpoint at close: remove its log if the checkpoints cover every
/// record up to `last`, the log's last durable seq, so that its next open (a server's start
/// among them) has nothing to replay and does not count it as left open by a crash. `prior` is
/// the seq checkpointed before; `checkpoint` the final one's (seq, succeeded), `None` if there
/// was nothing new to checkpoint. Nothing is removed after a failed checkpoint, from a poisoned
/// tenant, or from a log whose close failed (`last` `None`). Returns a failed fsync of the
/// removal, as a checkpoint failure: the caller poisons the tenant with it, since a reopen in
/// this process would trust a later fsync of the directory that may report success falsely.
pub(crate) fn remove_checkpointed_log(
    tenant: &str,
    wal_dir: &Path,
    last: Option<u64>,
    prior: u64,
    checkpoint: Option<(u64, bool)>,
    poisoned: bool,
) -> Result<(), BackendError> {
    let covered = match checkpoint {
        None => Some(prior),
        Some((seq, true)) => Some(prior.max(seq)),
        Some((_, false)) => None,
    };
    if let (Some(last), Some(covered)) = (last, covered)
        && !poisoned
        && covered >= last
    {
        match cube_wal::remove_covered_log(wal_dir, last + 1) {
            Ok(n) => tracing::debug!(tenant, removed = n, "log covered by the checkpoint removed"),
            Err(e) if e.is_failed_sync() => {
                return Err(BackendError(format!(
                    "removing the checkpointed log at close: {e}"
                )));
            }
            Err(e) => {
                tracing::warn!(tenant, error = %e, "could not remove the checkpointed log; the next open reads it")
            }
        }
    }
    Ok(())
}

fn shutting_down() -> StoreError {
    StoreError::Unavailable(
        "the server is shutting down; retry against the restarted server".into(),
    )
}

/// Map a failure to open a tenant's WAL to a message an operator can act on. Paths stay in the
/// server log.
fn open_error(tenant: &str, e: &WalError) -> StoreError {
    tracing::error!(tenant, error = %e, "tenant failed to open");
    match e {
        // The segment, offset and finding are for the operator (in the line logged above), not
        // for the tenant's clients.
        // DATA_LOSS, not UNAVAILABLE: nothing here passes with time or a retry (gRPC's
        // UNAVAILABLE is "most likely transient, retry with backoff"); an operator must act.
        WalError::Corrupt { .. } => StoreError::DataLoss(format!(
            "tenant '{tenant}' is unavailable: its write-ahead log is corrupt (the server log \
             names the segment and offset); an operator must repair it before it can serve"
        )),
        WalError::StateBehindLog { .. } => StoreError::DataLoss(format!(
            "tenant '{tenant}' is unavailable: its stored state is older than its write-ahead log \
             (some acknowledged records are in neither; the server log says which); an operator \
             must restore the tenant's state and log from one copy before it can serve"
        )),
        WalError::Replay { seq, .. } => StoreError::DataLoss(format!(
            "tenant '{tenant}' is unavailable: write-ahead-log record {seq} cannot be applied; an \
             operator must repair it before it can serve"
        )),
        // A new tenant's first segment, or a rotation at open, on a full disk: passes once
        // space is freed (the open is retried), as the write path's refusals say.
        e if e.is_no_space() => no_space_to_open(tenant),
        _ => StoreError::Unavailable(format!(
            "tenant '{tenant}' is unavailable: its storage could not be opened (see the server log)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::Coord;
    use cube_wal::SegmentSizing;

    /// A tenant's open that failed for lack of space (its first segment on a full disk) says
    /// so, RESOURCE_EXHAUSTED with retry advice, not a bare UNAVAILABLE; a failed sync stays
    /// UNAVAILABLE, whatever its cause.
    #[test]
    fn an_open_that_found_no_space_is_resource_exhausted() {
        let full = WalError::Io {
            op: "creating segment",
            source: std::io::Error::from_raw_os_error(28),
        };
        match open_error("t", &full) {
            StoreError::ResourceExhausted(m) => {
                assert!(m.contains("disk is full") && m.contains("retry"), "{m}");
            }
            other => panic!("{other:?}"),
        }
        let failed_sync = WalError::Io {
            op: "fdatasync",
            source: std::io::Error::from_raw_os_error(28),
        };
        assert!(matches!(
            open_error("t", &failed_sync),
            StoreError::Unavailable(_)
        ));
    }

    fn config() -> CoreConfig {
        CoreConfig {
            wal: WalOptions {
                // Small segments so checkpoints have whole segments to delete.
                segments: SegmentSizing {
                    initial: 4096,
                    max: 4096,
                },
                ..WalOptions::default()
            },
            ..CoreConfig::default()
        }
    }

    fn open(dir: &Path, config: &CoreConfig) -> TenantCore<u32> {
        TenantCore::open("t", &dir.join("wal"), &dir.join("state"), config, None)
            .unwrap()
            .0
    }

    fn who() -> Caller {
        Caller {
            principal: "t/k".into(),
            ts_ms: 1,
        }
    }

    fn at(i: i32) -> Coord {
        Coord { x: i, y: 2, z: 3 }
    }

    fn write(i: i32, v: &[u8]) -> Command {
        Command::Write {
            coord: at(i),
            value: v.to_vec(),
            expected_version: None,
        }
    }

    /// Wait for the WAL to make everything appended durable and feed that to the core.
    fn settle(core: &mut TenantCore<u32>) -> Vec<Answer<u32>> {
        let wal = core.wal.as_ref().unwrap();
        let last = wal.next_seq() - 1;
        wal.wait_durable(last).unwrap();
        core.on_durable(DurableEvent::Durable(last))
    }

    /// A relaxed tenant's change acknowledged before its record was written, the write then
    /// failing and first reported by the close (the shard already taken from the core, as a
    /// passivation takes it): the loss is still logged and told for the stop to report. It was
    /// checked only while the core held the shard, and went unreported.
    #[test]
    fn a_loss_of_acknowledged_changes_first_found_by_the_close_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let lost = Arc::new(TenantSet::default());
        let mut config = config();
        config.wal.sync = SyncPolicy::Relaxed {
            max_delay: Duration::from_secs(10),
            max_records: 1000,
        };
        config.lost_acknowledged = Some(Arc::clone(&lost));
        let mut core = open(dir.path(), &config);
        cube_wal::failpoint::fail_next_write(&dir.path().join("wal"));
        let (_, answer) = core
            .handle(write(1, b"v"), &who(), 1)
            .expect("answered at once, inside the window");
        assert!(answer.is_ok(), "{answer:?}");
        let closed = core.take_wal().unwrap().close_or_failure();
        assert!(
            matches!(closed, Err((DurableEvent::WriteFailed { .. }, 0))),
            "{closed:?}"
        );
        let (answers, final_seq) = core.on_log_closed(closed);
        assert!(answers.is_empty() && final_seq.is_none());
        assert!(
            lost.contains("t"),
            "the lost acknowledgement was not reported"
        );
    }

    #[test]
    fn a_failed_apply_is_reopenable_but_a_record_that_cannot_be_applied_is_not() {
        let reopenable = |e: ApplyError| {
            let dir = tempfile::tempdir().unwrap();
            let mut core = open(dir.path(), &config());
            let answer = core.apply_failed(&e);
            // Either way the tenant refuses changes from now on, with the same answer.
            let refused = core.handle(write(1, b"a"), &who(), 1).unwrap().1;
            assert_eq!(refused, Err(answer.clone()));
            assert!(core.is_poisoned());
            let r = core.stats.reopenable.load(Ordering::Relaxed);
            (r, answer)
        };
        // The state store failed (a memtable flush, say): the records are in the WAL, a reopen
        // recovers them. This disk is not full, so it is UNAVAILABLE, not a full disk.
        let (r, answer) = reopenable(ApplyError::Backend(BackendError("memtable flush".into())));
        assert!(r);
        let StoreError::Unavailable(msg) = answer else {
            panic!("{answer:?}")
        };
        assert!(msg.contains("reopens by itself"), "{msg}");
        // A record that cannot be applied would fail again after a reopen.
        let (r, answer) = reopenable(ApplyError::Record {
            seq: 1,
            detail: "unknown op".into(),
        });
        assert!(!r);
        let StoreError::DataLoss(msg) = answer else {
            panic!("{answer:?}")
        };
        // Not "until the server restarts": the restart's replay meets the same record.
        assert!(
            msg.contains("record 1 cannot be applied") && msg.contains("an operator must repair"),
            "{msg}"
        );
    }

    /// A core in `dir` whose state store reports no room (until `withhold_state_room(state dir,
    /// false)`, the state dir returned), holding its first change (token 1: cell 1 = `a`),
    /// durable and unapplied.
    fn holding_a_write(dir: &Path) -> (TenantCore<u32>, std::path::PathBuf) {
        let mut core = open(dir, &config());
        let state_dir = dir.join("state");
        cube_wal::failpoint::withhold_state_room(&state_dir, true);
        assert!(core.handle(write(1, b"a"), &who(), 1).is_none());
        assert_eq!(settle(&mut core), vec![]);
        assert!(core.apply_held());
        (core, state_dir)
    }

    /// A durable group the state store has no room for (its flushes behind) is neither applied
    /// nor answered, and the call returns at once instead of waiting for room on the actor's
    /// thread; it is applied and answered at the first try after room came back.
    #[test]
    fn a_durable_group_waits_for_room_in_the_state_store_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let (mut core, state_dir) = holding_a_write(dir.path());
        let reader = core.state().reader();
        // Later changes queue behind it, and another try without room changes nothing.
        assert!(core.handle(write(1, b"b"), &who(), 2).is_none());
        assert_eq!(settle(&mut core), vec![]);
        assert_eq!(core.retry_apply(), vec![]);
        assert_eq!(reader.read(&at(1)).unwrap(), None);
        assert!(!core.is_poisoned());
        cube_wal::failpoint::withhold_state_room(&state_dir, false);
        assert_eq!(
            core.retry_apply(),
            vec![
                (1, Ok(Reply::Written { version: 1, seq: 1 })),
                (2, Ok(Reply::Written { version: 2, seq: 2 }))
            ]
        );
        assert!(!core.apply_held());
        assert_eq!(reader.read(&at(1)).unwrap().unwrap().version, 2);
    }

    #[test]
    fn writes_answer_only_after_durable_and_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let mut core = open(dir.path(), &config());
        assert!(core.handle(write(1, b"a"), &who(), 1).is_none());
        assert!(core.handle(write(1, b"b"), &who(), 2).is_none());
        // Not durable yet: a read still sees nothing, through the core or the shared reader.
        let reader = core.state().reader();
        assert_eq!(reader.read(&at(1)).unwrap(), None);
        let read = Command::Read { coord: at(1) };
        assert_eq!(
            core.handle(read.clone(), &who(), 3).unwrap().1,
            Ok(Reply::Read(None))
        );
        let answers = settle(&mut core);
        assert_eq!(
            answers,
            vec![
                (1, Ok(Reply::Written { version: 1, seq: 1 })),
                (2, Ok(Reply::Written { version: 2, seq: 2 }))
            ]
        );
        assert_eq!(reader.read(&at(1)).unwrap().unwrap().version, 2);
        core.take_wal().unwrap().close().unwrap();
        drop((core, reader));
        let mut core = open(dir.path(), &config());
        let Some((_, Ok(Reply::Read(Some(cell))))) = core.handle(read, &who(), 4) else {
            panic!()
        };
        assert_eq!((cell.value.as_slice(), cell.version), (&b"b"[..], 2));
    }

    #[test]
    fn settled_changes_are_answered_early_once_durable_and_catalog_changes_are_not() {
        let dir = tempfile::tempdir().unwrap();
        let (catalog, config) = tenant_with_catalog(dir.path());
        let mut core = open(dir.path(), &config);
        let early = Arc::new(EarlyAnswers::default());
        core.answer_early_through(Arc::clone(&early));
        assert!(core.handle(write(1, b"a"), &who(), 1).is_none());
        let wal = core.wal.as_ref().unwrap();
        wal.wait_durable(1).unwrap();
        // What the syncer's report sends at once, before the core has applied anything.
        assert_eq!(
            early.take_through(1),
            vec![(1, Reply::Written { version: 1, seq: 1 })]
        );
        assert_eq!(early.answered(), 1);
        let reader = core.state().reader();
        assert_eq!(reader.read(&at(1)).unwrap(), None);
        assert_eq!(core.stats.last_seq.load(Ordering::Acquire), 0);
        // The core applies it without answering it again.
        assert_eq!(core.on_durable(DurableEvent::Durable(1)), vec![]);
        assert_eq!(reader.read(&at(1)).unwrap().unwrap().version, 1);
        assert_eq!(core.stats.last_seq.load(Ordering::Acquire), 1);
        // A report the core sees before its answer was taken (the syncer ran ahead of the
        // core's queueing): the core answers it, once.
        assert!(core.handle(write(1, b"b"), &who(), 2).is_none());
        assert_eq!(
            settle(&mut core),
            vec![(2, Ok(Reply::Written { version: 2, seq: 2 }))]
        );
        assert!(early.take_through(2).is_empty());
        // A capability change is answered by the core, after it reached the catalog.
        let key = catalog.create_key("t", false).unwrap();
        let grant = caps(&key.key_id, &[], &[Capability::Write]);
        assert!(core.handle(grant, &who(), 3).is_none());
        core.wal.as_ref().unwrap().wait_durable(3).unwrap();
        assert!(early.take_through(3).is_empty());
        assert_eq!(settle(&mut core).len(), 1);
        assert_eq!(early.answered(), 2);
    }

    #[test]
    fn a_failure_answers_the_durable_early_answers_and_fails_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let mut core = open(dir.path(), &config());
        let early = Arc::new(EarlyAnswers::default());
        core.answer_early_through(Arc::clone(&early));
        assert!(core.handle(write(1, b"a"), &who(), 1).is_none());
        core.wal.as_ref().unwrap().wait_durable(1).unwrap();
        core.durable = 1;
        assert!(core.handle(write(2, b"b"), &who(), 2).is_none());
        assert_eq!(early.answered(), 0);
        let answers = core.on_durable(DurableEvent::WriteFailed { no_space: false });
        assert_eq!(answers.len(), 2);
        assert_eq!(answers[0], (1, Ok(Reply::Written { version: 1, seq: 1 })));
        // Answered, and not applied: reads must wait for the reopen.
        assert_eq!(early.answered(), 1);
        assert_eq!(core.stats.last_seq.load(Ordering::Acquire), 0);
        let (token, Err(e)) = &answers[1] else {
            panic!("{answers:?}")
        };
        assert_eq!(*token, 2);
        assert!(matches!(e, StoreError::Unavailable(_)), "{e:?}");
        assert!(early.take_through(u64::MAX).is_empty());
    }

    #[tokio::test]
    async fn a_reader_waits_until_what_was_answered_early_is_applied() {
        let stats = Arc::new(SharedStats::default());
        let long = Duration::from_secs(3600);
        stats.last_seq.store(3, Ordering::Release);
        assert_eq!(stats.applied_through(3, || false, long).await, Ok(()));
        // Woken by the apply alone: no re-check by time within the test's bound.
        let applier = Arc::clone(&stats);
        let apply = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            applier.last_seq.store(5, Ordering::Release);
            applier.applied.notify_waiters();
        });
        let waited = stats.applied_through_polling(5, || false, long, long);
        let waited = tokio::time::timeout(Duration::from_secs(10), waited).await;
        assert_eq!(waited.expect("woken by the apply"), Ok(()));
        apply.await.unwrap();
        // Not applied within the reader's patience.
        let short = Duration::from_millis(30);
        assert_eq!(
            stats.applied_through(6, || false, short).await,
            Err(Lag::Slow)
        );
        // A tenant that failed, or whose actor is gone, will not apply it: no wait at all.
        assert_eq!(
            stats.applied_through(6, || true, long).await,
            Err(Lag::Failed)
        );
        stats.poisoned.store(true, Ordering::SeqCst);
        assert_eq!(
            stats.applied_through(6, || false, long).await,
            Err(Lag::Failed)
        );
    }

    /// The whole audit trail of `core`'s tenant, checked to be one unbroken chain from seq 1.
    fn audit_chain(core: &TenantCore<u32>) -> Vec<u64> {
        let trail = core.state().reader().audit_page(1, 1000).unwrap();
        for (i, pair) in trail.windows(2).enumerate() {
            assert_eq!(
                pair[1].seq,
                pair[0].seq + 1,
                "gap after entry {i}: {trail:?}"
            );
            assert_eq!(
                pair[1].prev_hash, pair[0].hash,
                "broken link after entry {i}"
            );
        }
        trail.iter().map(|e| e.seq).collect()
    }

    /// Entries of acknowledged changes survive a crash: the first change after the replay
    /// continues the chain instead of reusing seq 1 over it.
    #[test]
    fn the_audit_chain_continues_after_a_replay() {
        let dir = tempfile::tempdir().unwrap();
        let mut core = open(dir.path(), &config());
        for i in 1..=20 {
            assert!(core.handle(write(i, b"v"), &who(), i as u32).is_none());
        }
        assert_eq!(settle(&mut core).len(), 20);
        // A crash: the log is closed, the state store never checkpointed.
        core.take_wal().unwrap().close().unwrap();
        drop(core);
        let (mut core, report) = TenantCore::open(
            "t",
            &dir.path().join("wal"),
            &dir.path().join("state"),
            &config(),
            None,
        )
        .unwrap();
        assert!(
            report.records_replayed > 0,
            "nothing was replayed: {report:?}"
        );
        assert!(core.handle(write(21, b"v"), &who(), 21).is_none());
        assert_eq!(settle(&mut core).len(), 1);
        assert_eq!(audit_chain(&core), (1..=21).collect::<Vec<u64>>());
    }

    /// Under a relaxed policy changes inside the loss window are applied before their fsync;
    /// each keeps its own audit entry.
    #[test]
    fn relaxed_changes_each_keep_their_audit_entry() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = config();
        config.wal.sync = SyncPolicy::Relaxed {
            max_delay: Duration::from_secs(3600),
            max_records: 3,
        };
        let mut core = open(dir.path(), &config);
        for i in 1..=3 {
            assert!(core.handle(write(i, b"v"), &who(), i as u32).is_some());
        }
        assert_eq!(audit_chain(&core), vec![1, 2, 3]);
    }

    /// A capability change names a key id of sensible length; an unknown one is NOT_FOUND, and
    /// a huge one is refused before any message quotes it.
    #[test]
    fn a_capability_change_checks_its_key_id() {
        let dir = tempfile::tempdir().unwrap();
        let (_catalog, config) = tenant_with_catalog(dir.path());
        let mut core = open(dir.path(), &config);
        let read = [Capability::Read];
        let answer = |core: &mut TenantCore<u32>, key_id: &str| {
            core.handle(caps(key_id, &read, &[]), &who(), 1)
                .expect("refused at once")
                .1
        };
        assert_eq!(
            answer(&mut core, ""),
            Err(StoreError::InvalidArgument("key_id is required".into()))
        );
        let Err(StoreError::InvalidArgument(m)) = answer(&mut core, &"k".repeat(129)) else {
            panic!("a 129-byte key id was not refused")
        };
        assert_eq!(m, "key_id is at most 128 bytes; got 129");
        assert!(matches!(
            answer(&mut core, &"k".repeat(128)),
            Err(StoreError::NotFound(_))
        ));
    }

    fn caps(key_id: &str, grant: &[Capability], revoke: &[Capability]) -> Command {
        Command::ChangeCapabilities {
            key_id: key_id.into(),
            grant: grant.to_vec(),
            revoke: revoke.to_vec(),
        }
    }

    #[test]
    fn capability_changes_are_logged_applied_to_the_catalog_and_replayed_after_a_crash() {
        use Capability::{Admin, Read, Write};
        let dir = tempfile::tempdir().unwrap();
        let catalog = Arc::new(Catalog::open(&dir.path().join("catalog")).unwrap());
        let key = catalog.create_tenant("t").unwrap();
        assert_eq!(key.capabilities, vec![Read, Write, Admin]);
        // Another ADMIN key, so that the first may give up its own (the last one may not).
        let second = catalog.create_key("t", false).unwrap();
        catalog
            .change_capabilities("t", &second.key_id, &[Admin], &[])
            .unwrap();
        let config = CoreConfig {
            catalog: Some(Arc::clone(&catalog)),
            ..config()
        };
        let now = |catalog: &Catalog| catalog.key("t", &key.key_id).unwrap().capabilities.clone();
        let mut core = open(dir.path(), &config);
        // Two changes of one key in one group: the second starts from the first.
        assert!(
            core.handle(caps(&key.key_id, &[], &[Write]), &who(), 1)
                .is_none()
        );
        assert!(
            core.handle(caps(&key.key_id, &[], &[Admin]), &who(), 2)
                .is_none()
        );
        // Not in force before it is durable.
        assert_eq!(now(&catalog), vec![Read, Write, Admin]);
        let answers = settle(&mut core);
        assert_eq!(
            answers,
            vec![
                (
                    1,
                    Ok(Reply::Capabilities {
                        capabilities: vec![Read, Admin],
                        seq: 1
                    })
                ),
                (
                    2,
                    Ok(Reply::Capabilities {
                        capabilities: vec![Read],
                        seq: 2
                    })
                ),
            ]
        );
        assert_eq!(now(&catalog), vec![Read]);
        // The audit entries are in the same records.
        let trail = core.state().reader().audit_page(1, 10).unwrap();
        let ops: Vec<_> = trail
            .iter()
            .map(|e| (e.op.as_str(), e.detail.as_str()))
            .collect();
        assert_eq!(ops.len(), 2);
        assert_eq!(ops[0].0, "revoke");
        assert!(
            ops[0].1.contains(&key.key_id) && ops[0].1.contains("Write"),
            "{ops:?}"
        );
        // Unknown, or another tenant's, key: not found, nothing logged.
        let other = catalog.create_tenant("u").unwrap();
        for id in ["k-nope", other.key_id.as_str()] {
            assert!(matches!(
                core.handle(caps(id, &[Write], &[]), &who(), 3),
                Some((3, Err(StoreError::NotFound(_))))
            ));
        }
        assert!(
            core.handle(caps(&key.key_id, &[Write], &[]), &who(), 4)
                .is_none()
        );
        assert_eq!(settle(&mut core).len(), 1);
        assert_eq!(now(&catalog), vec![Read, Write]);

        // A crash: the log survives, the catalog's in-memory change does not (put the key back
        // as a catalog reopened from files that never saw the changes would have it).
        core.take_wal().unwrap().close().unwrap();
        drop(core);
        catalog
            .apply_logged_capabilities("t", &key.key_id, &[Read, Write, Admin])
            .unwrap();
        // Without a catalog such a log is refused, not replayed without its changes.
        let without = CoreConfig {
            catalog: None,
            ..config.clone()
        };
        let refused = TenantCore::<u32>::open(
            "t",
            &dir.path().join("wal"),
            &dir.path().join("state"),
            &without,
            None,
        );
        assert!(
            matches!(refused, Err(StoreError::DataLoss(_))),
            "{refused:?}"
        );
        let mut core = open(dir.path(), &config);
        assert_eq!(
            now(&catalog),
            vec![Read, Write],
            "replay puts the changes back"
        );
        // The reopen checkpointed what it replayed, catalog first: nothing is replayed again.
        core.take_wal().unwrap().close().unwrap();
        drop(core);
        let core = open(dir.path(), &without);
        assert_eq!(now(&catalog), vec![Read, Write]);
        drop(core);
    }

    /// A catalog at `dir`/catalog with tenant `t`, a core config that uses it, and a snapshot of
    /// the catalog's files as they are now (see [`snapshot_catalog`]).
    fn tenant_with_catalog(dir: &Path) -> (Arc<Catalog>, CoreConfig) {
        let catalog = Arc::new(Catalog::open(&dir.join("catalog")).unwrap());
        catalog.create_tenant("t").unwrap();
        let config = CoreConfig {
            catalog: Some(Arc::clone(&catalog)),
            ..config()
        };
        snapshot_catalog(&catalog, dir);
        (catalog, config)
    }

    /// Where [`snapshot_catalog`] puts its copy, as a catalog path under the test's directory.
    const SNAPSHOT: &str = "copy";

    /// Copy the files of `catalog` (at `dir`/catalog) as they are now, made durable, to
    /// `dir`/[`SNAPSHOT`]: a catalog whose files will not see the changes made after this.
    fn snapshot_catalog(catalog: &Catalog, dir: &Path) {
        catalog.make_durable().unwrap();
        crate::catalog::tests::copy_catalog(&dir.join("catalog"), &dir.join(SNAPSHOT));
    }

    /// A durable group holding a catalog change waits (unapplied, unanswered, the call
    /// returning at once) while the catalog syncs its files, rather than wait for the catalog's
    /// lock on the actor's thread; a group without one does not wait for the catalog at all.
    #[test]
    fn a_catalog_change_waits_while_the_catalog_syncs_its_files_and_other_changes_do_not() {
        use Capability::Write;
        let dir = tempfile::tempdir().unwrap();
        let (catalog, config) = tenant_with_catalog(dir.path());
        let key = catalog.create_key("t", false).unwrap();
        let has_write = || {
            catalog
                .key("t", &key.key_id)
                .unwrap()
                .capabilities
                .contains(&Write)
        };
        let mut core = open(dir.path(), &config);
        catalog.pretend_syncing(true);
        assert!(core.handle(write(1, b"v"), &who(), 1).is_none());
        assert!(matches!(settle(&mut core).as_slice(), [(1, Ok(_))]));
        assert!(!core.apply_held());
        let demote = caps(&key.key_id, &[], &[Write]);
        assert!(core.handle(demote, &who(), 2).is_none());
        assert_eq!(settle(&mut core), vec![]);
        assert!(core.apply_held());
        assert!(has_write());
        assert_eq!(core.retry_apply(), vec![]);
        catalog.pretend_syncing(false);
        assert!(matches!(core.retry_apply().as_slice(), [(2, Ok(_))]));
        assert!(!core.apply_held());
        assert!(!has_write());

        // Syncs that never let up (many tenants' checkpoints in a row): after
        // CATALOG_HOLD_LIMIT the apply takes the catalog's lock (here free) instead of holding
        // on until the 30-s limit fails it.
        catalog.pretend_syncing(true);
        let promote = caps(&key.key_id, &[Write], &[]);
        assert!(core.handle(promote, &who(), 3).is_none());
        assert_eq!(settle(&mut core), vec![]);
        std::thread::sleep(CATALOG_HOLD_LIMIT + Duration::from_millis(5));
        assert!(matches!(core.retry_apply().as_slice(), [(3, Ok(_))]));
        assert!(has_write());
        catalog.pretend_syncing(false);
    }

    /// A core closed on its own thread (the CLI's offline changes, a reopen during an open)
    /// waits there for room in the state store before the applies its final fdatasync releases,
    /// rather than failing them (and poisoning the tenant) because a closing core never holds.
    #[test]
    fn a_close_here_waits_for_room_in_the_state_store() {
        let dir = tempfile::tempdir().unwrap();
        let mut core = open(dir.path(), &config());
        let state_dir = dir.path().join("state");
        cube_wal::failpoint::withhold_state_room(&state_dir, true);
        assert!(core.handle(write(1, b"a"), &who(), 1).is_none());
        let release = {
            let state_dir = state_dir.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(100));
                cube_wal::failpoint::withhold_state_room(&state_dir, false);
            })
        };
        let answers = core.close_here().unwrap();
        release.join().unwrap();
        assert!(matches!(answers.as_slice(), [(1, Ok(_))]), "{answers:?}");
        assert!(!core.is_poisoned());
    }

    /// A tenant poisoned while its applies are held holds nothing more: the actor stops asking
    /// (it asked every 2 ms until the restart before; found by review).
    #[test]
    fn a_tenant_poisoned_while_its_applies_are_held_holds_no_more() {
        let dir = tempfile::tempdir().unwrap();
        let (mut core, state_dir) = holding_a_write(dir.path());
        let failed = core.on_durable(DurableEvent::Poisoned);
        cube_wal::failpoint::withhold_state_room(&state_dir, false);
        assert!(matches!(failed.as_slice(), [(1, Err(_))]));
        assert!(!core.apply_held());
    }

    /// A close with nothing left to apply (here: a tenant poisoned while its applies were
    /// held, as when a hold reaches its 30-s limit) does not wait for the state store's room
    /// again: the janitor closes such tenants one after another, and a second 30-s wait held
    /// the others' reopening (found by review).
    #[test]
    fn a_close_with_nothing_to_apply_does_not_wait_for_room() {
        let dir = tempfile::tempdir().unwrap();
        let (mut core, state_dir) = holding_a_write(dir.path());
        assert!(matches!(
            core.on_durable(DurableEvent::Poisoned).as_slice(),
            [(1, Err(_))]
        ));
        let (done, closed) = std::sync::mpsc::channel();
        let closing = std::thread::spawn(move || {
            let _ = core.close_here();
            let _ = done.send(());
        });
        let in_time = closed.recv_timeout(Duration::from_secs(10));
        cube_wal::failpoint::withhold_state_room(&state_dir, false);
        closing.join().unwrap();
        assert!(in_time.is_ok(), "the close waited for room");
    }

    /// A failure of the log while applies are held is taken by the next try, not left until
    /// the hold ends (its report waits in the mailbox, which a holding actor does not read).
    #[test]
    fn a_log_failure_ends_a_hold_at_the_next_try() {
        let dir = tempfile::tempdir().unwrap();
        let (mut core, state_dir) = holding_a_write(dir.path());
        cube_wal::failpoint::fail_next_fdatasync(&dir.path().join("wal"));
        assert!(core.handle(write(2, b"b"), &who(), 2).is_none());
        let wal = core.wal.as_ref().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while wal.failure().is_none() {
            assert!(Instant::now() < deadline, "the fdatasync did not fail");
            std::thread::sleep(Duration::from_millis(1));
        }
        let failed = core.retry_apply();
        cube_wal::failpoint::withhold_state_room(&state_dir, false);
        assert_eq!(failed.len(), 2, "{failed:?}");
        assert!(failed.iter().all(|(_, r)| r.is_err()), "{failed:?}");
        assert!(!core.apply_held());
        assert!(core.is_poisoned());
    }

    /// A key whose revocation, or loss of a capability, is logged but not yet applied (so not
    /// yet in the catalog the gateway checks), or applied since the gateway checked, gets no
    /// change into the log after that record.
    #[test]
    fn a_key_whose_revocation_or_lost_capability_is_pending_acts_no_more() {
        let dir = tempfile::tempdir().unwrap();
        let (catalog, config) = tenant_with_catalog(dir.path());
        let doomed = catalog.create_key("t", false).unwrap();
        let demoted = catalog.create_key("t", false).unwrap();
        let as_key = |key_id: &str| Caller {
            principal: format!("t/{key_id}"),
            ts_ms: 1,
        };
        let mut core = open(dir.path(), &config);
        let revoke = Command::RevokeKey {
            key_id: doomed.key_id.clone(),
        };
        assert!(core.handle(revoke, &who(), 1).is_none());
        let demote = caps(&demoted.key_id, &[], &[Capability::Write]);
        assert!(core.handle(demote, &who(), 2).is_none());
        let at_once = |core: &mut TenantCore<u32>, cmd, caller: &Caller, token| {
            core.handle(cmd, caller, token).expect("answered at once").1
        };
        // A write of each key, refused: the doomed one as revoked, the demoted one for WRITE.
        let both_refused = |core: &mut TenantCore<u32>, x: i32, token: u32| {
            let refused = at_once(core, write(x, b"late"), &as_key(&doomed.key_id), token);
            assert!(
                matches!(&refused, Err(StoreError::Unauthenticated(m)) if m.contains("revoked")),
                "{refused:?}"
            );
            let refused = at_once(
                core,
                write(x + 1, b"late"),
                &as_key(&demoted.key_id),
                token + 1,
            );
            assert!(
                matches!(&refused, Err(StoreError::PermissionDenied(m)) if m.contains("Write")),
                "{refused:?}"
            );
        };
        both_refused(&mut core, 1, 3);
        // What the demoted key keeps, it still may do; other keys are not concerned.
        let read = Command::Read { coord: at(2) };
        assert!(at_once(&mut core, read, &as_key(&demoted.key_id), 5).is_ok());
        assert!(core.handle(write(3, b"other"), &who(), 6).is_none());
        let answers = settle(&mut core);
        let tokens: Vec<u32> = answers.iter().map(|(t, _)| *t).collect();
        assert_eq!(tokens, vec![1, 2, 6], "{answers:?}");
        assert!(answers.iter().all(|(_, r)| r.is_ok()), "{answers:?}");
        // Nothing of the refused calls reached the log: three records.
        assert_eq!(core.wal.as_ref().unwrap().next_seq(), 4);
        // Applied, the changes are in the catalog and pending no more. A call the gateway let
        // through before they were applied (it checked the catalog then) still gets nothing
        // into the log after them.
        both_refused(&mut core, 4, 7);
        assert_eq!(core.wal.as_ref().unwrap().next_seq(), 4);
    }

    /// The state store can be durable past a catalog change's record before a checkpoint made the
    /// catalog durable (fjall flushes a full memtable on its own; a checkpoint's flush takes in
    /// what was applied while it ran). The reopen replays the log only after the store's applied
    /// seq, so the change is kept in the store's own batch, and made again from there.
    #[test]
    fn catalog_changes_survive_a_crash_after_the_state_store_was_flushed_past_them() {
        let dir = tempfile::tempdir().unwrap();
        let (catalog, config) = tenant_with_catalog(dir.path());
        let first = catalog.create_key("t", false).unwrap();
        let second = catalog.create_key("t", false).unwrap();
        snapshot_catalog(&catalog, dir.path());
        let relaxed = SyncPolicy::Relaxed {
            max_delay: Duration::from_millis(20),
            max_records: 64,
        };
        let mut core = open(dir.path(), &config);
        let commands = [
            caps(&first.key_id, &[Capability::Admin], &[]),
            Command::RevokeKey {
                key_id: second.key_id.clone(),
            },
            Command::CreateKey { admin: false },
            Command::SetDurability { policy: relaxed },
            write(1, b"after"),
        ];
        for (token, cmd) in (1..).zip(commands) {
            assert!(core.handle(cmd, &who(), token).is_none());
        }
        let answers = settle(&mut core);
        assert!(answers.iter().all(|(_, r)| r.is_ok()), "{answers:?}");
        let Some((
            _,
            Ok(Reply::KeyCreated {
                key_id: created, ..
            }),
        )) = answers.get(2)
        else {
            panic!("{answers:?}");
        };
        // The store flushes by itself past the changes; then a crash, before any checkpoint.
        core.state().backend().flush().unwrap();
        core.take_wal().unwrap().close().unwrap();
        drop(core);

        let check = |c: &Catalog| {
            assert!(
                c.key("t", &first.key_id)
                    .unwrap()
                    .capabilities
                    .contains(&Capability::Admin),
                "the grant is kept"
            );
            assert!(
                c.key("t", &second.key_id).unwrap().revoked,
                "the revocation is kept"
            );
            assert!(c.key("t", created).is_some(), "the created key is kept");
            assert_eq!(
                c.durability("t").unwrap(),
                relaxed,
                "the durability is kept"
            );
        };
        let copy = Arc::new(Catalog::open(&dir.path().join(SNAPSHOT)).unwrap());
        assert!(
            still_active(&copy, &second.key_id),
            "the copy never saw the changes"
        );
        let with_copy = CoreConfig {
            catalog: Some(Arc::clone(&copy)),
            ..config.clone()
        };
        let core = open(dir.path(), &with_copy);
        check(&copy);
        // The open made the catalog durable and let the kept changes go: a catalog whose files
        // are as they are now, without the changes' records, still has them.
        assert_eq!(core.state().catalog_pending().unwrap().len(), 0);
        drop((core, with_copy, copy));
        // (Its handle's lock is released on a thread of sled's, shortly after the drop.)
        let reopened = crate::catalog::tests::reopen(&dir.path().join(SNAPSHOT));
        check(&reopened);
    }

    /// A checkpoint syncs the catalog, then lets go the store's copies of the changes it covers;
    /// a change applied while it runs stays kept for the next one.
    #[test]
    fn a_checkpoint_lets_go_only_the_catalog_changes_it_made_durable() {
        let dir = tempfile::tempdir().unwrap();
        let (catalog, config) = tenant_with_catalog(dir.path());
        let key = catalog.create_key("t", false).unwrap();
        let mut core = open(dir.path(), &config);
        let kept = |core: &TenantCore<u32>| -> Vec<u64> {
            let pending = core.state().catalog_pending().unwrap();
            pending.into_iter().map(|(seq, _)| seq).collect()
        };
        assert!(
            core.handle(caps(&key.key_id, &[Capability::Admin], &[]), &who(), 1)
                .is_none()
        );
        assert!(core.handle(write(1, b"v"), &who(), 2).is_none());
        settle(&mut core);
        assert_eq!(kept(&core), vec![1]);
        let job = core.begin_checkpoint().unwrap();
        assert!(
            core.handle(Command::CreateKey { admin: false }, &who(), 3)
                .is_none()
        );
        settle(&mut core);
        assert_eq!(kept(&core), vec![1, 3]);
        let seq = job.seq;
        let result = job.run();
        core.finish_checkpoint(seq, result);
        assert_eq!(
            kept(&core),
            vec![3],
            "the change applied during the checkpoint stays"
        );
        let job = core.begin_checkpoint().unwrap();
        let seq = job.seq;
        let result = job.run();
        core.finish_checkpoint(seq, result);
        assert_eq!(kept(&core), Vec::<u64>::new());
        // With nothing kept, a checkpoint does not sync the catalog again.
        assert!(core.handle(write(2, b"w"), &who(), 4).is_none());
        settle(&mut core);
        assert!(core.begin_checkpoint().unwrap().catalog.is_none());
    }

    /// Whether `key_id` of tenant `t` is still active in `c`.
    fn still_active(c: &Catalog, key_id: &str) -> bool {
        c.key("t", key_id).is_some_and(|k| !k.revoked)
    }

    #[test]
    fn a_durability_change_is_logged_applied_to_the_catalog_and_replayed_after_a_crash() {
        let dir = tempfile::tempdir().unwrap();
        let (catalog, config) = tenant_with_catalog(dir.path());

        let relaxed = SyncPolicy::Relaxed {
            max_delay: Duration::from_millis(20),
            max_records: 64,
        };
        let set = |policy| Command::SetDurability { policy };
        let mut core = open(dir.path(), &config);
        assert!(matches!(
            core.handle(
                set(SyncPolicy::Relaxed {
                    max_delay: Duration::ZERO,
                    max_records: 64
                }),
                &who(),
                1
            ),
            Some((1, Err(StoreError::InvalidArgument(_))))
        ));
        assert!(core.handle(set(relaxed), &who(), 2).is_none());
        // Logged, not durable: the catalog still has the old policy.
        assert_eq!(catalog.durability("t").unwrap(), SyncPolicy::Always);
        assert_eq!(settle(&mut core), vec![(2, Ok(Reply::Recorded { seq: 1 }))]);
        assert_eq!(catalog.durability("t").unwrap(), relaxed);
        // The log keeps running under the policy it was opened with.
        assert_eq!(core.policy(), SyncPolicy::Always);
        let trail = core.state().reader().audit_page(1, 10).unwrap();
        assert_eq!(
            trail
                .iter()
                .map(|e| (e.op.as_str(), e.detail.as_str()))
                .collect::<Vec<_>>(),
            vec![(
                "durability",
                "policy=relaxed(max_delay_ms=20, max_records=64)"
            )]
        );

        // A crash: replayed into the copy whose files never saw the change.
        core.take_wal().unwrap().close().unwrap();
        drop(core);
        let copy = Arc::new(Catalog::open(&dir.path().join(SNAPSHOT)).unwrap());
        assert_eq!(copy.durability("t").unwrap(), SyncPolicy::Always);
        let with_copy = CoreConfig {
            catalog: Some(Arc::clone(&copy)),
            ..config.clone()
        };
        let core = open(dir.path(), &with_copy);
        assert_eq!(
            copy.durability("t").unwrap(),
            relaxed,
            "replay sets the policy"
        );
        drop(core);
    }

    /// A policy set through the catalog (the tenant's log could not take it) is newer than any
    /// logged change recovery makes again: recovery does not override it. The next logged change
    /// applied online replaces it and clears the pin durably, so recovery makes that one again.
    #[test]
    fn recovery_does_not_override_a_durability_set_through_the_catalog() {
        let dir = tempfile::tempdir().unwrap();
        let (catalog, config) = tenant_with_catalog(dir.path());
        let relaxed = |ms| SyncPolicy::Relaxed {
            max_delay: Duration::from_millis(ms),
            max_records: 64,
        };
        let set = |policy| Command::SetDurability { policy };
        let mut core = open(dir.path(), &config);
        assert!(core.handle(set(relaxed(20)), &who(), 1).is_none());
        settle(&mut core);
        // Kept in the store (and the log) until a checkpoint; then the tenant breaks, and the
        // operator's change goes through the catalog.
        core.state().backend().flush().unwrap();
        core.take_wal().unwrap().close().unwrap();
        drop(core);
        catalog.set_durability("t", SyncPolicy::Always).unwrap();

        let mut core = open(dir.path(), &config);
        assert_eq!(
            catalog.durability("t").unwrap(),
            SyncPolicy::Always,
            "the older logged change does not come back"
        );
        std::fs::remove_dir_all(dir.path().join(SNAPSHOT)).unwrap();
        snapshot_catalog(&catalog, dir.path());
        assert!(core.handle(set(relaxed(30)), &who(), 2).is_none());
        settle(&mut core);
        assert_eq!(catalog.durability("t").unwrap(), relaxed(30));
        core.take_wal().unwrap().close().unwrap();
        drop(core);
        // A crash that loses what sled had not written (the copy's files are from before the
        // change), but not the catalog's journal: the pin was cleared through it, so recovery
        // makes the newer logged change again.
        std::fs::copy(
            dir.path().join("catalog.journal"),
            dir.path().join(SNAPSHOT).with_extension("journal"),
        )
        .unwrap();
        let copy = Arc::new(Catalog::open(&dir.path().join(SNAPSHOT)).unwrap());
        let with_copy = CoreConfig {
            catalog: Some(Arc::clone(&copy)),
            ..config.clone()
        };
        let core = open(dir.path(), &with_copy);
        assert_eq!(copy.durability("t").unwrap(), relaxed(30));
        drop(core);
    }

    /// The pin of a policy set through the catalog lasts until the tenant's next open has made
    /// every older logged change durable: a change logged after that open, and cut off by a
    /// crash before the catalog took it, is made again by recovery.
    #[test]
    fn a_durability_change_logged_after_a_pinned_policy_is_replayed_after_a_crash() {
        let dir = tempfile::tempdir().unwrap();
        let (catalog, config) = tenant_with_catalog(dir.path());
        let relaxed = |ms| SyncPolicy::Relaxed {
            max_delay: Duration::from_millis(ms),
            max_records: 64,
        };
        // Set while the tenant's log could not take it: pinned.
        catalog.set_durability("t", relaxed(20)).unwrap();
        let mut core = open(dir.path(), &config);
        assert_eq!(catalog.durability("t").unwrap(), relaxed(20));
        let policy = relaxed(30);
        assert!(
            core.handle(Command::SetDurability { policy }, &who(), 1)
                .is_none()
        );
        // The crash: the record is durable, the catalog never took it.
        let wal = core.take_wal().unwrap();
        wal.wait_durable(wal.next_seq() - 1).unwrap();
        std::mem::forget(wal);
        drop(core);
        assert_eq!(catalog.durability("t").unwrap(), relaxed(20));
        let core = open(dir.path(), &config);
        assert_eq!(
            catalog.durability("t").unwrap(),
            policy,
            "recovery makes the logged change again"
        );
        let trail = core.state().reader().audit_page(1, 10).unwrap();
        assert_eq!(
            trail.last().map(|e| e.detail.as_str()),
            Some("policy=relaxed(max_delay_ms=30, max_records=64)")
        );
    }

    /// A crash that left a durability change in the log only (acknowledged, not yet in the
    /// catalog's files): the directory's open replays it, and the tenant's log then runs under
    /// the replayed policy, not the one the catalog's files had when the open began.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_tenant_recovered_with_a_durability_change_runs_under_it() {
        let dir = tempfile::tempdir().unwrap();
        let (_catalog, config) = tenant_with_catalog(dir.path());
        let data = crate::DataDir::new(dir.path().join("data"));
        let relaxed = SyncPolicy::Relaxed {
            max_delay: Duration::from_millis(20),
            max_records: 64,
        };
        let (wal_dir, state_dir) = (data.tenant_wal("t"), data.tenant_state("t"));
        let mut core = TenantCore::<u32>::open("t", &wal_dir, &state_dir, &config, None)
            .unwrap()
            .0;
        let set = Command::SetDurability { policy: relaxed };
        assert!(core.handle(set, &who(), 1).is_none());
        assert_eq!(settle(&mut core).len(), 1);
        core.take_wal().unwrap().close().unwrap();
        drop(core);

        let copy = Arc::new(Catalog::open(&dir.path().join(SNAPSHOT)).unwrap());
        assert_eq!(copy.durability("t").unwrap(), SyncPolicy::Always);
        // The directory gives each tenant its own catalog (the copy).
        let directory = test_directory(data, &config, &copy);
        let handle = directory.get("t").await.unwrap();
        assert_eq!(copy.durability("t").unwrap(), relaxed);
        assert_eq!(handle.log_stats().durability, describe_policy(&relaxed));
        directory.shutdown().await;
    }

    /// A directory over `data` whose tenants use `config` and `catalog`, one actor thread.
    /// `result` is the refusal of a tenant that only a restart brings back.
    fn assert_refused_until_restart<T: std::fmt::Debug>(result: &Result<T, StoreError>) {
        assert!(
            matches!(result, Err(StoreError::Unavailable(m)) if m.contains("until the server restarts")),
            "{result:?}"
        );
    }

    /// After a restart (a new directory on `data`), tenant `t` has the acknowledged `kept` in
    /// cell 1 and takes writes again.
    async fn restart_finds_kept(data: crate::DataDir, config: &CoreConfig, catalog: &Arc<Catalog>) {
        let restarted = test_directory(data, config, catalog);
        assert_eq!(
            value_of_t(&restarted, 1).await.as_deref(),
            Some(&b"kept"[..])
        );
        restarted.call("t", write(2, b"v"), "t/k").await.unwrap();
        restarted.shutdown().await;
    }

    /// Tenant `t`'s cell `i` as `directory` reads it (as key `t/k`): its value, if it has one.
    async fn value_of_t(directory: &crate::TenantDirectory, i: i32) -> Option<Vec<u8>> {
        let read = directory.call("t", Command::Read { coord: at(i) }, "t/k");
        match read.await.unwrap() {
            Reply::Read(cell) => cell.map(|c| c.value),
            other => panic!("{other:?}"),
        }
    }

    fn test_directory(
        data: crate::DataDir,
        config: &CoreConfig,
        catalog: &Arc<Catalog>,
    ) -> crate::TenantDirectory {
        test_directory_of(data, config, catalog, 4)
    }

    /// [`test_directory`] with at most `max_open` tenants open.
    fn test_directory_of(
        data: crate::DataDir,
        config: &CoreConfig,
        catalog: &Arc<Catalog>,
        max_open: usize,
    ) -> crate::TenantDirectory {
        let config = crate::DirectoryConfig {
            max_open,
            ..directory_config(data, config)
        };
        crate::TenantDirectory::new(config, Some(Arc::clone(catalog))).unwrap()
    }

    /// The directory settings of [`test_directory`].
    fn directory_config(data: crate::DataDir, config: &CoreConfig) -> crate::DirectoryConfig {
        crate::DirectoryConfig {
            data_dir: data,
            core: config.clone(),
            mailbox_capacity: 64,
            max_in_flight_bytes: 64 << 20,
            actor_threads: 1,
            idle_after: Duration::from_secs(3600),
            max_open: 4,
        }
    }

    /// A tenant being deleted while open: once `refuse_deleted` is called its calls are refused
    /// though its actor is still open (`UNAVAILABLE`, retry, until the catalog's change is
    /// durable; then `NOT_FOUND`), and `deletion_abandoned` lets them through again; once deleted, `close_for_deletion` closes it, its files can be removed, and no
    /// later call opens it again or makes its files anew, in this directory or after a restart
    /// (a new directory over the catalog opened again from its files), where the catalog's
    /// record of the deletion refuses the open.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_deleted_tenant_is_closed_and_never_opened_again() {
        let dir = tempfile::tempdir().unwrap();
        let (catalog, config) = tenant_with_catalog(dir.path());
        let data = crate::DataDir::new(dir.path().join("data"));
        let refused = |e: StoreError| {
            assert!(
                matches!(&e, StoreError::NotFound(m) if m == "tenant 't' was deleted"),
                "{e:?}"
            );
        };
        let directory = test_directory(data.clone(), &config, &catalog);
        directory.call("t", write(1, b"v"), "t/k").await.unwrap();
        directory.refuse_deleted("t");
        // Not deleted yet: refused as being deleted, to be retried.
        let e = directory
            .call("t", write(2, b"w"), "t/k")
            .await
            .unwrap_err();
        assert!(
            matches!(&e, StoreError::Unavailable(m) if m == "tenant 't' is being deleted; retry"),
            "{e:?}"
        );
        assert!(directory.is_open("t"), "refused by its open actor's slot");
        directory.deletion_abandoned("t").await;
        directory.call("t", write(2, b"w"), "t/k").await.unwrap();

        directory.refuse_deleted("t");
        catalog.delete_tenant("t").unwrap();
        refused(
            directory
                .call("t", write(3, b"x"), "t/k")
                .await
                .unwrap_err(),
        );
        assert!(
            directory
                .close_for_deletion("t", Duration::from_secs(10))
                .await
        );
        assert!(!directory.is_open("t"));
        assert!(crate::remove_tenant_files(&data, "t").unwrap());
        for _ in 0..2 {
            refused(
                directory
                    .call("t", write(3, b"x"), "t/k")
                    .await
                    .unwrap_err(),
            );
            refused(directory.get("t").await.unwrap_err());
        }
        assert!(!data.tenant_dir("t").exists());
        directory.shutdown().await;
        drop((directory, catalog, config));
        let catalog = Arc::new(crate::catalog::tests::reopen(&dir.path().join("catalog")));
        let config = CoreConfig {
            catalog: Some(Arc::clone(&catalog)),
            ..self::config()
        };
        let directory = test_directory(data.clone(), &config, &catalog);
        refused(
            directory
                .call("t", write(3, b"x"), "t/k")
                .await
                .unwrap_err(),
        );
        assert!(!data.tenant_dir("t").exists());
        directory.shutdown().await;
    }

    /// A tenant being passivated when shutdown begins is closed by the time shutdown returns
    /// (its slot has already left the directory's map then); no tenant opens afterwards.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn shutdown_waits_for_a_passivation_under_way() {
        let dir = tempfile::tempdir().unwrap();
        let (catalog, config) = tenant_with_catalog(dir.path());
        let data = crate::DataDir::new(dir.path().join("data"));
        let wal_dir = data.tenant_wal("t");
        let directory = Arc::new(test_directory(data, &config, &catalog));
        for i in 0..20 {
            directory.call("t", write(i, b"v"), "t/k").await.unwrap();
        }
        let closing = {
            let directory = Arc::clone(&directory);
            tokio::spawn(async move { directory.close_tenant("t").await })
        };
        // Let the passivation take the tenant out of the map, then shut down.
        while directory.open_count() > 0 {
            tokio::task::yield_now().await;
        }
        directory.shutdown().await;
        assert!(
            !cube_wal::log_may_need_replay(&wal_dir).unwrap(),
            "the tenant's log was closed before shutdown returned"
        );
        assert!(closing.await.unwrap());
        assert!(matches!(
            directory.get("t").await,
            Err(StoreError::Unavailable(m)) if m.contains("shutting down")
        ));
    }

    /// Crash tenant t's actor and return the error its next call gets.
    async fn crash(directory: &crate::TenantDirectory, after_failed_fsync: bool) -> StoreError {
        let handle = directory.get("t").await.unwrap();
        handle.crash_for_test(after_failed_fsync);
        let refused = loop {
            match directory.call("t", write(9, b"after"), "t/k").await {
                Ok(_) => tokio::time::sleep(Duration::from_millis(5)).await,
                Err(e) => break e,
            }
        };
        // Replies can be dropped a moment before the actor counts as crashed (see
        // `TenantHandle::crashed`).
        let deadline = Instant::now() + Duration::from_secs(10);
        while !handle.crashed() {
            assert!(
                Instant::now() < deadline,
                "the actor never counted as crashed"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        refused
    }

    /// A write the syncer acknowledged before the actor applied it is still what the very next
    /// read sees: by the actor-free read path and by a scan of the shared state alike.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_acknowledged_write_is_read_back_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let (catalog, config) = tenant_with_catalog(dir.path());
        let data = crate::DataDir::new(dir.path().join("data"));
        let directory = test_directory(data, &config, &catalog);
        let tenant = directory.get("t").await.unwrap();
        for i in 0..400 {
            let value = format!("v{i}").into_bytes();
            let written = directory.call("t", write(i % 7, &value), "t/k").await;
            let Ok(Reply::Written { version, .. }) = written else {
                panic!("{written:?}")
            };
            let read = directory
                .call("t", Command::Read { coord: at(i % 7) }, "t/k")
                .await
                .unwrap();
            assert!(
                matches!(&read, Reply::Read(Some(c)) if c.value == value && c.version == version),
                "write {i}: {read:?}"
            );
            let written = directory.call("t", write(100 + i, b"x"), "t/k").await;
            assert!(written.is_ok(), "{written:?}");
            tenant.caught_up().await.unwrap();
            let (totals, _) = tenant.reader().totals().unwrap();
            assert_eq!(
                totals.cells,
                7.min(i as u64 + 1) + i as u64 + 1,
                "write {i}"
            );
        }
        directory.shutdown().await;
    }

    /// A tenant whose actor panicked answers UNAVAILABLE (not "shutting down") until the janitor
    /// closes it; its next call reopens it from its log, and nothing acknowledged is lost.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_tenant_whose_actor_crashed_is_reopened_from_its_log() {
        let dir = tempfile::tempdir().unwrap();
        let (catalog, config) = tenant_with_catalog(dir.path());
        let data = crate::DataDir::new(dir.path().join("data"));
        let directory = test_directory(data, &config, &catalog);
        for i in 0..5 {
            directory.call("t", write(i, b"kept"), "t/k").await.unwrap();
        }
        let refused = crash(&directory, false).await;
        assert!(
            matches!(&refused, StoreError::Unavailable(m) if m.contains("reopened")),
            "{refused:?}"
        );
        let crashes = cube_metrics::TENANT_ACTOR_CRASHES.get();
        assert_eq!(directory.close_failed().await, 1);
        // Counted as a crash, not as a passivation (the counter is shared by this process's
        // tests, so only its rise is asked).
        assert!(cube_metrics::TENANT_ACTOR_CRASHES.get() > crashes);
        directory
            .call("t", write(9, b"after"), "t/k")
            .await
            .unwrap();
        for i in 0..5 {
            assert_eq!(
                value_of_t(&directory, i).await.as_deref(),
                Some(&b"kept"[..]),
                "cell {i}"
            );
        }
        directory.shutdown().await;
    }

    /// After a failed fsync of its log, a crashed tenant is not reopened: it would read back
    /// pages whose fsync failed as if they were durable.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_tenant_that_crashed_after_a_failed_fsync_stays_closed_until_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let directory = directory_of_t(dir.path());
        directory.call("t", write(1, b"v"), "t/k").await.unwrap();
        let refused = crash(&directory, true).await;
        assert!(
            matches!(&refused, StoreError::Unavailable(m) if m.contains("until the server restarts")),
            "{refused:?}"
        );
        assert_eq!(directory.close_failed().await, 0);
        assert!(directory.call("t", write(2, b"v"), "t/k").await.is_err());
        directory.shutdown().await;
    }

    /// A relaxed tenant's passivation whose final fdatasync fails: the tenant was taken out of
    /// the directory before its close, yet its next call must not reopen it (a reopen would read
    /// back the pages whose fsync failed as if they were durable).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_tenant_whose_close_failed_its_fsync_stays_closed_until_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let directory = relaxed_tenant_whose_next_fsync_fails(dir.path(), Duration::ZERO).await;
        assert!(directory.close_tenant("t").await, "not passivated");
        let refused = directory.call("t", write(2, b"v"), "t/k").await;
        assert_refused_until_restart(&refused);
        assert!(directory.get("t").await.is_err());
        // The stop reports it (cubed then exits 1): it used to report only tenants still open.
        assert_eq!(directory.shutdown().await, ["t"]);
    }

    /// A log in `wal_dir` whose one record is not a change: the tenant's open fails on it.
    fn unreplayable_log(wal_dir: &Path) {
        let (wal, _) = cube_wal::WalShard::open(
            wal_dir,
            cube_wal::WalOptions::default(),
            0,
            &mut |_, _| Ok(()),
            None,
        )
        .unwrap();
        wal.wait_durable(wal.append(b"not a WalOp").unwrap())
            .unwrap();
        wal.close().unwrap();
    }

    /// An idle pass (or an eviction) does not forget a failed open before its retry delay is
    /// up: it used to, at once, so under a short `--idle-secs` a tenant whose log cannot be
    /// replayed was read again at almost every call.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_open_is_not_forgotten_before_its_retry_delay() {
        let dir = tempfile::tempdir().unwrap();
        let (catalog, config) = tenant_with_catalog(dir.path());
        let data = crate::DataDir::new(dir.path().join("data"));
        unreplayable_log(&data.tenant_wal("t"));
        let settings = crate::DirectoryConfig {
            idle_after: Duration::ZERO,
            ..directory_config(data, &config)
        };
        let directory = crate::TenantDirectory::new(settings, Some(Arc::clone(&catalog))).unwrap();
        assert!(directory.get("t").await.is_err());
        assert_eq!(
            directory.passivate_idle().await,
            0,
            "forgotten before its delay"
        );
        assert_eq!(directory.open_count(), 1);
        // The first delay is 1 s.
        tokio::time::sleep(Duration::from_millis(1100)).await;
        assert_eq!(directory.passivate_idle().await, 1);
        assert_eq!(directory.open_count(), 0);
        directory.shutdown().await;
    }

    /// A failed open waiting out its retry delay takes no place under --max-open-tenants: a
    /// first call at the cap does not close a healthy idle tenant for it (it did, the failed
    /// slot counted and could not be closed).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_open_takes_no_place_under_the_cap() {
        let dir = tempfile::tempdir().unwrap();
        let (catalog, config) = tenant_with_catalog(dir.path());
        catalog.create_tenant("a").unwrap();
        catalog.create_tenant("b").unwrap();
        let data = crate::DataDir::new(dir.path().join("data"));
        unreplayable_log(&data.tenant_wal("t"));
        let directory = test_directory_of(data, &config, &catalog, 2);
        directory.get("a").await.unwrap();
        assert!(directory.get("t").await.is_err());
        directory.get("b").await.unwrap();
        assert_eq!(
            directory.open_count(),
            3,
            "a was closed to make room beside a failed open"
        );
        directory.shutdown().await;
    }

    /// A directory under `dir` (`settings` applied to the tests' configuration) whose catalog
    /// holds `t`, `others` and `a`, relaxed and written once, so that its close makes a final
    /// fdatasync: that fdatasync is held for `hold`.
    async fn with_a_close_held(
        dir: &Path,
        others: &[&str],
        settings: impl FnOnce(crate::DirectoryConfig) -> crate::DirectoryConfig,
        hold: Duration,
    ) -> (Arc<crate::TenantDirectory>, crate::DataDir) {
        let (catalog, config) = tenant_with_catalog(dir);
        for t in others.iter().chain(&["a"]) {
            catalog.create_tenant(t).unwrap();
        }
        let relaxed = SyncPolicy::Relaxed {
            max_delay: Duration::from_secs(10),
            max_records: 1000,
        };
        catalog.set_durability("a", relaxed).unwrap();
        let data = crate::DataDir::new(dir.join("data"));
        let settings = settings(directory_config(data.clone(), &config));
        let directory =
            Arc::new(crate::TenantDirectory::new(settings, Some(Arc::clone(&catalog))).unwrap());
        directory.call("a", write(1, b"v"), "a/k").await.unwrap();
        cube_wal::failpoint::delay_next_fdatasync(&data.tenant_wal("a"), hold);
        (directory, data)
    }

    /// Wait until `a`'s held fdatasync (see [`with_a_close_held`]) has begun.
    async fn until_a_close_is_held(data: &crate::DataDir) {
        let since = Instant::now();
        while !cube_wal::failpoint::fdatasync_delay_taken(&data.tenant_wal("a")) {
            assert!(
                since.elapsed() < Duration::from_secs(10),
                "a's close not started"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// A crashed tenant is closed for its reopen while the janitor's idle pass is still busy
    /// closing another (here a final fdatasync held 8 s): the idle pass runs on its own. It
    /// used to hold the janitor's loop, and the crashed tenant answered "reopened within about
    /// a second" for the whole pass.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_crashed_tenant_is_reopened_while_an_idle_pass_is_slow() {
        let dir = tempfile::tempdir().unwrap();
        // a's close (when it is passivated) waits 8 s in its final fdatasync.
        let (directory, data) = with_a_close_held(
            dir.path(),
            &[],
            |c| crate::DirectoryConfig {
                idle_after: Duration::from_millis(200),
                ..c
            },
            Duration::from_secs(8),
        )
        .await;
        let tick = Duration::from_millis(50);
        directory.start_janitor_every(tick, tick);
        // a is idle after 200 ms: the janitor's next idle pass closes it, and is held there.
        until_a_close_is_held(&data).await;
        crash(&directory, false).await;
        let crashed = Instant::now();
        loop {
            // A write: reads are served without the actor.
            match directory.call("t", write(2, b"v"), "t/k").await {
                Ok(_) => break,
                Err(StoreError::Unavailable(m)) => {
                    assert!(m.contains("reopen"), "{m}");
                    // Well inside the rest of a's held close (the bug's wait).
                    assert!(
                        crashed.elapsed() < Duration::from_secs(4),
                        "t not reopened within 4 s of its crash while a closes"
                    );
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                Err(e) => panic!("{e:?}"),
            }
        }
        directory.shutdown().await;
    }

    /// Tenants `a` (relaxed, its close's final fdatasync held for `hold`) and `b`, both open
    /// and idle (for `idle_after`), and an idle pass started and busy closing `a` (it takes
    /// tenants in name order).
    async fn an_idle_pass_held_in_a_close(
        dir: &Path,
        idle_after: Duration,
        hold: Duration,
    ) -> (Arc<crate::TenantDirectory>, tokio::task::JoinHandle<usize>) {
        let (directory, data) = with_a_close_held(
            dir,
            &["b"],
            |c| crate::DirectoryConfig { idle_after, ..c },
            hold,
        )
        .await;
        directory.call("b", write(1, b"v"), "b/k").await.unwrap();
        tokio::time::sleep(idle_after + Duration::from_millis(100)).await;
        let pass = tokio::spawn({
            let directory = Arc::clone(&directory);
            async move { directory.passivate_idle().await }
        });
        until_a_close_is_held(&data).await;
        (directory, pass)
    }

    /// A tenant closed by another path while a slow idle pass has it still to do reopens at
    /// once: the pass held its slot, and with it its state store open and locked, so the
    /// reopen waited for the pass to get there (here ~5 s; past the lock wait it failed).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_tenant_closed_while_an_idle_pass_has_it_to_do_reopens_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let (directory, pass) = an_idle_pass_held_in_a_close(
            dir.path(),
            Duration::from_millis(100),
            Duration::from_secs(5),
        )
        .await;
        assert!(directory.close_tenant("b").await);
        let reopen = Instant::now();
        directory.call("b", write(2, b"w"), "b/k").await.unwrap();
        assert!(
            reopen.elapsed() < Duration::from_secs(3),
            "b's reopen waited {:?} for the idle pass",
            reopen.elapsed()
        );
        assert_eq!(
            pass.await.unwrap(),
            1,
            "only a was idle when the pass reached it"
        );
        directory.shutdown().await;
    }

    /// An idle pass leaves open a tenant used again while it closed others (here used about
    /// half a second before the pass gets to it, with `--idle-secs` 3): idleness was judged
    /// once, when the pass began.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_idle_pass_leaves_open_a_tenant_used_again_meanwhile() {
        let dir = tempfile::tempdir().unwrap();
        let (directory, pass) = an_idle_pass_held_in_a_close(
            dir.path(),
            Duration::from_secs(3),
            Duration::from_millis(500),
        )
        .await;
        directory.call("b", write(2, b"w"), "b/k").await.unwrap();
        assert_eq!(pass.await.unwrap(), 1);
        assert!(directory.is_open("b"), "b was closed, used just before");
        directory.shutdown().await;
    }

    /// A first call of `x` that waits while room is made for it (the eviction of `a`, whose
    /// close is held 5 s) does not keep `x` open for that long once other calls have opened
    /// and closed it meanwhile: it held the slot, with its state store locked, and the next
    /// reopen of `x` waited for it (past the lock wait it failed).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_first_call_waiting_for_room_does_not_hold_its_tenant_open() {
        let dir = tempfile::tempdir().unwrap();
        let (directory, data) = with_a_close_held(
            dir.path(),
            &["x"],
            |c| crate::DirectoryConfig { max_open: 1, ..c },
            Duration::from_secs(5),
        )
        .await;
        // x's first call: over the cap, it evicts a and waits for its close.
        let first = tokio::spawn({
            let directory = Arc::clone(&directory);
            async move { directory.get("x").await.map(|_| ()) }
        });
        until_a_close_is_held(&data).await;
        // Another call opens x meanwhile, and a close takes it out again.
        directory.call("x", write(1, b"v"), "x/k").await.unwrap();
        assert!(directory.close_tenant("x").await);
        let reopen = Instant::now();
        directory.call("x", write(2, b"w"), "x/k").await.unwrap();
        assert!(
            reopen.elapsed() < Duration::from_secs(3),
            "x's reopen waited {:?} for the first call",
            reopen.elapsed()
        );
        first.await.unwrap().unwrap();
        directory.shutdown().await;
    }

    /// A tenant whose open keeps failing (here: a log record that cannot be replayed) is
    /// forgotten 1 s after its first failed open, so that its next call tries again, then after
    /// longer and longer delays: a corrupt tenant that keeps being called does not cost a
    /// recovery attempt every second.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_tenant_whose_open_keeps_failing_is_retried_less_and_less_often() {
        let dir = tempfile::tempdir().unwrap();
        let directory = directory_of_t(dir.path());
        unreplayable_log(&crate::DataDir::new(dir.path().join("data")).tenant_wal("t"));
        let fails = || async { directory.get("t").await.is_err() };
        // How long after `since` (taken before the failed open, so at most the failure's own
        // time) the failed tenant is closed for a retry: polled, so a slow machine can only
        // make the figure larger.
        let forgotten_after = |since: Instant| {
            let directory = &directory;
            async move {
                while directory.close_failed().await == 0 {
                    assert!(since.elapsed() < Duration::from_secs(30), "never forgotten");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                since.elapsed()
            }
        };
        let before = Instant::now();
        assert!(fails().await);
        let waited = forgotten_after(before).await;
        // At least the delay; at most a generous multiple (a delay ten times too long fails).
        assert!(
            waited >= Duration::from_secs(1) && waited < Duration::from_secs(6),
            "a first failure forgotten after {waited:?}"
        );
        let before = Instant::now();
        assert!(fails().await);
        let waited = forgotten_after(before).await;
        assert!(
            waited >= Duration::from_secs(2) && waited < Duration::from_secs(12),
            "a second failure forgotten after {waited:?}"
        );
        directory.shutdown().await;
    }

    /// A tenant with many calls queued takes turns with the other tenants of its actor thread:
    /// actix's mailbox drains an actor's queue in one go, so tenant u's call waited for every
    /// call t had queued (500 slow ones here: about a second), however long (found by review).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_tenant_with_a_deep_mailbox_takes_turns_with_the_others_on_its_thread() {
        let dir = tempfile::tempdir().unwrap();
        let (catalog, config) = tenant_with_catalog(dir.path());
        catalog.create_tenant("u").unwrap();
        let data = crate::DataDir::new(dir.path().join("data"));
        // One actor thread for both tenants; room for 500 calls of t in flight.
        let directory = Arc::new(
            crate::TenantDirectory::new(
                crate::DirectoryConfig {
                    mailbox_capacity: 1024,
                    ..directory_config(data.clone(), &config)
                },
                Some(Arc::clone(&catalog)),
            )
            .unwrap(),
        );
        directory.call("t", write(0, b"v"), "t/k").await.unwrap();
        directory.call("u", write(0, b"v"), "u/k").await.unwrap();
        let wal_t = data.tenant_wal("t");
        cube_wal::failpoint::slow_handling(&wal_t, Some(Duration::from_millis(2)));
        let queued: Vec<_> = (1..=500)
            .map(|i| {
                let directory = Arc::clone(&directory);
                tokio::spawn(async move { directory.call("t", write(i, b"q"), "t/k").await })
            })
            .collect();
        // Let them queue up behind the first.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let started = Instant::now();
        directory.call("u", write(1, b"v"), "u/k").await.unwrap();
        let waited = started.elapsed();
        let still_queued = queued.iter().filter(|q| !q.is_finished()).count();
        cube_wal::failpoint::slow_handling(&wal_t, None);
        for q in queued {
            q.await.unwrap().unwrap();
        }
        // Without turns u is answered after all of t's queued calls (none left then); with them,
        // after a turn or two of t's (32 calls each), besides the ~25 handled in the 50 ms
        // before u's call. Counted, not timed: a slow machine slows both alike.
        assert!(
            still_queued >= 300,
            "u waited {waited:?} behind t's queue: {still_queued} of its 500 calls were left"
        );
        assert!(directory.shutdown().await.is_empty());
    }

    /// A tenant whose state store has no room for its applies (flushes behind: a bulk load on a
    /// slow disk) holds its own applies, not the actor thread it shares: another tenant on that
    /// thread is served meanwhile. Its changes are applied once room comes, also when a
    /// shutdown comes first (it waits behind the hold: a holding actor reads no message).
    /// Before, the apply waited for room on the thread, up to 30 s.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_tenant_waiting_for_room_in_its_state_store_does_not_stall_its_thread() {
        let dir = tempfile::tempdir().unwrap();
        let (catalog, config) = tenant_with_catalog(dir.path());
        catalog.create_tenant("u").unwrap();
        let data = crate::DataDir::new(dir.path().join("data"));
        let state_t = data.tenant_state("t");
        // One actor thread for both tenants.
        let directory = Arc::new(test_directory(data.clone(), &config, &catalog));
        directory.call("t", write(0, b"v"), "t/k").await.unwrap();
        directory.call("u", write(0, b"v"), "u/k").await.unwrap();
        // Applied (a read waits for it), so its apply is not the one held below.
        value_of_t(&directory, 0).await;

        let holds = cube_metrics::ApplyHold::StateStore.counter().get();
        cube_wal::failpoint::withhold_state_room(&state_t, true);
        // Answered once durable (by the syncer, sync policy), applied later.
        directory.call("t", write(1, b"held"), "t/k").await.unwrap();
        for i in 1..=20 {
            tokio::time::timeout(
                Duration::from_secs(5),
                directory.call("u", write(i, b"v"), "u/k"),
            )
            .await
            .expect("tenant u stalled behind t's wait for room")
            .unwrap();
        }
        // Shared by this process's tests: only its rise is asked.
        assert!(cube_metrics::ApplyHold::StateStore.counter().get() > holds);
        // A read of t waits for the apply (read your writes).
        let read = tokio::spawn({
            let directory = Arc::clone(&directory);
            async move { value_of_t(&directory, 1).await }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!read.is_finished(), "read before the apply");
        cube_wal::failpoint::withhold_state_room(&state_t, false);
        assert_eq!(read.await.unwrap().as_deref(), Some(&b"held"[..]));

        cube_wal::failpoint::withhold_state_room(&state_t, true);
        directory
            .call("t", write(2, b"at shutdown"), "t/k")
            .await
            .unwrap();
        let shutdown = {
            let directory = Arc::clone(&directory);
            tokio::spawn(async move { directory.shutdown().await })
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!shutdown.is_finished(), "closed before the apply");
        cube_wal::failpoint::withhold_state_room(&state_t, false);
        let failed = tokio::time::timeout(Duration::from_secs(10), shutdown)
            .await
            .unwrap()
            .unwrap();
        assert!(failed.is_empty(), "{failed:?}");
        drop(directory);
        let restarted = test_directory(data, &config, &catalog);
        assert_eq!(
            value_of_t(&restarted, 2).await.as_deref(),
            Some(&b"at shutdown"[..])
        );
        restarted.shutdown().await;
    }

    /// While a tenant's applies are held, its calls wait in its mailbox, held to its in-flight
    /// cap (the rest refused RESOURCE_EXHAUSTED), rather than being logged and answered (under
    /// `sync` the syncer answers a cell change once durable, which frees its place): a bulk
    /// load on a slow disk must not pile changes up in memory without bound while flushes
    /// catch up. (Found by review: the first version of the hold went on logging.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_tenant_whose_applies_are_held_logs_no_more_than_its_in_flight_cap() {
        let dir = tempfile::tempdir().unwrap();
        let (catalog, config) = tenant_with_catalog(dir.path());
        let data = crate::DataDir::new(dir.path().join("data"));
        let state_t = data.tenant_state("t");
        let directory = Arc::new(test_directory(data, &config, &catalog));
        directory.call("t", write(0, b"v"), "t/k").await.unwrap();
        // Applied (a read waits for it), so its apply is not the one held.
        value_of_t(&directory, 0).await;
        cube_wal::failpoint::withhold_state_room(&state_t, true);
        // The next change is held after its fdatasync (and answered by the syncer).
        directory.call("t", write(1, b"v"), "t/k").await.unwrap();
        let calls: Vec<_> = (0..200)
            .map(|i| {
                let directory = Arc::clone(&directory);
                tokio::spawn(async move { directory.call("t", write(10 + i, b"v"), "t/k").await })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(300)).await;
        let (mut answered, mut refused) = (0, 0);
        for c in &calls {
            if c.is_finished() {
                answered += 1;
            }
        }
        cube_wal::failpoint::withhold_state_room(&state_t, false);
        for c in calls {
            match c.await.unwrap() {
                Ok(_) => {}
                Err(StoreError::ResourceExhausted(_)) => refused += 1,
                Err(e) => panic!("{e:?}"),
            }
        }
        // The mailbox cap of `directory_config` is 64: at most that many wait, none answered.
        assert_eq!(answered, refused, "calls answered while applies were held");
        assert!(refused >= 200 - 64, "{refused} refused");
        directory.shutdown().await;
    }

    /// A first call that gives up while the directory makes room for its tenant (closing
    /// another at the --max-open-tenants cap) still leaves a tenant that opens, and so can be
    /// closed again. Before, its slot stayed in the map unopened, never closable, holding a
    /// place under the cap until the tenant's next call.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_first_call_given_up_while_room_is_made_still_leaves_a_closable_tenant() {
        let dir = tempfile::tempdir().unwrap();
        let (catalog, config) = tenant_with_catalog(dir.path());
        catalog.create_tenant("u").unwrap();
        let data = crate::DataDir::new(dir.path().join("data"));
        let directory = test_directory_of(data, &config, &catalog, 1);
        for i in 0..50 {
            directory.call("t", write(i, b"v"), "t/k").await.unwrap();
        }
        // Closing t (its fdatasync and checkpoint) takes longer than this caller waits.
        let gave_up = tokio::time::timeout(Duration::from_micros(100), directory.get("u")).await;
        assert!(
            gave_up.is_err(),
            "the call did not give up while room was made"
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        while !directory.close_tenant("u").await {
            assert!(Instant::now() < deadline, "u never became closable");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(directory.open_count(), 0);
        directory.shutdown().await;
    }

    fn directory_of_t(dir: &Path) -> crate::TenantDirectory {
        let (catalog, config) = tenant_with_catalog(dir);
        test_directory(crate::DataDir::new(dir.join("data")), &config, &catalog)
    }

    /// A directory of tenant `t` under a relaxed policy, with one change acknowledged inside
    /// the window (before any fdatasync), and the next fdatasync of its log set to fail after
    /// `delay`.
    async fn relaxed_tenant_whose_next_fsync_fails(
        dir: &Path,
        delay: Duration,
    ) -> crate::TenantDirectory {
        let (catalog, config) = tenant_with_catalog(dir);
        let relaxed = SyncPolicy::Relaxed {
            max_delay: Duration::from_secs(10),
            max_records: 1000,
        };
        catalog.set_durability("t", relaxed).unwrap();
        let data = crate::DataDir::new(dir.join("data"));
        let wal_dir = data.tenant_wal("t");
        let directory = test_directory(data, &config, &catalog);
        directory.call("t", write(1, b"v"), "t/k").await.unwrap();
        cube_wal::failpoint::fail_next_fdatasync_after(&wal_dir, delay);
        directory
    }

    /// A call arriving while a passivation's final fdatasync is failing (slowly: the injected
    /// failure holds the close for 600 ms) does not open the tenant again beside the close
    /// under way: it waits for the close to end, then finds the failure. Opened again, the
    /// tenant would have read back the failed pages as durable and served the call.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_call_arriving_during_a_close_whose_fsync_fails_does_not_reopen_the_tenant() {
        let dir = tempfile::tempdir().unwrap();
        let directory =
            relaxed_tenant_whose_next_fsync_fails(dir.path(), Duration::from_millis(600)).await;
        let wal_dir = crate::DataDir::new(dir.path().join("data")).tenant_wal("t");
        let ((closed, close_ended), (raced, raced_at)) = tokio::join!(
            async { (directory.close_tenant("t").await, Instant::now()) },
            async {
                // Once the close's fdatasync is under way (held 600 ms, then failing).
                let deadline = Instant::now() + Duration::from_secs(5);
                while !cube_wal::failpoint::fdatasync_failure_taken(&wal_dir) {
                    assert!(
                        Instant::now() < deadline,
                        "the close's fdatasync never began"
                    );
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                let at = Instant::now();
                (directory.call("t", write(2, b"v"), "t/k").await, at)
            }
        );
        assert!(closed);
        assert!(
            raced_at < close_ended,
            "the call came after the close: no race"
        );
        assert_refused_until_restart(&raced);
        let after = directory.call("t", write(3, b"v"), "t/k").await;
        assert_refused_until_restart(&after);
        directory.shutdown().await;
    }

    /// A passivation whose final checkpoint fails (the state store's fsync, on a disk with
    /// room) leaves the tenant refused until the restart, as a failed checkpoint while open
    /// does: a reopen would read back a state store whose fsync failed as if it were durable.
    /// Its log is kept, so the restart replays every acknowledged change.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_tenant_whose_checkpoint_at_close_fails_is_refused_until_the_restart() {
        refused_until_restart_after_a_failed_close(|data| {
            cube_wal::failpoint::fail_next_fdatasync(&data.tenant_state("t"))
        })
        .await;
    }

    /// A periodic checkpoint still running when its tenant is passivated, and failing then,
    /// leaves the tenant refused until the restart, as a failed checkpoint at the close does.
    /// (The close used to drop that checkpoint's result unseen and skip its own checkpoint:
    /// the tenant reopened on a state store whose fsync had failed.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_periodic_checkpoint_failing_during_its_tenants_close_is_not_lost() {
        let dir = tempfile::tempdir().unwrap();
        let (catalog, config, data, directory) = checkpointing_tenant(dir.path()).await;
        let (first, _) =
            seqs_when(&directory, &|applied, checkpointed| applied == checkpointed).await;
        // The checkpoint the next change starts takes 1 s to fail its fsync; the close comes
        // while it runs.
        cube_wal::failpoint::fail_next_fdatasync_after(
            &data.tenant_state("t"),
            Duration::from_secs(1),
        );
        directory.call("t", write(1, b"kept"), "t/k").await.unwrap();
        let (_, checkpointed) = seqs_when(&directory, &|applied, _| applied > first).await;
        assert_eq!(checkpointed, first, "the checkpoint did not wait");
        closed_and_refused_until_restart(directory, data, &config, &catalog).await;
    }

    /// Tenant `t` in a directory over `dir`, every change of which starts a checkpoint (if none
    /// is running), open and written once (cell 0): its catalog, config, data and directory.
    async fn checkpointing_tenant(
        dir: &Path,
    ) -> (
        Arc<Catalog>,
        CoreConfig,
        crate::DataDir,
        crate::TenantDirectory,
    ) {
        let (catalog, mut config) = tenant_with_catalog(dir);
        config.checkpoint.every_bytes = 1;
        let data = crate::DataDir::new(dir.join("data"));
        let directory = test_directory(data.clone(), &config, &catalog);
        directory.call("t", write(0, b"v"), "t/k").await.unwrap();
        (catalog, config, data, directory)
    }

    /// Tenant `t`'s (applied, checkpointed) seqs, once `ready` holds for them (at most 20 s).
    async fn seqs_when(
        directory: &crate::TenantDirectory,
        ready: &dyn Fn(u64, u64) -> bool,
    ) -> (u64, u64) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let log = directory.get("t").await.unwrap().log_stats();
            if ready(log.last_seq, log.checkpoint_seq) {
                return (log.last_seq, log.checkpoint_seq);
            }
            assert!(Instant::now() < deadline, "{log:?}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// A periodic checkpoint still running when its tenant's actor crashes (a panic: its
    /// result goes with the actor), and failing then, leaves the tenant refused until the
    /// restart. The crashed tenant's close did not wait for it: the next call reopened the
    /// tenant, waited for the state store's lock, and served on a store whose fsync had failed.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_periodic_checkpoint_failing_after_its_tenants_actor_crashed_is_not_lost() {
        let dir = tempfile::tempdir().unwrap();
        let (catalog, config, data, directory) = checkpointing_tenant(dir.path()).await;
        seqs_when(&directory, &|applied, checkpointed| applied == checkpointed).await;
        // The checkpoint the next change starts takes 1 s to fail its fsync; the actor crashes
        // while it runs.
        cube_wal::failpoint::fail_next_fdatasync_after(
            &data.tenant_state("t"),
            Duration::from_secs(1),
        );
        directory.call("t", write(1, b"kept"), "t/k").await.unwrap();
        crash(&directory, false).await;
        directory.close_failed().await;
        for _ in 0..2 {
            let refused = directory.call("t", write(2, b"v"), "t/k").await;
            assert_refused_until_restart(&refused);
        }
        directory.shutdown().await;
        drop(directory);
        restart_finds_kept(data, &config, &catalog).await;
    }

    /// Shutdown names the tenants whose close failed (here its final checkpoint's fsync), so
    /// that the server does not report a clean stop; a clean close names none.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn shutdown_names_the_tenants_whose_close_failed() {
        let dir = tempfile::tempdir().unwrap();
        let (catalog, config) = tenant_with_catalog(dir.path());
        let data = crate::DataDir::new(dir.path().join("data"));
        let directory = test_directory(data.clone(), &config, &catalog);
        directory.call("t", write(1, b"kept"), "t/k").await.unwrap();
        cube_wal::failpoint::fail_next_fdatasync(&data.tenant_state("t"));
        assert_eq!(directory.shutdown().await, ["t"]);
        drop(directory);
        let again = test_directory(data, &config, &catalog);
        again.call("t", write(2, b"v"), "t/k").await.unwrap();
        assert!(again.shutdown().await.is_empty());
    }

    /// A tenant poisoned for good while open (a periodic checkpoint's fsync failed) is named by
    /// the shutdown too: it needs the restart, and the stop was reported clean (exit 0).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn shutdown_names_a_tenant_poisoned_for_good_while_open() {
        let dir = tempfile::tempdir().unwrap();
        // Open (its open syncs the state store) before the fsync is made to fail.
        let (catalog, config, data, directory) = checkpointing_tenant(dir.path()).await;
        cube_wal::failpoint::fail_next_fdatasync(&data.tenant_state("t"));
        directory.call("t", write(1, b"kept"), "t/k").await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let answer = directory.call("t", write(2, b"v"), "t/k").await;
            if answer.is_err() {
                assert_refused_until_restart(&answer);
                break;
            }
            assert!(Instant::now() < deadline, "no checkpoint failed");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(directory.shutdown().await, ["t"]);
        drop(directory);
        restart_finds_kept(data, &config, &catalog).await;
    }

    /// A passivation whose removal of the checkpointed log fails an fsync (the directory's)
    /// leaves the tenant refused until the restart, as a failed final checkpoint does.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_tenant_whose_log_removal_at_close_fails_an_fsync_is_refused_until_the_restart() {
        refused_until_restart_after_a_failed_close(|data| {
            cube_wal::failpoint::fail_next_dir_sync_after_delete(&data.tenant_wal("t"))
        })
        .await;
    }

    /// Tenant `t` (which holds `kept` in cell 1) passivated: its calls are refused until the
    /// restart, which finds the write.
    async fn closed_and_refused_until_restart(
        directory: crate::TenantDirectory,
        data: crate::DataDir,
        config: &CoreConfig,
        catalog: &Arc<Catalog>,
    ) {
        assert!(directory.close_tenant("t").await);
        for _ in 0..2 {
            let refused = directory.call("t", write(2, b"v"), "t/k").await;
            assert_refused_until_restart(&refused);
        }
        directory.shutdown().await;
        drop(directory);
        restart_finds_kept(data, config, catalog).await;
    }

    /// Tenant `t` written once, `arm`ed to fail, passivated: refused until the restart, which
    /// finds the write.
    async fn refused_until_restart_after_a_failed_close(arm: impl FnOnce(&crate::DataDir)) {
        let dir = tempfile::tempdir().unwrap();
        let (catalog, config) = tenant_with_catalog(dir.path());
        let data = crate::DataDir::new(dir.path().join("data"));
        let directory = test_directory(data.clone(), &config, &catalog);
        directory.call("t", write(1, b"kept"), "t/k").await.unwrap();
        arm(&data);
        closed_and_refused_until_restart(directory, data, &config, &catalog).await;
    }

    /// A write of the log that fails without a full disk (EIO, no descriptor left) stops the
    /// tenant reopenable: the janitor closes it and its next call opens it afresh. Its close
    /// used to report the stopped log as a failed fdatasync, which refused the tenant until the
    /// restart.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_tenant_whose_log_write_failed_is_served_again_after_its_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let (catalog, config) = tenant_with_catalog(dir.path());
        let data = crate::DataDir::new(dir.path().join("data"));
        let directory = test_directory(data.clone(), &config, &catalog);
        directory.call("t", write(1, b"kept"), "t/k").await.unwrap();
        cube_wal::failpoint::fail_next_write(&data.tenant_wal("t"));
        let failed = directory.call("t", write(2, b"lost"), "t/k").await;
        assert!(
            matches!(&failed, Err(StoreError::Unavailable(m)) if m.contains("reopens by itself")),
            "{failed:?}"
        );
        assert_eq!(directory.close_failed().await, 1);
        directory.call("t", write(3, b"v"), "t/k").await.unwrap();
        for (x, want) in [(1, Some(&b"kept"[..])), (2, None), (3, Some(&b"v"[..]))] {
            let read = directory
                .call("t", Command::Read { coord: at(x) }, "t/k")
                .await
                .unwrap();
            match (&read, want) {
                (Reply::Read(Some(c)), Some(v)) => assert_eq!(c.value, v, "cell {x}"),
                (Reply::Read(None), None) => {}
                _ => panic!("cell {x}: {read:?}"),
            }
        }
        directory.shutdown().await;
    }

    /// Under `relaxed`, a failed write of the log can lose changes acknowledged inside the
    /// window (not written yet): the refusals that follow say so, not "nothing acknowledged is
    /// lost" as under `sync` (the test above).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_relaxed_tenants_refusals_after_a_failed_log_write_name_its_window() {
        let dir = tempfile::tempdir().unwrap();
        let (catalog, config) = tenant_with_catalog(dir.path());
        let relaxed = SyncPolicy::Relaxed {
            max_delay: Duration::from_secs(10),
            max_records: 1000,
        };
        catalog.set_durability("t", relaxed).unwrap();
        let data = crate::DataDir::new(dir.path().join("data"));
        let directory = test_directory(data.clone(), &config, &catalog);
        directory.call("t", write(1, b"v"), "t/k").await.unwrap();
        cube_wal::failpoint::fail_next_write(&data.tenant_wal("t"));
        // The write that meets the failure may be acknowledged first (inside the window); the
        // ones after it are refused.
        let deadline = Instant::now() + Duration::from_secs(10);
        let refused = loop {
            match directory.call("t", write(2, b"v"), "t/k").await {
                Err(e) => break e,
                Ok(_) => {
                    assert!(Instant::now() < deadline, "never refused");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        };
        let refused = match refused {
            StoreError::Unavailable(m) if m.contains("This change was already in") => directory
                .call("t", write(3, b"v"), "t/k")
                .await
                .expect_err("a write to the stopped tenant"),
            other => other,
        };
        assert!(
            matches!(&refused, StoreError::Unavailable(m)
                if m.contains("acknowledged inside the tenant's relaxed durability window may be lost")),
            "{refused:?}"
        );
        // The stop reports the tenant (it used to say every tenant closed cleanly): the write
        // that met the failure was acknowledged before it was written, or the refused one
        // says it may have been.
        assert_eq!(directory.shutdown().await, vec!["t".to_string()]);
    }

    /// A change the syncer acknowledged whose apply then failed: reads refuse to serve the state
    /// that lacks it (UNAVAILABLE, not a stale answer) until the janitor's reopen, whose replay
    /// applies it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_change_acknowledged_before_its_apply_failed_is_read_after_the_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let (catalog, config) = tenant_with_catalog(dir.path());
        let data = crate::DataDir::new(dir.path().join("data"));
        let directory = test_directory(data.clone(), &config, &catalog);
        directory.call("t", write(1, b"kept"), "t/k").await.unwrap();
        // Applied (it may have been answered first), so the next apply is the next write's.
        directory.get("t").await.unwrap().caught_up().await.unwrap();
        cube_wal::failpoint::fail_next_apply(&data.tenant_wal("t"));
        // Durable, so acknowledged (by the syncer, or by the failure's answers).
        let acked = directory.call("t", write(2, b"acked"), "t/k").await;
        assert_eq!(acked, Ok(Reply::Written { version: 1, seq: 3 }));
        let read = directory
            .call("t", Command::Read { coord: at(2) }, "t/k")
            .await;
        assert!(
            matches!(&read, Err(StoreError::Unavailable(m)) if m.contains("reopening")),
            "{read:?}"
        );
        assert_eq!(directory.close_failed().await, 1);
        for (x, want) in [(1, &b"kept"[..]), (2, &b"acked"[..])] {
            let read = directory
                .call("t", Command::Read { coord: at(x) }, "t/k")
                .await
                .unwrap();
            assert!(
                matches!(&read, Reply::Read(Some(c)) if c.value == want),
                "cell {x}: {read:?}"
            );
        }
        directory.shutdown().await;
    }

    /// A tenant poisoned reopenable wakes the janitor, which closes it at once: here its round
    /// is an hour, yet a failed log write and then a failed apply are each served again (the
    /// acknowledged change read back) without anyone calling `close_failed`. Before, they
    /// waited for the janitor's next round, up to a second.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_tenant_poisoned_reopenable_is_reopened_without_waiting_for_the_janitors_round() {
        let dir = tempfile::tempdir().unwrap();
        let (catalog, config) = tenant_with_catalog(dir.path());
        let data = crate::DataDir::new(dir.path().join("data"));
        let directory = Arc::new(test_directory(data.clone(), &config, &catalog));
        let hour = Duration::from_secs(3600);
        directory.start_janitor_every(hour, hour);
        /// `cmd` until it succeeds, for at most 30 s.
        async fn until_served(directory: &crate::TenantDirectory, cmd: Command) -> Reply {
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                match directory.call("t", cmd.clone(), "t/k").await {
                    Ok(reply) => return reply,
                    Err(StoreError::Unavailable(m)) if Instant::now() < deadline => {
                        assert!(m.contains("reopen"), "{m}");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    Err(e) => panic!("still refused after 30 s: {e:?}"),
                }
            }
        }
        directory.call("t", write(1, b"kept"), "t/k").await.unwrap();
        cube_wal::failpoint::fail_next_write(&data.tenant_wal("t"));
        let failed = directory.call("t", write(2, b"lost"), "t/k").await;
        assert!(
            matches!(&failed, Err(StoreError::Unavailable(_))),
            "{failed:?}"
        );
        until_served(&directory, write(3, b"v")).await;
        directory.get("t").await.unwrap().caught_up().await.unwrap();
        cube_wal::failpoint::fail_next_apply(&data.tenant_wal("t"));
        let acked = directory.call("t", write(4, b"acked"), "t/k").await;
        assert!(matches!(acked, Ok(Reply::Written { .. })), "{acked:?}");
        let read = until_served(&directory, Command::Read { coord: at(4) }).await;
        assert!(
            matches!(&read, Reply::Read(Some(c)) if c.value == b"acked"),
            "{read:?}"
        );
        directory.shutdown().await;
    }

    /// An fdatasync that fails while a tenant's log is opened (the sync of what a crash left in
    /// the page cache) refuses the tenant until the restart, as a failed fdatasync of its
    /// syncer does: a retried open would read the pages the kernel could not write back as
    /// durable. It used to be retried a second later like any failed open.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_fdatasync_while_opening_a_log_is_not_retried() {
        an_open_whose_sync_fails_is_not_retried(|data| data.tenant_wal("t")).await;
    }

    /// Tenant `t`, written and closed, then opened with the next fdatasync of the directory
    /// `failing` gives failed: the open fails, and the tenant stays refused past the failed
    /// open's retry delay, until the restart, which finds what was written before.
    async fn an_open_whose_sync_fails_is_not_retried(
        failing: impl Fn(&crate::DataDir) -> std::path::PathBuf,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let (catalog, config) = tenant_with_catalog(dir.path());
        let data = crate::DataDir::new(dir.path().join("data"));
        let directory = test_directory(data.clone(), &config, &catalog);
        directory.call("t", write(1, b"kept"), "t/k").await.unwrap();
        assert!(directory.close_tenant("t").await);
        cube_wal::failpoint::fail_next_fdatasync(&failing(&data));
        let failed = directory.call("t", write(2, b"v"), "t/k").await;
        assert!(
            matches!(&failed, Err(StoreError::Unavailable(_))),
            "{failed:?}"
        );
        // Past the failed open's retry delay, as the janitor would find it.
        tokio::time::sleep(Duration::from_millis(1100)).await;
        directory.close_failed().await;
        for _ in 0..2 {
            let refused = directory.call("t", write(3, b"v"), "t/k").await;
            assert_refused_until_restart(&refused);
        }
        directory.shutdown().await;
        drop(directory);
        restart_finds_kept(data, &config, &catalog).await;
    }

    /// A failed sync of the state store at a tenant's open (its flush of what the replay
    /// applied) is not retried either: a retried open would find the store's files as the
    /// failed sync left them in the page cache, take them for durable, and delete the log
    /// segments they cover. Before, the janitor reopened the tenant a second later.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_state_store_sync_while_opening_is_not_retried() {
        an_open_whose_sync_fails_is_not_retried(|data| data.tenant_state("t")).await;
    }

    /// What one tenant's requests in flight carry is bounded: writes waiting behind a slow
    /// fdatasync past `max_in_flight_bytes` are refused with RESOURCE_EXHAUSTED at once, long
    /// before the request count (`mailbox_capacity`) is reached; with nothing held, a value
    /// larger than the bound still goes through.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn requests_in_flight_are_bounded_in_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let (catalog, config) = tenant_with_catalog(dir.path());
        let data = crate::DataDir::new(dir.path().join("data"));
        let settings = crate::DirectoryConfig {
            mailbox_capacity: 64,
            max_in_flight_bytes: 512 << 10,
            ..directory_config(data.clone(), &config)
        };
        let directory =
            Arc::new(crate::TenantDirectory::new(settings, Some(Arc::clone(&catalog))).unwrap());
        let big = vec![7u8; 1 << 20];
        directory.call("t", write(0, &big), "t/k").await.unwrap();
        // The next fdatasync takes 2 s (then fails): writes pile up behind it.
        cube_wal::failpoint::fail_next_fdatasync_after(
            &data.tenant_wal("t"),
            Duration::from_secs(2),
        );
        let value = vec![1u8; 128 << 10];
        let calls: Vec<_> = (1..=12)
            .map(|x| {
                let (directory, value) = (Arc::clone(&directory), value.clone());
                tokio::spawn(async move { directory.call("t", write(x, &value), "t/k").await })
            })
            .collect();
        let mut busy = 0;
        for call in calls {
            if let Err(StoreError::ResourceExhausted(m)) = call.await.unwrap() {
                assert!(m.contains("requests in flight already carry"), "{m}");
                busy += 1;
            }
        }
        // 512 KiB holds four 128 KiB values at once.
        assert_eq!(busy, 8, "{busy} of 12 refused");
        directory.shutdown().await;
    }

    /// A Read, answered off the core's thread from the applied state, is refused to a key whose
    /// revocation or loss of READ is logged but not yet applied (while its fdatasync runs): the
    /// catalog that authenticated the call does not show it yet, the core does. It used to be
    /// answered in that window while the same key's Write was refused.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_read_by_a_key_whose_revocation_is_pending_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (catalog, config) = tenant_with_catalog(dir.path());
        let doomed = catalog.create_key("t", false).unwrap();
        let demoted = catalog.create_key("t", false).unwrap();
        let data = crate::DataDir::new(dir.path().join("data"));
        let directory = Arc::new(test_directory(data.clone(), &config, &catalog));
        directory.call("t", write(1, b"v"), "t/k").await.unwrap();
        let read = |key: &str| {
            let (directory, principal) = (Arc::clone(&directory), format!("t/{key}"));
            async move {
                directory
                    .call("t", Command::Read { coord: at(1) }, &principal)
                    .await
            }
        };
        assert!(read(&doomed.key_id).await.is_ok());
        // The next fdatasync takes 2 s (then fails): both changes wait for it.
        cube_wal::failpoint::fail_next_fdatasync_after(
            &data.tenant_wal("t"),
            Duration::from_secs(2),
        );
        let changes = {
            let directory = Arc::clone(&directory);
            let (doomed, demoted) = (doomed.key_id.clone(), demoted.key_id.clone());
            tokio::spawn(async move {
                let revoke = Command::RevokeKey { key_id: doomed };
                let demote = Command::ChangeCapabilities {
                    key_id: demoted,
                    grant: vec![],
                    revoke: vec![Capability::Read],
                };
                tokio::join!(
                    directory.call("t", revoke, "operator"),
                    directory.call("t", demote, "operator")
                )
            })
        };
        // Until both changes are logged (and wait for the stalled fdatasync) the two keys read
        // on: polled, not slept, so a slow machine cannot run the checks before or after the
        // window.
        let deadline = Instant::now() + Duration::from_millis(1500);
        let (revoked, lost_read) = loop {
            let both = (read(&doomed.key_id).await, read(&demoted.key_id).await);
            if (both.0.is_err() && both.1.is_err()) || Instant::now() > deadline {
                break both;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        assert_refused_reads(&revoked, &lost_read);
        // Other keys read on.
        assert!(read("k").await.is_ok());
        assert!(
            !changes.is_finished(),
            "the changes ended before the checks: they did not see them pending"
        );
        // The fdatasync failed: whether the two records reached the disk is unknown until the
        // restart, so the keys stay refused what the records take away (fail closed).
        let (revoke, demote) = changes.await.unwrap();
        assert!(revoke.is_err() && demote.is_err(), "{revoke:?} {demote:?}");
        assert_refused_reads(&read(&doomed.key_id).await, &read(&demoted.key_id).await);
        assert!(read("k").await.is_ok());
        directory.shutdown().await;
    }

    /// A read by a revoked key refused as such, and one by a key that lost READ as lacking it.
    fn assert_refused_reads(
        revoked: &Result<Reply, StoreError>,
        lost_read: &Result<Reply, StoreError>,
    ) {
        assert!(
            matches!(revoked, Err(StoreError::Unauthenticated(m)) if m.contains("revoked")),
            "{revoked:?}"
        );
        assert!(
            matches!(lost_read, Err(StoreError::PermissionDenied(m)) if m.contains("Read")),
            "{lost_read:?}"
        );
    }

    /// A read authenticated before its key was revoked (or lost READ), and reaching the tenant
    /// only once that change is applied (it waited for the rest of its request, or for the
    /// tenant's open), is refused: nothing is pending then, so the read is checked against the
    /// catalog as it is, as a change is.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_read_by_a_key_revoked_since_it_was_authenticated_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (catalog, config) = tenant_with_catalog(dir.path());
        let doomed = catalog.create_key("t", false).unwrap();
        let demoted = catalog.create_key("t", false).unwrap();
        let data = crate::DataDir::new(dir.path().join("data"));
        let directory = Arc::new(test_directory(data, &config, &catalog));
        directory.call("t", write(1, b"v"), "t/k").await.unwrap();
        let read = |key: &str| {
            let (directory, principal) = (Arc::clone(&directory), format!("t/{key}"));
            async move {
                directory
                    .call("t", Command::Read { coord: at(1) }, &principal)
                    .await
            }
        };
        assert!(read(&doomed.key_id).await.is_ok());
        assert!(read(&demoted.key_id).await.is_ok());
        let revoke = Command::RevokeKey {
            key_id: doomed.key_id.clone(),
        };
        let demote = Command::ChangeCapabilities {
            key_id: demoted.key_id.clone(),
            grant: vec![],
            revoke: vec![Capability::Read],
        };
        directory.call("t", revoke, "operator").await.unwrap();
        directory.call("t", demote, "operator").await.unwrap();
        assert!(catalog.key("t", &doomed.key_id).unwrap().revoked);
        assert_refused_reads(&read(&doomed.key_id).await, &read(&demoted.key_id).await);
        assert!(read("k").await.is_ok());
        directory.shutdown().await;
    }

    /// Under `sync` a change is answered only once the fdatasync covering it has returned: with
    /// that fdatasync held for a second and then failing, the write is not answered meanwhile and
    /// is then refused, never acknowledged. The WAL's syncer answers cell changes itself (early
    /// answers), so this holds that path to the promise; scenario D's power cut, which comes
    /// after kill -9 has let a running fdatasync finish, could miss an answer sent just before it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_write_is_answered_only_after_its_fdatasync_returns() {
        let dir = tempfile::tempdir().unwrap();
        let (catalog, config) = tenant_with_catalog(dir.path());
        let data = crate::DataDir::new(dir.path().join("data"));
        let directory = test_directory(data.clone(), &config, &catalog);
        directory.call("t", write(1, b"v"), "t/k").await.unwrap();
        cube_wal::failpoint::fail_next_fdatasync_after(
            &data.tenant_wal("t"),
            Duration::from_secs(1),
        );
        let began = Instant::now();
        let answer = directory.call("t", write(2, b"w"), "t/k").await;
        assert!(
            began.elapsed() >= Duration::from_secs(1),
            "answered {:?} into a 1-s fdatasync: {answer:?}",
            began.elapsed()
        );
        assert!(
            matches!(&answer, Err(StoreError::Unavailable(_))),
            "{answer:?}"
        );
        directory.shutdown().await;
    }

    /// A call whose own arguments are wrong (an edge label over 64 bytes, a value over the
    /// limit) is INVALID_ARGUMENT whatever state its tenant is in: here poisoned until the
    /// restart, which answered it UNAVAILABLE, as a busy tenant answered it RESOURCE_EXHAUSTED
    /// (retrying could never succeed).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_calls_own_bad_arguments_are_named_whatever_its_tenants_state() {
        let dir = tempfile::tempdir().unwrap();
        let (catalog, config) = tenant_with_catalog(dir.path());
        let data = crate::DataDir::new(dir.path().join("data"));
        let directory = test_directory(data.clone(), &config, &catalog);
        directory.call("t", write(1, b"v"), "t/k").await.unwrap();
        cube_wal::failpoint::fail_next_fdatasync(&data.tenant_wal("t"));
        let failed = directory.call("t", write(2, b"v"), "t/k").await;
        assert!(
            matches!(failed, Err(StoreError::Unavailable(_))),
            "{failed:?}"
        );
        let link = Command::Link {
            from: at(1),
            to: at(2),
            label: "x".repeat(65),
        };
        let too_big = write(3, &vec![0; config.limits.max_value + 1]);
        let never_synced = Command::SetDurability {
            policy: cube_wal::SyncPolicy::Relaxed {
                max_delay: std::time::Duration::from_secs(3600),
                max_records: 1,
            },
        };
        for (bad, by) in [
            (link, "t/k"),
            (too_big, "t/k"),
            (never_synced, crate::OPERATOR),
        ] {
            let refused = directory.call("t", bad, by).await;
            assert!(
                matches!(&refused, Err(StoreError::InvalidArgument(m)) if m.contains("bytes") || m.contains("max_delay")),
                "{refused:?}"
            );
        }
        // A well-formed change is still refused for the tenant's state.
        let refused = directory.call("t", write(3, b"v"), "t/k").await;
        assert_refused_until_restart(&refused);
        directory.shutdown().await;
    }

    /// Below `--min-free-bytes` a key's revocation is still logged, with its audit entry, like
    /// the tenant's creation entry (made through the catalog instead, it went unaudited); other
    /// changes are refused.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_revocation_is_logged_with_its_entry_on_a_nearly_full_disk() {
        let dir = tempfile::tempdir().unwrap();
        let (catalog, mut config) = tenant_with_catalog(dir.path());
        let doomed = catalog.create_key("t", false).unwrap();
        // A minimum no disk meets.
        config.space = Some(crate::SpaceGuard::new(dir.path().to_path_buf(), u64::MAX));
        let data = crate::DataDir::new(dir.path().join("data"));
        let directory = test_directory(data, &config, &catalog);
        let refused = directory.call("t", write(1, b"v"), "t/k").await;
        assert!(
            matches!(&refused, Err(StoreError::ResourceExhausted(m)) if m.contains("free")),
            "{refused:?}"
        );
        let revoke = Command::RevokeKey {
            key_id: doomed.key_id.clone(),
        };
        directory.call("t", revoke, "operator").await.unwrap();
        assert!(catalog.key("t", &doomed.key_id).unwrap().revoked);
        let trail = directory.get("t").await.unwrap().reader().audit_page(0, 10);
        let ops: Vec<String> = trail.unwrap().into_iter().map(|e| e.op).collect();
        assert_eq!(ops, ["tenant.create", "key.revoke"]);
        directory.shutdown().await;
    }

    /// The operator's commands are admitted past the tenant's caps: a key's holder keeping the
    /// tenant busy cannot get its revocation refused as busy (which the admin socket then made
    /// through the catalog, without the revocation's audit entry).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_operators_revocation_is_not_refused_as_busy() {
        let dir = tempfile::tempdir().unwrap();
        let (catalog, config) = tenant_with_catalog(dir.path());
        let doomed = catalog.create_key("t", false).unwrap();
        let data = crate::DataDir::new(dir.path().join("data"));
        let settings = crate::DirectoryConfig {
            mailbox_capacity: 4,
            ..directory_config(data.clone(), &config)
        };
        let directory =
            Arc::new(crate::TenantDirectory::new(settings, Some(Arc::clone(&catalog))).unwrap());
        directory.call("t", write(0, b"v"), "t/k").await.unwrap();
        // Writes wait 2 s behind the next fdatasync: the tenant is at capacity meanwhile.
        cube_wal::failpoint::delay_next_fdatasync(&data.tenant_wal("t"), Duration::from_secs(2));
        let principal = format!("t/{}", doomed.key_id);
        let writes: Vec<_> = (1..=4)
            .map(|x| {
                let (directory, principal) = (Arc::clone(&directory), principal.clone());
                tokio::spawn(async move { directory.call("t", write(x, b"v"), &principal).await })
            })
            .collect();
        // Polled (not slept) until the four are in flight.
        let tenant = directory.get("t").await.unwrap();
        let deadline = Instant::now() + Duration::from_millis(1500);
        while tenant.in_flight() < 4 {
            assert!(Instant::now() < deadline, "the four writes never got in");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        drop(tenant);
        let busy = directory.call("t", write(5, b"v"), &principal).await;
        assert!(
            matches!(busy, Err(StoreError::ResourceExhausted(_))),
            "{busy:?}"
        );
        assert!(
            !writes.iter().any(tokio::task::JoinHandle::is_finished),
            "the writes ended before the revocation: it did not come while the tenant was busy"
        );
        let revoke = Command::RevokeKey {
            key_id: doomed.key_id.clone(),
        };
        let revoked = directory.call("t", revoke, crate::OPERATOR).await;
        assert!(revoked.is_ok(), "{revoked:?}");
        assert!(catalog.key("t", &doomed.key_id).unwrap().revoked);
        // The writes taken before it were not harmed by it.
        for w in writes {
            assert!(w.await.unwrap().is_ok());
        }
        directory.shutdown().await;
    }

    /// A tenant's scan places outlive its passivation: pages its clients still hold keep theirs
    /// after the tenant is closed and reopened.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn scan_places_are_kept_across_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let directory = directory_of_t(dir.path());
        drop(directory.get("t").await.unwrap());
        let mut held = Vec::new();
        for _ in 0..crate::directory::SCANS_PER_TENANT {
            held.push(directory.scan_permit("t").await);
        }
        assert!(directory.close_tenant("t").await);
        drop(directory.get("t").await.unwrap());
        let wait = Duration::from_millis(300);
        assert!(
            tokio::time::timeout(wait, directory.scan_permit("t"))
                .await
                .is_err(),
            "the reopened tenant got fresh places"
        );
        held.pop();
        assert!(
            tokio::time::timeout(wait, directory.scan_permit("t"))
                .await
                .is_ok()
        );
        directory.shutdown().await;
    }

    /// A tenant whose recovery at start fails awaits recovery (its calls are not authenticated)
    /// until one of its opens succeeds.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_tenant_whose_recovery_failed_awaits_it_until_it_opens() {
        let dir = tempfile::tempdir().unwrap();
        let (catalog, config) = tenant_with_catalog(dir.path());
        let data = crate::DataDir::new(dir.path().join("data"));
        let (wal_dir, state_dir) = (data.tenant_wal("t"), data.tenant_state("t"));
        // A log left by a kill -9: a segment with a record in it.
        let mut core = TenantCore::<u32>::open("t", &wal_dir, &state_dir, &config, None)
            .unwrap()
            .0;
        assert!(core.handle(write(1, b"v"), &who(), 1).is_none());
        assert_eq!(settle(&mut core).len(), 1);
        core.take_wal().unwrap().close().unwrap();
        drop(core);
        // And a state store that cannot be opened for now.
        let aside = dir.path().join("state-aside");
        std::fs::rename(&state_dir, &aside).unwrap();
        std::fs::write(&state_dir, b"not a directory").unwrap();

        let directory = test_directory(data, &config, &catalog);
        assert!(directory.awaiting_recovery("t").is_none());
        assert_eq!(directory.recover_unclosed(["t".to_string()]).await, (0, 1));
        assert!(matches!(
            directory.awaiting_recovery("t"),
            Some(StoreError::Unavailable(m)) if m.contains("state store")
        ));
        assert!(directory.awaiting_recovery("u").is_none());
        assert!(directory.get("t").await.is_err());
        assert!(
            directory.awaiting_recovery("t").is_some(),
            "a failed open changes nothing"
        );

        std::fs::remove_file(&state_dir).unwrap();
        std::fs::rename(&aside, &state_dir).unwrap();
        // The failed open is forgotten 1 s after it failed.
        tokio::time::sleep(Duration::from_millis(1100)).await;
        assert_eq!(directory.close_failed().await, 1);
        directory.get("t").await.unwrap();
        assert!(directory.awaiting_recovery("t").is_none());
        directory.shutdown().await;
    }

    #[test]
    fn a_key_revocation_is_logged_applied_to_the_catalog_and_replayed_after_a_crash() {
        let dir = tempfile::tempdir().unwrap();
        let catalog = Arc::new(Catalog::open(&dir.path().join("catalog")).unwrap());
        let first = catalog.create_tenant("t").unwrap();
        let second = catalog.create_key("t", false).unwrap();
        let config = CoreConfig {
            catalog: Some(Arc::clone(&catalog)),
            ..config()
        };
        // A copy of the catalog as its files are before the revocation.
        snapshot_catalog(&catalog, dir.path());

        let revoked = |c: &Catalog| c.key("t", &second.key_id).unwrap().revoked;
        let revoke = |id: &str| Command::RevokeKey { key_id: id.into() };
        let mut core = open(dir.path(), &config);
        assert!(core.handle(revoke(&second.key_id), &who(), 1).is_none());
        // Logged, not durable: not in force, but the key takes no other change meanwhile. The
        // answers that rest on the pending revocation (the key is gone; it was revoked already)
        // go out only once it is durable, after its own.
        assert!(!revoked(&catalog));
        assert!(
            core.handle(caps(&second.key_id, &[Capability::Admin], &[]), &who(), 2)
                .is_none()
        );
        assert!(core.handle(revoke(&second.key_id), &who(), 3).is_none());
        let answers = settle(&mut core);
        assert!(
            matches!(
                &answers[..],
                [
                    (
                        1,
                        Ok(Reply::KeyRevoked {
                            revoked: true,
                            seq: 1
                        })
                    ),
                    (2, Err(StoreError::NotFound(_))),
                    (
                        3,
                        Ok(Reply::KeyRevoked {
                            revoked: false,
                            seq: 0
                        })
                    )
                ]
            ),
            "{answers:?}"
        );
        assert!(revoked(&catalog));
        assert!(!catalog.key("t", &first.key_id).unwrap().revoked);
        let trail = core.state().reader().audit_page(1, 10).unwrap();
        assert_eq!(trail.len(), 1);
        assert_eq!(
            (trail[0].op.as_str(), trail[0].detail.clone()),
            ("key.revoke", format!("key={}", second.key_id))
        );
        assert!(matches!(
            core.handle(revoke("k-nope"), &who(), 4),
            Some((4, Err(StoreError::NotFound(_))))
        ));

        // A crash: the log survives; opened with the copy (whose files never saw the
        // revocation), the replay revokes the key there too.
        core.take_wal().unwrap().close().unwrap();
        drop(core);
        let copy = Arc::new(Catalog::open(&dir.path().join(SNAPSHOT)).unwrap());
        assert!(!revoked(&copy));
        let with_copy = CoreConfig {
            catalog: Some(Arc::clone(&copy)),
            ..config.clone()
        };
        let core = open(dir.path(), &with_copy);
        assert!(revoked(&copy), "replay revokes the key");
        drop(core);
    }

    #[test]
    fn a_key_creation_is_logged_applied_to_the_catalog_and_replayed_after_a_crash() {
        let dir = tempfile::tempdir().unwrap();
        let (catalog, config) = tenant_with_catalog(dir.path());

        let mut core = open(dir.path(), &config);
        assert!(
            core.handle(Command::CreateKey { admin: false }, &who(), 1)
                .is_none()
        );
        let answers = settle(&mut core);
        let [
            (
                1,
                Ok(Reply::KeyCreated {
                    key_id,
                    secret,
                    capabilities,
                    seq: 1,
                }),
            ),
        ] = answers.as_slice()
        else {
            panic!("{answers:?}")
        };
        assert_eq!(capabilities, &vec![Capability::Read, Capability::Write]);
        let key = catalog.key("t", key_id).expect("usable once answered");
        assert_eq!(cube_auth::Secret::from_bytes(key.secret), *secret);
        let trail = core.state().reader().audit_page(1, 10).unwrap();
        assert_eq!(
            (trail[0].op.as_str(), trail[0].detail.clone()),
            ("key.create", format!("key={key_id}"))
        );
        core.take_wal().unwrap().close().unwrap();
        drop(core);

        // A crash: the copy's files never saw the key; the replay adds it, secret and all.
        let copy = Arc::new(Catalog::open(&dir.path().join(SNAPSHOT)).unwrap());
        assert!(copy.key("t", key_id).is_none());
        let with_copy = CoreConfig {
            catalog: Some(Arc::clone(&copy)),
            ..config.clone()
        };
        let core = open(dir.path(), &with_copy);
        assert_eq!(copy.key("t", key_id).as_deref(), Some(&*key));
        drop(core);
        // Without the tenant in the catalog, nothing is logged.
        let mut other = TenantCore::<u32>::open(
            "u",
            &dir.path().join("u-wal"),
            &dir.path().join("u-state"),
            &config,
            None,
        )
        .unwrap()
        .0;
        assert!(matches!(
            other.handle(Command::CreateKey { admin: false }, &who(), 2),
            Some((2, Err(StoreError::NotFound(_))))
        ));
    }

    /// A crash once everything appended is durable: the log is neither closed nor checkpointed,
    /// and whatever was not applied stays unapplied; then the tenant's open and its report.
    fn crash_and_reopen(
        mut core: TenantCore<u32>,
        dir: &Path,
        config: &CoreConfig,
    ) -> (TenantCore<u32>, cube_wal::RecoveryReport) {
        let wal = core.take_wal().unwrap();
        wal.wait_durable(wal.next_seq() - 1).unwrap();
        std::mem::forget(wal);
        drop(core);
        TenantCore::open("t", &dir.join("wal"), &dir.join("state"), config, None).unwrap()
    }

    /// 40 MiB of durable, never applied writes come back whole from a replay that applies them
    /// in batches bounded by bytes (`REPLAY_BATCH_BYTES`), not in one batch of every record.
    #[test]
    fn a_log_of_large_values_is_replayed_whole_in_batches_bounded_by_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let config = CoreConfig::default();
        let mut core = open(dir.path(), &config);
        let value = |i: i32| vec![i as u8; 1 << 20];
        for i in 0..40 {
            assert!(core.handle(write(i, &value(i)), &who(), i as u32).is_none());
        }
        // The crash: every record durable, none applied.
        let (core, report) = crash_and_reopen(core, dir.path(), &config);
        assert_eq!(report.records_replayed, 40);
        for i in 0..40 {
            let cell = core.state().read(&at(i)).unwrap().unwrap();
            assert!(cell.value == value(i), "cell {i}");
        }
    }

    /// A core in `dir` with 40 cells of [`SEGMENTED_VALUE`] written and durable, over several
    /// sealed segments; and their number.
    fn core_over_several_segments(dir: &Path, config: &CoreConfig) -> (TenantCore<u32>, usize) {
        let mut core = open(dir, config);
        for i in 0..40 {
            assert!(
                core.handle(write(i, &SEGMENTED_VALUE), &who(), i as u32)
                    .is_none()
            );
        }
        assert_eq!(settle(&mut core).len(), 40);
        let segments = core.wal.as_ref().unwrap().segment_count();
        assert!(segments > 3, "{segments} segments");
        (core, segments)
    }

    const SEGMENTED_VALUE: [u8; 500] = [7; 500];

    #[test]
    fn checkpoint_deletes_covered_segments_and_recovery_replays_only_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let config = config();
        let (mut core, segments_before) = core_over_several_segments(dir.path(), &config);
        let value = SEGMENTED_VALUE.to_vec();
        let job = core.begin_checkpoint().unwrap();
        assert_eq!(job.seq, 40);
        let r = job.run();
        core.finish_checkpoint(40, r);
        assert_eq!(core.stats().checkpoint_seq.load(Ordering::Relaxed), 40);
        let segments_after = core.wal.as_ref().unwrap().segment_count();
        assert!(
            segments_after < segments_before,
            "{segments_after} >= {segments_before}"
        );
        // Ten more after the checkpoint, then a crash: the WAL is not closed cleanly and the
        // state store is not flushed again.
        for i in 40..50 {
            assert!(core.handle(write(i, &value), &who(), i as u32).is_none());
        }
        assert_eq!(settle(&mut core).len(), 10);
        let (core, report) = crash_and_reopen(core, dir.path(), &config);
        // Only what the checkpoint did not cover is replayed (the store may have persisted some
        // of it on its own; never less than nothing, never more than the ten).
        assert!(report.records_replayed <= 10, "{report:?}");
        let reader = core.state().reader();
        for i in 0..50 {
            assert_eq!(
                reader.read(&at(i)).unwrap().unwrap().value,
                value,
                "cell {i}"
            );
        }
        assert_eq!(core.state().totals().cells, 50);
    }

    /// A checkpoint whose directory fsync after deleting the covered segments fails poisons
    /// the tenant (a failed fsync is never retried), and nothing acknowledged is lost: the
    /// state store holds what the deleted segments did.
    #[test]
    fn a_failed_directory_fsync_after_deleting_segments_poisons_the_tenant() {
        let dir = tempfile::tempdir().unwrap();
        let config = config();
        let (mut core, segments_before) = core_over_several_segments(dir.path(), &config);
        let value = SEGMENTED_VALUE.to_vec();
        cube_wal::failpoint::fail_next_dir_sync_after_delete(&dir.path().join("wal"));
        let job = core.begin_checkpoint().unwrap();
        let r = job.run();
        assert!(r.is_err());
        core.finish_checkpoint(40, r);
        assert!(core.is_poisoned());
        assert!(core.wal.as_ref().unwrap().segment_count() < segments_before);
        let refused = core.handle(write(41, &value), &who(), 41);
        assert!(matches!(refused, Some((41, Err(_)))), "{refused:?}");
        let (core, _) = crash_and_reopen(core, dir.path(), &config);
        let reader = core.state().reader();
        for i in 0..40 {
            assert_eq!(
                reader.read(&at(i)).unwrap().unwrap().value,
                value,
                "cell {i}"
            );
        }
    }

    /// A failed fsync while a closing tenant's checkpointed log is removed poisons it for good,
    /// as a failed checkpoint does; nothing acknowledged is lost.
    #[test]
    fn a_failed_directory_fsync_while_removing_the_log_at_close_poisons_the_tenant() {
        let dir = tempfile::tempdir().unwrap();
        let config = config();
        let mut core = open(dir.path(), &config);
        for i in 0..5 {
            assert!(core.handle(write(i, b"v"), &who(), i as u32).is_none());
        }
        assert_eq!(settle(&mut core).len(), 5);
        cube_wal::failpoint::fail_next_dir_sync_after_delete(&dir.path().join("wal"));
        core.close_here().unwrap();
        assert!(core.is_poisoned());
        assert!(!core.stats.reopenable.load(Ordering::Relaxed));
        drop(core);
        let core = open(dir.path(), &config);
        let reader = core.state().reader();
        for i in 0..5 {
            assert_eq!(
                reader.read(&at(i)).unwrap().unwrap().value,
                b"v",
                "cell {i}"
            );
        }
    }

    /// A tenant switched from relaxed back to `sync` stops acknowledging before fdatasync from
    /// the switch on, before any reopen (a busy tenant is never idle long enough to be closed
    /// and reopened under its new policy), and its log is synced at once, not at the old
    /// policy's deadline.
    #[test]
    fn a_switch_back_to_sync_holds_before_the_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let (_catalog, mut config) = tenant_with_catalog(dir.path());
        config.wal.sync = SyncPolicy::Relaxed {
            max_delay: Duration::from_secs(10),
            max_records: 1000,
        };
        let mut core = open(dir.path(), &config);
        assert!(
            matches!(core.handle(write(1, b"a"), &who(), 1), Some((1, Ok(_)))),
            "relaxed: acknowledged before its fdatasync"
        );
        let set = Command::SetDurability {
            policy: SyncPolicy::Always,
        };
        assert!(core.handle(set, &who(), 2).is_none());
        let after = core.handle(write(1, b"b"), &who(), 3);
        assert!(
            after.is_none(),
            "acknowledged before its fdatasync after the switch to sync: {after:?}"
        );
        let started = Instant::now();
        let answers = settle(&mut core);
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "synced only at the relaxed deadline ({:?})",
            started.elapsed()
        );
        let tokens: Vec<(u32, bool)> = answers.iter().map(|(t, r)| (*t, r.is_ok())).collect();
        assert_eq!(tokens, vec![(2, true), (3, true)], "{answers:?}");
        // With nothing waiting any more, the old window would take the next write at once.
        let later = core.handle(write(1, b"c"), &who(), 4);
        assert!(
            later.is_none(),
            "acknowledged before its fdatasync after the switch to sync: {later:?}"
        );
        let answers = settle(&mut core);
        assert!(matches!(answers.as_slice(), [(4, Ok(_))]), "{answers:?}");
        assert_eq!(
            core.policy(),
            config.wal.sync,
            "the log's own policy until the reopen"
        );
        // What Tenant.Stats shows is the policy in force.
        assert_eq!(core.stats().narrowed_policy().as_deref(), Some("sync"));
    }

    #[test]
    fn relaxed_policy_acks_inside_the_window_and_waits_beyond_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = config();
        config.wal.sync = SyncPolicy::Relaxed {
            max_delay: Duration::from_secs(3600),
            max_records: 3,
        };
        let mut core = open(dir.path(), &config);
        for i in 1..=3u32 {
            let (token, reply) = core.handle(write(1, b"v"), &who(), i).unwrap();
            assert_eq!(token, i);
            assert!(matches!(reply, Ok(Reply::Written { seq, .. }) if seq == u64::from(i)));
        }
        // Read-your-writes holds before the fsync.
        assert_eq!(
            core.state().reader().read(&at(1)).unwrap().unwrap().version,
            3
        );
        // The fourth would widen the loss window beyond 3 records: it waits for the sync that
        // max_records = 3 triggers (the hour-long delay never would).
        assert!(core.handle(write(1, b"v"), &who(), 4).is_none());
        core.wal.as_ref().unwrap().wait_durable(3).unwrap();
        let answers = core.on_durable(DurableEvent::Durable(3));
        assert_eq!(answers.len(), 1);
        assert!(matches!(answers[0], (4, Ok(Reply::Written { seq: 4, .. }))));
        assert_eq!(core.policy(), config.wal.sync);
        assert_eq!(
            describe_policy(&config.wal.sync),
            "relaxed(max_delay_ms=3600000, max_records=3)"
        );
    }

    /// The relaxed window is bounded in bytes too: a change that would take the log's unsynced
    /// bytes past `max_unsynced_bytes` waits for its fdatasync (which the bound triggers at
    /// once), however many records and however long the policy allows.
    #[test]
    fn relaxed_policy_acks_no_more_unsynced_bytes_than_its_bound() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = config();
        config.wal.sync = SyncPolicy::Relaxed {
            max_delay: Duration::from_secs(3600),
            max_records: 1000,
        };
        config.wal.max_unsynced_bytes = 4096;
        let mut core = open(dir.path(), &config);
        let value = vec![5u8; 1100];
        for i in 1..=3u32 {
            let answer = core.handle(write(1, &value), &who(), i);
            assert!(
                matches!(answer, Some((t, Ok(Reply::Written { .. }))) if t == i),
                "{answer:?}"
            );
        }
        let wal = core.wal.as_ref().unwrap();
        assert_eq!(wal.durable_seq(), 0);
        assert!(wal.unsynced_bytes() <= 4096);
        // A fourth would hold more than 4096 bytes acknowledged and unsynced: it waits.
        assert!(core.handle(write(1, &value), &who(), 4).is_none());
        let deadline = Instant::now() + Duration::from_secs(30);
        while core.wal.as_ref().unwrap().durable_seq() < 4 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
        }
        assert_eq!(
            core.wal.as_ref().unwrap().durable_seq(),
            4,
            "the bound did not sync"
        );
        let answers = core.on_durable(DurableEvent::Durable(4));
        assert!(
            matches!(answers.as_slice(), [(4, Ok(Reply::Written { seq: 4, .. }))]),
            "{answers:?}"
        );
        // Synced, the window is open again.
        assert!(matches!(
            core.handle(write(1, &value), &who(), 5),
            Some((5, Ok(_)))
        ));
    }

    /// The relaxed window is bounded in time at the acknowledgement too: once the oldest
    /// change acknowledged before its fdatasync is older than 2 x `max_delay` and still not
    /// reported durable (a held-up syncer), changes wait for their fdatasync as under `sync`.
    #[test]
    fn relaxed_policy_stops_acknowledging_early_past_its_delay() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = config();
        config.wal.sync = SyncPolicy::Relaxed {
            max_delay: Duration::from_millis(200),
            max_records: 1000,
        };
        let mut core = open(dir.path(), &config);
        assert!(matches!(
            core.handle(write(1, b"a"), &who(), 1),
            Some((1, Ok(_)))
        ));
        assert!(matches!(
            core.handle(write(2, b"b"), &who(), 2),
            Some((2, Ok(_)))
        ));
        // No durable report reaches the core (as while its syncer is held up) for longer than
        // twice the delay.
        std::thread::sleep(Duration::from_millis(450));
        let late = core.handle(write(3, b"c"), &who(), 3);
        assert!(late.is_none(), "acknowledged past the delay: {late:?}");
        let deadline = Instant::now() + Duration::from_secs(30);
        while core.wal.as_ref().unwrap().durable_seq() < 3 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
        }
        let answers = core.on_durable(DurableEvent::Durable(3));
        assert!(matches!(answers.as_slice(), [(3, Ok(_))]), "{answers:?}");
        // Synced, changes are acknowledged early again.
        assert!(matches!(
            core.handle(write(4, b"d"), &who(), 4),
            Some((4, Ok(_)))
        ));
        assert_eq!(core.early_acked.len(), 1);
        // A durable report that does not reach the oldest early acknowledgement releases no
        // waiting change past its fdatasync once the delay is passed, and a change it does
        // release early counts as acknowledged early (the report path held no time bound).
        std::thread::sleep(Duration::from_millis(450));
        assert!(core.handle(write(5, b"e"), &who(), 5).is_none());
        assert!(core.on_durable(DurableEvent::Durable(3)).is_empty());
        let answers = core.on_durable(DurableEvent::Durable(4));
        assert!(matches!(answers.as_slice(), [(5, Ok(_))]), "{answers:?}");
        assert_eq!(core.early_acked.len(), 1, "{:?}", core.early_acked);
        std::thread::sleep(Duration::from_millis(450));
        assert!(core.handle(write(6, b"f"), &who(), 6).is_none());
    }

    /// An answer that rests on a change still waiting for its fsync goes out only after that
    /// change, and fails with it: a second Seal of a cell is not told "sealed" while the first
    /// Seal could still be lost.
    #[test]
    fn an_answer_resting_on_a_pending_change_waits_for_it() {
        let seal = || Command::Seal { coord: at(1) };
        for fails in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let mut core = open(dir.path(), &config());
            assert!(core.handle(write(1, b"a"), &who(), 1).is_none());
            assert_eq!(settle(&mut core).len(), 1);
            assert!(core.handle(seal(), &who(), 2).is_none());
            let second = core.handle(seal(), &who(), 3);
            assert!(
                second.is_none(),
                "answered before the first seal is durable: {second:?}"
            );
            let answers = if fails {
                core.on_durable(DurableEvent::WriteFailed { no_space: false })
            } else {
                settle(&mut core)
            };
            let tokens: Vec<(u32, bool)> = answers.iter().map(|(t, r)| (*t, r.is_ok())).collect();
            assert_eq!(tokens, vec![(2, !fails), (3, !fails)], "{answers:?}");
        }
    }

    /// A state store whose next apply fails once (a stalled flush, say), then works again.
    #[derive(Debug)]
    struct FailsOnce {
        inner: Arc<dyn crate::backend::StateBackend>,
        armed: std::sync::atomic::AtomicBool,
    }

    impl crate::backend::StateRead for FailsOnce {
        fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, crate::backend::BackendError> {
            self.inner.get(key)
        }
        fn range(&self, start: &[u8], end: &[u8]) -> crate::backend::RangeIter<'_> {
            self.inner.range(start, end)
        }
        fn get_lt(
            &self,
            key: &[u8],
        ) -> Result<Option<(Vec<u8>, Vec<u8>)>, crate::backend::BackendError> {
            self.inner.get_lt(key)
        }
    }

    impl crate::backend::StateBackend for FailsOnce {
        fn apply(
            &self,
            batch: Vec<crate::backend::BatchOp>,
        ) -> Result<(), crate::backend::BackendError> {
            if self.armed.swap(false, Ordering::SeqCst) {
                return Err(crate::backend::BackendError(
                    "injected apply failure".into(),
                ));
            }
            self.inner.apply(batch)
        }
        fn flush(&self) -> Result<(), crate::backend::BackendError> {
            self.inner.flush()
        }
        fn size_on_disk(&self) -> u64 {
            0
        }
    }

    /// After a group fails to apply, nothing behind it is applied on top of the gap: every
    /// caller still waiting gets the error, also those whose records become durable later.
    #[test]
    fn after_a_failed_apply_no_later_change_is_applied_over_the_gap() {
        let dir = tempfile::tempdir().unwrap();
        let mut core = open(dir.path(), &config());
        let failing = Arc::new(FailsOnce {
            inner: core.state.backend(),
            armed: std::sync::atomic::AtomicBool::new(true),
        });
        core.state = TenantState::open(failing, StateLimits::default()).unwrap();
        assert!(core.handle(write(1, b"a"), &who(), 1).is_none());
        assert!(core.handle(write(2, b"b"), &who(), 2).is_none());
        // The report of the first record only: its apply fails, and the second change, still
        // waiting for its own fsync, is failed with it.
        let answers = core.on_durable(DurableEvent::Durable(1));
        assert!(
            matches!(
                &answers[..],
                [
                    (1, Err(StoreError::Unavailable(_))),
                    (2, Err(StoreError::Unavailable(_)))
                ]
            ),
            "{answers:?}"
        );
        // Both changes are in the log: their callers are told the outcome is unknown.
        for (_, answer) in &answers {
            let Err(e) = answer else { unreachable!() };
            assert!(e.to_string().contains("outcome is unknown"), "{e}");
        }
        core.wal.as_ref().unwrap().wait_durable(2).unwrap();
        let later = core.on_durable(DurableEvent::Durable(2));
        assert!(later.is_empty(), "applied over the gap: {later:?}");
        assert_eq!(core.state().applied_seq(), 0);
        // A change refused at the door was never logged: no such hedge.
        let refused = core.handle(write(3, b"c"), &who(), 3);
        let Some((_, Err(e))) = refused else {
            panic!("{refused:?}")
        };
        assert!(!e.to_string().contains("outcome is unknown"), "{e}");
        // And indeed the reopen applies both failed changes from the log.
        core.take_wal().unwrap().close().unwrap();
        drop(core);
        let core = open(dir.path(), &config());
        let reader = core.state().reader();
        assert_eq!(reader.read(&at(1)).unwrap().unwrap().value, b"a");
        assert_eq!(reader.read(&at(2)).unwrap().unwrap().value, b"b");
        assert_eq!(reader.read(&at(3)).unwrap(), None);
    }

    /// A relaxed tenant's change applied before its fsync, whose apply fails, is in the log:
    /// its caller is told the outcome is unknown, and the reopen indeed applies it.
    #[test]
    fn a_relaxed_change_whose_early_apply_fails_is_reported_as_unknown() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = config();
        config.wal.sync = SyncPolicy::Relaxed {
            max_delay: Duration::from_secs(3600),
            max_records: 3,
        };
        let mut core = open(dir.path(), &config);
        let failing = Arc::new(FailsOnce {
            inner: core.state.backend(),
            armed: std::sync::atomic::AtomicBool::new(true),
        });
        core.state = TenantState::open(failing, StateLimits::default()).unwrap();
        let answer = core.handle(write(1, b"a"), &who(), 1);
        let Some((1, Err(e))) = answer else {
            panic!("{answer:?}")
        };
        assert!(e.to_string().contains("outcome is unknown"), "{e}");
        core.take_wal().unwrap().close().unwrap();
        drop(core);
        let core = open(dir.path(), &config);
        assert_eq!(
            core.state().reader().read(&at(1)).unwrap().unwrap().value,
            b"a"
        );
    }

    /// Under a relaxed policy a catalog change still waits for its own fdatasync, and the
    /// changes after it wait behind it: a report that covers only what came before it does not
    /// release it, however wide the window.
    #[test]
    fn a_relaxed_tenants_catalog_change_waits_for_its_own_fsync() {
        let dir = tempfile::tempdir().unwrap();
        let (catalog, mut config) = tenant_with_catalog(dir.path());
        config.wal.sync = SyncPolicy::Relaxed {
            max_delay: Duration::from_millis(20),
            max_records: 1000,
        };
        let mut core = open(dir.path(), &config);
        assert!(matches!(
            core.handle(write(1, b"a"), &who(), 1),
            Some((1, Ok(_)))
        ));
        let policy = SyncPolicy::Relaxed {
            max_delay: Duration::from_millis(5),
            max_records: 10,
        };
        assert!(
            core.handle(Command::SetDurability { policy }, &who(), 2)
                .is_none()
        );
        assert!(core.handle(write(2, b"b"), &who(), 3).is_none());
        // The syncer's report of the first write only.
        let early = core.on_durable(DurableEvent::Durable(1));
        assert!(early.is_empty(), "answered before its fdatasync: {early:?}");
        assert_eq!(catalog.durability("t").unwrap(), SyncPolicy::Always);
        let tokens: Vec<u32> = settle(&mut core).into_iter().map(|(t, _)| t).collect();
        assert_eq!(tokens, vec![2, 3]);
        assert_eq!(catalog.durability("t").unwrap(), policy);
    }

    /// A certificate's `key.cert` entry is logged for an active key only (not one whose
    /// revocation is logged and not yet applied, nor an unknown one), and a relaxed tenant
    /// answers it only after its own fdatasync: the certificate is written out on that answer.
    #[test]
    fn a_certificate_is_recorded_for_an_active_key_and_answered_once_durable() {
        let dir = tempfile::tempdir().unwrap();
        let (catalog, mut config) = tenant_with_catalog(dir.path());
        config.wal.sync = SyncPolicy::Relaxed {
            max_delay: Duration::from_millis(20),
            max_records: 1000,
        };
        let mut core = open(dir.path(), &config);
        let key_id = catalog.active_key_ids("t")[0].clone();
        let operator = Caller {
            principal: crate::OPERATOR.into(),
            ts_ms: 1,
        };
        let cert = |key_id: &str| Command::RecordCertificate {
            key_id: key_id.into(),
            sha256: [7; 32],
            not_after_ms: 1_800_000_000_000,
        };
        // Under the relaxed policy a write is answered at once, the entry only once durable.
        assert!(matches!(
            core.handle(write(1, b"a"), &who(), 1),
            Some((1, Ok(_)))
        ));
        assert!(core.handle(cert(&key_id), &operator, 2).is_none());
        let early = core.on_durable(DurableEvent::Durable(1));
        assert!(early.is_empty(), "answered before its fdatasync: {early:?}");
        let answers = settle(&mut core);
        assert!(
            matches!(&answers[..], [(2, Ok(Reply::Recorded { .. }))]),
            "{answers:?}"
        );
        // The key's revocation logged, not yet applied: the key is no longer active.
        let revoke = Command::RevokeKey {
            key_id: key_id.clone(),
        };
        assert!(core.handle(revoke, &operator, 3).is_none());
        let mut answers: Vec<_> = [(4, key_id.as_str()), (5, "k-nope")]
            .into_iter()
            .filter_map(|(token, id)| core.handle(cert(id), &operator, token))
            .collect();
        answers.extend(settle(&mut core));
        answers.sort_by_key(|(token, _)| *token);
        assert_eq!(answers.len(), 3, "{answers:?}");
        assert!(matches!(answers[0], (3, Ok(Reply::KeyRevoked { .. }))));
        for (token, id) in [(4, &key_id), (5, &"k-nope".to_string())] {
            match &answers[token as usize - 3] {
                (t, Err(StoreError::NotFound(m))) if *t == token => {
                    assert_eq!(m, &format!("tenant 't' has no active key '{id}'"));
                }
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn poisoned_shard_fails_waiting_writers_and_refuses_new_ones() {
        let dir = tempfile::tempdir().unwrap();
        let mut core = open(dir.path(), &config());
        assert!(core.handle(write(1, b"a"), &who(), 1).is_none());
        let answers = core.on_durable(DurableEvent::Poisoned);
        assert!(matches!(
            &answers[..],
            [(1, Err(StoreError::Unavailable(_)))]
        ));
        assert!(matches!(
            core.handle(write(1, b"b"), &who(), 2),
            Some((2, Err(StoreError::Unavailable(_))))
        ));
        assert!(core.begin_checkpoint().is_none());
    }
}
