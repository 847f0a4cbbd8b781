//! cubec: a minimal command-line client. Signs every call (per-call auth).

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use cube_api::v1::cells_client::CellsClient;
use cube_api::v1::tenant_client::TenantClient;
use cube_api::v1::{AuditEntry, AuditRequest};
use cube_api::v1::{Coord, DeleteRequest, ReadRequest, WriteRequest};
use cube_auth::Credentials;
use cube_auth::client::{CallSigner, Signing};
use tonic::transport::{Channel, Endpoint};

const DEFAULT_ENDPOINT: &str = "http://127.0.0.1:50051";
const DEFAULT_CREDENTIALS: &str = "./cube-data/dev-credentials.json";

/// Command-line client for cubed.
#[derive(Debug, Parser)]
#[command(name = "cubec", version)]
struct Cli {
    /// Server address; default: the credentials file's endpoint, else http://127.0.0.1:50051.
    #[arg(long, env = "CUBE_ENDPOINT", global = true)]
    endpoint: Option<String>,
    /// Credentials JSON ({"tenant","key_id","secret"}); default ./cube-data/dev-credentials.json.
    /// Alternatively set CUBE_TENANT, CUBE_KEY_ID and CUBE_SECRET.
    #[arg(long, env = "CUBE_CREDENTIALS", global = true)]
    credentials: Option<PathBuf>,
    /// CA certificate (PEM) to trust for an https:// endpoint; default ./cube-data/tls/ca.pem.
    #[arg(long, env = "CUBE_CA", global = true)]
    ca: Option<PathBuf>,
    /// Client certificate (PEM) from `cubed key cert`: authenticates the connection (mTLS).
    #[arg(long, env = "CUBE_CERT", global = true, requires = "key")]
    cert: Option<PathBuf>,
    /// Private key (PEM) of --cert.
    #[arg(long, env = "CUBE_KEY", global = true, requires = "cert")]
    key: Option<PathBuf>,
    /// Authentication model: sign every call, or authenticate the connection once.
    #[arg(long, env = "CUBE_AUTH", value_enum, default_value_t = AuthModel::Call, global = true)]
    auth: AuthModel,
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
    /// Write VALUE (UTF-8 text) at (X, Y, Z).
    #[command(allow_negative_numbers = true)]
    Write {
        x: i32,
        y: i32,
        z: i32,
        value: String,
        /// Write only if the cell is at this version (0 = must not exist).
        #[arg(long)]
        expected_version: Option<u64>,
    },
    /// Read the cell at (X, Y, Z).
    #[command(allow_negative_numbers = true)]
    Read { x: i32, y: i32, z: i32 },
    /// Delete the cell at (X, Y, Z).
    #[command(allow_negative_numbers = true)]
    Delete { x: i32, y: i32, z: i32 },
    /// The tenant's audit trail.
    #[command(subcommand)]
    Audit(AuditCmd),
}

#[derive(Debug, Subcommand)]
enum AuditCmd {
    /// Print entries as JSON lines.
    List {
        #[arg(long, default_value_t = 0)]
        from: u64,
        #[arg(long, default_value_t = 100)]
        limit: u32,
    },
    /// Fetch the whole retained trail, recompute the hash chain and name the first broken link.
    Verify,
}

fn load_credentials(path: Option<&PathBuf>) -> anyhow::Result<Credentials> {
    if path.is_none()
        && let (Ok(tenant), Ok(key_id), Ok(secret)) = (
            std::env::var("CUBE_TENANT"),
            std::env::var("CUBE_KEY_ID"),
            std::env::var("CUBE_SECRET"),
        )
    {
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
    let text = std::fs::read_to_string(&path).with_context(|| {
        format!("cannot read credentials from {} (use --credentials or CUBE_TENANT/CUBE_KEY_ID/CUBE_SECRET)", path.display())
    })?;
    serde_json::from_str(&text)
        .with_context(|| format!("{} is not a credentials JSON file", path.display()))
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
            eprintln!("cubec: error: {}", error_chain(&e));
            std::process::ExitCode::FAILURE
        }
    }
}

/// The error and its causes, `: `-separated like `{:#}`, but without a cause that only repeats
/// the one before it (tonic's and hyper's transport errors wrap an error with the same text:
/// "tcp connect error: tcp connect error: Connection refused").
fn error_chain(e: &anyhow::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if parts.last() != Some(&text) {
            parts.push(text);
        }
    }
    parts.join(": ")
}

async fn run() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let creds = load_credentials(cli.credentials.as_ref())?;
    let secret = creds.secret().context("the credentials' secret")?;
    let endpoint = cli
        .endpoint
        .clone()
        .or(creds.endpoint.clone())
        .unwrap_or_else(|| DEFAULT_ENDPOINT.into());
    let mut ep = Endpoint::from_shared(endpoint.clone())
        .with_context(|| format!("bad endpoint {endpoint}"))?;
    if endpoint.starts_with("https://") {
        ep = ep.tls_config(tls_config(&cli)?)?;
    }
    let channel: Channel = ep
        .connect()
        .await
        .with_context(|| format!("cannot connect to {endpoint}"))?;
    let transport = match cli.auth {
        // The client certificate already authenticates the connection.
        _ if cli.cert.is_some() => Signing::passthrough(channel),
        AuthModel::Call => Signing::new(
            channel,
            CallSigner::new(&creds.tenant, &creds.key_id, secret),
        ),
        AuthModel::Connection => {
            cube_auth::client::handshake(channel.clone(), &creds)
                .await
                .context("handshake")?;
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
                    println!("{}", entry_json(&e));
                }
                Ok(())
            }
            AuditCmd::Verify => {
                let entries = fetch_audit(&mut tenant, 0, None).await?;
                match cube_auth::client::verify_audit_entries(&entries) {
                    Ok(_) => {
                        println!(
                            "{}",
                            serde_json::json!({ "ok": true, "entries": entries.len() })
                        );
                        Ok(())
                    }
                    Err((seq, why)) => anyhow::bail!("audit chain broken at seq {seq}: {why}"),
                }
            }
        };
    }
    let out = match cli.command {
        Cmd::Write {
            x,
            y,
            z,
            value,
            expected_version,
        } => {
            let r = cells
                .write(WriteRequest {
                    coord: coord(x, y, z),
                    value: value.into_bytes(),
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
        Cmd::Delete { x, y, z } => {
            let r = cells
                .delete(DeleteRequest {
                    coord: coord(x, y, z),
                    expected_version: None,
                })
                .await
                .map_err(status)?
                .into_inner();
            serde_json::json!({ "existed": r.existed, "seq": r.seq })
        }
    };
    println!("{out}");
    Ok(())
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
    // The development certificate names localhost and 127.0.0.1.
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca))
        .domain_name("localhost");
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

fn status(s: tonic::Status) -> anyhow::Error {
    anyhow::anyhow!("{:?}: {}", s.code(), s.message())
}

#[cfg(test)]
mod tests {
    use super::error_chain;

    #[test]
    fn a_cause_that_repeats_the_one_before_is_printed_once() {
        let e = anyhow::anyhow!("Connection refused (os error 111)")
            .context("tcp connect error")
            .context("tcp connect error")
            .context("transport error")
            .context("cannot connect to http://127.0.0.1:1");
        assert_eq!(
            error_chain(&e),
            "cannot connect to http://127.0.0.1:1: transport error: tcp connect error: Connection refused (os error 111)"
        );
    }
}
