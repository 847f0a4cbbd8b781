//! `cube.v1.Access`: change the capabilities of a key of the caller's own tenant. Needs ADMIN.
//! A change applies from the next call of that key, on both auth models (the auth layer looks the
//! key up on every call).

use std::sync::Arc;

use cube_api::v1::{self, access_server::Access};
use cube_store::{Capability, Command, Reply, TenantDirectory};
use tonic::{Request, Response, Status};

use crate::ApiError;
use crate::principal::Principal;

pub(crate) struct AccessService {
    pub directory: Arc<TenantDirectory>,
}

/// The capabilities `raw` names, each once. A repeated one counts once, however often it is
/// repeated (the contract does not bound the list; the message's 16 KiB cap,
/// `ACCESS_MESSAGE_BYTES`, bounds the work), so neither the change nor its audit entry carries a
/// repeat.
fn capabilities(raw: &[i32]) -> Result<Vec<Capability>, ApiError> {
    if raw.is_empty() {
        return Err(ApiError::Invalid(
            "capabilities must name at least one capability".into(),
        ));
    }
    let mut caps = Vec::with_capacity(3);
    for c in raw {
        let cap = match v1::Capability::try_from(*c) {
            Ok(v1::Capability::Read) => Capability::Read,
            Ok(v1::Capability::Write) => Capability::Write,
            Ok(v1::Capability::Admin) => Capability::Admin,
            _ => {
                return Err(ApiError::Invalid(format!(
                    "{c} is not a capability (use CAPABILITY_READ, _WRITE or _ADMIN)"
                )));
            }
        };
        if !caps.contains(&cap) {
            caps.push(cap);
        }
    }
    Ok(caps)
}

pub(crate) fn to_proto(caps: Vec<Capability>) -> Vec<i32> {
    caps.into_iter()
        .map(|c| match c {
            Capability::Read => v1::Capability::Read as i32,
            Capability::Write => v1::Capability::Write as i32,
            Capability::Admin => v1::Capability::Admin as i32,
        })
        .collect()
}

impl AccessService {
    /// One record in the tenant's log holds the key's new capability set and the audit entry
    /// recording the change, so the two are durable together (or not at all). The tenant's
    /// actor computes the set from the key's newest one, so concurrent changes of a key are all
    /// kept, and puts it in force before answering.
    async fn change(
        &self,
        principal: &Principal,
        key_id: &str,
        grant: &[Capability],
        revoke: &[Capability],
    ) -> Result<Vec<i32>, Status> {
        // Its shape here, before the call waits for a (perhaps busy) tenant; the tenant's core
        // checks the rest (unknown, another tenant's, revoked).
        cube_store::check_key_id(key_id).map_err(ApiError::from)?;
        let cmd = Command::ChangeCapabilities {
            key_id: key_id.to_string(),
            grant: grant.to_vec(),
            revoke: revoke.to_vec(),
        };
        let reply = self
            .directory
            .call(principal.tenant(), cmd, &principal.name())
            .await
            .map_err(ApiError::from)?;
        match reply {
            Reply::Capabilities { capabilities, .. } => Ok(to_proto(capabilities)),
            other => Err(super::cells::unexpected(&other)),
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    const READ: i32 = v1::Capability::Read as i32;
    const ADMIN: i32 = v1::Capability::Admin as i32;

    #[test]
    fn capabilities_are_named_once_each_however_often_repeated() {
        assert_eq!(
            capabilities(&[READ, ADMIN, READ]).unwrap(),
            vec![Capability::Read, Capability::Admin]
        );
        // More entries than there are capabilities: repeats, counted once (they were refused).
        assert_eq!(
            capabilities(&[ADMIN, READ, READ, ADMIN, READ]).unwrap(),
            vec![Capability::Admin, Capability::Read]
        );
        assert_eq!(capabilities(&[READ; 5000]).unwrap(), vec![Capability::Read]);
        // An unknown value is refused wherever it is in the list.
        assert!(matches!(
            capabilities(&[READ, READ, READ, 9]),
            Err(ApiError::Invalid(m)) if m.contains("9 is not a capability")
        ));
        assert!(matches!(capabilities(&[]), Err(ApiError::Invalid(_))));
        assert!(matches!(capabilities(&[0]), Err(ApiError::Invalid(_))));
    }
}
