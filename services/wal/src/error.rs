//! The WAL's error type. Messages name segment files, never full paths: callers may show them to
//! operators, and the gateway never forwards them to clients verbatim.

use std::io;

/// Everything that can go wrong in a shard.
#[derive(Debug, thiserror::Error)]
pub enum WalError {
    /// An I/O operation failed; `op` says which one.
    #[error("wal i/o failed during {op}: {source}")]
    Io {
        op: &'static str,
        #[source]
        source: io::Error,
    },
    /// A bad record is followed by valid ones, or the log has a gap: not a torn tail, so the
    /// shard refuses to open until an operator decides what to do.
    #[error("wal corrupt in segment {segment} at offset {offset}: {detail}")]
    Corrupt {
        segment: String,
        offset: u64,
        detail: String,
    },
    /// An earlier write or fdatasync failed. The shard accepts nothing until it is reopened:
    /// retrying an fsync and pretending the data is safe is how databases lose data.
    #[error("wal shard is poisoned after a failed write or fsync")]
    Poisoned,
    /// The shard is shutting down.
    #[error("wal shard is closed")]
    Closed,
    /// A record larger than the shard's maximum.
    #[error("wal record of {len} bytes exceeds the maximum of {max}")]
    RecordTooLarge { len: usize, max: usize },
    /// The replay visitor refused a record.
    #[error("wal replay of record {seq} failed: {detail}")]
    Replay { seq: u64, detail: String },
}

impl WalError {
    pub(crate) fn io(op: &'static str) -> impl FnOnce(io::Error) -> WalError {
        move |source| WalError::Io { op, source }
    }
}
