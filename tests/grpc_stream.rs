//! `ModelStreamInfer` against a real server: a client that sends many large
//! requests and does not read the answers makes the server stop reading
//! after `grpc.max_outstanding_per_stream` of them (it used to take every
//! message and hold every answer: 1,500 × 1 MiB held 1.6 GB); once the
//! client reads, every answer arrives, right and in full.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::grpc::{client, infer_request};
use common::*;
use tokio_stream::StreamExt;

/// Values of request `i`: 65,536 floats (256 KiB), unique per request.
fn values(i: usize) -> Vec<f32> {
    (0..65_536).map(|k| (i * 7 + k % 1000) as f32).collect()
}

/// Waits until `taken` (messages the client library took to send) has not
/// moved for 2 s (60 s at most), and returns it.
async fn until_still(taken: &AtomicUsize) -> usize {
    let (mut last, mut still_since, t0) = (0, Instant::now(), Instant::now());
    while still_since.elapsed() < Duration::from_secs(2) && t0.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = taken.load(Ordering::SeqCst);
        if now != last {
            (last, still_since) = (now, Instant::now());
        }
    }
    taken.load(Ordering::SeqCst)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unread_stream_is_held_to_its_outstanding_bound_then_answers_everything() {
    const SENT: usize = 120;
    const OUTSTANDING: usize = 4;
    let repo = repo_with(&["varlen"]);
    let s = TestServer::start_with(repo.path(), |c| c.grpc.max_outstanding_per_stream = OUTSTANDING).await;
    let mut grpc = client(&s).await;
    // Counts the messages the client library has taken to send.
    let taken = Arc::new(AtomicUsize::new(0));
    let counter = taken.clone();
    let requests = tokio_stream::iter(0..SENT).map(move |i| {
        counter.fetch_add(1, Ordering::SeqCst);
        let mut r = infer_request("varlen", "x", &[1, 65_536], &values(i));
        r.id = i.to_string();
        r
    });
    let mut answers = grpc.model_stream_infer(requests).await.unwrap().into_inner();

    // Not reading: wait until the client stops making progress.
    let held = until_still(&taken).await;
    // Outstanding requests, the answer channel (as many again), one answer in
    // the encoder and what the HTTP/2 windows and buffers hold on both sides.
    assert!(
        held <= 4 * OUTSTANDING + 8,
        "the server took {held} of {SENT} messages from a client that reads nothing"
    );

    // Reading now: every answer comes, each with its own id and y = 2x.
    let mut seen = [false; SENT];
    while let Some(a) = answers.next().await {
        let a = a.unwrap();
        assert_eq!(a.error_message, "");
        let r = a.infer_response.unwrap();
        let i: usize = r.id.parse().unwrap();
        let want: Vec<u8> = values(i).iter().flat_map(|x| (x * 2.0).to_le_bytes()).collect();
        assert_eq!(r.raw_output_contents[0].as_ref(), want.as_slice(), "answer {i}");
        assert!(!std::mem::replace(&mut seen[i], true), "answer {i} twice");
        if seen.iter().all(|s| *s) {
            break;
        }
    }
    assert!(seen.iter().all(|s| *s), "missing answers");
    s.stop().await.unwrap();
}

/// One connection's unread stream holds at most `grpc.max_connection_bytes`
/// (an eighth of the byte budget by default): other clients are answered
/// while it is stuck. Before, the default 64 outstanding requests and their
/// answers took the whole budget and every other client got UNAVAILABLE.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unread_stream_holds_only_its_connections_share_of_the_byte_budget() {
    const SENT: usize = 200;
    let repo = repo_with(&["varlen"]);
    // 256 KiB requests and answers: 64 of each would hold the budget twice over.
    let s = TestServer::start_with(repo.path(), |c| c.http.max_inflight_bytes = 16 << 20).await;
    let mut stuck = client(&s).await;
    let taken = Arc::new(AtomicUsize::new(0));
    let counter = taken.clone();
    let requests = tokio_stream::iter(0..SENT).map(move |i| {
        counter.fetch_add(1, Ordering::SeqCst);
        let mut r = infer_request("varlen", "x", &[1, 65_536], &values(i));
        r.id = i.to_string();
        r
    });
    let mut answers = stuck.model_stream_infer(requests).await.unwrap().into_inner();
    until_still(&taken).await;
    // Other clients, on their own connections, on both ports.
    let mut other = client(&s).await;
    for i in 0..20 {
        let r = infer_request("varlen", "x", &[1, 65_536], &values(i));
        let a = other.model_infer(r).await;
        assert!(
            a.is_ok(),
            "gRPC request {i} beside the unread stream: {:?}",
            a.err()
        );
    }
    let body =
        serde_json::json!({"inputs": [v2_input("x", "FP32", &[1, 65_536], serde_json::json!(values(1)))]});
    for i in 0..20 {
        let (status, answer) = s.post("/v2/models/varlen/infer", &body).await;
        assert_eq!(status, 200, "HTTP request {i} beside the unread stream: {answer}");
    }
    // The stuck client reads: every answer comes.
    let mut got = 0;
    while let Some(a) = answers.next().await {
        assert_eq!(a.unwrap().error_message, "");
        got += 1;
        if got == SENT {
            break;
        }
    }
    assert_eq!(got, SENT);
    s.stop().await.unwrap();
}
