//! `cube-load auth-cost`: what each authentication model costs, measured in one run.
//!
//! - Read throughput at `in_flight` calls over ONE connection, authenticated once by the
//!   handshake vs signing every call, in alternating rounds (median ratio reported);
//! - handshake (Challenge + Hello) latency vs one Read's latency on the same connection, one at
//!   a time.

use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use cube_api::v1::ReadRequest;
use cube_api::v1::cells_client::CellsClient;
use cube_auth::client::{CallSigner, Signing, handshake};
use cube_testkit::TestServer;
use hdrhistogram::Histogram;
use tonic::transport::{Channel, Endpoint};

use crate::drive::{LoadShape, coord, phase};

#[derive(Debug, Args)]
pub struct AuthCostArgs {
    /// Reads in flight on the single connection.
    #[arg(long, default_value_t = 64)]
    in_flight: usize,
    /// Measured seconds per phase.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Unmeasured warm-up seconds per phase.
    #[arg(long, default_value_t = 1.0)]
    warmup: f64,
    /// Rounds of (per-connection, per-call).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Sequential handshakes and sequential reads measured for the latency comparison.
    #[arg(long, default_value_t = 3000)]
    samples: usize,
    /// cubed binary (default: the one next to cube-load).
    #[arg(long)]
    cubed: Option<PathBuf>,
}

async fn one_connection(server: &TestServer) -> anyhow::Result<Channel> {
    Ok(Endpoint::from_shared(server.endpoint())?
        .tcp_nodelay(true)
        .connect()
        .await?)
}

fn hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("bounds")
}

pub async fn run(args: AuthCostArgs, default_cubed: PathBuf) -> anyhow::Result<()> {
    let cubed = args.cubed.clone().unwrap_or(default_cubed);
    let server = tokio::task::block_in_place(|| TestServer::start(&cubed))?;
    let creds = server.demo.clone();
    let shape = LoadShape {
        in_flight: args.in_flight,
        seconds: args.seconds,
        warmup: args.warmup,
    };

    // Cells the reads hit.
    let setup = one_connection(&server).await?;
    handshake(setup.clone(), &creds).await?;
    let mut writer = CellsClient::new(setup);
    for i in 0..64 {
        writer
            .write(cube_api::v1::WriteRequest {
                coord: coord(i, 0),
                value: vec![7; 100],
                expected_version: None,
            })
            .await?;
    }

    let conn_channel = one_connection(&server).await?;
    handshake(conn_channel.clone(), &creds).await?;
    let conn_client = [CellsClient::new(Signing::passthrough(conn_channel.clone()))];
    let signer = CallSigner::new(&creds.tenant, &creds.key_id, creds.secret()?);
    let call_client = [CellsClient::new(Signing::new(
        one_connection(&server).await?,
        signer,
    ))];
    let read = |mut c: CellsClient<Signing<Channel>>, _task: usize, i: u64| async move {
        c.read(ReadRequest {
            coord: coord((i % 64) as i32, 0),
        })
        .await
        .is_ok()
    };
    let mut ratios = Vec::new();
    println!("| round | per-connection reads/s | per-call reads/s | per-call ÷ per-connection |");
    println!("|---:|---:|---:|---:|");
    for round in 1..=args.rounds {
        let conn = phase("Read, per-connection", &conn_client, &shape, read).await;
        let call = phase("Read, per-call signed", &call_client, &shape, read).await;
        let ratio = call.calls_per_sec / conn.calls_per_sec;
        ratios.push(ratio);
        println!(
            "| {round} | {:.0} | {:.0} | {:.1}% |",
            conn.calls_per_sec,
            call.calls_per_sec,
            100.0 * ratio
        );
    }
    ratios.sort_by(f64::total_cmp);
    let median = ratios[ratios.len() / 2];

    // Latency, one at a time, on one connection: handshakes vs reads.
    let channel = one_connection(&server).await?;
    let mut hs = hist();
    let mut rd = hist();
    let mut reader = CellsClient::new(channel.clone());
    for _ in 0..args.samples {
        let t = Instant::now();
        handshake(channel.clone(), &creds).await?;
        hs.record(t.elapsed().as_micros() as u64)?;
        let t = Instant::now();
        reader.read(ReadRequest { coord: coord(1, 0) }).await?;
        rd.record(t.elapsed().as_micros() as u64)?;
    }
    println!();
    println!("| one at a time, same connection | p50 µs | p99 µs |");
    println!("|---|---:|---:|");
    println!(
        "| handshake (Challenge + Hello) | {} | {} |",
        hs.value_at_quantile(0.5),
        hs.value_at_quantile(0.99)
    );
    println!(
        "| Read | {} | {} |",
        rd.value_at_quantile(0.5),
        rd.value_at_quantile(0.99)
    );
    println!();
    let hs_ratio = hs.value_at_quantile(0.5) as f64 / rd.value_at_quantile(0.5).max(1) as f64;
    println!(
        "Targets: per-call signing costs ≤ 10% of per-connection Read throughput → costs {:.1}% (median of {} rounds); handshake p50 ≤ 3× Read p50 → {:.2}×",
        100.0 * (1.0 - median),
        ratios.len(),
        hs_ratio
    );
    Ok(())
}
