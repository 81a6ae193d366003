//! Batcher tests against a fake runtime (no ONNX Runtime): the real
//! [`Batcher`], batching task, [`ModelWorkers`] session threads and device
//! [`Pool`], with a [`FakeSession`] that answers `y = 2x`, records every
//! batch it sees, and can be held at a [`Gate`] or fail on a poisoned value.
//!
//! Time is real, not paused: the batcher reads `std::time::Instant` and the
//! sessions run on OS threads, so tokio's paused clock would neither move the
//! batcher's notion of "now" nor wait for the session threads (auto-advance
//! would fire the 60 s request timeouts while a session computes). Timing
//! assertions only check gaps of hundreds of milliseconds; ordering is
//! forced with the gate instead of sleeps wherever possible.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::{Batcher, Batching, Layout};
use crate::error::Error;
use crate::pool::{ModelWorkers, Pool, PoolLimits};
use crate::runtime::{Device, RuntimeError, Session};
use crate::settings::{BatchPolicyKind, BatchSettings};
use crate::tensor::{Signature, Tensor, TensorData};

/// A batch holding this value fails inside the fake session.
const POISON: f32 = -1.0;
/// A batch holding this value panics inside the fake session.
const PANIC: f32 = -2.0;

/// What a fake session saw; shared with the test.
#[derive(Default)]
struct Seen {
    /// Shape of `x` of each batch, in the order the runs started.
    shapes: Mutex<Vec<Vec<usize>>>,
    /// Every value of `x` the session was given.
    values: Mutex<Vec<f32>>,
    /// Runs started (counted before the gate).
    started: AtomicUsize,
    /// Set when the session is dropped, i.e. its thread has exited.
    dropped: AtomicBool,
}

impl Seen {
    fn batch_rows(&self) -> Vec<usize> {
        self.shapes.lock().unwrap().iter().map(|s| s[0]).collect()
    }

    fn values(&self) -> Vec<f32> {
        self.values.lock().unwrap().clone()
    }
}

/// Holds session runs while closed. The test opens and closes it; session
/// threads wait in `pass`.
#[derive(Default)]
struct Gate {
    closed: Mutex<bool>,
    cv: Condvar,
}

impl Gate {
    fn close(&self) {
        *self.closed.lock().unwrap() = true;
    }

    fn open(&self) {
        *self.closed.lock().unwrap() = false;
        self.cv.notify_all();
    }

    fn pass(&self) {
        let mut closed = self.closed.lock().unwrap();
        while *closed {
            closed = self.cv.wait(closed).unwrap();
        }
    }
}

/// `y = 2x` for an FP32 input `x`, after the gate and an optional delay.
struct FakeSession {
    seen: Arc<Seen>,
    gate: Arc<Gate>,
    delay: Duration,
}

impl Session for FakeSession {
    fn run(&mut self, inputs: &[Tensor], outputs: &[String]) -> Result<Vec<Tensor>, RuntimeError> {
        let x = &inputs[0];
        let TensorData::F32(v) = &x.data else {
            return Err(RuntimeError::InvalidInput("the fake session takes FP32".into()));
        };
        self.seen.shapes.lock().unwrap().push(x.shape.clone());
        self.seen.values.lock().unwrap().extend_from_slice(v);
        self.seen.started.fetch_add(1, SeqCst);
        self.gate.pass();
        std::thread::sleep(self.delay);
        // A batch that mixed trailing dims would not add up; say so instead of panicking.
        if v.len() != x.shape.iter().product::<usize>() {
            return Err(RuntimeError::InvalidInput(format!(
                "inconsistent batch: shape {:?} with {} values",
                x.shape,
                v.len()
            )));
        }
        if v.contains(&PANIC) {
            panic!("a fake session that panics (test)");
        }
        if v.contains(&POISON) {
            return Err(RuntimeError::Unsupported("poisoned row".into()));
        }
        let y = Tensor::new(
            "y",
            x.shape.clone(),
            TensorData::F32(v.iter().map(|a| a * 2.0).collect()),
        )
        .expect("same shape");
        Ok(outputs.iter().map(|_| y.clone()).collect())
    }
}

impl Drop for FakeSession {
    fn drop(&mut self) {
        self.seen.dropped.store(true, SeqCst);
    }
}

/// One model's batcher over one fake session.
struct Model {
    batcher: Batcher,
    seen: Arc<Seen>,
    gate: Arc<Gate>,
}

fn settings(policy: BatchPolicyKind, max_batch_size: usize, max_batch_time_ms: u64) -> BatchSettings {
    BatchSettings {
        max_batch_size,
        max_batch_time: Duration::from_millis(max_batch_time_ms),
        policy,
        max_queue_size: 1024,
        timeout: Duration::from_secs(60),
        max_batch_tokens: None,
        max_padding_ratio: None,
        priority_levels: 0,
        default_priority: 0,
        refuse_predicted_late: true,
    }
}

fn start(settings: BatchSettings, delay: Duration) -> Model {
    start_on(&Pool::new(PoolLimits { cpu: 1, gpu: 1 }), "m", settings, delay, 1)
}

/// A model with `instances` fake sessions on the CPU device of `pool`.
fn start_on(pool: &Pool, name: &str, settings: BatchSettings, delay: Duration, instances: usize) -> Model {
    let (seen, gate) = (Arc::new(Seen::default()), Arc::new(Gate::default()));
    let sessions = (0..instances)
        .map(|_| {
            let s = FakeSession {
                seen: seen.clone(),
                gate: gate.clone(),
                delay,
            };
            (Device::Cpu, Box::new(s) as Box<dyn Session>)
        })
        .collect();
    let outputs = vec!["y".to_string()];
    let (workers, _warmed) = ModelWorkers::spawn(name, sessions, pool, Vec::new(), outputs.clone());
    let batching = Batching::new(name, &Signature::default(), Ok(Layout::plain(1, 1)));
    let batcher = Batcher::spawn(name, None, settings, Arc::new(workers), outputs, None, batching);
    Model { batcher, seen, gate }
}

/// Request `id`: `rows` x `width` values `id * 1000 + k`, unique across requests.
fn request(id: usize, rows: usize, width: usize) -> Tensor {
    let data = (0..rows * width).map(|k| (id * 1000 + k) as f32).collect();
    Tensor::new("x", vec![rows, width], TensorData::F32(data)).unwrap()
}

/// Submits `x` now and returns `y` and the batch id.
async fn infer(b: &Batcher, x: Tensor) -> Result<(Tensor, String), Error> {
    let (mut out, id) = b
        .submit(
            vec![x],
            Some(&["y".to_string()]),
            Instant::now(),
            Default::default(),
        )
        .await?;
    assert_eq!(out.len(), 1, "one output asked for");
    Ok((out.pop().unwrap(), id.id.to_string()))
}

/// `y` must be exactly `2x`, same shape.
fn assert_doubled(x: &Tensor, y: &Tensor, what: &str) {
    let (TensorData::F32(xv), TensorData::F32(yv)) = (&x.data, &y.data) else {
        panic!("{what}: not FP32");
    };
    assert_eq!(y.shape, x.shape, "{what}: shape");
    let want: Vec<f32> = xv.iter().map(|a| a * 2.0).collect();
    assert_eq!(yv, &want, "{what}: got another request's rows or wrong order");
}

/// Waits (real time, up to 5 s) until `cond` holds.
async fn until(what: &str, cond: impl Fn() -> bool) {
    let t0 = Instant::now();
    while !cond() {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "timed out waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Deterministic pseudo-random numbers (no `rand` dependency).
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

fn sorted(mut v: Vec<f32>) -> Vec<f32> {
    v.sort_by(f32::total_cmp);
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_each_get_their_own_rows() {
    let m = start(
        settings(BatchPolicyKind::Adaptive, 16, 2),
        Duration::from_millis(1),
    );
    let mut rng = Lcg(7);
    let mut tasks = Vec::new();
    let mut sent = Vec::new();
    for id in 0..300 {
        let x = request(id, 1 + rng.below(7) as usize, 3);
        let TensorData::F32(v) = &x.data else {
            unreachable!()
        };
        sent.extend_from_slice(v);
        let b = m.batcher.clone();
        tasks.push(tokio::spawn(async move {
            let r = infer(&b, x.clone()).await;
            (x, r)
        }));
    }
    for t in tasks {
        let (x, r) = t.await.unwrap();
        let (y, _) = r.expect("every request succeeds");
        assert_doubled(&x, &y, "request");
    }
    let rows = m.seen.batch_rows();
    assert!(
        rows.iter().all(|&r| r <= 16),
        "a batch exceeded max_batch_size: {rows:?}"
    );
    assert!(rows.len() < 300, "no request was batched with another: {rows:?}");
    assert_eq!(
        sorted(m.seen.values()),
        sorted(sent),
        "every row runs exactly once"
    );
}

#[tokio::test]
async fn requests_with_different_trailing_dims_never_share_a_batch() {
    let m = start(settings(BatchPolicyKind::Fixed, 16, 30), Duration::ZERO);
    let mut tasks = Vec::new();
    for id in 0..20 {
        let width = if id % 2 == 0 { 3 } else { 5 };
        let x = request(id, 1 + id % 3, width);
        let b = m.batcher.clone();
        tasks.push(tokio::spawn(async move { (x.clone(), infer(&b, x).await) }));
    }
    let mut widths_by_batch: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for t in tasks {
        let (x, r) = t.await.unwrap();
        let (y, batch) = r.expect("every request succeeds");
        assert_doubled(&x, &y, "request");
        widths_by_batch.entry(batch).or_default().push(x.shape[1]);
    }
    for (batch, widths) in &widths_by_batch {
        let distinct: BTreeSet<_> = widths.iter().collect();
        assert_eq!(distinct.len(), 1, "batch {batch} mixed widths {widths:?}");
    }
    assert!(
        widths_by_batch.values().any(|w| w.len() > 1),
        "requests of equal width should have shared a batch: {widths_by_batch:?}"
    );
    for shape in m.seen.shapes.lock().unwrap().iter() {
        assert!(shape[1] == 3 || shape[1] == 5, "batch of shape {shape:?}");
    }
}

#[tokio::test]
async fn a_full_queue_refuses_with_overloaded() {
    let mut s = settings(BatchPolicyKind::Adaptive, 4, 1);
    s.max_queue_size = 2;
    let m = start(s, Duration::ZERO);
    m.gate.close();
    let spawn = |id| {
        let b = m.batcher.clone();
        tokio::spawn(async move { infer(&b, request(id, 1, 2)).await })
    };
    // The first request leaves the queue when it runs (held at the gate)...
    let running = spawn(1);
    until("the first request runs", || m.seen.started.load(SeqCst) == 1).await;
    until("it left the queue", || m.batcher.queued() == 0).await;
    // ... two more fill the queue, and the next one is refused at once.
    let queued = [spawn(2), spawn(3)];
    until("two requests wait", || m.batcher.queued() == 2).await;
    match infer(&m.batcher, request(4, 1, 2)).await {
        Err(Error::Overloaded {
            model,
            max_queue_size,
            retry_after,
        }) => {
            assert_eq!((model.as_str(), max_queue_size), ("m", 2));
            assert!(retry_after >= Duration::from_secs(1), "{retry_after:?}");
        }
        other => panic!("expected Overloaded, got {other:?}"),
    }
    m.gate.open();
    running.await.unwrap().expect("running request answered");
    for q in queued {
        q.await.unwrap().expect("queued requests answered");
    }
    assert!(
        !m.seen.values().contains(&4000.0),
        "the refused request never ran"
    );
    // Room again once the queue drained.
    infer(&m.batcher, request(5, 1, 2)).await.expect("admitted again");
}

/// Adaptive keeps the expired request in its queue (dropped there); fixed
/// forms it ahead into a batch that then waits for the session (skipped by
/// the session thread). Either way it is answered 504 and never run.
#[tokio::test]
async fn a_request_whose_deadline_passes_while_queued_is_answered_504_and_never_run() {
    for policy in [BatchPolicyKind::Adaptive, BatchPolicyKind::Fixed] {
        let mut s = settings(policy, 4, 1);
        s.timeout = Duration::from_millis(100);
        let m = start(s, Duration::ZERO);
        m.gate.close();
        let b = m.batcher.clone();
        let first = tokio::spawn(async move { infer(&b, request(1, 1, 2)).await });
        until("the first request runs", || m.seen.started.load(SeqCst) == 1).await;
        let started = Instant::now();
        let late = infer(&m.batcher, request(2, 1, 2)).await;
        match late {
            Err(Error::DeadlineExceeded { model, timeout }) => {
                assert_eq!((model.as_str(), timeout), ("m", Duration::from_millis(100)));
            }
            other => panic!("{policy:?}: expected DeadlineExceeded, got {other:?}"),
        }
        assert!(started.elapsed() < Duration::from_secs(2), "the 504 came late");
        // Answered 504, it no longer counts against max_queue_size, even
        // while the batch ahead of it still runs.
        until("the expired request left the queue", || m.batcher.queued() == 0).await;
        m.gate.open();
        // The first request ran, but after its own deadline: also a 504.
        assert!(matches!(
            first.await.unwrap(),
            Err(Error::DeadlineExceeded { .. })
        ));
        // A later request runs after the expired one was dealt with.
        let (y, _) = infer(&m.batcher, request(3, 1, 2))
            .await
            .expect("later request runs");
        assert_doubled(&request(3, 1, 2), &y, "later request");
        let values = m.seen.values();
        assert!(
            !values.contains(&2000.0) && !values.contains(&2001.0),
            "{policy:?}: the expired request reached the session: {values:?}"
        );
        assert_eq!(m.seen.batch_rows(), vec![1, 1], "{policy:?}");
    }
}

#[tokio::test]
async fn a_request_whose_client_left_is_not_run() {
    let m = start(settings(BatchPolicyKind::Adaptive, 4, 1), Duration::ZERO);
    m.gate.close();
    let b = m.batcher.clone();
    let first = tokio::spawn(async move { infer(&b, request(1, 1, 2)).await });
    until("the first request runs", || m.seen.started.load(SeqCst) == 1).await;
    let b = m.batcher.clone();
    let gone = tokio::spawn(async move { infer(&b, request(2, 1, 2)).await });
    until("the second request waits", || m.batcher.queued() == 1).await;
    gone.abort();
    assert!(gone.await.unwrap_err().is_cancelled());
    m.gate.open();
    first.await.unwrap().expect("first request answered");
    infer(&m.batcher, request(3, 1, 2))
        .await
        .expect("later request runs");
    assert!(!m.seen.values().contains(&2000.0), "the abandoned request ran");
    assert_eq!(m.batcher.queued(), 0, "the abandoned request left the queue");
}

#[tokio::test]
async fn adaptive_runs_a_lone_request_at_once_while_fixed_waits_max_batch_time() {
    let wait = Duration::from_millis(500);
    let adaptive = start(settings(BatchPolicyKind::Adaptive, 8, 500), Duration::ZERO);
    let fixed = start(settings(BatchPolicyKind::Fixed, 8, 500), Duration::ZERO);
    for (m, name) in [(&adaptive, "adaptive"), (&fixed, "fixed")] {
        let t0 = Instant::now();
        let (y, _) = infer(&m.batcher, request(1, 1, 2)).await.unwrap();
        let took = t0.elapsed();
        assert_doubled(&request(1, 1, 2), &y, name);
        if name == "adaptive" {
            assert!(took < wait / 2, "adaptive waited {took:?} for a lone request");
        } else {
            assert!(
                took >= wait,
                "fixed answered after {took:?}, before max_batch_time"
            );
        }
    }
}

#[tokio::test]
async fn update_applies_new_settings_to_the_running_batcher() {
    let m = start(settings(BatchPolicyKind::Fixed, 16, 10_000), Duration::ZERO);
    let spawn_all = |ids: std::ops::Range<usize>| {
        ids.map(|id| {
            let b = m.batcher.clone();
            tokio::spawn(async move { infer(&b, request(id, 1, 2)).await })
        })
        .collect::<Vec<_>>()
    };
    // Four requests wait for a batch of 16 or for 10 s...
    let waiting = spawn_all(0..4);
    until("four requests wait", || m.batcher.queued() == 4).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(waiting.iter().all(|t| !t.is_finished()));
    // ... until max_batch_size drops to 4: the forming batch is full now.
    let mut s = m.batcher.settings();
    s.max_batch_size = 4;
    m.batcher.update(s);
    assert_eq!(m.batcher.settings().max_batch_size, 4);
    for t in waiting {
        tokio::time::timeout(Duration::from_secs(2), t)
            .await
            .expect("the new max_batch_size applied to the waiting batch")
            .unwrap()
            .unwrap();
    }
    assert_eq!(m.seen.batch_rows(), vec![4]);

    // And a smaller max_batch_size bounds the next batches.
    s.max_batch_size = 2;
    m.batcher.update(s);
    for t in spawn_all(10..16) {
        tokio::time::timeout(Duration::from_secs(2), t)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
    }
    assert_eq!(m.seen.batch_rows()[1..], [2, 2, 2]);
}

/// Every waiting `submit` borrows a handle, so the task sees its channel
/// close only after the last of them; what this shows is that handles going
/// away while requests wait lose none of them, and that the task, its
/// workers and the session thread then stop.

#[tokio::test]
async fn a_batch_that_fails_is_retried_request_by_request_so_one_bad_request_fails_alone() {
    let m = start(settings(BatchPolicyKind::Fixed, 6, 1_000), Duration::ZERO);
    let mut tasks = Vec::new();
    for id in 0..6 {
        let mut x = request(id, 1, 2);
        if id == 3 {
            x.data = TensorData::F32(vec![POISON, 1.0]);
        }
        let b = m.batcher.clone();
        tasks.push(tokio::spawn(async move { (x.clone(), infer(&b, x).await) }));
    }
    let mut batch_ids = BTreeSet::new();
    for (id, t) in tasks.into_iter().enumerate() {
        let (x, r) = t.await.unwrap();
        if id == 3 {
            match r {
                Err(Error::Runtime { model, message }) => {
                    assert_eq!(model, "m");
                    assert!(message.contains("poisoned row"), "{message}");
                }
                other => panic!("the bad request should fail with a runtime error: {other:?}"),
            }
        } else {
            let (y, batch) = r.expect("good requests succeed despite the bad one");
            assert_doubled(&x, &y, "good request");
            batch_ids.insert(batch);
        }
    }
    // One batch of six failed, then each request ran alone.
    assert_eq!(m.seen.batch_rows(), vec![6, 1, 1, 1, 1, 1, 1]);
    assert_eq!(batch_ids.len(), 5, "each retry is its own batch");
}

mod chunks;
mod deadlines;
mod lifecycle;
mod padded;

/// A batch that panics (inline on an async worker, or on its session
/// thread) fails its own requests only; the batching task goes on and the
/// batch no longer counts as in flight, so the next request is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_that_panics_fails_alone_and_the_model_keeps_serving() {
    let m = start(settings(BatchPolicyKind::Adaptive, 8, 1), Duration::ZERO);
    let x = request(1, 1, 4);
    let (y, _) = infer(&m.batcher, x.clone()).await.expect("a first request");
    assert_doubled(&x, &y, "before the panic");
    let bad = Tensor::new("x", vec![1, 2], TensorData::F32(vec![PANIC, 1.0])).unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(5), infer(&m.batcher, bad)).await;
    assert!(
        matches!(&answer, Ok(Err(e)) if e.to_string().contains("panicked")),
        "the panicking request gets the panic as its error, at once: {answer:?}"
    );
    for id in 2..6 {
        let x = request(id, 1, 4);
        let (y, _) = tokio::time::timeout(Duration::from_secs(5), infer(&m.batcher, x.clone()))
            .await
            .expect("answered after the panic (not stuck)")
            .expect("a request after the panic");
        assert_doubled(&x, &y, "after the panic");
    }
}
