//! One device's scheduler: at most `limit` batches run on the device at once
//! (whatever model they belong to), and when a slot frees, the waiting batch
//! with the earliest key goes next. The pool keys each batch by the moment it
//! asked for a slot (oldest batch first). Since a model has at most one
//! batch per session asking at a time, a quiet model's batch waits behind at
//! most that many of a busy model's, however long the busy model's backlog.
//! (Keying by the batch's oldest request instead lets a model with a long
//! backlog, whose next batch always holds older requests, starve the others.)

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::oneshot;

/// A batch waiting for a run slot.
struct Waiter {
    oldest: Instant,
    seq: u64,
    /// The waiting batch's task awaits its permit here.
    tx: oneshot::Sender<DevicePermit>,
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
    /// False for a permit whose hand-over failed (its waiter left): the slot
    /// then goes on to the next waiter without being released twice.
    armed: bool,
}

impl DeviceScheduler {
    pub fn new(limit: usize) -> Arc<DeviceScheduler> {
        Arc::new(DeviceScheduler {
            limit: limit.max(1),
            slots: Mutex::new(Slots::default()),
        })
    }

    /// Waits for a run slot; waiters with an earlier `key` go first.
    pub async fn acquire(self: &Arc<Self>, key: Instant) -> DevicePermit {
        let rx = {
            let mut s = self.slots.lock().expect("device slots poisoned");
            if s.running < self.limit {
                s.running += 1;
                return DevicePermit {
                    sched: self.clone(),
                    armed: true,
                };
            }
            let (tx, rx) = oneshot::channel();
            let seq = s.next_seq;
            s.next_seq += 1;
            s.waiting.push(Waiter { oldest: key, seq, tx });
            rx
        };
        rx.await
            .expect("a device scheduler outlives its waiters. This is a bug.")
    }

    fn release(self: &Arc<Self>) {
        let mut s = self.slots.lock().expect("device slots poisoned");
        while let Some(w) = s.waiting.pop() {
            match w.tx.send(DevicePermit {
                sched: self.clone(),
                armed: true,
            }) {
                Ok(()) => return,
                Err(mut p) => p.armed = false,
            }
        }
        s.running -= 1;
    }
}

impl Drop for DevicePermit {
    fn drop(&mut self) {
        if self.armed {
            self.sched.release();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

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
}
