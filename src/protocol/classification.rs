//! Triton's classification extension: a requested output with
//! `parameters.classification: N` is answered with its top N classes
//! instead of its values, per batch row, as BYTES strings
//! `"<score>:<index>"`, or `"<score>:<index>:<label>"` when the model's
//! configuration gives the output a `label_filename`. The score is written
//! as Triton writes it (C++'s `std::to_string`: six decimals). Pure: no I/O.

use std::collections::HashMap;

use serde_json::{Map, Value};

use super::grpc::inference::{infer_parameter::ParameterChoice, InferParameter};
use crate::error::Error;
use crate::tensor::{Tensor, TensorData};

/// The parameter that asks for classes.
pub const PARAMETER: &str = "classification";

/// A V2 JSON output's `classification`, if it has one.
pub fn from_json(params: Option<&Map<String, Value>>, what: &str) -> Result<Option<usize>, Error> {
    match params.and_then(|p| p.get(PARAMETER)) {
        None => Ok(None),
        Some(v) => count(v.as_u64(), what),
    }
}

/// A gRPC output's `classification`, if it has one.
pub fn from_grpc(params: &HashMap<String, InferParameter>, what: &str) -> Result<Option<usize>, Error> {
    match params.get(PARAMETER).map(|p| p.parameter_choice.as_ref()) {
        None => Ok(None),
        Some(Some(ParameterChoice::Int64Param(n))) => count(u64::try_from(*n).ok(), what),
        Some(Some(ParameterChoice::Uint64Param(n))) => count(Some(*n), what),
        Some(_) => count(None, what),
    }
}

fn count(n: Option<u64>, what: &str) -> Result<Option<usize>, Error> {
    match n.and_then(|n| usize::try_from(n).ok()) {
        Some(n) if n > 0 => Ok(Some(n)),
        _ => Err(Error::invalid(format!(
            "{what}: parameter `{PARAMETER}` must be a positive integer (how many classes to return)"
        ))),
    }
}

/// The top `n` classes of `t`: per row of dim 0 when `batched`, else of the
/// whole tensor; fewer when a row has fewer elements. Ties keep index order.
pub fn classify(t: &Tensor, n: usize, labels: Option<&[String]>, batched: bool) -> Result<Tensor, Error> {
    let scores = scores(&t.data).ok_or_else(|| {
        Error::invalid(format!(
            "output `{}`: classification needs a numeric output, it is {}",
            t.name,
            t.dtype()
        ))
    })?;
    let rows = match (batched, t.shape.first()) {
        (true, Some(&r)) if r > 0 => r,
        _ => 1,
    };
    let per_row = scores.len() / rows.max(1);
    let k = n.min(per_row);
    let mut out = Vec::with_capacity(rows * k);
    for row in scores.chunks(per_row.max(1)).take(rows) {
        let mut order: Vec<usize> = (0..row.len()).collect();
        order.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
        for &i in order.iter().take(k) {
            let mut s = format!("{:.6}:{i}", row[i]);
            if let Some(label) = labels.and_then(|l| l.get(i)) {
                s.push(':');
                s.push_str(label);
            }
            out.push(s.into_bytes());
        }
    }
    let shape = if batched && !t.shape.is_empty() {
        vec![rows, k]
    } else {
        vec![k]
    };
    Ok(Tensor {
        name: t.name.clone(),
        shape,
        data: TensorData::Bytes(out.into()),
    })
}

/// The elements as f64, for a numeric tensor.
fn scores(data: &TensorData) -> Option<Vec<f64>> {
    fn all<T: Copy + Into<f64>>(v: &[T]) -> Vec<f64> {
        v.iter().map(|&x| x.into()).collect()
    }
    Some(match data {
        TensorData::U8(v) => all(v),
        TensorData::U16(v) => all(v),
        TensorData::U32(v) => all(v),
        TensorData::U64(v) => v.iter().map(|&x| x as f64).collect(),
        TensorData::I8(v) => all(v),
        TensorData::I16(v) => all(v),
        TensorData::I32(v) => all(v),
        TensorData::I64(v) => v.iter().map(|&x| x as f64).collect(),
        TensorData::F16(v) => v.iter().map(|x| x.to_f64()).collect(),
        TensorData::Bf16(v) => v.iter().map(|x| x.to_f64()).collect(),
        TensorData::F32(v) => all(v),
        TensorData::F64(v) => v.clone(),
        TensorData::Bool(_) | TensorData::Bytes(_) => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(t: &Tensor) -> Vec<String> {
        match &t.data {
            TensorData::Bytes(b) => b.iter().map(|s| String::from_utf8(s.to_vec()).unwrap()).collect(),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn top_classes_per_row_with_labels() {
        let t = Tensor {
            name: "prob".into(),
            shape: vec![2, 3],
            data: TensorData::F32(vec![0.1, 0.7, 0.2, 3.0, 1.0, 3.0]),
        };
        let labels = ["cat".to_string(), "dog".into(), "eel".into()];
        let c = classify(&t, 2, Some(&labels), true).unwrap();
        assert_eq!(c.shape, vec![2, 2]);
        assert_eq!(
            strings(&c),
            [
                "0.700000:1:dog",
                "0.200000:2:eel",
                "3.000000:0:cat",
                "3.000000:2:eel"
            ]
        );
        // No batch dimension: the whole tensor is one row; more than there are: all.
        let c = classify(&t, 9, None, false).unwrap();
        assert_eq!(c.shape, vec![6]);
        assert_eq!(strings(&c)[0], "3.000000:3");
    }

    #[test]
    fn the_parameter_must_be_a_positive_count_of_a_numeric_output() {
        let p = serde_json::json!({"classification": 0});
        let e = from_json(p.as_object(), "output `y`").unwrap_err().to_string();
        assert!(e.contains("must be a positive integer"), "{e}");
        let p = serde_json::json!({"classification": 3});
        assert_eq!(from_json(p.as_object(), "output `y`").unwrap(), Some(3));
        let t = Tensor {
            name: "s".into(),
            shape: vec![1],
            data: TensorData::Bytes(vec![b"a".to_vec()].into()),
        };
        let e = classify(&t, 1, None, false).unwrap_err().to_string();
        assert!(e.contains("classification needs a numeric output"), "{e}");
    }
}
