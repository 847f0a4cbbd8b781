//! The tenant directory: tenant name -> running actor, started on first use, passivated when
//! idle or when the open-tenant cap needs room.
//!
//! Opening a tenant (state store + WAL recovery) runs on the blocking pool; concurrent first
//! calls share one open. A tenant that fails to open (corrupt WAL) answers with a clear error
//! while every other tenant keeps serving; its next call tries again after 1 s, doubling with
//! each consecutive failure up to 30 s. One whose log failed an fdatasync stays failed until
//! the server restarts.
//!
//! Passivation closes a tenant (final fsync and checkpoint, files closed, memory freed); its
//! next call opens it again. A tenant is only passivated with no request in flight: the handle's
//! `retired` flag and in-flight counter form a handshake (both sides write one, then read the
//! other, SeqCst), so a caller either sees the retirement and retries on a fresh open, or the
//! passivator sees the caller and leaves the tenant alone.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock, Weak};
use std::time::{Duration, Instant};

use actix::{Actor, Addr};
use cube_wal::DurableEvent;
use tokio::sync::{oneshot, watch};

use crate::StoreError;
use crate::actor::{Call, Durable, InFlightPermit, Responder, Shutdown, TenantActor};
use crate::catalog::{Capability, Catalog};
use crate::core::{CoreConfig, EarlyAnswers, Lag, SharedStats, TenantCore, describe_policy};
use crate::layout::DataDir;
use crate::runtime::ActorRuntime;
use crate::state::{Caller, Command, Reply, StateReader};

/// Settings every tenant shares.
#[derive(Debug, Clone)]
pub struct DirectoryConfig {
    pub data_dir: DataDir,
    /// WAL, limits, checkpoints and cache of each tenant (the WAL's sync policy comes from the
    /// tenant's catalog entry).
    pub core: CoreConfig,
    /// Requests one tenant may have queued or waiting for durability before further callers get
    /// RESOURCE_EXHAUSTED at once.
    pub mailbox_capacity: usize,
    /// Bytes of values (programs, inputs...) one tenant's requests may hold in flight, counted
    /// like `mailbox_capacity`; beyond it RESOURCE_EXHAUSTED. A request is always admitted when
    /// the tenant holds none, so one value larger than this still goes through.
    pub max_in_flight_bytes: usize,
    /// Threads that run tenant actors.
    pub actor_threads: usize,
    /// A tenant with no call for this long is passivated.
    pub idle_after: Duration,
    /// At most this many tenants open at once; opening one more passivates the least recently
    /// used idle one.
    pub max_open: usize,
}

/// A tenant's stats as `Tenant.Stats` reports them (besides the state's own totals).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogStats {
    pub wal_bytes: u64,
    pub last_seq: u64,
    pub checkpoint_seq: u64,
    pub durability: String,
    /// The tenant's storage quota in bytes (0: none).
    pub quota_bytes: u64,
}

/// How a caller reaches one tenant.
#[derive(Clone, Debug)]
pub struct TenantHandle {
    tenant: Arc<str>,
    addr: Addr<TenantActor>,
    mailbox_capacity: usize,
    max_in_flight_bytes: usize,
    /// Requests admitted and not yet answered (queued in the mailbox or waiting for fsync).
    in_flight: Arc<AtomicUsize>,
    /// What those requests carry ([`Command::payload_bytes`]).
    in_flight_bytes: Arc<AtomicUsize>,
    /// Set when the tenant is being passivated: callers must reopen it.
    retired: Arc<AtomicBool>,
    reader: StateReader,
    stats: Arc<SharedStats>,
    durability: Arc<str>,
    /// Set by the WAL syncer's report itself (not by the actor, which may be gone) when an
    /// fdatasync of the tenant's log failed: such a tenant is never reopened before a restart.
    wal_failed: Arc<AtomicBool>,
    /// The answers the syncer sends itself (see [`EarlyAnswers`]).
    early: Arc<EarlyAnswers<Responder>>,
    /// The keys' rights as they are now, checked again by reads ([`TenantHandle::check_rights`]).
    catalog: Option<Arc<Catalog>>,
    /// Largest value or program ([`crate::StateLimits::max_value`]), checked before admission.
    max_value: usize,
    /// The tenant's storage quota ([`crate::StateLimits::max_bytes`]), for `Tenant.Stats`.
    max_bytes: u64,
}

/// Scans of one tenant running (or holding a built page for its client) at once; more wait.
/// Bounds what one tenant's readers hold in memory (a Region page is up to 4 MiB, kept until it
/// is sent, or until its client has read nothing of it for `--page-read-secs`) and take from the
/// blocking pool that every tenant shares, whatever its client does: a client that opens many
/// streams and reads none only delays its own tenant, and only for that long.
pub const SCANS_PER_TENANT: usize = 32;

/// Longest a read waits for the applied state to hold what the WAL syncer acknowledged
/// ([`TenantHandle::caught_up`]); beyond it UNAVAILABLE. Only a state store stalled on its
/// flushes (fjall holds writes for up to 30 s then) makes it wait that long.
const READ_PATIENCE: Duration = Duration::from_secs(5);

impl TenantHandle {
    /// Send `cmd` and wait for the answer (for changes: until applied, with their audit entry).
    /// Reads are answered from the applied state on the caller's thread. `Err(cmd)` hands the
    /// command back when the tenant is being passivated.
    async fn try_call(
        &self,
        cmd: Command,
        principal: &str,
    ) -> Result<Result<Reply, StoreError>, Command> {
        if let Command::Read { coord } = &cmd {
            // Answered here, not by the core: so checked here against what the core has logged.
            if let Some(key_id) = crate::core::key_of(&self.tenant, principal)
                && let Err(e) = self.check_rights(key_id, Capability::Read)
            {
                return Ok(Err(e));
            }
            if let Err(e) = self.caught_up().await {
                return Ok(Err(e));
            }
            return Ok(self.reader.read(coord).map(Reply::Read));
        }
        if let Err(e) = cmd.check_arguments(self.max_value) {
            return Ok(Err(e));
        }
        // The operator's commands are never refused as busy: a key's holder keeping its tenant
        // at capacity must not be able to delay the key's revocation (or push it off the log,
        // which would leave it without its audit entry).
        let permit = match self.admit(cmd.payload_bytes(), principal != OPERATOR) {
            Ok(p) => p,
            Err(e) => return Ok(Err(e)),
        };
        if self.retired.load(Ordering::SeqCst) {
            return Err(cmd);
        }
        let (tx, rx) = oneshot::channel();
        let caller = Caller {
            principal: principal.to_string(),
            ts_ms: now_ms(),
        };
        // A stopped actor drops the message, and with it the responder: `rx` then errors.
        self.addr.do_send(Call {
            sent: std::time::Instant::now(),
            cmd,
            caller,
            reply: Responder { tx, permit },
        });
        Ok(rx.await.unwrap_or_else(|_| {
            Err(if self.stats.stopping.load(Ordering::SeqCst) {
                stopped()
            } else if self.may_reopen() {
                crashed(&self.tenant)
            } else {
                crashed_for_good(&self.tenant)
            })
        }))
    }

    /// Whether closing and reopening the tenant from disk is safe: not after a failed fsync of
    /// its log (a reopen would read back pages whose fsync failed as if they were durable).
    fn may_reopen(&self) -> bool {
        // `poisoned` first (Acquire): its cause is published before it.
        let poisoned_for_good = self.stats.poisoned.load(Ordering::Acquire)
            && !self.stats.reopenable.load(Ordering::Relaxed);
        let fsync_failed = self.wal_failed.load(Ordering::SeqCst);
        !(poisoned_for_good || fsync_failed)
    }

    /// The actor is gone without having been told to stop: one of its handlers panicked (a
    /// bug), and the task running it was dropped, its log closed with it. Every later call
    /// would fail; the janitor closes such a tenant so that its next call reopens it from disk
    /// ([`TenantDirectory::close_failed`]). Callers may see their replies dropped a moment
    /// before this is true: actix drops the actor (its core, whose log closes, and the replies
    /// it holds) before the mailbox, and only the mailbox's drop disconnects the address. So
    /// when this is true the old log is closed, and a reopen cannot race it.
    pub(crate) fn crashed(&self) -> bool {
        !self.addr.connected() && !self.stats.stopping.load(Ordering::SeqCst)
    }

    /// Make the actor panic (tests of what the directory does then), after a failed fsync of
    /// its log if `after_failed_fsync`.
    #[cfg(test)]
    pub(crate) fn crash_for_test(&self, after_failed_fsync: bool) {
        if after_failed_fsync {
            self.wal_failed.store(true, Ordering::SeqCst);
        }
        self.addr.do_send(crate::actor::Crash);
    }

    /// Wait until the applied state holds every change the syncer has answered (see
    /// [`EarlyAnswers`]): a caller that saw its write acknowledged then reads it back. There is
    /// nothing to wait for unless the actor is still applying a group the syncer answered.
    pub async fn caught_up(&self) -> Result<(), StoreError> {
        let need = self.early.answered();
        let lag = match self
            .stats
            .applied_through(need, || self.crashed(), READ_PATIENCE)
            .await
        {
            Ok(()) => return Ok(()),
            Err(lag) => lag,
        };
        // Acknowledged and durable (in the log), but not in the state this tenant serves.
        let tenant = &self.tenant;
        Err(StoreError::Unavailable(match lag {
            Lag::Slow => format!(
                "tenant '{tenant}' is still applying its newest acknowledged changes (its state \
                 store is slow to take writes); retry in a moment"
            ),
            Lag::Failed if self.may_reopen() => format!(
                "tenant '{tenant}' is reopening after a failure; nothing acknowledged is lost, \
                 retry in a moment"
            ),
            Lag::Failed => format!(
                "tenant '{tenant}' failed before applying its newest acknowledged changes; they \
                 are safe in its log, and the server log says what an operator must do"
            ),
        }))
    }

    /// Whether changes the syncer acknowledged are not applied yet (see [`EarlyAnswers`]).
    fn lags(&self) -> bool {
        self.stats.last_seq.load(Ordering::Acquire) < self.early.answered()
    }

    /// Read access to the tenant's applied state (no trip through the actor). A caller that
    /// reads for a key checks [`TenantHandle::check_rights`] first, and waits for
    /// [`TenantHandle::caught_up`].
    pub fn reader(&self) -> &StateReader {
        &self.reader
    }

    /// Whether key `key_id`, which authenticated a call needing `needed`, may still make it:
    /// under the revocations and capability changes the tenant has logged but not yet applied
    /// to the catalog (which authenticated the call and still shows the old rights), and under
    /// the catalog as it is now (a revocation applied while the call waited: for the rest of
    /// its request, the tenant's open, a scan place).
    pub fn check_rights(&self, key_id: &str, needed: Capability) -> Result<(), StoreError> {
        match crate::core::rights_now(
            &self.stats.pending_rights,
            self.catalog.as_deref(),
            &self.tenant,
            key_id,
            Some(needed),
        ) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// WAL and checkpoint numbers and the durability policy.
    pub fn log_stats(&self) -> LogStats {
        LogStats {
            wal_bytes: self.stats.wal_bytes.load(Ordering::Relaxed),
            last_seq: self.stats.last_seq.load(Ordering::Relaxed),
            checkpoint_seq: self.stats.checkpoint_seq.load(Ordering::Relaxed),
            // The policy in force: narrowed since the open by a logged change, if one was.
            durability: self
                .stats
                .narrowed_policy()
                .unwrap_or_else(|| Arc::clone(&self.durability))
                .to_string(),
            quota_bytes: self.max_bytes,
        }
    }

    /// Requests of this tenant admitted and not yet answered.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    fn admit(&self, bytes: usize, bounded: bool) -> Result<InFlightPermit, StoreError> {
        let before = self.in_flight.fetch_add(1, Ordering::SeqCst);
        let held = self.in_flight_bytes.fetch_add(bytes, Ordering::SeqCst);
        cube_metrics::MAILBOX_DEPTH.inc();
        let permit = InFlightPermit {
            requests: Arc::clone(&self.in_flight),
            bytes: Arc::clone(&self.in_flight_bytes),
            size: bytes,
        };
        if bounded && before >= self.mailbox_capacity {
            return Err(StoreError::ResourceExhausted(format!(
                "tenant '{}' is busy: {} requests are already in flight; retry with backoff",
                self.tenant, self.mailbox_capacity
            )));
        }
        if bounded && held > 0 && held.saturating_add(bytes) > self.max_in_flight_bytes {
            return Err(StoreError::ResourceExhausted(format!(
                "tenant '{}' is busy: its requests in flight already carry {} KiB (at most {} KiB \
                 at once); retry with backoff",
                self.tenant,
                held >> 10,
                self.max_in_flight_bytes >> 10
            )));
        }
        Ok(permit)
    }

    /// Mark the handle retired if nothing is in flight; false (and unchanged) otherwise.
    fn try_retire(&self) -> bool {
        self.retired.store(true, Ordering::SeqCst);
        if self.in_flight.load(Ordering::SeqCst) > 0 {
            self.retired.store(false, Ordering::SeqCst);
            return false;
        }
        true
    }
}

/// Run one command against a tenant while no server runs: open it (recovering its log), handle
/// the command, close the log (fdatasync), apply, checkpoint. Returns the command's answer once
/// its change is durable and applied (and in force in `catalog`, for a key change).
pub fn run_offline(
    data_dir: &DataDir,
    catalog: &Arc<Catalog>,
    tenant: &str,
    principal: &str,
    cmd: Command,
) -> Result<Reply, StoreError> {
    offline(data_dir, catalog, tenant, principal, Some(cmd))?.unwrap_or_else(|| {
        Err(StoreError::Unavailable(format!(
            "tenant '{tenant}': the change was not answered"
        )))
    })
}

/// Open a tenant while no server runs, so that a new tenant's log starts with its creation
/// (see [`creation_event`]), and close it again.
pub fn open_offline(
    data_dir: &DataDir,
    catalog: &Arc<Catalog>,
    tenant: &str,
) -> Result<(), StoreError> {
    offline(data_dir, catalog, tenant, CREATOR, None).map(|_| ())
}

/// [`run_offline`] of `cmd`, if any: `Ok(None)` when there was none, else its answer.
fn offline(
    data_dir: &DataDir,
    catalog: &Arc<Catalog>,
    tenant: &str,
    principal: &str,
    cmd: Option<Command>,
) -> Result<Option<Result<Reply, StoreError>>, StoreError> {
    let config = CoreConfig {
        catalog: Some(Arc::clone(catalog)),
        // The tenant's policy, as the server opens it: recovery then cuts a hole a power cut
        // left in a relaxed log's unsynced tail as the server would (cube_wal's recovery).
        wal: cube_wal::WalOptions {
            sync: catalog.durability(tenant).unwrap_or_default(),
            ..cube_wal::WalOptions::default()
        },
        // The server's --audit-retention is not known here, and may be longer than the
        // default: an offline command expires no audit entry (the server's next apply expires
        // what its own retention says).
        limits: crate::StateLimits {
            audit_retention: u64::MAX,
            ..crate::StateLimits::default()
        },
        ..CoreConfig::default()
    };
    let (mut core, report) = TenantCore::<bool>::open(
        tenant,
        &data_dir.tenant_wal(tenant),
        &data_dir.tenant_state(tenant),
        &config,
        None,
    )?;
    let mut answer = None;
    // The token says whose answer it is: `cmd`'s (true) or the creation entry's (false).
    let mut take = |token: bool, reply: Result<Reply, StoreError>| match (token, reply) {
        (true, r) => answer = Some(r),
        (false, Err(e)) => {
            tracing::error!(tenant, error = %e, "the tenant's creation entry could not be logged")
        }
        (false, Ok(_)) => {}
    };
    let creation = creation_event(Some(catalog), tenant, &report).map(|e| (e, CREATOR, false));
    for (cmd, who, token) in creation
        .into_iter()
        .chain(cmd.map(|c| (c, principal, true)))
    {
        let caller = Caller {
            principal: who.to_string(),
            ts_ms: now_ms(),
        };
        if let Some((t, r)) = core.handle(cmd, &caller, token) {
            take(t, r);
        }
    }
    // The changes are in the log once handled: a log that cannot be synced at the close leaves
    // their outcome unknown (the next open replays what reached the file), as the server says
    // of a change whose batch failed.
    for (t, r) in core.close_here().map_err(|e| e.outcome_unknown())? {
        take(t, r);
    }
    Ok(answer)
}

/// The principal of the operator's commands (the local admin socket, the offline `cubed`
/// commands), also of a tenant's creation entry.
pub const OPERATOR: &str = "operator";
const CREATOR: &str = OPERATOR;

/// The entry a new tenant's log starts with: `tenant.create`, naming the key(s) the tenant was
/// created with. The catalog makes the tenant first (it must exist to be opened), so the entry
/// is written by the tenant's first open, before anything else reaches its log: a crash in
/// between leaves a tenant whose log is still empty, and its next open writes the entry then.
/// `None` for a log that already holds records, or a tenant the catalog does not know.
fn creation_event(
    catalog: Option<&Catalog>,
    tenant: &str,
    report: &cube_wal::RecoveryReport,
) -> Option<Command> {
    if report.last_seq != 0 {
        return None;
    }
    let keys = catalog?.active_key_ids(tenant);
    if keys.is_empty() {
        return None;
    }
    Some(Command::Event {
        op: crate::state::CREATION_OP.into(),
        detail: format!("key={}", keys.join(",")),
    })
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

fn shutting_down() -> StoreError {
    StoreError::Unavailable(
        "the server is shutting down; retry against the restarted server".into(),
    )
}

fn stopped() -> StoreError {
    StoreError::Unavailable(
        "the tenant stopped before answering (server shutting down); retry".into(),
    )
}

/// What a caller whose answer a crashed actor dropped is told. Its change may have been logged
/// (and is then replayed when the tenant reopens), so its outcome is unknown.
fn crashed(tenant: &str) -> StoreError {
    StoreError::Unavailable(format!(
        "tenant '{tenant}' stopped after an internal error (see the server log); it is reopened \
         from its log within about a second. {CRASHED_CALL}"
    ))
}

/// The outcome of a call the crash cut off: still queued, it did nothing; logged, it is replayed.
const CRASHED_CALL: &str = "The outcome of this call is unknown: a change it had logged takes \
                            effect when the tenant reopens; read before retrying a change that is \
                            not idempotent.";

/// Tenants whose log's fdatasync failed while this server runs, whatever closed them since (a
/// passivation, a crash): none is reopened before a restart, since a reopen would read back
/// pages whose fsync failed as if they were durable. Recorded by the syncer's report itself, so
/// before the failed close lets go of the tenant's files and any reopen could start.
#[derive(Debug, Default)]
struct FailedLogs(crate::TenantSet);

impl FailedLogs {
    /// `tenant` failed for good because `cause`.
    fn record(&self, tenant: &str, cause: &str) {
        if self.0.insert(tenant) {
            tracing::error!(
                tenant,
                "{cause}: it stays unavailable until the server restarts"
            );
        }
    }

    /// Every tenant whose log failed for good since the start.
    fn tenants(&self) -> Vec<String> {
        self.0.tenants()
    }

    /// The error an open of `tenant` fails with, if its log failed.
    fn refusal(&self, tenant: &str) -> Option<StoreError> {
        self.0.contains(tenant).then(|| log_failed(tenant))
    }
}

/// Starts a fresh slot's open if dropped: see [`TenantDirectory::get`]. Forgotten, not dropped,
/// once the caller goes on to open the tenant itself.
struct OpenOnDrop<'a> {
    dir: &'a TenantDirectory,
    tenant: &'a str,
    slot: &'a Weak<Slot>,
}

impl Drop for OpenOnDrop<'_> {
    fn drop(&mut self) {
        // Outside a runtime (it is shutting down) no task can start; nothing is served then.
        // A slot gone meanwhile was opened (and closed) by another call.
        if tokio::runtime::Handle::try_current().is_ok()
            && let Some(slot) = self.slot.upgrade()
        {
            self.dir.start_open(self.tenant, &slot);
        }
    }
}

/// Passivations under way, by tenant: each sets its flag once the tenant's actor has closed
/// everything (log, checkpoint) and let go of its files.
#[derive(Debug, Default)]
struct Closing(Mutex<HashMap<String, watch::Receiver<bool>>>);

impl Closing {
    /// Register the close of `tenant` about to start; send `true` on the result when it is done.
    fn start(self: &Arc<Self>, tenant: &str) -> ClosingGuard {
        let (tx, rx) = watch::channel(false);
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        map.insert(tenant.to_string(), rx.clone());
        ClosingGuard {
            closing: Arc::clone(self),
            tenant: tenant.to_string(),
            tx,
            rx,
        }
    }

    /// Wait until no close of `tenant` is under way.
    async fn wait(&self, tenant: &str) {
        let rx = {
            let map = self.0.lock().unwrap_or_else(|p| p.into_inner());
            map.get(tenant).cloned()
        };
        if let Some(mut rx) = rx {
            // An error means the close's guard is gone: done as well.
            let _ = rx.wait_for(|done| *done).await;
        }
    }
}

/// A close in progress; dropped (the close done, or given up), it releases the waiting opens.
struct ClosingGuard {
    closing: Arc<Closing>,
    tenant: String,
    tx: watch::Sender<bool>,
    rx: watch::Receiver<bool>,
}

impl Drop for ClosingGuard {
    fn drop(&mut self) {
        let _ = self.tx.send(true);
        let mut map = self.closing.0.lock().unwrap_or_else(|p| p.into_inner());
        if map
            .get(&self.tenant)
            .is_some_and(|r| r.same_channel(&self.rx))
        {
            map.remove(&self.tenant);
        }
    }
}

/// Each tenant's [`SCANS_PER_TENANT`] places, one semaphore per tenant for the directory's life:
/// a passivation and reopen does not hand a tenant a fresh set while its old streams still hold
/// theirs.
#[derive(Debug, Default)]
struct ScanPlaces(Mutex<HashMap<String, Arc<tokio::sync::Semaphore>>>);

impl ScanPlaces {
    fn of(&self, tenant: &str) -> Arc<tokio::sync::Semaphore> {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        Arc::clone(
            map.entry(tenant.to_string())
                .or_insert_with(|| Arc::new(tokio::sync::Semaphore::new(SCANS_PER_TENANT))),
        )
    }
}

fn log_failed(tenant: &str) -> StoreError {
    StoreError::Unavailable(format!(
        "tenant '{tenant}' is unavailable: a write to its storage failed to reach the disk (see \
         the server log), so it stays closed until the server restarts"
    ))
}

fn crashed_for_good(tenant: &str) -> StoreError {
    StoreError::Unavailable(format!(
        "tenant '{tenant}' stopped after an internal error and a failed write to its log (see the \
         server log); it stays unavailable until the server restarts. {CRASHED_CALL}"
    ))
}

/// One tenant's place in the directory.
struct Slot {
    /// Set once, by the slot's open task (see `TenantDirectory::wait_open`).
    opened: OnceLock<Result<TenantHandle, StoreError>>,
    /// Becomes true once `opened` is set.
    ready: watch::Sender<bool>,
    /// The open task was started (by the slot's first call).
    open_started: AtomicBool,
    /// Milliseconds since the directory started, at the last call.
    last_used: AtomicU64,
    /// Claimed by the one task that passivates this slot (the janitor and `make_room` of
    /// concurrent opens may pick the same victim).
    closing: AtomicBool,
    /// A failed open: when the slot may be forgotten, so that the next call tries again.
    retry_at: OnceLock<Instant>,
    /// The tenant is being deleted: calls through this slot are refused
    /// ([`TenantDirectory::refuse_deleted`]).
    deleted: AtomicBool,
}

impl Default for Slot {
    fn default() -> Self {
        Slot {
            opened: OnceLock::new(),
            ready: watch::channel(false).0,
            open_started: AtomicBool::new(false),
            last_used: AtomicU64::new(0),
            closing: AtomicBool::new(false),
            retry_at: OnceLock::new(),
            deleted: AtomicBool::new(false),
        }
    }
}

/// What opening a tenant needs, owned, so the open can run as a task of its own.
struct OpenContext {
    data_dir: DataDir,
    core: CoreConfig,
    catalog: Option<Arc<Catalog>>,
    arbiter: actix::ArbiterHandle,
    mailbox_capacity: usize,
    max_in_flight_bytes: usize,
    failed_logs: Arc<FailedLogs>,
    closing: Arc<Closing>,
    deleted: Arc<crate::TenantSet>,
}

impl OpenContext {
    /// Open `tenant`: recover its state and log on the blocking pool, start its actor, and log
    /// its creation entry if this is its first open.
    async fn open(self, tenant: String) -> Result<TenantHandle, StoreError> {
        let tenant = tenant.as_str();
        // A passivation of this tenant still closing it: its final fdatasync decides whether the
        // tenant may open again, and it still holds the files. So wait for it to end first.
        self.closing.wait(tenant).await;
        if let Some(refused) = self.failed_logs.refusal(tenant) {
            return Err(refused);
        }
        // A call authenticated before its tenant's deletion may come this far after it: it
        // must not open (and so create again) the files the deletion removes.
        let deleted_in_catalog = self.catalog.as_ref().is_some_and(|c| c.is_deleted(tenant));
        if self.deleted.contains(tenant) || deleted_in_catalog {
            return Err(deletion_refusal(self.catalog.as_deref(), tenant));
        }
        let wal_dir = self.data_dir.tenant_wal(tenant);
        let state_dir = self.data_dir.tenant_state(tenant);
        let mut config = self.core.clone();
        config.wal.sync = self
            .catalog
            .as_ref()
            .and_then(|c| c.durability(tenant).ok())
            .unwrap_or_default();
        config.catalog = self.catalog.clone();
        let name = tenant.to_string();
        // The syncer reports to the actor, which does not exist until the WAL is open.
        let addr_slot: Arc<OnceLock<Addr<TenantActor>>> = Arc::new(OnceLock::new());
        let notify_slot = Arc::clone(&addr_slot);
        let wal_failed = Arc::new(AtomicBool::new(false));
        let notify_failed = Arc::clone(&wal_failed);
        let failed_logs = Arc::clone(&self.failed_logs);
        let notify_name: Arc<str> = tenant.into();
        // Answers the syncer sends itself (used under the `sync` policy only, or once a logged
        // change narrowed a relaxed one to it; see there).
        let early: Arc<EarlyAnswers<Responder>> = Arc::new(EarlyAnswers::default());
        let notify_early = Arc::clone(&early);
        let notify = move || -> cube_wal::DurableNotify {
            let slot = Arc::clone(&notify_slot);
            let failed = Arc::clone(&notify_failed);
            let (failed_logs, name) = (Arc::clone(&failed_logs), Arc::clone(&notify_name));
            let early = Arc::clone(&notify_early);
            Box::new(move |event| {
                if event == DurableEvent::Poisoned {
                    failed.store(true, Ordering::SeqCst);
                    failed_logs.record(
                        &name,
                        "an fsync of the tenant's log (or of its state store while it opened) failed, or its syncer thread stopped on a bug",
                    );
                }
                if let Some(addr) = slot.get() {
                    addr.do_send(Durable(event));
                }
                // After the report: a call its answer prompts queues behind it.
                if let DurableEvent::Durable(upto) = event {
                    for (responder, reply) in early.take_through(upto) {
                        responder.send(Ok(reply));
                    }
                }
            })
        };
        let catalog = self.catalog.clone();
        let reopen_failed = Arc::clone(&self.failed_logs);
        let (mut core, report) = tokio::task::spawn_blocking(move || {
            let (mut core, report) =
                TenantCore::open(&name, &wal_dir, &state_dir, &config, Some(notify()))?;
            // A durability change replayed from the log (acknowledged before a crash, not yet in
            // the catalog's files) changed the policy this log was opened under: reopen under it.
            let Some(wanted) = catalog.and_then(|c| c.durability(&name).ok()) else {
                return Ok((core, report));
            };
            if core.policy() == wanted {
                return Ok((core, report));
            }
            // A core opened read-only on a nearly full disk is poisoned from its open (it takes
            // no writes); only a poisoning by the close itself means the close failed.
            let opened_poisoned = core.is_poisoned();
            let closed = core.close_here();
            // Not the core the directory will hold (or count as a failed open): its count in
            // `cube_tenants_unavailable` (poisoned at its open, or by this close) goes with it,
            // else the gauge stayed one up for good.
            if core.is_poisoned() {
                cube_metrics::TENANTS_UNAVAILABLE.dec();
            }
            closed?;
            if core.is_poisoned() && !opened_poisoned {
                // Its close failed (its checkpoint, or an fsync removing its log): not reopened
                // before a restart, as a tenant whose close failed after it served is not.
                reopen_failed.record(
                    &name,
                    "the close before its reopen under a new policy failed",
                );
                return Err(log_failed(&name));
            }
            drop(core);
            config.wal.sync = wanted;
            let (core, _) = TenantCore::open(&name, &wal_dir, &state_dir, &config, Some(notify()))?;
            Ok::<_, StoreError>((core, report))
        })
        .await
        .map_err(|_| StoreError::Unavailable(format!("tenant '{tenant}' failed to open")))??;
        core.answer_early_through(Arc::clone(&early));
        let creation = creation_event(self.catalog.as_deref(), tenant, &report);
        let reader = core.state().reader();
        let stats = core.stats();
        let durability: Arc<str> = describe_policy(&core.policy()).into();
        let addr = TenantActor::start_in_arbiter(&self.arbiter, move |_| TenantActor::new(core));
        let _ = addr_slot.set(addr.clone());
        let handle = TenantHandle {
            tenant: tenant.into(),
            addr,
            mailbox_capacity: self.mailbox_capacity,
            max_in_flight_bytes: self.max_in_flight_bytes,
            in_flight: Arc::new(AtomicUsize::new(0)),
            in_flight_bytes: Arc::new(AtomicUsize::new(0)),
            retired: Arc::new(AtomicBool::new(false)),
            reader,
            stats,
            durability,
            wal_failed,
            early,
            catalog: self.catalog.clone(),
            max_value: self.core.limits.max_value,
            max_bytes: self.core.limits.max_bytes,
        };
        // Logged before the handle is handed to anyone, so it is the log's first record. If it
        // cannot be (a full disk: the tenant opened for reads only), the tenant still serves
        // reads; its trail then starts without the entry.
        if let Some(event) = creation {
            let logged = match handle.try_call(event, CREATOR).await {
                Ok(result) => result.map(|_| ()),
                Err(_) => Err(stopped()),
            };
            if let Err(e) = logged {
                tracing::error!(tenant, error = %e, "the tenant's creation entry could not be logged");
            }
        }
        Ok(handle)
    }
}

/// Decrements the count of passivations under way when dropped (even if the passivating call
/// is cancelled).
struct CloseInProgress(Arc<AtomicUsize>);

impl Drop for CloseInProgress {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Tenant name -> actor.
pub struct TenantDirectory {
    config: DirectoryConfig,
    catalog: Option<Arc<Catalog>>,
    runtime: ActorRuntime,
    tenants: RwLock<HashMap<String, Arc<Slot>>>,
    epoch: Instant,
    /// Tenants whose recovery at start failed ([`TenantDirectory::recover_unclosed`]): until one
    /// of their opens succeeds, the catalog may lack key changes that only their log holds (a
    /// revocation, say), so the gateway does not authenticate calls to them
    /// ([`TenantDirectory::awaiting_recovery`]).
    /// With the error of the failed open.
    unrecovered: Mutex<HashMap<String, StoreError>>,
    /// `unrecovered` is not empty (read on every authenticated call).
    any_unrecovered: AtomicBool,
    /// Set by [`TenantDirectory::shutdown`]: no tenant opens any more.
    shutting_down: AtomicBool,
    /// Passivations between taking a tenant out of the map and its close being done, which
    /// `shutdown` waits for.
    closes_in_progress: Arc<AtomicUsize>,
    /// Tenants never reopened before a restart.
    failed_logs: Arc<FailedLogs>,
    /// Passivations under way, which an open of the same tenant waits for.
    closing: Arc<Closing>,
    /// Each tenant's scan places, kept across its passivations.
    scan_places: ScanPlaces,
    /// Consecutive failed opens by tenant, and when the last one failed, for the retry delay.
    /// Reset by a successful open, or once the last failure is [`OPEN_FAILURES_FORGOTTEN`] old.
    open_failures: Arc<Mutex<HashMap<String, (u32, Instant)>>>,
    /// Woken by a tenant poisoned reopenable ([`CoreConfig::janitor`]), so that the janitor
    /// closes it at once rather than at its next round.
    janitor_wake: Arc<tokio::sync::Notify>,
    /// Tenants that lost acknowledged changes ([`CoreConfig::lost_acknowledged`]).
    lost_acknowledged: Arc<crate::TenantSet>,
    /// Tenants deleted since the directory started: no call opens them
    /// ([`TenantDirectory::close_for_deletion`]). The catalog's record of a deletion refuses
    /// their opens too (after a restart, and before the name is here).
    deleted: Arc<crate::TenantSet>,
}

impl std::fmt::Debug for TenantDirectory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TenantDirectory")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// How a call to `tenant`, refused for its deletion, is answered: `NOT_FOUND` once `catalog`
/// holds the deletion durably (or there is no catalog), `UNAVAILABLE` (retry) while it is being
/// made: it may yet fail.
fn deletion_refusal(catalog: Option<&Catalog>, tenant: &str) -> StoreError {
    if catalog.is_none_or(|c| c.is_deleted(tenant)) {
        StoreError::NotFound(format!("tenant '{tenant}' was deleted"))
    } else {
        StoreError::Unavailable(format!("tenant '{tenant}' is being deleted; retry"))
    }
}

/// How long [`TenantDirectory::close_for_deletion`] waits for a tenant's calls in flight.
pub const DELETION_CLOSE_WAIT: Duration = Duration::from_secs(10);

/// Attempts of a call that keeps meeting a tenant being passivated.
const RETIRED_RETRIES: usize = 8;

/// Tenants recovered at once by [`TenantDirectory::recover_unclosed`].
const RECOVERY_CONCURRENCY: usize = 4;

/// How often the janitor closes tenants poisoned by a failed write, so they can reopen (and
/// retries failed opens), besides the passes a poisoned tenant wakes it for.
const REOPEN_FAILED_EVERY: Duration = Duration::from_secs(1);

/// Shortest time between two of the janitor's passes over failed tenants when a tenant's
/// failure wakes it.
const JANITOR_WAKE_GAP: Duration = Duration::from_millis(50);

/// Passes a wake-up makes at most, [`JANITOR_WAKE_GAP`] apart, while a failed tenant it would
/// close still has a call in flight; then the regular round takes over.
const JANITOR_WAKE_PASSES: u32 = 20;

/// Longest wait before a tenant whose opens keep failing is tried again.
const MAX_OPEN_RETRY_DELAY: Duration = Duration::from_secs(30);

/// A failed open this long after the previous one counts as the first again: the tenant was
/// not called in between, and a new cause gets the short delay.
const OPEN_FAILURES_FORGOTTEN: Duration = Duration::from_secs(120);

/// How long a tenant whose open failed `failures` times in a row stays failed before its next
/// call tries again: 1 s, doubling with each failure up to [`MAX_OPEN_RETRY_DELAY`]. A
/// transient cause (a lock still held, a full disk) clears by itself; a corrupt log that keeps
/// being called does not cost a recovery attempt every second.
fn open_retry_delay(failures: u32) -> Duration {
    REOPEN_FAILED_EVERY
        .saturating_mul(1 << failures.clamp(1, 6).saturating_sub(1))
        .min(MAX_OPEN_RETRY_DELAY)
}

impl TenantDirectory {
    /// A directory whose tenants take their durability policy from `catalog` (policy `sync`
    /// for every tenant without one).
    pub fn new(
        config: DirectoryConfig,
        catalog: Option<Arc<Catalog>>,
    ) -> Result<TenantDirectory, StoreError> {
        let runtime = ActorRuntime::start(config.actor_threads)?;
        Ok(TenantDirectory {
            config,
            catalog,
            runtime,
            tenants: RwLock::new(HashMap::new()),
            epoch: Instant::now(),
            unrecovered: Mutex::new(HashMap::new()),
            any_unrecovered: AtomicBool::new(false),
            shutting_down: AtomicBool::new(false),
            closes_in_progress: Arc::new(AtomicUsize::new(0)),
            failed_logs: Arc::default(),
            closing: Arc::default(),
            scan_places: ScanPlaces::default(),
            open_failures: Arc::default(),
            janitor_wake: Arc::default(),
            lost_acknowledged: Arc::default(),
            deleted: Arc::default(),
        })
    }

    fn now(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Send `cmd` to `tenant` on behalf of `principal` and wait for the answer.
    pub async fn call(
        &self,
        tenant: &str,
        mut cmd: Command,
        principal: &str,
    ) -> Result<Reply, StoreError> {
        for _ in 0..RETIRED_RETRIES {
            let handle = self.get(tenant).await?;
            match handle.try_call(cmd, principal).await {
                Ok(result) => return result,
                Err(back) => {
                    cmd = back;
                    tokio::task::yield_now().await;
                }
            }
        }
        Err(StoreError::Unavailable(format!(
            "tenant '{tenant}' is being closed and reopened; retry"
        )))
    }

    /// The running actor of `tenant`, started (and its state recovered) on first use. The
    /// caller must already know the tenant exists (it authenticated as it).
    pub async fn get(&self, tenant: &str) -> Result<TenantHandle, StoreError> {
        let slot = loop {
            // Hot path: a read lock and no allocation once the tenant is known.
            let known = {
                let map = self.tenants.read().unwrap_or_else(|p| p.into_inner());
                map.get(tenant).cloned()
            };
            let (slot, fresh) = match known {
                Some(slot) => (slot, false),
                None => {
                    if self.deleted.contains(tenant) {
                        return Err(deletion_refusal(self.catalog.as_deref(), tenant));
                    }
                    let mut map = self.tenants.write().unwrap_or_else(|p| p.into_inner());
                    let before = map.len();
                    let slot = Arc::clone(map.entry(tenant.to_string()).or_default());
                    (slot, map.len() > before)
                }
            };
            // A deleted tenant's calls stop here, also while its actor is still open (closing
            // once the calls it holds are answered).
            if slot.deleted.load(Ordering::Acquire) {
                return Err(deletion_refusal(self.catalog.as_deref(), tenant));
            }
            slot.last_used.store(self.now(), Ordering::Relaxed);
            if !fresh {
                break slot;
            }
            // Held by weak reference while room is made (each eviction a final fdatasync and
            // checkpoint): another call may open the tenant meanwhile and a close take it out
            // again, and a slot held here would keep its state store open, and locked, against
            // the next reopen. Should this caller give up while room is made, the open starts
            // anyway: a slot left in the map unopened could never be closed, and would hold a
            // place under --max-open-tenants for good.
            let weak = Arc::downgrade(&slot);
            drop(slot);
            let start_anyway = OpenOnDrop {
                dir: self,
                tenant,
                slot: &weak,
            };
            self.make_room(tenant).await;
            std::mem::forget(start_anyway);
            if let Some(slot) = weak.upgrade() {
                break slot;
            }
            // Opened and closed by other calls meanwhile: look the tenant up again.
        };
        let opened = match slot.opened.get() {
            Some(opened) => opened.clone(),
            None => self.wait_open(tenant, &slot).await,
        };
        if opened.is_ok() && self.any_unrecovered.load(Ordering::Relaxed) {
            let mut unrecovered = self.unrecovered.lock().unwrap_or_else(|p| p.into_inner());
            if unrecovered.remove(tenant).is_some() {
                tracing::info!(tenant, "tenant recovered after a failed recovery at start");
            }
            self.any_unrecovered
                .store(!unrecovered.is_empty(), Ordering::Relaxed);
        }
        opened
    }

    /// Start the slot's open if no call has yet, and wait for its result. The open runs as a
    /// task of its own: a caller that gives up (its deadline passed, its connection dropped)
    /// neither stops an open halfway nor lets the next caller start a second one beside it (two
    /// opens of one tenant would race on its log and its state store).
    async fn wait_open(&self, tenant: &str, slot: &Arc<Slot>) -> Result<TenantHandle, StoreError> {
        let mut ready = slot.ready.subscribe();
        self.start_open(tenant, slot);
        let _ = ready.wait_for(|done| *done).await;
        slot.opened.get().cloned().unwrap_or_else(|| {
            Err(StoreError::Unavailable(format!(
                "tenant '{tenant}' failed to open (see the server log)"
            )))
        })
    }

    /// Start the slot's open, as a task of its own, unless a call already has.
    fn start_open(&self, tenant: &str, slot: &Arc<Slot>) {
        if !slot.open_started.swap(true, Ordering::SeqCst) {
            if self.shutting_down.load(Ordering::SeqCst) {
                // Counted like a failed open, so forgetting the slot balances the gauge.
                cube_metrics::TENANTS_UNAVAILABLE.inc();
                let _ = slot.opened.set(Err(shutting_down()));
                slot.ready.send_replace(true);
            } else {
                let open = tokio::spawn(self.open_context().open(tenant.to_string()));
                let (slot, name) = (Arc::clone(slot), tenant.to_string());
                let failures = Arc::clone(&self.open_failures);
                tokio::spawn(async move {
                    let opened = open.await.unwrap_or_else(|_| {
                        Err(StoreError::Unavailable(format!(
                            "tenant '{name}' failed to open (see the server log)"
                        )))
                    });
                    let mut failures = failures.lock().unwrap_or_else(|p| p.into_inner());
                    match &opened {
                        Ok(_) => {
                            cube_metrics::TENANTS_ACTIVE.inc();
                            failures.remove(&name);
                        }
                        Err(_) => {
                            cube_metrics::TENANTS_UNAVAILABLE.inc();
                            cube_metrics::TENANT_OPEN_FAILURES.inc();
                            let now = Instant::now();
                            let (n, last) = failures.entry(name).or_insert((0, now));
                            if now.duration_since(*last) >= OPEN_FAILURES_FORGOTTEN {
                                *n = 0;
                            }
                            *n = n.saturating_add(1);
                            *last = now;
                            let _ = slot.retry_at.set(now + open_retry_delay(*n));
                        }
                    }
                    drop(failures);
                    let _ = slot.opened.set(opened);
                    slot.ready.send_replace(true);
                });
            }
        }
    }

    fn open_context(&self) -> OpenContext {
        OpenContext {
            data_dir: self.config.data_dir.clone(),
            core: CoreConfig {
                janitor: Some(Arc::clone(&self.janitor_wake)),
                lost_acknowledged: Some(Arc::clone(&self.lost_acknowledged)),
                ..self.config.core.clone()
            },
            catalog: self.catalog.clone(),
            arbiter: self.runtime.pick().clone(),
            mailbox_capacity: self.config.mailbox_capacity,
            max_in_flight_bytes: self.config.max_in_flight_bytes,
            failed_logs: Arc::clone(&self.failed_logs),
            closing: Arc::clone(&self.closing),
            deleted: Arc::clone(&self.deleted),
        }
    }

    /// If `tenant` failed its recovery at start and has not opened since, why it failed: its
    /// calls must not be authenticated from the catalog yet (see `unrecovered`).
    pub fn awaiting_recovery(&self, tenant: &str) -> Option<StoreError> {
        if !self.any_unrecovered.load(Ordering::Relaxed) {
            return None;
        }
        let unrecovered = self.unrecovered.lock().unwrap_or_else(|p| p.into_inner());
        unrecovered.get(tenant).cloned()
    }

    /// Open every tenant of `tenants` whose log may hold records that neither its state store
    /// nor the catalog has durably (its server stopped without closing it: kill -9, power loss).
    /// A capability change (`Access.Grant` / `Access.Revoke`) is durable in the tenant's log
    /// first and reaches the catalog's files only at the tenant's next checkpoint, so the server
    /// calls this before it serves: replaying the log puts every such change back in force.
    /// Returns (opened, failed); a tenant that fails to open stays unavailable, as it would on
    /// its first call.
    pub async fn recover_unclosed(
        &self,
        tenants: impl IntoIterator<Item = String>,
    ) -> (usize, usize) {
        use futures::StreamExt;
        let candidates = tenants.into_iter().filter(|tenant| {
            let dir = self.config.data_dir.tenant_wal(tenant);
            cube_wal::log_may_need_replay(&dir).unwrap_or_else(|e| {
                tracing::warn!(tenant, error = %e, "could not look at the tenant's log; recovering it");
                true
            })
        });
        // A few at once: each open waits on fsyncs more than it uses a core.
        let results: Vec<bool> = futures::stream::iter(candidates)
            .map(|tenant| async move {
                match self.get(&tenant).await {
                    Ok(_) => true,
                    Err(e) => {
                        tracing::error!(tenant, error = %e, "tenant could not be recovered at start; its calls are refused until it opens");
                        let mut unrecovered =
                            self.unrecovered.lock().unwrap_or_else(|p| p.into_inner());
                        unrecovered.insert(tenant, e);
                        self.any_unrecovered.store(true, Ordering::Relaxed);
                        false
                    }
                }
            })
            .buffer_unordered(RECOVERY_CONCURRENCY)
            .collect()
            .await;
        let opened = results.iter().filter(|ok| **ok).count();
        (opened, results.len() - opened)
    }

    /// The data directory the tenants' files are in.
    pub fn data_dir(&self) -> &DataDir {
        &self.config.data_dir
    }

    /// Whether `tenant` has a slot (open, opening or failed): a call to it opens nothing.
    pub fn is_open(&self, tenant: &str) -> bool {
        self.tenants
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .contains_key(tenant)
    }

    /// Tenants with a slot (open, opening or failed).
    pub fn open_count(&self) -> usize {
        self.tenants.read().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Whether the tenants open or opening are within `--max-open-tenants`: the map's slots
    /// but those of failed opens, which hold no files and wait there for their retry delay
    /// (counted, they would push healthy tenants out).
    fn within_cap(&self) -> bool {
        let map = self.tenants.read().unwrap_or_else(|p| p.into_inner());
        let counted = map
            .values()
            .filter(|s| !matches!(s.opened.get(), Some(Err(_))))
            .count();
        counted <= self.config.max_open.max(1)
    }

    /// Over the open-tenant cap: passivate the least recently used idle tenants (not `keep`).
    async fn make_room(&self, keep: &str) {
        if self.within_cap() {
            return;
        }
        // Weak references (as in the idle pass): a slot that another close takes out of the
        // map meanwhile is let go, with the store it holds open.
        let mut candidates: Vec<(u64, String, Weak<Slot>)> = {
            let map = self.tenants.read().unwrap_or_else(|p| p.into_inner());
            map.iter()
                .filter(|(name, _)| name.as_str() != keep)
                .map(|(name, slot)| {
                    (
                        slot.last_used.load(Ordering::Relaxed),
                        name.clone(),
                        Arc::downgrade(slot),
                    )
                })
                .collect()
        };
        candidates.sort_by_key(|(used, _, _)| *used);
        for (_, name, slot) in candidates {
            // Counted again before each eviction: a concurrent first call making room too has
            // taken its victims out of the map already (counting once, up front, closed more
            // tenants than the cap asked for).
            if self.within_cap() {
                break;
            }
            if let Some(slot) = slot.upgrade() {
                self.passivate(&name, &slot, false).await;
            }
        }
    }

    /// Close `tenant` now if it is open and idle (so its next call reopens it, e.g. under a new
    /// durability policy). True if it is closed afterwards.
    pub async fn close_tenant(&self, tenant: &str) -> bool {
        let slot = {
            let map = self.tenants.read().unwrap_or_else(|p| p.into_inner());
            map.get(tenant).cloned()
        };
        match slot {
            None => true,
            Some(slot) => self.passivate(tenant, &slot, true).await,
        }
    }

    /// Refuse every call to `tenant` from now on (`NOT_FOUND`, `tenant '…' was deleted`), its
    /// calls through the open actor included: called before the catalog's change, so that no
    /// call is applied after it. [`TenantDirectory::deletion_abandoned`] undoes it.
    pub fn refuse_deleted(&self, tenant: &str) {
        self.deleted.insert(tenant);
        let map = self.tenants.read().unwrap_or_else(|p| p.into_inner());
        if let Some(slot) = map.get(tenant) {
            slot.deleted.store(true, Ordering::Release);
        }
    }

    /// The deletion [`TenantDirectory::refuse_deleted`] prepared was not made (the tenant does
    /// not exist, or the catalog refused the change): calls reach the tenant again. An open the
    /// refusal failed meanwhile is forgotten at once, so the next call opens the tenant.
    pub async fn deletion_abandoned(&self, tenant: &str) {
        self.deleted.remove(tenant);
        let refused_open = {
            let map = self.tenants.read().unwrap_or_else(|p| p.into_inner());
            map.get(tenant).is_some_and(|slot| {
                slot.deleted.store(false, Ordering::Release);
                matches!(slot.opened.get(), Some(Err(_)))
            })
        };
        if refused_open {
            self.close_tenant(tenant).await;
        }
    }

    /// Close `tenant`, deleted from the catalog: from now on no call reaches it (the calls its
    /// actor already holds are answered), and once those have ended it is closed, with a final
    /// checkpoint, as a passivation would, so that its files can be removed. False if it
    /// is still open after `wait` (calls that do not end; a log poisoned by a failed fsync,
    /// which keeps its tenant open until the restart) or the server is stopping: its files are
    /// then removed at the next start.
    pub async fn close_for_deletion(&self, tenant: &str, wait: Duration) -> bool {
        self.refuse_deleted(tenant);
        let give_up = Instant::now() + wait;
        loop {
            if self.shutting_down.load(Ordering::SeqCst) {
                return false;
            }
            if self.close_tenant(tenant).await && !self.is_open(tenant) {
                // Another path (the idle pass, an eviction, the janitor) may have taken the
                // slot out first and still be closing the tenant: its files are in use until
                // that close ends.
                match tokio::time::timeout_at(give_up.into(), self.closing.wait(tenant)).await {
                    Ok(()) => return true,
                    Err(_) => return false,
                }
            }
            if Instant::now() >= give_up {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Passivate every tenant idle for longer than the configured time. Returns how many.
    pub async fn passivate_idle(&self) -> usize {
        let idle_ms = self.config.idle_after.as_millis() as u64;
        let now = self.now();
        let is_idle =
            |s: &Slot, now: u64| now.saturating_sub(s.last_used.load(Ordering::Relaxed)) >= idle_ms;
        // Weak references, in name order: a pass may take seconds per tenant (a final
        // fdatasync and checkpoint each), and a slot it held would keep its tenant's state
        // store open, and locked, after another close (an eviction, `close_tenant`, a failed
        // tenant's) had taken it out of the map: the tenant's reopen then waited for the pass
        // and failed.
        let mut idle: Vec<(String, Weak<Slot>)> = {
            let map = self.tenants.read().unwrap_or_else(|p| p.into_inner());
            map.iter()
                .filter(|(_, s)| is_idle(s, now))
                .map(|(n, s)| (n.clone(), Arc::downgrade(s)))
                .collect()
        };
        idle.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        let mut n = 0;
        for (name, slot) in idle {
            // Idle still: a tenant used again while the pass closed others is left open.
            let Some(slot) = slot.upgrade().filter(|s| is_idle(s, self.now())) else {
                continue;
            };
            if self.passivate(&name, &slot, false).await {
                n += 1;
            }
        }
        n
    }

    /// Close one tenant if nothing is in flight. A tenant that failed to open is forgotten too,
    /// so its next call retries the open: once its retry delay has passed, or at once if
    /// `early`.
    async fn passivate(&self, tenant: &str, slot: &Arc<Slot>, early: bool) -> bool {
        if slot
            .closing
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return false;
        }
        let closed = self.passivate_claimed(tenant, slot, early).await;
        if !closed {
            slot.closing.store(false, Ordering::Release);
        }
        closed
    }

    async fn passivate_claimed(&self, tenant: &str, slot: &Arc<Slot>, early: bool) -> bool {
        // Counted before `shutting_down` is read (and `shutdown` sets that before it reads the
        // count), so a shutdown either sees this close or this close sees the shutdown: never
        // both closing the tenant. Dropped on every early return below.
        self.closes_in_progress.fetch_add(1, Ordering::SeqCst);
        let done = CloseInProgress(Arc::clone(&self.closes_in_progress));
        if self.shutting_down.load(Ordering::SeqCst) {
            return false; // `shutdown` closes every tenant itself
        }
        let handle = match slot.opened.get() {
            None => return false, // still opening
            // A failed open is forgotten (so the next call tries again) only once its retry
            // delay has passed: an eviction or an idle pass used to forget it at once, and a
            // tenant whose log cannot be replayed was read again at every call. The janitor
            // forgets it when the delay is up (`close_failed`); `close_tenant` at once.
            Some(Err(_))
                if !early && slot.retry_at.get().is_some_and(|at| Instant::now() < *at) =>
            {
                return false;
            }
            Some(Err(_)) => None,
            Some(Ok(h)) => {
                // A tenant poisoned by a failed fsync stays open and refusing until the server
                // restarts: a reopen would read back pages whose fsync failed as if they were
                // durable. One poisoned by a failed write (a full disk) may reopen.
                // A crashed actor answers nothing more, so its count of requests in flight is
                // moot (a request it held may have released its reply before its count).
                if !h.may_reopen() || !(h.crashed() || h.try_retire()) {
                    return false;
                }
                Some(h.clone())
            }
        };
        // Registered before the slot leaves the map: an open of the tenant from then on waits
        // for this close to end.
        let closing = handle.as_ref().map(|_| self.closing.start(tenant));
        {
            let mut map = self.tenants.write().unwrap_or_else(|p| p.into_inner());
            if map.get(tenant).is_some_and(|s| Arc::ptr_eq(s, slot)) {
                map.remove(tenant);
            }
        }
        // A task of its own, which owns the count: a caller that gives up (a request waiting in
        // `make_room`) does not end the count while the tenant is still closing.
        let name = tenant.to_string();
        let (failed_logs, wal_dir) = (
            Arc::clone(&self.failed_logs),
            self.config.data_dir.tenant_wal(tenant),
        );
        let close = tokio::spawn(async move {
            let _done = done;
            let _closing = closing;
            match handle {
                Some(h) => {
                    let crashed = h.crashed();
                    let (tx, rx) = oneshot::channel();
                    h.addr.do_send(Shutdown { done: tx });
                    // No answer: the actor died before it closed (a panic after the check
                    // above, which can lag the panic by a moment).
                    let gone = rx.await.is_err();
                    // A crashed actor's periodic checkpoint may still run (it holds the state
                    // store), and its result went with the actor: waited for here, and a
                    // failed one refuses the tenant until the restart, as it would have.
                    let mut checkpoint_failed = false;
                    if crashed || gone {
                        while h.stats.checkpoint_running.load(Ordering::Acquire) {
                            tokio::time::sleep(Duration::from_millis(5)).await;
                        }
                        checkpoint_failed = h.stats.checkpoint_failed.load(Ordering::Acquire);
                    }
                    if checkpoint_failed {
                        failed_logs.record(
                            &name,
                            "a checkpoint failed while the tenant's actor was stopping after a panic",
                        );
                    }
                    // Poisoned for good by the close itself (its final checkpoint failed; a
                    // failed fdatasync of the log is in `failed_logs` already): refused until
                    // the restart, as after a failed checkpoint while open, since the state
                    // store's own fsync may be what failed. Except on a full disk (the tenant
                    // was poisoned by one, or less than 16 MiB are free): then nothing's fsync
                    // is in doubt, and the next call reopens it once there is room.
                    if !h.may_reopen()
                        && (h.stats.sync_failed.load(Ordering::Relaxed)
                            || !h.stats.no_space.load(Ordering::Relaxed)
                                && !crate::core::nearly_full(&wal_dir))
                    {
                        failed_logs.record(&name, "the tenant's checkpoint at its close failed");
                    }
                    cube_metrics::TENANTS_ACTIVE.dec();
                    if h.stats.poisoned.load(Ordering::Relaxed) {
                        cube_metrics::TENANTS_UNAVAILABLE.dec();
                    }
                    if crashed {
                        cube_metrics::TENANT_ACTOR_CRASHES.inc();
                        // (Its ERROR line was logged when the crash was found.)
                        tracing::debug!(tenant = %name, "crashed tenant closed");
                    } else {
                        cube_metrics::TENANTS_PASSIVATED.inc();
                        tracing::debug!(tenant = %name, "tenant passivated");
                    }
                }
                None => cube_metrics::TENANTS_UNAVAILABLE.dec(),
            }
        });
        let _ = close.await;
        true
    }

    /// Wait for one of `tenant`'s [`SCANS_PER_TENANT`] scan places (for a scan of its Region,
    /// Walk, Audit pages or per-cell Stats); hold it while the scan runs and, for a streamed
    /// page, until the page is sent. Taken by tenant name, without holding the tenant open
    /// meanwhile (a handle held through a long wait would keep a passivated tenant's state store
    /// locked against its reopen), and the same places across its passivations.
    pub async fn scan_permit(&self, tenant: &str) -> Option<tokio::sync::OwnedSemaphorePermit> {
        // The semaphore is never closed, so this always ends with a permit.
        self.scan_places.of(tenant).acquire_owned().await.ok()
    }

    /// The catalog the tenants' keys and policies are in (`None` in tests of the store alone).
    pub fn catalog(&self) -> Option<&Arc<Catalog>> {
        self.catalog.as_ref()
    }

    /// Passivate idle tenants every so often, and close failed tenants so that they reopen
    /// (about once a second, and at once when a tenant is poisoned reopenable), until the
    /// directory is dropped.
    pub fn start_janitor(self: &Arc<Self>) {
        let every =
            (self.config.idle_after / 4).clamp(Duration::from_millis(50), Duration::from_secs(10));
        self.start_janitor_every(every, every.min(REOPEN_FAILED_EVERY));
    }

    /// [`TenantDirectory::start_janitor`], passivating every `every` and looking for failed
    /// tenants every `tick` (tests set a long one, to see what a wake-up alone does).
    pub(crate) fn start_janitor_every(self: &Arc<Self>, every: Duration, tick: Duration) {
        let weak = Arc::downgrade(self);
        let wake = Arc::clone(&self.janitor_wake);
        // An idle pass closes its tenants one after another, each with a final fdatasync and
        // checkpoint (seconds on a slow disk, times hundreds of tenants idle together): it runs
        // as a task of its own, one at a time, so that failed and crashed tenants are still
        // closed for their reopen meanwhile (they waited for the whole pass).
        let idle_pass = Arc::new(std::sync::atomic::AtomicBool::new(false));
        tokio::spawn(async move {
            let mut idle_check = tokio::time::Instant::now();
            let mut last_pass = tokio::time::Instant::now();
            // Passes still to make at the wake-up gap: a woken pass can find the tenant with a
            // call in flight (the very call whose failure woke it, or a retry), and closes only
            // idle tenants.
            let mut quick_passes = 0;
            loop {
                if quick_passes > 0 {
                    quick_passes -= 1;
                } else {
                    tokio::select! {
                        () = tokio::time::sleep(tick) => {}
                        () = wake.notified() => quick_passes = JANITOR_WAKE_PASSES - 1,
                    }
                }
                if quick_passes > 0 {
                    // Tenants failing together (a full disk) are closed in one pass, and a
                    // pass that could not close one is not repeated at once.
                    tokio::time::sleep_until(last_pass + JANITOR_WAKE_GAP).await;
                }
                let Some(dir) = weak.upgrade() else { return };
                let (_, left) = dir.close_failed_counted().await;
                if left == 0 {
                    quick_passes = 0;
                }
                last_pass = tokio::time::Instant::now();
                if idle_check.elapsed() >= every && !idle_pass.swap(true, Ordering::AcqRel) {
                    idle_check = tokio::time::Instant::now();
                    // Cleared on drop: a pass that panicked does not end idle passes for good.
                    let running = crate::backend::FlagHeld(Arc::clone(&idle_pass));
                    tokio::spawn(async move {
                        let _running = running;
                        dir.passivate_idle().await;
                    });
                }
            }
        });
    }

    /// Close every tenant that a failed write poisoned (a full disk), whose actor crashed (a
    /// panic in a handler: see `TenantHandle::crashed`) or that failed to open, so
    /// its next call opens it afresh: recovery replays its log, and tells whether there is room
    /// again. Tenants poisoned by a failed fsync are left alone (see `passivate_claimed`).
    ///
    /// A tenant poisoned by a full disk stays open while its file system is still nearly full:
    /// open, it serves reads (its state holds everything acknowledged) and refuses writes with
    /// RESOURCE_EXHAUSTED. Reopened there, it would replay its log into the state store, whose
    /// flush fails on the full disk: it would come back read-only (`TenantCore::open`), having
    /// done the work for nothing, once a second.
    pub async fn close_failed(&self) -> usize {
        self.close_failed_counted().await.0
    }

    /// [`TenantDirectory::close_failed`]: (tenants closed, tenants it would have closed but
    /// could not, a call being in flight, say).
    async fn close_failed_counted(&self) -> (usize, usize) {
        // (name, slot, whether its actor crashed); weak references, as in the idle pass.
        let failed: Vec<(String, Weak<Slot>, bool)> = {
            let map = self.tenants.read().unwrap_or_else(|p| p.into_inner());
            map.iter()
                .filter_map(|(name, s)| {
                    let (close, crashed) = match s.opened.get() {
                        Some(Ok(h)) if h.crashed() => (h.may_reopen(), true),
                        Some(Ok(h)) => {
                            // On a full disk a reopen serves reads only, so it waits for room;
                            // unless the state lacks changes already acknowledged (their apply
                            // failed): the reopen's replay holds them, and reads wait for it.
                            let close = h.stats.reopenable.load(Ordering::Relaxed)
                                && (h.lags()
                                    || !(h.stats.no_space.load(Ordering::Relaxed)
                                        && crate::core::nearly_full(
                                            &self.config.data_dir.tenant_wal(name),
                                        )));
                            (close, false)
                        }
                        Some(Err(_)) => (
                            s.retry_at.get().is_none_or(|at| Instant::now() >= *at),
                            false,
                        ),
                        None => (false, false),
                    };
                    close.then(|| (name.clone(), Arc::downgrade(s), crashed))
                })
                .collect()
        };
        let (mut n, mut found) = (0, failed.len());
        for (name, slot, crashed) in failed {
            let Some(slot) = slot.upgrade() else {
                found -= 1; // closed meanwhile
                continue;
            };
            if self.passivate(&name, &slot, false).await {
                if crashed {
                    // The panic's message went to stderr (the default panic hook) just before.
                    tracing::error!(tenant = %name, "tenant actor stopped after a panic (a bug; see the panic message above); closed it, its next call reopens it from its log");
                } else {
                    tracing::info!(tenant = %name, "closed a failed tenant; its next call reopens it");
                }
                n += 1;
            }
        }
        (n, found - n)
    }

    /// Stop every tenant: answer or fail what is queued, final fdatasync and checkpoint. No
    /// tenant opens from here on (calls get UNAVAILABLE); opens and passivations already under
    /// way are waited for, so every tenant's log is closed when this returns. Returns the
    /// tenants whose close failed (their final fdatasync or checkpoint; logged as it happened),
    /// here or at an earlier close (a passivation) since the start, and those whose log failed
    /// for good while open, sorted: they recover from their logs at the next start, and a
    /// relaxed one may have lost changes it acknowledged inside its window.
    pub async fn shutdown(&self) -> Vec<String> {
        self.shutting_down.store(true, Ordering::SeqCst);
        let starting: Vec<Arc<Slot>> = {
            let map = self.tenants.read().unwrap_or_else(|p| p.into_inner());
            map.values().cloned().collect()
        };
        for slot in &starting {
            if slot.open_started.load(Ordering::SeqCst) {
                let _ = slot.ready.subscribe().wait_for(|done| *done).await;
            }
        }
        while self.closes_in_progress.load(Ordering::SeqCst) > 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // Taken again: a passivation under way above has taken its tenant out (and closed it),
        // and no passivation starts any more.
        let slots: Vec<Arc<Slot>> = {
            let map = self.tenants.read().unwrap_or_else(|p| p.into_inner());
            map.values().cloned().collect()
        };
        // Ask all tenants first so their final syncs run concurrently, then wait for each.
        let mut done = Vec::new();
        for slot in slots {
            let Some(Ok(handle)) = slot.opened.get() else {
                continue;
            };
            let (tx, rx) = oneshot::channel();
            handle.addr.do_send(Shutdown { done: tx });
            done.push((handle.tenant.to_string(), rx));
        }
        let mut failed = Vec::new();
        for (tenant, rx) in done {
            // A dropped sender: the actor stopped (a panic) before it could close its log.
            if !rx.await.unwrap_or(false) {
                failed.push(tenant);
            }
            cube_metrics::TENANTS_ACTIVE.dec();
        }
        // A passivation's failed close (a tenant no longer open) counts too: it used to end
        // in "stopped cleanly" and exit code 0.
        failed.extend(self.failed_logs.tenants());
        // So does a relaxed tenant whose failed log write lost changes it had acknowledged
        // (reopened since, it is no failed log; it used to end in "stopped cleanly").
        failed.extend(self.lost_acknowledged.tenants());
        failed.sort();
        failed.dedup();
        failed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_open_is_retried_after_a_delay_that_doubles_up_to_30_s() {
        let delays: Vec<u64> = (1..=8).map(|n| open_retry_delay(n).as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 30, 30, 30]);
        assert_eq!(open_retry_delay(u32::MAX), MAX_OPEN_RETRY_DELAY);
    }

    /// An open waits while a close of the same tenant is under way, and only then.
    #[tokio::test]
    async fn an_open_waits_for_a_close_of_its_tenant_in_progress() {
        let closing = Arc::new(Closing::default());
        let wait = Duration::from_millis(100);
        // Nothing closing: no wait.
        assert!(tokio::time::timeout(wait, closing.wait("t")).await.is_ok());
        let guard = closing.start("t");
        assert!(tokio::time::timeout(wait, closing.wait("t")).await.is_err());
        assert!(tokio::time::timeout(wait, closing.wait("u")).await.is_ok());
        let waiter = tokio::spawn({
            let closing = Arc::clone(&closing);
            async move { closing.wait("t").await }
        });
        drop(guard);
        tokio::time::timeout(wait, waiter).await.unwrap().unwrap();
        assert!(closing.0.lock().unwrap().is_empty());
    }
}
