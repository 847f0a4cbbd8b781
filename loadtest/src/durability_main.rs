//! cube-durability: does cubed keep every write it acknowledged? Writers of self-checking
//! records, the server stopped, killed, power-cut or starved of disk, then every acknowledged
//! record read back (see src/durability/ and docs/durability.md, "Verified by").
//!
//!   cube-durability                         scenarios A-E at the CI size
//!   cube-durability --scenarios c --repeat 20 --size 1GiB

// A test harness: a panic is a failed run with a backtrace.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "args.rs"]
#[allow(dead_code)] // cube-load's parsers too; this binary uses some
mod args;
#[path = "durability/mod.rs"]
mod durability;

use std::path::PathBuf;

use anyhow::bail;
use clap::Parser;
use durability::scenarios::{self, ScenarioReport, Settings};

#[derive(Debug, Parser)]
#[command(name = "cube-durability", version)]
struct Cli {
    /// Which scenarios, any of a,b,c,d,e (d and e need root; they are skipped, with the reason,
    /// where they cannot run).
    #[arg(long, default_value = "a,b,c,d,e", value_delimiter = ',', value_parser = parse_scenario)]
    scenarios: Vec<String>,
    /// Concurrent writers, each with its own connection.
    #[arg(long, default_value_t = 16, value_parser = args::at_least_one::<usize>)]
    writers: usize,
    /// Record size in bytes (header, incompressible payload, CRC32C); at least 20.
    #[arg(long, default_value_t = 1024, value_parser = parse_value_bytes)]
    value_bytes: usize,
    /// Bytes acknowledged per writing phase: a number with an optional KiB/MiB/GiB suffix.
    #[arg(long, default_value = "8MiB", value_parser = parse_size)]
    size: u64,
    /// Repetitions of each scenario (C: kills at random moments; D: power cuts).
    #[arg(long, default_value_t = 3, value_parser = args::at_least_one::<usize>)]
    repeat: usize,
    /// The cubed binary (default: next to this one).
    #[arg(long)]
    cubed: Option<PathBuf>,
    /// Write the full report here as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Fail when a scenario was skipped.
    #[arg(long)]
    require_all: bool,
}

/// A scenario's letter, checked before any scenario runs (lower case).
fn parse_scenario(s: &str) -> Result<String, String> {
    let name = s.trim().to_lowercase();
    match name.as_str() {
        "a" | "b" | "c" | "d" | "e" => Ok(name),
        _ => Err(format!("{s:?} is not a scenario (a, b, c, d or e)")),
    }
}

/// A record size that holds a record's header and CRC.
fn parse_value_bytes(s: &str) -> Result<usize, String> {
    let min = durability::record::MIN_LEN;
    match s.trim().parse::<usize>() {
        Ok(n) if n >= min => Ok(n),
        _ => Err(format!(
            "{s:?} is not a record size of at least {min} bytes (its header and CRC)"
        )),
    }
}

fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, mult) = [
        ("GiB", 1u64 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
        ("B", 1),
    ]
    .iter()
    .find_map(|(suf, m)| s.strip_suffix(suf).map(|n| (n, *m)))
    .unwrap_or((s, 1));
    match num
        .trim()
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
    {
        Some(n) if n > 0 => Ok(n),
        _ => Err(format!(
            "{s:?} is not a size above 0 (examples: 8MiB, 1GiB, 4096)"
        )),
    }
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
    // Stopped half-way (Ctrl-C, a timeout's SIGTERM), a run still stops its servers, unmounts
    // its file systems and removes its work directory.
    {
        let _rt = rt.enter();
        cube_testkit::interrupt::clean_up_on_signals()?;
    }
    let result = run(&cli, &rt);
    // A run whose servers a signal's cleanup killed fails: the cleanup ends the process.
    cube_testkit::interrupt::wait_if_stopping();
    result
}

/// The scenarios, then their table.
fn run(cli: &Cli, rt: &tokio::runtime::Runtime) -> anyhow::Result<()> {
    let work = tempfile::Builder::new()
        .prefix("cube-durability-")
        .tempdir()?;
    let _work_registered = cube_testkit::interrupt::dir(work.path());
    let settings = Settings {
        cubed: cli.cubed.clone().unwrap_or_else(durability::cubed_default),
        writers: cli.writers,
        value_bytes: cli.value_bytes,
        size: cli.size,
        repeat: cli.repeat,
        work: work.path().to_path_buf(),
    };
    let mut reports: Vec<ScenarioReport> = Vec::new();
    for name in &cli.scenarios {
        eprintln!("scenario {}", name.to_uppercase());
        let r = rt.block_on(async {
            match name.to_lowercase().as_str() {
                "a" => scenarios::graceful(&settings).await,
                "b" => scenarios::kill_idle(&settings).await,
                "c" => scenarios::kill_writing(&settings).await,
                "d" => scenarios::power_loss(&settings).await,
                "e" => scenarios::disk_full(&settings).await,
                other => bail!("unknown scenario {other:?} (a, b, c, d or e)"),
            }
        })?;
        reports.push(r);
    }
    println!(
        "| scenario | rounds | acknowledged | found whole | missing | corrupt | overwrites lost \
         | holes | result |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---|");
    for r in &reports {
        let last = r.rounds.last().map(|x| &x.verified);
        let sum = |f: fn(&durability::Verification) -> u64| {
            r.rounds.iter().map(|x| f(&x.verified)).sum::<u64>()
        };
        println!(
            "| {} {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.name,
            r.title,
            r.rounds.len(),
            last.map_or(0, |v| v.acked),
            last.map_or(0, |v| v.found_acked),
            sum(|v| v.missing),
            sum(|v| v.corrupt),
            sum(|v| v.stale),
            sum(|v| v.holes),
            match (&r.skipped, r.ok) {
                (Some(why), _) => format!("skipped: {why}"),
                (None, true) => "ok".into(),
                (None, false) => "**FAILED**".into(),
            }
        );
    }
    for r in &reports {
        for n in &r.notes {
            println!("- {}: {n}", r.name);
        }
        for round in r.rounds.iter().filter(|x| !x.verified.ok) {
            for p in &round.verified.problems {
                println!("- {} {}: {p}", r.name, round.what);
            }
        }
    }
    if let Some(path) = &cli.json {
        std::fs::write(path, serde_json::to_vec_pretty(&reports)?)?;
    }
    let failed: Vec<_> = reports
        .iter()
        .filter(|r| r.skipped.is_none() && !r.ok)
        .map(|r| r.name.clone())
        .collect();
    let skipped: Vec<_> = reports
        .iter()
        .filter(|r| r.skipped.is_some())
        .map(|r| r.name.clone())
        .collect();
    if !failed.is_empty() {
        bail!(
            "scenarios {failed:?} failed: lost or corrupted acknowledged data, or a check of the method itself (the report above names it)"
        );
    }
    if cli.require_all && !skipped.is_empty() {
        bail!("scenarios {skipped:?} were skipped and --require-all was given");
    }
    Ok(())
}
