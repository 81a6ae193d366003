//! The binary tensor data extension of the V2 REST protocol (Triton's
//! `binary_tensor_data`), both directions. A request body is a JSON header of
//! `Inference-Header-Content-Length` bytes followed by the raw data of every
//! input whose `parameters.binary_data_size` is set, in the order of
//! `inputs`; without that header the whole body is JSON. A response sends an
//! output as raw bytes after its JSON header when the output's
//! `parameters.binary_data` is true, or, when that is not given, when the
//! request's `parameters.binary_data_output` is. Raw bytes are
//! `super::binary`'s encoding. Pure: no I/O.

use std::collections::HashMap;

use serde::Serialize;
use serde_json::{json, Map, Value};

use super::json::{self, JsonElements};
use super::shm::{self, Regions, ShmRef};
use super::v2::{self, InferenceRequest, JsonResponse, RequestInput};
use super::{binary, classification, InferRequest, InferResponse};
use crate::error::Error;
use crate::tensor::{DataType, Tensor};

/// The header that gives the length of a body's JSON part.
pub const HEADER_LENGTH: &str = "Inference-Header-Content-Length";

/// Which outputs of a response go as binary data.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OutputEncoding {
    /// The request's `binary_data_output`: the default for every output.
    all: bool,
    /// Each requested output's own `binary_data`, when given.
    per_output: HashMap<String, bool>,
    /// The requested outputs to be written to a shared-memory region.
    pub shm: HashMap<String, ShmRef>,
}

impl OutputEncoding {
    /// True when output `name` is sent as binary data.
    pub fn is_binary(&self, name: &str) -> bool {
        self.per_output.get(name).copied().unwrap_or(self.all)
    }
}

/// A decoded request and how its outputs are to be sent.
#[derive(Debug, Clone, PartialEq)]
pub struct DecodedRequest {
    pub request: InferRequest,
    pub outputs: OutputEncoding,
}

/// An encoded response body.
#[derive(Debug, Clone, PartialEq)]
pub struct EncodedResponse {
    /// JSON header, then the binary outputs' raw bytes.
    pub body: Vec<u8>,
    /// Length of the JSON header when binary data follows it (the value of
    /// [`HEADER_LENGTH`]); `None` when the whole body is JSON.
    pub header_length: Option<usize>,
}

/// Reads a boolean parameter; `what` names where it was found.
fn bool_param(params: Option<&Map<String, Value>>, key: &str, what: &str) -> Result<Option<bool>, Error> {
    match params.and_then(|p| p.get(key)) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(other) => Err(Error::invalid(format!(
            "{what}: parameter `{key}` must be true or false, got {}",
            json::show(&other.to_string())
        ))),
    }
}

/// Splits `body` at the JSON header length given by the [`HEADER_LENGTH`]
/// header (`header`, its raw value), decodes the JSON, and reads each binary
/// input from the bytes after it. Every mismatch (a header larger than the
/// body, a `binary_data_size` that does not fit, bytes no input claims) is a
/// 400 naming the input and the byte counts. An input in shared memory is
/// read from `regions`.
pub fn decode_request(
    body: &[u8],
    header: Option<&[u8]>,
    regions: &dyn Regions,
) -> Result<DecodedRequest, Error> {
    // The usual all-JSON body in one pass; anything else (and every error)
    // the serde way below.
    if header.is_none() {
        if let Some(request) = super::v2_scan::decode(body) {
            return Ok(DecodedRequest {
                request,
                outputs: OutputEncoding::default(),
            });
        }
    }
    decode_request_serde(body, header, regions)
}

/// [`decode_request`] through `serde_json` and [`v2::decode_input`]: every
/// body, with the error messages.
pub(crate) fn decode_request_serde(
    body: &[u8],
    header: Option<&[u8]>,
    regions: &dyn Regions,
) -> Result<DecodedRequest, Error> {
    let json_len = json_length(body, header)?;
    let (json, binary) = body.split_at(json_len);
    let wire: InferenceRequest = serde_json::from_slice(json).map_err(|e| match header {
        Some(_) => Error::invalid(format!(
            "invalid JSON in the first {json_len} bytes of the body ({HEADER_LENGTH}): {e}"
        )),
        None => Error::invalid(format!("invalid JSON body: {e}")),
    })?;
    let all = bool_param(wire.parameters.as_ref(), "binary_data_output", "request")?.unwrap_or(false);
    let schedule = super::v2::schedule(wire.parameters.as_ref())?;
    let sequence = super::v2::sequence(wire.parameters.as_ref())?;

    let mut rest = Binary {
        left: binary,
        total: binary.len(),
        json_len,
        framed: header.is_some(),
        regions,
    };
    let inputs = wire
        .inputs
        .into_iter()
        .map(|input| rest.input(input))
        .collect::<Result<Vec<_>, _>>()?;
    if !rest.left.is_empty() {
        return Err(Error::invalid(format!(
            "the body has {} bytes of binary data after its {json_len}-byte JSON header, \
             but the inputs' `binary_data_size` add up to {}",
            rest.total,
            rest.total - rest.left.len()
        )));
    }

    let mut per_output = HashMap::new();
    let mut in_shm = HashMap::new();
    let mut classify = Vec::new();
    let outputs = match wire.outputs {
        None => None,
        Some(outs) => {
            let mut names = Vec::with_capacity(outs.len());
            for o in outs {
                let what = format!("output `{}`", o.name);
                if let Some(n) = classification::from_json(o.parameters.as_ref(), &what)? {
                    classify.push((o.name.clone(), n));
                }
                if let Some(b) = bool_param(o.parameters.as_ref(), "binary_data", &what)? {
                    per_output.insert(o.name.clone(), b);
                }
                if let Some(at) = shm::from_json(o.parameters.as_ref(), &what)? {
                    in_shm.insert(o.name.clone(), at);
                }
                names.push(o.name);
            }
            Some(names)
        }
    };
    Ok(DecodedRequest {
        request: InferRequest {
            id: wire.id,
            inputs,
            outputs,
            schedule,
            sequence,
            classify,
        },
        outputs: OutputEncoding {
            all,
            per_output,
            shm: in_shm,
        },
    })
}

/// The length of the body's JSON part: the [`HEADER_LENGTH`] header's value
/// (`header`, raw), or the whole body without one.
pub fn json_length(body: &[u8], header: Option<&[u8]>) -> Result<usize, Error> {
    let Some(raw) = header else {
        return Ok(body.len());
    };
    let text = std::str::from_utf8(raw).unwrap_or("").trim();
    let n: usize = text.parse().map_err(|_| {
        Error::invalid(format!(
            "{HEADER_LENGTH} must be a byte count, got {:?}",
            String::from_utf8_lossy(raw)
        ))
    })?;
    if n > body.len() {
        return Err(Error::invalid(format!(
            "{HEADER_LENGTH} is {n} bytes but the request body has only {}",
            body.len()
        )));
    }
    Ok(n)
}

/// The binary data after a body's JSON part, taken by its inputs in order.
struct Binary<'b, 'r> {
    /// What the inputs so far left.
    left: &'b [u8],
    /// All of it.
    total: usize,
    /// The JSON part's length.
    json_len: usize,
    /// Whether the body has a [`HEADER_LENGTH`] header (else it is all JSON).
    framed: bool,
    /// The shared-memory regions inputs may be in.
    regions: &'r dyn Regions,
}

impl Binary<'_, '_> {
    /// Decodes one input: from its JSON `data`, from the next
    /// `binary_data_size` bytes, or from a shared-memory region.
    fn input(&mut self, input: RequestInput<'_>) -> Result<Tensor, Error> {
        let what = format!("input `{}`", input.name);
        if let Some(at) = shm::from_json(input.parameters.as_ref(), &what)? {
            if input.data.is_some() || binary_size(&input, &what)?.is_some() {
                return Err(Error::invalid(format!(
                    "{what}: has `shared_memory_region` and also `data` or `binary_data_size`; send one of them"
                )));
            }
            return shm::read_input(input.name, &input.datatype, &input.shape, &at, self.regions);
        }
        let Some(size) = binary_size(&input, &what)? else {
            return v2::decode_input(input);
        };
        if !self.framed {
            return Err(Error::invalid(format!(
                "{what}: `binary_data_size` is {size}, but the request has no {HEADER_LENGTH} header, \
                 so its whole body is JSON and carries no binary data"
            )));
        }
        if input.data.is_some() {
            return Err(Error::invalid(format!(
                "{what}: has both `data` and `binary_data_size`; send one of them"
            )));
        }
        if size > self.left.len() {
            return Err(Error::invalid(format!(
                "{what}: `binary_data_size` is {size} bytes but only {} bytes of binary data are left \
                 (the body has {} bytes after its {}-byte JSON header)",
                self.left.len(),
                self.total,
                self.json_len
            )));
        }
        let (mine, rest) = self.left.split_at(size);
        self.left = rest;
        let dtype = v2::parse_datatype(&what, &input.datatype)?;
        let (shape, _) = v2::parse_shape(&what, &input.shape)?;
        let data = binary::decode(&what, dtype, &shape, mine)?;
        Ok(Tensor {
            name: input.name,
            shape,
            data,
        })
    }
}

/// An input's `binary_data_size`, if it has one.
fn binary_size(input: &RequestInput<'_>, what: &str) -> Result<Option<usize>, Error> {
    match input.parameters.as_ref().and_then(|p| p.get("binary_data_size")) {
        None => Ok(None),
        Some(v) => v
            .as_u64()
            .and_then(|n| usize::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| {
                Error::invalid(format!(
                    "{what}: `binary_data_size` must be a non-negative integer, got {}",
                    json::show(&v.to_string())
                ))
            }),
    }
}

/// The JSON header of a response with binary outputs: as
/// [`InferenceResponse`], but a binary output has `binary_data_size` in its
/// parameters instead of `data`.
#[derive(Serialize)]
struct Header<'a> {
    model_name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    model_version: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<&'a str>,
    outputs: Vec<HeaderOutput<'a>>,
}

#[derive(Serialize)]
struct HeaderOutput<'a> {
    name: &'a str,
    datatype: &'static str,
    shape: &'a [usize],
    #[serde(skip_serializing_if = "Option::is_none")]
    parameters: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    data: Option<JsonElements<'a>>,
}

/// Bytes a plain JSON response of `resp` takes, about: reserved up front,
/// so that writing the body does not grow it step by step.
fn json_len_estimate(resp: &InferResponse) -> usize {
    // Text of one element and its separator: an f32 is at most 15 bytes.
    let width = |d: DataType| match d {
        DataType::U8 | DataType::I8 => 4,
        DataType::Bool => 6,
        DataType::U16 | DataType::I16 => 7,
        _ => 16,
    };
    let names = resp.model_name.len() + resp.id.as_deref().map_or(0, str::len);
    let outputs: usize = resp
        .outputs
        .iter()
        .map(|t| 64 + t.name.len() + 8 * t.shape.len() + width(t.dtype()) * t.data.len())
        .sum();
    64 + names + outputs
}

/// Encodes a response: plain JSON (as [`InferenceResponse`]) when no output
/// is binary, else the JSON header followed by each binary output's raw
/// bytes in output order.
pub fn encode_response(resp: &InferResponse, encoding: &OutputEncoding) -> EncodedResponse {
    let binary: Vec<&Tensor> = resp
        .outputs
        .iter()
        .filter(|t| encoding.is_binary(&t.name) && !encoding.shm.contains_key(&t.name))
        .collect();
    if binary.is_empty() && encoding.shm.is_empty() {
        let mut body = Vec::with_capacity(json_len_estimate(resp));
        JsonResponse::from(resp)
            .write_to(&mut body)
            .expect("an inference response serializes. This is a bug.");
        return EncodedResponse {
            body,
            header_length: None,
        };
    }
    let header = Header {
        model_name: &resp.model_name,
        model_version: resp.model_version.as_deref(),
        id: resp.id.as_deref(),
        outputs: resp
            .outputs
            .iter()
            .map(|t| {
                let in_shm = encoding.shm.get(&t.name);
                let is_binary = in_shm.is_none() && encoding.is_binary(&t.name);
                let parameters = match in_shm {
                    Some(at) => Some(json!({
                        "shared_memory_region": at.region,
                        "shared_memory_byte_size": binary::encoded_len(&t.data),
                    })),
                    None => is_binary.then(|| json!({ "binary_data_size": binary::encoded_len(&t.data) })),
                };
                HeaderOutput {
                    name: &t.name,
                    datatype: t.dtype().as_str(),
                    shape: &t.shape,
                    parameters,
                    data: (!is_binary && in_shm.is_none()).then(|| JsonElements::flat(&t.data)),
                }
            })
            .collect(),
    };
    let mut body = Vec::new();
    serde_json::to_writer(&mut body, &header).expect("a response header serializes. This is a bug.");
    if binary.is_empty() {
        return EncodedResponse {
            body,
            header_length: None,
        };
    }
    let header_length = body.len();
    body.reserve(binary.iter().map(|t| binary::encoded_len(&t.data)).sum());
    for t in binary {
        binary::encode_into(&t.data, &mut body);
    }
    EncodedResponse {
        body,
        header_length: Some(header_length),
    }
}

#[cfg(test)]
mod tests;
