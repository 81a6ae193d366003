//! sluice: a multi-model ONNX inference server.
//!
//! Layers, top to bottom (each uses only those below it; `tests/layering.rs`
//! checks every `crate::` path against this order):
//! `main` → [`Server`] (wiring) → [`http`], [`grpc`] (translate only) → [`repository`]
//! (scan, load, the registry) → [`model`] (a model's handle and state) →
//! [`batcher`] (queues, batch formation, statistics) → [`pool`] (sessions on
//! dedicated threads) → [`runtime`] (ONNX Runtime) → [`transport`] (both
//! ports' connections: caps, timeouts, drain) → [`metrics`], [`budget`],
//! [`access`], [`shutdown`], [`tls`] (both ports' certificate), [`telemetry`]
//! (OpenTelemetry spans; off unless the binary installs an exporter),
//! [`inference_log`] (KServe's CloudEvents to a sink; off unless configured) →
//! [`config`] → [`settings`] (a model's `model-settings.json`), [`protocol`] →
//! [`tensor`] → [`error`], [`watch`] (file-change notices for the repository
//! and the certificate).
//!
//! Data flow of one request: an HTTP handler (or a gRPC method) decodes it into a
//! [`protocol::InferRequest`], takes the model's `Arc<ModelHandle>` from the
//! registry, and awaits `ModelHandle::infer`, which validates the request
//! against the ONNX signature and hands it to the model's batcher; the
//! batcher sends batches to the model's session threads and returns each
//! request its own outputs.

pub mod access;
pub mod batcher;
pub mod budget;
pub mod config;
pub mod error;
#[doc(hidden)]
pub mod fuzz;
pub mod grpc;
pub mod http;
pub mod inference_log;
pub mod metrics;
pub mod model;
pub mod pool;
pub mod protocol;
pub mod repository;
pub mod runtime;
pub mod settings;
pub mod shm;
pub mod shutdown;
pub mod telemetry;
pub mod tensor;
pub mod tls;
pub mod transport;
pub mod triton;
pub mod watch;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::Context;
use tokio::net::TcpListener;

use config::Config;
use http::AppState;
use repository::Repository;
use runtime::Runtime;

/// A bound sluice server whose models are loading.
pub struct Server {
    config: Config,
    listener: TcpListener,
    grpc_listener: TcpListener,
    state: AppState,
    /// Completes when the start-up load of the repository has finished.
    loaded: tokio::sync::oneshot::Receiver<Result<(), String>>,
    /// Rescan signals for the repository task; dropped (stopping the
    /// watcher) when the server stops.
    watcher: Option<repository::watcher::RepoWatcher>,
    /// The session pool, whose running batches are cancelled when the grace
    /// period is over.
    pool: Arc<pool::Pool>,
    /// Both ports' TLS and its certificate reload task (`tls.cert_file`
    /// set); dropped, stopping the reload, when the server stops.
    tls: Option<tls::Tls>,
}

impl Server {
    /// Binds the HTTP and gRPC ports (port 0 picks a free one) and starts
    /// loading the model repository; the ports answer liveness while models load.
    pub async fn bind(config: Config, runtime: Arc<dyn Runtime>) -> anyhow::Result<Server> {
        let addr = SocketAddr::new(config.http.host, config.http.port);
        let listener = TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot listen on {addr}"))?;
        let grpc_addr = SocketAddr::new(config.http.host, config.grpc.port);
        let grpc_listener = TcpListener::bind(grpc_addr)
            .await
            .with_context(|| format!("cannot listen on {grpc_addr} (gRPC)"))?;
        // Before the models load: a bad certificate stops the start at once.
        let tls = match config.tls.files() {
            Some(files) => Some(
                tls::Tls::start(files, config.http_limits().header_read_timeout)
                    .map_err(anyhow::Error::msg)?,
            ),
            None => None,
        };
        transport::raise_open_file_limit();
        let pool = pool::Pool::new(pool::PoolLimits {
            cpu: config.cpu_concurrent_batches(),
            gpu: config.pool.gpu_concurrent_batches,
        });
        // The recorder must be in place before the repository task starts
        // loading: metrics emitted before it is installed are lost (the
        // first model's `loaded` count went missing this way).
        let metrics = metrics::install();
        let budget = budget::ByteBudget::from_config(&config);
        let repo = &config.model_repository;
        let repository = Repository::new(
            repo.path.clone(),
            repo.model_name.clone(),
            config.model_defaults(),
            runtime,
            pool.clone(),
        )
        .with_residency(config.residency.policy())
        .with_budget(budget.clone());
        // Watcher → repository task: "something changed, rescan".
        let (rescan_tx, rescan_rx) = tokio::sync::mpsc::unbounded_channel();
        let watcher = repository::watcher::watch(
            &repo.path,
            repo.watch,
            std::time::Duration::from_secs_f64(repo.poll_interval_seconds),
            std::time::Duration::from_secs_f64(repo.debounce_seconds),
            rescan_tx,
        )
        .with_context(|| format!("cannot watch the model repository {}", repo.path.display()))?;
        let (handle, loaded) = repository.spawn(rescan_rx);
        let state = AppState::new(http::SharedState {
            metrics,
            registry: handle.registry().clone(),
            repository: handle,
            ready: Arc::new(AtomicBool::new(false)),
            ready_rule: ready_rule(repo),
            stopping: Arc::new(AtomicBool::new(false)),
            max_body_bytes: config.http.max_body_bytes,
            triton_metrics: config.metrics.triton_names,
            inference_log: inference_log::InferenceLog::start(&config.inference_log, &budget),
            access: access::Access::from_config(&config),
            shm: Arc::new(shm::SharedMemory::new(&config.shared_memory, budget.clone())),
            budget,
        });
        Ok(Server {
            config,
            listener,
            grpc_listener,
            state,
            loaded,
            watcher,
            pool,
            tls,
        })
    }

    /// The address the HTTP port is bound to.
    pub fn http_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("a bound listener has an address")
    }

    /// The address the gRPC port is bound to.
    pub fn grpc_addr(&self) -> SocketAddr {
        self.grpc_listener
            .local_addr()
            .expect("a bound listener has an address")
    }

    /// Serves until `shutdown` completes; then readiness turns false, new
    /// inference requests get 503 while the HTTP port keeps answering (health
    /// probes: ready 503, live 200), and accepted requests get
    /// `shutdown.grace_period_seconds` to finish. The gRPC port stops
    /// accepting connections.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send + 'static) -> anyhow::Result<()> {
        let Server {
            config,
            listener,
            grpc_listener,
            state,
            loaded,
            watcher,
            pool,
            tls,
        } = self;
        tracing::info!(
            http = %listener.local_addr()?,
            grpc = %grpc_listener.local_addr()?,
            tls = tls.is_some(),
            repository = %config.model_repository.path.display(),
            "sluice listening"
        );

        // `true` once shutdown has begun; the HTTP and gRPC servers and the
        // drain timer below each hold a receiver.
        let stop_rx = spawn_lifecycle(loaded, shutdown, &state);
        // Drains the histograms' sample buffers when nobody scrapes /metrics.
        let upkeep = metrics::spawn_upkeep(state.metrics.clone(), metrics::UPKEEP_INTERVAL);

        let serve = serve_ports(
            &config,
            listener,
            grpc_listener,
            state,
            tls.as_ref(),
            stop_rx.clone(),
        );
        let mut drain = stop_rx;
        let grace = config.grace_period();
        let result = tokio::select! {
            // The servers stop by themselves once shutdown began and every
            // accepted request was answered.
            r = serve => r,
            _ = async {
                let _ = drain.wait_for(|stopping| *stopping).await;
                tokio::time::sleep(grace).await;
            } => {
                tracing::warn!(grace_period = ?grace, "requests still open after the grace period; exiting anyway");
                Ok(())
            }
        };
        cancel_runs(&pool).await;
        drop(upkeep);
        drop(watcher);
        drop(tls);
        tracing::info!("sluice stopped");
        result
    }
}

/// Serves both ports until each has stopped (shutdown began and every
/// accepted request was answered) or one fails.
async fn serve_ports(
    config: &Config,
    listener: TcpListener,
    grpc_listener: TcpListener,
    state: AppState,
    tls: Option<&tls::Tls>,
    stop_rx: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let grpc_state = grpc::GrpcState {
        registry: state.registry.clone(),
        repository: state.repository.clone(),
        ready: state.ready.clone(),
        ready_rule: state.ready_rule.clone(),
        max_message_bytes: config.grpc.max_message_bytes,
        max_outstanding_per_stream: config.grpc.max_outstanding_per_stream,
        access: access::Access::from_config(config),
        budget: state.budget.clone(),
        shm: state.shm.clone(),
        inference_log: state.inference_log.clone(),
    };
    let grpc_port = transport::Port {
        name: "gRPC",
        service: grpc::service(grpc_state),
        http2_only: true,
        max_concurrent_streams: config.grpc.max_concurrent_streams,
        keep_alive_ping: config.grpc.keep_alive_ping(),
        untimed_paths: grpc::STREAMS,
        refuse_with_503: false,
        max_connections_key: "grpc.max_connections",
        open_file_quarters: 1,
        connection_bytes: config.grpc.connection_bytes(state.budget.total()),
    };
    let mut grpc_limits = config.http_limits();
    grpc_limits.max_connections = config.grpc.max_connections;
    let grpc_serve = transport::serve(
        grpc_listener,
        grpc_port,
        grpc_limits,
        tls.map(tls::Tls::grpc),
        stop_rx.clone(),
    );
    let http_port = transport::Port {
        name: "HTTP",
        service: http::Routes::new(state),
        http2_only: false,
        // hyper's default, advertised as before the ports shared a transport.
        max_concurrent_streams: 200,
        keep_alive_ping: None,
        untimed_paths: &[],
        refuse_with_503: true,
        max_connections_key: "http.max_connections",
        open_file_quarters: 2,
        connection_bytes: 0,
    };
    let http_serve = transport::serve(
        listener,
        http_port,
        config.http_limits(),
        tls.map(tls::Tls::http),
        stop_rx.clone(),
    );
    tokio::try_join!(async { http_serve.await.context("HTTP server failed") }, async {
        grpc_serve.await.context("gRPC server failed")
    },)
    .map(|_| ())
}

/// Cancels the batches still running in ONNX Runtime (after the grace
/// period, or a server error) and waits for their sessions to stop, so no
/// run is inside the library as the process exits.
async fn cancel_runs(pool: &pool::Pool) {
    /// How long cancelled runs get to stop (ONNX Runtime checks the flag
    /// between nodes, so only one long node can hold it up).
    const STOP_LIMIT: std::time::Duration = std::time::Duration::from_secs(10);
    let running = pool.runs().cancel_all();
    if running == 0 {
        return;
    }
    tracing::warn!(running, "cancelling the batches still running");
    if pool.runs().wait_idle(STOP_LIMIT).await {
        tracing::info!(running, "the cancelled batches stopped");
    } else {
        tracing::error!(limit = ?STOP_LIMIT, "batches still running after being cancelled; exiting anyway");
    }
}

/// What server readiness asks of the models: with `model_name`, that
/// model's readiness; with `strict_readiness`, every model's.
fn ready_rule(repo: &config::RepositoryConfig) -> repository::ReadyRule {
    match (&repo.model_name, repo.strict_readiness) {
        (Some(name), _) => repository::ReadyRule::Model(name.clone()),
        (None, true) => repository::ReadyRule::Strict,
        (None, false) => repository::ReadyRule::Loaded,
    }
}

/// Spawns the tasks that turn readiness on when the start-up load is done
/// and, when `shutdown` completes, readiness off and stopping on; returns the
/// receiver of the stop signal (`true` once shutdown has begun). Its sender
/// lives in the task that awaits `shutdown`; the readiness task holds a
/// receiver too.
fn spawn_lifecycle(
    loaded: tokio::sync::oneshot::Receiver<Result<(), String>>,
    shutdown: impl Future<Output = ()> + Send + 'static,
    state: &AppState,
) -> tokio::sync::watch::Receiver<bool> {
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn({
        let ready = state.ready.clone();
        let stop = stop_rx.clone();
        async move {
            match loaded.await {
                Ok(Ok(())) if !*stop.borrow() => ready.store(true, Ordering::Release),
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::error!(error = %e, "cannot read the model repository"),
                Err(_) => tracing::error!("the repository task stopped during the start-up load"),
            }
        }
    });
    tokio::spawn({
        let ready = state.ready.clone();
        let stopping = state.stopping.clone();
        let registry = state.registry.clone();
        async move {
            shutdown.await;
            // Readiness turns false before anything else, so load
            // balancers stop sending while accepted requests finish.
            ready.store(false, Ordering::Release);
            stopping.store(true, Ordering::Release);
            let _ = stop_tx.send(true);
            // No new request will join a batch that waits to fill (a
            // `fixed` policy's `max_batch_time`): every batcher runs what
            // it holds as soon as a session is free.
            for handle in registry.list().into_iter().filter_map(|m| m.handle) {
                handle.batcher().retire();
            }
        }
    });
    stop_rx
}
