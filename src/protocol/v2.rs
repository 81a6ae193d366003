//! The Open Inference Protocol (KServe V2) REST wire types, the decoding
//! of an input that carries JSON `data` ([`decode_input`]), and the JSON
//! response ([`JsonResponse`]). `super::v2_binary` reads a whole request
//! body (JSON, or a JSON header and binary data) with these types.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::json::{self, JsonElements, Layout};
use super::InferResponse;
use crate::error::Error;
use crate::tensor::{DataType, Signature, Tensor, TensorSpec};

/// Body of `POST /v2/models/{name}[/versions/{v}]/infer`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct InferenceRequest<'a> {
    /// Client's id, echoed in the response.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Request parameters (e.g. `binary_data_output`, read by `super::v2_binary`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<Map<String, Value>>,
    /// The input tensors.
    #[serde(borrow)]
    pub inputs: Vec<RequestInput<'a>>,
    /// The outputs wanted; all of the model's outputs when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outputs: Option<Vec<RequestOutput>>,
}

/// One input tensor of an [`InferenceRequest`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RequestInput<'a> {
    pub name: String,
    /// Dimensions; all must be non-negative.
    pub shape: Vec<i64>,
    /// Protocol datatype name (`"FP32"`, `"BYTES"`, ...).
    pub datatype: String,
    /// Per-input parameters; `binary_data_size` marks binary tensor data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<Map<String, Value>>,
    /// The elements, row-major, flat or nested, as their JSON text (parsed
    /// straight into a typed vector once the datatype is known:
    /// `super::json::read`), borrowed from the body. Absent (or null) with
    /// binary data.
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    pub data: Option<&'a RawValue>,
}

/// One requested output of an [`InferenceRequest`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RequestOutput {
    pub name: String,
    /// Per-output parameters (e.g. `binary_data`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<Map<String, Value>>,
}

/// Body of a successful infer response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InferenceResponse {
    pub model_name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_version: Option<String>,
    /// The request's id, echoed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<Map<String, Value>>,
    /// The output tensors.
    pub outputs: Vec<ResponseOutput>,
}

/// One output tensor of an [`InferenceResponse`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResponseOutput {
    pub name: String,
    pub shape: Vec<usize>,
    /// Protocol datatype name.
    pub datatype: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<Map<String, Value>>,
    /// The elements, flat, row-major.
    pub data: Vec<Value>,
}

/// Body of `GET /v2`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServerMetadata {
    pub name: String,
    pub version: String,
    /// Protocol extensions the server supports (`"binary_tensor_data"`, ...).
    pub extensions: Vec<String>,
}

/// The protocol extensions sluice serves, as Triton names them
/// (`schedule_policy`: the `timeout` and `priority` request parameters;
/// `sequence`: `sequence_id` (integers and strings), `sequence_start`,
/// `sequence_end`).
pub const EXTENSIONS: [&str; 9] = [
    "binary_tensor_data",
    "classification",
    "model_repository",
    "model_configuration",
    "statistics",
    "schedule_policy",
    "sequence",
    "sequence(string_id)",
    "system_shared_memory",
];

impl ServerMetadata {
    /// sluice's own metadata: its name, its version and [`EXTENSIONS`].
    pub fn sluice() -> Self {
        ServerMetadata {
            name: "sluice".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            extensions: EXTENSIONS.iter().map(|e| e.to_string()).collect(),
        }
    }
}

/// Body of `GET /v2/models/{name}[/versions/{v}]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelMetadata {
    pub name: String,
    pub versions: Vec<String>,
    /// `"onnxruntime_onnx"`, or `"ensemble"` for a pipeline.
    pub platform: String,
    pub inputs: Vec<MetadataTensor>,
    pub outputs: Vec<MetadataTensor>,
}

/// An input or output in [`ModelMetadata`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetadataTensor {
    pub name: String,
    pub datatype: String,
    /// Dimensions, `-1` where dynamic.
    pub shape: Vec<i64>,
}

impl From<&TensorSpec> for MetadataTensor {
    fn from(t: &TensorSpec) -> Self {
        MetadataTensor {
            name: t.name.clone(),
            datatype: t.dtype.as_str().to_string(),
            shape: t.shape.clone(),
        }
    }
}

impl ModelMetadata {
    /// Metadata of a model from its signature; `versions` is empty without a version.
    pub fn new(name: &str, version: Option<&str>, sig: &Signature) -> Self {
        ModelMetadata {
            name: name.to_string(),
            versions: version.map(|v| vec![v.to_string()]).unwrap_or_default(),
            platform: "onnxruntime_onnx".to_string(),
            inputs: sig.inputs.iter().map(MetadataTensor::from).collect(),
            outputs: sig.outputs.iter().map(MetadataTensor::from).collect(),
        }
    }

    /// Lists `versions` (every version of the model that serves, where
    /// several serve side by side), when there are any.
    pub fn with_versions(&mut self, versions: Vec<String>) {
        if !versions.is_empty() {
            self.versions = versions;
        }
    }
}

/// Parses a protocol datatype name; `what` names the tensor in the error,
/// which lists the names allowed.
pub(crate) fn parse_datatype(what: &str, datatype: &str) -> Result<DataType, Error> {
    DataType::parse(datatype).ok_or_else(|| {
        let allowed: Vec<&str> = DataType::ALL.iter().map(|d| d.as_str()).collect();
        Error::invalid(format!(
            "{what}: unknown datatype \"{datatype}\"; expected one of {}",
            allowed.join(", ")
        ))
    })
}

/// Checks a wire shape (every dimension non-negative, the product in range)
/// and returns it with its element count.
pub(crate) fn parse_shape(what: &str, wire: &[i64]) -> Result<(Vec<usize>, usize), Error> {
    let mut shape = Vec::with_capacity(wire.len());
    let mut count: usize = 1;
    for &d in wire {
        let d = usize::try_from(d)
            .map_err(|_| Error::invalid(format!("{what}: shape {wire:?} has a negative dimension")))?;
        count = count
            .checked_mul(d)
            .ok_or_else(|| Error::invalid(format!("{what}: shape {wire:?} is too large")))?;
        shape.push(d);
    }
    Ok((shape, count))
}

/// Decodes an input whose elements are in its JSON `data` (one without
/// binary data: `super::v2_binary` takes those).
pub(crate) fn decode_input(input: RequestInput<'_>) -> Result<Tensor, Error> {
    let what = format!("input `{}`", input.name);
    let dtype = parse_datatype(&what, &input.datatype)?;
    let (shape, count) = parse_shape(&what, &input.shape)?;
    let Some(raw) = &input.data else {
        return Err(Error::invalid(format!("{what}: `data` is missing")));
    };
    let mut data = crate::tensor::TensorData::with_capacity(dtype, 0);
    let read = json::read(&what, raw.get().as_bytes(), &mut data, Layout::Count(count))?;
    if read.leaves != count {
        return Err(Error::invalid(format!(
            "{what}: shape {:?} needs {count} elements, got {}",
            input.shape, read.leaves
        )));
    }
    Ok(Tensor {
        name: input.name,
        shape,
        data,
    })
}

/// The request's sequence parameters from its `parameters`.
pub(crate) fn sequence(
    params: Option<&Map<String, Value>>,
) -> Result<Option<super::sequence::Sequence>, Error> {
    use super::sequence::Value as V;
    super::sequence::read(|key| {
        let v = params?.get(key)?;
        Some(match v {
            Value::Bool(b) => V::Bool(*b),
            Value::String(s) => V::Text(s),
            Value::Number(n) => match (n.as_u64(), n.as_i64()) {
                (Some(u), _) => V::Unsigned(u),
                (None, Some(i)) => V::Signed(i),
                _ => V::Other(n.to_string()),
            },
            other => V::Other(json::show(&other.to_string()).to_string()),
        })
    })
}

/// The request's `timeout` and `priority` from its `parameters`, as
/// [`super::schedule_params`] reads them.
pub(crate) fn schedule(params: Option<&Map<String, Value>>) -> Result<super::Schedule, Error> {
    let int = |key: &str| {
        let v = params?.get(key)?;
        Some(v.as_u64().ok_or_else(|| json::show(&v.to_string())))
    };
    super::schedule_params(int("timeout"), int("priority"))
}

/// A response as JSON, borrowed from the [`InferResponse`]: the fields of
/// [`InferenceResponse`] in its order, each output's elements written
/// straight from its typed vector.
#[derive(Serialize)]
pub struct JsonResponse<'a> {
    model_name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    model_version: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<&'a str>,
    outputs: Vec<JsonOutput<'a>>,
}

#[derive(Serialize)]
struct JsonOutput<'a> {
    name: &'a str,
    shape: &'a [usize],
    datatype: &'static str,
    data: JsonElements<'a>,
}

impl JsonResponse<'_> {
    /// Writes the response as compact JSON (FP32 outputs as their shortest decimals).
    pub fn write_to<W: std::io::Write>(&self, w: W) -> serde_json::Result<()> {
        serde_json::to_writer(w, self)
    }
}

impl<'a> From<&'a InferResponse> for JsonResponse<'a> {
    fn from(resp: &'a InferResponse) -> Self {
        JsonResponse {
            model_name: &resp.model_name,
            model_version: resp.model_version.as_deref(),
            id: resp.id.as_deref(),
            outputs: resp
                .outputs
                .iter()
                .map(|t| JsonOutput {
                    name: &t.name,
                    shape: &t.shape,
                    datatype: t.dtype().as_str(),
                    data: JsonElements::flat(&t.data),
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;
    use crate::protocol::InferRequest;
    use crate::tensor::TensorData;
    use serde_json::json;

    /// What the server decodes from a JSON body through serde_json.
    fn decode(body: Value) -> Result<InferRequest, Error> {
        decode_text(&body.to_string())
    }

    fn decode_text(text: &str) -> Result<InferRequest, Error> {
        super::super::v2_binary::decode_request_serde(text.as_bytes(), None, &crate::protocol::shm::NoRegions)
            .map(|d| d.request)
    }

    /// The response as a client reads it: its text, parsed.
    fn wire(resp: &InferResponse) -> Value {
        let mut text = Vec::new();
        JsonResponse::from(resp).write_to(&mut text).unwrap();
        serde_json::from_slice(&text).unwrap()
    }

    fn decode_err(body: Value) -> String {
        let e = decode(body).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
        e.to_string()
    }

    fn one(shape: Value, datatype: &str, data: Value) -> Value {
        json!({"inputs": [{"name": "x", "shape": shape, "datatype": datatype, "data": data}]})
    }

    #[test]
    fn golden_request_decodes() {
        let req = decode_text(include_str!("../../tests/fixtures/v2/infer-request.json")).unwrap();
        assert_eq!(req.id.as_deref(), Some("42"));
        assert_eq!(req.outputs, Some(vec!["y".to_string()]));
        let x = Tensor::new(
            "x",
            vec![2, 3],
            TensorData::F32(vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.5]),
        )
        .unwrap();
        let mask = Tensor::new("mask", vec![2, 2], TensorData::I64(vec![1, 0, 0, 1])).unwrap();
        assert_eq!(req.inputs, vec![x, mask]);
    }

    #[test]
    fn golden_bad_dtype_names_input_and_allowed_list() {
        let m = decode_text(include_str!(
            "../../tests/fixtures/v2/infer-request-bad-dtype.json"
        ))
        .unwrap_err()
        .to_string();
        assert_eq!(
            m,
            "input `x`: unknown datatype \"FLOAT32\"; expected one of BOOL, UINT8, UINT16, UINT32, UINT64, \
             INT8, INT16, INT32, INT64, FP16, BF16, FP32, FP64, BYTES"
        );
    }

    #[test]
    fn golden_response_encodes() {
        let resp = InferResponse {
            model_name: "mdl".into(),
            model_version: Some("1".into()),
            id: Some("42".into()),
            outputs: vec![
                Tensor::new("y", vec![2, 2], TensorData::F32(vec![0.1, 1.5, -2.0, 3.25])).unwrap(),
                Tensor::new(
                    "label",
                    vec![2],
                    TensorData::Bytes(vec![b"cat".to_vec(), b"dog".to_vec()].into()),
                )
                .unwrap(),
            ],
            batch_id: "b-1".into(),
        };
        let got = wire(&resp);
        let want: Value =
            serde_json::from_str(include_str!("../../tests/fixtures/v2/infer-response.json")).unwrap();
        assert_eq!(got, want);
        // The golden file parses back into the wire type.
        assert_eq!(
            serde_json::from_value::<InferenceResponse>(want)
                .unwrap()
                .outputs
                .len(),
            2
        );
    }

    #[test]
    fn nested_and_flat_data_decode_equal() {
        let flat = decode(one(json!([2, 2]), "INT32", json!([1, 2, 3, 4]))).unwrap();
        let nested = decode(one(json!([2, 2]), "INT32", json!([[1, 2], [3, 4]]))).unwrap();
        // Nesting that does not follow the shape is fine when the count matches (as in Triton).
        let odd = decode(one(json!([2, 2]), "INT32", json!([[1], [2, 3], 4]))).unwrap();
        assert_eq!(flat, nested);
        assert_eq!(flat, odd);
    }

    #[test]
    fn every_datatype_round_trips_through_the_wire() {
        let cases = [
            ("BOOL", json!([true, false])),
            ("UINT8", json!([0, 255])),
            ("UINT16", json!([1, 65535])),
            ("UINT32", json!([1, 4294967295u32])),
            ("UINT64", json!([1, u64::MAX])),
            ("INT8", json!([-128, 127])),
            ("INT16", json!([-1, 32767])),
            ("INT32", json!([-1, 7])),
            ("INT64", json!([i64::MIN, 7])),
            ("FP16", json!([0.25, -1.0])),
            ("BF16", json!([0.25, -1.0])),
            ("FP32", json!([0.1, -1.0])),
            ("FP64", json!([0.1, -1.0])),
            ("BYTES", json!(["a", "héllo"])),
        ];
        for (datatype, data) in cases {
            let req = decode(one(json!([2]), datatype, data.clone())).unwrap();
            let resp = InferResponse {
                model_name: "m".into(),
                model_version: None,
                id: None,
                outputs: req.inputs,
                batch_id: "b".into(),
            };
            let wire = wire(&resp);
            let want = json!({"model_name": "m", "outputs": [
                {"name": "x", "shape": [2], "datatype": datatype, "data": data}]});
            assert_eq!(wire, want, "{datatype}");
        }
    }

    #[test]
    fn count_mismatch_is_refused() {
        let m = decode_err(one(json!([2, 3]), "FP32", json!([[1, 2, 3], [4, 5]])));
        assert_eq!(m, "input `x`: shape [2, 3] needs 6 elements, got 5");
    }

    #[test]
    fn bad_shapes_and_data_are_refused() {
        let m = decode_err(one(json!([-1, 3]), "FP32", json!([1, 2, 3])));
        assert_eq!(m, "input `x`: shape [-1, 3] has a negative dimension");
        let m = decode_err(one(json!([1]), "FP32", json!(5)));
        assert_eq!(m, "input `x`: `data` must be an array, got 5");
        let m = decode_err(one(json!([1]), "FP32", json!([{"a": 1}])));
        assert!(m.starts_with("input `x`: `data` holds an object"), "{m}");
        let body = json!({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32"}]});
        assert_eq!(decode_err(body), "input `x`: `data` is missing");
        let m = decode_err(one(json!([u64::MAX / 2, 4]), "FP32", json!([1])));
        assert!(m.ends_with("is too large"), "{m}");
    }

    #[test]
    fn element_errors_name_the_input() {
        let m = decode_err(one(json!([2]), "INT32", json!([1, 1.5])));
        assert_eq!(m, "input `x`: element 1 is 1.5, expected an integer for INT32");
        let m = decode_err(one(json!([2]), "FP32", json!([1, "2"])));
        assert_eq!(m, "input `x`: element 1 is \"2\", expected a number for FP32");
    }

    #[test]
    fn requested_outputs_ignore_binary_data_for_now() {
        let mut body = one(json!([1]), "FP32", json!([1]));
        body["outputs"] = json!([{"name": "y", "parameters": {"binary_data": true}}, {"name": "z"}]);
        assert_eq!(
            decode(body).unwrap().outputs,
            Some(vec!["y".to_string(), "z".to_string()])
        );
    }

    #[test]
    fn model_metadata_lists_the_signature() {
        let sig = Signature {
            inputs: vec![TensorSpec {
                name: "x".into(),
                dtype: DataType::F32,
                shape: vec![-1, 3],
                dim_names: vec![],
            }],
            outputs: vec![TensorSpec {
                name: "y".into(),
                dtype: DataType::I64,
                shape: vec![-1],
                dim_names: vec![],
            }],
        };
        let meta = serde_json::to_value(ModelMetadata::new("mdl", Some("2"), &sig)).unwrap();
        let want = json!({"name": "mdl", "versions": ["2"], "platform": "onnxruntime_onnx",
            "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 3]}],
            "outputs": [{"name": "y", "datatype": "INT64", "shape": [-1]}]});
        assert_eq!(meta, want);
    }
}
