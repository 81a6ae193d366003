//! A pipeline: steps wired by tensor name. A step runs as soon as its
//! inputs exist, so independent steps run at once; a model step goes
//! through that model's own batcher (its batching, queue, deadline and
//! statistics), found through [`Steps`] at each request so that a reload of
//! a step is picked up. Tensors move from step to step; one read by
//! several steps is copied for all but the last.

pub mod pool;
pub mod tokenize;

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use futures_util::stream::{FuturesUnordered, StreamExt};

use super::ModelHandle;
use crate::error::{Error, Result};
use crate::protocol::{InferRequest, InferResponse, Schedule};
use crate::settings::pipeline::{PipelineSettings, PoolingStep, StepKind};
use crate::tensor::{Signature, Tensor, TensorSpec};

/// A boxed future of a step model's handle.
pub type HandleFuture = Pin<Box<dyn Future<Output = Result<Arc<ModelHandle>>> + Send>>;

/// The model's handle for a request arrived at the instant.
pub type Serve = Arc<dyn Fn(&str, Option<&str>, Instant) -> HandleFuture + Send + Sync>;

/// The model's handle if it serves now.
pub type ReadyNow = Arc<dyn Fn(&str, Option<&str>) -> Option<Arc<ModelHandle>> + Send + Sync>;

/// How a pipeline reaches the models of its steps; the repository gives it
/// (the model layer does not see the registry).
#[derive(Clone)]
pub struct Steps {
    /// The model's handle for a request arrived at the instant, loading it
    /// when it is not resident.
    pub serve: Serve,
    /// The model's handle if it serves now (signatures, at load).
    pub ready: ReadyNow,
    /// The server's byte budget: the tensors steps make are held in it
    /// while the request runs, as the request's own are.
    pub budget: Option<crate::budget::ByteBudget>,
}

/// A loaded pipeline.
pub struct Pipeline {
    steps: Vec<Ready>,
    /// The tensors it answers with by default.
    outputs: Vec<String>,
    /// Its inputs and outputs as clients see them.
    pub signature: Signature,
    /// Every tensor of the pipeline (a request may ask for any as an output).
    tensors: Vec<String>,
    models: Option<Steps>,
}

struct Ready {
    name: String,
    run: Runner,
    /// (step tensor, pipeline tensor)
    inputs: Vec<(String, String)>,
    outputs: Vec<(String, String)>,
}

enum Runner {
    Model { model: String, version: Option<String> },
    Own,
    Tokenizer(Arc<tokenize::Tokenize>),
    Pooling(PoolingStep),
}

/// What one step answered, or why it failed.
type StepResult = (usize, Result<Vec<Tensor>>);

impl Pipeline {
    /// Builds `settings`' steps. `own` is the folder's ONNX signature (for
    /// an `Own` step); `declared` gives tensors' specs the steps cannot
    /// (a `config.pbtxt`'s or `model-settings.json`'s `inputs` and
    /// `outputs`); `tokenizer` loads a tokenizer step's file.
    pub fn build(
        settings: &PipelineSettings,
        own: Option<&Signature>,
        declared: &Signature,
        models: Option<Steps>,
        tokenizer: impl Fn(
            &crate::settings::pipeline::TokenizerStep,
        ) -> std::result::Result<tokenize::Tokenize, String>,
    ) -> std::result::Result<Pipeline, String> {
        let mut specs: HashMap<String, TensorSpec> = HashMap::new();
        let mut steps = Vec::new();
        for s in &settings.steps {
            let run = match &s.kind {
                StepKind::Model { model, version } => Runner::Model {
                    model: model.clone(),
                    version: version.clone(),
                },
                StepKind::Own => Runner::Own,
                StepKind::Tokenizer(t) => {
                    Runner::Tokenizer(Arc::new(tokenizer(t).map_err(|e| format!("{}: {e}", s.name))?))
                }
                StepKind::Pooling(p) => Runner::Pooling(*p),
            };
            steps.push(Ready {
                name: s.name.clone(),
                run,
                inputs: s.inputs.iter().map(|(a, b)| (a.clone(), b.clone())).collect(),
                outputs: s.outputs.iter().map(|(a, b)| (a.clone(), b.clone())).collect(),
            });
        }
        let mut p = Pipeline {
            steps,
            outputs: settings.outputs.clone(),
            signature: Signature::default(),
            tensors: Vec::new(),
            models,
        };
        // Each step's signature, in the order the steps can run.
        let order = settings
            .order()
            .map_err(|stuck| format!("steps wait on each other in a cycle: {stuck}"))?;
        for i in order {
            let sig = p.step_signature(i, own, &specs)?;
            let step = &p.steps[i];
            for (inner, outer) in &step.inputs {
                let Some(spec) = sig.as_ref().and_then(|s| s.input(inner)) else {
                    if let Some(sig) = &sig {
                        let names: Vec<&str> = sig.inputs.iter().map(|t| t.name.as_str()).collect();
                        return Err(format!(
                            "{}: {} has no input `{inner}` (its inputs: `{}`)",
                            step.name,
                            settings.steps[i].kind.describe(),
                            names.join("`, `")
                        ));
                    }
                    continue;
                };
                specs.entry(outer.clone()).or_insert_with(|| named(spec, outer));
            }
            for (inner, outer) in &step.outputs {
                let spec = match &sig {
                    Some(sig) => sig.output(inner).ok_or_else(|| {
                        let names: Vec<&str> = sig.outputs.iter().map(|t| t.name.as_str()).collect();
                        format!(
                            "{}: {} has no output `{inner}` (its outputs: `{}`)",
                            step.name,
                            settings.steps[i].kind.describe(),
                            names.join("`, `")
                        )
                    })?,
                    None => continue,
                };
                specs.insert(outer.clone(), named(spec, outer));
            }
        }
        let find = |name: &String, list: &[TensorSpec], what: &str| {
            list.iter()
                .find(|t| &t.name == name)
                .cloned()
                .or_else(|| specs.get(name).cloned())
                .ok_or_else(|| {
                    format!(
                        "the datatype and shape of {what} `{name}` are unknown: its step's model is not loaded; \
                         declare it (`{what}s` in model-settings.json, `{what}` in config.pbtxt)"
                    )
                })
        };
        let inputs = settings
            .inputs()
            .iter()
            .map(|n| find(n, &declared.inputs, "input"))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let outputs = settings
            .outputs
            .iter()
            .map(|n| find(n, &declared.outputs, "output"))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        p.signature = Signature { inputs, outputs };
        p.tensors = settings.inputs();
        p.tensors
            .extend(settings.steps.iter().flat_map(|s| s.outputs.values().cloned()));
        Ok(p)
    }

    /// Step `i`'s signature: a built-in's, the folder's own, or its model's
    /// when that serves now (`None`: not known yet).
    fn step_signature(
        &self,
        i: usize,
        own: Option<&Signature>,
        specs: &HashMap<String, TensorSpec>,
    ) -> std::result::Result<Option<Signature>, String> {
        let step = &self.steps[i];
        let pair = |(inputs, outputs)| Some(Signature { inputs, outputs });
        Ok(match &step.run {
            Runner::Tokenizer(t) => pair(t.specs()),
            Runner::Pooling(_) => {
                let hidden = step.inputs.iter().find(|(s, _)| s == "token_embeddings");
                let dim = hidden
                    .and_then(|(_, t)| specs.get(t))
                    .and_then(|s| s.shape.last().copied())
                    .unwrap_or(-1);
                pair(pool::specs(dim))
            }
            Runner::Own => Some(
                own.cloned()
                    .ok_or_else(|| format!("{}: the folder has no ONNX file", step.name))?,
            ),
            Runner::Model { model, version } => self
                .models
                .as_ref()
                .and_then(|m| (m.ready)(model, version.as_deref()))
                .map(|h| h.client_signature().into_owned()),
        })
    }

    /// Whether a step runs the folder's own ONNX file.
    pub fn has_own_step(&self) -> bool {
        self.steps.iter().any(|s| matches!(s.run, Runner::Own))
    }

    /// The models its steps run, by name (residency, reports).
    pub fn step_models(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .steps
            .iter()
            .filter_map(|s| match &s.run {
                Runner::Model { model, .. } => Some(model.clone()),
                _ => None,
            })
            .collect();
        out.dedup();
        out
    }

    /// The tokenizer step, if the pipeline has one, and the pipeline
    /// tensor each of its outputs is, by the step's output name.
    pub fn tokenizer(&self) -> Option<(&tokenize::Tokenize, HashMap<&str, &str>)> {
        self.steps.iter().find_map(|s| match &s.run {
            Runner::Tokenizer(t) => {
                let names = s.outputs.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
                Some((t.as_ref(), names))
            }
            _ => None,
        })
    }

    /// Whether its last pooling step scales vectors to length 1.
    pub fn normalizes(&self) -> bool {
        self.steps.iter().rev().find_map(|s| match &s.run {
            Runner::Pooling(p) => Some(p.normalize),
            _ => None,
        }) == Some(true)
    }

    /// Runs a validated request through the steps; `own` is the pipeline's
    /// handle (for an `Own` step). Answers the requested outputs, which may
    /// name any tensor of the pipeline.
    /// With `tokenized`, the request holds its tokenizer step's outputs, and
    /// that step is skipped.
    pub async fn run(
        &self,
        own: &ModelHandle,
        req: InferRequest,
        arrival: Instant,
        tokenized: bool,
    ) -> Result<InferResponse> {
        let wanted = req.outputs.clone().unwrap_or_else(|| self.outputs.clone());
        if let Some(w) = wanted.iter().find(|w| !self.tensors.contains(w)) {
            return Err(Error::invalid(format!(
                "pipeline `{}` has no tensor `{w}`; its outputs are `{}`",
                own.name,
                self.outputs.join("`, `")
            )));
        }
        // How many more readers each tensor has (steps, then the answer).
        let mut readers: HashMap<&str, usize> = HashMap::new();
        for (_, t) in self.steps.iter().flat_map(|s| &s.inputs) {
            *readers.entry(t).or_default() += 1;
        }
        for w in &wanted {
            *readers.entry(w).or_default() += 1;
        }
        let mut have: HashMap<String, Tensor> = req.inputs.into_iter().map(|t| (t.name.clone(), t)).collect();
        let mut pending: Vec<usize> = (0..self.steps.len())
            .filter(|i| !(tokenized && matches!(self.steps[*i].run, Runner::Tokenizer(_))))
            .collect();
        let mut running: FuturesUnordered<Pin<Box<dyn Future<Output = StepResult> + Send + '_>>> =
            FuturesUnordered::new();
        let mut batch_id: Arc<str> = Arc::from("");
        // What the steps' tensors hold of the byte budget, until the answer.
        let mut held = Vec::new();
        loop {
            let (ready, waiting): (Vec<usize>, Vec<usize>) = pending
                .iter()
                .partition(|i| self.steps[**i].inputs.iter().all(|(_, t)| have.contains_key(t)));
            pending = waiting;
            for i in ready {
                let step = &self.steps[i];
                let mut inputs = Vec::with_capacity(step.inputs.len());
                for (inner, outer) in &step.inputs {
                    let left = readers.get_mut(outer.as_str()).expect("counted");
                    *left -= 1;
                    let mut t = match *left {
                        0 => have.remove(outer).expect("present"),
                        _ => have[outer].clone(),
                    };
                    t.name.clone_from(inner);
                    inputs.push(t);
                }
                let schedule = req.schedule;
                running.push(Box::pin(async move {
                    (i, self.step(i, own, inputs, schedule, arrival).await)
                }));
            }
            let Some((i, result)) = running.next().await else {
                break;
            };
            let step = &self.steps[i];
            let outputs = result.map_err(|e| in_step(e, &own.name, &step.name))?;
            if let Some(budget) = self.models.as_ref().and_then(|m| m.budget.as_ref()) {
                let bytes = outputs.iter().map(|t| t.data.heap_bytes()).sum();
                held.push(
                    budget
                        .reserve(bytes)
                        .map_err(|e| in_step(e, &own.name, &step.name))?,
                );
            }
            for mut t in outputs {
                if let Some((_, outer)) = step.outputs.iter().find(|(inner, _)| *inner == t.name) {
                    t.name.clone_from(outer);
                    have.insert(outer.clone(), t);
                }
            }
            if matches!(step.run, Runner::Model { .. } | Runner::Own) {
                batch_id = Arc::from(format!("{}:{i}", own.name));
            }
        }
        let mut outputs = Vec::with_capacity(wanted.len());
        for (i, w) in wanted.iter().enumerate() {
            // Moved out, unless the request names it again later.
            let t = match wanted[i + 1..].contains(w) {
                true => have.get(w).cloned(),
                false => have.remove(w),
            };
            outputs.push(t.ok_or_else(|| {
                Error::Internal(format!("pipeline `{}`: tensor `{w}` was never made", own.name))
            })?);
        }
        Ok(InferResponse {
            model_name: own.batcher().model().clone(),
            model_version: own.version().map(str::to_string),
            id: req.id,
            outputs,
            batch_id,
        })
    }

    /// Runs step `i` on its inputs (named as the step names them); answers
    /// its outputs named as the step names them. Boxed as `Send`: a step
    /// may itself be a pipeline, whose future would otherwise contain this one.
    fn step<'a>(
        &'a self,
        i: usize,
        own: &'a ModelHandle,
        inputs: Vec<Tensor>,
        schedule: Schedule,
        arrival: Instant,
    ) -> Pin<Box<dyn Future<Output = Result<Vec<Tensor>>> + Send + 'a>> {
        Box::pin(self.step_inner(i, own, inputs, schedule, arrival))
    }

    async fn step_inner(
        &self,
        i: usize,
        own: &ModelHandle,
        inputs: Vec<Tensor>,
        schedule: Schedule,
        arrival: Instant,
    ) -> Result<Vec<Tensor>> {
        let step = &self.steps[i];
        let request = |inputs| InferRequest {
            id: None,
            inputs,
            outputs: Some(step.outputs.iter().map(|(inner, _)| inner.clone()).collect()),
            schedule,
            classify: Vec::new(),
            sequence: None,
        };
        match &step.run {
            Runner::Tokenizer(t) => {
                let text = inputs.into_iter().next().expect("one input");
                let heavy = text.data.heap_bytes() > INLINE_WORK_BYTES;
                let t = t.clone();
                let tokens = off_the_runtime(heavy, move || t.run(&text)).await?;
                Ok(vec![
                    tokens.input_ids,
                    tokens.attention_mask,
                    tokens.token_type_ids,
                ])
            }
            Runner::Pooling(p) => {
                let heavy = inputs.iter().map(|t| t.data.heap_bytes()).sum::<usize>() > INLINE_WORK_BYTES;
                let p = *p;
                let pooled = off_the_runtime(heavy, move || {
                    let find = |n: &str| inputs.iter().find(|t| t.name == n).expect("mapped");
                    pool::run(p, find("token_embeddings"), find("attention_mask"))
                });
                Ok(vec![pooled.await?])
            }
            Runner::Own => Ok(Box::pin(own.run(request(inputs), arrival)).await?.outputs),
            Runner::Model { model, version } => {
                let models = self.models.as_ref().ok_or_else(|| {
                    Error::Internal(format!(
                        "pipeline `{}` was built without its step models",
                        own.name
                    ))
                })?;
                let handle = match (models.ready)(model, version.as_deref()) {
                    Some(h) => h,
                    None => (models.serve)(model, version.as_deref(), arrival).await?,
                };
                Ok(Box::pin(handle.infer(request(inputs), arrival)).await?.outputs)
            }
        }
    }
}

/// Bytes of input above which a built-in step runs on a blocking thread:
/// a request's texts or token vectors that take milliseconds to process
/// must not hold up the async workers that serve every other request.
const INLINE_WORK_BYTES: usize = 64 << 10;

/// Runs `work` where it belongs: inline when it is light, else on the
/// blocking pool.
async fn off_the_runtime<T: Send + 'static>(
    heavy: bool,
    work: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    match heavy {
        false => work(),
        true => tokio::task::spawn_blocking(work)
            .await
            .map_err(|e| Error::Internal(format!("a pipeline step panicked: {e}")))?,
    }
}

/// `spec` renamed to the pipeline tensor it is.
fn named(spec: &TensorSpec, name: &str) -> TensorSpec {
    TensorSpec {
        name: name.to_string(),
        ..spec.clone()
    }
}

/// A step's error, naming the pipeline and the step.
fn in_step(e: Error, pipeline: &str, step: &str) -> Error {
    let at = format!("pipeline `{pipeline}`, {step}");
    match e {
        Error::InvalidInput(m) => Error::InvalidInput(format!("{at}: {m}")),
        Error::ModelNotFound(m) => Error::ModelNotReady {
            name: pipeline.to_string(),
            reason: format!("{step}: its model `{m}` is not in the repository"),
        },
        Error::NotFound(m) => Error::ModelNotReady {
            name: pipeline.to_string(),
            reason: format!("{step}: {m}"),
        },
        Error::ModelNotReady { name, reason } => Error::ModelNotReady {
            name: pipeline.to_string(),
            reason: format!("{step}: model `{name}` is not ready: {reason}"),
        },
        Error::Runtime { model, message } => Error::Runtime {
            model: pipeline.to_string(),
            message: format!("{step} (model `{model}`): {message}").into(),
        },
        Error::Internal(m) => Error::Internal(format!("{at}: {m}")),
        Error::Busy { message, retry_after } => Error::Busy {
            message: format!("{at}: {message}"),
            retry_after,
        },
        other => other,
    }
}
