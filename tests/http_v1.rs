//! KServe V1 REST end to end: real ONNX Runtime, real HTTP on 127.0.0.1
//! port 0, temp repositories. Expected values from the Python-generated
//! fixtures, or computed here.

mod common;
use common::*;
use serde_json::{json, Value};

fn predictions(r: &Value) -> &Vec<Value> {
    r["predictions"]
        .as_array()
        .unwrap_or_else(|| panic!("no predictions: {r}"))
}

/// Asserts `batchId` is a non-empty string.
fn assert_batch_id(r: &Value) {
    let id = r["batchId"].as_str().unwrap_or_else(|| panic!("no batchId: {r}"));
    assert!(!id.is_empty(), "{r}");
}

#[tokio::test]
async fn digits_predict_equals_onnxruntime_and_sklearn() {
    let repo = repo_with(&["digits"]);
    let s = TestServer::start(repo.path()).await;
    let exp = fixture("digits_expected.json");
    let (st, r) = s
        .post("/v1/models/digits:predict", &json!({"instances": exp["inputs"]}))
        .await;
    assert_eq!(st, 200, "{r}");
    assert_batch_id(&r);
    let preds = predictions(&r);
    assert_eq!(preds.len(), 64);
    for (i, p) in preds.iter().enumerate() {
        // Two outputs: one object per row keyed by output name.
        let keys: Vec<&String> = p
            .as_object()
            .unwrap_or_else(|| panic!("row {i}: {p}"))
            .keys()
            .collect();
        assert_eq!(keys, ["label", "probabilities"], "row {i}");
        assert_eq!(p["label"], exp["labels"][i], "row {i}");
        assert_eq!(p["label"], exp["labels_sklearn"][i], "row {i}");
        let want = flat_f64(&exp["probabilities"][i]);
        assert_close(&flat_f64(&p["probabilities"]), &want, 1e-5, &format!("row {i}"));
    }

    // The keyed form of a single-input instance gives the same answer.
    let keyed = json!({"instances": [{"input": exp["inputs"][5]}]});
    let (st, r) = s.post("/v1/models/digits:predict", &keyed).await;
    assert_eq!(st, 200, "{r}");
    assert_eq!(predictions(&r)[0]["label"], exp["labels"][5]);
    s.stop().await.unwrap();
}

#[tokio::test]
async fn single_output_predictions_are_rows_and_scalars() {
    let repo = repo_with(&["mlp", "scalar_out"]);
    let s = TestServer::start(repo.path()).await;
    let exp = fixture("mlp_expected.json");
    let (st, r) = s
        .post("/v1/models/mlp:predict", &json!({"instances": exp["inputs"]}))
        .await;
    assert_eq!(st, 200, "{r}");
    assert_batch_id(&r);
    let preds = predictions(&r);
    assert_eq!(preds.len(), 16);
    for (i, p) in preds.iter().enumerate() {
        // One output: the prediction is that output's row, 10 logits.
        assert_eq!(p.as_array().map(Vec::len), Some(10), "row {i}: {p}");
        assert_close(
            &flat_f64(p),
            &flat_f64(&exp["logits"][i]),
            1e-4,
            &format!("row {i}"),
        );
    }

    // A rank-1 output: each prediction is a scalar, the row's sum.
    let x: Vec<[f32; 4]> = vec![[1.0, 2.0, 3.0, 4.0], [0.5, -0.25, 10.0, -100.0]];
    let (st, r) = s
        .post("/v1/models/scalar_out:predict", &json!({"instances": x}))
        .await;
    assert_eq!(st, 200, "{r}");
    let got: Vec<f32> = predictions(&r)
        .iter()
        .map(|p| p.as_f64().unwrap() as f32)
        .collect();
    let want: Vec<f32> = x.iter().map(|row| row.iter().sum()).collect();
    assert_eq!(got, want);
    s.stop().await.unwrap();
}

#[tokio::test]
async fn multi_input_instances_are_objects() {
    let repo = repo_with(&["multi_io"]);
    let s = TestServer::start(repo.path()).await;
    let exp = fixture("multi_io_expected.json");
    let instances: Vec<Value> = (0..5)
        .map(|i| json!({"b": exp["inputs"]["b"][i], "a": exp["inputs"]["a"][i]}))
        .collect();
    let (st, r) = s
        .post("/v1/models/multi_io:predict", &json!({ "instances": instances }))
        .await;
    assert_eq!(st, 200, "{r}");
    assert_batch_id(&r);
    let preds = predictions(&r);
    assert_eq!(preds.len(), 5);
    let as_f32 = |v: &Value| flat_f64(v).into_iter().map(|x| x as f32).collect::<Vec<_>>();
    for (i, p) in preds.iter().enumerate() {
        assert_eq!(p.as_object().unwrap().len(), 3, "row {i}: {p}");
        assert_eq!(as_f32(&p["sum"]), as_f32(&exp["outputs"]["sum"][i]), "row {i}");
        assert_eq!(
            as_f32(&p["scaled"]),
            as_f32(&exp["outputs"]["scaled"][i]),
            "row {i}"
        );
        assert_eq!(p["b_twice"], exp["outputs"]["b_twice"][i], "row {i}");
    }
    s.stop().await.unwrap();
}

#[tokio::test]
async fn model_list_and_status() {
    let repo = repo_with(&["digits", "mlp", "broken"]);
    let s = TestServer::start(repo.path()).await;
    let (st, r) = s.get("/v1/models").await;
    assert_eq!(st, 200, "{r}");
    assert_eq!(r["models"], json!(["broken", "digits", "mlp"]), "{r}");
    // The same body in OpenAI's shape (client.models.list()).
    assert_eq!(r["object"], "list", "{r}");
    let ids: Vec<&str> = r["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["broken", "digits", "mlp"]);
    assert!(
        r["data"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m["object"] == "model" && m["created"].is_u64()),
        "{r}"
    );
    let (st, r) = s.get("/v1/models/digits").await;
    assert_eq!((st, r), (200, json!({"name": "digits", "ready": true})));
    let (st, r) = s.get("/v1/models/nope").await;
    assert_eq!(st, 404, "{r}");
    assert!(error_message(&r).contains("'nope' is not found"), "{r}");
    s.stop().await.unwrap();
}
