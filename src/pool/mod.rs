//! The shared session pool (SPEC §6). Each session has a dedicated OS
//! thread. One [`DeviceScheduler`] per device (the CPU, each GPU) bounds how
//! many batches run on it at once across all models, and hands free slots
//! to the batch that has waited longest for one (within a priority level:
//! a batch of a lower level counts as having asked later, see `fair.rs`).
//!
//! A batch takes a session slot of its model (FIFO within the model), then
//! a device slot; both travel with it and are released when its run ends,
//! so a caller that gives up can never leave the device oversubscribed. It
//! then runs in one of three places:
//! - **inline**, on the thread that formed it (the batching task, on the
//!   async runtime), when it is a lone request of a model whose runs take
//!   under [`INLINE_RUN_LIMIT`] and a session and the device are free at
//!   once: waking a session thread would cost more than the run;
//! - **on its model's session thread**, the usual place: `Session::run`
//!   blocks for the whole inference, so longer runs never hold an async
//!   worker;
//! - **on the session thread that freed its device slot** (another model's,
//!   `handoff`), when it had to wait for that slot and its model is fast:
//!   the next run on the device starts without waking a second thread.

mod cancel;
pub mod fair;
mod handoff;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};

pub use cancel::Runs;
pub use fair::{DevicePermit, DeviceScheduler};

use crate::runtime::{Device, RuntimeError, Session};
use crate::tensor::Tensor;

/// Why a job produced no outputs.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The session failed.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// The job's deadline passed before a session was free; it was not run.
    #[error("deadline passed before the batch ran")]
    Expired,
    /// Every worker thread is gone (the model is unloading).
    #[error("the model's sessions are shut down")]
    Closed,
    /// The server's grace period is over: the run was cancelled, or not started.
    #[error("cancelled: the server is shutting down")]
    Cancelled,
}

/// How many batches may run at once on each kind of device.
#[derive(Debug, Clone, Copy)]
pub struct PoolLimits {
    pub cpu: usize,
    pub gpu: usize,
}

/// The device schedulers, created on first use and shared by every model.
pub struct Pool {
    limits: PoolLimits,
    /// One scheduler per device; written when a model first lands on a device.
    devices: Mutex<HashMap<Device, Arc<DeviceScheduler>>>,
    /// Every session's runs, for cancelling them at shutdown.
    runs: Arc<Runs>,
}

impl Pool {
    pub fn new(limits: PoolLimits) -> Arc<Pool> {
        Arc::new(Pool {
            limits,
            devices: Mutex::new(HashMap::new()),
            runs: Arc::new(Runs::default()),
        })
    }

    /// The runs of every session of every model (cancel them at shutdown).
    pub fn runs(&self) -> &Runs {
        &self.runs
    }

    /// The scheduler of `device`.
    pub fn scheduler(&self, device: Device) -> Arc<DeviceScheduler> {
        let mut d = self.devices.lock().expect("pool lock poisoned");
        d.entry(device)
            .or_insert_with(|| {
                let limit = match device {
                    Device::Cpu => self.limits.cpu,
                    Device::Cuda(_) => self.limits.gpu,
                };
                DeviceScheduler::new(limit)
            })
            .clone()
    }
}

/// Told, on the thread that ran a batch, that its session is free again:
/// after the run and after the batch's slots are released, before its
/// outputs go back to the caller. The batcher forms its next batch then,
/// instead of after the caller's task has woken and answered this one.
pub trait SessionFreed: Send + Sync {
    /// `took`: the run's duration (zero when the batch did not run).
    fn session_free(&self, took: Duration);
}

/// One batch on its way to a session thread.
struct Job {
    inputs: Vec<Tensor>,
    outputs: Vec<String>,
    /// Past this instant the job is skipped, not run.
    deadline: Instant,
    /// The caller awaits the result here.
    reply: oneshot::Sender<Result<(Vec<Tensor>, Duration), RunError>>,
    /// The model's sessions on this device, for a thread the job is handed to.
    sessions: Arc<[SharedSession]>,
    /// The model's last run time ([`ModelWorkers::last_run_ns`]).
    last_run_ns: Arc<AtomicU64>,
    /// Released by the session thread when the run ends, the device slot
    /// first (a tuple drops in field order): it must go to a batch already
    /// waiting at the device, often another model's, before this model's
    /// next batch, woken by the session slot, can queue for it there with
    /// its older requests and take it again.
    slots: (DevicePermit, OwnedSemaphorePermit),
    /// Told once the run is over and the slots are released.
    on_free: Option<Arc<dyn SessionFreed>>,
}

/// One session. Locked by its session thread for each job, and by a batch
/// that runs inline ([`ModelWorkers::run`]); whoever locks it holds one of
/// the group's session permits, so the lock is free when it is taken.
type SharedSession = Arc<Mutex<Box<dyn Session>>>;

/// The lock of a session (a run that panicked poisons it; the session itself is still usable).
fn lock(session: &SharedSession) -> MutexGuard<'_, Box<dyn Session>> {
    session.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Runs that took less than this may run inline, on the thread that
/// formed the batch, when a session and the device are free: waking a
/// session thread and being woken by it costs more than such a run.
const INLINE_RUN_LIMIT: Duration = Duration::from_micros(100);

/// True for a model whose last run (`last_run_ns`) took under
/// [`INLINE_RUN_LIMIT`]: its small batches run inline, and its waiting
/// batches on the session thread that frees the device.
fn is_fast(last_run_ns: &AtomicU64) -> bool {
    last_run_ns.load(Ordering::Relaxed) < INLINE_RUN_LIMIT.as_nanos() as u64
}

/// The sessions of one model placed on one device.
struct Group {
    /// The group's sessions, for the batches that run inline or are handed
    /// to another model's session thread.
    all: Arc<[SharedSession]>,
    /// Jobs for this group's session threads (each holds a clone of the
    /// receiver). Bounded by the number of sessions, and `sessions` permits
    /// guarantee there is room, so a send never waits.
    tx: crossbeam_channel::Sender<Job>,
    /// One permit per session of the group: a batch holds one from before it
    /// asks the device for a slot until its run ends.
    sessions: Arc<Semaphore>,
    scheduler: Arc<DeviceScheduler>,
}

/// The worker threads of one model's sessions.
pub struct ModelWorkers {
    groups: Vec<Group>,
    next_group: AtomicUsize,
    instances: usize,
    /// True when the sessions run on a GPU.
    gpu: bool,
    /// The last run's duration in ns (u64::MAX before the first): a model
    /// whose runs take under [`INLINE_RUN_LIMIT`] runs small batches inline.
    /// Written after every run, by session threads and inline runs alike.
    last_run_ns: Arc<AtomicU64>,
    /// Every session's runs (cancelled at shutdown), for the inline runs.
    runs: Arc<Runs>,
    _threads: Vec<JoinHandle<()>>,
    /// Closed once every session thread has dropped its session (each
    /// holds a sender until then): the memory of the sessions is back.
    released: tokio::sync::watch::Receiver<()>,
}

/// Session threads alive, process-wide. Each owns its session until it
/// exits, and the process waits for them before it exits
/// ([`wait_for_session_threads`]): a CUDA session still being destroyed
/// while the process tears down its libraries can crash it after a clean
/// shutdown.
static LIVE_THREADS: LiveThreads = LiveThreads {
    count: Mutex::new(0),
    exited: Condvar::new(),
};

struct LiveThreads {
    /// Session threads spawned and not yet exited.
    count: Mutex<usize>,
    /// Notified by each session thread as it exits; `wait_for_session_threads` waits.
    exited: Condvar,
}

impl LiveThreads {
    fn count(&self) -> MutexGuard<'_, usize> {
        self.count.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Counts one session thread from before it is spawned until it exits
/// (after its session is dropped), a panic included.
struct LiveThread;

impl LiveThread {
    fn new() -> LiveThread {
        *LIVE_THREADS.count() += 1;
        LiveThread
    }
}

impl Drop for LiveThread {
    fn drop(&mut self) {
        *LIVE_THREADS.count() -= 1;
        LIVE_THREADS.exited.notify_all();
    }
}

/// Waits until every session thread has exited and dropped its session
/// (their models are gone once the server has stopped), for at most
/// `limit`. Returns how many are still running. Called by `sluice serve`
/// before the process exits.
pub fn wait_for_session_threads(limit: Duration) -> usize {
    let count = LIVE_THREADS.count();
    let (count, _) = LIVE_THREADS
        .exited
        .wait_timeout_while(count, limit, |n| *n > 0)
        .unwrap_or_else(|e| e.into_inner());
    *count
}

/// A warm-up outcome of one session.
pub type WarmupResult = Result<(), String>;

/// One warm-up batch, run on every session before the model turns ready.
#[derive(Debug, Clone)]
pub struct Warmup {
    /// The inputs, in signature order.
    pub inputs: Vec<Tensor>,
    /// True for a batch the model may refuse (a padded model's longer
    /// lengths): warm-up then stops there and the model still loads. Optional
    /// batches come after every required one.
    pub optional: bool,
}

impl ModelWorkers {
    /// Starts one thread per session. Each thread first runs the `warmup`
    /// batches on its own session and reports through the returned
    /// receivers, then serves jobs.
    pub fn spawn(
        model: &str,
        sessions: Vec<(Device, Box<dyn Session>)>,
        pool: &Pool,
        warmup: Vec<Warmup>,
        outputs: Vec<String>,
    ) -> (ModelWorkers, Vec<oneshot::Receiver<WarmupResult>>) {
        let instances = sessions.len();
        let gpu = sessions.iter().any(|(d, _)| d.is_cuda());
        let mut by_device: Vec<(Device, Vec<Box<dyn Session>>)> = Vec::new();
        for (device, s) in sessions {
            match by_device.iter_mut().find(|(d, _)| *d == device) {
                Some((_, v)) => v.push(s),
                None => by_device.push((device, vec![s])),
            }
        }
        let (mut groups, mut threads, mut warmed) = (Vec::new(), Vec::new(), Vec::new());
        let mut instance = 0;
        let last_run_ns = Arc::new(AtomicU64::new(u64::MAX));
        let (released_tx, released) = tokio::sync::watch::channel(());
        for (device, group_sessions) in by_device {
            let (tx, rx) = crossbeam_channel::bounded::<Job>(group_sessions.len());
            let permits = Arc::new(Semaphore::new(group_sessions.len()));
            let mut all = Vec::new();
            for session in group_sessions {
                if let Some(c) = session.canceller() {
                    pool.runs.register(&c);
                }
                let session: SharedSession = Arc::new(Mutex::new(session));
                all.push(session.clone());
                let (rx, runs) = (rx.clone(), pool.runs.clone());
                let (warm_tx, warm_rx) = oneshot::channel();
                warmed.push(warm_rx);
                let (warmup, outputs) = (warmup.clone(), outputs.clone());
                let span = tracing::info_span!("session", model = %model, instance, device = %device);
                let live = LiveThread::new();
                let holding = released_tx.clone();
                let t = std::thread::Builder::new()
                    .name(format!("sluice-s{instance}-{model}").chars().take(15).collect())
                    .spawn(move || {
                        let _live = live;
                        let _g = span.enter();
                        let _ = warm_tx.send(warm_up(lock(&session).as_mut(), &warmup, &outputs));
                        session_loop(&session, rx, &runs);
                        // Usually the last reference: the session goes
                        // before this thread counts as exited.
                        drop(session);
                        drop(holding);
                    })
                    .expect("cannot spawn a session thread");
                threads.push(t);
                instance += 1;
            }
            groups.push(Group {
                all: all.into(),
                tx,
                sessions: permits,
                scheduler: pool.scheduler(device),
            });
        }
        let w = ModelWorkers {
            groups,
            next_group: AtomicUsize::new(0),
            instances,
            gpu,
            last_run_ns,
            runs: pool.runs.clone(),
            _threads: threads,
            released,
        };
        (w, warmed)
    }

    /// A receiver that is closed once every session thread has dropped its
    /// session (after these workers are dropped and their last jobs ran).
    pub fn released(&self) -> tokio::sync::watch::Receiver<()> {
        self.released.clone()
    }

    /// Number of sessions.
    pub fn instances(&self) -> usize {
        self.instances
    }

    /// True when the sessions run on a GPU (batch settings' device defaults).
    pub fn on_gpu(&self) -> bool {
        self.gpu
    }

    /// Runs one batch and waits for its outputs and how long the session
    /// took to run it (slot waits not included). A `lone` request's batch
    /// of a model whose last run was shorter than [`INLINE_RUN_LIMIT`] runs
    /// here, on the calling thread, when a session and the device are free
    /// at once. (Bigger batches come under load, when session threads are
    /// awake anyway and run beside the threads that serve HTTP.)
    ///
    /// `level` is the batch's priority level (1 the highest; 0 for a model
    /// without levels, which counts as 1): at the device, a batch waits
    /// behind other models' batches of higher levels (see `fair.rs`).
    pub async fn run(
        &self,
        inputs: Vec<Tensor>,
        outputs: Vec<String>,
        (deadline, level): (Instant, u32),
        lone: bool,
        on_free: Option<Arc<dyn SessionFreed>>,
    ) -> Result<(Vec<Tensor>, Duration), RunError> {
        let i = self.next_group.fetch_add(1, Ordering::Relaxed) % self.groups.len();
        let group = &self.groups[i];
        if lone && is_fast(&self.last_run_ns) {
            if let Some(ran) = self.run_inline(group, &inputs, &outputs, deadline) {
                report_free(on_free, &ran);
                return ran;
            }
        }
        let session = group
            .sessions
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| RunError::Closed)?;
        let (reply, rx) = oneshot::channel();
        let jobs = group.tx.clone();
        let (sessions, last_run_ns) = (group.all.clone(), self.last_run_ns.clone());
        // The batch's place in the device queue: when it asked for a slot,
        // later by its level (see `fair.rs`). With the slot, the job goes straight to a session thread of the
        // model, or, when it waited and the model is fast, runs on the
        // session thread whose run freed the slot.
        group.scheduler.submit(
            fair::key(Instant::now(), level),
            Box::new(move |device| {
                let fast = is_fast(&last_run_ns);
                let job = Job {
                    inputs,
                    outputs,
                    deadline,
                    reply,
                    sessions,
                    last_run_ns,
                    slots: (device, session),
                    on_free,
                };
                let job = match fast {
                    true => handoff::offer(job),
                    false => Err(job),
                };
                // The session permit guarantees room; a closed channel (the
                // model is gone) drops the job, which closes `reply`.
                if let Err(job) = job {
                    let _ = jobs.try_send(job);
                }
            }),
        );
        rx.await.map_err(|_| RunError::Closed)?
    }
}

impl ModelWorkers {
    /// Runs a batch on this thread when a session of `group` and a slot of
    /// its device are free now (`None` otherwise: the batch goes to a
    /// session thread). The same checks as a session thread's.
    fn run_inline(
        &self,
        group: &Group,
        inputs: &[Tensor],
        outputs: &[String],
        deadline: Instant,
    ) -> Option<Result<(Vec<Tensor>, Duration), RunError>> {
        let permit = group.sessions.clone().try_acquire_owned().ok()?;
        let device = group.scheduler.try_acquire()?;
        let mut session = group.all.iter().find_map(|s| s.try_lock().ok())?;
        let ran = run_checked(
            session.as_mut(),
            inputs,
            outputs,
            deadline,
            &self.runs,
            &self.last_run_ns,
        );
        drop(session);
        // The device slot first, as a session thread releases them.
        drop((device, permit));
        Some(ran)
    }
}

/// Runs the warm-up batches on one session; the first required one that fails fails it.
fn warm_up(session: &mut dyn Session, warmup: &[Warmup], outputs: &[String]) -> WarmupResult {
    for batch in warmup {
        if let Err(e) = session.run(&batch.inputs, outputs) {
            let shape = batch.inputs.first().map(|t| t.shape.clone()).unwrap_or_default();
            if batch.optional {
                tracing::info!(
                    ?shape,
                    error = %e,
                    "warm-up stops at a length the model refuses (requests that long will fail too)"
                );
                return Ok(());
            }
            return Err(format!("warm-up batch of shape {shape:?} failed: {e}"));
        }
    }
    Ok(())
}

/// Serves jobs until every sender is gone (the model was dropped): its own,
/// and those handed to it by the runs it ends (`handoff`), its own first.
fn session_loop(session: &SharedSession, rx: crossbeam_channel::Receiver<Job>, runs: &Runs) {
    handoff::become_taker();
    while let Ok(job) = rx.recv() {
        run_job(job, Some(session), runs);
        loop {
            if let Ok(own) = rx.try_recv() {
                run_job(own, Some(session), runs);
            } else if let Some(handed) = handoff::take() {
                // Another model's run must not take this model's thread
                // down. A session's panic is already the batch's error
                // (`run_checked`); any other panic drops that job (its
                // caller sees the sessions closed) and this thread goes on.
                let ran =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run_job(handed, None, runs)));
                if ran.is_err() {
                    tracing::error!("a batch handed over from another model panicked in its session");
                }
            } else {
                break;
            }
        }
    }
    tracing::debug!("session thread exits");
}

/// Runs `job` on `session`, or on a free session of the job's model when
/// it was handed to this thread, and answers it; dropping it then releases
/// its slots. A job whose caller is gone is dropped unrun.
fn run_job(job: Job, session: Option<&SharedSession>, runs: &Runs) {
    if job.reply.is_closed() {
        return;
    }
    // The job holds one of its model's session permits, so one of its
    // sessions is free (their lockers hold the others).
    let mut locked = match session {
        Some(own) => lock(own),
        None => job
            .sessions
            .iter()
            .find_map(|s| s.try_lock().ok())
            .unwrap_or_else(|| lock(&job.sessions[0])),
    };
    let result = run_checked(
        locked.as_mut(),
        &job.inputs,
        &job.outputs,
        job.deadline,
        runs,
        &job.last_run_ns,
    );
    drop(locked);
    let Job {
        reply,
        slots,
        on_free,
        ..
    } = job;
    drop(slots);
    report_free(on_free, &result);
    let _ = reply.send(result);
}

/// Tells `on_free` (if any) that a batch's session is free, with its run
/// time (zero when it did not run).
fn report_free(on_free: Option<Arc<dyn SessionFreed>>, result: &Result<(Vec<Tensor>, Duration), RunError>) {
    if let Some(f) = on_free {
        f.session_free(result.as_ref().map_or(Duration::ZERO, |(_, took)| *took));
    }
}

/// The message of a caught panic.
fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    match (panic.downcast_ref::<&str>(), panic.downcast_ref::<String>()) {
        (Some(s), _) => s.to_string(),
        (_, Some(s)) => s.clone(),
        _ => "(no message)".to_string(),
    }
}

/// Runs a batch on `session` unless its deadline has passed or shutdown
/// cancelled the runs, and records how long it took in `last_run_ns`. A
/// panic in the session is the batch's error: it must not take the session
/// thread (or the async worker of an inline run) down with it.
fn run_checked(
    session: &mut dyn Session,
    inputs: &[Tensor],
    outputs: &[String],
    deadline: Instant,
    runs: &Runs,
    last_run_ns: &AtomicU64,
) -> Result<(Vec<Tensor>, Duration), RunError> {
    if Instant::now() >= deadline {
        return Err(RunError::Expired);
    }
    let run = runs.start();
    // Checked after counting the run: shutdown cancels, then waits for
    // the count to reach 0, so a run either sees the flag here or is
    // counted before the cancel and waited for.
    if runs.cancelled() {
        return Err(RunError::Cancelled);
    }
    let started = Instant::now();
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| session.run(inputs, outputs)))
        .unwrap_or_else(|panic| Err(RuntimeError::Panicked(panic_text(&*panic))));
    let result = result.map_err(|e| match runs.cancelled() {
        true => RunError::Cancelled,
        false => RunError::from(e),
    });
    let took = started.elapsed();
    drop(run);
    last_run_ns.store(
        took.as_nanos().min(u64::MAX as u128 - 1) as u64,
        Ordering::Relaxed,
    );
    result.map(|out| (out, took))
}

#[cfg(test)]
mod tests;
