//! Capabilities: checked on every call, changed only by an ADMIN key of the same tenant.

use cube_api::v1::access_client::AccessClient;
use cube_api::v1::{Capability, GrantRequest, RevokeRequest};
use cube_auth::Credentials;
use cube_testkit::TestServer;
use tonic::Code;

use crate::{cubed, read, write};

fn new_key(server: &TestServer, tenant: &str) -> Credentials {
    new_key_with(server, tenant, &[])
}

/// `cubed key create TENANT FLAGS…`.
fn new_key_with(server: &TestServer, tenant: &str, flags: &[&str]) -> Credentials {
    let mut args = vec!["key", "create", tenant];
    args.extend_from_slice(flags);
    let out = server.cli(&args).unwrap();
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

/// A new key of `demo` holding `cap` alone.
async fn key_with_only(server: &TestServer, cap: Capability) -> Credentials {
    let key = new_key(server, "demo");
    let mut admin = AccessClient::new(server.signed(&server.demo).await.unwrap());
    let other = match cap {
        Capability::Read => Capability::Write,
        _ => Capability::Read,
    };
    let caps = admin
        .revoke(RevokeRequest {
            key_id: key.key_id.clone(),
            capabilities: vec![other as i32],
        })
        .await
        .unwrap()
        .into_inner()
        .capabilities;
    assert_eq!(caps, [cap as i32]);
    key
}

/// The messages of a server stream, counted.
async fn drain<T>(mut s: tonic::Streaming<T>) -> Result<usize, tonic::Status> {
    let mut n = 0;
    while s.message().await?.is_some() {
        n += 1;
    }
    Ok(n)
}

/// Every `Cells`, `Tenant` and `Access` rpc, one at a time: a key lacking the one capability the
/// rpc needs is refused (PERMISSION_DENIED naming it) and changes nothing, a key with only that
/// capability is served, and another tenant's key at the same coordinates sees and changes
/// nothing of this tenant's cells, programs, edges, runs, audit trail or keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_rpc_needs_its_capability_and_sees_only_its_tenant() {
    use cube_api::v1::cells_client::CellsClient;
    use cube_api::v1::tenant_client::TenantClient;
    use cube_api::v1::{
        AuditRequest, DeleteRequest, LinkRequest, ProgRequest, RegionRequest, RunRequest,
        SealRequest, StatsRequest, UnlinkRequest, WalkRequest,
    };

    let server = TestServer::start(cubed()).unwrap();
    let demo = &server.demo;
    let mut admin = AccessClient::new(server.signed(demo).await.unwrap());
    let read_only = key_with_only(&server, Capability::Read).await;
    let write_only = key_with_only(&server, Capability::Write).await;
    let acme = server.create_tenant("acme").unwrap();

    let c = |x| crate::coord(x, x, x);
    let link = LinkRequest {
        from: c(1),
        to: c(2),
        label: "l".into(),
    };
    let unlink = UnlinkRequest {
        from: c(1),
        to: c(2),
        label: "l".into(),
    };
    let walk = WalkRequest {
        start: c(1),
        max_depth: 0,
        limit: 0,
        labels: vec![],
    };
    let region = RegionRequest {
        min: c(0),
        max: c(3),
        limit: 0,
        page_token: vec![],
    };
    let prog = |p: &[u8]| ProgRequest {
        coord: c(2),
        program: p.to_vec(),
    };
    let run = RunRequest {
        coord: c(2),
        input: vec![],
    };

    // demo's data: a cell, a program run once, an edge, a sealed cell.
    let mut owner = server.cells(demo).await.unwrap();
    owner.write(write(1, 1, 1, b"demo")).await.unwrap();
    owner.prog(prog(b"demo-prog")).await.unwrap();
    owner.run(run.clone()).await.unwrap();
    owner.link(link.clone()).await.unwrap();
    owner.write(write(3, 3, 3, b"sealed")).await.unwrap();
    owner.seal(SealRequest { coord: c(3) }).await.unwrap();

    // Each client of `creds`, on a signed connection.
    let clients = async |creds: &Credentials| {
        let ch = server.signed(creds).await.unwrap();
        (
            CellsClient::new(ch.clone()),
            TenantClient::new(ch.clone()),
            AccessClient::new(ch),
        )
    };
    let denied = |what: &str, cap: &str, r: Result<(), tonic::Status>| {
        let e = r.expect_err(what);
        assert_eq!(e.code(), Code::PermissionDenied, "{what}: {e:?}");
        assert!(
            e.message().contains(&format!("lacks the {cap} capability")),
            "{what}: {}",
            e.message()
        );
    };
    let audit = AuditRequest {
        from_seq: 0,
        limit: 1000,
    };
    let demo_audit_len = crate::audit::trail(&server, 0, 1000).await.len();

    // A READ-only key: every rpc that changes something is refused; the reads are served.
    let (mut cells, mut tenant, mut access) = clients(&read_only).await;
    denied(
        "Write",
        "Write",
        cells.write(write(1, 1, 1, b"x")).await.map(drop),
    );
    let delete = DeleteRequest {
        coord: c(1),
        expected_version: None,
    };
    denied("Delete", "Write", cells.delete(delete).await.map(drop));
    denied("Prog", "Write", cells.prog(prog(b"x")).await.map(drop));
    denied("Run", "Write", cells.run(run.clone()).await.map(drop));
    let other_link = LinkRequest {
        label: "m".into(),
        ..link.clone()
    };
    denied(
        "Link",
        "Write",
        cells.link(other_link.clone()).await.map(drop),
    );
    denied(
        "Unlink",
        "Write",
        cells.unlink(unlink.clone()).await.map(drop),
    );
    denied(
        "Seal",
        "Write",
        cells.seal(SealRequest { coord: c(1) }).await.map(drop),
    );
    for (what, r) in [
        (
            "Grant",
            access
                .grant(GrantRequest {
                    key_id: read_only.key_id.clone(),
                    capabilities: vec![Capability::Write as i32],
                })
                .await
                .map(drop),
        ),
        (
            "Revoke",
            access
                .revoke(RevokeRequest {
                    key_id: write_only.key_id.clone(),
                    capabilities: vec![Capability::Write as i32],
                })
                .await
                .map(drop),
        ),
    ] {
        denied(what, "Admin", r);
    }
    assert_eq!(
        cells.read(read(1, 1, 1)).await.unwrap().into_inner().value,
        b"demo"
    );
    let in_box = drain(cells.region(region.clone()).await.unwrap().into_inner());
    assert_eq!(in_box.await.unwrap(), 3);
    let visits = cells.walk(walk.clone()).await.unwrap().into_inner().visits;
    assert_eq!(visits.iter().map(|v| v.coord).collect::<Vec<_>>(), [c(2)]);
    let runs = tenant.stats(StatsRequest { coord: c(2) }).await.unwrap();
    assert_eq!(runs.into_inner().cell.unwrap().run_count, 1);
    let entries = drain(tenant.audit(audit).await.unwrap().into_inner()).await;
    assert!(entries.unwrap() >= demo_audit_len);

    // A WRITE-only key: every rpc that reads is refused; a write is served.
    let (mut cells, mut tenant, _) = clients(&write_only).await;
    denied("Read", "Read", cells.read(read(1, 1, 1)).await.map(drop));
    denied(
        "Region",
        "Read",
        cells.region(region.clone()).await.map(drop),
    );
    denied("Walk", "Read", cells.walk(walk.clone()).await.map(drop));
    denied(
        "Stats",
        "Read",
        tenant.stats(StatsRequest { coord: None }).await.map(drop),
    );
    denied("Audit", "Read", tenant.audit(audit).await.map(drop));
    cells.write(write(4, 4, 4, b"w")).await.unwrap();

    // Nothing the refused calls asked for happened.
    let mut check = server.cells(demo).await.unwrap();
    let cell = check.read(read(1, 1, 1)).await.unwrap().into_inner();
    assert_eq!((cell.value.as_slice(), cell.sealed), (&b"demo"[..], false));
    let ran = check.run(run.clone()).await.unwrap().into_inner();
    assert_eq!(
        (ran.program.as_slice(), ran.run_count),
        (&b"demo-prog"[..], 2)
    );
    let labels = WalkRequest {
        labels: vec!["m".into()],
        ..walk.clone()
    };
    assert!(
        check
            .walk(labels)
            .await
            .unwrap()
            .into_inner()
            .visits
            .is_empty()
    );
    cells.write(write(4, 4, 4, b"w2")).await.unwrap();
    let read_only_caps = admin
        .grant(GrantRequest {
            key_id: read_only.key_id.clone(),
            capabilities: vec![Capability::Read as i32],
        })
        .await
        .unwrap()
        .into_inner()
        .capabilities;
    assert_eq!(read_only_caps, [Capability::Read as i32]);

    // Another tenant, every rpc at demo's coordinates: it sees and changes only its own.
    let (mut cells, mut tenant, mut access) = clients(&acme).await;
    assert!(!cells.read(read(1, 1, 1)).await.unwrap().into_inner().found);
    let in_box = drain(cells.region(region.clone()).await.unwrap().into_inner());
    assert_eq!(in_box.await.unwrap(), 0);
    assert!(
        cells
            .walk(walk.clone())
            .await
            .unwrap()
            .into_inner()
            .visits
            .is_empty()
    );
    let e = cells.run(run.clone()).await.unwrap_err();
    assert!(
        matches!(e.code(), Code::NotFound | Code::FailedPrecondition),
        "{e:?}"
    );
    let e = cells.seal(SealRequest { coord: c(1) }).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    let d = cells.delete(delete).await.unwrap().into_inner();
    assert!(!d.existed);
    assert!(
        !cells
            .unlink(unlink.clone())
            .await
            .unwrap()
            .into_inner()
            .existed
    );
    let totals = tenant.stats(StatsRequest { coord: None }).await.unwrap();
    let totals = totals.into_inner().totals.unwrap();
    assert_eq!(
        (totals.cells, totals.edges, totals.programs, totals.runs),
        (0, 0, 0, 0)
    );
    let e = tenant
        .stats(StatsRequest { coord: c(2) })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    // Its own writes at the same coordinates are its own.
    cells.write(write(1, 1, 1, b"acme")).await.unwrap();
    cells.prog(prog(b"acme-prog")).await.unwrap();
    cells.link(other_link.clone()).await.unwrap();
    cells.write(write(3, 3, 3, b"acme-3")).await.unwrap();
    // demo's keys are not acme's to change.
    let e = access
        .grant(GrantRequest {
            key_id: read_only.key_id.clone(),
            capabilities: vec![Capability::Admin as i32],
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "Grant: {e:?}");
    let e = access
        .revoke(RevokeRequest {
            key_id: demo.key_id.clone(),
            capabilities: vec![Capability::Read as i32],
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "Revoke: {e:?}");
    let acme_trail = crate::audit::trail_of(&server, &acme, 0, 1000).await;
    assert!(acme_trail.iter().all(|e| !e.principal.starts_with("demo/")));

    // demo's data is as it was: acme's calls touched none of it.
    let cell = check.read(read(1, 1, 1)).await.unwrap().into_inner();
    assert_eq!(cell.value, b"demo");
    let ran = check.run(run.clone()).await.unwrap().into_inner();
    assert_eq!(
        (ran.program.as_slice(), ran.run_count),
        (&b"demo-prog"[..], 3)
    );
    let visits = check.walk(walk.clone()).await.unwrap().into_inner().visits;
    assert_eq!(visits.iter().map(|v| v.coord).collect::<Vec<_>>(), [c(2)]);
    let sealed = check.read(read(3, 3, 3)).await.unwrap().into_inner();
    assert_eq!(
        (sealed.value.as_slice(), sealed.sealed),
        (&b"sealed"[..], true)
    );
    let demo_trail = crate::audit::trail(&server, 0, 1000).await;
    assert!(demo_trail.iter().all(|e| !e.principal.starts_with("acme/")));
    let mut reader = server.cells(&read_only).await.unwrap();
    assert_eq!(
        reader.read(read(1, 1, 1)).await.unwrap().into_inner().value,
        b"demo"
    );
    let mut tenant = TenantClient::new(server.signed(demo).await.unwrap());
    let totals = tenant.stats(StatsRequest { coord: None }).await.unwrap();
    let totals = totals.into_inner().totals.unwrap();
    assert_eq!((totals.cells, totals.edges, totals.programs), (4, 1, 1));
}

/// The tenant's last ADMIN key cannot lose ADMIN: no call grants it back, so the tenant could
/// not change a key's capabilities again until the operator made it a new ADMIN key. Once another key holds ADMIN (granted and logged,
/// whether or not applied yet), the first may give it up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_admin_key_of_a_tenant_keeps_admin() {
    let server = TestServer::start(cubed()).unwrap();
    let second = new_key(&server, "demo");
    let mut admin = AccessClient::new(server.signed(&server.demo).await.unwrap());
    let revoke_admin = |key_id: &str| RevokeRequest {
        key_id: key_id.to_string(),
        capabilities: vec![Capability::Admin as i32],
    };
    let e = admin
        .revoke(revoke_admin(&server.demo.key_id))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("last ADMIN"), "{}", e.message());
    // Taking other capabilities from it is allowed, and it still holds ADMIN.
    let caps = admin
        .revoke(RevokeRequest {
            key_id: server.demo.key_id.clone(),
            capabilities: vec![Capability::Write as i32],
        })
        .await
        .unwrap()
        .into_inner()
        .capabilities;
    assert_eq!(
        caps,
        vec![Capability::Read as i32, Capability::Admin as i32]
    );
    admin
        .grant(GrantRequest {
            key_id: second.key_id.clone(),
            capabilities: vec![Capability::Admin as i32],
        })
        .await
        .unwrap();
    let caps = admin
        .revoke(revoke_admin(&server.demo.key_id))
        .await
        .unwrap()
        .into_inner()
        .capabilities;
    assert_eq!(caps, vec![Capability::Read as i32]);
    // Now the second key is the last one.
    let mut second_admin = AccessClient::new(server.signed(&second).await.unwrap());
    let e = second_admin
        .revoke(revoke_admin(&second.key_id))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
}

/// The operator may revoke a tenant's last ADMIN key (a leaked key must be revocable), is told
/// that the tenant has none left, and restores one with `cubed key create --admin`, with the
/// server running and stopped; the key's `key.create` entry names its capabilities.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_is_warned_of_a_tenant_left_without_admin_and_can_make_an_admin_key() {
    let mut server = TestServer::start(cubed()).unwrap();
    let second = new_key(&server, "demo");
    let revoke = |server: &TestServer, key_id: &str| {
        let out = server.cli(&["key", "revoke", "demo", key_id]).unwrap();
        assert!(out.status.success(), "{out:?}");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            "{\"revoked\":true}"
        );
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let warned = |stderr: &str| {
        stderr.contains("tenant 'demo' has no active key with ADMIN")
            && stderr.contains("`cubed key create demo --admin`")
    };
    let admin_key = |server: &TestServer| new_key_with(server, "demo", &["--admin"]);
    let grant_admin = |key_id: &str| GrantRequest {
        key_id: key_id.to_string(),
        capabilities: vec![Capability::Admin as i32],
    };

    // Online: the first key was the tenant's only ADMIN key. A repeated revocation (its first
    // answer lost, say) warns again.
    let stderr = revoke(&server, &server.demo.key_id);
    assert!(warned(&stderr), "{stderr}");
    let again = server
        .cli(&["key", "revoke", "demo", &server.demo.key_id])
        .unwrap();
    assert!(
        String::from_utf8_lossy(&again.stdout).contains("\"revoked\":false"),
        "{again:?}"
    );
    assert!(warned(&String::from_utf8_lossy(&again.stderr)), "{again:?}");
    let mut without = AccessClient::new(server.signed(&second).await.unwrap());
    let e = without
        .grant(grant_admin(&second.key_id))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    let restored = admin_key(&server);
    let mut admin = AccessClient::new(server.signed(&restored).await.unwrap());
    admin.grant(grant_admin(&second.key_id)).await.unwrap();
    // Another ADMIN key is left: no warning.
    let stderr = revoke(&server, &restored.key_id);
    assert!(!warned(&stderr), "{stderr}");

    // Offline, the same.
    assert!(
        tokio::task::block_in_place(|| server.sigterm())
            .unwrap()
            .success()
    );
    let stderr = tokio::task::block_in_place(|| revoke(&server, &second.key_id));
    assert!(warned(&stderr), "{stderr}");
    let offline = tokio::task::block_in_place(|| admin_key(&server));
    tokio::task::block_in_place(|| server.restart()).unwrap();
    let third = new_key(&server, "demo");
    let mut admin = AccessClient::new(server.signed(&offline).await.unwrap());
    admin.grant(grant_admin(&third.key_id)).await.unwrap();

    let entries = crate::audit::trail_of(&server, &offline, 0, 0).await;
    let created: Vec<&str> = entries
        .iter()
        .filter(|e| e.op == "key.create")
        .map(|e| e.detail.as_str())
        .collect();
    let with_admin =
        |k: &Credentials| format!("key={} capabilities=[Read, Write, Admin]", k.key_id);
    assert_eq!(
        created,
        vec![
            format!("key={}", second.key_id),
            with_admin(&restored),
            with_admin(&offline),
            format!("key={}", third.key_id),
        ]
    );
}
