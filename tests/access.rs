//! The protected control plane, end to end over HTTP and gRPC: model
//! control through the API is refused by default (403 / PERMISSION_DENIED)
//! while the file watcher still loads models; API keys guard inference and
//! control separately (401 with `WWW-Authenticate` when missing, 403 when
//! wrong; UNAUTHENTICATED / PERMISSION_DENIED over gRPC); health and
//! `/metrics` stay open.

mod common;

use common::grpc::{client, infer_request};
use common::*;
use serde_json::json;
use sluice::config::ControlMode;
use sluice::protocol::grpc::inference::RepositoryModelLoadRequest;
use tonic::Code;

/// A request to `path` with `key` as a Bearer token (or none): status and body.
async fn call(s: &TestServer, post: bool, path: &str, key: Option<&str>) -> (u16, serde_json::Value) {
    let url = s.url(path);
    let mut req = if post {
        s.client.post(url).json(&json!({}))
    } else {
        s.client.get(url)
    };
    if let Some(k) = key {
        req = req.bearer_auth(k);
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(json!(text)))
}

#[tokio::test]
async fn model_control_through_the_api_is_off_by_default_and_the_watcher_still_works() {
    let repo = repo_with(&["digits"]);
    let s = TestServer::start_with(repo.path(), |c| c.model_repository.control = ControlMode::None).await;
    for verb in ["load", "unload"] {
        let (st, body) = call(&s, true, &format!("/v2/repository/models/digits/{verb}"), None).await;
        assert_eq!(st, 403, "{verb}: {body}");
        assert!(
            error_message(&body).contains("model_repository.control"),
            "{body}"
        );
    }
    let mut grpc = client(&s).await;
    let e = grpc
        .repository_model_load(RepositoryModelLoadRequest {
            model_name: "digits".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    // digits still serves, and a folder dropped in still loads (the watcher).
    assert_eq!(call(&s, false, "/v2/models/digits/ready", None).await.0, 200);
    add_model(repo.path(), "digits", "dropped", "{}");
    let t0 = std::time::Instant::now();
    while s.get("/v2/models/dropped/ready").await.0 != 200 {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(20),
            "the watcher did not load `dropped`"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    s.stop().await.unwrap();
}

#[tokio::test]
async fn api_keys_guard_inference_and_control_separately() {
    let repo = repo_with(&["digits"]);
    let s = TestServer::start_with(repo.path(), |c| {
        c.auth.inference_api_key = Some("inference-secret".into());
        c.auth.control_api_key = Some("control-secret".into());
    })
    .await;
    let row = fixture("digits_expected.json")["inputs"][0].clone();
    let body = json!({"inputs": [v2_input("input", "FP32", &[1, 64], json!([row]))]});
    let infer = |key: Option<&'static str>| {
        let mut req = s.client.post(s.url("/v2/models/digits/infer")).json(&body);
        if let Some(k) = key {
            req = req.header("X-API-Key", k);
        }
        req.send()
    };
    let r = infer(None).await.unwrap();
    assert_eq!(r.status(), 401);
    assert!(r.headers().get("www-authenticate").is_some());
    let msg = r.text().await.unwrap();
    assert!(msg.contains("inference") && !msg.contains("secret"), "{msg}");
    assert_eq!(infer(Some("control-secret")).await.unwrap().status(), 403);
    assert_eq!(infer(Some("inference-secret")).await.unwrap().status(), 200);
    // Metadata and the index are inference endpoints too; health and metrics are open.
    assert_eq!(call(&s, false, "/v2/models/digits", None).await.0, 401);
    assert_eq!(
        call(&s, true, "/v2/repository/index", Some("inference-secret"))
            .await
            .0,
        200
    );
    for open in ["/v2/health/ready", "/v2/health/live", "/v2", "/metrics"] {
        assert_eq!(call(&s, false, open, None).await.0, 200, "{open}");
    }
    // Control takes the control key only.
    let load = "/v2/repository/models/digits/load";
    assert_eq!(call(&s, true, load, None).await.0, 401);
    assert_eq!(call(&s, true, load, Some("inference-secret")).await.0, 403);
    assert_eq!(call(&s, true, load, Some("control-secret")).await.0, 200);

    // gRPC: the same keys as metadata.
    let mut grpc = client(&s).await;
    let request = || infer_request("digits", "input", &[1, 64], &[0.5; 64]);
    let e = grpc.model_infer(request()).await.unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
    let mut wrong = tonic::Request::new(request());
    wrong.metadata_mut().insert("x-api-key", "nope".parse().unwrap());
    assert_eq!(
        grpc.model_infer(wrong).await.unwrap_err().code(),
        Code::PermissionDenied
    );
    let mut right = tonic::Request::new(request());
    right
        .metadata_mut()
        .insert("authorization", "Bearer inference-secret".parse().unwrap());
    grpc.model_infer(right).await.unwrap();
    let mut load = tonic::Request::new(RepositoryModelLoadRequest {
        model_name: "digits".into(),
        ..Default::default()
    });
    load.metadata_mut()
        .insert("authorization", "Bearer inference-secret".parse().unwrap());
    assert_eq!(
        grpc.repository_model_load(load).await.unwrap_err().code(),
        Code::PermissionDenied
    );
    s.stop().await.unwrap();
}
