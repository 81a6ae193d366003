//! What a filesystem does cannot hang or silently break the server (SPEC
//! §3, §7), end to end against real ONNX Runtime: model
//! files that never end (a FIFO, `/dev/zero` through a symlink), a settings
//! file that is a FIFO, a serving model whose file turns into a FIFO, the
//! repository root moved away and back, and settings or folders that cannot
//! be read. Every test waits for a condition with a generous deadline
//! (`wait_for`), never for a fixed time.

mod common;
use common::process::{sigterm, sluice, spawn_serve, wait_for as wait_exit};
use common::reload::*;
use common::*;

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;

/// `sluice_repository_watching` is one gauge per process, and every server
/// sets it when it starts: the root-move test holds this for writing while
/// it reads the gauge; every other test of this file holds it for reading
/// while its server runs. (Tokio's lock: it is held across awaits, works
/// across the tests' runtimes, and a test that panics releases it.)
static GAUGE: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// Makes a FIFO at `path`; nothing ever writes to it.
fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path; mkfifo only creates a file.
    assert_eq!(
        unsafe { libc::mkfifo(c.as_ptr(), 0o644) },
        0,
        "mkfifo {}",
        path.display()
    );
}

/// A repository with `digits` (which must keep serving) and models whose
/// file never ends: `fifo_model` (model.onnx is a FIFO), `fifo_link` (a
/// symlink to a FIFO outside the repository), `zero_model` (a symlink to
/// `/dev/zero`), and `fifo_settings` (model-settings.json is a FIFO).
fn endless_repository(outside: &Path) -> tempfile::TempDir {
    let repo = repo_with(&["digits", "scalar_out"]);
    let r = repo.path();
    for m in ["fifo_model", "fifo_link", "zero_model"] {
        std::fs::create_dir(r.join(m)).unwrap();
        write_settings(r, m, "{}");
    }
    mkfifo(&r.join("fifo_model/model.onnx"));
    mkfifo(&outside.join("pipe"));
    std::os::unix::fs::symlink(outside.join("pipe"), r.join("fifo_link/model.onnx")).unwrap();
    std::os::unix::fs::symlink("/dev/zero", r.join("zero_model/model.onnx")).unwrap();
    copy_dir(&r.join("scalar_out"), &r.join("fifo_settings"));
    std::fs::remove_file(r.join("fifo_settings/model-settings.json")).unwrap();
    mkfifo(&r.join("fifo_settings/model-settings.json"));
    repo
}

/// Asserts each endless model is UNAVAILABLE with a reason naming its file
/// and saying it is not a regular file.
fn assert_refused(index: &std::collections::BTreeMap<String, Value>) {
    for (model, file, kind) in [
        ("fifo_model", "fifo_model/model.onnx", "a FIFO"),
        ("fifo_link", "fifo_link/model.onnx", "a FIFO"),
        ("zero_model", "zero_model/model.onnx", "a character device"),
        ("fifo_settings", "fifo_settings/model-settings.json", "a FIFO"),
    ] {
        let e = &index
            .get(model)
            .unwrap_or_else(|| panic!("`{model}` not in the index: {index:?}"));
        let reason = e["reason"].as_str().unwrap_or_default();
        assert_eq!(e["state"], "UNAVAILABLE", "{model}: {e}");
        assert!(
            reason.contains(file) && reason.contains("not a regular file") && reason.contains(kind),
            "{model}: {reason}"
        );
    }
}

/// Asserts `digits` answers a known request right.
async fn assert_digits_serve(s: &TestServer) {
    let (body, label) = digits_request(3);
    let a = infer(&s.client, &s.url("/v2/models/digits/infer"), &body).await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(v2_output(&a.body, "label")["data"], serde_json::json!([label]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_files_that_never_end_are_refused_and_the_server_stays_live() {
    let _gauge = GAUGE.read().await;
    let outside = tempfile::tempdir().unwrap();
    let repo = endless_repository(outside.path());
    // Ready means the start-up load finished: it did not hang on any file.
    let s = TestServer::start(repo.path()).await;
    assert_eq!(s.get_raw("/v2/health/live").await.0, 200);
    assert_digits_serve(&s).await;
    assert_refused(&s.index().await);
    // An API load of a refused model answers (with the reason) instead of hanging.
    let (st, body) = s
        .post("/v2/repository/models/fifo_model/load", &serde_json::json!({}))
        .await;
    assert_ne!(st, 200, "{body}");
    assert!(body.to_string().contains("not a regular file"), "{body}");
    // A rescan (a change elsewhere) does not hang on them either.
    add_model(repo.path(), "scalar_out", "late", "{}");
    s.wait_state("late", "READY").await;
    assert_digits_serve(&s).await;
    tokio::time::timeout(Duration::from_secs(30), s.stop())
        .await
        .expect("the server did not stop")
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_serving_model_whose_file_becomes_a_fifo_keeps_serving() {
    let _gauge = GAUGE.read().await;
    let repo = repo_with(&["digits", "scalar_out"]);
    let s = TestServer::start(repo.path()).await;
    let file = repo.path().join("scalar_out/model.onnx");
    let bytes = std::fs::read(&file).unwrap();
    // Replaced by rename, as an editor or a ConfigMap update replaces a file.
    let pipe = repo.path().join(".pipe");
    mkfifo(&pipe);
    std::fs::rename(&pipe, &file).unwrap();
    let entry = wait_for("the FIFO to be refused in the index", || async {
        s.index_entry("scalar_out").await.filter(|e| {
            e["reason"]
                .as_str()
                .is_some_and(|r| r.contains("not a regular file"))
        })
    })
    .await;
    assert_eq!(entry["state"], "READY", "{entry}");
    assert!(
        entry["reason"]
            .as_str()
            .unwrap()
            .contains("scalar_out/model.onnx"),
        "{entry}"
    );
    let (body, sum) = scalar_request(1);
    let a = infer(&s.client, &s.url("/v2/models/scalar_out/infer"), &body).await;
    assert_eq!(scalar_version(&a, sum), Some(1), "{a:?}");
    assert_eq!(s.get_raw("/v2/health/live").await.0, 200);
    assert_digits_serve(&s).await;
    // The same bytes back: the note goes, the same version serves on.
    std::fs::write(repo.path().join(".back"), &bytes).unwrap();
    std::fs::rename(repo.path().join(".back"), &file).unwrap();
    wait_for("the note to clear", || async {
        s.index_entry("scalar_out")
            .await
            .filter(|e| e["state"] == "READY" && e.get("reason").is_none())
    })
    .await;
    s.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_with_endless_model_files_turns_ready_and_stops_on_sigterm() {
    let outside = tempfile::tempdir().unwrap();
    let repo = endless_repository(outside.path());
    let args = ["--model-repository".as_ref(), repo.path().as_os_str()];
    let (mut child, _log, port) = spawn_serve(sluice(), &args);
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let url = |p: &str| format!("http://127.0.0.1:{port}{p}");
    wait_for("the server to turn ready", || async {
        let r = client.get(url("/v2/health/ready")).send().await.ok()?;
        (r.status() == 200).then_some(())
    })
    .await;
    let live = client.get(url("/v2/health/live")).send().await.unwrap();
    assert_eq!(live.status(), 200);
    let index: Vec<Value> = client
        .post(url("/v2/repository/index"))
        .json(&serde_json::json!({}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_refused(
        &index
            .into_iter()
            .map(|e| (e["name"].as_str().unwrap().to_string(), e))
            .collect(),
    );
    sigterm(&child);
    // SIGTERM stops the server (`wait_exit` panics after 20 s).
    assert_eq!(wait_exit(&mut child, Duration::from_secs(20)).code(), Some(0));
}

/// `sluice_repository_watching`, if the server exports it.
async fn watching(s: &TestServer) -> Option<f64> {
    let text = s.metrics().await;
    text.lines()
        .find(|l| l.starts_with("sluice_repository_watching "))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hot_reload_survives_the_repository_root_moving_away_and_back() {
    let _gauge = GAUGE.write().await;
    let parent = tempfile::tempdir().unwrap();
    let root = parent.path().join("repo");
    let away = parent.path().join("repo.away");
    copy_dir(repo_with(&["digits"]).path(), &root);
    let s = TestServer::start_with(&root, |c| c.model_repository.poll_interval_seconds = 0.2).await;

    std::fs::rename(&root, &away).unwrap();
    // At least ~1.5 s away; and (new code) until the watch is known lost, so
    // that the root really is gone when the watch is renewed.
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_millis(1500)
        || (watching(&s).await != Some(0.0) && t0.elapsed() < Duration::from_secs(10))
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    std::fs::rename(&away, &root).unwrap();
    assert_digits_serve(&s).await;

    // A model folder added after the root came back loads.
    add_model(&root, "scalar_out", "after_return", "{}");
    s.wait_state("after_return", "READY").await;
    // The event watch comes back (the gauge says so), and follows edits again.
    wait_for("sluice_repository_watching to be 1 again", || async {
        (watching(&s).await == Some(1.0)).then_some(())
    })
    .await;
    add_model(&root, "scalar_out", "after_rewatch", "{}");
    s.wait_state("after_rewatch", "READY").await;
    assert_digits_serve(&s).await;
    s.stop().await.unwrap();
}

/// In `on_demand` residency, models asked for while the repository root is
/// renamed away fail to load; once the root is back they load again at
/// their next request, although none of their files changed (they used to
/// stay failed until a file was touched).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_that_failed_while_the_root_was_away_load_once_it_is_back() {
    let _gauge = GAUGE.write().await;
    let parent = tempfile::tempdir().unwrap();
    let root = parent.path().join("repo");
    let away = parent.path().join("repo.away");
    copy_dir(repo_with(&["digits", "scalar_out"]).path(), &root);
    let s = TestServer::start_with(&root, |c| {
        c.residency.mode = sluice::config::ResidencyMode::OnDemand;
        c.model_repository.poll_interval_seconds = 0.2;
    })
    .await;
    std::fs::rename(&root, &away).unwrap();
    // Asked for while away: each load fails (the files are not there).
    let (body, _) = digits_request(3);
    let (sums, total) = scalar_request(0);
    let t0 = Instant::now();
    let mut refused = 0;
    while t0.elapsed() < Duration::from_millis(1500) {
        let a = infer(&s.client, &s.url("/v2/models/digits/infer"), &body).await;
        let b = infer(&s.client, &s.url("/v2/models/scalar_out/infer"), &sums).await;
        refused += (a.status != 200) as u32 + (b.status != 200) as u32;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(refused > 0, "no load failed while the root was away");
    std::fs::rename(&away, &root).unwrap();
    // Back: both serve again, right.
    wait_for("digits to serve again", || async {
        let a = infer(&s.client, &s.url("/v2/models/digits/infer"), &body).await;
        (a.status == 200).then_some(())
    })
    .await;
    assert_digits_serve(&s).await;
    wait_for("scalar_out to serve again", || async {
        let b = infer(&s.client, &s.url("/v2/models/scalar_out/infer"), &sums).await;
        (b.status == 200 && flat_f64(&v2_output(&b.body, "total")["data"]) == [total]).then_some(())
    })
    .await;
    s.stop().await.unwrap();
}

/// Replaces the symlink `link` by one to `target`, atomically (rename).
fn swap_link(link: &Path, target: &str) {
    let tmp = link.with_file_name(".swap");
    std::os::unix::fs::symlink(target, &tmp).unwrap();
    std::fs::rename(&tmp, link).unwrap();
}

/// Waits until `model` is READY with a reason containing `needle`.
async fn wait_refused(s: &TestServer, model: &str, needle: &str) -> String {
    let e = wait_for(&format!("`{model}` to keep serving with `{needle}`"), || async {
        s.index_entry(model)
            .await
            .filter(|e| e["reason"].as_str().is_some_and(|r| r.contains(needle)))
    })
    .await;
    assert_eq!(e["state"], "READY", "{e}");
    e["reason"].as_str().unwrap().to_string()
}

/// Asserts `model` (a copy of scalar_out) answers.
async fn assert_scalar_serves(s: &TestServer, model: &str) {
    let (body, sum) = scalar_request(2);
    let a = infer(&s.client, &s.url(&format!("/v2/models/{model}/infer")), &body).await;
    assert_eq!(scalar_version(&a, sum), Some(1), "{model}: {a:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settings_that_cannot_be_read_keep_the_last_good_version_serving() {
    let _gauge = GAUGE.read().await;
    let repo = repo_with(&["digits"]);
    let r = repo.path();
    // `plain` is named by its folder; `declared` by its settings' `name`.
    add_model(r, "scalar_out", "plain", "{}");
    add_model(r, "scalar_out", "declared_folder", r#"{"name": "declared"}"#);
    // The settings files are symlinks (as a ConfigMap's are), so they can be
    // swapped atomically for something unreadable.
    for folder in ["plain", "declared_folder"] {
        let d = r.join(folder);
        std::fs::rename(d.join("model-settings.json"), d.join(".settings")).unwrap();
        std::os::unix::fs::symlink(".settings", d.join("model-settings.json")).unwrap();
        std::fs::create_dir(d.join(".folder")).unwrap();
    }
    let s = TestServer::start(r).await;
    for (folder, model) in [("declared_folder", "declared"), ("plain", "plain")] {
        let settings = r.join(folder).join("model-settings.json");
        // A symlink loop (ELOOP), then a folder in place of the file (EISDIR's kin).
        swap_link(&settings, "model-settings.json");
        let why = wait_refused(&s, model, "symbolic links").await;
        assert!(why.contains(&format!("{folder}/model-settings.json")), "{why}");
        assert_scalar_serves(&s, model).await;
        swap_link(&settings, ".folder");
        wait_refused(&s, model, "not a regular file (a folder)").await;
        assert_scalar_serves(&s, model).await;
        swap_link(&settings, ".settings");
        wait_for(&format!("`{model}`'s note to clear"), || async {
            s.index_entry(model)
                .await
                .filter(|e| e["state"] == "READY" && e.get("reason").is_none())
        })
        .await;
    }
    assert!(
        s.index_entry("declared_folder").await.is_none(),
        "{:?}",
        s.index().await
    );
    s.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_folder_that_cannot_be_read_keeps_serving() {
    let _gauge = GAUGE.read().await;
    let repo = repo_with(&["digits"]);
    let r = repo.path();
    // The model folder is a symlink to a hidden folder (hidden ones are not
    // models), so that it can be swapped atomically for a symlink loop.
    add_model(r, "scalar_out", ".real", "{}");
    std::os::unix::fs::symlink(".real", r.join("linked")).unwrap();
    let s = TestServer::start(r).await;
    assert_scalar_serves(&s, "linked").await;
    swap_link(&r.join("linked"), "linked");
    let why = wait_refused(&s, "linked", "symbolic links").await;
    assert!(why.contains("linked"), "{why}");
    assert_scalar_serves(&s, "linked").await;
    swap_link(&r.join("linked"), ".real");
    wait_for("the note to clear", || async {
        s.index_entry("linked")
            .await
            .filter(|e| e["state"] == "READY" && e.get("reason").is_none())
    })
    .await;
    assert_scalar_serves(&s, "linked").await;
    s.stop().await.unwrap();
}
