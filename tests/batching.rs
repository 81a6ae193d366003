//! Batching end to end (SPEC §5, §6, §8): a real server over real ONNX
//! Runtime, real HTTP. Every test gives its models their own folder names:
//! the tests of this binary share one process-wide metrics recorder.
//!
//! The tests run one at a time (`SERIAL`): several measure latencies, and
//! all of them share the machine's cores with the server they start.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::batching::*;
use common::prometheus::Metrics;
use common::*;
use serde_json::{json, Value};

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundreds_of_concurrent_requests_get_their_own_answers_from_shared_batches() {
    let _serial = SERIAL.lock().await;
    let model = "mlp_crosstalk";
    let r = repo(&[("mlp", model, r#"{"max_batch_size": 32, "max_batch_time": 0.005}"#)]);
    let s = TestServer::start(r.path()).await;
    let want = Arc::new(mlp_rows());
    const TASKS: u64 = 32;
    const PER_TASK: usize = 10;
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let (client, url, want) = (
            s.client.clone(),
            s.url(&format!("/v2/models/{model}/infer")),
            want.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut rng = Lcg(t + 1);
            let mut rows_sent = 0;
            for k in 0..PER_TASK {
                let (n, first) = (1 + rng.below(8) as usize, rng.below(16) as usize);
                let picked: Vec<usize> = (0..n).map(|i| (first + i) % 16).collect();
                let rows: Vec<Vec<f64>> = picked.iter().map(|&i| want.inputs[i].clone()).collect();
                let (status, _, body) = post(&client, &url, &v2_body("input", &rows)).await;
                assert_eq!(status, 200, "task {t} request {k}: {body}");
                let out = &body["outputs"][0];
                assert_eq!(out["shape"], json!([n, 10]), "task {t} request {k}");
                let expected: Vec<f64> = picked.iter().flat_map(|&i| want.logits[i].clone()).collect();
                assert_close(
                    &flat_f64(&out["data"]),
                    &expected,
                    1e-4,
                    &format!("task {t} request {k}"),
                );
                rows_sent += n;
            }
            rows_sent
        }));
    }
    let mut rows = 0;
    for t in tasks {
        rows += t.await.unwrap();
    }
    let requests = TASKS as usize * PER_TASK;
    let m = Metrics::scrape(&s).await;
    let batches = assert_every_row_ran_once_batched(&m, model, rows, requests);
    let within = m.sum("sluice_batch_size_bucket", &[("model", model), ("le", "32")]);
    assert_eq!(within, batches, "a batch exceeded max_batch_size");
    s.stop().await.unwrap();
}

#[tokio::test]
async fn an_oversize_request_is_split_and_answered_in_order() {
    let _serial = SERIAL.lock().await;
    let model = "mlp_oversize";
    let r = repo(&[("mlp", model, r#"{"max_batch_size": 8, "max_batch_time": 0.005}"#)]);
    let s = TestServer::start(r.path()).await;
    let want = Arc::new(mlp_rows());
    let url = s.url(&format!("/v2/models/{model}/infer"));
    // 100 rows, plus a few small requests that may share its chunks' batches.
    let mut tasks = Vec::new();
    for (n, first) in [(100, 0), (3, 5), (3, 11), (2, 1)] {
        let (client, url, want) = (s.client.clone(), url.clone(), want.clone());
        tasks.push(tokio::spawn(async move {
            let picked: Vec<usize> = (0..n).map(|i| (first + i) % 16).collect();
            let rows: Vec<Vec<f64>> = picked.iter().map(|&i| want.inputs[i].clone()).collect();
            let (status, _, body) = post(&client, &url, &v2_body("input", &rows)).await;
            assert_eq!(status, 200, "{n} rows: {body}");
            assert_eq!(body["outputs"][0]["shape"], json!([n, 10]));
            let expected: Vec<f64> = picked.iter().flat_map(|&i| want.logits[i].clone()).collect();
            assert_close(
                &flat_f64(&body["outputs"][0]["data"]),
                &expected,
                1e-4,
                &format!("{n} rows"),
            );
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let m = Metrics::scrape(&s).await;
    let l = [("model", model)];
    let batches = m.sum("sluice_batch_size_count", &l);
    assert_eq!(m.sum("sluice_batch_size_sum", &l), 108.0);
    assert!(
        batches >= 14.0,
        "108 rows need at least 14 batches of 8, got {batches}"
    );
    let within = m.sum("sluice_batch_size_bucket", &[("model", model), ("le", "8")]);
    assert_eq!(within, batches, "a batch held more than max_batch_size rows");
    s.stop().await.unwrap();
}

#[tokio::test]
async fn requests_with_different_trailing_dims_never_share_a_batch() {
    let _serial = SERIAL.lock().await;
    // The fixture's own settings: fixed policy, max_batch_size 16, max_batch_time 0.05.
    let r = repo_with(&["varlen"]);
    let s = TestServer::start(r.path()).await;
    let url = s.url("/v1/models/varlen:predict");
    let mut tasks = Vec::new();
    for id in 0..24usize {
        let (width, n) = (if id % 2 == 0 { 3 } else { 5 }, 1 + id % 3);
        let rows: Vec<Vec<f64>> = (0..n)
            .map(|i| (0..width).map(|j| (id * 100 + i * 10 + j) as f64).collect())
            .collect();
        let client = s.client.clone();
        let url = url.clone();
        tasks.push(tokio::spawn(async move {
            let (status, _, body) = post(&client, &url, &json!({ "instances": rows })).await;
            assert_eq!(status, 200, "request {id}: {body}");
            assert_eq!(flat_f64(&body["predictions"]), doubled(&rows), "request {id}");
            (width, body["batchId"].as_str().unwrap().to_string())
        }));
    }
    let mut results = Vec::new();
    for t in tasks {
        let (width, batch) = t.await.unwrap();
        results.push((batch, width));
    }
    assert_batches_group_equal("row widths", results);
    s.stop().await.unwrap();
}

#[tokio::test]
async fn a_model_with_a_fixed_batch_dim_is_served_with_batching_off() {
    let _serial = SERIAL.lock().await;
    let model = "fixed_batch_e2e";
    let r = repo(&[("fixed_batch", model, r#"{"max_batch_size": 8}"#)]);
    let s = TestServer::start(r.path()).await;
    let url = s.url(&format!("/v2/models/{model}/infer"));
    let mut tasks = Vec::new();
    for id in 0..10usize {
        let rows: Vec<Vec<f64>> = (0..3)
            .map(|i| vec![(id * 10 + i) as f64, 0.5 + i as f64])
            .collect();
        let (client, url) = (s.client.clone(), url.clone());
        tasks.push(tokio::spawn(async move {
            let (status, _, body) = post(&client, &url, &v2_body("x", &rows)).await;
            assert_eq!(status, 200, "request {id}: {body}");
            let squared: Vec<f64> = rows.concat().iter().map(|x| x * x).collect();
            assert_eq!(flat_f64(&body["outputs"][0]["data"]), squared, "request {id}");
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let (status, _, body) = post(&s.client, &url, &v2_body("x", &[vec![1.0, 2.0]])).await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("expected shape [3, 2]"),
        "{body}"
    );
    let m = Metrics::scrape(&s).await;
    let l = [("model", model)];
    assert_eq!(
        m.sum("sluice_batch_size_count", &l),
        10.0,
        "one batch per request"
    );
    // Its dim 0 is not a batch: each request is one inference, as Triton
    // counts a model with `max_batch_size: 0`.
    assert_eq!(
        m.sum("sluice_batch_size_sum", &l),
        10.0,
        "every batch of one request"
    );
    assert_eq!(
        m.sum("sluice_batch_size_bucket", &[("model", model), ("le", "1")]),
        10.0
    );
    s.stop().await.unwrap();
}

#[tokio::test]
async fn adaptive_answers_a_lone_request_at_once_while_fixed_waits_max_batch_time() {
    let _serial = SERIAL.lock().await;
    let r = repo(&[
        (
            "mlp",
            "mlp_adaptive",
            r#"{"max_batch_time": 0.2, "batch_policy": "adaptive"}"#,
        ),
        (
            "mlp",
            "mlp_fixed",
            r#"{"max_batch_time": 0.2, "batch_policy": "fixed"}"#,
        ),
    ]);
    let s = TestServer::start(r.path()).await;
    let want = mlp_rows();
    let mut medians = BTreeMap::new();
    for model in ["mlp_adaptive", "mlp_fixed"] {
        let url = s.url(&format!("/v2/models/{model}/infer"));
        let mut took = Vec::new();
        for i in 0..7 {
            let t0 = Instant::now();
            let (status, _, body) = post(&s.client, &url, &v2_body("input", &want.inputs[i..=i])).await;
            took.push(t0.elapsed());
            assert_eq!(status, 200, "{body}");
            assert_close(
                &flat_f64(&body["outputs"][0]["data"]),
                &want.logits[i],
                1e-4,
                model,
            );
        }
        took.sort();
        medians.insert(model, took[took.len() / 2]);
    }
    let (adaptive, fixed) = (medians["mlp_adaptive"], medians["mlp_fixed"]);
    assert!(
        adaptive < Duration::from_millis(100),
        "adaptive median {adaptive:?}: a lone request should not wait"
    );
    assert!(
        fixed >= Duration::from_millis(200),
        "fixed median {fixed:?}: should wait max_batch_time"
    );
    s.stop().await.unwrap();
}

#[tokio::test]
async fn a_full_queue_answers_503_with_retry_after() {
    let _serial = SERIAL.lock().await;
    let model = "slow_queue";
    let r = repo(&[("slow", model, r#"{"max_batch_size": 8, "max_queue_size": 1}"#)]);
    let s = TestServer::start(r.path()).await;
    let url = s.url(&format!("/v2/models/{model}/infer"));
    let mut tasks = Vec::new();
    for id in 0..16usize {
        let rows = vec![vec![id as f64, 1.0, 2.0, 3.5]];
        let (client, url) = (s.client.clone(), url.clone());
        tasks.push(tokio::spawn(async move {
            let (status, retry, body) = post(&client, &url, &v2_body("x", &rows)).await;
            (rows, status, retry, body)
        }));
    }
    let (mut ok, mut refused) = (0, 0);
    for t in tasks {
        let (rows, status, retry, body) = t.await.unwrap();
        match status {
            200 => {
                assert_eq!(flat_f64(&body["outputs"][0]["data"]), doubled(&rows));
                ok += 1;
            }
            503 => {
                let secs: u64 = retry.expect("503 without Retry-After").parse().unwrap();
                assert!(secs >= 1);
                let e = body["error"].as_str().unwrap();
                assert!(e.contains(model) && e.contains("max_queue_size"), "{e}");
                refused += 1;
            }
            other => panic!("unexpected status {other}: {body}"),
        }
    }
    assert!(
        refused >= 1,
        "16 concurrent requests with max_queue_size 1: none refused"
    );
    assert!(
        ok >= 2,
        "the running request and the queued one must succeed; {ok} did"
    );
    let m = Metrics::scrape(&s).await;
    let overloaded = [("model", model), ("protocol", "v2"), ("status", "overloaded")];
    assert_eq!(m.sum("sluice_requests_total", &overloaded), refused as f64);
    s.stop().await.unwrap();
}

#[tokio::test]
async fn requests_past_their_deadline_get_504_and_are_not_run() {
    let _serial = SERIAL.lock().await;
    let model = "slow_deadline";
    // Batching off: one run per request, each much longer than the timeout's share.
    let r = repo(&[("slow", model, r#"{"max_batch_size": 1, "timeout": 0.05}"#)]);
    let s = TestServer::start(r.path()).await;
    const N: usize = 20;
    let (ok, late) = flood_slow(&s, model, N, &Value::Null, &[model, "timeout of 50ms"]).await;
    assert!(
        late >= 1,
        "{N} runs of the slow model cannot all finish within 50 ms"
    );
    // Each request is dispatched (rows in `sluice_batch_size`) or dropped
    // from the queue at its deadline; the drop may be counted a moment after
    // its 504 went out.
    let l = [("model", model)];
    let expired_l = [("model", model), ("reason", "expired")];
    let t0 = Instant::now();
    let (m, dispatched, expired) = loop {
        let m = Metrics::scrape(&s).await;
        let (dispatched, expired) = (
            m.sum("sluice_batch_size_sum", &l),
            m.sum("sluice_requests_dropped_total", &expired_l),
        );
        if dispatched + expired >= N as f64 || t0.elapsed() > Duration::from_secs(5) {
            break (m, dispatched, expired);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(expired >= 1.0, "no request was dropped from the queue as expired");
    assert_eq!(
        dispatched + expired,
        N as f64,
        "each request is either dispatched or dropped"
    );
    assert_eq!(
        m.sum("sluice_queue_size", &l),
        0.0,
        "answered requests still counted as waiting"
    );
    assert!(ok as f64 <= dispatched);
    let ran = m.sum("sluice_inference_duration_seconds_count", &l);
    assert!(
        ran < N as f64,
        "{ran} runs for {N} requests: expired requests ran"
    );
    s.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flooded_model_does_not_starve_a_quiet_one() {
    let _serial = SERIAL.lock().await;
    let (busy, quiet) = ("slow_busy", "mlp_quiet");
    let r = repo(&[("slow", busy, r#"{"max_batch_size": 1}"#), ("mlp", quiet, "{}")]);
    let s = TestServer::start_with(r.path(), |cfg| cfg.pool.cpu_concurrent_batches = 1).await;
    const BACKLOG: usize = 16;
    let done = Arc::new(AtomicUsize::new(0));
    let mut flood = Vec::new();
    for id in 0..BACKLOG {
        let (client, url, done) = (
            s.client.clone(),
            s.url(&format!("/v2/models/{busy}/infer")),
            done.clone(),
        );
        flood.push(tokio::spawn(async move {
            let rows = vec![vec![id as f64, 1.0, 2.0, 3.0]];
            let (status, _, body) = post(&client, &url, &v2_body("x", &rows)).await;
            assert_eq!(status, 200, "{body}");
            done.fetch_add(1, SeqCst);
        }));
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    // Busy batches done before the quiet model's first request: however
    // many the 50 ms head start allowed (the machine's speed decides).
    let busy_before = done.load(SeqCst);
    let want = mlp_rows();
    let url = s.url(&format!("/v2/models/{quiet}/infer"));
    let mut slowest = Duration::ZERO;
    for i in 0..3 {
        let t0 = Instant::now();
        let (status, _, body) = post(&s.client, &url, &v2_body("input", &want.inputs[i..=i])).await;
        slowest = slowest.max(t0.elapsed());
        assert_eq!(status, 200, "{body}");
        assert_close(
            &flat_f64(&body["outputs"][0]["data"]),
            &want.logits[i],
            1e-4,
            quiet,
        );
    }
    let busy_during = done.load(SeqCst) - busy_before;
    for t in flood {
        t.await.unwrap();
    }
    let m = Metrics::scrape(&s).await;
    let l = [("model", busy)];
    let batch = m.sum("sluice_inference_duration_seconds_sum", &l)
        / m.sum("sluice_inference_duration_seconds_count", &l);
    // Each quiet request waits for at most the busy batch running when it
    // arrives (and one more for slack), never for the rest of the backlog.
    assert!(
        busy_during <= 2 * 3 && busy_before + busy_during < BACKLOG,
        "the quiet model's 3 requests waited for {busy_during} of the {} busy batches still queued",
        BACKLOG - busy_before
    );
    let bound = Duration::from_secs_f64(3.0 * batch) + Duration::from_millis(100);
    assert!(
        slowest <= bound,
        "a quiet request took {slowest:?}; the busy model's batches take {batch:.3} s"
    );
    s.stop().await.unwrap();
}

#[tokio::test]
async fn every_metric_is_present_and_moves_with_traffic() {
    let _serial = SERIAL.lock().await;
    let model = "mlp_metrics";
    let r = repo(&[("mlp", model, r#"{"max_batch_size": 8}"#)]);
    let s = TestServer::start(r.path()).await;
    let l = [("model", model)];
    let before = Metrics::scrape(&s).await;
    assert_eq!(before.sum("sluice_model_ready", &l), 1.0);
    assert!(
        before.sum(
            "sluice_model_reloads_total",
            &[("model", model), ("result", "loaded")]
        ) >= 1.0
    );
    assert!(before.has("sluice_queue_size", &l));

    let want = mlp_rows();
    let v2 = s.url(&format!("/v2/models/{model}/infer"));
    let v1 = s.url(&format!("/v1/models/{model}:predict"));
    let mut tasks = Vec::new();
    for i in 0..6 {
        let (client, v2, body) = (
            s.client.clone(),
            v2.clone(),
            v2_body("input", &want.inputs[i..i + 2]),
        );
        tasks.push(tokio::spawn(async move { post(&client, &v2, &body).await.0 }));
    }
    for i in 0..3 {
        let (client, v1, body) = (
            s.client.clone(),
            v1.clone(),
            json!({"instances": [want.inputs[i]]}),
        );
        tasks.push(tokio::spawn(async move { post(&client, &v1, &body).await.0 }));
    }
    for t in tasks {
        assert_eq!(t.await.unwrap(), 200);
    }
    let (status, _, _) = post(&s.client, &v2, &v2_body("input", &[vec![1.0; 3]])).await;
    assert_eq!(status, 400);
    let after = Metrics::scrape(&s).await;

    let moved = |name: &str, labels: &[(&str, &str)]| after.sum(name, labels) - before.sum(name, labels);
    let batches = moved("sluice_batch_size_count", &l);
    assert!(batches >= 1.0);
    assert_eq!(moved("sluice_batch_size_sum", &l), 15.0, "6 x 2 rows + 3 x 1 row");
    assert_eq!(
        moved("sluice_queue_delay_seconds_count", &l),
        9.0,
        "one per request"
    );
    assert_eq!(moved("sluice_inference_duration_seconds_count", &l), batches);
    assert_eq!(moved("sluice_batches_total", &l), batches);
    for s in after.matching("sluice_batches_total", &l) {
        let trigger = s.labels.get("trigger").map(String::as_str);
        assert!(
            matches!(trigger, Some("size" | "time" | "adaptive" | "drain")),
            "{s:?}"
        );
    }
    let v2_l = [("model", model), ("protocol", "v2")];
    let v1_l = [("model", model), ("protocol", "v1")];
    assert_eq!(moved("sluice_request_duration_seconds_count", &v2_l), 7.0);
    assert_eq!(moved("sluice_request_duration_seconds_count", &v1_l), 3.0);
    assert!(moved("sluice_request_duration_seconds_sum", &l) > 0.0);
    assert_eq!(
        moved("sluice_requests_total", &[v2_l[0], v2_l[1], ("status", "ok")]),
        6.0
    );
    assert_eq!(
        moved("sluice_requests_total", &[v1_l[0], v1_l[1], ("status", "ok")]),
        3.0
    );
    assert_eq!(
        moved(
            "sluice_requests_total",
            &[v2_l[0], v2_l[1], ("status", "invalid_input")]
        ),
        1.0
    );
    assert_eq!(
        after.sum("sluice_queue_size", &l),
        0.0,
        "nothing waits after the traffic"
    );
    assert_eq!(after.sum("sluice_model_ready", &l), 1.0);

    let text = s.metrics().await;
    for (name, kind) in [
        ("sluice_batch_size", "histogram"),
        ("sluice_queue_delay_seconds", "histogram"),
        ("sluice_inference_duration_seconds", "histogram"),
        ("sluice_request_duration_seconds", "histogram"),
        ("sluice_requests_total", "counter"),
        ("sluice_batches_total", "counter"),
        ("sluice_queue_size", "gauge"),
        ("sluice_model_ready", "gauge"),
        ("sluice_model_reloads_total", "counter"),
    ] {
        assert!(
            text.contains(&format!("# TYPE {name} {kind}\n")),
            "no `# TYPE {name} {kind}`"
        );
        assert!(text.contains(&format!("# HELP {name} ")), "no help for {name}");
    }
    s.stop().await.unwrap();
}
