//! The pure state of one model's queue: entries waiting to be batched, how
//! they group (requests with different trailing dims never share a batch),
//! and an estimate of the arrival rate. No channels, no clock reads: the
//! batching task owns one `State` and passes `now` in, so every rule here is
//! unit-tested directly.
//!
//! Entries wait by priority level, then arrival (see [`Entry::level`]):
//! "oldest" below means the head of that order.
//!
//! Entries of a padded model (`padding`) carry their lengths of the padded
//! dims, and their key leaves those dims out, so requests of different
//! lengths group together; `select.rs` picks which of them share the oldest
//! entry's batch so that the padding stays within bounds.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::cost::{CostModel, Fit};
use super::deadline;
use super::layout::Layout;
use super::padding::Padding;
use crate::error::Error;
use crate::settings::BatchSettings;
use crate::tensor::Tensor;

mod select;

/// What a request (or one chunk of an oversize request) gets back: every
/// output of the model for its own rows, and the id of its batch.
pub type EntryResult = Result<(Vec<Tensor>, super::BatchTag), Error>;

/// One request, or one chunk of a request larger than `max_batch_size`.
#[derive(Debug)]
pub struct Entry {
    /// Inputs in signature order, all with `rows` rows in dim 0.
    pub inputs: Vec<Tensor>,
    pub rows: usize,
    /// Trailing dims of every input: entries batch together only when equal.
    /// A padded model's key leaves its padded dims out (see [`Entry::padded`]).
    pub key: Vec<Vec<usize>>,
    /// A padded model's entry: its length of each padded dim (`Padding::symbols`
    /// order). Empty for a model without padding.
    pub lengths: Vec<usize>,
    pub arrival: Instant,
    /// Past this instant the entry is answered 504 and never run.
    pub deadline: Instant,
    /// Its priority level: the queue keeps entries by level, then arrival;
    /// 1 is the highest, 0 when the model has no priority levels. An entry
    /// near its deadline moves to the highest level (when: `deadline.rs`,
    /// see [`State::remove_dead`]): a low level waits behind higher ones
    /// only while it can still make its deadline.
    pub level: u32,
    /// The submitting request awaits here; closed when the client went away.
    pub reply: oneshot::Sender<EntryResult>,
    /// True for a request's last chunk (or its only entry): when it leaves
    /// the queue, the request no longer counts against `max_queue_size`.
    pub releases_slot: bool,
    /// True when the entry is the whole request, not one chunk of it: run
    /// alone, its outputs are its answer whatever their shapes.
    pub whole: bool,
    /// The request's `infer` span, which its batch links to
    /// (`Span::none()` when tracing is off).
    pub span: tracing::Span,
    /// The entry's `queue` span: it ends when the entry leaves the queue
    /// (the batching task replaces it with `Span::none()`).
    pub queue_span: tracing::Span,
}

impl Entry {
    /// Builds an entry, deriving rows and the grouping key from `inputs`.
    pub fn new(
        inputs: Vec<Tensor>,
        arrival: Instant,
        deadline: Instant,
        reply: oneshot::Sender<EntryResult>,
    ) -> Entry {
        let rows = inputs.first().map(Tensor::rows).unwrap_or(0);
        let key = inputs
            .iter()
            .map(|t| t.shape.iter().skip(1).copied().collect())
            .collect();
        Entry {
            inputs,
            rows,
            key,
            lengths: Vec::new(),
            arrival,
            deadline,
            level: 0,
            reply,
            releases_slot: true,
            whole: true,
            span: tracing::Span::none(),
            queue_span: tracing::Span::none(),
        }
    }
}

impl Entry {
    /// The entry of a padded model: `key` and `lengths` as `Padding::measure` gives them.
    pub fn padded(mut self, key: Vec<Vec<usize>>, lengths: Vec<usize>) -> Entry {
        self.key = key;
        self.lengths = lengths;
        self
    }

    /// The entry grouped for a batcher with `padding` (or none): as
    /// [`Entry::new`] groups it, then as `Padding::measure` does. On an error
    /// (its inputs disagree on a padded dim) the entry comes back with why.
    pub fn regroup(mut self, padding: Option<&Padding>) -> Result<Entry, Box<(Entry, String)>> {
        self.key = self
            .inputs
            .iter()
            .map(|t| t.shape.iter().skip(1).copied().collect())
            .collect();
        self.lengths = Vec::new();
        let Some(p) = padding else {
            return Ok(self);
        };
        match p.measure(&self.inputs) {
            Ok((key, lengths)) => Ok(self.padded(key, lengths)),
            Err(why) => Err(Box::new((self, why))),
        }
    }

    /// The entry of a model whose tensors batch as `layout` says (another
    /// axis than dim 0, or 0-d inputs): its rows and key by that layout.
    /// `layout` checked the entry's rows when its request was admitted.
    pub fn laid_out(mut self, layout: &Layout) -> Entry {
        if !layout.is_plain() {
            self.rows = layout.rows(&self.inputs).unwrap_or(self.rows);
            self.key = layout.key(&self.inputs);
        }
        self
    }

    /// The entry at priority `level` (see [`Entry::level`]).
    pub fn with_level(mut self, level: u32) -> Entry {
        self.level = level;
        self
    }

    /// Whether it moves to the highest level now (`deadline.rs`).
    fn due_for_promotion(&self, now: Instant, horizon: Option<Duration>) -> bool {
        deadline::due_for_promotion(self.level, (self.arrival, self.deadline), now, horizon)
    }

    /// Padded elements per row: the product of its lengths (1 without padding).
    pub fn tokens_per_row(&self) -> usize {
        self.lengths.iter().product::<usize>().max(1)
    }

    /// Its size as the cost model counts it: rows, or a padded model's tokens.
    pub fn units(&self) -> usize {
        self.rows.saturating_mul(self.tokens_per_row())
    }
}

/// What bounds one batch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    /// Most rows (`max_batch_size`, at least 1).
    pub max_rows: usize,
    /// Padded models: most padded tokens, rows × the product of the longest
    /// lengths (`max_batch_tokens`); `None` = no bound.
    pub max_tokens: Option<usize>,
    /// Padded models: most padded tokens ÷ all tokens (`max_padding_ratio`).
    pub max_padding: f64,
}

impl Limits {
    /// The limits the live batch settings give.
    pub fn of(settings: &BatchSettings) -> Limits {
        Limits {
            max_rows: settings.max_batch_size.max(1),
            max_tokens: settings.max_batch_tokens,
            max_padding: settings.max_padding(),
        }
    }

    /// Rows only, as for a model without padding.
    pub fn rows(max_rows: usize) -> Limits {
        Limits {
            max_rows,
            max_tokens: None,
            max_padding: 0.0,
        }
    }

    /// The largest batch these limits allow, in the cost model's units
    /// ([`Entry::units`]), for entries of `tokens_per_row` padded tokens a row.
    pub fn max_units(&self, tokens_per_row: usize) -> usize {
        let rows = self.max_rows.max(1).saturating_mul(tokens_per_row.max(1));
        rows.min(self.max_tokens.unwrap_or(usize::MAX)).max(1)
    }
}

/// The oldest entry's batch, were it formed now (see [`State::fill`]).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Fill {
    /// It cannot grow: it has `max_rows` rows (counting every entry of its
    /// key, as without padding), or, for a padded model, the next entry that
    /// may join it does not fit its rows or tokens.
    pub full: bool,
    /// Some waiting entries would not be in it: another key's, ones past its
    /// rows or tokens, or, for a padded model, ones its padding bound leaves out.
    pub leaves_behind: bool,
}

/// Why an entry left the queue without running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dropped {
    /// Its deadline passed while it waited.
    Expired,
    /// Its client hung up before the batch formed.
    ClientGone,
}

/// Entries waiting for one model, oldest first.
#[derive(Debug, Default)]
pub struct State {
    entries: VecDeque<Entry>,
    /// The newest arrivals seen, at most [`GAP_WINDOW`], oldest first, each
    /// no earlier than the one before: the arrival-rate estimate is their
    /// mean gap, and the last is the newest arrival.
    recent: VecDeque<Instant>,
    /// What a batch of this model costs, by its size.
    cost: CostModel,
    /// Exponentially weighted mean size ([`Entry::units`]) of an arriving entry.
    mean_units: f64,
    /// Units and entries waiting, by level (index = [`Entry::level`]): what
    /// a new entry of a level has ahead of it, without walking the queue.
    units_by_level: Vec<(usize, usize)>,
    /// Units arrived, by level, exponentially weighted (each arrival
    /// weighs the past by 1 − SIZE_WEIGHT / 8): each level's share of the arrivals.
    arrived_by_level: Vec<f64>,
}

/// Arrivals the mean gap is taken over. A mean over a window, not a
/// weighted mean of the last gaps: under load requests arrive in bursts
/// (closed-loop clients send again when their batch answers), and the one
/// long gap before each burst would make a weighted mean expect the burst's
/// next request ten times later than it comes.
const GAP_WINDOW: usize = 32;

/// Weight of the newest entry in the mean entry size.
const SIZE_WEIGHT: f64 = 0.2;

impl State {
    pub fn new() -> State {
        State::default()
    }

    /// Appends an entry and updates the arrival-rate estimate.
    pub fn push(&mut self, entry: Entry) {
        let last = self
            .recent
            .back()
            .map_or(entry.arrival, |&l| l.max(entry.arrival));
        if self.recent.len() == GAP_WINDOW {
            self.recent.pop_front();
        }
        self.recent.push_back(last);
        let units = entry.units();
        self.mean_units = match self.mean_units > 0.0 {
            false => units as f64,
            true => self.mean_units * (1.0 - SIZE_WEIGHT) + units as f64 * SIZE_WEIGHT,
        };
        self.count(entry.level, units, true);
        let level = entry.level as usize;
        if self.arrived_by_level.len() <= level {
            self.arrived_by_level.resize(level + 1, 0.0);
        }
        self.arrived_by_level
            .iter_mut()
            .for_each(|a| *a *= 1.0 - SIZE_WEIGHT / 8.0);
        self.arrived_by_level[level] += units as f64;
        // By level, then arrival: behind every entry of its level or higher.
        let at = self
            .entries
            .iter()
            .rposition(|e| e.level <= entry.level)
            .map_or(0, |i| i + 1);
        self.entries.insert(at, entry);
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Requests (entries) waiting.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Arrival of the entry at the head: the oldest of the highest level
    /// waiting (the oldest of all when the model has no priority levels).
    pub fn oldest(&self) -> Option<Instant> {
        self.entries.front().map(|e| e.arrival)
    }

    /// The oldest entry's batch if it closed now: whether it can still grow,
    /// and whether waiting entries would be left behind.
    pub fn fill(&self, limits: Limits) -> Fill {
        let Some(first) = self.entries.front() else {
            return Fill::default();
        };
        if first.lengths.is_empty() {
            let (rows, joining) = self
                .entries
                .iter()
                .filter(|e| e.key == first.key)
                .fold((0, 0), |(r, n), e| (r + e.rows, n + 1));
            return Fill {
                full: rows >= limits.max_rows,
                leaves_behind: joining < self.entries.len() || rows > limits.max_rows,
            };
        }
        let pick = select::pick(&self.entries, limits);
        Fill {
            full: pick.full,
            leaves_behind: pick.indices.len() < self.entries.len(),
        }
    }

    /// Records how long a finished batch of `units` took to run.
    pub fn record_run(&mut self, units: usize, took: Duration) {
        self.cost.record(units, took);
    }

    /// The fitted cost of a batch by its size (None until enough runs finished).
    pub fn cost(&self) -> Option<Fit> {
        self.cost.fit()
    }

    /// Mean size ([`Entry::units`]) of an arriving entry (0 before any).
    pub fn mean_units(&self) -> f64 {
        self.mean_units
    }

    /// Units a second arriving at levels above `level` (lower numbers): the
    /// work that will jump an entry of that level while it waits.
    pub fn arriving_above(&self, level: u32) -> f64 {
        let total: f64 = self.arrived_by_level.iter().sum();
        let above: f64 = self.arrived_by_level.iter().take(level as usize).sum();
        match (self.mean_gap(), total > 0.0) {
            (Some(gap), true) if !gap.is_zero() => above / total * self.mean_units / gap.as_secs_f64(),
            _ => 0.0,
        }
    }

    /// Units waiting at `level` or higher (lower numbers): what an entry
    /// of that level, queued now, would wait behind.
    pub fn units_ahead(&self, level: u32) -> usize {
        self.ahead(level).0
    }

    /// Units and entries waiting at `level` or higher.
    pub fn ahead(&self, level: u32) -> (usize, usize) {
        let upto = (level as usize + 1).min(self.units_by_level.len());
        self.units_by_level[..upto]
            .iter()
            .fold((0, 0), |(u, n), &(lu, ln)| (u + lu, n + ln))
    }

    /// Units waiting, of every level.
    pub fn units(&self) -> usize {
        self.ahead(u32::MAX).0
    }

    /// Padded tokens a row of the head entry, whose batch forms next (1
    /// without padding or without entries).
    pub fn head_tokens_per_row(&self) -> usize {
        self.entries.front().map_or(1, Entry::tokens_per_row)
    }

    /// Adds (or removes) an entry's units at its level.
    fn count(&mut self, level: u32, units: usize, add: bool) {
        let l = level as usize;
        if self.units_by_level.len() <= l {
            self.units_by_level.resize(l + 1, (0, 0));
        }
        let (u, n) = &mut self.units_by_level[l];
        (*u, *n) = match add {
            true => (*u + units, *n + 1),
            false => (u.saturating_sub(units), n.saturating_sub(1)),
        };
    }

    /// Counts the units by level again, after entries left or moved.
    fn recount(&mut self) {
        let by_level = &mut self.units_by_level;
        by_level.iter_mut().for_each(|n| *n = (0, 0));
        for e in &self.entries {
            let l = e.level as usize;
            if by_level.len() <= l {
                by_level.resize(l + 1, (0, 0));
            }
            by_level[l].0 += e.units();
            by_level[l].1 += 1;
        }
    }

    /// Arrival of the newest entry seen.
    pub fn last_arrival(&self) -> Option<Instant> {
        self.recent.back().copied()
    }

    /// Mean gap between the last [`GAP_WINDOW`] arrivals (None until two arrived).
    fn mean_gap(&self) -> Option<Duration> {
        let (first, last) = (self.recent.front()?, self.recent.back()?);
        let gaps = u32::try_from(self.recent.len() - 1).ok().filter(|&n| n > 0)?;
        Some(last.saturating_duration_since(*first) / gaps)
    }

    /// When the next arrival is expected, from the mean gap (None: no estimate yet).
    pub fn next_arrival_expected(&self) -> Option<Instant> {
        Some(self.last_arrival()? + self.mean_gap()?)
    }

    /// The earliest deadline of the waiting entries.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.entries.iter().map(|e| e.deadline).min()
    }

    /// Removes entries that expired or whose client left; returns them with why.
    pub fn remove_dead(&mut self, now: Instant) -> Vec<(Entry, Dropped)> {
        self.promote(now);
        // The common case, checked without moving (or allocating) anything:
        // the batching task calls this on every turn of its loop.
        let alive = |e: &Entry| now < e.deadline && !e.reply.is_closed();
        if self.entries.iter().all(alive) {
            return Vec::new();
        }
        let mut dead = Vec::new();
        let mut kept = VecDeque::with_capacity(self.entries.len());
        for e in self.entries.drain(..) {
            // Expiry first: at its deadline the request's own wait gives up
            // and closes the reply, which is not the client leaving.
            if now >= e.deadline {
                dead.push((e, Dropped::Expired));
            } else if e.reply.is_closed() {
                dead.push((e, Dropped::ClientGone));
            } else {
                kept.push_back(e);
            }
        }
        self.entries = kept;
        self.recount();
        dead
    }

    /// Moves every entry due (see [`Entry::level`]) to the highest level,
    /// among that level's entries by arrival.
    fn promote(&mut self, now: Instant) {
        if self.entries.iter().all(|e| e.level <= 1) {
            return;
        }
        let horizon = deadline::promotion_horizon(self.cost.typical());
        if !self.entries.iter().any(|e| e.due_for_promotion(now, horizon)) {
            return;
        }
        for e in self
            .entries
            .iter_mut()
            .filter(|e| e.due_for_promotion(now, horizon))
        {
            e.level = 1;
        }
        // Stable: a request's chunks (one arrival) keep their order.
        self.entries
            .make_contiguous()
            .sort_by_key(|e| (e.level, e.arrival));
        self.recount();
    }

    /// Takes the oldest entry and, in arrival order, the later entries with
    /// the same key while the batch stays within `max_rows` rows. Entries of
    /// one key leave in arrival order (a small request never jumps a larger
    /// one that did not fit, so a split request's chunks run in order). The
    /// oldest entry is always taken (the batcher splits entries to fit).
    ///
    /// A padded model's batch is the oldest entry and the entries
    /// `select::pick` chooses, in arrival order.
    pub fn take_batch(&mut self, limits: Limits) -> Vec<Entry> {
        let max_rows = limits.max_rows;
        let Some(first) = self.entries.front() else {
            return Vec::new();
        };
        if !first.lengths.is_empty() {
            let picked = select::pick(&self.entries, limits).indices;
            let mut batch = Vec::with_capacity(picked.len());
            let mut rest = VecDeque::with_capacity(self.entries.len());
            let mut next = picked.iter().peekable();
            for (i, e) in self.entries.drain(..).enumerate() {
                if next.next_if(|&&p| p == i).is_some() {
                    batch.push(e);
                } else {
                    rest.push_back(e);
                }
            }
            self.entries = rest;
            self.recount();
            return batch;
        }
        let first = self.entries.pop_front().expect("checked above");
        let mut rows = first.rows;
        let key = first.key.clone();
        let mut batch = vec![first];
        let mut full = false;
        let mut rest = VecDeque::with_capacity(self.entries.len());
        for e in self.entries.drain(..) {
            if !full && e.key == key && rows + e.rows <= max_rows {
                rows += e.rows;
                batch.push(e);
            } else {
                full |= e.key == key;
                rest.push_back(e);
            }
        }
        self.entries = rest;
        for e in &batch {
            self.count(e.level, e.units(), false);
        }
        batch
    }

    /// Takes every entry (for a drain), oldest first.
    pub fn take_all(&mut self) -> Vec<Entry> {
        self.units_by_level.clear();
        self.entries.drain(..).collect()
    }
}

#[cfg(test)]
pub(crate) mod tests;
