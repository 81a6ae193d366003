//! Open Inference Protocol (KServe V2) REST handlers.

use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use tracing::Instrument;

use super::error::ApiError;
use super::request::{self, body_bytes, observe, Admission, ApiPath, AppState};
use crate::protocol::statistics::StatisticsResponse;
use crate::protocol::v2::{ModelMetadata, ServerMetadata};
use crate::protocol::v2_binary::{self, EncodedResponse, HEADER_LENGTH};
use crate::telemetry;

/// `/v2/models/{name}[/versions/{version}]...`
#[derive(Debug, Deserialize)]
pub struct ModelPath {
    name: String,
    #[serde(default)]
    version: Option<String>,
}

impl ModelPath {
    /// The model of an infer path the router would send to [`infer`]
    /// (`/v2/models/{name}[/versions/{version}]/infer`), when its segments
    /// need no percent-decoding; `None` sends the request through the router.
    pub(crate) fn of_infer(path: &str) -> Option<ModelPath> {
        let rest = path.strip_prefix("/v2/models/")?.strip_suffix("/infer")?;
        if rest.contains('%') {
            return None;
        }
        let mut segments = rest.split('/');
        let (name, version) = match (segments.next(), segments.next(), segments.next(), segments.next()) {
            (Some(name), None, _, _) => (name, None),
            (Some(name), Some("versions"), Some(version), None) => (name, Some(version)),
            _ => return None,
        };
        if name.is_empty() || version.is_some_and(str::is_empty) {
            return None;
        }
        Some(ModelPath {
            name: name.to_string(),
            version: version.map(str::to_string),
        })
    }
}

/// `GET /v2`
pub async fn server_metadata() -> Json<ServerMetadata> {
    Json(ServerMetadata::sluice())
}

/// `GET /v2/models/{name}[/versions/{version}]`: name, versions, platform, signature.
pub async fn model_metadata(
    State(state): State<AppState>,
    ApiPath(p): ApiPath<ModelPath>,
) -> Result<Json<ModelMetadata>, ApiError> {
    let model = state
        .registry
        .serve(&p.name, p.version.as_deref(), Instant::now())
        .await?;
    let mut metadata = ModelMetadata::new(&model.name, model.version(), &model.client_signature());
    metadata.platform = model.platform().into();
    metadata.with_versions(state.registry.ready_versions(&model.name));
    Ok(Json(metadata))
}

/// `GET /v2/models/{name}[/versions/{version}]/ready`: 200 when it serves, 503 when not.
pub async fn model_ready(
    State(state): State<AppState>,
    ApiPath(p): ApiPath<ModelPath>,
) -> Result<StatusCode, ApiError> {
    match state.registry.servable(&p.name, p.version.as_deref()) {
        Ok(_) => Ok(StatusCode::OK),
        Err(e) if super::error::status_of(e.kind()) == StatusCode::NOT_FOUND => Err(e.into()),
        Err(_) => Ok(StatusCode::SERVICE_UNAVAILABLE),
    }
}

/// `POST /v2/models/{name}[/versions/{version}]/infer`: a JSON body, or a
/// JSON header of `Inference-Header-Content-Length` bytes followed by binary
/// tensor data; the answer is JSON, or JSON and binary outputs as asked.
pub async fn infer(
    State(state): State<AppState>,
    admission: Admission,
    ApiPath(p): ApiPath<ModelPath>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body_bytes(body, state.max_body_bytes);
    answer_infer(&state, admission, p, &headers, body).await
}

/// The infer route without the router (its extractors, middleware and
/// boxed layers cost about a tenth of the server CPU of a small request):
/// `serve` calls this for a `POST` whose path [`ModelPath::of_infer`]
/// reads, and it checks and answers exactly as `guard` and [`infer`] do.
pub(crate) async fn infer_direct(state: AppState, path: ModelPath, req: axum::extract::Request) -> Response {
    let (parts, body) = req.into_parts();
    let held = match request::admit(&state, parts.uri.path(), &parts.headers) {
        Ok(held) => held,
        Err(e) => return e.into_response(),
    };
    let admission = Admission::now(&state);
    let body = request::read_body(body, state.max_body_bytes).await;
    let answer = answer_infer(&state, admission, path, &parts.headers, body)
        .await
        .into_response();
    request::hold_until_sent(&state, held, answer)
}

/// The infer route's answer once the request is admitted and its body read.
async fn answer_infer(
    state: &AppState,
    admission: Admission,
    p: ModelPath,
    headers: &HeaderMap,
    body: Result<Bytes, ApiError>,
) -> Result<Response, ApiError> {
    let arrival = Instant::now();
    let span = telemetry::request_span("v2", &p.name, &request::trace_parent(headers));
    let log = request::InferLog::new(state, &p.name, "v2", headers);
    let result: Result<Response, ApiError> = async {
        admission.check()?;
        let bytes = body?;
        log.request(headers, &bytes);
        let body_len = bytes.len();
        let model = state
            .registry
            .serve(&p.name, p.version.as_deref(), arrival)
            .await?;
        let header_length = headers.get(HEADER_LENGTH).map(|v| v.as_bytes().to_vec());
        // What the JSON (the whole body, or the binary extension's header)
        // may decode to, held before it is decoded.
        let json_len = v2_binary::json_length(&bytes, header_length.as_deref())?;
        let bound = state.budget.reserve_json_bound(&bytes[..json_len])?;
        let strings = state
            .budget
            .reserve_binary_strings_bound(&bytes[..json_len], body_len - json_len)?;
        // The body is freed once decoded (the tensors own their data).
        let shm = state.shm.clone();
        let decoded = request::decode_body(bytes, move |b| {
            Ok(v2_binary::decode_request(&b, header_length.as_deref(), &*shm)?)
        })
        .await?;
        drop((bound, strings));
        let _decoded = state
            .budget
            .reserve_decoded(decoded.request.held_bytes(), body_len)?;
        let resp = model.infer(decoded.request, arrival).await?;
        state.shm.write_outputs(&resp, &decoded.outputs.shm)?;
        let encoded = telemetry::encode(|| v2_binary::encode_response(&resp, &decoded.outputs));
        Ok(infer_response(encoded, &log))
    }
    .instrument(span.clone())
    .await;
    if let Err(ApiError(e)) = &result {
        log.error(e);
    }
    telemetry::finish(&span, result.as_ref().err().map(|e: &ApiError| &e.0));
    observe(&state.registry, &p.name, "v2", arrival, result)
}

/// The HTTP response for an encoded infer answer: JSON, or JSON followed by
/// binary data with its header length.
fn infer_response(enc: EncodedResponse, log: &request::InferLog<'_>) -> Response {
    let body = Bytes::from(enc.body);
    let Some(n) = enc.header_length else {
        log.answer("application/json", &body);
        return (
            [(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))],
            body,
        )
            .into_response();
    };
    log.answer("application/octet-stream", &body);
    (
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            ),
            (
                header::HeaderName::from_static("inference-header-content-length"),
                HeaderValue::from(n),
            ),
        ],
        body,
    )
        .into_response()
}

/// `GET /v2/models/{name}[/versions/{version}]/config`: the model's
/// configuration in Triton's shape (model-configuration extension).
pub async fn model_config(
    State(state): State<AppState>,
    ApiPath(p): ApiPath<ModelPath>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let model = state
        .registry
        .serve(&p.name, p.version.as_deref(), Instant::now())
        .await?;
    Ok(Json(crate::triton::config::to_json(&model.config())))
}

/// `GET /v2/models/{name}[/versions/{version}]/stats`: the model's
/// cumulative statistics (statistics extension).
pub async fn model_stats(
    State(state): State<AppState>,
    ApiPath(p): ApiPath<ModelPath>,
) -> Result<Json<StatisticsResponse>, ApiError> {
    let model = state.registry.ready(&p.name, p.version.as_deref())?;
    Ok(Json(StatisticsResponse {
        model_stats: vec![model.statistics()],
    }))
}

/// `GET /v2/models/stats`: the statistics of every model that serves.
pub async fn all_stats(State(state): State<AppState>) -> Json<StatisticsResponse> {
    let model_stats = state
        .registry
        .list()
        .into_iter()
        .filter_map(|e| e.handle)
        .map(|m| m.statistics())
        .collect();
    Json(StatisticsResponse { model_stats })
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
    /// What the serving version holds in memory (sluice's addition, for
    /// placement by e.g. ModelMesh); absent when no version serves.
    #[serde(skip_serializing_if = "Option::is_none")]
    memory: Option<crate::model::Memory>,
    /// Whether the serving version batches requests together: `on, along
    /// …`, or `off: why` (sluice's addition); absent when no version serves.
    #[serde(skip_serializing_if = "Option::is_none")]
    batching: Option<String>,
    /// Why the serving version rejected its warm-up, when it did: it serves
    /// cold (sluice's addition).
    #[serde(skip_serializing_if = "Option::is_none")]
    warmup: Option<String>,
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
                    crate::model::state::ModelState::OnDisk => e.state.reason().map(str::to_string),
                    _ => e.note.clone(),
                },
                state: e.state.as_str(),
                memory: e.handle.as_ref().map(|h| h.memory.clone()),
                batching: e.handle.as_ref().map(|h| h.batching_report()),
                warmup: e
                    .handle
                    .as_ref()
                    .and_then(|h| h.warmup_rejected.as_ref())
                    .map(|why| format!("rejected by the model, which serves cold: {why}")),
                name: e.name,
                version: e.version,
            })
            .collect(),
    )
}

/// `POST /v2/repository/models/{name}/load`: loads (or reloads) a model of the repository.
pub async fn repository_load(
    State(state): State<AppState>,
    ApiPath(name): ApiPath<String>,
    body: axum::body::Bytes,
) -> Result<Json<serde_json::Value>, ApiError> {
    // The body is optional (`{}` or nothing); its `parameters` are checked.
    let mut config = None;
    if !body.iter().all(u8::is_ascii_whitespace) {
        let parsed: serde_json::Value = serde_json::from_slice(&body).map_err(|e| {
            crate::error::Error::invalid(format!(
                "load of `{}`: invalid JSON body: {e}",
                crate::error::clip(&name)
            ))
        })?;
        let params = parsed["parameters"]
            .as_object()
            .into_iter()
            .flat_map(|p| p.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        config = crate::repository::load_parameters(&name, params)?;
    }
    state.repository.load(&name, config).await?;
    Ok(Json(serde_json::json!({})))
}

/// `POST /v2/repository/models/{name}/unload`: stops serving a model; accepted requests finish.
pub async fn repository_unload(
    State(state): State<AppState>,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    state.repository.unload(&name).await?;
    Ok(Json(serde_json::json!({})))
}

#[cfg(test)]
mod tests {
    use super::ModelPath;

    #[test]
    fn infer_paths_that_skip_the_router_are_exactly_the_routers_infer_routes() {
        let of = |p: &str| ModelPath::of_infer(p).map(|m| (m.name, m.version));
        assert_eq!(of("/v2/models/mlp/infer"), Some(("mlp".into(), None)));
        assert_eq!(
            of("/v2/models/mlp/versions/2/infer"),
            Some(("mlp".into(), Some("2".into())))
        );
        // The router decodes these, or answers 404 / 405: not taken here.
        for path in [
            "/v2/models/ml%70/infer",
            "/v2/models//infer",
            "/v2/models/mlp/versions//infer",
            "/v2/models/mlp/infer/",
            "/v2/models/mlp/ready",
            "/v2/models/a/b/infer",
            "/v2/models/mlp/version/2/infer",
            "/v2/models/infer",
            "/v1/models/mlp/infer",
        ] {
            assert_eq!(of(path), None, "{path}");
        }
    }
}
