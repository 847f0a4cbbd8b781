//! The echo baseline server and its child-process handle.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};

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
    child: Child,
    registered: Option<cube_testkit::interrupt::Registered>,
    pub addr: SocketAddr,
}

impl EchoChild {
    pub fn spawn() -> anyhow::Result<EchoChild> {
        let child = Command::new(std::env::current_exe()?)
            .args(["echo-server", "--listen", "127.0.0.1:0"])
            .stdout(Stdio::piped())
            .stdin(Stdio::null())
            .spawn()?;
        // Owned (killed on drop) before anything below can fail.
        let mut echo = EchoChild {
            registered: Some(cube_testkit::interrupt::process(child.id())),
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        };
        let stdout = echo.child.stdout.take().context("no stdout")?;
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line)?;
        echo.addr = line
            .trim()
            .strip_prefix(READY)
            .context("echo server did not start")?
            .parse()?;
        Ok(echo)
    }
}

impl Drop for EchoChild {
    fn drop(&mut self) {
        self.registered = None;
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
