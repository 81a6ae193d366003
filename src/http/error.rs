//! The only place that knows HTTP status codes: one table from
//! [`ErrorKind`] to status, and the `{"error": "..."}` body.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::error::{Error, ErrorKind};

/// An [`Error`] on its way out as an HTTP response.
#[derive(Debug)]
pub struct ApiError(pub Error);

impl From<Error> for ApiError {
    fn from(e: Error) -> Self {
        ApiError(e)
    }
}

/// Status for each error kind (Triton's `HttpCodeFromError` for V2; SPEC §9).
pub fn status_of(kind: ErrorKind) -> StatusCode {
    match kind {
        ErrorKind::ModelNotFound => StatusCode::NOT_FOUND,
        ErrorKind::InvalidInput => StatusCode::BAD_REQUEST,
        ErrorKind::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        ErrorKind::RequestTimeout => StatusCode::REQUEST_TIMEOUT,
        ErrorKind::Overloaded | ErrorKind::ModelNotReady | ErrorKind::ShuttingDown => {
            StatusCode::SERVICE_UNAVAILABLE
        }
        ErrorKind::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        ErrorKind::Unsupported => StatusCode::NOT_IMPLEMENTED,
        ErrorKind::Runtime | ErrorKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        ErrorKind::Unauthenticated => StatusCode::UNAUTHORIZED,
        ErrorKind::PermissionDenied => StatusCode::FORBIDDEN,
    }
}

/// 405 for a path that exists but not for `method`, with the usual
/// `{"error": ...}` body (SPEC §9: every error is JSON).
pub fn method_not_allowed(method: &axum::http::Method, path: &str) -> Response {
    let msg = format!("method {method} is not allowed on {path}");
    (
        StatusCode::METHOD_NOT_ALLOWED,
        Json(serde_json::json!({ "error": msg })),
    )
        .into_response()
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let kind = self.0.kind();
        let status = status_of(kind);
        tracing::debug!(kind = kind.as_str(), status = status.as_u16(), error = %self.0, "request failed");
        let mut resp = (status, Json(serde_json::json!({ "error": self.0.to_string() }))).into_response();
        if kind == ErrorKind::Unauthenticated {
            resp.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"sluice\""),
            );
        }
        if let Error::Overloaded { retry_after, .. }
        | Error::Busy { retry_after, .. }
        | Error::PredictedLate { retry_after, .. } = &self.0
        {
            let secs = retry_after.as_secs_f64().ceil().max(1.0) as u64;
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        resp
    }
}
