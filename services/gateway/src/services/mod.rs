//! One file per gRPC service.

pub(crate) mod access;
pub(crate) mod admin;
pub(crate) mod cells;
pub(crate) mod handshake;
pub(crate) mod tenant;
