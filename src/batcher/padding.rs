//! Padding (`model-settings.json` `padding`): which inputs are padded, with
//! what value, along which of the ONNX file's named dims, and which output
//! dims are cut back per request. Built and checked once per model version
//! at load time ([`Padding::new`]); the batcher then uses it to group
//! requests ([`Padding::measure`]), stack a batch ([`Padding::concat`]) and
//! give each request its own outputs ([`Padding::split`]). Pure data.
//!
//! Requests whose padded inputs differ only in those named dims share a
//! batch: each is padded at the end of the dims to the batch's longest, and
//! each output dim carrying the same name is cut back to the request's own
//! length, so a request gets exactly the shape it would have got alone. That
//! is correct only for a model that masks its padding (a transformer given an
//! `attention_mask`), which the operator asserts by setting `padding`.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::tensor::{DataType, Signature, Tensor, TensorData};

/// A grouping key dim standing for "any length": padded dims are left out of
/// the key, so requests of different lengths get the same key.
const ANY: usize = usize::MAX;

/// How one model version pads (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct Padding {
    /// The padded dims' names (e.g. `["sequence"]`); an entry's lengths follow this order.
    symbols: Vec<String>,
    /// Per input, in signature order.
    inputs: Vec<PaddedInput>,
    /// Per output, in signature order: `(dim, symbol)` of each dim cut back to
    /// the request's length of that symbol.
    outputs: Vec<Vec<(usize, usize)>>,
}

#[derive(Debug, Clone, PartialEq)]
struct PaddedInput {
    name: String,
    /// The pad value (one element of the input's datatype); `None`: not padded.
    value: Option<TensorData>,
    /// Per dim: the index in `symbols` of a padded dim.
    dims: Vec<Option<usize>>,
}

impl Padding {
    /// Checks `values` (input name → pad value) against the signature. `Ok(None)` when no
    /// input is padded. The error names every problem: an unknown input, a value that does
    /// not fit the input's datatype, an input without a named dynamic dim to pad, an input
    /// left unpadded that has a padded dim, or an output dim that padding changes and that
    /// cannot be cut back.
    pub fn new(sig: &Signature, values: &BTreeMap<String, Value>) -> Result<Option<Padding>, String> {
        if values.is_empty() {
            return Ok(None);
        }
        let mut problems = Vec::new();
        let inputs = || {
            sig.inputs
                .iter()
                .map(|i| i.name.as_str())
                .collect::<Vec<_>>()
                .join("`, `")
        };
        for name in values.keys().filter(|n| sig.input(n).is_none()) {
            problems.push(format!(
                "`padding.{name}`: the model has no input `{name}` (its inputs: `{}`)",
                inputs()
            ));
        }
        let mut symbols: Vec<String> = Vec::new();
        let mut padded = Vec::new();
        for spec in &sig.inputs {
            let Some(v) = values.get(&spec.name) else {
                padded.push(PaddedInput {
                    name: spec.name.clone(),
                    value: None,
                    dims: vec![None; spec.shape.len()],
                });
                continue;
            };
            let value = pad_value(spec.dtype, v)
                .map_err(|why| problems.push(format!("`padding.{}` is {v}, {why}", spec.name)))
                .ok();
            let named: Vec<(usize, &str)> = (1..spec.shape.len())
                .filter(|&d| spec.shape[d] < 0)
                .filter_map(|d| Some((d, spec.dim_name(d)?)))
                .collect();
            if named.is_empty() {
                problems.push(format!(
                    "`padding.{}`: input `{}` (shape {:?}) has no named dynamic dim after dim 0 to pad; \
                     padding goes by the dim names (`dim_param`) of the ONNX file",
                    spec.name, spec.name, spec.shape
                ));
            }
            let mut dims = vec![None; spec.shape.len()];
            for (d, name) in named {
                dims[d] = Some(symbol_index(&mut symbols, name));
            }
            padded.push(PaddedInput {
                name: spec.name.clone(),
                value,
                dims,
            });
        }
        check_unpadded(sig, &symbols, &padded, &mut problems);
        let outputs = cut_dims(sig, &symbols, &mut problems);
        if !problems.is_empty() {
            return Err(format!("`padding`: {}", problems.join("; ")));
        }
        Ok(Some(Padding {
            symbols,
            inputs: padded,
            outputs,
        }))
    }

    /// The padded dims' names, in the order of [`Padding::measure`]'s lengths.
    pub fn symbols(&self) -> &[String] {
        &self.symbols
    }

    /// True when dim `dim` of input `input` (signature order) is padded.
    pub fn is_padded(&self, input: usize, dim: usize) -> bool {
        self.inputs
            .get(input)
            .and_then(|p| p.dims.get(dim).copied().flatten())
            .is_some()
    }

    /// A request's grouping key (its inputs' trailing dims with the padded
    /// ones left out) and its length of each padded dim. Inputs (signature
    /// order, already validated) that disagree on a named dim are an error.
    pub fn measure(&self, inputs: &[Tensor]) -> Result<(Vec<Vec<usize>>, Vec<usize>), String> {
        let mut lengths: Vec<Option<(usize, &str)>> = vec![None; self.symbols.len()];
        let mut key = Vec::with_capacity(inputs.len());
        for (t, p) in inputs.iter().zip(&self.inputs) {
            let mut dims = Vec::with_capacity(t.shape.len().saturating_sub(1));
            for (d, &n) in t.shape.iter().enumerate().skip(1) {
                match p.dims.get(d).copied().flatten() {
                    None => dims.push(n),
                    Some(s) => {
                        dims.push(ANY);
                        match lengths[s] {
                            None => lengths[s] = Some((n, &t.name)),
                            Some((m, other)) if m != n => {
                                return Err(format!(
                                "input `{}` has {n} in dim {d} (`{}`), but input `{other}` has {m} there; \
                                     the inputs' `{}` dims must agree",
                                t.name, self.symbols[s], self.symbols[s]
                            ))
                            }
                            Some(_) => {}
                        }
                    }
                }
            }
            key.push(dims);
        }
        Ok((
            key,
            lengths.into_iter().map(|l| l.map_or(1, |(n, _)| n)).collect(),
        ))
    }

    /// Stacks the entries' inputs (each in signature order) into one batch,
    /// each padded input padded to the longest entry (`max`, per symbol).
    pub fn concat(&self, entries: &[&[Tensor]], max: &[usize]) -> Vec<Tensor> {
        self.inputs
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let parts: Vec<&Tensor> = entries.iter().map(|e| &e[i]).collect();
                match &p.value {
                    None => Tensor::concat_rows(&parts),
                    Some(value) => {
                        let trailing = resized(&parts[0].shape, &p.dims, max);
                        Tensor::concat_padded(&parts, &trailing, value)
                    }
                }
            })
            .collect()
    }

    /// Padded elements ÷ all elements of the batch [`Padding::concat`] makes of `entries`.
    pub fn ratio(&self, entries: &[&[Tensor]], max: &[usize]) -> f64 {
        let (mut real, mut all) = (0usize, 0usize);
        for (i, p) in self.inputs.iter().enumerate() {
            for e in entries {
                let t = &e[i];
                real += t.data.len();
                all += t.rows() * resized(&t.shape, &p.dims, max).iter().product::<usize>();
            }
        }
        if all == 0 {
            0.0
        } else {
            (all - real) as f64 / all as f64
        }
    }

    /// Checks that every output dim to cut has the batch's padded length.
    pub fn check_outputs(&self, outputs: &[Tensor], max: &[usize]) -> Result<(), String> {
        for (t, cuts) in outputs.iter().zip(&self.outputs) {
            for &(d, s) in cuts {
                if t.shape.get(d) != Some(&max[s]) {
                    return Err(format!(
                        "output `{}` has shape {:?}, but the batch was padded to {} in `{}`: \
                         sluice needs its dim {d} to follow the inputs' to cut it back per request",
                        t.name, t.shape, max[s], self.symbols[s]
                    ));
                }
            }
        }
        Ok(())
    }

    /// One entry's outputs: rows `rows` of each batch output, each cut dim
    /// cut back to the entry's own `lengths`.
    pub fn split(&self, outputs: &[Tensor], rows: std::ops::Range<usize>, lengths: &[usize]) -> Vec<Tensor> {
        outputs
            .iter()
            .zip(&self.outputs)
            .map(|(t, cuts)| {
                if cuts.is_empty() {
                    return t.slice_rows(rows.clone());
                }
                let mut trailing: Vec<usize> = t.shape[1..].to_vec();
                for &(d, s) in cuts {
                    trailing[d - 1] = lengths[s];
                }
                t.crop(rows.clone(), &trailing)
            })
            .collect()
    }
}

/// `shape`'s trailing dims with each padded dim set to the batch's `max`.
fn resized(shape: &[usize], dims: &[Option<usize>], max: &[usize]) -> Vec<usize> {
    shape
        .iter()
        .enumerate()
        .skip(1)
        .map(|(d, &n)| dims.get(d).copied().flatten().map_or(n, |s| max[s]))
        .collect()
}

fn symbol_index(symbols: &mut Vec<String>, name: &str) -> usize {
    match symbols.iter().position(|s| s == name) {
        Some(i) => i,
        None => {
            symbols.push(name.to_string());
            symbols.len() - 1
        }
    }
}

/// An input without a pad value that has a padded dim would make every
/// request of another length its own batch: that is a mistake in `padding`.
fn check_unpadded(sig: &Signature, symbols: &[String], padded: &[PaddedInput], problems: &mut Vec<String>) {
    for (spec, p) in sig.inputs.iter().zip(padded) {
        // A padded input (even one whose pad value was refused) has padded dims.
        if p.dims.iter().any(Option::is_some) {
            continue;
        }
        let shared = (1..spec.shape.len()).find_map(|d| {
            let name = spec.dim_name(d)?;
            symbols.contains(&name.to_string()).then_some((d, name))
        });
        if let Some((d, name)) = shared {
            problems.push(format!(
                "input `{}` has the padded dim `{name}` (dim {d}) but no pad value: requests of \
                 different `{name}` could never share a batch; add `{}` to `padding`",
                spec.name, spec.name
            ));
        }
    }
}

/// Per output, the dims carrying a padded dim's name; every other dynamic
/// dim after dim 0 is a problem (sluice could not tell how padding changes it).
fn cut_dims(sig: &Signature, symbols: &[String], problems: &mut Vec<String>) -> Vec<Vec<(usize, usize)>> {
    sig.outputs
        .iter()
        .map(|spec| {
            let mut cuts = Vec::new();
            for d in (1..spec.shape.len()).filter(|&d| spec.shape[d] < 0) {
                match spec.dim_name(d).and_then(|n| symbols.iter().position(|s| s == n)) {
                    Some(s) => cuts.push((d, s)),
                    None => problems.push(format!(
                        "output `{}` (shape {:?}) has dynamic dim {d} ({}), which is not a padded dim \
                         (`{}`): sluice cannot cut it back per request",
                        spec.name,
                        spec.shape,
                        spec.dim_name(d).map_or("unnamed".into(), |n| format!("`{n}`")),
                        symbols.join("`, `")
                    )),
                }
            }
            cuts
        })
        .collect()
}

/// The JSON pad value `v` as one element of `dtype`, or why it does not fit.
fn pad_value(dtype: DataType, v: &Value) -> Result<TensorData, String> {
    let int = |lo: i128, hi: i128| -> Result<i128, String> {
        let n = v.as_i64().map(i128::from).or(v.as_u64().map(i128::from));
        n.filter(|n| (lo..=hi).contains(n))
            .ok_or_else(|| format!("which does not fit {dtype} (an integer from {lo} to {hi})"))
    };
    let float = |max: f64| -> Result<f64, String> {
        v.as_f64()
            .filter(|x| x.abs() <= max)
            .ok_or_else(|| format!("which does not fit {dtype} (a number)"))
    };
    Ok(match dtype {
        DataType::Bool => TensorData::Bool(vec![v
            .as_bool()
            .ok_or_else(|| "which does not fit BOOL (true or false)".to_string())?]),
        DataType::U8 => TensorData::U8(vec![int(0, u8::MAX.into())? as u8]),
        DataType::U16 => TensorData::U16(vec![int(0, u16::MAX.into())? as u16]),
        DataType::U32 => TensorData::U32(vec![int(0, u32::MAX.into())? as u32]),
        DataType::U64 => TensorData::U64(vec![int(0, u64::MAX.into())? as u64]),
        DataType::I8 => TensorData::I8(vec![int(i8::MIN.into(), i8::MAX.into())? as i8]),
        DataType::I16 => TensorData::I16(vec![int(i16::MIN.into(), i16::MAX.into())? as i16]),
        DataType::I32 => TensorData::I32(vec![int(i32::MIN.into(), i32::MAX.into())? as i32]),
        DataType::I64 => TensorData::I64(vec![int(i64::MIN.into(), i64::MAX.into())? as i64]),
        DataType::F16 => TensorData::F16(vec![half::f16::from_f64(float(65504.0)?)]),
        DataType::Bf16 => TensorData::Bf16(vec![half::bf16::from_f64(float(f64::from(f32::MAX))?)]),
        DataType::F32 => TensorData::F32(vec![float(f64::from(f32::MAX))? as f32]),
        DataType::F64 => TensorData::F64(vec![float(f64::MAX)?]),
        DataType::Bytes => TensorData::Bytes(
            [v.as_str()
                .ok_or_else(|| "which does not fit BYTES (a string)".to_string())?]
            .into_iter()
            .collect(),
        ),
    })
}

#[cfg(test)]
mod tests;
