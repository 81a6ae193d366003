//! Fuzzing entry points, not part of the server's API. Each function takes
//! untrusted bytes through one decoder, then, for every fixture signature the
//! request fits, through what the server does next: validation, batching's
//! data path (the request's rows concatenated with a copy of themselves and
//! split back, and cut into chunks and joined) and every response encoder,
//! asserting what must hold between them. A decoder's error is a normal
//! outcome; a panic or an abort is a finding. The `fuzz/` targets and
//! `tests/fuzz_corpus.rs` (which replays the committed corpus) call these
//! same functions.

use std::sync::OnceLock;

use prost::Message;
use serde_json::{json, Value};

use crate::protocol::grpc::inference::{self, ModelInferRequest, ModelInferResponse};
use crate::protocol::model_config::{DynamicBatching, ModelConfig, QueuePolicy};
use crate::protocol::v2::{InferenceResponse, JsonResponse};
use crate::protocol::v2_binary::{self, OutputEncoding};
use crate::protocol::{binary, v1, validate, InferRequest, InferResponse};
use crate::settings::{ModelDefaults, ModelSettings};
use crate::tensor::{DataType, Signature, Tensor, TensorSpec};

/// Most rows the batching step builds (the request's rows times two), and
/// most rows a V1 response is encoded for. A request of more rows is
/// either big (bounded by the input) or has rows of no elements (shape
/// `[10^12, 0]`), which must not make the harness itself allocate per row.
pub const MAX_ROWS: usize = 1 << 16;

/// A fuzz target's function.
pub type Target = fn(&[u8]);

/// Every target, by the name of its `fuzz/fuzz_targets/<name>.rs` and its
/// `fuzz/corpus/<name>/` folder.
pub const TARGETS: [(&str, Target); 5] = [
    ("v2_json", v2_json),
    ("v2_binary", v2_binary),
    ("v1", v1),
    ("grpc", grpc),
    ("model_settings", model_settings),
];

/// A V2 REST body without `Inference-Header-Content-Length`: all JSON.
pub fn v2_json(data: &[u8]) {
    let decoded = v2_binary::decode_request(data, None, &crate::protocol::shm::NoRegions);
    // The one-pass reader takes a body only as serde_json's way reads it.
    if let Ok(one_pass) = &decoded {
        let careful = v2_binary::decode_request_serde(data, None, &crate::protocol::shm::NoRegions)
            .expect("a body the one-pass reader took is one serde_json's way takes");
        // Through `Debug`, so that -0.0 and 0.0 differ.
        let same = format!("{:?}", one_pass.request) == format!("{:?}", careful.request);
        assert!(
            same && one_pass.outputs == careful.outputs,
            "the one-pass reader and serde_json's way disagree"
        );
    }
    if let Ok(decoded) = decoded {
        serve_all(&decoded.request, &decoded.outputs);
    }
}

/// A V2 REST body with binary tensor data: the bytes before the first
/// `\n` are the `Inference-Header-Content-Length` header's value, the rest
/// is the body (the JSON header and the binary data after it).
pub fn v2_binary(data: &[u8]) {
    let Some(nl) = data.iter().position(|&b| b == b'\n') else {
        return;
    };
    let (header, body) = (&data[..nl], &data[nl + 1..]);
    if let Ok(decoded) = v2_binary::decode_request(body, Some(header), &crate::protocol::shm::NoRegions) {
        serve_all(&decoded.request, &decoded.outputs);
    }
}

/// A KServe V1 `:predict` body, decoded against each fixture signature (V1
/// takes datatypes from the model).
pub fn v1(data: &[u8]) {
    for (model, sig) in signatures() {
        if let Ok(mut req) = v1::decode(data, sig) {
            if validate(&mut req, model, sig).is_ok() {
                serve(req, model, sig, &OutputEncoding::default());
            }
        }
    }
}

/// A gRPC `ModelInferRequest` message (protobuf bytes, as the gRPC layer
/// hands them to prost).
pub fn grpc(data: &[u8]) {
    let Ok(msg) = ModelInferRequest::decode(data) else {
        return;
    };
    if let Ok(req) = InferRequest::try_from(msg) {
        serve_all(&req, &OutputEncoding::default());
    }
}

/// A `model-settings.json`: parsed with the default defaults, then checked
/// against each fixture signature and turned into the model configuration
/// the server reports (JSON and protobuf).
pub fn model_settings(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let settings = match ModelSettings::parse(text, "fuzz", &ModelDefaults::default()) {
        Ok(s) => s,
        Err(e) => {
            assert!(!e.problems.is_empty(), "a settings error names a problem");
            return;
        }
    };
    assert!(
        !settings.requires_new_sessions(&settings),
        "the same settings need no new sessions"
    );
    serde_json::to_vec(&settings).expect("settings serialize");
    for (_, sig) in signatures() {
        let _ = settings.check_declared(sig);
        let config = model_config(&settings, sig);
        serde_json::to_vec(&config).expect("a model configuration serializes");
        inference::ModelConfig::from(&config).encode_to_vec();
    }
}

/// The configuration `ModelHandle::config` reports for `settings` and `sig`.
fn model_config(settings: &ModelSettings, sig: &Signature) -> ModelConfig {
    let micros = |d: std::time::Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
    let b = &settings.batching;
    let max_batch_size = if sig.batchable() {
        b.max_batch_size.max(1)
    } else {
        0
    };
    let dynamic = (sig.batchable() && b.batching_enabled()).then(|| DynamicBatching {
        max_queue_delay_microseconds: micros(b.max_batch_time),
        default_queue_policy: QueuePolicy {
            max_queue_size: b.max_queue_size,
            default_timeout_microseconds: micros(b.timeout),
        },
    });
    ModelConfig::new(&settings.name, sig, max_batch_size, dynamic)
}

/// Validates a copy of `req` against each fixture signature and serves it
/// where it fits.
fn serve_all(req: &InferRequest, encoding: &OutputEncoding) {
    for (model, sig) in signatures() {
        let mut req = req.clone();
        if validate(&mut req, model, sig).is_ok() {
            serve(req, model, sig, encoding);
        }
    }
}

/// What the server does with a validated request, the model run aside: a
/// batchable one goes through the batcher's concatenation and split; the
/// answer (the request's tensors, named as the outputs; empty ones too) is
/// encoded by every protocol.
fn serve(req: InferRequest, model: &str, sig: &Signature, encoding: &OutputEncoding) {
    let rows = req.rows();
    let bounded = rows.saturating_mul(2) <= MAX_ROWS;
    // A request of no rows is never chunked (it runs as one entry).
    if bounded && rows > 0 && sig.batchable() {
        for t in &req.inputs {
            batch_round_trip(t);
        }
    }
    let resp = response(req, model, sig);
    encode_all(&resp, encoding, bounded);
}

/// Concatenates `t`'s rows with a copy of themselves and splits them back,
/// then cuts `t` into chunks of rows and joins them, as the batcher does
/// with requests and with a long request; each part must come back as it was.
fn batch_round_trip(t: &Tensor) {
    let rows = t.rows();
    let both = Tensor::concat_rows(&[t, t]);
    assert_eq!(both.rows(), 2 * rows, "rows of a concatenation");
    assert!(
        same(&both.slice_rows(0..rows), t),
        "first half of a concatenation"
    );
    assert!(
        same(&both.slice_rows(rows..2 * rows), t),
        "second half of a concatenation"
    );
    let chunk = rows.div_ceil(3).max(1);
    let parts: Vec<Tensor> = (0..rows)
        .step_by(chunk)
        .map(|start| t.slice_rows(start..(start + chunk).min(rows)))
        .collect();
    let joined = Tensor::concat_rows(&parts.iter().collect::<Vec<_>>());
    assert!(same(&joined, t), "chunks joined back");
}

/// The answer an echo model would give: the request's tensors, named after
/// the requested outputs (the signature's when none are requested) in order.
fn response(req: InferRequest, model: &str, sig: &Signature) -> InferResponse {
    let names: Vec<String> = match req.outputs {
        Some(names) => names,
        None => sig.outputs.iter().map(|o| o.name.clone()).collect(),
    };
    let mut outputs = req.inputs;
    for (t, name) in outputs.iter_mut().zip(names) {
        t.name = name;
    }
    InferResponse {
        model_name: model.into(),
        model_version: Some("1".into()),
        id: req.id,
        outputs,
        batch_id: "fuzz".into(),
    }
}

/// Encodes `resp` as every protocol would. `bounded`: few enough rows for
/// V1, whose encoding costs per row even when rows have no elements.
fn encode_all(resp: &InferResponse, encoding: &OutputEncoding, bounded: bool) {
    for e in [encoding, &OutputEncoding::default(), all_binary()] {
        check_v2(resp, e);
    }
    let mut json = Vec::new();
    JsonResponse::from(resp)
        .write_to(&mut json)
        .expect("a response serializes");
    let back: InferenceResponse = serde_json::from_slice(&json).expect("a JSON response parses back");
    assert_eq!(
        back.outputs.len(),
        resp.outputs.len(),
        "every output in the JSON response"
    );
    binary_reads_back(resp);
    grpc_reads_back(resp);
    if bounded {
        let v1 = serde_json::to_value(v1::encode(resp)).expect("a V1 response serializes");
        let rows = resp.outputs.iter().map(Tensor::rows).max().unwrap_or(0);
        assert_eq!(
            v1["predictions"].as_array().map(Vec::len),
            Some(rows),
            "one V1 prediction per row"
        );
    }
}

/// A V2 response: its JSON part parses, and the binary outputs'
/// `binary_data_size` add up to the bytes after it.
fn check_v2(resp: &InferResponse, encoding: &OutputEncoding) {
    let out = v2_binary::encode_response(resp, encoding);
    let any_binary = resp.outputs.iter().any(|t| encoding.is_binary(&t.name));
    assert_eq!(
        out.header_length.is_some(),
        any_binary,
        "a header length iff binary outputs"
    );
    let json_len = out.header_length.unwrap_or(out.body.len());
    let header: Value = serde_json::from_slice(&out.body[..json_len]).expect("the JSON part parses");
    let sizes: u64 = header["outputs"]
        .as_array()
        .expect("outputs")
        .iter()
        .filter_map(|o| o["parameters"]["binary_data_size"].as_u64())
        .sum();
    assert_eq!(
        sizes,
        (out.body.len() - json_len) as u64,
        "binary_data_size adds up"
    );
}

/// An all-binary V2 response, its `outputs` sent back as a request's
/// `inputs`, decodes to the same tensors, bit for bit.
fn binary_reads_back(resp: &InferResponse) {
    let out = v2_binary::encode_response(resp, all_binary());
    let Some(json_len) = out.header_length else {
        assert!(resp.outputs.is_empty(), "binary outputs have a header length");
        return;
    };
    let mut header: Value = serde_json::from_slice(&out.body[..json_len]).expect("the JSON part parses");
    let mut body = serde_json::to_vec(&json!({ "inputs": header["outputs"].take() })).expect("serializes");
    let len = body.len().to_string();
    body.extend_from_slice(&out.body[json_len..]);
    let back = v2_binary::decode_request(&body, Some(len.as_bytes()), &crate::protocol::shm::NoRegions)
        .unwrap_or_else(|e| panic!("a binary response does not read back as a request: {e}"));
    assert_eq!(back.request.inputs.len(), resp.outputs.len());
    for (a, b) in back.request.inputs.iter().zip(&resp.outputs) {
        assert!(same(a, b), "binary output `{}` read back differs", b.name);
    }
}

/// A gRPC response survives protobuf, and its raw contents decode to the
/// same elements.
fn grpc_reads_back(resp: &InferResponse) {
    let msg = ModelInferResponse::from(resp);
    let back = ModelInferResponse::decode(msg.encode_to_vec().as_slice()).expect("a response decodes");
    assert!(back == msg, "a gRPC response changes through protobuf");
    for ((t, o), raw) in resp
        .outputs
        .iter()
        .zip(&msg.outputs)
        .zip(&msg.raw_output_contents)
    {
        let shape: Vec<usize> = o
            .shape
            .iter()
            .map(|&d| usize::try_from(d).expect("dim"))
            .collect();
        assert_eq!(shape, t.shape, "gRPC shape of `{}`", t.name);
        let dtype = DataType::parse(&o.datatype).expect("a protocol datatype");
        let data = binary::decode(&t.name, dtype, &shape, raw).expect("raw contents decode");
        assert!(
            binary::encode(&data) == raw.as_ref(),
            "raw contents of `{}`",
            t.name
        );
    }
}

/// Equal tensors, comparing elements bit for bit (NaN equals itself).
fn same(a: &Tensor, b: &Tensor) -> bool {
    a.name == b.name
        && a.shape == b.shape
        && a.dtype() == b.dtype()
        && binary::encode(&a.data) == binary::encode(&b.data)
}

/// Every output as binary data: what a request with `binary_data_output`
/// asks for (built the way a client gets it).
fn all_binary() -> &'static OutputEncoding {
    static ALL: OnceLock<OutputEncoding> = OnceLock::new();
    ALL.get_or_init(|| {
        let body = br#"{"inputs": [], "parameters": {"binary_data_output": true}}"#;
        v2_binary::decode_request(body, None, &crate::protocol::shm::NoRegions)
            .expect("a valid request")
            .outputs
    })
}

/// The signatures of the test fixtures (`scripts/make_models.py`), by model name.
pub fn signatures() -> &'static [(&'static str, Signature)] {
    static SIGS: OnceLock<Vec<(&'static str, Signature)>> = OnceLock::new();
    SIGS.get_or_init(|| {
        let f32s = |shape: &[i64]| (DataType::F32, shape.to_vec());
        let mut sigs = vec![
            (
                "mlp",
                sig(&[("input", f32s(&[-1, 784]))], &[("logits", f32s(&[-1, 10]))]),
            ),
            (
                "digits",
                sig(
                    &[("input", f32s(&[-1, 64]))],
                    &[
                        ("label", (DataType::I64, vec![-1])),
                        ("probabilities", f32s(&[-1, 10])),
                    ],
                ),
            ),
            (
                "multi_io",
                sig(
                    &[("a", f32s(&[-1, 3])), ("b", (DataType::I64, vec![-1]))],
                    &[
                        ("sum", f32s(&[-1, 3])),
                        ("scaled", f32s(&[-1, 3])),
                        ("b_twice", (DataType::I64, vec![-1])),
                    ],
                ),
            ),
            (
                "bf16",
                sig(
                    &[("x", (DataType::Bf16, vec![-1, 2]))],
                    &[("y", (DataType::Bf16, vec![-1, 2])), ("f", f32s(&[-1, 2]))],
                ),
            ),
            (
                "fixed_batch",
                sig(&[("x", f32s(&[3, 2]))], &[("y", f32s(&[3, 2]))]),
            ),
            (
                "scalar_out",
                sig(&[("x", f32s(&[-1, 4]))], &[("total", f32s(&[-1]))]),
            ),
            (
                "varlen",
                sig(&[("x", f32s(&[-1, -1]))], &[("y", f32s(&[-1, -1]))]),
            ),
        ];
        sigs.push(("dtypes", dtypes()));
        sigs
    })
}

/// The `dtypes` fixture: `in_<t>` → `out_<t>`, `[-1, 2]`, for every datatype but BF16.
fn dtypes() -> Signature {
    let types = DataType::ALL.into_iter().filter(|&d| d != DataType::Bf16);
    let spec = |prefix: &str, d: DataType| TensorSpec {
        name: format!("{prefix}_{}", suffix(d)),
        dtype: d,
        shape: vec![-1, 2],
        dim_names: vec![],
    };
    Signature {
        inputs: types.clone().map(|d| spec("in", d)).collect(),
        outputs: types.map(|d| spec("out", d)).collect(),
    }
}

/// The `dtypes` fixture's name for a datatype (`fp32`, `uint8`, `bytes`, ...).
pub fn suffix(d: DataType) -> String {
    d.as_str().to_lowercase()
}

type Spec = (&'static str, (DataType, Vec<i64>));

fn sig(inputs: &[Spec], outputs: &[Spec]) -> Signature {
    let specs = |list: &[Spec]| {
        list.iter()
            .map(|(name, (dtype, shape))| TensorSpec {
                name: name.to_string(),
                dtype: *dtype,
                shape: shape.clone(),
                dim_names: vec![],
            })
            .collect()
    };
    Signature {
        inputs: specs(inputs),
        outputs: specs(outputs),
    }
}
