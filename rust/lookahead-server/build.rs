//! Generates the gRPC code and the descriptor set (for server reflection) from
//! `proto/lookahead/v1/lookahead.proto`, and the cluster messages from
//! `proto/lookahead/cluster/v1/cluster.proto`, with protox: no system `protoc` is needed.

use std::path::PathBuf;

use prost::Message;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let proto_root = manifest_dir.join("../../proto");
    let proto_file = proto_root.join("lookahead/v1/lookahead.proto");
    let cluster_file = proto_root.join("lookahead/cluster/v1/cluster.proto");
    println!("cargo:rerun-if-changed={}", proto_file.display());
    println!("cargo:rerun-if-changed={}", cluster_file.display());
    println!("cargo:rerun-if-changed=build.rs");

    let fds = protox::compile([&proto_file], [&proto_root])?;
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out_dir.join("lookahead_descriptor.bin"),
        fds.encode_to_vec(),
    )?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)?;
    // The cluster messages travel over NATS, not gRPC: messages only.
    let cluster = protox::compile([&cluster_file], [&proto_root])?;
    tonic_prost_build::configure()
        .build_server(false)
        .build_client(false)
        .compile_fds(cluster)?;
    Ok(())
}
