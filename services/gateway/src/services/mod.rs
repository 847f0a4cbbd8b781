//! One file per gRPC service.

pub(crate) mod access;
pub(crate) mod admin;
pub(crate) mod cells;
pub(crate) mod handshake;
pub(crate) mod tenant;

use cube_store::{StoreError, TenantDirectory, TenantHandle};

use crate::ApiError;
use crate::principal::Principal;

/// The caller's tenant (opened if it is not open).
pub(crate) async fn tenant_of(
    directory: &TenantDirectory,
    principal: &Principal,
) -> Result<TenantHandle, ApiError> {
    Ok(directory.get(principal.tenant()).await?)
}

/// Run a read of a tenant's applied state on the blocking pool (it may touch disk).
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, ApiError> {
    match tokio::task::spawn_blocking(f).await {
        Ok(result) => result.map_err(ApiError::from),
        // A panic is a bug that the same read would hit again: not worth a retry.
        Err(e) if e.is_panic() => {
            tracing::error!(error = %e, "a read of a tenant's state panicked");
            Err(ApiError::Internal(
                "the read failed on the server (an internal error, logged there)",
            ))
        }
        Err(_) => Err(ApiError::Store(StoreError::Unavailable(
            "the read was cancelled (server shutting down); retry".into(),
        ))),
    }
}
