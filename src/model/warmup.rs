//! Warm-up (SPEC §3 `warmup`): each power-of-two batch size up to
//! `max_batch_size` (and `max_batch_size` itself), so that ONNX Runtime has
//! planned memory for the sizes it will see before the model turns ready.
//!
//! The batches are zero-filled, or made of the sample requests in the
//! model folder's `warmup/` (V2 JSON bodies, the format clients send), or
//! of a `config.pbtxt`'s `model_warmup` samples (`triton.rs`): a sample's
//! rows are repeated to fill each batch size. A model that rejects a warm-up batch (a reflect
//! pad needs more than one sample; `Expand` wants a shape, not a zero) is
//! not taken down: the rejection is a warning, in the log and the index,
//! and the model serves cold.
//!
//! Before it, [`probe`] runs a batch of 1 row and one of 2 on one session:
//! the second kind of evidence of whether the model batches (`batcher::layout`).
//!
//! A padded model (`padding`) sees many lengths, not only many batch sizes,
//! so it is also warmed at one row of each power-of-two length of its padded
//! dims up to the longest a batch may have (`max_batch_tokens`), at most
//! [`LONGEST`]. A model may refuse lengths past its own limit (a
//! transformer's position embeddings): warm-up stops at the first refused
//! length, and the model still loads. (Warming every rows × length pair,
//! seconds of work for a transformer, buys little: `benches/README.md`.)

pub mod triton;

use std::path::Path;

use crate::batcher::{Layout, Padding};
use crate::pool::Warmup;
use crate::protocol;
use crate::runtime::Session;
use crate::tensor::{Signature, Tensor, TensorData};

/// The longest padded length warmed (BERT's limit): longer lengths are rare,
/// slow to warm, and past many models' limit.
pub const LONGEST: usize = 512;

/// The folder of sample requests beside a model's file.
pub const SAMPLES_DIR: &str = "warmup";

/// How a model is warmed: its batch axes while it batches (`None`: each
/// request runs alone), and its sample requests (empty: zero-filled).
#[derive(Debug, Clone, Copy)]
pub struct Shape<'a> {
    pub sig: &'a Signature,
    pub layout: Option<&'a Layout>,
    pub samples: &'a [Vec<Tensor>],
}

/// The warm-up batches of a model: [`batches`], then for a padded model [`padded`].
pub fn plan(
    shape: Shape<'_>,
    max_batch_size: usize,
    padding: Option<&Padding>,
    max_batch_tokens: Option<usize>,
) -> Vec<Warmup> {
    let required = batches(shape, max_batch_size).into_iter().map(|inputs| Warmup {
        inputs,
        optional: false,
    });
    let lengths = padding.map(|p| padded(shape.sig, p, max_batch_tokens));
    required.chain(lengths.into_iter().flatten()).collect()
}

/// A padded model's batches: one row at each power-of-two length from 2 up
/// to the longest a batch may have (`max_batch_tokens`), at most [`LONGEST`].
/// Optional: the model may refuse the longer ones.
pub fn padded(sig: &Signature, padding: &Padding, max_batch_tokens: Option<usize>) -> Vec<Warmup> {
    let longest = max_batch_tokens.unwrap_or(LONGEST).min(LONGEST);
    let plain = Layout::plain(sig.inputs.len(), sig.outputs.len());
    let mut out = Vec::new();
    let mut len = 2;
    while len <= longest {
        out.push(Warmup {
            inputs: zeros_with(sig, Some(&plain), 1, |input, dim| {
                padding.is_padded(input, dim).then_some(len)
            }),
            optional: true,
        });
        len *= 2;
    }
    out
}

/// The warm-up batches with batches of up to `max_batch_size` rows (a model
/// that does not batch: one batch, a sample as it is or one zero-filled row).
pub fn batches(shape: Shape<'_>, max_batch_size: usize) -> Vec<Vec<Tensor>> {
    let mut sizes = Vec::new();
    if shape.layout.is_some() {
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
    sizes
        .into_iter()
        .flat_map(|rows| each_sample(shape, rows))
        .collect()
}

/// A batch of `rows` rows from each sample (or one zero-filled batch).
fn each_sample(shape: Shape<'_>, rows: usize) -> Vec<Vec<Tensor>> {
    if shape.samples.is_empty() {
        return vec![zeros_with(shape.sig, shape.layout, rows, |_, _| None)];
    }
    shape
        .samples
        .iter()
        .map(|s| match shape.layout {
            Some(l) => fill(s, l, rows),
            None => s.clone(),
        })
        .collect()
}

/// A sample's rows repeated along each batch axis to make `rows` rows (a
/// sample without rows is taken as it is).
fn fill(sample: &[Tensor], layout: &Layout, rows: usize) -> Vec<Tensor> {
    sample
        .iter()
        .zip(&layout.inputs)
        .map(|(t, axis)| match axis {
            Some(a) if t.len_at(*a) > 0 && t.len_at(*a) != rows => {
                let copies = rows.div_ceil(t.len_at(*a));
                let parts: Vec<&Tensor> = std::iter::repeat_n(t, copies).collect();
                Tensor::concat_axis(&parts, *a).slice_axis(*a, 0..rows)
            }
            _ => t.clone(),
        })
        .collect()
}

/// One zero-filled batch of `rows` rows on each batch axis (every axis 0
/// without a layout is a dim like any other): fixed dims kept, another
/// dynamic dim `size(input, dim)` when that gives one, else 1.
fn zeros_with(
    sig: &Signature,
    layout: Option<&Layout>,
    rows: usize,
    size: impl Fn(usize, usize) -> Option<usize>,
) -> Vec<Tensor> {
    sig.inputs
        .iter()
        .enumerate()
        .map(|(input, spec)| {
            let axis = layout.and_then(|l| l.inputs[input]);
            let shape: Vec<usize> = spec
                .shape
                .iter()
                .enumerate()
                .map(|(i, &d)| match d {
                    d if d >= 0 => d as usize,
                    _ if Some(i) == axis => rows,
                    _ => size(input, i).unwrap_or(1),
                })
                .collect();
            let n: usize = shape.iter().product();
            Tensor {
                name: spec.name.clone(),
                shape,
                data: TensorData::zeros(spec.dtype, n),
            }
        })
        .collect()
}

/// The sample requests in `dir/warmup/` (`*.json`, V2 inference request
/// bodies, in name order), each checked against the signature and its
/// inputs put in signature order. Empty when there is no such folder.
pub fn samples(dir: &Path, model: &str, sig: &Signature) -> Result<Vec<Vec<Tensor>>, String> {
    let folder = dir.join(SAMPLES_DIR);
    if !folder.is_dir() {
        return Ok(Vec::new());
    }
    let mut files: Vec<_> = std::fs::read_dir(&folder)
        .map_err(|e| format!("{SAMPLES_DIR}/: {e}"))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    let mut out = Vec::with_capacity(files.len());
    for f in files {
        let shown = format!(
            "{SAMPLES_DIR}/{}",
            f.file_name().unwrap_or_default().to_string_lossy()
        );
        let body = std::fs::read(&f).map_err(|e| format!("{shown}: {e}"))?;
        let mut req = protocol::v2_binary::decode_request(&body, None, &protocol::shm::NoRegions)
            .map_err(|e| format!("{shown} is not a V2 inference request body: {e}"))?
            .request;
        protocol::validate(&mut req, model, sig)
            .map_err(|e| format!("{shown} does not fit the model: {e}"))?;
        out.push(req.inputs);
    }
    Ok(out)
}

/// What warm-up showed, before the model serves.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Probe {
    /// Why the model does not batch, when a batch of 1 or 2 rows showed it.
    pub off: Option<String>,
    /// Why the model rejected its first warm-up batch (it then serves cold).
    pub rejected: Option<String>,
}

/// Runs a batch of 1 row, then one of 2, on `session`: whether the model
/// takes its warm-up input at all, and whether every output follows the
/// rows of a batch (`layout`: while the file says it batches).
pub fn probe(session: &mut dyn Session, shape: Shape<'_>, outputs: &[String]) -> Probe {
    let first = |rows| each_sample(shape, rows).swap_remove(0);
    let one = first(1);
    let ran = match session.run(&one, outputs) {
        Ok(o) => o,
        Err(e) => {
            return Probe {
                off: None,
                rejected: Some(format!("a batch of shape {:?} failed: {e}", shapes(&one))),
            }
        }
    };
    let Some(layout) = shape.layout else {
        return Probe::default();
    };
    if let Err(why) = layout.follows(&ran, 1) {
        return Probe {
            off: Some(format!("warm-up: {why}")),
            rejected: None,
        };
    }
    let two = first(2);
    let off = match session.run(&two, outputs) {
        Err(e) => Some(format!(
            "warm-up: a batch of 2 rows {:?} failed where one of 1 row ran: {e}",
            shapes(&two)
        )),
        Ok(ran) => layout.follows(&ran, 2).err().map(|why| format!("warm-up: {why}")),
    };
    Probe { off, rejected: None }
}

/// Each tensor's shape, for messages.
fn shapes(inputs: &[Tensor]) -> Vec<&[usize]> {
    inputs.iter().map(|t| &t.shape[..]).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::DataType;
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
        let plain = Layout::plain(1, 1);
        let b = batches(shape(&sig, Some(&plain), &[]), 12);
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
        let b = batches(shape(&sig, None, &[]), 32);
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
        let plain = Layout::plain(2, 0);
        let warm = plan(shape(&sig, Some(&plain), &[]), 4, Some(&padding), Some(100));
        let shapes: Vec<(Vec<usize>, bool)> = warm
            .iter()
            .map(|w| (w.inputs[1].shape.clone(), w.optional))
            .collect();
        let required = [1, 2, 4].map(|r| (vec![r, 1], false));
        let lengths = [2, 4, 8, 16, 32, 64].map(|l| (vec![1, l], true));
        assert_eq!(shapes, [&required[..], &lengths[..]].concat());
        // Without max_batch_tokens: up to LONGEST.
        let longest = plan_lengths(&plan(shape(&sig, Some(&plain), &[]), 4, Some(&padding), None));
        assert_eq!(longest, LONGEST);
    }

    #[test]
    fn a_sample_is_repeated_to_fill_each_batch_size_along_its_axis() {
        let spec = |name: &str, shape: &[i64]| TensorSpec {
            name: name.into(),
            dtype: DataType::I64,
            shape: shape.to_vec(),
            dim_names: vec![],
        };
        let sig = Signature {
            inputs: vec![spec("x", &[-1, 2]), spec("state", &[2, -1]), spec("sr", &[])],
            outputs: vec![],
        };
        let layout = Layout {
            inputs: vec![Some(0), Some(1), None],
            outputs: vec![],
        };
        let t = |name: &str, shape: Vec<usize>, v: Vec<i64>| {
            Tensor::new(name, shape, TensorData::I64(v)).unwrap()
        };
        let sample = vec![
            t("x", vec![1, 2], vec![1, 2]),
            t("state", vec![2, 1], vec![3, 4]),
            t("sr", vec![], vec![8000]),
        ];
        let b = batches(shape(&sig, Some(&layout), std::slice::from_ref(&sample)), 3);
        let sizes: Vec<(Vec<usize>, Vec<usize>)> = b
            .iter()
            .map(|i| (i[0].shape.clone(), i[1].shape.clone()))
            .collect();
        assert_eq!(
            sizes,
            vec![
                (vec![1, 2], vec![2, 1]),
                (vec![2, 2], vec![2, 2]),
                (vec![3, 2], vec![2, 3])
            ]
        );
        assert_eq!(b[1][1].data, TensorData::I64(vec![3, 3, 4, 4]));
        assert_eq!(b[2][2], sample[2]);
        // Unbatched: the sample as it is, once.
        let once = batches(shape(&sig, None, std::slice::from_ref(&sample)), 3);
        assert_eq!(once, vec![sample]);
        // Zero-filled with the layout: the rows on each batch axis, a 0-d input 0-d.
        let z = batches(shape(&sig, Some(&layout), &[]), 2);
        assert_eq!(z[1][1].shape, vec![2, 2]);
        assert_eq!(z[1][2].shape, Vec::<usize>::new());
    }

    fn shape<'a>(sig: &'a Signature, layout: Option<&'a Layout>, samples: &'a [Vec<Tensor>]) -> Shape<'a> {
        Shape { sig, layout, samples }
    }

    fn plan_lengths(plan: &[Warmup]) -> usize {
        plan.iter().map(|w| w.inputs[0].shape[1]).max().unwrap()
    }
}
