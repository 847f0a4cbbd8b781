//! Capabilities: checked on every call, changed only by an ADMIN key of the same tenant.

use cube_api::v1::access_client::AccessClient;
use cube_api::v1::{Capability, GrantRequest, RevokeRequest};
use cube_auth::Credentials;
use cube_testkit::TestServer;
use tonic::Code;

use crate::{cubed, read, write};

fn new_key(server: &TestServer, tenant: &str) -> Credentials {
    let out = server.cli(&["key", "create", tenant]).unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capabilities_are_enforced_and_only_admins_of_the_tenant_change_them() {
    let server = TestServer::start(cubed()).unwrap();
    let second = new_key(&server, "demo");
    let acme = server.create_tenant("acme").unwrap();
    let mut admin = AccessClient::new(server.signed(&server.demo).await.unwrap());
    let mut not_admin = AccessClient::new(server.signed(&second).await.unwrap());

    // A key without ADMIN cannot change capabilities, not even its own.
    let err = not_admin
        .grant(GrantRequest {
            key_id: second.key_id.clone(),
            capabilities: vec![Capability::Admin as i32],
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);

    // Take WRITE away: writes are refused from the next call, reads still work.
    let mut cells = server.cells(&second).await.unwrap();
    cells.write(write(1, 1, 1, b"x")).await.unwrap();
    let caps = admin
        .revoke(RevokeRequest {
            key_id: second.key_id.clone(),
            capabilities: vec![Capability::Write as i32],
        })
        .await
        .unwrap()
        .into_inner()
        .capabilities;
    assert_eq!(caps, vec![Capability::Read as i32]);
    let err = cells.write(write(1, 1, 1, b"y")).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);
    assert!(err.message().contains("Write"), "{}", err.message());
    assert_eq!(
        cells.read(read(1, 1, 1)).await.unwrap().into_inner().value,
        b"x"
    );
    // The same holds on a connection authenticated by handshake.
    let mut on_conn = server.cells_on_connection(&second).await.unwrap();
    assert_eq!(
        on_conn
            .write(write(1, 1, 1, b"z"))
            .await
            .unwrap_err()
            .code(),
        Code::PermissionDenied
    );

    // Give it back.
    admin
        .grant(GrantRequest {
            key_id: second.key_id.clone(),
            capabilities: vec![Capability::Write as i32],
        })
        .await
        .unwrap();
    cells.write(write(1, 1, 1, b"y")).await.unwrap();

    // Another tenant's key is out of reach; a bad capability is a bad request.
    let err = admin
        .revoke(RevokeRequest {
            key_id: acme.key_id.clone(),
            capabilities: vec![Capability::Read as i32],
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    let err = admin
        .grant(GrantRequest {
            key_id: second.key_id.clone(),
            capabilities: vec![Capability::Unspecified as i32],
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    // acme's key still reads its own (empty) cell: nothing of demo's changed it.
    let mut acme_cells = server.cells(&acme).await.unwrap();
    assert!(
        !acme_cells
            .read(read(1, 1, 1))
            .await
            .unwrap()
            .into_inner()
            .found
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rpc_checks_its_capability() {
    use cube_api::v1::tenant_client::TenantClient;
    use cube_api::v1::{AuditRequest, DeleteRequest};
    let server = TestServer::start(cubed()).unwrap();
    let second = new_key(&server, "demo");
    let mut admin = AccessClient::new(server.signed(&server.demo).await.unwrap());
    let all = vec![Capability::Read as i32, Capability::Write as i32];
    admin
        .revoke(RevokeRequest {
            key_id: second.key_id.clone(),
            capabilities: all,
        })
        .await
        .unwrap();
    let mut cells = server.cells(&second).await.unwrap();
    let mut tenant = TenantClient::new(server.signed(&second).await.unwrap());
    let mut access = AccessClient::new(server.signed(&second).await.unwrap());
    let denied =
        |r: Result<(), tonic::Status>| assert_eq!(r.unwrap_err().code(), Code::PermissionDenied);
    denied(cells.read(read(0, 0, 0)).await.map(|_| ()));
    denied(cells.write(write(0, 0, 0, b"x")).await.map(|_| ()));
    denied(
        cells
            .delete(DeleteRequest {
                coord: crate::coord(0, 0, 0),
                expected_version: None,
            })
            .await
            .map(|_| ()),
    );
    denied(
        tenant
            .audit(AuditRequest {
                from_seq: 0,
                limit: 1,
            })
            .await
            .map(|_| ()),
    );
    denied(
        access
            .grant(GrantRequest {
                key_id: second.key_id.clone(),
                capabilities: vec![Capability::Read as i32],
            })
            .await
            .map(|_| ()),
    );
}

/// How the server stops between the changes and the checks.
#[derive(Clone, Copy)]
enum Stop {
    Kill9,
    Graceful,
}

/// Catalog changes are durable when acknowledged, whichever way the server stops: a revoked
/// capability stays revoked, a granted one stays granted, a revoked key stays revoked and a new
/// durability policy is the one the tenant's log runs under. Each is
/// durable in the tenant's log when acknowledged; after kill -9 the replay the server runs before
/// it serves puts it back in force, and at a graceful stop the tenant's checkpoint writes it into
/// the catalog's files (after which an older journal record of the key, its creation, must not
/// bring the old value back at the next start).
async fn acknowledged_catalog_changes_survive(stop: Stop) {
    let mut server = TestServer::start(cubed()).unwrap();
    let second = new_key(&server, "demo");
    let third = new_key(&server, "demo");
    let gone = new_key(&server, "demo");
    let mut admin = AccessClient::new(server.signed(&server.demo).await.unwrap());
    admin
        .revoke(RevokeRequest {
            key_id: second.key_id.clone(),
            capabilities: vec![Capability::Write as i32],
        })
        .await
        .unwrap();
    admin
        .grant(GrantRequest {
            key_id: third.key_id.clone(),
            capabilities: vec![Capability::Admin as i32],
        })
        .await
        .unwrap();
    drop(admin);
    let out = server
        .cli(&["key", "revoke", "demo", &gone.key_id])
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let relaxed = "relaxed(max_delay_ms=7, max_records=50)";
    let out = crate::set_demo_durability(
        &server,
        &["relaxed", "--max-delay-ms", "7", "--max-records", "50"],
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(relaxed),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    tokio::task::block_in_place(|| match stop {
        Stop::Kill9 => server.kill9(),
        Stop::Graceful => server.sigterm().map(|status| assert!(status.success())),
    })
    .unwrap();
    tokio::task::block_in_place(|| server.restart()).unwrap();

    let mut cells = server.cells(&second).await.unwrap();
    let err = cells.write(write(2, 2, 2, b"x")).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);
    assert!(!cells.read(read(2, 2, 2)).await.unwrap().into_inner().found);
    let mut third_admin = AccessClient::new(server.signed(&third).await.unwrap());
    third_admin
        .grant(GrantRequest {
            key_id: second.key_id.clone(),
            capabilities: vec![Capability::Write as i32],
        })
        .await
        .unwrap();
    cells.write(write(2, 2, 2, b"x")).await.unwrap();
    let mut revoked = server.cells(&gone).await.unwrap();
    let err = revoked.read(read(2, 2, 2)).await.unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);
    // The policy the log runs under, not only the catalog's.
    assert_eq!(crate::totals(&server).await.durability, relaxed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_catalog_changes_survive_kill_9() {
    acknowledged_catalog_changes_survive(Stop::Kill9).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_catalog_changes_survive_a_graceful_restart() {
    acknowledged_catalog_changes_survive(Stop::Graceful).await;
}
