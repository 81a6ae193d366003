//! A client's small mistakes get a client error that names them, never a
//! server fault, and never a message that grows with what the client sent:
//! a model name that is not UTF-8 over gRPC, a 10 KB model name, and a load
//! with Triton's `config` parameter, which sluice does not serve.

mod common;

use std::collections::HashMap;
use std::process::Command;

use common::grpc::client;
use common::*;
use serde_json::json;
use sluice::protocol::grpc::inference::model_repository_parameter::ParameterChoice;
use sluice::protocol::grpc::inference::*;
use tonic::Code;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_name_that_is_not_utf8_is_invalid_argument_over_grpc() {
    let repo = repo_with(&["scalar_out"]);
    let s = TestServer::start(repo.path()).await;
    // A ModelInferRequest whose field 1 (model_name) holds the bytes ff fe,
    // sent as raw bytes (a generated client cannot make one).
    let script = r#"
import sys, grpc
channel = grpc.insecure_channel(sys.argv[1])
call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
try:
    call(bytes([0x0a, 0x02, 0xff, 0xfe]))
    print("OK")
except grpc.RpcError as e:
    print(e.code().name, e.details())
"#;
    let mut cmd = Command::new(python());
    cmd.args(["-c", script, &s.grpc_addr.to_string()]);
    let out = run(cmd).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.starts_with("INVALID_ARGUMENT "), "{stdout}");
    assert!(stdout.contains("UTF-8"), "{stdout}");
    s.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_model_name_is_not_echoed_whole() {
    let repo = repo_with(&["scalar_out"]);
    let s = TestServer::start(repo.path()).await;
    let name = "m".repeat(10_000);
    let body = json!({"inputs": [v2_input("x", "FP32", &[1, 4], json!([1, 2, 3, 4]))]});
    for path in [
        format!("/v2/models/{name}/infer"),
        format!("/v1/models/{name}:predict"),
        format!("/v2/repository/models/{name}/load"),
    ] {
        let (st, r) = s.post(&path, &body).await;
        assert!((400..500).contains(&st), "{st} {r}");
        let message = error_message(&r);
        assert!(message.len() < 600, "{} bytes: {message}", message.len());
        assert!(message.contains("(10000 bytes)"), "{message}");
    }
    let (st, r) = s.get(&format!("/v1/models/{name}")).await;
    assert_eq!(st, 404, "{r}");
    assert!(error_message(&r).len() < 600);
    let mut c = client(&s).await;
    let err = c
        .model_infer(common::grpc::infer_request(
            &name,
            "x",
            &[1, 4],
            &[1., 2., 3., 4.],
        ))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
    assert!(
        err.message().len() < 600 && err.message().contains("(10000 bytes)"),
        "{err:?}"
    );
    s.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_load_with_a_configuration_applies_it_until_the_next_load() {
    let repo = repo_with(&["scalar_out"]);
    let s = TestServer::start(repo.path()).await;
    let (_, own) = s.get("/v2/models/scalar_out/config").await;
    let config = json!({"parameters": {"config": "{\"max_batch_size\": 4}"}});
    let (st, r) = s.post("/v2/repository/models/scalar_out/load", &config).await;
    assert_eq!(st, 200, "{r}");
    let (_, now) = s.get("/v2/models/scalar_out/config").await;
    assert_eq!(now["max_batch_size"], 4, "{now}");
    // A configuration that is not one: Triton's clients look for "failed to load".
    let bad = json!({"parameters": {"config": "{\"max_batch_sise\": 4}"}});
    let (st, r) = s.post("/v2/repository/models/scalar_out/load", &bad).await;
    assert_eq!(st, 400, "{r}");
    let message = error_message(&r);
    assert!(
        message.contains("failed to load") && message.contains("max_batch_sise"),
        "{message}"
    );
    let files = json!({"parameters": {"file:1/model.onnx": "AAAA"}});
    let (st, r) = s.post("/v2/repository/models/scalar_out/load", &files).await;
    assert_eq!(st, 400, "{r}");
    assert!(error_message(&r).contains("`file:1/model.onnx`"), "{r}");
    // A load without parameters goes back to the folder's own settings.
    let (st, r) = s.post("/v2/repository/models/scalar_out/load", &json!({})).await;
    assert_eq!(st, 200, "{r}");
    let (_, back) = s.get("/v2/models/scalar_out/config").await;
    assert_eq!(back["max_batch_size"], own["max_batch_size"], "{back}");
    let (st, r) = s
        .post_raw("/v2/repository/models/scalar_out/load", Vec::new())
        .await;
    assert_eq!(st, 200, "{r}");
    let mut c = client(&s).await;
    let parameters = HashMap::from([(
        "config".to_string(),
        ModelRepositoryParameter {
            parameter_choice: Some(ParameterChoice::StringParam("{nope".into())),
        },
    )]);
    let err = c
        .repository_model_load(RepositoryModelLoadRequest {
            model_name: "scalar_out".into(),
            parameters,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("failed to load 'scalar_out'"), "{err:?}");
    s.stop().await.unwrap();
}
