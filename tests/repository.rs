//! The model repository end to end: folders that cannot load (bad ONNX,
//! bad settings, an unusable provider) are UNAVAILABLE with a reason and do
//! not stop the good ones; accepted settings spellings really load.

mod common;
use common::*;
use serde_json::{json, Value};

fn reason(entry: &Value) -> &str {
    assert_eq!(entry["state"], "UNAVAILABLE", "{entry}");
    entry["reason"]
        .as_str()
        .unwrap_or_else(|| panic!("no reason: {entry}"))
}

/// Digits rows 0..4 through V2: labels equal the fixture's.
async fn assert_digits_correct(s: &TestServer, model: &str) {
    let exp = fixture("digits_expected.json");
    let rows: Vec<Value> = exp["inputs"].as_array().unwrap()[..4].to_vec();
    let body = json!({"inputs": [v2_input("input", "FP32", &[4, 64], json!(rows))]});
    let (st, r) = s.post(&format!("/v2/models/{model}/infer"), &body).await;
    assert_eq!(st, 200, "{r}");
    let want: Vec<Value> = exp["labels"].as_array().unwrap()[..4].to_vec();
    assert_eq!(v2_output(&r, "label")["data"], json!(want));
}

#[tokio::test]
async fn failed_folders_are_unavailable_with_a_reason_and_good_ones_serve() {
    let repo = repo_with(&["digits", "multi_io", "broken"]);
    add_model(repo.path(), "digits", "typo", r#"{"max_batch_sise": 4}"#);
    add_model(
        repo.path(),
        "mlp",
        "gpu_only",
        r#"{"execution_provider": "cuda"}"#,
    );
    // A folder without model-settings.json is not a model.
    std::fs::create_dir(repo.path().join("notes")).unwrap();
    std::fs::write(repo.path().join("notes/README.md"), "not a model\n").unwrap();
    let s = TestServer::start(repo.path()).await;

    assert_eq!(s.get_raw("/v2/health/ready").await, (200, String::new()));
    let index = s.index().await;
    let names: Vec<&str> = index.keys().map(String::as_str).collect();
    assert_eq!(names, ["broken", "digits", "gpu_only", "multi_io", "typo"]);
    assert_eq!(
        index["digits"],
        json!({"name": "digits", "version": "1", "state": "READY"})
    );
    assert_eq!(index["multi_io"], json!({"name": "multi_io", "state": "READY"}));

    let broken = reason(&index["broken"]);
    assert!(broken.contains("broken/model.onnx"), "{broken}");
    // Files are named relative to the repository, never by host path.
    let host = repo.path().canonicalize().unwrap();
    for (name, e) in &index {
        let text = e.to_string();
        assert!(
            !text.contains(repo.path().to_str().unwrap()) && !text.contains(host.to_str().unwrap()),
            "{name}: {text}"
        );
    }
    let (st, body) = s.post("/v2/models/broken/infer", &json!({"inputs": []})).await;
    assert_eq!(st, 503, "{body}");
    assert!(
        !body.to_string().contains(repo.path().to_str().unwrap()),
        "{body}"
    );
    let typo = reason(&index["typo"]);
    assert!(typo.contains("model-settings.json"), "{typo}");
    assert!(typo.contains("`max_batch_sise` is an unknown field"), "{typo}");
    assert!(typo.contains("did you mean `max_batch_size`?"), "{typo}");
    // Without a usable GPU a cuda-only model cannot load; it may load only
    // with a GPU build of ONNX Runtime (scripts/fetch-onnxruntime.sh --gpu).
    let gpu = &index["gpu_only"];
    let lib = sluice::runtime::onnx::find_library(None).unwrap();
    if gpu["state"] == "READY" {
        assert!(
            lib.to_string_lossy().contains("gpu"),
            "cuda model READY with {}",
            lib.display()
        );
    } else {
        let why = reason(gpu);
        assert!(why.contains("\"cuda\"") && why.contains("CUDA"), "{why}");
    }

    for (model, status) in [("broken", 503), ("typo", 503), ("digits", 200), ("multi_io", 200)] {
        let (st, _) = s.get_raw(&format!("/v2/models/{model}/ready")).await;
        assert_eq!(st, status, "{model}");
    }
    let (st, r) = s
        .post("/v1/models/typo:predict", &json!({"instances": [vec![0.0; 64]]}))
        .await;
    assert_eq!(st, 503, "{r}");
    assert!(error_message(&r).contains("max_batch_sise"), "{r}");

    assert_digits_correct(&s, "digits").await;
    let body = json!({"inputs": [v2_input("a", "FP32", &[1, 3], json!([1, 2, 3])),
        v2_input("b", "INT64", &[1], json!([3]))]});
    let (st, r) = s.post("/v2/models/multi_io/infer", &body).await;
    assert_eq!(st, 200, "{r}");
    assert_eq!(v2_output(&r, "scaled")["data"], json!([3.0, 6.0, 9.0]));
    s.stop().await.unwrap();
}

#[tokio::test]
async fn kserve_batcher_names_and_fixed_first_dim_models_load() {
    let repo = tempfile::tempdir().unwrap();
    let r = repo.path();
    add_model(
        r,
        "digits",
        "kserve",
        r#"{"batcher": {"maxBatchSize": 4, "maxLatency": 5}, "timeout": 30}"#,
    );
    add_model(r, "digits", "kserve_bad", r#"{"batcher": {"maxBatchSize": -1}}"#);
    add_model(
        r,
        "digits",
        "kserve_clash",
        r#"{"max_batch_size": 8, "batcher": {"maxBatchSize": 4}}"#,
    );
    add_model(
        r,
        "digits",
        "kserve_same",
        r#"{"max_batch_size": 4, "batcher": {"maxBatchSize": 4}}"#,
    );
    // dim 0 fixed by the ONNX file: served with batching off, not refused.
    add_model(r, "fixed_batch", "fixed8", r#"{"max_batch_size": 8}"#);
    let s = TestServer::start(r).await;
    let index = s.index().await;
    for ready in ["kserve", "kserve_same", "fixed8"] {
        assert_eq!(index[ready]["state"], "READY", "{}", index[ready]);
    }
    // The KServe names are really read: a bad value or a clash is refused by name.
    let bad = reason(&index["kserve_bad"]);
    assert!(
        bad.contains("`batcher.maxBatchSize` must be an integer between 0 and 65536"),
        "{bad}"
    );
    let clash = reason(&index["kserve_clash"]);
    assert!(
        clash.contains("batcher.maxBatchSize") && clash.contains("disagree"),
        "{clash}"
    );

    assert_digits_correct(&s, "kserve").await;
    let body = json!({"inputs": [v2_input("x", "FP32", &[3, 2], json!([1, 2, 3, 4, 5, 6]))]});
    let (st, resp) = s.post("/v2/models/fixed8/infer", &body).await;
    assert_eq!(st, 200, "{resp}");
    assert_eq!(
        v2_output(&resp, "y")["data"],
        json!([1.0, 4.0, 9.0, 16.0, 25.0, 36.0])
    );
    s.stop().await.unwrap();
}

#[tokio::test]
async fn an_empty_repository_is_ready_with_an_empty_index() {
    let repo = tempfile::tempdir().unwrap();
    let s = TestServer::start(repo.path()).await;
    assert!(s.index().await.is_empty());
    let (st, r) = s.get("/v1/models").await;
    assert_eq!(
        (st, r),
        (200, json!({"models": [], "object": "list", "data": []}))
    );
    s.stop().await.unwrap();
}
