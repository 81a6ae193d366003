//! How long decoding a V2 JSON request of one 784-float row takes (the
//! per-request CPU the server spends before batching).
use std::time::Instant;

use sluice::protocol::v2::InferenceRequest;
use sluice::protocol::InferRequest;

fn main() {
    let row: Vec<f32> = (0..784).map(|i| (i as f32 * 0.37).sin()).collect();
    let body = serde_json::to_vec(&serde_json::json!({
        "inputs": [{"name": "input", "shape": [1, 784], "datatype": "FP32", "data": row}]
    }))
    .unwrap();
    let n = 5000;
    let t = Instant::now();
    for _ in 0..n {
        let wire: InferenceRequest = serde_json::from_slice(&body).unwrap();
        let req = InferRequest::try_from(wire).unwrap();
        std::hint::black_box(req);
    }
    println!(
        "{} bytes: {:.1} µs per request",
        body.len(),
        t.elapsed().as_secs_f64() * 1e6 / n as f64
    );
}
