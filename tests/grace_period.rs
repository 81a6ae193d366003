//! Shutdown (SPEC §11): when the grace period ends with batches still running
//! inside ONNX Runtime, they are cancelled and waited for, and the process
//! exits 0 without a runtime error. Before, the process exited under the
//! running session, and ONNX Runtime logged `ERROR ort::logging: Non-zero
//! status code returned while running ReduceMean node` as it was torn down.

mod common;
use common::process::*;
use common::prometheus::parse;
use common::*;

use std::time::{Duration, Instant};

use serde_json::json;

/// Waits (at most 30 s) until `sluice_queue_size{model}` is at least `n`.
async fn wait_queued(client: &reqwest::Client, port: u16, model: &str, n: f64) {
    let t0 = Instant::now();
    loop {
        let text = client
            .get(format!("http://127.0.0.1:{port}/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let queued: f64 = parse(&text)
            .iter()
            .filter(|s| {
                s.name == "sluice_queue_size" && s.labels.get("model").map(String::as_str) == Some(model)
            })
            .map(|s| s.value)
            .sum();
        if queued >= n {
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "`{model}`: fewer than {n} requests queued after 30 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn batches_running_when_the_grace_period_ends_are_cancelled_and_the_exit_is_clean() {
    // `slow`: every batch does ~80 ms of matrix products, whatever its size.
    let repo = repo_with(&["slow"]);
    let settings = repo.path().join("slow/model-settings.json");
    std::fs::write(&settings, r#"{"max_batch_size": 1, "instances": 1}"#).unwrap();
    let mut cmd = sluice();
    // Grace period 0: the batches running at SIGTERM are past it at once.
    cmd.env("SLUICE_SHUTDOWN__GRACE_PERIOD_SECONDS", "0");
    let args = ["--model-repository".as_ref(), repo.path().as_os_str()];
    let (mut child, mut log, port) = spawn_serve(cmd, &args);
    let client = reqwest::Client::new();
    wait_ready(&client, port).await;

    // Clients that keep the one session busy, batch after batch.
    let url = format!("http://127.0.0.1:{port}/v2/models/slow/infer");
    let body = json!({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]});
    let senders: Vec<_> = (0..6)
        .map(|_| {
            let (client, url, body) = (client.clone(), url.clone(), body.clone());
            tokio::spawn(async move {
                // Ends when the server goes away.
                while client.post(&url).json(&body).send().await.is_ok() {}
            })
        })
        .collect();
    // Observable: requests wait in the queue, so a batch runs while they do.
    wait_queued(&client, port, "slow", 2.0).await;

    sigterm(&child);
    let status = wait_for(&mut child, Duration::from_secs(30));
    let lines = log.rest(Duration::from_secs(10)).join("\n");
    assert_eq!(status.code(), Some(0), "{lines}");
    assert!(
        lines.contains("requests still open after the grace period"),
        "{lines}"
    );
    assert!(lines.contains("sluice stopped"), "{lines}");
    // No error logged, no panic. (ONNX Runtime's per-run messages are off:
    // a failed run comes back to sluice as an error, which it logs itself;
    // its session-level messages still reach the log.)
    assert!(
        !lines
            .lines()
            .any(|l| l.contains("ERROR") || l.contains("panicked")),
        "{lines}"
    );
    // A run in progress was cancelled and waited for. (The session is busy
    // all but the microseconds between two batches, so it almost always is;
    // when it was not, there is nothing to cancel and nothing to check.)
    if lines.contains("cancelling the batches still running") {
        assert!(lines.contains("the cancelled batches stopped"), "{lines}");
    } else {
        eprintln!("note: no batch was running at the end of the grace period");
    }
    for s in senders {
        s.await.unwrap();
    }
}

#[tokio::test]
async fn a_batch_waiting_to_fill_runs_at_once_when_shutdown_begins() {
    // A `fixed` batch of 8 that waits up to 50 s to fill: one request would
    // wait all that time (past the default grace period of 30 s) before.
    let repo = repo_with(&["digits"]);
    std::fs::write(
        repo.path().join("digits/model-settings.json"),
        r#"{"max_batch_size": 8, "max_batch_time": 50, "batch_policy": "fixed"}"#,
    )
    .unwrap();
    let args = ["--model-repository".as_ref(), repo.path().as_os_str()];
    let (mut child, mut log, port) = spawn_serve(sluice(), &args);
    let client = reqwest::Client::new();
    wait_ready(&client, port).await;
    let exp: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("tests/fixtures/digits_expected.json")).unwrap(),
    )
    .unwrap();
    let body = json!({"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [exp["inputs"][5]]}]});
    let url = format!("http://127.0.0.1:{port}/v2/models/digits/infer");
    let request = tokio::spawn({
        let client = client.clone();
        async move { client.post(&url).json(&body).send().await.unwrap() }
    });
    // Observable: the request waits in the queue for its batch to fill.
    wait_queued(&client, port, "digits", 1.0).await;
    drop(client);
    let killed = Instant::now();
    sigterm(&child);
    let answer = request.await.unwrap();
    // Far below the 50 s the batch would have waited.
    assert!(
        killed.elapsed() < Duration::from_secs(20),
        "answered after {:?}",
        killed.elapsed()
    );
    assert_eq!(answer.status(), 200);
    let r: serde_json::Value = answer.json().await.unwrap();
    assert_eq!(v2_output(&r, "label")["data"], json!([exp["labels"][5]]), "{r}");
    let status = wait_for(&mut child, Duration::from_secs(30));
    let lines = log.rest(Duration::from_secs(10)).join("\n");
    assert_eq!(status.code(), Some(0), "{lines}");
    assert!(!lines.contains("after the grace period"), "{lines}");
}
