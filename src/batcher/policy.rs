//! When to close a batch: `decide` looks at the queue, the clock, the
//! model's batch settings and how many of its sessions are free, and says
//! "flush now", "wait this long", or "nothing to do until something
//! happens" (Triton's `GetDynamicBatch` returning a wait, 0 = send now).
//!
//! `fixed` (KServe / MLServer): flush when the batch holds `max_batch_size`
//! rows or `max_batch_time` has passed since its oldest request.
//!
//! `adaptive` (default) never waits when waiting cannot grow the batch:
//! - a full batch is flushed at once;
//! - while every session of the model is busy, requests keep collecting and
//!   no timer runs: the batch could not start earlier anyway, and it grows;
//! - when a session is free, the queued requests wait for more only if the
//!   measured arrival rate expects the next request before the batch's
//!   deadline (oldest arrival + `max_batch_time`), and at most until twice
//!   the mean gap after the last arrival, and only if that wait is under a
//!   quarter of the model's mean batch run time (a free session idles
//!   meanwhile); otherwise they run now. So at low load a request runs at
//!   once and its latency is the model's compute time, while under load a
//!   request that arrives first after a batch finished waits the few
//!   microseconds until the requests behind it arrive, instead of running as
//!   a batch of one that the rest then queue behind (with a lone request
//!   running at once, 21 % of `mlp`'s batches at 64 clients held one row,
//!   at five times the CPU per row of a full batch);
//! - but a free session never waits while the queue holds requests its
//!   batch would leave behind (another shape's, or, for a padded model,
//!   lengths its padding bound leaves out): they need a batch of their own
//!   anyway, so the session stays busy (work-conserving, as TEI's
//!   continuous batcher is).

use std::time::{Duration, Instant};

use super::queue::{Limits, State};
use crate::settings::{BatchPolicyKind, BatchSettings};

/// The adaptive policy lets a free session idle, waiting for one more
/// request, for at most 1/IDLE_FRACTION of the model's mean batch run time.
const IDLE_FRACTION: u32 = 4;

/// Why a batch closed (the `trigger` label of `sluice_batches_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// It reached `max_batch_size` rows (or batching is off: every request is a batch).
    Size,
    /// `max_batch_time` passed since its oldest request.
    Time,
    /// The adaptive policy saw that waiting could not grow it.
    Adaptive,
    /// The model is unloading: whatever is queued runs now.
    Drain,
}

impl Trigger {
    pub fn as_str(self) -> &'static str {
        match self {
            Trigger::Size => "size",
            Trigger::Time => "time",
            Trigger::Adaptive => "adaptive",
            Trigger::Drain => "drain",
        }
    }
}

/// What the batching task should do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Form a batch now.
    Flush(Trigger),
    /// Decide again after this long (or sooner, if something happens).
    Wait(Duration),
    /// Decide again when a request arrives or a session frees up.
    Idle,
}

/// How many of the model's batches can start now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capacity {
    /// Sessions of this model with no batch.
    pub free_sessions: usize,
    /// True when one more batch may be formed ahead (all sessions busy and
    /// no batch already waiting for one).
    pub can_form_ahead: bool,
}

impl Capacity {
    /// `in_flight` batches dispatched and not finished, of `instances` sessions.
    pub fn new(instances: usize, in_flight: usize) -> Capacity {
        Capacity {
            free_sessions: instances.saturating_sub(in_flight),
            can_form_ahead: in_flight < instances + 1,
        }
    }

    fn any(self) -> bool {
        self.free_sessions > 0 || self.can_form_ahead
    }
}

/// The batching rule (see the module docs).
pub fn decide(state: &State, now: Instant, settings: &BatchSettings, cap: Capacity) -> Decision {
    let Some(oldest) = state.oldest() else {
        return Decision::Idle;
    };
    // A batch that cannot grow runs as soon as a session can take it.
    let full = match cap.any() {
        true => Decision::Flush(Trigger::Size),
        false => Decision::Idle,
    };
    if !settings.batching_enabled() {
        return full;
    }
    let fill = state.fill(Limits::of(settings));
    if fill.full {
        return full;
    }
    let deadline = oldest + settings.max_batch_time;
    match settings.policy {
        BatchPolicyKind::Fixed => {
            if now < deadline {
                Decision::Wait(deadline - now)
            } else if cap.any() {
                Decision::Flush(Trigger::Time)
            } else {
                Decision::Idle
            }
        }
        BatchPolicyKind::Adaptive => {
            if cap.free_sessions == 0 {
                return Decision::Idle;
            }
            if now >= deadline {
                return Decision::Flush(Trigger::Time);
            }
            if fill.leaves_behind {
                // Work is queued that this batch cannot take: a free session
                // must not idle while it waits (see the module docs).
                return Decision::Flush(Trigger::Adaptive);
            }
            match state.next_arrival_expected() {
                Some(expected) if expected <= deadline => {
                    // Slack of one more mean gap for jitter, never past the deadline.
                    let until =
                        (expected + (expected - state.last_arrival().unwrap_or(expected))).min(deadline);
                    // A free session idles while we wait: only worth it for
                    // a small fraction of what running a batch takes. A lone
                    // request waits only once that run time is known.
                    let worth = match state.mean_run() {
                        Some(run) => until <= now + run / IDLE_FRACTION,
                        None => state.len() > 1,
                    };
                    if until > now && worth {
                        Decision::Wait(until - now)
                    } else {
                        Decision::Flush(Trigger::Adaptive)
                    }
                }
                _ => Decision::Flush(Trigger::Adaptive),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batcher::queue::tests::entry;
    use crate::batcher::queue::EntryResult;
    use tokio::sync::oneshot;

    fn settings(policy: BatchPolicyKind, max: usize, wait_ms: u64) -> BatchSettings {
        BatchSettings {
            max_batch_size: max,
            max_batch_time: Duration::from_millis(wait_ms),
            policy,
            max_queue_size: 100,
            timeout: Duration::from_secs(60),
            max_batch_tokens: None,
            max_padding_ratio: None,
            priority_levels: 0,
            default_priority: 0,
        }
    }

    const FREE: Capacity = Capacity {
        free_sessions: 1,
        can_form_ahead: true,
    };
    const BUSY: Capacity = Capacity {
        free_sessions: 0,
        can_form_ahead: true,
    };
    const FULL: Capacity = Capacity {
        free_sessions: 0,
        can_form_ahead: false,
    };

    #[test]
    fn fixed_waits_for_size_or_time() {
        let t0 = Instant::now();
        let s = settings(BatchPolicyKind::Fixed, 4, 500);
        let mut q = State::new();
        let (e, _r) = entry(1, 2, t0);
        q.push(e);
        // One request, session free: fixed still waits the whole max_batch_time.
        assert_eq!(
            decide(&q, t0, &s, FREE),
            Decision::Wait(Duration::from_millis(500))
        );
        assert_eq!(
            decide(&q, t0 + Duration::from_millis(200), &s, FREE),
            Decision::Wait(Duration::from_millis(300))
        );
        assert_eq!(
            decide(&q, t0 + Duration::from_millis(500), &s, FREE),
            Decision::Flush(Trigger::Time)
        );
        // Past the deadline with no capacity: wait for a session.
        assert_eq!(
            decide(&q, t0 + Duration::from_millis(600), &s, FULL),
            Decision::Idle
        );
        let (e, _r2) = entry(3, 2, t0);
        q.push(e);
        assert_eq!(decide(&q, t0, &s, BUSY), Decision::Flush(Trigger::Size));
    }

    #[test]
    fn adaptive_runs_a_lone_request_at_once() {
        let t0 = Instant::now();
        let s = settings(BatchPolicyKind::Adaptive, 32, 500);
        let mut q = State::new();
        let (e, _r) = entry(1, 2, t0);
        q.push(e);
        assert_eq!(decide(&q, t0, &s, FREE), Decision::Flush(Trigger::Adaptive));
        // Every session busy: collect, no timer.
        assert_eq!(decide(&q, t0, &s, BUSY), Decision::Idle);
    }

    #[test]
    fn adaptive_waits_only_when_the_next_arrival_is_expected_before_the_deadline() {
        let t0 = Instant::now();
        let s = settings(BatchPolicyKind::Adaptive, 32, 10);
        let mut q = State::new();
        let mut keep = Vec::new();
        for i in 0..3 {
            let (e, r) = entry(1, 2, t0 + Duration::from_millis(i));
            keep.push(r);
            q.push(e);
        }
        // Mean gap 1 ms, last arrival at 2 ms: expect one at 3 ms; wait until 4 ms.
        let now = t0 + Duration::from_millis(2);
        assert_eq!(
            decide(&q, now, &s, FREE),
            Decision::Wait(Duration::from_millis(2))
        );
        // Nothing came by 4 ms: run now.
        assert_eq!(
            decide(&q, t0 + Duration::from_millis(4), &s, FREE),
            Decision::Flush(Trigger::Adaptive)
        );

        // Slow arrivals (5 ms gaps) with a 3 ms max_batch_time: no wait.
        let s = settings(BatchPolicyKind::Adaptive, 32, 3);
        let mut q = State::new();
        for i in 0..2 {
            let (e, r) = entry(1, 2, t0 + Duration::from_millis(5 * i));
            keep.push(r);
            q.push(e);
        }
        assert_eq!(
            decide(&q, t0 + Duration::from_millis(5), &s, FREE),
            Decision::Flush(Trigger::Time)
        );
    }

    /// A batch of 20 requests 10 µs apart ran (2 ms); 1 ms after the last
    /// of them, the first request of the next burst arrives alone. Gives
    /// the queue, its arrival, and the receivers to keep.
    fn after_a_burst() -> (State, Instant, Vec<oneshot::Receiver<EntryResult>>) {
        let t0 = Instant::now();
        let mut q = State::new();
        let mut keep = Vec::new();
        for i in 0..20 {
            let (e, r) = entry(1, 2, t0 + Duration::from_micros(10 * i));
            keep.push(r);
            q.push(e);
        }
        let _ran = q.take_batch(Limits::rows(64));
        q.record_run(Duration::from_millis(2));
        let lone = t0 + Duration::from_micros(190 + 1000);
        let (e, r) = entry(1, 2, lone);
        keep.push(r);
        q.push(e);
        (q, lone, keep)
    }

    #[test]
    fn under_load_a_lone_request_waits_for_the_burst_behind_it() {
        let s = settings(BatchPolicyKind::Adaptive, 64, 2);
        let (mut q, lone, _keep) = after_a_burst();
        // Mean gap (1 ms + 19 × 10 µs) / 20 = 59.5 µs: expect the next at
        // +59.5 µs, wait until twice that, well under a quarter of the 2 ms run.
        assert_eq!(
            decide(&q, lone, &s, FREE),
            Decision::Wait(Duration::from_nanos(119_000))
        );
        // Nothing came in that time: run it.
        assert_eq!(
            decide(&q, lone + Duration::from_micros(120), &s, FREE),
            Decision::Flush(Trigger::Adaptive)
        );

        // The same arrivals with runs of 200 µs: waiting 119 µs would idle
        // the session for more than a quarter of a run, so it runs at once.
        for _ in 0..40 {
            q.record_run(Duration::from_micros(200));
        }
        assert_eq!(decide(&q, lone, &s, FREE), Decision::Flush(Trigger::Adaptive));
    }

    #[test]
    fn a_free_session_never_waits_while_work_is_left_behind() {
        // As above, a burst is arriving (expected in 60 µs, worth a wait),
        // but a request of another shape waits too: it needs its own batch,
        // so this one runs now and the session stays busy.
        let s = settings(BatchPolicyKind::Adaptive, 64, 2);
        let (mut q, lone, mut keep) = after_a_burst();
        assert!(matches!(decide(&q, lone, &s, FREE), Decision::Wait(_)));
        let (other, r) = entry(1, 3, lone);
        keep.push(r);
        q.push(other);
        assert_eq!(decide(&q, lone, &s, FREE), Decision::Flush(Trigger::Adaptive));
        // With every session busy, both keep collecting.
        assert_eq!(decide(&q, lone, &s, BUSY), Decision::Idle);
        // The fixed policy still waits its max_batch_time.
        let fixed = settings(BatchPolicyKind::Fixed, 64, 2);
        assert!(matches!(decide(&q, lone, &fixed, FREE), Decision::Wait(_)));
    }

    #[test]
    fn a_lone_request_runs_at_once_before_any_run_time_is_known() {
        let t0 = Instant::now();
        let s = settings(BatchPolicyKind::Adaptive, 64, 2);
        let mut q = State::new();
        let mut keep = Vec::new();
        for i in 0..2 {
            let (e, r) = entry(1, 2, t0 + Duration::from_micros(10 * i));
            keep.push(r);
            q.push(e);
        }
        let _ran = q.take_batch(Limits::rows(1));
        let now = t0 + Duration::from_micros(10);
        assert_eq!(q.len(), 1);
        assert_eq!(decide(&q, now, &s, FREE), Decision::Flush(Trigger::Adaptive));
    }

    #[test]
    fn batching_off_flushes_every_request_alone() {
        let t0 = Instant::now();
        let s = settings(BatchPolicyKind::Fixed, 1, 500);
        let mut q = State::new();
        let (e, _r) = entry(5, 2, t0);
        q.push(e);
        assert_eq!(decide(&q, t0, &s, FREE), Decision::Flush(Trigger::Size));
        assert_eq!(decide(&q, t0, &s, FULL), Decision::Idle);
    }

    #[test]
    fn zero_batch_time_never_waits() {
        let t0 = Instant::now();
        let s = settings(BatchPolicyKind::Fixed, 8, 0);
        let mut q = State::new();
        let (e, _r) = entry(1, 2, t0);
        q.push(e);
        assert_eq!(decide(&q, t0, &s, FREE), Decision::Flush(Trigger::Time));
    }
}
