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

use crate::drive::{RunArgs, coord, median, phase};

#[derive(Debug, Args)]
pub struct AuthCostArgs {
    /// Reads in flight on the single connection.
    #[arg(long, default_value_t = 64)]
    in_flight: usize,
    #[command(flatten)]
    run: RunArgs,
    /// Sequential handshakes and sequential reads measured for the latency comparison.
    #[arg(long, default_value_t = 3000)]
    samples: usize,
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
    let cubed = args.run.cubed_or(default_cubed);
    let server = tokio::task::block_in_place(|| TestServer::start(&cubed))?;
    let creds = server.demo.clone();
    let shape = args.run.shape(args.in_flight);

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
    for round in 1..=args.run.rounds {
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
    let rounds = ratios.len();
    let median = median(ratios);

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
        rounds,
        hs_ratio
    );
    mixed(&server, &args).await?;
    Ok(())
}

/// Tenant.Audit (limit 100) against Read under a mix of writes, reads and audits: 8 connections
/// authenticated by handshake, `in_flight` tasks, each cycling Write → Read → Audit.
async fn mixed(server: &TestServer, args: &AuthCostArgs) -> anyhow::Result<()> {
    use cube_api::v1::tenant_client::TenantClient;
    use cube_api::v1::{AuditRequest, WriteRequest};
    let mut channels = Vec::new();
    for _ in 0..8 {
        let ch = one_connection(server).await?;
        handshake(ch.clone(), &server.demo).await?;
        channels.push(ch);
    }
    let deadline =
        Instant::now() + std::time::Duration::from_secs_f64(args.run.warmup + args.run.seconds);
    let measure_from = Instant::now() + std::time::Duration::from_secs_f64(args.run.warmup);
    let tasks: Vec<_> = (0..args.in_flight)
        .map(|task| {
            let ch = channels[task % channels.len()].clone();
            tokio::spawn(async move {
                let (mut cells, mut tenant) = (CellsClient::new(ch.clone()), TenantClient::new(ch));
                let (mut w, mut r, mut a) = (hist(), hist(), hist());
                let mut i: u64 = 0;
                while Instant::now() < deadline {
                    let t = Instant::now();
                    let which = i % 3;
                    let ok = match which {
                        0 => cells
                            .write(WriteRequest {
                                coord: coord(1000 + task as i32, i as i32),
                                value: vec![5; 100],
                                expected_version: None,
                            })
                            .await
                            .is_ok(),
                        1 => cells
                            .read(ReadRequest {
                                coord: coord((i % 64) as i32, 0),
                            })
                            .await
                            .is_ok(),
                        _ => match tenant
                            .audit(AuditRequest {
                                from_seq: 1 + (i * 7919) % 5000,
                                limit: 100,
                            })
                            .await
                        {
                            Ok(resp) => {
                                let mut s = resp.into_inner();
                                let mut ok = true;
                                while let Some(m) = s.message().await.transpose() {
                                    ok &= m.is_ok();
                                }
                                ok
                            }
                            Err(_) => false,
                        },
                    };
                    if ok && t >= measure_from {
                        let us = t.elapsed().as_micros() as u64;
                        let _ = [&mut w, &mut r, &mut a][which as usize].record(us);
                    }
                    i += 1;
                }
                (w, r, a)
            })
        })
        .collect();
    let (mut w, mut r, mut a) = (hist(), hist(), hist());
    for t in tasks {
        let (tw, tr, ta) = t.await?;
        w.add(&tw)?;
        r.add(&tr)?;
        a.add(&ta)?;
    }
    println!();
    println!(
        "Mixed load ({} in flight on 8 handshake-authenticated connections, Write → Read → Audit(limit 100)):",
        args.in_flight
    );
    println!();
    println!("| op | calls | p50 µs | p99 µs | max µs |");
    println!("|---|---:|---:|---:|---:|");
    for (name, h) in [
        ("Write", &w),
        ("Read", &r),
        ("Tenant.Audit (limit 100)", &a),
    ] {
        println!(
            "| {name} | {} | {} | {} | {} |",
            h.len(),
            h.value_at_quantile(0.5),
            h.value_at_quantile(0.99),
            h.max()
        );
    }
    println!();
    println!(
        "Target: Audit p99 ≤ 3× Read p99 → {:.2}×",
        a.value_at_quantile(0.99) as f64 / r.value_at_quantile(0.99).max(1) as f64
    );
    Ok(())
}
