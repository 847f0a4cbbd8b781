//! `cube-load metrics-cost`: throughput with metrics recorded vs `--no-metrics`, two servers in
//! one run, phases alternating between them so machine drift cancels out.

use std::path::PathBuf;

use clap::Args;
use cube_api::v1::cells_client::CellsClient;
use cube_api::v1::{ReadRequest, WriteRequest};
use cube_auth::client::{CallSigner, Signing};
use cube_testkit::TestServer;
use tonic::transport::Channel;

use crate::drive::{LoadShape, Phase, RunArgs, connect, coord, median, phase};

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

/// One phase of `op` against each server, the one with metrics first if `on_first`: (on, off).
async fn on_and_off<F, Fut>(
    name: &str,
    on_first: bool,
    (c_on, c_off): (&[Client], &[Client]),
    shape: &LoadShape,
    op: F,
) -> (Phase, Phase)
where
    F: Fn(Client, usize, u64) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = bool> + Send,
{
    let (on_name, off_name) = (
        format!("{name}, metrics on"),
        format!("{name}, metrics off"),
    );
    let on = || phase(&on_name, c_on, shape, op.clone());
    let off = || phase(&off_name, c_off, shape, op.clone());
    if on_first {
        let on = on().await;
        (on, off().await)
    } else {
        let off = off().await;
        (on().await, off)
    }
}

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
    let mut failed = 0;
    for round in 1..=args.run.rounds {
        // Which server goes first alternates (on, off in odd rounds; off, on in even ones), so
        // neither a drift of the machine's speed within a round nor the background work one
        // server's writes leave behind always lands on the same side.
        let on_first = round % 2 == 1;
        let sides = (&c_on[..], &c_off[..]);
        let (w_on, w_off) = on_and_off("Write", on_first, sides, &shape, write).await;
        let (r_on, r_off) = on_and_off("Read", on_first, sides, &shape, read).await;
        failed += w_on.errors + w_off.errors + r_on.errors + r_off.errors;
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
    anyhow::ensure!(
        failed == 0,
        "{failed} calls failed in the measured rounds (their errors are above): the rates count \
         successful calls only, so these rounds do not measure what metrics cost"
    );
    println!();
    println!(
        "Target: metrics on within 5% of off → Write {:.1}%, Read {:.1}% (median of {} rounds)",
        100.0 * median(w_ratios),
        100.0 * median(r_ratios),
        args.run.rounds
    );
    Ok(())
}
