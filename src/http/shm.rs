//! Triton's shared-memory extension over HTTP: `/v2/systemsharedmemory/...`
//! (status, register, unregister: the regions are `crate::shm`'s) and
//! `/v2/cudasharedmemory/...` (status and unregister answer with no region;
//! register is refused). Thin: each handler is one call into the registry.

use axum::extract::State;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::request::{ApiPath, AppState};
use super::ApiError;
use crate::error::Error;

/// A register request's body.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Register {
    key: String,
    #[serde(default)]
    offset: usize,
    byte_size: usize,
}

/// `GET /v2/systemsharedmemory/status`.
pub async fn status_all(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    Ok(Json(json!(state.shm.status(None)?)))
}

/// `GET /v2/systemsharedmemory/region/{name}/status`.
pub async fn status(
    State(state): State<AppState>,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(json!(state.shm.status(Some(&name))?)))
}

/// `POST /v2/systemsharedmemory/region/{name}/register`.
pub async fn register(
    State(state): State<AppState>,
    ApiPath(name): ApiPath<String>,
    body: axum::body::Bytes,
) -> Result<Json<Value>, ApiError> {
    let r: Register = serde_json::from_slice(&body).map_err(|e| {
        Error::invalid(format!(
            "shared memory region '{}': the body must be {{\"key\": ..., \"offset\": ..., \"byte_size\": ...}}: {e}",
            crate::error::clip(&name)
        ))
    })?;
    state.shm.register(&name, &r.key, r.offset, r.byte_size)?;
    Ok(Json(json!({})))
}

/// `POST /v2/systemsharedmemory/unregister`.
pub async fn unregister_all(State(state): State<AppState>) -> Json<Value> {
    state.shm.unregister(None);
    Json(json!({}))
}

/// `POST /v2/systemsharedmemory/region/{name}/unregister`.
pub async fn unregister(State(state): State<AppState>, ApiPath(name): ApiPath<String>) -> Json<Value> {
    state.shm.unregister(Some(&name));
    Json(json!({}))
}

/// `GET /v2/cudasharedmemory/status`: no CUDA region is ever registered.
pub async fn cuda_status_all() -> Json<Value> {
    Json(json!([]))
}

/// `GET /v2/cudasharedmemory/region/{name}/status`.
pub async fn cuda_status(ApiPath(name): ApiPath<String>) -> ApiError {
    ApiError(crate::shm::cuda_not_found(&name))
}

/// `POST /v2/cudasharedmemory/region/{name}/register`: refused.
pub async fn cuda_register(ApiPath(name): ApiPath<String>) -> ApiError {
    ApiError(crate::shm::cuda_refused(&name))
}

/// `POST /v2/cudasharedmemory/[region/{name}/]unregister`: nothing to do.
pub async fn cuda_unregister() -> Json<Value> {
    Json(json!({}))
}
