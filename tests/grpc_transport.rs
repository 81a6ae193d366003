//! The gRPC port has the HTTP port's protections (one transport for both):
//! connections that send nothing, half a preface, a SETTINGS frame or an
//! unfinished header block are closed after the header timeout while fresh
//! clients on both ports are served; at `grpc.max_connections` the quietest
//! connection makes room; each connection advertises a bound on its
//! concurrent streams. Each test waits for an outcome the old port (tonic's
//! own server) never produced: it kept all of them open.

mod common;

use std::time::Duration;

use common::grpc::{client, infer_request};
use common::*;
use sluice::protocol::grpc::inference::ServerLiveRequest;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const LIMIT: Duration = Duration::from_secs(60);
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// An empty SETTINGS frame: length 0, type 4, no flags, stream 0.
const SETTINGS: &[u8] = &[0, 0, 0, 4, 0, 0, 0, 0, 0];

async fn open(s: &TestServer, bytes: &[u8]) -> TcpStream {
    let mut conn = TcpStream::connect(s.grpc_addr).await.unwrap();
    conn.write_all(bytes).await.unwrap();
    conn
}

/// Reads until the server closes the connection; panics when it is still
/// open after [`LIMIT`].
async fn closed(conn: &mut TcpStream, what: &str) {
    let mut sink = Vec::new();
    let read = tokio::time::timeout(LIMIT, conn.read_to_end(&mut sink)).await;
    assert!(read.is_ok(), "{what}: still open after {LIMIT:?}");
}

/// A fresh gRPC call and a fresh HTTP request both succeed.
async fn fresh_clients_are_served(s: &TestServer) {
    let mut c = client(s).await;
    assert!(
        c.server_live(ServerLiveRequest {})
            .await
            .unwrap()
            .into_inner()
            .live
    );
    let r = c
        .model_infer(infer_request("scalar_out", "x", &[1, 4], &[1., 2., 3., 4.]))
        .await;
    assert!(r.is_ok(), "{r:?}");
    let r = reqwest::get(s.url("/v2/health/live")).await.unwrap();
    assert_eq!(r.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_and_half_open_grpc_connections_are_closed_while_fresh_clients_are_served() {
    let repo = repo_with(&["scalar_out"]);
    let s = TestServer::start_with(repo.path(), |c| {
        c.http.header_read_timeout_seconds = 1.0;
        c.http.keep_alive_timeout_seconds = 2.0;
    })
    .await;
    // A header block (HEADERS frame, stream 1) that never ends: no END_HEADERS flag.
    let unfinished: Vec<u8> = [PREFACE, SETTINGS, &[0, 0, 1, 1, 0, 0, 0, 0, 1, 0x82]].concat();
    let kinds: [(&str, Vec<u8>); 4] = [
        ("nothing", Vec::new()),
        ("half a preface", PREFACE[..10].to_vec()),
        ("a preface and a SETTINGS frame", [PREFACE, SETTINGS].concat()),
        ("an unfinished header block", unfinished),
    ];
    let mut idle = Vec::new();
    for (what, bytes) in &kinds {
        for _ in 0..50 {
            idle.push((*what, open(&s, bytes).await));
        }
    }
    fresh_clients_are_served(&s).await;
    for (what, conn) in &mut idle {
        closed(conn, what).await;
    }
    // A connection whose calls are done is closed once idle.
    let mut c = client(&s).await;
    assert!(c.server_live(ServerLiveRequest {}).await.is_ok());
    tokio::time::sleep(Duration::from_secs(4)).await;
    // The channel reconnects: the next call is served.
    fresh_clients_are_served(&s).await;
    s.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_grpc_max_connections_the_quietest_makes_room() {
    let repo = repo_with(&["scalar_out"]);
    let s = TestServer::start_with(repo.path(), |c| {
        c.grpc.max_connections = 20;
        c.http.header_read_timeout_seconds = 30.0;
    })
    .await;
    let mut idle = Vec::new();
    for _ in 0..40 {
        idle.push(open(&s, &[PREFACE, SETTINGS].concat()).await);
    }
    // 40 idle connections on a cap of 20: the first were evicted, and a
    // fresh client still gets a slot, on each port.
    fresh_clients_are_served(&s).await;
    closed(&mut idle[0], "the quietest connection at the cap").await;
    s.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_connection_advertises_its_stream_bound() {
    let repo = repo_with(&["scalar_out"]);
    let s = TestServer::start_with(repo.path(), |c| c.grpc.max_concurrent_streams = 7).await;
    let mut conn = open(&s, &[PREFACE, SETTINGS].concat()).await;
    // The server's first frame is its SETTINGS: 6-byte entries, id 3 is
    // SETTINGS_MAX_CONCURRENT_STREAMS.
    let mut head = [0u8; 9];
    tokio::time::timeout(LIMIT, conn.read_exact(&mut head))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(head[3], 4, "not a SETTINGS frame: {head:?}");
    let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
    let mut payload = vec![0u8; len];
    conn.read_exact(&mut payload).await.unwrap();
    let streams = payload
        .chunks(6)
        .find(|e| u16::from_be_bytes([e[0], e[1]]) == 3)
        .map(|e| u32::from_be_bytes([e[2], e[3], e[4], e[5]]));
    assert_eq!(streams, Some(7), "SETTINGS {payload:?}");
    s.stop().await.unwrap();
}
