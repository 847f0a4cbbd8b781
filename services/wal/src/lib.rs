//! cube-wal: one write-ahead-log shard per tenant.
//!
//! Owns segment files, CRC32C record framing, group commit (one write + fdatasync per batch) and
//! recovery (torn tails zeroed, mid-log corruption refused). It knows nothing about tenants,
//! gRPC or async runtimes: callers get durability through a callback or [`WalShard::wait_durable`].
//! A [`SyncPolicy`] chooses between an fdatasync per batch and deferred fdatasyncs; segments
//! covered by a caller's checkpoint are deleted with [`WalShard::delete_segments_through`].

mod error;
pub mod failpoint;
mod record;
mod recovery;
mod segment;
mod shard;
#[cfg(test)]
mod tests;

pub use error::{WalError, is_no_space};
pub use recovery::RecoveryReport;
pub use segment::{
    SegmentName, SegmentSizing, find_segment, log_may_need_replay, remove_covered_log,
    replace_file_durably,
};
pub use shard::{
    DurableEvent, DurableNotify, SegmentDeleter, SyncPolicy, WalOptions, WalShard,
    create_dir_durably,
};

/// Receives each replayed record (sequence number, payload); an `Err` stops recovery.
pub type ReplayVisitor<'a> = dyn FnMut(u64, &[u8]) -> Result<(), String> + 'a;

/// Bytes of framing before each record's payload: `len u32 | crc32c u32 | seq u64`.
pub const RECORD_HEADER_LEN: usize = record::HEADER_LEN;
