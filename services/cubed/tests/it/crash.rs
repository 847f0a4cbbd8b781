//! Crash and shutdown: every acknowledged write survives kill -9 and SIGTERM, byte for byte; a
//! corrupt tenant refuses to open while other tenants keep serving, and its operator can still
//! revoke its keys and set its durability.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use cube_testkit::TestServer;
use rand::Rng;

use crate::{cubed, read, signal_term, watch_health, write};

const WRITERS: usize = 32;

/// Deterministic, incompressible payload of writer `w`'s `seq`-th write, ending in a CRC32C of
/// everything before it.
pub(crate) fn payload(w: u32, seq: u64) -> Vec<u8> {
    let mut state = (u64::from(w) << 40) ^ seq ^ 0x9E37_79B9_7F4A_7C15;
    let len = 64 + (seq % 448) as usize;
    let mut out = Vec::with_capacity(len + 16);
    out.extend_from_slice(&w.to_le_bytes());
    out.extend_from_slice(&seq.to_le_bytes());
    for _ in 0..len {
        // xorshift64*
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        out.push((state.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 56) as u8);
    }
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

fn crc_ok(value: &[u8]) -> bool {
    let Some((body, crc)) = value.split_last_chunk::<4>() else {
        return false;
    };
    crc32c::crc32c(body) == u32::from_le_bytes(*crc)
}

/// Run WRITERS writers until `stop` or the first error; returns each writer's last acked seq.
pub(crate) async fn write_until_stopped(
    server: &TestServer,
    stop: Arc<AtomicBool>,
) -> Vec<Arc<AtomicU64>> {
    let acked: Vec<Arc<AtomicU64>> = (0..WRITERS).map(|_| Arc::new(AtomicU64::new(0))).collect();
    for (w, last) in acked.iter().enumerate() {
        let mut client = server.cells(&server.demo).await.unwrap();
        let (last, stop) = (Arc::clone(last), Arc::clone(&stop));
        tokio::spawn(async move {
            let mut seq = 1u64;
            while !stop.load(Ordering::Relaxed) {
                let req = write(w as i32, seq as i32, 0, &payload(w as u32, seq));
                if client.write(req).await.is_err() {
                    break;
                }
                last.store(seq, Ordering::SeqCst);
                seq += 1;
            }
        });
    }
    acked
}

/// Read back every acknowledged write and check it byte for byte.
pub(crate) async fn verify(server: &TestServer, acked: &[u64]) {
    let mut tasks = Vec::new();
    for (w, &last) in acked.iter().enumerate() {
        let mut client = server.cells(&server.demo).await.unwrap();
        tasks.push(tokio::spawn(async move {
            for seq in 1..=last {
                let r = client
                    .read(read(w as i32, seq as i32, 0))
                    .await
                    .unwrap()
                    .into_inner();
                assert!(r.found, "writer {w} seq {seq} acknowledged but lost");
                assert!(crc_ok(&r.value), "writer {w} seq {seq} corrupt");
                assert_eq!(
                    r.value,
                    payload(w as u32, seq),
                    "writer {w} seq {seq} differs"
                );
            }
            // A write in flight at the crash may or may not have landed, but never half.
            let r = client
                .read(read(w as i32, (last + 1) as i32, 0))
                .await
                .unwrap()
                .into_inner();
            if r.found {
                assert_eq!(r.value, payload(w as u32, last + 1));
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

pub(crate) fn snapshot(acked: &[Arc<AtomicU64>]) -> Vec<u64> {
    acked.iter().map(|a| a.load(Ordering::SeqCst)).collect()
}

/// Wait (up to 30 s, however loaded the machine) until some write has been acknowledged, so
/// that a stop after that always has acknowledged writes to check.
async fn first_ack(acked: &[Arc<AtomicU64>]) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while snapshot(acked).iter().sum::<u64>() == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "no write acknowledged in 30 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A crash test's kill -9 of a server that had already exited by itself is an error: it
/// reaped the exit unseen, so a crash (here a stop behind the test's back) passed for the
/// test's own kill.
#[test]
fn killing_a_server_that_exited_by_itself_is_an_error() {
    let mut server = TestServer::start(cubed()).unwrap();
    let pid = server.pid().unwrap();
    signal_term(&server);
    // Its exit: a zombie until the kill reaps it (its log's last line comes before the process
    // has ended, so that is no sign of the exit).
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !is_zombie(pid) {
        assert!(std::time::Instant::now() < deadline, "{}", server.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    let err = server
        .kill9()
        .expect_err("a server that had stopped was taken as killed");
    assert!(err.to_string().contains("exited by itself"), "{err}");
    assert!(err.to_string().contains("exit status: 0"), "{err}");
}

/// Whether process `pid` has exited and waits to be reaped (state `Z` in `/proc/<pid>/stat`,
/// after the command name in parentheses, which may itself hold spaces or parentheses).
fn is_zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acked_writes_survive_kill_9_at_a_random_moment() {
    let mut server = TestServer::start(cubed()).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let acked = write_until_stopped(&server, Arc::clone(&stop)).await;
    first_ack(&acked).await;
    let delay = rand::thread_rng().gen_range(300..1500);
    tokio::time::sleep(Duration::from_millis(delay)).await;
    tokio::task::block_in_place(|| server.kill9()).unwrap();
    // Writers notice the dead connection and stop; what they saw acknowledged is final.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let acked = snapshot(&acked);
    let total: u64 = acked.iter().sum();
    assert!(total > 0, "no write was acknowledged before the kill");
    tokio::task::block_in_place(|| server.restart()).unwrap();
    verify(&server, &acked).await;
    println!("kill -9 after {delay} ms: {total} acknowledged writes verified");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_during_writes_exits_0_and_loses_nothing() {
    let mut server = TestServer::start(cubed()).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let acked = write_until_stopped(&server, Arc::clone(&stop)).await;
    first_ack(&acked).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    // SIGTERM while the writers keep going; block_in_place lets them run meanwhile.
    let exit = tokio::task::block_in_place(|| server.sigterm()).unwrap();
    assert!(
        exit.success(),
        "cubed exited with {exit:?}; log:\n{}",
        server.log()
    );
    stop.store(true, Ordering::Relaxed);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let acked = snapshot(&acked);
    assert!(acked.iter().sum::<u64>() > 0);
    assert!(server.log().contains("stopped cleanly"), "{}", server.log());
    tokio::task::block_in_place(|| server.restart()).unwrap();
    verify(&server, &acked).await;
}

/// SIGHUP (the terminal that started the server closed) stops the server as SIGTERM does:
/// calls drained, every tenant synced and closed, the admin socket removed, exit 0; its
/// default action ended the process at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_stops_the_server_as_sigterm_does() {
    let mut server = TestServer::start(cubed()).unwrap();
    let mut c = server.cells(&server.demo).await.unwrap();
    c.write(write(1, 2, 3, b"kept")).await.unwrap();
    let exit =
        tokio::task::block_in_place(|| server.stop_with(nix::sys::signal::Signal::SIGHUP)).unwrap();
    let log = server.log();
    assert!(exit.success(), "cubed exited with {exit:?}; log:\n{log}");
    assert!(log.contains("SIGHUP: shutting down"), "{log}");
    assert!(log.contains("stopped cleanly"), "{log}");
    assert!(!server.admin_socket().exists(), "the admin socket was left");
    tokio::task::block_in_place(|| server.restart()).unwrap();
    let mut c = server.cells(&server.demo).await.unwrap();
    assert_eq!(
        c.read(read(1, 2, 3)).await.unwrap().into_inner().value,
        b"kept"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_then_graceful_restart_then_read() {
    let mut server = TestServer::start(cubed()).unwrap();
    let mut c = server.cells(&server.demo).await.unwrap();
    let r = c
        .write(write(-7, i32::MIN, i32::MAX, b"kept"))
        .await
        .unwrap()
        .into_inner();
    // Seq 1 is demo's creation entry, the first record of its log.
    assert_eq!((r.version, r.seq), (1, 2));
    assert!(server.wal_segment("demo", 1).unwrap().is_some());
    stop_gracefully(&mut server);
    // The final checkpoint covers the whole log, so its files are gone: the next open reads no
    // log at all.
    assert!(server.wal_segment("demo", 1).unwrap().is_none());
    // ...but for an empty segment holding the log's place, so an older state store is refused.
    assert_eq!(
        std::fs::metadata(server.wal_segment("demo", 3).unwrap().unwrap())
            .unwrap()
            .len(),
        0
    );
    tokio::task::block_in_place(|| server.restart()).unwrap();
    let mut c = server.cells(&server.demo).await.unwrap();
    let r = c
        .read(read(-7, i32::MIN, i32::MAX))
        .await
        .unwrap()
        .into_inner();
    assert!(r.found);
    assert_eq!((r.value.as_slice(), r.version), (&b"kept"[..], 1));
    // Sequence numbers continue after the restart.
    let r = c.write(write(0, 0, 0, b"next")).await.unwrap().into_inner();
    assert_eq!(r.seq, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_health_watch_does_not_hold_up_a_graceful_stop() {
    let mut server = TestServer::start_with(cubed(), &["--drain-secs", "1"]).unwrap();
    let mut c = server.cells(&server.demo).await.unwrap();
    c.write(write(1, 2, 3, b"kept")).await.unwrap();
    // gRPC clients with health checking hold such a stream open for the connection's life; it
    // ends only with the server, so an unbounded drain waited for it forever.
    let mut watch = watch_health(server.channel().await.unwrap()).await;
    signal_term(&server);
    // Told that the whole server stops serving, not only cube.v1.Cells.
    not_serving_next(&mut watch).await;
    let status = tokio::task::block_in_place(|| server.wait_exit(Duration::from_secs(20)))
        .unwrap()
        .expect("cubed still running 20 s after SIGTERM with --drain-secs 1");
    assert!(status.success(), "{status}");
    let log = server.log();
    assert!(log.contains("closing their connections"), "{log}");
    assert!(log.contains("stopped cleanly"), "{log}");
    drop(watch);
    tokio::task::block_in_place(|| server.restart()).unwrap();
    let mut c = server.cells(&server.demo).await.unwrap();
    let r = c.read(read(1, 2, 3)).await.unwrap().into_inner();
    assert_eq!(r.value, b"kept");
}

/// The health watch's next message, within 10 s of a SIGTERM: NOT_SERVING.
async fn not_serving_next(watch: &mut tonic::Streaming<tonic_health::pb::HealthCheckResponse>) {
    use tonic_health::pb::health_check_response::ServingStatus;
    let next = tokio::time::timeout(Duration::from_secs(10), watch.message())
        .await
        .expect("no health change after SIGTERM")
        .unwrap()
        .unwrap();
    assert_eq!(next.status(), ServingStatus::NotServing);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_signal_ends_the_drain_at_once() {
    let mut server = TestServer::start_with(cubed(), &["--drain-secs", "600"]).unwrap();
    let mut watch = watch_health(server.channel().await.unwrap()).await;
    signal_term(&server);
    // The first signal has been taken (a second one sent before would merge with it).
    not_serving_next(&mut watch).await;
    // Still draining: the watch is open and the drain has ten minutes.
    let early = tokio::task::block_in_place(|| server.wait_exit(Duration::from_millis(500)));
    assert!(early.unwrap().is_none(), "exited before its drain was over");
    signal_term(&server);
    let status = tokio::task::block_in_place(|| server.wait_exit(Duration::from_secs(20)))
        .unwrap()
        .expect("cubed still running 20 s after a second SIGTERM");
    assert!(status.success(), "{status}");
    let log = server.log();
    assert!(log.contains("second signal"), "{log}");
    assert!(log.contains("stopped cleanly"), "{log}");
    drop(watch);
}

/// SIGTERM, and the server must exit 0.
fn stop_gracefully(server: &mut TestServer) {
    assert!(
        tokio::task::block_in_place(|| server.sigterm())
            .unwrap()
            .success()
    );
}

/// Flip one byte inside the payload of record `index` of the WAL segment `seg` (a second flip
/// restores it).
fn flip_record_byte(seg: &std::path::Path, index: usize) {
    let mut bytes = std::fs::read(seg).unwrap();
    let payload = cube_testkit::wal_record_payloads(&bytes)[index].clone();
    bytes[payload.start + 4] ^= 0xFF;
    std::fs::write(seg, bytes).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_tenant_refuses_to_open_while_others_keep_serving() {
    let mut server = TestServer::start(cubed()).unwrap();
    let acme = server.create_tenant("acme").unwrap();
    let mut a = server.cells(&acme).await.unwrap();
    for i in 0..5 {
        a.write(write(i, 0, 0, b"acme-data")).await.unwrap();
    }
    let mut d = server.cells(&server.demo).await.unwrap();
    d.write(write(1, 1, 1, b"demo-data")).await.unwrap();
    // kill -9: a clean stop would checkpoint the whole log into the state store and remove it.
    tokio::task::block_in_place(|| server.kill9()).unwrap();

    // Flip one byte inside acme's second record: records after it are still valid. Without its
    // state store the tenant has to replay the log from the start.
    flip_record_byte(&server.wal_segment("acme", 1).unwrap().unwrap(), 1);
    std::fs::remove_dir_all(server.tenant_state_dir("acme")).unwrap();

    tokio::task::block_in_place(|| server.restart()).unwrap();
    let mut a = server.cells(&acme).await.unwrap();
    let err = a.read(read(0, 0, 0)).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::DataLoss);
    assert!(err.message().contains("corrupt"), "{}", err.message());
    assert!(
        !err.message()
            .contains(&*server.data_dir().to_string_lossy()),
        "path leaked: {}",
        err.message()
    );
    let mut d = server.cells(&server.demo).await.unwrap();
    let r = d.read(read(1, 1, 1)).await.unwrap().into_inner();
    assert_eq!(r.value, b"demo-data");
    d.write(write(2, 2, 2, b"still writable")).await.unwrap();
    // The failed open stays counted for an alert after the server forgot it (1 s later), when
    // `cube_tenants_unavailable` is back to 0.
    let forgotten = server
        .metric_when(
            "cube_tenants_unavailable",
            std::time::Duration::from_secs(20),
            |v| v == 0.0,
        )
        .await;
    assert_eq!(forgotten, Ok(0.0), "the failed open was never forgotten");
    let (_, text) = cube_testkit::admin_get(server.admin_addr, "/metrics").unwrap();
    assert_eq!(
        cube_testkit::metric_sample(&text, "cube_tenant_open_failures_total"),
        Some(1.0),
        "{text}"
    );
}

/// `cubed ARGS`, which must succeed: (stdout, stderr).
fn cli_ok(server: &TestServer, args: &[&str]) -> (String, String) {
    let out = server.cli(args).unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(out.status.success(), "cubed {args:?}: {stderr}");
    (stdout, stderr)
}

/// A tenant whose log cannot be opened still answers to its operator: a key revocation and a
/// durability change go through the catalog instead (with a warning, without an audit entry),
/// through the admin socket while the server runs and on the data directory while it is
/// stopped, and both hold once the log is repaired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_with_a_corrupt_log_can_still_have_keys_revoked_and_its_durability_set() {
    let mut server = TestServer::start(cubed()).unwrap();
    let acme = server.create_tenant("acme").unwrap();
    let new_key = |server: &TestServer| -> cube_auth::Credentials {
        serde_json::from_str(&cli_ok(server, &["key", "create", "acme"]).0).unwrap()
    };
    let (online_key, offline_key) = (new_key(&server), new_key(&server));
    // A clean stop: the keys are in the catalog's own files, not only in the tenant's log.
    stop_gracefully(&mut server);
    tokio::task::block_in_place(|| server.restart()).unwrap();
    let mut a = server.cells(&acme).await.unwrap();
    a.write(write(0, 0, 0, b"acme-data")).await.unwrap();
    a.write(write(1, 0, 0, b"more")).await.unwrap();
    tokio::task::block_in_place(|| server.kill9()).unwrap();
    // Corrupt the first write after the restart, which a good record follows: the tenant's
    // recovery cannot get past it, so the tenant cannot open.
    let wal_dir = server.wal_dir("acme");
    let segs: Vec<_> = std::fs::read_dir(&wal_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "wal"))
        .collect();
    assert_eq!(segs.len(), 1, "{segs:?}");
    let seg = &segs[0];
    let first_write = cube_testkit::wal_record_payloads(&std::fs::read(seg).unwrap()).len() - 2;
    flip_record_byte(seg, first_write);
    tokio::task::block_in_place(|| server.restart()).unwrap();
    let mut a = server.cells(&acme).await.unwrap();
    let err = a.read(read(0, 0, 0)).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::DataLoss, "{err:?}");
    // The key was good: the refusal is the tenant's, not a failed authentication.
    let (_, text) = cube_testkit::admin_get(server.admin_addr, "/metrics").unwrap();
    assert_eq!(
        cube_testkit::metric_sample(
            &text,
            "grpc_server_handled_total{auth=\"call\",grpc_code=\"DataLoss\",grpc_method=\"Read\""
        ),
        Some(1.0),
        "{text}"
    );
    assert!(!text.contains("cube_auth_failures_total{"), "{text}");

    // While the server runs (the admin socket).
    let (out, _) = cli_ok(&server, &["key", "revoke", "acme", &online_key.key_id]);
    assert!(out.contains("\"revoked\":true"), "{out}");
    let err = cube_auth::client::handshake(server.channel().await.unwrap(), &online_key)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("revoked"), "{err}");
    let set_relaxed = |server: &TestServer, delay_ms: &str, records: &str| {
        let args = [
            "tenant",
            "durability",
            "acme",
            "relaxed",
            "--max-delay-ms",
            delay_ms,
        ];
        cli_ok(server, &[&args[..], &["--max-records", records]].concat())
    };
    let (out, _) = set_relaxed(&server, "5", "10");
    assert!(
        out.contains("relaxed(max_delay_ms=5, max_records=10)"),
        "{out}"
    );
    assert!(
        server
            .log()
            .contains("could not take the durability change"),
        "{}",
        server.log()
    );

    // While it is stopped (the data directory).
    stop_gracefully(&mut server);
    let (out, err) = cli_ok(&server, &["key", "revoke", "acme", &offline_key.key_id]);
    assert!(out.contains("\"revoked\":true"), "{out}");
    assert!(err.contains("could not take the revocation"), "{err}");
    let (_, err) = set_relaxed(&server, "7", "20");
    assert!(
        err.contains("could not take the durability change"),
        "{err}"
    );

    // Repaired, the tenant opens under the policy set last, with both keys still revoked.
    flip_record_byte(seg, first_write);
    tokio::task::block_in_place(|| server.restart()).unwrap();
    let mut a = server.cells(&acme).await.unwrap();
    assert_eq!(
        a.read(read(0, 0, 0)).await.unwrap().into_inner().value,
        b"acme-data"
    );
    assert_eq!(
        crate::totals_of(&server, &acme).await.durability,
        "relaxed(max_delay_ms=7, max_records=20)"
    );
    for key in [&online_key, &offline_key] {
        let err = cube_auth::client::handshake(server.channel().await.unwrap(), key)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("revoked"), "{err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_store_older_than_the_removed_log_is_refused_not_silently_continued() {
    let mut server = TestServer::start(cubed()).unwrap();
    let mut c = server.cells(&server.demo).await.unwrap();
    c.write(write(1, 1, 1, b"one")).await.unwrap();
    stop_gracefully(&mut server);
    // An operator keeps a copy of the state store as it was after the first write...
    let state = server.tenant_state_dir("demo");
    let copy = state.with_extension("copy");
    let out = std::process::Command::new("cp")
        .arg("-a")
        .arg(&state)
        .arg(&copy)
        .status()
        .unwrap();
    assert!(out.success());
    tokio::task::block_in_place(|| server.restart()).unwrap();
    let mut c = server.cells(&server.demo).await.unwrap();
    c.write(write(2, 2, 2, b"two")).await.unwrap();
    stop_gracefully(&mut server);
    // ...and restores it after the log that held the second write was removed by a checkpoint.
    std::fs::remove_dir_all(&state).unwrap();
    std::fs::rename(&copy, &state).unwrap();
    tokio::task::block_in_place(|| server.restart()).unwrap();
    let mut c = server.cells(&server.demo).await.unwrap();
    let err = c.read(read(1, 1, 1)).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::DataLoss, "{err:?}");
    // Named as what it is, not as a corrupt log (the log is sound).
    assert!(
        err.message()
            .contains("stored state is older than its write-ahead log")
            && !err.message().contains("corrupt"),
        "{}",
        err.message()
    );
}
