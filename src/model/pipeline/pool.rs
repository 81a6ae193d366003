//! The built-in pooling step: token vectors `[texts, tokens, dim]` and their
//! attention mask `[texts, tokens]` become one vector per text, as
//! sentence-transformers' `Pooling` and `Normalize` modules compute it.

use crate::error::{Error, Result};
use crate::settings::pipeline::{PoolingMode, PoolingStep};
use crate::tensor::{DataType, Tensor, TensorData, TensorSpec};

/// The step's tensors; `dim` is the token vectors' size when known (-1 if not).
pub fn specs(dim: i64) -> (Vec<TensorSpec>, Vec<TensorSpec>) {
    let spec = |name: &str, dtype, shape: Vec<i64>| TensorSpec {
        name: name.into(),
        dtype,
        shape,
        dim_names: Vec::new(),
    };
    (
        vec![
            spec("token_embeddings", DataType::F32, vec![-1, -1, dim]),
            spec("attention_mask", DataType::I64, vec![-1, -1]),
        ],
        vec![spec("embedding", DataType::F32, vec![-1, dim])],
    )
}

/// Pools `hidden` over the tokens `mask` keeps. A mask shorter than the
/// token axis (the encoder's batch padded its answer) keeps none beyond it.
pub fn run(step: PoolingStep, hidden: &Tensor, mask: &Tensor) -> Result<Tensor> {
    let (TensorData::F32(h), [n, len, dim]) = (&hidden.data, hidden.shape.as_slice()) else {
        return Err(Error::invalid(format!(
            "pooling takes FP32 token vectors [texts, tokens, dim]; `{}` is {} {:?}",
            hidden.name,
            hidden.dtype().as_str(),
            hidden.shape
        )));
    };
    let (n, len, dim) = (*n, *len, *dim);
    let mask_at = mask_reader(mask, n)?;
    let mask_len = mask.shape.get(1).copied().unwrap_or(0);
    let mut out = vec![0f32; n * dim];
    for row in 0..n {
        let v = &mut out[row * dim..(row + 1) * dim];
        let token = |j: usize| &h[(row * len + j) * dim..(row * len + j + 1) * dim];
        let kept = (0..len.min(mask_len)).filter(|&j| mask_at(row * mask_len + j));
        match step.mode {
            PoolingMode::Cls => {
                if len > 0 {
                    v.copy_from_slice(token(0));
                }
            }
            PoolingMode::Max => {
                v.fill(f32::MIN);
                let mut any = false;
                for j in kept {
                    any = true;
                    for (x, t) in v.iter_mut().zip(token(j)) {
                        *x = x.max(*t);
                    }
                }
                if !any {
                    v.fill(0.0);
                }
            }
            PoolingMode::Mean | PoolingMode::MeanSqrtLen => {
                let mut count = 0usize;
                for j in kept {
                    count += 1;
                    for (x, t) in v.iter_mut().zip(token(j)) {
                        *x += *t;
                    }
                }
                // sentence-transformers clamps the count at 1e-9.
                let count = (count as f32).max(1e-9);
                let div = match step.mode {
                    PoolingMode::Mean => count,
                    _ => count.sqrt(),
                };
                v.iter_mut().for_each(|x| *x /= div);
            }
        }
        if step.normalize {
            normalize(v);
        }
    }
    Ok(Tensor {
        name: "embedding".into(),
        shape: vec![n, dim],
        data: TensorData::F32(out),
    })
}

/// Scales `v` to length 1 (torch's `normalize`: the norm is at least 1e-12).
pub fn normalize(v: &mut [f32]) {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-12);
    v.iter_mut().for_each(|x| *x /= norm);
}

/// Reads element `i` of an integer or boolean attention mask of `n` rows.
fn mask_reader(mask: &Tensor, n: usize) -> Result<Box<dyn Fn(usize) -> bool + Send + Sync + '_>> {
    if mask.shape.len() != 2 || mask.shape[0] != n {
        return Err(Error::invalid(format!(
            "pooling: the attention mask `{}` must be [{n}, tokens], got {:?}",
            mask.name, mask.shape
        )));
    }
    Ok(match &mask.data {
        TensorData::I64(m) => Box::new(move |i| m[i] != 0),
        TensorData::I32(m) => Box::new(move |i| m[i] != 0),
        TensorData::Bool(m) => Box::new(move |i| m[i]),
        TensorData::F32(m) => Box::new(move |i| m[i] != 0.0),
        other => {
            return Err(Error::invalid(format!(
                "pooling: the attention mask `{}` must be INT64, INT32, BOOL or FP32, got {}",
                mask.name,
                other.dtype().as_str()
            )))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(name: &str, shape: Vec<usize>, data: TensorData) -> Tensor {
        Tensor::new(name, shape, data).unwrap()
    }

    #[test]
    fn mean_counts_only_kept_tokens() {
        // Two texts, three tokens, dim 2; the second text keeps one token.
        let h = t(
            "h",
            vec![2, 3, 2],
            TensorData::F32(vec![1., 2., 3., 4., 100., 100., 5., 6., 9., 9., 9., 9.]),
        );
        let m = t("m", vec![2, 3], TensorData::I64(vec![1, 1, 0, 1, 0, 0]));
        let step = PoolingStep {
            mode: PoolingMode::Mean,
            normalize: false,
        };
        let out = run(step, &h, &m).unwrap();
        assert_eq!(out.shape, vec![2, 2]);
        assert_eq!(out.data, TensorData::F32(vec![2., 3., 5., 6.]));
    }

    #[test]
    fn cls_max_sqrt_and_normalize() {
        let h = t("h", vec![1, 2, 2], TensorData::F32(vec![3., -1., 1., 4.]));
        let m = t("m", vec![1, 2], TensorData::I64(vec![1, 1]));
        let run_as = |mode, normalize| run(PoolingStep { mode, normalize }, &h, &m).unwrap().data;
        assert_eq!(run_as(PoolingMode::Cls, false), TensorData::F32(vec![3., -1.]));
        assert_eq!(run_as(PoolingMode::Max, false), TensorData::F32(vec![3., 4.]));
        let s = 2f32.sqrt();
        assert_eq!(
            run_as(PoolingMode::MeanSqrtLen, false),
            TensorData::F32(vec![4. / s, 3. / s])
        );
        // (3, -1) / sqrt(10)
        let TensorData::F32(v) = run_as(PoolingMode::Cls, true) else {
            panic!()
        };
        assert!((v[0] - 3. / 10f32.sqrt()).abs() < 1e-6 && (v[1] + 1. / 10f32.sqrt()).abs() < 1e-6);
    }

    #[test]
    fn a_shorter_mask_keeps_no_token_past_it() {
        let h = t("h", vec![1, 3, 1], TensorData::F32(vec![2., 4., 100.]));
        let m = t("m", vec![1, 2], TensorData::I64(vec![1, 1]));
        let out = run(
            PoolingStep {
                mode: PoolingMode::Mean,
                normalize: false,
            },
            &h,
            &m,
        )
        .unwrap();
        assert_eq!(out.data, TensorData::F32(vec![3.]));
    }

    #[test]
    fn wrong_shapes_are_named() {
        let h = t("hidden", vec![1, 2], TensorData::F32(vec![1., 2.]));
        let m = t("m", vec![1, 2], TensorData::I64(vec![1, 1]));
        let e = run(
            PoolingStep {
                mode: PoolingMode::Mean,
                normalize: false,
            },
            &h,
            &m,
        )
        .unwrap_err();
        assert!(e.to_string().contains("`hidden` is FP32 [1, 2]"), "{e}");
    }
}
