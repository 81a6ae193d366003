//! Protocol-independent requests and responses, and what the wire protocols
//! share: checking a request against a model's signature ([`validate`]) and
//! the JSON tensor codec (`json`). `v1`, `v2` (with
//! `v2_binary`, the binary tensor data extension) and `grpc` translate their
//! wire shapes into [`InferRequest`] and out of [`InferResponse`]; `binary`
//! is the raw tensor encoding the last two share; `model_config` and
//! `statistics` are Triton's extensions of the same names. The rest of the
//! server sees only these types. Pure: serde and data, no I/O.

pub mod binary;
pub mod classification;
pub mod grpc;
mod json;
pub mod model_config;
pub mod openai;
pub mod sequence;
pub mod shm;
pub mod statistics;
pub mod v1;
pub mod v2;
pub mod v2_binary;
mod v2_scan;

use crate::error::Error;
use crate::tensor::{Signature, Tensor, TensorSpec};

/// A decoded inference request, independent of protocol.
#[derive(Debug, Clone, PartialEq)]
pub struct InferRequest {
    /// The client's request id, echoed in the response.
    pub id: Option<String>,
    /// The input tensors; in signature order once [`validate`] has run.
    pub inputs: Vec<Tensor>,
    /// Requested output names; `None` = all of the model's outputs.
    pub outputs: Option<Vec<String>>,
    /// Its schedule-policy parameters (`timeout`, `priority`).
    pub schedule: Schedule,
    /// Requested outputs to answer with their top classes (Triton's
    /// classification extension): (output, how many).
    pub classify: Vec<(String, usize)>,
    /// Its sequence parameters (Triton's sequence extension), when it has any.
    pub sequence: Option<sequence::Sequence>,
}

/// Triton's schedule-policy parameters of one request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Schedule {
    /// The request's own deadline (`timeout`, in microseconds; 0 or absent:
    /// the model's): it may shorten the model's `timeout`, never lengthen it.
    pub timeout: Option<std::time::Duration>,
    /// Its priority level (`priority`; 1 is the highest; 0 or absent: the
    /// model's `default_priority`), checked against the model's `priority_levels`.
    pub priority: Option<u64>,
}

/// The answer to one [`InferRequest`], independent of protocol.
#[derive(Debug, Clone, PartialEq)]
pub struct InferResponse {
    /// Shared with the model's batcher: a clone per answer, no copy.
    pub model_name: std::sync::Arc<str>,
    pub model_version: Option<String>,
    /// The request's id, echoed.
    pub id: Option<String>,
    /// This request's rows of each output.
    pub outputs: Vec<Tensor>,
    /// Id of the batch this request ran in (shared by every request of that batch).
    pub batch_id: std::sync::Arc<str>,
}

impl InferRequest {
    /// Rows (instances) in this request: dim 0 of the first input, 0 without inputs.
    pub fn rows(&self) -> usize {
        self.inputs.first().map_or(0, Tensor::rows)
    }

    /// Bytes its decoded tensors hold (see [`TensorData::heap_bytes`]).
    pub fn heap_bytes(&self) -> usize {
        self.inputs.iter().map(|t| t.data.heap_bytes()).sum()
    }

    /// What the request will hold while it runs, for the byte budget: its
    /// decoded tensors, and for each BYTES element what the runtime makes
    /// of it ([`RUNTIME_BYTES_PER_STRING`]), which dwarfs a short string.
    pub fn held_bytes(&self) -> usize {
        let strings: usize = self
            .inputs
            .iter()
            .filter_map(|t| match &t.data {
                crate::tensor::TensorData::Bytes(s) => Some(s.len()),
                _ => None,
            })
            .sum();
        self.heap_bytes()
            .saturating_add(strings.saturating_mul(RUNTIME_BYTES_PER_STRING))
    }
}

/// What ONNX Runtime holds per BYTES element of a run: a `std::string` (32
/// bytes, its text inline when short) for the input and more for an output
/// of as many elements, the pointers handed to it and the offsets read
/// back; measured at about 98 bytes an element of an identity model
/// (`scripts/bytes_body.py BINARY 1 63 0`, benches/README.md).
pub const RUNTIME_BYTES_PER_STRING: usize = 104;

/// `` `a`, `b` `` for messages that list the names a model accepts.
fn names<'a>(names: impl IntoIterator<Item = &'a String>) -> String {
    let list: Vec<String> = names.into_iter().map(|n| format!("`{n}`")).collect();
    if list.is_empty() {
        "none".to_string()
    } else {
        list.join(", ")
    }
}

/// Checks a request against a model signature and puts `req.inputs` in
/// signature order. Checks: no unknown or duplicate inputs, every signature
/// input present, datatypes equal, ranks and fixed dims equal, and, when
/// every input has a dynamic dim 0, the same non-zero dim 0 on all inputs;
/// requested outputs exist and are not repeated. On error `req.inputs` is
/// left partly consumed: answer the error, don't reuse the request.
pub fn validate(req: &mut InferRequest, model: &str, sig: &Signature) -> Result<(), Error> {
    let expected_inputs = || names(sig.inputs.iter().map(|s| &s.name));
    for (i, t) in req.inputs.iter().enumerate() {
        if sig.input(&t.name).is_none() {
            return Err(Error::invalid(format!(
                "model `{model}` has no input `{}`; its inputs are {}",
                t.name,
                expected_inputs()
            )));
        }
        if req.inputs[..i].iter().any(|o| o.name == t.name) {
            return Err(Error::invalid(format!(
                "input `{}` is given more than once",
                t.name
            )));
        }
    }
    // The usual request names every input in signature order: checked in
    // place; otherwise the inputs are put in signature order.
    let in_order = req.inputs.len() == sig.inputs.len()
        && req
            .inputs
            .iter()
            .zip(&sig.inputs)
            .all(|(t, spec)| t.name == spec.name);
    if in_order {
        for (t, spec) in req.inputs.iter().zip(&sig.inputs) {
            check_input(t, spec)?;
        }
    } else {
        let mut ordered = Vec::with_capacity(sig.inputs.len());
        for spec in &sig.inputs {
            let Some(pos) = req.inputs.iter().position(|t| t.name == spec.name) else {
                return Err(Error::invalid(format!(
                    "model `{model}`: missing input `{}`; its inputs are {}",
                    spec.name,
                    expected_inputs()
                )));
            };
            let t = req.inputs.swap_remove(pos);
            check_input(&t, spec)?;
            ordered.push(t);
        }
        req.inputs = ordered;
    }

    if let Some(outputs) = &req.outputs {
        for (i, name) in outputs.iter().enumerate() {
            if sig.output(name).is_none() {
                return Err(Error::invalid(format!(
                    "model `{model}` has no output `{name}`; its outputs are {}",
                    names(sig.outputs.iter().map(|s| &s.name))
                )));
            }
            if outputs[..i].contains(name) {
                return Err(Error::invalid(format!(
                    "output `{name}` is requested more than once"
                )));
            }
        }
    }
    Ok(())
}

/// An input's datatype and shape against its signature entry.
fn check_input(t: &Tensor, spec: &TensorSpec) -> Result<(), Error> {
    if t.dtype() != spec.dtype {
        return Err(Error::invalid(format!(
            "input `{}`: expected datatype {}, got {}",
            t.name,
            spec.dtype,
            t.dtype()
        )));
    }
    let dims_ok = t.shape.len() == spec.shape.len()
        && t.shape
            .iter()
            .zip(&spec.shape)
            .all(|(&got, &want)| want < 0 || i64::try_from(got) == Ok(want));
    if !dims_ok {
        return Err(Error::invalid(format!(
            "input `{}`: expected shape {:?}, got {:?}",
            t.name, spec.shape, t.shape
        )));
    }
    Ok(())
}

/// Triton's schedule-policy parameters of a request, from their integer
/// values (`None`: absent; `Err`: the value the client sent, for the
/// message): `timeout` in microseconds and `priority`, 0 meaning the
/// model's for each. A value that is not a non-negative integer is a 400
/// naming the parameter.
pub(crate) fn schedule_params(
    timeout: Option<Result<u64, String>>,
    priority: Option<Result<u64, String>>,
) -> Result<Schedule, Error> {
    let bad = |key: &str, got: &str| {
        Error::invalid(format!(
            "request: parameter `{key}` must be a non-negative integer{}, got {got}",
            if key == "timeout" { " (microseconds)" } else { "" }
        ))
    };
    let priority = match priority {
        None | Some(Ok(0)) => None,
        Some(Ok(level)) => Some(level),
        Some(Err(got)) => return Err(bad("priority", &got)),
    };
    let timeout = match timeout {
        None | Some(Ok(0)) => None,
        Some(Ok(us)) => Some(std::time::Duration::from_micros(us)),
        Some(Err(got)) => return Err(bad("timeout", &got)),
    };
    Ok(Schedule { timeout, priority })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::{DataType, TensorData, TensorSpec};

    fn err(r: Result<impl std::fmt::Debug, Error>) -> String {
        let e = r.unwrap_err();
        assert_eq!(e.kind(), crate::error::ErrorKind::InvalidInput, "{e}");
        e.to_string()
    }

    fn sig() -> Signature {
        let spec = |name: &str, dtype, shape: &[i64]| TensorSpec {
            name: name.into(),
            dtype,
            shape: shape.to_vec(),
            dim_names: vec![],
        };
        Signature {
            inputs: vec![
                spec("x", DataType::F32, &[-1, 3]),
                spec("m", DataType::I64, &[-1]),
            ],
            outputs: vec![spec("y", DataType::F32, &[-1]), spec("z", DataType::F32, &[-1])],
        }
    }

    fn x(rows: usize) -> Tensor {
        Tensor::new("x", vec![rows, 3], TensorData::F32(vec![0.0; rows * 3])).unwrap()
    }

    #[test]
    fn held_bytes_count_what_the_runtime_makes_of_each_string() {
        let strings = crate::tensor::Strings::empties(1000);
        let req = InferRequest {
            id: None,
            inputs: vec![
                Tensor::new("s", vec![1000], TensorData::Bytes(strings)).unwrap(),
                Tensor::new("f", vec![10], TensorData::F32(vec![0.0; 10])).unwrap(),
            ],
            outputs: None,
            schedule: Default::default(),
            classify: Vec::new(),
            sequence: None,
        };
        // 1,000 ends of 8 bytes and 40 bytes of floats, then the runtime's share.
        assert_eq!(req.heap_bytes(), 8040);
        assert_eq!(req.held_bytes(), 8040 + 1000 * RUNTIME_BYTES_PER_STRING);
    }

    fn m(rows: usize) -> Tensor {
        Tensor::new("m", vec![rows], TensorData::I64(vec![0; rows])).unwrap()
    }

    fn check(inputs: Vec<Tensor>, outputs: Option<Vec<&str>>) -> Result<InferRequest, Error> {
        let outputs = outputs.map(|o| o.into_iter().map(String::from).collect());
        let mut req = InferRequest {
            schedule: Default::default(),
            classify: Vec::new(),
            sequence: None,
            id: None,
            inputs,
            outputs,
        };
        validate(&mut req, "mdl", &sig()).map(|()| req)
    }

    #[test]
    fn validate_reorders_inputs_into_signature_order() {
        let req = check(vec![m(2), x(2)], Some(vec!["z"])).unwrap();
        assert_eq!(req.inputs, vec![x(2), m(2)]);
        assert_eq!(req.rows(), 2);
    }

    #[test]
    fn validate_names_missing_unknown_and_duplicate_inputs() {
        assert_eq!(
            err(check(vec![x(1)], None)),
            "model `mdl`: missing input `m`; its inputs are `x`, `m`"
        );
        let mut w = m(1);
        w.name = "w".into();
        assert_eq!(
            err(check(vec![x(1), w], None)),
            "model `mdl` has no input `w`; its inputs are `x`, `m`"
        );
        assert_eq!(
            err(check(vec![x(1), x(1), m(1)], None)),
            "input `x` is given more than once"
        );
    }

    #[test]
    fn validate_checks_dtype_and_shape() {
        let bad = Tensor::new("m", vec![1], TensorData::I32(vec![0])).unwrap();
        assert_eq!(
            err(check(vec![x(1), bad], None)),
            "input `m`: expected datatype INT64, got INT32"
        );
        let bad = Tensor::new("x", vec![2, 4], TensorData::F32(vec![0.0; 8])).unwrap();
        assert_eq!(
            err(check(vec![bad, m(2)], None)),
            "input `x`: expected shape [-1, 3], got [2, 4]"
        );
        let bad = Tensor::new("x", vec![6], TensorData::F32(vec![0.0; 6])).unwrap();
        assert_eq!(
            err(check(vec![bad, m(6)], None)),
            "input `x`: expected shape [-1, 3], got [6]"
        );
    }

    #[test]
    fn validate_checks_requested_outputs() {
        let m = err(check(vec![x(1), m(1)], Some(vec!["q"])));
        assert_eq!(m, "model `mdl` has no output `q`; its outputs are `y`, `z`");
        let m = err(check(vec![x(1), self::m(1)], Some(vec!["y", "y"])));
        assert_eq!(m, "output `y` is requested more than once");
    }
}
