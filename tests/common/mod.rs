//! Shared end-to-end test helpers: a temp model repository built from the
//! committed fixtures, and a real sluice server on 127.0.0.1 port 0 with
//! real ONNX Runtime, stopped through its shutdown future.
#![allow(dead_code)]

pub mod batching;
pub mod grpc;
pub mod minilm;
pub mod process;
pub mod prometheus;
pub mod reload;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use sluice::config::Config;
use sluice::runtime::onnx::{find_library, OnnxRuntime, SessionDefaults};

/// The crate root (fixtures and the default repository live under it).
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// ONNX Runtime for this test process (one environment per process).
pub fn runtime() -> Arc<OnnxRuntime> {
    let lib = find_library(None)
        .expect("ONNX Runtime not found: run scripts/fetch-onnxruntime.sh (make test does)");
    Arc::new(
        OnnxRuntime::init(&lib, SessionDefaults::from_config(&Config::default()))
            .expect("cannot load ONNX Runtime"),
    )
}

/// Copies a folder recursively.
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dest = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &dest);
        } else {
            std::fs::copy(e.path(), dest).unwrap();
        }
    }
}

/// A temp repository holding the named models, looked up in
/// `tests/fixtures/models/` then `model-repository/`.
pub fn repo_with(models: &[&str]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for m in models {
        let fixture = root().join("tests/fixtures/models").join(m);
        let src = if fixture.is_dir() {
            fixture
        } else {
            root().join("model-repository").join(m)
        };
        assert!(src.is_dir(), "no fixture model `{m}`");
        copy_dir(&src, &dir.path().join(m));
    }
    dir
}

/// Writes `dir/<model>/model-settings.json`.
pub fn write_settings(repo: &Path, model: &str, json: &str) {
    std::fs::write(repo.join(model).join("model-settings.json"), json).unwrap();
}

/// Copies fixture model `from` (tests/fixtures/models, then model-repository)
/// into `repo/<to>` and writes its settings.
pub fn add_model(repo: &Path, from: &str, to: &str, settings: &str) {
    let fixture = root().join("tests/fixtures/models").join(from);
    let src = if fixture.is_dir() {
        fixture
    } else {
        root().join("model-repository").join(from)
    };
    copy_dir(&src, &repo.join(to));
    write_settings(repo, to, settings);
}

/// A running server. Dropping it without `stop()` aborts it.
pub struct TestServer {
    pub addr: SocketAddr,
    /// The gRPC port's address.
    pub grpc_addr: SocketAddr,
    pub client: reqwest::Client,
    /// `http`, or `https` when the configuration turns TLS on.
    pub scheme: &'static str,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

impl TestServer {
    /// Starts a server on `repo` (port 0) and waits until it is ready.
    pub async fn start(repo: &Path) -> TestServer {
        Self::start_with(repo, |_| {}).await
    }

    /// As [`TestServer::start`], after `tweak` adjusts the configuration.
    pub async fn start_with(repo: &Path, tweak: impl FnOnce(&mut Config)) -> TestServer {
        Self::start_with_client(repo, tweak, reqwest::Client::new()).await
    }

    /// As [`TestServer::start_with`], talking through `client` (one that
    /// trusts the test's certificate authority when `tweak` turns TLS on).
    pub async fn start_with_client(
        repo: &Path,
        tweak: impl FnOnce(&mut Config),
        client: reqwest::Client,
    ) -> TestServer {
        Self::launch(repo, tweak, client, true).await
    }

    /// Starts a server on `repo`; with `wait_ready`, waits until it is ready.
    async fn launch(
        repo: &Path,
        tweak: impl FnOnce(&mut Config),
        client: reqwest::Client,
        wait_ready: bool,
    ) -> TestServer {
        let mut cfg = Config::default();
        cfg.http.host = [127, 0, 0, 1].into();
        cfg.http.port = 0;
        cfg.grpc.port = 0;
        cfg.model_repository.path = repo.to_path_buf();
        cfg.shutdown.grace_period_seconds = 5.0;
        // Most tests drive the repository API; tests/access.rs checks the
        // default ("none") itself.
        cfg.model_repository.control = sluice::config::ControlMode::Api;
        tweak(&mut cfg);
        let scheme = if cfg.tls.files().is_some() {
            "https"
        } else {
            "http"
        };
        let server = sluice::Server::bind(cfg, runtime()).await.expect("bind");
        let addr = server.http_addr();
        let grpc_addr = server.grpc_addr();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(server.run(async move {
            let _ = stopped.await;
        }));
        let s = TestServer {
            addr,
            grpc_addr,
            client,
            scheme,
            stop: Some(stop),
            task: Some(task),
        };
        if wait_ready {
            s.wait_ready().await;
        }
        s
    }

    /// As [`TestServer::start_with`], for a server that may never turn
    /// ready: waits until it is live and the repository's start-up load is
    /// over (the index lists at least one model, none of them loading).
    pub async fn start_loaded(repo: &Path, tweak: impl FnOnce(&mut Config)) -> TestServer {
        let s = Self::launch(repo, tweak, reqwest::Client::new(), false).await;
        for _ in 0..600 {
            let live = s.client.get(s.url("/v2/health/live")).send().await;
            if live.is_ok_and(|r| r.status() == 200) {
                let (_, index) = s.post("/v2/repository/index", &serde_json::json!({})).await;
                let entries = index.as_array().cloned().unwrap_or_default();
                if !entries.is_empty() && entries.iter().all(|e| e["state"] != "LOADING") {
                    return s;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("the start-up load did not end in 30 s");
    }

    /// `http://127.0.0.1:PORT{path}` (`https` with TLS)
    pub fn url(&self, path: &str) -> String {
        format!("{}://{}{path}", self.scheme, self.addr)
    }

    pub async fn wait_ready(&self) {
        for _ in 0..600 {
            if let Ok(r) = self.client.get(self.url("/v2/health/ready")).send().await {
                if r.status() == 200 {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("server did not turn ready in 30 s");
    }

    pub async fn get(&self, path: &str) -> (u16, serde_json::Value) {
        let r = self.client.get(self.url(path)).send().await.unwrap();
        let status = r.status().as_u16();
        let text = r.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)),
        )
    }

    pub async fn post(&self, path: &str, body: &serde_json::Value) -> (u16, serde_json::Value) {
        self.post_raw(path, serde_json::to_vec(body).unwrap()).await
    }

    pub async fn post_raw(&self, path: &str, body: Vec<u8>) -> (u16, serde_json::Value) {
        let r = self.client.post(self.url(path)).body(body).send().await.unwrap();
        let status = r.status().as_u16();
        let text = r.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)),
        )
    }

    /// Begins shutdown (the server drains) without waiting for it to exit.
    pub fn begin_stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }

    /// Whether the server has exited.
    pub fn has_exited(&self) -> bool {
        self.task.as_ref().is_none_or(|t| t.is_finished())
    }

    /// Begins shutdown (unless begun) and waits for the server to exit; returns its result.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        self.begin_stop();
        self.task.take().unwrap().await.unwrap()
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

/// Reads a JSON fixture from `tests/fixtures/`.
pub fn fixture(name: &str) -> serde_json::Value {
    let text = std::fs::read_to_string(root().join("tests/fixtures").join(name)).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// Asserts two float slices are equal within `tol` (absolute + relative).
pub fn assert_close(got: &[f64], want: &[f64], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * (1.0 + w.abs()),
            "{what}[{i}]: got {g}, want {w}"
        );
    }
}

/// Flattens nested JSON arrays of numbers into f64s.
pub fn flat_f64(v: &serde_json::Value) -> Vec<f64> {
    match v {
        serde_json::Value::Array(a) => a.iter().flat_map(flat_f64).collect(),
        serde_json::Value::Number(n) => vec![n.as_f64().unwrap()],
        other => panic!("not a number: {other}"),
    }
}

impl TestServer {
    /// GET returning the status and the raw body text.
    pub async fn get_raw(&self, path: &str) -> (u16, String) {
        let r = self.client.get(self.url(path)).send().await.unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    }

    /// `POST /v2/repository/index`, as a map from model name to its entry,
    /// each without its `memory` (a measurement; `tests/memory.rs` checks
    /// it) and its `batching`, which a serving model's entry must have.
    pub async fn index(&self) -> std::collections::BTreeMap<String, serde_json::Value> {
        let (st, body) = self.post("/v2/repository/index", &serde_json::json!({})).await;
        assert_eq!(st, 200, "{body}");
        let entries = body
            .as_array()
            .unwrap_or_else(|| panic!("index is not an array: {body}"));
        entries
            .iter()
            .map(|e| {
                let mut e = e.clone();
                let memory = e.as_object_mut().unwrap().remove("memory");
                let batching = e.as_object_mut().unwrap().remove("batching");
                if e["state"] == "READY" {
                    assert!(
                        memory.is_some_and(|m| m["weights_bytes"].is_u64()),
                        "no memory in {e}"
                    );
                    // `tests/models_as_they_come.rs` checks what it says.
                    assert!(batching.is_some_and(|b| b.is_string()), "no batching in {e}");
                }
                (e["name"].as_str().unwrap().to_string(), e)
            })
            .collect()
    }
}

/// One V2 request input.
pub fn v2_input(name: &str, datatype: &str, shape: &[usize], data: serde_json::Value) -> serde_json::Value {
    serde_json::json!({"name": name, "datatype": datatype, "shape": shape, "data": data})
}

/// The output `name` of a V2 response (panics, showing the response, when absent).
pub fn v2_output<'a>(resp: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    resp["outputs"]
        .as_array()
        .and_then(|outs| outs.iter().find(|o| o["name"] == name))
        .unwrap_or_else(|| panic!("no output `{name}` in {resp}"))
}

/// The message of an error body, asserting the body is exactly `{"error": "<non-empty>"}`.
pub fn error_message(body: &serde_json::Value) -> String {
    let obj = body
        .as_object()
        .unwrap_or_else(|| panic!("error body is not a JSON object: {body}"));
    assert_eq!(obj.len(), 1, "error body has other fields: {body}");
    let msg = obj["error"]
        .as_str()
        .unwrap_or_else(|| panic!("`error` is not a string: {body}"));
    assert!(!msg.is_empty(), "empty error message");
    msg.to_string()
}

/// The Python of the clients' virtual environment (`scripts/setup-test-clients.sh`).
pub fn python() -> PathBuf {
    let p = root().join(".venv-clients/bin/python");
    assert!(
        p.is_file(),
        "{} is missing: run scripts/setup-test-clients.sh (make test does)",
        p.display()
    );
    p
}

/// Runs a command to completion off the async runtime (the server under test
/// shares this runtime) and returns its output, printed for the test log.
pub async fn run(mut cmd: std::process::Command) -> std::process::Output {
    let shown = format!("{cmd:?}");
    let out = tokio::task::spawn_blocking(move || cmd.output().expect("cannot start the command"))
        .await
        .unwrap();
    println!(
        "$ {shown}\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}
