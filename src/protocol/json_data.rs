//! A V2 input's JSON `data`, parsed straight into a typed vector. The wire
//! struct keeps `data` as raw JSON text (`serde_json::value::RawValue`,
//! validated by serde_json but never built into a `Value` tree); once the
//! datatype is known, [`decode`] walks the (flat or nested) arrays and parses
//! each leaf's text with the standard library's correctly rounded parsers, so
//! that FP32 and FP64 values are exact (`"0.1"` is the f32 nearest 0.1, not
//! the f64 nearest rounded again), and a body costs a few bytes per element
//! instead of a `Value` of 32 bytes plus its array.
//!
//! The usual all-JSON body does not come here: `super::v2_scan` reads it
//! in one pass with the same element parsers. This path takes the rest
//! (binary headers, BOOL and BYTES, unusual keys) and words every error.

use super::json_number::{self, Decimal};
use super::DataType;
use crate::error::Error;
use crate::tensor::{Strings, TensorData};

/// Parses `raw` (the JSON text of a `data` field) as `count` elements of
/// `dtype`; `what` names the tensor in errors (e.g. "input `x`"). Float types
/// take any number and refuse values their type cannot hold; int types take
/// integral numbers in range (1.5 is refused, 2.0 is 2); BOOL takes
/// `true`/`false`; BYTES takes strings (their UTF-8 bytes).
pub(crate) fn decode<'a>(
    what: &str,
    dtype: DataType,
    raw: &'a str,
    count: usize,
    shape: &[i64],
) -> Result<TensorData, Error> {
    let mut n = 0usize;
    // `$parse(index, rest)` reads the leaf at the front of `rest` and gives
    // (element, bytes read).
    // BYTES collect into one buffer ([`Strings`]), the rest into a `Vec`.
    macro_rules! collect {
        ($variant:ident, $parse:expr) => {
            collect!($variant in Vec, $parse)
        };
        ($variant:ident in $out:ident, $parse:expr) => {{
            let mut out = $out::with_capacity(capacity(count, raw));
            each_leaf(what, raw, |rest| {
                let (x, len) = $parse(n, rest)?;
                if n < count {
                    out.push(x);
                }
                n += 1;
                Ok(len)
            })?;
            TensorData::$variant(out)
        }};
    }
    // Leaves parsed from their whole token.
    macro_rules! token {
        ($parse:expr) => {
            |i, rest: &'a str| -> Result<_, Error> {
                let tok = &rest[..token_len(rest)];
                Ok(($parse(i, tok)?, tok.len()))
            }
        };
    }
    let e = Elements { what, dtype };
    let data = match dtype {
        DataType::Bool => collect!(Bool, token!(|i, t| e.boolean(i, t))),
        DataType::U8 => collect!(U8, |i, t| e.int(i, t)),
        DataType::U16 => collect!(U16, |i, t| e.int(i, t)),
        DataType::U32 => collect!(U32, |i, t| e.int(i, t)),
        DataType::U64 => collect!(U64, |i, t| e.int(i, t)),
        DataType::I8 => collect!(I8, |i, t| e.int(i, t)),
        DataType::I16 => collect!(I16, |i, t| e.int(i, t)),
        DataType::I32 => collect!(I32, |i, t| e.int(i, t)),
        DataType::I64 => collect!(I64, |i, t| e.int(i, t)),
        DataType::F16 => collect!(
            F16,
            token!(|i, t| e.float(i, t, half::f16::from_f64, half::f16::is_infinite))
        ),
        DataType::Bf16 => collect!(
            Bf16,
            token!(|i, t| e.float(i, t, half::bf16::from_f64, half::bf16::is_infinite))
        ),
        DataType::F32 => collect!(F32, |i, t| e.fast(i, t, Decimal::to_f32)),
        DataType::F64 => collect!(F64, |i, t| e.fast(i, t, Decimal::to_f64)),
        DataType::Bytes => collect!(Bytes in Strings, token!(|i, t| e.bytes(i, t))),
    };
    if n != count {
        return Err(Error::invalid(format!(
            "{what}: shape {shape:?} needs {count} elements, got {n}"
        )));
    }
    Ok(data)
}

/// Elements to reserve for `count` declared elements in the JSON text `raw`:
/// every element takes at least two bytes of text (a digit and a `,` or
/// `]`), so a tiny body that declares a huge shape reserves little (its
/// element count is checked after the walk).
fn capacity(count: usize, raw: &str) -> usize {
    count.min(raw.len() / 2 + 1)
}

/// Calls `leaf` at every leaf of the JSON array `raw`, in row-major order,
/// with the text from the leaf's first byte to the end of `raw`; `leaf`
/// returns the length of the leaf's token. `raw` is valid JSON (serde_json
/// checked it); an object anywhere, or a top level that is not an array, is
/// an error.
fn each_leaf<'a>(
    what: &str,
    raw: &'a str,
    mut leaf: impl FnMut(&'a str) -> Result<usize, Error>,
) -> Result<(), Error> {
    let b = raw.as_bytes();
    let start = b.iter().position(|c| !c.is_ascii_whitespace()).unwrap_or(b.len());
    if b.get(start) != Some(&b'[') {
        return Err(Error::invalid(format!(
            "{what}: `data` must be an array, got {}",
            show(raw.trim())
        )));
    }
    let (mut i, mut depth) = (start, 0usize);
    while i < b.len() {
        match b[i] {
            b'[' => depth += 1,
            b']' => {
                depth -= 1;
                if depth == 0 {
                    break;
                }
            }
            b',' | b' ' | b'\n' | b'\r' | b'\t' => {}
            b'{' => {
                return Err(Error::invalid(format!(
                    "{what}: `data` holds an object; expected numbers, booleans or strings in (nested) arrays"
                )))
            }
            // A leaf: its token ends before the next structural byte.
            _ => {
                i += leaf(&raw[i..])?.max(1);
                continue;
            }
        }
        i += 1;
    }
    Ok(())
}

/// Length of the JSON token at the front of `rest`: a whole string (escapes
/// included), or up to the next `,` `]` or whitespace.
fn token_len(rest: &str) -> usize {
    let b = rest.as_bytes();
    let mut i = 0;
    if b.first() == Some(&b'"') {
        i = 1;
        while i < b.len() && b[i] != b'"' {
            i += if b[i] == b'\\' { 2 } else { 1 };
        }
        return (i + 1).min(b.len());
    }
    while i < b.len() && !matches!(b[i], b',' | b']' | b' ' | b'\n' | b'\r' | b'\t') {
        i += 1;
    }
    i.max(1)
}

/// A JSON token for an error message, cut short when long.
fn show(tok: &str) -> String {
    match tok.char_indices().nth(40) {
        Some((cut, _)) => format!("{}...", &tok[..cut]),
        None => tok.to_string(),
    }
}

/// The element parsers of one tensor, with its error messages.
struct Elements<'a> {
    what: &'a str,
    dtype: DataType,
}

impl Elements<'_> {
    fn bad(&self, i: usize, tok: &str, expected: &str) -> Error {
        Error::invalid(format!(
            "{}: element {i} is {}, expected {expected} for {}",
            self.what,
            show(tok),
            self.dtype
        ))
    }

    fn out_of_range(&self, i: usize, tok: &str) -> Error {
        Error::invalid(format!(
            "{}: element {i} is {}, out of range for {}",
            self.what,
            show(tok),
            self.dtype
        ))
    }

    fn boolean(&self, i: usize, tok: &str) -> Result<bool, Error> {
        match tok {
            "true" => Ok(true),
            "false" => Ok(false),
            _ => Err(self.bad(i, tok, "true or false")),
        }
    }

    /// A JSON number token parsed as `T` (f32 or f64, correctly rounded
    /// from the decimal text); a finite number that `T` cannot hold is out
    /// of range.
    fn number<T: std::str::FromStr + Copy + Into<f64>>(&self, i: usize, tok: &str) -> Result<T, Error> {
        if !is_number(tok) {
            return Err(self.bad(i, tok, "a number"));
        }
        let x: T = tok.parse().map_err(|_| self.bad(i, tok, "a number"))?;
        match x.into().is_infinite() {
            true => Err(self.out_of_range(i, tok)),
            false => Ok(x),
        }
    }

    /// FP16 / BF16: the f64 of the text, rounded to the type.
    fn float<T: Copy>(
        &self,
        i: usize,
        tok: &str,
        conv: fn(f64) -> T,
        infinite: fn(T) -> bool,
    ) -> Result<T, Error> {
        let y = conv(self.number::<f64>(i, tok)?);
        match infinite(y) {
            true => Err(self.out_of_range(i, tok)),
            false => Ok(y),
        }
    }

    /// A float leaf at the front of `rest`: in one pass by `fast` when it
    /// can (a short decimal, see [`super::json_number`]), else from its
    /// token by the standard library.
    fn fast<T: std::str::FromStr + Copy + Into<f64>>(
        &self,
        i: usize,
        rest: &str,
        fast: fn(Decimal) -> Option<T>,
    ) -> Result<(T, usize), Error> {
        if let Some(d) = json_number::scan(rest.as_bytes()) {
            if let Some(x) = fast(d) {
                return Ok((x, d.len));
            }
        }
        let tok = &rest[..token_len(rest)];
        Ok((self.number(i, tok)?, tok.len()))
    }

    /// An integer leaf at the front of `rest` (see [`Elements::int_token`]):
    /// digits that fit an i64 in one pass, anything else from its token.
    fn int<T: TryFrom<i128>>(&self, i: usize, rest: &str) -> Result<(T, usize), Error> {
        if let Some((n, len)) = json_number::scan(rest.as_bytes()).and_then(|d| Some((d.to_i64()?, d.len))) {
            let tok = &rest[..len];
            return Ok((T::try_from(n.into()).map_err(|_| self.out_of_range(i, tok))?, len));
        }
        let tok = &rest[..token_len(rest)];
        Ok((self.int_token(i, tok)?, tok.len()))
    }

    /// An integral number (`2`, or `2.0`, `2e3`) that fits `T`.
    fn int_token<T: TryFrom<i128>>(&self, i: usize, tok: &str) -> Result<T, Error> {
        if !is_number(tok) {
            return Err(self.bad(i, tok, "an integer"));
        }
        let plain = !tok.bytes().any(|c| matches!(c, b'.' | b'e' | b'E'));
        let n: i128 = match tok.parse::<i128>() {
            Ok(n) if plain => n,
            _ => {
                let f: f64 = tok.parse().map_err(|_| self.bad(i, tok, "an integer"))?;
                if !f.is_finite() || f.fract() != 0.0 {
                    return Err(self.bad(i, tok, "an integer"));
                }
                if f.abs() >= 1e38 {
                    return Err(self.out_of_range(i, tok));
                }
                f as i128
            }
        };
        n.try_into().map_err(|_| self.out_of_range(i, tok))
    }

    /// A string's bytes: as they stand between the quotes when it has no
    /// escape (serde_json has validated the text), else unescaped.
    fn bytes<'t>(&self, i: usize, tok: &'t str) -> Result<std::borrow::Cow<'t, [u8]>, Error> {
        if !tok.starts_with('"') {
            return Err(self.bad(i, tok, "a string"));
        }
        if tok.len() >= 2 && !tok.contains('\\') {
            return Ok(tok.as_bytes()[1..tok.len() - 1].into());
        }
        serde_json::from_str::<String>(tok)
            .map(|s| s.into_bytes().into())
            .map_err(|e| Error::invalid(format!("{}: element {i} is invalid JSON: {e}", self.what)))
    }
}

/// True for a JSON number token (not `true`, `null` or a string).
fn is_number(tok: &str) -> bool {
    tok.as_bytes()
        .first()
        .is_some_and(|c| *c == b'-' || c.is_ascii_digit())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dec(dtype: DataType, raw: &str, count: usize) -> Result<TensorData, String> {
        decode("input `x`", dtype, raw, count, &[count as i64]).map_err(|e| e.to_string())
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
    fn a_huge_declared_shape_reserves_by_the_text_not_the_shape() {
        // A 10-byte body declaring 2^40 elements must not reserve for 2^40.
        assert_eq!(capacity(1 << 40, "[1, 2, 3]"), 5);
        assert_eq!(capacity(3, "[1, 2, 3]"), 3);
        let err = dec(DataType::I64, "[1, 2, 3]", 1 << 40).unwrap_err();
        assert!(err.contains("got 3"), "{err}");
        // Every element fits the bound, the shortest text per element included.
        let ones = format!("[{}]", vec!["1"; 1000].join(","));
        assert!(capacity(usize::MAX, &ones) >= 1000);
        assert_eq!(capacity(usize::MAX, "[7]"), 2);
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
        let TensorData::F64(v) = dec(DataType::F64, "[0.1, 1.7976931348623157e308, 5e-324]", 3).unwrap()
        else {
            panic!()
        };
        assert_eq!(v, vec![0.1, f64::MAX, 5e-324]);
    }

    #[test]
    fn strings_with_escapes_brackets_and_commas_are_one_element_each() {
        let got = dec(DataType::Bytes, r#"["a,]b", "q\"[", "\u00e9", ""]"#, 4).unwrap();
        let want = ["a,]b", "q\"[", "é", ""].map(|s| s.as_bytes().to_vec()).to_vec();
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
            (DataType::I8, "[-129]", "element 0 is -129, out of range for INT8"),
            (DataType::U64, "[-1]", "element 0 is -1, out of range for UINT64"),
            (
                DataType::I64,
                "[1e40]",
                "element 0 is 1e40, out of range for INT64",
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
            assert!(e.contains(want), "{raw}: {e}");
        }
        assert!(dec(DataType::I32, r#"[{"a": 1}]"#, 1)
            .unwrap_err()
            .contains("holds an object"));
        assert!(dec(DataType::I32, "3", 1)
            .unwrap_err()
            .contains("`data` must be an array, got 3"));
        assert!(dec(DataType::I32, "[1, 2, 3]", 2)
            .unwrap_err()
            .contains("needs 2 elements, got 3"));
    }

    #[test]
    fn integral_floats_and_extremes_of_every_int_type() {
        assert_eq!(
            dec(DataType::I64, "[2.0, 2e3, -0]", 3).unwrap(),
            TensorData::I64(vec![2, 2000, 0])
        );
        let max = format!("[{}, {}]", i64::MIN, i64::MAX);
        assert_eq!(
            dec(DataType::I64, &max, 2).unwrap(),
            TensorData::I64(vec![i64::MIN, i64::MAX])
        );
        let umax = format!("[{}]", u64::MAX);
        assert_eq!(
            dec(DataType::U64, &umax, 1).unwrap(),
            TensorData::U64(vec![u64::MAX])
        );
        assert_eq!(
            dec(DataType::Bool, "[true, false]", 2).unwrap(),
            TensorData::Bool(vec![true, false])
        );
    }
}
