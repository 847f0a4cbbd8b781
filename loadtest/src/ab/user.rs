//! One simulated user: its connection (per the auth model), its op loop and the ledger of what
//! the server acknowledged to it, which the checks during the run and the verification after it
//! compare the server's answers with.
//!
//! Every user owns the cells of one x coordinate (planes: z=1 writes, 2 programs, 3 sealed
//! cells, 4 its link chain), so what a user reads back is fully determined by what it was
//! acknowledged: any other answer is a `mismatch`, counted as a failure like a gRPC error.
//! A run first claims a slot of [`RUN_STRIDE`] x coordinates that no earlier or concurrent run
//! on the same tenant used ([`claim_slot`]), so runs against a long-lived `--target` never
//! meet another run's cells.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use cube_api::codec::RawRepliesCodec;
use cube_api::v1::access_client::AccessClient;
use cube_api::v1::cells_client::CellsClient;
use cube_api::v1::tenant_client::TenantClient;
use cube_api::v1::{
    AuditRequest, Capability, Cell, Coord, GrantRequest, LinkRequest, ProgRequest, ReadRequest,
    RevokeRequest, RunRequest, SealRequest, StatsRequest, Visit, WalkRequest, WriteRequest,
};
use cube_auth::Credentials;
use cube_auth::client::{CallSigner, Signing, handshake, verify_encoded_audit_entries};
use hdrhistogram::Histogram;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sha2::{Digest, Sha256};

use super::conn::{Conn, Tls};

use super::Model;
use super::mix::{Group, Mix};

const WRITES: i32 = 1;
const PROGRAMS: i32 = 2;
const SEALED: i32 = 3;
const CHAIN: i32 = 4;
const WALK_DEPTH: u32 = 8;

/// x coordinates per run slot: the users of a run own `x_base .. x_base + users`.
pub const RUN_STRIDE: i32 = 1 << 20;
/// Slots `0 .. RUN_SLOTS` keep every slot's x coordinates within `0 ..= i32::MAX`.
const RUN_SLOTS: i32 = i32::MAX / RUN_STRIDE;

/// Where and as whom the users connect.
#[derive(Debug, Clone)]
pub struct Target {
    /// `http://host:port` or `https://host:port`.
    pub endpoint: String,
    pub tls: Option<Tls>,
    pub creds: Credentials,
    /// A second key of the same tenant that grant/revoke toggle READ on.
    pub grant_key: String,
    pub connect_timeout: Duration,
}

impl Target {
    pub async fn connect(&self) -> anyhow::Result<Conn> {
        Conn::connect(&self.endpoint, self.tls.as_ref(), self.connect_timeout).await
    }
}

/// What every user of a run shares.
pub struct RunCtx {
    pub target: Target,
    pub model: Model,
    pub mix: Mix,
    pub op_timeout: Duration,
    /// Per-user pacing in open-loop mode: user i's op k is due at
    /// `start + (k + i / users) * interval`, so the users' ops are spread evenly rather than
    /// due in bursts of `users` at once.
    pub interval: Option<Duration>,
    pub users: usize,
    pub start: Instant,
    pub end: Instant,
    pub value_bytes: usize,
    /// Mutations acknowledged so far by every user: where Audit's `from_seq` is drawn from.
    pub mutations: AtomicU64,
    pub seed: u64,
    /// x coordinate of user 0; users own `x_base + index`.
    pub x_base: i32,
}

/// Length of the windows a run's throughput is reported by ([`UserResult::done_per_window`]).
pub const WINDOW: Duration = Duration::from_secs(10);

impl RunCtx {
    /// Windows of [`WINDOW`] covering the run (the last one may be shorter).
    pub fn windows(&self) -> usize {
        let run = self.end.saturating_duration_since(self.start);
        (run.as_nanos().div_ceil(WINDOW.as_nanos()) as usize).max(1)
    }

    /// The window an op that ended at `t` is counted in: ops that end after the run's end
    /// (started before it, answered after) count in the last window.
    fn window_of(&self, t: Instant) -> usize {
        window_index(t.saturating_duration_since(self.start), self.windows())
    }
}

fn window_index(since_start: Duration, windows: usize) -> usize {
    ((since_start.as_nanos() / WINDOW.as_nanos()) as usize).min(windows.saturating_sub(1))
}

/// `outcome`, or a timeout if it is a success answered after `deadline`: a success is one
/// answered within the per-op timeout, by the report's definition.
fn past_timeout(outcome: Outcome, answered: Instant, deadline: Instant) -> Outcome {
    match outcome {
        Outcome::Ok if answered > deadline => Outcome::Failed("timeout".into()),
        other => other,
    }
}

/// Ops of an open-loop user not sent because it woke at `now`, at or past the run's `end`, for
/// an op due at `d` (one every `iv`): those due from `d` to the end, if it was behind; none if
/// it woke within the timer's millisecond of `d` (an op due just before the end is not a
/// backlog: counted, it failed healthy runs at higher rates).
fn unsent_at_end(d: Instant, now: Instant, end: Instant, iv: Duration) -> u64 {
    if now <= d + Duration::from_millis(1) {
        return 0;
    }
    let (left, iv) = (
        end.saturating_duration_since(d).as_nanos(),
        iv.as_nanos().max(1),
    );
    left.div_ceil(iv) as u64
}

/// The outcome class of one rpc.
#[derive(Debug)]
enum Outcome {
    Ok,
    Failed(String),
    /// Nothing to do (a Run or Read before any program or write was acknowledged): no rpc was
    /// sent, so nothing is counted.
    Skipped,
}

/// A status the server sent is classed by its code. One tonic made from a failure of the
/// connection or the stream (a reset, an I/O error, a connection that died mid-call) carries
/// that failure as its source, and a code that says little (`Unknown`, `Internal`,
/// `Unavailable`, `Cancelled`): it is classed apart, so that it is not counted with the
/// server's own answers of that code.
fn status_class(s: &tonic::Status) -> String {
    // tonic's generated clients turn a connection that is not ready (closed under the call)
    // into `Unknown` with this text and no source: not the server's answer either.
    if std::error::Error::source(s).is_some() || s.message().starts_with("Service was not ready") {
        return LOST.to_string();
    }
    format!("{:?}", s.code())
}

/// The class of an op whose connection or stream failed under it (see [`status_class`]).
const LOST: &str = "connection or stream lost";

fn failed(s: tonic::Status) -> Outcome {
    Outcome::Failed(status_class(&s))
}

/// Latency (µs) of successful ops and failure counts by class, per rpc.
pub struct OpStats {
    pub ok: Histogram<u64>,
    pub failures: BTreeMap<String, u64>,
}

impl OpStats {
    fn new() -> OpStats {
        OpStats {
            ok: hist(),
            failures: BTreeMap::new(),
        }
    }

    pub fn merge(&mut self, other: &OpStats) {
        self.ok.add(&other.ok).expect("same bounds");
        for (k, v) in &other.failures {
            *self.failures.entry(k.clone()).or_default() += v;
        }
    }
}

pub fn hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("bounds")
}

/// What one user brings back.
pub struct UserResult {
    pub per_op: BTreeMap<&'static str, OpStats>,
    pub handshakes: u64,
    pub handshake_us: Histogram<u64>,
    /// Ops started more than 1 ms after they were due (open loop only).
    pub late_starts: u64,
    /// Open loop: ops due before the run's end that were never sent, because the user was still
    /// behind when the run ended.
    pub unsent: u64,
    pub mismatch_examples: Vec<String>,
    pub ledger: Ledger,
    /// Ops (successful or failed) by the [`WINDOW`] of the run in which they ended.
    pub done_per_window: Vec<u64>,
}

/// What the server acknowledged to one user.
#[derive(Debug, Default)]
pub struct Ledger {
    pub x: i32,
    next_write: i32,
    /// y of acknowledged writes (plane WRITES).
    writes: Vec<i32>,
    next_prog: i32,
    programs: Vec<ProgCell>,
    /// Links k → k+1 acknowledged for every k < chain_len.
    chain_len: i32,
    next_link: i32,
    /// A Link failed: the chain beyond it is unknown, so walks are no longer checked.
    chain_unknown: bool,
    next_seal: i32,
    /// y of cells written and sealed (plane SEALED).
    sealed: Vec<i32>,
    /// y of the acknowledged SealWrite the next Seal seals (plane SEALED).
    seal_pending: Option<i32>,
    /// y of acknowledged SealWrites whose Seal failed or never came: the value must be there,
    /// sealed or not (plane SEALED).
    seal_unknown: Vec<i32>,
}

#[derive(Debug, Clone, Copy)]
struct ProgCell {
    y: i32,
    acked_runs: u64,
    /// Runs that failed or timed out: each may or may not have been counted by the server.
    unknown_runs: u64,
}

impl ProgCell {
    fn run_count_ok(&self, n: u64) -> bool {
        (self.acked_runs..=self.acked_runs + self.unknown_runs).contains(&n)
    }
}

fn coord(x: i32, y: i32, z: i32) -> Option<Coord> {
    Some(Coord { x, y, z })
}

/// The value written at (x, y, z): deterministic, incompressible-looking bytes.
pub fn value_of(x: i32, y: i32, z: i32, len: usize) -> Vec<u8> {
    let mut s = (x as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ (y as u64).wrapping_mul(0xC2B2_AE3D_27D4_EB4F)
        ^ (z as u64).wrapping_mul(0x1656_67B1_9E37_79F9);
    (0..len)
        .map(|_| {
            // splitmix64
            s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            (z ^ (z >> 31)) as u8
        })
        .collect()
}

fn program_of(x: i32, y: i32) -> Vec<u8> {
    format!("program {x}/{y}: emit(input)").into_bytes()
}

type Cells = CellsClient<Signing<Conn>>;
type Access = AccessClient<Signing<Conn>>;
type TenantC = TenantClient<Signing<Conn>>;

/// The three clients over one connection.
#[derive(Clone)]
pub struct Clients {
    cells: Cells,
    access: Access,
    tenant: TenantC,
    /// For `Tenant.Audit`, whose pages are checked from their bytes ([`audit_page`]).
    raw: tonic::client::Grpc<Signing<Conn>>,
    /// The connection they share.
    conn: Conn,
}

impl Clients {
    fn new(ch: Signing<Conn>) -> Clients {
        Clients {
            conn: ch.get_ref().clone(),
            cells: CellsClient::new(ch.clone()),
            access: AccessClient::new(ch.clone()),
            tenant: TenantClient::new(ch.clone()),
            raw: tonic::client::Grpc::new(ch),
        }
    }
}

/// One `Tenant.Audit` page, each entry as the bytes it was sent as. The driver reads them in
/// place to check the hash chain (`verify_encoded_audit_entries`) rather than decoding ~5 owned
/// fields per entry: 100 entries per call made decoding most of its own CPU spent on Audit (the
/// pages are checked in full either way; docs/benchmarks.md, "A lighter load driver for
/// Audit").
async fn audit_page(
    raw: &mut tonic::client::Grpc<Signing<Conn>>,
    req: AuditRequest,
) -> Result<Vec<prost::bytes::Bytes>, tonic::Status> {
    raw.ready()
        .await
        .map_err(|e| tonic::Status::unknown(format!("Service was not ready: {e}")))?;
    let path = tonic::codegen::http::uri::PathAndQuery::from_static("/cube.v1.Tenant/Audit");
    let mut stream = raw
        .server_streaming(
            tonic::Request::new(req),
            path,
            RawRepliesCodec::<AuditRequest>::default(),
        )
        .await?
        .into_inner();
    let mut entries = Vec::new();
    while let Some(e) = stream.message().await? {
        entries.push(e);
    }
    Ok(entries)
}

/// Why a connection could not be opened: the failure class a run counts (`connect`,
/// `handshake <code>`, ...) and what happened, for a message.
struct OpenFailure {
    class: String,
    detail: String,
}

/// A hint for the commonest cause of these transport errors: TLS on one side only. A plaintext
/// client's HTTP/2 preface reaches a TLS server as garbage (h2 reports a protocol error), and a
/// TLS client gets a plaintext server's bytes as a corrupt TLS record.
fn tls_hint(client_tls: bool, error: &str) -> &'static str {
    if !client_tls && (error.contains("h2 protocol error") || error.contains("http2 error")) {
        " (does the server speak TLS? then give --tls and --ca)"
    } else if client_tls
        && (error.contains("InvalidContentType") || error.contains("corrupt message"))
    {
        " (does the server speak plaintext? then leave out --tls and --ca)"
    } else {
        ""
    }
}

/// A connection authenticated per `model`: the clients and, for a handshake, its duration.
async fn open(target: &Target, model: Model) -> Result<(Clients, Option<Duration>), OpenFailure> {
    let failure = |class: &str, detail: String| OpenFailure {
        class: class.to_string(),
        detail,
    };
    let t = Instant::now();
    let ch = target.connect().await.map_err(|e| {
        let cause = e.root_cause().to_string();
        let hint = tls_hint(target.tls.is_some(), &cause);
        failure(
            "connect",
            format!("cannot connect to {}: {cause}{hint}", target.endpoint),
        )
    })?;
    match model {
        Model::Call => {
            let secret = target
                .creds
                .secret()
                .map_err(|e| failure("bad secret", format!("the credentials' secret: {e}")))?;
            let signer = CallSigner::new(&target.creds.tenant, &target.creds.key_id, secret);
            Ok((Clients::new(Signing::new(ch, signer)), None))
        }
        Model::Connection | Model::Churn => {
            handshake(ch.clone(), &target.creds)
                .await
                .map_err(|e| match &e {
                    cube_auth::client::HandshakeError::Refused(s) => failure(
                        &format!("handshake {}", status_class(s)),
                        format!(
                            "{} refused the handshake: {} ({:?}){}",
                            target.endpoint,
                            s.message(),
                            s.code(),
                            tls_hint(target.tls.is_some(), s.message())
                        ),
                    ),
                    _ => failure(
                        "handshake proof",
                        match std::error::Error::source(&e) {
                            Some(how) => format!("{e}: {how}"),
                            None => e.to_string(),
                        },
                    ),
                })?;
            Ok((Clients::new(Signing::passthrough(ch)), Some(t.elapsed())))
        }
    }
}

/// One rpc of a group.
#[derive(Debug, Clone, Copy)]
enum Step {
    Prog,
    Run,
    Write,
    Read,
    Grant,
    Revoke,
    Link,
    Walk,
    SealWrite,
    Seal,
    Stats,
    Audit,
}

impl Step {
    fn name(self) -> &'static str {
        match self {
            Step::Prog => "Prog",
            Step::Run => "Run",
            Step::Write | Step::SealWrite => "Write",
            Step::Read => "Read",
            Step::Grant => "Grant",
            Step::Revoke => "Revoke",
            Step::Link => "Link",
            Step::Walk => "Walk",
            Step::Seal => "Seal",
            Step::Stats => "Stats",
            Step::Audit => "Audit",
        }
    }

    fn of(g: Group) -> &'static [Step] {
        match g {
            Group::ProgRun => &[Step::Prog, Step::Run],
            Group::WriteRead => &[Step::Write, Step::Read],
            Group::GrantRevoke => &[Step::Grant, Step::Revoke],
            Group::LinkWalk => &[Step::Link, Step::Walk],
            Group::Seal => &[Step::SealWrite, Step::Seal],
            Group::Stats => &[Step::Stats],
            Group::Audit => &[Step::Audit],
        }
    }
}

struct User {
    ctx: Arc<RunCtx>,
    rng: StdRng,
    ledger: Ledger,
    mismatches: Vec<String>,
    /// When the last op's answer was in, if the op checked it at length afterwards (an Audit
    /// page's hash chain): its latency ends here, not after the client's own check.
    answered: Option<Instant>,
}

impl User {
    fn mismatch(&mut self, what: String) -> Outcome {
        if self.mismatches.len() < 5 {
            self.mismatches.push(what);
        }
        Outcome::Failed("mismatch".into())
    }

    fn acked_mutation(&self) {
        self.ctx.mutations.fetch_add(1, Ordering::Relaxed);
    }

    /// Run one rpc and fold its answer into the ledger.
    /// Whether `step` has nothing to act on now (a Run before any program, a Read before any
    /// write, a Seal whose SealWrite failed): it would answer [`Outcome::Skipped`] without a call.
    fn has_nothing_for(&self, step: Step) -> bool {
        match step {
            Step::Run => self.ledger.programs.is_empty(),
            Step::Read => self.ledger.writes.is_empty(),
            Step::Seal => self.ledger.seal_pending.is_none(),
            _ => false,
        }
    }

    async fn step(&mut self, c: &mut Clients, step: Step) -> Outcome {
        let x = self.ledger.x;
        let vb = self.ctx.value_bytes;
        match step {
            Step::Prog => {
                let y = self.ledger.next_prog;
                self.ledger.next_prog += 1;
                let req = ProgRequest {
                    coord: coord(x, y, PROGRAMS),
                    program: program_of(x, y),
                };
                match c.cells.prog(req).await {
                    Ok(_) => {
                        self.ledger.programs.push(ProgCell {
                            y,
                            acked_runs: 0,
                            unknown_runs: 0,
                        });
                        self.acked_mutation();
                        Outcome::Ok
                    }
                    Err(s) => failed(s),
                }
            }
            Step::Run => {
                if self.ledger.programs.is_empty() {
                    return Outcome::Skipped;
                }
                let i = self.rng.gen_range(0..self.ledger.programs.len());
                let p = self.ledger.programs[i];
                let input: [u8; 16] = self.rng.r#gen();
                // Unknown until answered: a timeout drops this future before any arm below runs.
                self.ledger.programs[i].unknown_runs += 1;
                let r = c
                    .cells
                    .run(RunRequest {
                        coord: coord(x, p.y, PROGRAMS),
                        input: input.to_vec(),
                    })
                    .await;
                match r {
                    Ok(resp) => {
                        let resp = resp.into_inner();
                        let cell = &mut self.ledger.programs[i];
                        cell.unknown_runs -= 1;
                        cell.acked_runs += 1;
                        let cell = *cell;
                        self.acked_mutation();
                        if resp.program != program_of(x, p.y) {
                            self.mismatch(format!("Run ({x},{},2) returned another program", p.y))
                        } else if !cell.run_count_ok(resp.run_count) {
                            self.mismatch(format!(
                                "Run ({x},{},2) says run_count {} after {} acknowledged runs (+{} unknown)",
                                p.y, resp.run_count, cell.acked_runs, cell.unknown_runs
                            ))
                        } else {
                            Outcome::Ok
                        }
                    }
                    Err(s) => failed(s),
                }
            }
            Step::Write => {
                let y = self.ledger.next_write;
                self.ledger.next_write += 1;
                let req = WriteRequest {
                    coord: coord(x, y, WRITES),
                    value: value_of(x, y, WRITES, vb),
                    expected_version: None,
                };
                match c.cells.write(req).await {
                    Ok(_) => {
                        self.ledger.writes.push(y);
                        self.acked_mutation();
                        Outcome::Ok
                    }
                    Err(s) => failed(s),
                }
            }
            Step::Read => {
                if self.ledger.writes.is_empty() {
                    return Outcome::Skipped;
                }
                let y = self.ledger.writes[self.rng.gen_range(0..self.ledger.writes.len())];
                match c
                    .cells
                    .read(ReadRequest {
                        coord: coord(x, y, WRITES),
                    })
                    .await
                {
                    Ok(r) => {
                        let r = r.into_inner();
                        if !r.found || r.value != value_of(x, y, WRITES, vb) {
                            self.mismatch(format!(
                                "Read ({x},{y},1): acknowledged write {}",
                                if r.found {
                                    "has another value"
                                } else {
                                    "not found"
                                }
                            ))
                        } else {
                            Outcome::Ok
                        }
                    }
                    Err(s) => failed(s),
                }
            }
            Step::Grant | Step::Revoke => {
                let key_id = self.ctx.target.grant_key.clone();
                let capabilities = vec![Capability::Read as i32];
                let r = if matches!(step, Step::Grant) {
                    c.access
                        .grant(GrantRequest {
                            key_id,
                            capabilities,
                        })
                        .await
                        .map(|_| ())
                } else {
                    c.access
                        .revoke(RevokeRequest {
                            key_id,
                            capabilities,
                        })
                        .await
                        .map(|_| ())
                };
                match r {
                    Ok(()) => {
                        self.acked_mutation();
                        Outcome::Ok
                    }
                    Err(s) => failed(s),
                }
            }
            Step::Link => {
                let k = self.ledger.next_link;
                self.ledger.next_link += 1;
                // Unknown until answered: a timeout drops this future before any arm below runs.
                let was_unknown = std::mem::replace(&mut self.ledger.chain_unknown, true);
                let r = c
                    .cells
                    .link(LinkRequest {
                        from: coord(x, k, CHAIN),
                        to: coord(x, k + 1, CHAIN),
                        label: "next".into(),
                    })
                    .await;
                match r {
                    Ok(_) => {
                        self.ledger.chain_unknown = was_unknown;
                        if !was_unknown {
                            self.ledger.chain_len = k + 1;
                        }
                        self.acked_mutation();
                        Outcome::Ok
                    }
                    Err(s) => failed(s),
                }
            }
            Step::Walk => {
                let len = self.ledger.chain_len;
                let start = self.rng.gen_range(0..=len);
                match walk_chain(&mut c.cells, x, start).await {
                    Ok(visits) => {
                        let want = (len - start).min(WALK_DEPTH as i32) as usize;
                        let chain_ok = along_chain(&visits, x, start, visits.len());
                        if !self.ledger.chain_unknown && (visits.len() != want || !chain_ok) {
                            self.mismatch(format!(
                                "Walk from ({x},{start},4): {} visits, {want} expected along the acknowledged chain",
                                visits.len()
                            ))
                        } else {
                            Outcome::Ok
                        }
                    }
                    Err(s) => failed(s),
                }
            }
            Step::SealWrite => {
                let y = self.ledger.next_seal;
                self.ledger.next_seal += 1;
                // A written cell that was never sealed is checked for its value only.
                if let Some(earlier) = self.ledger.seal_pending.take() {
                    self.ledger.seal_unknown.push(earlier);
                }
                let req = WriteRequest {
                    coord: coord(x, y, SEALED),
                    value: value_of(x, y, SEALED, vb),
                    expected_version: None,
                };
                match c.cells.write(req).await {
                    Ok(_) => {
                        self.ledger.seal_pending = Some(y);
                        self.acked_mutation();
                        Outcome::Ok
                    }
                    Err(s) => failed(s),
                }
            }
            Step::Seal => {
                // Seals the cell the preceding SealWrite wrote; none if that write failed.
                let Some(y) = self.ledger.seal_pending.take() else {
                    return Outcome::Skipped;
                };
                // Until answered the seal is unknown: a timeout drops this future.
                self.ledger.seal_unknown.push(y);
                match c
                    .cells
                    .seal(SealRequest {
                        coord: coord(x, y, SEALED),
                    })
                    .await
                {
                    Ok(r) => {
                        self.acked_mutation();
                        let digest = Sha256::digest(value_of(x, y, SEALED, vb));
                        if r.into_inner().digest != digest.as_slice() {
                            self.mismatch(format!("Seal ({x},{y},3): digest of another value"))
                        } else {
                            self.ledger.seal_unknown.pop();
                            self.ledger.sealed.push(y);
                            Outcome::Ok
                        }
                    }
                    Err(s) => failed(s),
                }
            }
            Step::Stats => {
                let pick = if self.ledger.programs.is_empty() || self.rng.gen_bool(0.5) {
                    None
                } else {
                    Some(self.rng.gen_range(0..self.ledger.programs.len()))
                };
                let req = StatsRequest {
                    coord: pick.and_then(|i| coord(x, self.ledger.programs[i].y, PROGRAMS)),
                };
                match c.tenant.stats(req).await {
                    Ok(r) => {
                        let r = r.into_inner();
                        match pick {
                            Some(i) => {
                                let p = self.ledger.programs[i];
                                let n = r.cell.map(|c| c.run_count).unwrap_or(0);
                                if p.run_count_ok(n) {
                                    Outcome::Ok
                                } else {
                                    self.mismatch(format!(
                                        "Stats ({x},{},2): run_count {n} after {} acknowledged runs (+{} unknown)",
                                        p.y, p.acked_runs, p.unknown_runs
                                    ))
                                }
                            }
                            None if r.totals.is_none() => {
                                self.mismatch("Stats without totals".into())
                            }
                            None => Outcome::Ok,
                        }
                    }
                    Err(s) => failed(s),
                }
            }
            Step::Audit => {
                let head = self.ctx.mutations.load(Ordering::Relaxed).max(1);
                let from_seq = self.rng.gen_range(1..=head);
                let req = AuditRequest {
                    from_seq,
                    limit: 100,
                };
                let entries = match audit_page(&mut c.raw, req).await {
                    Ok(entries) => entries,
                    Err(s) => return failed(s),
                };
                self.answered = Some(Instant::now());
                if entries.len() > 100 {
                    return self.mismatch(format!(
                        "Audit limit 100 returned {} entries",
                        entries.len()
                    ));
                }
                match verify_encoded_audit_entries(&entries) {
                    Err(e) => self.mismatch(format!(
                        "Audit page from {from_seq}: an entry is not a cube.v1.AuditEntry: {e}"
                    )),
                    Ok(Err((seq, why))) => self.mismatch(format!(
                        "Audit page from {from_seq}: chain broken at {seq}: {why}"
                    )),
                    Ok(Ok(_)) => Outcome::Ok,
                }
            }
        }
    }
}

/// How long a user whose persistent connection was closed waits after failing to open another.
const REOPEN_PAUSE: Duration = Duration::from_millis(100);

/// Drive one user until `ctx.end`. `conn` is the persistent connection of the `connection` and
/// `call` models (opened before the clock starts); `churn` opens one per op.
pub async fn run_user(ctx: Arc<RunCtx>, index: usize, conn: Option<Clients>) -> UserResult {
    let mut user = User {
        rng: StdRng::seed_from_u64(ctx.seed ^ (index as u64).wrapping_mul(0x9E37_79B9)),
        ledger: Ledger {
            x: ctx.x_base + index as i32,
            ..Ledger::default()
        },
        ctx: ctx.clone(),
        mismatches: Vec::new(),
        answered: None,
    };
    let mut per_op: BTreeMap<&'static str, OpStats> = BTreeMap::new();
    let (mut handshakes, mut handshake_us, mut late_starts, mut unsent) =
        (0u64, hist(), 0u64, 0u64);
    let mut due = ctx.start
        + ctx.interval.map_or(Duration::ZERO, |iv| {
            iv.mul_f64(index as f64 / ctx.users.max(1) as f64)
        });
    let mut conn = conn;
    let mut told_closed = false;
    let mut done_per_window = vec![0u64; ctx.windows()];
    'run: loop {
        let group = ctx.mix.pick(&mut user.rng);
        for &step in Step::of(group) {
            // Closed loop: start now. Open loop: start when due, and time from then, so a slow
            // server's queueing shows up in latency instead of being omitted.
            let begin = match ctx.interval {
                None => Instant::now(),
                Some(iv) => {
                    let d = due;
                    // Not a sleep past the run's end (a rate this low has intervals longer
                    // than the run).
                    if d >= ctx.end {
                        break 'run;
                    }
                    due += iv;
                    tokio::time::sleep_until(d.into()).await;
                    let now = Instant::now();
                    if now >= ctx.end {
                        // Behind at the end: the run stops on time, and what was due from `d`
                        // on is counted as not sent (an overloaded run would otherwise go on
                        // until its backlog was worked off, its late ops in its last window).
                        // Not an op due just before the end whose wake-up the timer's
                        // millisecond carried past it: that user was not behind.
                        unsent += unsent_at_end(d, now, ctx.end, iv);
                        break 'run;
                    }
                    if now > d + Duration::from_millis(1) {
                        late_starts += 1;
                    }
                    d
                }
            };
            if begin >= ctx.end {
                break 'run;
            }
            if ctx.interval.is_some() && Instant::now() >= begin + ctx.op_timeout {
                // Past its deadline before it could start (the op before ran long): not sent,
                // so that no request the client has already given up on reaches the server.
                unsent += 1;
                continue;
            }
            if let Some(c) = conn.as_ref()
                && c.conn.closed()
            {
                // The server ended this user's persistent connection (a restart, a GOAWAY, a
                // reset): the op in hand fails as `connection closed`, and the user opens
                // another (with a new handshake in the `connection` model) for the next one.
                if !told_closed {
                    told_closed = true;
                    let why = c
                        .conn
                        .why_closed()
                        .map(|w| format!(": {w}"))
                        .unwrap_or_default();
                    eprintln!(
                        "user {index}: the server closed its connection{why}; opening another"
                    );
                }
                done_per_window[ctx.window_of(Instant::now())] += 1;
                // The reopen is held to the op timeout too (a server that takes the connection
                // and stalls the handshake must not hold the user past the run), and a failed
                // one names its cause with the op's failure.
                let reopened = tokio::time::timeout(ctx.op_timeout, open(&ctx.target, ctx.model))
                    .await
                    .unwrap_or_else(|_| {
                        Err(OpenFailure {
                            class: "timeout".into(),
                            detail: "the reopen took longer than the op timeout".into(),
                        })
                    });
                let class = match reopened {
                    Ok((c, hs)) => {
                        if let Some(hs) = hs {
                            handshakes += 1;
                            let _ = handshake_us.record(hs.as_micros() as u64);
                        }
                        conn = Some(c);
                        "connection closed".to_string()
                    }
                    // The server is not back yet: tried again for the next op, after a pause
                    // (not thousands of refused connects a second, each counted as a failure).
                    Err(failure) => {
                        tokio::time::sleep(REOPEN_PAUSE).await;
                        format!("connection closed (reopening: {})", failure.class)
                    }
                };
                let stats = per_op.entry(step.name()).or_insert_with(OpStats::new);
                *stats.failures.entry(class).or_default() += 1;
                continue;
            }
            // Known before any connection is opened: churn's handshake for an op never sent
            // would count as a handshake, and take the next op's time.
            let outcome = if user.has_nothing_for(step) {
                Outcome::Skipped
            } else {
                // The timeout runs from `begin` like the latency (in open loop, the due time),
                // so no op is counted successful with a latency past it.
                tokio::time::timeout_at((begin + ctx.op_timeout).into(), async {
                    let mut fresh;
                    let clients = match conn.as_mut() {
                        Some(c) => c,
                        None => match open(&ctx.target, ctx.model).await {
                            Ok((c, hs)) => {
                                if let Some(hs) = hs {
                                    handshakes += 1;
                                    let _ = handshake_us.record(hs.as_micros() as u64);
                                }
                                fresh = c;
                                &mut fresh
                            }
                            Err(failure) => return Outcome::Failed(failure.class),
                        },
                    };
                    user.step(clients, step).await
                })
                .await
                .unwrap_or_else(|_| Outcome::Failed("timeout".into()))
            };
            let answered = user.answered.take().unwrap_or_else(Instant::now);
            // `timeout_at` polls the op before its timer, so an answer that came just past the
            // timeout (the timer's millisecond, a late wake-up) is still `Ok`: a timeout too.
            let outcome = past_timeout(outcome, answered, begin + ctx.op_timeout);
            if matches!(outcome, Outcome::Skipped) {
                // Nothing was sent: the slot goes to the next op, so the offered rate holds.
                if let Some(iv) = ctx.interval {
                    due -= iv;
                }
                continue;
            }
            done_per_window[ctx.window_of(Instant::now())] += 1;
            let stats = per_op.entry(step.name()).or_insert_with(OpStats::new);
            match outcome {
                Outcome::Ok => {
                    let took = answered.saturating_duration_since(begin);
                    let _ = stats.ok.record(took.as_micros().max(1) as u64);
                }
                Outcome::Failed(class) => *stats.failures.entry(class).or_default() += 1,
                Outcome::Skipped => unreachable!("skipped above"),
            }
        }
    }
    // Churn's connections are closed by now; the persistent one closes when dropped here.
    drop(conn);
    UserResult {
        per_op,
        handshakes,
        handshake_us,
        late_starts,
        unsent,
        mismatch_examples: user.mismatches,
        ledger: user.ledger,
        done_per_window,
    }
}

/// Open the persistent connection of a user (not timed as part of the run).
pub async fn persistent(target: &Target, model: Model) -> anyhow::Result<(Clients, bool)> {
    match open(target, model).await {
        Ok((c, hs)) => Ok((c, hs.is_some())),
        Err(why) => anyhow::bail!("opening a user's connection failed: {}", why.detail),
    }
}

/// Claim the first run slot of the target's tenant that no other run used, and return its
/// `x_base`. A slot is claimed by creating its marker cell `(x_base, 0, 0)` with
/// `expected_version = 0` (so of two runs starting at once, exactly one gets each slot), and
/// kept only if no cell of the users' planes lies in its x range (cells written by a cube-load
/// from before slots existed). Runs against a fresh server get slot 0, as before. `model` is the
/// run's: a server in `--auth-mode call` refuses the handshake, one in `connection` mode
/// refuses signed calls.
pub async fn claim_slot(target: &Target, model: Model, label: &str) -> anyhow::Result<i32> {
    use cube_api::v1::RegionRequest;
    let (mut c, _) = persistent(target, persistent_model(model)).await?;
    for slot in 0..RUN_SLOTS {
        let x_base = slot * RUN_STRIDE;
        let marker = WriteRequest {
            coord: coord(x_base, 0, 0),
            value: label.as_bytes().to_vec(),
            expected_version: Some(0),
        };
        match c.cells.write(marker).await {
            Ok(_) => {}
            Err(s) if s.code() == tonic::Code::FailedPrecondition => continue,
            Err(s) => anyhow::bail!(
                "claiming run slot {slot} on the target failed: {} ({:?})",
                s.message(),
                s.code()
            ),
        }
        let used = c
            .cells
            .region(RegionRequest {
                min: coord(x_base, 0, WRITES),
                max: coord(x_base + (RUN_STRIDE - 1), i32::MAX, CHAIN),
                limit: 1,
                page_token: Vec::new(),
            })
            .await?
            .into_inner()
            .message()
            .await?
            .is_some();
        if !used {
            return Ok(x_base);
        }
    }
    anyhow::bail!(
        "all {RUN_SLOTS} run slots of this tenant are taken: run against a fresh tenant or data dir"
    )
}

/// What verification after a run found.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct Verified {
    pub writes: u64,
    pub sealed: u64,
    pub program_cells: u64,
    pub runs: u64,
    /// Links of the users' chains walked.
    pub links: u64,
    pub problems: Vec<String>,
}

impl Verified {
    /// What was read back, for the line a passing `run` or `stress` prints.
    pub fn summary(&self) -> String {
        format!(
            "read back {} writes, {} sealed cells, {} programs with their {} runs and {} links",
            self.writes, self.sealed, self.program_cells, self.runs, self.links
        )
    }

    pub fn merge(&mut self, o: Verified) {
        self.writes += o.writes;
        self.sealed += o.sealed;
        self.program_cells += o.program_cells;
        self.runs += o.runs;
        self.links += o.links;
        for p in o.problems {
            if self.problems.len() < 20 {
                self.problems.push(p);
            }
        }
    }
}

/// Every cell of user `x`'s plane `z` with y in `0..=max_y`.
async fn region_all(c: &mut Cells, x: i32, z: i32, max_y: i32) -> Result<Vec<Cell>, tonic::Status> {
    let corner = |y| Coord { x, y, z };
    cube_testkit::region_all(c, corner(0), corner(max_y), 1000).await
}

/// Compare a plane's cells as the server returned them with what it acknowledged: every
/// acknowledged y present with its exact value and seal flag (either flag for `None`: a seal
/// whose answer never came). Cells that were never acknowledged (a timed-out write may still
/// have been applied) are not an error.
fn check_plane(
    x: i32,
    z: i32,
    acked: &[i32],
    sealed: Option<bool>,
    cells: &[Cell],
    value: impl Fn(i32) -> Vec<u8>,
) -> Vec<String> {
    let got: BTreeMap<i32, &Cell> = cells
        .iter()
        .filter_map(|c| c.coord.filter(|k| k.x == x && k.z == z).map(|k| (k.y, c)))
        .collect();
    let mut out = Vec::new();
    for &y in acked {
        match got.get(&y) {
            Some(c) if c.value == value(y) && sealed.is_none_or(|s| c.sealed == s) => {}
            Some(c) if sealed.is_some_and(|s| c.sealed != s) => out.push(format!(
                "cell ({x},{y},{z}) is {}sealed, acknowledged as {}sealed",
                if c.sealed { "" } else { "not " },
                if c.sealed { "not " } else { "" }
            )),
            Some(_) => out.push(format!(
                "cell ({x},{y},{z}) holds another value than the acknowledged one"
            )),
            None => out.push(format!("acknowledged cell ({x},{y},{z}) is missing")),
        }
    }
    out
}

/// The persistent model that stands in for `model` outside the measured ops (claiming a slot,
/// reading back): a server in `--auth-mode call` refuses the handshake, one in `connection`
/// mode refuses signed calls, so the run's own model (churn's handshake) is the one that works.
pub fn persistent_model(model: Model) -> Model {
    match model {
        Model::Call => Model::Call,
        Model::Connection | Model::Churn => Model::Connection,
    }
}

/// Read back everything the server acknowledged to this user: every write and sealed cell with
/// its exact value (and seal flag), and every program cell's run count, authenticated by the
/// run's `model` ([`persistent_model`]).
pub async fn verify(target: Target, model: Model, ledger: Ledger, value_bytes: usize) -> Verified {
    let mut v = Verified::default();
    let problem = |v: &mut Verified, p: String| {
        if v.problems.len() < 20 {
            v.problems.push(p);
        }
    };
    let mut c = match open(&target, persistent_model(model)).await {
        Ok((c, _)) => c,
        Err(o) => {
            problem(
                &mut v,
                format!("could not open a connection to verify: {}", o.detail),
            );
            return v;
        }
    };
    let x = ledger.x;
    let mut seal_unknown = ledger.seal_unknown.clone();
    seal_unknown.extend(ledger.seal_pending);
    for (z, acked, sealed) in [
        (WRITES, &ledger.writes, Some(false)),
        (SEALED, &ledger.sealed, Some(true)),
        (SEALED, &seal_unknown, None),
    ] {
        if acked.is_empty() {
            continue;
        }
        let max_y = acked.iter().copied().max().unwrap_or(0);
        let cells = match region_all(&mut c.cells, x, z, max_y).await {
            Ok(cells) => cells,
            Err(s) => {
                problem(
                    &mut v,
                    format!("Region of user {x} plane {z}: {}", status_class(&s)),
                );
                continue;
            }
        };
        for p in check_plane(x, z, acked, sealed, &cells, |y| {
            value_of(x, y, z, value_bytes)
        }) {
            problem(&mut v, p);
        }
        if sealed == Some(true) {
            v.sealed += acked.len() as u64;
        } else {
            v.writes += acked.len() as u64;
        }
    }
    for p in &ledger.programs {
        match c
            .tenant
            .stats(StatsRequest {
                coord: coord(x, p.y, PROGRAMS),
            })
            .await
        {
            Ok(r) => {
                let n = r.into_inner().cell.map(|c| c.run_count).unwrap_or(0);
                if !p.run_count_ok(n) {
                    problem(
                        &mut v,
                        format!(
                            "program ({x},{},2) ran {n} times, {} runs acknowledged (+{} unknown)",
                            p.y, p.acked_runs, p.unknown_runs
                        ),
                    );
                }
                v.runs += p.acked_runs;
            }
            Err(s) => problem(
                &mut v,
                format!("Stats of ({x},{},2): {}", p.y, status_class(&s)),
            ),
        }
    }
    v.program_cells = ledger.programs.len() as u64;
    // Every acknowledged program, as stored.
    let programs: Vec<i32> = ledger.programs.iter().map(|p| p.y).collect();
    if let Some(&max_y) = programs.iter().max() {
        match region_all(&mut c.cells, x, PROGRAMS, max_y).await {
            Ok(cells) => {
                let plane = check_plane(x, PROGRAMS, &programs, Some(false), &cells, |y| {
                    program_of(x, y)
                });
                for p in plane {
                    problem(&mut v, p);
                }
            }
            Err(s) => problem(
                &mut v,
                format!("Region of user {x}'s programs: {}", status_class(&s)),
            ),
        }
    }
    // Every acknowledged link of the chain, walked to its end.
    for p in check_chain(&mut c.cells, x, ledger.chain_len, ledger.chain_unknown).await {
        problem(&mut v, p);
    }
    v.links = ledger.chain_len as u64;
    v
}

/// User `x`'s chain walked from link `start`, [`WALK_DEPTH`] links at most.
async fn walk_chain(c: &mut Cells, x: i32, start: i32) -> Result<Vec<Visit>, tonic::Status> {
    let walked = c
        .walk(WalkRequest {
            start: coord(x, start, CHAIN),
            max_depth: WALK_DEPTH,
            limit: 64,
            labels: vec!["next".into()],
        })
        .await?;
    Ok(walked.into_inner().visits)
}

/// Whether the first `n` of `visits` (a walk from link `start` of user `x`'s chain) follow the
/// chain: start + 1, start + 2, …, one link deeper each.
fn along_chain(visits: &[Visit], x: i32, start: i32, n: usize) -> bool {
    visits
        .iter()
        .take(n)
        .enumerate()
        .all(|(i, v)| v.depth == i as u32 + 1 && v.coord == coord(x, start + i as i32 + 1, CHAIN))
}

/// Walk user `x`'s chain from its start in steps of [`WALK_DEPTH`]: the `len` acknowledged
/// links k → k+1 must all be there, in order. Beyond them only if `unknown` (a Link whose
/// answer never came may have been applied), else the chain must end at `len`.
async fn check_chain(c: &mut Cells, x: i32, len: i32, unknown: bool) -> Vec<String> {
    let mut out = Vec::new();
    let mut start = 0;
    while start < len || (start == len && !unknown) {
        let visits = match walk_chain(c, x, start).await {
            Ok(visits) => visits,
            Err(s) => {
                out.push(format!("Walk from ({x},{start},4): {}", status_class(&s)));
                return out;
            }
        };
        let want = (len - start).min(WALK_DEPTH as i32) as usize;
        let in_order = along_chain(&visits, x, start, want);
        if visits.len() < want || !in_order || (!unknown && visits.len() > want) {
            out.push(format!(
                "the chain from ({x},{start},4) walks {} links, {want} acknowledged{}",
                visits.len(),
                if in_order { "" } else { " (out of order)" }
            ));
            return out;
        }
        if start == len {
            break;
        }
        start += want as i32;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A user that wakes past the end because of the timer's millisecond was not behind; one
    /// that wakes later owes what was due from its op to the end.
    #[test]
    fn only_a_user_behind_at_the_end_leaves_ops_unsent() {
        let end = Instant::now() + Duration::from_secs(10);
        let iv = Duration::from_millis(4);
        let d = end - Duration::from_micros(300);
        assert_eq!(
            unsent_at_end(d, end + Duration::from_micros(500), end, iv),
            0
        );
        let d = end - Duration::from_millis(10);
        assert_eq!(unsent_at_end(d, end, end, iv), 3);
        assert_eq!(
            unsent_at_end(d, end + Duration::from_millis(50), end, iv),
            3
        );
    }

    /// An answer that came after the per-op timeout is a timeout, however the timer raced it.
    #[test]
    fn a_success_answered_past_the_timeout_is_a_timeout() {
        let deadline = Instant::now();
        let late = deadline + Duration::from_micros(1);
        assert!(matches!(
            past_timeout(Outcome::Ok, late, deadline),
            Outcome::Failed(c) if c == "timeout"
        ));
        assert!(matches!(
            past_timeout(Outcome::Ok, deadline, deadline),
            Outcome::Ok
        ));
        assert!(matches!(
            past_timeout(Outcome::Failed("unavailable".into()), late, deadline),
            Outcome::Failed(c) if c == "unavailable"
        ));
    }

    /// The texts tonic and rustls gave when TLS was on one side only (a helper's black-box
    /// run, 2026-12-03), and one that has nothing to do with TLS.
    #[test]
    fn tls_on_one_side_only_gets_a_hint() {
        let h2 = "h2 protocol error: http2 error";
        assert!(tls_hint(false, h2).contains("give --tls and --ca"));
        assert_eq!(tls_hint(true, h2), "");
        let record = "received corrupt message of type InvalidContentType";
        assert!(tls_hint(true, record).contains("leave out --tls"));
        assert_eq!(tls_hint(false, record), "");
        assert_eq!(tls_hint(false, "Connection refused (os error 111)"), "");
    }

    /// A failure of the transport is classed apart from the codes the server sends.
    #[test]
    fn a_lost_connection_is_not_counted_as_a_code_the_server_sent() {
        let lost = tonic::Status::from_error(Box::new(std::io::Error::from(
            std::io::ErrorKind::ConnectionReset,
        )));
        assert_eq!(status_class(&lost), LOST);
        assert_eq!(
            status_class(&tonic::Status::unavailable("tenant closing")),
            "Unavailable"
        );
        assert_eq!(status_class(&tonic::Status::unknown("x")), "Unknown");
        // What a generated client makes of a connection closed before the call went out.
        let not_ready = tonic::Status::unknown("Service was not ready: transport error");
        assert_eq!(status_class(&not_ready), LOST);
    }

    #[test]
    fn an_op_counts_in_the_window_it_ended_in_and_late_ones_in_the_last() {
        let s = Duration::from_secs_f64;
        assert_eq!(window_index(s(0.0), 12), 0);
        assert_eq!(window_index(s(9.999), 12), 0);
        assert_eq!(window_index(s(10.0), 12), 1);
        assert_eq!(window_index(s(119.9), 12), 11);
        // Answered after the end of a 120-s run: still the last window, not a thirteenth.
        assert_eq!(window_index(s(121.5), 12), 11);
        assert_eq!(window_index(s(3.0), 1), 0);
    }

    fn cell(x: i32, y: i32, z: i32, value: Vec<u8>, sealed: bool) -> Cell {
        Cell {
            coord: coord(x, y, z),
            value,
            version: 1,
            sealed,
        }
    }

    #[test]
    fn verification_names_missing_changed_and_unsealed_cells() {
        let (x, z, vb) = (7, WRITES, 32);
        let good = |y| cell(x, y, z, value_of(x, y, z, vb), false);
        let cells = vec![
            good(0),
            cell(x, 1, z, value_of(x, 1, z, vb + 1), false),
            good(3), // never acknowledged (a timed-out write): not an error
            good(4),
        ];
        let value = |y| value_of(x, y, z, vb);
        let p = check_plane(x, z, &[0, 1, 2, 4], Some(false), &cells, value);
        assert_eq!(p.len(), 2, "{p:?}");
        assert!(p[0].contains("(7,1,1) holds another value"), "{p:?}");
        assert!(p[1].contains("(7,2,1) is missing"), "{p:?}");
        let p = check_plane(x, z, &[0], Some(true), &cells, value);
        assert!(
            p[0].contains("is not sealed, acknowledged as sealed"),
            "{p:?}"
        );
        assert!(check_plane(x, z, &[0, 4], Some(false), &cells, value).is_empty());
        // A seal whose answer never came: either flag, but the value must be there.
        assert!(check_plane(x, z, &[0, 4], None, &cells, value).is_empty());
        let p = check_plane(x, z, &[1, 2], None, &cells, value);
        assert_eq!(p.len(), 2, "{p:?}");
    }

    #[test]
    fn a_run_count_is_right_between_acknowledged_and_acknowledged_plus_unknown() {
        let p = ProgCell {
            y: 0,
            acked_runs: 5,
            unknown_runs: 2,
        };
        assert!(!p.run_count_ok(4));
        assert!(p.run_count_ok(5) && p.run_count_ok(7));
        assert!(!p.run_count_ok(8));
    }

    /// An open-loop user behind (every op times out against a server that never answers) stops
    /// at the run's end and counts what was due and never sent, instead of working off its
    /// backlog after the end.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_open_loop_user_behind_at_the_end_stops_and_counts_what_it_did_not_send() {
        // Bound, never accepted: the kernel completes connections, nothing answers on them.
        let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let start = Instant::now();
        // 30 ops due, 50 ms apart: time enough to send each on a loaded machine.
        let (run, interval, op_timeout) = (
            Duration::from_millis(1500),
            Duration::from_millis(50),
            Duration::from_millis(500),
        );
        let ctx = Arc::new(RunCtx {
            target: Target {
                endpoint: format!("http://{}", silent.local_addr().unwrap()),
                tls: None,
                creds: Credentials {
                    tenant: "demo".into(),
                    key_id: "k-test".into(),
                    secret: "ab".repeat(32),
                    endpoint: None,
                },
                grant_key: "k-other".into(),
                connect_timeout: op_timeout,
            },
            model: Model::Churn,
            mix: Mix::parse("write-read=1").unwrap(),
            op_timeout,
            interval: Some(interval),
            users: 1,
            start,
            end: start + run,
            value_bytes: 16,
            mutations: AtomicU64::new(0),
            seed: 7,
            x_base: 0,
        });
        let r = run_user(ctx, 0, None).await;
        let took = start.elapsed();
        let failed: u64 = r.per_op.values().flat_map(|s| s.failures.values()).sum();
        let ok: u64 = r.per_op.values().map(|s| s.ok.len()).sum();
        let causes: Vec<&String> = r.per_op.values().flat_map(|s| s.failures.keys()).collect();
        assert_eq!(ok, 0);
        assert!(causes.iter().all(|k| *k == "timeout"), "{causes:?}");
        // Each op that was sent timed out 500 ms after it was due, not after it started (which
        // would take 30 × 500 ms), so the user ran ~450 ms behind, and what was due in that last
        // stretch was not sent.
        assert!(failed >= 12, "{failed} sent, {} unsent", r.unsent);
        assert!(r.unsent >= 1, "{failed} sent, {} unsent", r.unsent);
        assert_eq!(failed + r.unsent, 30, "{failed} sent, {} unsent", r.unsent);
        assert!(
            took < run + op_timeout + Duration::from_millis(1500),
            "{took:?}"
        );
    }

    #[test]
    fn values_are_deterministic_and_differ_by_coordinate() {
        assert_eq!(value_of(1, 2, 3, 64), value_of(1, 2, 3, 64));
        assert_ne!(value_of(1, 2, 3, 64), value_of(1, 3, 2, 64));
        assert_eq!(value_of(-5, i32::MAX, 0, 100).len(), 100);
    }
}
