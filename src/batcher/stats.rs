//! Per-model cumulative statistics for Triton's statistics extension
//! (`/v2/models/{name}/stats`, the `ModelStatistics` RPC). Filled from the
//! same measurements as `/metrics`: the batching task records queue time and
//! each batch's compute times where it records the Prometheus histograms,
//! and `ModelHandle::infer` records each request's outcome. Lock-free
//! counters, except the per-batch-size table (one short lock per batch).
//!
//! What each figure counts, as in Triton: `inference_count` rows run,
//! `execution_count` batches run, `success`/`fail` requests with their time
//! from arrival to answer, `queue` requests (or chunks of an oversize
//! request) with their wait until dispatch, and `compute_*` the batch's
//! durations added once per request in it, so that their averages read "per
//! request". `compute_input` is concatenating the requests' inputs,
//! `compute_infer` the session run (`sluice_inference_duration_seconds`),
//! `compute_output` splitting the outputs back.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::cost::Fit;
use crate::protocol::statistics::{
    BatchCost, BatchStatistics, InferStatistics, ModelStatistics, PredictedBatch, StatisticDuration,
};

/// A count and a total duration.
#[derive(Debug, Default)]
struct Counter {
    count: AtomicU64,
    ns: AtomicU64,
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Counter {
    fn add(&self, count: u64, took: Duration) {
        self.count.fetch_add(count, Ordering::Relaxed);
        self.ns.fetch_add(nanos(took), Ordering::Relaxed);
    }

    fn read(&self) -> StatisticDuration {
        StatisticDuration {
            count: self.count.load(Ordering::Relaxed),
            ns: self.ns.load(Ordering::Relaxed),
        }
    }
}

/// The compute times of one batch.
#[derive(Debug, Clone, Copy, Default)]
pub struct BatchTimes {
    /// Concatenating the requests' inputs.
    pub input: Duration,
    /// The session run.
    pub infer: Duration,
    /// Splitting the outputs back to the requests.
    pub output: Duration,
}

/// Why a request failed, as Triton's `nv_inference_request_failure` labels it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailReason {
    /// Refused or timed out by the scheduler (queue full, predicted late, deadline).
    Rejected,
    /// Cancelled (the server shutting down).
    Canceled,
    /// The model's run failed.
    Backend,
    /// Anything else (a request that does not fit the model).
    Other,
}

impl FailReason {
    pub const ALL: [FailReason; 4] = [
        FailReason::Rejected,
        FailReason::Canceled,
        FailReason::Backend,
        FailReason::Other,
    ];

    /// Triton's label value.
    pub fn as_str(self) -> &'static str {
        match self {
            FailReason::Rejected => "REJECTED",
            FailReason::Canceled => "CANCELED",
            FailReason::Backend => "BACKEND",
            FailReason::Other => "OTHER",
        }
    }
}

/// One model's cumulative statistics. Shared (`Arc`) by the model's
/// [`Batcher`](crate::batcher::Batcher) handle, its batching task and its
/// batch tasks; every method takes `&self`.
#[derive(Debug, Default)]
pub struct ModelStats {
    success: Counter,
    fail: Counter,
    /// Failures by [`FailReason`] (in `FailReason::ALL`'s order).
    fail_reasons: [AtomicU64; 4],
    queue: Counter,
    compute_input: Counter,
    compute_infer: Counter,
    compute_output: Counter,
    inference_count: AtomicU64,
    execution_count: AtomicU64,
    /// Milliseconds since the Unix epoch of the last batch run.
    last_inference_ms: AtomicU64,
    /// Batch size → (executions, input, infer, output). Written by batch tasks
    /// once per batch, read by stats requests; never held across an await.
    by_size: Mutex<BTreeMap<usize, [(u64, Duration); 3]>>,
    /// The fitted batch cost and the predicted queue wait, written by the
    /// batching task at each decision once there is a fit.
    cost: Mutex<Option<(Fit, Duration)>>,
}

impl ModelStats {
    pub fn new() -> ModelStats {
        ModelStats::default()
    }

    /// A request was answered (`Ok`) or failed (with why), `took` after its arrival.
    pub fn request_done(&self, outcome: Result<(), FailReason>, took: Duration) {
        match outcome {
            Ok(()) => self.success.add(1, took),
            Err(why) => {
                self.fail.add(1, took);
                let i = FailReason::ALL.iter().position(|r| *r == why).unwrap_or(3);
                self.fail_reasons[i].fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Failures so far, by reason.
    pub fn failures(&self) -> [(FailReason, u64); 4] {
        FailReason::ALL.map(|r| {
            let i = FailReason::ALL.iter().position(|x| *x == r).unwrap_or(3);
            (r, self.fail_reasons[i].load(Ordering::Relaxed))
        })
    }

    /// A request (or one chunk of an oversize request) left the queue for a
    /// batch after waiting `waited`.
    pub fn dispatched(&self, waited: Duration) {
        self.queue.add(1, waited);
    }

    /// A batch of `requests` entries and `rows` rows ran successfully.
    pub fn executed(&self, requests: usize, rows: usize, t: BatchTimes) {
        let n = requests as u64;
        // Per request, as Triton counts them (see the module doc).
        self.compute_input.add(n, t.input * requests as u32);
        self.compute_infer.add(n, t.infer * requests as u32);
        self.compute_output.add(n, t.output * requests as u32);
        self.inference_count.fetch_add(rows as u64, Ordering::Relaxed);
        self.execution_count.fetch_add(1, Ordering::Relaxed);
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        self.last_inference_ms.fetch_max(now_ms, Ordering::Relaxed);
        let mut by_size = self.by_size.lock().expect("stats lock poisoned");
        let entry = by_size.entry(rows).or_default();
        for (slot, took) in entry.iter_mut().zip([t.input, t.infer, t.output]) {
            slot.0 += 1;
            slot.1 += took;
        }
    }

    /// The model's fitted batch cost, and the wait it predicts for a request arriving now.
    pub fn cost(&self, fit: &Fit, wait: Duration) {
        *self.cost.lock().unwrap_or_else(|e| e.into_inner()) = Some((*fit, wait));
    }

    /// The statistics as the protocol reports them, for `name` at `version`.
    pub fn snapshot(&self, name: &str, version: &str) -> ModelStatistics {
        let d = |(count, took): (u64, Duration)| StatisticDuration {
            count,
            ns: nanos(took),
        };
        let batch_stats: Vec<BatchStatistics> = self
            .by_size
            .lock()
            .expect("stats lock poisoned")
            .iter()
            .map(|(&size, [input, infer, output])| BatchStatistics {
                batch_size: size as u64,
                compute_input: d(*input),
                compute_infer: d(*infer),
                compute_output: d(*output),
            })
            .collect();
        let cost = *self.cost.lock().unwrap_or_else(|e| e.into_inner());
        let batch_cost = cost.map(|(fit, wait)| {
            let (fixed, per_row) = fit.terms();
            BatchCost {
                fixed_ns: (fixed * 1e9) as u64,
                per_row_ns: (per_row * 1e9) as u64,
                samples: fit.samples as u64,
                queue_wait_ns: nanos(wait),
                predicted: batch_stats
                    .iter()
                    .map(|b| PredictedBatch {
                        batch_size: b.batch_size,
                        ns: nanos(fit.predict(b.batch_size as usize)),
                    })
                    .collect(),
            }
        });
        ModelStatistics {
            name: name.to_string(),
            version: version.to_string(),
            last_inference: self.last_inference_ms.load(Ordering::Relaxed),
            inference_count: self.inference_count.load(Ordering::Relaxed),
            execution_count: self.execution_count.load(Ordering::Relaxed),
            inference_stats: InferStatistics {
                success: self.success.read(),
                fail: self.fail.read(),
                queue: self.queue.read(),
                compute_input: self.compute_input.read(),
                compute_infer: self.compute_infer.read(),
                compute_output: self.compute_output.read(),
                cache_hit: StatisticDuration::default(),
                cache_miss: StatisticDuration::default(),
            },
            batch_stats,
            memory_usage: Vec::new(),
            batch_cost,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_follow_tritons_definitions() {
        let s = ModelStats::new();
        let ms = Duration::from_millis;
        // Three requests, one batch of 5 rows.
        for waited in [ms(1), ms(2), ms(3)] {
            s.dispatched(waited);
        }
        let t = BatchTimes {
            input: ms(1),
            infer: ms(10),
            output: ms(2),
        };
        s.executed(3, 5, t);
        s.request_done(Ok(()), ms(20));
        s.request_done(Ok(()), ms(21));
        s.request_done(Err(FailReason::Backend), ms(5));
        assert_eq!(s.failures()[2], (FailReason::Backend, 1));
        assert_eq!(s.failures().iter().map(|f| f.1).sum::<u64>(), 1);
        let snap = s.snapshot("m", "1");
        assert_eq!(snap.inference_count, 5);
        assert_eq!(snap.execution_count, 1);
        assert!(snap.last_inference > 0);
        let st = &snap.inference_stats;
        assert_eq!(
            st.success,
            StatisticDuration {
                count: 2,
                ns: 41_000_000
            }
        );
        assert_eq!(
            st.fail,
            StatisticDuration {
                count: 1,
                ns: 5_000_000
            }
        );
        assert_eq!(
            st.queue,
            StatisticDuration {
                count: 3,
                ns: 6_000_000
            }
        );
        // Compute times count once per request, so their counts are equal.
        assert_eq!(
            st.compute_infer,
            StatisticDuration {
                count: 3,
                ns: 30_000_000
            }
        );
        assert_eq!(st.compute_input.count, st.compute_output.count);
        assert_eq!(snap.batch_stats.len(), 1);
        assert_eq!(snap.batch_stats[0].batch_size, 5);
        assert_eq!(
            snap.batch_stats[0].compute_infer,
            StatisticDuration {
                count: 1,
                ns: 10_000_000
            }
        );
    }
}
