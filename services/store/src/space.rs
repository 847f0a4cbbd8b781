//! Refusing writes before the disk fills up.
//!
//! A full file system is the one failure a storage process can see coming. fjall ignores a
//! failed write to its journal (the batch still reaches the memtable, so the journal would
//! silently miss it), and the WAL's segment creation would fail mid-batch. So cubed checks the
//! data directory's free space a few times a second and, below `--min-free-bytes`, answers
//! writes RESOURCE_EXHAUSTED before they reach either. Reads keep working, and writes resume by
//! themselves once space is freed. A disk that fills faster than the check runs still ends in
//! the WAL's own handling of a failed write (docs/durability.md, "Disk full").

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

#[derive(Debug)]
pub struct SpaceGuard {
    dir: PathBuf,
    min_free: u64,
    low: AtomicBool,
    /// The last check could not ask the file system.
    unreadable: AtomicBool,
}

impl SpaceGuard {
    /// A guard for the file system holding `dir`, checked once now.
    pub fn new(dir: PathBuf, min_free: u64) -> Arc<SpaceGuard> {
        let g = Arc::new(SpaceGuard {
            dir,
            min_free,
            low: AtomicBool::new(false),
            unreadable: AtomicBool::new(false),
        });
        g.check();
        g
    }

    /// Ask the file system now; returns the free bytes (for unprivileged users).
    pub fn check(&self) -> u64 {
        let stat = nix::sys::statvfs::statvfs(&self.dir);
        if self.unreadable.swap(stat.is_err(), Ordering::Relaxed) != stat.is_err() {
            match &stat {
                Err(e) => {
                    tracing::warn!(error = %e, "cannot check the data directory's free space")
                }
                Ok(_) => tracing::info!("the data directory's free space can be checked again"),
            }
        }
        // Cannot tell: do not refuse writes on a guess (the WAL still handles a real ENOSPC),
        // but report -1, which is below any alert's threshold: a disk nobody can check is worth
        // a look.
        let (free, reported) = match stat {
            Ok(s) => {
                let free = s.blocks_available().saturating_mul(s.fragment_size());
                (free, free.min(i64::MAX as u64) as i64)
            }
            Err(_) => (u64::MAX, -1),
        };
        let low = free < self.min_free;
        if self.low.swap(low, Ordering::Relaxed) != low {
            if low {
                tracing::warn!(
                    free,
                    min_free = self.min_free,
                    "data directory nearly full; refusing writes"
                );
            } else {
                tracing::info!(free, "free space is back; accepting writes");
            }
        }
        cube_metrics::DISK_FREE_BYTES.set(reported);
        free
    }

    /// Whether writes are refused now.
    pub fn low(&self) -> bool {
        self.low.load(Ordering::Relaxed)
    }

    pub fn min_free(&self) -> u64 {
        self.min_free
    }

    /// Check every `every` on a thread of its own until the guard is dropped. If that thread
    /// cannot be started, the guard stays as its last check left it (said in the log): writes
    /// are then refused, or not, on that check alone.
    pub fn start(self: &Arc<Self>, every: Duration) {
        let weak: Weak<SpaceGuard> = Arc::downgrade(self);
        let started = std::thread::Builder::new()
            .name("space-guard".into())
            .spawn(move || {
                loop {
                    std::thread::sleep(every);
                    match weak.upgrade() {
                        Some(g) => {
                            g.check();
                        }
                        None => return,
                    }
                }
            });
        if let Err(e) = started {
            tracing::error!(error = %e, low = self.low(), "cannot start the free-space check; its last result stays in force");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The gauge is the process's: tests that set it take turns.
    static GAUGE: std::sync::Mutex<()> = std::sync::Mutex::new(());

    #[test]
    fn below_the_minimum_writes_are_refused_and_above_it_they_are_not() {
        let _turn = GAUGE.lock().unwrap_or_else(|p| p.into_inner());
        let dir = tempfile::tempdir().unwrap();
        let roomy = SpaceGuard::new(dir.path().to_path_buf(), 1);
        assert!(!roomy.low());
        assert!(roomy.check() > 1);
        let starved = SpaceGuard::new(dir.path().to_path_buf(), u64::MAX);
        assert!(starved.low());
    }

    #[test]
    fn a_directory_that_cannot_be_checked_refuses_nothing_and_reports_minus_one() {
        let _turn = GAUGE.lock().unwrap_or_else(|p| p.into_inner());
        let dir = tempfile::tempdir().unwrap();
        let gone = dir.path().join("gone");
        let guard = SpaceGuard::new(gone, 1);
        assert!(!guard.low());
        assert!(guard.unreadable.load(Ordering::Relaxed));
        assert_eq!(cube_metrics::DISK_FREE_BYTES.get(), -1);
    }
}
