//! etcd, single node, started here on free loopback ports with its data in the bench's
//! directory, over its gRPC KV API (`proto/etcd/rpc.proto`, a subset of etcd's): Put and
//! linearizable Range (the default, `serializable=false`) for single cells, then the same cells
//! read with serializable Ranges (on one node they see every acknowledged Put too, the
//! guarantee Cube's Read gives), Txn of many Puts for the loads, Range paged with a limit for
//! the scans.

use std::ops::Range;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::bail;
use indicatif::ProgressBar;
use tonic::transport::{Channel, Endpoint};

use super::driver::{
    BatchWriter, CellKey, Op, Rates, SCAN_TIMEOUT, ScanResult, SingleCell, bulk, closed_loop, load,
    within, write_then_read,
};
use super::process::{PeerProcess, free_port, on_free_ports, version};
use super::{Results, Settings, progress, remove_data};

pub mod pb {
    tonic::include_proto!("etcdserverpb");
}

use pb::kv_client::KvClient;
use pb::request_op::Request;
use pb::{PutRequest, RangeRequest, RequestOp, TxnRequest};

pub const SYSTEM: &str = "etcd";
/// The second read phase: serializable Ranges.
pub const SYSTEM_SERIALIZABLE: &str = "etcd serializable";
/// etcd's default backend quota is 2 GiB; a 1 GiB bulk load plus MVCC overhead needs more.
/// 8 GiB is the largest etcd recommends.
const QUOTA_BACKEND_BYTES: u64 = 8 << 30;
/// etcd refuses requests over 1.5 MiB (`--max-request-bytes`) and Txns of over 128 operations
/// (`--max-txn-ops`); bulk Txns stay under both.
const TXN_BYTES: usize = 1_400_000;
const MAX_TXN_OPS: usize = 128;
/// Keys per Range page at most; fewer for large values ([`page_for`]).
const PAGE: i64 = 10_000;
/// What one Range page may hold, well inside the client's 64 MiB decoding limit.
const PAGE_BYTES: usize = 32 << 20;

/// Keys per Range page for values of `value_bytes`: pages of 10,000 keys of 8 KiB values came
/// to ~82 MB, which the client refused to decode, failing etcd's scans.
fn page_for(value_bytes: usize) -> i64 {
    i64::try_from(PAGE_BYTES / (value_bytes + 64))
        .unwrap_or(PAGE)
        .clamp(1, PAGE)
}
const SCAN_LOAD_CLIENTS: usize = 16;
const READY_TIMEOUT: Duration = Duration::from_secs(30);

type Kv = KvClient<Channel>;

/// `prefix` followed by `i`, zero-padded so key order is numeric order.
fn key(prefix: &str, i: u64) -> Vec<u8> {
    format!("{prefix}{i:010}").into_bytes()
}

fn cell_key(k: CellKey) -> Vec<u8> {
    key(&format!("c{:04}/", k.client), k.i)
}

struct EtcdCell {
    kv: Kv,
    serializable: bool,
}

impl SingleCell for EtcdCell {
    async fn write(&mut self, k: CellKey, value: &[u8]) -> anyhow::Result<()> {
        self.kv
            .put(PutRequest {
                key: cell_key(k),
                value: value.to_vec(),
                ..Default::default()
            })
            .await?;
        Ok(())
    }

    async fn read(&mut self, k: CellKey) -> anyhow::Result<()> {
        let r = self
            .kv
            .range(RangeRequest {
                key: cell_key(k),
                serializable: self.serializable,
                ..Default::default()
            })
            .await?
            .into_inner();
        if r.kvs.is_empty() {
            bail!("key c{:04}/{:010} not found", k.client, k.i);
        }
        Ok(())
    }
}

/// Writes items as Puts inside one Txn per batch.
struct EtcdWriter {
    kv: Kv,
    prefix: &'static str,
    value: Arc<[u8]>,
}

impl BatchWriter for EtcdWriter {
    async fn write_batch(&mut self, range: Range<u64>) -> anyhow::Result<()> {
        let success = range
            .map(|i| RequestOp {
                request: Some(Request::RequestPut(PutRequest {
                    key: key(self.prefix, i),
                    value: self.value.to_vec(),
                    ..Default::default()
                })),
            })
            .collect();
        self.kv
            .txn(TxnRequest {
                success,
                failure: Vec::new(),
            })
            .await?;
        Ok(())
    }
}

async fn connect(endpoint: &str, n: usize) -> anyhow::Result<Vec<Kv>> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let ch = Endpoint::from_shared(endpoint.to_string())?
            .tcp_nodelay(true)
            .connect()
            .await?;
        out.push(KvClient::new(ch).max_decoding_message_size(64 << 20));
    }
    Ok(out)
}

pub async fn run(s: &Settings, root: &Path, out: &mut Results) -> anyhow::Result<()> {
    let Some(bin) = &s.etcd_bin else {
        bail!("etcd binary not resolved");
    };
    out.versions
        .push(("etcd".into(), version(bin, "--version")));
    let data = root.join("etcd");
    let result = measure(s, bin, root, &data, out).await;
    remove_data(&data);
    result
}

/// Start etcd and wait until a linearizable Range answers (it has elected itself leader).
async fn start(bin: &Path, root: &Path, data: &Path) -> anyhow::Result<(PeerProcess, String)> {
    let client_port = free_port()?;
    let mut peer_port = free_port()?;
    while peer_port == client_port {
        peer_port = free_port()?;
    }
    let client = format!("http://127.0.0.1:{client_port}");
    let peer = format!("http://127.0.0.1:{peer_port}");
    let mut cmd = Command::new(bin);
    // Only the flags below: an ETCD_* variable in the caller's environment (ETCD_UNSAFE_NO_FSYNC,
    // say) would change the peer being compared.
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("ETCD_") {
            cmd.env_remove(name);
        }
    }
    cmd.args(["--name", "default", "--data-dir"])
        .arg(data)
        .args(["--listen-client-urls", &client])
        .args(["--advertise-client-urls", &client])
        .args(["--listen-peer-urls", &peer])
        .args(["--initial-advertise-peer-urls", &peer])
        .args(["--initial-cluster", &format!("default={peer}")])
        .args(["--quota-backend-bytes", &QUOTA_BACKEND_BYTES.to_string()]);
    let mut process = PeerProcess::spawn("etcd", cmd, root.join("etcd.log"))?;
    process
        .wait_ready(READY_TIMEOUT, || {
            let client = client.clone();
            async move {
                let mut kv = connect(&client, 1).await?.remove(0);
                kv.range(RangeRequest {
                    key: b"ready".to_vec(),
                    ..Default::default()
                })
                .await?;
                Ok(())
            }
        })
        .await?;
    Ok((process, client))
}

async fn measure(
    s: &Settings,
    bin: &Path,
    root: &Path,
    data: &Path,
    out: &mut Results,
) -> anyhow::Result<()> {
    let (mut process, endpoint) =
        on_free_ports("etcd", || remove_data(data), || start(bin, root, data)).await?;

    // Single cells.
    let value: Arc<[u8]> = vec![0xA5; s.value_bytes].into();
    for &n in &s.clients {
        let clients = connect(&endpoint, n)
            .await?
            .into_iter()
            .map(|kv| EtcdCell {
                kv,
                serializable: false,
            })
            .collect();
        let mut conns = write_then_read(SYSTEM, clients, s.window, &value, &mut out.single).await;
        // The same cells again, read serializably.
        for c in &mut conns {
            c.client.serializable = true;
        }
        let (_, r) = closed_loop(
            SYSTEM_SERIALIZABLE,
            Op::Read,
            conns,
            s.window,
            Arc::clone(&value),
        )
        .await;
        out.single.push(r);
        process.check_alive()?;
    }

    // Bulk: Txns of Puts, under the request-size and operation limits, from many clients.
    let bulk_value: Arc<[u8]> = vec![0x5A; s.bulk_value_bytes].into();
    let per_txn = (TXN_BYTES / (s.bulk_value_bytes + 64)).clamp(1, MAX_TXN_OPS) as u64;
    let writers = connect(&endpoint, s.bulk_clients)
        .await?
        .into_iter()
        .map(|kv| EtcdWriter {
            kv,
            prefix: "b/",
            value: Arc::clone(&bulk_value),
        })
        .collect();
    let method = format!(
        "{} clients, Txn of {per_txn} Puts of {} KiB",
        s.bulk_clients,
        s.bulk_value_bytes >> 10
    );
    let loaded = bulk(
        SYSTEM,
        method,
        writers,
        s.bulk_bytes,
        s.bulk_value_bytes,
        per_txn,
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e:#}; etcd log:\n{}", process.log_tail()))?;
    out.bulk.push(loaded);

    // Scans.
    let grid = s.scan_grid();
    let per_txn = MAX_TXN_OPS.min(TXN_BYTES / (s.value_bytes + 64)).max(1) as u64;
    let writers = connect(&endpoint, SCAN_LOAD_CLIENTS)
        .await?
        .into_iter()
        .map(|kv| EtcdWriter {
            kv,
            prefix: "s/",
            value: Arc::clone(&value),
        })
        .collect();
    let t = Instant::now();
    load("etcd scan load", writers, grid.cells, per_txn, 1).await?;
    let load_seconds = t.elapsed().as_secs_f64();
    let mut kv = connect(&endpoint, 1).await?.remove(0);
    let page = page_for(s.value_bytes);
    let (mut full, mut part) = (Rates::default(), Rates::default());
    for _ in 0..s.scan_rounds {
        let bar = progress::rows("etcd Range (all)", grid.cells);
        let t = Instant::now();
        let n = within(
            SCAN_TIMEOUT,
            "etcd Range (all)",
            range_count(&mut kv, b"s/".to_vec(), b"s0".to_vec(), page, &bar),
        )
        .await?;
        full.push("etcd Range (all)", n, grid.cells, t.elapsed())?;
        bar.finish_and_clear();
        let bar = progress::rows("etcd Range (1%)", grid.box_rows);
        let t = Instant::now();
        let n = within(
            SCAN_TIMEOUT,
            "etcd Range (1%)",
            range_count(&mut kv, key("s/", 0), key("s/", grid.box_rows), page, &bar),
        )
        .await?;
        part.push("etcd Range (1%)", n, grid.box_rows, t.elapsed())?;
        bar.finish_and_clear();
    }
    out.scans.push(ScanResult::new(
        SYSTEM,
        format!(
            "linearizable Range over the prefix s/ and over [s/0, s/{}), pages of {page}",
            grid.box_rows
        ),
        load_seconds,
        full,
        part,
    ));
    process.check_alive()?;
    drop(process);
    Ok(())
}

/// Keys in [key, end), paged: each page continues just after the last key returned.
async fn range_count(
    kv: &mut Kv,
    mut key: Vec<u8>,
    end: Vec<u8>,
    page: i64,
    bar: &ProgressBar,
) -> anyhow::Result<u64> {
    let mut n = 0u64;
    loop {
        let r = kv
            .range(RangeRequest {
                key,
                range_end: end.clone(),
                limit: page,
                ..Default::default()
            })
            .await?
            .into_inner();
        n += r.kvs.len() as u64;
        bar.inc(r.kvs.len() as u64);
        match r.kvs.last() {
            Some(last) if r.more => {
                key = last.key.clone();
                key.push(0);
            }
            _ => return Ok(n),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A page of large values stays within what the client decodes; small ones keep 10,000.
    #[test]
    fn range_pages_fit_the_clients_decoding_limit() {
        assert_eq!(page_for(100), PAGE);
        for value_bytes in [8192, 1 << 20, 64 << 20] {
            let page = page_for(value_bytes);
            assert!(page >= 1, "{value_bytes}");
            assert!(
                page as usize * (value_bytes + 64) <= PAGE_BYTES.max(value_bytes + 64),
                "{value_bytes}: {page}"
            );
        }
        assert_eq!(page_for(8192), 4064);
    }
}
