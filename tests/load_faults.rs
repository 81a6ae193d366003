//! A load that failed is tried again when the model's files change or are
//! merely touched, in `on_demand` and `eager` residency (README, "Hot
//! reload"): a model file cut short then written back whole (the same
//! bytes, in place), external data taken away and put back, a model that
//! cannot be read at start repaired; a failed load answers 503 with the
//! repository-relative reason, and the index says since when. A model's
//! content is all its files: a new `weights.bin` beside a byte-identical
//! `model.onnx` serves the new weights. Expected values are arithmetic: the
//! `external` fixture answers y = x · w, w in its `weights.bin`.

mod common;
use common::reload::*;
use common::*;

use std::path::Path;

use serde_json::{json, Value};
use sluice::config::ResidencyMode;

/// The weights in the fixture's `weights.bin`, and in `external-weights-v2.bin`.
const W1: [f64; 4] = [1.0, 2.0, 3.0, 4.0];
const W2: [f64; 4] = [10.0, 20.0, 30.0, 40.0];

/// A request of two rows for the `external` model, and y = x · w for each `w`.
fn request(w: &[f64; 4]) -> (Value, Vec<f64>) {
    let rows = [[1.0, 0.5, 2.0, 3.0], [0.25, 4.0, 0.0, 1.0]];
    let y = rows
        .iter()
        .map(|r| r.iter().zip(w).map(|(x, w)| x * w).sum())
        .collect();
    (
        json!({"inputs": [v2_input("x", "FP32", &[2, 4], json!(rows))]}),
        y,
    )
}

/// One request to `model`: `Ok` when it answers y = x · `w`, else its status and body.
async fn ask(s: &TestServer, model: &str, w: &[f64; 4]) -> Result<(), (u16, Value)> {
    let (body, want) = request(w);
    let a = infer(&s.client, &s.url(&format!("/v2/models/{model}/infer")), &body).await;
    match a.status {
        200 if flat_f64(&v2_output(&a.body, "y")["data"]) == want => Ok(()),
        status => Err((status, a.body)),
    }
}

/// Waits until `model` answers with weights `w`.
async fn serves(s: &TestServer, model: &str, w: &[f64; 4]) {
    wait_for(&format!("`{model}` to answer with weights {w:?}"), || async {
        ask(s, model, w).await.ok()
    })
    .await;
}

/// Asserts a request to `model` is refused 503, with a reason that says it
/// failed to load, names `file` relative to the repository and not the
/// host's path of `repo`; returns the message.
async fn refused(s: &TestServer, repo: &Path, model: &str, file: &str) -> String {
    let (status, body) = ask(s, model, &W1)
        .await
        .expect_err("a model that cannot load answered");
    let message = error_message(&body);
    assert_eq!(status, 503, "{body}");
    assert!(message.contains("failed to load"), "{message}");
    assert!(message.contains(&format!("{model}/{file}")), "{message}");
    let host = repo.display().to_string();
    assert!(!message.contains(&host), "the host's path in {message}");
    message
}

/// A repository of copies of the `external` fixture, one per name.
fn repository(names: &[&str]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for name in names {
        copy_dir(
            &root().join("tests/fixtures/models/external"),
            &dir.path().join(name),
        );
    }
    dir
}

/// Writes `bytes` over `path` in place (same inode), as `cp` onto an existing file does.
fn write_in_place(path: &Path, bytes: &[u8]) {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(path)
        .unwrap();
    f.write_all(bytes).unwrap();
}

/// Writes `bytes` to a hidden file beside `path`, then renames it over `path`.
fn replace_by_rename(path: &Path, bytes: &[u8]) {
    let tmp = path.with_file_name(".incoming");
    std::fs::write(&tmp, bytes).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// New weights beside a byte-identical `model.onnx`, by rename and in
/// place, serve within seconds.
async fn new_weights_serve(s: &TestServer, model_dir: &Path, model: &str) {
    let weights = model_dir.join("weights.bin");
    let w1 = std::fs::read(&weights).unwrap();
    serves(s, model, &W1).await;
    replace_by_rename(
        &weights,
        &std::fs::read(root().join("tests/fixtures/external-weights-v2.bin")).unwrap(),
    );
    serves(s, model, &W2).await;
    write_in_place(&weights, &w1);
    serves(s, model, &W1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_demand_a_failed_load_is_retried_when_its_files_are_whole_again() {
    let repo = repository(&["missing", "cut", "swap"]);
    let r = repo.path();
    // `missing` starts without its external data.
    std::fs::rename(r.join("missing/weights.bin"), r.join("missing/.weights.bin")).unwrap();
    // A long debounce: `cut` is cut short and written back whole before the
    // repository looks again, so its load fails on a file whose content,
    // when next seen, is what it was.
    let s = TestServer::start_with(r, |c| {
        c.residency.mode = ResidencyMode::OnDemand;
        c.model_repository.debounce_seconds = 1.5;
    })
    .await;

    let why = refused(&s, r, "missing", "weights.bin").await;
    let entry = s.index_entry("missing").await.unwrap();
    let reason = entry["reason"].as_str().unwrap();
    assert!(
        reason.contains("failed to load (since ") && reason.contains(" GMT)"),
        "{entry}"
    );
    std::fs::rename(r.join("missing/.weights.bin"), r.join("missing/weights.bin")).unwrap();
    serves(&s, "missing", &W1).await;
    assert!(why.contains("missing/weights.bin"), "{why}");

    let model = r.join("cut/model.onnx");
    let whole = std::fs::read(&model).unwrap();
    write_in_place(&model, &whole[..whole.len() / 2]);
    refused(&s, r, "cut", "model.onnx").await;
    write_in_place(&model, &whole);
    serves(&s, "cut", &W1).await;

    new_weights_serve(&s, &r.join("swap"), "swap").await;
    s.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eager_a_model_that_could_not_load_at_start_loads_once_repaired() {
    let repo = repository(&["missing", "cut", "swap"]);
    let r = repo.path();
    std::fs::rename(r.join("missing/weights.bin"), r.join("missing/.weights.bin")).unwrap();
    let model = r.join("cut/model.onnx");
    let whole = std::fs::read(&model).unwrap();
    write_in_place(&model, &whole[..whole.len() / 2]);
    let s = TestServer::start_loaded(r, |c| c.residency.mode = ResidencyMode::Eager).await;
    for (name, file) in [("missing", "weights.bin"), ("cut", "model.onnx")] {
        let entry = s.wait_state(name, "UNAVAILABLE").await;
        assert!(
            entry["reason"].as_str().unwrap().contains("failed to load"),
            "{entry}"
        );
        refused(&s, r, name, file).await;
    }
    std::fs::rename(r.join("missing/.weights.bin"), r.join("missing/weights.bin")).unwrap();
    write_in_place(&model, &whole);
    serves(&s, "missing", &W1).await;
    serves(&s, "cut", &W1).await;
    new_weights_serve(&s, &r.join("swap"), "swap").await;
    s.stop().await.unwrap();
}

/// A permission restored (chmod 000, then 644) is a touch like any other.
/// Root reads a file of mode 000, so this only runs as another user.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_demand_a_permission_restored_loads_the_model() {
    use std::os::unix::fs::PermissionsExt;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        eprintln!("skipped: root reads files of mode 000");
        return;
    }
    let repo = repository(&["locked"]);
    let r = repo.path();
    let s = TestServer::start_with(r, |c| c.residency.mode = ResidencyMode::OnDemand).await;
    let model = r.join("locked/model.onnx");
    std::fs::set_permissions(&model, std::fs::Permissions::from_mode(0o000)).unwrap();
    wait_for("the locked model to be refused", || async {
        ask(&s, "locked", &W1)
            .await
            .err()
            .filter(|(status, _)| *status == 503)
    })
    .await;
    std::fs::set_permissions(&model, std::fs::Permissions::from_mode(0o644)).unwrap();
    serves(&s, "locked", &W1).await;
    s.stop().await.unwrap();
}
