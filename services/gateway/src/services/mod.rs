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

use cube_store::{Capability, StateReader, StoreError, TenantDirectory, TenantHandle};
use futures::Stream;
use tonic::Status;

use crate::ApiError;
use crate::auth_layer::active_key;
use crate::principal::Principal;

/// The caller's tenant (opened if it is not open).
pub(crate) async fn tenant_of(
    directory: &TenantDirectory,
    principal: &Principal,
) -> Result<TenantHandle, ApiError> {
    Ok(directory.get(principal.tenant()).await?)
}

/// One of a tenant's scan places ([`TenantDirectory::scan_permit`]), held while its scan runs and,
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
    // The wait for a place has no bound: the key may have been revoked, or lost READ, meanwhile.
    still_reads(directory, principal)?;
    let tenant = tenant_of(directory, principal).await?;
    tenant
        .check_rights(&principal.key.key_id, Capability::Read)
        .map_err(ApiError::from)?;
    tenant.caught_up().await.map_err(ApiError::from)?;
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

/// Whether the caller's key still exists unrevoked and with READ, as the catalog has it now
/// (every scan needs READ, checked when the call began).
fn still_reads(directory: &TenantDirectory, principal: &Principal) -> Result<(), ApiError> {
    let Some(catalog) = directory.catalog() else {
        return Ok(());
    };
    let key = active_key(catalog, principal.tenant(), &principal.key.key_id).map_err(|_| {
        ApiError::Unauthenticated(
            "the key this call authenticated with was revoked while the call waited for a scan \
             place; authenticate again"
                .into(),
        )
    })?;
    if !key.has(Capability::Read) {
        return Err(ApiError::PermissionDenied(format!(
            "key '{}' lost the Read capability while this call waited for a scan place",
            key.key_id
        )));
    }
    Ok(())
}

/// When a page's client last took something of it: an item from the page, or a piece of an item
/// (an answer's message goes to HTTP/2 in 64 KiB pieces, each taken only as the client's window
/// lets it: `crate::send`, which finds this in the response's extensions). Counted by the piece,
/// a slow reader of large cells is not taken for one that stopped: a 1 MiB cell read at under
/// 35 KiB/s took longer than the 30-s limit to count once.
#[derive(Debug, Clone)]
pub(crate) struct PageProgress(Arc<Mutex<tokio::time::Instant>>);

impl PageProgress {
    fn new(at: tokio::time::Instant) -> PageProgress {
        PageProgress(Arc::new(Mutex::new(at)))
    }

    /// The client took something now.
    pub(crate) fn touch(&self) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = tokio::time::Instant::now();
    }

    fn last(&self) -> tokio::time::Instant {
        *self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A streamed page and the scan place it holds.
struct Page<S> {
    /// `None` once the page is sent, or dropped unread.
    items: Option<S>,
    permit: ScanPermit,
    /// When the client last took something of it (or the page was built).
    progress: PageProgress,
    /// The page was dropped for not being read in time: the stream ends with an error.
    expired: bool,
}

/// A response stream holding its tenant's scan place until the page is sent in full (or the
/// stream is gone), as long as it keeps moving: the page it serves is built in full and stays in
/// memory until then. A page whose client takes nothing of it ([`PageProgress`]: an item, or
/// a piece of one) for `idle_limit`
/// ([`ScanLimits::page_read`](super::ScanLimits)), because its client does not read (HTTP/2 flow
/// control stops the server from sending more than the client's window), is dropped by a
/// watchdog, which frees its place; the stream, if it is ever read again, ends with ABORTED
/// after what had been sent. A slow reader that keeps reading is never cut off. Without the
/// limit, a key with READ could hold all of its tenant's places, and the built pages, for as
/// long as its connection lives.
pub(crate) struct Held<S> {
    page: Arc<Mutex<Page<S>>>,
    progress: PageProgress,
    watchdog: tokio::task::AbortHandle,
}

impl<S: Stream + Unpin + Send + 'static> Held<S> {
    pub(crate) fn new(items: S, permit: ScanPermit, idle_limit: Duration) -> Held<S> {
        let built = tokio::time::Instant::now();
        let progress = PageProgress::new(built);
        let page = Arc::new(Mutex::new(Page {
            items: Some(items),
            permit,
            progress: progress.clone(),
            expired: false,
        }));
        let weak = Arc::downgrade(&page);
        let watchdog = tokio::spawn(async move {
            // From the page's making, not from when this task first runs.
            let mut due = built + idle_limit;
            loop {
                tokio::time::sleep_until(due).await;
                let Some(page) = weak.upgrade() else {
                    return;
                };
                let mut page = page.lock().unwrap_or_else(|p| p.into_inner());
                let Some(items) = &page.items else {
                    return;
                };
                let last = page.progress.last();
                if last + idle_limit > tokio::time::Instant::now() {
                    due = last + idle_limit;
                    continue;
                }
                // Every item already handed to the transport: the page is sent, only its end
                // was not asked for yet (tonic's encoder returns a large item at once). Done,
                // not dropped.
                let sent = items.size_hint() == (0, Some(0));
                page.items = None;
                page.permit = None;
                if !sent {
                    page.expired = true;
                    cube_metrics::SCAN_PAGES_EXPIRED.inc();
                }
                return;
            }
        })
        .abort_handle();
        Held {
            page,
            progress,
            watchdog,
        }
    }

    /// A response streaming this page, its [`PageProgress`] in the extensions for the pieces'
    /// count.
    pub(crate) fn into_response(self) -> tonic::Response<Held<S>> {
        let progress = self.progress.clone();
        let mut response = tonic::Response::new(self);
        response.extensions_mut().insert(progress);
        response
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
        match next {
            Poll::Ready(Some(_)) => page.progress.touch(),
            Poll::Ready(None) => {
                // Sent in full: the place is free at once, not when the client has read the end.
                page.items = None;
                page.permit = None;
            }
            Poll::Pending => {}
        }
        next
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;
    use tokio::sync::Semaphore;

    const LIMIT: Duration = Duration::from_secs(30);

    /// A page of `n` items holding one of two places of `places`.
    async fn page(
        places: &Arc<Semaphore>,
        n: u32,
    ) -> Held<impl Stream<Item = Result<u32, Status>>> {
        let permit = Arc::clone(places).acquire_owned().await.ok();
        Held::new(tokio_stream::iter((0..n).map(Ok)), permit, LIMIT)
    }

    /// Let the watchdog run at the current (paused) time.
    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_page_nobody_reads_is_dropped_after_the_limit_and_ends_aborted() {
        let places = Arc::new(Semaphore::new(2));
        let mut held = page(&places, 3).await;
        assert_eq!(held.next().await.unwrap().unwrap(), 0);
        tokio::time::advance(LIMIT - Duration::from_secs(1)).await;
        settle().await;
        assert_eq!(places.available_permits(), 1, "dropped before the limit");
        tokio::time::advance(Duration::from_secs(2)).await;
        settle().await;
        assert_eq!(places.available_permits(), 2, "the place was not freed");
        let end = held.next().await.unwrap().unwrap_err();
        assert_eq!(end.code(), tonic::Code::Aborted);
        assert!(held.next().await.is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_reader_keeps_its_page_as_long_as_it_reads() {
        let places = Arc::new(Semaphore::new(2));
        let mut held = page(&places, 5).await;
        for i in 0..5 {
            // Four times the limit in all, but never the limit without an item taken.
            tokio::time::advance(LIMIT - Duration::from_secs(1)).await;
            settle().await;
            assert_eq!(held.next().await.unwrap().unwrap(), i);
        }
        assert!(held.next().await.is_none());
        assert_eq!(places.available_permits(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_page_taken_in_full_frees_its_place_and_completes() {
        let places = Arc::new(Semaphore::new(2));
        // Every item taken, the end not asked for yet (a transport that buffers): the
        // watchdog treats it as sent, not dropped.
        let mut held = page(&places, 2).await;
        assert_eq!(held.next().await.unwrap().unwrap(), 0);
        assert_eq!(held.next().await.unwrap().unwrap(), 1);
        tokio::time::advance(LIMIT + Duration::from_secs(1)).await;
        settle().await;
        assert_eq!(places.available_permits(), 2);
        assert!(held.next().await.is_none());
        // Read to its end at once: the place is back without waiting for the watchdog.
        let mut quick = page(&places, 1).await;
        assert_eq!(places.available_permits(), 1);
        assert_eq!(quick.next().await.unwrap().unwrap(), 0);
        assert!(quick.next().await.is_none());
        assert_eq!(places.available_permits(), 2);
    }
}
