//! The binary tensor data extension of V2 REST against a real server, with
//! hand-written bodies: every datatype round-trips through the `dtypes`
//! identity model (and BF16 through `bf16`), refusals are 400s that name
//! the problem (a lying `Inference-Header-Content-Length` included) and
//! never hurt the server, and the model-configuration and statistics
//! endpoints answer in Triton's shape.

mod common;

use common::*;
use serde_json::{json, Value};

const HEADER: &str = "Inference-Header-Content-Length";

/// (datatype, raw little-endian bytes of 2 elements, the same elements as JSON)
fn samples() -> Vec<(&'static str, Vec<u8>, Value)> {
    let le = |parts: &[&[u8]]| parts.concat();
    vec![
        ("BOOL", vec![1, 0], json!([true, false])),
        ("UINT8", vec![0, 255], json!([0, 255])),
        (
            "UINT16",
            le(&[&7u16.to_le_bytes(), &65535u16.to_le_bytes()]),
            json!([7, 65535]),
        ),
        (
            "UINT32",
            le(&[&7u32.to_le_bytes(), &u32::MAX.to_le_bytes()]),
            json!([7, u32::MAX]),
        ),
        (
            "UINT64",
            le(&[&7u64.to_le_bytes(), &u64::MAX.to_le_bytes()]),
            json!([7, u64::MAX]),
        ),
        ("INT8", vec![0x80, 0x7f], json!([-128, 127])),
        (
            "INT16",
            le(&[&(-2i16).to_le_bytes(), &i16::MAX.to_le_bytes()]),
            json!([-2, 32767]),
        ),
        (
            "INT32",
            le(&[&(-2i32).to_le_bytes(), &i32::MAX.to_le_bytes()]),
            json!([-2, i32::MAX]),
        ),
        (
            "INT64",
            le(&[&i64::MIN.to_le_bytes(), &5i64.to_le_bytes()]),
            json!([i64::MIN, 5]),
        ),
        ("FP16", vec![0x00, 0x3c, 0x00, 0xc1], json!([1.0, -2.5])),
        (
            "FP32",
            le(&[&0.1f32.to_le_bytes(), &(-2.5f32).to_le_bytes()]),
            json!([0.1, -2.5]),
        ),
        (
            "FP64",
            le(&[&0.1f64.to_le_bytes(), &1e300f64.to_le_bytes()]),
            json!([0.1, 1e300]),
        ),
        (
            "BYTES",
            le(&[&[2, 0, 0, 0], b"hi", &[3, 0, 0, 0], "\u{e9}t".as_bytes()]),
            json!(["hi", "\u{e9}t"]),
        ),
    ]
}

fn suffix(datatype: &str) -> String {
    match datatype {
        "BOOL" => "bool".into(),
        "BYTES" => "bytes".into(),
        other => other.to_lowercase(),
    }
}

/// POSTs `header` JSON followed by `binary`, with the header length `len`
/// (the true one when `None`). Returns status, response headers and body.
async fn post_binary(
    s: &TestServer,
    model: &str,
    header: &Value,
    binary: &[u8],
    len: Option<&str>,
) -> (u16, reqwest::header::HeaderMap, Vec<u8>) {
    let mut body = serde_json::to_vec(header).unwrap();
    let true_len = body.len().to_string();
    body.extend_from_slice(binary);
    let r = s
        .client
        .post(s.url(&format!("/v2/models/{model}/infer")))
        .header(HEADER, len.unwrap_or(&true_len))
        .header("Content-Type", "application/octet-stream")
        .body(body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    (status, headers, r.bytes().await.unwrap().to_vec())
}

/// Splits a binary response into its JSON header and the bytes after it.
fn split(headers: &reqwest::header::HeaderMap, body: &[u8]) -> (Value, Vec<u8>) {
    let n: usize = headers[HEADER].to_str().unwrap().parse().unwrap();
    (serde_json::from_slice(&body[..n]).unwrap(), body[n..].to_vec())
}

/// Every input of `dtypes` as binary data (1 row of 2), every output asked for as binary.
fn dtypes_request() -> (Value, Vec<u8>) {
    let mut inputs = Vec::new();
    let mut outputs = Vec::new();
    let mut binary = Vec::new();
    for (dt, raw, _) in samples() {
        let s = suffix(dt);
        inputs.push(json!({"name": format!("in_{s}"), "shape": [1, 2], "datatype": dt,
            "parameters": {"binary_data_size": raw.len()}}));
        outputs.push(json!({"name": format!("out_{s}"), "parameters": {"binary_data": true}}));
        binary.extend_from_slice(&raw);
    }
    (json!({"id": "b1", "inputs": inputs, "outputs": outputs}), binary)
}

#[tokio::test]
async fn every_datatype_round_trips_as_binary_data() {
    let repo = repo_with(&["dtypes", "bf16"]);
    let s = TestServer::start(repo.path()).await;
    let (header, binary) = dtypes_request();
    let (st, headers, body) = post_binary(&s, "dtypes", &header, &binary, None).await;
    assert_eq!(st, 200, "{}", String::from_utf8_lossy(&body));
    assert_eq!(headers["content-type"], "application/octet-stream");
    let (json, raw) = split(&headers, &body);
    assert_eq!(json["id"], "b1");
    // The identity model gives back exactly the bytes sent, output after output.
    assert_eq!(raw, binary);
    for ((dt, sent, _), out) in samples().iter().zip(json["outputs"].as_array().unwrap()) {
        assert_eq!(out["datatype"], *dt);
        assert_eq!(out["shape"], json!([1, 2]));
        assert_eq!(out["parameters"]["binary_data_size"], sent.len(), "{dt}");
        assert!(out.get("data").is_none(), "{dt}");
    }

    // BF16 (the client side of numpy has no such type: raw bytes by hand).
    let x = [0x3f80u16, 0xc020, 0x0000, 0x4380]; // 1.0, -2.5, 0.0, 256.0
    let raw: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
    let header = json!({"inputs": [{"name": "x", "shape": [2, 2], "datatype": "BF16",
        "parameters": {"binary_data_size": 8}}], "parameters": {"binary_data_output": true}});
    let (st, headers, body) = post_binary(&s, "bf16", &header, &raw, None).await;
    assert_eq!(st, 200, "{}", String::from_utf8_lossy(&body));
    let (json, bytes) = split(&headers, &body);
    assert_eq!(json["outputs"][0]["datatype"], "BF16");
    assert_eq!(&bytes[..8], &raw[..], "y = Identity(x)");
    let f: Vec<f32> = bytes[8..]
        .chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(f, vec![1.0, -2.5, 0.0, 256.0], "f = Cast(x, FLOAT)");
    s.stop().await.unwrap();
}

#[tokio::test]
async fn json_and_binary_mix_in_one_request_and_one_response() {
    let repo = repo_with(&["dtypes"]);
    let s = TestServer::start(repo.path()).await;
    let mut inputs = Vec::new();
    let mut outputs = Vec::new();
    let mut binary = Vec::new();
    for (i, (dt, raw, values)) in samples().into_iter().enumerate() {
        let name = format!("in_{}", suffix(dt));
        if i % 2 == 0 {
            inputs.push(json!({"name": name, "shape": [1, 2], "datatype": dt,
                "parameters": {"binary_data_size": raw.len()}}));
            binary.extend_from_slice(&raw);
        } else {
            inputs.push(json!({"name": name, "shape": [1, 2], "datatype": dt, "data": values}));
        }
        outputs
            .push(json!({"name": format!("out_{}", suffix(dt)), "parameters": {"binary_data": i % 3 == 0}}));
    }
    let header = json!({"inputs": inputs, "outputs": outputs});
    let (st, headers, body) = post_binary(&s, "dtypes", &header, &binary, None).await;
    assert_eq!(st, 200, "{}", String::from_utf8_lossy(&body));
    let (json, raw) = split(&headers, &body);
    let mut offset = 0;
    for (i, ((dt, sent, values), out)) in samples()
        .into_iter()
        .zip(json["outputs"].as_array().unwrap())
        .enumerate()
    {
        if i % 3 == 0 {
            assert_eq!(&raw[offset..offset + sent.len()], &sent[..], "{dt}");
            offset += sent.len();
        } else if dt == "FP16" {
            assert_eq!(out["data"], json!([1.0, -2.5]));
        } else {
            assert_eq!(out["data"], values, "{dt}");
        }
    }
    assert_eq!(offset, raw.len());
    s.stop().await.unwrap();
}

#[tokio::test]
async fn lying_and_malformed_binary_requests_are_400s_and_the_server_carries_on() {
    let repo = repo_with(&["mlp"]);
    let s = TestServer::start(repo.path()).await;
    let x: Vec<u8> = vec![0; 784 * 4];
    let good = json!({"inputs": [{"name": "input", "shape": [1, 784], "datatype": "FP32",
        "parameters": {"binary_data_size": x.len()}}]});
    let json_len = serde_json::to_vec(&good).unwrap().len();
    let cases: Vec<(Value, Vec<u8>, Option<String>, String)> = vec![
        // The header claims more bytes than the whole body.
        (
            good.clone(),
            x.clone(),
            Some("99999999".into()),
            format!(
                "Inference-Header-Content-Length is 99999999 bytes but the request body has only {}",
                json_len + x.len()
            ),
        ),
        // The header cuts the JSON short.
        (
            good.clone(),
            x.clone(),
            Some("10".into()),
            "invalid JSON in the first 10 bytes of the body".into(),
        ),
        // The header reaches into the binary data.
        (
            good.clone(),
            x.clone(),
            Some((json_len + 8).to_string()),
            format!("invalid JSON in the first {}", json_len + 8),
        ),
        // Not a number.
        (
            good.clone(),
            x.clone(),
            Some("lots".into()),
            "Inference-Header-Content-Length must be a byte count".into(),
        ),
        // binary_data_size larger than what was sent.
        (
            good.clone(),
            x[..100].to_vec(),
            None,
            "input `input`: `binary_data_size` is 3136 bytes but only 100".into(),
        ),
        // More bytes than the inputs claim.
        (
            good.clone(),
            [x.clone(), vec![0; 4]].concat(),
            None,
            "but the inputs' `binary_data_size` add up to 3136".into(),
        ),
        // A size that does not fit the shape.
        (
            json!({"inputs": [{"name": "input", "shape": [2, 784], "datatype": "FP32",
            "parameters": {"binary_data_size": x.len()}}]}),
            x.clone(),
            None,
            "input `input`: shape [2, 784] of FP32 needs 6272 bytes of binary data, got 3136".into(),
        ),
    ];
    for (header, binary, len, want) in cases {
        let (st, _, body) = post_binary(&s, "mlp", &header, &binary, len.as_deref()).await;
        let body: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(st, 400, "{body}");
        let msg = body["error"].as_str().unwrap();
        assert!(msg.contains(&want), "got {msg:?}, want it to contain {want:?}");
    }
    // The server still answers, binary and JSON alike.
    let (st, _, body) = post_binary(&s, "mlp", &good, &x, None).await;
    assert_eq!(st, 200, "{}", String::from_utf8_lossy(&body));
    let body: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(body["outputs"][0]["shape"], json!([1, 10]));
    assert_eq!(
        body["outputs"][0]["data"].as_array().unwrap().len(),
        10,
        "JSON output unless asked"
    );
    let (st, _) = s
        .post(
            "/v2/models/mlp/infer",
            &json!({"inputs": [{"name": "input", "shape": [1, 784],
            "datatype": "FP32", "data": vec![0.0; 784]}]}),
        )
        .await;
    assert_eq!(st, 200);
    s.stop().await.unwrap();
}

#[tokio::test]
async fn config_and_statistics_endpoints_answer_in_tritons_shape() {
    let repo = repo_with(&["mlp", "fixed_batch"]);
    let s = TestServer::start(repo.path()).await;
    let (st, c) = s.get("/v2/models/mlp/config").await;
    assert_eq!(st, 200);
    assert_eq!(c["max_batch_size"], 64);
    assert_eq!(c["platform"], "onnxruntime_onnx");
    // Triton's whole shape: every field, defaults written out.
    for (field, name, dims) in [("input", "input", 784), ("output", "logits", 10)] {
        let t = &c[field][0];
        assert_eq!(
            (&t["name"], &t["data_type"], &t["dims"]),
            (&json!(name), &json!("TYPE_FP32"), &json!([dims])),
            "{c}"
        );
        assert_eq!(t["is_shape_tensor"], false, "{c}");
    }
    assert_eq!(c["input"][0]["format"], "FORMAT_NONE", "{c}");
    assert_eq!(c["dynamic_batching"]["max_queue_delay_microseconds"], 2000);
    // A fixed first dimension: no batch dimension, every dim listed.
    let (_, c) = s.get("/v2/models/fixed_batch/config").await;
    assert_eq!(c["max_batch_size"], 0);
    assert_eq!(c["input"][0]["dims"], json!([3, 2]));
    assert!(c.get("dynamic_batching").is_none());

    let rows = fixture("mlp_expected.json")["inputs"].clone();
    let req = json!({"inputs": [{"name": "input", "shape": [16, 784], "datatype": "FP32", "data": rows}]});
    assert_eq!(s.post("/v2/models/mlp/infer", &req).await.0, 200);
    let bad = json!({"inputs": [{"name": "input", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}]});
    assert_eq!(s.post("/v2/models/mlp/infer", &bad).await.0, 400);
    let (st, stats) = s.get("/v2/models/mlp/stats").await;
    assert_eq!(st, 200);
    let m = &stats["model_stats"][0];
    assert_eq!(m["name"], "mlp");
    assert_eq!(m["version"], "1");
    assert_eq!(m["inference_count"], 16);
    assert_eq!(m["execution_count"], 1);
    let i = &m["inference_stats"];
    assert_eq!(i["success"]["count"], 1);
    assert_eq!(i["fail"]["count"], 1);
    assert_eq!(i["queue"]["count"], 1);
    for k in ["compute_input", "compute_infer", "compute_output"] {
        assert_eq!(i[k]["count"], 1, "{k}");
    }
    assert!(i["compute_infer"]["ns"].as_u64().unwrap() > 0);
    assert_eq!(m["batch_stats"][0]["batch_size"], 16);
    let (_, all) = s.get("/v2/models/stats").await;
    assert_eq!(all["model_stats"].as_array().unwrap().len(), 2);
    assert_eq!(s.get("/v2/models/nope/stats").await.0, 404);
    assert_eq!(s.get("/v2/models/nope/config").await.0, 404);
    s.stop().await.unwrap();
}
