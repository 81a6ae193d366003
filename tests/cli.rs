//! The real `sluice` binary: `check`, the missing-library error, `--help`,
//! and `serve` on port 0 through SIGTERM. The child inherits ORT_DYLIB_PATH.

mod common;
use common::process::*;
use common::*;

use std::io::{Read, Write};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

/// Runs to completion (at most 30 s): (exit status, stdout, stderr).
fn run(mut cmd: Command) -> (ExitStatus, String, String) {
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let status = wait_for(&mut child, Duration::from_secs(30));
    let out = std::io::read_to_string(child.stdout.take().unwrap()).unwrap();
    let err = std::io::read_to_string(child.stderr.take().unwrap()).unwrap();
    (status, out, err)
}

#[test]
fn check_prints_the_signature() {
    let mut cmd = sluice();
    cmd.args(["check", "tests/fixtures/models/multi_io"]);
    let (status, out, err) = run(cmd);
    assert!(status.success(), "{status}: {out}\n{err}");
    assert!(out.starts_with("model multi_io OK"), "{out}");
    let sig: Vec<Vec<&str>> = out
        .lines()
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>())
        .filter(|w| matches!(w.first(), Some(&"input") | Some(&"output")))
        .collect();
    let want = [
        ["input", "a", "FP32"],
        ["input", "b", "INT64"],
        ["output", "sum", "FP32"],
        ["output", "scaled", "FP32"],
        ["output", "b_twice", "INT64"],
    ];
    assert_eq!(sig, want, "{out}");
    assert!(
        out.contains("[N, 3]") && out.contains("\"max_batch_size\": 8"),
        "{out}"
    );
    // The settings in force: an unset padding bound shows its CPU default.
    assert!(out.contains("\"max_padding_ratio\": 0.05"), "{out}");
}

/// A token id past MiniLM's vocabulary, which ONNX Runtime's `Gather`
/// rejects: a 400 naming the node and the value. The log does not repeat it
/// as an ONNX Runtime ERROR line (one per bad request a client sends),
/// unless `RUST_LOG` names `ort`, where the operator asked for ONNX
/// Runtime's messages.
#[tokio::test]
async fn a_rejected_token_is_a_400_and_onnx_runtime_logs_it_only_when_asked() {
    for (rust_log, ort_line) in [("info", false), ("info,ort=info", true)] {
        let repo = repo_with(&["minilm"]);
        write_settings(repo.path(), "minilm", r#"{"warmup": false}"#);
        let mut cmd = sluice();
        cmd.env("RUST_LOG", rust_log);
        let args = ["--model-repository".as_ref(), repo.path().as_os_str()];
        let (mut child, mut log, port) = spawn_serve(cmd, &args);
        let client = reqwest::Client::new();
        wait_ready(&client, port).await;
        let n = 6;
        let ids = json!([101, 2023, 1_000_000_000, 2003, 2742, 102]);
        let body = json!({"inputs": [
            v2_input("input_ids", "INT64", &[1, n], ids),
            v2_input("attention_mask", "INT64", &[1, n], json!(vec![1; n])),
            v2_input("token_type_ids", "INT64", &[1, n], json!(vec![0; n])),
        ]});
        let r = client
            .post(format!("http://127.0.0.1:{port}/v2/models/minilm/infer"))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400, "RUST_LOG={rust_log}");
        let err: serde_json::Value = r.json().await.unwrap();
        let msg = err["error"].as_str().unwrap_or_default();
        assert!(msg.contains("Gather") && msg.contains("idx=1000000000"), "{err}");
        sigterm(&child.0);
        assert_eq!(wait_for(&mut child.0, Duration::from_secs(30)).code(), Some(0));
        let lines = log.rest(Duration::from_secs(10)).join("\n");
        let logged = lines
            .lines()
            .any(|l| l.contains("ort::logging") && l.contains("ERROR") && l.contains("Gather"));
        assert_eq!(logged, ort_line, "RUST_LOG={rust_log}:\n{lines}");
    }
}

/// `sluice check` names each dynamic dim as the ONNX file does (what
/// `padding` goes by), shows the padding in force, and runs the load's own
/// checks of `padding`: a folder it passes is one the server loads.
#[test]
fn check_shows_the_padded_dims_and_refuses_padding_the_server_would() {
    let mut cmd = sluice();
    cmd.args(["check", "model-repository/minilm"]);
    let (status, out, err) = run(cmd);
    assert!(status.success(), "{status}: {out}\n{err}");
    let sig: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("input") || l.starts_with("output"))
        .collect();
    assert_eq!(sig.len(), 4, "{out}");
    assert!(
        sig[..3].iter().all(|l| l.ends_with("INT64  [batch, sequence]")),
        "{out}"
    );
    assert!(sig[3].ends_with("FP32   [batch, sequence, 384]"), "{out}");
    assert!(
        out.contains(
            "padding: `sequence` padded across requests (max_padding_ratio 0.05, max_batch_tokens 4096)"
        ),
        "{out}"
    );

    // `token_type_ids` shares `sequence` but has no pad value: `serve` refuses
    // to load it, and so must `check`.
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("minilm");
    std::fs::create_dir(&folder).unwrap();
    std::fs::copy("model-repository/minilm/model.onnx", folder.join("model.onnx")).unwrap();
    std::fs::write(
        folder.join("model-settings.json"),
        r#"{"padding": {"input_ids": 0, "attention_mask": 0}}"#,
    )
    .unwrap();
    let mut cmd = sluice();
    cmd.arg("check").arg(&folder);
    let (status, out, err) = run(cmd);
    assert_eq!(status.code(), Some(2), "{out}\n{err}");
    let errors: Vec<&str> = err.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "{err}");
    assert!(
        errors[0].contains("`token_type_ids`") && errors[0].contains("add `token_type_ids` to `padding`"),
        "{err}"
    );
}

#[test]
fn check_of_a_broken_model_fails_with_one_error_line() {
    let mut cmd = sluice();
    cmd.args(["check", "tests/fixtures/models/broken"]);
    let (status, out, err) = run(cmd);
    assert_eq!(status.code(), Some(2), "{out}\n{err}");
    let errors: Vec<&str> = err.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "{err}");
    assert!(errors[0].contains("broken/model.onnx"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

/// `sluice serve <flags>` that cannot load ONNX Runtime: exit code 2 and
/// exactly one stderr line, `error: ...`, naming `lib` and how to get it.
fn assert_library_error(mut cmd: Command, flags: &[&str], lib: &str) {
    let repo = repo_with(&["digits"]);
    cmd.arg("serve")
        .args(flags)
        .args(["--host", "127.0.0.1", "--http-port", "0", "--model-repository"])
        .arg(repo.path());
    let (status, _, err) = run(cmd);
    assert_eq!(status.code(), Some(2), "{err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "stderr is not one line:\n{err}");
    assert!(lines[0].starts_with("error: "), "{err}");
    assert!(
        lines[0].contains(lib) && lines[0].contains("scripts/fetch-onnxruntime.sh"),
        "{err}"
    );
}

#[test]
fn serve_without_the_library_says_how_to_get_it() {
    let mut cmd = sluice();
    cmd.env_remove("ORT_DYLIB_PATH");
    let lib = "/nonexistent/libonnxruntime.so";
    assert_library_error(cmd, &["--onnxruntime-library", lib], lib);
}

#[test]
fn serve_with_ort_dylib_path_at_a_non_library_fails_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let fake = dir.path().join("libonnxruntime.so.1.31.1");
    std::fs::write(&fake, "this is not a shared library\n").unwrap();
    let mut cmd = sluice();
    cmd.env("ORT_DYLIB_PATH", &fake);
    assert_library_error(cmd, &[], fake.to_str().unwrap());
}

#[test]
fn help_mentions_every_flag() {
    let mut cmd = sluice();
    cmd.arg("--help");
    let (status, top, _) = run(cmd);
    assert!(status.success());
    assert!(top.contains("serve") && top.contains("check"), "{top}");
    let mut cmd = sluice();
    cmd.args(["serve", "--help"]);
    let (status, serve, _) = run(cmd);
    assert!(status.success());
    for flag in [
        "--config",
        "--model-repository",
        "--model-name",
        "--host",
        "--http-port",
        "--grpc-port",
        "--onnxruntime-library",
    ] {
        assert!(serve.contains(flag), "serve --help lacks {flag}:\n{serve}");
    }
    let mut cmd = sluice();
    cmd.args(["check", "--help"]);
    let (status, check, _) = run(cmd);
    assert!(status.success());
    assert!(
        check.contains("--config") && check.contains("--onnxruntime-library"),
        "{check}"
    );
}

#[tokio::test]
async fn model_name_serves_a_kserve_mnt_models_folder_as_that_model() {
    let mnt = tempfile::tempdir().unwrap();
    std::fs::copy(
        root().join("model-repository/digits/model.onnx"),
        mnt.path().join("model.onnx"),
    )
    .unwrap();
    let args = [
        "--model-repository".as_ref(),
        mnt.path().as_os_str(),
        "--model-name".as_ref(),
        "my-isvc".as_ref(),
    ];
    let (mut child, mut log, port) = spawn_serve(sluice(), &args);
    let client = reqwest::Client::new();
    wait_ready(&client, port).await;
    log.wait_for(&["model ready", "model=my-isvc"], Duration::from_secs(5));
    let exp = fixture("digits_expected.json");
    let r: serde_json::Value = client
        .post(format!("http://127.0.0.1:{port}/v1/models/my-isvc:predict"))
        .json(&json!({"instances": [exp["inputs"][7]]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(r["predictions"][0]["label"], exp["labels"][7], "{r}");
    sigterm(&child);
    assert_eq!(wait_for(&mut child, Duration::from_secs(15)).code(), Some(0));
}

#[tokio::test]
async fn serve_on_port_0_logs_the_port_serves_and_exits_0_on_sigterm() {
    let repo = repo_with(&["digits", "scalar_out"]);
    let mut cmd = sluice();
    // MLServer-style global default: applies where model-settings.json is silent.
    cmd.env("SLUICE_MODEL_MAX_BATCH_SIZE", "4");
    // What Kubernetes writes into a pod for a Service named `sluice`: not
    // configuration, named once in the log, never a reason to stop.
    cmd.env("SLUICE_SERVICE_HOST", "10.96.0.12")
        .env("SLUICE_SERVICE_PORT", "8080")
        .env("SLUICE_PORT", "tcp://10.96.0.12:8080")
        .env("SLUICE_PORT_8080_TCP_ADDR", "10.96.0.12");
    let args = ["--model-repository".as_ref(), repo.path().as_os_str()];
    let (mut child, mut log, port) = spawn_serve(cmd, &args);
    log.wait_for(
        &[
            "are not configuration",
            "SLUICE_PORT, SLUICE_PORT_8080_TCP_ADDR, SLUICE_SERVICE_HOST",
        ],
        Duration::from_secs(5),
    );

    let client = reqwest::Client::new();
    let url = |p: &str| format!("http://127.0.0.1:{port}{p}");
    wait_ready(&client, port).await;
    let exp = fixture("digits_expected.json");
    let body = json!({"inputs": [v2_input("input", "FP32", &[1, 64], json!([exp["inputs"][3]]))]});
    let r: serde_json::Value = client
        .post(url("/v2/models/digits/infer"))
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v2_output(&r, "label")["data"], json!([exp["labels"][3]]), "{r}");
    // digits sets max_batch_size 32 itself; scalar_out's `{}` takes the env default.
    let limit = Duration::from_secs(30);
    let digits = log.wait_for(&["model ready", "model=digits"], limit);
    assert!(digits.contains(" max_batch_size=32"), "{digits}");
    let scalar = log.wait_for(&["model ready", "model=scalar_out"], limit);
    assert!(scalar.contains(" max_batch_size=4"), "{scalar}");
    drop(client);

    // A request in flight when SIGTERM arrives (its body half sent) is still
    // answered; meanwhile the port keeps answering: ready 503, live 200, and
    // new inference 503. `Expect: 100-continue` makes the server say when the
    // request has reached its handler, so SIGTERM surely comes after.
    let body = serde_json::to_vec(&body).unwrap();
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let head = format!(
        "POST /v2/models/digits/infer HTTP/1.1\r\nHost: sluice\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes()).unwrap();
    let mut continue_line = [0u8; 25];
    conn.read_exact(&mut continue_line).unwrap();
    assert_eq!(&continue_line, b"HTTP/1.1 100 Continue\r\n\r\n");
    conn.write_all(&body[..body.len() / 2]).unwrap();

    let killed = Instant::now();
    sigterm(&child);
    log.wait_for(&["SIGTERM received"], limit);
    // A new connection per request: the draining server closes idle ones,
    // and a pooled connection closed under a request fails it.
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let drain_limit = Duration::from_secs(30);
    let ready = poll_status(&client, &url("/v2/health/ready"), 503, drain_limit).await;
    assert_eq!(ready, 503, "readiness while draining");
    let live = client.get(url("/v2/health/live")).send().await.unwrap();
    assert_eq!(live.status(), 200);
    let refused = client
        .post(url("/v2/models/digits/infer"))
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 503);
    let refused: serde_json::Value = refused.json().await.unwrap();
    assert!(error_message(&refused).contains("shutting down"), "{refused}");
    drop(client);
    conn.write_all(&body[body.len() / 2..]).unwrap();
    let mut answer = String::new();
    conn.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let r: serde_json::Value = serde_json::from_str(answer.split("\r\n\r\n").nth(1).unwrap()).unwrap();
    assert_eq!(v2_output(&r, "label")["data"], json!([exp["labels"][3]]), "{r}");
    let status = wait_for(&mut child, Duration::from_secs(30));
    assert_eq!(status.code(), Some(0), "{}", log.seen.join("\n"));
    // Well before the grace period (30 s): the drain ended when the last request did.
    assert!(
        killed.elapsed() < Duration::from_secs(25),
        "took {:?} to exit",
        killed.elapsed()
    );
    log.wait_for(&["sluice stopped"], limit);
    // Every session thread dropped its session before the process exited
    // (else it waits up to 10 s and says so).
    let all = log.rest(Duration::from_secs(5));
    assert!(
        !all.iter().any(|l| l.contains("panicked")
            || l.contains("ERROR")
            || l.contains("session threads still running")),
        "{}",
        all.join("\n")
    );
    // Gone: nothing listens on the port any more.
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err());
}

/// Serves `repo` with `RUST_LOG=rust_log` and `extra` flags until digits is
/// ready, stops it, and returns its stderr lines.
async fn serve_log(repo: &std::path::Path, rust_log: &str, extra: &[&str]) -> Vec<String> {
    let mut cmd = sluice();
    cmd.env("RUST_LOG", rust_log);
    let mut args: Vec<&std::ffi::OsStr> = vec!["--model-repository".as_ref(), repo.as_os_str()];
    args.extend(extra.iter().map(std::ffi::OsStr::new));
    let (mut child, mut log, port) = spawn_serve(cmd, &args);
    wait_ready(&reqwest::Client::new(), port).await;
    log.wait_for(&["model ready", "digits"], Duration::from_secs(10));
    sigterm(&child);
    assert_eq!(wait_for(&mut child, Duration::from_secs(15)).code(), Some(0));
    log.wait_for(&["sluice stopped"], Duration::from_secs(5));
    log.seen
}

#[tokio::test]
async fn json_logs_carry_their_fields_and_onnx_runtime_stays_quiet_unless_named() {
    let repo = repo_with(&["digits"]);
    let lines = serve_log(repo.path(), "info", &["--log-format", "json"]).await;
    let events: Vec<serde_json::Value> = lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let ready = events
        .iter()
        .find(|e| e["message"] == "model ready")
        .unwrap_or_else(|| panic!("no `model ready` event: {lines:?}"));
    for key in ["timestamp", "level", "target", "model", "provider", "inputs"] {
        assert!(ready.get(key).is_some(), "`{key}` missing from {ready}");
    }
    assert_eq!(
        (&ready["level"], &ready["model"]),
        (&json!("INFO"), &json!("digits"))
    );
    // One short clause for the provider, no advice to install CUDA for `auto`.
    let provider = ready["provider"].as_str().unwrap();
    assert!(
        provider.starts_with("cpu (auto: ") || provider.starts_with("cuda:"),
        "{provider}"
    );
    assert!(!provider.contains("fetch-onnxruntime"), "{provider}");
    // RUST_LOG=info: nothing from ONNX Runtime; naming `ort` lets it speak.
    let from_ort = |lines: &[String]| lines.iter().filter(|l| l.contains("ort::")).count();
    assert_eq!(from_ort(&lines), 0, "{lines:#?}");
    let chatty = serve_log(repo.path(), "info,ort=info", &[]).await;
    assert!(from_ort(&chatty) > 10, "{chatty:#?}");
}

#[tokio::test]
async fn http_worker_threads_sets_the_async_runtimes_workers() {
    let repo = tempfile::tempdir().unwrap();
    for want in [1usize, 3] {
        let mut cmd = sluice();
        cmd.env("SLUICE_HTTP__WORKER_THREADS", want.to_string());
        let args = ["--model-repository".as_ref(), repo.path().as_os_str()];
        let (mut child, mut log, _port) = spawn_serve(cmd, &args);
        let line = log.wait_for(&["CPU thread budget"], Duration::from_secs(30));
        assert!(line.contains(&format!("async_worker_threads={want}")), "{line}");
        sigterm(&child);
        assert_eq!(wait_for(&mut child, Duration::from_secs(30)).code(), Some(0));
    }
}

/// `sluice check` on a Triton folder: the version that serves, and each
/// `config.pbtxt` field sluice does not honour, named with why.
#[test]
fn check_reads_a_triton_folder_and_names_what_it_does_not_honour() {
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("simple");
    copy_dir(
        &root().join("tests/fixtures/triton/model_repository/simple"),
        &folder,
    );
    let config = std::fs::read_to_string(folder.join("config.pbtxt")).unwrap()
        + "\ndynamic_batching { preferred_batch_size: [ 4 ] }\nresponse_cache { enable: true }\n";
    std::fs::write(folder.join("config.pbtxt"), config).unwrap();
    let mut cmd = sluice();
    cmd.arg("check").arg(&folder);
    let (status, out, err) = run(cmd);
    assert!(status.success(), "{status}: {out}\n{err}");
    assert!(
        out.starts_with("model simple OK") && out.contains("1/model.onnx"),
        "{out}"
    );
    let named: Vec<&str> = out.lines().filter(|l| l.starts_with("not honoured: ")).collect();
    assert_eq!(named.len(), 2, "{out}");
    assert!(
        named[0].contains("`dynamic_batching.preferred_batch_size`"),
        "{out}"
    );
    assert!(named[1].contains("`response_cache`"), "{out}");
    // Another platform: refused, naming it.
    std::fs::write(folder.join("config.pbtxt"), "platform: \"tensorrt_plan\"\n").unwrap();
    let mut cmd = sluice();
    cmd.arg("check").arg(&folder);
    let (status, out, err) = run(cmd);
    assert!(!status.success(), "{out}");
    assert!(err.contains("`platform` is \"tensorrt_plan\""), "{err}");
}

/// A `config.pbtxt`'s `model_warmup` samples are what the model warms up
/// with (`count` runs each); one that does not fit is named, and the model
/// warms up with zeros instead.
#[test]
fn check_runs_a_triton_folders_warmup_samples() {
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("simple");
    copy_dir(
        &root().join("tests/fixtures/triton/model_repository/simple"),
        &folder,
    );
    let base = std::fs::read_to_string(folder.join("config.pbtxt")).unwrap();
    let sample = |dims: &str| {
        format!(
            r#"{base}
model_warmup [ {{ name: "w" batch_size: 4 count: 2
  inputs {{ key: "INPUT0" value: {{ data_type: TYPE_INT32 dims: [ {dims} ] zero_data: true }} }}
  inputs {{ key: "INPUT1" value: {{ data_type: TYPE_INT32 dims: [ 16 ] random_data: true }} }} }} ]
"#
        )
    };
    let check = |config: String| {
        std::fs::write(folder.join("config.pbtxt"), config).unwrap();
        let mut cmd = sluice();
        cmd.arg("check").arg(&folder);
        let (status, out, err) = run(cmd);
        assert!(status.success(), "{status}: {out}\n{err}");
        out
    };
    let out = check(sample("16"));
    assert!(
        out.contains("warm-up samples: 2 request(s) from config.pbtxt's `model_warmup`"),
        "{out}"
    );
    assert!(!out.contains("not honoured"), "{out}");
    let out = check(sample("15"));
    assert!(
        out.contains("warm-up samples: skipped: `model_warmup` sample `w` does not fit the model"),
        "{out}"
    );
}

/// `sluice check` on a Triton version folder checks the model folder that
/// holds it, named as the folder (it used to name the model "1").
#[test]
fn check_of_a_version_folder_checks_its_model_named_as_its_folder() {
    let mut cmd = sluice();
    cmd.args(["check", "tests/fixtures/triton/model_repository/simple/1/"]);
    let (status, out, err) = run(cmd);
    assert!(status.success(), "{out}\n{err}");
    assert!(out.contains("is version 1 of the model folder"), "{out}");
    assert!(
        out.contains("model simple ") && !out.contains("model 1 "),
        "{out}"
    );
}
