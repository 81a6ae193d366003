//! Leak detector: a model loaded and unloaded through the repository API
//! many times must not grow the process. Alone in its test binary, so that
//! this process's RSS is this test's.

mod common;
use common::reload::*;
use common::*;
use serde_json::json;

/// Loads and unloads this many times (`SLUICE_RELOAD_CYCLES` overrides it,
/// for a longer look at the trend).
fn cycles() -> usize {
    std::env::var("SLUICE_RELOAD_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > BASELINE_AFTER)
        .unwrap_or(220)
}

/// RSS measured after this many cycles (arenas and caches warmed) and after the last.
const BASELINE_AFTER: usize = 20;
/// Allowed growth between the two measurements.
const MAX_GROWTH_KB: u64 = 50 * 1024;

/// A `kB` field of /proc/self/status (VmRSS, Threads).
fn status_field(name: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in /proc/self/status"))
}

/// Names of this process's threads that run a model's session (`sluice-s…`).
fn session_threads() -> Vec<String> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|name| name.trim().to_string())
        .filter(|name| name.starts_with("sluice-s"))
        .collect()
}

/// RSS (kB) once every session thread of the unloaded versions has exited,
/// so that the reading does not depend on how fast the last unload is torn
/// down (and a thread leak shows as a timeout).
async fn settled_rss() -> u64 {
    wait_for("the session threads of unloaded versions to exit", || async {
        session_threads().is_empty().then_some(())
    })
    .await;
    status_field("VmRSS")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loading_and_unloading_many_times_does_not_grow_the_process() {
    let repo = repo_with(&["digits"]);
    let s = TestServer::start(repo.path()).await;
    let (body, label) = digits_request(3);
    let (st, r) = s.post("/v2/repository/models/digits/unload", &json!({})).await;
    assert_eq!(st, 200, "{r}");
    let start_rss = settled_rss().await;

    let cycles = cycles();
    let mut baseline = 0;
    let mut samples = Vec::new();
    let started = std::time::Instant::now();
    for cycle in 1..=cycles {
        let (st, r) = s.post("/v2/repository/models/digits/load", &json!({})).await;
        assert_eq!(st, 200, "cycle {cycle}: {r}");
        let (st, r) = s.post("/v2/models/digits/infer", &body).await;
        assert_eq!(st, 200, "cycle {cycle}: {r}");
        assert_eq!(v2_output(&r, "label")["data"], json!([label]));
        if cycle == 1 {
            assert!(
                !session_threads().is_empty(),
                "no session thread while digits is loaded"
            );
        }
        let (st, r) = s.post("/v2/repository/models/digits/unload", &json!({})).await;
        assert_eq!(st, 200, "cycle {cycle}: {r}");
        if cycle == BASELINE_AFTER {
            baseline = settled_rss().await;
        }
        if cycle % (cycles / 10).max(1) == 0 {
            samples.push(status_field("VmRSS"));
        }
    }
    let last = settled_rss().await;
    let growth = last as i64 - baseline as i64;
    eprintln!(
        "reload memory: {cycles} load/unload cycles of digits in {:.1?}; VmRSS at start {start_rss} kB, \
         after {BASELINE_AFTER} cycles {baseline} kB, after {cycles} cycles {last} kB \
         (growth {growth} kB, {:.1} kB/cycle); threads {}; every {} cycles: {samples:?} kB",
        started.elapsed(),
        growth as f64 / (cycles - BASELINE_AFTER) as f64,
        status_field("Threads"),
        (cycles / 10).max(1),
    );
    assert!(
        growth < MAX_GROWTH_KB as i64,
        "RSS grew {growth} kB over {} cycles",
        cycles - BASELINE_AFTER
    );
    // Every cycle really built new sessions and dropped them.
    let text = s.metrics().await;
    let count = |result| {
        metric_value(
            &text,
            "sluice_model_reloads_total",
            &[("model", "digits"), ("result", result)],
        )
    };
    assert_eq!(
        (count("loaded"), count("unloaded")),
        ((cycles + 1) as f64, (cycles + 1) as f64)
    );
    s.stop().await.unwrap();
}
