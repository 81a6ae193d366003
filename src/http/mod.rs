//! HTTP front end (axum), the router on top: the routes, the guard that
//! checks access and reserves the byte budget before any handler, and the
//! fallbacks. Handlers (`v1.rs`, `v2.rs`, `health.rs`) only translate: body
//! → `protocol` → registry → model → `protocol` → response; what they share
//! is in `request.rs`, below them; status codes are decided in `error.rs`
//! alone. No file of this folder imports this one. The transport under it
//! (`crate::transport`) runs the connections.

mod error;
mod health;
mod openai;
mod request;
mod shm;
mod v1;
mod v2;

use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::Router;

pub use error::{status_of, ApiError};
use request::{admit, hold_until_sent};
pub use request::{AppState, SharedState};

use crate::error::Error;

/// The HTTP port's routes: the router, and the infer route that skips it
/// (the hot path, asked first).
#[derive(Clone)]
pub struct Routes {
    router: Router,
    state: AppState,
}

impl Routes {
    pub fn new(state: AppState) -> Routes {
        Routes {
            router: router(state.clone()),
            state,
        }
    }

    /// The model of `req` when the route that skips the router answers it
    /// (a `POST` to an infer path; see [`v2::ModelPath::of_infer`]).
    fn direct(&self, req: &axum::extract::Request) -> Option<v2::ModelPath> {
        match req.method() == axum::http::Method::POST {
            true => v2::ModelPath::of_infer(req.uri().path()),
            false => None,
        }
    }

    /// The answer of the route that skips the router to `req`, for `path`
    /// from [`Routes::direct`].
    fn infer(
        &self,
        path: v2::ModelPath,
        req: axum::extract::Request,
    ) -> impl std::future::Future<Output = axum::response::Response> + Send + 'static {
        v2::infer_direct(self.state.clone(), path, req)
    }
}

/// The HTTP port's service, as the transport calls it for every request.
impl tower_service::Service<axum::http::Request<crate::transport::TimedBody>> for Routes {
    type Response = axum::response::Response;
    type Error = std::convert::Infallible;
    type Future =
        std::pin::Pin<Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: axum::http::Request<crate::transport::TimedBody>) -> Self::Future {
        let req = req.map(axum::body::Body::new);
        match self.direct(&req) {
            Some(path) => {
                let answer = self.infer(path, req);
                Box::pin(async move { Ok(answer.await) })
            }
            // `Router` is always ready (its `poll_ready` returns `Ready(Ok)`).
            None => Box::pin(tower_service::Service::call(&mut self.router, req)),
        }
    }
}

/// All routes of the HTTP port.
fn router(state: AppState) -> Router {
    let limit = state.max_body_bytes;
    Router::new()
        .route("/v1/models", get(v1::list))
        // `{spec}` is `name` (GET: status) or `name:predict` (POST).
        .route("/v1/models/{spec}", get(v1::status).post(v1::predict))
        .route("/v1/embeddings", post(openai::embeddings))
        .route("/v2", get(v2::server_metadata))
        .route("/v2/health/live", get(health::live))
        .route("/v2/health/ready", get(health::ready))
        .route("/v2/models/{name}", get(v2::model_metadata))
        .route("/v2/models/{name}/versions/{version}", get(v2::model_metadata))
        .route("/v2/models/{name}/ready", get(v2::model_ready))
        .route("/v2/models/{name}/versions/{version}/ready", get(v2::model_ready))
        .route("/v2/models/{name}/infer", post(v2::infer))
        .route("/v2/models/{name}/versions/{version}/infer", post(v2::infer))
        .route("/v2/models/{name}/config", get(v2::model_config))
        .route(
            "/v2/models/{name}/versions/{version}/config",
            get(v2::model_config),
        )
        .route("/v2/models/stats", get(v2::all_stats))
        .route("/v2/models/{name}/stats", get(v2::model_stats))
        .route("/v2/models/{name}/versions/{version}/stats", get(v2::model_stats))
        .route("/v2/repository/index", post(v2::repository_index))
        .route("/v2/repository/models/{name}/load", post(v2::repository_load))
        .route("/v2/repository/models/{name}/unload", post(v2::repository_unload))
        .route("/v2/systemsharedmemory/status", get(shm::status_all))
        .route("/v2/systemsharedmemory/region/{name}/status", get(shm::status))
        .route(
            "/v2/systemsharedmemory/region/{name}/register",
            post(shm::register),
        )
        .route("/v2/systemsharedmemory/unregister", post(shm::unregister_all))
        .route(
            "/v2/systemsharedmemory/region/{name}/unregister",
            post(shm::unregister),
        )
        .route("/v2/cudasharedmemory/status", get(shm::cuda_status_all))
        .route("/v2/cudasharedmemory/region/{name}/status", get(shm::cuda_status))
        .route(
            "/v2/cudasharedmemory/region/{name}/register",
            post(shm::cuda_register),
        )
        .route("/v2/cudasharedmemory/unregister", post(shm::cuda_unregister))
        .route(
            "/v2/cudasharedmemory/region/{name}/unregister",
            post(shm::cuda_unregister),
        )
        .route("/metrics", get(render_metrics))
        // After every route: it applies to the routes already added.
        .method_not_allowed_fallback(method_not_allowed)
        .fallback(not_found)
        .layer(axum::middleware::from_fn_with_state(state.clone(), guard))
        .layer(DefaultBodyLimit::max(limit))
        .with_state(state)
}

/// Before any handler or body read: refuses a request its scope does not
/// allow (401 without a key that is needed, 403 with a wrong one or for
/// disabled model control), then reserves its body's bytes in the
/// server-wide budget (503 beyond it) and holds them until it is answered.
async fn guard(
    axum::extract::State(state): axum::extract::State<AppState>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let held = match admit(&state, req.uri().path(), req.headers()) {
        Ok(held) => held,
        Err(e) if req.uri().path() == "/v1/embeddings" => {
            return axum::response::IntoResponse::into_response(openai::OpenAiError(e.0))
        }
        Err(e) => return axum::response::IntoResponse::into_response(e),
    };
    hold_until_sent(&state, held, next.run(req).await)
}

/// `GET /metrics`: Prometheus text format.
async fn render_metrics(
    axum::extract::State(state): axum::extract::State<AppState>,
) -> impl axum::response::IntoResponse {
    let mut text = state.metrics.render();
    if state.triton_metrics {
        let rows: Vec<_> = state
            .registry
            .list()
            .into_iter()
            .filter(|e| e.state == crate::model::state::ModelState::Ready)
            .filter_map(|e| e.handle.map(|h| h.triton_metrics()))
            .collect();
        crate::metrics::triton::render(&rows, &mut text);
    }
    (
        [(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        text,
    )
}

async fn not_found(uri: axum::http::Uri) -> ApiError {
    ApiError(Error::NotFound(format!("no route for {uri}")))
}

/// A known path asked with a method it does not serve: 405 with a JSON body
/// (axum adds the `Allow` header).
async fn method_not_allowed(method: axum::http::Method, uri: axum::http::Uri) -> axum::response::Response {
    error::method_not_allowed(&method, uri.path())
}
