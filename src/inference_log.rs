//! The inference log, KServe's logger contract: for each inference request
//! and/or its answer, a CloudEvent (binary mode: `ce-*` headers, the body as
//! it went over the wire) POSTed to an HTTP sink, for every protocol and
//! for errors too (with `ce-status`, which KServe's lacks).
//!
//! Off the request path: handlers hand an event to a bounded queue and go
//! on; one task (holding the queue's receiver) posts them, a few at a time,
//! each within a timeout. A full queue, or a queue whose bodies already hold
//! `inference_log.max_queued_bytes`, drops the event (counted in
//! `sluice_inference_log_events_total{result="dropped"}`, and logged at most
//! once a minute): a sink that is slow or down never slows or fails inference.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::{mpsc, Semaphore};

use crate::budget::{ByteBudget, Reservation};
use crate::config::{InferenceLogConfig, LogMode};
use crate::metrics;

/// Request or answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Request,
    Response,
}

impl Kind {
    /// KServe's `ce-type`.
    fn ce_type(self) -> &'static str {
        match self {
            Kind::Request => "org.kubeflow.serving.inference.request",
            Kind::Response => "org.kubeflow.serving.inference.response",
        }
    }
}

/// One event on its way to the sink; holds its body's bytes of the log's own budget.
struct Event {
    kind: Kind,
    id: String,
    model: String,
    protocol: &'static str,
    content_type: String,
    status: Option<u16>,
    body: Bytes,
    _held: Reservation,
}

/// The handle the ports log through. Cheap to share (`Arc`).
pub struct InferenceLog {
    /// To the sending task, which holds the receiver until every handle is gone.
    tx: mpsc::Sender<Event>,
    mode: LogMode,
    /// Empty: every model.
    models: Vec<String>,
    /// The log's own bytes (`inference_log.max_queued_bytes`), apart from the
    /// requests' budget: events a sick sink leaves queued never refuse a request.
    budget: ByteBudget,
    started: Instant,
    /// The minute since `started` of the last "dropped" line (at most one a minute).
    warned_minute: AtomicU64,
}

/// The ids of events whose request named none: unique in this process.
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

impl InferenceLog {
    /// Starts the sending task when `[inference_log] url` is set.
    /// `requests` is the requests' byte budget (`http.max_inflight_bytes`),
    /// which sets the log's own when `max_queued_bytes` is 0.
    pub fn start(cfg: &InferenceLogConfig, requests: &ByteBudget) -> Option<Arc<InferenceLog>> {
        let url = cfg.url.clone()?;
        let (tx, rx) = mpsc::channel(cfg.queue_events.max(1));
        let sink = Sink {
            url,
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs_f64(cfg.timeout_seconds))
                .build()
                .ok()?,
            source: cfg.source.clone(),
            service: cfg.inference_service_name.clone(),
            namespace: cfg
                .namespace
                .clone()
                .or_else(|| std::env::var("POD_NAMESPACE").ok())
                .unwrap_or_default(),
            endpoint: cfg.endpoint.clone(),
        };
        tokio::spawn(sink.run(rx, cfg.concurrency.max(1)));
        tracing::info!(url = %cfg.url.as_deref().unwrap_or(""), mode = ?cfg.mode, "inference log on");
        Some(Arc::new(InferenceLog {
            tx,
            mode: cfg.mode,
            models: cfg.models.clone(),
            budget: ByteBudget::new(cfg.queued_bytes(requests.total())),
            started: Instant::now(),
            warned_minute: AtomicU64::new(0),
        }))
    }

    /// Whether events of `kind` for `model` are logged.
    fn wants(&self, model: &str, kind: Kind) -> bool {
        let mode = match kind {
            Kind::Request => matches!(self.mode, LogMode::All | LogMode::Request),
            Kind::Response => matches!(self.mode, LogMode::All | LogMode::Response),
        };
        mode && (self.models.is_empty() || self.models.iter().any(|m| m == model))
    }

    /// The event id of a request: the client's (`x-request-id`), else a new one.
    fn id(given: Option<&str>) -> String {
        match given.filter(|g| !g.is_empty()) {
            Some(g) => g.chars().take(128).collect(),
            None => {
                let n = NEXT_ID.fetch_add(1, Ordering::Relaxed);
                format!("sluice-{}-{n}", std::process::id())
            }
        }
    }

    /// Queues an event, or drops it (counted) when the queue or the budget
    /// is full. Never waits.
    #[allow(clippy::too_many_arguments)]
    fn log(
        &self,
        kind: Kind,
        id: &str,
        model: &str,
        protocol: &'static str,
        content_type: &str,
        status: Option<u16>,
        body: Bytes,
    ) {
        if !self.wants(model, kind) {
            return;
        }
        // A full queue (a sink down or slow) costs a counter, not an event.
        if self.tx.capacity() == 0 {
            return self.dropped("its queue (inference_log.queue_events) is full: the sink is slow or down");
        }
        let Ok(held) = self.budget.reserve(body.len()) else {
            return self.dropped("the bodies queued for the sink hold inference_log.max_queued_bytes: the sink is slow or down");
        };
        let event = Event {
            kind,
            id: id.to_string(),
            model: model.to_string(),
            protocol,
            content_type: content_type.to_string(),
            status,
            body,
            _held: held,
        };
        if self.tx.try_send(event).is_err() {
            self.dropped("its queue (inference_log.queue_events) is full: the sink is slow or down");
        }
    }

    fn dropped(&self, why: &str) {
        metrics::inference_log("dropped");
        // At most one line a minute, without a lock.
        let minute = self.started.elapsed().as_secs() / 60 + 1;
        if self.warned_minute.swap(minute, Ordering::Relaxed) != minute {
            tracing::warn!(
                "inference log: events dropped: {why} (sluice_inference_log_events_total counts them)"
            );
        }
    }
}

/// One request's events: its id, model and protocol, fixed once for its
/// request and its answer. A no-op without a log, or for a model the log
/// leaves out; a body is made only for an event that goes out.
pub struct RequestLog<'a> {
    log: Option<&'a InferenceLog>,
    model: &'a str,
    protocol: &'static str,
    id: String,
}

impl<'a> RequestLog<'a> {
    /// `given_id`: the client's id for the request (`x-request-id`, gRPC's `id`).
    pub fn new(
        log: Option<&'a InferenceLog>,
        model: &'a str,
        protocol: &'static str,
        given_id: Option<&str>,
    ) -> Self {
        let log = log.filter(|l| l.wants(model, Kind::Request) || l.wants(model, Kind::Response));
        let id = match log {
            Some(_) => InferenceLog::id(given_id),
            None => String::new(),
        };
        RequestLog {
            log,
            model,
            protocol,
            id,
        }
    }

    fn event(&self, kind: Kind, content_type: &str, status: Option<u16>, body: impl FnOnce() -> Bytes) {
        if let Some(l) = self.log.filter(|l| l.wants(self.model, kind)) {
            l.log(
                kind,
                &self.id,
                self.model,
                self.protocol,
                content_type,
                status,
                body(),
            );
        }
    }

    /// The request's body as received.
    pub fn request(&self, content_type: &str, body: impl FnOnce() -> Bytes) {
        self.event(Kind::Request, content_type, None, body);
    }

    /// The answer's body as sent (status 200).
    pub fn answer(&self, content_type: &str, body: impl FnOnce() -> Bytes) {
        self.event(Kind::Response, content_type, Some(200), body);
    }

    /// An error answer: its `status` and `{"error": ...}` body.
    pub fn error(&self, status: u16, e: &crate::error::Error) {
        let body = || serde_json::json!({ "error": e.to_string() }).to_string().into();
        self.event(Kind::Response, "application/json", Some(status), body);
    }
}

/// Where events go, and the attributes every event carries.
struct Sink {
    url: String,
    client: reqwest::Client,
    source: String,
    /// `ce-inferenceservicename`; the model's name when unset.
    service: Option<String>,
    namespace: String,
    endpoint: String,
}

impl Sink {
    /// Posts events as they come, at most `concurrency` at once; ends when
    /// every handle is gone and the queue is empty.
    async fn run(self, mut rx: mpsc::Receiver<Event>, concurrency: usize) {
        let sink = Arc::new(self);
        let slots = Arc::new(Semaphore::new(concurrency));
        // Failures in a row: after one, the sender pauses (100 ms, doubling
        // to 5 s), so that a sink that is down costs one failed post per
        // pause, not one per event; meanwhile events wait in the queue, and
        // once it is full are dropped at its door, for the price of a counter.
        let failures = Arc::new(AtomicU64::new(0));
        while let Some(event) = rx.recv().await {
            let n = failures.load(Ordering::Relaxed);
            if n > 0 {
                let pause = Duration::from_millis(100 << n.min(6)).min(Duration::from_secs(5));
                tokio::time::sleep(pause).await;
            }
            let Ok(slot) = slots.clone().acquire_owned().await else {
                break;
            };
            let (sink, failures) = (sink.clone(), failures.clone());
            tokio::spawn(async move {
                let result = sink.post(&event).await;
                drop(slot);
                match result {
                    Ok(()) => {
                        failures.store(0, Ordering::Relaxed);
                        metrics::inference_log("sent");
                    }
                    Err(e) => {
                        failures.fetch_add(1, Ordering::Relaxed);
                        metrics::inference_log("failed");
                        tracing::debug!(model = %event.model, "inference log: the sink refused an event: {e}");
                    }
                }
            });
        }
    }

    async fn post(&self, e: &Event) -> Result<(), String> {
        let time = httpdate::fmt_http_date(std::time::SystemTime::now());
        let mut req = self
            .client
            .post(&self.url)
            .header("content-type", &e.content_type)
            .header("ce-specversion", "1.0")
            .header("ce-id", &e.id)
            .header("ce-type", e.kind.ce_type())
            .header("ce-source", &self.source)
            .header("ce-time", rfc3339_of(&time))
            .header(
                "ce-inferenceservicename",
                self.service.as_deref().unwrap_or(&e.model),
            )
            .header("ce-namespace", &self.namespace)
            .header("ce-component", "predictor")
            .header("ce-endpoint", &self.endpoint)
            .header("ce-modelid", &e.model)
            .header("ce-protocol", e.protocol)
            .body(e.body.clone());
        if let Some(s) = e.status {
            req = req.header("ce-status", s.to_string());
        }
        let resp = req.send().await.map_err(|e| e.to_string())?;
        match resp.status().is_success() {
            true => Ok(()),
            false => Err(format!("status {}", resp.status())),
        }
    }
}

/// An HTTP date (`Thu, 01 Jan 1970 00:00:00 GMT`) as RFC 3339 (`1970-01-01T00:00:00Z`).
fn rfc3339_of(http_date: &str) -> String {
    let Ok(t) = httpdate::parse_http_date(http_date) else {
        return String::new();
    };
    let secs = t.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Days since 1970-01-01 → (year, month, day) (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_rfc3339() {
        assert_eq!(
            rfc3339_of("Sun, 29 Nov 2026 09:15:31 GMT"),
            "2026-11-29T09:15:31Z"
        );
        assert_eq!(
            rfc3339_of("Thu, 01 Jan 1970 00:00:00 GMT"),
            "1970-01-01T00:00:00Z"
        );
        assert_eq!(
            rfc3339_of("Tue, 29 Feb 2028 23:59:59 GMT"),
            "2028-02-29T23:59:59Z"
        );
    }

    #[test]
    fn ids_are_the_clients_or_unique() {
        assert_eq!(InferenceLog::id(Some("abc")), "abc");
        let (a, b) = (InferenceLog::id(None), InferenceLog::id(Some("")));
        assert_ne!(a, b);
        assert!(a.starts_with("sluice-"));
    }
}
