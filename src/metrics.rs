//! Every metric name lives here, with its help text, its buckets, and a
//! small function per event; call sites never spell a metric name.
//! Labels: `model` (a model of the repository, so bounded), and small closed
//! sets (`protocol`, `status`, `trigger`, `result`, `reason`).

pub mod triton;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::Duration;

use metrics::{
    counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram, Counter, Gauge,
    Histogram, Label, Unit,
};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

pub const BATCH_SIZE: &str = "sluice_batch_size";
pub const QUEUE_DELAY: &str = "sluice_queue_delay_seconds";
pub const INFERENCE_DURATION: &str = "sluice_inference_duration_seconds";
pub const REQUEST_DURATION: &str = "sluice_request_duration_seconds";
pub const REQUESTS: &str = "sluice_requests_total";
pub const BATCHES: &str = "sluice_batches_total";
pub const QUEUE_SIZE: &str = "sluice_queue_size";
pub const MODEL_READY: &str = "sluice_model_ready";
pub const MODEL_BATCHING: &str = "sluice_model_batching";
pub const MODEL_RELOADS: &str = "sluice_model_reloads_total";
pub const DROPPED: &str = "sluice_requests_dropped_total";
pub const REPOSITORY_WATCHING: &str = "sluice_repository_watching";
pub const MODEL_MEMORY: &str = "sluice_model_memory_bytes";
pub const PADDING_RATIO: &str = "sluice_batch_padding_ratio";
pub const MODEL_LOADS: &str = "sluice_model_loads_total";
pub const MODEL_EVICTIONS: &str = "sluice_model_evictions_total";
pub const COLD_START: &str = "sluice_model_cold_start_seconds";
pub const RESIDENCY_BUDGET: &str = "sluice_residency_budget_bytes";
pub const RESIDENCY_USED: &str = "sluice_residency_used_bytes";
pub const BATCH_COST_FIXED: &str = "sluice_batch_cost_fixed_seconds";
pub const BATCH_COST_PER_ROW: &str = "sluice_batch_cost_per_row_seconds";
pub const QUEUE_WAIT_PREDICTED: &str = "sluice_queue_wait_predicted_seconds";
pub const TLS_RELOADS: &str = "sluice_tls_reloads_total";
pub const SEQUENCES_LIVE: &str = "sluice_sequences_live";
pub const SEQUENCES_ENDED: &str = "sluice_sequences_ended_total";
pub const SEQUENCE_STATE: &str = "sluice_sequence_state_bytes";
pub const INFERENCE_LOG: &str = "sluice_inference_log_events_total";
pub const TLS_EXPIRATION: &str = "sluice_tls_certificate_expiration_timestamp_seconds";

/// Label value for requests to a model the registry does not know (keeps
/// the `model` label bounded).
pub const UNKNOWN_MODEL: &str = "_unknown";

/// Batch-size buckets: powers of two up to 65536 (the largest `max_batch_size`).
fn batch_buckets() -> Vec<f64> {
    (0..=16).map(|p| f64::from(1u32 << p)).collect()
}

/// Padding-ratio buckets: fractions from 0 (no padding) to 1.
const RATIO_BUCKETS: [f64; 11] = [0.0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1.0];

/// Delay buckets from 50 µs to 10 s.
const SECONDS_BUCKETS: [f64; 17] = [
    50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3, 250e-3, 500e-3, 1.0, 2.5,
    5.0, 10.0,
];

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// How often the recorder's upkeep runs (what the exporter's own HTTP
/// listener would do; we render `/metrics` ourselves, so we run it).
pub const UPKEEP_INTERVAL: Duration = Duration::from_secs(5);

/// The task running the recorder's upkeep; dropping it stops the task.
pub struct Upkeep(tokio::task::JoinHandle<()>);

impl Drop for Upkeep {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Runs the recorder's upkeep every `every` until the returned [`Upkeep`]
/// is dropped. Without it, every histogram sample stays buffered (about 75
/// bytes a request) until `/metrics` is scraped, and memory grows with
/// traffic on a server nobody scrapes.
pub fn spawn_upkeep(handle: PrometheusHandle, every: Duration) -> Upkeep {
    Upkeep(tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            handle.run_upkeep();
        }
    }))
}

/// Installs the process-wide Prometheus recorder (once; later calls return
/// the same handle, so several servers in one test process share it).
pub fn install() -> PrometheusHandle {
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Full(BATCH_SIZE.into()), &batch_buckets())
                .expect("batch buckets are non-empty")
                .set_buckets_for_metric(Matcher::Full(PADDING_RATIO.into()), &RATIO_BUCKETS)
                .expect("ratio buckets are non-empty")
                .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &SECONDS_BUCKETS)
                .expect("second buckets are non-empty")
                .build_recorder();
            let handle = recorder.handle();
            // Another recorder may already be installed (e.g. by an embedding
            // program); then this handle renders our metrics only if it is ours.
            if metrics::set_global_recorder(recorder).is_err() {
                tracing::warn!("a metrics recorder was already installed; /metrics may be empty");
            }
            describe();
            handle
        })
        .clone()
}

fn describe() {
    describe_requests();
    describe_models();
}

/// The series of requests and batches.
fn describe_requests() {
    describe_histogram!(
        BATCH_SIZE,
        Unit::Count,
        "Instances (rows of dim 0) in each executed batch."
    );
    describe_histogram!(
        QUEUE_DELAY,
        Unit::Seconds,
        "Time from a request's arrival to its batch's dispatch."
    );
    describe_histogram!(
        INFERENCE_DURATION,
        Unit::Seconds,
        "ONNX Runtime session run time per batch."
    );
    describe_histogram!(
        REQUEST_DURATION,
        Unit::Seconds,
        "Time from arrival to response, by protocol."
    );
    describe_counter!(
        REQUESTS,
        Unit::Count,
        "Inference requests, by protocol and status."
    );
    describe_counter!(
        BATCHES,
        Unit::Count,
        "Executed batches, by what closed them (size, time, adaptive, drain)."
    );
    describe_gauge!(QUEUE_SIZE, Unit::Count, "Requests waiting for a batch.");
    describe_histogram!(
        PADDING_RATIO,
        Unit::Count,
        "Padded elements ÷ all input elements of each executed batch (models with `padding`)."
    );
    describe_gauge!(
        BATCH_COST_FIXED,
        Unit::Seconds,
        "What any batch of the model costs, whatever its size: the fixed term of its run time fitted over its last runs (T(n) = fixed + per_row·n)."
    );
    describe_gauge!(
        BATCH_COST_PER_ROW,
        Unit::Seconds,
        "What each row adds to a batch's run time (each padded token, for a model with `padding`), fitted over its last runs."
    );
    describe_gauge!(
        QUEUE_WAIT_PREDICTED,
        Unit::Seconds,
        "How long a request arriving now is predicted to wait before its batch runs: the work queued and running, by the fitted batch cost, shared by the model's sessions."
    );
    describe_counter!(
        DROPPED,
        Unit::Count,
        "Requests that left without running, by reason (`client_gone`, `expired`, `predicted_late`: refused at arrival, predicted to miss their deadline, `no_room`: their model could not be loaded under the residency budgets)."
    );
    describe_histogram!(
        COLD_START,
        Unit::Seconds,
        "How long a request waited for its model to load (the model was not resident)."
    );
}

/// The series of models, their residency, the repository and TLS.
fn describe_models() {
    describe_gauge!(MODEL_READY, Unit::Count, "1 while the model serves, else 0.");
    describe_gauge!(SEQUENCES_LIVE, Unit::Count, "Live sequences of a sequence model.");
    describe_gauge!(
        SEQUENCE_STATE,
        Unit::Bytes,
        "Host memory the live sequences' states hold."
    );
    describe_counter!(
        SEQUENCES_ENDED,
        Unit::Count,
        "Sequences ended, by reason (`end`: the end flag, `idle`: no request for the idle timeout, `restarted`: a start of a live sequence, `unloaded`: its version went, or the server stopped)."
    );
    describe_gauge!(
        MODEL_BATCHING,
        Unit::Count,
        "1 while the model's newest version batches requests together, 0 when each runs alone (the file, warm-up or a served batch showed it cannot batch; the log says why)."
    );
    describe_gauge!(
        MODEL_MEMORY,
        Unit::Bytes,
        "Memory the serving version of the model holds, by device (`cpu`: resident growth over its load and warm-up)."
    );
    describe_counter!(MODEL_RELOADS, Unit::Count, "Model loads and reloads, by result.");
    describe_counter!(
        TLS_RELOADS,
        Unit::Count,
        "Changes of the TLS certificate and key files, by result (`ok`: new handshakes get the new certificate; `error`: refused, the previous one keeps serving)."
    );
    describe_gauge!(
        TLS_EXPIRATION,
        Unit::Seconds,
        "When the certificate that new TLS handshakes get expires (its notAfter, Unix seconds); absent without TLS."
    );
    describe_counter!(
        MODEL_LOADS,
        Unit::Count,
        "Model versions loaded, by reason (`start`, `on_demand`: a request found it not resident, `reload`: its folder changed or appeared, `api`)."
    );
    describe_counter!(
        MODEL_EVICTIONS,
        Unit::Count,
        "Times the model was unloaded to make room for another under the residency budgets."
    );
    describe_counter!(
        INFERENCE_LOG,
        Unit::Count,
        "Inference log events by result: `sent` (the sink took it), `failed` (the sink refused it, was down or too slow), `dropped` (its queue or the byte budget was full)."
    );
    describe_gauge!(
        RESIDENCY_BUDGET,
        Unit::Bytes,
        "The residency budget of each device (`cpu`, `cuda:N`); absent where there is none."
    );
    describe_gauge!(
        RESIDENCY_USED,
        Unit::Bytes,
        "What the loaded models hold on each device, as charged against its residency budget."
    );
    describe_gauge!(
        REPOSITORY_WATCHING,
        Unit::Count,
        "1 while the model repository's changes are followed (events or poll), 0 while its watch is lost and it is only polled (absent with watch = \"off\")."
    );
}

/// A padded model's batch was dispatched: padded elements ÷ all its input elements.
pub fn padding_ratio(model: &str, ratio: f64) {
    histogram!(PADDING_RATIO, "model" => model.to_string()).record(ratio);
}

/// One model's per-request and per-batch series, registered once (by its
/// batcher): a `gauge!` or `histogram!` with a label allocates the label and
/// looks the series up by hash at every call, which cost more than the
/// update itself. Cheap to clone (the batcher's handle and its task share it).
#[derive(Clone)]
pub struct ModelMetrics(Arc<ModelSeries>);

struct ModelSeries {
    /// `model`, and `version` where the model has one (Triton's labels):
    /// versions serving side by side each have their own series.
    labels: Vec<Label>,
    queue_size: Gauge,
    queue_delay: Histogram,
    /// Registered at the first batch, so that a model that never ran shows none.
    batch_size: OnceLock<Histogram>,
    inference: OnceLock<Histogram>,
    /// The fitted batch cost (fixed, per row) and the predicted queue wait,
    /// registered once the cost is known.
    cost: OnceLock<[Gauge; 3]>,
    /// `sluice_batches_total` by trigger, registered at a trigger's first
    /// batch. Locked by the batching task only (uncontended).
    batches: Mutex<Vec<(&'static str, Counter)>>,
}

impl ModelMetrics {
    pub fn new(model: &str, version: Option<&str>) -> ModelMetrics {
        let mut labels = vec![Label::new("model", model.to_string())];
        labels.extend(version.map(|v| Label::new("version", v.to_string())));
        ModelMetrics(Arc::new(ModelSeries {
            queue_size: gauge!(QUEUE_SIZE, labels.clone()),
            queue_delay: histogram!(QUEUE_DELAY, labels.clone()),
            labels,
            batch_size: OnceLock::new(),
            inference: OnceLock::new(),
            cost: OnceLock::new(),
            batches: Mutex::new(Vec::new()),
        }))
    }

    /// Requests waiting for the model now.
    pub fn queue_size(&self, n: usize) {
        self.0.queue_size.set(n as f64);
    }

    /// One request's wait from arrival to dispatch.
    pub fn queue_delay(&self, delay: Duration) {
        self.0.queue_delay.record(delay.as_secs_f64());
    }

    /// A batch of `rows` was dispatched, for `trigger`.
    pub fn batch_dispatched(&self, rows: usize, trigger: &'static str) {
        let m = &self.0;
        m.batch_size
            .get_or_init(|| histogram!(BATCH_SIZE, m.labels.clone()))
            .record(rows as f64);
        let mut batches = m.batches.lock().expect("batch counters lock poisoned");
        match batches.iter().find(|(t, _)| *t == trigger) {
            Some((_, c)) => c.increment(1),
            None => {
                let mut labels = m.labels.clone();
                labels.push(Label::new("trigger", trigger));
                let c = counter!(BATCHES, labels);
                c.increment(1);
                batches.push((trigger, c));
            }
        }
    }

    /// The model's fitted batch cost, `(fixed, per_row)` in seconds, and
    /// the wait it predicts for a request arriving now.
    pub fn cost(&self, (f, p): (f64, f64), wait: Duration) {
        let m = &self.0;
        let [fixed, per_row, queue] = m.cost.get_or_init(|| {
            [
                gauge!(BATCH_COST_FIXED, m.labels.clone()),
                gauge!(BATCH_COST_PER_ROW, m.labels.clone()),
                gauge!(QUEUE_WAIT_PREDICTED, m.labels.clone()),
            ]
        });
        fixed.set(f);
        per_row.set(p);
        queue.set(wait.as_secs_f64());
    }

    /// A session run finished.
    pub fn inference(&self, took: Duration) {
        let m = &self.0;
        m.inference
            .get_or_init(|| histogram!(INFERENCE_DURATION, m.labels.clone()))
            .record(took.as_secs_f64());
    }
}

/// A request was answered: `status` is `ok` or the error's kind.
pub fn request(model: &str, protocol: &'static str, error: Option<&crate::error::Error>, took: Duration) {
    let series = request_series(model, protocol);
    series.duration.record(took.as_secs_f64());
    match error {
        None => series.ok.increment(1),
        Some(e) => counter!(REQUESTS, "model" => model.to_string(), "protocol" => protocol, "status" => e.kind().as_str())
            .increment(1),
    }
}

/// The duration histogram and the `ok` counter of one model and protocol.
#[derive(Clone)]
struct RequestSeries {
    duration: Histogram,
    ok: Counter,
}

/// [`RequestSeries`] by model label, then protocol: registered at a model's
/// first request on a protocol, then found without allocating. Written under
/// the lock only then; read by every request's handler. Bounded like the
/// `model` label (models of the repository and `_unknown`).
static REQUEST_SERIES: OnceLock<RwLock<SeriesByModel>> = OnceLock::new();

/// Model label → (protocol, its series).
type SeriesByModel = HashMap<String, Vec<(&'static str, RequestSeries)>>;

fn request_series(model: &str, protocol: &'static str) -> RequestSeries {
    let register = || RequestSeries {
        duration: histogram!(REQUEST_DURATION, "model" => model.to_string(), "protocol" => protocol),
        ok: counter!(REQUESTS, "model" => model.to_string(), "protocol" => protocol, "status" => "ok"),
    };
    // Before the recorder is installed, handles are no-ops: never keep one.
    if HANDLE.get().is_none() {
        return register();
    }
    let map = REQUEST_SERIES.get_or_init(Default::default);
    let find = |m: &SeriesByModel| {
        m.get(model)
            .and_then(|v| v.iter().find(|(p, _)| *p == protocol))
            .map(|(_, s)| s.clone())
    };
    if let Some(s) = find(&map.read().expect("request series lock poisoned")) {
        return s;
    }
    let mut m = map.write().expect("request series lock poisoned");
    if let Some(s) = find(&m) {
        return s;
    }
    let series = register();
    m.entry(model.to_string())
        .or_default()
        .push((protocol, series.clone()));
    series
}

/// Whether `model` serves.
pub fn model_ready(model: &str, ready: bool) {
    gauge!(MODEL_READY, "model" => model.to_string()).set(if ready { 1.0 } else { 0.0 });
}

/// Whether the newest version of `model` batches requests together.
pub fn model_batching(model: &str, on: bool) {
    gauge!(MODEL_BATCHING, "model" => model.to_string()).set(if on { 1.0 } else { 0.0 });
}

/// The serving version of `model` holds `bytes` on `device` (`cpu`, `cuda:N`); 0 once it is gone.
pub fn model_memory(model: &str, device: &str, bytes: u64) {
    gauge!(MODEL_MEMORY, "model" => model.to_string(), "device" => device.to_string()).set(bytes as f64);
}

/// A load or reload finished (`result`: `loaded`, `reloaded` (a new version
/// swapped in), `updated` (new settings in place), `failed` (the last good
/// version, if any, keeps serving) or `unloaded`).
pub fn model_reload(model: &str, result: &'static str) {
    counter!(MODEL_RELOADS, "model" => model.to_string(), "result" => result).increment(1);
}

/// A version of `model` loaded (`reason`: `start`, `on_demand`, `reload`, `api`).
pub fn model_load(model: &str, reason: &'static str) {
    counter!(MODEL_LOADS, "model" => model.to_string(), "reason" => reason).increment(1);
}

/// `model` has `n` live sequences.
pub fn sequences_live(model: &str, n: usize) {
    gauge!(SEQUENCES_LIVE, "model" => model.to_string()).set(n as f64);
}

/// The live sequences of `model` hold `bytes` of state.
pub fn sequence_state_bytes(model: &str, bytes: u64) {
    gauge!(SEQUENCE_STATE, "model" => model.to_string()).set(bytes as f64);
}

/// A sequence of `model` ended (`reason`: `end`, `idle`, `restarted`).
pub fn sequence_ended(model: &str, reason: &'static str) {
    counter!(SEQUENCES_ENDED, "model" => model.to_string(), "reason" => reason).increment(1);
}

/// `model` was unloaded to make room for another.
pub fn model_eviction(model: &str) {
    counter!(MODEL_EVICTIONS, "model" => model.to_string()).increment(1);
}

/// An inference log event's fate (`sent`, `failed`, `dropped`). The three
/// series are registered once: a sink that is down drops events at the
/// request rate.
pub fn inference_log(result: &'static str) {
    static SERIES: OnceLock<[Counter; 3]> = OnceLock::new();
    let [sent, failed, dropped] =
        SERIES.get_or_init(|| ["sent", "failed", "dropped"].map(|r| counter!(INFERENCE_LOG, "result" => r)));
    match result {
        "sent" => sent.increment(1),
        "failed" => failed.increment(1),
        _ => dropped.increment(1),
    }
}

/// A request waited `waited` for `model` to load.
pub fn cold_start(model: &str, waited: Duration) {
    histogram!(COLD_START, "model" => model.to_string()).record(waited.as_secs_f64());
}

/// The residency budget of `device`, and what its loaded models hold.
pub fn residency(device: &str, budget: Option<u64>, used: u64) {
    if let Some(b) = budget {
        gauge!(RESIDENCY_BUDGET, "device" => device.to_string()).set(b as f64);
    }
    gauge!(RESIDENCY_USED, "device" => device.to_string()).set(used as f64);
}

/// A request left without running (`reason`: `client_gone`, `expired`, `no_room`).
pub fn dropped(model: &str, reason: &'static str) {
    counter!(DROPPED, "model" => model.to_string(), "reason" => reason).increment(1);
}

/// Whether the model repository's watch works (false: lost, polling while it retries).
pub fn repository_watching(watching: bool) {
    gauge!(REPOSITORY_WATCHING).set(if watching { 1.0 } else { 0.0 });
}

/// The TLS certificate files changed and were loaded (`ok`) or refused (`error`).
pub fn tls_reload(ok: bool) {
    counter!(TLS_RELOADS, "result" => if ok { "ok" } else { "error" }).increment(1);
}

/// New TLS handshakes get a certificate that expires at `unix_seconds`.
pub fn tls_certificate_expiration(unix_seconds: i64) {
    gauge!(TLS_EXPIRATION).set(unix_seconds as f64);
}
