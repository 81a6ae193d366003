//! Per-request CPU of the JSON tensor codec, side by side in one run: the
//! server's own decoders (`v2_binary::decode_request`, what `POST .../infer`
//! calls; `v1::decode`, what `:predict` calls) on bodies of the forms
//! clients send, and the V2 JSON encoder on a response of 784 floats. Each
//! figure is the mean of many calls; each round runs every case once.
//!
//! `cargo run --release --example decode_cost`
use std::time::Instant;

use sluice::protocol::v2::JsonResponse;
use sluice::protocol::v2_binary::decode_request;
use sluice::protocol::{v1, InferResponse};
use sluice::tensor::{DataType, Signature, Tensor, TensorData, TensorSpec};

fn per_call(n: usize, mut f: impl FnMut()) -> f64 {
    let t = Instant::now();
    for _ in 0..n {
        f();
    }
    t.elapsed().as_secs_f64() * 1e6 / n as f64
}

fn v2_body(datatype: &str, shape: &[usize], data: &str, extra: &str) -> Vec<u8> {
    format!(
        r#"{{{extra}"inputs":[{{"name":"input","shape":{shape:?},"datatype":"{datatype}","data":[{data}]}}]}}"#
    )
    .into_bytes()
}

/// What `:predict` does with a body (kept to the API of the build measured).
fn v1_decode(body: &[u8], sig: &Signature) {
    std::hint::black_box(v1::decode(body, sig).unwrap());
}

fn main() {
    let row: Vec<f32> = (0..784).map(|i| (i as f32 * 0.37).sin().abs()).collect();
    let join = |f: &dyn Fn(f32) -> String| row.iter().map(|&x| f(x)).collect::<Vec<_>>().join(",");
    // serde_json's text of each f32 as an f64: what Python clients send.
    let plain = join(&|x| serde_json::to_string(&f64::from(x)).unwrap());
    let exponent = join(&|x| format!("{x:e}"));
    let ids: Vec<String> = (0..512u64).map(|i| (i * 7919 % 30522).to_string()).collect();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("v2 784 FP32", v2_body("FP32", &[1, 784], &plain, "")),
        ("v2 784 FP32 exponents", v2_body("FP32", &[1, 784], &exponent, "")),
        ("v2 512 INT64", v2_body("INT64", &[2, 256], &ids.join(","), "")),
        (
            "v2 784 FP32 serde path",
            v2_body("FP32", &[1, 784], &plain, r#""parameters":{},"#),
        ),
    ];
    let v1_body = format!(r#"{{"instances":[[{plain}]]}}"#).into_bytes();
    let sig = Signature {
        inputs: vec![TensorSpec {
            name: "input".into(),
            dtype: DataType::F32,
            shape: vec![-1, 784],
            dim_names: vec![],
        }],
        outputs: vec![],
    };
    let resp = InferResponse {
        model_name: "mlp".into(),
        model_version: None,
        id: None,
        outputs: vec![Tensor::new("logits", vec![1, 784], TensorData::F32(row.clone())).unwrap()],
        batch_id: "1".into(),
    };
    let n = 4000;
    for round in 1..=5 {
        let mut line = format!("round {round}:");
        for (name, body) in &cases {
            let us = per_call(n, || {
                std::hint::black_box(decode_request(body, None, &sluice::protocol::shm::NoRegions).unwrap());
            });
            line += &format!(" {name} {us:.2} µs;");
        }
        let us = per_call(n, || v1_decode(&v1_body, &sig));
        line += &format!(" v1 784 FP32 {us:.2} µs;");
        let us = per_call(n, || {
            let mut out = Vec::new();
            JsonResponse::from(&resp).write_to(&mut out).unwrap();
            std::hint::black_box(out);
        });
        line += &format!(" encode 784 FP32 {us:.2} µs");
        println!("{line}");
    }
}
