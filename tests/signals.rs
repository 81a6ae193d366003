//! Signals other tools read, against a real server: Triton's metric names
//! after a known workload, each equal to sluice's own series measured at
//! the same place; and the inference log (KServe's CloudEvents) received by
//! a real HTTP sink for every protocol, each mode, an error, a sink that is
//! down and one that is slow.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::HeaderMap;
use common::prometheus::Metrics;
use common::*;
use serde_json::{json, Value};
use sluice::config::LogMode;

fn ones(rows: usize) -> Value {
    json!({"inputs": [v2_input("input", "FP32", &[rows, 16], json!(vec![1.0; rows * 16]))]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tritons_metric_names_agree_with_sluices_own() {
    // Models of their own: the recorder is the test process's, shared by
    // this file's tests, and sluice's series are compared by model.
    let repo = repo_with(&[]);
    add_model(repo.path(), "identity", "nv_identity", "{}");
    add_model(repo.path(), "slow", "nv_slow", r#"{"max_batch_size": 8}"#);
    let s = TestServer::start(repo.path()).await;
    // 7 requests of 1 to 3 rows, one after another (a batch each).
    let mut rows = 0;
    for i in 0..7 {
        let n = 1 + i % 3;
        rows += n;
        let (status, _) = s.post("/v2/models/nv_identity/infer", &ones(n)).await;
        assert_eq!(status, 200);
    }
    // Two that do not fit the model (OTHER), one past its own deadline (REJECTED).
    for _ in 0..2 {
        let bad = json!({"inputs": [v2_input("input", "FP32", &[1, 3], json!([1, 2, 3]))]});
        assert_eq!(s.post("/v2/models/nv_identity/infer", &bad).await.0, 400);
    }
    let late = json!({"inputs": [v2_input("x", "FP32", &[1, 4], json!([1, 2, 3, 4]))], "parameters": {"timeout": 1}});
    let (status, body) = s.post("/v2/models/nv_slow/infer", &late).await;
    assert!(status == 504 || status == 503, "{status} {body}");

    let m = Metrics::scrape(&s).await;
    let id = [("model", "nv_identity"), ("version", "1")];
    assert_eq!(m.sum("nv_inference_request_success", &id), 7.0);
    assert_eq!(
        m.sum("nv_inference_request_success", &id),
        m.sum(
            "sluice_requests_total",
            &[("model", "nv_identity"), ("status", "ok")]
        )
    );
    assert_eq!(
        m.sum(
            "nv_inference_request_failure",
            &[("model", "nv_identity"), ("reason", "OTHER")]
        ),
        2.0
    );
    assert_eq!(
        m.sum(
            "nv_inference_request_failure",
            &[("model", "nv_identity"), ("reason", "BACKEND")]
        ),
        0.0
    );
    assert_eq!(
        m.sum(
            "nv_inference_request_failure",
            &[("model", "nv_slow"), ("reason", "REJECTED")]
        ),
        1.0
    );
    assert_eq!(m.sum("nv_inference_count", &id), rows as f64);
    assert_eq!(
        m.sum("nv_inference_count", &id),
        m.sum("sluice_batch_size_sum", &[("model", "nv_identity")])
    );
    assert_eq!(m.sum("nv_inference_exec_count", &id), 7.0);
    assert_eq!(
        m.sum("nv_inference_exec_count", &id),
        m.sum("sluice_batch_size_count", &[("model", "nv_identity")])
    );
    // Durations: the same measurements, in µs (each request rounded down by
    // at most 1 µs), as sluice's histograms' sums in seconds.
    let close = |us: f64, seconds: f64, what: &str| {
        assert!(
            (us - seconds * 1e6).abs() <= 7.0 + seconds * 1e6 * 1e-6,
            "{what}: {us} µs vs {seconds} s"
        );
    };
    close(
        m.sum("nv_inference_queue_duration_us", &id),
        m.sum("sluice_queue_delay_seconds_sum", &[("model", "nv_identity")]),
        "queue",
    );
    // One request a batch: per-request compute time is the batch's.
    close(
        m.sum("nv_inference_compute_infer_duration_us", &id),
        m.sum(
            "sluice_inference_duration_seconds_sum",
            &[("model", "nv_identity")],
        ),
        "compute infer",
    );
    assert!(
        m.sum("nv_inference_request_duration_us", &id)
            >= m.sum("nv_inference_compute_infer_duration_us", &id)
    );
    assert!(
        m.has("nv_inference_compute_input_duration_us", &id)
            && m.has("nv_inference_compute_output_duration_us", &id)
    );
    assert_eq!(m.sum("nv_inference_pending_request_count", &id), 0.0);
    assert!(m.has("nv_cpu_memory_total_bytes", &[]) && m.has("nv_cpu_utilization", &[]));
    // Agrees with the statistics extension.
    let (_, stats) = s.get("/v2/models/nv_identity/stats").await;
    assert_eq!(stats["model_stats"][0]["inference_count"], rows);

    // The setting turns them off.
    let off = TestServer::start_with(repo.path(), |c| c.metrics.triton_names = false).await;
    assert!(!off.metrics().await.contains("nv_inference"));
}

/// One event the sink received.
#[derive(Debug, Clone)]
struct Received {
    headers: HeaderMap,
    body: Bytes,
}

/// A real HTTP sink on 127.0.0.1: keeps what it receives; answers after
/// `delay` (a slow sink).
async fn sink(delay: Duration) -> (String, Arc<Mutex<Vec<Received>>>) {
    let got: Arc<Mutex<Vec<Received>>> = Default::default();
    let keep = got.clone();
    let app = axum::Router::new().route(
        "/",
        axum::routing::post(move |headers: HeaderMap, body: Bytes| {
            let keep = keep.clone();
            async move {
                tokio::time::sleep(delay).await;
                keep.lock().unwrap().push(Received { headers, body });
                "ok"
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, got)
}

/// Waits until the sink holds `n` events (10 s at most).
async fn wait_events(got: &Arc<Mutex<Vec<Received>>>, n: usize) -> Vec<Received> {
    let t0 = Instant::now();
    loop {
        let events = got.lock().unwrap().clone();
        if events.len() >= n || t0.elapsed() > Duration::from_secs(10) {
            return events;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn header<'a>(e: &'a Received, name: &str) -> &'a str {
    e.headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or("")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_protocol_is_logged_with_kserves_attributes() {
    let (url, got) = sink(Duration::ZERO).await;
    let repo = repo_with(&["identity", "mlp"]);
    let s = TestServer::start_with(repo.path(), |c| {
        c.inference_log.url = Some(url.clone());
        c.inference_log.models = vec!["identity".into()];
        c.inference_log.namespace = Some("models".into());
    })
    .await;

    // V2 JSON, with the client's request id.
    let body = ones(1).to_string();
    let r = s
        .client
        .post(s.url("/v2/models/identity/infer"))
        .header("x-request-id", "req-42")
        .header("content-type", "application/json")
        .body(body.clone())
        .send()
        .await
        .unwrap();
    let answer = r.bytes().await.unwrap();
    let events = wait_events(&got, 2).await;
    assert_eq!(events.len(), 2, "{events:?}");
    let (req, resp) = (
        &events
            .iter()
            .find(|e| header(e, "ce-type").ends_with(".request"))
            .unwrap(),
        &events
            .iter()
            .find(|e| header(e, "ce-type").ends_with(".response"))
            .unwrap(),
    );
    assert_eq!(header(req, "ce-type"), "org.kubeflow.serving.inference.request");
    assert_eq!(header(resp, "ce-type"), "org.kubeflow.serving.inference.response");
    for e in [req, resp] {
        assert_eq!(header(e, "ce-id"), "req-42");
        assert_eq!(header(e, "ce-specversion"), "1.0");
        assert_eq!(header(e, "ce-source"), "http://localhost:9081/");
        assert_eq!(header(e, "ce-inferenceservicename"), "identity");
        assert_eq!(header(e, "ce-namespace"), "models");
        assert_eq!(header(e, "ce-endpoint"), "default");
        assert_eq!(header(e, "ce-protocol"), "v2");
        assert!(header(e, "ce-time").ends_with('Z'));
    }
    assert_eq!(req.body, body.as_bytes());
    assert_eq!(resp.body, answer);
    assert_eq!(header(resp, "ce-status"), "200");

    // V1, V2 binary, gRPC, and an error: each a request and a response.
    got.lock().unwrap().clear();
    let (status, _) = s
        .post(
            "/v1/models/identity:predict",
            &json!({"instances": [vec![0.5; 16]]}),
        )
        .await;
    assert_eq!(status, 200);
    let header_json = json!({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 16], "parameters": {"binary_data_size": 64}}]}).to_string();
    let mut binary = header_json.clone().into_bytes();
    binary.extend(std::iter::repeat_n(0u8, 64));
    let r = s
        .client
        .post(s.url("/v2/models/identity/infer"))
        .header("inference-header-content-length", header_json.len())
        .header("content-type", "application/octet-stream")
        .body(binary.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let mut g = common::grpc::client(&s).await;
    let grpc_req = common::grpc::infer_request("identity", "input", &[1, 16], &[0.25; 16]);
    g.model_infer(grpc_req.clone()).await.unwrap();
    let bad = json!({"inputs": [v2_input("input", "FP32", &[1, 3], json!([1, 2, 3]))]});
    assert_eq!(s.post("/v2/models/identity/infer", &bad).await.0, 400);
    // Not logged: `mlp` is not in `models`.
    assert_eq!(
        s.post(
            "/v2/models/mlp/infer",
            &json!({"inputs": [v2_input("input", "FP32", &[1, 784], json!(vec![0.0; 784]))]})
        )
        .await
        .0,
        200
    );

    wait_events(&got, 8).await;
    // Anything more (a logged `mlp` event) would come now.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let events = got.lock().unwrap().clone();
    assert_eq!(
        events.len(),
        8,
        "{:?}",
        events
            .iter()
            .map(|e| (
                header(e, "ce-protocol").to_string(),
                header(e, "ce-type").to_string()
            ))
            .collect::<Vec<_>>()
    );
    assert!(events.iter().all(|e| header(e, "ce-modelid") == "identity"));
    let by = |protocol: &str, kind: &str| {
        events
            .iter()
            .filter(|e| header(e, "ce-protocol") == protocol && header(e, "ce-type").ends_with(kind))
            .cloned()
            .collect::<Vec<_>>()
    };
    assert_eq!(by("v1", ".request").len(), 1);
    assert!(String::from_utf8_lossy(&by("v1", ".response")[0].body).contains("predictions"));
    let v2_requests = by("v2", ".request");
    assert!(v2_requests
        .iter()
        .any(|e| e.body == binary && header(e, "content-type") == "application/octet-stream"));
    let grpc = by("grpc", ".request");
    let decoded: sluice::protocol::grpc::inference::ModelInferRequest =
        prost::Message::decode(grpc[0].body.clone()).unwrap();
    assert_eq!(decoded, grpc_req);
    assert_eq!(header(&grpc[0], "ce-id"), "r1");
    assert_eq!(
        header(&by("grpc", ".response")[0], "content-type"),
        "application/x-protobuf"
    );
    let error = by("v2", ".response")
        .into_iter()
        .find(|e| header(e, "ce-status") == "400")
        .expect("the error's answer");
    assert!(String::from_utf8_lossy(&error.body).contains("error"));
    // A request and its answer share an id; requests' ids differ.
    let ids: std::collections::BTreeSet<String> =
        events.iter().map(|e| header(e, "ce-id").to_string()).collect();
    assert_eq!(ids.len(), 4, "{ids:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_and_response_modes_log_only_theirs() {
    for (mode, kind) in [(LogMode::Request, ".request"), (LogMode::Response, ".response")] {
        let (url, got) = sink(Duration::ZERO).await;
        let repo = repo_with(&["identity"]);
        let s = TestServer::start_with(repo.path(), |c| {
            c.inference_log.url = Some(url.clone());
            c.inference_log.mode = mode;
        })
        .await;
        for _ in 0..3 {
            assert_eq!(s.post("/v2/models/identity/infer", &ones(1)).await.0, 200);
        }
        wait_events(&got, 3).await;
        // Anything more would come now.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let events = got.lock().unwrap().clone();
        assert_eq!(events.len(), 3, "{mode:?}");
        assert!(
            events.iter().all(|e| header(e, "ce-type").ends_with(kind)),
            "{mode:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sink_that_is_down_or_slow_never_holds_inference() {
    // Down: nothing listens on the port.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let repo = repo_with(&["identity"]);
    let s = TestServer::start_with(repo.path(), |c| {
        c.inference_log.url = Some(format!("http://127.0.0.1:{port}/"));
    })
    .await;
    for _ in 0..20 {
        assert_eq!(s.post("/v2/models/identity/infer", &ones(1)).await.0, 200);
    }
    // Failed posts are counted; after each the sender pauses (doubling from
    // 100 ms), so 40 events against a dead sink cost a few posts, not 40.
    let failed = || async {
        Metrics::scrape(&s)
            .await
            .sum("sluice_inference_log_events_total", &[("result", "failed")])
    };
    let t0 = Instant::now();
    while failed().await < 2.0 {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the failed posts are counted"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        failed().await < 10.0,
        "a dead sink is retried with pauses, not once per event"
    );
    drop(s);

    // Slow: each post takes 2 s, one at a time, 4 queued at most. Were the
    // requests waiting on the sink, 60 of them would take minutes.
    let (url, got) = sink(Duration::from_secs(2)).await;
    let s = TestServer::start_with(repo.path(), |c| {
        c.inference_log.url = Some(url);
        c.inference_log.concurrency = 1;
        c.inference_log.queue_events = 4;
    })
    .await;
    let t0 = Instant::now();
    for _ in 0..60 {
        assert_eq!(s.post("/v2/models/identity/infer", &ones(1)).await.0, 200);
    }
    assert!(
        t0.elapsed() < Duration::from_secs(30),
        "requests waited on the slow sink: {:?}",
        t0.elapsed()
    );
    let dropped = Metrics::scrape(&s)
        .await
        .sum("sluice_inference_log_events_total", &[("result", "dropped")]);
    assert!(
        dropped >= 100.0,
        "120 events, at most 5 in the sink or its queue: {dropped} dropped"
    );
    assert!(got.lock().unwrap().len() <= 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_a_hanging_sink_leaves_queued_never_take_the_requests_byte_budget() {
    // A sink that takes every post and never answers in time.
    let (url, got) = sink(Duration::from_secs(120)).await;
    let repo = repo_with(&["identity"]);
    let s = TestServer::start_with(repo.path(), |c| {
        c.inference_log.url = Some(url);
        c.http.max_inflight_bytes = 8 << 20;
    })
    .await;
    // 4,096 rows: a body of about 300 KB, an answer about as big. Each is
    // an event; 60 of them queued would hold over twice the budget.
    let body = ones(4096);
    for i in 0..60 {
        let (status, answer) = s.post("/v2/models/identity/infer", &body).await;
        assert_eq!(status, 200, "request {i}: {answer}");
    }
    let dropped = Metrics::scrape(&s)
        .await
        .sum("sluice_inference_log_events_total", &[("result", "dropped")]);
    // The log's own bytes (an eighth of the budget) hold a few events at most.
    assert!(dropped >= 100.0, "120 events, {dropped} dropped");
    assert!(got.lock().unwrap().is_empty());
}
