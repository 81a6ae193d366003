//! The in-tree load client: keep-alive HTTP/1.1 connections (hyper,
//! `TCP_NODELAY`), one request in flight per connection, every connection on
//! the one current-thread tokio runtime of the bench process, bodies
//! serialized beforehand. Its CPU time is that thread's (`RUSAGE_THREAD`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::header::{HeaderValue, CONTENT_TYPE, HOST};
use hyper::{Method, Uri};
use hyper_util::rt::TokioIo;

use super::metrics::{snapshot, Edge};
use super::server::ServerProcess;
use super::{percentile, thread_cpu_seconds};

pub type Conn = SendRequest<Full<Bytes>>;

/// One keep-alive HTTP/1.1 connection.
pub async fn connect(addr: SocketAddr) -> Result<Conn> {
    let stream = tokio::net::TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(sender)
}

pub async fn send(conn: &mut Conn, req: hyper::Request<Full<Bytes>>) -> Result<(u16, Bytes)> {
    conn.ready().await?;
    let resp = conn.send_request(req).await?;
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await?.to_bytes();
    Ok((status, body))
}

/// A GET on a fresh connection (health, metrics).
pub async fn get(addr: SocketAddr, path: &str) -> Result<(u16, Bytes)> {
    let mut conn = connect(addr).await?;
    let req = hyper::Request::get(path)
        .header(HOST, addr.to_string())
        .body(Full::new(Bytes::new()))?;
    send(&mut conn, req).await
}

/// One pre-serialized inference request body.
#[derive(Clone)]
pub struct Encoded {
    pub content_type: &'static str,
    /// `Inference-Header-Content-Length` (binary tensor extension only).
    pub header_len: Option<usize>,
    pub body: Bytes,
}

/// A V2 inference request for `rows` rows of FP32 input `input` of `width`
/// values each (`xs` holds `rows * width` floats): JSON, or with `binary` the
/// binary tensor data extension (JSON header, then the raw little-endian FP32
/// bytes; outputs are asked for as JSON).
pub fn encode_request(input: &str, xs: &[f32], rows: usize, width: usize, binary: bool) -> Encoded {
    debug_assert_eq!(xs.len(), rows * width);
    if binary {
        let header = serde_json::json!({"inputs": [{
            "name": input, "shape": [rows, width], "datatype": "FP32",
            "parameters": {"binary_data_size": xs.len() * 4},
        }]});
        let mut body = serde_json::to_vec(&header).expect("JSON");
        let header_len = body.len();
        for x in xs {
            body.extend_from_slice(&x.to_le_bytes());
        }
        Encoded {
            content_type: "application/octet-stream",
            header_len: Some(header_len),
            body: body.into(),
        }
    } else {
        let v = serde_json::json!({"inputs": [{
            "name": input, "shape": [rows, width], "datatype": "FP32", "data": xs,
        }]});
        Encoded {
            content_type: "application/json",
            header_len: None,
            body: serde_json::to_vec(&v).expect("JSON").into(),
        }
    }
}

pub fn infer_path(model: &str) -> String {
    format!("/v2/models/{model}/infer")
}

/// A one-off inference request (checks, low load).
pub fn infer_request(addr: SocketAddr, path: &str, e: &Encoded) -> hyper::Request<Full<Bytes>> {
    let host = HeaderValue::from_str(&addr.to_string()).expect("an address is a valid header");
    let uri: Uri = path.parse().expect("a valid path");
    build_request(&host, &uri, e)
}

/// The request of the load loop: the URI and Host header are parsed once per
/// phase, and the body is a reference-counted `Bytes`, so building one costs
/// a few small copies.
fn build_request(host: &HeaderValue, uri: &Uri, e: &Encoded) -> hyper::Request<Full<Bytes>> {
    let mut req = hyper::Request::new(Full::new(e.body.clone()));
    *req.method_mut() = Method::POST;
    *req.uri_mut() = uri.clone();
    let h = req.headers_mut();
    h.insert(HOST, host.clone());
    h.insert(CONTENT_TYPE, HeaderValue::from_static(e.content_type));
    if let Some(n) = e.header_len {
        h.insert("inference-header-content-length", HeaderValue::from(n));
    }
    req
}

pub fn body_text(body: &[u8]) -> String {
    let s = String::from_utf8_lossy(body);
    s.chars().take(300).collect()
}

// ---------------------------------------------------------------- closed-loop load

/// One closed-loop load point: `concurrency` clients, each sending requests
/// back to back, for one measured window.
pub struct LoadPoint {
    /// What was loaded (a model, or a description of several).
    pub label: String,
    pub concurrency: usize,
    /// 2xx requests answered in the window.
    pub requests: u64,
    /// Rows answered in the window (requests × rows per request).
    pub items: u64,
    pub errors: u64,
    pub wall: f64,
    pub p50: Duration,
    pub p99: Duration,
    /// CPU seconds of the server process (all threads) in the window.
    pub server_cpu: f64,
    /// CPU seconds of the load client's thread in the window.
    pub client_cpu: f64,
    /// Rows per executed batch, over every loaded model.
    pub mean_batch: Option<f64>,
    /// Mean seconds from a request's arrival to its batch's dispatch.
    pub queue_delay: Option<f64>,
}

impl LoadPoint {
    pub fn items_per_s(&self) -> f64 {
        self.items as f64 / self.wall
    }
    pub fn cpu_per_1000(&self) -> Option<f64> {
        (self.items > 0).then(|| self.server_cpu / self.items as f64 * 1000.0)
    }
    /// Server CPU µs per request (None without requests).
    pub fn server_us_per_request(&self) -> Option<f64> {
        (self.requests > 0).then(|| self.server_cpu / self.requests as f64 * 1e6)
    }
    /// Client CPU µs per request (None without requests).
    pub fn client_us_per_request(&self) -> Option<f64> {
        (self.requests > 0).then(|| self.client_cpu / self.requests as f64 * 1e6)
    }
}

/// What every client of a phase shares: where to send, what to send.
struct Plan {
    addr: SocketAddr,
    host: HeaderValue,
    /// One URI per model; client `i` sends its `k`-th request to `uris[(i + k) % len]`.
    uris: Vec<Uri>,
    bodies: Arc<Vec<Encoded>>,
}

/// One client: requests back to back on its connection until `until`
/// (reconnecting if the server closes it). Returns the latency of each
/// successful request and the number of failed ones.
async fn client(
    plan: Arc<Plan>,
    mut conn: Conn,
    first: usize,
    until: Instant,
) -> Result<(Conn, Vec<Duration>, u64)> {
    let mut lat = Vec::new();
    let mut errors = 0;
    let (nu, nb) = (plan.uris.len(), plan.bodies.len());
    let mut k = 0;
    while Instant::now() < until {
        let req = build_request(
            &plan.host,
            &plan.uris[(first + k) % nu],
            &plan.bodies[(first * 7 + k) % nb],
        );
        k += 1;
        let t = Instant::now();
        match send(&mut conn, req).await {
            Ok((200..=299, _)) => lat.push(t.elapsed()),
            Ok(_) => errors += 1,
            Err(_) => {
                errors += 1;
                conn = connect(plan.addr).await?;
            }
        }
    }
    Ok((conn, lat, errors))
}

/// Every connection runs a client until `until`; waits for all of them.
async fn phase(
    plan: &Arc<Plan>,
    conns: Vec<Conn>,
    until: Instant,
) -> Result<(Vec<Conn>, Vec<Duration>, u64)> {
    let mut set = tokio::task::JoinSet::new();
    for (i, conn) in conns.into_iter().enumerate() {
        set.spawn(client(plan.clone(), conn, i, until));
    }
    let (mut conns, mut lat, mut errors) = (Vec::new(), Vec::new(), 0);
    while let Some(r) = set.join_next().await {
        let (c, l, e) = r??;
        conns.push(c);
        lat.extend(l);
        errors += e;
    }
    Ok((conns, lat, errors))
}

/// Closed-loop load on `models` (round-robin per client when several):
/// `concurrency` fresh connections, `warmup` unmeasured, then a measured
/// window of `measured` that ends when the last client's last request
/// returned. `rows` is the rows per request of `bodies`.
#[allow(clippy::too_many_arguments)]
pub async fn closed_loop<S: AsRef<str>>(
    server: &ServerProcess,
    label: &str,
    models: &[S],
    concurrency: usize,
    rows: usize,
    bodies: &Arc<Vec<Encoded>>,
    warmup: Duration,
    measured: Duration,
) -> Result<LoadPoint> {
    let addr = server.addr;
    let plan = Arc::new(Plan {
        addr,
        host: HeaderValue::from_str(&addr.to_string())?,
        uris: models
            .iter()
            .map(|m| infer_path(m.as_ref()).parse())
            .collect::<Result<_, _>>()?,
        bodies: bodies.clone(),
    });
    let mut conns = Vec::with_capacity(concurrency);
    for _ in 0..concurrency {
        conns.push(connect(addr).await?);
    }
    let (conns, _, _) = phase(&plan, conns, Instant::now() + warmup).await?;
    // Measured window: from here to the moment the last client's last
    // request returned. Items are the requests answered in it.
    let before = snapshot(addr, server.pid(), Edge::Start).await?;
    let client_cpu0 = thread_cpu_seconds();
    let t0 = Instant::now();
    let (conns, mut lat, errors) = phase(&plan, conns, t0 + measured).await?;
    let wall = t0.elapsed().as_secs_f64();
    let client_cpu = thread_cpu_seconds() - client_cpu0;
    let after = snapshot(addr, server.pid(), Edge::End).await?;
    drop(conns);
    lat.sort();
    Ok(LoadPoint {
        label: label.to_string(),
        concurrency,
        requests: lat.len() as u64,
        items: (lat.len() * rows) as u64,
        errors,
        wall,
        p50: percentile(&lat, 50.0),
        p99: percentile(&lat, 99.0),
        server_cpu: after.cpu - before.cpu,
        client_cpu,
        mean_batch: before.mean_since_over(&after, "sluice_batch_size", models),
        queue_delay: before.mean_since_over(&after, "sluice_queue_delay_seconds", models),
    })
}
