//! One JSON element (an array's leaf) parsed as a tensor's datatype, with
//! the messages that name what was wrong with it. Numbers are read by
//! `lexical-core` in JSON's grammar, correctly rounded straight to the
//! element type (`"0.1"` as FP32 is the f32 nearest 0.1, not the f64 nearest
//! it rounded again).

use std::borrow::Cow;

use lexical_core::{format::JSON, FromLexicalWithOptions, ParseFloatOptions, ParseIntegerOptions};

use crate::error::Error;
use crate::tensor::DataType;

const FLOAT: ParseFloatOptions = ParseFloatOptions::new();
const INTEGER: ParseIntegerOptions = ParseIntegerOptions::new();

/// The number of `T` at the front of `b` and its length, when it is a whole
/// JSON number token (the byte after it may follow an array element). A
/// JSON number ends with a digit; the check matters, since lexical-core's
/// integer parser reads a lone `-` before a non-digit as 0.
#[inline(always)]
pub(crate) fn number<T>(b: &[u8]) -> Option<(T, usize)>
where
    T: FromLexicalWithOptions,
    T::Options: Options,
{
    match lexical_core::parse_partial_with_options::<T, JSON>(b, T::Options::get()) {
        Ok((x, len)) if len > 0 && b[len - 1].is_ascii_digit() && ends(b, len) => Some((x, len)),
        _ => None,
    }
}

/// The options of a `lexical-core` number type: its defaults.
pub(crate) trait Options: 'static {
    fn get() -> &'static Self;
}

impl Options for ParseFloatOptions {
    fn get() -> &'static Self {
        &FLOAT
    }
}

impl Options for ParseIntegerOptions {
    fn get() -> &'static Self {
        &INTEGER
    }
}

/// True when a token of `len` bytes at the front of `b` ends there: at the
/// end, or before a byte that may follow an array element.
#[inline(always)]
fn ends(b: &[u8], len: usize) -> bool {
    matches!(
        b.get(len),
        None | Some(b',' | b']' | b' ' | b'\n' | b'\r' | b'\t')
    )
}

/// Length of the token at the front of `b`: a whole string (escapes
/// included), or up to the next byte that may follow an array element.
pub(super) fn token_len(b: &[u8]) -> usize {
    if b.first() == Some(&b'"') {
        let mut i = 1;
        while i < b.len() && b[i] != b'"' {
            i += if b[i] == b'\\' { 2 } else { 1 };
        }
        return (i + 1).min(b.len());
    }
    let end = (0..b.len()).find(|&i| ends(b, i)).unwrap_or(b.len());
    end.max(1).min(b.len())
}

/// The element parsers of one tensor, with its error messages: `what`
/// names the tensor ("input `x`", "instance 2 of input `x`").
pub(super) struct Elements<'a> {
    pub what: &'a str,
    pub dtype: DataType,
}

impl Elements<'_> {
    /// Element `i`, whose text starts `b`, is not what its type takes.
    #[cold]
    fn bad(&self, i: usize, b: &[u8], expected: &str) -> Error {
        Error::invalid(format!(
            "{}: element {i} is {}, expected {expected} for {}",
            self.what,
            show_token(b),
            self.dtype
        ))
    }

    #[cold]
    fn out_of_range(&self, i: usize, b: &[u8]) -> Error {
        Error::invalid(format!(
            "{}: element {i} is {}, out of range for {}",
            self.what,
            show_token(b),
            self.dtype
        ))
    }

    /// `true` or `false`.
    pub fn boolean(&self, i: usize, b: &[u8]) -> Result<(bool, usize), Error> {
        let len = token_len(b);
        match &b[..len] {
            b"true" => Ok((true, len)),
            b"false" => Ok((false, len)),
            _ => Err(self.bad(i, b, "true or false")),
        }
    }

    /// FP32 or FP64: a number; a finite one that `T` cannot hold is out of range.
    #[inline(always)]
    pub fn float<T>(&self, i: usize, b: &[u8]) -> Result<(T, usize), Error>
    where
        T: FromLexicalWithOptions<Options = ParseFloatOptions> + Into<f64> + Copy,
    {
        match number::<T>(b) {
            Some((x, _)) if x.into().is_infinite() => Err(self.out_of_range(i, b)),
            Some(read) => Ok(read),
            None => Err(self.bad(i, b, "a number")),
        }
    }

    /// FP16 or BF16: the f64 of the text, rounded to the type by `conv`.
    pub fn half<T: Copy>(
        &self,
        i: usize,
        b: &[u8],
        conv: fn(f64) -> T,
        infinite: fn(T) -> bool,
    ) -> Result<(T, usize), Error> {
        let (x, len) = self.float::<f64>(i, b)?;
        match infinite(conv(x)) {
            true => Err(self.out_of_range(i, b)),
            false => Ok((conv(x), len)),
        }
    }

    /// An integral number (`2`, or `2.0`, `2e3`) that fits `T`.
    #[inline(always)]
    pub fn int<T: TryFrom<i64> + TryFrom<i128>>(&self, i: usize, b: &[u8]) -> Result<(T, usize), Error> {
        if let Some((n, len)) = number::<i64>(b) {
            return Ok((T::try_from(n).map_err(|_| self.out_of_range(i, b))?, len));
        }
        self.int_slow(i, b)
    }

    /// [`Elements::int`] past i64, or not written as digits.
    fn int_slow<T: TryFrom<i128>>(&self, i: usize, b: &[u8]) -> Result<(T, usize), Error> {
        let (n, len) = match number::<i128>(b) {
            Some(read) => read,
            None => {
                let Some((f, len)) = number::<f64>(b) else {
                    return Err(self.bad(i, b, "an integer"));
                };
                if !f.is_finite() || f.fract() != 0.0 {
                    return Err(self.bad(i, b, "an integer"));
                }
                if f.abs() >= 1e38 {
                    return Err(self.out_of_range(i, b));
                }
                (f as i128, len)
            }
        };
        Ok((T::try_from(n).map_err(|_| self.out_of_range(i, b))?, len))
    }

    /// A string's UTF-8 bytes: as they stand between the quotes when it has
    /// no escape, else unescaped by serde_json.
    pub fn bytes<'t>(&self, i: usize, b: &'t [u8]) -> Result<(Cow<'t, [u8]>, usize), Error> {
        if b.first() != Some(&b'"') {
            return Err(self.bad(i, b, "a string"));
        }
        let len = token_len(b);
        let tok = &b[..len];
        let inner = &tok[1..len.max(2) - 1];
        let closed = len >= 2 && tok[len - 1] == b'"';
        if closed && !inner.iter().any(|&c| c == b'\\' || c < 0x20) && std::str::from_utf8(inner).is_ok() {
            return Ok((inner.into(), len));
        }
        serde_json::from_slice::<String>(tok)
            .map(|s| (s.into_bytes().into(), len))
            .map_err(|e| Error::invalid(format!("{}: element {i} is invalid JSON: {e}", self.what)))
    }
}

/// The token at the front of `b` for an error message, cut short when long.
pub(super) fn show_token(b: &[u8]) -> String {
    super::show(&String::from_utf8_lossy(&b[..token_len(b)]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_whole_json_tokens() {
        assert_eq!(number::<f32>(b"-12.50e+1, 3"), Some((-125.0, 9)));
        assert_eq!(number::<i64>(b"7]"), Some((7, 1)));
        assert_eq!(number::<i64>(b"2.0"), None);
        assert_eq!(number::<f64>(b"1e400"), Some((f64::INFINITY, 5)));
        for bad in [
            "", "-", "-]", "-,", "- ", "--1", "-.5", ".5", "1.", "1e", "1e+", "true", "\"1\"", "1x", "0x10",
            "NaN", "01", "+1", "-0",
        ] {
            assert_eq!(number::<i64>(bad.as_bytes()), None, "{bad}");
            if bad != "-0" {
                assert_eq!(number::<f64>(bad.as_bytes()), None, "{bad}");
            }
        }
    }

    #[test]
    fn tokens_end_where_an_element_may() {
        assert_eq!(token_len(b"123, 4"), 3);
        assert_eq!(token_len(br#""a,]\"b", 1"#), 8);
        assert_eq!(token_len(b"true]"), 4);
        assert_eq!(token_len(b"x"), 1);
        assert_eq!(token_len(b""), 0);
    }
}
