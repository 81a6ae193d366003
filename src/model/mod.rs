//! A loaded model: its settings, its ONNX signature, and the path a request
//! takes through it (validate → batcher → pool → split outputs).

pub mod config;
pub mod state;
pub mod warmup;

use std::time::Instant;

use crate::batcher::Batcher;
use crate::error::Result;
use crate::protocol::{self, InferRequest, InferResponse};
use crate::settings::ModelSettings;
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
        ModelHandle {
            name,
            settings,
            signature,
            provider_reason,
            memory,
            warmup_rejected: None,
            batcher,
        }
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
        }
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

    pub fn version(&self) -> Option<&str> {
        self.settings.version.as_deref()
    }

    /// Validates `req` against the signature and runs it. The deadline
    /// (`timeout`) counts from `arrival`, queueing included. Every protocol
    /// comes here, so requests from all of them share batches; the outcome
    /// is counted in the model's statistics.
    pub async fn infer(&self, req: InferRequest, arrival: Instant) -> Result<InferResponse> {
        let result = self.run(req, arrival).await;
        self.batcher
            .stats()
            .request_done(result.is_ok(), arrival.elapsed());
        result
    }

    async fn run(&self, mut req: InferRequest, arrival: Instant) -> Result<InferResponse> {
        crate::telemetry::record_version(self.version());
        protocol::validate(&mut req, &self.name, &self.signature)?;
        let (tensors, batch_id) = self
            .batcher
            .submit(req.inputs, req.outputs.as_deref(), arrival)
            .await?;
        Ok(InferResponse {
            model_name: self.batcher.model().clone(),
            model_version: self.settings.version.clone(),
            id: req.id,
            outputs: tensors,
            batch_id,
        })
    }
}
