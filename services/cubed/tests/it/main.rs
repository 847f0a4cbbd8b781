//! Integration tests against the real `cubed` binary on port 0: one test binary, so the suite
//! links once.

// Test helpers outside #[test] fns: a panic here is a failed assertion with a backtrace.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod access;
mod admin;
mod audit;
mod auth;
mod checkpoint;
mod crash;
mod datamodel;
mod handshake;
mod limits;
mod metrics;
mod tls;

use std::path::Path;

use cube_api::v1::{Coord, ReadRequest, WriteRequest};

pub fn cubed() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_cubed"))
}

pub fn coord(x: i32, y: i32, z: i32) -> Option<Coord> {
    Some(Coord { x, y, z })
}

pub fn write(x: i32, y: i32, z: i32, value: &[u8]) -> WriteRequest {
    WriteRequest {
        coord: coord(x, y, z),
        value: value.to_vec(),
        expected_version: None,
    }
}

pub fn read(x: i32, y: i32, z: i32) -> ReadRequest {
    ReadRequest {
        coord: coord(x, y, z),
    }
}

/// `cubed tenant durability demo ARGS...` (through the admin socket while the server runs, on
/// the data directory while it is stopped): the command's output.
pub fn set_demo_durability(
    server: &cube_testkit::TestServer,
    args: &[&str],
) -> std::process::Output {
    let mut all = vec!["tenant", "durability", "demo"];
    all.extend_from_slice(args);
    server.cli(&all).unwrap()
}

/// The `demo` tenant's totals from `Tenant.Stats`.
pub async fn totals(server: &cube_testkit::TestServer) -> cube_api::v1::TenantTotals {
    totals_of(server, &server.demo).await
}

/// The totals of the tenant of `creds` from `Tenant.Stats`.
pub async fn totals_of(
    server: &cube_testkit::TestServer,
    creds: &cube_auth::Credentials,
) -> cube_api::v1::TenantTotals {
    let mut t = cube_api::v1::tenant_client::TenantClient::new(server.signed(creds).await.unwrap());
    t.stats(cube_api::v1::StatsRequest { coord: None })
        .await
        .unwrap()
        .into_inner()
        .totals
        .unwrap()
}

/// Send `server` SIGTERM without waiting for it.
pub fn signal_term(server: &cube_testkit::TestServer) {
    use nix::sys::signal::{Signal, kill};
    let pid = nix::unistd::Pid::from_raw(server.pid().unwrap() as i32);
    kill(pid, Signal::SIGTERM).unwrap();
}

/// Watch the whole server's health (the empty service name) on `channel`, a connection of its
/// own; the stream, after its first answer (SERVING).
pub async fn watch_health(
    channel: tonic::transport::Channel,
) -> tonic::Streaming<tonic_health::pb::HealthCheckResponse> {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    let mut watch = HealthClient::new(channel)
        .watch(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    let first = watch.message().await.unwrap().unwrap();
    assert_eq!(first.status(), ServingStatus::Serving);
    watch
}
