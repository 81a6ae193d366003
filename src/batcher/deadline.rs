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
//! classes above), without bound when they fill the sessions. But a lower
//! level is never starved: [`PROMOTE_AHEAD`] typical batches before its
//! deadline it moves to the highest level, behind only what arrived before
//! it, which it waits behind in any case; from there the batches it waits
//! for (the batch running, one formed ahead, its own) end by its deadline.
//!
//! Promoted, it goes ahead of higher levels that came after it. That
//! costs them nothing while they have time to spare: while a request queued
//! behind everything waiting now, and this one, would finish, a batch to
//! spare, within [`SLACK_SHARE`] of the model's timeout and of the time to
//! the earliest deadline of those waiting ([`Ahead::everyone`],
//! [`Times::tightest`]; a flood of patient higher-level clients). Then a
//! request that higher levels can jump is admitted when the work ahead of
//! it at arrival fits with [`MARGIN`] to spare. Otherwise (every level
//! busy with little time to spare, an overload) it must fit its stretched
//! wait with [`AFTER_PROMOTION`] batches to spare, so that, admitted, it
//! should not need promoting, and with higher levels filling the sessions
//! it is refused.
//!
//! **Margin.** Under overload every admitted request is one whose
//! prediction just fits: [`MARGIN`] batches (of the largest size) keep an
//! error of a batch in the prediction from being a 504 (never more than
//! the wait ahead: an idle model admits whatever its own run allows).

use std::time::{Duration, Instant};

use super::cost::Fit;

/// Batches a promoted request may still wait: the batch running, one
/// formed ahead of it, and its own.
pub const AFTER_PROMOTION: u32 = 3;

/// Batches of slack an admitted request keeps before its deadline.
pub const MARGIN: u32 = 1;

/// Typical batches before its deadline at which a lower level is promoted:
/// those it may still wait for.
pub const PROMOTE_AHEAD: u32 = AFTER_PROMOTION;

/// Share of its time to the deadline a lower level waits, before the batch
/// cost is known, until it is promoted.
const PROMOTE_BEFORE_COST: f64 = 0.5;

/// Load of the levels above past which a request is taken to wait until promoted.
const SATURATED: f64 = 0.99;

/// Share of their time higher levels may be using for a lower level to be
/// admitted on its promotion: a snapshot of the queue cannot see the lower
/// ones admitted after it, which the rest is left for.
const SLACK_SHARE: f64 = 0.5;

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
    /// Units and entries waiting at every level (a request that higher
    /// levels can jump weighs what its promotion would cost them).
    pub everyone: (usize, usize),
}

/// The times a verdict weighs, besides the work ahead.
#[derive(Debug, Clone, Copy)]
pub struct Times {
    /// The request's time to its deadline, from its arrival.
    pub to_deadline: Duration,
    /// The model's `timeout`: what higher levels may take.
    pub timeout: Duration,
    /// The time to the earliest deadline of the requests waiting (`None`:
    /// none waits, or it was not asked for: the request cannot be jumped).
    pub tightest: Option<Duration>,
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

/// Whether a request of `level` can be jumped: a lower level, while units
/// arrive at higher ones (`arriving_above` a second).
pub fn jumpable(level: u32, arriving_above: f64) -> bool {
    level > 1 && arriving_above > 0.0
}

/// The verdict on a request with `a` ahead of it, of priority `level`
/// (see the module docs).
pub fn verdict(fit: &Fit, a: &Ahead, level: u32, t: Times) -> Verdict {
    let p = predict(fit, a);
    let jumpable = jumpable(level, a.arriving_above);
    let ((finish, ahead), batches) = match p.stretched {
        // Promotion bounds its wait, and while higher levels have time to
        // spare for it, what is ahead of it now must be done in time.
        _ if jumpable && higher_levels_keep_slack(fit, a, t) => ((p.finish, p.ahead), MARGIN),
        // Every level overloaded: it must not need promoting.
        Some(s) if jumpable => (s, AFTER_PROMOTION),
        // ...and with higher levels filling the sessions, it would.
        None if jumpable => ((p.finish.max(t.to_deadline), p.ahead), AFTER_PROMOTION),
        s => (s.unwrap_or((p.finish, p.ahead)), MARGIN),
    };
    let margin = (fit.predict(a.max_batch) * batches).min(ahead);
    if finish.saturating_add(margin) <= t.to_deadline {
        return Verdict::Admit;
    }
    Verdict::Refuse {
        predicted: finish,
        retry_after: ahead,
    }
}

/// Whether a request queued behind everything waiting now and the one
/// weighed (`a.everyone`, its own units) would finish, with a batch to
/// spare, within [`SLACK_SHARE`] of the model's timeout and of the time to
/// the earliest deadline of those waiting: then promoting it costs higher
/// levels nothing they need.
fn higher_levels_keep_slack(fit: &Fit, a: &Ahead, t: Times) -> bool {
    let (units, entries) = a.everyone;
    let behind_all = Ahead {
        queued: units + a.own.max(1),
        entries: entries + 1,
        own: 1,
        arriving_above: 0.0,
        ..*a
    };
    let batch = fit.predict(a.max_batch) * MARGIN;
    let limit = t
        .tightest
        .map_or(t.timeout, |d| d.min(t.timeout))
        .mul_f64(SLACK_SHARE);
    predict(fit, &behind_all).finish.saturating_add(batch) <= limit
}

#[cfg(test)]
mod tests;
