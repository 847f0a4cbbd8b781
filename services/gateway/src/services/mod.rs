//! One file per gRPC service.

pub(crate) mod access;
pub(crate) mod admin;
pub(crate) mod cells;
pub(crate) mod handshake;
pub(crate) mod tenant;

use std::pin::Pin;
use std::task::{Context, Poll};

use cube_store::{StateReader, StoreError, TenantDirectory, TenantHandle};
use futures::Stream;

use crate::ApiError;
use crate::principal::Principal;

/// The caller's tenant (opened if it is not open).
pub(crate) async fn tenant_of(
    directory: &TenantDirectory,
    principal: &Principal,
) -> Result<TenantHandle, ApiError> {
    Ok(directory.get(principal.tenant()).await?)
}

/// One of a tenant's scan places ([`TenantHandle::scan_permit`]), held while its scan runs and,
/// for a streamed page, by the stream ([`Held`]).
pub(crate) type ScanPermit = Option<tokio::sync::OwnedSemaphorePermit>;

/// Run a scan of `tenant`'s applied state on the blocking pool (it may touch disk), once one of
/// the tenant's scan places is free; returns the place with the result.
pub(crate) async fn blocking<T: Send + 'static>(
    tenant: &TenantHandle,
    f: impl FnOnce(&StateReader) -> Result<T, StoreError> + Send + 'static,
) -> Result<(T, ScanPermit), ApiError> {
    let permit = tenant.scan_permit().await;
    let reader = tenant.reader().clone();
    // The place goes with the scan: a caller that gives up (deadline, reset) drops this future,
    // but a blocking task cannot be stopped, so its place is freed only when it ends.
    match tokio::task::spawn_blocking(move || (f(&reader), permit)).await {
        Ok((result, permit)) => result.map(|t| (t, permit)).map_err(ApiError::from),
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

/// A response stream holding its tenant's scan place until the client has read it all (or gone):
/// the page it serves is built in full, and stays in memory until then.
pub(crate) struct Held<S> {
    inner: S,
    _permit: ScanPermit,
}

impl<S> Held<S> {
    pub(crate) fn new(inner: S, permit: ScanPermit) -> Held<S> {
        Held {
            inner,
            _permit: permit,
        }
    }
}

impl<S: Stream + Unpin> Stream for Held<S> {
    type Item = S::Item;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<S::Item>> {
        Pin::new(&mut self.inner).poll_next(cx)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.inner.size_hint()
    }
}
