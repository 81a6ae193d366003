//! A repository with both layouts: `model-settings.json` folders beside
//! Triton folders (`config.pbtxt`, numbered version folders, a version
//! policy, and one with no config at all), answering over V1, V2 JSON, V2
//! binary and gRPC; and version folders added and removed while clients
//! send, with no failed request. Expected values: the fixtures' Python
//! ONNX Runtime outputs (`mlp`) and arithmetic (`scalar_out` sums a row;
//! `scalar_out_v2` doubles that).

mod common;

use std::path::Path;
use std::time::Duration;

use common::grpc::{client, infer_request};
use common::reload::{infer, mlp_request, scalar_request, scalar_version, wait_for, Clients};
use common::*;
use serde_json::{json, Value};

/// Makes the Triton folder `repo/name` with `config` (none: `None`) and the
/// given versions, each a copy of a fixture model.
fn triton_model(repo: &Path, name: &str, config: Option<&str>, versions: &[(u32, &str)]) {
    let dir = repo.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    if let Some(c) = config {
        std::fs::write(dir.join("config.pbtxt"), c).unwrap();
    }
    for (v, from) in versions {
        add_version(&dir, *v, from);
    }
}

/// Adds version `v` (a copy of fixture `from`) whole: written aside, then
/// renamed into place, as a deployment tool would.
fn add_version(dir: &Path, v: u32, from: &str) {
    let staging = dir.join(".staging");
    std::fs::create_dir_all(&staging).unwrap();
    std::fs::write(staging.join("model.onnx"), common::reload::model_bytes(from)).unwrap();
    std::fs::rename(&staging, dir.join(v.to_string())).unwrap();
}

fn sums_request() -> Value {
    json!({"inputs": [v2_input("x", "FP32", &[1, 4], json!([[1.0, 2.0, 3.0, 4.0]]))]})
}

/// The one value of output `total`.
fn total(r: &Value) -> f64 {
    flat_f64(&v2_output(r, "total")["data"])[0]
}

fn mixed_repository() -> tempfile::TempDir {
    let repo = repo_with(&["mlp"]);
    let config = "max_batch_size: 8\ndynamic_batching { max_queue_delay_microseconds: 1000 }\n";
    triton_model(
        repo.path(),
        "sums",
        Some(config),
        &[(1, "scalar_out"), (2, "scalar_out_v2")],
    );
    let pinned = format!("{config}version_policy: {{ specific {{ versions: [ 1 ] }} }}\n");
    triton_model(
        repo.path(),
        "sums_v1",
        Some(&pinned),
        &[(1, "scalar_out"), (2, "scalar_out_v2")],
    );
    triton_model(repo.path(), "bare", None, &[(3, "scalar_out")]);
    repo
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mixed_repository_answers_over_every_protocol() {
    let repo = mixed_repository();
    let s = TestServer::start(repo.path()).await;
    let (_, index) = s.post("/v2/repository/index", &json!({})).await;
    let versions: Vec<(String, String, String)> = index
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["name"].as_str().unwrap().into(),
                m["version"].as_str().unwrap_or("").into(),
                m["state"].as_str().unwrap().into(),
            )
        })
        .collect();
    let ready = |n: &str, v: &str| (n.to_string(), v.to_string(), "READY".to_string());
    for want in [ready("sums", "2"), ready("sums_v1", "1"), ready("bare", "3")] {
        assert!(versions.contains(&want), "{want:?} not in {index}");
    }

    // V2 JSON: the latest version by default; the policy's where it says so.
    for (model, want, version) in [("sums", 20.0, "2"), ("sums_v1", 10.0, "1"), ("bare", 10.0, "3")] {
        let (st, r) = s
            .post(&format!("/v2/models/{model}/infer"), &sums_request())
            .await;
        assert_eq!(st, 200, "{r}");
        assert_eq!(
            (total(&r), r["model_version"].as_str()),
            (want, Some(version)),
            "{model}: {r}"
        );
    }
    let (st, r) = s.post("/v2/models/sums/versions/2/infer", &sums_request()).await;
    assert_eq!((st, total(&r)), (200, 20.0), "{r}");
    // Version 1 is on disk but the policy (latest) does not serve it.
    let (st, r) = s.post("/v2/models/sums/versions/1/infer", &sums_request()).await;
    assert_eq!(st, 404, "{r}");
    assert!(
        error_message(&r).starts_with("Request for unknown model: 'sums' version 1 is not found"),
        "{r}"
    );
    let (body, want) = mlp_request(3);
    let a = infer(&s.client, &s.url("/v2/models/mlp/infer"), &body).await;
    common::reload::assert_mlp(&a, &want);

    // V1.
    let (st, r) = s
        .post(
            "/v1/models/sums:predict",
            &json!({"instances": [[1.0, 2.0, 3.0, 4.0]]}),
        )
        .await;
    assert_eq!((st, &r["predictions"]), (200, &json!([20.0])), "{r}");

    // V2 binary: the input as raw bytes, the output asked for as raw bytes.
    let header = json!({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4],
        "parameters": {"binary_data_size": 16}}], "outputs": [{"name": "total", "parameters": {"binary_data": true}}]})
    .to_string();
    let mut bytes = header.clone().into_bytes();
    bytes.extend([1f32, 2., 3., 4.].iter().flat_map(|x| x.to_le_bytes()));
    let r = s
        .client
        .post(s.url("/v2/models/sums_v1/infer"))
        .header("Inference-Header-Content-Length", header.len())
        .body(bytes)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let n: usize = r.headers()["inference-header-content-length"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let body = r.bytes().await.unwrap();
    assert_eq!(f32::from_le_bytes(body[n..n + 4].try_into().unwrap()), 10.0);

    // gRPC, with and without a version.
    let mut c = client(&s).await;
    for (model, version, want) in [("sums", "", 20.0f32), ("sums", "2", 20.0), ("bare", "3", 10.0)] {
        let mut req = infer_request(model, "x", &[1, 4], &[1., 2., 3., 4.]);
        req.model_version = version.into();
        let r = c.model_infer(req).await.unwrap().into_inner();
        let got = f32::from_le_bytes(r.raw_output_contents[0][..4].try_into().unwrap());
        assert_eq!(got, want, "{model} {version:?}");
    }
    let mut req = infer_request("sums", "x", &[1, 4], &[1., 2., 3., 4.]);
    req.model_version = "1".into();
    let e = c.model_infer(req).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");

    // The configuration in force: the file's, with what Triton fills in.
    let (_, config) = s.get("/v2/models/sums/config").await;
    assert_eq!(config["max_batch_size"], 8, "{config}");
    assert_eq!(
        config["dynamic_batching"]["max_queue_delay_microseconds"], 1000,
        "{config}"
    );
    assert_eq!(
        config["input"][0]["name"], "x",
        "auto-completed from the ONNX file: {config}"
    );
    assert_eq!(config["input"][0]["dims"], json!([4]), "{config}");
    assert_eq!(config["version_policy"]["latest"]["num_versions"], 1, "{config}");
    let (_, config) = s.get("/v2/models/sums_v1/config").await;
    assert_eq!(
        config["version_policy"]["specific"]["versions"],
        json!([1]),
        "{config}"
    );
    s.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn versions_added_and_removed_under_load_lose_no_request() {
    let repo = repo_with(&[]);
    triton_model(
        repo.path(),
        "sums",
        Some("max_batch_size: 8\n"),
        &[(1, "scalar_out")],
    );
    let s = TestServer::start(repo.path()).await;
    let (client_, url) = (s.client.clone(), s.url("/v2/models/sums/infer"));
    let clients = Clients::start(3, move |c, i| {
        let (client_, url) = (client_.clone(), url.clone());
        async move {
            let (body, sum) = scalar_request(c * 5 + i);
            let a = infer(&client_, &url, &body).await;
            let version = a.body["model_version"].as_str().map(str::to_string);
            (scalar_version(&a, sum), version, a)
        }
    });
    let serving = |want: &'static str| {
        let s = &s;
        async move {
            let (_, r) = s.post("/v2/models/sums/infer", &sums_request()).await;
            (r["model_version"] == want).then_some(())
        }
    };
    // A new version folder: it loads, warms, and takes over.
    add_version(&repo.path().join("sums"), 2, "scalar_out_v2");
    wait_for("version 2 to serve", || serving("2")).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Removed: the version below serves again.
    std::fs::remove_dir_all(repo.path().join("sums/2")).unwrap();
    wait_for("version 1 to serve again", || serving("1")).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    // An edit of config.pbtxt that only touches batching applies in place.
    std::fs::write(
        repo.path().join("sums/config.pbtxt"),
        "max_batch_size: 4\ndynamic_batching { max_queue_delay_microseconds: 500 }\n",
    )
    .unwrap();
    s.wait_reloads("sums", "updated", 1.0).await;
    let answers = clients.stop().await;
    let (_, config) = s.get("/v2/models/sums/config").await;
    assert_eq!(config["max_batch_size"], 4, "{config}");

    assert!(answers.len() > 20, "only {} answers", answers.len());
    let mut seen = std::collections::BTreeSet::new();
    for (value_version, label, a) in &answers {
        let v = value_version.unwrap_or_else(|| panic!("a failed or wrong answer: {} {}", a.status, a.body));
        // The version the answer names is the one that computed it.
        assert_eq!(label.as_deref(), Some(v.to_string().as_str()), "{}", a.body);
        seen.insert(v);
    }
    assert_eq!(seen, [1, 2].into(), "both versions served");
    s.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn classification_answers_the_top_classes_with_their_labels() {
    let repo = repo_with(&[]);
    let dir = repo.path().join("digits10");
    std::fs::create_dir_all(dir.join("1")).unwrap();
    std::fs::copy(
        root().join("model-repository/mlp/model.onnx"),
        dir.join("1/model.onnx"),
    )
    .unwrap();
    let labels: Vec<String> = (0..10).map(|i| format!("class-{i}")).collect();
    std::fs::write(dir.join("labels.txt"), labels.join("\n")).unwrap();
    std::fs::write(
        dir.join("config.pbtxt"),
        "max_batch_size: 8\noutput [ { name: \"logits\" data_type: TYPE_FP32 dims: [ 10 ] label_filename: \"labels.txt\" } ]\n",
    )
    .unwrap();
    let s = TestServer::start(repo.path()).await;
    // Two rows of the fixture; their top 3 from the Python ONNX Runtime logits.
    let exp = fixture("mlp_expected.json");
    let rows = json!([exp["inputs"][0], exp["inputs"][1]]);
    let want: Vec<String> = (0..2)
        .flat_map(|r| {
            let logits = flat_f64(&exp["logits"][r]);
            let mut order: Vec<usize> = (0..10).collect();
            order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
            order.into_iter().take(3).map(move |i| (logits[i], i))
        })
        .map(|(v, i)| format!("{:.6}:{i}:class-{i}", v as f32))
        .collect();
    let body = json!({"inputs": [v2_input("input", "FP32", &[2, 784], rows)],
        "outputs": [{"name": "logits", "parameters": {"classification": 3}}]});
    let (st, r) = s.post("/v2/models/digits10/infer", &body).await;
    assert_eq!(st, 200, "{r}");
    let out = v2_output(&r, "logits");
    assert_eq!(
        (&out["datatype"], &out["shape"]),
        (&json!("BYTES"), &json!([2, 3])),
        "{r}"
    );
    let got: Vec<String> = out["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    // Scores agree to the printed 6 decimals but may differ in the last one (float sums).
    for (g, w) in got.iter().zip(&want) {
        let (gs, gi) = g.split_once(':').unwrap();
        let (ws, wi) = w.split_once(':').unwrap();
        assert_eq!(gi, wi, "{got:?} vs {want:?}");
        assert!(
            (gs.parse::<f64>().unwrap() - ws.parse::<f64>().unwrap()).abs() < 1e-4,
            "{got:?} vs {want:?}"
        );
    }
    // gRPC: the same strings as raw BYTES (4-byte length prefixes).
    let mut c = client(&s).await;
    let x: Vec<f32> = flat_f64(&exp["inputs"][0]).iter().map(|&v| v as f32).collect();
    let mut req = infer_request("digits10", "input", &[1, 784], &x);
    let count = sluice::protocol::grpc::inference::InferParameter {
        parameter_choice: Some(
            sluice::protocol::grpc::inference::infer_parameter::ParameterChoice::Int64Param(1),
        ),
    };
    req.outputs.push(
        sluice::protocol::grpc::inference::model_infer_request::InferRequestedOutputTensor {
            name: "logits".into(),
            parameters: [("classification".to_string(), count)].into(),
        },
    );
    let r = c.model_infer(req).await.unwrap().into_inner();
    let raw = &r.raw_output_contents[0];
    let len = u32::from_le_bytes(raw[..4].try_into().unwrap()) as usize;
    let top = std::str::from_utf8(&raw[4..4 + len]).unwrap();
    assert!(
        top.ends_with(&format!(":{}", want[0].split_once(':').unwrap().1)),
        "{top} vs {}",
        want[0]
    );
    // A count that is not a positive integer: a 400 naming the parameter.
    let bad = json!({"inputs": [v2_input("input", "FP32", &[1, 784], json!([exp["inputs"][0]]))],
        "outputs": [{"name": "logits", "parameters": {"classification": 0}}]});
    let (st, r) = s.post("/v2/models/digits10/infer", &bad).await;
    assert_eq!(st, 400, "{r}");
    assert!(
        error_message(&r).contains("`classification` must be a positive integer"),
        "{r}"
    );
    s.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_config_edit_keeps_the_last_good_version_serving_and_says_why() {
    let repo = repo_with(&[]);
    triton_model(
        repo.path(),
        "sums",
        Some("max_batch_size: 8\n"),
        &[(1, "scalar_out")],
    );
    triton_model(
        repo.path(),
        "other",
        Some("backend: \"python\"\n"),
        &[(1, "scalar_out")],
    );
    let s = TestServer::start(repo.path()).await;
    // Another backend: listed as failed to load, naming it.
    let entry = s.wait_state("other", "UNAVAILABLE").await;
    assert!(
        entry["reason"]
            .as_str()
            .unwrap()
            .contains("`backend` is \"python\""),
        "{entry}"
    );
    // A mistake in a serving model's config: the model keeps serving, the index says why.
    std::fs::write(
        repo.path().join("sums/config.pbtxt"),
        "max_batch_size: 8\ninput [ { name: \"x\" dim: [ 4 ] } ]\n",
    )
    .unwrap();
    let entry = wait_for("the refused edit to show", || async {
        s.index_entry("sums")
            .await
            .filter(|e| e["reason"].as_str().is_some_and(|r| r.contains("line 2")))
    })
    .await;
    assert_eq!(entry["state"], "READY", "{entry}");
    assert!(
        entry["reason"]
            .as_str()
            .unwrap()
            .contains("field 'dim' not found"),
        "{entry}"
    );
    let (st, r) = s.post("/v2/models/sums/infer", &sums_request()).await;
    assert_eq!((st, total(&r)), (200, 10.0), "{r}");
    s.stop().await.unwrap();
}

/// A load with a configuration reaches a model whose name is not its
/// folder's (a `model-settings.json` `name`), and the model keeps its name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_override_applies_to_a_model_named_apart_from_its_folder() {
    let repo = repo_with(&[]);
    add_model(repo.path(), "scalar_out", "folder", r#"{"name": "named"}"#);
    let s = TestServer::start(repo.path()).await;
    let config = json!({"parameters": {"config": "{\"max_batch_size\": 4}"}});
    let (st, r) = s.post("/v2/repository/models/named/load", &config).await;
    assert_eq!(st, 200, "{r}");
    let (st, c) = s.get("/v2/models/named/config").await;
    assert_eq!((st, &c["max_batch_size"]), (200, &json!(4)), "{c}");
    let (st, r) = s.post("/v2/models/named/infer", &sums_request()).await;
    assert_eq!((st, total(&r)), (200, 10.0), "{r}");
    s.stop().await.unwrap();
}

/// `version_policy { all {} }`: every version folder serves on its own
/// batcher, each reached by its number, and a request without one reaches
/// the highest that serves (Triton's choice). Versions added and removed
/// while clients send to version 1 and to no version lose no request, and
/// every answer names the version that computed it (version 3 is a copy of
/// `scalar_out`, so it answers the sum; version 2 answers twice it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_versions_serve_side_by_side_and_come_and_go_under_load() {
    let repo = repo_with(&[]);
    let config = "max_batch_size: 8\nversion_policy: { all { } }\n";
    triton_model(
        repo.path(),
        "sums",
        Some(config),
        &[(1, "scalar_out"), (2, "scalar_out_v2")],
    );
    let s = TestServer::start(repo.path()).await;
    let (body, sum) = scalar_request(3);
    for (url, want, times) in [
        ("/v2/models/sums/versions/1/infer", "1", 1.0),
        ("/v2/models/sums/versions/2/infer", "2", 2.0),
        ("/v2/models/sums/infer", "2", 2.0),
    ] {
        let (status, r) = s.post(url, &body).await;
        assert_eq!(status, 200, "{url}: {r}");
        assert_eq!(r["model_version"], want, "{url}: {r}");
        assert_eq!(total(&r), times * sum, "{url}: {r}");
    }
    let (_, meta) = s.get("/v2/models/sums").await;
    assert_eq!(meta["versions"], json!(["1", "2"]), "{meta}");
    // Each version's batches are its own series (Triton's `version` label).
    let text = s.metrics().await;
    for version in ["1", "2"] {
        let labels = [("model", "sums"), ("version", version)];
        let batches = common::reload::metric_value(&text, "sluice_batch_size_count", &labels);
        assert!(batches >= 1.0, "version {version}: {batches} batches");
    }
    let (_, index) = s.post("/v2/repository/index", &json!({})).await;
    let listed: Vec<(String, String)> = index
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["version"].as_str().unwrap().to_string(),
                e["state"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        listed,
        [("1".into(), "READY".into()), ("2".into(), "READY".into())],
        "{index}"
    );
    // gRPC reaches a version by `model_version`.
    let mut g = client(&s).await;
    for (version, want) in [("1", 10.0f32), ("2", 20.0)] {
        let mut req = infer_request("sums", "x", &[1, 4], &[1., 2., 3., 4.]);
        req.model_version = version.into();
        let r = g.model_infer(req).await.unwrap().into_inner();
        assert_eq!(r.model_version, version);
        let got = f32::from_le_bytes(r.raw_output_contents[0][..4].try_into().unwrap());
        assert_eq!(got, want, "version {version}");
    }

    let (client_, base) = (s.client.clone(), s.url("/v2/models/sums"));
    let clients = Clients::start(3, move |c, i| {
        let (client_, base) = (client_.clone(), base.clone());
        async move {
            let url = match c {
                0 => format!("{base}/versions/1/infer"),
                _ => format!("{base}/infer"),
            };
            let (body, sum) = scalar_request(c * 5 + i);
            let a = infer(&client_, &url, &body).await;
            let label = a.body["model_version"].as_str().unwrap_or("").to_string();
            // Versions 1 and 3 answer the sum, version 2 twice it.
            let want = match label.as_str() {
                "1" | "3" => Some(1),
                "2" => Some(2),
                _ => None,
            };
            let right = want.is_some() && scalar_version(&a, sum) == want;
            (c == 0, label, right, a)
        }
    });
    let serving = |want: &'static str| {
        let s = &s;
        async move {
            let (_, r) = s.post("/v2/models/sums/infer", &sums_request()).await;
            (r["model_version"] == want).then_some(())
        }
    };
    add_version(&repo.path().join("sums"), 3, "scalar_out");
    wait_for("version 3 to serve", || serving("3")).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    std::fs::remove_dir_all(repo.path().join("sums/2")).unwrap();
    wait_for("version 2 to go", || async {
        let (status, _) = s.get("/v2/models/sums/versions/2/ready").await;
        (status == 404).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    std::fs::remove_dir_all(repo.path().join("sums/3")).unwrap();
    wait_for("version 1 to serve requests without a version", || serving("1")).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let answers = clients.stop().await;

    assert!(answers.len() > 20, "only {} answers", answers.len());
    let mut seen = std::collections::BTreeSet::new();
    for (pinned, label, right, a) in &answers {
        assert!(right, "a failed or wrong answer: {} {}", a.status, a.body);
        if *pinned {
            assert_eq!(label, "1", "a request for version 1: {}", a.body);
        }
        seen.insert(label.clone());
    }
    assert_eq!(
        seen,
        ["1", "2", "3"].map(String::from).into(),
        "every version served"
    );
    let (_, meta) = s.get("/v2/models/sums").await;
    assert_eq!(meta["versions"], json!(["1"]), "{meta}");

    // A broken config.pbtxt keeps the versions serving, with why.
    std::fs::write(repo.path().join("sums/config.pbtxt"), "max_batch_size: [\n").unwrap();
    wait_for("the refused edit to be noted", || async {
        let (_, index) = s.post("/v2/repository/index", &json!({})).await;
        let reason = index[0]["reason"].as_str().unwrap_or("").to_string();
        reason.contains("config.pbtxt").then_some(())
    })
    .await;
    let (status, r) = s.post("/v2/models/sums/versions/1/infer", &body).await;
    assert_eq!((status, total(&r)), (200, sum), "{r}");
    s.stop().await.unwrap();
}

/// `reshape`: clients send and get the config's `dims`, the model has
/// `reshape.shape` (Triton's way to serve an output of shape `[N]` under
/// dims `[1]`). Expected values: each row's sum (`scalar_out`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reshape_serves_the_configs_dims_over_the_models_shapes() {
    let repo = repo_with(&[]);
    let config = r#"max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ 2, 2 ] reshape: { shape: [ 4 ] } } ]
output [ { name: "total" data_type: TYPE_FP32 dims: [ 1 ] reshape: { shape: [ ] } } ]
"#;
    triton_model(repo.path(), "shaped", Some(config), &[(1, "scalar_out")]);
    let s = TestServer::start(repo.path()).await;
    let (_, meta) = s.get("/v2/models/shaped").await;
    assert_eq!(meta["inputs"][0]["shape"], json!([-1, 2, 2]), "{meta}");
    assert_eq!(meta["outputs"][0]["shape"], json!([-1, 1]), "{meta}");
    let body = json!({"inputs": [v2_input("x", "FP32", &[2, 2, 2], json!([[[1.0, 2.0], [3.0, 4.0]], [[5.0, 6.0], [7.0, 8.0]]]))]});
    let (status, r) = s.post("/v2/models/shaped/infer", &body).await;
    assert_eq!(status, 200, "{r}");
    let out = v2_output(&r, "total");
    assert_eq!(out["shape"], json!([2, 1]), "{r}");
    assert_eq!(flat_f64(&out["data"]), [10.0, 26.0], "{r}");
    // The model's own shape is not what clients send: refused, naming the dims.
    let wrong = json!({"inputs": [v2_input("x", "FP32", &[1, 4], json!([[1.0, 2.0, 3.0, 4.0]]))]});
    let (status, r) = s.post("/v2/models/shaped/infer", &wrong).await;
    assert_eq!(status, 400, "{r}");
    assert!(
        r["error"]
            .as_str()
            .unwrap()
            .contains("does not fit its dims [2, 2]"),
        "{r}"
    );
    // gRPC: the same shapes.
    let mut g = client(&s).await;
    let mut req = infer_request("shaped", "x", &[1, 2, 2], &[1., 2., 3., 4.]);
    req.model_version = String::new();
    let r = g.model_infer(req).await.unwrap().into_inner();
    assert_eq!(r.outputs[0].shape, [1, 1]);
    assert_eq!(
        f32::from_le_bytes(r.raw_output_contents[0][..4].try_into().unwrap()),
        10.0
    );
    s.stop().await.unwrap();
}

/// Every file a configuration names stays inside the model folder, whether
/// the configuration is in the repository or sent through the load API: a
/// `label_filename`, `default_model_filename` or `data_file` that is
/// absolute or climbs out with `..` fails the load naming the field, and
/// nothing outside is read (a secret beside the repository never reaches a
/// classification answer).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_a_configuration_names_stay_inside_the_model_folder() {
    let top = tempfile::tempdir().unwrap();
    let repo = top.path().join("repo");
    std::fs::create_dir_all(&repo).unwrap();
    let secret = top.path().join("secret.txt");
    std::fs::write(
        &secret,
        (0..10).map(|i| format!("SECRET-{i}\n")).collect::<String>(),
    )
    .unwrap();
    let onnx = root().join("model-repository/mlp/model.onnx");
    std::fs::copy(&onnx, top.path().join("model.onnx")).unwrap();
    let output = |file: &str| {
        format!("max_batch_size: 8\noutput [ {{ name: \"logits\" data_type: TYPE_FP32 dims: [ 10 ] label_filename: \"{file}\" }} ]\n")
    };
    let bad = [
        (
            "labels_abs",
            output(&secret.display().to_string()),
            "label_filename",
        ),
        ("labels_up", output("../../secret.txt"), "label_filename"),
        (
            "file_abs",
            format!(
                "max_batch_size: 8\ndefault_model_filename: \"{}\"\n",
                top.path().join("model.onnx").display()
            ),
            "default_model_filename",
        ),
        (
            "file_up",
            "max_batch_size: 8\ndefault_model_filename: \"../../model.onnx\"\n".to_string(),
            "default_model_filename",
        ),
    ];
    for (name, config, _) in &bad {
        let dir = repo.join(name);
        std::fs::create_dir_all(dir.join("1")).unwrap();
        std::fs::copy(&onnx, dir.join("1/model.onnx")).unwrap();
        std::fs::write(dir.join("config.pbtxt"), config).unwrap();
    }
    let good = repo.join("good");
    std::fs::create_dir_all(good.join("1")).unwrap();
    std::fs::copy(&onnx, good.join("1/model.onnx")).unwrap();
    std::fs::write(
        good.join("labels.txt"),
        (0..10).map(|i| format!("class-{i}\n")).collect::<String>(),
    )
    .unwrap();
    std::fs::write(good.join("config.pbtxt"), output("labels.txt")).unwrap();
    let s = TestServer::start_loaded(&repo, |_| {}).await;
    let (_, index) = s.post("/v2/repository/index", &json!({})).await;
    for (name, _, field) in &bad {
        let entry = index
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == *name)
            .unwrap();
        let reason = entry["reason"].as_str().unwrap_or("");
        assert_ne!(entry["state"], "READY", "{entry}");
        assert!(
            reason.contains(field) && reason.contains("must name a file inside the model folder"),
            "{name}: {entry}"
        );
    }
    // The load API's `config` override is held to the same rule.
    for file in [secret.display().to_string(), "../../secret.txt".to_string()] {
        let override_ = json!({"output": [{"name": "logits", "data_type": "TYPE_FP32", "dims": [10], "label_filename": file}]});
        let body = json!({"parameters": {"config": override_.to_string()}});
        let (st, r) = s.post("/v2/repository/models/good/load", &body).await;
        assert_eq!(st, 400, "{r}");
        assert!(error_message(&r).contains("label_filename"), "{r}");
    }
    // The good model still classifies with its own labels, never the secret's.
    let exp = fixture("mlp_expected.json");
    let body = json!({"inputs": [v2_input("input", "FP32", &[1, 784], json!([exp["inputs"][0]]))],
                      "outputs": [{"name": "logits", "parameters": {"classification": 3}}]});
    let (st, r) = s.post("/v2/models/good/infer", &body).await;
    assert_eq!(st, 200, "{r}");
    let text = r.to_string();
    assert!(text.contains("class-") && !text.contains("SECRET"), "{r}");
    s.stop().await.unwrap();
}
