//! Per-RPC metrics, recorded in the auth layer (one tower layer, not in handlers): started,
//! handled by code and auth model, and handling time to the response headers.
//!
//! Label values come only from fixed tables: a client sending random paths cannot grow the
//! metrics' cardinality (unknown paths are counted as `unknown`).

use std::sync::{LazyLock, OnceLock};
use std::time::Instant;

use cube_metrics::{GRPC_HANDLED, GRPC_HANDLING, GRPC_STARTED};
use prometheus::{Histogram, IntCounter};

/// (service, method, grpc_type) of every method this server serves.
const METHODS: &[(&str, &str, &str)] = &[
    ("cube.v1.Cells", "Write", "unary"),
    ("cube.v1.Cells", "Read", "unary"),
    ("cube.v1.Cells", "Delete", "unary"),
    ("cube.v1.Cells", "Region", "server_stream"),
    ("cube.v1.Cells", "Prog", "unary"),
    ("cube.v1.Cells", "Run", "unary"),
    ("cube.v1.Cells", "Link", "unary"),
    ("cube.v1.Cells", "Unlink", "unary"),
    ("cube.v1.Cells", "Walk", "unary"),
    ("cube.v1.Cells", "Seal", "unary"),
    ("cube.v1.Access", "Grant", "unary"),
    ("cube.v1.Access", "Revoke", "unary"),
    ("cube.v1.Tenant", "Stats", "unary"),
    ("cube.v1.Tenant", "Audit", "server_stream"),
    ("cube.v1.Auth", "Challenge", "unary"),
    ("cube.v1.Auth", "Hello", "unary"),
    ("cube.v1.Admin", "CreateTenant", "unary"),
    ("cube.v1.Admin", "CreateKey", "unary"),
    ("cube.v1.Admin", "RevokeKey", "unary"),
    ("cube.v1.Admin", "ListTenants", "unary"),
    ("cube.v1.Admin", "SetDurability", "unary"),
    ("cube.v1.Admin", "RecordCertificate", "unary"),
    ("cube.v1.Admin", "DeleteTenant", "unary"),
    ("grpc.health.v1.Health", "Check", "unary"),
    ("grpc.health.v1.Health", "Watch", "server_stream"),
    (
        "grpc.reflection.v1.ServerReflection",
        "ServerReflectionInfo",
        "bidi_stream",
    ),
    (
        "grpc.reflection.v1alpha.ServerReflection",
        "ServerReflectionInfo",
        "bidi_stream",
    ),
];

/// The labels of one call; `index` is the row in [`METHODS`] (`METHODS.len()` = unknown).
#[derive(Debug, Clone, Copy)]
pub(crate) struct RpcLabels {
    service: &'static str,
    method: &'static str,
    grpc_type: &'static str,
    index: usize,
}

const AUTH_LABELS: [&str; 3] = ["none", "call", "connection"];
const CODES: usize = 17;

/// Resolved metric children, so the per-call path does no label hashing or registry locking:
/// [method][code][auth] for handled/handling, [method] for started.
struct Resolved {
    handled: Vec<OnceLock<(IntCounter, Histogram)>>,
    started: Vec<OnceLock<IntCounter>>,
}

static RESOLVED: LazyLock<Resolved> = LazyLock::new(|| Resolved {
    handled: (0..(METHODS.len() + 1) * CODES * AUTH_LABELS.len())
        .map(|_| OnceLock::new())
        .collect(),
    started: (0..=METHODS.len()).map(|_| OnceLock::new()).collect(),
});

fn auth_index(auth: &str) -> usize {
    AUTH_LABELS.iter().position(|a| *a == auth).unwrap_or(0)
}

impl RpcLabels {
    pub(crate) fn of(path: &str) -> RpcLabels {
        let index = path
            .strip_prefix('/')
            .and_then(|p| p.split_once('/'))
            .and_then(|(svc, m)| METHODS.iter().position(|(s, mm, _)| *s == svc && *mm == m));
        match index {
            Some(index) => {
                let (service, method, grpc_type) = METHODS[index];
                RpcLabels {
                    service,
                    method,
                    grpc_type,
                    index,
                }
            }
            None => RpcLabels {
                service: "unknown",
                method: "unknown",
                grpc_type: "unknown",
                index: METHODS.len(),
            },
        }
    }

    /// Whether the method streams its answer (its status comes in the trailers).
    pub(crate) fn streams(&self) -> bool {
        self.grpc_type != "unary" && self.grpc_type != "unknown"
    }

    pub(crate) fn started(&self) {
        RESOLVED.started[self.index]
            .get_or_init(|| {
                GRPC_STARTED.with_label_values(&[self.grpc_type, self.service, self.method])
            })
            .inc();
    }

    /// Record a finished call with its grpc-status number and auth model.
    pub(crate) fn handled(&self, status: i32, auth: &'static str, since: Instant) {
        let code = usize::try_from(status)
            .ok()
            .filter(|c| *c < CODES)
            .unwrap_or(2);
        let slot = (self.index * CODES + code) * AUTH_LABELS.len() + auth_index(auth);
        let (count, time) = RESOLVED.handled[slot].get_or_init(|| {
            let labels = [
                self.grpc_type,
                self.service,
                self.method,
                code_name(code as i32),
                auth,
            ];
            (
                GRPC_HANDLED.with_label_values(&labels),
                GRPC_HANDLING.with_label_values(&labels),
            )
        });
        count.inc();
        time.observe(since.elapsed().as_secs_f64());
    }
}

/// `cube_auth_seconds{mode, result}`, resolved once per combination.
pub(crate) fn auth_seconds(mode: &'static str, ok: bool) -> &'static Histogram {
    static CELLS: LazyLock<Vec<OnceLock<Histogram>>> = LazyLock::new(|| {
        (0..AUTH_LABELS.len() * 2)
            .map(|_| OnceLock::new())
            .collect()
    });
    let result = if ok { "ok" } else { "refused" };
    CELLS[auth_index(mode) * 2 + usize::from(ok)]
        .get_or_init(|| cube_metrics::AUTH_SECONDS.with_label_values(&[mode, result]))
}

/// grpc-ecosystem code names.
fn code_name(status: i32) -> &'static str {
    const NAMES: [&str; 17] = [
        "OK",
        "Canceled",
        "Unknown",
        "InvalidArgument",
        "DeadlineExceeded",
        "NotFound",
        "AlreadyExists",
        "PermissionDenied",
        "ResourceExhausted",
        "FailedPrecondition",
        "Aborted",
        "OutOfRange",
        "Unimplemented",
        "Internal",
        "Unavailable",
        "DataLoss",
        "Unauthenticated",
    ];
    usize::try_from(status)
        .ok()
        .and_then(|i| NAMES.get(i))
        .copied()
        .unwrap_or("Unknown")
}

/// The grpc-status of a response whose status travels in its headers (errors, "trailers-only");
/// a response without one is a success whose status comes in the trailers.
pub(crate) fn status_of(headers: &http::HeaderMap) -> i32 {
    headers
        .get("grpc-status")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The `reason` label of a refused authentication, from this crate's own messages.
pub(crate) fn failure_reason(message: &str) -> &'static str {
    // First: the one message that quotes the client's own text (its key id and tenant), which
    // must not be able to pick another reason by containing a later needle ("must be", ...).
    const REASONS: &[(&str, &str)] = &[
        ("unknown or revoked key", "unknown_key"),
        ("missing credentials", "missing"),
        ("this connection is not authenticated", "missing"),
        ("this server accepts only", "mode"),
        ("must be", "malformed"),
        ("away from the server clock", "clock_skew"),
        ("was revoked", "unknown_key"),
        ("does not match", "bad_signature"),
        ("already used", "replayed"),
        ("replay window", "too_old"),
        ("more than a second ahead of the server clock", "ahead"),
    ];
    REASONS
        .iter()
        .find(|(needle, _)| message.contains(needle))
        .map_or("other", |(_, r)| r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_known_methods_become_label_values() {
        let l = RpcLabels::of("/cube.v1.Cells/Write");
        assert_eq!(
            (l.service, l.method, l.grpc_type),
            ("cube.v1.Cells", "Write", "unary")
        );
        let l = RpcLabels::of("/cube.v1.Tenant/Audit");
        assert_eq!(l.grpc_type, "server_stream");
        for junk in ["/cube.v1.Cells/Nope", "/x/y", "nothing", "/a"] {
            assert_eq!(RpcLabels::of(junk).service, "unknown", "{junk}");
        }
        assert_eq!(code_name(16), "Unauthenticated");
        assert_eq!(code_name(99), "Unknown");
        assert_eq!(
            failure_reason("x-cube-nonce was already used: every call needs a fresh nonce"),
            "replayed"
        );
        // A key id chosen to contain another reason's needle is still an unknown key.
        assert_eq!(
            failure_reason("unknown or revoked key 'must be already used' for tenant 't'"),
            "unknown_key"
        );
    }
}
