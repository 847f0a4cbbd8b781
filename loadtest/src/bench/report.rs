//! The report: Markdown tables for stdout (and docs/benchmarks.md), and the target
//! ratios with their verdicts, each computed from this run's numbers only. A target whose
//! inputs were not measured (a peer left out, a client count not run) says so instead.

use std::fmt::Write;

use serde::Serialize;

use super::driver::{Op, SinglePhase};
use super::{Results, ceiling, cube, etcd, redis};

/// The client count the throughput targets are stated at.
const TARGET_CLIENTS: usize = 64;
const SQLITE_WAL: &str = "SQLite WAL";
const SQLITE_DELETE: &str = "SQLite DELETE";
/// Rows of the single-cell tables, in this order.
const SYSTEMS: &[&str] = &[
    ceiling::SYSTEM,
    cube::SYSTEM,
    SQLITE_WAL,
    SQLITE_DELETE,
    etcd::SYSTEM,
    etcd::SYSTEM_SERIALIZABLE,
    redis::SYSTEM,
];

#[derive(Debug, Serialize)]
pub struct Target {
    pub name: String,
    /// The ratio measured (None: an input was not measured).
    pub ratio: Option<f64>,
    /// The same ratio with the echo service in Cube's place: what any gRPC service could reach
    /// on this machine (None where it does not apply).
    pub echo_ratio: Option<f64>,
    /// What the ratio is made of.
    pub detail: String,
    /// None for ratios shown without a target.
    pub met: Option<bool>,
}

fn phase<'a>(
    single: &'a [SinglePhase],
    system: &str,
    op: Op,
    clients: usize,
) -> Option<&'a SinglePhase> {
    single
        .iter()
        .find(|p| p.system == system && p.op == op && p.clients == clients)
}

/// Thousands separated, no decimals.
fn n0(v: f64) -> String {
    if !v.is_finite() {
        return "—".into();
    }
    let s = format!("{:.0}", v.abs());
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    if v < 0.0 { format!("-{out}") } else { out }
}

/// A throughput ratio `a ÷ b` of two single-cell phases at the target client count.
fn ops_ratio(
    r: &[SinglePhase],
    name: &str,
    (sys_a, op_a): (&str, Op),
    (sys_b, op_b): (&str, Op),
    at_least: Option<f64>,
) -> Target {
    let a = phase(r, sys_a, op_a, TARGET_CLIENTS);
    let b = phase(r, sys_b, op_b, TARGET_CLIENTS);
    match (a, b) {
        (Some(a), Some(b)) if a.ops > 0 && b.ops_per_sec > 0.0 => {
            let ratio = a.ops_per_sec / b.ops_per_sec;
            let echo_ratio = (sys_a == cube::SYSTEM && sys_b != ceiling::SYSTEM)
                .then(|| phase(r, ceiling::SYSTEM, op_a, TARGET_CLIENTS))
                .flatten()
                .map(|e| e.ops_per_sec / b.ops_per_sec);
            Target {
                name: name.into(),
                ratio: Some(ratio),
                echo_ratio,
                detail: format!(
                    "{} {} ÷ {} {} ops/s{}",
                    n0(a.ops_per_sec),
                    sys_a,
                    n0(b.ops_per_sec),
                    sys_b,
                    failed_note(&[a, b])
                ),
                met: at_least
                    .filter(|_| failures(&[a, b]) == 0)
                    .map(|t| ratio >= t),
            }
        }
        _ => not_measured(
            name,
            &format!("{sys_a} or {sys_b} at {TARGET_CLIENTS} clients"),
        ),
    }
}

/// Failed calls in `phases`: a rate or latency that leaves them out (a phase's rate counts
/// successful calls only) is not judged against a target.
fn failures(phases: &[&SinglePhase]) -> u64 {
    phases.iter().map(|p| p.errors).sum()
}

/// What a target's detail says of failed calls in `phases` (nothing when none failed).
fn failed_note(phases: &[&SinglePhase]) -> String {
    let failed: Vec<String> = phases
        .iter()
        .filter(|p| p.errors > 0)
        .map(|p| format!("{} failed calls of {}", n0(p.errors as f64), p.system))
        .collect();
    if failed.is_empty() {
        String::new()
    } else {
        format!("; not judged: {}", failed.join(", "))
    }
}

fn not_measured(name: &str, what: &str) -> Target {
    Target {
        name: name.into(),
        ratio: None,
        echo_ratio: None,
        detail: format!("not measured: {what}"),
        met: None,
    }
}

pub fn targets(r: &Results) -> Vec<Target> {
    let mut t = single_targets(&r.single);
    // Judged on the alternating rounds when there are any, not on two phases minutes apart.
    if let Some(alternated) = alternated_p50_target(&r.read_p50_rounds)
        && let Some(slot) = t.iter_mut().find(|t| t.name == P50_TARGET)
    {
        *slot = alternated;
    }
    t.push(bulk_target(r));
    t
}

const P50_TARGET: &str = "Cube Read p50 ≤ 1.2× echo read-shaped p50 (1 client)";

/// The 1-client latency target from alternating rounds (`cube::alternate_with_echo`): the
/// median of the rounds' p50 ratios; `None` without rounds.
fn alternated_p50_target(rounds: &[super::P50Round]) -> Option<Target> {
    if rounds.is_empty() {
        return None;
    }
    let phases: Vec<&SinglePhase> = rounds.iter().flat_map(super::P50Round::phases).collect();
    let ratios: Vec<f64> = rounds
        .iter()
        .filter(|r| r.cube.p50_us > 0 && r.echo.p50_us > 0)
        .map(|r| r.cube.p50_us as f64 / r.echo.p50_us as f64)
        .collect();
    let p50s = |side: fn(&super::P50Round) -> &SinglePhase| {
        crate::drive::median(rounds.iter().map(|r| side(r).p50_us as f64).collect())
    };
    if ratios.len() < rounds.len() {
        return Some(not_measured(
            P50_TARGET,
            "a p50 of Cube or the echo in some alternating round (no call succeeded)",
        ));
    }
    let lo = ratios.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = ratios.iter().copied().fold(0.0, f64::max);
    let ratio = crate::drive::median(ratios);
    Some(Target {
        name: P50_TARGET.into(),
        ratio: Some(ratio),
        echo_ratio: None,
        detail: format!(
            "median of {} alternating rounds of 1-client reads, {lo:.2}–{hi:.2}× per round; \
             median p50s {:.0} µs ÷ {:.0} µs{}",
            rounds.len(),
            p50s(|r| &r.cube),
            p50s(|r| &r.echo),
            failed_note(&phases)
        ),
        met: (failures(&phases) == 0).then_some(ratio <= 1.2),
    })
}

/// The targets on single-cell phases.
fn single_targets(r: &[SinglePhase]) -> Vec<Target> {
    let w = Op::Write;
    let rd = Op::Read;
    let cube = cube::SYSTEM;
    let mut t = vec![
        ops_ratio(
            r,
            "Cube writes ≥ 3× SQLite WAL (64 clients)",
            (cube, w),
            (SQLITE_WAL, w),
            Some(3.0),
        ),
        ops_ratio(
            r,
            "Cube writes ≥ 10× SQLite DELETE (64 clients)",
            (cube, w),
            (SQLITE_DELETE, w),
            Some(10.0),
        ),
        ops_ratio(
            r,
            "Cube writes ≥ 2× etcd Put (64 clients)",
            (cube, w),
            (etcd::SYSTEM, w),
            Some(2.0),
        ),
        ops_ratio(
            r,
            "Cube writes ≥ 0.5× Redis SET (64 clients)",
            (cube, w),
            (redis::SYSTEM, w),
            Some(0.5),
        ),
        ops_ratio(
            r,
            "Cube writes ÷ echo write-shaped (64 clients)",
            (cube, w),
            (ceiling::SYSTEM, w),
            None,
        ),
        ops_ratio(
            r,
            "Cube reads ≥ 5× etcd Range (64 clients)",
            (cube, rd),
            (etcd::SYSTEM, rd),
            Some(5.0),
        ),
        ops_ratio(
            r,
            "Cube reads ÷ etcd serializable Range (64 clients; the same guarantee on one node)",
            (cube, rd),
            (etcd::SYSTEM_SERIALIZABLE, rd),
            None,
        ),
        ops_ratio(
            r,
            "Cube reads ÷ echo read-shaped (64 clients)",
            (cube, rd),
            (ceiling::SYSTEM, rd),
            None,
        ),
    ];
    let name = P50_TARGET;
    t.push(
        match (phase(r, cube, rd, 1), phase(r, ceiling::SYSTEM, rd, 1)) {
            // A recorded latency is at least 1 µs, so a p50 of 0 is an empty histogram (no call
            // succeeded), which would otherwise pass.
            (Some(c), Some(e)) if c.p50_us > 0 && e.p50_us > 0 => {
                let ratio = c.p50_us as f64 / e.p50_us as f64;
                Target {
                    name: name.into(),
                    ratio: Some(ratio),
                    echo_ratio: None,
                    detail: format!("{} µs ÷ {} µs{}", c.p50_us, e.p50_us, failed_note(&[c, e])),
                    met: (failures(&[c, e]) == 0).then_some(ratio <= 1.2),
                }
            }
            _ => not_measured(name, "Cube or echo at 1 client"),
        },
    );
    t
}

fn bulk_target(r: &Results) -> Target {
    let cube = cube::SYSTEM;
    let name = "Cube bulk load ≥ 60% of the disk's sequential write-and-fsync";
    let bulk = r.bulk.iter().find(|b| b.system == cube);
    match (bulk, &r.disk) {
        (Some(b), Some(d)) if d.seq_mib_per_sec > 0.0 => {
            let ratio = b.mib_per_sec / d.seq_mib_per_sec;
            let echo = r.bulk.iter().find(|b| b.system == ceiling::SYSTEM);
            Target {
                name: name.into(),
                ratio: Some(ratio),
                echo_ratio: echo.map(|e| e.mib_per_sec / d.seq_mib_per_sec),
                // The reference is the faster pass, as the seed measured its disk (a sequential
                // write, then fsync); the 4-MiB pass syncs as often as 64 clients × 64 KiB can.
                detail: match d.seq_by_sync.first() {
                    Some((every, per_4)) if *per_4 < d.seq_mib_per_sec => format!(
                        "{:.1} ÷ {:.1} MiB/s; ÷ the fdatasync-per-{} MiB pass: {:.2}×",
                        b.mib_per_sec,
                        d.seq_mib_per_sec,
                        every >> 20,
                        b.mib_per_sec / per_4
                    ),
                    _ => format!("{:.1} ÷ {:.1} MiB/s", b.mib_per_sec, d.seq_mib_per_sec),
                },
                met: Some(ratio >= 0.6),
            }
        }
        _ => not_measured(name, "Cube bulk or the disk"),
    }
}

/// Three decimals below 10, so a ratio just past its bound does not print as the bound.
fn ratio(v: Option<f64>) -> String {
    match v {
        Some(v) if v < 10.0 => format!("{v:.3}×"),
        Some(v) => format!("{v:.1}×"),
        None => "—".into(),
    }
}

fn verdict(t: &Target) -> &'static str {
    match t.met {
        Some(true) => "✓",
        Some(false) => "✗",
        None => "—",
    }
}

fn label(system: &str, op: Op) -> String {
    match (system, op) {
        (s, Op::Write) if s == ceiling::SYSTEM => "echo (write-shaped)".into(),
        (s, Op::Read) if s == ceiling::SYSTEM => "echo (read-shaped)".into(),
        (s, Op::Write) if s == etcd::SYSTEM => "etcd Put".into(),
        (s, Op::Read) if s == etcd::SYSTEM => "etcd Range (linearizable)".into(),
        (s, Op::Read) if s == etcd::SYSTEM_SERIALIZABLE => "etcd Range (serializable)".into(),
        (s, Op::Write) if s == redis::SYSTEM => "Redis SET".into(),
        (s, Op::Read) if s == redis::SYSTEM => "Redis GET".into(),
        (s, Op::Write) if s == cube::SYSTEM => "Cube Cells.Write".into(),
        (s, Op::Read) if s == cube::SYSTEM => "Cube Cells.Read".into(),
        (s, Op::Write) => format!("{s} INSERT OR REPLACE"),
        (s, Op::Read) => format!("{s} SELECT"),
    }
}

fn single_table(out: &mut String, r: &Results, op: Op) {
    let clients = &r.settings.clients;
    let _ = write!(
        out,
        "| {} |",
        if op == Op::Write {
            "durable write"
        } else {
            "read"
        }
    );
    for c in clients {
        let _ = write!(out, " {c} client{} |", if *c == 1 { "" } else { "s" });
    }
    out.push('\n');
    out.push_str("|---|");
    out.push_str(&"---:|".repeat(clients.len()));
    out.push('\n');
    for system in SYSTEMS {
        if !r.single.iter().any(|p| p.system == *system && p.op == op) {
            continue;
        }
        let _ = write!(out, "| {} |", label(system, op));
        for &c in clients {
            match phase(&r.single, system, op, c) {
                Some(p) => {
                    let _ = write!(
                        out,
                        " {} · {} / {}",
                        n0(p.ops_per_sec),
                        n0(p.p50_us as f64),
                        n0(p.p99_us as f64)
                    );
                    if p.errors > 0 {
                        let _ = write!(out, " · **{} errors**", p.errors);
                    }
                    out.push_str(" |");
                }
                None => out.push_str(" — |"),
            }
        }
        out.push('\n');
    }
}

pub fn markdown(r: &Results) -> String {
    let mut o = String::new();
    let m = &r.machine;
    let st = &r.settings;
    let _ = writeln!(
        o,
        "Machine: {} × {}, {:.0} GiB, Linux {}; data on {} ({}, mounted at {}). Date: {}.\n",
        m.host.nproc,
        m.host.cpu,
        m.host.mem_gib,
        m.host.kernel,
        m.fs.device,
        m.fs.fstype,
        m.fs.mount_point,
        m.host.date_utc
    );
    let _ = writeln!(o, "Command: `{}`\n", r.command);
    let versions: Vec<_> = r
        .versions
        .iter()
        .map(|(k, v)| format!("{k}: {v}"))
        .collect();
    let _ = writeln!(o, "Versions: {}.\n", versions.join("; "));
    let _ = writeln!(
        o,
        "Single-cell phases: {} B values, {} s measured after {} s of warm-up, each client on its own connection (closed loop). Bulk: {} MiB in {} KiB values. Scans: {} cells ({}³ grid) of {} B, median of {} rounds.\n",
        st.value_bytes,
        st.seconds,
        st.warmup,
        st.bulk_bytes >> 20,
        st.bulk_value_bytes >> 10,
        n0(st.scan.cells as f64),
        st.scan.side,
        st.value_bytes,
        st.scan_rounds
    );

    if let Some(d) = &r.disk {
        o.push_str("| the disk | result |\n|---|---:|\n");
        let _ = writeln!(
            o,
            "| 4 KiB pwrite + fdatasync, one after another (pre-written file) | {} /s · p50 {} µs · p99 {} µs |",
            n0(d.fsyncs_per_sec),
            d.fsync_p50_us,
            d.fsync_p99_us
        );
        for (every, mib_per_sec) in &d.seq_by_sync {
            let _ = writeln!(
                o,
                "| sequential write, fdatasync after every {} MiB ({} MiB, new file) | {:.1} MiB/s |",
                every >> 20,
                d.seq_bytes >> 20,
                mib_per_sec
            );
        }
        let _ = writeln!(
            o,
            "| the reference for bulk loads: the faster of those | {:.1} MiB/s |\n",
            d.seq_mib_per_sec
        );
    }

    if !r.single.is_empty() {
        o.push_str("Cells: ops/s · p50 / p99 µs.\n\n");
        single_table(&mut o, r, Op::Write);
        o.push('\n');
        single_table(&mut o, r, Op::Read);
        o.push('\n');
    }

    if !r.bulk.is_empty() {
        let raw = r.disk.as_ref().map(|d| d.seq_mib_per_sec);
        o.push_str(
            "| bulk load | how | seconds | MiB/s | ÷ disk sequential |\n|---|---|---:|---:|---:|\n",
        );
        if let Some(raw) = raw {
            let _ = writeln!(
                o,
                "| the disk (the faster of its sequential passes) | — | — | {raw:.1} | 100% |"
            );
        }
        for b in &r.bulk {
            let ratio = raw.map_or("—".into(), |raw| {
                format!("{:.0}%", 100.0 * b.mib_per_sec / raw)
            });
            let _ = writeln!(
                o,
                "| {} | {} | {:.2} | {:.1} | {} |",
                b.system, b.method, b.seconds, b.mib_per_sec, ratio
            );
        }
        o.push('\n');
    }

    if !r.scans.is_empty() {
        o.push_str("| scan | load s | full scan rows/s | range rows | range rows/s | how |\n|---|---:|---:|---:|---:|---|\n");
        for s in &r.scans {
            let _ = writeln!(
                o,
                "| {} | {:.1} | {} | {} | {} | {} |",
                s.system,
                s.load_seconds,
                n0(s.full_rows_per_sec),
                n0(s.range_rows as f64),
                n0(s.range_rows_per_sec),
                s.method
            );
        }
        o.push('\n');
    }

    o.push_str(
        "| target | measured | | echo in Cube's place (the gRPC ceiling) |\n|---|---:|:-:|---:|\n",
    );
    for t in &r.targets {
        let _ = writeln!(
            o,
            "| {} | {} ({}) | {} | {} |",
            t.name,
            ratio(t.ratio),
            t.detail,
            verdict(t),
            ratio(t.echo_ratio)
        );
    }
    if !r.failures.is_empty() {
        o.push_str("\nFailed parts:\n\n");
        for (what, e) in &r.failures {
            let _ = writeln!(o, "- {what}: {}", e.lines().next().unwrap_or(""));
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    fn phase_of(
        system: &str,
        op: Op,
        clients: usize,
        ops: u64,
        errors: u64,
        p50_us: u64,
    ) -> SinglePhase {
        SinglePhase {
            system: system.into(),
            op,
            clients,
            ops,
            seconds: 1.0,
            ops_per_sec: ops as f64,
            p50_us,
            p99_us: p50_us,
            max_us: p50_us,
            errors,
            first_error: None,
        }
    }

    fn target<'a>(t: &'a [Target], prefix: &str) -> &'a Target {
        t.iter().find(|t| t.name.starts_with(prefix)).unwrap()
    }

    #[test]
    fn a_phase_with_failed_calls_is_not_judged() {
        let r = vec![
            phase_of(cube::SYSTEM, Op::Write, TARGET_CLIENTS, 30_000, 0, 0),
            phase_of(redis::SYSTEM, Op::Write, TARGET_CLIENTS, 40_000, 0, 0),
            phase_of(etcd::SYSTEM, Op::Write, TARGET_CLIENTS, 5_000, 7, 0),
            // Every Cube read at 1 client failed: its p50 would read 0.
            phase_of(cube::SYSTEM, Op::Read, 1, 0, 3, 0),
            phase_of(ceiling::SYSTEM, Op::Read, 1, 9_000, 0, 100),
        ];
        let t = single_targets(&r);
        assert_eq!(target(&t, "Cube writes ≥ 0.5× Redis").met, Some(true));
        let etcd = target(&t, "Cube writes ≥ 2× etcd");
        assert_eq!(etcd.met, None, "{}", etcd.detail);
        assert!(
            etcd.detail.contains("not judged: 7 failed calls of etcd"),
            "{}",
            etcd.detail
        );
        let p50 = target(&t, "Cube Read p50");
        assert_eq!(p50.met, None, "{}", p50.detail);
        assert!(p50.ratio.is_none(), "{}", p50.detail);
    }

    /// With alternating rounds the 1-client target is their median ratio, not the two long
    /// phases'; a round with failed calls leaves it unjudged.
    #[test]
    fn the_one_client_target_is_judged_on_the_alternating_rounds() {
        let round = |cube_p50: u64, echo_p50: u64| crate::bench::P50Round {
            echo_first: true,
            cube: phase_of(cube::SYSTEM, Op::Read, 1, 5_000, 0, cube_p50),
            echo: phase_of(ceiling::SYSTEM, Op::Read, 1, 6_000, 0, echo_p50),
        };
        let long = vec![
            phase_of(cube::SYSTEM, Op::Read, 1, 5_000, 0, 300),
            phase_of(ceiling::SYSTEM, Op::Read, 1, 6_000, 0, 150),
        ];
        // The long phases alone: 2.00×, not met.
        let t = single_targets(&long);
        assert_eq!(target(&t, "Cube Read p50").met, Some(false));
        // Rounds of 1.10×, 1.15×, 1.50×: median 1.15×, met.
        let rounds = vec![round(220, 200), round(230, 200), round(300, 200)];
        let alt = alternated_p50_target(&rounds).unwrap();
        assert_eq!(alt.met, Some(true), "{}", alt.detail);
        assert!((alt.ratio.unwrap() - 1.15).abs() < 1e-9, "{:?}", alt.ratio);
        assert!(
            alt.detail.contains("median of 3 alternating rounds")
                && alt.detail.contains("1.10–1.50×"),
            "{}",
            alt.detail
        );
        let mut failing = rounds.clone();
        failing[1].cube.errors = 2;
        assert_eq!(alternated_p50_target(&failing).unwrap().met, None);
        assert!(alternated_p50_target(&[]).is_none());
    }

    #[test]
    fn numbers_get_thousands_separators() {
        assert_eq!(n0(0.0), "0");
        assert_eq!(n0(999.4), "999");
        assert_eq!(n0(1234.0), "1,234");
        assert_eq!(n0(1_234_567.0), "1,234,567");
        assert_eq!(n0(f64::NAN), "—");
    }
}
