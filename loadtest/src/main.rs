//! cube-load: end-to-end load against a real cubed, beside a trivial tonic echo service measured
//! in the same run (the ceiling for any gRPC service on this machine).
//!
//! `cube-load e2e` starts both servers as child processes on loopback, drives the same shape of
//! load at each (connections × calls in flight, closed loop), and prints a Markdown table with
//! calls/s, latency quantiles and the ratios to echo. `cube-load run | ab | stress` are the
//! auth-model A/B driver (src/ab/); `cube-load bench` measures Cube beside the raw disk, SQLite,
//! etcd and Redis on the same disk (src/bench/).

// A load driver: a panic is a failed run with a backtrace.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod ab;
mod args;
mod auth_cost;
mod bench;
mod datamodel;
mod drive;
mod echo;
mod machine;
mod metrics_cost;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "cube-load", version)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Durable Cells.Write and Cells.Read vs. a trivial echo service, in one run.
    E2e(drive::E2eArgs),
    /// Cost of per-call signing vs the per-connection handshake, and of a handshake vs a Read.
    AuthCost(auth_cost::AuthCostArgs),
    /// Throughput with metrics recorded vs `--no-metrics`, in one run.
    MetricsCost(metrics_cost::MetricsCostArgs),
    /// Region throughput, recovery time with and without a checkpoint, and 10,000 idle tenants.
    Datamodel(datamodel::DataModelArgs),
    /// One auth model × one op mix: users, duration, timeout, closed or open loop. Exits 1 when
    /// an op failed or answered wrongly, or acknowledged data was not read back.
    Run(ab::RunArgs),
    /// The auth-model A/B matrix (3 models × 2 mixes) written to docs/ab-results.md.
    Ab(ab::AbArgs),
    /// CI gate: both persistent models at once; fails on any failed op or lost write.
    Stress(ab::StressArgs),
    /// Cube side by side with the raw disk, SQLite, etcd and Redis, in one run on one disk.
    Bench(bench::BenchArgs),
    /// Serve the echo baseline (used by `e2e` as a child process).
    EchoServer {
        /// Address to serve on (port 0: a free port, printed at start).
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: std::net::SocketAddr,
    },
}

/// The cubed binary next to this one (both built by `cargo build --release`).
fn sibling_cubed() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.join("cubed")))
        .unwrap_or_else(|| PathBuf::from("cubed"))
}

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // Server flags given as CUBE_* variables reach the servers this tool starts.
    cube_testkit::inherit_cube_env();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    if !matches!(cli.command, Cmd::EchoServer { .. }) {
        // Stopped half-way (Ctrl-C, a timeout's SIGTERM), a run still removes the servers it
        // started and their data.
        let _rt = rt.enter();
        cube_testkit::interrupt::clean_up_on_signals()?;
    }
    let result = match cli.command {
        Cmd::E2e(args) => rt.block_on(drive::e2e(args, sibling_cubed())),
        Cmd::AuthCost(args) => rt.block_on(auth_cost::run(args, sibling_cubed())),
        Cmd::MetricsCost(args) => rt.block_on(metrics_cost::run(args, sibling_cubed())),
        Cmd::Datamodel(args) => rt.block_on(datamodel::run(args, sibling_cubed())),
        Cmd::Run(args) => rt.block_on(ab::run(args, sibling_cubed())),
        Cmd::Ab(args) => rt.block_on(ab::ab(args, sibling_cubed())),
        Cmd::Stress(args) => rt.block_on(ab::stress(args, sibling_cubed())),
        Cmd::Bench(args) => rt.block_on(bench::run(args, sibling_cubed())),
        Cmd::EchoServer { listen } => rt.block_on(echo::serve(listen)),
    };
    // A command whose servers a signal's cleanup killed fails: the cleanup ends the process.
    cube_testkit::interrupt::wait_if_stopping();
    result
}
