//! Redis with `appendonly yes`, `appendfsync always` (a write is answered only after its AOF
//! write is fsynced; Redis fsyncs once per event-loop turn, so concurrent clients share a sync)
//! and no RDB snapshots, started here on a free loopback port with its data in the bench's
//! directory, driven by the tiny RESP client below: SET and GET for single cells, pipelined SETs
//! for the loads, SCAN + MGET for the full scan and MGET of the known keys for the range (Redis
//! keeps no key order).

use std::ops::Range;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::driver::{
    BatchWriter, CALL_TIMEOUT, CellKey, Rates, SCAN_TIMEOUT, ScanResult, SingleCell, bulk, load,
    within, write_then_read,
};
use super::process::{PeerProcess, free_port, on_free_ports, version};
use super::{Results, Settings, progress, remove_data};

pub const SYSTEM: &str = "Redis";
/// Bulk pipelines carry about this many bytes of values each.
const PIPELINE_BYTES: usize = 1 << 20;
const SCAN_LOAD_PIPELINE: u64 = 1_000;
const SCAN_LOAD_CLIENTS: usize = 16;
/// Keys asked per SCAN and per MGET.
const PAGE: usize = 1_000;
const READY_TIMEOUT: Duration = Duration::from_secs(30);
const READ_CHUNK: usize = 64 << 10;

/// One RESP2 reply.
#[derive(Debug, PartialEq)]
enum Reply {
    Simple(Vec<u8>),
    Error(String),
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Array(Option<Vec<Reply>>),
}

/// The line at the start of `buf` (without CRLF) and the bytes it takes with its CRLF.
fn line(buf: &[u8]) -> Option<(&[u8], usize)> {
    let end = buf.windows(2).position(|w| w == b"\r\n")?;
    Some((&buf[..end], end + 2))
}

fn number(s: &[u8]) -> anyhow::Result<i64> {
    std::str::from_utf8(s)?
        .parse()
        .with_context(|| format!("bad RESP number {:?}", String::from_utf8_lossy(s)))
}

/// One complete reply at the start of `buf` and its length, or None if more bytes are needed.
fn parse(buf: &[u8]) -> anyhow::Result<Option<(Reply, usize)>> {
    let Some((head, mut used)) = line(buf) else {
        return Ok(None);
    };
    let Some((&kind, rest)) = head.split_first() else {
        bail!("empty RESP line");
    };
    let reply = match kind {
        b'+' => Reply::Simple(rest.to_vec()),
        b'-' => Reply::Error(String::from_utf8_lossy(rest).into_owned()),
        b':' => Reply::Int(number(rest)?),
        b'$' => {
            let Ok(len) = usize::try_from(number(rest)?) else {
                return Ok(Some((Reply::Bulk(None), used)));
            };
            if buf.len() < used + len + 2 {
                return Ok(None);
            }
            let body = buf[used..used + len].to_vec();
            used += len + 2;
            Reply::Bulk(Some(body))
        }
        b'*' => {
            let Ok(count) = usize::try_from(number(rest)?) else {
                return Ok(Some((Reply::Array(None), used)));
            };
            let mut items = Vec::with_capacity(count.min(1 << 16));
            for _ in 0..count {
                let Some((item, n)) = parse(&buf[used..])? else {
                    return Ok(None);
                };
                items.push(item);
                used += n;
            }
            Reply::Array(Some(items))
        }
        other => bail!("unknown RESP type byte {other:#x}"),
    };
    Ok(Some((reply, used)))
}

/// A RESP connection: commands are queued with [`Resp::push`] and sent together with
/// [`Resp::flush`] (pipelining), replies read in order with [`Resp::reply`].
struct Resp {
    stream: TcpStream,
    rbuf: Vec<u8>,
    rpos: usize,
    wbuf: Vec<u8>,
}

impl Resp {
    async fn connect(port: u16) -> anyhow::Result<Resp> {
        let stream = TcpStream::connect(("127.0.0.1", port)).await?;
        stream.set_nodelay(true)?;
        Ok(Resp {
            stream,
            rbuf: Vec::with_capacity(READ_CHUNK),
            rpos: 0,
            wbuf: Vec::new(),
        })
    }

    fn push(&mut self, args: &[&[u8]]) {
        self.wbuf
            .extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
        for a in args {
            self.wbuf
                .extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            self.wbuf.extend_from_slice(a);
            self.wbuf.extend_from_slice(b"\r\n");
        }
    }

    async fn flush(&mut self) -> anyhow::Result<()> {
        self.stream.write_all(&self.wbuf).await?;
        self.wbuf.clear();
        Ok(())
    }

    async fn reply(&mut self) -> anyhow::Result<Reply> {
        loop {
            if let Some((reply, n)) = parse(&self.rbuf[self.rpos..])? {
                self.rpos += n;
                if self.rpos == self.rbuf.len() {
                    self.rbuf.clear();
                    self.rpos = 0;
                }
                return match reply {
                    Reply::Error(e) => Err(anyhow::anyhow!("Redis: {e}")),
                    r => Ok(r),
                };
            }
            if self.rpos > 0 {
                self.rbuf.drain(..self.rpos);
                self.rpos = 0;
            }
            self.rbuf.reserve(READ_CHUNK);
            if self.stream.read_buf(&mut self.rbuf).await? == 0 {
                bail!("Redis closed the connection");
            }
        }
    }

    async fn call(&mut self, args: &[&[u8]]) -> anyhow::Result<Reply> {
        self.push(args);
        self.flush().await?;
        self.reply().await
    }

    /// Read one reply per pipelined SET, each must be +OK.
    async fn expect_oks(&mut self, n: usize) -> anyhow::Result<()> {
        for _ in 0..n {
            match self.reply().await? {
                Reply::Simple(s) if s == b"OK" => {}
                other => bail!("SET answered {other:?}"),
            }
        }
        Ok(())
    }

    /// MGET `keys`: the values found.
    async fn mget_found(&mut self, keys: &[Vec<u8>]) -> anyhow::Result<u64> {
        let mut args: Vec<&[u8]> = Vec::with_capacity(keys.len() + 1);
        args.push(b"MGET");
        args.extend(keys.iter().map(Vec::as_slice));
        match self.call(&args).await? {
            Reply::Array(Some(items)) => Ok(items
                .iter()
                .filter(|r| matches!(r, Reply::Bulk(Some(_))))
                .count() as u64),
            other => bail!("MGET answered {other:?}"),
        }
    }
}

fn key(prefix: &str, i: u64) -> Vec<u8> {
    format!("{prefix}{i:010}").into_bytes()
}

fn cell_key(k: CellKey) -> Vec<u8> {
    key(&format!("c{:04}:", k.client), k.i)
}

struct RedisCell(Resp);

impl SingleCell for RedisCell {
    async fn write(&mut self, k: CellKey, value: &[u8]) -> anyhow::Result<()> {
        self.0.push(&[b"SET", &cell_key(k), value]);
        self.0.flush().await?;
        self.0.expect_oks(1).await
    }

    async fn read(&mut self, k: CellKey) -> anyhow::Result<()> {
        match self.0.call(&[b"GET", &cell_key(k)]).await? {
            Reply::Bulk(Some(_)) => Ok(()),
            Reply::Bulk(None) => bail!("key c{:04}:{:010} not found", k.client, k.i),
            other => bail!("GET answered {other:?}"),
        }
    }
}

/// Writes a batch as one pipeline of SETs (one send, then every reply).
struct RedisWriter {
    conn: Resp,
    prefix: &'static str,
    value: Arc<[u8]>,
}

impl BatchWriter for RedisWriter {
    async fn write_batch(&mut self, range: Range<u64>) -> anyhow::Result<()> {
        let n = (range.end - range.start) as usize;
        for i in range {
            self.conn.push(&[b"SET", &key(self.prefix, i), &self.value]);
        }
        self.conn.flush().await?;
        self.conn.expect_oks(n).await
    }
}

async fn connect(port: u16, n: usize) -> anyhow::Result<Vec<Resp>> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(Resp::connect(port).await?);
    }
    Ok(out)
}

pub async fn run(s: &Settings, root: &Path, out: &mut Results) -> anyhow::Result<()> {
    let Some(bin) = &s.redis_bin else {
        bail!("redis-server binary not resolved");
    };
    out.versions
        .push(("Redis".into(), version(bin, "--version")));
    let data = root.join("redis");
    std::fs::create_dir(&data)?;
    let result = measure(s, bin, root, &data, out).await;
    remove_data(&data);
    result
}

async fn start(bin: &Path, root: &Path, data: &Path) -> anyhow::Result<(PeerProcess, u16)> {
    let port = free_port()?;
    let mut cmd = Command::new(bin);
    cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--appendonly", "yes", "--appendfsync", "always"])
        .args(["--save", ""])
        .arg("--dir")
        .arg(data)
        .args(["--daemonize", "no"]);
    let mut process = PeerProcess::spawn("redis-server", cmd, root.join("redis.log"))?;
    process
        .wait_ready(READY_TIMEOUT, || async move {
            let mut c = Resp::connect(port).await?;
            match c.call(&[b"PING"]).await? {
                Reply::Simple(s) if s == b"PONG" => Ok(()),
                other => bail!("PING answered {other:?}"),
            }
        })
        .await?;
    let mut c = Resp::connect(port).await?;
    for (name, want) in [("appendonly", "yes"), ("appendfsync", "always")] {
        let got = match c.call(&[b"CONFIG", b"GET", name.as_bytes()]).await? {
            Reply::Array(Some(mut v)) if v.len() == 2 => match v.pop() {
                Some(Reply::Bulk(Some(b))) => String::from_utf8_lossy(&b).into_owned(),
                other => format!("{other:?}"),
            },
            other => format!("{other:?}"),
        };
        if got != want {
            bail!("redis-server runs with {name} {got}, not {want}");
        }
    }
    Ok((process, port))
}

async fn measure(
    s: &Settings,
    bin: &Path,
    root: &Path,
    data: &Path,
    out: &mut Results,
) -> anyhow::Result<()> {
    let (mut process, port) =
        on_free_ports("redis-server", || {}, || start(bin, root, data)).await?;

    // Single cells.
    let value: Arc<[u8]> = vec![0xA5; s.value_bytes].into();
    for &n in &s.clients {
        let clients = connect(port, n).await?.into_iter().map(RedisCell).collect();
        write_then_read(SYSTEM, clients, s.window, &value, &mut out.single).await;
        process.check_alive()?;
    }

    // Bulk: pipelined SETs from many connections, appendfsync always still on.
    let bulk_value: Arc<[u8]> = vec![0x5A; s.bulk_value_bytes].into();
    let depth = (PIPELINE_BYTES / s.bulk_value_bytes).max(1) as u64;
    let writers = connect(port, s.bulk_clients)
        .await?
        .into_iter()
        .map(|conn| RedisWriter {
            conn,
            prefix: "b:",
            value: Arc::clone(&bulk_value),
        })
        .collect();
    let method = format!(
        "{} connections, pipelines of {depth} SETs of {} KiB",
        s.bulk_clients,
        s.bulk_value_bytes >> 10
    );
    let loaded = bulk(
        SYSTEM,
        method,
        writers,
        s.bulk_bytes,
        s.bulk_value_bytes,
        depth,
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e:#}; redis log:\n{}", process.log_tail()))?;
    out.bulk.push(loaded);

    // Scans, over a keyspace holding the grid only (Cube and SQLite scan a fresh tenant or
    // database; etcd a fresh prefix of the store that also holds its bulk load, which a range
    // over the prefix does not walk): SCAN would otherwise also walk the single-cell and bulk
    // keys.
    let mut c = Resp::connect(port).await?;
    match c.call(&[b"FLUSHALL"]).await? {
        Reply::Simple(ok) if ok == b"OK" => {}
        other => anyhow::bail!("FLUSHALL answered {other:?}"),
    }
    let grid = s.scan_grid();
    let writers = connect(port, SCAN_LOAD_CLIENTS)
        .await?
        .into_iter()
        .map(|conn| RedisWriter {
            conn,
            prefix: "s:",
            value: Arc::clone(&value),
        })
        .collect();
    let t = Instant::now();
    load(
        "Redis scan load",
        writers,
        grid.cells,
        SCAN_LOAD_PIPELINE,
        1,
    )
    .await?;
    let load_seconds = t.elapsed().as_secs_f64();
    let (mut full, mut part) = (Rates::default(), Rates::default());
    for _ in 0..s.scan_rounds {
        let bar = progress::rows("Redis SCAN+MGET", grid.cells);
        let t = Instant::now();
        let n = within(SCAN_TIMEOUT, "Redis SCAN+MGET", scan_all(&mut c, &bar)).await?;
        full.push("Redis SCAN+MGET", n, grid.cells, t.elapsed())?;
        bar.finish_and_clear();
        let bar = progress::rows("Redis MGET (1%)", grid.box_rows);
        let t = Instant::now();
        let mut n = 0;
        let mut from = 0;
        while from < grid.box_rows {
            let to = (from + PAGE as u64).min(grid.box_rows);
            let keys: Vec<_> = (from..to).map(|i| key("s:", i)).collect();
            let found = within(CALL_TIMEOUT, "Redis MGET", c.mget_found(&keys)).await?;
            n += found;
            bar.inc(found);
            from = to;
        }
        part.push("Redis MGET (1%)", n, grid.box_rows, t.elapsed())?;
        bar.finish_and_clear();
    }
    out.scans.push(ScanResult::new(
        SYSTEM,
        format!(
            "SCAN MATCH s:* COUNT {PAGE} + MGET of each batch; MGET of the {} keys of the range, {PAGE} per call (no ordered range in Redis)",
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

/// Every value under prefix s:, SCAN batch by batch, each batch fetched with MGET.
async fn scan_all(c: &mut Resp, bar: &indicatif::ProgressBar) -> anyhow::Result<u64> {
    let mut cursor = b"0".to_vec();
    let mut n = 0;
    let count = PAGE.to_string();
    loop {
        let reply = c
            .call(&[
                b"SCAN",
                &cursor,
                b"MATCH",
                b"s:*",
                b"COUNT",
                count.as_bytes(),
            ])
            .await?;
        let Reply::Array(Some(mut parts)) = reply else {
            bail!("SCAN answered {reply:?}");
        };
        let (Some(Reply::Array(Some(keys))), Some(Reply::Bulk(Some(next)))) =
            (parts.pop(), parts.pop())
        else {
            bail!("SCAN answered an unexpected shape");
        };
        let keys: Vec<Vec<u8>> = keys
            .into_iter()
            .filter_map(|k| match k {
                Reply::Bulk(Some(k)) => Some(k),
                _ => None,
            })
            .collect();
        if !keys.is_empty() {
            let found = c.mget_found(&keys).await?;
            n += found;
            bar.inc(found);
        }
        if next == b"0" {
            return Ok(n);
        }
        cursor = next;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resp_replies_parse_whole_or_ask_for_more() {
        assert_eq!(
            parse(b"+OK\r\n").unwrap(),
            Some((Reply::Simple(b"OK".to_vec()), 5))
        );
        assert_eq!(
            parse(b"$3\r\nabc\r\n").unwrap(),
            Some((Reply::Bulk(Some(b"abc".to_vec())), 9))
        );
        assert_eq!(parse(b"$-1\r\n").unwrap(), Some((Reply::Bulk(None), 5)));
        assert_eq!(parse(b"$3\r\nab").unwrap(), None);
        assert_eq!(parse(b"*2\r\n$1\r\na\r\n").unwrap(), None);
        let scan = b"*2\r\n$1\r\n0\r\n*2\r\n$1\r\na\r\n$-1\r\n";
        assert_eq!(
            parse(scan).unwrap(),
            Some((
                Reply::Array(Some(vec![
                    Reply::Bulk(Some(b"0".to_vec())),
                    Reply::Array(Some(vec![
                        Reply::Bulk(Some(b"a".to_vec())),
                        Reply::Bulk(None)
                    ])),
                ])),
                scan.len()
            ))
        );
        assert_eq!(parse(b":42\r\n").unwrap(), Some((Reply::Int(42), 5)));
        assert!(parse(b"?x\r\n").is_err());
    }
}
