//! `cube.v1.Access`: change the capabilities of a key of the caller's own tenant. Needs ADMIN.
//! A change applies from the next call of that key, on both auth models (the auth layer looks the
//! key up on every call).

use std::sync::Arc;

use cube_api::v1::{self, access_server::Access};
use cube_store::{Capability, Catalog, Command, TenantDirectory};
use tonic::{Request, Response, Status};

use crate::ApiError;
use crate::principal::Principal;

pub(crate) struct AccessService {
    pub catalog: Arc<Catalog>,
    pub directory: Arc<TenantDirectory>,
}

fn capabilities(raw: &[i32]) -> Result<Vec<Capability>, ApiError> {
    if raw.is_empty() {
        return Err(ApiError::Invalid(
            "capabilities must name at least one capability".into(),
        ));
    }
    raw.iter()
        .map(|c| match v1::Capability::try_from(*c) {
            Ok(v1::Capability::Read) => Ok(Capability::Read),
            Ok(v1::Capability::Write) => Ok(Capability::Write),
            Ok(v1::Capability::Admin) => Ok(Capability::Admin),
            _ => Err(ApiError::Invalid(format!(
                "{c} is not a capability (use CAPABILITY_READ, _WRITE or _ADMIN)"
            ))),
        })
        .collect()
}

fn to_proto(caps: Vec<Capability>) -> Vec<i32> {
    caps.into_iter()
        .map(|c| match c {
            Capability::Read => v1::Capability::Read as i32,
            Capability::Write => v1::Capability::Write as i32,
            Capability::Admin => v1::Capability::Admin as i32,
        })
        .collect()
}

impl AccessService {
    /// Record the change in the tenant's audit trail (durably), then make it. If the server dies
    /// in between, the trail shows a change that did not happen: over-reporting, never hiding.
    async fn change(
        &self,
        principal: &Principal,
        key_id: &str,
        grant: &[Capability],
        revoke: &[Capability],
    ) -> Result<Vec<i32>, ApiError> {
        if key_id.is_empty() {
            return Err(ApiError::Invalid("key_id is required".into()));
        }
        // Only keys of the caller's own tenant: another tenant's key id is simply not found.
        if self
            .catalog
            .key(principal.tenant(), key_id)
            .filter(|k| !k.revoked)
            .is_none()
        {
            return Err(ApiError::Store(cube_store::StoreError::NotFound(format!(
                "tenant '{}' has no active key '{key_id}'",
                principal.tenant()
            ))));
        }
        let (op, caps) = if grant.is_empty() {
            ("revoke", revoke)
        } else {
            ("grant", grant)
        };
        let event = Command::Event {
            op: op.into(),
            detail: format!("key={key_id} capabilities={caps:?}"),
        };
        self.directory
            .call(principal.tenant(), event, &principal.name())
            .await?;
        // The catalog change ends in an fsync: off the async workers.
        let (catalog, tenant, key) = (
            self.catalog.clone(),
            principal.tenant().to_string(),
            key_id.to_string(),
        );
        let (grant, revoke) = (grant.to_vec(), revoke.to_vec());
        let caps =
            super::blocking(move || catalog.change_capabilities(&tenant, &key, &grant, &revoke))
                .await?;
        Ok(to_proto(caps))
    }
}

#[tonic::async_trait]
impl Access for AccessService {
    async fn grant(
        &self,
        req: Request<v1::GrantRequest>,
    ) -> Result<Response<v1::GrantResponse>, Status> {
        let principal = Principal::require(&req, Capability::Admin)?;
        let r = req.into_inner();
        let caps = self
            .change(&principal, &r.key_id, &capabilities(&r.capabilities)?, &[])
            .await?;
        Ok(Response::new(v1::GrantResponse { capabilities: caps }))
    }

    async fn revoke(
        &self,
        req: Request<v1::RevokeRequest>,
    ) -> Result<Response<v1::RevokeResponse>, Status> {
        let principal = Principal::require(&req, Capability::Admin)?;
        let r = req.into_inner();
        let caps = self
            .change(&principal, &r.key_id, &[], &capabilities(&r.capabilities)?)
            .await?;
        Ok(Response::new(v1::RevokeResponse { capabilities: caps }))
    }
}
