//! Who a call runs as. Set by the auth layer in the request's extensions; handlers take the
//! tenant only from here, never from a request body.

use std::sync::Arc;

use cube_store::{Capability, KeyInfo};
use tonic::Request;

use crate::ApiError;

/// How a call was authenticated (a metrics label later, and a log field now).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthModel {
    /// Per-call HMAC signature.
    Call,
    /// Per-connection handshake.
    Connection,
}

impl AuthModel {
    /// The `auth` metric label.
    pub fn label(self) -> &'static str {
        match self {
            AuthModel::Call => "call",
            AuthModel::Connection => "connection",
        }
    }
}

/// The authenticated caller.
#[derive(Debug, Clone)]
pub struct Principal {
    pub key: Arc<KeyInfo>,
    pub model: AuthModel,
}

impl Principal {
    pub fn tenant(&self) -> &str {
        &self.key.tenant
    }

    /// `tenant/key_id`, as audit entries and the handshake name it.
    pub fn name(&self) -> String {
        format!("{}/{}", self.key.tenant, self.key.key_id)
    }

    /// The caller of `req`, if it holds `cap`.
    pub fn require<T>(req: &Request<T>, cap: Capability) -> Result<Principal, ApiError> {
        let principal = req
            .extensions()
            .get::<Principal>()
            .cloned()
            // The auth layer puts a principal on every call it lets through to a service that
            // needs one: without it, the server is wired wrong, not the client.
            .ok_or(ApiError::Internal(
                "this call reached its service without its authentication (a server bug)",
            ))?;
        if !principal.key.has(cap) {
            return Err(ApiError::PermissionDenied(format!(
                "key '{}' lacks the {cap} capability for this call",
                principal.key.key_id
            )));
        }
        Ok(principal)
    }
}
