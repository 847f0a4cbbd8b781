//! The echo baseline server and its child-process handle.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Command, Stdio};

use anyhow::Context;
use tonic::{Request, Response, Status};

pub mod pb {
    tonic::include_proto!("cube.bench.v1");
}

use pb::echo_server::{Echo, EchoServer};
use pb::{EchoRequest, EchoResponse};

const READY: &str = "echo ready: ";

struct EchoService {
    /// Reply bytes are cut from here, so the server does no per-call allocation beyond tonic's.
    source: Vec<u8>,
}

#[tonic::async_trait]
impl Echo for EchoService {
    async fn echo(&self, req: Request<EchoRequest>) -> Result<Response<EchoResponse>, Status> {
        let n = (req.get_ref().reply_bytes as usize).min(self.source.len());
        Ok(Response::new(EchoResponse {
            payload: self.source[..n].to_vec(),
        }))
    }
}

pub async fn serve(listen: SocketAddr) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(listen).await?;
    println!("{READY}{}", listener.local_addr()?);
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    let incoming = tokio_stream::StreamExt::map(incoming, |c| {
        c.inspect(|s| {
            let _ = s.set_nodelay(true);
        })
    });
    tonic::transport::Server::builder()
        .max_concurrent_streams(Some(1024))
        .add_service(EchoServer::new(EchoService {
            source: vec![0x42; 1 << 20],
        }))
        .serve_with_incoming(incoming)
        .await?;
    Ok(())
}

/// The echo server as a child process, killed on drop.
pub struct EchoChild {
    /// Held to be killed and reaped on drop.
    _child: cube_testkit::interrupt::ChildProcess,
    pub addr: SocketAddr,
}

impl EchoChild {
    pub fn spawn() -> anyhow::Result<EchoChild> {
        // Owned (killed on drop) before anything below can fail.
        let mut child = cube_testkit::interrupt::ChildProcess::spawn(
            Command::new(std::env::current_exe()?)
                .args(["echo-server", "--listen", "127.0.0.1:0"])
                .stdout(Stdio::piped())
                .stdin(Stdio::null()),
        )?;
        let stdout = child.take_stdout().context("no stdout")?;
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line)?;
        let addr = line
            .trim()
            .strip_prefix(READY)
            .context("echo server did not start")?
            .parse()?;
        Ok(EchoChild {
            _child: child,
            addr,
        })
    }
}
