//! The admin HTTP listener (`--admin-listen`, a separate port from gRPC): `/metrics`
//! (Prometheus text format), `/healthz` (the process is alive), `/readyz` (ready only once the
//! catalog and listeners are up, and no longer once shutdown has begun).

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Whether the server is ready for traffic.
#[derive(Debug, Clone, Default)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    pub fn set(&self, ready: bool) {
        self.0.store(ready, Ordering::Release);
    }

    pub fn get(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

fn respond(status: StatusCode, content_type: &str, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    if let Ok(v) = content_type.parse() {
        r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    r
}

async fn handle(
    req: Request<hyper::body::Incoming>,
    ready: Readiness,
) -> Result<Response<Full<Bytes>>, Infallible> {
    const TEXT: &str = "text/plain; charset=utf-8";
    let path = req.uri().path();
    let known = matches!(path, "/metrics" | "/healthz" | "/readyz");
    // HEAD is answered as GET (hyper sends no body for it): some probes use it.
    if known && !matches!(*req.method(), Method::GET | Method::HEAD) {
        let mut r = respond(
            StatusCode::METHOD_NOT_ALLOWED,
            TEXT,
            format!("method not allowed: {path} answers GET (and HEAD)\n"),
        );
        r.headers_mut().insert(
            hyper::header::ALLOW,
            hyper::header::HeaderValue::from_static("GET, HEAD"),
        );
        return Ok(r);
    }
    Ok(match (req.method(), path) {
        (&Method::HEAD, "/metrics") => respond(
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            String::new(),
        ),
        (&Method::GET, "/metrics") => respond(
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            cube_metrics::render(),
        ),
        (_, "/healthz") => respond(StatusCode::OK, TEXT, "ok\n".into()),
        (_, "/readyz") if ready.get() => respond(StatusCode::OK, TEXT, "ready\n".into()),
        (_, "/readyz") => respond(StatusCode::SERVICE_UNAVAILABLE, TEXT, "not ready\n".into()),
        _ => respond(
            StatusCode::NOT_FOUND,
            TEXT,
            "not found: try /metrics, /healthz or /readyz\n".into(),
        ),
    })
}

/// Admin connections open at once at most; more are closed at accept. Prometheus and a probe
/// need a handful: the cap keeps this port from taking the descriptors the tenants' files need.
pub const MAX_ADMIN_CONNECTIONS: usize = 64;
/// Admin connections open at once from one client address (an IPv4 address or an IPv6 /64) at
/// most: a client on one address holding connections open cannot take every place, and with
/// them the liveness probe's (which then fails, and the orchestrator restarts the server).
/// Clients on four addresses can: the port is for the scraper and the node only
/// (docs/operations.md).
pub const MAX_ADMIN_CONNECTIONS_PER_ADDRESS: usize = 16;
/// A request's headers must arrive within this (also the longest a kept-alive connection waits
/// for its next request's headers before it is closed).
const ADMIN_HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest an admin connection lives, however busy: a scraper simply reconnects.
const ADMIN_CONNECTION_LIFETIME: Duration = Duration::from_secs(300);

/// Serve until `stop` is cancelled.
pub async fn serve(listener: TcpListener, ready: Readiness, stop: CancellationToken) {
    let places = Arc::new(tokio::sync::Semaphore::new(MAX_ADMIN_CONNECTIONS));
    let by_address = Arc::new(cube_gateway::AddressCounts::default());
    loop {
        let (stream, peer) = tokio::select! {
            _ = stop.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok(c) => c,
                Err(e) => {
                    // Out of descriptors, say: retrying at once would spin a core.
                    tracing::warn!(error = %e, "admin accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Some(from_peer) = by_address.take_peer(peer.ip(), MAX_ADMIN_CONNECTIONS_PER_ADDRESS)
        else {
            tracing::debug!(%peer, "admin connection refused: {MAX_ADMIN_CONNECTIONS_PER_ADDRESS} are open from its address");
            drop(stream);
            continue;
        };
        let Ok(place) = Arc::clone(&places).try_acquire_owned() else {
            tracing::debug!("admin connection refused: {MAX_ADMIN_CONNECTIONS} are open");
            drop(stream);
            continue;
        };
        let ready = ready.clone();
        tokio::spawn(async move {
            let _places = (place, from_peer);
            let service = hyper::service::service_fn(move |req| handle(req, ready.clone()));
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(ADMIN_HEADER_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service);
            let _ = tokio::time::timeout(ADMIN_CONNECTION_LIFETIME, connection).await;
        });
    }
}
