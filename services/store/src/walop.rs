//! The payload of a WAL record: one prost-encoded [`WalOp`].
//!
//! NOTE: this is an on-disk format. Tags are never renumbered or reused; new operations get new
//! oneof tags and old binaries refuse records they do not understand instead of skipping them.

use prost::Message;

#[derive(Clone, PartialEq, Message)]
pub struct WalOp {
    #[prost(oneof = "Op", tags = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12")]
    pub op: Option<Op>,
    /// The audit entry recording this change, written in the same record (so atomically).
    #[prost(message, optional, tag = "15")]
    pub audit: Option<WalAudit>,
}

/// One audit-trail entry; `hash` chains it to the previous one (see cube_auth::audit_hash).
///
/// NOTE: stored entries are sent to clients as they are stored, as `cube.v1.AuditEntry`
/// (proto/cube/v1/tenant.proto): these fields and tags must stay that message's.
#[derive(Clone, PartialEq, Message)]
pub struct WalAudit {
    #[prost(uint64, tag = "1")]
    pub seq: u64,
    #[prost(int64, tag = "2")]
    pub ts_ms: i64,
    #[prost(string, tag = "3")]
    pub principal: String,
    #[prost(string, tag = "4")]
    pub op: String,
    #[prost(string, tag = "5")]
    pub detail: String,
    #[prost(bytes = "vec", tag = "6")]
    pub prev_hash: Vec<u8>,
    #[prost(bytes = "vec", tag = "7")]
    pub hash: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Op {
    /// Set a cell's value and version.
    #[prost(message, tag = "1")]
    Put(Put),
    /// Remove a cell.
    #[prost(message, tag = "2")]
    Del(Del),
    /// A security event with no data change (grant, key revoked, failed authentication...);
    /// the record's audit entry is the whole point.
    #[prost(message, tag = "3")]
    Event(Event),
    /// Store a program at a cell.
    #[prost(message, tag = "4")]
    Prog(Prog),
    /// A run of a program cell: its new run count and telemetry.
    #[prost(message, tag = "5")]
    Run(Run),
    /// Create a labelled edge.
    #[prost(message, tag = "6")]
    Link(Edge),
    /// Remove a labelled edge.
    #[prost(message, tag = "7")]
    Unlink(Edge),
    /// Make a cell immutable.
    #[prost(message, tag = "8")]
    Seal(Seal),
    /// Set a key's capabilities (`Access.Grant` / `Access.Revoke`). Changes no tenant state:
    /// applying (or replaying) it sets the key's capabilities in the catalog.
    #[prost(message, tag = "9")]
    Caps(KeyCaps),
    /// Revoke a key (`Admin.RevokeKey`, `cubed key revoke`). Changes no tenant state: applying
    /// (or replaying) it marks the key revoked in the catalog. A revocation is never undone.
    #[prost(message, tag = "10")]
    KeyRevoke(KeyRevoke),
    /// Create a key (`Admin.CreateKey`, `cubed key create`). Changes no tenant state: applying
    /// (or replaying) it adds the key to the catalog. Holds the key's secret, as the catalog
    /// does (both live in the data directory, mode 0700).
    #[prost(message, tag = "11")]
    KeyCreate(KeyCreate),
    /// Set the tenant's durability policy (`Admin.SetDurability`, `cubed tenant durability`).
    /// Changes no tenant state: applying (or replaying) it sets the policy in the catalog, and
    /// the tenant's log runs under it from the tenant's next open.
    #[prost(message, tag = "12")]
    Durability(Durability),
}

/// A durability policy: both fields 0 for `sync` (every record fdatasync'ed before it is
/// acknowledged), both non-zero for `relaxed`.
#[derive(Clone, PartialEq, Message)]
pub struct Durability {
    #[prost(uint64, tag = "1")]
    pub max_delay_ms: u64,
    #[prost(uint64, tag = "2")]
    pub max_records: u64,
}

impl Durability {
    pub fn from_policy(policy: cube_wal::SyncPolicy) -> Durability {
        match policy {
            cube_wal::SyncPolicy::Always => Durability {
                max_delay_ms: 0,
                max_records: 0,
            },
            cube_wal::SyncPolicy::Relaxed {
                max_delay,
                max_records,
            } => Durability {
                max_delay_ms: max_delay.as_millis() as u64,
                max_records,
            },
        }
    }

    /// `None` for a record that is neither (one field 0, the other not).
    pub fn policy(&self) -> Option<cube_wal::SyncPolicy> {
        match (self.max_delay_ms, self.max_records) {
            (0, 0) => Some(cube_wal::SyncPolicy::Always),
            (0, _) | (_, 0) => None,
            (ms, max_records) => Some(cube_wal::SyncPolicy::Relaxed {
                max_delay: std::time::Duration::from_millis(ms),
                max_records,
            }),
        }
    }
}

#[derive(Clone, PartialEq, Message)]
pub struct KeyCreate {
    #[prost(string, tag = "1")]
    pub key_id: String,
    /// 32 bytes.
    #[prost(bytes = "vec", tag = "2")]
    pub secret: Vec<u8>,
    /// As in [`KeyCaps`].
    #[prost(uint32, repeated, tag = "3")]
    pub capabilities: Vec<u32>,
}

#[derive(Clone, PartialEq, Message)]
pub struct KeyRevoke {
    #[prost(string, tag = "1")]
    pub key_id: String,
}

/// A key's whole capability set after a grant or revoke (absolute, so replaying it any number
/// of times, in log order, ends in the same catalog).
#[derive(Clone, PartialEq, Message)]
pub struct KeyCaps {
    #[prost(string, tag = "1")]
    pub key_id: String,
    /// 1 = read, 2 = write, 3 = admin (see [`caps_to_wire`]).
    #[prost(uint32, repeated, tag = "2")]
    pub capabilities: Vec<u32>,
}

/// NOTE: on-disk numbers of the capabilities in [`KeyCaps`]; never renumbered.
pub fn caps_to_wire(caps: &[crate::Capability]) -> Vec<u32> {
    caps.iter()
        .map(|c| match c {
            crate::Capability::Read => 1,
            crate::Capability::Write => 2,
            crate::Capability::Admin => 3,
        })
        .collect()
}

/// The inverse of [`caps_to_wire`]; `None` if a number is unknown.
pub fn caps_from_wire(wire: &[u32]) -> Option<Vec<crate::Capability>> {
    wire.iter()
        .map(|n| crate::Capability::from_wire(*n))
        .collect()
}

#[derive(Clone, PartialEq, Message)]
pub struct Event {}

#[derive(Clone, PartialEq, Message)]
pub struct WalCoord {
    #[prost(sint32, tag = "1")]
    pub x: i32,
    #[prost(sint32, tag = "2")]
    pub y: i32,
    #[prost(sint32, tag = "3")]
    pub z: i32,
}

#[derive(Clone, PartialEq, Message)]
pub struct Put {
    #[prost(message, optional, tag = "1")]
    pub coord: Option<WalCoord>,
    #[prost(bytes = "vec", tag = "2")]
    pub value: Vec<u8>,
    #[prost(uint64, tag = "3")]
    pub version: u64,
}

#[derive(Clone, PartialEq, Message)]
pub struct Del {
    #[prost(message, optional, tag = "1")]
    pub coord: Option<WalCoord>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Prog {
    #[prost(message, optional, tag = "1")]
    pub coord: Option<WalCoord>,
    #[prost(bytes = "vec", tag = "2")]
    pub program: Vec<u8>,
    #[prost(uint64, tag = "3")]
    pub version: u64,
}

#[derive(Clone, PartialEq, Message)]
pub struct Run {
    #[prost(message, optional, tag = "1")]
    pub coord: Option<WalCoord>,
    /// The cell's run count after this run (so replay sets it, never re-counts).
    #[prost(uint64, tag = "2")]
    pub run_count: u64,
    #[prost(int64, tag = "3")]
    pub ts_ms: i64,
    #[prost(string, tag = "4")]
    pub principal: String,
    /// SHA-256 of the run's input.
    #[prost(bytes = "vec", tag = "5")]
    pub input_digest: Vec<u8>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Edge {
    #[prost(message, optional, tag = "1")]
    pub from: Option<WalCoord>,
    #[prost(message, optional, tag = "2")]
    pub to: Option<WalCoord>,
    #[prost(string, tag = "3")]
    pub label: String,
}

#[derive(Clone, PartialEq, Message)]
pub struct Seal {
    #[prost(message, optional, tag = "1")]
    pub coord: Option<WalCoord>,
}
