//! OpenTelemetry traces end to end: the real `sluice` binary exports over
//! OTLP/HTTP to a receiver this test starts (tests/clients/otlp_receiver.py,
//! which decodes each export with the official `opentelemetry-proto`), with
//! the endpoint set only through `OTEL_EXPORTER_OTLP_ENDPOINT`. An HTTP V2
//! infer carries a `traceparent` header, a gRPC ModelInfer the same in its
//! metadata; the spans must continue those traces, and a refused request's
//! span must carry an error status. Sluice is stopped with
//! SIGTERM before the spans are read: it flushes them on the way out, so the
//! test waits for nothing but the process and the file.

mod common;
use common::process::{sluice, spawn_serve, wait_ready, Lines, Reaped};
use common::*;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sluice::protocol::grpc::inference::grpc_inference_service_client::GrpcInferenceServiceClient;

/// What the HTTP request sends: `traceparent: 00-<trace>-<parent>-01`.
const HTTP_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const HTTP_PARENT: &str = "00f067aa0ba902b7";
/// What the gRPC request sends in its metadata.
const GRPC_TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
const GRPC_PARENT: &str = "b7ad6b7169203331";
/// What the refused HTTP request (a wrong shape) sends.
const BAD_TRACE: &str = "5b8aa5a2d2c872e8321cf37308d69df2";
const BAD_PARENT: &str = "051581bf3cb55c13";

/// The OTLP receiver: its process and its port (from its `port N` line,
/// waited for at most 60 s).
fn start_receiver(out: &Path) -> (Reaped, u16) {
    let mut child = Reaped(
        Command::new(python())
            .arg(root().join("tests/clients/otlp_receiver.py"))
            .arg(out)
            .stdout(Stdio::piped())
            .spawn()
            .expect("cannot start the OTLP receiver"),
    );
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the OTLP receiver did not start");
    let port = line.strip_prefix("port ").and_then(|p| p.trim().parse().ok());
    (child, port.unwrap_or_else(|| panic!("not a port line: {line:?}")))
}

/// `sluice serve` on 127.0.0.1 ports 0 with `env` added to an environment
/// without RUST_LOG, SLUICE_* or OTEL_*: the process, its stderr lines, and
/// its HTTP and gRPC ports.
fn start_sluice(repo: &Path, env: &[(&str, String)]) -> (Reaped, Lines, u16, u16) {
    let mut cmd = sluice();
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("OTEL_")) {
        cmd.env_remove(k);
    }
    cmd.envs(env.iter().map(|(k, v)| (k, v)));
    let (child, mut log, http) = spawn_serve(cmd, &["--model-repository".as_ref(), repo.as_os_str()]);
    let listening = log.wait_for(&["sluice listening"], Duration::ZERO);
    let grpc = listening
        .split("grpc=127.0.0.1:")
        .nth(1)
        .and_then(|p| {
            p.chars()
                .take_while(char::is_ascii_digit)
                .collect::<String>()
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no gRPC address in {listening}"));
    (child, log, http, grpc)
}

/// SIGTERM, then the exit status (at most 60 s). Waits asynchronously: the
/// gRPC client's connection task runs on this runtime and must see the
/// server's GOAWAY and close, or the drain waits for it.
async fn stop(child: &mut Reaped) -> std::process::ExitStatus {
    let kill = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "sluice still running 60 s after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Every span the receiver wrote so far; fails on an export it could not decode.
fn read_spans(out: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(out).unwrap_or_default();
    let spans: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    if let Some(bad) = spans.iter().find(|s| s.get("error").is_some()) {
        panic!("the receiver refused an export: {bad}");
    }
    spans
}

/// The spans of the traces `ids`, once the receiver has every `infer`
/// span of them (polled, at most 30 s).
fn wait_spans(out: &Path, ids: &[&str]) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let spans = read_spans(out);
        let has = |id: &str| spans.iter().any(|s| s["name"] == "infer" && s["trace_id"] == id);
        if ids.iter().all(|id| has(id)) {
            return spans;
        }
        assert!(
            Instant::now() < deadline,
            "no infer span of {ids:?} in 30 s; got {spans:#?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The one span named `name` in the trace `trace` whose parent is `parent`.
fn one<'a>(spans: &'a [Value], trace: &str, name: &str, parent: &str) -> &'a Value {
    let found: Vec<&Value> = spans
        .iter()
        .filter(|s| s["trace_id"] == trace && s["name"] == name && s["parent_span_id"] == parent)
        .collect();
    assert_eq!(found.len(), 1, "{name} spans under {trace}/{parent}: {spans:#?}");
    found[0]
}

/// Checks one request's spans: `infer` continues the sent trace and
/// parent, `queue` and `encode` are its children, and a `batch` span
/// carries its batch id and size and links to it (and it back).
fn check_request(spans: &[Value], trace: &str, parent: &str, protocol: &str) {
    let infer = one(spans, trace, "infer", parent);
    let attrs = &infer["attributes"];
    assert_eq!(infer["kind"], 2, "infer is a server span: {infer}");
    assert_eq!(attrs["sluice.protocol"], protocol, "{infer}");
    assert_eq!(attrs["sluice.model.name"], "digits", "{infer}");
    assert_eq!(infer["status"]["code"], 0, "unset status (no error): {infer}");
    let id = infer["span_id"].as_str().unwrap();
    one(spans, trace, "queue", id);
    one(spans, trace, "encode", id);

    let batch_id = attrs["sluice.batch.id"]
        .as_str()
        .unwrap_or_else(|| panic!("no batch id: {infer}"));
    let link = json!({"trace_id": trace, "span_id": id});
    let batch = spans
        .iter()
        .find(|s| s["name"] == "batch" && s["attributes"]["sluice.batch.id"] == batch_id)
        .unwrap_or_else(|| panic!("no batch span {batch_id}: {spans:#?}"));
    assert!(batch["links"].as_array().unwrap().contains(&link), "{batch}");
    let b = &batch["attributes"];
    assert!(b["sluice.batch.size"].as_i64().is_some_and(|n| n >= 1), "{batch}");
    assert!(
        b["sluice.batch.requests"].as_i64().is_some_and(|n| n >= 1),
        "{batch}"
    );
    assert_eq!(b["sluice.model.name"], "digits", "{batch}");
    let back = json!({"trace_id": batch["trace_id"], "span_id": batch["span_id"]});
    assert!(infer["links"].as_array().unwrap().contains(&back), "{infer}");
}

#[tokio::test]
async fn requests_continue_the_callers_trace_with_queue_batch_and_encode_spans() {
    let dir = tempfile::tempdir().unwrap();
    let out: PathBuf = dir.path().join("spans.jsonl");
    let (_receiver, otlp_port) = start_receiver(&out);
    let repo = repo_with(&["digits"]);
    let endpoint = format!("http://127.0.0.1:{otlp_port}");
    let (mut sluice, mut log, http, grpc) =
        start_sluice(repo.path(), &[("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)]);
    log.wait_for(&["OpenTelemetry traces on"], Duration::ZERO);
    // No idle keep-alive connection left open while the server drains.
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    wait_ready(&client, http).await;

    // A V2 infer of `digits` under the caller's trace `trace`, span `parent`.
    let infer_traced = |body: serde_json::Value, trace: &str, parent: &str| {
        client
            .post(format!("http://127.0.0.1:{http}/v2/models/digits/infer"))
            .header("traceparent", format!("00-{trace}-{parent}-01"))
            .json(&body)
            .send()
    };
    let row = vec![0.5f32; 64];
    let body = json!({"inputs": [v2_input("input", "FP32", &[1, 64], json!(row))]});
    let r = infer_traced(body, HTTP_TRACE, HTTP_PARENT).await.unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());

    let channel = tonic::transport::Channel::from_shared(format!("http://127.0.0.1:{grpc}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let bad = json!({"inputs": [v2_input("input", "FP32", &[1, 3], json!([1.0, 2.0, 3.0]))]});
    let r = infer_traced(bad, BAD_TRACE, BAD_PARENT).await.unwrap();
    assert_eq!(r.status(), 400);

    let mut grpc_client = GrpcInferenceServiceClient::new(channel);
    let mut req = tonic::Request::new(grpc::infer_request("digits", "input", &[1, 64], &row));
    let traceparent = format!("00-{GRPC_TRACE}-{GRPC_PARENT}-01");
    req.metadata_mut()
        .insert("traceparent", traceparent.parse().unwrap());
    grpc_client.model_infer(req).await.unwrap();
    drop(grpc_client);

    let status = stop(&mut sluice).await;
    assert_eq!(status.code(), Some(0), "{}", log.seen.join("\n"));
    let spans = wait_spans(&out, &[HTTP_TRACE, GRPC_TRACE, BAD_TRACE]);
    check_request(&spans, HTTP_TRACE, HTTP_PARENT, "v2");
    check_request(&spans, GRPC_TRACE, GRPC_PARENT, "grpc");
    // The refused request: an error status naming the kind, and no batch.
    let refused = one(&spans, BAD_TRACE, "infer", BAD_PARENT);
    assert_eq!(refused["status"]["code"], 2, "{refused}");
    assert_eq!(refused["attributes"]["error.type"], "invalid_input", "{refused}");
    assert!(
        refused["attributes"].get("sluice.batch.id").is_none(),
        "{refused}"
    );
    assert_eq!(
        spans.iter().filter(|s| s["trace_id"] == BAD_TRACE).count(),
        1,
        "{spans:#?}"
    );
    let services: BTreeMap<&str, usize> = spans.iter().fold(BTreeMap::new(), |mut m, s| {
        *m.entry(s["resource"]["service.name"].as_str().unwrap_or("<none>"))
            .or_default() += 1;
        m
    });
    assert_eq!(services.keys().collect::<Vec<_>>(), [&"sluice"], "{services:?}");
}
