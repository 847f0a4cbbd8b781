//! The five ways the server goes away (or runs out of room), each ending in verification.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use cube_testkit::TestServer;
use rand::Rng;
use serde::Serialize;

use super::{
    AUDIT_RETENTION, Ledger, SERVER_FLAGS, SpotReads, Until, Verification, WriteStats, fs,
    require_clean_writes, require_stop_mid_write, spot_read, sync_all, verify, write, writers,
};

/// Shared settings of a run.
pub struct Settings {
    pub cubed: PathBuf,
    pub writers: usize,
    pub value_bytes: usize,
    /// Acknowledged bytes each writing phase aims for.
    pub size: u64,
    pub repeat: usize,
    /// Where images, mounts and ledgers go.
    pub work: PathBuf,
}

/// One repetition: what was written, what came back.
#[derive(Debug, Clone, Serialize)]
pub struct Round {
    pub what: String,
    pub write: WriteStats,
    pub verified: Verification,
}

#[derive(Debug, Clone, Serialize)]
pub struct ScenarioReport {
    pub name: String,
    pub title: String,
    /// Set when the scenario could not run here, with the reason.
    pub skipped: Option<String>,
    pub rounds: Vec<Round>,
    pub notes: Vec<String>,
    pub ok: bool,
}

impl ScenarioReport {
    fn new(name: &str, title: &str) -> ScenarioReport {
        ScenarioReport {
            name: name.into(),
            title: title.into(),
            skipped: None,
            rounds: Vec::new(),
            notes: Vec::new(),
            ok: false,
        }
    }

    fn finish(mut self) -> ScenarioReport {
        self.ok = self.skipped.is_none() && self.rounds.iter().all(|r| r.verified.ok);
        self
    }
}

fn until(bytes: u64, secs: f64) -> (Until, Arc<AtomicBool>, Arc<AtomicBool>) {
    let (stop, gone) = (Arc::default(), Arc::default());
    (
        Until {
            bytes,
            deadline: Instant::now() + Duration::from_secs_f64(secs),
            stop: Arc::clone(&stop),
            gone: Arc::clone(&gone),
            retry_refused: false,
        },
        stop,
        gone,
    )
}

fn target(ledger: &Ledger, s: &Settings) -> u64 {
    ledger.total() * ledger.value_bytes as u64 + s.size
}

fn progress(name: &str, round: &Round) {
    let v = &round.verified;
    eprintln!(
        "  [{name}] {}: acknowledged {} (+{} this round), found {} whole, missing {}, corrupt {}, overwrites lost {}, holes {}, in flight {}{}, audit {} entries ({} writes, {}) -> {}",
        round.what,
        v.acked,
        round.write.acked_this_phase,
        v.found_acked,
        v.missing,
        v.corrupt,
        v.stale,
        v.holes,
        v.beyond_acked,
        if round.write.stopped.is_empty() && round.write.in_flight_at_stop == 0 {
            String::new()
        } else {
            format!(
                ", {} in flight at the stop, ended by it {:?}",
                round.write.in_flight_at_stop, round.write.stopped
            )
        },
        v.audit_entries,
        v.audit_writes,
        v.audit_problem.as_deref().unwrap_or("chain sound"),
        if v.ok {
            "ok"
        } else if v.missing + v.corrupt + v.misplaced + v.stale + v.holes > 0 {
            "LOST DATA"
        } else {
            "FAILED"
        }
    );
}

/// A: SIGTERM (graceful stop) after the writes, restart, verify; then once more with the
/// SIGTERM arriving while the writers write, so the stop drains writes in flight.
pub async fn graceful(s: &Settings) -> anyhow::Result<ScenarioReport> {
    let mut rep = ScenarioReport::new("A", "graceful stop (SIGTERM), restart, verify");
    let mut server =
        tokio::task::block_in_place(|| TestServer::start_with(&s.cubed, &SERVER_FLAGS))?;
    let ledger = Arc::new(Ledger::new(s.writers, s.value_bytes));
    for i in 0..s.repeat {
        let (u, _, _) = until(target(&ledger, s), 600.0);
        let clients = writers(server.addr, &server.demo, &ledger).await?;
        let w = write(clients, &ledger, u).await?;
        let status = tokio::task::block_in_place(|| server.sigterm())?;
        if !status.success() {
            bail!("cubed exited with {status} after SIGTERM");
        }
        ledger.save(&s.work.join("acked-A.json"))?;
        tokio::task::block_in_place(|| server.restart())?;
        let mut round = Round {
            what: format!(
                "round {}: SIGTERM exit {}",
                i + 1,
                status.code().unwrap_or(-1)
            ),
            write: w,
            verified: verify(&server, &ledger).await?,
        };
        let _ = require_clean_writes(&round.write, &mut round.verified);
        progress("A", &round);
        rep.rounds.push(round);
    }
    let after = Duration::from_millis(rand::thread_rng().gen_range(300..1500));
    let w = write_and_stop(&mut server, &ledger, s, after, Stop::Term, || {}).await?;
    tokio::task::block_in_place(|| server.restart())?;
    let mut round = Round {
        what: format!(
            "round {}: SIGTERM {} ms after the first acknowledged write, exit 0",
            s.repeat + 1,
            after.as_millis()
        ),
        write: w,
        verified: verify(&server, &ledger).await?,
    };
    let _ = require_clean_writes(&round.write, &mut round.verified);
    let _ = require_stop_mid_write(&round.write, true, &mut round.verified);
    progress("A", &round);
    rep.rounds.push(round);
    Ok(rep.finish())
}

/// B: kill -9 while idle (every write answered), restart, verify.
pub async fn kill_idle(s: &Settings) -> anyhow::Result<ScenarioReport> {
    let mut rep = ScenarioReport::new("B", "kill -9 while idle, restart, verify");
    let mut server =
        tokio::task::block_in_place(|| TestServer::start_with(&s.cubed, &SERVER_FLAGS))?;
    let ledger = Arc::new(Ledger::new(s.writers, s.value_bytes));
    for i in 0..s.repeat {
        let (u, _, _) = until(target(&ledger, s), 600.0);
        let clients = writers(server.addr, &server.demo, &ledger).await?;
        let w = write(clients, &ledger, u).await?;
        tokio::time::sleep(Duration::from_millis(300)).await;
        tokio::task::block_in_place(|| server.kill9())?;
        ledger.save(&s.work.join("acked-B.json"))?;
        tokio::task::block_in_place(|| server.restart())?;
        let mut round = Round {
            what: format!("round {}: kill -9 idle", i + 1),
            write: w,
            verified: verify(&server, &ledger).await?,
        };
        let _ = require_clean_writes(&round.write, &mut round.verified);
        progress("B", &round);
        rep.rounds.push(round);
    }
    Ok(rep.finish())
}

/// Longest [`write_and_stop`] waits for its phase's first acknowledged write before its timer
/// starts anyway (the round then fails: nothing acknowledged).
const FIRST_ACK: Duration = Duration::from_secs(60);

/// How a scenario ends the server under its writers.
#[derive(Clone, Copy)]
enum Stop {
    Kill,
    /// SIGTERM, and the exit must be clean.
    Term,
}

/// Write until the server is stopped (`how`) `after` the phase's first acknowledged write (a
/// random moment), while the writers' writes are in flight. Timed from the first
/// acknowledgement, not from the start: a first write that opens the tenant on a slow machine
/// could take longer than `after`, and the round would stop a server that acknowledged nothing.
async fn write_and_stop(
    server: &mut TestServer,
    ledger: &Arc<Ledger>,
    s: &Settings,
    after: Duration,
    how: Stop,
    at_cut: impl FnOnce(),
) -> anyhow::Result<WriteStats> {
    let (u, stop, gone) = until(u64::MAX, 600.0);
    let clients = writers(server.addr, &server.demo, ledger).await?;
    let writing = {
        let ledger = ledger.clone();
        tokio::spawn(async move { write(clients, &ledger, u).await })
    };
    let (before, waiting) = (ledger.total(), Instant::now());
    while ledger.total() == before && !writing.is_finished() && waiting.elapsed() < FIRST_ACK {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(after).await;
    // The stop flag first, so the writers take the connection errors that follow as the end,
    // not as refusals; then the stop, while they keep writing (they start no new write only
    // once the server is gone).
    stop.store(true, Ordering::SeqCst);
    match how {
        Stop::Kill => tokio::task::block_in_place(|| server.kill9())?,
        Stop::Term => {
            let status = tokio::task::block_in_place(|| server.sigterm())?;
            if !status.success() {
                bail!("cubed exited with {status} after SIGTERM during writes");
            }
        }
    }
    gone.store(true, Ordering::SeqCst);
    at_cut();
    let w = writing.await??;
    ledger.save(&s.work.join("acked.json"))?;
    Ok(w)
}

/// C: kill -9 at a random moment during writes, restart, verify; K times on the same data.
pub async fn kill_writing(s: &Settings) -> anyhow::Result<ScenarioReport> {
    let mut rep = ScenarioReport::new(
        "C",
        "kill -9 at a random moment during writes, restart, verify",
    );
    let mut server =
        tokio::task::block_in_place(|| TestServer::start_with(&s.cubed, &SERVER_FLAGS))?;
    let ledger = Arc::new(Ledger::new(s.writers, s.value_bytes));
    for i in 0..s.repeat {
        let after = Duration::from_millis(rand::thread_rng().gen_range(300..2500));
        let w = write_and_stop(&mut server, &ledger, s, after, Stop::Kill, || {}).await?;
        tokio::task::block_in_place(|| server.restart())?;
        let mut round = Round {
            what: format!(
                "round {}: kill -9 {} ms after the first acknowledged write",
                i + 1,
                after.as_millis()
            ),
            write: w,
            verified: verify(&server, &ledger).await?,
        };
        let _ = require_clean_writes(&round.write, &mut round.verified);
        let _ = require_stop_mid_write(&round.write, false, &mut round.verified);
        progress("C", &round);
        rep.rounds.push(round);
    }
    Ok(rep.finish())
}

/// The control round's relaxed policy: at most this many records acknowledged and not yet
/// fdatasync'ed, the bound on what its cut may lose...
const CONTROL_MAX_RECORDS: u64 = 5000;

/// Extra `cubed serve` flags of every second sync round of D: checkpoints every 64 KiB of log
/// and 256-KiB segments, so that the cut lands among checkpoints' flushes, their deletions of
/// covered segments and recycled segments' reuse (with the defaults, a checkpoint every 64 MiB
/// or 60 s, none runs in a round's few seconds of writes).
const CHECKPOINTING: [&str; 4] = [
    "--checkpoint-bytes",
    "65536",
    "--wal-segment-max-bytes",
    "262144",
];
/// ...and at most this long.
const CONTROL_MAX_DELAY_MS: u64 = 1000;
/// Control cuts made until one loses something (writeback may beat a cut to the device).
const CONTROL_CUTS: usize = 3;

/// D: power loss. The data directory is on ext4 on a loop device; at a random moment during
/// writes the server is killed and the image copied as the device holds it: whatever was still
/// only in the page cache (not fdatasync'ed, not yet written back) is not in the copy. The
/// server restarts on the copy and everything acknowledged is verified. A control round with
/// the relaxed policy (acknowledges before fdatasync) is expected to lose records, which shows
/// that the method cuts something: a control that loses nothing is cut again (writeback may have
/// reached the device first), up to [`CONTROL_CUTS`] times, and none losing anything fails the
/// scenario, as does losing more than the policy's record bound, or damage to what survived.
pub async fn power_loss(s: &Settings) -> anyhow::Result<ScenarioReport> {
    let mut rep = ScenarioReport::new(
        "D",
        "power loss: kill -9 and keep only what reached the (loop) block device, restart, verify",
    );
    if let Some(why) = fs::loop_unsupported() {
        rep.skipped = Some(why);
        return Ok(rep.finish());
    }
    let mut control_cuts = 0;
    for i in 0.. {
        let control = i >= s.repeat;
        control_cuts += usize::from(control);
        let checkpointing = !control && i % 2 == 1;
        let mut flags = SERVER_FLAGS.to_vec();
        if checkpointing {
            flags.extend(CHECKPOINTING);
        }
        // The tenant's WAL directory, relative to the data directory (the same on the copy).
        let wal_dir: Option<PathBuf>;
        let dir = s.work.join(format!("D{i}"));
        fs::make_dir(&dir)?;
        let (image, snap) = (dir.join("disk.img"), dir.join("after-cut.img"));
        let ledger = Arc::new(Ledger::new(s.writers, s.value_bytes));
        // A checkpointing round cuts later, so that a checkpoint has run on a slow machine too.
        let after = Duration::from_millis(rand::thread_rng().gen_range(if checkpointing {
            1500..3500
        } else {
            500..2500
        }));
        let w = {
            let live = fs::Mount::ext4_image(&image, 1 << 30, true, &dir.join("live"))?;
            let data = live.dir.join("data");
            let mut server =
                tokio::task::block_in_place(|| TestServer::start_at(&s.cubed, &data, &flags))?;
            wal_dir = server
                .tenant_wal_dir(&server.demo.tenant)
                .strip_prefix(&data)
                .ok()
                .map(Path::to_path_buf);
            if control {
                let out = server.cli(&[
                    "tenant",
                    "durability",
                    &server.demo.tenant,
                    "relaxed",
                    "--max-delay-ms",
                    &CONTROL_MAX_DELAY_MS.to_string(),
                    "--max-records",
                    &CONTROL_MAX_RECORDS.to_string(),
                ])?;
                if !out.status.success() {
                    bail!(
                        "setting the relaxed policy: {}",
                        String::from_utf8_lossy(&out.stderr)
                    );
                }
            }
            // Set-up (tenant, credentials) is on disk before the writes under test start.
            sync_all();
            let mut snapshot = Ok(());
            let w = write_and_stop(&mut server, &ledger, s, after, Stop::Kill, || {
                snapshot = fs::snapshot(&image, &snap);
            })
            .await?;
            snapshot.context("copying the image at the cut")?;
            w
            // `live` unmounts here: its dirty pages go to the original image, not the copy.
        };
        let after_cut = fs::Mount::ext4_image(&snap, 1 << 30, false, &dir.join("after"))
            .context("mounting the image as it was at the cut")?;
        // Before a server opens it: the log as the cut left it.
        let first_segment = wal_dir
            .as_ref()
            .and_then(|d| oldest_segment(&after_cut.dir.join("data").join(d)));
        // As configured when cut (the log's segment sizes, the checkpoints).
        let server = tokio::task::block_in_place(|| {
            TestServer::start_at(&s.cubed, &after_cut.dir.join("data"), &flags)
        })?;
        let verified = match verify(&server, &ledger).await {
            Ok(v) => v,
            // Under `relaxed` the kernel may have persisted a later part of the unsynced window
            // but not an earlier one, and the tenant then refuses to open until its log is
            // repaired (docs/durability.md, Known limits): the control reports it, the run goes
            // on, provided its writes ran clean up to a cut mid-write. Any other error, and
            // this one in a `sync` round, is a failure.
            Err(e) if control && refused_as_corrupt_log(&e) => {
                let mut v = Verification {
                    ok: true,
                    ..Verification::default()
                };
                let clean =
                    require_clean_writes(&w, &mut v) & require_stop_mid_write(&w, false, &mut v);
                rep.notes.push(format!(
                    "control: the tenant did not open after the cut ({e:#}), the relaxed \
                     policy's known limit (the cut did drop unsynced data)"
                ));
                drop(server);
                drop(after_cut);
                let _ = std::fs::remove_dir_all(&dir);
                if !clean {
                    rep.rounds.push(Round {
                        what: format!(
                            "control (relaxed policy): cut {} ms after the first acknowledged write, the tenant did not open",
                            after.as_millis()
                        ),
                        write: w,
                        verified: v,
                    });
                }
                break;
            }
            Err(e) => return Err(e),
        };
        drop(server);
        drop(after_cut);
        let _ = std::fs::remove_dir_all(&dir);
        let mut round = Round {
            what: if control {
                format!(
                    "control (relaxed policy, at most {CONTROL_MAX_RECORDS} records or \
                     {CONTROL_MAX_DELAY_MS} ms unsynced): cut {} ms after the first acknowledged write",
                    after.as_millis()
                )
            } else {
                format!(
                    "round {}: cut {} ms after the first acknowledged write{}",
                    i + 1,
                    after.as_millis(),
                    if checkpointing {
                        format!(
                            ", checkpoints every 64 KiB of log (256-KiB segments; the oldest \
                             segment left at the cut starts at seq {})",
                            first_segment.map_or("-".to_string(), |f| f.to_string())
                        )
                    } else {
                        String::new()
                    }
                )
            },
            write: w,
            verified,
        };
        // A checkpointing round must have cut a log that checkpoints had already shortened:
        // otherwise it tested what the other rounds do.
        if checkpointing && first_segment.is_none_or(|first| first <= 1) {
            round.verified.ok = false;
            round.verified.problems.push(format!(
                "no checkpoint had deleted a segment of the log before the cut (its oldest \
                 segment starts at seq {first_segment:?})"
            ));
        }
        let writes_clean = require_clean_writes(&round.write, &mut round.verified)
            & require_stop_mid_write(&round.write, false, &mut round.verified);
        progress("D", &round);
        if control {
            // One phase per cut: an acknowledged overwrite cannot be lost, but would count.
            let lost = round.verified.missing + round.verified.stale;
            rep.notes.push(if lost > 0 {
                format!(
                    "control: with the relaxed policy the cut lost {lost} of {} acknowledged records, as that policy allows (at most {CONTROL_MAX_RECORDS}): the method does drop unsynced data",
                    round.verified.acked
                )
            } else {
                format!(
                    "control cut {control_cuts}: with the relaxed policy the cut lost nothing of {} acknowledged records: writeback had reached the device",
                    round.verified.acked
                )
            });
            // Anything wrong but the losses the policy allows fails the control, a cut that
            // lost nothing included: what survived is whole, in place and contiguous, and its
            // audit trail sound.
            let v = &round.verified;
            let damaged = v.corrupt + v.misplaced + v.holes + v.excess_in_flight;
            let sound = damaged == 0 && v.audit_problem.is_none() && writes_clean;
            // A method that never drops unsynced data cannot tell a server that syncs from one
            // that does not: the sync rounds above would pass either way.
            if lost == 0 && sound {
                if control_cuts < CONTROL_CUTS {
                    continue;
                }
                round.verified.ok = false;
                round.verified.problems.push(format!(
                    "in {CONTROL_CUTS} control cuts the method dropped no unsynced data, so the \
                     rounds above show nothing about power loss on this machine"
                ));
                rep.rounds.push(round);
                break;
            }
            // The policy's bound: what was lost is within its record limit.
            let beyond_bound = lost > CONTROL_MAX_RECORDS || damaged > 0;
            if beyond_bound {
                round.verified.problems.push(format!(
                    "relaxed policy: lost {lost} acknowledged records (bound {CONTROL_MAX_RECORDS}), {damaged} damaged"
                ));
            }
            if beyond_bound || !sound {
                round.verified.ok = false;
                rep.rounds.push(round);
            }
            break;
        } else {
            rep.rounds.push(round);
        }
    }
    Ok(rep.finish())
}

/// The first seq of the oldest segment in the WAL directory `dir` (from the segment files'
/// names, `<first seq, 20 digits>[-<salt>].wal`), if it holds any.
fn oldest_segment(dir: &Path) -> Option<u64> {
    std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            let stem = name.strip_suffix(".wal")?;
            stem.get(..20)?.parse::<u64>().ok()
        })
        .min()
}

/// Whether `e` is the tenant refusing to open because its log needs repair (`DATA_LOSS`,
/// "its write-ahead log is corrupt"; `UNAVAILABLE` from servers before 2026-12-05): the one
/// error a control round may end with.
fn refused_as_corrupt_log(e: &anyhow::Error) -> bool {
    e.chain()
        .filter_map(|c| c.downcast_ref::<tonic::Status>())
        .any(|s| {
            matches!(s.code(), tonic::Code::DataLoss | tonic::Code::Unavailable)
                && s.message().contains("its write-ahead log is corrupt")
        })
}

/// E: disk full, twice. The data directory is on a small tmpfs; a ballast file takes all but a
/// little of it; writes must then be refused with RESOURCE_EXHAUSTED (or UNAVAILABLE), reads must
/// still work, and once the ballast is removed writes must resume. Then a restart, and
/// everything acknowledged is verified. The first round runs with the free-space guard
/// (`--min-free-bytes`), which refuses writes before the disk is full; the second without it
/// (`--min-free-bytes 0`), so the writes run into ENOSPC themselves (the state store's flushes
/// and new files first: the WAL's segments are preallocated, and applied batches go to fjall's
/// memtables without its journal): the tenant is poisoned, closed and reopened once there is
/// room again.
pub async fn disk_full(s: &Settings) -> anyhow::Result<ScenarioReport> {
    let mut rep = ScenarioReport::new(
        "E",
        "disk full: writes refused, reads served, writes resume once space is freed; restart, verify",
    );
    if let Some(why) = fs::tmpfs_unsupported() {
        rep.skipped = Some(why);
        return Ok(rep.finish());
    }
    for (round, guard) in [(1, Some(8u64 << 20)), (2, None)] {
        let r = disk_full_round(s, &mut rep.notes, round, guard).await?;
        progress("E", &r);
        rep.rounds.push(r);
    }
    Ok(rep.finish())
}

/// Passes of reads while the disk is full (see `disk_full_round`).
const READ_PASSES_WHILE_FULL: usize = 3;

async fn disk_full_round(
    s: &Settings,
    notes: &mut Vec<String>,
    round: usize,
    guard: Option<u64>,
) -> anyhow::Result<Round> {
    let min_free = guard.unwrap_or(0);
    let label = match guard {
        Some(b) => format!("round {round}, free-space guard at {} MiB", b >> 20),
        None => format!("round {round}, no guard (the writes themselves hit ENOSPC)"),
    };
    let mnt = fs::Mount::tmpfs(&s.work.join(format!("E{round}")), 256 << 20)?;
    let data = mnt.dir.join("data");
    let mut server = tokio::task::block_in_place(|| {
        TestServer::start_at(
            &s.cubed,
            &data,
            // Idle tenants close after a second, so the tenant is also closed and woken again
            // by a read while the disk is full (between the read passes below).
            &[
                "--min-free-bytes",
                &min_free.to_string(),
                "--idle-secs",
                "1",
                "--audit-retention",
                AUDIT_RETENTION,
            ],
        )
    })?;
    let ledger = Arc::new(Ledger::new(s.writers, s.value_bytes));
    // Some data first, then ballast leaving a few MiB (above the guard, if any).
    let (u, _, _) = until((4 << 20).min(s.size), 60.0);
    let w1 = write(
        writers(server.addr, &server.demo, &ledger).await?,
        &ledger,
        u,
    )
    .await?;
    let ballast = mnt.dir.join("ballast");
    let free = fs::free_bytes(&mnt.dir)?;
    fill(&ballast, free.saturating_sub(min_free + (4 << 20)))?;
    // Write until refused.
    let u = Until {
        bytes: u64::MAX,
        deadline: Instant::now() + Duration::from_secs(60),
        stop: Arc::default(),
        gone: Arc::default(),
        retry_refused: false,
    };
    let w2 = write(
        writers(server.addr, &server.demo, &ledger).await?,
        &ledger,
        u,
    )
    .await?;
    let refused: u64 = w2.refused.values().sum();
    // Codes a full disk may answer with; anything else is a failure in any phase.
    let odd_codes = |w: &WriteStats| -> Vec<String> {
        w.refused
            .keys()
            .filter(|k| !matches!(k.as_str(), "ResourceExhausted" | "Unavailable"))
            .cloned()
            .collect()
    };
    let odd = odd_codes(&w2);
    notes.push(format!(
        "{label}: full: {} more records acknowledged, then writes refused {:?}",
        w2.acked_this_phase, w2.refused
    ));
    // Reads must keep working for as long as the disk stays full, not just right after the
    // refusal: read again after the server's janitor (which reopens failed tenants every
    // second, and closes idle ones) has had time to act.
    let mut reads = SpotReads::default();
    for pass in 0..READ_PASSES_WHILE_FULL {
        if pass > 0 {
            tokio::time::sleep(Duration::from_millis(1500)).await;
        }
        spot_read(&server, &ledger, s.writers, &mut reads)
            .await
            .with_context(|| {
                format!(
                    "{label}: a read while the disk was full (pass {pass}); the server log ended \
                     with:\n{}",
                    log_tail(&server.log(), 20)
                )
            })?;
    }
    let reopening = match &reads.first_message {
        None => String::new(),
        Some(first) => format!(
            "; {} of them first answered UNAVAILABLE and were served on a retry, after at most \
             {} ms (the first: {first:?})",
            reads.waited,
            reads.longest_wait.as_millis(),
        ),
    };
    notes.push(format!(
        "{label}: while full: {} acknowledged records read back one by one, in \
         {READ_PASSES_WHILE_FULL} passes 1.5 s apart{reopening}",
        reads.good
    ));
    // Then every record, as after the restart: the spot reads see each writer's newest record
    // only, and a restart's replay would fill a gap the full disk left in what is served.
    let while_full = verify(&server, &ledger).await.with_context(|| {
        format!(
            "{label}: reading every record back while the disk was full; the server log ended \
             with:\n{}",
            log_tail(&server.log(), 20)
        )
    })?;
    // Free the space; writers retry refused records until they get through.
    std::fs::remove_file(&ballast)?;
    let before = ledger.total();
    let u = Until {
        bytes: target(&ledger, s).min(ledger.total() * ledger.value_bytes as u64 + (8 << 20)),
        deadline: Instant::now() + Duration::from_secs(60),
        stop: Arc::default(),
        gone: Arc::default(),
        retry_refused: true,
    };
    let resumed_at = Instant::now();
    let w3 = write(
        writers(server.addr, &server.demo, &ledger).await?,
        &ledger,
        u,
    )
    .await?;
    let resumed = ledger.total() - before;
    let after_resuming = verify(&server, &ledger)
        .await
        .with_context(|| format!("{label}: reading every record back after writes resumed"))?;
    notes.push(format!(
        "{label}: space freed: {resumed} records acknowledged in {:.1} s ({} refusals while resuming)",
        resumed_at.elapsed().as_secs_f64(),
        w3.refused.values().sum::<u64>()
    ));
    // The log of this process, before the restart replaces it: shown if the round fails.
    let log_before = server.log();
    let status = tokio::task::block_in_place(|| server.sigterm())?;
    tokio::task::block_in_place(|| server.restart())?;
    let mut verified = verify(&server, &ledger).await?;
    let mut problems = Vec::new();
    if refused == 0 {
        problems.push("the full disk never refused a write".to_string());
    }
    // With the guard, its refusal must be what stopped the writes, not ENOSPC (which refuses
    // with the same codes, as round 2 shows): a guard that never saw the disk low passes the
    // checks above all the same.
    if guard.is_some() && !log_before.contains("data directory nearly full; refusing writes") {
        problems.push(
            "the free-space guard never refused writes (no \"data directory nearly full\" in \
             the server log): the writes ran into ENOSPC instead"
                .into(),
        );
    }
    if !odd.is_empty() {
        problems.push(format!("writes were refused with other codes: {odd:?}"));
    }
    if !w1.refused.is_empty() {
        problems.push(format!(
            "writes were refused before the disk was filled: {:?}",
            w1.refused
        ));
    }
    let odd_resuming = odd_codes(&w3);
    if !odd_resuming.is_empty() {
        problems.push(format!(
            "writes were refused with other codes while resuming: {odd_resuming:?}"
        ));
    }
    if resumed == 0 {
        problems.push("writes did not resume after space was freed".into());
    }
    for (when, v) in [
        ("while the disk was full", &while_full),
        ("after writes resumed, before the restart", &after_resuming),
    ] {
        if !v.ok {
            problems.push(format!(
                "reading every record back {when} ({} of {} acknowledged found whole): {:?}",
                v.found_acked, v.acked, v.problems
            ));
        }
    }
    if !status.success() {
        problems.push(format!("SIGTERM exit status {status}"));
    }
    if !problems.is_empty() {
        notes.push(format!(
            "{label}: the server log ended with:\n{}",
            log_tail(&log_before, 12)
        ));
        verified.ok = false;
        verified.problems.extend(problems);
    }
    drop(server);
    drop(mnt);
    Ok(Round {
        what: format!("{label}: fill, refuse, read, free, resume, SIGTERM, restart"),
        write: WriteStats {
            acked_this_phase: w1.acked_this_phase + w2.acked_this_phase + w3.acked_this_phase,
            refused: w2.refused,
            stopped: w3.stopped,
            in_flight_at_stop: w3.in_flight_at_stop,
            seconds: w1.seconds + w2.seconds + w3.seconds,
        },
        verified,
    })
}

/// The last `n` lines of a server log.
fn log_tail(log: &str, n: usize) -> String {
    let tail: Vec<&str> = log.lines().rev().take(n).collect();
    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
}

/// A file of `bytes` (written, not sparse: tmpfs counts written pages).
fn fill(path: &Path, bytes: u64) -> anyhow::Result<()> {
    use std::io::Write;
    let mut f = std::fs::File::create(path)?;
    let chunk = vec![0xA5u8; 1 << 20];
    let mut left = bytes;
    while left > 0 {
        let n = left.min(chunk.len() as u64) as usize;
        f.write_all(&chunk[..n])?;
        left -= n as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use anyhow::Context;

    use super::refused_as_corrupt_log;

    #[test]
    fn only_a_tenant_refused_for_its_corrupt_log_ends_a_control_round() {
        let corrupt = tonic::Status::data_loss(
            "tenant 'demo' is unavailable: its write-ahead log is corrupt (the server log names \
             the segment and offset); an operator must repair it before it can serve",
        );
        let wrapped: anyhow::Result<()> =
            Err(corrupt.clone()).context("reading writer 3's records back");
        assert!(refused_as_corrupt_log(&wrapped.unwrap_err()));
        assert!(refused_as_corrupt_log(&anyhow::Error::from(
            corrupt.clone()
        )));
        // As an older server answered it.
        let older = tonic::Status::unavailable(corrupt.message());
        assert!(refused_as_corrupt_log(&anyhow::Error::from(older)));
        for other in [
            tonic::Status::unavailable("server shutting down"),
            tonic::Status::internal("its write-ahead log is corrupt"),
            tonic::Status::unauthenticated("unknown key"),
        ] {
            let e: anyhow::Result<()> = Err(other).context("reading the audit trail");
            assert!(!refused_as_corrupt_log(&e.unwrap_err()));
        }
        assert!(!refused_as_corrupt_log(&anyhow::anyhow!(
            "tcp connect error: its write-ahead log is corrupt"
        )));
    }
}
