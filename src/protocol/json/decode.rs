//! The element reader: walks a tensor's JSON value (flat or nested arrays of
//! leaves) over its bytes, in one pass, and appends each leaf, parsed as the
//! tensor's datatype ([`super::element`]), to a typed vector. It checks the
//! JSON grammar of what it reads, so it may run on bytes no JSON parser has
//! seen (the one-pass V2 reader, `protocol/v2_scan.rs`) as well as on text serde_json has.

use std::borrow::Cow;

use super::element::{show_token, Elements};
use super::f32_run;
use crate::error::Error;
use crate::tensor::{Strings, TensorData};

/// Deepest nesting of arrays read (serde_json's own limit).
const MAX_DEPTH: usize = 128;

/// Elements read one by one after `run` (see [`Walk::walk`]) stopped, before it is
/// tried again: a body of exponent forms (`-8.5e-1`), which `run` never
/// reads, would otherwise pay for a failed try at every element.
const RUN_REST: usize = 16;

/// How a tensor's arrays nest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Layout {
    /// V2 `data`: an array of leaves nested in any arrangement (as Triton
    /// takes it); at most this many are kept, the rest only counted.
    Count(usize),
    /// A V1 row: a scalar, or arrays nested rectangularly, whose shape is read.
    Rectangular,
}

/// What [`read`] read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Read {
    /// Leaves found (with [`Layout::Count`], possibly more than were kept).
    pub leaves: usize,
    /// With [`Layout::Rectangular`], the shape of the value (`[]` for a scalar).
    pub shape: Vec<usize>,
    /// The index in the bytes just after the value.
    pub end: usize,
}

/// Reads the JSON value at the front of `b` (after whitespace) as elements of
/// `out`'s datatype, appending them to `out`; `what` names the tensor in
/// errors ("input `x`"). Float types take any number and refuse values
/// their type cannot hold; integer types take integral numbers in range
/// (1.5 is refused, 2.0 is 2); BOOL takes `true`/`false`; BYTES takes
/// strings (their UTF-8 bytes). Memory grows with the elements the text
/// holds, never with a shape it claims.
pub(crate) fn read(what: &str, b: &[u8], out: &mut TensorData, layout: Layout) -> Result<Read, Error> {
    let e = Elements {
        what,
        dtype: out.dtype(),
    };
    let w = Walk { e: &e, b, layout };
    match out {
        TensorData::F32(v) => w.walk(v, f32_run::run, |i, b| e.float(i, b)),
        TensorData::F64(v) => w.walk(v, no_run, |i, b| e.float(i, b)),
        TensorData::F16(v) => w.walk(v, no_run, |i, b| {
            e.half(i, b, half::f16::from_f64, half::f16::is_infinite)
        }),
        TensorData::Bf16(v) => w.walk(v, no_run, |i, b| {
            e.half(i, b, half::bf16::from_f64, half::bf16::is_infinite)
        }),
        TensorData::I64(v) => w.walk(v, no_run, |i, b| e.int(i, b)),
        TensorData::I32(v) => w.walk(v, no_run, |i, b| e.int(i, b)),
        TensorData::I16(v) => w.walk(v, no_run, |i, b| e.int(i, b)),
        TensorData::I8(v) => w.walk(v, no_run, |i, b| e.int(i, b)),
        TensorData::U64(v) => w.walk(v, no_run, |i, b| e.int(i, b)),
        TensorData::U32(v) => w.walk(v, no_run, |i, b| e.int(i, b)),
        TensorData::U16(v) => w.walk(v, no_run, |i, b| e.int(i, b)),
        TensorData::U8(v) => w.walk(v, no_run, |i, b| e.int(i, b)),
        TensorData::Bool(v) => w.walk(v, no_run, |i, b| e.boolean(i, b)),
        TensorData::Bytes(v) => w.walk(v, no_run, |i, b| e.bytes(i, b)),
    }
}

/// Where the leaves go: a typed vector, or BYTES' one buffer.
trait Sink {
    type Item<'t>;
    /// The fewest bytes of text an element and its comma take.
    const MIN_TEXT: usize = 2;
    fn len(&self) -> usize;
    fn reserve(&mut self, n: usize);
    fn push(&mut self, x: Self::Item<'_>);
}

impl<T> Sink for Vec<T> {
    type Item<'t> = T;
    #[inline(always)]
    fn len(&self) -> usize {
        Vec::len(self)
    }
    fn reserve(&mut self, n: usize) {
        Vec::reserve(self, n);
    }
    #[inline(always)]
    fn push(&mut self, x: T) {
        Vec::push(self, x);
    }
}

impl Sink for Strings {
    type Item<'t> = Cow<'t, [u8]>;
    /// `"",`
    const MIN_TEXT: usize = 3;
    fn len(&self) -> usize {
        Strings::len(self)
    }
    fn reserve(&mut self, n: usize) {
        Strings::reserve(self, n);
    }
    fn push(&mut self, x: Cow<'_, [u8]>) {
        Strings::push(self, x);
    }
}

/// The `run` of [`Walk::walk`] for the element types that have none.
#[inline(always)]
fn no_run<S>(_: &[u8], _: &mut S, _: usize) -> usize {
    0
}

/// The index of the first byte at or after `i` that is not JSON whitespace.
#[inline(always)]
pub(crate) fn after_ws(b: &[u8], mut i: usize) -> usize {
    while matches!(b.get(i), Some(b' ' | b'\n' | b'\r' | b'\t')) {
        i += 1;
    }
    i
}

/// Where a walk is.
struct Cursor {
    /// The index in the bytes.
    i: usize,
    /// The arrays open around it.
    depth: usize,
    /// Leaves read.
    n: usize,
    /// Leaves left to `leaf` before `run` is tried again.
    rest: usize,
}

/// One walk over a value's bytes.
struct Walk<'a> {
    e: &'a Elements<'a>,
    b: &'a [u8],
    layout: Layout,
}

impl<'a> Walk<'a> {
    /// The leaves of the value, in row-major order, each read by `leaf` from
    /// the bytes at its start (given its index; it gives the element and its
    /// token's length). Where an element starts, `run` may first read a run
    /// of elements and their commas in bulk (given the bytes, the vector and
    /// the room left in it; it returns the bytes it read, 0 to leave the
    /// element to `leaf`).
    #[inline(always)]
    fn walk<S: Sink>(
        &self,
        out: &mut S,
        run: impl Fn(&[u8], &mut S, usize) -> usize,
        leaf: impl Fn(usize, &'a [u8]) -> Result<(S::Item<'a>, usize), Error>,
    ) -> Result<Read, Error> {
        let b = self.b;
        let (keep, mut shape) = match self.layout {
            Layout::Count(count) => (count, None),
            Layout::Rectangular => (usize::MAX, Some(Shape::default())),
        };
        let mut c = Cursor {
            i: after_ws(b, 0),
            depth: 0,
            n: 0,
            rest: 0,
        };
        if b.get(c.i) != Some(&b'[') {
            if shape.is_none() {
                return Err(self.not_an_array(c.i));
            }
            let (x, len) = leaf(0, &b[c.i..])?;
            out.push(x);
            return Ok(Read {
                leaves: 1,
                shape: vec![],
                end: c.i + len,
            });
        }
        // Every element takes some bytes of text: a body that claims a
        // huge shape reserves no more than its text can fill.
        out.reserve(keep.min((b.len() - c.i) / S::MIN_TEXT + 1));
        let base = out.len();
        loop {
            // A value: an array, or a leaf.
            c.i = after_ws(b, c.i);
            match b.get(c.i) {
                Some(b'[') => {
                    if self.open(&mut c, &mut shape)? {
                        continue;
                    }
                }
                Some(b'{') => return Err(self.object()),
                Some(_) => {
                    if c.rest == 0 {
                        let before = out.len();
                        let read = run(&b[c.i..], out, keep.saturating_sub(before - base));
                        if read > 0 {
                            // Up to just after a comma: a value follows.
                            self.leaves(&mut c, &mut shape, out.len() - before)?;
                            c.i += read;
                            continue;
                        }
                        c.rest = RUN_REST;
                    }
                    c.rest -= 1;
                    let (x, len) = leaf(c.n, &b[c.i..])?;
                    if c.n < keep {
                        out.push(x);
                    }
                    self.leaves(&mut c, &mut shape, 1)?;
                    c.i += len;
                }
                None => return Err(self.malformed("ends inside an array".into())),
            }
            if let Some(read) = self.after_value(&mut c, &mut shape)? {
                return Ok(read);
            }
        }
    }

    /// An array opens at the cursor; false when it is empty (`[]`: the
    /// cursor is then at its `]`).
    #[inline(always)]
    fn open(&self, c: &mut Cursor, shape: &mut Option<Shape>) -> Result<bool, Error> {
        if c.depth == MAX_DEPTH {
            return Err(self.malformed(format!("nests deeper than {MAX_DEPTH} arrays")));
        }
        if let Some(s) = shape {
            s.open(c.depth).map_err(|()| self.ragged())?;
        }
        c.depth += 1;
        c.i = after_ws(self.b, c.i + 1);
        Ok(self.b.get(c.i) != Some(&b']'))
    }

    /// `k` leaves were read at the cursor's depth.
    #[inline(always)]
    fn leaves(&self, c: &mut Cursor, shape: &mut Option<Shape>, k: usize) -> Result<(), Error> {
        if let Some(s) = shape {
            s.leaves(c.depth, k).map_err(|()| self.ragged())?;
        }
        c.n += k;
        Ok(())
    }

    /// After a value (or an empty array's `[`): `,` (the cursor moves past
    /// it, to the next value) or `]`s; the value read when the last closes.
    #[inline(always)]
    fn after_value(&self, c: &mut Cursor, shape: &mut Option<Shape>) -> Result<Option<Read>, Error> {
        loop {
            c.i = after_ws(self.b, c.i);
            match self.b.get(c.i) {
                Some(b']') => {
                    c.i += 1;
                    c.depth -= 1;
                    if let Some(s) = shape {
                        s.close(c.depth).map_err(|()| self.ragged())?;
                    }
                    if c.depth == 0 {
                        let shape = shape.take().map(Shape::dims).unwrap_or_default();
                        return Ok(Some(Read {
                            leaves: c.n,
                            shape,
                            end: c.i,
                        }));
                    }
                }
                Some(b',') => {
                    c.i += 1;
                    return Ok(None);
                }
                _ => {
                    let got = self.show(c.i);
                    return Err(self.malformed(format!("has {got} where `,` or `]` belongs")));
                }
            }
        }
    }

    fn show(&self, i: usize) -> String {
        show_token(&self.b[i.min(self.b.len())..])
    }

    fn noun(&self) -> &'static str {
        match self.layout {
            Layout::Count(_) => "`data`",
            Layout::Rectangular => "the row",
        }
    }

    #[cold]
    fn not_an_array(&self, i: usize) -> Error {
        Error::invalid(format!(
            "{}: {} must be an array, got {}",
            self.e.what,
            self.noun(),
            self.show(i)
        ))
    }

    #[cold]
    fn object(&self) -> Error {
        Error::invalid(format!(
            "{}: {} holds an object; expected numbers, booleans or strings in (nested) arrays",
            self.e.what,
            self.noun()
        ))
    }

    #[cold]
    fn malformed(&self, how: String) -> Error {
        Error::invalid(format!("{}: invalid JSON: the value {how}", self.e.what))
    }

    #[cold]
    fn ragged(&self) -> Error {
        Error::invalid(format!(
            "{} is ragged: its sub-arrays differ in length or in depth",
            self.e.what
        ))
    }
}

/// The shape of a rectangular value, checked as it is read: every array at
/// one depth has the length of the first that closed there, and leaves sit
/// at one depth only, below every array.
#[derive(Default)]
struct Shape {
    /// The length of each depth's arrays, once one has closed there.
    dims: Vec<Option<usize>>,
    /// The values counted so far in each open array.
    open: Vec<usize>,
    /// The depth of the leaves, once one was read.
    leaf_depth: Option<usize>,
}

impl Shape {
    /// An array opens as a value at `depth` (the arrays around it).
    fn open(&mut self, depth: usize) -> Result<(), ()> {
        if self.leaf_depth.is_some_and(|d| depth >= d) {
            return Err(());
        }
        if let Some(c) = self.open.last_mut() {
            *c += 1;
        }
        self.open.push(0);
        Ok(())
    }

    /// `k` leaves are read at `depth`.
    fn leaves(&mut self, depth: usize, k: usize) -> Result<(), ()> {
        match self.leaf_depth {
            Some(d) if d != depth => return Err(()),
            Some(_) => {}
            None if self.dims.get(depth).is_some_and(Option::is_some) => return Err(()),
            None => self.leaf_depth = Some(depth),
        }
        if let Some(c) = self.open.last_mut() {
            *c += k;
        }
        Ok(())
    }

    /// The array at `depth` closes.
    fn close(&mut self, depth: usize) -> Result<(), ()> {
        let len = self.open.pop().unwrap_or(0);
        if self.dims.len() <= depth {
            self.dims.resize(depth + 1, None);
        }
        match self.dims[depth] {
            Some(d) if d != len => Err(()),
            _ => {
                self.dims[depth] = Some(len);
                Ok(())
            }
        }
    }

    /// The dims known from the top down.
    fn dims(self) -> Vec<usize> {
        self.dims.iter().map_while(|d| *d).collect()
    }
}

#[cfg(test)]
mod tests;
