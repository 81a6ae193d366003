//! Warm-up batches (SPEC §3 `warmup`): each power-of-two batch size up to
//! `max_batch_size` (and `max_batch_size` itself), zero-filled, so that
//! ONNX Runtime has planned memory for the sizes it will see before the
//! model turns ready.
//!
//! A padded model (`padding`) sees many lengths, not only many batch sizes,
//! so it is also warmed at one row of each power-of-two length of its padded
//! dims up to the longest a batch may have (`max_batch_tokens`), at most
//! [`LONGEST`]. A model may refuse lengths past its own limit (a
//! transformer's position embeddings): warm-up stops at the first refused
//! length, and the model still loads. (On CPU, a batch at a new shape costs
//! at most about 1.3× its steady-state time, so warming every rows × length
//! pair, seconds of work for a transformer, buys little: `benches/README.md`.)

use crate::batcher::Padding;
use crate::pool::Warmup;
use crate::tensor::{DataType, Signature, Tensor, TensorData};

/// The longest padded length warmed (BERT's limit): longer lengths are rare,
/// slow to warm, and past many models' limit.
pub const LONGEST: usize = 512;

/// The warm-up batches of a model: [`batches`], then for a padded model [`padded`].
pub fn plan(
    sig: &Signature,
    max_batch_size: usize,
    padding: Option<&Padding>,
    max_batch_tokens: Option<usize>,
) -> Vec<Warmup> {
    let required = batches(sig, max_batch_size).into_iter().map(|inputs| Warmup {
        inputs,
        optional: false,
    });
    let lengths = padding.map(|p| padded(sig, p, max_batch_tokens));
    required.chain(lengths.into_iter().flatten()).collect()
}

/// A padded model's batches: one row at each power-of-two length from 2 up
/// to the longest a batch may have (`max_batch_tokens`), at most [`LONGEST`].
/// Optional: the model may refuse the longer ones.
pub fn padded(sig: &Signature, padding: &Padding, max_batch_tokens: Option<usize>) -> Vec<Warmup> {
    let longest = max_batch_tokens.unwrap_or(LONGEST).min(LONGEST);
    let mut out = Vec::new();
    let mut len = 2;
    while len <= longest {
        out.push(Warmup {
            inputs: batch_with(sig, 1, |input, dim| padding.is_padded(input, dim).then_some(len)),
            optional: true,
        });
        len *= 2;
    }
    out
}

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
    batch_with(sig, rows, |_, _| None)
}

/// One zero-filled batch of `rows` rows: fixed dims kept, a dynamic dim
/// `size(input, dim)` when that gives one, else 1.
fn batch_with(sig: &Signature, rows: usize, size: impl Fn(usize, usize) -> Option<usize>) -> Vec<Tensor> {
    sig.inputs
        .iter()
        .enumerate()
        .map(|(input, spec)| {
            let shape: Vec<usize> = spec
                .shape
                .iter()
                .enumerate()
                .map(|(i, &d)| match (i, d) {
                    (0, -1) => rows,
                    (_, d) if d >= 0 => d as usize,
                    _ => size(input, i).unwrap_or(1),
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
                dim_names: vec![],
            }],
            outputs: vec![TensorSpec {
                name: "y".into(),
                dtype: DataType::F32,
                shape: vec![-1],
                dim_names: vec![],
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
                dim_names: vec![],
            }],
            outputs: vec![],
        };
        let b = batches(&sig, 32);
        assert_eq!(b.len(), 1);
        assert_eq!(b[0][0].shape, vec![3, 2]);
    }

    #[test]
    fn a_padded_model_is_also_warmed_at_power_of_two_lengths() {
        let i = |n: &str| TensorSpec {
            name: n.into(),
            dtype: DataType::I64,
            shape: vec![-1, -1],
            dim_names: vec!["batch".into(), "sequence".into()],
        };
        let sig = Signature {
            inputs: vec![i("ids"), i("mask")],
            outputs: vec![],
        };
        let values = serde_json::from_str(r#"{"ids": 0, "mask": 0}"#).unwrap();
        let padding = Padding::new(&sig, &values).unwrap().unwrap();
        let warm = plan(&sig, 4, Some(&padding), Some(100));
        let shapes: Vec<(Vec<usize>, bool)> = warm
            .iter()
            .map(|w| (w.inputs[1].shape.clone(), w.optional))
            .collect();
        let required = [1, 2, 4].map(|r| (vec![r, 1], false));
        let lengths = [2, 4, 8, 16, 32, 64].map(|l| (vec![1, l], true));
        assert_eq!(shapes, [&required[..], &lengths[..]].concat());
        // Without max_batch_tokens: up to LONGEST.
        let longest = plan_lengths(&plan(&sig, 4, Some(&padding), None));
        assert_eq!(longest, LONGEST);
    }

    fn plan_lengths(plan: &[Warmup]) -> usize {
        plan.iter().map(|w| w.inputs[0].shape[1]).max().unwrap()
    }
}
