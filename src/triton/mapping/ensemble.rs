//! Triton's `ensemble_scheduling` (platform `ensemble`) as a pipeline: each
//! `step` runs its `model_name` at `model_version` (-1: the one that
//! serves), `input_map` and `output_map` wire it to the ensemble's tensors.

use std::collections::BTreeMap;

use crate::protocol::grpc::inference::{ModelConfig, ModelEnsembling};
use crate::settings::pipeline::{PipelineSettings, Step, StepKind};

/// Triton's platform name of an ensemble.
pub const PLATFORM: &str = "ensemble";

/// The pipeline of an ensemble's `ensemble_scheduling`; errors name the field.
pub fn pipeline(config: &ModelConfig, e: &ModelEnsembling) -> Result<PipelineSettings, String> {
    let mut steps = Vec::new();
    for (i, s) in e.step.iter().enumerate() {
        let at = format!("`ensemble_scheduling.step[{i}]`");
        if s.model_name.is_empty() {
            return Err(format!(
                "{at}: `model_name` is empty: name the model the step runs"
            ));
        }
        if !s.model_namespace.is_empty() {
            return Err(format!(
                "{at}: `model_namespace` is not supported: sluice has one namespace"
            ));
        }
        let version = match s.model_version {
            v if v > 0 => Some(v.to_string()),
            -1 | 0 => None,
            v => {
                return Err(format!(
                    "{at}: `model_version` is {v}: -1 (the latest) or a version number"
                ))
            }
        };
        if s.input_map.is_empty() || s.output_map.is_empty() {
            return Err(format!(
                "{at}: `input_map` and `output_map` must each map at least one tensor"
            ));
        }
        let map = |m: &std::collections::HashMap<String, String>| -> BTreeMap<String, String> {
            m.iter().map(|(a, b)| (a.clone(), b.clone())).collect()
        };
        steps.push(Step {
            name: format!("step {i} (model `{}`)", s.model_name),
            kind: StepKind::Model {
                model: s.model_name.clone(),
                version,
            },
            inputs: map(&s.input_map),
            outputs: map(&s.output_map),
        });
    }
    let p = PipelineSettings {
        steps,
        outputs: config.output.iter().map(|o| o.name.clone()).collect(),
    };
    let mut problems = p.check();
    let declared: Vec<&str> = config.input.iter().map(|i| i.name.as_str()).collect();
    for t in p.inputs() {
        if !declared.contains(&t.as_str()) {
            problems.push(format!(
                "tensor `{t}` is read by a step but is neither an `input` of the ensemble nor a step's output"
            ));
        }
    }
    match problems.is_empty() {
        true => Ok(p),
        false => Err(format!("`ensemble_scheduling`: {}", problems.join("; "))),
    }
}
