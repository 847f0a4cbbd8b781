//! The peer servers (etcd, Redis) as child processes: finding their binaries, free loopback
//! ports, and a handle that kills the process when dropped, so no run leaves one behind.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

const INSTALL_HINT: &str = "install it with `apt-get install etcd-server redis-server` (Debian/Ubuntu), pass its path (--etcd-bin / --redis-bin), or leave it out with --peers (e.g. --peers disk,echo,cube,sqlite)";

/// `bin` as given if it is a path, else looked up on PATH (then in /usr/bin and /usr/sbin, where
/// Debian puts them even when PATH is minimal).
pub fn find_binary(bin: &Path, what: &str) -> anyhow::Result<PathBuf> {
    if bin.components().count() > 1 {
        if bin.is_file() {
            return Ok(bin.to_path_buf());
        }
        bail!("{what} not found at {}: {INSTALL_HINT}", bin.display());
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/bin"), PathBuf::from("/usr/sbin")])
        .map(|d| d.join(bin))
        .find(|p| p.is_file())
        .with_context(|| format!("{what} not found on PATH: {INSTALL_HINT}"))
}

/// The first line of `bin ARG` (its version), or what went wrong.
pub fn version(bin: &Path, arg: &str) -> String {
    match Command::new(bin).arg(arg).output() {
        Ok(out) => String::from_utf8_lossy(&out.stdout)
            .lines()
            .next()
            .unwrap_or("?")
            .trim()
            .to_string(),
        Err(e) => format!("unknown ({e})"),
    }
}

/// A free loopback port: bound on port 0 and released (another process could take it in
/// between: [`on_free_ports`] starts the peer again on new ones then).
pub fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Times a peer is started on newly picked ports when a port was taken before it could bind.
const PORT_ATTEMPTS: u32 = 3;
/// Longest one readiness probe may take ([`PeerProcess::wait_ready`]).
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// Run `start` (which picks its ports with [`free_port`]) again, up to [`PORT_ATTEMPTS`] times
/// in all, while it fails because the peer could not bind a port (`address already in use`
/// in its error or log: another process took the port between its pick and the peer's bind).
/// `before_retry` clears what a failed attempt left (a data directory). Any other failure is
/// returned at once.
pub async fn on_free_ports<T, F, Fut>(
    what: &str,
    mut before_retry: impl FnMut(),
    mut start: F,
) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<T>>,
{
    let mut attempt = 1;
    loop {
        match start().await {
            Err(e)
                if attempt < PORT_ATTEMPTS
                    && format!("{e:#}")
                        .to_ascii_lowercase()
                        .contains("address already in use") =>
            {
                eprintln!(
                    "{what}: a port was taken before it could bind; starting it again on other ports"
                );
                before_retry();
                attempt += 1;
            }
            result => return result,
        }
    }
}

/// A running peer server, killed (SIGKILL) and reaped on drop.
pub struct PeerProcess {
    name: &'static str,
    /// Killed and reaped on drop.
    child: cube_testkit::interrupt::ChildProcess,
    log: PathBuf,
}

impl PeerProcess {
    /// Start `cmd` with stdout and stderr going to `log`.
    pub fn spawn(
        name: &'static str,
        mut cmd: Command,
        log: PathBuf,
    ) -> anyhow::Result<PeerProcess> {
        let out =
            std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        cmd.stdout(out.try_clone()?)
            .stderr(out)
            .stdin(Stdio::null());
        Ok(PeerProcess {
            name,
            child: cube_testkit::interrupt::ChildProcess::spawn(&mut cmd)
                .with_context(|| format!("starting {name}"))?,
            log,
        })
    }

    /// Fails if the process has exited, with the end of its log.
    pub fn check_alive(&mut self) -> anyhow::Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!(
                "{} exited ({status}); the end of its log:\n{}",
                self.name,
                self.log_tail()
            );
        }
        Ok(())
    }

    /// The last lines of the process's log.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<_> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// Retry `probe` until it succeeds, the process dies, or `timeout` passes (each probe given
    /// at most [`PROBE_TIMEOUT`]).
    pub async fn wait_ready<F, Fut>(
        &mut self,
        timeout: Duration,
        mut probe: F,
    ) -> anyhow::Result<()>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = anyhow::Result<()>>,
    {
        let deadline = Instant::now() + timeout;
        loop {
            self.check_alive()?;
            // Each probe bounded too: one the port's squatter accepts and never answers would
            // otherwise hold the bench for good.
            let probed = tokio::time::timeout(PROBE_TIMEOUT, probe())
                .await
                .unwrap_or_else(|_| Err(anyhow::anyhow!("no answer within {PROBE_TIMEOUT:?}")));
            match probed {
                Ok(()) => return Ok(()),
                Err(e) if Instant::now() > deadline => {
                    bail!(
                        "{} not ready after {timeout:?}: {e:#}; the end of its log:\n{}",
                        self.name,
                        self.log_tail()
                    )
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A probe that never answers (a squatter on the peer's port that accepts and says
    /// nothing) does not hold the bench past the readiness timeout: it hung for good.
    #[tokio::test]
    async fn a_probe_that_never_answers_ends_at_the_timeout() {
        let dir = tempfile::tempdir().unwrap();
        let mut cmd = Command::new("sleep");
        cmd.arg("30");
        let mut peer = PeerProcess::spawn("peer", cmd, dir.path().join("log")).unwrap();
        let started = Instant::now();
        let waited = peer
            .wait_ready(Duration::from_millis(500), || {
                std::future::pending::<anyhow::Result<()>>()
            })
            .await;
        let e = waited.unwrap_err().to_string();
        assert!(
            e.contains("not ready after") && e.contains("no answer within"),
            "{e}"
        );
        assert!(
            started.elapsed() < PROBE_TIMEOUT * 3,
            "{:?}",
            started.elapsed()
        );
    }

    #[tokio::test]
    async fn a_peer_that_lost_its_port_is_started_again_and_other_failures_are_not_retried() {
        let tries = std::cell::Cell::new(0);
        let cleared = std::cell::Cell::new(0);
        let started = on_free_ports(
            "peer",
            || cleared.set(cleared.get() + 1),
            || {
                tries.set(tries.get() + 1);
                let n = tries.get();
                async move {
                    if n < 3 {
                        bail!("peer exited; the end of its log:\nbind: Address already in use")
                    }
                    Ok(n)
                }
            },
        )
        .await;
        assert_eq!(started.unwrap(), 3);
        assert_eq!(cleared.get(), 2);
        // Always taken, or any other failure: the failure is returned, after PORT_ATTEMPTS
        // attempts or at once.
        for (why, attempts) in [
            (
                "listen tcp 127.0.0.1:1: bind: address already in use",
                PORT_ATTEMPTS,
            ),
            ("not ready after 30s", 1),
        ] {
            let tries = std::cell::Cell::new(0);
            let err = on_free_ports(
                "peer",
                || {},
                || {
                    tries.set(tries.get() + 1);
                    async move { anyhow::Result::<()>::Err(anyhow::anyhow!(why)) }
                },
            )
            .await;
            assert_eq!(err.unwrap_err().to_string(), why);
            assert_eq!(tries.get(), attempts, "{why}");
        }
    }
}
