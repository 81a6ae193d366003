//! The standard clients, unchanged, against a real sluice: NVIDIA's
//! `tritonclient` (HTTP with binary data on and off, gRPC; every datatype;
//! outputs equal to independent expected values), driven by
//! `tests/clients/test_tritonclient.py`, and `perf_analyzer` running a short
//! load over HTTP and gRPC with zero errors. Both come from
//! `scripts/setup-test-clients.sh` (`make test` runs it first).

mod common;

use std::process::Command;

use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tritonclient_http_and_grpc_every_datatype() {
    let python = python();
    let repo = repo_with(&["dtypes", "bf16", "digits", "mlp"]);
    let s = TestServer::start(repo.path()).await;
    let mut cmd = Command::new(python);
    cmd.arg(root().join("tests/clients/test_tritonclient.py"))
        .args(["--http", &s.addr.to_string(), "--grpc", &s.grpc_addr.to_string()])
        .arg("--fixtures")
        .arg(root().join("tests/fixtures"));
    let out = run(cmd).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "tritonclient checks failed:\n{stdout}");
    assert!(stdout.contains(" passed, 0 failed"), "{stdout}");
    s.stop().await.unwrap();
}

/// perf_analyzer's throughput line, e.g. "Throughput: 867.9 infer/sec".
fn throughput(stdout: &str) -> f64 {
    stdout
        .lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("Throughput: ")?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no throughput in perf_analyzer's output:\n{stdout}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn perf_analyzer_runs_a_short_load_over_http_and_grpc_without_errors() {
    let _ = python();
    let repo = repo_with(&["mlp"]);
    let s = TestServer::start(repo.path()).await;
    let runs: [(&str, String, &[&str]); 3] = [
        ("http", s.addr.to_string(), &[]),
        ("grpc", s.grpc_addr.to_string(), &[]),
        ("grpc", s.grpc_addr.to_string(), &["--streaming"]),
    ];
    for (protocol, url, extra) in runs {
        let mut cmd = Command::new(root().join("scripts/perf-analyzer.sh"));
        cmd.args(["-m", "mlp", "-i", protocol, "-u", &url, "-b", "2"])
            // Short windows; a wide stability band so a busy machine still settles.
            .args(["--concurrency-range", "4", "-p", "1000", "-s", "100", "-r", "10"])
            .args(extra);
        let out = run(cmd).await;
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "perf_analyzer over {protocol} {extra:?} failed:\n{stdout}"
        );
        assert!(throughput(&stdout) > 0.0, "{stdout}");
        assert!(!stdout.contains("rror"), "{stdout}");
    }
    // Server side: every request perf_analyzer sent succeeded.
    let (_, stats) = s.get("/v2/models/mlp/stats").await;
    let i = &stats["model_stats"][0]["inference_stats"];
    assert_eq!(i["fail"]["count"], 0, "{stats}");
    assert!(i["success"]["count"].as_u64().unwrap() > 100, "{stats}");
    s.stop().await.unwrap();
}
