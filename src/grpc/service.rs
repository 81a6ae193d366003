//! The RPCs of `inference.GRPCInferenceService`. Each one translates: look
//! the model up in the registry, convert with `protocol`, call the model,
//! convert back; errors become statuses in `status.rs`.

use std::collections::HashMap;
use std::pin::Pin;
use std::time::Instant;

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};
use tracing::Instrument;

use super::status::status;
use super::{observe, GrpcState};
use crate::access::Scope;
use crate::budget::{ConnectionBytes, ConnectionHeld, HeldUntilSent};
use crate::error::Error;
use crate::model::state::ModelState;
use crate::protocol::grpc::inference::grpc_inference_service_server::GrpcInferenceService;
use crate::protocol::grpc::inference::repository_index_response::ModelIndex;
use crate::protocol::grpc::inference::*;
use crate::protocol::grpc::non_empty;
use crate::protocol::v2::{ModelMetadata, ServerMetadata};
use crate::telemetry::{self, Parent};

/// The caller's trace from a call's `traceparent` / `tracestate` metadata.
fn trace_parent(meta: &tonic::metadata::MetadataMap) -> Parent {
    Parent::extract(|name| meta.get(name).and_then(|v| v.to_str().ok()))
}

/// The service; cheap to clone (tonic clones it per connection).
#[derive(Clone)]
pub struct InferenceService {
    state: GrpcState,
}

impl InferenceService {
    pub fn new(state: GrpcState) -> Self {
        InferenceService { state }
    }

    /// Runs one inference request through the model's batcher, continuing
    /// the caller's trace (`parent`, from the call's metadata).
    /// Also returns what the call holds of the byte budget until its
    /// answer has been sent (kept with a unary answer by the transport, and
    /// with a stream's answer by [`HeldStream`]).
    async fn infer(
        &self,
        req: ModelInferRequest,
        parent: &Parent,
    ) -> Result<(ModelInferResponse, HeldUntilSent), Error> {
        let arrival = Instant::now();
        let name = req.model_name.clone();
        let span = telemetry::request_span("grpc", &name, parent);
        let log = GrpcLog::new(self.state.inference_log.as_deref(), &name, &req);
        let result = async {
            // The message is already decoded, so this bounds what accepted
            // gRPC requests hold together with the HTTP port's.
            let message = prost::Message::encoded_len(&req);
            let held = self.state.budget.reserve(message)?;
            let model = self
                .state
                .registry
                .serve(&name, non_empty(&req.model_version), arrival)
                .await?;
            let (request, in_shm) = crate::protocol::grpc::decode_request(req, &*self.state.shm)?;
            let _decoded = self.state.budget.reserve_decoded(request.held_bytes(), message)?;
            let resp = model.infer(request, arrival).await?;
            self.state.shm.write_outputs(&resp, &in_shm)?;
            let answer = telemetry::encode(|| crate::protocol::grpc::encode_response(&resp, &in_shm));
            let bytes = self.state.budget.charge(prost::Message::encoded_len(&answer));
            log.answer(&answer);
            Ok((answer, HeldUntilSent::new(held, bytes)))
        }
        .instrument(span.clone())
        .await;
        if let Err(e) = &result {
            log.error(e);
        }
        telemetry::finish(&span, result.as_ref().err());
        observe(&self.state.registry, &name, arrival, &result);
        result
    }
}

impl InferenceService {
    /// A stream's request run, and its answer with what it holds until
    /// sent: the budget's share and the connection's (`on_connection`
    /// holds the request's; the answer's bytes join it).
    async fn answer(
        &self,
        request: ModelInferRequest,
        parent: &Parent,
        connection: Option<Arc<ConnectionBytes>>,
        mut on_connection: Vec<ConnectionHeld>,
    ) -> (StreamAnswer, Unsent) {
        let id = request.id.clone();
        match self.infer(request, parent).await {
            Ok((resp, held)) => {
                let bytes = prost::Message::encoded_len(&resp);
                on_connection.extend(connection.iter().map(|c| c.hold(bytes)));
                let answer = ModelStreamInferResponse {
                    error_message: String::new(),
                    infer_response: Some(resp),
                };
                let unsent = Unsent {
                    _budget: Some(held),
                    _connection: on_connection,
                };
                (Ok(answer), unsent)
            }
            Err(e) => (Ok(failed(id, &e)), Unsent::nothing()),
        }
    }
}

type Answer<T> = Result<Response<T>, Status>;

/// Lets `?` turn a domain error into its status.
fn ok<T>(r: Result<T, Error>) -> Answer<T> {
    r.map(Response::new).map_err(|e| status(&e))
}

/// One answer of a `ModelStreamInfer` call.
type StreamAnswer = Result<ModelStreamInferResponse, Status>;

/// What a stream's answer holds until the transport takes it: its share of
/// the byte budget, and its request's and its own bytes of the connection's.
struct Unsent {
    _budget: Option<HeldUntilSent>,
    _connection: Vec<ConnectionHeld>,
}

impl Unsent {
    /// What an error answer holds: nothing.
    fn nothing() -> Unsent {
        Unsent {
            _budget: None,
            _connection: Vec::new(),
        }
    }
}

/// A stream's answer for a request that failed: its id and why.
fn failed(id: String, e: &Error) -> ModelStreamInferResponse {
    ModelStreamInferResponse {
        error_message: e.to_string(),
        infer_response: Some(ModelInferResponse {
            id,
            ..Default::default()
        }),
    }
}

/// Answers sent on one `ModelStreamInfer` call.
type InferStream = Pin<Box<dyn Stream<Item = StreamAnswer> + Send>>;

/// A stream's answers, each holding its request's and its own bytes of the
/// budget (`http.max_inflight_bytes`) until it has been sent: while it
/// waits in the channel, and once handed to the transport until the
/// transport asks for the next one (hyper asks only when HTTP/2 flow
/// control lets it send more). So the unread answers of every stream on
/// every connection count against the one budget, and requests beyond it
/// are refused, not answered into memory.
struct HeldStream {
    /// From the stream's request tasks (see `model_stream_infer`).
    answers: mpsc::Receiver<(StreamAnswer, Unsent)>,
    /// What the answer last handed to the transport holds.
    last: Option<Unsent>,
}

impl Stream for HeldStream {
    type Item = StreamAnswer;

    fn poll_next(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<StreamAnswer>> {
        // Asked for the next: the last one has gone out.
        self.last = None;
        self.answers.poll_recv(cx).map(|next| {
            next.map(|(answer, held)| {
                self.last = Some(held);
                answer
            })
        })
    }
}

#[tonic::async_trait]
impl GrpcInferenceService for InferenceService {
    async fn server_live(&self, _: Request<ServerLiveRequest>) -> Answer<ServerLiveResponse> {
        Ok(Response::new(ServerLiveResponse { live: true }))
    }

    async fn server_ready(&self, _: Request<ServerReadyRequest>) -> Answer<ServerReadyResponse> {
        Ok(Response::new(ServerReadyResponse {
            ready: self.state.is_ready(),
        }))
    }

    /// `ready: false` for a model or version that does not serve, known or
    /// not (Triton's answer: a client's "wait until ready" loop keeps polling).
    async fn model_ready(&self, req: Request<ModelReadyRequest>) -> Answer<ModelReadyResponse> {
        self.state.allow(&req, Scope::Inference)?;
        let r = req.into_inner();
        let ready = self
            .state
            .registry
            .servable(&r.name, non_empty(&r.version))
            .is_ok();
        Ok(Response::new(ModelReadyResponse { ready }))
    }

    async fn server_metadata(&self, _: Request<ServerMetadataRequest>) -> Answer<ServerMetadataResponse> {
        let m = ServerMetadata::sluice();
        Ok(Response::new(ServerMetadataResponse {
            name: m.name,
            version: m.version,
            extensions: m.extensions,
        }))
    }

    async fn model_metadata(&self, req: Request<ModelMetadataRequest>) -> Answer<ModelMetadataResponse> {
        self.state.allow(&req, Scope::Inference)?;
        let r = req.into_inner();
        ok(self
            .state
            .registry
            .serve(&r.name, non_empty(&r.version), Instant::now())
            .await
            .map(|m| {
                let mut metadata = ModelMetadata::new(&m.name, m.version(), &m.client_signature());
                metadata.platform = m.platform().into();
                metadata.with_versions(self.state.registry.ready_versions(&m.name));
                metadata.into()
            }))
    }

    async fn model_infer(&self, req: Request<ModelInferRequest>) -> Answer<ModelInferResponse> {
        self.state.allow(&req, Scope::Inference)?;
        let parent = trace_parent(req.metadata());
        let (answer, held) = self
            .infer(req.into_inner(), &parent)
            .await
            .map_err(|e| status(&e))?;
        let mut answer = Response::new(answer);
        answer.extensions_mut().insert(held);
        Ok(answer)
    }

    type ModelStreamInferStream = InferStream;

    /// Each request of the stream runs as soon as it arrives (so requests of
    /// one stream batch together); each answer is sent when it is ready, with
    /// the request's `id`, and a failure is an answer with `error_message`.
    async fn model_stream_infer(
        &self,
        req: Request<Streaming<ModelInferRequest>>,
    ) -> Answer<Self::ModelStreamInferStream> {
        self.state.allow(&req, Scope::Inference)?;
        // Every request of the stream continues the trace the call's metadata names.
        let parent = trace_parent(req.metadata());
        // The connection's bytes (`grpc.max_connection_bytes`), from the transport.
        let connection = req.extensions().get::<Arc<ConnectionBytes>>().cloned();
        let mut requests = req.into_inner();
        let outstanding = self.state.max_outstanding_per_stream;
        // Answers to the client, each with what it holds of the byte
        // budget. Each request's task holds a sender; the response stream
        // returned below holds the receiver, and ends once the reader task
        // and every request task have dropped theirs.
        let (tx, rx) = mpsc::channel::<(StreamAnswer, Unsent)>(outstanding);
        // One permit per request being run or waiting to hand its answer to
        // `tx`: the reader takes one before it reads the next message, each
        // request task returns its own once the answer is in the channel. A
        // client that stops reading answers thus stops the reader (and, by
        // HTTP/2 flow control, its own sends) after `outstanding` requests,
        // or once the connection's streams hold `grpc.max_connection_bytes`.
        let permits = Arc::new(Semaphore::new(outstanding));
        let service = self.clone();
        tokio::spawn(async move {
            // Requests of one sequence run in the order the stream sent
            // them: each waits for the previous one of its sequence (the
            // sequence would run them one at a time anyway). By sequence id,
            // what the latest request of each signals when it is done.
            let mut sequences: HashMap<String, oneshot::Receiver<()>> = HashMap::new();
            loop {
                let Ok(permit) = permits.clone().acquire_owned().await else {
                    break;
                };
                if let Some(c) = &connection {
                    c.below_cap().await;
                }
                let Some(next) = requests.next().await else {
                    break;
                };
                let request = match next {
                    Ok(r) => r,
                    Err(e) => {
                        let _ = tx.send((Err(e), Unsent::nothing())).await;
                        break;
                    }
                };
                // Held on the connection once it is below its cap: a message
                // read while other streams filled it waits here.
                let on_connection = match &connection {
                    None => Vec::new(),
                    Some(c) => loop {
                        if let Some(h) = c.try_hold(prost::Message::encoded_len(&request)) {
                            break vec![h];
                        }
                        c.below_cap().await;
                    },
                };
                let connection = connection.clone();
                let (service, tx, parent) = (service.clone(), tx.clone(), parent.clone());
                let (after, done) = match crate::protocol::grpc::sequence_key(&request) {
                    None => (None, None),
                    Some(key) => {
                        let (done, next) = oneshot::channel();
                        (sequences.insert(key, next), Some(done))
                    }
                };
                tokio::spawn(async move {
                    if let Some(previous) = after {
                        let _ = previous.await;
                    }
                    let answer = service.answer(request, &parent, connection, on_connection).await;
                    let _ = tx.send(answer).await;
                    // After the answer is queued: the sequence's next answer
                    // must not overtake it on the stream.
                    if let Some(done) = done {
                        let _ = done.send(());
                    }
                    drop(permit);
                });
            }
        });
        Ok(Response::new(Box::pin(HeldStream {
            answers: rx,
            last: None,
        })))
    }

    async fn model_config(&self, req: Request<ModelConfigRequest>) -> Answer<ModelConfigResponse> {
        self.state.allow(&req, Scope::Inference)?;
        let r = req.into_inner();
        ok(self
            .state
            .registry
            .serve(&r.name, non_empty(&r.version), Instant::now())
            .await
            .map(|m| ModelConfigResponse {
                config: Some(m.config()),
            }))
    }

    /// Every serving model when `name` is empty, else that model.
    async fn model_statistics(
        &self,
        req: Request<ModelStatisticsRequest>,
    ) -> Answer<ModelStatisticsResponse> {
        self.state.allow(&req, Scope::Inference)?;
        let r = req.into_inner();
        let registry = &self.state.registry;
        let models = match non_empty(&r.name) {
            Some(name) => vec![registry
                .ready(name, non_empty(&r.version))
                .map_err(|e| status(&e))?],
            None => registry.list().into_iter().filter_map(|e| e.handle).collect(),
        };
        Ok(Response::new(ModelStatisticsResponse {
            model_stats: models.iter().map(|m| (&m.statistics()).into()).collect(),
        }))
    }

    async fn repository_index(
        &self,
        req: Request<RepositoryIndexRequest>,
    ) -> Answer<RepositoryIndexResponse> {
        self.state.allow(&req, Scope::Inference)?;
        let only_ready = req.into_inner().ready;
        let models = self
            .state
            .registry
            .list()
            .into_iter()
            .filter(|e| !only_ready || e.state == ModelState::Ready)
            .map(|e| ModelIndex {
                reason: match &e.state {
                    ModelState::Unavailable { reason } => reason.clone(),
                    ModelState::OnDisk => crate::model::state::ON_DISK.to_string(),
                    _ => String::new(),
                },
                state: e.state.as_str().to_string(),
                name: e.name,
                version: e.version.unwrap_or_default(),
            })
            .collect();
        Ok(Response::new(RepositoryIndexResponse { models }))
    }

    async fn repository_model_load(
        &self,
        req: Request<RepositoryModelLoadRequest>,
    ) -> Answer<RepositoryModelLoadResponse> {
        self.state.allow(&req, Scope::Control)?;
        let req = req.into_inner();
        let name = req.model_name;
        use crate::protocol::grpc::inference::model_repository_parameter::ParameterChoice;
        let params = req.parameters.iter().map(|(k, v)| {
            let text = match &v.parameter_choice {
                Some(ParameterChoice::StringParam(s)) => Some(s.as_str()),
                _ => None,
            };
            (k.as_str(), text)
        });
        let config = crate::repository::load_parameters(&name, params).map_err(|e| status(&e))?;
        ok(self
            .state
            .repository
            .load(&name, config)
            .await
            .map(|()| RepositoryModelLoadResponse {}))
    }

    async fn repository_model_unload(
        &self,
        req: Request<RepositoryModelUnloadRequest>,
    ) -> Answer<RepositoryModelUnloadResponse> {
        self.state.allow(&req, Scope::Control)?;
        let name = req.into_inner().model_name;
        ok(self
            .state
            .repository
            .unload(&name)
            .await
            .map(|()| RepositoryModelUnloadResponse {}))
    }
    async fn system_shared_memory_status(
        &self,
        req: Request<SystemSharedMemoryStatusRequest>,
    ) -> Answer<SystemSharedMemoryStatusResponse> {
        self.state.allow(&req, Scope::Inference)?;
        ok(super::shm::status(&self.state.shm, &req.into_inner().name))
    }

    async fn system_shared_memory_register(
        &self,
        req: Request<SystemSharedMemoryRegisterRequest>,
    ) -> Answer<SystemSharedMemoryRegisterResponse> {
        self.state.allow(&req, Scope::Inference)?;
        ok(super::shm::register(&self.state.shm, req.into_inner()))
    }

    async fn system_shared_memory_unregister(
        &self,
        req: Request<SystemSharedMemoryUnregisterRequest>,
    ) -> Answer<SystemSharedMemoryUnregisterResponse> {
        self.state.allow(&req, Scope::Inference)?;
        let name = req.into_inner().name;
        self.state.shm.unregister(non_empty(&name));
        Ok(Response::new(SystemSharedMemoryUnregisterResponse {}))
    }

    async fn cuda_shared_memory_status(
        &self,
        req: Request<CudaSharedMemoryStatusRequest>,
    ) -> Answer<CudaSharedMemoryStatusResponse> {
        self.state.allow(&req, Scope::Inference)?;
        ok(super::shm::cuda_status(&req.into_inner().name))
    }

    async fn cuda_shared_memory_register(
        &self,
        req: Request<CudaSharedMemoryRegisterRequest>,
    ) -> Answer<CudaSharedMemoryRegisterResponse> {
        self.state.allow(&req, Scope::Inference)?;
        Err(status(&crate::shm::cuda_refused(&req.into_inner().name)))
    }

    async fn cuda_shared_memory_unregister(
        &self,
        req: Request<CudaSharedMemoryUnregisterRequest>,
    ) -> Answer<CudaSharedMemoryUnregisterResponse> {
        self.state.allow(&req, Scope::Inference)?;
        Ok(Response::new(CudaSharedMemoryUnregisterResponse {}))
    }
}

/// One gRPC request's events in the inference log: the messages as
/// protobuf bytes (`application/x-protobuf`), errors as JSON with their
/// gRPC status code (see [`crate::inference_log::RequestLog`]).
struct GrpcLog<'a>(crate::inference_log::RequestLog<'a>);

impl<'a> GrpcLog<'a> {
    /// Logs the request; its id is the request's `id`, when it has one.
    fn new(
        log: Option<&'a crate::inference_log::InferenceLog>,
        model: &'a str,
        req: &ModelInferRequest,
    ) -> Self {
        let log = crate::inference_log::RequestLog::new(log, model, "grpc", Some(&req.id));
        log.request("application/x-protobuf", || {
            prost::Message::encode_to_vec(req).into()
        });
        GrpcLog(log)
    }

    fn answer(&self, answer: &ModelInferResponse) {
        self.0.answer("application/x-protobuf", || {
            prost::Message::encode_to_vec(answer).into()
        });
    }

    fn error(&self, e: &Error) {
        // gRPC's own status code (3: INVALID_ARGUMENT, 14: UNAVAILABLE, ...).
        self.0.error(super::status::code_of(e.kind()) as u16, e);
    }
}
