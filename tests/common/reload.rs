//! Helpers for the hot-reload and repository-API tests: reading `/metrics`,
//! waiting for a condition (never a fixed sleep as the only synchronization),
//! client tasks that send requests until told to stop, and known-answer
//! requests for the fixture models.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::{assert_close, fixture, flat_f64, root, v2_input, v2_output, TestServer};

/// How long a condition may take to hold (a model load on a busy 2-core
/// machine included); a passing test returns as soon as it holds.
pub const WAIT: Duration = Duration::from_secs(20);

/// Polls `cond` every 50 ms until it returns `Some`, and returns that value;
/// panics naming `what` after `WAIT`.
pub async fn wait_for<T, F, Fut>(what: &str, mut cond: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = cond().await {
            return v;
        }
        assert!(
            start.elapsed() < WAIT,
            "timed out after {WAIT:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Sum of the samples of metric `name` whose labels include all of `labels`
/// (0 when there is none), from Prometheus text.
pub fn metric_value(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    super::prometheus::Metrics(super::prometheus::parse(text)).sum(name, labels)
}

impl TestServer {
    /// `sluice_model_reloads_total{model, result}`.
    pub async fn reloads(&self, model: &str, result: &str) -> f64 {
        let text = self.metrics().await;
        metric_value(
            &text,
            "sluice_model_reloads_total",
            &[("model", model), ("result", result)],
        )
    }

    /// Every `sluice_model_reloads_total` result of `model`, in a fixed order:
    /// loaded, reloaded, updated, failed, unloaded.
    pub async fn reload_counts(&self, model: &str) -> [f64; 5] {
        let text = self.metrics().await;
        ["loaded", "reloaded", "updated", "failed", "unloaded"].map(|r| {
            metric_value(
                &text,
                "sluice_model_reloads_total",
                &[("model", model), ("result", r)],
            )
        })
    }

    /// Waits until `sluice_model_reloads_total{model, result}` reaches `n`.
    pub async fn wait_reloads(&self, model: &str, result: &str, n: f64) {
        wait_for(
            &format!("reloads_total{{model={model}, result={result}}} >= {n}"),
            || async { (self.reloads(model, result).await >= n).then_some(()) },
        )
        .await
    }

    /// (count, count of batches of at most `le` rows) of `sluice_batch_size{model}`.
    pub async fn batch_sizes(&self, model: &str, le: usize) -> (f64, f64) {
        let text = self.metrics().await;
        let count = metric_value(&text, "sluice_batch_size_count", &[("model", model)]);
        let le = le.to_string();
        let small = metric_value(
            &text,
            "sluice_batch_size_bucket",
            &[("model", model), ("le", le.as_str())],
        );
        (count, small)
    }

    /// The index entry of `model`, if listed.
    pub async fn index_entry(&self, model: &str) -> Option<Value> {
        self.index().await.remove(model)
    }

    /// Waits until the index lists `model` with `state`; returns the entry.
    pub async fn wait_state(&self, model: &str, state: &str) -> Value {
        wait_for(&format!("`{model}` to be {state} in the index"), || async {
            self.index_entry(model).await.filter(|e| e["state"] == state)
        })
        .await
    }
}

/// Client tasks that each send requests in a loop until [`Clients::stop`],
/// keeping what each request gave.
pub struct Clients<T> {
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<Vec<T>>>,
}

impl<T: Send + 'static> Clients<T> {
    /// Starts `n` tasks; task `c` calls `request(c, i)` for i = 0, 1, ...
    pub fn start<F, Fut>(n: usize, request: F) -> Clients<T>
    where
        F: Fn(usize, usize) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = T> + Send,
    {
        let stop = Arc::new(AtomicBool::new(false));
        let request = Arc::new(request);
        let tasks = (0..n)
            .map(|c| {
                let (stop, request) = (stop.clone(), request.clone());
                tokio::spawn(async move {
                    let mut got = Vec::new();
                    let mut i = 0;
                    while !stop.load(Ordering::Acquire) {
                        got.push(request(c, i).await);
                        i += 1;
                    }
                    got
                })
            })
            .collect();
        Clients { stop, tasks }
    }

    /// Stops the tasks (each finishes its current request) and returns
    /// everything they got, all tasks together.
    pub async fn stop(self) -> Vec<T> {
        self.stop.store(true, Ordering::Release);
        let mut all = Vec::new();
        for t in self.tasks {
            all.extend(t.await.expect("a client task panicked"));
        }
        all
    }
}

/// One answer as the clients record it.
#[derive(Debug, Clone)]
pub struct Answer {
    /// When the request was sent.
    pub sent: Instant,
    pub status: u16,
    pub body: Value,
}

/// Sends one V2 request and records the answer.
pub async fn infer(client: &reqwest::Client, url: &str, body: &Value) -> Answer {
    let sent = Instant::now();
    let r = client
        .post(url)
        .json(body)
        .send()
        .await
        .unwrap_or_else(|e| panic!("request to {url} failed: {e}"));
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    Answer { sent, status, body }
}

/// A `scalar_out` request (x: FP32 [1, 4]) whose row sum is 10 + i % 13 (never 0,
/// so the v1 answer `sum` and the v2 answer `2 * sum` differ).
pub fn scalar_request(i: usize) -> (Value, f64) {
    let a = (i % 13) as f64;
    let row = [1.0, 2.0 + a, 3.0, 4.0];
    let sum: f64 = row.iter().sum();
    let body = json!({"inputs": [v2_input("x", "FP32", &[1, 4], json!([row]))]});
    (body, sum)
}

/// Which version of `scalar_out` answered: `Some(1)` for the row sum,
/// `Some(2)` for twice it (`scalar_out_v2`), `None` for anything else.
pub fn scalar_version(answer: &Answer, sum: f64) -> Option<u8> {
    if answer.status != 200 {
        return None;
    }
    let got = flat_f64(&v2_output(&answer.body, "total")["data"]);
    match got.as_slice() {
        [v] if (v - sum).abs() < 1e-4 => Some(1),
        [v] if (v - 2.0 * sum).abs() < 1e-4 => Some(2),
        _ => None,
    }
}

/// An `mlp` request of 3 rows of the fixture, starting at row `i % 14`, with
/// the logits it must get.
pub fn mlp_request(i: usize) -> (Value, Vec<f64>) {
    let exp = mlp_fixture();
    let start = i % 14;
    let rows = exp["inputs"].as_array().unwrap()[start..start + 3].to_vec();
    let want = flat_f64(&Value::Array(
        exp["logits"].as_array().unwrap()[start..start + 3].to_vec(),
    ));
    let body = json!({"inputs": [v2_input("input", "FP32", &[3, 784], json!(rows))]});
    (body, want)
}

fn mlp_fixture() -> &'static Value {
    static EXP: std::sync::OnceLock<Value> = std::sync::OnceLock::new();
    EXP.get_or_init(|| fixture("mlp_expected.json"))
}

/// Asserts an mlp answer is 200 with the logits `want`.
pub fn assert_mlp(answer: &Answer, want: &[f64]) {
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_close(
        &flat_f64(&v2_output(&answer.body, "logits")["data"]),
        want,
        1e-4,
        "logits",
    );
}

/// A `digits` request (row `i % 64` of the fixture) and the label it must get.
pub fn digits_request(i: usize) -> (Value, i64) {
    static EXP: std::sync::OnceLock<Value> = std::sync::OnceLock::new();
    let exp = EXP.get_or_init(|| fixture("digits_expected.json"));
    let i = i % 64;
    let body = json!({"inputs": [v2_input("input", "FP32", &[1, 64], json!([exp["inputs"][i]]))]});
    (body, exp["labels"][i].as_i64().unwrap())
}

/// Clients that keep asking `digits` (another model, which a reload must
/// never disturb) and assert every answer is 200 and right.
pub fn bystander(s: &TestServer, n: usize) -> Clients<()> {
    let (client, url) = (s.client.clone(), s.url("/v2/models/digits/infer"));
    Clients::start(n, move |c, i| {
        let (client, url) = (client.clone(), url.clone());
        async move {
            let (body, label) = digits_request(c * 7 + i);
            let a = infer(&client, &url, &body).await;
            assert_eq!(a.status, 200, "digits disturbed: {}", a.body);
            assert_eq!(
                v2_output(&a.body, "label")["data"],
                json!([label]),
                "digits disturbed"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
}

/// The bytes of a fixture model's `model.onnx`.
pub fn model_bytes(from: &str) -> Vec<u8> {
    std::fs::read(root().join("tests/fixtures/models").join(from).join("model.onnx")).unwrap()
}
