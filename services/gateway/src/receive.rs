//! The request messages a connection's calls are receiving, held to
//! `--max-connection-receive-bytes`.
//!
//! tonic reads a request message whole before it decodes it: once a message's 5-byte gRPC
//! prefix is in, it sets aside a buffer of the length the prefix declares, and HTTP/2 flow
//! control hands the client more window as bytes are read. Without a bound of its own, one
//! connection could keep `--max-concurrent-streams` calls (1024 by default) each part-way
//! through a message of up to `--max-message-bytes` (4 MiB): gigabytes set aside for requests
//! that may never finish.
//!
//! This layer reads each request body's message prefixes as the body passes to tonic. A
//! message counts against its connection's [`ConnInfo::receiving`] at its declared size (prefix
//! included) from its prefix on; a message that would take the count over the limit fails the
//! body with RESOURCE_EXHAUSTED, which tonic answers the call with, and the connection's other
//! calls go on. A body's first message counts until the body ends (or its call is dropped):
//! tonic decodes a unary request's message and then reads on to the end of the body before the
//! handler runs, so a client that sends a whole message and never ends its stream keeps it in
//! memory. Any later message of the body (a stream's; a unary call's extra ones, which tonic
//! throws away) counts from its prefix until its last byte has passed, and after that for as
//! much as it is larger than every message before it: tonic's buffer keeps the room of the
//! body's largest message until the body ends (a client that sent a small message, then one of
//! 4 MiB, and never ended its stream held 4 MiB with some 25 bytes counted). A message declared
//! larger than the largest any method takes (`--max-message-bytes`, or 16 KiB) is not counted: tonic refuses
//! it on its prefix (INVALID_ARGUMENT, `crate::oversize`) without setting anything aside.
//!
//! Calls the auth layer refuses never get here (it answers them without reading their bodies);
//! the services open to everyone (the handshake, health, reflection) do, with messages of at
//! most 16 KiB. They are also held to [`OPEN_CALLS_PER_CONNECTION`] at once per connection,
//! from the call's start until both its request body and its answer have ended: a caller that
//! has not authenticated cannot make the server keep a thousand part-sent messages (and tonic's
//! buffer for each) on one connection, nor a thousand answers it does not read (a reflection
//! stream whose client's window is closed holds its answers in the server's memory; counted
//! only until its request ended, one connection could hold ~100 MB of them). A call past that
//! count is answered RESOURCE_EXHAUSTED at once, by this layer itself (its service never runs).

use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame};
use tonic::Status;
use tonic::body::Body;

use crate::connection::ConnInfo;
use crate::principal::Principal;

/// A gRPC message's prefix: a compression flag and a big-endian 32-bit length.
pub const PREFIX_LEN: usize = 5;

/// Calls that need no authentication (the handshake, health, reflection) whose request bodies
/// one connection may have open at once (see the module doc).
pub const OPEN_CALLS_PER_CONNECTION: usize = 16;

/// What one connection's calls are receiving (see the module doc).
#[derive(Debug, Default)]
pub struct Receiving {
    /// Bytes of request messages, each counted at its declared size.
    pub bytes: AtomicUsize,
    /// Calls needing no authentication whose request bodies have not ended.
    pub open_calls: AtomicUsize,
}

/// The layer (see the module doc).
#[derive(Debug, Clone, Copy)]
pub struct ReceiveLayer {
    limits: Limits,
}

#[derive(Debug, Clone, Copy)]
struct Limits {
    /// `--max-connection-receive-bytes`.
    per_connection: usize,
    /// The largest message any method takes: larger ones are tonic's to refuse.
    message: usize,
}

impl ReceiveLayer {
    /// `largest_message`: the largest request message any method takes.
    pub fn new(per_connection: usize, largest_message: usize) -> ReceiveLayer {
        ReceiveLayer {
            limits: Limits {
                per_connection,
                message: largest_message,
            },
        }
    }
}

impl<S> tower::Layer<S> for ReceiveLayer {
    type Service = Receive<S>;

    fn layer(&self, inner: S) -> Receive<S> {
        Receive {
            inner,
            limits: self.limits,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Receive<S> {
    inner: S,
    limits: Limits,
}

impl<S> tower::Service<http::Request<Body>> for Receive<S>
where
    S: tower::Service<http::Request<Body>, Response = http::Response<Body>>,
    S::Future: Unpin,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = futures::future::Either<
        std::future::Ready<Result<http::Response<Body>, S::Error>>,
        Answered<S::Future>,
    >;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        // Every connection of the network listener carries its `ConnInfo`.
        let Some(receiving) = req
            .extensions()
            .get::<ConnInfo>()
            .map(|c| Arc::clone(&c.receiving))
        else {
            return futures::future::Either::Right(Answered {
                inner: self.inner.call(req),
                slot: None,
            });
        };
        // The auth layer, outside this one, has put a principal on every call it authenticated;
        // one without needs no authentication.
        let slot = if req.extensions().get::<Principal>().is_some() {
            None
        } else if take_open_call(&receiving.open_calls) {
            Some(Arc::new(OpenSlot {
                receiving: Arc::clone(&receiving),
                refused: OnceLock::new(),
            }))
        } else {
            // Answered here, not by failing the call's body: a streaming service (reflection)
            // has sent its response headers before it reads the body, and tonic-reflection
            // drops a request stream's error, ending the stream OK with no answer.
            cube_metrics::REQUEST_RECEIVE_REFUSED.inc();
            return futures::future::Either::Left(std::future::ready(Ok(
                too_many_open_calls().into_http()
            )));
        };
        let limits = self.limits;
        let open = slot.clone();
        futures::future::Either::Right(Answered {
            inner: self
                .inner
                .call(req.map(|body| Body::new(Counted::new(body, receiving, limits, open)))),
            slot,
        })
    }
}

/// The future of [`Receive`]: the wrapped service's, whose answer's body holds the call's
/// [`OpenSlot`], if it has one, until it is dropped.
pub struct Answered<F> {
    inner: F,
    slot: Option<Arc<OpenSlot>>,
}

impl<F, E> std::future::Future for Answered<F>
where
    F: std::future::Future<Output = Result<http::Response<Body>, E>> + Unpin,
{
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let response = std::task::ready!(Pin::new(&mut this.inner).poll(cx))?;
        Poll::Ready(Ok(match this.slot.take() {
            None => response,
            Some(slot) => response.map(|body| Body::new(Holding { body, slot })),
        }))
    }
}

/// One of a connection's [`OPEN_CALLS_PER_CONNECTION`] places, given back when the last of its
/// call's request body and answer lets go of it.
pub struct OpenSlot {
    receiving: Arc<Receiving>,
    /// Why a message of the call's request body was refused, if one was: its answer ends with
    /// it (see [`Holding`]).
    refused: OnceLock<Status>,
}

impl Drop for OpenSlot {
    fn drop(&mut self) {
        self.receiving.open_calls.fetch_sub(1, Ordering::AcqRel);
    }
}

/// An answer's body holding its call's [`OpenSlot`]. If a message of the call's request body
/// was refused (by this layer, or by tonic for its size), an answer that would end OK ends with
/// that refusal instead: a unary service answers the body's error itself, but tonic-reflection
/// drops a request stream's error and ends its answer OK, which would tell its client that
/// nothing went wrong.
struct Holding {
    body: Body,
    slot: Arc<OpenSlot>,
}

impl HttpBody for Holding {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled
            && let Some(trailers) = frame.trailers_ref()
            && let Some(refused) = self.slot.refused.get()
            && trailers.get("grpc-status").is_none_or(|code| code == "0")
        {
            let mut instead = http::HeaderMap::new();
            if refused.add_header(&mut instead).is_ok() {
                return Poll::Ready(Some(Ok(Frame::trailers(instead))));
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// Count one more open call against its connection if there is room.
fn take_open_call(open_calls: &AtomicUsize) -> bool {
    open_calls
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < OPEN_CALLS_PER_CONNECTION).then_some(n + 1)
        })
        .is_ok()
}

/// A request body whose messages count against its connection's [`ConnInfo::receiving`] (see
/// the module doc).
struct Counted {
    body: Body,
    receiving: Arc<Receiving>,
    limits: Limits,
    /// An open call's place, let go of when the body ends (its answer may hold it longer).
    open: Option<Arc<OpenSlot>>,
    /// What the message being received counts for (0 between messages, or for one not counted).
    held: usize,
    /// What the largest message of the body counts for once it has arrived, until the body
    /// ends.
    kept: usize,
    /// Bytes of the message being received still to come after its prefix.
    remaining: usize,
    /// The next prefix, as far as it has arrived.
    prefix: [u8; PREFIX_LEN],
    prefix_seen: usize,
    /// A message was refused: the body yields nothing more.
    refused: bool,
}

impl Counted {
    fn new(
        body: Body,
        receiving: Arc<Receiving>,
        limits: Limits,
        open: Option<Arc<OpenSlot>>,
    ) -> Counted {
        Counted {
            body,
            receiving,
            limits,
            open,
            held: 0,
            kept: 0,
            remaining: 0,
            prefix: [0; PREFIX_LEN],
            prefix_seen: 0,
            refused: false,
        }
    }

    /// Count `n` more bytes against the connection if they fit.
    fn take(&self, n: usize) -> bool {
        let fits = self
            .receiving
            .bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |now| {
                now.checked_add(n)
                    .filter(|&t| t <= self.limits.per_connection)
            })
            .is_ok();
        if fits {
            cube_metrics::REQUEST_BYTES_RECEIVING.add(n as i64);
        }
        fits
    }

    fn give_back(&self, n: usize) {
        if n > 0 {
            self.receiving.bytes.fetch_sub(n, Ordering::AcqRel);
            cube_metrics::REQUEST_BYTES_RECEIVING.sub(n as i64);
        }
    }

    /// The message being received has arrived: the body's largest so far stays counted until
    /// the body ends, the rest no longer counts. tonic reserves room for each message's declared
    /// length in one buffer, which keeps the room of the largest until the request stream ends
    /// (it only advances past a decoded message), also for a unary call's extra messages, which
    /// it reads on to the end and throws away.
    fn arrived(&mut self) {
        let held = std::mem::take(&mut self.held);
        let kept = self.kept.max(held);
        self.give_back(self.kept + held - kept);
        self.kept = kept;
    }

    /// The body has ended, failed or been dropped: nothing of it counts any more.
    fn release_all(&mut self) {
        let n = std::mem::take(&mut self.held) + std::mem::take(&mut self.kept);
        self.give_back(n);
        self.open = None;
    }

    /// Follow the messages through `data`: count each at its prefix, release it at its end.
    fn follow(&mut self, mut data: &[u8]) -> Result<(), Status> {
        while !data.is_empty() {
            if self.remaining > 0 {
                let n = self.remaining.min(data.len());
                self.remaining -= n;
                data = &data[n..];
                if self.remaining == 0 {
                    self.arrived();
                }
                continue;
            }
            let n = (PREFIX_LEN - self.prefix_seen).min(data.len());
            self.prefix[self.prefix_seen..self.prefix_seen + n].copy_from_slice(&data[..n]);
            self.prefix_seen += n;
            data = &data[n..];
            if self.prefix_seen < PREFIX_LEN {
                break;
            }
            self.prefix_seen = 0;
            let [_, a, b, c, d] = self.prefix;
            let len = u32::from_be_bytes([a, b, c, d]) as usize;
            self.remaining = len;
            if len > crate::OPEN_MESSAGE_BYTES
                && let Some(open) = &self.open
            {
                // tonic refuses it (every open method takes at most this much); the answer
                // ends with that refusal even where the service drops it (see [`Holding`]).
                let _ = open.refused.set(crate::oversize::over_method_limit(
                    crate::OPEN_MESSAGE_BYTES,
                ));
            }
            if len <= self.limits.message {
                let size = PREFIX_LEN + len;
                if !self.take(size) {
                    cube_metrics::REQUEST_RECEIVE_REFUSED.inc();
                    return Err(over_limit(self.limits.per_connection));
                }
                self.held = size;
            }
            if len == 0 {
                self.arrived();
            }
        }
        Ok(())
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.release_all();
    }
}

impl HttpBody for Counted {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = &mut *self;
        if this.refused {
            return Poll::Ready(None);
        }
        let polled = Pin::new(&mut this.body).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref()
                    && let Err(refused) = this.follow(data)
                {
                    this.refused = true;
                    if let Some(open) = &this.open {
                        let _ = open.refused.set(refused.clone());
                    }
                    this.release_all();
                    return Poll::Ready(Some(Err(refused)));
                }
                if frame.is_trailers() {
                    // Trailers end a request body.
                    this.release_all();
                }
            }
            Poll::Ready(Some(Err(_)) | None) => this.release_all(),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// What a call whose request message does not fit its connection's limit is answered.
fn over_limit(limit: usize) -> Status {
    Status::resource_exhausted(format!(
        "this connection's calls are already receiving close to {limit} bytes of request \
         messages (--max-connection-receive-bytes); send fewer large messages at once on one \
         connection, or retry when those have arrived"
    ))
}

/// What a call needing no authentication is answered when its connection has
/// [`OPEN_CALLS_PER_CONNECTION`] such calls receiving already.
fn too_many_open_calls() -> Status {
    Status::resource_exhausted(format!(
        "this connection already has {OPEN_CALLS_PER_CONNECTION} calls open that need no \
         authentication (handshake, health, reflection) whose requests or answers have not \
         ended; end those first (read their answers), or use another connection"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    /// A gRPC message of `len` bytes, its prefix included.
    fn message(len: usize) -> Vec<u8> {
        let mut m = vec![0u8];
        m.extend_from_slice(&(len as u32).to_be_bytes());
        m.extend(std::iter::repeat_n(7u8, len));
        m
    }

    /// A body sending `bytes` in pieces of the given lengths.
    fn counted(receiving: &Arc<Receiving>, bytes: &[u8], pieces: &[usize]) -> Counted {
        let mut frames = Vec::new();
        let mut at = 0;
        for &n in pieces {
            frames.push(Ok::<_, Status>(Frame::data(Bytes::copy_from_slice(
                &bytes[at..at + n],
            ))));
            at += n;
        }
        assert_eq!(at, bytes.len());
        let limits = Limits {
            per_connection: 1000,
            message: 800,
        };
        Counted::new(
            Body::new(http_body_util::StreamBody::new(tokio_stream::iter(frames))),
            Arc::clone(receiving),
            limits,
            None,
        )
    }

    fn now(receiving: &Receiving) -> usize {
        receiving.bytes.load(Ordering::Acquire)
    }

    #[tokio::test]
    async fn a_first_message_counts_from_its_prefix_until_its_body_ends() {
        let receiving = Arc::new(Receiving::default());
        // The prefix split over two frames, then the message in two parts.
        let one = message(300);
        let mut first = counted(&receiving, &one, &[3, 2, 100, 200]);
        first.frame().await.unwrap().unwrap();
        assert_eq!(now(&receiving), 0, "half a prefix declares nothing");
        first.frame().await.unwrap().unwrap();
        assert_eq!(now(&receiving), 305, "counted whole at its prefix");
        first.frame().await.unwrap().unwrap();
        assert_eq!(now(&receiving), 305);
        // Another call's message fits only in what is left: 305 + 605 fits 1000, + 105 not.
        let mut held = counted(&receiving, &message(600), &[5, 600]);
        held.frame().await.unwrap().unwrap();
        assert_eq!(now(&receiving), 910);
        let mut refused = counted(&receiving, &message(100), &[105]);
        let status = refused.frame().await.unwrap().unwrap_err();
        assert_eq!(status.code(), tonic::Code::ResourceExhausted);
        assert_eq!(now(&receiving), 910, "a refused message counts for nothing");
        assert!(
            refused.frame().await.is_none(),
            "a refused body yields nothing more"
        );
        // Arrived whole, a body's first message still counts until the body ends: tonic keeps
        // it until then.
        first.frame().await.unwrap().unwrap();
        assert_eq!(now(&receiving), 910);
        assert!(first.frame().await.is_none());
        assert_eq!(now(&receiving), 605);
        // A body dropped part-way gives back what it held.
        drop(held);
        assert_eq!(now(&receiving), 0);
    }

    #[tokio::test]
    async fn later_messages_of_a_body_count_until_they_arrive_and_oversized_ones_not_at_all() {
        let receiving = Arc::new(Receiving::default());
        // Three messages of 400 in one stream: each fits alone, all three would not.
        let mut three = message(400);
        three.extend(message(400));
        three.extend(message(400));
        let mut body = counted(&receiving, &three, &[200, 405, 300, 310]);
        let mut seen = Vec::new();
        while let Some(frame) = body.frame().await {
            frame.unwrap();
            seen.push(now(&receiving));
        }
        // The first stays counted until the end; each later one from its prefix to its end.
        assert_eq!(seen, [405, 810, 810, 405]);
        assert_eq!(now(&receiving), 0, "the body's end gives back the first");
        // A small message, then a larger one (a unary call's extra message, which tonic reads
        // and throws away but whose room its buffer keeps): the larger counts until the end.
        let mut growing = message(10);
        growing.extend(message(400));
        let mut body = counted(&receiving, &growing, &[15, 405]);
        body.frame().await.unwrap().unwrap();
        assert_eq!(now(&receiving), 15);
        body.frame().await.unwrap().unwrap();
        assert_eq!(
            now(&receiving),
            405,
            "the larger message's room was given back"
        );
        assert!(body.frame().await.is_none());
        assert_eq!(now(&receiving), 0);
        // Declared over the message limit: tonic refuses it on its prefix; nothing is counted.
        let mut big = vec![0u8];
        big.extend_from_slice(&5000u32.to_be_bytes());
        big.extend([1u8; 10]);
        let mut oversized = counted(&receiving, &big, &[15]);
        oversized.frame().await.unwrap().unwrap();
        assert_eq!(now(&receiving), 0);
    }
}
