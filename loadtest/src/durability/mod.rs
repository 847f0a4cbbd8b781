//! `cube-durability`: writers of self-checking records against a real cubed, the server stopped
//! or cut in five ways, and every acknowledged record verified afterwards (issue 6).
//!
//! Each writer writes its records one at a time (sequence 0, 1, 2, ... at cell (writer, seq,
//! 7)); the harness keeps, outside the server, how many of each writer's records were
//! acknowledged (and saves it as `acked.json` in the work directory). Verification reads every
//! writer's column back with Region and demands: every acknowledged record present and whole
//! (exact count), a contiguous prefix (no holes), and at most one record beyond the
//! acknowledged ones (the write in flight when the server went away).

pub mod fs;
pub mod record;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use cube_api::v1::cells_client::CellsClient;
use cube_api::v1::tenant_client::TenantClient;
use cube_api::v1::{AuditRequest, Coord, ReadRequest, WriteRequest};
use cube_auth::Credentials;
use cube_auth::client::{CallSigner, Signing};
use cube_testkit::TestServer;
use serde::Serialize;
use tonic::Code;
use tonic::transport::{Channel, Endpoint};

/// The plane the records live on.
const Z: i32 = 7;

type Cells = CellsClient<Signing<Channel>>;

/// How many records of each writer were acknowledged, and which writing phase acknowledged
/// each.
pub struct Ledger {
    acked: Vec<AtomicU64>,
    /// Per writer, the first seq each phase wrote (ascending): the phase of an acknowledged
    /// record is the last one that began at or below its seq.
    phases: std::sync::Mutex<Vec<Vec<(u64, u32)>>>,
    pub value_bytes: usize,
}

impl Ledger {
    pub fn new(writers: usize, value_bytes: usize) -> Ledger {
        Ledger {
            acked: (0..writers).map(|_| AtomicU64::new(0)).collect(),
            phases: std::sync::Mutex::new(vec![Vec::new(); writers]),
            value_bytes: value_bytes.max(record::MIN_LEN),
        }
    }

    /// Begin a writing phase: its number, written into every record it writes.
    fn begin_phase(&self) -> u32 {
        let mut phases = self.phases.lock().unwrap_or_else(|e| e.into_inner());
        let phase = phases.first().map_or(0, |p| p.len() as u32);
        for (w, p) in phases.iter_mut().enumerate() {
            p.push((self.acked[w].load(Ordering::SeqCst), phase));
        }
        phase
    }

    /// The phase that wrote writer `w`'s acknowledged record `seq`.
    fn phase_of(&self, w: usize, seq: u64) -> Option<u32> {
        let phases = self.phases.lock().unwrap_or_else(|e| e.into_inner());
        phases[w]
            .iter()
            .rev()
            .find(|&&(first, _)| first <= seq)
            .map(|&(_, phase)| phase)
    }

    pub fn total(&self) -> u64 {
        self.acked.iter().map(|a| a.load(Ordering::SeqCst)).sum()
    }

    pub fn counts(&self) -> Vec<u64> {
        self.acked
            .iter()
            .map(|a| a.load(Ordering::SeqCst))
            .collect()
    }

    /// Written after every phase: the record of what was acknowledged lives outside the server.
    /// `{"acked": [count per writer], "phases": [per writer, [first seq, phase] per phase]}`.
    pub fn save(&self, path: &Path) -> anyhow::Result<()> {
        let phases = self
            .phases
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let saved = serde_json::json!({ "acked": self.counts(), "phases": phases });
        std::fs::write(path, serde_json::to_vec(&saved)?)?;
        Ok(())
    }
}

async fn cells(addr: std::net::SocketAddr, creds: &Credentials) -> anyhow::Result<Cells> {
    let ch = Endpoint::from_shared(format!("http://{addr}"))?
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await?;
    let signer = CallSigner::new(&creds.tenant, &creds.key_id, creds.secret()?);
    Ok(CellsClient::new(Signing::new(ch, signer)))
}

/// When the writers stop.
#[derive(Clone)]
pub struct Until {
    /// Total acknowledged bytes (over all writers, since the ledger began).
    pub bytes: u64,
    pub deadline: Instant,
    /// Set by the scenario just before it kills or stops the server: from then on, the errors
    /// a closing server's connection gives end a writer instead of counting as refusals.
    pub stop: Arc<AtomicBool>,
    /// Set once the server is gone (killed, or exited after SIGTERM): writers stop starting
    /// writes. Until then they keep writing, so that writes are in flight when the stop lands.
    pub gone: Arc<AtomicBool>,
    /// Keep retrying a record refused as RESOURCE_EXHAUSTED / UNAVAILABLE (disk full).
    pub retry_refused: bool,
}

/// What the writers saw.
#[derive(Debug, Default, Clone, Serialize)]
pub struct WriteStats {
    pub acked_this_phase: u64,
    /// Refusals by gRPC code while the server was meant to be serving.
    pub refused: BTreeMap<String, u64>,
    /// Writes the stop ended with an error, by gRPC code: each writer's write in flight (or
    /// started) when the server went away.
    pub stopped: BTreeMap<String, u64>,
    /// Writes sent before the stop began and answered after it (cut off by a kill, drained or
    /// refused unprocessed by a graceful stop): 0 when the stop found every writer idle. Until
    /// 2026-12-06 the round's mid-write check used `stopped`, which a write sent after the
    /// kill fills too.
    pub in_flight_at_stop: u64,
    pub seconds: f64,
}

/// Longest a harness write may take before it counts as refused (`DeadlineExceeded`).
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// One connection per ledger slot, for [`write`]: made before the writing starts, so that a
/// stop timed from it falls while the writers write, never while they connect.
pub async fn writers(
    addr: std::net::SocketAddr,
    creds: &Credentials,
    ledger: &Ledger,
) -> anyhow::Result<Vec<Cells>> {
    let mut clients = Vec::with_capacity(ledger.acked.len());
    for _ in 0..ledger.acked.len() {
        clients.push(cells(addr, creds).await?);
    }
    Ok(clients)
}

/// Run one writer task per ledger slot, each on its connection from [`writers`], until
/// `until`.
pub async fn write(
    clients: Vec<Cells>,
    ledger: &Arc<Ledger>,
    until: Until,
) -> anyhow::Result<WriteStats> {
    anyhow::ensure!(
        clients.len() == ledger.acked.len(),
        "one connection per writer"
    );
    let started = Instant::now();
    let before = ledger.total();
    let phase = ledger.begin_phase();
    let mut tasks = Vec::new();
    for (w, mut c) in clients.into_iter().enumerate() {
        let (ledger, until) = (ledger.clone(), until.clone());
        tasks.push(tokio::spawn(async move {
            let mut refused: BTreeMap<String, u64> = BTreeMap::new();
            let mut stopped: BTreeMap<String, u64> = BTreeMap::new();
            let mut in_flight_at_stop = 0;
            let len = ledger.value_bytes as u64;
            loop {
                if until.gone.load(Ordering::SeqCst)
                    || Instant::now() >= until.deadline
                    || ledger.total() * len >= until.bytes
                {
                    break;
                }
                let seq = ledger.acked[w].load(Ordering::SeqCst);
                // In flight at the stop: sent before it began, answered after.
                let sent_before_stop = !until.stop.load(Ordering::SeqCst);
                let req = WriteRequest {
                    coord: Some(Coord {
                        x: w as i32,
                        y: seq as i32,
                        z: Z,
                    }),
                    value: record::encode(w as u32, seq, phase, ledger.value_bytes),
                    expected_version: None,
                };
                // A write stuck for this long is a failure, not a reason to hang the run.
                let answer = match tokio::time::timeout(WRITE_TIMEOUT, c.write(req)).await {
                    Ok(answer) => answer,
                    Err(_) => Err(tonic::Status::deadline_exceeded(format!(
                        "no answer within {} s",
                        WRITE_TIMEOUT.as_secs()
                    ))),
                };
                if sent_before_stop && until.stop.load(Ordering::SeqCst) {
                    in_flight_at_stop += 1;
                }
                match answer {
                    Ok(_) => {
                        ledger.acked[w].fetch_add(1, Ordering::SeqCst);
                    }
                    // The kill's own errors: the connection reset or refused. Any other code
                    // came from the server while it was alive and counts below.
                    Err(s)
                        if until.stop.load(Ordering::SeqCst)
                            && matches!(
                                s.code(),
                                Code::Unavailable
                                    | Code::Unknown
                                    | Code::Cancelled
                                    | Code::Internal
                            ) =>
                    {
                        *stopped.entry(format!("{:?}", s.code())).or_default() += 1;
                        break;
                    }
                    Err(s) => {
                        *refused.entry(format!("{:?}", s.code())).or_default() += 1;
                        let full = matches!(s.code(), Code::ResourceExhausted | Code::Unavailable);
                        if !(until.retry_refused && full) {
                            break;
                        }
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
            }
            (refused, stopped, in_flight_at_stop)
        }));
    }
    let mut stats = WriteStats::default();
    for t in tasks {
        let (refused, stopped, in_flight) = t.await?;
        stats.in_flight_at_stop += in_flight;
        for (k, v) in refused {
            *stats.refused.entry(k).or_default() += v;
        }
        for (k, v) in stopped {
            *stats.stopped.entry(k).or_default() += v;
        }
    }
    stats.acked_this_phase = ledger.total() - before;
    stats.seconds = started.elapsed().as_secs_f64();
    Ok(stats)
}

/// What verification found over all writers.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Verification {
    pub acked: u64,
    /// Acknowledged records found whole and in place: must equal `acked`.
    pub found_acked: u64,
    pub missing: u64,
    pub corrupt: u64,
    pub misplaced: u64,
    /// Acknowledged records found whole but as an earlier, unacknowledged write of theirs (a
    /// write in flight at a cut, written again by the next phase): the acknowledged overwrite
    /// was lost.
    pub stale: u64,
    /// Sequence numbers absent below a present one.
    pub holes: u64,
    /// Records beyond the acknowledged ones (at most one per writer: its write in flight).
    pub beyond_acked: u64,
    /// Records beyond the first unacknowledged one of a writer: never legitimate.
    pub excess_in_flight: u64,
    /// Sum of the versions of every record cell found: the writes the store applied to them
    /// (acknowledged ones, writes in flight at a cut that landed, and any write sent again).
    pub cell_versions: u64,
    /// Entries of the tenant's audit trail, and how many of them record a write.
    pub audit_entries: u64,
    pub audit_writes: u64,
    /// Where the trail's hash chain breaks, or why its write entries are not exactly one per
    /// applied write (`cell_versions`); `None` if sound.
    pub audit_problem: Option<String>,
    pub problems: Vec<String>,
    pub ok: bool,
}

/// Every record of writer `w`'s column, by seq, and the sum of their versions.
async fn column(c: &mut Cells, w: i32) -> Result<(BTreeMap<i32, Vec<u8>>, u64), tonic::Status> {
    let (min, max) = (
        Coord { x: w, y: 0, z: Z },
        Coord {
            x: w,
            y: i32::MAX,
            z: Z,
        },
    );
    let mut out = BTreeMap::new();
    let mut versions = 0;
    // A cell outside the column, or one sent twice, is the scan's fault, not the data's: it is
    // reported as itself, not as a miscount further on.
    let mut wrong = None;
    cube_testkit::region_for_each(c, min, max, 1000, |cell| match cell.coord {
        Some(k) if k.x == w && k.z == Z && !out.contains_key(&k.y) => {
            versions += cell.version;
            out.insert(k.y, cell.value);
        }
        other => {
            wrong.get_or_insert(format!(
                "Region over writer {w}'s column returned {other:?}"
            ));
        }
    })
    .await?;
    match wrong {
        Some(what) => Err(tonic::Status::internal(format!(
            "{what}: outside the box, or a second time"
        ))),
        None => Ok((out, versions)),
    }
}

pub async fn verify(server: &TestServer, ledger: &Ledger) -> anyhow::Result<Verification> {
    let mut v = Verification::default();
    let mut c = cells(server.addr, &server.demo).await?;
    let note = |v: &mut Verification, p: String| {
        if v.problems.len() < 20 {
            v.problems.push(p);
        }
    };
    for (w, acked) in ledger.counts().into_iter().enumerate() {
        v.acked += acked;
        // UNAVAILABLE asks for a retry (a tenant still applying its replayed log, or
        // reopening): that is no failure of the run.
        let started = Instant::now();
        let (col, versions) = loop {
            match column(&mut c, w as i32).await {
                Err(e) if retry_later(&e) && started.elapsed() < REOPEN_PATIENCE => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                other => break other,
            }
        }
        .with_context(|| format!("reading writer {w}'s records back"))?;
        v.cell_versions += versions;
        for seq in 0..acked {
            match col.get(&(seq as i32)) {
                None => {
                    v.missing += 1;
                    note(
                        &mut v,
                        format!("writer {w}: acknowledged record {seq} is missing"),
                    );
                }
                Some(value) => match record::check(
                    value,
                    w as u32,
                    seq,
                    ledger.phase_of(w, seq),
                    ledger.value_bytes,
                ) {
                    record::Check::Good => v.found_acked += 1,
                    record::Check::OtherPhase { phase } => {
                        v.stale += 1;
                        note(
                            &mut v,
                            format!(
                                "writer {w}: record {seq} is the write of phase {phase}, not the \
                                 acknowledged one of phase {:?} (an overwrite lost)",
                                ledger.phase_of(w, seq)
                            ),
                        );
                    }
                    record::Check::Corrupt => {
                        v.corrupt += 1;
                        note(&mut v, format!("writer {w}: record {seq} fails its CRC"));
                    }
                    record::Check::Misplaced { writer, seq: s } => {
                        v.misplaced += 1;
                        note(
                            &mut v,
                            format!("writer {w}: record {seq} holds writer {writer}'s record {s}"),
                        );
                    }
                },
            }
        }
        let beyond: Vec<i32> = col.keys().copied().filter(|&y| y as u64 >= acked).collect();
        v.beyond_acked += beyond.len() as u64;
        if beyond.len() > 1 {
            v.excess_in_flight += beyond.len() as u64 - 1;
            note(
                &mut v,
                format!(
                    "writer {w}: {} records beyond the acknowledged {acked}",
                    beyond.len()
                ),
            );
        }
        if let Some(&max) = col.keys().next_back() {
            let holes = (max as u64 + 1).saturating_sub(col.len() as u64);
            if holes > 0 {
                v.holes += holes;
                note(
                    &mut v,
                    format!("writer {w}: {holes} holes below record {max}"),
                );
            }
        }
        for y in &beyond {
            if record::check(&col[y], w as u32, *y as u64, None, ledger.value_bytes)
                != record::Check::Good
            {
                v.corrupt += 1;
                note(
                    &mut v,
                    format!("writer {w}: unacknowledged record {y} is not whole"),
                );
            }
        }
    }
    check_audit(server, &mut v).await?;
    if let Some(p) = v.audit_problem.clone() {
        note(&mut v, format!("audit trail: {p}"));
    }
    v.ok = v.found_acked == v.acked
        && v.audit_problem.is_none()
        && v.missing == 0
        && v.corrupt == 0
        && v.misplaced == 0
        && v.stale == 0
        && v.holes == 0
        && v.excess_in_flight == 0;
    Ok(v)
}

/// Fetch the tenant's whole audit trail and check it: one unbroken hash chain from seq 1 (as
/// `cubec audit verify` does; the harness's servers retain [`AUDIT_RETENTION`] entries, more
/// than any run writes), holding exactly one `write` entry per write applied to a record cell
/// (each write is logged with its entry, so a crash leaves both or neither; a cell's version
/// counts the writes applied to it).
async fn check_audit(server: &TestServer, v: &mut Verification) -> anyhow::Result<()> {
    let mut tenant = TenantClient::new(server.signed(&server.demo).await?);
    // Read again from the start on UNAVAILABLE, as for the records.
    let started = Instant::now();
    let entries = loop {
        match trail(&mut tenant).await {
            Err(e) if retry_later(&e) && started.elapsed() < REOPEN_PATIENCE => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => break other,
        }
    }
    .context("reading the audit trail")?;
    v.audit_entries = entries.len() as u64;
    v.audit_writes = entries.iter().filter(|e| e.op == "write").count() as u64;
    v.audit_problem = match cube_auth::client::verify_audit_entries(&entries) {
        Err((seq, why)) => Some(format!("chain broken at seq {seq}: {why}")),
        Ok(_) if entries.first().is_none_or(|e| e.seq != 1) => Some(format!(
            "the trail starts at seq {:?}, not 1",
            entries.first().map(|e| e.seq)
        )),
        Ok(_) if v.audit_writes != v.cell_versions => Some(format!(
            "{} write entries for {} writes applied to the record cells ({} acknowledged)",
            v.audit_writes, v.cell_versions, v.acked
        )),
        Ok(_) => None,
    };
    Ok(())
}

/// The tenant's whole audit trail, page by page.
async fn trail(
    tenant: &mut TenantClient<Signing<Channel>>,
) -> Result<Vec<cube_api::v1::AuditEntry>, tonic::Status> {
    const PAGE: u32 = 1000;
    let mut entries = Vec::new();
    let mut next = 0;
    loop {
        let mut page = tenant
            .audit(AuditRequest {
                from_seq: next,
                limit: PAGE,
            })
            .await?
            .into_inner();
        let before = entries.len();
        while let Some(e) = page.message().await? {
            next = e.seq + 1;
            entries.push(e);
        }
        if entries.len() == before {
            return Ok(entries);
        }
    }
}

/// Whether a read's refusal asks for a retry: UNAVAILABLE (a tenant still applying its
/// replayed log, or reopening), or RESOURCE_EXHAUSTED from a tenant whose open ran out of disk
/// space (E, before the ballast is removed).
fn retry_later(e: &tonic::Status) -> bool {
    e.code() == Code::Unavailable
        || e.code() == Code::ResourceExhausted && e.message().contains("cannot be opened now")
}

/// `--audit-retention` of every server the harness starts: more entries than any run writes, so
/// the whole trail is checked.
pub const AUDIT_RETENTION: &str = "1000000000";

/// `cubed serve` flags of every server the harness starts.
pub const SERVER_FLAGS: [&str; 2] = ["--audit-retention", AUDIT_RETENTION];

/// Fail `v` unless its round's writers wrote without a refusal until they were told to stop,
/// and got at least one write acknowledged (else a server refusing every write would pass).
/// Returns whether they did.
pub fn require_clean_writes(write: &WriteStats, v: &mut Verification) -> bool {
    let clean = write.refused.is_empty() && write.acked_this_phase > 0;
    if !write.refused.is_empty() {
        v.ok = false;
        v.problems.push(format!(
            "writes refused before the stop: {:?}",
            write.refused
        ));
    }
    if write.acked_this_phase == 0 {
        v.ok = false;
        v.problems
            .push("no write was acknowledged in this round".to_string());
    }
    clean
}

/// A round that stopped the server under its writers must have caught them writing: at least
/// one write cut off by the stop (otherwise it tested an idle stop, which B covers). A graceful
/// stop must also have answered every write it took: a record found beyond the acknowledged
/// ones is a write the server applied and never answered, a call the drain cut short. Returns
/// whether the round passed both.
pub fn require_stop_mid_write(write: &WriteStats, graceful: bool, v: &mut Verification) -> bool {
    let mid_write = write.in_flight_at_stop > 0;
    let drained = !graceful || v.beyond_acked == 0;
    if !mid_write {
        v.ok = false;
        v.problems.push(
            "no write was in flight when the stop began (sent before it, answered after): it \
             found every writer idle, so the round did not stop the server mid-write"
                .to_string(),
        );
    }
    if !drained {
        v.ok = false;
        v.problems.push(format!(
            "the graceful stop applied {} writes it never answered: SIGTERM must answer the calls \
             it took before it exits",
            v.beyond_acked
        ));
    }
    mid_write && drained
}

/// How long one read may keep answering `UNAVAILABLE` while its tenant reopens before
/// [`spot_read`] fails: a tenant whose apply failed on the full disk answers reads so until the
/// server's janitor has reopened it, "within about a second" (docs/durability.md, "Tenant state
/// store").
pub const REOPEN_PATIENCE: Duration = Duration::from_secs(15);

/// What [`spot_read`] read, summed over its calls.
#[derive(Debug, Default)]
pub struct SpotReads {
    /// Acknowledged records read back whole.
    pub good: usize,
    /// Reads first answered `UNAVAILABLE` (the tenant reopening), then served on a retry.
    pub waited: usize,
    /// The longest such wait.
    pub longest_wait: Duration,
    /// The message of the first such answer.
    pub first_message: Option<String>,
}

/// Read a few acknowledged records one by one (reads must work while writes are refused), and
/// add what was read to `out`. A read answered `UNAVAILABLE` is retried, as its message asks,
/// for up to [`REOPEN_PATIENCE`]; such reads are counted, and any other refusal fails.
pub async fn spot_read(
    server: &TestServer,
    ledger: &Ledger,
    n: usize,
    out: &mut SpotReads,
) -> anyhow::Result<()> {
    let mut c = cells(server.addr, &server.demo).await?;
    for (w, acked) in ledger.counts().into_iter().enumerate().take(n) {
        if acked == 0 {
            continue;
        }
        let seq = acked - 1;
        let request = ReadRequest {
            coord: Some(Coord {
                x: w as i32,
                y: seq as i32,
                z: Z,
            }),
        };
        let started = Instant::now();
        let mut refused = false;
        let r = loop {
            match c.read(request).await {
                Ok(r) => break r.into_inner(),
                Err(e) if retry_later(&e) && started.elapsed() < REOPEN_PATIENCE => {
                    refused = true;
                    out.first_message
                        .get_or_insert_with(|| e.message().to_string());
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => {
                    return Err(e).with_context(|| {
                        format!(
                            "writer {w}: reading acknowledged record {seq} ({} ms after the \
                             first try)",
                            started.elapsed().as_millis()
                        )
                    });
                }
            }
        };
        if refused {
            out.waited += 1;
            out.longest_wait = out.longest_wait.max(started.elapsed());
        }
        if r.found
            && record::check(
                &r.value,
                w as u32,
                seq,
                ledger.phase_of(w, seq),
                ledger.value_bytes,
            ) == record::Check::Good
        {
            out.good += 1;
        } else {
            bail!(
                "writer {w}: acknowledged record {seq} did not read back while the disk was full"
            );
        }
    }
    Ok(())
}

/// Make everything the server wrote so far reach the disk (the set-up before a power cut: the
/// tenant and its credentials exist before the writes under test start).
pub fn sync_all() {
    let _ = std::process::Command::new("sync").status();
}

pub fn cubed_default() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.join("cubed")))
        .unwrap_or_else(|| PathBuf::from("cubed"))
}

pub mod scenarios;

#[cfg(test)]
mod tests {
    use super::*;

    /// An acknowledged record's phase is the last one that began at or below it: a phase that
    /// acknowledged nothing for a writer hands its seq on to the next.
    #[test]
    fn each_acknowledged_record_belongs_to_the_phase_that_acknowledged_it() {
        let ledger = Ledger::new(2, 64);
        assert_eq!(ledger.begin_phase(), 0);
        ledger.acked[0].store(5, Ordering::SeqCst);
        assert_eq!(ledger.begin_phase(), 1);
        // Phase 1 acknowledged nothing for writer 0 (its write of record 5 was cut off).
        assert_eq!(ledger.begin_phase(), 2);
        ledger.acked[0].store(9, Ordering::SeqCst);
        ledger.acked[1].store(1, Ordering::SeqCst);
        assert_eq!(ledger.phase_of(0, 0), Some(0));
        assert_eq!(ledger.phase_of(0, 4), Some(0));
        assert_eq!(ledger.phase_of(0, 5), Some(2));
        assert_eq!(ledger.phase_of(0, 8), Some(2));
        assert_eq!(ledger.phase_of(1, 0), Some(2));
    }
}
