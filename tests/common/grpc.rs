//! Helpers of the gRPC tests: a client of the generated
//! `GRPCInferenceService` connected to a test server, and FP32 requests.

use sluice::protocol::grpc::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
use sluice::protocol::grpc::inference::model_infer_request::InferInputTensor;
use sluice::protocol::grpc::inference::ModelInferRequest;
use tonic::transport::Channel;

use super::TestServer;

/// A client over a real HTTP/2 connection to `s`'s gRPC port.
pub async fn client(s: &TestServer) -> GrpcInferenceServiceClient<Channel> {
    let channel = Channel::from_shared(format!("http://{}", s.grpc_addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    GrpcInferenceServiceClient::new(channel)
}

/// Little-endian bytes of `v` (raw_input_contents).
pub fn f32_raw(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// A ModelInfer request with one FP32 input as raw contents.
pub fn infer_request(model: &str, input: &str, shape: &[i64], values: &[f32]) -> ModelInferRequest {
    ModelInferRequest {
        model_name: model.into(),
        id: "r1".into(),
        inputs: vec![InferInputTensor {
            name: input.into(),
            datatype: "FP32".into(),
            shape: shape.to_vec(),
            ..Default::default()
        }],
        raw_input_contents: vec![f32_raw(values).into()],
        ..Default::default()
    }
}
