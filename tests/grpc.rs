//! The gRPC port against a real server, through the client generated from
//! sluice's own proto: every RPC, errors with the right status codes
//! (INVALID_ARGUMENT, NOT_FOUND, UNAVAILABLE for a full queue,
//! DEADLINE_EXCEEDED, UNIMPLEMENTED), and requests from every protocol path
//! (V1 JSON, V2 JSON, V2 binary, gRPC) sharing one batch.

mod common;

use std::time::Duration;

use common::grpc::{client, f32_raw, infer_request};
use common::*;
use serde_json::{json, Value};
use sluice::protocol::grpc::inference::*;
use tonic::Code;

#[tokio::test]
async fn every_rpc_answers() {
    let repo = repo_with(&["digits", "mlp"]);
    let s = TestServer::start(repo.path()).await;
    let mut c = client(&s).await;
    assert!(
        c.server_live(ServerLiveRequest {})
            .await
            .unwrap()
            .into_inner()
            .live
    );
    assert!(
        c.server_ready(ServerReadyRequest {})
            .await
            .unwrap()
            .into_inner()
            .ready
    );
    let ready = |name: &str| ModelReadyRequest {
        name: name.into(),
        version: String::new(),
    };
    assert!(c.model_ready(ready("digits")).await.unwrap().into_inner().ready);
    // A model or version that is not served is `ready: false`, as Triton
    // answers (tritonclient's is_model_ready returns False, not raises).
    assert!(!c.model_ready(ready("nope")).await.unwrap().into_inner().ready);
    let v9 = ModelReadyRequest {
        name: "digits".into(),
        version: "9".into(),
    };
    assert!(!c.model_ready(v9).await.unwrap().into_inner().ready);
    let meta = c
        .server_metadata(ServerMetadataRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(meta.name, "sluice");
    assert!(meta.extensions.contains(&"binary_tensor_data".to_string()));

    let m = c
        .model_metadata(ModelMetadataRequest {
            name: "digits".into(),
            version: "1".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(m.versions, vec!["1"]);
    assert_eq!(m.inputs[0].shape, vec![-1, 64]);
    assert_eq!(m.outputs.len(), 2);

    let config = c
        .model_config(ModelConfigRequest {
            name: "mlp".into(),
            version: String::new(),
        })
        .await
        .unwrap()
        .into_inner()
        .config
        .unwrap();
    assert_eq!(config.max_batch_size, 64);
    assert_eq!(config.input[0].dims, vec![784]);
    assert_eq!(config.input[0].data_type, DataType::TypeFp32 as i32);
    assert!(config.scheduling_choice.is_some());

    // Real data: the digits fixture, expected values from Python onnxruntime.
    let fx = fixture("digits_expected.json");
    let x: Vec<f32> = flat_f64(&fx["inputs"]).into_iter().map(|v| v as f32).collect();
    let resp = c
        .model_infer(infer_request("digits", "input", &[64, 64], &x))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(resp.id, "r1");
    assert_eq!(resp.model_version, "1");
    let names: Vec<&str> = resp.outputs.iter().map(|o| o.name.as_str()).collect();
    assert_eq!(names, ["label", "probabilities"]);
    let labels: Vec<i64> = resp.raw_output_contents[0]
        .chunks(8)
        .map(|b| i64::from_le_bytes(b.try_into().unwrap()))
        .collect();
    let want: Vec<i64> = fx["labels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_i64().unwrap())
        .collect();
    assert_eq!(labels, want);
    let probs: Vec<f64> = resp.raw_output_contents[1]
        .chunks(4)
        .map(|b| f64::from(f32::from_le_bytes(b.try_into().unwrap())))
        .collect();
    assert_close(&probs, &flat_f64(&fx["probabilities"]), 1e-5, "probabilities");

    let stats = c
        .model_statistics(ModelStatisticsRequest {
            name: "digits".into(),
            version: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    let st = &stats.model_stats[0];
    // digits batches at most 32 rows: the 64-row request ran as two chunks.
    assert_eq!((st.inference_count, st.execution_count), (64, 2));
    assert_eq!(st.inference_stats.as_ref().unwrap().success.unwrap().count, 1);
    let all = c
        .model_statistics(ModelStatisticsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(all.model_stats.len(), 2);

    let index = c
        .repository_index(RepositoryIndexRequest::default())
        .await
        .unwrap()
        .into_inner();
    let names: Vec<(&str, &str)> = index
        .models
        .iter()
        .map(|m| (m.name.as_str(), m.state.as_str()))
        .collect();
    assert_eq!(names, [("digits", "READY"), ("mlp", "READY")]);
    // Unload, then load again, through the repository extension.
    let unload = RepositoryModelUnloadRequest {
        model_name: "mlp".into(),
        ..Default::default()
    };
    c.repository_model_unload(unload).await.unwrap();
    assert!(!c.model_ready(ready("mlp")).await.unwrap().into_inner().ready);
    let e = c
        .model_infer(infer_request("mlp", "input", &[1, 784], &[0.0; 784]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{}", e.message());
    let load = |name: &str| RepositoryModelLoadRequest {
        model_name: name.into(),
        ..Default::default()
    };
    c.repository_model_load(load("mlp")).await.unwrap();
    assert!(c.model_ready(ready("mlp")).await.unwrap().into_inner().ready);
    let e = c.repository_model_load(load("nope")).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{}", e.message());
    s.stop().await.unwrap();
}

#[tokio::test]
async fn errors_carry_the_right_status_and_name_the_problem() {
    let repo = repo_with(&["mlp"]);
    let s = TestServer::start(repo.path()).await;
    let mut c = client(&s).await;
    let e = c
        .model_infer(infer_request("mlp", "input", &[1, 3], &[1.0, 2.0, 3.0]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert_eq!(e.message(), "input `input`: expected shape [-1, 784], got [1, 3]");
    let mut lying = infer_request("mlp", "input", &[1, 784], &[0.0; 10]);
    lying.raw_input_contents[0] = f32_raw(&[0.0; 10]).into();
    let e = c.model_infer(lying).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert_eq!(
        e.message(),
        "input `input`: shape [1, 784] of FP32 needs 3136 bytes of binary data, got 40"
    );
    let e = c
        .model_infer(infer_request("nope", "x", &[1], &[1.0]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    assert_eq!(e.message(), "Request for unknown model: 'nope' is not found");
    // A shared-memory input that names no size, or a region no one registered: the client's mistake.
    let mut shm = infer_request("mlp", "input", &[1, 784], &[0.0; 784]);
    shm.raw_input_contents.clear();
    let region = InferParameter {
        parameter_choice: Some(infer_parameter::ParameterChoice::StringParam("r0".into())),
    };
    shm.inputs[0]
        .parameters
        .insert("shared_memory_region".into(), region);
    let e = c.model_infer(shm.clone()).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(
        e.message().contains("without `shared_memory_byte_size`"),
        "{}",
        e.message()
    );
    let size = InferParameter {
        parameter_choice: Some(infer_parameter::ParameterChoice::Int64Param(4 * 784)),
    };
    shm.inputs[0]
        .parameters
        .insert("shared_memory_byte_size".into(), size);
    let e = c.model_infer(shm).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(
        e.message().contains("region 'r0' is not registered"),
        "{}",
        e.message()
    );
    // A schedule parameter of the wrong type is named as the client sent it, not as Rust prints it.
    let mut bad = infer_request("mlp", "input", &[1, 784], &[0.0; 784]);
    let one = InferParameter {
        parameter_choice: Some(infer_parameter::ParameterChoice::StringParam("1".into())),
    };
    bad.parameters.insert("priority".into(), one);
    let e = c.model_infer(bad).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert_eq!(
        e.message(),
        "request: parameter `priority` must be a non-negative integer, got the string \"1\""
    );
    s.stop().await.unwrap();
}

/// Copies the `scalar_out` fixture (x: FP32 [N, 4] → total: FP32 [N], the
/// row sums) to `repo/<name>` with `settings`.
fn scalar_model(repo: &std::path::Path, name: &str, settings: Value) {
    copy_dir(&root().join("tests/fixtures/models/scalar_out"), &repo.join(name));
    write_settings(repo, name, &settings.to_string());
}

#[tokio::test]
async fn a_full_queue_is_unavailable_and_a_late_request_deadline_exceeded() {
    let repo = tempfile::tempdir().unwrap();
    // Batches wait up to 2 s to fill 8 rows; one request may wait.
    scalar_model(
        repo.path(),
        "narrow",
        json!({"batch_policy": "fixed", "max_batch_size": 8,
        "max_batch_time": 2.0, "max_queue_size": 1, "warmup": false}),
    );
    // Requests may take 50 ms, but a batch waits up to 1 s to fill.
    scalar_model(
        repo.path(),
        "hasty",
        json!({"batch_policy": "fixed", "max_batch_size": 8,
        "max_batch_time": 1.0, "timeout": 0.05, "warmup": false}),
    );
    let s = TestServer::start(repo.path()).await;
    let mut c = client(&s).await;
    let first = tokio::spawn({
        let mut c = c.clone();
        async move {
            c.model_infer(infer_request("narrow", "x", &[1, 4], &[1.0; 4]))
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let e = c
        .model_infer(infer_request("narrow", "x", &[1, 4], &[1.0; 4]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unavailable);
    assert!(e.message().contains("max_queue_size"), "{}", e.message());
    let ok = first.await.unwrap().unwrap().into_inner();
    assert_eq!(&ok.raw_output_contents[0][..], &4.0f32.to_le_bytes());

    let e = c
        .model_infer(infer_request("hasty", "x", &[1, 4], &[1.0; 4]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::DeadlineExceeded);
    assert!(e.message().contains("timeout"), "{}", e.message());
    s.stop().await.unwrap();
}

#[tokio::test]
async fn v1_v2_json_v2_binary_and_grpc_requests_share_one_batch() {
    let repo = tempfile::tempdir().unwrap();
    // A batch closes when 4 rows are queued (or after 10 s, which would fail the test).
    scalar_model(
        repo.path(),
        "sum4",
        json!({"batch_policy": "fixed", "max_batch_size": 4,
        "max_batch_time": 10.0, "warmup": false}),
    );
    let s = TestServer::start(repo.path()).await;
    let mut c = client(&s).await;
    let url = |p: &str| s.url(p);
    let http = s.client.clone();

    let v1 = http
        .post(url("/v1/models/sum4:predict"))
        .json(&json!({"instances": [[1.0, 1.0, 1.0, 1.0]]}))
        .send();
    let v2_json = http
        .post(url("/v2/models/sum4/infer"))
        .json(&json!({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [2, 2, 2, 2]}]}))
        .send();
    let header = serde_json::to_vec(
        &json!({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32",
        "parameters": {"binary_data_size": 16}}], "parameters": {"binary_data_output": true}}),
    )
    .unwrap();
    let v2_binary = http
        .post(url("/v2/models/sum4/infer"))
        .header("Inference-Header-Content-Length", header.len())
        .body([header.clone(), f32_raw(&[3.0; 4])].concat())
        .send();
    let grpc = c.model_infer(infer_request("sum4", "x", &[1, 4], &[4.0; 4]));
    let (v1, v2_json, v2_binary, grpc) = tokio::join!(v1, v2_json, v2_binary, grpc);

    let v1: Value = v1.unwrap().json().await.unwrap();
    assert_eq!(v1["predictions"], json!([4.0]));
    let v2_json: Value = v2_json.unwrap().json().await.unwrap();
    assert_eq!(v2_json["outputs"][0]["data"], json!([8.0]));
    let v2_binary = v2_binary.unwrap().bytes().await.unwrap();
    assert_eq!(&v2_binary[v2_binary.len() - 4..], &12.0f32.to_le_bytes());
    assert_eq!(
        &grpc.unwrap().into_inner().raw_output_contents[0][..],
        &16.0f32.to_le_bytes()
    );

    // One execution of 4 rows served all four requests.
    let (_, stats) = s.get("/v2/models/sum4/stats").await;
    let m = &stats["model_stats"][0];
    assert_eq!(m["execution_count"], 1, "{m}");
    assert_eq!(m["inference_count"], 4, "{m}");
    assert_eq!(m["inference_stats"]["success"]["count"], 4, "{m}");
    assert_eq!(m["batch_stats"], json!([m["batch_stats"][0].clone()]));
    assert_eq!(m["batch_stats"][0]["batch_size"], 4);
    assert!(v1["batchId"].is_string());
    s.stop().await.unwrap();
}
