//! Checkpoints: kill -9 (a failpoint's abort) before and after the state store's flush and in
//! the middle of WAL segment deletion loses nothing acknowledged; a state several times larger
//! than the state store's cache works and recovers.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use cube_testkit::TestServer;

use crate::crash::{snapshot, verify, write_until_stopped};
use crate::{cubed, read, write};

/// Small checkpoints and segments, so checkpoints and deletions happen within a second of writes.
const FREQUENT: &[&str] = &[
    "--checkpoint-bytes",
    "65536",
    "--wal-segment-max-bytes",
    "262144",
];

async fn crash_at(failpoint: &str) {
    let mut server =
        TestServer::start_with_env(cubed(), FREQUENT, &[("CUBE_FAILPOINT", failpoint)]).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let acked = write_until_stopped(&server, Arc::clone(&stop)).await;
    let exited = tokio::task::block_in_place(|| server.wait_exit(Duration::from_secs(60))).unwrap();
    assert!(
        exited.is_some(),
        "failpoint {failpoint} was never reached; log:\n{}",
        server.log()
    );
    assert!(server.log().contains(failpoint), "{}", server.log());
    tokio::time::sleep(Duration::from_millis(200)).await;
    let acked = snapshot(&acked);
    let total: u64 = acked.iter().sum();
    assert!(total > 0);
    tokio::task::block_in_place(|| server.restart()).unwrap();
    verify(&server, &acked).await;
    println!("{failpoint}: {total} acknowledged writes verified after the crash");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_during_checkpoint_before_flush_loses_nothing() {
    crash_at("checkpoint-before-flush").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_after_flush_before_segment_deletion_loses_nothing() {
    crash_at("checkpoint-after-flush").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_between_segment_deletions_loses_nothing() {
    crash_at("wal-between-deletes").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_larger_than_the_cache_works_and_recovers() {
    let mut args = FREQUENT.to_vec();
    args.extend(["--state-cache-bytes", "1048576"]);
    let mut server = TestServer::start_with(cubed(), &args).unwrap();
    let mut c = server.cells(&server.demo).await.unwrap();
    // 6 MiB of values through a 1 MiB cache.
    let value = |i: i32| {
        let mut v = vec![(i % 251) as u8; 4096];
        v[..4].copy_from_slice(&i.to_le_bytes());
        v
    };
    const N: i32 = 1536;
    for i in 0..N {
        c.write(write(i % 64, i / 64, 7, &value(i))).await.unwrap();
    }
    for i in (0..N).step_by(7) {
        let r = c.read(read(i % 64, i / 64, 7)).await.unwrap().into_inner();
        assert_eq!(r.value, value(i));
    }
    let totals = crate::totals(&server).await;
    assert!(totals.checkpoint_seq > 0, "no checkpoint ran: {totals:?}");
    // WAL segments behind the checkpoint are gone: far less WAL than data written.
    assert!(totals.wal_bytes < 6 << 20, "{totals:?}");
    assert!(server.metric("cube_checkpoint_seconds_count").unwrap() >= 1.0);
    assert!(server.metric("cube_wal_segments_deleted_total").unwrap() >= 1.0);
    tokio::task::block_in_place(|| server.kill9()).unwrap();
    tokio::task::block_in_place(|| server.restart()).unwrap();
    let mut c = server.cells(&server.demo).await.unwrap();
    for i in 0..N {
        let r = c.read(read(i % 64, i / 64, 7)).await.unwrap().into_inner();
        assert_eq!(r.value, value(i), "cell {i}");
    }
}
