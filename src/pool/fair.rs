//! One device's scheduler: at most `limit` batches run on the device at once
//! (whatever model they belong to), and when a slot frees, the waiting batch
//! with the earliest key goes next. The pool keys each batch by the moment it
//! asked for a slot (oldest batch first). Since a model has at most one
//! batch per session asking at a time, a quiet model's batch waits behind at
//! most that many of a busy model's, however long the busy model's backlog.
//! (Keying by the batch's oldest request instead lets a model with a long
//! backlog, whose next batch always holds older requests, starve the others.)
//!
//! Priority levels decide between models too: a batch of level L (its most
//! urgent request's; a model without levels counts as level 1) is keyed as
//! though it had asked [`LEVEL_STEP`] × (L − 1) later. A lower level thus
//! yields the device to higher ones, yet waits at most that much longer
//! than a higher-level batch that asked after it: its wait is bounded,
//! never starved (priority with aging).
//!
//! A waiting batch is a [`Start`]: the thread that frees a slot (a session
//! thread, when its run ends) calls it with the slot, and it hands the batch
//! straight to its model's session thread. The next run on the device thus
//! begins without a trip through the async runtime.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How much later each priority level below the highest counts a batch as
/// having asked for a slot (see the module docs).
pub const LEVEL_STEP: Duration = Duration::from_millis(100);

/// The device-queue key of a batch of priority `level` that asks at `at`.
pub fn key(at: Instant, level: u32) -> Instant {
    at + LEVEL_STEP * level.saturating_sub(1).min(1000)
}

/// What a batch does once it has a run slot: starts its run, which holds
/// the permit until it ends. Called on the thread that freed the slot, so
/// it must not block. Dropping the permit (a start that fails) frees the
/// slot for the next batch.
pub type Start = Box<dyn FnOnce(DevicePermit) + Send>;

/// A batch waiting for a run slot.
struct Waiter {
    oldest: Instant,
    seq: u64,
    start: Start,
}

impl PartialEq for Waiter {
    fn eq(&self, other: &Self) -> bool {
        (self.oldest, self.seq) == (other.oldest, other.seq)
    }
}
impl Eq for Waiter {}
impl PartialOrd for Waiter {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Waiter {
    /// Reversed so that `BinaryHeap` (a max-heap) pops the oldest first.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.oldest, other.seq).cmp(&(self.oldest, self.seq))
    }
}

#[derive(Default)]
struct Slots {
    running: usize,
    next_seq: u64,
    waiting: BinaryHeap<Waiter>,
}

/// Run slots of one device, shared by every model placed on it.
pub struct DeviceScheduler {
    limit: usize,
    /// Held only to count slots and push/pop waiters (never across an await).
    slots: Mutex<Slots>,
}

/// A run slot; dropping it hands the slot to the oldest waiter.
pub struct DevicePermit {
    sched: Arc<DeviceScheduler>,
}

impl DeviceScheduler {
    pub fn new(limit: usize) -> Arc<DeviceScheduler> {
        Arc::new(DeviceScheduler {
            limit: limit.max(1),
            slots: Mutex::new(Slots::default()),
        })
    }

    /// Calls `start` with a run slot: now when one is free, else when one
    /// frees and no waiter with an earlier `key` is left.
    pub fn submit(self: &Arc<Self>, key: Instant, start: Start) {
        {
            let mut s = self.slots.lock().expect("device slots poisoned");
            if s.running == self.limit {
                let seq = s.next_seq;
                s.next_seq += 1;
                s.waiting.push(Waiter {
                    oldest: key,
                    seq,
                    start,
                });
                return;
            }
            s.running += 1;
        }
        start(DevicePermit { sched: self.clone() });
    }

    /// A run slot now, if one is free and no batch waits for one.
    pub fn try_acquire(self: &Arc<Self>) -> Option<DevicePermit> {
        let mut s = self.slots.lock().expect("device slots poisoned");
        if s.running == self.limit || !s.waiting.is_empty() {
            return None;
        }
        s.running += 1;
        Some(DevicePermit { sched: self.clone() })
    }

    /// Batches waiting for a slot.
    #[cfg(test)]
    pub fn waiting(&self) -> usize {
        self.slots.lock().expect("device slots poisoned").waiting.len()
    }

    /// Waits for a run slot; waiters with an earlier `key` go first. (The
    /// pool uses [`DeviceScheduler::submit`]; the fairness tests wait with this.)
    #[cfg(test)]
    pub async fn acquire(self: &Arc<Self>, key: Instant) -> DevicePermit {
        // The receiver is this future: if it is dropped while waiting, the
        // send fails, the permit drops, and the slot moves on.
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.submit(
            key,
            Box::new(move |permit| {
                let _ = tx.send(permit);
            }),
        );
        rx.await
            .expect("a device scheduler outlives its waiters. This is a bug.")
    }

    /// A slot is free: it goes to the oldest waiter (called outside the
    /// lock, since a start that fails releases the slot again), or back.
    fn release(self: &Arc<Self>) {
        let next = {
            let mut s = self.slots.lock().expect("device slots poisoned");
            match s.waiting.pop() {
                Some(w) => w,
                None => {
                    s.running -= 1;
                    return;
                }
            }
        };
        (next.start)(DevicePermit { sched: self.clone() });
    }
}

impl Drop for DevicePermit {
    fn drop(&mut self) {
        self.sched.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn limit_bounds_concurrent_runs_and_oldest_goes_first() {
        let s = DeviceScheduler::new(1);
        let t0 = Instant::now();
        let first = s.acquire(t0).await;
        // Two batches wait: the younger one asked first.
        let young = tokio::spawn({
            let s = s.clone();
            async move {
                let _p = s.acquire(t0 + Duration::from_millis(5)).await;
                Instant::now()
            }
        });
        tokio::task::yield_now().await;
        let old = tokio::spawn({
            let s = s.clone();
            async move {
                let _p = s.acquire(t0 + Duration::from_millis(1)).await;
                Instant::now()
            }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(
            !young.is_finished() && !old.is_finished(),
            "a slot was handed out beyond the limit"
        );
        drop(first);
        let (young, old) = (young.await.unwrap(), old.await.unwrap());
        assert!(old <= young, "the batch with the older request must run first");
    }

    #[tokio::test]
    async fn a_waiter_that_left_does_not_leak_the_slot() {
        let s = DeviceScheduler::new(1);
        let first = s.acquire(Instant::now()).await;
        let gone = tokio::spawn({
            let s = s.clone();
            async move {
                let _ = s.acquire(Instant::now()).await;
            }
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        gone.abort();
        let _ = gone.await;
        drop(first);
        // The slot is free again: this must not hang.
        tokio::time::timeout(Duration::from_secs(1), s.acquire(Instant::now()))
            .await
            .expect("slot leaked");
    }

    #[test]
    fn a_freed_slot_starts_the_next_batch_on_the_freeing_thread() {
        use std::sync::mpsc;
        let s = DeviceScheduler::new(1);
        let (tx, rx) = mpsc::channel::<(std::thread::ThreadId, DevicePermit)>();
        let send = |tx: mpsc::Sender<_>| -> Start {
            Box::new(move |p| tx.send((std::thread::current().id(), p)).unwrap())
        };
        s.submit(Instant::now(), send(tx.clone()));
        let (_, first) = rx.try_recv().expect("a free slot starts at once");
        // A start that gives its slot up at once passes it on to the next.
        s.submit(Instant::now(), Box::new(drop));
        s.submit(Instant::now(), send(tx.clone()));
        assert!(rx.try_recv().is_err(), "the limit is one batch");
        let freeing = std::thread::spawn(move || {
            drop(first);
            std::thread::current().id()
        })
        .join()
        .unwrap();
        let (started_on, second) = rx.try_recv().expect("started when the slot was freed");
        assert_eq!(started_on, freeing);
        drop(second);
        // Every slot is back: this starts at once.
        s.submit(Instant::now(), send(tx));
        assert!(rx.try_recv().is_ok());
    }
}

#[cfg(test)]
mod level_tests {
    use super::*;

    #[tokio::test]
    async fn a_higher_level_goes_first_and_a_lower_one_waits_a_bounded_time() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        // A level-2 batch that asked 50 ms before a level-1 one still goes
        // after it; one that asked 150 ms before goes first (100 ms a level).
        assert!(key(t0, 2) > key(t0 + ms(50), 1));
        assert!(key(t0, 2) < key(t0 + ms(150), 1));
        // No levels (0) is level 1.
        assert_eq!(key(t0, 0), key(t0, 1));

        let s = DeviceScheduler::new(1);
        let held = s.acquire(key(t0, 1)).await;
        let order = Arc::new(Mutex::new(Vec::new()));
        let wait = |level: u32, name: &'static str| {
            let (s, order) = (s.clone(), order.clone());
            tokio::spawn(async move {
                let _p = s.acquire(key(Instant::now(), level)).await;
                order.lock().unwrap().push(name);
            })
        };
        let low = wait(3, "low");
        tokio::time::sleep(ms(5)).await;
        let high = wait(1, "high");
        tokio::time::sleep(ms(5)).await;
        drop(held);
        let _ = (low.await, high.await);
        assert_eq!(*order.lock().unwrap(), ["high", "low"]);
    }
}
