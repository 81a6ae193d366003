//! The server's `/metrics`, read at the edges of a measured window: histogram
//! sums and counts per model, and the server's CPU time beside them.

use std::collections::HashMap;
use std::net::SocketAddr;

use anyhow::{bail, Result};

use super::client::get;
use super::process_cpu_seconds;

/// `(metric name, model label)` -> value, summed over the other labels.
/// A histogram's buckets are kept as `name{le="bound"}` (e.g.
/// `sluice_batch_size_bucket{le="1"}`), its sums and counts as `name`.
pub type Metrics = HashMap<(String, String), f64>;

pub fn parse_metrics(text: &str) -> Metrics {
    let mut m = Metrics::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.parse::<f64>() else { continue };
        let (name, labels) = series.split_once('{').unwrap_or((series, ""));
        let name = if name.ends_with("_bucket") {
            let Some(le) = labels
                .split_once("le=\"")
                .and_then(|(_, rest)| rest.split_once('"'))
                .map(|(le, _)| le)
            else {
                continue;
            };
            format!("{name}{{le=\"{le}\"}}")
        } else if name.ends_with("_sum") || name.ends_with("_count") {
            name.to_string()
        } else {
            continue;
        };
        let Some(model) = labels
            .split_once("model=\"")
            .and_then(|(_, rest)| rest.split_once('"'))
            .map(|(m, _)| m.to_string())
        else {
            continue;
        };
        *m.entry((name, model)).or_default() += value;
    }
    m
}

/// The server's CPU time and metrics at one instant.
pub struct Snapshot {
    pub cpu: f64,
    pub metrics: Metrics,
}

/// Which end of a measured window a snapshot is taken at: the CPU time is
/// read on the window's side of the `/metrics` request, so rendering the
/// metrics is never counted in the window.
#[derive(Clone, Copy, PartialEq)]
pub enum Edge {
    Start,
    End,
}

pub async fn snapshot(addr: SocketAddr, pid: u32, edge: Edge) -> Result<Snapshot> {
    let mut cpu = if edge == Edge::End {
        process_cpu_seconds(pid)?
    } else {
        0.0
    };
    let (status, body) = get(addr, "/metrics").await?;
    if status != 200 {
        bail!("/metrics answered {status}");
    }
    if edge == Edge::Start {
        cpu = process_cpu_seconds(pid)?;
    }
    Ok(Snapshot {
        cpu,
        metrics: parse_metrics(&String::from_utf8_lossy(&body)),
    })
}

impl Snapshot {
    /// Mean of histogram `name` for `model` between `self` and `later` (None without observations).
    pub fn mean_since(&self, later: &Snapshot, name: &str, model: &str) -> Option<f64> {
        self.mean_since_over(later, name, &[model])
    }

    /// Mean of histogram `name` over all of `models` together (their sums over their counts).
    pub fn mean_since_over<S: AsRef<str>>(&self, later: &Snapshot, name: &str, models: &[S]) -> Option<f64> {
        let count = self.grown(later, &format!("{name}_count"), models);
        (count > 0.0).then(|| self.grown(later, &format!("{name}_sum"), models) / count)
    }

    /// How much series `key` (a key of [`Metrics`]), summed over `models`,
    /// grew between `self` and `later`.
    fn grown<S: AsRef<str>>(&self, later: &Snapshot, key: &str, models: &[S]) -> f64 {
        let total = |s: &Snapshot| -> f64 {
            models
                .iter()
                .map(|m| {
                    s.metrics
                        .get(&(key.to_string(), m.as_ref().to_string()))
                        .copied()
                        .unwrap_or(0.0)
                })
                .sum()
        };
        total(later) - total(self)
    }

    /// Fraction of histogram `name`'s observations for `models` between
    /// `self` and `later` that were at most `le` (one of its bucket bounds,
    /// as `/metrics` writes it, e.g. `"1"`).
    pub fn share_at_most_over<S: AsRef<str>>(
        &self,
        later: &Snapshot,
        name: &str,
        le: &str,
        models: &[S],
    ) -> Option<f64> {
        let count = self.grown(later, &format!("{name}_count"), models);
        (count > 0.0).then(|| self.grown(later, &format!("{name}_bucket{{le=\"{le}\"}}"), models) / count)
    }
}
