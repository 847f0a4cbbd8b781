//! `cube.v1.Auth`: the per-connection handshake.
//!
//! Challenge stores a fresh 32-byte nonce in this connection's session (valid 30 s, replacing any
//! earlier one); Hello consumes it, whatever the outcome, and on success binds the connection to
//! the key. A challenge lives only in the session of the connection that asked for it, so a Hello
//! on another connection finds none.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cube_api::v1::{self, auth_server::Auth};
use cube_auth::{Secret, server_mac, verify_hello_mac};
use cube_store::{Catalog, KeyInfo};
use tonic::{Request, Response, Status};

use crate::auth_layer::{Authenticator, active_key, now_ms};
use crate::connection::{ConnInfo, PendingChallenge};

/// How long a challenge may be answered.
pub(crate) const CHALLENGE_TTL: Duration = Duration::from_secs(30);
/// Longest tenant name or key id accepted in the handshake.
const MAX_NAME_BYTES: usize = 128;
/// Shortest client nonce accepted.
const MIN_CLIENT_NONCE: usize = 16;
/// Longest client nonce accepted (it is hex-encoded into two MACs).
const MAX_CLIENT_NONCE: usize = 256;

pub(crate) struct HandshakeService {
    pub auth: Arc<Authenticator>,
}

impl HandshakeService {
    fn check_mode(&self) -> Result<(), Status> {
        if self.auth.mode().allows_connection() {
            Ok(())
        } else {
            Err(Status::failed_precondition(
                "per-connection authentication is disabled on this server (--auth-mode call); sign every call instead",
            ))
        }
    }
}

fn connection<T>(req: &Request<T>) -> Result<ConnInfo, Status> {
    req.extensions().get::<ConnInfo>().cloned().ok_or_else(|| {
        tracing::error!("request without connection info");
        Status::internal("internal error")
    })
}

/// Check a Hello against the challenge it answers, at time `now`. Pure, for unit tests.
pub(crate) fn check_hello(
    pending: Option<PendingChallenge>,
    hello: &v1::HelloRequest,
    now: Instant,
    catalog: &Catalog,
) -> Result<Arc<KeyInfo>, Status> {
    let pending = pending.ok_or_else(|| {
        Status::unauthenticated("no challenge is pending on this connection: call Auth.Challenge on the same connection first")
    })?;
    if now > pending.expires_at {
        return Err(Status::unauthenticated(
            "the challenge expired (challenges are valid for 30 s); ask for a new one",
        ));
    }
    if pending.tenant != hello.tenant || pending.key_id != hello.key_id {
        return Err(Status::unauthenticated(
            "Hello names a different tenant or key than the challenge it answers",
        ));
    }
    if hello.nonce.as_slice() != pending.nonce.as_slice() {
        return Err(Status::unauthenticated(
            "nonce is not this connection's pending challenge",
        ));
    }
    if hello.client_nonce.len() < MIN_CLIENT_NONCE {
        return Err(Status::invalid_argument(
            "client_nonce must be at least 16 random bytes",
        ));
    }
    if hello.client_nonce.len() > MAX_CLIENT_NONCE {
        return Err(Status::invalid_argument(
            "client_nonce must be at most 256 bytes (16 or 32 random bytes are enough)",
        ));
    }
    let key = active_key(catalog, &hello.tenant, &hello.key_id)?;
    let secret = Secret::from_bytes(key.secret);
    if !verify_hello_mac(
        &secret,
        &hello.tenant,
        &hello.key_id,
        &hello.nonce,
        &hello.client_nonce,
        &hello.mac,
    ) {
        return Err(Status::unauthenticated(
            "mac does not match: check the secret and the CUBE1-HELLO canonical string",
        ));
    }
    Ok(key)
}

#[tonic::async_trait]
impl Auth for HandshakeService {
    async fn challenge(
        &self,
        req: Request<v1::ChallengeRequest>,
    ) -> Result<Response<v1::ChallengeResponse>, Status> {
        self.check_mode()?;
        let conn = connection(&req)?;
        let r = req.into_inner();
        if r.tenant.is_empty() || r.key_id.is_empty() {
            return Err(Status::invalid_argument("tenant and key_id are required"));
        }
        if r.tenant.len() > MAX_NAME_BYTES || r.key_id.len() > MAX_NAME_BYTES {
            return Err(Status::invalid_argument(
                "tenant and key_id are at most 128 bytes",
            ));
        }
        // A challenge is issued even for an unknown key, so Challenge cannot be used to probe
        // which keys exist; the Hello fails instead.
        let nonce: [u8; 32] = rand::random();
        conn.session.set_challenge(PendingChallenge {
            tenant: r.tenant,
            key_id: r.key_id,
            nonce,
            expires_at: Instant::now() + CHALLENGE_TTL,
        });
        let expires_at_ms = now_ms() + CHALLENGE_TTL.as_millis() as i64;
        Ok(Response::new(v1::ChallengeResponse {
            nonce: nonce.to_vec(),
            expires_at_ms,
        }))
    }

    async fn hello(
        &self,
        req: Request<v1::HelloRequest>,
    ) -> Result<Response<v1::HelloResponse>, Status> {
        self.check_mode()?;
        let conn = connection(&req)?;
        let hello = req.into_inner();
        // Consumed whatever the outcome, a throttled Hello included.
        let pending = conn.session.take_challenge();
        self.auth.check_throttle(Some(&conn))?;
        let checked = check_hello(pending, &hello, Instant::now(), self.auth.catalog());
        let key = checked.inspect_err(|status| {
            cube_metrics::AUTH_HANDSHAKES
                .with_label_values(&["refused"])
                .inc();
            // A failed authentication (as for a signed call: UNAUTHENTICATED), not a malformed
            // Hello (INVALID_ARGUMENT: a client_nonce of the wrong size): that
            // says nothing against the credentials.
            if status.code() == tonic::Code::Unauthenticated {
                self.auth.record_failure(Some(&conn));
                self.auth.record_failed_auth(
                    &hello.tenant,
                    "connection",
                    status.message(),
                    Some(&conn),
                );
            }
        })?;
        // A tenant whose recovery failed at start may hold key changes only in its log (a
        // revocation): no session for it until it opens, as for a signed call.
        self.auth.require_recovered(&key.tenant)?;
        let mac = server_mac(
            &Secret::from_bytes(key.secret),
            &hello.nonce,
            &hello.client_nonce,
        );
        let principal = format!("{}/{}", key.tenant, key.key_id);
        let (tenant, key_id) = (key.tenant.clone(), key.key_id.clone());
        conn.session.authenticate(key);
        // A revocation that ran between the check above and this binding published the revoked
        // key before ending sessions, so it is seen here: end this one too rather than answer OK.
        // Refused as it would have been a moment earlier: counted against the peer and
        // recorded in the tenant's audit trail.
        if let Err(refused) = active_key(self.auth.catalog(), &tenant, &key_id) {
            conn.session.end_if_key(&tenant, &key_id);
            cube_metrics::AUTH_HANDSHAKES
                .with_label_values(&["refused"])
                .inc();
            self.auth.record_failure(Some(&conn));
            self.auth
                .record_failed_auth(&tenant, "connection", refused.message(), Some(&conn));
            return Err(refused);
        }
        cube_metrics::AUTH_HANDSHAKES
            .with_label_values(&["ok"])
            .inc();
        tracing::debug!(conn = conn.id, %principal, "connection authenticated");
        Ok(Response::new(v1::HelloResponse {
            principal,
            server_mac: mac.to_vec(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cube_auth::hello_mac;

    fn setup() -> (tempfile::TempDir, Catalog, Arc<KeyInfo>) {
        let dir = tempfile::tempdir().unwrap();
        let catalog = Catalog::open(&dir.path().join("c")).unwrap();
        let key = catalog.create_tenant("acme").unwrap();
        (dir, catalog, key)
    }

    fn hello_for(key: &KeyInfo, nonce: [u8; 32]) -> v1::HelloRequest {
        let client_nonce = vec![7u8; 16];
        let mac = hello_mac(
            &Secret::from_bytes(key.secret),
            &key.tenant,
            &key.key_id,
            &nonce,
            &client_nonce,
        );
        v1::HelloRequest {
            tenant: key.tenant.clone(),
            key_id: key.key_id.clone(),
            nonce: nonce.to_vec(),
            client_nonce,
            mac: mac.to_vec(),
        }
    }

    fn pending(key: &KeyInfo, nonce: [u8; 32], expires_at: Instant) -> Option<PendingChallenge> {
        Some(PendingChallenge {
            tenant: key.tenant.clone(),
            key_id: key.key_id.clone(),
            nonce,
            expires_at,
        })
    }

    #[test]
    fn a_correct_hello_within_30_s_is_accepted_and_an_expired_one_is_not() {
        let (_d, catalog, key) = setup();
        let t0 = Instant::now();
        let hello = hello_for(&key, [3; 32]);
        let ok = check_hello(
            pending(&key, [3; 32], t0 + CHALLENGE_TTL),
            &hello,
            t0 + Duration::from_secs(29),
            &catalog,
        );
        assert_eq!(ok.unwrap().key_id, key.key_id);
        let late = check_hello(
            pending(&key, [3; 32], t0 + CHALLENGE_TTL),
            &hello,
            t0 + Duration::from_secs(31),
            &catalog,
        );
        assert!(late.unwrap_err().message().contains("expired"));
    }

    #[test]
    fn wrong_nonce_mac_key_or_missing_challenge_is_refused() {
        let (_d, catalog, key) = setup();
        let later = Instant::now() + CHALLENGE_TTL;
        let now = Instant::now();
        let hello = hello_for(&key, [3; 32]);
        let err = check_hello(None, &hello, now, &catalog).unwrap_err();
        assert!(err.message().contains("no challenge is pending"));
        let err = check_hello(pending(&key, [4; 32], later), &hello, now, &catalog).unwrap_err();
        assert!(err.message().contains("nonce"));
        let mut bad_mac = hello.clone();
        bad_mac.mac[0] ^= 1;
        let err = check_hello(pending(&key, [3; 32], later), &bad_mac, now, &catalog).unwrap_err();
        assert!(err.message().contains("mac does not match"));
        let mut short = hello.clone();
        short.client_nonce.truncate(8);
        let err = check_hello(pending(&key, [3; 32], later), &short, now, &catalog).unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        let mut long = hello.clone();
        long.client_nonce = vec![9u8; 257];
        let err = check_hello(pending(&key, [3; 32], later), &long, now, &catalog).unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert!(
            err.message().contains("at most 256 bytes"),
            "{}",
            err.message()
        );
        catalog.revoke_key("acme", &key.key_id).unwrap();
        let err = check_hello(pending(&key, [3; 32], later), &hello, now, &catalog).unwrap_err();
        assert!(err.message().contains("unknown or revoked"));
    }
}
