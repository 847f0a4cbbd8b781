//! Per-call auth: every way a signature can be wrong is UNAUTHENTICATED, and tenants never see
//! each other's cells.

use cube_api::v1::cells_client::CellsClient;
use cube_api::v1::{ReadRequest, WriteRequest};
use cube_auth::{Credentials, Secret, new_call_nonce};
use cube_testkit::{TestServer, now_ms, sign_manually};
use tonic::{Code, Request};

use crate::{cubed, read, write};

const READ: &str = "/cube.v1.Cells/Read";

/// Send a Read at (1,1,1) carrying metadata signed as `creds` for `path` at `ts` with `nonce`.
async fn read_signed(
    server: &TestServer,
    creds: &Credentials,
    path: &str,
    ts: i64,
    nonce: &str,
) -> Result<(), tonic::Status> {
    let mut client = CellsClient::new(server.channel().await.unwrap());
    let mut req = Request::new(read(1, 1, 1));
    sign_manually(&mut req, creds, path, ts, nonce).unwrap();
    client.read(req).await.map(|_| ())
}

fn expect_unauthenticated(r: Result<(), tonic::Status>, needle: &str) {
    let err = r.expect_err("call should have been refused");
    assert_eq!(err.code(), Code::Unauthenticated, "{err:?}");
    assert!(
        err.message().contains(needle),
        "message {:?} lacks {needle:?}",
        err.message()
    );
}

/// A signed call accepted with a timestamp ahead of the server clock (a client whose clock runs
/// ahead), captured, is still refused after the server is killed and restarted within that lead:
/// far ahead by the key's floor the server wrote before accepting it, slightly ahead by the
/// start watermark. Other keys are not affected by the floor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_signed_ahead_of_the_server_clock_is_not_replayable_after_a_restart() {
    let mut server = TestServer::start(cubed()).unwrap();
    let acme = server.create_tenant("acme").unwrap();
    let demo = server.demo.clone();
    let now = now_ms();
    let (far, near) = (now + 120_000, now + 900);
    let (far_nonce, near_nonce) = (new_call_nonce(), new_call_nonce());
    read_signed(&server, &demo, READ, far, &far_nonce)
        .await
        .unwrap();
    read_signed(&server, &demo, READ, near, &near_nonce)
        .await
        .unwrap();
    expect_unauthenticated(
        read_signed(&server, &demo, READ, far, &far_nonce).await,
        "already used",
    );

    server.kill9().unwrap();
    server.restart().unwrap();
    for (ts, nonce) in [(far, &far_nonce), (near, &near_nonce)] {
        expect_unauthenticated(
            read_signed(&server, &demo, READ, ts, nonce).await,
            "older than the server's replay window",
        );
    }
    // Another key's calls, far ahead or current, are served.
    read_signed(&server, &acme, READ, far, &new_call_nonce())
        .await
        .unwrap();
    read_signed(&server, &acme, READ, now_ms(), &new_call_nonce())
        .await
        .unwrap();
}

/// A restart whose clock stepped back, simulated by the clock mark a server running a minute
/// later would have left: signed calls stamped at or below the mark stay refused (the old
/// server may have accepted them), those above it are served, and the server does not wait for
/// its clock to catch up: it is ready, serves handshakes and says why in its log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_clock_steps_back_calls_up_to_the_previous_servers_mark_stay_refused() {
    let mut server = TestServer::start(cubed()).unwrap();
    let demo = server.demo.clone();
    read_signed(&server, &demo, READ, now_ms(), &new_call_nonce())
        .await
        .unwrap();
    assert!(server.sigterm().unwrap().success());
    // The mark file: two 24-byte slots at 0 and 4096 (write number, mark, CRC-32C of both);
    // the slot with the higher write number counts.
    let path = server.data_dir().join("replay-clock");
    let mut bytes = std::fs::read(&path).unwrap();
    assert_eq!(bytes.len(), 4096 + 24);
    let mark = now_ms() + 60_000;
    let mut slot = [0u8; 24];
    slot[..8].copy_from_slice(&(1u64 << 40).to_le_bytes());
    slot[8..16].copy_from_slice(&mark.to_le_bytes());
    let crc = crc32c::crc32c(&slot[..16]);
    slot[16..20].copy_from_slice(&crc.to_le_bytes());
    bytes[..24].copy_from_slice(&slot);
    std::fs::write(&path, &bytes).unwrap();

    server.restart().unwrap();
    expect_unauthenticated(
        read_signed(&server, &demo, READ, now_ms(), &new_call_nonce()).await,
        "older than the server's replay window",
    );
    read_signed(&server, &demo, READ, mark + 1, &new_call_nonce())
        .await
        .unwrap();
    let mut on_connection = server.cells_on_connection(&demo).await.unwrap();
    on_connection.read(read(1, 1, 1)).await.unwrap();
    assert!(
        server.log().contains("behind the replay clock mark"),
        "{}",
        server.log()
    );
}

/// A clock mark file with no valid slot stops the start, and the error names that file: it
/// used to be reported as "configuring TLS" on a plaintext server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spoiled_replay_clock_mark_stops_the_start_and_is_named() {
    let mut server = TestServer::start(cubed()).unwrap();
    assert!(server.sigterm().unwrap().success());
    let path = server.data_dir().join("replay-clock");
    std::fs::write(&path, vec![0xff; 4096 + 24]).unwrap();
    let stderr = crate::tls::refused_start(&server.data_dir(), &[]);
    assert!(
        stderr.contains("replay-clock holds no valid clock mark")
            && stderr.contains("replay protection")
            && !stderr.contains("configuring TLS"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_bad_credential_is_unauthenticated() {
    let server = TestServer::start(cubed()).unwrap();
    let demo = server.demo.clone();
    let acme = server.create_tenant("acme").unwrap();

    // A correctly signed call works (so the refusals below are about the one thing changed).
    read_signed(&server, &demo, READ, now_ms(), &new_call_nonce())
        .await
        .unwrap();

    // No credentials at all. (A plaintext listener takes no client certificate: none named.)
    let mut bare = CellsClient::new(server.channel().await.unwrap());
    let e = bare.read(read(1, 1, 1)).await.unwrap_err();
    assert!(!e.message().contains("certificate"), "{e:?}");
    expect_unauthenticated(Err(e), "missing credentials");

    // Bad signature: signed with another secret.
    let wrong_secret = Credentials {
        secret: Secret::generate().to_hex(),
        ..demo.clone()
    };
    expect_unauthenticated(
        read_signed(&server, &wrong_secret, READ, now_ms(), &new_call_nonce()).await,
        "does not match",
    );

    // Stale timestamp, and one from the future.
    expect_unauthenticated(
        read_signed(&server, &demo, READ, now_ms() - 301_000, &new_call_nonce()).await,
        "away from the server clock",
    );
    expect_unauthenticated(
        read_signed(&server, &demo, READ, now_ms() + 301_000, &new_call_nonce()).await,
        "away from the server clock",
    );
    // Just past the window: the distance is rounded up, never shown as within it (301 s, or
    // more if the call took a while to arrive).
    let r = read_signed(&server, &demo, READ, now_ms() - 300_100, &new_call_nonce()).await;
    expect_unauthenticated(
        r.clone(),
        " s away from the server clock; at most 300 s is allowed",
    );
    let message = r.unwrap_err().message().to_string();
    let away = message
        .split("x-cube-ts is ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse::<u64>().ok());
    assert!(away.is_some_and(|s| s >= 301), "{message}");
    // The most negative timestamp the canonical form allows: refused, not an overflow.
    expect_unauthenticated(
        read_signed(&server, &demo, READ, i64::MIN, &new_call_nonce()).await,
        "away from the server clock",
    );

    // Replayed nonce.
    let nonce = new_call_nonce();
    let ts = now_ms();
    read_signed(&server, &demo, READ, ts, &nonce).await.unwrap();
    expect_unauthenticated(
        read_signed(&server, &demo, READ, ts, &nonce).await,
        "already used",
    );

    // Unknown key.
    let unknown = Credentials {
        key_id: "k-000000000000".into(),
        ..demo.clone()
    };
    expect_unauthenticated(
        read_signed(&server, &unknown, READ, now_ms(), &new_call_nonce()).await,
        "unknown or revoked key",
    );

    // A signature for another method.
    expect_unauthenticated(
        read_signed(
            &server,
            &demo,
            "/cube.v1.Cells/Write",
            now_ms(),
            &new_call_nonce(),
        )
        .await,
        "does not match",
    );

    // Another tenant's key presented for this tenant.
    let borrowed = Credentials {
        tenant: demo.tenant.clone(),
        ..acme.clone()
    };
    expect_unauthenticated(
        read_signed(&server, &borrowed, READ, now_ms(), &new_call_nonce()).await,
        "unknown or revoked key",
    );

    // Malformed nonce.
    expect_unauthenticated(
        read_signed(&server, &demo, READ, now_ms(), "XYZ").await,
        "x-cube-nonce",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_never_see_each_others_cells() {
    let server = TestServer::start(cubed()).unwrap();
    let acme = server.create_tenant("acme").unwrap();
    let mut demo = server.cells(&server.demo).await.unwrap();
    let mut acme = server.cells(&acme).await.unwrap();
    demo.write(write(5, 5, 5, b"demo's")).await.unwrap();
    acme.write(write(5, 5, 5, b"acme's")).await.unwrap();
    demo.write(write(6, 6, 6, b"only demo")).await.unwrap();
    assert_eq!(
        demo.read(read(5, 5, 5)).await.unwrap().into_inner().value,
        b"demo's"
    );
    assert_eq!(
        acme.read(read(5, 5, 5)).await.unwrap().into_inner().value,
        b"acme's"
    );
    let r = acme.read(read(6, 6, 6)).await.unwrap().into_inner();
    assert!(!r.found && r.value.is_empty());

    let r = acme
        .write(WriteRequest {
            coord: crate::coord(7, 7, 7),
            value: vec![1],
            expected_version: None,
        })
        .await
        .unwrap();
    // acme's own log: its tenant.create audit event (1), its first write (2), this write (3);
    // demo's writes do not advance it.
    assert_eq!(r.into_inner().seq, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoked_key_is_refused_on_its_next_call() {
    let server = TestServer::start(cubed()).unwrap();
    let mut client = server.cells(&server.demo).await.unwrap();
    client.read(read(0, 0, 0)).await.unwrap();
    let out = server
        .cli(&["key", "revoke", "demo", &server.demo.key_id])
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let err = client
        .read(ReadRequest {
            coord: crate::coord(0, 0, 0),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_and_reflection_need_no_credentials() {
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::{HealthCheckRequest, health_check_response::ServingStatus};
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;

    let server = TestServer::start(cubed()).unwrap();
    let channel = server.channel().await.unwrap();
    let mut health = HealthClient::new(channel.clone());
    for service in ["", "cube.v1.Cells"] {
        let r = health
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.status(), ServingStatus::Serving, "{service:?}");
    }
    let mut reflection = ServerReflectionClient::new(channel);
    let req = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut stream = reflection
        .server_reflection_info(tokio_stream::iter([req]))
        .await
        .unwrap()
        .into_inner();
    let Some(MessageResponse::ListServicesResponse(list)) =
        stream.message().await.unwrap().unwrap().message_response
    else {
        panic!("no service list");
    };
    let names: Vec<_> = list.service.into_iter().map(|s| s.name).collect();
    for expected in [
        "cube.v1.Cells",
        "cube.v1.Access",
        "cube.v1.Tenant",
        "cube.v1.Auth",
        "cube.v1.Admin",
        "grpc.health.v1.Health",
    ] {
        assert!(
            names.iter().any(|n| n == expected),
            "{expected} missing from {names:?}"
        );
    }
}

/// A connection to `server` from 127.0.0.2, another loopback address than the test's others.
async fn from_another_address(server: &TestServer) -> tonic::transport::Channel {
    tonic::transport::Endpoint::from_shared(server.endpoint())
        .unwrap()
        .local_address(Some("127.0.0.2".parse().unwrap()))
        .connect()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_bad_signatures_is_throttled_while_good_clients_are_served() {
    let server = TestServer::start_with(cubed(), &["--auth-failure-limit", "20"]).unwrap();
    // The attacker connects from another loopback address than the good client.
    let attacker = from_another_address(&server).await;
    let wrong = Credentials {
        secret: Secret::generate().to_hex(),
        ..server.demo.clone()
    };
    let mut good = server.cells(&server.demo).await.unwrap();
    // A good client behind the attacker's address, its connection authenticated before the
    // flood.
    let neighbour = from_another_address(&server).await;
    cube_auth::client::handshake(neighbour.clone(), &server.demo)
        .await
        .unwrap();
    let mut neighbour = CellsClient::new(neighbour);
    // And a connection from there whose key is revoked before the flood: its calls fail, so
    // they are throttled like any others.
    let out = server.cli(&["key", "create", "demo"]).unwrap();
    let doomed: Credentials = serde_json::from_slice(&out.stdout).unwrap();
    let revoked = from_another_address(&server).await;
    cube_auth::client::handshake(revoked.clone(), &doomed)
        .await
        .unwrap();
    let out = server
        .cli(&["key", "revoke", "demo", &doomed.key_id])
        .unwrap();
    assert!(out.status.success());
    let (mut unauthenticated, mut throttled) = (0, 0);
    for i in 0..200 {
        let mut req = Request::new(read(1, 1, 1));
        sign_manually(&mut req, &wrong, READ, now_ms(), &new_call_nonce()).unwrap();
        match CellsClient::new(attacker.clone())
            .read(req)
            .await
            .unwrap_err()
            .code()
        {
            Code::Unauthenticated => unauthenticated += 1,
            Code::ResourceExhausted => throttled += 1,
            other => panic!("unexpected {other:?}"),
        }
        if i % 20 == 0 {
            good.write(write(i, 0, 0, b"still served")).await.unwrap();
        }
    }
    assert_eq!(
        unauthenticated, 21,
        "the first 20 failures (and the one crossing the limit) are answered normally"
    );
    assert_eq!(throttled, 179);
    // Even correct credentials from the throttled address wait for the cool-down.
    let mut req = Request::new(read(1, 1, 1));
    sign_manually(&mut req, &server.demo, READ, now_ms(), &new_call_nonce()).unwrap();
    let err = CellsClient::new(attacker).read(req).await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted);
    assert!(err.message().contains("retry in"), "{}", err.message());
    assert!(good.read(read(0, 0, 0)).await.unwrap().into_inner().found);
    // A connection authenticated by its handshake computes no signature: still served.
    assert!(
        neighbour
            .read(read(0, 0, 0))
            .await
            .unwrap()
            .into_inner()
            .found
    );
    let err = CellsClient::new(revoked)
        .read(read(0, 0, 0))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{}", err.message());
}

/// Correctly signed calls stamped before the server started (as a client signs them while the
/// server restarts) are refused as too old, but do not get their address throttled: their
/// signature verified, so they say nothing against the credentials.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_refused_as_too_old_do_not_throttle_their_address() {
    // Stamped a second before the server was started, however long its start takes.
    let stale = now_ms() - 1_000;
    let server = TestServer::start_with(cubed(), &["--auth-failure-limit", "5"]).unwrap();
    let channel = server.channel().await.unwrap();
    for _ in 0..20 {
        let mut req = Request::new(read(1, 1, 1));
        sign_manually(&mut req, &server.demo, READ, stale, &new_call_nonce()).unwrap();
        let err = CellsClient::new(channel.clone())
            .read(req)
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::Unauthenticated, "{err:?}");
        assert!(err.message().contains("replay window"), "{err:?}");
    }
    let mut req = Request::new(read(1, 1, 1));
    sign_manually(&mut req, &server.demo, READ, now_ms(), &new_call_nonce()).unwrap();
    CellsClient::new(channel.clone()).read(req).await.unwrap();
    // A wrong secret still counts: six failures cross the limit of five.
    let wrong = Credentials {
        secret: Secret::generate().to_hex(),
        ..server.demo.clone()
    };
    let mut codes = Vec::new();
    for _ in 0..7 {
        let mut req = Request::new(read(1, 1, 1));
        sign_manually(&mut req, &wrong, READ, now_ms(), &new_call_nonce()).unwrap();
        codes.push(
            CellsClient::new(channel.clone())
                .read(req)
                .await
                .unwrap_err()
                .code(),
        );
    }
    assert_eq!(codes[5], Code::Unauthenticated, "{codes:?}");
    assert_eq!(codes[6], Code::ResourceExhausted, "{codes:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_metadata_is_refused_and_the_server_keeps_serving() {
    let server = TestServer::start_with(cubed(), &["--max-metadata-bytes", "4096"]).unwrap();
    let mut client = server.cells(&server.demo).await.unwrap();
    let mut req = Request::new(read(1, 1, 1));
    req.metadata_mut()
        .insert("x-padding", "p".repeat(8192).parse().unwrap());
    assert!(client.read(req).await.is_err());
    let mut client = server.cells(&server.demo).await.unwrap();
    client.read(read(1, 1, 1)).await.unwrap();
}
