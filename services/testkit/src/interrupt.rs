//! What a load driver stopped by a signal leaves behind, cleaned up.
//!
//! A driver's temporary directories and child servers are removed and stopped by their
//! owners' `Drop`s, which do not run when the process is killed by SIGINT, SIGTERM or SIGHUP:
//! a `cube-load bench` stopped half-way would leave its bulk-loaded data (up to gigabytes) in
//! the temp directory, and a server started by `cube-load run` would keep running. Owners
//! register what they hold ([`dir`], [`process`]) for as long as they hold it, and a driver
//! that calls [`clean_up_on_signals`] stops every registered process (SIGKILL) and removes
//! every registered directory when such a signal arrives, then exits with 128 + the signal.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

enum Leftover {
    Dir(PathBuf),
    Process(u32),
}

#[derive(Default)]
struct Registry {
    next: u64,
    held: BTreeMap<u64, Leftover>,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    next: 0,
    held: BTreeMap::new(),
});

fn registry() -> MutexGuard<'static, Registry> {
    REGISTRY.lock().unwrap_or_else(|p| p.into_inner())
}

/// Registered for as long as this is held; dropping it unregisters.
#[must_use = "what is registered stays registered only while the guard is held"]
#[derive(Debug)]
pub struct Registered(u64);

impl Drop for Registered {
    fn drop(&mut self) {
        registry().held.remove(&self.0);
    }
}

fn register(what: Leftover) -> Registered {
    let mut r = registry();
    r.next += 1;
    let id = r.next;
    r.held.insert(id, what);
    Registered(id)
}

/// A directory to remove (with everything in it) if the driver is stopped by a signal.
pub fn dir(path: &Path) -> Registered {
    register(Leftover::Dir(path.to_path_buf()))
}

/// A child process to kill if the driver is stopped by a signal. Drop the guard before the
/// child is reaped, so that its pid, free again, is never signalled.
pub fn process(pid: u32) -> Registered {
    register(Leftover::Process(pid))
}

/// Kill every registered process, then remove every registered directory. Returns how many of
/// each.
fn clean_up() -> (usize, usize) {
    let held = std::mem::take(&mut registry().held);
    let (mut processes, mut dirs) = (Vec::new(), Vec::new());
    for what in held.into_values() {
        match what {
            Leftover::Process(pid) => processes.push(pid),
            Leftover::Dir(path) => dirs.push(path),
        }
    }
    for &pid in &processes {
        let pid = Pid::from_raw(i32::try_from(pid).unwrap_or(i32::MAX));
        if kill(pid, Signal::SIGKILL).is_ok() {
            // Reaped here, so that it is gone (not writing into a directory removed below).
            let _ = nix::sys::wait::waitpid(pid, None);
        }
    }
    for path in &dirs {
        if let Err(e) = std::fs::remove_dir_all(path)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            eprintln!("could not remove {}: {e}", path.display());
        }
    }
    (processes.len(), dirs.len())
}

/// On SIGINT, SIGTERM or SIGHUP: clean up what is registered, say so on stderr and exit with
/// 128 + the signal's number. Call once, inside a tokio runtime, before starting work.
pub fn clean_up_on_signals() -> std::io::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut int = signal(SignalKind::interrupt())?;
    let mut term = signal(SignalKind::terminate())?;
    let mut hup = signal(SignalKind::hangup())?;
    tokio::spawn(async move {
        let (name, number) = tokio::select! {
            _ = int.recv() => ("SIGINT", Signal::SIGINT as i32),
            _ = term.recv() => ("SIGTERM", Signal::SIGTERM as i32),
            _ = hup.recv() => ("SIGHUP", Signal::SIGHUP as i32),
        };
        // The cleanup blocks (kill, wait, remove): off the runtime's workers.
        let (processes, dirs) = tokio::task::spawn_blocking(clean_up)
            .await
            .unwrap_or_default();
        eprintln!(
            "stopped by {name}: killed {processes} child process(es) and removed {dirs} \
             temporary director(ies)"
        );
        std::process::exit(128 + number);
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_registered_is_cleaned_up_and_what_was_released_is_not() {
        let base = tempfile::tempdir().unwrap();
        let held = base.path().join("held");
        let released = base.path().join("released");
        std::fs::create_dir_all(held.join("inside")).unwrap();
        std::fs::create_dir_all(&released).unwrap();
        let mut child = std::process::Command::new("sleep")
            .arg("600")
            .spawn()
            .unwrap();
        let _dir = dir(&held);
        let _child = process(child.id());
        drop(dir(&released));
        let (processes, dirs) = clean_up();
        assert_eq!((processes, dirs), (1, 1));
        assert!(!held.exists(), "a registered directory was left");
        assert!(released.exists(), "a released directory was removed");
        // Killed and already reaped by the cleanup.
        assert!(
            matches!(child.try_wait(), Err(_) | Ok(Some(_))),
            "the registered child still runs"
        );
    }
}
