//! cube-testkit: run a real `cubed` child process on port 0 with a temporary data directory,
//! kill it (SIGKILL or SIGTERM), restart it on the same data, and talk to it with signed clients.

use std::fs;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use cube_api::v1::cells_client::CellsClient;
use cube_auth::client::{CallSigner, Signing};
use cube_auth::{CallSignature, Credentials, headers};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tonic::metadata::MetadataValue;
use tonic::transport::{Channel, Endpoint};

pub mod interrupt;

/// A Cells client that signs every call.
pub type SignedCells = CellsClient<Signing<Channel>>;

/// The response header carrying Region's next page token (docs/protocol.md, "Region: paging
/// through a box").
pub const NEXT_PAGE_TOKEN: &str = "x-cube-next-page-token-bin";

/// Whether servers and commands started here see this process's `CUBE_*` variables (cubed
/// reads each as a flag). Off unless [`inherit_cube_env`] was called: a test's server must not
/// take a developer's `CUBE_NO_DEMO`, `CUBE_AUTH_MODE` or `CUBE_CONFIG` for its own.
static INHERIT_CUBE_ENV: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Let the servers and commands this process starts see its `CUBE_*` variables: for the load
/// and durability tools, whose users set server flags that way (`CUBE_CALL_TIMEOUT_MS=… cube-load
/// bench`).
pub fn inherit_cube_env() {
    INHERIT_CUBE_ENV.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// A command for `program` (cubed, or a shell that runs it) without this process's `CUBE_*`
/// variables, as the servers started here: for tests that start cubed themselves.
pub fn command(program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut command = Command::new(program);
    cube_env_cleared(&mut command);
    command
}

/// `command` without this process's `CUBE_*` variables, unless [`inherit_cube_env`] was called.
fn cube_env_cleared(command: &mut Command) -> &mut Command {
    if !INHERIT_CUBE_ENV.load(std::sync::atomic::Ordering::Relaxed) {
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("CUBE_") {
                command.env_remove(name);
            }
        }
    }
    command
}

/// Every cell of the inclusive box `[min, max]`, following Region's page tokens, `page` cells
/// per call; over any connection, as [`region_for_each`].
pub async fn region_all<T>(
    c: &mut CellsClient<T>,
    min: cube_api::v1::Coord,
    max: cube_api::v1::Coord,
    page: u32,
) -> Result<Vec<cube_api::v1::Cell>, tonic::Status>
where
    T: tonic::client::GrpcService<tonic::body::Body>,
    T::Error: Into<tonic::codegen::StdError>,
    T::ResponseBody: tonic::codegen::Body<Data = tonic::codegen::Bytes> + Send + 'static,
    <T::ResponseBody as tonic::codegen::Body>::Error: Into<tonic::codegen::StdError> + Send,
{
    let mut out = Vec::new();
    region_for_each(c, min, max, page, |cell| out.push(cell)).await?;
    Ok(out)
}

/// Hand every cell of the inclusive box `[min, max]` to `f`, in Region's order, following its
/// page tokens, `page` cells per call; over any connection (signed or handshake-authenticated).
pub async fn region_for_each<T>(
    c: &mut CellsClient<T>,
    min: cube_api::v1::Coord,
    max: cube_api::v1::Coord,
    page: u32,
    mut f: impl FnMut(cube_api::v1::Cell),
) -> Result<(), tonic::Status>
where
    T: tonic::client::GrpcService<tonic::body::Body>,
    T::Error: Into<tonic::codegen::StdError>,
    T::ResponseBody: tonic::codegen::Body<Data = tonic::codegen::Bytes> + Send + 'static,
    <T::ResponseBody as tonic::codegen::Body>::Error: Into<tonic::codegen::StdError> + Send,
{
    let mut token = Vec::new();
    loop {
        let resp = c
            .region(cube_api::v1::RegionRequest {
                min: Some(min),
                max: Some(max),
                limit: page,
                page_token: token,
            })
            .await?;
        let next = resp
            .metadata()
            .get_bin(NEXT_PAGE_TOKEN)
            .and_then(|v| v.to_bytes().ok())
            .map(|b| b.to_vec());
        let mut stream = resp.into_inner();
        while let Some(cell) = stream.message().await? {
            f(cell);
        }
        match next {
            Some(t) if !t.is_empty() => token = t,
            _ => return Ok(()),
        }
    }
}

const READY_PREFIX: &str = "cubed ready: grpc=";
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// A running (or stopped) cubed process and its data directory.
pub struct TestServer {
    bin: PathBuf,
    /// Unregistered before `root` is removed (fields drop in order).
    _root_registered: interrupt::Registered,
    root: tempfile::TempDir,
    /// The data directory: `<root>/data` unless started with [`TestServer::start_at`].
    data: PathBuf,
    extra_args: Vec<String>,
    /// Environment of the next start (e.g. `CUBE_FAILPOINT`).
    env: Vec<(String, String)>,
    child: Option<interrupt::ChildProcess>,
    starts: u32,
    /// Address of the gRPC listener of the current process.
    pub addr: SocketAddr,
    /// Address of its admin HTTP listener (/metrics, /healthz, /readyz).
    pub admin_addr: SocketAddr,
    /// Credentials of the demo tenant.
    pub demo: Credentials,
}

impl TestServer {
    /// Start `bin` (the cubed binary) on a fresh data directory.
    pub fn start(bin: &Path) -> anyhow::Result<TestServer> {
        Self::start_with(bin, &[])
    }

    /// Start with extra `cubed serve` flags.
    pub fn start_with(bin: &Path, extra_args: &[&str]) -> anyhow::Result<TestServer> {
        Self::start_with_env(bin, extra_args, &[])
    }

    pub fn data_dir(&self) -> PathBuf {
        self.data.clone()
    }

    /// The WAL segment of `tenant` that starts at `first_seq`, if there is one, found with the
    /// server's own layout functions (tests never spell the on-disk layout out themselves).
    pub fn wal_segment(&self, tenant: &str, first_seq: u64) -> anyhow::Result<Option<PathBuf>> {
        let dir = self.wal_dir(tenant);
        cube_wal::find_segment(&dir, first_seq)
            .with_context(|| format!("listing {}", dir.display()))
    }

    /// The WAL directory of `tenant`.
    pub fn wal_dir(&self, tenant: &str) -> PathBuf {
        cube_store::DataDir::new(self.data_dir()).tenant_wal(tenant)
    }

    fn log_path(&self) -> PathBuf {
        self.root.path().join(format!("cubed-{}.log", self.starts))
    }

    fn spawn(&mut self) -> anyhow::Result<()> {
        self.starts += 1;
        let log = fs::File::create(self.log_path())?;
        let mut command = Command::new(&self.bin);
        cube_env_cleared(&mut command)
            .arg("serve")
            .arg("--data-dir")
            .arg(self.data_dir())
            .args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
            .args(&self.extra_args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::piped())
            .stderr(log)
            .stdin(Stdio::null());
        let mut child = interrupt::ChildProcess::spawn(&mut command)
            .with_context(|| format!("spawning {}", self.bin.display()))?;
        let stdout = child.take_stdout().context("no stdout")?;
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(rest) = line.strip_prefix(READY_PREFIX) {
                    let addr = rest
                        .split_whitespace()
                        .next()
                        .unwrap_or_default()
                        .to_string();
                    let admin = rest
                        .split_whitespace()
                        .find_map(|f| f.strip_prefix("admin="))
                        .unwrap_or_default()
                        .to_string();
                    let _ = tx.send((addr, admin));
                }
            }
        });
        self.child = Some(child);
        let (addr, admin) = match rx.recv_timeout(START_TIMEOUT) {
            Ok(a) => a,
            Err(_) => bail!("cubed did not become ready; log:\n{}", self.log()),
        };
        self.addr = addr
            .parse()
            .with_context(|| format!("bad ready address {addr:?}"))?;
        self.admin_addr = admin
            .parse()
            .with_context(|| format!("bad admin address {admin:?}"))?;
        let creds = fs::read_to_string(self.data_dir().join("dev-credentials.json"))?;
        self.demo = serde_json::from_str(&creds)?;
        Ok(())
    }

    /// The current process's log (stderr).
    pub fn log(&self) -> String {
        fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(interrupt::ChildProcess::id)
    }

    /// SIGKILL the server and reap it. An error if it had already exited by itself: a crash
    /// (or a stop) that the kill would hide, and that a crash test must not take for its own
    /// kill.
    pub fn kill9(&mut self) -> anyhow::Result<()> {
        if let Some(mut child) = self.child.take() {
            child.kill()?;
            let status = child.wait()?;
            anyhow::ensure!(
                std::os::unix::process::ExitStatusExt::signal(&status)
                    == Some(Signal::SIGKILL as i32),
                "the server had exited by itself ({status}) before it was killed; log:\n{}",
                self.log()
            );
        }
        Ok(())
    }

    /// SIGTERM the server and wait for it to exit.
    pub fn sigterm(&mut self) -> anyhow::Result<ExitStatus> {
        self.stop_with(Signal::SIGTERM)
    }

    /// Send the server `signal` and wait for it to exit (SIGKILL after 60 s).
    pub fn stop_with(&mut self, signal: Signal) -> anyhow::Result<ExitStatus> {
        // Registered until reaped: a driver stopped during the drain still kills it.
        let child = self.child.as_mut().context("server is not running")?;
        kill(Pid::from_raw(child.id() as i32), signal)?;
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let child = self.child.as_mut().context("server is not running")?;
            if let Some(status) = child.try_wait()? {
                self.child = None;
                return Ok(status);
            }
            if std::time::Instant::now() > deadline {
                // Exited just now, or killed: either way it took too long.
                let _ = self.kill9();
                bail!("cubed did not exit within 60 s of {signal}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Start on a fresh data directory with `env` set for the first start only (restarts run
    /// without it), e.g. to arm a `CUBE_FAILPOINT`.
    pub fn start_with_env(
        bin: &Path,
        extra_args: &[&str],
        env: &[(&str, &str)],
    ) -> anyhow::Result<TestServer> {
        Self::start_full(bin, None, extra_args, env)
    }

    /// Start with the data directory at `data_dir` (a file system of the caller's choosing:
    /// a small one that fills up, a loop device), which may already hold data.
    pub fn start_at(
        bin: &Path,
        data_dir: &Path,
        extra_args: &[&str],
    ) -> anyhow::Result<TestServer> {
        Self::start_full(bin, Some(data_dir), extra_args, &[])
    }

    fn start_full(
        bin: &Path,
        data_dir: Option<&Path>,
        extra_args: &[&str],
        env: &[(&str, &str)],
    ) -> anyhow::Result<TestServer> {
        let root = tempfile::tempdir()?;
        let data = data_dir.map_or_else(|| root.path().join("data"), Path::to_path_buf);
        let mut server = TestServer {
            bin: bin.to_path_buf(),
            _root_registered: interrupt::dir(root.path()),
            root,
            data,
            extra_args: extra_args.iter().map(|s| s.to_string()).collect(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            child: None,
            starts: 0,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            admin_addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            demo: Credentials {
                tenant: String::new(),
                key_id: String::new(),
                secret: String::new(),
                endpoint: None,
            },
        };
        server.spawn()?;
        server.env.clear();
        Ok(server)
    }

    /// Wait up to `timeout` for the server to exit on its own (a failpoint's abort); None if it
    /// is still running then.
    pub fn wait_exit(&mut self, timeout: Duration) -> anyhow::Result<Option<ExitStatus>> {
        let deadline = std::time::Instant::now() + timeout;
        let Some(child) = self.child.as_mut() else {
            bail!("server is not running");
        };
        loop {
            if let Some(status) = child.try_wait()? {
                self.child = None;
                return Ok(Some(status));
            }
            if std::time::Instant::now() > deadline {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The local admin socket (from the server's layout functions).
    pub fn admin_socket(&self) -> PathBuf {
        cube_store::DataDir::new(self.data_dir()).admin_socket()
    }

    /// The value of the first `/metrics` sample whose line starts with `prefix` (a name, or a
    /// name with its labels), scraped now.
    pub fn metric(&self, prefix: &str) -> Option<f64> {
        let (_, text) = admin_get(self.admin_addr, "/metrics").ok()?;
        metric_sample(&text, prefix)
    }

    /// The metric `prefix` once `ready` holds for it, polled every 50 ms for up to `within`;
    /// `Err` with the last value seen after that. For states the server reaches by itself (a
    /// tenant passivated, a background open), so that a test waits as long as the machine needs
    /// and no longer, instead of sleeping a guess.
    pub async fn metric_when(
        &self,
        prefix: &str,
        within: Duration,
        ready: impl Fn(f64) -> bool,
    ) -> Result<f64, Option<f64>> {
        let deadline = std::time::Instant::now() + within;
        loop {
            let seen = self.metric(prefix);
            match seen {
                Some(v) if ready(v) => return Ok(v),
                _ if std::time::Instant::now() >= deadline => return Err(seen),
                _ => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }

    /// The state-store directory of `tenant` (from the server's layout functions).
    pub fn tenant_state_dir(&self, tenant: &str) -> PathBuf {
        cube_store::DataDir::new(self.data_dir()).tenant_state(tenant)
    }

    /// The write-ahead-log directory of `tenant` (from the server's layout functions).
    pub fn tenant_wal_dir(&self, tenant: &str) -> PathBuf {
        cube_store::DataDir::new(self.data_dir()).tenant_wal(tenant)
    }

    /// What an attacker with disk access would do, on a stopped server: in the first record of
    /// `tenant`'s first WAL segment that holds `find`, write `replace` (as long) over it, fix
    /// the record's CRC so that the WAL's own checks pass, and remove the tenant's state store
    /// so that the next start rebuilds it from the edited log. Only the audit chain can tell.
    pub fn tamper_wal(&self, tenant: &str, find: &[u8], replace: &[u8]) -> anyhow::Result<()> {
        if self.child.is_some() {
            bail!("server is still running");
        }
        anyhow::ensure!(
            !find.is_empty() && find.len() == replace.len(),
            "find must not be empty, and replace must be as long"
        );
        let seg = self
            .wal_segment(tenant, 1)?
            .with_context(|| format!("{tenant} has no first wal segment"))?;
        let mut bytes = fs::read(&seg)?;
        let (payload, at) = wal_record_payloads(&bytes)
            .into_iter()
            .find_map(|p| {
                let at = bytes[p.clone()]
                    .windows(find.len())
                    .position(|w| w == find)?;
                Some((p.clone(), p.start + at))
            })
            .with_context(|| format!("no record of {tenant}'s first segment holds the bytes"))?;
        bytes[at..at + replace.len()].copy_from_slice(replace);
        fix_wal_crc(&seg, &mut bytes, payload)?;
        fs::write(&seg, bytes)?;
        fs::remove_dir_all(self.tenant_state_dir(tenant))?;
        Ok(())
    }

    /// Start again on the same data directory (after a kill or stop).
    pub fn restart(&mut self) -> anyhow::Result<()> {
        if self.child.is_some() {
            bail!("server is still running");
        }
        self.spawn()
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A plain channel to the server.
    pub async fn channel(&self) -> anyhow::Result<Channel> {
        self.channel_from(None).await
    }

    /// A plain channel to the server from the local address `local` (any loopback address
    /// reaches a server on 127.0.0.1), or one the system picks.
    pub async fn channel_from(&self, local: Option<std::net::IpAddr>) -> anyhow::Result<Channel> {
        Ok(Endpoint::from_shared(self.endpoint())?
            .tcp_nodelay(true)
            .local_address(local)
            .connect()
            .await?)
    }

    /// A TLS channel (the server must run with `--tls-dev` or TLS files signed by the data
    /// directory's CA), optionally presenting a client certificate (PEM cert, PEM key).
    pub async fn tls_channel(&self, client_cert: Option<(&str, &str)>) -> anyhow::Result<Channel> {
        use tonic::transport::{Certificate, ClientTlsConfig, Identity};
        let ca = fs::read_to_string(self.data_dir().join("tls/ca.pem"))?;
        let mut tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(ca))
            .domain_name("localhost");
        if let Some((cert, key)) = client_cert {
            tls = tls.identity(Identity::from_pem(cert, key));
        }
        Ok(Endpoint::from_shared(format!("https://{}", self.addr))?
            .tls_config(tls)?
            .connect()
            .await?)
    }

    /// A new connection whose every call is signed as `creds` (for any generated client).
    pub async fn signed(&self, creds: &Credentials) -> anyhow::Result<Signing<Channel>> {
        self.signed_from(creds, None).await
    }

    /// [`TestServer::signed`] from the local address `local` (or one the system picks).
    async fn signed_from(
        &self,
        creds: &Credentials,
        local: Option<std::net::IpAddr>,
    ) -> anyhow::Result<Signing<Channel>> {
        let signer = CallSigner::new(&creds.tenant, &creds.key_id, creds.secret()?);
        Ok(Signing::new(self.channel_from(local).await?, signer))
    }

    /// A Cells client signing as `creds`.
    pub async fn cells(&self, creds: &Credentials) -> anyhow::Result<SignedCells> {
        Ok(CellsClient::new(self.signed(creds).await?))
    }

    /// A Cells client signing as `creds`, on a new connection from the local address `local`.
    pub async fn cells_from(
        &self,
        creds: &Credentials,
        local: std::net::IpAddr,
    ) -> anyhow::Result<SignedCells> {
        Ok(CellsClient::new(
            self.signed_from(creds, Some(local)).await?,
        ))
    }

    /// A Cells client on a new connection authenticated once with the handshake.
    pub async fn cells_on_connection(
        &self,
        creds: &Credentials,
    ) -> anyhow::Result<CellsClient<Channel>> {
        let channel = self.channel().await?;
        cube_auth::client::handshake(channel.clone(), creds).await?;
        Ok(CellsClient::new(channel))
    }

    /// `cubed key cert demo KEY_ID --out OUT`: the paths of the client certificate and its key.
    pub fn demo_key_cert(&self, key_id: &str, out: &Path) -> anyhow::Result<(PathBuf, PathBuf)> {
        let out_arg = out.to_string_lossy();
        let o = self.cli(&["key", "cert", "demo", key_id, "--out", &out_arg])?;
        if !o.status.success() {
            bail!("key cert failed: {}", String::from_utf8_lossy(&o.stderr));
        }
        let v: serde_json::Value = serde_json::from_slice(&o.stdout)?;
        let path = |field: &str| {
            v[field]
                .as_str()
                .map(PathBuf::from)
                .ok_or_else(|| anyhow::anyhow!("key cert printed no {field:?}"))
        };
        Ok((path("cert")?, path("key")?))
    }

    /// Run `cubed ARGS --data-dir <this server's data dir>` (a child process registered with
    /// [`interrupt`] while it runs).
    pub fn cli(&self, args: &[&str]) -> anyhow::Result<Output> {
        Ok(interrupt::ChildProcess::output(
            cube_env_cleared(&mut Command::new(&self.bin))
                .args(args)
                .arg("--data-dir")
                .arg(self.data_dir()),
        )?)
    }

    /// `cubed tenant create NAME`, parsed.
    pub fn create_tenant(&self, name: &str) -> anyhow::Result<Credentials> {
        let out = self.cli(&["tenant", "create", name])?;
        if !out.status.success() {
            bail!(
                "tenant create failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(serde_json::from_slice(&out.stdout)?)
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        let _ = self.kill9();
    }
}

/// `GET http://<admin>/<path>` with a plain HTTP/1.1 request: (status code, body).
pub fn admin_get(admin: SocketAddr, path: &str) -> anyhow::Result<(u16, String)> {
    admin_request(admin, "GET", path)
}

/// [`admin_get`] with another HTTP method.
pub fn admin_request(admin: SocketAddr, method: &str, path: &str) -> anyhow::Result<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(admin)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: cube\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = String::new();
    s.read_to_string(&mut raw)?;
    let status = raw
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .context("no HTTP status")?;
    let body = raw
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((status, body))
}

/// The value of the first sample in a Prometheus text exposition whose line starts with `prefix`.
pub fn metric_sample(text: &str, prefix: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// Current unix time in milliseconds.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Put hand-made per-call metadata on `req` (for tests of the auth layer's refusals).
pub fn sign_manually<T>(
    req: &mut tonic::Request<T>,
    creds: &Credentials,
    signed_path: &str,
    ts_ms: i64,
    nonce: &str,
) -> anyhow::Result<()> {
    let call = CallSignature::sign_with_nonce(
        &creds.secret()?,
        signed_path,
        &creds.tenant,
        &creds.key_id,
        ts_ms,
        nonce.to_string(),
    );
    let md = req.metadata_mut();
    md.insert(
        headers::TENANT,
        MetadataValue::try_from(call.tenant.as_str())?,
    );
    md.insert(headers::KEY, MetadataValue::try_from(call.key_id.as_str())?);
    md.insert(
        headers::TS,
        MetadataValue::try_from(call.ts_ms.to_string())?,
    );
    md.insert(
        headers::NONCE,
        MetadataValue::try_from(call.nonce.as_str())?,
    );
    md.insert(headers::SIG, MetadataValue::try_from(call.sig.as_str())?);
    Ok(())
}

/// Payload ranges of the records in a WAL segment's bytes (framing `len u32 | crc32c u32 |
/// seq u64 | payload`, docs/durability.md), up to the first zero header.
pub fn wal_record_payloads(bytes: &[u8]) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let mut off = 0;
    while off + 16 <= bytes.len() {
        let len = u32::from_le_bytes([bytes[off], bytes[off + 1], bytes[off + 2], bytes[off + 3]])
            as usize;
        if len == 0 || off + 16 + len > bytes.len() {
            break;
        }
        out.push(off + 16..off + 16 + len);
        off += 16 + len;
    }
    out
}

/// Recompute the CRC of the record whose payload is `payload` after an in-place edit of
/// `bytes`, read from the WAL segment file `segment` (whose name holds the salt the CRC is
/// XORed with): what an attacker with disk access would do to hide a change from the WAL's own
/// checks.
pub fn fix_wal_crc(
    segment: &Path,
    bytes: &mut [u8],
    payload: std::ops::Range<usize>,
) -> anyhow::Result<()> {
    let salt = segment
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(cube_wal::SegmentName::parse)
        .with_context(|| format!("{} is not a wal segment", segment.display()))?
        .salt;
    let start = payload.start - 16;
    let mut crc = crc32c::crc32c(&bytes[start..start + 4]);
    crc = crc32c::crc32c_append(crc, &bytes[start + 8..start + 16]);
    crc = crc32c::crc32c_append(crc, &bytes[payload]);
    bytes[start + 4..start + 8].copy_from_slice(&(crc ^ salt).to_le_bytes());
    Ok(())
}
