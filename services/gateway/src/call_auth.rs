//! Per-call authentication as a tower layer in front of every service.
//!
//! For `cube.v1` methods (except the `Auth` handshake itself) the layer verifies the `x-cube-*`
//! metadata before any handler runs and puts the [`Principal`] into the request's extensions.
//! Health and reflection stay open so tools can discover the server. Checks run cheapest first,
//! and the replay cache is touched only after the signature verified, so garbage cannot fill it.

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{SystemTime, UNIX_EPOCH};

use cube_auth::{CallSignature, Secret, headers};
use cube_store::Catalog;
use futures::future::{Either, Ready, ready};
use http::HeaderMap;
use tonic::Status;
use tonic::body::Body;

use crate::principal::{AuthModel, Principal};
use crate::replay::{ReplayCache, ReplayError};

/// Verifies signed calls against the catalog.
#[derive(Debug)]
pub struct CallAuthenticator {
    catalog: Arc<Catalog>,
    replay: ReplayCache,
    skew_ms: i64,
}

pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

fn unauthenticated(msg: impl Into<String>) -> Status {
    Status::unauthenticated(msg)
}

/// Whether `path` needs a per-call signature.
fn needs_signature(path: &str) -> bool {
    path.starts_with("/cube.v1.") && !path.starts_with("/cube.v1.Auth/")
}

impl CallAuthenticator {
    pub fn new(catalog: Arc<Catalog>, skew_ms: i64, replay_capacity: usize) -> CallAuthenticator {
        CallAuthenticator {
            catalog,
            replay: ReplayCache::new(replay_capacity, skew_ms, now_ms()),
            skew_ms,
        }
    }

    /// `Ok(None)` for paths that need no signature.
    pub fn authenticate(&self, path: &str, md: &HeaderMap) -> Result<Option<Principal>, Status> {
        if !needs_signature(path) {
            return Ok(None);
        }
        let get = |name: &str| md.get(name).and_then(|v| v.to_str().ok());
        let (Some(tenant), Some(key_id), Some(ts), Some(nonce), Some(sig)) = (
            get(headers::TENANT),
            get(headers::KEY),
            get(headers::TS),
            get(headers::NONCE),
            get(headers::SIG),
        ) else {
            return Err(unauthenticated(
                "missing credentials: sign every call with x-cube-tenant, x-cube-key, x-cube-ts, \
                 x-cube-nonce and x-cube-sig (see docs/protocol.md)",
            ));
        };
        // The signature covers the decimal text as sent; requiring the canonical form (no sign,
        // no leading zeros) keeps the server's rebuilt string identical to the client's.
        let ts_ms: i64 = ts
            .parse()
            .ok()
            .filter(|v: &i64| v.to_string() == ts)
            .ok_or_else(|| {
                unauthenticated("x-cube-ts must be unix time in milliseconds, in plain decimal")
            })?;
        let nonce_value = parse_nonce(nonce)
            .ok_or_else(|| unauthenticated("x-cube-nonce must be 32 lowercase hex characters"))?;
        let now = now_ms();
        let off = (now - ts_ms).abs();
        if off > self.skew_ms {
            return Err(unauthenticated(format!(
                "x-cube-ts is {} s away from the server clock; at most {} s is allowed (check the client's clock)",
                off / 1000,
                self.skew_ms / 1000
            )));
        }
        let key = self
            .catalog
            .key(tenant, key_id)
            .filter(|k| !k.revoked)
            .ok_or_else(|| {
                unauthenticated(format!(
                    "unknown or revoked key '{key_id}' for tenant '{tenant}'"
                ))
            })?;
        if !CallSignature::verify_parts(
            &Secret::from_bytes(key.secret),
            path,
            tenant,
            key_id,
            ts_ms,
            nonce,
            sig,
        ) {
            return Err(unauthenticated(
                "x-cube-sig does not match: check the secret and that the signed method path is this call's",
            ));
        }
        match self
            .replay
            .check_and_insert((tenant, key_id), nonce_value, ts_ms, now)
        {
            Ok(()) => Ok(Some(Principal {
                key,
                model: AuthModel::Call,
            })),
            Err(ReplayError::Replayed) => Err(unauthenticated(
                "x-cube-nonce was already used: every call needs a fresh nonce",
            )),
            Err(ReplayError::TooOld) => Err(unauthenticated(
                "x-cube-ts is older than the server's replay window (the server restarted or is under heavy load); sign again with the current time",
            )),
        }
    }
}

fn parse_nonce(nonce: &str) -> Option<u128> {
    if nonce.len() != 32
        || !nonce
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return None;
    }
    u128::from_str_radix(nonce, 16).ok()
}

/// Tower layer running [`CallAuthenticator`] before the wrapped service.
#[derive(Debug, Clone)]
pub struct CallAuthLayer {
    auth: Arc<CallAuthenticator>,
}

impl CallAuthLayer {
    pub fn new(auth: Arc<CallAuthenticator>) -> CallAuthLayer {
        CallAuthLayer { auth }
    }
}

impl<S> tower::Layer<S> for CallAuthLayer {
    type Service = CallAuth<S>;

    fn layer(&self, inner: S) -> CallAuth<S> {
        CallAuth {
            inner,
            auth: Arc::clone(&self.auth),
        }
    }
}

#[derive(Debug, Clone)]
pub struct CallAuth<S> {
    inner: S,
    auth: Arc<CallAuthenticator>,
}

impl<S, B> tower::Service<http::Request<B>> for CallAuth<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<Body>>,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = Either<Ready<Result<http::Response<Body>, S::Error>>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<B>) -> Self::Future {
        match self.auth.authenticate(req.uri().path(), req.headers()) {
            Ok(Some(principal)) => {
                req.extensions_mut().insert(principal);
                Either::Right(self.inner.call(req))
            }
            Ok(None) => Either::Right(self.inner.call(req)),
            Err(status) => {
                tracing::debug!(
                    path = req.uri().path(),
                    reason = status.message(),
                    "call refused"
                );
                Either::Left(ready(Ok(status.into_http())))
            }
        }
    }
}
