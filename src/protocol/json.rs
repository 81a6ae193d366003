//! JSON elements of a tensor's `data`: parsing `serde_json::Value` leaves
//! (V1 instances) into typed vectors, and writing typed vectors back as JSON
//! (V1 and V2 responses), FP32 in its shortest decimal form.

use serde_json::Value;

use crate::error::Error;
use crate::tensor::{DataType, TensorData};

/// A JSON value for an error message, cut short when long.
pub(super) fn show(v: &Value) -> String {
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
    // The f64 nearest the f32's shortest decimal: written by serde_json, it
    // is that decimal again.
    let shortest = ryu::Buffer::new().format_finite(x).parse();
    shortest
        .ok()
        .and_then(serde_json::Number::from_f64)
        .map_or(Value::Null, Value::Number)
}

/// A tensor's elements as a flat JSON array, serialized straight from the
/// typed vector (no `Value` per element). FP32 (and FP16, BF16) elements go
/// to the serializer as f32s, which serde_json writes as their shortest
/// decimal: each parses back to the same f32.
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
            TensorData::F16(v) => each!(v, |x| seq.serialize_element(&x.to_f32())),
            TensorData::Bf16(v) => each!(v, |x| seq.serialize_element(&x.to_f32())),
            TensorData::F32(v) => each!(v, |x| seq.serialize_element(x)),
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

    /// Every finite float of `data` (as f32) and the JSON text of the
    /// element written for it; the text must parse back to the same f32.
    fn assert_round_trips(text: &str, floats: &[f32]) {
        let tokens: Vec<&str> = text.trim_matches(|c| c == '[' || c == ']').split(',').collect();
        assert_eq!(tokens.len(), floats.len());
        for (tok, &x) in tokens.iter().zip(floats) {
            if !x.is_finite() {
                assert_eq!(*tok, "null", "{x}");
                continue;
            }
            let back: f32 = tok.parse().unwrap();
            assert_eq!(back.to_bits(), x.to_bits(), "{x:e} written as {tok}");
            // Read the way most clients do, as an f64 then narrowed.
            let wide: f64 = tok.parse().unwrap();
            assert_eq!((wide as f32).to_bits(), x.to_bits(), "{x:e} written as {tok}");
        }
    }

    #[test]
    fn floats_are_written_shortest_and_parse_back_to_themselves() {
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
            1.066_406_3,
            1e14,
            1e16,
            123456789.0,
            1e-5,
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
        assert_round_trips(&text(&TensorData::F32(floats.clone())), &floats);
        // Shortest: 0.1 is "0.1", not 0.10000000149011612.
        assert_eq!(text(&TensorData::F32(vec![0.1, 1.0, -0.0])), "[0.1,1.0,-0.0]");
        // FP16 and BF16 go as f32s; V1's values (element_to_json) hold the same numbers.
        let h: Vec<half::f16> = floats.iter().map(|&x| half::f16::from_f32(x)).collect();
        let wide: Vec<f32> = h.iter().map(|x| x.to_f32()).collect();
        assert_round_trips(&text(&TensorData::F16(h.clone())), &wide);
        let values = TensorData::F32(floats.clone());
        for (i, &x) in floats.iter().enumerate().filter(|(_, x)| x.is_finite()) {
            let v = element_to_json(&values, i).as_f64().unwrap();
            assert_eq!((v as f32).to_bits(), x.to_bits(), "{x:e}");
        }
        let doubles: Vec<f64> = floats
            .iter()
            .map(|&x| f64::from(x) * 1.000_000_1)
            .chain([f64::MAX, f64::NAN])
            .collect();
        let via_values =
            |d: &TensorData| Value::Array((0..d.len()).map(|i| element_to_json(d, i)).collect()).to_string();
        let others = [
            TensorData::F64(doubles),
            TensorData::I64(vec![i64::MIN, -1, 0, i64::MAX]),
            TensorData::U64(vec![0, u64::MAX]),
            TensorData::U8(vec![0, 255]),
            TensorData::Bool(vec![true, false]),
            TensorData::Bytes(vec![b"a\"\n".to_vec(), vec![0xff, 0xfe], "é".as_bytes().to_vec()].into()),
        ];
        for d in &others {
            assert_eq!(text(d), via_values(d), "{:?}", d.dtype());
        }
    }
}
