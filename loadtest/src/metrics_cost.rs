//! `cube-load metrics-cost`: throughput with metrics recorded vs `--no-metrics`, two servers in
//! one run, phases alternating between them so machine drift cancels out.

use std::path::PathBuf;

use clap::Args;
use cube_api::v1::cells_client::CellsClient;
use cube_api::v1::{ReadRequest, WriteRequest};
use cube_auth::client::{CallSigner, Signing};
use cube_testkit::TestServer;
use tonic::transport::Channel;

use crate::drive::{RunArgs, connect, coord, median, phase};

#[derive(Debug, Args)]
pub struct MetricsCostArgs {
    /// HTTP/2 connections per phase.
    #[arg(long, default_value_t = 8, value_parser = crate::args::at_least_one::<usize>)]
    connections: usize,
    /// Calls in flight in total (closed loop: each finished call starts the next).
    #[arg(long, default_value_t = 256, value_parser = crate::args::at_least_one::<usize>)]
    in_flight: usize,
    #[command(flatten)]
    run: RunArgs,
}

type Client = CellsClient<Signing<Channel>>;

async fn clients(server: &TestServer, n: usize) -> anyhow::Result<Vec<Client>> {
    let signer = CallSigner::new(
        &server.demo.tenant,
        &server.demo.key_id,
        server.demo.secret()?,
    );
    Ok(connect(&server.addr.to_string(), n)
        .await?
        .into_iter()
        .map(|ch| CellsClient::new(Signing::new(ch, signer.clone())))
        .collect())
}

pub async fn run(args: MetricsCostArgs, default_cubed: PathBuf) -> anyhow::Result<()> {
    let cubed = args.run.cubed_or(default_cubed);
    let on = tokio::task::block_in_place(|| TestServer::start(&cubed))?;
    let off = tokio::task::block_in_place(|| TestServer::start_with(&cubed, &["--no-metrics"]))?;
    let (c_on, c_off) = (
        clients(&on, args.connections).await?,
        clients(&off, args.connections).await?,
    );
    let shape = args.run.shape(args.in_flight);
    let write = |mut c: Client, task: usize, i: u64| async move {
        let req = WriteRequest {
            coord: coord(task as i32, i as i32),
            value: vec![0xA5; 100],
            expected_version: None,
        };
        c.write(req).await.is_ok()
    };
    let read = |mut c: Client, task: usize, i: u64| async move {
        c.read(ReadRequest {
            coord: coord(task as i32, (i % 32) as i32),
        })
        .await
        .is_ok()
    };
    let (mut w_ratios, mut r_ratios) = (Vec::new(), Vec::new());
    println!("| round | Write on/s | Write off/s | on ÷ off | Read on/s | Read off/s | on ÷ off |");
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    for round in 1..=args.run.rounds {
        let w_on = phase("Write, metrics on", &c_on, &shape, write).await;
        let w_off = phase("Write, metrics off", &c_off, &shape, write).await;
        let r_on = phase("Read, metrics on", &c_on, &shape, read).await;
        let r_off = phase("Read, metrics off", &c_off, &shape, read).await;
        let (w, r) = (
            w_on.calls_per_sec / w_off.calls_per_sec,
            r_on.calls_per_sec / r_off.calls_per_sec,
        );
        w_ratios.push(w);
        r_ratios.push(r);
        println!(
            "| {round} | {:.0} | {:.0} | {:.1}% | {:.0} | {:.0} | {:.1}% |",
            w_on.calls_per_sec,
            w_off.calls_per_sec,
            100.0 * w,
            r_on.calls_per_sec,
            r_off.calls_per_sec,
            100.0 * r
        );
    }
    println!();
    println!(
        "Target: metrics on within 5% of off → Write {:.1}%, Read {:.1}% (median of {} rounds)",
        100.0 * median(w_ratios),
        100.0 * median(r_ratios),
        args.run.rounds
    );
    Ok(())
}
