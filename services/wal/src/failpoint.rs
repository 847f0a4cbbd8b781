//! Crash points for durability tests: with `CUBE_FAILPOINT=<name>` in the environment, the
//! process aborts (like `kill -9`: no destructors, no flushes) the first time it reaches
//! `hit("<name>")`. Without the variable a hit costs one atomic load and a comparison.
//!
//! Names: `checkpoint-before-flush`, `checkpoint-after-flush` (state store flushed, WAL segments
//! not deleted yet; both in cube-store), `wal-between-deletes` (after the first of several
//! segment deletions, before the directory fsync).

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
