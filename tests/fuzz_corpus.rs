//! Replays every committed fuzz input (`fuzz/corpus/<target>/` and
//! `fuzz/regressions/<target>/`) through the functions the `fuzz/` targets
//! call (`sluice::fuzz`), so that `cargo test` catches a regression without
//! cargo-fuzz. `derive_seeds` (ignored) writes the V2 binary and gRPC seeds
//! from the V2 JSON ones: `cargo test --test fuzz_corpus -- --ignored`.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use prost::Message;
use serde_json::{json, Value};
use sluice::protocol::grpc::inference::model_infer_request::{InferInputTensor, InferRequestedOutputTensor};
use sluice::protocol::grpc::inference::{InferParameter, InferTensorContents, ModelInferRequest};
use sluice::protocol::{binary, v2_binary};
use sluice::tensor::{Tensor, TensorData};

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz")
}

/// The files of `fuzz/<kind>/<target>/`, sorted; none when it is absent.
fn files(kind: &str, target: &str) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(fuzz_dir().join(kind).join(target)) else {
        return Vec::new();
    };
    let mut paths: Vec<PathBuf> = entries.map(|e| e.expect("a directory entry").path()).collect();
    paths.sort();
    paths
}

#[test]
fn every_committed_fuzz_input_replays_without_a_panic() {
    let mut failed = Vec::new();
    for (target, run) in sluice::fuzz::TARGETS {
        let seeds = files("corpus", target);
        assert!(
            seeds.len() >= 20,
            "fuzz/corpus/{target}/ has only {} inputs",
            seeds.len()
        );
        for path in seeds.iter().chain(&files("regressions", target)) {
            let data = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            if catch_unwind(AssertUnwindSafe(|| run(&data))).is_err() {
                failed.push(path.display().to_string());
            }
        }
    }
    assert!(failed.is_empty(), "these inputs panic: {failed:#?}");
}

/// The V2 JSON seeds that decode, with their JSON and tensors, by file stem.
fn json_seeds() -> Vec<(String, Value, Vec<Tensor>)> {
    files("corpus", "v2_json")
        .into_iter()
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("seed-"))
        })
        .filter_map(|path| {
            let data = std::fs::read(&path).ok()?;
            let decoded = v2_binary::decode_request(&data, None, &sluice::protocol::shm::NoRegions).ok()?;
            let stem = path
                .file_stem()?
                .to_string_lossy()
                .trim_start_matches("seed-")
                .to_string();
            Some((stem, serde_json::from_slice(&data).ok()?, decoded.request.inputs))
        })
        .collect()
}

fn write_seed(target: &str, name: &str, data: &[u8]) {
    let dir = fuzz_dir().join("corpus").join(target);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(format!("seed-{name}")), data).unwrap();
}

/// A `v2_binary` fuzz input: the header value, a newline, the body.
fn framed(header: &str, json: &[u8], binary: &[u8]) -> Vec<u8> {
    let mut out = format!("{header}\n").into_bytes();
    out.extend_from_slice(json);
    out.extend_from_slice(binary);
    out
}

/// `body` with the inputs whose index `binary(i)` holds sent as binary data.
fn to_binary(body: &Value, tensors: &[Tensor], binary: impl Fn(usize) -> bool) -> Vec<u8> {
    let mut body = body.clone();
    let mut raw = Vec::new();
    for (i, (input, t)) in body["inputs"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .zip(tensors)
        .enumerate()
    {
        if binary(i) {
            let bytes = binary::encode(&t.data);
            let input = input.as_object_mut().unwrap();
            input.remove("data");
            input.insert("parameters".into(), json!({ "binary_data_size": bytes.len() }));
            raw.extend(bytes);
        }
    }
    let json = serde_json::to_vec(&body).unwrap();
    framed(&json.len().to_string(), &json, &raw)
}

fn derive_v2_binary(seeds: &[(String, Value, Vec<Tensor>)]) {
    for (name, body, tensors) in seeds {
        write_seed(
            "v2_binary",
            &format!("{name}.bin"),
            &to_binary(body, tensors, |_| true),
        );
        if tensors.len() > 1 {
            write_seed(
                "v2_binary",
                &format!("{name}-mixed.bin"),
                &to_binary(body, tensors, |i| i == 0),
            );
        }
    }
    let x = |shape: &str, dt: &str, size: &str| {
        format!(
            r#"{{"inputs":[{{"name":"x","shape":{shape},"datatype":"{dt}","parameters":{{"binary_data_size":{size}}}}}]}}"#
        )
    };
    let f32s: Vec<u8> = [1f32, 2., 3., 4.].iter().flat_map(|f| f.to_le_bytes()).collect();
    let edge: [(&str, String, Vec<u8>, &str); 12] = [
        ("header-past-body", x("[1,4]", "FP32", "16"), f32s.clone(), "1000"),
        (
            "header-not-a-number",
            x("[1,4]", "FP32", "16"),
            f32s.clone(),
            "abc",
        ),
        ("header-spaces", x("[1,4]", "FP32", "16"), f32s.clone(), "spaces"),
        ("bytes-left-over", x("[1,2]", "FP32", "8"), f32s.clone(), ""),
        ("size-past-end", x("[1,4]", "FP32", "17"), f32s.clone(), ""),
        ("size-not-a-count", x("[1,4]", "FP32", "-16"), f32s.clone(), ""),
        ("odd-byte-count", x("[1,2]", "FP32", "7"), f32s[..7].to_vec(), ""),
        ("bytes-short-prefix", x("[1,1]", "BYTES", "3"), vec![1, 0, 0], ""),
        (
            "bytes-long-length",
            x("[1,1]", "BYTES", "6"),
            vec![9, 0, 0, 0, b'a', b'b'],
            "",
        ),
        (
            "bytes-two",
            x("[2]", "BYTES", "10"),
            vec![1, 0, 0, 0, b'a', 1, 0, 0, 0, 0xff],
            "",
        ),
        (
            "rows-of-nothing",
            x("[1000000000000,0]", "FP32", "0"),
            Vec::new(),
            "",
        ),
        ("json-cut", x("[1,4]", "FP32", "16"), f32s.clone(), "20"),
    ];
    for (name, json, raw, header) in edge {
        let header = match header {
            "" => json.len().to_string(),
            "spaces" => format!(" {} ", json.len()),
            other => other.to_string(),
        };
        write_seed(
            "v2_binary",
            &format!("{name}.bin"),
            &framed(&header, json.as_bytes(), &raw),
        );
    }
    write_seed("v2_binary", "empty.bin", b"\n");
    write_seed("v2_binary", "no-newline.bin", b"12");
}

fn input(t: &Tensor, contents: Option<InferTensorContents>) -> InferInputTensor {
    InferInputTensor {
        name: t.name.clone(),
        datatype: t.dtype().as_str().to_string(),
        shape: t.shape.iter().map(|&d| d as i64).collect(),
        parameters: HashMap::new(),
        contents,
    }
}

/// The typed `contents` of `data`, `None` for FP16 and BF16 (they have none).
fn typed(data: &TensorData) -> Option<InferTensorContents> {
    let mut c = InferTensorContents::default();
    match data.clone() {
        TensorData::Bool(v) => c.bool_contents = v,
        TensorData::U8(v) => c.uint_contents = v.into_iter().map(u32::from).collect(),
        TensorData::U16(v) => c.uint_contents = v.into_iter().map(u32::from).collect(),
        TensorData::U32(v) => c.uint_contents = v,
        TensorData::U64(v) => c.uint64_contents = v,
        TensorData::I8(v) => c.int_contents = v.into_iter().map(i32::from).collect(),
        TensorData::I16(v) => c.int_contents = v.into_iter().map(i32::from).collect(),
        TensorData::I32(v) => c.int_contents = v,
        TensorData::I64(v) => c.int64_contents = v,
        TensorData::F32(v) => c.fp32_contents = v,
        TensorData::F64(v) => c.fp64_contents = v,
        TensorData::Bytes(v) => c.bytes_contents = v.iter().map(<[u8]>::to_vec).collect(),
        TensorData::F16(_) | TensorData::Bf16(_) => return None,
    }
    Some(c)
}

fn request(body: &Value, inputs: Vec<InferInputTensor>, raw: Vec<Vec<u8>>) -> ModelInferRequest {
    let outputs = body["outputs"].as_array().into_iter().flatten();
    ModelInferRequest {
        model_name: "m".into(),
        id: body["id"].as_str().unwrap_or_default().into(),
        inputs,
        outputs: outputs
            .map(|o| InferRequestedOutputTensor {
                name: o["name"].as_str().unwrap_or_default().into(),
                ..Default::default()
            })
            .collect(),
        raw_input_contents: raw.into_iter().map(Into::into).collect(),
        ..Default::default()
    }
}

fn derive_grpc(seeds: &[(String, Value, Vec<Tensor>)]) {
    for (name, body, tensors) in seeds {
        let inputs = tensors.iter().map(|t| input(t, None)).collect();
        let raw = tensors.iter().map(|t| binary::encode(&t.data)).collect();
        write_seed(
            "grpc",
            &format!("{name}.pb"),
            &request(body, inputs, raw).encode_to_vec(),
        );
        if let Some(inputs) = tensors
            .iter()
            .map(|t| typed(&t.data).map(|c| input(t, Some(c))))
            .collect()
        {
            let req = request(body, inputs, Vec::new());
            write_seed("grpc", &format!("{name}-typed.pb"), &req.encode_to_vec());
        }
    }
    let x = Tensor::new("x", vec![1, 4], TensorData::F32(vec![1., 2., 3., 4.])).unwrap();
    let raw = || vec![binary::encode(&x.data)];
    let none = Value::Null;
    let mut both = request(&none, vec![input(&x, typed(&x.data))], raw());
    let two_raw = request(&none, vec![input(&x, None)], vec![raw()[0].clone(), Vec::new()]);
    let no_data = request(&none, vec![input(&x, None)], Vec::new());
    let mut f16 = input(&x, typed(&x.data));
    f16.datatype = "FP16".into();
    let mut narrow = input(
        &x,
        Some(InferTensorContents {
            uint_contents: vec![1, 300, 2, 3],
            ..Default::default()
        }),
    );
    narrow.datatype = "UINT8".into();
    let mut short = input(&x, typed(&x.data));
    short.shape = vec![2, 4];
    let mut shm = input(&x, None);
    shm.parameters
        .insert("shared_memory_region".into(), InferParameter::default());
    let mut nothing = input(&x, None);
    nothing.shape = vec![1_000_000_000_000, 0];
    let mut negative = input(&x, None);
    negative.shape = vec![-1, 4];
    let mut unknown = input(&x, None);
    unknown.datatype = "FLOAT".into();
    both.id = "both".into();
    let edge = [
        ("both-contents-and-raw", both),
        ("two-raw-one-input", two_raw),
        ("no-data", no_data),
        ("fp16-typed", request(&none, vec![f16], Vec::new())),
        ("uint8-out-of-range", request(&none, vec![narrow], Vec::new())),
        ("typed-count-mismatch", request(&none, vec![short], Vec::new())),
        ("shared-memory", request(&none, vec![shm], raw())),
        ("rows-of-nothing", request(&none, vec![nothing], vec![Vec::new()])),
        ("negative-dim", request(&none, vec![negative], raw())),
        ("unknown-datatype", request(&none, vec![unknown], raw())),
    ];
    for (name, req) in edge {
        let bytes = req.encode_to_vec();
        if name == "both-contents-and-raw" {
            write_seed("grpc", "truncated.pb", &bytes[..bytes.len() / 2]);
        }
        write_seed("grpc", &format!("{name}.pb"), &bytes);
    }
    write_seed("grpc", "empty.pb", b"");
}

/// Writes `fuzz/corpus/{v2_binary,grpc}/seed-*` from `fuzz/corpus/v2_json/seed-*`
/// (every input as binary data / raw contents, and as typed gRPC contents),
/// plus edge cases of each framing.
#[test]
#[ignore = "writes the derived seed corpus; run by hand"]
fn derive_seeds() {
    let seeds = json_seeds();
    assert!(seeds.len() >= 10, "only {} V2 JSON seeds decode", seeds.len());
    derive_v2_binary(&seeds);
    derive_grpc(&seeds);
}
