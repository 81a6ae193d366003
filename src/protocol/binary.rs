//! Raw tensor bytes, as the binary tensor data extension (V2 REST) and the
//! gRPC `raw_input_contents` / `raw_output_contents` carry them: elements
//! flat, row-major, little-endian, without padding; BOOL one byte each (0 or
//! 1); BYTES each element as a 4-byte little-endian length and then its
//! bytes. Fixed-size types are copied in one `memcpy` (no per-element parse)
//! on little-endian machines. A BOOL byte other than 0 reads as true, as in
//! C and numpy (perf_analyzer sends random bytes for BOOL inputs). Pure: no I/O.

use std::mem::size_of;

use crate::error::Error;
use crate::tensor::{DataType, Strings, TensorData};

/// Elements in a tensor of `shape`, or an error naming `what` when the
/// product overflows.
pub fn element_count(what: &str, shape: &[usize]) -> Result<usize, Error> {
    shape
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .ok_or_else(|| Error::invalid(format!("{what}: shape {shape:?} is too large")))
}

/// Decodes the raw bytes of a tensor of `dtype` and `shape`. `what` names the
/// tensor in errors (e.g. "input `x`"), which give the expected and received
/// byte lengths.
pub fn decode(what: &str, dtype: DataType, shape: &[usize], bytes: &[u8]) -> Result<TensorData, Error> {
    let count = element_count(what, shape)?;
    let Some(size) = dtype.size_of() else {
        return decode_bytes(what, shape, count, bytes).map(TensorData::Bytes);
    };
    if count.checked_mul(size) != Some(bytes.len()) {
        return Err(Error::invalid(format!(
            "{what}: shape {shape:?} of {dtype} needs {} bytes of binary data, got {}",
            count.saturating_mul(size),
            bytes.len()
        )));
    }
    Ok(match dtype {
        DataType::Bool => TensorData::Bool(bytes.iter().map(|&b| b != 0).collect()),
        DataType::U8 => TensorData::U8(bytes.to_vec()),
        DataType::U16 => TensorData::U16(from_le(bytes)),
        DataType::U32 => TensorData::U32(from_le(bytes)),
        DataType::U64 => TensorData::U64(from_le(bytes)),
        DataType::I8 => TensorData::I8(from_le(bytes)),
        DataType::I16 => TensorData::I16(from_le(bytes)),
        DataType::I32 => TensorData::I32(from_le(bytes)),
        DataType::I64 => TensorData::I64(from_le(bytes)),
        DataType::F16 => TensorData::F16(from_le(bytes)),
        DataType::Bf16 => TensorData::Bf16(from_le(bytes)),
        DataType::F32 => TensorData::F32(from_le(bytes)),
        DataType::F64 => TensorData::F64(from_le(bytes)),
        DataType::Bytes => unreachable!("BYTES has no fixed size. This is a bug."),
    })
}

/// Copies little-endian bytes into a vector of `T` (`bytes.len()` is a
/// multiple of `size_of::<T>()`, checked by the caller).
fn from_le<T: bytemuck::Pod>(bytes: &[u8]) -> Vec<T> {
    let n = bytes.len() / size_of::<T>();
    let mut v: Vec<T> = Vec::with_capacity(n);
    // SAFETY: the vector has room for `n` elements, i.e. `bytes.len()` bytes
    // (checked above); `T: Pod` means every bit pattern is a valid `T`, so
    // the elements are initialized once the bytes are copied.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), v.as_mut_ptr().cast::<u8>(), n * size_of::<T>());
        v.set_len(n);
    }
    if cfg!(target_endian = "big") {
        for element in bytemuck::cast_slice_mut::<T, u8>(&mut v).chunks_exact_mut(size_of::<T>()) {
            element.reverse();
        }
    }
    v
}

/// BYTES: `count` elements, each a 4-byte little-endian length and that many bytes.
fn decode_bytes(what: &str, shape: &[usize], count: usize, bytes: &[u8]) -> Result<Strings, Error> {
    let mut out = Strings::with_capacity(count.min(bytes.len() / 4));
    let mut rest = bytes;
    while !rest.is_empty() {
        let i = out.len();
        let Some((len, tail)) = rest.split_first_chunk::<4>() else {
            return Err(Error::invalid(format!(
                "{what}: BYTES element {i} starts with {} bytes; its 4-byte length prefix is cut short",
                rest.len()
            )));
        };
        let len = u32::from_le_bytes(*len) as usize;
        if len > tail.len() {
            return Err(Error::invalid(format!(
                "{what}: BYTES element {i} declares {len} bytes but only {} remain",
                tail.len()
            )));
        }
        let (element, tail) = tail.split_at(len);
        out.push(element);
        rest = tail;
    }
    if out.len() != count {
        return Err(Error::invalid(format!(
            "{what}: shape {shape:?} needs {count} BYTES elements, the binary data holds {}",
            out.len()
        )));
    }
    Ok(out)
}

/// Bytes of the raw encoding of `data`.
pub fn encoded_len(data: &TensorData) -> usize {
    match data {
        TensorData::Bytes(v) => v.iter().map(|e| 4 + e.len()).sum(),
        other => other.len() * other.dtype().size_of().expect("fixed-size type"),
    }
}

/// Appends the raw encoding of `data` to `out`.
pub fn encode_into(data: &TensorData, out: &mut Vec<u8>) {
    match data {
        TensorData::Bool(v) => out.extend(v.iter().map(|&b| u8::from(b))),
        TensorData::U8(v) => out.extend_from_slice(v),
        TensorData::U16(v) => to_le(v, out),
        TensorData::U32(v) => to_le(v, out),
        TensorData::U64(v) => to_le(v, out),
        TensorData::I8(v) => to_le(v, out),
        TensorData::I16(v) => to_le(v, out),
        TensorData::I32(v) => to_le(v, out),
        TensorData::I64(v) => to_le(v, out),
        TensorData::F16(v) => to_le(v, out),
        TensorData::Bf16(v) => to_le(v, out),
        TensorData::F32(v) => to_le(v, out),
        TensorData::F64(v) => to_le(v, out),
        TensorData::Bytes(v) => {
            for e in v.iter() {
                let len = u32::try_from(e.len()).expect("a BYTES element over 4 GiB. This is a bug.");
                out.extend_from_slice(&len.to_le_bytes());
                out.extend_from_slice(e);
            }
        }
    }
}

/// The raw encoding of `data`.
pub fn encode(data: &TensorData) -> Vec<u8> {
    let mut out = Vec::with_capacity(encoded_len(data));
    encode_into(data, &mut out);
    out
}

fn to_le<T: bytemuck::Pod>(v: &[T], out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(bytemuck::cast_slice(v));
    if cfg!(target_endian = "big") {
        for element in out[start..].chunks_exact_mut(size_of::<T>()) {
            element.reverse();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    fn err(r: Result<TensorData, Error>) -> String {
        let e = r.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
        e.to_string()
    }

    #[test]
    fn every_datatype_round_trips() {
        let cases = [
            TensorData::Bool(vec![true, false, true, true]),
            TensorData::U8(vec![0, 1, 254, 255]),
            TensorData::U16(vec![0, 1, 65534, 65535]),
            TensorData::U32(vec![0, 1, 7, u32::MAX]),
            TensorData::U64(vec![0, 1, 7, u64::MAX]),
            TensorData::I8(vec![-128, -1, 0, 127]),
            TensorData::I16(vec![i16::MIN, -1, 0, i16::MAX]),
            TensorData::I32(vec![i32::MIN, -1, 0, i32::MAX]),
            TensorData::I64(vec![i64::MIN, -1, 0, i64::MAX]),
            TensorData::F16(vec![
                half::f16::from_f32(0.5),
                half::f16::MAX,
                half::f16::MIN,
                half::f16::ZERO,
            ]),
            TensorData::Bf16(vec![
                half::bf16::from_f32(-2.5),
                half::bf16::ONE,
                half::bf16::MAX,
                half::bf16::ZERO,
            ]),
            TensorData::F32(vec![0.1, -2.5, f32::MAX, f32::MIN_POSITIVE]),
            TensorData::F64(vec![0.1, -2.5, f64::MAX, 1e-300]),
            TensorData::Bytes(
                vec![
                    b"".to_vec(),
                    b"a".to_vec(),
                    "h\u{e9}llo".as_bytes().to_vec(),
                    vec![0, 255],
                ]
                .into(),
            ),
        ];
        for data in cases {
            let raw = encode(&data);
            assert_eq!(raw.len(), encoded_len(&data), "{}", data.dtype());
            let back = decode("input `x`", data.dtype(), &[2, 2], &raw).unwrap();
            assert_eq!(back, data);
        }
    }

    #[test]
    fn encoding_is_little_endian() {
        assert_eq!(
            encode(&TensorData::I32(vec![1, -2])),
            [1, 0, 0, 0, 0xfe, 0xff, 0xff, 0xff]
        );
        assert_eq!(encode(&TensorData::F32(vec![1.0])), 1.0f32.to_le_bytes());
        assert_eq!(
            encode(&TensorData::Bytes(vec![b"ab".to_vec()].into())),
            [2, 0, 0, 0, b'a', b'b']
        );
    }

    #[test]
    fn wrong_lengths_name_expected_and_received_bytes() {
        let m = err(decode("input `x`", DataType::F32, &[2, 3], &[0; 20]));
        assert_eq!(
            m,
            "input `x`: shape [2, 3] of FP32 needs 24 bytes of binary data, got 20"
        );
        let m = err(decode("input `x`", DataType::F32, &[usize::MAX, 2], &[]));
        assert!(m.ends_with("is too large"), "{m}");
    }

    #[test]
    fn any_non_zero_bool_byte_is_true() {
        let got = decode("input `b`", DataType::Bool, &[3], &[0, 1, 7]).unwrap();
        assert_eq!(got, TensorData::Bool(vec![false, true, true]));
    }

    #[test]
    fn bad_bytes_tensors_are_refused() {
        // A length prefix cut short.
        let m = err(decode(
            "input `s`",
            DataType::Bytes,
            &[2],
            &[1, 0, 0, 0, b'a', 3, 0],
        ));
        assert!(m.contains("element 1 starts with 2 bytes"), "{m}");
        // A length larger than what remains.
        let m = err(decode("input `s`", DataType::Bytes, &[1], &[9, 0, 0, 0, b'a']));
        assert_eq!(m, "input `s`: BYTES element 0 declares 9 bytes but only 1 remain");
        // Too few or too many elements for the shape.
        let m = err(decode("input `s`", DataType::Bytes, &[3], &[1, 0, 0, 0, b'a']));
        assert_eq!(
            m,
            "input `s`: shape [3] needs 3 BYTES elements, the binary data holds 1"
        );
        let m = err(decode("input `s`", DataType::Bytes, &[0], &[0, 0, 0, 0]));
        assert!(
            m.contains("needs 0 BYTES elements, the binary data holds 1"),
            "{m}"
        );
    }

    #[test]
    fn empty_tensors_decode() {
        assert_eq!(
            decode("x", DataType::F32, &[0, 3], &[]).unwrap(),
            TensorData::F32(vec![])
        );
        assert_eq!(
            decode("x", DataType::Bytes, &[0], &[]).unwrap(),
            TensorData::Bytes(vec![].into())
        );
    }
}
