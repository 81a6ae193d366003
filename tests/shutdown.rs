//! Shutdown (SPEC §4, §11): from the moment it begins,
//! the HTTP port keeps answering: readiness 503, liveness 200, new inference
//! 503 with a JSON error, while the requests accepted before are answered;
//! then the server exits. Nothing here depends on timing: the request that
//! holds the drain open waits for its body, which the test sends last.

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Generous: a busy 2-core machine may be slow, never wrong.
const LIMIT: Duration = Duration::from_secs(60);

/// Sends the head of `POST path` with `Expect: 100-continue` and waits for
/// the `100 Continue` that hyper sends once the handler reads the body: the
/// request has surely been accepted.
async fn request_waiting_for_its_body(s: &TestServer, path: &str, len: usize) -> TcpStream {
    let mut conn = TcpStream::connect(s.addr).await.unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: sluice\r\nContent-Type: application/json\r\n\
         Content-Length: {len}\r\nExpect: 100-continue\r\n\r\n"
    );
    conn.write_all(head.as_bytes()).await.unwrap();
    let mut line = [0u8; 25];
    tokio::time::timeout(LIMIT, conn.read_exact(&mut line))
        .await
        .expect("no 100 Continue")
        .unwrap();
    assert_eq!(&line, b"HTTP/1.1 100 Continue\r\n\r\n");
    conn
}

/// Polls `GET path` until it answers `want`; panics after [`LIMIT`].
async fn poll_until(s: &TestServer, path: &str, want: u16) {
    let t0 = Instant::now();
    loop {
        let got = s
            .client
            .get(s.url(path))
            .send()
            .await
            .map(|r| r.status().as_u16());
        if got.as_ref().is_ok_and(|st| *st == want) {
            return;
        }
        assert!(t0.elapsed() < LIMIT, "GET {path}: want {want}, got {got:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn while_draining_the_port_answers_probes_and_refuses_new_inference() {
    let repo = repo_with(&["digits"]);
    // A grace period far beyond the test: only the drain can end the server.
    let mut s = TestServer::start_with(repo.path(), |c| c.shutdown.grace_period_seconds = 600.0).await;
    let exp = fixture("digits_expected.json");
    let body = json!({"inputs": [v2_input("input", "FP32", &[1, 64], json!([exp["inputs"][5]]))]});
    let body = serde_json::to_vec(&body).unwrap();
    let mut accepted = request_waiting_for_its_body(&s, "/v2/models/digits/infer", body.len()).await;
    accepted.write_all(&body[..body.len() / 2]).await.unwrap();

    s.begin_stop();
    poll_until(&s, "/v2/health/ready", 503).await;
    assert_eq!(s.get_raw("/v2/health/live").await, (200, String::new()));
    let (st, r) = s.post_raw("/v2/models/digits/infer", body.clone()).await;
    assert_eq!(st, 503, "{r}");
    assert_eq!(error_message(&r), "server is shutting down");
    let v1 = json!({"instances": [exp["inputs"][5]]});
    let (st, r) = s.post("/v1/models/digits:predict", &v1).await;
    assert_eq!(st, 503, "{r}");
    assert_eq!(error_message(&r), "server is shutting down");
    // The accepted request holds the drain open.
    assert!(!s.has_exited());

    accepted.write_all(&body[body.len() / 2..]).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(LIMIT, accepted.read_to_end(&mut answer))
        .await
        .expect("the accepted request was not answered")
        .unwrap();
    let answer = String::from_utf8(answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    // Its connection is closed after the answer, as the drain asks.
    assert!(
        answer.to_ascii_lowercase().contains("connection: close"),
        "{answer}"
    );
    let (_, json_body) = answer.split_once("\r\n\r\n").unwrap();
    let r: serde_json::Value = serde_json::from_str(json_body).unwrap();
    assert_eq!(v2_output(&r, "label")["data"], json!([exp["labels"][5]]), "{r}");
    // Then the server exits by itself, long before its grace period.
    tokio::time::timeout(LIMIT, s.stop())
        .await
        .expect("the server did not exit after the drain")
        .unwrap();
}

#[tokio::test]
async fn idle_keep_alive_connections_do_not_hold_the_drain_open() {
    let repo = repo_with(&[]);
    let mut s = TestServer::start_with(repo.path(), |c| c.shutdown.grace_period_seconds = 600.0).await;
    // An idle keep-alive connection, open when shutdown begins.
    let mut idle = TcpStream::connect(s.addr).await.unwrap();
    idle.write_all(b"GET /v2/health/live HTTP/1.1\r\nHost: sluice\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 1024];
    let n = tokio::time::timeout(LIMIT, idle.read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
    s.begin_stop();
    tokio::time::timeout(LIMIT, s.stop())
        .await
        .expect("an idle connection kept the server from exiting")
        .unwrap();
    // The server closed it.
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(LIMIT, idle.read_to_end(&mut rest))
        .await
        .unwrap();
    assert!(closed.is_err() || rest.is_empty(), "{closed:?} {rest:?}");
}
