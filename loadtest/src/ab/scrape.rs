//! The server's side of a run: its own latency histograms for the run's window (two scrapes of
//! /metrics, subtracted), where its changes' time went inside the tenant, and the CPU time of
//! both processes.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use serde::Serialize;

const HANDLING: &str = "grpc_server_handling_seconds_bucket";

/// Cumulative bucket counts by (method, code, auth) → (le → count).
pub type Buckets = BTreeMap<(String, String, String), BTreeMap<u64, f64>>;

/// One scrape: the request-latency buckets, and (sum, count) of the histograms that say where a
/// change's time goes inside its tenant, by [`STAGE_SERIES`] name.
#[derive(Debug, Default)]
pub struct Page {
    pub buckets: Buckets,
    pub sums: BTreeMap<&'static str, (f64, f64)>,
}

/// The histograms read as (sum, count): (the report's name, metric, label set as exported).
const STAGE_SERIES: [(&str, &str, &str); 5] = [
    (
        "mailbox",
        "cube_change_stage_seconds",
        "{stage=\"mailbox\"}",
    ),
    (
        "durable",
        "cube_change_stage_seconds",
        "{stage=\"durable\"}",
    ),
    ("apply", "cube_change_stage_seconds", "{stage=\"apply\"}"),
    ("fsync", "cube_wal_fsync_seconds", ""),
    ("batch", "cube_wal_batch_records", ""),
];

/// Parse a whole /metrics page.
pub fn parse_page(text: &str) -> Page {
    let mut sums = BTreeMap::new();
    for (name, metric, labels) in STAGE_SERIES {
        let value = |suffix: &str| -> Option<f64> {
            let prefix = format!("{metric}_{suffix}{labels} ");
            text.lines()
                .find_map(|l| l.strip_prefix(prefix.as_str()))
                .and_then(|v| v.trim().parse().ok())
        };
        if let (Some(sum), Some(count)) = (value("sum"), value("count")) {
            sums.insert(name, (sum, count));
        }
    }
    Page {
        buckets: parse(text),
        sums,
    }
}

/// Where the server's durable changes spent their time during the window (means).
#[derive(Debug, Clone, Default, Serialize)]
pub struct ChangeStages {
    /// Changes that went through the durable stage.
    pub changes: u64,
    pub mailbox_us: f64,
    pub durable_us: f64,
    pub apply_us: f64,
    /// Write + fdatasync of one WAL batch.
    pub fsync_us: f64,
    pub records_per_batch: f64,
}

/// The window's means, or `None` when the server exported none of it (an older cubed) or no
/// change became durable in it.
pub fn stages(before: &Page, after: &Page) -> Option<ChangeStages> {
    let delta = |name: &str| -> Option<(f64, f64)> {
        let (s1, c1) = *after.sums.get(name)?;
        let (s0, c0) = before.sums.get(name).copied().unwrap_or((0.0, 0.0));
        Some((s1 - s0, c1 - c0))
    };
    let mean = |name: &str, scale: f64| -> f64 {
        delta(name)
            .filter(|(_, c)| *c > 0.0)
            .map_or(f64::NAN, |(s, c)| s / c * scale)
    };
    let (_, changes) = delta("durable").filter(|(_, c)| *c > 0.0)?;
    Some(ChangeStages {
        changes: changes.round() as u64,
        mailbox_us: mean("mailbox", 1e6),
        durable_us: mean("durable", 1e6),
        apply_us: mean("apply", 1e6),
        fsync_us: mean("fsync", 1e6),
        records_per_batch: mean("batch", 1.0),
    })
}

/// Parse the server's request-latency buckets out of a /metrics page. `le` is kept in
/// nanoseconds so it sorts as a number; +Inf is `u64::MAX`.
pub fn parse(text: &str) -> Buckets {
    let mut out = Buckets::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(HANDLING) else {
            continue;
        };
        let Some((labels, value)) = rest.strip_prefix('{').and_then(|r| r.split_once("} ")) else {
            continue;
        };
        let mut get = BTreeMap::new();
        for kv in labels.split(',') {
            if let Some((k, v)) = kv.split_once('=') {
                get.insert(k.trim(), v.trim().trim_matches('"'));
            }
        }
        let (Some(m), Some(code), Some(auth), Some(le), Ok(n)) = (
            get.get("grpc_method"),
            get.get("grpc_code"),
            get.get("auth"),
            get.get("le"),
            value.trim().parse::<f64>(),
        ) else {
            continue;
        };
        let le = if *le == "+Inf" {
            u64::MAX
        } else {
            match le.parse::<f64>() {
                Ok(s) => (s * 1e9).round() as u64,
                Err(_) => continue,
            }
        };
        out.entry((m.to_string(), code.to_string(), auth.to_string()))
            .or_default()
            .insert(le, n);
    }
    out
}

/// One method's latency as the server saw it during the window.
#[derive(Debug, Clone, Serialize)]
pub struct ServerOp {
    pub method: String,
    pub auth: String,
    pub ok: u64,
    /// Calls that ended with another code, by code.
    pub failed: BTreeMap<String, u64>,
    /// Quantiles of the OK calls, interpolated within buckets (ms).
    pub p50_ms: f64,
    pub p99_ms: f64,
}

/// Quantile `q` of cumulative buckets (le ns → count), linear within the bucket.
fn quantile(b: &BTreeMap<u64, f64>, q: f64) -> f64 {
    let total = b.get(&u64::MAX).copied().unwrap_or(0.0);
    if total <= 0.0 {
        return f64::NAN;
    }
    let rank = q * total;
    let (mut prev_le, mut prev_n) = (0u64, 0.0);
    for (&le, &n) in b {
        if n >= rank {
            if le == u64::MAX {
                return prev_le as f64 / 1e6;
            }
            let frac = if n > prev_n {
                (rank - prev_n) / (n - prev_n)
            } else {
                0.0
            };
            return (prev_le as f64 + frac * (le - prev_le) as f64) / 1e6;
        }
        (prev_le, prev_n) = (le, n);
    }
    prev_le as f64 / 1e6
}

/// Whether the server restarted between two scrapes: some series counts fewer calls after
/// than before (or is gone). Its counters then started again from zero.
pub fn restarted(before: &Buckets, after: &Buckets) -> bool {
    before.iter().any(|(key, b)| {
        let was = b.get(&u64::MAX).copied().unwrap_or(0.0);
        let now = after
            .get(key)
            .and_then(|a| a.get(&u64::MAX))
            .copied()
            .unwrap_or(0.0);
        now < was
    })
}

/// What happened between two scrapes: since the restart, if the server restarted between them
/// ([`restarted`]; the calls before it are lost with the old process's counters).
pub fn window(before: &Buckets, after: &Buckets) -> Vec<ServerOp> {
    let empty = Buckets::new();
    let before = if restarted(before, after) {
        &empty
    } else {
        before
    };
    let mut by_method: BTreeMap<(String, String), ServerOp> = BTreeMap::new();
    for (key @ (method, code, auth), b) in after {
        let delta: BTreeMap<u64, f64> = b
            .iter()
            .map(|(le, n)| {
                let was = before
                    .get(key)
                    .and_then(|x| x.get(le))
                    .copied()
                    .unwrap_or(0.0);
                (*le, n - was)
            })
            .collect();
        let count = delta.get(&u64::MAX).copied().unwrap_or(0.0).round() as u64;
        if count == 0 {
            continue;
        }
        let op = by_method
            .entry((method.clone(), auth.clone()))
            .or_insert_with(|| ServerOp {
                method: method.clone(),
                auth: auth.clone(),
                ok: 0,
                failed: BTreeMap::new(),
                p50_ms: f64::NAN,
                p99_ms: f64::NAN,
            });
        if code == "OK" {
            op.ok = count;
            op.p50_ms = quantile(&delta, 0.5);
            op.p99_ms = quantile(&delta, 0.99);
        } else {
            op.failed.insert(code.clone(), count);
        }
    }
    by_method.into_values().collect()
}

/// Scrape the server's metrics now; `None` when there is no admin address to ask or the scrape
/// failed (a window needs both of its scrapes: one missing would make it the server's whole
/// life).
pub fn scrape(admin: Option<SocketAddr>) -> Option<Page> {
    scrape_settled(admin, std::time::Duration::ZERO)
}

/// [`scrape`] once the server has counted every call it started (`grpc_server_started_total`
/// equal to `grpc_server_handled_total`), or when `within` has passed: a call the load driver
/// gave up on (a timeout) is counted, as CANCELLED, only when the server drops it, which can be
/// just after the driver's last user has ended.
pub fn scrape_settled(admin: Option<SocketAddr>, within: std::time::Duration) -> Option<Page> {
    let until = std::time::Instant::now() + within;
    let mut last = None;
    loop {
        match cube_testkit::admin_get(admin?, "/metrics") {
            Ok((_, body)) if settled(&body) => return Some(parse_page(&body)),
            Ok((_, body)) => last = Some(body),
            // A failed look while waiting: the last page read stands.
            Err(_) => {}
        }
        if std::time::Instant::now() >= until {
            return last.map(|body| parse_page(&body));
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Whether the page counts as many calls handled as started.
fn settled(text: &str) -> bool {
    let total = |metric: &str| -> f64 {
        text.lines()
            .filter(|l| l.starts_with(metric) && l[metric.len()..].starts_with(['{', ' ']))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum()
    };
    total("grpc_server_started_total") == total("grpc_server_handled_total")
}

/// User + system CPU seconds of this process so far.
pub fn own_cpu_seconds() -> Option<f64> {
    stat_cpu_seconds("/proc/self/stat")
}

/// User + system CPU seconds of process `pid` so far; `None` without a pid (a `--target`
/// server given without `--server-pid`: its CPU is unknown, not this process's).
pub fn cpu_seconds(pid: Option<u32>) -> Option<f64> {
    stat_cpu_seconds(&format!("/proc/{}/stat", pid?))
}

/// CPU seconds from a `/proc/PID/stat` file (Linux).
fn stat_cpu_seconds(path: &str) -> Option<f64> {
    stat_line_cpu_seconds(&std::fs::read_to_string(path).ok()?)
}

/// User + system CPU seconds in a `/proc/PID/stat` line.
fn stat_line_cpu_seconds(stat: &str) -> Option<f64> {
    // Fields after the command name (which may hold spaces) start at the last ')'.
    let after = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = after.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, i.e. 11 and 12 after the name.
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    Some(ticks / USER_HZ)
}

/// Clock ticks per second in /proc/PID/stat: 100 on every Linux architecture Cube builds for.
const USER_HZ: f64 = 100.0;

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: &str = r#"# TYPE grpc_server_handling_seconds histogram
grpc_server_handling_seconds_bucket{grpc_type="unary",grpc_service="cube.v1.Cells",grpc_method="Read",grpc_code="OK",auth="call",le="0.001"} 50
grpc_server_handling_seconds_bucket{grpc_type="unary",grpc_service="cube.v1.Cells",grpc_method="Read",grpc_code="OK",auth="call",le="0.002"} 90
grpc_server_handling_seconds_bucket{grpc_type="unary",grpc_service="cube.v1.Cells",grpc_method="Read",grpc_code="OK",auth="call",le="+Inf"} 100
grpc_server_handling_seconds_bucket{grpc_type="unary",grpc_service="cube.v1.Cells",grpc_method="Read",grpc_code="Unauthenticated",auth="none",le="+Inf"} 3
grpc_server_handling_seconds_count{grpc_type="unary",grpc_service="cube.v1.Cells",grpc_method="Read",grpc_code="OK",auth="call"} 100
"#;

    #[test]
    fn a_page_is_settled_when_every_started_call_is_handled() {
        let page = |handled: u32| {
            format!(
                "grpc_server_started_total{{grpc_method=\"Read\"}} 5\n\
                 grpc_server_started_total{{grpc_method=\"Write\"}} 2\n\
                 grpc_server_handled_total{{grpc_method=\"Read\",grpc_code=\"OK\"}} 4\n\
                 grpc_server_handled_total{{grpc_method=\"Write\",grpc_code=\"OK\"}} {handled}\n"
            )
        };
        assert!(!settled(&page(2)));
        assert!(settled(&page(3)));
    }

    /// [`PAGE`] as it read earlier: 10 calls in each series, no refusal.
    fn earlier_page() -> Buckets {
        parse(
            &PAGE
                .replace("} 50", "} 10")
                .replace("} 90", "} 10")
                .replace("} 100\n", "} 10\n")
                .replace("} 3\n", "} 0\n"),
        )
    }

    #[test]
    fn the_window_is_the_difference_of_two_scrapes() {
        let before = earlier_page();
        let after = parse(PAGE);
        let w = window(&before, &after);
        let read = w.iter().find(|o| o.auth == "call").unwrap();
        assert_eq!(read.ok, 90);
        // 40 of 90 in the first bucket, 40 in (1 ms, 2 ms]: the median sits at 1.125 ms.
        assert!((read.p50_ms - 1.125).abs() < 1e-9, "{}", read.p50_ms);
        let refused = w.iter().find(|o| o.auth == "none").unwrap();
        assert_eq!(refused.failed.get("Unauthenticated"), Some(&3));
        assert_eq!(refused.ok, 0);
    }

    /// A server that restarted between the scrapes counts from zero again: its window is what
    /// the new process counted, not an empty table (negative differences dropped every method).
    #[test]
    fn a_restart_between_the_scrapes_counts_from_the_restart() {
        let before = parse(PAGE);
        let after = earlier_page();
        assert!(restarted(&before, &after));
        assert!(!restarted(&after, &before));
        let w = window(&before, &after);
        let read = w.iter().find(|o| o.auth == "call").unwrap();
        assert_eq!(read.ok, 10);
    }

    #[test]
    fn change_stages_are_the_means_of_the_window() {
        let page = |mailbox: (f64, f64), durable: (f64, f64)| {
            format!(
                "cube_change_stage_seconds_sum{{stage=\"mailbox\"}} {}\n\
                 cube_change_stage_seconds_count{{stage=\"mailbox\"}} {}\n\
                 cube_change_stage_seconds_sum{{stage=\"durable\"}} {}\n\
                 cube_change_stage_seconds_count{{stage=\"durable\"}} {}\n\
                 cube_wal_fsync_seconds_sum 0.004\n\
                 cube_wal_fsync_seconds_count 20\n",
                mailbox.0, mailbox.1, durable.0, durable.1
            )
        };
        let before = parse_page(&page((0.001, 10.0), (0.002, 10.0)));
        let after = parse_page(&page((0.011, 110.0), (0.032, 110.0)));
        let s = stages(&before, &after).unwrap();
        assert_eq!(s.changes, 100);
        assert!((s.mailbox_us - 100.0).abs() < 1e-6, "{s:?}");
        assert!((s.durable_us - 300.0).abs() < 1e-6, "{s:?}");
        // No apply series, and no fsync in the window: not a number, not a zero.
        assert!(s.apply_us.is_nan() && s.fsync_us.is_nan(), "{s:?}");
        // No durable change in the window, or an older server without the series: nothing.
        assert!(stages(&after, &after).is_none());
        assert!(stages(&Page::default(), &parse_page(PAGE)).is_none());
    }

    /// utime and stime (fields 14 and 15) are read, after a command name that holds `) ` and
    /// spaces itself.
    #[test]
    fn cpu_time_is_utime_plus_stime_of_the_stat_line() {
        let line = "4242 (cube) load (x)) S 1 4242 4242 0 -1 4194560 100 0 0 0 \
                    250 125 7 9 20 0 3 0 12345 1000000 200 18446744073709551615";
        assert_eq!(stat_line_cpu_seconds(line), Some(3.75));
        assert_eq!(stat_line_cpu_seconds("4242 (cube) S 1"), None);
    }

    #[test]
    fn own_cpu_time_is_readable_and_no_pid_is_no_server() {
        assert!(own_cpu_seconds().is_some());
        // A --target without --server-pid: unknown, not this process's CPU.
        assert_eq!(cpu_seconds(None), None);
        assert!(cpu_seconds(Some(std::process::id())).is_some());
    }
}
