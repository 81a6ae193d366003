//! One adaptive batcher per model (SPEC §5). [`Batcher`] is the handle that
//! requests use; the batching task (`task.rs`) owns the queue; `queue.rs` is
//! its pure state and `policy.rs` the pure rule that decides when a batch
//! closes.
//!
//! A request's rows are dim 0 of its inputs (or the axes `batch_axes`
//! declares). A request with more rows than `max_batch_size` is split into
//! chunks that fit (they may share batches with other requests) and its
//! answer is reassembled in order; only one that would take more than
//! [`MAX_CHUNKS`] batches is refused.
//!
//! A model with `padding` batches requests of different lengths together
//! (`padding.rs` says how, `queue/select.rs` which requests).
//!
//! `cost.rs` fits what a batch costs by its size from the runs; the policy
//! weighs waits with it. `deadline.rs` is the deadline and priority rule:
//! when a lower level is promoted, and which requests are refused at once,
//! predicted to miss their deadline.

pub mod cost;
mod deadline;
pub mod layout;
pub mod padding;
mod policy;
mod queue;
pub mod stats;
mod task;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot, watch};

pub use layout::{Batching, Layout};
pub use padding::Padding;
pub use policy::{decide, Capacity, Decision, Trigger};
pub use queue::{Entry, EntryResult, Limits, State};

use crate::batcher::stats::ModelStats;
use crate::error::{Error, Result};
use crate::metrics;
use crate::pool::ModelWorkers;
use crate::protocol::Schedule;
use crate::settings::BatchSettings;
use crate::tensor::Tensor;

/// Handle to one model's batcher. Cheap to clone. When the last clone is
/// dropped, the batching task runs what is queued and exits.
#[derive(Clone)]
pub struct Batcher {
    inner: Arc<Inner>,
}

/// What a [`Batcher`] handle sends its batching task.
pub(crate) enum Msg {
    /// A request (or one chunk of one) to batch.
    Entry(Entry),
    /// A new version of the model replaced this one: queued requests (and
    /// any that still arrive) move to its batcher; in-flight batches finish here.
    Handoff(Batcher),
    /// The version is unloading: flush instead of waiting (see [`Batcher::retire`]).
    Retire,
}

struct Inner {
    model: Arc<str>,
    /// Requests to the batching task, which holds the receiver.
    entries: mpsc::UnboundedSender<Msg>,
    /// Live batch settings; the batching task holds a receiver and reads the
    /// current value at each decision (settings change without a restart).
    settings: watch::Sender<BatchSettings>,
    /// Requests admitted and not yet dispatched (shared with the task).
    queued: Arc<AtomicUsize>,
    /// Cumulative statistics, shared with the batching task and its batch tasks.
    stats: Arc<ModelStats>,
    /// How requests of different lengths share batches (`None`: they never do).
    padding: Option<Arc<Padding>>,
    /// Whether requests share batches, and along which axes (shared with the task).
    batching: Arc<Batching>,
    /// The model's per-request metric series (a clone is in the task's `Shared`).
    metrics: metrics::ModelMetrics,
    /// The sessions run on a GPU: settings take that device's defaults.
    gpu: bool,
    /// Closed once the sessions are dropped (see [`ModelWorkers::released`]).
    ended: watch::Receiver<()>,
}

/// Which batch answered a request: its id (shared by every answer of the
/// batch) and the model version whose sessions ran it.
#[derive(Debug, Clone)]
pub struct BatchTag {
    pub id: Arc<str>,
    pub version: Option<Arc<str>>,
}

impl Batcher {
    /// Starts the batching task of `model` over its session workers;
    /// `padding` lets requests of different lengths share batches;
    /// `batching` says whether requests share batches at all, and how.
    pub fn spawn(
        model: &str,
        version: Option<&str>,
        settings: BatchSettings,
        workers: Arc<ModelWorkers>,
        outputs: Vec<String>,
        padding: Option<Padding>,
        batching: Batching,
    ) -> Batcher {
        let padding = padding.map(Arc::new);
        let batching = Arc::new(batching);
        let gpu = workers.on_gpu();
        let ended = workers.released();
        let (entries, rx) = mpsc::unbounded_channel();
        let (settings_tx, settings_rx) = watch::channel(settings.on_device(gpu));
        let queued = Arc::new(AtomicUsize::new(0));
        let stats = Arc::new(ModelStats::new());
        let model_metrics = metrics::ModelMetrics::new(model, version);
        let shared = Arc::new(task::Shared {
            model: model.into(),
            version: version.map(Arc::from),
            metrics: model_metrics.clone(),
            workers,
            outputs,
            queued: queued.clone(),
            stats: stats.clone(),
            padding: padding.clone(),
            batching: batching.clone(),
            finished: Default::default(),
            idle: Default::default(),
            finish_wake: Default::default(),
        });
        tokio::spawn(task::batching_task(shared, rx, settings_rx));
        model_metrics.queue_size(0);
        Batcher {
            inner: Arc::new(Inner {
                model: model.into(),
                entries,
                settings: settings_tx,
                queued,
                stats,
                padding,
                batching,
                metrics: model_metrics,
                gpu,
                ended,
            }),
        }
    }

    /// The model's name (shared: every answer carries a clone).
    pub fn model(&self) -> &Arc<str> {
        &self.inner.model
    }

    /// The model's cumulative statistics (Triton's statistics extension).
    pub fn stats(&self) -> &ModelStats {
        &self.inner.stats
    }

    /// The current batch settings.
    pub fn settings(&self) -> BatchSettings {
        *self.inner.settings.borrow()
    }

    /// Whether requests share batches, along which axes, and why not.
    pub fn batching(&self) -> &Batching {
        &self.inner.batching
    }

    /// Applies new batch settings to the running batcher (no session rebuilt).
    pub fn update(&self, settings: BatchSettings) {
        self.inner
            .settings
            .send_replace(settings.on_device(self.inner.gpu));
    }

    /// Hands this batcher's queued requests (and any that still arrive) to
    /// `successor`, the batcher of the model version that replaces it. Only
    /// valid when both versions have the same signature.
    pub fn handoff_to(&self, successor: Batcher) {
        let _ = self.inner.entries.send(Msg::Handoff(successor));
    }

    /// Resolves once the sessions are dropped, their memory back: after
    /// [`Batcher::retire`], when every clone of this batcher (every handle
    /// of the version) is gone, what was queued has run, and each session
    /// thread has dropped its session.
    pub fn ended(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut ended = self.inner.ended.clone();
        async move { while ended.changed().await.is_ok() {} }
    }

    /// Stops waiting for batches to fill: the model version is unloading or
    /// was replaced, so what is queued runs as soon as a session can take it
    /// (`trigger="drain"`). Requests still accepted are answered.
    pub fn retire(&self) {
        let _ = self.inner.entries.send(Msg::Retire);
    }

    /// Queues an entry that another batcher accepted (see [`Batcher::handoff_to`]).
    /// Its grouping is redone with this batcher's padding: the version that
    /// accepted it may have padded differently (or not at all).
    fn requeue(&self, entry: Entry) {
        let entry = match entry.regroup(self.inner.padding.as_deref()) {
            Ok(e) => e.laid_out(self.inner.batching.axes()),
            Err(refused) => {
                let (e, why) = *refused;
                let _ = e.reply.send(Err(Error::invalid(why)));
                return;
            }
        };
        if entry.releases_slot {
            let n = self.inner.queued.fetch_add(1, Ordering::AcqRel) + 1;
            self.inner.metrics.queue_size(n);
        }
        if let Err(mpsc::error::SendError(Msg::Entry(e))) = self.inner.entries.send(Msg::Entry(entry)) {
            let _ = e.reply.send(Err(Error::ModelNotReady {
                name: self.inner.model.to_string(),
                reason: "unloading".into(),
            }));
        }
    }

    /// Requests waiting now.
    pub fn queued(&self) -> usize {
        self.inner.queued.load(Ordering::Acquire)
    }

    /// Queues validated inputs (signature order) and waits for the outputs
    /// named in `outputs` (`None`: every output, in signature order) and the
    /// id of the batch they ran in. The deadline (the model's `timeout`, or
    /// the request's own `timeout` when shorter) counts from `arrival`.
    pub async fn submit(
        &self,
        inputs: Vec<Tensor>,
        outputs: Option<&[String]>,
        arrival: Instant,
        schedule: Schedule,
    ) -> Result<(Vec<Tensor>, BatchTag)> {
        let settings = self.settings();
        let model = &self.inner.model;
        let level = priority_level(model, &settings, schedule.priority)?;
        // Admission: count the request before it is queued.
        let before = self.inner.queued.fetch_add(1, Ordering::AcqRel);
        if before >= settings.max_queue_size {
            self.inner.queued.fetch_sub(1, Ordering::AcqRel);
            return Err(Error::Overloaded {
                model: model.to_string(),
                max_queue_size: settings.max_queue_size,
                retry_after: Duration::from_secs(1),
            });
        }
        self.inner.metrics.queue_size(before + 1);
        // Holds the admission slot until the request's last chunk is queued
        // (that entry then owns it, and the batching task releases it).
        let mut slot = Slot {
            queued: &self.inner.queued,
            metrics: &self.inner.metrics,
            held: true,
        };
        // The request's own timeout may shorten the model's, never lengthen it.
        let timeout = schedule
            .timeout
            .map_or(settings.timeout, |t| t.min(settings.timeout));
        let deadline = arrival + timeout;
        // The layout while the model batches: a request's rows are its batch
        // axis; one that runs alone is one inference, whatever its shapes.
        let batching = Arc::clone(&self.inner.batching);
        let layout = batching.layout();
        let rows = match layout {
            Some(l) => l.rows(&inputs).map_err(Error::invalid)?,
            None => 1,
        };
        // A padded model's request: its grouping key and lengths (inputs that
        // disagree on a padded dim are refused).
        let padded = match (&self.inner.padding, layout) {
            (Some(p), Some(_)) => Some(p.measure(&inputs).map_err(Error::invalid)?),
            _ => None,
        };
        let lengths = padded.as_ref().map(|(_, l)| l.as_slice());
        let (chunk, n_chunks) = chunking(&settings, layout.is_some(), rows, lengths, &inputs)?;
        let request = Request {
            rows,
            chunk,
            chunks: n_chunks.max(1),
            times: (arrival, deadline, level),
            padded,
            layout,
        };
        let run = self.run_chunks(inputs, request, &mut slot);
        let remaining = deadline.saturating_duration_since(Instant::now());
        let (all, batch_id) = match tokio::time::timeout(remaining, run).await {
            Ok(r) => r?,
            Err(_) => {
                return Err(Error::DeadlineExceeded {
                    model: model.to_string(),
                    timeout,
                })
            }
        };
        let picked = match outputs {
            // A batch computes every output, in signature order.
            None => all,
            Some(names) => self.pick(all, names),
        };
        Ok((picked, batch_id))
    }

    /// Queues a request in chunks of at most `chunk` rows, at most
    /// [`CHUNKS_IN_FLIGHT`] at a time (the next is cut when the oldest is
    /// answered, so a request of millions of narrow rows holds a bounded
    /// number of queue entries), and joins their outputs in order. Returns
    /// every output (signature order) and the id of the last chunk's batch.
    ///
    /// A chunk answered [`Error::Unbatched`] ran on a model found not to
    /// batch after all: the request then runs again whole, and alone.
    async fn run_chunks(
        &self,
        inputs: Vec<Tensor>,
        r: Request<'_>,
        slot: &mut Slot<'_>,
    ) -> Result<(Vec<Tensor>, BatchTag)> {
        let n_chunks = r.chunks;
        let (Some(layout), true) = (r.layout, n_chunks > 1) else {
            // The common case: the inputs are moved, not copied, and nothing is joined.
            let rx = self.queue_chunk(inputs, (true, true), r.times, r.padded, r.layout, slot)?;
            return rx.await.map_err(|_| self.unloading())?;
        };
        let mut in_flight = std::collections::VecDeque::new();
        // Each chunk's outputs, joined once every chunk is answered.
        let mut answered: Vec<Vec<Tensor>> = Vec::with_capacity(n_chunks);
        let mut last_id = None;
        let mut next = 0;
        while next < n_chunks || !in_flight.is_empty() {
            while next < n_chunks && in_flight.len() < CHUNKS_IN_FLIGHT {
                let (start, end) = (next * r.chunk, ((next + 1) * r.chunk).min(r.rows));
                let part = inputs
                    .iter()
                    .zip(&layout.inputs)
                    .map(|(t, a)| match a {
                        Some(a) => t.slice_axis(*a, start..end),
                        None => t.clone(),
                    })
                    .collect();
                next += 1;
                let last = next == n_chunks;
                in_flight.push_back(self.queue_chunk(
                    part,
                    (last, false),
                    r.times,
                    r.padded.clone(),
                    r.layout,
                    slot,
                )?);
            }
            let rx = in_flight.pop_front().expect("a chunk in flight");
            let (part, id) = match rx.await.map_err(|_| self.unloading())? {
                Err(Error::Unbatched(_)) => {
                    // The chunks still queued run and are dropped; the request runs whole.
                    let rx = self.queue_chunk(inputs, (slot.held, true), r.times, None, None, slot)?;
                    return rx.await.map_err(|_| self.unloading())?;
                }
                other => other?,
            };
            answered.push(part);
            last_id = Some(id);
        }
        let joined = layout
            .outputs
            .iter()
            .enumerate()
            .map(|(o, &axis)| Tensor::concat_axis(&answered.iter().map(|p| &p[o]).collect::<Vec<_>>(), axis))
            .collect();
        Ok((joined, last_id.expect("at least one chunk")))
    }

    /// Queues one chunk of a request; `last`: the request's last chunk,
    /// which takes over its admission slot; `whole`: the entry is the whole
    /// request. Its answer comes on the receiver.
    fn queue_chunk(
        &self,
        part: Vec<Tensor>,
        (last, whole): (bool, bool),
        (arrival, deadline, level): (Instant, Instant, u32),
        padded: Option<(Vec<Vec<usize>>, Vec<usize>)>,
        layout: Option<&Layout>,
        slot: &mut Slot<'_>,
    ) -> Result<oneshot::Receiver<EntryResult>> {
        let (tx, rx) = oneshot::channel();
        let mut entry = Entry::new(part, arrival, deadline, tx).with_level(level);
        match layout {
            Some(l) => entry = entry.laid_out(l),
            // Runs alone: one entry fills its batch.
            None => entry.rows = 1,
        }
        if let Some((key, lengths)) = padded {
            entry = entry.padded(key, lengths);
        }
        entry.releases_slot = last;
        entry.whole = whole;
        (entry.span, entry.queue_span) = crate::telemetry::enqueued();
        // Only fails if the task died; the guard then releases the slot.
        self.inner
            .entries
            .send(Msg::Entry(entry))
            .map_err(|_| self.unloading())?;
        slot.held &= !last;
        Ok(rx)
    }

    /// Why a request cannot be queued: the batching task is gone.
    fn unloading(&self) -> Error {
        Error::ModelNotReady {
            name: self.inner.model.to_string(),
            reason: "unloading".into(),
        }
    }

    /// The outputs named in `outputs`, in that order, from all of them.
    fn pick(&self, all: Vec<Tensor>, outputs: &[String]) -> Vec<Tensor> {
        let mut all: Vec<Option<Tensor>> = all.into_iter().map(Some).collect();
        outputs
            .iter()
            .filter_map(|name| {
                all.iter_mut()
                    .find(|t| t.as_ref().is_some_and(|t| &t.name == name))?
                    .take()
            })
            .collect()
    }
}

/// How one admitted request is queued (see [`Batcher::run_chunks`]).
struct Request<'a> {
    /// Its rows along the batch axis (1 for a request that runs alone).
    rows: usize,
    /// Most rows of one chunk.
    chunk: usize,
    /// How many chunks it is cut into (at least 1).
    chunks: usize,
    /// Its arrival, deadline and priority level (see [`Entry::level`]).
    times: (Instant, Instant, u32),
    /// A padded model's grouping key and lengths.
    padded: Option<(Vec<Vec<usize>>, Vec<usize>)>,
    /// The model's batch axes while it batches.
    layout: Option<&'a Layout>,
}

/// Most chunks (batches) one request may be split into. Beyond it the
/// request is refused (400) before anything is queued: millions of tiny rows
/// (empty strings) at a small `max_batch_size` would otherwise cost hundreds
/// of thousands of batches of CPU before the request's timeout ends them.
const MAX_CHUNKS: usize = 16_384;

/// Most chunks of one request queued at once (see [`Batcher::run_chunks`]).
const CHUNKS_IN_FLIGHT: usize = 32;

/// A request's admission slot in `queued`, held by [`Batcher::submit`] until
/// its last chunk is queued; released on drop while still held (the client
/// went away, the deadline passed, or the task is gone before that).
struct Slot<'a> {
    queued: &'a AtomicUsize,
    metrics: &'a metrics::ModelMetrics,
    held: bool,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        if self.held {
            let left = self.queued.fetch_sub(1, Ordering::AcqRel) - 1;
            self.metrics.queue_size(left);
        }
    }
}

#[cfg(test)]
mod tests;

/// The queue level of a request asking for `priority` (see [`Entry::level`]):
/// 0 while the model has no `priority_levels` (a priority asked for is
/// ignored, as Triton does without a priority queue); the model's
/// `default_priority` when it asks for none; a level outside 1 to
/// `priority_levels` is a 400 naming both.
fn priority_level(model: &str, settings: &BatchSettings, priority: Option<u64>) -> Result<u32> {
    match (priority, settings.priority_levels) {
        (_, 0) => Ok(0),
        (None, _) => Ok(settings.default_priority),
        (Some(p), n) if p <= u64::from(n) => Ok(p as u32),
        (Some(p), n) => Err(Error::invalid(format!(
            "request: parameter `priority` is {p}, but model `{model}` has priority levels 1 to {n} (priority_levels)"
        ))),
    }
}

/// How a request of `rows` rows is split: the most rows of one chunk
/// (`max_batch_size` while the model batches, within `max_batch_tokens` for
/// a padded one of these `lengths`; the whole request when it runs alone)
/// and the number of chunks. A request of empty rows that would need
/// several chunks, or one past [`MAX_CHUNKS`], is refused.
fn chunking(
    settings: &BatchSettings,
    batches: bool,
    rows: usize,
    lengths: Option<&[usize]>,
    inputs: &[Tensor],
) -> Result<(usize, usize)> {
    let mut chunk = match batches && settings.batching_enabled() {
        true => settings.max_batch_size,
        false => rows.max(1),
    };
    if let (Some(lengths), Some(max_tokens)) = (lengths, settings.max_batch_tokens) {
        // Chunks within `max_batch_tokens` (a single row longer than that runs alone).
        let per_row = lengths.iter().product::<usize>().max(1);
        chunk = chunk.min((max_tokens / per_row).max(1));
    }
    if rows > chunk && inputs.iter().all(|t| t.data.is_empty()) {
        return Err(Error::invalid(format!(
            "the inputs have {rows} rows of no elements each; such a request may have at most \
             max_batch_size ({chunk}) rows"
        )));
    }
    let n_chunks = rows.div_ceil(chunk);
    if n_chunks > MAX_CHUNKS {
        return Err(Error::invalid(format!(
            "the request has {rows} rows: at max_batch_size ({chunk}) that is {n_chunks} batches, more than \
             the {MAX_CHUNKS} one request may take; send at most {} rows per request, or raise max_batch_size",
            chunk * MAX_CHUNKS
        )));
    }
    Ok((chunk, n_chunks))
}
