//! The batching task: one tokio task per model that owns the queue
//! [`State`], asks [`decide`] what to do, forms batches, and hands each to
//! the pool (on a task of its own unless the batch ran inline at once). It
//! exits once every [`Batcher`] handle is gone and the queue has drained
//! (every accepted request has run; batch tasks send the last answers).
//!
//! [`Batcher`]: super::Batcher

use std::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch, Notify};
use tracing::Instrument;

use super::layout::Batching;
use super::padding::Padding;
use super::policy::{decide, Capacity, Decision, Trigger};
use super::queue::{Dropped, Entry, EntryResult, Limits, State};
use super::{Batcher, Msg};
use crate::batcher::stats::{BatchTimes, ModelStats};
use crate::error::Error;
use crate::metrics;
use crate::pool::{ModelWorkers, RunError, SessionFreed};
use crate::runtime::RuntimeError;
use crate::settings::BatchSettings;
use crate::telemetry;
use crate::tensor::Tensor;

/// Numbers batches process-wide, so a `batchId` is unique across models.
static NEXT_BATCH: AtomicU64 = AtomicU64::new(1);

/// What the batching task shares with its batch tasks.
pub(super) struct Shared {
    pub model: Arc<str>,
    /// The model's per-request metric series.
    pub metrics: metrics::ModelMetrics,
    pub workers: Arc<ModelWorkers>,
    /// Every output of the model, in signature order: a batch computes all of
    /// them and each request keeps the ones it asked for.
    pub outputs: Vec<String>,
    /// Requests waiting (admitted, not yet dispatched). Incremented by
    /// `Batcher::submit`, decremented here when a request leaves the queue.
    pub queued: Arc<AtomicUsize>,
    /// Cumulative statistics, also read through the `Batcher` handle.
    pub stats: Arc<ModelStats>,
    /// How requests of different lengths are padded into one batch (`None`: they never are).
    pub padding: Option<Arc<Padding>>,
    /// Whether requests share batches, and along which axes; turned off
    /// here when a batch's outputs do not follow its rows.
    pub batching: Arc<Batching>,
    /// Batches whose session is free again: their run times, pushed as
    /// each run ends by the thread that ran it (a session thread, or the
    /// batching task for an inline run), before the answers are cut and
    /// sent (see [`batch_done`]); taken by the batching task before each
    /// decision.
    pub finished: Mutex<Vec<Duration>>,
    /// Set by the batching task while it waits with nothing queued (open,
    /// not draining): no decision of its can change when a batch finishes
    /// then, so finished runs do not wake it (the next request does, and it
    /// takes `finished` first). A lone request's batch thus ends without a
    /// second task to schedule, which made tokio wake the other async worker.
    pub idle: AtomicBool,
    /// Wakes the batching task when a batch finishes and it is not `idle`;
    /// [`batch_done`] notifies, the batching task is the only waiter.
    pub finish_wake: Notify,
}

impl Shared {
    /// The finished batches' run times (a panic while it was held leaves
    /// the list as usable as before).
    fn finished(&self) -> std::sync::MutexGuard<'_, Vec<Duration>> {
        self.finished.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Hands `each` the finished batches' run times since the last call
    /// (drained in place: the list keeps its buffer, so a finished batch
    /// does not allocate).
    fn take_finished(&self, mut each: impl FnMut(Duration)) {
        self.finished().drain(..).for_each(&mut each);
    }
}

/// A new batch's id: 16 hex digits, shared by every answer of the batch.
fn next_batch_id() -> Arc<str> {
    format!("{:016x}", NEXT_BATCH.fetch_add(1, Ordering::Relaxed)).into()
}

/// A batch's session is free (called once per batch by [`Done`], on the
/// thread that ran it): records the run time and wakes the batching task
/// unless it is `idle`. The fence pairs with the batching task's after
/// it clears `idle`: either this sees `idle` cleared, or the batching task
/// sees this run time in `finished`.
fn batch_done(shared: &Shared, took: Duration) {
    shared.finished().push(took);
    fence(Ordering::SeqCst);
    if !shared.idle.load(Ordering::Relaxed) {
        shared.finish_wake.notify_one();
    }
}

/// The loop. `entries`: requests from every `Batcher` handle (closed when
/// the last handle is dropped); `settings`: live batch settings.
pub(super) async fn batching_task(
    shared: Arc<Shared>,
    mut entries: mpsc::UnboundedReceiver<Msg>,
    mut settings: watch::Receiver<BatchSettings>,
) {
    let mut state = State::new();
    let instances = shared.workers.instances();
    // Batches dispatched whose session has not finished running them.
    let mut in_flight = 0usize;
    let mut open = true;
    // Set by `Batcher::retire` (the model is unloading or was replaced): no
    // more waiting for batches to fill.
    let mut draining = false;
    // Set when a new version of the model took over: every queued or newly
    // arriving request goes there instead.
    let mut successor: Option<Batcher> = None;
    loop {
        shared.take_finished(|took| {
            in_flight -= 1;
            state.record_run(took);
        });
        let now = Instant::now();
        drop_dead(&shared, &mut state, now);
        if !open && state.is_empty() && in_flight == 0 {
            break;
        }
        let mut current = *settings.borrow();
        if shared.batching.layout().is_none() {
            // Each request runs alone.
            current.max_batch_size = 1;
        }
        let decision = if draining || !open {
            // Retired or closed: run what is queued as soon as a session can take it.
            match !state.is_empty() && in_flight <= instances {
                true => Decision::Flush(Trigger::Drain),
                false => Decision::Idle,
            }
        } else {
            decide(&state, now, &current, Capacity::new(instances, in_flight))
        };
        let wait = match decision {
            Decision::Flush(trigger) => {
                let batch = state.take_batch(Limits::of(&current));
                in_flight += 1;
                dispatch(&shared, batch, trigger);
                continue;
            }
            Decision::Wait(d) => Some(d),
            Decision::Idle => None,
        };
        let wait = until_expiry(wait, &state, now);
        let sleep = async {
            match wait {
                Some(d) => tokio::time::sleep(d).await,
                None => std::future::pending().await,
            }
        };
        let idle = open && !draining && state.is_empty();
        shared.idle.store(idle, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        if !idle && !shared.finished().is_empty() {
            // A batch finished after `take_finished` and did not wake us.
            continue;
        }
        tokio::select! {
            biased;
            () = shared.finish_wake.notified() => {}
            msg = entries.recv(), if open => match msg {
                Some(msg) => {
                    draining |= receive(&shared, &mut state, &mut successor, msg);
                    // Take whatever else is already there before deciding.
                    while let Ok(msg) = entries.try_recv() {
                        draining |= receive(&shared, &mut state, &mut successor, msg);
                    }
                }
                None => open = false,
            },
            Ok(()) = settings.changed(), if open => {}
            () = sleep => {}
        }
    }
    tracing::debug!(model = %shared.model, "batcher drained and stopped");
}

/// Takes the requests that can no longer run out of the queue: an expired
/// one is answered 504, one whose client went away is only counted.
fn drop_dead(shared: &Shared, state: &mut State, now: Instant) {
    for (entry, why) in state.remove_dead(now) {
        leave_queue(shared, &entry);
        match why {
            Dropped::Expired => {
                metrics::dropped(&shared.model, "expired");
                let timeout = entry.deadline.saturating_duration_since(entry.arrival);
                let _ = entry.reply.send(Err(Error::DeadlineExceeded {
                    model: shared.model.to_string(),
                    timeout,
                }));
            }
            Dropped::ClientGone => metrics::dropped(&shared.model, "client_gone"),
        }
    }
}

/// How long the batching task sleeps: the policy's `wait`, cut short at the
/// earliest deadline in the queue (`None`: until something wakes it). An
/// expired request is answered 504 and must stop counting against
/// `max_queue_size` then, not when a batch next ends or arrives.
fn until_expiry(wait: Option<Duration>, state: &State, now: Instant) -> Option<Duration> {
    let expiry = state.next_deadline().map(|d| d.saturating_duration_since(now));
    match (wait, expiry) {
        (Some(w), Some(e)) => Some(w.min(e)),
        (w, e) => w.or(e),
    }
}

/// Queues an entry, or forwards it (and, on a handoff, the whole queue) to
/// the successor version. Returns true for a `Retire`.
fn receive(shared: &Shared, state: &mut State, successor: &mut Option<Batcher>, msg: Msg) -> bool {
    match msg {
        Msg::Retire => return true,
        Msg::Entry(e) => match successor {
            Some(next) => {
                leave_queue(shared, &e);
                next.requeue(e);
            }
            None => state.push(e),
        },
        Msg::Handoff(next) => {
            let moved = state.take_all();
            if !moved.is_empty() {
                tracing::info!(model = %shared.model, requests = moved.len(), "queued requests move to the new version");
            }
            for e in moved {
                leave_queue(shared, &e);
                next.requeue(e);
            }
            *successor = Some(next);
        }
    }
    false
}

/// Releases an entry's queue slot (for a request's last chunk).
fn leave_queue(shared: &Shared, entry: &Entry) {
    if entry.releases_slot {
        let left = shared.queued.fetch_sub(1, Ordering::AcqRel) - 1;
        shared.metrics.queue_size(left);
    }
}

/// Records the batch and runs it: at once when it finishes at its first
/// poll (an inline run), else on a task of its own.
fn dispatch(shared: &Arc<Shared>, mut batch: Vec<Entry>, trigger: Trigger) {
    let now = Instant::now();
    let rows: usize = batch.iter().map(|e| e.rows).sum();
    shared.metrics.batch_dispatched(rows, trigger.as_str());
    if let Some(p) = &shared.padding {
        let parts: Vec<&[Tensor]> = batch.iter().map(|e| &e.inputs[..]).collect();
        let max = longest(&batch);
        metrics::padding_ratio(&shared.model, p.ratio(&parts, &max));
    }
    // Each batch's composition (rows and first input's trailing dims per
    // entry), for benches/padding.rs to replay on raw ONNX Runtime.
    tracing::trace!(
        target: "sluice::batch",
        model = %shared.model,
        rows = ?batch.iter().map(|e| e.rows).collect::<Vec<_>>(),
        dims = ?batch.iter().map(|e| e.inputs.first().map_or(&[][..], |t| &t.shape[1..])).collect::<Vec<_>>(),
        "batch"
    );
    for e in &mut batch {
        let waited = now.saturating_duration_since(e.arrival);
        shared.metrics.queue_delay(waited);
        shared.stats.dispatched(waited);
        leave_queue(shared, e);
        // Ends the entry's `queue` span: its batch has formed.
        e.queue_span = tracing::Span::none();
    }
    // Reports the batch done however it ends: its session freed, panicked,
    // or dropped at shutdown, so it never stays counted in flight.
    let done = Arc::new(Done {
        shared: shared.clone(),
        reported: AtomicBool::new(false),
    });
    let mut run = Box::pin(run_batch(done, batch));
    // A fast model's small batch often runs inline and is done at its first
    // poll: then no task is spawned for it (a task per batch costs CPU per
    // request where batches hold one request; benches/README.md). A panic
    // stays in the batch, as it would in a task of its own: the batching
    // task goes on.
    let first = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        futures_util::FutureExt::now_or_never(run.as_mut())
    }));
    match first {
        Ok(Some(())) => {}
        Ok(None) => {
            tokio::spawn(run);
        }
        Err(_) => tracing::error!(model = %shared.model, "a batch panicked; its requests fail"),
    }
}

/// Calls [`batch_done`] once per batch: when its session is free again
/// (told by the session's thread, see [`SessionFreed`]), or, failing that,
/// when the last reference is dropped (the batch never reached a session,
/// panicked, or was dropped at shutdown), with a zero run time.
struct Done {
    shared: Arc<Shared>,
    reported: AtomicBool,
}

impl SessionFreed for Done {
    /// The batch's session finished its run in `took`: the batching task may
    /// hand it the next batch while this one's answers are still being cut
    /// and sent (for MiniLM's 26-sequence batches, megabytes of copies).
    fn session_free(&self, took: Duration) {
        if !self.reported.swap(true, Ordering::AcqRel) {
            batch_done(&self.shared, took);
        }
    }
}

impl Drop for Done {
    fn drop(&mut self) {
        self.session_free(Duration::ZERO);
    }
}

/// Runs one batch and answers each entry with its own rows. A batch that
/// fails inside ONNX Runtime is retried entry by entry, so that one bad
/// request fails alone (its session counts as free after the first try).
/// A batch whose outputs do not follow its rows turns batching off for the
/// model (see `layout.rs`), and its entries run again alone.
async fn run_batch(done: Arc<Done>, mut batch: Vec<Entry>) {
    let shared = Arc::clone(&done.shared);
    let shared = &*shared;
    let batch_id = next_batch_id();
    // Ends when this function returns: every entry has been answered.
    let span = telemetry::batch_span(&shared.model, &batch_id, batch.iter().map(|e| (&e.span, e.rows)));
    let result = run(shared, &mut batch, Some(done)).instrument(span.clone()).await;
    match result {
        Ok(Ran { outputs, times }) if batch.len() == 1 && batch[0].whole => {
            let e = batch.pop().expect("one entry");
            // It ran alone: its outputs are its answer, whatever their shapes.
            // Whether they follow its rows is evidence for the batches to come.
            if let Some(Err(why)) = shared.batching.layout().map(|l| l.follows(&outputs, e.rows)) {
                shared.batching.turn_off(why);
            }
            shared.stats.executed(1, e.rows, times);
            let _ = e.reply.send(Ok((outputs, batch_id)));
        }
        Ok(Ran { outputs, mut times }) => {
            let split = Instant::now();
            let rows: usize = batch.iter().map(|e| e.rows).sum();
            match cut(shared, &batch, &outputs, rows) {
                Ok(parts) => {
                    // Counted before anyone is answered, so a client that reads the
                    // statistics after its answer sees its batch.
                    times.output = split.elapsed();
                    shared.stats.executed(batch.len(), rows, times);
                    for (e, mine) in batch.into_iter().zip(parts) {
                        let _ = e.reply.send(Ok((mine, batch_id.clone())));
                    }
                }
                Err(evidence) => {
                    shared.batching.turn_off(evidence);
                    alone(shared, batch).await;
                }
            }
        }
        Err(err) if batch.len() > 1 && matches!(err, Error::Runtime { .. } | Error::InvalidInput(_)) => {
            tracing::warn!(model = %shared.model, requests = batch.len(), error = %err, "batch failed; retrying its requests one by one");
            alone(shared, batch).await;
        }
        Err(err) => {
            for e in batch {
                let _ = e.reply.send(Err(err.clone()));
            }
        }
    }
}

/// Each entry's own part of the batch's outputs: its rows, and for a padded
/// model its lengths. Err: the outputs do not follow the batch's rows (or
/// its padded lengths), with the evidence.
fn cut(
    shared: &Shared,
    batch: &[Entry],
    outputs: &[Tensor],
    rows: usize,
) -> Result<Vec<Vec<Tensor>>, String> {
    let layout = shared.batching.axes();
    layout.follows(outputs, rows)?;
    let padded = shared.padding.as_ref().filter(|_| batch.len() > 1);
    if let Some(p) = padded {
        p.check_outputs(outputs, &longest(batch))?;
    }
    let mut offset = 0;
    Ok(batch
        .iter()
        .map(|e| {
            let range = offset..offset + e.rows;
            offset += e.rows;
            match padded {
                // Each output dim padding changed is cut back to the entry's lengths.
                Some(p) => p.split(outputs, range, &e.lengths),
                None => layout.split(outputs, range),
            }
        })
        .collect())
}

/// Runs each entry of a batch alone and answers it.
async fn alone(shared: &Shared, batch: Vec<Entry>) {
    for mut e in batch {
        let r = run_alone(shared, &mut e).await;
        let _ = e.reply.send(r);
    }
}

/// Runs one entry alone. A chunk of a request on a model that no longer
/// batches is answered [`Error::Unbatched`] without running (its request
/// runs again whole), as is one whose outputs, to be joined with the other
/// chunks', turn out not to follow its rows.
async fn run_alone(shared: &Shared, e: &mut Entry) -> EntryResult {
    let unbatched = || Error::Unbatched(shared.model.to_string());
    if !e.whole && shared.batching.off().is_some() {
        return Err(unbatched());
    }
    let ran = run(shared, std::slice::from_mut(e), None).await?;
    if !e.whole {
        if let Err(why) = shared.batching.axes().follows(&ran.outputs, e.rows) {
            shared.batching.turn_off(why);
            return Err(unbatched());
        }
    }
    shared.stats.executed(1, e.rows, ran.times);
    Ok((ran.outputs, next_batch_id()))
}

/// A batch that ran: every output of the model for all its rows, and how
/// long preparing and running it took (`output` is filled by the caller).
struct Ran {
    outputs: Vec<Tensor>,
    times: BatchTimes,
}

/// Concatenates the entries' inputs along their batch axes (a lone entry's
/// inputs are moved, not copied: it is never retried) and runs them.
async fn run(shared: &Shared, batch: &mut [Entry], on_free: Option<Arc<Done>>) -> Result<Ran, Error> {
    let concat = Instant::now();
    // A padded model's batch is padded to its longest entry in each padded dim.
    let padded = shared.padding.as_ref().filter(|_| batch.len() > 1);
    let max = longest(batch);
    let inputs: Vec<Tensor> = match padded {
        _ if batch.len() == 1 => std::mem::take(&mut batch[0].inputs),
        Some(p) => p.concat(&batch.iter().map(|e| &e.inputs[..]).collect::<Vec<_>>(), &max),
        None => shared
            .batching
            .axes()
            .concat(&batch.iter().map(|e| &e.inputs[..]).collect::<Vec<_>>()),
    };
    let oldest = batch
        .iter()
        .map(|e| e.arrival)
        .min()
        .expect("a batch is never empty. This is a bug.");
    let deadline = batch
        .iter()
        .map(|e| e.deadline)
        .max()
        .expect("a batch is never empty. This is a bug.");
    let input = concat.elapsed();
    let lone = batch.len() == 1;
    let result = shared
        .workers
        .run(
            inputs,
            shared.outputs.clone(),
            deadline,
            lone,
            on_free.map(|d| d as Arc<dyn SessionFreed>),
        )
        .await;
    let model = shared.model.to_string();
    match result {
        Ok((outputs, infer)) => {
            shared.metrics.inference(infer);
            let times = BatchTimes {
                input,
                infer,
                output: Duration::ZERO,
            };
            Ok(Ran { outputs, times })
        }
        Err(RunError::Expired) => {
            let timeout = deadline.saturating_duration_since(oldest);
            Err(Error::DeadlineExceeded { model, timeout })
        }
        Err(RunError::Closed) => Err(Error::ModelNotReady {
            name: model,
            reason: "unloading".into(),
        }),
        Err(RunError::Cancelled) => Err(Error::ShuttingDown),
        Err(RunError::Runtime(RuntimeError::InvalidInput(m))) => Err(Error::InvalidInput(m)),
        Err(RunError::Runtime(e)) => {
            let message = crate::error::error_chain(&e);
            tracing::warn!(model = %model, error = %message, "inference failed");
            Err(Error::Runtime {
                model,
                message: message.into(),
            })
        }
    }
}

/// The longest length of each padded dim over the batch's entries (empty without padding).
fn longest(batch: &[Entry]) -> Vec<usize> {
    let mut max = batch.first().map(|e| e.lengths.clone()).unwrap_or_default();
    for e in batch {
        for (m, l) in max.iter_mut().zip(&e.lengths) {
            *m = (*m).max(*l);
        }
    }
    max
}
