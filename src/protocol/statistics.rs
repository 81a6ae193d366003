//! Triton's statistics extension: `GET /v2/models[/{name}]/stats` and the
//! `ModelStatistics` RPC. Cumulative counts and nanosecond totals per model
//! (see `model::stats` for what each one measures); perf_analyzer reads
//! them before and after a measurement window. Pure: no I/O.

use serde::{Deserialize, Serialize};

use super::grpc::inference;

/// How many times something happened and its total duration.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatisticDuration {
    pub count: u64,
    /// Total nanoseconds.
    pub ns: u64,
}

/// A model's cumulative request and batch timings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct InferStatistics {
    /// Requests answered successfully; time from arrival to answer.
    pub success: StatisticDuration,
    /// Requests that failed; time from arrival to answer.
    pub fail: StatisticDuration,
    /// Time from arrival to the request's batch being dispatched.
    pub queue: StatisticDuration,
    /// Time concatenating the requests of a batch (counted per request).
    pub compute_input: StatisticDuration,
    /// Time running the batch (counted per request).
    pub compute_infer: StatisticDuration,
    /// Time splitting the batch's outputs back to its requests (counted per request).
    pub compute_output: StatisticDuration,
    /// sluice has no response cache: always zero.
    pub cache_hit: StatisticDuration,
    /// sluice has no response cache: always zero.
    pub cache_miss: StatisticDuration,
}

/// Timings of the batches of one size (counted per batch).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchStatistics {
    pub batch_size: u64,
    pub compute_input: StatisticDuration,
    pub compute_infer: StatisticDuration,
    pub compute_output: StatisticDuration,
}

/// One model's statistics.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelStatistics {
    pub name: String,
    /// A number, as perf_analyzer requires: the model's version, or "1"
    /// when it has none.
    pub version: String,
    /// Milliseconds since the Unix epoch of the last batch run; 0 = none yet.
    pub last_inference: u64,
    /// Rows (instances) run successfully.
    pub inference_count: u64,
    /// Batches run successfully.
    pub execution_count: u64,
    pub inference_stats: InferStatistics,
    /// One entry per batch size run, smallest first.
    pub batch_stats: Vec<BatchStatistics>,
    /// Memory the model holds, per device (Triton's `memory_usage`).
    #[serde(default)]
    pub memory_usage: Vec<MemoryUsage>,
    /// sluice's fitted batch cost; absent until the model has run enough
    /// batches (REST only: Triton's gRPC message has no such field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_cost: Option<BatchCost>,
}

/// A model's batch run time as a function of its size, fitted over its
/// last runs: `fixed_ns + per_row_ns × rows` (padded tokens for a model
/// with `padding`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchCost {
    pub fixed_ns: u64,
    pub per_row_ns: u64,
    /// Runs the fit is over.
    pub samples: u64,
    /// How long a request arriving now is predicted to wait for its batch to start.
    pub queue_wait_ns: u64,
    /// The fit's run time for each batch size of `batch_stats`, to set
    /// beside their measured `compute_infer`.
    pub predicted: Vec<PredictedBatch>,
}

/// The fitted run time of one batch size.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PredictedBatch {
    pub batch_size: u64,
    pub ns: u64,
}

/// Memory held on one device: `type` `CPU` (id 0) or `GPU` (id = device).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryUsage {
    #[serde(rename = "type")]
    pub kind: String,
    pub id: i64,
    pub byte_size: u64,
}

/// Body of `GET /v2/models[/{name}]/stats`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatisticsResponse {
    pub model_stats: Vec<ModelStatistics>,
}

impl From<StatisticDuration> for inference::StatisticDuration {
    fn from(d: StatisticDuration) -> Self {
        inference::StatisticDuration {
            count: d.count,
            ns: d.ns,
        }
    }
}

impl From<&ModelStatistics> for inference::ModelStatistics {
    fn from(m: &ModelStatistics) -> Self {
        let s = &m.inference_stats;
        inference::ModelStatistics {
            name: m.name.clone(),
            version: m.version.clone(),
            last_inference: m.last_inference,
            inference_count: m.inference_count,
            execution_count: m.execution_count,
            inference_stats: Some(inference::InferStatistics {
                success: Some(s.success.into()),
                fail: Some(s.fail.into()),
                queue: Some(s.queue.into()),
                compute_input: Some(s.compute_input.into()),
                compute_infer: Some(s.compute_infer.into()),
                compute_output: Some(s.compute_output.into()),
                cache_hit: Some(s.cache_hit.into()),
                cache_miss: Some(s.cache_miss.into()),
            }),
            batch_stats: m
                .batch_stats
                .iter()
                .map(|b| inference::InferBatchStatistics {
                    batch_size: b.batch_size,
                    compute_input: Some(b.compute_input.into()),
                    compute_infer: Some(b.compute_infer.into()),
                    compute_output: Some(b.compute_output.into()),
                })
                .collect(),
            memory_usage: m
                .memory_usage
                .iter()
                .map(|u| inference::MemoryUsage {
                    r#type: u.kind.clone(),
                    id: u.id,
                    byte_size: u.byte_size,
                })
                .collect(),
        }
    }
}
