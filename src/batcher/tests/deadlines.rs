//! Deadlines at admission against the fake runtime: once the model's batch
//! cost is known, a request that the queue ahead would take past its
//! timeout is refused at once (503), and the ones admitted finish in time.

use super::*;

/// Floods a model of 20 ms runs, one row a batch, 210 ms timeout, with 30
/// requests at once, after three alone to learn the cost. Gives (answered,
/// refused at admission with how long each took to be refused, timed out).
async fn flood(refuse: bool) -> (usize, Vec<Duration>, usize) {
    let mut s = settings(BatchPolicyKind::Adaptive, 1, 0);
    s.timeout = Duration::from_millis(210);
    s.refuse_predicted_late = refuse;
    let m = start(s, Duration::from_millis(20));
    for id in 0..3 {
        infer(&m.batcher, request(id, 1, 2))
            .await
            .expect("alone, in time");
    }
    let tasks: Vec<_> = (10..40)
        .map(|id| {
            let b = m.batcher.clone();
            tokio::spawn(async move {
                let sent = Instant::now();
                (infer(&b, request(id, 1, 2)).await, sent.elapsed())
            })
        })
        .collect();
    let (mut ok, mut refused, mut late) = (0, Vec::new(), 0);
    for t in tasks {
        match t.await.unwrap() {
            (Ok(_), _) => ok += 1,
            (Err(Error::PredictedLate { retry_after, .. }), took) => {
                assert!(retry_after > Duration::ZERO);
                refused.push(took);
            }
            (Err(Error::DeadlineExceeded { .. }), _) => late += 1,
            (Err(e), _) => panic!("unexpected error: {e}"),
        }
    }
    (ok, refused, late)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_predicted_late_is_refused_at_once_and_the_admitted_finish_in_time() {
    // 30 runs of 20 ms one after another take 600 ms: about ten fit in 210 ms.
    let (ok, refused, late) = flood(true).await;
    assert_eq!(late, 0, "an admitted request timed out ({ok} answered)");
    assert!(ok >= 5, "only {ok} admitted");
    assert!(refused.len() >= 15, "only {} refused", refused.len());
    let slowest = refused.iter().max().unwrap();
    assert!(
        *slowest < Duration::from_millis(100),
        "a refusal took {slowest:?}: it must come at admission, not at the deadline"
    );
    // Without it, the same flood waits out its timeouts instead.
    let (_, refused, late) = flood(false).await;
    assert!(refused.is_empty());
    assert!(late >= 15, "only {late} timed out without early refusal");
}
