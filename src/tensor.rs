//! Internal tensor types shared by every layer: the protocols decode into
//! them, the batcher concatenates and splits them, the runtime feeds them to
//! ONNX Runtime. Pure data, no I/O.

use std::fmt;

pub use strings::Strings;

/// A tensor element type, named as in the Open Inference Protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DataType {
    Bool,
    U8,
    U16,
    U32,
    U64,
    I8,
    I16,
    I32,
    I64,
    F16,
    Bf16,
    F32,
    F64,
    /// Variable-length byte strings (ONNX `STRING`).
    Bytes,
}

impl DataType {
    /// Every datatype, in protocol order.
    pub const ALL: [DataType; 14] = [
        DataType::Bool,
        DataType::U8,
        DataType::U16,
        DataType::U32,
        DataType::U64,
        DataType::I8,
        DataType::I16,
        DataType::I32,
        DataType::I64,
        DataType::F16,
        DataType::Bf16,
        DataType::F32,
        DataType::F64,
        DataType::Bytes,
    ];

    /// The Open Inference Protocol name (`"FP32"`, `"BYTES"`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            DataType::Bool => "BOOL",
            DataType::U8 => "UINT8",
            DataType::U16 => "UINT16",
            DataType::U32 => "UINT32",
            DataType::U64 => "UINT64",
            DataType::I8 => "INT8",
            DataType::I16 => "INT16",
            DataType::I32 => "INT32",
            DataType::I64 => "INT64",
            DataType::F16 => "FP16",
            DataType::Bf16 => "BF16",
            DataType::F32 => "FP32",
            DataType::F64 => "FP64",
            DataType::Bytes => "BYTES",
        }
    }

    /// Parses an Open Inference Protocol datatype name (case-sensitive, as the protocol is).
    pub fn parse(s: &str) -> Option<DataType> {
        DataType::ALL.into_iter().find(|d| d.as_str() == s)
    }

    /// Bytes per element, `None` for `BYTES`.
    pub fn size_of(self) -> Option<usize> {
        Some(match self {
            DataType::Bool | DataType::U8 | DataType::I8 => 1,
            DataType::U16 | DataType::I16 | DataType::F16 | DataType::Bf16 => 2,
            DataType::U32 | DataType::I32 | DataType::F32 => 4,
            DataType::U64 | DataType::I64 | DataType::F64 => 8,
            DataType::Bytes => return None,
        })
    }
}

impl serde::Serialize for DataType {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The elements of a tensor, flat, in row-major order.
#[derive(Debug, Clone, PartialEq)]
pub enum TensorData {
    Bool(Vec<bool>),
    U8(Vec<u8>),
    U16(Vec<u16>),
    U32(Vec<u32>),
    U64(Vec<u64>),
    I8(Vec<i8>),
    I16(Vec<i16>),
    I32(Vec<i32>),
    I64(Vec<i64>),
    F16(Vec<half::f16>),
    Bf16(Vec<half::bf16>),
    F32(Vec<f32>),
    F64(Vec<f64>),
    Bytes(Strings),
}

/// Runs `$body` with `$v` bound to the inner `Vec` of any variant.
#[macro_export]
#[doc(hidden)]
macro_rules! with_tensor_data {
    ($data:expr, $v:ident => $body:expr) => {
        match $data {
            $crate::tensor::TensorData::Bool($v) => $body,
            $crate::tensor::TensorData::U8($v) => $body,
            $crate::tensor::TensorData::U16($v) => $body,
            $crate::tensor::TensorData::U32($v) => $body,
            $crate::tensor::TensorData::U64($v) => $body,
            $crate::tensor::TensorData::I8($v) => $body,
            $crate::tensor::TensorData::I16($v) => $body,
            $crate::tensor::TensorData::I32($v) => $body,
            $crate::tensor::TensorData::I64($v) => $body,
            $crate::tensor::TensorData::F16($v) => $body,
            $crate::tensor::TensorData::Bf16($v) => $body,
            $crate::tensor::TensorData::F32($v) => $body,
            $crate::tensor::TensorData::F64($v) => $body,
            $crate::tensor::TensorData::Bytes($v) => $body,
        }
    };
}

/// Rebuilds the same variant as `$data` from an expression producing its
/// `Vec`, or, for `BYTES`, its [`Strings`].
macro_rules! map_tensor_data {
    ($data:expr, $v:ident => $body:expr, $s:ident => $bytes:expr) => {
        match $data {
            TensorData::Bool($v) => TensorData::Bool($body),
            TensorData::U8($v) => TensorData::U8($body),
            TensorData::U16($v) => TensorData::U16($body),
            TensorData::U32($v) => TensorData::U32($body),
            TensorData::U64($v) => TensorData::U64($body),
            TensorData::I8($v) => TensorData::I8($body),
            TensorData::I16($v) => TensorData::I16($body),
            TensorData::I32($v) => TensorData::I32($body),
            TensorData::I64($v) => TensorData::I64($body),
            TensorData::F16($v) => TensorData::F16($body),
            TensorData::Bf16($v) => TensorData::Bf16($body),
            TensorData::F32($v) => TensorData::F32($body),
            TensorData::F64($v) => TensorData::F64($body),
            TensorData::Bytes($s) => TensorData::Bytes($bytes),
        }
    };
}

impl TensorData {
    /// The element type of this data.
    pub fn dtype(&self) -> DataType {
        match self {
            TensorData::Bool(_) => DataType::Bool,
            TensorData::U8(_) => DataType::U8,
            TensorData::U16(_) => DataType::U16,
            TensorData::U32(_) => DataType::U32,
            TensorData::U64(_) => DataType::U64,
            TensorData::I8(_) => DataType::I8,
            TensorData::I16(_) => DataType::I16,
            TensorData::I32(_) => DataType::I32,
            TensorData::I64(_) => DataType::I64,
            TensorData::F16(_) => DataType::F16,
            TensorData::Bf16(_) => DataType::Bf16,
            TensorData::F32(_) => DataType::F32,
            TensorData::F64(_) => DataType::F64,
            TensorData::Bytes(_) => DataType::Bytes,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        with_tensor_data!(self, v => v.len())
    }

    /// True when there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes the elements hold in memory (a `BYTES` element: its length
    /// and the word that says where it ends).
    pub fn heap_bytes(&self) -> usize {
        match self {
            TensorData::Bytes(v) => v.heap_bytes(),
            other => other.len() * other.dtype().size_of().unwrap_or(1),
        }
    }

    /// An empty vector of the given type, with room for `cap` elements.
    pub fn with_capacity(dtype: DataType, cap: usize) -> TensorData {
        match dtype {
            DataType::Bool => TensorData::Bool(Vec::with_capacity(cap)),
            DataType::U8 => TensorData::U8(Vec::with_capacity(cap)),
            DataType::U16 => TensorData::U16(Vec::with_capacity(cap)),
            DataType::U32 => TensorData::U32(Vec::with_capacity(cap)),
            DataType::U64 => TensorData::U64(Vec::with_capacity(cap)),
            DataType::I8 => TensorData::I8(Vec::with_capacity(cap)),
            DataType::I16 => TensorData::I16(Vec::with_capacity(cap)),
            DataType::I32 => TensorData::I32(Vec::with_capacity(cap)),
            DataType::I64 => TensorData::I64(Vec::with_capacity(cap)),
            DataType::F16 => TensorData::F16(Vec::with_capacity(cap)),
            DataType::Bf16 => TensorData::Bf16(Vec::with_capacity(cap)),
            DataType::F32 => TensorData::F32(Vec::with_capacity(cap)),
            DataType::F64 => TensorData::F64(Vec::with_capacity(cap)),
            DataType::Bytes => TensorData::Bytes(Strings::with_capacity(cap)),
        }
    }

    /// `n` zeros of the given type (empty strings for BYTES).
    pub fn zeros(dtype: DataType, n: usize) -> TensorData {
        match dtype {
            DataType::Bool => TensorData::Bool(vec![false; n]),
            DataType::U8 => TensorData::U8(vec![0; n]),
            DataType::U16 => TensorData::U16(vec![0; n]),
            DataType::U32 => TensorData::U32(vec![0; n]),
            DataType::U64 => TensorData::U64(vec![0; n]),
            DataType::I8 => TensorData::I8(vec![0; n]),
            DataType::I16 => TensorData::I16(vec![0; n]),
            DataType::I32 => TensorData::I32(vec![0; n]),
            DataType::I64 => TensorData::I64(vec![0; n]),
            DataType::F16 => TensorData::F16(vec![half::f16::ZERO; n]),
            DataType::Bf16 => TensorData::Bf16(vec![half::bf16::ZERO; n]),
            DataType::F32 => TensorData::F32(vec![0.0; n]),
            DataType::F64 => TensorData::F64(vec![0.0; n]),
            DataType::Bytes => TensorData::Bytes(Strings::empties(n)),
        }
    }

    /// Appends `other`'s elements. Panics if the types differ: callers check
    /// datatypes against the model signature before they concatenate.
    pub fn extend_from(&mut self, other: &TensorData) {
        macro_rules! ext {
            ($($var:ident),*) => {
                match (self, other) {
                    $((TensorData::$var(a), TensorData::$var(b)) => a.extend_from_slice(b),)*
                    (a, b) => panic!("concatenating {} with {}. This is a bug.", a.dtype(), b.dtype()),
                }
            };
        }
        ext!(Bool, U8, U16, U32, U64, I8, I16, I32, I64, F16, Bf16, F32, F64, Bytes)
    }

    /// A copy of the elements in `range`.
    pub fn slice(&self, range: std::ops::Range<usize>) -> TensorData {
        map_tensor_data!(self, v => v[range].to_vec(), s => s.slice(range))
    }
}

/// A named tensor: what a request carries per input and a response per output.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    pub name: String,
    pub shape: Vec<usize>,
    pub data: TensorData,
}

impl Tensor {
    /// Builds a tensor, checking that the element count matches the shape.
    pub fn new(name: impl Into<String>, shape: Vec<usize>, data: TensorData) -> Result<Tensor, String> {
        let name = name.into();
        let expected: usize = shape.iter().product();
        if expected != data.len() {
            return Err(format!(
                "tensor `{name}`: shape {shape:?} needs {expected} elements, got {}",
                data.len()
            ));
        }
        Ok(Tensor { name, shape, data })
    }

    pub fn dtype(&self) -> DataType {
        self.data.dtype()
    }

    /// Rows of dim 0 (1 for a scalar).
    pub fn rows(&self) -> usize {
        self.shape.first().copied().unwrap_or(1)
    }

    /// Elements per row of dim 0.
    pub fn row_len(&self) -> usize {
        self.shape.iter().skip(1).product()
    }

    /// Rows `range` of dim 0, as a new tensor.
    pub fn slice_rows(&self, range: std::ops::Range<usize>) -> Tensor {
        let row = self.row_len();
        let mut shape = self.shape.clone();
        if let Some(d0) = shape.first_mut() {
            *d0 = range.len();
        }
        Tensor {
            name: self.name.clone(),
            shape,
            data: self.data.slice(range.start * row..range.end * row),
        }
    }

    /// Concatenates tensors along dim 0. All parts must share name, dtype and
    /// trailing dims (the batcher groups requests so that they do).
    pub fn concat_rows(parts: &[&Tensor]) -> Tensor {
        let first = parts.first().expect("concat of zero tensors. This is a bug.");
        let rows: usize = parts.iter().map(|t| t.rows()).sum();
        let mut data = TensorData::with_capacity(first.dtype(), rows * first.row_len());
        for p in parts {
            data.extend_from(&p.data);
        }
        let mut shape = first.shape.clone();
        shape[0] = rows;
        Tensor {
            name: first.name.clone(),
            shape,
            data,
        }
    }
}

/// One input or output of a model, as its ONNX file declares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSpec {
    pub name: String,
    pub dtype: DataType,
    /// Dimensions; `-1` where the ONNX file leaves a dimension dynamic.
    pub shape: Vec<i64>,
    /// The ONNX file's name of each dimension (`dim_param`, e.g. `"sequence"`),
    /// `""` where it names none; may be shorter than `shape` (then the rest
    /// are unnamed). Padding (`model-settings.json` `padding`) goes by these names.
    pub dim_names: Vec<String>,
}

impl TensorSpec {
    /// The symbolic name of dimension `i`, if the ONNX file gives one.
    pub fn dim_name(&self, i: usize) -> Option<&str> {
        self.dim_names
            .get(i)
            .map(String::as_str)
            .filter(|n| !n.is_empty())
    }
}

/// A model's inputs and outputs.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Signature {
    pub inputs: Vec<TensorSpec>,
    pub outputs: Vec<TensorSpec>,
}

impl Signature {
    /// True when every input and output has a dynamic first dimension, so
    /// requests can be concatenated along dim 0.
    pub fn batchable(&self) -> bool {
        self.inputs
            .iter()
            .chain(&self.outputs)
            .all(|t| t.shape.first() == Some(&-1))
    }

    pub fn input(&self, name: &str) -> Option<&TensorSpec> {
        self.inputs.iter().find(|t| t.name == name)
    }

    pub fn output(&self, name: &str) -> Option<&TensorSpec> {
        self.outputs.iter().find(|t| t.name == name)
    }
}

// After the macros above, which they use.
mod axis;
mod pad;
pub mod reshape;
mod strings;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn datatype_names_round_trip() {
        for d in DataType::ALL {
            assert_eq!(DataType::parse(d.as_str()), Some(d));
        }
        assert_eq!(DataType::parse("fp32"), None);
        assert_eq!(DataType::parse("FLOAT"), None);
    }

    #[test]
    fn concat_then_slice_gives_back_each_part() {
        let a = Tensor::new("x", vec![2, 3], TensorData::F32(vec![1., 2., 3., 4., 5., 6.])).unwrap();
        let b = Tensor::new("x", vec![1, 3], TensorData::F32(vec![7., 8., 9.])).unwrap();
        let c = Tensor::concat_rows(&[&a, &b]);
        assert_eq!(c.shape, vec![3, 3]);
        assert_eq!(c.slice_rows(0..2), a);
        assert_eq!(c.slice_rows(2..3), b);
    }

    #[test]
    fn bytes_tensors_concat_slice_pad_and_crop_element_by_element() {
        let s = |shape: Vec<usize>, v: &[&str]| {
            Tensor::new(
                "s",
                shape,
                TensorData::Bytes(v.iter().map(|e| e.as_bytes()).collect()),
            )
            .unwrap()
        };
        let a = s(vec![1, 2], &["ab", ""]);
        let b = s(vec![2, 1], &["c", "def"]);
        let c = Tensor::concat_rows(&[&a, &s(vec![1, 2], &["", "g"])]);
        assert_eq!(c, s(vec![2, 2], &["ab", "", "", "g"]));
        assert_eq!(c.slice_rows(1..2), s(vec![1, 2], &["", "g"]));
        let pad = TensorData::Bytes(["-"].into_iter().collect());
        let padded = Tensor::concat_padded(&[&a, &b], &[2], &pad);
        assert_eq!(padded, s(vec![3, 2], &["ab", "", "c", "-", "def", "-"]));
        assert_eq!(padded.crop(1..3, &[1]), b);
        let axis1 = Tensor::concat_axis(&[&a, &s(vec![1, 1], &["z"])], 1);
        assert_eq!(axis1, s(vec![1, 3], &["ab", "", "z"]));
        assert_eq!(axis1.slice_axis(1, 2..3), s(vec![1, 1], &["z"]));
    }

    #[test]
    fn new_checks_element_count() {
        let err = Tensor::new("x", vec![2, 2], TensorData::I64(vec![1, 2, 3])).unwrap_err();
        assert!(
            err.contains("`x`") && err.contains("4 elements") && err.contains("got 3"),
            "{err}"
        );
    }
}
