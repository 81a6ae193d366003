//! Runs batches on ONNX Runtime sessions, on dedicated OS threads (never on
//! the async runtime: `Session::run` blocks for the whole inference).
//!
//! Today each model owns its sessions: `ModelWorkers` starts one thread per
//! instance, and all of them pull jobs from one bounded channel, so whichever
//! session is free takes the next batch. The shared per-device scheduler
//! (SPEC §6) replaces the channel here without changing `ModelWorkers::run`.

use std::thread::JoinHandle;
use std::time::Instant;

use tokio::sync::oneshot;

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
}

/// One batch to run.
struct Job {
    inputs: Vec<Tensor>,
    outputs: Vec<String>,
    /// Past this instant the job is skipped, not run.
    deadline: Instant,
    /// The caller awaits the result here; if it has hung up (client gone,
    /// timeout), the worker skips the job.
    reply: oneshot::Sender<Result<Vec<Tensor>, RunError>>,
}

/// The worker threads of one model's sessions.
pub struct ModelWorkers {
    /// Jobs for the worker threads; each thread holds a clone of the receiving
    /// end. Dropping this sender (with the `ModelWorkers`) lets the threads
    /// finish the jobs already queued and exit: that is how a model drains.
    tx: Option<crossbeam_channel::Sender<Job>>,
    threads: Vec<JoinHandle<()>>,
    devices: Vec<Device>,
}

impl ModelWorkers {
    /// Starts one thread per session.
    pub fn spawn(model: &str, sessions: Vec<(Device, Box<dyn Session>)>) -> ModelWorkers {
        // Bound: one waiting job per session. Batches form in front of it, so
        // a deeper channel would only hide queueing from the batcher.
        let (tx, rx) = crossbeam_channel::bounded::<Job>(sessions.len());
        let mut threads = Vec::new();
        let mut devices = Vec::new();
        for (i, (device, mut session)) in sessions.into_iter().enumerate() {
            devices.push(device);
            let rx = rx.clone();
            let name = format!("sluice-{model}-{i}");
            let span = tracing::info_span!("session", model = %model, instance = i, device = %device);
            let t = std::thread::Builder::new()
                .name(name.chars().take(15).collect())
                .spawn(move || {
                    let _g = span.enter();
                    while let Ok(job) = rx.recv() {
                        if job.reply.is_closed() {
                            tracing::debug!("caller went away before its batch ran; skipped");
                            continue;
                        }
                        if Instant::now() >= job.deadline {
                            let _ = job.reply.send(Err(RunError::Expired));
                            continue;
                        }
                        let result = session.run(&job.inputs, &job.outputs).map_err(RunError::from);
                        let _ = job.reply.send(result);
                    }
                    tracing::debug!("session thread exits");
                })
                .expect("cannot spawn a session thread");
            threads.push(t);
        }
        ModelWorkers {
            tx: Some(tx),
            threads,
            devices,
        }
    }

    /// The device each instance runs on.
    pub fn devices(&self) -> &[Device] {
        &self.devices
    }

    /// Runs one batch on the next free session and waits for its outputs.
    pub async fn run(
        &self,
        inputs: Vec<Tensor>,
        outputs: Vec<String>,
        deadline: Instant,
    ) -> Result<Vec<Tensor>, RunError> {
        let (reply, rx) = oneshot::channel();
        let tx = self.tx.as_ref().ok_or(RunError::Closed)?.clone();
        let job = Job {
            inputs,
            outputs,
            deadline,
            reply,
        };
        // The channel is bounded; waiting for room must not block the async
        // runtime, so the send happens on the blocking pool.
        match tx.try_send(job) {
            Ok(()) => {}
            Err(crossbeam_channel::TrySendError::Full(job)) => {
                tokio::task::spawn_blocking(move || tx.send(job).map_err(|_| RunError::Closed))
                    .await
                    .map_err(|_| RunError::Closed)??;
            }
            Err(crossbeam_channel::TrySendError::Disconnected(_)) => return Err(RunError::Closed),
        }
        rx.await.map_err(|_| RunError::Closed)?
    }
}

impl Drop for ModelWorkers {
    fn drop(&mut self) {
        // Closing the channel ends each thread after it drains; the threads
        // are detached so that dropping a model never blocks the caller.
        self.tx.take();
        self.threads.clear();
    }
}
