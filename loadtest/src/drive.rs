//! Closed-loop load: `connections` HTTP/2 connections, `in_flight` tasks spread over them, each
//! issuing one call after another. Latency is recorded after a warm-up, per call, in an HDR
//! histogram (µs).

use std::future::Future;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Args;
use cube_api::v1::cells_client::CellsClient;
use cube_api::v1::{Coord, ReadRequest, WriteRequest};
use cube_auth::client::{CallSigner, Signing};
use cube_testkit::TestServer;
use hdrhistogram::Histogram;
use rand::Rng;
use serde::Serialize;
use tonic::transport::{Channel, Endpoint};

use crate::echo::EchoChild;
use crate::echo::pb::EchoRequest;
use crate::echo::pb::echo_client::EchoClient;

#[derive(Debug, Args)]
pub struct E2eArgs {
    /// HTTP/2 connections per phase.
    #[arg(long, default_value_t = 8, value_parser = crate::args::at_least_one::<usize>)]
    connections: usize,
    /// Calls in flight in total (closed loop: each finished call starts the next).
    #[arg(long, default_value_t = 256, value_parser = crate::args::at_least_one::<usize>)]
    in_flight: usize,
    #[command(flatten)]
    run: RunArgs,
    /// Value size of Write/Read (and the echo payload mirroring it).
    #[arg(long, default_value_t = 100)]
    value_bytes: usize,
    /// Also write the results as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// How hard a phase pushes.
#[derive(Debug, Clone, Copy)]
pub struct LoadShape {
    pub in_flight: usize,
    pub seconds: f64,
    pub warmup: f64,
}

impl E2eArgs {
    fn shape(&self) -> LoadShape {
        self.run.shape(self.in_flight)
    }
}

/// Flags every measuring subcommand shares. Phases run in rounds; ratios are taken within a
/// round and the median round is reported, so drift in the machine's speed cancels out.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Measured seconds per phase.
    #[arg(long, default_value_t = 3.0, value_parser = crate::args::positive)]
    pub seconds: f64,
    /// Unmeasured warm-up seconds per phase.
    #[arg(long, default_value_t = 1.0, value_parser = crate::args::non_negative)]
    pub warmup: f64,
    /// Rounds of alternating phases.
    #[arg(long, default_value_t = 3, value_parser = crate::args::at_least_one::<usize>)]
    pub rounds: usize,
    /// cubed binary (default: the one next to cube-load).
    #[arg(long)]
    pub cubed: Option<PathBuf>,
}

impl RunArgs {
    pub fn shape(&self, in_flight: usize) -> LoadShape {
        LoadShape {
            in_flight,
            seconds: self.seconds,
            warmup: self.warmup,
        }
    }

    pub fn cubed_or(&self, default: PathBuf) -> PathBuf {
        self.cubed.clone().unwrap_or(default)
    }
}

/// The median of `v` (the mean of the middle two for an even count; NaN for none).
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[mid],
        _ => (v[mid - 1] + v[mid]) / 2.0,
    }
}

#[derive(Debug, Serialize)]
pub struct Phase {
    pub name: String,
    pub calls: u64,
    /// Calls that failed within the measured window (not in `calls` or the rates).
    pub errors: u64,
    seconds: f64,
    pub calls_per_sec: f64,
    p50_us: u64,
    p99_us: u64,
    max_us: u64,
}

/// `n` separate HTTP/2 connections to `addr`.
pub async fn connect(addr: &str, n: usize) -> anyhow::Result<Vec<Channel>> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(
            Endpoint::from_shared(format!("http://{addr}"))?
                .tcp_nodelay(true)
                .connect()
                .await?,
        );
    }
    Ok(out)
}

/// Run one closed-loop phase: `call(client, task, i)` returns whether the call succeeded.
pub async fn phase<C, F, Fut>(name: &str, clients: &[C], args: &LoadShape, call: F) -> Phase
where
    C: Clone + Send + 'static,
    F: Fn(C, usize, u64) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = bool> + Send,
{
    let start = Instant::now();
    let measure_from = start + Duration::from_secs_f64(args.warmup);
    let end = measure_from + Duration::from_secs_f64(args.seconds);
    let tasks: Vec<_> = (0..args.in_flight)
        .map(|task| {
            let client = clients[task % clients.len()].clone();
            let call = call.clone();
            tokio::spawn(async move {
                let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("bounds");
                let (mut errors, mut i) = (0u64, 0u64);
                loop {
                    let t = Instant::now();
                    let ok = call(client.clone(), task, i).await;
                    let now = Instant::now();
                    i += 1;
                    if now >= end {
                        break;
                    }
                    if t >= measure_from {
                        if ok {
                            let _ = hist.record((now - t).as_micros() as u64);
                        } else {
                            errors += 1;
                        }
                    }
                }
                (hist, errors)
            })
        })
        .collect();
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("bounds");
    let mut errors = 0;
    for t in tasks {
        let (h, e) = t.await.expect("load task");
        hist.add(&h).expect("same bounds");
        errors += e;
    }
    let calls = hist.len();
    let p = Phase {
        name: name.into(),
        calls,
        errors,
        seconds: args.seconds,
        calls_per_sec: calls as f64 / args.seconds,
        p50_us: hist.value_at_quantile(0.5),
        p99_us: hist.value_at_quantile(0.99),
        max_us: hist.max(),
    };
    eprintln!(
        "{:<28} {:>10.0} calls/s  p50 {:>6} µs  p99 {:>6} µs  errors {}",
        p.name, p.calls_per_sec, p.p50_us, p.p99_us, p.errors
    );
    p
}

pub fn coord(x: i32, y: i32) -> Option<Coord> {
    Some(Coord { x, y, z: 0 })
}

type EchoC = EchoClient<Channel>;
type CubeC = CellsClient<Signing<Channel>>;

/// One round: echo (write-shaped), Write, echo (read-shaped), Read.
async fn run_round(
    e2e: &E2eArgs,
    echo_clients: &[EchoC],
    cube_clients: &[CubeC],
    value: &[u8],
) -> Vec<Phase> {
    let shape = e2e.shape();
    let args = &shape;
    let mut phases = Vec::new();
    let v = value.to_vec();
    phases.push(
        phase(
            "echo (write-shaped)",
            echo_clients,
            args,
            move |mut c, _, _| {
                let payload = v.clone();
                async move {
                    c.echo(EchoRequest {
                        payload,
                        reply_bytes: 16,
                    })
                    .await
                    .is_ok()
                }
            },
        )
        .await,
    );
    let v = value.to_vec();
    phases.push(
        phase(
            "Cells.Write (durable)",
            cube_clients,
            args,
            move |mut c, task, i| {
                let value = v.clone();
                async move {
                    let req = WriteRequest {
                        coord: coord(task as i32, i as i32),
                        value,
                        expected_version: None,
                    };
                    c.write(req).await.is_ok()
                }
            },
        )
        .await,
    );
    let n = value.len() as u32;
    phases.push(
        phase(
            "echo (read-shaped)",
            echo_clients,
            args,
            move |mut c, _, _| async move {
                c.echo(EchoRequest {
                    payload: vec![0; 16],
                    reply_bytes: n,
                })
                .await
                .is_ok()
            },
        )
        .await,
    );
    // Reads hit cells the write phase created (task 0..in_flight, i 0..32).
    let tasks = args.in_flight as i32;
    phases.push(
        phase("Cells.Read", cube_clients, args, move |mut c, _, _| {
            let (x, y) = {
                let mut rng = rand::thread_rng();
                (rng.gen_range(0..tasks), rng.gen_range(0..32))
            };
            async move { c.read(ReadRequest { coord: coord(x, y) }).await.is_ok() }
        })
        .await,
    );
    phases
}

pub async fn e2e(args: E2eArgs, default_cubed: PathBuf) -> anyhow::Result<()> {
    let cubed = args.run.cubed_or(default_cubed);
    let echo = EchoChild::spawn()?;
    let server = tokio::task::block_in_place(|| TestServer::start(&cubed))?;
    eprintln!(
        "echo on {}, cubed on {} ({} connections, {} in flight, {} B values, {} s + {} s warm-up per phase)",
        echo.addr,
        server.addr,
        args.connections,
        args.in_flight,
        args.value_bytes,
        args.run.seconds,
        args.run.warmup
    );
    let value = vec![0xA5u8; args.value_bytes];
    let echo_clients: Vec<_> = connect(&echo.addr.to_string(), args.connections)
        .await?
        .into_iter()
        .map(EchoClient::new)
        .collect();
    let secret = server.demo.secret()?;
    let signer = CallSigner::new(&server.demo.tenant, &server.demo.key_id, secret);
    let cube_clients: Vec<_> = connect(&server.addr.to_string(), args.connections)
        .await?
        .into_iter()
        .map(|ch| CellsClient::new(Signing::new(ch, signer.clone())))
        .collect();

    let mut rounds = Vec::new();
    for round in 1..=args.run.rounds {
        eprintln!("round {round}/{}", args.run.rounds);
        rounds.push(run_round(&args, &echo_clients, &cube_clients, &value).await);
    }
    println!(
        "| round | echo (write-shaped) calls/s | Cells.Write calls/s | Write ÷ echo | echo (read-shaped) calls/s | Cells.Read calls/s | Read ÷ echo |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    for (i, r) in rounds.iter().enumerate() {
        println!(
            "| {} | {:.0} | {:.0} | {:.0}% | {:.0} | {:.0} | {:.0}% |",
            i + 1,
            r[0].calls_per_sec,
            r[1].calls_per_sec,
            100.0 * r[1].calls_per_sec / r[0].calls_per_sec,
            r[2].calls_per_sec,
            r[3].calls_per_sec,
            100.0 * r[3].calls_per_sec / r[2].calls_per_sec
        );
    }
    let ratios = |f: &dyn Fn(&Vec<Phase>) -> f64| rounds.iter().map(f).collect::<Vec<_>>();
    let write_ratio = median(ratios(&|r| r[1].calls_per_sec / r[0].calls_per_sec));
    let read_ratio = median(ratios(&|r| r[3].calls_per_sec / r[2].calls_per_sec));
    println!();
    println!("Latency of the last round (µs):");
    println!();
    println!("| phase | p50 | p99 | max | errors |");
    println!("|---|---:|---:|---:|---:|");
    if let Some(last) = rounds.last() {
        for p in last {
            println!(
                "| {} | {} | {} | {} | {} |",
                p.name, p.p50_us, p.p99_us, p.max_us, p.errors
            );
        }
    }
    println!();
    println!(
        "Median of {} rounds — targets: durable Write ≥ 50% of echo → {:.0}%; Read ≥ 70% of echo → {:.0}%",
        rounds.len(),
        100.0 * write_ratio,
        100.0 * read_ratio
    );
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&rounds)?)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::median;

    #[test]
    fn the_median_of_an_even_count_is_between_the_middle_two() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0]), 2.5);
        assert_eq!(median(vec![5.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(Vec::new()).is_nan());
    }
}
