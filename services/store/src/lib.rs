//! cube-store: everything a tenant's data goes through below the gRPC layer.
//!
//! - [`TenantState`]: the plain state machine (validation against logical state, apply), over
//!   a [`StateBackend`] (an fjall keyspace per tenant; sled before it, see docs/benchmarks.md).
//! - [`TenantCore`]: state + WAL shard + writes waiting for durability (no actor types).
//! - [`TenantActor`]: the actix shell around a core; [`TenantDirectory`] starts one per tenant.
//! - [`Catalog`]: tenants and keys in sled.
//!
//! Nothing here knows about gRPC: errors are [`StoreError`] and the gateway maps them.

mod actor;
mod audit;
mod backend;
mod catalog;
mod catalog_journal;
mod core;
mod deletion;
mod directory;
mod error;
mod keys;
mod layout;
mod morton;
mod runtime;
mod space;
mod state;
mod walop;

pub use actor::TenantActor;
pub use audit::{AuditEntry, EncodedAuditEntry};
pub use backend::{
    BackendError, BatchOp, FjallBackend, MemBackend, RangeIter, SledBackend, StateBackend,
    StateRead,
};
pub use catalog::{
    Capability, Catalog, CatalogOpenError, KeyInfo, TenantSummary, validate_tenant_name,
};
pub use core::{
    CheckpointPolicy, CoreConfig, EarlyAnswers, TenantCore, TenantSet, check_key_id,
    describe_policy,
};
pub use cube_wal::SyncPolicy;
pub use deletion::{remove_deleted_files, remove_tenant_files};
pub use directory::{
    DELETION_CLOSE_WAIT, DirectoryConfig, LogStats, OPERATOR, TenantDirectory, TenantHandle,
    open_offline, run_offline,
};
pub use error::{StoreError, clipped};
pub use keys::{AuditHead, Totals};
pub use layout::DataDir;
pub use space::SpaceGuard;
pub use state::{
    Caller, CellView, Command, Coord, Effect, Hint, MAX_LABEL_BYTES, MAX_WALK_DEPTH,
    MAX_WALK_LABEL_ENTRIES, Prepared, RegionPage, Reply, RunRecord, StateLimits, StateReader,
    TenantState, check_region, corrupt_message, walk_labels,
};
