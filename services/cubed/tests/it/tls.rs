//! TLS and mTLS: signed calls over TLS, client certificates as a per-connection authenticator,
//! and no plaintext on non-loopback addresses without an explicit flag.

use cube_api::v1::AuditRequest;
use cube_api::v1::cells_client::CellsClient;
use cube_api::v1::tenant_client::TenantClient;
use cube_auth::client::{CallSigner, Signing};
use cube_testkit::TestServer;
use tonic::Code;

use crate::{cubed, read, signal_term, watch_health, write};

/// The PEM texts of a client certificate for demo's `key_id` and of its key.
fn issue_cert(server: &TestServer, key_id: &str, out: &std::path::Path) -> (String, String) {
    let (cert, key) = server.demo_key_cert(key_id, out).unwrap();
    let read = |p| std::fs::read_to_string(p).unwrap();
    (read(cert), read(key))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signed_calls_work_over_tls_and_plaintext_clients_are_not_served() {
    let server = TestServer::start_with(cubed(), &["--tls-dev"]).unwrap();
    assert!(
        server
            .demo
            .endpoint
            .as_deref()
            .unwrap()
            .starts_with("https://")
    );
    let channel = server.tls_channel(None).await.unwrap();
    let signer = CallSigner::new(
        &server.demo.tenant,
        &server.demo.key_id,
        server.demo.secret().unwrap(),
    );
    let mut c = CellsClient::new(Signing::new(channel, signer));
    c.write(write(1, 2, 3, b"over tls")).await.unwrap();
    assert_eq!(
        c.read(read(1, 2, 3)).await.unwrap().into_inner().value,
        b"over tls"
    );
    // A TLS connection without a client certificate and without a signature is not
    // authenticated, and told the ways, a client certificate among them.
    let mut bare = CellsClient::new(server.tls_channel(None).await.unwrap());
    let e = bare.read(read(1, 2, 3)).await.unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated);
    assert!(
        e.message()
            .starts_with("missing credentials: sign every call")
            && e.message()
                .contains("or connect with a client certificate (`cubed key cert`)"),
        "{e:?}"
    );
    // A plaintext client gets no service from a TLS listener.
    let plain = tonic::transport::Endpoint::from_shared(format!("http://{}", server.addr))
        .unwrap()
        .connect()
        .await;
    if let Ok(ch) = plain {
        let signer = CallSigner::new(
            &server.demo.tenant,
            &server.demo.key_id,
            server.demo.secret().unwrap(),
        );
        assert!(
            CellsClient::new(Signing::new(ch, signer))
                .read(read(1, 2, 3))
                .await
                .is_err()
        );
    }
}

/// The TLS listener speaks TLS 1.3 only: under TLS 1.2 a client certificate crosses the wire in
/// clear, and with it the tenant and key id in its subject, to anyone watching.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tls_listener_refuses_tls_1_2() {
    use tokio_rustls::rustls;
    let server = TestServer::start_with(cubed(), &["--tls-dev"]).unwrap();
    let roots = ca_roots(&server);
    let handshake = |version| tls_handshake(server.addr, version, roots.clone());
    assert!(handshake(&rustls::version::TLS13).await.is_ok());
    assert!(handshake(&rustls::version::TLS12).await.is_err());
}

/// The data directory's CA, as the roots a client trusts.
fn ca_roots(server: &TestServer) -> tokio_rustls::rustls::RootCertStore {
    use rustls_pki_types::pem::PemObject;
    let ca = std::fs::read(server.data_dir().join("tls").join("ca.pem")).unwrap();
    let mut roots = tokio_rustls::rustls::RootCertStore::empty();
    for cert in rustls_pki_types::CertificateDer::pem_slice_iter(&ca) {
        roots.add(cert.unwrap()).unwrap();
    }
    roots
}

/// A TLS handshake with `addr` for the name `localhost`, as a rustls client that speaks only
/// `version`, trusts `roots` and offers `h2`.
async fn tls_handshake(
    addr: std::net::SocketAddr,
    version: &'static tokio_rustls::rustls::SupportedProtocolVersion,
    roots: tokio_rustls::rustls::RootCertStore,
) -> std::io::Result<()> {
    use tokio_rustls::rustls;
    let mut config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[version])
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
    connector.connect(name, tcp).await.map(drop)
}

/// A revoked key's certificate reconnecting in a loop is logged as long as its address is not
/// throttled, not once per connection: with `--auth-failure-limit 2`, 12 connections leave at
/// most 3 log lines (the failure that throttles is the third at most: the refused calls count
/// too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_certificate_reconnecting_does_not_fill_the_log() {
    const LINE: &str = "client certificate for an unknown or revoked key";
    let server =
        TestServer::start_with(cubed(), &["--tls-dev", "--auth-failure-limit", "2"]).unwrap();
    let out = tempfile::tempdir().unwrap();
    let (cert, key) = issue_cert(&server, &server.demo.key_id, out.path());
    let o = server
        .cli(&["key", "revoke", "demo", &server.demo.key_id])
        .unwrap();
    assert!(o.status.success());
    for _ in 0..12 {
        let mut c = CellsClient::new(server.tls_channel(Some((&cert, &key))).await.unwrap());
        assert!(c.read(read(1, 1, 1)).await.is_err());
    }
    let logged = server.log().matches(LINE).count();
    assert!(
        (1..=3).contains(&logged),
        "{logged} lines: {}",
        server.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_authenticates_its_connection_until_the_key_is_revoked() {
    let server = TestServer::start_with(cubed(), &["--tls-dev"]).unwrap();
    let out = tempfile::tempdir().unwrap();
    let (cert, key) = issue_cert(&server, &server.demo.key_id, out.path());
    let mut c = CellsClient::new(server.tls_channel(Some((&cert, &key))).await.unwrap());
    c.write(write(4, 4, 4, b"mtls")).await.unwrap();
    assert_eq!(
        c.read(read(4, 4, 4)).await.unwrap().into_inner().value,
        b"mtls"
    );

    let o = server
        .cli(&["key", "revoke", "demo", &server.demo.key_id])
        .unwrap();
    assert!(o.status.success());
    // The open connection's session ended, and a new connection with the certificate is refused.
    assert_eq!(
        c.read(read(4, 4, 4)).await.unwrap_err().code(),
        Code::Unauthenticated
    );
    let mut again = CellsClient::new(server.tls_channel(Some((&cert, &key))).await.unwrap());
    let refused = again.read(read(4, 4, 4)).await.unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated);
    // Told what is wrong with the certificate, not that no credentials were given.
    assert!(
        refused.message().starts_with(&format!(
            "this connection's client certificate is of an unknown or revoked key '{}' of \
             tenant 'demo', so it authenticates nothing",
            server.demo.key_id
        )),
        "{refused:?}"
    );
    // Both refusals are in the tenant's trail (recorded in the background), as the revoked
    // certificate's connection and as a call on the connection whose session the revocation
    // ended; read with another key.
    let o = server.cli(&["key", "create", "demo"]).unwrap();
    let second: cube_auth::Credentials = serde_json::from_slice(&o.stdout).unwrap();
    let signer = CallSigner::new(&second.tenant, &second.key_id, second.secret().unwrap());
    let mut tenant = TenantClient::new(Signing::new(
        server.tls_channel(None).await.unwrap(),
        signer,
    ));
    let mut failed = Vec::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    while std::time::Instant::now() < deadline {
        let mut page = tenant
            .audit(AuditRequest {
                from_seq: 0,
                limit: 0,
            })
            .await
            .unwrap()
            .into_inner();
        failed.clear();
        while let Some(e) = page.message().await.unwrap() {
            if e.op == "auth.failed" {
                failed.push(e.detail);
            }
        }
        if failed.len() >= 2 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let key_id = &server.demo.key_id;
    assert!(
        failed.iter().any(|d| d.contains("model=connection")
            && d.contains(&format!(
                "client certificate of an unknown or revoked key '{key_id}'"
            ))),
        "{failed:?}"
    );
    assert!(
        failed
            .iter()
            .any(|d| d.contains("model=connection") && d.contains("was revoked")),
        "{failed:?}"
    );
    // No certificate for a revoked key is issued either.
    let out_arg = out.path().to_string_lossy().to_string();
    let o = server
        .cli(&[
            "key",
            "cert",
            "demo",
            &server.demo.key_id,
            "--out",
            &out_arg,
        ])
        .unwrap();
    assert!(!o.status.success());
}

#[test]
fn plaintext_on_a_non_loopback_address_needs_an_explicit_flag() {
    let dir = tempfile::tempdir().unwrap();
    let out = cube_testkit::command(cubed())
        .args(["serve", "--listen", "0.0.0.0:0", "--data-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("refusing to serve plaintext"), "{stderr}");
}

/// `cubed serve` on `data_dir` with `args`, expected to refuse to start: its stderr. A server
/// that starts instead is stopped after a minute and the test fails (rather than waiting for it
/// for ever).
pub(crate) fn refused_start(data_dir: &std::path::Path, args: &[&str]) -> String {
    use std::io::Read;
    let mut child = cube_testkit::command(cubed())
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
        ])
        .args(args)
        .arg("--data-dir")
        .arg(data_dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        stderr.read_to_string(&mut text).map(|_| text)
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "cubed serve {args:?} was to refuse to start and still ran after 60 s: {}",
                reader.join().unwrap().unwrap_or_default()
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let stderr = reader.join().unwrap().unwrap();
    assert!(!status.success(), "{stderr}");
    stderr
}

#[test]
fn a_start_that_cannot_serve_changes_nothing_in_the_data_dir() {
    let dir = tempfile::tempdir().unwrap();
    // A missing certificate: refused before the demo tenant and its credentials are made, so
    // no dev-credentials.json points clients at a server that never ran.
    let data = dir.path().join("data");
    let stderr = refused_start(
        &data,
        &[
            "--tls-cert",
            "/nonexistent/cert.pem",
            "--tls-key",
            "/nonexistent/key.pem",
        ],
    );
    assert!(
        stderr.contains("reading --tls-cert /nonexistent/cert.pem"),
        "{stderr}"
    );
    // Nor the data directory itself: the files are read before it is created.
    assert!(!data.exists());
    // Files that are there but hold no certificate: refused as early, naming both flags.
    let junk = dir.path().join("junk.pem");
    std::fs::write(&junk, "not a certificate\n").unwrap();
    let junk = junk.to_str().unwrap();
    let stderr = refused_start(&data, &["--tls-cert", junk, "--tls-key", junk]);
    assert!(
        stderr.contains(&format!(
            "configuring TLS from --tls-cert {junk} and --tls-key {junk}"
        )),
        "{stderr}"
    );
    assert!(!data.exists());
    // A certificate and the key of another: named as such, once.
    let (one, other) = (
        rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap(),
        rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap(),
    );
    let (cert, key) = (dir.path().join("one.pem"), dir.path().join("other.key"));
    std::fs::write(&cert, one.cert.pem()).unwrap();
    std::fs::write(&key, other.signing_key.serialize_pem()).unwrap();
    let stderr = refused_start(
        &data,
        &[
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
        ],
    );
    assert!(
        stderr.contains("the private key does not belong to the certificate")
            && !stderr.contains("KeyMismatch"),
        "{stderr}"
    );
    assert!(!data.exists());
    // A chain whose second certificate was cut short when copied: refused, not served
    // without it (clients lacking the intermediate would fail).
    let (leaf, leaf_key) = (dir.path().join("leaf.pem"), dir.path().join("leaf.key"));
    std::fs::write(
        &leaf,
        format!(
            "{}-----BEGIN CERTIFICATE-----\nMIIB!!\n-----END CERTIFICATE-----\n",
            one.cert.pem()
        ),
    )
    .unwrap();
    std::fs::write(&leaf_key, one.signing_key.serialize_pem()).unwrap();
    let pair = [
        "--tls-cert",
        leaf.to_str().unwrap(),
        "--tls-key",
        leaf_key.to_str().unwrap(),
    ];
    let stderr = refused_start(&data, &pair);
    assert!(
        stderr.contains("cannot read the certificate file"),
        "{stderr}"
    );
    assert!(!data.exists());
    // An expired certificate: refused, with its dates.
    let mut params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    params.not_before = rcgen::date_time_ymd(2001, 1, 1);
    params.not_after = rcgen::date_time_ymd(2002, 1, 1);
    let expired = params.self_signed(&one.signing_key).unwrap();
    std::fs::write(&leaf, expired.pem()).unwrap();
    let stderr = refused_start(&data, &pair);
    assert!(
        stderr.contains("the certificate expired") && stderr.contains("2002"),
        "{stderr}"
    );
    assert!(!data.exists());
    // An admin address in use: refused before the data directory is created (it used to be
    // bound after the demo tenant and its credentials, which named a port never served).
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let admin = taken.local_addr().unwrap().to_string();
    let out = cube_testkit::command(cubed())
        .args(["serve", "--listen", "127.0.0.1:0", "--admin-listen", &admin])
        .arg("--data-dir")
        .arg(&data)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("cannot listen on --admin-listen {admin}"))
            && stderr.contains("another process is listening there")
            && !stderr.contains("os error"),
        "{stderr}"
    );
    assert!(!data.exists());
    // A data directory too deep for its admin socket: refused before anything is created.
    let deep = dir.path().join("d".repeat(120));
    let stderr = refused_start(&deep, &[]);
    assert!(
        stderr.contains("the data directory's path is too long"),
        "{stderr}"
    );
    assert!(stderr.contains("use a shorter --data-dir"), "{stderr}");
    assert!(!deep.exists());
}

/// A stop closes the TLS listener at once, also while a client holds a stream open and the
/// drain waits for it: the TLS accept loop used to keep the port and go on handshaking with new
/// clients until the process exited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_closes_the_tls_listener_while_the_drain_waits() {
    use tonic_health::pb::health_check_response::ServingStatus;
    let server = TestServer::start_with(cubed(), &["--tls-dev", "--drain-secs", "60"]).unwrap();
    let mut watch = watch_health(server.tls_channel(None).await.unwrap()).await;
    signal_term(&server);
    assert_eq!(
        watch.message().await.unwrap().unwrap().status(),
        ServingStatus::NotServing
    );
    let mut closed = false;
    for _ in 0..150 {
        if std::net::TcpStream::connect(server.addr).is_err() {
            closed = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(closed, "the TLS listener still accepts 15 s into the stop");
    drop(watch);
}

/// Under `--auth-mode call` a client certificate authenticates nothing: its connection's calls
/// must be signed, and the connection counts as a per-call one (it used to be counted as
/// certificate-authenticated, skewing the A/B gauges).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_authenticates_nothing_in_call_mode() {
    let server = TestServer::start_with(cubed(), &["--tls-dev", "--auth-mode", "call"]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = issue_cert(&server, &server.demo.key_id, dir.path());
    let channel = server.tls_channel(Some((&cert, &key))).await.unwrap();
    let mut bare = CellsClient::new(channel.clone());
    assert_eq!(
        bare.read(read(1, 1, 1)).await.unwrap_err().code(),
        Code::Unauthenticated
    );
    let signer = CallSigner::new(
        &server.demo.tenant,
        &server.demo.key_id,
        server.demo.secret().unwrap(),
    );
    let mut signed = CellsClient::new(Signing::new(channel, signer));
    signed.read(read(1, 1, 1)).await.unwrap();
    let gauge = |auth: &str| {
        server
            .metric(&format!("cube_connections_open{{auth=\"{auth}\"}}"))
            .unwrap_or(0.0)
    };
    assert_eq!(gauge("connection"), 0.0);
    assert_eq!(gauge("call"), 1.0);
}

/// A data directory that issued client certificates but whose CA is gone (restored without
/// `tls/`) gets a new CA, under which none of them is accepted: the server says so, and where to
/// look. A directory's first CA is no news, even when its tenants have keys (the first
/// `--tls-dev` start of the README's tour warned of certificates that could not exist).
#[test]
fn a_new_ca_for_a_directory_that_issued_client_certificates_is_warned_about() {
    const WARNING: &str = "created a new certificate authority for a data directory that \
                           issued client certificates";
    let mut plain = TestServer::start(cubed()).unwrap();
    let data = plain.data_dir();
    assert!(plain.sigterm().unwrap().success());
    let mut first = TestServer::start_at(cubed(), &data, &["--tls-dev"]).unwrap();
    assert!(!first.log().contains(WARNING), "{}", first.log());
    let certs = tempfile::tempdir().unwrap();
    let out = first
        .cli(&[
            "key",
            "cert",
            &first.demo.tenant,
            &first.demo.key_id,
            "--out",
            certs.path().to_str().unwrap(),
        ])
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(first.sigterm().unwrap().success());
    std::fs::remove_dir_all(data.join("tls")).unwrap();
    let mut second = TestServer::start_at(cubed(), &data, &["--tls-dev"]).unwrap();
    let log = second.log();
    assert!(
        log.contains(WARNING) && log.contains("restore its tls/ too"),
        "{log}"
    );
    assert!(second.sigterm().unwrap().success());
}

/// Failed TLS handshakes are counted by reason on `/metrics`, and a client refusing the
/// server's certificate (the failure only the server's operator can fix) is logged; the
/// served certificate's expiry is a gauge an alert can watch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_tls_handshakes_are_counted_by_reason_and_a_refused_certificate_is_logged() {
    use rustls_pki_types::pem::PemObject;
    use std::time::Duration;
    use tokio_rustls::rustls;
    const REFUSED: &str = "a client refused this server's TLS certificate";
    let server = TestServer::start_with(cubed(), &["--tls-dev"]).unwrap();
    let failures =
        |reason: &str| format!("cube_tls_handshake_failures_total{{reason=\"{reason}\"}}");
    for reason in [
        "certificate_rejected",
        "client_certificate",
        "protocol",
        "timeout",
        "closed",
    ] {
        assert_eq!(server.metric(&failures(reason)), Some(0.0), "{reason}");
    }
    let served = std::fs::read(server.data_dir().join("tls").join("server.pem")).unwrap();
    let (_, pem) = x509_parser::pem::parse_x509_pem(&served).unwrap();
    let not_after = pem.parse_x509().unwrap().validity().not_after.timestamp();
    assert_eq!(
        server.metric("cube_tls_certificate_expiry_timestamp_seconds"),
        Some(not_after as f64)
    );

    // A client that trusts another CA only: it refuses the server's certificate.
    let other = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(rustls_pki_types::CertificateDer::from_pem_slice(other.cert.pem().as_bytes()).unwrap())
        .unwrap();
    let connect = |version, roots| tls_handshake(server.addr, version, roots);
    // Logged at most once a minute: the second refusal is counted, not logged.
    for refused in [1.0, 2.0] {
        assert!(
            connect(&rustls::version::TLS13, roots.clone())
                .await
                .is_err()
        );
        server
            .metric_when(
                &failures("certificate_rejected"),
                Duration::from_secs(10),
                |v| v == refused,
            )
            .await
            .unwrap();
        assert_eq!(server.log().matches(REFUSED).count(), 1, "{}", server.log());
    }

    // TLS 1.2 only: the server refuses it.
    assert!(
        connect(&rustls::version::TLS12, ca_roots(&server))
            .await
            .is_err()
    );
    server
        .metric_when(&failures("protocol"), Duration::from_secs(10), |v| v == 1.0)
        .await
        .unwrap();

    // A connection closed before its handshake.
    drop(tokio::net::TcpStream::connect(server.addr).await.unwrap());
    server
        .metric_when(&failures("closed"), Duration::from_secs(10), |v| v == 1.0)
        .await
        .unwrap();

    // A client certificate the data directory's CA did not issue (last: the channel may try
    // it again, once per reconnection).
    let stranger = rcgen::generate_simple_self_signed(vec!["demo".into()]).unwrap();
    let (cert, key) = (stranger.cert.pem(), stranger.signing_key.serialize_pem());
    if let Ok(channel) = server.tls_channel(Some((&cert, &key))).await {
        let mut c = CellsClient::new(channel);
        assert!(c.read(read(1, 1, 1)).await.is_err());
    }
    server
        .metric_when(
            &failures("client_certificate"),
            Duration::from_secs(10),
            |v| v >= 1.0,
        )
        .await
        .unwrap();

    // None of these was anything but what it was counted as.
    assert_eq!(server.metric(&failures("timeout")), Some(0.0));
    assert_eq!(server.metric(&failures("certificate_rejected")), Some(2.0));
    assert_eq!(server.log().matches(REFUSED).count(), 1, "{}", server.log());
}
