//! `cube.v1.Admin`. On the local admin socket (whose access is guarded by the data directory's
//! file permissions) it manages the catalog; on the network listener it refuses every call,
//! because operator credentials for the network do not exist yet.

use std::sync::Arc;

use cube_api::v1::{self, admin_server::Admin};
use cube_store::{Catalog, KeyInfo};
use tonic::{Request, Response, Status};

use crate::ApiError;
use crate::connection::ConnectionRegistry;
use cube_store::{Command, Reply, SyncPolicy, TenantDirectory, describe_policy};

pub(crate) struct AdminService {
    /// `None` on the network listener.
    pub catalog: Option<Arc<Catalog>>,
    /// Open connections, so revoking a key ends its sessions at once.
    pub connections: Option<Arc<ConnectionRegistry>>,
    /// Tenants, to record key events in their audit trails.
    pub directory: Option<Arc<TenantDirectory>>,
}

/// Principal of audit entries made through the local admin socket.
pub(crate) use cube_store::OPERATOR;

fn credentials(k: &KeyInfo) -> v1::Credentials {
    v1::Credentials {
        tenant: k.tenant.clone(),
        key_id: k.key_id.clone(),
        secret: hex_secret(&k.secret),
    }
}

fn hex_secret(s: &[u8; 32]) -> String {
    cube_auth::Secret::from_bytes(*s).to_hex()
}

impl AdminService {
    /// Run the catalog change `f` on the blocking pool. A change waits for the catalog's change
    /// lock and its journal's fdatasync, and every ~1 MiB of journal for a start-over (sled
    /// flushed and fsynced, a snapshot of the whole catalog: milliseconds, tens of them for a
    /// large catalog); none of that may hold one of the runtime's workers, which every
    /// connection's calls share. Lookups that may take the change lock (a tenant or key not
    /// yet known durable, the list read from sled) run here too.
    async fn change_catalog<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Catalog) -> Result<T, cube_store::StoreError> + Send + 'static,
    ) -> Result<T, Status> {
        let catalog = Arc::clone(self.catalog_arc()?);
        match tokio::task::spawn_blocking(move || f(&catalog)).await {
            Ok(result) => result.map_err(|e| ApiError::from(e).into()),
            Err(e) => {
                tracing::error!(error = %e, "a catalog change panicked");
                Err(Status::internal(
                    "the catalog change failed unexpectedly; see the server log",
                ))
            }
        }
    }

    fn catalog(&self) -> Result<&Catalog, Status> {
        self.catalog_arc().map(|c| &**c)
    }

    fn catalog_arc(&self) -> Result<&Arc<Catalog>, Status> {
        self.catalog.as_ref().ok_or_else(|| {
            ApiError::PermissionDenied(
                "Admin is served only on the local admin socket; run `cubed tenant create` / `cubed key create` on the server host".into(),
            )
            .into()
        })
    }
}

#[tonic::async_trait]
impl Admin for AdminService {
    async fn create_tenant(
        &self,
        req: Request<v1::CreateTenantRequest>,
    ) -> Result<Response<v1::CreateTenantResponse>, Status> {
        let name = req.into_inner().name;
        let key = self.change_catalog(move |c| c.create_tenant(&name)).await?;
        // The tenant's first open logs its `tenant.create` entry as the first record of its log.
        // Opened after the answer, not before: at --max-open-tenants the open first closes
        // others (each with a final fdatasync and checkpoint), which must not hold back the only
        // copy of the first key's secret past the caller's deadline. Any later call opens it
        // too, and logs the entry then.
        if let Some(directory) = &self.directory {
            let (directory, tenant) = (Arc::clone(directory), key.tenant.clone());
            tokio::spawn(async move {
                if let Err(e) = directory.get(&tenant).await {
                    tracing::error!(%tenant, error = %e, "the new tenant could not be opened; its first open will log its creation");
                }
            });
        }
        Ok(Response::new(v1::CreateTenantResponse {
            credentials: Some(credentials(&key)),
        }))
    }

    async fn create_key(
        &self,
        req: Request<v1::CreateKeyRequest>,
    ) -> Result<Response<v1::CreateKeyResponse>, Status> {
        let v1::CreateKeyRequest { tenant, admin } = req.into_inner();
        let Some(directory) = &self.directory else {
            let key = self
                .change_catalog(move |c| c.create_key(&tenant, admin))
                .await?;
            return Ok(Response::new(v1::CreateKeyResponse {
                credentials: Some(credentials(&key)),
                capabilities: super::access::to_proto(key.capabilities.clone()),
            }));
        };
        let name = tenant.clone();
        self.change_catalog(move |c| c.require_tenant(&name))
            .await?;
        // One record of the tenant's log holds the new key and its audit entry.
        match directory
            .call(&tenant, Command::CreateKey { admin }, OPERATOR)
            .await
            .map_err(ApiError::from)?
        {
            Reply::KeyCreated {
                key_id,
                secret,
                capabilities,
                ..
            } => Ok(Response::new(v1::CreateKeyResponse {
                credentials: Some(v1::Credentials {
                    tenant,
                    key_id,
                    secret: secret.to_hex(),
                }),
                capabilities: super::access::to_proto(capabilities),
            })),
            other => Err(super::cells::unexpected(&other)),
        }
    }

    async fn revoke_key(
        &self,
        req: Request<v1::RevokeKeyRequest>,
    ) -> Result<Response<v1::RevokeKeyResponse>, Status> {
        let r = req.into_inner();
        let (tenant, key_id) = (r.tenant.clone(), r.key_id.clone());
        self.change_catalog(move |c| c.require_key(&tenant, &key_id))
            .await?;
        let revoked = match &self.directory {
            // One record of the tenant's log holds the revocation and its audit entry.
            Some(directory) => {
                let cmd = Command::RevokeKey {
                    key_id: r.key_id.clone(),
                };
                match directory.call(&r.tenant, cmd, OPERATOR).await {
                    Ok(Reply::KeyRevoked { revoked, .. }) => revoked,
                    Ok(other) => return Err(super::cells::unexpected(&other)),
                    Err(e) if e.revocation_goes_to_catalog() => {
                        tracing::error!(tenant = %r.tenant, key = %r.key_id, error = %e, "the tenant's log could not take the revocation; revoking through the catalog, without an audit entry");
                        let (tenant, key_id) = (r.tenant.clone(), r.key_id.clone());
                        self.change_catalog(move |c| c.revoke_key(&tenant, &key_id))
                            .await?
                    }
                    Err(e) => return Err(ApiError::from(e).into()),
                }
            }
            None => {
                let (tenant, key_id) = (r.tenant.clone(), r.key_id.clone());
                self.change_catalog(move |c| c.revoke_key(&tenant, &key_id))
                    .await?
            }
        };
        // Sessions are ended again for a key already revoked: ending none costs nothing.
        let ended = self
            .connections
            .as_ref()
            .map_or(0, |c| c.end_sessions_of(&r.tenant, &r.key_id));
        if revoked {
            tracing::info!(tenant = %r.tenant, key = %r.key_id, sessions_ended = ended, "key revoked");
        } else {
            tracing::info!(tenant = %r.tenant, key = %r.key_id, sessions_ended = ended, "key revocation asked for a key already revoked: nothing changed");
        }
        // The revocation is in the catalog: a change is answered once applied. Said for a
        // repeated revocation too (its first answer may have been lost).
        let no_admin_left = !self.catalog_arc()?.has_active_admin(&r.tenant);
        if no_admin_left {
            tracing::warn!(tenant = %r.tenant, "the tenant has no active ADMIN key left: `cubed key create {} --admin` makes one", r.tenant);
        }
        Ok(Response::new(v1::RevokeKeyResponse {
            revoked,
            no_admin_left,
        }))
    }

    async fn set_durability(
        &self,
        req: Request<v1::SetDurabilityRequest>,
    ) -> Result<Response<v1::SetDurabilityResponse>, Status> {
        let r = req.into_inner();
        let policy = match r.relaxed {
            None => SyncPolicy::Always,
            Some(x) => SyncPolicy::Relaxed {
                max_delay: std::time::Duration::from_millis(x.max_delay_ms),
                max_records: x.max_records,
            },
        };
        // Off the admin socket, refused before anything else: a tenant's key learns nothing of
        // the policy bounds. There, a bad policy is INVALID_ARGUMENT whatever the tenant's
        // state, and before the tenant is opened to be told it.
        self.catalog()?;
        let cmd = Command::SetDurability { policy };
        cmd.check_arguments(usize::MAX).map_err(ApiError::from)?;
        let tenant = r.tenant.clone();
        self.change_catalog(move |c| c.require_tenant(&tenant))
            .await?;
        let durability = describe_policy(&policy);
        let applied_now = match &self.directory {
            // One record of the tenant's log holds the new policy and its audit entry; the log
            // runs under it once the tenant is reopened.
            Some(directory) => {
                match directory.call(&r.tenant, cmd, OPERATOR).await {
                    Ok(Reply::Recorded { .. }) => {}
                    Ok(other) => return Err(super::cells::unexpected(&other)),
                    Err(e) if e.durability_goes_to_catalog() => {
                        tracing::error!(tenant = %r.tenant, error = %e, "the tenant's log could not take the durability change; setting it through the catalog, without an audit entry");
                        let tenant = r.tenant.clone();
                        self.change_catalog(move |c| c.set_durability(&tenant, policy))
                            .await?;
                    }
                    Err(e) => return Err(ApiError::from(e).into()),
                }
                directory.close_tenant(&r.tenant).await
            }
            None => {
                let tenant = r.tenant.clone();
                self.change_catalog(move |c| c.set_durability(&tenant, policy))
                    .await?;
                false
            }
        };
        Ok(Response::new(v1::SetDurabilityResponse {
            durability,
            applied_now,
        }))
    }

    async fn record_certificate(
        &self,
        req: Request<v1::RecordCertificateRequest>,
    ) -> Result<Response<v1::RecordCertificateResponse>, Status> {
        let r = req.into_inner();
        // Off the admin socket, refused before anything else (as every Admin rpc).
        self.catalog()?;
        let sha256: [u8; 32] = r.sha256.as_slice().try_into().map_err(|_| {
            Status::invalid_argument(format!(
                "sha256 must be the 32 bytes of a SHA-256 digest, not {} bytes",
                r.sha256.len()
            ))
        })?;
        let cmd = Command::RecordCertificate {
            key_id: r.key_id.clone(),
            sha256,
            not_after_ms: r.not_after_ms,
        };
        cmd.check_arguments(usize::MAX).map_err(ApiError::from)?;
        let tenant = r.tenant.clone();
        self.change_catalog(move |c| c.require_tenant(&tenant))
            .await?;
        let Some(directory) = &self.directory else {
            return Err(Status::unavailable(
                "this server keeps no audit trails to record the certificate in",
            ));
        };
        // The tenant's core checks that the key is active in the same step as it logs the
        // entry, and answers once the entry is durable.
        match directory
            .call(&r.tenant, cmd, OPERATOR)
            .await
            .map_err(ApiError::from)?
        {
            Reply::Recorded { .. } => {
                tracing::info!(tenant = %r.tenant, key = %r.key_id, "client certificate issued");
                Ok(Response::new(v1::RecordCertificateResponse {}))
            }
            other => Err(super::cells::unexpected(&other)),
        }
    }

    async fn delete_tenant(
        &self,
        req: Request<v1::DeleteTenantRequest>,
    ) -> Result<Response<v1::DeleteTenantResponse>, Status> {
        let tenant = req.into_inner().tenant;
        // Off the admin socket, refused before anything else (as every Admin rpc).
        let catalog = Arc::clone(self.catalog_arc()?);
        cube_store::validate_tenant_name(&tenant).map_err(ApiError::from)?;
        let (connections, directory) = (self.connections.clone(), self.directory.clone());
        // A task of its own: a caller that gives up (its deadline, a dropped connection) stops
        // none of the steps halfway (calls refused but the change never made, or made but the
        // sessions left open and the files left for the next start).
        let deletion = tokio::spawn(async move {
            // Calls are refused from before the change, so that none is applied after it.
            if let Some(directory) = &directory {
                directory.refuse_deleted(&tenant);
            }
            let name = tenant.clone();
            let changed = match tokio::task::spawn_blocking({
                let catalog = Arc::clone(&catalog);
                move || catalog.delete_tenant(&name)
            })
            .await
            {
                Ok(result) => result.map_err(|e| Status::from(ApiError::from(e))),
                Err(e) => Err(deletion_panicked(&e)),
            };
            let key_ids = match changed {
                Ok(ids) => ids,
                Err(status) => {
                    match &directory {
                        // Deleted by another call (`NOT_FOUND`, was deleted): the refusal
                        // stays, and that call removes the files.
                        Some(_)
                            if status.code() == tonic::Code::NotFound
                                && catalog.is_deleted(&tenant) => {}
                        // Deleted after all (a failure after the change was durable): the
                        // refusal stays, and the files go.
                        Some(directory) if catalog.is_deleted(&tenant) => {
                            remove_files(directory, &tenant).await;
                        }
                        Some(directory) => directory.deletion_abandoned(&tenant).await,
                        None => {}
                    }
                    return Err(status);
                }
            };
            // Deleted (durably): nothing authenticates as the tenant any more. Logged at once:
            // the only record of it (its audit trail goes with it).
            tracing::info!(%tenant, keys = key_ids.len(), "tenant deleted");
            // Its sessions end now rather than at their next call.
            let ended: usize = connections.as_ref().map_or(0, |c| {
                key_ids
                    .iter()
                    .map(|key_id| c.end_sessions_of(&tenant, key_id))
                    .sum()
            });
            let files_removed = match &directory {
                Some(directory) => remove_files(directory, &tenant).await,
                None => false,
            };
            tracing::info!(%tenant, sessions_ended = ended, files_removed, "deleted tenant closed");
            Ok(v1::DeleteTenantResponse {
                key_ids,
                files_removed,
            })
        });
        match deletion.await {
            Ok(answer) => answer.map(Response::new),
            Err(e) => Err(deletion_panicked(&e)),
        }
    }

    async fn list_tenants(
        &self,
        _: Request<v1::ListTenantsRequest>,
    ) -> Result<Response<v1::ListTenantsResponse>, Status> {
        let tenants = self
            .change_catalog(|c| c.summaries())
            .await?
            .into_iter()
            .map(|t| {
                let durability = match &t.durability {
                    Some(p) => describe_policy(p),
                    None => {
                        tracing::warn!(tenant = %t.name, "the tenant's durability policy could not be read from the catalog; listed without it");
                        String::new()
                    }
                };
                v1::TenantInfo {
                    active_key_ids: t.keys.iter().map(|(id, _)| id.clone()).collect(),
                    active_keys: t
                        .keys
                        .into_iter()
                        .map(|(key_id, caps)| v1::KeySummary {
                            key_id,
                            capabilities: super::access::to_proto(caps),
                        })
                        .collect(),
                    name: t.name,
                    durability,
                }
            })
            .collect();
        Ok(Response::new(v1::ListTenantsResponse { tenants }))
    }
}

/// A tenant deletion's step that panicked (`e`), logged, as the caller is told.
fn deletion_panicked(e: &tokio::task::JoinError) -> Status {
    tracing::error!(error = %e, "a tenant's deletion panicked");
    Status::internal(
        "the deletion failed unexpectedly (see the server log); it may or may not have been \
         made: `cubed tenant list` tells (a deleted tenant is not listed)",
    )
}

/// Close the deleted `tenant` and remove its files; whether they are gone (if not, the next
/// start removes them).
async fn remove_files(directory: &Arc<TenantDirectory>, tenant: &str) -> bool {
    if !directory
        .close_for_deletion(tenant, cube_store::DELETION_CLOSE_WAIT)
        .await
    {
        tracing::warn!(%tenant, "the deleted tenant could not be closed in time (calls in flight, a failed log, or the server stopping); its files are removed at the next start");
        return false;
    }
    let data = directory.data_dir().clone();
    let name = tenant.to_string();
    match tokio::task::spawn_blocking(move || cube_store::remove_tenant_files(&data, &name)).await {
        Ok(Ok(_)) => true,
        Ok(Err(e)) => {
            tracing::error!(%tenant, error = %e, "the deleted tenant's files could not be removed; the next start tries again");
            false
        }
        Err(e) => {
            tracing::error!(%tenant, error = %e, "removing the deleted tenant's files panicked; the next start tries again");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The network port's Admin (no catalog) refuses every rpc as PERMISSION_DENIED, also a
    /// SetDurability whose policy is out of bounds (it answered INVALID_ARGUMENT, naming the
    /// bounds, to any authenticated key).
    #[tokio::test]
    async fn admin_off_the_admin_socket_refuses_a_bad_policy_as_permission_denied() {
        let admin = AdminService {
            catalog: None,
            connections: None,
            directory: None,
        };
        for relaxed in [
            None,
            Some(v1::RelaxedDurability {
                max_delay_ms: 0,
                max_records: 0,
            }),
        ] {
            let e = admin
                .set_durability(Request::new(v1::SetDurabilityRequest {
                    tenant: "demo".into(),
                    relaxed,
                }))
                .await
                .unwrap_err();
            assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
            assert!(e.message().contains("admin socket"), "{}", e.message());
        }
        // So is a deletion, whatever the name.
        for tenant in ["demo", "Not a name"] {
            let e = admin
                .delete_tenant(Request::new(v1::DeleteTenantRequest {
                    tenant: tenant.into(),
                }))
                .await
                .unwrap_err();
            assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
        }
    }
}
