//! `cubed serve`: open the catalog, start the tenant directory, serve gRPC and the local admin
//! socket, and on shutdown stop accepting, drain, and close every tenant's WAL with a final
//! fdatasync before returning.

use std::fs;
use std::future::Future;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use cube_auth::Credentials;
use cube_gateway::{Gateway, GatewayConfig, TlsSettings};
use cube_store::{
    Catalog, CatalogOpenError, CoreConfig, DataDir, DirectoryConfig, SpaceGuard, StateLimits,
    TenantDirectory,
};
use cube_wal::{SegmentSizing, WalOptions};

/// How often the data directory's free space is checked (see `--min-free-bytes`).
const SPACE_CHECK_EVERY: std::time::Duration = std::time::Duration::from_millis(200);
use tokio::net::{TcpListener, UnixListener};
use tokio_util::sync::CancellationToken;
use x509_parser::time::ASN1Time;

use crate::admin_http::{self, Readiness};
use crate::certs;
use crate::config::{ServeConfig, TlsChoice};

const DEMO_TENANT: &str = "demo";
/// `sun_path` of a Unix socket address on Linux, its terminating NUL included.
const MAX_SOCKET_PATH: usize = 108;

/// Why `flag`'s address `addr` could not be bound, and what to do about the usual causes.
fn listen_error(flag: &str, addr: std::net::SocketAddr, e: &std::io::Error) -> anyhow::Error {
    use std::io::ErrorKind;
    let hint = match e.kind() {
        ErrorKind::AddrInUse => {
            " (another process is listening there: stop it, or pass another port; port 0 lets \
             the system pick a free one)"
        }
        // The admin listener serves unauthenticated metrics: never suggest every interface.
        ErrorKind::AddrNotAvailable if flag == "--admin-listen" => {
            " (that is not an address of this machine: pass one of its own, or 127.0.0.1 for \
             this machine only)"
        }
        ErrorKind::AddrNotAvailable => {
            " (that is not an address of this machine: pass one of its own, 127.0.0.1 for \
             this machine only, or 0.0.0.0 for every interface)"
        }
        ErrorKind::PermissionDenied => " (ports below 1024 need privileges: pass a higher port)",
        _ => "",
    };
    anyhow::anyhow!(
        "cannot listen on {flag} {addr}: {}{hint}",
        cube_cli::without_os_code(&e.to_string())
    )
}

/// `addr` bound, so that a bad or busy address fails the start at once, but not listening:
/// until the server is ready (recovery can take a while after a crash), a connection is
/// refused rather than accepted by the kernel and left unanswered, which a TCP health check
/// would take for a server that is up. (With SO_REUSEADDR, another socket can still bind the
/// port until this one listens: then the start fails at its ready line; see `run`.)
fn bind_grpc(addr: std::net::SocketAddr) -> anyhow::Result<tokio::net::TcpSocket> {
    let bound = (|| {
        let socket = if addr.is_ipv4() {
            tokio::net::TcpSocket::new_v4()?
        } else {
            tokio::net::TcpSocket::new_v6()?
        };
        // As `TcpListener::bind` does: a restart is not refused the port over connections of
        // the server before it still in TIME_WAIT.
        socket.set_reuseaddr(true)?;
        socket.bind(addr)?;
        Ok::<_, std::io::Error>(socket)
    })();
    bound.map_err(|e| listen_error("--listen", addr, &e))
}

/// Bind the configured address and serve until SIGTERM, SIGINT or SIGHUP.
pub async fn run_until_signal(config: ServeConfig) -> anyhow::Result<()> {
    warn_if_connections_can_take_the_files(config.max_connections);
    let listener = bind_grpc(config.listen)?;
    use tokio::signal::unix::{SignalKind, signal};
    // Installed here, before anything else starts: a signal arriving from now on stops the
    // server (a handler installed by the spawned task, when it first ran, left a window in
    // which SIGTERM still killed the process outright).
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    // SIGHUP (the terminal that started the server closed) stops it as SIGTERM does: its
    // default action ended the process with nothing synced, closed or removed. Unless it was
    // ignored at start (`nohup`): then it stays ignored.
    let mut hup = if cube_cli::ignored_at_start(nix::sys::signal::Signal::SIGHUP as i32) {
        None
    } else {
        Some(signal(SignalKind::hangup()).context("installing the SIGHUP handler")?)
    };
    let stop = CancellationToken::new();
    let hurry = CancellationToken::new();
    let (on_signal, on_second) = (stop.clone(), hurry.clone());
    tokio::spawn(async move {
        for count in 1.. {
            let which = tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = int.recv() => "SIGINT",
                Some(()) = async {
                    match hup.as_mut() {
                        Some(hup) => hup.recv().await,
                        None => std::future::pending().await,
                    }
                } => "SIGHUP",
            };
            match count {
                1 => {
                    tracing::info!("{which}: shutting down");
                    on_signal.cancel();
                }
                2 => {
                    tracing::warn!("second signal: no longer waiting for calls in flight");
                    on_second.cancel();
                }
                // Closing the tenants is not bounded (a full disk can hold a final
                // checkpoint), and the handlers above stay installed, so without this no
                // signal but SIGKILL would end the process then.
                _ => {
                    tracing::error!(
                        "third signal: exiting now, without waiting for the tenants still \
                         closing (what they acknowledged under the sync policy is in their \
                         logs, replayed at the next start; a tenant under a relaxed policy may \
                         lose what it acknowledged within its window)"
                    );
                    std::process::exit(FORCED_EXIT);
                }
            }
        }
    });
    run(config, listener, stop, hurry).await
}

/// The exit status of a stop cut short by a third signal.
const FORCED_EXIT: i32 = 1;

/// The gRPC listener's backlog, as `TcpListener::bind`'s.
const LISTEN_BACKLOG: u32 = 1024;

/// How long a stop waits for the admin socket's connections to close, after the gRPC drain.
const ADMIN_STOP_WAIT: Duration = Duration::from_secs(5);

/// Resolves when a stop that began at `draining` should stop waiting for the connections still
/// open: after `drain`, or at once on a second signal (`hurry`).
async fn drain_over(draining: &CancellationToken, hurry: &CancellationToken, drain: Duration) {
    draining.cancelled().await;
    tokio::select! {
        () = tokio::time::sleep(drain) => {
            tracing::warn!(secs = drain.as_secs(), "calls still open after --drain-secs: closing their connections");
        }
        () = hurry.cancelled() => {}
    }
}

/// How long a starting server waits for a catalog another process holds while no server answers
/// on the admin socket: a `cubed tenant` or `cubed key` command working offline holds it while it
/// opens the tenant concerned, which may replay up to a checkpoint's worth of its log.
const CATALOG_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Open the data directory's catalog. While another process holds it: fail at once if a server
/// answers on the admin socket or is noted as the holder ([`crate::holder`]), else wait up to
/// [`CATALOG_LOCK_WAIT`] (an offline command).
/// `None` if `shutdown` came first.
async fn open_catalog(
    data: &DataDir,
    shutdown: &mut (impl Future<Output = ()> + Unpin),
) -> anyhow::Result<Option<Catalog>> {
    let deadline = std::time::Instant::now() + CATALOG_LOCK_WAIT;
    let mut told = false;
    loop {
        match Catalog::open(&data.catalog()) {
            Ok(c) => {
                crate::holder::record(data, crate::holder::Role::Server);
                return Ok(Some(c));
            }
            Err(CatalogOpenError::Locked) => {}
            Err(e) => return Err(e).context("opening the catalog"),
        }
        if tokio::net::UnixStream::connect(data.admin_socket())
            .await
            .is_ok()
        {
            bail!(
                "another cubed is already serving the data directory {}",
                data.root().display()
            );
        }
        if let Some(pid) = crate::holder::other_server(data) {
            bail!(
                "another cubed (pid {pid}) holds the data directory {}: it is starting (recovering \
                 its tenants, then it serves) or stopping there",
                data.root().display()
            );
        }
        if std::time::Instant::now() >= deadline {
            bail!(
                "the data directory {} has been held by another cubed process for {} s and no \
                 server answers on its admin socket (a `cubed tenant`/`cubed key` command still \
                 working on it?)",
                data.root().display(),
                CATALOG_LOCK_WAIT.as_secs()
            );
        }
        if !told {
            told = true;
            tracing::info!(
                data_dir = %data.root().display(),
                "the catalog is held by another cubed process (a tenant or key command?); waiting for it"
            );
        }
        tokio::select! {
            biased;
            () = &mut *shutdown => return Ok(None),
            () = tokio::time::sleep(std::time::Duration::from_millis(100)) => {}
        }
    }
}

/// Serve on `listener` ([`bind_grpc`]; it listens once the server is ready) until `requested`
/// (a stop) is cancelled, wait up to `config.drain` (or until `hurry`) for the calls in flight; return once
/// every tenant is closed.
pub async fn run(
    config: ServeConfig,
    listener: tokio::net::TcpSocket,
    requested: CancellationToken,
    hurry: CancellationToken,
) -> anyhow::Result<()> {
    // Polled from here on: a stop asked for during start-up is honoured before the ready line.
    let mut shutdown = Box::pin(requested.clone().cancelled_owned());
    let data = DataDir::new(&config.data_dir);
    // Checked before anything is written: a data directory whose socket cannot be bound could
    // never be served.
    let socket_path = data.admin_socket();
    anyhow::ensure!(
        socket_path.as_os_str().len() < MAX_SOCKET_PATH,
        "the data directory's path is too long: its admin socket {} would be {} bytes, and a Unix \
         socket path is at most {} (use a shorter --data-dir)",
        socket_path.display(),
        socket_path.as_os_str().len(),
        MAX_SOCKET_PATH - 1
    );
    // Both listeners are bound, and certificate files read, before the data directory is
    // created or opened: a start that fails on any of them leaves nothing behind (it used to
    // leave a new data directory with tenant `demo` and credentials naming a port never served).
    let tls_files = read_tls_files(&config.tls)?;
    // The admin listener serves from here on, before the recovery below, which can take a
    // while after a crash (every tenant left open replays its log), and before a wait for a
    // catalog an offline command holds: `/healthz` answers that the process is alive (so an
    // orchestrator's startup probe does not kill it mid-recovery) and `/readyz` stays 503
    // until gRPC is served.
    let admin_http_listener = TcpListener::bind(config.admin_listen)
        .await
        .map_err(|e| listen_error("--admin-listen", config.admin_listen, &e))?;
    let admin_addr = admin_http_listener
        .local_addr()
        .context("reading the admin address")?;
    cube_metrics::init();
    let ready = Readiness::default();
    let http_stop = CancellationToken::new();
    let admin_http = tokio::spawn(admin_http::serve(
        admin_http_listener,
        ready.clone(),
        http_stop.clone(),
    ));
    // Whatever way `run` returns, the admin listener does not outlive it.
    let _http_stopped = http_stop.clone().drop_guard();
    prepare_data_dir(data.root())?;
    // From here `cube_disk_free_bytes` is real, also while a held catalog is waited for.
    // With --min-free-bytes 0 the guard refuses nothing but still reports it.
    let space = SpaceGuard::new(data.root().to_path_buf(), config.min_free_bytes);
    space.start(SPACE_CHECK_EVERY);
    let Some(catalog) = open_catalog(&data, &mut shutdown).await? else {
        tracing::info!("stop requested during start-up: not serving");
        return Ok(());
    };
    let catalog = Arc::new(catalog);
    // Before the demo tenant and crash recovery: a --tls-dev certificate that cannot be made
    // stops the start with nothing else changed.
    let had_ca = certs::has_ca(data.root());
    let tls_files = tls_settings(&config.tls, tls_files, data.root(), config.listen.ip())?;
    // Served for as long as `run` is: the certificate's expiry on /metrics, and in the log
    // when it comes close while the server runs (the file is read at start only).
    let _expiry_watch = match &tls_files {
        Some(settings) => {
            let (_, not_after) = leaf_validity(&settings.cert_chain_pem)
                .context("reading the TLS certificate's validity")?;
            cube_metrics::TLS_CERTIFICATE_EXPIRY.set(not_after.timestamp());
            Some(tokio_util::task::AbortOnDropHandle::new(tokio::spawn(
                watch_certificate_expiry(not_after),
            )))
        }
        None => None,
    };
    if tls_files.is_some() && !had_ca && certs::client_certs_issued(data.root()) {
        // Certificates `cubed key cert` issued under another CA (a data directory restored
        // without its tls/, say) fail their TLS handshake from now on, with nothing on the
        // server's side to say why. (A directory that never issued one gets its first CA
        // without a word.)
        tracing::warn!(
            dir = %certs::tls_dir(data.root()).display(),
            "created a new certificate authority for a data directory that issued client \
             certificates (`cubed key cert`) under an earlier one: they are not accepted any \
             more; if this directory was restored from a copy, restore its tls/ too"
        );
    }
    let addr = listener.local_addr().context("reading the bound address")?;
    if config.demo {
        ensure_demo(&catalog, &data, &client_endpoint(&config.tls, addr))?;
    } else {
        decline_demo(&catalog, &data)?;
    }
    let directory = Arc::new(TenantDirectory::new(
        DirectoryConfig {
            data_dir: data.clone(),
            core: CoreConfig {
                wal: WalOptions {
                    segments: SegmentSizing {
                        max: config.wal_segment_max_bytes,
                        ..SegmentSizing::default()
                    },
                    // A value plus its coordinates and framing always fits.
                    max_record: config.max_value_bytes + 4096,
                    // A relaxed tenant's acknowledged-but-unsynced changes are held to the
                    // bytes its requests in flight may carry (see `TenantCore`).
                    max_unsynced_bytes: config.max_in_flight_bytes as u64,
                    ..WalOptions::default()
                },
                limits: StateLimits {
                    max_value: config.max_value_bytes,
                    audit_retention: config.audit_retention as u64,
                    max_bytes: config.tenant_max_bytes,
                    ..StateLimits::default()
                },
                checkpoint: config.checkpoint,
                state_cache_bytes: config.state_cache_bytes,
                space: Some(space),
                // Each tenant gets the directory's catalog, janitor and record of lost
                // acknowledged changes when it opens.
                catalog: None,
                janitor: None,
                lost_acknowledged: None,
            },
            mailbox_capacity: config.mailbox_capacity,
            max_in_flight_bytes: config.max_in_flight_bytes,
            actor_threads: config.actor_threads,
            idle_after: config.idle_after,
            max_open: config.max_open_tenants,
        },
        Some(Arc::clone(&catalog)),
    )?);
    directory.start_janitor();
    // Files of deleted tenants that a crash (or a tenant that could not be closed) left behind.
    let leftovers = cube_store::remove_deleted_files(&data, &catalog);
    if leftovers > 0 {
        tracing::info!(tenants = leftovers, "removed the files of deleted tenants");
    }
    // Before serving: a tenant left open by a crash replays its log, which puts back in force
    // the capability changes that were durable only there (see `recover_unclosed`).
    let tenants = catalog
        .list()
        .map_err(|e| anyhow::anyhow!("listing the catalog's tenants: {e}"))?;
    let started = std::time::Instant::now();
    let (recovered, failed) = directory
        .recover_unclosed(tenants.into_iter().map(|(name, _)| name))
        .await;
    if recovered + failed > 0 {
        tracing::info!(
            recovered,
            failed,
            ms = started.elapsed().as_millis() as u64,
            "tenants left open by the last run recovered before serving"
        );
    }
    let gateway = Gateway::new(
        Arc::clone(&catalog),
        Arc::clone(&directory),
        GatewayConfig {
            max_message_bytes: config.max_message_bytes,
            max_connection_receive_bytes: config.max_connection_receive_bytes,
            max_connection_send_bytes: config.max_connection_send_bytes,
            max_value_bytes: config.max_value_bytes,
            skew_ms: config.skew_ms,
            replay_capacity: config.replay_capacity,
            replay_floors: Some(data.replay_floors()),
            max_concurrent_streams: config.max_concurrent_streams,
            max_connections: config.max_connections,
            max_connections_per_address: config.max_connections_per_address,
            preface_timeout: config.preface_timeout,
            keepalive: config.keepalive,
            call_timeout: config.call_timeout,
            auth_mode: config.auth_mode,
            failure_limits: config.failure_limits,
            max_metadata_bytes: config.max_metadata_bytes,
            tls: tls_files,
            metrics: config.metrics,
            scan_limits: config.scan_limits,
        },
    )
    // Its errors say what failed: TLS, the replay protection's files, reflection.
    .context("setting up the gRPC gateway");
    // A socket left by a crashed server; the catalog lock proves no server owns it now.
    let _ = fs::remove_file(&socket_path);
    let started = gateway.and_then(|gateway| {
        let admin_listener =
            UnixListener::bind(&socket_path).context("binding the admin socket")?;
        fs::set_permissions(&socket_path, fs::Permissions::from_mode(0o600))
            .context("securing the admin socket")?;
        Ok((gateway, admin_listener))
    });
    let (gateway, admin_listener) = match started {
        Ok(started) => started,
        Err(e) => {
            // Recovery may have opened tenants: close them as a stop would.
            directory.shutdown().await;
            let _ = fs::remove_file(&socket_path);
            return Err(e);
        }
    };

    let stop = CancellationToken::new();
    let admin_gateway = gateway.clone();
    let admin_stop = stop.clone().cancelled_owned();
    let admin = tokio::spawn(async move {
        admin_gateway
            .serve_admin_socket(admin_listener, admin_stop)
            .await
    });
    let tls = if config.tls == TlsChoice::Plaintext {
        "off"
    } else {
        "on"
    };
    // Signed calls stamped within a second of the start are refused (a previous server may have
    // accepted them): announce readiness once current ones are accepted.
    let stopped_early = tokio::select! {
        biased;
        () = &mut shutdown => true,
        () = tokio::time::sleep(gateway.replay_ready_in()) => false,
    };
    // Connections are taken from here on (queued until `serve` accepts them, shortly). The
    // bound port is not kept from others until then (SO_REUSEADDR, needed for a restart beside
    // connections in TIME_WAIT, lets another socket bind it while this one does not listen):
    // if something took it meanwhile, this start fails here, and closes what it recovered.
    let listening = (!stopped_early).then(|| {
        listener
            .listen(LISTEN_BACKLOG)
            .map_err(|e| listen_error("--listen", addr, &e))
    });
    let served: anyhow::Result<()> = match listening {
        None => {
            // Never announced ready: close what start-up opened (the recovered tenants).
            tracing::info!("stop requested during start-up: not serving");
            Ok(())
        }
        Some(Err(e)) => Err(e),
        Some(Ok(listener)) => {
            let ready_line = format!(
                "cubed ready: grpc={addr} tls={tls} admin={admin_addr} data_dir={}",
                data.root().display()
            );
            let data_root = data.root().display().to_string();
            let stop_gateway = stop.clone();
            let not_ready = ready.clone();
            let draining = CancellationToken::new();
            let drain_begins = draining.clone();
            let now_ready = ready.clone();
            let stop_asked = requested.clone();
            let serving = gateway.serve(
                listener,
                async move {
                    tokio::select! {
                        () = shutdown => {},
                        () = stop_gateway.cancelled() => {},
                    }
                    // Load balancers stop sending new work while the calls in flight drain.
                    not_ready.set(false);
                    drain_begins.cancel();
                },
                // Ready (and the ready line printed) once the accept loop starts, not when the
                // port listens: the replay clock mark's first renewal (an fdatasync) comes
                // between, and a stalled disk had /readyz send traffic to a server not taking
                // connections (until 2026-12-06). The stop above runs only inside the loop,
                // after this: a stop asked for since the port began to listen (during the
                // renewal, which a stalled disk can make last) is honoured here too, never
                // announced ready.
                move || {
                    if stop_asked.is_cancelled() {
                        return;
                    }
                    now_ready.set(true);
                    // Not `println!`: a closed stdout (a supervisor that stopped reading) must
                    // not panic a server that recovered its tenants and is about to serve them.
                    let announced = writeln!(std::io::stdout().lock(), "{ready_line}")
                        .and_then(|()| std::io::stdout().flush());
                    if let Err(e) = announced {
                        tracing::warn!(error = %e, "the ready line could not be written to stdout");
                    }
                    tracing::info!(%addr, data_dir = %data_root, "serving");
                },
            );
            // tonic waits for every connection to close, which a client holding a stream open
            // (Health.Watch ends only with the server) never does: the wait is bounded. Connections
            // still open then were sent GOAWAY (no new calls); their calls may still be answered
            // until the process exits, and a write among them is acknowledged only once durable.
            let served = tokio::select! {
                served = serving => served,
                () = drain_over(&draining, &hurry, config.drain) => Ok(()),
            };
            // Not ready once serving ended, however it ended (an error, too).
            ready.set(false);
            gateway.settle_clock().await;
            served.context("serving gRPC")
        }
    };
    stop.cancel();
    // tonic waits for every admin connection to close too, and one that never does (a client
    // that sent nothing, or a `cubed key` command suspended mid-call) would keep the tenants
    // from being closed: the wait is bounded.
    let mut admin = admin;
    tokio::select! {
        _ = &mut admin => {},
        () = tokio::time::sleep(ADMIN_STOP_WAIT) => {
            tracing::warn!(secs = ADMIN_STOP_WAIT.as_secs(), "admin socket connections still open: no longer waiting for them");
            admin.abort();
        }
        () = hurry.cancelled() => admin.abort(),
    }
    let failed = directory.shutdown().await;
    let _ = fs::remove_file(&socket_path);
    http_stop.cancel();
    let _ = admin_http.await;
    served?;
    if !failed.is_empty() {
        // Each failure was logged as it happened; a supervisor sees the exit status too.
        anyhow::bail!(
            "stopped, but the close of {} tenant(s) failed (final fdatasync or checkpoint, at \
             this stop or at an earlier close, or their log failed while open, or lost changes \
             acknowledged under the relaxed policy; see the errors above): {}. Their logs are kept and replayed at the next start; a tenant under the \
             relaxed policy may have lost changes acknowledged inside its window",
            failed.len(),
            failed.join(", ")
        );
    }
    tracing::info!("stopped cleanly: every tenant synced and closed");
    Ok(())
}

/// The contents of `--tls-cert` and `--tls-key`, if given, checked to make a TLS
/// configuration (a certificate and a matching key), so that a file that is not usable stops
/// the start before the data directory is touched.
fn read_tls_files(choice: &TlsChoice) -> anyhow::Result<Option<(Vec<u8>, Vec<u8>)>> {
    let TlsChoice::Files { cert, key } = choice else {
        return Ok(None);
    };
    let cert_chain_pem =
        fs::read(cert).with_context(|| format!("reading --tls-cert {}", cert.display()))?;
    let key_pem = fs::read(key).with_context(|| format!("reading --tls-key {}", key.display()))?;
    let settings = TlsSettings {
        cert_chain_pem,
        key_pem,
        client_ca_pem: None,
    };
    cube_gateway::server_config(&settings).with_context(|| {
        format!(
            "configuring TLS from --tls-cert {} and --tls-key {}",
            cert.display(),
            key.display()
        )
    })?;
    check_validity(&settings.cert_chain_pem, now_secs())
        .with_context(|| format!("--tls-cert {}", cert.display()))?;
    Ok(Some((settings.cert_chain_pem, settings.key_pem)))
}

/// Seconds since the Unix epoch.
fn now_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// A server certificate due to expire within this many seconds is warned about, at start and
/// once a day while the server runs.
const CERT_EXPIRY_WARNING_SECS: i64 = 14 * 24 * 3600;

/// That the chain's first certificate is valid at `now` (seconds since the epoch): one expired
/// or not valid yet would be refused by every client's TLS handshake, so it stops the start
/// instead. One expiring within [`CERT_EXPIRY_WARNING_SECS`] is named in a warning: the file
/// is read at start only, so a renewed certificate takes a restart.
fn check_validity(chain_pem: &[u8], now: i64) -> anyhow::Result<()> {
    let (from, to) = leaf_validity(chain_pem)?;
    anyhow::ensure!(
        from.timestamp() <= now,
        "the certificate is not valid yet: valid from {from} to {to} (check this machine's \
         clock, or use a certificate valid now)"
    );
    anyhow::ensure!(
        now <= to.timestamp(),
        "the certificate expired: valid from {from} to {to}; renew it and start again"
    );
    if to.timestamp() - now < CERT_EXPIRY_WARNING_SECS {
        warn_expires_soon(to);
    }
    Ok(())
}

/// The validity of the chain's first certificate: (not before, not after).
fn leaf_validity(chain_pem: &[u8]) -> anyhow::Result<(ASN1Time, ASN1Time)> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(chain_pem)
        .map_err(|e| anyhow::anyhow!("reading its first certificate: {e}"))?;
    let leaf = pem
        .parse_x509()
        .map_err(|e| anyhow::anyhow!("reading its first certificate: {e}"))?;
    let validity = leaf.validity();
    Ok((validity.not_before, validity.not_after))
}

fn warn_expires_soon(not_after: ASN1Time) {
    tracing::warn!(expires = %not_after, "the TLS certificate expires within 14 days: renew it and restart cubed (the file is read at start only)");
}

/// How often a running server looks at its certificate's expiry.
const CERT_EXPIRY_CHECK_EVERY: Duration = Duration::from_secs(3600);

/// Until aborted: every [`CERT_EXPIRY_CHECK_EVERY`], a warning once a day while the served
/// certificate expires within 14 days, and an error every check once it has expired (every
/// client's handshake then fails: `cube_tls_handshake_failures_total{reason=
/// "certificate_rejected"}`). The start already said so if it was close then.
async fn watch_certificate_expiry(not_after: ASN1Time) {
    let daily = cube_gateway::WarnEvery::new(Duration::from_secs(24 * 3600));
    let mut every = tokio::time::interval_at(
        tokio::time::Instant::now() + CERT_EXPIRY_CHECK_EVERY,
        CERT_EXPIRY_CHECK_EVERY,
    );
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    if not_after.timestamp() - now_secs() < CERT_EXPIRY_WARNING_SECS {
        // Warned at start: the next warning a day from now.
        let _ = daily.due();
    }
    loop {
        every.tick().await;
        let left = not_after.timestamp() - now_secs();
        if left < 0 {
            tracing::error!(expired = %not_after, "the TLS certificate has expired: clients refuse every new connection; renew it and restart cubed");
        } else if left < CERT_EXPIRY_WARNING_SECS && daily.due() {
            warn_expires_soon(not_after);
        }
    }
}

/// Certificate material for the listener: the files read by [`read_tls_files`], or under
/// `--tls-dev` the development certificate in the data directory. With TLS on, the data
/// directory's CA is created if needed and its client certificates (`cubed key cert`) are
/// accepted for mTLS.
fn tls_settings(
    choice: &TlsChoice,
    files: Option<(Vec<u8>, Vec<u8>)>,
    data_dir: &Path,
    listen: std::net::IpAddr,
) -> anyhow::Result<Option<TlsSettings>> {
    let (cert_chain_pem, key_pem) = match files {
        Some(files) => files,
        None if *choice == TlsChoice::Dev => {
            let (chain, key) = certs::ensure_dev_server_cert(data_dir, listen)?;
            (chain.into_bytes(), key.into_bytes())
        }
        None => return Ok(None),
    };
    // `ca.pem` alone serves to verify client certificates (its key may be kept elsewhere).
    let ca_pem = certs::ca_cert_pem(data_dir)?;
    Ok(Some(TlsSettings {
        cert_chain_pem,
        key_pem,
        client_ca_pem: Some(ca_pem.into_bytes()),
    }))
}

fn prepare_data_dir(root: &Path) -> anyhow::Result<()> {
    prepare_data_dir_as(root, nix::unistd::geteuid().as_raw())
}

/// [`prepare_data_dir`] for a process running as user id `euid`. A data directory owned by
/// another user is refused: run as root (`sudo cubed serve`), the server would leave root-owned
/// files (the catalog's journal at its first start-over, WAL segments, checkpoints) that the
/// server, run again as the directory's owner, could not open. (Another user than root cannot
/// take it over anyway: securing its mode below would fail.)
fn prepare_data_dir_as(root: &Path, euid: u32) -> anyhow::Result<()> {
    use std::os::unix::fs::MetadataExt;
    crate::config::check_data_dir(root)?;
    if let Ok(meta) = fs::metadata(root) {
        let owner = meta.uid();
        anyhow::ensure!(
            owner == euid,
            "the data directory {} belongs to user id {owner}, and this server runs as user id \
             {euid}: files it wrote there would not be readable by the server run as their \
             owner; run it as that user (for example `sudo -u '#{owner}' cubed serve ...`)",
            root.display()
        );
    }
    if !root.exists() {
        // A mistyped --data-dir starts an empty server: say so where the operator looks.
        tracing::info!(dir = %root.display(), "no data directory there yet: creating a new, empty one");
    }
    fs::create_dir_all(root)
        .with_context(|| format!("creating the data directory {}", root.display()))?;
    // The admin socket and the catalog's secrets live here: only the owner may enter.
    fs::set_permissions(root, fs::Permissions::from_mode(0o700))
        .with_context(|| format!("securing the data directory {}", root.display()))?;
    Ok(())
}

/// `--max-connections` is what keeps clients from taking the descriptors the tenants' logs
/// and state stores need; its default is half the open-file limit (at least 64). A larger one
/// given on purpose is allowed, and warned about.
fn warn_if_connections_can_take_the_files(max_connections: usize) {
    use nix::sys::resource::{Resource, getrlimit};
    let Ok((soft, _)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return;
    };
    if max_connections as u64 > (soft / 2).max(64) {
        tracing::warn!(
            max_connections,
            open_file_limit = soft,
            "--max-connections is more than half the open-file limit: clients may take the file \
             descriptors the tenants' logs and state stores need, and a flush or WAL rotation \
             that finds none left fails its tenant; raise the limit (docs/operations.md) or \
             lower --max-connections"
        );
    }
}

/// The endpoint a client on this machine reaches the server at, for the dev credentials: the
/// bound address, except that a wildcard one (0.0.0.0, ::) becomes the loopback address of its
/// family. A client cannot connect to a wildcard over TLS: the `--tls-dev` certificate names
/// localhost, 127.0.0.1 and ::1, and the listen address if it is another.
fn client_endpoint(tls: &TlsChoice, mut addr: std::net::SocketAddr) -> String {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
    if addr.ip().is_unspecified() {
        addr.set_ip(match addr.ip() {
            IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::LOCALHOST),
        });
    }
    let scheme = if *tls == TlsChoice::Plaintext {
        "http"
    } else {
        "https"
    };
    format!("{scheme}://{addr}")
}

/// A start with `--no-demo` that finds no tenants leaves a note of it (`demo-declined`), so that
/// a later start without the flag makes no tenant with every capability and its secret on disk
/// that nobody asked for. (A catalog without tenants is one whose first start declined `demo`,
/// one whose first start ended before it got to it, or one whose every tenant was deleted.)
fn decline_demo(catalog: &Catalog, data: &DataDir) -> anyhow::Result<()> {
    let path = data.demo_declined();
    if catalog.list()?.is_empty() && !path.exists() {
        cube_wal::replace_file_durably(
            &path,
            b"tenant 'demo' declined: a start with --no-demo found no tenants here, so no start \
              makes it (remove this file to have the next start without --no-demo make it)\n",
        )
        .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// On the first start of an empty data directory create tenant `demo` and dev-credentials.json;
/// on later starts keep that file's endpoint current. A catalog without tenants gets `demo`
/// unless a start with `--no-demo` declined it ([`decline_demo`]) or its tenants were deleted
/// (`cubed tenant delete`): a first start that ended before it made `demo` (a failed start, a
/// crash) leaves such a catalog too. A first start stopped between the two (a crash) leaves a
/// catalog of tenant `demo` alone with its one key and no file: the file is written then from
/// the catalog's key. Only then: a `demo` whose first key was revoked and another made
/// (rotation), or left alone by the deletion of every other tenant, keeps its file deleted, and
/// its key's secret off the disk.
fn ensure_demo(catalog: &Catalog, data: &DataDir, endpoint: &str) -> anyhow::Result<()> {
    let path = data.dev_credentials();
    let endpoint = endpoint.to_string();
    let tenants = catalog.list()?;
    let any_deleted = !catalog.deleted_tenants()?.is_empty();
    let creds_of = |key: &cube_store::KeyInfo| Credentials {
        tenant: key.tenant.clone(),
        key_id: key.key_id.clone(),
        secret: cube_auth::Secret::from_bytes(key.secret).to_hex(),
        endpoint: Some(endpoint.clone()),
    };
    let creds = if tenants.is_empty() {
        if any_deleted {
            tracing::info!(
                "no tenants: every tenant here was deleted, so no tenant 'demo' is made \
                 (`cubed tenant create NAME` makes a tenant)"
            );
            return Ok(());
        }
        if data.demo_declined().exists() {
            tracing::info!(
                path = %data.demo_declined().display(),
                "no tenants, and a start with --no-demo declined tenant 'demo' here: none made \
                 (`cubed tenant create NAME` makes a tenant)"
            );
            return Ok(());
        }
        let key = catalog.create_tenant(DEMO_TENANT)?;
        tracing::info!(path = %path.display(), "created tenant 'demo' and its dev credentials");
        creds_of(&key)
    } else if let ([(tenant, keys)], false, false) =
        (tenants.as_slice(), path.exists(), any_deleted)
        && tenant == DEMO_TENANT
        && let [key_id] = keys.as_slice()
        && catalog.key_count(DEMO_TENANT) == 1
        && let Some(key) = catalog.key(DEMO_TENANT, key_id)
    {
        tracing::info!(path = %path.display(), "wrote the dev credentials of tenant 'demo' again: the file was missing");
        creds_of(&key)
    } else {
        let Ok(text) = fs::read_to_string(&path) else {
            if !tenants.iter().any(|(tenant, _)| tenant == DEMO_TENANT)
                && !data.demo_declined().exists()
                && catalog.deleted_at(DEMO_TENANT)?.is_none()
            {
                tracing::info!(
                    "no tenant 'demo' and no dev credentials: the first start found the catalog \
                     holding tenants (made with `cubed tenant create`), and only a start on an \
                     empty catalog makes them"
                );
            }
            return Ok(());
        };
        let Ok(mut creds) = serde_json::from_str::<Credentials>(&text) else {
            return Ok(());
        };
        if creds.endpoint.as_deref() == Some(endpoint.as_str()) {
            return Ok(());
        }
        creds.endpoint = Some(endpoint);
        creds
    };
    write_private_json(&path, &creds)
}

/// Write `value` as JSON to `path` with mode 0600, whole or not at all.
fn write_private_json(path: &Path, value: &impl serde::Serialize) -> anyhow::Result<()> {
    let mut text = serde_json::to_vec_pretty(value)?;
    text.push(b'\n');
    cube_wal::replace_file_durably(path, &text)
        .with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server certificate is refused at start outside its validity, naming the dates.
    #[test]
    fn a_certificate_expired_or_not_valid_yet_stops_the_start() {
        let mut params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        params.not_before = rcgen::date_time_ymd(2030, 1, 1);
        params.not_after = rcgen::date_time_ymd(2031, 1, 1);
        let key = rcgen::KeyPair::generate().unwrap();
        let pem = params.self_signed(&key).unwrap().pem();
        let day = 24 * 3600;
        let (from, to) = (1_893_456_000, 1_924_992_000); // 2030-01-01, 2031-01-01
        let early = check_validity(pem.as_bytes(), from - day).unwrap_err();
        assert!(early.to_string().contains("not valid yet"), "{early}");
        let late = check_validity(pem.as_bytes(), to + day).unwrap_err();
        assert!(late.to_string().contains("expired"), "{late}");
        assert!(late.to_string().contains("2031"), "{late}");
        check_validity(pem.as_bytes(), from).unwrap();
        check_validity(pem.as_bytes(), to - day).unwrap();
    }

    /// A data directory of another user is refused, untouched (`sudo cubed serve` left
    /// root-owned files the server, run again as the owner, could not open); its owner's is
    /// taken, and a new one is made.
    #[test]
    fn a_data_directory_of_another_user_is_refused() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("data");
        fs::create_dir(&root).unwrap();
        fs::set_permissions(&root, fs::Permissions::from_mode(0o755)).unwrap();
        let owner = fs::metadata(&root).unwrap().uid();
        let other = owner.wrapping_add(1);
        let e = prepare_data_dir_as(&root, other).unwrap_err().to_string();
        assert!(
            e.contains(&format!("belongs to user id {owner}")) && e.contains("sudo -u"),
            "{e}"
        );
        let mode = fs::metadata(&root).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o755, "the refused directory was changed");
        prepare_data_dir_as(&root, owner).unwrap();
        assert_eq!(fs::metadata(&root).unwrap().mode() & 0o777, 0o700);
        let fresh = dir.path().join("fresh");
        prepare_data_dir_as(&fresh, other).unwrap();
        assert!(fresh.is_dir());
    }

    #[test]
    fn the_dev_credentials_name_loopback_for_a_wildcard_listen_address() {
        let at = |a: &str| a.parse::<std::net::SocketAddr>().unwrap();
        let tls = TlsChoice::Dev;
        assert_eq!(
            client_endpoint(&tls, at("0.0.0.0:50051")),
            "https://127.0.0.1:50051"
        );
        assert_eq!(client_endpoint(&tls, at("[::]:7")), "https://[::1]:7");
        assert_eq!(
            client_endpoint(&TlsChoice::Plaintext, at("0.0.0.0:8")),
            "http://127.0.0.1:8"
        );
        assert_eq!(
            client_endpoint(&tls, at("10.1.2.3:9")),
            "https://10.1.2.3:9"
        );
        assert_eq!(client_endpoint(&tls, at("[::1]:9")), "https://[::1]:9");
    }
}
