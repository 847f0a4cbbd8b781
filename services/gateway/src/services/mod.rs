//! One file per gRPC service.

pub(crate) mod access;
pub(crate) mod admin;
pub(crate) mod cells;
pub(crate) mod handshake;
pub(crate) mod tenant;

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use cube_store::{StateReader, StoreError, TenantDirectory, TenantHandle};
use futures::Stream;
use tonic::Status;

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

/// Run a scan of the caller's tenant's applied state on the blocking pool (it may touch disk),
/// once one of the tenant's scan places is free; returns the place with the result. The tenant
/// is opened (or found open) only once the place is had, so a caller waiting for one holds
/// nothing of the tenant: not its state store, which a passivation and reopen would otherwise
/// wait for.
pub(crate) async fn blocking<T: Send + 'static>(
    directory: &TenantDirectory,
    principal: &Principal,
    f: impl FnOnce(&StateReader) -> Result<T, StoreError> + Send + 'static,
) -> Result<(T, ScanPermit), ApiError> {
    let permit = directory.scan_permit(principal.tenant()).await;
    let reader = tenant_of(directory, principal).await?.reader().clone();
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

/// A streamed page and the scan place it holds.
struct Page<S> {
    /// `None` once the page is sent, or dropped unread.
    items: Option<S>,
    permit: ScanPermit,
    /// The page was dropped for not being read in time: the stream ends with an error.
    expired: bool,
}

/// A response stream holding its tenant's scan place until the client has read it all (or gone),
/// for at most `read_limit` ([`ScanLimits::page_read`](super::ScanLimits)): the page it serves is
/// built in full and stays in memory until then. A client that does not read its page within
/// the limit (HTTP/2 flow control stops the server from sending more than the client's window)
/// loses it: a watchdog drops the page and frees the place, and the stream, if it is ever read
/// again, ends with ABORTED. Without the limit, a key with READ could hold all of its tenant's
/// places, and the built pages, for as long as its connection lives.
pub(crate) struct Held<S> {
    page: Arc<Mutex<Page<S>>>,
    watchdog: tokio::task::AbortHandle,
}

impl<S: Send + 'static> Held<S> {
    pub(crate) fn new(items: S, permit: ScanPermit, read_limit: Duration) -> Held<S> {
        let page = Arc::new(Mutex::new(Page {
            items: Some(items),
            permit,
            expired: false,
        }));
        let weak = Arc::downgrade(&page);
        let watchdog = tokio::spawn(async move {
            tokio::time::sleep(read_limit).await;
            if let Some(page) = weak.upgrade() {
                let mut page = page.lock().unwrap_or_else(|p| p.into_inner());
                if page.items.take().is_some() {
                    page.permit = None;
                    page.expired = true;
                    cube_metrics::SCAN_PAGES_EXPIRED.inc();
                }
            }
        })
        .abort_handle();
        Held { page, watchdog }
    }
}

impl<S> Drop for Held<S> {
    fn drop(&mut self) {
        self.watchdog.abort();
    }
}

impl<T, S: Stream<Item = Result<T, Status>> + Unpin> Stream for Held<S> {
    type Item = Result<T, Status>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let mut page = self.page.lock().unwrap_or_else(|p| p.into_inner());
        if std::mem::take(&mut page.expired) {
            return Poll::Ready(Some(Err(Status::aborted(
                "this page was not read in time: the server dropped it to give its scan place \
                 to other calls; ask for the page again (same page_token or from_seq) and read \
                 the stream as it arrives",
            ))));
        }
        let Some(items) = page.items.as_mut() else {
            return Poll::Ready(None);
        };
        let next = Pin::new(items).poll_next(cx);
        if let Poll::Ready(None) = next {
            // Sent in full: the place is free at once, not when the client has read the end.
            page.items = None;
            page.permit = None;
        }
        next
    }
}
