//! A connection's task polled again at once when it wakes itself.
//!
//! hyper wakes a connection's task during that task's own poll: the handler
//! asks the request body for data (`hyper::body::Incoming`), which wakes the
//! dispatcher that feeds the body, and both run in the connection's task.
//! tokio treats a task woken while it runs as a yield: it goes to the back of
//! the worker's queue and another worker is woken to share the work. At low
//! load that other worker finds nothing to do and parks again: two context
//! switches per request for nothing (the 1-client profile in
//! `benches/README.md`). [`Repoll`] gives the task's future its own waker; a
//! wake that arrives while the future is being polled is answered by polling
//! it again in place, before the task returns, instead of going to tokio.
//!
//! Under load the yield spreads connections over the workers, and polling in
//! place costs more CPU per request there (benches/README.md), so a
//! self-wake is handed to tokio whenever more than [`IN_PLACE_MAX`]
//! requests are running on the port (`Running`).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use futures_util::task::AtomicWaker;

/// Most requests running on the port at which a self-woken connection is
/// polled again in place.
const IN_PLACE_MAX: usize = 1;

/// Most polls in place per poll of the task (hyper's own loop stops at 16).
const MAX_AGAIN: usize = 16;

/// Requests running on the HTTP port. Every connection's state holds a
/// clone (`conn::ConnState`) and counts each of its requests in and out;
/// every [`Repoll`] of the port reads it.
#[derive(Clone, Default)]
pub(crate) struct Running(Arc<AtomicUsize>);

impl Running {
    pub(super) fn begin(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn end(&self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }

    pub(super) fn low(&self) -> bool {
        self.0.load(Ordering::Relaxed) <= IN_PLACE_MAX
    }
}

/// The waker [`Repoll`] polls its future with. Woken from any thread.
struct SelfWaker {
    /// Set by [`Repoll::poll`] for the length of the inner poll.
    polling: AtomicBool,
    /// A wake arrived since the inner poll began.
    woken: AtomicBool,
    /// The task's own waker, registered at each poll of the task.
    task: AtomicWaker,
}

impl Wake for SelfWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        // SeqCst on both sides: either `Repoll::poll` reads `woken` set after
        // it cleared `polling`, or this reads `polling` cleared and wakes the
        // task (both may happen: one spurious poll).
        self.woken.store(true, Ordering::SeqCst);
        if !self.polling.load(Ordering::SeqCst) {
            self.task.wake();
        }
    }
}

/// `F`, polled again in place when it wakes itself during its poll and the
/// port is quiet (see the module doc).
pub(super) struct Repoll<F> {
    inner: Pin<Box<F>>,
    shared: Arc<SelfWaker>,
    waker: Waker,
    running: Running,
}

impl<F: Future> Repoll<F> {
    pub(super) fn new(inner: F, running: Running) -> Repoll<F> {
        let shared = Arc::new(SelfWaker {
            polling: AtomicBool::new(false),
            woken: AtomicBool::new(false),
            task: AtomicWaker::new(),
        });
        let waker = Waker::from(shared.clone());
        Repoll {
            inner: Box::pin(inner),
            shared,
            waker,
            running,
        }
    }
}

impl<F: Future> Future for Repoll<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = &mut *self;
        this.shared.task.register(cx.waker());
        let mut inner_cx = Context::from_waker(&this.waker);
        for _ in 0..MAX_AGAIN {
            this.shared.woken.store(false, Ordering::SeqCst);
            this.shared.polling.store(true, Ordering::SeqCst);
            let poll = this.inner.as_mut().poll(&mut inner_cx);
            this.shared.polling.store(false, Ordering::SeqCst);
            if poll.is_ready() {
                return poll;
            }
            if !this.shared.woken.load(Ordering::SeqCst) {
                return Poll::Pending;
            }
            if !this.running.low() {
                // Busy port: the wake goes to tokio, as without this wrapper.
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// Wakes itself `n` times during its polls, then is ready.
    struct SelfWaking {
        left: usize,
        polls: Arc<AtomicUsize>,
    }

    impl Future for SelfWaking {
        type Output = ();
        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            self.polls.fetch_add(1, Ordering::Relaxed);
            if self.left == 0 {
                return Poll::Ready(());
            }
            self.left -= 1;
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }

    /// Counts the wakes of the task that polls [`Repoll`].
    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn poll_once<F: Future>(f: &mut Pin<Box<Repoll<F>>>) -> (Poll<F::Output>, usize) {
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        let poll = f.as_mut().poll(&mut Context::from_waker(&waker));
        (poll, count.0.load(Ordering::Relaxed))
    }

    /// A future that wakes itself `left` times, in a [`Repoll`] on a port
    /// with `requests` running; and its count of polls.
    fn self_waking(left: usize, requests: usize) -> (Pin<Box<Repoll<SelfWaking>>>, Arc<AtomicUsize>) {
        let polls = Arc::new(AtomicUsize::new(0));
        let running = Running::default();
        (0..requests).for_each(|_| running.begin());
        let inner = SelfWaking {
            left,
            polls: polls.clone(),
        };
        (Box::pin(Repoll::new(inner, running)), polls)
    }

    #[test]
    fn a_self_wake_on_a_quiet_port_is_a_poll_in_place() {
        let (mut f, polls) = self_waking(3, 1);
        let (poll, wakes) = poll_once(&mut f);
        assert!(poll.is_ready());
        assert_eq!((polls.load(Ordering::Relaxed), wakes), (4, 0));
    }

    #[test]
    fn a_self_wake_on_a_busy_port_goes_to_the_task() {
        let (mut f, polls) = self_waking(1, 2);
        let (poll, wakes) = poll_once(&mut f);
        assert!(poll.is_pending());
        assert_eq!((polls.load(Ordering::Relaxed), wakes), (1, 1));
        let (poll, _) = poll_once(&mut f);
        assert!(poll.is_ready());
    }

    #[test]
    fn a_wake_after_the_poll_reaches_the_task() {
        /// Pending until its flag is set; keeps the last waker it was given.
        struct Later(Arc<std::sync::Mutex<Option<Waker>>>, Arc<AtomicBool>);
        impl Future for Later {
            type Output = ();
            fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
                if self.1.load(Ordering::SeqCst) {
                    return Poll::Ready(());
                }
                *self.0.lock().unwrap() = Some(cx.waker().clone());
                Poll::Pending
            }
        }
        let slot: Arc<std::sync::Mutex<Option<Waker>>> = Arc::default();
        let done = Arc::new(AtomicBool::new(false));
        let mut f = Box::pin(Repoll::new(Later(slot.clone(), done.clone()), Running::default()));
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        assert!(f.as_mut().poll(&mut Context::from_waker(&waker)).is_pending());
        done.store(true, Ordering::SeqCst);
        let inner_waker = slot.lock().unwrap().take().unwrap();
        std::thread::spawn(move || inner_waker.wake()).join().unwrap();
        assert_eq!(count.0.load(Ordering::Relaxed), 1);
        assert!(f.as_mut().poll(&mut Context::from_waker(&waker)).is_ready());
    }
}
