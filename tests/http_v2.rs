//! Open Inference Protocol (V2) REST end to end: real ONNX Runtime, real HTTP
//! on 127.0.0.1 port 0, temp repositories. Expected values come from
//! fixtures computed by Python onnxruntime / scikit-learn
//! (scripts/make_models.py) or are computed here.

mod common;
use common::*;
use serde_json::{json, Value};

fn ints(v: &Value) -> Vec<i64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_i64().unwrap())
        .collect()
}

/// The elements of a 2-D JSON array, row after row.
fn rows_concat(v: &Value) -> Vec<Value> {
    v.as_array()
        .unwrap()
        .iter()
        .flat_map(|row| row.as_array().unwrap().clone())
        .collect()
}

/// Flattened values as f32 (a FP32 tensor's JSON numbers are f32 values).
fn f32s(v: &Value) -> Vec<f32> {
    flat_f64(v).into_iter().map(|x| x as f32).collect()
}

#[tokio::test]
async fn digits_equals_onnxruntime_and_sklearn_batched_and_row_by_row() {
    let repo = repo_with(&["digits"]);
    let s = TestServer::start(repo.path()).await;
    let exp = fixture("digits_expected.json");
    let labels = ints(&exp["labels"]);
    // The fixture's onnxruntime labels equal scikit-learn's and the truth on these rows.
    assert_eq!(labels, ints(&exp["labels_sklearn"]));
    let probs: Vec<Vec<f64>> = exp["probabilities"]
        .as_array()
        .unwrap()
        .iter()
        .map(flat_f64)
        .collect();

    let body =
        json!({"id": "all-64", "inputs": [v2_input("input", "FP32", &[64, 64], exp["inputs"].clone())]});
    let (st, r) = s.post("/v2/models/digits/infer", &body).await;
    assert_eq!(st, 200, "{r}");
    assert_eq!(r["model_name"], "digits");
    assert_eq!(r["model_version"], "1");
    assert_eq!(r["id"], "all-64");
    assert_eq!(r["outputs"].as_array().unwrap().len(), 2, "{r}");
    let label = v2_output(&r, "label");
    assert_eq!(
        (&label["datatype"], &label["shape"]),
        (&json!("INT64"), &json!([64]))
    );
    assert_eq!(ints(&label["data"]), labels);
    let p = v2_output(&r, "probabilities");
    assert_eq!((&p["datatype"], &p["shape"]), (&json!("FP32"), &json!([64, 10])));
    assert_close(&flat_f64(&p["data"]), &probs.concat(), 1e-5, "probabilities");

    for i in [0, 17, 42, 63] {
        let row = json!([exp["inputs"][i]]);
        let body = json!({"inputs": [v2_input("input", "FP32", &[1, 64], row)]});
        let (st, r) = s.post("/v2/models/digits/infer", &body).await;
        assert_eq!(st, 200, "{r}");
        assert_eq!(ints(&v2_output(&r, "label")["data"]), vec![labels[i]], "row {i}");
        let got = flat_f64(&v2_output(&r, "probabilities")["data"]);
        assert_close(&got, &probs[i], 1e-5, &format!("row {i}"));
    }
    s.stop().await.unwrap();
}

#[tokio::test]
async fn mlp_logits_nested_and_flat_data_and_versions() {
    let repo = repo_with(&["mlp", "digits"]);
    let s = TestServer::start(repo.path()).await;
    let exp = fixture("mlp_expected.json");
    let body = json!({"inputs": [v2_input("input", "FP32", &[16, 784], exp["inputs"].clone())]});
    let (st, r) = s.post("/v2/models/mlp/infer", &body).await;
    assert_eq!(st, 200, "{r}");
    assert!(r.get("model_version").is_none(), "mlp has no version: {r}");
    let logits = v2_output(&r, "logits");
    assert_eq!(
        (&logits["datatype"], &logits["shape"]),
        (&json!("FP32"), &json!([16, 10]))
    );
    assert_close(
        &flat_f64(&logits["data"]),
        &flat_f64(&exp["logits"]),
        1e-4,
        "logits",
    );

    // Nested `data` (rows) and flat `data` give the same answer.
    let rows = fixture("digits_expected.json")["inputs"].as_array().unwrap()[..3].to_vec();
    let nested = json!({"inputs": [v2_input("input", "FP32", &[3, 64], json!(rows))]});
    let flat = json!({"inputs": [v2_input("input", "FP32", &[3, 64], json!(flat_f64(&json!(rows))))]});
    let (st1, a) = s.post("/v2/models/digits/infer", &nested).await;
    let (st2, b) = s.post("/v2/models/digits/infer", &flat).await;
    assert_eq!((st1, st2), (200, 200), "{a} {b}");
    assert_eq!(a["outputs"], b["outputs"]);

    // The version path serves the model's one version, and only that one.
    let (st, r) = s.post("/v2/models/digits/versions/1/infer", &nested).await;
    assert_eq!(st, 200, "{r}");
    assert_eq!((&r["model_version"], &r["outputs"]), (&json!("1"), &a["outputs"]));
    let (st, r) = s.post("/v2/models/digits/versions/2/infer", &nested).await;
    assert_eq!(st, 404, "{r}");
    let msg = error_message(&r);
    assert!(
        msg.contains("Request for unknown model: 'digits' version 2 is not found"),
        "{msg}"
    );
    let (st, r) = s.get("/v2/models/digits/versions/2").await;
    assert_eq!(st, 404, "{r}");

    // Infer paths that need percent-decoding go through the router, the
    // plain ones skip it (http::v2::infer_direct): both answer alike.
    let wrong = json!({"inputs": [v2_input("input", "INT8", &[1, 64], json!(vec![0; 64]))]});
    for (direct, routed) in [
        ("/v2/models/digits/infer", "/v2/models/%64igits/infer"),
        (
            "/v2/models/digits/versions/1/infer",
            "/v2/models/digits/versions/%31/infer",
        ),
        (
            "/v2/models/digits/versions/2/infer",
            "/v2/models/d%69gits/versions/2/infer",
        ),
    ] {
        for body in [&nested, &wrong] {
            let (a, b) = (s.post(direct, body).await, s.post(routed, body).await);
            assert_eq!(a, b, "{direct} and {routed} answer differently");
        }
    }
    s.stop().await.unwrap();
}

#[tokio::test]
async fn every_datatype_round_trips_in_one_request() {
    let repo = repo_with(&["dtypes"]);
    let s = TestServer::start(repo.path()).await;
    // (suffix, datatype, 2x2 values hitting each type's edges)
    let cases = [
        ("bool", "BOOL", json!([[true, false], [false, true]])),
        ("uint8", "UINT8", json!([[0, 255], [1, 128]])),
        ("uint16", "UINT16", json!([[0, 65535], [1, 256]])),
        ("uint32", "UINT32", json!([[0, u32::MAX], [1, 65536]])),
        ("uint64", "UINT64", json!([[0, u64::MAX], [1, 1u64 << 53]])),
        ("int8", "INT8", json!([[-128, 127], [0, -1]])),
        ("int16", "INT16", json!([[-32768, 32767], [0, -1]])),
        ("int32", "INT32", json!([[i32::MIN, i32::MAX], [0, -1]])),
        ("int64", "INT64", json!([[i64::MIN, i64::MAX], [0, -1]])),
        // Exactly representable in FP16: its max, its smallest normal, halves.
        (
            "fp16",
            "FP16",
            json!([[65504.0, -65504.0], [0.00006103515625, -0.375]]),
        ),
        (
            "fp32",
            "FP32",
            json!([[0.1, f32::MAX], [f32::MIN_POSITIVE, -16777216.0]]),
        ),
        (
            "fp64",
            "FP64",
            json!([[0.1, std::f64::consts::PI], [1e-300, -f64::MAX]]),
        ),
        (
            "bytes",
            "BYTES",
            json!([["héllo wörld", "日本語"], ["", "🦀 crab"]]),
        ),
    ];
    let inputs: Vec<Value> = cases
        .iter()
        .map(|(sfx, dt, v)| v2_input(&format!("in_{sfx}"), dt, &[2, 2], v.clone()))
        .collect();
    let (st, r) = s
        .post("/v2/models/dtypes/infer", &json!({ "inputs": inputs }))
        .await;
    assert_eq!(st, 200, "{r}");
    assert_eq!(r["outputs"].as_array().unwrap().len(), cases.len(), "{r}");
    for (sfx, dt, want) in &cases {
        let out = v2_output(&r, &format!("out_{sfx}"));
        assert_eq!(
            (&out["datatype"], &out["shape"]),
            (&json!(dt), &json!([2, 2])),
            "{sfx}"
        );
        match *sfx {
            // FP16 and FP32 elements are sent back as their shortest f32 decimal.
            "fp16" | "fp32" => assert_eq!(f32s(&out["data"]), f32s(want), "{sfx}"),
            _ => assert_eq!(out["data"], json!(rows_concat(want)), "{sfx}"),
        }
    }

    // Requested outputs: only those, in the order asked.
    let body = json!({"inputs": inputs, "outputs": [{"name": "out_bytes"}, {"name": "out_int8"}]});
    let (st, r) = s.post("/v2/models/dtypes/infer", &body).await;
    assert_eq!(st, 200, "{r}");
    let names: Vec<&Value> = r["outputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| &o["name"])
        .collect();
    assert_eq!(names, [&json!("out_bytes"), &json!("out_int8")]);
    assert_eq!(v2_output(&r, "out_int8")["data"], json!([-128, 127, 0, -1]));
    s.stop().await.unwrap();
}

#[tokio::test]
async fn multi_io_scalar_out_and_fixed_batch() {
    let repo = repo_with(&["multi_io", "scalar_out", "fixed_batch"]);
    let s = TestServer::start(repo.path()).await;
    let exp = fixture("multi_io_expected.json");
    // Inputs in the opposite order from the signature: matched by name.
    let body = json!({"inputs": [
        v2_input("b", "INT64", &[5], exp["inputs"]["b"].clone()),
        v2_input("a", "FP32", &[5, 3], exp["inputs"]["a"].clone()),
    ]});
    let (st, r) = s.post("/v2/models/multi_io/infer", &body).await;
    assert_eq!(st, 200, "{r}");
    for (name, dt, shape) in [("sum", "FP32", json!([5, 3])), ("scaled", "FP32", json!([5, 3]))] {
        let out = v2_output(&r, name);
        assert_eq!((&out["datatype"], &out["shape"]), (&json!(dt), &shape), "{name}");
        assert_eq!(f32s(&out["data"]), f32s(&exp["outputs"][name]), "{name}");
    }
    let b2 = v2_output(&r, "b_twice");
    assert_eq!((&b2["datatype"], &b2["shape"]), (&json!("INT64"), &json!([5])));
    assert_eq!(b2["data"], exp["outputs"]["b_twice"]);
    let body = json!({"inputs": body["inputs"], "outputs": [{"name": "b_twice"}]});
    let (st, r) = s.post("/v2/models/multi_io/infer", &body).await;
    assert_eq!(st, 200, "{r}");
    assert_eq!(r["outputs"].as_array().unwrap().len(), 1, "{r}");
    assert_eq!(v2_output(&r, "b_twice")["data"], json!([0, 2, 4, 6, 8]));

    // scalar_out: one FP32 per row, the row's sum.
    let x: Vec<[f32; 4]> = vec![[1.0, 2.0, 3.0, 4.0], [-1.5, 0.25, 8.0, 100.0], [0.0; 4]];
    let body = json!({"inputs": [v2_input("x", "FP32", &[3, 4], json!(x))]});
    let (st, r) = s.post("/v2/models/scalar_out/infer", &body).await;
    assert_eq!(st, 200, "{r}");
    let total = v2_output(&r, "total");
    assert_eq!(
        (&total["datatype"], &total["shape"]),
        (&json!("FP32"), &json!([3]))
    );
    let sums: Vec<f32> = x.iter().map(|row| row.iter().sum()).collect();
    assert_eq!(f32s(&total["data"]), sums);

    // fixed_batch: x is FP32[3, 2] exactly; y = x * x.
    let body = json!({"inputs": [v2_input("x", "FP32", &[3, 2], json!([[0, 1], [2, 3], [4, -5]]))]});
    let (st, r) = s.post("/v2/models/fixed_batch/infer", &body).await;
    assert_eq!(st, 200, "{r}");
    let y = v2_output(&r, "y");
    assert_eq!(
        (&y["shape"], &y["data"]),
        (&json!([3, 2]), &json!([0.0, 1.0, 4.0, 9.0, 16.0, 25.0]))
    );
    let body = json!({"inputs": [v2_input("x", "FP32", &[5, 2], json!(vec![0.0; 10]))]});
    let (st, r) = s.post("/v2/models/fixed_batch/infer", &body).await;
    assert_eq!(st, 400, "{r}");
    let msg = error_message(&r);
    assert!(
        msg.contains("`x`") && msg.contains("[3, 2]") && msg.contains("[5, 2]"),
        "{msg}"
    );
    s.stop().await.unwrap();
}

#[tokio::test]
async fn metadata_equals_the_onnx_signature() {
    let all = ["digits", "mlp", "dtypes", "multi_io", "fixed_batch", "scalar_out"];
    let repo = repo_with(&all);
    let s = TestServer::start(repo.path()).await;
    let t = |name: &str, dt: &str, shape: Value| json!({"name": name, "datatype": dt, "shape": shape});
    let dtypes = [
        ("bool", "BOOL"),
        ("uint8", "UINT8"),
        ("uint16", "UINT16"),
        ("uint32", "UINT32"),
        ("uint64", "UINT64"),
        ("int8", "INT8"),
        ("int16", "INT16"),
        ("int32", "INT32"),
        ("int64", "INT64"),
        ("fp16", "FP16"),
        ("fp32", "FP32"),
        ("fp64", "FP64"),
        ("bytes", "BYTES"),
    ];
    let io = |dir: &str| -> Vec<Value> {
        dtypes
            .iter()
            .map(|(sfx, dt)| t(&format!("{dir}_{sfx}"), dt, json!([-1, 2])))
            .collect()
    };
    let want = [
        (
            "digits",
            json!(["1"]),
            vec![t("input", "FP32", json!([-1, 64]))],
            vec![
                t("label", "INT64", json!([-1])),
                t("probabilities", "FP32", json!([-1, 10])),
            ],
        ),
        (
            "mlp",
            json!([]),
            vec![t("input", "FP32", json!([-1, 784]))],
            vec![t("logits", "FP32", json!([-1, 10]))],
        ),
        ("dtypes", json!([]), io("in"), io("out")),
        (
            "multi_io",
            json!([]),
            vec![t("a", "FP32", json!([-1, 3])), t("b", "INT64", json!([-1]))],
            vec![
                t("sum", "FP32", json!([-1, 3])),
                t("scaled", "FP32", json!([-1, 3])),
                t("b_twice", "INT64", json!([-1])),
            ],
        ),
        (
            "fixed_batch",
            json!([]),
            vec![t("x", "FP32", json!([3, 2]))],
            vec![t("y", "FP32", json!([3, 2]))],
        ),
        (
            "scalar_out",
            json!([]),
            vec![t("x", "FP32", json!([-1, 4]))],
            vec![t("total", "FP32", json!([-1]))],
        ),
    ];
    for (name, versions, inputs, outputs) in want {
        let (st, meta) = s.get(&format!("/v2/models/{name}")).await;
        assert_eq!(st, 200, "{meta}");
        let expected = json!({"name": name, "versions": versions, "platform": "onnxruntime_onnx",
            "inputs": inputs, "outputs": outputs});
        assert_eq!(meta, expected, "metadata of {name}");
    }
    let (st, meta) = s.get("/v2/models/digits/versions/1").await;
    assert_eq!(
        (st, &meta["name"], &meta["versions"]),
        (200, &json!("digits"), &json!(["1"]))
    );
    s.stop().await.unwrap();
}

#[tokio::test]
async fn server_metadata_and_health() {
    let repo = repo_with(&["digits"]);
    let s = TestServer::start(repo.path()).await;
    let (st, meta) = s.get("/v2").await;
    assert_eq!(st, 200, "{meta}");
    assert_eq!(meta["name"], "sluice");
    assert_eq!(meta["version"], env!("CARGO_PKG_VERSION"));
    assert!(
        meta["extensions"]
            .as_array()
            .unwrap()
            .contains(&json!("model_repository")),
        "{meta}"
    );
    for path in [
        "/v2/health/live",
        "/v2/health/ready",
        "/v2/models/digits/ready",
        "/v2/models/digits/versions/1/ready",
    ] {
        assert_eq!(s.get_raw(path).await, (200, String::new()), "{path}");
    }
    let (st, body) = s.get("/v2/models/nope/ready").await;
    assert_eq!(st, 404, "{body}");
    assert!(error_message(&body).contains("'nope' is not found"), "{body}");
    s.stop().await.unwrap();
}
