//! Wiring: the network listener (health, reflection, cube.v1 behind the auth layer) and the local
//! admin socket. The library receives bound listeners and a shutdown future, so tests bind port
//! 0 and never sleep.

use std::future::Future;
use std::sync::Arc;

use cube_api::v1::access_server::AccessServer;
use cube_api::v1::admin_server::AdminServer;
use cube_api::v1::auth_server::AuthServer;
use cube_api::v1::cells_server::CellsServer;
use cube_store::{Catalog, TenantDirectory};

use crate::replay::{AHEAD_MS, ReplayCache};
use crate::replay_clock::{LEASE_MS, RENEW_EVERY};
use tokio::net::{TcpListener, UnixListener};
use tonic::transport::Server;

use crate::abuse::FailureLimits;
use crate::auth_layer::{AuthLayer, AuthMode, Authenticator};
use crate::connection::ConnectionRegistry;
use crate::oversize;
use crate::receive::ReceiveLayer;
use crate::send::SendLayer;
use crate::services::access::AccessService;
use crate::services::admin::AdminService;
use crate::services::cells::{CellsService, ScanLimits};
use crate::services::handshake::HandshakeService;
use crate::services::tenant::{TenantRoutes, TenantService};
use crate::tls::{TlsError, TlsSettings, server_config};
use crate::transport;

/// Largest request message of the services that answer before authentication (`Auth`'s
/// handshake, health, reflection): their requests are a few hundred bytes, and a stranger must
/// not make the server buffer `--max-message-bytes` (4 MiB by default) on each of a
/// connection's streams.
pub const OPEN_MESSAGE_BYTES: usize = 16 * 1024;

/// Streams one connection may have reset by the server for its protocol errors before the
/// server ends the connection (see [`Gateway::serve`]).
pub const MAX_LOCAL_ERROR_RESETS: usize = 1024;

/// The largest request message any method of the network listener takes: the services open to
/// everyone take [`OPEN_MESSAGE_BYTES`] whatever `--max-message-bytes` says.
pub fn largest_request_message(max_message_bytes: usize) -> usize {
    max_message_bytes.max(OPEN_MESSAGE_BYTES)
}

/// The least `--max-connection-receive-bytes` can be: the largest request message with its
/// gRPC prefix must be able to arrive (`crate::receive`).
pub fn min_connection_receive_bytes(max_message_bytes: usize) -> usize {
    largest_request_message(max_message_bytes) + crate::receive::PREFIX_LEN
}

/// Largest `Cells.Walk` request: its most labels at their longest (each a 2-byte field header
/// and the label), plus room for the other fields. prost decodes every listed label before the
/// service can refuse more than [`cube_store::MAX_WALK_LABEL_ENTRIES`], and an empty label costs
/// 2 bytes on the wire but 24 in memory: under `--max-message-bytes` one 4 MiB request would
/// hold some 50 MiB while it was decoded.
pub const WALK_MESSAGE_BYTES: usize =
    cube_store::MAX_WALK_LABEL_ENTRIES * (cube_store::MAX_LABEL_BYTES + 2) + 1024;

/// Largest `Access.Grant` / `Access.Revoke` request (a key id and its list of capabilities,
/// repeats counted once, a few hundred bytes in any real use): a packed list of capabilities
/// takes 4 bytes in memory for each byte on the wire while it is decoded, so the bound keeps a
/// long list of repeats small.
pub const ACCESS_MESSAGE_BYTES: usize = OPEN_MESSAGE_BYTES;

/// Limits and auth settings of the network listener.
#[derive(Debug, Clone)]
pub struct GatewayConfig {
    /// Largest request message accepted (bigger ones are refused before decoding, with
    /// INVALID_ARGUMENT: [`crate::oversize`]).
    pub max_message_bytes: usize,
    /// Bytes of request messages one connection's calls may be receiving at once
    /// (`crate::receive`); at least [`min_connection_receive_bytes`].
    pub max_connection_receive_bytes: usize,
    /// Bytes of unary answers one connection's client may leave unread before its calls are
    /// refused (`crate::send`); at least [`crate::MIN_CONNECTION_SEND_BYTES`].
    pub max_connection_send_bytes: usize,
    /// Largest cell value or program (`--max-value-bytes`): what a `Cells.Run` answer may
    /// return, reserved against the send limit for each `Run` in progress (`crate::send`).
    pub max_value_bytes: usize,
    /// Allowed distance between a signed call's timestamp and the server clock.
    pub skew_ms: i64,
    /// Nonces remembered by the replay cache at most.
    pub replay_capacity: usize,
    /// Where the replay cache keeps future-stamped calls' floors across restarts (`None`: not
    /// kept; for tests and tools).
    pub replay_floors: Option<std::path::PathBuf>,
    /// HTTP/2 streams per connection at most.
    pub max_concurrent_streams: u32,
    /// Open connections at most; more are closed at accept.
    pub max_connections: usize,
    /// Open connections from one client IP address at most; more are closed at accept. `None`:
    /// no cap of its own.
    pub max_connections_per_address: Option<usize>,
    /// A new connection must send the whole HTTP/2 preface within this (under TLS: after its
    /// handshake), or it is closed.
    pub preface_timeout: std::time::Duration,
    /// HTTP/2 keepalive: a PING to a connection that has sent no request headers or data (nor
    /// answered a PING) for this long, and the connection closed if the PING is not answered
    /// within as long again. `None`: no pings.
    pub keepalive: Option<std::time::Duration>,
    /// How long a call may take until its answer at most (answered DEADLINE_EXCEEDED then);
    /// `None`: only the client's own `grpc-timeout`.
    pub call_timeout: Option<std::time::Duration>,
    /// Which authentication models are accepted.
    pub auth_mode: AuthMode,
    /// Throttling of peers that keep failing authentication.
    pub failure_limits: FailureLimits,
    /// Largest request metadata (HTTP/2 header list) accepted, in bytes.
    pub max_metadata_bytes: u32,
    /// Serve TLS (and accept client certificates if it names a client CA).
    pub tls: Option<TlsSettings>,
    /// Record per-RPC metrics (off only to measure their cost).
    pub metrics: bool,
    /// Result sizes of Region and Walk.
    pub scan_limits: ScanLimits,
}

/// Why serving stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("building the reflection service failed: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    #[error("the gRPC transport failed: {0}")]
    Transport(#[from] tonic::transport::Error),
    #[error("TLS: {0}")]
    Tls(#[from] TlsError),
    /// The replay protection's files in the data directory (`replay-floors`, `replay-clock`);
    /// the error names the file.
    #[error("opening the replay protection's files: {0}")]
    ReplayFloors(std::io::Error),
}

/// The gRPC gateway over one catalog and one tenant directory.
#[derive(Debug, Clone)]
pub struct Gateway {
    directory: Arc<TenantDirectory>,
    config: GatewayConfig,
    /// Created with the gateway, before the server announces it is ready: its replay watermark
    /// is the start time, and no call signed after "ready" may fall below it.
    auth: Arc<Authenticator>,
    catalog: Arc<Catalog>,
    connections: Arc<ConnectionRegistry>,
    /// `None` serves plaintext.
    tls: Option<Arc<tokio_rustls::rustls::ServerConfig>>,
}

impl Gateway {
    /// How long until signed calls stamped with the current time are accepted: the replay cache
    /// refuses timestamps up to a second past the start, which a previous server may have
    /// accepted (see `replay.rs`). The server announces itself ready only then.
    /// At most a second and a lease: a longer wait means the clock stepped back, and signed
    /// calls are refused as too old until it catches up (handshakes are served meanwhile).
    pub fn replay_ready_in(&self) -> std::time::Duration {
        let most = AHEAD_MS + LEASE_MS;
        let wait = self.auth.replay_ready_ms() - crate::auth_layer::now_ms();
        std::time::Duration::from_millis(wait.clamp(0, most) as u64)
    }

    /// Fails if the TLS settings are unusable or the replay floors file unreadable.
    pub fn new(
        catalog: Arc<Catalog>,
        directory: Arc<TenantDirectory>,
        config: GatewayConfig,
    ) -> Result<Gateway, ServeError> {
        let tls = config.tls.as_ref().map(server_config).transpose()?;
        let start = crate::auth_layer::now_ms();
        let replay = match &config.replay_floors {
            Some(path) => ReplayCache::with_floors(
                config.replay_capacity,
                config.skew_ms,
                start,
                path.clone(),
            )
            .map_err(ServeError::ReplayFloors)?,
            None => ReplayCache::new(config.replay_capacity, config.skew_ms, start),
        };
        let behind = replay.ready_ms() - start - AHEAD_MS;
        if behind > LEASE_MS {
            tracing::warn!(
                behind_ms = behind,
                "the server clock is behind the replay clock mark a previous server left: it \
                 stepped backwards, or ran ahead while that server ran. Signed calls stamped \
                 before the mark are refused as too old until the clock passes it (about {} s); \
                 per-connection handshakes are not affected. If the clock ran ahead and was set \
                 right, see docs/operations.md (\"A clock that ran ahead\") before deleting \
                 replay-clock",
                behind / 1000
            );
        }
        let mut auth = Authenticator::new(
            Arc::clone(&catalog),
            config.auth_mode,
            config.skew_ms,
            replay,
            config.failure_limits,
            Some(Arc::clone(&directory)),
        );
        auth.metrics = config.metrics;
        auth.client_certificates = config
            .tls
            .as_ref()
            .is_some_and(|t| t.client_ca_pem.is_some());
        let auth = Arc::new(auth);
        Ok(Gateway {
            directory,
            config,
            auth,
            catalog,
            connections: Arc::default(),
            tls,
        })
    }

    /// Serve gRPC on `listener` until `shutdown` resolves, then stop accepting and wait for the
    /// calls in flight. `accepting` runs once everything before the accept loop is done (the
    /// replay clock mark's first renewal among it, an fdatasync), as the loop starts: where a
    /// readiness flag is set. Closing the tenants is the caller's next step.
    pub async fn serve(
        &self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send,
        accepting: impl FnOnce() + Send,
    ) -> Result<(), ServeError> {
        let (health_reporter, health) = tonic_health::server::health_reporter();
        health_reporter
            .set_serving::<CellsServer<CellsService>>()
            .await;
        let reflection = || {
            tonic_reflection::server::Builder::configure()
                .register_encoded_file_descriptor_set(cube_api::FILE_DESCRIPTOR_SET)
                .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        };
        let health = health.max_decoding_message_size(OPEN_MESSAGE_BYTES);
        let reflection_v1 = reflection()
            .build_v1()?
            .max_decoding_message_size(OPEN_MESSAGE_BYTES);
        let reflection_v1alpha = reflection()
            .build_v1alpha()?
            .max_decoding_message_size(OPEN_MESSAGE_BYTES);
        let max = self.config.max_message_bytes;
        let cells = CellsRoutes::new(
            CellsService {
                directory: Arc::clone(&self.directory),
                limits: self.config.scan_limits,
            },
            max,
        );
        let renewer = if self.auth.replay().has_clock() {
            // Renewed once before any connection is taken: since `new` the mark may have
            // fallen behind the clock (the wait for the replay window, a crash's lease).
            if let Err(e) = renew_clock_once(&self.auth).await {
                tracing::error!(error = %e, "the replay clock mark could not be renewed: signed calls wait for it, and are refused with UNAVAILABLE after {} s, until it is", crate::auth_layer::MARK_WAIT.as_secs());
            }
            Some(AbortOnDrop(tokio::spawn(renew_clock(Arc::clone(
                &self.auth,
            )))))
        } else {
            None
        };
        let registry = Arc::clone(&self.connections);
        let limits = transport::AcceptLimits {
            max_connections: self.config.max_connections,
            max_per_address: self.config.max_connections_per_address,
            preface_timeout: self.config.preface_timeout,
            // As long as keepalive takes to give up on a peer that answers nothing.
            unacked_timeout: self.config.keepalive.map(|k| k.saturating_mul(2)),
        };
        let (incoming, acceptor_task) = match &self.tls {
            Some(config) => {
                let acceptor = tokio_rustls::TlsAcceptor::from(Arc::clone(config));
                let (incoming, task) = transport::tls(
                    listener,
                    acceptor,
                    registry,
                    Arc::clone(&self.auth),
                    limits,
                    self.config.auth_mode.allows_connection(),
                );
                (incoming, Some(AbortOnDrop(task)))
            }
            None => (transport::plain(listener, registry, limits), None),
        };
        let stopping = async move {
            shutdown.await;
            health_reporter
                .set_not_serving::<CellsServer<CellsService>>()
                .await;
            // The whole server too (the empty service name): clients that check that, as
            // gRPC's client-side health checking does, stop sending here.
            health_reporter
                .set_service_status("", tonic_health::ServingStatus::NotServing)
                .await;
            tracing::info!("stopped accepting; draining calls in flight");
        };
        let served = Server::builder()
            .max_concurrent_streams(Some(self.config.max_concurrent_streams))
            .http2_max_header_list_size(Some(self.config.max_metadata_bytes))
            .http2_keepalive_interval(self.config.keepalive)
            // As long again, not tonic's 20 s: a PING queues behind the DATA already sent, which
            // on a slow link to a client with a large window can take a while.
            .http2_keepalive_timeout(self.config.keepalive)
            // h2's own default, which tonic's builder (passing `None` through hyper) turns into
            // no limit at all: streams the server itself resets for a peer's protocol errors
            // (malformed headers, DATA past END_STREAM, a window overflow) end the connection
            // with ENHANCE_YOUR_CALM after this many, so that such resets, which free a
            // stream's place at once, cannot start handlers past `--max-concurrent-streams`
            // (CVE-2025-8671, "MadeYouReset").
            .http2_max_local_error_reset_streams(Some(MAX_LOCAL_ERROR_RESETS))
            // Outermost first: the auth layer's metrics see the code the oversize layer sends.
            .layer(
                tower::ServiceBuilder::new()
                    .layer(AuthLayer::new(
                        Arc::clone(&self.auth),
                        self.config.call_timeout,
                    ))
                    .layer(oversize::layer(max))
                    .layer(ReceiveLayer::new(
                        self.config.max_connection_receive_bytes,
                        largest_request_message(max),
                    ))
                    .layer(SendLayer::new(
                        self.config.max_connection_send_bytes,
                        self.config.max_value_bytes + crate::send::RUN_ANSWER_OVERHEAD,
                    )),
            )
            .add_service(oversize::DecodeRefusals(health))
            .add_service(reflection_v1)
            .add_service(reflection_v1alpha)
            .add_service(cells)
            .add_service(
                AccessServer::new(AccessService {
                    directory: Arc::clone(&self.directory),
                })
                .max_decoding_message_size(ACCESS_MESSAGE_BYTES.min(max)),
            )
            .add_service(TenantRoutes::new(
                TenantService {
                    directory: Arc::clone(&self.directory),
                    page_read: self.config.scan_limits.page_read,
                },
                max,
            ))
            .add_service(
                AuthServer::new(HandshakeService {
                    auth: Arc::clone(&self.auth),
                })
                .max_decoding_message_size(OPEN_MESSAGE_BYTES),
            )
            .add_service(
                AdminServer::new(AdminService {
                    catalog: None,
                    connections: None,
                    directory: None,
                })
                .max_decoding_message_size(OPEN_MESSAGE_BYTES),
            )
            .serve_with_incoming_shutdown(incoming, stopping);
        accepting();
        let served = served.await;
        drop(acceptor_task);
        drop(renewer);
        served?;
        Ok(())
    }

    /// Lower the replay clock mark to now, so that the next start need not wait out its lease:
    /// for after [`Gateway::serve`] has returned, or been dropped when its drain ran out of time
    /// (its connections were sent GOAWAY: no call is accepted any more either way). A failure
    /// is logged; the next start then waits up to a second more.
    pub async fn settle_clock(&self) {
        if !self.auth.replay().has_clock() {
            return;
        }
        let auth = Arc::clone(&self.auth);
        let settled = tokio::task::spawn_blocking(move || {
            auth.replay().settle_clock(crate::auth_layer::now_ms())
        })
        .await;
        if let Ok(Err(e)) = settled {
            tracing::warn!(error = %e, "the replay clock mark could not be lowered at stop; the next start waits up to a second more");
        }
    }
}

/// `cube.v1.Cells`, with `Walk`'s requests held to [`WALK_MESSAGE_BYTES`] and every other
/// method's to `--max-message-bytes` (a Write's value can be large, a Walk's request cannot).
#[derive(Clone)]
struct CellsRoutes {
    all: CellsServer<CellsService>,
    walk: CellsServer<CellsService>,
}

impl CellsRoutes {
    const WALK_PATH: &'static str = "/cube.v1.Cells/Walk";

    fn new(service: CellsService, max_message_bytes: usize) -> CellsRoutes {
        let service = Arc::new(service);
        CellsRoutes {
            all: CellsServer::from_arc(Arc::clone(&service))
                .max_decoding_message_size(max_message_bytes),
            walk: CellsServer::from_arc(service)
                .max_decoding_message_size(WALK_MESSAGE_BYTES.min(max_message_bytes)),
        }
    }
}

impl tonic::server::NamedService for CellsRoutes {
    const NAME: &'static str = cube_api::v1::cells_server::SERVICE_NAME;
}

impl tower::Service<http::Request<tonic::body::Body>> for CellsRoutes {
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future =
        <CellsServer<CellsService> as tower::Service<http::Request<tonic::body::Body>>>::Future;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        if req.uri().path() == Self::WALK_PATH {
            self.walk.call(req)
        } else {
            self.all.call(req)
        }
    }
}

impl Gateway {
    /// Serve `cube.v1.Admin` on a Unix socket until `shutdown`. Whoever can open the socket (its
    /// directory is the data directory, mode 0700) is an operator.
    pub async fn serve_admin_socket(
        &self,
        listener: UnixListener,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), ServeError> {
        let admin = AdminService {
            catalog: Some(Arc::clone(&self.catalog)),
            connections: Some(Arc::clone(&self.connections)),
            directory: Some(Arc::clone(&self.directory)),
        };
        Server::builder()
            .add_service(AdminServer::new(admin))
            .serve_with_incoming_shutdown(admin_connections(listener), shutdown)
            .await?;
        Ok(())
    }

    /// Open connections (for tests and metrics).
    pub fn connections(&self) -> &Arc<ConnectionRegistry> {
        &self.connections
    }
}

/// The admin socket's connections. A failed accept (no file descriptor left, say) is logged at
/// most once a second and tried again after [`crate::transport::ACCEPT_RETRY`]: tonic's own
/// loop over a listener's stream tries again at once, which spun a core for as long as the
/// condition lasted (with an operator's command waiting in the backlog).
fn admin_connections(
    listener: UnixListener,
) -> impl futures::Stream<Item = std::io::Result<tokio::net::UnixStream>> {
    let warnings = crate::transport::WarnEvery::new(std::time::Duration::from_secs(1));
    futures::stream::unfold((listener, warnings), |(listener, warnings)| async move {
        loop {
            match listener.accept().await {
                Ok((stream, _)) => return Some((Ok(stream), (listener, warnings))),
                Err(e) => {
                    if warnings.due() {
                        tracing::warn!(error = %e, "the admin socket could not accept a connection; retrying shortly");
                    }
                    tokio::time::sleep(crate::transport::ACCEPT_RETRY).await;
                }
            }
        }
    })
}

/// Renew the replay cache's clock mark every [`RENEW_EVERY`] until aborted: a renewal that
/// falls a lease behind makes signed calls wait for it, and refused (`UNAVAILABLE`) after
/// `MARK_WAIT` of waiting, until one succeeds again. A renewal slow enough to hold calls up
/// (its fdatasync taking over a second) is logged.
async fn renew_clock(auth: Arc<Authenticator>) {
    let mut every = tokio::time::interval(RENEW_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    loop {
        every.tick().await;
        let began = std::time::Instant::now();
        let renewed = renew_clock_once(&auth).await;
        let took = began.elapsed();
        if took > std::time::Duration::from_secs(1) {
            tracing::warn!(
                ms = took.as_millis() as u64,
                "renewing the replay clock mark (a write and fdatasync of a few bytes) was slow: \
                 signed calls may have waited for it"
            );
        }
        match renewed {
            Ok(()) if failing => {
                tracing::info!("the replay clock mark is written again");
                failing = false;
            }
            Ok(()) => {}
            Err(e) => {
                if !failing {
                    tracing::error!(error = %e, "the replay clock mark could not be renewed: once it falls a second behind, signed calls wait for it and are refused with UNAVAILABLE after {} s, until it is written again", crate::auth_layer::MARK_WAIT.as_secs());
                }
                failing = true;
            }
        }
    }
}

/// One renewal of the replay clock mark, on the blocking pool (it fdatasyncs).
async fn renew_clock_once(auth: &Arc<Authenticator>) -> std::io::Result<()> {
    let auth = Arc::clone(auth);
    tokio::task::spawn_blocking(move || auth.replay().renew_clock(crate::auth_layer::now_ms()))
        .await
        .unwrap_or_else(|e| {
            // A renewal that panicked (or was cancelled) renewed nothing.
            Err(std::io::Error::other(format!(
                "the replay clock mark renewal did not finish: {e}"
            )))
        })
}

/// Aborts its task when dropped: the TLS accept loop must not outlive `serve`, also when the
/// `serve` future itself is dropped (a drain cut short).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
