//! The server-wide budget of bytes held by accepted requests
//! (`http.max_inflight_bytes`), end to end: while one request holds most of
//! it, another is refused at once (HTTP 503 with `Retry-After`, gRPC
//! UNAVAILABLE) before its body is read, and once the first is answered the
//! next one passes; large bodies (decoded off the async workers) still get
//! the right answers.

mod common;

use std::time::{Duration, Instant};

use common::grpc::{client, infer_request};
use common::prometheus::Metrics;
use common::*;
use serde_json::{json, Value};

/// A V2 body of `rows` digits rows (about 390 bytes a row).
fn digits_body(rows: usize) -> (Value, Vec<Value>) {
    let exp = fixture("digits_expected.json");
    let inputs = exp["inputs"].as_array().unwrap();
    let data: Vec<Value> = (0..rows).map(|i| inputs[i % inputs.len()].clone()).collect();
    let labels = (0..rows)
        .map(|i| exp["labels"][i % inputs.len()].clone())
        .collect();
    (
        json!({"inputs": [v2_input("input", "FP32", &[rows, 64], json!(data))]}),
        labels,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_beyond_the_byte_budget_are_refused_until_the_held_ones_are_answered() {
    // Held in the queue for 2 s (fixed policy, a batch that never fills).
    // A name of its own: the tests of this file share one metrics recorder,
    // and the probe below reads this model's queue gauge, which another
    // test's `digits` would set too.
    let repo = common::batching::repo(&[(
        "digits",
        "held",
        r#"{"batch_policy": "fixed", "max_batch_size": 4096, "max_batch_time": 2}"#,
    )]);
    let s = TestServer::start_with(repo.path(), |c| c.http.max_inflight_bytes = 60_000).await;
    let (big, labels) = digits_body(100);
    let size = serde_json::to_vec(&big).unwrap().len();
    assert!(size > 30_000 && size < 60_000, "{size}");

    let (first, second) = tokio::join!(s.post("/v2/models/held/infer", &big), async {
        let t0 = Instant::now();
        while Metrics::scrape(&s)
            .await
            .sum("sluice_queue_size", &[("model", "held")])
            < 1.0
        {
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "the first request never queued"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let r = s
            .client
            .post(s.url("/v2/models/held/infer"))
            .json(&big)
            .send()
            .await
            .unwrap();
        let retry = r
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap().to_string());
        let status = r.status().as_u16();
        let body: Value = r.json().await.unwrap();
        // gRPC shares the budget.
        let mut grpc = client(&s).await;
        let rows: Vec<f32> = vec![0.5; 64 * 200];
        let e = grpc
            .model_infer(infer_request("held", "input", &[200, 64], &rows))
            .await
            .unwrap_err();
        (status, retry, body, e.code())
    });
    assert_eq!(first.0, 200, "{}", first.1);
    assert_eq!(v2_output(&first.1, "label")["data"], json!(labels));
    let (status, retry, body, grpc_code) = second;
    assert_eq!((status, retry.as_deref()), (503, Some("1")), "{body}");
    assert!(
        error_message(&body).contains("http.max_inflight_bytes = 60000"),
        "{body}"
    );
    assert_eq!(grpc_code, tonic::Code::Unavailable);
    // The first one answered: its bytes are free again.
    let (st, r) = s.post("/v2/models/held/infer", &digits_body(10).0).await;
    assert_eq!(st, 200, "{r}");
    s.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_body_is_decoded_off_the_async_workers_and_answered_right() {
    let repo = repo_with(&["digits"]);
    let s = TestServer::start(repo.path()).await;
    // About 2.5 MB of JSON: above the size decoded inline.
    let (big, labels) = digits_body(6_400);
    let (st, r) = s.post("/v2/models/digits/infer", &big).await;
    assert_eq!(st, 200, "{r}");
    assert_eq!(v2_output(&r, "label")["data"], json!(labels));
    let exp = fixture("digits_expected.json");
    let rows: Vec<Value> = (0..6_400).map(|i| exp["inputs"][i % 64].clone()).collect();
    let (st, r) = s
        .post("/v1/models/digits:predict", &json!({"instances": rows}))
        .await;
    assert_eq!(st, 200, "{r}");
    assert_eq!(r["predictions"][6_399]["label"], exp["labels"][6_399 % 64]);
    s.stop().await.unwrap();
}

/// A binary V2 request for `echo` (the identity fixture, batching off) of
/// `rows` rows of 16 FP32 values, asking for its output in binary: the
/// answer is as large as the request.
fn echo_request(rows: usize) -> Vec<u8> {
    let bytes = rows * 16 * 4;
    let header = json!({
        "inputs": [{"name": "input", "datatype": "FP32", "shape": [rows, 16],
                    "parameters": {"binary_data_size": bytes}}],
        "outputs": [{"name": "output", "parameters": {"binary_data": true}}],
    })
    .to_string();
    let head = format!(
        "POST /v2/models/echo/infer HTTP/1.1\r\nHost: sluice\r\nContent-Type: application/octet-stream\r\n\
         Inference-Header-Content-Length: {}\r\nContent-Length: {}\r\n\r\n",
        header.len(),
        header.len() + bytes
    );
    let mut body = head.into_bytes();
    body.extend_from_slice(header.as_bytes());
    body.extend(std::iter::repeat_n(0u8, bytes));
    body
}

/// Answers a client never reads stay inside the budget: a 48 MiB answer
/// nobody reads (more than the loopback socket buffers take) holds its
/// request's bytes and its own until the connection is closed for not
/// reading (`http.write_timeout_seconds`), and meanwhile a new request is
/// refused; then it passes. Before, a request's bytes left the budget when
/// its answer was handed to hyper, so unread answers piled up outside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_a_client_does_not_read_stay_inside_the_budget() {
    use tokio::io::AsyncWriteExt;
    let (_repo, s) = start_echo().await;
    let mut unread = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    unread.write_all(&echo_request((48 << 20) / 64)).await.unwrap();
    held_until_closed_for_not_reading(&s, "HTTP").await;
    drop(unread);
    s.stop().await.unwrap();
}

/// A server with `echo` (the identity fixture, batching off) and `digits`,
/// a 96 MiB byte budget (a 48 MiB request and its answer fill it) and a 4 s
/// write timeout.
async fn start_echo() -> (tempfile::TempDir, TestServer) {
    let repo = tempfile::tempdir().unwrap();
    add_model(repo.path(), "identity", "echo", r#"{"max_batch_size": 0}"#);
    add_model(repo.path(), "digits", "digits", "{}");
    let s = TestServer::start_with(repo.path(), |c| {
        c.http.max_inflight_bytes = 96 << 20;
        c.http.write_timeout_seconds = 4.0;
    })
    .await;
    (repo, s)
}

/// While an unread 48 MiB answer (over `how`) holds the budget, a small
/// request is refused, at once, naming the budget; once the connection is
/// closed for not reading, its bytes come back and the request passes.
async fn held_until_closed_for_not_reading(s: &TestServer, how: &str) {
    let (body, _) = digits_body(1);
    // No probe until the answer is made: an answer is charged what is left
    // of the budget, at most its size, so a probe in flight at that moment
    // would leave room for every later probe of its size.
    let t0 = Instant::now();
    while Metrics::scrape(s)
        .await
        .sum("sluice_requests_total", &[("model", "echo")])
        < 1.0
    {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the unread {how} answer was never made"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Counted just before it is charged and handed to the transport.
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Refused once the answer is made and stuck.
    let t0 = Instant::now();
    loop {
        let (st, r) = s.post("/v2/models/digits/infer", &body).await;
        if st == 503 {
            assert!(error_message(&r).contains("http.max_inflight_bytes"), "{r}");
            break;
        }
        // Making the answer takes a while on a busy machine (a debug build
        // beside the other tests); once it is stuck, it holds the budget
        // for the write timeout (4 s).
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "never refused while the unread {how} answer is held: {r}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let t0 = Instant::now();
    loop {
        let (st, r) = s.post("/v2/models/digits/infer", &body).await;
        if st == 200 {
            break;
        }
        assert_eq!(st, 503, "{r}");
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the budget never came back"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A gRPC-framed `ModelInferRequest` for `echo` of `bytes` of FP32 zeros
/// (no compression, the length, the message).
fn echo_grpc_message(bytes: usize) -> bytes::Bytes {
    use prost::Message;
    use sluice::protocol::grpc::inference::model_infer_request::InferInputTensor;
    use sluice::protocol::grpc::inference::ModelInferRequest;
    let rows = bytes / 64;
    let message = ModelInferRequest {
        model_name: "echo".into(),
        inputs: vec![InferInputTensor {
            name: "input".into(),
            datatype: "FP32".into(),
            shape: vec![rows as i64, 16],
            ..Default::default()
        }],
        raw_input_contents: vec![vec![0u8; rows * 64].into()],
        ..Default::default()
    }
    .encode_to_vec();
    let mut framed = vec![0u8];
    framed.extend_from_slice(&(message.len() as u32).to_be_bytes());
    framed.extend_from_slice(&message);
    framed.into()
}

/// An HTTP/2 connection to the gRPC port whose receive window stays at
/// zero: it never reads an answer's data. Spawn the connection task.
async fn zero_window_h2(
    s: &TestServer,
) -> (
    h2::client::SendRequest<bytes::Bytes>,
    h2::client::Connection<tokio::net::TcpStream, bytes::Bytes>,
) {
    let tcp = tokio::net::TcpStream::connect(s.grpc_addr).await.unwrap();
    h2::client::Builder::new()
        .initial_window_size(0)
        .handshake::<_, bytes::Bytes>(tcp)
        .await
        .unwrap()
}

/// The head of a call to `method` of the inference service.
fn grpc_call(s: &TestServer, method: &str) -> hyper::Request<()> {
    hyper::Request::post(format!(
        "http://{}/inference.GRPCInferenceService/{method}",
        s.grpc_addr
    ))
    .header("content-type", "application/grpc")
    .header("te", "trailers")
    .body(())
    .unwrap()
}

/// The same over gRPC: a client whose HTTP/2 window stays at zero (it never
/// reads its answer) holds the budget until the connection is closed for
/// making no progress; meanwhile an HTTP request is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_answer_behind_a_zero_window_stays_inside_the_budget() {
    let (_repo, s) = start_echo().await;
    let framed = echo_grpc_message(48 << 20);
    let (mut grpc, conn) = zero_window_h2(&s).await;
    tokio::spawn(conn);
    let (answer, mut send) = grpc.send_request(grpc_call(&s, "ModelInfer"), false).unwrap();
    send.send_data(framed, true).unwrap();
    // The answer's headers come; its data cannot (the window is zero).
    let answer = tokio::time::timeout(Duration::from_secs(60), answer)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(answer.status(), 200);
    held_until_closed_for_not_reading(&s, "gRPC").await;
    drop(answer);
    s.stop().await.unwrap();
}

/// Many `ModelStreamInfer` streams on one connection whose answers are
/// never read (the HTTP/2 window stays at zero): each answer holds its bytes
/// until sent, and the connection's streams together hold at most
/// `grpc.max_connection_bytes` (an eighth of the budget): a few requests
/// run, the others wait unread, and an HTTP
/// client beside them is served. Before, a stream's answer left the budget
/// as it entered the stream's channel and unread streams grew memory to
/// many times the budget; then, with the budget shared by all, the unread
/// connection took all of it and other clients got 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unread_answers_of_many_grpc_streams_stay_inside_the_budget() {
    const STREAMS: usize = 40;
    const EACH: usize = 2;
    let repo = tempfile::tempdir().unwrap();
    add_model(repo.path(), "identity", "echo", r#"{"max_batch_size": 0}"#);
    add_model(repo.path(), "digits", "digits", "{}");
    let budget = 16 << 20;
    let s = TestServer::start_with(repo.path(), |c| c.http.max_inflight_bytes = budget).await;
    // 1 MiB requests of `echo`, answered with 1 MiB each.
    let framed = echo_grpc_message(1 << 20);
    let (mut grpc, conn) = zero_window_h2(&s).await;
    let conn = tokio::spawn(conn);
    let mut streams = Vec::new();
    for _ in 0..STREAMS {
        grpc = grpc.ready().await.unwrap();
        let (answer, mut send) = grpc
            .send_request(grpc_call(&s, "ModelStreamInfer"), false)
            .unwrap();
        for _ in 0..EACH {
            send.send_data(framed.clone(), false).unwrap();
        }
        streams.push((answer, send));
    }
    // Run or refused, until nothing moves for 2 s.
    let counts = |m: &Metrics| {
        let of =
            |status: &str| m.sum("sluice_requests_total", &[("model", "echo"), ("status", status)]) as usize;
        (of("ok"), of("overloaded"))
    };
    let (t0, mut last, mut still) = (Instant::now(), (usize::MAX, 0), Instant::now());
    let (ok, refused) = loop {
        let now = counts(&Metrics::scrape(&s).await);
        if now != last {
            (last, still) = (now, Instant::now());
        }
        if still.elapsed() > Duration::from_secs(2) && now.0 > 0 {
            break now;
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "{now:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // Each answer made holds its request's MiB and its own until sent, and
    // the connection holds at most 2 MiB of requests.
    assert!(
        ok <= 4,
        "{ok} answers of 1 MiB made and unread on one connection whose share is 2 MiB ({refused} refused)"
    );
    let (body, _) = digits_body(1);
    let (st, r) = s.post("/v2/models/digits/infer", &body).await;
    assert_eq!(st, 200, "another client beside the unread connection: {r}");
    drop(streams);
    drop(grpc);
    conn.abort();
    let t0 = Instant::now();
    loop {
        let (st, r) = s.post("/v2/models/digits/infer", &body).await;
        if st == 200 {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the budget never came back: {r}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    s.stop().await.unwrap();
}

/// Many short BYTES strings cost more than their body once decoded (each
/// element a word for where it ends): the budget is charged by the decoded
/// size, so a body of 2 M empty strings (6 MB of JSON, 16 MB decoded) is
/// refused by a 12 MiB budget, while 100 k of them pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_tensors_are_charged_by_their_decoded_size() {
    let repo = repo_with(&["strings"]);
    let s = TestServer::start_with(repo.path(), |c| c.http.max_inflight_bytes = 12 << 20).await;
    let body = |n: usize| {
        let mut text = String::from(r#"{"inputs": [{"name": "x", "datatype": "BYTES", "shape": ["#);
        text.push_str(&format!("{n}], \"data\": ["));
        text.push_str(&vec!["\"\""; n].join(","));
        text.push_str("]}]}");
        text.into_bytes()
    };
    let big = body(2_000_000);
    assert!(big.len() < 8 << 20, "{} bytes", big.len());
    let (st, r) = s.post_raw("/v2/models/strings/infer", big).await;
    assert_eq!(st, 503, "{r}");
    assert!(error_message(&r).contains("http.max_inflight_bytes"), "{r}");
    let (st, r) = s.post_raw("/v2/models/strings/infer", body(100_000)).await;
    assert_eq!(st, 200, "{}", r.to_string().chars().take(300).collect::<String>());
    s.stop().await.unwrap();
}
