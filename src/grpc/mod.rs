//! gRPC front end (tonic): the standard `inference.GRPCInferenceService` on
//! the gRPC port. Like `http/`, it only translates: a message goes through
//! `protocol::grpc` into an [`InferRequest`](crate::protocol::InferRequest),
//! then to the same `ModelHandle::infer` as every REST path (so gRPC
//! requests share batches with REST ones), and back. Status codes are
//! decided in `status.rs` alone. The server runs on the task that awaits
//! [`serve`], with the same shutdown signal as the HTTP server. With TLS,
//! tonic gets the accepted sockets as [`TlsConn`]s (our own rustls accept,
//! sharing the HTTP port's reloadable certificate), whose handshake runs on
//! each connection's own task.

mod service;
pub mod status;

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use tokio::net::TcpListener;
use tokio_stream::StreamExt;
use tonic::transport::server::{Connected, TcpConnectInfo, TcpIncoming};

use crate::error::Error;
use crate::protocol::grpc::inference::grpc_inference_service_server::GrpcInferenceServiceServer;
use crate::repository::{Registry, RepositoryHandle};
use crate::tls::TlsConn;
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

/// Serves gRPC on `listener` until `shutdown` completes, then stops taking
/// new calls and returns once the calls in flight are answered. With `tls`,
/// every connection speaks TLS (ALPN `h2`).
pub async fn serve(
    listener: TcpListener,
    state: GrpcState,
    tls: Option<crate::tls::Acceptor>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), tonic::transport::Error> {
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    let router = tonic::transport::Server::builder().add_service(service(state));
    match tls {
        None => router.serve_with_incoming_shutdown(incoming, shutdown).await,
        Some(acceptor) => {
            // The handshake is not awaited here: tonic spawns the connection,
            // and its first read runs the handshake under its deadline.
            let incoming = incoming.map(move |tcp| tcp.map(|tcp| acceptor.accept(tcp)));
            router.serve_with_incoming_shutdown(incoming, shutdown).await
        }
    }
}

impl Connected for TlsConn {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        TcpConnectInfo {
            local_addr: self.local_addr(),
            remote_addr: self.peer_addr(),
        }
    }
}

/// Records a finished inference call in `sluice_requests_total` and
/// `sluice_request_duration_seconds` (protocol `grpc`), as `http::observe`
/// does for REST.
fn observe<T>(registry: &Registry, model: &str, arrival: Instant, result: &Result<T, Error>) {
    crate::metrics::request(
        registry.metric_label(model),
        "grpc",
        result.as_ref().err(),
        arrival.elapsed(),
    );
}
