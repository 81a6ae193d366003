//! Hot reload end to end (SPEC §7): real files in a temp repository, a real
//! server watching it, real ONNX Runtime. Every test waits for a condition
//! (a reload counter in `/metrics`, a state in the repository index), never
//! for a fixed time; the only sleeps check that nothing more happens.
//! The metrics recorder is shared by every test of this binary, so each test
//! uses model folders of its own and compares counters before and after.

mod common;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::reload::*;
use common::*;
use serde_json::json;
use sluice::config::WatchMode;

/// Longer than several debounce periods (0.25 s by default): after a
/// change's reload, this long without another shows the change was one.
const SETTLE: Duration = Duration::from_millis(1500);

/// Sends `requests` mlp requests from each of `clients` concurrent tasks to
/// `model` and asserts every answer is right.
async fn mlp_load(s: &TestServer, model: &str, clients: usize, requests: usize) {
    let url = s.url(&format!("/v2/models/{model}/infer"));
    let tasks: Vec<_> = (0..clients)
        .map(|c| {
            let (client, url) = (s.client.clone(), url.clone());
            tokio::spawn(async move {
                for i in 0..requests {
                    let (body, want) = mlp_request(c * 5 + i);
                    assert_mlp(&infer(&client, &url, &body).await, &want);
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("an mlp client failed");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settings_edit_changes_batch_sizes_without_new_sessions() {
    let repo = repo_with(&["digits"]);
    let m = "live_mlp";
    let settings = |max: usize| {
        format!(r#"{{"max_batch_size": {max}, "max_batch_time": 0.05, "batch_policy": "fixed"}}"#)
    };
    add_model(repo.path(), "mlp", m, &settings(32));
    let s = TestServer::start(repo.path()).await;
    let others = bystander(&s, 1);

    // max_batch_size 32: concurrent 3-row requests share batches.
    let (count0, small0) = s.batch_sizes(m, 4).await;
    mlp_load(&s, m, 8, 6).await;
    let (count1, small1) = s.batch_sizes(m, 4).await;
    assert!(count1 > count0, "no batch recorded");
    assert!(
        (count1 - small1) - (count0 - small0) > 0.0,
        "no batch of more than 4 rows under concurrent load with max_batch_size 32"
    );

    // The edit applies in place: `updated` moves, no new sessions (`reloaded` stays).
    let [_, reloaded0, updated0, _, _] = s.reload_counts(m).await;
    write_settings(repo.path(), m, &settings(2));
    s.wait_reloads(m, "updated", updated0 + 1.0).await;

    let (count2, small2) = s.batch_sizes(m, 2).await;
    mlp_load(&s, m, 8, 6).await;
    let (count3, small3) = s.batch_sizes(m, 2).await;
    assert!(count3 > count2, "no batch recorded after the edit");
    assert_eq!(
        small3 - small2,
        count3 - count2,
        "a batch of more than 2 rows after max_batch_size was set to 2"
    );
    let [loaded, reloaded, updated, failed, _] = s.reload_counts(m).await;
    assert_eq!(
        (loaded, reloaded, updated, failed),
        (1.0, reloaded0, updated0 + 1.0, 0.0)
    );
    others.stop().await;
    s.stop().await.unwrap();
}

/// One way of saving a model's settings, as editors and Kubernetes do.
#[derive(Debug, Clone, Copy)]
enum Save {
    /// `std::fs::write` over the file (truncate, then write).
    InPlace,
    /// Write a temp file in the same folder, rename it over the file.
    WriteRename,
    /// A ConfigMap volume: the files are symlinks through `..data`, which is
    /// itself a symlink to a timestamped folder; an update writes a new
    /// folder, points `..data_tmp` at it, renames `..data_tmp` over `..data`
    /// and deletes the old folder.
    ConfigMap,
}

fn v_settings(version: u32) -> String {
    format!(
        r#"{{"max_batch_size": {}, "parameters": {{"version": "{version}"}}}}"#,
        4 * version
    )
}

/// Lays out `repo/<model>` as a ConfigMap volume holding scalar_out with
/// the settings of version 1.
fn configmap_model(repo: &Path, model: &str) {
    let dir = repo.join(model);
    let data = dir.join("..2026_01_01_00_00_00.000000001");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("model.onnx"), model_bytes("scalar_out")).unwrap();
    std::fs::write(data.join("model-settings.json"), v_settings(1)).unwrap();
    let link = |to: &str, at: &str| std::os::unix::fs::symlink(to, dir.join(at)).unwrap();
    link("..2026_01_01_00_00_00.000000001", "..data");
    link("..data/model.onnx", "model.onnx");
    link("..data/model-settings.json", "model-settings.json");
}

/// The kubelet's update of a ConfigMap volume (AtomicWriter): every file
/// is written anew in a new timestamped folder, then `..data` swaps.
fn configmap_update(repo: &Path, model: &str, settings: &str) {
    let dir = repo.join(model);
    let old = std::fs::read_link(dir.join("..data")).unwrap();
    let new = "..2026_01_02_00_00_00.000000002";
    std::fs::create_dir(dir.join(new)).unwrap();
    std::fs::write(dir.join(new).join("model.onnx"), model_bytes("scalar_out")).unwrap();
    std::fs::write(dir.join(new).join("model-settings.json"), settings).unwrap();
    std::os::unix::fs::symlink(new, dir.join("..data_tmp")).unwrap();
    std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
    std::fs::remove_dir_all(dir.join(old)).unwrap();
}

async fn one_save_is_one_reload(save: Save) {
    let repo = repo_with(&[]);
    let m = &format!("save_{save:?}").to_lowercase();
    match save {
        Save::ConfigMap => configmap_model(repo.path(), m),
        _ => add_model(repo.path(), "scalar_out", m, &v_settings(1)),
    }
    let s = TestServer::start(repo.path()).await;
    assert_eq!(s.wait_state(m, "READY").await["version"], "1");
    let before = s.reload_counts(m).await;
    assert_eq!(before, [1.0, 0.0, 0.0, 0.0, 0.0], "start-up load of {m}");

    let file = repo.path().join(m).join("model-settings.json");
    match save {
        Save::InPlace => std::fs::write(&file, v_settings(2)).unwrap(),
        Save::WriteRename => {
            let tmp = repo.path().join(m).join(".model-settings.json.swp");
            std::fs::write(&tmp, v_settings(2)).unwrap();
            std::fs::rename(&tmp, &file).unwrap();
        }
        Save::ConfigMap => configmap_update(repo.path(), m, &v_settings(2)),
    }
    wait_for("the new version in the index", || async {
        s.index_entry(m).await.filter(|e| e["version"] == "2")
    })
    .await;
    tokio::time::sleep(SETTLE).await;
    let [loaded, reloaded, updated, failed, unloaded] = s.reload_counts(m).await;
    // Only settings changed (a ConfigMap rewrites model.onnx with the same
    // bytes): applied in place, no session rebuilt.
    assert_eq!(
        (loaded, reloaded, updated, failed, unloaded),
        (1.0, 0.0, 1.0, 0.0, 0.0),
        "{save:?}: want exactly one in-place update (reloaded {reloaded}, updated {updated}, failed {failed})"
    );
    let entry = s.index_entry(m).await.unwrap();
    assert_eq!(entry, json!({"name": m, "version": "2", "state": "READY"}));
    let (body, sum) = scalar_request(3);
    let a = infer(&s.client, &s.url(&format!("/v2/models/{m}/infer")), &body).await;
    assert_eq!(scalar_version(&a, sum), Some(1), "{}", a.body);
    s.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_in_place_write_is_one_reload() {
    one_save_is_one_reload(Save::InPlace).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_and_rename_is_one_reload() {
    one_save_is_one_reload(Save::WriteRename).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configmap_symlink_swap_is_one_reload() {
    one_save_is_one_reload(Save::ConfigMap).await;
}

/// Runs concurrent one-row scalar_out requests against `model` (served with
/// `max_batch_size` 2, fixed policy) and asserts: all answered right, and no
/// batch held more than 2 rows (with the default of 32 they would share).
async fn serves_with_batches_of_2(s: &TestServer, model: &str) {
    let (count0, small0) = s.batch_sizes(model, 2).await;
    let url = s.url(&format!("/v2/models/{model}/infer"));
    let tasks: Vec<_> = (0..8)
        .map(|c| {
            let (client, url) = (s.client.clone(), url.clone());
            tokio::spawn(async move {
                for i in 0..4 {
                    let (body, sum) = scalar_request(c + i);
                    let a = infer(&client, &url, &body).await;
                    assert_eq!(scalar_version(&a, sum), Some(1), "{}", a.body);
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("a client failed");
    }
    let (count1, small1) = s.batch_sizes(model, 2).await;
    assert!(count1 > count0, "no batch recorded");
    assert_eq!(small1 - small0, count1 - count0, "a batch of more than 2 rows");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_settings_keep_the_old_settings_serving_and_are_reported() {
    let repo = repo_with(&["digits"]);
    let m = "fussy";
    let good = |v: u32| {
        format!(
            r#"{{"max_batch_size": 2, "max_batch_time": 0.02, "batch_policy": "fixed", "parameters": {{"version": "{v}"}}}}"#
        )
    };
    add_model(repo.path(), "scalar_out", m, &good(1));
    let s = TestServer::start(repo.path()).await;
    let others = bystander(&s, 1);
    serves_with_batches_of_2(&s, m).await;

    // (what is written, what the reason must name, the good edit after it: the
    // same settings as before the breakage, or a new version)
    let cases = [
        (r#"{"max_batch_size": 2,"#.to_string(), "invalid JSON", 1),
        (
            r#"{"max_batch_size": 2, "max_batch_sise": 40, "batch_policy": "fixed"}"#.to_string(),
            "max_batch_sise",
            2,
        ),
        (
            r#"{"max_batch_size": -3, "batch_policy": "fixed"}"#.to_string(),
            "max_batch_size",
            2,
        ),
        (r#"{"batch_policy": "eager"}"#.to_string(), "batch_policy", 3),
    ];
    let mut version = 1;
    for (bad, names, next) in cases {
        let failed = s.reloads(m, "failed").await;
        write_settings(repo.path(), m, &bad);
        s.wait_reloads(m, "failed", failed + 1.0).await;
        let entry = s.index_entry(m).await.unwrap();
        assert_eq!(
            (&entry["state"], &entry["version"]),
            (&json!("READY"), &json!(version.to_string())),
            "{entry}"
        );
        let reason = entry["reason"]
            .as_str()
            .unwrap_or_else(|| panic!("no reason: {entry}"));
        assert!(reason.contains(names), "reason should name `{names}`: {reason}");
        // The old settings serve: answers right, still at most 2 rows a batch.
        serves_with_batches_of_2(&s, m).await;

        // A good edit recovers: the reason goes.
        write_settings(repo.path(), m, &good(next));
        let entry = wait_for("the reason to go after a good edit", || async {
            s.index_entry(m).await.filter(|e| e.get("reason").is_none())
        })
        .await;
        version = next;
        assert_eq!(
            entry,
            json!({"name": m, "version": version.to_string(), "state": "READY"})
        );
        serves_with_batches_of_2(&s, m).await;
    }
    let [loaded, reloaded, _, failed, _] = s.reload_counts(m).await;
    assert_eq!((loaded, reloaded, failed), (1.0, 0.0, 4.0));
    others.stop().await;
    s.stop().await.unwrap();
}

/// How `model.onnx` is replaced.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Replace {
    /// Write `model.onnx.tmp`, rename it over `model.onnx`.
    Rename,
    /// Overwrite `model.onnx` in place (a reader may see it half-written).
    InPlace,
}

/// Answers of a scalar_out client: which version answered, and the answer.
type ScalarAnswer = (Option<u8>, Answer);

/// `n` clients sending one-row requests to scalar_out-like `model` until
/// stopped (client `c`'s request `i` uses row `c * stride + i`), and a count
/// of the answers so far.
fn scalar_clients(
    s: &TestServer,
    model: &str,
    n: usize,
    stride: usize,
) -> (Clients<ScalarAnswer>, Arc<AtomicUsize>) {
    let answered = Arc::new(AtomicUsize::new(0));
    let (client, url) = (s.client.clone(), s.url(&format!("/v2/models/{model}/infer")));
    let count = answered.clone();
    let clients = Clients::start(n, move |c, i| {
        let (client, url, count) = (client.clone(), url.clone(), count.clone());
        async move {
            let (body, sum) = scalar_request(c * stride + i);
            let a = infer(&client, &url, &body).await;
            count.fetch_add(1, Ordering::Relaxed);
            (scalar_version(&a, sum), a)
        }
    });
    (clients, answered)
}

/// Waits until the clients have had `n` answers.
async fn wait_answers(answered: &AtomicUsize, n: usize) {
    wait_for(&format!("{n} answers"), || async {
        (answered.load(Ordering::Relaxed) >= n).then_some(())
    })
    .await
}

/// scalar_out serves; clients send continuously; model.onnx becomes
/// scalar_out_v2 (same signature, twice the values). Every request gets 200
/// with the old or the new values, and every request sent after the swap
/// (the `reloaded` counter moved) gets the new ones.
async fn replace_model_file_under_load(how: Replace) {
    let repo = repo_with(&["digits"]);
    let m = &format!("swap_{how:?}").to_lowercase();
    add_model(repo.path(), "scalar_out", m, r#"{"max_batch_size": 8}"#);
    let s = TestServer::start(repo.path()).await;
    let others = bystander(&s, 1);
    let (clients, answered) = scalar_clients(&s, m, 6, 31);
    wait_answers(&answered, 50).await;

    let reloaded = s.reloads(m, "reloaded").await;
    let file = repo.path().join(m).join("model.onnx");
    match how {
        Replace::Rename => {
            let tmp = repo.path().join(m).join("model.onnx.tmp");
            std::fs::write(&tmp, model_bytes("scalar_out_v2")).unwrap();
            std::fs::rename(&tmp, &file).unwrap();
        }
        Replace::InPlace => std::fs::write(&file, model_bytes("scalar_out_v2")).unwrap(),
    }
    s.wait_reloads(m, "reloaded", reloaded + 1.0).await;
    let swapped = Instant::now();
    wait_answers(&answered, answered.load(Ordering::Relaxed) + 50).await;
    let answers = clients.stop().await;
    others.stop().await;

    for (version, a) in &answers {
        assert!(
            version.is_some(),
            "a request failed or got wrong values: {} {}",
            a.status,
            a.body
        );
        if a.sent > swapped {
            assert_eq!(*version, Some(2), "old values after the swap: {}", a.body);
        }
    }
    let old = answers.iter().filter(|(v, _)| *v == Some(1)).count();
    let new = answers.iter().filter(|(v, _)| *v == Some(2)).count();
    // 50 answers before the swap; 50 after it, of which at most one per
    // client was sent before it.
    assert!(old >= 50 && new >= 40, "old {old}, new {new}");
    let [loaded, reloaded, _, failed, _] = s.reload_counts(m).await;
    assert_eq!((loaded, reloaded), (1.0, 1.0));
    if how == Replace::Rename {
        assert_eq!(failed, 0.0, "a rename never shows a half-written file");
    }
    s.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replacing_model_onnx_by_rename_under_load_fails_no_request() {
    replace_model_file_under_load(Replace::Rename).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overwriting_model_onnx_in_place_under_load_fails_no_request() {
    replace_model_file_under_load(Replace::InPlace).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_a_folder_under_load_answers_every_accepted_request() {
    let repo = repo_with(&["digits"]);
    let m = "doomed";
    add_model(repo.path(), "scalar_out", m, "{}");
    let s = TestServer::start(repo.path()).await;
    let others = bystander(&s, 1);
    let (clients, answered) = scalar_clients(&s, m, 4, 17);
    wait_answers(&answered, 40).await;
    let unloaded = s.reloads(m, "unloaded").await;
    std::fs::remove_dir_all(repo.path().join(m)).unwrap();
    wait_for("the removed model to leave the index", || async {
        s.index_entry(m).await.is_none().then_some(())
    })
    .await;
    let gone = Instant::now();
    wait_answers(&answered, answered.load(Ordering::Relaxed) + 40).await;
    let answers = clients.stop().await;
    others.stop().await;

    for (version, a) in &answers {
        match a.status {
            200 => assert_eq!(*version, Some(1), "wrong values: {}", a.body),
            404 => assert!(error_message(&a.body).contains(m), "{}", a.body),
            _ => panic!("neither answered nor 404: {} {}", a.status, a.body),
        }
        if a.sent > gone {
            assert_eq!(a.status, 404, "served after it left the index: {}", a.body);
        }
    }
    assert!(answers.iter().filter(|(_, a)| a.status == 200).count() >= 40);
    // At most one per client of the 40 answers after removal was sent before it.
    assert!(answers.iter().filter(|(_, a)| a.status == 404).count() >= 30);
    assert_eq!(s.get(&format!("/v2/models/{m}")).await.0, 404);
    assert_eq!(s.get(&format!("/v2/models/{m}/ready")).await.0, 404);
    assert_eq!(s.reloads(m, "unloaded").await, unloaded + 1.0);
    let metrics = s.metrics().await;
    assert_eq!(metric_value(&metrics, "sluice_model_ready", &[("model", m)]), 0.0);
    s.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_folder_copied_in_loads_and_serves() {
    let repo = repo_with(&["digits"]);
    let s = TestServer::start(repo.path()).await;
    let others = bystander(&s, 1);
    let m = "newcomer";
    assert!(s.index_entry(m).await.is_none());
    // As `cp -r` does: the folder first, then its files one by one.
    copy_dir(
        &root().join("tests/fixtures/models/scalar_out"),
        &repo.path().join(m),
    );
    let entry = s.wait_state(m, "READY").await;
    assert_eq!(entry, json!({"name": m, "state": "READY"}));
    let (body, sum) = scalar_request(5);
    let a = infer(&s.client, &s.url(&format!("/v2/models/{m}/infer")), &body).await;
    assert_eq!(scalar_version(&a, sum), Some(1), "{}", a.body);
    assert_eq!(s.reloads(m, "loaded").await, 1.0);
    others.stop().await;
    s.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poll_mode_sees_edits_new_folders_and_removals() {
    let repo = repo_with(&[]);
    let m = "polled";
    add_model(repo.path(), "scalar_out", m, &v_settings(1));
    let s = TestServer::start_with(repo.path(), |cfg| {
        cfg.model_repository.watch = WatchMode::Poll;
        cfg.model_repository.poll_interval_seconds = 0.2;
    })
    .await;

    let updated = s.reloads(m, "updated").await;
    write_settings(repo.path(), m, &v_settings(2));
    s.wait_reloads(m, "updated", updated + 1.0).await;
    assert_eq!(s.index_entry(m).await.unwrap()["version"], "2");

    add_model(repo.path(), "scalar_out", "polled_new", "{}");
    s.wait_state("polled_new", "READY").await;
    std::fs::remove_dir_all(repo.path().join(m)).unwrap();
    wait_for("the removed model to leave the index", || async {
        s.index_entry(m).await.is_none().then_some(())
    })
    .await;
    let [loaded, reloaded, updated, failed, unloaded] = s.reload_counts(m).await;
    assert_eq!(
        (loaded, reloaded, updated, failed, unloaded),
        (1.0, 0.0, 1.0, 0.0, 1.0)
    );
    s.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_file_that_does_not_load_keeps_the_old_version_serving() {
    let repo = repo_with(&["digits"]);
    let m = "badfile";
    add_model(repo.path(), "scalar_out", m, "{}");
    let s = TestServer::start(repo.path()).await;
    let others = bystander(&s, 1);
    let url = s.url(&format!("/v2/models/{m}/infer"));
    let failed = s.reloads(m, "failed").await;

    // Replace model.onnx (write + rename) with bytes that are not ONNX.
    let file = repo.path().join(m).join("model.onnx");
    let tmp = repo.path().join(m).join(".model.onnx.tmp");
    std::fs::write(&tmp, b"this is not an onnx model\n").unwrap();
    std::fs::rename(&tmp, &file).unwrap();
    wait_for("the refused load to be counted", || async {
        (s.reloads(m, "failed").await > failed).then_some(())
    })
    .await;
    let entry = s.index_entry(m).await.unwrap();
    assert_eq!(entry["state"], "READY", "{entry}");
    let reason = entry["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("model.onnx"),
        "the reason names the file: {entry}"
    );
    for i in 0..5 {
        let (body, sum) = scalar_request(i);
        let a = infer(&s.client, &url, &body).await;
        assert_eq!(
            scalar_version(&a, sum),
            Some(1),
            "the old version serves: {}",
            a.body
        );
    }

    // A good file recovers: the new version serves and the reason is gone.
    let reloaded = s.reloads(m, "reloaded").await;
    std::fs::write(&tmp, model_bytes("scalar_out_v2")).unwrap();
    std::fs::rename(&tmp, &file).unwrap();
    wait_for("the good file to load", || async {
        (s.reloads(m, "reloaded").await > reloaded).then_some(())
    })
    .await;
    assert_eq!(
        s.index_entry(m).await.unwrap(),
        json!({"name": m, "state": "READY"})
    );
    let (body, sum) = scalar_request(7);
    let a = infer(&s.client, &url, &body).await;
    assert_eq!(scalar_version(&a, sum), Some(2), "{}", a.body);
    others.stop().await;
    s.stop().await.unwrap();
}
