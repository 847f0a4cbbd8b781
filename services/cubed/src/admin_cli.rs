//! `cubed tenant create`, `cubed tenant durability`, `cubed key create`, `cubed key revoke`.
//!
//! While a server runs it holds the catalog's lock, so these commands go through its local admin
//! socket (`<data-dir>/admin.sock`); while it is stopped they open the catalog directly. Either
//! way the output is the same.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};

use crate::config::DataDirArg;
use cube_api::v1::admin_client::AdminClient;
use cube_api::v1::{
    CreateKeyRequest, CreateTenantRequest, DeleteTenantRequest, ListTenantsRequest,
    RecordCertificateRequest, RelaxedDurability, RevokeKeyRequest, SetDurabilityRequest,
};
use cube_auth::{Credentials, Secret};
use cube_store::{
    Catalog, CatalogOpenError, Command, DataDir, KeyInfo, Reply, SyncPolicy, describe_policy,
    open_offline, run_offline, validate_tenant_name,
};
use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

enum Op<'a> {
    CreateTenant(&'a str),
    DeleteTenant(&'a str),
    /// The tenant, and whether the key gets ADMIN.
    CreateKey(&'a str, bool),
    RevokeKey(&'a str, &'a str),
    KeyIsActive(&'a str, &'a str),
    ListTenants,
    /// `key.cert` in the tenant's trail: the tenant, the key, the certificate's SHA-256 and its
    /// notAfter (Unix ms).
    RecordCertificate(&'a str, &'a str, [u8; 32], i64),
    SetDurability(&'a str, SyncPolicy),
}

enum Outcome {
    Credentials(Credentials),
    Revoked {
        revoked: bool,
        /// The tenant has no active ADMIN key after it.
        no_admin_left: bool,
    },
    Active(bool),
    /// One JSON object per tenant, as `tenant list` prints them.
    Tenants(Vec<serde_json::Value>),
    /// Whether the certificate is in the tenant's trail (false: a server older than
    /// Admin.RecordCertificate).
    CertificateRecorded(bool),
    Durability {
        durability: String,
        applied_now: bool,
    },
    Deleted {
        tenant: String,
        /// Every key the tenant had, sorted.
        key_ids: Vec<String>,
        /// false: files left for the server's next start to remove.
        files_removed: bool,
    },
}

pub async fn create_tenant(dir: &DataDirArg, name: &str) -> anyhow::Result<()> {
    print(execute(dir, Op::CreateTenant(name)).await?)
}

pub async fn delete_tenant(dir: &DataDirArg, name: &str) -> anyhow::Result<()> {
    let outcome = execute(dir, Op::DeleteTenant(name)).await?;
    if let Outcome::Deleted {
        files_removed: false,
        ..
    } = &outcome
    {
        eprintln!(
            "cubed: note: the tenant is deleted (nothing authenticates as it), but its files are \
             still on disk (why: the server log, or the warning above): the server's next start \
             removes them"
        );
    }
    print(outcome)
}

pub async fn list_tenants(dir: &DataDirArg) -> anyhow::Result<()> {
    print(execute(dir, Op::ListTenants).await?)
}

/// A tenant as `tenant list` prints it; `keys` are (key id, capabilities, which serialize as
/// `read`, `write`, `admin`) and `None` for a server too old to send capabilities;
/// `durability` is null when it could not be read.
fn tenant_line(
    name: &str,
    durability: Option<String>,
    keys: Vec<(String, Option<Vec<cube_store::Capability>>)>,
) -> serde_json::Value {
    let keys: Vec<serde_json::Value> = keys
        .into_iter()
        .map(|(key_id, caps)| match caps {
            Some(caps) => serde_json::json!({ "key_id": key_id, "capabilities": caps }),
            None => serde_json::json!({ "key_id": key_id }),
        })
        .collect();
    serde_json::json!({ "tenant": name, "durability": durability, "keys": keys })
}

pub async fn create_key(dir: &DataDirArg, tenant: &str, admin: bool) -> anyhow::Result<()> {
    print(execute(dir, Op::CreateKey(tenant, admin)).await?)
}

pub async fn revoke_key(dir: &DataDirArg, tenant: &str, key_id: &str) -> anyhow::Result<()> {
    let outcome = execute(dir, Op::RevokeKey(tenant, key_id)).await?;
    if let Outcome::Revoked {
        no_admin_left: true,
        ..
    } = outcome
    {
        // Allowed (a leaked key must be revocable), but no key of the tenant can change a
        // key's capabilities until the operator makes an ADMIN key.
        eprintln!(
            "cubed: warning: tenant '{tenant}' has no active key with ADMIN now, so none of its \
             keys can call Access; `cubed key create {tenant} --admin` makes one"
        );
    }
    print(outcome)
}

pub async fn set_durability(
    dir: &DataDirArg,
    tenant: &str,
    policy: SyncPolicy,
) -> anyhow::Result<()> {
    print(execute(dir, Op::SetDurability(tenant, policy)).await?)
}

/// `cubed key cert`: a client certificate for an active key, valid for `days`, recorded in the
/// tenant's audit trail and written into `out`.
pub async fn key_cert(
    dir: &DataDirArg,
    tenant: &str,
    key_id: &str,
    out: &Path,
    days: u32,
) -> anyhow::Result<()> {
    let data_dir = &dir.data_dir;
    let Outcome::Active(true) = execute(dir, Op::KeyIsActive(tenant, key_id)).await? else {
        bail!("tenant '{tenant}' has no active key '{key_id}'");
    };
    // The CA's files are written (and created, the first time) by this process, also while a
    // server runs: no "while the server runs" in its refusal.
    check_owner_as(data_dir, nix::unistd::geteuid().as_raw(), false)?;
    crate::certs::prepare_out_dir(out)?;
    let issued = crate::certs::issue_client_cert(data_dir, tenant, key_id, days)?;
    let not_after_ms = issued.not_after.unix_timestamp() * 1000;
    // In the trail before its files exist: a certificate that is written anywhere is recorded
    // (one recorded and then not written was never out of this process).
    let record = Op::RecordCertificate(tenant, key_id, issued.sha256, not_after_ms);
    let recorded = match execute(dir, record).await {
        Ok(Outcome::CertificateRecorded(recorded)) => recorded,
        Ok(_) => bail!("unexpected answer to recording the certificate"),
        Err(e) => {
            return Err(e.context(
                "the certificate was not confirmed as recorded in the tenant's audit trail, so it \
                 was not written",
            ));
        }
    };
    if !recorded {
        eprintln!(
            "cubed: warning: the running server is older than this command and cannot record the \
             certificate in tenant '{tenant}'s audit trail: it is written unrecorded"
        );
    }
    let sha256 = hex::encode(issued.sha256);
    let (cert_path, key_path) =
        crate::certs::write_client_cert(out, tenant, key_id, &issued.cert_pem, &issued.key_pem)
            .map_err(|e| {
                let entry = if recorded {
                    format!(
                        "; tenant '{tenant}'s audit trail records it (key.cert, sha256={sha256}), \
                         a certificate nobody holds"
                    )
                } else {
                    String::new()
                };
                e.context(format!(
                    "the certificate could not be written into {}{entry}: repeat the command \
                     once --out is writable",
                    out.display()
                ))
            })?;
    let ca = crate::certs::ca_cert_path(data_dir);
    let not_after = issued
        .not_after
        .format(&time::format_description::well_known::Rfc3339)?;
    let line = serde_json::json!({
        "cert": cert_path.to_string_lossy(),
        "key": key_path.to_string_lossy(),
        "ca": ca.to_string_lossy(),
        "not_after": not_after,
        "sha256": sha256,
        "recorded": recorded,
    });
    emit(&line.to_string()).map_err(|e| {
        anyhow::anyhow!(
            "the certificate was written to {} and its key to {}, but this answer could not be \
             written to standard output ({e})",
            cert_path.display(),
            key_path.display()
        )
    })
}

/// Refuse to write into `data_dir` as another user than its owner: files created there by,
/// say, `sudo cubed key create` would belong to root, and the server, running as the
/// directory's owner, could not open them at its next start (nor a later command as that user).
/// `server_would_do`: whether the running server could make the change instead (it writes no
/// certificate files, for one).
fn check_owner_as(data_dir: &Path, euid: u32, server_would_do: bool) -> anyhow::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = std::fs::metadata(data_dir) else {
        return Ok(()); // created by this command, as its user
    };
    let owner = meta.uid();
    anyhow::ensure!(
        owner == euid,
        "{} belongs to user id {owner}, and this command runs as user id {euid}: files it \
         created there would not be readable by the server running as their owner; run it as \
         that user (for example `sudo -u '#{owner}' cubed ...`){}",
        data_dir.display(),
        if server_would_do {
            ", or while the server runs (it then makes the change itself)"
        } else {
            ""
        }
    );
    Ok(())
}

/// Print a made change's answer. A failed write (a closed pipe, a full disk) is an error that
/// says the change was made, and for a new key how to get rid of it: its secret is printed
/// nowhere else. (`println!` panicked on it, exit code 101 and no word of the key.)
fn print(outcome: Outcome) -> anyhow::Result<()> {
    let line = match &outcome {
        Outcome::Active(a) => format!("{{\"active\":{a}}}"),
        Outcome::Tenants(tenants) => {
            let lines: Vec<String> = tenants.iter().map(|t| t.to_string()).collect();
            if lines.is_empty() {
                return Ok(());
            }
            lines.join("\n")
        }
        Outcome::CertificateRecorded(r) => format!("{{\"recorded\":{r}}}"),
        Outcome::Durability {
            durability,
            applied_now,
        } => {
            serde_json::json!({ "durability": durability, "applied_now": applied_now }).to_string()
        }
        Outcome::Credentials(c) => serde_json::to_string(c)?,
        Outcome::Deleted {
            tenant,
            key_ids,
            files_removed,
        } => serde_json::json!({
            "tenant": tenant,
            "deleted": true,
            "key_ids": key_ids,
            "files_removed": files_removed,
        })
        .to_string(),
        Outcome::Revoked { revoked: true, .. } => "{\"revoked\":true}".to_string(),
        Outcome::Revoked { revoked: false, .. } => {
            "{\"revoked\":false,\"note\":\"the key was already revoked\"}".to_string()
        }
    };
    emit(&line).map_err(|e| match &outcome {
        Outcome::Credentials(c) => anyhow::anyhow!(
            "key {} of tenant '{}' was made, but the answer holding its secret could not be \
             written to standard output ({e}), and the secret is shown nowhere else: revoke it \
             (`cubed key revoke {} {}`) and make another",
            c.key_id,
            c.tenant,
            c.tenant,
            c.key_id
        ),
        Outcome::Tenants(_) | Outcome::Active(_) => {
            anyhow::anyhow!("the answer could not be written to standard output ({e})")
        }
        _ => anyhow::anyhow!(
            "the change was made, but its answer could not be written to standard output ({e})"
        ),
    })
}

/// `line` and a newline on standard output, flushed.
fn emit(line: &str) -> std::io::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")?;
    out.flush()
}

/// How long a command waits for a catalog that is locked while no server answers on the admin
/// socket: a server holds it that way from its start through crash recovery (which may replay
/// many tenants' logs) and while it closes its tenants at a stop; an offline command holds it
/// while it opens one tenant (`tenant list`: each tenant a crash left unclosed).
const LOCKED_CATALOG_WAIT: Duration = Duration::from_secs(60);

async fn execute(dir: &DataDirArg, op: Op<'_>) -> anyhow::Result<Outcome> {
    let data_dir = &dir.data_dir;
    let data = DataDir::new(data_dir);
    if let Op::CreateTenant(name) | Op::DeleteTenant(name) = op {
        // Before anything is created: a bad name must not leave a new data directory behind.
        validate_tenant_name(name).map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    crate::config::check_data_dir(data_dir)?;
    if !data.catalog().exists() {
        // A typo'd --data-dir (or the default one, from the wrong working directory) would get
        // a fresh catalog, and `tenant create` credentials that the real server rejects.
        match op {
            Op::CreateTenant(_) => eprintln!(
                "note: no Cube data directory at {}: creating one (pass --data-dir or --config to use the server's)",
                data_dir.display()
            ),
            _ => bail!(
                "no Cube data directory at {} (it has no catalog): pass --data-dir or --config naming the server's",
                data_dir.display()
            ),
        }
    }
    let socket = data.admin_socket();
    let deadline = std::time::Instant::now() + LOCKED_CATALOG_WAIT;
    let mut told = false;
    loop {
        // One deadline for setting up the connection and the answer.
        let timeout = dir.admin_timeout();
        let answer_by = tokio::time::Instant::now() + timeout;
        if let Some(client) = connect(socket.clone(), answer_by, timeout).await? {
            return answered(remote(client, &op), answer_by, timeout, &op).await;
        }
        // No server answers: this process writes the files itself. (`key cert` asks the server
        // whether the key is active, but writes the certificate files itself either way.)
        check_owner_as(
            data_dir,
            nix::unistd::geteuid().as_raw(),
            !matches!(op, Op::KeyIsActive(..) | Op::RecordCertificate(..)),
        )?;
        match Catalog::open(&data.catalog()) {
            Ok(catalog) => {
                crate::holder::record(&data, crate::holder::Role::Command);
                return local(&data, &Arc::new(catalog), &op);
            }
            Err(CatalogOpenError::Locked) => {}
            Err(e) => return Err(e).context("opening the catalog"),
        }
        if std::time::Instant::now() >= deadline {
            bail!(
                "the catalog in {} stayed locked for {} s with no server answering on its admin \
                 socket: a server starting or stopping there, or another command, holds it",
                data_dir.display(),
                LOCKED_CATALOG_WAIT.as_secs()
            );
        }
        if !told {
            told = true;
            match crate::holder::other_server(&data) {
                Some(pid) => eprintln!(
                    "waiting for the catalog in {}: cubed (pid {pid}) is starting or stopping there",
                    data_dir.display()
                ),
                None => eprintln!(
                    "waiting for the catalog in {}: a server is starting or stopping there, or another command holds it",
                    data_dir.display()
                ),
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn credentials(k: &KeyInfo) -> Credentials {
    Credentials {
        tenant: k.tenant.clone(),
        key_id: k.key_id.clone(),
        secret: Secret::from_bytes(k.secret).to_hex(),
        endpoint: None,
    }
}

/// Principal of audit entries made by these commands.
const OPERATOR: &str = "operator";

fn local(data: &DataDir, catalog: &Arc<Catalog>, op: &Op<'_>) -> anyhow::Result<Outcome> {
    // The server is stopped, so the CLI runs each change through the tenant's log itself.
    Ok(match op {
        Op::CreateTenant(name) => {
            let key = catalog.create_tenant(name)?;
            // The tenant's first open logs its `tenant.create` entry as its log's first record.
            if let Err(e) = open_offline(data, catalog, &key.tenant) {
                eprintln!(
                    "cubed: warning: the tenant was created but could not be opened (its first \
                     open will record its creation): {e}"
                );
            }
            Outcome::Credentials(credentials(&key))
        }
        Op::DeleteTenant(name) => {
            // Files an earlier deletion could not remove (a crash, a server that could not
            // close the tenant) go first.
            cube_store::remove_deleted_files(data, catalog);
            // The tenant's log is not replayed: what only it holds (a key created before a
            // crash) is deleted with it, and must not reach the catalog.
            let key_ids = catalog.delete_tenant(name)?;
            let files_removed = match cube_store::remove_tenant_files(data, name) {
                Ok(_) => true,
                Err(e) => {
                    eprintln!(
                        "cubed: warning: the tenant is deleted, but its files could not be removed \
                         ({e}); the server's next start removes them"
                    );
                    false
                }
            };
            Outcome::Deleted {
                tenant: name.to_string(),
                key_ids,
                files_removed,
            }
        }
        Op::CreateKey(tenant, admin) => {
            catalog.require_tenant(tenant)?;
            // One record of the tenant's log holds the new key and its audit entry.
            let cmd = Command::CreateKey { admin: *admin };
            match run_offline(data, catalog, tenant, OPERATOR, cmd)? {
                Reply::KeyCreated { key_id, secret, .. } => Outcome::Credentials(Credentials {
                    tenant: tenant.to_string(),
                    key_id,
                    secret: secret.to_hex(),
                    endpoint: None,
                }),
                other => bail!("unexpected answer to a key creation: {other:?}"),
            }
        }
        Op::RevokeKey(tenant, key) => {
            // The key is looked up once the tenant's log is replayed (by the command itself): a
            // key created through the log before a crash may be missing from the catalog's
            // files until then.
            catalog.require_tenant(tenant)?;
            // One record of the tenant's log holds the revocation and its audit entry.
            let cmd = Command::RevokeKey {
                key_id: key.to_string(),
            };
            match run_offline(data, catalog, tenant, OPERATOR, cmd) {
                Ok(Reply::KeyRevoked { revoked, .. }) => Outcome::Revoked {
                    revoked,
                    no_admin_left: !catalog.has_active_admin(tenant),
                },
                Ok(other) => bail!("unexpected answer to a key revocation: {other:?}"),
                Err(e) if e.revocation_goes_to_catalog() => {
                    eprintln!(
                        "cubed: warning: the tenant's log could not take the revocation ({e}); \
                         revoking through the catalog, without an audit entry"
                    );
                    let revoked = catalog.revoke_key(tenant, key)?;
                    Outcome::Revoked {
                        revoked,
                        no_admin_left: !catalog.has_active_admin(tenant),
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
        Op::KeyIsActive(tenant, key) => {
            catalog.require_tenant(tenant)?;
            // After a crash the catalog's files may lack key changes only the tenant's log
            // holds (a revocation, a creation): replaying it puts them in.
            if let Err(e) = open_offline(data, catalog, tenant) {
                // The gateway checks the key again at every handshake: a certificate issued
                // from a catalog that lags authenticates nothing a revocation took away.
                eprintln!(
                    "cubed: warning: the tenant's log could not be replayed ({e}); answering \
                     from the catalog as it is, which may lag key changes that log holds"
                );
            }
            Outcome::Active(catalog.key(tenant, key).is_some_and(|k| !k.revoked))
        }
        Op::ListTenants => {
            // After a crash the catalog's files may lack key and durability changes only the
            // tenants' logs hold: replaying those logs puts them in. Only the logs a crash left
            // unclosed, as the server's start does: a list after a clean stop opens no tenant and
            // writes nothing of theirs.
            let mut stale = Vec::new();
            for (name, _) in catalog.list()? {
                let log = data.tenant_wal(&name);
                if !cube_wal::log_may_need_replay(&log).unwrap_or(true) {
                    continue;
                }
                if let Err(e) = open_offline(data, catalog, &name) {
                    eprintln!(
                        "cubed: warning: the log of tenant '{name}' could not be replayed ({e}); \
                         listing it from the catalog as it is (\"stale\":true), which may lag key \
                         changes that log holds"
                    );
                    stale.push(name);
                }
            }
            let lines = catalog
                .summaries()?
                .into_iter()
                .map(|t| {
                    let stale = stale.contains(&t.name);
                    let keys = t
                        .keys
                        .into_iter()
                        .map(|(id, caps)| (id, Some(caps)))
                        .collect();
                    let mut line =
                        tenant_line(&t.name, t.durability.as_ref().map(describe_policy), keys);
                    if stale {
                        line["stale"] = true.into();
                    }
                    line
                })
                .collect();
            Outcome::Tenants(lines)
        }
        Op::RecordCertificate(tenant, key, sha256, not_after_ms) => {
            catalog.require_tenant(tenant)?;
            // The tenant's core checks the key once the command has replayed its log, and
            // answers once the entry is durable.
            let cmd = Command::RecordCertificate {
                key_id: key.to_string(),
                sha256: *sha256,
                not_after_ms: *not_after_ms,
            };
            match run_offline(data, catalog, tenant, OPERATOR, cmd)? {
                Reply::Recorded { .. } => Outcome::CertificateRecorded(true),
                other => bail!("unexpected answer to recording a certificate: {other:?}"),
            }
        }
        Op::SetDurability(tenant, policy) => {
            catalog.require_tenant(tenant)?;
            // One record of the tenant's log holds the new policy and its audit entry.
            let cmd = Command::SetDurability { policy: *policy };
            match run_offline(data, catalog, tenant, OPERATOR, cmd) {
                Ok(_) => {}
                Err(e) if e.durability_goes_to_catalog() => {
                    eprintln!(
                        "cubed: warning: the tenant's log could not take the durability change \
                         ({e}); setting it through the catalog, without an audit entry"
                    );
                    catalog.set_durability(tenant, *policy)?;
                }
                Err(e) => return Err(e.into()),
            }
            let durability = describe_policy(policy);
            Outcome::Durability {
                durability,
                applied_now: true,
            }
        }
    })
}

async fn remote(mut client: AdminClient<Channel>, op: &Op<'_>) -> anyhow::Result<Outcome> {
    let creds = |c: Option<cube_api::v1::Credentials>| -> anyhow::Result<Outcome> {
        let c = c.context("the server answered without credentials")?;
        Ok(Outcome::Credentials(Credentials {
            tenant: c.tenant,
            key_id: c.key_id,
            secret: c.secret,
            endpoint: None,
        }))
    };
    match op {
        Op::CreateTenant(name) => {
            let r = client
                .create_tenant(CreateTenantRequest {
                    name: name.to_string(),
                })
                .await?;
            creds(r.into_inner().credentials)
        }
        Op::CreateKey(tenant, admin) => {
            let r = client
                .create_key(CreateKeyRequest {
                    tenant: tenant.to_string(),
                    admin: *admin,
                })
                .await?
                .into_inner();
            let admin_cap = cube_api::v1::Capability::Admin as i32;
            if *admin && !r.capabilities.contains(&admin_cap) {
                let key_id = r.credentials.map(|c| c.key_id).unwrap_or_default();
                bail!(
                    "the running server made key {key_id} of tenant '{tenant}' without ADMIN: it \
                     is older than `key create --admin` and ignored it. Its secret is not \
                     printed: revoke it (`cubed key revoke {tenant} {key_id}`), restart the \
                     server on this build, and run the command again"
                );
            }
            creds(r.credentials)
        }
        Op::RevokeKey(tenant, key_id) => {
            let req = RevokeKeyRequest {
                tenant: tenant.to_string(),
                key_id: key_id.to_string(),
            };
            let r = client.revoke_key(req).await?;
            let r = r.into_inner();
            Ok(Outcome::Revoked {
                revoked: r.revoked,
                no_admin_left: r.no_admin_left,
            })
        }
        Op::DeleteTenant(name) => {
            let req = DeleteTenantRequest {
                tenant: name.to_string(),
            };
            match client.delete_tenant(req).await {
                Ok(r) => {
                    let r = r.into_inner();
                    Ok(Outcome::Deleted {
                        tenant: name.to_string(),
                        key_ids: r.key_ids,
                        files_removed: r.files_removed,
                    })
                }
                Err(s) if s.code() == tonic::Code::Unimplemented => bail!(
                    "the server running here is older than tenant deletion: stop it, then run \
                     this command again (it then deletes the tenant itself) and start the new \
                     server"
                ),
                Err(s) => Err(s.into()),
            }
        }
        Op::ListTenants => {
            let r = client.list_tenants(ListTenantsRequest {}).await?;
            let lines = r
                .into_inner()
                .tenants
                .into_iter()
                .map(|t| {
                    let keys = if t.active_keys.len() == t.active_key_ids.len() {
                        t.active_keys
                            .into_iter()
                            .map(|k| {
                                let caps = k
                                    .capabilities
                                    .into_iter()
                                    .filter_map(|c| u32::try_from(c).ok())
                                    .filter_map(cube_store::Capability::from_wire)
                                    .collect();
                                (k.key_id, Some(caps))
                            })
                            .collect()
                    } else {
                        // A server older than `active_keys`: ids only.
                        t.active_key_ids.into_iter().map(|id| (id, None)).collect()
                    };
                    // Empty: a server older than the field, or one that could not read it.
                    let durability = Some(t.durability).filter(|d| !d.is_empty());
                    tenant_line(&t.name, durability, keys)
                })
                .collect();
            Ok(Outcome::Tenants(lines))
        }
        Op::KeyIsActive(tenant, key_id) => {
            let r = client.list_tenants(ListTenantsRequest {}).await?;
            let tenants = r.into_inner().tenants;
            let Some(t) = tenants.iter().find(|t| t.name == *tenant) else {
                bail!("no tenant named '{tenant}'");
            };
            Ok(Outcome::Active(
                t.active_key_ids.iter().any(|k| k == key_id),
            ))
        }
        Op::RecordCertificate(tenant, key_id, sha256, not_after_ms) => {
            let req = RecordCertificateRequest {
                tenant: tenant.to_string(),
                key_id: key_id.to_string(),
                sha256: sha256.to_vec(),
                not_after_ms: *not_after_ms,
            };
            match client.record_certificate(req).await {
                Ok(_) => Ok(Outcome::CertificateRecorded(true)),
                // A server older than the rpc: key cert checked the key through it already.
                Err(s) if s.code() == tonic::Code::Unimplemented => {
                    Ok(Outcome::CertificateRecorded(false))
                }
                Err(s) => Err(s.into()),
            }
        }
        Op::SetDurability(tenant, policy) => {
            let relaxed = match policy {
                SyncPolicy::Always => None,
                SyncPolicy::Relaxed {
                    max_delay,
                    max_records,
                } => Some(RelaxedDurability {
                    max_delay_ms: max_delay.as_millis() as u64,
                    max_records: *max_records,
                }),
            };
            let r = client
                .set_durability(SetDurabilityRequest {
                    tenant: tenant.to_string(),
                    relaxed,
                })
                .await?
                .into_inner();
            Ok(Outcome::Durability {
                durability: r.durability,
                applied_now: r.applied_now,
            })
        }
    }
}

/// A client of the admin service on the Unix socket at `path`; `None` if no server listens
/// there (no socket, or one left by a server that is gone), so the command works offline.
/// `Err` if a connection was taken but not set up by `deadline` (`timeout` from the start): a
/// server is there and holds the catalog, but does not answer.
async fn connect(
    path: PathBuf,
    deadline: tokio::time::Instant,
    timeout: Duration,
) -> anyhow::Result<Option<AdminClient<Channel>>> {
    if !path.exists() {
        return Ok(None);
    }
    // Only a socket nobody listens on (or gone since) means no server: any other failure (a
    // path too long to dial, no permission) would send the command to the catalog a running
    // server holds, to wait there for a minute and fail with the wrong reason.
    let first = match tokio::time::timeout_at(deadline, dial(&path)).await {
        Err(_) => return Err(no_answer(timeout, "set up the connection")),
        Ok(Err(e))
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
            ) =>
        {
            return Ok(None);
        }
        Ok(Err(e)) => bail!(
            "cannot connect to the server's admin socket {}: {e}",
            path.display()
        ),
        Ok(Ok(stream)) => stream,
    };
    let first = std::sync::Mutex::new(Some(first));
    // The URI is required by the API but unused: the connector always dials the socket (the
    // first time, the connection made above).
    let endpoint = Endpoint::try_from("http://admin.sock")?;
    let connecting = endpoint.connect_with_connector(tower::service_fn(move |_: Uri| {
        let path = path.clone();
        let ready = first.lock().ok().and_then(|mut f| f.take());
        async move {
            let stream = match ready {
                Some(stream) => stream,
                None => dial(&path).await?,
            };
            Ok::<_, std::io::Error>(TokioIo::new(stream))
        }
    }));
    match tokio::time::timeout_at(deadline, connecting).await {
        // The local server's answers are trusted, and ListTenants names every tenant: past
        // tonic's default 4 MiB (some 65,000 tenants) `key cert` failed.
        Ok(Ok(channel)) => Ok(Some(
            AdminClient::new(channel).max_decoding_message_size(usize::MAX),
        )),
        Ok(Err(_)) => Ok(None),
        Err(_) => Err(no_answer(timeout, "set up the connection")),
    }
}

/// A connection to the Unix socket at `path`. A path too long for a socket address (a server
/// started with a shorter spelling of the data directory, say a relative one) is dialled
/// through the directory's descriptor, `/proc/self/fd/N/<name>`.
async fn dial(path: &Path) -> std::io::Result<UnixStream> {
    use std::os::fd::AsRawFd;
    match UnixStream::connect(path).await {
        Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => {
            let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
                return Err(e);
            };
            let dir = std::fs::File::open(dir)?;
            let short = Path::new("/proc/self/fd")
                .join(dir.as_raw_fd().to_string())
                .join(name);
            UnixStream::connect(short).await
        }
        dialled => dialled,
    }
}

/// `call`'s outcome, or an error saying what is known if the server did not answer by
/// `deadline` (`timeout` from the start) or closed the connection first (a server stopped with SIGSTOP or hung, or one
/// stopping: its admin socket takes connections for a few seconds after it stopped serving).
async fn answered(
    call: impl std::future::Future<Output = anyhow::Result<Outcome>>,
    deadline: tokio::time::Instant,
    timeout: Duration,
    op: &Op<'_>,
) -> anyhow::Result<Outcome> {
    let unknown = match op {
        Op::KeyIsActive(..) | Op::ListTenants => "",
        Op::RecordCertificate(..) => {
            " The certificate may or may not be in the tenant's audit trail (an entry without \
             files names a certificate nobody holds): repeat the command."
        }
        Op::DeleteTenant(_) => {
            " The tenant may or may not have been deleted: `cubed tenant list` tells (a deleted \
             tenant is not listed); repeat the command if it is listed."
        }
        Op::CreateTenant(_) => {
            " The tenant may or may not have been created: repeat the command; if it says the \
             tenant exists, this one created it and its first key's secret is lost (`cubed key \
             create --admin` gives another key with every capability)."
        }
        Op::CreateKey(..) => {
            " A key may or may not have been created: repeat the command (a key created \
             unanswered has a secret nobody holds)."
        }
        Op::RevokeKey(..) => {
            " The key may or may not have been revoked: repeat the command (it answers \
             {\"revoked\":false} if it was)."
        }
        Op::SetDurability(..) => {
            " The policy may or may not have been set: repeat the command (setting it again is \
             harmless)."
        }
    };
    match tokio::time::timeout_at(deadline, call).await {
        Ok(Ok(outcome)) => Ok(outcome),
        Ok(Err(e)) => match e.downcast_ref::<tonic::Status>() {
            // Not the server's own answer: the connection failed under the call.
            Some(status) if is_transport_failure(status) => bail!(
                "the server on the admin socket closed the connection before answering (is it \
                 stopping?).{unknown} Retry once it has stopped or restarted."
            ),
            // The server's answer, whose message is written for the user.
            Some(status) => bail!("{}", status.message()),
            None => Err(e),
        },
        Err(_) => Err(anyhow::anyhow!("{}{unknown}", no_answer(timeout, "answer"))),
    }
}

fn no_answer(timeout: Duration, what: &str) -> anyhow::Error {
    anyhow::anyhow!(
        "the server on the admin socket did not {what} within {} s: it may be stopped \
         (SIGSTOP), overloaded or hung (raise --admin-timeout-secs to wait longer).",
        timeout.as_secs()
    )
}

/// Whether `status` is the client's report of a failed connection rather than an answer of
/// the server: the client's carry the failure as their source (the server's, read from its
/// headers, carry none), or, for a stream ended without a final status (an HTTP/2 reset that
/// hyper takes for a clean end), say that no `grpc-status` came, which every answer of the
/// server has.
fn is_transport_failure(status: &tonic::Status) -> bool {
    std::error::Error::source(status).is_some() || status.message().contains("grpc-status")
}

#[cfg(test)]
mod tests {
    use super::*;
    use cube_store::{Caller, CoreConfig, TenantCore};

    /// A command run as another user than the data directory's owner (sudo) is refused before
    /// it writes anything there; its owner's, or one for a directory it creates, goes on.
    #[test]
    fn a_data_directory_of_another_user_is_refused() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let owner = std::fs::metadata(dir.path()).unwrap().uid();
        check_owner_as(dir.path(), owner, true).unwrap();
        check_owner_as(&dir.path().join("new"), owner + 1, true).unwrap();
        let refused = check_owner_as(dir.path(), owner + 1, true)
            .unwrap_err()
            .to_string();
        assert!(
            refused.contains(&format!("belongs to user id {owner}"))
                && refused.contains(&format!("runs as user id {}", owner + 1))
                && refused.contains("while the server runs"),
            "{refused}"
        );
        // key cert writes its files itself, also beside a running server: not told to run it
        // "while the server runs", which it had just done.
        let refused = check_owner_as(dir.path(), owner + 1, false)
            .unwrap_err()
            .to_string();
        assert!(!refused.contains("while the server runs"), "{refused}");
    }

    fn copy_dir(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for entry in std::fs::read_dir(from).unwrap() {
            let entry = entry.unwrap();
            let target = to.join(entry.file_name());
            if entry.file_type().unwrap().is_dir() {
                copy_dir(&entry.path(), &target);
            } else {
                std::fs::copy(entry.path(), &target).unwrap();
            }
        }
    }

    /// A relaxed tenant whose log a power cut left with a lost sector in its unsynced tail: the
    /// offline commands open it under the tenant's policy, as the server does, so recovery cuts
    /// the tail at the hole (changes inside the relaxed window, which the tenant chose to risk)
    /// instead of refusing the tenant as corrupt, which it does under `sync`.
    #[test]
    fn offline_commands_open_a_relaxed_log_under_its_policy() {
        let dir = tempfile::tempdir().unwrap();
        let data = DataDir::new(dir.path());
        let catalog = Arc::new(Catalog::open(&data.catalog()).unwrap());
        catalog.create_tenant("acme").unwrap();
        open_offline(&data, &catalog, "acme").unwrap();
        let policy = SyncPolicy::Relaxed {
            max_delay: Duration::from_secs(10),
            max_records: 1000,
        };
        catalog.set_durability("acme", policy).unwrap();
        let open_under = |sync: SyncPolicy| {
            let config = CoreConfig {
                catalog: Some(Arc::clone(&catalog)),
                wal: cube_wal::WalOptions {
                    sync,
                    ..cube_wal::WalOptions::default()
                },
                ..CoreConfig::default()
            };
            TenantCore::<u32>::open(
                "acme",
                &data.tenant_wal("acme"),
                &data.tenant_state("acme"),
                &config,
                None,
            )
        };
        let coord = |i: u8| cube_store::Coord {
            x: i32::from(i),
            y: 0,
            z: 0,
        };
        let value = |i: u8| vec![0xA0 + i; 2048];
        let (mut core, _) = open_under(policy).unwrap();
        let caller = Caller {
            principal: OPERATOR.to_string(),
            ts_ms: 1,
        };
        let wal_holding = |i: u8| {
            std::fs::read_dir(data.tenant_wal("acme"))
                .unwrap()
                .map(|e| e.unwrap().path())
                .filter(|p| p.extension().is_some_and(|e| e == "wal"))
                // A spare segment may be renamed while this reads.
                .find(|p| {
                    std::fs::read(p)
                        .is_ok_and(|b| b.windows(2048).any(|w| w == value(i).as_slice()))
                })
        };
        for i in 0..10 {
            if i == 8 {
                // Writes 8 and 9 in a later batch than write 4: its hole is not in the last
                // batch (which `sync` would cut too, as never acknowledged).
                let start = std::time::Instant::now();
                while wal_holding(7).is_none() {
                    assert!(
                        start.elapsed() < Duration::from_secs(10),
                        "write 7 not written"
                    );
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
            let write = Command::Write {
                coord: coord(i),
                value: value(i),
                expected_version: None,
            };
            // Applied before its fsync (the relaxed window): answered at once.
            assert!(matches!(
                core.handle(write, &caller, u32::from(i)),
                Some((_, Ok(_)))
            ));
        }
        // Every record reaches the file; nothing is applied to the state store or checkpointed.
        core.take_wal().unwrap().close().unwrap();
        drop(core);
        // The power cut: one 512-byte sector inside write 4's value never reached the disk.
        let segment = wal_holding(4).expect("a segment holds write 4");
        let mut bytes = std::fs::read(&segment).unwrap();
        let at = bytes
            .windows(2048)
            .position(|w| w == value(4).as_slice())
            .unwrap();
        let sector = at.next_multiple_of(512);
        bytes[sector..sector + 512].fill(0);
        std::fs::write(&segment, &bytes).unwrap();

        // Under `sync` a hole before valid records is damage: the tenant does not open.
        let Err(refused) = open_under(SyncPolicy::default()) else {
            panic!("opened under sync")
        };
        assert!(
            matches!(refused, cube_store::StoreError::DataLoss(_)),
            "{refused:?}"
        );
        assert_eq!(std::fs::read(&segment).unwrap(), bytes, "nothing cut");
        // Offline, under the tenant's policy: the tail is cut at the hole.
        open_offline(&data, &catalog, "acme").unwrap();
        let (core, _) = open_under(SyncPolicy::default()).unwrap();
        for i in 0..10 {
            let cell = core.state().read(&coord(i)).unwrap();
            assert_eq!(cell.map(|c| c.value), (i < 4).then(|| value(i)), "cell {i}");
        }
    }

    /// A server applied a key creation and a revocation through the tenant's log, then crashed
    /// before the catalog's files saw either: the offline commands must see both.
    #[test]
    fn offline_key_commands_see_the_key_changes_only_the_tenants_log_holds() {
        let dir = tempfile::tempdir().unwrap();
        let data = DataDir::new(dir.path());
        let catalog = Arc::new(Catalog::open(&data.catalog()).unwrap());
        let first = catalog.create_tenant("acme").unwrap();
        open_offline(&data, &catalog, "acme").unwrap();
        // The catalog's files as the crash below leaves them: without the two changes.
        catalog.make_durable().unwrap();
        let snapshot = dir.path().join("snapshot");
        copy_dir(&data.catalog(), &snapshot);
        std::fs::copy(
            data.catalog().with_extension("journal"),
            snapshot.with_extension("journal"),
        )
        .unwrap();

        let config = CoreConfig {
            catalog: Some(Arc::clone(&catalog)),
            ..CoreConfig::default()
        };
        let (mut core, _) = TenantCore::<u32>::open(
            "acme",
            &data.tenant_wal("acme"),
            &data.tenant_state("acme"),
            &config,
            None,
        )
        .unwrap();
        let caller = Caller {
            principal: OPERATOR.to_string(),
            ts_ms: 1,
        };
        assert!(
            core.handle(Command::CreateKey { admin: false }, &caller, 1)
                .is_none()
        );
        let revoke = Command::RevokeKey {
            key_id: first.key_id.clone(),
        };
        assert!(core.handle(revoke, &caller, 2).is_none());
        let wal = core.take_wal().unwrap();
        wal.wait_durable(wal.next_seq() - 1).unwrap();
        // The crash: the log is durable and not closed; nothing was applied or checkpointed.
        std::mem::forget(wal);
        drop(core);
        drop(catalog);

        let catalog = Arc::new(Catalog::open(&snapshot).unwrap());
        assert!(!catalog.key("acme", &first.key_id).unwrap().revoked);
        assert_eq!(catalog.active_key_ids("acme"), vec![first.key_id.clone()]);
        // `tenant list` replays the log the crash left unclosed: the created key, not the
        // revoked one.
        let listed = |catalog: &Arc<Catalog>| match local(&data, catalog, &Op::ListTenants) {
            Ok(Outcome::Tenants(t)) => t,
            other => panic!("{:?}", other.map(|_| ())),
        };
        let tenants = listed(&catalog);
        let [acme] = tenants.as_slice() else {
            panic!("{tenants:?}")
        };
        let keys = acme["keys"].as_array().unwrap();
        assert_eq!(keys.len(), 1, "{acme}");
        assert_ne!(keys[0]["key_id"], first.key_id.as_str(), "{acme}");
        assert_eq!(
            keys[0]["capabilities"],
            serde_json::json!(["read", "write"])
        );
        assert_eq!(acme["durability"], "sync");
        assert!(acme.get("stale").is_none(), "{acme}");
        // That replay closed the log cleanly: a second list opens nothing, so every file of the
        // tenant stays as it was.
        fn files(dir: &Path, out: &mut Vec<(PathBuf, u64, std::time::SystemTime)>) {
            for entry in std::fs::read_dir(dir).unwrap() {
                let entry = entry.unwrap();
                let meta = entry.metadata().unwrap();
                if meta.is_dir() {
                    files(&entry.path(), out);
                } else {
                    out.push((entry.path(), meta.len(), meta.modified().unwrap()));
                }
            }
        }
        let tenant_files = || {
            let mut out = Vec::new();
            files(data.tenant_wal("acme").parent().unwrap(), &mut out);
            out.sort();
            out
        };
        let before = tenant_files();
        assert_eq!(listed(&catalog), tenants);
        assert_eq!(tenant_files(), before);
        let active = |id: &str| match local(&data, &catalog, &Op::KeyIsActive("acme", id)) {
            Ok(Outcome::Active(a)) => a,
            other => panic!("{:?}", other.map(|_| ())),
        };
        assert!(!active(&first.key_id), "the revoked key is not active");
        let ids = catalog.active_key_ids("acme");
        let [created] = ids.as_slice() else {
            panic!("the replay adds the created key: {ids:?}")
        };
        assert!(active(created), "the created key is active");
        match local(&data, &catalog, &Op::RevokeKey("acme", created)) {
            Ok(Outcome::Revoked { revoked: true, .. }) => {}
            other => panic!("{:?}", other.map(|_| ())),
        }
        assert!(!active(created));
    }
}
