//! Crash points for durability tests: with `CUBE_FAILPOINT=<name>` in the environment, the
//! process aborts (like `kill -9`: no destructors, no flushes) the first time it reaches
//! `hit("<name>")`. Without the variable a hit costs one atomic load and a comparison.
//!
//! Names: `checkpoint-before-flush`, `checkpoint-after-flush` (state store flushed, WAL segments
//! not deleted yet; both in cube-store), `wal-between-deletes` (after the first of several
//! segment deletions, before the directory fsync).
//!
//! Also here: injected fdatasync failures for tests ([`fail_next_fdatasync`]), of a WAL shard or
//! of a tenant's state store, and injected write failures of a WAL shard ([`fail_next_write`]);
//! the directory fsync after a deletion of checkpointed segments
//! ([`fail_next_dir_sync_after_delete`]); and, before a tenant's actor applies a durable group
//! ([`before_apply`]), a delay with `CUBE_FAILPOINT_APPLY_DELAY_MS=<ms>` in the environment (it holds open the window between the
//! WAL syncer's answer and the apply for integration tests) and injected apply failures
//! ([`fail_next_apply`]); a held fdatasync that then succeeds ([`delay_next_fdatasync`]); and a
//! tenant state store that reports no room for applies ([`withhold_state_room`]).

use std::sync::OnceLock;

static ARMED: OnceLock<Option<String>> = OnceLock::new();

/// Abort the process if the failpoint `name` is armed.
pub fn hit(name: &str) {
    let armed = ARMED.get_or_init(|| {
        std::env::var("CUBE_FAILPOINT")
            .ok()
            .filter(|v| !v.is_empty())
    });
    if armed.as_deref() == Some(name) {
        eprintln!("cube failpoint '{name}' hit: aborting");
        std::process::abort();
    }
}

static APPLY_DELAY: OnceLock<Option<std::time::Duration>> = OnceLock::new();

/// Called before the tenant whose WAL is in `dir` applies a durable group (tests only; neither
/// is set in production): sleeps when `CUBE_FAILPOINT_APPLY_DELAY_MS` is set, and says whether
/// this apply is to fail ([`fail_next_apply`]). Unarmed, two loads and comparisons.
pub fn before_apply(dir: &std::path::Path) -> bool {
    let delay = APPLY_DELAY.get_or_init(|| {
        std::env::var("CUBE_FAILPOINT_APPLY_DELAY_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .map(std::time::Duration::from_millis)
    });
    if let Some(delay) = delay {
        tracing::warn!(dir = %dir.display(), ms = delay.as_millis() as u64, "failpoint: apply delayed");
        std::thread::sleep(*delay);
    }
    injected(dir, FaultOn::Apply)
}

/// Injected fdatasync failures, for tests in this and other crates (a failed fsync cannot be
/// had from a real disk on demand): [`fail_next_fdatasync`] makes the next fdatasync of the
/// shard writing in that directory fail as a disk's EIO would. Unarmed, a sync pays one relaxed
/// atomic load.
static SYNC_FAULTS_ARMED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
/// What an injected fault fails (`SlowSync`: delays, then lets succeed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FaultOn {
    Sync,
    Write,
    Apply,
    DirSync,
    SlowSync,
    NewSegmentSync,
    PoisonDelay,
}
/// (directory, what fails, how long the failing call takes).
type SyncFault = (std::path::PathBuf, FaultOn, std::time::Duration);
static SYNC_FAULTS: std::sync::Mutex<Vec<SyncFault>> = std::sync::Mutex::new(Vec::new());

/// Make the next fdatasync of the WAL shard in `dir` fail (tests only): its syncer's, or the
/// sync of the last segment when the shard is opened. For a tenant's state
/// directory, its next checkpoint's flush fails instead (cube-store asks
/// [`injected_sync_failure`]).
#[doc(hidden)]
pub fn fail_next_fdatasync(dir: &std::path::Path) {
    fail_next_fdatasync_after(dir, std::time::Duration::ZERO);
}

/// Make the next fdatasync of the WAL shard in `dir` fail after blocking its syncer for
/// `delay`, as a disk that gives up only after retrying would (tests only: it holds a race
/// window open).
#[doc(hidden)]
pub fn fail_next_fdatasync_after(dir: &std::path::Path, delay: std::time::Duration) {
    arm(dir, FaultOn::Sync, delay);
}

/// Make the next fdatasync of the WAL shard in `dir` take `delay` longer, and succeed (tests
/// only: it holds the syncer inside a sync while something else happens).
#[doc(hidden)]
pub fn delay_next_fdatasync(dir: &std::path::Path, delay: std::time::Duration) {
    arm(dir, FaultOn::SlowSync, delay);
}

/// Whether the delay armed by [`delay_next_fdatasync`] for `dir` has been taken (its fdatasync
/// is being held now, or was).
#[doc(hidden)]
pub fn fdatasync_delay_taken(dir: &std::path::Path) -> bool {
    let faults = SYNC_FAULTS.lock().unwrap_or_else(|p| p.into_inner());
    !faults
        .iter()
        .any(|(d, o, _)| d == dir && *o == FaultOn::SlowSync)
}

/// Whether the failure armed by [`fail_next_fdatasync_after`] (or [`fail_next_fdatasync`])
/// for `dir` has been taken (its fdatasync is being held now, or has failed).
#[doc(hidden)]
pub fn fdatasync_failure_taken(dir: &std::path::Path) -> bool {
    let faults = SYNC_FAULTS.lock().unwrap_or_else(|p| p.into_inner());
    !faults
        .iter()
        .any(|(d, o, _)| d == dir && *o == FaultOn::Sync)
}

/// Wait out a delay armed by [`delay_next_fdatasync`] for this fdatasync of `dir`, if any.
pub(crate) fn injected_sync_delay(dir: &std::path::Path) {
    injected(dir, FaultOn::SlowSync);
}

/// Make the next batch write of the WAL shard in `dir` fail as an I/O error other than a full
/// disk would (tests only): the shard stops, reopenable.
#[doc(hidden)]
pub fn fail_next_write(dir: &std::path::Path) {
    arm(dir, FaultOn::Write, std::time::Duration::ZERO);
}

/// Make the fsync of the WAL directory in `dir` after the next deletion of checkpointed
/// segments (or removal of a checkpointed log at close) fail, as a disk's EIO would (tests
/// only).
#[doc(hidden)]
pub fn fail_next_dir_sync_after_delete(dir: &std::path::Path) {
    arm(dir, FaultOn::DirSync, std::time::Duration::ZERO);
}

/// Whether this fsync of the WAL directory `dir` after a deletion is to fail (consumes it).
pub(crate) fn injected_dir_sync_failure(dir: &std::path::Path) -> bool {
    injected(dir, FaultOn::DirSync)
}

/// Hold the thread whose fsync of the WAL directory `dir` after a deletion failed for `delay`
/// before it poisons the shard (tests only: it holds the window open in which the syncer may
/// rotate and sync a batch).
#[doc(hidden)]
pub fn delay_poison_after_dir_sync_failure(dir: &std::path::Path, delay: std::time::Duration) {
    arm(dir, FaultOn::PoisonDelay, delay);
}

/// Wait out a delay armed by [`delay_poison_after_dir_sync_failure`] for `dir`, if any.
pub(crate) fn injected_poison_delay(dir: &std::path::Path) {
    injected(dir, FaultOn::PoisonDelay);
}

/// Whether the delay armed by [`delay_poison_after_dir_sync_failure`] for `dir` has been taken
/// (the failed fsync's thread is being held now, or was).
#[doc(hidden)]
pub fn poison_delay_taken(dir: &std::path::Path) -> bool {
    let faults = SYNC_FAULTS.lock().unwrap_or_else(|p| p.into_inner());
    !faults
        .iter()
        .any(|(d, o, _)| d == dir && *o == FaultOn::PoisonDelay)
}

/// Make the fsync of the next segment the WAL shard in `dir` prepares (a pre-zeroed one, or a
/// recycled one reused) fail, as a disk's EIO would (tests only).
#[doc(hidden)]
pub fn fail_next_new_segment_sync(dir: &std::path::Path) {
    arm(dir, FaultOn::NewSegmentSync, std::time::Duration::ZERO);
}

/// Whether this fsync of a new segment in `dir` is to fail (consumes the injection).
pub(crate) fn injected_new_segment_sync_failure(dir: &std::path::Path) -> bool {
    injected(dir, FaultOn::NewSegmentSync)
}

/// Make the next apply of a durable group, by the tenant whose WAL is in `dir`, fail as a
/// state-store failure would (tests only; cube-store asks [`before_apply`]).
#[doc(hidden)]
pub fn fail_next_apply(dir: &std::path::Path) {
    arm(dir, FaultOn::Apply, std::time::Duration::ZERO);
}

/// WAL directories whose tenant takes this long over each call it handles (tests only; see
/// [`slow_handling`]).
static SLOW_HANDLING: std::sync::Mutex<Vec<(std::path::PathBuf, std::time::Duration)>> =
    std::sync::Mutex::new(Vec::new());
static SLOW_HANDLING_ARMED: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// Make the tenant whose WAL is in `dir` take `delay` longer over each call it handles on its
/// actor's thread (`None`: as usual again), as one whose state reads go to a slow disk would
/// (tests only: cube-store asks [`handling_delay`]).
#[doc(hidden)]
pub fn slow_handling(dir: &std::path::Path, delay: Option<std::time::Duration>) {
    let mut dirs = SLOW_HANDLING.lock().unwrap_or_else(|p| p.into_inner());
    dirs.retain(|(d, _)| d != dir);
    if let Some(delay) = delay {
        dirs.push((dir.to_path_buf(), delay));
        SLOW_HANDLING_ARMED.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// How much longer the tenant whose WAL is in `dir` is to take over a call
/// ([`slow_handling`]). Unarmed, one relaxed atomic load.
pub fn handling_delay(dir: &std::path::Path) -> Option<std::time::Duration> {
    if !SLOW_HANDLING_ARMED.load(std::sync::atomic::Ordering::Relaxed) {
        return None;
    }
    let dirs = SLOW_HANDLING.lock().unwrap_or_else(|p| p.into_inner());
    dirs.iter().find(|(d, _)| d == dir).map(|(_, delay)| *delay)
}

/// State directories whose store is made to report no room for applies (tests only; see
/// [`withhold_state_room`]).
static NO_ROOM: std::sync::Mutex<Vec<std::path::PathBuf>> = std::sync::Mutex::new(Vec::new());
static NO_ROOM_ARMED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Make the tenant state store in `dir` report that its memtables are over budget (`true`),
/// as one whose flushes fall behind would, until called again with `false` (tests only:
/// cube-store asks [`state_room_withheld`]).
#[doc(hidden)]
pub fn withhold_state_room(dir: &std::path::Path, withheld: bool) {
    let mut dirs = NO_ROOM.lock().unwrap_or_else(|p| p.into_inner());
    dirs.retain(|d| d != dir);
    if withheld {
        dirs.push(dir.to_path_buf());
        NO_ROOM_ARMED.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Whether the state store in `dir` is to report no room ([`withhold_state_room`]). Unarmed,
/// one relaxed atomic load.
pub fn state_room_withheld(dir: &std::path::Path) -> bool {
    if !NO_ROOM_ARMED.load(std::sync::atomic::Ordering::Relaxed) {
        return false;
    }
    let dirs = NO_ROOM.lock().unwrap_or_else(|p| p.into_inner());
    dirs.iter().any(|d| d == dir)
}

fn arm(dir: &std::path::Path, on: FaultOn, delay: std::time::Duration) {
    let mut faults = SYNC_FAULTS.lock().unwrap_or_else(|p| p.into_inner());
    faults.push((dir.to_path_buf(), on, delay));
    SYNC_FAULTS_ARMED.store(true, std::sync::atomic::Ordering::SeqCst);
}

/// Whether this fdatasync of the files in `dir` is to fail (consumes the injection, after its
/// delay).
#[doc(hidden)]
pub fn injected_sync_failure(dir: &std::path::Path) -> bool {
    injected(dir, FaultOn::Sync)
}

/// Whether this batch write of the WAL shard in `dir` is to fail (consumes the injection).
pub(crate) fn injected_write_failure(dir: &std::path::Path) -> bool {
    injected(dir, FaultOn::Write)
}

fn injected(dir: &std::path::Path, on: FaultOn) -> bool {
    if !SYNC_FAULTS_ARMED.load(std::sync::atomic::Ordering::Relaxed) {
        return false;
    }
    let mut faults = SYNC_FAULTS.lock().unwrap_or_else(|p| p.into_inner());
    let Some(i) = faults.iter().position(|(d, o, _)| d == dir && *o == on) else {
        return false;
    };
    let (_, _, delay) = faults.swap_remove(i);
    if faults.is_empty() {
        SYNC_FAULTS_ARMED.store(false, std::sync::atomic::Ordering::SeqCst);
    }
    drop(faults);
    std::thread::sleep(delay);
    true
}
