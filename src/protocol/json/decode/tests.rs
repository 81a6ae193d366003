//! The element reader on flat, nested and rectangular values, every
//! datatype, and every element error. Expected values are the standard
//! library's parse of the same text, or written out.

use super::*;
use crate::tensor::DataType;

fn dec(dtype: DataType, raw: &str, count: usize) -> Result<TensorData, String> {
    let mut out = TensorData::with_capacity(dtype, 0);
    let read =
        read("input `x`", raw.as_bytes(), &mut out, Layout::Count(count)).map_err(|e| e.to_string())?;
    assert_eq!(read.end, raw.trim_end().len(), "{raw}");
    match read.leaves == count {
        true => Ok(out),
        false => Err(format!("got {}", read.leaves)),
    }
}

fn row(dtype: DataType, raw: &str) -> Result<(TensorData, Vec<usize>), String> {
    let mut out = TensorData::with_capacity(dtype, 0);
    let read = read(
        "instance 0 of input `x`",
        raw.as_bytes(),
        &mut out,
        Layout::Rectangular,
    )
    .map_err(|e| e.to_string())?;
    assert_eq!(read.leaves, out.len());
    Ok((out, read.shape))
}

#[test]
fn nested_and_flat_arrays_give_the_same_row_major_elements() {
    let flat = dec(DataType::I32, "[1, 2, 3, 4]", 4).unwrap();
    assert_eq!(flat, TensorData::I32(vec![1, 2, 3, 4]));
    assert_eq!(dec(DataType::I32, " [[1,2] , [ 3,\n4 ]] ", 4).unwrap(), flat);
    assert_eq!(dec(DataType::I32, "[[[1]],[[2],[3, 4]]]", 4).unwrap(), flat);
    assert_eq!(dec(DataType::F32, "[]", 0).unwrap(), TensorData::F32(vec![]));
}

#[test]
fn a_huge_declared_count_reserves_by_the_text_not_the_count() {
    // A 9-byte body declaring 2^40 elements must not reserve for 2^40.
    let mut out = TensorData::with_capacity(DataType::I64, 0);
    let got = read("x", b"[1, 2, 3]", &mut out, Layout::Count(1 << 40)).unwrap();
    assert_eq!(got.leaves, 3);
    let TensorData::I64(v) = out else { panic!() };
    assert!(v.capacity() <= 5, "{}", v.capacity());
    // Past the count, leaves are counted, not kept.
    let mut out = TensorData::with_capacity(DataType::I64, 0);
    assert_eq!(
        read("x", b"[1, 2, 3]", &mut out, Layout::Count(2))
            .unwrap()
            .leaves,
        3
    );
    assert_eq!(out, TensorData::I64(vec![1, 2]));
}

#[test]
fn floats_are_correctly_rounded_from_their_text() {
    // The decimal halfway between two f32s, as text: f64 then f32 would round twice.
    let text = "1.00000005960464477539062500000000001";
    let direct: f32 = text.parse().unwrap();
    let TensorData::F32(v) = dec(DataType::F32, &format!("[{text}, 0.1, -3, 1e-45]"), 4).unwrap() else {
        panic!()
    };
    assert_eq!(v, vec![direct, 0.1f32, -3.0, 1e-45f32]);
    let TensorData::F64(v) = dec(DataType::F64, "[0.1, 1.7976931348623157e308, 5e-324]", 3).unwrap() else {
        panic!()
    };
    assert_eq!(v, vec![0.1, f64::MAX, 5e-324]);
}

#[test]
fn floats_agree_with_the_standard_library_in_every_form() {
    let mut rng = crate::protocol::json::Rng(0x2545_f491_4f6c_dd1d);
    let (mut singles, mut doubles) = (Vec::new(), Vec::new());
    for _ in 0..20_000 {
        let bits = rng.next();
        let (x, y) = (f32::from_bits(bits as u32), f64::from_bits(bits));
        if x.is_finite() {
            singles.extend([x.to_string(), format!("{x:e}"), format!("{:.17}", f64::from(x))]);
        }
        if y.is_finite() {
            doubles.extend([y.to_string(), format!("{y:e}"), format!("{:.3}", y / 1e300)]);
        }
    }
    let TensorData::F32(a) = dec(DataType::F32, &format!("[{}]", singles.join(",")), singles.len()).unwrap()
    else {
        panic!()
    };
    for (t, x) in singles.iter().zip(a) {
        assert_eq!(x.to_bits(), t.parse::<f32>().unwrap().to_bits(), "{t}");
    }
    let TensorData::F64(b) = dec(DataType::F64, &format!("[{}]", doubles.join(", ")), doubles.len()).unwrap()
    else {
        panic!()
    };
    for (t, y) in doubles.iter().zip(b) {
        assert_eq!(y.to_bits(), t.parse::<f64>().unwrap().to_bits(), "{t}");
    }
}

#[test]
fn every_datatype_reads_its_elements() {
    let h = |x: f64| (half::f16::from_f64(x), half::bf16::from_f64(x));
    let cases = [
        (
            DataType::Bool,
            "[true, false]",
            TensorData::Bool(vec![true, false]),
        ),
        (DataType::U8, "[0, 255]", TensorData::U8(vec![0, 255])),
        (DataType::U16, "[0, 65535]", TensorData::U16(vec![0, 65535])),
        (
            DataType::U32,
            "[0, 4294967295]",
            TensorData::U32(vec![0, u32::MAX]),
        ),
        (
            DataType::U64,
            "[0, 18446744073709551615]",
            TensorData::U64(vec![0, u64::MAX]),
        ),
        (DataType::I8, "[-128, 127]", TensorData::I8(vec![-128, 127])),
        (
            DataType::I16,
            "[-32768, 32767]",
            TensorData::I16(vec![i16::MIN, i16::MAX]),
        ),
        (
            DataType::I32,
            "[-2147483648, 2147483647]",
            TensorData::I32(vec![i32::MIN, i32::MAX]),
        ),
        (
            DataType::I64,
            "[-9223372036854775808, 9223372036854775807]",
            TensorData::I64(vec![i64::MIN, i64::MAX]),
        ),
        (
            DataType::F16,
            "[0.5, -2]",
            TensorData::F16(vec![h(0.5).0, h(-2.0).0]),
        ),
        (
            DataType::Bf16,
            "[0.5, -2]",
            TensorData::Bf16(vec![h(0.5).1, h(-2.0).1]),
        ),
        (DataType::F64, "[0.1, 1e300]", TensorData::F64(vec![0.1, 1e300])),
    ];
    for (dtype, raw, want) in cases {
        assert_eq!(dec(dtype, raw, 2).unwrap(), want, "{dtype}");
    }
    // Integral floats for integers, integers for floats.
    assert_eq!(
        dec(DataType::I64, "[2.0, 2e3, -0]", 3).unwrap(),
        TensorData::I64(vec![2, 2000, 0])
    );
    assert_eq!(
        dec(DataType::F32, "[1, 2]", 2).unwrap(),
        TensorData::F32(vec![1.0, 2.0])
    );
}

#[test]
fn strings_with_escapes_brackets_and_commas_are_one_element_each() {
    let got = dec(DataType::Bytes, r#"["a,]b", "q\"[", "\u00e9", "", "é"]"#, 5).unwrap();
    let want = ["a,]b", "q\"[", "é", "", "é"]
        .map(|s| s.as_bytes().to_vec())
        .to_vec();
    assert_eq!(got, TensorData::Bytes(want.into()));
}

#[test]
fn bad_elements_are_named_with_their_index_and_text() {
    let cases = [
        (
            DataType::F32,
            "[1, 1e39]",
            "element 1 is 1e39, out of range for FP32",
        ),
        (
            DataType::F64,
            "[1e400]",
            "element 0 is 1e400, out of range for FP64",
        ),
        (
            DataType::F32,
            r#"[1, "abc"]"#,
            r#"element 1 is "abc", expected a number for FP32"#,
        ),
        (
            DataType::F32,
            "[null]",
            "element 0 is null, expected a number for FP32",
        ),
        (
            DataType::I64,
            "[1.5]",
            "element 0 is 1.5, expected an integer for INT64",
        ),
        (DataType::U8, "[256]", "element 0 is 256, out of range for UINT8"),
        (
            DataType::U8,
            "[1, 2, 3, 4, 300]",
            "element 4 is 300, out of range for UINT8",
        ),
        (DataType::I8, "[-129]", "element 0 is -129, out of range for INT8"),
        (DataType::U64, "[-1]", "element 0 is -1, out of range for UINT64"),
        (
            DataType::I64,
            "[1e40]",
            "element 0 is 1e40, out of range for INT64",
        ),
        (
            DataType::I64,
            "[100000000000000000000000000000000000000000]",
            "out of range for INT64",
        ),
        (
            DataType::Bool,
            "[1]",
            "element 0 is 1, expected true or false for BOOL",
        ),
        (
            DataType::Bytes,
            "[1]",
            "element 0 is 1, expected a string for BYTES",
        ),
        (
            DataType::F16,
            "[70000]",
            "element 0 is 70000, out of range for FP16",
        ),
    ];
    for (dtype, raw, want) in cases {
        let e = dec(dtype, raw, 1 + raw.matches(',').count()).unwrap_err();
        assert!(e.starts_with("input `x`: ") && e.contains(want), "{raw}: {e}");
    }
    let e = dec(DataType::I32, r#"[{"a": 1}]"#, 1).unwrap_err();
    assert!(e.starts_with("input `x`: `data` holds an object"), "{e}");
    let e = dec(DataType::I32, "3", 1).unwrap_err();
    assert_eq!(e, "input `x`: `data` must be an array, got 3");
    assert_eq!(dec(DataType::I32, "[1, 2, 3]", 2).unwrap_err(), "got 3");
}

#[test]
fn what_is_not_json_is_refused() {
    for raw in [
        "[01]",
        "[1,]",
        "[,1]",
        "[1 2]",
        "[.5]",
        "[1.]",
        "[+1]",
        "[NaN]",
        "[1",
        "[[1]",
        "[tru]",
        "[nul]",
        "[\"a]",
        "[\"\u{1}\"]",
        "[\"\\x\"]",
        "[1]]",
        "[-]",
        "[-, 1]",
        "[--1]",
        "[-0x1]",
    ] {
        let dtypes = match raw.contains('"') {
            true => vec![DataType::Bytes],
            false => vec![DataType::F32, DataType::I64, DataType::U8],
        };
        for dtype in dtypes {
            let mut out = TensorData::with_capacity(dtype, 0);
            let got = read("x", raw.as_bytes(), &mut out, Layout::Count(1));
            // `[1]]`: the value ends after `[1]`; what follows is the caller's.
            if raw == "[1]]" {
                assert_eq!(got.unwrap().end, 3);
                continue;
            }
            assert!(got.is_err(), "{raw} as {dtype}: {got:?}");
        }
    }
    let deep = format!("{}1{}", "[".repeat(129), "]".repeat(129));
    let mut out = TensorData::with_capacity(DataType::F32, 0);
    let e = read("x", deep.as_bytes(), &mut out, Layout::Count(1)).unwrap_err();
    assert!(e.to_string().contains("deeper than 128"), "{e}");
}

#[test]
fn a_rectangular_row_gives_its_shape() {
    let (data, shape) = row(DataType::F32, "[[1, 2], [3, 4], [5, 6]]").unwrap();
    assert_eq!(
        (data, shape),
        (TensorData::F32(vec![1., 2., 3., 4., 5., 6.]), vec![3, 2])
    );
    assert_eq!(
        row(DataType::I64, " 7 ").unwrap(),
        (TensorData::I64(vec![7]), vec![])
    );
    assert_eq!(
        row(DataType::I64, "[]").unwrap(),
        (TensorData::I64(vec![]), vec![0])
    );
    assert_eq!(row(DataType::I64, "[[], []]").unwrap().1, vec![2, 0]);
    assert_eq!(row(DataType::Bytes, r#"[["a"], ["]"]]"#).unwrap().1, vec![2, 1]);
    // The AVX2 run reads a long row in bulk; the shape still counts every element.
    let long: Vec<String> = (0..300).map(|i| format!("0.{i:04}5")).collect();
    let text = format!("[[{}], [{}]]", long.join(", "), long.join(","));
    assert_eq!(row(DataType::F32, &text).unwrap().1, vec![2, 300]);
}

#[test]
fn a_ragged_row_is_refused_whatever_its_first_elements_claim() {
    for raw in [
        "[[1, 2], [3]]",
        "[[1], [2, 3]]",
        "[[1], 2]",
        "[1, [2]]",
        "[[], [1]]",
        "[[1], []]",
        "[[], 1]",
        "[[], [[]]]",
        "[[[1, 2]], [[3], [4]]]",
    ] {
        let e = row(DataType::F32, raw).unwrap_err();
        assert!(e.starts_with("instance 0 of input `x` is ragged"), "{raw}: {e}");
    }
    // Each level an array of 100 whose first element is the next level:
    // a claim of 100^4 elements in a few hundred bytes.
    let mut text = format!("[{}]", vec!["0"; 100].join(","));
    for _ in 0..3 {
        text = format!("[{text},{}]", vec!["0"; 99].join(","));
    }
    assert!(row(DataType::F32, &text).unwrap_err().contains("is ragged"));
}
