//! Client side of both auth models:
//! - per call: [`Signing`], a tower layer that adds the `x-cube-*` metadata to every outgoing
//!   request, signed for that request's method path (wrap a tonic `Channel`, hand the result to
//!   any generated client);
//! - per connection: [`handshake`], which runs Auth.Challenge + Auth.Hello on one channel (one
//!   HTTP/2 connection) and checks the server's proof; later calls on it need no credentials.

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{SystemTime, UNIX_EPOCH};

use http::{HeaderName, HeaderValue};

use crate::{PreparedKey, Secret, headers};

// Parsed once, not on every call.
static H_TENANT: HeaderName = HeaderName::from_static(headers::TENANT);
static H_KEY: HeaderName = HeaderName::from_static(headers::KEY);
static H_TS: HeaderName = HeaderName::from_static(headers::TS);
static H_NONCE: HeaderName = HeaderName::from_static(headers::NONCE);
static H_SIG: HeaderName = HeaderName::from_static(headers::SIG);

/// Who signs: the key prepared once, the constant headers encoded once.
#[derive(Debug, Clone)]
pub struct CallSigner {
    tenant: Arc<str>,
    key_id: Arc<str>,
    key: PreparedKey,
    tenant_header: Option<HeaderValue>,
    key_header: Option<HeaderValue>,
}

impl CallSigner {
    pub fn new(tenant: &str, key_id: &str, secret: Secret) -> CallSigner {
        CallSigner {
            tenant: tenant.into(),
            key_id: key_id.into(),
            key: PreparedKey::new(&secret),
            // Tenant names and key ids are ASCII by construction; a bad one is simply not sent
            // and the server answers UNAUTHENTICATED.
            tenant_header: HeaderValue::from_str(tenant).ok(),
            key_header: HeaderValue::from_str(key_id).ok(),
        }
    }

    /// Add signed metadata for `method_path` to `headers_map`.
    pub fn sign_headers(&self, method_path: &str, headers_map: &mut http::HeaderMap) {
        let ts = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        let mut nonce = [0u8; 32];
        // NOTE: 16 random bytes always encode into exactly 32 hex characters.
        let _ = hex::encode_to_slice(rand::random::<[u8; 16]>(), &mut nonce);
        let nonce = std::str::from_utf8(&nonce).unwrap_or_default();
        let mac = self
            .key
            .call_mac(method_path, &self.tenant, &self.key_id, ts, nonce);
        let mut sig = [0u8; 64];
        let _ = hex::encode_to_slice(mac, &mut sig);
        if let (Some(t), Some(k)) = (&self.tenant_header, &self.key_header) {
            headers_map.insert(&H_TENANT, t.clone());
            headers_map.insert(&H_KEY, k.clone());
        }
        // Values unique to each call are marked sensitive: HPACK then sends them as never-indexed
        // literals instead of churning both ends' dynamic tables (measured: docs/benchmarks.md),
        // and a signature is never kept in a compression context.
        let mut put = |name: &'static HeaderName, value: Option<HeaderValue>| {
            if let Some(mut v) = value {
                v.set_sensitive(true);
                headers_map.insert(name, v);
            }
        };
        put(&H_TS, Some(HeaderValue::from(ts)));
        put(&H_NONCE, HeaderValue::from_bytes(nonce.as_bytes()).ok());
        put(&H_SIG, HeaderValue::from_bytes(&sig).ok());
    }
}

/// A tower service that signs each request, then passes it on. Built with
/// [`Signing::passthrough`] it signs nothing (for a connection authenticated by the handshake),
/// so one client type serves both models.
#[derive(Debug, Clone)]
pub struct Signing<S> {
    inner: S,
    signer: Option<CallSigner>,
}

impl<S> Signing<S> {
    pub fn new(inner: S, signer: CallSigner) -> Signing<S> {
        Signing {
            inner,
            signer: Some(signer),
        }
    }

    pub fn passthrough(inner: S) -> Signing<S> {
        Signing {
            inner,
            signer: None,
        }
    }
}

impl<S, B> tower::Service<http::Request<B>> for Signing<S>
where
    S: tower::Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let Some(signer) = &self.signer else {
            return self.inner.call(req);
        };
        // Split so the path can be borrowed while the headers are changed (no copy of it).
        let (mut parts, body) = req.into_parts();
        signer.sign_headers(parts.uri.path(), &mut parts.headers);
        self.inner.call(http::Request::from_parts(parts, body))
    }
}

/// Why a handshake failed.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    #[error("the server refused the handshake: {0}")]
    Refused(#[from] tonic::Status),
    #[error("the server's proof (server_mac) is wrong: it does not know this key")]
    BadServerProof,
    #[error("the credentials' secret is malformed: {0}")]
    Secret(#[from] crate::SecretError),
}

/// Authenticate the connection behind `channel` as `creds`; returns the principal
/// (`tenant/key_id`). The channel must be a single connection (a plain `Endpoint::connect`), and
/// a reconnect loses the session.
pub async fn handshake(
    channel: tonic::transport::Channel,
    creds: &crate::Credentials,
) -> Result<String, HandshakeError> {
    use cube_api::v1::auth_client::AuthClient;
    use cube_api::v1::{ChallengeRequest, HelloRequest};
    let secret = creds.secret()?;
    let mut auth = AuthClient::new(channel);
    let challenge = auth
        .challenge(ChallengeRequest {
            tenant: creds.tenant.clone(),
            key_id: creds.key_id.clone(),
        })
        .await?
        .into_inner();
    let client_nonce: [u8; 16] = rand::random();
    let mac = crate::hello_mac(
        &secret,
        &creds.tenant,
        &creds.key_id,
        &challenge.nonce,
        &client_nonce,
    );
    let hello = auth
        .hello(HelloRequest {
            tenant: creds.tenant.clone(),
            key_id: creds.key_id.clone(),
            nonce: challenge.nonce.clone(),
            client_nonce: client_nonce.to_vec(),
            mac: mac.to_vec(),
        })
        .await?
        .into_inner();
    let expected = crate::server_mac(&secret, &challenge.nonce, &client_nonce);
    if hello.server_mac.as_slice() != expected.as_slice() {
        return Err(HandshakeError::BadServerProof);
    }
    Ok(hello.principal)
}

/// Verify audit entries as `Tenant.Audit` returns them (oldest first); see
/// [`crate::verify_audit_chain`].
pub fn verify_audit_entries(entries: &[cube_api::v1::AuditEntry]) -> Result<usize, (u64, String)> {
    crate::verify_audit_chain(entries.iter().map(|e| crate::AuditLink {
        seq: e.seq,
        ts_ms: e.ts_ms,
        principal: &e.principal,
        op: &e.op,
        detail: &e.detail,
        prev_hash: &e.prev_hash,
        hash: &e.hash,
    }))
}
