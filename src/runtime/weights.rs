//! One copy of a model's weights for all its instances. ONNX Runtime gives
//! every session its own copy of the graph's initializers (Triton's ONNX
//! Runtime backend pays that per instance); a session built with
//! `AddInitializer` uses the caller's buffer instead, and then its
//! prepacked form can be shared through the prepacked-weights container too.
//! So for a model with several instances, the initializers are read from the
//! ONNX file once here, turned into ONNX Runtime values, and handed to every
//! session.

use std::path::Path;
use std::sync::Arc;

use ort::value::{DynValue, Tensor};
use prost::Message;

#[allow(clippy::all, missing_docs)]
pub(super) mod onnx {
    include!(concat!(env!("OUT_DIR"), "/onnx.rs"));
}

/// The initializers shared by a model's sessions.
pub struct SharedWeights {
    /// (initializer name, value); each session's builder holds a clone of the `Arc`.
    pub values: Vec<(String, Arc<DynValue>)>,
    /// Bytes held once instead of once per instance.
    pub bytes: usize,
}

/// Reads the initializers of the ONNX file at `path` that can be shared:
/// FLOAT, DOUBLE, FLOAT16, INT32 and INT64 tensors stored in the file.
/// Others (strings, external data) stay per session, as ONNX Runtime loads them.
pub fn load(path: &Path) -> Result<SharedWeights, String> {
    let bytes = bytes::Bytes::from(std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?);
    let model =
        onnx::ModelProto::decode(bytes).map_err(|e| format!("{}: not an ONNX model: {e}", path.display()))?;
    let mut shared = SharedWeights {
        values: Vec::new(),
        bytes: 0,
    };
    for t in model.graph.map(|g| g.initializer).unwrap_or_default() {
        if t.data_location != 0 {
            continue;
        }
        let Some(dims) = t
            .dims
            .iter()
            .map(|&d| usize::try_from(d).ok())
            .collect::<Option<Vec<usize>>>()
        else {
            continue;
        };
        let n: usize = dims.iter().product();
        let value = match t.data_type {
            1 => tensor(&dims, n, &t.raw_data, t.float_data.clone(), f32::from_le_bytes),
            11 => tensor(&dims, n, &t.raw_data, t.double_data.clone(), f64::from_le_bytes),
            6 => tensor(&dims, n, &t.raw_data, t.int32_data.clone(), i32::from_le_bytes),
            7 => tensor(&dims, n, &t.raw_data, t.int64_data.clone(), i64::from_le_bytes),
            // FLOAT16 outside raw_data is stored one value per int32 (its bits).
            10 => {
                let typed = t
                    .int32_data
                    .iter()
                    .map(|&b| half::f16::from_bits(b as u16))
                    .collect();
                tensor(&dims, n, &t.raw_data, typed, |b: [u8; 2]| {
                    half::f16::from_le_bytes(b)
                })
            }
            _ => None,
        };
        if let Some((value, size)) = value {
            shared.bytes += size;
            shared.values.push((t.name, Arc::new(value)));
        }
    }
    Ok(shared)
}

/// A tensor from `raw` (little-endian) or, when `raw` is empty, `typed`;
/// None when the element count does not match the dims.
fn tensor<T, const N: usize>(
    dims: &[usize],
    n: usize,
    raw: &[u8],
    typed: Vec<T>,
    from_le: fn([u8; N]) -> T,
) -> Option<(DynValue, usize)>
where
    T: ort::value::PrimitiveTensorElementType + Clone + std::fmt::Debug + 'static,
{
    let data: Vec<T> = if raw.is_empty() {
        typed
    } else {
        raw.chunks_exact(N)
            .map(|c| from_le(c.try_into().expect("chunks of N bytes")))
            .collect()
    };
    if data.len() != n {
        return None;
    }
    let size = n * N;
    Some((Tensor::from_array((dims.to_vec(), data)).ok()?.into_dyn(), size))
}

/// Bytes of the initializers (the weights) stored in the ONNX file at
/// `path`: each tensor's element count times its element size (strings and
/// tensors stored in external files are not counted).
pub fn size(path: &Path) -> Result<u64, String> {
    let bytes = bytes::Bytes::from(std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?);
    let model =
        onnx::ModelProto::decode(bytes).map_err(|e| format!("{}: not an ONNX model: {e}", path.display()))?;
    let total = model
        .graph
        .map(|g| g.initializer)
        .unwrap_or_default()
        .iter()
        .filter(|t| t.data_location == 0)
        .map(|t| {
            // TensorProto.DataType -> bytes per element (0: not counted).
            let element: u64 = match t.data_type {
                2 | 3 | 9 => 1,
                4 | 5 | 10 | 16 => 2,
                1 | 6 | 12 => 4,
                7 | 11 | 13 => 8,
                _ => 0,
            };
            let n = t
                .dims
                .iter()
                .map(|&d| u64::try_from(d).unwrap_or(0))
                .product::<u64>();
            n * element
        })
        .sum();
    Ok(total)
}
