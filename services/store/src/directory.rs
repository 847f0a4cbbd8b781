//! The tenant directory: tenant name -> running actor, started on first use.
//!
//! Opening a tenant (WAL recovery) runs on the blocking pool; concurrent first calls share one
//! open. A tenant that fails to open (corrupt WAL) stays failed with a clear error until the
//! server restarts, while every other tenant keeps serving.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, RwLock};

use actix::{Actor, Addr};
use cube_wal::WalOptions;
use tokio::sync::{OnceCell, oneshot};

use crate::StoreError;
use crate::actor::{Call, Durable, InFlightPermit, Responder, Shutdown, TenantActor};
use crate::audit::{AuditEntry, AuditLog};
use crate::core::TenantCore;
use crate::layout::DataDir;
use crate::runtime::ActorRuntime;
use crate::state::{AppliedCells, Caller, Command, Reply};

/// Settings every tenant shares.
#[derive(Debug, Clone)]
pub struct DirectoryConfig {
    pub data_dir: DataDir,
    pub wal: WalOptions,
    /// Largest cell value in bytes.
    pub max_value: usize,
    /// Requests one tenant may have queued or waiting for durability before further callers get
    /// RESOURCE_EXHAUSTED at once.
    pub mailbox_capacity: usize,
    /// Threads that run tenant actors.
    pub actor_threads: usize,
    /// Audit entries kept per tenant (the newest ones).
    pub audit_retention: usize,
}

/// How a caller reaches one tenant.
#[derive(Clone, Debug)]
pub struct TenantHandle {
    tenant: Arc<str>,
    addr: Addr<TenantActor>,
    mailbox_capacity: usize,
    /// Requests admitted and not yet answered (queued in the mailbox or waiting for fsync).
    in_flight: Arc<AtomicUsize>,
    /// The tenant's durable cells, for reads that need no trip through the actor.
    reader: AppliedCells,
    /// The tenant's durable audit trail, likewise.
    audit: AuditLog,
}

impl TenantHandle {
    /// Send `cmd` on behalf of `principal` and wait for the answer (for changes: until durable,
    /// with their audit entry). Reads are answered from the applied cells on the caller's
    /// thread.
    pub async fn call(&self, cmd: Command, principal: &str) -> Result<Reply, StoreError> {
        if let Command::Read { coord } = &cmd {
            return Ok(Reply::Read(self.reader.read(coord)));
        }
        let permit = self.admit()?;
        let (tx, rx) = oneshot::channel();
        // A stopped actor drops the message, and with it the responder: `rx` then errors.
        let caller = Caller {
            principal: principal.to_string(),
            ts_ms: now_ms(),
        };
        self.addr.do_send(Call {
            cmd,
            caller,
            reply: Responder { tx, permit },
        });
        rx.await.map_err(|_| stopped())?
    }

    /// Up to `limit` durable audit entries from `from_seq`, read without involving the actor.
    pub fn audit_page(&self, from_seq: u64, limit: usize) -> Vec<AuditEntry> {
        self.audit.page(from_seq, limit)
    }

    /// Requests of this tenant admitted and not yet answered.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }

    fn admit(&self) -> Result<InFlightPermit, StoreError> {
        let before = self.in_flight.fetch_add(1, Ordering::AcqRel);
        cube_metrics::MAILBOX_DEPTH.inc();
        let permit = InFlightPermit(Arc::clone(&self.in_flight));
        if before >= self.mailbox_capacity {
            return Err(StoreError::ResourceExhausted(format!(
                "tenant '{}' is busy: {} requests are already in flight; retry with backoff",
                self.tenant, self.mailbox_capacity
            )));
        }
        Ok(permit)
    }
}

/// Append one audit event to a tenant's log while no server runs (the CLI's offline path for
/// key and tenant changes). Returns once the record is durable.
pub fn record_event_offline(
    data_dir: &DataDir,
    tenant: &str,
    principal: &str,
    op: &str,
    detail: String,
) -> Result<(), StoreError> {
    let dir = data_dir.tenant_wal(tenant);
    let (mut core, _) = TenantCore::<()>::open(
        tenant,
        &dir,
        WalOptions::default(),
        usize::MAX,
        usize::MAX,
        None,
    )?;
    let caller = Caller {
        principal: principal.to_string(),
        ts_ms: now_ms(),
    };
    if let Some((_, Err(e))) = core.handle(
        Command::Event {
            op: op.into(),
            detail,
        },
        &caller,
        (),
    ) {
        return Err(e);
    }
    match core.take_wal().map(cube_wal::WalShard::close) {
        Some(Ok(_)) => Ok(()),
        _ => Err(StoreError::Unavailable(format!(
            "tenant '{tenant}': the audit event could not be synced"
        ))),
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

fn stopped() -> StoreError {
    StoreError::Unavailable(
        "the tenant stopped before answering (server shutting down); retry".into(),
    )
}

type Slot = Arc<OnceCell<Result<TenantHandle, StoreError>>>;

/// Tenant name -> actor.
pub struct TenantDirectory {
    config: DirectoryConfig,
    runtime: ActorRuntime,
    tenants: RwLock<HashMap<String, Slot>>,
}

impl std::fmt::Debug for TenantDirectory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TenantDirectory")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl TenantDirectory {
    pub fn new(config: DirectoryConfig) -> Result<TenantDirectory, StoreError> {
        let runtime = ActorRuntime::start(config.actor_threads)?;
        Ok(TenantDirectory {
            config,
            runtime,
            tenants: RwLock::new(HashMap::new()),
        })
    }

    /// The running actor of `tenant`, started (and its WAL recovered) on first use. The caller
    /// must already know the tenant exists (it authenticated as it).
    pub async fn get(&self, tenant: &str) -> Result<TenantHandle, StoreError> {
        // Hot path: a read lock and no allocation once the tenant is known.
        let known = {
            let map = self.tenants.read().unwrap_or_else(|p| p.into_inner());
            map.get(tenant).cloned()
        };
        let slot = match known {
            Some(slot) => slot,
            None => {
                let mut map = self.tenants.write().unwrap_or_else(|p| p.into_inner());
                Arc::clone(map.entry(tenant.to_string()).or_default())
            }
        };
        slot.get_or_init(|| async {
            let opened = self.open(tenant).await;
            match &opened {
                Ok(_) => cube_metrics::TENANTS_ACTIVE.inc(),
                Err(_) => cube_metrics::TENANTS_UNAVAILABLE.inc(),
            }
            opened
        })
        .await
        .clone()
    }

    async fn open(&self, tenant: &str) -> Result<TenantHandle, StoreError> {
        let dir = self.config.data_dir.tenant_wal(tenant);
        let wal = self.config.wal.clone();
        let max_value = self.config.max_value;
        let retention = self.config.audit_retention;
        let name = tenant.to_string();
        // The syncer reports to the actor, which does not exist until the WAL is open.
        let addr_slot: Arc<OnceLock<Addr<TenantActor>>> = Arc::new(OnceLock::new());
        let notify_slot = Arc::clone(&addr_slot);
        let notify = Box::new(move |event| {
            if let Some(addr) = notify_slot.get() {
                addr.do_send(Durable(event));
            }
        });
        let core = tokio::task::spawn_blocking(move || {
            TenantCore::open(&name, &dir, wal, max_value, retention, Some(notify))
        })
        .await
        .map_err(|_| StoreError::Unavailable(format!("tenant '{tenant}' failed to open")))??
        .0;
        let capacity = self.config.mailbox_capacity;
        let reader = core.state().reader();
        let audit = core.state().audit();
        let addr =
            TenantActor::start_in_arbiter(self.runtime.pick(), move |_| TenantActor::new(core));
        let _ = addr_slot.set(addr.clone());
        Ok(TenantHandle {
            tenant: tenant.into(),
            addr,
            mailbox_capacity: capacity,
            in_flight: Arc::new(AtomicUsize::new(0)),
            reader,
            audit,
        })
    }

    /// Stop every tenant: answer or fail what is queued, final fdatasync, close the WALs.
    pub async fn shutdown(&self) {
        let slots: Vec<Slot> = {
            let map = self.tenants.read().unwrap_or_else(|p| p.into_inner());
            map.values().cloned().collect()
        };
        // Ask all tenants first so their final syncs run concurrently, then wait for each.
        let mut done = Vec::new();
        for slot in slots {
            let Some(Ok(handle)) = slot.get() else {
                continue;
            };
            let (tx, rx) = oneshot::channel();
            handle.addr.do_send(Shutdown { done: tx });
            done.push(rx);
        }
        for rx in done {
            let _ = rx.await;
            cube_metrics::TENANTS_ACTIVE.dec();
        }
    }
}
