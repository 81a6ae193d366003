//! The folder layouts that KServe and ModelMesh hand to a server, end to end
//! against real ONNX Runtime: KServe's `/mnt/models` (the model file itself,
//! no settings) served with a model name; a bare folder with one `*.onnx`
//! loaded through the repository API as KServe's multi-model agent does;
//! MLServer's own `model-settings.json` fields (ModelMesh's adapter writes
//! them), with a declared signature checked against the ONNX file; and an
//! absolute `parameters.uri`, inside and outside the repository.

mod common;
use common::*;
use serde_json::{json, Value};

/// Digits rows 0..4 through V2 on `model`: labels equal the fixture's
/// (computed by scikit-learn when the fixtures were made).
async fn assert_digits_correct(s: &TestServer, model: &str) {
    let exp = fixture("digits_expected.json");
    let rows: Vec<Value> = exp["inputs"].as_array().unwrap()[..4].to_vec();
    let body = json!({"inputs": [v2_input("input", "FP32", &[4, 64], json!(rows))]});
    let (st, r) = s.post(&format!("/v2/models/{model}/infer"), &body).await;
    assert_eq!(st, 200, "{r}");
    let want: Vec<Value> = exp["labels"].as_array().unwrap()[..4].to_vec();
    assert_eq!(v2_output(&r, "label")["data"], json!(want));
}

fn digits_onnx() -> std::path::PathBuf {
    root().join("model-repository/digits/model.onnx")
}

fn unavailable_reason(index: &std::collections::BTreeMap<String, Value>, model: &str) -> String {
    let e = &index[model];
    assert_eq!(e["state"], "UNAVAILABLE", "{e}");
    e["reason"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn kserve_mnt_models_the_file_itself_served_under_the_model_name() {
    // The storage initializer leaves only the model file, under any name.
    let mnt = tempfile::tempdir().unwrap();
    std::fs::copy(digits_onnx(), mnt.path().join("digits-classifier.onnx")).unwrap();
    let s = TestServer::start_with(mnt.path(), |c| {
        c.model_repository.model_name = Some("sklearn-digits".into());
    })
    .await;
    let index = s.index().await;
    assert_eq!(index.keys().collect::<Vec<_>>(), ["sklearn-digits"]);
    assert_eq!(index["sklearn-digits"]["state"], "READY");
    assert_digits_correct(&s, "sklearn-digits").await;
    // KServe V1 under the same name.
    let exp = fixture("digits_expected.json");
    let (st, r) = s
        .post(
            "/v1/models/sklearn-digits:predict",
            &json!({"instances": [exp["inputs"][5]]}),
        )
        .await;
    assert_eq!(st, 200, "{r}");
    assert_eq!(r["predictions"][0]["label"], exp["labels"][5]);

    // A model-settings.json beside it applies (its `name` gives way to the model name).
    std::fs::write(
        mnt.path().join("model-settings.json"),
        r#"{"name": "digits", "max_batch_size": 8}"#,
    )
    .unwrap();
    let (st, r) = s
        .post("/v2/repository/models/sklearn-digits/load", &json!({}))
        .await;
    assert_eq!(st, 200, "{r}");
    let (st, cfg) = s.get("/v2/models/sklearn-digits/config").await;
    assert_eq!((st, &cfg["max_batch_size"]), (200, &json!(8)), "{cfg}");
    s.stop().await.unwrap();
}

#[tokio::test]
async fn kserve_mnt_models_without_a_model_file_says_so() {
    let mnt = tempfile::tempdir().unwrap();
    std::fs::write(mnt.path().join("README"), "no model here").unwrap();
    let s = TestServer::start_loaded(mnt.path(), |c| c.model_repository.model_name = Some("m".into())).await;
    let why = unavailable_reason(&s.index().await, "m");
    assert!(why.contains("no model.onnx, no other *.onnx file"), "{why}");
    // Its one model cannot serve: the server is not ready (KServe's probe).
    assert_eq!(s.get("/v2/health/ready").await.0, 503);
    s.stop().await.unwrap();
}

/// Single-model mode (`--model-name`, KServe's layout): server readiness,
/// REST and gRPC, is the model's. Garbage, an empty file and bad settings
/// JSON each keep the server unready; a model that serves makes it ready.
#[tokio::test]
async fn kserve_mnt_models_readiness_is_the_one_models() {
    use common::grpc::client;
    use sluice::protocol::grpc::inference::ServerReadyRequest;
    let bad: [(&str, &[u8]); 3] = [
        ("model.onnx", b"not an onnx file"),
        ("model.onnx", b""),
        ("model-settings.json", b"{not json"),
    ];
    for (file, bytes) in bad {
        let mnt = tempfile::tempdir().unwrap();
        if file == "model-settings.json" {
            std::fs::copy(digits_onnx(), mnt.path().join("model.onnx")).unwrap();
        }
        std::fs::write(mnt.path().join(file), bytes).unwrap();
        let s =
            TestServer::start_loaded(mnt.path(), |c| c.model_repository.model_name = Some("m".into())).await;
        assert_eq!(s.index().await["m"]["state"], "UNAVAILABLE", "{file}");
        assert_eq!(s.get("/v2/health/ready").await.0, 503, "{file} {bytes:?}");
        let ready = client(&s)
            .await
            .server_ready(ServerReadyRequest {})
            .await
            .unwrap();
        assert!(!ready.into_inner().ready, "gRPC ServerReady with a broken {file}");
        // Fixing it makes the server ready, without a restart.
        std::fs::remove_file(mnt.path().join(file)).unwrap();
        std::fs::copy(digits_onnx(), mnt.path().join("model.onnx")).unwrap();
        let (st, r) = s.post("/v2/repository/models/m/load", &json!({})).await;
        assert_eq!(st, 200, "{r}");
        assert_eq!(s.get("/v2/health/ready").await.0, 200);
        assert!(
            client(&s)
                .await
                .server_ready(ServerReadyRequest {})
                .await
                .unwrap()
                .into_inner()
                .ready
        );
        s.stop().await.unwrap();
    }
}

/// A repository of several models: ready once loaded though one failed
/// (Triton's default); with `strict_readiness`, not ready while one failed.
#[tokio::test]
async fn strict_readiness_needs_every_model() {
    let repo = repo_with(&["scalar_out", "broken"]);
    let s = TestServer::start_loaded(repo.path(), |_| {}).await;
    assert_eq!(s.get("/v2/health/ready").await.0, 200);
    s.stop().await.unwrap();
    let s = TestServer::start_loaded(repo.path(), |c| c.model_repository.strict_readiness = true).await;
    assert_eq!(s.index().await["broken"]["state"], "UNAVAILABLE");
    assert_eq!(s.get("/v2/health/ready").await.0, 503);
    // Unloading the broken one through the API leaves only models that serve.
    let (st, r) = s.post("/v2/repository/models/broken/unload", &json!({})).await;
    assert_eq!(st, 200, "{r}");
    assert_eq!(s.get("/v2/health/ready").await.0, 200);
    s.stop().await.unwrap();
}

#[tokio::test]
async fn bare_folder_loaded_and_unloaded_by_the_multi_model_agent() {
    let repo = tempfile::tempdir().unwrap();
    // The agent's folders appear while the server runs, then it calls load.
    let s = TestServer::start_with(repo.path(), |c| {
        c.model_repository.watch = sluice::config::WatchMode::Off;
    })
    .await;
    assert!(s.index().await.is_empty());
    let dir = repo.path().join("digits-v3");
    std::fs::create_dir(&dir).unwrap();
    std::fs::copy(digits_onnx(), dir.join("weights.onnx")).unwrap();
    let (st, r) = s.post("/v2/repository/models/digits-v3/load", &json!({})).await;
    assert_eq!(st, 200, "{r}");
    assert_digits_correct(&s, "digits-v3").await;
    // Default settings: the server-wide max_batch_size.
    let (_, cfg) = s.get("/v2/models/digits-v3/config").await;
    assert_eq!(cfg["max_batch_size"], 32, "{cfg}");
    let (st, r) = s.post("/v2/repository/models/digits-v3/unload", &json!({})).await;
    assert_eq!(st, 200, "{r}");
    let (st, _) = s.get("/v2/models/digits-v3/ready").await;
    assert_ne!(st, 200);

    // Two ONNX files and no settings: which one is meant cannot be guessed.
    let two = repo.path().join("two");
    std::fs::create_dir(&two).unwrap();
    std::fs::copy(digits_onnx(), two.join("a.onnx")).unwrap();
    std::fs::copy(digits_onnx(), two.join("b.onnx")).unwrap();
    let (st, r) = s.post("/v2/repository/models/two/load", &json!({})).await;
    assert_eq!(st, 400, "{r}");
    let msg = error_message(&r);
    assert!(
        msg.contains("2 ONNX files") && msg.contains("parameters.uri"),
        "{msg}"
    );
    s.stop().await.unwrap();
}

#[tokio::test]
async fn mlserver_adapter_fields_are_accepted_and_a_declared_signature_is_checked() {
    let repo = tempfile::tempdir().unwrap();
    let adapter = |inputs: &str| {
        format!(
            r#"{{"name": "{{}}", "implementation": "mlserver_onnx.OnnxModel", "parallel_workers": 1,
                "parameters": {{"uri": "model.onnx", "version": "2", "content_type": "np", "format": "onnx"}},
                "inputs": {inputs},
                "outputs": [{{"name": "label", "datatype": "INT64", "shape": [-1]}},
                            {{"name": "probabilities", "datatype": "FP32", "shape": [-1, 10]}}]}}"#
        )
    };
    let good = adapter(r#"[{"name": "input", "datatype": "FP32", "shape": [-1, 64]}]"#);
    add_model(repo.path(), "digits", "declared", &good.replace("{}", "declared"));
    let wrong_dtype = adapter(r#"[{"name": "input", "datatype": "FP64", "shape": [-1, 64]}]"#);
    add_model(
        repo.path(),
        "digits",
        "wrong-dtype",
        &wrong_dtype.replace("{}", "wrong-dtype"),
    );
    let wrong_name = adapter(r#"[{"name": "pixels", "datatype": "FP32", "shape": [64]}]"#);
    add_model(
        repo.path(),
        "digits",
        "wrong-name",
        &wrong_name.replace("{}", "wrong-name"),
    );
    // A real unknown field is still an error.
    add_model(repo.path(), "digits", "typo", r#"{"implementaton": "x"}"#);
    let s = TestServer::start(repo.path()).await;
    let index = s.index().await;
    assert_eq!(
        index["declared"],
        json!({"name": "declared", "version": "2", "state": "READY"})
    );
    assert_digits_correct(&s, "declared").await;
    let why = unavailable_reason(&index, "wrong-dtype");
    assert!(
        why.contains("`inputs[0].datatype` of `input` is FP64, but the ONNX file says FP32"),
        "{why}"
    );
    let why = unavailable_reason(&index, "wrong-name");
    assert!(
        why.contains(
            "`inputs[0]` declares `pixels`, which the ONNX file does not have (its inputs: `input`)"
        ),
        "{why}"
    );
    let why = unavailable_reason(&index, "typo");
    assert!(
        why.contains("`implementaton` is an unknown field (did you mean `implementation`?)"),
        "{why}"
    );
    s.stop().await.unwrap();
}

#[tokio::test]
async fn absolute_uri_inside_the_repository_serves_and_outside_is_refused() {
    let repo = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    // ModelMesh's adapter points at the file by its absolute path.
    let shared = repo.path().join("shared-files");
    std::fs::create_dir(&shared).unwrap();
    std::fs::copy(digits_onnx(), shared.join("digits.onnx")).unwrap();
    std::fs::copy(digits_onnx(), elsewhere.path().join("digits.onnx")).unwrap();
    let uri = |p: &std::path::Path| format!(r#"{{"parameters": {{"uri": "{}"}}}}"#, p.display());
    let inside = repo.path().join("inside");
    std::fs::create_dir(&inside).unwrap();
    std::fs::write(
        inside.join("model-settings.json"),
        uri(&shared.join("digits.onnx")),
    )
    .unwrap();
    let outside = repo.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(
        outside.join("model-settings.json"),
        uri(&elsewhere.path().join("digits.onnx")),
    )
    .unwrap();
    let s = TestServer::start(repo.path()).await;
    let index = s.index().await;
    assert_eq!(index["inside"]["state"], "READY", "{:?}", index["inside"]);
    assert_digits_correct(&s, "inside").await;
    let why = unavailable_reason(&index, "outside");
    assert!(
        why.contains("is outside the model repository") && why.contains("parameters.uri"),
        "{why}"
    );
    // The folder holding the shared file has one *.onnx and no settings: a model too.
    assert_eq!(index["shared-files"]["state"], "READY");
    s.stop().await.unwrap();
}
