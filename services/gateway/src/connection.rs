//! Connections and their per-connection auth state.
//!
//! Every accepted connection is wrapped in a [`CubeConn`], whose `ConnectInfo` (copied by tonic
//! into each request's extensions) carries a connection id and a shared [`Session`]. The
//! handshake (`Auth.Challenge` + `Auth.Hello`) writes the session; the auth layer reads it. The
//! session ends when the connection closes (the wrapper is dropped) or when its key is revoked.
//!
//! The wrapper also enforces the preface deadline: a connection that has not sent the whole
//! HTTP/2 client connection preface (the 24-byte magic and the SETTINGS frame that must follow
//! it, RFC 9113 section 3.4) within its deadline is closed, so that sockets which connect and
//! then say nothing (or dribble a few bytes, or stop after the magic) cannot sit on
//! `--max-connections` places. Once the preface is in, idle connections are HTTP/2's
//! keepalive's business (`server.rs`).

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use cube_store::KeyInfo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::Connected;

/// A challenge waiting for its Hello on this connection.
#[derive(Debug, Clone)]
pub(crate) struct PendingChallenge {
    pub tenant: String,
    pub key_id: String,
    pub nonce: [u8; 32],
    pub expires_at: Instant,
}

/// Auth state of one connection.
#[derive(Debug, Default)]
pub struct Session {
    /// What authenticated this connection so far, for the `cube_connections_open` gauge:
    /// 0 none, 1 per-call signatures, 2 handshake or certificate, [`CLOSED`] once the
    /// connection has closed (its request tasks may still finish after that).
    gauge_model: std::sync::atomic::AtomicU8,
    /// The key this connection authenticated as (after a successful Hello).
    principal: RwLock<Option<Arc<KeyInfo>>>,
    /// The principal's key was revoked: the connection is no longer authenticated, and its calls
    /// are told why ([`Session::revoked`]) until it authenticates again.
    revoked: std::sync::atomic::AtomicBool,
    /// At most one outstanding challenge; a new Challenge replaces it, Hello consumes it.
    challenge: Mutex<Option<PendingChallenge>>,
    /// (tenant, key id) of a client certificate this connection presented whose key is unknown
    /// or revoked: its calls without other credentials are told so, not that none were given.
    refused_certificate: std::sync::OnceLock<(String, String)>,
}

impl Session {
    pub(crate) fn key(&self) -> Option<Arc<KeyInfo>> {
        self.principal
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub(crate) fn authenticate(&self, key: Arc<KeyInfo>) {
        let mut principal = self.principal.write().unwrap_or_else(|p| p.into_inner());
        *principal = Some(key);
        self.revoked.store(false, Ordering::SeqCst);
        // Under the principal's lock, as in `end_if_key`: a revocation racing a new
        // authentication cannot leave the gauge's label behind the session's state.
        self.move_gauge(None, 2);
    }

    /// Whether the key this connection authenticated as was revoked since (the session ended).
    pub(crate) fn revoked(&self) -> bool {
        self.revoked.load(Ordering::SeqCst)
    }

    /// The connection presented a client certificate of `tenant/key_id`, an unknown or revoked
    /// key: it stays unauthenticated.
    pub(crate) fn refuse_certificate(&self, tenant: &str, key_id: &str) {
        let _ = self
            .refused_certificate
            .set((tenant.to_string(), key_id.to_string()));
    }

    /// What [`Session::refuse_certificate`] recorded, if anything.
    pub(crate) fn refused_certificate(&self) -> Option<&(String, String)> {
        self.refused_certificate.get()
    }

    /// A signed call arrived on this connection.
    pub(crate) fn saw_signed_call(&self) {
        self.move_gauge(Some(0), 1);
    }

    /// Move this connection in the gauge to `to` (only from `only_from`, if given). One
    /// compare-and-swap decides, so racing request tasks move it once, and nothing moves once
    /// the connection has closed: the gauge cannot drift.
    fn move_gauge(&self, only_from: Option<u8>, to: u8) {
        let moved = self
            .gauge_model
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |from| {
                (from != CLOSED && from != to && only_from.is_none_or(|f| f == from)).then_some(to)
            });
        let Ok(from) = moved else {
            return;
        };
        cube_metrics::CONNECTIONS_OPEN
            .with_label_values(&[gauge_label(from)])
            .dec();
        cube_metrics::CONNECTIONS_OPEN
            .with_label_values(&[gauge_label(to)])
            .inc();
    }
}

/// [`Session::gauge_model`] of a closed connection.
const CLOSED: u8 = u8::MAX;

fn gauge_label(model: u8) -> &'static str {
    match model {
        1 => "call",
        2 => "connection",
        _ => "none",
    }
}

impl Session {
    /// End the session if it is `tenant/key_id`'s. The key is kept, marked revoked, so that the
    /// connection's next calls are told the key was revoked rather than that credentials are
    /// missing.
    pub(crate) fn end_if_key(&self, tenant: &str, key_id: &str) -> bool {
        let p = self.principal.write().unwrap_or_else(|p| p.into_inner());
        if p.as_ref()
            .is_some_and(|k| k.tenant == tenant && k.key_id == key_id)
            && !self.revoked.swap(true, Ordering::SeqCst)
        {
            // No longer a handshake-authenticated connection; a later signed call moves it on.
            self.move_gauge(None, 0);
            drop(p);
            return true;
        }
        false
    }

    pub(crate) fn set_challenge(&self, c: PendingChallenge) {
        *self.challenge.lock().unwrap_or_else(|p| p.into_inner()) = Some(c);
    }

    /// Take the pending challenge: a challenge is single-use whatever the Hello's outcome.
    pub(crate) fn take_challenge(&self) -> Option<PendingChallenge> {
        self.challenge
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }
}

/// What tonic copies into every request of a connection.
#[derive(Debug, Clone)]
pub struct ConnInfo {
    pub id: u64,
    pub remote: Option<SocketAddr>,
    pub session: Arc<Session>,
    /// The request messages this connection's calls are receiving, and its open calls whose
    /// requests have not ended (`crate::receive`).
    pub receiving: Arc<crate::receive::Receiving>,
    /// The unary answers its calls hold that its client has not read yet (`crate::send`).
    pub sending: Arc<crate::send::Sending>,
}

/// Every open connection, so revoking a key can end its sessions.
#[derive(Debug, Default)]
pub struct ConnectionRegistry {
    next_id: AtomicU64,
    open: Mutex<HashMap<u64, Weak<Session>>>,
}

impl ConnectionRegistry {
    /// Register a new connection.
    pub fn open(self: &Arc<Self>, remote: Option<SocketAddr>) -> ConnInfo {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        let session = Arc::new(Session::default());
        self.open
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, Arc::downgrade(&session));
        ConnInfo {
            id,
            remote,
            session,
            receiving: Arc::default(),
            sending: Arc::default(),
        }
    }

    fn close(&self, id: u64) {
        self.open
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
    }

    /// End every session authenticated as `tenant/key_id`; returns how many were ended.
    pub fn end_sessions_of(&self, tenant: &str, key_id: &str) -> usize {
        let open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        open.values()
            .filter_map(Weak::upgrade)
            .filter(|s| s.end_if_key(tenant, key_id))
            .count()
    }

    /// Connections currently open.
    pub fn len(&self) -> usize {
        self.open.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// An accepted connection with its registry entry; dropping it ends the session.
pub struct CubeConn<IO> {
    io: IO,
    info: ConnInfo,
    registry: Arc<ConnectionRegistry>,
    /// Until the whole HTTP/2 preface has been read.
    preface: Option<PrefaceDeadline>,
    /// Its place in its client address's count, given back when the connection closes.
    _address: Option<crate::transport::AddressSlot>,
}

/// Length of the magic that starts the HTTP/2 client connection preface,
/// `PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n` (RFC 9113, section 3.4). Every gRPC connection starts
/// with it, and then a SETTINGS frame.
const PREFACE_LEN: usize = 24;

/// An HTTP/2 frame header: its payload's length (24 bits), type, flags and stream id.
const FRAME_HEADER_LEN: usize = 9;

/// The preface's SETTINGS frame counted at most this long (h2's default largest frame): a
/// longer one is not HTTP/2 a server takes, and h2 closes the connection for it.
const MAX_SETTINGS_LEN: usize = 16_384;

struct PrefaceDeadline {
    by: tokio::time::Instant,
    /// Made at the first read that has to wait (a timer needs the runtime; construction may
    /// happen outside it).
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    read: usize,
    /// The bytes read of the magic and of the SETTINGS frame's header, which says how long the
    /// whole preface is.
    head: [u8; PREFACE_LEN + FRAME_HEADER_LEN],
}

impl PrefaceDeadline {
    /// Note `bytes`, the next ones read; whether the whole preface is in.
    fn take(&mut self, bytes: &[u8]) -> bool {
        let head = self.head.len();
        if self.read < head {
            let n = bytes.len().min(head - self.read);
            self.head[self.read..self.read + n].copy_from_slice(&bytes[..n]);
        }
        self.read += bytes.len();
        self.read >= head && self.read >= head + self.settings_len()
    }

    /// The length of the SETTINGS frame's payload, from its header (once read).
    fn settings_len(&self) -> usize {
        let h = &self.head[PREFACE_LEN..];
        let len = (usize::from(h[0]) << 16) | (usize::from(h[1]) << 8) | usize::from(h[2]);
        len.min(MAX_SETTINGS_LEN)
    }
}

impl<IO> CubeConn<IO> {
    pub fn new(
        io: IO,
        registry: &Arc<ConnectionRegistry>,
        remote: Option<SocketAddr>,
    ) -> CubeConn<IO> {
        let info = registry.open(remote);
        cube_metrics::CONNECTIONS_OPEN
            .with_label_values(&["none"])
            .inc();
        CubeConn {
            io,
            info,
            registry: Arc::clone(registry),
            preface: None,
            _address: None,
        }
    }

    /// Keep `slot` (the connection's place in its address's count) until the connection closes.
    pub fn holding(mut self, slot: Option<crate::transport::AddressSlot>) -> CubeConn<IO> {
        self._address = slot;
        self
    }

    /// Close the connection (reads fail with `TimedOut`) unless its whole client preface (the
    /// magic and its SETTINGS frame) arrives within `timeout` from now.
    pub fn with_preface_deadline(mut self, timeout: Duration) -> CubeConn<IO> {
        self.preface = Some(PrefaceDeadline {
            by: tokio::time::Instant::now() + timeout,
            timer: None,
            read: 0,
            head: [0; PREFACE_LEN + FRAME_HEADER_LEN],
        });
        self
    }
}

impl<IO> CubeConn<IO> {
    /// This connection's auth session.
    pub fn session(&self) -> &Session {
        &self.info.session
    }

    pub(crate) fn info(&self) -> &ConnInfo {
        &self.info
    }
}

impl<IO> Drop for CubeConn<IO> {
    fn drop(&mut self) {
        self.registry.close(self.info.id);
        let model = self.info.session.gauge_model.swap(CLOSED, Ordering::AcqRel);
        cube_metrics::CONNECTIONS_OPEN
            .with_label_values(&[gauge_label(model)])
            .dec();
    }
}

impl<IO> Connected for CubeConn<IO> {
    type ConnectInfo = ConnInfo;

    fn connect_info(&self) -> ConnInfo {
        self.info.clone()
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for CubeConn<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let this = &mut *self;
        let polled = Pin::new(&mut this.io).poll_read(cx, buf);
        let Some(preface) = &mut this.preface else {
            return polled;
        };
        match polled {
            Poll::Ready(Ok(())) => {
                if preface.take(&buf.filled()[before..]) {
                    this.preface = None;
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending => {
                let by = preface.by;
                let timer = preface
                    .timer
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(by)));
                if timer.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                cube_metrics::CONNECTIONS_PREFACE_TIMEOUTS.inc();
                tracing::debug!(remote = ?this.info.remote, read = preface.read, "no HTTP/2 preface in time; closing");
                Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "no HTTP/2 connection preface within the deadline",
                )))
            }
            failed => failed,
        }
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for CubeConn<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(tenant: &str, key_id: &str) -> Arc<KeyInfo> {
        Arc::new(KeyInfo {
            tenant: tenant.into(),
            key_id: key_id.into(),
            secret: [0; 32],
            capabilities: vec![],
            revoked: false,
            prepared: Default::default(),
        })
    }

    /// The preface is in once the magic and the whole SETTINGS frame its header announces are,
    /// however the bytes are cut into reads.
    #[test]
    fn the_preface_is_the_magic_and_its_settings_frame() {
        let deadline = || PrefaceDeadline {
            by: tokio::time::Instant::now(),
            timer: None,
            read: 0,
            head: [0; PREFACE_LEN + FRAME_HEADER_LEN],
        };
        let magic = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
        // A SETTINGS frame of one setting (6 bytes).
        let mut preface = magic.to_vec();
        preface.extend_from_slice(&[0, 0, 6, 4, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 100]);
        for cut in 1..preface.len() {
            let mut p = deadline();
            let (a, b) = preface.split_at(cut);
            assert!(!p.take(a), "in after {cut} bytes");
            assert!(p.take(b), "not in after all of it, cut at {cut}");
        }
        let mut p = deadline();
        assert!(!p.take(magic), "the magic alone");
        assert!(!p.take(&[0, 0, 6, 4, 0, 0, 0, 0, 0, 0, 3]));
        assert!(
            p.take(&[0, 0, 0, 100, 0, 0, 0, 4, 1, 0, 0, 0, 0]),
            "more than it"
        );
        // An empty SETTINGS frame: the header is the end.
        let mut p = deadline();
        assert!(p.take(&[magic.as_slice(), &[0, 0, 0, 4, 0, 0, 0, 0, 0]].concat()));
        // A length past any frame a server takes is counted at the largest one.
        let mut p = deadline();
        assert!(!p.take(&[magic.as_slice(), &[0xff, 0xff, 0xff, 4, 0, 0, 0, 0, 0]].concat()));
        assert!(p.take(&vec![0; MAX_SETTINGS_LEN]));
    }

    #[test]
    fn sessions_end_on_close_and_on_revocation_of_their_key() {
        let registry = Arc::new(ConnectionRegistry::default());
        let (a, b) = (registry.open(None), registry.open(None));
        a.session.authenticate(key("t", "k1"));
        b.session.authenticate(key("t", "k2"));
        assert_eq!(registry.end_sessions_of("t", "k1"), 1);
        assert!(a.session.revoked() && !b.session.revoked());
        // Ended once: a second revoke of the same key ends nothing more.
        assert_eq!(registry.end_sessions_of("t", "k1"), 0);
        // `cube_connections_open` counts the ended one as unauthenticated again.
        assert_eq!(a.session.gauge_model.load(Ordering::Relaxed), 0);
        assert_eq!(b.session.gauge_model.load(Ordering::Relaxed), 2);
        // A new handshake on the connection starts a new session.
        a.session.authenticate(key("t", "k3"));
        assert!(!a.session.revoked());
        assert_eq!(a.session.gauge_model.load(Ordering::Relaxed), 2);
        // A signed call does not move a handshake-authenticated connection down to `call`.
        a.session.saw_signed_call();
        assert_eq!(a.session.gauge_model.load(Ordering::Relaxed), 2);
        let conn = CubeConn::new((), &registry, None);
        assert_eq!(registry.len(), 3);
        let session = conn.info.session.clone();
        drop(conn);
        assert_eq!(registry.len(), 2);
        // A request task that outlives its connection moves nothing.
        session.authenticate(key("t", "k4"));
        session.saw_signed_call();
        assert_eq!(session.gauge_model.load(Ordering::Relaxed), CLOSED);
    }

    #[test]
    fn a_challenge_is_single_use() {
        let s = Session::default();
        s.set_challenge(PendingChallenge {
            tenant: "t".into(),
            key_id: "k".into(),
            nonce: [1; 32],
            expires_at: Instant::now(),
        });
        assert!(s.take_challenge().is_some());
        assert!(s.take_challenge().is_none());
    }
}
