//! cubec: a minimal command-line client. Signs every call (per-call auth) unless told to run the
//! handshake (`--auth connection`) or given a client certificate (mTLS).

use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{Parser, Subcommand};
use cube_api::v1::cells_client::CellsClient;
use cube_api::v1::tenant_client::TenantClient;
use cube_api::v1::{AuditEntry, AuditRequest};
use cube_api::v1::{Coord, DeleteRequest, ReadRequest, WriteRequest};
use cube_auth::Credentials;
use cube_auth::client::{CallSigner, HandshakeError, Signing};
use tonic::transport::{Channel, Endpoint};

const DEFAULT_ENDPOINT: &str = "http://127.0.0.1:50051";
/// The default address when a client certificate (so TLS) is given.
const DEFAULT_TLS_ENDPOINT: &str = "https://127.0.0.1:50051";
const DEFAULT_CREDENTIALS: &str = "./cube-data/dev-credentials.json";

/// Command-line client for cubed.
#[derive(Debug, Parser)]
#[command(name = "cubec", version)]
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
    /// CA certificate (PEM) to trust for an https:// endpoint; default ./cube-data/tls/ca.pem.
    #[arg(long, env = "CUBE_CA", global = true)]
    ca: Option<PathBuf>,
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
    #[command(subcommand)]
    command: Cmd,
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
    #[command(allow_negative_numbers = true)]
    Write {
        /// X coordinate (a signed 32-bit integer).
        x: i32,
        /// Y coordinate.
        y: i32,
        /// Z coordinate.
        z: i32,
        #[arg(required_unless_present = "value_file", conflicts_with = "value_file")]
        value: Option<String>,
        /// Write this file's bytes (any bytes; `-` reads standard input).
        #[arg(long)]
        value_file: Option<PathBuf>,
        /// Write only if the cell is at this version (0 = must not exist).
        #[arg(long)]
        expected_version: Option<u64>,
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
    /// The tenant's audit trail.
    #[command(subcommand)]
    Audit(AuditCmd),
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
        let [tenant, key_id, secret] = vars.map(Option::unwrap_or_default);
        return Ok(Credentials {
            tenant,
            key_id,
            secret,
            endpoint: None,
        });
    }
    let path = path
        .cloned()
        .unwrap_or_else(|| PathBuf::from(DEFAULT_CREDENTIALS));
    load_credentials_file(&path)
}

fn load_credentials_file(path: &Path) -> anyhow::Result<Credentials> {
    let text = std::fs::read_to_string(path).with_context(|| {
        format!("cannot read credentials from {} (use --credentials or CUBE_TENANT/CUBE_KEY_ID/CUBE_SECRET)", path.display())
    })?;
    serde_json::from_str(&text)
        .with_context(|| format!("{} is not a credentials JSON file", path.display()))
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
        let creds = load_credentials_file(file).with_context(|| {
            format!(
                "with --cert only the endpoint of {} is used; give --endpoint instead",
                file.display()
            )
        })?;
        if let Some(endpoint) = creds.endpoint {
            return Ok((endpoint, file.display().to_string()));
        }
    }
    Ok((DEFAULT_TLS_ENDPOINT.into(), "cubec's default".into()))
}

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
    match runtime.block_on(run()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cubec: error: {}", cube_cli::error_chain(&e));
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // A client certificate authenticates the connection: no key material is needed besides it.
    let creds = match &cli.cert {
        Some(_) => {
            anyhow::ensure!(
                cli.auth.is_none(),
                "--cert authenticates the connection itself: leave out --auth"
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
            None => (DEFAULT_ENDPOINT.into(), "cubec's default".to_string()),
        },
        (None, None) => certificate_endpoint(cli.credentials.as_ref())?,
    };
    let tls = endpoint.starts_with("https://");
    anyhow::ensure!(
        tls || cli.cert.is_none(),
        "--cert needs an https:// endpoint (a client certificate is presented in the TLS \
         handshake), not {endpoint} (from {origin})"
    );
    let mut ep = Endpoint::from_shared(endpoint.clone())
        .with_context(|| format!("bad endpoint {endpoint}"))?;
    if tls {
        ep = ep.tls_config(tls_config(&cli)?)?;
    }
    let channel: Channel = ep.connect().await.map_err(|e| {
        // A TLS client answered by a plaintext server reads its first bytes as a TLS record
        // of no known type.
        let plaintext_peer = tls && format!("{e:?}").contains("InvalidContentType");
        let hint = if plaintext_peer {
            "it answered, but not in TLS: use http:// for a plaintext server"
        } else {
            "is cubed serving there?"
        };
        anyhow::Error::new(e).context(format!(
            "cannot connect to {endpoint} (from {origin}; {hint})"
        ))
    })?;
    let transport = match (&creds, cli.auth.unwrap_or(AuthModel::Call)) {
        // The client certificate already authenticates the connection.
        (None, _) => Signing::passthrough(channel),
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
                    HandshakeError::Refused(s) => status(s).context("handshake refused"),
                    other => anyhow::Error::new(other).context("handshake"),
                })?;
            Signing::passthrough(channel)
        }
    };
    let mut cells = CellsClient::new(transport.clone());
    let coord = |x, y, z| Some(Coord { x, y, z });
    if let Cmd::Audit(audit) = &cli.command {
        let mut tenant = TenantClient::new(transport);
        return match audit {
            AuditCmd::List { from, limit } => {
                // `--limit 0` asks for nothing (docs/protocol.md); in the rpc 0 would mean the
                // server's default page, so it is not sent.
                if *limit == 0 {
                    return Ok(());
                }
                for e in fetch_audit(&mut tenant, *from, Some(*limit)).await? {
                    out(entry_json(&e));
                }
                Ok(())
            }
            AuditCmd::Verify => {
                const ATTEMPTS: usize = 3;
                for attempt in 1..=ATTEMPTS {
                    let entries = fetch_audit(&mut tenant, 0, None).await?;
                    let (seq, why) = match cube_auth::client::verify_audit_entries(&entries) {
                        Ok(_) => {
                            out(serde_json::json!({ "ok": true, "entries": entries.len() }));
                            return Ok(());
                        }
                        Err(broken) => broken,
                    };
                    // Retention removing entries while the pages were read leaves a gap that
                    // is no break: then the entry before the gap has expired by now too. Read
                    // the whole trail again.
                    let before_gap = entries
                        .windows(2)
                        .find(|w| w[1].seq == seq && w[0].seq + 1 != seq)
                        .map(|w| w[0].seq);
                    let oldest = fetch_audit(&mut tenant, 0, Some(1)).await?;
                    let expired =
                        matches!((before_gap, oldest.first()), (Some(p), Some(o)) if o.seq > p);
                    if !expired {
                        anyhow::bail!("audit chain broken at seq {seq}: {why}");
                    }
                    if attempt == ATTEMPTS {
                        anyhow::bail!(
                            "the trail expired entries faster than it could be read ({ATTEMPTS} \
                             attempts): retry when it is quieter, or raise the server's \
                             --audit-retention"
                        );
                    }
                }
                Ok(())
            }
        };
    }
    let answer = match cli.command {
        Cmd::Write {
            x,
            y,
            z,
            value,
            value_file,
            expected_version,
        } => {
            let value = match (value, value_file) {
                (Some(text), _) => text.into_bytes(),
                (None, Some(file)) => read_value_file(&file)?,
                (None, None) => anyhow::bail!("give VALUE or --value-file"),
            };
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
        Cmd::Audit(_) => unreachable!("handled above"),
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

/// The bytes of `--value-file` (`-`: standard input).
fn read_value_file(file: &Path) -> anyhow::Result<Vec<u8>> {
    if file == Path::new("-") {
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin(), &mut bytes)
            .context("reading the value from standard input")?;
        return Ok(bytes);
    }
    std::fs::read(file).with_context(|| format!("reading --value-file {}", file.display()))
}

const DEFAULT_CA: &str = "./cube-data/tls/ca.pem";

fn tls_config(cli: &Cli) -> anyhow::Result<tonic::transport::ClientTlsConfig> {
    use tonic::transport::{Certificate, ClientTlsConfig, Identity};
    let ca_path = cli.ca.clone().unwrap_or_else(|| PathBuf::from(DEFAULT_CA));
    let ca = std::fs::read_to_string(&ca_path).with_context(|| {
        format!(
            "reading the CA certificate {} (use --ca)",
            ca_path.display()
        )
    })?;
    // Checked against the endpoint's host (tonic's default) unless told otherwise: the
    // development certificate names localhost, 127.0.0.1 and ::1, a real one the server's name.
    let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca));
    if let Some(name) = &cli.tls_server_name {
        tls = tls.domain_name(name.clone());
    }
    if let (Some(cert), Some(key)) = (&cli.cert, &cli.key) {
        let cert =
            std::fs::read_to_string(cert).with_context(|| format!("reading {}", cert.display()))?;
        let key =
            std::fs::read_to_string(key).with_context(|| format!("reading {}", key.display()))?;
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    Ok(tls)
}

/// Entries from `from` on: `limit` of them, or (None) all, page by page.
async fn fetch_audit<T>(
    tenant: &mut TenantClient<T>,
    from: u64,
    limit: Option<u32>,
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
        let want = limit.map_or(PAGE, |l| (l - out.len() as u32).min(PAGE));
        if want == 0 {
            break;
        }
        let mut stream = tenant
            .audit(AuditRequest {
                from_seq: next,
                limit: want,
            })
            .await
            .map_err(status)?
            .into_inner();
        let before = out.len();
        while let Some(e) = stream.message().await.map_err(status)? {
            next = e.seq + 1;
            out.push(e);
        }
        if out.len() == before {
            break;
        }
    }
    Ok(out)
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

/// `<Code>: <message>` (docs/protocol.md), with the transport's cause when there is one (the
/// status of a failed connection says only "transport error").
fn status(s: tonic::Status) -> anyhow::Error {
    let mut text = format!("{:?}: {}", s.code(), s.message());
    let mut cause = std::error::Error::source(&s);
    while let Some(c) = cause {
        let more = c.to_string();
        if !text.ends_with(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        cause = c.source();
    }
    // A plaintext client answered by a TLS server reads its TLS record as a broken HTTP/2
    // frame ("h2 protocol error: ... frame with invalid size").
    if (s.code() == tonic::Code::Unknown && s.message() == "transport error")
        || (s.code() == tonic::Code::Internal && s.message().starts_with("h2 protocol error"))
    {
        text.push_str(
            " (does the endpoint's scheme match the server: https:// for TLS, http:// for plaintext?)",
        );
    }
    // A server that takes only per-connection authentication (`--auth-mode connection`) says
    // what any client should do; cubec's way of doing it is a flag.
    if s.code() == tonic::Code::Unauthenticated
        && (s
            .message()
            .starts_with("this connection is not authenticated")
            || s.message()
                .starts_with("this server accepts only per-connection"))
    {
        text.push_str(" (with cubec: --auth connection, or a client certificate with --cert)");
    }
    anyhow::anyhow!(text)
}
