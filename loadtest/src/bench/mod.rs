//! `cube-load bench`: Cube side by side with the raw disk, a tonic echo service, SQLite, etcd and
//! Redis, in one run, every system's data in one temporary directory on the same disk (issue 6).
//!
//! This module owns the flags (converted once into [`Settings`]), the order of the parts and the
//! collected [`Results`]; each system has its own file, the load shapes are in `driver`, the
//! Markdown and the target verdicts in `report`. It never hard-codes a result: every ratio in
//! the report is computed from numbers measured in the same run.

mod ceiling;
mod cube;
mod disk;
mod driver;
mod etcd;
mod process;
mod progress;
mod redis;
mod report;
mod sqlite;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Args, ValueEnum};
use serde::Serialize;

pub use driver::{BulkResult, ScanResult, SinglePhase};

/// Concurrent clients of the single-cell phases.
const DEFAULT_CLIENTS: &[usize] = &[1, 16, 64, 256];
const DEFAULT_SECONDS: f64 = 5.0;
const DEFAULT_WARMUP: f64 = 1.0;
const DEFAULT_BULK_BYTES: u64 = 1 << 30;
const DEFAULT_SCAN_CELLS: u64 = 1_000_000;
/// `--quick`: the same parts, small enough to finish in about a minute.
const QUICK_CLIENTS: &[usize] = &[1, 16, 64];
const QUICK_SECONDS: f64 = 1.0;
const QUICK_WARMUP: f64 = 0.5;
const QUICK_BULK_BYTES: u64 = 16 << 20;
const QUICK_SCAN_CELLS: u64 = 20_000;
/// Value size of the bulk loads: 64 KiB, well under cubed's default `--max-value-bytes` (1 MiB)
/// and under etcd's 1.5 MiB request limit even with a few per Txn.
const DEFAULT_BULK_VALUE_BYTES: u64 = 64 << 10;
const DEFAULT_BULK_CLIENTS: usize = 64;

/// The systems the bench can measure, in the order they run by default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Peer {
    /// The raw disk: fdatasync floor and sequential write-and-fsync throughput.
    Disk,
    /// A trivial tonic echo service: the ceiling of any gRPC service on this machine.
    Echo,
    /// Cube (`cubed`, next to this binary unless `--cubed`).
    Cube,
    /// SQLite (compiled in), journal_mode WAL and DELETE, synchronous=FULL.
    Sqlite,
    /// etcd, single node (`apt-get install etcd-server`).
    Etcd,
    /// Redis with appendfsync always (`apt-get install redis-server`).
    Redis,
}

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Where the temporary directory holding every system's data goes (default: the system
    /// temp dir). All systems share it, so they all run on the same disk.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Run even where `--dir` is on a memory file system (tmpfs, ramfs), whose fdatasync makes
    /// nothing durable: every durable rate would be measured without a disk.
    #[arg(long)]
    allow_memory_fs: bool,
    /// Systems to measure, comma-separated (a subset runs without etcd or Redis installed).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "disk,echo,cube,sqlite,etcd,redis"
    )]
    peers: Vec<Peer>,
    /// Concurrent clients of the single-cell phases, each on its own connection (default
    /// 1,16,64,256; --quick 1,16,64).
    #[arg(long, value_delimiter = ',')]
    clients: Option<Vec<usize>>,
    /// Measured seconds per single-cell phase (default 5; --quick 1).
    #[arg(long)]
    seconds: Option<f64>,
    /// Unmeasured warm-up seconds before each single-cell phase (default 1; --quick 0.5).
    #[arg(long)]
    warmup: Option<f64>,
    /// Value size of the single-cell phases and of the scan load.
    #[arg(long, default_value_t = 100)]
    value_bytes: usize,
    /// Bytes of the bulk loads and of the raw sequential write (default 1GiB; --quick 16MiB).
    /// A number with an optional B, KiB, MiB, GiB (or kB, MB, GB) suffix.
    #[arg(long, value_parser = parse_bytes)]
    bulk_bytes: Option<u64>,
    /// Value size of the bulk loads.
    #[arg(long, default_value_t = DEFAULT_BULK_VALUE_BYTES, value_parser = parse_bytes)]
    bulk_value_bytes: u64,
    /// Concurrent writers of the bulk loads (connections for Cube, etcd and Redis; SQLite has
    /// one writer, its fastest).
    #[arg(long, default_value_t = DEFAULT_BULK_CLIENTS)]
    bulk_clients: usize,
    /// Cells loaded before the scans (a cube grid; default 1,000,000; --quick 20,000).
    #[arg(long)]
    scan_cells: Option<u64>,
    /// Full scans and range reads per system (the median is reported).
    #[arg(long, default_value_t = 3)]
    scan_rounds: usize,
    /// Small and short: clients 1,16,64, 1 s windows, 16 MiB bulk, 20,000 scan cells.
    #[arg(long)]
    quick: bool,
    /// Also write every result as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// cubed binary (default: the one next to cube-load).
    #[arg(long)]
    cubed: Option<PathBuf>,
    /// etcd binary (a name is looked up on PATH).
    #[arg(long, default_value = "etcd")]
    etcd_bin: PathBuf,
    /// redis-server binary (a name is looked up on PATH).
    #[arg(long, default_value = "redis-server")]
    redis_bin: PathBuf,
}

/// The validated run: every default resolved, every peer binary found.
#[derive(Debug)]
pub struct Settings {
    pub peers: Vec<Peer>,
    pub clients: Vec<usize>,
    pub window: driver::Window,
    pub value_bytes: usize,
    pub bulk_bytes: u64,
    pub bulk_value_bytes: usize,
    pub bulk_clients: usize,
    pub scan_cells: u64,
    pub scan_rounds: usize,
    pub dir: PathBuf,
    /// `--allow-memory-fs`.
    pub allow_memory_fs: bool,
    pub cubed: PathBuf,
    pub etcd_bin: Option<PathBuf>,
    pub redis_bin: Option<PathBuf>,
    pub json: Option<PathBuf>,
}

impl Settings {
    fn from_args(args: BenchArgs, default_cubed: PathBuf) -> anyhow::Result<Settings> {
        let q = args.quick;
        let mut peers = Vec::new();
        for p in args.peers {
            if !peers.contains(&p) {
                peers.push(p);
            }
        }
        let clients = args
            .clients
            .unwrap_or_else(|| if q { QUICK_CLIENTS } else { DEFAULT_CLIENTS }.to_vec());
        if clients.is_empty() || clients.contains(&0) {
            bail!("--clients needs positive counts, e.g. 1,16,64,256");
        }
        let seconds = args
            .seconds
            .unwrap_or(if q { QUICK_SECONDS } else { DEFAULT_SECONDS });
        let warmup = args
            .warmup
            .unwrap_or(if q { QUICK_WARMUP } else { DEFAULT_WARMUP });
        // At most a day each: `Duration::from_secs_f64` panicked on `inf`.
        if !(seconds > 0.0 && seconds <= 86_400.0 && (0.0..=86_400.0).contains(&warmup)) {
            bail!("--seconds must be > 0 and --warmup >= 0, each at most 86400");
        }
        let bulk_value_bytes = usize::try_from(args.bulk_value_bytes)?;
        if bulk_value_bytes == 0 || args.value_bytes == 0 || args.bulk_clients == 0 {
            bail!("--value-bytes, --bulk-value-bytes and --bulk-clients must be positive");
        }
        let cubed = args.cubed.unwrap_or(default_cubed);
        if peers.contains(&Peer::Cube) && !cubed.is_file() {
            bail!(
                "cubed not found at {} (build it: cargo build --release -p cubed, or pass --cubed)",
                cubed.display()
            );
        }
        // Found up front, so a missing peer fails the run before anything was measured.
        let etcd_bin = if peers.contains(&Peer::Etcd) {
            Some(process::find_binary(&args.etcd_bin, "etcd")?)
        } else {
            None
        };
        let redis_bin = if peers.contains(&Peer::Redis) {
            Some(process::find_binary(&args.redis_bin, "redis-server")?)
        } else {
            None
        };
        Ok(Settings {
            peers,
            clients,
            window: driver::Window {
                warmup: Duration::from_secs_f64(warmup),
                measure: Duration::from_secs_f64(seconds),
            },
            value_bytes: args.value_bytes,
            bulk_bytes: args.bulk_bytes.unwrap_or(if q {
                QUICK_BULK_BYTES
            } else {
                DEFAULT_BULK_BYTES
            }),
            bulk_value_bytes,
            bulk_clients: args.bulk_clients,
            scan_cells: args.scan_cells.unwrap_or(if q {
                QUICK_SCAN_CELLS
            } else {
                DEFAULT_SCAN_CELLS
            }),
            scan_rounds: args.scan_rounds.max(1),
            dir: args.dir.unwrap_or_else(std::env::temp_dir),
            allow_memory_fs: args.allow_memory_fs,
            cubed,
            etcd_bin,
            redis_bin,
            json: args.json,
        })
    }

    /// The scan grid: `side`³ cells (the largest cube within `--scan-cells`).
    pub fn scan_grid(&self) -> ScanGrid {
        ScanGrid::new(self.scan_cells)
    }
}

/// The cells loaded for the scans: a `side`³ grid, cell `i` at (i % side, i / side % side,
/// i / side²) for Cube, row/key `i` for the others. The "1%" read is Cube's box
/// x ∈ [0, side/10), every y, z ∈ [0, side/10), and for the others the key range [0, box_rows)
/// holding the same number of rows (their native form of a range read; a contiguous key range
/// is, if anything, the easier query).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct ScanGrid {
    pub side: u32,
    pub cells: u64,
    /// Cells in the 1% box.
    pub box_rows: u64,
}

impl ScanGrid {
    fn new(cells: u64) -> ScanGrid {
        let mut side = (cells as f64).cbrt().floor() as u64;
        // cbrt of a perfect cube can land just under the integer.
        while (side + 1).pow(3) <= cells {
            side += 1;
        }
        let side = side.clamp(1, i32::MAX as u64);
        let tenth = (side / 10).max(1);
        ScanGrid {
            side: side as u32,
            cells: side.pow(3),
            box_rows: tenth * side * tenth,
        }
    }

    /// Cube's coordinates of cell `i`.
    pub fn coord(&self, i: u64) -> (i32, i32, i32) {
        let s = u64::from(self.side);
        ((i % s) as i32, (i / s % s) as i32, (i / (s * s)) as i32)
    }

    /// The last coordinate on the x and z axes inside the 1% box.
    pub fn box_max_xz(&self) -> i32 {
        (self.side / 10).max(1) as i32 - 1
    }
}

/// The command line, after the `CUBE_*` and `ETCD_*` variables of its environment: the servers
/// it starts inherit them (cubed reads each `CUBE_*` as a flag), so a run's report says which
/// settings other than the defaults it ran with.
fn command_with_env() -> String {
    const HIDDEN: [&str; 4] = ["SECRET", "PASSWORD", "TOKEN", "KEY"];
    let mut parts: Vec<String> = std::env::vars_os()
        .map(|(k, v)| (k.to_string_lossy().into_owned(), v))
        .filter(|(k, _)| k.starts_with("CUBE_") || k.starts_with("ETCD_"))
        // cubec's CUBE_SECRET (cubed reads no such variable), say, is named, not shown.
        .map(|(k, v)| match HIDDEN.iter().any(|h| k.contains(h)) {
            true => format!("{k}=…"),
            false => format!("{k}={}", v.to_string_lossy()),
        })
        .collect();
    parts.sort();
    parts.extend(std::env::args_os().map(|a| a.to_string_lossy().into_owned()));
    parts.join(" ")
}

/// Everything one run measured.
#[derive(Debug, Serialize)]
pub struct Results {
    pub machine: crate::machine::Machine,
    pub command: String,
    pub versions: Vec<(String, String)>,
    pub settings: SettingsSummary,
    pub disk: Option<disk::DiskResult>,
    pub single: Vec<SinglePhase>,
    pub bulk: Vec<BulkResult>,
    pub scans: Vec<ScanResult>,
    /// 1-client reads of Cube and of the echo in alternating rounds (when both peers run): what
    /// the 1-client latency target is judged on.
    pub read_p50_rounds: Vec<P50Round>,
    /// Parts that failed, with their error: reported, never silently dropped.
    pub failures: Vec<(String, String)>,
    pub targets: Vec<report::Target>,
}

/// One round of [`Results::read_p50_rounds`]: a short 1-client read phase of each.
#[derive(Debug, Clone, Serialize)]
pub struct P50Round {
    pub echo_first: bool,
    pub cube: SinglePhase,
    pub echo: SinglePhase,
}

impl P50Round {
    pub fn phases(&self) -> [&SinglePhase; 2] {
        [&self.cube, &self.echo]
    }
}

/// The settings as reported (flags resolved).
#[derive(Debug, Serialize)]
pub struct SettingsSummary {
    pub peers: Vec<Peer>,
    pub clients: Vec<usize>,
    pub seconds: f64,
    pub warmup: f64,
    pub value_bytes: usize,
    pub bulk_bytes: u64,
    pub bulk_value_bytes: usize,
    pub bulk_clients: usize,
    pub scan: ScanGrid,
    pub scan_rounds: usize,
}

/// A size: a number with an optional B, KiB/MiB/GiB (or K/M/G, binary) or kB/MB/GB (decimal)
/// suffix.
fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let mult: u64 = match unit.trim() {
        "" | "B" => 1,
        "K" | "KiB" | "k" => 1 << 10,
        "M" | "MiB" => 1 << 20,
        "G" | "GiB" => 1 << 30,
        "kB" | "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        _ => return Err(format!("{s:?} is not a size (examples: 64MiB, 1GiB, 4096)")),
    };
    let n: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a size (examples: 64MiB, 1GiB, 4096)"))?;
    if !(n.is_finite() && n > 0.0) {
        return Err(format!("{s:?}: the size must be positive"));
    }
    Ok((n * mult as f64).round() as u64)
}

/// Remove a system's data directory once its part is done (the disk is shared and small).
fn remove_data(dir: &Path) {
    if let Err(e) = std::fs::remove_dir_all(dir)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        eprintln!("warning: could not remove {}: {e}", dir.display());
    }
}

/// Whether a file system of type `fstype` lives in memory.
fn is_memory_fs(fstype: &str) -> bool {
    matches!(fstype, "tmpfs" | "ramfs")
}

pub async fn run(args: BenchArgs, default_cubed: PathBuf) -> anyhow::Result<()> {
    let s = Settings::from_args(args, default_cubed)?;
    std::fs::create_dir_all(&s.dir).with_context(|| format!("creating {}", s.dir.display()))?;
    let root = tempfile::Builder::new()
        .prefix("cube-bench-")
        .tempdir_in(&s.dir)
        .with_context(|| format!("creating a temporary directory in {}", s.dir.display()))?;
    let _root_registered = cube_testkit::interrupt::dir(root.path());
    let machine = crate::machine::Machine::probe(root.path());
    if is_memory_fs(&machine.fs.fstype) && !s.allow_memory_fs {
        bail!(
            "{} is on {} ({}), a memory file system: fdatasync makes nothing durable there, so \
             every durable rate would be measured without a disk. Point --dir at the disk to \
             measure (or pass --allow-memory-fs to measure it anyway)",
            s.dir.display(),
            machine.fs.fstype,
            machine.fs.mount_point
        );
    }
    eprintln!(
        "data under {} on {} ({}, mounted at {}); {:.1} GiB free",
        root.path().display(),
        machine.fs.device,
        machine.fs.fstype,
        machine.fs.mount_point,
        machine.fs.free_bytes as f64 / f64::from(1u32 << 30)
    );
    // The biggest single footprint is one system's bulk load (Cube's WAL and state store both
    // hold it until a checkpoint removes the log); each data dir is removed after its part.
    let need = s.bulk_bytes.saturating_mul(3);
    if machine.fs.free_bytes > 0 && machine.fs.free_bytes < need {
        eprintln!(
            "warning: {:.1} GiB free, the bulk loads may need up to {:.1} GiB at a time (lower --bulk-bytes)",
            machine.fs.free_bytes as f64 / f64::from(1u32 << 30),
            need as f64 / f64::from(1u32 << 30)
        );
    }
    let grid = s.scan_grid();
    let mut out = Results {
        machine,
        command: command_with_env(),
        versions: Vec::new(),
        settings: SettingsSummary {
            peers: s.peers.clone(),
            clients: s.clients.clone(),
            seconds: s.window.measure.as_secs_f64(),
            warmup: s.window.warmup.as_secs_f64(),
            value_bytes: s.value_bytes,
            bulk_bytes: s.bulk_bytes,
            bulk_value_bytes: s.bulk_value_bytes,
            bulk_clients: s.bulk_clients,
            scan: grid,
            scan_rounds: s.scan_rounds,
        },
        disk: None,
        single: Vec::new(),
        bulk: Vec::new(),
        scans: Vec::new(),
        read_p50_rounds: Vec::new(),
        failures: Vec::new(),
        targets: Vec::new(),
    };
    out.versions
        .push(("cube-load".into(), env!("CARGO_PKG_VERSION").to_string()));
    for peer in s.peers.clone() {
        let dir = root.path();
        let result = match peer {
            Peer::Disk => {
                tokio::task::block_in_place(|| disk::run(&s, dir)).map(|d| out.disk = Some(d))
            }
            Peer::Echo => ceiling::run(&s, &mut out).await,
            Peer::Cube => cube::run(&s, dir, &mut out).await,
            Peer::Sqlite => tokio::task::block_in_place(|| sqlite::run(&s, dir, &mut out)),
            Peer::Etcd => etcd::run(&s, dir, &mut out).await,
            Peer::Redis => redis::run(&s, dir, &mut out).await,
        };
        if let Err(e) = result {
            eprintln!("{peer:?} failed: {e:#}");
            out.failures.push((format!("{peer:?}"), format!("{e:#}")));
        }
    }
    out.targets = report::targets(&out);
    print!("{}", report::markdown(&out));
    if let Some(path) = &s.json {
        std::fs::write(path, serde_json::to_vec_pretty(&out)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    drop(root);
    // A benchmark whose peer did not run, or whose calls failed, measured something else: say so
    // with the exit status (leave a missing peer out with --peers instead).
    let rounds = out.read_p50_rounds.iter().flat_map(P50Round::phases);
    let failed_calls: u64 = out.single.iter().chain(rounds).map(|p| p.errors).sum();
    if !out.failures.is_empty() || failed_calls > 0 {
        bail!(
            "{} part(s) failed ({}) and {failed_calls} call(s) failed",
            out.failures.len(),
            out.failures
                .iter()
                .map(|(peer, _)| peer.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_and_decimal_suffixes() {
        assert_eq!(parse_bytes("64MiB"), Ok(64 << 20));
        assert_eq!(parse_bytes("1GiB"), Ok(1 << 30));
        assert_eq!(parse_bytes("1G"), Ok(1 << 30));
        assert_eq!(parse_bytes("256 MiB"), Ok(256 << 20));
        assert_eq!(parse_bytes("0.5GiB"), Ok(512 << 20));
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert_eq!(parse_bytes("1MB"), Ok(1_000_000));
        assert!(parse_bytes("lots").is_err());
        assert!(parse_bytes("0").is_err());
        assert!(parse_bytes("5 parsecs").is_err());
    }

    fn settings(argv: &[&str]) -> anyhow::Result<Settings> {
        #[derive(clap::Parser)]
        struct Wrap {
            #[command(flatten)]
            args: BenchArgs,
        }
        let argv = std::iter::once("bench").chain(argv.iter().copied());
        let args = <Wrap as clap::Parser>::try_parse_from(argv)?.args;
        Settings::from_args(args, PathBuf::from("/nonexistent/cubed"))
    }

    /// Phase lengths are finite and at most a day (`inf` panicked in `Duration`).
    #[test]
    fn phase_lengths_are_checked() {
        for bad in [
            &["--seconds", "inf"][..],
            &["--seconds", "1e30"],
            &["--seconds", "0"],
            &["--warmup", "inf"],
            &["--warmup=-1"],
        ] {
            let argv = [&["--peers", "disk"][..], bad].concat();
            let e = settings(&argv).err().map(|e| e.to_string());
            assert!(
                e.as_deref()
                    .is_some_and(|e| e.contains("--seconds must be > 0")),
                "{bad:?}: {e:?}"
            );
        }
        settings(&["--peers", "disk", "--seconds", "86400", "--warmup", "0"]).unwrap();
    }

    #[test]
    fn memory_file_systems_are_told_apart() {
        assert!(is_memory_fs("tmpfs") && is_memory_fs("ramfs"));
        assert!(!is_memory_fs("ext4") && !is_memory_fs("xfs") && !is_memory_fs("overlay"));
    }

    #[test]
    fn scan_grid_is_the_largest_cube_and_its_box_is_about_one_percent() {
        let g = ScanGrid::new(1_000_000);
        assert_eq!((g.side, g.cells, g.box_rows), (100, 1_000_000, 10_000));
        assert_eq!(g.coord(0), (0, 0, 0));
        assert_eq!(g.coord(123_456), (56, 34, 12));
        assert_eq!(g.box_max_xz(), 9);
        let q = ScanGrid::new(20_000);
        assert_eq!((q.side, q.cells), (27, 19_683));
        assert_eq!(q.box_rows, 2 * 27 * 2);
    }
}
