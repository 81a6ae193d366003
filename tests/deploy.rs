//! The deployment files under `deploy/`, validated offline by
//! `tests/clients/validate_manifests.py` (in `.venv-clients`, from
//! `scripts/setup-test-clients.sh`): the Kubernetes manifests against
//! Kubernetes' schemas (`kubernetes-validate`, strict), the KServe ones against
//! the CRD schemas vendored in `tests/fixtures/kserve/`, the ConfigMap's
//! `sluice.toml` against `config/sluice.toml`, and every PromQL expression of
//! the Grafana dashboard and the alert rules against the `/metrics` of a real
//! sluice: each metric, label and label value they use must be there. The
//! ConfigMap's `sluice.toml` is also loaded by sluice's own configuration
//! loader, which refuses unknown keys and bad values.

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use common::*;
use serde_json::json;
use sluice::config::{CliOverrides, Config};

/// `validate_manifests.py --metrics-url URL` plus `extra` arguments.
fn validator(metrics_url: &str, extra: &[&str]) -> Command {
    let mut cmd = Command::new(python());
    cmd.arg(root().join("tests/clients/validate_manifests.py"))
        .arg("--root")
        .arg(root())
        .args(["--metrics-url", metrics_url])
        .args(extra);
    cmd
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manifests_validate_and_every_metric_they_use_exists() {
    let _ = python();
    // minilm (padding on, model-repository/minilm): the padding panel's series.
    let repo = repo_with(&["digits", "mlp", "minilm"]);
    // The alerts watch series that exist only once something happened: a
    // model whose queue holds one request that expires there (504,
    // `sluice_requests_dropped_total{reason="expired"}`) while a second is
    // refused (503 `overloaded`), and a model whose load fails
    // (`sluice_model_reloads_total{result="failed"}`).
    add_model(
        repo.path(),
        "digits",
        "slow",
        r#"{"batch_policy": "fixed", "max_batch_size": 4, "max_batch_time": 30, "timeout": 3, "max_queue_size": 1}"#,
    );
    add_model(repo.path(), "digits", "broken", r#"{"max_batch_sise": 4}"#);
    let s = TestServer::start(repo.path()).await;

    // V2 infers on digits first: its counters and histograms exist from then
    // on, and after a few runs its fitted batch cost and predicted queue wait
    // (what deploy/autoscaling scales on).
    let row = fixture("digits_expected.json")["inputs"][0].clone();
    let body = json!({"inputs": [v2_input("input", "FP32", &[1, 64], row)]});
    let t0 = std::time::Instant::now();
    loop {
        let (st, r) = s.post("/v2/models/digits/infer", &body).await;
        assert_eq!(st, 200, "{r}");
        let m = common::prometheus::Metrics::scrape(&s).await;
        if m.has("sluice_queue_wait_predicted_seconds", &[("model", "digits")]) {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "digits' predicted queue wait never appeared"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // One MiniLM sequence: sluice_batch_padding_ratio exists from then on.
    let inputs = [
        v2_input("input_ids", "INT64", &[1, 3], json!([101, 2000, 102])),
        v2_input("attention_mask", "INT64", &[1, 3], json!([1, 1, 1])),
        v2_input("token_type_ids", "INT64", &[1, 3], json!([0, 0, 0])),
    ];
    let (st, r) = s
        .post("/v2/models/minilm/infer", &json!({ "inputs": inputs }))
        .await;
    assert_eq!(st, 200, "{r}");
    // The second request is sent only once the first is seen queued, so the
    // order holds however slow the machine is.
    let (first, second) = tokio::join!(s.post("/v2/models/slow/infer", &body), async {
        let t0 = std::time::Instant::now();
        while common::prometheus::Metrics::scrape(&s)
            .await
            .sum("sluice_queue_size", &[("model", "slow")])
            < 1.0
        {
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "the first request never queued"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        s.post("/v2/models/slow/infer", &body).await
    });
    assert_eq!((first.0, second.0), (504, 503), "{first:?} {second:?}");
    assert_eq!(s.index().await["broken"]["state"], "UNAVAILABLE");

    let metrics = s.url("/metrics");
    let out = run(validator(&metrics, &[])).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "deploy/ does not validate:\n{stdout}");
    assert!(stdout.contains(" passed, 0 failed"), "{stdout}");
    for metric in [
        "sluice_model_memory_bytes",
        "sluice_batch_padding_ratio_sum",
        "sluice_batch_size_bucket",
        "sluice_queue_delay_seconds_bucket",
        "sluice_requests_dropped_total",
    ] {
        assert!(
            stdout.contains(&format!("metric {metric} is in /metrics")),
            "{metric} was not checked:\n{stdout}"
        );
    }

    // The checker itself: a made-up metric, label value and label are caught.
    let bogus = [
        "--extra-expr",
        "sum by (model) (rate(sluice_bogus_total[5m]))",
        "--extra-expr",
        r#"sum by (model) (rate(sluice_requests_total{status="overload"}[5m]))"#,
        "--extra-expr",
        r#"sluice_queue_size{model="digits", protocol="v2"}"#,
    ];
    let out = run(validator(&metrics, &bogus)).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "bogus expressions passed:\n{stdout}");
    assert!(stdout.contains("manifests: "), "{stdout}");
    for failure in [
        "FAIL  dashboard --extra-expr 0: metric sluice_bogus_total is in /metrics",
        r#"FAIL  dashboard --extra-expr 1: sluice_requests_total{status="overload"} is a value sluice reports"#,
        "FAIL  dashboard --extra-expr 2: sluice_queue_size has label protocol",
    ] {
        assert!(stdout.contains(failure), "missing {failure:?}:\n{stdout}");
    }
    assert!(stdout.contains(" 3 failed"), "{stdout}");
    s.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_configmaps_sluice_toml_loads_with_sluices_own_loader() {
    let dir = tempfile::tempdir().unwrap();
    let toml = dir.path().join("sluice.toml");
    let mut cmd = Command::new(python());
    cmd.arg(root().join("tests/clients/validate_manifests.py"))
        .arg("--root")
        .arg(root())
        .arg("--write-config")
        .arg(&toml);
    let out = run(cmd).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "deploy/ does not validate:\n{stdout}");
    let cfg = Config::load(Some(&toml), &CliOverrides::default())
        .unwrap_or_else(|e| panic!("deploy/k8s/configmap.yaml's sluice.toml: {e}"));
    cfg.validate()
        .unwrap_or_else(|e| panic!("deploy/k8s/configmap.yaml's sluice.toml: {e:?}"));
    // What the Deployment relies on (the grace period check is the script's).
    assert_eq!((cfg.http.port, cfg.grpc.port), (8080, 8081));
    assert_eq!(cfg.model_repository.path, PathBuf::from("/models"));
    assert_eq!(cfg.grace_period(), Duration::from_secs(30));
}
