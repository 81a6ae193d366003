//! What a loaded model reports about itself through Triton's
//! model-configuration and statistics extensions: its configuration built
//! from its signature and its live batch settings, and its statistics.

use super::ModelHandle;
use crate::protocol::grpc::inference;
use crate::protocol::model_config::{DynamicBatching, ModelConfig, QueuePolicy};
use crate::protocol::statistics::{MemoryUsage, ModelStatistics};

fn micros(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

impl ModelHandle {
    /// The model's configuration in Triton's shape. A model that batches on
    /// dim 0 of every tensor has a batch dimension (`max_batch_size >= 1`,
    /// the current `max_batch_size` setting); one that does not batch, or
    /// batches on another axis, has none (`0`: each tensor's whole shape).
    /// `dynamic_batching` is present when requests are batched together.
    pub fn derived_config(&self) -> ModelConfig {
        let batching = self.batcher().settings();
        let plain = self.batcher().batching().layout().is_some_and(|l| l.is_plain());
        let max_batch_size = if plain { batching.max_batch_size.max(1) } else { 0 };
        let dynamic = (plain && batching.batching_enabled()).then(|| DynamicBatching {
            max_queue_delay_microseconds: micros(batching.max_batch_time),
            default_queue_policy: QueuePolicy {
                max_queue_size: batching.max_queue_size,
                default_timeout_microseconds: micros(batching.timeout),
            },
        });
        let mut c = ModelConfig::new(&self.name, &self.client_signature(), max_batch_size, dynamic);
        if self.pipeline().is_some() {
            (c.platform, c.backend) = (self.platform().into(), String::new());
        }
        c
    }

    /// Triton's platform name: `ensemble` for a pipeline.
    pub fn platform(&self) -> &'static str {
        match self.pipeline() {
            Some(_) => crate::triton::mapping::ensemble::PLATFORM,
            None => crate::triton::mapping::PLATFORM,
        }
    }

    /// The configuration in force, as Triton's config endpoint and RPC answer
    /// it: a `config.pbtxt` model's own configuration, with what Triton
    /// fills in when the file leaves it out (name, platform, tensors from
    /// the ONNX file, one instance group, the version policy); otherwise the
    /// configuration [`ModelHandle::derived_config`] builds.
    pub fn config(&self) -> inference::ModelConfig {
        let derived = inference::ModelConfig::from(&self.derived_config());
        let Some(mut c) = self
            .settings
            .triton_config
            .as_ref()
            .and_then(|json| crate::triton::config::from_value(json).ok())
        else {
            return derived;
        };
        c.name.clone_from(&self.name);
        c.platform = self.platform().into();
        c.backend = match self.pipeline() {
            Some(_) => String::new(),
            None => crate::triton::mapping::BACKEND.into(),
        };
        if c.input.is_empty() {
            c.input = derived.input;
        }
        if c.output.is_empty() {
            c.output = derived.output;
        }
        if c.instance_group.is_empty() {
            let kind = match self.memory.device_bytes.is_empty() {
                true => inference::model_instance_group::Kind::Cpu,
                false => inference::model_instance_group::Kind::Gpu,
            };
            c.instance_group = vec![inference::ModelInstanceGroup {
                name: self.name.clone(),
                kind: kind as i32,
                count: i32::try_from(self.settings.instances).unwrap_or(i32::MAX),
                ..Default::default()
            }];
        }
        if c.version_policy.is_none() {
            use inference::model_version_policy::{Latest, PolicyChoice};
            c.version_policy = Some(inference::ModelVersionPolicy {
                policy_choice: Some(PolicyChoice::Latest(Latest { num_versions: 1 })),
            });
        }
        if c.default_model_filename.is_empty() {
            c.default_model_filename = "model.onnx".into();
        }
        c
    }

    /// Its figures under Triton's metric names (`nv_inference_*`).
    pub fn triton_metrics(&self) -> crate::metrics::triton::Row {
        let s = self.batcher().stats();
        let snap = s.snapshot(&self.name, self.stats_version());
        let st = &snap.inference_stats;
        let us = |ns: u64| ns / 1000;
        crate::metrics::triton::Row {
            model: snap.name,
            version: snap.version,
            success: st.success.count,
            failures: s.failures().iter().map(|(r, n)| (r.as_str(), *n)).collect(),
            inference_count: snap.inference_count,
            exec_count: snap.execution_count,
            request_us: us(st.success.ns),
            queue_us: us(st.queue.ns),
            compute_input_us: us(st.compute_input.ns),
            compute_infer_us: us(st.compute_infer.ns),
            compute_output_us: us(st.compute_output.ns),
            pending: self.batcher().queued() as u64,
        }
    }

    /// The version the statistics extension reports: the model's version, or
    /// "1" when it has none (perf_analyzer parses it as a number).
    pub fn stats_version(&self) -> &str {
        self.version().unwrap_or("1")
    }

    /// The model's cumulative statistics.
    pub fn statistics(&self) -> ModelStatistics {
        let mut stats = self.batcher().stats().snapshot(&self.name, self.stats_version());
        let gpus = self.memory.device_bytes.iter().map(|d| MemoryUsage {
            kind: "GPU".into(),
            id: i64::from(d.device),
            byte_size: d.bytes,
        });
        stats.memory_usage = std::iter::once(MemoryUsage {
            kind: "CPU".into(),
            id: 0,
            byte_size: self.memory.host_bytes,
        })
        .chain(gpus)
        .collect();
        stats
    }
}
