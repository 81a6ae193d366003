//! The domain error every request path returns, and its stable kind codes.
//! No HTTP here: `http/error.rs` is the one place that maps a kind to a status
//! (and the gRPC layer, later, to a gRPC code).

use std::sync::Arc;
use std::time::Duration;

/// Why a request failed. Every message names what was wrong.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// No model of that name is in the registry. The text starts as
    /// Triton's does: its clients match on it.
    #[error("Request for unknown model: '{0}' is not found")]
    ModelNotFound(String),
    /// Something else that does not exist (a model version, a route).
    #[error("{0}")]
    NotFound(String),
    /// The model exists but does not take requests now (loading, failed, unloading).
    #[error("model `{name}` is not ready: {reason}")]
    ModelNotReady { name: String, reason: String },
    /// The request is malformed or does not fit the model's signature.
    #[error("{0}")]
    InvalidInput(String),
    /// The request body is larger than the server accepts.
    #[error("{0}")]
    PayloadTooLarge(String),
    /// The client did not send the request (its body) in time.
    #[error("{0}")]
    RequestTimeout(String),
    /// The model's queue is full; retry after `retry_after`.
    #[error("model `{model}` is overloaded: its queue holds {max_queue_size} requests (max_queue_size); retry later")]
    Overloaded {
        model: String,
        max_queue_size: usize,
        retry_after: Duration,
    },
    /// At its arrival, the work ahead of the request was predicted to take
    /// it past its deadline (`refuse_predicted_late`); retry after `retry_after`.
    #[error("model `{model}` cannot answer in time: with the requests ahead of it, this one is predicted to take {}, past its timeout of {}; retry later, or raise `timeout`", Secs(*predicted), Secs(*timeout))]
    PredictedLate {
        model: String,
        predicted: Duration,
        timeout: Duration,
        retry_after: Duration,
    },
    /// The request's deadline (`timeout`) passed before it was answered.
    #[error("model `{model}`: request did not complete within its timeout of {}", Secs(*timeout))]
    DeadlineExceeded { model: String, timeout: Duration },
    /// ONNX Runtime failed while running the model.
    #[error("model `{model}`: inference failed: {message}")]
    Runtime { model: String, message: Arc<str> },
    /// The feature exists in the protocol but not in sluice.
    #[error("{0}")]
    Unsupported(String),
    /// The server is draining and takes no new requests.
    #[error("server is shutting down")]
    ShuttingDown,
    /// The server holds too many bytes of accepted requests (`http.max_inflight_bytes`).
    #[error("{message}")]
    Busy { message: String, retry_after: Duration },
    /// The endpoint needs an API key and none was sent.
    #[error("{0}")]
    Unauthenticated(String),
    /// Not allowed: a wrong key, or model control through the API is disabled.
    #[error("{0}")]
    PermissionDenied(String),
    /// A bug inside sluice (a panic caught where it happened); the message says where.
    #[error("internal error: {0}")]
    Internal(String),
    /// A chunk of a request, from a model found not to batch after all: the
    /// batcher runs the request again whole. Never reaches a client.
    #[error("model `{0}`: its outputs do not follow the batch; the request runs again whole")]
    Unbatched(String),
}

/// A name a client sent, as an error message shows it: whole up to 128
/// bytes (the longest valid model name), else its start and its length, so
/// that a huge name does not make a huge message (or a `grpc-message`
/// header clients reject).
pub fn clip(name: &str) -> std::borrow::Cow<'_, str> {
    const MAX: usize = 128;
    if name.len() <= MAX {
        return name.into();
    }
    let mut end = MAX;
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes)", &name[..end], name.len()).into()
}

/// Stable, machine-readable error codes (what callers and metrics branch on).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    ModelNotFound,
    ModelNotReady,
    InvalidInput,
    PayloadTooLarge,
    RequestTimeout,
    Overloaded,
    DeadlineExceeded,
    Runtime,
    Unsupported,
    ShuttingDown,
    Unauthenticated,
    PermissionDenied,
    Internal,
}

impl ErrorKind {
    /// snake_case code, used in logs and as a bounded metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::ModelNotFound => "model_not_found",
            ErrorKind::ModelNotReady => "model_not_ready",
            ErrorKind::InvalidInput => "invalid_input",
            ErrorKind::PayloadTooLarge => "payload_too_large",
            ErrorKind::RequestTimeout => "request_timeout",
            ErrorKind::Overloaded => "overloaded",
            ErrorKind::DeadlineExceeded => "deadline_exceeded",
            ErrorKind::Runtime => "runtime",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::ShuttingDown => "shutting_down",
            ErrorKind::Unauthenticated => "unauthenticated",
            ErrorKind::PermissionDenied => "permission_denied",
            ErrorKind::Internal => "internal",
        }
    }
}

impl Error {
    /// Shorthand for [`Error::InvalidInput`].
    pub fn invalid(msg: impl Into<String>) -> Error {
        Error::InvalidInput(msg.into())
    }

    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::ModelNotFound(_) | Error::NotFound(_) => ErrorKind::ModelNotFound,
            Error::ModelNotReady { .. } => ErrorKind::ModelNotReady,
            Error::InvalidInput(_) => ErrorKind::InvalidInput,
            Error::PayloadTooLarge(_) => ErrorKind::PayloadTooLarge,
            Error::RequestTimeout(_) => ErrorKind::RequestTimeout,
            Error::Overloaded { .. } | Error::Busy { .. } | Error::PredictedLate { .. } => {
                ErrorKind::Overloaded
            }
            Error::DeadlineExceeded { .. } => ErrorKind::DeadlineExceeded,
            Error::Runtime { .. } => ErrorKind::Runtime,
            Error::Unsupported(_) => ErrorKind::Unsupported,
            Error::ShuttingDown => ErrorKind::ShuttingDown,
            Error::Unauthenticated(_) => ErrorKind::Unauthenticated,
            Error::PermissionDenied(_) => ErrorKind::PermissionDenied,
            Error::Internal(_) | Error::Unbatched(_) => ErrorKind::Internal,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// `e` and its sources, joined with ": ".
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let m = c.to_string();
        if !s.contains(&m) {
            s.push_str(": ");
            s.push_str(&m);
        }
        cur = c.source();
    }
    s
}

/// A duration as people read it in a message, to the microsecond: "50ms",
/// "3.24s"; a prediction that saturated reads "unbounded", not `u64::MAX`
/// seconds.
pub struct Secs(pub Duration);

impl std::fmt::Display for Secs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.0 >= Duration::from_secs(365 * 24 * 3600) {
            return f.write_str("unbounded");
        }
        let us = self.0.as_micros();
        let (value, unit) = match us {
            0..1_000 => return write!(f, "{us}µs"),
            1_000..1_000_000 => (us as f64 / 1e3, "ms"),
            _ => (us as f64 / 1e6, "s"),
        };
        let text = format!("{value:.3}");
        write!(f, "{}{unit}", text.trim_end_matches('0').trim_end_matches('.'))
    }
}

#[cfg(test)]
mod secs_tests {
    use super::*;

    #[test]
    fn durations_read_as_people_write_them() {
        let cases = [
            (Duration::from_millis(50), "50ms"),
            (Duration::from_micros(81_250), "81.25ms"),
            (Duration::from_millis(3240), "3.24s"),
            (Duration::from_secs(60), "60s"),
            (Duration::from_nanos(1500), "1µs"),
            (Duration::MAX, "unbounded"),
        ];
        for (d, text) in cases {
            assert_eq!(Secs(d).to_string(), text);
        }
    }
}
