//! cube-gateway: the gRPC face of Cube.
//!
//! Owns the tonic services, the per-call auth layer (verified before any handler runs), the
//! conversion of proto messages into store commands, and the one mapping of errors to gRPC
//! status codes. Business rules live in cube-store; this crate only validates and routes.

mod abuse;
mod auth_layer;
mod connection;
mod convert;
mod error;
mod oversize;
mod principal;
mod receive;
mod replay;
mod replay_clock;
mod rpc_metrics;
mod send;
mod server;
mod services;
mod tls;
mod transport;

pub use abuse::{FailureLimiter, FailureLimits};
pub use auth_layer::{AuthLayer, AuthMode, Authenticator};
pub use connection::{ConnInfo, ConnectionRegistry, CubeConn, Session};
pub use error::ApiError;
pub use principal::{AuthModel, Principal};
pub use receive::OPEN_CALLS_PER_CONNECTION;
pub use replay::{ReplayCache, ReplayError};
pub use send::{MIN_CONNECTION_SEND_BYTES, RUN_ANSWER_OVERHEAD};
pub use server::{
    ACCESS_MESSAGE_BYTES, Gateway, GatewayConfig, MAX_LOCAL_ERROR_RESETS, OPEN_MESSAGE_BYTES,
    ServeError, WALK_MESSAGE_BYTES, min_connection_receive_bytes,
};
pub use services::cells::{NEXT_PAGE_TOKEN_HEADER, ScanLimits};
pub use tls::{TlsError, TlsSettings, client_identity, server_config};
pub use transport::{AddressCounts, AddressSlot, WarnEvery};
