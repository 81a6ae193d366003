//! Liveness and readiness: 200 with an empty body when true, 503 when not.

use axum::extract::State;
use axum::http::StatusCode;

use super::request::AppState;

/// The process is up and answering.
pub async fn live() -> StatusCode {
    StatusCode::OK
}

/// The start-up load is done and shutdown has not begun.
pub async fn ready(State(state): State<AppState>) -> StatusCode {
    if state.is_ready() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    }
}
