//! Results of A/B runs: the JSON shape, Markdown tables, the chart and the verdict of
//! docs/ab-results.md, which follows from the numbers (nothing in it is typed in by hand).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::Path;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

use super::chart::{self, Panel, Series};
use super::scrape::{ChangeStages, ServerOp};
use super::user::Verified;
use super::{LoadArgs, Model};

/// Latency summary in milliseconds (of successful ops).
#[derive(Debug, Clone, Serialize)]
pub struct Lat {
    pub count: u64,
    pub min_ms: f64,
    pub mean_ms: f64,
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

impl Lat {
    pub fn of(h: &Histogram<u64>) -> Lat {
        let ms = |us: u64| us as f64 / 1000.0;
        Lat {
            count: h.len(),
            min_ms: ms(h.min()),
            mean_ms: h.mean() / 1000.0,
            p50_ms: ms(h.value_at_quantile(0.5)),
            p95_ms: ms(h.value_at_quantile(0.95)),
            p99_ms: ms(h.value_at_quantile(0.99)),
            max_ms: ms(h.max()),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct OpReport {
    pub ok: u64,
    pub failures: BTreeMap<String, u64>,
    pub latency: Lat,
}

/// The ops that ended within one stretch of a run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Window {
    /// Seconds from the run's start to the window's.
    pub from_s: f64,
    pub seconds: f64,
    pub ops: u64,
    pub ops_per_sec: f64,
}

/// Windows of `window_s` seconds from per-window op counts; the last one runs to `run_s`, the
/// run's scheduled length. It also counts the ops still in flight at the end, which started
/// within it; the wait for their answers is not part of its length (one op hanging until its
/// timeout would otherwise stretch the window and show a drop that is not there).
pub fn windows(counts: &[u64], window_s: f64, run_s: f64) -> Vec<Window> {
    let n = counts.len();
    counts
        .iter()
        .enumerate()
        .map(|(i, &ops)| {
            let from_s = i as f64 * window_s;
            let seconds = if i + 1 == n {
                (run_s - from_s).max(1e-3)
            } else {
                window_s
            };
            Window {
                from_s,
                seconds,
                ops,
                ops_per_sec: ops as f64 / seconds,
            }
        })
        .collect()
}

/// A run's windows but a last one shorter than the first (a run whose length is no multiple
/// of the window's): that can be milliseconds long, its rate then set by the answers to the ops
/// in flight at the end. A whole last window stays: it only also holds those few answers.
fn whole_windows(r: &RunReport) -> &[Window] {
    match (r.windows.first(), r.windows.last()) {
        (Some(first), Some(last)) if last.seconds < first.seconds - 1e-6 => {
            &r.windows[..r.windows.len() - 1]
        }
        _ => &r.windows[..],
    }
}

/// The last whole window's rate over the first's, when a run has at least two whole windows.
fn last_over_first(r: &RunReport) -> Option<f64> {
    match whole_windows(r) {
        [first, .., last] if first.ops_per_sec > 0.0 => Some(last.ops_per_sec / first.ops_per_sec),
        _ => None,
    }
}

/// The verdict's line on how the persistent runs' rate moved from their first window to their
/// last, when every one of them has at least two.
fn through_the_runs(persistent: &[&RunReport]) -> Option<String> {
    let ratios: Vec<f64> = persistent
        .iter()
        .map(|r| last_over_first(r))
        .collect::<Option<_>>()?;
    let (lo, hi) = ratios
        .iter()
        .fold((f64::MAX, f64::MIN), |(lo, hi), &x| (lo.min(x), hi.max(x)));
    let first_best = persistent
        .iter()
        .filter_map(|r| r.windows.first())
        .map(|w| w.ops_per_sec)
        .fold(0.0, f64::max);
    if ratios.is_empty() {
        return None;
    }
    // Every run here has two windows or more, so its first is a whole one.
    let width = super::user::WINDOW.as_secs();
    let why = if hi < 1.0 {
        " Each ended slower than it began; what is known of why: docs/benchmarks.md, \"The 120-s decline and the number of runs\" and the section after it."
    } else {
        ""
    };
    // The windows count failed ops too. No window is set against the seed's rate: that is of
    // whole runs, and one fast window beside a target not met reads as one met.
    let against_seed = if persistent.iter().all(|r| r.ok_pct >= 99.9) {
        ""
    } else {
        ", failed ops included"
    };
    Some(format!(
        "- **Through each run.** The persistent runs' last whole {width}-s window did {:.0}–{:.0}% of the rate of their first (the best first window: {first_best:.0} ops/s{against_seed}; \"Throughput through each run\" below).{why}",
        100.0 * lo,
        100.0 * hi,
    ))
}

/// Throughput through each run: ops/s per window, first to last.
pub fn window_table(runs: &[RunReport]) -> String {
    let mut o = String::new();
    let width = runs
        .iter()
        .filter_map(|r| r.windows.first())
        .map(|w| w.seconds)
        .fold(0.0, f64::max);
    let _ = writeln!(
        o,
        "| model | mix | ops/s per {width:.0}-s window, first to last | last ÷ first |"
    );
    let _ = writeln!(o, "|---|---|---|---:|");
    for r in runs {
        let rates: Vec<String> = r
            .windows
            .iter()
            .map(|w| format!("{:.0}", w.ops_per_sec))
            .collect();
        let _ = writeln!(
            o,
            "| {} | {} | {} | {} |",
            r.model.name(),
            r.mix,
            rates.join(" · "),
            last_over_first(r)
                .map(|x| format!("{x:.2}"))
                .unwrap_or_else(|| "–".into())
        );
    }
    o
}

/// One model × mix.
#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    pub model: Model,
    pub mix: String,
    pub tls: bool,
    pub users: usize,
    /// x coordinate of the run's first user: its run slot on the tenant (`user::claim_slot`).
    pub x_base: i32,
    /// The run's length (`--duration`): what its rates are over.
    pub seconds: f64,
    pub rate: Option<f64>,
    pub timeout_ms: u64,
    pub ops: u64,
    pub ok: u64,
    pub ok_pct: f64,
    pub ops_per_sec: f64,
    /// Ops by the window of the run in which they ended ([`super::user::WINDOW`]).
    pub windows: Vec<Window>,
    /// Failed ops by cause: `timeout`, `connect`, `handshake <code>`, `mismatch` (an answer that
    /// contradicts what was acknowledged), or the gRPC code.
    pub failures: BTreeMap<String, u64>,
    pub mismatch_examples: Vec<String>,
    pub handshakes: u64,
    pub handshake: Option<Lat>,
    pub latency: Lat,
    /// (quantile, ms) of all successful ops; the last point is the max.
    pub curve: Vec<(f64, f64)>,
    pub per_op: BTreeMap<String, OpReport>,
    /// Open loop: ops that started more than 1 ms after they were due.
    pub late_starts: u64,
    /// Open loop: ops due before the end that were never sent (the users were behind).
    pub unsent: u64,
    pub server: Vec<ServerOp>,
    /// The server restarted during the run: `server` and `stages` cover only the time since.
    pub server_restarted: bool,
    /// Where the server's durable changes spent their time inside the tenant (window means).
    pub stages: Option<ChangeStages>,
    pub client_cpu_s: Option<f64>,
    pub server_cpu_s: Option<f64>,
    pub client_cpu_us_per_op: Option<f64>,
    pub server_cpu_us_per_op: Option<f64>,
    pub verified: Option<Verified>,
}

impl RunReport {
    /// Successful ops per second (`ops_per_sec` counts failed ones too).
    pub fn ok_per_sec(&self) -> f64 {
        self.ok as f64 / self.seconds.max(f64::MIN_POSITIVE)
    }
}

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map(|v| format!("{v:.digits$}"))
        .unwrap_or_else(|| "–".into())
}

/// `v`, or "–" where it is no number (NaN: a method without a successful call, a stage the
/// window saw nothing of).
fn num(v: f64, digits: usize) -> String {
    opt(Some(v).filter(|v| v.is_finite()), digits)
}

fn failures_cell(f: &BTreeMap<String, u64>) -> String {
    if f.is_empty() {
        return "0".into();
    }
    f.iter()
        .map(|(k, v)| format!("{v} {k}"))
        .collect::<Vec<_>>()
        .join(", ")
}

pub fn summary_table(runs: &[RunReport]) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "| model | mix | ops | ops/s | ok % | failures by cause | handshakes | mean ms | p50 ms | p95 ms | p99 ms | max ms | client CPU µs/op | server CPU µs/op |"
    );
    let _ = writeln!(
        o,
        "|---|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for r in runs {
        let l = &r.latency;
        // No success, no latency (an empty histogram reads as zeros).
        let latency = if r.ok == 0 {
            "– | – | – | – | –".to_string()
        } else {
            format!(
                "{:.3} | {:.3} | {:.3} | {:.3} | {:.1}",
                l.mean_ms, l.p50_ms, l.p95_ms, l.p99_ms, l.max_ms
            )
        };
        let _ = writeln!(
            o,
            "| {} | {} | {} | {:.0} | {:.3} | {} | {} | {latency} | {} | {} |",
            r.model.name(),
            r.mix,
            r.ops,
            r.ops_per_sec,
            r.ok_pct,
            failures_cell(&r.failures),
            r.handshakes,
            opt(r.client_cpu_us_per_op, 1),
            opt(r.server_cpu_us_per_op, 1),
        );
    }
    // Open loop: whether the offered rate was reached, and what was not sent.
    for r in runs {
        if let Some(rate) = r.rate {
            let _ = writeln!(
                o,
                "\nOpen loop, {} / {}: offered {rate:.0} ops/s, did {:.0}; {} ops started more than 1 ms late, {} due before the end were never sent (the users were behind: at the end, or by more than the timeout).",
                r.model.name(),
                r.mix,
                r.ops_per_sec,
                r.late_starts,
                r.unsent,
            );
        }
    }
    o
}

/// Per-op latency, one table per mix: rows are ops, columns p50/p99 per model.
pub fn op_tables(runs: &[RunReport]) -> String {
    let mut o = String::new();
    let mut mixes: Vec<&str> = runs.iter().map(|r| r.mix.as_str()).collect();
    mixes.dedup();
    for mix in mixes {
        let rs: Vec<&RunReport> = runs.iter().filter(|r| r.mix == mix).collect();
        let _ = writeln!(o, "Per op, mix `{mix}` (ok count, p50 / p99 / max ms):\n");
        let mut head = String::from("| op |");
        let mut rule = String::from("|---|");
        for r in &rs {
            let _ = write!(
                head,
                " {} ok | {} p50 / p99 / max ms | {} failed |",
                r.model.name(),
                r.model.name(),
                r.model.name()
            );
            rule.push_str("---:|---:|---:|");
        }
        let _ = writeln!(o, "{head}\n{rule}");
        let mut ops: Vec<&String> = rs.iter().flat_map(|r| r.per_op.keys()).collect();
        ops.sort();
        ops.dedup();
        for op in ops {
            let _ = write!(o, "| {op} |");
            for r in &rs {
                match r.per_op.get(op) {
                    // No success, no latency (an empty histogram reads as zeros).
                    Some(p) if p.ok == 0 => {
                        let _ = write!(o, " 0 | – | {} |", failures_cell(&p.failures));
                    }
                    Some(p) => {
                        let _ = write!(
                            o,
                            " {} | {:.3} / {:.3} / {:.1} | {} |",
                            p.ok,
                            p.latency.p50_ms,
                            p.latency.p99_ms,
                            p.latency.max_ms,
                            failures_cell(&p.failures)
                        );
                    }
                    None => o.push_str(" – | – | – |"),
                }
            }
            o.push('\n');
        }
        o.push('\n');
    }
    o
}

/// The server's own histograms for each run's window.
pub fn server_tables(runs: &[RunReport]) -> String {
    let mut o = String::new();
    for r in runs {
        if r.server.is_empty() {
            continue;
        }
        let _ = writeln!(
            o,
            "Server's view (`grpc_server_handling_seconds`), model {}, mix {} (quantiles interpolated within buckets{}):\n",
            r.model.name(),
            r.mix,
            if r.server_restarted {
                "; the server restarted during the run, so these count only its calls since"
            } else {
                ""
            }
        );
        let _ = writeln!(o, "| method | auth | OK | other codes | p50 ms | p99 ms |");
        let _ = writeln!(o, "|---|---|---:|---|---:|---:|");
        for s in &r.server {
            let _ = writeln!(
                o,
                "| {} | {} | {} | {} | {} | {} |",
                s.method,
                s.auth,
                s.ok,
                failures_cell(&s.failed),
                num(s.p50_ms, 3),
                num(s.p99_ms, 3)
            );
        }
        o.push('\n');
        if let Some(st) = &r.stages {
            let _ = writeln!(
                o,
                "Inside the tenant (`cube_change_stage_seconds`, means over the window, in which {} changes were made durable): \
                 {} µs in the actor's mailbox (every call through the actor), {} µs from a change's WAL append until the actor heard it was fsynced \
                 (a batch's write + fdatasync took {} µs on average, {} records per batch), {} µs applying its group.\n",
                st.changes,
                num(st.mailbox_us, 0),
                num(st.durable_us, 0),
                num(st.fsync_us, 0),
                num(st.records_per_batch, 1),
                num(st.apply_us, 0)
            );
        }
    }
    o
}

/// Everything that should fail a gate: failed ops and verification problems.
pub fn problems(runs: &[RunReport]) -> Vec<String> {
    let mut out = Vec::new();
    for r in runs {
        let who = format!("{} / {}", r.model.name(), r.mix);
        if !r.failures.is_empty() {
            out.push(format!("{who}: failed ops: {}", failures_cell(&r.failures)));
        }
        // Open loop: counted against ok% like failed ops, so they fail a gate as those do.
        if r.unsent > 0 {
            out.push(format!(
                "{who}: {} ops due at the offered rate were never sent (the users were behind)",
                r.unsent
            ));
        }
        for m in &r.mismatch_examples {
            out.push(format!("{who}: {m}"));
        }
        if let Some(v) = &r.verified {
            for p in &v.problems {
                out.push(format!("{who}: verify: {p}"));
            }
        }
    }
    out
}

const COLORS: [(Model, &str); 3] = [
    (Model::Connection, "#1f77b4"),
    (Model::Call, "#d62728"),
    (Model::Churn, "#2ca02c"),
];

pub fn ab_chart(runs: &[RunReport]) -> String {
    let mut mixes: Vec<&str> = runs.iter().map(|r| r.mix.as_str()).collect();
    mixes.dedup();
    let labels: Vec<String> = runs
        .iter()
        // The curves are of successful ops, and so is this rate.
        .map(|r| format!("{} ({:.0} ok ops/s)", r.model.name(), r.ok_per_sec()))
        .collect();
    let panels: Vec<Panel<'_>> = mixes
        .iter()
        .map(|mix| Panel {
            title: format!("mix: {mix}"),
            series: runs
                .iter()
                .zip(&labels)
                .filter(|(r, _)| r.mix == *mix)
                .map(|(r, label)| Series {
                    label,
                    color: COLORS
                        .iter()
                        .find(|(m, _)| *m == r.model)
                        .map(|(_, c)| *c)
                        .unwrap_or("#000"),
                    points: &r.curve,
                })
                .collect(),
        })
        .collect();
    chart::svg(
        "Latency of successful ops by auth model (log scale)",
        &panels,
    )
}

/// Issue 7's "audit p99 well under the per-op timeout", as a line: at most this share of it.
const AUDIT_P99_WELL_UNDER: f64 = 0.1;

/// The seed's reference numbers (seeds/000, section 5): its best mean op time was 29.0 ms for
/// 8 users (~275 ops/s, persistent model, no audit op).
const SEED_OPS_PER_SEC: f64 = 8.0 / 0.029;
/// The seed's persistent model with the audit op: 59.4 ms per op at best (96.53% ok), 8 users.
const SEED_AUDIT_OPS_PER_SEC: f64 = 8.0 / 0.0594;
/// Model A (a connection and a handshake per op) did 29,683 fresh handshakes in 120 s.
const SEED_CHURN_HANDSHAKES_PER_SEC: f64 = 29_683.0 / 120.0;

/// Issue 4's third target, in the experiment's own mix: `Tenant.Audit` (limit 100) p99 at most
/// 3× Read's p99, per persistent run that has both (client-side latencies, the page's answer
/// only, not the driver's check of its chain).
pub fn audit_against_read(runs: &[RunReport]) -> Option<String> {
    // (text, met): a run whose Audit or Read calls failed is not judged on its successes alone,
    // nor passed over when none succeeded.
    let judged: Vec<(String, bool)> = runs
        .iter()
        .filter(|r| r.model != Model::Churn)
        .filter_map(|r| Some((r, r.per_op.get("Audit")?, r.per_op.get("Read")?)))
        .map(|(r, audit, read)| {
            let failed: u64 = audit.failures.values().chain(read.failures.values()).sum();
            if audit.ok == 0 || read.ok == 0 || read.latency.p99_ms <= 0.0 {
                let text = format!(
                    "{} {}: ✗ (no successful Audit or Read to compare; {failed} failed)",
                    r.model.name(),
                    r.mix
                );
                return (text, false);
            }
            let (a, b) = (audit.latency.p99_ms, read.latency.p99_ms);
            let ratio = a / b;
            let mark = match (ratio <= 3.0, failed) {
                (true, 0) => String::new(),
                (_, 0) => " ✗".into(),
                (_, n) => format!(" ✗ ({n} Audit or Read calls failed)"),
            };
            let text = format!(
                "{} {}: {a:.3} / {b:.3} ms = {}×{mark}",
                r.model.name(),
                r.mix,
                at_most(ratio, 2, 3.0)
            );
            (text, mark.is_empty())
        })
        .collect();
    if judged.is_empty() {
        return None;
    }
    let met = judged.iter().all(|(_, met)| *met);
    let texts: Vec<&str> = judged.iter().map(|(t, _)| t.as_str()).collect();
    Some(format!(
        "- **Audit against Read** (issue 4: `Tenant.Audit` limit 100 p99 ≤ 3× Read's p99 in this mix): {}; {}.",
        texts.join("; "),
        if met { "met" } else { "**not met**" }
    ))
}

/// The seed's persistent-model rate for the same op mix, where it measured one.
fn seed_rate_of_mix(mix: &str) -> Option<f64> {
    match mix {
        "legacy" => Some(SEED_OPS_PER_SEC),
        "audit" => Some(SEED_AUDIT_OPS_PER_SEC),
        _ => None,
    }
}

/// Each persistent run (model, mix, ops/s) against the seed's run of the same mix, as one
/// sentence; `None` when no run's mix has a seed counterpart.
fn mix_for_mix(runs: &[(Model, &str, f64)]) -> Option<String> {
    let parts: Vec<String> = runs
        .iter()
        .filter(|(model, _, _)| *model != Model::Churn)
        .filter_map(|&(model, mix, rate)| {
            let seed = seed_rate_of_mix(mix)?;
            Some(format!(
                "{} {mix} {rate:.0} ops/s = {}× the seed's {seed:.0}",
                model.name(),
                at_least(rate / seed, 0, 50.0)
            ))
        })
        .collect();
    (!parts.is_empty()).then(|| {
        format!(
            "Mix for mix (the seed's persistent model did 29.0 ms per op without audit and 59.4 ms at best with it): {}.",
            parts.join("; ")
        )
    })
}

fn machine(h: &crate::machine::Host) -> String {
    format!(
        "{} cores ({}), {:.0} GiB RAM, Linux {}; client and server on the same machine over loopback",
        h.nproc, h.cpu, h.mem_gib, h.kernel
    )
}

fn find<'a>(runs: &'a [RunReport], model: Model, mix: &str) -> Option<&'a RunReport> {
    runs.iter().find(|r| r.model == model && r.mix == mix)
}

/// The rates of a run's whole 10-s windows ([`whole_windows`]) and their lowest and highest;
/// `None` with fewer than two.
fn window_rates(r: &RunReport) -> Option<(Vec<f64>, f64, f64)> {
    let rates: Vec<f64> = whole_windows(r).iter().map(|w| w.ops_per_sec).collect();
    if rates.len() < 2 {
        return None;
    }
    let lo = rates.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = rates.iter().copied().fold(0.0, f64::max);
    Some((rates, lo, hi))
}

/// `x` with `decimals` decimals, or more where fewer would show it at or past `line` when it is
/// not (49.96× printed "50×" beside "not met"): for a target of at least `line`.
fn at_least(x: f64, decimals: usize, line: f64) -> String {
    shown_against(x, decimals, |v| v >= line)
}

/// As [`at_least`], for a target of at most `line` (3.004× printed "3.00×" beside "✗").
fn at_most(x: f64, decimals: usize, line: f64) -> String {
    shown_against(x, decimals, |v| v <= line)
}

fn shown_against(x: f64, decimals: usize, meets: impl Fn(f64) -> bool) -> String {
    let mut d = decimals;
    loop {
        let text = format!("{x:.d$}");
        let shown: f64 = text.parse().unwrap_or(x);
        if d >= 6 || meets(shown) == meets(x) {
            return text;
        }
        d += 1;
    }
}

/// The verdict's sentence on `call` against `connection` in one mix. One run of each is all
/// there is, so the difference is set against the variation within each run (its 10-s
/// windows) before anything is read into it; rates are of successful ops.
fn signing_vs_handshake(call: &RunReport, conn: &RunReport) -> String {
    let ok_rate = |r: &RunReport| r.ok as f64 / r.seconds.max(1e-9);
    let (call_rate, conn_rate) = (ok_rate(call), ok_rate(conn));
    let ratio = call_rate / conn_rate.max(1e-9);
    // A model without a successful op has no latency (its histogram is empty, not 0 ms).
    let p50 = |r: &RunReport| opt((r.ok > 0).then_some(r.latency.p50_ms), 3);
    let mut out = format!(
        "`call` did {call_rate:.0} successful ops/s, {:.1}% of `connection`'s {conn_rate:.0} (p50 {} vs {} ms); server CPU per op {} vs {} µs",
        100.0 * ratio,
        p50(call),
        p50(conn),
        opt(call.server_cpu_us_per_op, 1),
        opt(conn.server_cpu_us_per_op, 1),
    );
    // The windows count failed ops too: with failures they say nothing of the successful rate.
    let clean = call.ok_pct >= 99.9 && conn.ok_pct >= 99.9;
    if !clean {
        out += &format!(
            " (ok {:.3}% and {:.3}%: failed ops are not in these rates)",
            call.ok_pct, conn.ok_pct
        );
    }
    out += ". ";
    if conn_rate == 0.0 || call_rate == 0.0 {
        out += "A model with no successful op cannot be compared.";
        return out;
    }
    let windows = if clean {
        window_rates(call).zip(window_rates(conn))
    } else {
        None
    };
    let auth_cost = "`cube-load auth-cost` (alternating rounds, docs/benchmarks.md) measures what signing costs";
    out += &match windows {
        // Which way, if any, is told by the windows themselves (the whole-run rates also hold
        // the drain): a run is apart from the other when most of its windows lie beyond all of
        // the other's, one way or the other. Ranges that merely touch (one outlier window) do
        // not make two runs alike.
        Some(((cw, clo, chi), (nw, nlo, nhi))) => {
            let most = |n: usize, of: &[f64]| 2 * n > of.len();
            let count = |of: &[f64], beyond: &dyn Fn(f64) -> bool| {
                of.iter().filter(|&&r| beyond(r)).count()
            };
            let (call_below, conn_above) = (count(&cw, &|r| r < nlo), count(&nw, &|r| r > chi));
            let (call_above, conn_below) = (count(&cw, &|r| r > nhi), count(&nw, &|r| r < clo));
            let spread = format!(
                "their 10-s windows ranged over {clo:.0}–{chi:.0} (`call`) and {nlo:.0}–{nhi:.0} ops/s (`connection`)"
            );
            let (n, m) = (cw.len(), nw.len());
            // Apart one way: most of `call`'s windows beyond all of `connection`'s, or most of
            // `connection`'s beyond all of `call`'s the other way; the counts that make it
            // most, each said as what it is.
            let apart = |call_n: usize, call_beyond: &str, conn_n: usize, conn_beyond: &str| {
                let parts: Vec<String> = [
                    most(call_n, &cw).then(|| {
                        format!("{call_n} of `call`'s {n} 10-s windows were {call_beyond}")
                    }),
                    most(conn_n, &nw)
                        .then(|| format!("{conn_n} of `connection`'s {m} were {conn_beyond}")),
                ]
                .into_iter()
                .flatten()
                .collect();
                (!parts.is_empty()).then(|| parts.join(", and "))
            };
            let slower = apart(
                call_below,
                "below `connection`'s slowest",
                conn_above,
                "above `call`'s fastest",
            );
            let faster = apart(
                call_above,
                "above `connection`'s fastest",
                conn_below,
                "below `call`'s slowest",
            );
            if let Some(reason) = slower {
                format!(
                    "`call` was slower beyond the runs' own variation: {reason} ({spread}): verifying a signature on every call cost throughput in this run; {auth_cost}."
                )
            } else if let Some(reason) = faster {
                format!(
                    "`call` was faster beyond the runs' own variation: {reason} ({spread}): signing every call cost nothing this run could measure."
                )
            } else {
                format!(
                    "That is within the runs' own variation: {spread}, and most windows of each lie within the other's, so one run of each cannot tell the models apart here; {auth_cost}."
                )
            }
        }
        _ if ratio > 1.05 => "`call` did more than `connection` (without the runs' own variation to set it against: runs too short, or with failed ops): signing every call cost nothing this run could measure.".to_string(),
        _ if ratio >= 0.95 => "Within 5%, without the runs' own variation to set it against (runs too short, or with failed ops): one run of each cannot tell the models apart.".to_string(),
        _ => "Verifying a signature on every call cost throughput here (without the runs' own variation to set it against: runs too short, or with failed ops).".to_string(),
    };
    out
}

/// The verdict, in words that follow from the numbers.
fn verdict(runs: &[RunReport]) -> String {
    let mut v = String::new();
    let worst = runs.iter().min_by(|a, b| a.ok_pct.total_cmp(&b.ok_pct));
    let all_ok = runs.iter().all(|r| r.ok_pct >= 99.9);
    if let Some(w) = worst {
        let _ = writeln!(
            v,
            "- **Error rate.** {} The lowest ok% was {}% ({} model, {} mix){}{}.",
            if all_ok {
                "Every model reached at least 99.9% ok in both mixes, with and without the audit op."
            } else if runs.iter().any(|r| r.unsent > 0) {
                "Not every run reached 99.9% ok: see the failures by cause, and the open-loop ops never sent under the summary."
            } else {
                "Not every run reached 99.9% ok: see the failures by cause."
            },
            at_least(w.ok_pct, 3, 99.9),
            w.model.name(),
            w.mix,
            if w.failures.is_empty() {
                String::new()
            } else {
                format!("; its failures: {}", failures_cell(&w.failures))
            },
            if w.unsent == 0 {
                String::new()
            } else {
                format!("; {} ops due at its offered rate were never sent", w.unsent)
            }
        );
    }
    let audits: Vec<(&OpReport, u64)> = runs
        .iter()
        .filter_map(|r| r.per_op.get("Audit").map(|a| (a, r.timeout_ms)))
        .collect();
    if let Some(&(_, timeout_ms)) = audits.first() {
        let timeout = timeout_ms as f64;
        let ok: u64 = audits.iter().map(|(a, _)| a.ok).sum();
        let timed_out: u64 = audits
            .iter()
            .map(|(a, _)| a.failures.get("timeout").copied().unwrap_or(0))
            .sum();
        let failed: u64 = audits
            .iter()
            .map(|(a, _)| a.failures.values().sum::<u64>())
            .sum();
        let worst = audits
            .iter()
            .filter(|(a, _)| a.ok > 0)
            .map(|(a, _)| a.latency.p99_ms)
            .fold(0.0, f64::max);
        let _ = if ok == 0 {
            writeln!(
                v,
                "- **The audit op.** No Audit call succeeded ({failed} failed, {timed_out} of them by the {timeout:.0} ms per-op timeout)."
            )
        } else if failed == 0 && worst <= AUDIT_P99_WELL_UNDER * timeout {
            writeln!(
                v,
                "- **The audit op.** Its p99 was at most {worst:.2} ms ({:.2}% of the {timeout:.0} ms per-op timeout) and no Audit call timed out or failed, so audit no longer blurs the comparison as it did in the seed.",
                100.0 * worst / timeout
            )
        } else if failed == 0 {
            writeln!(
                v,
                "- **The audit op.** No Audit call timed out or failed, but its p99 reached {worst:.2} ms, {:.1}% of the {timeout:.0} ms per-op timeout: not well under it (the target; this report's line is {:.0}%).",
                100.0 * worst / timeout,
                100.0 * AUDIT_P99_WELL_UNDER
            )
        } else if timed_out == 0 {
            writeln!(
                v,
                "- **The audit op.** No Audit call timed out (p99 of those that succeeded at most {worst:.2} ms), but {failed} failed otherwise: by cause in the tables below."
            )
        } else {
            writeln!(
                v,
                "- **The audit op.** {timed_out} Audit calls timed out (the {timeout:.0} ms per-op timeout); the p99 of those that succeeded was at most {worst:.2} ms. Timeouts are counted apart from every other failure in the tables."
            )
        };
    }
    if let Some(line) = audit_against_read(runs) {
        let _ = writeln!(v, "{line}");
    }
    for mix in ["audit", "legacy"] {
        let (Some(conn), Some(call)) = (
            find(runs, Model::Connection, mix),
            find(runs, Model::Call, mix),
        ) else {
            continue;
        };
        let _ = writeln!(
            v,
            "- **Per-call signing vs one handshake per connection ({mix} mix).** {}",
            signing_vs_handshake(call, conn)
        );
    }
    if let (Some(churn), Some(conn)) = (
        find(runs, Model::Churn, "legacy").or_else(|| find(runs, Model::Churn, "audit")),
        find(runs, Model::Connection, "legacy").or_else(|| find(runs, Model::Connection, "audit")),
    ) {
        let hs_per_sec = churn.handshakes as f64 / churn.seconds;
        if churn.ok == 0 || conn.ok == 0 {
            let (none, r) = if churn.ok == 0 {
                ("churn", churn)
            } else {
                ("connection", conn)
            };
            let _ = writeln!(
                v,
                "- **A new connection and handshake per op (`churn`, the seed's model A).** No `{none}` op succeeded ({} failed: by cause in the tables below), so the two models' times per op cannot be compared.",
                r.ops - r.ok
            );
        } else {
            let _ = writeln!(
                v,
                "- **A new connection and handshake per op (`churn`, the seed's model A).** {:.0} successful ops/s with {} handshakes in {:.0} s ({:.0}/s, {}× the seed's {:.0}/s), mean op {:.3} ms vs {:.3} ms on a persistent connection: {}",
                churn.ok_per_sec(),
                churn.handshakes,
                churn.seconds,
                hs_per_sec,
                at_least(hs_per_sec / SEED_CHURN_HANDSHAKES_PER_SEC, 1, 2.0),
                SEED_CHURN_HANDSHAKES_PER_SEC,
                churn.latency.mean_ms,
                conn.latency.mean_ms,
                {
                    let slower = churn.latency.mean_ms / conn.latency.mean_ms.max(1e-9);
                    if slower > 1.05 {
                        format!(
                            "{slower:.1}× slower per op. Authenticating once per connection is the cheaper model; authenticating every op is sound but pays a connection and a handshake each time."
                        )
                    } else {
                        format!(
                            "{slower:.2}× the persistent connection's time per op: a connection and a handshake per op cost nothing this run could measure."
                        )
                    }
                }
            );
        }
    }
    let persistent: Vec<&RunReport> = runs.iter().filter(|r| r.model != Model::Churn).collect();
    // Successful ops only: failed ones (a refusal answered in microseconds) must not raise it.
    if let Some(slowest) = persistent
        .iter()
        .min_by(|a, b| a.ok_per_sec().total_cmp(&b.ok_per_sec()))
    {
        let _ = writeln!(
            v,
            "- **Against the seed.** The slowest persistent run did {:.0} successful ops/s with {} users, {}× the seed's best (~{:.0} ops/s: 29 ms per op for 8 users); the target is at least 50×, so it is {}.",
            slowest.ok_per_sec(),
            slowest.users,
            at_least(slowest.ok_per_sec() / SEED_OPS_PER_SEC, 0, 50.0),
            SEED_OPS_PER_SEC,
            if slowest.users != 8 {
                // More users, more ops in flight: the seed's rate is of 8.
                format!(
                    "not comparable: the seed ran 8 users, this run {}",
                    slowest.users
                )
            } else if slowest.ok_per_sec() >= 50.0 * SEED_OPS_PER_SEC {
                "met".to_string()
            } else if slowest.rate.is_some() {
                "**not met** (an open-loop run offers the rate it was given)".to_string()
            } else {
                format!(
                    "**not met** on this machine: with {} users in a closed loop each op waits for the one before it, and most ops here are durable mutations",
                    slowest.users
                )
            }
        );
        let rows: Vec<(Model, &str, f64)> = persistent
            .iter()
            .map(|r| (r.model, r.mix.as_str(), r.ok_per_sec()))
            .collect();
        if let Some(line) = mix_for_mix(&rows) {
            let _ = writeln!(v, "  {line}");
        }
        if let Some(line) = through_the_runs(&persistent) {
            let _ = writeln!(v, "{line}");
        }
    }
    let cpu: Vec<(f64, f64)> = runs
        .iter()
        .filter_map(|r| r.client_cpu_us_per_op.zip(r.server_cpu_us_per_op))
        .collect();
    if !cpu.is_empty() {
        let all_below = cpu.iter().all(|(c, s)| c < s);
        let _ = writeln!(
            v,
            "- **{}**: its CPU per op was {} the server's in {} of {} runs (largest client/server ratio {:.2}).",
            if all_below {
                "The load driver is not the bottleneck"
            } else {
                "The load driver may have been a bottleneck"
            },
            if all_below {
                "below"
            } else {
                "not always below"
            },
            cpu.iter().filter(|(c, s)| c < s).count(),
            cpu.len(),
            cpu.iter().map(|(c, s)| c / s).fold(0.0, f64::max)
        );
    }
    v
}

pub fn ab_markdown(
    runs: &[RunReport],
    command: &str,
    load: &LoadArgs,
    duration: Duration,
    svg: &Path,
) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "# Auth-model A/B results\n");
    let _ = writeln!(
        o,
        "Generated by `cube-load ab` (loadtest/src/ab/); regenerate with the command below. Every number here comes from that run.\n"
    );
    let host = crate::machine::Host::probe();
    let _ = writeln!(o, "- Date: {}", host.date_utc);
    let _ = writeln!(o, "- Machine: {}", machine(&host));
    let _ = writeln!(o, "- Command: `{command}`");
    let _ = writeln!(
        o,
        "- Shape: {} users × {:.0} s per run, {}, per-op timeout {} ms, {} B values, TLS {}, a fresh embedded cubed per run{}",
        load.users,
        duration.as_secs_f64(),
        match load.rate {
            Some(rate) => format!("open loop at {rate} ops/s"),
            None => "closed loop".to_string(),
        },
        load.timeout_ms,
        load.value_bytes,
        // As the runs had it (`--ca` with `--target` turns TLS on without `--tls`).
        if runs.first().map_or(load.tls, |r| r.tls) {
            "on"
        } else {
            "off"
        },
        if load.target.is_some() {
            " (or the given --target)"
        } else {
            ""
        }
    );
    let _ = writeln!(
        o,
        "- Mixes: `audit` = the seed's groups prog+run, write+read, grant+revoke, link+walk, write+seal, stats, audit (limit 100), equal weights; `legacy` = the same without audit. Each rpc is one op.\n"
    );
    let _ = writeln!(o, "## Verdict\n\n{}", verdict(runs));
    let _ = writeln!(o, "## Summary\n\n{}", summary_table(runs));
    let _ = writeln!(
        o,
        "Latency is of successful ops, from when the op started (open loop: from when it was due) to its answer; failed ops are counted by cause instead, a timeout when no answer came within the per-op timeout of the same start. An open-loop run stops at its end: ops due before it that the users, behind, never sent (at the end, or past their timeout before they could start) are counted apart (the line under the summary). Handshakes include the persistent connections' one per user. CPU is user+system time of each process during the run, divided by its ops.\n"
    );
    let name = svg
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    let _ = writeln!(o, "![Latency percentiles by model]({name})\n");
    let _ = writeln!(
        o,
        "## Throughput through each run\n\n{}\nOps (successful or failed) are counted in the window in which they ended; the last window also counts ops answered after the run's end.\n",
        window_table(runs)
    );
    let _ = writeln!(o, "## Per op\n\n{}", op_tables(runs));
    let verified: Vec<String> = runs
        .iter()
        .filter_map(|r| {
            r.verified.as_ref().map(|v| {
                format!(
                    "| {} | {} | {} | {} | {} | {} | {} | {} |",
                    r.model.name(),
                    r.mix,
                    v.writes,
                    v.sealed,
                    v.program_cells,
                    v.runs,
                    v.links,
                    if v.problems.is_empty() {
                        "none".to_string()
                    } else {
                        v.problems.join("; ")
                    }
                )
            })
        })
        .collect();
    if !verified.is_empty() {
        let _ = writeln!(
            o,
            "\n## Read back after each run\n\n| model | mix | writes | sealed cells | programs | runs | links | problems |\n|---|---|---:|---:|---:|---:|---:|---|\n{}\n",
            verified.join("\n")
        );
    }
    let _ = writeln!(
        o,
        "## The server's own histograms\n\n{}",
        server_tables(runs)
    );
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_persistent_run_is_set_against_the_seeds_run_of_its_mix() {
        let line = mix_for_mix(&[
            (Model::Connection, "audit", 10_421.0),
            (Model::Call, "legacy", 11_843.0),
            (Model::Churn, "legacy", 3_553.0),
            (Model::Connection, "write-read=1", 20_000.0),
        ])
        .unwrap();
        // 8 users / 59.4 ms = 134.7 ops/s; 8 users / 29.0 ms = 275.9 ops/s.
        assert!(
            line.contains("connection audit 10421 ops/s = 77× the seed's 135"),
            "{line}"
        );
        assert!(
            line.contains("call legacy 11843 ops/s = 43× the seed's 276"),
            "{line}"
        );
        assert!(
            !line.contains("churn") && !line.contains("write-read"),
            "{line}"
        );
        assert_eq!(mix_for_mix(&[(Model::Call, "custom", 1.0)]), None);
    }

    fn run_with(model: Model, counts: &[u64], elapsed_s: f64) -> RunReport {
        let h = crate::ab::user::hist();
        RunReport {
            model,
            mix: "legacy".into(),
            tls: false,
            users: 8,
            x_base: 0,
            seconds: elapsed_s,
            rate: None,
            timeout_ms: 3000,
            ops: counts.iter().sum(),
            ok: counts.iter().sum(),
            ok_pct: 100.0,
            ops_per_sec: counts.iter().sum::<u64>() as f64 / elapsed_s,
            windows: windows(counts, 10.0, elapsed_s),
            failures: BTreeMap::new(),
            mismatch_examples: Vec::new(),
            handshakes: 8,
            handshake: None,
            latency: Lat::of(&h),
            curve: Vec::new(),
            per_op: BTreeMap::new(),
            late_starts: 0,
            unsent: 0,
            server: Vec::new(),
            server_restarted: false,
            stages: None,
            client_cpu_s: None,
            server_cpu_s: None,
            client_cpu_us_per_op: None,
            server_cpu_us_per_op: None,
            verified: None,
        }
    }

    /// Issue 4's Audit target is judged per persistent run of the mix that has Audit; churn and
    /// runs without Audit say nothing.
    #[test]
    fn audit_against_read_is_judged_per_persistent_run() {
        let op = |p99_us: u64| {
            let mut h = crate::ab::user::hist();
            for _ in 0..100 {
                h.record(p99_us).unwrap();
            }
            OpReport {
                ok: 100,
                failures: BTreeMap::new(),
                latency: Lat::of(&h),
            }
        };
        let with = |model: Model, audit_us: u64, read_us: u64| {
            let mut r = run_with(model, &[1000], 10.0);
            r.mix = "audit".into();
            r.per_op.insert("Audit".into(), op(audit_us));
            r.per_op.insert("Read".into(), op(read_us));
            r
        };
        let line = audit_against_read(&[
            with(Model::Connection, 2000, 800),
            with(Model::Call, 2500, 800),
            with(Model::Churn, 9000, 800),
        ])
        .unwrap();
        assert!(
            line.contains("connection audit: 2.000 / 0.800 ms = 2.50×;"),
            "{line}"
        );
        // (HDR's 3 significant digits: 2,500 µs reads back as 2,501.)
        assert!(
            line.contains("call audit: 2.501 / 0.800 ms = 3.13× ✗"),
            "{line}"
        );
        assert!(
            !line.contains("churn") && line.ends_with("**not met**."),
            "{line}"
        );
        let line = audit_against_read(&[with(Model::Call, 2000, 800)]).unwrap();
        assert!(line.ends_with("; met."), "{line}");
        // Timed-out Audits are not in the successes' p99: such a run is not judged met.
        let mut timed_out = with(Model::Call, 2000, 800);
        timed_out
            .per_op
            .get_mut("Audit")
            .unwrap()
            .failures
            .insert("timeout".into(), 3);
        let line = audit_against_read(&[timed_out]).unwrap();
        assert!(
            line.contains("= 2.50× ✗ (3 Audit or Read calls failed)")
                && line.ends_with("**not met**."),
            "{line}"
        );
        // A run none of whose Audits succeeded is judged, not passed over.
        let mut none_ok = with(Model::Connection, 2000, 800);
        let audit = none_ok.per_op.get_mut("Audit").unwrap();
        audit.ok = 0;
        audit.failures.insert("timeout".into(), 5);
        let line = audit_against_read(&[none_ok, with(Model::Call, 2000, 800)]).unwrap();
        assert!(
            line.contains("connection audit: ✗ (no successful Audit or Read to compare; 5 failed)")
                && line.ends_with("**not met**."),
            "{line}"
        );
        assert_eq!(
            audit_against_read(&[run_with(Model::Call, &[1], 1.0)]),
            None
        );
    }

    /// A run without a success shows no latency (not zeros), and an open-loop run says what it
    /// was offered, what it did and what it did not send.
    #[test]
    fn the_summary_shows_no_latency_without_a_success_and_an_open_loops_shortfall() {
        let mut r = run_with(Model::Call, &[0], 10.0);
        r.ops = 40;
        r.failures = BTreeMap::from([("timeout".to_string(), 40)]);
        r.rate = Some(100.0);
        r.ops_per_sec = 4.0;
        r.late_starts = 39;
        r.unsent = 960;
        let t = summary_table(&[r]);
        assert!(t.contains("| 40 timeout | 8 | – | – | – | – | – |"), "{t}");
        assert!(
            t.contains(
                "Open loop, call / legacy: offered 100 ops/s, did 4; 39 ops started more than \
                 1 ms late, 960 due before the end were never sent"
            ),
            "{t}"
        );
        let t = summary_table(&[run_with(Model::Connection, &[1000], 10.0)]);
        assert!(
            t.contains("| 8 | 0.000 |") && !t.contains("Open loop"),
            "{t}"
        );
    }

    /// The seed's rate is of 8 users: a run of more is not set against it (64 users "met"
    /// the 50× target by concurrency alone).
    #[test]
    fn the_seed_comparison_needs_the_seeds_8_users() {
        let met = run_with(Model::Connection, &[200_000], 10.0);
        let v = verdict(std::slice::from_ref(&met));
        assert!(v.contains("so it is met."), "{v}");
        let mut many = met;
        many.users = 64;
        let v = verdict(&[many]);
        assert!(
            v.contains("so it is not comparable: the seed ran 8 users, this run 64."),
            "{v}"
        );
    }

    /// A model without a successful op has no p50 to print (it said 0.000 ms).
    #[test]
    fn signing_against_the_handshake_prints_no_latency_without_a_success() {
        let mut call = run_with(Model::Call, &[100], 10.0);
        call.ok = 0;
        call.ok_pct = 0.0;
        call.failures = BTreeMap::from([("unauthenticated".to_string(), 100)]);
        let conn = run_with(Model::Connection, &[100], 10.0);
        let s = signing_vs_handshake(&call, &conn);
        assert!(s.contains("(p50 – vs "), "{s}");
        assert!(s.contains("cannot be compared"), "{s}");
    }

    /// A method the server answered only with errors, and a stage the window saw nothing of,
    /// print "–", not "NaN".
    #[test]
    fn the_servers_tables_print_no_nan() {
        let mut r = run_with(Model::Call, &[100], 10.0);
        r.server = vec![crate::ab::scrape::ServerOp {
            method: "Read".into(),
            auth: "call".into(),
            ok: 0,
            failed: BTreeMap::from([("Unauthenticated".to_string(), 5)]),
            p50_ms: f64::NAN,
            p99_ms: f64::NAN,
        }];
        r.stages = Some(crate::ab::scrape::ChangeStages {
            changes: 3,
            mailbox_us: 50.0,
            durable_us: 400.0,
            apply_us: f64::NAN,
            fsync_us: f64::NAN,
            records_per_batch: 2.0,
        });
        let t = server_tables(&[r]);
        assert!(!t.contains("NaN"), "{t}");
        assert!(
            t.contains("| Read | call | 0 | 5 Unauthenticated | – | – |"),
            "{t}"
        );
        assert!(
            t.contains("took – µs on average, 2.0 records per batch), – µs applying"),
            "{t}"
        );
    }

    /// Open-loop ops never sent count against ok%, so they fail a gate and the verdict names
    /// them, as failed ops do (they passed `run --rate` and the stress gate with 0 failures).
    #[test]
    fn ops_never_sent_fail_the_gate_and_are_named_in_the_verdict() {
        let mut r = run_with(Model::Call, &[100], 10.0);
        r.rate = Some(20.0);
        r.unsent = 100;
        r.ok_pct = 50.0;
        let p = problems(std::slice::from_ref(&r));
        assert!(
            p.iter()
                .any(|p| p.contains("100 ops due at the offered rate were never sent")),
            "{p:?}"
        );
        let v = verdict(&[r]);
        assert!(
            v.contains("open-loop ops never sent")
                && v.contains("; 100 ops due at its offered rate were never sent."),
            "{v}"
        );
        assert!(problems(&[run_with(Model::Call, &[100], 10.0)]).is_empty());
    }

    /// The audit sentence follows the Audit op's own failures, not only its successes' p99.
    #[test]
    fn the_verdict_says_when_audit_calls_timed_out_or_none_succeeded() {
        let with_audit_at = |ok: u64, timeouts: u64, us: u64| {
            let mut h = crate::ab::user::hist();
            for _ in 0..ok {
                h.record(us).unwrap();
            }
            let mut r = run_with(Model::Connection, &[100_000, 100_000], 20.0);
            let failures = if timeouts > 0 {
                BTreeMap::from([("timeout".to_string(), timeouts)])
            } else {
                BTreeMap::new()
            };
            r.per_op.insert(
                "Audit".into(),
                OpReport {
                    ok,
                    failures,
                    latency: Lat::of(&h),
                },
            );
            verdict(&[r])
        };
        let with_audit = |ok: u64, timeouts: u64| with_audit_at(ok, timeouts, 2_000);
        let v = with_audit(100, 0);
        assert!(
            v.contains("p99 was at most 2.00 ms") && v.contains("no Audit call timed out"),
            "{v}"
        );
        let v = with_audit(100, 3);
        assert!(v.contains("3 Audit calls timed out"), "{v}");
        // Failures other than timeouts are not waved through either.
        let mut r = run_with(Model::Connection, &[100_000, 100_000], 20.0);
        r.per_op.insert(
            "Audit".into(),
            OpReport {
                ok: 10,
                failures: BTreeMap::from([("Unavailable".to_string(), 50)]),
                latency: Lat::of(&crate::ab::user::hist()),
            },
        );
        let v = verdict(&[r]);
        assert!(
            v.contains("No Audit call timed out") && v.contains("but 50 failed otherwise"),
            "{v}"
        );
        let v = with_audit(0, 5);
        assert!(
            v.contains("No Audit call succeeded (5 failed, 5 of them"),
            "{v}"
        );
        // Close to the timeout is not "well under" it, even with nothing failed.
        let v = with_audit_at(100, 0, 2_900_000);
        assert!(
            v.contains("not well under it") && !v.contains("no longer blurs"),
            "{v}"
        );
    }

    /// The call-against-connection sentence reads nothing into a difference that the runs' own
    /// windows span, compares successful ops only, and says when they differ beyond that.
    #[test]
    fn signing_against_the_handshake_is_read_against_each_runs_own_spread() {
        // 94% of the other, but the windows overlap (14,000-12,000 against 13,000-11,000).
        let conn = run_with(Model::Connection, &[140_000, 120_000, 10_000], 21.0);
        let call = run_with(Model::Call, &[130_000, 110_000, 9_000], 21.0);
        let line = signing_vs_handshake(&call, &conn);
        assert!(line.contains("within the runs' own variation"), "{line}");
        assert!(line.contains("12000–14000 ops/s (`connection`)"), "{line}");
        // Apart: every window of `call` below every window of `connection`.
        let call = run_with(Model::Call, &[100_000, 105_000, 9_000], 21.0);
        let line = signing_vs_handshake(&call, &conn);
        assert!(
            line.contains(
                "`call` was slower beyond the runs' own variation: 2 of `call`'s 2 10-s windows \
                 were below `connection`'s slowest, and 2 of `connection`'s 2 were above"
            ),
            "{line}"
        );
        // Which way is told by the windows themselves, not by the whole run (whose last window
        // and drain they leave out): every window of `call` above every one of `connection`,
        // though a slow last window and a long drain put its whole-run rate below.
        let conn = run_with(Model::Connection, &[140_000; 12], 120.0);
        let mut windows = vec![150_000; 11];
        windows.push(1_000);
        let call = run_with(Model::Call, &windows, 130.0);
        let line = signing_vs_handshake(&call, &conn);
        assert!(
            line.contains("`call` was faster beyond the runs' own variation")
                && !line.contains("slower"),
            "{line}"
        );
        // Ranges that touch through one window are not alike: the report of 2026-12-05 (legacy
        // mix) said "within the runs' own variation" with 10 of `call`'s 12 windows below
        // `connection`'s slowest. Its last window, a whole one, is in the range too (it was
        // left out: "12531–13990").
        let conn = run_with(
            Model::Connection,
            &[
                144_740, 139_470, 144_140, 143_560, 139_410, 137_590, 143_230, 138_020, 140_700,
                137_800, 131_990, 137_370,
            ],
            120.0,
        );
        let call = run_with(
            Model::Call,
            &[
                139_900, 132_600, 129_290, 131_850, 129_060, 125_900, 125_700, 130_320, 125_310,
                129_680, 128_520, 119_140,
            ],
            120.0,
        );
        let line = signing_vs_handshake(&call, &conn);
        assert!(
            line.contains(
                "`call` was slower beyond the runs' own variation: 10 of `call`'s 12 10-s \
                 windows were below `connection`'s slowest (their 10-s windows ranged over \
                 11914–13990 (`call`)"
            ),
            "{line}"
        );
        // Failed ops are not throughput: a `call` run whose ops all failed fast did nothing.
        let mut failing = run_with(Model::Call, &[300_000, 300_000, 30_000], 21.0);
        failing.ok = 0;
        failing.ok_pct = 0.0;
        let line = signing_vs_handshake(&failing, &conn);
        assert!(
            line.starts_with("`call` did 0 successful ops/s, 0.0%"),
            "{line}"
        );
        assert!(line.contains("ok 0.000% and 100.000%"), "{line}");
        assert!(
            line.ends_with("no successful op cannot be compared."),
            "{line}"
        );
        // Some failures: the windows (which count them) are not used.
        failing.ok = 200_000;
        failing.ok_pct = 200_000.0 / 630_000.0 * 100.0;
        let line = signing_vs_handshake(&failing, &conn);
        assert!(
            line.contains("without the runs' own variation") && !line.contains("10-s windows"),
            "{line}"
        );
        // Too short for windows: the 5% band, said to be only that.
        let conn = run_with(Model::Connection, &[100_000], 10.0);
        let call = run_with(Model::Call, &[98_000], 10.0);
        let line = signing_vs_handshake(&call, &conn);
        assert!(
            line.contains("runs too short, or with failed ops"),
            "{line}"
        );
    }

    /// A number printed beside its target is never rounded across it.
    #[test]
    fn numbers_beside_a_target_are_not_rounded_across_it() {
        assert_eq!(at_least(49.83, 0, 50.0), "49.8");
        assert_eq!(at_least(49.996, 0, 50.0), "49.996");
        assert_eq!(at_least(50.4, 0, 50.0), "50");
        assert_eq!(at_least(41.2, 0, 50.0), "41");
        assert_eq!(at_least(99.8996, 3, 99.9), "99.8996");
        assert_eq!(at_least(100.0, 3, 99.9), "100.000");
        assert_eq!(at_most(3.004, 2, 3.0), "3.004");
        assert_eq!(at_most(2.996, 2, 3.0), "3.00");
        assert_eq!(at_most(2.37, 2, 3.0), "2.37");
        // In the verdict: 13,746 ops/s is 49.8× the seed's 275.9, not "50×".
        let near = run_with(Model::Connection, &[137_460], 10.0);
        let v = verdict(&[near]);
        assert!(
            v.contains("49.8× the seed's best") && v.contains("**not met**"),
            "{v}"
        );
    }

    /// A churn run with no successful op is not "no slower" than a persistent one.
    #[test]
    fn a_churn_run_without_a_successful_op_is_said_to_have_none() {
        let conn = run_with(Model::Connection, &[100_000, 100_000], 20.0);
        let mut churn = run_with(Model::Churn, &[40_000, 40_000], 20.0);
        churn.ok = 0;
        churn.ok_pct = 0.0;
        let v = verdict(&[conn, churn]);
        assert!(v.contains("No `churn` op succeeded (80000 failed"), "{v}");
        assert!(!v.contains("cost nothing"), "{v}");
    }

    #[test]
    fn windows_are_rates_and_the_last_runs_to_the_end_of_the_run() {
        // A 25-s run (its last ops were answered after its end, and counted in its last window).
        let w = windows(&[140_000, 120_000, 52_000], 10.0, 25.0);
        assert_eq!(w.len(), 3);
        assert_eq!(
            (w[0].from_s, w[0].seconds, w[0].ops_per_sec),
            (0.0, 10.0, 14_000.0)
        );
        assert_eq!((w[1].from_s, w[1].ops_per_sec), (10.0, 12_000.0));
        assert!((w[2].seconds - 5.0).abs() < 1e-9, "{w:?}");
        assert!((w[2].ops_per_sec - 52_000.0 / 5.0).abs() < 1e-6, "{w:?}");
    }

    #[test]
    fn the_table_and_the_verdict_show_how_each_run_moved() {
        let runs = [
            run_with(Model::Connection, &[140_000, 120_000, 105_000], 30.0),
            run_with(Model::Call, &[130_000, 117_000], 20.0),
            run_with(Model::Churn, &[30_000], 10.0),
        ];
        let table = window_table(&runs);
        assert!(
            table.contains("| connection | legacy | 14000 · 12000 · 10500 | 0.75 |"),
            "{table}"
        );
        assert!(
            table.contains("| call | legacy | 13000 · 11700 | 0.90 |"),
            "{table}"
        );
        // One window: no ratio.
        assert!(table.contains("| churn | legacy | 3000 | – |"), "{table}");
        let persistent: Vec<&RunReport> = runs[..2].iter().collect();
        let line = through_the_runs(&persistent).unwrap();
        assert!(line.contains("did 75–90% of the rate"), "{line}");
        // The best window is not set against the seed's rate (that is of whole runs).
        assert!(
            line.contains("(the best first window: 14000 ops/s;") && !line.contains("×"),
            "{line}"
        );
        assert!(line.contains("ended slower"), "{line}");
        // A run with a single window gives no line at all.
        let short = run_with(Model::Call, &[50_000], 5.0);
        assert_eq!(through_the_runs(&[&runs[0], &short]), None);
        // Runs that sped up are not said to have slowed down.
        let faster = run_with(Model::Call, &[100_000, 110_000], 20.0);
        let line = through_the_runs(&[&faster]).unwrap();
        assert!(
            line.contains("did 110–110%") && !line.contains("slower"),
            "{line}"
        );
        // A last window of 0.1 s (a 20.1-s run), holding the answers to the ops in flight at
        // the end, is not the last whole one: it said 108%.
        let ragged = run_with(Model::Call, &[120_000, 120_000, 1_300], 20.1);
        let line = through_the_runs(&[&ragged]).unwrap();
        assert!(line.contains("did 100–100%"), "{line}");
        // With failed ops, a window's rate is not set against the seed's.
        let mut failing = run_with(Model::Call, &[120_000, 120_000], 20.0);
        failing.ok_pct = 90.0;
        let line = through_the_runs(&[&failing]).unwrap();
        assert!(
            line.contains("failed ops included") && !line.contains("seed's best"),
            "{line}"
        );
    }
}
