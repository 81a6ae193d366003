//! The pool with fake sessions: inline runs, the device hand-off, panics.

use super::*;

/// Records the name of the thread each run is on; sleeps `delay` per run.
struct Where(Arc<Mutex<Vec<String>>>, Duration);

impl Session for Where {
    fn run(&mut self, _: &[Tensor], _: &[String]) -> Result<Vec<Tensor>, RuntimeError> {
        let name = std::thread::current().name().unwrap_or("").to_string();
        self.0.lock().unwrap().push(name);
        std::thread::sleep(self.1);
        Ok(Vec::new())
    }
}

/// Records the thread of each run, then holds the run until the test
/// sends a message on the gate.
struct Gated(Arc<Mutex<Vec<String>>>, Mutex<std::sync::mpsc::Receiver<()>>);

impl Session for Gated {
    fn run(&mut self, _: &[Tensor], _: &[String]) -> Result<Vec<Tensor>, RuntimeError> {
        let name = std::thread::current().name().unwrap_or("").to_string();
        self.0.lock().unwrap().push(name);
        let _ = self.1.lock().unwrap().recv();
        Ok(Vec::new())
    }
}

/// Model `a` runs a batch that holds the device until `b`'s batch (on
/// `b_session`, whose last run took `b_last_ns`) waits for it; then `a`'s
/// run ends. Gives `a`, `b` and the outcome of `b`'s batch.
async fn b_waits_behind_a(
    b_session: Box<dyn Session>,
    b_last_ns: u64,
) -> (ModelWorkers, ModelWorkers, Result<(), RunError>) {
    let pool = Pool::new(PoolLimits { cpu: 1, gpu: 1 });
    let seen_a = Arc::new(Mutex::new(Vec::new()));
    let (gate, held) = std::sync::mpsc::channel();
    let a: Box<dyn Session> = Box::new(Gated(seen_a.clone(), Mutex::new(held)));
    let (a, _) = ModelWorkers::spawn("a", vec![(Device::Cpu, a)], &pool, Vec::new(), Vec::new());
    let (b, _) = ModelWorkers::spawn("b", vec![(Device::Cpu, b_session)], &pool, Vec::new(), Vec::new());
    b.last_run_ns.store(b_last_ns, Ordering::Relaxed);
    let later = Instant::now() + Duration::from_secs(10);
    let (a, b) = (Arc::new(a), Arc::new(b));
    // `a` runs and holds the device until the gate opens.
    let run_a = tokio::spawn({
        let a = a.clone();
        async move {
            a.run(Vec::new(), Vec::new(), (later, 0), false, None)
                .await
                .map(|_| ())
        }
    });
    while seen_a.lock().unwrap().is_empty() {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // `b`'s batch waits for the device.
    let run_b = tokio::spawn({
        let b = b.clone();
        async move {
            b.run(Vec::new(), Vec::new(), (later, 0), false, None)
                .await
                .map(|_| ())
        }
    });
    let device = pool.scheduler(Device::Cpu);
    while device.waiting() == 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    gate.send(()).unwrap();
    run_a.await.unwrap().unwrap();
    let ran_b = run_b.await.unwrap();
    let (Ok(a), Ok(b)) = (Arc::try_unwrap(a), Arc::try_unwrap(b)) else {
        panic!("the runs still hold the workers")
    };
    (a, b, ran_b)
}

/// A batch that waited for the device runs on the session thread that
/// freed it when its model is fast, and on its own session thread when not.
#[tokio::test]
async fn a_fast_models_waiting_batch_runs_on_the_thread_that_frees_the_device() {
    for (last_ns, want) in [
        (1_000, "sluice-s0-a"),
        (INLINE_RUN_LIMIT.as_nanos() as u64 * 2, "sluice-s0-b"),
    ] {
        let seen_b = Arc::new(Mutex::new(Vec::new()));
        let b: Box<dyn Session> = Box::new(Where(seen_b.clone(), Duration::ZERO));
        let (_a, _b, ran) = b_waits_behind_a(b, last_ns).await;
        ran.unwrap();
        assert_eq!(*seen_b.lock().unwrap(), [want], "last run {last_ns} ns");
    }
}

/// Panics in its run.
struct Panics;

impl Session for Panics {
    fn run(&mut self, _: &[Tensor], _: &[String]) -> Result<Vec<Tensor>, RuntimeError> {
        panic!("a session that panics (test)")
    }
}

/// A handed-over batch that panics fails alone, with the panic as its
/// error: the thread it ran on still serves its own model.
#[tokio::test]
async fn a_handed_over_batch_that_panics_leaves_the_thread_serving() {
    let (a, _b, ran) = b_waits_behind_a(Box::new(Panics), 1_000).await;
    assert!(
        matches!(&ran, Err(RunError::Runtime(RuntimeError::Panicked(m))) if m.contains("panics (test)")),
        "{ran:?}"
    );
    let later = Instant::now() + Duration::from_secs(10);
    // `a`'s gate has no sender left: its run returns at once.
    a.run(Vec::new(), Vec::new(), (later, 0), false, None)
        .await
        .unwrap();
}

fn workers(delay: Duration) -> (ModelWorkers, Arc<Mutex<Vec<String>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let pool = Pool::new(PoolLimits { cpu: 1, gpu: 1 });
    let session: Box<dyn Session> = Box::new(Where(seen.clone(), delay));
    let (w, _) = ModelWorkers::spawn("m", vec![(Device::Cpu, session)], &pool, Vec::new(), Vec::new());
    (w, seen)
}

#[tokio::test]
async fn a_lone_batch_of_a_fast_model_runs_inline_and_the_rest_on_the_session_thread() {
    let (w, seen) = workers(Duration::ZERO);
    let later = || Instant::now() + Duration::from_secs(10);
    let here = std::thread::current().name().unwrap_or("").to_string();
    // No run yet: the first goes to the session thread.
    w.run(Vec::new(), Vec::new(), (later(), 0), true, None)
        .await
        .unwrap();
    // How long a run takes depends on the machine: set it, so that the
    // model counts as fast whatever this one took.
    let fast = || w.last_run_ns.store(1_000, Ordering::Relaxed);
    fast();
    w.run(Vec::new(), Vec::new(), (later(), 0), false, None)
        .await
        .unwrap();
    // The session thread frees the session and the device before it
    // answers: the next batch need not wait for this one's caller.
    assert_eq!(w.groups[0].sessions.available_permits(), 1);
    fast();
    w.run(Vec::new(), Vec::new(), (later(), 0), true, None)
        .await
        .unwrap();
    let threads = seen.lock().unwrap().clone();
    assert!(
        threads[0].starts_with("sluice-s0") && threads[1].starts_with("sluice-s0"),
        "{threads:?}"
    );
    assert_eq!(threads[2], here, "{threads:?}");
    // Inline runs keep the session thread's checks.
    fast();
    let passed = w
        .run(Vec::new(), Vec::new(), (Instant::now(), 0), true, None)
        .await;
    assert!(matches!(passed, Err(RunError::Expired)), "{passed:?}");
}

#[tokio::test]
async fn a_slow_model_never_runs_inline() {
    let (w, seen) = workers(INLINE_RUN_LIMIT * 2);
    for _ in 0..3 {
        w.run(
            Vec::new(),
            Vec::new(),
            (Instant::now() + Duration::from_secs(10), 0),
            true,
            None,
        )
        .await
        .unwrap();
    }
    let threads = seen.lock().unwrap().clone();
    assert!(threads.iter().all(|t| t.starts_with("sluice-s0")), "{threads:?}");
    // Every run records its time: a sleep of twice the limit is never shorter.
    assert!(w.last_run_ns.load(Ordering::Relaxed) >= INLINE_RUN_LIMIT.as_nanos() as u64 * 2);
}

/// Records each `session_free` call: the thread, the run time, and whether
/// the batch's session permit was already back.
struct Freed(Arc<Semaphore>, Mutex<Vec<(String, Duration, usize)>>);

impl SessionFreed for Freed {
    fn session_free(&self, took: Duration) {
        let name = std::thread::current().name().unwrap_or("").to_string();
        self.1
            .lock()
            .unwrap()
            .push((name, took, self.0.available_permits()));
    }
}

#[tokio::test]
async fn the_session_is_reported_free_once_on_the_thread_that_ran_it_with_its_slot_released() {
    let delay = Duration::from_millis(2);
    let (w, _) = workers(delay);
    let freed = Arc::new(Freed(w.groups[0].sessions.clone(), Mutex::new(Vec::new())));
    let later = Instant::now() + Duration::from_secs(10);
    let (_, took) = w
        .run(Vec::new(), Vec::new(), (later, 0), false, Some(freed.clone()))
        .await
        .unwrap();
    let calls = freed.1.lock().unwrap().clone();
    assert_eq!(calls.len(), 1, "{calls:?}");
    let (thread, reported, permits) = &calls[0];
    assert!(thread.starts_with("sluice-s0"), "{calls:?}");
    assert_eq!((*reported, *permits), (took, 1));
    assert!(took >= delay);
    // A batch that is not run (its deadline passed) frees its session too, at zero.
    let passed = w
        .run(
            Vec::new(),
            Vec::new(),
            (Instant::now(), 0),
            false,
            Some(freed.clone()),
        )
        .await;
    assert!(matches!(passed, Err(RunError::Expired)), "{passed:?}");
    assert_eq!(freed.1.lock().unwrap()[1].1, Duration::ZERO);
}
