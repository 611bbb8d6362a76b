//! Compiles `proto/pipewise/v1/*.proto` with the vendored `protoc`, so a clean machine
//! needs nothing but cargo.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // The workspace denies unsafe code (and `std::env::set_var` is unsafe in edition 2024),
    // so the vendored protoc reaches prost-build through its config rather than `PROTOC`.
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    let protos = [
        "proto/pipewise/v1/common.proto",
        "proto/pipewise/v1/job.proto",
        "proto/pipewise/v1/cluster.proto",
        "proto/pipewise/v1/activation.proto",
    ];
    for proto in protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    let mut config = tonic_prost_build::Config::new();
    config.protoc_executable(protoc);
    config.bytes([
        ".pipewise.v1.TensorFrame.data",
        ".pipewise.v1.TensorFrame.run_secret",
    ]);
    tonic_prost_build::configure()
        .file_descriptor_set_path(out_dir.join("pipewise_descriptor.bin"))
        .compile_with_config(config, &protos, &["proto"])?;
    Ok(())
}
