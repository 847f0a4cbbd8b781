//! File systems the harness puts a server's data directory on: a small tmpfs that fills up
//! (scenario E) and an ext4 image on a loop device whose power can be "cut" (scenario D). Both
//! need root; each is undone on drop.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use anyhow::{Context, bail};

fn run(cmd: &str, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .with_context(|| format!("running {cmd}"))?;
    if !out.status.success() {
        bail!(
            "{cmd} {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Why the tmpfs scenario cannot run here, if it cannot: tried with a 1 MiB tmpfs (root in a
/// container without the right to mount is refused there).
pub fn tmpfs_unsupported() -> Option<String> {
    if let Some(why) = missing(&["mount", "umount", "df"]) {
        return Some(why);
    }
    let probe = match tempfile::tempdir() {
        Ok(dir) => dir,
        Err(e) => return Some(format!("no temporary directory for a mount probe: {e}")),
    };
    let _probe_registered = cube_testkit::interrupt::dir(probe.path());
    match Mount::tmpfs(probe.path(), 1 << 20) {
        Ok(mount) => {
            drop(mount);
            None
        }
        Err(e) => Some(format!("cannot mount a tmpfs here: {e:#}")),
    }
}

/// Why root or one of `tools` is missing, if one is.
fn missing(tools: &[&str]) -> Option<String> {
    if run("id", &["-u"]).ok().as_deref() != Some("0") {
        return Some(format!("needs root ({})", tools.join(", ")));
    }
    tools.iter().find_map(|tool| {
        run("sh", &["-c", &format!("command -v {tool}")])
            .is_err()
            .then(|| format!("{tool} is not installed"))
    })
}

/// Why the loop-device scenario cannot run here, if it cannot.
pub fn loop_unsupported() -> Option<String> {
    if let Some(why) = missing(&["losetup", "mkfs.ext4", "mount", "umount", "cp"]) {
        return Some(why);
    }
    if !Path::new("/dev/loop-control").exists() {
        return Some("no /dev/loop-control (loop devices unavailable)".into());
    }
    None
}

/// Create the directory `path` (fine if it exists) inside its existing parent. Never
/// `create_dir_all` under the work directory: after a signal's cleanup has removed that, the
/// harness keeps running until the process exits, and must not make it again.
pub fn make_dir(path: &Path) -> anyhow::Result<()> {
    match std::fs::create_dir(path) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
            Err(e).with_context(|| format!("creating {}", path.display()))
        }
        _ => Ok(()),
    }
}

/// A mounted file system, unmounted (and its loop device detached) on drop, or by
/// `cube_testkit::interrupt` if the harness is stopped by a signal.
pub struct Mount {
    pub dir: PathBuf,
    /// The image behind the loop device, if on one.
    image: Option<PathBuf>,
    /// Held while mounting and while unmounting, by the owner and by a signal's cleanup alike:
    /// the cleanup waits for a mount or an unmount in progress instead of running beside it.
    busy: Arc<Mutex<()>>,
    registered: Option<cube_testkit::interrupt::Registered>,
}

fn hold(lock: &Mutex<()>) -> MutexGuard<'_, ()> {
    lock.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Mount {
    /// Registered for a signal's cleanup, then `attach` (which mounts at `dir`, from `image` if
    /// given) run under the mount's lock, so a signal arriving half-way is undone once the
    /// mount is complete. Refused when the harness is being stopped.
    fn attached(
        dir: &Path,
        image: Option<&Path>,
        attach: impl FnOnce() -> anyhow::Result<()>,
    ) -> anyhow::Result<Mount> {
        let busy = Arc::new(Mutex::new(()));
        let mounting = hold(&busy);
        let undo = {
            let (busy, d, i) = (
                Arc::clone(&busy),
                dir.to_path_buf(),
                image.map(Path::to_path_buf),
            );
            move || {
                let _unmounting = hold(&busy);
                unmount(&d, i.as_deref());
            }
        };
        let registered = cube_testkit::interrupt::mount(undo)
            .context("not mounting: the harness is being stopped")?;
        let mount = Mount {
            dir: dir.to_path_buf(),
            image: image.map(Path::to_path_buf),
            busy: Arc::clone(&busy),
            registered: Some(registered),
        };
        let result = attach();
        drop(mounting);
        // On an error, `mount`'s drop undoes what was done (unmount and detach tolerate what
        // is not there).
        result.map(|()| mount)
    }

    /// A tmpfs of `bytes` at `dir`.
    pub fn tmpfs(dir: &Path, bytes: u64) -> anyhow::Result<Mount> {
        make_dir(dir)?;
        let d = dir.to_string_lossy();
        Mount::attached(dir, None, || {
            run(
                "mount",
                &["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs", &d],
            )
            .map(drop)
        })
    }

    /// Format `image` (created sparse, `bytes` long) as ext4 if `format`, attach it to a loop
    /// device and mount it at `dir`.
    pub fn ext4_image(image: &Path, bytes: u64, format: bool, dir: &Path) -> anyhow::Result<Mount> {
        let img = image.to_string_lossy();
        if format {
            let f = std::fs::File::create(image)?;
            f.set_len(bytes)?;
            run("mkfs.ext4", &["-q", "-F", &img])?;
        }
        make_dir(dir)?;
        Mount::attached(dir, Some(image), || {
            let device = run("losetup", &["-f", "--show", &img])?;
            run("mount", &[&device, &dir.to_string_lossy()]).map(drop)
        })
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        {
            // A signal's cleanup arriving now waits for this, then finds nothing to undo.
            let _unmounting = hold(&self.busy);
            unmount(&self.dir, self.image.as_deref());
        }
        self.registered = None;
    }
}

/// Unmount `dir` (lazily if it is busy) and detach every loop device backed by `image`;
/// quietly does nothing where nothing is mounted or attached.
fn unmount(dir: &Path, image: Option<&Path>) {
    let d = dir.to_string_lossy().to_string();
    if run("umount", &[&d]).is_err() {
        let _ = run("umount", &["-l", &d]);
    }
    if let Some(image) = image {
        // `losetup -j IMAGE` lists the devices backed by it, one per line: "/dev/loop3: [...]".
        let attached = run("losetup", &["-j", &image.to_string_lossy()]).unwrap_or_default();
        for device in attached.lines().filter_map(|l| l.split(':').next()) {
            let _ = run("losetup", &["-d", device.trim()]);
        }
    }
}

/// Copy the image as the device holds it now: what reached the block device survives, what
/// still sat in the mounted file system's page cache does not. This copy is the power cut.
pub fn snapshot(image: &Path, to: &Path) -> anyhow::Result<()> {
    run(
        "cp",
        &[
            "--sparse=always",
            &image.to_string_lossy(),
            &to.to_string_lossy(),
        ],
    )?;
    Ok(())
}

/// Free bytes of the file system holding `dir`.
pub fn free_bytes(dir: &Path) -> anyhow::Result<u64> {
    let out = run("df", &["-B1", "--output=avail", &dir.to_string_lossy()])?;
    out.lines()
        .last()
        .and_then(|l| l.trim().parse().ok())
        .context("parsing df's output")
}
