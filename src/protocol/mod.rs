//! Protocol-independent requests and responses, and what the wire protocols
//! share: checking a request against a model's signature ([`validate`]) and
//! converting JSON values to typed elements and back. `v1`, `v2` (with
//! `v2_binary`, the binary tensor data extension) and `grpc` translate their
//! wire shapes into [`InferRequest`] and out of [`InferResponse`]; `binary`
//! is the raw tensor encoding the last two share; `model_config` and
//! `statistics` are Triton's extensions of the same names. The rest of the
//! server sees only these types. Pure: serde and data, no I/O.

pub mod binary;
pub mod grpc;
mod json_data;
pub mod model_config;
pub mod statistics;
pub mod v1;
pub mod v2;
pub mod v2_binary;

use serde_json::Value;

use crate::error::Error;
use crate::tensor::{DataType, Signature, Tensor, TensorData};

/// A decoded inference request, independent of protocol.
#[derive(Debug, Clone, PartialEq)]
pub struct InferRequest {
    /// The client's request id, echoed in the response.
    pub id: Option<String>,
    /// The input tensors; in signature order once [`validate`] has run.
    pub inputs: Vec<Tensor>,
    /// Requested output names; `None` = all of the model's outputs.
    pub outputs: Option<Vec<String>>,
}

/// The answer to one [`InferRequest`], independent of protocol.
#[derive(Debug, Clone, PartialEq)]
pub struct InferResponse {
    pub model_name: String,
    pub model_version: Option<String>,
    /// The request's id, echoed.
    pub id: Option<String>,
    /// This request's rows of each output.
    pub outputs: Vec<Tensor>,
    /// Id of the batch this request ran in (shared by every request of that batch).
    pub batch_id: String,
}

impl InferRequest {
    /// Rows (instances) in this request: dim 0 of the first input, 0 without inputs.
    pub fn rows(&self) -> usize {
        self.inputs.first().map_or(0, Tensor::rows)
    }
}

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
        ordered.push(t);
    }
    req.inputs = ordered;

    let batched = sig.inputs.iter().all(|s| s.shape.first() == Some(&-1));
    if let (true, Some(first)) = (batched, req.inputs.first()) {
        if first.shape[0] == 0 {
            return Err(Error::invalid(format!(
                "input `{}`: dim 0 is 0; a request needs at least one row",
                first.name
            )));
        }
        if let Some(other) = req.inputs.iter().find(|t| t.shape[0] != first.shape[0]) {
            return Err(Error::invalid(format!(
                "input `{}` has {} rows (dim 0) but input `{}` has {}; every input must have the same dim 0",
                other.name, other.shape[0], first.name, first.shape[0]
            )));
        }
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

/// Refuses a request that uses a parameter of an extension sluice does not
/// serve (shared memory, classification); `keys` are the parameter names of
/// the request, input or output that `what` names. The client asked for
/// something this server does not offer (its metadata lists no such
/// extension), so it is a bad request (400, INVALID_ARGUMENT), not a server
/// failure (501), as Triton answers for a shared-memory region it does not know.
pub(crate) fn refuse_unsupported<'a>(
    keys: impl IntoIterator<Item = &'a String>,
    what: &str,
) -> Result<(), Error> {
    for key in keys {
        let extension = match key.as_str() {
            "shared_memory_region" | "shared_memory_byte_size" | "shared_memory_offset" => "shared-memory",
            "classification" => "classification",
            _ => continue,
        };
        return Err(Error::invalid(format!(
            "{what}: parameter `{key}` belongs to the {extension} extension, which sluice does not serve"
        )));
    }
    Ok(())
}

/// A JSON value for an error message, cut short when long.
fn show(v: &Value) -> String {
    let s = v.to_string();
    match s.char_indices().nth(40) {
        Some((cut, _)) => format!("{}...", &s[..cut]),
        None => s,
    }
}

/// Converts JSON values to elements of `dtype`; `what` names the tensor in
/// errors (e.g. "input `x`"). Float types take any number (ints included) and
/// refuse values their type cannot hold; int types take integral numbers in
/// range (1.5 is refused, 2.0 is 2); BOOL takes `true`/`false`; BYTES takes
/// strings (their UTF-8 bytes).
pub(crate) fn parse_elements(what: &str, dtype: DataType, values: &[&Value]) -> Result<TensorData, Error> {
    let bad = |i: usize, v: &Value, expected: &str| {
        Error::invalid(format!(
            "{what}: element {i} is {}, expected {expected} for {dtype}",
            show(v)
        ))
    };
    let out_of_range = |i: usize, v: &Value| {
        Error::invalid(format!(
            "{what}: element {i} is {}, out of range for {dtype}",
            show(v)
        ))
    };
    let int = |i: usize, v: &Value| -> Result<i128, Error> {
        let Value::Number(n) = v else {
            return Err(bad(i, v, "an integer"));
        };
        if let Some(x) = n.as_i64() {
            return Ok(x.into());
        }
        if let Some(x) = n.as_u64() {
            return Ok(x.into());
        }
        let f = n.as_f64().unwrap_or(f64::NAN);
        if !f.is_finite() || f.fract() != 0.0 {
            return Err(bad(i, v, "an integer"));
        }
        if f.abs() >= 1e38 {
            return Err(out_of_range(i, v));
        }
        Ok(f as i128)
    };
    let float = |i: usize, v: &Value| match v {
        Value::Number(n) => n.as_f64().ok_or_else(|| bad(i, v, "a number")),
        _ => Err(bad(i, v, "a number")),
    };
    macro_rules! each {
        ($variant:ident, |$i:ident, $v:ident| $body:expr) => {
            TensorData::$variant(
                values
                    .iter()
                    .enumerate()
                    .map(|($i, &$v)| $body)
                    .collect::<Result<_, Error>>()?,
            )
        };
    }
    macro_rules! ints {
        ($variant:ident) => {
            each!($variant, |i, v| int(i, v)?
                .try_into()
                .map_err(|_| out_of_range(i, v)))
        };
    }
    // A finite number that its type turns into infinity does not fit.
    macro_rules! floats {
        ($variant:ident, $conv:expr) => {
            each!($variant, |i, v| {
                let x = float(i, v)?;
                let y = $conv(x);
                if y.is_infinite() {
                    Err(out_of_range(i, v))
                } else {
                    Ok(y)
                }
            })
        };
    }
    Ok(match dtype {
        DataType::Bool => each!(Bool, |i, v| v.as_bool().ok_or_else(|| bad(i, v, "true or false"))),
        DataType::U8 => ints!(U8),
        DataType::U16 => ints!(U16),
        DataType::U32 => ints!(U32),
        DataType::U64 => ints!(U64),
        DataType::I8 => ints!(I8),
        DataType::I16 => ints!(I16),
        DataType::I32 => ints!(I32),
        DataType::I64 => ints!(I64),
        DataType::F16 => floats!(F16, half::f16::from_f64),
        DataType::Bf16 => floats!(Bf16, half::bf16::from_f64),
        DataType::F32 => floats!(F32, |x: f64| x as f32),
        DataType::F64 => floats!(F64, |x: f64| x),
        DataType::Bytes => each!(Bytes, |i, v| match v {
            Value::String(s) => Ok(s.as_bytes().to_vec()),
            _ => Err(bad(i, v, "a string")),
        }),
    })
}

/// A 32-bit float as JSON: its shortest decimal form (0.1, not
/// 0.10000000149011612); NaN and infinities as `null`.
fn f32_to_json(x: f32) -> Value {
    if !x.is_finite() {
        return Value::Null;
    }
    serde_json::Number::from_f64(f32_wide(x)).map_or(Value::Null, Value::Number)
}

/// The f64 that a 32-bit float is written as in JSON: the f64 nearest its
/// shortest decimal form (0.1, not 0.10000000149011612).
fn f32_wide(x: f32) -> f64 {
    // Rust's own shortest form (ryu differs on ties: 2110626.25 is "…26.3"
    // here, "…26.2" there), written to the stack: no allocation.
    struct Stack([u8; 64], usize);
    impl std::fmt::Write for Stack {
        fn write_str(&mut self, s: &str) -> std::fmt::Result {
            let end = self.1 + s.len();
            self.0
                .get_mut(self.1..end)
                .ok_or(std::fmt::Error)?
                .copy_from_slice(s.as_bytes());
            self.1 = end;
            Ok(())
        }
    }
    let mut buf = Stack([0; 64], 0);
    if std::fmt::Write::write_fmt(&mut buf, format_args!("{x}")).is_err() {
        return f64::from(x);
    }
    std::str::from_utf8(&buf.0[..buf.1])
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(f64::from(x))
}

/// A tensor's elements as a flat JSON array, serialized straight from the
/// typed vector (no `Value` per element); the same text as
/// [`element_to_json`] gives element by element.
pub(crate) struct JsonElements<'a>(pub &'a TensorData);

impl serde::Serialize for JsonElements<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        fn float<S: SerializeSeq>(seq: &mut S, x: f64) -> Result<(), S::Error> {
            match x.is_finite() {
                true => seq.serialize_element(&x),
                false => seq.serialize_element(&()),
            }
        }
        let data = self.0;
        let mut seq = s.serialize_seq(Some(data.len()))?;
        macro_rules! each {
            ($v:expr, |$x:ident| $body:expr) => {
                for $x in $v.iter() {
                    $body?;
                }
            };
        }
        let small = |x: f32| if x.is_finite() { f32_wide(x) } else { f64::NAN };
        match data {
            TensorData::Bool(v) => each!(v, |x| seq.serialize_element(x)),
            TensorData::U8(v) => each!(v, |x| seq.serialize_element(x)),
            TensorData::U16(v) => each!(v, |x| seq.serialize_element(x)),
            TensorData::U32(v) => each!(v, |x| seq.serialize_element(x)),
            TensorData::U64(v) => each!(v, |x| seq.serialize_element(x)),
            TensorData::I8(v) => each!(v, |x| seq.serialize_element(x)),
            TensorData::I16(v) => each!(v, |x| seq.serialize_element(x)),
            TensorData::I32(v) => each!(v, |x| seq.serialize_element(x)),
            TensorData::I64(v) => each!(v, |x| seq.serialize_element(x)),
            TensorData::F16(v) => each!(v, |x| float(&mut seq, small(x.to_f32()))),
            TensorData::Bf16(v) => each!(v, |x| float(&mut seq, small(x.to_f32()))),
            TensorData::F32(v) => each!(v, |x| float(&mut seq, small(*x))),
            TensorData::F64(v) => each!(v, |x| float(&mut seq, *x)),
            TensorData::Bytes(v) => each!(v, |x| seq.serialize_element(&String::from_utf8_lossy(x))),
        }
        seq.end()
    }
}

/// Element `i` of `data` as JSON: FP16/BF16 as f32 numbers, BYTES as a string
/// (lossy UTF-8), NaN and infinities as `null`. Panics if `i` is out of bounds.
pub(crate) fn element_to_json(data: &TensorData, i: usize) -> Value {
    match data {
        TensorData::Bool(v) => Value::Bool(v[i]),
        TensorData::U8(v) => v[i].into(),
        TensorData::U16(v) => v[i].into(),
        TensorData::U32(v) => v[i].into(),
        TensorData::U64(v) => v[i].into(),
        TensorData::I8(v) => v[i].into(),
        TensorData::I16(v) => v[i].into(),
        TensorData::I32(v) => v[i].into(),
        TensorData::I64(v) => v[i].into(),
        TensorData::F16(v) => f32_to_json(v[i].to_f32()),
        TensorData::Bf16(v) => f32_to_json(v[i].to_f32()),
        TensorData::F32(v) => f32_to_json(v[i]),
        TensorData::F64(v) => serde_json::Number::from_f64(v[i]).map_or(Value::Null, Value::Number),
        TensorData::Bytes(v) => Value::String(String::from_utf8_lossy(&v[i]).into_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::TensorSpec;
    use serde_json::json;

    fn parse(dtype: DataType, values: Value) -> Result<TensorData, Error> {
        let values: Vec<&Value> = values.as_array().unwrap().iter().collect();
        parse_elements("input `x`", dtype, &values)
    }

    fn err(r: Result<impl std::fmt::Debug, Error>) -> String {
        let e = r.unwrap_err();
        assert_eq!(e.kind(), crate::error::ErrorKind::InvalidInput, "{e}");
        e.to_string()
    }

    #[test]
    fn every_datatype_round_trips_through_json() {
        let cases = [
            (DataType::Bool, json!([true, false])),
            (DataType::U8, json!([0, 255])),
            (DataType::U16, json!([0, 65535])),
            (DataType::U32, json!([0, 4294967295u32])),
            (DataType::U64, json!([0, u64::MAX])),
            (DataType::I8, json!([-128, 127])),
            (DataType::I16, json!([-32768, 32767])),
            (DataType::I32, json!([i32::MIN, i32::MAX])),
            (DataType::I64, json!([i64::MIN, i64::MAX])),
            (DataType::F16, json!([0.5, -2.0])),
            (DataType::Bf16, json!([0.5, -2.0])),
            (DataType::F32, json!([0.1, -2.5])),
            (DataType::F64, json!([0.1, 1e300])),
            (DataType::Bytes, json!(["héllo", ""])),
        ];
        for (dtype, values) in cases {
            let data = parse(dtype, values.clone()).unwrap();
            assert_eq!(data.dtype(), dtype);
            let back: Vec<Value> = (0..data.len()).map(|i| element_to_json(&data, i)).collect();
            assert_eq!(Value::Array(back), values, "{dtype}");
        }
    }

    #[test]
    fn ints_are_accepted_for_floats_and_integral_floats_for_ints() {
        assert_eq!(
            parse(DataType::F32, json!([1, 2])).unwrap(),
            TensorData::F32(vec![1.0, 2.0])
        );
        assert_eq!(
            parse(DataType::I32, json!([2.0])).unwrap(),
            TensorData::I32(vec![2])
        );
    }

    #[test]
    fn float_for_int_is_refused() {
        let m = err(parse(DataType::I32, json!([1, 1.5])));
        assert_eq!(m, "input `x`: element 1 is 1.5, expected an integer for INT32");
    }

    #[test]
    fn out_of_range_values_are_refused() {
        let m = err(parse(DataType::U8, json!([1, 2, 3, 4, 300])));
        assert_eq!(m, "input `x`: element 4 is 300, out of range for UINT8");
        assert!(err(parse(DataType::U64, json!([-1]))).contains("out of range for UINT64"));
        assert!(err(parse(DataType::F16, json!([70000]))).contains("out of range for FP16"));
        assert!(err(parse(DataType::F32, json!([1e300]))).contains("out of range for FP32"));
    }

    #[test]
    fn wrong_json_types_are_refused() {
        let m = err(parse(DataType::F32, json!([1.0, "abc"])));
        assert_eq!(m, "input `x`: element 1 is \"abc\", expected a number for FP32");
        assert!(err(parse(DataType::Bool, json!([1]))).contains("expected true or false for BOOL"));
        assert!(err(parse(DataType::Bytes, json!([1]))).contains("expected a string for BYTES"));
        assert!(err(parse(DataType::F64, json!([null]))).contains("element 0 is null"));
    }

    #[test]
    fn non_finite_floats_encode_as_null() {
        let data = TensorData::F32(vec![f32::NAN, f32::INFINITY, 1.0]);
        assert_eq!(element_to_json(&data, 0), Value::Null);
        assert_eq!(element_to_json(&data, 1), Value::Null);
        assert_eq!(element_to_json(&data, 2), json!(1.0));
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

    fn m(rows: usize) -> Tensor {
        Tensor::new("m", vec![rows], TensorData::I64(vec![0; rows])).unwrap()
    }

    fn check(inputs: Vec<Tensor>, outputs: Option<Vec<&str>>) -> Result<InferRequest, Error> {
        let outputs = outputs.map(|o| o.into_iter().map(String::from).collect());
        let mut req = InferRequest {
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
    fn validate_checks_dim0_across_inputs() {
        let m = err(check(vec![x(2), m(3)], None));
        assert_eq!(
            m,
            "input `m` has 3 rows (dim 0) but input `x` has 2; every input must have the same dim 0"
        );
        assert!(err(check(vec![x(0), self::m(0)], None)).contains("dim 0 is 0"));
    }

    #[test]
    fn validate_checks_requested_outputs() {
        let m = err(check(vec![x(1), m(1)], Some(vec!["q"])));
        assert_eq!(m, "model `mdl` has no output `q`; its outputs are `y`, `z`");
        let m = err(check(vec![x(1), self::m(1)], Some(vec!["y", "y"])));
        assert_eq!(m, "output `y` is requested more than once");
    }

    /// The JSON text of a float as sluice always wrote it: the f32's
    /// shortest decimal (Rust's `Display`) read back as an f64, then written
    /// by serde_json; an independent oracle for [`JsonElements`].
    fn old_float(x: f32) -> Value {
        match x.is_finite() {
            true => serde_json::Number::from_f64(x.to_string().parse().unwrap())
                .map_or(Value::Null, Value::Number),
            false => Value::Null,
        }
    }

    #[test]
    fn typed_json_encoding_is_byte_identical_to_the_value_encoding() {
        let mut bits = 0x9e37_79b9u32;
        let mut floats: Vec<f32> = (0..200_000)
            .map(|_| {
                bits ^= bits << 13;
                bits ^= bits >> 17;
                bits ^= bits << 5;
                f32::from_bits(bits)
            })
            .collect();
        floats.extend([
            0.0,
            -0.0,
            1.0,
            3.0,
            0.1,
            1e14,
            1e15,
            1e16,
            1.5e16,
            1e17,
            123456789.0,
            1e-5,
            1e-6,
            1e-45,
            f32::MAX,
            f32::MIN,
            f32::MIN_POSITIVE,
            f32::EPSILON,
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
        ]);
        let text = |d: &TensorData| serde_json::to_string(&JsonElements(d)).unwrap();
        for &x in &floats {
            let want = Value::Array(vec![old_float(x)]).to_string();
            assert_eq!(
                text(&TensorData::F32(vec![x])),
                want,
                "{x:e} ({:#x})",
                x.to_bits()
            );
        }
        let want = Value::Array(floats.iter().map(|&x| old_float(x)).collect()).to_string();
        assert!(text(&TensorData::F32(floats.clone())) == want);
        let doubles: Vec<f64> = floats
            .iter()
            .map(|&x| f64::from(x) * 1.000_000_1)
            .chain([f64::MAX, f64::NAN])
            .collect();
        let via_values =
            |d: &TensorData| Value::Array((0..d.len()).map(|i| element_to_json(d, i)).collect()).to_string();
        let others = [
            TensorData::F64(doubles),
            TensorData::F16(floats.iter().map(|&x| half::f16::from_f32(x)).collect()),
            TensorData::Bf16(floats.iter().map(|&x| half::bf16::from_f32(x)).collect()),
            TensorData::I64(vec![i64::MIN, -1, 0, i64::MAX]),
            TensorData::U64(vec![0, u64::MAX]),
            TensorData::U8(vec![0, 255]),
            TensorData::Bool(vec![true, false]),
            TensorData::Bytes(vec![b"a\"\n".to_vec(), vec![0xff, 0xfe], "é".as_bytes().to_vec()]),
        ];
        for d in &others {
            assert_eq!(text(d), via_values(d), "{:?}", d.dtype());
        }
        // FP16 values through the old f32 path too.
        let h: Vec<half::f16> = floats.iter().map(|&x| half::f16::from_f32(x)).collect();
        let want = Value::Array(h.iter().map(|x| old_float(x.to_f32())).collect()).to_string();
        assert_eq!(text(&TensorData::F16(h)), want);
    }
}
