//! The encoder: every datatype's text, nesting, and FP32 written shortest
//! and parsing back to the same f32 (checked by the standard library's parse).

use super::*;

fn text(d: &TensorData) -> String {
    serde_json::to_string(&JsonElements::flat(d)).unwrap()
}

#[test]
fn every_datatype_is_written_as_json() {
    let h = |x: f32| half::f16::from_f32(x);
    let b = |x: f32| half::bf16::from_f32(x);
    let cases = [
        (TensorData::Bool(vec![true, false]), "[true,false]"),
        (TensorData::U8(vec![0, 255]), "[0,255]"),
        (TensorData::U64(vec![0, u64::MAX]), "[0,18446744073709551615]"),
        (TensorData::I64(vec![i64::MIN, -1]), "[-9223372036854775808,-1]"),
        (TensorData::I8(vec![-128, 127]), "[-128,127]"),
        (TensorData::F16(vec![h(0.5), h(-2.0)]), "[0.5,-2.0]"),
        (TensorData::Bf16(vec![b(0.5), b(-2.0)]), "[0.5,-2.0]"),
        (
            TensorData::F32(vec![0.1, f32::NAN, f32::INFINITY]),
            "[0.1,null,null]",
        ),
        (
            TensorData::F64(vec![0.1, 1e300, f64::NEG_INFINITY]),
            "[0.1,1e+300,null]",
        ),
        (
            TensorData::Bytes(vec![b"a\"\n".to_vec(), vec![0xff], "é".as_bytes().to_vec()].into()),
            "[\"a\\\"\\n\",\"\u{fffd}\",\"é\"]",
        ),
    ];
    for (data, want) in cases {
        assert_eq!(text(&data), want, "{:?}", data.dtype());
    }
    assert_eq!(text(&TensorData::F32(vec![])), "[]");
}

#[test]
fn nested_rows_and_scalars() {
    let data = TensorData::I32((0..12).collect());
    let rows = |offset, len, inner| {
        serde_json::to_string(&JsonElements {
            data: &data,
            offset,
            len,
            inner,
        })
        .unwrap()
    };
    assert_eq!(rows(0, 2, &[2, 3]), "[[[0,1,2],[3,4,5]],[[6,7,8],[9,10,11]]]");
    assert_eq!(rows(6, 2, &[3]), "[[6,7,8],[9,10,11]]");
    assert_eq!(rows(3, 0, &[3]), "[]");
    assert_eq!(serde_json::to_string(&JsonElement(&data, 5)).unwrap(), "5");
    let f = TensorData::F32(vec![0.1, f32::NAN]);
    assert_eq!(serde_json::to_string(&JsonElement(&f, 0)).unwrap(), "0.1");
    assert_eq!(serde_json::to_string(&JsonElement(&f, 1)).unwrap(), "null");
}

/// The text of each element written for `floats`, parsed back: the same
/// f32, read as an f32 and read as an f64 narrowed (as most clients do).
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
        let wide: f64 = tok.parse().unwrap();
        assert_eq!((wide as f32).to_bits(), x.to_bits(), "{x:e} written as {tok}");
    }
}

#[test]
fn floats_are_written_shortest_and_parse_back_to_themselves() {
    let mut rng = crate::protocol::json::Rng(0x9e37_79b9);
    let mut floats: Vec<f32> = (0..200_000).map(|_| f32::from_bits(rng.next() as u32)).collect();
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
    assert_round_trips(&text(&TensorData::F32(floats.clone())), &floats);
    // Shortest: 0.1 is "0.1", not 0.10000000149011612.
    assert_eq!(text(&TensorData::F32(vec![0.1, 1.0, -0.0])), "[0.1,1.0,-0.0]");
    // FP16 goes as f32s.
    let h: Vec<half::f16> = floats.iter().map(|&x| half::f16::from_f32(x)).collect();
    let wide: Vec<f32> = h.iter().map(|x| x.to_f32()).collect();
    assert_round_trips(&text(&TensorData::F16(h)), &wide);
    // Scalars (V1's rank-1 rows) hold the same text as arrays.
    let data = TensorData::F32(floats.clone());
    for i in (0..floats.len()).step_by(97) {
        let one = serde_json::to_string(&JsonElement(&data, i)).unwrap();
        let row = serde_json::to_string(&JsonElements {
            data: &data,
            offset: i,
            len: 1,
            inner: &[],
        })
        .unwrap();
        assert_eq!(format!("[{one}]"), row);
    }
}
