//! The `[residency]` section: which models stay loaded when the repository
//! holds more than memory does (see `repository::residency`).

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// When a model loads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResidencyMode {
    /// Every model loads at start, as long as the budgets hold; the rest
    /// load on their first request.
    #[default]
    Eager,
    /// Only pinned models load at start; every other model loads on its
    /// first request.
    OnDemand,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ResidencyConfig {
    /// `eager` or `on_demand`.
    pub mode: ResidencyMode,
    /// Most bytes the loaded models may hold in host memory (each model's
    /// resident-memory growth over its load and warm-up); unset: no budget.
    pub host_bytes: Option<u64>,
    /// Most bytes the loaded models may hold on each GPU; unset: what the
    /// device reports as its total, less `device_margin_fraction` of it.
    pub device_bytes: Option<u64>,
    /// The share of a GPU's memory left out of the default `device_bytes`,
    /// for CUDA's own context and the batches' activations.
    pub device_margin_fraction: f64,
    /// Seconds a model must go without a request (or since its load)
    /// before it may be evicted to make room for another. 0: any idle model
    /// may go, least recently used first; more trades refused cold loads
    /// (503) for fewer reloads when the working set does not fit.
    pub min_idle_seconds: f64,
}

impl Default for ResidencyConfig {
    fn default() -> Self {
        ResidencyConfig {
            mode: ResidencyMode::Eager,
            host_bytes: None,
            device_bytes: None,
            device_margin_fraction: 0.1,
            min_idle_seconds: 0.0,
        }
    }
}

impl ResidencyConfig {
    /// The section's problems, each naming its key.
    pub(super) fn validate(&self, errs: &mut Vec<String>) {
        for (key, v) in [
            ("host_bytes", self.host_bytes),
            ("device_bytes", self.device_bytes),
        ] {
            if v == Some(0) {
                errs.push(format!(
                    "residency.{key} must be more than 0 bytes (leave it unset for no budget)"
                ));
            }
        }
        if !(self.device_margin_fraction.is_finite() && (0.0..=0.9).contains(&self.device_margin_fraction)) {
            errs.push(format!(
                "residency.device_margin_fraction must be 0..=0.9, got {}",
                self.device_margin_fraction
            ));
        }
        if !(self.min_idle_seconds.is_finite() && (0.0..=86400.0).contains(&self.min_idle_seconds)) {
            errs.push(format!(
                "residency.min_idle_seconds must be 0..=86400, got {}",
                self.min_idle_seconds
            ));
        }
    }

    /// The validated values the repository works with.
    pub fn policy(&self) -> Residency {
        Residency {
            mode: self.mode,
            host_bytes: self.host_bytes,
            device_bytes: self.device_bytes,
            device_margin_fraction: self.device_margin_fraction,
            min_idle: Duration::from_secs_f64(self.min_idle_seconds),
        }
    }
}

/// `[residency]`, validated.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Residency {
    pub mode: ResidencyMode,
    pub host_bytes: Option<u64>,
    pub device_bytes: Option<u64>,
    pub device_margin_fraction: f64,
    pub min_idle: Duration,
}

impl Default for Residency {
    fn default() -> Self {
        ResidencyConfig::default().policy()
    }
}
