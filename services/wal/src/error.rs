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
    /// The state the log is replayed into has applied fewer records than the log's oldest
    /// segment starts after: the records in between are in neither. The log itself may be
    /// sound; the state is missing or older than it (`state/` deleted, or restored from an
    /// older copy than `wal/`), or segments were deleted by hand.
    #[error(
        "the state has applied records up to {applied}, but the wal's oldest segment {segment} \
         starts at record {first_seq}: records {}..{} are in neither (the state store is missing \
         or older than the wal, or wal segments were deleted: restore the tenant's state and wal \
         from one copy)",
        applied + 1,
        first_seq - 1
    )]
    StateBehindLog {
        segment: String,
        applied: u64,
        first_seq: u64,
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

/// The `op` of the failure a panicking syncer thread poisons its shard with: a bug, so for good.
pub(crate) const SYNCER_PANICKED: &str = "running the wal syncer";

impl WalError {
    /// What this failure of the syncer means for the shard's future: a failed fdatasync (of a
    /// segment or of the directory), or a panic of the syncer thread, poisons it for good; any
    /// other failed write leaves it reopenable (see [`crate::DurableEvent`]).
    pub fn after_syncer_failure(&self) -> crate::DurableEvent {
        match self {
            WalError::Io { op, source } if !self.is_failed_sync() && *op != SYNCER_PANICKED => {
                crate::DurableEvent::WriteFailed {
                    no_space: is_no_space(source),
                }
            }
            _ => crate::DurableEvent::Poisoned,
        }
    }

    /// An fdatasync (of a segment or of a directory) failed: the kernel may have dropped the
    /// pages it could not write, so nothing read back from them afterwards can be trusted.
    pub fn is_failed_sync(&self) -> bool {
        matches!(self, WalError::Io { op, .. } if op.starts_with("fdatasync") || op.starts_with("syncing"))
    }

    /// A write failed for lack of space (ENOSPC) or quota (EDQUOT), not a failed sync.
    pub fn is_no_space(&self) -> bool {
        matches!(self, WalError::Io { source, .. } if !self.is_failed_sync() && is_no_space(source))
    }

    pub(crate) fn io(op: &'static str) -> impl FnOnce(io::Error) -> WalError {
        move |source| WalError::Io { op, source }
    }
}

/// The file system is full (ENOSPC) or the quota is used up (EDQUOT).
pub fn is_no_space(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::StorageFull
        || e.kind() == io::ErrorKind::QuotaExceeded
        || matches!(e.raw_os_error(), Some(28 | 122))
}
