//! Every call of a command bounded by `--timeout-secs`, answer included.
//!
//! A unary call gets one deadline, `--timeout-secs` from when it is sent, covering the answer's
//! head, its message and its trailers (tonic's `Endpoint::timeout` stops at the head: a server
//! that sent the head and then nothing held the command for ever), and tells the server so in
//! `grpc-timeout`, so that the server drops work its client has stopped waiting for. A reconnect
//! tonic makes inside the call falls under the same deadline. A streamed answer (`Tenant.Audit`)
//! is bounded up to its head here; its entries by the caller, one limit each (a long trail
//! takes as long as it takes).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use http_body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The rpcs whose answers are streams: no deadline for the whole call.
pub const STREAMED: [&str; 2] = ["/cube.v1.Cells/Region", "/cube.v1.Tenant/Audit"];

/// No answer (or no end of one) within the limit. Found in a failed call's error sources.
#[derive(Debug)]
pub struct NoAnswer;

impl std::fmt::Display for NoAnswer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("no answer within the call's time limit")
    }
}

impl std::error::Error for NoAnswer {}

/// `grpc-timeout` for `limit`: whole seconds, at most 8 digits (the gRPC spec's limit).
fn grpc_timeout(limit: Duration) -> http::HeaderValue {
    let secs = limit.as_secs().clamp(1, 99_999_999);
    http::HeaderValue::try_from(format!("{secs}S"))
        .unwrap_or_else(|_| http::HeaderValue::from_static("99999999S"))
}

/// A gRPC service whose calls are bounded by `limit` (none: unbounded, as given).
#[derive(Debug, Clone)]
pub struct Bounded<S> {
    inner: S,
    limit: Option<Duration>,
}

impl<S> Bounded<S> {
    pub fn new(inner: S, limit: Option<Duration>) -> Bounded<S> {
        Bounded { inner, limit }
    }
}

impl<S, B, RB> tower::Service<http::Request<B>> for Bounded<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<RB>>,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    type Response = http::Response<BoundedBody<RB>>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, mut req: http::Request<B>) -> Self::Future {
        // A limit past what the clock can add (`--timeout-secs` near u64::MAX) is none.
        let deadline = self
            .limit
            .and_then(|limit| Some((limit, Instant::now().checked_add(limit)?)));
        let Some((limit, deadline)) = deadline else {
            let answer = self.inner.call(req);
            return Box::pin(async move {
                Ok(answer.await.map_err(Into::into)?.map(|body| BoundedBody {
                    inner: body,
                    deadline: None,
                }))
            });
        };
        let whole_call = !STREAMED.contains(&req.uri().path());
        if whole_call {
            req.headers_mut()
                .insert("grpc-timeout", grpc_timeout(limit));
        }
        let answer = self.inner.call(req);
        Box::pin(async move {
            let head = tokio::time::timeout_at(deadline, answer)
                .await
                .map_err(|_| Box::new(NoAnswer) as BoxError)?
                .map_err(Into::into)?;
            Ok(head.map(|body| BoundedBody {
                inner: body,
                deadline: whole_call.then(|| Box::pin(tokio::time::sleep_until(deadline))),
            }))
        })
    }
}

/// An answer's body that fails with [`NoAnswer`] once its deadline passes unfinished.
pub struct BoundedBody<B> {
    inner: B,
    deadline: Option<Pin<Box<Sleep>>>,
}

impl<B> Body for BoundedBody<B>
where
    B: Body + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = B::Data;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, BoxError>>> {
        let this = self.get_mut();
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        match this.deadline.as_mut().map(|d| d.as_mut().poll(cx)) {
            Some(Poll::Ready(())) => Poll::Ready(Some(Err(Box::new(NoAnswer)))),
            _ => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A limit the clock cannot add is no limit, not a panic (`Instant + Duration` panics on
    /// overflow).
    #[tokio::test]
    async fn a_limit_past_the_clocks_range_is_none() {
        let mut bounded = Bounded::new(
            tower::service_fn(|_: http::Request<()>| async {
                Ok::<_, std::convert::Infallible>(http::Response::new(http_body_util::Empty::<
                    tonic::codegen::Bytes,
                >::new()))
            }),
            Some(Duration::from_secs(u64::MAX)),
        );
        let req = http::Request::builder()
            .uri("/cube.v1.Cells/Read")
            .body(())
            .unwrap();
        let answer = tower::Service::call(&mut bounded, req).await.unwrap();
        assert!(answer.body().deadline.is_none());
    }

    #[test]
    fn grpc_timeout_is_whole_seconds_within_eight_digits() {
        assert_eq!(grpc_timeout(Duration::from_secs(30)), "30S");
        assert_eq!(grpc_timeout(Duration::from_millis(300)), "1S");
        assert_eq!(grpc_timeout(Duration::from_secs(u64::MAX)), "99999999S");
    }

    /// A Cells service that answers every call with a head and then nothing, and keeps the
    /// `grpc-timeout` each call carried.
    #[derive(Clone, Default)]
    struct StalledAnswer {
        timeouts: std::sync::Arc<std::sync::Mutex<Vec<Option<String>>>>,
    }

    impl tonic::server::NamedService for StalledAnswer {
        const NAME: &'static str = "cube.v1.Cells";
    }

    impl tower::Service<http::Request<tonic::body::Body>> for StalledAnswer {
        type Response = http::Response<tonic::body::Body>;
        type Error = std::convert::Infallible;
        type Future = std::future::Ready<Result<Self::Response, Self::Error>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
            let timeout = req.headers().get("grpc-timeout");
            self.timeouts
                .lock()
                .unwrap()
                .push(timeout.map(|t| t.to_str().unwrap().to_owned()));
            let nothing =
                futures::stream::pending::<Result<Frame<tonic::codegen::Bytes>, tonic::Status>>();
            std::future::ready(Ok(http::Response::builder()
                .header("content-type", "application/grpc")
                .body(tonic::body::Body::new(http_body_util::StreamBody::new(
                    nothing,
                )))
                .unwrap()))
        }
    }

    /// A unary answer whose head came and whose message never does ends at the limit, with
    /// cubec's timeout message, and the server was told the limit: tonic's own timeout ended
    /// at the head, and the command hung.
    #[tokio::test]
    async fn a_unary_answer_stalled_after_its_head_ends_at_the_limit() {
        let stalled = StalledAnswer::default();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn({
            let stalled = stalled.clone();
            async move {
                let _ = tonic::transport::Server::builder()
                    .add_service(stalled)
                    .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
                    .await;
            }
        });
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let limit = Duration::from_secs(2);
        let mut cells =
            cube_api::v1::cells_client::CellsClient::new(Bounded::new(channel, Some(limit)));
        let started = std::time::Instant::now();
        let answer = tokio::time::timeout(
            Duration::from_secs(20),
            cells.read(cube_api::v1::ReadRequest::default()),
        )
        .await
        .expect("the call hung past its limit");
        let err = crate::status(answer.expect_err("a stalled answer must fail the call"));
        assert!(
            err.to_string()
                .starts_with("no answer within --timeout-secs"),
            "{err}"
        );
        assert!(started.elapsed() >= limit, "{:?}", started.elapsed());
        assert_eq!(*stalled.timeouts.lock().unwrap(), [Some("2S".to_owned())]);
        server.abort();
    }

    /// Every server-streaming rpc of `cube.v1` is in [`STREAMED`], and nothing else: a new
    /// stream missing from it would be cut off at `--timeout-secs` as a whole.
    #[test]
    fn the_streamed_rpcs_are_those_of_the_proto() {
        use prost::Message as _;
        let set = prost_types::FileDescriptorSet::decode(cube_api::FILE_DESCRIPTOR_SET).unwrap();
        let mut streamed: Vec<String> = set
            .file
            .iter()
            .flat_map(|f| {
                f.service.iter().flat_map(move |s| {
                    s.method
                        .iter()
                        .filter(|m| m.server_streaming())
                        .map(move |m| format!("/{}.{}/{}", f.package(), s.name(), m.name()))
                })
            })
            .collect();
        streamed.sort();
        assert_eq!(streamed, STREAMED.map(String::from).to_vec());
    }
}
