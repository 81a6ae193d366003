//! Stopping every running batch when the grace period is over (SPEC §11): a
//! run still inside ONNX Runtime when the process exits fails
//! with a runtime error as the library is torn down under it. Shutdown
//! instead cancels the runs (each session's [`Cancel`] handle), waits until no
//! session thread is inside a run, and only then lets the process exit.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::watch;

use crate::runtime::Cancel;

/// The sessions' cancel handles and the count of runs in progress, shared by
/// the pool (which registers sessions), the session threads (which count
/// their runs) and the server's shutdown path (which cancels and waits).
pub struct Runs {
    /// Cancel handles of the sessions spawned so far; weak, so a dropped
    /// model's sessions go away. Pushed by `ModelWorkers::spawn`, read by
    /// [`Runs::cancel_all`].
    handles: Mutex<Vec<Weak<dyn Cancel>>>,
    /// Set once by [`Runs::cancel_all`]: later jobs are refused unrun.
    cancelled: AtomicBool,
    /// Runs in progress. The session threads change it around each run; the
    /// shutdown path waits on a receiver for it to reach 0.
    running: watch::Sender<usize>,
}

impl Default for Runs {
    fn default() -> Self {
        Runs {
            handles: Mutex::new(Vec::new()),
            cancelled: AtomicBool::new(false),
            running: watch::Sender::new(0),
        }
    }
}

impl Runs {
    /// Remembers a session's cancel handle (and forgets dropped sessions').
    pub(super) fn register(&self, handle: &Arc<dyn Cancel>) {
        let mut h = self.handles.lock().expect("cancel handles lock poisoned");
        h.retain(|w| w.strong_count() > 0);
        h.push(Arc::downgrade(handle));
        // A session spawned after shutdown began (a late reload) is cancelled at once.
        if self.cancelled.load(Ordering::Acquire) {
            handle.cancel();
        }
    }

    /// True once [`Runs::cancel_all`] was called.
    pub fn cancelled(&self) -> bool {
        self.cancelled.load(Ordering::Acquire)
    }

    /// Counts one run for as long as the guard lives (on a session thread).
    pub(super) fn start(&self) -> RunGuard<'_> {
        self.running.send_modify(|n| *n += 1);
        RunGuard(self)
    }

    /// Cancels every session's run in progress and refuses every later job;
    /// returns how many runs were in progress.
    pub fn cancel_all(&self) -> usize {
        self.cancelled.store(true, Ordering::Release);
        let handles: Vec<Arc<dyn Cancel>> = {
            let h = self.handles.lock().expect("cancel handles lock poisoned");
            h.iter().filter_map(Weak::upgrade).collect()
        };
        for h in &handles {
            h.cancel();
        }
        *self.running.borrow()
    }

    /// Waits until no run is in progress, at most `limit`; true if none is.
    pub async fn wait_idle(&self, limit: Duration) -> bool {
        let mut rx = self.running.subscribe();
        let idle = tokio::time::timeout(limit, rx.wait_for(|n| *n == 0))
            .await
            .is_ok();
        idle
    }
}

/// One run in progress; dropping it (even by a panic) uncounts it.
pub(super) struct RunGuard<'a>(&'a Runs);

impl Drop for RunGuard<'_> {
    fn drop(&mut self) {
        self.0.running.send_modify(|n| *n -= 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    struct Counting(AtomicUsize);
    impl Cancel for Counting {
        fn cancel(&self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[tokio::test]
    async fn cancel_reaches_live_sessions_and_idle_waits_for_the_last_run() {
        let runs = Arc::new(Runs::default());
        let live = Arc::new(Counting(AtomicUsize::new(0)));
        runs.register(&(live.clone() as Arc<dyn Cancel>));
        {
            let dropped = Arc::new(Counting(AtomicUsize::new(0)));
            runs.register(&(dropped as Arc<dyn Cancel>));
        }
        let guard = runs.start();
        assert!(
            !runs.wait_idle(Duration::from_millis(10)).await,
            "a run is in progress"
        );
        assert_eq!(runs.cancel_all(), 1);
        assert!(runs.cancelled());
        // The live session was cancelled once; the dropped one is forgotten.
        assert_eq!(live.0.load(Ordering::SeqCst), 1);
        assert_eq!(runs.handles.lock().unwrap().len(), 2);
        runs.register(&(live.clone() as Arc<dyn Cancel>));
        assert_eq!(
            runs.handles.lock().unwrap().len(),
            2,
            "the dropped session's handle is pruned"
        );
        let r = runs.clone();
        let waiter = tokio::spawn(async move { r.wait_idle(Duration::from_secs(60)).await });
        drop(guard);
        assert!(waiter.await.unwrap());
        // A session registered after shutdown began is cancelled at once.
        let late = Arc::new(Counting(AtomicUsize::new(0)));
        runs.register(&(late.clone() as Arc<dyn Cancel>));
        assert_eq!(late.0.load(Ordering::SeqCst), 1);
    }
}
