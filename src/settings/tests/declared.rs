//! Declared `inputs` and `outputs` (MLServer's and Triton's) against the ONNX file's signature.

use super::*;

#[test]
fn declared_inputs_and_outputs_parse_and_check_against_the_signature() {
    use crate::tensor::{Signature, TensorSpec};
    let s = ok(
        r#"{"inputs": [{"name": "input", "datatype": "FP32", "shape": [-1, 64], "parameters": {}}],
                   "outputs": [{"name": "label", "datatype": "INT64"}, {"name": "probabilities", "shape": [10]}]}"#,
    );
    let spec = |name: &str, dtype, shape: &[i64]| TensorSpec {
        name: name.into(),
        dtype,
        shape: shape.to_vec(),
        dim_names: vec![],
    };
    let sig = Signature {
        inputs: vec![spec("input", DataType::F32, &[-1, 64])],
        outputs: vec![
            spec("label", DataType::I64, &[-1]),
            spec("probabilities", DataType::F32, &[-1, 10]),
        ],
    };
    s.check_declared(&sig).unwrap();
    let bad = ok(
        r#"{"inputs": [{"name": "input", "datatype": "FP64", "shape": [-1, 8]}, {"name": "extra"}],
                     "outputs": [{"name": "label", "shape": [1, 2, 3]}]}"#,
    );
    let err = bad.check_declared(&sig).unwrap_err();
    for part in [
        "`inputs[0].datatype` of `input` is FP64, but the ONNX file says FP32",
        "`inputs[0].shape` of `input` is [-1, 8], but the ONNX file says [-1, 64]",
        "`inputs[1]` declares `extra`, which the ONNX file does not have (its inputs: `input`)",
        "`outputs[0].shape` of `label` is [1, 2, 3]",
    ] {
        assert!(err.contains(part), "{part} not in {err}");
    }
    assert!(err.starts_with("model-settings.json declares"), "{err}");
    // From a config.pbtxt, the message names that file and its fields.
    let mut from_triton = bad.clone();
    from_triton.triton_config = Some(serde_json::json!({}));
    let err = from_triton.check_declared(&sig).unwrap_err();
    assert!(err.starts_with("config.pbtxt declares"), "{err}");
    assert!(err.contains("`input[0].data_type` of `input` is FP64"), "{err}");
    assert!(err.contains("`input[0].dims` of `input` is [-1, 8]"), "{err}");
    assert_eq!(
        problems(r#"{"inputs": [{"datatype": "FLOAT", "shape": [1.5]}], "outputs": {}}"#),
        [
            "`inputs[0].name` is missing",
            "`outputs` must be an array of {\"name\", \"datatype\", \"shape\"} objects, got {}",
        ]
    );
}
