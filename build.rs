//! Compiles `proto/grpc_service.proto` (the Open Inference Protocol's gRPC
//! service) into Rust with a pure-Rust protobuf compiler (`protox`), so a
//! build needs no `protoc`. The generated module is included by
//! `src/protocol/grpc.rs`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let descriptors = protox::compile(["grpc_service.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        // The client needs no transport of its own: tests bring a channel.
        .build_transport(false)
        // Raw tensor contents as `Bytes`: a request's input slices share the
        // decoded message buffer instead of each being copied out.
        .bytes(".inference.ModelInferRequest.raw_input_contents")
        .bytes(".inference.ModelInferResponse.raw_output_contents")
        .compile_fds(descriptors)?;
    Ok(())
}
