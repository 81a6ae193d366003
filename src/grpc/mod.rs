//! gRPC front end (tonic): the standard `inference.GRPCInferenceService` on
//! the gRPC port. Like `http/`, it only translates: a message goes through
//! `protocol::grpc` into an [`InferRequest`](crate::protocol::InferRequest),
//! then to the same `ModelHandle::infer` as every REST path (so gRPC
//! requests share batches with REST ones), and back. Status codes are
//! decided in `status.rs` alone. The port runs on the same transport as the
//! HTTP port (`transport`: connection cap, timeouts, drain, TLS), with
//! [`service`] as its service.

mod service;
mod shm;
pub mod status;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crate::error::Error;
use crate::protocol::grpc::inference::grpc_inference_service_server::GrpcInferenceServiceServer;
use crate::repository::{Registry, RepositoryHandle};
pub use service::InferenceService;

/// What every RPC shares.
#[derive(Clone)]
pub struct GrpcState {
    /// Read-only view of the models; the repository task writes it.
    pub registry: Arc<Registry>,
    /// Commands to the repository task (RepositoryModelLoad / Unload).
    pub repository: RepositoryHandle,
    /// True once the start-up load finished, false again from the moment
    /// shutdown begins. Written by `lib::Server` (the same flag the HTTP
    /// port's readiness reads).
    pub ready: Arc<AtomicBool>,
    /// What readiness also asks of the models (the HTTP port's rule).
    pub ready_rule: crate::repository::ReadyRule,
    /// Largest message accepted or sent (`grpc.max_message_bytes`).
    pub max_message_bytes: usize,
    /// Requests one `ModelStreamInfer` stream may have running or unread
    /// (`grpc.max_outstanding_per_stream`).
    pub max_outstanding_per_stream: usize,
    /// Who may call what (API keys in metadata, model control).
    pub access: crate::access::Access,
    /// Bytes held by accepted requests, shared with the HTTP port.
    pub budget: crate::budget::ByteBudget,
    /// The HTTP port's inference log, if any.
    pub inference_log: Option<std::sync::Arc<crate::inference_log::InferenceLog>>,
    /// The registered shared-memory regions, shared with the HTTP port.
    pub shm: std::sync::Arc<crate::shm::SharedMemory>,
}

impl GrpcState {
    /// Server readiness, as the HTTP port's `/v2/health/ready` says it.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire) && self.registry.meets(&self.ready_rule)
    }

    /// Refuses a call of `scope` whose metadata (`authorization: Bearer KEY`
    /// or `x-api-key`) the access rules do not allow.
    pub fn allow<T>(
        &self,
        req: &tonic::Request<T>,
        scope: crate::access::Scope,
    ) -> Result<(), tonic::Status> {
        let meta = req.metadata();
        let key = crate::access::presented_key(|name| meta.get(name).and_then(|v| v.to_str().ok()));
        self.access.check(scope, key).map_err(|e| status::status(&e))
    }
}

/// The tonic service, with message limits set from `state`.
pub fn service(state: GrpcState) -> GrpcInferenceServiceServer<InferenceService> {
    let limit = state.max_message_bytes;
    GrpcInferenceServiceServer::new(InferenceService::new(state))
        .max_decoding_message_size(limit)
        .max_encoding_message_size(limit)
}

/// The paths whose request body is a long-lived stream (a bidirectional
/// call), which the transport does not time as a unary call's message.
pub const STREAMS: &[&str] = &["/inference.GRPCInferenceService/ModelStreamInfer"];

/// Records a finished inference call in `sluice_requests_total` and
/// `sluice_request_duration_seconds` (protocol `grpc`), as `http::request::observe`
/// does for REST.
fn observe<T>(registry: &Registry, model: &str, arrival: Instant, result: &Result<T, Error>) {
    crate::metrics::request(
        registry.metric_label(model),
        "grpc",
        result.as_ref().err(),
        arrival.elapsed(),
    );
}
