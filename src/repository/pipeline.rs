//! Building a pipeline's version: its tokenizer files read, its steps'
//! signatures joined into its own, and (without an ONNX file of its own) a
//! batcher with no sessions that holds its statistics, metrics and settings.

use std::path::Path;
use std::sync::Arc;

use super::load::LoadError;
use super::registry::Registry;
use crate::batcher::{Batcher, Batching};
use crate::model::pipeline::{tokenize::Tokenize, Pipeline, Steps};
use crate::model::{Memory, ModelHandle};
use crate::pool::{ModelWorkers, Pool};
use crate::settings::pipeline::StepKind;
use crate::settings::ModelSettings;
use crate::tensor::{Signature, TensorSpec};

/// How a pipeline of the repository reaches its steps' models: through the
/// registry (weakly: a pipeline does not keep the registry alive).
pub fn steps(registry: &Arc<Registry>, budget: Option<crate::budget::ByteBudget>) -> Steps {
    let (a, b) = (Arc::downgrade(registry), Arc::downgrade(registry));
    Steps {
        serve: Arc::new(move |name, version, arrival| {
            let (registry, name, version) = (a.upgrade(), name.to_string(), version.map(str::to_string));
            Box::pin(async move {
                let registry = registry.ok_or(crate::error::Error::ShuttingDown)?;
                registry.serve(&name, version.as_deref(), arrival).await
            })
        }),
        ready: Arc::new(move |name, version| b.upgrade()?.ready(name, version).ok()),
        budget,
    }
}

/// Whether the settings describe a pipeline with no ONNX file of its own.
pub fn without_file(settings: &ModelSettings) -> bool {
    settings
        .pipeline
        .as_ref()
        .is_some_and(|p| !p.steps.iter().any(|s| s.kind == StepKind::Own))
}

/// The pipeline of `settings` (which has one) in the folder `dir`; `own`
/// is the folder's ONNX signature when a step runs it.
pub fn pipeline(
    dir: &Path,
    settings: &ModelSettings,
    own: Option<&Signature>,
    steps: Steps,
) -> Result<Pipeline, LoadError> {
    let p = settings.pipeline.as_ref().expect("a pipeline's settings");
    let declared = declared(settings);
    let tokenizer = |t: &crate::settings::pipeline::TokenizerStep| Tokenize::load(&dir.join(&t.file), t);
    Pipeline::build(p, own, &declared, Some(steps), tokenizer).map_err(LoadError::Files)
}

/// A pipeline with no ONNX file of its own, ready to serve.
pub fn build(
    pool: &Pool,
    name: &str,
    dir: &Path,
    settings: ModelSettings,
    steps: Steps,
) -> Result<ModelHandle, LoadError> {
    let pipeline = pipeline(dir, &settings, None, steps)?;
    let (workers, _) = ModelWorkers::spawn(name, Vec::new(), pool, Vec::new(), Vec::new());
    let why = "a pipeline: each step batches in its own model".to_string();
    let batching = Batching::new(name, &pipeline.signature, Err(why));
    let batcher = Batcher::spawn(
        name,
        settings.version.as_deref(),
        settings.batching,
        Arc::new(workers),
        Vec::new(),
        None,
        batching,
    );
    let names = |specs: &[TensorSpec]| {
        specs
            .iter()
            .map(|t| t.name.as_str())
            .collect::<Vec<_>>()
            .join(",")
    };
    let steps_text: Vec<String> = settings
        .pipeline
        .iter()
        .flat_map(|p| &p.steps)
        .map(|s| s.kind.describe())
        .collect();
    tracing::info!(
        model = %name,
        version = settings.version.as_deref().unwrap_or("-"),
        inputs = %names(&pipeline.signature.inputs),
        outputs = %names(&pipeline.signature.outputs),
        steps = %steps_text.join(" → "),
        "pipeline ready"
    );
    let signature = pipeline.signature.clone();
    let handle = ModelHandle::new(
        name.to_string(),
        settings,
        signature,
        "pipeline (its steps run on their own models' sessions)".into(),
        Memory::default(),
        batcher,
    );
    Ok(handle.with_pipeline(pipeline))
}

/// The tensors `settings` declares with a datatype and shape (`inputs`,
/// `outputs`; a `config.pbtxt`'s `input` and `output`).
fn declared(settings: &ModelSettings) -> Signature {
    let specs = |list: &Option<Vec<crate::settings::DeclaredTensor>>| {
        list.iter()
            .flatten()
            .filter_map(|d| {
                Some(TensorSpec {
                    name: d.name.clone(),
                    dtype: d.datatype?,
                    shape: d.shape.clone()?,
                    dim_names: Vec::new(),
                })
            })
            .collect()
    };
    Signature {
        inputs: specs(&settings.declared.inputs),
        outputs: specs(&settings.declared.outputs),
    }
}

/// What `sluice check` says of a pipeline folder (`own`: its ONNX file's
/// signature, when a step runs it): its steps, and its tensors when every
/// step's are known without the repository; `Err` names a tokenizer file
/// that does not load or a wiring that cannot be.
pub fn report(dir: &Path, settings: &ModelSettings, own: Option<&Signature>) -> Result<Vec<String>, String> {
    let Some(p) = settings.pipeline.as_ref() else {
        return Ok(Vec::new());
    };
    let steps: Vec<String> = p
        .steps
        .iter()
        .map(|s| match s.name.contains(&s.kind.describe()) {
            true => s.name.clone(),
            false => format!("{} ({})", s.name, s.kind.describe()),
        })
        .collect();
    let mut lines = vec![format!("pipeline: {}", steps.join(" → "))];
    let tokenizer = |t: &crate::settings::pipeline::TokenizerStep| Tokenize::load(&dir.join(&t.file), t);
    // Steps that are models of the repository: their tensors are known
    // once the repository serves them; the tokenizers are checked here.
    if p.steps.iter().any(|s| matches!(s.kind, StepKind::Model { .. })) {
        for s in &p.steps {
            if let StepKind::Tokenizer(t) = &s.kind {
                tokenizer(t).map_err(|e| format!("{}: {e}", s.name))?;
            }
        }
        lines.push("pipeline tensors: from its step models, once the repository serves them".into());
        return Ok(lines);
    }
    let built = Pipeline::build(p, own, &declared(settings), None, tokenizer)?;
    for (kind, specs) in [
        ("input", &built.signature.inputs),
        ("output", &built.signature.outputs),
    ] {
        for t in specs {
            lines.push(format!(
                "pipeline {kind} {} {} {:?}",
                t.name,
                t.dtype.as_str(),
                t.shape
            ));
        }
    }
    Ok(lines)
}
