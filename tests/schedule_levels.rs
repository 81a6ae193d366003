//! Priority levels under a flood, in a file of its own: the test compares
//! two modes by how often a lower-level request is served in time, which
//! the 45 s overload runs of `schedule_policy.rs` would skew if they shared
//! the machine's two cores with it (cargo runs one file's tests at once).

mod common;

use common::batching::*;
use common::*;
use serde_json::json;

/// Statuses a level-2 client got, sending one-row requests one after
/// another with a 1 s timeout for `seconds`, while 4 clients keep the
/// slow model busy with level-1 requests (batches of one: every run
/// is theirs until the level-2 request is promoted).
async fn low_beside_high_flood(s: &TestServer, model: &str, seconds: f64) -> Vec<u16> {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let url = s.url(&format!("/v2/models/{model}/infer"));
    let stop = Arc::new(AtomicBool::new(false));
    let high: Vec<_> = (0..4)
        .map(|_| {
            let (client, url, stop) = (s.client.clone(), url.clone(), stop.clone());
            tokio::spawn(async move {
                let mut body = v2_body("x", &[vec![1.0, 2.0, 3.0, 4.0]]);
                body["parameters"] = json!({"priority": 1});
                while !stop.load(Ordering::Relaxed) {
                    let (status, _, answer) = post(&client, &url, &body).await;
                    assert_eq!(status, 200, "level 1: {answer}");
                }
            })
        })
        .collect();
    // The flood first: the batcher learns its rate and cost.
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    let mut low = Vec::new();
    let start = std::time::Instant::now();
    while start.elapsed().as_secs_f64() < seconds {
        let rows = vec![vec![7.0, 0.5, 1.0, 2.0]];
        let mut body = v2_body("x", &rows);
        body["parameters"] = json!({"priority": 2, "timeout": 1_000_000});
        let (status, _, answer) = post(&s.client, &url, &body).await;
        match status {
            200 => assert_eq!(flat_f64(&answer["outputs"][0]["data"]), doubled(&rows)),
            503 | 504 => {}
            other => panic!("level 2: {other} {answer}"),
        }
        low.push(status);
    }
    stop.store(true, Ordering::Relaxed);
    for t in high {
        t.await.unwrap();
    }
    low
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lower_level_beside_a_higher_flood_is_served_in_time_as_often_with_refusal_as_without() {
    let settings = |refuse: bool| {
        format!(
            r#"{{"max_batch_size": 1, "priority_levels": 2, "default_priority": 1, "refuse_predicted_late": {refuse}}}"#
        )
    };
    let r = repo(&[("slow", "on", &settings(true)), ("slow", "off", &settings(false))]);
    let s = TestServer::start(r.path()).await;
    let served = |st: &[u16]| st.iter().filter(|&&s| s == 200).count() as f64 / st.len().max(1) as f64;
    // Alternated in rounds, so that whatever else the machine does weighs
    // on both modes alike.
    let (mut on, mut off) = (Vec::new(), Vec::new());
    for _ in 0..4 {
        on.extend(low_beside_high_flood(&s, "on", 4.0).await);
        off.extend(low_beside_high_flood(&s, "off", 4.0).await);
    }
    let what = format!("level 2 with refusal on: {on:?}; off: {off:?}");
    // Promotion serves it in time without refusal; the prediction must
    // know that, not refuse what aging would serve.
    assert!(served(&off) >= 0.5, "{what}");
    assert!(served(&on) + 0.15 >= served(&off), "{what}");
    s.stop().await.unwrap();
}
