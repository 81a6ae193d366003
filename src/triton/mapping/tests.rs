use super::*;
use crate::settings::ExecutionProvider;
use std::time::Duration;

fn mapped(text: &str) -> Result<ModelSettings, String> {
    let c = crate::triton::config::from_text(text).unwrap();
    settings(&c, "m", "1", Path::new("1/model.onnx"), &ModelDefaults::default())
}

#[test]
fn the_example_config_maps_onto_settings() {
    let s = mapped(include_str!(
        "../../../tests/fixtures/triton/model_repository/simple/config.pbtxt"
    ))
    .unwrap_err();
    // Its name is "simple": under another folder name it is refused, as Triton does.
    assert!(
        s.contains("`name` is \"simple\" but the model folder is `m`"),
        "{s}"
    );
    let c = crate::triton::config::from_text(include_str!(
        "../../../tests/fixtures/triton/model_repository/simple/config.pbtxt"
    ))
    .unwrap();
    let s = settings(
        &c,
        "simple",
        "1",
        Path::new("1/model.onnx"),
        &ModelDefaults::default(),
    )
    .unwrap();
    assert_eq!(s.batching.max_batch_size, 8);
    assert_eq!(
        s.batching.max_batch_time,
        Duration::ZERO,
        "no dynamic_batching: no wait"
    );
    assert_eq!(s.version.as_deref(), Some("1"));
    let inputs = s.declared.inputs.unwrap();
    assert_eq!(inputs[0].shape, Some(vec![-1, 16]), "batch dim in front");
    assert_eq!(inputs[0].datatype, Some(crate::tensor::DataType::I32));
    assert!(s.ignored.is_empty(), "{:?}", s.ignored);
}

#[test]
fn dynamic_batching_and_instances() {
    let s = mapped(
        r#"max_batch_size: 0
           dynamic_batching { max_queue_delay_microseconds: 2500 priority_levels: 3 default_priority_level: 2
             preferred_batch_size: [4]
             default_queue_policy { max_queue_size: 7 default_timeout_microseconds: 1500000 timeout_action: DELAY } }
           instance_group [ { count: 2 kind: KIND_CPU }, { count: 1 kind: KIND_CPU } ]
           parameters { key: "intra_op_thread_count" value: { string_value: "3" } }
           parameters { key: "execution_mode" value: { string_value: "1" } }
           input [ { name: "x" data_type: TYPE_STRING dims: [ 2, 3 ] } ]"#,
    )
    .unwrap();
    let b = s.batching;
    assert_eq!(b.max_batch_size, 0);
    assert_eq!(b.max_batch_time, Duration::from_micros(2500));
    assert_eq!((b.priority_levels, b.default_priority), (3, 2));
    assert_eq!(b.max_queue_size, 7);
    assert_eq!(b.timeout, Duration::from_millis(1500));
    assert_eq!(s.instances, 3);
    assert_eq!(s.execution_provider, ExecutionProvider::Cpu);
    assert_eq!(s.intra_op_threads, Some(3));
    let inputs = s.declared.inputs.unwrap();
    assert_eq!(
        inputs[0].shape,
        Some(vec![2, 3]),
        "max_batch_size 0: dims are the whole shape"
    );
    assert_eq!(inputs[0].datatype, Some(crate::tensor::DataType::Bytes));
    let ignored = s.ignored.join("\n");
    for field in [
        "preferred_batch_size",
        "timeout_action: DELAY",
        "parameters.execution_mode",
    ] {
        assert!(ignored.contains(field), "{field} not named in:\n{ignored}");
    }
    // Honoured, not named: the classification extension's labels (read by `triton::settings_for`).
    assert!(!ignored.contains("label_filename"), "{ignored}");
}

#[test]
fn what_sluice_does_not_honour_is_named() {
    let s = mapped(
        r#"optimization { execution_accelerators { gpu_execution_accelerator : [ { name : "tensorrt" } ] } }
           response_cache { enable: true }
           output [ { name: "y" data_type: TYPE_FP32 dims: [ 3 ] label_filename: "labels.txt" } ]"#,
    )
    .unwrap();
    let ignored = s.ignored.join("\n");
    for field in ["gpu_execution_accelerator", "response_cache"] {
        assert!(ignored.contains(field), "{field} not named in:\n{ignored}");
    }
}

#[test]
fn other_platforms_and_bad_values_are_refused() {
    for (text, says) in [
        (
            "platform: \"pytorch_libtorch\"",
            "`platform` is \"pytorch_libtorch\"",
        ),
        ("backend: \"python\"", "`backend` is \"python\""),
        ("max_batch_size: -1", "`max_batch_size` is -1"),
        ("instance_group [ { kind: KIND_GPU gpus: [ 99 ] } ]", "device_ids"),
    ] {
        let e = mapped(text).unwrap_err();
        assert!(e.contains(says), "{text}: {e}");
    }
    for (platform, ok) in [("onnxruntime_onnx", true), ("", true)] {
        assert_eq!(mapped(&format!("platform: {platform:?}")).is_ok(), ok);
    }
    assert!(mapped("backend: \"onnxruntime\"").is_ok());
}

const ENSEMBLE: &str = r#"name: "m" platform: "ensemble" max_batch_size: 4
input [ { name: "A" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "C" data_type: TYPE_FP32 dims: [ 2 ] } ]
ensemble_scheduling { step [
  { model_name: "first" model_version: -1 input_map { key: "x" value: "A" } output_map { key: "y" value: "B" } },
  { model_name: "second" model_version: 3 input_map { key: "x" value: "B" } output_map { key: "y" value: "C" } } ] }"#;

#[test]
fn an_ensemble_maps_onto_a_pipeline() {
    use crate::settings::pipeline::StepKind;
    let s = mapped(ENSEMBLE).unwrap();
    let p = s.pipeline.unwrap();
    assert_eq!(p.outputs, vec!["C".to_string()]);
    assert_eq!(
        p.steps[0].kind,
        StepKind::Model {
            model: "first".into(),
            version: None
        }
    );
    assert_eq!(
        p.steps[1].kind,
        StepKind::Model {
            model: "second".into(),
            version: Some("3".into())
        }
    );
    assert_eq!(p.steps[1].inputs["x"], "B");
    assert_eq!(p.steps[0].name, "step 0 (model `first`)");
    // Its declared tensors carry the batch dim.
    assert_eq!(s.declared.inputs.unwrap()[0].shape, Some(vec![-1, 2]));
}

#[test]
fn ensemble_mistakes_name_the_field() {
    let e = mapped(&ENSEMBLE.replace("platform: \"ensemble\"", "")).unwrap_err();
    assert!(e.contains("needs `platform: \"ensemble\"`"), "{e}");
    let e = mapped(&ENSEMBLE.replace("value: \"B\" } },", "value: \"Q\" } },")).unwrap_err();
    assert!(e.contains("tensor `B` is read by a step"), "{e}");
    let e = mapped(&ENSEMBLE.replace("model_version: 3", "model_version: -7")).unwrap_err();
    assert!(
        e.contains("`ensemble_scheduling.step[1]`: `model_version` is -7"),
        "{e}"
    );
    let e = mapped(r#"name: "m" platform: "ensemble""#).unwrap_err();
    assert!(e.contains("no `ensemble_scheduling`"), "{e}");
}
