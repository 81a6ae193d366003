//! A loaded model: its settings, its ONNX signature, and the path a request
//! takes through it (validate → batcher → pool → split outputs).

pub mod embed;
pub mod pipeline;
pub mod report;
pub mod sequence;
pub mod state;
pub mod warmup;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crate::batcher::Batcher;
use crate::error::{Error, Result};
use crate::protocol::{self, InferRequest, InferResponse};
use crate::settings::ModelSettings;
use crate::tensor::reshape::Reshape;
use crate::tensor::Signature;

/// Everything a request needs to run on one version of a model. Shared as
/// `Arc<ModelHandle>`: a request holds its own `Arc`, so a reload or unload
/// that replaces the registry entry never pulls the model out from under it.
pub struct ModelHandle {
    pub name: String,
    pub settings: ModelSettings,
    pub signature: Signature,
    /// Why the execution provider was chosen (shown by `sluice check`, logged at load).
    pub provider_reason: String,
    /// What this version holds in memory.
    pub memory: Memory,
    /// Why the model rejected its warm-up, when it did: it serves cold.
    pub warmup_rejected: Option<String>,
    batcher: Batcher,
    activity: Arc<Activity>,
    /// A sequence model's live sequences (`settings.sequence`).
    sequences: Option<Arc<sequence::Sequences>>,
    /// The version this one replaced while sequences were live on it: they
    /// finish there (their state is that version's); new ones start here.
    /// Let go once none is left.
    previous: std::sync::Mutex<Option<Arc<ModelHandle>>>,
    /// A pipeline's steps: requests run through them (the folder's own
    /// ONNX file, if any, is one of them).
    pipeline: Option<Arc<pipeline::Pipeline>>,
}

/// When a version loaded, when a request last used it, and how many
/// requests are inside it now: what residency decides evictions by. Shared
/// by the copies a batching-only change makes of a handle.
#[derive(Debug)]
pub struct Activity {
    loaded_at: Instant,
    /// Nanoseconds from `loaded_at` to the last request's start or end.
    last_ns: AtomicU64,
    inflight: AtomicUsize,
}

impl Activity {
    fn new() -> Activity {
        Activity {
            loaded_at: Instant::now(),
            last_ns: AtomicU64::new(0),
            inflight: AtomicUsize::new(0),
        }
    }

    /// The last request's start or end, or the load when no request came yet.
    pub fn last_active(&self) -> Instant {
        self.loaded_at + std::time::Duration::from_nanos(self.last_ns.load(Ordering::Relaxed))
    }

    /// A request is inside the model (validating, queued or running).
    pub fn busy(&self) -> bool {
        self.inflight.load(Ordering::Acquire) > 0
    }

    fn touch(&self) {
        let ns = u64::try_from(self.loaded_at.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.last_ns.fetch_max(ns, Ordering::Relaxed);
    }
}

/// A request inside the model, from [`ModelHandle::infer`]'s start to its end.
struct Inside<'a>(&'a Activity);

impl<'a> Inside<'a> {
    fn enter(a: &'a Activity) -> Inside<'a> {
        a.inflight.fetch_add(1, Ordering::AcqRel);
        a.touch();
        Inside(a)
    }
}

impl Drop for Inside<'_> {
    fn drop(&mut self) {
        self.0.touch();
        self.0.inflight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What one version of a model holds in memory: reported in the repository
/// index, in its statistics (`memory_usage`) and as `sluice_model_memory_bytes`.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Memory {
    /// Growth of the process's resident memory while this version loaded and
    /// warmed up: its sessions, their arenas and its weights (other work at
    /// the same time blurs it; it is never negative).
    pub host_bytes: u64,
    /// Bytes of the weights (initializers) in its ONNX file.
    pub weights_bytes: u64,
    /// On a GPU: growth of each CUDA device's memory in use while this
    /// version loaded and warmed up (CUDA's `cudaMemGetInfo`; other work on
    /// the device at the same time blurs it). Absent on the CPU.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub device_bytes: Vec<DeviceBytes>,
}

/// Bytes one model version holds on one CUDA device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct DeviceBytes {
    /// The CUDA device id (`cuda:N`).
    pub device: u32,
    pub bytes: u64,
}

impl ModelHandle {
    pub fn new(
        name: String,
        settings: ModelSettings,
        signature: Signature,
        provider_reason: String,
        memory: Memory,
        batcher: Batcher,
    ) -> Self {
        let sequences = settings
            .sequence
            .clone()
            .map(|s| sequence::Sequences::start(&name, s));
        ModelHandle {
            name,
            settings,
            signature,
            provider_reason,
            memory,
            warmup_rejected: None,
            batcher,
            activity: Arc::new(Activity::new()),
            sequences,
            previous: std::sync::Mutex::new(None),
            pipeline: None,
        }
    }

    /// Requests run through `pipeline`'s steps.
    pub fn with_pipeline(mut self, pipeline: pipeline::Pipeline) -> ModelHandle {
        self.pipeline = Some(Arc::new(pipeline));
        self
    }

    /// The pipeline requests run through, if the model is one.
    pub fn pipeline(&self) -> Option<&pipeline::Pipeline> {
        self.pipeline.as_deref()
    }

    /// The same version (same sessions and batcher) with new settings, for a
    /// batching-only change applied in place.
    pub fn with_settings(&self, settings: ModelSettings) -> ModelHandle {
        ModelHandle {
            name: self.name.clone(),
            settings,
            signature: self.signature.clone(),
            provider_reason: self.provider_reason.clone(),
            memory: self.memory.clone(),
            warmup_rejected: self.warmup_rejected.clone(),
            batcher: self.batcher.clone(),
            activity: self.activity.clone(),
            sequences: self.sequences.clone(),
            previous: std::sync::Mutex::new(self.previous.lock().expect("previous lock poisoned").clone()),
            pipeline: self.pipeline.clone(),
        }
    }

    /// This version replaces `old`, whose live sequences finish on it.
    pub fn follow(&self, old: Arc<ModelHandle>) {
        *self.previous.lock().expect("previous lock poisoned") = Some(old);
    }

    /// The version a request of a sequence that started before this
    /// version served must run on, if any.
    fn previous_for(&self, seq: &protocol::sequence::Sequence) -> Option<Arc<ModelHandle>> {
        let (Some(s), Some(id)) = (&self.sequences, &seq.id) else {
            return None;
        };
        if seq.start || s.is_live(id) {
            return None;
        }
        let mut previous = self.previous.lock().expect("previous lock poisoned");
        let prev = previous.clone()?;
        if prev.live_sequences() == 0 {
            *previous = None;
            return None;
        }
        prev.sequences.as_ref()?.is_live(id).then_some(prev)
    }

    /// When it loaded, when it was last used, whether a request is inside.
    pub fn activity(&self) -> &Activity {
        &self.activity
    }

    /// The model's batcher (to apply new batch settings in place).
    pub fn batcher(&self) -> &Batcher {
        &self.batcher
    }

    /// Whether requests share batches, as the repository index and
    /// `sluice check` say it: `on, along …` or `off: why`.
    pub fn batching_report(&self) -> String {
        let b = self.batcher.batching();
        let layout = b.layout().ok_or(b.off().unwrap_or("-"));
        let enabled = self.batcher.settings().batching_enabled();
        crate::batcher::layout::verdict(layout, enabled, &self.signature)
    }

    /// Replaces output `name` of `tensors` by its top `n` classes (Triton's
    /// classification extension), per row when the model has a batch dimension.
    fn classify(&self, tensors: &mut [crate::tensor::Tensor], name: &str, n: usize) -> Result<()> {
        let batched = self.batcher.batching().layout().is_some_and(|l| l.is_plain());
        let labels = self.settings.labels.get(name).map(|l| l.as_slice());
        if let Some(t) = tensors.iter_mut().find(|t| t.name == name) {
            *t = protocol::classification::classify(t, n, labels, batched)?;
        }
        Ok(())
    }

    /// Its live sequences, if it is a sequence model.
    pub fn sequences(&self) -> Option<&Arc<sequence::Sequences>> {
        self.sequences.as_ref()
    }

    /// Sequences live on this version now.
    pub fn live_sequences(&self) -> usize {
        self.sequences.as_ref().map_or(0, |s| s.live())
    }

    /// Bytes the live sequences' state holds.
    pub fn sequence_state_bytes(&self) -> u64 {
        self.sequences.as_ref().map_or(0, |s| s.state_bytes())
    }

    /// A model that is not a sequence model refuses sequence parameters:
    /// a client written for one would get answers that ignore them.
    fn no_sequence(&self, req: &InferRequest) -> Result<Option<sequence::Turn>> {
        match &req.sequence {
            None => Ok(None),
            Some(s) => Err(Error::invalid(format!(
                "model `{}` is not a sequence model (no `sequence_batching` in its config.pbtxt): parameter `{}` \
                 is not accepted; send requests without sequence parameters",
                self.name, s.named
            ))),
        }
    }

    /// Waits for the request's turn in its sequence, then adds the control
    /// inputs the server fills.
    async fn join_sequence(
        &self,
        s: &Arc<sequence::Sequences>,
        req: &mut InferRequest,
    ) -> Result<sequence::Turn> {
        if let Some(t) = req.inputs.iter().find(|t| s.is_control(&t.name)) {
            return Err(Error::invalid(format!(
                "model `{}`: input `{}` is a control input or a state, which the server fills; leave it out",
                self.name, t.name
            )));
        }
        let rows = req.rows().max(1);
        // One row per request (Triton's sequence batcher): a sequence's
        // state has one row, and a start of two would keep two.
        if self.settings.batching.max_batch_size > 0 && rows != 1 {
            return Err(Error::invalid(format!(
                "model `{}` serves sequences: each request carries one row (batch size 1), this one carries {rows} \
                 (dim 0 of input `{}`); send each row in its own request of its own sequence",
                self.name,
                req.inputs.first().map_or("", |t| t.name.as_str())
            )));
        }
        let turn = s.join(req.sequence.as_ref()).await?;
        req.inputs.extend(s.controls(&turn, rows, &self.signature)?);
        if s.has_state() {
            let axes = &self.settings.batch_axes;
            req.inputs
                .extend(s.state_inputs(&turn, rows, &self.signature, axes)?);
            s.request_state(&mut req.outputs);
        }
        Ok(turn)
    }

    /// Applies each tensor's `reshape` rule (`convert`: to the model's
    /// shape, or to the clients').
    fn reshape(
        &self,
        tensors: &mut [crate::tensor::Tensor],
        convert: fn(&Reshape, &mut crate::tensor::Tensor) -> std::result::Result<(), String>,
    ) -> Result<()> {
        for t in tensors.iter_mut() {
            if let Some(rule) = self.settings.reshape.get(&t.name) {
                convert(rule, t).map_err(|e| Error::invalid(format!("model `{}`: {e}", self.name)))?;
            }
        }
        Ok(())
    }

    /// The signature as clients see it (model metadata): a reshaped
    /// tensor has its `dims` (`config.pbtxt`'s `reshape`).
    pub fn client_signature(&self) -> std::borrow::Cow<'_, Signature> {
        if let Some(p) = &self.pipeline {
            return std::borrow::Cow::Borrowed(&p.signature);
        }
        if self.settings.reshape.is_empty() {
            return std::borrow::Cow::Borrowed(&self.signature);
        }
        let mut sig = self.signature.clone();
        for spec in sig.inputs.iter_mut().chain(sig.outputs.iter_mut()) {
            if let Some(rule) = self.settings.reshape.get(&spec.name) {
                *spec = rule.client_spec(spec);
            }
        }
        std::borrow::Cow::Owned(sig)
    }

    pub fn version(&self) -> Option<&str> {
        self.settings.version.as_deref()
    }

    /// Validates `req` against the signature and runs it. The deadline
    /// (`timeout`) counts from `arrival`, queueing included. Every protocol
    /// comes here, so requests from all of them share batches; the outcome
    /// is counted in the model's statistics.
    pub async fn infer(&self, req: InferRequest, arrival: Instant) -> Result<InferResponse> {
        if let Some(prev) = req.sequence.as_ref().and_then(|s| self.previous_for(s)) {
            return Box::pin(prev.infer(req, arrival)).await;
        }
        match &self.pipeline {
            Some(p) => {
                self.counted(arrival, self.run_pipeline(p, req, arrival, false))
                    .await
            }
            None => self.counted(arrival, self.run(req, arrival)).await,
        }
    }

    /// Runs `work`, a request inside the model, counted in its statistics.
    async fn counted(
        &self,
        arrival: Instant,
        work: impl std::future::Future<Output = Result<InferResponse>>,
    ) -> Result<InferResponse> {
        let _inside = Inside::enter(&self.activity);
        let result = work.await;
        let outcome = result.as_ref().map(|_| ()).map_err(fail_reason);
        self.batcher.stats().request_done(outcome, arrival.elapsed());
        result
    }

    /// A pipeline's request: checked against the pipeline's signature, then
    /// run through its steps within the pipeline's deadline.
    async fn run_pipeline(
        &self,
        p: &pipeline::Pipeline,
        mut req: InferRequest,
        arrival: Instant,
        tokenized: bool,
    ) -> Result<InferResponse> {
        crate::telemetry::record_version(self.version());
        self.no_sequence(&req)?;
        if let Some((name, _)) = req.classify.first() {
            return Err(Error::invalid(format!(
                "model `{}` is a pipeline: output `{name}` cannot be asked for as classes",
                self.name
            )));
        }
        // Any tensor of the pipeline may be asked for: checked by the pipeline.
        // Already tokenized (`tokenized`): the inputs are the tokenizer's
        // outputs, made by the server; otherwise the pipeline's.
        if !tokenized {
            let outputs = req.outputs.take();
            protocol::validate(&mut req, &self.name, &p.signature)?;
            req.outputs = outputs;
        }
        let timeout = self.batcher.settings().timeout;
        let timeout = req.schedule.timeout.map_or(timeout, |t| t.min(timeout));
        let deadline = tokio::time::Instant::from_std(arrival + timeout);
        match tokio::time::timeout_at(deadline, p.run(self, req, arrival, tokenized)).await {
            Ok(answer) => answer,
            Err(_) => Err(Error::DeadlineExceeded {
                model: self.name.clone(),
                timeout,
            }),
        }
    }

    async fn run(&self, mut req: InferRequest, arrival: Instant) -> Result<InferResponse> {
        crate::telemetry::record_version(self.version());
        if !self.settings.reshape.is_empty() {
            self.reshape(&mut req.inputs, Reshape::to_model)?;
        }
        // Held until the answer: the sequence's next request waits for it.
        let mut turn = match &self.sequences {
            None => self.no_sequence(&req)?,
            Some(s) => Some(self.join_sequence(s, &mut req).await?),
        };
        protocol::validate(&mut req, &self.name, &self.signature)?;
        let classify = std::mem::take(&mut req.classify);
        let (mut tensors, tag) = self
            .batcher
            .submit(req.inputs, req.outputs.as_deref(), arrival, req.schedule)
            .await?;
        if let (Some(s), Some(t)) = (&self.sequences, &mut turn) {
            s.keep_state(t, &mut tensors)?;
        }
        if !self.settings.reshape.is_empty() {
            self.reshape(&mut tensors, Reshape::to_client)?;
        }
        for (name, n) in &classify {
            self.classify(&mut tensors, name, *n)?;
        }
        Ok(InferResponse {
            model_name: self.batcher.model().clone(),
            // The version that computed it: a request handed over to the
            // next version during a reload is answered by that one.
            model_version: tag.version.map(|v| v.to_string()),
            id: req.id,
            outputs: tensors,
            batch_id: tag.id,
        })
    }
}

/// How Triton's failure metric labels an error.
fn fail_reason(e: &Error) -> crate::batcher::stats::FailReason {
    use crate::batcher::stats::FailReason;
    use crate::error::ErrorKind as K;
    match e.kind() {
        K::Overloaded | K::DeadlineExceeded => FailReason::Rejected,
        K::ShuttingDown => FailReason::Canceled,
        K::Runtime | K::Internal => FailReason::Backend,
        _ => FailReason::Other,
    }
}
