//! cubec: a minimal command-line client. Signs every call (per-call auth) unless told to run the
//! handshake (`--auth connection`) or given a client certificate (mTLS).

use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use cube_api::v1::cells_client::CellsClient;
use cube_api::v1::tenant_client::TenantClient;
use cube_api::v1::{AuditEntry, AuditRequest, StatsRequest, TenantTotals};
use cube_api::v1::{Coord, DeleteRequest, ReadRequest, WriteRequest};
use cube_auth::Credentials;
use cube_auth::client::{CallSigner, HandshakeError, Signing};
use tonic::transport::{Channel, Endpoint};

mod access;
mod deadline;
mod graph;
mod load;
mod region;
use deadline::{Bounded, NoAnswer};

/// What cubec's clients call through: the connection, every call bounded by `--timeout-secs`,
/// signed in the per-call model.
type Transport = Signing<Bounded<Channel>>;

const DEFAULT_ENDPOINT: &str = "http://127.0.0.1:50051";
/// The default address when a client certificate (so TLS) is given.
const DEFAULT_TLS_ENDPOINT: &str = "https://127.0.0.1:50051";
const DEFAULT_CREDENTIALS: &str = "./cube-data/dev-credentials.json";

/// Command-line client for cubed.
#[derive(Debug, Parser)]
#[command(
    name = "cubec",
    version,
    after_help = "Exit status: 0 done, 1 failed (connection, refusal, bad credentials), 2 usage \
                  error, 3 `audit verify` found the audit chain broken (or `audit list` met \
                  entries missing from the server's trail, or one sent twice or out of \
                  order)."
)]
struct Cli {
    /// Server address; default: the credentials file's endpoint, else http://127.0.0.1:50051
    /// (https:// with --cert).
    #[arg(long, env = "CUBE_ENDPOINT", global = true)]
    endpoint: Option<String>,
    /// Credentials JSON ({"tenant","key_id","secret"}); default ./cube-data/dev-credentials.json.
    /// Alternatively set all three of CUBE_TENANT, CUBE_KEY_ID and CUBE_SECRET (not together
    /// with this). With --cert, only its endpoint is used (when the file exists).
    #[arg(long, env = "CUBE_CREDENTIALS", global = true)]
    credentials: Option<PathBuf>,
    /// CA certificate (PEM) to trust for an https:// endpoint (not used, with a note, for an
    /// http:// one); default ./cube-data/tls/ca.pem.
    #[arg(long, env = "CUBE_CA", global = true)]
    ca: Option<PathBuf>,
    /// Whether `ca` came from CUBE_CA (to name it in messages).
    #[arg(skip)]
    ca_from_env: bool,
    /// Name the server's certificate must carry; default: the endpoint's host.
    #[arg(long, env = "CUBE_TLS_SERVER_NAME", global = true)]
    tls_server_name: Option<String>,
    /// Client certificate (PEM) from `cubed key cert`: authenticates the connection (mTLS, so
    /// an https:// endpoint); no --auth then, and a credentials file only for its endpoint.
    #[arg(long, env = "CUBE_CERT", global = true, requires = "key")]
    cert: Option<PathBuf>,
    /// Private key (PEM) of --cert.
    #[arg(long, env = "CUBE_KEY", global = true, requires = "cert")]
    key: Option<PathBuf>,
    /// Authentication model: sign every call (the default), or authenticate the connection
    /// once.
    #[arg(long, env = "CUBE_AUTH", value_enum, global = true)]
    auth: Option<AuthModel>,
    /// Seconds to wait for the connection, for each call's whole answer (sent to the server
    /// as the call's grpc-timeout), and for a streamed answer's head and each of its entries
    /// (0: no limit).
    #[arg(long, env = "CUBE_TIMEOUT_SECS", global = true, default_value_t = DEFAULT_TIMEOUT_SECS)]
    timeout_secs: u64,
    #[command(subcommand)]
    command: Cmd,
}

/// `--timeout-secs` unless given.
const DEFAULT_TIMEOUT_SECS: u64 = 30;

/// Where the endpoint came from when nothing named one.
const DEFAULT_ORIGIN: &str = "cubec's default";

/// `--timeout-secs` as given, for the message of a call that ran out of it.
static TIMEOUT_SECS: std::sync::atomic::AtomicU64 =
    std::sync::atomic::AtomicU64::new(DEFAULT_TIMEOUT_SECS);

/// Set once cubec's handshake authenticated its connection, for the message of a call the
/// server then finds unauthenticated: the connection was made again under it, and a new
/// connection has no session.
static HANDSHAKE_DONE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Set when the connection presents a client certificate, for the message of a call the server
/// finds unauthenticated anyway: it took no certificate.
static CERTIFICATE_GIVEN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

impl Cli {
    /// `--timeout-secs` as a limit (None: no limit).
    fn time_limit(&self) -> Option<std::time::Duration> {
        (self.timeout_secs > 0).then(|| std::time::Duration::from_secs(self.timeout_secs))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum AuthModel {
    /// Per-call HMAC signatures.
    Call,
    /// One Auth.Challenge/Auth.Hello handshake for the connection.
    Connection,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Write VALUE (UTF-8 text), or the bytes of --value-file, at (X, Y, Z).
    // `-h` is a value here (help is `--help`), as any other value starting with `-`.
    #[command(allow_negative_numbers = true, disable_help_flag = true)]
    Write {
        /// X coordinate (a signed 32-bit integer).
        x: i32,
        /// Y coordinate.
        y: i32,
        /// Z coordinate.
        z: i32,
        /// The value (it may start with `-`: `cubec write 1 2 3 -hot` writes "-hot", and `-h`
        /// is a value here too: help is `--help`).
        #[arg(
            required_unless_present = "value_file",
            conflicts_with = "value_file",
            allow_hyphen_values = true
        )]
        value: Option<String>,
        /// Write this file's bytes (any bytes; `-` reads standard input).
        #[arg(long)]
        value_file: Option<PathBuf>,
        /// Write only if the cell is at this version (0 = must not exist).
        #[arg(long)]
        expected_version: Option<u64>,
        /// Print help.
        #[arg(long, action = clap::ArgAction::Help)]
        help: Option<bool>,
    },
    /// Read the cell at (X, Y, Z).
    #[command(allow_negative_numbers = true)]
    Read {
        /// X coordinate (a signed 32-bit integer).
        x: i32,
        /// Y coordinate.
        y: i32,
        /// Z coordinate.
        z: i32,
    },
    /// Delete the cell at (X, Y, Z).
    #[command(allow_negative_numbers = true)]
    Delete {
        /// X coordinate (a signed 32-bit integer).
        x: i32,
        /// Y coordinate.
        y: i32,
        /// Z coordinate.
        z: i32,
        /// Delete only if the cell is at this version.
        #[arg(long)]
        expected_version: Option<u64>,
    },
    /// Write the cells of a JSON Lines file, one per line: {"x":1,"y":-2,"z":3,"value":"text"}, or
    /// "value_hex" for any bytes, optionally "expected_version" (and "version" and "sealed", as
    /// `region` prints them, taken and not restored). Prints {"cells", "value_bytes", "seconds",
    /// "cells_per_s", "busy_retries"}; progress on a terminal. The first failed line stops the
    /// load, and the error says what is written and where to resume.
    Load {
        /// The file (`-` reads standard input).
        file: PathBuf,
        /// Writes in flight at once on the connection (1 to 256).
        #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..=256))]
        concurrency: u16,
    },
    /// Seal the cell at (X, Y, Z): it can no longer change. Prints {"digest" (SHA-256 of the
    /// value, hex), "version"}.
    #[command(allow_negative_numbers = true)]
    Seal {
        #[command(flatten)]
        at: At,
    },
    /// Store PROGRAM (UTF-8 text), or the bytes of --program-file, as the program at (X, Y, Z).
    /// Prints {"version", "seq"}.
    // PROGRAM may start with `-`, `-h` too (help is `--help`), as write's VALUE.
    #[command(allow_negative_numbers = true, disable_help_flag = true)]
    Prog {
        #[command(flatten)]
        at: At,
        /// The program's bytes as text (it may start with `-`; one starting with `--` only
        /// after a bare `--`).
        #[arg(
            required_unless_present = "program_file",
            conflicts_with = "program_file",
            allow_hyphen_values = true
        )]
        program: Option<String>,
        /// Store this file's bytes (any bytes; `-` reads standard input).
        #[arg(long)]
        program_file: Option<PathBuf>,
        /// Print help.
        #[arg(long, action = clap::ArgAction::Help)]
        help: Option<bool>,
    },
    /// Run the program at (X, Y, Z) with --input (default: none): counts the run and records
    /// it. Prints {"program" (or "program_hex"), "run_count"}. Not idempotent: a repeated run
    /// counts twice.
    #[command(allow_negative_numbers = true)]
    Run {
        #[command(flatten)]
        at: At,
        /// The run's input as text (it may start with `-`).
        #[arg(long, conflicts_with = "input_file", allow_hyphen_values = true)]
        input: Option<String>,
        /// The run's input from this file (`-` reads standard input).
        #[arg(long)]
        input_file: Option<PathBuf>,
    },
    /// Create the edge labelled LABEL from (X1, Y1, Z1) to (X2, Y2, Z2). Prints {"created"}
    /// (false: it existed).
    // LABEL may start with `-`, `-h` too (help is `--help`).
    #[command(allow_negative_numbers = true, disable_help_flag = true)]
    Link {
        #[command(flatten)]
        ends: Ends,
        /// The edge's label, 1 to 64 bytes of UTF-8 (it may start with `-`; one starting with
        /// `--` only after a bare `--`).
        #[arg(allow_hyphen_values = true)]
        label: String,
        /// Print help.
        #[arg(long, action = clap::ArgAction::Help)]
        help: Option<bool>,
    },
    /// Remove the edge labelled LABEL from (X1, Y1, Z1) to (X2, Y2, Z2). Prints {"existed"}.
    #[command(allow_negative_numbers = true, disable_help_flag = true)]
    Unlink {
        #[command(flatten)]
        ends: Ends,
        /// The edge's label (as for link).
        #[arg(allow_hyphen_values = true)]
        label: String,
        /// Print help.
        #[arg(long, action = clap::ArgAction::Help)]
        help: Option<bool>,
    },
    /// The cells reachable from (X, Y, Z) along edges, breadth first. Prints {"visits":
    /// [{"x","y","z","depth"}…], "truncated"}.
    #[command(allow_negative_numbers = true)]
    Walk {
        #[command(flatten)]
        at: At,
        /// Edges to follow at most from the start (1 to 16; default 16).
        #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=16))]
        max_depth: u32,
        /// Visits to return at most (0: the server's default, 1000).
        #[arg(long, default_value_t = 0)]
        limit: u32,
        /// Follow only edges with this label (repeat for several; default: every label).
        #[arg(long = "label", allow_hyphen_values = true)]
        labels: Vec<String>,
    },
    /// Print every cell of the box from (X1, Y1, Z1) to (X2, Y2, Z2), both included, as JSON
    /// lines that `cubec load` reads: {"x","y","z","value" (or "value_hex"),"version","sealed"}.
    #[command(allow_negative_numbers = true)]
    Region {
        /// The lower corner.
        x1: i32,
        y1: i32,
        z1: i32,
        /// The upper corner (every axis at least the lower corner's).
        x2: i32,
        y2: i32,
        z2: i32,
        /// Print at most this many cells (default: all).
        #[arg(long)]
        limit: Option<u64>,
    },
    /// The tenant's audit trail.
    #[command(subcommand)]
    Audit(AuditCmd),
    /// The tenant's totals (Tenant.Stats): cells, edges, runs, what they store against its
    /// storage quota, its log.
    Stats,
    /// Give KEY_ID (a key of this tenant) capabilities: read, write, admin (Access.Grant; the
    /// calling key needs admin). Takes effect on that key's next call. Prints {"key_id",
    /// "capabilities"} (what the key holds now).
    Grant {
        /// The key to change.
        key_id: String,
        /// One or more of read, write, admin.
        #[arg(required = true, value_enum, ignore_case = true)]
        capabilities: Vec<access::Cap>,
    },
    /// Take capabilities from KEY_ID (Access.Revoke; the calling key needs admin). The tenant's
    /// last key holding admin keeps it. Prints {"key_id", "capabilities"} (what the key holds
    /// now; empty when none is left).
    Revoke {
        /// The key to change.
        key_id: String,
        /// One or more of read, write, admin.
        #[arg(required = true, value_enum, ignore_case = true)]
        capabilities: Vec<access::Cap>,
    },
}

/// A cell's coordinates, as the commands on one cell take them.
#[derive(Debug, clap::Args)]
struct At {
    /// X coordinate (a signed 32-bit integer).
    x: i32,
    /// Y coordinate.
    y: i32,
    /// Z coordinate.
    z: i32,
}

impl At {
    fn coord(&self) -> Coord {
        Coord {
            x: self.x,
            y: self.y,
            z: self.z,
        }
    }
}

/// An edge's ends, as link and unlink take them.
#[derive(Debug, clap::Args)]
struct Ends {
    /// The source's X coordinate (a signed 32-bit integer).
    x1: i32,
    /// The source's Y coordinate.
    y1: i32,
    /// The source's Z coordinate.
    z1: i32,
    /// The target's X coordinate.
    x2: i32,
    /// The target's Y coordinate.
    y2: i32,
    /// The target's Z coordinate.
    z2: i32,
}

impl Ends {
    fn coords(&self) -> (Coord, Coord) {
        (
            At {
                x: self.x1,
                y: self.y1,
                z: self.z1,
            }
            .coord(),
            At {
                x: self.x2,
                y: self.y2,
                z: self.z2,
            }
            .coord(),
        )
    }
}

#[derive(Debug, Subcommand)]
enum AuditCmd {
    /// Print entries as JSON lines.
    List {
        /// First sequence number to print (older entries are skipped; 0: the oldest retained).
        #[arg(long, default_value_t = 0)]
        from: u64,
        /// Entries to print at most (0 prints none).
        #[arg(long, default_value_t = 100)]
        limit: u32,
    },
    /// Fetch the whole retained trail, recompute the hash chain and name the first broken link.
    Verify,
}

/// The variables that give credentials instead of a file.
const CREDENTIAL_VARS: [&str; 3] = ["CUBE_TENANT", "CUBE_KEY_ID", "CUBE_SECRET"];

fn load_credentials(path: Option<&PathBuf>) -> anyhow::Result<Credentials> {
    let vars = CREDENTIAL_VARS.map(|v| std::env::var(v).ok());
    if vars.iter().any(Option::is_some) {
        // Half a set, or a set beside a file, would otherwise fall back to the file (usually the
        // demo tenant's) and act as the wrong tenant without a word.
        let missing: Vec<&str> = CREDENTIAL_VARS
            .iter()
            .zip(&vars)
            .filter(|(_, v)| v.is_none())
            .map(|(name, _)| *name)
            .collect();
        anyhow::ensure!(
            missing.is_empty(),
            "{} set but {} not: set all three of CUBE_TENANT, CUBE_KEY_ID and CUBE_SECRET, or none",
            CREDENTIAL_VARS
                .iter()
                .filter(|v| !missing.contains(v))
                .copied()
                .collect::<Vec<_>>()
                .join(", "),
            missing.join(", ")
        );
        anyhow::ensure!(
            path.is_none(),
            "credentials given twice: by CUBE_TENANT/CUBE_KEY_ID/CUBE_SECRET and by \
             --credentials/CUBE_CREDENTIALS ({}); unset one",
            path.map(|p| p.display().to_string()).unwrap_or_default()
        );
        if let Some((name, _)) = CREDENTIAL_VARS
            .iter()
            .zip(&vars)
            .find(|(_, v)| v.as_deref().is_some_and(|v| v.trim().is_empty()))
        {
            anyhow::bail!("{name} is set but empty: give it a value, or unset all three");
        }
        let [tenant, key_id, secret] = vars.map(Option::unwrap_or_default);
        let creds = Credentials {
            tenant,
            key_id,
            secret,
            endpoint: None,
        };
        creds.secret().context("CUBE_SECRET")?;
        check_ids(&creds, "CUBE_TENANT", "CUBE_KEY_ID")?;
        return Ok(creds);
    }
    let path = path
        .cloned()
        .unwrap_or_else(|| PathBuf::from(DEFAULT_CREDENTIALS));
    let creds = load_credentials_file(
        &path,
        "use --credentials or CUBE_TENANT/CUBE_KEY_ID/CUBE_SECRET",
    )?;
    // Checked before connecting, so that a bad secret is not reported only once a server is up.
    creds
        .secret()
        .with_context(|| format!("the secret in {}", path.display()))?;
    let (tenant, key_id) = (
        format!("the tenant in {}", path.display()),
        format!("the key_id in {}", path.display()),
    );
    check_ids(&creds, &tenant, &key_id)?;
    Ok(creds)
}

/// A tenant name and key id a server could take: a tenant name is `[a-z0-9][a-z0-9-]{0,62}`
/// (docs/protocol.md), a key id printable ASCII. Anything else (a non-ASCII letter, a stray
/// control character from a paste) would be sent as a header the server cannot read, or not
/// at all, and the call refused as unsigned ("missing credentials"), pointing at the wrong
/// cause, and counted against this address's failed authentications.
fn check_ids(creds: &Credentials, tenant_from: &str, key_from: &str) -> anyhow::Result<()> {
    let t = creds.tenant.as_bytes();
    let tenant_ok = (1..=63).contains(&t.len())
        && t[0] != b'-'
        && t.iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-');
    anyhow::ensure!(
        tenant_ok,
        "{tenant_from} ({:?}) is not a tenant name: 1 to 63 characters of a-z, 0-9 and -, not \
         starting with -",
        creds.tenant
    );
    anyhow::ensure!(
        !creds.key_id.is_empty() && creds.key_id.bytes().all(|b| b.is_ascii_graphic()),
        "{key_from} ({:?}) is not a key id: printable ASCII, as `cubed key create` prints it",
        creds.key_id
    );
    Ok(())
}

/// The credentials in `path`; `advice` (what to do instead) goes into the error, so that each
/// caller gives its own and a message never carries two.
fn load_credentials_file(path: &Path, advice: &str) -> anyhow::Result<Credentials> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read credentials from {} ({advice})", path.display()))?;
    serde_json::from_str(&text).with_context(|| {
        format!(
            "{} is not a credentials JSON file ({advice})",
            path.display()
        )
    })
}

/// The endpoint of a client-certificate (mTLS) call without --endpoint, and where it came from:
/// the credentials file's, as for signed calls (its key material is not used), else the default
/// address over TLS. An explicit --credentials file must be readable; the default one is read
/// only if it exists, so that only the two PEM files need to reach a client (docs/protocol.md).
fn certificate_endpoint(path: Option<&PathBuf>) -> anyhow::Result<(String, String)> {
    let default = Path::new(DEFAULT_CREDENTIALS);
    let file = match path {
        Some(p) => Some(p.as_path()),
        None => default.exists().then_some(default),
    };
    if let Some(file) = file {
        let creds = load_credentials_file(
            file,
            "with --cert only its endpoint is needed: pass --endpoint instead",
        )?;
        if let Some(endpoint) = creds.endpoint {
            return Ok((endpoint, file.display().to_string()));
        }
    }
    Ok((DEFAULT_TLS_ENDPOINT.into(), DEFAULT_ORIGIN.into()))
}

/// `audit verify` found a broken link: exit code [`EXIT_BROKEN_CHAIN`], so that a script can
/// tell tampering from a failure to check (exit 1).
#[derive(Debug)]
struct BrokenChain {
    seq: u64,
    why: String,
}

impl std::fmt::Display for BrokenChain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "audit chain broken at seq {}: {}", self.seq, self.why)
    }
}

impl std::error::Error for BrokenChain {}

/// The exit code of a broken audit chain (the others: `Cli`'s `after_help`).
const EXIT_BROKEN_CHAIN: u8 = 3;

fn main() -> std::process::ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("cubec: error: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let code = match runtime.block_on(run()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cubec: error: {}", cube_cli::error_chain(&e));
            if e.downcast_ref::<BrokenChain>().is_some() {
                std::process::ExitCode::from(EXIT_BROKEN_CHAIN)
            } else {
                std::process::ExitCode::FAILURE
            }
        }
    };
    // Not waiting for blocking work left behind: a `load -` that stopped may have a read of
    // standard input outstanding, which would hold the exit until more input or its end.
    runtime.shutdown_background();
    code
}

async fn run() -> anyhow::Result<()> {
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let usage =
        |e: clap::Error| -> ! { cube_cli::exit_naming_the_variable(&e, &argv, &Cli::command()) };
    let matches = Cli::command()
        .try_get_matches_from(&argv)
        .unwrap_or_else(|e| usage(e));
    let mut cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| usage(e));
    cli.ca_from_env = matches.value_source("ca") == Some(clap::parser::ValueSource::EnvVariable);
    let free_text = match &cli.command {
        Cmd::Write {
            value: Some(value), ..
        } => Some((value, "cubec write X Y Z")),
        Cmd::Prog {
            program: Some(program),
            ..
        } => Some((program, "cubec prog X Y Z")),
        Cmd::Link { label, .. } => Some((label, "cubec link X1 Y1 Z1 X2 Y2 Z2")),
        Cmd::Unlink { label, .. } => Some((label, "cubec unlink X1 Y1 Z1 X2 Y2 Z2")),
        _ => None,
    };
    if let Some((value, usage)) = free_text
        && let Err(why) = check_hyphen_value(value, usage, std::env::args_os())
    {
        // A usage error, as clap's own (exit code 2).
        Cli::command()
            .error(clap::error::ErrorKind::UnknownArgument, why)
            .exit();
    }
    // A client certificate authenticates the connection: no key material is needed besides it.
    let creds = match &cli.cert {
        Some(_) => {
            // Key material named beside the certificate would be silently unused, and the
            // calls made as the certificate's key: refused, as a file beside the variables is.
            let named: Vec<&str> = ["CUBE_TENANT", "CUBE_KEY_ID", "CUBE_SECRET"]
                .into_iter()
                .filter(|v| std::env::var_os(v).is_some())
                .collect();
            anyhow::ensure!(
                named.is_empty(),
                "{} name a key, but --cert authenticates the connection as the key its \
                 certificate names: unset them, or leave out --cert and --key",
                named.join(", ")
            );
            if let Some(file) = &cli.credentials {
                eprintln!(
                    "cubec: note: the key in {} is not used: the client certificate \
                     authenticates the connection (only the file's endpoint is)",
                    file.display()
                );
            }
            anyhow::ensure!(
                cli.auth.is_none(),
                "--cert authenticates the connection itself: {}",
                if matches.value_source("auth") == Some(clap::parser::ValueSource::EnvVariable) {
                    "unset CUBE_AUTH (it chooses how a key authenticates)"
                } else {
                    "leave out --auth"
                }
            );
            None
        }
        None => Some(load_credentials(cli.credentials.as_ref())?),
    };
    // And where it came from, for the messages below.
    let (endpoint, origin) = match (&cli.endpoint, &creds) {
        (Some(e), _) => (e.clone(), "--endpoint or CUBE_ENDPOINT".to_string()),
        (None, Some(creds)) => match &creds.endpoint {
            Some(e) => (e.clone(), "the credentials file".to_string()),
            None => (DEFAULT_ENDPOINT.into(), DEFAULT_ORIGIN.to_string()),
        },
        (None, None) => certificate_endpoint(cli.credentials.as_ref())?,
    };
    let target = Target::new(endpoint, origin, &cli)?;
    anyhow::ensure!(
        target.tls || cli.cert.is_none(),
        "--cert needs an https:// endpoint (a client certificate is presented in the TLS \
         handshake), not {} (from {})",
        target.endpoint,
        target.origin
    );
    // A CA given for a plaintext endpoint is not used: said, so that nobody takes these calls
    // for encrypted. (Not refused: a wrong scheme is diagnosed below, by what the server
    // answers, and CUBE_CA may be set for other endpoints.)
    if !target.tls && cli.ca.is_some() {
        eprintln!(
            "cubec: note: {} is not used: {} (from {}) is plaintext; use https:// for TLS",
            if cli.ca_from_env { "CUBE_CA" } else { "--ca" },
            target.endpoint,
            target.origin
        );
    }
    if !target.tls && cli.tls_server_name.is_some() {
        eprintln!(
            "cubec: note: --tls-server-name is not used: {} (from {}) is plaintext; use \
             https:// for TLS",
            target.endpoint, target.origin
        );
    }
    let mut ep = Endpoint::from_shared(target.endpoint.clone())
        .with_context(|| format!("bad endpoint {}", target.endpoint))?;
    // An unreachable address, or a server that takes the connection and never answers (stopped,
    // say), ends the command instead of hanging it. The connect is bounded as a whole (tonic's
    // connect timeout covers TCP only, not the TLS handshake), and so is each unary call, its
    // answer included, and a streamed answer's head (`deadline`; its entries in `fetch_audit`);
    // a reconnect between two calls is bounded by both.
    let limit = cli.time_limit();
    TIMEOUT_SECS.store(cli.timeout_secs, std::sync::atomic::Ordering::Relaxed);
    if let Some(limit) = limit {
        ep = ep.connect_timeout(limit);
    }
    if target.tls {
        let config = tls_config(&cli, &target.ca)?;
        // tonic checks the name the certificate must carry only here, and its error names no
        // source ("invalid dns name"): checked first, and named.
        let name = cli
            .tls_server_name
            .clone()
            .or_else(|| {
                // As tonic takes it: an IPv6 host without its brackets.
                let host = ep.uri().host()?;
                let bare = host.strip_prefix('[').and_then(|h| h.strip_suffix(']'));
                Some(bare.unwrap_or(host).to_owned())
            })
            .unwrap_or_default();
        if rustls_pki_types::ServerName::try_from(name.as_str()).is_err() {
            anyhow::bail!(
                "{name:?} is not a DNS name or an IP address the server's certificate could \
                 name: {}",
                if cli.tls_server_name.is_some() {
                    "check --tls-server-name".to_owned()
                } else {
                    format!(
                        "check the host of {} (from {}), or give --tls-server-name",
                        target.endpoint, target.origin
                    )
                }
            );
        }
        ep = ep
            .tls_config(config)
            .context("loading the TLS files (--ca, --cert, --key)")?;
    }
    let connecting = ep.connect();
    let connected = match limit {
        Some(limit) => tokio::time::timeout(limit, connecting).await.map_err(|_| {
            anyhow::anyhow!(
                "no answer within --timeout-secs while connecting to {} (from {}): nothing \
                 answered, or the server took the connection and did not complete the handshake \
                 (stopped or overloaded?); 0 for no limit",
                target.endpoint,
                target.origin
            )
        })?,
        None => connecting.await,
    };
    let channel = match connected {
        Ok(channel) => channel,
        Err(e) => return Err(target.connect_error(e).await),
    };
    let channel = Bounded::new(channel, limit);
    let result = calls(cli, creds.as_ref(), channel).await;
    // A call that failed in the connection, not with the server's answer, is explained here,
    // where the endpoint is known.
    if let Err(e) = &result
        && let Some(failure) = e.chain().find_map(|c| c.downcast_ref::<TransportFailure>())
    {
        let explained = target.transport_failure(failure).await;
        // A stopped load's account of what it wrote stays above the explanation.
        return Err(match e.downcast_ref::<load::Stopped>() {
            Some(stopped) => explained.context(stopped.clone()),
            None => explained,
        });
    }
    result
}

/// The calls of `cli`'s command over `channel`.
async fn calls(
    cli: Cli,
    creds: Option<&Credentials>,
    channel: Bounded<Channel>,
) -> anyhow::Result<()> {
    let transport = match (creds, cli.auth.unwrap_or(AuthModel::Call)) {
        // The client certificate already authenticates the connection.
        (None, _) => {
            CERTIFICATE_GIVEN.store(true, std::sync::atomic::Ordering::Relaxed);
            Signing::passthrough(channel)
        }
        (Some(creds), AuthModel::Call) => {
            let secret = creds.secret().context("the credentials' secret")?;
            Signing::new(
                channel,
                CallSigner::new(&creds.tenant, &creds.key_id, secret),
            )
        }
        (Some(creds), AuthModel::Connection) => {
            cube_auth::client::handshake(channel.clone(), creds)
                .await
                .map_err(|e| match e {
                    // A status with a source was made by the client (a timeout, a broken
                    // connection): no refusal.
                    HandshakeError::Refused(s) if std::error::Error::source(&s).is_some() => {
                        status(s)
                    }
                    HandshakeError::Refused(s) => status(s).context("handshake refused"),
                    other => anyhow::Error::new(other).context("handshake"),
                })?;
            HANDSHAKE_DONE.store(true, std::sync::atomic::Ordering::Relaxed);
            Signing::passthrough(channel)
        }
    };
    let wait = cli.time_limit();
    // No client-side cap on answers: the server's `--max-message-bytes` bounds what it sends,
    // and tonic's default of 4 MiB would refuse to read back a value the server took.
    let mut cells = CellsClient::new(transport.clone()).max_decoding_message_size(usize::MAX);
    let coord = |x, y, z| Some(Coord { x, y, z });
    if let Cmd::Audit(audit) = &cli.command {
        let mut tenant = TenantClient::new(transport).max_decoding_message_size(usize::MAX);
        return match audit {
            AuditCmd::List { from, limit } => {
                // `--limit 0` asks for nothing (docs/protocol.md); in the rpc 0 would mean the
                // server's default page, so it is not sent.
                if *limit == 0 {
                    return Ok(());
                }
                for e in fetch_audit(&mut tenant, *from, Some(*limit), wait).await? {
                    out(entry_json(&e));
                }
                Ok(())
            }
            AuditCmd::Verify => {
                const ATTEMPTS: usize = 3;
                for attempt in 1..=ATTEMPTS {
                    // The trail's head first: the trail read after it must reach it (the chain
                    // alone cannot show its newest entries removed).
                    let head = totals(&mut tenant).await?;
                    let entries = fetch_audit(&mut tenant, 0, None, wait).await?;
                    let (seq, why) = match cube_auth::client::verify_audit_entries(&entries) {
                        Ok(_) => match reaches_head(&entries, &head)? {
                            true => {
                                let last = entries.last();
                                out(serde_json::json!({
                                    "ok": true,
                                    "entries": entries.len(),
                                    "last_seq": last.map_or(0, |e| e.seq),
                                    "last_hash": last.map(|e| hex(&e.hash)),
                                }));
                                return Ok(());
                            }
                            // Retention expired the head's entry while the pages were read.
                            false if attempt < ATTEMPTS => continue,
                            false => return Err(expiring_too_fast(ATTEMPTS)),
                        },
                        Err(broken) => broken,
                    };
                    // Retention removing entries while the pages were read leaves a gap that
                    // is no break: then the entry before the gap has expired by now too. Read
                    // the whole trail again.
                    let before_gap = entries
                        .windows(2)
                        .find(|w| w[1].seq == seq && w[0].seq + 1 != seq)
                        .map(|w| w[0].seq);
                    let oldest = fetch_audit(&mut tenant, 0, Some(1), wait).await?;
                    let expired =
                        matches!((before_gap, oldest.first()), (Some(p), Some(o)) if o.seq > p);
                    if !expired {
                        return Err(BrokenChain { seq, why }.into());
                    }
                    if attempt == ATTEMPTS {
                        return Err(expiring_too_fast(ATTEMPTS));
                    }
                }
                Ok(())
            }
        };
    }
    if let Cmd::Load { file, concurrency } = &cli.command {
        let started = std::time::Instant::now();
        let loaded = load::load(cells, file, usize::from(*concurrency), status).await?;
        let seconds = started.elapsed().as_secs_f64();
        if loaded.sealed_not_restored > 0 {
            eprintln!(
                "cubec: note: {} of the lines said their cell was sealed; a load writes cells, \
                 it does not seal them (Cells.Seal does)",
                loaded.sealed_not_restored
            );
        }
        out(serde_json::json!({
            "cells": loaded.cells,
            "value_bytes": loaded.value_bytes,
            "seconds": (seconds * 1000.0).round() / 1000.0,
            "cells_per_s": (loaded.cells as f64 / seconds.max(1e-9)).round(),
            "busy_retries": loaded.busy_retries,
        }));
        return Ok(());
    }
    if let Cmd::Region {
        x1,
        y1,
        z1,
        x2,
        y2,
        z2,
        limit,
    } = cli.command
    {
        let (min, max) = (
            Coord {
                x: x1,
                y: y1,
                z: z1,
            },
            Coord {
                x: x2,
                y: y2,
                z: z2,
            },
        );
        region::region(&mut cells, min, max, limit, wait, status).await?;
        return Ok(());
    }
    if let Cmd::Grant {
        key_id,
        capabilities,
    }
    | Cmd::Revoke {
        key_id,
        capabilities,
    } = &cli.command
    {
        let grant = matches!(cli.command, Cmd::Grant { .. });
        out(access::change(transport, grant, key_id.clone(), capabilities, status).await?);
        return Ok(());
    }
    if let Cmd::Stats = &cli.command {
        let t = totals(&mut TenantClient::new(transport)).await?;
        out(serde_json::json!({
            "cells": t.cells,
            "edges": t.edges,
            "sealed": t.sealed,
            "programs": t.programs,
            "runs": t.runs,
            "stored_bytes": t.stored_bytes,
            "quota_bytes": t.quota_bytes,
            "wal_bytes": t.wal_bytes,
            "last_seq": t.last_seq,
            "checkpoint_seq": t.checkpoint_seq,
            "durability": t.durability,
            "audit_last_seq": t.audit_last_seq,
            "audit_last_hash": hex(&t.audit_last_hash),
        }));
        return Ok(());
    }
    let answer = match cli.command {
        Cmd::Write {
            x,
            y,
            z,
            value,
            value_file,
            expected_version,
            ..
        } => {
            let value = text_or_file(value, value_file, "--value-file")?
                .context("give VALUE or --value-file")?;
            let r = cells
                .write(WriteRequest {
                    coord: coord(x, y, z),
                    value,
                    expected_version,
                })
                .await
                .map_err(status)?
                .into_inner();
            serde_json::json!({ "version": r.version, "seq": r.seq })
        }
        Cmd::Read { x, y, z } => {
            let r = cells
                .read(ReadRequest {
                    coord: coord(x, y, z),
                })
                .await
                .map_err(status)?
                .into_inner();
            match String::from_utf8(r.value.clone()) {
                Ok(text) => {
                    serde_json::json!({ "found": r.found, "value": text, "version": r.version, "sealed": r.sealed })
                }
                Err(_) => {
                    serde_json::json!({ "found": r.found, "value_hex": hex(&r.value), "version": r.version, "sealed": r.sealed })
                }
            }
        }
        Cmd::Seal { at } => graph::call(&mut cells, graph::Call::Seal(at.coord()), status).await?,
        Cmd::Prog {
            at,
            program,
            program_file,
            ..
        } => {
            let program = text_or_file(program, program_file, "--program-file")?
                .context("give PROGRAM or --program-file")?;
            graph::call(&mut cells, graph::Call::Prog(at.coord(), program), status).await?
        }
        Cmd::Run {
            at,
            input,
            input_file,
        } => {
            let input = text_or_file(input, input_file, "--input-file")?.unwrap_or_default();
            graph::call(&mut cells, graph::Call::Run(at.coord(), input), status).await?
        }
        Cmd::Link { ends, label, .. } => {
            let (from, to) = ends.coords();
            graph::call(&mut cells, graph::Call::Link(from, to, label), status).await?
        }
        Cmd::Unlink { ends, label, .. } => {
            let (from, to) = ends.coords();
            graph::call(&mut cells, graph::Call::Unlink(from, to, label), status).await?
        }
        Cmd::Walk {
            at,
            max_depth,
            limit,
            labels,
        } => {
            let call = graph::Call::Walk {
                start: at.coord(),
                max_depth,
                limit,
                labels,
            };
            graph::call(&mut cells, call, status).await?
        }
        Cmd::Audit(_)
        | Cmd::Stats
        | Cmd::Load { .. }
        | Cmd::Region { .. }
        | Cmd::Grant { .. }
        | Cmd::Revoke { .. } => {
            unreachable!("handled above")
        }
        Cmd::Delete {
            x,
            y,
            z,
            expected_version,
        } => {
            let r = cells
                .delete(DeleteRequest {
                    coord: coord(x, y, z),
                    expected_version,
                })
                .await
                .map_err(status)?
                .into_inner();
            serde_json::json!({ "existed": r.existed, "seq": r.seq })
        }
    };
    out(answer);
    Ok(())
}

/// The next message of a streamed answer, within `wait` of the one before: the call's own
/// timeout ends when the stream's head arrives, and a server that stops sending after that
/// would otherwise hang the command. `what` names what was being sent, for the error.
async fn next_message<T>(
    stream: &mut tonic::Streaming<T>,
    wait: Option<std::time::Duration>,
    what: impl FnOnce() -> String,
) -> anyhow::Result<Result<Option<T>, tonic::Status>> {
    match wait {
        Some(wait) => tokio::time::timeout(wait, stream.message())
            .await
            .map_err(|_| {
                anyhow::anyhow!(
                    "no answer within --timeout-secs: the server stopped sending the {} \
                     (stopped or overloaded?); raise --timeout-secs, 0 for no limit",
                    what()
                )
            }),
        None => Ok(stream.message().await),
    }
}

/// Print one line of output. A reader that stopped reading (`cubec audit list | head -1`) ends
/// the program quietly and successfully, as with other command-line tools.
fn out(line: impl std::fmt::Display) {
    let mut stdout = std::io::stdout().lock();
    if let Err(e) = writeln!(stdout, "{line}").and_then(|()| stdout.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("cubec: error: writing the output: {e}");
        std::process::exit(1);
    }
}

/// The bytes of a text argument, or of the file its `flag` names (`-`: standard input); None
/// when neither was given (clap keeps both from being given).
fn text_or_file(
    text: Option<String>,
    file: Option<PathBuf>,
    flag: &str,
) -> anyhow::Result<Option<Vec<u8>>> {
    let Some(file) = file.filter(|_| text.is_none()) else {
        return Ok(text.map(String::into_bytes));
    };
    if file == Path::new("-") {
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin(), &mut bytes)
            .with_context(|| format!("reading {flag} - (standard input)"))?;
        return Ok(Some(bytes));
    }
    std::fs::read(&file)
        .map(Some)
        .with_context(|| format!("reading {flag} {}", file.display()))
}

const DEFAULT_CA: &str = "./cube-data/tls/ca.pem";

/// The CA file trusted for an https:// endpoint, and how it was chosen (for messages).
struct CaFile {
    path: PathBuf,
    /// "--ca", or "the default of --ca".
    flag: &'static str,
}

/// Where cubec connects, checked, with what explains a failure to get there.
struct Target {
    endpoint: String,
    /// Where the endpoint came from ("--endpoint or CUBE_ENDPOINT", ...).
    origin: String,
    /// host:port.
    authority: String,
    tls: bool,
    ca: CaFile,
    /// A client certificate is presented (--cert).
    client_cert: bool,
}

impl Target {
    /// Checked up front: tonic takes an endpoint without a scheme as a relative URL ("scheme is
    /// missing"), any scheme but https:// as plaintext, and ignores a path.
    fn new(endpoint: String, origin: String, cli: &Cli) -> anyhow::Result<Target> {
        const SCHEMES: &str =
            "http:// (plaintext) or https:// (TLS) before host:port, e.g. http://127.0.0.1:50051";
        anyhow::ensure!(
            !endpoint.trim().is_empty(),
            "the endpoint (from {origin}) is empty: give http://HOST:PORT or https://HOST:PORT"
        );
        let (scheme, rest) = match endpoint.split_once("://") {
            Some((scheme @ ("http" | "https"), rest)) => (scheme, rest),
            Some((other, _)) => anyhow::bail!(
                "the endpoint {endpoint} (from {origin}) has the scheme {other}://, which cubec \
                 does not speak: use {SCHEMES}"
            ),
            None => anyhow::bail!(
                "the endpoint {endpoint} (from {origin}) has no scheme: it needs {SCHEMES}"
            ),
        };
        // A trailing slash is harmless; anything else after host:port would be dropped.
        let (authority, path) = rest.split_at(rest.find(['/', '?', '#']).unwrap_or(rest.len()));
        anyhow::ensure!(
            path.is_empty() || path == "/",
            "the endpoint {endpoint} (from {origin}) has {path} after host:port: give only \
             {scheme}://HOST:PORT (cubed serves every call at its own path)"
        );
        let parsed = authority
            .parse::<tonic::codegen::http::uri::Authority>()
            .ok()
            .filter(|a| !a.host().is_empty());
        let Some(parsed) = parsed else {
            anyhow::bail!(
                "the endpoint {endpoint} (from {origin}) does not name host:port after \
                 {scheme}://, e.g. {scheme}://127.0.0.1:50051"
            );
        };
        // (`Authority` reads a port it cannot parse as none: 99999 would dial the default.) The
        // port is what follows the host: after any `user@`, and after an IPv6 address's `]`.
        let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
        let after_host = &host_port[host_port.rfind(']').map_or(0, |i| i + 1)..];
        match after_host.split_once(':').map(|(_, p)| p) {
            Some("") => anyhow::bail!(
                "the endpoint {endpoint} (from {origin}) has ':' with no port after it"
            ),
            Some(port) if port.parse::<u16>().unwrap_or(0) == 0 => anyhow::bail!(
                "the endpoint {endpoint} (from {origin}) has the port {port}: a port is 1 to 65535"
            ),
            _ => {}
        }
        // Without a port, the scheme's (as tonic connects): a server behind a proxy on 443.
        let authority = match parsed.port_u16() {
            Some(_) => authority.to_string(),
            None if scheme == "https" => format!("{authority}:443"),
            None => format!("{authority}:80"),
        };
        let ca = match &cli.ca {
            Some(path) => CaFile {
                path: path.clone(),
                flag: "--ca",
            },
            None => CaFile {
                path: PathBuf::from(DEFAULT_CA),
                flag: "the default of --ca",
            },
        };
        Ok(Target {
            tls: scheme == "https",
            authority,
            endpoint,
            origin,
            ca,
            client_cert: cli.cert.is_some(),
        })
    }

    /// A failed connect explained: the server's certificate not signed by the trusted CA, a
    /// server that does not speak TLS, or no server.
    async fn connect_error(&self, e: tonic::transport::Error) -> anyhow::Error {
        let (endpoint, origin) = (&self.endpoint, &self.origin);
        // rustls's reasons are told apart only by their names.
        let debug = format!("{e:?}");
        // BadSignature: a CA of the same name but another key (two data directories' CAs).
        if debug.contains("UnknownIssuer") || debug.contains("BadSignature") {
            return anyhow::anyhow!(
                "cannot connect to {endpoint} (from {origin}): the server's certificate is not \
                 signed by the CA in {} ({}): pass --ca with the CA that signed it (for `cubed \
                 serve --tls-dev`: DATA_DIR/tls/ca.pem)",
                self.ca.path.display(),
                self.ca.flag
            );
        }
        // A TLS client answered by a server without TLS reads its first bytes as a TLS record
        // of no known type: a plaintext cubed, or an HTTP/1 server such as the admin port.
        let hint = if self.tls && debug.contains("InvalidContentType") {
            if let Peer::Http1(version) = probe(&self.authority).await {
                return self.http1_peer(&version);
            }
            "it answered, but not in TLS: use http:// for a plaintext server"
        } else if debug.contains("InvalidCertificate") {
            "it answered, but its certificate was refused"
        } else if origin == DEFAULT_ORIGIN {
            "is cubed serving there? if it serves elsewhere, pass --endpoint or CUBE_ENDPOINT"
        } else {
            "is cubed serving there?"
        };
        anyhow::Error::new(e).context(format!(
            "cannot connect to {endpoint} (from {origin}; {hint})"
        ))
    }

    /// A call that failed in the connection explained. After a TLS handshake the scheme is
    /// right; over plaintext the server is asked (a cheap HTTP/1.1 request) what it speaks,
    /// and the scheme or port blamed only when that does not tell.
    async fn transport_failure(&self, failure: &TransportFailure) -> anyhow::Error {
        let at = format!(
            "cannot talk to the server at {} (from {})",
            self.endpoint, self.origin
        );
        if self.tls {
            // Under TLS 1.3 a server refuses a client certificate after the client's side of
            // the handshake is done: the refusal arrives as an alert on the first call.
            if self.client_cert {
                let hint = if failure.0.contains("alert") {
                    "the server refused the client certificate"
                } else {
                    "if the server refused the client certificate"
                };
                return anyhow::anyhow!(
                    "{at}: {failure} ({hint}: issue it with `cubed key cert` on this server's \
                     data directory)"
                );
            }
            return anyhow::anyhow!("{at}: {failure}");
        }
        match probe(&self.authority).await {
            Peer::Http1(version) => self.http1_peer(&version),
            Peer::Tls => anyhow::anyhow!(
                "{at}: it answers in TLS, not plaintext HTTP/2: use https://{}",
                self.authority
            ),
            // The right scheme (a stream the server reset, say): nothing to add.
            Peer::Http2 => anyhow::anyhow!("{at}: {failure}"),
            Peer::Unreachable => anyhow::anyhow!("{at}: {failure} (is cubed still serving there?)"),
            Peer::Other => anyhow::anyhow!(
                "{at}: {failure} (does the endpoint's scheme match the server: https:// for TLS, \
                 http:// for plaintext? or is this cubed's --admin-listen (metrics) port rather \
                 than its --listen port?)"
            ),
        }
    }

    fn http1_peer(&self, version: &str) -> anyhow::Error {
        anyhow::anyhow!(
            "cannot talk to the server at {} (from {}): it answers plain {version}, not gRPC: is \
             this cubed's --admin-listen (metrics) port rather than its --listen port?",
            self.endpoint,
            self.origin
        )
    }
}

/// What a server answers to an HTTP/1.1 request, told apart by its first bytes.
enum Peer {
    /// "HTTP/1.1 404 ...": an HTTP/1 server (cubed's admin port answers so), with its version.
    Http1(String),
    /// A TLS record (an alert, content type 21, or a handshake, 22; version 3.x).
    Tls,
    /// An HTTP/2 frame of type 4, the SETTINGS a server sends first: plaintext gRPC.
    Http2,
    /// No connection.
    Unreachable,
    /// Anything else: nothing, or no answer in time.
    Other,
}

/// Ask the server at `authority` (host:port) with a plaintext `OPTIONS * HTTP/1.1`, which every
/// HTTP/1 server answers and a TLS server answers with an alert. Only run to explain a failure.
async fn probe(authority: &str) -> Peer {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    const WAIT: std::time::Duration = std::time::Duration::from_secs(2);
    let mut stream =
        match tokio::time::timeout(WAIT, tokio::net::TcpStream::connect(authority)).await {
            Ok(Ok(stream)) => stream,
            Ok(Err(_)) => return Peer::Unreachable,
            Err(_) => return Peer::Other,
        };
    let mut head = [0u8; 8];
    let ask = async {
        let request =
            format!("OPTIONS * HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await?;
        let mut n = 0;
        while n < head.len() {
            match stream.read(&mut head[n..]).await? {
                0 => break,
                got => n += got,
            }
        }
        std::io::Result::Ok(n)
    };
    let head = match tokio::time::timeout(WAIT, ask).await {
        Ok(Ok(n)) => &head[..n],
        _ => return Peer::Other,
    };
    if head.starts_with(b"HTTP/1.") {
        Peer::Http1(String::from_utf8_lossy(head).into_owned())
    } else if let [21 | 22, 3, ..] = head {
        Peer::Tls
    } else if let [_, _, _, 4, ..] = head {
        Peer::Http2
    } else {
        Peer::Other
    }
}

/// The labels of the PEM blocks in `text` ("CERTIFICATE", "PRIVATE KEY", ...).
fn pem_labels(text: &str) -> Vec<&str> {
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("-----BEGIN ")?.strip_suffix("-----"))
        .collect()
}

fn holds_certificate(text: &str) -> bool {
    pem_labels(text).contains(&"CERTIFICATE")
}

/// "PRIVATE KEY" (PKCS#8), "RSA PRIVATE KEY", "EC PRIVATE KEY".
fn holds_private_key(text: &str) -> bool {
    pem_labels(text).iter().any(|l| l.ends_with("PRIVATE KEY"))
}

/// The text of the PEM file `path`, `what` given by `flag` (any bytes: a DER file then holds
/// no PEM block).
fn read_pem(path: &Path, what: &str, flag: &str) -> anyhow::Result<String> {
    let bytes = std::fs::read(path)
        .with_context(|| format!("cannot read {what} {} ({flag})", path.display()))?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// The TLS files checked here, each named with its flag: tonic's own errors name neither
/// ("no RSA or PKCS8-encoded keys found"), and a CA without a certificate would surface only
/// as the server's certificate being refused.
fn tls_config(cli: &Cli, ca: &CaFile) -> anyhow::Result<tonic::transport::ClientTlsConfig> {
    use tonic::transport::{Certificate, ClientTlsConfig, Identity};
    let ca_pem = read_pem(&ca.path, "the CA certificate", ca.flag).map_err(|e| {
        if cli.ca.is_some() {
            return e;
        }
        // With a client certificate TLS is meant: only the CA is missing.
        let scheme = if cli.cert.is_none() {
            "is the server started with TLS (its ready line says tls=on)? For a plaintext \
             server use http://; "
        } else {
            ""
        };
        e.context(format!(
            "an https:// endpoint needs the CA that signed the server's certificate: {scheme}for \
             `cubed serve --tls-dev` pass --ca DATA_DIR/tls/ca.pem; for a certificate from a \
             public CA (a proxy's, say), the system's bundle, e.g. --ca \
             /etc/ssl/certs/ca-certificates.crt (cubec trusts no roots it is not given)"
        ))
    })?;
    anyhow::ensure!(
        holds_certificate(&ca_pem),
        "no PEM certificate in {} ({}): pass --ca with the CA certificate that signed the \
         server's (for `cubed serve --tls-dev`: DATA_DIR/tls/ca.pem)",
        ca.path.display(),
        ca.flag
    );
    // Checked against the endpoint's host (tonic's default) unless told otherwise: the
    // development certificate names localhost, 127.0.0.1 and ::1, a real one the server's name.
    let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca_pem));
    if let Some(name) = &cli.tls_server_name {
        tls = tls.domain_name(name.clone());
    }
    if let (Some(cert_path), Some(key_path)) = (&cli.cert, &cli.key) {
        let cert = read_pem(cert_path, "the client certificate", "--cert")?;
        let key = read_pem(key_path, "the private key", "--key")?;
        let (cert_shown, key_shown) = (cert_path.display(), key_path.display());
        anyhow::ensure!(
            holds_certificate(&cert) || !holds_private_key(&cert) || !holds_certificate(&key),
            "--cert {cert_shown} holds a private key and --key {key_shown} a certificate: they \
             look swapped"
        );
        anyhow::ensure!(
            holds_certificate(&cert),
            "no PEM certificate in {cert_shown} (--cert): pass the client certificate from \
             `cubed key cert`"
        );
        anyhow::ensure!(
            holds_private_key(&key),
            "no PEM private key in {key_shown} (--key): pass the key written beside the \
             certificate by `cubed key cert`"
        );
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    Ok(tls)
}

/// The tenant's totals (`Tenant.Stats` without a coordinate).
async fn totals(tenant: &mut TenantClient<Transport>) -> anyhow::Result<TenantTotals> {
    Ok(tenant
        .stats(StatsRequest { coord: None })
        .await
        .map_err(status)?
        .into_inner()
        .totals
        .unwrap_or_default())
}

/// `audit verify` gave up: retention expired entries under it on every attempt.
fn expiring_too_fast(attempts: usize) -> anyhow::Error {
    anyhow::anyhow!(
        "the trail expired entries faster than it could be read ({attempts} attempts): retry \
         when it is quieter, or raise the server's --audit-retention"
    )
}

/// Whether a verified trail reaches the head `Tenant.Stats` gave before it was read (false:
/// retention expired the head's entry while the trail was read; read it again). A trail that ends before the head lost its
/// newest entries, and one whose entry at the head has another hash is not the trail the
/// head was taken from: both are broken chains.
fn reaches_head(entries: &[AuditEntry], head: &TenantTotals) -> Result<bool, BrokenChain> {
    let end = entries.last().map_or(0, |e| e.seq);
    if end < head.audit_last_seq {
        return Err(BrokenChain {
            seq: end + 1,
            why: format!(
                "the trail ends at seq {end}, but Tenant.Stats gave entry {} as its newest \
                 before it was read: the newest entries are missing",
                head.audit_last_seq
            ),
        });
    }
    if head.audit_last_seq == 0 {
        // An empty trail when the head was read (a server older than the head's fields says
        // 0 too): nothing it can be checked against.
        return Ok(true);
    }
    match entries.iter().find(|e| e.seq == head.audit_last_seq) {
        Some(e) if e.hash != head.audit_last_hash => Err(BrokenChain {
            seq: e.seq,
            why: "its hash is not the one Tenant.Stats gave for this entry, the trail's \
                  newest, before the trail was read"
                .into(),
        }),
        Some(_) => Ok(true),
        None => Ok(false),
    }
}

/// Entries from `from` on: `limit` of them, or (None) all, page by page; each entry within
/// `wait` of the one before.
async fn fetch_audit<T>(
    tenant: &mut TenantClient<T>,
    from: u64,
    limit: Option<u32>,
    wait: Option<std::time::Duration>,
) -> anyhow::Result<Vec<AuditEntry>>
where
    T: tonic::client::GrpcService<tonic::body::Body>,
    T::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    T::ResponseBody: tonic::codegen::Body<Data = tonic::codegen::Bytes> + Send + 'static,
    <T::ResponseBody as tonic::codegen::Body>::Error:
        Into<Box<dyn std::error::Error + Send + Sync>> + Send,
{
    const PAGE: u32 = 1000;
    let mut out = Vec::new();
    let mut next = from;
    loop {
        // Saturating: a server that sent more than was asked must not wrap this around.
        let want = limit.map_or(PAGE, |l| l.saturating_sub(out.len() as u32).min(PAGE));
        if want == 0 {
            break;
        }
        let mut stream = tenant
            .audit(AuditRequest {
                from_seq: next,
                limit: want,
            })
            .await
            .map_err(audit_status)?
            .into_inner();
        let before = out.len();
        loop {
            let what = || format!("audit trail before entry {next}");
            let Some(e) = next_message(&mut stream, wait, what)
                .await?
                .map_err(audit_status)?
            else {
                break;
            };
            // A server that does not move forward (or sends the last seq there is) would have
            // this loop read the same pages for ever. An entry again, or one out of order, is
            // a broken trail (exit 3), not a failure to check it.
            if e.seq < next && !out.is_empty() {
                return Err(BrokenChain {
                    seq: e.seq,
                    why: format!(
                        "duplicated or out of order: it came after entry {}",
                        next - 1
                    ),
                }
                .into());
            }
            anyhow::ensure!(
                e.seq >= next && e.seq < u64::MAX,
                "the server sent audit entry {} where entries from {next} on were asked for",
                e.seq
            );
            next = e.seq + 1;
            out.push(e);
        }
        if out.len() == before {
            break;
        }
    }
    Ok(out)
}

/// An Audit call's failure: DATA_LOSS saying entries are gone from the trail that retention
/// did not expire is a broken chain, at the first missing seq the server names; the rest as
/// [`status`] (DATA_LOSS also says that a tenant's log is corrupt or its state older than its
/// log: damage an operator must repair, not a trail found broken).
fn audit_status(s: tonic::Status) -> anyhow::Error {
    if s.code() != tonic::Code::DataLoss || !s.message().contains("is missing entries ") {
        return status(s);
    }
    let seq = s
        .message()
        .split("missing entries ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    BrokenChain {
        seq,
        why: format!(
            "entries missing, not expired by retention (the server's DATA_LOSS: {})",
            s.message()
        ),
    }
    .into()
}

fn entry_json(e: &AuditEntry) -> serde_json::Value {
    serde_json::json!({
        "seq": e.seq, "ts_ms": e.ts_ms, "principal": e.principal, "op": e.op, "detail": e.detail,
        "prev_hash": hex(&e.prev_hash), "hash": hex(&e.hash),
    })
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A call that failed in the connection (no answer of the server's), by its cause: `run`
/// explains it with the endpoint.
#[derive(Debug)]
struct TransportFailure(String);

impl std::fmt::Display for TransportFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the connection failed: {}", self.0)
    }
}

impl std::error::Error for TransportFailure {}

/// The cause of a failed connection, from a status and its sources, without the wrappers each
/// layer adds ("h2 protocol error: http2 error: transport error: http2 error: connection error
/// detected: frame with invalid size" is "frame with invalid size").
fn transport_cause(s: &tonic::Status) -> String {
    const WRAPPERS: [&str; 5] = [
        "transport error",
        "h2 protocol error",
        "http2 error",
        "connection error",
        "connection error detected",
    ];
    let mut texts = vec![s.message().to_string()];
    let mut cause = std::error::Error::source(s);
    while let Some(c) = cause {
        texts.push(c.to_string());
        cause = c.source();
    }
    let mut parts: Vec<&str> = Vec::new();
    for part in texts.iter().flat_map(|t| t.split(": ")) {
        if !WRAPPERS.contains(&part) && !parts.contains(&part) {
            parts.push(part);
        }
    }
    if parts.is_empty() {
        "no reason given".into()
    } else {
        parts.join(": ")
    }
}

/// `<Code>: <message>` (docs/protocol.md) of a server's answer; a failed connection's cause.
fn status(s: tonic::Status) -> anyhow::Error {
    // A status with a source was made by the client from its connection's failure (one the
    // server sent has none): there is no gRPC code to show, and a label such as "Internal"
    // would read as a server fault. A plaintext client answered by a TLS or HTTP/1 server
    // lands here, reading its bytes as a broken HTTP/2 frame ("frame with invalid size").
    let mut cause = std::error::Error::source(&s);
    while let Some(c) = cause {
        // Ours (`deadline`), or tonic's: its channel holds a call to the `grpc-timeout` it
        // carries until the answer's head, and the two expire together.
        if c.downcast_ref::<NoAnswer>().is_some()
            || c.downcast_ref::<tonic::TimeoutExpired>().is_some()
        {
            return anyhow::anyhow!(
                "no answer within --timeout-secs ({} s): the server took the connection but \
                 did not answer in time, or stopped sending its answer (stopped or overloaded?); a change it was sent (write, \
                 delete, ...) may still have been applied: read before retrying it; raise \
                 --timeout-secs for a slow call, 0 for no limit",
                TIMEOUT_SECS.load(std::sync::atomic::Ordering::Relaxed)
            );
        }
        cause = c.source();
    }
    if std::error::Error::source(&s).is_some() {
        return anyhow::Error::new(TransportFailure(transport_cause(&s)));
    }
    let mut text = format!("{:?}: {}", s.code(), s.message());
    // A server that takes only per-connection authentication (`--auth-mode connection`) says
    // what any client should do; cubec's way of doing it is a flag.
    let unauthenticated = s.code() == tonic::Code::Unauthenticated;
    let connection_refused = s
        .message()
        .starts_with("this connection is not authenticated")
        || s.message()
            .starts_with("this server accepts only per-connection");
    // Refusals that name a connection's authentication (a call-only server's does not).
    let missing = connection_refused
        || (s.message().starts_with("missing credentials:") && s.message().contains("Auth.Hello"));
    let flag = |f: &std::sync::atomic::AtomicBool| f.load(std::sync::atomic::Ordering::Relaxed);
    if unauthenticated && missing && flag(&CERTIFICATE_GIVEN) {
        // The certificate of a revoked or unknown key gets a message of its own from the server.
        text.push_str(
            " (with cubec: the server took no client certificate: it serves TLS without a \
             client CA, so --cert authenticates nothing there; give credentials instead)",
        );
    } else if unauthenticated && missing && flag(&HANDSHAKE_DONE) {
        text.push_str(
            " (cubec had authenticated its connection with a handshake: the connection was made \
             again since, and a new one has no session; run the command again)",
        );
    } else if unauthenticated && connection_refused {
        text.push_str(" (with cubec: --auth connection, or a client certificate with --cert)");
    }
    // Against `--auth-mode call` a client certificate authenticates nothing; cubec sends
    // unsigned calls only with one, so this refusal means a certificate was given.
    if s.code() == tonic::Code::Unauthenticated
        && s.message()
            .starts_with("missing credentials: sign every call")
        && !s.message().contains("Auth.Hello")
    {
        text.push_str(
            " (with cubec: this server takes only signed calls (--auth-mode call), not a client \
             certificate: leave out --cert and --key, and give --credentials)",
        );
    }
    if s.code() == tonic::Code::FailedPrecondition
        && s.message()
            .starts_with("per-connection authentication is disabled")
    {
        text.push_str(" (with cubec: leave out --auth connection)");
    }
    if s.code() == tonic::Code::Unauthenticated
        && (s.message().starts_with("x-cube-sig does not match")
            || s.message().starts_with("mac does not match"))
    {
        text.push_str(
            " (with cubec: the secret of the credentials is not this key's: use the file \
             `cubed key create` or `cubed tenant create` printed for it)",
        );
    }
    anyhow::anyhow!(text)
}

/// A free-text argument (a written value, a program, a label) that starts with `--` is taken
/// only when it follows a bare `--`: clap accepts any value starting with `-` there (so that
/// `-hot` is written, not read as `-h`), which would otherwise take a misspelt flag
/// (`--expected-verison=3`) as the text. `usage` is the command before it, for the message.
fn check_hyphen_value(
    value: &str,
    usage: &str,
    argv: impl IntoIterator<Item = std::ffi::OsString>,
) -> Result<(), String> {
    if !value.starts_with("--") {
        return Ok(());
    }
    // Only a `--` before the value makes it one: after it, it ends nothing.
    for a in argv {
        if a == "--" {
            return Ok(());
        }
        if a == value {
            break;
        }
    }
    Err(format!(
        "the value {value:?} looks like a flag cubec does not know: to take it as the value, \
         put it after `--` ({usage} -- {value}); otherwise check the flag's spelling"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The trail's head from Tenant.Stats catches what the chain cannot: its newest entries
    /// missing, or another trail served than the head was taken from; an entry at the head
    /// that retention expired while the trail was read is read again, not a break.
    #[test]
    fn a_trail_short_of_its_head_is_a_broken_chain() {
        let trail = |seqs: std::ops::RangeInclusive<u64>| -> Vec<AuditEntry> {
            seqs.map(|seq| AuditEntry {
                seq,
                hash: vec![seq as u8; 32],
                ..AuditEntry::default()
            })
            .collect()
        };
        let head = |seq: u64, hash: u8| TenantTotals {
            audit_last_seq: seq,
            audit_last_hash: vec![hash; 32],
            ..TenantTotals::default()
        };
        let cut = reaches_head(&trail(1..=5), &head(7, 7)).unwrap_err();
        assert_eq!(cut.seq, 6, "{cut}");
        assert!(cut.why.contains("ends at seq 5"), "{cut}");
        let empty = reaches_head(&[], &head(3, 3)).unwrap_err();
        assert_eq!(empty.seq, 1, "{empty}");
        let other = reaches_head(&trail(1..=9), &head(7, 70)).unwrap_err();
        assert_eq!(other.seq, 7, "{other}");
        // Entries written after the head was read are fine.
        assert_eq!(reaches_head(&trail(1..=9), &head(7, 7)).ok(), Some(true));
        assert_eq!(reaches_head(&trail(4..=7), &head(7, 7)).ok(), Some(true));
        // The head's entry expired before the trail was read.
        assert_eq!(reaches_head(&trail(8..=20), &head(7, 7)).ok(), Some(false));
        // No entry when the head was read, or a server without the head's fields.
        assert_eq!(reaches_head(&[], &head(0, 0)).ok(), Some(true));
        assert_eq!(
            reaches_head(&trail(1..=2), &TenantTotals::default()).ok(),
            Some(true)
        );
    }

    /// A connection cubec authenticated with a handshake and the server finds unauthenticated
    /// was made again: the hint says so instead of suggesting the flag already given; one with
    /// a client certificate the server did not take is told that. (The unset case, the usual
    /// hint, is `cli.rs`'s; no other test here reads the flags.)
    #[test]
    fn a_lost_session_is_not_answered_with_the_flag_already_given() {
        HANDSHAKE_DONE.store(true, std::sync::atomic::Ordering::Relaxed);
        for refusal in [
            "this connection is not authenticated: run Auth.Challenge and Auth.Hello on it first",
            "missing credentials: sign every call with x-cube-tenant, x-cube-key, x-cube-ts, \
             x-cube-nonce and x-cube-sig, or authenticate the connection with Auth.Challenge and \
             Auth.Hello (see docs/protocol.md)",
        ] {
            let text = status(tonic::Status::unauthenticated(refusal)).to_string();
            assert!(text.contains("a new one has no session"), "{text}");
            assert!(!text.contains("--auth connection"), "{text}");
        }
        CERTIFICATE_GIVEN.store(true, std::sync::atomic::Ordering::Relaxed);
        let text = status(tonic::Status::unauthenticated(
            "this connection is not authenticated: run Auth.Challenge and Auth.Hello on it first",
        ))
        .to_string();
        assert!(
            text.contains("the server took no client certificate"),
            "{text}"
        );
        // A call-only server's refusal keeps its own hint.
        let text = status(tonic::Status::unauthenticated(
            "missing credentials: sign every call with x-cube-tenant, x-cube-key, x-cube-ts, \
             x-cube-nonce and x-cube-sig (see docs/protocol.md)",
        ))
        .to_string();
        assert!(!text.contains("took no client certificate"), "{text}");
        assert!(text.contains("takes only signed calls"), "{text}");
    }

    /// DATA_LOSS from Audit (docs/protocol.md: "the audit trail is missing entries A to B: …")
    /// is a broken chain at A, exit code 3; other codes stay failures to check.
    #[test]
    fn audit_data_loss_is_a_broken_chain_at_the_first_missing_seq() {
        let lost = tonic::Status::data_loss(
            "the audit trail is missing entries 17 to 40: they were not expired by retention",
        );
        let e = audit_status(lost);
        let broken = e.downcast_ref::<BrokenChain>().expect("a broken chain");
        assert_eq!(broken.seq, 17);
        assert!(
            broken.why.contains("missing entries 17 to 40"),
            "{}",
            broken.why
        );
        let other = audit_status(tonic::Status::unavailable("down"));
        assert!(other.downcast_ref::<BrokenChain>().is_none());
        // A tenant that cannot open (its log corrupt) is no broken trail (found by review).
        let corrupt = audit_status(tonic::Status::data_loss(
            "tenant 't' is unavailable: its write-ahead log is corrupt (the server log names the \
             segment and offset); an operator must repair it before it can serve",
        ));
        assert!(corrupt.downcast_ref::<BrokenChain>().is_none());
        assert!(corrupt.to_string().contains("corrupt"), "{corrupt}");
    }

    #[test]
    fn a_value_like_a_flag_needs_the_separator() {
        let argv = |a: &[&str]| a.iter().map(std::ffi::OsString::from).collect::<Vec<_>>();
        const W: &str = "cubec write X Y Z";
        let typo = ["cubec", "write", "1", "2", "3", "--expected-verison=3"];
        assert!(check_hyphen_value("--expected-verison=3", W, argv(&typo)).is_err());
        let meant = ["cubec", "write", "1", "2", "3", "--", "--x"];
        assert!(check_hyphen_value("--x", W, argv(&meant)).is_ok());
        // A `--` after it does not make a typo a value.
        let late = [
            "cubec",
            "write",
            "1",
            "2",
            "3",
            "--expected-verison=3",
            "--",
        ];
        assert!(check_hyphen_value("--expected-verison=3", W, argv(&late)).is_err());
        assert!(
            check_hyphen_value("-hot", W, argv(&["cubec", "write", "1", "2", "3", "-hot"])).is_ok()
        );
    }

    fn written_value(args: &[&str]) -> Option<String> {
        let cli = Cli::try_parse_from(args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
        match cli.command {
            Cmd::Write { value, .. } => value,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_value_may_start_with_a_hyphen_and_coordinates_may_be_negative() {
        // Before: `-hot` was read as the short flags -h -o -t, printed help and exited 0,
        // writing nothing.
        assert_eq!(
            written_value(&["cubec", "write", "1", "2", "3", "-hot"]).as_deref(),
            Some("-hot")
        );
        assert_eq!(
            written_value(&["cubec", "write", "-1", "-2", "-3", "--", "-x"]).as_deref(),
            Some("-x")
        );
        // Not the short help flag (which printed help and wrote nothing): help is --help.
        assert_eq!(
            written_value(&["cubec", "write", "1", "2", "3", "-h"]).as_deref(),
            Some("-h")
        );
        let help = Cli::try_parse_from(["cubec", "write", "--help"]).unwrap_err();
        assert_eq!(help.kind(), clap::error::ErrorKind::DisplayHelp);
        assert_eq!(
            written_value(&["cubec", "write", "-1", "2", "-3", "v"]).as_deref(),
            Some("v")
        );
        assert_eq!(
            written_value(&["cubec", "write", "1", "2", "3", "--value-file", "f"]),
            None
        );
    }

    /// A Tenant service whose audit stream sends the entries of these seqs from the first page
    /// (none after it), then ends, or, with `stall`, sends nothing more and never ends.
    struct ScriptedAudit {
        seqs: &'static [u64],
        stall: bool,
    }

    #[tonic::async_trait]
    impl cube_api::v1::tenant_server::Tenant for ScriptedAudit {
        async fn stats(
            &self,
            _: tonic::Request<cube_api::v1::StatsRequest>,
        ) -> Result<tonic::Response<cube_api::v1::StatsResponse>, tonic::Status> {
            Err(tonic::Status::unimplemented("not in this test"))
        }

        type AuditStream = std::pin::Pin<
            Box<dyn futures::Stream<Item = Result<AuditEntry, tonic::Status>> + Send>,
        >;

        async fn audit(
            &self,
            req: tonic::Request<AuditRequest>,
        ) -> Result<tonic::Response<Self::AuditStream>, tonic::Status> {
            use futures::StreamExt as _;
            let first_page = req.get_ref().from_seq <= self.seqs.first().copied().unwrap_or(0);
            let entries: Vec<_> = if first_page { self.seqs } else { &[] }
                .iter()
                .map(|&seq| {
                    Ok(AuditEntry {
                        seq,
                        ..AuditEntry::default()
                    })
                })
                .collect();
            let sent = futures::stream::iter(entries);
            Ok(tonic::Response::new(if self.stall {
                Box::pin(sent.chain(futures::stream::pending()))
            } else {
                Box::pin(sent)
            }))
        }
    }

    /// `audit` served on a loopback port: a client of it, its calls bounded by `limit` as
    /// cubec's are, and the server's task.
    async fn serve_audit(
        audit: ScriptedAudit,
        limit: Option<std::time::Duration>,
    ) -> (TenantClient<Bounded<Channel>>, tokio::task::JoinHandle<()>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(cube_api::v1::tenant_server::TenantServer::new(audit))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
                .await;
        });
        let channel = Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        (TenantClient::new(Bounded::new(channel, limit)), server)
    }

    /// An entry sent twice (or out of order) is a broken trail, exit 3, naming it: it was a
    /// failure to check (exit 1), which a script alerting on 3 missed.
    #[tokio::test]
    async fn an_audit_entry_sent_twice_is_a_broken_chain() {
        let (mut tenant, server) = serve_audit(
            ScriptedAudit {
                seqs: &[1, 2, 2, 3],
                stall: false,
            },
            None,
        )
        .await;
        let err = fetch_audit(&mut tenant, 0, None, None)
            .await
            .expect_err("a repeated entry was taken");
        let broken = err
            .downcast_ref::<BrokenChain>()
            .unwrap_or_else(|| panic!("not a broken chain: {err}"));
        assert_eq!(broken.seq, 2, "{broken}");
        assert!(
            broken.why.contains("duplicated or out of order"),
            "{broken}"
        );
        server.abort();
    }

    /// Each entry of the stream gets its own limit, the call as a whole none: a call limit
    /// shorter than the entries' would end it first, with another message.
    #[tokio::test]
    async fn an_audit_stream_that_stops_sending_ends_after_the_timeout() {
        let (mut tenant, server) = serve_audit(
            ScriptedAudit {
                seqs: &[0],
                stall: true,
            },
            Some(std::time::Duration::from_secs(1)),
        )
        .await;
        // Long enough that a loaded machine delivers the first entry within it.
        let wait = std::time::Duration::from_secs(2);
        let started = std::time::Instant::now();
        let fetched = tokio::time::timeout(
            std::time::Duration::from_secs(20),
            fetch_audit(&mut tenant, 0, None, Some(wait)),
        )
        .await
        .expect("fetch_audit hung past its own limit");
        let err = fetched.expect_err("a stalled stream must fail the command");
        assert!(
            err.to_string()
                .starts_with("no answer within --timeout-secs")
                && err.to_string().contains("before entry 1"),
            "{err}"
        );
        assert!(started.elapsed() >= wait, "{:?}", started.elapsed());
        server.abort();
    }
}
