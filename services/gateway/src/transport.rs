//! The network listener's connections: plaintext TCP or TLS, each wrapped in a [`CubeConn`].
//!
//! TLS handshakes run in their own tasks (with a timeout), so one slow or malicious client cannot
//! hold up the accept loop. A verified client certificate authenticates its connection's session
//! before the first request.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use cube_store::Catalog;
use futures::Stream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};

use crate::connection::{ConnectionRegistry, CubeConn};
use crate::tls::client_identity;

const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// A plaintext or TLS byte stream.
pub enum Transport {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

/// The stream of accepted connections handed to tonic.
pub type Incoming = Pin<Box<dyn Stream<Item = io::Result<CubeConn<Transport>>> + Send>>;

/// Accept plaintext connections.
pub fn plain(listener: TcpListener, registry: Arc<ConnectionRegistry>) -> Incoming {
    Box::pin(TcpListenerStream::new(listener).map(move |conn| {
        conn.map(|s| {
            // Small request/response round trips dominate: Nagle would add 40 ms stalls.
            let _ = s.set_nodelay(true);
            let remote = s.peer_addr().ok();
            CubeConn::new(Transport::Plain(s), &registry, remote)
        })
    }))
}

/// Accept TLS connections; the returned task handle must be aborted when serving stops (it owns
/// the listener).
pub fn tls(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    registry: Arc<ConnectionRegistry>,
    catalog: Arc<Catalog>,
) -> (Incoming, tokio::task::JoinHandle<()>) {
    let (tx, rx) = tokio::sync::mpsc::channel(256);
    let task = tokio::spawn(async move {
        loop {
            let (tcp, remote) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let _ = tcp.set_nodelay(true);
            let (acceptor, registry, catalog, tx) = (
                acceptor.clone(),
                Arc::clone(&registry),
                Arc::clone(&catalog),
                tx.clone(),
            );
            tokio::spawn(async move {
                let tls =
                    match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                        Ok(Ok(tls)) => tls,
                        Ok(Err(e)) => {
                            tracing::debug!(%remote, error = %e, "TLS handshake failed");
                            return;
                        }
                        Err(_) => {
                            tracing::debug!(%remote, "TLS handshake timed out");
                            return;
                        }
                    };
                let identity = tls
                    .get_ref()
                    .1
                    .peer_certificates()
                    .and_then(|c| c.first())
                    .and_then(client_identity);
                let conn = CubeConn::new(Transport::Tls(Box::new(tls)), &registry, Some(remote));
                if let Some((tenant, key_id)) = identity {
                    match catalog.key(&tenant, &key_id).filter(|k| !k.revoked) {
                        Some(key) => conn.session().authenticate(key),
                        None => {
                            tracing::info!(%remote, %tenant, %key_id, "client certificate for an unknown or revoked key")
                        }
                    }
                }
                let _ = tx.send(Ok(conn)).await;
            });
        }
    });
    (Box::pin(ReceiverStream::new(rx)), task)
}

impl AsyncRead for Transport {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Transport::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Transport::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Transport {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Transport::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Transport::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Transport::Plain(s) => Pin::new(s).poll_flush(cx),
            Transport::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Transport::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Transport::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Transport::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Transport::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Transport::Plain(s) => s.is_write_vectored(),
            Transport::Tls(s) => s.is_write_vectored(),
        }
    }
}
