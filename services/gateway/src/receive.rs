//! The bytes a connection's calls are receiving, held to `--max-connection-receive-bytes`.
//!
//! tonic reads a request message whole before it is decoded, and HTTP/2 flow control hands
//! the client more window as those bytes are read, so without a bound of its own one connection
//! could keep `--max-concurrent-streams` calls (1024 by default) each part-way through a message
//! of up to `--max-message-bytes` (4 MiB): gigabytes held for requests that may never finish.
//! This layer counts, per connection, the request bytes its calls have received and not yet
//! finished receiving (a call's count goes when its request has ended or its call is dropped),
//! and fails the body of a call whose next bytes would take the count over the limit with
//! RESOURCE_EXHAUSTED: the call is answered with it, and the other calls go on.
//!
//! Unauthenticated calls never get here: the auth layer answers them without reading their
//! bodies.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use http_body::{Body as HttpBody, Frame};
use tonic::Status;
use tonic::body::Body;

use crate::connection::ConnInfo;

/// The layer (see the module doc); `limit` is `--max-connection-receive-bytes`.
#[derive(Debug, Clone, Copy)]
pub struct ReceiveLayer {
    limit: usize,
}

impl ReceiveLayer {
    pub fn new(limit: usize) -> ReceiveLayer {
        ReceiveLayer { limit }
    }
}

impl<S> tower::Layer<S> for ReceiveLayer {
    type Service = Receive<S>;

    fn layer(&self, inner: S) -> Receive<S> {
        Receive {
            inner,
            limit: self.limit,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Receive<S> {
    inner: S,
    limit: usize,
}

impl<S> tower::Service<http::Request<Body>> for Receive<S>
where
    S: tower::Service<http::Request<Body>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let Some(receiving) = req
            .extensions()
            .get::<ConnInfo>()
            .map(|c| Arc::clone(&c.receiving))
        else {
            return self.inner.call(req);
        };
        let limit = self.limit;
        self.inner.call(req.map(|body| {
            Body::new(Counted {
                body,
                receiving,
                held: 0,
                limit,
            })
        }))
    }
}

/// A request body whose bytes count against its connection's [`ConnInfo::receiving`] until it
/// ends or is dropped.
struct Counted {
    body: Body,
    receiving: Arc<AtomicUsize>,
    /// What this body has added to `receiving`.
    held: usize,
    limit: usize,
}

impl Counted {
    fn release(&mut self) {
        if self.held > 0 {
            self.receiving.fetch_sub(self.held, Ordering::AcqRel);
            self.held = 0;
        }
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.release();
    }
}

impl HttpBody for Counted {
    type Data = bytes::Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<bytes::Bytes>, Status>>> {
        let this = &mut *self;
        match Pin::new(&mut this.body).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                let n = frame.data_ref().map_or(0, bytes::Bytes::len);
                if n > 0 {
                    let before = this.receiving.fetch_add(n, Ordering::AcqRel);
                    if before + n > this.limit {
                        this.receiving.fetch_sub(n, Ordering::AcqRel);
                        this.release();
                        return Poll::Ready(Some(Err(over_limit(this.limit))));
                    }
                    this.held += n;
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(None) => {
                this.release();
                Poll::Ready(None)
            }
            other => other,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// What a call whose request would take its connection over the limit is answered.
fn over_limit(limit: usize) -> Status {
    Status::resource_exhausted(format!(
        "this connection's calls are already receiving close to {limit} bytes of request \
         messages (--max-connection-receive-bytes); send fewer large messages at once on one \
         connection, or retry when those have arrived"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    fn counted(receiving: &Arc<AtomicUsize>, chunks: &[usize], limit: usize) -> Counted {
        let frames: Vec<Result<Frame<bytes::Bytes>, Status>> = chunks
            .iter()
            .map(|&n| Ok(Frame::data(bytes::Bytes::from(vec![0u8; n]))))
            .collect();
        Counted {
            body: Body::new(http_body_util::StreamBody::new(tokio_stream::iter(frames))),
            receiving: Arc::clone(receiving),
            held: 0,
            limit,
        }
    }

    #[tokio::test]
    async fn bytes_count_while_received_and_go_when_the_body_ends_or_is_dropped() {
        let receiving = Arc::new(AtomicUsize::new(0));
        let mut first = counted(&receiving, &[300, 300], 1000);
        first.frame().await.unwrap().unwrap();
        assert_eq!(receiving.load(Ordering::Acquire), 300);
        // A second body may take what is left, not more: its 500 would make 1100.
        let mut second = counted(&receiving, &[400, 500], 1000);
        second.frame().await.unwrap().unwrap();
        assert_eq!(receiving.load(Ordering::Acquire), 700);
        let refused = second.frame().await.unwrap().unwrap_err();
        assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
        // The refused body gives back what it held.
        assert_eq!(receiving.load(Ordering::Acquire), 300);
        // A body read to its end gives back all it held.
        first.frame().await.unwrap().unwrap();
        assert_eq!(receiving.load(Ordering::Acquire), 600);
        assert!(first.frame().await.is_none());
        assert_eq!(receiving.load(Ordering::Acquire), 0);
        // One dropped part-way through too.
        let mut third = counted(&receiving, &[900, 50], 1000);
        third.frame().await.unwrap().unwrap();
        assert_eq!(receiving.load(Ordering::Acquire), 900);
        drop(third);
        assert_eq!(receiving.load(Ordering::Acquire), 0);
    }
}
