//! Triton's own example clients (`src/python/examples` of
//! triton-inference-server/client, vendored unchanged in
//! `tests/clients/triton/`) against sluice serving Triton's own example
//! repository (`docs/examples/model_repository` of
//! triton-inference-server/server, in `tests/fixtures/triton/`: its ONNX
//! models and configs as they are; `simple_identity`, a Python-backend model
//! there, is an ONNX Identity here). Each client must exit 0 and print its
//! PASS line. Where a client checks Triton itself, not the protocol, a copy
//! is run with that one line changed: see [`PATCHES`].

mod common;

use std::path::Path;
use std::process::Command;

use common::*;

/// (client, gRPC or HTTP, the line it prints when it passes; `None`: it prints none, exit 0 is its pass).
const CLIENTS: &[(&str, bool, Option<&str>)] = &[
    ("simple_http_infer_client.py", false, None),
    ("simple_http_async_infer_client.py", false, None),
    ("simple_http_aio_infer_client.py", false, Some("PASS: infer")),
    ("simple_http_string_infer_client.py", false, Some("PASS: string")),
    ("simple_http_health_metadata.py", false, None),
    (
        "simple_http_shm_client.py",
        false,
        Some("PASS: system shared memory"),
    ),
    (
        "simple_http_shm_string_client.py",
        false,
        Some("PASS: system shared memory"),
    ),
    ("simple_grpc_infer_client.py", true, Some("PASS: infer")),
    (
        "simple_grpc_async_infer_client.py",
        true,
        Some("PASS: Async infer"),
    ),
    (
        "simple_grpc_aio_infer_client.py",
        true,
        Some("PASS: grpc aio infer"),
    ),
    ("simple_grpc_string_infer_client.py", true, Some("PASS: string")),
    ("simple_grpc_health_metadata.py", true, None),
    ("simple_grpc_keepalive_client.py", true, Some("PASS: KeepAlive")),
    (
        "simple_grpc_custom_args_client.py",
        true,
        Some("PASS: CustomArgs"),
    ),
    (
        "simple_grpc_shm_client.py",
        true,
        Some("PASS: system shared memory"),
    ),
    (
        "simple_grpc_shm_string_client.py",
        true,
        Some("PASS: system shared memory"),
    ),
    // Sequences (`simple_sequence`): the server fills START and READY; two
    // integer ids and a string id, over HTTP, gRPC and its stream.
    (
        "simple_http_sequence_sync_infer_client.py",
        false,
        Some("PASS: Sequence"),
    ),
    (
        "simple_grpc_sequence_sync_infer_client.py",
        true,
        Some("PASS: Sequence"),
    ),
    (
        "simple_grpc_sequence_stream_infer_client.py",
        true,
        Some("PASS: Sequence"),
    ),
    (
        "simple_grpc_aio_sequence_stream_infer_client.py",
        true,
        Some("PASS: grpc aio sequence stream"),
    ),
    // Last: they leave `simple` unloaded.
    ("simple_http_model_control.py", false, Some("PASS: model control")),
    ("simple_grpc_model_control.py", true, Some("PASS: model control")),
];

/// (client, line as shipped, line as run, why): the checks of Triton itself.
const PATCHES: &[(&str, &str, &str, &str)] = &[
    (
        "simple_http_health_metadata.py",
        r#"metadata["name"] == "triton""#,
        r#"metadata["name"] == "sluice""#,
        "the server's name",
    ),
    (
        "simple_grpc_health_metadata.py",
        r#"metadata.name == "triton""#,
        r#"metadata.name == "sluice""#,
        "the server's name",
    ),
    (
        "simple_http_model_control.py",
        "get_model_repository_index()) != 7",
        "get_model_repository_index()) != 8",
        "the example repository holds eight models; this client still counts seven (its gRPC twin counts eight)",
    ),
    (
        "simple_grpc_model_control.py",
        r#"e.status() != "StatusCode.INTERNAL""#,
        r#"e.status() != "StatusCode.INVALID_ARGUMENT""#,
        "a `file:` parameter is the client's mistake (Triton's own TODO there says INVALID_ARGUMENT)",
    ),
    (
        "simple_grpc_model_control.py",
        r#""failed to poll from model repository" not in e.message()"#,
        r#""is not supported" not in e.message()"#,
        "sluice refuses `file:` parameters, saying so, instead of failing to write them",
    ),
];

/// The client, with its patches applied, in `dir`.
fn prepared(client: &str, dir: &Path) -> std::path::PathBuf {
    let shipped = root().join("tests/clients/triton").join(client);
    let mut text = std::fs::read_to_string(&shipped).unwrap();
    for (_, from, to, why) in PATCHES.iter().filter(|p| p.0 == client) {
        assert!(
            text.contains(from),
            "{client} no longer has `{from}` ({why}): update PATCHES"
        );
        text = text.replace(from, to);
    }
    let path = dir.join(client);
    std::fs::write(&path, text).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tritons_example_clients_pass_against_tritons_example_repository() {
    let python = python();
    let repo = tempfile::tempdir().unwrap();
    copy_dir(
        &root().join("tests/fixtures/triton/model_repository"),
        repo.path(),
    );
    // Client shared memory is off by default (Triton's `--allow-client-shm`).
    let s = TestServer::start_with(repo.path(), |c| c.shared_memory.enabled = true).await;
    let scripts = tempfile::tempdir().unwrap();
    let mut failed = Vec::new();
    for (client, grpc, pass) in CLIENTS {
        let url = if *grpc { s.grpc_addr } else { s.addr };
        let mut cmd = Command::new(&python);
        cmd.arg(prepared(client, scripts.path()))
            .args(["-u", &url.to_string()]);
        let out = run(cmd).await;
        let stdout = String::from_utf8_lossy(&out.stdout);
        let passed = out.status.success() && pass.is_none_or(|line| stdout.lines().any(|l| l.trim() == line));
        if !passed {
            let stderr = String::from_utf8_lossy(&out.stderr);
            let tail: Vec<&str> = stdout.lines().chain(stderr.lines()).rev().take(4).collect();
            failed.push(format!("{client}: {}", tail.join(" | ")));
        }
    }
    assert!(
        failed.is_empty(),
        "{} of {} clients failed:\n{}",
        failed.len(),
        CLIENTS.len(),
        failed.join("\n")
    );
    s.stop().await.unwrap();
}
