//! Deadlines at admission: when a request reaches its model's batching
//! task, how long it is predicted to take to be answered, from the work
//! ahead of it and the model's batch cost (`cost.rs`). A request that
//! cannot finish before its deadline is refused then (503, `Retry-After`)
//! instead of waiting its whole timeout for a 504 (`refuse_predicted_late`).
//!
//! The work ahead is what the model's sessions must run before the
//! request's batch ends: what is left of the batches already dispatched
//! (each predicted `T(size)`, less the time since it was dispatched), then
//! the waiting units at the request's level or higher, and the request
//! itself, in batches of the largest size the model takes. The sessions
//! share that work: the request is answered after the work ÷ sessions, and
//! never sooner than its own batch's run time. The run times measured
//! already include what sessions running side by side cost each other.
//! Pure: no clock, no I/O.

use std::time::Duration;

use super::cost::Fit;

/// What is ahead of a request when it arrives.
#[derive(Debug, Clone, Copy)]
pub struct Ahead {
    /// What is left of the batches dispatched and not finished (predicted).
    pub in_flight: Duration,
    /// Units waiting at the request's level or higher.
    pub queued: usize,
    /// The request's own units.
    pub own: usize,
    /// Units of the largest batch the model takes.
    pub max_batch: usize,
    /// The model's sessions.
    pub sessions: usize,
    /// Units a second arriving at higher levels, which will go ahead of it
    /// while it waits (0 at the highest level).
    pub arriving_above: f64,
}

/// How long after arriving the request is predicted to be answered, and
/// how long until the work ahead of it is done (for `Retry-After`).
pub fn predicted_finish(fit: &Fit, a: &Ahead) -> (Duration, Duration) {
    let max = a.max_batch.max(1);
    let total = a.queued + a.own.max(1);
    let (full, rest) = (total / max, total % max);
    let mut queue = fit.predict(max).mul_f64(full as f64);
    if rest > 0 {
        queue += fit.predict(rest);
    }
    let sessions = a.sessions.max(1) as u32;
    let own_batch = fit.predict(if rest > 0 { rest } else { max });
    // While it waits, higher levels arrive and go first: each second of
    // waiting brings `load` seconds of their work (queueing theory's
    // W = W0 / (1 − ρ) for the classes above).
    let per_unit = fit.predict(max).as_secs_f64() / max as f64 / f64::from(sessions);
    let load = a.arriving_above * per_unit;
    if load >= 0.99 {
        // Higher levels alone fill the sessions: it would wait until promoted.
        return (Duration::MAX, Duration::from_secs(1));
    }
    let stretch = |d: Duration| d.div_f64(1.0 - load);
    let finish = stretch((a.in_flight + queue) / sessions).max(own_batch);
    let ahead = stretch((a.in_flight + queue.saturating_sub(own_batch)) / sessions);
    (finish, ahead)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// T(n) = 1 ms + 0.1 ms·n.
    fn fit() -> Fit {
        Fit {
            fixed: 1e-3,
            per_unit: 1e-4,
            only_size: None,
            samples: 10,
        }
    }

    fn ms(x: f64) -> Duration {
        Duration::from_secs_f64(x / 1e3)
    }

    fn near(a: Duration, b: Duration) -> bool {
        (a.as_secs_f64() - b.as_secs_f64()).abs() < 1e-9
    }

    #[test]
    fn predictions_follow_the_work_ahead() {
        let base = Ahead {
            in_flight: Duration::ZERO,
            queued: 0,
            own: 1,
            max_batch: 10,
            sessions: 1,
            arriving_above: 0.0,
        };
        // (what changes, predicted finish in ms, work ahead in ms)
        let cases = [
            // Nothing ahead: its own batch of one, 1.1 ms.
            (base, 1.1, 0.0),
            // 25 waiting: two full batches (2 ms each), then its own of 6.
            (Ahead { queued: 25, ..base }, 5.6, 4.0),
            // The same on two sessions: half the work, its own batch whole.
            (
                Ahead {
                    queued: 25,
                    sessions: 2,
                    ..base
                },
                2.8,
                2.0,
            ),
            // A batch still running for 3 ms comes first.
            (
                Ahead {
                    in_flight: ms(3.0),
                    ..base
                },
                4.1,
                3.0,
            ),
            // A request of 10 fills a batch of its own.
            (Ahead { own: 10, ..base }, 2.0, 0.0),
            // On many sessions, never sooner than its own run.
            (
                Ahead {
                    queued: 5,
                    sessions: 8,
                    ..base
                },
                1.6,
                0.0,
            ),
            // Higher levels arrive at 2,500 rows/s, each 0.2 ms of a full
            // batch: they take half the session, so the wait doubles.
            (
                Ahead {
                    queued: 25,
                    arriving_above: 2500.0,
                    ..base
                },
                11.2,
                8.0,
            ),
        ];
        for (a, finish, ahead) in cases {
            let (f, w) = predicted_finish(&fit(), &a);
            assert!(near(f, ms(finish)), "{a:?}: finish {f:?}, expected {finish} ms");
            assert!(near(w, ms(ahead)), "{a:?}: ahead {w:?}, expected {ahead} ms");
        }
        // Higher levels that fill the sessions: it cannot be predicted to finish.
        let full = Ahead {
            arriving_above: 5000.0,
            ..base
        };
        assert_eq!(predicted_finish(&fit(), &full).0, Duration::MAX);
    }
}
