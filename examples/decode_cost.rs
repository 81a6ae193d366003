//! Per-request CPU of the V2 JSON codec, side by side in one run: decoding
//! a request of one 784-float row (through `serde_json` and
//! `InferRequest::try_from`, and in one pass as the server does:
//! `v2_binary::decode_request`), and encoding a response of 784 floats
//! through `serde_json::Value` (the old path, still used as the reference)
//! and straight from the typed vector (what the server sends).
//!
//! `cargo run --release --example decode_cost`
use std::time::Instant;

use sluice::protocol::v2::{InferenceRequest, InferenceResponse, JsonResponse};
use sluice::protocol::v2_binary::decode_request;
use sluice::protocol::{InferRequest, InferResponse};
use sluice::tensor::{Tensor, TensorData};

fn per_call(n: usize, mut f: impl FnMut()) -> f64 {
    let t = Instant::now();
    for _ in 0..n {
        f();
    }
    t.elapsed().as_secs_f64() * 1e6 / n as f64
}

fn main() {
    let row: Vec<f32> = (0..784).map(|i| (i as f32 * 0.37).sin()).collect();
    let body = serde_json::to_vec(&serde_json::json!({
        "inputs": [{"name": "input", "shape": [1, 784], "datatype": "FP32", "data": row}]
    }))
    .unwrap();
    let resp = InferResponse {
        model_name: "mlp".into(),
        model_version: None,
        id: None,
        outputs: vec![Tensor::new("logits", vec![1, 784], TensorData::F32(row.clone())).unwrap()],
        batch_id: "1".into(),
    };
    let n = 5000;
    for round in 1..=3 {
        let decode = per_call(n, || {
            let wire: InferenceRequest = serde_json::from_slice(&body).unwrap();
            std::hint::black_box(InferRequest::try_from(wire).unwrap());
        });
        let one_pass = per_call(n, || {
            std::hint::black_box(decode_request(&body, None).unwrap());
        });
        let via_value = per_call(n, || {
            std::hint::black_box(serde_json::to_vec(&InferenceResponse::from(&resp)).unwrap());
        });
        let typed = per_call(n, || {
            let mut out = Vec::new();
            JsonResponse::from(&resp).write_to(&mut out).unwrap();
            std::hint::black_box(out);
        });
        println!(
            "round {round}: decode {} B request: serde {decode:.1} µs, one pass {one_pass:.1} µs; encode 784 floats: via Value {via_value:.1} µs, typed {typed:.1} µs ({:.2}x)",
            body.len(),
            via_value / typed
        );
    }
}
