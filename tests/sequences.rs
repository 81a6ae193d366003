//! Sequence models (Triton's sequence batcher) against a real server:
//! Triton's `simple_dyna_sequence` example (its ONNX file and config, which
//! declares START, END, READY and CORRID control inputs) streamed over gRPC
//! by several interleaved sequences, each answer equal to Python ONNX
//! Runtime running that request alone with the control values Triton's
//! documentation gives (START 1 on the first request, END 1 on the last,
//! READY 1 on each, CORRID the sequence id); and the mistakes, each over
//! REST and gRPC: sequence parameters sent to a model that has none, a
//! sequence's first request without `sequence_start`, a sequence that sat
//! idle past its timeout, more live sequences than the model allows.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::grpc::{client, infer_request};
use common::reload::wait_for;
use common::*;
use serde_json::{json, Value};
use sluice::protocol::grpc::inference::{
    infer_parameter::ParameterChoice, InferParameter, ModelInferRequest,
};
use tokio_stream::StreamExt;

const EXAMPLES: &str = "tests/fixtures/triton/model_repository";

/// A repository with Triton's `simple` and `simple_dyna_sequence`, the
/// latter's config with each (as shipped, as run) replacement made (a
/// shorter idle timeout, a lower bound on live sequences).
/// `name`: the sequence model's folder and name (metrics are per name, and
/// the tests of this file share a process).
fn repository(name: &str, replace: &[(&str, &str)]) -> tempfile::TempDir {
    let repo = repo_with(&[]);
    copy_dir(&root().join(EXAMPLES).join("simple"), &repo.path().join("simple"));
    copy_dir(
        &root().join(EXAMPLES).join("simple_dyna_sequence"),
        &repo.path().join(name),
    );
    let config = repo.path().join(name).join("config.pbtxt");
    let mut text = std::fs::read_to_string(&config).unwrap();
    text = text.replace("name: \"simple_dyna_sequence\"", &format!("name: \"{name}\""));
    for (from, to) in replace {
        assert!(text.contains(from), "{from} is not in the example's config");
        text = text.replace(from, to);
    }
    std::fs::write(&config, text).unwrap();
    repo
}

/// Python ONNX Runtime on the model file, each row its own run:
/// (INPUT, START, END, READY, CORRID) → OUTPUT.
fn expected(model: &Path, rows: &[(i32, i32, i32, i32, u64)]) -> Vec<i32> {
    let script = r#"
import json, sys
import numpy as np
import onnxruntime as ort
s = ort.InferenceSession(sys.argv[1], providers=["CPUExecutionProvider"])
out = []
for v, start, end, ready, corrid in json.loads(sys.stdin.read()):
    feed = {"INPUT": np.array([[v]], np.int32), "START": np.array([[start]], np.int32),
            "END": np.array([[end]], np.int32), "READY": np.array([[ready]], np.int32),
            "CORRID": np.array([[corrid]], np.uint64)}
    out.append(int(s.run(["OUTPUT"], feed)[0][0][0]))
print(json.dumps(out))
"#;
    use std::io::Write;
    let mut child = Command::new(python())
        .args(["-c", script, model.to_str().unwrap()])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let input = serde_json::to_string(
        &rows
            .iter()
            .map(|r| json!([r.0, r.1, r.2, r.3, r.4]))
            .collect::<Vec<_>>(),
    )
    .unwrap();
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn int32_request(model: &str, v: i32) -> ModelInferRequest {
    let mut r = infer_request(model, "INPUT", &[1, 1], &[]);
    r.inputs[0].datatype = "INT32".into();
    r.raw_input_contents = vec![v.to_le_bytes().to_vec().into()];
    r
}

fn sequence(r: &mut ModelInferRequest, id: u64, start: bool, end: bool) {
    let p = |c| InferParameter {
        parameter_choice: Some(c),
    };
    r.parameters
        .insert("sequence_id".into(), p(ParameterChoice::Uint64Param(id)));
    r.parameters
        .insert("sequence_start".into(), p(ParameterChoice::BoolParam(start)));
    r.parameters
        .insert("sequence_end".into(), p(ParameterChoice::BoolParam(end)));
}

fn output(r: &sluice::protocol::grpc::inference::ModelInferResponse) -> i32 {
    i32::from_le_bytes(r.raw_output_contents[0][..4].try_into().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_inputs_are_filled_for_interleaved_sequences_on_a_stream() {
    let repo = repository("simple_dyna_sequence", &[]);
    let s = TestServer::start(repo.path()).await;
    let values = [11, 7, 5, 3, 2, 0, 1];
    // Three sequences, their requests interleaved on one stream.
    let ids = [1000u64, 1001, 77];
    let mut sent = Vec::new();
    let mut rows = Vec::new();
    for (k, v) in values.iter().enumerate() {
        for (j, id) in ids.iter().enumerate() {
            let value = v * (j as i32 + 1);
            let (start, end) = (k == 0, k == values.len() - 1);
            let mut r = int32_request("simple_dyna_sequence", value);
            sequence(&mut r, *id, start, end);
            r.id = format!("{id}_{k}");
            sent.push(r);
            rows.push((value, start as i32, end as i32, 1, *id));
        }
    }
    let want = expected(&repo.path().join("simple_dyna_sequence/1/model.onnx"), &rows);
    let mut g = client(&s).await;
    let mut answers = g
        .model_stream_infer(tokio_stream::iter(sent.clone()))
        .await
        .unwrap()
        .into_inner();
    let mut got = std::collections::HashMap::new();
    while let Some(a) = answers.next().await {
        let a = a.unwrap();
        assert!(a.error_message.is_empty(), "{}", a.error_message);
        let r = a.infer_response.unwrap();
        got.insert(r.id.clone(), output(&r));
        if got.len() == sent.len() {
            break;
        }
    }
    for (r, want) in sent.iter().zip(&want) {
        assert_eq!(got.get(&r.id), Some(want), "request {}", r.id);
    }
    // Every sequence ended with its end flag.
    let text = s.metrics().await;
    let ended = common::reload::metric_value(
        &text,
        "sluice_sequences_ended_total",
        &[("model", "simple_dyna_sequence"), ("reason", "end")],
    );
    assert_eq!(ended, 3.0);
    assert_eq!(
        common::reload::metric_value(
            &text,
            "sluice_sequences_live",
            &[("model", "simple_dyna_sequence")]
        ),
        0.0
    );
    s.stop().await.unwrap();
}

/// A REST request of `simple_dyna_sequence` with sequence parameters.
fn rest(v: i32, params: Value) -> Value {
    json!({
        "inputs": [v2_input("INPUT", "INT32", &[1, 1], json!([[v]]))],
        "parameters": params,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sequence_mistakes_are_refused_over_rest_and_grpc() {
    let repo = repository(
        "dyna_limits",
        &[
            (
                "max_sequence_idle_microseconds: 10000000",
                "max_sequence_idle_microseconds: 300000",
            ),
            ("max_candidate_sequences: 1024", "max_candidate_sequences: 2"),
        ],
    );
    let s = TestServer::start(repo.path()).await;
    let mut g = client(&s).await;
    let url = "/v2/models/dyna_limits/infer";
    let (_, meta) = s.get("/v2").await;
    for ext in ["sequence", "sequence(string_id)"] {
        assert!(
            meta["extensions"].as_array().unwrap().contains(&json!(ext)),
            "{meta}"
        );
    }

    // Sequence parameters on a model that has none.
    let simple = json!({"inputs": [
        v2_input("INPUT0", "INT32", &[1, 16], json!([vec![0; 16]])),
        v2_input("INPUT1", "INT32", &[1, 16], json!([vec![0; 16]])),
    ], "parameters": {"sequence_id": 5, "sequence_start": true}});
    let (status, r) = s.post("/v2/models/simple/infer", &simple).await;
    assert_eq!(status, 400, "{r}");
    assert!(
        error_message(&r).contains("not a sequence model") && error_message(&r).contains("`sequence_id`"),
        "{r}"
    );
    let mut req = infer_request("simple", "INPUT0", &[1, 16], &[]);
    req.inputs[0].datatype = "INT32".into();
    let mut second = req.inputs[0].clone();
    second.name = "INPUT1".into();
    req.inputs.push(second);
    req.raw_input_contents = vec![vec![0u8; 64].into(), vec![0u8; 64].into()];
    sequence(&mut req, 5, true, false);
    let e = g.model_infer(req).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("`sequence_id`"), "{e:?}");

    // A first request without sequence_start, and a request with no id.
    let (status, r) = s.post(url, &rest(1, json!({"sequence_id": 9}))).await;
    assert_eq!(status, 400, "{r}");
    let want = "inference request for sequence 9 to model 'dyna_limits' must specify the START flag on the first request of the sequence";
    assert!(error_message(&r).contains(want), "{r}");
    let mut req = int32_request("dyna_limits", 1);
    sequence(&mut req, 9, false, false);
    let e = g.model_infer(req).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains(want), "{e:?}");
    let (status, r) = s.post(url, &rest(1, json!({}))).await;
    assert_eq!(status, 400, "{r}");
    assert!(error_message(&r).contains("needs parameter `sequence_id`"), "{r}");

    // Two live sequences are the most: a third start is refused (503), an
    // end makes room.
    for id in [1, 2] {
        let (status, r) = s
            .post(url, &rest(1, json!({"sequence_id": id, "sequence_start": true})))
            .await;
        assert_eq!(status, 200, "{r}");
    }
    let (status, r) = s
        .post(url, &rest(1, json!({"sequence_id": 3, "sequence_start": true})))
        .await;
    assert_eq!(status, 503, "{r}");
    assert!(error_message(&r).contains("2 sequences are live"), "{r}");
    let mut req = int32_request("dyna_limits", 1);
    sequence(&mut req, 3, true, false);
    let e = g.model_infer(req).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
    let (status, r) = s
        .post(url, &rest(1, json!({"sequence_id": 2, "sequence_end": true})))
        .await;
    assert_eq!(status, 200, "{r}");
    let (status, r) = s
        .post(url, &rest(1, json!({"sequence_id": 3, "sequence_start": true})))
        .await;
    assert_eq!(status, 200, "{r}");
    let (status, r) = s
        .post(url, &rest(1, json!({"sequence_id": 1, "sequence_end": true})))
        .await;
    assert_eq!(status, 200, "{r}");

    // Idle past the timeout (0.3 s): the sequence is ended, its next
    // request refused naming why; a string id over gRPC the same.
    let mut req = int32_request("dyna_limits", 1);
    req.parameters.insert(
        "sequence_id".into(),
        InferParameter {
            parameter_choice: Some(ParameterChoice::StringParam("41".into())),
        },
    );
    req.parameters.insert(
        "sequence_start".into(),
        InferParameter {
            parameter_choice: Some(ParameterChoice::BoolParam(true)),
        },
    );
    g.model_infer(req.clone()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    let (status, r) = s.post(url, &rest(1, json!({"sequence_id": 3}))).await;
    assert_eq!(status, 400, "{r}");
    assert!(error_message(&r).contains("the sequence timed out"), "{r}");
    req.parameters.remove("sequence_start");
    let e = g.model_infer(req).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("timed out"), "{e:?}");
    let text = s.metrics().await;
    let idle = common::reload::metric_value(
        &text,
        "sluice_sequences_ended_total",
        &[("model", "dyna_limits"), ("reason", "idle")],
    );
    assert!(idle >= 2.0, "{idle} ended idle");

    // Abandoned sequences end on their own, without waiting for a start:
    // none is live a few idle timeouts later, and the gauge says so.
    for id in 100..120 {
        let (status, r) = s
            .post(url, &rest(1, json!({"sequence_id": id, "sequence_start": true})))
            .await;
        assert!(status == 200 || status == 503, "{r}");
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let text = s.metrics().await;
    let live = common::reload::metric_value(&text, "sluice_sequences_live", &[("model", "dyna_limits")]);
    assert_eq!(live, 0.0, "sequences still live after their idle timeout");

    // A start of two rows is refused (one row per request, as Triton's
    // sequence batcher), and opens nothing: the id's next request is told
    // it needs a start, not about rows it never sent.
    let two = json!({"inputs": [v2_input("INPUT", "INT32", &[2, 1], json!([[1], [2]]))],
                     "parameters": {"sequence_id": 77, "sequence_start": true}});
    let (status, r) = s.post(url, &two).await;
    assert_eq!(status, 400, "{r}");
    assert!(
        error_message(&r).contains("carries one row (batch size 1), this one carries 2"),
        "{r}"
    );
    let (status, r) = s.post(url, &rest(1, json!({"sequence_id": 77}))).await;
    assert_eq!(status, 400, "{r}");
    assert!(error_message(&r).contains("must specify the START flag"), "{r}");

    // A string id is bounded before anything is kept.
    let long = "x".repeat(1 << 20);
    let (status, r) = s
        .post(
            url,
            &rest(1, json!({"sequence_id": long, "sequence_start": true})),
        )
        .await;
    assert_eq!(status, 400, "{r}");
    assert!(error_message(&r).contains("at most 256 bytes"), "{r}");
    s.stop().await.unwrap();
}

/// silero-vad (`silero_vad.onnx` from the `silero-vad` wheel), its
/// recurrent state kept by the server: `state` → `stateN`, batched on axis 1
/// (`[2, batch, 128]`, which Triton cannot batch), the sample rate a shared
/// 0-d input.
fn silero_repository() -> tempfile::TempDir {
    let wheel = root().join(".venv-clients/wheels/silero_vad-6.2.3-py3-none-any.whl");
    assert!(
        wheel.is_file(),
        "{} is missing: run scripts/setup-test-clients.sh",
        wheel.display()
    );
    let repo = repo_with(&[]);
    let dir = repo.path().join("silero");
    std::fs::create_dir_all(&dir).unwrap();
    let script = "import sys, zipfile; open(sys.argv[2], 'wb').write(zipfile.ZipFile(sys.argv[1]).read('silero_vad/data/silero_vad.onnx'))";
    let out = Command::new(python())
        .args(["-c", script])
        .arg(&wheel)
        .arg(dir.join("model.onnx"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let settings = json!({
        "max_batch_size": 64,
        "max_batch_time": 0.003,
        "batch_axes": {"state": 1, "stateN": 1},
        "sequence": {"state": [{"input": "state", "output": "stateN"}], "idle_timeout": 60},
    });
    std::fs::write(dir.join("model-settings.json"), settings.to_string()).unwrap();
    repo
}

/// `CLIPS` clips of `CHUNKS` chunks of 512 samples (seeded tones in noise),
/// and each chunk's speech probability from Python ONNX Runtime running the
/// clip alone, its state carried by hand from chunk to chunk.
const CLIPS: usize = 64;
const CHUNKS: usize = 6;

/// `init`: a file holding the state each clip starts from (else zeros).
fn clips_and_probabilities(model: &Path, init: Option<&Path>) -> (Vec<Vec<Vec<f32>>>, Vec<Vec<f32>>) {
    let script = r#"
import json, sys
import numpy as np
import onnxruntime as ort
clips, chunks = int(sys.argv[2]), int(sys.argv[3])
s = ort.InferenceSession(sys.argv[1], providers=["CPUExecutionProvider"])
rng = np.random.default_rng(7)
all_clips, all_probs = [], []
for c in range(clips):
    t = np.arange(512 * chunks) / 16000.0
    tone = 0.5 * np.sin(2 * np.pi * (150 + 20 * c) * t) * (np.sin(2 * np.pi * 3 * t + c) > 0)
    audio = (tone + 0.05 * rng.standard_normal(t.shape)).astype(np.float32)
    state = np.fromfile(sys.argv[4], np.float32).reshape(2, 1, 128) if sys.argv[4] else np.zeros((2, 1, 128), np.float32)
    parts, probs = [], []
    for k in range(chunks):
        chunk = audio[k * 512:(k + 1) * 512]
        out, state = s.run(["output", "stateN"], {"input": chunk[None, :], "state": state, "sr": np.array(16000, np.int64)})
        parts.append(chunk.tolist())
        probs.append(float(out[0][0]))
    all_clips.append(parts)
    all_probs.append(probs)
# The state matters: each chunk run from zeros answers differently.
fresh = [float(s.run(["output"], {"input": np.array(all_clips[c][k], np.float32)[None, :],
         "state": np.zeros((2, 1, 128), np.float32), "sr": np.array(16000, np.int64)})[0][0][0])
         for c in range(clips) for k in range(1, chunks)]
carried = [all_probs[c][k] for c in range(clips) for k in range(1, chunks)]
assert max(abs(a - b) for a, b in zip(fresh, carried)) > 1e-2, "the state does not change the answers"
print(json.dumps({"clips": all_clips, "probs": all_probs}))
"#;
    let out = Command::new(python())
        .args([
            "-c",
            script,
            model.to_str().unwrap(),
            &CLIPS.to_string(),
            &CHUNKS.to_string(),
        ])
        .arg(init.map_or(String::new(), |p| p.display().to_string()))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let clips = serde_json::from_value(v["clips"].clone()).unwrap();
    let probs = serde_json::from_value(v["probs"].clone()).unwrap();
    (clips, probs)
}

/// A silero request over REST: chunk `chunk` of sequence `id`.
fn silero_body(id: usize, chunk: &[f32], start: bool, end: bool) -> Value {
    json!({
        "inputs": [
            v2_input("input", "FP32", &[1, 512], json!([chunk])),
            v2_input("sr", "INT64", &[], json!([16000])),
        ],
        "parameters": {"sequence_id": id, "sequence_start": start, "sequence_end": end},
    })
}

/// Sends each of `clips` as its own sequence, chunk by chunk, over REST,
/// and checks each answer against Python's (`want`).
async fn assert_clips_over_rest(s: &TestServer, clips: &[Vec<Vec<f32>>], want: &[Vec<f32>]) {
    for (c, clip) in clips.iter().enumerate() {
        for (k, chunk) in clip.iter().enumerate() {
            let body = silero_body(c + 1, chunk, k == 0, k == CHUNKS - 1);
            let (status, r) = s.post("/v2/models/silero/infer", &body).await;
            assert_eq!(status, 200, "clip {c} chunk {k}: {r}");
            let p = flat_f64(&v2_output(&r, "output")["data"])[0];
            assert!(
                (p - want[c][k] as f64).abs() < 1e-4,
                "clip {c} chunk {k}: {p} vs {}",
                want[c][k]
            );
        }
    }
}

/// The mean batch size of `model` so far (`sluice_batch_size`).
async fn mean_batch(s: &TestServer, model: &str) -> f64 {
    let text = s.metrics().await;
    let sum = common::reload::metric_value(&text, "sluice_batch_size_sum", &[("model", model)]);
    let count = common::reload::metric_value(&text, "sluice_batch_size_count", &[("model", model)]);
    sum / count.max(1.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silero_vad_streams_64_clips_with_its_state_on_the_server() {
    let repo = silero_repository();
    let (clips, want) = clips_and_probabilities(&repo.path().join("silero/model.onnx"), None);
    let s = TestServer::start(repo.path()).await;

    // gRPC: one stream, the clips' chunks interleaved, each clip a sequence.
    let mut sent = Vec::new();
    for k in 0..CHUNKS {
        for (c, clip) in clips.iter().enumerate() {
            let mut r = infer_request("silero", "input", &[1, 512], &clip[k]);
            let mut sr = r.inputs[0].clone();
            (sr.name, sr.datatype, sr.shape) = ("sr".into(), "INT64".into(), vec![]);
            r.inputs.push(sr);
            r.raw_input_contents.push(16000i64.to_le_bytes().to_vec().into());
            sequence(&mut r, c as u64 + 1, k == 0, k == CHUNKS - 1);
            r.id = format!("{c}_{k}");
            sent.push(r);
        }
    }
    let mut g = client(&s).await;
    let mut answers = g
        .model_stream_infer(tokio_stream::iter(sent))
        .await
        .unwrap()
        .into_inner();
    let mut got = 0;
    while let Some(a) = answers.next().await {
        let a = a.unwrap();
        assert!(a.error_message.is_empty(), "{}", a.error_message);
        let r = a.infer_response.unwrap();
        let (c, k) = r.id.split_once('_').unwrap();
        let (c, k): (usize, usize) = (c.parse().unwrap(), k.parse().unwrap());
        assert_eq!(r.outputs.len(), 1, "only `output`: the state stays on the server");
        let p = f32::from_le_bytes(r.raw_output_contents[0][..4].try_into().unwrap());
        assert!(
            (p - want[c][k]).abs() < 1e-4,
            "clip {c} chunk {k}: {p} vs {}",
            want[c][k]
        );
        got += 1;
        if got == CLIPS * CHUNKS {
            break;
        }
    }
    let grpc_batch = mean_batch(&s, "silero").await;
    eprintln!("silero over a gRPC stream: mean batch size {grpc_batch:.1}");
    assert!(
        grpc_batch > 1.0,
        "mean batch size {grpc_batch}: the sequences did not share batches"
    );

    // REST: each clip its own client, sending its chunks in turn.
    let mut tasks = Vec::new();
    for (c, clip) in clips.iter().cloned().enumerate() {
        let (client_, url) = (s.client.clone(), s.url("/v2/models/silero/infer"));
        let want = want[c].clone();
        tasks.push(tokio::spawn(async move {
            for (k, chunk) in clip.iter().enumerate() {
                let body = json!({
                    "inputs": [
                        v2_input("input", "FP32", &[1, 512], json!([chunk])),
                        v2_input("sr", "INT64", &[], json!([16000])),
                    ],
                    "parameters": {"sequence_id": format!("clip-{c}"), "sequence_start": k == 0, "sequence_end": k == CHUNKS - 1},
                });
                let a = common::reload::infer(&client_, &url, &body).await;
                assert_eq!(a.status, 200, "{}", a.body);
                let p = flat_f64(&v2_output(&a.body, "output")["data"])[0];
                assert!((p - want[k] as f64).abs() < 1e-4, "clip {c} chunk {k}: {p} vs {}", want[k]);
                assert!(a.body["outputs"].as_array().unwrap().len() == 1, "{}", a.body);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let text = s.metrics().await;
    let live = common::reload::metric_value(&text, "sluice_sequences_live", &[("model", "silero")]);
    assert_eq!(live, 0.0, "every clip ended");
    let held = common::reload::metric_value(&text, "sluice_sequence_state_bytes", &[("model", "silero")]);
    assert_eq!(held, 0.0, "their state is freed");
    s.stop().await.unwrap();
}

/// A new version (a version folder added) while sequences are live: they
/// finish on the version they started on (their answers say version 1),
/// new ones start on version 2; every answer equals Python ONNX Runtime's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_sequences_finish_on_their_version_across_a_reload() {
    let repo = repository("dyna_reload", &[]);
    let s = TestServer::start(repo.path()).await;
    let url = "/v2/models/dyna_reload/infer";
    let model = repo.path().join("dyna_reload/1/model.onnx");
    let step = |id: u64, v: i32, start: bool, end: bool| {
        let s = &s;
        async move {
            let params = json!({"sequence_id": id, "sequence_start": start, "sequence_end": end});
            let (status, r) = s.post(url, &rest(v, params)).await;
            assert_eq!(status, 200, "{r}");
            let out = flat_f64(&v2_output(&r, "OUTPUT")["data"])[0] as i32;
            (out, r["model_version"].as_str().unwrap().to_string())
        }
    };
    let mut rows = Vec::new();
    let mut got = Vec::new();
    for id in 1..=3u64 {
        got.push(step(id, 10 + id as i32, true, false).await);
        rows.push((10 + id as i32, 1, 0, 1, id));
    }
    assert!(got.iter().all(|(_, v)| v == "1"));
    // Version 2: a copy of the same file, written aside and renamed in.
    let dir = repo.path().join("dyna_reload");
    std::fs::create_dir_all(dir.join(".staging")).unwrap();
    std::fs::copy(&model, dir.join(".staging/model.onnx")).unwrap();
    std::fs::rename(dir.join(".staging"), dir.join("2")).unwrap();
    let mut probe = 100u64;
    wait_for("a new sequence to start on version 2", || {
        probe += 1;
        let id = probe;
        let step = &step;
        async move { (step(id, 1, true, true).await.1 == "2").then_some(()) }
    })
    .await;
    for (k, end) in [(0, false), (1, true)] {
        for id in 1..=3u64 {
            let v = 20 + 10 * k + id as i32;
            got.push(step(id, v, false, end).await);
            rows.push((v, 0, end as i32, 1, id));
        }
    }
    let want = expected(&model, &rows);
    for (i, ((out, version), want)) in got.iter().zip(&want).enumerate() {
        assert_eq!(out, want, "answer {i}");
        assert_eq!(
            version, "1",
            "answer {i}: a live sequence finishes on its version"
        );
    }
    assert_eq!(step(500, 5, true, true).await.1, "2");
    s.stop().await.unwrap();
}

/// A state's initial value from a file of the model folder
/// (`sequence.state[].initial_file`: one sequence's state, raw
/// little-endian): each sequence starts from it, and the answers equal
/// Python ONNX Runtime's starting from the same state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_initial_state_file_starts_each_sequence() {
    let repo = silero_repository();
    let dir = repo.path().join("silero");
    let init: Vec<u8> = (0..256)
        .flat_map(|i| (((i % 17) as f32 - 8.0) / 20.0).to_le_bytes())
        .collect();
    std::fs::write(dir.join("state0.bin"), &init).unwrap();
    let text = std::fs::read_to_string(dir.join("model-settings.json")).unwrap();
    let mut settings: Value = serde_json::from_str(&text).unwrap();
    settings["sequence"]["state"][0]["initial_file"] = json!("state0.bin");
    std::fs::write(dir.join("model-settings.json"), settings.to_string()).unwrap();
    let model = dir.join("model.onnx");
    let (clips, want) = clips_and_probabilities(&model, Some(&dir.join("state0.bin")));
    let (_, zeros) = clips_and_probabilities(&model, None);
    assert_ne!(
        want[0][0], zeros[0][0],
        "the initial state changes the first answer"
    );
    let s = TestServer::start(repo.path()).await;
    assert_clips_over_rest(&s, &clips[..3], &want).await;
    // A file of the wrong size is refused at load, naming it; the last good
    // version keeps serving.
    std::fs::write(dir.join("state0.bin"), &init[..100]).unwrap();
    std::fs::write(dir.join("model-settings.json"), settings.to_string() + " ").unwrap();
    wait_for("the refused change to be noted", || async {
        let (_, index) = s.post("/v2/repository/index", &json!({})).await;
        let reason = index[0]["reason"].as_str().unwrap_or("").to_string();
        reason
            .contains("the initial state of `state` (state0.bin)")
            .then_some(())
    })
    .await;
    s.stop().await.unwrap();
}

/// A model with live sequences is not evicted to make room: their state is
/// on that version only. Two copies of silero-vad under a host budget that
/// holds one: while a sequence of `vad_a` is live, `vad_b` cannot load
/// (503, retry later); once it ends, `vad_b` loads and `vad_a` goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_with_live_sequences_is_not_evicted() {
    let repo = silero_repository();
    for name in ["vad_a", "vad_b"] {
        copy_dir(&repo.path().join("silero"), &repo.path().join(name));
    }
    std::fs::remove_dir_all(repo.path().join("silero")).unwrap();
    let chunk = vec![0.1f32; 512];
    let step = |model: &'static str, id: u64, start: bool, end: bool| {
        let chunk = chunk.clone();
        move |s: &TestServer| {
            let body = json!({
                "inputs": [
                    v2_input("input", "FP32", &[1, 512], json!([chunk])),
                    v2_input("sr", "INT64", &[], json!([16000])),
                ],
                "parameters": {"sequence_id": id, "sequence_start": start, "sequence_end": end},
            });
            let url = format!("/v2/models/{model}/infer");
            let client = s.client.clone();
            let full = s.url(&url);
            async move {
                let a = common::reload::infer(&client, &full, &body).await;
                (a.status, a.body)
            }
        }
    };
    // What a loaded copy is charged varies from load to load (resident
    // memory growth): servers are started until the budget, 1.5 times the
    // last server's charge, holds this one's copy but not two.
    let charged =
        |text: &str| common::reload::metric_value(text, "sluice_residency_used_bytes", &[("device", "cpu")]);
    let mut last: Option<f64> = None;
    let mut fitting = None;
    for _ in 0..8 {
        let budget = last.map(|c| (c * 1.5) as u64);
        let s = TestServer::start_with(repo.path(), |c| {
            c.residency.mode = sluice::config::ResidencyMode::OnDemand;
            c.residency.host_bytes = budget.or(Some(1 << 40));
            c.residency.min_idle_seconds = 0.0;
        })
        .await;
        let (status, _) = step("vad_a", 1, true, true)(&s).await;
        let now = charged(&s.metrics().await);
        match budget {
            Some(b) if status == 200 && now <= b as f64 && 2.0 * now > b as f64 => {
                fitting = Some(s);
                break;
            }
            _ => {
                eprintln!("budget {budget:?}: vad_a answered {status}, a copy is charged {now} bytes; next, a budget of 1.5 times that");
                last = Some(now.max(1.0));
                s.stop().await.unwrap();
            }
        }
    }
    let s = fitting.expect("no budget held one copy and not two in 8 servers");
    assert_eq!(
        step("vad_a", 7, true, false)(&s).await.0,
        200,
        "a sequence of vad_a starts"
    );
    let (status, body) = step("vad_b", 8, true, true)(&s).await;
    assert_eq!(status, 503, "vad_a has a live sequence: {body}");
    let (status, body) = step("vad_a", 7, false, true)(&s).await;
    assert_eq!(status, 200, "the sequence of vad_a goes on where it was: {body}");
    let (status, body) = step("vad_b", 8, true, true)(&s).await;
    assert_eq!(status, 200, "no sequence is live: vad_a makes room: {body}");
    s.stop().await.unwrap();
}

/// silero-vad as Triton users write it: `max_batch_size: 0`, the state's
/// full shape in `dims` and `initial_state { zero_data: true }`. The ONNX
/// file leaves the state's middle dim open; the configuration's dims fill
/// it, and each clip answers as Python ONNX Runtime carrying the state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silero_vad_as_triton_users_configure_it_serves_from_zero_state() {
    let repo = silero_repository();
    let dir = repo.path().join("silero");
    std::fs::remove_file(dir.join("model-settings.json")).unwrap();
    std::fs::create_dir(dir.join("1")).unwrap();
    std::fs::rename(dir.join("model.onnx"), dir.join("1/model.onnx")).unwrap();
    std::fs::write(
        dir.join("config.pbtxt"),
        r#"name: "silero"
backend: "onnxruntime"
max_batch_size: 0
sequence_batching {
  max_sequence_idle_microseconds: 60000000
  state [
    {
      input_name: "state"
      output_name: "stateN"
      data_type: TYPE_FP32
      dims: [ 2, 1, 128 ]
      initial_state: { data_type: TYPE_FP32 dims: [ 2, 1, 128 ] zero_data: true name: "zeros" }
    }
  ]
}
"#,
    )
    .unwrap();
    let (clips, want) = clips_and_probabilities(&dir.join("1/model.onnx"), None);
    let s = TestServer::start(repo.path()).await;
    assert_clips_over_rest(&s, &clips[..4], &want).await;
    s.stop().await.unwrap();
}

/// Kept state is held in the server's byte budget: sequences a client
/// opens and leaves cannot hold more than `http.max_inflight_bytes`. A start
/// whose state does not fit is answered 503 naming the budget, and other
/// requests are still served once the held sequences end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sequence_state_is_held_in_the_byte_budget() {
    let repo = silero_repository();
    let s = TestServer::start_with(repo.path(), |c| c.http.max_inflight_bytes = 48 << 10).await;
    let chunk = vec![0.0f32; 512];
    let body = |id: usize, start: bool, end: bool| silero_body(id, &chunk, start, end);
    // Each sequence keeps 2 x 1 x 128 FP32 (1 KiB); 48 KiB cannot hold 100.
    let (mut ok, mut refused) = (Vec::new(), 0);
    for id in 1..=100 {
        let (status, r) = s.post("/v2/models/silero/infer", &body(id, true, false)).await;
        match status {
            200 => ok.push(id),
            503 => {
                let msg = error_message(&r);
                assert!(
                    msg.contains("state of 1024 bytes does not fit")
                        && msg.contains("http.max_inflight_bytes"),
                    "{msg}"
                );
                refused += 1;
            }
            _ => panic!("{status}: {r}"),
        }
    }
    assert!(
        refused > 0 && !ok.is_empty(),
        "{} kept, {refused} refused",
        ok.len()
    );
    let text = s.metrics().await;
    let held = common::reload::metric_value(&text, "sluice_sequence_state_bytes", &[("model", "silero")]);
    assert!(
        held <= (48 << 10) as f64,
        "{held} bytes of state under a 48 KiB budget"
    );
    // A refused start left no sequence behind: its next request needs a start.
    let refused_id = (1..=100).find(|i| !ok.contains(i)).unwrap();
    let (status, r) = s
        .post("/v2/models/silero/infer", &body(refused_id, false, false))
        .await;
    assert_eq!(status, 400, "{r}");
    // The kept ones end; their bytes come back, and new sequences fit again.
    for id in &ok {
        let (status, r) = s.post("/v2/models/silero/infer", &body(*id, false, true)).await;
        assert_eq!(status, 200, "{r}");
    }
    let (status, r) = s.post("/v2/models/silero/infer", &body(1000, true, true)).await;
    assert_eq!(status, 200, "{r}");
    s.stop().await.unwrap();
}
