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
}

/// The admin port holds at most 64 connections: idle ones beyond that are closed at accept, and
/// scrapes work again once they go.
#[test]
fn the_admin_port_caps_its_connections() {
    use std::io::Read;
    let server = TestServer::start(cubed()).unwrap();
    let idle: Vec<_> = (0..64)
        .map(|_| std::net::TcpStream::connect(server.admin_addr).unwrap())
        .collect();
    // Give the server time to accept them all.
    std::thread::sleep(std::time::Duration::from_millis(300));
    let mut extra = std::net::TcpStream::connect(server.admin_addr).unwrap();
    extra
        .set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .unwrap();
    let mut buf = [0u8; 16];
    // Closed by the server without a byte (EOF), not left waiting.
    assert!(
        matches!(extra.read(&mut buf), Ok(0)),
        "a 65th admin connection was kept"
    );
    assert!(cube_testkit::admin_get(server.admin_addr, "/healthz").is_err());
    drop(idle);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        match cube_testkit::admin_get(server.admin_addr, "/healthz") {
            Ok((200, _)) => break,
            other if std::time::Instant::now() > deadline => panic!("{other:?}"),
            _ => std::thread::sleep(std::time::Duration::from_millis(50)),
        }
    }
}
