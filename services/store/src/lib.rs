//! cube-store: everything a tenant's data goes through below the gRPC layer.
//!
//! - [`TenantState`]: the plain state machine (validation against logical state, apply).
//! - [`TenantCore`]: state + WAL shard + writes waiting for durability (no actor types).
//! - [`TenantActor`]: the actix shell around a core; [`TenantDirectory`] starts one per tenant.
//! - [`Catalog`]: tenants and keys in sled.
//!
//! Nothing here knows about gRPC: errors are [`StoreError`] and the gateway maps them.

mod actor;
mod audit;
mod catalog;
mod core;
mod directory;
mod error;
mod layout;
mod runtime;
mod state;
mod walop;

pub use actor::TenantActor;
pub use audit::{AuditEntry, AuditLog};
pub use catalog::{Capability, Catalog, CatalogOpenError, KeyInfo, validate_tenant_name};
pub use core::TenantCore;
pub use directory::{DirectoryConfig, TenantDirectory, TenantHandle, record_event_offline};
pub use error::StoreError;
pub use layout::DataDir;
pub use state::{AppliedCells, Caller, CellView, Command, Coord, Reply, TenantState};
