//! One user's connection: hyper's HTTP/2 client connection used directly (plaintext or TLS),
//! not tonic's `Channel`, whose one buffer task every call passes through on its way to the
//! connection (docs/benchmarks.md, "The load driver without tonic's Channel"). Unlike a
//! `Channel` it does not reconnect: a user finds it [`Conn::closed`] and opens another.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use tokio_rustls::rustls;
use tonic::body::Body;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How to speak TLS to the server: the CA its certificate chains to and the name it is for.
#[derive(Clone)]
pub struct Tls {
    config: Arc<rustls::ClientConfig>,
    domain: ServerName<'static>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls").field("domain", &self.domain).finish()
    }
}

impl Tls {
    /// Trust the certificates in `ca_pem` only, for a server named `domain`; HTTP/2 by ALPN.
    pub fn new(ca_pem: &[u8], domain: &str) -> anyhow::Result<Tls> {
        let mut roots = rustls::RootCertStore::empty();
        for ca in CertificateDer::pem_slice_iter(ca_pem) {
            roots.add(ca.map_err(|e| anyhow::anyhow!("the CA file: {e}"))?)?;
        }
        anyhow::ensure!(!roots.is_empty(), "the CA file holds no certificate");
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"h2".to_vec()];
        // A full TLS handshake on every connection: churn's "new connection per op" must not
        // resume an earlier TLS session (rustls keeps a session cache by default); the
        // persistent models open one connection per user, so it costs them nothing.
        config.resumption = rustls::client::Resumption::disabled();
        Ok(Tls {
            config: Arc::new(config),
            domain: ServerName::try_from(domain.to_string())
                .map_err(|e| anyhow::anyhow!("--tls-domain {domain}: {e}"))?,
        })
    }
}

/// An HTTP/2 connection to the server, cloned for each client on it: a call goes from the
/// caller's task to hyper's, with no buffer task between.
#[derive(Clone)]
pub struct Conn {
    send: hyper::client::conn::http2::SendRequest<Body>,
    scheme: http::uri::Scheme,
    authority: http::uri::Authority,
    /// Why the connection ended, once it has (hyper's error; empty for a clean close).
    ended: Arc<OnceLock<String>>,
}

impl Conn {
    /// Connect to `endpoint` (`http://host:port`, or `https://…` with `tls`) within `timeout`
    /// (TCP, TLS and the HTTP/2 preface together).
    pub async fn connect(
        endpoint: &str,
        tls: Option<&Tls>,
        timeout: Duration,
    ) -> anyhow::Result<Conn> {
        let uri: http::Uri = endpoint.parse()?;
        let authority = uri
            .authority()
            .cloned()
            .ok_or_else(|| anyhow::anyhow!("{endpoint} has no host:port"))?;
        let scheme = uri.scheme().cloned().unwrap_or(http::uri::Scheme::HTTP);
        let ended = Arc::new(OnceLock::new());
        let send = tokio::time::timeout(timeout, async {
            let tcp = tokio::net::TcpStream::connect(authority.as_str()).await?;
            tcp.set_nodelay(true)?;
            let builder = hyper::client::conn::http2::Builder::new(TokioExecutor::new());
            anyhow::Ok(match tls {
                None => {
                    let (send, conn) = builder.handshake(TokioIo::new(tcp)).await?;
                    tokio::spawn(drive(conn, Arc::clone(&ended)));
                    send
                }
                Some(tls) => {
                    let stream = tokio_rustls::TlsConnector::from(Arc::clone(&tls.config))
                        .connect(tls.domain.clone(), tcp)
                        .await?;
                    if stream.get_ref().1.alpn_protocol() != Some(b"h2") {
                        anyhow::bail!("the server did not agree to HTTP/2 (ALPN h2) over TLS");
                    }
                    let (send, conn) = builder.handshake(TokioIo::new(stream)).await?;
                    tokio::spawn(drive(conn, Arc::clone(&ended)));
                    send
                }
            })
        })
        .await
        .map_err(|_| anyhow::anyhow!("timed out after {timeout:?}"))??;
        Ok(Conn {
            send,
            scheme,
            authority,
            ended,
        })
    }

    /// Whether the connection has ended (the server closed or reset it, or its task failed): no
    /// call can be sent on it any more.
    pub fn closed(&self) -> bool {
        self.send.is_closed()
    }

    /// Why the connection ended, if it has and hyper said why.
    pub fn why_closed(&self) -> Option<&str> {
        self.ended
            .get()
            .map(String::as_str)
            .filter(|s| !s.is_empty())
    }
}

/// Run a connection's task until it ends, keeping why.
async fn drive<F>(conn: F, ended: Arc<OnceLock<String>>)
where
    F: Future<Output = Result<(), hyper::Error>>,
{
    let why = match conn.await {
        Ok(()) => String::new(),
        Err(e) => format!("{:#}", anyhow::Error::from(e)),
    };
    let _ = ended.set(why);
}

type Answer = Pin<Box<dyn Future<Output = Result<http::Response<Body>, BoxError>> + Send>>;

impl tower::Service<http::Request<Body>> for Conn {
    type Response = http::Response<Body>;
    type Error = BoxError;
    type Future = Answer;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.send.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, mut req: http::Request<Body>) -> Answer {
        // tonic's clients send the path only (a `Channel` adds the origin).
        let mut parts = std::mem::take(req.uri_mut()).into_parts();
        parts.scheme = Some(self.scheme.clone());
        parts.authority = Some(self.authority.clone());
        match http::Uri::from_parts(parts) {
            Ok(uri) => *req.uri_mut() = uri,
            Err(e) => return Box::pin(std::future::ready(Err(e.into()))),
        }
        let answer = self.send.send_request(req);
        Box::pin(async move { Ok(answer.await?.map(Body::new)) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An HTTP/2 server on loopback that answers one request per connection with 200 and then
    /// closes the connection; returns its address.
    async fn one_request_per_connection() -> std::net::SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut conn = h2::server::handshake(tcp).await.unwrap();
                    if let Some(Ok((_req, mut respond))) = conn.accept().await {
                        let _ = respond.send_response(http::Response::new(()), true);
                    }
                    // Let the answer go out, then close: the client sees the connection end.
                    let _ = tokio::time::timeout(Duration::from_millis(100), conn.accept()).await;
                });
            }
        });
        addr
    }

    #[tokio::test]
    async fn a_connection_the_server_closed_says_so_and_a_new_one_works() {
        let addr = one_request_per_connection().await;
        let endpoint = format!("http://{addr}");
        let mut conn = Conn::connect(&endpoint, None, Duration::from_secs(5))
            .await
            .unwrap();
        assert!(!conn.closed());
        let req = |path: &str| {
            http::Request::builder()
                .uri(path)
                .body(Body::empty())
                .unwrap()
        };
        // The origin is added: a bare path is a valid HTTP/2 request.
        std::future::poll_fn(|cx| tower::Service::poll_ready(&mut conn, cx))
            .await
            .unwrap();
        let resp = tower::Service::call(&mut conn, req("/x")).await.unwrap();
        assert_eq!(resp.status(), http::StatusCode::OK);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while !conn.closed() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the closed connection was not noticed"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let call = std::future::poll_fn(|cx| tower::Service::poll_ready(&mut conn, cx)).await;
        assert!(call.is_err(), "a closed connection still takes calls");
        // What a user does next: another connection, which works.
        let mut again = Conn::connect(&endpoint, None, Duration::from_secs(5))
            .await
            .unwrap();
        let resp = tower::Service::call(&mut again, req("/y")).await.unwrap();
        assert_eq!(resp.status(), http::StatusCode::OK);
    }

    #[tokio::test]
    async fn a_connect_to_nothing_fails_within_its_timeout() {
        // A port just bound and released: nothing listens there.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let err = Conn::connect(
            &format!("http://127.0.0.1:{port}"),
            None,
            Duration::from_secs(5),
        )
        .await
        .err()
        .expect("connected to nothing");
        assert!(format!("{err:#}").contains("refused"), "{err:#}");
    }
}
