//! Slow clients (README, "Slow clients, connections and memory"): a client that sends its headers or its
//! body slowly, or idles, is closed or answered 408 in bounded time; at the
//! connection limit, the connection quiet for the longest makes room for a
//! fresh client, and when every connection has a request running a new one
//! gets a fast 503. Deadlines are generous and nothing asserts a duration:
//! each test waits for an outcome that the old server never produced.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::process::{spawn_serve, Lines, Reaped};
use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const LIMIT: Duration = Duration::from_secs(60);

/// Reads until the server closes the connection (or resets it); panics when
/// it is still open after [`LIMIT`].
async fn read_until_closed(conn: &mut TcpStream, what: &str) -> Vec<u8> {
    let mut got = Vec::new();
    let read = tokio::time::timeout(LIMIT, conn.read_to_end(&mut got)).await;
    assert!(read.is_ok(), "{what}: still open after {LIMIT:?}");
    got
}

async fn send(s: &TestServer, bytes: &[u8]) -> TcpStream {
    let mut conn = TcpStream::connect(s.addr).await.unwrap();
    conn.write_all(bytes).await.unwrap();
    conn
}

#[tokio::test]
async fn slow_headers_and_idle_connections_are_closed() {
    let repo = repo_with(&[]);
    let s = TestServer::start_with(repo.path(), |c| {
        c.http.header_read_timeout_seconds = 1.0;
        c.http.keep_alive_timeout_seconds = 10.0;
    })
    .await;
    let mut silent = send(&s, b"").await;
    let mut half = send(&s, b"GET /v2/health/live HTTP/1.1\r\nHost: sluice\r\n").await;
    let mut kept = send(&s, b"GET /v2/health/live HTTP/1.1\r\nHost: sluice\r\n\r\n").await;
    let mut buf = [0u8; 1024];
    let n = tokio::time::timeout(LIMIT, kept.read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert!(
        buf[..n].starts_with(b"HTTP/1.1 200"),
        "{:?}",
        String::from_utf8_lossy(&buf[..n])
    );

    assert!(read_until_closed(&mut silent, "a connection that sends nothing")
        .await
        .is_empty());
    let answer = read_until_closed(&mut half, "a connection whose headers never end").await;
    assert!(answer.is_empty(), "{}", String::from_utf8_lossy(&answer));
    // Idle past the header timeout but within the keep-alive timeout, the
    // connection still serves: the header timer does not cut keep-alive.
    tokio::time::sleep(Duration::from_secs(2)).await;
    kept.write_all(b"GET /v2/health/live HTTP/1.1\r\nHost: sluice\r\n\r\n")
        .await
        .unwrap();
    let n = tokio::time::timeout(LIMIT, kept.read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert!(
        buf[..n].starts_with(b"HTTP/1.1 200"),
        "{:?}",
        String::from_utf8_lossy(&buf[..n])
    );
    assert!(read_until_closed(&mut kept, "an idle keep-alive connection")
        .await
        .is_empty());
    s.stop().await.unwrap();
}

#[tokio::test]
async fn a_body_that_does_not_arrive_in_time_gets_408_json() {
    let repo = repo_with(&[]);
    let s = TestServer::start_with(repo.path(), |c| c.http.body_read_timeout_seconds = 1.0).await;
    for path in ["/v2/models/digits/infer", "/v1/models/digits:predict"] {
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: sluice\r\nContent-Type: application/json\r\n\
             Content-Length: 1000\r\n\r\n{{\"inputs\": ["
        );
        let mut conn = send(&s, head.as_bytes()).await;
        let answer = String::from_utf8(read_until_closed(&mut conn, path).await).unwrap();
        assert!(answer.starts_with("HTTP/1.1 408 "), "{path}: {answer}");
        assert!(answer.contains("content-type: application/json"), "{answer}");
        let body: serde_json::Value = serde_json::from_str(answer.split_once("\r\n\r\n").unwrap().1).unwrap();
        assert!(
            error_message(&body).contains("http.body_read_timeout_seconds"),
            "{body}"
        );
    }
    s.stop().await.unwrap();
}

#[tokio::test]
async fn when_every_connection_has_a_request_running_a_new_one_gets_503_at_once() {
    // A `fixed` batch waits 30 s to fill: a lone request runs (its body in)
    // all that time. (A request still receiving its body does not count:
    // its connection may be evicted, see the body slowloris test below.)
    let repo = tempfile::tempdir().unwrap();
    let settings = r#"{"batch_policy": "fixed", "max_batch_time": 30, "max_batch_size": 64}"#;
    add_model(repo.path(), "scalar_out", "waits", settings);
    let s = TestServer::start_with(repo.path(), |c| c.http.max_connections = 2).await;
    let body = r#"{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}"#;
    let mut running = Vec::new();
    for _ in 0..2 {
        let request = format!(
            "POST /v2/models/waits/infer HTTP/1.1\r\nHost: sluice\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        running.push(send(&s, request.as_bytes()).await);
    }
    // Their bodies are a few bytes: in and queued at once (nothing can
    // watch them from outside: a third connection would take a slot).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut third = send(&s, b"GET /v2/health/live HTTP/1.1\r\nHost: sluice\r\n\r\n").await;
    let answer = String::from_utf8(read_until_closed(&mut third, "over the limit").await).unwrap();
    assert!(answer.starts_with("HTTP/1.1 503 "), "{answer}");
    let body: serde_json::Value = serde_json::from_str(answer.split_once("\r\n\r\n").unwrap().1).unwrap();
    assert!(error_message(&body).contains("http.max_connections"), "{body}");
    // Once a running request ends, its slot serves again.
    drop(running);
    let t0 = Instant::now();
    loop {
        // A new client each time: the server may have evicted a pooled connection.
        let r = reqwest::get(s.url("/v2/health/live")).await;
        if r.as_ref().is_ok_and(|r| r.status() == 200) {
            break;
        }
        assert!(t0.elapsed() < LIMIT, "{r:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    s.stop().await.unwrap();
}

/// Raises this process's soft open-file limit to the hard one; returns it.
#[allow(clippy::unnecessary_cast)] // rlim_t is not u64 on every target
fn raise_own_file_limit() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct passed.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
        lim.rlim_cur = lim.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
    }
    lim.rlim_cur as u64
}

/// `sluice serve` on an empty repository under `ulimit` settings `limits`
/// (a shell's `ulimit` arguments), with `env` added; returns it, its stderr
/// lines, its HTTP port and its repository (removed when dropped).
fn spawn_limited(limits: &str, env: &[(&str, &str)]) -> (Reaped, Lines, u16, tempfile::TempDir) {
    let repo = repo_with(&[]);
    // The binary and spawn_serve's arguments follow as "$0" "$@".
    let mut cmd = Command::new("bash");
    cmd.arg("-c")
        .arg(format!(r#"ulimit {limits} && exec "$0" "$@""#))
        .arg(env!("CARGO_BIN_EXE_sluice"))
        .current_dir(root())
        .env_remove("RUST_LOG")
        .envs(env.iter().copied());
    let args = ["--model-repository".as_ref(), repo.path().as_os_str()];
    let (child, lines, port) = spawn_serve(cmd, &args);
    (child, lines, port, repo)
}

/// The real binary with an open-file limit of 256 (soft and hard, so it
/// cannot be raised: the connection limit is capped at 192), 500 connections
/// that never finish their headers (under a header timeout longer than the
/// test), then fresh clients: each is answered. The old server ran out of
/// descriptors after ~250 connections, and fresh clients waited forever in
/// its accept queue.
#[tokio::test]
async fn five_hundred_slow_connections_do_not_lock_out_a_fresh_client() {
    let slow = 500usize.min(raise_own_file_limit().saturating_sub(200) as usize);
    let timeout = [("SLUICE_HTTP__HEADER_READ_TIMEOUT_SECONDS", "600")];
    let (mut child, _lines, port, _repo) = spawn_limited("-Sn 256 && ulimit -Hn 256", &timeout);
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut held = Vec::new();
    for _ in 0..slow {
        let mut c = TcpStream::connect(addr).await.unwrap();
        c.write_all(b"GET /v2/health/live HTTP/1.1\r\nHost: slow\r\n")
            .await
            .unwrap();
        held.push(c);
    }
    // A new connection for every request: each is a fresh client.
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    for fresh in 0..3 {
        let t0 = Instant::now();
        loop {
            let r = client.get(format!("http://{addr}/v2/health/live")).send().await;
            if r.as_ref().is_ok_and(|r| r.status() == 200) {
                break;
            }
            assert!(t0.elapsed() < LIMIT, "fresh client {fresh} not answered: {r:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    assert!(child.try_wait().unwrap().is_none(), "sluice exited");
    drop(held);
}

#[test]
fn the_soft_open_file_limit_is_raised_to_the_hard_one() {
    let hard = raise_own_file_limit();
    if hard <= 256 {
        eprintln!("hard open-file limit {hard}: nothing to raise; skipped");
        return;
    }
    // Raised while binding, so logged before `sluice listening`.
    let (_child, mut lines, _, _repo) = spawn_limited("-Sn 256", &[]);
    let raised = lines.wait_for(&["open-file limit raised"], Duration::ZERO);
    assert!(
        raised.contains("from=256") && raised.contains(&format!("to={hard}")),
        "{raised}"
    );
}

/// A body slowloris: at the connection cap, every connection has sent its
/// headers and one byte of its body, then nothing. Such connections are
/// evictable (their requests are not running yet, only receiving), so a
/// fresh client is served instead of getting 503 until the body timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_bodies_at_the_connection_cap_do_not_lock_out_a_fresh_client() {
    let repo = repo_with(&["scalar_out"]);
    let s = TestServer::start_with(repo.path(), |c| c.http.max_connections = 200).await;
    let head =
        "POST /v2/models/scalar_out/infer HTTP/1.1\r\nHost: sluice\r\nContent-Type: application/json\r\n\
                Content-Length: 1000\r\n\r\n{";
    let mut slow = Vec::new();
    for _ in 0..200 {
        slow.push(send(&s, head.as_bytes()).await);
    }
    // Each waits for its body: give the server time to take them all in.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let t0 = Instant::now();
    loop {
        let r = reqwest::get(s.url("/v2/health/live")).await;
        if r.as_ref().is_ok_and(|r| r.status() == 200) {
            break;
        }
        assert!(t0.elapsed() < LIMIT, "a fresh client was not served: {r:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The slot came from a slow upload: one of them was closed.
    let mut any_closed = false;
    for conn in &mut slow {
        let mut buf = [0u8; 1];
        if let Ok(Ok(0)) = tokio::time::timeout(Duration::from_millis(1), conn.read(&mut buf)).await {
            any_closed = true;
            break;
        }
    }
    assert!(any_closed, "no slow upload was evicted");
    s.stop().await.unwrap();
}
