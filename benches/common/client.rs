//! The in-tree load client: keep-alive HTTP/1.1 connections (`TCP_NODELAY`),
//! one request in flight per connection, every connection on the one
//! current-thread tokio runtime of the bench process, whole requests
//! serialized beforehand and written as they are; responses read up to their
//! `Content-Length`. Its CPU time is that thread's (`RUSAGE_THREAD`). One-off
//! requests (health, metrics, checks, low load) go through hyper.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::header::{CONTENT_TYPE, HOST};
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
    /// Where it goes when not to the model's infer path (`/v1/embeddings`).
    pub path: Option<&'static str>,
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
            path: None,
        }
    } else {
        let v = serde_json::json!({"inputs": [{
            "name": input, "shape": [rows, width], "datatype": "FP32", "data": xs,
        }]});
        Encoded {
            content_type: "application/json",
            header_len: None,
            body: serde_json::to_vec(&v).expect("JSON").into(),
            path: None,
        }
    }
}

pub fn infer_path(model: &str) -> String {
    format!("/v2/models/{model}/infer")
}

/// A one-off inference request through hyper (checks, low load).
pub fn infer_request(addr: SocketAddr, path: &str, e: &Encoded) -> hyper::Request<Full<Bytes>> {
    let mut b = hyper::Request::post(path)
        .header(HOST, addr.to_string())
        .header(CONTENT_TYPE, e.content_type);
    if let Some(n) = e.header_len {
        b = b.header("inference-header-content-length", n);
    }
    b.body(Full::new(e.body.clone())).expect("a valid request")
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
    /// Fraction of the executed batches that held one row.
    pub one_row_batches: Option<f64>,
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

/// What every client of a phase sends: `requests[model][body]`, whole
/// HTTP/1.1 requests (head and body) serialized before the phase; client `i`
/// sends its `k`-th request to model `(i + k) % models` with body
/// `(7 i + k) % bodies`.
struct Plan {
    addr: SocketAddr,
    requests: Vec<Vec<Bytes>>,
}

/// An HTTP/1.1 POST with `Content-Length`, keep-alive, as bytes on the wire.
fn wire_request(addr: SocketAddr, path: &str, e: &Encoded) -> Bytes {
    let mut head = format!(
        "POST {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: {}\r\ncontent-length: {}\r\n",
        e.content_type,
        e.body.len()
    );
    if let Some(n) = e.header_len {
        head.push_str(&format!("inference-header-content-length: {n}\r\n"));
    }
    head.push_str("\r\n");
    let mut out = head.into_bytes();
    out.extend_from_slice(&e.body);
    out.into()
}

/// The load loop's connection: a plain TCP stream that writes a serialized
/// request and reads one `Content-Length` response. Leaner than hyper's
/// client (no request or header map per request, no channel and task between
/// the sender and the connection), so that the client's CPU per request stays
/// below the server's it measures.
struct WireConn {
    stream: tokio::net::TcpStream,
    /// Bytes read and not yet consumed (a response arrives in pieces).
    buf: Vec<u8>,
}

impl WireConn {
    async fn connect(addr: SocketAddr) -> Result<WireConn> {
        let stream = tokio::net::TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(WireConn {
            stream,
            buf: Vec::with_capacity(64 * 1024),
        })
    }

    /// Sends `req`, reads the whole response; its status code.
    async fn round_trip(&mut self, req: &[u8]) -> Result<u16> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        self.stream.write_all(req).await?;
        loop {
            if let Some(end) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let (status, length) = parse_head(&self.buf[..end])?;
                let total = end + 4 + length;
                while self.buf.len() < total {
                    if self.stream.read_buf(&mut self.buf).await? == 0 {
                        bail!("the server closed the connection in a response body");
                    }
                }
                self.buf.drain(..total);
                return Ok(status);
            }
            if self.stream.read_buf(&mut self.buf).await? == 0 {
                bail!("the server closed the connection");
            }
        }
    }
}

/// Status code and `Content-Length` of a response head (without its blank line).
fn parse_head(head: &[u8]) -> Result<(u16, usize)> {
    let text = std::str::from_utf8(head)?;
    let mut lines = text.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| anyhow!("not an HTTP status line: {text:?}"))?;
    let mut length = None;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        if name.eq_ignore_ascii_case("content-length") {
            length = value.trim().parse().ok();
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            bail!("chunked response: the load client reads Content-Length bodies only");
        }
    }
    Ok((
        status,
        length.ok_or_else(|| anyhow!("no Content-Length in {text:?}"))?,
    ))
}

/// One client: requests back to back on its connection until `until`
/// (reconnecting if the server closes it). Returns the latency of each
/// successful request and the number of failed ones.
async fn client(
    plan: Arc<Plan>,
    mut conn: WireConn,
    first: usize,
    until: Instant,
) -> Result<(WireConn, Vec<Duration>, u64)> {
    let mut lat = Vec::new();
    let mut errors = 0;
    let nm = plan.requests.len();
    let mut k = 0;
    while Instant::now() < until {
        let per_model = &plan.requests[(first + k) % nm];
        let req = &per_model[(first * 7 + k) % per_model.len()];
        k += 1;
        let t = Instant::now();
        match conn.round_trip(req).await {
            Ok(200..=299) => lat.push(t.elapsed()),
            Ok(_) => errors += 1,
            Err(_) => {
                errors += 1;
                conn = WireConn::connect(plan.addr).await?;
            }
        }
    }
    Ok((conn, lat, errors))
}

/// Every connection runs a client until `until`; waits for all of them.
async fn phase(
    plan: &Arc<Plan>,
    conns: Vec<WireConn>,
    until: Instant,
) -> Result<(Vec<WireConn>, Vec<Duration>, u64)> {
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
        requests: models
            .iter()
            .map(|m| {
                let path = infer_path(m.as_ref());
                bodies
                    .iter()
                    .map(|e| wire_request(addr, e.path.unwrap_or(&path), e))
                    .collect()
            })
            .collect(),
    });
    let mut conns = Vec::with_capacity(concurrency);
    for _ in 0..concurrency {
        conns.push(WireConn::connect(addr).await?);
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
        one_row_batches: before.share_at_most_over(&after, "sluice_batch_size", "1", models),
        queue_delay: before.mean_since_over(&after, "sluice_queue_delay_seconds", models),
    })
}
