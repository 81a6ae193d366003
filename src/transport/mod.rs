//! One transport for both ports (HTTP and gRPC): an accept loop over hyper
//! (instead of `axum::serve` or tonic's server, which have no timeouts and
//! no connection limit). A client that sends its headers or body slowly, or
//! idles, is closed (or answered 408) in bounded time; connections are
//! capped below the open-file limit, and at the cap the longest-quiet
//! connection makes room for a new one. HTTP/2 connections get a bound on
//! concurrent streams and keep-alive pings. On shutdown a port keeps
//! answering (readiness 503) until the requests it had accepted are
//! answered and every connection has closed. With TLS, a connection takes
//! its slot at the accept and its handshake runs under its header timeout,
//! so a slow handshake is a slow request head: timed out, and evictable.
//!
//! `conn.rs` holds a connection's state and timers (pure, table-tested),
//! `service.rs` the guard every request passes through, `io.rs` the socket
//! wrapper that tells the state what it reads; the HTTP router and the gRPC
//! server plug in as a [`Port`]'s service.

mod conn;
mod io;
mod repoll;
mod service;

use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};

use crate::config::HttpLimits;
use io::Socket;
pub use service::{BodyReadTimeout, TimedBody};

/// What a port serves and how its connections speak.
pub struct Port<S> {
    /// `HTTP` or `gRPC`, for log lines.
    pub name: &'static str,
    /// The service every request goes to: a tower service of
    /// `Request<TimedBody>` that is always ready (axum's router, tonic's server).
    pub service: S,
    /// HTTP/2 only (gRPC); else HTTP/1.1 and HTTP/2 (prior knowledge or ALPN).
    pub http2_only: bool,
    /// Most concurrent streams of one HTTP/2 connection (`SETTINGS_MAX_CONCURRENT_STREAMS`).
    pub max_concurrent_streams: u32,
    /// An HTTP/2 connection is pinged after this long without frames, and
    /// closed when the ping is not answered in as long (`None`: no pings).
    pub keep_alive_ping: Option<Duration>,
    /// Paths whose request body is a long-lived stream, not timed by
    /// `http.body_read_timeout_seconds`.
    pub untimed_paths: &'static [&'static str],
    /// Answer a connection over the limit with an HTTP/1.1 503 (an HTTP
    /// port); else just close it (gRPC clients reconnect and retry).
    pub refuse_with_503: bool,
    /// The setting `limits.max_connections` comes from, for log lines.
    pub max_connections_key: &'static str,
    /// Quarters of the open-file limit this port's connections may use at most.
    pub open_file_quarters: u64,
    /// What each connection's long-lived streams may hold unsent, in bytes
    /// (0: no bound of its own); handed to its requests as an extension.
    pub connection_bytes: usize,
}

/// Most 503 answers to connections over the limit in flight at once (each
/// holds a descriptor for up to a second; beyond these, the answer is written
/// once and the socket closed).
const REFUSING: usize = 64;

/// Serves `routes` on `listener` until `stop` turns true and the drain is
/// over: each connection accepted before it has answered its running
/// requests and closed, and so has each one accepted since (health probes,
/// refused inference). `stop`'s sender is the shutdown task of
/// `lib::Server::run`; each connection's task holds a clone. With `tls`,
/// every connection speaks TLS.
pub async fn serve<S, B>(
    listener: TcpListener,
    port: Port<S>,
    limits: HttpLimits,
    tls: Option<crate::tls::Acceptor>,
    mut stop: watch::Receiver<bool>,
) -> std::io::Result<()>
where
    S: tower_service::Service<
            hyper::Request<TimedBody>,
            Response = hyper::Response<B>,
            Error = std::convert::Infallible,
        > + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
    B: http_body::Body<Data = bytes::Bytes> + Send + Unpin + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let limits = Arc::new(HttpLimits {
        max_connections: connection_cap(
            limits.max_connections,
            port.open_file_quarters,
            port.max_connections_key,
        ),
        ..limits
    });
    let connections = conn::Connections::new(limits.max_connections);
    let mut open = connections.count();
    let builder = Arc::new(builder(&limits, &port));
    let (name, refuse_with_503, untimed) = (port.name, port.refuse_with_503, port.untimed_paths);
    let connection_bytes = port.connection_bytes;
    let service = port.service;
    // Permits for the tasks that answer connections over the limit; each
    // such task holds one for at most a second.
    let refusing = Arc::new(Semaphore::new(REFUSING));
    let mut draining = false;
    loop {
        let Some(stream) = accept(&listener, tls.as_ref(), &mut stop, &mut open, &mut draining).await else {
            return Ok(());
        };
        let Some(ticket) = connections.admit().await else {
            match refuse_with_503 {
                true => refuse(stream, limits.max_connections, &refusing),
                false => tracing::warn!(
                    port = name,
                    max_connections = limits.max_connections,
                    "connection refused: every connection has a request running"
                ),
            }
            continue;
        };
        let (service, builder, limits, stop) =
            (service.clone(), builder.clone(), limits.clone(), stop.clone());
        // Requests running on the port, counted by each connection's state.
        let running = ticket.state.running().clone();
        let task = async move {
            let state = ticket.state.clone();
            let io = TokioIo::new(io::TrackedIo::new(stream, state.clone(), limits.max_header_bytes));
            let service = service::Guarded {
                inner: service,
                conn: state.clone(),
                body_read_timeout: limits.body_read_timeout,
                untimed,
                bytes: (connection_bytes > 0).then(|| crate::budget::ConnectionBytes::new(connection_bytes)),
            };
            {
                let connection = builder.serve_connection(io, service);
                tokio::pin!(connection);
                conn::drive(connection, |c| c.graceful_shutdown(), &state, &limits, stop).await;
            }
            // The socket is closed: its slot is free.
            drop(ticket);
        };
        tokio::spawn(repoll::Repoll::new(task, running));
    }
}

/// The next connection (speaking TLS when the port has it); `None` once
/// `stop` turned true (`draining` is then set) and every connection closed.
async fn accept(
    listener: &TcpListener,
    tls: Option<&crate::tls::Acceptor>,
    stop: &mut watch::Receiver<bool>,
    open: &mut watch::Receiver<usize>,
    draining: &mut bool,
) -> Option<Socket> {
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stop.wait_for(|s| *s), if !*draining => {
                *draining = true;
                continue;
            }
            _ = open.wait_for(|n| *n == 0), if *draining => return None,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                accept_failed(e).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        return Some(match tls {
            Some(acceptor) => Socket::Tls(Box::new(acceptor.accept(stream))),
            None => Socket::Plain(stream),
        });
    }
}

/// hyper's settings for every connection of `port`. Its own header timeout
/// stays off: it would also cut idle keep-alive connections, so `conn`
/// keeps both timers.
fn builder<S>(limits: &HttpLimits, port: &Port<S>) -> auto::Builder<TokioExecutor> {
    let mut b = auto::Builder::new(TokioExecutor::new());
    // The read buffer bounds the request line and headers: past it, hyper
    // answers 431 (which `io` gives a JSON body).
    b.http1()
        .header_read_timeout(None)
        .max_buf_size(limits.max_header_bytes.max(8192));
    b.http2()
        .max_header_list_size(u32::try_from(limits.max_header_bytes).unwrap_or(u32::MAX))
        .max_concurrent_streams(port.max_concurrent_streams)
        .timer(hyper_util::rt::TokioTimer::new())
        .keep_alive_interval(port.keep_alive_ping);
    if let Some(ping) = port.keep_alive_ping {
        b.http2().keep_alive_timeout(ping);
    }
    if port.http2_only {
        b = b.http2_only();
    }
    b
}

/// Answers a connection over the limit at once with 503 and closes it,
/// without parsing its request (nothing waits on a slow client). While few
/// such answers are in flight (`refusing` has a permit), each is followed by
/// a FIN and a read of whatever the client sent, for at most a second, so
/// closing does not reset the answer away before the client reads it. A TLS
/// connection gets the answer only then (after its handshake, in that
/// second); otherwise it is just closed.
fn refuse(mut stream: Socket, max: usize, refusing: &Arc<Semaphore>) {
    tracing::warn!(
        max_connections = max,
        "HTTP connection refused: every connection has a request running"
    );
    let body = serde_json::json!({
        "error": format!("the server has {max} connections with requests running (http.max_connections); retry later")
    })
    .to_string();
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
         retry-after: 1\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let Ok(permit) = refusing.clone().try_acquire_owned() else {
        // A fresh socket's send buffer is empty: the answer fits without waiting.
        if let Socket::Plain(tcp) = stream {
            let _ = tcp.try_write(answer.as_bytes());
        }
        return;
    };
    tokio::spawn(async move {
        let _permit = permit;
        let _ = tokio::time::timeout(Duration::from_secs(1), async {
            stream.write_all(answer.as_bytes()).await?;
            stream.shutdown().await?;
            let mut sink = [0u8; 4096];
            while stream.read(&mut sink).await? > 0 {}
            Ok::<_, std::io::Error>(())
        })
        .await;
    });
}

/// A failed `accept`: a connection reset before it was accepted is nothing;
/// running out of file descriptors is worth a warning and a pause, so the
/// loop does not spin while nothing can be accepted.
async fn accept_failed(e: std::io::Error) {
    use std::io::ErrorKind::*;
    if matches!(
        e.kind(),
        ConnectionAborted | ConnectionReset | ConnectionRefused | Interrupted
    ) {
        return;
    }
    tracing::warn!(error = %e, "cannot accept a connection");
    tokio::time::sleep(Duration::from_millis(100)).await;
}

/// `wanted` connections, at most `quarters` quarters of the open-file
/// limit (the HTTP port two, the gRPC port one; the rest is for model files
/// and the runtime), so that one port's connections cannot take the
/// descriptors the other needs.
fn connection_cap(wanted: usize, quarters: u64, key: &str) -> usize {
    let Some(files) = open_file_limit() else {
        return wanted;
    };
    let cap = usize::try_from(files / 4 * quarters).unwrap_or(usize::MAX).max(1);
    if wanted > cap {
        tracing::warn!(
            max_connections = wanted,
            open_file_limit = files,
            cap,
            "{key} is above {quarters} quarter(s) of the open-file limit; capped"
        );
    }
    wanted.min(cap)
}

/// The soft open-file limit (RLIMIT_NOFILE), if it can be read.
fn open_file_limit() -> Option<u64> {
    rlimit::Resource::NOFILE.get_soft().ok()
}

/// Raises the soft open-file limit to the hard one (a process may, without
/// privileges), so that the connection limit, not the descriptor table,
/// decides how many clients are served. Returns the soft limit now.
pub fn raise_open_file_limit() -> Option<u64> {
    let (soft, hard) = rlimit::Resource::NOFILE.get().ok()?;
    if soft >= hard {
        return Some(soft);
    }
    match rlimit::Resource::NOFILE.set(hard, hard) {
        Ok(()) => {
            tracing::info!(from = soft, to = hard, "open-file limit raised");
            Some(hard)
        }
        Err(e) => {
            tracing::warn!(error = %e, soft, "cannot raise the open-file limit");
            Some(soft)
        }
    }
}
