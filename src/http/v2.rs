//! Open Inference Protocol (KServe V2) REST handlers.

use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use serde::Deserialize;

use super::{body_bytes, observe, parse_json, ApiError, AppState};
use crate::protocol::v2::{InferenceRequest, InferenceResponse, ModelMetadata, ServerMetadata};
use crate::protocol::InferRequest;

/// `/v2/models/{name}[/versions/{version}]...`
#[derive(Debug, Deserialize)]
pub struct ModelPath {
    name: String,
    #[serde(default)]
    version: Option<String>,
}

/// `GET /v2`
pub async fn server_metadata() -> Json<ServerMetadata> {
    Json(ServerMetadata {
        name: "sluice".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        extensions: vec!["model_repository".into()],
    })
}

/// `GET /v2/models/{name}[/versions/{version}]`: name, versions, platform, signature.
pub async fn model_metadata(
    State(state): State<AppState>,
    Path(p): Path<ModelPath>,
) -> Result<Json<ModelMetadata>, ApiError> {
    let model = state.registry.ready(&p.name, p.version.as_deref())?;
    Ok(Json(ModelMetadata::new(
        &model.name,
        model.version(),
        &model.signature,
    )))
}

/// `GET /v2/models/{name}[/versions/{version}]/ready`: 200 when it serves, 503 when not.
pub async fn model_ready(
    State(state): State<AppState>,
    Path(p): Path<ModelPath>,
) -> Result<StatusCode, ApiError> {
    match state.registry.ready(&p.name, p.version.as_deref()) {
        Ok(_) => Ok(StatusCode::OK),
        Err(e) if super::status_of(e.kind()) == StatusCode::NOT_FOUND => Err(e.into()),
        Err(_) => Ok(StatusCode::SERVICE_UNAVAILABLE),
    }
}

/// `POST /v2/models/{name}[/versions/{version}]/infer`
pub async fn infer(
    State(state): State<AppState>,
    Path(p): Path<ModelPath>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<InferenceResponse>, ApiError> {
    let arrival = Instant::now();
    let result = async {
        let bytes = body_bytes(body, state.max_body_bytes)?;
        let model = state.registry.ready(&p.name, p.version.as_deref())?;
        let wire: InferenceRequest = parse_json(&bytes)?;
        let req = InferRequest::try_from(wire)?;
        let resp = model.infer(req, arrival).await?;
        Ok(Json(InferenceResponse::from(&resp)))
    }
    .await;
    observe(&state.registry, &p.name, "v2", arrival, result)
}

/// One model in the repository index.
#[derive(Debug, serde::Serialize)]
pub struct IndexEntry {
    name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    version: Option<String>,
    state: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
}

/// `POST /v2/repository/index`: every model with its state and, when not ready, why.
pub async fn repository_index(State(state): State<AppState>) -> Json<Vec<IndexEntry>> {
    Json(
        state
            .registry
            .list()
            .into_iter()
            .map(|e| IndexEntry {
                reason: match &e.state {
                    crate::model::state::ModelState::Unavailable { reason } => Some(reason.clone()),
                    _ => e.note.clone(),
                },
                state: e.state.as_str(),
                name: e.name,
                version: e.version,
            })
            .collect(),
    )
}

/// `POST /v2/repository/models/{name}/load`: loads (or reloads) a model of the repository.
pub async fn repository_load(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    state.repository.load(&name).await?;
    Ok(Json(serde_json::json!({})))
}

/// `POST /v2/repository/models/{name}/unload`: stops serving a model; accepted requests finish.
pub async fn repository_unload(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    state.repository.unload(&name).await?;
    Ok(Json(serde_json::json!({})))
}
