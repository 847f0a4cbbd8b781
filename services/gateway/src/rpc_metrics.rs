//! Per-RPC metrics, recorded in the auth layer (one tower layer, not in handlers): started,
//! handled by code and auth model, and handling time to the response headers.
//!
//! Label values come only from fixed tables: a client sending random paths cannot grow the
//! metrics' cardinality (unknown paths are counted as `unknown`).

use std::time::Instant;

use cube_metrics::{GRPC_HANDLED, GRPC_HANDLING, GRPC_STARTED};

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

/// The labels of one call.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RpcLabels {
    service: &'static str,
    method: &'static str,
    grpc_type: &'static str,
}

impl RpcLabels {
    pub(crate) fn of(path: &str) -> RpcLabels {
        let known = path
            .strip_prefix('/')
            .and_then(|p| p.split_once('/'))
            .and_then(|(svc, m)| METHODS.iter().find(|(s, mm, _)| *s == svc && *mm == m));
        match known {
            Some((service, method, grpc_type)) => RpcLabels {
                service,
                method,
                grpc_type,
            },
            None => RpcLabels {
                service: "unknown",
                method: "unknown",
                grpc_type: "unknown",
            },
        }
    }

    pub(crate) fn started(&self) {
        GRPC_STARTED
            .with_label_values(&[self.grpc_type, self.service, self.method])
            .inc();
    }

    /// Record a finished call with its grpc-status number and auth model.
    pub(crate) fn handled(&self, status: i32, auth: &'static str, since: Instant) {
        let code = code_name(status);
        let labels = [self.grpc_type, self.service, self.method, code, auth];
        GRPC_HANDLED.with_label_values(&labels).inc();
        GRPC_HANDLING
            .with_label_values(&labels)
            .observe(since.elapsed().as_secs_f64());
    }
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
    const REASONS: &[(&str, &str)] = &[
        ("missing credentials", "missing"),
        ("this connection is not authenticated", "missing"),
        ("this server accepts only", "mode"),
        ("must be", "malformed"),
        ("away from the server clock", "clock_skew"),
        ("unknown or revoked key", "unknown_key"),
        ("was revoked", "unknown_key"),
        ("does not match", "bad_signature"),
        ("already used", "replayed"),
        ("replay window", "too_old"),
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
    }
}
