//! The admin HTTP listener: /healthz, /readyz, and /metrics counting real calls by method,
//! code and auth model.

use cube_testkit::{TestServer, admin_get, admin_request, metric_sample};

use crate::{cubed, read, write};

/// The value of the sample line starting with `prefix` (name and labels), if present.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_calls_by_method_code_and_auth_model() {
    let server = TestServer::start(cubed()).unwrap();
    assert_eq!(admin_get(server.admin_addr, "/healthz").unwrap().0, 200);
    assert_eq!(admin_get(server.admin_addr, "/readyz").unwrap().0, 200);
    assert_eq!(admin_get(server.admin_addr, "/nope").unwrap().0, 404);
    // HEAD as GET, without a body; another method on a known path is 405, not "not found".
    for path in ["/healthz", "/readyz", "/metrics"] {
        assert_eq!(
            admin_request(server.admin_addr, "HEAD", path).unwrap(),
            (200, String::new())
        );
        let (status, body) = admin_request(server.admin_addr, "POST", path).unwrap();
        assert_eq!(status, 405, "{path}: {body}");
        assert!(body.contains("answers GET"), "{path}: {body}");
    }

    let mut signed = server.cells(&server.demo).await.unwrap();
    for i in 0..3 {
        signed.write(write(i, 0, 0, b"v")).await.unwrap();
    }
    let mut on_conn = server.cells_on_connection(&server.demo).await.unwrap();
    on_conn.read(read(0, 0, 0)).await.unwrap();
    on_conn.read(read(1, 0, 0)).await.unwrap();
    let mut bare = cube_api::v1::cells_client::CellsClient::new(server.channel().await.unwrap());
    assert!(bare.read(read(0, 0, 0)).await.is_err());

    let (status, text) = admin_get(server.admin_addr, "/metrics").unwrap();
    assert_eq!(status, 200);
    let handled = |method: &str, code: &str, auth: &str| {
        metric_sample(
            &text,
            &format!(
                "grpc_server_handled_total{{auth=\"{auth}\",grpc_code=\"{code}\",grpc_method=\"{method}\",grpc_service=\"cube.v1.Cells\",grpc_type=\"unary\"}}"
            ),
        )
    };
    assert_eq!(handled("Write", "OK", "call"), Some(3.0), "{text}");
    assert_eq!(handled("Read", "OK", "connection"), Some(2.0));
    assert_eq!(handled("Read", "Unauthenticated", "none"), Some(1.0));
    assert_eq!(
        metric_sample(&text, "cube_auth_handshakes_total{result=\"ok\"}"),
        Some(1.0)
    );
    assert_eq!(
        metric_sample(&text, "cube_auth_failures_total{reason=\"missing\"}"),
        Some(1.0)
    );
    assert_eq!(metric_sample(&text, "cube_tenants_active"), Some(1.0));
    assert!(metric_sample(&text, "cube_wal_fsync_seconds_count").unwrap() >= 1.0);
    // Each of the three writes passed through every stage of its tenant; a Read does not go
    // through the actor.
    for stage in ["mailbox", "durable", "apply"] {
        let n = metric_sample(
            &text,
            &format!("cube_change_stage_seconds_count{{stage=\"{stage}\"}}"),
        );
        assert!(n.is_some_and(|n| n >= 3.0), "{stage}: {n:?}\n{text}");
    }
    assert!(text.contains(
        "grpc_server_handling_seconds_bucket{auth=\"call\",grpc_code=\"OK\",grpc_method=\"Write\""
    ));
    assert!(metric_sample(&text, "cube_connections_open{auth=\"connection\"}").unwrap() >= 1.0);
    // Without TLS there is no certificate to expire: no series an expiry alert would fire on.
    assert_eq!(
        metric_sample(&text, "cube_tls_certificate_expiry_timestamp_seconds"),
        None
    );
}

/// The admin port takes at most 16 connections from one address and 64 in all; more are closed
/// at accept. One client holding its 16 open does not keep out the liveness probe, which comes
/// from another address (until 2026-12-05 one client could take all 64 places, and an
/// orchestrator then restarted the server for a failed probe).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_port_caps_its_connections() {
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let server = TestServer::start(cubed()).unwrap();
    let addr = server.admin_addr;
    // A connection from 127.0.0.`last` (all of 127/8 is this host).
    let from = |last: u8| async move {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket
            .bind(std::net::SocketAddr::from(([127, 0, 0, last], 0)))
            .unwrap();
        socket.connect(addr).await.unwrap()
    };
    // What the server sends on `s` after `request`, until it closes it (5 s at most).
    let answer = |mut s: tokio::net::TcpStream, request: &'static str| async move {
        s.write_all(request.as_bytes()).await.unwrap();
        let mut got = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut got)).await;
        assert!(read.is_ok(), "the connection was left waiting");
        String::from_utf8_lossy(&got).to_string()
    };
    const HEALTHZ: &str = "GET /healthz HTTP/1.1\r\nHost: cube\r\nConnection: close\r\n\r\n";
    let mut held = Vec::new();
    for _ in 0..16 {
        held.push(from(1).await);
    }
    // Give the server time to accept them all.
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Closed by the server without a byte (EOF), not served.
    assert_eq!(
        answer(from(1).await, HEALTHZ).await,
        "",
        "a 17th from one address"
    );
    let probe = answer(from(2).await, HEALTHZ).await;
    assert!(
        probe.starts_with("HTTP/1.1 200"),
        "the probe from another address: {probe:?}"
    );
    for last in 2..=4 {
        for _ in 0..16 {
            held.push(from(last).await);
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(answer(from(5).await, HEALTHZ).await, "", "a 65th in all");
    drop(held);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        match admin_get(addr, "/healthz") {
            Ok((200, _)) => break,
            other if std::time::Instant::now() > deadline => panic!("{other:?}"),
            _ => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}
