//! `POST /v1/embeddings`: OpenAI's embeddings API over the model's
//! pipeline, behind the same access keys, byte budget, admission and
//! request metrics as every infer route; errors in OpenAI's shape.

use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use tracing::Instrument;

use super::error::status_of;
use super::request::{self, body_bytes, observe, Admission, AppState};
use crate::error::Error;
use crate::protocol::{openai, Schedule};
use crate::telemetry;

/// An error answered in OpenAI's shape (its clients read `error.message`).
pub struct OpenAiError(pub Error);

impl IntoResponse for OpenAiError {
    fn into_response(self) -> Response {
        let api = super::error::ApiError(self.0);
        let status = status_of(api.0.kind());
        let body = openai::error_body(&api.0, status.as_u16());
        // The V2 answer carries the headers (Retry-After, WWW-Authenticate).
        let mut resp = api.into_response();
        *resp.body_mut() = axum::body::Body::from(body.to_string());
        resp
    }
}

/// `POST /v1/embeddings`.
pub async fn embeddings(
    State(state): State<AppState>,
    admission: Admission,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let arrival = Instant::now();
    let bytes = match body_bytes(body, state.max_body_bytes) {
        Ok(b) => b,
        Err(e) => return OpenAiError(e.0).into_response(),
    };
    let req = match admission
        .check()
        .map_err(|e| e.0)
        .and_then(|_| openai::decode(&bytes))
    {
        Ok(r) => r,
        Err(e) => return OpenAiError(e).into_response(),
    };
    let held = match state
        .budget
        .reserve_decoded(decoded_bytes(&req.input), bytes.len())
    {
        Ok(h) => h,
        Err(e) => return OpenAiError(e).into_response(),
    };
    let name = req.model.clone();
    let span = telemetry::request_span("openai", &name, &request::trace_parent(&headers));
    let log = request::InferLog::new(&state, &name, "openai", &headers);
    log.request(&headers, &bytes);
    let result = async {
        let model = state.registry.serve(&name, None, arrival).await?;
        let out = model
            .embed(req.input, req.dimensions, Schedule::default(), arrival)
            .await?;
        let vectors: Vec<&[f32]> = out.vectors.chunks_exact(out.dim.max(1)).collect();
        let body = Bytes::from(openai::encode(&name, &vectors, req.base64, out.tokens).to_string());
        log.answer("application/json", &body);
        Ok::<_, Error>(body)
    }
    .instrument(span.clone())
    .await;
    drop(held);
    if let Err(e) = &result {
        log.error(e);
    }
    telemetry::finish(&span, result.as_ref().err());
    match observe(
        &state.registry,
        &name,
        "openai",
        arrival,
        result.map_err(super::error::ApiError),
    ) {
        Ok(body) => (
            [(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))],
            body,
        )
            .into_response(),
        Err(e) => OpenAiError(e.0).into_response(),
    }
}

/// What the request's inputs hold once decoded.
fn decoded_bytes(input: &openai::Input) -> usize {
    match input {
        openai::Input::Texts(t) => t.iter().map(|s| s.len() + std::mem::size_of::<String>()).sum(),
        openai::Input::Tokens(t) => t
            .iter()
            .map(|ids| ids.len() * 8 + std::mem::size_of::<Vec<i64>>())
            .sum(),
    }
}
