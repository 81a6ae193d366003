//! OpenTelemetry traces: the spans a request leaves (see the README,
//! "Tracing") and, in `export.rs`, the exporter the binary installs.
//!
//! Off unless the binary installed an exporter ([`export::install`]): then
//! every function here returns [`Span::none()`] or does nothing after one
//! load of a flag, so a request costs what it did before tracing existed.
//!
//! The spans of one request (`infer`, server kind, continuing the caller's
//! trace from a W3C `traceparent` header or gRPC metadata):
//! - `queue`: child of `infer`, from the request's entry into its model's
//!   queue until its batch forms;
//! - `batch`: one per batch, from its formation until its outputs are split
//!   and answered, with the batch id, rows and requests; a child of the
//!   batch's oldest request and linked to every request's `infer` span,
//!   each of which records the batch id and links back;
//! - `encode`: child of `infer`, the answer's conversion to the protocol.
//!
//! Spans use the target [`TARGET`], which only the OpenTelemetry layer
//! listens to: the log lines stay as they were.
//!
//! Which layer uses this: `http/` and `grpc/` open the request span and
//! the encode span; `model/` records the version; `batcher/` opens the
//! queue and batch spans. It sits beside `metrics` at the bottom of the
//! layer list: it imports nothing of sluice's but `config` and `error`.

pub mod export;

use std::sync::atomic::{AtomicBool, Ordering};

use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::{Status, TraceContextExt};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::error::Error;

/// The target of every span sluice makes for OpenTelemetry.
pub const TARGET: &str = "sluice::otel";

/// Set once by [`export::install`] when an exporter runs; never unset.
static ENABLED: AtomicBool = AtomicBool::new(false);

/// Whether spans are recorded (an exporter is installed).
#[inline]
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// The caller's trace, taken from a request's `traceparent` (and
/// `tracestate`) header or metadata; empty when tracing is off or the
/// request carries none (its `infer` span then starts a new trace).
#[derive(Clone, Default)]
pub struct Parent(Option<opentelemetry::Context>);

impl Parent {
    /// Reads the W3C trace context through `get` (a header or metadata
    /// lookup by lowercase name). Does nothing when tracing is off.
    pub fn extract<'a>(get: impl Fn(&str) -> Option<&'a str>) -> Parent {
        if !enabled() {
            return Parent(None);
        }
        /// The two W3C headers, looked up once.
        struct W3c<'a>([(&'static str, Option<&'a str>); 2]);
        impl Extractor for W3c<'_> {
            fn get(&self, key: &str) -> Option<&str> {
                self.0.iter().find(|(k, _)| k.eq_ignore_ascii_case(key))?.1
            }
            fn keys(&self) -> Vec<&str> {
                self.0.iter().map(|(k, _)| *k).collect()
            }
        }
        let headers = W3c([
            ("traceparent", get("traceparent")),
            ("tracestate", get("tracestate")),
        ]);
        let cx = TraceContextPropagator::new().extract(&headers);
        Parent(cx.span().span_context().is_valid().then_some(cx))
    }
}

/// The `infer` span of one request (`protocol`: `v1`, `v2` or `grpc`) for
/// `model`, continuing `parent`'s trace. Instrument the request's future
/// with it: the model records its version and the batcher its batch into
/// the current span.
pub fn request_span(protocol: &'static str, model: &str, parent: &Parent) -> Span {
    if !enabled() {
        return Span::none();
    }
    let span = tracing::info_span!(
        target: TARGET,
        "infer",
        otel.kind = "server",
        sluice.protocol = protocol,
        sluice.model.name = model,
        sluice.model.version = tracing::field::Empty,
        sluice.batch.id = tracing::field::Empty,
    );
    if let Some(cx) = &parent.0 {
        // Only fails for a span that already started; this one is new.
        let _ = span.set_parent(cx.clone());
    }
    span
}

/// Records a request's outcome on its `infer` span: an error status with
/// the error's kind and message.
pub fn finish(span: &Span, error: Option<&Error>) {
    if let (true, Some(e)) = (enabled(), error) {
        span.set_attribute("error.type", e.kind().as_str());
        span.set_status(Status::error(e.to_string()));
    }
}

/// Records the version of the model serving the current request.
pub fn record_version(version: Option<&str>) {
    if let (true, Some(v)) = (enabled(), version) {
        Span::current().record("sluice.model.version", v);
    }
}

/// Runs `f` (the answer's conversion to the protocol) in an `encode` span,
/// a child of the current request's span.
pub fn encode<T>(f: impl FnOnce() -> T) -> T {
    if !enabled() {
        return f();
    }
    tracing::info_span!(target: TARGET, "encode").in_scope(f)
}

/// For a request entering its model's queue: the current (`infer`) span,
/// which the entry carries to its batch, and a `queue` span under it that
/// ends when the entry leaves the queue (dropped with the entry's copy).
pub fn enqueued() -> (Span, Span) {
    if !enabled() {
        return (Span::none(), Span::none());
    }
    let request = Span::current();
    if request.is_none() {
        // Not a request (nothing to continue): no root `queue` span either.
        return (Span::none(), Span::none());
    }
    let queue = tracing::info_span!(target: TARGET, parent: &request, "queue");
    (request, queue)
}

/// The `batch` span of one batch of `model`: a child of the first request's
/// span, linked to every request's span (`entries`: each entry's request
/// span and rows), each of which records `batch_id` and links back to it.
pub fn batch_span<'a>(
    model: &str,
    batch_id: &str,
    entries: impl ExactSizeIterator<Item = (&'a Span, usize)> + Clone,
) -> Span {
    if !enabled() {
        return Span::none();
    }
    let rows: usize = entries.clone().map(|(_, rows)| rows).sum();
    let first = entries.clone().next().map_or_else(Span::none, |(s, _)| s.clone());
    let span = tracing::info_span!(
        target: TARGET,
        parent: &first,
        "batch",
        sluice.model.name = model,
        sluice.batch.id = batch_id,
        // Signed: the OpenTelemetry layer exports unsigned integers as strings.
        sluice.batch.size = rows as i64,
        sluice.batch.requests = entries.len() as i64,
    );
    let batch = span.context().span().span_context().clone();
    for (request, _) in entries {
        span.add_link(request.context().span().span_context().clone());
        request.record("sluice.batch.id", batch_id);
        request.add_link(batch.clone());
    }
    span
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing_subscriber::layer::SubscriberExt;

    /// Without an installed exporter nothing is recorded, even under a
    /// subscriber that would take every span: no span, no parent, no link.
    #[test]
    fn off_unless_installed() {
        assert!(!enabled(), "no unit test installs an exporter");
        let subscriber =
            tracing_subscriber::registry().with(tracing_subscriber::fmt::layer().with_test_writer());
        tracing::subscriber::with_default(subscriber, || {
            let parent = Parent::extract(|k| {
                (k == "traceparent").then_some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
            });
            assert!(parent.0.is_none());
            let span = request_span("v2", "digits", &parent);
            assert!(span.is_none());
            let _in = span.enter();
            let (request, queue) = enqueued();
            assert!(request.is_none() && queue.is_none());
            assert!(batch_span("digits", "1", [(&request, 1)].into_iter()).is_none());
            assert_eq!(encode(|| 7), 7);
        });
    }
}
