//! Compiles `proto/cube/v1/*.proto` with protox (pure Rust: no system `protoc` needed) and hands
//! the descriptors to tonic-prost-build. The encoded descriptor set is also written to OUT_DIR so
//! the gateway can serve gRPC reflection from exactly what was compiled.

use std::path::PathBuf;

use prost::Message;

const PROTO_ROOT: &str = "../../proto";
const FILES: &[&str] = &[
    "cube/v1/types.proto",
    "cube/v1/cells.proto",
    "cube/v1/access.proto",
    "cube/v1/tenant.proto",
    "cube/v1/auth.proto",
    "cube/v1/admin.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    println!("cargo:rerun-if-changed={PROTO_ROOT}");
    let fds = protox::compile(FILES, [PROTO_ROOT])?;
    std::fs::write(out.join("cube_v1_descriptor.bin"), fds.encode_to_vec())?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // A malformed request is INVALID_ARGUMENT, not tonic's INTERNAL (see src/codec.rs).
        .codec_path("crate::codec::CubeCodec")
        .compile_fds(fds)?;
    Ok(())
}
