//! The ceiling: a trivial tonic echo service (`crate::echo`) driven exactly like Cube, a
//! write-shaped call (value-sized request, 16-byte reply) and a read-shaped one (16-byte
//! request, value-sized reply), with nothing behind it. No gRPC service beats it on this machine.
//! Its bulk load sends the bulk values exactly as Cube's does (one value per call from every
//! writer at once) and drops them: what moving the bytes through gRPC alone costs.

use std::ops::Range;
use std::sync::Arc;

use tonic::transport::Channel;

use super::driver::{BatchWriter, CellKey, SingleCell, bulk, write_then_read};
use super::{Results, Settings};
use crate::echo::EchoChild;
use crate::echo::pb::EchoRequest;
use crate::echo::pb::echo_client::EchoClient;

pub const SYSTEM: &str = "echo";

pub struct EchoCell {
    client: EchoClient<Channel>,
    reply_bytes: u32,
}

/// One client of `echo` (its own connection) whose read-shaped calls ask for `value_bytes`.
pub async fn read_client(echo: &EchoChild, value_bytes: usize) -> anyhow::Result<EchoCell> {
    let ch = crate::drive::connect(&echo.addr.to_string(), 1).await?;
    Ok(EchoCell {
        client: EchoClient::new(ch.into_iter().next().expect("one connection")),
        reply_bytes: value_bytes as u32,
    })
}

impl SingleCell for EchoCell {
    async fn write(&mut self, _key: CellKey, value: &[u8]) -> anyhow::Result<()> {
        self.client
            .echo(EchoRequest {
                payload: value.to_vec(),
                reply_bytes: 16,
            })
            .await?;
        Ok(())
    }

    async fn read(&mut self, _key: CellKey) -> anyhow::Result<()> {
        self.client
            .echo(EchoRequest {
                payload: vec![0; 16],
                reply_bytes: self.reply_bytes,
            })
            .await?;
        Ok(())
    }
}

struct EchoWriter {
    client: EchoClient<Channel>,
    value: Arc<[u8]>,
}

impl BatchWriter for EchoWriter {
    async fn write_batch(&mut self, range: Range<u64>) -> anyhow::Result<()> {
        for _ in range {
            self.client
                .echo(EchoRequest {
                    payload: self.value.to_vec(),
                    reply_bytes: 16,
                })
                .await?;
        }
        Ok(())
    }
}

pub async fn run(s: &Settings, out: &mut Results) -> anyhow::Result<()> {
    let echo = EchoChild::spawn()?;
    let value: Arc<[u8]> = vec![0xA5; s.value_bytes].into();
    for &n in &s.clients {
        let mut clients = Vec::with_capacity(n);
        for ch in crate::drive::connect(&echo.addr.to_string(), n).await? {
            clients.push(EchoCell {
                client: EchoClient::new(ch),
                reply_bytes: s.value_bytes as u32,
            });
        }
        write_then_read(SYSTEM, clients, s.window, &value, &mut out.single).await;
    }

    // Bulk: Cube's bulk load's calls, with nothing behind them.
    let bulk_value: Arc<[u8]> = vec![0x5A; s.bulk_value_bytes].into();
    let writers = crate::drive::connect(&echo.addr.to_string(), s.bulk_clients)
        .await?
        .into_iter()
        .map(|ch| EchoWriter {
            client: EchoClient::new(ch),
            value: Arc::clone(&bulk_value),
        })
        .collect();
    let method = format!(
        "{} connections, one {} KiB call per value, dropped (the gRPC ceiling)",
        s.bulk_clients,
        s.bulk_value_bytes >> 10
    );
    out.bulk
        .push(bulk(SYSTEM, method, writers, s.bulk_bytes, s.bulk_value_bytes, 1).await?);
    Ok(())
}
