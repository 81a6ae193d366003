//! Residency against the fake runtime: models load on demand, the least
//! recently active idle one is evicted when a load needs its room, busy and
//! pinned models stay, concurrent first requests share one load, a model
//! that cannot fit is refused and evicts nothing, and a change to a model
//! that is not resident applies at its next load; a pipeline's steps stay
//! while it runs, run at once when independent, within its deadline. Each fake model reports
//! 4 GB of weights (its charge), so that the process's own memory noise
//! is small beside the budget.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::FakeRuntime;
use crate::config::{Residency, ResidencyMode};
use crate::error::{Error, ErrorKind};
use crate::model::state::ModelState;
use crate::pool::{Pool, PoolLimits};
use crate::repository::{Repository, RepositoryHandle};
use crate::settings::ModelDefaults;

const GB: u64 = 1_000_000_000;

struct Fixture {
    dir: tempfile::TempDir,
    runtime: Arc<FakeRuntime>,
    repo: RepositoryHandle,
}

/// A repository of `models` (name, fake file) under `residency`.
async fn start(models: &[(&str, &str)], residency: Residency) -> Fixture {
    start_with(models, &[], residency).await
}

/// [`start`], with the `model-settings.json` of some models (name, JSON).
async fn start_with(models: &[(&str, &str)], settings: &[(&str, &str)], residency: Residency) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    for (name, file) in models {
        std::fs::create_dir(dir.path().join(name)).unwrap();
        std::fs::write(dir.path().join(name).join("model.onnx"), file).unwrap();
    }
    for (name, json) in settings {
        std::fs::write(dir.path().join(name).join("model-settings.json"), json).unwrap();
    }
    let runtime = Arc::new(FakeRuntime::default());
    let repository = Repository::new(
        dir.path().to_path_buf(),
        None,
        ModelDefaults::default(),
        runtime.clone(),
        Pool::new(PoolLimits { cpu: 4, gpu: 1 }),
    )
    .with_residency(residency);
    let (_rescan_tx, rescan_rx) = mpsc::unbounded_channel();
    let (repo, loaded) = repository.spawn(rescan_rx);
    loaded.await.unwrap().unwrap();
    Fixture { dir, runtime, repo }
}

/// Models `a`, `b`, `c` (y = 2x, 3x, 4x) of 4 GB each under a 10 GB
/// budget in `mode`: two fit.
async fn two_of_three(mode: ResidencyMode) -> Fixture {
    let file = |k: u32| format!("k={k} bytes={}", 4 * GB);
    let (a, b, c) = (file(2), file(3), file(4));
    start(&[("a", &a), ("b", &b), ("c", &c)], budget(mode, 10)).await
}

fn budget(mode: ResidencyMode, host_gb: u64) -> Residency {
    Residency {
        mode,
        host_bytes: Some(host_gb * GB),
        min_idle: Duration::ZERO,
        ..Residency::default()
    }
}

impl Fixture {
    fn loads(&self) -> usize {
        self.runtime.loads.load(Ordering::SeqCst)
    }

    fn state(&self, name: &str) -> ModelState {
        self.repo.registry().get(name).expect("known model").state
    }

    /// `y[0]` for `x = [1, 1]` from model `name`, loading it if need be.
    async fn ask(&self, name: &str) -> Result<f32, Error> {
        let model = self.repo.registry().serve(name, None, Instant::now()).await?;
        super::y_of_ones(&model).await
    }

    fn resident(&self) -> Vec<String> {
        let list = self.repo.registry().list();
        list.into_iter()
            .filter(|e| e.state == ModelState::Ready)
            .map(|e| e.name)
            .collect()
    }
}

#[tokio::test]
async fn on_demand_loads_and_evicts_the_least_recently_used() {
    let f = two_of_three(ResidencyMode::OnDemand).await;
    assert_eq!(f.loads(), 0, "nothing loads at start");
    assert_eq!(f.state("a"), ModelState::OnDisk);
    assert!(
        f.repo.registry().servable("a", None).is_ok(),
        "its model readiness says it serves"
    );

    // Table: the model asked for → its answer, loads so far, resident after.
    let rows: [(&str, f32, usize, &[&str]); 5] = [
        ("a", 2.0, 1, &["a"]),
        ("b", 3.0, 2, &["a", "b"]),
        ("a", 2.0, 2, &["a", "b"]),
        // `b` was used less recently than `a`.
        ("c", 4.0, 3, &["a", "c"]),
        ("b", 3.0, 4, &["b", "c"]),
    ];
    for (name, y, loads, resident) in rows {
        assert_eq!(f.ask(name).await.unwrap(), y, "{name}");
        assert_eq!(f.loads(), loads, "loads after asking {name}");
        assert_eq!(f.resident(), resident, "resident after asking {name}");
    }
    assert_eq!(f.state("a"), ModelState::OnDisk);
}

#[tokio::test]
async fn a_busy_model_is_not_evicted() {
    let slow = format!("k=2 bytes={} run_ms=400", 4 * GB);
    let quick = |k: u32| format!("k={k} bytes={}", 4 * GB);
    let (b, c) = (quick(3), quick(4));
    let f = Arc::new(
        start(
            &[("a", &slow), ("b", &b), ("c", &c)],
            budget(ResidencyMode::OnDemand, 10),
        )
        .await,
    );
    // `a` is the least recently used (its request began first) but busy
    // for 400 ms when `c` needs room: `b` goes.
    let busy = {
        let f = f.clone();
        tokio::spawn(async move { f.ask("a").await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    f.ask("b").await.unwrap();
    assert_eq!(f.resident(), ["a", "b"]);
    assert_eq!(f.ask("c").await.unwrap(), 4.0);
    assert_eq!(
        f.resident(),
        ["a", "c"],
        "`b` went although `a` was used less recently"
    );
    assert_eq!(busy.await.unwrap().unwrap(), 2.0);
}

#[tokio::test]
async fn concurrent_first_requests_share_one_load() {
    let file = format!("k=2 bytes={} load_ms=200", GB);
    let f = Arc::new(start(&[("a", &file)], budget(ResidencyMode::OnDemand, 10)).await);
    let asks: Vec<_> = (0..8)
        .map(|_| {
            let f = f.clone();
            tokio::spawn(async move { f.ask("a").await })
        })
        .collect();
    for a in asks {
        assert_eq!(a.await.unwrap().unwrap(), 2.0);
    }
    assert_eq!(f.loads(), 1);
}

#[tokio::test]
async fn a_model_that_cannot_fit_is_refused_and_evicts_nothing() {
    let (small, pinned, big) = (
        format!("k=2 bytes={}", 4 * GB),
        format!("k=3 bytes={}", 4 * GB),
        format!("k=4 bytes={}", 7 * GB),
    );
    let f = start(
        &[("a", &small), ("p", &pinned), ("big", &big)],
        budget(ResidencyMode::OnDemand, 10),
    )
    .await;
    std::fs::write(f.dir.path().join("p/model-settings.json"), r#"{"pinned": true}"#).unwrap();
    f.repo.rescan();
    let t0 = Instant::now();
    while f.state("p") != ModelState::Ready {
        assert!(t0.elapsed() < Duration::from_secs(10), "pinned `p` loads");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    f.ask("a").await.unwrap();
    // Its file says nothing of its size: its first load, guessed at what
    // the others hold, evicts `a`, measures it and sends it back to disk.
    // Once its size is known, it is refused without a load and evicts
    // nothing; beside the pinned `p` it can never fit: no "retry later".
    let refused = f.ask("big").await.unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::ModelNotReady, "{refused}");
    assert_eq!((f.loads(), f.resident()), (3, vec!["p".to_string()]));
    f.ask("a").await.unwrap();
    for loads in [4, 4] {
        let err = f.ask("big").await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ModelNotReady, "{err}");
        let msg = err.to_string();
        assert!(
            msg.contains("`big` needs about 7000000000 bytes on cpu")
                && msg.contains(
                    "more than residency.host_bytes (10000000000) less what pinned models hold (4000000000)"
                )
                && !msg.contains("retry later"),
            "{msg}"
        );
        assert_eq!(f.loads(), loads);
        assert_eq!(
            f.resident(),
            ["a", "p"],
            "nothing was evicted for a load that could not fit"
        );
        assert_eq!(f.state("big"), ModelState::OnDisk, "it stays loadable");
    }
}

#[tokio::test]
async fn a_change_to_a_model_on_disk_applies_at_its_next_load() {
    let f = start(
        &[("a", &format!("k=2 bytes={GB}"))],
        budget(ResidencyMode::OnDemand, 10),
    )
    .await;
    std::fs::write(f.dir.path().join("a/model.onnx"), format!("k=5 bytes={GB}")).unwrap();
    f.repo.rescan();
    // A rescan is a command like a request's load: once a request is
    // answered after it, the rescan has run.
    assert_eq!(f.ask("a").await.unwrap(), 5.0);
    assert_eq!(f.loads(), 1, "the change did not load it by itself");
}

#[tokio::test]
async fn eager_loads_while_the_budget_holds_and_the_rest_on_demand() {
    let f = two_of_three(ResidencyMode::Eager).await;
    // `c` is guessed at what `a` and `b` hold: it does not fit beside them.
    assert_eq!(f.loads(), 2);
    assert_eq!(f.resident(), ["a", "b"]);
    assert_eq!(f.state("c"), ModelState::OnDisk);
    assert_eq!(f.ask("c").await.unwrap(), 4.0);
    assert_eq!(f.resident(), ["b", "c"]);
    assert_eq!(f.loads(), 3);
}

#[tokio::test]
async fn the_api_loads_a_model_on_disk_and_an_unloaded_one_stays_unloaded() {
    let f = two_of_three(ResidencyMode::OnDemand).await;
    f.ask("a").await.unwrap();
    f.ask("b").await.unwrap();
    // An API load makes room as a request's load does.
    f.repo.load("c", None).await.unwrap();
    assert_eq!(f.resident(), ["b", "c"]);
    // An API unload is not undone by a request.
    f.repo.unload("b").await.unwrap();
    let err = f.ask("b").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ModelNotReady, "{err}");
    assert!(
        err.to_string().contains("unloaded through the repository API"),
        "{err}"
    );
    assert_eq!(f.loads(), 3);
    // Until the API loads it again.
    f.repo.load("b", None).await.unwrap();
    assert_eq!(f.ask("b").await.unwrap(), 3.0);
}

#[tokio::test]
async fn a_removed_folder_is_forgotten_and_a_new_one_rests_until_asked() {
    let f = start(
        &[("a", &format!("k=2 bytes={GB}"))],
        budget(ResidencyMode::OnDemand, 10),
    )
    .await;
    std::fs::remove_dir_all(f.dir.path().join("a")).unwrap();
    std::fs::create_dir(f.dir.path().join("n")).unwrap();
    std::fs::write(f.dir.path().join("n/model.onnx"), format!("k=7 bytes={GB}")).unwrap();
    f.repo.rescan();
    let t0 = Instant::now();
    while f.repo.registry().get("n").is_none() {
        assert!(t0.elapsed() < Duration::from_secs(10), "`n` joins");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(f.state("n"), ModelState::OnDisk);
    assert_eq!(f.ask("n").await.unwrap(), 7.0);
    assert!(f.repo.registry().get("a").is_none(), "`a` is forgotten");
    assert_eq!(f.loads(), 1);
}

#[tokio::test]
async fn pinned_models_are_loaded_when_the_start_up_scan_ends() {
    let (a, p) = (format!("k=2 bytes={GB}"), format!("k=3 bytes={GB}"));
    let pinned = [("p", r#"{"pinned": true}"#)];
    // Server readiness waits for the start-up scan, which `start_with` awaits.
    let f = start_with(
        &[("a", &a), ("p", &p)],
        &pinned,
        budget(ResidencyMode::OnDemand, 10),
    )
    .await;
    let repo = &f.repo;
    let state = |n: &str| repo.registry().get(n).unwrap().state;
    assert_eq!((state("p"), state("a")), (ModelState::Ready, ModelState::OnDisk));
    assert!(
        repo.registry().meets(&crate::repository::ReadyRule::Strict),
        "a model on disk is not a failure"
    );
}

#[tokio::test]
async fn models_that_no_wait_can_fit_are_errors_not_retry_later() {
    let (p, q, huge) = (
        format!("k=2 bytes={}", 6 * GB),
        format!("k=3 bytes={}", 6 * GB),
        format!("k=4 bytes={}", 12 * GB),
    );
    let pinned = [("p", r#"{"pinned": true}"#), ("q", r#"{"pinned": true}"#)];
    let f = start_with(
        &[("p", &p), ("q", &q), ("huge", &huge)],
        &pinned,
        budget(ResidencyMode::OnDemand, 10),
    )
    .await;
    // Two pinned models of 6 GB under 10 GB: one loads; the other is an
    // error naming it, and the server is not ready.
    let states = [f.state("p"), f.state("q")];
    let failed: Vec<&ModelState> = states.iter().filter(|s| **s != ModelState::Ready).collect();
    assert_eq!(failed.len(), 1, "{states:?}");
    let reason = failed[0].reason().unwrap();
    assert!(
        reason.contains("pinned model") && reason.contains("cannot be loaded; raise residency.host_bytes"),
        "{reason}"
    );
    assert!(!f.repo.registry().meets(&crate::repository::ReadyRule::Loaded));
    // A model larger than the whole budget, once its size is known: an
    // error that says so, never "retry later".
    let _ = f.ask("huge").await;
    let err = f.ask("huge").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ModelNotReady, "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("less what pinned models hold") && !msg.contains("retry later"),
        "{msg}"
    );
}

#[tokio::test]
async fn a_pipelines_later_step_is_not_evicted_while_an_earlier_one_runs() {
    let (slow, a, b, c) = (
        format!("k=5 bytes={GB} run_ms=400"),
        format!("k=2 bytes={}", 4 * GB),
        format!("k=3 bytes={}", 4 * GB),
        format!("k=4 bytes={}", 4 * GB),
    );
    let f = Arc::new(
        start(
            &[("s", &slow), ("a", &a), ("b", &b), ("c", &c)],
            budget(ResidencyMode::OnDemand, 10),
        )
        .await,
    );
    // `pp` runs `s`, then `a`; its tensors are declared (its steps are not
    // loaded when it loads).
    std::fs::create_dir(f.dir.path().join("pp")).unwrap();
    std::fs::write(
        f.dir.path().join("pp/model-settings.json"),
        r#"{"inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 2]}],
            "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 2]}],
            "pipeline": {"steps": [
              {"model": "s", "inputs": {"x": "x"}, "outputs": {"y": "t"}},
              {"model": "a", "inputs": {"x": "t"}, "outputs": {"y": "y"}}], "outputs": ["y"]}}"#,
    )
    .unwrap();
    f.repo.rescan();
    f.ask("a").await.unwrap();
    let piped = {
        let f = f.clone();
        tokio::spawn(async move { f.ask("pp").await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    f.ask("b").await.unwrap();
    // While `s` runs, `a` is the least recently used idle model (even
    // counted from the pipeline's start): the pipeline in flight holds it,
    // so `b` makes room for `c`.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(f.ask("c").await.unwrap(), 4.0);
    let resident = f.resident();
    assert!(
        resident.contains(&"a".to_string()) && !resident.contains(&"b".to_string()),
        "{resident:?}"
    );
    assert_eq!(piped.await.unwrap().unwrap(), 10.0, "5x, then 2x");
}

/// Adds the pipeline `name` (its `model-settings.json` text) to `f`'s
/// repository and waits until it serves.
async fn add_pipeline(f: &Fixture, name: &str, settings: &str) -> std::sync::Arc<crate::model::ModelHandle> {
    std::fs::create_dir(f.dir.path().join(name)).unwrap();
    std::fs::write(f.dir.path().join(name).join("model-settings.json"), settings).unwrap();
    f.repo.rescan();
    let t0 = Instant::now();
    loop {
        if let Ok(h) = f.repo.registry().ready(name, None) {
            return h;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "the pipeline loads");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A request of one row `x = [1, 1]` with its own `timeout`.
fn x_request(timeout: Option<Duration>) -> crate::protocol::InferRequest {
    use crate::tensor::{Tensor, TensorData};
    crate::protocol::InferRequest {
        id: None,
        inputs: vec![Tensor::new("x", vec![1, 2], TensorData::F32(vec![1.0, 1.0])).unwrap()],
        outputs: None,
        schedule: crate::protocol::Schedule {
            timeout,
            priority: None,
        },
        classify: Vec::new(),
        sequence: None,
    }
}

#[tokio::test]
async fn a_pipelines_independent_steps_run_at_once_and_its_deadline_holds() {
    use crate::tensor::TensorData;
    let slow = |k: u32| format!("k={k} bytes={GB} run_ms=400");
    let (a, b) = (slow(2), slow(3));
    let f = start(&[("a", &a), ("b", &b)], budget(ResidencyMode::Eager, 10)).await;
    // `pp` runs `a` and `b` on the same input: neither waits on the other.
    let pp = add_pipeline(
        &f,
        "pp",
        r#"{"pipeline": {"steps": [
              {"model": "a", "inputs": {"x": "x"}, "outputs": {"y": "ya"}},
              {"model": "b", "inputs": {"x": "x"}, "outputs": {"y": "yb"}}], "outputs": ["ya", "yb"]}}"#,
    )
    .await;
    let request = x_request;
    let run = {
        let (pp, req) = (pp.clone(), request(None));
        tokio::spawn(async move { pp.infer(req, Instant::now()).await })
    };
    tokio::time::sleep(Duration::from_millis(150)).await;
    let busy = |m: &str| f.repo.registry().ready(m, None).unwrap().activity().busy();
    assert!(busy("a") && busy("b"), "both steps run at once");
    let answer = run.await.unwrap().unwrap();
    let firsts: Vec<f32> = answer
        .outputs
        .iter()
        .map(|t| match &t.data {
            TensorData::F32(v) => v[0],
            other => panic!("{}", other.dtype()),
        })
        .collect();
    assert_eq!(firsts, [2.0, 3.0], "ya = 2x, yb = 3x");
    // The request's own deadline carries into its steps: 100 ms for 400 ms runs.
    let late = pp
        .infer(request(Some(Duration::from_millis(100))), Instant::now())
        .await;
    assert_eq!(late.unwrap_err().kind(), ErrorKind::DeadlineExceeded);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipelines_deadline_counts_from_arrival_across_its_steps() {
    use crate::tensor::TensorData;
    let slow = |k: u32| format!("k={k} bytes={GB} run_ms=88");
    let (a, b) = (slow(2), slow(3));
    let f = start(&[("a", &a), ("b", &b)], budget(ResidencyMode::Eager, 10)).await;
    let chain = add_pipeline(
        &f,
        "chain",
        r#"{"pipeline": {"steps": [
              {"model": "a", "inputs": {"x": "x"}, "outputs": {"y": "ya"}},
              {"model": "b", "inputs": {"x": "ya"}, "outputs": {"y": "yb"}}], "outputs": ["yb"]}}"#,
    )
    .await;
    let request = x_request;
    // Whole: 6x after two steps of 88 ms.
    let answer = chain.infer(request(None), Instant::now()).await.unwrap();
    match &answer.outputs[0].data {
        TensorData::F32(v) => assert_eq!(v[0], 6.0),
        other => panic!("{}", other.dtype()),
    }
    // 44 ms from arrival: refused once they have passed, naming the
    // request's own timeout, not what was left of it at a step.
    let arrival = Instant::now();
    let late = chain
        .infer(request(Some(Duration::from_millis(44))), arrival)
        .await
        .unwrap_err();
    let waited = arrival.elapsed();
    assert_eq!(late.kind(), ErrorKind::DeadlineExceeded, "{late}");
    assert!(late.to_string().contains("44ms"), "{late}");
    assert!(waited < Duration::from_millis(88), "answered after {waited:?}");
}

#[tokio::test]
async fn the_load_api_names_the_budget_a_model_can_never_fit_in() {
    // 3 GB against a 2 GB host budget: never loadable.
    let big = format!("k=2 bytes={}", 3 * GB);
    let f = start(&[("big", &big)], budget(ResidencyMode::OnDemand, 2)).await;
    let e = f.repo.load("big", None).await.unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("it cannot be loaded; raise residency.host_bytes"),
        "{text}"
    );
    assert!(!text.contains("its next request loads it"), "{text}");
}
