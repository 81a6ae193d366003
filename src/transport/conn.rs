//! One connection's state and its timers: how long it may take to send a
//! request's headers, how long it may stay idle between requests, when the
//! drain closes it, and when the connection limit evicts it.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{watch, Notify, OwnedSemaphorePermit, Semaphore};

use super::repoll::Running;
use crate::config::HttpLimits;

/// What a connection is doing while no request of it is running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Phase {
    /// Accepted; nothing read yet.
    Fresh = 0,
    /// Bytes of a request arrived; its headers are not complete.
    Head = 1,
    /// A request is running (`active > 0`).
    Busy = 2,
    /// Between requests (keep-alive).
    Idle = 3,
}

impl Phase {
    fn from_u8(v: u8) -> Phase {
        match v {
            0 => Phase::Fresh,
            1 => Phase::Head,
            2 => Phase::Busy,
            _ => Phase::Idle,
        }
    }
}

/// The HTTP/2 connection preface; a connection whose first bytes start it is HTTP/2.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Shared by a connection's task, its I/O wrapper (reads), its requests
/// (begin/end) and the accept loop (eviction). Only atomics: no lock.
pub(super) struct ConnState {
    accepted: Instant,
    /// Requests handed to the router and not yet answered.
    active: AtomicUsize,
    /// Answers being sent (their bodies alive in hyper), and when hyper last
    /// took from one, in milliseconds after `accepted`: a connection whose
    /// answers make no progress for `write_timeout` is closed.
    answering: AtomicUsize,
    progress_ms: AtomicU64,
    /// Of those, the ones whose body is still arriving (long-lived streams
    /// aside): a connection whose every request is one may be evicted, so
    /// that slow uploads cannot hold the port's slots.
    receiving: AtomicUsize,
    phase: AtomicU8,
    /// Milliseconds after `accepted` when the current phase began.
    since_ms: AtomicU64,
    /// Speaks HTTP/2: reads between requests are control frames, not a new request.
    h2: AtomicBool,
    /// The accept loop asks this connection to close to make room.
    evict: AtomicBool,
    /// The connection's task wants to hear of phase changes: set once it
    /// drains (it must tell hyper to finish as soon as the phase allows).
    /// Before that, phase changes (several per request) wake nobody: the
    /// task's timer is set no later than any deadline they can bring.
    watched: AtomicBool,
    /// Wakes the connection's task on an eviction, and on phase changes
    /// while `watched`; the task is the only waiter.
    changed: Notify,
    /// Requests running on the whole port, this connection's among them
    /// (shared by every connection, read by `repoll`).
    running: Running,
}

impl ConnState {
    fn new(running: Running) -> ConnState {
        ConnState {
            accepted: Instant::now(),
            active: AtomicUsize::new(0),
            receiving: AtomicUsize::new(0),
            answering: AtomicUsize::new(0),
            progress_ms: AtomicU64::new(0),
            phase: AtomicU8::new(Phase::Fresh as u8),
            since_ms: AtomicU64::new(0),
            h2: AtomicBool::new(false),
            evict: AtomicBool::new(false),
            watched: AtomicBool::new(false),
            changed: Notify::new(),
            running,
        }
    }

    fn set_phase(&self, phase: Phase, now: Instant) {
        let ms = now.saturating_duration_since(self.accepted).as_millis() as u64;
        self.since_ms.store(ms, Ordering::Release);
        self.phase.store(phase as u8, Ordering::Release);
        self.phase_changed();
    }

    /// Wakes the connection's task if it watches phases. The fence pairs
    /// with [`ConnState::watch_phases`]'s: either the task reads the new
    /// phase after setting `watched`, or this reads `watched` set.
    fn phase_changed(&self) {
        fence(Ordering::SeqCst);
        if self.watched.load(Ordering::Relaxed) {
            self.changed.notify_one();
        }
    }

    /// From now on every phase change wakes the connection's task.
    fn watch_phases(&self) {
        self.watched.store(true, Ordering::Relaxed);
        fence(Ordering::SeqCst);
    }

    fn phase(&self) -> (Phase, Instant) {
        let phase = Phase::from_u8(self.phase.load(Ordering::Acquire));
        let since = self.accepted + Duration::from_millis(self.since_ms.load(Ordering::Acquire));
        (phase, since)
    }

    /// The I/O wrapper read `data`; `first` when these are the connection's first bytes.
    pub(super) fn on_read(&self, data: &[u8], first: bool) {
        if first {
            let n = data.len().min(H2_PREFACE.len());
            let h2 = n >= 3 && H2_PREFACE.starts_with(&data[..n]);
            self.h2.store(h2, Ordering::Release);
        }
        if self.active.load(Ordering::Acquire) > 0 || self.h2.load(Ordering::Acquire) {
            return;
        }
        match self.phase().0 {
            // The first request's headers are timed from the accept.
            Phase::Fresh => self.phase.store(Phase::Head as u8, Ordering::Release),
            Phase::Idle => self.set_phase(Phase::Head, Instant::now()),
            Phase::Head | Phase::Busy => {}
        }
    }

    /// The router got a request of this connection.
    pub(super) fn begin_request(&self) {
        self.running.begin();
        self.active.fetch_add(1, Ordering::AcqRel);
        self.phase.store(Phase::Busy as u8, Ordering::Release);
        self.phase_changed();
    }

    /// A request's answer was handed to hyper in full (or dropped).
    pub(super) fn end_request(&self) {
        self.running.end();
        if self.active.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.set_phase(Phase::Idle, Instant::now());
        }
    }

    /// An answer is handed to hyper to send.
    pub(super) fn answer_started(&self) {
        self.answer_progress();
        self.answering.fetch_add(1, Ordering::AcqRel);
    }

    /// hyper took from an answer's body (it could write).
    pub(super) fn answer_progress(&self) {
        let ms = self.accepted.elapsed().as_millis() as u64;
        self.progress_ms.store(ms, Ordering::Release);
    }

    /// An answer was sent in full (or dropped).
    pub(super) fn answer_done(&self) {
        self.answering.fetch_sub(1, Ordering::AcqRel);
    }

    /// Since when the connection's answers have made no progress, if it has any.
    fn stalled_since(&self) -> Option<Instant> {
        (self.answering.load(Ordering::Acquire) > 0)
            .then(|| self.accepted + Duration::from_millis(self.progress_ms.load(Ordering::Acquire)))
    }

    /// A running request's body began to arrive (it has one).
    pub(super) fn body_started(&self) {
        self.receiving.fetch_add(1, Ordering::AcqRel);
    }

    /// A running request's body arrived in full (or failed, or was dropped).
    pub(super) fn body_done(&self) {
        self.receiving.fetch_sub(1, Ordering::AcqRel);
    }

    /// Requests run, and every one of them is still receiving its body.
    fn only_receiving(&self) -> bool {
        let active = self.active.load(Ordering::Acquire);
        active > 0 && self.receiving.load(Ordering::Acquire) >= active
    }

    /// The requests running on the whole port.
    pub(super) fn running(&self) -> &Running {
        &self.running
    }

    /// No request of this connection is running.
    pub(super) fn is_quiet(&self) -> bool {
        self.active.load(Ordering::Acquire) == 0
    }

    /// When the current phase's time runs out (none while a request runs).
    fn deadline(&self, limits: &HttpLimits) -> Option<Instant> {
        if !self.is_quiet() {
            return None;
        }
        match self.phase() {
            (Phase::Fresh | Phase::Head, since) => Some(since + limits.header_read_timeout),
            (Phase::Idle, since) => Some(since + limits.keep_alive_timeout),
            // A request just ended and its end has not been recorded yet.
            (Phase::Busy, _) => None,
        }
    }

    /// Why the connection must close now, if it must.
    fn close_reason(&self, limits: &HttpLimits, now: Instant) -> Option<&'static str> {
        if let Some(why) = self.evict_reason() {
            return Some(why);
        }
        if self
            .stalled_since()
            .is_some_and(|since| since + limits.write_timeout <= now)
        {
            return Some("answers not read by the client within http.write_timeout_seconds");
        }
        match self.deadline(limits) {
            Some(d) if d <= now => Some(match self.phase().0 {
                Phase::Idle => "idle longer than http.keep_alive_timeout_seconds",
                _ => "request headers not received within http.header_read_timeout_seconds",
            }),
            _ => None,
        }
    }

    /// Whether the connection must close because it was evicted.
    fn evict_reason(&self) -> Option<&'static str> {
        let receiving = self.only_receiving();
        if !self.is_quiet() && !receiving {
            // A request started (or its body arrived) after the accept loop
            // chose this connection.
            self.evict.store(false, Ordering::Release);
            return None;
        }
        let why = match receiving {
            true => "evicted to make room: the port's max_connections reached while its request body was still arriving",
            false => "evicted to make room: the port's max_connections reached",
        };
        self.evict.load(Ordering::Acquire).then_some(why)
    }

    /// When the connection's timer must look next: the current phase's
    /// deadline or, sooner, the earliest deadline that a phase beginning
    /// after `now` can have (phase starts are kept in whole milliseconds
    /// after the accept, so a later one may read up to 1 ms before `now`).
    fn next_check(&self, limits: &HttpLimits, now: Instant) -> Instant {
        let shortest = limits
            .header_read_timeout
            .min(limits.keep_alive_timeout)
            .min(limits.write_timeout);
        // (At least 1 ms, so that sub-millisecond limits do not spin the task.)
        let soonest = now
            + shortest
                .saturating_sub(Duration::from_millis(1))
                .max(Duration::from_millis(1));
        self.deadline(limits).map_or(soonest, |d| d.min(soonest))
    }

    /// While draining: whether hyper may be told to finish (answer what runs,
    /// then close). Not while a request's headers are arriving, nor before the
    /// first request of a connection accepted during the drain (a health probe).
    fn may_finish(&self, accepted_while_draining: bool) -> bool {
        if !self.is_quiet() {
            return true;
        }
        match self.phase().0 {
            Phase::Idle => true,
            Phase::Fresh => !accepted_while_draining,
            Phase::Head | Phase::Busy => false,
        }
    }

    /// Eviction order: the connection quiet for the longest time first, then
    /// the oldest of those whose every request is still receiving its body
    /// (a slow upload); `None` while a request with its body in runs.
    fn eviction_rank(&self) -> Option<(bool, Instant)> {
        if self.only_receiving() {
            return Some((true, self.accepted));
        }
        match self.phase() {
            _ if !self.is_quiet() => None,
            (Phase::Busy, _) => None,
            (_, since) => Some((false, since)),
        }
    }
}

/// Every open connection of the HTTP port: the limit, and who to evict.
pub(super) struct Connections {
    /// One permit per connection slot; each connection's [`Ticket`] holds one.
    permits: Arc<Semaphore>,
    /// Open connections by id. Locked by the accept loop (insert, the
    /// eviction scan) and by each connection's ticket when it drops
    /// (remove); never held across an await.
    open: Mutex<BTreeMap<u64, Arc<ConnState>>>,
    /// The number of open connections. Sent by tickets (open, close);
    /// the accept loop waits on it to finish the drain.
    count: watch::Sender<usize>,
    next_id: AtomicU64,
    /// Requests running on the port; each connection's state holds a clone.
    running: Running,
}

/// A connection's slot: its permit and its entry; dropping it frees both.
pub(super) struct Ticket {
    id: u64,
    pub(super) state: Arc<ConnState>,
    connections: Arc<Connections>,
    _permit: OwnedSemaphorePermit,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut open = self.connections.open.lock().unwrap_or_else(|e| e.into_inner());
        open.remove(&self.id);
        let n = open.len();
        drop(open);
        self.connections.count.send_replace(n);
    }
}

impl Connections {
    pub(super) fn new(max: usize) -> Arc<Connections> {
        Arc::new(Connections {
            permits: Arc::new(Semaphore::new(max)),
            open: Mutex::new(BTreeMap::new()),
            count: watch::Sender::new(0),
            next_id: AtomicU64::new(0),
            running: Running::default(),
        })
    }

    /// Watches the number of open connections.
    pub(super) fn count(&self) -> watch::Receiver<usize> {
        self.count.subscribe()
    }

    /// A slot for a new connection: a free one, or one made by evicting the
    /// connection quiet for the longest; `None` when every connection has a
    /// request running.
    pub(super) async fn admit(self: &Arc<Self>) -> Option<Ticket> {
        let permit = match self.permits.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                if !self.evict_one() {
                    return None;
                }
                // The evicted connection's task closes it at once; allow for
                // a busy machine before giving up.
                let wait = self.permits.clone().acquire_owned();
                tokio::time::timeout(Duration::from_secs(2), wait)
                    .await
                    .ok()?
                    .ok()?
            }
        };
        let state = Arc::new(ConnState::new(self.running.clone()));
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        open.insert(id, state.clone());
        let n = open.len();
        drop(open);
        self.count.send_replace(n);
        Some(Ticket {
            id,
            state,
            connections: self.clone(),
            _permit: permit,
        })
    }

    /// Asks the connection quiet for the longest (else the oldest slow
    /// upload) to close; false if every connection has a request running
    /// whose body is in.
    fn evict_one(&self) -> bool {
        let open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let oldest = open
            .values()
            .filter(|c| !c.evict.load(Ordering::Acquire))
            .filter_map(|c| c.eviction_rank().map(|rank| (rank, c)))
            .min_by_key(|(rank, _)| *rank);
        match oldest {
            Some((_, c)) => {
                c.evict.store(true, Ordering::Release);
                c.changed.notify_one();
                true
            }
            None => false,
        }
    }
}

/// Drives one connection until it ends, closing it when a timer runs out or
/// it is evicted, and finishing it gracefully once the server drains. hyper
/// goes first at every wake-up, so bytes that have arrived are read before a
/// deadline is judged (a starved task does not drop a request that came in time).
///
/// One timer serves the connection's life. It is set no later than the
/// current phase's deadline and than any later phase's (see
/// [`ConnState::next_check`]), and reset only when it fires, so the phase
/// changes of a request cost no timer work and no wake-up of this task
/// (they were three timer registrations and three wake-ups per request).
///
/// `conn` is hyper's future for the connection; `finish` tells it to
/// finish gracefully (answer what runs, send HTTP/2's GOAWAY, then close).
pub(super) async fn drive<C, E>(
    mut conn: Pin<&mut C>,
    mut finish: impl FnMut(Pin<&mut C>),
    state: &ConnState,
    limits: &HttpLimits,
    mut stop: watch::Receiver<bool>,
) where
    C: std::future::Future<Output = Result<(), E>>,
    E: std::fmt::Display,
{
    let accepted_while_draining = *stop.borrow();
    let mut draining = accepted_while_draining;
    let mut finishing = false;
    let timer = tokio::time::sleep_until(state.next_check(limits, Instant::now()).into());
    tokio::pin!(timer);
    loop {
        if draining && !finishing {
            state.watch_phases();
            if state.may_finish(accepted_while_draining) {
                finish(conn.as_mut());
                finishing = true;
            }
        }
        let fired = tokio::select! {
            biased;
            done = conn.as_mut() => {
                if let Err(e) = done {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
                return;
            }
            _ = state.changed.notified() => false,
            _ = stop.wait_for(|s| *s), if !draining => {
                draining = true;
                false
            }
            _ = timer.as_mut() => true,
        };
        let why = match fired {
            true => {
                let now = Instant::now();
                timer.as_mut().reset(state.next_check(limits, now).into());
                state.close_reason(limits, now)
            }
            false => state.evict_reason(),
        };
        if let Some(why) = why {
            tracing::debug!(reason = why, "closing the connection");
            return;
        }
    }
}

#[cfg(test)]
mod tests;
