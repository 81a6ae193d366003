//! The exporter: an OpenTelemetry SDK tracer provider whose batch span
//! processor (a thread of its own) POSTs protobuf-encoded spans to an
//! OTLP/HTTP receiver, and the `tracing` layer that feeds it the spans of
//! target [`TARGET`](super::TARGET). Installed by the binary before it
//! starts the async runtime, and shut down (spans flushed) after the
//! runtime has stopped.
//!
//! Besides what [`TracingExport`] resolved, the SDK reads the standard
//! variables it knows itself: `OTEL_EXPORTER_OTLP_HEADERS` / `_TIMEOUT`
//! (and their `_TRACES_` forms), `OTEL_RESOURCE_ATTRIBUTES`,
//! `OTEL_TRACES_SAMPLER` / `_ARG` (when `tracing.sample_ratio` is unset),
//! `OTEL_BSP_*` and `OTEL_SPAN_*_LIMIT`.

use std::sync::atomic::Ordering;
use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
use opentelemetry_sdk::Resource;
use tracing::{Level, Metadata};
use tracing_subscriber::filter::filter_fn;
use tracing_subscriber::registry::Registry;
use tracing_subscriber::Layer;

use super::{ENABLED, TARGET};
use crate::config::TracingExport;

/// How long shutting down may wait for the last spans to be sent.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

/// The running exporter. [`Tracing::shutdown`] flushes the spans still
/// queued; call it once the server has stopped.
pub struct Tracing {
    provider: SdkTracerProvider,
}

/// The `tracing` layer that turns sluice's spans into OpenTelemetry spans;
/// add it to the subscriber beside the log layer.
pub type OtelLayer = Box<dyn Layer<Registry> + Send + Sync>;

/// Starts the exporter that `export` describes and returns it with its
/// layer; from then on [`enabled`](super::enabled) is true. Call at most once.
pub fn install(export: &TracingExport) -> Result<(Tracing, OtelLayer), String> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
        .with_endpoint(export.traces_url.clone())
        .build()
        .map_err(|e| format!("cannot start the OTLP exporter for {}: {e}", export.traces_url))?;
    let mut resource = Resource::builder();
    if let Some(name) = &export.service_name {
        resource = resource.with_service_name(name.clone());
    }
    let mut provider = SdkTracerProvider::builder()
        .with_resource(resource.build())
        .with_batch_exporter(exporter);
    if let Some(ratio) = export.sample_ratio {
        provider = provider.with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(ratio))));
    }
    let provider = provider.build();
    let tracer = provider.tracer("sluice");
    let layer = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_location(false)
        .with_threads(false)
        .with_target(false)
        .with_tracked_inactivity(false)
        .with_filter(filter_fn(recorded));
    ENABLED.store(true, Ordering::Relaxed);
    Ok((Tracing { provider }, Box::new(layer)))
}

/// What the OpenTelemetry layer sees: sluice's own spans, and sluice's
/// log events at info or above (span events of the span they happen in).
fn recorded(meta: &Metadata<'_>) -> bool {
    if meta.is_span() {
        meta.target() == TARGET
    } else {
        *meta.level() <= Level::INFO && meta.target().starts_with("sluice")
    }
}

/// Whether a log layer should see this: everything but the spans of [`TARGET`]
/// (log lines look the same with tracing on or off).
pub fn logged(meta: &Metadata<'_>) -> bool {
    !(meta.is_span() && meta.target() == TARGET)
}

impl Tracing {
    /// Sends the spans still queued (waiting at most a few seconds for the
    /// receiver) and stops the exporter's thread. Call outside the async
    /// runtime: it blocks.
    pub fn shutdown(self) {
        if let Err(e) = self.provider.shutdown_with_timeout(FLUSH_TIMEOUT) {
            tracing::warn!(error = %e, "could not send the last spans to the OTLP receiver");
        }
    }
}
