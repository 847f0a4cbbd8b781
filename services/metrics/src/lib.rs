//! cube-metrics: every metric cubed exports, defined once, registered in one [`registry`].
//!
//! Names and labels are the operators' contract (docs/operations.md): the grpc-ecosystem names
//! for RPCs, `cube_*` for Cube's own internals. No label grows with the number of tenants.

use std::sync::LazyLock;

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

/// 10 µs to ~10 s in factor-2 steps: the ecosystem default starts at 5 ms, too coarse for
/// operations that take tens of microseconds.
fn fine_buckets() -> Vec<f64> {
    (0..21).map(|i| 10e-6 * 2f64.powi(i)).collect()
}

/// [`fine_buckets`] and three more, to ~84 s: for calls and tenant opens, which can take longer
/// than 10 s when something is wrong (writes held behind a state store's 30-s stall, a long
/// replay or migration), where the p99 would otherwise sit flat at the last bucket.
fn long_buckets() -> Vec<f64> {
    (0..24).map(|i| 10e-6 * 2f64.powi(i)).collect()
}

/// 250 ns to ~0.26 s in factor-2 steps, for decisions that take about a microsecond (a
/// signature check, a session lookup): [`fine_buckets`] would put nearly all of them below its
/// first bucket.
fn micro_buckets() -> Vec<f64> {
    (0..21).map(|i| 250e-9 * 2f64.powi(i)).collect()
}

fn histogram_vec(name: &str, help: &str, labels: &[&str], buckets: Vec<f64>) -> HistogramVec {
    let h = HistogramVec::new(HistogramOpts::new(name, help).buckets(buckets), labels)
        .unwrap_or_else(|e| panic!("metric {name}: {e}"));
    register(Box::new(h.clone()));
    h
}

fn histogram(name: &str, help: &str, buckets: Vec<f64>) -> Histogram {
    let h = Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets))
        .unwrap_or_else(|e| panic!("metric {name}: {e}"));
    register(Box::new(h.clone()));
    h
}

fn counter_vec(name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), labels)
        .unwrap_or_else(|e| panic!("metric {name}: {e}"));
    register(Box::new(c.clone()));
    c
}

fn counter(name: &str, help: &str) -> IntCounter {
    let c = IntCounter::new(name, help).unwrap_or_else(|e| panic!("metric {name}: {e}"));
    register(Box::new(c.clone()));
    c
}

fn gauge_vec(name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    let g = IntGaugeVec::new(Opts::new(name, help), labels)
        .unwrap_or_else(|e| panic!("metric {name}: {e}"));
    register(Box::new(g.clone()));
    g
}

fn gauge(name: &str, help: &str) -> IntGauge {
    let g = IntGauge::new(name, help).unwrap_or_else(|e| panic!("metric {name}: {e}"));
    register(Box::new(g.clone()));
    g
}

// NOTE: metric definitions are static and unique, so registration cannot fail except by a
// programming error caught by the first test that touches the registry.
fn register(c: Box<dyn prometheus::core::Collector>) {
    if let Err(e) = REGISTRY.register(c) {
        panic!("registering a metric: {e}");
    }
}

static REGISTRY: LazyLock<Registry> = LazyLock::new(Registry::new);

/// RPCs started (grpc-ecosystem).
pub static GRPC_STARTED: LazyLock<IntCounterVec> = LazyLock::new(|| {
    counter_vec(
        "grpc_server_started_total",
        "RPCs started on the server.",
        &["grpc_type", "grpc_service", "grpc_method"],
    )
});
/// RPCs completed, by code and auth model (grpc-ecosystem plus `auth`).
pub static GRPC_HANDLED: LazyLock<IntCounterVec> = LazyLock::new(|| {
    counter_vec(
        "grpc_server_handled_total",
        "RPCs completed on the server, regardless of success or failure.",
        &[
            "grpc_type",
            "grpc_service",
            "grpc_method",
            "grpc_code",
            "auth",
        ],
    )
});
/// RPC latency until the response headers (grpc-ecosystem plus `auth`).
pub static GRPC_HANDLING: LazyLock<HistogramVec> = LazyLock::new(|| {
    histogram_vec(
        "grpc_server_handling_seconds",
        "Time from receiving an RPC to sending its response headers.",
        &[
            "grpc_type",
            "grpc_service",
            "grpc_method",
            "grpc_code",
            "auth",
        ],
        long_buckets(),
    )
});
/// Time spent authenticating a call, by model and result.
pub static AUTH_SECONDS: LazyLock<HistogramVec> = LazyLock::new(|| {
    histogram_vec(
        "cube_auth_seconds",
        "Time to authenticate one call.",
        &["mode", "result"],
        micro_buckets(),
    )
});
/// Handshakes (Auth.Hello), by result.
pub static AUTH_HANDSHAKES: LazyLock<IntCounterVec> = LazyLock::new(|| {
    counter_vec(
        "cube_auth_handshakes_total",
        "Per-connection handshakes (Auth.Hello).",
        &["result"],
    )
});
/// Refused authentications, by reason.
pub static AUTH_FAILURES: LazyLock<IntCounterVec> = LazyLock::new(|| {
    counter_vec(
        "cube_auth_failures_total",
        "Refused authentications, by reason.",
        &["reason"],
    )
});
/// Signed calls that waited for the replay clock mark's renewal, by how the wait ended.
pub static AUTH_CLOCK_MARK_WAITS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    counter_vec(
        "cube_auth_clock_mark_waits_total",
        "Signed calls stamped past the replay clock mark that waited for its renewal, by \
         outcome (covered: a renewal covered the call; refused; cancelled).",
        &["outcome"],
    )
});
/// Open connections by what authenticated them so far (none, call, connection).
pub static CONNECTIONS_OPEN: LazyLock<IntGaugeVec> = LazyLock::new(|| {
    gauge_vec(
        "cube_connections_open",
        "Open gRPC connections by auth model.",
        &["auth"],
    )
});
/// Connections closed at accept because `--max-connections` were open.
pub static CONNECTIONS_REFUSED: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "cube_connections_refused_total",
        "Connections closed at accept because --max-connections were already open.",
    )
});
/// Connections closed at accept because their client address had its share open.
pub static CONNECTIONS_ADDRESS_REFUSED: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "cube_connections_address_refused_total",
        "Connections closed at accept because --max-connections-per-address were already open \
         from their client address.",
    )
});
/// Bytes of request messages being received over all connections: each message counted at its
/// declared size from its 5-byte prefix, a call's first message until its request stream ends, a
/// later one until its last byte has arrived (`--max-connection-receive-bytes`).
pub static REQUEST_BYTES_RECEIVING: LazyLock<IntGauge> = LazyLock::new(|| {
    gauge(
        "cube_request_bytes_receiving",
        "Bytes of request messages being received over all connections, each at the size its \
         prefix declares: a call's first message until its request stream ends, a later one \
         until its last byte has arrived.",
    )
});
/// Calls refused because their connection was already receiving --max-connection-receive-bytes
/// (or had `OPEN_CALLS_PER_CONNECTION` open calls receiving).
pub static REQUEST_RECEIVE_REFUSED: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "cube_request_receive_refused_total",
        "Calls answered RESOURCE_EXHAUSTED because their request message did not fit what their \
         connection may be receiving at once (--max-connection-receive-bytes), or because their \
         connection already had 16 calls needing no authentication whose requests had not ended.",
    )
});
/// Bytes of unary answers held for their clients over all connections: taken from the handler,
/// not yet all written to the socket (`--max-connection-send-bytes`).
pub static ANSWER_BYTES_HELD: LazyLock<IntGauge> = LazyLock::new(|| {
    gauge(
        "cube_answer_bytes_held",
        "Bytes of unary answers over all connections that wait for their clients to take them \
         (HTTP/2 flow control): encoded, not yet all written to the connection's socket.",
    )
});
/// Calls refused because their connection's client had not read --max-connection-send-bytes of
/// answers.
pub static ANSWER_SEND_REFUSED: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "cube_answer_send_refused_total",
        "Calls answered RESOURCE_EXHAUSTED because their connection's client had not yet read \
         close to --max-connection-send-bytes of answers to its earlier calls.",
    )
});
/// Changes refused because they would take their tenant past its storage quota.
pub static QUOTA_REFUSALS: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "cube_quota_refusals_total",
        "Write, Prog, Link and Run calls answered RESOURCE_EXHAUSTED because they would take \
         their tenant's stored bytes past its quota (--tenant-max-bytes).",
    )
});
/// Streamed pages (Region, Tenant.Audit) dropped because the client did not read them in time.
pub static SCAN_PAGES_EXPIRED: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "cube_scan_pages_expired_total",
        "Region and Tenant.Audit pages dropped after --page-read-secs without their client \
         reading any of them, freeing their tenant's scan place.",
    )
});
/// Connections closed because their HTTP/2 preface did not arrive in time.
pub static CONNECTIONS_PREFACE_TIMEOUTS: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "cube_connections_preface_timeouts_total",
        "Connections closed because they did not send the whole HTTP/2 connection preface \
         within --preface-timeout-ms of being accepted (of their TLS handshake ending, under TLS).",
    )
});
/// TLS handshakes on the gRPC listener that did not complete, by reason.
pub static TLS_HANDSHAKE_FAILURES: LazyLock<IntCounterVec> = LazyLock::new(|| {
    counter_vec(
        "cube_tls_handshake_failures_total",
        "TLS handshakes on the gRPC listener that did not complete, by reason \
         (certificate_rejected: the client refused this server's certificate, an alert such as \
         certificate_expired or unknown_ca; client_certificate: the client's certificate was \
         refused; protocol: no TLS 1.3, no h2, or a malformed handshake; timeout: not done \
         within 10 s; closed: the connection failed or closed mid-handshake).",
        &["reason"],
    )
});
/// When the served TLS certificate expires. Registered only when the listener speaks TLS.
pub static TLS_CERTIFICATE_EXPIRY: LazyLock<IntGauge> = LazyLock::new(|| {
    gauge(
        "cube_tls_certificate_expiry_timestamp_seconds",
        "When the TLS certificate the gRPC listener serves expires (its notAfter), in seconds \
         since the Unix epoch. Absent without TLS. The certificate is read at start only.",
    )
});
/// fdatasync latency of WAL batches.
pub static WAL_FSYNC_SECONDS: LazyLock<Histogram> = LazyLock::new(|| {
    histogram(
        "cube_wal_fsync_seconds",
        "Write + fdatasync time of one WAL batch.",
        fine_buckets(),
    )
});
/// Records per WAL batch (group commit).
pub static WAL_BATCH_RECORDS: LazyLock<Histogram> = LazyLock::new(|| {
    histogram(
        "cube_wal_batch_records",
        "Records per WAL batch.",
        (0..14).map(|i| 2f64.powi(i)).collect(),
    )
});
/// Bytes written to WAL segments.
pub static WAL_BYTES: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "cube_wal_bytes_total",
        "Bytes of records written to WAL segments.",
    )
});
/// Free bytes of the data directory's file system (below `--min-free-bytes`, writes are refused).
pub static DISK_FREE_BYTES: LazyLock<IntGauge> = LazyLock::new(|| {
    gauge(
        "cube_disk_free_bytes",
        "Free bytes of the data directory's file system, as last checked.",
    )
});
/// Tenants with an open actor.
pub static TENANTS_ACTIVE: LazyLock<IntGauge> =
    LazyLock::new(|| gauge("cube_tenants_active", "Tenants with an open actor and WAL."));
/// Requests admitted and not yet answered, over all tenants.
pub static MAILBOX_DEPTH: LazyLock<IntGauge> = LazyLock::new(|| {
    gauge(
        "cube_mailbox_depth",
        "Requests admitted to tenant actors and not yet answered (queued or waiting for fsync).",
    )
});
/// Where a change's time goes inside its tenant, by stage (see [`CHANGE_MAILBOX`] and its
/// siblings, the label values resolved once).
pub static CHANGE_STAGE_SECONDS: LazyLock<HistogramVec> = LazyLock::new(|| {
    histogram_vec(
        "cube_change_stage_seconds",
        "Time a call spends in each stage inside its tenant: mailbox (queued for the tenant's actor), durable (from its WAL append until the actor hears it is fsynced), apply (applying the group it was made durable in). A cell change under the sync policy is answered by the WAL syncer as soon as it is fsynced, so only mailbox and the fdatasync are on its answer's path.",
        &["stage"],
        // A call's wait in the mailbox includes applies held behind a state store's stall (up
        // to 30 s before they fail): with the fine buckets its p99 sat flat at 10.5 s.
        long_buckets(),
    )
});
/// A call's wait in its tenant's mailbox, from the gateway's send to the actor's handler.
pub static CHANGE_MAILBOX: LazyLock<Histogram> =
    LazyLock::new(|| CHANGE_STAGE_SECONDS.with_label_values(&["mailbox"]));
/// A durable change's wait from its WAL append until its tenant's actor hears it is fsynced:
/// the syncer's queue, the write and fdatasync, and the report's trip back to the actor.
pub static CHANGE_DURABLE: LazyLock<Histogram> =
    LazyLock::new(|| CHANGE_STAGE_SECONDS.with_label_values(&["durable"]));
/// Applying a durable change's group to the tenant's state. A change the WAL syncer answered
/// itself (a cell change under `sync`) was answered while this ran; the others right after it.
pub static CHANGE_APPLY: LazyLock<Histogram> =
    LazyLock::new(|| CHANGE_STAGE_SECONDS.with_label_values(&["apply"]));
/// Time to open (recover) a tenant.
pub static RECOVERY_SECONDS: LazyLock<Histogram> = LazyLock::new(|| {
    histogram(
        "cube_recovery_seconds",
        "Time to open a tenant: WAL replay and repair.",
        long_buckets(),
    )
});
/// Torn-tail bytes truncated during recovery.
pub static RECOVERY_TRUNCATED_BYTES: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "cube_recovery_truncated_bytes_total",
        "Bytes of torn WAL tails zeroed during recovery (the file is not shortened).",
    )
});
/// Tenants that failed to open (corrupt WAL) or were poisoned by a failed fsync.
pub static TENANTS_UNAVAILABLE: LazyLock<IntGauge> = LazyLock::new(|| {
    gauge(
        "cube_tenants_unavailable",
        "Tenants refusing service: corrupt WAL or poisoned shard.",
    )
});

/// Failed opens of a tenant, each retry counted: unlike [`TENANTS_UNAVAILABLE`], which counts
/// a failed open only until it is forgotten (1 to 30 s), this keeps the evidence for an alert.
pub static TENANT_OPEN_FAILURES: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "cube_tenant_open_failures_total",
        "Opens of a tenant that failed (a corrupt or unreadable WAL or state store, a failed sync while opening); each retry counted.",
    )
});

/// Time to flush a tenant's state store (a checkpoint). Long buckets: a checkpoint waits for
/// every sealed memtable to be flushed, a backlog that can take as long as a state store's
/// 30-s stall.
pub static CHECKPOINT_SECONDS: LazyLock<Histogram> = LazyLock::new(|| {
    histogram(
        "cube_checkpoint_seconds",
        "Time to flush a tenant's state store at a checkpoint.",
        long_buckets(),
    )
});
/// WAL segments deleted because a checkpoint covers them.
pub static WAL_SEGMENTS_DELETED: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "cube_wal_segments_deleted_total",
        "WAL segments deleted after a checkpoint covered them.",
    )
});
/// New WAL segments that reused a covered one instead of being zero-filled.
pub static WAL_SEGMENTS_RECYCLED: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "cube_wal_segments_recycled_total",
        "New WAL segments that reused a segment a checkpoint covered instead of zero-filling a new file.",
    )
});
/// Tenant actors stopped because they were idle or evicted by the open-tenant cap.
pub static TENANTS_PASSIVATED: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "cube_tenants_passivated_total",
        "Tenants closed for idleness or by the open-tenant cap (woken again by their next call).",
    )
});
/// Merges of a tenant state store's sorted runs that failed (a full disk, a damaged block in
/// an input run, a failed manifest write). The merge is retried later; meanwhile the tenant's
/// level 0 grows, so a steady rise is what an alert should catch (the log says
/// `Compaction failed` with the cause).
pub static STATE_COMPACTIONS_FAILED: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "cube_state_compactions_failed_total",
        "Merges of a tenant state store's sorted runs that failed (full disk, damaged block, failed manifest write); each is retried later.",
    )
});

/// Tenant actors closed after they stopped on a panic (an internal error).
pub static TENANT_ACTOR_CRASHES: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "cube_tenant_actor_crashes_total",
        "Tenant actors that stopped after an internal error (a panic, logged) and were closed; \
         the tenant is reopened from its log by its next call.",
    )
});

/// Times a tenant held its applies instead of waiting on its actor thread, by reason.
pub static APPLY_HOLDS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    counter_vec(
        "cube_apply_holds_total",
        "Times a tenant held its durable changes unapplied (and the answers that wait for the \
         apply) rather than wait on the actor thread it shares with other tenants, by reason \
         (state_store: its memtables over budget, flushes behind; catalog: a catalog change \
         while the catalog's files were being synced).",
        &["reason"],
    )
});

/// Why a tenant held its applies: the `reason` label of `cube_apply_holds_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApplyHold {
    /// The state store's memtables were over budget (its flushes behind).
    StateStore,
    /// The group held a catalog change while the catalog was syncing its files.
    Catalog,
}

impl ApplyHold {
    pub const ALL: [ApplyHold; 2] = [Self::StateStore, Self::Catalog];

    pub fn label(self) -> &'static str {
        match self {
            Self::StateStore => "state_store",
            Self::Catalog => "catalog",
        }
    }

    /// This reason's series.
    pub fn counter(self) -> IntCounter {
        APPLY_HOLDS.with_label_values(&[self.label()])
    }
}

/// Register every metric. Metrics without labels appear in the exposition from the start;
/// labelled ones appear with their first recorded label set.
pub fn init() {
    let _ = (
        &*GRPC_STARTED,
        &*GRPC_HANDLED,
        &*GRPC_HANDLING,
        &*AUTH_SECONDS,
        &*AUTH_HANDSHAKES,
        &*AUTH_FAILURES,
    );
    let _ = (
        &*CONNECTIONS_OPEN,
        &*CONNECTIONS_REFUSED,
        &*CONNECTIONS_ADDRESS_REFUSED,
        &*CONNECTIONS_PREFACE_TIMEOUTS,
        &*WAL_FSYNC_SECONDS,
        &*WAL_BATCH_RECORDS,
        &*WAL_BYTES,
        &*TENANTS_ACTIVE,
    );
    let _ = (
        &*MAILBOX_DEPTH,
        &*RECOVERY_SECONDS,
        &*RECOVERY_TRUNCATED_BYTES,
        &*TENANTS_UNAVAILABLE,
        &*TENANT_OPEN_FAILURES,
        &*CHECKPOINT_SECONDS,
        &*WAL_SEGMENTS_DELETED,
        &*WAL_SEGMENTS_RECYCLED,
        &*TENANTS_PASSIVATED,
        &*TENANT_ACTOR_CRASHES,
        &*STATE_COMPACTIONS_FAILED,
    );
    let _ = (
        &*CHANGE_MAILBOX,
        &*CHANGE_DURABLE,
        &*CHANGE_APPLY,
        &*SCAN_PAGES_EXPIRED,
        &*REQUEST_BYTES_RECEIVING,
        &*REQUEST_RECEIVE_REFUSED,
        &*ANSWER_BYTES_HELD,
        &*ANSWER_SEND_REFUSED,
        &*QUOTA_REFUSALS,
    );
    // Rare events an alert takes the `increase` of: their series must exist (at 0) before the
    // first one, or the first scrape already shows it counted and `increase` sees nothing.
    for outcome in ClockMarkWait::ALL {
        let _ = outcome.counter();
    }
    for reason in ApplyHold::ALL {
        let _ = reason.counter();
    }
    for reason in TlsHandshakeFailure::ALL {
        let _ = reason.counter();
    }
}

/// Why a TLS handshake did not complete: the `reason` label of
/// `cube_tls_handshake_failures_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TlsHandshakeFailure {
    /// The client refused the server's certificate (it sent an alert saying so): expired, not
    /// issued by a CA the client trusts, or not for the name it dialled. The server's to fix.
    CertificateRejected,
    /// The client's certificate (mTLS) was refused: not issued by the data directory's CA,
    /// expired, or not usable for client authentication.
    ClientCertificate,
    /// Any other TLS failure: no TLS 1.3, no HTTP/2 offered, a malformed handshake.
    Protocol,
    /// Not done within the handshake's time limit.
    Timeout,
    /// The connection failed or was closed before the handshake ended (a port probe, a reset).
    Closed,
}

impl TlsHandshakeFailure {
    pub const ALL: [TlsHandshakeFailure; 5] = [
        Self::CertificateRejected,
        Self::ClientCertificate,
        Self::Protocol,
        Self::Timeout,
        Self::Closed,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Self::CertificateRejected => "certificate_rejected",
            Self::ClientCertificate => "client_certificate",
            Self::Protocol => "protocol",
            Self::Timeout => "timeout",
            Self::Closed => "closed",
        }
    }

    /// This reason's series.
    pub fn counter(self) -> IntCounter {
        TLS_HANDSHAKE_FAILURES.with_label_values(&[self.label()])
    }
}

/// How a signed call's wait for the replay clock mark ended: the `outcome` label of
/// `cube_auth_clock_mark_waits_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClockMarkWait {
    /// A renewal covered the call, whose authentication then went on as usual.
    Covered,
    /// None did in time: the call was refused.
    Refused,
    /// The call was dropped while it waited (a client's deadline, a reset).
    Cancelled,
}

impl ClockMarkWait {
    pub const ALL: [ClockMarkWait; 3] = [Self::Covered, Self::Refused, Self::Cancelled];

    pub fn label(self) -> &'static str {
        match self {
            Self::Covered => "covered",
            Self::Refused => "refused",
            Self::Cancelled => "cancelled",
        }
    }

    /// This outcome's series.
    pub fn counter(self) -> IntCounter {
        AUTH_CLOCK_MARK_WAITS.with_label_values(&[self.label()])
    }
}

/// The Prometheus text exposition of every metric.
pub fn render() -> String {
    init();
    let mut out = Vec::new();
    let _ = TextEncoder::new().encode(&REGISTRY.gather(), &mut out);
    String::from_utf8(out).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_metric_registers_and_renders() {
        GRPC_HANDLED
            .with_label_values(&["unary", "cube.v1.Cells", "Read", "OK", "call"])
            .inc();
        WAL_FSYNC_SECONDS.observe(0.0001);
        let text = render();
        for name in [
            "grpc_server_handled_total",
            "cube_wal_fsync_seconds_bucket",
            "cube_tenants_active",
            "cube_mailbox_depth",
        ] {
            assert!(text.contains(name), "{name} missing");
        }
        assert!(
            text.contains("cube_quota_refusals_total 0"),
            "the quota refusals' series exists before the first one"
        );
        assert!(
            text.contains("cube_auth_clock_mark_waits_total{outcome=\"refused\"} 0"),
            "the clock-mark refusals' series exists before the first one"
        );
        assert!(
            text.contains("le=\"0.00001\""),
            "the finest bucket is 10 µs"
        );
    }

    /// A checkpoint waiting 20 s for its state store's flush backlog falls in a bucket of its
    /// own, not only in `+Inf` past 10.5 s.
    #[test]
    fn a_checkpoint_waiting_for_a_flush_backlog_is_resolved_past_ten_seconds() {
        CHECKPOINT_SECONDS.observe(20.0);
        let text = render();
        assert!(
            text.contains("cube_checkpoint_seconds_bucket{le=\"41.94304\"} 1"),
            "{}",
            text.lines()
                .filter(|l| l.starts_with("cube_checkpoint_seconds_bucket"))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }

    /// A change held 20 s in its tenant's mailbox (applies held behind a stall) falls in a
    /// bucket of its own, not only in `+Inf` past 10.5 s.
    #[test]
    fn a_change_held_for_seconds_is_resolved_past_ten_seconds() {
        CHANGE_MAILBOX.observe(20.0);
        let text = render();
        assert!(
            text.contains("cube_change_stage_seconds_bucket{stage=\"mailbox\",le=\"41.94304\"} 1"),
            "{}",
            text.lines()
                .filter(|l| l.starts_with("cube_change_stage_seconds_bucket{stage=\"mailbox\""))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}
