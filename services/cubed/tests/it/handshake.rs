//! Per-connection auth: one handshake authenticates a connection; challenges are single-use and
//! bound to their connection; revocation ends open sessions; `--auth-mode` picks the models.

use cube_api::v1::auth_client::AuthClient;
use cube_api::v1::cells_client::CellsClient;
use cube_api::v1::{ChallengeRequest, HelloRequest};
use cube_auth::{Credentials, Secret, hello_mac};
use cube_testkit::TestServer;
use tonic::Code;
use tonic::transport::Channel;

use crate::{cubed, read, write};

/// Challenge on `challenge_on`, answer it on `hello_on`; returns the Hello request sent.
async fn handshake_split(
    creds: &Credentials,
    challenge_on: Channel,
    hello_on: Channel,
) -> (HelloRequest, Result<(), tonic::Status>) {
    let secret = Secret::from_hex(&creds.secret).unwrap();
    let challenge = AuthClient::new(challenge_on)
        .challenge(ChallengeRequest {
            tenant: creds.tenant.clone(),
            key_id: creds.key_id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    let client_nonce = vec![9u8; 16];
    let mac = hello_mac(
        &secret,
        &creds.tenant,
        &creds.key_id,
        &challenge.nonce,
        &client_nonce,
    );
    let hello = HelloRequest {
        tenant: creds.tenant.clone(),
        key_id: creds.key_id.clone(),
        nonce: challenge.nonce,
        client_nonce,
        mac: mac.to_vec(),
    };
    let r = AuthClient::new(hello_on)
        .hello(hello.clone())
        .await
        .map(|_| ());
    (hello, r)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_handshake_authenticates_every_later_call_on_the_connection() {
    let server = TestServer::start(cubed()).unwrap();
    let mut c = server.cells_on_connection(&server.demo).await.unwrap();
    for i in 0..20 {
        c.write(write(i, 0, 0, b"on-connection")).await.unwrap();
    }
    assert_eq!(
        c.read(read(3, 0, 0)).await.unwrap().into_inner().value,
        b"on-connection"
    );
    // The same data is visible to a per-call client of the same tenant...
    let mut signed = server.cells(&server.demo).await.unwrap();
    assert!(signed.read(read(3, 0, 0)).await.unwrap().into_inner().found);
    // ...and not to another tenant authenticated per connection.
    let acme = server.create_tenant("acme").unwrap();
    let mut other = server.cells_on_connection(&acme).await.unwrap();
    assert!(!other.read(read(3, 0, 0)).await.unwrap().into_inner().found);
    // A fresh connection without a handshake is not authenticated.
    let mut bare = CellsClient::new(server.channel().await.unwrap());
    assert_eq!(
        bare.read(read(3, 0, 0)).await.unwrap_err().code(),
        Code::Unauthenticated
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_hello_and_a_challenge_answered_on_another_connection_are_refused() {
    let server = TestServer::start(cubed()).unwrap();
    let conn = server.channel().await.unwrap();
    let (hello, first) = handshake_split(&server.demo, conn.clone(), conn.clone()).await;
    first.unwrap();
    // Replaying the same Hello (on the same or another connection) finds no challenge.
    let replay = AuthClient::new(conn.clone())
        .hello(hello.clone())
        .await
        .unwrap_err();
    assert_eq!(replay.code(), Code::Unauthenticated);
    assert!(
        replay.message().contains("no challenge is pending"),
        "{}",
        replay.message()
    );
    let elsewhere = server.channel().await.unwrap();
    let replay = AuthClient::new(elsewhere.clone())
        .hello(hello)
        .await
        .unwrap_err();
    assert_eq!(replay.code(), Code::Unauthenticated);
    // A challenge issued on connection A and answered on connection B is refused, and B stays
    // unauthenticated.
    let a = server.channel().await.unwrap();
    let b = server.channel().await.unwrap();
    let (_, crossed) = handshake_split(&server.demo, a, b.clone()).await;
    assert_eq!(crossed.unwrap_err().code(), Code::Unauthenticated);
    let err = CellsClient::new(b).read(read(0, 0, 0)).await.unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoking_a_key_ends_its_open_connection_sessions() {
    let server = TestServer::start(cubed()).unwrap();
    let second = {
        let out = server.cli(&["key", "create", "demo"]).unwrap();
        assert!(out.status.success());
        serde_json::from_slice::<Credentials>(&out.stdout).unwrap()
    };
    let mut doomed = server.cells_on_connection(&second).await.unwrap();
    let mut survivor = server.cells_on_connection(&server.demo).await.unwrap();
    doomed.write(write(1, 1, 1, b"before")).await.unwrap();
    let out = server
        .cli(&["key", "revoke", "demo", &second.key_id])
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Told why, on every later call (docs/protocol.md), not that credentials are missing.
    for _ in 0..2 {
        let err = doomed.read(read(1, 1, 1)).await.unwrap_err();
        assert_eq!(err.code(), Code::Unauthenticated);
        assert!(
            err.message().contains("was revoked; authenticate again"),
            "{err:?}"
        );
    }
    assert_eq!(
        survivor
            .read(read(1, 1, 1))
            .await
            .unwrap()
            .into_inner()
            .value,
        b"before"
    );
    // A new handshake with the revoked key fails.
    let conn = server.channel().await.unwrap();
    let err = cube_auth::client::handshake(conn, &second)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("revoked"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_mode_selects_the_accepted_models() {
    let conn_only = TestServer::start_with(cubed(), &["--auth-mode", "connection"]).unwrap();
    let mut signed = conn_only.cells(&conn_only.demo).await.unwrap();
    let err = signed.read(read(0, 0, 0)).await.unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);
    assert!(
        err.message().contains("only per-connection"),
        "{}",
        err.message()
    );
    let mut c = conn_only
        .cells_on_connection(&conn_only.demo)
        .await
        .unwrap();
    c.write(write(0, 0, 0, b"ok")).await.unwrap();

    let call_only = TestServer::start_with(cubed(), &["--auth-mode", "call"]).unwrap();
    let err = AuthClient::new(call_only.channel().await.unwrap())
        .challenge(ChallengeRequest {
            tenant: "demo".into(),
            key_id: call_only.demo.key_id.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    // Hello too, whatever it carries: the model is off, not the answer wrong.
    let err = AuthClient::new(call_only.channel().await.unwrap())
        .hello(HelloRequest {
            tenant: "demo".into(),
            key_id: call_only.demo.key_id.clone(),
            nonce: vec![0; 32],
            client_nonce: vec![0; 32],
            mac: vec![0; 32],
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    let mut signed = call_only.cells(&call_only.demo).await.unwrap();
    signed.write(write(0, 0, 0, b"ok")).await.unwrap();
}

/// A malformed Hello (a client nonce of the wrong size) is INVALID_ARGUMENT and is not counted
/// as a failed authentication: more of them than `--auth-failure-limit` leave the address
/// unthrottled (each used to count, and went into the tenant's trail as `auth.failed`, so a
/// buggy client got its whole address refused).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_hello_is_not_a_failed_authentication() {
    let server = TestServer::start_with(cubed(), &["--auth-failure-limit", "3"]).unwrap();
    let conn = server.channel().await.unwrap();
    let mut auth = AuthClient::new(conn.clone());
    for _ in 0..5 {
        let challenge = auth
            .challenge(ChallengeRequest {
                tenant: server.demo.tenant.clone(),
                key_id: server.demo.key_id.clone(),
            })
            .await
            .unwrap()
            .into_inner();
        let refused = auth
            .hello(HelloRequest {
                tenant: server.demo.tenant.clone(),
                key_id: server.demo.key_id.clone(),
                nonce: challenge.nonce,
                client_nonce: vec![1],
                mac: vec![0; 32],
            })
            .await
            .unwrap_err();
        assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    }
    let (_, ok) = handshake_split(&server.demo, conn.clone(), conn.clone()).await;
    ok.unwrap();
    CellsClient::new(conn)
        .write(write(0, 0, 0, b"served"))
        .await
        .unwrap();
}
