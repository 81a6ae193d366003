//! What the handlers share, below the router: the server state, admission
//! (access and the byte budget), the path extractor, reading and decoding
//! a body (off the async runtime when large), and the per-request metrics.
//! The router (`mod.rs`) and every handler import from here; nothing here
//! imports them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderMap, StatusCode};

use super::error::ApiError;
use crate::access::Scope;
use crate::error::Error;
use crate::repository::{Registry, RepositoryHandle};

/// What every handler shares: one allocation behind an `Arc`, so that the
/// clone axum makes for each extractor and middleware is one atomic
/// increment (a clone of the fields was eight, and the repository handle's
/// sender, per request).
#[derive(Clone)]
pub struct AppState(Arc<SharedState>);

impl AppState {
    pub fn new(shared: SharedState) -> AppState {
        AppState(Arc::new(shared))
    }
}

impl std::ops::Deref for AppState {
    type Target = SharedState;
    fn deref(&self) -> &SharedState {
        &self.0
    }
}

/// The fields of [`AppState`].
pub struct SharedState {
    /// Read-only view of the models; the repository task writes it.
    pub registry: Arc<Registry>,
    /// Commands to the repository task (repository API load/unload).
    pub repository: RepositoryHandle,
    /// True once the start-up load finished, false again from the moment
    /// shutdown begins. Written by `lib::Server`; read by `/v2/health/ready`.
    pub ready: Arc<AtomicBool>,
    /// What readiness also asks of the models (one model's, every model's).
    pub ready_rule: crate::repository::ReadyRule,
    /// True from the moment shutdown begins: new inference requests get 503
    /// while accepted ones finish. Written by `lib::Server`.
    pub stopping: Arc<AtomicBool>,
    /// Largest accepted request body.
    pub max_body_bytes: usize,
    /// Renders the process's Prometheus metrics for `/metrics`.
    pub metrics: metrics_exporter_prometheus::PrometheusHandle,
    /// Who may call what (API keys, model control); checked by [`guard`].
    pub access: crate::access::Access,
    /// Bytes held by accepted requests, shared with the gRPC port; reserved by [`guard`].
    pub budget: crate::budget::ByteBudget,
    /// The registered shared-memory regions, shared with the gRPC port.
    pub shm: Arc<crate::shm::SharedMemory>,
    /// `/metrics` also shows Triton's names (`[metrics] triton_names`).
    pub triton_metrics: bool,
    /// Where inference requests and answers are logged (`[inference_log]`), if anywhere.
    pub inference_log: Option<Arc<crate::inference_log::InferenceLog>>,
}

/// One request's events in the inference log, as the HTTP port reads and
/// answers them (see [`crate::inference_log::RequestLog`]).
pub(crate) struct InferLog<'a>(crate::inference_log::RequestLog<'a>);

impl<'a> InferLog<'a> {
    /// The request's id is its `x-request-id`, when it sends one.
    pub(crate) fn new(
        state: &'a AppState,
        model: &'a str,
        protocol: &'static str,
        headers: &HeaderMap,
    ) -> Self {
        let given = headers.get("x-request-id").and_then(|v| v.to_str().ok());
        InferLog(crate::inference_log::RequestLog::new(
            state.inference_log.as_deref(),
            model,
            protocol,
            given,
        ))
    }

    /// Logs the request's body as received.
    pub(crate) fn request(&self, headers: &HeaderMap, body: &Bytes) {
        let ct = headers
            .get(axum::http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("application/json");
        self.0.request(ct, || body.clone());
    }

    /// Logs the answer's body as sent (`content_type`, status 200).
    pub(crate) fn answer(&self, content_type: &str, body: &Bytes) {
        self.0.answer(content_type, || body.clone());
    }

    /// Logs an error answer, with the status this port answers it with.
    pub(crate) fn error(&self, e: &Error) {
        self.0.error(super::error::status_of(e.kind()).as_u16(), e);
    }
}

impl SharedState {
    /// Server readiness: the start-up load is done, shutdown has not begun,
    /// and the models meet the readiness rule.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire) && self.registry.meets(&self.ready_rule)
    }
}

/// Whether an inference request arrived before shutdown began. Taken from
/// the request's head, before its body is read: a request accepted before
/// shutdown is answered even when its body arrives during the drain.
pub(crate) struct Admission {
    stopping: bool,
}

impl Admission {
    /// Whether shutdown has begun, read now (from the request's head).
    pub(crate) fn now(state: &AppState) -> Admission {
        Admission {
            stopping: state.stopping.load(Ordering::Acquire),
        }
    }

    /// `Err(ShuttingDown)` (503) when the request arrived after shutdown began.
    pub(crate) fn check(&self) -> Result<(), ApiError> {
        if self.stopping {
            return Err(ApiError(Error::ShuttingDown));
        }
        Ok(())
    }
}

impl axum::extract::FromRequestParts<AppState> for Admission {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        _: &mut axum::http::request::Parts,
        state: &AppState,
    ) -> Result<Self, std::convert::Infallible> {
        Ok(Admission {
            stopping: state.stopping.load(Ordering::Acquire),
        })
    }
}

/// `axum::extract::Path` whose rejection (a segment that is not UTF-8 once
/// percent-decoded, say) is the usual JSON 400 naming the problem.
pub(crate) struct ApiPath<T>(pub T);

impl<T, S> axum::extract::FromRequestParts<S> for ApiPath<T>
where
    T: serde::de::DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut axum::http::request::Parts, state: &S) -> Result<Self, ApiError> {
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(t)) => Ok(ApiPath(t)),
            Err(rej) => Err(ApiError(Error::invalid(format!(
                "invalid request path {}: {}",
                parts.uri.path(),
                rej.body_text()
            )))),
        }
    }
}

/// What a path asks to do; `None` for what stays open (health, server
/// metadata, `/metrics`: probes and Prometheus carry no keys).
fn scope_of(path: &str) -> Option<Scope> {
    match path {
        "/v2" | "/v2/health/live" | "/v2/health/ready" | "/metrics" => None,
        p if p.starts_with("/v2/repository/models/") && (p.ends_with("/load") || p.ends_with("/unload")) => {
            Some(Scope::Control)
        }
        _ => Some(Scope::Inference),
    }
}

/// `answer` with the request's reservation and its own bytes held until it
/// has been sent (see [`crate::budget::HeldUntilSent`]).
pub(crate) fn hold_until_sent(
    state: &AppState,
    request: crate::budget::Reservation,
    mut answer: axum::response::Response,
) -> axum::response::Response {
    let bytes = http_body::Body::size_hint(answer.body()).lower();
    let answer_bytes = state.budget.charge(usize::try_from(bytes).unwrap_or(usize::MAX));
    let held = crate::budget::HeldUntilSent::new(request, answer_bytes);
    answer.extensions_mut().insert(held);
    answer
}

/// [`guard`]'s checks of a request to `path` (also made by the infer route
/// that skips the router): the body's bytes stay reserved while the
/// returned reservation lives.
pub(super) fn admit(
    state: &AppState,
    path: &str,
    headers: &axum::http::HeaderMap,
) -> Result<crate::budget::Reservation, ApiError> {
    if let Some(scope) = scope_of(path) {
        let key = crate::access::presented_key(|name| headers.get(name).and_then(|v| v.to_str().ok()));
        state.access.check(scope, key).map_err(ApiError)?;
    }
    state
        .budget
        .reserve(body_size(headers, state.max_body_bytes))
        .map_err(ApiError)
}

/// The bytes a request's body will hold: its `Content-Length` (at most the
/// body limit), or the body limit for a chunked body of unknown size.
fn body_size(headers: &axum::http::HeaderMap, limit: usize) -> usize {
    use axum::http::header::{CONTENT_LENGTH, TRANSFER_ENCODING};
    let length = headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.trim().parse::<usize>().ok());
    match length {
        Some(n) => n.min(limit),
        None if headers.contains_key(TRANSFER_ENCODING) => limit,
        None => 0,
    }
}

/// Records a finished inference request (`sluice_requests_total`,
/// `sluice_request_duration_seconds`) and passes the result through.
pub(crate) fn observe<T>(
    registry: &Registry,
    model: &str,
    protocol: &'static str,
    arrival: std::time::Instant,
    result: Result<T, ApiError>,
) -> Result<T, ApiError> {
    let error = result.as_ref().err().map(|e| &e.0);
    crate::metrics::request(registry.metric_label(model), protocol, error, arrival.elapsed());
    result
}

/// The caller's trace from a request's `traceparent` / `tracestate` headers.
pub(crate) fn trace_parent(headers: &axum::http::HeaderMap) -> crate::telemetry::Parent {
    crate::telemetry::Parent::extract(|name| headers.get(name).and_then(|v| v.to_str().ok()))
}

/// The request body, or the error naming why it could not be read (413 when
/// it is over `http.max_body_bytes`).
pub(crate) fn body_bytes(body: Result<Bytes, BytesRejection>, limit: usize) -> Result<Bytes, ApiError> {
    body.map_err(|rej| {
        body_error(&rej, rej.status() == StatusCode::PAYLOAD_TOO_LARGE, limit, || {
            rej.to_string()
        })
    })
}

/// The request body read as axum's `Bytes` extractor reads it under
/// `DefaultBodyLimit` (for the route that skips the router), with
/// [`body_bytes`]'s errors. A body that arrives in one frame (the usual
/// small request) is handed on as it is, neither copied nor listed.
pub(super) async fn read_body(body: axum::body::Body, limit: usize) -> Result<Bytes, ApiError> {
    use http_body_util::BodyExt;
    let failed = |e: axum::BoxError| {
        let too_large = find_source::<http_body_util::LengthLimitError>(&*e).is_some();
        body_error(&*e, too_large, limit, || {
            format!("Failed to buffer the request body: {e}")
        })
    };
    let mut body = std::pin::pin!(http_body_util::Limited::new(body, limit));
    let mut first: Option<Bytes> = None;
    let mut joined: Option<bytes::BytesMut> = None;
    while let Some(frame) = body.frame().await {
        // Trailers are not part of the body (as in `Collected::to_bytes`).
        let Ok(data) = frame.map_err(failed)?.into_data() else {
            continue;
        };
        match (&mut joined, first.take()) {
            (Some(all), _) => all.extend_from_slice(&data),
            (None, None) => first = Some(data),
            (None, Some(head)) => {
                // The rest of the body, where its length is known.
                let rest = usize::try_from(http_body::Body::size_hint(&*body).lower()).unwrap_or(0);
                let mut all = bytes::BytesMut::with_capacity(head.len() + data.len() + rest.min(limit));
                all.extend_from_slice(&head);
                all.extend_from_slice(&data);
                joined = Some(all);
            }
        }
    }
    Ok(match joined {
        Some(all) => all.freeze(),
        None => first.unwrap_or_default(),
    })
}

/// Why a body could not be read: 408 when it was too slow, 413 when it was
/// `too_large`, else 400 with `text`.
fn body_error(
    e: &(dyn std::error::Error + 'static),
    too_large: bool,
    limit: usize,
    text: impl FnOnce() -> String,
) -> ApiError {
    if let Some(timeout) = find_source::<crate::transport::BodyReadTimeout>(e) {
        ApiError(Error::RequestTimeout(timeout.to_string()))
    } else if too_large {
        ApiError(Error::PayloadTooLarge(format!(
            "request body is larger than the limit of {limit} bytes (http.max_body_bytes)"
        )))
    } else {
        ApiError(Error::invalid(format!(
            "cannot read the request body: {}",
            text()
        )))
    }
}

/// The first error of type `E` in `e`'s chain of sources.
fn find_source<'a, E: std::error::Error + 'static>(
    e: &'a (dyn std::error::Error + 'static),
) -> Option<&'a E> {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(found) = err.downcast_ref::<E>() {
            return Some(found);
        }
        cur = err.source();
    }
    None
}

/// Bodies above this size are decoded on a blocking thread, so that a large
/// JSON body (tens of milliseconds to parse) does not hold up the async
/// workers that serve every other request.
const DECODE_INLINE_BYTES: usize = 256 << 10;

/// Runs `decode` over the body, off the async workers when the body is
/// large; the body is dropped as soon as it is decoded.
pub(crate) async fn decode_body<T: Send + 'static>(
    bytes: Bytes,
    decode: impl FnOnce(Bytes) -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    if bytes.len() <= DECODE_INLINE_BYTES {
        return decode(bytes);
    }
    tokio::task::spawn_blocking(move || decode(bytes))
        .await
        .map_err(|e| {
            ApiError(Error::Internal(format!(
                "decoding the request body panicked: {e}"
            )))
        })?
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A body that arrives in `parts`, one frame each.
    fn body_of(parts: &[&'static [u8]]) -> axum::body::Body {
        let frames = parts
            .iter()
            .map(|p| Ok::<_, std::io::Error>(Bytes::from_static(p)));
        axum::body::Body::from_stream(futures_util::stream::iter(frames.collect::<Vec<_>>()))
    }

    #[tokio::test]
    async fn a_body_is_read_whole_from_one_frame_or_several() {
        assert_eq!(read_body(body_of(&[]), 100).await.unwrap(), Bytes::new());
        assert_eq!(read_body(body_of(&[b"abc"]), 100).await.unwrap(), &b"abc"[..]);
        let three = read_body(body_of(&[b"ab", b"", b"cde", b"f"]), 100)
            .await
            .unwrap();
        assert_eq!(three, &b"abcdef"[..]);
    }

    #[tokio::test]
    async fn a_body_over_the_limit_is_413_whether_in_one_frame_or_several() {
        for parts in [&[&b"0123456789"[..]][..], &[b"01234", b"56789"]] {
            let e = read_body(body_of(parts), 8).await.unwrap_err();
            assert_eq!(
                axum::response::IntoResponse::into_response(e).status(),
                StatusCode::PAYLOAD_TOO_LARGE
            );
        }
    }
}
