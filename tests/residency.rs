//! More models than memory, end to end (README, "More models than
//! memory"): 200 model folders served on demand under a host budget that
//! holds about a tenth of them, Zipf traffic from several clients over V2
//! JSON, the binary extension, gRPC and V1 for a minute, with settings
//! edits, a folder added and one removed meanwhile
//! (`tests/clients/residency.py`). Every answer is k·x (arithmetic), the
//! only refusals are the documented 503s, the charged bytes never pass the
//! budget by more than one model in transition, and the process's memory is
//! flat once the working set is warm.
//!
//! Alone in its test binary: the server runs in this process, whose
//! resident memory is measured.

mod common;

use std::process::Command;

use common::*;
use serde_json::Value;

/// About a tenth of what the 200 models hold once loaded and warmed up
/// (365 MiB together on this machine, 0.3 to 5 MiB each).
const BUDGET: u64 = 40_000_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_models_under_a_tenth_of_their_memory() {
    let python = python();
    let driver = root().join("tests/clients/residency.py");
    let out = tempfile::tempdir().unwrap();
    let mut build = Command::new(&python);
    build
        .arg(&driver)
        .arg("build")
        .arg(out.path())
        .args(["--models", "200"]);
    assert!(run(build).await.status.success(), "building the models failed");

    let s = TestServer::start_with(&out.path().join("repo"), |c| {
        c.residency.mode = sluice::config::ResidencyMode::OnDemand;
        c.residency.host_bytes = Some(BUDGET);
    })
    .await;
    let index = s.index().await;
    assert_eq!(index.len(), 200);
    assert!(
        index.values().all(|e| e["state"] == "UNAVAILABLE"
            && e["reason"]
                .as_str()
                .unwrap()
                .contains("its next request loads it")),
        "on demand, nothing loads at start and the index says so: {:?}",
        index.values().next()
    );

    let mut drive = Command::new(&python);
    drive
        .arg(&driver)
        .arg("drive")
        .arg(out.path())
        .args(["--http", &s.addr.to_string(), "--grpc", &s.grpc_addr.to_string()])
        .args(["--pid", &std::process::id().to_string()])
        .args(["--seconds", "60", "--clients", "6", "--changes"]);
    let done = run(drive).await;
    let stdout = String::from_utf8_lossy(&done.stdout);
    let summary: Value =
        serde_json::from_str(stdout.lines().last().expect("a summary")).expect("JSON summary");
    let answers = &summary["answers"];
    assert!(
        done.status.success(),
        "wrong answers or undocumented errors: {answers}"
    );
    assert!(answers["ok"].as_u64().unwrap() > 1000, "{answers}");
    assert_eq!(answers.get("wrong"), None, "{summary}");

    let (budget, used, largest) = (
        summary["budget"].as_f64().unwrap(),
        summary["max_used"].as_f64().unwrap(),
        summary["largest_model"].as_f64().unwrap(),
    );
    assert_eq!(budget, BUDGET as f64);
    assert!(
        used <= budget + largest,
        "charged {used} bytes, over the budget {budget} by more than one model ({largest})"
    );
    assert!(
        summary["evictions"].as_f64().unwrap() > 0.0,
        "the working set did not fit: {summary}"
    );

    // Flat once warm: the last third of the run holds no more than the
    // middle third, within 10 % and 16 MiB.
    let rss: Vec<f64> = summary["rss_median_mib_by_third"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    assert!(
        rss[2] <= rss[1] * 1.1 + 16.0,
        "resident memory grew: {rss:?} MiB by third"
    );

    let events = summary["events"].as_array().unwrap();
    assert!(
        events.iter().any(|e| e == "added extra")
            && events.iter().any(|e| e.as_str().unwrap().starts_with("removed "))
            && !events
                .iter()
                .any(|e| e.as_str().unwrap().contains("still in the index")),
        "{events:?}"
    );
    s.stop().await.unwrap();
}
