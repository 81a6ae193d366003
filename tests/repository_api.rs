//! The repository extension end to end: `POST /v2/repository/models/{name}/load`
//! and `.../unload` on a real server, and names that are not a folder of the
//! repository (dot segments, slashes, absolute paths, a symlink leading out)
//! refused without loading anything.

mod common;
use std::path::Path;

use common::reload::*;
use common::*;
use serde_json::json;
use sluice::config::WatchMode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// `POST {path}` sent byte for byte (an HTTP client would normalize `..`
/// and `%2E%2E` away before sending); returns the status and the body.
async fn raw_post(s: &TestServer, path: &str) -> (u16, String) {
    let mut conn = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    let req = format!("POST {path} HTTP/1.1\r\nHost: test\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
    conn.write_all(req.as_bytes()).await.unwrap();
    let mut resp = Vec::new();
    conn.read_to_end(&mut resp).await.unwrap();
    let resp = String::from_utf8_lossy(&resp).into_owned();
    let status = resp
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {resp:?}"));
    let body = resp
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

async fn digits_answer(s: &TestServer) -> (u16, serde_json::Value) {
    let (body, _) = digits_request(9);
    s.post("/v2/models/digits/infer", &body).await
}

async fn assert_digits_serves(s: &TestServer) {
    let (body, label) = digits_request(9);
    let (st, r) = s.post("/v2/models/digits/infer", &body).await;
    assert_eq!(st, 200, "{r}");
    assert_eq!(v2_output(&r, "label")["data"], json!([label]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unload_and_load_through_the_api() {
    let repo = repo_with(&["digits", "scalar_out"]);
    // No watcher: only the API changes what serves.
    let s = TestServer::start_with(repo.path(), |cfg| cfg.model_repository.watch = WatchMode::Off).await;
    assert_digits_serves(&s).await;

    let (st, r) = s.post("/v2/repository/models/digits/unload", &json!({})).await;
    assert_eq!((st, &r), (200, &json!({})));
    let (st, r) = digits_answer(&s).await;
    assert_eq!(st, 503, "{r}");
    assert!(error_message(&r).contains("digits"), "{r}");
    assert_eq!(s.get_raw("/v2/models/digits/ready").await.0, 503);
    let entry = s.index_entry("digits").await.unwrap();
    assert_eq!(entry["state"], "UNAVAILABLE", "{entry}");
    assert!(entry["reason"].as_str().unwrap().contains("unloaded"), "{entry}");
    // The server stays ready, and the other model serves.
    assert_eq!(s.get_raw("/v2/health/ready").await.0, 200);
    let (body, sum) = scalar_request(1);
    let a = infer(&s.client, &s.url("/v2/models/scalar_out/infer"), &body).await;
    assert_eq!(scalar_version(&a, sum), Some(1), "{}", a.body);
    // Unloading twice is fine; the model stays unloaded.
    let (st, r) = s.post("/v2/repository/models/digits/unload", &json!({})).await;
    assert_eq!(st, 200, "{r}");

    let (st, r) = s.post("/v2/repository/models/digits/load", &json!({})).await;
    assert_eq!((st, &r), (200, &json!({})));
    assert_eq!(
        s.index_entry("digits").await.unwrap(),
        json!({"name": "digits", "version": "1", "state": "READY"})
    );
    assert_digits_serves(&s).await;
    // Loading a model that serves and did not change is a no-op that succeeds.
    let (st, r) = s.post("/v2/repository/models/digits/load", &json!({})).await;
    assert_eq!(st, 200, "{r}");
    assert_digits_serves(&s).await;

    // A folder added with no watcher loads on request.
    add_model(repo.path(), "scalar_out", "late", "{}");
    assert!(s.index_entry("late").await.is_none());
    let (st, r) = s.post("/v2/repository/models/late/load", &json!({})).await;
    assert_eq!(st, 200, "{r}");
    let a = infer(&s.client, &s.url("/v2/models/late/infer"), &body).await;
    assert_eq!(scalar_version(&a, sum), Some(1), "{}", a.body);

    // Unknown names: 404 naming the model.
    for action in ["load", "unload"] {
        let (st, r) = s
            .post(&format!("/v2/repository/models/nosuch/{action}"), &json!({}))
            .await;
        assert_eq!(st, 404, "{action}: {r}");
        assert!(error_message(&r).contains("nosuch"), "{r}");
    }
    // A folder that cannot load: the API says why, and nothing else changes.
    add_model(repo.path(), "broken", "wreck", "{}");
    let (st, r) = s.post("/v2/repository/models/wreck/load", &json!({})).await;
    assert!((400..500).contains(&st), "{st} {r}");
    assert!(error_message(&r).contains("wreck"), "{r}");
    assert_eq!(s.index_entry("wreck").await.unwrap()["state"], "UNAVAILABLE");
    assert_digits_serves(&s).await;
    s.stop().await.unwrap();
}

async fn index_names(s: &TestServer) -> Vec<String> {
    s.index().await.into_keys().collect()
}

/// Copies scalar_out into `dir/<name>` outside any repository.
fn outside_model(dir: &Path, name: &str) {
    add_model(dir, "scalar_out", name, "{}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_outside_the_repository_are_refused() {
    let repo = repo_with(&["digits"]);
    let outside = tempfile::tempdir().unwrap();
    outside_model(outside.path(), "secret");
    // A folder of the repository that is a symlink to a model elsewhere.
    std::os::unix::fs::symlink(outside.path().join("secret"), repo.path().join("evil")).unwrap();
    let s = TestServer::start(repo.path()).await;
    assert_eq!(
        index_names(&s).await,
        ["digits"],
        "a symlink out of the repository was loaded"
    );

    let abs = outside
        .path()
        .join("secret")
        .display()
        .to_string()
        .replace('/', "%2F");
    let refused = [
        "..",
        ".",
        "%2E",
        "%2E%2E",
        "%2e%2e",
        "a%2Fb",
        "..%2Fdigits",
        "%2E%2E%2Fdigits",
        abs.as_str(),
        "%2Ftmp",
        "evil",
    ];
    for name in refused {
        for action in ["load", "unload"] {
            let path = format!("/v2/repository/models/{name}/{action}");
            let (st, body) = raw_post(&s, &path).await;
            // Not a model name: 400 naming it. `evil` is a name, but no model
            // of the repository: nothing to unload (404), and not loadable (400).
            let want = if name == "evil" && action == "unload" {
                404
            } else {
                400
            };
            assert_eq!(st, want, "{path}: {body}");
        }
    }
    // The symlink is refused with a reason that says why.
    let (st, body) = raw_post(&s, "/v2/repository/models/evil/load").await;
    assert_eq!(st, 400, "{body}");
    assert!(body.contains("evil") && body.contains("outside"), "{body}");
    assert_eq!(index_names(&s).await, ["digits"]);

    // A symlink out added while serving is skipped by the rescan too: once a
    // folder added after it serves, the rescan has seen both.
    std::os::unix::fs::symlink(outside.path().join("secret"), repo.path().join("evil2")).unwrap();
    add_model(repo.path(), "scalar_out", "marker", "{}");
    s.wait_state("marker", "READY").await;
    assert_eq!(index_names(&s).await, ["digits", "marker"]);
    assert_digits_serves(&s).await;
    s.stop().await.unwrap();
}
