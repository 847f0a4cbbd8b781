//! What a load driver stopped by a signal leaves behind, cleaned up.
//!
//! A driver's temporary directories, child servers and mounts are removed, stopped and
//! unmounted by their owners' `Drop`s, which do not run when the process is killed by SIGINT,
//! SIGTERM or SIGHUP: a `cube-load bench` stopped half-way would leave its bulk-loaded data (up
//! to gigabytes) in the temp directory, a server started by `cube-load run` would keep running,
//! and `cube-durability` would leave a tmpfs or a loop device mounted. Owners register what they
//! hold ([`dir`], [`ChildProcess::spawn`], [`mount`]) for as long as they hold it, and a
//! driver that calls [`clean_up_on_signals`] stops every registered process (SIGKILL), then
//! undoes every registered mount (newest first), then removes every registered directory when
//! such a signal arrives, and exits with 128 + the signal's number. A directory registered
//! after the signal is removed at once; a process (the next server of a matrix of runs) or a
//! mount is refused.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use nix::sys::signal::{Signal, kill};
use nix::sys::wait::{Id, WaitPidFlag, waitid};
use nix::unistd::Pid;

enum Leftover {
    Dir(PathBuf),
    Process(u32),
    Mount(Box<dyn FnOnce() + Send>),
}

struct Registry {
    next: u64,
    held: BTreeMap<u64, Leftover>,
    /// A signal arrived: cleaned up, or being cleaned up.
    stopping: bool,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    next: 0,
    held: BTreeMap::new(),
    stopping: false,
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

/// Held until the guard is dropped; or, when the driver is already stopping, handed back to be
/// cleaned up by the caller (outside the registry's lock: removing a directory or unmounting
/// may take a while, and other threads unregister under that lock).
fn register(what: Leftover) -> Result<Registered, Leftover> {
    let mut r = registry();
    if r.stopping {
        return Err(what);
    }
    Ok(r.hold(what))
}

impl Registry {
    fn hold(&mut self, what: Leftover) -> Registered {
        self.next += 1;
        let id = self.next;
        self.held.insert(id, what);
        Registered(id)
    }
}

/// A guard that holds nothing: what it stood for was cleaned up at once.
fn nothing_held() -> Registered {
    Registered(0)
}

/// A directory to remove (with everything in it) if the driver is stopped by a signal; removed
/// at once if it is stopping already.
pub fn dir(path: &Path) -> Registered {
    register(Leftover::Dir(path.to_path_buf())).unwrap_or_else(|_| {
        remove(path);
        nothing_held()
    })
}

/// A mount (or any set-up that a directory's removal must wait for), undone by `undo` if the
/// driver is stopped by a signal: after every registered process has exited, before any
/// registered directory is removed, newest first. `None` when the driver is stopping already:
/// do not mount then.
///
/// Register before mounting, and make `undo` wait for a mount in progress and for an unmount
/// by the owner's `Drop` (a lock that both hold), so that a signal arriving half-way is
/// covered; `undo` must tolerate what it undoes not being there. The owner's `Drop` unmounts,
/// then drops the guard.
pub fn mount(undo: impl FnOnce() + Send + 'static) -> Option<Registered> {
    register(Leftover::Mount(Box::new(undo))).ok()
}

/// A child process that is killed and reaped when dropped, and registered (killed if the
/// driver is stopped by a signal) until it is reaped: the one way the drivers own the servers
/// they start.
#[derive(Debug)]
pub struct ChildProcess {
    child: std::process::Child,
    registered: Option<Registered>,
}

impl ChildProcess {
    /// Start `command` and register the child (killed if the driver is stopped by a signal)
    /// under the registry's lock: a signal's cleanup either finds it registered (and kills it,
    /// waits for it to exit, and only then removes the directories it may write into) or has
    /// begun before it is started, and then it is not. Registering after the start would leave
    /// a gap in which a cleanup removes the directories while the child, not yet known,
    /// recreates its own (a server creates its data directory as it starts), or the driver
    /// exits with the child still running.
    pub fn spawn(command: &mut std::process::Command) -> std::io::Result<ChildProcess> {
        let (child, registered) = spawn_registered(command)?;
        Ok(ChildProcess {
            child,
            registered: Some(registered),
        })
    }

    /// Run `command` to its end as [`Command::output`](std::process::Command::output) does
    /// (stdin closed, stdout and stderr collected), registered meanwhile: a command the driver
    /// runs against a server's data directory (`cubed tenant …`) is stopped with the server
    /// instead of outliving the cleanup, or opening the data directory offline once the server
    /// is gone.
    pub fn output(command: &mut std::process::Command) -> std::io::Result<std::process::Output> {
        use std::process::Stdio;
        command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let (child, registered) = spawn_registered(command)?;
        let output = child.wait_with_output();
        // Unregistered once reaped, as `wait` does.
        drop(registered);
        output
    }

    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Its stdout, if piped and not taken yet.
    pub fn take_stdout(&mut self) -> Option<std::process::ChildStdout> {
        self.child.stdout.take()
    }

    pub fn kill(&mut self) -> std::io::Result<()> {
        self.child.kill()
    }

    /// Its exit status if it has exited (reaped then, and no longer registered).
    pub fn try_wait(&mut self) -> std::io::Result<Option<std::process::ExitStatus>> {
        let status = self.child.try_wait()?;
        if status.is_some() {
            self.registered = None;
        }
        Ok(status)
    }

    /// Wait for it to exit (reaped then, and no longer registered).
    pub fn wait(&mut self) -> std::io::Result<std::process::ExitStatus> {
        let status = self.child.wait()?;
        self.registered = None;
        Ok(status)
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.wait();
    }
}

/// [`ChildProcess::spawn`]'s start and registration, under the registry's lock.
fn spawn_registered(
    command: &mut std::process::Command,
) -> std::io::Result<(std::process::Child, Registered)> {
    let mut r = registry();
    if r.stopping {
        return Err(std::io::Error::other(
            "not starting a child process: stopped by a signal, cleaning up",
        ));
    }
    let child = command.spawn()?;
    let registered = r.hold(Leftover::Process(child.id()));
    Ok((child, registered))
}

fn pid_of(pid: u32) -> Pid {
    Pid::from_raw(i32::try_from(pid).unwrap_or(i32::MAX))
}

fn kill_pid(pid: u32) {
    let _ = kill(pid_of(pid), Signal::SIGKILL);
}

/// Remove `path` and everything in it. The driver keeps running until the process exits, and
/// may be creating its next round's directories inside `path` while this removes it (which
/// then fails "Directory not empty"): so `path` is first renamed out of the way, after which a
/// directory made under the old name finds no parent (the drivers make directories inside
/// existing parents only, never with `create_dir_all`), and the removal is retried a few times
/// for a creation that was already under way at the rename.
fn remove(path: &Path) {
    let aside = path.file_name().map(|name| {
        let mut aside = name.to_os_string();
        aside.push(format!(".removing-{}", std::process::id()));
        path.with_file_name(aside)
    });
    let target = match aside {
        Some(aside) if std::fs::rename(path, &aside).is_ok() => aside,
        _ => path.to_path_buf(),
    };
    for attempt in 1.. {
        match std::fs::remove_dir_all(&target) {
            Ok(()) => return,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
            Err(e) if e.kind() == std::io::ErrorKind::DirectoryNotEmpty && attempt < 50 => {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Err(e) => {
                eprintln!("could not remove {}: {e}", target.display());
                return;
            }
        }
    }
}

/// How many of each kind [`clean_up`] found registered.
#[derive(Debug, Default, PartialEq, Eq)]
struct Cleaned {
    processes: usize,
    mounts: usize,
    dirs: usize,
}

/// Kill every registered process, wait for each to have exited, undo every registered mount
/// (newest first), then remove every registered directory; from now on, whatever is
/// registered is cleaned up at once.
fn clean_up() -> Cleaned {
    let (processes, mounts, dirs) = {
        let mut r = registry();
        r.stopping = true;
        let held = std::mem::take(&mut r.held);
        let (mut processes, mut mounts, mut dirs) = (Vec::new(), Vec::new(), Vec::new());
        // In registration order (ids grow).
        for what in held.into_values() {
            match what {
                Leftover::Process(pid) => processes.push(pid),
                Leftover::Mount(undo) => mounts.push(undo),
                Leftover::Dir(path) => dirs.push(path),
            }
        }
        // Signalled under the lock: an owner unregisters its child (under this lock) right
        // after reaping it, so a pid here was freed at most those few instructions ago, far too
        // soon for the kernel to hand it to a new process (pids are reused only after wrapping
        // around).
        for &pid in &processes {
            kill_pid(pid);
        }
        (processes, mounts, dirs)
    };
    for &pid in &processes {
        // Wait until it has exited (so it no longer writes into a directory removed below)
        // without reaping it: its owner still does, and may be waiting for it now.
        let _ = waitid(
            Id::Pid(pid_of(pid)),
            WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT,
        );
    }
    let cleaned = Cleaned {
        processes: processes.len(),
        mounts: mounts.len(),
        dirs: dirs.len(),
    };
    // Newest first: a mount made inside an earlier one comes off before it.
    for undo in mounts.into_iter().rev() {
        undo();
    }
    for path in &dirs {
        remove(path);
    }
    cleaned
}

/// On SIGINT, SIGTERM or SIGHUP (each unless the process was started with it ignored, as
/// under `nohup`): clean up what is registered, say so on stderr, and exit with 128 + the
/// signal's number.
/// Call once, inside a tokio runtime, before starting work; call [`wait_if_stopping`] before
/// returning from `main`, so that work that ends because its servers were killed does not
/// exit before the cleanup does.
pub fn clean_up_on_signals() -> std::io::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut streams = Vec::new();
    for (sig, kind) in [
        (Signal::SIGINT, SignalKind::interrupt()),
        (Signal::SIGTERM, SignalKind::terminate()),
        (Signal::SIGHUP, SignalKind::hangup()),
    ] {
        if !ignored(sig) {
            streams.push((sig, signal(kind)?));
        }
    }
    if streams.is_empty() {
        return Ok(());
    }
    let (arrived, mut first) = tokio::sync::mpsc::channel(1);
    for (sig, mut stream) in streams {
        let arrived = arrived.clone();
        tokio::spawn(async move {
            if stream.recv().await.is_some() {
                let _ = arrived.send(sig).await;
            }
        });
    }
    tokio::spawn(async move {
        let Some(sig) = first.recv().await else {
            return;
        };
        // The cleanup blocks (kill, wait, remove): off the runtime's workers.
        let Cleaned {
            processes,
            mounts,
            dirs,
        } = tokio::task::spawn_blocking(clean_up)
            .await
            .unwrap_or_default();
        eprintln!(
            "stopped by {sig}: killed {processes} child process(es), undid {mounts} mount(s) \
             and removed {dirs} temporary director(ies)"
        );
        die_of(sig);
    });
    Ok(())
}

/// If a signal has started the cleanup, wait for it: it ends the process.
pub fn wait_if_stopping() {
    if registry().stopping {
        loop {
            std::thread::park();
        }
    }
}

/// Whether `sig` is ignored (inherited from the parent, as `nohup` does for SIGHUP).
fn ignored(sig: Signal) -> bool {
    cube_cli::ignored_at_start(sig as i32)
}

/// Exit as a process ended by `sig` is reported: 128 + its number.
fn die_of(sig: Signal) -> ! {
    std::process::exit(128 + sig as i32);
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn a_directory_is_removed_while_something_keeps_making_directories_in_it() {
        let base = tempfile::tempdir().unwrap();
        let path = base.path().join("work");
        std::fs::create_dir(&path).unwrap();
        // The driver going on after a signal: round after round, a directory inside `path`
        // (never recreating `path` itself), until `path` is gone or for 2 s.
        let maker = {
            let path = path.clone();
            std::thread::spawn(move || {
                let until = std::time::Instant::now() + std::time::Duration::from_secs(2);
                let mut made = 0;
                while std::time::Instant::now() < until {
                    match std::fs::create_dir(path.join(format!("round{made}"))) {
                        Ok(()) => made += 1,
                        Err(_) => break,
                    }
                }
                made
            })
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::fs::read_dir(&path).unwrap().count() < 100 {
            assert!(
                std::time::Instant::now() < deadline,
                "the maker made little"
            );
            std::thread::yield_now();
        }
        remove(&path);
        let made = maker.join().unwrap();
        let left: Vec<_> = std::fs::read_dir(base.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert!(
            left.is_empty(),
            "left behind {left:?} (the maker made {made} directories)"
        );
    }

    // The registry is global: this is the only test of this crate that touches it.
    #[test]
    fn what_is_registered_is_cleaned_up_and_what_is_registered_later_at_once() {
        let base = tempfile::tempdir().unwrap();
        let held = base.path().join("held");
        let released = base.path().join("released");
        let later = base.path().join("later");
        for d in [&held.join("inside"), &released, &later] {
            std::fs::create_dir_all(d).unwrap();
        }
        let sleep = || ChildProcess::spawn(std::process::Command::new("sleep").arg("600"));
        let mut child = sleep().unwrap();
        let _dir = dir(&held);
        drop(dir(&released));
        // Each undo notes what it saw: whether the child had exited and the held directory
        // was still there.
        type Seen = Vec<(&'static str, bool, bool)>;
        let seen: Arc<Mutex<Seen>> = Arc::default();
        let pid = child.id();
        let note = |name: &'static str| {
            let (seen, held) = (seen.clone(), held.clone());
            move || {
                let exited = !matches!(
                    waitid(
                        Id::Pid(pid_of(pid)),
                        WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT | WaitPidFlag::WNOHANG,
                    ),
                    Ok(nix::sys::wait::WaitStatus::StillAlive)
                );
                seen.lock().unwrap().push((name, exited, held.exists()));
            }
        };
        let _outer = mount(note("outer"));
        let _inner = mount(note("inner"));
        drop(mount(note("released")));
        assert_eq!(
            clean_up(),
            Cleaned {
                processes: 1,
                mounts: 2,
                dirs: 1
            }
        );
        assert_eq!(
            *seen.lock().unwrap(),
            [("inner", true, true), ("outer", true, true)],
            "mounts are undone newest first, after the processes exit, before the directories go"
        );
        assert!(!held.exists(), "a registered directory was left");
        assert!(released.exists(), "a released directory was removed");
        // Killed, and left for its owner to reap.
        let status = child.wait().unwrap();
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(Signal::SIGKILL as i32)
        );
        // Once stopping, a directory is removed as it is registered, and a process or a
        // mount is refused (nothing started or mounted yet, so nothing killed or undone).
        let _late = dir(&later);
        assert!(!later.exists(), "a directory registered late was left");
        assert!(sleep().is_err(), "a process may not start once stopping");
        assert!(
            mount(note("late")).is_none(),
            "a mount may not start once stopping"
        );
        assert_eq!(seen.lock().unwrap().len(), 2, "a refused mount's undo ran");
    }
}
