//! The `[metrics]` and `[inference_log]` sections: the signals other tools
//! read (Triton's metric names; KServe's inference logger, see
//! `crate::inference_log`).

use serde::{Deserialize, Serialize};

/// `[metrics]`: what `/metrics` shows besides sluice's own series.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// Triton's metric names too (`nv_inference_*`, `nv_cpu_*`), rendered at each scrape.
    pub triton_names: bool,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig { triton_names: true }
    }
}

/// Which events are logged (KServe's logger `mode`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogMode {
    /// Each request and its answer.
    #[default]
    All,
    Request,
    Response,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct InferenceLogConfig {
    /// The sink events are POSTed to (`http://` or `https://`); unset: no log.
    pub url: Option<String>,
    /// `all`, `request` or `response`.
    pub mode: LogMode,
    /// The models logged; empty: every model.
    pub models: Vec<String>,
    /// Events waiting for the sink at most; more are dropped (counted).
    pub queue_events: usize,
    /// Bytes the queued events' bodies may hold at most, apart from the
    /// requests' budget; more are dropped (counted). 0: an eighth of
    /// `http.max_inflight_bytes`.
    pub max_queued_bytes: usize,
    /// Events posted at once.
    pub concurrency: usize,
    /// Seconds one post may take before it counts as failed.
    pub timeout_seconds: f64,
    /// `ce-source`.
    pub source: String,
    /// `ce-inferenceservicename`; unset: the model's name.
    pub inference_service_name: Option<String>,
    /// `ce-namespace`; unset: `POD_NAMESPACE` (the Downward API's), else empty.
    pub namespace: Option<String>,
    /// `ce-endpoint` (KServe's `default` or `canary`).
    pub endpoint: String,
}

impl Default for InferenceLogConfig {
    fn default() -> Self {
        InferenceLogConfig {
            url: None,
            mode: LogMode::All,
            models: Vec::new(),
            queue_events: 1024,
            max_queued_bytes: 0,
            concurrency: 4,
            timeout_seconds: 5.0,
            source: "http://localhost:9081/".into(),
            inference_service_name: None,
            namespace: None,
            endpoint: "default".into(),
        }
    }
}

impl InferenceLogConfig {
    /// The bytes queued events may hold, given the requests' budget.
    pub fn queued_bytes(&self, requests: usize) -> usize {
        match self.max_queued_bytes {
            0 => (requests / 8).max(1),
            n => n,
        }
    }

    /// Checks the values; the error names the key.
    pub fn validate(&self) -> Result<(), String> {
        if let Some(url) = &self.url {
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(format!(
                    "inference_log.url {url:?} must start with http:// or https://"
                ));
            }
        }
        if self.queue_events == 0 || self.concurrency == 0 {
            return Err("inference_log.queue_events and inference_log.concurrency must be at least 1".into());
        }
        if !(self.timeout_seconds > 0.0 && self.timeout_seconds.is_finite()) {
            return Err("inference_log.timeout_seconds must be a number of seconds above 0".into());
        }
        Ok(())
    }
}
