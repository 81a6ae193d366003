//! Triton's metric names (`nv_inference_*`, `nv_cpu_*`), rendered at each
//! scrape from the models' cumulative statistics (the ones Triton's
//! statistics extension reports), so they cost the request path nothing and
//! agree with `/v2/models/stats`. Names, labels (`model`, `version`;
//! `reason` on failures), units (microseconds) and meanings are Triton's
//! (docs/user_guide/metrics.md). Left out: `nv_gpu_*` (Triton reads them
//! through NVML, which sluice does not load; `sluice_model_memory_bytes`
//! carries each model's device bytes), the cache metrics (sluice keeps no
//! response cache), the summaries and histograms (off by default in Triton;
//! sluice's own histograms carry the distributions).

use std::fmt::Write as _;
use std::sync::Mutex;

/// One model version's figures.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Row {
    pub model: String,
    pub version: String,
    pub success: u64,
    /// (Triton's reason label, count).
    pub failures: Vec<(&'static str, u64)>,
    /// Rows run (a batch of n counts n).
    pub inference_count: u64,
    /// Batches run.
    pub exec_count: u64,
    /// Cumulative microseconds: successful requests from arrival to answer.
    pub request_us: u64,
    pub queue_us: u64,
    pub compute_input_us: u64,
    pub compute_infer_us: u64,
    pub compute_output_us: u64,
    /// Requests waiting in the model's queue now.
    pub pending: u64,
}

/// The families, in the order rendered: (name, type, help, value of a row).
type Family = (&'static str, &'static str, &'static str, fn(&Row) -> u64);

const FAMILIES: &[Family] = &[
    (
        "nv_inference_request_success",
        "counter",
        "Number of successful inference requests, all batch sizes",
        |r| r.success,
    ),
    (
        "nv_inference_count",
        "counter",
        "Number of inferences performed (does not include cached requests)",
        |r| r.inference_count,
    ),
    (
        "nv_inference_exec_count",
        "counter",
        "Number of model executions performed (does not include cached requests)",
        |r| r.exec_count,
    ),
    (
        "nv_inference_request_duration_us",
        "counter",
        "Cumulative inference request duration in microseconds (includes cached requests)",
        |r| r.request_us,
    ),
    (
        "nv_inference_queue_duration_us",
        "counter",
        "Cumulative inference queuing duration in microseconds (includes cached requests)",
        |r| r.queue_us,
    ),
    (
        "nv_inference_compute_input_duration_us",
        "counter",
        "Cumulative compute input duration in microseconds (does not include cached requests)",
        |r| r.compute_input_us,
    ),
    (
        "nv_inference_compute_infer_duration_us",
        "counter",
        "Cumulative compute inference duration in microseconds (does not include cached requests)",
        |r| r.compute_infer_us,
    ),
    (
        "nv_inference_compute_output_duration_us",
        "counter",
        "Cumulative inference compute output duration in microseconds (does not include cached requests)",
        |r| r.compute_output_us,
    ),
    (
        "nv_inference_pending_request_count",
        "gauge",
        "Instantaneous number of pending requests awaiting execution per-model.",
        |r| r.pending,
    ),
];

/// Appends the families of `rows`, and the CPU gauges, in Prometheus' text format.
pub fn render(rows: &[Row], out: &mut String) {
    let labels = |r: &Row| {
        format!(
            "model=\"{}\",version=\"{}\"",
            escape(&r.model),
            escape(&r.version)
        )
    };
    let (name, kind, help) = (
        "nv_inference_request_failure",
        "counter",
        "Number of failed inference requests, all batch sizes",
    );
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    for r in rows {
        for (reason, n) in &r.failures {
            let _ = writeln!(out, "{name}{{{},reason=\"{reason}\"}} {n}", labels(r));
        }
    }
    for (name, kind, help, value) in FAMILIES {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for r in rows {
            let _ = writeln!(out, "{name}{{{}}} {}", labels(r), value(r));
        }
    }
    cpu(out);
}

/// Prometheus' label-value escaping.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// The CPU's busy and total jiffies at the last scrape (utilisation is
/// measured between scrapes, as Triton measures it between its polls).
static LAST_CPU: Mutex<Option<(u64, u64)>> = Mutex::new(None);

/// `nv_cpu_utilization` (0 to 1, every core) and `nv_cpu_memory_*_bytes`
/// (the machine's, as Triton reports them), from /proc.
fn cpu(out: &mut String) {
    if let Some((busy, total)) = proc_stat() {
        let mut last = LAST_CPU.lock().unwrap_or_else(|e| e.into_inner());
        let util = match *last {
            Some((b0, t0)) if total > t0 => (busy.saturating_sub(b0)) as f64 / (total - t0) as f64,
            _ => 0.0,
        };
        *last = Some((busy, total));
        let _ = writeln!(
            out,
            "# HELP nv_cpu_utilization CPU utilization rate [0.0 - 1.0]\n# TYPE nv_cpu_utilization gauge\nnv_cpu_utilization {util}"
        );
    }
    if let Some((total, available)) = meminfo() {
        let _ = writeln!(
            out,
            "# HELP nv_cpu_memory_total_bytes CPU total memory (RAM), in bytes\n# TYPE nv_cpu_memory_total_bytes gauge\nnv_cpu_memory_total_bytes {total}\n\
             # HELP nv_cpu_memory_used_bytes CPU used memory (RAM), in bytes\n# TYPE nv_cpu_memory_used_bytes gauge\nnv_cpu_memory_used_bytes {}",
            total.saturating_sub(available)
        );
    }
}

/// (busy, total) jiffies of every CPU, from /proc/stat's first line.
fn proc_stat() -> Option<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    let line = text.lines().next()?.strip_prefix("cpu ")?;
    let v: Vec<u64> = line.split_whitespace().filter_map(|x| x.parse().ok()).collect();
    // user nice system idle iowait irq softirq steal
    let total: u64 = v.iter().take(8).sum();
    let idle = v.get(3)? + v.get(4).copied().unwrap_or(0);
    Some((total.saturating_sub(idle), total))
}

/// (MemTotal, MemAvailable) in bytes, from /proc/meminfo.
fn meminfo() -> Option<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let field = |k: &str| -> Option<u64> {
        let line = text.lines().find(|l| l.starts_with(k))?;
        line.split_whitespace()
            .nth(1)?
            .parse::<u64>()
            .ok()
            .map(|kb| kb * 1024)
    };
    Some((field("MemTotal:")?, field("MemAvailable:")?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_render_with_tritons_names_and_labels() {
        let row = Row {
            model: "m\"x".into(),
            version: "1".into(),
            success: 3,
            failures: vec![("REJECTED", 1), ("OTHER", 0)],
            inference_count: 7,
            exec_count: 2,
            queue_us: 40,
            pending: 5,
            ..Row::default()
        };
        let mut out = String::new();
        render(&[row], &mut out);
        for line in [
            "# TYPE nv_inference_request_success counter",
            "nv_inference_request_success{model=\"m\\\"x\",version=\"1\"} 3",
            "nv_inference_request_failure{model=\"m\\\"x\",version=\"1\",reason=\"REJECTED\"} 1",
            "nv_inference_count{model=\"m\\\"x\",version=\"1\"} 7",
            "nv_inference_exec_count{model=\"m\\\"x\",version=\"1\"} 2",
            "nv_inference_queue_duration_us{model=\"m\\\"x\",version=\"1\"} 40",
            "# TYPE nv_inference_pending_request_count gauge",
            "nv_inference_pending_request_count{model=\"m\\\"x\",version=\"1\"} 5",
        ] {
            assert!(out.lines().any(|l| l == line), "{line} missing in\n{out}");
        }
        assert!(out.contains("nv_cpu_memory_total_bytes "), "{out}");
    }
}
