//! Warm-up batches (SPEC §3 `warmup`): each power-of-two batch size up to
//! `max_batch_size` (and `max_batch_size` itself), zero-filled, so that
//! ONNX Runtime has planned memory for the sizes it will see before the
//! model turns ready.

use crate::tensor::{DataType, Signature, Tensor, TensorData};

/// The warm-up batches for `sig` with batches of up to `max_batch_size` rows
/// (batching off: one batch of one row, or of the fixed dim 0).
pub fn batches(sig: &Signature, max_batch_size: usize) -> Vec<Vec<Tensor>> {
    let mut sizes = Vec::new();
    if sig.batchable() {
        let max = max_batch_size.max(1);
        let mut n = 1;
        while n <= max {
            sizes.push(n);
            n *= 2;
        }
        if sizes.last() != Some(&max) {
            sizes.push(max);
        }
    } else {
        sizes.push(1);
    }
    sizes.into_iter().map(|rows| batch(sig, rows)).collect()
}

/// One zero-filled batch of `rows` rows (fixed dims kept, other dynamic dims 1).
fn batch(sig: &Signature, rows: usize) -> Vec<Tensor> {
    sig.inputs
        .iter()
        .map(|spec| {
            let shape: Vec<usize> = spec
                .shape
                .iter()
                .enumerate()
                .map(|(i, &d)| match (i, d) {
                    (0, -1) => rows,
                    (_, d) if d >= 0 => d as usize,
                    _ => 1,
                })
                .collect();
            let n: usize = shape.iter().product();
            Tensor {
                name: spec.name.clone(),
                shape,
                data: zeros(spec.dtype, n),
            }
        })
        .collect()
}

fn zeros(dtype: DataType, n: usize) -> TensorData {
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
        DataType::Bytes => TensorData::Bytes(vec![Vec::new(); n]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::TensorSpec;

    #[test]
    fn powers_of_two_up_to_max() {
        let sig = Signature {
            inputs: vec![TensorSpec {
                name: "x".into(),
                dtype: DataType::F32,
                shape: vec![-1, 3, -1],
            }],
            outputs: vec![TensorSpec {
                name: "y".into(),
                dtype: DataType::F32,
                shape: vec![-1],
            }],
        };
        let b = batches(&sig, 12);
        let rows: Vec<usize> = b.iter().map(|t| t[0].shape[0]).collect();
        assert_eq!(rows, vec![1, 2, 4, 8, 12]);
        assert_eq!(b[2][0].shape, vec![4, 3, 1]);
        assert_eq!(b[2][0].data.len(), 12);
    }

    #[test]
    fn fixed_batch_dim_gets_one_batch_of_that_size() {
        let sig = Signature {
            inputs: vec![TensorSpec {
                name: "x".into(),
                dtype: DataType::I64,
                shape: vec![3, 2],
            }],
            outputs: vec![],
        };
        let b = batches(&sig, 32);
        assert_eq!(b.len(), 1);
        assert_eq!(b[0][0].shape, vec![3, 2]);
    }
}
