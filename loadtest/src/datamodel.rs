//! `cube-load datamodel`: the data-model and tenant-lifecycle targets, measured against real
//! cubed processes in one run.
//!
//! 1. Load `--cells` cells (a cube grid) with checkpoints disabled, kill -9, and time the restart
//!    plus the first call (the tenant opens lazily: that call replays the whole WAL).
//! 2. Region over a box holding 1% of the cells, streamed page by page: cells/s.
//! 3. SIGTERM (final checkpoint), restart, and time the first call again for the big tenant and
//!    for a one-cell tenant: after a checkpoint, restart time should not depend on data size.
//! 4. `--tenants` tenants created and written once, left idle until passivated: cubed's RSS, then
//!    the latency of the first call to idle tenants (wake-up).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Args;
use cube_api::v1::admin_client::AdminClient;
use cube_api::v1::cells_client::CellsClient;
use cube_api::v1::{CreateTenantRequest, ReadRequest, RegionRequest, WriteRequest};
use cube_auth::client::{CallSigner, Signing};
use cube_auth::{Credentials, Secret};
use cube_testkit::TestServer;
use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::drive::connect;

#[derive(Debug, Args)]
pub struct DataModelArgs {
    /// Cells loaded into one tenant (rounded down to a cube).
    #[arg(long, default_value_t = 1_000_000)]
    cells: u64,
    /// Tenants for the passivation part (0 skips it).
    #[arg(long, default_value_t = 10_000)]
    tenants: usize,
    /// Writes in flight while loading.
    #[arg(long, default_value_t = 128)]
    in_flight: usize,
    /// Region scans of the box.
    #[arg(long, default_value_t = 5)]
    region_rounds: usize,
    /// The cubed binary (default: next to this one).
    #[arg(long)]
    cubed: Option<PathBuf>,
}

type Client = CellsClient<Signing<Channel>>;

fn signer(c: &Credentials) -> anyhow::Result<CallSigner> {
    Ok(CallSigner::new(&c.tenant, &c.key_id, c.secret()?))
}

fn c3(x: i32, y: i32, z: i32) -> Option<cube_api::v1::Coord> {
    Some(cube_api::v1::Coord { x, y, z })
}

/// Time the first Read of a tenant (which opens it) on a fresh connection.
async fn first_call(server: &TestServer, creds: &Credentials) -> anyhow::Result<Duration> {
    let ch = connect(&server.addr.to_string(), 1).await?.remove(0);
    let mut c = CellsClient::new(Signing::new(ch, signer(creds)?));
    let t = Instant::now();
    c.read(ReadRequest { coord: c3(0, 0, 0) }).await?;
    Ok(t.elapsed())
}

/// What the server logged when it opened `tenant` (records replayed from the WAL and the
/// checkpoint they started after).
fn recovered_line(server: &TestServer, tenant: &str) -> String {
    let log = strip_ansi(&server.log());
    log.lines()
        .rfind(|l| l.contains("tenant recovered") && l.contains(&format!("tenant=\"{tenant}\"")))
        .map(|l| {
            l.split_whitespace()
                .filter(|w| {
                    [
                        "checkpoint_seq=",
                        "records=",
                        "store_open_ms=",
                        "replay_ms=",
                        "total_ms=",
                    ]
                    .iter()
                    .any(|p| w.starts_with(p))
                })
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_else(|| "no recovery line in the log".into())
}

/// Files and bytes under `dir`, recursively.
fn dir_usage(dir: &std::path::Path) -> (u64, u64) {
    let mut stack = vec![dir.to_path_buf()];
    let (mut files, mut bytes) = (0, 0);
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            match e.metadata() {
                Ok(m) if m.is_dir() => stack.push(e.path()),
                Ok(m) => {
                    files += 1;
                    bytes += m.len();
                }
                Err(_) => {}
            }
        }
    }
    (files, bytes)
}

/// The log without terminal colour codes.
fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn restart_timed(server: &mut TestServer, kill: bool) -> anyhow::Result<Duration> {
    if kill {
        server.kill9()?;
    } else {
        anyhow::ensure!(server.sigterm()?.success(), "cubed did not stop cleanly");
    }
    let t = Instant::now();
    server.restart()?;
    Ok(t.elapsed())
}

pub async fn run(args: DataModelArgs, default_cubed: PathBuf) -> anyhow::Result<()> {
    let cubed = args.cubed.clone().unwrap_or(default_cubed);
    let side = (args.cells as f64).cbrt().floor() as i32;
    let cells = u64::try_from(side).unwrap_or(0).pow(3);
    let mut server = tokio::task::block_in_place(|| {
        TestServer::start_with(
            &cubed,
            &[
                "--checkpoint-bytes",
                "1099511627776",
                "--checkpoint-secs",
                // cubed's most: no checkpoint within the run.
                "86400",
            ],
        )
    })?;
    let small = tokio::task::block_in_place(|| server.create_tenant("small"))?;
    let demo = server.demo.clone();

    // 1. Load.
    let channels = connect(&server.addr.to_string(), 8).await?;
    let next = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for t in 0..args.in_flight {
        let mut c: Client = CellsClient::new(Signing::new(
            channels[t % channels.len()].clone(),
            signer(&demo)?,
        ));
        let next = Arc::clone(&next);
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= cells {
                    return Ok::<_, tonic::Status>(());
                }
                let (s, i) = (side as u64, i);
                let (x, y, z) = ((i % s) as i32, ((i / s) % s) as i32, (i / (s * s)) as i32);
                c.write(WriteRequest {
                    coord: c3(x, y, z),
                    value: i.to_le_bytes().repeat(2),
                    expected_version: None,
                })
                .await?;
            }
        }));
    }
    for t in tasks {
        t.await??;
    }
    let load_secs = started.elapsed().as_secs_f64();
    let mut sc: Client = CellsClient::new(Signing::new(channels[0].clone(), signer(&small)?));
    sc.write(WriteRequest {
        coord: c3(0, 0, 0),
        value: b"one".to_vec(),
        expected_version: None,
    })
    .await?;
    println!(
        "loaded {cells} cells ({side}^3) in {load_secs:.1} s = {:.0} durable writes/s",
        cells as f64 / load_secs
    );

    // Recovery with the whole WAL to replay: the state store removed (as if lost), so every
    // record since the start (no checkpoint deleted any) is applied again.
    tokio::task::block_in_place(|| server.kill9())?;
    std::fs::remove_dir_all(server.tenant_state_dir("demo"))?;
    let t = Instant::now();
    tokio::task::block_in_place(|| server.restart())?;
    let restart = t.elapsed();
    let full = first_call(&server, &demo).await?;
    println!(
        "full replay after kill -9 (state store removed): restart {:.2} s + first call {:.2} s = {:.2} s; {} (target <= 10 s)",
        restart.as_secs_f64(),
        full.as_secs_f64(),
        (restart + full).as_secs_f64(),
        recovered_line(&server, "demo")
    );
    // An ordinary kill -9: sled keeps what it had written, only the rest is replayed.
    let restart = tokio::task::block_in_place(|| restart_timed(&mut server, true))?;
    let replay = first_call(&server, &demo).await?;
    println!(
        "ordinary restart after kill -9: restart {:.2} s + first call {:.2} s; {}",
        restart.as_secs_f64(),
        replay.as_secs_f64(),
        recovered_line(&server, "demo")
    );

    // 2. Region over 1% of the cells.
    let ch = connect(&server.addr.to_string(), 1).await?.remove(0);
    let mut c: Client = CellsClient::new(Signing::new(ch, signer(&demo)?));
    let tenth = (side / 10).max(1) - 1;
    let mut rates = Vec::new();
    let mut in_box = 0u64;
    for _ in 0..args.region_rounds {
        let t = Instant::now();
        let mut token = Vec::new();
        let mut n = 0u64;
        loop {
            let resp = c
                .region(RegionRequest {
                    min: c3(0, 0, 0),
                    max: c3(tenth, side - 1, tenth),
                    limit: 10_000,
                    page_token: token,
                })
                .await?;
            let next = resp
                .metadata()
                .get_bin("x-cube-next-page-token-bin")
                .and_then(|v| v.to_bytes().ok())
                .map(|b| b.to_vec());
            let mut stream = resp.into_inner();
            while stream.message().await?.is_some() {
                n += 1;
            }
            match next {
                Some(t) => token = t,
                None => break,
            }
        }
        in_box = n;
        rates.push(n as f64 / t.elapsed().as_secs_f64());
    }
    println!(
        "region over a box holding {in_box} of {cells} cells: median {:.0} cells/s over {} scans (target >= 200,000)",
        crate::drive::median(rates),
        args.region_rounds
    );

    // 3. After a checkpoint (SIGTERM makes one), big vs one-cell tenant: five restarts, the
    //    order alternating so neither always opens while the other's background work runs.
    let (mut bigs, mut ones, mut restarts) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..5 {
        let restart = tokio::task::block_in_place(|| restart_timed(&mut server, false))?;
        restarts.push(restart.as_secs_f64());
        let (big, one) = if round % 2 == 0 {
            let b = first_call(&server, &demo).await?;
            (b, first_call(&server, &small).await?)
        } else {
            let o = first_call(&server, &small).await?;
            (first_call(&server, &demo).await?, o)
        };
        bigs.push(big.as_secs_f64() * 1e3);
        ones.push(one.as_secs_f64() * 1e3);
    }
    println!(
        "after a checkpoint (median of 5 restarts): restart {:.2} s; first call of the {cells}-cell tenant {:.1} ms ({}; all {:?}) vs the 1-cell tenant {:.1} ms ({}; all {:?})",
        crate::drive::median(restarts),
        crate::drive::median(bigs.clone()),
        recovered_line(&server, "demo"),
        bigs.iter().map(|v| v.round() as u64).collect::<Vec<_>>(),
        crate::drive::median(ones.clone()),
        recovered_line(&server, &small.tenant),
        ones.iter().map(|v| v.round() as u64).collect::<Vec<_>>(),
    );
    let (files, bytes) = dir_usage(&server.tenant_state_dir("demo"));
    println!(
        "    the {cells}-cell tenant's state store: {files} files, {} MiB",
        bytes >> 20
    );
    drop(server);

    if args.tenants > 0 {
        tenants(&cubed, args.tenants).await?;
    }
    Ok(())
}

async fn admin_client(server: &TestServer) -> anyhow::Result<AdminClient<Channel>> {
    let path = server.admin_socket();
    let channel = Endpoint::try_from("http://admin.sock")?
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(path).await?))
            }
        }))
        .await?;
    Ok(AdminClient::new(channel))
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

async fn tenants(cubed: &std::path::Path, n: usize) -> anyhow::Result<()> {
    let server =
        tokio::task::block_in_place(|| TestServer::start_with(cubed, &["--idle-secs", "3"]))?;
    let admin = admin_client(&server).await?;
    let pid = server.pid().unwrap_or(0);
    let rss_start = rss_kib(pid);
    let t = Instant::now();
    let next = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let (mut admin, next) = (admin.clone(), Arc::clone(&next));
        let ch = connect(&server.addr.to_string(), 1).await?.remove(0);
        tasks.push(tokio::spawn(async move {
            let mut made = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                if i >= n {
                    return Ok::<_, anyhow::Error>(made);
                }
                let r = admin
                    .create_tenant(CreateTenantRequest {
                        name: format!("t{i}"),
                    })
                    .await?
                    .into_inner()
                    .credentials
                    .ok_or_else(|| anyhow::anyhow!("no credentials"))?;
                let creds = Credentials {
                    tenant: r.tenant,
                    key_id: r.key_id,
                    secret: r.secret,
                    endpoint: None,
                };
                let signer = CallSigner::new(
                    &creds.tenant,
                    &creds.key_id,
                    Secret::from_hex(&creds.secret)?,
                );
                let mut c = CellsClient::new(Signing::new(ch.clone(), signer));
                c.write(WriteRequest {
                    coord: c3(1, 2, 3),
                    value: vec![7; 100],
                    expected_version: None,
                })
                .await?;
                made.push(creds);
            }
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await??);
    }
    println!(
        "{n} tenants created and written once in {:.1} s; RSS {:.0} MiB at start, {:.0} MiB now",
        t.elapsed().as_secs_f64(),
        rss_start as f64 / 1024.0,
        rss_kib(pid) as f64 / 1024.0
    );
    // Wait for idleness to passivate them all.
    let deadline = Instant::now() + Duration::from_secs(120);
    while server.metric("cube_tenants_active").unwrap_or(-1.0) > 0.0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let rss_idle = rss_kib(pid);
    println!(
        "all idle: cube_tenants_active {}, passivated {}, RSS {:.0} MiB (target <= 512 MiB)",
        server.metric("cube_tenants_active").unwrap_or(-1.0),
        server
            .metric("cube_tenants_passivated_total")
            .unwrap_or(-1.0),
        rss_idle as f64 / 1024.0
    );
    // Wake 1000 idle tenants, one at a time, on one connection.
    let ch = connect(&server.addr.to_string(), 1).await?.remove(0);
    let mut lat = Vec::new();
    for creds in all.iter().step_by((all.len() / 1000).max(1)).take(1000) {
        let mut c = CellsClient::new(Signing::new(ch.clone(), signer(creds)?));
        let t = Instant::now();
        let r = c
            .read(ReadRequest { coord: c3(1, 2, 3) })
            .await?
            .into_inner();
        lat.push(t.elapsed().as_secs_f64() * 1e3);
        anyhow::ensure!(r.found, "tenant {} lost its cell", creds.tenant);
    }
    lat.sort_by(f64::total_cmp);
    let q = |p: f64| lat[((lat.len() as f64 * p) as usize).min(lat.len() - 1)];
    println!(
        "waking {} idle tenants: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms (target p99 <= 20 ms); RSS after {:.0} MiB",
        lat.len(),
        q(0.5),
        q(0.99),
        q(1.0),
        rss_kib(pid) as f64 / 1024.0
    );
    Ok(())
}
