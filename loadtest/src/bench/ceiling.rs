//! The ceiling: a trivial tonic echo service (`crate::echo`) driven exactly like Cube, a
//! write-shaped call (value-sized request, 16-byte reply) and a read-shaped one (16-byte
//! request, value-sized reply), with nothing behind it. No gRPC service beats it on this machine.

use std::sync::Arc;

use tonic::transport::Channel;

use super::driver::{CellKey, SingleCell, write_then_read};
use super::{Results, Settings};
use crate::echo::EchoChild;
use crate::echo::pb::EchoRequest;
use crate::echo::pb::echo_client::EchoClient;

pub const SYSTEM: &str = "echo";

struct EchoCell {
    client: EchoClient<Channel>,
    reply_bytes: u32,
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
    Ok(())
}
