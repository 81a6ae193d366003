//! KServe V1 REST handlers: `/v1/models`, `/v1/models/{name}`, `:predict`.

use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use tracing::Instrument;

use super::error::ApiError;
use super::request::{self, body_bytes, observe, Admission, ApiPath, AppState};
use crate::error::Error;
use crate::model::state::ModelState;
use crate::protocol::v1;
use crate::telemetry;

/// `GET /v1/models`: the names of every model in the repository.
/// One body carries both shapes: KServe V1's `{"models": [name, ...]}` and
/// OpenAI's `{"object": "list", "data": [{"id", "object", "created",
/// "owned_by"}]}` (`client.models.list()`), since both clients ask this path.
/// `created` is the time of the answer, as vLLM writes it: sluice keeps no
/// creation time of a model folder.
pub async fn list(State(state): State<AppState>) -> Json<Value> {
    let mut names: Vec<String> = state.registry.list().into_iter().map(|e| e.name).collect();
    // One name per model, however many of its versions serve.
    names.dedup();
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let data: Vec<Value> = names
        .iter()
        .map(|n| json!({"id": n, "object": "model", "created": created, "owned_by": "sluice"}))
        .collect();
    Json(json!({ "models": names, "object": "list", "data": data }))
}

/// `GET /v1/models/{name}`: `{"name", "ready"}` (and `reason` when not ready).
pub async fn status(
    State(state): State<AppState>,
    ApiPath(spec): ApiPath<String>,
) -> Result<Json<Value>, ApiError> {
    let entry = state
        .registry
        .get(&spec)
        .ok_or_else(|| Error::ModelNotFound(crate::error::clip(&spec).into_owned()))?;
    let ready = entry.state == ModelState::Ready;
    let mut body = json!({ "name": entry.name, "ready": ready });
    if let Some(reason) = entry.state.reason().filter(|_| !ready) {
        body["reason"] = json!(reason);
    }
    Ok(Json(body))
}

/// `POST /v1/models/{name}:predict` with `{"instances": [...]}`.
pub async fn predict(
    State(state): State<AppState>,
    admission: Admission,
    ApiPath(spec): ApiPath<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let arrival = Instant::now();
    let name = match spec.rsplit_once(':') {
        Some((name, "predict")) => name,
        Some((_, verb)) => {
            return Err(Error::NotFound(format!("unknown V1 verb `:{verb}` (supported: `:predict`)")).into());
        }
        None => {
            return Err(Error::NotFound(format!(
                "POST /v1/models/{spec}: did you mean /v1/models/{spec}:predict?"
            ))
            .into())
        }
    };
    let span = telemetry::request_span("v1", name, &request::trace_parent(&headers));
    let log = request::InferLog::new(&state, name, "v1", &headers);
    let result = async {
        admission.check()?;
        let bytes = body_bytes(body, state.max_body_bytes)?;
        log.request(&headers, &bytes);
        let body_len = bytes.len();
        let model = state.registry.serve(name, None, arrival).await?;
        let m = model.clone();
        let bound = state.budget.reserve_json_bound(&bytes)?;
        let req = request::decode_body(bytes, move |b| Ok(v1::decode(&b, &m.signature)?)).await?;
        drop(bound);
        let _decoded = state.budget.reserve_decoded(req.held_bytes(), body_len)?;
        let resp = model.infer(req, arrival).await?;
        let body = telemetry::encode(|| serde_json::to_vec(&v1::encode(&resp)))
            .map_err(|e| Error::Internal(format!("a V1 response did not serialize: {e}")))?;
        let body = Bytes::from(body);
        log.answer("application/json", &body);
        Ok((
            [(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))],
            body,
        )
            .into_response())
    }
    .instrument(span.clone())
    .await;
    if let Err(ApiError(e)) = &result {
        log.error(e);
    }
    telemetry::finish(&span, result.as_ref().err().map(|e: &ApiError| &e.0));
    observe(&state.registry, name, "v1", arrival, result)
}
