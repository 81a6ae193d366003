//! The deadline and priority rule, in one place: when a waiting request of
//! a lower level moves to the highest (promotion), how long a request is
//! predicted to take when it arrives, and whether it is admitted (a request
//! predicted to miss its deadline is refused at once, 503 + `Retry-After`,
//! instead of waiting its whole timeout for a 504: `refuse_predicted_late`).
//! The queue asks it when to promote, the batching task whether to admit
//! and what to publish. Pure: no clock, no I/O.
//!
//! **Runs.** The prediction counts runs the way the batcher forms them
//! (`queue.rs`, `take_batch`): entries of one size share a batch while they
//! fit its `max_batch` units, and an entry larger than that (a request on a
//! model that does not batch, which is never cut into chunks) runs alone,
//! whole. So `n` entries of mean size `u` take `n ÷ ⌊max ÷ u⌋` runs (`n`
//! when `u ≥ max`), each costing the fitted `T(size)` (`cost.rs`). The
//! sessions share the work: a request is answered after what is left of the
//! batches in flight and the runs ahead of it ÷ sessions, and never sooner
//! than its own batch's run.
//!
//! **Levels.** Work arriving at higher levels goes ahead of a request while
//! it waits: each second brings `load` seconds of it, which stretches the
//! wait to `W ÷ (1 − load)` (queueing theory's `W0 ÷ (1 − ρ)` for the
//! classes above). But a lower level is never starved: [`PROMOTE_AHEAD`]
//! typical batches before its deadline it moves to the highest level,
//! behind only what arrived before it, which it waits behind in any case.
//! From there [`AFTER_PROMOTION`] batches remain (the batch running, one
//! formed ahead, its own), and [`MARGIN`] to spare. So a request that
//! higher levels can jump is predicted to finish by the earlier of its
//! stretched wait and its deadline less the margin, as long as the work
//! ahead of it at arrival fits: it is refused only when even that would
//! take it past its deadline.
//!
//! **Margin.** Under overload every admitted request is one whose
//! prediction just fits: [`MARGIN`] batches keep an error of a batch in
//! the prediction from being a 504 (never more than the wait ahead: an
//! idle model admits whatever its own run allows).

use std::time::{Duration, Instant};

use super::cost::Fit;

/// Batches a promoted request may still wait: the batch running, one
/// formed ahead of it, and its own.
pub const AFTER_PROMOTION: u32 = 3;

/// Batches of slack an admitted request keeps before its deadline.
pub const MARGIN: u32 = 1;

/// Typical batches before its deadline at which a lower level is promoted.
pub const PROMOTE_AHEAD: u32 = AFTER_PROMOTION + MARGIN;

/// Share of its time to the deadline a lower level waits, before the batch
/// cost is known, until it is promoted.
const PROMOTE_BEFORE_COST: f64 = 0.5;

/// Load of the levels above past which a request is taken to wait until promoted.
const SATURATED: f64 = 0.99;

/// How long before its deadline a waiting lower level is promoted, from
/// the model's typical batch run (`None` while it is unknown).
pub fn promotion_horizon(typical: Option<Duration>) -> Option<Duration> {
    typical.map(|t| t * PROMOTE_AHEAD)
}

/// Whether a waiting request of `level` moves to the highest level `now`:
/// within `horizon` of its deadline, or, with no horizon yet, once it has
/// waited [`PROMOTE_BEFORE_COST`] of its time.
pub fn due_for_promotion(
    level: u32,
    (arrival, deadline): (Instant, Instant),
    now: Instant,
    horizon: Option<Duration>,
) -> bool {
    level > 1
        && match horizon {
            Some(h) => now + h >= deadline,
            None => now >= arrival + (deadline - arrival).mul_f64(PROMOTE_BEFORE_COST),
        }
}

/// What is ahead of a request when it arrives.
#[derive(Debug, Clone, Copy)]
pub struct Ahead {
    /// What is left of the batches dispatched and not finished (predicted).
    pub in_flight: Duration,
    /// Units ([`super::Entry::units`]) waiting at the request's level or higher.
    pub queued: usize,
    /// Entries waiting at the request's level or higher.
    pub entries: usize,
    /// The request's own units.
    pub own: usize,
    /// Units of the largest batch the batcher forms now.
    pub max_batch: usize,
    /// The model's sessions.
    pub sessions: usize,
    /// Units a second arriving at higher levels, which will go ahead of it
    /// while it waits (0 at the highest level).
    pub arriving_above: f64,
}

/// When a request is predicted to be answered, from its arrival.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Prediction {
    /// Until it is answered, with nothing above it (the work ahead now).
    pub finish: Duration,
    /// Until the work ahead of it is done (for `Retry-After`).
    pub ahead: Duration,
    /// Both stretched by the levels above (`None`: they fill the sessions).
    pub stretched: Option<(Duration, Duration)>,
}

/// Runs the batcher forms for `entries` entries holding `units`, at most
/// `max` units a batch, and the units of the last of them.
fn runs(entries: usize, units: usize, max: usize) -> (usize, usize) {
    let (entries, max) = (entries.max(1), max.max(1));
    let mean = units.div_ceil(entries).max(1);
    let per_batch = (max / mean).max(1);
    let runs = entries.div_ceil(per_batch);
    let last = units.saturating_sub((runs - 1) * per_batch * mean);
    (runs, last.max(1))
}

/// How long after arriving the request is predicted to be answered.
pub fn predict(fit: &Fit, a: &Ahead) -> Prediction {
    let own = a.own.max(1);
    let total = a.queued + own;
    let (n, last) = runs(a.entries + 1, total, a.max_batch);
    let queue = fit.predict_runs(n, total);
    let sessions = a.sessions.max(1) as u32;
    // Its own batch: itself alone when it is larger than a batch, else the last one.
    let own_batch = fit.predict(if own >= a.max_batch { own } else { last.max(own) });
    let finish = ((a.in_flight + queue) / sessions).max(own_batch);
    let ahead = (a.in_flight + queue.saturating_sub(own_batch)) / sessions;
    let per_unit = fit.predict(a.max_batch).as_secs_f64() / a.max_batch.max(1) as f64 / f64::from(sessions);
    let load = a.arriving_above * per_unit;
    let stretched = (load < SATURATED).then(|| {
        let stretch = |d: Duration| d.div_f64(1.0 - load);
        (
            stretch((a.in_flight + queue) / sessions).max(own_batch),
            stretch(ahead),
        )
    });
    Prediction {
        finish,
        ahead,
        stretched,
    }
}

/// Whether a request is admitted.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Verdict {
    Admit,
    /// Predicted to be answered `predicted` after it arrived, past its
    /// deadline; the work ahead of it is done in `retry_after`.
    Refuse {
        predicted: Duration,
        retry_after: Duration,
    },
}

/// The verdict on a request with `to_deadline` left at arrival, `a` ahead
/// of it, of priority `level` (see the module docs); `typical` is the
/// model's typical batch run.
pub fn verdict(fit: &Fit, a: &Ahead, level: u32, to_deadline: Duration, typical: Duration) -> Verdict {
    let p = predict(fit, a);
    let jumpable = level > 1 && a.arriving_above > 0.0;
    let (finish, ahead) = match (p.stretched, jumpable) {
        (Some(s), false) => s,
        // Promotion bounds its wait, once what is ahead of it now is done.
        (s, true) => {
            let promoted = to_deadline.saturating_sub(typical * MARGIN).max(p.finish);
            let (finish, ahead) = s.unwrap_or((Duration::MAX, Duration::MAX));
            (finish.min(promoted), ahead.min(promoted))
        }
        (None, false) => (p.finish, p.ahead),
    };
    let margin = (typical * MARGIN).min(ahead);
    if finish.saturating_add(margin) <= to_deadline {
        return Verdict::Admit;
    }
    Verdict::Refuse {
        predicted: finish,
        retry_after: ahead,
    }
}

#[cfg(test)]
mod tests;
