//! Unit tests of the binary tensor data extension: framing, every refusal,
//! and which outputs go as binary.

use serde_json::{json, Value};

use super::*;
use crate::error::ErrorKind;
use crate::protocol::shm::NoRegions;
use crate::tensor::TensorData;

/// A body of `header` JSON followed by `binary`, and the header length as the
/// client would send it.
fn framed(header: Value, binary: &[&[u8]]) -> (Vec<u8>, String) {
    let mut body = serde_json::to_vec(&header).unwrap();
    let len = body.len().to_string();
    for b in binary {
        body.extend_from_slice(b);
    }
    (body, len)
}

fn decode(header: Value, binary: &[&[u8]]) -> Result<DecodedRequest, Error> {
    let (body, len) = framed(header, binary);
    decode_request(&body, Some(len.as_bytes()), &NoRegions)
}

fn invalid(r: Result<DecodedRequest, Error>) -> String {
    let e = r.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    e.to_string()
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[test]
fn binary_and_json_inputs_decode_in_order() {
    let x = f32_bytes(&[1.0, 2.0, 3.0, 4.0]);
    let s: &[u8] = &[1, 0, 0, 0, b'a', 2, 0, 0, 0, b'b', b'c'];
    let header = json!({"id": "7", "inputs": [
        {"name": "x", "shape": [2, 2], "datatype": "FP32", "parameters": {"binary_data_size": 16}},
        {"name": "m", "shape": [2], "datatype": "INT64", "data": [5, 6]},
        {"name": "s", "shape": [2, 1], "datatype": "BYTES", "parameters": {"binary_data_size": 11}}
    ]});
    let d = decode(header, &[&x, s]).unwrap();
    let req = d.request;
    assert_eq!(req.id.as_deref(), Some("7"));
    assert_eq!(req.outputs, None);
    assert_eq!(
        req.inputs,
        vec![
            Tensor::new("x", vec![2, 2], TensorData::F32(vec![1.0, 2.0, 3.0, 4.0])).unwrap(),
            Tensor::new("m", vec![2], TensorData::I64(vec![5, 6])).unwrap(),
            Tensor::new(
                "s",
                vec![2, 1],
                TensorData::Bytes(vec![b"a".to_vec(), b"bc".to_vec()].into())
            )
            .unwrap(),
        ]
    );
    assert!(!d.outputs.is_binary("y"));
}

#[test]
fn a_plain_json_body_needs_no_header() {
    let body = serde_json::to_vec(&json!({"inputs": [
        {"name": "x", "shape": [1], "datatype": "FP32", "data": [0.5]}]}))
    .unwrap();
    let d = decode_request(&body, None, &NoRegions).unwrap();
    assert_eq!(d.request.inputs[0].data, TensorData::F32(vec![0.5]));
    assert_eq!(d.outputs, OutputEncoding::default());
}

fn one_binary_input(size: Value) -> Value {
    json!({"inputs": [{"name": "x", "shape": [2], "datatype": "FP32",
        "parameters": {"binary_data_size": size}}]})
}

#[test]
fn a_header_longer_than_the_body_is_refused() {
    let (body, _) = framed(one_binary_input(json!(8)), &[&[0; 8]]);
    let m = invalid(decode_request(&body, Some(b"100000"), &NoRegions));
    assert_eq!(
        m,
        format!(
            "Inference-Header-Content-Length is 100000 bytes but the request body has only {}",
            body.len()
        )
    );
}

#[test]
fn a_header_shorter_than_the_json_is_refused() {
    let (body, _) = framed(one_binary_input(json!(8)), &[&[0; 8]]);
    let m = invalid(decode_request(&body, Some(b"20"), &NoRegions));
    assert!(
        m.starts_with("invalid JSON in the first 20 bytes of the body"),
        "{m}"
    );
}

#[test]
fn a_header_that_is_not_a_number_is_refused() {
    let (body, _) = framed(one_binary_input(json!(8)), &[&[0; 8]]);
    let m = invalid(decode_request(&body, Some(b"-3"), &NoRegions));
    assert_eq!(
        m,
        "Inference-Header-Content-Length must be a byte count, got \"-3\""
    );
}

#[test]
fn binary_sizes_must_match_the_bytes_sent() {
    // Declares more than the body carries.
    let m = invalid(decode(one_binary_input(json!(8)), &[&[0; 4]]));
    assert!(
        m.starts_with("input `x`: `binary_data_size` is 8 bytes but only 4 bytes"),
        "{m}"
    );
    // Carries more than declared.
    let m = invalid(decode(one_binary_input(json!(8)), &[&[0; 12]]));
    assert!(
        m.contains("12 bytes of binary data") && m.ends_with("add up to 8"),
        "{m}"
    );
    // Declares a size that does not fit the shape.
    let m = invalid(decode(one_binary_input(json!(4)), &[&[0; 4]]));
    assert_eq!(
        m,
        "input `x`: shape [2] of FP32 needs 8 bytes of binary data, got 4"
    );
    // Not a size at all.
    let m = invalid(decode(one_binary_input(json!(-1)), &[]));
    assert_eq!(
        m,
        "input `x`: `binary_data_size` must be a non-negative integer, got -1"
    );
}

#[test]
fn binary_inputs_need_the_header_and_no_json_data() {
    let body = serde_json::to_vec(&one_binary_input(json!(8))).unwrap();
    let m = invalid(decode_request(&body, None, &NoRegions));
    assert!(m.contains("has no Inference-Header-Content-Length header"), "{m}");
    let mut both = one_binary_input(json!(8));
    both["inputs"][0]["data"] = json!([1, 2]);
    let m = invalid(decode(both, &[&[0; 8]]));
    assert_eq!(
        m,
        "input `x`: has both `data` and `binary_data_size`; send one of them"
    );
}

#[test]
fn output_encoding_follows_request_and_output_parameters() {
    let x = f32_bytes(&[1.0, 2.0]);
    let mut header = one_binary_input(json!(8));
    header["parameters"] = json!({"binary_data_output": true});
    header["outputs"] = json!([{"name": "a"}, {"name": "b", "parameters": {"binary_data": false}}]);
    let d = decode(header.clone(), &[&x]).unwrap();
    assert_eq!(d.request.outputs, Some(vec!["a".to_string(), "b".to_string()]));
    assert!(d.outputs.is_binary("a"));
    assert!(!d.outputs.is_binary("b"));
    header["parameters"] = json!({});
    header["outputs"] = json!([{"name": "a", "parameters": {"binary_data": true}}, {"name": "b"}]);
    let d = decode(header.clone(), &[&x]).unwrap();
    assert!(d.outputs.is_binary("a"));
    assert!(!d.outputs.is_binary("b"));
    header["outputs"] = json!([{"name": "a", "parameters": {"binary_data": "yes"}}]);
    let m = invalid(decode(header, &[&x]));
    assert_eq!(
        m,
        "output `a`: parameter `binary_data` must be true or false, got \"yes\""
    );
}

#[test]
fn classification_is_read_from_a_requested_output() {
    let mut header = one_binary_input(json!(8));
    header["outputs"] = json!([{"name": "a", "parameters": {"classification": 3}}]);
    let d = decode(header.clone(), &[&[0; 8]]).unwrap();
    assert_eq!(d.request.classify, vec![("a".to_string(), 3)]);
    header["outputs"] = json!([{"name": "a", "parameters": {"classification": "3"}}]);
    let e = decode(header, &[&[0; 8]]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput);
    assert!(
        e.to_string()
            .contains("output `a`: parameter `classification` must be a positive integer"),
        "{e}"
    );
}

fn response() -> InferResponse {
    InferResponse {
        model_name: "m".into(),
        model_version: Some("1".into()),
        id: Some("7".into()),
        outputs: vec![
            Tensor::new("a", vec![2], TensorData::F32(vec![1.5, -2.0])).unwrap(),
            Tensor::new("b", vec![1], TensorData::Bytes(vec![b"hi".to_vec()].into())).unwrap(),
        ],
        batch_id: "b".into(),
    }
}

#[test]
fn a_json_only_response_is_plain_json() {
    let enc = encode_response(&response(), &OutputEncoding::default());
    assert_eq!(enc.header_length, None);
    let want = r#"{"model_name":"m","model_version":"1","id":"7","outputs":[{"name":"a","shape":[2],"datatype":"FP32","data":[1.5,-2.0]},{"name":"b","shape":[1],"datatype":"BYTES","data":["hi"]}]}"#;
    assert_eq!(String::from_utf8(enc.body).unwrap(), want);
}

#[test]
fn binary_outputs_follow_the_json_header() {
    let encoding = OutputEncoding {
        all: true,
        per_output: HashMap::from([("a".to_string(), false)]),
        shm: HashMap::new(),
    };
    let enc = encode_response(&response(), &encoding);
    let n = enc.header_length.unwrap();
    let header: Value = serde_json::from_slice(&enc.body[..n]).unwrap();
    assert_eq!(
        header,
        json!({"model_name": "m", "model_version": "1", "id": "7", "outputs": [
            {"name": "a", "datatype": "FP32", "shape": [2], "data": [1.5, -2.0]},
            {"name": "b", "datatype": "BYTES", "shape": [1], "parameters": {"binary_data_size": 6}}
        ]})
    );
    assert_eq!(&enc.body[n..], &[2, 0, 0, 0, b'h', b'i']);
}

#[test]
fn schedule_parameters_are_read_and_bad_values_named() {
    let req = |params: Value| json!({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1.0]}], "parameters": params});
    let timeout = |params: Value| decode(req(params), &[]).map(|d| d.request.schedule.timeout);
    // Table: parameters → the request's timeout.
    for (params, want) in [
        (
            json!({"timeout": 1500}),
            Some(std::time::Duration::from_micros(1500)),
        ),
        (json!({"timeout": 0}), None),
        (json!({"priority": 2}), None),
        (json!({"sequence_id": 7}), None),
    ] {
        assert_eq!(timeout(params.clone()).unwrap(), want, "{params}");
    }
    for (params, named) in [
        (
            json!({"timeout": -1}),
            "`timeout` must be a non-negative integer (microseconds), got -1",
        ),
        (json!({"timeout": 2.5}), "`timeout`"),
        (
            json!({"priority": "high"}),
            "`priority` must be a non-negative integer, got \"high\"",
        ),
    ] {
        let m = invalid(decode(req(params.clone()), &[]));
        assert!(m.contains(named), "{params}: {m}");
    }
}

#[test]
fn outputs_in_shared_memory_name_their_region_instead_of_data() {
    let at = crate::protocol::shm::ShmRef {
        region: "out".into(),
        offset: 0,
        byte_size: 64,
    };
    let encoding = OutputEncoding {
        all: true,
        per_output: HashMap::new(),
        shm: HashMap::from([("a".to_string(), at)]),
    };
    let enc = encode_response(&response(), &encoding);
    let n = enc.header_length.unwrap();
    let header: Value = serde_json::from_slice(&enc.body[..n]).unwrap();
    let a = &header["outputs"][0];
    assert_eq!(
        a["parameters"],
        json!({"shared_memory_region": "out", "shared_memory_byte_size": 8})
    );
    assert!(a.get("data").is_none(), "{header}");
    // `b` is binary: its bytes alone follow the header.
    assert_eq!(enc.body.len() - n, 4 + 2);
    // An input naming a region no one registered is a 400 naming it.
    let body = json!({"inputs": [{"name": "x", "shape": [1], "datatype": "INT32",
        "parameters": {"shared_memory_region": "in", "shared_memory_byte_size": 4}}]});
    let m = invalid(decode_request(body.to_string().as_bytes(), None, &NoRegions));
    assert!(
        m.contains("input `x`: shared memory region 'in' is not registered"),
        "{m}"
    );
}
