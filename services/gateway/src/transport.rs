//! The network listener's connections: plaintext TCP or TLS, each wrapped in a [`CubeConn`].
//!
//! TLS handshakes run in their own tasks (with a timeout), so one slow or malicious client cannot
//! hold up the accept loop. A verified client certificate authenticates its connection's session
//! before the first request. Every connection must then send its HTTP/2 preface within the
//! preface timeout ([`CubeConn::with_preface_deadline`]).

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use crate::auth_layer::Authenticator;
use cube_metrics::TlsHandshakeFailure;
use futures::Stream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;

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

/// How long the accept loop waits after a failed accept (no file descriptor left, say) before
/// it tries again: retrying at once would spin a core while the condition lasts.
pub(crate) const ACCEPT_RETRY: Duration = Duration::from_millis(50);

/// At most one warning per period: a condition met on every connection (a failed accept, a
/// certificate clients refuse) is logged once in a while, not once per connection.
pub struct WarnEvery {
    every: Duration,
    last: Mutex<Option<Instant>>,
}

impl WarnEvery {
    pub const fn new(every: Duration) -> WarnEvery {
        WarnEvery {
            every,
            last: Mutex::new(None),
        }
    }

    /// Whether a warning may be logged now; if so, the period starts again.
    pub fn due(&self) -> bool {
        self.due_at(Instant::now())
    }

    /// [`WarnEvery::due`] at `now`.
    fn due_at(&self, now: Instant) -> bool {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if last.is_some_and(|t| now.duration_since(t) < self.every) {
            return false;
        }
        *last = Some(now);
        true
    }
}

/// Clients refusing the server's certificate are warned about at most this often.
static CERTIFICATE_REJECTED: WarnEvery = WarnEvery::new(Duration::from_secs(60));
/// Clients presenting an expired client certificate, likewise.
static CLIENT_CERTIFICATE_EXPIRED: WarnEvery = WarnEvery::new(Duration::from_secs(60));

/// Count a TLS handshake that failed, and say why where the server's operator can act on it
/// (logged first: once it is counted, its line is in the log).
fn handshake_failed(
    remote: SocketAddr,
    failure: TlsHandshakeFailure,
    error: &dyn std::fmt::Display,
    expired_client_certificate: bool,
) {
    if failure == TlsHandshakeFailure::CertificateRejected && CERTIFICATE_REJECTED.due() {
        tracing::warn!(
            %remote,
            %error,
            "a client refused this server's TLS certificate: check that it is valid now, names \
             the address clients dial, and chains to a CA they trust (counted in \
             cube_tls_handshake_failures_total; logged at most once a minute)"
        );
    } else if expired_client_certificate && CLIENT_CERTIFICATE_EXPIRED.due() {
        // Certificates from `cubed key cert` expire (--days): a client still using one is
        // refused at every connection until it gets a new one.
        tracing::warn!(
            %remote,
            %error,
            "a client presented an expired client certificate (its issuer not checked: the \
             validity is checked first): if it is one of this data directory's, issue it a new \
             one (`cubed key cert`); counted in cube_tls_handshake_failures_total{{reason=\"client_certificate\"}}, \
             logged at most once a minute"
        );
    } else {
        tracing::debug!(%remote, %error, reason = failure.label(), "TLS handshake failed");
    }
    failure.counter().inc();
}

/// Whether a TLS handshake failed on the client's certificate being expired.
fn is_expired_certificate(e: &io::Error) -> bool {
    use tokio_rustls::rustls::{CertificateError as C, Error as E};
    matches!(
        e.get_ref().and_then(|inner| inner.downcast_ref::<E>()),
        Some(E::InvalidCertificate(C::Expired | C::ExpiredContext { .. }))
    )
}

/// Why a TLS handshake failed, from the error tokio-rustls gave (a rustls error wrapped in an
/// I/O error; a bare I/O error is the connection failing).
fn classify_handshake_error(e: &io::Error) -> TlsHandshakeFailure {
    use tokio_rustls::rustls::{AlertDescription as A, Error as E};
    match e.get_ref().and_then(|inner| inner.downcast_ref::<E>()) {
        Some(E::AlertReceived(
            A::BadCertificate
            | A::UnsupportedCertificate
            | A::CertificateRevoked
            | A::CertificateExpired
            | A::CertificateUnknown
            | A::UnknownCA,
        )) => TlsHandshakeFailure::CertificateRejected,
        Some(E::InvalidCertificate(_) | E::NoCertificatesPresented) => {
            TlsHandshakeFailure::ClientCertificate
        }
        Some(_) => TlsHandshakeFailure::Protocol,
        None => TlsHandshakeFailure::Closed,
    }
}

/// What the accept loop enforces.
#[derive(Debug, Clone, Copy)]
pub struct AcceptLimits {
    /// Open connections at most (TLS handshakes under way included).
    pub max_connections: usize,
    /// Open connections from one client address (an IPv4 address or an IPv6 /64) at most, TLS
    /// handshakes included (at least 1); `None`: no cap of its own.
    pub max_per_address: Option<usize>,
    /// From accept (under TLS: from the handshake's end) until the HTTP/2 preface must be in.
    pub preface_timeout: Duration,
    /// How long data sent may stay unacknowledged, a receive window the peer keeps closed
    /// included, before the kernel drops the connection (`TCP_USER_TIMEOUT`): a peer that
    /// stops reading cannot hold its place for ever (HTTP/2 keepalive cannot end such a
    /// connection, since its PING and then its GOAWAY wait behind the unsent data). `None`:
    /// the kernel's default (retransmissions give up after ~15 min; a closed window is probed
    /// for ever).
    pub unacked_timeout: Option<Duration>,
}

/// Small request/response round trips dominate: Nagle would add 40 ms stalls. Then
/// [`AcceptLimits::unacked_timeout`].
fn tune(tcp: &TcpStream, limits: &AcceptLimits) {
    let _ = tcp.set_nodelay(true);
    if let Some(limit) = limits.unacked_timeout {
        let ms = u32::try_from(limit.as_millis()).unwrap_or(u32::MAX);
        if let Err(e) =
            nix::sys::socket::setsockopt(tcp, nix::sys::socket::sockopt::TcpUserTimeout, &ms)
        {
            tracing::debug!(error = %e, "TCP_USER_TIMEOUT not set");
        }
    }
}

/// Open connections per client IP address, for [`AcceptLimits::max_per_address`] (and the admin
/// HTTP listener's own cap per address).
#[derive(Debug, Default)]
pub struct AddressCounts(Mutex<HashMap<IpAddr, usize>>);

impl AddressCounts {
    /// A place for one more connection from peer `ip`, counted as the failed-authentication
    /// limit counts peers (an IPv4 address, or an IPv6 /64), unless `max` are open already.
    pub fn take_peer(self: &Arc<Self>, ip: IpAddr, max: usize) -> Option<AddressSlot> {
        self.take(crate::abuse::peer_key(ip), max)
    }

    /// A place for one more connection from `ip`, unless `max` (at least 1) are open.
    fn take(self: &Arc<Self>, ip: IpAddr, max: usize) -> Option<AddressSlot> {
        let mut open = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let n = open.entry(ip).or_insert(0);
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(AddressSlot {
            counts: Arc::clone(self),
            ip,
        })
    }
}

/// One connection's place in its client address's count, from accept (TLS handshake included)
/// until the connection closes.
#[derive(Debug)]
pub struct AddressSlot {
    counts: Arc<AddressCounts>,
    ip: IpAddr,
}

impl Drop for AddressSlot {
    fn drop(&mut self) {
        let mut open = self.counts.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Entry::Occupied(mut e) = open.entry(self.ip) {
            *e.get_mut() -= 1;
            if *e.get() == 0 {
                e.remove();
            }
        }
    }
}

/// The accept loop's guard: the caps on open connections (in all and per client address), and
/// its warnings at most once a second.
struct Gate {
    registry: Arc<ConnectionRegistry>,
    limits: AcceptLimits,
    by_address: Arc<AddressCounts>,
    /// TLS handshakes under way (not in the registry yet).
    handshaking: Arc<AtomicUsize>,
    warnings: WarnEvery,
}

impl Gate {
    fn new(registry: Arc<ConnectionRegistry>, limits: AcceptLimits) -> Gate {
        Gate {
            registry,
            limits,
            by_address: Arc::default(),
            handshaking: Arc::default(),
            warnings: WarnEvery::new(Duration::from_secs(1)),
        }
    }

    fn warn(&self, what: &str, detail: &dyn std::fmt::Display) {
        if self.warnings.due() {
            tracing::warn!(%detail, "{what}");
        }
    }

    /// The next connection within the caps, with its place in its address's count. A
    /// connection over a cap is closed at once (so it holds no descriptor the server's own files
    /// need; the client sees a reset and may retry).
    async fn accept(
        &mut self,
        listener: &TcpListener,
    ) -> (TcpStream, SocketAddr, Option<AddressSlot>) {
        loop {
            let (tcp, remote) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    self.warn("accept failed; retrying shortly", &e);
                    tokio::time::sleep(ACCEPT_RETRY).await;
                    continue;
                }
            };
            // Handshakes first: one that ends between the two reads (it joins the registry,
            // then leaves this count) is then counted twice, never missed.
            let handshaking = self.handshaking.load(Ordering::Acquire);
            let open = self.registry.len() + handshaking;
            if open >= self.limits.max_connections {
                cube_metrics::CONNECTIONS_REFUSED.inc();
                let max = self.limits.max_connections;
                self.warn(
                    "connection refused: --max-connections are open",
                    &format_args!("{max} open, {remote} refused"),
                );
                drop(tcp);
                continue;
            }
            let slot = match self.limits.max_per_address {
                None => None,
                // Counted as the failed-authentication limit counts peers: an IPv4 address (also
                // on a dual-stack socket), or an IPv6 /64 (one host usually holds a whole one).
                Some(max) => match self.by_address.take_peer(remote.ip(), max) {
                    Some(slot) => Some(slot),
                    None => {
                        cube_metrics::CONNECTIONS_ADDRESS_REFUSED.inc();
                        self.warn(
                            "connection refused: --max-connections-per-address are open from its address",
                            &format_args!("{max} open from its address, {remote} refused"),
                        );
                        drop(tcp);
                        continue;
                    }
                },
            };
            tune(&tcp, &self.limits);
            return (tcp, remote, slot);
        }
    }
}

/// Accept plaintext connections within `limits`.
pub fn plain(
    listener: TcpListener,
    registry: Arc<ConnectionRegistry>,
    limits: AcceptLimits,
) -> Incoming {
    let gate = Gate::new(registry, limits);
    Box::pin(futures::stream::unfold(
        (listener, gate),
        |(listener, mut gate)| async move {
            let (tcp, remote, slot) = gate.accept(&listener).await;
            let conn = CubeConn::new(Transport::Plain(tcp), &gate.registry, Some(remote))
                .with_preface_deadline(gate.limits.preface_timeout)
                .holding(slot);
            Some((Ok(conn), (listener, gate)))
        },
    ))
}

/// Accept TLS connections. The returned task owns the listener: it ends (closing it) when the
/// stream is dropped, which tonic does as soon as shutdown begins; the handle aborts it when
/// serving stops otherwise. A client certificate authenticates its connection only if
/// `certificates_authenticate` (not in `--auth-mode call`, where only signed calls count).
pub fn tls(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    registry: Arc<ConnectionRegistry>,
    auth: Arc<Authenticator>,
    limits: AcceptLimits,
    certificates_authenticate: bool,
) -> (Incoming, tokio::task::JoinHandle<()>) {
    let (tx, rx) = tokio::sync::mpsc::channel(256);
    let mut gate = Gate::new(Arc::clone(&registry), limits);
    let task = tokio::spawn(async move {
        loop {
            let (tcp, remote, slot) = tokio::select! {
                biased;
                // Nobody takes connections any more (a stop began): close the listener rather
                // than handshake with clients that will be dropped.
                () = tx.closed() => return,
                accepted = gate.accept(&listener) => accepted,
            };
            let (acceptor, registry, auth, tx) = (
                acceptor.clone(),
                Arc::clone(&registry),
                Arc::clone(&auth),
                tx.clone(),
            );
            gate.handshaking.fetch_add(1, Ordering::Relaxed);
            let handshaking = Handshaking(Arc::clone(&gate.handshaking));
            tokio::spawn(async move {
                // Counted until the connection is in the registry (or closed on any path out).
                let handshaking = handshaking;
                let tls = match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(tcp))
                    .await
                {
                    Ok(Ok(tls)) => tls,
                    Ok(Err(e)) => {
                        handshake_failed(
                            remote,
                            classify_handshake_error(&e),
                            &e,
                            is_expired_certificate(&e),
                        );
                        return;
                    }
                    Err(_) => {
                        handshake_failed(remote, TlsHandshakeFailure::Timeout, &"timed out", false);
                        return;
                    }
                };
                let identity = tls
                    .get_ref()
                    .1
                    .peer_certificates()
                    .and_then(|c| c.first())
                    .and_then(client_identity);
                let conn = CubeConn::new(Transport::Tls(Box::new(tls)), &registry, Some(remote))
                    .with_preface_deadline(limits.preface_timeout)
                    .holding(slot);
                drop(handshaking);
                if let Some((tenant, key_id)) = identity.filter(|_| certificates_authenticate) {
                    match auth.catalog().key(&tenant, &key_id).filter(|k| !k.revoked) {
                        Some(key) => {
                            conn.session().authenticate(key);
                            // A revocation between the lookup and the binding found no session
                            // of the key to end (as `Auth.Hello` does, end it here): its calls
                            // would be refused anyway, but the connection would count as
                            // authenticated.
                            if auth
                                .catalog()
                                .key(&tenant, &key_id)
                                .is_none_or(|k| k.revoked)
                            {
                                conn.session().end_if_key(&tenant, &key_id);
                            }
                        }
                        None => {
                            conn.session().refuse_certificate(&tenant, &key_id);
                            // A failed authentication like any other: it counts against the
                            // address, and the tenant's trail and the log record it, unless the
                            // address is throttled already (so one address cannot take the
                            // tenant's budget of such entries, nor fill the log by reconnecting
                            // in a loop).
                            let info = Some(conn.info());
                            if auth.check_throttle(info).is_ok() {
                                tracing::info!(%remote, %tenant, %key_id, "client certificate for an unknown or revoked key");
                                auth.record_failure(info);
                                auth.record_failed_auth(
                                    &tenant,
                                    "connection",
                                    &format!(
                                        "client certificate of an unknown or revoked key '{}'",
                                        cube_store::clipped(&key_id)
                                    ),
                                    info,
                                );
                            }
                        }
                    }
                }
                let _ = tx.send(Ok(conn)).await;
            });
        }
    });
    (Box::pin(ReceiverStream::new(rx)), task)
}

/// A TLS handshake under way, counted against `--max-connections` until its task ends (the
/// connection is in the registry by then, or closed).
struct Handshaking(Arc<AtomicUsize>);

impl Drop for Handshaking {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Release);
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt as _;
    use tokio::io::AsyncWriteExt as _;

    /// A warning is due once per period: the first at once, then none until the period has
    /// passed since it.
    #[test]
    fn a_warning_is_due_once_per_period() {
        let every = WarnEvery::new(Duration::from_secs(60));
        let start = Instant::now();
        let at = |secs| start + Duration::from_secs(secs);
        assert!(every.due_at(at(0)));
        assert!(!every.due_at(at(1)));
        assert!(!every.due_at(at(59)));
        assert!(every.due_at(at(60)));
        assert!(!every.due_at(at(61)));
        assert!(every.due_at(at(200)));
    }

    /// Each way a TLS handshake fails is told apart from the error tokio-rustls hands back: a
    /// rustls error wrapped in an I/O error, or a bare I/O error.
    #[test]
    fn failed_handshakes_are_classified_by_their_error() {
        use tokio_rustls::rustls::{AlertDescription, CertificateError, Error};
        let wrapped = |e: Error| io::Error::new(io::ErrorKind::InvalidData, e);
        for alert in [
            AlertDescription::CertificateExpired,
            AlertDescription::UnknownCA,
            AlertDescription::BadCertificate,
        ] {
            assert_eq!(
                classify_handshake_error(&wrapped(Error::AlertReceived(alert))),
                TlsHandshakeFailure::CertificateRejected,
                "{alert:?}"
            );
        }
        assert_eq!(
            classify_handshake_error(&wrapped(Error::InvalidCertificate(
                CertificateError::UnknownIssuer
            ))),
            TlsHandshakeFailure::ClientCertificate
        );
        // An expired one is a client certificate failure too, and told apart (logged).
        let expired = wrapped(Error::InvalidCertificate(CertificateError::Expired));
        assert_eq!(
            classify_handshake_error(&expired),
            TlsHandshakeFailure::ClientCertificate
        );
        assert!(is_expired_certificate(&expired));
        // What rustls with webpki gives: the variant with its times.
        let at = |secs| {
            tokio_rustls::rustls::pki_types::UnixTime::since_unix_epoch(
                std::time::Duration::from_secs(secs),
            )
        };
        let expired = wrapped(Error::InvalidCertificate(
            CertificateError::ExpiredContext {
                time: at(2_000_000_000),
                not_after: at(1_900_000_000),
            },
        ));
        assert!(is_expired_certificate(&expired));
        assert!(!is_expired_certificate(&wrapped(
            Error::InvalidCertificate(CertificateError::UnknownIssuer)
        )));
        assert_eq!(
            classify_handshake_error(&wrapped(Error::AlertReceived(
                AlertDescription::ProtocolVersion
            ))),
            TlsHandshakeFailure::Protocol
        );
        assert_eq!(
            classify_handshake_error(&io::Error::from(io::ErrorKind::UnexpectedEof)),
            TlsHandshakeFailure::Closed
        );
    }

    /// A peer that stops reading is dropped once what was sent to it has waited
    /// `unacked_timeout`: the server's pending write fails instead of waiting for ever.
    #[tokio::test]
    async fn a_peer_that_stops_reading_is_dropped_after_the_unacked_timeout() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let limits = AcceptLimits {
            max_connections: 4,
            max_per_address: None,
            preface_timeout: Duration::from_secs(600),
            unacked_timeout: Some(Duration::from_millis(500)),
        };
        let mut incoming = plain(listener, Arc::default(), limits);
        // Connected, and never read from.
        let _peer = TcpStream::connect(addr).await.unwrap();
        let mut conn = incoming.next().await.unwrap().unwrap();
        let chunk = vec![0u8; 1 << 20];
        let started = Instant::now();
        let written = tokio::time::timeout(Duration::from_secs(60), async {
            loop {
                conn.write_all(&chunk).await?;
            }
            #[allow(unreachable_code)]
            Ok::<(), io::Error>(())
        })
        .await
        .expect("the write waited for a peer that reads nothing past the timeout");
        let e = written.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut, "{e}");
        assert!(started.elapsed() >= Duration::from_millis(500));
    }
}
