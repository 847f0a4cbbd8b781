//! Generated code for the public API, package `cube.v1` (see `proto/cube/v1/`).
//!
//! Nothing here is written by hand but the codec the generated services use (`codec.rs`):
//! change the `.proto` files, not this crate.

pub mod codec;

/// Messages and services of `cube.v1`.
#[allow(clippy::all, missing_docs, unreachable_pub)]
pub mod v1 {
    tonic::include_proto!("cube.v1");
}

/// Encoded `FileDescriptorSet` of `cube.v1`, for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/cube_v1_descriptor.bin"));
