//! Tensors written as JSON, straight from their typed vectors (no `Value`
//! per element): FP32 (and FP16, BF16, as f32s) in serde_json's shortest
//! decimal, which parses back to the same f32; NaN and infinities as `null`;
//! BYTES as strings (lossy UTF-8).

use serde::ser::{Serialize, SerializeSeq, Serializer};

use crate::tensor::TensorData;

/// Elements `offset..` of a tensor's data as a JSON array of `len` values,
/// each nested by `inner` (the dims below; none: each value is an element).
#[derive(Debug, Clone, Copy)]
pub(crate) struct JsonElements<'a> {
    pub data: &'a TensorData,
    pub offset: usize,
    pub len: usize,
    pub inner: &'a [usize],
}

impl<'a> JsonElements<'a> {
    /// All of `data`, as one flat array.
    pub fn flat(data: &'a TensorData) -> Self {
        JsonElements {
            data,
            offset: 0,
            len: data.len(),
            inner: &[],
        }
    }
}

/// Runs `$body` for each element of `$data` in `$range`, bound to `$x` as a
/// value serde writes as the element's JSON.
macro_rules! each_element {
    ($data:expr, $range:expr, |$x:ident| $body:expr) => {
        match $data {
            TensorData::Bool(v) => each_element!(@ v[$range].iter(), |$x| $body),
            TensorData::U8(v) => each_element!(@ v[$range].iter(), |$x| $body),
            TensorData::U16(v) => each_element!(@ v[$range].iter(), |$x| $body),
            TensorData::U32(v) => each_element!(@ v[$range].iter(), |$x| $body),
            TensorData::U64(v) => each_element!(@ v[$range].iter(), |$x| $body),
            TensorData::I8(v) => each_element!(@ v[$range].iter(), |$x| $body),
            TensorData::I16(v) => each_element!(@ v[$range].iter(), |$x| $body),
            TensorData::I32(v) => each_element!(@ v[$range].iter(), |$x| $body),
            TensorData::I64(v) => each_element!(@ v[$range].iter(), |$x| $body),
            TensorData::F32(v) => each_element!(@ v[$range].iter(), |$x| $body),
            TensorData::F64(v) => each_element!(@ v[$range].iter(), |$x| $body),
            TensorData::F16(v) => each_element!(@ v[$range].iter().map(|x| x.to_f32()), |$x| $body),
            TensorData::Bf16(v) => each_element!(@ v[$range].iter().map(|x| x.to_f32()), |$x| $body),
            TensorData::Bytes(v) => {
                each_element!(@ $range.map(|k| String::from_utf8_lossy(&v[k])), |$x| $body)
            }
        }
    };
    (@ $items:expr, |$x:ident| $body:expr) => {
        for $x in $items {
            $body;
        }
    };
}

impl Serialize for JsonElements<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.len))?;
        match self.inner.split_first() {
            None => {
                let range = self.offset..self.offset + self.len;
                each_element!(self.data, range, |x| seq.serialize_element(&x)?);
            }
            Some((&len, inner)) => {
                let stride = len * inner.iter().product::<usize>();
                for k in 0..self.len {
                    let offset = self.offset + k * stride;
                    seq.serialize_element(&JsonElements {
                        data: self.data,
                        offset,
                        len,
                        inner,
                    })?;
                }
            }
        }
        seq.end()
    }
}

/// Element `i` of a tensor's data as a JSON scalar.
#[derive(Debug, Clone, Copy)]
pub(crate) struct JsonElement<'a>(pub &'a TensorData, pub usize);

impl Serialize for JsonElement<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let Self(data, i) = *self;
        each_element!(data, i..i + 1, |x| return x.serialize(s));
        unreachable!("element {i} of {} is in bounds", data.len())
    }
}

#[cfg(test)]
mod tests;
