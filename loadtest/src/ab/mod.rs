//! The auth-model A/B experiment (issue 7): users × duration × op mix × auth model, against an
//! embedded cubed (a fresh one per run) or a running one.
//!
//! - `cube-load run`: one model × one mix; a Markdown table on stdout, JSON on request.
//! - `cube-load ab`: the matrix (3 models × 2 mixes), written to docs/ab-results.md with a chart.
//! - `cube-load stress`: both persistent models at once for a bounded time; fails on any failed
//!   op, any acknowledged write not read back, any run count that differs from the runs
//!   acknowledged (the CI gate).
//!
//! Models: `connection` (one handshake per user connection), `call` (every call signed on a
//! persistent connection), `churn` (a new connection and handshake for every op, the seed's
//! "model A"). Each rpc is one op; a group of the mix (mix.rs) is one or two ops.

pub mod chart;
pub mod conn;
pub mod mix;
pub mod report;
pub mod scrape;
pub mod user;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{Args, ValueEnum};
use cube_auth::Credentials;
use cube_testkit::TestServer;
use serde::Serialize;

use conn::Tls;
use mix::Mix;
use report::{Lat, OpReport, RunReport};
use user::{OpStats, RunCtx, Target, UserResult, Verified, hist};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Model {
    /// Persistent connection, one handshake per connection.
    Connection,
    /// Persistent connection, every call signed.
    Call,
    /// A new connection and a full handshake for every op.
    Churn,
}

impl Model {
    pub fn name(self) -> &'static str {
        match self {
            Model::Connection => "connection",
            Model::Call => "call",
            Model::Churn => "churn",
        }
    }
}

/// Flags shared by `run`, `ab` and `stress`.
#[derive(Debug, Args, Clone)]
pub struct LoadArgs {
    /// Concurrent users, each with its own connection (churn: its own sequence of connections).
    #[arg(long, default_value_t = 8, value_parser = crate::args::at_least_one::<usize>)]
    pub users: usize,
    /// Seconds each run lasts (default: 120 for run/ab as in the seed, 60 for stress).
    #[arg(long, value_parser = crate::args::positive)]
    pub duration: Option<f64>,
    /// Per-op timeout in milliseconds (the seed's socket timeout was 3 s); a timed-out op is a
    /// failure of class `timeout`, never lumped with gRPC errors.
    #[arg(long, default_value_t = 3000, value_parser = crate::args::at_least_one::<u64>)]
    pub timeout_ms: u64,
    /// Open loop: total ops/s over all users, each user pacing its ops evenly and timing each
    /// from when it was due (so queueing is not hidden). Default: closed loop.
    #[arg(long, value_parser = crate::args::positive)]
    pub rate: Option<f64>,
    /// Speak TLS (the embedded server runs with --tls-dev).
    #[arg(long)]
    pub tls: bool,
    /// Value size of Write.
    #[arg(long, default_value_t = 100)]
    pub value_bytes: usize,
    /// Seed of the op sequence.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Skip reading everything back after each run.
    #[arg(long)]
    pub no_verify: bool,
    /// Drive a running server at this address instead of starting one (needs --creds and
    /// --grant-key).
    #[arg(long, requires_all = ["creds", "grant_key"])]
    pub target: Option<String>,
    /// Credentials JSON ({"tenant","key_id","secret"}, e.g. <data-dir>/dev-credentials.json).
    #[arg(long)]
    pub creds: Option<PathBuf>,
    /// A second key of the same tenant that grant/revoke toggle READ on.
    #[arg(long)]
    pub grant_key: Option<String>,
    /// Admin HTTP address of the target, to scrape its histograms.
    #[arg(long)]
    pub admin: Option<SocketAddr>,
    /// The target's process id, to measure its CPU time.
    #[arg(long)]
    pub server_pid: Option<u32>,
    /// CA certificate (PEM) the target's TLS certificate chains to.
    #[arg(long)]
    pub ca: Option<PathBuf>,
    /// Server name for TLS.
    #[arg(long, default_value = "localhost")]
    pub tls_domain: String,
    /// cubed binary of the embedded server (default: the one next to cube-load).
    #[arg(long)]
    pub cubed: Option<PathBuf>,
    /// Extra flag for the embedded server, e.g. `--server-flag=--audit-retention=1000`
    /// (repeatable).
    #[arg(long = "server-flag", allow_hyphen_values = true)]
    pub server_flags: Vec<String>,
}

/// A server to run against and how to reach it; an embedded one is stopped on drop.
struct Server {
    target: Target,
    admin: Option<SocketAddr>,
    pid: Option<u32>,
    _embedded: Option<TestServer>,
}

impl LoadArgs {
    fn duration_or(&self, default: f64) -> Duration {
        Duration::from_secs_f64(self.duration.unwrap_or(default))
    }

    /// The server of one run: the target, or a fresh embedded cubed with a spare key.
    fn server(&self, default_cubed: &std::path::Path) -> anyhow::Result<Server> {
        let connect_timeout = Duration::from_millis(self.timeout_ms);
        if let Some(addr) = &self.target {
            let path = self.creds.as_ref().context("--target needs --creds")?;
            let creds: Credentials = serde_json::from_slice(
                &std::fs::read(path).with_context(|| format!("reading {}", path.display()))?,
            )
            .with_context(|| format!("{} is not a credentials JSON", path.display()))?;
            let tls = match (&self.ca, self.tls) {
                (Some(ca), _) => Some(
                    Tls::new(&std::fs::read(ca)?, &self.tls_domain)
                        .with_context(|| format!("--ca {}", ca.display()))?,
                ),
                (None, true) => bail!("--tls against a --target needs --ca"),
                (None, false) => None,
            };
            let scheme = if tls.is_some() { "https" } else { "http" };
            return Ok(Server {
                target: Target {
                    endpoint: format!("{scheme}://{addr}"),
                    tls,
                    creds,
                    grant_key: self
                        .grant_key
                        .clone()
                        .context("--target needs --grant-key")?,
                    connect_timeout,
                },
                admin: self.admin,
                pid: self.server_pid,
                _embedded: None,
            });
        }
        let cubed = self
            .cubed
            .clone()
            .unwrap_or_else(|| default_cubed.to_path_buf());
        let mut flags: Vec<&str> = self.server_flags.iter().map(String::as_str).collect();
        if self.tls {
            flags.push("--tls-dev");
        }
        let server = tokio::task::block_in_place(|| TestServer::start_with(&cubed, &flags))
            .with_context(|| format!("starting {}", cubed.display()))?;
        let out = server.cli(&["key", "create", &server.demo.tenant])?;
        if !out.status.success() {
            bail!(
                "cubed key create failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let spare: Credentials = serde_json::from_slice(&out.stdout)?;
        let tls = if self.tls {
            let ca = std::fs::read(server.data_dir().join("tls/ca.pem"))?;
            Some(Tls::new(&ca, "localhost")?)
        } else {
            None
        };
        let scheme = if self.tls { "https" } else { "http" };
        Ok(Server {
            target: Target {
                endpoint: format!("{scheme}://{}", server.addr),
                tls,
                creds: server.demo.clone(),
                grant_key: spare.key_id,
                connect_timeout,
            },
            admin: Some(server.admin_addr),
            pid: server.pid(),
            _embedded: Some(server),
        })
    }
}

/// One model × mix against `server`, in a run slot of its own ([`user::claim_slot`]), so
/// neither earlier runs on the same tenant nor concurrent ones touch its users' cells.
async fn run_on(
    server: &Server,
    args: &LoadArgs,
    model: Model,
    mix: &Mix,
    duration: Duration,
) -> anyhow::Result<RunReport> {
    anyhow::ensure!(
        args.users <= user::RUN_STRIDE as usize,
        "--users is at most {} (the x coordinates of one run slot)",
        user::RUN_STRIDE
    );
    let x_base = user::claim_slot(
        &server.target,
        model,
        &format!("cube-load {} {} {}", model.name(), mix, args.users),
    )
    .await?;
    // Persistent connections are opened (and authenticated) before the clock starts.
    let mut conns = Vec::new();
    let mut setup_handshakes = 0u64;
    if model != Model::Churn {
        for _ in 0..args.users {
            let (c, handshaken) = user::persistent(&server.target, model).await?;
            setup_handshakes += u64::from(handshaken);
            conns.push(Some(c));
        }
    } else {
        conns.resize_with(args.users, || None);
    }
    let before = tokio::task::block_in_place(|| scrape::scrape(server.admin));
    let (client_cpu0, server_cpu0) = (scrape::own_cpu_seconds(), scrape::cpu_seconds(server.pid));
    let start = Instant::now();
    let ctx = Arc::new(RunCtx {
        target: server.target.clone(),
        model,
        mix: mix.clone(),
        op_timeout: Duration::from_millis(args.timeout_ms),
        interval: args
            .rate
            .map(|r| Duration::from_secs_f64(args.users as f64 / r.max(1e-3))),
        users: args.users,
        start,
        end: start + duration,
        value_bytes: args.value_bytes,
        mutations: AtomicU64::new(0),
        seed: args.seed,
        x_base,
    });
    let tasks: Vec<_> = conns
        .into_iter()
        .enumerate()
        .map(|(i, c)| tokio::spawn(user::run_user(ctx.clone(), i, c)))
        .collect();
    let mut users: Vec<UserResult> = Vec::new();
    for t in tasks {
        users.push(t.await.context("a user task panicked")?);
    }
    let (client_cpu1, server_cpu1) = (scrape::own_cpu_seconds(), scrape::cpu_seconds(server.pid));
    let after = tokio::task::block_in_place(|| {
        scrape::scrape_settled(server.admin, Duration::from_secs(2))
    });

    let verified = if args.no_verify {
        None
    } else {
        let checks: Vec<_> = users
            .iter_mut()
            .map(|u| {
                user::verify(
                    server.target.clone(),
                    model,
                    std::mem::take(&mut u.ledger),
                    args.value_bytes,
                )
            })
            .collect();
        let mut v = Verified::default();
        for one in futures_join(checks).await {
            v.merge(one);
        }
        Some(v)
    };

    let mut per_op: BTreeMap<&'static str, OpStats> = BTreeMap::new();
    let (mut handshakes, mut handshake_us, mut late, mut unsent) = (setup_handshakes, hist(), 0, 0);
    let mut examples = Vec::new();
    let mut done_per_window = vec![0u64; ctx.windows()];
    for u in &users {
        for (sum, n) in done_per_window.iter_mut().zip(&u.done_per_window) {
            *sum += n;
        }
        for (name, s) in &u.per_op {
            per_op
                .entry(name)
                .or_insert_with(|| OpStats {
                    ok: hist(),
                    failures: BTreeMap::new(),
                })
                .merge(s);
        }
        handshakes += u.handshakes;
        handshake_us.add(&u.handshake_us).expect("same bounds");
        late += u.late_starts;
        unsent += u.unsent;
        examples.extend(u.mismatch_examples.iter().cloned());
    }
    let mut all = hist();
    let mut failures: BTreeMap<String, u64> = BTreeMap::new();
    let mut ops_report = BTreeMap::new();
    for (name, s) in &per_op {
        all.add(&s.ok).expect("same bounds");
        for (k, v) in &s.failures {
            *failures.entry(k.clone()).or_default() += v;
        }
        ops_report.insert(
            name.to_string(),
            OpReport {
                ok: s.ok.len(),
                failures: s.failures.clone(),
                latency: Lat::of(&s.ok),
            },
        );
    }
    let failed: u64 = failures.values().sum();
    let ok = all.len();
    let ops = ok + failed;
    let cpu = |a: Option<f64>, b: Option<f64>| a.zip(b).map(|(a, b)| b - a);
    let (client_cpu, server_cpu) = (cpu(client_cpu0, client_cpu1), cpu(server_cpu0, server_cpu1));
    let per_op_us = |s: Option<f64>| s.map(|s| s * 1e6 / ops.max(1) as f64);
    examples.truncate(10);
    let server_restarted = before
        .as_ref()
        .zip(after.as_ref())
        .is_some_and(|(before, after)| scrape::restarted(&before.buckets, &after.buckets));
    if server_restarted {
        eprintln!(
            "note: the server restarted during the run: its own figures cover only the time since"
        );
    }
    Ok(RunReport {
        model,
        mix: mix.name.clone(),
        tls: server.target.tls.is_some(),
        users: args.users,
        x_base,
        // Rates are over the run's own length, not until its slowest user's last op came back
        // (up to a per-op timeout later): every op counted started within it, and a hung last
        // op made every rate of the run look up to a timeout's worth lower (as the windows,
        // `report::windows`, already leave out).
        seconds: duration.as_secs_f64(),
        rate: args.rate,
        timeout_ms: args.timeout_ms,
        ops,
        ok,
        // Ops an open-loop user never sent (due past their timeout, or left at the run's end)
        // count against it too: they are the ones whose latency went past the timeout.
        ok_pct: 100.0 * ok as f64 / (ops + unsent).max(1) as f64,
        ops_per_sec: ops as f64 / duration.as_secs_f64(),
        windows: report::windows(
            &done_per_window,
            user::WINDOW.as_secs_f64(),
            duration.as_secs_f64(),
        ),
        failures,
        mismatch_examples: examples,
        handshakes,
        handshake: (!handshake_us.is_empty()).then(|| Lat::of(&handshake_us)),
        latency: Lat::of(&all),
        curve: chart::curve_points()
            .into_iter()
            .map(|q| (q, all.value_at_quantile(q) as f64 / 1000.0))
            .chain(std::iter::once((1.0, all.max() as f64 / 1000.0)))
            .collect(),
        per_op: ops_report,
        late_starts: late,
        unsent,
        server: match (&before, &after) {
            (Some(before), Some(after)) => scrape::window(&before.buckets, &after.buckets),
            _ => Vec::new(),
        },
        server_restarted,
        stages: before
            .as_ref()
            .zip(after.as_ref())
            .and_then(|(before, after)| {
                // After a restart, the new process's counts from zero.
                let fresh = scrape::Page::default();
                scrape::stages(if server_restarted { &fresh } else { before }, after)
            }),
        client_cpu_s: client_cpu,
        server_cpu_s: server_cpu,
        client_cpu_us_per_op: per_op_us(client_cpu),
        server_cpu_us_per_op: per_op_us(server_cpu),
        verified,
    })
}

/// Await every future (they run concurrently on the runtime).
async fn futures_join<F>(fs: Vec<F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let handles: Vec<_> = fs.into_iter().map(tokio::spawn).collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.expect("verification task"));
    }
    out
}

#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub load: LoadArgs,
    #[arg(long, value_enum, default_value_t = Model::Connection)]
    pub model: Model,
    /// `audit` (the seed's mix), `legacy` (without audit) or weights like `write-read=3,audit=1`
    /// (groups: prog-run, write-read, grant-revoke, link-walk, seal, stats, audit).
    #[arg(long, default_value = "audit")]
    pub mix: String,
    /// Also write the result as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

pub async fn run(args: RunArgs, default_cubed: PathBuf) -> anyhow::Result<()> {
    let mix = Mix::parse(&args.mix)?;
    let server = args.load.server(&default_cubed)?;
    eprintln!(
        "{} users, model {}, mix {}, {} s{} on {}",
        args.load.users,
        args.model.name(),
        mix,
        args.load.duration_or(120.0).as_secs_f64(),
        args.load
            .rate
            .map(|r| format!(", open loop at {r} ops/s"))
            .unwrap_or_default(),
        server.target.endpoint
    );
    let r = run_on(
        &server,
        &args.load,
        args.model,
        &mix,
        args.load.duration_or(120.0),
    )
    .await?;
    let reports = [r];
    println!("{}", report::summary_table(&reports));
    println!("{}", report::window_table(&reports));
    println!("{}", report::op_tables(&reports));
    println!("{}", report::server_tables(&reports));
    if let Some(line) = report::audit_against_read(&reports) {
        println!("{line}\n");
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&reports[0])?)?;
    }
    // As the stress gate, so that a script can trust the exit status: failed ops, ops that
    // answered wrongly, or acknowledged data not read back fail the run (exit 1).
    let mut bad = report::problems(&reports);
    let r = &reports[0];
    if r.ops == 0 {
        bad.push(format!("{} / {}: no op ran", r.model.name(), r.mix));
    }
    if let Some(v) = r.verified.as_ref().filter(|v| v.problems.is_empty()) {
        eprintln!("verified: {}", v.summary());
    }
    if !bad.is_empty() {
        bail!("the run had problems:\n{}", bad.join("\n"));
    }
    Ok(())
}

#[derive(Debug, Args)]
pub struct AbArgs {
    #[command(flatten)]
    pub load: LoadArgs,
    /// The 1-minute version: 10 s per run instead of 120 s.
    #[arg(long)]
    pub quick: bool,
    /// Markdown report (tables, chart, machine, date, command, verdict).
    #[arg(long, default_value = "docs/ab-results.md")]
    pub out: PathBuf,
    /// The chart; the report links it by file name, so keep it beside the report.
    #[arg(long, default_value = "docs/ab-latency.svg")]
    pub svg: PathBuf,
    /// Every run's full result.
    #[arg(long, default_value = "loadtest/results/ab.json")]
    pub json: PathBuf,
}

pub async fn ab(args: AbArgs, default_cubed: PathBuf) -> anyhow::Result<()> {
    let duration = args.load.duration_or(if args.quick { 10.0 } else { 120.0 });
    let mut reports = Vec::new();
    let mixes = [Mix::audit(), Mix::legacy()];
    let total = mixes.len() * 3;
    for mix in &mixes {
        for model in [Model::Connection, Model::Call, Model::Churn] {
            eprintln!(
                "[{}/{total}] model {}, mix {}, {} users, {:.0} s",
                reports.len() + 1,
                model.name(),
                mix,
                args.load.users,
                duration.as_secs_f64()
            );
            // A fresh server per run, so no run inherits another's data or audit trail.
            let server = args.load.server(&default_cubed)?;
            let r = run_on(&server, &args.load, model, mix, duration).await?;
            eprintln!(
                "    {:.0} ops/s, ok {:.3}%, p99 {:.2} ms, failures {:?}",
                r.ops_per_sec, r.ok_pct, r.latency.p99_ms, r.failures
            );
            reports.push(r);
        }
    }
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    let md = report::ab_markdown(&reports, &command, &args.load, duration, &args.svg);
    let svg = report::ab_chart(&reports);
    for path in [&args.out, &args.svg, &args.json] {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
    }
    std::fs::write(&args.out, md)?;
    std::fs::write(&args.svg, svg)?;
    std::fs::write(&args.json, serde_json::to_vec_pretty(&reports)?)?;
    println!("{}", report::summary_table(&reports));
    eprintln!(
        "wrote {}, {} and {}",
        args.out.display(),
        args.svg.display(),
        args.json.display()
    );
    Ok(())
}

#[derive(Debug, Args)]
pub struct StressArgs {
    #[command(flatten)]
    pub load: LoadArgs,
    /// `audit` (the seed's mix, the default), `legacy` (without audit) or weights like
    /// `write-read=3,audit=1` (groups: prog-run, write-read, grant-revoke, link-walk, seal,
    /// stats, audit).
    #[arg(long, default_value = "audit")]
    pub mix: String,
}

/// The CI gate: `connection` and `call` users at once on one server; any failed op, lost
/// write or wrong run count fails it.
pub async fn stress(args: StressArgs, default_cubed: PathBuf) -> anyhow::Result<()> {
    let mix = Mix::parse(&args.mix)?;
    let duration = args.load.duration_or(60.0);
    let server = args.load.server(&default_cubed)?;
    eprintln!(
        "stress: {} users per model (connection and call at once), mix {}, {:.0} s, on {}",
        args.load.users,
        mix,
        duration.as_secs_f64(),
        server.target.endpoint
    );
    let (a, b) = tokio::join!(
        run_on(&server, &args.load, Model::Connection, &mix, duration),
        run_on(&server, &args.load, Model::Call, &mix, duration),
    );
    let mut reports = [a?, b?];
    // The two runs share both processes at once: each one's CPU per op would charge it the
    // other's work too, so none is reported.
    for r in &mut reports {
        r.client_cpu_us_per_op = None;
        r.server_cpu_us_per_op = None;
    }
    println!("{}", report::summary_table(&reports));
    println!("{}", report::window_table(&reports));
    println!("{}", report::op_tables(&reports));
    let mut bad = report::problems(&reports);
    for r in &reports {
        if r.verified.is_none() {
            bad.push(format!("{}: not verified (--no-verify)", r.model.name()));
        }
        if r.ok == 0 {
            bad.push(format!("{}: no op succeeded", r.model.name()));
        }
    }
    if bad.is_empty() {
        let mut v = Verified::default();
        for r in &reports {
            v.merge(r.verified.clone().unwrap_or_default());
        }
        println!(
            "stress gate passed: {} ops, 0 failed; {}",
            reports.iter().map(|r| r.ops).sum::<u64>(),
            v.summary()
        );
        Ok(())
    } else {
        bail!("stress gate failed:\n{}", bad.join("\n"))
    }
}
