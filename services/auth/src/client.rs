//! Client side of per-call signing: a tower layer that adds the `x-cube-*` metadata to every
//! outgoing request, signed for that request's method path. Wrap a tonic `Channel` with it and
//! hand the result to any generated client.

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{SystemTime, UNIX_EPOCH};

use http::HeaderValue;

use crate::{CallSignature, Secret, headers};

/// Who signs.
#[derive(Debug, Clone)]
pub struct CallSigner {
    tenant: Arc<str>,
    key_id: Arc<str>,
    secret: Arc<Secret>,
}

impl CallSigner {
    pub fn new(tenant: &str, key_id: &str, secret: Secret) -> CallSigner {
        CallSigner {
            tenant: tenant.into(),
            key_id: key_id.into(),
            secret: Arc::new(secret),
        }
    }

    /// Add signed metadata for `method_path` to `headers_map`.
    pub fn sign_headers(&self, method_path: &str, headers_map: &mut http::HeaderMap) {
        let ts = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        let call = CallSignature::sign(&self.secret, method_path, &self.tenant, &self.key_id, ts);
        let mut put = |name: &'static str, value: &str| {
            // Tenant names and key ids are ASCII by construction; a bad one is simply not sent
            // and the server answers UNAUTHENTICATED.
            if let Ok(v) = HeaderValue::from_str(value) {
                headers_map.insert(name, v);
            }
        };
        put(headers::TENANT, &call.tenant);
        put(headers::KEY, &call.key_id);
        put(headers::TS, &call.ts_ms.to_string());
        put(headers::NONCE, &call.nonce);
        put(headers::SIG, &call.sig);
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
