//! The gateway's error type and its one mapping to `tonic::Status`. Codes are chosen on purpose;
//! messages are written for the caller and never carry io text or paths.

use cube_store::StoreError;
use tonic::Status;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Malformed request.
    #[error("{0}")]
    Invalid(String),
    /// Missing, wrong, stale or replayed credentials.
    #[error("{0}")]
    Unauthenticated(String),
    /// Authenticated, but the key lacks the capability.
    #[error("{0}")]
    PermissionDenied(String),
    /// Declared in the contract, not served yet.
    #[error("{0}")]
    Unimplemented(&'static str),
    /// A bug on the server's side (logged there); retrying will not help.
    #[error("{0}")]
    Internal(&'static str),
}

impl From<ApiError> for Status {
    fn from(e: ApiError) -> Status {
        match e {
            ApiError::Store(s) => match s {
                StoreError::InvalidArgument(m) => Status::invalid_argument(m),
                StoreError::FailedPrecondition(m) => Status::failed_precondition(m),
                StoreError::ResourceExhausted(m) => Status::resource_exhausted(m),
                StoreError::Unavailable(m) => Status::unavailable(m),
                StoreError::NotFound(m) => Status::not_found(m),
                StoreError::AlreadyExists(m) => Status::already_exists(m),
                StoreError::Unauthenticated(m) => Status::unauthenticated(m),
                StoreError::PermissionDenied(m) => Status::permission_denied(m),
                StoreError::DataLoss(m) => Status::data_loss(m),
            },
            ApiError::Invalid(m) => Status::invalid_argument(m),
            ApiError::Unauthenticated(m) => Status::unauthenticated(m),
            ApiError::PermissionDenied(m) => Status::permission_denied(m),
            ApiError::Unimplemented(m) => Status::unimplemented(m),
            ApiError::Internal(m) => Status::internal(m),
        }
    }
}
