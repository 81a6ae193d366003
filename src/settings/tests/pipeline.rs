//! `model-settings.json`'s `pipeline` object and `op_libraries`.

use super::*;
use crate::settings::pipeline::{PoolingMode, StepKind};

#[test]
fn a_pipeline_object_gives_its_steps_and_wiring() {
    let s = ok(r#"{"pipeline": {"steps": [
        {"tokenizer": {"max_length": 128}},
        {"name": "enc", "model": "minilm", "version": 2,
         "inputs": {"input_ids": "input_ids", "attention_mask": "attention_mask"},
         "outputs": {"last_hidden_state": "token_embeddings"}},
        {"pooling": {"mode": "cls", "normalize": true}}
    ], "outputs": ["embedding"]}, "op_libraries": ["ext"]}"#);
    let p = s.pipeline.unwrap();
    assert_eq!(p.steps.len(), 3);
    let StepKind::Tokenizer(t) = &p.steps[0].kind else {
        panic!()
    };
    assert_eq!(
        (t.file.to_str(), t.max_length),
        (Some("tokenizer.json"), Some(128))
    );
    // A built-in step's tensors default to pipeline tensors of their own names.
    assert_eq!(p.steps[0].inputs["text"], "text");
    assert_eq!(p.steps[0].name, "step 0 (tokenizer)");
    assert_eq!(
        p.steps[1].kind,
        StepKind::Model {
            model: "minilm".into(),
            version: Some("2".into())
        }
    );
    assert_eq!(p.steps[1].name, "enc");
    let StepKind::Pooling(pool) = p.steps[2].kind else {
        panic!()
    };
    assert_eq!((pool.mode, pool.normalize), (PoolingMode::Cls, true));
    assert_eq!(p.inputs(), vec!["text".to_string()]);
    assert_eq!(s.op_libraries, vec!["ext".to_string()]);
}

#[test]
fn pipeline_mistakes_name_the_field() {
    let p = problems(r#"{"pipeline": {"steps": [{"modle": "x"}], "outputs": ["y"]}}"#);
    assert!(
        p.iter()
            .any(|m| m.contains("`pipeline.steps[0].modle` is an unknown field")),
        "{p:?}"
    );
    let p = problems(r#"{"pipeline": {"steps": [{"model": "a", "pooling": {}}], "outputs": ["y"]}}"#);
    assert!(p.iter().any(|m| m.contains("exactly one of `model`")), "{p:?}");
    let p = problems(r#"{"pipeline": {"steps": [{"model": "a", "inputs": {"x": "X"}}], "outputs": ["Y"]}}"#);
    assert!(
        p.iter()
            .any(|m| m.contains("`pipeline.steps[0].outputs` is missing")),
        "{p:?}"
    );
    let p =
        problems(r#"{"pipeline": {"steps": [{"model": "a", "inputs": {"x": "X"}, "outputs": {"y": "Y"}}]}}"#);
    assert!(
        p.iter().any(|m| m.contains("`pipeline.outputs` is missing")),
        "{p:?}"
    );
    let p = problems(
        r#"{"pipeline": {"steps": [{"model": "a", "inputs": {"x": "X"}, "outputs": {"y": "Y"}}], "outputs": ["Z"]}}"#,
    );
    assert!(
        p.iter().any(|m| m.contains("output `Z` is made by no step")),
        "{p:?}"
    );
    let p = problems(
        r#"{"pipeline": {"steps": [
        {"model": "a", "inputs": {"x": "X"}, "outputs": {"y": "Y"}},
        {"model": "b", "inputs": {"x": "X"}, "outputs": {"y": "Y"}}], "outputs": ["Y"]}}"#,
    );
    assert!(
        p.iter().any(|m| m.contains("tensor `Y` is made by both")),
        "{p:?}"
    );
    let p = problems(
        r#"{"pipeline": {"steps": [{"tokenizer": {}, "inputs": {"txt": "T"}}], "outputs": ["input_ids"]}}"#,
    );
    assert!(
        p.iter().any(|m| m.contains("the step has no tensor `txt`")),
        "{p:?}"
    );
    let p = problems(
        r#"{"pipeline": {"steps": [{"tokenizer": {"file": "../t.json"}}], "outputs": ["input_ids"]}}"#,
    );
    assert!(
        p.iter().any(|m| m.contains("`pipeline.steps[0].tokenizer.file`")),
        "{p:?}"
    );
    let p =
        problems(r#"{"pipeline": {"steps": [{"tokenizer": {"dtype": "FP32"}}], "outputs": ["input_ids"]}}"#);
    assert!(
        p.iter()
            .any(|m| m.contains("`pipeline.steps[0].tokenizer.dtype` must be \"INT64\" or \"INT32\"")),
        "{p:?}"
    );
    let s = ok(r#"{"pipeline": {"steps": [{"tokenizer": {"dtype": "INT32"}}], "outputs": ["input_ids"]}}"#);
    let StepKind::Tokenizer(t) = &s.pipeline.unwrap().steps[0].kind else {
        panic!()
    };
    assert!(t.int32);
    let p = problems(r#"{"op_libraries": "ext"}"#);
    assert!(p.iter().any(|m| m.contains("`op_libraries` must be")), "{p:?}");
}

#[test]
fn sentence_transformers_pooling_configs() {
    use crate::settings::pipeline::pooling_mode_of;
    let mode = |j: &str| pooling_mode_of(&serde_json::from_str(j).unwrap());
    assert_eq!(
        mode(r#"{"pooling_mode_mean_tokens": true}"#),
        Ok(PoolingMode::Mean)
    );
    assert_eq!(
        mode(r#"{"pooling_mode_cls_token": true, "pooling_mode_mean_tokens": false}"#),
        Ok(PoolingMode::Cls)
    );
    assert!(mode(r#"{}"#).unwrap_err().contains("no `pooling_mode_*`"));
    assert!(
        mode(r#"{"pooling_mode_cls_token": true, "pooling_mode_max_tokens": true}"#)
            .unwrap_err()
            .contains("2 pooling modes")
    );
}
