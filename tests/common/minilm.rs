//! Helpers of the padding tests (`tests/padding.rs`): the real MiniLM file
//! (`scripts/fetch-minilm.sh`), requests of given lengths, their expected
//! outputs from Python ONNX Runtime on each request alone, and one request
//! sent over each protocol (V1, V2 JSON, V2 binary, gRPC).

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{json, Value};
use sluice::protocol::grpc::inference::model_infer_request::InferInputTensor;
use sluice::protocol::grpc::inference::ModelInferRequest;

use super::batching::Lcg;
use super::{root, TestServer};

/// The MiniLM inputs, in signature order.
pub const INPUTS: [&str; 3] = ["input_ids", "attention_mask", "token_type_ids"];
/// Width of `last_hidden_state`.
pub const HIDDEN: usize = 384;

/// The fetched MiniLM folder (model.onnx and its model-settings.json).
pub fn minilm_dir() -> PathBuf {
    let dir = root().join("model-repository/minilm");
    assert!(
        dir.join("model.onnx").is_file(),
        "{}/model.onnx is missing: run scripts/fetch-minilm.sh (make test does)",
        dir.display()
    );
    dir
}

/// One request: `rows` rows of `len` tokens.
#[derive(Debug, Clone)]
pub struct Req {
    pub rows: usize,
    pub len: usize,
    /// `input_ids`, `attention_mask`, `token_type_ids`, each `rows × len`, row-major.
    pub inputs: [Vec<i64>; 3],
}

impl Req {
    /// `rows` sentences of `len` tokens: [CLS] random word pieces [SEP], a
    /// full attention mask, segment 0 then 1 past the middle.
    pub fn new(rng: &mut Lcg, rows: usize, len: usize) -> Req {
        let mut ids = Vec::with_capacity(rows * len);
        for _ in 0..rows {
            for i in 0..len {
                ids.push(match i {
                    0 => 101,
                    i if i == len - 1 && len > 1 => 102,
                    _ => 1000 + rng.below(29000) as i64,
                });
            }
        }
        let types = (0..rows * len).map(|i| i64::from(i % len > len / 2)).collect();
        Req {
            rows,
            len,
            inputs: [ids, vec![1; rows * len], types],
        }
    }

    pub fn shape(&self) -> [usize; 2] {
        [self.rows, self.len]
    }

    /// `{"input_ids": [[...]], ...}` for the Python script.
    fn to_json(&self) -> Value {
        let mut obj = serde_json::Map::new();
        for (name, v) in INPUTS.iter().zip(&self.inputs) {
            let rows: Vec<&[i64]> = v.chunks(self.len.max(1)).collect();
            obj.insert(name.to_string(), json!(rows));
        }
        Value::Object(obj)
    }
}

/// `last_hidden_state` of each request, from Python ONNX Runtime run on that
/// request alone (`tests/clients/minilm_expected.py`).
pub fn expected(reqs: &[Req]) -> Vec<Vec<f32>> {
    let model = minilm_dir().join("model.onnx");
    expected_output(&model, "last_hidden_state", reqs, |r| r.rows * r.len * HIDDEN)
}

/// `output` of each request from Python ONNX Runtime on `model`, each
/// request alone; `size` is the number of floats a request gets.
pub fn expected_output(
    model: &Path,
    output: &str,
    reqs: &[Req],
    size: impl Fn(&Req) -> usize,
) -> Vec<Vec<f32>> {
    let dir = tempfile::tempdir().unwrap();
    let (input, out_file) = (dir.path().join("requests.json"), dir.path().join("expected.f32"));
    let list: Vec<Value> = reqs.iter().map(Req::to_json).collect();
    std::fs::write(&input, serde_json::to_vec(&list).unwrap()).unwrap();
    run_script(
        "minilm_expected.py",
        &[
            model.as_os_str(),
            input.as_os_str(),
            out_file.as_os_str(),
            output.as_ref(),
        ],
    );
    let bytes = std::fs::read(&out_file).unwrap();
    let mut all = bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()));
    reqs.iter()
        .map(|r| all.by_ref().take(size(r)).collect())
        .collect()
}

/// Writes MiniLM with sentence-transformers' mean pooling and L2
/// normalisation, output `sentence_embedding` [batch, 384], to `dst`
/// (`tests/clients/minilm_pooled.py`).
pub fn write_pooled(dst: &Path) {
    let minilm = minilm_dir().join("model.onnx");
    run_script("minilm_pooled.py", &[minilm.as_os_str(), dst.as_os_str()]);
}

/// Runs `tests/clients/<script>` with `args` on the test clients' Python
/// (`scripts/setup-test-clients.sh`); panics with its output if it fails.
fn run_script(script: &str, args: &[&OsStr]) {
    let python = root().join(".venv-clients/bin/python");
    assert!(
        python.is_file(),
        "{} is missing: run scripts/setup-test-clients.sh (make test does)",
        python.display()
    );
    let out = Command::new(python)
        .arg(root().join("tests/clients").join(script))
        .args(args)
        .output()
        .expect("cannot run Python");
    assert!(
        out.status.success(),
        "{script} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The protocols a request can come by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    V1,
    V2Json,
    V2Binary,
    Grpc,
}

pub const PROTOCOLS: [Protocol; 4] = [Protocol::V1, Protocol::V2Json, Protocol::V2Binary, Protocol::Grpc];

/// An answer: `last_hidden_state` flat, its shape, and the V1 `batchId`.
pub struct Answer {
    pub data: Vec<f32>,
    pub shape: Vec<usize>,
    pub batch_id: Option<String>,
}

fn le_i64(v: &[i64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// The shape of a nested JSON array, read along its first elements (V1's
/// `predictions`: one entry per row).
fn nesting(mut v: &Value) -> Vec<usize> {
    let mut shape = Vec::new();
    while let Some(a) = v.as_array() {
        shape.push(a.len());
        match a.first() {
            Some(first) => v = first,
            None => break,
        }
    }
    shape
}

fn floats(v: &Value) -> Vec<f32> {
    super::flat_f64(v).into_iter().map(|x| x as f32).collect()
}

/// Sends `r` to `model` over `protocol`; panics (naming the request) on an error answer.
pub async fn send(s: &TestServer, model: &str, protocol: Protocol, r: &Req) -> Answer {
    match protocol {
        Protocol::V1 => {
            let instances: Vec<Value> = (0..r.rows)
                .map(|i| {
                    let row = |v: &[i64]| json!(v[i * r.len..(i + 1) * r.len]);
                    json!({"input_ids": row(&r.inputs[0]), "attention_mask": row(&r.inputs[1]),
                           "token_type_ids": row(&r.inputs[2])})
                })
                .collect();
            let (st, body) = s
                .post(
                    &format!("/v1/models/{model}:predict"),
                    &json!({"instances": instances}),
                )
                .await;
            assert_eq!(st, 200, "V1 {:?}: {body}", r.shape());
            Answer {
                data: floats(&body["predictions"]),
                shape: nesting(&body["predictions"]),
                batch_id: body["batchId"].as_str().map(str::to_string),
            }
        }
        Protocol::V2Json => {
            let inputs: Vec<Value> = INPUTS
                .iter()
                .zip(&r.inputs)
                .map(|(n, v)| json!({"name": n, "datatype": "INT64", "shape": r.shape(), "data": v}))
                .collect();
            let (st, body) = s
                .post(&format!("/v2/models/{model}/infer"), &json!({"inputs": inputs}))
                .await;
            assert_eq!(st, 200, "V2 JSON {:?}: {body}", r.shape());
            let out = &body["outputs"][0];
            let shape = out["shape"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_u64().unwrap() as usize);
            Answer {
                data: floats(&out["data"]),
                shape: shape.collect(),
                batch_id: None,
            }
        }
        Protocol::V2Binary => v2_binary(s, model, r).await,
        Protocol::Grpc => grpc(s, model, r).await,
    }
}

async fn v2_binary(s: &TestServer, model: &str, r: &Req) -> Answer {
    let inputs: Vec<Value> = INPUTS
        .iter()
        .map(|n| {
            json!({"name": n, "datatype": "INT64", "shape": r.shape(),
                   "parameters": {"binary_data_size": r.rows * r.len * 8}})
        })
        .collect();
    let header =
        serde_json::to_vec(&json!({"inputs": inputs, "parameters": {"binary_data_output": true}})).unwrap();
    let mut body = header.clone();
    for v in &r.inputs {
        body.extend_from_slice(&le_i64(v));
    }
    let resp = s
        .client
        .post(s.url(&format!("/v2/models/{model}/infer")))
        .header("Inference-Header-Content-Length", header.len())
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200, "V2 binary {:?}", r.shape());
    let n: usize = resp.headers()["Inference-Header-Content-Length"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let bytes = resp.bytes().await.unwrap();
    let head: Value = serde_json::from_slice(&bytes[..n]).unwrap();
    let shape = head["outputs"][0]["shape"].as_array().unwrap().iter();
    Answer {
        data: f32s(&bytes[n..]),
        shape: shape.map(|d| d.as_u64().unwrap() as usize).collect(),
        batch_id: None,
    }
}

async fn grpc(s: &TestServer, model: &str, r: &Req) -> Answer {
    let mut c = super::grpc::client(s).await;
    let req = ModelInferRequest {
        model_name: model.into(),
        inputs: INPUTS
            .iter()
            .map(|n| InferInputTensor {
                name: n.to_string(),
                datatype: "INT64".into(),
                shape: vec![r.rows as i64, r.len as i64],
                ..Default::default()
            })
            .collect(),
        raw_input_contents: r.inputs.iter().map(|v| le_i64(v).into()).collect(),
        ..Default::default()
    };
    let resp = c
        .model_infer(req)
        .await
        .unwrap_or_else(|e| panic!("gRPC {:?}: {e}", r.shape()))
        .into_inner();
    Answer {
        data: f32s(&resp.raw_output_contents[0]),
        shape: resp.outputs[0].shape.iter().map(|&d| d as usize).collect(),
        batch_id: None,
    }
}

/// Asserts `got` equals `want` within `tol` (absolute, plus relative to the value).
pub fn assert_close_f32(got: &[f32], want: &[f32], tol: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let worst = got
        .iter()
        .zip(want)
        .enumerate()
        .map(|(i, (g, w))| (i, (g - w).abs() / (1.0 + w.abs())))
        .fold((0, 0.0f32), |a, b| if b.1 > a.1 { b } else { a });
    assert!(
        worst.1 <= tol,
        "{what}: element {} is {}, want {} (off by {} > {tol})",
        worst.0,
        got[worst.0],
        want[worst.0],
        worst.1
    );
}
