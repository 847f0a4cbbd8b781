//! Client side of per-call signing: a tower layer that adds the `x-cube-*` metadata to every
//! outgoing request, signed for that request's method path. Wrap a tonic `Channel` with it and
//! hand the result to any generated client.

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{SystemTime, UNIX_EPOCH};

use http::HeaderValue;

use crate::{PreparedKey, Secret, headers};

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
            headers_map.insert(headers::TENANT, t.clone());
            headers_map.insert(headers::KEY, k.clone());
        }
        headers_map.insert(headers::TS, HeaderValue::from(ts));
        if let Ok(v) = HeaderValue::from_bytes(nonce.as_bytes()) {
            headers_map.insert(headers::NONCE, v);
        }
        if let Ok(v) = HeaderValue::from_bytes(&sig) {
            headers_map.insert(headers::SIG, v);
        }
    }
}

/// A tower service that signs each request, then passes it on.
#[derive(Debug, Clone)]
pub struct Signing<S> {
    inner: S,
    signer: CallSigner,
}

impl<S> Signing<S> {
    pub fn new(inner: S, signer: CallSigner) -> Signing<S> {
        Signing { inner, signer }
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

    fn call(&mut self, mut req: http::Request<B>) -> Self::Future {
        let path = req.uri().path().to_owned();
        self.signer.sign_headers(&path, req.headers_mut());
        self.inner.call(req)
    }
}
