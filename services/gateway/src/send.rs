//! The answers (unary ones, and streamed pages' messages) a connection's client has not read
//! yet, held to `--max-connection-send-bytes`.
//!
//! hyper takes a unary answer's whole encoded message from tonic as soon as the handler has
//! returned, and keeps it until HTTP/2 flow control lets it go out: a client that keeps its
//! calls open but stops granting window (or grants a byte at a time) leaves each answer in the
//! server's memory. Without a bound of its own, one connection could hold
//! `--max-concurrent-streams` answers (1024 by default) of a `Read` of the largest value each.
//!
//! This layer takes each unary answer's encoded message from tonic itself, before hyper sees
//! the response, and hands it on in pieces of [`PIECE_BYTES`], as hyper asks for them. The
//! message counts against its connection's [`ConnInfo::sending`] until the socket has taken all
//! of it: the pieces are cut from a [`Bytes`] whose owner gives the message's count back when
//! the last handle on any part of it is dropped, which h2 does once it has written a piece's
//! last byte to the socket (or dropped it with its stream or connection). That is also when
//! the message's memory is freed (every piece shares tonic's buffer), so a client that leaves
//! one byte of each answer unsent holds it counted whole. The count covers what waits in hyper
//! and in h2's send buffers (up to ~464 KiB a stream, as far as the client's window reaches:
//! a client that opens large windows and then reads its socket slowly); only what the kernel's
//! socket buffer took is outside it. Then:
//!
//! - the answer of a call that only reads (`Cells.Read`, `Cells.Walk`, `Tenant.Stats`) that
//!   would take the count over the limit is replaced by RESOURCE_EXHAUSTED, unless nothing else
//!   of the connection is held (so any answer can be sent to a client that reads);
//! - a unary `cube.v1` call arriving while its connection's count is over the limit is
//!   answered RESOURCE_EXHAUSTED at once, before its handler runs: a change's answer is never
//!   replaced after the change was made, so the calls that would add to the count are refused
//!   before they run instead;
//! - a `Cells.Run`, whose answer returns its program (up to `--max-value-bytes`), reserves room
//!   for the largest answer when it arrives, checked and counted in one step, and is refused
//!   before it runs if that room would take the count over the limit (unless nothing is held);
//!   its answer takes the room's place. Without it, Runs in progress at once all passed the
//!   look at the count before any of their answers was in it. Other changes answer a few
//!   bytes, which may take the count a little past the limit.
//!
//! - a streamed page (`Cells.Region`, `Tenant.Audit`) counts each message the same way, and the
//!   call is refused before it runs if it arrives while the count is over the limit, as a
//!   change is; and again when its answer comes, as a read's is, by its first message (or, if
//!   that is not ready, if the count is over the limit): a page may have waited for one of its
//!   tenant's scan places meanwhile, while other pages filled the count (until 2026-12-06 a
//!   burst of pages all passed the first check, and each freed place let another run: about a
//!   GiB held after a quarter of an hour on a connection limited to 64 MiB). A message of a
//!   page under way is never replaced, so each page in progress can add up to its own size (at
//!   most 4 MiB) past the limit. The page's scan place has its own bound (`--page-read-secs`),
//!   but what the page handed to HTTP/2 before that stays until the stream goes: uncounted,
//!   streams left unread behind a closed window could hold any amount of it (until
//!   2026-12-06).
//!
//! The services outside `cube.v1` (health, reflection) answer a few KiB and are not counted;
//! those a caller without credentials keeps open are held per connection instead
//! ([`crate::receive`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame};
use tonic::Status;
use tonic::body::Body;

use crate::connection::ConnInfo;

/// Largest piece of an answer handed to hyper at once (see the module doc).
pub const PIECE_BYTES: usize = 64 * 1024;

/// A `Cells.Run` answer beyond its program: the program's tag and length, the run count, and
/// the gRPC message prefix (22 bytes at most, for a program of 2^28 bytes; rounded up).
pub const RUN_ANSWER_OVERHEAD: usize = 64;

/// The least `--max-connection-send-bytes` can be.
pub const MIN_CONNECTION_SEND_BYTES: usize = PIECE_BYTES;

/// What one connection's unary answers hold (see the module doc).
#[derive(Debug, Default)]
pub struct Sending {
    /// Bytes of encoded answers not yet written to the socket, and of room held for the
    /// answers of `Run`s in progress.
    pub bytes: AtomicUsize,
    /// Of `bytes`, the room held for `Run`s in progress (for refusals' messages; decisions read
    /// `bytes` alone).
    pub reserved: AtomicUsize,
}

impl Sending {
    /// The refusal of a call (counted) whose connection holds `held` bytes: see [`over_limit`].
    fn refusal(&self, held: usize, limit: usize, why: Refusal) -> http::Response<Body> {
        cube_metrics::ANSWER_SEND_REFUSED.inc();
        let reserved = self.reserved.load(Ordering::Acquire);
        over_limit(held, reserved, limit, why).into_http()
    }

    /// Room for an answer of `n` bytes not made yet, if [`refuses`] lets it under `limit`
    /// (checked and counted in one step); else the count found.
    fn reserve(self: &Arc<Self>, n: usize, limit: usize) -> Result<Reservation, usize> {
        self.bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |now| {
                (!refuses(now, n, limit)).then(|| now + n)
            })?;
        self.reserved.fetch_add(n, Ordering::AcqRel);
        Ok(Reservation {
            sending: Arc::clone(self),
            bytes: n,
        })
    }

    fn release(&self, n: usize) {
        if n > 0 {
            self.bytes.fetch_sub(n, Ordering::AcqRel);
            cube_metrics::ANSWER_BYTES_HELD.sub(n as i64);
        }
    }
}

/// An answer's message, counted: the owner of the [`Bytes`] its pieces are cut from, dropped
/// with the last handle on any of them (once h2 has written the last piece to the socket, or
/// dropped it with its stream or connection; or with the answer's body, for what was never
/// handed on).
struct CountedMessage {
    bytes: Bytes,
    sending: Arc<Sending>,
}

impl AsRef<[u8]> for CountedMessage {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

impl Drop for CountedMessage {
    fn drop(&mut self) {
        self.sending.release(self.bytes.len());
    }
}

/// How a method's answers are counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Not counted: the services outside `cube.v1`.
    Uncounted,
    /// Counted; its answer may be replaced by a refusal (the call changed nothing).
    Read,
    /// Counted; its answer is always sent (the call may have made a change, or it is a page
    /// streamed in messages, none of which is replaced once the page is under way).
    Change,
    /// A change whose answer is as large as a program (`Cells.Run`): counted as [`Kind::Change`],
    /// with room for the largest answer reserved when it arrives.
    Run,
    /// A streamed page (`Cells.Region`, `Tenant.Audit`): checked again when its answer comes
    /// (it may have waited for one of its tenant's scan places meanwhile, while other pages
    /// filled the count), and refused then as a read's answer is, by its first message; once
    /// under way, never cut.
    Page,
}

fn kind(path: &str) -> Kind {
    match path {
        "/cube.v1.Cells/Read" | "/cube.v1.Cells/Walk" | "/cube.v1.Tenant/Stats" => Kind::Read,
        "/cube.v1.Cells/Run" => Kind::Run,
        "/cube.v1.Cells/Region" | "/cube.v1.Tenant/Audit" => Kind::Page,
        p if p.starts_with("/cube.v1.") => Kind::Change,
        _ => Kind::Uncounted,
    }
}

/// Whether an answer of `n` bytes of a call that only reads is refused while its connection
/// holds `held` bytes: when it would take the count over `limit`, unless nothing is held.
fn refuses(held: usize, n: usize, limit: usize) -> bool {
    held > 0 && held.saturating_add(n) > limit
}

/// Room held against a connection's count for an answer not made yet (a `Run`'s), given back
/// when dropped.
pub struct Reservation {
    sending: Arc<Sending>,
    bytes: usize,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.sending
            .reserved
            .fetch_sub(self.bytes, Ordering::AcqRel);
        self.sending.bytes.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

/// The layer (see the module doc).
#[derive(Debug, Clone, Copy)]
pub struct SendLayer {
    limit: usize,
    run_answer: usize,
}

impl SendLayer {
    /// `limit`: `--max-connection-send-bytes`; `run_answer`: the largest `Cells.Run` answer
    /// (a program of `--max-value-bytes` and a few bytes more), reserved for each `Run` in
    /// progress.
    pub fn new(limit: usize, run_answer: usize) -> SendLayer {
        SendLayer { limit, run_answer }
    }
}

impl<S> tower::Layer<S> for SendLayer {
    type Service = SendService<S>;

    fn layer(&self, inner: S) -> SendService<S> {
        SendService {
            inner,
            limit: self.limit,
            run_answer: self.run_answer,
        }
    }
}

#[derive(Debug, Clone)]
pub struct SendService<S> {
    inner: S,
    limit: usize,
    run_answer: usize,
}

impl<S, B> tower::Service<http::Request<B>> for SendService<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<Body>>,
    S::Future: Unpin,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = Answering<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let kind = kind(req.uri().path());
        // Only connections of the network listener carry a `ConnInfo`.
        let sending = match (kind, req.extensions().get::<ConnInfo>()) {
            (Kind::Uncounted, _) | (_, None) => None,
            (_, Some(conn)) => Some(Arc::clone(&conn.sending)),
        };
        let mut reserved = None;
        if let Some(sending) = &sending {
            // A Run's answer is always sent, and many Runs in progress at once would all pass
            // a look at the count before any of their answers is in it: each reserves room for
            // the largest answer first (checked and counted in one step), which its answer
            // replaces.
            let refused = if kind == Kind::Run {
                match sending.reserve(self.run_answer, self.limit) {
                    Ok(room) => {
                        reserved = Some(room);
                        None
                    }
                    Err(now) => Some((now, Refusal::RunAnswer(self.run_answer))),
                }
            } else {
                let now = sending.bytes.load(Ordering::Acquire);
                (now > self.limit).then_some((now, Refusal::Past))
            };
            if let Some((held, why)) = refused {
                return Answering::Refused(Some(sending.refusal(held, self.limit, why)));
            }
        }
        Answering::Called {
            inner: self.inner.call(req),
            counted: sending.map(|s| (s, matches!(kind, Kind::Read | Kind::Page), self.limit)),
            reserved,
        }
    }
}

/// The future of [`SendService`]: the wrapped service's, whose answer it takes in hand.
pub enum Answering<F> {
    /// Refused before the handler ran.
    Refused(Option<http::Response<Body>>),
    Called {
        inner: F,
        /// Its connection's count, whether the call only reads (a read or a page: its answer
        /// may be refused), and the limit; `None`: the answer is not counted.
        counted: Option<(Arc<Sending>, bool, usize)>,
        /// Room held for its answer until the answer is in hand (a `Run`'s).
        reserved: Option<Reservation>,
    },
}

impl<F, E> Future for Answering<F>
where
    F: Future<Output = Result<http::Response<Body>, E>> + Unpin,
{
    type Output = Result<http::Response<Body>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let (inner, counted, reserved) = match self.get_mut() {
            Answering::Refused(answer) => {
                // Taken once; a future polled again after it was ready need not be ready again.
                return answer.take().map_or(Poll::Pending, |a| Poll::Ready(Ok(a)));
            }
            Answering::Called {
                inner,
                counted,
                reserved,
            } => (inner, counted, reserved),
        };
        let response = ready!(Pin::new(inner).poll(cx))?;
        // Kept until the answer's message is counted in its place (an answer with no message,
        // an error, gives it back on return).
        let reserved = reserved.take();
        let Some((sending, reads_only, limit)) = counted.take() else {
            return Poll::Ready(Ok(response));
        };
        // An answer whose status travels in its headers (an error) has no message to hold.
        if response.headers().contains_key("grpc-status") {
            return Poll::Ready(Ok(response));
        }
        let (parts, mut body) = response.into_parts();
        // A streamed page's: each piece the client takes counts as progress.
        let progress = parts
            .extensions
            .get::<crate::services::PageProgress>()
            .cloned();
        // tonic encodes a unary answer's message when its body is first polled, and has it
        // ready then; anything else is handed on as it comes.
        let first = match Pin::new(&mut body).poll_frame(cx) {
            Poll::Ready(frame) => Some(frame),
            Poll::Pending => None,
        };
        let mut held = HeldAnswer::new(body, sending, reserved);
        held.progress = progress;
        match first {
            Some(Some(Ok(frame))) => match frame.into_data() {
                Ok(data) => {
                    if let Err(now) = held.hold(data, reads_only.then_some(limit)) {
                        return Poll::Ready(Ok(held.sending.refusal(now, limit, Refusal::Answer)));
                    }
                }
                Err(frame) => held.next = Some(Ok(frame)),
            },
            Some(Some(Err(e))) => held.next = Some(Err(e)),
            Some(None) => held.done = true,
            // A page whose first message is not ready: refused if the count is past the
            // limit already (it would not have started then), as its message cannot be
            // weighed before its headers go.
            None if reads_only => {
                let now = held.sending.bytes.load(Ordering::Acquire);
                if now > limit {
                    return Poll::Ready(Ok(held.sending.refusal(now, limit, Refusal::Past)));
                }
            }
            None => {}
        }
        Poll::Ready(Ok(http::Response::from_parts(parts, Body::new(held))))
    }
}

/// Why a call is refused (see [`over_limit`]).
#[derive(Debug, Clone, Copy)]
enum Refusal {
    /// A read's answer would take the count over the limit; the call ran, changing nothing.
    Answer,
    /// The count is over the limit when the call arrives; it does not run.
    Past,
    /// A Run's largest answer (the bytes given) would take the count over; it does not run.
    RunAnswer(usize),
}

/// What a call is answered when its connection holds too much it has not read.
fn over_limit(held: usize, reserved: usize, limit: usize, why: Refusal) -> Status {
    let (what, outcome) = match why {
        Refusal::Answer => ("this answer would take it past".to_string(), "answered"),
        Refusal::Past => ("that is past".to_string(), "run"),
        Refusal::RunAnswer(n) => (
            format!("a Run's answer (up to {n} bytes: its program) could take it past"),
            "run",
        ),
    };
    let runs = if reserved > 0 {
        format!(", {reserved} of them room held for the answers of its Runs in progress")
    } else {
        String::new()
    };
    Status::resource_exhausted(format!(
        "this connection's client has not yet read {held} bytes of answers to its earlier calls \
         (HTTP/2 flow control{runs}), and {what} the server's limit of {limit} bytes \
         (--max-connection-send-bytes); read those answers before making more large calls on \
         this connection (this call was not {outcome})"
    ))
}

/// An answer's body whose message is held here and handed on in pieces, counted against its
/// connection until the socket has taken them all (see the module doc).
struct HeldAnswer {
    body: Body,
    /// What is held: the rest of the message being handed on.
    piece: Bytes,
    /// A frame taken from `body` that comes after `piece`.
    next: Option<Result<Frame<Bytes>, Status>>,
    /// `body` has ended.
    done: bool,
    sending: Arc<Sending>,
    /// Room held for this answer (a `Run`'s) until its message is counted in its place.
    reserved: Option<Reservation>,
    /// A streamed page's progress, touched at every piece handed on.
    progress: Option<crate::services::PageProgress>,
}

impl HeldAnswer {
    fn new(body: Body, sending: Arc<Sending>, reserved: Option<Reservation>) -> HeldAnswer {
        HeldAnswer {
            body,
            piece: Bytes::new(),
            next: None,
            done: false,
            sending,
            reserved,
            progress: None,
        }
    }

    /// Hold `data`, counted against the connection; with `refuse_past`, only if [`refuses`]
    /// lets it (checked and counted in one step, so that answers finishing at once on two
    /// threads cannot both pass): else the count it found, and nothing is held.
    fn hold(&mut self, data: Bytes, refuse_past: Option<usize>) -> Result<(), usize> {
        debug_assert!(self.piece.is_empty());
        let n = data.len();
        match refuse_past {
            None => {
                self.sending.bytes.fetch_add(n, Ordering::AcqRel);
            }
            Some(limit) => {
                self.sending
                    .bytes
                    .fetch_update(Ordering::AcqRel, Ordering::Acquire, |now| {
                        (!refuses(now, n, limit)).then(|| now + n)
                    })?;
            }
        }
        cube_metrics::ANSWER_BYTES_HELD.add(n as i64);
        self.piece = Bytes::from_owner(CountedMessage {
            bytes: data,
            sending: Arc::clone(&self.sending),
        });
        // Counted now: the room held for it goes (after, so the count never dips between).
        self.reserved = None;
        Ok(())
    }

    /// The next piece of what is held (the message counts until every piece is dropped).
    fn take_piece(&mut self) -> Bytes {
        if let Some(progress) = &self.progress {
            progress.touch();
        }
        self.piece.split_to(self.piece.len().min(PIECE_BYTES))
    }
}

impl HttpBody for HeldAnswer {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = &mut *self;
        if !this.piece.is_empty() {
            return Poll::Ready(Some(Ok(Frame::data(this.take_piece()))));
        }
        if let Some(next) = this.next.take() {
            return Poll::Ready(Some(next));
        }
        if this.done {
            return Poll::Ready(None);
        }
        match ready!(Pin::new(&mut this.body).poll_frame(cx)) {
            // A later message (none in a unary answer): held and handed on the same way.
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => {
                    let _always = this.hold(data, None);
                    Poll::Ready(Some(Ok(Frame::data(this.take_piece()))))
                }
                Err(frame) => Poll::Ready(Some(Ok(frame))),
            },
            Some(Err(e)) => Poll::Ready(Some(Err(e))),
            None => {
                this.done = true;
                Poll::Ready(None)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.piece.is_empty() && self.next.is_none() && (self.done || self.body.is_end_stream())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[test]
    fn only_cube_v1_answers_count_and_only_reads_and_pages_are_replaced() {
        assert_eq!(kind("/cube.v1.Cells/Read"), Kind::Read);
        assert_eq!(kind("/cube.v1.Cells/Walk"), Kind::Read);
        assert_eq!(kind("/cube.v1.Tenant/Stats"), Kind::Read);
        assert_eq!(kind("/cube.v1.Cells/Write"), Kind::Change);
        assert_eq!(kind("/cube.v1.Cells/Run"), Kind::Run);
        assert_eq!(kind("/cube.v1.Access/Grant"), Kind::Change);
        assert_eq!(kind("/cube.v1.Cells/Region"), Kind::Page);
        assert_eq!(kind("/cube.v1.Tenant/Audit"), Kind::Page);
        assert_eq!(kind("/grpc.health.v1.Health/Check"), Kind::Uncounted);
    }

    #[test]
    fn an_answer_is_refused_past_the_limit_unless_nothing_is_held() {
        assert!(
            !refuses(0, 10, 4),
            "a connection holding nothing gets any answer"
        );
        assert!(!refuses(2, 2, 4));
        assert!(refuses(2, 3, 4));
        assert!(refuses(usize::MAX, 1, 4), "no overflow");
    }

    fn frames(data: &[Bytes], trailers: bool) -> Body {
        let mut frames: Vec<Result<Frame<Bytes>, Status>> =
            data.iter().cloned().map(|d| Ok(Frame::data(d))).collect();
        if trailers {
            let mut t = http::HeaderMap::new();
            t.insert("grpc-status", http::HeaderValue::from_static("0"));
            frames.push(Ok(Frame::trailers(t)));
        }
        Body::new(http_body_util::StreamBody::new(futures::stream::iter(
            frames,
        )))
    }

    /// A message is handed on whole, in pieces, with its trailers after it; it counts whole until
    /// the last handle on any part of it is dropped (h2 drops a piece once written), since all
    /// of them keep its buffer.
    #[tokio::test]
    async fn a_held_message_goes_out_whole_in_pieces_and_counts_until_they_are_dropped() {
        let message: Bytes = (0..(PIECE_BYTES * 5 / 2)).map(|i| i as u8).collect();
        let sending = Arc::new(Sending::default());
        let counted = || sending.bytes.load(Ordering::Acquire);
        let mut held = HeldAnswer::new(frames(&[], true), Arc::clone(&sending), None);
        held.hold(message.clone(), None).unwrap();
        assert_eq!(counted(), message.len());
        let mut pieces = Vec::new();
        let mut trailers = None;
        while let Some(frame) = held.frame().await {
            match frame.unwrap().into_data() {
                Ok(d) => pieces.push(d),
                Err(f) => trailers = f.into_trailers().ok(),
            }
            assert_eq!(counted(), message.len(), "a piece handed on still counts");
        }
        assert_eq!(trailers.unwrap()["grpc-status"], "0");
        assert!(held.is_end_stream());
        drop(held);
        let sizes: Vec<usize> = pieces.iter().map(Bytes::len).collect();
        assert_eq!(sizes, [PIECE_BYTES, PIECE_BYTES, PIECE_BYTES / 2]);
        assert_eq!(pieces.concat(), message);
        // Split further, as h2 splits a piece into frames: the message counts until the last
        // part of it is dropped.
        let mut last = pieces.pop().unwrap();
        let tail = last.split_off(100);
        drop((pieces, last));
        assert_eq!(
            counted(),
            message.len(),
            "part of the message is still held"
        );
        drop(tail);
        assert_eq!(counted(), 0);

        // Dropped part-way: what was never handed on goes with the body, and the message stops
        // counting with the last piece handed on.
        let mut held = HeldAnswer::new(frames(&[], true), Arc::clone(&sending), None);
        held.hold(message.clone(), None).unwrap();
        let piece = held.frame().await.unwrap().unwrap();
        drop(held);
        assert_eq!(counted(), message.len());
        drop(piece);
        assert_eq!(counted(), 0);
    }

    /// An answer refused past the limit is not held and leaves the count as it was; one that
    /// fits is counted; one is always held when nothing else is.
    #[test]
    fn a_read_answer_is_held_only_within_the_limit() {
        let sending = Arc::new(Sending::default());
        let held = || HeldAnswer::new(frames(&[], true), Arc::clone(&sending), None);
        let (mut a, mut b, mut c) = (held(), held(), held());
        assert_eq!(a.hold(Bytes::from(vec![0u8; 10]), Some(4)), Ok(()));
        assert_eq!(b.hold(Bytes::from(vec![0u8; 1]), Some(4)), Err(10));
        assert!(b.piece.is_empty());
        assert_eq!(sending.bytes.load(Ordering::Acquire), 10);
        drop(a);
        assert_eq!(c.hold(Bytes::from(vec![0u8; 3]), Some(4)), Ok(()));
        assert_eq!(b.hold(Bytes::from(vec![0u8; 1]), Some(4)), Ok(()));
        assert_eq!(sending.bytes.load(Ordering::Acquire), 4);
        drop((b, c));
        assert_eq!(sending.bytes.load(Ordering::Acquire), 0);
    }

    /// A Run reserves room for its largest answer when it arrives, refused when that could pass
    /// the limit; the room is given back when the call is dropped before it answers.
    #[tokio::test]
    async fn a_run_reserves_room_for_its_answer_until_it_answers_or_is_dropped() {
        use tower::{Layer, Service};
        let registry = Arc::new(crate::connection::ConnectionRegistry::default());
        let conn = registry.open(None);
        let sending = Arc::clone(&conn.sending);
        let never = tower::service_fn(|_: http::Request<()>| {
            futures::future::pending::<Result<http::Response<Body>, Status>>()
        });
        let mut service = SendLayer::new(100, 40).layer(never);
        let run = || {
            let mut req = http::Request::new(());
            *req.uri_mut() = http::Uri::from_static("/cube.v1.Cells/Run");
            req.extensions_mut().insert(conn.clone());
            req
        };
        let first = service.call(run());
        let second = service.call(run());
        assert_eq!(sending.bytes.load(Ordering::Acquire), 80);
        let Answering::Refused(Some(refused)) = service.call(run()) else {
            panic!("a third Run fitted under the limit");
        };
        assert_eq!(refused.headers()["grpc-status"], "8");
        assert_eq!(sending.bytes.load(Ordering::Acquire), 80);
        drop(first);
        assert_eq!(sending.bytes.load(Ordering::Acquire), 40);
        drop(second);
        assert_eq!(sending.bytes.load(Ordering::Acquire), 0);
    }

    /// A Run's answer takes its reservation's place with no moment between in which neither
    /// counts (tonic encodes the message when its body is first polled: the room is still held
    /// then), and from then on the count is the answer's length.
    #[tokio::test]
    async fn a_runs_answer_takes_the_place_of_its_reservation() {
        use tower::{Layer, Service};
        let registry = Arc::new(crate::connection::ConnectionRegistry::default());
        let conn = registry.open(None);
        let sending = Arc::clone(&conn.sending);
        let seen = Arc::clone(&sending);
        let answering = tower::service_fn(move |_: http::Request<()>| {
            let seen = Arc::clone(&seen);
            let message = futures::stream::once(async move {
                assert_eq!(
                    seen.bytes.load(Ordering::Acquire),
                    40,
                    "the room was given back before the answer was counted"
                );
                Ok::<_, Status>(Frame::data(Bytes::from(vec![1u8; 30])))
            });
            let body = Body::new(http_body_util::StreamBody::new(message));
            futures::future::ready(Ok::<_, Status>(http::Response::new(body)))
        });
        let mut service = SendLayer::new(100, 40).layer(answering);
        let mut req = http::Request::new(());
        *req.uri_mut() = http::Uri::from_static("/cube.v1.Cells/Run");
        req.extensions_mut().insert(conn.clone());
        let answer = service.call(req).await.unwrap();
        assert_eq!(sending.bytes.load(Ordering::Acquire), 30);
        assert_eq!(sending.reserved.load(Ordering::Acquire), 0);
        let data = answer.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(data.len(), 30);
        drop(data);
        assert_eq!(sending.bytes.load(Ordering::Acquire), 0);
    }

    /// A body whose later frames carry messages (not a unary answer's) has them held too.
    #[tokio::test]
    async fn later_messages_are_held_as_they_come() {
        let sending = Arc::new(Sending::default());
        let a = Bytes::from(vec![1u8; PIECE_BYTES + 1]);
        let b = Bytes::from(vec![2u8; 3]);
        let mut held = HeldAnswer::new(
            frames(&[a.clone(), b.clone()], false),
            Arc::clone(&sending),
            None,
        );
        let mut out = Vec::new();
        while let Some(frame) = held.frame().await {
            out.extend_from_slice(&frame.unwrap().into_data().unwrap());
        }
        assert_eq!(out, [&a[..], &b[..]].concat());
        assert_eq!(sending.bytes.load(Ordering::Acquire), 0);
    }
}
