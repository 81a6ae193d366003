//! Whether a model batches, along which axis of each tensor, and why not:
//! decided from evidence, never assumed (README, "Which models batch").
//!
//! The evidence, in order:
//! 1. the ONNX file ([`decide`]): a batch axis must be dynamic in every
//!    input and output, and an output whose batch dim has a meaningful
//!    name other than the inputs' (`num_det` against `batch`) does not follow
//!    the batch. Names exporters generate (`unk__214`, `DynamicDimension.0`)
//!    decide nothing: one batch dim often gets a different one on each tensor;
//! 2. warm-up runs (`model::warmup::probe`): every output's batch dim must
//!    follow a batch of 1 row and one of 2;
//! 3. a served batch (`task.rs`): the same check on every batch that
//!    shares or splits rows.
//!
//! A model that does not batch is served with batching off: each request
//! runs alone and gets its outputs whole, whatever their shapes. Batching
//! turns off, never on, while a version serves ([`Batching::turn_off`]).
//!
//! The batch axis is dim 0 unless `model-settings.json` `batch_axes` names
//! another (a recurrent state `[layers, batch, hidden]` batches on axis 1).
//! A 0-d input (a sample rate) has no batch axis: requests share a batch
//! only when they agree on its value, as they must on every other dim.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use crate::metrics;
use crate::tensor::{Signature, Tensor, TensorSpec};

/// The batch axis of each input and output of a model that batches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// Per input, in signature order: its batch axis, or `None` for a 0-d
    /// input whose value requests must share to share a batch.
    pub inputs: Vec<Option<usize>>,
    /// Per output, in signature order: its batch axis.
    pub outputs: Vec<usize>,
}

/// True for a dim name an exporter made up rather than the model's author:
/// tf2onnx's and ONNX Runtime's `unk__214`, paddle2onnx's
/// `DynamicDimension.0`, torch.onnx's `Addoutput_dim_0` and dynamo's `s0`.
fn generated(name: &str) -> bool {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    name.starts_with("unk__")
        || name.starts_with("DynamicDimension")
        || name.rsplit_once("_dim_").is_some_and(|(_, d)| digits(d))
        || name.strip_prefix('s').is_some_and(digits)
}

/// The name of `spec`'s dim `axis` when it means something (see [`generated`]).
fn meaningful(spec: &TensorSpec, axis: usize) -> Option<&str> {
    spec.dim_name(axis).filter(|n| !generated(n))
}

/// Checks `batch_axes` (tensor name → axis) against the ONNX file: the name
/// must be an input or output, the axis within its rank and dynamic. The
/// error names the field and the fix.
pub fn check_declared(sig: &Signature, declared: &BTreeMap<String, usize>) -> Result<(), String> {
    let mut problems = Vec::new();
    for (name, &axis) in declared {
        let field = format!("`batch_axes.{name}`");
        let Some(spec) = sig.input(name).or_else(|| sig.output(name)) else {
            let all: Vec<&str> = sig
                .inputs
                .iter()
                .chain(&sig.outputs)
                .map(|t| t.name.as_str())
                .collect();
            problems.push(format!(
                "{field}: the ONNX file has no input or output `{name}` (it has `{}`); fix the name or remove it",
                all.join("`, `")
            ));
            continue;
        };
        match spec.shape.get(axis) {
            None => problems.push(format!(
                "{field} is {axis}, but `{name}` has {} dims {:?}: give an axis from 0 to {}{}",
                spec.shape.len(),
                spec.shape,
                spec.shape.len().saturating_sub(1),
                if spec.shape.is_empty() {
                    " (a 0-d tensor has no batch axis: remove it)"
                } else {
                    ""
                }
            )),
            Some(&d) if d >= 0 => problems.push(format!(
                "{field} is {axis}, but dim {axis} of `{name}` is fixed ({d}) in the ONNX file {:?}; \
                 the batch axis is a dynamic dim (-1)",
                spec.shape
            )),
            Some(_) => {}
        }
    }
    match problems.is_empty() {
        true => Ok(()),
        false => Err(problems.join("; ")),
    }
}

/// What the ONNX file says: the layout when every input and output has a
/// dynamic batch axis (dim 0, or the one `declared`) and no name says
/// otherwise; else why the model does not batch. `declared` was checked by
/// [`check_declared`].
pub fn decide(sig: &Signature, declared: &BTreeMap<String, usize>) -> Result<Layout, String> {
    let axis = |t: &TensorSpec| declared.get(&t.name).copied().unwrap_or(0);
    let mut inputs = Vec::with_capacity(sig.inputs.len());
    // The first input's meaningful batch dim name, which the rest must share.
    let mut named: Option<(&str, &str)> = None;
    for t in &sig.inputs {
        if t.shape.is_empty() && !declared.contains_key(&t.name) {
            inputs.push(None);
            continue;
        }
        let a = axis(t);
        if t.shape.get(a).is_some_and(|&d| d >= 0) {
            return Err(format!(
                "input `{}` has a fixed dim {a} ({}): the file fixes the batch",
                t.name, t.shape[a]
            ));
        }
        if let Some(n) = meaningful(t, a) {
            match named {
                Some((first, by)) if first != n => {
                    return Err(format!(
                        "inputs `{by}` and `{}` name their dim {a} differently (`{first}`, `{n}`): not one batch dim",
                        t.name
                    ))
                }
                None => named = Some((n, &t.name)),
                _ => {}
            }
        }
        inputs.push(Some(a));
    }
    if !inputs.iter().any(Option::is_some) {
        return Err("no input has a batch dim (every input is 0-d)".into());
    }
    let mut outputs = Vec::with_capacity(sig.outputs.len());
    for t in &sig.outputs {
        let a = axis(t);
        match t.shape.get(a) {
            None => return Err(format!("output `{}` is 0-d: it has no rows to split", t.name)),
            Some(&d) if d >= 0 => {
                return Err(format!(
                    "output `{}` has a fixed dim {a} ({d}): it does not follow the batch",
                    t.name
                ))
            }
            Some(_) => {}
        }
        if let (Some(n), Some((first, _))) = (meaningful(t, a), named) {
            if n != first {
                return Err(format!(
                    "output `{}` names its dim {a} `{n}`, the inputs' batch dim is `{first}`: its rows do not follow the batch",
                    t.name
                ));
            }
        }
        outputs.push(a);
    }
    Ok(Layout { inputs, outputs })
}

impl Layout {
    /// Every one of `inputs` inputs and `outputs` outputs on dim 0.
    pub fn plain(inputs: usize, outputs: usize) -> Layout {
        Layout {
            inputs: vec![Some(0); inputs],
            outputs: vec![0; outputs],
        }
    }

    /// True when every tensor batches on dim 0 and no input is 0-d: the
    /// batcher's plain path, and what Triton's `max_batch_size` describes.
    pub fn is_plain(&self) -> bool {
        self.inputs.iter().all(|a| *a == Some(0)) && self.outputs.iter().all(|&a| a == 0)
    }

    /// How the file's tensors batch, for `sluice check` and the load's log line.
    pub fn describe(&self, sig: &Signature) -> String {
        if self.is_plain() {
            let name = sig.inputs.iter().find_map(|t| meaningful(t, 0));
            return match name {
                Some(n) => format!("along dim 0 (`{n}`) of every input and output"),
                None => "along dim 0 of every input and output".into(),
            };
        }
        let mut parts = Vec::new();
        for (t, a) in sig.inputs.iter().zip(&self.inputs) {
            parts.push(match a {
                Some(a) => format!("`{}` on axis {a}", t.name),
                None => format!("`{}` 0-d (requests share a batch when they agree on it)", t.name),
            });
        }
        for (t, a) in sig.outputs.iter().zip(&self.outputs) {
            parts.push(format!("`{}` on axis {a}", t.name));
        }
        parts.join(", ")
    }

    /// A request's rows: the size of its first batched input's batch axis;
    /// every batched input must agree.
    pub fn rows(&self, inputs: &[Tensor]) -> Result<usize, String> {
        let mut batched = inputs
            .iter()
            .zip(&self.inputs)
            .filter_map(|(t, a)| Some((t, (*a)?)));
        let Some((first, a)) = batched.next() else {
            return Ok(1);
        };
        let rows = first.len_at(a);
        for (t, b) in batched {
            if t.len_at(b) != rows {
                return Err(format!(
                    "input `{}` has {} rows (dim {b}) but input `{}` has {rows} (dim {a}); every input must have the same rows",
                    t.name,
                    t.len_at(b),
                    first.name
                ));
            }
        }
        Ok(rows)
    }

    /// What requests must share to share a batch: each batched input's other
    /// dims, and each 0-d input's value.
    pub fn key(&self, inputs: &[Tensor]) -> Vec<Vec<usize>> {
        inputs
            .iter()
            .zip(&self.inputs)
            .map(|(t, a)| match a {
                Some(a) => t
                    .shape
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| i != a)
                    .map(|(_, &d)| d)
                    .collect(),
                None => value_key(t),
            })
            .collect()
    }

    /// Requests' inputs (each in signature order) as one batch: batched
    /// inputs concatenated along their axis, 0-d inputs taken from the first
    /// (every request of a batch has the same).
    pub fn concat(&self, parts: &[&[Tensor]]) -> Vec<Tensor> {
        (0..self.inputs.len())
            .map(|i| match self.inputs[i] {
                Some(a) => Tensor::concat_axis(&parts.iter().map(|p| &p[i]).collect::<Vec<_>>(), a),
                None => parts[0][i].clone(),
            })
            .collect()
    }

    /// Rows `range` of every output.
    pub fn split(&self, outputs: &[Tensor], range: std::ops::Range<usize>) -> Vec<Tensor> {
        outputs
            .iter()
            .zip(&self.outputs)
            .map(|(t, &a)| t.slice_axis(a, range.clone()))
            .collect()
    }

    /// Whether every output has `rows` along its batch axis; if not, which
    /// one does not (the evidence that the model does not batch).
    pub fn follows(&self, outputs: &[Tensor], rows: usize) -> Result<(), String> {
        for (t, &a) in outputs.iter().zip(&self.outputs) {
            if t.shape.len() <= a || t.shape[a] != rows {
                return Err(format!(
                    "output `{}` has shape {:?} for a batch of {rows} row{}: its dim {a} does not follow the batch",
                    t.name,
                    t.shape,
                    if rows == 1 { "" } else { "s" }
                ));
            }
        }
        Ok(())
    }
}

/// Whether a model batches, as the repository index and `sluice check` say
/// it: `on, along …` (`layout`, while `max_batch_size` lets requests share
/// batches), `off: max_batch_size is 1`, or `off: why`.
pub fn verdict(layout: Result<&Layout, &str>, batching_enabled: bool, sig: &Signature) -> String {
    match layout {
        Ok(l) if batching_enabled => format!("on, {}", l.describe(sig)),
        Ok(_) => "off: max_batch_size is 1".into(),
        Err(why) => format!("off: {why}"),
    }
}

/// A 0-d input's shape and value as key words: equal keys, equal tensors
/// (the value's bytes as the binary extension writes them, length-prefixed
/// strings for BYTES).
fn value_key(t: &Tensor) -> Vec<usize> {
    let bytes = crate::protocol::binary::encode(&t.data);
    let mut key: Vec<usize> = t.shape.clone();
    key.push(usize::MAX);
    key.push(bytes.len());
    key.extend(bytes.chunks(8).map(|c| {
        let mut w = [0u8; 8];
        w[..c.len()].copy_from_slice(c);
        u64::from_le_bytes(w) as usize
    }));
    key
}

/// Whether a model version batches now. Shared by its `Batcher` handles and
/// its batching task; it starts as the file's and warm-up's evidence left it
/// and may turn off, never on, when a served batch shows that the outputs do
/// not follow its rows.
#[derive(Debug)]
pub struct Batching {
    model: String,
    /// The layout the model was found to have, or dim 0 of every tensor
    /// for one found not to batch.
    axes: Layout,
    off: OnceLock<String>,
}

impl Batching {
    /// `layout`: the tensors' batch axes, or why the model (with `sig`'s
    /// inputs and outputs) does not batch.
    pub fn new(model: &str, sig: &Signature, layout: Result<Layout, String>) -> Batching {
        let (axes, off) = match layout {
            Ok(l) => (l, OnceLock::new()),
            Err(why) => (
                Layout::plain(sig.inputs.len(), sig.outputs.len()),
                OnceLock::from(why),
            ),
        };
        metrics::model_batching(model, off.get().is_none());
        Batching {
            model: model.to_string(),
            axes,
            off,
        }
    }

    /// The layout while the model batches; `None` once it does not.
    pub fn layout(&self) -> Option<&Layout> {
        match self.off.get() {
            None => Some(&self.axes),
            Some(_) => None,
        }
    }

    /// The axes requests already queued or batched are concatenated and cut
    /// along, on or off: a batch of several entries, or of a chunk, forms
    /// only while the model batches, so these are the axes it was found to
    /// have (dim 0 of every tensor for one found not to batch from the start).
    pub fn axes(&self) -> &Layout {
        &self.axes
    }

    /// Why the model does not batch, once it does not.
    pub fn off(&self) -> Option<&str> {
        self.off.get().map(String::as_str)
    }

    /// Turns batching off for this version, with the evidence; logs it once.
    pub fn turn_off(&self, evidence: String) {
        if self.off.set(evidence).is_ok() {
            tracing::warn!(
                model = %self.model,
                evidence = self.off().unwrap_or_default(),
                "batching turned off for this version: a served batch showed that the outputs do not follow its rows; \
                 each request now runs alone"
            );
            metrics::model_batching(&self.model, false);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::{DataType, TensorData};

    fn spec(name: &str, shape: &[i64], dims: &[&str]) -> TensorSpec {
        TensorSpec {
            name: name.into(),
            dtype: DataType::F32,
            shape: shape.to_vec(),
            dim_names: dims.iter().map(|d| d.to_string()).collect(),
        }
    }

    fn sig(inputs: Vec<TensorSpec>, outputs: Vec<TensorSpec>) -> Signature {
        Signature { inputs, outputs }
    }

    fn none() -> BTreeMap<String, usize> {
        BTreeMap::new()
    }

    #[test]
    fn generated_names_decide_nothing_meaningful_ones_do() {
        // A classifier exported with a different generated name on each side batches.
        let s = sig(
            vec![spec("x", &[-1, 4], &["unk__214"])],
            vec![spec("y", &[-1, 2], &["unk__215"])],
        );
        assert!(decide(&s, &none()).unwrap().is_plain());
        // A detector's count of detections is not the batch.
        let s = sig(
            vec![spec("img", &[-1, 3], &["batch"])],
            vec![spec("dets", &[-1, 6], &["num_det"])],
        );
        let why = decide(&s, &none()).unwrap_err();
        assert!(
            why.contains("`dets`") && why.contains("num_det") && why.contains("`batch`"),
            "{why}"
        );
        // Unnamed on one side: nothing to go by (warm-up decides).
        let s = sig(
            vec![spec("img", &[-1, 3], &[])],
            vec![spec("dets", &[-1, 6], &["num_det"])],
        );
        assert!(decide(&s, &none()).is_ok());
        for g in ["unk__3", "DynamicDimension.1", "Addoutput_dim_0", "s0"] {
            assert!(generated(g), "{g}");
        }
        for m in ["batch", "batch_size", "N", "num_det", "sequence"] {
            assert!(!generated(m), "{m}");
        }
    }

    #[test]
    fn fixed_or_missing_batch_dims_do_not_batch() {
        let s = sig(vec![spec("x", &[2, 4], &[])], vec![spec("y", &[-1], &[])]);
        assert!(decide(&s, &none())
            .unwrap_err()
            .contains("input `x` has a fixed dim 0 (2)"));
        let s = sig(vec![spec("x", &[-1, 4], &[])], vec![spec("y", &[], &[])]);
        assert!(decide(&s, &none()).unwrap_err().contains("output `y` is 0-d"));
        let s = sig(vec![spec("sr", &[], &[])], vec![spec("y", &[-1], &[])]);
        assert!(decide(&s, &none()).unwrap_err().contains("every input is 0-d"));
    }

    #[test]
    fn declared_axes_are_checked_and_used() {
        let s = sig(
            vec![
                spec("x", &[-1, 512], &[]),
                spec("state", &[2, -1, 128], &[]),
                spec("sr", &[], &[]),
            ],
            vec![spec("y", &[-1, 1], &[]), spec("stateN", &[2, -1, 128], &[])],
        );
        // Without a declaration the state's fixed dim 0 rules batching out.
        assert!(decide(&s, &none())
            .unwrap_err()
            .contains("`state` has a fixed dim 0"));
        let axes: BTreeMap<String, usize> = [("state".to_string(), 1), ("stateN".to_string(), 1)].into();
        check_declared(&s, &axes).unwrap();
        let l = decide(&s, &axes).unwrap();
        assert_eq!(l.inputs, vec![Some(0), Some(1), None]);
        assert_eq!(l.outputs, vec![0, 1]);
        assert!(!l.is_plain());
        let bad: BTreeMap<String, usize> = [
            ("state".to_string(), 0),
            ("nope".to_string(), 1),
            ("sr".to_string(), 0),
        ]
        .into();
        let err = check_declared(&s, &bad).unwrap_err();
        assert!(
            err.contains("`batch_axes.state` is 0, but dim 0 of `state` is fixed (2)"),
            "{err}"
        );
        assert!(
            err.contains("`batch_axes.nope`: the ONNX file has no input or output `nope`"),
            "{err}"
        );
        assert!(err.contains("`batch_axes.sr` is 0, but `sr` has 0 dims"), "{err}");
    }

    #[test]
    fn rows_keys_concat_and_split_follow_the_axes() {
        let l = Layout {
            inputs: vec![Some(0), Some(1), None],
            outputs: vec![1],
        };
        let t = |name: &str, shape: Vec<usize>, v: Vec<f32>| {
            Tensor::new(name, shape, TensorData::F32(v)).unwrap()
        };
        let sr = |v: i64| Tensor::new("sr", vec![], TensorData::I64(vec![v])).unwrap();
        let a = vec![
            t("x", vec![1, 2], vec![1., 2.]),
            t("s", vec![2, 1], vec![3., 4.]),
            sr(16000),
        ];
        let b = vec![
            t("x", vec![2, 2], vec![5., 6., 7., 8.]),
            t("s", vec![2, 2], vec![9., 10., 11., 12.]),
            sr(16000),
        ];
        let c = vec![a[0].clone(), a[1].clone(), sr(8000)];
        assert_eq!(l.rows(&a), Ok(1));
        assert_eq!(l.rows(&b), Ok(2));
        assert_eq!(l.key(&a), l.key(&b));
        assert_ne!(
            l.key(&a),
            l.key(&c),
            "a different sample rate never shares a batch"
        );
        let bad = vec![a[0].clone(), b[1].clone(), sr(1)];
        assert!(l.rows(&bad).unwrap_err().contains("same rows"));
        let batch = l.concat(&[&a, &b]);
        assert_eq!(batch[1].shape, vec![2, 3]);
        assert_eq!(batch[1].data, TensorData::F32(vec![3., 9., 10., 4., 11., 12.]));
        assert_eq!(batch[2], sr(16000));
        let out = [batch[1].clone()];
        assert_eq!(l.split(&out, 0..1), vec![a[1].clone()]);
        assert_eq!(l.split(&out, 1..3), vec![b[1].clone()]);
        assert!(l.follows(&out, 3).is_ok());
        assert!(l.follows(&out, 2).unwrap_err().contains("does not follow"));
    }
}
