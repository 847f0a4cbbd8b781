//! The tenant state machine: rules and the applied state, no actors and no WAL.
//!
//! Two views of a tenant's data:
//! - *applied*: what the state backend holds. In the default policy only durable records are
//!   applied, so reads (served from here, on any thread, through [`StateReader`]) never observe
//!   a write that could still be lost.
//! - *logical*: applied plus the changes logged but not applied yet (the overlay). Changes are
//!   checked against it, so two compare-and-set writes in one group commit see each other.
//!
//! A group of records is applied as one atomic backend batch that also stores the applied WAL
//! seq, the totals and the audit head: the backend is always a consistent prefix of the WAL.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use prost::Message;
use prost::bytes::Bytes;
use sha2::{Digest, Sha256};

use crate::audit::{AuditEntry, EncodedAuditEntry};
use crate::backend::{BackendError, BatchOp, StateBackend, StateRead};
use crate::keys::{self, AuditChunk, AuditHead, StoredCell, Totals};
use crate::morton;
use crate::walop::{self, Op, WalAudit, WalCoord, WalOp};
use crate::{Capability, StoreError};

/// Walk depth cap (and default).
pub const MAX_WALK_DEPTH: u32 = 16;
/// Longest edge label in bytes.
pub const MAX_LABEL_BYTES: usize = 64;
/// Distinct labels a Walk may name: each costs one seek per visited coordinate.
pub const MAX_WALK_LABELS: usize = 16;
/// Labels a walk request may list, repeats included.
pub const MAX_WALK_LABEL_ENTRIES: usize = 256;
/// Stored bytes of the cells in one Region page at most (the first cell always fits): a page is
/// built in memory before it is streamed, and cells may each hold `--max-value-bytes`.
pub const REGION_PAGE_BYTES: usize = 4 << 20;
/// Store re-opens one Region page may make (each jumps a run of keys outside the box): a thin
/// box through many stored cells ends its page here, with a token, rather than scanning them all.
pub const REGION_PAGE_SEEKS: usize = 4096;
/// Steps one Walk may take: each edge read (including those back to coordinates already seen)
/// and each lookup of a visited coordinate's edges (one per named label, or one for all). Past
/// it the walk ends `truncated`: a walk naming 16 labels over sparse edges seeks 16 times per
/// coordinate while reading few edges.
pub const WALK_MAX_STEPS: usize = 100_000;
/// Most audit entries stored under one key. An applied group with more is split, so the chunk
/// holding any seq starts at most this many entries before it.
const AUDIT_CHUNK_ENTRIES: usize = 16;
/// Expiry of old audit chunks runs once at least `audit_retention / 64` (at most this many) more
/// entries have left the window, not on every apply: its range scan costs about the same
/// whether it finds one chunk or hundreds. Readers filter to exactly the window, so the extra
/// stored entries (under 1/64 of the retention) are invisible to them.
const AUDIT_EXPIRY_STEP_MAX: u64 = 1024;
/// Most audit chunks one apply's expiry removes (the rest go with the next applies): one
/// apply's batch, on the actor's thread, stays short even when retention was lowered a lot.
const AUDIT_EXPIRY_CHUNKS_MAX: usize = 4096;

/// A cell's address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Coord {
    pub x: i32,
    pub y: i32,
    pub z: i32,
}

impl std::fmt::Display for Coord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "({}, {}, {})", self.x, self.y, self.z)
    }
}

impl From<Coord> for WalCoord {
    fn from(c: Coord) -> WalCoord {
        WalCoord {
            x: c.x,
            y: c.y,
            z: c.z,
        }
    }
}

impl From<&WalCoord> for Coord {
    fn from(c: &WalCoord) -> Coord {
        Coord {
            x: c.x,
            y: c.y,
            z: c.z,
        }
    }
}

/// What a caller asks of a tenant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    Write {
        coord: Coord,
        value: Vec<u8>,
        expected_version: Option<u64>,
    },
    Read {
        coord: Coord,
    },
    Delete {
        coord: Coord,
        expected_version: Option<u64>,
    },
    /// Record a security event (grant, revoke, failed authentication...) in the audit trail.
    Event {
        op: String,
        detail: String,
    },
    Prog {
        coord: Coord,
        program: Vec<u8>,
    },
    Run {
        coord: Coord,
        input: Vec<u8>,
    },
    Link {
        from: Coord,
        to: Coord,
        label: String,
    },
    Unlink {
        from: Coord,
        to: Coord,
        label: String,
    },
    Seal {
        coord: Coord,
    },
    /// Add `grant` to and remove `revoke` from the capabilities of the tenant's key `key_id`
    /// (`Access.Grant` / `Access.Revoke`). Handled by the tenant's core, which reads the key from
    /// the catalog: one WAL record holds the new capability set and its audit entry.
    ChangeCapabilities {
        key_id: String,
        grant: Vec<Capability>,
        revoke: Vec<Capability>,
    },
    /// Revoke the tenant's key `key_id`. Handled by the tenant's core like
    /// `ChangeCapabilities`: one WAL record holds the revocation and its `key.revoke` entry.
    RevokeKey {
        key_id: String,
    },
    /// Create a key for the tenant (read and write, and admin if `admin`), likewise one WAL
    /// record with its `key.create` entry.
    CreateKey {
        admin: bool,
    },
    /// Set the tenant's durability policy: one WAL record with its `durability` entry, applied
    /// to the catalog by the tenant's core. The log runs under it from the tenant's next open.
    SetDurability {
        policy: cube_wal::SyncPolicy,
    },
    /// Record that the operator issued a client certificate for the tenant's active key
    /// `key_id` (`cubed key cert`): a `key.cert` entry with the SHA-256 of the certificate's
    /// DER encoding and its notAfter (Unix ms). Handled by the tenant's core, which checks the
    /// key in the same step as it logs the entry (a key revoked, or its revocation logged, is
    /// NOT_FOUND), and answered only once the entry is durable, whatever the tenant's policy.
    RecordCertificate {
        key_id: String,
        sha256: [u8; 32],
        not_after_ms: i64,
    },
}

/// Who asks, and when: what the audit entry of a change records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// `tenant/key_id`, or `operator` for the local admin socket.
    pub principal: String,
    pub ts_ms: i64,
}

impl Command {
    /// The checks of `self`'s own arguments, which need no state: a value or program over
    /// `max_value` bytes, an edge label outside 1 to [`MAX_LABEL_BYTES`] bytes, a durability
    /// policy outside its bounds. Made before the
    /// tenant admits the call, so such a call is told INVALID_ARGUMENT whatever the tenant's
    /// state (busy, short of space, poisoned), not a refusal that a retry could end.
    pub fn check_arguments(&self, max_value: usize) -> Result<(), StoreError> {
        let (what, len) = match self {
            Command::Write { value, .. } => ("value", value.len()),
            Command::Prog { program, .. } => ("program", program.len()),
            Command::Link { label, .. } | Command::Unlink { label, .. } => {
                return check_label(label);
            }
            Command::SetDurability { policy } => return crate::catalog::check_policy(policy),
            Command::RecordCertificate {
                key_id,
                not_after_ms,
                ..
            } => {
                if key_id.is_empty() {
                    return Err(StoreError::InvalidArgument("key_id is required".into()));
                }
                if *not_after_ms <= 0 {
                    return Err(StoreError::InvalidArgument(format!(
                        "not_after_ms must be the certificate's notAfter in Unix milliseconds, \
                         not {not_after_ms}"
                    )));
                }
                return Ok(());
            }
            _ => return Ok(()),
        };
        if len > max_value {
            return Err(StoreError::InvalidArgument(format!(
                "{what} is {len} bytes; the limit is {max_value} bytes"
            )));
        }
        Ok(())
    }

    /// Bytes the command carries from its caller (values, programs, inputs, labels): what it
    /// holds in memory, in a few copies, until it is answered.
    pub fn payload_bytes(&self) -> usize {
        match self {
            Command::Write { value, .. } => value.len(),
            Command::Prog { program, .. } => program.len(),
            Command::Run { input, .. } => input.len(),
            Command::Event { op, detail } => op.len() + detail.len(),
            Command::Link { label, .. } | Command::Unlink { label, .. } => label.len(),
            Command::ChangeCapabilities { key_id, .. }
            | Command::RevokeKey { key_id }
            | Command::RecordCertificate { key_id, .. } => key_id.len(),
            Command::Read { .. }
            | Command::Delete { .. }
            | Command::Seal { .. }
            | Command::CreateKey { .. }
            | Command::SetDurability { .. } => 0,
        }
    }

    /// Whether the command may change state (and so goes through the WAL).
    pub fn is_mutation(&self) -> bool {
        !matches!(self, Command::Read { .. })
    }

    /// Whether the free-space guard (`--min-free-bytes`) lets this change through: the tenant's
    /// creation entry ([`CREATION_OP`], logged once, at its first open; without it the trail
    /// would start later for good) and a key's revocation (which must not wait for space, and
    /// made through the catalog instead would go unaudited). Each is one small record, which
    /// the guard's margin is there to hold.
    pub fn passes_space_guard(&self) -> bool {
        match self {
            Command::Event { op, .. } => op == CREATION_OP,
            Command::RevokeKey { .. } => true,
            // One small record, like a revocation: an operator issuing a certificate on a
            // nearly full disk is not refused for want of space the guard keeps for this.
            Command::RecordCertificate { .. } => true,
            _ => false,
        }
    }
}

/// The audit op of a tenant's creation entry (its trail's entry 1).
pub const CREATION_OP: &str = "tenant.create";

/// The audit op of a client certificate's entry.
pub(crate) const CERTIFICATE_OP: &str = "key.cert";

/// The `key.cert` entry of a client certificate the operator issued for `key_id` (`cubed key
/// cert`): the key, the SHA-256 of the certificate's DER encoding (as `openssl x509 -noout
/// -fingerprint -sha256` prints it, without the colons) and its notAfter in Unix milliseconds,
/// like the entries' own `ts_ms`.
pub(crate) fn certificate_event(key_id: &str, sha256: &[u8; 32], not_after_ms: i64) -> Command {
    Command::Event {
        op: CERTIFICATE_OP.into(),
        detail: format!(
            "key={key_id} sha256={} not_after_ms={not_after_ms}",
            hex::encode(sha256)
        ),
    }
}

/// A cell as a read returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CellView {
    pub value: Vec<u8>,
    pub version: u64,
    pub sealed: bool,
}

/// The answer to a [`Command`]. `seq` fields are the WAL seq of the change (0 when nothing
/// changed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    Written {
        version: u64,
        seq: u64,
    },
    Read(Option<CellView>),
    Deleted {
        existed: bool,
        seq: u64,
    },
    /// A security event was recorded durably at this WAL seq.
    Recorded {
        seq: u64,
    },
    Programmed {
        version: u64,
        seq: u64,
    },
    Ran {
        program: Vec<u8>,
        run_count: u64,
    },
    Linked {
        created: bool,
    },
    Unlinked {
        existed: bool,
    },
    Sealed {
        digest: Vec<u8>,
        version: u64,
    },
    /// The key's capabilities after the change (sorted), durable at this WAL seq.
    Capabilities {
        capabilities: Vec<Capability>,
        seq: u64,
    },
    /// `revoked`: this call revoked the key (durable at `seq`); false if it already was.
    KeyRevoked {
        revoked: bool,
        seq: u64,
    },
    /// A new key, durable at `seq` and usable from the next call.
    KeyCreated {
        key_id: String,
        secret: cube_auth::Secret,
        capabilities: Vec<Capability>,
        seq: u64,
    },
}

impl Reply {
    fn with_seq(self, new_seq: u64) -> Reply {
        match self {
            Reply::Written { version, .. } => Reply::Written {
                version,
                seq: new_seq,
            },
            Reply::Deleted { existed, .. } => Reply::Deleted {
                existed,
                seq: new_seq,
            },
            Reply::Recorded { .. } => Reply::Recorded { seq: new_seq },
            Reply::Capabilities { capabilities, .. } => Reply::Capabilities {
                capabilities,
                seq: new_seq,
            },
            Reply::KeyRevoked { revoked, .. } => Reply::KeyRevoked {
                revoked,
                seq: new_seq,
            },
            Reply::KeyCreated {
                key_id,
                secret,
                capabilities,
                ..
            } => Reply::KeyCreated {
                key_id,
                secret,
                capabilities,
                seq: new_seq,
            },
            Reply::Programmed { version, .. } => Reply::Programmed {
                version,
                seq: new_seq,
            },
            other => other,
        }
    }
}

/// What a logged change does to the logical view, computed once by `prepare`.
#[derive(Debug, Clone)]
pub enum Effect {
    /// The cell after the change, and (when `prepare` read it anyway) before it.
    Cell(Coord, Option<StoredCell>, Hint),
    Edge(Vec<u8>, bool),
    Nothing,
}

/// What `prepare` knew of a cell before the change.
#[derive(Debug, Clone)]
pub enum Hint {
    Known(Option<StoredCell>),
    Unknown,
}

/// The outcome of checking a command against the logical state.
// A Prepared lives for one call and is moved once; boxing `Log` would add an allocation per write.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Prepared {
    /// Answer at once; nothing to log.
    Immediate(Reply),
    /// Log `op`; once it is applied, answer `reply` (its `seq` is filled in by [`Prepared::seal`]).
    Log {
        op: WalOp,
        reply: Reply,
        effect: Effect,
        /// What the change adds to the tenant's stored bytes ([`Totals::stored_bytes`]; negative
        /// when it frees some), for [`TenantState::note_pending`].
        growth: i64,
    },
}

impl Prepared {
    pub(crate) fn seal(reply: Reply, seq: u64) -> Reply {
        reply.with_seq(seq)
    }

    fn with_growth(mut self, bytes: i64) -> Prepared {
        if let Prepared::Log { growth, .. } = &mut self {
            *growth = bytes;
        }
        self
    }
}

/// Per-tenant bounds the state machine enforces.
#[derive(Debug, Clone, Copy)]
pub struct StateLimits {
    /// Largest cell value (and program) in bytes.
    pub max_value: usize,
    /// Audit entries kept (the newest).
    pub audit_retention: u64,
    /// Run telemetry entries kept per cell (the newest).
    pub telemetry_keep: u64,
    /// The tenant's storage quota: `Write`, `Prog`, `Link` and `Run` that would take its stored bytes
    /// ([`Totals::stored_bytes`], changes logged and not applied yet included) past it are
    /// refused. 0: none.
    pub max_bytes: u64,
}

impl Default for StateLimits {
    fn default() -> Self {
        StateLimits {
            max_value: 1 << 20,
            audit_retention: 1_000_000,
            telemetry_keep: 16,
            max_bytes: 0,
        }
    }
}

/// Why applying records failed. Either way nothing of the group was applied.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ApplyError {
    /// A record that cannot be applied (corrupt or from a newer server).
    #[error("record {seq}: {detail}")]
    Record { seq: u64, detail: String },
    #[error("state storage: {0}")]
    Backend(#[from] BackendError),
}

fn storage_error(e: &BackendError) -> StoreError {
    tracing::error!(error = %e, "tenant state storage failed");
    if e.is_corrupt() {
        // A damaged block: every retry would read it again.
        return StoreError::DataLoss(
            "the tenant's stored state is damaged where this call reads (a block failed its \
             checksum or does not decode); an operator must repair or restore the tenant (see \
             the server log)"
                .into(),
        );
    }
    StoreError::Unavailable("the tenant's storage failed to read; see the server log".into())
}

/// A stored `what` (a cell, a run, an audit chunk) that does not decode: corrupt data, which no
/// retry will read (DATA_LOSS), unlike a failed read of the storage (UNAVAILABLE).
fn corrupt(what: &str, e: &prost::DecodeError) -> StoreError {
    tracing::error!(error = %e, "the tenant's stored {what} does not decode: corrupt data");
    StoreError::DataLoss(corrupt_message(what))
}

/// What a call is told of a stored `what` (a cell, a run, an audit entry) that does not decode.
pub fn corrupt_message(what: &str) -> String {
    format!(
        "a stored {what} this call reads is corrupt and cannot be decoded; an operator must \
         repair or restore the tenant (see the server log)"
    )
}

/// One page of a Region scan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionPage {
    pub cells: Vec<(Coord, CellView)>,
    /// Present when more cells may follow: pass it back as `page_token`.
    pub next_token: Option<Vec<u8>>,
}

/// Version byte of the region page tokens of earlier builds: the Morton key to resume at.
/// Still accepted (a client paging across an upgrade), within the box only.
const TOKEN_V1: u8 = 1;
/// Version byte of region page tokens: the Morton key to resume at, then [`TOKEN_TAG_LEN`]
/// bytes tying it to its box ([`token_tag`]), so that a token sent with another box is refused
/// instead of silently skipping or repeating that box's cells.
const TOKEN_V2: u8 = 2;
const TOKEN_TAG_LEN: usize = 8;

/// The tag of a v2 page token: a digest of the box and the resume point. Not a secret (a
/// client may read its own tenant from anywhere): it catches tokens sent with the wrong box.
fn token_tag(min: Coord, max: Coord, code: &[u8]) -> [u8; TOKEN_TAG_LEN] {
    let mut h = Sha256::new();
    h.update(b"cube region page token");
    for v in [min.x, min.y, min.z, max.x, max.y, max.z] {
        h.update(v.to_be_bytes());
    }
    h.update(code);
    let mut tag = [0u8; TOKEN_TAG_LEN];
    tag.copy_from_slice(&h.finalize()[..TOKEN_TAG_LEN]);
    tag
}

fn region_token(min: Coord, max: Coord, next: u128) -> Vec<u8> {
    let code = morton::to_bytes(next);
    let mut t = Vec::with_capacity(1 + code.len() + TOKEN_TAG_LEN);
    t.push(TOKEN_V2);
    t.extend_from_slice(&code);
    t.extend_from_slice(&token_tag(min, max, &code));
    t
}

/// Whether a Region request's box and page token are valid: the gateway asks before the request
/// waits for a scan place ([`StateReader::region`] checks again).
pub fn check_region(min: Coord, max: Coord, token: &[u8]) -> Result<(), StoreError> {
    region_start(min, max, token).map(|_| ())
}

/// A Region request's box and the Morton code its page starts at, or why the request is invalid.
fn region_start(
    min: Coord,
    max: Coord,
    token: &[u8],
) -> Result<(morton::Bounds, u128), StoreError> {
    let bounds =
        morton::Bounds::new((min.x, min.y, min.z), (max.x, max.y, max.z)).ok_or_else(|| {
            StoreError::InvalidArgument(format!(
                "region min {min} must not exceed max {max} on any axis"
            ))
        })?;
    if token.is_empty() {
        return Ok((bounds, bounds.zmin()));
    }
    let not_issued = || {
        StoreError::InvalidArgument(
            "page_token is not one this server issued; pass back the \
             x-cube-next-page-token-bin value of the previous page unchanged"
                .into(),
        )
    };
    let other_box = || {
        StoreError::InvalidArgument(format!(
            "page_token was issued for another box than min {min} max {max}: send the min and \
             max of the request whose page returned it, or no token to start this box over"
        ))
    };
    let start = match token.split_first() {
        Some((&TOKEN_V1, code)) => morton::from_bytes(code).ok_or_else(not_issued)?,
        Some((&TOKEN_V2, rest)) if rest.len() == morton::KEY_LEN + TOKEN_TAG_LEN => {
            let (code, tag) = rest.split_at(morton::KEY_LEN);
            let start = morton::from_bytes(code).ok_or_else(not_issued)?;
            if token_tag(min, max, code) != tag {
                return Err(other_box());
            }
            start
        }
        _ => return Err(not_issued()),
    };
    // Every token resumes inside its box's code range.
    if start < bounds.zmin() || start > bounds.zmax() {
        return Err(other_box());
    }
    Ok((bounds, start))
}

/// A Walk request's labels, distinct and in key order (length byte, then bytes, so results do
/// not depend on the request's order), or why they are invalid. The gateway asks before the
/// request waits for a scan place; the walk checks again.
pub fn walk_labels(labels: &[String]) -> Result<Vec<&str>, StoreError> {
    // Checked first, so a request of a million repeated labels is not sorted to find out.
    if labels.len() > MAX_WALK_LABEL_ENTRIES {
        return Err(StoreError::InvalidArgument(format!(
            "a walk lists at most {MAX_WALK_LABEL_ENTRIES} labels ({MAX_WALK_LABELS} distinct); \
             got {}",
            labels.len()
        )));
    }
    for label in labels {
        if label.is_empty() || label.len() > MAX_LABEL_BYTES {
            return Err(StoreError::InvalidArgument(format!(
                "edge labels are 1 to {MAX_LABEL_BYTES} bytes; got one of {} bytes",
                label.len()
            )));
        }
    }
    let mut labels: Vec<&str> = labels.iter().map(String::as_str).collect();
    labels.sort_by(|a, b| (a.len(), *a).cmp(&(b.len(), *b)));
    labels.dedup();
    if labels.len() > MAX_WALK_LABELS {
        return Err(StoreError::InvalidArgument(format!(
            "a walk names at most {MAX_WALK_LABELS} distinct labels; got {} (name none to \
             follow every label)",
            labels.len()
        )));
    }
    Ok(labels)
}

/// One run's telemetry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunRecord {
    pub ts_ms: i64,
    pub principal: String,
    pub input_digest: Vec<u8>,
}

/// Read access to a tenant's applied state from any thread: reads never queue behind the
/// tenant's actor, and only ever see applied changes.
///
/// INVARIANT: a change is answered only after it is applied, or (answered by the WAL syncer,
/// see `crate::EarlyAnswers`) every read waits first until it is applied
/// (`TenantHandle::caught_up`), so a read that starts after an acknowledgement sees that
/// change.
#[derive(Debug, Clone)]
pub struct StateReader {
    store: Arc<dyn StateBackend>,
    /// Audit entries served: the newest this many.
    audit_retention: u64,
}

/// The stored cell at `c` in `store`.
fn stored_cell_in(store: &dyn StateRead, c: Coord) -> Result<Option<StoredCell>, StoreError> {
    match store
        .get(&keys::cell_key(c))
        .map_err(|e| storage_error(&e))?
    {
        None => Ok(None),
        Some(bytes) => StoredCell::decode(bytes.as_slice())
            .map(Some)
            .map_err(|e| corrupt("cell", &e)),
    }
}

/// The newest `recent` run records of `cell` (read at `coord` in `store`), newest first.
fn run_records(
    store: &dyn StateRead,
    coord: Coord,
    cell: &StoredCell,
    recent: usize,
) -> Result<Vec<RunRecord>, StoreError> {
    // Only the newest `recent` runs: older ones were removed (telemetry retention), and an
    // LSM store keeps removed keys as tombstones a scan from run 0 would walk through. And
    // none past the count read: the actor may apply more runs between the two reads, and
    // their records must not come under the older count.
    let first = cell.runs.saturating_sub(recent as u64).saturating_add(1);
    let s = keys::run_key(coord, first).to_vec();
    let e = keys::run_key(coord, cell.runs.saturating_add(1)).to_vec();
    let mut records = VecDeque::new();
    for item in store.range(&s, &e) {
        let (_, v) = item.map_err(|e| storage_error(&e))?;
        let run = walop::Run::decode(v.as_slice()).map_err(|e| corrupt("run", &e))?;
        records.push_front(RunRecord {
            ts_ms: run.ts_ms,
            principal: run.principal,
            input_digest: run.input_digest,
        });
        records.truncate(recent);
    }
    Ok(records.into())
}

/// How many times [`StateReader::runs`] reads a cell and its run records before it answers
/// with a read the actor's applies kept changing.
const RUNS_READ_ATTEMPTS: usize = 8;

impl StateReader {
    pub fn new(store: Arc<dyn StateBackend>, audit_retention: u64) -> StateReader {
        StateReader {
            store,
            audit_retention: audit_retention.max(1),
        }
    }

    pub(crate) fn stored_cell(&self, c: Coord) -> Result<Option<StoredCell>, StoreError> {
        stored_cell_in(&*self.store, c)
    }

    /// The applied cell at `coord`.
    pub fn read(&self, coord: &Coord) -> Result<Option<CellView>, StoreError> {
        Ok(self.stored_cell(*coord)?.map(view))
    }

    /// Up to `limit` cells of the inclusive box `[min, max]` in Morton order, resuming after a
    /// previous page when `token` is non-empty. Cost grows with the cells returned and the key
    /// ranges jumped over, not with the box's volume.
    pub fn region(
        &self,
        min: Coord,
        max: Coord,
        limit: usize,
        token: &[u8],
    ) -> Result<RegionPage, StoreError> {
        let (bounds, start) = region_start(min, max, token)?;
        let end = keys::cell_key_end_z(bounds.zmax());
        let budget = morton::ScanBudget {
            bytes: REGION_PAGE_BYTES,
            weight: |v: &Vec<u8>| v.len(),
            seeks: REGION_PAGE_SEEKS,
        };
        // One snapshot for the page's seeks, where the store has one: its plain reads see
        // every change as it is applied, so a page could hold a cell deleted before another
        // of its cells was written, two cells that never were there together.
        let snapshot = self.store.snapshot();
        let state = snapshot.as_deref().unwrap_or(&*self.store);
        let page = morton::scan_weighed(&bounds, start, limit, budget, |from| {
            let begin = keys::cell_key_z(from);
            state
                .range(&begin, &end)
                .map(|r| r.map(|(k, v)| (keys::cell_key_to_z(&k).unwrap_or(0), v)))
        })
        .map_err(|e| storage_error(&e))?;
        let next = match (page.more, page.resume_at, page.items.last()) {
            (false, _, _) => None,
            (true, Some(at), _) => Some(at),
            (true, None, last) => last.and_then(|(last, _)| morton::resume_after(*last)),
        };
        let next_token = next.map(|next| region_token(min, max, next));
        let mut cells = Vec::with_capacity(page.items.len());
        for (m, bytes) in page.items {
            let cell = StoredCell::decode(bytes.as_slice()).map_err(|e| corrupt("cell", &e))?;
            cells.push((keys::coord_of_z(m), view(cell)));
        }
        Ok(RegionPage { cells, next_token })
    }

    /// Breadth-first walk from `start` (excluded) over edges with one of `labels` (any label
    /// when empty), up to `max_depth` edges away and `limit` visits; each coordinate once.
    /// Returns the visits and whether `limit` (or [`WALK_MAX_STEPS`]) cut the walk short.
    pub fn walk(
        &self,
        start: Coord,
        max_depth: u32,
        limit: usize,
        labels: &[String],
    ) -> Result<(Vec<(Coord, u32)>, bool), StoreError> {
        let labels = walk_labels(labels)?;
        // One snapshot for the whole walk, as for a Region page: with the store's plain reads,
        // an edge unlinked before another was linked could both be followed.
        let snapshot = self.store.snapshot();
        let state = snapshot.as_deref().unwrap_or(&*self.store);
        let mut seen = HashSet::from([start]);
        let mut out = Vec::new();
        let mut frontier = vec![start];
        let mut steps = 0usize;
        for depth in 1..=max_depth {
            let mut next = Vec::new();
            for node in &frontier {
                let ranges: Vec<_> = if labels.is_empty() {
                    vec![keys::edges_from(*node, None)]
                } else {
                    labels
                        .iter()
                        .map(|l| keys::edges_from(*node, Some(l)))
                        .collect()
                };
                for (s, e) in ranges {
                    steps += 1;
                    if steps > WALK_MAX_STEPS {
                        return Ok((out, true));
                    }
                    for item in state.range(&s, &e) {
                        let (key, _) = item.map_err(|e| storage_error(&e))?;
                        steps += 1;
                        if steps > WALK_MAX_STEPS {
                            return Ok((out, true));
                        }
                        let Some(to) = keys::edge_target(&key) else {
                            continue;
                        };
                        if seen.insert(to) {
                            if out.len() == limit {
                                return Ok((out, true));
                            }
                            out.push((to, depth));
                            next.push(to);
                        }
                    }
                }
            }
            if next.is_empty() {
                break;
            }
            frontier = next;
        }
        Ok((out, false))
    }

    /// A cell's run count and its newest `recent` run records, newest first; `None` if there is
    /// no cell at `coord`.
    ///
    /// The cell and its records are separate reads, not a snapshot, and the actor may apply
    /// changes between them: a Run removes the oldest kept record (the page would hold one too
    /// few), a Delete, Prog and Runs would put the new program's records under the old count.
    /// So the cell is read again after its records, and all of it again (up to
    /// [`RUNS_READ_ATTEMPTS`] times) if it changed meanwhile.
    pub fn runs(
        &self,
        coord: Coord,
        recent: usize,
    ) -> Result<Option<(u64, Vec<RunRecord>)>, StoreError> {
        if let Some(snapshot) = self.store.snapshot() {
            let Some(cell) = stored_cell_in(&*snapshot, coord)? else {
                return Ok(None);
            };
            let records = run_records(&*snapshot, coord, &cell, recent)?;
            return Ok(Some((cell.runs, records)));
        }
        let store = &*self.store;
        let Some(mut cell) = stored_cell_in(store, coord)? else {
            return Ok(None);
        };
        for _ in 1..RUNS_READ_ATTEMPTS {
            let records = run_records(store, coord, &cell, recent)?;
            match stored_cell_in(store, coord)? {
                Some(again) if again == cell => return Ok(Some((cell.runs, records))),
                Some(again) => cell = again,
                None => return Ok(None),
            }
        }
        // A cell run this often: the last reads, whose records are still none past its count.
        let records = run_records(store, coord, &cell, recent)?;
        Ok(Some((cell.runs, records)))
    }

    /// Up to `limit` retained audit entries with `seq >= from_seq`, in order, decoded (for tests and
    /// tools: `Tenant.Audit` sends [`Self::audit_page_encoded`] as it is).
    pub fn audit_page(&self, from_seq: u64, limit: usize) -> Result<Vec<AuditEntry>, StoreError> {
        self.audit_page_encoded(from_seq, limit)?
            .iter()
            .map(|e| e.decode().map_err(|e| undecodable_audit(&e)))
            .collect()
    }

    /// [`Self::audit_page`] with each entry as it is stored: its encoding, sliced from the stored
    /// chunk without a copy, and its seq; only the seq is decoded. Blocking (it may wait a few
    /// milliseconds, see below): for a scan thread.
    pub fn audit_page_encoded(
        &self,
        from_seq: u64,
        limit: usize,
    ) -> Result<Vec<EncodedAuditEntry>, StoreError> {
        // Read from a snapshot where the store has one: its own reads see an applied group's
        // batch (its chunk, the trail's head, an expiry and the floor) key by key, so a page
        // could meet the head ahead of the chunk it announces, or a chunk gone before the floor
        // that explains it, and take a batch being applied for missing entries (the CI's
        // stress gate met one such DATA_LOSS in ~290,000 ops before pages read snapshots; a
        // batch expiring many chunks at once, after retention was lowered, takes longer to
        // apply than the retries below wait). Without a snapshot, entries really lost stay
        // lost: a gap is said only when it is still there when read again a moment later.
        let mut tries = 0;
        loop {
            let snapshot = self.store.snapshot();
            let view = snapshot.as_deref().unwrap_or(&*self.store);
            match self.audit_page_once(view, from_seq, limit) {
                Err(StoreError::DataLoss(_)) if tries < AUDIT_LOSS_RETRIES => {
                    tries += 1;
                    std::thread::sleep(std::time::Duration::from_millis(2));
                }
                page => return page,
            }
        }
    }

    /// One read of [`Self::audit_page_encoded`].
    fn audit_page_once(
        &self,
        store: &dyn StateRead,
        from_seq: u64,
        limit: usize,
    ) -> Result<Vec<EncodedAuditEntry>, StoreError> {
        let head = load_audit_head(store).map_err(|e| storage_error(&e))?;
        // Audit seqs start at 1.
        let from = from_seq
            .max(1)
            .max(head.next_seq.saturating_sub(self.audit_retention));
        if from >= head.next_seq || limit == 0 {
            return Ok(Vec::new());
        }
        // The chunk holding `from` starts at or before it, at most AUDIT_CHUNK_ENTRIES - 1
        // before (chunks are capped when written), so one forward scan from that window finds
        // it. A reverse seek (`get_lt`) in fjall's LSM tree took about a third of the server's
        // CPU in the A/B op mix (docs/benchmarks.md, "Audit pages and reverse seeks").
        let window = from.saturating_sub(AUDIT_CHUNK_ENTRIES as u64 - 1);
        let mut chunks = chunks_from(store, &keys::audit_key(window));
        // If no chunk starts in the window, usually the one holding `from` has just been expired
        // (`from` was the oldest retained entry when the head was read, and applies go on beside
        // this read): the page starts at the next chunk. Only a chunk written before chunks were
        // capped can start further back, and only then is it sought backwards.
        let window_empty = match chunks.peek() {
            Some(Ok((k, _))) => keys::audit_seq_of(k).is_none_or(|s| s > from),
            Some(Err(_)) => false,
            None => true,
        };
        if window_empty
            && from
                < audit_capped_from(store)
                    .map_err(|e| storage_error(&e))?
                    .unwrap_or(u64::MAX)
            && let Some((k, _)) = store
                .get_lt(&keys::audit_key(from + 1))
                .map_err(|e| storage_error(&e))?
                .filter(|(k, _)| keys::audit_seq_of(k).is_some())
        {
            chunks = chunks_from(store, &k);
        }
        let mut out = Vec::new();
        // The seq the page needs next.
        let mut expected = from;
        while let Some(item) = chunks.next() {
            let (_, v) = item?;
            // A chunk followed by another that starts at or before `from` holds nothing the
            // page needs: skip it without decoding.
            if let Some(Ok((next, _))) = chunks.peek()
                && keys::audit_seq_of(next).is_some_and(|s| s <= from)
            {
                continue;
            }
            let chunk = Bytes::from(v);
            for entry in keys::AuditChunkEntries::new(&chunk) {
                let (seq, at) = entry.map_err(|e| undecodable_audit(&e))?;
                if seq < expected {
                    continue;
                }
                if seq > expected {
                    // The scan is not a snapshot: expiry running beside it may remove chunks it
                    // has not reached yet. What follows such a gap is still a contiguous part
                    // of the retained trail, so the page restarts there instead of handing out
                    // a chain with entries missing. A gap that expiry does not explain is
                    // entries lost (or removed behind the server's back): said, not skipped,
                    // since a verifier could not tell a page that starts after it from one
                    // that starts where retention ends.
                    expired_before(store, expected, seq)?;
                    out.clear();
                }
                out.push(EncodedAuditEntry {
                    seq,
                    bytes: chunk.slice(at),
                });
                expected = seq + 1;
                if out.len() == limit {
                    return Ok(out);
                }
            }
        }
        // Every entry before the head read above was stored with it, in one batch.
        if expected < head.next_seq {
            expired_before(store, expected, head.next_seq)?;
        }
        Ok(out)
    }

    /// The applied totals and the head of the applied audit trail, read together (from one
    /// snapshot where the store has one): a client reading the trail after them finds every
    /// entry up to that head (`Tenant.Stats`'s `audit_last_seq`).
    pub fn totals(&self) -> Result<(Totals, AuditHead), StoreError> {
        let snapshot = self.store.snapshot();
        let state = snapshot.as_deref().unwrap_or(&*self.store);
        let totals = load_totals(state).map_err(|e| storage_error(&e))?;
        let head = load_audit_head(state).map_err(|e| storage_error(&e))?;
        Ok((totals, head))
    }
}

fn view(c: StoredCell) -> CellView {
    CellView {
        value: c.value,
        version: c.version,
        sealed: c.sealed,
    }
}

/// Reads again of an audit page that found entries missing before it says so (see
/// [`StateReader::audit_page_encoded`]).
const AUDIT_LOSS_RETRIES: u32 = 3;

fn undecodable_audit(e: &prost::DecodeError) -> StoreError {
    corrupt("audit entry", e)
}

/// One stored audit chunk: (key, encoded `AuditChunk`).
type Chunk = Result<(Vec<u8>, Vec<u8>), StoreError>;

/// Whether the audit entries from `first` up to (not including) `end`, which a page found
/// missing, have been expired by retention (all of them below the trail's floor, the first
/// seq of its oldest chunk, as it is now); if not, they are lost: DATA_LOSS.
fn expired_before(store: &dyn StateRead, first: u64, end: u64) -> Result<(), StoreError> {
    let floor = meta_u64(store, keys::META_AUDIT_FLOOR, "audit floor")
        .map_err(|e| storage_error(&e))?
        .unwrap_or(0);
    if end <= floor {
        return Ok(());
    }
    Err(StoreError::DataLoss(format!(
        "the audit trail is missing entries {first} to {}: they were not expired by retention \
         (--audit-retention) but are gone from the tenant's stored state, so the trail is \
         broken at seq {first}",
        end - 1
    )))
}

/// The floor of a store that has none recorded, recorded at once: from then on the floor is
/// always there, so its absence means a store no build of this version has opened. Builds
/// before 2026-12-04 kept no floor while expiring the trail's first chunks, and a page asking
/// for those entries (after `--audit-retention` was raised) took them for lost, DATA_LOSS;
/// there, the first chunk's start is where expiry left the trail (below it nothing is kept).
/// 0 when the trail is empty or starts at its first entry. (Builds of 2026-12-04 to 12-06
/// recorded a floor only once expiry moved it: in such a store whose first chunks were lost
/// behind the server's back, that loss is taken for expiry once, here, and logged.)
fn record_audit_floor(store: &dyn StateBackend) -> Result<u64, BackendError> {
    let first = store
        .range(&keys::audit_key(0), &keys::audit_end())
        .next()
        .transpose()?
        .and_then(|(k, _)| keys::audit_seq_of(&k));
    let floor = first.filter(|&f| f > 1).unwrap_or(0);
    store.apply(vec![BatchOp::Put(
        keys::META_AUDIT_FLOOR.to_vec(),
        floor.to_be_bytes().to_vec(),
    )])?;
    if floor > 0 {
        tracing::warn!(
            audit_floor = floor,
            "this tenant's store kept no audit floor (written by a build before 2026-12-06): \
             its trail starts at this seq, and the entries before it are taken as expired by \
             retention"
        );
    }
    Ok(floor)
}

/// Audit chunks from `start` to the end of the trail, as (key, value).
fn chunks_from<'a>(
    store: &'a dyn StateRead,
    start: &[u8],
) -> std::iter::Peekable<impl Iterator<Item = Chunk> + 'a> {
    store
        .range(start, &keys::audit_end())
        .map(|item| item.map_err(|e| storage_error(&e)))
        .peekable()
}

/// The first audit seq from which chunks are capped (`None` if no version with the cap has
/// applied anything to this store yet).
fn audit_capped_from(store: &dyn StateRead) -> Result<Option<u64>, BackendError> {
    meta_u64(store, keys::META_AUDIT_CAPPED_FROM, "audit capped-from seq")
}

/// A u64 (BE) stored at `key`, if any.
fn meta_u64(store: &dyn StateRead, key: &[u8], what: &str) -> Result<Option<u64>, BackendError> {
    store
        .get(key)?
        .map(|b| {
            b.as_slice()
                .try_into()
                .map(u64::from_be_bytes)
                .map_err(|_| BackendError(format!("{what} is not 8 bytes")))
        })
        .transpose()
}

/// (totals, applied seq, audit head) as stored.
fn load_meta(store: &dyn StateRead) -> Result<(Totals, u64, AuditHead), BackendError> {
    let applied = load_applied(store)?;
    Ok((load_totals(store)?, applied, load_audit_head(store)?))
}

/// The applied seq as stored.
fn load_applied(store: &dyn StateRead) -> Result<u64, BackendError> {
    let applied = match store.get(keys::META_APPLIED)? {
        None => 0,
        Some(b) => u64::from_be_bytes(
            b.as_slice()
                .try_into()
                .map_err(|_| BackendError("applied seq is not 8 bytes".into()))?,
        ),
    };
    // No log reaches past 2^48 - 1 (the WAL's record format): one above is damage, and taken
    // as it is, seq arithmetic after it would wrap.
    if applied >= 1 << 48 {
        return Err(BackendError(format!(
            "applied seq {applied} is beyond any log's: the stored state is damaged"
        )));
    }
    Ok(applied)
}

/// The totals as stored.
fn load_totals(store: &dyn StateRead) -> Result<Totals, BackendError> {
    match store.get(keys::META_TOTALS)? {
        None => Ok(Totals::empty()),
        Some(b) => Totals::decode(b.as_slice())
            .map_err(|e| BackendError(format!("undecodable totals: {e}"))),
    }
}

/// The head of the applied audit trail as stored: all an Audit page needs of the meta keys (each
/// read is a lookup through every run of the store).
fn load_audit_head(store: &dyn StateRead) -> Result<AuditHead, BackendError> {
    match store.get(keys::META_AUDIT_HEAD)? {
        None => Ok(AuditHead {
            next_seq: 1,
            hash: cube_auth::AUDIT_GENESIS.to_vec(),
        }),
        Some(b) => AuditHead::decode(b.as_slice())
            .map_err(|e| BackendError(format!("undecodable audit head: {e}"))),
    }
}

/// Whether an operation changes the catalog (the tenant's core applies that part).
fn is_catalog_op(op: Option<&Op>) -> bool {
    matches!(
        op,
        Some(Op::Caps(_) | Op::KeyRevoke(_) | Op::KeyCreate(_) | Op::Durability(_))
    )
}

/// The catalog changes kept in `store`, in seq order (see [`TenantState::catalog_pending`]).
fn catalog_pending(store: &dyn StateBackend) -> Result<Vec<(u64, WalOp)>, BackendError> {
    let (start, end) = keys::catalog_pending_range();
    store
        .range(&start, &end)
        .map(|pair| {
            let (key, value) = pair?;
            let seq = keys::catalog_pending_seq(&key)
                .ok_or_else(|| BackendError("malformed kept catalog change key".into()))?;
            let op = WalOp::decode(value.as_slice())
                .map_err(|e| BackendError(format!("undecodable kept catalog change: {e}")))?;
            Ok((seq, op))
        })
        .collect()
}

/// Delete the kept catalog changes `seqs` from `store`: only once the catalog holds them
/// durably. Not flushed here; a deletion lost to a crash only makes them again at the next open.
pub fn release_catalog_changes(store: &dyn StateBackend, seqs: &[u64]) -> Result<(), BackendError> {
    if seqs.is_empty() {
        return Ok(());
    }
    store.apply(
        seqs.iter()
            .map(|&seq| BatchOp::Remove(keys::catalog_pending_key(seq)))
            .collect(),
    )
}

/// A change logged but not applied yet, and the seq that will apply it.
#[derive(Debug, Clone)]
struct Pending<V> {
    seq: u64,
    value: V,
}

/// One tenant's state.
#[derive(Debug)]
pub struct TenantState {
    store: Arc<dyn StateBackend>,
    reader: StateReader,
    limits: StateLimits,
    pending_cells: HashMap<Coord, Pending<Option<StoredCell>>>,
    pending_edges: HashMap<Vec<u8>, Pending<bool>>,
    /// What each change logged and not applied yet adds to the stored bytes, by seq
    /// (ascending), and their sum: the logical stored bytes are the applied ones plus it.
    pending_growth: VecDeque<(u64, i64)>,
    pending_growth_sum: i64,
    applied_seq: u64,
    totals: Totals,
    applied_audit: AuditHead,
    /// Head of the audit chain including entries not applied yet, so consecutive changes in one
    /// batch chain correctly.
    audit_head: AuditHead,
    /// Every audit chunk starting below this seq has been removed: where expiry scans from.
    audit_floor: u64,
    /// Seqs of the catalog changes kept in the store (see [`TenantState::catalog_pending`]),
    /// ascending.
    catalog_kept: Vec<u64>,
    /// Written with the next applied batch when this store has no
    /// [`keys::META_AUDIT_CAPPED_FROM`] yet: the audit head at open.
    record_capped_from: Option<u64>,
}

impl TenantState {
    /// The state held by `store` (empty for a new one).
    pub fn open(
        store: Arc<dyn StateBackend>,
        limits: StateLimits,
    ) -> Result<TenantState, BackendError> {
        let (mut totals, applied_seq, head) = load_meta(&*store)?;
        if !totals.bytes_counted {
            // A store last written by a build that did not count its bytes: count them once,
            // and keep the count at once, so that readers (Tenant.Stats) see it too.
            let mut bytes = 0u64;
            for (start, end) in keys::counted_ranges() {
                for item in store.range(&start, &end) {
                    let (k, v) = item?;
                    bytes += (k.len() + v.len()) as u64;
                }
            }
            let (start, end) = keys::run_range();
            for item in store.range(&start, &end) {
                item?;
                bytes += keys::RUN_RECORD_BYTES;
            }
            totals.stored_bytes = bytes;
            totals.bytes_counted = true;
            store.apply(vec![BatchOp::Put(
                keys::META_TOTALS.to_vec(),
                totals.encode_to_vec(),
            )])?;
            tracing::info!(
                stored_bytes = bytes,
                "counted the bytes of the tenant's cells and edges (once, for a store written \
                 before they were counted)"
            );
        }
        // Chunks this version writes are capped; record from where, with the first apply.
        let record_capped_from = audit_capped_from(&*store)?
            .is_none()
            .then_some(head.next_seq);
        let catalog_kept = catalog_pending(&*store)?
            .into_iter()
            .map(|(seq, _)| seq)
            .collect();
        let audit_floor = match meta_u64(&*store, keys::META_AUDIT_FLOOR, "audit floor")? {
            Some(floor) => floor,
            None => record_audit_floor(&*store)?,
        };
        Ok(TenantState {
            catalog_kept,
            record_capped_from,
            reader: StateReader::new(Arc::clone(&store), limits.audit_retention),
            store,
            limits,
            pending_cells: HashMap::new(),
            pending_edges: HashMap::new(),
            pending_growth: VecDeque::new(),
            pending_growth_sum: 0,
            applied_seq,
            totals,
            applied_audit: head.clone(),
            audit_head: head,
            audit_floor,
        })
    }

    /// The catalog changes (key capabilities, keys created or revoked, durability) this store
    /// holds beside their effects, in seq order. Each applied catalog change is kept in its
    /// record's batch, so a store that is durable past the record still has it when the catalog's
    /// own write of it was lost: the tenant's open makes them again (they are idempotent) and lets
    /// them go once the catalog is durable ([`TenantState::release_catalog_changes`]).
    pub fn catalog_pending(&self) -> Result<Vec<(u64, WalOp)>, BackendError> {
        catalog_pending(&*self.store)
    }

    /// Whether catalog changes are kept that the catalog may not hold durably yet.
    pub fn has_catalog_changes(&self) -> bool {
        !self.catalog_kept.is_empty()
    }

    /// The kept catalog changes, to delete with [`release_catalog_changes`] once the catalog
    /// is durable (a checkpoint, an open). Taken out of the list now: the checkpoint that
    /// deletes them covers them, and one that fails poisons the tenant, whose reopen reads
    /// the store again.
    pub fn take_catalog_changes(&mut self) -> Vec<u64> {
        std::mem::take(&mut self.catalog_kept)
    }

    /// Highest WAL sequence number applied.
    pub fn applied_seq(&self) -> u64 {
        self.applied_seq
    }

    pub fn totals(&self) -> &Totals {
        &self.totals
    }

    /// A handle for reading the applied state from other threads.
    pub fn reader(&self) -> StateReader {
        self.reader.clone()
    }

    pub(crate) fn backend(&self) -> Arc<dyn StateBackend> {
        Arc::clone(&self.store)
    }

    /// Whether an apply now would not wait for the state store's flushes
    /// ([`StateBackend::has_room`]).
    pub(crate) fn has_room(&self) -> Result<bool, BackendError> {
        self.store.has_room()
    }

    /// [`StateBackend::room_notify`].
    pub(crate) fn room_notify(&self) -> Option<Arc<tokio::sync::Notify>> {
        self.store.room_notify()
    }

    /// [`TenantState::has_room`] starting nothing ([`StateBackend::room_as_is`]).
    pub(crate) fn room_as_is(&self) -> Result<bool, BackendError> {
        self.store.room_as_is()
    }

    fn logical_cell(&self, c: Coord) -> Result<Option<StoredCell>, StoreError> {
        if let Some(p) = self.pending_cells.get(&c) {
            return Ok(p.value.clone());
        }
        self.reader.stored_cell(c)
    }

    fn logical_edge(&self, key: &[u8]) -> Result<bool, StoreError> {
        if let Some(p) = self.pending_edges.get(key) {
            return Ok(p.value);
        }
        Ok(self
            .store
            .get(key)
            .map_err(|e| storage_error(&e))?
            .is_some())
    }

    /// Check `cmd` against the logical state and decide what to log. Every logged change carries
    /// its audit entry, chained to the logical head of the trail.
    pub fn prepare(&self, cmd: Command, caller: &Caller) -> Result<Prepared, StoreError> {
        cmd.check_arguments(self.limits.max_value)?;
        let stored = |c: Option<&StoredCell>| c.map_or(0, keys::cell_bytes) as i64;
        let (op, audit_op, detail, reply, effect, growth) = match cmd {
            Command::Read { coord } => {
                return Ok(Prepared::Immediate(Reply::Read(self.reader.read(&coord)?)));
            }
            Command::Write {
                coord,
                value,
                expected_version,
            } => {
                let prev = self.logical_cell(coord)?;
                check_writable(coord, prev.as_ref())?;
                let version = check_version(expected_version, prev.as_ref())? + 1;
                let detail = format!("coord={coord} version={version} bytes={}", value.len());
                let next = StoredCell {
                    value: value.clone(),
                    version,
                    sealed: false,
                    program: false,
                    runs: prev.as_ref().map_or(0, |p| p.runs),
                };
                let growth = stored(Some(&next)) - stored(prev.as_ref());
                self.check_quota(growth)?;
                let op = Op::Put(walop::Put {
                    coord: Some(coord.into()),
                    value,
                    version,
                });
                (
                    op,
                    "write",
                    detail,
                    Reply::Written { version, seq: 0 },
                    Effect::Cell(coord, Some(next), Hint::Known(prev)),
                    growth,
                )
            }
            Command::Prog { coord, program } => {
                let prev = self.logical_cell(coord)?;
                check_writable(coord, prev.as_ref())?;
                let version = prev.as_ref().map_or(0, |p| p.version) + 1;
                let detail = format!("coord={coord} version={version} bytes={}", program.len());
                let next = StoredCell {
                    value: program.clone(),
                    version,
                    sealed: false,
                    program: true,
                    runs: prev.as_ref().map_or(0, |p| p.runs),
                };
                let growth = stored(Some(&next)) - stored(prev.as_ref());
                self.check_quota(growth)?;
                let op = Op::Prog(walop::Prog {
                    coord: Some(coord.into()),
                    program,
                    version,
                });
                (
                    op,
                    "prog",
                    detail,
                    Reply::Programmed { version, seq: 0 },
                    Effect::Cell(coord, Some(next), Hint::Known(prev)),
                    growth,
                )
            }
            Command::Delete {
                coord,
                expected_version,
            } => {
                let prev = self.logical_cell(coord)?;
                // Sealed first, as for Write: a sealed cell is named as such whatever version
                // was expected.
                check_writable(coord, prev.as_ref())?;
                let version = check_version(expected_version, prev.as_ref())?;
                if prev.is_none() {
                    return Ok(Prepared::Immediate(Reply::Deleted {
                        existed: false,
                        seq: 0,
                    }));
                }
                let detail = format!("coord={coord} version={version}");
                let op = Op::Del(walop::Del {
                    coord: Some(coord.into()),
                });
                // The cell's run records go with it.
                let runs = prev
                    .as_ref()
                    .map_or(0, |p| p.runs.min(self.limits.telemetry_keep));
                let growth = -stored(prev.as_ref()) - (runs * keys::RUN_RECORD_BYTES) as i64;
                (
                    op,
                    "delete",
                    detail,
                    Reply::Deleted {
                        existed: true,
                        seq: 0,
                    },
                    Effect::Cell(coord, None, Hint::Known(prev)),
                    growth,
                )
            }
            Command::Run { coord, input } => {
                let Some(prev) = self.logical_cell(coord)?.filter(|c| c.program) else {
                    return Err(StoreError::FailedPrecondition(format!(
                        "cell {coord} holds no program; store one with Prog first"
                    )));
                };
                let run_count = prev.runs + 1;
                let input_digest = Sha256::digest(&input).to_vec();
                let detail = format!(
                    "coord={coord} run={run_count} input_sha256={}",
                    hex::encode(&input_digest)
                );
                let reply = Reply::Ran {
                    program: prev.value.clone(),
                    run_count,
                };
                let op = Op::Run(walop::Run {
                    coord: Some(coord.into()),
                    run_count,
                    ts_ms: caller.ts_ms,
                    principal: caller.principal.clone(),
                    input_digest,
                });
                let before = stored(Some(&prev));
                let next = StoredCell {
                    runs: run_count,
                    ..prev
                };
                // A run record more, until the cell keeps `telemetry_keep` (then each run's
                // pushes out the oldest); and a byte now and then (the run count's varint).
                let record = if run_count <= self.limits.telemetry_keep {
                    keys::RUN_RECORD_BYTES as i64
                } else {
                    0
                };
                let growth = stored(Some(&next)) - before + record;
                self.check_quota(growth)?;
                (
                    op,
                    "run",
                    detail,
                    reply,
                    Effect::Cell(coord, Some(next), Hint::Unknown),
                    growth,
                )
            }
            Command::Seal { coord } => {
                let Some(prev) = self.logical_cell(coord)? else {
                    return Err(StoreError::NotFound(format!("no cell at {coord} to seal")));
                };
                let digest = Sha256::digest(&prev.value).to_vec();
                let reply = Reply::Sealed {
                    digest: digest.clone(),
                    version: prev.version,
                };
                if prev.sealed {
                    return Ok(Prepared::Immediate(reply));
                }
                let detail = format!(
                    "coord={coord} version={} sha256={}",
                    prev.version,
                    hex::encode(&digest)
                );
                let op = Op::Seal(walop::Seal {
                    coord: Some(coord.into()),
                });
                let before = stored(Some(&prev));
                let next = StoredCell {
                    sealed: true,
                    ..prev
                };
                // The sealed flag's two bytes: a seal is never refused for them.
                let growth = stored(Some(&next)) - before;
                (
                    op,
                    "seal",
                    detail,
                    reply,
                    Effect::Cell(coord, Some(next), Hint::Unknown),
                    growth,
                )
            }
            Command::Link { from, to, label } => {
                let key = keys::edge_key(from, &label, to);
                if self.logical_edge(&key)? {
                    return Ok(Prepared::Immediate(Reply::Linked { created: false }));
                }
                let growth = keys::edge_bytes(&key) as i64;
                self.check_quota(growth)?;
                let detail = format!("from={from} to={to} label={label:?}");
                let op = Op::Link(walop::Edge {
                    from: Some(from.into()),
                    to: Some(to.into()),
                    label,
                });
                (
                    op,
                    "link",
                    detail,
                    Reply::Linked { created: true },
                    Effect::Edge(key, true),
                    growth,
                )
            }
            Command::Unlink { from, to, label } => {
                let key = keys::edge_key(from, &label, to);
                if !self.logical_edge(&key)? {
                    return Ok(Prepared::Immediate(Reply::Unlinked { existed: false }));
                }
                let growth = -(keys::edge_bytes(&key) as i64);
                let detail = format!("from={from} to={to} label={label:?}");
                let op = Op::Unlink(walop::Edge {
                    from: Some(from.into()),
                    to: Some(to.into()),
                    label,
                });
                (
                    op,
                    "unlink",
                    detail,
                    Reply::Unlinked { existed: true },
                    Effect::Edge(key, false),
                    growth,
                )
            }
            Command::Event { op, detail } => {
                return Ok(self.log(
                    Op::Event(walop::Event {}),
                    op,
                    detail,
                    Reply::Recorded { seq: 0 },
                    Effect::Nothing,
                    caller,
                ));
            }
            Command::ChangeCapabilities { .. }
            | Command::RevokeKey { .. }
            | Command::CreateKey { .. }
            | Command::SetDurability { .. }
            | Command::RecordCertificate { .. } => {
                return Err(StoreError::FailedPrecondition(
                    "catalog changes are made by the tenant's core, which has the catalog".into(),
                ));
            }
        };
        Ok(self
            .log(op, audit_op.to_string(), detail, reply, effect, caller)
            .with_growth(growth))
    }

    /// The tenant's stored bytes with the changes logged and not applied yet.
    pub fn logical_stored_bytes(&self) -> u64 {
        u64::try_from(i128::from(self.totals.stored_bytes) + i128::from(self.pending_growth_sum))
            .unwrap_or(0)
    }

    /// Refuse a change that would take the tenant's stored bytes past its quota; one that adds
    /// nothing passes, also over the quota (a write that shrinks a cell, say).
    fn check_quota(&self, growth: i64) -> Result<(), StoreError> {
        let quota = self.limits.max_bytes;
        if quota == 0 || growth <= 0 {
            return Ok(());
        }
        let now = self.logical_stored_bytes();
        if now.saturating_add(growth as u64) <= quota {
            return Ok(());
        }
        cube_metrics::QUOTA_REFUSALS.inc();
        Err(StoreError::ResourceExhausted(format!(
            "the tenant has reached its storage quota: its cells, edges and run records take \
             {now} of the {quota} bytes it may store (--tenant-max-bytes), and this change \
             would add {growth} more. Nothing was written. Delete cells or edges it no longer \
             needs, or ask the operator to raise the quota"
        )))
    }

    /// Log `key_id`'s new capability set `capabilities` (computed by the caller from the key's
    /// newest set) with its audit entry (`audit_op` "grant" or "revoke", `detail` what changed).
    pub(crate) fn prepare_capabilities(
        &self,
        key_id: String,
        capabilities: Vec<Capability>,
        audit_op: &str,
        detail: String,
        caller: &Caller,
    ) -> Prepared {
        let op = Op::Caps(walop::KeyCaps {
            key_id,
            capabilities: walop::caps_to_wire(&capabilities),
        });
        self.log(
            op,
            audit_op.to_string(),
            detail,
            Reply::Capabilities {
                capabilities,
                seq: 0,
            },
            Effect::Nothing,
            caller,
        )
    }

    /// Log the creation of `key` (a fresh id and secret) with its `key.create` audit entry,
    /// whose detail names the key, and its capabilities too when they include ADMIN (the usual
    /// key, read and write only, is named alone).
    pub(crate) fn prepare_key_creation(&self, key: &crate::KeyInfo, caller: &Caller) -> Prepared {
        let detail = if key.capabilities.contains(&Capability::Admin) {
            format!("key={} capabilities={:?}", key.key_id, key.capabilities)
        } else {
            format!("key={}", key.key_id)
        };
        let op = Op::KeyCreate(walop::KeyCreate {
            key_id: key.key_id.clone(),
            secret: key.secret.to_vec(),
            capabilities: walop::caps_to_wire(&key.capabilities),
        });
        self.log(
            op,
            "key.create".to_string(),
            detail,
            Reply::KeyCreated {
                key_id: key.key_id.clone(),
                secret: cube_auth::Secret::from_bytes(key.secret),
                capabilities: key.capabilities.clone(),
                seq: 0,
            },
            Effect::Nothing,
            caller,
        )
    }

    /// Log the tenant's new durability `policy` with its `durability` audit entry.
    pub(crate) fn prepare_durability(
        &self,
        policy: cube_wal::SyncPolicy,
        caller: &Caller,
    ) -> Prepared {
        self.log(
            Op::Durability(walop::Durability::from_policy(policy)),
            "durability".to_string(),
            format!("policy={}", crate::core::describe_policy(&policy)),
            Reply::Recorded { seq: 0 },
            Effect::Nothing,
            caller,
        )
    }

    /// Log the revocation of `key_id` with its `key.revoke` audit entry.
    pub(crate) fn prepare_key_revocation(&self, key_id: String, caller: &Caller) -> Prepared {
        let detail = format!("key={key_id}");
        self.log(
            Op::KeyRevoke(walop::KeyRevoke { key_id }),
            "key.revoke".to_string(),
            detail,
            Reply::KeyRevoked {
                revoked: true,
                seq: 0,
            },
            Effect::Nothing,
            caller,
        )
    }

    fn log(
        &self,
        op: Op,
        audit_op: String,
        detail: String,
        reply: Reply,
        effect: Effect,
        caller: &Caller,
    ) -> Prepared {
        let AuditHead {
            next_seq,
            hash: prev_hash,
        } = &self.audit_head;
        let hash = cube_auth::audit_hash(
            prev_hash,
            *next_seq,
            caller.ts_ms,
            &caller.principal,
            &audit_op,
            &detail,
        );
        let audit = WalAudit {
            seq: *next_seq,
            ts_ms: caller.ts_ms,
            principal: caller.principal.clone(),
            op: audit_op,
            detail,
            prev_hash: prev_hash.clone(),
            hash: hash.to_vec(),
        };
        Prepared::Log {
            op: WalOp {
                op: Some(op),
                audit: Some(audit),
            },
            reply,
            effect,
            growth: 0,
        }
    }

    /// Record that `op` (with the `effect` `prepare` computed) was logged as `seq` but is not
    /// applied yet.
    /// Returns what to pass to [`TenantState::apply_hinted`] with the record.
    pub fn note_pending(
        &mut self,
        seq: u64,
        op: &WalOp,
        effect: Effect,
        growth: i64,
    ) -> Option<(Coord, Hint)> {
        if growth != 0 {
            self.pending_growth.push_back((seq, growth));
            self.pending_growth_sum += growth;
        }
        if let Some(a) = &op.audit {
            self.audit_head = AuditHead {
                next_seq: a.seq + 1,
                hash: a.hash.clone(),
            };
        }
        match effect {
            Effect::Cell(c, value, hint) => {
                self.pending_cells.insert(c, Pending { seq, value });
                Some((c, hint))
            }
            Effect::Edge(key, value) => {
                self.pending_edges.insert(key, Pending { seq, value });
                None
            }
            Effect::Nothing => None,
        }
    }

    /// Apply records (ascending seqs) as one atomic batch. Records at or below the applied seq
    /// are skipped, so replaying a prefix twice is harmless. On error nothing is applied.
    pub fn apply_all(&mut self, records: Vec<(u64, WalOp)>) -> Result<(), ApplyError> {
        self.apply_hinted(records, Vec::new())
    }

    /// [`TenantState::apply_all`], told the previous state of cells that `prepare` already read
    /// (from [`TenantState::note_pending`]), so applying does not look them up again. A record's
    /// logical "before" is exactly the applied state when it is applied, because records apply
    /// in seq order.
    pub fn apply_hinted(
        &mut self,
        records: Vec<(u64, WalOp)>,
        hints: Vec<(Coord, Hint)>,
    ) -> Result<(), ApplyError> {
        // Only the first hint of a cell says what the applied state holds: the first record of
        // the group that touches it saw that state; later ones saw the group's own changes. A
        // first record without a hint (a Run, a Seal) leaves the cell to be read from the store,
        // whatever a later record's hint says.
        let mut known = HashMap::with_capacity(hints.len());
        let mut unhinted = std::collections::HashSet::new();
        for (c, hint) in hints {
            match hint {
                Hint::Known(prev) if !unhinted.contains(&c) => {
                    known.entry(c).or_insert(prev);
                }
                Hint::Known(_) => {}
                Hint::Unknown => {
                    if !known.contains_key(&c) {
                        unhinted.insert(c);
                    }
                }
            }
        }
        let mut txn = Txn {
            store: &*self.store,
            writes: HashMap::new(),
            known,
        };
        let mut totals = self.totals.clone();
        let mut head = self.applied_audit.clone();
        let mut floor = self.audit_floor;
        let mut last = self.applied_seq;
        let mut touched = Vec::with_capacity(records.len());
        let mut audits = Vec::new();
        let mut kept = Vec::new();
        for (seq, op) in records {
            if seq <= last {
                continue;
            }
            if is_catalog_op(op.op.as_ref()) {
                let change = WalOp {
                    op: op.op.clone(),
                    audit: None,
                };
                txn.put(keys::catalog_pending_key(seq), change.encode_to_vec());
                kept.push(seq);
            }
            let record = |detail: String| ApplyError::Record { seq, detail };
            if let Some(t) =
                apply_one(&mut txn, &mut totals, &self.limits, op.op).map_err(|e| match e {
                    ApplyError::Record { detail, .. } => record(detail),
                    other => other,
                })?
            {
                touched.push((t, seq));
            }
            if let Some(a) = op.audit {
                head = AuditHead {
                    next_seq: a.seq + 1,
                    hash: a.hash.clone(),
                };
                audits.push(a);
            }
            last = seq;
        }
        if last == self.applied_seq {
            return Ok(());
        }
        if !audits.is_empty() {
            // At most AUDIT_CHUNK_ENTRIES per chunk, so a page can find the chunk holding any
            // seq with a short forward scan (see `StateReader::audit_page_encoded`).
            let mut starts = Vec::with_capacity(audits.len().div_ceil(AUDIT_CHUNK_ENTRIES));
            let mut rest = audits.into_iter().peekable();
            while let Some(first) = rest.peek().map(|a| a.seq) {
                let entries: Vec<_> = rest.by_ref().take(AUDIT_CHUNK_ENTRIES).collect();
                txn.put(
                    keys::audit_key(first).to_vec(),
                    AuditChunk { entries }.encode_to_vec(),
                );
                starts.push(first);
            }
            floor = self.expire_audit(&mut txn, head.next_seq, &starts)?;
        }
        txn.put(keys::META_APPLIED.to_vec(), last.to_be_bytes().to_vec());
        txn.put(keys::META_TOTALS.to_vec(), totals.encode_to_vec());
        txn.put(keys::META_AUDIT_HEAD.to_vec(), head.encode_to_vec());
        if floor != self.audit_floor {
            txn.put(
                keys::META_AUDIT_FLOOR.to_vec(),
                floor.to_be_bytes().to_vec(),
            );
        }
        if let Some(seq) = self.record_capped_from {
            txn.put(
                keys::META_AUDIT_CAPPED_FROM.to_vec(),
                seq.to_be_bytes().to_vec(),
            );
        }
        let batch = txn.into_batch();
        self.store.apply(batch)?;
        self.catalog_kept.extend(kept);
        self.record_capped_from = None;
        self.audit_floor = floor;
        self.applied_seq = last;
        self.totals = totals;
        while let Some(&(seq, growth)) = self.pending_growth.front()
            && seq <= last
        {
            self.pending_growth.pop_front();
            self.pending_growth_sum -= growth;
        }
        // Records applied without `note_pending` (replayed at open, or applied before their
        // fsync under a relaxed policy) move the chain's head too: the next entry must follow
        // the newest one, not reuse its seq over it. Pending entries always come after the
        // applied ones, so this never moves the head back.
        if head.next_seq > self.audit_head.next_seq {
            self.audit_head = head.clone();
        }
        self.applied_audit = head;
        for (target, seq) in touched {
            match target {
                Target::Cell(c) => {
                    if self.pending_cells.get(&c).is_some_and(|p| p.seq <= seq) {
                        self.pending_cells.remove(&c);
                    }
                }
                Target::Edge(k) => {
                    if self.pending_edges.get(&k).is_some_and(|p| p.seq <= seq) {
                        self.pending_edges.remove(&k);
                    }
                }
            }
        }
        Ok(())
    }

    /// Remove the audit chunks wholly older than the retained window (the newest
    /// `audit_retention` entries before `next_seq`). `new_chunks`: the first seqs of the chunks
    /// this batch adds, ascending. Readers filter the boundary chunk, so they see exactly the
    /// window.
    fn expire_audit(
        &self,
        txn: &mut Txn<'_>,
        next_seq: u64,
        new_chunks: &[u64],
    ) -> Result<u64, ApplyError> {
        let retention = self.limits.audit_retention.max(1);
        let keep_from = next_seq.saturating_sub(retention);
        let step = (retention / 64).min(AUDIT_EXPIRY_STEP_MAX);
        if keep_from <= 1 || keep_from < self.audit_floor.saturating_add(step) {
            return Ok(self.audit_floor);
        }
        // Chunks starting at or before `keep_from`: all but the last of them end before it. The
        // scan starts at the floor, not at 0: below it are only removed chunks, which an LSM
        // store keeps as tombstones until compaction, so scanning them on every apply would
        // make each apply slower than the last.
        // At most AUDIT_EXPIRY_CHUNKS_MAX removed per apply: after `--audit-retention` was
        // lowered, one apply would otherwise remove (and scan) every chunk below the new
        // window at once, on the actor's thread other tenants share; the next applies go on
        // from the floor this one leaves.
        let mut starts = Vec::new();
        for item in self
            .store
            .range(
                &keys::audit_key(self.audit_floor),
                &keys::audit_key(keep_from + 1),
            )
            .take(AUDIT_EXPIRY_CHUNKS_MAX + 1)
        {
            starts.push(item?.0);
        }
        if starts.len() <= AUDIT_EXPIRY_CHUNKS_MAX {
            for &first in new_chunks.iter().filter(|&&first| first <= keep_from) {
                starts.push(keys::audit_key(first).to_vec());
            }
        }
        let floor = starts
            .pop()
            .and_then(|k| keys::audit_seq_of(&k))
            .unwrap_or(self.audit_floor);
        for key in starts {
            txn.remove(key);
        }
        Ok(floor)
    }

    /// Drop every pending change: its records will never be applied (poisoned shard).
    pub fn discard_pending(&mut self) {
        self.pending_cells.clear();
        self.pending_edges.clear();
        self.pending_growth.clear();
        self.pending_growth_sum = 0;
        self.audit_head = self.applied_audit.clone();
    }

    /// The applied cell at `coord`.
    pub fn read(&self, coord: &Coord) -> Result<Option<CellView>, StoreError> {
        self.reader.read(coord)
    }
}

/// What an applied record touched (to retire its overlay entry).
enum Target {
    Cell(Coord),
    Edge(Vec<u8>),
}

/// Writes of one batch, readable before they are committed.
struct Txn<'a> {
    store: &'a dyn StateBackend,
    writes: HashMap<Vec<u8>, Option<Vec<u8>>>,
    /// Cells whose applied state `prepare` already read.
    known: HashMap<Coord, Option<StoredCell>>,
}

impl Txn<'_> {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, BackendError> {
        match self.writes.get(key) {
            Some(v) => Ok(v.clone()),
            None => self.store.get(key),
        }
    }

    fn cell(&self, c: Coord) -> Result<Option<StoredCell>, ApplyError> {
        let key = keys::cell_key(c);
        if !self.writes.contains_key(key.as_slice())
            && let Some(prev) = self.known.get(&c)
        {
            return Ok(prev.clone());
        }
        match self.get(&key)? {
            None => Ok(None),
            Some(b) => StoredCell::decode(b.as_slice())
                .map(Some)
                // Damaged data, which a reopen would find again: the record cannot be applied
                // (a backend failure, retried by a reopen, would retry for ever).
                .map_err(|e| bad(&format!("a stored cell it changes does not decode ({e})"))),
        }
    }

    fn put(&mut self, key: Vec<u8>, value: Vec<u8>) {
        self.writes.insert(key, Some(value));
    }

    fn remove(&mut self, key: Vec<u8>) {
        self.writes.insert(key, None);
    }

    fn into_batch(self) -> Vec<BatchOp> {
        self.writes
            .into_iter()
            .map(|(k, v)| match v {
                Some(v) => BatchOp::Put(k, v),
                None => BatchOp::Remove(k),
            })
            .collect()
    }
}

fn bad(detail: &str) -> ApplyError {
    ApplyError::Record {
        seq: 0,
        detail: detail.to_string(),
    }
}

fn coord_of(c: Option<&WalCoord>) -> Result<Coord, ApplyError> {
    c.map(Coord::from)
        .ok_or_else(|| bad("record has no coordinate"))
}

/// Apply one operation to `txn`, keeping `totals` in step.
fn apply_one(
    txn: &mut Txn<'_>,
    totals: &mut Totals,
    limits: &StateLimits,
    op: Option<Op>,
) -> Result<Option<Target>, ApplyError> {
    fn set_cell(
        txn: &mut Txn<'_>,
        totals: &mut Totals,
        c: Coord,
        prev: Option<StoredCell>,
        next: Option<StoredCell>,
    ) -> Option<Target> {
        totals.change(prev.as_ref(), next.as_ref());
        match next {
            Some(n) => txn.put(keys::cell_key(c).to_vec(), n.encode_to_vec()),
            None => txn.remove(keys::cell_key(c).to_vec()),
        }
        Some(Target::Cell(c))
    }
    Ok(match op {
        Some(Op::Put(p)) => {
            let c = coord_of(p.coord.as_ref())?;
            let prev = txn.cell(c)?;
            let next = StoredCell {
                value: p.value,
                version: p.version,
                sealed: false,
                program: false,
                runs: prev.as_ref().map_or(0, |p| p.runs),
            };
            set_cell(txn, totals, c, prev, Some(next))
        }
        Some(Op::Prog(p)) => {
            let c = coord_of(p.coord.as_ref())?;
            let prev = txn.cell(c)?;
            let next = StoredCell {
                value: p.program,
                version: p.version,
                sealed: false,
                program: true,
                runs: prev.as_ref().map_or(0, |p| p.runs),
            };
            set_cell(txn, totals, c, prev, Some(next))
        }
        Some(Op::Del(d)) => {
            let c = coord_of(d.coord.as_ref())?;
            let prev = txn.cell(c)?;
            // The cell's run telemetry goes with it.
            if let Some(p) = &prev {
                let first = p.runs.saturating_sub(limits.telemetry_keep) + 1;
                for n in first..=p.runs {
                    txn.remove(keys::run_key(c, n).to_vec());
                }
                let kept = p.runs.min(limits.telemetry_keep);
                totals.stored_bytes = totals
                    .stored_bytes
                    .saturating_sub(kept * keys::RUN_RECORD_BYTES);
            }
            set_cell(txn, totals, c, prev, None)
        }
        Some(Op::Seal(s)) => {
            let c = coord_of(s.coord.as_ref())?;
            let prev = txn.cell(c)?.ok_or_else(|| bad("seal of a missing cell"))?;
            let next = StoredCell {
                sealed: true,
                ..prev.clone()
            };
            set_cell(txn, totals, c, Some(prev), Some(next))
        }
        Some(Op::Run(r)) => {
            let c = coord_of(r.coord.as_ref())?;
            let prev = txn
                .cell(c)?
                .filter(|p| p.program)
                .ok_or_else(|| bad("run of a cell without a program"))?;
            let n = r.run_count;
            txn.put(keys::run_key(c, n).to_vec(), r.encode_to_vec());
            match n.checked_sub(limits.telemetry_keep).filter(|o| *o > 0) {
                Some(old) => txn.remove(keys::run_key(c, old).to_vec()),
                None => totals.stored_bytes += keys::RUN_RECORD_BYTES,
            }
            totals.runs += 1;
            let next = StoredCell {
                runs: n,
                ..prev.clone()
            };
            set_cell(txn, totals, c, Some(prev), Some(next))
        }
        Some(Op::Link(e)) => {
            let key = edge_key_of(&e)?;
            if txn.get(&key)?.is_none() {
                totals.edges += 1;
                totals.stored_bytes += keys::edge_bytes(&key);
                txn.put(key.clone(), Vec::new());
            }
            Some(Target::Edge(key))
        }
        Some(Op::Unlink(e)) => {
            let key = edge_key_of(&e)?;
            if txn.get(&key)?.is_some() {
                totals.edges = totals.edges.saturating_sub(1);
                totals.stored_bytes = totals.stored_bytes.saturating_sub(keys::edge_bytes(&key));
                txn.remove(key.clone());
            }
            Some(Target::Edge(key))
        }
        Some(Op::Event(_)) => None,
        // The catalog's part is applied by the tenant's core (see `TenantCore::apply_caps`).
        Some(Op::Caps(c)) => {
            if walop::caps_from_wire(&c.capabilities).is_none() {
                return Err(bad("record names an unknown capability"));
            }
            None
        }
        Some(Op::KeyRevoke(_)) => None,
        Some(Op::Durability(d)) => {
            if d.policy().is_none() {
                return Err(bad("record holds a malformed durability policy"));
            }
            None
        }
        Some(Op::KeyCreate(k)) => {
            if k.secret.len() != 32 || walop::caps_from_wire(&k.capabilities).is_none() {
                return Err(bad("record holds a malformed key"));
            }
            None
        }
        None => return Err(bad("record holds no known operation")),
    })
}

fn edge_key_of(e: &walop::Edge) -> Result<Vec<u8>, ApplyError> {
    let from = coord_of(e.from.as_ref())?;
    let to = coord_of(e.to.as_ref())?;
    if e.label.is_empty() || e.label.len() > MAX_LABEL_BYTES {
        return Err(bad("edge label out of bounds"));
    }
    Ok(keys::edge_key(from, &e.label, to))
}

fn check_label(label: &str) -> Result<(), StoreError> {
    if label.is_empty() || label.len() > MAX_LABEL_BYTES {
        return Err(StoreError::InvalidArgument(format!(
            "edge label must be 1 to {MAX_LABEL_BYTES} bytes of UTF-8; got {} bytes",
            label.len()
        )));
    }
    Ok(())
}

fn check_writable(coord: Coord, cell: Option<&StoredCell>) -> Result<(), StoreError> {
    if cell.is_some_and(|c| c.sealed) {
        return Err(StoreError::FailedPrecondition(format!(
            "cell {coord} is sealed and cannot change"
        )));
    }
    Ok(())
}

/// The cell's version (0 = no cell), if it matches `expected`.
fn check_version(expected: Option<u64>, cell: Option<&StoredCell>) -> Result<u64, StoreError> {
    let actual = cell.map_or(0, |c| c.version);
    match expected {
        Some(e) if e != actual => Err(StoreError::FailedPrecondition(format!(
            "version mismatch: expected {e}, the cell is at version {actual}{}",
            if actual == 0 { " (no cell)" } else { "" }
        ))),
        _ => Ok(actual),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use proptest::prelude::*;

    use super::*;
    use crate::backend::MemBackend;

    fn who() -> Caller {
        Caller {
            principal: "t/k".into(),
            ts_ms: 7,
        }
    }

    const C: Coord = Coord {
        x: -1,
        y: 0,
        z: i32::MAX,
    };

    fn fresh(max_value: usize) -> TenantState {
        fresh_with(max_value, 100)
    }

    fn fresh_with(max_value: usize, audit_retention: u64) -> TenantState {
        TenantState::open(
            Arc::new(MemBackend::default()),
            StateLimits {
                max_value,
                audit_retention,
                telemetry_keep: 3,
                max_bytes: 0,
            },
        )
        .unwrap()
    }

    /// The stored bytes of `store`'s cells and edges, and its run records' charge, counted from
    /// scratch.
    fn recount(store: &dyn StateBackend) -> u64 {
        let cells_and_edges: u64 = keys::counted_ranges()
            .iter()
            .flat_map(|(start, end)| store.range(start, end))
            .map(|item| {
                let (k, v) = item.unwrap();
                (k.len() + v.len()) as u64
            })
            .sum();
        let (start, end) = keys::run_range();
        let runs = store.range(&start, &end).count() as u64;
        cells_and_edges + runs * keys::RUN_RECORD_BYTES
    }

    /// A tenant plus a WAL stand-in: records logged and not yet applied.
    struct Harness {
        s: TenantState,
        seq: u64,
        unapplied: Vec<(u64, WalOp)>,
        hints: Vec<(Coord, Hint)>,
    }

    impl Harness {
        fn new(s: TenantState) -> Harness {
            Harness {
                s,
                seq: 0,
                unapplied: Vec::new(),
                hints: Vec::new(),
            }
        }

        /// Prepare and log; the change is applied at the next `flush`.
        fn submit(&mut self, cmd: Command) -> Result<Reply, StoreError> {
            match self.s.prepare(cmd, &who())? {
                Prepared::Immediate(r) => Ok(r),
                Prepared::Log {
                    op,
                    reply,
                    effect,
                    growth,
                } => {
                    self.seq += 1;
                    let hint = self.s.note_pending(self.seq, &op, effect, growth);
                    self.hints.extend(hint);
                    self.unapplied.push((self.seq, op));
                    Ok(Prepared::seal(reply, self.seq))
                }
            }
        }

        fn flush(&mut self) {
            let batch = std::mem::take(&mut self.unapplied);
            let hints = std::mem::take(&mut self.hints);
            // What the pending changes were counted as must be what applying them stores.
            let logical = self.s.logical_stored_bytes();
            // Half the batches without hints, so both apply paths meet the model.
            if batch.len().is_multiple_of(2) {
                self.s.apply_hinted(batch, hints).unwrap();
            } else {
                self.s.apply_all(batch).unwrap();
            }
            assert_eq!(self.s.totals().stored_bytes, logical);
            assert_eq!(self.s.logical_stored_bytes(), logical);
        }

        fn run(&mut self, cmd: Command) -> Result<Reply, StoreError> {
            let r = self.submit(cmd);
            self.flush();
            r
        }
    }

    fn write(c: Coord, v: &[u8]) -> Command {
        Command::Write {
            coord: c,
            value: v.to_vec(),
            expected_version: None,
        }
    }

    #[test]
    fn write_read_delete_with_versions() {
        let mut h = Harness::new(fresh(16));
        assert_eq!(h.run(Command::Read { coord: C }), Ok(Reply::Read(None)));
        assert_eq!(
            h.run(write(C, b"a")),
            Ok(Reply::Written { version: 1, seq: 1 })
        );
        assert_eq!(
            h.run(write(C, b"a")),
            Ok(Reply::Written { version: 2, seq: 2 })
        );
        assert_eq!(
            h.run(Command::Read { coord: C }),
            Ok(Reply::Read(Some(CellView {
                value: b"a".to_vec(),
                version: 2,
                sealed: false
            })))
        );
        let del = Command::Delete {
            coord: C,
            expected_version: None,
        };
        assert_eq!(
            h.run(del.clone()),
            Ok(Reply::Deleted {
                existed: true,
                seq: 3
            })
        );
        assert_eq!(
            h.run(del),
            Ok(Reply::Deleted {
                existed: false,
                seq: 0
            })
        );
    }

    /// A compare-and-delete repeated after it took effect is a version mismatch naming the
    /// missing cell (as cells.proto and protocol.md's "Retrying" tell clients), and changes
    /// nothing; expecting version 0 of a missing cell deletes nothing and succeeds.
    #[test]
    fn a_repeated_compare_and_delete_names_the_missing_cell() {
        let mut h = Harness::new(fresh(16));
        h.run(write(C, b"a")).unwrap();
        let del = |expected_version| Command::Delete {
            coord: C,
            expected_version: Some(expected_version),
        };
        assert_eq!(
            h.run(del(1)),
            Ok(Reply::Deleted {
                existed: true,
                seq: 2
            })
        );
        match h.run(del(1)) {
            Err(StoreError::FailedPrecondition(m)) => assert_eq!(
                m,
                "version mismatch: expected 1, the cell is at version 0 (no cell)"
            ),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            h.run(del(0)),
            Ok(Reply::Deleted {
                existed: false,
                seq: 0
            })
        );
        assert_eq!(h.run(Command::Read { coord: C }), Ok(Reply::Read(None)));
    }

    fn link(from: Coord, to: Coord, label: &str) -> Command {
        Command::Link {
            from,
            to,
            label: label.into(),
        }
    }

    /// The stored bytes follow every kind of change (cells grown, shrunk, programmed, run,
    /// sealed and deleted; edges linked and unlinked) and match a count from scratch.
    #[test]
    fn stored_bytes_follow_every_change_and_match_a_recount() {
        let backend: Arc<dyn StateBackend> = Arc::new(MemBackend::default());
        let mut h =
            Harness::new(TenantState::open(Arc::clone(&backend), StateLimits::default()).unwrap());
        let d = Coord { x: 1, y: 2, z: 3 };
        for cmd in [
            write(C, &[1; 100]),
            write(C, &[2; 10]),
            write(d, b"x"),
            Command::Prog {
                coord: d,
                program: vec![3; 50],
            },
            Command::Run {
                coord: d,
                input: Vec::new(),
            },
            Command::Seal { coord: C },
            link(C, d, "l"),
            link(d, C, "m"),
            Command::Unlink {
                from: C,
                to: d,
                label: "l".into(),
            },
            Command::Delete {
                coord: d,
                expected_version: None,
            },
        ] {
            h.run(cmd.clone()).unwrap();
            assert_eq!(h.s.totals().stored_bytes, recount(&*backend), "{cmd:?}");
        }
        // What is left: the sealed cell C and the edge d -m-> C.
        assert!(h.s.totals().stored_bytes > 0);
    }

    /// With a quota, a Write, Prog or Link that would take the stored bytes past it is
    /// RESOURCE_EXHAUSTED and logs nothing, changes logged and not applied yet counted; a change
    /// that adds nothing passes, and a deletion makes room at once.
    #[test]
    fn the_storage_quota_refuses_growth_past_it_counting_pending_changes() {
        let limits = StateLimits {
            max_bytes: 300,
            ..StateLimits::default()
        };
        let mut h =
            Harness::new(TenantState::open(Arc::new(MemBackend::default()), limits).unwrap());
        let d = Coord { x: 1, y: 2, z: 3 };
        let e = Coord { x: 5, y: 5, z: 5 };
        // A cell of 100 bytes takes 117: its 13-byte key, the value's 102 and the version's 2.
        h.submit(write(C, &[1; 100])).unwrap();
        h.submit(write(d, &[1; 100])).unwrap();
        assert_eq!(h.s.logical_stored_bytes(), 234);
        assert_eq!(h.s.totals().stored_bytes, 0, "both still pending");
        let logged = h.seq;
        let refused = h.submit(write(e, &[1; 100])).unwrap_err();
        let StoreError::ResourceExhausted(m) = &refused else {
            panic!("{refused:?}");
        };
        assert!(
            m.contains("storage quota") && m.contains("234 of the 300 bytes"),
            "{m}"
        );
        let prog = Command::Prog {
            coord: e,
            program: vec![1; 100],
        };
        assert!(matches!(
            h.submit(prog),
            Err(StoreError::ResourceExhausted(_))
        ));
        // An edge with a 64-byte label takes 90 bytes.
        assert!(matches!(
            h.submit(link(C, d, &"l".repeat(64))),
            Err(StoreError::ResourceExhausted(_))
        ));
        assert_eq!(h.seq, logged, "refused changes are not logged");
        h.flush();
        assert_eq!(h.s.totals().stored_bytes, 234);
        h.run(link(C, d, "l")).unwrap();
        // The same size again adds nothing: passes at any fill.
        h.run(write(C, &[2; 100])).unwrap();
        assert!(matches!(
            h.submit(write(C, &[2; 150])),
            Err(StoreError::ResourceExhausted(_))
        ));
        // A deletion still pending makes room for the next write.
        h.submit(Command::Delete {
            coord: d,
            expected_version: None,
        })
        .unwrap();
        h.submit(write(e, &[1; 100])).unwrap();
        h.flush();
        assert_eq!(h.s.totals().stored_bytes, 117 + 27 + 117);
    }

    /// Run records count too: a tenant at its quota cannot fill its disk with the 16 records
    /// each program cell keeps (empty programs, run 16 times each, stored ~75 times the
    /// cells' own bytes uncounted). Once a cell keeps 16, a run adds only what its count takes.
    #[test]
    fn run_records_count_toward_the_storage_quota() {
        let limits = StateLimits {
            max_bytes: 4_000,
            telemetry_keep: 16,
            ..StateLimits::default()
        };
        let backend: Arc<dyn StateBackend> = Arc::new(MemBackend::default());
        let mut h = Harness::new(TenantState::open(Arc::clone(&backend), limits).unwrap());
        let mut refused = None;
        'fill: for x in 0..100 {
            let coord = Coord { x, y: 0, z: 0 };
            let prog = Command::Prog {
                coord,
                program: Vec::new(),
            };
            if let Err(e) = h.run(prog) {
                refused = Some(e);
                break;
            }
            for _ in 0..16 {
                if let Err(e) = h.run(Command::Run {
                    coord,
                    input: Vec::new(),
                }) {
                    refused = Some(e);
                    break 'fill;
                }
            }
        }
        assert!(
            matches!(refused, Some(StoreError::ResourceExhausted(_))),
            "{refused:?}"
        );
        let stored = h.s.totals().stored_bytes;
        assert_eq!(stored, recount(&*backend));
        assert!(stored <= 4_000, "{stored}");
        // What the records really take stays under what they count for.
        let (start, end) = keys::run_range();
        let real: usize = backend
            .range(&start, &end)
            .map(|i| i.map(|(k, v)| k.len() + v.len()).unwrap())
            .sum();
        assert!(real > 0 && real <= 4_000, "{real}");
    }

    /// [`keys::RUN_RECORD_BYTES`] is at least what the largest run record takes: the longest
    /// tenant name, a generated key id, the largest coordinates, count and time.
    #[test]
    fn the_run_record_charge_covers_the_largest_record() {
        let principal = format!("{}/k-{}", "t".repeat(63), "f".repeat(12));
        let run = walop::Run {
            coord: Some(WalCoord {
                x: i32::MIN,
                y: i32::MIN,
                z: i32::MIN,
            }),
            run_count: u64::MAX,
            ts_ms: i64::MAX,
            principal,
            input_digest: vec![0xff; 32],
        };
        let c = Coord {
            x: i32::MIN,
            y: 0,
            z: 0,
        };
        let size = keys::run_key(c, u64::MAX).len() + run.encoded_len();
        assert!(size as u64 <= keys::RUN_RECORD_BYTES, "{size}");
    }

    /// A store whose totals an older build wrote (without the stored bytes) has them counted at
    /// its open and kept at once, so that readers see them too.
    #[test]
    fn a_store_from_before_the_byte_count_is_counted_at_its_open() {
        let backend: Arc<dyn StateBackend> = Arc::new(MemBackend::default());
        let mut h =
            Harness::new(TenantState::open(Arc::clone(&backend), StateLimits::default()).unwrap());
        h.run(write(C, &[1; 40])).unwrap();
        h.run(link(C, C, "self")).unwrap();
        let counted = h.s.totals().stored_bytes;
        assert_eq!(counted, recount(&*backend));
        let old = Totals {
            stored_bytes: 0,
            bytes_counted: false,
            ..h.s.totals().clone()
        };
        backend
            .apply(vec![BatchOp::Put(
                keys::META_TOTALS.to_vec(),
                old.encode_to_vec(),
            )])
            .unwrap();
        drop(h);
        assert_eq!(
            StateReader::new(Arc::clone(&backend), 100)
                .totals()
                .unwrap()
                .0
                .stored_bytes,
            0
        );
        let reopened = TenantState::open(Arc::clone(&backend), StateLimits::default()).unwrap();
        assert_eq!(reopened.totals().stored_bytes, counted);
        let (kept, _) = reopened.reader().totals().unwrap();
        assert_eq!(kept.stored_bytes, counted);
        assert!(kept.bytes_counted);
    }

    #[test]
    fn compare_and_set_checks_the_logical_version_and_reads_see_only_applied() {
        let mut h = Harness::new(fresh(16));
        let cas = |v| Command::Write {
            coord: C,
            value: vec![],
            expected_version: Some(v),
        };
        assert!(
            matches!(h.run(cas(1)), Err(StoreError::FailedPrecondition(m)) if m.contains("expected 1"))
        );
        assert!(h.run(cas(0)).is_ok());
        // A second CAS while the first is only pending must see version 2, not 1.
        assert!(h.submit(cas(1)).is_ok());
        assert!(matches!(
            h.submit(cas(1)),
            Err(StoreError::FailedPrecondition(_))
        ));
        assert_eq!(h.s.read(&C).unwrap().unwrap().version, 1);
        h.flush();
        assert_eq!(h.s.read(&C).unwrap().unwrap().version, 2);
    }

    /// A stored applied seq beyond any log's (damage) refuses the state at open, rather than
    /// wrapping the seq arithmetic after it.
    #[test]
    fn an_applied_seq_beyond_any_log_is_refused() {
        let backend: Arc<dyn StateBackend> = Arc::new(MemBackend::default());
        backend
            .apply(vec![BatchOp::Put(
                keys::META_APPLIED.to_vec(),
                u64::MAX.to_be_bytes().to_vec(),
            )])
            .unwrap();
        let limits = StateLimits {
            max_value: 16,
            audit_retention: 100,
            telemetry_keep: 3,
            max_bytes: 0,
        };
        assert!(TenantState::open(backend, limits).is_err());
    }

    /// A cell's run count and its run records come from two reads, and the actor may apply
    /// more runs in between: a record past the count read is not returned under it (Stats
    /// showed run 21's telemetry under a count of 20).
    #[test]
    fn run_records_past_the_count_read_are_left_out() {
        use prost::Message;
        let mut h = Harness::new(fresh(16));
        h.run(Command::Prog {
            coord: C,
            program: b"p".to_vec(),
        })
        .unwrap();
        for _ in 0..3 {
            h.run(Command::Run {
                coord: C,
                input: vec![],
            })
            .unwrap();
        }
        // Run 4's record, stored as if applied after the cell was read.
        let fourth = walop::Run {
            run_count: 4,
            principal: "later".into(),
            ..Default::default()
        };
        h.s.store
            .apply(vec![BatchOp::Put(
                keys::run_key(C, 4).to_vec(),
                fourth.encode_to_vec(),
            )])
            .unwrap();
        let (count, records) = h.s.reader().runs(C, 16).unwrap().unwrap();
        assert_eq!(count, 3);
        assert_eq!(records.len(), 3);
        assert!(
            records.iter().all(|r| r.principal != "later"),
            "{records:?}"
        );
    }

    /// `StateBackend` for a test store that wraps `inner` (an `Arc<dyn StateBackend>`): its
    /// applies go to `inner`, it flushes nothing; further methods (a `snapshot`) may be given.
    macro_rules! writes_to_inner {
        ($store:ty $(, $more:item)*) => {
            impl StateBackend for $store {
                $($more)*
                fn apply(&self, batch: Vec<BatchOp>) -> Result<(), BackendError> {
                    self.inner.apply(batch)
                }
                fn flush(&self) -> Result<(), BackendError> {
                    Ok(())
                }
                fn size_on_disk(&self) -> u64 {
                    0
                }
            }
        };
    }

    /// A store that runs `between` once, just before its first range scan: a change the actor
    /// applies between a reader's reads.
    struct ChangedBetween {
        inner: Arc<dyn StateBackend>,
        between: std::sync::Mutex<Option<Box<dyn FnOnce() + Send>>>,
    }

    impl std::fmt::Debug for ChangedBetween {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("ChangedBetween").finish_non_exhaustive()
        }
    }

    impl StateRead for ChangedBetween {
        fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, BackendError> {
            self.inner.get(key)
        }
        fn range(&self, start: &[u8], end: &[u8]) -> crate::backend::RangeIter<'_> {
            let between = self.between.lock().unwrap().take();
            if let Some(between) = between {
                between();
            }
            self.inner.range(start, end)
        }
        fn get_lt(&self, key: &[u8]) -> Result<Option<(Vec<u8>, Vec<u8>)>, BackendError> {
            self.inner.get_lt(key)
        }
    }

    writes_to_inner!(ChangedBetween);

    /// A Run applied between the read of a cell and the scan of its run records (which is
    /// not a snapshot) removes the oldest kept record: the answer must still be the count
    /// and the records of one state. Before, it had the old count with one record missing.
    #[test]
    fn run_records_and_their_count_come_from_one_state() {
        let mut h = Harness::new(fresh(16));
        let run = |i: u8| Command::Run {
            coord: C,
            input: vec![i],
        };
        h.run(Command::Prog {
            coord: C,
            program: b"p".to_vec(),
        })
        .unwrap();
        for i in 1..=5 {
            h.run(run(i)).unwrap(); // telemetry_keep = 3: runs 3, 4 and 5 kept
        }
        let store = Arc::clone(&h.s.store);
        let h = Arc::new(std::sync::Mutex::new(h));
        let actor = Arc::clone(&h);
        let racing = StateReader::new(
            Arc::new(ChangedBetween {
                inner: store,
                between: std::sync::Mutex::new(Some(Box::new(move || {
                    actor.lock().unwrap().run(run(6)).unwrap(); // removes run 3's record
                }))),
            }),
            100,
        );
        let (count, records) = racing.runs(C, 16).unwrap().unwrap();
        let digests: Vec<_> = records.iter().map(|r| r.input_digest.clone()).collect();
        assert_eq!(
            (count, digests),
            (
                6,
                [6u8, 5, 4]
                    .iter()
                    .map(|i| Sha256::digest([*i]).to_vec())
                    .collect()
            )
        );
    }

    #[test]
    fn sealed_cells_refuse_changes_and_run_needs_a_program() {
        let mut h = Harness::new(fresh(16));
        assert!(matches!(
            h.run(Command::Seal { coord: C }),
            Err(StoreError::NotFound(_))
        ));
        h.run(write(C, b"abc")).unwrap();
        assert!(matches!(
            h.run(Command::Run { coord: C, input: vec![] }),
            Err(StoreError::FailedPrecondition(m)) if m.contains("no program")
        ));
        let Ok(Reply::Sealed { digest, version }) = h.run(Command::Seal { coord: C }) else {
            panic!()
        };
        assert_eq!(digest, Sha256::digest(b"abc").to_vec());
        assert_eq!(version, 1);
        // Sealing again is answered without a change.
        assert_eq!(
            h.submit(Command::Seal { coord: C }),
            Ok(Reply::Sealed { digest, version: 1 })
        );
        assert!(h.unapplied.is_empty());
        for cmd in [
            write(C, b"x"),
            Command::Delete {
                coord: C,
                expected_version: None,
            },
            // A wrong expected version too: sealed is what a client can act on (it named the
            // version mismatch before, and Write the seal).
            Command::Delete {
                coord: C,
                expected_version: Some(99),
            },
            Command::Write {
                coord: C,
                value: b"x".to_vec(),
                expected_version: Some(99),
            },
            Command::Prog {
                coord: C,
                program: b"p".to_vec(),
            },
        ] {
            assert!(
                matches!(h.run(cmd), Err(StoreError::FailedPrecondition(m)) if m.contains("sealed"))
            );
        }
        assert!(h.s.read(&C).unwrap().unwrap().sealed);
        assert_eq!(h.s.totals().sealed, 1);
    }

    #[test]
    fn runs_count_in_one_batch_and_keep_recent_telemetry() {
        let mut h = Harness::new(fresh(16));
        h.run(Command::Prog {
            coord: C,
            program: b"prog".to_vec(),
        })
        .unwrap();
        for i in 1..=5u8 {
            // Unflushed: each run must see the previous one's count.
            assert_eq!(
                h.submit(Command::Run {
                    coord: C,
                    input: vec![i],
                }),
                Ok(Reply::Ran {
                    program: b"prog".to_vec(),
                    run_count: u64::from(i)
                })
            );
        }
        h.flush();
        let (count, recent) = h.s.reader().runs(C, 10).unwrap().unwrap();
        assert_eq!(count, 5);
        // telemetry_keep = 3, newest first.
        let digests: Vec<_> = recent.iter().map(|r| r.input_digest.clone()).collect();
        assert_eq!(
            digests,
            vec![
                Sha256::digest([5u8]).to_vec(),
                Sha256::digest([4u8]).to_vec(),
                Sha256::digest([3u8]).to_vec()
            ]
        );
        assert_eq!(recent[0].principal, "t/k");
        assert_eq!(h.s.totals().runs, 5);
    }

    /// A program run five times, then deleted, stored again and run once, all of the latter in
    /// one batch: the new cell's count starts again at 1 and its telemetry holds only its own
    /// run (the delete removes the old cell's records, the batch's run adds one), and the
    /// tenant's counted bytes match a recount.
    #[test]
    fn a_cell_deleted_and_made_again_in_one_batch_keeps_only_its_own_runs() {
        let mut h = Harness::new(fresh(16));
        let prog = || Command::Prog {
            coord: C,
            program: b"prog".to_vec(),
        };
        let run = |i: u8| Command::Run {
            coord: C,
            input: vec![i],
        };
        h.run(prog()).unwrap();
        for i in 1..=5u8 {
            h.submit(run(i)).unwrap();
        }
        h.flush();
        h.submit(Command::Delete {
            coord: C,
            expected_version: None,
        })
        .unwrap();
        h.submit(prog()).unwrap();
        assert_eq!(
            h.submit(run(9)),
            Ok(Reply::Ran {
                program: b"prog".to_vec(),
                run_count: 1
            })
        );
        h.flush();
        let (count, recent) = h.s.reader().runs(C, 10).unwrap().unwrap();
        assert_eq!(count, 1);
        let digests: Vec<_> = recent.iter().map(|r| r.input_digest.clone()).collect();
        assert_eq!(digests, vec![Sha256::digest([9u8]).to_vec()]);
        assert_eq!(h.s.totals().stored_bytes, recount(&*h.s.backend()));
    }

    #[test]
    fn changes_in_one_batch_chain_their_audit_entries_and_retention_holds() {
        let mut h = Harness::new(fresh_with(16, 3));
        h.submit(write(C, b"a")).unwrap();
        h.submit(write(C, b"b")).unwrap();
        h.submit(Command::Event {
            op: "grant".into(),
            detail: "key=k2".into(),
        })
        .unwrap();
        h.flush();
        let trail = h.s.reader().audit_page(0, 10).unwrap();
        assert_eq!(
            trail.iter().map(|e| e.seq).collect::<Vec<_>>(),
            vec![1, 2, 3]
        );
        assert_eq!(trail[0].prev_hash, cube_auth::AUDIT_GENESIS.to_vec());
        for pair in trail.windows(2) {
            assert_eq!(pair[1].prev_hash, pair[0].hash);
        }
        for e in &trail {
            assert_eq!(
                e.hash,
                cube_auth::audit_hash(&e.prev_hash, e.seq, e.ts_ms, &e.principal, &e.op, &e.detail)
                    .to_vec()
            );
        }
        h.run(write(C, b"c")).unwrap();
        let trail = h.s.reader().audit_page(0, 10).unwrap();
        assert_eq!(
            trail.iter().map(|e| e.seq).collect::<Vec<_>>(),
            vec![2, 3, 4]
        );
        assert_eq!(h.s.reader().audit_page(3, 1).unwrap()[0].seq, 3);
        // Entries are stored one chunk per applied group; older chunks go once wholly outside
        // the window, and paging from inside a chunk starts exactly at the asked seq.
        for v in [b"d", b"e", b"f", b"g"] {
            h.run(write(C, v)).unwrap();
        }
        let seqs = |from, limit| page_seqs(&h.s.reader(), from, limit);
        assert_eq!(seqs(0, 10), vec![6, 7, 8]);
        assert_eq!(seqs(7, 10), vec![7, 8]);
        assert_eq!(seqs(9, 10), Vec::<u64>::new());
        let chunks =
            h.s.store
                .range(&keys::audit_key(0), &keys::audit_end())
                .count();
        assert!(chunks <= 4, "{chunks} audit chunks kept for a window of 3");
    }

    /// A store whose range scans may miss one key (as a scan racing the actor's audit expiry
    /// does, or as a store that lost it would; with `once`, only the first scan misses it, as
    /// a scan racing the batch that writes it can: reads are not a snapshot), counting reverse
    /// seeks; `floor`, if set, is the audit floor it reports (what an expiry racing the scan
    /// would have stored).
    #[derive(Debug)]
    struct Observed {
        inner: Arc<dyn StateBackend>,
        vanished: Option<Vec<u8>>,
        once: bool,
        floor: Option<u64>,
        seeks: std::sync::atomic::AtomicUsize,
        scans: std::sync::atomic::AtomicUsize,
    }

    impl Observed {
        fn new(inner: &Arc<dyn StateBackend>, vanished: Option<Vec<u8>>) -> Arc<Observed> {
            Observed::expired(inner, vanished, None)
        }

        fn expired(
            inner: &Arc<dyn StateBackend>,
            vanished: Option<Vec<u8>>,
            floor: Option<u64>,
        ) -> Arc<Observed> {
            Arc::new(Observed {
                inner: Arc::clone(inner),
                vanished,
                once: false,
                floor,
                seeks: Default::default(),
                scans: Default::default(),
            })
        }

        /// Only its first range scan misses `missed`.
        fn missed_once(inner: &Arc<dyn StateBackend>, missed: Vec<u8>) -> Arc<Observed> {
            Arc::new(Observed {
                inner: Arc::clone(inner),
                vanished: Some(missed),
                once: true,
                floor: None,
                seeks: Default::default(),
                scans: Default::default(),
            })
        }

        fn seeks(&self) -> usize {
            self.seeks.load(std::sync::atomic::Ordering::Relaxed)
        }
    }

    impl StateRead for Observed {
        fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, BackendError> {
            match self.floor {
                Some(floor) if key == keys::META_AUDIT_FLOOR => {
                    Ok(Some(floor.to_be_bytes().to_vec()))
                }
                _ => self.inner.get(key),
            }
        }
        fn range(&self, start: &[u8], end: &[u8]) -> crate::backend::RangeIter<'_> {
            let first = self
                .scans
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                == 0;
            let misses = first || !self.once;
            Box::new(self.inner.range(start, end).filter(move |r| {
                !(misses && matches!(r, Ok((k, _)) if Some(k) == self.vanished.as_ref()))
            }))
        }
        fn get_lt(&self, key: &[u8]) -> Result<Option<(Vec<u8>, Vec<u8>)>, BackendError> {
            self.seeks
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.inner.get_lt(key)
        }
    }

    writes_to_inner!(Observed);

    /// Replay at open and the relaxed policy's early apply hand records to `apply_all` without
    /// `note_pending`; the next change's audit entry must still follow theirs.
    #[test]
    fn an_entry_after_records_applied_without_note_pending_continues_the_chain() {
        let mut s = fresh(16);
        let mut logged = Vec::new();
        for seq in 1..=3 {
            let Ok(Prepared::Log { op, .. }) = s.prepare(write(C, b"v"), &who()) else {
                panic!("a write is logged")
            };
            s.apply_all(vec![(seq, op.clone())]).unwrap();
            logged.push(op.audit.unwrap());
        }
        let seqs: Vec<u64> = logged.iter().map(|a| a.seq).collect();
        assert_eq!(seqs, vec![1, 2, 3]);
        for pair in logged.windows(2) {
            assert_eq!(pair[1].prev_hash, pair[0].hash);
        }
        let trail = s.reader().audit_page(1, 10).unwrap();
        assert_eq!(trail.len(), 3, "{trail:?}");
    }

    /// A chunk that vanishes from under a page's scan because expiry removed it meanwhile (the
    /// floor moved past it) leaves the page the contiguous part after it.
    #[test]
    fn an_audit_page_never_hands_out_a_chain_with_entries_missing() {
        let mut h = Harness::new(fresh_with(16, 100));
        for v in [b"a", b"b", b"c", b"d"] {
            h.run(write(C, v)).unwrap(); // one chunk per applied group: seqs 1, 2, 3, 4
        }
        let racing = StateReader::new(
            Observed::expired(&h.s.store, Some(keys::audit_key(2).to_vec()), Some(3)),
            100,
        );
        let seqs: Vec<u64> = racing
            .audit_page(1, 10)
            .unwrap()
            .iter()
            .map(|e| e.seq)
            .collect();
        assert_eq!(seqs, vec![3, 4], "the part after the gap, contiguous");
        let page = racing.audit_page(1, 2).unwrap();
        assert_eq!(page.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![3, 4]);
        assert_eq!(page[1].prev_hash, page[0].hash);
    }

    /// A store whose own reads miss `hidden` (as a batch being applied shows in part to
    /// fjall's plain reads) and whose snapshot sees everything.
    #[derive(Debug)]
    struct PartlyApplied {
        inner: Arc<dyn StateBackend>,
        hidden: Vec<u8>,
    }

    /// The whole of a store, as a snapshot.
    struct Whole<'a>(&'a dyn StateBackend);

    impl StateRead for Whole<'_> {
        fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, BackendError> {
            self.0.get(key)
        }
        fn range(&self, start: &[u8], end: &[u8]) -> crate::backend::RangeIter<'_> {
            self.0.range(start, end)
        }
        fn get_lt(&self, key: &[u8]) -> Result<Option<(Vec<u8>, Vec<u8>)>, BackendError> {
            self.0.get_lt(key)
        }
    }

    impl StateRead for PartlyApplied {
        fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, BackendError> {
            self.inner.get(key)
        }
        fn range(&self, start: &[u8], end: &[u8]) -> crate::backend::RangeIter<'_> {
            Box::new(
                self.inner
                    .range(start, end)
                    .filter(|r| !matches!(r, Ok((k, _)) if *k == self.hidden)),
            )
        }
        fn get_lt(&self, key: &[u8]) -> Result<Option<(Vec<u8>, Vec<u8>)>, BackendError> {
            self.inner.get_lt(key)
        }
    }

    writes_to_inner!(
        PartlyApplied,
        fn snapshot(&self) -> Option<Box<dyn StateRead + '_>> {
            Some(Box::new(Whole(&*self.inner)))
        }
    );

    /// An audit page reads one snapshot where the store has one: the store's own reads could
    /// see a batch being applied in part, and a page took that for entries lost (DATA_LOSS)
    /// once the batch took longer to apply than its retries waited.
    #[test]
    fn an_audit_page_reads_whole_batches_where_the_store_has_snapshots() {
        let mut h = Harness::new(fresh_with(16, 100));
        for v in [b"a", b"b", b"c", b"d"] {
            h.run(write(C, v)).unwrap(); // one chunk per applied group: seqs 1, 2, 3, 4
        }
        let reader = StateReader::new(
            Arc::new(PartlyApplied {
                inner: Arc::clone(&h.s.store),
                hidden: keys::audit_key(2).to_vec(),
            }),
            100,
        );
        let seqs: Vec<u64> = reader
            .audit_page(1, 10)
            .unwrap()
            .iter()
            .map(|e| e.seq)
            .collect();
        assert_eq!(seqs, vec![1, 2, 3, 4]);
    }

    /// A cell's run count and records come from one snapshot where the store has one: its
    /// own reads could see a Run's batch in part (one record removed, the count not yet
    /// raised), which the read-again check cannot see.
    #[test]
    fn run_records_come_from_a_snapshot_where_the_store_has_one() {
        let mut h = Harness::new(fresh(16));
        h.run(Command::Prog {
            coord: C,
            program: b"p".to_vec(),
        })
        .unwrap();
        for i in 1..=5 {
            h.run(Command::Run {
                coord: C,
                input: vec![i],
            })
            .unwrap(); // telemetry_keep = 3: runs 3, 4 and 5 kept
        }
        let reader = StateReader::new(
            Arc::new(PartlyApplied {
                inner: Arc::clone(&h.s.store),
                hidden: keys::run_key(C, 3).to_vec(),
            }),
            100,
        );
        let (count, records) = reader.runs(C, 16).unwrap().unwrap();
        assert_eq!((count, records.len()), (5, 3));
    }

    /// A Region page and a Walk each read one snapshot where the store has one: the store's
    /// own reads could see a batch being applied in part (here: one cell, one edge not yet).
    #[test]
    fn region_pages_and_walks_read_whole_batches_where_the_store_has_snapshots() {
        let mut h = Harness::new(fresh(16));
        let at = |x| Coord { x, y: 0, z: 0 };
        let (a, b, c) = (at(0), at(1), at(2));
        for cell in [a, b, c] {
            h.run(write(cell, b"v")).unwrap();
        }
        let link = |from, to| Command::Link {
            from,
            to,
            label: "l".into(),
        };
        h.run(link(a, b)).unwrap();
        h.run(link(b, c)).unwrap();
        let hiding = |hidden: Vec<u8>| {
            StateReader::new(
                Arc::new(PartlyApplied {
                    inner: Arc::clone(&h.s.store),
                    hidden,
                }),
                100,
            )
        };
        let page = hiding(keys::cell_key(b).to_vec())
            .region(a, c, 10, &[])
            .unwrap();
        assert_eq!(
            page.cells.iter().map(|(at, _)| *at).collect::<Vec<_>>(),
            vec![a, b, c]
        );
        let (visits, cut) = hiding(keys::edge_key(b, "l", c))
            .walk(a, 5, 10, &[])
            .unwrap();
        assert_eq!((visits, cut), (vec![(b, 1), (c, 2)], false));
    }

    /// A tenant whose cell `C` was written, then its stored bytes damaged (they do not decode).
    fn with_a_damaged_cell() -> Harness {
        let mut h = Harness::new(fresh(16));
        h.run(write(C, b"a")).unwrap();
        h.s.store
            .apply(vec![BatchOp::Put(
                keys::cell_key(C).to_vec(),
                vec![0xff; 7],
            )])
            .unwrap();
        h
    }

    /// A stored cell that does not decode (damaged data) is DATA_LOSS when read, by a Read or a
    /// Region page: no retry reads it, unlike a failed read of the storage (UNAVAILABLE).
    #[test]
    fn an_undecodable_stored_cell_is_data_loss() {
        let h = with_a_damaged_cell();
        let reader = h.s.reader();
        let read = reader.read(&C);
        assert!(
            matches!(&read, Err(StoreError::DataLoss(m)) if m.contains("stored cell")),
            "{read:?}"
        );
        let page = reader.region(C, C, 10, &[]);
        assert!(
            matches!(&page, Err(StoreError::DataLoss(_))),
            "{:?}",
            page.err()
        );
    }

    /// A change to a cell whose stored bytes do not decode cannot be applied, for good (a
    /// reopen would meet them again): a record error, not a backend failure to retry.
    #[test]
    fn a_change_to_an_undecodable_stored_cell_cannot_be_applied() {
        let mut h = with_a_damaged_cell();
        let op = |v: &[u8]| WalOp {
            op: Some(Op::Put(walop::Put {
                coord: Some(C.into()),
                value: v.to_vec(),
                version: 2,
            })),
            audit: None,
        };
        let applied = h.s.apply_all(vec![(9, op(b"b"))]);
        assert!(
            matches!(&applied, Err(ApplyError::Record { seq: 9, detail }) if detail.contains("does not decode")),
            "{applied:?}"
        );
    }

    /// A page whose first read misses a chunk that is there (a batch being applied beside it)
    /// reads again and answers the whole page, not DATA_LOSS. (It answered DATA_LOSS: the CI's
    /// stress gate met one.)
    #[test]
    fn a_chunk_missed_by_one_read_is_not_data_loss() {
        let mut h = Harness::new(fresh_with(16, 100));
        for v in [b"a", b"b", b"c", b"d"] {
            h.run(write(C, v)).unwrap(); // one chunk per applied group: seqs 1, 2, 3, 4
        }
        for missed in [2, 4] {
            let racing = StateReader::new(
                Observed::missed_once(&h.s.store, keys::audit_key(missed).to_vec()),
                100,
            );
            assert_eq!(
                page_seqs(&racing, 1, 10),
                vec![1, 2, 3, 4],
                "chunk {missed}"
            );
        }
    }

    /// A read that met damaged stored data (a block failing its checksum) is DATA_LOSS, which
    /// no retry mends; any other failed read is UNAVAILABLE. Neither passes the storage's own
    /// text to the client.
    #[test]
    fn a_damaged_block_is_data_loss_and_a_failed_read_unavailable() {
        let root = tempfile::tempdir().unwrap();
        let damaged = crate::backend::tests::damaged_read_error(root.path());
        match storage_error(&damaged) {
            StoreError::DataLoss(m) => {
                assert!(m.contains("damaged where this call reads"), "{m}");
                assert!(!m.contains(&damaged.0), "{m}");
            }
            other => panic!("{other:?}"),
        }
        let failed = BackendError("Io(Os { code: 5 })".into());
        match storage_error(&failed) {
            StoreError::Unavailable(m) => assert!(!m.contains("Os"), "{m}"),
            other => panic!("{other:?}"),
        }
    }

    /// Entries gone from the trail that retention did not expire (at its start, in its middle or
    /// at its end) are DATA_LOSS naming them, not a page that starts or ends elsewhere: a
    /// verifier cannot tell such a page from a trail that retention shortened. (Pages restarted
    /// after any gap until 2026-12-05, so a trail whose first chunks were removed verified.)
    #[test]
    fn audit_entries_missing_without_expiry_are_data_loss() {
        let mut h = Harness::new(fresh_with(16, 100));
        for v in [b"a", b"b", b"c", b"d"] {
            h.run(write(C, v)).unwrap(); // one chunk per applied group: seqs 1, 2, 3, 4
        }
        for (lost, from) in [(1, 0), (2, 0), (2, 2), (4, 1), (4, 4)] {
            let damaged = StateReader::new(
                Observed::new(&h.s.store, Some(keys::audit_key(lost).to_vec())),
                100,
            );
            let page = damaged.audit_page(from, 10);
            assert!(
                matches!(&page, Err(StoreError::DataLoss(m))
                    if m.contains(&format!("missing entries {lost} to {lost}"))),
                "chunk {lost} gone, page from {from}: {page:?}"
            );
        }
        // Expired (below the floor), the first chunk is no loss; nor is one outside the page.
        let expired = StateReader::new(
            Observed::expired(&h.s.store, Some(keys::audit_key(1).to_vec()), Some(2)),
            100,
        );
        assert_eq!(page_seqs(&expired, 0, 10), vec![2, 3, 4]);
        let damaged = StateReader::new(
            Observed::new(&h.s.store, Some(keys::audit_key(4).to_vec())),
            100,
        );
        assert_eq!(page_seqs(&damaged, 1, 2), vec![1, 2]);
    }

    /// The seqs of one audit page.
    fn page_seqs(reader: &StateReader, from: u64, limit: usize) -> Vec<u64> {
        reader
            .audit_page(from, limit)
            .unwrap()
            .iter()
            .map(|e| e.seq)
            .collect()
    }

    /// `n` writes applied in one batch (one audit group).
    fn write_as_one_group(h: &mut Harness, n: u8) {
        for i in 0..n {
            h.submit(write(C, &[i])).unwrap();
        }
        h.flush();
    }

    #[test]
    fn large_applied_groups_are_split_and_every_page_starts_at_its_seq_without_a_seek() {
        let mut h = Harness::new(fresh_with(16, 1000));
        // Groups of 1, 40 and 17 changes, each applied as one batch.
        for group in [1, 40, 17] {
            write_as_one_group(&mut h, group);
        }
        let chunks: Vec<usize> =
            h.s.store
                .range(&keys::audit_key(0), &keys::audit_end())
                .map(|r| {
                    AuditChunk::decode(r.unwrap().1.as_slice())
                        .unwrap()
                        .entries
                        .len()
                })
                .collect();
        assert_eq!(chunks, vec![1, 16, 16, 8, 16, 1]);
        let counting = Observed::new(&h.s.store, None);
        let reader = StateReader::new(counting.clone(), 1000);
        for from in 0..=60u64 {
            for limit in [1usize, 5, 100] {
                let want: Vec<u64> = (from.max(1)..=58).take(limit).collect();
                assert_eq!(
                    page_seqs(&reader, from, limit),
                    want,
                    "from {from} limit {limit}"
                );
            }
        }
        assert_eq!(
            counting.seeks(),
            0,
            "a page found its chunk with a reverse seek"
        );
    }

    #[test]
    fn a_page_inside_a_long_chunk_from_an_older_version_still_starts_at_its_seq() {
        let mut h = Harness::new(fresh_with(16, 1000));
        write_as_one_group(&mut h, 40);
        // Rewrite the trail as one chunk of 40 entries, as versions before the cap stored it.
        let mut entries = Vec::new();
        let mut old = Vec::new();
        for r in h.s.store.range(&keys::audit_key(0), &keys::audit_end()) {
            let (k, v) = r.unwrap();
            entries.extend(AuditChunk::decode(v.as_slice()).unwrap().entries);
            old.push(crate::backend::BatchOp::Remove(k));
        }
        assert_eq!(entries.len(), 40);
        // Older versions wrote no capped-from marker.
        old.push(crate::backend::BatchOp::Remove(
            keys::META_AUDIT_CAPPED_FROM.to_vec(),
        ));
        old.push(crate::backend::BatchOp::Put(
            keys::audit_key(1).to_vec(),
            AuditChunk { entries }.encode_to_vec(),
        ));
        h.s.store.apply(old).unwrap();
        for from in [1u64, 17, 30, 40] {
            let want: Vec<u64> = (from..=40).take(3).collect();
            assert_eq!(page_seqs(&h.s.reader(), from, 3), want, "from {from}");
        }
    }

    #[test]
    fn a_page_from_an_expired_chunk_starts_at_the_oldest_kept_entry_without_a_seek() {
        let mut h = Harness::new(fresh_with(16, 5));
        for i in 0..30u8 {
            h.run(write(C, &[i])).unwrap(); // one chunk per entry; expiry keeps seqs 26..=30
        }
        // A reader that believes more is retained asks for entries that expiry has removed,
        // as a page racing the actor's expiry does.
        let counting = Observed::new(&h.s.store, None);
        let seqs = page_seqs(&StateReader::new(counting.clone(), 1000), 3, 100);
        assert_eq!(seqs, vec![26, 27, 28, 29, 30]);
        assert_eq!(counting.seeks(), 0);
    }

    /// With a retention of 640 expiry runs in steps of 10 entries: readers still see exactly
    /// the window, and at most a step (plus the boundary chunk) more is stored.
    #[test]
    fn expiry_in_steps_stores_little_more_than_the_window_and_shows_exactly_it() {
        let mut h = Harness::new(fresh_with(16, 640));
        let stored = |h: &Harness| {
            h.s.store
                .range(&keys::audit_key(0), &keys::audit_end())
                .count()
        };
        let mut most = 0;
        for i in 0..1000u32 {
            h.run(write(C, &i.to_be_bytes()[2..])).unwrap(); // one chunk per entry
            most = most.max(stored(&h));
            if i % 97 == 0 || i == 999 {
                let seqs = page_seqs(&h.s.reader(), 0, 1000);
                let next = u64::from(i) + 2;
                let first = next.saturating_sub(640).max(1);
                assert_eq!(
                    seqs,
                    (first..next).collect::<Vec<_>>(),
                    "after {} writes",
                    i + 1
                );
            }
        }
        // Expiry waited for a step (more than the window and its boundary chunk was stored),
        // and never let more than a step pile up.
        assert!(most > 640 + 1, "expiry ran on every apply");
        assert!(
            most <= 640 + 10 + 1,
            "{most} chunks stored for a window of 640"
        );
        assert!(stored(&h) >= 640);
        // The floor is kept with the batch that moved it: a reopened store starts its next
        // expiry scan there, not at 0 across every removed chunk's tombstone.
        assert!(h.s.audit_floor > 0);
        let reopened = TenantState::open(Arc::clone(&h.s.store), h.s.limits).unwrap();
        assert_eq!(reopened.audit_floor, h.s.audit_floor);
    }

    /// A store whose floor was not recorded (written by a build that kept none) gets it at
    /// open from its first chunk: a page asking for expired entries, after the retention was
    /// raised, starts where the trail does instead of reporting them lost.
    #[test]
    fn a_store_without_a_recorded_floor_gets_it_from_its_first_chunk() {
        let mut h = Harness::new(fresh_with(16, 5));
        for i in 0..30u8 {
            h.run(write(C, &[i])).unwrap(); // one chunk per entry; expiry keeps seqs 26..=30
        }
        let floor = h.s.audit_floor;
        assert!(floor > 1);
        h.s.store
            .apply(vec![BatchOp::Remove(keys::META_AUDIT_FLOOR.to_vec())])
            .unwrap();
        let limits = StateLimits {
            audit_retention: 1000,
            ..h.s.limits
        };
        h.s = TenantState::open(Arc::clone(&h.s.store), limits).unwrap();
        assert_eq!(h.s.audit_floor, floor);
        assert_eq!(page_seqs(&h.s.reader(), 0, 100), vec![26, 27, 28, 29, 30]);
        assert_eq!(
            meta_u64(&*h.s.store, keys::META_AUDIT_FLOOR, "audit floor").unwrap(),
            Some(floor),
            "the floor found is recorded"
        );
        // A trail that starts at its first entry has floor 0, recorded too.
        let mut fresh = Harness::new(fresh_with(16, 5));
        fresh.run(write(C, b"a")).unwrap();
        let reopened = TenantState::open(Arc::clone(&fresh.s.store), fresh.s.limits).unwrap();
        assert_eq!(reopened.audit_floor, 0);
    }

    /// A store opened by this build has its floor recorded from the start, also while
    /// nothing has expired: first chunks lost behind the server's back are still said to be
    /// lost after a reopen, not taken for expired.
    #[test]
    fn first_chunks_lost_from_a_store_that_never_expired_are_data_loss_after_a_reopen() {
        let mut h = Harness::new(fresh_with(16, 1000));
        for i in 0..30u8 {
            h.run(write(C, &[i])).unwrap(); // one chunk per entry, nothing expired
        }
        let lost = (1..=3)
            .map(|seq| BatchOp::Remove(keys::audit_key(seq).to_vec()))
            .collect();
        h.s.store.apply(lost).unwrap();
        h.s = TenantState::open(Arc::clone(&h.s.store), h.s.limits).unwrap();
        assert_eq!(h.s.audit_floor, 0);
        match h.s.reader().audit_page(0, 100) {
            Err(StoreError::DataLoss(m)) => assert!(m.contains("entries 1 to 3"), "{m}"),
            other => panic!("expected DATA_LOSS, got {other:?}"),
        }
    }

    /// After `--audit-retention` was lowered, one apply removes at most
    /// `AUDIT_EXPIRY_CHUNKS_MAX` chunks (a short batch on the actor's thread); the next applies
    /// remove the rest, and pages show exactly the new window throughout. Before, the first
    /// apply removed every chunk below the new window in one batch.
    #[test]
    fn a_lowered_retention_expires_the_old_trail_over_several_applies() {
        let mut h = Harness::new(fresh_with(16, 100_000));
        let chunks = AUDIT_EXPIRY_CHUNKS_MAX as u64 + 200;
        for i in 0..chunks {
            h.run(write(C, &i.to_be_bytes()[6..])).unwrap(); // one chunk per entry
        }
        let stored = |h: &Harness| {
            h.s.store
                .range(&keys::audit_key(0), &keys::audit_end())
                .count() as u64
        };
        assert_eq!(stored(&h), chunks);
        let limits = StateLimits {
            audit_retention: 100,
            ..h.s.limits
        };
        h.s = TenantState::open(Arc::clone(&h.s.store), limits).unwrap();
        h.run(write(C, b"x")).unwrap();
        assert_eq!(
            stored(&h),
            chunks + 1 - AUDIT_EXPIRY_CHUNKS_MAX as u64,
            "one apply removed more than its share"
        );
        let next = chunks + 2;
        let window: Vec<u64> = (next - 100..next).collect();
        assert_eq!(page_seqs(&h.s.reader(), 0, 1000), window);
        h.run(write(C, b"y")).unwrap();
        assert!(stored(&h) <= 101, "{} chunks left", stored(&h));
        assert_eq!(
            page_seqs(&h.s.reader(), 0, 1000),
            (next - 99..=next).collect::<Vec<_>>()
        );
        let reopened = TenantState::open(Arc::clone(&h.s.store), h.s.limits).unwrap();
        assert_eq!(reopened.audit_floor, h.s.audit_floor);
    }

    #[test]
    fn retention_smaller_than_an_applied_group_keeps_exactly_the_window() {
        let mut h = Harness::new(fresh_with(16, 5));
        write_as_one_group(&mut h, 50);
        assert_eq!(page_seqs(&h.s.reader(), 0, 100), vec![46, 47, 48, 49, 50]);
        // Chunks of 16: 1..=16 and 17..=32 are gone; 33..=48 holds the window's start (46) and
        // is kept with 49..=50.
        let starts: Vec<u64> =
            h.s.store
                .range(&keys::audit_key(0), &keys::audit_end())
                .map(|r| keys::audit_seq_of(&r.unwrap().0).unwrap())
                .collect();
        assert_eq!(starts, vec![33, 49]);
    }

    #[test]
    fn limits_are_invalid_argument() {
        let mut h = Harness::new(fresh(4));
        assert!(matches!(
            h.run(write(C, &[0; 5])),
            Err(StoreError::InvalidArgument(m)) if m.contains("limit is 4 bytes")
        ));
        assert!(matches!(
            h.run(Command::Prog {
                coord: C,
                program: vec![0; 5]
            }),
            Err(StoreError::InvalidArgument(_))
        ));
        for label in [String::new(), "x".repeat(65)] {
            assert!(matches!(
                h.run(Command::Link { from: C, to: C, label }),
                Err(StoreError::InvalidArgument(m)) if m.contains("label")
            ));
        }
        assert!(matches!(
            h.s.reader().region(
                Coord { x: 1, y: 0, z: 0 },
                Coord { x: 0, y: 0, z: 0 },
                10,
                &[]
            ),
            Err(StoreError::InvalidArgument(_))
        ));
        assert!(matches!(
            h.s.reader().region(C, C, 10, b"junk"),
            Err(StoreError::InvalidArgument(m)) if m.contains("page_token")
        ));
    }

    /// A Region page is built in memory: it ends before the cell that would take it past
    /// REGION_PAGE_BYTES, and paging still returns every cell.
    #[test]
    fn region_pages_are_bounded_in_bytes() {
        let mib = 1 << 20;
        let mut h = Harness::new(fresh(mib));
        for x in 0..10 {
            h.run(write(Coord { x, y: 0, z: 0 }, &vec![x as u8; mib]))
                .unwrap();
        }
        let (min, max) = (Coord { x: 0, y: 0, z: 0 }, Coord { x: 9, y: 0, z: 0 });
        let (mut token, mut got, mut pages) = (Vec::new(), 0, 0);
        loop {
            let page = h.s.reader().region(min, max, 100, &token).unwrap();
            let bytes: usize = page.cells.iter().map(|(_, c)| c.value.len()).sum();
            assert!(
                bytes <= REGION_PAGE_BYTES && !page.cells.is_empty(),
                "{bytes}"
            );
            got += page.cells.len();
            pages += 1;
            match page.next_token {
                Some(t) => token = t,
                None => break,
            }
        }
        assert_eq!(got, 10);
        assert!(pages >= 3, "{pages}");
    }

    /// A page token only continues the box it was issued for: sent with another box it is
    /// INVALID_ARGUMENT, where it used to reposition that box's scan (an empty page with no
    /// token: "the box is empty"; or cells repeated). Tokens of earlier builds (v1) are still
    /// taken inside their box's code range.
    #[test]
    fn a_region_page_token_continues_only_its_own_box() {
        let mut h = Harness::new(fresh(16));
        for x in 0..8 {
            for y in 0..8 {
                h.run(write(Coord { x, y, z: 0 }, b"v")).unwrap();
            }
        }
        let (a_min, a_max) = (Coord { x: 0, y: 0, z: 0 }, Coord { x: 7, y: 7, z: 0 });
        let (b_min, b_max) = (Coord { x: 0, y: 0, z: 0 }, Coord { x: 1, y: 1, z: 0 });
        let reader = h.s.reader();
        let page = reader.region(a_min, a_max, 10, &[]).unwrap();
        let token = page.next_token.unwrap();
        assert_eq!(
            reader
                .region(a_min, a_max, 100, &token)
                .unwrap()
                .cells
                .len(),
            54
        );
        let refused = reader.region(b_min, b_max, 10, &token);
        assert!(
            matches!(&refused, Err(StoreError::InvalidArgument(m)) if m.contains("another box")),
            "{refused:?}"
        );
        // A token whose tag was altered.
        let mut forged = token.clone();
        *forged.last_mut().unwrap() ^= 1;
        assert!(matches!(
            reader.region(a_min, a_max, 10, &forged),
            Err(StoreError::InvalidArgument(_))
        ));
        // v1: the bare resume code. Outside the box's codes, refused; inside, continued.
        assert!(matches!(
            reader.region(b_min, b_max, 10, &[1; 13]),
            Err(StoreError::InvalidArgument(_))
        ));
        let first = reader.region(b_min, b_max, 1, &[]).unwrap();
        let v2 = first.next_token.unwrap();
        let mut v1 = vec![TOKEN_V1];
        v1.extend_from_slice(&v2[1..1 + morton::KEY_LEN]);
        let resumed = reader.region(b_min, b_max, 10, &v1).unwrap();
        assert_eq!(resumed.cells.len(), 3);
        assert!(resumed.next_token.is_none());
    }

    /// A thin box through many stored cells outside it costs one seek per run of them: a page
    /// ends after REGION_PAGE_SEEKS with a token (possibly with no cell), and paging on still
    /// returns every cell in the box.
    #[test]
    fn region_pages_are_bounded_in_seeks() {
        let mut h = Harness::new(fresh(16));
        let n = 2 * REGION_PAGE_SEEKS as i32;
        for x in 0..n {
            h.submit(write(Coord { x, y: 1, z: 0 }, b"out")).unwrap();
            if x % 1000 == 0 {
                h.submit(write(Coord { x, y: 0, z: 0 }, b"in")).unwrap();
            }
        }
        h.flush();
        let (min, max) = (Coord { x: 0, y: 0, z: 0 }, Coord { x: n, y: 0, z: 0 });
        let (mut token, mut got, mut pages) = (Vec::new(), Vec::new(), 0);
        loop {
            let page = h.s.reader().region(min, max, 100, &token).unwrap();
            got.extend(page.cells.iter().map(|(c, _)| c.x));
            pages += 1;
            match page.next_token {
                Some(t) => token = t,
                None => break,
            }
        }
        assert_eq!(got, (0..n).step_by(1000).collect::<Vec<_>>());
        assert!(pages >= 2, "{pages}");
    }

    /// A Walk takes at most WALK_MAX_STEPS steps, counting edges back to coordinates already
    /// seen: past that it ends truncated.
    #[test]
    fn a_walk_reads_a_bounded_number_of_edges() {
        let mut h = Harness::new(fresh(16));
        // A complete graph: few coordinates, more edges than the budget.
        let nodes = 1 + (WALK_MAX_STEPS as f64).sqrt() as i32;
        for from in 0..nodes {
            for to in 0..nodes {
                let (from, to) = (
                    Coord {
                        x: from,
                        y: 0,
                        z: 0,
                    },
                    Coord { x: to, y: 0, z: 0 },
                );
                h.submit(Command::Link {
                    from,
                    to,
                    label: "e".into(),
                })
                .unwrap();
            }
        }
        h.flush();
        let start = Coord { x: 0, y: 0, z: 0 };
        let (visits, truncated) = h.s.reader().walk(start, 16, 10_000, &[]).unwrap();
        assert!(truncated);
        assert_eq!(
            visits.len(),
            nodes as usize - 1,
            "every node was reached first"
        );
        // Within the budget, the same walk over fewer nodes is whole.
        let (_, truncated) = h.s.reader().walk(start, 1, 10_000, &[]).unwrap();
        assert!(!truncated);
    }

    /// Each label of a Walk is one lookup per visited coordinate, and lookups count toward the
    /// walk's steps: over sparse edges, 16 labels reach the budget where one label does not.
    #[test]
    fn a_walk_counts_its_label_lookups_toward_its_steps() {
        let mut h = Harness::new(fresh(16));
        // A star: 7,000 leaves one edge from the start, each with no edge of its own. At depth 2
        // a walk looks each leaf up once per label: 16 × 7,000 lookups are over the budget.
        let start = Coord { x: 0, y: 0, z: 0 };
        for leaf in 1..=7_000 {
            h.submit(Command::Link {
                from: start,
                to: Coord {
                    x: leaf,
                    y: 0,
                    z: 0,
                },
                label: "e".into(),
            })
            .unwrap();
        }
        h.flush();
        let mut labels: Vec<String> = (0..15).map(|i| format!("absent{i}")).collect();
        labels.push("e".into());
        let (visits, truncated) = h.s.reader().walk(start, 2, 10_000, &labels).unwrap();
        assert!(truncated, "112,000 lookups and 7,000 edges");
        assert_eq!(
            visits.len(),
            7_000,
            "the leaves were all reached at depth 1"
        );
        let (visits, truncated) = h.s.reader().walk(start, 2, 10_000, &labels[15..]).unwrap();
        assert!(!truncated, "one label: 7,001 lookups and 7,000 edges");
        assert_eq!(visits.len(), 7_000);
    }

    /// Each label of a Walk is one seek per visited coordinate: their number is capped.
    #[test]
    fn a_walk_names_a_bounded_number_of_labels() {
        let h = Harness::new(fresh(16));
        let labels = |n: usize| (0..n).map(|i| format!("l{i}")).collect::<Vec<_>>();
        assert!(
            h.s.reader()
                .walk(C, 2, 10, &labels(MAX_WALK_LABELS))
                .is_ok()
        );
        assert!(
            h.s.reader()
                .walk(C, 2, 10, &vec!["same".to_string(); MAX_WALK_LABEL_ENTRIES])
                .is_ok()
        );
        // Repeats count toward the entries a request may list.
        assert!(matches!(
            h.s.reader().walk(C, 2, 10, &vec!["same".to_string(); MAX_WALK_LABEL_ENTRIES + 1]),
            Err(StoreError::InvalidArgument(m)) if m.contains("at most 256 labels")
        ));
        assert!(matches!(
            h.s.reader().walk(C, 2, 10, &labels(MAX_WALK_LABELS + 1)),
            Err(StoreError::InvalidArgument(m)) if m.contains("at most 16 distinct labels; got 17")
        ));
        assert!(matches!(
            h.s.reader().walk(C, 2, 10, &["x".repeat(65)]),
            Err(StoreError::InvalidArgument(m)) if m == "edge labels are 1 to 64 bytes; got one of 65 bytes"
        ));
    }

    #[test]
    fn apply_skips_old_records_and_refuses_unknown_ones() {
        let mut s = fresh(16);
        let op = |v: &[u8]| WalOp {
            op: Some(Op::Put(walop::Put {
                coord: Some(C.into()),
                value: v.to_vec(),
                version: 1,
            })),
            audit: None,
        };
        s.apply_all(vec![(5, op(b"new"))]).unwrap();
        s.apply_all(vec![(4, op(b"old"))]).unwrap();
        assert_eq!(s.read(&C).unwrap().unwrap().value, b"new");
        assert!(
            s.apply_all(vec![(
                6,
                WalOp {
                    op: None,
                    audit: None
                }
            )])
            .is_err()
        );
        assert_eq!(s.applied_seq(), 5);
    }

    // ---- The state machine against a simple model ----

    #[derive(Debug, Clone, PartialEq)]
    struct ModelCell {
        value: Vec<u8>,
        version: u64,
        sealed: bool,
        program: bool,
        runs: u64,
    }

    #[derive(Debug, Default)]
    struct Model {
        cells: BTreeMap<Coord, ModelCell>,
        edges: BTreeSet<(Coord, String, Coord)>,
        runs: u64,
    }

    impl Model {
        fn apply(&mut self, cmd: &Command) -> Result<Reply, &'static str> {
            Ok(match cmd.clone() {
                Command::Read { coord } => Reply::Read(self.cells.get(&coord).map(|c| CellView {
                    value: c.value.clone(),
                    version: c.version,
                    sealed: c.sealed,
                })),
                Command::Write {
                    coord,
                    value,
                    expected_version,
                } => {
                    let cur = self.cells.get(&coord);
                    if cur.is_some_and(|c| c.sealed) {
                        return Err("sealed");
                    }
                    let v = cur.map_or(0, |c| c.version);
                    if expected_version.is_some_and(|e| e != v) {
                        return Err("version");
                    }
                    let runs = cur.map_or(0, |c| c.runs);
                    self.cells.insert(
                        coord,
                        ModelCell {
                            value,
                            version: v + 1,
                            sealed: false,
                            program: false,
                            runs,
                        },
                    );
                    Reply::Written {
                        version: v + 1,
                        seq: 0,
                    }
                }
                Command::Prog { coord, program } => {
                    let cur = self.cells.get(&coord);
                    if cur.is_some_and(|c| c.sealed) {
                        return Err("sealed");
                    }
                    let v = cur.map_or(0, |c| c.version);
                    let runs = cur.map_or(0, |c| c.runs);
                    self.cells.insert(
                        coord,
                        ModelCell {
                            value: program,
                            version: v + 1,
                            sealed: false,
                            program: true,
                            runs,
                        },
                    );
                    Reply::Programmed {
                        version: v + 1,
                        seq: 0,
                    }
                }
                Command::Delete {
                    coord,
                    expected_version,
                } => {
                    let cur = self.cells.get(&coord);
                    let v = cur.map_or(0, |c| c.version);
                    if expected_version.is_some_and(|e| e != v) {
                        return Err("version");
                    }
                    match cur {
                        None => Reply::Deleted {
                            existed: false,
                            seq: 0,
                        },
                        Some(c) if c.sealed => return Err("sealed"),
                        Some(_) => {
                            self.cells.remove(&coord);
                            Reply::Deleted {
                                existed: true,
                                seq: 0,
                            }
                        }
                    }
                }
                Command::Run { coord, .. } => match self.cells.get_mut(&coord) {
                    Some(c) if c.program => {
                        c.runs += 1;
                        self.runs += 1;
                        Reply::Ran {
                            program: c.value.clone(),
                            run_count: c.runs,
                        }
                    }
                    _ => return Err("no program"),
                },
                Command::Seal { coord } => match self.cells.get_mut(&coord) {
                    None => return Err("missing"),
                    Some(c) => {
                        c.sealed = true;
                        Reply::Sealed {
                            digest: Sha256::digest(&c.value).to_vec(),
                            version: c.version,
                        }
                    }
                },
                Command::Link { from, to, label } => Reply::Linked {
                    created: self.edges.insert((from, label, to)),
                },
                Command::Unlink { from, to, label } => Reply::Unlinked {
                    existed: self.edges.remove(&(from, label, to)),
                },
                Command::Event { .. } => Reply::Recorded { seq: 0 },
                Command::ChangeCapabilities { .. }
                | Command::RevokeKey { .. }
                | Command::CreateKey { .. }
                | Command::SetDurability { .. }
                | Command::RecordCertificate { .. } => {
                    return Err("not generated");
                }
            })
        }

        fn bfs(&self, start: Coord, depth: u32, labels: &[String]) -> BTreeMap<Coord, u32> {
            let mut seen = BTreeMap::new();
            let mut frontier = vec![start];
            let mut visited = BTreeSet::from([start]);
            for d in 1..=depth {
                let mut next = Vec::new();
                for n in &frontier {
                    for (f, l, t) in &self.edges {
                        if f == n && (labels.is_empty() || labels.contains(l)) && visited.insert(*t)
                        {
                            seen.insert(*t, d);
                            next.push(*t);
                        }
                    }
                }
                frontier = next;
            }
            seen
        }
    }

    fn strip_seq(r: Reply) -> Reply {
        r.with_seq(0)
    }

    fn coord() -> impl Strategy<Value = Coord> {
        (
            -1i32..=1,
            -1i32..=1,
            prop_oneof![Just(i32::MIN), Just(0), Just(i32::MAX)],
        )
            .prop_map(|(x, y, z)| Coord { x, y, z })
    }

    fn command() -> impl Strategy<Value = Command> {
        let label = prop_oneof![Just("a".to_string()), Just("b".to_string())];
        prop_oneof![
            (
                coord(),
                prop::collection::vec(any::<u8>(), 0..4),
                prop::option::of(0u64..4)
            )
                .prop_map(|(coord, value, expected_version)| Command::Write {
                    coord,
                    value,
                    expected_version
                }),
            coord().prop_map(|coord| Command::Read { coord }),
            (coord(), prop::option::of(0u64..4)).prop_map(|(coord, expected_version)| {
                Command::Delete {
                    coord,
                    expected_version,
                }
            }),
            (coord(), prop::collection::vec(any::<u8>(), 0..4))
                .prop_map(|(coord, program)| Command::Prog { coord, program }),
            (coord(), prop::collection::vec(any::<u8>(), 0..4))
                .prop_map(|(coord, input)| Command::Run { coord, input }),
            coord().prop_map(|coord| Command::Seal { coord }),
            (coord(), coord(), label.clone()).prop_map(|(from, to, label)| Command::Link {
                from,
                to,
                label
            }),
            (coord(), coord(), label).prop_map(|(from, to, label)| Command::Unlink {
                from,
                to,
                label
            }),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        /// Random operations, applied in random group-commit batches, give the model's answers;
        /// reopening the backend gives the same state; walks match a reference BFS.
        #[test]
        fn state_machine_matches_model(
            steps in prop::collection::vec((command(), any::<bool>()), 1..80),
            walks in prop::collection::vec((coord(), 1u32..5, any::<bool>()), 1..6),
        ) {
            let backend: Arc<dyn StateBackend> = Arc::new(MemBackend::default());
            let mut h = Harness::new(TenantState::open(Arc::clone(&backend), StateLimits::default()).unwrap());
            let mut model = Model::default();
            for (cmd, flush_after) in steps {
                if matches!(cmd, Command::Read { .. }) {
                    // Reads see applied state only: apply first so the model compares.
                    h.flush();
                }
                let got = h.submit(cmd.clone());
                let want = model.apply(&cmd);
                match (got, want) {
                    (Ok(g), Ok(w)) => prop_assert_eq!(strip_seq(g), w, "{:?}", cmd),
                    (Err(_), Err(_)) => {}
                    (g, w) => prop_assert!(false, "{:?}: got {:?}, model {:?}", cmd, g, w),
                }
                if flush_after {
                    h.flush();
                }
            }
            h.flush();
            let reopened = TenantState::open(Arc::clone(&backend), StateLimits::default()).unwrap();
            prop_assert_eq!(reopened.applied_seq(), h.seq);
            let totals = reopened.totals().clone();
            prop_assert_eq!(totals.cells, model.cells.len() as u64);
            prop_assert_eq!(totals.edges, model.edges.len() as u64);
            prop_assert_eq!(totals.sealed, model.cells.values().filter(|c| c.sealed).count() as u64);
            prop_assert_eq!(totals.programs, model.cells.values().filter(|c| c.program).count() as u64);
            prop_assert_eq!(totals.runs, model.runs);
            prop_assert_eq!(totals.stored_bytes, recount(&*backend));
            let reader = reopened.reader();
            let all = reader
                .region(
                    Coord { x: i32::MIN, y: i32::MIN, z: i32::MIN },
                    Coord { x: i32::MAX, y: i32::MAX, z: i32::MAX },
                    1000,
                    &[],
                )
                .unwrap();
            let got: BTreeMap<Coord, (Vec<u8>, u64, bool)> = all
                .cells
                .into_iter()
                .map(|(c, v)| (c, (v.value, v.version, v.sealed)))
                .collect();
            let want: BTreeMap<Coord, (Vec<u8>, u64, bool)> = model
                .cells
                .iter()
                .map(|(c, m)| (*c, (m.value.clone(), m.version, m.sealed)))
                .collect();
            prop_assert_eq!(got, want);
            for (c, m) in &model.cells {
                let (runs, _) = reader.runs(*c, 1).unwrap().unwrap();
                prop_assert_eq!(runs, m.runs);
            }
            for (start, depth, only_a) in walks {
                let labels = if only_a { vec!["a".to_string()] } else { vec![] };
                let (visits, truncated) = reader.walk(start, depth, 10_000, &labels).unwrap();
                prop_assert!(!truncated);
                let got: BTreeMap<Coord, u32> = visits.iter().copied().collect();
                prop_assert_eq!(got.len(), visits.len(), "a coordinate visited twice");
                prop_assert_eq!(got, model.bfs(start, depth, &labels));
                // Breadth-first: depths never decrease.
                prop_assert!(visits.windows(2).all(|w| w[0].1 <= w[1].1));
            }
        }
    }
}
