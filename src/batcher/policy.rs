//! When to close a batch: `decide` looks at the queue, the clock, the
//! model's batch settings and how many of its sessions are free, and says
//! "flush now", "wait this long", or "nothing to do until something
//! happens" (Triton's `GetDynamicBatch` returning a wait, 0 = send now).
//!
//! `fixed` (KServe / MLServer): flush when the batch holds `max_batch_size`
//! rows or `max_batch_time` has passed since its oldest request.
//!
//! `adaptive` (default) never waits when waiting cannot grow the batch,
//! and otherwise waits only when the model's cost says it pays:
//! - a full batch is flushed at once;
//! - while every session of the model is busy, requests keep collecting and
//!   no timer runs: the batch could not start earlier anyway, and it grows;
//! - a free session never waits while the queue holds requests its batch
//!   would leave behind (another shape's, or, for a padded model, lengths
//!   its padding bound leaves out): they need a batch of their own anyway,
//!   so the session stays busy (work-conserving, as TEI's continuous
//!   batcher is);
//! - otherwise the batch may wait for the requests the arrival rate
//!   expects before its deadline (oldest arrival + `max_batch_time`). With
//!   `T(n)` the fitted run time of a batch of n rows (`cost.rs`), n rows
//!   queued, and k rows expected within Δ: run now, and the n rows are
//!   answered after `T(n)`, the k after `max(Δ, T(n)) + T(k)` (the session
//!   is busy with the first batch; `Δ + T(k)` when another session is
//!   free); wait, and all n + k are answered after `Δ + T(n + k)`. The
//!   batch waits when that lowers the rows' summed time to an answer for
//!   some number of expected arrivals, and then at most one mean gap past
//!   the next expected arrival (each arrival decides again). So waiting
//!   pays when a batch's fixed cost is large next to the gaps between
//!   requests: under load, a request that arrives first after a batch
//!   finished waits the few microseconds until the requests behind it
//!   arrive, instead of running as a batch of one, at several times the CPU
//!   per row of a full batch, that the rest then queue behind. At low load
//!   the gaps are long next to `T`, so a request runs at once and its
//!   latency is the model's compute time; before the cost is known, a lone
//!   request never waits.

use std::time::{Duration, Instant};

use super::cost::Fit;
use super::queue::{Limits, State};
use crate::settings::{BatchPolicyKind, BatchSettings};

/// Most expected arrivals the adaptive policy weighs a wait for.
const LOOKAHEAD: usize = 64;

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
            let (Some(expected), Some(last)) = (state.next_arrival_expected(), state.last_arrival()) else {
                return Decision::Flush(Trigger::Adaptive);
            };
            // Slack of one more mean gap for jitter, never past the deadline.
            let gap = expected - last;
            let until = (expected + gap).min(deadline);
            if expected > deadline || until <= now {
                return Decision::Flush(Trigger::Adaptive);
            }
            let worth = match state.cost() {
                Some(fit) => worth_waiting(
                    &fit,
                    &Outlook {
                        queued: state.units(),
                        per_arrival: state.mean_units(),
                        first: expected.saturating_duration_since(now),
                        gap,
                        time_left: deadline - now,
                        room: room(state, settings),
                        other_free: cap.free_sessions > 1,
                    },
                ),
                None => state.len() > 1,
            };
            match worth {
                true => Decision::Wait(until - now),
                false => Decision::Flush(Trigger::Adaptive),
            }
        }
    }
}

/// Units the queued batch may still grow by: rows to `max_batch_size`, or
/// for a padded model tokens to `max_batch_tokens` when that is lower.
fn room(state: &State, settings: &BatchSettings) -> usize {
    let max = Limits::of(settings).max_units(state.head_tokens_per_row());
    max.saturating_sub(state.units())
}

/// What a wait would bring (see [`worth_waiting`]).
#[derive(Debug, Clone, Copy)]
pub struct Outlook {
    /// Units queued for the batch now.
    pub queued: usize,
    /// Mean units of an arriving request.
    pub per_arrival: f64,
    /// Until the next arrival is expected.
    pub first: Duration,
    /// Mean gap between arrivals after it.
    pub gap: Duration,
    /// Until the batch's deadline (its oldest arrival + `max_batch_time`).
    pub time_left: Duration,
    /// Units the batch may still grow by.
    pub room: usize,
    /// Another session is free for a batch of the later arrivals.
    pub other_free: bool,
}

/// Whether waiting for some number of the expected arrivals lowers the
/// summed time to an answer of the queued rows and those arrivals (the
/// rule in the module docs).
pub fn worth_waiting(fit: &Fit, o: &Outlook) -> bool {
    let t = |units: usize| fit.predict(units).as_secs_f64();
    let n = o.queued.max(1);
    let run_now = t(n);
    let per_arrival = o.per_arrival.max(1.0);
    for j in 1..=LOOKAHEAD {
        let delta = o.first + o.gap * (j as u32 - 1);
        let k = (j as f64 * per_arrival).round() as usize;
        if delta > o.time_left || k > o.room {
            break;
        }
        let d = delta.as_secs_f64();
        if d >= run_now {
            // From here on waiting never pays: the n rows alone lose n·(d − T(n))
            // at least, more than sharing a batch can give back (T only grows).
            break;
        }
        let later_start = if o.other_free { d } else { d.max(run_now) };
        let now_total = n as f64 * run_now + k as f64 * (later_start + t(k));
        let wait_total = (n + k) as f64 * (d + t(n + k));
        if wait_total < now_total {
            return true;
        }
    }
    false
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
            refuse_predicted_late: true,
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
        // Its run time, seen often enough to predict from: 2 ms for 20 rows.
        for _ in 0..3 {
            q.record_run(20, Duration::from_millis(2));
        }
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
        // +59.5 µs. Only one batch size was seen, so one row is predicted
        // to cost the same 2 ms: run now, the next row is answered after
        // 4 ms; wait, both after 2.06 ms. Wait until one more gap.
        assert_eq!(
            decide(&q, lone, &s, FREE),
            Decision::Wait(Duration::from_nanos(119_000))
        );
        // Nothing came in that time: run it.
        assert_eq!(
            decide(&q, lone + Duration::from_micros(120), &s, FREE),
            Decision::Flush(Trigger::Adaptive)
        );

        // The same arrivals, but a batch costs 10 µs per row and nothing
        // fixed: run now, the lone row is answered after 10 µs and the next
        // after 69.5 µs; wait, both after 79.5 µs. It runs at once.
        for n in [1, 10, 20].repeat(22) {
            q.record_run(n, Duration::from_micros(10 * n as u64));
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

#[cfg(test)]
mod cost_tests {
    //! The adaptive rule's weighing of a wait (`worth_waiting`), by table.
    use super::*;

    fn line(fixed_us: f64, per_row_us: f64) -> Fit {
        Fit {
            fixed: fixed_us * 1e-6,
            per_unit: per_row_us * 1e-6,
            only_size: None,
            samples: 10,
        }
    }

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    #[test]
    fn a_wait_pays_only_where_the_fixed_cost_is_large_next_to_the_gaps() {
        let base = Outlook {
            queued: 1,
            per_arrival: 1.0,
            first: us(50),
            gap: us(50),
            time_left: us(2_000),
            room: 63,
            other_free: false,
        };
        // (case, cost, outlook, waits)
        let cases = [
            // Under load: 1 ms per batch, a request every 50 µs.
            ("fixed cost, dense arrivals", line(1_000.0, 10.0), base, true),
            // Low load: a request every 5 ms, far past T: run at once.
            (
                "sparse arrivals",
                line(1_000.0, 10.0),
                Outlook {
                    first: us(5_000),
                    gap: us(5_000),
                    time_left: us(10_000),
                    ..base
                },
                false,
            ),
            // A batch costs only its rows: nothing to share, run at once.
            ("per-row cost only", line(0.0, 100.0), base, false),
            // The next arrival is not expected before the batch's deadline.
            (
                "past the deadline",
                line(1_000.0, 10.0),
                Outlook {
                    time_left: us(40),
                    ..base
                },
                false,
            ),
            // The batch is one row short of full: one arrival fills it.
            (
                "room for one",
                line(1_000.0, 10.0),
                Outlook { room: 1, ..base },
                true,
            ),
            ("no room", line(1_000.0, 10.0), Outlook { room: 0, ..base }, false),
            // A fixed cost four times the gap: with the session busy for
            // T(1), the next request would wait anyway, so sharing pays...
            ("busy session", line(200.0, 1.0), base, true),
            // ...but with another session free for it, it would not wait:
            // running now is sooner for both.
            (
                "another session free",
                line(200.0, 1.0),
                Outlook {
                    other_free: true,
                    ..base
                },
                false,
            ),
        ];
        for (case, fit, outlook, waits) in cases {
            assert_eq!(worth_waiting(&fit, &outlook), waits, "{case}: {outlook:?}");
        }
    }
}
