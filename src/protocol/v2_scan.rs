//! The usual V2 JSON infer request, read in one pass: the envelope and every
//! input's numbers straight from the body's bytes, with no `serde_json`
//! pass that validates `data` first (`RawValue`) and a second that parses it
//! (`super::json_data`): that first pass was most of a float body's decode
//! (benches/README.md, "Request path").
//!
//! It reads only the common shape, and gives `None` for anything else, so
//! that [`super::v2_binary::decode_request`] decodes that body the usual
//! way, with the usual answer or error message:
//! - top-level keys `id` (a string), `inputs`, `outputs`; no `parameters`;
//! - each input with `name`, `shape`, `datatype` and `data` in any order
//!   (`data` is read where it stands when the other two came first, else
//!   checked there and read at the end of the input), no `parameters`; each
//!   output with `name` alone;
//! - strings without escapes; `data` of a numeric datatype (not FP16, BF16,
//!   BOOL or BYTES), flat or nested arrays of numbers, as many as the shape
//!   says, each one that the datatype holds (integers written as digits);
//! - no unknown or repeated key, nothing after the object.
//!
//! Whatever it accepts it decodes to exactly what the serde path gives (the
//! same element parsers: [`super::json_number`], then the standard
//! library's); the tests here compare the two on valid and on mangled bodies.

use super::json_number::{self, Decimal};
use super::v2::parse_shape;
use super::InferRequest;
use crate::tensor::{DataType, Tensor, TensorData};

mod f32_run;

/// Elements read one by one after `run` (see [`Reader::leaves`]) stopped,
/// before it is tried again: a body of exponent forms (`-8.5e-1`), which
/// `run` never reads, would otherwise pay for a failed try at every element.
const RUN_REST: usize = 16;

/// Deepest nesting of `data` arrays read here; deeper goes to serde_json
/// (whose own limit is 128).
const MAX_DEPTH: usize = 32;

/// The request in `body`, or `None` when it is not of the common shape (see
/// the module's doc) or not valid.
pub(super) fn decode(body: &[u8]) -> Option<InferRequest> {
    let mut r = Reader { b: body, i: 0 };
    let (mut id, mut inputs, mut outputs) = (None, None, None);
    r.object(|r, key| {
        match key {
            "id" if id.is_none() => id = Some(r.string()?.to_string()),
            "inputs" if inputs.is_none() => inputs = Some(r.array(input)?),
            "outputs" if outputs.is_none() => outputs = Some(r.array(output)?),
            _ => return None,
        }
        Some(())
    })?;
    r.ws();
    if r.i != body.len() {
        return None;
    }
    Some(InferRequest {
        schedule: Default::default(),
        id,
        inputs: inputs?,
        outputs,
    })
}

/// One input object: `name`, `shape`, `datatype` and `data`, in any order.
/// Serializers that sort keys (serde_json's `json!`) put `data` first: it
/// is then only skipped where it stands (to its closing bracket), and read,
/// and checked, once the datatype and shape are known; reading it must end
/// where the skip did.
fn input(r: &mut Reader<'_>) -> Option<Tensor> {
    let (mut name, mut shape, mut datatype, mut data) = (None, None, None, None);
    let mut data_at = None;
    r.object(|r, key| {
        match key {
            "name" if name.is_none() => name = Some(r.string()?),
            "datatype" if datatype.is_none() => datatype = Some(DataType::parse(r.string()?)?),
            "shape" if shape.is_none() => shape = Some(parse_shape("", &r.array(Reader::int)?).ok()?),
            "data" if data.is_none() && data_at.is_none() => match (datatype, &shape) {
                (Some(dtype), Some((_, count))) => data = Some(elements(r, dtype, *count)?),
                _ => {
                    let at = r.i;
                    r.skip_array()?;
                    data_at = Some((at, r.i));
                }
            },
            _ => return None,
        }
        Some(())
    })?;
    let (shape, count) = shape?;
    if let Some((at, end)) = data_at {
        let mut again = Reader { b: r.b, i: at };
        data = Some(elements(&mut again, datatype?, count)?);
        if again.i != end {
            return None;
        }
    }
    Some(Tensor {
        name: name?.to_string(),
        shape,
        data: data?,
    })
}

/// One requested output: `{"name": ...}`.
fn output(r: &mut Reader<'_>) -> Option<String> {
    let mut name = None;
    r.object(|r, key| {
        match key {
            "name" if name.is_none() => name = Some(r.string()?.to_string()),
            _ => return None,
        }
        Some(())
    })?;
    name
}

/// The `data` array at the reader, as exactly `count` elements of `dtype`.
fn elements(r: &mut Reader<'_>, dtype: DataType, count: usize) -> Option<TensorData> {
    macro_rules! ints {
        ($variant:ident) => {
            TensorData::$variant(r.leaves(count, no_run, |b| {
                let d = number(b)?;
                Some((d.to_i64()?.try_into().ok()?, d.len))
            })?)
        };
    }
    let data = match dtype {
        DataType::F32 => TensorData::F32(r.leaves(count, f32_run::run, |b| float(b, Decimal::to_f32))?),
        DataType::F64 => TensorData::F64(r.leaves(count, no_run, |b| float(b, Decimal::to_f64))?),
        DataType::I64 => ints!(I64),
        DataType::I32 => ints!(I32),
        DataType::I16 => ints!(I16),
        DataType::I8 => ints!(I8),
        DataType::U64 => ints!(U64),
        DataType::U32 => ints!(U32),
        DataType::U16 => ints!(U16),
        DataType::U8 => ints!(U8),
        DataType::F16 | DataType::Bf16 | DataType::Bool | DataType::Bytes => return None,
    };
    (data.len() == count).then_some(data)
}

/// The `run` of [`Reader::leaves`] for the element types that have none.
#[inline(always)]
fn no_run<T>(_: &[u8], _: &mut Vec<T>, _: usize) -> usize {
    0
}

/// The JSON number at the front of `b` when [`json_number::scan`] reads it
/// and it has no leading zero (which JSON forbids and `scan` tolerates).
#[inline(always)]
fn number(b: &[u8]) -> Option<Decimal> {
    let digits = &b[usize::from(b.first() == Some(&b'-'))..];
    if digits.first() == Some(&b'0') && digits.get(1).is_some_and(u8::is_ascii_digit) {
        return None;
    }
    json_number::scan(b)
}

/// A float leaf: one pass when `fast` can (as `super::json_data` does), else
/// the standard library's parse of the token, which must be a JSON number
/// whose value is finite in `T`.
#[inline(always)]
fn float<T: std::str::FromStr + Into<f64> + Copy>(
    b: &[u8],
    fast: impl Fn(Decimal) -> Option<T>,
) -> Option<(T, usize)> {
    if let Some(d) = number(b) {
        if let Some(x) = fast(d) {
            return Some((x, d.len));
        }
    }
    let len = number_len(b)?;
    let x: T = std::str::from_utf8(&b[..len]).ok()?.parse().ok()?;
    (!x.into().is_infinite()).then_some((x, len))
}

/// Length of the JSON number at the front of `b`
/// (`-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`), followed by a byte
/// that may follow an array element or by the end.
fn number_len(b: &[u8]) -> Option<usize> {
    let digits = |i: usize| {
        b[i.min(b.len())..]
            .iter()
            .take_while(|c| c.is_ascii_digit())
            .count()
    };
    let mut i = usize::from(b.first() == Some(&b'-'));
    let int = digits(i);
    if int == 0 || (int > 1 && b[i] == b'0') {
        return None;
    }
    i += int;
    if b.get(i) == Some(&b'.') {
        let frac = digits(i + 1);
        if frac == 0 {
            return None;
        }
        i += 1 + frac;
    }
    if matches!(b.get(i), Some(b'e' | b'E')) {
        i += 1 + usize::from(matches!(b.get(i + 1), Some(b'+' | b'-')));
        let exp = digits(i);
        if exp == 0 {
            return None;
        }
        i += exp;
    }
    matches!(b.get(i), None | Some(b',' | b']' | b' ' | b'\n' | b'\r' | b'\t')).then_some(i)
}

/// The index of the first byte at or after `i` that is not JSON whitespace.
#[inline(always)]
fn after_ws(b: &[u8], mut i: usize) -> usize {
    while matches!(b.get(i), Some(b' ' | b'\n' | b'\r' | b'\t')) {
        i += 1;
    }
    i
}

/// A cursor over the body.
struct Reader<'a> {
    b: &'a [u8],
    i: usize,
}

impl<'a> Reader<'a> {
    /// Skips JSON whitespace.
    #[inline(always)]
    fn ws(&mut self) {
        self.i = after_ws(self.b, self.i);
    }

    /// Skips whitespace, then takes `c`.
    #[inline(always)]
    fn eat(&mut self, c: u8) -> bool {
        self.ws();
        let hit = self.b.get(self.i) == Some(&c);
        self.i += usize::from(hit);
        hit
    }

    /// A string without escapes or control characters, valid UTF-8.
    fn string(&mut self) -> Option<&'a str> {
        if !self.eat(b'"') {
            return None;
        }
        let start = self.i;
        let len = self.b[start..]
            .iter()
            .position(|&c| c == b'"' || c == b'\\' || c < 0x20)?;
        if self.b[start + len] != b'"' {
            return None;
        }
        self.i = start + len + 1;
        std::str::from_utf8(&self.b[start..start + len]).ok()
    }

    /// An integer written as digits, that fits an i64.
    fn int(&mut self) -> Option<i64> {
        self.ws();
        let d = number(&self.b[self.i..])?;
        self.i += d.len;
        d.to_i64()
    }

    /// An object: `member` reads the value of each key, at the reader.
    fn object(&mut self, mut member: impl FnMut(&mut Self, &'a str) -> Option<()>) -> Option<()> {
        if !self.eat(b'{') {
            return None;
        }
        if self.eat(b'}') {
            return Some(());
        }
        loop {
            let key = self.string()?;
            if !self.eat(b':') {
                return None;
            }
            member(self, key)?;
            if self.eat(b'}') {
                return Some(());
            }
            if !self.eat(b',') {
                return None;
            }
        }
    }

    /// An array: `item` reads each element, at the reader.
    fn array<T>(&mut self, mut item: impl FnMut(&mut Self) -> Option<T>) -> Option<Vec<T>> {
        if !self.eat(b'[') {
            return None;
        }
        let mut items = Vec::new();
        if self.eat(b']') {
            return Some(items);
        }
        loop {
            items.push(item(self)?);
            if self.eat(b']') {
                return Some(items);
            }
            if !self.eat(b',') {
                return None;
            }
        }
    }

    /// Moves past the array at the reader, to its closing bracket, without
    /// reading its elements: only brackets count, so an array that holds a
    /// string (where a bracket may be text) gives `None`.
    fn skip_array(&mut self) -> Option<()> {
        if !self.eat(b'[') {
            return None;
        }
        let mut depth = 1usize;
        while depth > 0 {
            let at = self.i + memchr::memchr3(b'[', b']', b'"', &self.b[self.i..])?;
            match self.b[at] {
                b'[' => depth += 1,
                b']' => depth -= 1,
                _ => return None,
            }
            self.i = at + 1;
        }
        Some(())
    }

    /// The leaves of a (flat or nested) array of numbers, in row-major
    /// order: at most `count` of them, each read by `leaf` from the bytes at
    /// its start, which gives the element and the token's length. Where an
    /// element starts, `run` may first read a run of elements and their
    /// commas in bulk (given the bytes, the vector and the room left in
    /// it; it returns the bytes it read, 0 to leave the element to `leaf`).
    #[inline(always)]
    fn leaves<T>(
        &mut self,
        count: usize,
        run: impl Fn(&[u8], &mut Vec<T>, usize) -> usize,
        leaf: impl Fn(&[u8]) -> Option<(T, usize)>,
    ) -> Option<Vec<T>> {
        if !self.eat(b'[') {
            return None;
        }
        // Every element takes at least two bytes of text: a body that
        // declares a huge shape reserves no more than its text can fill.
        let mut out = Vec::with_capacity(count.min((self.b.len() - self.i) / 2 + 1));
        let b = self.b;
        let mut i = self.i;
        let mut depth = 1usize;
        // After `[`: a value or `]`; after `,`: a value; after a value: `,` or `]`.
        let mut after_open = true;
        // Elements left to `leaf` before `run` is tried again.
        let mut rest = 0;
        loop {
            i = after_ws(b, i);
            match *b.get(i)? {
                b'[' => {
                    depth += 1;
                    if depth > MAX_DEPTH {
                        return None;
                    }
                    i += 1;
                    after_open = true;
                    continue;
                }
                b']' if after_open => {}
                _ => {
                    if rest == 0 {
                        let room = count - out.len();
                        let read = run(&b[i..], &mut out, room);
                        if read > 0 {
                            // Just after a comma: a value must follow.
                            i += read;
                            after_open = false;
                            continue;
                        }
                        // It stopped at this element: `leaf` reads the next
                        // few (an array of forms `run` does not read, such as
                        // exponents, must not pay for trying each of them).
                        rest = RUN_REST;
                    }
                    rest -= 1;
                    let (x, len) = leaf(&b[i..])?;
                    if out.len() == count {
                        return None;
                    }
                    out.push(x);
                    i += len;
                }
            }
            // After a value (or an empty array's `[`): `,` or `]`s.
            loop {
                i = after_ws(b, i);
                match *b.get(i)? {
                    b']' => {
                        i += 1;
                        depth -= 1;
                        if depth == 0 {
                            self.i = i;
                            return Some(out);
                        }
                    }
                    b',' => {
                        i += 1;
                        after_open = false;
                        break;
                    }
                    _ => return None,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
