//! The gRPC form of the Open Inference Protocol: the generated
//! `inference` messages and service (from `proto/`, compiled by `build.rs`),
//! and the conversions between `ModelInferRequest` / `ModelInferResponse` and
//! [`InferRequest`] / [`InferResponse`]. Inputs come as `raw_input_contents`
//! (what tritonclient and perf_analyzer send) or as typed `contents`; outputs
//! always go as `raw_output_contents`, as Triton sends them. Pure: no I/O.

use std::collections::HashMap;

use bytes::Bytes;

use super::shm::{self, NoRegions, Regions, ShmRef};
use super::v2::{self, MetadataTensor, ModelMetadata};
use super::{binary, classification, InferRequest, InferResponse};
use crate::error::Error;
use crate::tensor::{DataType, Tensor, TensorData};

pub mod codec;

/// The generated messages, server and client of `inference.GRPCInferenceService`.
#[allow(clippy::all, missing_docs)]
pub mod inference {
    tonic::include_proto!("inference");
}

use inference::model_infer_request::InferInputTensor;
use inference::model_infer_response::InferOutputTensor;
use inference::{InferParameter, InferTensorContents, ModelInferRequest, ModelInferResponse};

/// `None` for the empty string (protobuf's "not given").
pub fn non_empty(s: &str) -> Option<&str> {
    (!s.is_empty()).then_some(s)
}

impl TryFrom<ModelInferRequest> for InferRequest {
    type Error = Error;

    /// Decodes the wire request, with no shared-memory region registered.
    fn try_from(req: ModelInferRequest) -> Result<Self, Error> {
        let (request, in_shm) = decode_request(req, &NoRegions)?;
        match in_shm.into_iter().next() {
            None => Ok(request),
            Some((name, at)) => Err(shm::not_registered(&at.region, &format!("output `{name}`"))),
        }
    }
}

/// Decodes the wire request ([`super::validate`] then checks it against the
/// model), reading inputs in shared memory from `regions`; also returns the
/// requested outputs to be written to a region. `raw_input_contents` holds
/// one entry per input that is not in shared memory, in order.
pub fn decode_request(
    req: ModelInferRequest,
    regions: &dyn Regions,
) -> Result<(InferRequest, HashMap<String, ShmRef>), Error> {
    let schedule = super::schedule_params(
        int_param(&req.parameters, "timeout"),
        int_param(&req.parameters, "priority"),
    )?;
    let sequence = sequence_params(&req.parameters)?;
    let mut places = Vec::with_capacity(req.inputs.len());
    for input in &req.inputs {
        places.push(shm::from_grpc(
            &input.parameters,
            &format!("input `{}`", input.name),
        )?);
    }
    let in_request = places.iter().filter(|p| p.is_none()).count();
    let raw = req.raw_input_contents;
    if !raw.is_empty() && raw.len() != in_request {
        return Err(Error::invalid(format!(
            "raw_input_contents has {} entries but the request has {in_request} inputs not in shared memory; \
             give one per such input, in order",
            raw.len(),
        )));
    }
    let mut raw = raw.into_iter();
    let inputs = req
        .inputs
        .into_iter()
        .zip(places)
        .map(|(input, place)| match place {
            Some(at) => from_region(input, &at, regions),
            None => decode_input(input, raw.next()),
        })
        .collect::<Result<_, _>>()?;
    let mut outputs = Vec::with_capacity(req.outputs.len());
    let mut in_shm = HashMap::new();
    let mut classify = Vec::new();
    for o in req.outputs {
        let what = format!("output `{}`", o.name);
        if let Some(at) = shm::from_grpc(&o.parameters, &what)? {
            in_shm.insert(o.name.clone(), at);
        }
        if let Some(n) = classification::from_grpc(&o.parameters, &what)? {
            classify.push((o.name.clone(), n));
        }
        outputs.push(o.name);
    }
    let request = InferRequest {
        id: non_empty(&req.id).map(str::to_string),
        inputs,
        outputs: (!outputs.is_empty()).then_some(outputs),
        schedule,
        sequence,
        classify,
    };
    Ok((request, in_shm))
}

/// An input whose bytes are in a shared-memory region.
fn from_region(input: InferInputTensor, at: &ShmRef, regions: &dyn Regions) -> Result<Tensor, Error> {
    let what = format!("input `{}`", input.name);
    if input.contents.is_some() {
        return Err(Error::invalid(format!(
            "{what}: has both `contents` and `shared_memory_region`; send one of them"
        )));
    }
    shm::read_input(input.name, &input.datatype, &input.shape, at, regions)
}

/// Parameter `key` as a non-negative integer (Triton's clients send
/// `int64_param`), or what was sent instead.
/// The request's sequence id as text (none for 0 or ""), to keep the
/// requests of one sequence in order on a stream.
pub fn sequence_key(req: &ModelInferRequest) -> Option<String> {
    use inference::infer_parameter::ParameterChoice;
    match req.parameters.get("sequence_id")?.parameter_choice.as_ref()? {
        ParameterChoice::Int64Param(0) | ParameterChoice::Uint64Param(0) => None,
        ParameterChoice::Int64Param(v) => Some(v.to_string()),
        ParameterChoice::Uint64Param(v) => Some(v.to_string()),
        ParameterChoice::StringParam(s) if !s.is_empty() => Some(format!("\"{s}")),
        _ => None,
    }
}

/// The request's sequence parameters (Triton's sequence extension).
fn sequence_params(
    params: &HashMap<String, InferParameter>,
) -> Result<Option<super::sequence::Sequence>, Error> {
    use super::sequence::Value as V;
    use inference::infer_parameter::ParameterChoice;
    super::sequence::read(|key| {
        Some(match params.get(key)?.parameter_choice.as_ref() {
            Some(ParameterChoice::Int64Param(v)) => V::Signed(*v),
            Some(ParameterChoice::Uint64Param(v)) => V::Unsigned(*v),
            Some(ParameterChoice::BoolParam(b)) => V::Bool(*b),
            Some(ParameterChoice::StringParam(s)) => V::Text(s),
            Some(ParameterChoice::DoubleParam(d)) => V::Other(format!("the double {d}")),
            None => V::Other("no value".into()),
        })
    })
}

fn int_param(params: &HashMap<String, InferParameter>, key: &str) -> Option<Result<u64, String>> {
    use inference::infer_parameter::ParameterChoice;
    let choice = params.get(key)?.parameter_choice.as_ref();
    Some(match choice {
        Some(ParameterChoice::Int64Param(v)) => u64::try_from(*v).map_err(|_| v.to_string()),
        Some(ParameterChoice::Uint64Param(v)) => Ok(*v),
        Some(ParameterChoice::BoolParam(b)) => Err(format!("the bool {b}")),
        Some(ParameterChoice::StringParam(s)) => Err(format!("the string \"{s}\"")),
        Some(ParameterChoice::DoubleParam(d)) => Err(format!("the double {d}")),
        None => Err("no value".into()),
    })
}

fn decode_input(input: InferInputTensor, raw: Option<Bytes>) -> Result<Tensor, Error> {
    let what = format!("input `{}`", input.name);
    let dtype = v2::parse_datatype(&what, &input.datatype)?;
    let (shape, count) = v2::parse_shape(&what, &input.shape)?;
    let data = match (raw, input.contents) {
        (Some(_), Some(_)) => {
            return Err(Error::invalid(format!(
                "{what}: has both `contents` and raw_input_contents; send one of them"
            )))
        }
        (Some(bytes), None) => binary::decode(&what, dtype, &shape, &bytes)?,
        (None, Some(contents)) => typed(&what, dtype, contents)?,
        (None, None) => {
            return Err(Error::invalid(format!(
                "{what}: no data (neither `contents` nor raw_input_contents)"
            )))
        }
    };
    if data.len() != count {
        return Err(Error::invalid(format!(
            "{what}: shape {shape:?} needs {count} elements, `contents` holds {}",
            data.len()
        )));
    }
    Ok(Tensor {
        name: input.name,
        shape,
        data,
    })
}

/// Elements from the typed `contents` field that carries `dtype`.
fn typed(what: &str, dtype: DataType, c: InferTensorContents) -> Result<TensorData, Error> {
    fn narrow<W: Copy + std::fmt::Display, N: TryFrom<W>>(
        what: &str,
        dtype: DataType,
        wide: Vec<W>,
    ) -> Result<Vec<N>, Error> {
        wide.into_iter()
            .enumerate()
            .map(|(i, x)| {
                N::try_from(x).map_err(|_| {
                    Error::invalid(format!("{what}: element {i} is {x}, out of range for {dtype}"))
                })
            })
            .collect()
    }
    Ok(match dtype {
        DataType::Bool => TensorData::Bool(c.bool_contents),
        DataType::U8 => TensorData::U8(narrow(what, dtype, c.uint_contents)?),
        DataType::U16 => TensorData::U16(narrow(what, dtype, c.uint_contents)?),
        DataType::U32 => TensorData::U32(c.uint_contents),
        DataType::U64 => TensorData::U64(c.uint64_contents),
        DataType::I8 => TensorData::I8(narrow(what, dtype, c.int_contents)?),
        DataType::I16 => TensorData::I16(narrow(what, dtype, c.int_contents)?),
        DataType::I32 => TensorData::I32(c.int_contents),
        DataType::I64 => TensorData::I64(c.int64_contents),
        DataType::F32 => TensorData::F32(c.fp32_contents),
        DataType::F64 => TensorData::F64(c.fp64_contents),
        DataType::Bytes => TensorData::Bytes(c.bytes_contents.into()),
        DataType::F16 | DataType::Bf16 => {
            return Err(Error::invalid(format!(
                "{what}: {dtype} has no typed `contents` field; send it in raw_input_contents"
            )))
        }
    })
}

impl From<&InferResponse> for ModelInferResponse {
    /// Every output's elements go in `raw_output_contents`, in output order.
    fn from(resp: &InferResponse) -> Self {
        encode_response(resp, &HashMap::new())
    }
}

/// The wire response: every output's elements in `raw_output_contents`, in
/// output order, but for the outputs written to a region (`in_shm`), whose
/// entry is empty and whose parameters name the region and the bytes written.
pub fn encode_response(resp: &InferResponse, in_shm: &HashMap<String, ShmRef>) -> ModelInferResponse {
    let mut outputs = Vec::with_capacity(resp.outputs.len());
    let mut raw = Vec::with_capacity(resp.outputs.len());
    for t in &resp.outputs {
        let mut parameters = HashMap::new();
        match in_shm.get(&t.name) {
            Some(at) => {
                use inference::infer_parameter::ParameterChoice;
                let param = |c| InferParameter {
                    parameter_choice: Some(c),
                };
                let size = i64::try_from(binary::encoded_len(&t.data)).unwrap_or(i64::MAX);
                parameters.insert(
                    "shared_memory_region".to_string(),
                    param(ParameterChoice::StringParam(at.region.clone())),
                );
                parameters.insert(
                    "shared_memory_byte_size".to_string(),
                    param(ParameterChoice::Int64Param(size)),
                );
                raw.push(Bytes::new());
            }
            None => raw.push(Bytes::from(binary::encode(&t.data))),
        }
        outputs.push(InferOutputTensor {
            name: t.name.clone(),
            datatype: t.dtype().as_str().to_string(),
            shape: t.shape.iter().map(|&d| d as i64).collect(),
            parameters,
            contents: None,
        });
    }
    ModelInferResponse {
        model_name: resp.model_name.to_string(),
        model_version: resp.model_version.clone().unwrap_or_default(),
        id: resp.id.clone().unwrap_or_default(),
        parameters: HashMap::new(),
        outputs,
        raw_output_contents: raw,
    }
}

impl From<MetadataTensor> for inference::model_metadata_response::TensorMetadata {
    fn from(t: MetadataTensor) -> Self {
        inference::model_metadata_response::TensorMetadata {
            name: t.name,
            datatype: t.datatype,
            shape: t.shape,
        }
    }
}

impl From<ModelMetadata> for inference::ModelMetadataResponse {
    fn from(m: ModelMetadata) -> Self {
        inference::ModelMetadataResponse {
            name: m.name,
            versions: m.versions,
            platform: m.platform,
            inputs: m.inputs.into_iter().map(Into::into).collect(),
            outputs: m.outputs.into_iter().map(Into::into).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    fn input(name: &str, datatype: &str, shape: &[i64]) -> InferInputTensor {
        InferInputTensor {
            name: name.into(),
            datatype: datatype.into(),
            shape: shape.to_vec(),
            parameters: HashMap::new(),
            contents: None,
        }
    }

    fn request(inputs: Vec<InferInputTensor>, raw: Vec<Vec<u8>>) -> ModelInferRequest {
        ModelInferRequest {
            model_name: "m".into(),
            inputs,
            raw_input_contents: raw.into_iter().map(Bytes::from).collect(),
            ..Default::default()
        }
    }

    fn invalid(r: Result<InferRequest, Error>) -> String {
        let e = r.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
        e.to_string()
    }

    #[test]
    fn raw_contents_decode_per_input() {
        let x: Vec<u8> = [1.0f32, 2.0].iter().flat_map(|v| v.to_le_bytes()).collect();
        let h: Vec<u8> = [half::f16::from_f32(0.5)]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let req = request(
            vec![input("x", "FP32", &[1, 2]), input("h", "FP16", &[1])],
            vec![x, h],
        );
        let req = InferRequest::try_from(req).unwrap();
        assert_eq!(req.id, None);
        assert_eq!(req.outputs, None);
        assert_eq!(req.inputs[0].data, TensorData::F32(vec![1.0, 2.0]));
        assert_eq!(
            req.inputs[1].data,
            TensorData::F16(vec![half::f16::from_f32(0.5)])
        );
    }

    #[test]
    fn typed_contents_decode_with_range_checks() {
        let mut i = input("i", "INT8", &[2]);
        i.contents = Some(InferTensorContents {
            int_contents: vec![-3, 4],
            ..Default::default()
        });
        let got = InferRequest::try_from(request(vec![i.clone()], vec![])).unwrap();
        assert_eq!(got.inputs[0].data, TensorData::I8(vec![-3, 4]));
        i.contents = Some(InferTensorContents {
            int_contents: vec![1, 300],
            ..Default::default()
        });
        let m = invalid(InferRequest::try_from(request(vec![i], vec![])));
        assert_eq!(m, "input `i`: element 1 is 300, out of range for INT8");
        let mut h = input("h", "FP16", &[1]);
        h.contents = Some(InferTensorContents::default());
        let m = invalid(InferRequest::try_from(request(vec![h], vec![])));
        assert!(m.contains("send it in raw_input_contents"), "{m}");
    }

    #[test]
    fn bad_requests_name_the_problem() {
        let m = invalid(InferRequest::try_from(request(
            vec![input("x", "FP32", &[2])],
            vec![vec![0; 4]],
        )));
        assert_eq!(
            m,
            "input `x`: shape [2] of FP32 needs 8 bytes of binary data, got 4"
        );
        let two = vec![input("a", "FP32", &[1]), input("b", "FP32", &[1])];
        let m = invalid(InferRequest::try_from(request(two, vec![vec![0; 4]])));
        assert!(
            m.starts_with("raw_input_contents has 1 entries but the request has 2 inputs"),
            "{m}"
        );
        let m = invalid(InferRequest::try_from(request(
            vec![input("x", "FP32", &[1])],
            vec![],
        )));
        assert!(m.contains("no data"), "{m}");
        let mut c = input("c", "FP32", &[3]);
        c.contents = Some(InferTensorContents {
            fp32_contents: vec![1.0],
            ..Default::default()
        });
        let m = invalid(InferRequest::try_from(request(vec![c], vec![])));
        assert_eq!(m, "input `c`: shape [3] needs 3 elements, `contents` holds 1");
    }

    #[test]
    fn responses_carry_raw_outputs_in_order() {
        let resp = InferResponse {
            model_name: "m".into(),
            model_version: None,
            id: Some("9".into()),
            outputs: vec![
                Tensor::new("y", vec![1, 2], TensorData::I32(vec![1, -1])).unwrap(),
                Tensor::new("s", vec![1], TensorData::Bytes(vec![b"ok".to_vec()].into())).unwrap(),
            ],
            batch_id: "b".into(),
        };
        let wire = ModelInferResponse::from(&resp);
        assert_eq!(wire.id, "9");
        assert_eq!(wire.model_version, "");
        assert_eq!(wire.outputs[0].shape, vec![1, 2]);
        assert_eq!(wire.outputs[1].datatype, "BYTES");
        assert_eq!(
            &wire.raw_output_contents[0][..],
            &[1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff]
        );
        assert_eq!(&wire.raw_output_contents[1][..], &[2, 0, 0, 0, b'o', b'k']);
    }
}
