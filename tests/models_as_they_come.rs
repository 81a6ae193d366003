//! Models as they come: ONNX files nobody on this project made, dropped in
//! as bare folders, each answering every request as Python ONNX Runtime
//! answers it alone, over V2 JSON, the binary extension and gRPC, alone and
//! with requests arriving together (`tests/clients/alone.py`,
//! `tests/clients/conformance.py`). Batching is decided by evidence: the
//! file's dims, warm-up, and a served batch (README, "Which models batch").

mod common;

use std::path::Path;
use std::process::Command;

use common::prometheus::Metrics;
use common::*;
use serde_json::{json, Value};

/// Runs `tests/clients/alone.py` for `requests` against model `name` of
/// `s`, whose file is `model`: every answer must equal Python ONNX Runtime's
/// on the request alone.
async fn answers_as_alone(s: &TestServer, name: &str, model: &Path, requests: &Value, together: usize) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("requests.json");
    std::fs::write(&file, serde_json::to_vec(requests).unwrap()).unwrap();
    let mut cmd = Command::new(python());
    cmd.arg(root().join("tests/clients/alone.py"))
        .arg(model)
        .arg(name)
        .arg(&file)
        .args(["--http", &s.addr.to_string(), "--grpc", &s.grpc_addr.to_string()])
        .args(["--together", &together.to_string()]);
    let out = run(cmd).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{name}: answers differ from ONNX Runtime alone:\n{stdout}"
    );
    assert!(stdout.contains(": 0 wrong"), "{stdout}");
}

/// A request of `boxes` `[x1, y1, x2, y2, score]` for the detector.
fn boxes(rows: &[[f32; 5]]) -> Value {
    let flat: Vec<f32> = rows.iter().flatten().copied().collect();
    json!({"boxes": {"datatype": "FP32", "shape": [rows.len(), 5], "data": flat}})
}

/// Detector requests: kept counts 2, 0 (an empty output), 1 of 1, 3 of 4.
fn detector_requests() -> Value {
    json!([
        boxes(&[
            [0., 0., 1., 1., 0.9],
            [0., 0., 2., 2., 0.1],
            [1., 1., 3., 3., 0.7]
        ])["boxes"]
            .clone(),
        boxes(&[[0., 0., 1., 1., 0.2], [5., 5., 6., 6., 0.4]])["boxes"].clone(),
        boxes(&[[2., 2., 4., 4., 0.55]])["boxes"].clone(),
        boxes(&[
            [0., 0., 1., 1., 0.6],
            [1., 0., 2., 1., 0.8],
            [0., 1., 1., 2., 0.3],
            [3., 3., 4., 4., 0.99]
        ])["boxes"]
            .clone(),
    ])
    .as_array()
    .unwrap()
    .iter()
    .map(|b| json!({"boxes": b}))
    .collect()
}

/// A stateful request: `samples` audio samples per row, its state, a sample rate.
fn stateful_request(rows: usize, samples: usize, sr: i64, seed: usize) -> Value {
    let input: Vec<f32> = (0..rows * samples)
        .map(|i| ((i * 7 + seed * 13) % 23) as f32 / 23.0 - 0.5)
        .collect();
    let state: Vec<f32> = (0..2 * rows * 3)
        .map(|i| ((i * 5 + seed * 3) % 11) as f32 / 11.0 - 0.5)
        .collect();
    json!({
        "input": {"datatype": "FP32", "shape": [rows, samples], "data": input},
        "state": {"datatype": "FP32", "shape": [2, rows, 3], "data": state},
        "sr": {"datatype": "INT64", "shape": [], "data": [sr]},
    })
}

fn model_file(name: &str) -> std::path::PathBuf {
    root().join("tests/fixtures/models").join(name).join("model.onnx")
}

/// The model's Triton statistics: (requests that succeeded, failed, batches run).
async fn stats(s: &TestServer, model: &str) -> (u64, u64, u64) {
    let (st, body) = s.get(&format!("/v2/models/{model}/stats")).await;
    assert_eq!(st, 200, "{body}");
    let m = &body["model_stats"][0];
    let count = |v: &Value| v.as_u64().unwrap_or_else(|| panic!("{body}"));
    (
        count(&m["inference_stats"]["success"]["count"]),
        count(&m["inference_stats"]["fail"]["count"]),
        count(&m["execution_count"]),
    )
}

/// The index entry of `model`, with its `batching` (removed by `TestServer::index`).
async fn index_entry(s: &TestServer, model: &str) -> Value {
    let (st, body) = s.post("/v2/repository/index", &json!({})).await;
    assert_eq!(st, 200, "{body}");
    body.as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == model)
        .cloned()
        .unwrap_or_else(|| panic!("no `{model}` in {body}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_conformance_corpus_answers_its_reference_outputs() {
    let python = python();
    let wheel = root().join(".venv-clients/wheels/rapidocr_onnxruntime-1.4.4-py3-none-any.whl");
    assert!(
        wheel.is_file(),
        "{} is missing: run scripts/setup-test-clients.sh",
        wheel.display()
    );
    let corpus = tempfile::tempdir().unwrap();
    let mut build = Command::new(&python);
    build
        .arg(root().join("tests/clients/conformance.py"))
        .arg("build")
        .arg(corpus.path())
        .arg("--rapidocr-wheel")
        .arg(&wheel);
    let out = run(build).await;
    assert!(out.status.success(), "building the corpus failed");
    let s = TestServer::start(&corpus.path().join("repo")).await;
    let mut check = Command::new(&python);
    check
        .arg(root().join("tests/clients/conformance.py"))
        .arg("check")
        .arg(corpus.path())
        .args(["--http", &s.addr.to_string(), "--grpc", &s.grpc_addr.to_string()]);
    let out = run(check).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    // "conformance: 152 models; 112 that Python ONNX Runtime runs: 112 passed, 0 failed; 40 left out"
    let line = stdout
        .lines()
        .find(|l| l.starts_with("conformance: "))
        .unwrap_or_else(|| panic!("{stdout}"));
    let numbers: Vec<u64> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|n| n.parse().ok())
        .collect();
    let (runs, passed, failed) = (numbers[1], numbers[2], numbers[3]);
    assert!(out.status.success() && failed == 0 && passed == runs, "{stdout}");
    // The onnx wheel's 100 that ORT runs, its 9 light CNNs, rapidocr's 3;
    // with the en_US.UTF-8 locale (setup-test-clients.sh makes it), ORT
    // also runs the wheel's 4 StringNormalizer models.
    let locales = Command::new("locale")
        .arg("-a")
        .output()
        .map(|o| o.stdout)
        .unwrap_or_default();
    let en_us = String::from_utf8_lossy(&locales)
        .lines()
        .any(|l| l.eq_ignore_ascii_case("en_US.utf8"));
    let want = if en_us { 116 } else { 112 };
    assert!(
        runs >= want,
        "fewer models than the corpus holds ({want}): {line}"
    );
    s.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_detector_answers_every_request_whole_and_warm_up_shows_it_cannot_batch() {
    let repo = repo_with(&["detector"]);
    let s = TestServer::start(repo.path()).await;
    answers_as_alone(&s, "detector", &model_file("detector"), &detector_requests(), 4).await;
    let entry = index_entry(&s, "detector").await;
    let batching = entry["batching"].as_str().unwrap();
    assert!(
        batching.starts_with("off: warm-up: output `dets` has shape [0, 5] for a batch of 1 row"),
        "{entry}"
    );
    assert_eq!(
        Metrics::scrape(&s)
            .await
            .sum("sluice_model_batching", &[("model", "detector")]),
        0.0
    );
    // Triton's configuration for a model that does not batch.
    let (_, config) = s.get("/v2/models/detector/config").await;
    assert_eq!(config["max_batch_size"], 0, "{config}");
    // KServe V1: one instance per box; each prediction is one detection
    // (boxes scoring over 0.5, by arithmetic).
    let instances = json!({"instances": [[0, 0, 1, 1, 0.9], [0, 0, 2, 2, 0.1], [1, 1, 3, 3, 0.7]]});
    let (st, body) = s.post("/v1/models/detector:predict", &instances).await;
    assert_eq!(st, 200, "{body}");
    assert_eq!(
        body["predictions"],
        json!([{"dets": [0.0, 0.0, 1.0, 1.0, 0.9], "keep": 0}, {"dets": [1.0, 1.0, 3.0, 3.0, 0.7], "keep": 2}]),
        "{body}"
    );
    let (ok, failed, _) = stats(&s, "detector").await;
    assert_eq!(failed, 0);
    assert!(ok >= 4 * 3 * 5, "{ok}");
    s.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_detector_found_out_while_serving_turns_batching_off_and_no_request_fails() {
    // Without warm-up only the file speaks, and its generated names say
    // nothing: the model starts batching, and its first shared batch (or a
    // request alone) shows that `dets` does not follow the rows.
    let repo = tempfile::tempdir().unwrap();
    add_model(
        repo.path(),
        "detector",
        "late_detector",
        r#"{"warmup": false, "max_batch_time": 0.05}"#,
    );
    let s = TestServer::start(repo.path()).await;
    assert!(index_entry(&s, "late_detector").await["batching"]
        .as_str()
        .unwrap()
        .starts_with("on"));
    // The first thing it sees is many requests at once.
    answers_as_alone(
        &s,
        "late_detector",
        &model_file("detector"),
        &detector_requests(),
        8,
    )
    .await;
    let entry = index_entry(&s, "late_detector").await;
    let batching = entry["batching"].as_str().unwrap();
    assert!(
        batching.starts_with("off: output `dets` has shape")
            && batching.contains("does not follow the batch"),
        "{entry}"
    );
    assert_eq!(
        Metrics::scrape(&s)
            .await
            .sum("sluice_model_batching", &[("model", "late_detector")]),
        0.0
    );
    assert_eq!(stats(&s, "late_detector").await.1, 0, "a request failed");
    s.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stateful_model_with_a_0d_input_serves_cold_and_answers_each_request_alone() {
    // As dropped in: the state's fixed dim 0 (2 layers) rules batching out,
    // and the zero warm-up of 1 sample is too short for its reflect pad.
    let repo = repo_with(&["stateful"]);
    let s = TestServer::start(repo.path()).await;
    let entry = index_entry(&s, "stateful").await;
    assert_eq!(entry["state"], "READY", "{entry}");
    assert!(
        entry["batching"]
            .as_str()
            .unwrap()
            .starts_with("off: input `state` has a fixed dim 0 (2)"),
        "{entry}"
    );
    let warmup = entry["warmup"].as_str().unwrap_or_else(|| panic!("{entry}"));
    assert!(warmup.contains("rejected") && warmup.contains("Pad"), "{entry}");
    let requests = json!([
        stateful_request(1, 4, 16000, 0),
        stateful_request(2, 4, 8000, 1),
        stateful_request(3, 6, 16000, 2),
        stateful_request(1, 3, 8000, 3),
    ]);
    answers_as_alone(&s, "stateful", &model_file("stateful"), &requests, 4).await;
    assert_eq!(stats(&s, "stateful").await.1, 0);
    s.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declared_batch_axes_batch_the_state_on_axis_1_and_only_equal_sample_rates_together() {
    let repo = tempfile::tempdir().unwrap();
    add_model(
        repo.path(),
        "stateful",
        "vad",
        r#"{"batch_axes": {"state": 1, "stateN": 1}, "max_batch_time": 0.05, "max_batch_size": 16}"#,
    );
    // A sample request (8 samples) replaces the zero warm-up the model rejects.
    std::fs::create_dir(repo.path().join("vad/warmup")).unwrap();
    let sample = stateful_request(1, 8, 16000, 9);
    let inputs: Vec<Value> = ["input", "state", "sr"]
        .iter()
        .map(|n| {
            let t = &sample[*n];
            json!({"name": n, "datatype": t["datatype"], "shape": t["shape"], "data": t["data"]})
        })
        .collect();
    let body = json!({ "inputs": inputs });
    std::fs::write(repo.path().join("vad/warmup/sample.json"), body.to_string()).unwrap();
    let s = TestServer::start(repo.path()).await;
    let entry = index_entry(&s, "vad").await;
    assert!(
        entry.get("warmup").is_none(),
        "the sample warm-up was rejected: {entry}"
    );
    assert_eq!(
        entry["batching"],
        "on, `input` on axis 0, `state` on axis 1, `sr` 0-d (requests share a batch when they agree on it), \
         `output` on axis 0, `stateN` on axis 1",
        "{entry}"
    );
    let warm_batches = stats(&s, "vad").await.2;
    // Same length, two sample rates: requests of one rate share batches.
    let requests: Value = (0..8)
        .map(|i| stateful_request(1 + i % 3, 8, [16000, 8000][i % 2], i))
        .collect();
    answers_as_alone(&s, "vad", &model_file("stateful"), &requests, 8).await;
    let (ok, failed, batches) = stats(&s, "vad").await;
    assert_eq!(failed, 0);
    let run = batches - warm_batches;
    assert!(run < ok, "{ok} requests in {run} batches: none shared a batch");
    assert_eq!(
        Metrics::scrape(&s)
            .await
            .sum("sluice_model_batching", &[("model", "vad")]),
        1.0
    );
    s.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_batch_axis_is_refused_naming_the_field_and_the_fix() {
    let repo = tempfile::tempdir().unwrap();
    add_model(
        repo.path(),
        "stateful",
        "vad",
        r#"{"batch_axes": {"state": 0, "stateN": 1}}"#,
    );
    add_model(repo.path(), "generated_names", "ok", "{}");
    let s = TestServer::start(repo.path()).await;
    let entry = index_entry(&s, "vad").await;
    assert_eq!(entry["state"], "UNAVAILABLE", "{entry}");
    let reason = entry["reason"].as_str().unwrap();
    assert!(
        reason.contains("`batch_axes.state` is 0, but dim 0 of `state` is fixed (2)")
            && reason.contains("the batch axis is a dynamic dim"),
        "{reason}"
    );
    s.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_classifier_with_generated_dim_names_still_shares_batches() {
    let repo = tempfile::tempdir().unwrap();
    add_model(
        repo.path(),
        "generated_names",
        "clf",
        r#"{"max_batch_time": 0.05}"#,
    );
    let s = TestServer::start(repo.path()).await;
    assert!(index_entry(&s, "clf").await["batching"]
        .as_str()
        .unwrap()
        .starts_with("on"));
    let warm = stats(&s, "clf").await.2;
    let requests: Value = (0..6)
        .map(|i| {
            let rows = 1 + i % 3;
            let data: Vec<f32> = (0..rows * 4).map(|k| (k + i) as f32 / 4.0).collect();
            json!({"x": {"datatype": "FP32", "shape": [rows, 4], "data": data}})
        })
        .collect();
    answers_as_alone(&s, "clf", &model_file("generated_names"), &requests, 8).await;
    let (ok, failed, batches) = stats(&s, "clf").await;
    assert_eq!(failed, 0);
    assert!(
        batches - warm < ok,
        "{ok} requests in {} batches: none shared a batch",
        batches - warm
    );
    assert!(index_entry(&s, "clf").await["batching"]
        .as_str()
        .unwrap()
        .starts_with("on"));
    s.stop().await.unwrap();
}

#[test]
fn sluice_check_explains_the_evidence() {
    let check = |model: &str| {
        let out = process::sluice()
            .arg("check")
            .arg(root().join("tests/fixtures/models").join(model))
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            out.status.success(),
            "{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    };
    let detector = check("detector");
    assert!(
        detector.contains("batching: off: warm-up: output `dets` has shape [0, 5] for a batch of 1 row"),
        "{detector}"
    );
    assert!(detector.contains("warm-up: a batch of 1 row ran"), "{detector}");
    let stateful = check("stateful");
    assert!(
        stateful.contains("batching: off: input `state` has a fixed dim 0 (2)"),
        "{stateful}"
    );
    assert!(
        stateful.contains("warm-up: rejected by the model, which serves cold"),
        "{stateful}"
    );
    let clf = check("generated_names");
    assert!(
        clf.contains("batching: on, along dim 0 of every input and output"),
        "{clf}"
    );
    assert!(
        clf.contains("warm-up: a batch of 1 row and one of 2 ran"),
        "{clf}"
    );
}

/// Every datatype of the `dtypes` and `scalars` fixtures: (input suffix,
/// datatype, a value at the edge of its range).
const DATATYPES: [(&str, &str, f64); 12] = [
    ("uint8", "UINT8", 255.0),
    ("uint16", "UINT16", 65535.0),
    ("uint32", "UINT32", 4294967295.0),
    ("uint64", "UINT64", 9007199254740991.0),
    ("int8", "INT8", -128.0),
    ("int16", "INT16", -32768.0),
    ("int32", "INT32", -2147483648.0),
    ("int64", "INT64", -9007199254740991.0),
    ("fp16", "FP16", 0.5),
    ("fp32", "FP32", -1.25),
    ("fp64", "FP64", 1e-300),
    ("bool", "BOOL", 1.0),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_datatype_as_a_0d_and_as_an_empty_tensor_over_every_protocol() {
    let repo = repo_with(&["scalars", "dtypes"]);
    let s = TestServer::start(repo.path()).await;
    // 0-d tensors of every datatype in one request (the model runs it alone).
    let mut scalar = serde_json::Map::new();
    // Empty tensors: 0 rows of every datatype.
    let mut empty = serde_json::Map::new();
    for (suffix, datatype, value) in DATATYPES {
        let v = match datatype {
            "BOOL" => json!(value != 0.0),
            "FP16" | "FP32" | "FP64" => json!(value),
            _ => json!(value as i64),
        };
        scalar.insert(
            format!("in_{suffix}"),
            json!({"datatype": datatype, "shape": [], "data": [v]}),
        );
        empty.insert(
            format!("in_{suffix}"),
            json!({"datatype": datatype, "shape": [0, 2], "data": []}),
        );
    }
    scalar.insert(
        "in_bytes".into(),
        json!({"datatype": "BYTES", "shape": [], "data": ["é, a string"]}),
    );
    empty.insert(
        "in_bytes".into(),
        json!({"datatype": "BYTES", "shape": [0, 2], "data": []}),
    );
    answers_as_alone(&s, "scalars", &model_file("scalars"), &json!([scalar]), 2).await;
    answers_as_alone(&s, "dtypes", &model_file("dtypes"), &json!([empty]), 2).await;
    s.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_datatype_over_kserve_v1() {
    let repo = repo_with(&["dtypes", "bf16"]);
    let s = TestServer::start(repo.path()).await;
    // Two instances, each an object with one row of every input; the model
    // is an identity, so each prediction holds the same rows.
    let mut rows = [serde_json::Map::new(), serde_json::Map::new()];
    for (suffix, datatype, value) in DATATYPES {
        for (i, row) in rows.iter_mut().enumerate() {
            let v = match datatype {
                "BOOL" => json!([i == 0, i == 1]),
                "FP16" | "FP32" | "FP64" => json!([value, value * (i as f64 + 2.0)]),
                _ => json!([value as i64, i as i64]),
            };
            row.insert(format!("in_{suffix}"), v);
        }
    }
    for (i, row) in rows.iter_mut().enumerate() {
        row.insert("in_bytes".into(), json!([format!("é{i}"), ""]));
    }
    let (st, body) = s
        .post("/v1/models/dtypes:predict", &json!({"instances": rows}))
        .await;
    assert_eq!(st, 200, "{body}");
    let predictions = body["predictions"].as_array().unwrap();
    assert_eq!(predictions.len(), 2, "{body}");
    for (i, p) in predictions.iter().enumerate() {
        for (name, sent) in &rows[i] {
            let out = format!("out_{}", name.strip_prefix("in_").unwrap());
            assert_eq!(&p[&out], sent, "instance {i}, {out}: {body}");
        }
    }
    // BF16 (values a bfloat16 holds exactly) and its FP32 cast.
    let (st, body) = s
        .post(
            "/v1/models/bf16:predict",
            &json!({"instances": [[1.5, -2.0], [256.0, 0.0078125]]}),
        )
        .await;
    assert_eq!(st, 200, "{body}");
    assert_eq!(
        body["predictions"],
        json!([{"y": [1.5, -2.0], "f": [1.5, -2.0]}, {"y": [256.0, 0.0078125], "f": [256.0, 0.0078125]}]),
        "{body}"
    );
    s.stop().await.unwrap();
}
