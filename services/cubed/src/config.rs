//! Command-line flags (also as `CUBE_*` environment variables), converted once into a validated
//! [`ServeConfig`].

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use cube_gateway::{AuthMode, FailureLimits};

pub const DEFAULT_DATA_DIR: &str = "./cube-data";
pub const DEFAULT_LISTEN: &str = "127.0.0.1:50051";
pub const DEFAULT_ADMIN_LISTEN: &str = "127.0.0.1:9464";
pub const DEFAULT_MAX_VALUE_BYTES: usize = 1 << 20;
/// Largest `--max-value-bytes` accepted: a value is held several times in memory while it waits
/// for its fdatasync, and a WAL record's length must fit its 32-bit field.
pub const MAX_VALUE_BYTES: usize = 256 << 20;
/// What one tenant's requests in flight may carry: 64 clients writing 1 MiB values at once.
pub const DEFAULT_MAX_IN_FLIGHT_BYTES: usize = 64 << 20;
pub const DEFAULT_SKEW_SECS: u64 = 300;
/// Largest `--skew-secs`: a wider window only lengthens what a replay or a key's floor covers.
pub const MAX_SKEW_SECS: u64 = 3600;
pub const DEFAULT_REPLAY_CAPACITY: usize = 1_000_000;
pub const DEFAULT_MAILBOX_CAPACITY: usize = 4096;
pub const DEFAULT_MAX_CONCURRENT_STREAMS: u32 = 1024;
pub const DEFAULT_WAL_SEGMENT_MAX_BYTES: u64 = 64 << 20;
pub const DEFAULT_AUTH_FAILURE_LIMIT: u32 = 50;
pub const DEFAULT_AUTH_FAILURE_COOLDOWN_SECS: u64 = 30;
pub const DEFAULT_MAX_METADATA_BYTES: u32 = 16 << 10;
/// Smallest `--max-metadata-bytes` accepted.
pub const MIN_METADATA_BYTES: u32 = 1 << 10;
/// Largest `--max-metadata-bytes` accepted: HTTP/2 buffers a header list up to it before the
/// call is authenticated, on every connection.
pub const MAX_METADATA_BYTES: u32 = 1 << 20;
/// Largest `--wal-segment-max-bytes` accepted: a segment is zero-filled whole when it is made,
/// and a tenant's open reads its log's last segment into memory whole.
pub const MAX_WAL_SEGMENT_BYTES: u64 = 1 << 30;
pub const DEFAULT_AUDIT_RETENTION: usize = 100_000;
pub const DEFAULT_CHECKPOINT_BYTES: u64 = 64 << 20;
pub const DEFAULT_CHECKPOINT_SECS: u64 = 60;
/// The most [`raise_open_file_limit`] raises the soft open-file limit to.
const OPEN_FILES_WANTED: u64 = 1 << 20;

/// An open-file limit below which `cubed serve` warns: a few tenants' state stores (up to 900
/// files each) and the connections could use it all.
pub const LOW_OPEN_FILES: u64 = 4096;

/// The soft open-file limit now, if it is below [`LOW_OPEN_FILES`]: (soft, hard).
pub fn low_open_file_limit() -> Option<(u64, u64)> {
    use nix::sys::resource::{Resource, getrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).ok()?;
    (soft < LOW_OPEN_FILES).then_some((soft, hard))
}

/// Raise the soft open-file limit to the hard one (at most [`OPEN_FILES_WANTED`]), as servers
/// that hold many files do: each open tenant's state store may keep hundreds of files open, and
/// under a soft limit of 1,024 (a common default) one large tenant could take the descriptors
/// another tenant's flush or WAL rotation needs. Returns (before, after) when it raised it.
pub fn raise_open_file_limit() -> Option<(u64, u64)> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).ok()?;
    let wanted = hard.min(OPEN_FILES_WANTED);
    if soft >= wanted {
        return None;
    }
    if let Err(e) = setrlimit(Resource::RLIMIT_NOFILE, wanted, hard) {
        tracing::warn!(soft, hard, error = %e, "could not raise the soft open-file limit to the hard one");
        return None;
    }
    Some((soft, wanted))
}

/// `--max-connections` when not given: half the soft open-file limit, within [64, 16384].
fn default_max_connections() -> usize {
    let soft = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .map_or(1024, |(soft, _)| soft);
    usize::try_from(soft / 2)
        .unwrap_or(usize::MAX)
        .clamp(64, 16384)
}
/// fjall's own default. At 8 MiB, reads at 64 clients of a tenant of ~200,000 cells missed the
/// cache and ran at ~0.65x the gRPC echo ceiling; at 32 MiB, at ~0.97x (docs/benchmarks.md).
pub const DEFAULT_STATE_CACHE_BYTES: u64 = 32 << 20;
/// Writes are refused below this much free space in the data directory's file system.
pub const DEFAULT_MIN_FREE_BYTES: u64 = 256 << 20;
pub const DEFAULT_IDLE_SECS: u64 = 300;
pub const DEFAULT_PREFACE_TIMEOUT_MS: u64 = 10_000;
/// Smallest `--preface-timeout-ms` accepted: below it, a loaded client could miss it.
pub const MIN_PREFACE_TIMEOUT_MS: u64 = 100;
/// Largest `--preface-timeout-ms` accepted (an hour; a deadline must be a representable time).
pub const MAX_PREFACE_TIMEOUT_MS: u64 = 3_600_000;
pub const DEFAULT_KEEPALIVE_SECS: u64 = 60;
/// Off by default: a timer per call cost 7-10% of the 64-client write and read rates on this
/// machine (docs/benchmarks.md, "What a server deadline costs"); gRPC clients set their own.
pub const DEFAULT_CALL_TIMEOUT_MS: u64 = 0;
/// Largest `--call-timeout-ms` accepted (a day).
pub const MAX_CALL_TIMEOUT_MS: u64 = 86_400_000;
/// Smallest `--call-timeout-ms` accepted other than 0.
pub const MIN_CALL_TIMEOUT_MS: u64 = 100;
/// Largest `--keepalive-secs` accepted (a day).
pub const MAX_KEEPALIVE_SECS: u64 = 86_400;
/// Largest `--auth-failure-cooldown-secs`, `--idle-secs` and `--checkpoint-secs` accepted (a
/// day): each is added to the current time, which must stay a representable instant.
pub const MAX_DAY_SECS: u64 = 86_400;
/// How long a graceful stop waits for calls in flight: well inside the 60 s grace period of
/// the deploy files, which also covers syncing and closing the tenants after it.
pub const DEFAULT_DRAIN_SECS: u64 = 20;
pub const DEFAULT_MAX_OPEN_TENANTS: usize = 256;
pub const DEFAULT_REGION_MAX_CELLS: u32 = 10_000;
pub const DEFAULT_WALK_MAX_VISITS: u32 = 10_000;
/// How long a streamed page (Region, Tenant.Audit) may go unread, and the most allowed (a day).
pub const DEFAULT_PAGE_READ_SECS: u64 = 30;
/// Most `--actor-threads`: each is a thread of its own, started at once.
pub const MAX_ACTOR_THREADS: usize = 1024;
pub const MAX_PAGE_READ_SECS: u64 = 86_400;
/// Room for the protobuf framing around a maximal value.
const MESSAGE_OVERHEAD: usize = 64 << 10;
/// Default message cap floor (tonic's own default): values up to here that exceed the value
/// limit get INVALID_ARGUMENT naming the limit; only larger messages meet the transport's cap.
const MIN_DEFAULT_MESSAGE_BYTES: usize = 4 << 20;
/// Default floor of `--max-connection-receive-bytes`: sixteen default-sized messages arriving
/// at once on one connection.
const MIN_DEFAULT_CONNECTION_RECEIVE_BYTES: usize = 64 << 20;
/// Default floor of `--max-connection-send-bytes`, as for receiving.
const MIN_DEFAULT_CONNECTION_SEND_BYTES: usize = 64 << 20;

/// The Cube daemon: a multi-tenant, durable, coordinate-addressed store served over gRPC.
#[derive(Debug, Parser)]
#[command(name = "cubed", version, args_conflicts_with_subcommands = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    /// With no subcommand, cubed serves (same as `cubed serve`).
    #[command(flatten)]
    pub serve: ServeArgs,
}

// Parsed once at start-up; boxing the big variant would only complicate the match in main.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve gRPC (the default).
    Serve(ServeArgs),
    /// Manage tenants (works whether or not the server is running).
    #[command(subcommand)]
    Tenant(TenantCommand),
    /// Manage a tenant's keys (works whether or not the server is running).
    #[command(subcommand)]
    Key(KeyCommand),
}

#[derive(Debug, Subcommand)]
pub enum TenantCommand {
    /// Every tenant, one JSON line each: {"tenant","durability","keys":[{"key_id",
    /// "capabilities"}]}, its active keys in id order (no secrets).
    List {
        #[command(flatten)]
        dir: DataDirArg,
    },
    /// Create a tenant and its first key; prints {"tenant","key_id","secret"} as JSON.
    Create {
        /// `[a-z0-9][a-z0-9-]{0,62}`.
        name: String,
        #[command(flatten)]
        dir: DataDirArg,
    },
    /// Delete a tenant and all its data, for good: its keys stop working and their sessions
    /// end, its cells, log and audit trail are removed, and its name is not given to another
    /// tenant. Prints {"tenant","deleted","key_ids","files_removed"}. Asks for --yes.
    Delete {
        name: String,
        /// Confirm the deletion: it cannot be undone.
        #[arg(long)]
        yes: bool,
        #[command(flatten)]
        dir: DataDirArg,
    },
    /// Set a tenant's durability policy: `sync` (acknowledge after fdatasync, the default) or
    /// `relaxed` (acknowledge before fdatasync; power loss may lose at most --max-records
    /// records, acknowledged within 2 x --max-delay-ms of each other). See docs/durability.md.
    Durability {
        name: String,
        #[arg(value_enum)]
        policy: PolicyArg,
        /// Relaxed only: longest a written record waits for its fdatasync (1..=10000; default 5);
        /// once the oldest change acknowledged before its fdatasync is twice that old, changes
        /// wait for their fdatasync. The count (--max-records) always bounds what can be lost.
        #[arg(long)]
        max_delay_ms: Option<u64>,
        /// Relaxed only: most records acknowledged but not fdatasync'ed (1..=1000000; default
        /// 1000).
        #[arg(long)]
        max_records: Option<u64>,
        #[command(flatten)]
        dir: DataDirArg,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PolicyArg {
    Sync,
    Relaxed,
}

#[derive(Debug, Subcommand)]
pub enum KeyCommand {
    /// Create another key for a tenant; prints the same JSON shape as `tenant create`.
    Create {
        tenant: String,
        /// Give the key ADMIN too (every key has READ and WRITE): how an operator restores a
        /// tenant whose every ADMIN key was revoked or lost.
        #[arg(long)]
        admin: bool,
        #[command(flatten)]
        dir: DataDirArg,
    },
    /// Revoke a key; its next call is refused.
    Revoke {
        tenant: String,
        key_id: String,
        #[command(flatten)]
        dir: DataDirArg,
    },
    /// Issue a client certificate (mTLS) that authenticates its connections as this key.
    Cert {
        tenant: String,
        key_id: String,
        #[command(flatten)]
        dir: DataDirArg,
        /// Where to write `<tenant>.<key_id>.crt.pem` and `.key.pem` (default: the current directory).
        #[arg(long, default_value = ".")]
        out: PathBuf,
        /// How many days the certificate is valid (from an hour ago, for clocks behind the
        /// server's), 1 to 3660. Revoking the key ends it sooner: the server checks the key at
        /// every connection.
        #[arg(long, default_value_t = 365, value_parser = clap::value_parser!(u32).range(1..=i64::from(crate::certs::MAX_CLIENT_CERT_DAYS)))]
        days: u32,
    },
}

#[derive(Debug, Clone, Args)]
pub struct DataDirArg {
    /// Where the server keeps its data.
    #[arg(long, env = "CUBE_DATA_DIR", default_value = DEFAULT_DATA_DIR)]
    pub data_dir: PathBuf,
    /// The server's TOML configuration file (`cubed serve --config`): its `data-dir` is used
    /// unless --data-dir or CUBE_DATA_DIR is given; its other keys are the server's own.
    #[arg(long, env = "CUBE_CONFIG")]
    pub config: Option<PathBuf>,
    /// With the server running: how long to wait for its answer on the admin socket before
    /// giving up (a stopped or hung server); the change may then have been made or not.
    #[arg(long, env = "CUBE_ADMIN_TIMEOUT_SECS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=86400))]
    pub admin_timeout_secs: u64,
}

impl DataDirArg {
    pub fn admin_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.admin_timeout_secs)
    }
}

impl Command {
    /// The data-directory argument of a `tenant` or `key` command.
    fn data_dir_arg(&mut self) -> Option<&mut DataDirArg> {
        match self {
            Command::Serve(_) => None,
            Command::Tenant(
                TenantCommand::Create { dir, .. }
                | TenantCommand::Delete { dir, .. }
                | TenantCommand::Durability { dir, .. }
                | TenantCommand::List { dir },
            )
            | Command::Key(
                KeyCommand::Create { dir, .. }
                | KeyCommand::Revoke { dir, .. }
                | KeyCommand::Cert { dir, .. },
            ) => Some(dir),
        }
    }
}

/// The `--config` file at `path` as a TOML table.
fn read_config_table(path: &std::path::Path) -> anyhow::Result<toml::Table> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("cannot read --config {}: {e}", path.display()))?;
    text.parse()
        .map_err(|e| anyhow::anyhow!("--config {} is not valid TOML: {e}", path.display()))
}

/// Which authentication models the server accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AuthModeArg {
    /// Per-connection handshake only (signed calls are refused).
    Connection,
    /// Per-call signatures only (the handshake answers FAILED_PRECONDITION).
    Call,
    /// Both, so the two models can be compared on one server.
    Both,
}

impl From<AuthModeArg> for AuthMode {
    fn from(a: AuthModeArg) -> AuthMode {
        match a {
            AuthModeArg::Connection => AuthMode::Connection,
            AuthModeArg::Call => AuthMode::Call,
            AuthModeArg::Both => AuthMode::Both,
        }
    }
}

#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Where the server keeps its data (catalog, tenant logs, admin socket).
    #[arg(long, env = "CUBE_DATA_DIR", default_value = DEFAULT_DATA_DIR)]
    pub data_dir: PathBuf,
    /// gRPC listen address. Port 0 picks a free port (printed on the ready line).
    #[arg(long, env = "CUBE_LISTEN", default_value = DEFAULT_LISTEN, value_parser = listen_address)]
    pub listen: SocketAddr,
    /// Admin HTTP listen address (/metrics, /healthz, /readyz). Port 0 picks a free port.
    #[arg(long, env = "CUBE_ADMIN_LISTEN", default_value = DEFAULT_ADMIN_LISTEN, value_parser = listen_address)]
    pub admin_listen: SocketAddr,
    /// A TOML file of `flag = value` lines, keys being these long flag names without `--`
    /// (e.g. `listen = "0.0.0.0:50051"`, `idle-secs = 600`, `no-demo = true`). Flags given on the
    /// command line or as CUBE_* variables take precedence over the file.
    #[arg(long, env = "CUBE_CONFIG")]
    pub config: Option<PathBuf>,
    /// Do not record per-RPC and authentication metrics (to measure what they cost; /metrics
    /// still answers).
    #[arg(long, env = "CUBE_NO_METRICS")]
    pub no_metrics: bool,
    /// Authentication models accepted: per-connection handshake, per-call signatures, or both.
    #[arg(long, env = "CUBE_AUTH_MODE", value_enum, default_value_t = AuthModeArg::Both)]
    pub auth_mode: AuthModeArg,
    /// Failed authentications one peer address may have in 10 s before it is refused with
    /// RESOURCE_EXHAUSTED for the cool-down.
    #[arg(long, env = "CUBE_AUTH_FAILURE_LIMIT", default_value_t = DEFAULT_AUTH_FAILURE_LIMIT)]
    pub auth_failure_limit: u32,
    /// Seconds a throttled peer is refused.
    #[arg(long, env = "CUBE_AUTH_FAILURE_COOLDOWN_SECS", default_value_t = DEFAULT_AUTH_FAILURE_COOLDOWN_SECS)]
    pub auth_failure_cooldown_secs: u64,
    /// Audit entries kept per tenant (the newest; older ones are dropped, the chain stays
    /// verifiable from the oldest kept entry).
    #[arg(long, env = "CUBE_AUDIT_RETENTION", default_value_t = DEFAULT_AUDIT_RETENTION)]
    pub audit_retention: usize,
    /// Largest request metadata (all headers of a call) in bytes.
    #[arg(long, env = "CUBE_MAX_METADATA_BYTES", default_value_t = DEFAULT_MAX_METADATA_BYTES)]
    pub max_metadata_bytes: u32,
    /// Serve TLS with this certificate chain (PEM); needs --tls-key.
    // Not `conflicts_with = "tls_dev"`: clap counts a switch set from the environment as given
    // even when the variable says false (`CUBE_TLS_DEV=false`); `validate` refuses the pair.
    #[arg(long, env = "CUBE_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// Private key (PEM) of --tls-cert.
    #[arg(long, env = "CUBE_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Serve TLS with a development CA and server certificate generated into <data-dir>/tls/
    /// (clients trust <data-dir>/tls/ca.pem).
    #[arg(long, env = "CUBE_TLS_DEV")]
    pub tls_dev: bool,
    /// Allow plaintext on a non-loopback address (credentials and data travel unencrypted).
    #[arg(long, env = "CUBE_INSECURE_PLAINTEXT")]
    pub insecure_plaintext: bool,
    /// Do not create the `demo` tenant and dev-credentials.json on first start.
    #[arg(long, env = "CUBE_NO_DEMO")]
    pub no_demo: bool,
    /// Largest cell value in bytes; larger writes get INVALID_ARGUMENT. 1 to 268435456.
    #[arg(long, env = "CUBE_MAX_VALUE_BYTES", default_value_t = DEFAULT_MAX_VALUE_BYTES)]
    pub max_value_bytes: usize,
    /// Largest gRPC request message in bytes; larger ones are refused before decoding with
    /// INVALID_ARGUMENT (default: the larger of 4 MiB and max value + 64 KiB).
    #[arg(long, env = "CUBE_MAX_MESSAGE_BYTES")]
    pub max_message_bytes: Option<usize>,
    /// Bytes of request messages one connection's calls may be receiving at once (a message is
    /// read whole before it is decoded, and counts at its declared size until its call has it
    /// all); a call whose message would go over gets RESOURCE_EXHAUSTED. At least
    /// --max-message-bytes + 5 (default: the larger of 64 MiB and twice --max-message-bytes).
    #[arg(long, env = "CUBE_MAX_CONNECTION_RECEIVE_BYTES")]
    pub max_connection_receive_bytes: Option<usize>,
    /// Bytes of unary answers one connection's client may leave unread (HTTP/2 flow control)
    /// before its reads are refused with RESOURCE_EXHAUSTED, and, past it, every unary call. At
    /// least --max-value-bytes + 64 KiB (default: the larger of 64 MiB and twice
    /// --max-value-bytes).
    #[arg(long, env = "CUBE_MAX_CONNECTION_SEND_BYTES")]
    pub max_connection_send_bytes: Option<usize>,
    /// Allowed clock skew of signed calls, seconds.
    #[arg(long, env = "CUBE_SKEW_SECS", default_value_t = DEFAULT_SKEW_SECS)]
    pub skew_secs: u64,
    /// Nonces the replay cache remembers at most (24 bytes each, up to ~50 with growth slack).
    #[arg(long, env = "CUBE_REPLAY_CAPACITY", default_value_t = DEFAULT_REPLAY_CAPACITY)]
    pub replay_capacity: usize,
    /// Requests per tenant admitted and not yet answered (queued, or writes waiting for their
    /// fdatasync) before callers get RESOURCE_EXHAUSTED.
    #[arg(long, env = "CUBE_MAILBOX_CAPACITY", default_value_t = DEFAULT_MAILBOX_CAPACITY)]
    pub mailbox_capacity: usize,
    /// Bytes of values, programs and inputs one tenant's requests in flight may carry before
    /// callers get RESOURCE_EXHAUSTED (each is held in a few copies until it is answered); at
    /// least --max-value-bytes. Also bounds, in log bytes, a relaxed tenant's changes
    /// acknowledged before their fdatasync.
    #[arg(long, env = "CUBE_MAX_IN_FLIGHT_BYTES", default_value_t = DEFAULT_MAX_IN_FLIGHT_BYTES)]
    pub max_in_flight_bytes: usize,
    /// Threads running tenant actors (default: one per 4 CPUs, at least 1; on 2 cores one actor
    /// thread beat two by ~25% in the e2e benchmark, docs/benchmarks.md).
    #[arg(long, env = "CUBE_ACTOR_THREADS")]
    pub actor_threads: Option<usize>,
    /// HTTP/2 streams per connection at most.
    #[arg(long, env = "CUBE_MAX_CONCURRENT_STREAMS", default_value_t = DEFAULT_MAX_CONCURRENT_STREAMS)]
    pub max_concurrent_streams: u32,
    /// Open network connections at most (TLS handshakes under way included); more are closed
    /// at accept. Default: half the process's open-file limit, between 64 and 16384, so that
    /// connections can never take the descriptors the tenants' logs and state need.
    #[arg(long, env = "CUBE_MAX_CONNECTIONS")]
    pub max_connections: Option<usize>,
    /// Open network connections from one client address (an IPv4 address or an IPv6 /64) at
    /// most (TLS handshakes under way included); more are closed at accept, so that one client
    /// cannot take every --max-connections place. 0 (the default): no cap of its own. Clients
    /// behind one NAT or proxy share an address: size it for them.
    #[arg(long, env = "CUBE_MAX_CONNECTIONS_PER_ADDRESS", default_value_t = 0)]
    pub max_connections_per_address: usize,
    /// A new connection that has not sent the whole HTTP/2 connection preface this many
    /// milliseconds after it was accepted (under TLS: after its handshake, which has 10 s of its
    /// own) is closed, so that silent sockets cannot hold --max-connections places.
    #[arg(long, env = "CUBE_PREFACE_TIMEOUT_MS", default_value_t = DEFAULT_PREFACE_TIMEOUT_MS)]
    pub preface_timeout_ms: u64,
    /// HTTP/2 keepalive: send a PING to a connection that has sent no request headers or data
    /// for this many seconds, and close it if the PING is not answered within as long again, so
    /// that connections of vanished peers do not stay open. 0: no PINGs (a connection that sent
    /// its preface then stays open until its peer closes it). At most 86400.
    #[arg(long, env = "CUBE_KEEPALIVE_SECS", default_value_t = DEFAULT_KEEPALIVE_SECS)]
    pub keepalive_secs: u64,
    /// A call not answered within this many milliseconds is answered DEADLINE_EXCEEDED (a
    /// change it carried may still be applied); a client's shorter grpc-timeout wins. Counts
    /// until the answer starts: a stream's later messages are not limited. 0: no limit but the
    /// client's (the default: a timer per call costs throughput). At most 86400000.
    #[arg(long, env = "CUBE_CALL_TIMEOUT_MS", default_value_t = DEFAULT_CALL_TIMEOUT_MS)]
    pub call_timeout_ms: u64,
    /// Largest WAL segment file; segments start at 256 KiB and double up to this.
    #[arg(long, env = "CUBE_WAL_SEGMENT_MAX_BYTES", default_value_t = DEFAULT_WAL_SEGMENT_MAX_BYTES)]
    pub wal_segment_max_bytes: u64,
    /// Checkpoint a tenant (flush its state store, delete the WAL segments it covers) after this
    /// many bytes of WAL...
    #[arg(long, env = "CUBE_CHECKPOINT_BYTES", default_value_t = DEFAULT_CHECKPOINT_BYTES)]
    pub checkpoint_bytes: u64,
    /// ...or this many seconds after its last checkpoint, whichever comes first.
    #[arg(long, env = "CUBE_CHECKPOINT_SECS", default_value_t = DEFAULT_CHECKPOINT_SECS)]
    pub checkpoint_secs: u64,
    /// Block cache of each open tenant's state store (fjall), in bytes; every open tenant has
    /// its own.
    #[arg(long, env = "CUBE_STATE_CACHE_BYTES", default_value_t = DEFAULT_STATE_CACHE_BYTES)]
    pub state_cache_bytes: u64,
    /// Refuse writes (RESOURCE_EXHAUSTED) while the data directory's file system has less than
    /// this many bytes free; they resume by themselves once space is freed. 0: nothing is refused
    /// (`cube_disk_free_bytes` is still reported).
    #[arg(long, env = "CUBE_MIN_FREE_BYTES", default_value_t = DEFAULT_MIN_FREE_BYTES)]
    pub min_free_bytes: u64,
    /// Each tenant's storage quota in bytes: Write, Prog, Link and Run that would take its cells,
    /// edges and run records (`Tenant.Stats` `stored_bytes`) past it are refused with
    /// RESOURCE_EXHAUSTED; deletions and everything else pass. 0: no quota.
    #[arg(long, env = "CUBE_TENANT_MAX_BYTES", default_value_t = 0)]
    pub tenant_max_bytes: u64,
    /// Close (passivate) a tenant after this many seconds without a call; its next call reopens it.
    #[arg(long, env = "CUBE_IDLE_SECS", default_value_t = DEFAULT_IDLE_SECS)]
    pub idle_secs: u64,
    /// Tenants open at once at most, a soft cap: opening another closes the least recently used
    /// idle one (busy tenants are never closed for it).
    #[arg(long, env = "CUBE_MAX_OPEN_TENANTS", default_value_t = DEFAULT_MAX_OPEN_TENANTS)]
    pub max_open_tenants: usize,
    /// Most cells one Region response holds (larger limits are lowered; the page token continues).
    #[arg(long, env = "CUBE_REGION_MAX_CELLS", default_value_t = DEFAULT_REGION_MAX_CELLS)]
    pub region_max_cells: u32,
    /// Most visits one Walk may ask for (larger limits are INVALID_ARGUMENT).
    #[arg(long, env = "CUBE_WALK_MAX_VISITS", default_value_t = DEFAULT_WALK_MAX_VISITS)]
    pub walk_max_visits: u32,
    /// Seconds a Region or Tenant.Audit page may go without its client taking any of it; such a
    /// page is dropped (the stream ends with ABORTED) and its tenant's scan place freed.
    #[arg(long, env = "CUBE_PAGE_READ_SECS", default_value_t = DEFAULT_PAGE_READ_SECS)]
    pub page_read_secs: u64,
    /// On SIGTERM/SIGINT, seconds to wait for calls in flight and open streams (a client's
    /// Health.Watch, a Region page being read) to finish before their connections are closed;
    /// the tenants are synced and closed after it either way. A second signal ends the wait at
    /// once. 0: do not wait. At most 86400.
    #[arg(long, env = "CUBE_DRAIN_SECS", default_value_t = DEFAULT_DRAIN_SECS)]
    pub drain_secs: u64,
}

/// The one of `known` that `key` most likely misspells: `_` for `-`, or at most two letters
/// added, dropped or changed (none if two are equally near).
fn closest<'a>(key: &str, known: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    let key = key.replace('_', "-");
    let mut best: Option<(usize, &str)> = None;
    let mut tie = false;
    for candidate in known {
        let d = edit_distance(&key, candidate);
        match best {
            Some((b, _)) if d > b => {}
            Some((b, _)) if d == b => tie = true,
            _ => (best, tie) = (Some((d, candidate)), false),
        }
    }
    best.filter(|(d, _)| *d <= 2 && !tie).map(|(_, c)| c)
}

/// Levenshtein distance of two short ASCII strings.
fn edit_distance(a: &str, b: &str) -> usize {
    let b = b.as_bytes();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.bytes().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let next = (diagonal + usize::from(ca != *cb))
                .min(row[j] + 1)
                .min(row[j + 1] + 1);
            diagonal = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

/// A listen address: an IP address and a port, said so when it is not one.
fn listen_address(text: &str) -> Result<SocketAddr, String> {
    text.parse().map_err(|_| {
        "expected IP:PORT, such as 127.0.0.1:50051, 0.0.0.0:50051 or [::1]:50051 (host names \
         are not resolved; port 0 picks a free one)"
            .to_string()
    })
}

/// Where the listener's certificate comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TlsChoice {
    Plaintext,
    Files { cert: PathBuf, key: PathBuf },
    Dev,
}

/// Validated settings of `cubed serve`.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub data_dir: PathBuf,
    pub admin_listen: SocketAddr,
    pub metrics: bool,
    pub audit_retention: usize,
    pub tls: TlsChoice,
    pub auth_mode: AuthMode,
    pub failure_limits: FailureLimits,
    pub max_metadata_bytes: u32,
    pub listen: SocketAddr,
    pub demo: bool,
    pub max_value_bytes: usize,
    pub max_message_bytes: usize,
    pub max_connection_receive_bytes: usize,
    pub max_connection_send_bytes: usize,
    pub skew_ms: i64,
    pub replay_capacity: usize,
    pub mailbox_capacity: usize,
    pub max_in_flight_bytes: usize,
    pub actor_threads: usize,
    pub max_concurrent_streams: u32,
    pub max_connections: usize,
    pub max_connections_per_address: Option<usize>,
    pub preface_timeout: std::time::Duration,
    pub keepalive: Option<std::time::Duration>,
    pub call_timeout: Option<std::time::Duration>,
    pub wal_segment_max_bytes: u64,
    pub checkpoint: cube_store::CheckpointPolicy,
    pub state_cache_bytes: u64,
    pub min_free_bytes: u64,
    pub tenant_max_bytes: u64,
    pub idle_after: std::time::Duration,
    pub max_open_tenants: usize,
    pub scan_limits: cube_gateway::ScanLimits,
    pub drain: std::time::Duration,
}

impl ServeArgs {
    pub fn validate(self) -> anyhow::Result<ServeConfig> {
        anyhow::ensure!(
            (1..=MAX_VALUE_BYTES).contains(&self.max_value_bytes),
            "--max-value-bytes must be 1 to {MAX_VALUE_BYTES}"
        );
        anyhow::ensure!(
            self.max_message_bytes
                .is_none_or(|m| m <= 2 * MAX_VALUE_BYTES),
            "--max-message-bytes must be at most {}",
            2 * MAX_VALUE_BYTES
        );
        let max_message_bytes = self
            .max_message_bytes
            .unwrap_or((self.max_value_bytes + MESSAGE_OVERHEAD).max(MIN_DEFAULT_MESSAGE_BYTES));
        anyhow::ensure!(
            max_message_bytes > self.max_value_bytes,
            "--max-message-bytes ({max_message_bytes}) must exceed --max-value-bytes ({})",
            self.max_value_bytes
        );
        let max_connection_receive_bytes = self.max_connection_receive_bytes.unwrap_or(
            max_message_bytes
                .saturating_mul(2)
                .max(MIN_DEFAULT_CONNECTION_RECEIVE_BYTES),
        );
        let least = cube_gateway::min_connection_receive_bytes(max_message_bytes);
        anyhow::ensure!(
            max_connection_receive_bytes >= least,
            "--max-connection-receive-bytes ({max_connection_receive_bytes}) must be at least \
             {least} (--max-message-bytes, or 16 KiB if that is more, and a message's 5-byte \
             gRPC prefix): the largest message must be able to arrive"
        );
        let max_connection_send_bytes = self.max_connection_send_bytes.unwrap_or(
            self.max_value_bytes
                .saturating_mul(2)
                .max(MIN_DEFAULT_CONNECTION_SEND_BYTES),
        );
        let least =
            (self.max_value_bytes + MESSAGE_OVERHEAD).max(cube_gateway::MIN_CONNECTION_SEND_BYTES);
        anyhow::ensure!(
            max_connection_send_bytes >= least,
            "--max-connection-send-bytes ({max_connection_send_bytes}) must be at least {least} \
             (--max-value-bytes + 64 KiB): one answer of the largest value, alone, must not put a \
             connection over it"
        );
        anyhow::ensure!(
            self.max_in_flight_bytes >= self.max_value_bytes,
            "--max-in-flight-bytes ({}) must be at least --max-value-bytes ({})",
            self.max_in_flight_bytes,
            self.max_value_bytes
        );
        anyhow::ensure!(
            (1..=MAX_SKEW_SECS).contains(&self.skew_secs),
            "--skew-secs must be between 1 and {MAX_SKEW_SECS}"
        );
        anyhow::ensure!(
            self.replay_capacity >= 16,
            "--replay-capacity must be at least 16"
        );
        anyhow::ensure!(
            (256 << 10..=MAX_WAL_SEGMENT_BYTES).contains(&self.wal_segment_max_bytes),
            "--wal-segment-max-bytes must be between 256 KiB and 1 GiB ({MAX_WAL_SEGMENT_BYTES})"
        );
        let threads = self
            .actor_threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get() / 4));
        anyhow::ensure!(
            threads <= MAX_ACTOR_THREADS,
            "--actor-threads must be at most {MAX_ACTOR_THREADS} (0 means 1)"
        );
        anyhow::ensure!(
            !(self.tls_dev && self.tls_cert.is_some()),
            "--tls-cert/--tls-key and --tls-dev (CUBE_TLS_DEV) are two ways to serve TLS: give \
             one of them"
        );
        let tls = match (self.tls_cert, self.tls_key, self.tls_dev) {
            (Some(cert), Some(key), _) => TlsChoice::Files { cert, key },
            (_, _, true) => TlsChoice::Dev,
            _ => TlsChoice::Plaintext,
        };
        // Port 0 twice is two free ports; the same fixed port twice would fail to bind as "in
        // use", as if another process held it: on the same address, or when one is every
        // interface of the other's family (0.0.0.0 covers IPv4; :: covers IPv6 and, dual-stack,
        // IPv4 too).
        let (l, a) = (self.listen, self.admin_listen);
        let covers = |every: std::net::IpAddr, other: std::net::IpAddr| {
            every.is_unspecified() && (every.is_ipv6() || other.is_ipv4())
        };
        anyhow::ensure!(
            l.port() != a.port()
                || l.port() == 0
                || (l.ip() != a.ip() && !covers(l.ip(), a.ip()) && !covers(a.ip(), l.ip())),
            "--listen {l} and --admin-listen {a} take the same port on the same interfaces: the \
             gRPC and the admin (metrics) listener need different ports"
        );
        anyhow::ensure!(
            tls != TlsChoice::Plaintext
                || self.listen.ip().is_loopback()
                || self.insecure_plaintext,
            "refusing to serve plaintext on the non-loopback address {}: use --tls-cert/--tls-key or \
             --tls-dev, or pass --insecure-plaintext if a trusted layer encrypts the traffic",
            self.listen
        );
        anyhow::ensure!(
            self.checkpoint_bytes >= 64 << 10,
            "--checkpoint-bytes must be at least 64 KiB"
        );
        anyhow::ensure!(
            self.state_cache_bytes >= 1 << 20,
            "--state-cache-bytes must be at least 1 MiB"
        );
        anyhow::ensure!(
            (MIN_PREFACE_TIMEOUT_MS..=MAX_PREFACE_TIMEOUT_MS).contains(&self.preface_timeout_ms),
            "--preface-timeout-ms must be between {MIN_PREFACE_TIMEOUT_MS} and {MAX_PREFACE_TIMEOUT_MS}"
        );
        anyhow::ensure!(
            self.keepalive_secs <= MAX_KEEPALIVE_SECS,
            "--keepalive-secs must be at most {MAX_KEEPALIVE_SECS} (0 turns PINGs off)"
        );
        // Below 100 ms it is most likely seconds meant as milliseconds: durable changes would
        // be answered DEADLINE_EXCEEDED while they may still be applied.
        anyhow::ensure!(
            self.call_timeout_ms == 0
                || (MIN_CALL_TIMEOUT_MS..=MAX_CALL_TIMEOUT_MS).contains(&self.call_timeout_ms),
            "--call-timeout-ms must be 0 (no limit) or between {MIN_CALL_TIMEOUT_MS} and \
             {MAX_CALL_TIMEOUT_MS} (it is in milliseconds)"
        );
        // A signed call's five headers and gRPC's own take ~400 bytes; below this, every call
        // would be refused by a server that says it is ready.
        anyhow::ensure!(
            (MIN_METADATA_BYTES..=MAX_METADATA_BYTES).contains(&self.max_metadata_bytes),
            "--max-metadata-bytes must be between {MIN_METADATA_BYTES} and {MAX_METADATA_BYTES}"
        );
        // Each named alone: a message naming two flags left the user to find which was wrong.
        for (flag, value) in [
            ("--mailbox-capacity", self.mailbox_capacity as u64),
            ("--audit-retention", self.audit_retention as u64),
            ("--checkpoint-secs", self.checkpoint_secs),
            (
                "--max-connections",
                self.max_connections.map_or(1, |n| n as u64),
            ),
            (
                "--max-concurrent-streams",
                u64::from(self.max_concurrent_streams),
            ),
            ("--idle-secs", self.idle_secs),
            ("--max-open-tenants", self.max_open_tenants as u64),
            ("--region-max-cells", self.region_max_cells as u64),
            ("--walk-max-visits", self.walk_max_visits as u64),
        ] {
            anyhow::ensure!(value >= 1, "{flag} must be at least 1");
        }
        anyhow::ensure!(
            (1..=MAX_PAGE_READ_SECS).contains(&self.page_read_secs),
            "--page-read-secs must be 1 to {MAX_PAGE_READ_SECS}"
        );
        for (flag, value) in [
            (
                "--auth-failure-cooldown-secs",
                self.auth_failure_cooldown_secs,
            ),
            ("--idle-secs", self.idle_secs),
            ("--checkpoint-secs", self.checkpoint_secs),
            ("--drain-secs", self.drain_secs),
        ] {
            anyhow::ensure!(
                value <= MAX_DAY_SECS,
                "{flag} must be at most {MAX_DAY_SECS}"
            );
        }
        Ok(ServeConfig {
            data_dir: self.data_dir,
            admin_listen: self.admin_listen,
            metrics: !self.no_metrics,
            audit_retention: self.audit_retention,
            tls,
            auth_mode: self.auth_mode.into(),
            failure_limits: FailureLimits {
                max_failures: self.auth_failure_limit,
                cooldown: std::time::Duration::from_secs(self.auth_failure_cooldown_secs),
                ..FailureLimits::default()
            },
            max_metadata_bytes: self.max_metadata_bytes,
            listen: self.listen,
            demo: !self.no_demo,
            max_value_bytes: self.max_value_bytes,
            max_message_bytes,
            max_connection_receive_bytes,
            max_connection_send_bytes,
            skew_ms: i64::try_from(self.skew_secs.saturating_mul(1000)).unwrap_or(i64::MAX),
            replay_capacity: self.replay_capacity,
            mailbox_capacity: self.mailbox_capacity,
            max_in_flight_bytes: self.max_in_flight_bytes,
            actor_threads: threads.max(1),
            max_concurrent_streams: self.max_concurrent_streams,
            max_connections: self.max_connections.unwrap_or_else(default_max_connections),
            max_connections_per_address: (self.max_connections_per_address > 0)
                .then_some(self.max_connections_per_address),
            preface_timeout: std::time::Duration::from_millis(self.preface_timeout_ms),
            keepalive: (self.keepalive_secs > 0)
                .then(|| std::time::Duration::from_secs(self.keepalive_secs)),
            call_timeout: (self.call_timeout_ms > 0)
                .then(|| std::time::Duration::from_millis(self.call_timeout_ms)),
            wal_segment_max_bytes: self.wal_segment_max_bytes,
            checkpoint: cube_store::CheckpointPolicy {
                every_bytes: self.checkpoint_bytes,
                every: std::time::Duration::from_secs(self.checkpoint_secs),
            },
            state_cache_bytes: self.state_cache_bytes,
            min_free_bytes: self.min_free_bytes,
            tenant_max_bytes: self.tenant_max_bytes,
            idle_after: std::time::Duration::from_secs(self.idle_secs),
            max_open_tenants: self.max_open_tenants,
            scan_limits: cube_gateway::ScanLimits {
                region_default: 1000.min(self.region_max_cells),
                region_max: self.region_max_cells,
                walk_default: 1000.min(self.walk_max_visits),
                walk_max: self.walk_max_visits,
                page_read: std::time::Duration::from_secs(self.page_read_secs),
            },
            drain: std::time::Duration::from_secs(self.drain_secs),
        })
    }
}

/// clap's error, naming the environment variable a refused value came from
/// ([`cube_cli::exit_naming_the_variable`]).
fn exit_naming_the_variable(e: &clap::Error, argv: &[std::ffi::OsString]) -> ! {
    use clap::CommandFactory;
    cube_cli::exit_naming_the_variable(e, argv, &Cli::command())
}

/// Parse the command line, filling `serve` flags not given on it (nor in the environment) from
/// the `--config` file. Exits with clap's message on bad flags, like `Cli::parse`.
pub fn parse_with_config(argv: Vec<std::ffi::OsString>) -> anyhow::Result<Cli> {
    use clap::builder::Resettable;
    use clap::{CommandFactory, FromArgMatches, parser::ValueSource};
    let no_requires = |a: clap::Arg| a.requires(Resettable::Reset);
    // A `tenant`/`key` command takes none of the server's settings, so the environment's values
    // for them (`CUBE_LISTEN=…`, meant for the server) are not read for it: one the server
    // would refuse must not stop the command (clap reads and checks the top-level flags, the
    // server's, from the environment whatever the subcommand).
    let offline = Cli::command()
        .mut_args(|a| no_requires(a).env(Resettable::Reset))
        .try_get_matches_from(argv.clone())
        .ok()
        .filter(|m| m.subcommand().is_some_and(|(name, _)| name != "serve"));
    if let Some(matches) = offline {
        let mut cli =
            Cli::from_arg_matches(&matches).unwrap_or_else(|e| exit_naming_the_variable(&e, &argv));
        // It needs only the data directory from the server's file.
        let leaf = match matches.subcommand() {
            Some((_, group)) => group.subcommand().map_or(group, |(_, leaf)| leaf),
            None => &matches,
        };
        if let Some(path) = leaf.get_one::<PathBuf>("config")
            && leaf.value_source("data_dir") == Some(ValueSource::DefaultValue)
            && let Some(dir) = cli.command.as_mut().and_then(Command::data_dir_arg)
        {
            // Without one the server uses its default, relative to its own working
            // directory: as unknowable here as a relative one (below), and this command
            // would create a catalog in the caller's directory.
            let table = read_config_table(path)?;
            let Some(value) = table.get("data-dir") else {
                anyhow::bail!(
                    "--config {}: it names no data-dir, so the server uses its default \
                     ({DEFAULT_DATA_DIR}) relative to its own working directory; give \
                     --data-dir (or CUBE_DATA_DIR) as well",
                    path.display()
                );
            };
            let text = value.as_str().ok_or_else(|| {
                anyhow::anyhow!("--config {}: 'data-dir' must be a string", path.display())
            })?;
            // The server resolves a relative one against its own working directory, which
            // this command cannot know: working on another directory (and creating a
            // catalog there) would be worse than asking.
            anyhow::ensure!(
                std::path::Path::new(text).is_absolute(),
                "--config {}: its data-dir {text:?} is relative to the server's working \
                 directory; give --data-dir (or CUBE_DATA_DIR) as well",
                path.display()
            );
            dir.data_dir = PathBuf::from(text);
        }
        return Ok(cli);
    }
    // Serving. With `serve` given, its own copy of the flags is the one used: the top-level
    // copy (for a bare `cubed`) must not read the environment too, or a variable the command
    // line overrides (`CUBE_LISTEN=… cubed serve --listen …`) would still be parsed, and
    // refused, there.
    // Told from the command line's shape alone: nothing its flags need from the file or the
    // environment (`--tls-cert` whose `tls-key` is in the file) may fail this parse.
    let serve_given = Cli::command()
        .mut_args(|a| no_requires(a).env(Resettable::Reset))
        .mut_subcommand("serve", |serve| {
            serve.mut_args(|a| no_requires(a).env(Resettable::Reset))
        })
        .try_get_matches_from(argv.clone())
        .is_ok_and(|m| m.subcommand_name() == Some("serve"));
    let command = || {
        let cli = Cli::command();
        if serve_given {
            cli.mut_args(|a| no_requires(a).env(Resettable::Reset))
        } else {
            cli
        }
    };
    let parse = |argv: &[std::ffi::OsString]| {
        command()
            .try_get_matches_from(argv)
            .and_then(|m| Cli::from_arg_matches(&m))
    };
    // The first parse tells what the command line gave. It leaves out which flags need
    // which (`--tls-cert` needs `--tls-key`): one may be on the command line and its partner in
    // the file, so that is checked by the parses below, of everything.
    let matches = command()
        .mut_args(no_requires)
        .mut_subcommand("serve", |serve| serve.mut_args(no_requires))
        .try_get_matches_from(argv.clone())
        .unwrap_or_else(|e| exit_naming_the_variable(&e, &argv));
    let serve = match matches.subcommand() {
        Some(("serve", m)) => m,
        _ => &matches,
    };
    let Some(path) = serve.get_one::<PathBuf>("config") else {
        return Ok(parse(&argv).unwrap_or_else(|e| exit_naming_the_variable(&e, &argv)));
    };
    let table = read_config_table(path)?;
    let flags = Cli::command();
    let mut argv = argv.clone();
    for (key, value) in table {
        let arg = flags
            .get_arguments()
            .find(|a| a.get_long() == Some(key.as_str()) && key != "config" && key != "help")
            .ok_or_else(|| {
                if key == "config" || key == "help" {
                    return anyhow::anyhow!(
                        "--config {}: '{key}' cannot be set in a configuration file (a file \
                         cannot name another one); give --{key} on the command line",
                        path.display()
                    );
                }
                let longs = flags
                    .get_arguments()
                    .filter_map(|a| a.get_long())
                    .filter(|l| *l != "config" && *l != "help");
                let hint = match closest(&key, longs) {
                    Some(near) => format!(" (did you mean '{near}'?)"),
                    None => String::new(),
                };
                anyhow::anyhow!(
                    "--config {}: unknown key '{key}'{hint}; keys are the long flags of `cubed \
                     serve` without the leading --",
                    path.display()
                )
            })?;
        if matches!(
            serve.value_source(arg.get_id().as_str()),
            Some(ValueSource::CommandLine | ValueSource::EnvVariable)
        ) {
            continue;
        }
        let switch = !arg.get_action().takes_values();
        match value {
            toml::Value::Boolean(_) if !switch => anyhow::bail!(
                "--config {}: '{key}' takes a value, not true or false (`{key} = ...`, as \
                 `--{key} VALUE` on the command line)",
                path.display()
            ),
            toml::Value::String(_) | toml::Value::Integer(_) if switch => anyhow::bail!(
                "--config {}: '{key}' is a switch: write `{key} = true` (or leave it out), \
                 without quotes",
                path.display()
            ),
            toml::Value::Boolean(true) => argv.push(format!("--{key}").into()),
            toml::Value::Boolean(false) => {}
            toml::Value::String(s) => argv.push(format!("--{key}={s}").into()),
            toml::Value::Integer(n) => argv.push(format!("--{key}={n}").into()),
            other => anyhow::bail!(
                "--config {}: '{key}' must be a string, integer or boolean, not {}",
                path.display(),
                other.type_str()
            ),
        }
    }
    // The command line and the environment parsed above, so what fails now is the file's.
    parse(&argv).map_err(|e| config_file_error(&e, path))
}

/// `e`, a refusal by [`ServeArgs::validate`] naming a flag first, with where that flag's value
/// came from when not from the command line `argv`: its `CUBE_*` environment variable, or the
/// `--config` file. (A value out of range was reported as `--skew-secs must be ...` alone, to an
/// operator whose command line has no such flag.)
pub fn naming_the_source(e: anyhow::Error, argv: &[std::ffi::OsString]) -> anyhow::Error {
    use clap::CommandFactory;
    let text = e.to_string();
    // The flag the message starts with, if it is one (`--tls-cert/--tls-key …` names none).
    let Some(long) = text.strip_prefix("--").and_then(|rest| {
        let word = rest
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
            .next()?;
        Some(word.trim_end_matches('-'))
    }) else {
        return e;
    };
    let command = Cli::command();
    let Some(arg) = command.get_arguments().find(|a| a.get_long() == Some(long)) else {
        return e;
    };
    let flag = format!("--{long}");
    let given = |flag: &str| {
        argv.iter()
            .filter_map(|a| a.to_str())
            .any(|a| a == flag || a.strip_prefix(flag).is_some_and(|r| r.starts_with('=')))
    };
    if given(&flag) {
        return e;
    }
    if let Some(var) = arg
        .get_env()
        .and_then(|v| v.to_str())
        .filter(|v| std::env::var_os(v).is_some())
    {
        return anyhow::anyhow!(
            "{text} (the value of {flag} came from the environment variable {var})"
        );
    }
    // Else from the file, if one was given (on the command line, or as CUBE_CONFIG) and it
    // sets that key; else it is the default.
    let on_line = argv
        .iter()
        .filter_map(|a| a.to_str())
        .skip_while(|a| *a != "--config")
        .nth(1)
        .map(|f| format!("--config {f}"))
        .or_else(|| {
            argv.iter()
                .filter_map(|a| a.to_str())
                .find_map(|a| a.strip_prefix("--config="))
                .map(|f| format!("--config {f}"))
        });
    let (file, named) = match on_line {
        Some(named) => (named["--config ".len()..].to_string(), named),
        None => match std::env::var("CUBE_CONFIG") {
            Ok(f) => (f.clone(), format!("the file CUBE_CONFIG names, {f}")),
            Err(_) => return e,
        },
    };
    match read_config_table(std::path::Path::new(&file)) {
        Ok(table) if table.contains_key(long) => {
            anyhow::anyhow!("{text} (the value of {flag} came from {named})")
        }
        _ => e,
    }
}

/// A clap error about what the config file gave, as one line that names the file and the key
/// (clap's own text starts with "error:", speaks of command-line flags and ends with a usage
/// hint).
fn config_file_error(e: &clap::Error, path: &std::path::Path) -> anyhow::Error {
    use clap::error::{ContextKind, ContextValue};
    let text = |kind| match e.get(kind) {
        Some(ContextValue::String(s)) => Some(s.clone()),
        _ => None,
    };
    let why = match (std::error::Error::source(e), e.get(ContextKind::ValidValue)) {
        (Some(source), _) => source.to_string(),
        (None, Some(ContextValue::Strings(valid))) if valid.is_empty() => {
            "a value is required (it is empty)".to_string()
        }
        (None, Some(ContextValue::Strings(valid))) => {
            format!("expected one of {}", valid.join(", "))
        }
        _ => {
            // Not about one value (a flag that needs another, two that conflict): clap's
            // text up to its usage line, on one line ("... not provided: --tls-key <TLS_KEY>").
            // Either flag may have come from the command line or the environment instead.
            let rendered = e.to_string();
            let what: Vec<&str> = rendered
                .lines()
                .take_while(|l| !l.starts_with("Usage:"))
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .collect();
            return anyhow::anyhow!(
                "--config {}: {} (counting the command line and the environment too)",
                path.display(),
                what.join(" ").trim_start_matches("error: ")
            );
        }
    };
    // "--idle-secs <IDLE_SECS>" names the key `idle-secs`.
    let key = text(ContextKind::InvalidArg).unwrap_or_default();
    let key = key
        .trim_start_matches("--")
        .split([' ', '='])
        .next()
        .unwrap_or_default();
    match text(ContextKind::InvalidValue) {
        Some(value) => anyhow::anyhow!(
            "--config {}: '{key}' = {value:?} is not valid: {why}",
            path.display()
        ),
        None => anyhow::anyhow!("--config {}: '{key}' is not valid: {why}", path.display()),
    }
}

/// Refuse a data directory path that names something other than a directory (a file, say), or
/// one that cannot be created because a file stands where a parent directory would be, in plain
/// words, before anything tries to create or open inside it.
pub fn check_data_dir(path: &std::path::Path) -> anyhow::Result<()> {
    let is_dir = |p: &std::path::Path| std::fs::metadata(p).map(|m| m.is_dir());
    match is_dir(path) {
        Ok(true) => check_own_directory(path),
        Ok(false) => anyhow::bail!(
            "the data directory {} exists and is not a directory: pass --data-dir naming a \
             directory (or one to create)",
            path.display()
        ),
        // Missing: its nearest existing ancestor must be a directory to create it in.
        Err(_) => match path
            .ancestors()
            .skip(1)
            .find_map(|a| Some((a, is_dir(a).ok()?)))
        {
            Some((parent, false)) => anyhow::bail!(
                "the data directory {} cannot be created: {} is not a directory: pass \
                 --data-dir naming a directory (or one to create)",
                path.display(),
                parent.display()
            ),
            _ => Ok(()),
        },
    }
}

/// An existing data directory must be empty or hold a catalog: a mistyped `--data-dir` naming
/// a home directory or `/tmp` would otherwise get a catalog and tenant files written among
/// someone else's, and its mode set to 0700 (shutting out everyone else). `lost+found` (a new
/// filesystem's root) does not count. A directory that cannot be listed is refused too.
fn check_own_directory(path: &std::path::Path) -> anyhow::Result<()> {
    let cannot_list = |e: std::io::Error| {
        anyhow::anyhow!(
            "cannot list the data directory {}: {e}: pass --data-dir naming a directory this \
             user can read",
            path.display()
        )
    };
    let mut foreign = None;
    for entry in std::fs::read_dir(path).map_err(cannot_list)? {
        let name = entry.map_err(cannot_list)?.file_name();
        if cube_store::DataDir::marks_data_dir(&name) {
            return Ok(());
        }
        if name != "lost+found" && foreign.is_none() {
            foreign = Some(name);
        }
    }
    match foreign {
        None => Ok(()),
        Some(name) => anyhow::bail!(
            "the data directory {} is not empty and holds no Cube catalog (it has {:?}): pass \
             --data-dir naming the server's data directory, or an empty or new one",
            path.display(),
            name
        ),
    }
}

#[cfg(test)]
mod config_file_tests {
    use super::*;

    fn argv(args: &[&str]) -> Vec<std::ffi::OsString> {
        args.iter().map(Into::into).collect()
    }

    /// `cubed ARGS`, parsed as `main` does.
    fn cubed(args: &[&str]) -> anyhow::Result<Cli> {
        let mut all = vec!["cubed"];
        all.extend_from_slice(args);
        parse_with_config(argv(&all))
    }

    /// A config file holding `contents` (kept while the directory is).
    fn config_file(contents: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("cubed.toml");
        std::fs::write(&file, contents).unwrap();
        (dir, file)
    }

    #[test]
    fn file_fills_flags_the_command_line_did_not_give() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("cubed.toml");
        std::fs::write(
            &file,
            "listen = \"127.0.0.1:7000\"\nidle-secs = 42\nno-demo = true\nno-metrics = false\n",
        )
        .unwrap();
        let f = file.to_str().unwrap();
        let cli =
            parse_with_config(argv(&["cubed", "--config", f, "--listen", "127.0.0.1:9"])).unwrap();
        assert_eq!(cli.serve.listen.to_string(), "127.0.0.1:9");
        assert_eq!(cli.serve.idle_secs, 42);
        assert!(cli.serve.no_demo);
        assert!(!cli.serve.no_metrics);
        let cli = parse_with_config(argv(&["cubed", "serve", "--config", f])).unwrap();
        let Some(Command::Serve(args)) = cli.command else {
            panic!("expected serve")
        };
        assert_eq!(args.listen.to_string(), "127.0.0.1:7000");
    }

    #[test]
    fn tenant_and_key_commands_take_the_data_dir_from_the_servers_file() {
        let (_dir, file) = config_file("data-dir = \"/srv/cube\"\nlisten = \"0.0.0.0:50051\"\n");
        let f = file.to_str().unwrap();
        let data_dir = |args: &[&str]| {
            let mut cli = cubed(args).unwrap();
            cli.command
                .as_mut()
                .and_then(Command::data_dir_arg)
                .map(|d| d.data_dir.clone())
                .unwrap()
        };
        for args in [
            &["tenant", "create", "acme", "--config", f][..],
            &["tenant", "durability", "acme", "sync", "--config", f],
            &["key", "create", "acme", "--config", f],
            &["key", "revoke", "acme", "k-1", "--config", f],
            &["key", "cert", "acme", "k-1", "--config", f],
        ] {
            assert_eq!(data_dir(args), PathBuf::from("/srv/cube"), "{args:?}");
        }
        let given =
            |dir: &str| data_dir(&["tenant", "create", "acme", "--config", f, "--data-dir", dir]);
        assert_eq!(given("/x"), PathBuf::from("/x"));
        assert_eq!(
            data_dir(&["tenant", "create", "acme"]),
            PathBuf::from(DEFAULT_DATA_DIR)
        );
        std::fs::write(&file, "data-dir = \"cube-data\"\n").unwrap();
        let err = cubed(&["key", "create", "acme", "--config", f]).unwrap_err();
        assert!(err.to_string().contains("is relative"), "{err}");
        // A relative one is fine on the command line: the operator's own directory is meant.
        assert_eq!(given("rel"), PathBuf::from("rel"));
        std::fs::write(&file, "data-dir = 5\n").unwrap();
        let err = cubed(&["key", "create", "acme", "--config", f]).unwrap_err();
        assert!(
            err.to_string().contains("'data-dir' must be a string"),
            "{err}"
        );
        // No data-dir in the file: the server's default is relative to its working directory.
        std::fs::write(&file, "listen = \"0.0.0.0:50051\"\n").unwrap();
        let err = cubed(&["tenant", "create", "acme", "--config", f]).unwrap_err();
        assert!(err.to_string().contains("names no data-dir"), "{err}");
        assert_eq!(given("/x"), PathBuf::from("/x"));
    }

    /// Each actor thread is started at once: a huge count started threads until the system
    /// refused, and the server never became ready.
    #[test]
    fn actor_threads_are_at_most_1024() {
        let serve = |args: &[&str]| cubed(args).unwrap().serve.validate();
        for n in ["1025", "18446744073709551615"] {
            let err = serve(&["--actor-threads", n]).unwrap_err();
            assert!(err.to_string().contains("--actor-threads"), "{n}: {err}");
        }
        assert_eq!(
            serve(&["--actor-threads", "1024"]).unwrap().actor_threads,
            1024
        );
        assert_eq!(serve(&["--actor-threads", "0"]).unwrap().actor_threads, 1);
    }

    #[test]
    fn durations_added_to_the_clock_are_at_most_a_day() {
        let serve = |args: &[&str]| cubed(args).unwrap().serve.validate();
        // Each of these is added to an Instant; a huge one panicked there (the throttle's
        // cool-down on every refused peer) or wrapped (the idle timer).
        for flag in [
            "--auth-failure-cooldown-secs",
            "--idle-secs",
            "--checkpoint-secs",
            "--drain-secs",
        ] {
            let err = serve(&[flag, "86401"]).unwrap_err();
            assert!(err.to_string().contains(flag), "{flag}: {err}");
            let err = serve(&[flag, "18446744073709551615"]).unwrap_err();
            assert!(err.to_string().contains(flag), "{flag}: {err}");
            serve(&[flag, "86400"]).unwrap();
        }
        // A value's length plus framing must stay a representable (and 32-bit) length.
        for (flag, value) in [
            ("--max-value-bytes", "18446744073709551615"),
            ("--max-value-bytes", "268435457"),
            ("--max-value-bytes", "0"),
            ("--max-message-bytes", "18446744073709551615"),
        ] {
            let err = serve(&[flag, value]).unwrap_err();
            assert!(err.to_string().contains(flag), "{flag} {value}: {err}");
        }
        serve(&[
            "--max-value-bytes",
            "268435456",
            "--max-in-flight-bytes",
            "268435456",
        ])
        .unwrap();
        let err = serve(&["--max-value-bytes", "268435456"]).unwrap_err();
        assert!(err.to_string().contains("--max-in-flight-bytes"), "{err}");
        // A whole message must fit what one connection may be receiving.
        for too_small in ["1048576", "4194304"] {
            let err = serve(&["--max-connection-receive-bytes", too_small]).unwrap_err();
            assert!(
                err.to_string().contains("--max-connection-receive-bytes"),
                "{err}"
            );
        }
        serve(&["--max-connection-receive-bytes", "4194309"]).unwrap();
        assert_eq!(serve(&[]).unwrap().max_connection_receive_bytes, 64 << 20);
        let big = serve(&["--max-message-bytes", "134217728"]).unwrap();
        assert_eq!(big.max_connection_receive_bytes, 256 << 20);
        assert_eq!(serve(&[]).unwrap().max_connection_send_bytes, 64 << 20);
        let big = serve(&["--max-value-bytes", "67108864"]).unwrap();
        assert_eq!(big.max_connection_send_bytes, 128 << 20);
        let err = serve(&["--max-connection-send-bytes", "1114111"]).unwrap_err();
        assert!(
            err.to_string().contains("--max-connection-send-bytes"),
            "{err}"
        );
        serve(&["--max-connection-send-bytes", "1114112"]).unwrap();
        let small = ["--max-value-bytes", "1", "--max-connection-send-bytes"];
        assert!(serve(&[&small[..], &["65536"]].concat()).is_err());
        serve(&[&small[..], &["65537"]].concat()).unwrap();
        // Sizes and times accepted but harmful: a segment of many GiB zero-filled and read
        // whole at every open, a header list of GiB buffered before authentication, a call
        // limit of milliseconds meant as seconds.
        for (flag, value) in [
            ("--wal-segment-max-bytes", "1073741825"),
            ("--wal-segment-max-bytes", "262143"),
            ("--max-metadata-bytes", "1048577"),
            ("--max-metadata-bytes", "4294967295"),
            ("--call-timeout-ms", "5"),
            ("--call-timeout-ms", "99"),
        ] {
            let err = serve(&[flag, value]).unwrap_err();
            assert!(err.to_string().contains(flag), "{flag} {value}: {err}");
        }
        for (flag, value) in [
            ("--wal-segment-max-bytes", "1073741824"),
            ("--max-metadata-bytes", "1048576"),
            ("--call-timeout-ms", "100"),
            ("--call-timeout-ms", "0"),
        ] {
            serve(&[flag, value]).unwrap();
        }
        let config = serve(&["--drain-secs", "0"]).unwrap();
        assert_eq!(config.drain, std::time::Duration::ZERO);
        let config = serve(&[]).unwrap();
        assert_eq!(
            config.drain,
            std::time::Duration::from_secs(DEFAULT_DRAIN_SECS)
        );
    }

    #[test]
    fn a_refused_value_names_its_own_flag_and_only_it() {
        let serve = |args: &[&str]| cubed(args).unwrap().serve.validate();
        let all = [
            "--checkpoint-bytes",
            "--checkpoint-secs",
            "--max-connections",
            "--max-concurrent-streams",
            "--idle-secs",
            "--max-open-tenants",
            "--region-max-cells",
            "--walk-max-visits",
        ];
        for flag in all {
            let err = serve(&[flag, "0"]).unwrap_err().to_string();
            let named: Vec<_> = all.iter().filter(|f| err.contains(**f)).collect();
            assert_eq!(named, [&flag], "{err}");
        }
    }

    #[test]
    fn listen_addresses_are_ip_and_port_on_two_ports() {
        for bad in ["localhost:50051", "127.0.0.1", ":50051"] {
            for flag in ["--listen", "--admin-listen"] {
                // (`parse_with_config` exits on a command-line error, as clap does.)
                let err = <Cli as clap::Parser>::try_parse_from(["cubed", flag, bad])
                    .unwrap_err()
                    .to_string();
                assert!(
                    err.contains(flag) && err.contains("expected IP:PORT"),
                    "{flag} {bad}: {err}"
                );
            }
        }
        let serve = |args: &[&str]| cubed(args).unwrap().serve.validate();
        let same = [
            "--listen",
            "127.0.0.1:7000",
            "--admin-listen",
            "127.0.0.1:7000",
        ];
        let err = serve(&same).unwrap_err().to_string();
        assert!(err.contains("need different ports"), "{err}");
        serve(&["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"]).unwrap();
        serve(&["--listen", "[::1]:7000", "--admin-listen", "127.0.0.1:7001"]).unwrap();
        // Every interface includes the other's address.
        for (listen, admin) in [
            ("0.0.0.0:7000", "127.0.0.1:7000"),
            ("127.0.0.1:7000", "0.0.0.0:7000"),
            ("[::]:7000", "127.0.0.1:7000"),
        ] {
            let err = serve(&[
                "--listen",
                listen,
                "--admin-listen",
                admin,
                "--insecure-plaintext",
            ])
            .unwrap_err()
            .to_string();
            assert!(
                err.contains("need different ports"),
                "{listen} {admin}: {err}"
            );
        }
        // Two distinct addresses of the machine may share a port, as may every IPv4 interface
        // and an IPv6 address.
        serve(&[
            "--listen",
            "127.0.0.1:7000",
            "--admin-listen",
            "127.0.0.2:7000",
        ])
        .unwrap();
        serve(&[
            "--listen",
            "0.0.0.0:7000",
            "--admin-listen",
            "[::1]:7000",
            "--insecure-plaintext",
        ])
        .unwrap();
    }

    #[test]
    fn connection_timeouts_are_checked_and_zero_keepalive_means_none() {
        let serve = |args: &[&str]| cubed(args).unwrap().serve.validate();
        let err = serve(&["--preface-timeout-ms", "99"]).unwrap_err();
        assert!(err.to_string().contains("--preface-timeout-ms"), "{err}");
        // Far deadlines would overflow the clock at every connection.
        let err = serve(&["--preface-timeout-ms", "18446744073709551615"]).unwrap_err();
        assert!(err.to_string().contains("--preface-timeout-ms"), "{err}");
        let err = serve(&["--keepalive-secs", "86401"]).unwrap_err();
        assert!(err.to_string().contains("--keepalive-secs"), "{err}");
        let config = serve(&["--keepalive-secs", "0"]).unwrap();
        assert_eq!(config.keepalive, None);
        let err = serve(&["--call-timeout-ms", "86400001"]).unwrap_err();
        assert!(err.to_string().contains("--call-timeout-ms"), "{err}");
        let config = serve(&["--call-timeout-ms", "60000"]).unwrap();
        assert_eq!(
            config.call_timeout,
            Some(std::time::Duration::from_secs(60))
        );
        let config = serve(&[]).unwrap();
        assert_eq!(config.call_timeout, None);
        assert_eq!(config.keepalive, Some(std::time::Duration::from_secs(60)));
        assert_eq!(config.preface_timeout, std::time::Duration::from_secs(10));
    }

    #[test]
    fn unknown_keys_and_bad_values_are_refused_with_the_key_named() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("cubed.toml");
        std::fs::write(&file, "listne = \"x\"\n").unwrap();
        let f = file.to_str().unwrap();
        let err = parse_with_config(argv(&["cubed", "--config", f])).unwrap_err();
        assert!(
            err.to_string()
                .contains("unknown key 'listne' (did you mean 'listen'?)"),
            "{err}"
        );
        // A file naming another one is refused as such, not as an unknown key that hints at
        // itself ("unknown key 'config' (did you mean 'config'?)").
        std::fs::write(&file, "config = \"other.toml\"\n").unwrap();
        let err = parse_with_config(argv(&["cubed", "--config", f])).unwrap_err();
        assert!(
            err.to_string()
                .contains("'config' cannot be set in a configuration file"),
            "{err}"
        );
        for (typo, meant) in [
            ("idle_secs", "idle-secs"),
            ("max-open-tenant", "max-open-tenants"),
        ] {
            std::fs::write(&file, format!("{typo} = 5\n")).unwrap();
            let err = parse_with_config(argv(&["cubed", "--config", f])).unwrap_err();
            assert!(
                err.to_string()
                    .contains(&format!("(did you mean '{meant}'?)")),
                "{err}"
            );
        }
        // Nothing near: no guess.
        std::fs::write(&file, "colour = 5\n").unwrap();
        let err = parse_with_config(argv(&["cubed", "--config", f])).unwrap_err();
        assert!(!err.to_string().contains("did you mean"), "{err}");
        std::fs::write(&file, "idle-secs = [1]\n").unwrap();
        let err = parse_with_config(argv(&["cubed", "--config", f])).unwrap_err();
        assert!(err.to_string().contains("'idle-secs'"), "{err}");
        // Each bad value: one line naming the file, the key, the value and why, not clap's
        // text about a command-line flag.
        for (contents, want) in [
            (
                "idle-secs = \"soon\"\n",
                "'idle-secs' = \"soon\" is not valid: invalid digit found in string",
            ),
            (
                "auth-mode = \"calls\"\n",
                "'auth-mode' = \"calls\" is not valid: expected one of connection, call, both",
            ),
            (
                "no-demo = \"yes\"\n",
                "'no-demo' is a switch: write `no-demo = true`",
            ),
            ("no-demo = 1\n", "'no-demo' is a switch"),
            (
                "idle-secs = true\n",
                "'idle-secs' takes a value, not true or false",
            ),
            (
                "tls-key = \"\"\n",
                "'tls-key' = \"\" is not valid: a value is required (it is empty)",
            ),
            (
                "tls-cert = \"c.pem\"\n",
                "the following required arguments were not provided: --tls-key <TLS_KEY>",
            ),
        ] {
            std::fs::write(&file, contents).unwrap();
            let err = parse_with_config(argv(&["cubed", "--config", f]))
                .unwrap_err()
                .to_string();
            assert!(err.starts_with(&format!("--config {f}: ")), "{err}");
            assert!(err.contains(want), "{contents}: {err}");
            assert!(!err.contains("error:") && !err.contains('\n'), "{err}");
        }
    }

    #[test]
    fn a_flag_and_the_flag_it_needs_may_come_one_from_each_place() {
        let (_dir, file) = config_file("tls-key = \"/etc/cube/key.pem\"\n");
        let f = file.to_str().unwrap();
        for args in [
            &["--config", f, "--tls-cert", "/etc/cube/cert.pem"][..],
            &["serve", "--config", f, "--tls-cert", "/etc/cube/cert.pem"][..],
        ] {
            let cli = cubed(args).unwrap();
            let serve = match cli.command {
                Some(Command::Serve(serve)) => serve,
                _ => cli.serve,
            };
            assert_eq!(
                serve.tls_cert.unwrap(),
                std::path::Path::new("/etc/cube/cert.pem")
            );
            assert_eq!(
                serve.tls_key.unwrap(),
                std::path::Path::new("/etc/cube/key.pem")
            );
        }
        // Still needed: when neither place gives the partner, the parse of both refuses.
        let (_dir, other) = config_file("idle-secs = 5\n");
        let err = cubed(&["--config", other.to_str().unwrap(), "--tls-cert", "c.pem"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("not provided: --tls-key"), "{err}");
    }
}
