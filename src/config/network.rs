//! The network-facing sections: `[http]`, `[grpc]` and `[auth]`.

use std::net::IpAddr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// API keys (checked by the `access` module). Unset: that scope needs no key.
#[derive(Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// Key for every model endpoint (infer, predict, metadata, config, stats, index).
    pub inference_api_key: Option<String>,
    /// Key for repository load and unload (with `model_repository.control = "api"`).
    pub control_api_key: Option<String>,
}

impl std::fmt::Debug for AuthConfig {
    /// Never prints the keys (the effective configuration is logged).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shown = |k: &Option<String>| k.as_ref().map(|_| "<set>");
        f.debug_struct("AuthConfig")
            .field("inference_api_key", &shown(&self.inference_api_key))
            .field("control_api_key", &shown(&self.control_api_key))
            .finish()
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    pub host: IpAddr,
    pub port: u16,
    pub max_body_bytes: usize,
    /// Seconds a client has to send a request's line and headers (from
    /// the connection's accept, or from the first byte of a later request).
    pub header_read_timeout_seconds: f64,
    /// Seconds a client has to send a request's body, from its headers.
    pub body_read_timeout_seconds: f64,
    /// Seconds an idle keep-alive connection stays open between requests.
    pub keep_alive_timeout_seconds: f64,
    /// Seconds an answer may go without the client reading any of it; then
    /// the connection is closed (its answers' bytes leave the budget).
    pub write_timeout_seconds: f64,
    /// Most open HTTP connections (capped by the open-file limit).
    pub max_connections: usize,
    /// Largest request line and headers, in bytes.
    pub max_header_bytes: usize,
    /// Most bytes that accepted requests (HTTP and gRPC) may hold at once;
    /// 0 = a quarter of the memory the process may use.
    pub max_inflight_bytes: usize,
    /// Threads that run both ports' protocol work and the batchers (the
    /// async runtime's workers); 0 = one per core (or `TOKIO_WORKER_THREADS`).
    pub worker_threads: usize,
}

/// The HTTP port's limits, validated and typed (from [`HttpConfig`]).
#[derive(Debug, Clone, PartialEq)]
pub struct HttpLimits {
    pub header_read_timeout: Duration,
    pub body_read_timeout: Duration,
    pub keep_alive_timeout: Duration,
    pub write_timeout: Duration,
    pub max_connections: usize,
    pub max_header_bytes: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GrpcConfig {
    pub port: u16,
    /// Largest gRPC message accepted or sent, in bytes.
    pub max_message_bytes: usize,
    /// Requests of one `ModelStreamInfer` stream being run or answered at once;
    /// the stream's next message is read only when one finishes.
    pub max_outstanding_per_stream: usize,
    /// Most open gRPC connections (the port's other limits are `[http]`'s).
    pub max_connections: usize,
    /// Most concurrent calls (HTTP/2 streams) on one gRPC connection.
    pub max_concurrent_streams: u32,
    /// Bytes one connection's `ModelStreamInfer` streams may hold (requests
    /// read, answers not yet taken by the client); past it, they read no
    /// more messages until the client reads. 0: an eighth of `http.max_inflight_bytes`.
    pub max_connection_bytes: usize,
    /// Seconds without frames after which a gRPC connection is pinged; one
    /// that does not answer in as long is closed. 0 = no pings.
    pub keep_alive_ping_seconds: f64,
}

impl GrpcConfig {
    /// What one connection's streams may hold, given the requests' budget.
    pub fn connection_bytes(&self, budget: usize) -> usize {
        match self.max_connection_bytes {
            0 => (budget / 8).max(1),
            n => n,
        }
    }

    /// The `[grpc]` limits' problems.
    pub(super) fn validate(&self, errs: &mut Vec<String>) {
        if !(1..=1_000_000).contains(&self.max_connections) {
            errs.push(format!(
                "grpc.max_connections must be 1..=1000000, got {}",
                self.max_connections
            ));
        }
        if !(1..=100_000).contains(&self.max_concurrent_streams) {
            errs.push(format!(
                "grpc.max_concurrent_streams must be 1..=100000, got {}",
                self.max_concurrent_streams
            ));
        }
        let p = self.keep_alive_ping_seconds;
        if !(p.is_finite() && (0.0..=86400.0).contains(&p)) {
            errs.push(format!(
                "grpc.keep_alive_ping_seconds must be 0 (off) ..= 86400, got {p}"
            ));
        }
    }

    /// The keep-alive ping interval (`None`: off). Call after validation.
    pub fn keep_alive_ping(&self) -> Option<Duration> {
        (self.keep_alive_ping_seconds > 0.0).then(|| Duration::from_secs_f64(self.keep_alive_ping_seconds))
    }
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            host: IpAddr::from([0, 0, 0, 0]),
            port: 8080,
            max_body_bytes: 64 << 20,
            header_read_timeout_seconds: 10.0,
            body_read_timeout_seconds: 60.0,
            keep_alive_timeout_seconds: 75.0,
            write_timeout_seconds: 60.0,
            max_connections: 10_000,
            max_header_bytes: 64 << 10,
            max_inflight_bytes: 0,
            worker_threads: 0,
        }
    }
}

impl Default for GrpcConfig {
    fn default() -> Self {
        GrpcConfig {
            port: 8081,
            max_message_bytes: 64 << 20,
            max_outstanding_per_stream: 64,
            max_connections: 1000,
            max_concurrent_streams: 200,
            max_connection_bytes: 0,
            keep_alive_ping_seconds: 60.0,
        }
    }
}

impl HttpConfig {
    /// The `[http]` limits' problems (timeouts, connections, header size).
    pub(super) fn validate(&self, errs: &mut Vec<String>) {
        let h = self;
        for (key, secs) in [
            ("header_read_timeout_seconds", h.header_read_timeout_seconds),
            ("body_read_timeout_seconds", h.body_read_timeout_seconds),
            ("keep_alive_timeout_seconds", h.keep_alive_timeout_seconds),
            ("write_timeout_seconds", h.write_timeout_seconds),
        ] {
            if !(secs.is_finite() && secs > 0.0 && secs <= 86400.0) {
                errs.push(format!("http.{key} must be > 0 and <= 86400 seconds, got {secs}"));
            }
        }
        if h.worker_threads > 1024 {
            errs.push(format!(
                "http.worker_threads must be 0 (one per core) ..= 1024, got {}",
                h.worker_threads
            ));
        }
        if !(1..=1_000_000).contains(&h.max_connections) {
            errs.push(format!(
                "http.max_connections must be 1..=1000000, got {}",
                h.max_connections
            ));
        }
        // hyper's smallest read buffer is 8 KiB.
        if !(8192..=(16 << 20)).contains(&h.max_header_bytes) {
            errs.push(format!(
                "http.max_header_bytes must be 8192..=16777216, got {}",
                h.max_header_bytes
            ));
        }
    }

    /// The validated HTTP limits. Call after [`Config::validate`](super::Config::validate).
    pub fn limits(&self) -> HttpLimits {
        let h = self;
        HttpLimits {
            header_read_timeout: Duration::from_secs_f64(h.header_read_timeout_seconds),
            body_read_timeout: Duration::from_secs_f64(h.body_read_timeout_seconds),
            keep_alive_timeout: Duration::from_secs_f64(h.keep_alive_timeout_seconds),
            write_timeout: Duration::from_secs_f64(h.write_timeout_seconds),
            max_connections: h.max_connections,
            max_header_bytes: h.max_header_bytes,
        }
    }
}
