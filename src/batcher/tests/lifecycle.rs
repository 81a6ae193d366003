//! Batcher lifecycle and sharing tests: drain, retire, handoff to a new
//! version, and fairness between models on one device.

use super::*;

#[tokio::test]
async fn dropping_every_handle_answers_all_accepted_requests_then_stops() {
    let m = start(settings(BatchPolicyKind::Adaptive, 8, 1), Duration::ZERO);
    m.gate.close();
    let spawn = |id| {
        let b = m.batcher.clone();
        tokio::spawn(async move {
            let x = request(id, 1, 2);
            (x.clone(), infer(&b, x).await)
            // `b`, a handle, is dropped here.
        })
    };
    let mut tasks = vec![spawn(0)];
    until("the first request runs", || m.seen.started.load(SeqCst) == 1).await;
    tasks.extend((1..5).map(spawn));
    until("four requests wait", || m.batcher.queued() == 4).await;
    let Model { batcher, seen, gate } = m;
    drop(batcher);
    gate.open();
    for t in tasks {
        let (x, r) = t.await.unwrap();
        let (y, _) = r.expect("every accepted request is answered");
        assert_doubled(&x, &y, "request");
    }
    // With every handle gone the task exits, the workers drop, and the
    // session thread ends.
    until("the session thread exits", || seen.dropped.load(SeqCst)).await;
}

/// Two models on one device with one run slot: while model A has a long
/// backlog, model B's requests wait for at most about one of A's batches.
async fn quiet_model_is_not_starved(a_instances: usize) {
    let pool = Pool::new(PoolLimits { cpu: 1, gpu: 1 });
    let busy = start_on(
        &pool,
        "busy",
        settings(BatchPolicyKind::Adaptive, 1, 1),
        Duration::from_millis(20),
        a_instances,
    );
    let quiet = start_on(
        &pool,
        "quiet",
        settings(BatchPolicyKind::Adaptive, 8, 1),
        Duration::ZERO,
        1,
    );
    const BACKLOG: usize = 30;
    let done = Arc::new(AtomicUsize::new(0));
    let mut flood = Vec::new();
    for id in 0..BACKLOG {
        let (b, done) = (busy.batcher.clone(), done.clone());
        flood.push(tokio::spawn(async move {
            infer(&b, request(id, 1, 2)).await.unwrap();
            done.fetch_add(1, SeqCst);
        }));
    }
    until("the busy model runs", || busy.seen.started.load(SeqCst) >= 1).await;
    for id in 0..3 {
        infer(&quiet.batcher, request(id, 1, 2)).await.unwrap();
    }
    let busy_done = done.load(SeqCst);
    assert!(
        busy_done <= 10,
        "the quiet model waited for {busy_done} of the busy model's {BACKLOG} batches"
    );
    for t in flood {
        t.await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_model_does_not_starve_a_quiet_one_on_a_shared_device() {
    quiet_model_is_not_starved(1).await;
}

/// With two sessions, the busy model always has a batch waiting at the
/// device next to the quiet model's, with older requests in it: the device
/// queue must order batches by when they asked, not by their oldest request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_model_with_two_sessions_does_not_starve_a_quiet_one() {
    quiet_model_is_not_starved(2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retire_flushes_a_forming_batch_at_once() {
    // Fixed policy with a long max_batch_time: a lone request would wait 2 s.
    let m = start(settings(BatchPolicyKind::Fixed, 8, 2000), Duration::ZERO);
    let b = m.batcher.clone();
    let t0 = Instant::now();
    let pending = tokio::spawn(async move { infer(&b, request(7, 1, 2)).await });
    until("the request is queued", || m.batcher.queued() == 1).await;
    m.batcher.retire();
    let (y, _) = pending.await.unwrap().unwrap();
    assert_doubled(&request(7, 1, 2), &y, "retired");
    assert!(
        t0.elapsed() < Duration::from_millis(1000),
        "retire did not flush: {:?}",
        t0.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handoff_moves_queued_requests_to_the_successor() {
    let old = start(settings(BatchPolicyKind::Fixed, 8, 2000), Duration::ZERO);
    let new = start(settings(BatchPolicyKind::Adaptive, 8, 1), Duration::ZERO);
    let b = old.batcher.clone();
    let pending = tokio::spawn(async move { infer(&b, request(3, 2, 2)).await });
    until("the request is queued on the old version", || {
        old.batcher.queued() == 1
    })
    .await;
    old.batcher.handoff_to(new.batcher.clone());
    let (y, _) = pending.await.unwrap().unwrap();
    assert_doubled(&request(3, 2, 2), &y, "handed off");
    assert_eq!(
        old.seen.started.load(SeqCst),
        0,
        "the old version ran the request"
    );
    assert!(
        new.seen.started.load(SeqCst) >= 1,
        "the new version did not run it"
    );
    assert_eq!(old.batcher.queued(), 0);
    assert_eq!(new.batcher.queued(), 0);
}
