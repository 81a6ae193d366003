//! Compiles `proto/grpc_service.proto` (the Open Inference Protocol's gRPC
//! service) and `proto/onnx_weights.proto` (the initializers of an ONNX
//! file) into Rust with a pure-Rust protobuf compiler (`protox`), so a build
//! needs no `protoc`. The generated modules are included by
//! `src/protocol/grpc.rs` and `src/runtime/weights.rs`; `model_config.proto`'s
//! descriptor set is written for `src/triton/` to read `config.pbtxt` with.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let descriptors = protox::compile(["grpc_service.proto", "onnx_weights.proto"], ["proto"])?;
    // Triton's model configuration schema, for reading `config.pbtxt` at run time.
    let config = protox::compile(["model_config.proto"], ["proto"])?;
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out.join("model_config.bin"),
        prost::Message::encode_to_vec(&config),
    )?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        // The client needs no transport of its own: tests bring a channel.
        .build_transport(false)
        // A request that is not valid protobuf is INVALID_ARGUMENT, not INTERNAL.
        .codec_path("crate::protocol::grpc::codec::Codec")
        // Raw tensor contents as `Bytes`: a request's input slices share the
        // decoded message buffer instead of each being copied out.
        .bytes(".inference.ModelInferRequest.raw_input_contents")
        .bytes(".inference.ModelInferResponse.raw_output_contents")
        // A model's weights are sliced out of the file's buffer, not copied.
        .bytes(".onnx.TensorProto.raw_data")
        .compile_fds(descriptors)?;
    Ok(())
}
