//! Compiles the echo baseline's proto and the subset of etcd's KV API that `cube-load bench`
//! calls, with protox (no system protoc).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let fds = protox::compile(["echo.proto", "etcd/rpc.proto"], ["proto"])?;
    tonic_prost_build::configure().compile_fds(fds)?;
    Ok(())
}
