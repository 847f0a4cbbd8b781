//! The store's error type. Every variant is written to be shown to a client: no paths, no io
//! text. Details for operators go to the log where the error is created.

/// Why a tenant operation failed.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum StoreError {
    /// The request itself is wrong (maps to INVALID_ARGUMENT).
    #[error("{0}")]
    InvalidArgument(String),
    /// The request is well-formed but the cell's state forbids it (FAILED_PRECONDITION).
    #[error("{0}")]
    FailedPrecondition(String),
    /// A bound was hit; retry later (RESOURCE_EXHAUSTED).
    #[error("{0}")]
    ResourceExhausted(String),
    /// The tenant cannot serve now: corrupt or poisoned storage, shutting down (UNAVAILABLE).
    #[error("{0}")]
    Unavailable(String),
    /// No such tenant, key, or cell where one is required (NOT_FOUND).
    #[error("{0}")]
    NotFound(String),
    /// Already exists (ALREADY_EXISTS).
    #[error("{0}")]
    AlreadyExists(String),
}
