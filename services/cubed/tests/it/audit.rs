//! The audit trail: every change and security event, hash-chained, paged, verifiable; a
//! tampered entry is detected.

use std::time::Duration;

use cube_api::v1::access_client::AccessClient;
use cube_api::v1::tenant_client::TenantClient;
use cube_api::v1::{AuditEntry, AuditRequest, Capability, DeleteRequest, RevokeRequest};
use cube_auth::client::verify_audit_entries;
use cube_auth::{Credentials, Secret};
use cube_testkit::TestServer;

use crate::{coord, cubed, read, write};

pub(crate) async fn trail(server: &TestServer, from: u64, limit: u32) -> Vec<AuditEntry> {
    trail_of(server, &server.demo, from, limit).await
}

pub(crate) async fn trail_of(
    server: &TestServer,
    creds: &Credentials,
    from: u64,
    limit: u32,
) -> Vec<AuditEntry> {
    let mut t = TenantClient::new(server.signed(creds).await.unwrap());
    let mut s = t
        .audit(AuditRequest {
            from_seq: from,
            limit,
        })
        .await
        .unwrap()
        .into_inner();
    let mut out = Vec::new();
    while let Some(e) = s.message().await.unwrap() {
        out.push(e);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_and_security_events_form_a_verifiable_chain() {
    let server = TestServer::start(cubed()).unwrap();
    let mut c = server.cells(&server.demo).await.unwrap();
    for x in 0..3 {
        c.write(write(x, 0, 0, b"v")).await.unwrap();
    }
    c.delete(DeleteRequest {
        coord: coord(1, 0, 0),
        expected_version: None,
    })
    .await
    .unwrap();
    let out = server.cli(&["key", "create", "demo"]).unwrap();
    let second: Credentials = serde_json::from_slice(&out.stdout).unwrap();
    let mut access = AccessClient::new(server.signed(&server.demo).await.unwrap());
    access
        .revoke(RevokeRequest {
            key_id: second.key_id.clone(),
            capabilities: vec![Capability::Write as i32],
        })
        .await
        .unwrap();
    // A failed authentication naming tenant demo is recorded too (asynchronously).
    let bad = Credentials {
        secret: Secret::generate().to_hex(),
        ..server.demo.clone()
    };
    let mut bad_client = server.cells(&bad).await.unwrap();
    assert!(bad_client.read(read(0, 0, 0)).await.is_err());

    let mut entries = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while std::time::Instant::now() < deadline {
        entries = trail(&server, 0, 0).await;
        if entries.iter().any(|e| e.op == "auth.failed") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let ops: Vec<&str> = entries.iter().map(|e| e.op.as_str()).collect();
    assert_eq!(
        ops,
        vec![
            "tenant.create",
            "write",
            "write",
            "write",
            "delete",
            "key.create",
            "revoke",
            "auth.failed"
        ]
    );
    let demo = format!("demo/{}", server.demo.key_id);
    assert_eq!(entries[0].principal, "operator");
    assert_eq!(entries[1].principal, demo);
    assert_eq!(entries[5].principal, "operator");
    assert!(entries[6].detail.contains(&second.key_id));
    assert!(
        entries[7].detail.contains("model=call"),
        "{}",
        entries[7].detail
    );
    assert_eq!(verify_audit_entries(&entries), Ok(8));
    // Stats names the trail's head, so a reader can tell that it got the newest entries.
    let totals = crate::totals(&server).await;
    assert_eq!(totals.audit_last_seq, 8);
    assert_eq!(totals.audit_last_hash, entries[7].hash);
    // Paging continues exactly where a page stopped.
    let page = trail(&server, 3, 2).await;
    assert_eq!(page.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![3, 4]);
}

/// Failed authentications naming a tenant fill its trail with a burst of at most 10 entries,
/// then one per 6 s; the next entry recorded says how many were dropped, so every failure is
/// accounted for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_authentication_entries_are_limited_per_tenant() {
    let server = TestServer::start(cubed()).unwrap();
    let bad = Credentials {
        secret: Secret::generate().to_hex(),
        ..server.demo.clone()
    };
    let mut bad_client = server.cells(&bad).await.unwrap();
    // All at once, so that the burst takes well under the 6 s the checks below count on,
    // however slow the machine.
    let burst = futures::future::join_all((0..30).map(|_| {
        let mut c = bad_client.clone();
        async move { c.read(read(0, 0, 0)).await }
    }))
    .await;
    assert!(burst.iter().all(Result::is_err));
    // A second later the bucket is still empty: this one is dropped too...
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert!(bad_client.read(read(0, 0, 0)).await.is_err());
    // ...and 6 s on, one is recorded again, with the count of the dropped ones.
    tokio::time::sleep(Duration::from_millis(6100)).await;
    assert!(bad_client.read(read(0, 0, 0)).await.is_err());
    // Entries are appended in the background.
    let (mut recorded, mut accounted) = (0, 0);
    for _ in 0..250 {
        let entries = trail(&server, 0, 0).await;
        let failed: Vec<&AuditEntry> = entries.iter().filter(|e| e.op == "auth.failed").collect();
        let dropped: usize = failed
            .iter()
            .filter_map(|e| e.detail.split(' ').find_map(|f| f.strip_prefix("dropped=")))
            .map(|n| n.parse::<usize>().unwrap())
            .sum();
        (recorded, accounted) = (failed.len(), failed.len() + dropped);
        if accounted == 32 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(accounted, 32, "{recorded} recorded");
    // The burst of 10, then one 7 s later.
    assert_eq!(recorded, 11);
}

/// Recording a failed authentication for a tenant that is not open opens it: failures naming ten
/// idle tenants open at most 2 of them a second (4 if the burst spans a second boundary); the
/// others' failures are counted as dropped, for the next entry of each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_authentications_naming_idle_tenants_open_few_of_them() {
    let mut server = TestServer::start(cubed()).unwrap();
    let tenants: Vec<Credentials> = (0..10)
        .map(|i| server.create_tenant(&format!("idle{i}")).unwrap())
        .collect();
    // A graceful stop closes every tenant; none is open after the restart.
    assert!(
        tokio::task::block_in_place(|| server.sigterm())
            .unwrap()
            .success()
    );
    tokio::task::block_in_place(|| server.restart()).unwrap();
    let before = server.metric("cube_tenants_active").unwrap_or(0.0);
    let mut clients = Vec::new();
    for creds in &tenants {
        let bad = Credentials {
            secret: Secret::generate().to_hex(),
            ..creds.clone()
        };
        clients.push(server.cells(&bad).await.unwrap());
    }
    // The failures all at once: the seconds they span bound how many tenants may open.
    let start = std::time::Instant::now();
    let failed = futures::future::join_all(
        clients
            .iter_mut()
            .map(|c| async move { c.read(read(0, 0, 0)).await }),
    )
    .await;
    let spanned = start.elapsed();
    assert!(failed.iter().all(Result::is_err));
    // 2 a second, in each second the failures touched (two if they took under one).
    let most = 2.0 * (spanned.as_secs() as f64 + 2.0);
    assert!(
        most < tenants.len() as f64,
        "the failures took {spanned:?}: too long to judge the limit"
    );
    // Counted once the burst's opens are over: at least one, and no change for a second (a
    // loaded machine may take a while to open them).
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let (mut seen, mut since) = (None, std::time::Instant::now());
    let opened = loop {
        let now = server.metric("cube_tenants_active").map(|v| v - before);
        if now != seen {
            (seen, since) = (now, std::time::Instant::now());
        } else if let Some(n) = now
            && n >= 1.0
            && since.elapsed() >= Duration::from_secs(1)
        {
            break n;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no settled count of opened tenants ({seen:?} beyond {before})"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        opened <= most,
        "{opened} tenants opened, at most {most} allowed for failures over {spanned:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tampered_entry_is_named_by_verification() {
    // No checkpoint deletes the first WAL segment while the test runs.
    let mut server = TestServer::start_with(cubed(), &["--checkpoint-secs", "3600"]).unwrap();
    let mut c = server.cells(&server.demo).await.unwrap();
    for x in 0..4 {
        c.write(write(x, 0, 0, b"v")).await.unwrap();
    }
    let before = trail(&server, 0, 0).await;
    // demo's creation, then the four writes.
    assert_eq!(verify_audit_entries(&before), Ok(5));
    let victim = before
        .iter()
        .find(|e| e.detail.starts_with("coord=(2, 0, 0)"))
        .unwrap()
        .seq;
    // kill -9: a clean stop would checkpoint the whole log into the state store and remove it.
    tokio::task::block_in_place(|| server.kill9()).unwrap();

    // Someone with disk access edits the entry, even fixes the record's CRC, and removes the
    // tenant's state store, so the server rebuilds it from the edited log.
    server
        .tamper_wal("demo", b"coord=(2, 0, 0)", b"coord=(7, 0, 0)")
        .unwrap();
    tokio::task::block_in_place(|| server.restart()).unwrap();

    let after = trail(&server, 0, 0).await;
    assert!(
        after
            .iter()
            .any(|e| e.detail.starts_with("coord=(7, 0, 0)"))
    );
    let (seq, why) = verify_audit_entries(&after).unwrap_err();
    assert_eq!(seq, victim);
    assert!(why.contains("altered"), "{why}");
}

/// A key creation or revocation is one record of the tenant's log with its `key.create` /
/// `key.revoke` entry, whether the server makes it (admin socket) or the CLI does with the server
/// stopped; revoking a revoked key records nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_creations_and_revocations_are_in_the_trail_online_and_offline() {
    let mut server = TestServer::start(cubed()).unwrap();
    let new_key = |server: &TestServer| -> Credentials {
        let out = server.cli(&["key", "create", "demo"]).unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let revoke = |server: &TestServer, key: &str| {
        let out = server.cli(&["key", "revoke", "demo", key]).unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let online = new_key(&server);
    let offline = new_key(&server);
    revoke(&server, &online.key_id);
    revoke(&server, &online.key_id);
    tokio::task::block_in_place(|| server.sigterm()).unwrap();
    let stopped = tokio::task::block_in_place(|| revoke(&server, &offline.key_id));
    assert!(stopped.contains("true"), "{stopped}");
    let created_offline = tokio::task::block_in_place(|| new_key(&server));
    tokio::task::block_in_place(|| server.restart()).unwrap();

    for key in [&online, &offline] {
        let mut c = server.cells(key).await.unwrap();
        let err = c.read(read(0, 0, 0)).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unauthenticated, "{err:?}");
    }
    let mut c = server.cells(&created_offline).await.unwrap();
    c.write(write(5, 5, 5, b"v")).await.unwrap();

    let entries = trail(&server, 0, 0).await;
    let keys: Vec<(&str, &str, &str)> = entries
        .iter()
        .filter(|e| e.op.starts_with("key."))
        .map(|e| (e.op.as_str(), e.principal.as_str(), e.detail.as_str()))
        .collect();
    let detail = |k: &Credentials| format!("key={}", k.key_id);
    let (a, b, n) = (detail(&online), detail(&offline), detail(&created_offline));
    assert_eq!(
        keys,
        vec![
            ("key.create", "operator", a.as_str()),
            ("key.create", "operator", b.as_str()),
            ("key.revoke", "operator", a.as_str()),
            ("key.revoke", "operator", b.as_str()),
            ("key.create", "operator", n.as_str()),
        ]
    );
    assert_eq!(verify_audit_entries(&entries), Ok(entries.len()));
}

/// A client certificate (`cubed key cert`) is recorded in its tenant's trail before its files
/// are written, online and offline: a `key.cert` entry naming the key, the certificate's SHA-256
/// (of its DER encoding, as printed) and its notAfter. A refused `--out` records nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificates_are_in_the_trail_online_and_offline() {
    use sha2::Digest as _;
    let mut server = TestServer::start(cubed()).unwrap();
    let out = tempfile::tempdir().unwrap();
    let key_id = server.demo.key_id.clone();
    // The printed fingerprint, and the notAfter, of the certificate written.
    let cert = |server: &TestServer, days: &str| -> (String, i64) {
        let dir = out.path().join(days);
        let o = server
            .cli(&[
                "key",
                "cert",
                "demo",
                &key_id,
                "--days",
                days,
                "--out",
                dir.to_str().unwrap(),
            ])
            .unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{stderr}");
        assert!(!stderr.contains("unrecorded"), "{stderr}");
        let printed: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(printed["recorded"], true, "{printed}");
        let pem = std::fs::read(printed["cert"].as_str().unwrap()).unwrap();
        let (_, pem) = x509_parser::pem::parse_x509_pem(&pem).unwrap();
        let sha256 = hex::encode(sha2::Sha256::digest(&pem.contents));
        assert_eq!(printed["sha256"], sha256.as_str(), "{printed}");
        let not_after = pem.parse_x509().unwrap().validity().not_after.timestamp();
        (sha256, not_after)
    };
    let online = cert(&server, "30");
    // `--out` naming a file: refused before anything is recorded.
    let file = server.data_dir().join("dev-credentials.json");
    let o = server
        .cli(&[
            "key",
            "cert",
            "demo",
            &key_id,
            "--out",
            file.to_str().unwrap(),
        ])
        .unwrap();
    assert!(!o.status.success());
    tokio::task::block_in_place(|| server.sigterm()).unwrap();
    let offline = tokio::task::block_in_place(|| cert(&server, "1"));
    tokio::task::block_in_place(|| server.restart()).unwrap();

    let entries = trail(&server, 0, 0).await;
    let certs: Vec<(&str, &str)> = entries
        .iter()
        .filter(|e| e.op == "key.cert")
        .map(|e| (e.principal.as_str(), e.detail.as_str()))
        .collect();
    let detail = |(sha256, not_after): &(String, i64)| {
        format!(
            "key={key_id} sha256={sha256} not_after_ms={}",
            not_after * 1000
        )
    };
    let (a, b) = (detail(&online), detail(&offline));
    assert_eq!(certs, [("operator", a.as_str()), ("operator", b.as_str())]);
    assert_eq!(verify_audit_entries(&entries), Ok(entries.len()));
}

/// A tenant's trail starts with its creation, as the first record of its log, however it was
/// created: at the first start (demo), through the admin socket, with the server stopped, or by
/// a catalog change whose server died before it opened the tenant (its first open writes it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_tenants_trail_starts_with_its_creation() {
    let mut server = TestServer::start(cubed()).unwrap();
    let online = server.create_tenant("online").unwrap();
    tokio::task::block_in_place(|| server.sigterm()).unwrap();
    let offline = tokio::task::block_in_place(|| server.create_tenant("offline")).unwrap();
    // What a crash right after the catalog made the tenant leaves: the tenant, no log.
    let unopened = {
        let catalog = cube_store::Catalog::open(&server.data_dir().join("catalog")).unwrap();
        let key = catalog.create_tenant("unopened").unwrap();
        Credentials {
            tenant: key.tenant.clone(),
            key_id: key.key_id.clone(),
            secret: Secret::from_bytes(key.secret).to_hex(),
            endpoint: None,
        }
    };
    tokio::task::block_in_place(|| server.restart()).unwrap();
    for creds in [&server.demo.clone(), &online, &offline, &unopened] {
        let mut c = server.cells(creds).await.unwrap();
        c.write(write(1, 2, 3, b"v")).await.unwrap();
        let entries = trail_of(&server, creds, 0, 0).await;
        let principal = format!("{}/{}", creds.tenant, creds.key_id);
        let ops: Vec<(u64, &str, &str)> = entries
            .iter()
            .map(|e| (e.seq, e.op.as_str(), e.principal.as_str()))
            .collect();
        assert_eq!(
            ops[..2],
            [
                (1, "tenant.create", "operator"),
                (2, "write", principal.as_str())
            ],
            "{}: {ops:?}",
            creds.tenant
        );
        assert_eq!(entries[0].detail, format!("key={}", creds.key_id));
        assert_eq!(
            entries.iter().filter(|e| e.op == "tenant.create").count(),
            1,
            "{}",
            creds.tenant
        );
        assert_eq!(verify_audit_entries(&entries), Ok(entries.len()));
    }
}

/// A durability change is one record of the tenant's log with its `durability` entry, whether
/// the server makes it (admin socket) or the CLI does with the server stopped; the policy is in
/// force from the tenant's next open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durability_changes_are_in_the_trail_online_and_offline() {
    let mut server = TestServer::start(cubed()).unwrap();
    let set = |server: &TestServer, args: &[&str]| {
        let out = crate::set_demo_durability(server, args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let relaxed = ["relaxed", "--max-delay-ms", "5", "--max-records", "100"];
    set(&server, &relaxed);
    assert_eq!(
        crate::totals(&server).await.durability,
        "relaxed(max_delay_ms=5, max_records=100)"
    );
    tokio::task::block_in_place(|| server.sigterm()).unwrap();
    tokio::task::block_in_place(|| set(&server, &["sync"]));
    tokio::task::block_in_place(|| server.restart()).unwrap();
    assert_eq!(crate::totals(&server).await.durability, "sync");

    let entries = trail(&server, 0, 0).await;
    let changes: Vec<(&str, &str)> = entries
        .iter()
        .filter(|e| e.op == "durability")
        .map(|e| (e.principal.as_str(), e.detail.as_str()))
        .collect();
    assert_eq!(
        changes,
        vec![
            (
                "operator",
                "policy=relaxed(max_delay_ms=5, max_records=100)"
            ),
            ("operator", "policy=sync"),
        ]
    );
    assert_eq!(verify_audit_entries(&entries), Ok(entries.len()));
}
