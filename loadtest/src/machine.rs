//! What a run was measured on: CPUs, kernel, memory, and the file system and device holding
//! its data directory (from /proc; nothing here changes the machine). Used by the reports of
//! `cube-load ab` and `cube-load bench`.

use std::path::Path;
use std::process::Command;

use serde::Serialize;

/// The computer: CPUs, memory, kernel, and when it was asked.
#[derive(Debug, Serialize)]
pub struct Host {
    pub nproc: usize,
    pub cpu: String,
    pub kernel: String,
    pub mem_gib: f64,
    pub date_utc: String,
}

/// The computer and the file system a run keeps its data on.
#[derive(Debug, Serialize)]
pub struct Machine {
    #[serde(flatten)]
    pub host: Host,
    pub fs: FileSystem,
}

#[derive(Debug, Serialize)]
pub struct FileSystem {
    pub dir: String,
    pub mount_point: String,
    pub fstype: String,
    pub device: String,
    pub free_bytes: u64,
}

impl Host {
    pub fn probe() -> Host {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let mem_kib: f64 = meminfo
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0.0);
        Host {
            nproc: std::thread::available_parallelism().map_or(1, usize::from),
            cpu: cpuinfo
                .lines()
                .find_map(|l| l.strip_prefix("model name"))
                .and_then(|l| l.split_once(':'))
                .map_or_else(|| "?".into(), |(_, v)| v.trim().to_string()),
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .map_or_else(|_| "?".into(), |s| s.trim().to_string()),
            mem_gib: mem_kib / f64::from(1u32 << 20),
            date_utc: command_line("date", &["-u", "+%Y-%m-%d %H:%M UTC"]),
        }
    }
}

impl Machine {
    pub fn probe(dir: &Path) -> Machine {
        Machine {
            host: Host::probe(),
            fs: FileSystem::of(dir),
        }
    }
}

impl FileSystem {
    /// The mount holding `dir`: the /proc/self/mountinfo entry with the longest mount point
    /// that is a prefix of `dir`'s canonical path.
    fn of(dir: &Path) -> FileSystem {
        let canon = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let mut best: Option<(String, String, String)> = None;
        for line in mountinfo.lines() {
            // id parent major:minor root mount_point options [optional...] - fstype source super
            let fields: Vec<_> = line.split_whitespace().collect();
            let Some(dash) = fields.iter().position(|f| *f == "-") else {
                continue;
            };
            let (Some(mp), Some(fstype), Some(source)) =
                (fields.get(4), fields.get(dash + 1), fields.get(dash + 2))
            else {
                continue;
            };
            let mp = mp.replace("\\040", " ");
            if canon.starts_with(&mp) && best.as_ref().is_none_or(|(b, _, _)| mp.len() >= b.len()) {
                best = Some((mp, fstype.to_string(), source.to_string()));
            }
        }
        let (mount_point, fstype, device) =
            best.unwrap_or_else(|| ("?".into(), "?".into(), "?".into()));
        let free_bytes = command_line("df", &["-B1", "--output=avail", &canon.to_string_lossy()])
            .lines()
            .last()
            .and_then(|l| l.trim().parse().ok())
            .unwrap_or(0);
        FileSystem {
            dir: canon.display().to_string(),
            mount_point,
            fstype,
            device,
            free_bytes,
        }
    }
}

/// Stdout of `cmd args`, trimmed ("?" when it cannot run).
fn command_line(cmd: &str, args: &[&str]) -> String {
    Command::new(cmd)
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map_or_else(
            || "?".into(),
            |o| String::from_utf8_lossy(&o.stdout).trim().to_string(),
        )
}
