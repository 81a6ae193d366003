use serde_json::json;

use super::*;
use crate::tensor::TensorSpec;

fn spec(name: &str, dtype: DataType, shape: &[i64], names: &[&str]) -> TensorSpec {
    TensorSpec {
        name: name.into(),
        dtype,
        shape: shape.to_vec(),
        dim_names: names.iter().map(|s| s.to_string()).collect(),
    }
}

/// MiniLM's signature.
fn minilm() -> Signature {
    let i = |n: &str| spec(n, DataType::I64, &[-1, -1], &["batch", "sequence"]);
    Signature {
        inputs: vec![i("input_ids"), i("attention_mask"), i("token_type_ids")],
        outputs: vec![spec(
            "last_hidden_state",
            DataType::F32,
            &[-1, -1, 384],
            &["batch", "sequence", ""],
        )],
    }
}

fn values(v: serde_json::Value) -> BTreeMap<String, Value> {
    serde_json::from_value(v).unwrap()
}

fn all_three() -> Padding {
    Padding::new(
        &minilm(),
        &values(json!({"input_ids": 0, "attention_mask": 0, "token_type_ids": 0})),
    )
    .unwrap()
    .unwrap()
}

fn ids(rows: usize, len: usize, start: i64) -> Tensor {
    let v = (0..(rows * len) as i64).map(|x| x + start).collect();
    Tensor::new("input_ids", vec![rows, len], TensorData::I64(v)).unwrap()
}

#[test]
fn no_padding_is_none() {
    assert_eq!(Padding::new(&minilm(), &BTreeMap::new()).unwrap(), None);
}

#[test]
fn minilm_pads_the_sequence_and_cuts_the_output_back() {
    let p = all_three();
    assert_eq!(p.symbols(), ["sequence"]);
    let a = vec![ids(1, 2, 1), ids(1, 2, 1), ids(1, 2, 1)];
    let b = vec![ids(2, 3, 10), ids(2, 3, 10), ids(2, 3, 10)];
    let (ka, la) = p.measure(&a).unwrap();
    let (kb, lb) = p.measure(&b).unwrap();
    assert_eq!(ka, kb, "different lengths, same key");
    assert_eq!((la.clone(), lb.clone()), (vec![2], vec![3]));
    let batch = p.concat(&[&a, &b], &[3]);
    assert_eq!(batch[0].shape, vec![3, 3]);
    assert_eq!(
        batch[0].data,
        TensorData::I64(vec![1, 2, 0, 10, 11, 12, 13, 14, 15])
    );
    assert!((p.ratio(&[&a, &b], &[3]) - 1.0 / 9.0).abs() < 1e-12);
    // An output [3, 3, 384]: each entry gets its own rows and length.
    let out = Tensor::new(
        "last_hidden_state",
        vec![3, 3, 384],
        TensorData::F32(vec![0.5; 3 * 3 * 384]),
    )
    .unwrap();
    p.check_outputs(std::slice::from_ref(&out), &[3]).unwrap();
    assert_eq!(
        p.split(std::slice::from_ref(&out), 0..1, &la)[0].shape,
        vec![1, 2, 384]
    );
    assert_eq!(
        p.split(std::slice::from_ref(&out), 1..3, &lb)[0].shape,
        vec![2, 3, 384]
    );
    let short = Tensor::new(
        "last_hidden_state",
        vec![3, 2, 384],
        TensorData::F32(vec![0.5; 3 * 2 * 384]),
    )
    .unwrap();
    let err = p.check_outputs(&[short], &[3]).unwrap_err();
    assert!(err.contains("padded to 3 in `sequence`"), "{err}");
}

#[test]
fn inputs_that_disagree_on_a_named_dim_are_refused() {
    let p = all_three();
    let mut mask = ids(1, 4, 0);
    mask.name = "attention_mask".into();
    let err = p.measure(&[ids(1, 3, 0), mask, ids(1, 3, 0)]).unwrap_err();
    assert!(
        err.contains("`attention_mask` has 4 in dim 1 (`sequence`)") && err.contains("`input_ids` has 3"),
        "{err}"
    );
}

#[test]
fn unknown_input_is_named() {
    let err = Padding::new(
        &minilm(),
        &values(json!({"input_ids": 0, "attention_mask": 0, "token_type_ids": 0, "mask": 0})),
    )
    .unwrap_err();
    assert!(
        err.contains("`padding.mask`: the model has no input `mask`")
            && err.contains("`input_ids`, `attention_mask`"),
        "{err}"
    );
}

#[test]
fn pad_values_must_fit_the_datatype() {
    let err = Padding::new(
        &minilm(),
        &values(json!({"input_ids": 0.5, "attention_mask": true, "token_type_ids": "0"})),
    )
    .unwrap_err();
    for want in [
        "`padding.input_ids` is 0.5, which does not fit INT64",
        "`padding.attention_mask` is true, which does not fit INT64",
        "`padding.token_type_ids` is \"0\", which does not fit INT64",
    ] {
        assert!(err.contains(want), "{want} not in: {err}");
    }
    let small = Signature {
        inputs: vec![spec("x", DataType::U8, &[-1, -1], &["b", "n"])],
        outputs: vec![],
    };
    let err = Padding::new(&small, &values(json!({"x": 256}))).unwrap_err();
    assert!(err.contains("an integer from 0 to 255"), "{err}");
    let err = Padding::new(&small, &values(json!({"x": -1}))).unwrap_err();
    assert!(err.contains("`padding.x` is -1"), "{err}");
    assert!(Padding::new(&small, &values(json!({"x": 255})))
        .unwrap()
        .is_some());
}

#[test]
fn an_input_without_a_named_dynamic_dim_cannot_be_padded() {
    let sig = Signature {
        inputs: vec![
            spec("fixed", DataType::F32, &[-1, 4], &["batch", ""]),
            spec("unnamed", DataType::F32, &[-1, -1], &["batch", ""]),
        ],
        outputs: vec![],
    };
    let err = Padding::new(&sig, &values(json!({"fixed": 0, "unnamed": 0}))).unwrap_err();
    assert!(
        err.contains("`padding.fixed`: input `fixed` (shape [-1, 4]) has no named dynamic dim"),
        "{err}"
    );
    assert!(err.contains("`padding.unnamed`: input `unnamed`"), "{err}");
}

#[test]
fn an_unpadded_input_with_a_padded_dim_is_a_mistake() {
    let err = Padding::new(&minilm(), &values(json!({"input_ids": 0, "attention_mask": 0}))).unwrap_err();
    assert!(
        err.contains("input `token_type_ids` has the padded dim `sequence` (dim 1) but no pad value"),
        "{err}"
    );
}

#[test]
fn an_output_dim_padding_changes_but_cannot_cut_is_refused() {
    let mut sig = minilm();
    sig.outputs
        .push(spec("other", DataType::F32, &[-1, -1], &["batch", "unk__7"]));
    let err = Padding::new(
        &sig,
        &values(json!({"input_ids": 0, "attention_mask": 0, "token_type_ids": 0})),
    )
    .unwrap_err();
    assert!(
        err.contains(
            "output `other` (shape [-1, -1]) has dynamic dim 1 (`unk__7`), which is not a padded dim"
        ),
        "{err}"
    );
}
