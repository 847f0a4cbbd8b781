//! The full data model over gRPC: Region paging, Prog/Run with telemetry, Link/Walk, Seal,
//! Stats, every cap's status, and tenant passivation.

use cube_api::v1::tenant_client::TenantClient;
use cube_api::v1::{
    DeleteRequest, LinkRequest, ProgRequest, RegionRequest, RunRequest, SealRequest, StatsRequest,
    UnlinkRequest, WalkRequest,
};
use cube_testkit::TestServer;
use sha2::{Digest, Sha256};
use tonic::Code;

use crate::{coord, cubed, read, write};

fn region(min: (i32, i32, i32), max: (i32, i32, i32), limit: u32, token: Vec<u8>) -> RegionRequest {
    RegionRequest {
        min: coord(min.0, min.1, min.2),
        max: coord(max.0, max.1, max.2),
        limit,
        page_token: token,
    }
}

/// The Z-order (Morton) key of a point, bit by bit: each coordinate made unsigned with its
/// order kept (the sign bit flipped), then x, y and z interleaved from the top bit down.
fn morton(x: i32, y: i32, z: i32) -> u128 {
    let unsigned = |v: i32| (v as u32) ^ 0x8000_0000;
    let (x, y, z) = (unsigned(x), unsigned(y), unsigned(z));
    (0..32).fold(0u128, |m, i| {
        m | u128::from((x >> i) & 1) << (3 * i + 2)
            | u128::from((y >> i) & 1) << (3 * i + 1)
            | u128::from((z >> i) & 1) << (3 * i)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn region_pages_through_a_box_in_morton_order_with_the_header_token() {
    let server = TestServer::start(cubed()).unwrap();
    let mut c = server.cells(&server.demo).await.unwrap();
    // A 4x4x4 block around the origin (negative coordinates included) plus cells outside it.
    let mut inside = Vec::new();
    for x in -2..2 {
        for y in -2..2 {
            for z in -2..2 {
                c.write(write(x, y, z, &[x as u8, y as u8, z as u8]))
                    .await
                    .unwrap();
                if x >= -1 && y >= -2 && z <= 0 {
                    inside.push((x, y, z));
                }
            }
        }
    }
    c.write(write(i32::MAX, 0, 0, b"far")).await.unwrap();
    c.write(write(i32::MIN, i32::MIN, i32::MIN, b"corner"))
        .await
        .unwrap();
    let mut got = Vec::new();
    let mut token = Vec::new();
    let mut pages = 0;
    loop {
        let resp = c
            .region(region((-1, -2, i32::MIN), (1, 1, 0), 5, token))
            .await
            .unwrap();
        let next = resp
            .metadata()
            .get_bin(cube_gateway::NEXT_PAGE_TOKEN_HEADER)
            .map(|v| v.to_bytes().unwrap().to_vec());
        let mut stream = resp.into_inner();
        let mut n = 0;
        while let Some(cell) = stream.message().await.unwrap() {
            let p = cell.coord.unwrap();
            assert_eq!(cell.value, vec![p.x as u8, p.y as u8, p.z as u8]);
            got.push((p.x, p.y, p.z));
            n += 1;
        }
        assert!(n <= 5);
        pages += 1;
        match next {
            Some(t) => token = t,
            None => break,
        }
    }
    assert_eq!(got.len(), inside.len(), "pages: {pages}");
    let mut sorted = got.clone();
    sorted.sort();
    inside.sort();
    assert_eq!(sorted, inside);
    // Morton order, across pages: strictly increasing interleaved keys (so no cell twice).
    assert!(
        got.windows(2)
            .all(|w| morton(w[0].0, w[0].1, w[0].2) < morton(w[1].0, w[1].1, w[1].2)),
        "{got:?}"
    );
    assert!(pages >= 4);

    // A box of 2^40 empty points answers at once, with nothing.
    let resp = c
        .region(region(
            (1 << 20, 1 << 20, 0),
            ((1 << 20) + (1 << 13), (1 << 20) + (1 << 13), 1 << 14),
            0,
            vec![],
        ))
        .await
        .unwrap();
    assert!(
        resp.metadata()
            .get_bin(cube_gateway::NEXT_PAGE_TOKEN_HEADER)
            .is_none()
    );
    assert!(resp.into_inner().message().await.unwrap().is_none());

    let err = c
        .region(region((0, 0, 0), (1, 1, 1), 0, b"not a token".to_vec()))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("page_token"), "{}", err.message());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prog_run_seal_link_walk_and_stats() {
    let server = TestServer::start(cubed()).unwrap();
    let mut c = server.cells(&server.demo).await.unwrap();
    let mut t = TenantClient::new(server.signed(&server.demo).await.unwrap());

    // Run needs a program.
    c.write(write(1, 1, 1, b"plain")).await.unwrap();
    let err = c
        .run(RunRequest {
            coord: coord(1, 1, 1),
            input: vec![],
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(err.message().contains("no program"), "{}", err.message());

    let p = c
        .prog(ProgRequest {
            coord: coord(2, 2, 2),
            program: b"print(1)".to_vec(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(p.version, 1);
    for i in 1..=3u64 {
        let r = c
            .run(RunRequest {
                coord: coord(2, 2, 2),
                input: vec![i as u8],
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!((r.program.as_slice(), r.run_count), (&b"print(1)"[..], i));
    }
    let stats = t
        .stats(StatsRequest {
            coord: coord(2, 2, 2),
        })
        .await
        .unwrap()
        .into_inner()
        .cell
        .unwrap();
    assert_eq!(stats.run_count, 3);
    assert_eq!(stats.recent.len(), 3);
    assert_eq!(stats.recent[0].input_digest, Sha256::digest([3u8]).to_vec());
    assert_eq!(
        stats.recent[0].principal,
        format!("demo/{}", server.demo.key_id)
    );

    // Seal: digest of the value, then the cell refuses changes.
    let s = c
        .seal(SealRequest {
            coord: coord(1, 1, 1),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(s.digest, Sha256::digest(b"plain").to_vec());
    assert_eq!(s.version, 1);
    let err = c.write(write(1, 1, 1, b"x")).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    let err = c
        .delete(DeleteRequest {
            coord: coord(1, 1, 1),
            expected_version: None,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    let err = c
        .prog(ProgRequest {
            coord: coord(1, 1, 1),
            program: vec![],
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(c.read(read(1, 1, 1)).await.unwrap().into_inner().sealed);
    let err = c
        .seal(SealRequest {
            coord: coord(9, 9, 9),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);

    // A graph with a cycle: 0 -a-> 1 -a-> 2 -a-> 0, 1 -b-> 3.
    let link = |f: i32, t: i32, l: &str| LinkRequest {
        from: coord(f, 0, 0),
        to: coord(t, 0, 0),
        label: l.into(),
    };
    for (f, to, l) in [(0, 1, "a"), (1, 2, "a"), (2, 0, "a"), (1, 3, "b")] {
        assert!(c.link(link(f, to, l)).await.unwrap().into_inner().created);
    }
    assert!(!c.link(link(0, 1, "a")).await.unwrap().into_inner().created);
    let walk = |labels: Vec<String>, max_depth: u32, limit: u32| WalkRequest {
        start: coord(0, 0, 0),
        max_depth,
        limit,
        labels,
    };
    let w = c.walk(walk(vec![], 0, 0)).await.unwrap().into_inner();
    let visits: Vec<(i32, u32)> = w
        .visits
        .iter()
        .map(|v| (v.coord.unwrap().x, v.depth))
        .collect();
    assert_eq!(visits, vec![(1, 1), (2, 2), (3, 2)]);
    assert!(!w.truncated);
    let w = c
        .walk(walk(vec!["a".into()], 0, 0))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(w.visits.len(), 2);
    let w = c.walk(walk(vec![], 1, 0)).await.unwrap().into_inner();
    assert_eq!(w.visits.len(), 1);
    let w = c.walk(walk(vec![], 0, 2)).await.unwrap().into_inner();
    assert_eq!((w.visits.len(), w.truncated), (2, true));
    let unlink = UnlinkRequest {
        from: coord(1, 0, 0),
        to: coord(3, 0, 0),
        label: "b".into(),
    };
    assert!(c.unlink(unlink.clone()).await.unwrap().into_inner().existed);
    assert!(!c.unlink(unlink).await.unwrap().into_inner().existed);

    // Caps and limits: each breach has its status.
    for (req, what) in [
        (walk(vec![], 17, 0), "max_depth"),
        (walk(vec![], 0, 10_001), "limit"),
        (walk(vec!["x".repeat(65)], 0, 0), "labels"),
        (
            walk((0..17).map(|i| format!("l{i}")).collect(), 0, 0),
            "17 labels",
        ),
    ] {
        let err = c.walk(req).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{what}");
    }
    let err = c.link(link(0, 1, "")).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);

    let totals = crate::totals(&server).await;
    assert_eq!(
        (
            totals.cells,
            totals.edges,
            totals.sealed,
            totals.programs,
            totals.runs
        ),
        (2, 3, 1, 1, 3)
    );
    assert_eq!(totals.durability, "sync");
    // The tenant's creation entry, then write, prog, 3 runs, seal, 4 links, 1 unlink: 12 records.
    assert!(totals.last_seq == 12 && totals.wal_bytes > 0, "{totals:?}");
}

/// `--max-open-tenants` holds the open tenants to its cap by closing the least recently used
/// (no idleness involved: `--idle-secs` is an hour here), and an evicted tenant is woken by its
/// next call with its data; `--idle-secs` closes tenants left idle, as the next test checks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evicted_tenants_are_passivated_and_woken_with_their_data() {
    let server =
        TestServer::start_with(cubed(), &["--idle-secs", "3600", "--max-open-tenants", "2"])
            .unwrap();
    let mut tenants = vec![server.demo.clone()];
    for name in ["t1", "t2", "t3"] {
        tenants.push(server.create_tenant(name).unwrap());
    }
    let before = server
        .metric("cube_tenants_passivated_total")
        .unwrap_or(0.0);
    let mut seqs = Vec::new();
    for (i, creds) in tenants.iter().enumerate() {
        let mut c = server.cells(creds).await.unwrap();
        let w = c
            .write(write(i as i32, 0, 0, creds.tenant.as_bytes()))
            .await
            .unwrap();
        seqs.push(w.into_inner().seq);
    }
    // Four tenants written through a cap of two: at least two were evicted.
    let within = std::time::Duration::from_secs(15);
    let active = server
        .metric_when("cube_tenants_active", within, |v| v <= 2.0)
        .await;
    assert!(matches!(active, Ok(v) if v <= 2.0), "{active:?}");
    let passivated = server.metric("cube_tenants_passivated_total").unwrap() - before;
    assert!(passivated >= 2.0, "{passivated} passivations");
    // Woken by their next call, data intact.
    for (i, creds) in tenants.iter().enumerate() {
        let mut c = server.cells(creds).await.unwrap();
        let r = c.read(read(i as i32, 0, 0)).await.unwrap().into_inner();
        assert_eq!(r.value, creds.tenant.as_bytes());
        let w = c
            .write(write(i as i32, 1, 0, b"again"))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(w.seq, seqs[i] + 1, "tenant {}", creds.tenant);
    }
    assert!(server.metric("cube_tenants_active").unwrap() <= 2.0);
}

/// A tenant left idle for `--idle-secs` is closed (found by a janitor that looks every 250 ms)
/// and woken by its next call with its data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_tenants_are_passivated_and_woken_with_their_data() {
    let server = TestServer::start_with(cubed(), &["--idle-secs", "1"]).unwrap();
    let mut c = server.cells(&server.demo).await.unwrap();
    let w = c.write(write(0, 0, 0, b"kept")).await.unwrap().into_inner();
    let within = std::time::Duration::from_secs(15);
    let active = server
        .metric_when("cube_tenants_active", within, |v| v == 0.0)
        .await;
    assert_eq!(active, Ok(0.0));
    assert!(server.metric("cube_tenants_passivated_total").unwrap() >= 1.0);
    let r = c.read(read(0, 0, 0)).await.unwrap().into_inner();
    assert_eq!(r.value, b"kept");
    let again = c
        .write(write(0, 1, 0, b"again"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.seq, w.seq + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relaxed_durability_is_set_online_and_shown_in_stats() {
    let server = TestServer::start(cubed()).unwrap();
    let out = crate::set_demo_durability(
        &server,
        &["relaxed", "--max-delay-ms", "5", "--max-records", "100"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("relaxed(max_delay_ms=5, max_records=100)")
    );
    let mut c = server.cells(&server.demo).await.unwrap();
    for i in 0..50 {
        c.write(write(i, 0, 0, b"r")).await.unwrap();
        // Read-your-writes holds under the relaxed policy too.
        assert!(c.read(read(i, 0, 0)).await.unwrap().into_inner().found);
    }
    let totals = crate::totals(&server).await;
    assert_eq!(
        totals.durability,
        "relaxed(max_delay_ms=5, max_records=100)"
    );
    let out = crate::set_demo_durability(&server, &["relaxed", "--max-delay-ms", "0"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("max_delay"));
}

/// A cell change is answered by the WAL's syncer as soon as it is durable, while the tenant's
/// actor applies it (docs/architecture.md, "How a write flows"). With every apply held back
/// 300 ms (a test-only failpoint), each kind of read issued right after an answer must still see
/// the change: Read, Region, Walk, Stats (totals and a cell's runs) and Audit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_read_sees_a_change_answered_before_its_apply() {
    use cube_api::v1::AuditRequest;
    let env = [("CUBE_FAILPOINT_APPLY_DELAY_MS", "300")];
    let server = TestServer::start_with_env(cubed(), &[], &env).unwrap();
    let mut c = server.cells(&server.demo).await.unwrap();
    let mut t = TenantClient::new(server.signed(&server.demo).await.unwrap());
    let totals = |s: cube_api::v1::StatsResponse| s.totals.unwrap().cells;

    let w = c.write(write(5, 5, 5, b"one")).await.unwrap().into_inner();
    let got = c.read(read(5, 5, 5)).await.unwrap().into_inner();
    assert_eq!(
        (got.found, got.value.as_slice(), got.version),
        (true, &b"one"[..], w.version)
    );

    c.write(write(6, 5, 5, b"two")).await.unwrap();
    let cells =
        cube_testkit::region_all(&mut c, coord(5, 5, 5).unwrap(), coord(6, 5, 5).unwrap(), 10)
            .await
            .unwrap();
    let values: Vec<&[u8]> = cells.iter().map(|c| c.value.as_slice()).collect();
    assert_eq!(values, vec![&b"one"[..], &b"two"[..]]);

    let link = LinkRequest {
        from: coord(5, 5, 5),
        to: coord(6, 5, 5),
        label: "next".into(),
    };
    assert!(c.link(link).await.unwrap().into_inner().created);
    let walk = WalkRequest {
        start: coord(5, 5, 5),
        max_depth: 1,
        limit: 0,
        labels: vec![],
    };
    let visits = c.walk(walk).await.unwrap().into_inner().visits;
    assert_eq!(visits.len(), 1, "{visits:?}");

    c.write(write(7, 5, 5, b"three")).await.unwrap();
    let stats = t.stats(StatsRequest { coord: None }).await.unwrap();
    assert_eq!(totals(stats.into_inner()), 3);

    let program = ProgRequest {
        coord: coord(8, 5, 5),
        program: b"p".to_vec(),
    };
    c.prog(program).await.unwrap();
    let run = RunRequest {
        coord: coord(8, 5, 5),
        input: vec![1],
    };
    assert_eq!(c.run(run).await.unwrap().into_inner().run_count, 1);
    let cell_stats = t
        .stats(StatsRequest {
            coord: coord(8, 5, 5),
        })
        .await
        .unwrap()
        .into_inner()
        .cell
        .unwrap();
    assert_eq!(cell_stats.run_count, 1);

    c.write(write(9, 5, 5, b"four")).await.unwrap();
    let mut trail = t
        .audit(AuditRequest {
            from_seq: 0,
            limit: 1000,
        })
        .await
        .unwrap()
        .into_inner();
    let mut newest = None;
    while let Some(entry) = trail.message().await.unwrap() {
        newest = Some(entry);
    }
    let newest = newest.expect("a trail");
    assert_eq!(newest.op, "write");
    assert!(newest.detail.ends_with("bytes=4"), "{}", newest.detail);
}
