//! Authentication of every call, as a tower layer in front of every service.
//!
//! For `cube.v1` methods (except the `Auth` handshake itself) the layer decides who the caller is
//! before any handler runs and puts the [`Principal`] into the request's extensions:
//! - a call carrying `x-cube-sig` is verified as a per-call signature (auth mode `call`/`both`);
//! - otherwise the connection's session must have completed the handshake (mode
//!   `connection`/`both`); the key is looked up again so a revocation takes effect at once.
//!
//! Health and reflection stay open so tools can discover the server. Per-call checks run
//! cheapest first, and the replay cache is touched only after the signature verified, so garbage
//! cannot fill it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{SystemTime, UNIX_EPOCH};

use cube_auth::{CallSignature, headers, parse_nonce};
use cube_metrics::ClockMarkWait;
use cube_store::{Catalog, Command, KeyInfo, TenantDirectory, clipped};
use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use futures::future::ready;
use http::{HeaderMap, HeaderName};
use tonic::Status;
use tonic::body::Body;

use crate::abuse::{FailureLimiter, FailureLimits, PerSecond};
use crate::connection::ConnInfo;
use crate::principal::{AuthModel, Principal};
use crate::replay::{ReplayCache, ReplayError};
use crate::rpc_metrics::{RpcLabels, failure_reason, status_of};

/// Which authentication models a server accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthMode {
    /// Only the per-connection handshake.
    Connection,
    /// Only per-call signatures; the handshake rpcs answer FAILED_PRECONDITION.
    Call,
    /// Both (the default).
    Both,
}

impl AuthMode {
    pub fn allows_call(self) -> bool {
        self != AuthMode::Connection
    }

    pub fn allows_connection(self) -> bool {
        self != AuthMode::Call
    }
}

/// Decides who each call is.
#[derive(Debug)]
pub struct Authenticator {
    catalog: Arc<Catalog>,
    replay: ReplayCache,
    /// Per tenant, the `auth.failed` entry budget (a burst of 10, then one every 6 s) and the
    /// entries dropped since the last one recorded.
    failed_entries: Arc<Mutex<HashMap<String, EntryBudget>>>,
    /// `auth.failed` entries recorded this second for tenants that were not open, over all
    /// tenants: each opens its tenant (replaying its log), which a flood from many addresses
    /// must not be able to do to every tenant.
    waking_entries: Mutex<PerSecond>,
    skew_ms: i64,
    mode: AuthMode,
    failures: FailureLimiter,
    /// Where failed authentications naming an existing tenant are recorded (its audit trail).
    directory: Option<Arc<TenantDirectory>>,
    /// Record per-RPC and auth metrics (off only to measure what they cost).
    pub(crate) metrics: bool,
    /// The TLS listener takes client certificates (mTLS), a third way to authenticate a
    /// connection, which a refusal for missing credentials then names.
    pub(crate) client_certificates: bool,
}

pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

// Parsed once: looking a header up by `&str` re-parses the name on every call.
/// Longest failure reason kept in an `auth.failed` audit entry.
const MAX_REASON_CHARS: usize = 200;

/// `auth.failed` entries recorded per tenant: a burst of up to this many...
const FAILED_ENTRIES_BURST: u32 = 10;
/// ...then one per this many milliseconds (600 an hour). Failures from many addresses (each
/// within the per-address throttle) would otherwise fill the tenant's log and mailbox, and push
/// its real entries out of `--audit-retention` (at 10 a second, a day's flood was 864,000
/// entries); the next entry recorded says how many were dropped (`dropped=N`).
const FAILED_ENTRY_EVERY_MS: i64 = 6_000;
/// Most `auth.failed` entries recorded per second for tenants that were not open, over all
/// tenants together (the rest are counted in the next entry's `dropped=`).
const WAKING_ENTRIES_PER_SEC: u32 = 2;

/// One tenant's `auth.failed` budget.
#[derive(Debug, Default)]
struct EntryBudget {
    recorded: EntryBucket,
    /// Entries dropped since the last one recorded.
    dropped: u64,
    /// When an entry last opened the tenant (took from the waking budget): its open may still
    /// be under way, and the entries right after it open nothing more.
    woken_ms: Option<i64>,
}

/// A token bucket of [`FAILED_ENTRIES_BURST`] entries, refilled one per
/// [`FAILED_ENTRY_EVERY_MS`].
#[derive(Debug, Default)]
struct EntryBucket {
    /// Entries taken beyond the refills, as of `at_ms` (0: a full bucket).
    used: u32,
    at_ms: i64,
}

impl EntryBucket {
    /// Take one entry at `now_ms`; false when the bucket is empty (nothing is taken then).
    fn take(&mut self, now_ms: i64) -> bool {
        let refills = (now_ms - self.at_ms).max(0) / FAILED_ENTRY_EVERY_MS;
        if refills > 0 {
            self.used = self
                .used
                .saturating_sub(u32::try_from(refills).unwrap_or(u32::MAX));
            self.at_ms += refills * FAILED_ENTRY_EVERY_MS;
        }
        if self.used == 0 {
            // Nothing to refill: the next refill is counted from this entry.
            self.at_ms = now_ms;
        }
        if self.used >= FAILED_ENTRIES_BURST {
            return false;
        }
        self.used += 1;
        true
    }
}

static H_TENANT: HeaderName = HeaderName::from_static(headers::TENANT);
static H_KEY: HeaderName = HeaderName::from_static(headers::KEY);
static H_TS: HeaderName = HeaderName::from_static(headers::TS);
static H_NONCE: HeaderName = HeaderName::from_static(headers::NONCE);
static H_SIG: HeaderName = HeaderName::from_static(headers::SIG);

fn unauthenticated(msg: impl Into<String>) -> Status {
    Status::unauthenticated(msg)
}

/// `tenant`'s key `key_id` if it exists and is not revoked; otherwise the refusal that a signed
/// call and a Hello both answer with.
pub(crate) fn active_key(
    catalog: &Catalog,
    tenant: &str,
    key_id: &str,
) -> Result<Arc<KeyInfo>, Status> {
    catalog
        .key(tenant, key_id)
        .filter(|k| !k.revoked)
        .ok_or_else(|| {
            unauthenticated(format!(
                "unknown or revoked key '{}' for tenant '{}'",
                clipped(key_id),
                clipped(tenant)
            ))
        })
}

/// The refusal of a throttled peer with `left` of its cool-down to run: the seconds rounded up,
/// so that a client waiting as long as it says is not refused again.
fn throttled(left: Duration) -> Status {
    Status::resource_exhausted(format!(
        "too many failed authentications from this address; retry in {} s",
        left.as_nanos().div_ceil(1_000_000_000).max(1)
    ))
}

/// Whether `path` needs a per-call signature.
fn needs_signature(path: &str) -> bool {
    path.starts_with("/cube.v1.") && !path.starts_with("/cube.v1.Auth/")
}

impl Authenticator {
    pub fn new(
        catalog: Arc<Catalog>,
        mode: AuthMode,
        skew_ms: i64,
        replay: ReplayCache,
        failure_limits: FailureLimits,
        directory: Option<Arc<TenantDirectory>>,
    ) -> Authenticator {
        Authenticator {
            catalog,
            replay,
            failed_entries: Arc::default(),
            waking_entries: Mutex::default(),
            skew_ms,
            mode,
            failures: FailureLimiter::new(failure_limits),
            directory,
            metrics: true,
            client_certificates: false,
        }
    }

    /// Refuse a call to a tenant whose recovery at start failed and that has not opened since
    /// (`TenantDirectory::awaiting_recovery`): the catalog may still lack key changes only its
    /// log holds (a revoked key would authenticate). Each refusal retries the open in the
    /// background.
    pub(crate) fn require_recovered(&self, tenant: &str) -> Result<(), Status> {
        let Some(directory) = &self.directory else {
            return Ok(());
        };
        let Some(why) = directory.awaiting_recovery(tenant) else {
            return Ok(());
        };
        let (directory, name) = (Arc::clone(directory), tenant.to_string());
        tokio::spawn(async move {
            let _ = directory.get(&name).await;
        });
        // The open's own error (a corrupt log, an unopenable store), as its first call got it.
        Err(crate::error::ApiError::from(why).into())
    }

    /// The first signed-call timestamp the replay cache accepts.
    pub(crate) fn replay_ready_ms(&self) -> i64 {
        self.replay.ready_ms()
    }

    pub(crate) fn replay(&self) -> &ReplayCache {
        &self.replay
    }

    /// Record a failed authentication in the audit trail of the tenant it named, if that tenant
    /// exists. Fire and forget: the caller's refusal does not wait for the fsync. Floods are
    /// bounded by the per-peer throttle, which refuses before this point.
    pub(crate) fn record_failed_auth(
        &self,
        tenant: &str,
        model: &str,
        reason: &str,
        conn: Option<&ConnInfo>,
    ) {
        let Some(directory) = &self.directory else {
            return;
        };
        if !self.catalog.has_tenant(tenant) {
            return;
        }
        let (now, asleep) = (now_ms(), !directory.is_open(tenant));
        // Only existing tenants get here, so the map holds at most one entry per tenant.
        let dropped = {
            let mut budgets = self
                .failed_entries
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            let budget = budgets.entry(tenant.to_string()).or_default();
            let awake = !asleep || budget.woken_ms.is_some_and(|t| now - t < 10_000);
            let recorded = budget.recorded.take(now)
                && (awake || {
                    let wakes = self
                        .waking_entries
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .take(now, WAKING_ENTRIES_PER_SEC);
                    if wakes {
                        budget.woken_ms = Some(now);
                    }
                    wakes
                });
            if !recorded {
                budget.dropped += 1;
                return;
            }
            std::mem::take(&mut budget.dropped)
        };
        let peer = conn
            .and_then(|c| c.remote)
            .map_or_else(|| "unknown".to_string(), |a| a.ip().to_string());
        // The reason may quote what the peer sent (a key id): cap what an unauthenticated peer
        // can make the tenant's log store.
        let reason: String = reason.chars().take(MAX_REASON_CHARS).collect();
        let dropped_text = if dropped > 0 {
            format!(" dropped={dropped}")
        } else {
            String::new()
        };
        let event = Command::Event {
            op: "auth.failed".into(),
            detail: format!("model={model} peer={peer}{dropped_text} reason={reason}"),
        };
        let (directory, tenant) = (Arc::clone(directory), tenant.to_string());
        let budgets = Arc::clone(&self.failed_entries);
        tokio::spawn(async move {
            if directory
                .call(&tenant, event, "unauthenticated")
                .await
                .is_err()
            {
                // Not recorded (the tenant busy, out of space, unavailable): this entry and
                // those it counted go to the next one's `dropped=`, so the trail still says
                // how many failures it lacks.
                let mut budgets = budgets.lock().unwrap_or_else(|p| p.into_inner());
                budgets.entry(tenant).or_default().dropped += dropped + 1;
            }
        });
    }

    pub(crate) fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    /// RESOURCE_EXHAUSTED while the peer of `conn` is throttled for failed authentications.
    pub(crate) fn check_throttle(&self, conn: Option<&ConnInfo>) -> Result<(), Status> {
        let Some(ip) = conn.and_then(|c| c.remote).map(|a| a.ip()) else {
            return Ok(());
        };
        self.failures
            .check(ip, std::time::Instant::now())
            .map_err(throttled)
    }

    /// Count a failed authentication against the peer of `conn`.
    pub(crate) fn record_failure(&self, conn: Option<&ConnInfo>) {
        if let Some(ip) = conn.and_then(|c| c.remote).map(|a| a.ip()) {
            self.failures.record_failure(ip, std::time::Instant::now());
        }
    }

    pub fn mode(&self) -> AuthMode {
        self.mode
    }

    /// `Ok(None)` for paths that need no authentication. Throttled peers are refused first,
    /// except on a connection already authenticated (its calls compute no signature, and a
    /// neighbour behind the same address must not cut off its clients' sessions); every
    /// UNAUTHENTICATED refusal counts against the peer (not the replay cache's
    /// RESOURCE_EXHAUSTED or UNAVAILABLE: a full room for future-stamped calls, or a floors file
    /// that cannot be written, is no failed authentication).
    pub fn authenticate(
        &self,
        path: &str,
        md: &HeaderMap,
        conn: Option<&ConnInfo>,
    ) -> Result<Option<Principal>, Status> {
        if !needs_signature(path) {
            return Ok(None);
        }
        // The key this connection authenticated as, read once per call (a lock and a
        // reference count): a signed call is judged by its signature, and in `call` mode no
        // connection is authenticated, whether by handshake or certificate.
        let signed = md.contains_key(&H_SIG);
        let session_key = conn
            .filter(|_| !signed && self.mode.allows_connection())
            .and_then(|c| c.session.key());
        // Not a session whose key was revoked: its calls fail, and each failure is counted
        // and may be recorded in the key's tenant's trail, which the throttle bounds.
        let on_session = session_key.is_some() && !conn.is_some_and(|c| c.session.revoked());
        if !on_session {
            self.check_throttle(conn)?;
        }
        let result = self.identify(path, md, conn, signed, session_key);
        if let Some(status) = result
            .as_ref()
            .err()
            .filter(|s| s.code() == tonic::Code::Unauthenticated)
        {
            // A correctly signed call that is merely too old says nothing against the
            // credentials: a client that signed calls while the server restarted must not get
            // its whole address throttled. It is still recorded in the audit trail.
            if status.message() != TOO_OLD {
                self.record_failure(conn);
            }
            // A call on a connection whose key was revoked is recorded where the revoked key
            // was found (`identify`).
            if status.message() != SESSION_KEY_REVOKED
                && let Some(tenant) = md.get(&H_TENANT).and_then(|v| v.to_str().ok())
            {
                self.record_failed_auth(tenant, "call", status.message(), conn);
            }
        }
        result.map(Some)
    }

    /// `signed`: the call carries `x-cube-sig`; `session_key`: the key `conn` authenticated
    /// as, if the call is unsigned and the mode allows per-connection authentication.
    fn identify(
        &self,
        path: &str,
        md: &HeaderMap,
        conn: Option<&ConnInfo>,
        signed: bool,
        session_key: Option<Arc<KeyInfo>>,
    ) -> Result<Principal, Status> {
        if signed {
            if !self.mode.allows_call() {
                return Err(unauthenticated(
                    "this server accepts only per-connection authentication (--auth-mode connection): \
                     run Auth.Challenge and Auth.Hello on this connection instead of signing calls",
                ));
            }
            let principal = self.verify_call(path, md)?;
            if let Some(c) = conn {
                c.session.saw_signed_call();
            }
            return Ok(principal);
        }
        if let Some(session_key) = session_key {
            // Looked up again on every call: a revocation or a capability change applies at once.
            let key = self
                .catalog
                .key(&session_key.tenant, &session_key.key_id)
                .filter(|k| !k.revoked && !conn.is_some_and(|c| c.session.revoked()))
                .ok_or_else(|| {
                    // A revocation whose sessions were not ended (its tenant's log took it, but
                    // the answer that ends them was lost) ends this one now: its next calls
                    // are throttled as any unauthenticated call is ([`Self::authenticate`]).
                    if let Some(c) = conn {
                        c.session
                            .end_if_key(&session_key.tenant, &session_key.key_id);
                    }
                    // In the revoked key's tenant's trail, whatever tenant an (unsigned) header
                    // names; that key's, not the session's as it is now: a Hello finishing on
                    // this connection meanwhile may have bound another key.
                    self.record_failed_auth(
                        &session_key.tenant,
                        "connection",
                        SESSION_KEY_REVOKED,
                        conn,
                    );
                    unauthenticated(SESSION_KEY_REVOKED)
                })?;
            return Ok(Principal {
                key,
                model: AuthModel::Connection,
            });
        }
        // A certificate that authenticates nothing is named as such, not as no credentials.
        if let Some((tenant, key_id)) = conn
            .filter(|_| self.mode.allows_connection())
            .and_then(|c| c.session.refused_certificate())
        {
            return Err(unauthenticated(format!(
                "this connection's client certificate is of an unknown or revoked key '{}' of \
                 tenant '{}', so it authenticates nothing: connect with a certificate of a \
                 current key (`cubed key cert`), or {} (see docs/protocol.md)",
                clipped(key_id),
                clipped(tenant),
                match self.mode {
                    AuthMode::Connection => "run Auth.Challenge and Auth.Hello on it",
                    _ => "sign every call, or run Auth.Challenge and Auth.Hello on it",
                }
            )));
        }
        let certificate = if self.client_certificates {
            ", or connect with a client certificate (`cubed key cert`)"
        } else {
            ""
        };
        Err(unauthenticated(match self.mode {
            AuthMode::Both => format!(
                "missing credentials: sign every call with x-cube-tenant, x-cube-key, x-cube-ts, \
                 x-cube-nonce and x-cube-sig, or authenticate the connection with Auth.Challenge \
                 and Auth.Hello{certificate} (see docs/protocol.md)"
            ),
            AuthMode::Call => {
                "missing credentials: sign every call with x-cube-tenant, x-cube-key, \
                               x-cube-ts, x-cube-nonce and x-cube-sig (see docs/protocol.md)"
                    .to_string()
            }
            AuthMode::Connection => format!(
                "this connection is not authenticated: run Auth.Challenge and Auth.Hello on it \
                 first{certificate} (see docs/protocol.md)"
            ),
        }))
    }

    fn verify_call(&self, path: &str, md: &HeaderMap) -> Result<Principal, Status> {
        // A value that is not visible ASCII counts as missing (docs/protocol.md, check 2).
        let get = |name: &HeaderName| md.get(name).and_then(|v| v.to_str().ok());
        let (Some(tenant), Some(key_id), Some(ts), Some(nonce), Some(sig)) = (
            get(&H_TENANT),
            get(&H_KEY),
            get(&H_TS),
            get(&H_NONCE),
            get(&H_SIG),
        ) else {
            return Err(unauthenticated(
                "missing credentials: sign every call with x-cube-tenant, x-cube-key, x-cube-ts, \
                 x-cube-nonce and x-cube-sig (see docs/protocol.md)",
            ));
        };
        let ts_ms = parse_canonical_ts(ts).ok_or_else(|| {
            unauthenticated("x-cube-ts must be unix time in milliseconds, in plain decimal")
        })?;
        let nonce_value = parse_nonce(nonce.as_bytes())
            .ok_or_else(|| unauthenticated("x-cube-nonce must be 32 lowercase hex characters"))?;
        let now = now_ms();
        // `abs_diff`: a timestamp near i64::MIN must not overflow the subtraction.
        let off = now.abs_diff(ts_ms);
        if off > self.skew_ms.unsigned_abs() {
            return Err(unauthenticated(format!(
                "x-cube-ts is {} s away from the server clock; at most {} s is allowed (check the client's clock)",
                // Rounded up: 300.1 s away must not read as "300 s away; at most 300".
                off.div_ceil(1000),
                self.skew_ms / 1000
            )));
        }
        let key = active_key(&self.catalog, tenant, key_id)?;
        if !CallSignature::verify_prepared(
            key.prepared_key(),
            path,
            tenant,
            key_id,
            ts,
            nonce,
            sig.as_bytes(),
        ) {
            return Err(unauthenticated(
                "x-cube-sig does not match: check the secret and that the signed method path is this call's",
            ));
        }
        match self
            .replay
            .check_and_insert((tenant, key_id), nonce_value, ts_ms, now)
        {
            Ok(()) => Ok(Principal {
                key,
                model: AuthModel::Call,
            }),
            Err(ReplayError::Replayed) => Err(unauthenticated(
                "x-cube-nonce was already used: every call needs a fresh nonce",
            )),
            Err(ReplayError::TooOld) => Err(unauthenticated(TOO_OLD)),
            Err(ReplayError::TooFarAhead) => Err(Status::resource_exhausted(
                "x-cube-ts is more than a second ahead of the server clock, and the server holds as many such calls as it can: sync the client's clock (NTP) and sign again with the current time",
            )),
            Err(ReplayError::Unrecorded) => Err(Status::unavailable(
                "x-cube-ts is more than a second ahead of the server clock, and the server could not record it (see the server log): sync the client's clock (NTP), or retry",
            )),
            Err(ReplayError::Unmarked) => {
                let mut status = Status::unavailable(MARK_NOT_RENEWED);
                status.set_source(Arc::new(LateMark));
                Err(status)
            }
        }
    }
}

/// What marks the refusal of a call stamped past the replay clock mark (the `source` of its
/// status), so that the auth layer tells it apart from every other refusal by type, not text.
#[derive(Debug)]
struct LateMark;

impl std::fmt::Display for LateMark {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("stamped past the replay clock mark")
    }
}

impl std::error::Error for LateMark {}

/// The refusal of a correctly signed call stamped past the replay clock mark, once it has
/// waited [`MARK_WAIT`] for a renewal in vain.
const MARK_NOT_RENEWED: &str =
    "the server cannot record its replay clock mark right now (see the server log); retry shortly";

/// How long a correctly signed call stamped past the replay clock mark waits for the mark's
/// renewal (a slow fdatasync of its file) before it is refused with UNAVAILABLE: a disk that
/// stalls for a second or two delays signed calls instead of failing them.
pub(crate) const MARK_WAIT: Duration = Duration::from_secs(3);

/// What a call waiting for the clock mark leaves of its deadline for its refusal to arrive.
const MARK_MARGIN: Duration = Duration::from_millis(50);

/// The refusal of a correctly signed call stamped before the replay window (check 8).
const TOO_OLD: &str = "x-cube-ts is older than the server's replay window (the server restarted or is under heavy load); sign again with the current time";

/// The refusal of a call on a connection whose key was revoked after it authenticated.
pub(crate) const SESSION_KEY_REVOKED: &str =
    "the key this connection authenticated with was revoked; authenticate again";

/// `x-cube-ts` as a number, if it is a timestamp in canonical decimal (no sign but a
/// leading `-`, no leading zeros, within `i64`): the signature covers the text as sent, and
/// requiring this form keeps the server's rebuilt string identical to the client's.
fn parse_canonical_ts(text: &str) -> Option<i64> {
    let digits = text.strip_prefix('-').unwrap_or(text);
    let canonical = !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit())
        && (digits == "0" || !digits.starts_with('0'))
        && text != "-0";
    if !canonical {
        return None;
    }
    text.parse().ok()
}

/// A call whose answer has not come back yet; dropped unanswered, it is counted as handled with
/// CANCELLED (or DEADLINE_EXCEEDED, once the client's `grpc-timeout` has run out: tonic drops
/// the call then), so `grpc_server_started_total` and `grpc_server_handled_total` stay paired.
struct Unanswered {
    labels: RpcLabels,
    auth: &'static str,
    started: Instant,
    /// The client's `grpc-timeout`, if it sent one.
    deadline: Option<Duration>,
}

impl Unanswered {
    /// The answer came back with `status`: counted with it instead.
    fn answered(self, status: i32) {
        let this = std::mem::ManuallyDrop::new(self);
        this.labels.handled(status, this.auth, this.started);
    }

    /// The call goes on, under a guard of its own: not counted here.
    fn passed_on(self) {
        let _ = std::mem::ManuallyDrop::new(self);
    }
}

impl Drop for Unanswered {
    fn drop(&mut self) {
        // tonic's timer for the client's deadline starts after this layer's clock (it calls
        // the service first), so its expiry is seen at `d` or later. A client gives up at its
        // own deadline, which it counted from the send: its reset arrives a little before `d`
        // by this clock, and is the deadline all the same. A drop within a twentieth of the
        // deadline (1 ms at least) is counted as its expiry.
        let expired = self
            .deadline
            .is_some_and(|d| self.started.elapsed() + (d / 20).max(Duration::from_millis(1)) >= d);
        let code = if expired {
            tonic::Code::DeadlineExceeded
        } else {
            tonic::Code::Cancelled
        };
        self.labels.handled(code as i32, self.auth, self.started);
    }
}

/// A streaming call's answer, counted when its trailers (its status) pass, or as the stream's
/// error; dropped before either, its [`Unanswered`] counts it CANCELLED. (Until 2026-12-06 a
/// stream was counted at its response headers, as `OK` whatever its trailers said: a Region
/// page cut off with ABORTED, or an Audit page answering DATA_LOSS, counted as a success.)
struct Finishing {
    body: Body,
    unanswered: Option<Unanswered>,
}

impl http_body::Body for Finishing {
    type Data = bytes::Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<bytes::Bytes>, Status>>> {
        let frame = std::task::ready!(Pin::new(&mut self.body).poll_frame(cx));
        let status = match &frame {
            Some(Ok(f)) => f.trailers_ref().map(status_of),
            Some(Err(e)) => Some(e.code() as i32),
            // The end without trailers: no status was sent.
            None => Some(tonic::Code::Unknown as i32),
        };
        if let Some(status) = status
            && let Some(u) = self.unanswered.take()
        {
            u.answered(status);
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// Tower layer running [`Authenticator`] before the wrapped service, and holding each call to
/// the server's deadline.
#[derive(Debug, Clone)]
pub struct AuthLayer {
    auth: Arc<Authenticator>,
    call_timeout: Option<Duration>,
}

impl AuthLayer {
    /// `call_timeout`: how long a call may take until its answer (its response headers) at most;
    /// `None`: no limit but the client's own `grpc-timeout`.
    pub fn new(auth: Arc<Authenticator>, call_timeout: Option<Duration>) -> AuthLayer {
        AuthLayer { auth, call_timeout }
    }
}

impl<S> tower::Layer<S> for AuthLayer {
    type Service = Authenticated<S>;

    fn layer(&self, inner: S) -> Authenticated<S> {
        Authenticated {
            inner,
            auth: Arc::clone(&self.auth),
            call_timeout: self.call_timeout,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Authenticated<S> {
    inner: S,
    auth: Arc<Authenticator>,
    call_timeout: Option<Duration>,
}

/// The deadline a client sent in `grpc-timeout` (1 to 8 digits and a unit: H, M, S, m, u, n),
/// if it sent a valid one.
fn client_timeout(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get("grpc-timeout")?.as_bytes();
    let (&unit, digits) = value.split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    Some(match unit {
        b'H' => Duration::from_secs(n * 3600),
        b'M' => Duration::from_secs(n * 60),
        b'S' => Duration::from_secs(n),
        b'm' => Duration::from_millis(n),
        b'u' => Duration::from_micros(n),
        b'n' => Duration::from_nanos(n),
        _ => return None,
    })
}

/// The answer to a call that reached the server's `--call-timeout-ms`.
fn deadline_exceeded(limit: Duration) -> http::Response<Body> {
    Status::deadline_exceeded(format!(
        "the call took longer than this server's limit of {} ms (--call-timeout-ms); \
         a change it carried may or may not have been applied: read it back before retrying",
        limit.as_millis()
    ))
    .into_http()
}

impl<S, B> tower::Service<http::Request<B>> for Authenticated<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<Body>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = Answer<S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let started = Instant::now();
        let labels = RpcLabels::of(req.uri().path());
        if self.auth.metrics {
            labels.started();
        }
        let decision = self.auth.authenticate(
            req.uri().path(),
            req.headers(),
            req.extensions().get::<ConnInfo>(),
        );
        if is_late_mark(&decision) {
            return self.after_the_mark(req, labels, started);
        }
        self.decided(req, decision, labels, started, started)
    }
}

/// Whether a call was refused only because the replay clock mark's renewal is late.
fn is_late_mark(decision: &Result<Option<Principal>, Status>) -> bool {
    matches!(decision, Err(s) if std::error::Error::source(s).is_some_and(|e| e.is::<LateMark>()))
}

/// Counts a wait for the replay clock mark in `cube_auth_clock_mark_waits_total` by how it
/// ended ([`ClockMarkWait`]): covered or refused when it ends, cancelled if dropped while
/// waiting.
struct MarkWait(bool);

impl MarkWait {
    fn ended(mut self, covered: bool) {
        self.0 = true;
        let outcome = if covered {
            ClockMarkWait::Covered
        } else {
            ClockMarkWait::Refused
        };
        outcome.counter().inc();
    }
}

impl Drop for MarkWait {
    fn drop(&mut self) {
        if !self.0 {
            ClockMarkWait::Cancelled.counter().inc();
        }
    }
}

impl<S> Authenticated<S> {
    /// A correctly signed call stamped past the replay clock mark, whose renewal is late (a slow
    /// fdatasync): checked again after each renewal until one covers it, for [`MARK_WAIT`] at
    /// most, and never past the server's `--call-timeout-ms` or the client's deadline (less
    /// [`MARK_MARGIN`]), so that its refusal, if it comes to that, still arrives as the
    /// UNAVAILABLE that means "not applied". Its nonce was not recorded by the refused check.
    /// Runs on the service that was made ready for this call; a clone stays for the next.
    fn after_the_mark<B>(
        &mut self,
        req: http::Request<B>,
        labels: RpcLabels,
        started: Instant,
    ) -> Answer<S::Error>
    where
        S: tower::Service<http::Request<B>, Response = http::Response<Body>>
            + Clone
            + Send
            + 'static,
        S::Future: Send + 'static,
        S::Error: Send + 'static,
        B: Send + 'static,
    {
        let patience = [self.call_timeout, client_timeout(req.headers())]
            .into_iter()
            .flatten()
            .map(|limit| limit.saturating_sub(MARK_MARGIN))
            .fold(MARK_WAIT, Duration::min);
        // (A renewal between the refused check and this look is waited for once more: at most
        // one renewal period, off the hot path.)
        let mut seen = self.auth.replay().clock_covered();
        let inner = {
            let ready_for_next = self.inner.clone();
            std::mem::replace(&mut self.inner, ready_for_next)
        };
        let mut retry = Authenticated {
            inner,
            auth: Arc::clone(&self.auth),
            call_timeout: self.call_timeout,
        };
        // Counted as CANCELLED if dropped while it waits (a client's deadline, a reset).
        let waiting = self.auth.metrics.then(|| Unanswered {
            labels,
            auth: "none",
            started,
            deadline: client_timeout(req.headers()),
        });
        let counted = MarkWait(false);
        Box::pin(async move {
            let until = tokio::time::Instant::now() + patience;
            let (decision, decided_at) = loop {
                let left = until.saturating_duration_since(tokio::time::Instant::now());
                retry.auth.replay().renewal_after(seen, left).await;
                // Read before the check: a renewal after it wakes the next wait at once.
                seen = retry.auth.replay().clock_covered();
                let at = Instant::now();
                let decision = retry.auth.authenticate(
                    req.uri().path(),
                    req.headers(),
                    req.extensions().get::<ConnInfo>(),
                );
                // Settled (the server is stopping): no renewal will come, so the wait is over
                // (it returns at once from then on: looping would spin until `until`).
                if !is_late_mark(&decision)
                    || tokio::time::Instant::now() >= until
                    || retry.auth.replay().clock_settled()
                {
                    break (decision, at);
                }
            };
            counted.ended(!is_late_mark(&decision));
            if let Some(w) = waiting {
                w.passed_on();
            }
            retry
                .decided(req, decision, labels, started, decided_at)
                .await
        })
    }
}

/// The answer to a call, as [`Authenticated`] serves it.
type Answer<E> = Pin<Box<dyn Future<Output = Result<http::Response<Body>, E>> + Send>>;

impl<S> Authenticated<S> {
    /// Serve or refuse a call once its authentication is decided (by a check that began at
    /// `decided_at`: the call may have waited before it, see [`Authenticated::after_the_mark`]).
    fn decided<B>(
        &mut self,
        mut req: http::Request<B>,
        decision: Result<Option<Principal>, Status>,
        labels: RpcLabels,
        started: Instant,
        decided_at: Instant,
    ) -> Answer<S::Error>
    where
        S: tower::Service<http::Request<B>, Response = http::Response<Body>>,
        S::Future: Send + 'static,
        S::Error: Send + 'static,
    {
        let metrics = self.auth.metrics;
        let auth = match &decision {
            Ok(Some(p)) => p.model.label(),
            _ => "none",
        };
        if metrics && needs_signature(req.uri().path()) {
            crate::rpc_metrics::auth_seconds(auth, decision.is_ok())
                .observe(decided_at.elapsed().as_secs_f64());
        }
        match decision {
            Ok(principal) => {
                if let Some(p) = principal {
                    // A tenant whose recovery failed at start is refused after authentication:
                    // counted under the caller's model, never as a failed authentication.
                    if let Err(status) = self.auth.require_recovered(p.tenant()) {
                        if metrics {
                            labels.handled(status.code() as i32, auth, started);
                        }
                        return Box::pin(ready(Ok(status.into_http())));
                    }
                    req.extensions_mut().insert(p);
                }
                // tonic holds the call to the client's own deadline; ours only when it is
                // shorter (or the client sent none), so a call needs one timer at most.
                let theirs = client_timeout(req.headers());
                let limit = self
                    .call_timeout
                    .filter(|ours| theirs.is_none_or(|theirs| theirs > *ours));
                let fut = self.inner.call(req);
                // Counted as CANCELLED if the call's future is dropped before the answer, even
                // unpolled (a client that reset the stream), or as DEADLINE_EXCEEDED when its
                // `grpc-timeout` expired (tonic's timeout, outside this layer, drops the call
                // and answers CANCELLED "Timeout expired").
                let mut unanswered = metrics.then(|| Unanswered {
                    labels,
                    auth,
                    started,
                    deadline: theirs,
                });
                Box::pin(async move {
                    let resp = match limit {
                        None => fut.await?,
                        Some(limit) => {
                            // Counted from the call's arrival: less what it waited for the
                            // replay clock mark (nothing, for every other call).
                            let left = limit.saturating_sub(decided_at.duration_since(started));
                            match tokio::time::timeout(left, fut).await {
                                Ok(resp) => resp?,
                                Err(_) => deadline_exceeded(limit),
                            }
                        }
                    };
                    if let Some(u) = unanswered.take() {
                        if u.labels.streams() && !resp.headers().contains_key("grpc-status") {
                            // A stream's status comes in its trailers, after its messages:
                            // counted (and timed) when they pass, CANCELLED if its body is
                            // dropped first.
                            return Ok(resp.map(|body| {
                                Body::new(Finishing {
                                    body,
                                    unanswered: Some(u),
                                })
                            }));
                        }
                        u.answered(status_of(resp.headers()));
                    }
                    Ok(resp)
                })
            }
            Err(status) => {
                tracing::debug!(
                    path = req.uri().path(),
                    reason = status.message(),
                    "call refused"
                );
                if metrics {
                    cube_metrics::AUTH_FAILURES
                        .with_label_values(&[failure_reason(status.message())])
                        .inc();
                    labels.handled(status.code() as i32, "none", started);
                }
                Box::pin(ready(Ok(status.into_http())))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cube_metrics::ClockMarkWait::{Cancelled, Covered, Refused};
    use std::convert::Infallible;
    use tower::{Layer, Service};

    #[test]
    fn only_canonical_decimal_timestamps_are_accepted() {
        for (text, value) in [
            ("1700000000000", 1_700_000_000_000),
            ("0", 0),
            ("-5", -5),
            ("-9223372036854775808", i64::MIN),
            ("9223372036854775807", i64::MAX),
        ] {
            assert_eq!(parse_canonical_ts(text), Some(value));
        }
        for text in [
            "",
            "-",
            "-0",
            "00",
            "017",
            "+17",
            " 17",
            "17 ",
            "1.7",
            "1e3",
            "0x11",
            "9223372036854775808",
            "-9223372036854775809",
            "１７",
        ] {
            assert_eq!(parse_canonical_ts(text), None, "{text:?}");
        }
    }

    type Reply = Result<http::Response<Body>, Infallible>;

    /// A service whose answer never comes (a call still running when its deadline expires).
    fn never() -> tower::util::ServiceFn<fn(http::Request<()>) -> std::future::Pending<Reply>> {
        tower::service_fn(|_| std::future::pending())
    }

    #[tokio::test]
    async fn a_call_dropped_before_its_answer_is_counted_as_cancelled() {
        let (_dir, auth) = authenticator();
        let mut svc = AuthLayer::new(auth, None).layer(never());
        let cancelled = || {
            cube_metrics::GRPC_HANDLED
                .with_label_values(&[
                    "server_stream",
                    "grpc.health.v1.Health",
                    "Watch",
                    "Canceled",
                    "none",
                ])
                .get()
        };
        let before = cancelled();
        let req = http::Request::builder()
            .uri("/grpc.health.v1.Health/Watch")
            .body(())
            .unwrap();
        let mut call = svc.call(req);
        // Started (the guard exists), then given up, as tonic's timeout or a reset would.
        assert!(futures::poll!(&mut call).is_pending());
        drop(call);
        assert_eq!(cancelled(), before + 1);
    }

    /// A call dropped once its client's `grpc-timeout` has run out (tonic's timer, outside the
    /// layer, drops it) is counted as DEADLINE_EXCEEDED, not as a client's cancel.
    #[tokio::test]
    async fn a_call_dropped_at_its_deadline_is_counted_as_deadline_exceeded() {
        let (_dir, auth) = authenticator();
        let mut svc = AuthLayer::new(auth, None).layer(never());
        let count = |code: &str| {
            cube_metrics::GRPC_HANDLED
                .with_label_values(&["unary", "grpc.health.v1.Health", "Check", code, "none"])
                .get()
        };
        let before = (count("DeadlineExceeded"), count("Canceled"));
        let req = http::Request::builder()
            .uri("/grpc.health.v1.Health/Check")
            .header("grpc-timeout", "20m")
            .body(())
            .unwrap();
        let mut call = svc.call(req);
        assert!(futures::poll!(&mut call).is_pending());
        tokio::time::sleep(Duration::from_millis(30)).await;
        drop(call);
        assert_eq!(
            (count("DeadlineExceeded"), count("Canceled")),
            (before.0 + 1, before.1)
        );
    }

    /// A streaming call is counted with the status of its trailers, when they pass (it was
    /// counted OK at its headers), and as CANCELLED if its body is dropped before them.
    #[tokio::test]
    async fn a_stream_is_counted_with_the_status_in_its_trailers() {
        use http_body_util::BodyExt;
        // One message, then `end`: trailers with that grpc-status, an error ("error"), or
        // nothing ("none").
        let stream_with = |end: &'static str| {
            tower::service_fn(move |_: http::Request<()>| {
                let mut frames = vec![Ok::<_, Status>(http_body::Frame::data(
                    bytes::Bytes::from_static(b"m"),
                ))];
                match end {
                    "error" => frames.push(Err(Status::unavailable("gone"))),
                    "none" => {}
                    status => {
                        let mut trailers = HeaderMap::new();
                        trailers.insert("grpc-status", status.parse().unwrap());
                        frames.push(Ok(http_body::Frame::trailers(trailers)));
                    }
                }
                let body = Body::new(http_body_util::StreamBody::new(futures::stream::iter(
                    frames,
                )));
                std::future::ready(Ok::<_, Infallible>(http::Response::new(body)))
            })
        };
        let count = |code: &str| {
            cube_metrics::GRPC_HANDLED
                .with_label_values(&[
                    "bidi_stream",
                    "grpc.reflection.v1alpha.ServerReflection",
                    "ServerReflectionInfo",
                    code,
                    "none",
                ])
                .get()
        };
        // A method no other test here counts (the counters are the process's).
        let watch = || {
            http::Request::builder()
                .uri("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo")
                .body(())
                .unwrap()
        };
        let (_dir, auth) = authenticator();
        let before = (count("OK"), count("Aborted"), count("Canceled"));
        let mut svc = AuthLayer::new(Arc::clone(&auth), None).layer(stream_with("10"));
        let resp = svc.call(watch()).await.unwrap();
        // Not counted at the headers.
        assert_eq!((count("OK"), count("Aborted")), (before.0, before.1));
        let trailers = resp
            .into_body()
            .collect()
            .await
            .unwrap()
            .trailers()
            .cloned();
        assert_eq!(trailers.unwrap()["grpc-status"], "10");
        assert_eq!(
            (count("OK"), count("Aborted"), count("Canceled")),
            (before.0, before.1 + 1, before.2)
        );
        // Dropped unread: given up by its client.
        let mut svc = AuthLayer::new(Arc::clone(&auth), None).layer(stream_with("0"));
        drop(svc.call(watch()).await.unwrap());
        assert_eq!(
            (count("OK"), count("Aborted"), count("Canceled")),
            (before.0, before.1 + 1, before.2 + 1)
        );
        // An error in the stream is counted with its code; an end without trailers (no status
        // sent) as Unknown.
        let before = (count("Unavailable"), count("Unknown"));
        for end in ["error", "none"] {
            let mut svc = AuthLayer::new(Arc::clone(&auth), None).layer(stream_with(end));
            let _ = svc.call(watch()).await.unwrap().into_body().collect().await;
        }
        assert_eq!(
            (count("Unavailable"), count("Unknown")),
            (before.0 + 1, before.1 + 1)
        );
    }

    /// A service that answers every call at once (OK).
    fn answers() -> tower::util::ServiceFn<fn(http::Request<()>) -> std::future::Ready<Reply>> {
        tower::service_fn(|_| std::future::ready(Ok(Status::ok("").into_http())))
    }

    /// An authenticator whose replay clock mark was last renewed 10 s ago (it covers calls
    /// stamped up to 8 s ago, so a call signed now is past it), with a signer for tenant `t`.
    fn behind_the_clock_mark() -> (
        tempfile::TempDir,
        Arc<Authenticator>,
        cube_auth::client::CallSigner,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let catalog = Arc::new(Catalog::open(&dir.path().join("catalog")).unwrap());
        let key = catalog.create_tenant("t").unwrap();
        let start = now_ms() - 10_000;
        let floors = dir.path().join("replay-floors");
        let replay = ReplayCache::with_floors(1000, 300_000, start, floors).unwrap();
        let auth = Authenticator::new(
            catalog,
            AuthMode::Both,
            300_000,
            replay,
            FailureLimits::default(),
            None,
        );
        let signer = cube_auth::client::CallSigner::new(
            "t",
            &key.key_id,
            cube_auth::Secret::from_bytes(key.secret),
        );
        (dir, Arc::new(auth), signer)
    }

    /// Held by the tests that wait for the clock mark, whose counts are process-wide.
    static MARK_WAIT_TESTS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

    /// A correctly signed call stamped past the replay clock mark (its renewal is late: a slow
    /// fdatasync) waits for the renewal and is then served; refused with UNAVAILABLE only when
    /// none comes within [`MARK_WAIT`].
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_signed_call_past_a_late_clock_mark_waits_for_its_renewal() {
        let (_dir, auth, signer) = behind_the_clock_mark();
        let mut svc = AuthLayer::new(Arc::clone(&auth), None).layer(answers());
        let path = "/cube.v1.Cells/Read";
        let signed = || {
            let mut req = http::Request::builder().uri(path).body(()).unwrap();
            signer.sign_headers(path, req.headers_mut(), true);
            req
        };
        let code = |resp: &http::Response<Body>| {
            Status::from_header_map(resp.headers()).map_or(tonic::Code::Ok, |s| s.code())
        };
        let _counts = MARK_WAIT_TESTS.lock().await;
        let waits = |outcome: ClockMarkWait| outcome.counter().get();
        let (refused, covered) = (waits(Refused), waits(Covered));
        // No renewal comes: refused once the wait is over.
        let began = Instant::now();
        let resp = svc.call(signed()).await.unwrap();
        let status = Status::from_header_map(resp.headers()).unwrap();
        assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
        assert_eq!(status.message(), MARK_NOT_RENEWED);
        assert!(began.elapsed() >= MARK_WAIT, "{:?}", began.elapsed());
        assert!(waits(Refused) > refused, "the refused wait was not counted");
        // Renewals come while the call waits: a stalled one that still does not cover it (its
        // time taken before the stall), then one that does: served.
        let call = tokio::spawn(svc.call(signed()));
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!call.is_finished(), "the call did not wait for the mark");
        auth.replay().renew_clock(now_ms() - 5_000).unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(
            !call.is_finished(),
            "a renewal that does not cover the call ended its wait"
        );
        auth.replay().renew_clock(now_ms()).unwrap();
        let resp = tokio::time::timeout(Duration::from_secs(2), call)
            .await
            .expect("the renewal did not wake the call")
            .unwrap()
            .unwrap();
        assert_eq!(code(&resp), tonic::Code::Ok);
        assert_eq!(
            waits(Covered),
            covered + 1,
            "the covered wait was not counted"
        );
        assert_eq!(waits(Refused), refused + 1);
        // With the mark current, no wait at all.
        let resp = svc.call(signed()).await.unwrap();
        assert_eq!(code(&resp), tonic::Code::Ok);
    }

    /// A call waiting for the clock mark keeps to the client's deadline (refused UNAVAILABLE,
    /// "not applied", before it runs out) and, dropped while it waits, is counted as handled
    /// (CANCELLED), so started and handled calls stay paired; the server's own limit counts
    /// the wait too.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_call_waiting_for_the_clock_mark_keeps_to_its_deadline_and_is_counted_if_dropped() {
        let _counts = MARK_WAIT_TESTS.lock().await;
        let (_dir, auth, signer) = behind_the_clock_mark();
        let mut svc = AuthLayer::new(Arc::clone(&auth), None).layer(answers());
        let path = "/cube.v1.Cells/Delete";
        let signed = |timeout: Option<&str>| {
            let mut req = http::Request::builder().uri(path);
            if let Some(t) = timeout {
                req = req.header("grpc-timeout", t);
            }
            let mut req = req.body(()).unwrap();
            signer.sign_headers(path, req.headers_mut(), true);
            req
        };
        // A 2-s deadline, under MARK_WAIT's 3 s: the wait ends 50 ms before it.
        let began = Instant::now();
        let resp = svc.call(signed(Some("2S"))).await.unwrap();
        let took = began.elapsed();
        let status = Status::from_header_map(resp.headers()).unwrap();
        assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
        assert!(
            took >= Duration::from_millis(1900) && took < Duration::from_millis(2900),
            "{took:?} for a 2-s deadline"
        );
        let count = |metric: &prometheus::IntCounterVec, code: &[&str]| {
            metric
                .with_label_values(&[&["unary", "cube.v1.Cells", "Delete"][..], code].concat())
                .get()
        };
        let started = || count(&cube_metrics::GRPC_STARTED, &[]);
        let cancelled = || count(&cube_metrics::GRPC_HANDLED, &["Canceled", "none"]);
        let (started_before, cancelled_before) = (started(), cancelled());
        let waits_cancelled = Cancelled.counter().get();
        let mut call = svc.call(signed(None));
        assert!(futures::poll!(&mut call).is_pending());
        drop(call);
        assert_eq!(started(), started_before + 1);
        assert_eq!(cancelled(), cancelled_before + 1);
        assert_eq!(Cancelled.counter().get(), waits_cancelled + 1);
        // Dropped before it was first polled: counted too.
        drop(svc.call(signed(None)));
        assert_eq!(Cancelled.counter().get(), waits_cancelled + 2);
        // The server's --call-timeout-ms counts from the call's arrival, the wait included: a
        // call that waited 1.5 s of a 2-s limit has 0.5 s left, not 2 s more.
        let mut limited =
            AuthLayer::new(Arc::clone(&auth), Some(Duration::from_secs(2))).layer(never());
        let began = Instant::now();
        let call = tokio::spawn(limited.call(signed(None)));
        tokio::time::sleep(Duration::from_millis(1500)).await;
        auth.replay().renew_clock(now_ms()).unwrap();
        let resp = call.await.unwrap().unwrap();
        let took = began.elapsed();
        let status = Status::from_header_map(resp.headers()).unwrap();
        assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "{status:?}");
        assert!(
            took < Duration::from_millis(3000),
            "{took:?} for a 2-s server limit"
        );
    }

    /// A call waiting for the clock mark's renewal when the mark is settled (the server
    /// stopping) ends then, refused: no renewal comes any more. (It used to re-check in a
    /// tight loop until its 3-s wait was over, holding a worker thread.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_call_waiting_for_the_clock_mark_ends_when_the_mark_is_settled() {
        let _counts = MARK_WAIT_TESTS.lock().await;
        let (_dir, auth, signer) = behind_the_clock_mark();
        let mut svc = AuthLayer::new(Arc::clone(&auth), None).layer(answers());
        let path = "/cube.v1.Cells/Delete";
        let mut req = http::Request::builder().uri(path).body(()).unwrap();
        signer.sign_headers(path, req.headers_mut(), true);
        let began = Instant::now();
        let call = tokio::spawn(svc.call(req));
        tokio::time::sleep(Duration::from_millis(200)).await;
        auth.replay().settle_clock(now_ms()).unwrap();
        let resp = call.await.unwrap().unwrap();
        let took = began.elapsed();
        let status = Status::from_header_map(resp.headers()).unwrap();
        assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
        assert!(
            took < Duration::from_millis(1500),
            "{took:?}: the wait went on after the mark was settled"
        );
    }

    fn authenticator() -> (tempfile::TempDir, Arc<Authenticator>) {
        let dir = tempfile::tempdir().unwrap();
        let catalog = Arc::new(Catalog::open(&dir.path().join("catalog")).unwrap());
        let auth = Authenticator::new(
            catalog,
            AuthMode::Both,
            300_000,
            ReplayCache::new(1000, 300_000, 0),
            FailureLimits::default(),
            None,
        );
        (dir, Arc::new(auth))
    }

    /// A call still unanswered at `--call-timeout-ms` is answered DEADLINE_EXCEEDED, with a
    /// message a client can act on, and counted with that code; a client's shorter
    /// `grpc-timeout` is left to tonic (no second timer), a longer one does not lift ours.
    #[tokio::test]
    async fn a_call_over_the_server_deadline_is_answered_deadline_exceeded() {
        let (_dir, auth) = authenticator();
        let limit = Duration::from_millis(50);
        let mut svc = AuthLayer::new(auth, Some(limit)).layer(never());
        let handled = || {
            cube_metrics::GRPC_HANDLED
                .with_label_values(&[
                    "server_stream",
                    "grpc.health.v1.Health",
                    "Watch",
                    "DeadlineExceeded",
                    "none",
                ])
                .get()
        };
        let before = handled();
        let watch = |timeout: Option<&str>| {
            let mut req = http::Request::builder().uri("/grpc.health.v1.Health/Watch");
            if let Some(t) = timeout {
                req = req.header("grpc-timeout", t);
            }
            req.body(()).unwrap()
        };
        for timeout in [None, Some("10S"), Some("bogus")] {
            let resp = svc.call(watch(timeout)).await.unwrap();
            let status = Status::from_header_map(resp.headers()).unwrap();
            assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "{timeout:?}");
            assert!(status.message().contains("50 ms"), "{}", status.message());
        }
        assert_eq!(handled(), before + 3);
        // The client's 10 ms deadline is tonic's to enforce: this layer sets no timer for it
        // (ours would have fired long before this).
        let mut call = svc.call(watch(Some("10m")));
        assert!(futures::poll!(&mut call).is_pending());
        tokio::time::sleep(limit * 4).await;
        assert!(futures::poll!(&mut call).is_pending());
    }

    /// The cool-down left is said in whole seconds rounded up: waiting that long is enough.
    #[test]
    fn a_throttled_peer_is_told_to_wait_at_least_the_cool_down_left() {
        for (left_us, said) in [
            (29_900_000, 30),
            (30_000_000, 30),
            (1_000, 1),
            (0, 1),
            (1_001_000, 2),
            (1_000_400, 2),
        ] {
            let status = throttled(Duration::from_micros(left_us));
            assert_eq!(status.code(), tonic::Code::ResourceExhausted);
            assert!(
                status.message().ends_with(&format!("retry in {said} s")),
                "{left_us} µs: {}",
                status.message()
            );
        }
    }

    /// A session whose key the catalog revoked without ending the session (the revocation's
    /// answer lost after its tenant's log took it) is ended by its next call, so the calls
    /// after it are throttled as any unauthenticated call is, not exempt as a session's.
    #[test]
    fn a_session_of_a_key_revoked_behind_its_back_is_ended_and_then_throttled() {
        let (_dir, auth) = authenticator();
        let key = auth.catalog.create_tenant("t").unwrap();
        let registry = Arc::new(crate::connection::ConnectionRegistry::default());
        let conn = registry.open(Some("10.1.2.3:4000".parse().unwrap()));
        conn.session.authenticate(Arc::clone(&key));
        let call = || auth.authenticate("/cube.v1.Cells/Read", &HeaderMap::new(), Some(&conn));
        assert!(call().unwrap().is_some(), "the session authenticates");
        assert!(auth.catalog.revoke_key("t", &key.key_id).unwrap());
        for _ in 0..=FailureLimits::default().max_failures {
            auth.record_failure(Some(&conn));
        }
        let first = call().unwrap_err();
        assert_eq!(first.code(), tonic::Code::Unauthenticated);
        assert_eq!(first.message(), SESSION_KEY_REVOKED);
        assert!(conn.session.revoked(), "the session was ended");
        let next = call().unwrap_err();
        assert_eq!(next.code(), tonic::Code::ResourceExhausted, "{next:?}");
    }

    #[test]
    fn failed_entries_come_in_a_burst_of_10_then_one_per_6_s() {
        let mut b = EntryBucket::default();
        let t0 = 1_000_000;
        assert_eq!((0..30).filter(|i| b.take(t0 + i)).count(), 10);
        assert!(!b.take(t0 + 5_999));
        assert!(b.take(t0 + 6_000));
        assert!(!b.take(t0 + 6_001));
        assert!(!b.take(t0 + 11_999));
        assert!(b.take(t0 + 12_000));
        // An hour of flooding: 600 more at most.
        let hour = (1..=3_600_000)
            .step_by(100)
            .filter(|i| b.take(t0 + 12_000 + i))
            .count();
        assert!((599..=600).contains(&hour), "{hour}");
        // Idle for a minute: the burst is back.
        let later = t0 + 12_000 + 3_600_000 + 60_000;
        assert_eq!((0..30).filter(|i| b.take(later + i)).count(), 10);
    }

    #[test]
    fn grpc_timeout_values_are_parsed_as_the_grpc_spec_writes_them() {
        let parse = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert("grpc-timeout", v.parse().unwrap());
            client_timeout(&h)
        };
        assert_eq!(parse("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(parse("2M"), Some(Duration::from_secs(120)));
        assert_eq!(parse("3S"), Some(Duration::from_secs(3)));
        assert_eq!(parse("99999999m"), Some(Duration::from_millis(99_999_999)));
        assert_eq!(parse("5u"), Some(Duration::from_micros(5)));
        assert_eq!(parse("7n"), Some(Duration::from_nanos(7)));
        for bad in ["", "S", "123456789S", "1x", "-1S", "1.5S"] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
        assert_eq!(client_timeout(&HeaderMap::new()), None);
    }
}
