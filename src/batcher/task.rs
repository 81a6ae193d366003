//! The batching task: one tokio task per model that owns the queue
//! [`State`], asks [`decide`] what to do, forms batches, and hands each to
//! the pool (on a task of its own unless the batch ran inline at once). It
//! exits once every [`Batcher`] handle is gone and the queue has drained
//! (every accepted request has run; batch tasks send the last answers).
//! Each request that arrives is first weighed for its deadline (the rule
//! is `deadline.rs`'s); `run.rs` runs a formed batch and answers its entries.
//!
//! [`Batcher`]: super::Batcher

use std::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch, Notify};

mod run;

use run::{longest, run_batch};

use super::deadline::{self, Ahead, Times, Verdict};
use super::layout::Batching;
use super::padding::Padding;
use super::policy::{decide, Capacity, Decision, Trigger};
use super::queue::{Dropped, Entry, Limits, State};
use super::{Batcher, Msg};
use crate::batcher::stats::ModelStats;
use crate::error::Error;
use crate::metrics;
use crate::pool::{ModelWorkers, SessionFreed};
use crate::settings::BatchSettings;
use crate::tensor::Tensor;

/// Numbers batches process-wide, so a `batchId` is unique across models.
static NEXT_BATCH: AtomicU64 = AtomicU64::new(1);

/// What the batching task shares with its batch tasks.
pub(super) struct Shared {
    pub model: Arc<str>,
    /// The version these sessions are (`parameters.version`, a version
    /// folder): each answer names the version that computed it, which is
    /// this batcher's even for a request handed over from the one before.
    pub version: Option<Arc<str>>,
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
    /// Batches whose session is free again, pushed as each run ends by the
    /// thread that ran it (a session thread, or the batching task for an
    /// inline run), before the answers are cut and sent (see
    /// [`batch_done`]); taken by the batching task before each decision.
    pub finished: Mutex<Vec<Finished>>,
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

/// A batch whose session is free again.
#[derive(Debug, Clone, Copy)]
pub(super) struct Finished {
    /// Its number in [`InFlight`].
    seq: u64,
    /// Its size as the cost model counts it.
    units: usize,
    /// Its run time (zero when it did not run).
    took: Duration,
}

impl Shared {
    /// The finished batches (a panic while it was held leaves the list as
    /// usable as before).
    fn finished(&self) -> std::sync::MutexGuard<'_, Vec<Finished>> {
        self.finished.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Hands `each` the batches finished since the last call (drained in
    /// place: the list keeps its buffer, so a finished batch does not
    /// allocate).
    fn take_finished(&self, mut each: impl FnMut(Finished)) {
        self.finished().drain(..).for_each(&mut each);
    }
}

/// The batches dispatched whose session has not finished them (owned by
/// the batching task): each one's number, when it was dispatched, and its
/// predicted run time. At most one more than the model's sessions.
#[derive(Debug, Default)]
struct InFlight {
    batches: Vec<(u64, Instant, Duration)>,
    next_seq: u64,
}

impl InFlight {
    fn len(&self) -> usize {
        self.batches.len()
    }

    /// Counts a batch dispatched `at`, predicted to run `predicted`; returns its number.
    fn add(&mut self, at: Instant, predicted: Duration) -> u64 {
        self.next_seq += 1;
        self.batches.push((self.next_seq, at, predicted));
        self.next_seq
    }

    fn done(&mut self, seq: u64) {
        self.batches.retain(|b| b.0 != seq);
    }

    /// What is predicted to be left of their runs at `now`.
    fn remaining(&self, now: Instant) -> Duration {
        self.batches
            .iter()
            .map(|&(_, at, predicted)| predicted.saturating_sub(now.saturating_duration_since(at)))
            .sum()
    }
}

impl Shared {
    /// A new batch's tag: its id and the version that runs it.
    pub(super) fn tag(&self) -> super::BatchTag {
        super::BatchTag {
            id: next_batch_id(),
            version: self.version.clone(),
        }
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
fn batch_done(shared: &Shared, finished: Finished) {
    shared.finished().push(finished);
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
    let mut in_flight = InFlight::default();
    let mut open = true;
    // Set by `Batcher::retire` (the model is unloading or was replaced): no
    // more waiting for batches to fill.
    let mut draining = false;
    // Set when a new version of the model took over: every queued or newly
    // arriving request goes there instead.
    let mut successor: Option<Batcher> = None;
    // When the cost and the predicted wait are next published: gauges and
    // statistics are read far more rarely than requests arrive.
    let mut next_publish = Instant::now();
    loop {
        shared.take_finished(|f| {
            in_flight.done(f.seq);
            state.record_run(f.units, f.took);
        });
        let now = Instant::now();
        drop_dead(&shared, &mut state, now);
        if !open && state.is_empty() && in_flight.len() == 0 {
            break;
        }
        let current = current_settings(&shared, &settings);
        if now >= next_publish {
            publish_outlook(&shared, &state, &current, in_flight.remaining(now));
            next_publish = now + PUBLISH_EVERY;
        }
        let sessions = (instances, in_flight.len());
        let wait = match what_now(&state, now, &current, sessions, draining || !open) {
            Decision::Flush(trigger) => {
                flush(&shared, &mut state, &current, &mut in_flight, trigger, now);
                continue;
            }
            Decision::Wait(d) => Some(d),
            Decision::Idle => None,
        };
        let sleep = sleep_for(until_expiry(wait, &state, now));
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
                    let now = Instant::now();
                    let mut to = Queue {
                        state: &mut state,
                        successor: &mut successor,
                        settings: &current,
                        in_flight: in_flight.remaining(now),
                        now,
                    };
                    draining |= receive(&shared, &mut to, msg);
                    // Take whatever else is already there before deciding.
                    while let Ok(msg) = entries.try_recv() {
                        draining |= receive(&shared, &mut to, msg);
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

/// Sleeps `wait`, or forever for `None`.
async fn sleep_for(wait: Option<Duration>) {
    match wait {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}

/// What the loop does now, with `sessions` (the model's sessions, the
/// batches in flight): [`decide`]'s answer, or, once the model is retired or
/// its handles are gone (`winding_down`), run what is queued as soon as a
/// session can take it.
fn what_now(
    state: &State,
    now: Instant,
    current: &BatchSettings,
    (instances, running): (usize, usize),
    winding_down: bool,
) -> Decision {
    if !winding_down {
        return decide(state, now, current, Capacity::new(instances, running));
    }
    match !state.is_empty() && running <= instances {
        true => Decision::Flush(Trigger::Drain),
        false => Decision::Idle,
    }
}

/// Forms the batch [`decide`] asked for and hands it to a session.
fn flush(
    shared: &Arc<Shared>,
    state: &mut State,
    current: &BatchSettings,
    in_flight: &mut InFlight,
    trigger: Trigger,
    now: Instant,
) {
    let batch = state.take_batch(Limits::of(current));
    let units = batch_units(&batch);
    let predicted = state.cost().map_or(Duration::ZERO, |f| f.predict(units));
    let seq = in_flight.add(now, predicted);
    dispatch(shared, batch, trigger, (seq, units));
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

/// The batch settings in force: the live ones, with batching off while
/// the model's outputs do not follow its rows (each request runs alone).
fn current_settings(shared: &Shared, settings: &watch::Receiver<BatchSettings>) -> BatchSettings {
    let mut current = *settings.borrow();
    if shared.batching.layout().is_none() {
        current.max_batch_size = 1;
    }
    current
}

/// The rows of a batch, or a padded batch's tokens: its size as the cost
/// model counts it.
fn batch_units(batch: &[Entry]) -> usize {
    let rows: usize = batch.iter().map(|e| e.rows).sum();
    rows.saturating_mul(longest(batch).iter().product::<usize>().max(1))
}

/// How often the batching task publishes the cost and the predicted wait, at most.
const PUBLISH_EVERY: Duration = Duration::from_millis(10);

/// Publishes the fitted batch cost and the predicted queue wait (the
/// gauges, and the model's statistics) once there is a fit.
fn publish_outlook(shared: &Shared, state: &State, settings: &BatchSettings, in_flight: Duration) {
    let Some(fit) = state.cost() else {
        return;
    };
    let (units, entries) = state.ahead(u32::MAX);
    let ahead = Ahead {
        in_flight,
        queued: units,
        entries,
        own: 0,
        max_batch: Limits::of(settings).max_units(state.head_tokens_per_row()),
        sessions: shared.workers.instances(),
        arriving_above: 0.0,
        everyone: (units, entries),
    };
    let wait = deadline::predict(&fit, &ahead).ahead;
    shared.metrics.cost(fit.terms(), wait);
    shared.stats.cost(&fit, wait);
}

/// Where [`receive`] puts what arrives, and what it needs to admit it.
struct Queue<'a> {
    state: &'a mut State,
    /// The version that took over, if one did.
    successor: &'a mut Option<Batcher>,
    settings: &'a BatchSettings,
    /// What is left of the dispatched batches' runs, predicted.
    in_flight: Duration,
    now: Instant,
}

/// Queues an entry (unless it is predicted to miss its deadline), or
/// forwards it (and, on a handoff, the whole queue) to the successor
/// version. Returns true for a `Retire`.
fn receive(shared: &Shared, to: &mut Queue<'_>, msg: Msg) -> bool {
    match msg {
        Msg::Retire => return true,
        Msg::Entry(e) => match to.successor {
            Some(next) => {
                leave_queue(shared, &e);
                next.requeue(e);
            }
            None => {
                if let Some(e) = admit(shared, to, e) {
                    to.state.push(e);
                }
            }
        },
        Msg::Handoff(next) => {
            let moved = to.state.take_all();
            if !moved.is_empty() {
                tracing::info!(model = %shared.model, requests = moved.len(), "queued requests move to the new version");
            }
            for e in moved {
                leave_queue(shared, &e);
                next.requeue(e);
            }
            *to.successor = Some(next);
        }
    }
    false
}

/// The entry, unless it is predicted to miss its deadline (the rule:
/// `deadline.rs`): then it is answered 503 and counted as dropped
/// (`predicted_late`). Admitted while the model's cost is unknown, or with
/// `refuse_predicted_late` off.
fn admit(shared: &Shared, to: &Queue<'_>, e: Entry) -> Option<Entry> {
    let fit = to.state.cost().filter(|_| to.settings.refuse_predicted_late);
    let Some(fit) = fit else {
        return Some(e);
    };
    let (queued, entries) = to.state.ahead(e.level);
    let ahead = Ahead {
        in_flight: to.in_flight,
        queued,
        entries,
        own: e.units(),
        max_batch: Limits::of(to.settings).max_units(e.tokens_per_row()),
        sessions: shared.workers.instances(),
        arriving_above: to.state.arriving_above(e.level),
        everyone: to.state.ahead(u32::MAX),
    };
    // Only a request that higher levels can jump weighs the queue's
    // deadlines (a walk of the queue).
    let jumpable = deadline::jumpable(e.level, ahead.arriving_above);
    let times = Times {
        to_deadline: e.deadline.saturating_duration_since(to.now),
        timeout: to.settings.timeout,
        tightest: jumpable
            .then(|| to.state.next_deadline())
            .flatten()
            .map(|d| d.saturating_duration_since(to.now)),
    };
    let Verdict::Refuse {
        predicted,
        retry_after,
    } = deadline::verdict(&fit, &ahead, e.level, times)
    else {
        return Some(e);
    };
    leave_queue(shared, &e);
    metrics::dropped(&shared.model, "predicted_late");
    let _ = e.reply.send(Err(Error::PredictedLate {
        model: shared.model.to_string(),
        predicted: to
            .now
            .saturating_duration_since(e.arrival)
            .saturating_add(predicted),
        timeout: e.deadline.saturating_duration_since(e.arrival),
        retry_after,
    }));
    None
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
/// `(seq, units)`: its number in [`InFlight`] and its size.
fn dispatch(shared: &Arc<Shared>, mut batch: Vec<Entry>, trigger: Trigger, (seq, units): (u64, usize)) {
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
        seq,
        units,
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
    /// The batch's number in [`InFlight`] and its size.
    seq: u64,
    units: usize,
}

impl SessionFreed for Done {
    /// The batch's session finished its run in `took`: the batching task may
    /// hand it the next batch while this one's answers are still being cut
    /// and sent (for MiniLM's 26-sequence batches, megabytes of copies).
    fn session_free(&self, took: Duration) {
        if !self.reported.swap(true, Ordering::AcqRel) {
            let (seq, units) = (self.seq, self.units);
            batch_done(&self.shared, Finished { seq, units, took });
        }
    }
}

impl Drop for Done {
    fn drop(&mut self) {
        self.session_free(Duration::ZERO);
    }
}
