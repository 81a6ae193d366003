//! Tensors to ONNX Runtime values and back: inputs as views of their
//! buffers where the element type allows (strings are converted), outputs
//! copied out of the session's values.

use ort::session::SessionInputValue;
use ort::value::{DynValue, Tensor as OrtTensor, TensorElementType, TensorRef, ValueType};

use super::RuntimeError;
use crate::tensor::{Tensor, TensorData};

/// `t` as an ONNX Runtime input: a view of its buffer (no copy) for every
/// primitive type; strings are converted (ONNX Runtime keeps its own).
pub(super) fn to_value(t: &Tensor) -> Result<SessionInputValue<'_>, RuntimeError> {
    let shape = t.shape.as_slice();
    macro_rules! view {
        ($v:expr) => {
            TensorRef::from_array_view((shape, $v.as_slice())).map(SessionInputValue::from)
        };
    }
    let made = match &t.data {
        TensorData::Bool(v) => view!(v),
        TensorData::U8(v) => view!(v),
        TensorData::U16(v) => view!(v),
        TensorData::U32(v) => view!(v),
        TensorData::U64(v) => view!(v),
        TensorData::I8(v) => view!(v),
        TensorData::I16(v) => view!(v),
        TensorData::I32(v) => view!(v),
        TensorData::I64(v) => view!(v),
        TensorData::F16(v) => view!(v),
        TensorData::Bf16(v) => view!(v),
        TensorData::F32(v) => view!(v),
        TensorData::F64(v) => view!(v),
        TensorData::Bytes(v) => {
            let strings = v
                .iter()
                .enumerate()
                .map(|(i, b)| {
                    std::str::from_utf8(b).map(str::to_owned).map_err(|_| {
                        RuntimeError::InvalidInput(format!(
                            "input `{}`: element {i} is not valid UTF-8 (ONNX strings must be UTF-8)",
                            t.name
                        ))
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            match strings.iter().any(|s| s.contains('\0')) {
                false => {
                    OrtTensor::from_string_array((shape.to_vec(), &strings[..])).map(SessionInputValue::from)
                }
                true => strings_with_nul(shape, &strings).map(SessionInputValue::from),
            }
        }
    };
    made.map_err(RuntimeError::Run)
}

/// A string tensor some of whose elements hold a NUL byte: ort's
/// `from_string_array` passes C strings, which end at the first NUL, so each
/// element is written by its length (`GetResizedStringTensorElementBuffer`).
fn strings_with_nul(shape: &[usize], strings: &[String]) -> Result<ort::value::DynTensor, ort::Error> {
    use ort::AsPointer as _;
    let allocator = ort::memory::Allocator::default();
    let mut tensor = ort::value::DynTensor::new(&allocator, TensorElementType::String, shape.to_vec())?;
    for (i, s) in strings.iter().enumerate() {
        let mut buffer: *mut std::ffi::c_char = std::ptr::null_mut();
        // SAFETY: the tensor is a string tensor of `strings.len()` elements
        // (its shape's product); ONNX Runtime sizes element `i` to `s.len()`
        // bytes and returns its buffer, which is written once, in bounds.
        unsafe {
            let status =
                (ort::api().GetResizedStringTensorElementBuffer)(tensor.ptr_mut(), i, s.len(), &mut buffer);
            ort::Error::result_from_status(status)?;
            std::ptr::copy_nonoverlapping(s.as_ptr(), buffer.cast::<u8>(), s.len());
        }
    }
    Ok(tensor)
}

pub(super) fn from_value(name: &str, v: &DynValue) -> Result<Tensor, RuntimeError> {
    let ty = match v.dtype() {
        ValueType::Tensor { ty, .. } => *ty,
        other => {
            return Err(RuntimeError::Unsupported(format!(
                "output `{name}` is a {other:?}, not a tensor"
            )))
        }
    };
    macro_rules! prim {
        ($t:ty, $var:ident) => {{
            let (shape, data) = v.try_extract_tensor::<$t>().map_err(RuntimeError::Run)?;
            (
                shape.iter().map(|&d| d as usize).collect::<Vec<_>>(),
                TensorData::$var(data.to_vec()),
            )
        }};
    }
    let (shape, data) = match ty {
        TensorElementType::Bool => prim!(bool, Bool),
        TensorElementType::Uint8 => prim!(u8, U8),
        TensorElementType::Uint16 => prim!(u16, U16),
        TensorElementType::Uint32 => prim!(u32, U32),
        TensorElementType::Uint64 => prim!(u64, U64),
        TensorElementType::Int8 => prim!(i8, I8),
        TensorElementType::Int16 => prim!(i16, I16),
        TensorElementType::Int32 => prim!(i32, I32),
        TensorElementType::Int64 => prim!(i64, I64),
        TensorElementType::Float16 => prim!(half::f16, F16),
        TensorElementType::Bfloat16 => prim!(half::bf16, Bf16),
        TensorElementType::Float32 => prim!(f32, F32),
        TensorElementType::Float64 => prim!(f64, F64),
        TensorElementType::String => {
            let (shape, strings) = v.try_extract_strings().map_err(RuntimeError::Run)?;
            (
                shape.iter().map(|&d| d as usize).collect(),
                TensorData::Bytes(strings.into_iter().map(String::into_bytes).collect()),
            )
        }
        other => {
            return Err(RuntimeError::Unsupported(format!(
                "output `{name}` has element type {other}"
            )))
        }
    };
    Ok(Tensor {
        name: name.to_string(),
        shape,
        data,
    })
}
