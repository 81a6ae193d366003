//! Helpers of the batching tests (`tests/batching.rs`): repositories of
//! renamed fixture copies, V2 bodies, the `mlp` fixture rows, a POST that
//! keeps `Retry-After`, and deterministic pseudo-random numbers.

use serde_json::{json, Value};

use super::prometheus::Metrics;

use super::{copy_dir, fixture, flat_f64, root, write_settings, TestServer};

/// A temp repository of `(fixture, folder, settings)`: each a copy of a
/// fixture model (`tests/fixtures/models/` or `model-repository/`) under its
/// own folder name, with its own `model-settings.json`.
pub fn repo(models: &[(&str, &str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (fixture, folder, settings) in models {
        let test_model = root().join("tests/fixtures/models").join(fixture);
        let src = if test_model.is_dir() {
            test_model
        } else {
            root().join("model-repository").join(fixture)
        };
        copy_dir(&src, &dir.path().join(folder));
        write_settings(dir.path(), folder, settings);
    }
    dir
}

/// The 16 input rows of `mlp` and their logits, computed by Python ONNX Runtime.
pub struct MlpRows {
    pub inputs: Vec<Vec<f64>>,
    pub logits: Vec<Vec<f64>>,
}

pub fn mlp_rows() -> MlpRows {
    let f = fixture("mlp_expected.json");
    let rows = |key: &str| f[key].as_array().unwrap().iter().map(flat_f64).collect();
    MlpRows {
        inputs: rows("inputs"),
        logits: rows("logits"),
    }
}

/// A V2 body with one FP32 input of the given rows.
pub fn v2_body(input: &str, rows: &[Vec<f64>]) -> Value {
    json!({"inputs": [{
        "name": input, "shape": [rows.len(), rows[0].len()], "datatype": "FP32", "data": rows.concat()
    }]})
}

/// POSTs JSON; returns status, `Retry-After` and the body.
pub async fn post(client: &reqwest::Client, url: &str, body: &Value) -> (u16, Option<String>, Value) {
    let r = client.post(url).json(body).send().await.unwrap();
    let status = r.status().as_u16();
    let retry = r
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_string());
    let text = r.text().await.unwrap();
    (
        status,
        retry,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// `n` concurrent V2 requests of one row each (`[id, 0, 1, 2]`) for a copy
/// of `slow` named `model`, with request `parameters` (`Value::Null`:
/// none): how many were answered right (`2x`), and how many 504 with each
/// of `late` in the error. Any other answer fails the test.
pub async fn flood_slow(
    s: &TestServer,
    model: &str,
    n: usize,
    parameters: &Value,
    late: &[&str],
) -> (usize, usize) {
    let url = s.url(&format!("/v2/models/{model}/infer"));
    let tasks: Vec<_> = (0..n)
        .map(|id| {
            let rows = vec![vec![id as f64, 0.0, 1.0, 2.0]];
            let mut body = v2_body("x", &rows);
            if !parameters.is_null() {
                body["parameters"] = parameters.clone();
            }
            let (client, url) = (s.client.clone(), url.clone());
            tokio::spawn(async move { (rows, post(&client, &url, &body).await) })
        })
        .collect();
    let (mut ok, mut timed_out) = (0, 0);
    for t in tasks {
        let (rows, (status, _, body)) = t.await.unwrap();
        match status {
            200 => {
                assert_eq!(flat_f64(&body["outputs"][0]["data"]), doubled(&rows));
                ok += 1;
            }
            504 => {
                let e = body["error"].as_str().unwrap();
                assert!(late.iter().all(|l| e.contains(l)), "{e}");
                timed_out += 1;
            }
            other => panic!("unexpected status {other}: {body}"),
        }
    }
    (ok, timed_out)
}

/// `[[2x]]` of `[[x]]`, for the `slow` and `varlen` models.
pub fn doubled(rows: &[Vec<f64>]) -> Vec<f64> {
    rows.concat().iter().map(|x| x * 2.0).collect()
}

/// Deterministic pseudo-random numbers (no `rand` dependency).
pub struct Lcg(pub u64);

impl Lcg {
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

/// Asserts that no batch mixed requests of different `what` (each batch id's
/// keys are all equal) and that requests of equal `what` did share a batch.
/// `results`: (batch id, key) of each request.
pub fn assert_batches_group_equal(what: &str, results: impl IntoIterator<Item = (String, usize)>) {
    let mut by_batch: std::collections::BTreeMap<String, Vec<usize>> = Default::default();
    for (id, key) in results {
        by_batch.entry(id).or_default().push(key);
    }
    for (id, keys) in &by_batch {
        let distinct: std::collections::BTreeSet<_> = keys.iter().collect();
        assert_eq!(distinct.len(), 1, "batch {id} mixed {what} {keys:?}");
    }
    assert!(
        by_batch.values().any(|k| k.len() > 1),
        "requests of equal {what} should share batches: {by_batch:?}"
    );
}

/// Asserts, from `model`'s batch-size histogram, that each of the `rows`
/// sent ran exactly once and that its `requests` ran in fewer batches than
/// requests (some shared one); returns the number of batches.
pub fn assert_every_row_ran_once_batched(m: &Metrics, model: &str, rows: usize, requests: usize) -> f64 {
    let l = [("model", model)];
    let batches = m.sum("sluice_batch_size_count", &l);
    assert_eq!(
        m.sum("sluice_batch_size_sum", &l),
        rows as f64,
        "every row ran exactly once"
    );
    assert!(
        batches < requests as f64,
        "{batches} batches for {requests} requests: nothing was batched"
    );
    batches
}
