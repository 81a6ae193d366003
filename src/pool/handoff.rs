//! A batch whose device slot a session thread frees runs on that thread,
//! when its model is fast: the thread that ends a run takes the next waiting
//! batch, often another model's, instead of waking that model's session
//! thread and going to sleep. Over many models whose batches each hold one
//! request, a wake-up and a sleep per batch was most of the cost of a
//! batch.
//!
//! The hand-off is a slot per thread: a session thread's job, dropped after
//! its run, releases the device slot; the scheduler calls the next waiting
//! batch's start on that thread, which [`offer`]s its job here; the session
//! thread [`take`]s it and runs it on a free session of that model.

use std::cell::{Cell, RefCell};

use super::Job;

thread_local! {
    /// True on session threads, the only ones that take handed-off jobs.
    static TAKER: Cell<bool> = const { Cell::new(false) };
    /// The job handed to this thread, run once its current one is dropped.
    static NEXT: RefCell<Option<Job>> = const { RefCell::new(None) };
}

/// Marks this thread as a session thread.
pub(super) fn become_taker() {
    TAKER.with(|t| t.set(true));
}

/// Hands `job` to this thread, when it is a session thread with no job
/// handed to it yet; else gives it back, to be sent to its own session thread.
/// (The job comes back by value: it is moved once per batch, and boxing it
/// would allocate once per batch instead.)
#[allow(clippy::result_large_err)]
pub(super) fn offer(job: Job) -> Result<(), Job> {
    if !TAKER.with(Cell::get) {
        return Err(job);
    }
    NEXT.with(|next| {
        let mut next = next.borrow_mut();
        match *next {
            Some(_) => Err(job),
            None => {
                *next = Some(job);
                Ok(())
            }
        }
    })
}

/// The job handed to this thread, if any.
pub(super) fn take() -> Option<Job> {
    NEXT.with(|next| next.borrow_mut().take())
}
