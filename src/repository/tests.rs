//! The repository task's reload state machine against a fake [`Runtime`]
//! (no ONNX Runtime): real folders on disk, the real task, registry,
//! batchers and pool. A fake "ONNX file" is a line of text: `k=3` is a model
//! that answers `y = 3x`; `fail` does not load; `panic` panics inside the
//! runtime. Each row of the table is one change to a serving model and what
//! must follow: which multiplier serves, how many loads ran, the state, and
//! whether the index notes a refused change. After `k=3`, a file may say
//! `bytes=N` (the model reports N bytes of weights: its residency charge),
//! `load_ms=N` (its load takes N ms) and `run_ms=N` (each batch N ms).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::{Repository, RepositoryHandle};
use crate::error::ErrorKind;
use crate::model::state::ModelState;
use crate::pool::{Pool, PoolLimits};
use crate::protocol::InferRequest;
use crate::runtime::{Device, LoadedModel, Runtime, RuntimeError, Session};
use crate::settings::{ModelDefaults, ModelSettings};
use crate::tensor::{DataType, Signature, Tensor, TensorData, TensorSpec};

/// Answers `y = k x` for the `k` its file names; counts its loads.
#[derive(Default)]
struct FakeRuntime {
    loads: AtomicUsize,
}

struct Times(f32, Duration);

impl Session for Times {
    fn run(&mut self, inputs: &[Tensor], _outputs: &[String]) -> Result<Vec<Tensor>, RuntimeError> {
        std::thread::sleep(self.1);
        let TensorData::F32(x) = &inputs[0].data else {
            return Err(RuntimeError::InvalidInput("FP32 only".into()));
        };
        let y = TensorData::F32(x.iter().map(|v| v * self.0).collect());
        Ok(vec![
            Tensor::new("y", inputs[0].shape.clone(), y).expect("same shape")
        ])
    }
}

impl Runtime for FakeRuntime {
    fn load(&self, _model: &str, path: &Path, settings: &ModelSettings) -> Result<LoadedModel, RuntimeError> {
        let text = std::fs::read_to_string(path).map_err(|e| RuntimeError::Load {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        let mut words = text.split_whitespace();
        let k: f32 = match words.next().unwrap_or_default() {
            "panic" => panic!("the fake runtime was asked to panic"),
            t => t
                .strip_prefix("k=")
                .and_then(|k| k.parse().ok())
                .ok_or_else(|| RuntimeError::Load {
                    path: path.display().to_string(),
                    message: format!("not a fake model: {t:?}"),
                })?,
        };
        let option = |key: &str| {
            text.split_whitespace()
                .find_map(|w| w.strip_prefix(key)?.strip_prefix('=')?.parse::<u64>().ok())
                .unwrap_or(0)
        };
        std::thread::sleep(Duration::from_millis(option("load_ms")));
        let run = Duration::from_millis(option("run_ms"));
        self.loads.fetch_add(1, Ordering::SeqCst);
        let spec = |name: &str| TensorSpec {
            name: name.into(),
            dtype: DataType::F32,
            shape: vec![-1, 2],
            dim_names: vec![],
        };
        let sessions = (0..settings.instances)
            .map(|_| (Device::Cpu, Box::new(Times(k, run)) as Box<dyn Session>))
            .collect();
        Ok(LoadedModel {
            signature: Signature {
                inputs: vec![spec("x")],
                outputs: vec![spec("y")],
            },
            sessions,
            provider_reason: "cpu (fake)".into(),
            weights_bytes: option("bytes"),
        })
    }
}

/// `y[0]` of a fake model for `x = [1, 1]`: its multiplier.
async fn y_of_ones(model: &crate::model::ModelHandle) -> Result<f32, crate::error::Error> {
    let x = Tensor::new("x", vec![1, 2], TensorData::F32(vec![1.0, 1.0])).unwrap();
    let req = InferRequest {
        schedule: Default::default(),
        classify: Vec::new(),
        sequence: None,
        id: None,
        inputs: vec![x],
        outputs: None,
    };
    let resp = model.infer(req, Instant::now()).await?;
    match &resp.outputs[0].data {
        TensorData::F32(y) => Ok(y[0]),
        other => panic!("the fake runtime answers FP32, not {}", other.dtype()),
    }
}

struct Fixture {
    dir: tempfile::TempDir,
    runtime: Arc<FakeRuntime>,
    repo: RepositoryHandle,
}

impl Fixture {
    /// A repository with model `m` (`k=2`, `max_batch_size` 4), loaded.
    async fn start() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let f = |p: &str| dir.path().join(p);
        std::fs::create_dir(f("m")).unwrap();
        std::fs::write(f("m/model.onnx"), "k=2").unwrap();
        std::fs::write(f("m/model-settings.json"), r#"{"max_batch_size": 4}"#).unwrap();
        let runtime = Arc::new(FakeRuntime::default());
        let pool = Pool::new(PoolLimits { cpu: 1, gpu: 1 });
        let repository = Repository::new(
            dir.path().to_path_buf(),
            None,
            ModelDefaults::default(),
            runtime.clone(),
            pool,
        );
        // The watcher's end: tests ask for rescans through the handle.
        let (_rescan_tx, rescan_rx) = mpsc::unbounded_channel();
        let (repo, loaded) = repository.spawn(rescan_rx);
        loaded.await.unwrap().unwrap();
        Fixture { dir, runtime, repo }
    }

    fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }

    fn loads(&self) -> usize {
        self.runtime.loads.load(Ordering::SeqCst)
    }

    /// `y` for `x = [1, 1]` from model `m` now (None: not serving).
    async fn multiplier(&self) -> Option<f32> {
        let model = self.repo.registry().ready("m", None).ok()?;
        y_of_ones(&model).await.ok()
    }

    /// Rescans, then waits (up to 10 s) until `done` holds.
    async fn rescan_until(&self, what: &str, done: impl Fn(&Fixture) -> bool) {
        self.repo.rescan();
        let t0 = Instant::now();
        while !done(self) {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "timed out waiting until {what}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Rescans, then waits (up to 10 s) until `m` answers with multiplier `k`.
    async fn rescan_until_serving(&self, k: f32) {
        self.repo.rescan();
        let t0 = Instant::now();
        while self.multiplier().await != Some(k) {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "timed out waiting for y = {k}x"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    fn entry(&self) -> Option<crate::repository::ModelEntry> {
        self.repo.registry().get("m")
    }
}

#[tokio::test]
async fn add_change_in_place_swap_rollback_recover_and_remove() {
    let f = Fixture::start().await;
    assert_eq!((f.multiplier().await, f.loads()), (Some(2.0), 1), "added");

    // A batching-only edit applies in place: no new load.
    std::fs::write(f.path("m/model-settings.json"), r#"{"max_batch_size": 8}"#).unwrap();
    f.rescan_until("max_batch_size is 8", |f| {
        f.entry()
            .and_then(|e| e.handle)
            .is_some_and(|h| h.settings.batching.max_batch_size == 8)
    })
    .await;
    assert_eq!(
        (f.multiplier().await, f.loads()),
        (Some(2.0), 1),
        "changed in place"
    );

    // A new file: the new version is loaded beside the old one and swapped in.
    std::fs::write(f.path("m/model.onnx"), "k=3").unwrap();
    f.rescan_until_serving(3.0).await;
    assert_eq!(f.loads(), 2, "swapped");

    // A file that does not load: the last good version keeps serving, noted.
    std::fs::write(f.path("m/model.onnx"), "fail").unwrap();
    f.rescan_until("the refused change is noted", |f| {
        f.entry().is_some_and(|e| e.note.is_some())
    })
    .await;
    let e = f.entry().unwrap();
    assert_eq!(e.state, ModelState::Ready);
    assert!(
        e.note.as_deref().unwrap().contains("not a fake model"),
        "{:?}",
        e.note
    );
    assert_eq!((f.multiplier().await, f.loads()), (Some(3.0), 2), "rolled back");

    // A good file again: it recovers and the note is gone.
    std::fs::write(f.path("m/model.onnx"), "k=5").unwrap();
    f.rescan_until_serving(5.0).await;
    assert!(f.entry().unwrap().note.is_none());
    assert_eq!(f.loads(), 3, "recovered");

    // The folder goes: the model is removed.
    std::fs::remove_dir_all(f.path("m")).unwrap();
    f.rescan_until("m is removed", |f| f.entry().is_none()).await;
    assert_eq!(f.multiplier().await, None);
}

#[tokio::test]
async fn unreadable_settings_keep_the_last_good_version_serving() {
    let f = Fixture::start().await;
    let settings = f.path("m/model-settings.json");
    std::fs::remove_file(&settings).unwrap();
    // A symlink to itself: reading it fails with ELOOP (EACCES cannot be provoked as root).
    std::os::unix::fs::symlink(&settings, &settings).unwrap();
    f.rescan_until("the unreadable settings are noted", |f| {
        f.entry().is_some_and(|e| e.note.is_some())
    })
    .await;
    assert_eq!(f.entry().unwrap().state, ModelState::Ready);
    assert_eq!((f.multiplier().await, f.loads()), (Some(2.0), 1));
}

#[tokio::test]
async fn api_load_answers_each_refusal_with_its_kind_and_the_last_good_version_serves() {
    let f = Fixture::start().await;
    let cases = [
        ("fail", ErrorKind::InvalidInput, "not a fake model"),
        ("panic", ErrorKind::Internal, "panicked"),
    ];
    for (file, kind, needle) in cases {
        std::fs::write(f.path("m/model.onnx"), file).unwrap();
        let err = f.repo.load("m", None).await.unwrap_err();
        assert_eq!(err.kind(), kind, "{file}: {err}");
        assert!(err.to_string().contains(needle), "{file}: {err}");
        // Files are named relative to the repository.
        assert!(
            !err.to_string().contains(&f.dir.path().display().to_string()),
            "{err}"
        );
        assert_eq!(
            f.multiplier().await,
            Some(2.0),
            "{file}: the last good version serves"
        );
    }
    std::fs::write(f.path("m/model-settings.json"), r#"{"max_batch_sise": 4}"#).unwrap();
    let err = f.repo.load("m", None).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
    assert!(err.to_string().contains("m/model-settings.json"), "{err}");
    // Fixed: the load succeeds and the task still takes commands.
    std::fs::write(f.path("m/model-settings.json"), "{}").unwrap();
    std::fs::write(f.path("m/model.onnx"), "k=7").unwrap();
    f.repo.load("m", None).await.unwrap();
    assert_eq!(f.multiplier().await, Some(7.0));
    f.repo.unload("m").await.unwrap();
    assert_eq!(f.multiplier().await, None);
}

#[tokio::test]
async fn a_panic_in_the_task_itself_is_caught_named_and_answered() {
    let r: Result<(), _> = super::supervised("testing", async { panic!("boom") }).await;
    let err = r.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Internal);
    assert!(err.to_string().contains("panicked while testing: boom"), "{err}");
    let r = super::supervised("testing", async { 7 }).await;
    assert_eq!(r.unwrap(), 7);
}

mod residency;
