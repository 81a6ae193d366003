//! The request path between a model and its sessions. This is where the
//! per-model adaptive batcher lives (SPEC §5); today it dispatches each
//! request as its own batch, with the request's deadline enforced, so that
//! handlers and sessions stay untouched when batching arrives.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::model::settings::BatchSettings;
use crate::pool::{ModelWorkers, RunError};
use crate::tensor::Tensor;

/// Numbers batches process-wide, so `batchId` is unique across models.
static NEXT_BATCH: AtomicU64 = AtomicU64::new(1);

/// Handle to one model's batcher. Cheap to clone.
#[derive(Clone)]
pub struct Batcher {
    model: Arc<str>,
    settings: BatchSettings,
    workers: Arc<ModelWorkers>,
}

impl Batcher {
    pub fn new(model: &str, settings: BatchSettings, workers: Arc<ModelWorkers>) -> Batcher {
        Batcher {
            model: model.into(),
            settings,
            workers,
        }
    }

    /// Runs validated inputs and returns the requested outputs and the id of
    /// the batch they ran in.
    pub async fn submit(
        &self,
        inputs: Vec<Tensor>,
        outputs: Vec<String>,
        arrival: Instant,
    ) -> Result<(Vec<Tensor>, String)> {
        let timeout = self.settings.timeout;
        let deadline = arrival + timeout;
        let batch_id = format!("{:016x}", NEXT_BATCH.fetch_add(1, Ordering::Relaxed));
        let remaining = deadline.saturating_duration_since(Instant::now());
        let run = self.workers.run(inputs, outputs, deadline);
        match tokio::time::timeout(remaining.max(Duration::from_micros(1)), run).await {
            Ok(Ok(tensors)) => Ok((tensors, batch_id)),
            Ok(Err(RunError::Expired)) | Err(_) => Err(Error::DeadlineExceeded {
                model: self.model.to_string(),
                timeout,
            }),
            Ok(Err(RunError::Closed)) => Err(Error::ModelNotReady {
                name: self.model.to_string(),
                reason: "unloading".into(),
            }),
            Ok(Err(RunError::Runtime(crate::runtime::RuntimeError::InvalidInput(m)))) => {
                Err(Error::InvalidInput(m))
            }
            Ok(Err(RunError::Runtime(e))) => {
                let message = error_chain(&e);
                tracing::warn!(model = %self.model, error = %message, "inference failed");
                Err(Error::Runtime {
                    model: self.model.to_string(),
                    message: message.into(),
                })
            }
        }
    }
}

/// `e` and its sources, joined with ": ".
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let m = c.to_string();
        if !s.contains(&m) {
            s.push_str(": ");
            s.push_str(&m);
        }
        cur = c.source();
    }
    s
}
