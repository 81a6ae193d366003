//! The usual V2 JSON infer request, read in one pass: the envelope here,
//! and every input's `data` by the codec's element reader
//! ([`super::json::read`]) straight from the body's bytes, with no
//! `serde_json` pass that validates the body first (most of a float body's
//! decode; benches/README.md, "Request path").
//!
//! It reads only the common shape, and gives `None` for anything else (and
//! for any error), so that [`super::v2_binary::decode_request`] decodes that
//! body through serde_json, with the usual answer or error message:
//! - top-level keys `id` (a string), `inputs`, `outputs`; no `parameters`;
//! - each input with `name`, `shape`, `datatype` and `data` in any order
//!   (`data` is read where it stands when the other two came first, else
//!   skipped there and read at the end of the input), no `parameters`; each
//!   output with `name` alone;
//! - strings without escapes outside `data`; `data` as many elements as the
//!   shape says, each one its datatype holds;
//! - no unknown or repeated key, nothing after the object.
//!
//! Both paths read `data` with the same reader, so whatever this accepts
//! decodes to exactly what the serde path gives; the tests compare the two
//! on valid and on mangled bodies.

use super::json::{self, Layout};
use super::v2::parse_shape;
use super::InferRequest;
use crate::tensor::{DataType, Tensor, TensorData};

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
        sequence: None,
        classify: Vec::new(),
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
    let mut data = TensorData::with_capacity(dtype, 0);
    let read = json::read("", &r.b[r.i..], &mut data, Layout::Count(count)).ok()?;
    r.i += read.end;
    (read.leaves == count).then_some(data)
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
        self.i = json::after_ws(self.b, self.i);
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

    /// An integer written as digits, that fits an i64; not `-0`, which
    /// serde_json reads as a float (and refuses for an i64).
    fn int(&mut self) -> Option<i64> {
        self.ws();
        let (n, len) = json::number::<i64>(&self.b[self.i..])?;
        if n == 0 && self.b[self.i] == b'-' {
            return None;
        }
        self.i += len;
        Some(n)
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
}

#[cfg(test)]
mod tests;
