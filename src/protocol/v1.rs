//! The KServe V1 protocol: `{"instances": [...]}` in, `{"predictions": [...],
//! "batchId": "..."}` out, one instance per row. V1 carries no datatypes or
//! shapes, so decoding takes them from the model's signature (datatypes) and
//! from the instances' nesting (row shape).

use std::collections::BTreeMap;

use serde::ser::{SerializeMap, SerializeSeq};
use serde::{Deserialize, Serialize, Serializer};
use serde_json::error::Category;
use serde_json::value::RawValue;

use super::json::{self, JsonElement, JsonElements, Layout};
use super::{InferRequest, InferResponse};
use crate::error::Error;
use crate::tensor::{Signature, Tensor, TensorData, TensorSpec};

/// Body of `POST /v1/models/{name}:predict`, each instance as its JSON text.
#[derive(Deserialize)]
struct PredictRequest<'a> {
    /// One entry per row: an input's row, or an object keyed by input name.
    #[serde(borrow)]
    instances: Vec<&'a RawValue>,
}

/// Stacks one input's rows (one per instance) into a tensor of shape
/// `[rows, ...row shape]`; every row must have instance 0's shape.
fn stack(spec: &TensorSpec, rows: &[&RawValue]) -> Result<Tensor, Error> {
    let mut data = TensorData::with_capacity(spec.dtype, 0);
    let mut row_shape = Vec::new();
    for (i, row) in rows.iter().enumerate() {
        let what = format!("instance {i} of input `{}`", spec.name);
        let read = json::read(&what, row.get().as_bytes(), &mut data, Layout::Rectangular)?;
        if i == 0 {
            row_shape = read.shape;
        } else if read.shape != row_shape {
            return Err(Error::invalid(format!(
                "{what} has shape {:?}, instance 0 has {row_shape:?}",
                read.shape
            )));
        }
    }
    let mut shape = vec![rows.len()];
    shape.extend(row_shape);
    Ok(Tensor {
        name: spec.name.clone(),
        shape,
        data,
    })
}

/// Decodes a V1 body into one row per instance. A single-input model takes
/// the input's row itself (a scalar for a rank-1 input, nested arrays for
/// higher ranks) or `{"<input>": row}`; a multi-input model takes an object
/// keyed by input name. Datatypes come from `sig`; [`super::validate`] then
/// checks shapes.
pub fn decode(body: &[u8], sig: &Signature) -> Result<InferRequest, Error> {
    let PredictRequest { instances } = serde_json::from_slice(body).map_err(|e| match e.classify() {
        Category::Data => Error::invalid("request body must be a JSON object with an `instances` array"),
        _ => Error::invalid(format!("invalid JSON body: {e}")),
    })?;
    if instances.is_empty() {
        return Err(Error::invalid("`instances` is empty; send at least one instance"));
    }
    let expected = || super::names(sig.inputs.iter().map(|s| &s.name));
    // rows[k][i]: input k's row in instance i.
    let mut rows: Vec<Vec<&RawValue>> = vec![Vec::with_capacity(instances.len()); sig.inputs.len()];
    for (i, inst) in instances.iter().enumerate() {
        if !inst.get().starts_with('{') {
            if sig.inputs.len() != 1 {
                return Err(Error::invalid(format!(
                    "instance {i}: the model has several inputs, so each instance must be an object keyed by \
                     input name ({})",
                    expected()
                )));
            }
            rows[0].push(inst);
            continue;
        }
        let obj: BTreeMap<String, &RawValue> = serde_json::from_str(inst.get())
            .map_err(|e| Error::invalid(format!("instance {i}: invalid JSON: {e}")))?;
        if let Some(key) = obj.keys().find(|k| sig.input(k).is_none()) {
            return Err(Error::invalid(format!(
                "instance {i}: unknown input `{key}`; the model's inputs are {}",
                expected()
            )));
        }
        for (spec, rows) in sig.inputs.iter().zip(&mut rows) {
            let row = obj
                .get(&spec.name)
                .ok_or_else(|| Error::invalid(format!("instance {i}: missing input `{}`", spec.name)))?;
            rows.push(row);
        }
    }
    let inputs = sig
        .inputs
        .iter()
        .zip(&rows)
        .map(|(spec, rows)| stack(spec, rows))
        .collect::<Result<_, _>>()?;
    Ok(InferRequest {
        schedule: Default::default(),
        sequence: None,
        classify: Vec::new(),
        id: None,
        inputs,
        outputs: None,
    })
}

/// A response, `{"predictions": [...], "batchId": "..."}`: one prediction
/// per row, the output's row for a single-output model, else an object keyed
/// by output name; written straight from the output tensors.
#[derive(Serialize)]
pub struct PredictResponse<'a> {
    predictions: Predictions<'a>,
    /// Id of the batch the request ran in; equal for requests batched together.
    #[serde(rename = "batchId")]
    batch_id: &'a str,
}

/// The rows of a response's outputs.
struct Predictions<'a>(&'a [Tensor]);

/// Row `i` of an output: a scalar for a rank-1 output, else nested arrays;
/// `null` past its last row (an output with fewer rows than the others).
struct Row<'a>(&'a Tensor, usize);

impl Serialize for Row<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let Row(t, i) = *self;
        match t.shape.get(1..) {
            _ if i >= t.rows() => s.serialize_none(),
            None | Some([]) => JsonElement(&t.data, i).serialize(s),
            Some([len, inner @ ..]) => JsonElements {
                data: &t.data,
                offset: i * t.row_len(),
                len: *len,
                inner,
            }
            .serialize(s),
        }
    }
}

impl Serialize for Predictions<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let n = self.0.iter().map(Tensor::rows).max().unwrap_or(0);
        let mut seq = s.serialize_seq(Some(n))?;
        for i in 0..n {
            match self.0 {
                [only] => seq.serialize_element(&Row(only, i))?,
                many => seq.serialize_element(&Outputs(many, i))?,
            }
        }
        seq.end()
    }
}

/// Row `i` of several outputs, keyed by output name.
struct Outputs<'a>(&'a [Tensor], usize);

impl Serialize for Outputs<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for t in self.0 {
            map.serialize_entry(&t.name, &Row(t, self.1))?;
        }
        map.end()
    }
}

/// Encodes a response (see [`PredictResponse`]).
pub fn encode(resp: &InferResponse) -> PredictResponse<'_> {
    PredictResponse {
        predictions: Predictions(&resp.outputs),
        batch_id: &resp.batch_id,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::DataType;
    use serde_json::{json, Value};

    fn decode(body: Value, sig: &Signature) -> Result<InferRequest, Error> {
        super::decode(body.to_string().as_bytes(), sig)
    }

    /// The response as a client reads it: its text, parsed.
    fn wire(resp: &InferResponse) -> Value {
        serde_json::from_slice(&serde_json::to_vec(&encode(resp)).unwrap()).unwrap()
    }

    fn predictions(resp: &InferResponse) -> Vec<Value> {
        match wire(resp) {
            Value::Object(mut body) => serde_json::from_value(body.remove("predictions").unwrap()).unwrap(),
            other => panic!("{other}"),
        }
    }

    fn spec(name: &str, dtype: DataType, shape: &[i64]) -> TensorSpec {
        TensorSpec {
            name: name.into(),
            dtype,
            shape: shape.to_vec(),
            dim_names: vec![],
        }
    }

    fn single(dtype: DataType, shape: &[i64]) -> Signature {
        Signature {
            inputs: vec![spec("x", dtype, shape)],
            outputs: vec![],
        }
    }

    fn multi() -> Signature {
        let inputs = vec![
            spec("a", DataType::F32, &[-1, 2]),
            spec("b", DataType::I64, &[-1]),
        ];
        Signature {
            inputs,
            outputs: vec![],
        }
    }

    fn tensor(name: &str, shape: &[usize], data: TensorData) -> Tensor {
        Tensor::new(name, shape.to_vec(), data).unwrap()
    }

    fn err(body: Value, sig: &Signature) -> String {
        decode(body, sig).unwrap_err().to_string()
    }

    #[test]
    fn single_input_rows_stack_along_dim0() {
        let req = decode(
            json!({"instances": [[[1, 2], [3, 4]], [[5, 6], [7, 8]]]}),
            &single(DataType::F32, &[-1, 2, 2]),
        );
        let want = tensor(
            "x",
            &[2, 2, 2],
            TensorData::F32(vec![1., 2., 3., 4., 5., 6., 7., 8.]),
        );
        assert_eq!(req.unwrap().inputs, vec![want]);
    }

    #[test]
    fn single_rank1_input_takes_scalars() {
        let req = decode(json!({"instances": ["a", "bc"]}), &single(DataType::Bytes, &[-1])).unwrap();
        let want = tensor(
            "x",
            &[2],
            TensorData::Bytes(vec![b"a".to_vec(), b"bc".to_vec()].into()),
        );
        assert_eq!(req.inputs, vec![want]);
        assert_eq!(req.rows(), 2);
    }

    #[test]
    fn single_input_accepts_the_keyed_form() {
        let sig = single(DataType::Bool, &[-1, 2]);
        let keyed = decode(json!({"instances": [{"x": [true, false]}]}), &sig).unwrap();
        let bare = decode(json!({"instances": [[true, false]]}), &sig).unwrap();
        assert_eq!(keyed, bare);
        assert_eq!(bare.inputs[0].shape, vec![1, 2]);
    }

    #[test]
    fn multi_input_instances_are_objects() {
        let body = json!({"instances": [{"b": 1, "a": [0.5, 1]}, {"a": [2, 3], "b": 2}]});
        let req = decode(body, &multi()).unwrap();
        let a = tensor("a", &[2, 2], TensorData::F32(vec![0.5, 1., 2., 3.]));
        let b = tensor("b", &[2], TensorData::I64(vec![1, 2]));
        assert_eq!(req.inputs, vec![a, b]);
    }

    #[test]
    fn multi_input_key_errors_name_the_instance() {
        let m = err(
            json!({"instances": [{"a": [1, 2], "b": 1}, {"a": [1, 2]}]}),
            &multi(),
        );
        assert_eq!(m, "instance 1: missing input `b`");
        let m = err(json!({"instances": [{"a": [1, 2], "b": 1, "c": 0}]}), &multi());
        assert_eq!(
            m,
            "instance 0: unknown input `c`; the model's inputs are `a`, `b`"
        );
        let m = err(json!({"instances": [[1, 2]]}), &multi());
        assert!(m.starts_with("instance 0: the model has several inputs"), "{m}");
    }

    /// Each level is an array of 100 whose first element is the next level: 1.2 KB that
    /// claims 100^6 elements per row. Sizing buffers by the claim aborted the server
    /// ("memory allocation of 4000000000000 bytes failed"); fuzz/regressions/v1/ has it too.
    #[test]
    fn a_row_that_claims_more_elements_than_it_holds_is_ragged_not_allocated() {
        let mut row = json!(vec![0; 100]);
        for _ in 0..5 {
            let mut level = vec![json!(0); 100];
            level[0] = row;
            row = Value::Array(level);
        }
        let m = err(json!({ "instances": [row] }), &single(DataType::F32, &[-1, -1]));
        assert!(m.contains("is ragged"), "{m}");
    }

    #[test]
    fn instances_must_share_a_row_shape() {
        let body = json!({"instances": [[1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 3, 4, 5]]});
        let m = err(body, &single(DataType::F32, &[-1, 4]));
        assert_eq!(m, "instance 3 of input `x` has shape [5], instance 0 has [4]");
        let m = err(
            json!({"instances": [[[1, 2], [3]]]}),
            &single(DataType::F32, &[-1, 2, 2]),
        );
        assert!(m.starts_with("instance 0 of input `x` is ragged"), "{m}");
    }

    #[test]
    fn element_errors_name_the_instance() {
        let m = err(
            json!({"instances": [[1, 2], [3, 300]]}),
            &single(DataType::U8, &[-1, 2]),
        );
        assert_eq!(
            m,
            "instance 1 of input `x`: element 1 is 300, out of range for UINT8"
        );
    }

    #[test]
    fn missing_or_empty_instances_are_refused() {
        let sig = single(DataType::F32, &[-1]);
        let want = "request body must be a JSON object with an `instances` array";
        assert_eq!(err(json!({"inputs": [1]}), &sig), want);
        assert_eq!(err(json!([1, 2]), &sig), want);
        assert_eq!(err(json!({"instances": 1}), &sig), want);
        assert_eq!(
            err(json!({"instances": []}), &sig),
            "`instances` is empty; send at least one instance"
        );
    }

    fn response(outputs: Vec<Tensor>) -> InferResponse {
        InferResponse {
            model_name: "m".into(),
            model_version: None,
            id: None,
            outputs,
            batch_id: "b7".into(),
        }
    }

    #[test]
    fn single_output_predictions_are_rows() {
        let scalars = response(vec![tensor("y", &[3], TensorData::I64(vec![1, 2, 3]))]);
        assert_eq!(wire(&scalars), json!({"predictions": [1, 2, 3], "batchId": "b7"}));
        let rows = response(vec![tensor(
            "y",
            &[2, 1, 2],
            TensorData::F32(vec![0.1, 0.2, 0.3, 0.4]),
        )]);
        assert_eq!(predictions(&rows), vec![json!([[0.1, 0.2]]), json!([[0.3, 0.4]])]);
    }

    #[test]
    fn multi_output_predictions_are_objects() {
        let resp = response(vec![
            tensor(
                "label",
                &[2],
                TensorData::Bytes(vec![b"cat".to_vec(), b"dog".to_vec()].into()),
            ),
            tensor("p", &[2, 2], TensorData::F64(vec![0.9, 0.1, 0.2, 0.8])),
        ]);
        let want = vec![
            json!({"label": "cat", "p": [0.9, 0.1]}),
            json!({"label": "dog", "p": [0.2, 0.8]}),
        ];
        assert_eq!(predictions(&resp), want);
    }

    #[test]
    fn decode_then_encode_round_trips_rows() {
        let body = json!({"instances": [[[1, 2]], [[3, 4]]]});
        let req = decode(body.clone(), &single(DataType::I32, &[-1, 1, 2])).unwrap();
        let pred = predictions(&response(req.inputs));
        assert_eq!(Value::Array(pred), body["instances"]);
    }
}
