//! The shared session pool (SPEC §6). Every model's sessions run on
//! dedicated OS threads (never on the async runtime: `Session::run` blocks
//! for the whole inference). One [`DeviceScheduler`] per device (the CPU,
//! each GPU) bounds how many batches run on it at once across all models,
//! and hands free slots to the batch that has waited longest for one.
//!
//! A batch goes: model session slot (FIFO within the model) → device slot
//! (oldest batch first across models) → the model's session thread. Both slots
//! travel with the job and are released by the session thread when the run
//! ends, so a caller that gives up can never leave the device
//! oversubscribed. A batch that waited for its device slot is sent to its
//! session thread by the session thread that freed the slot.

mod cancel;
pub mod fair;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
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

/// One batch on its way to a session thread.
struct Job {
    inputs: Vec<Tensor>,
    outputs: Vec<String>,
    /// Past this instant the job is skipped, not run.
    deadline: Instant,
    /// The caller awaits the result here.
    reply: oneshot::Sender<Result<(Vec<Tensor>, Duration), RunError>>,
    /// Released by the session thread when the run ends, the device slot
    /// first (a tuple drops in field order): it must go to a batch already
    /// waiting at the device, often another model's, before this model's
    /// next batch, woken by the session slot, can queue for it there with
    /// its older requests and take it again.
    _slots: (DevicePermit, OwnedSemaphorePermit),
}

/// The sessions of one model placed on one device.
struct Group {
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
    _threads: Vec<JoinHandle<()>>,
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
        let mut by_device: Vec<(Device, Vec<Box<dyn Session>>)> = Vec::new();
        for (device, s) in sessions {
            match by_device.iter_mut().find(|(d, _)| *d == device) {
                Some((_, v)) => v.push(s),
                None => by_device.push((device, vec![s])),
            }
        }
        let (mut groups, mut threads, mut warmed) = (Vec::new(), Vec::new(), Vec::new());
        let mut instance = 0;
        for (device, group_sessions) in by_device {
            let (tx, rx) = crossbeam_channel::bounded::<Job>(group_sessions.len());
            let permits = Arc::new(Semaphore::new(group_sessions.len()));
            for mut session in group_sessions {
                if let Some(c) = session.canceller() {
                    pool.runs.register(&c);
                }
                let (rx, runs) = (rx.clone(), pool.runs.clone());
                let (warm_tx, warm_rx) = oneshot::channel();
                warmed.push(warm_rx);
                let (warmup, outputs) = (warmup.clone(), outputs.clone());
                let span = tracing::info_span!("session", model = %model, instance, device = %device);
                let t = std::thread::Builder::new()
                    .name(format!("sluice-s{instance}-{model}").chars().take(15).collect())
                    .spawn(move || {
                        let _g = span.enter();
                        let _ = warm_tx.send(warm_up(session.as_mut(), &warmup, &outputs));
                        session_loop(session.as_mut(), rx, &runs);
                    })
                    .expect("cannot spawn a session thread");
                threads.push(t);
                instance += 1;
            }
            groups.push(Group {
                tx,
                sessions: permits,
                scheduler: pool.scheduler(device),
            });
        }
        let w = ModelWorkers {
            groups,
            next_group: AtomicUsize::new(0),
            instances,
            _threads: threads,
        };
        (w, warmed)
    }

    /// Number of sessions.
    pub fn instances(&self) -> usize {
        self.instances
    }

    /// Runs one batch and waits for its outputs and how long the session
    /// took to run it (slot waits not included).
    pub async fn run(
        &self,
        inputs: Vec<Tensor>,
        outputs: Vec<String>,
        deadline: Instant,
    ) -> Result<(Vec<Tensor>, Duration), RunError> {
        let i = self.next_group.fetch_add(1, Ordering::Relaxed) % self.groups.len();
        let group = &self.groups[i];
        let session = group
            .sessions
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| RunError::Closed)?;
        let (reply, rx) = oneshot::channel();
        let jobs = group.tx.clone();
        // The batch's place in the device queue: when it asked for a slot.
        // With the slot, the job goes straight to a session thread of the
        // model (from the thread whose run freed the slot, when it waited).
        group.scheduler.submit(
            Instant::now(),
            Box::new(move |device| {
                let job = Job {
                    inputs,
                    outputs,
                    deadline,
                    reply,
                    _slots: (device, session),
                };
                // The session permit guarantees room; a closed channel (the
                // model is gone) drops the job, which closes `reply`.
                let _ = jobs.try_send(job);
            }),
        );
        rx.await.map_err(|_| RunError::Closed)?
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

/// Serves jobs until every sender is gone (the model was dropped).
fn session_loop(session: &mut dyn Session, rx: crossbeam_channel::Receiver<Job>, runs: &Runs) {
    while let Ok(job) = rx.recv() {
        if job.reply.is_closed() {
            continue;
        }
        if Instant::now() >= job.deadline {
            let _ = job.reply.send(Err(RunError::Expired));
            continue;
        }
        let run = runs.start();
        // Checked after counting the run: shutdown cancels, then waits for
        // the count to reach 0, so a run either sees the flag here or is
        // counted before the cancel and waited for.
        if runs.cancelled() {
            let _ = job.reply.send(Err(RunError::Cancelled));
            continue;
        }
        let started = Instant::now();
        let result = session
            .run(&job.inputs, &job.outputs)
            .map(|out| (out, started.elapsed()))
            .map_err(|e| match runs.cancelled() {
                true => RunError::Cancelled,
                false => RunError::from(e),
            });
        drop(run);
        let _ = job.reply.send(result);
    }
    tracing::debug!("session thread exits");
}
