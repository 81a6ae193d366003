//! The model repository: scans the folder, loads each model into sessions
//! and publishes it in the [`Registry`]. All registry writes go through
//! here (hot reload will make this a single actor task that owns them).

pub mod registry;
pub mod scan;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use registry::{ModelEntry, Registry};
use scan::ModelDir;

use crate::batcher::{error_chain, Batcher};
use crate::metrics;
use crate::model::settings::ModelDefaults;
use crate::model::state::ModelState;
use crate::model::warmup;
use crate::model::ModelHandle;
use crate::pool::{ModelWorkers, Pool};
use crate::runtime::Runtime;

/// Owns the repository folder and every registry write.
pub struct Repository {
    root: PathBuf,
    defaults: ModelDefaults,
    runtime: Arc<dyn Runtime>,
    pool: Arc<Pool>,
    registry: Arc<Registry>,
}

impl Repository {
    pub fn new(
        root: PathBuf,
        defaults: ModelDefaults,
        runtime: Arc<dyn Runtime>,
        pool: Arc<Pool>,
    ) -> Repository {
        Repository {
            root,
            defaults,
            runtime,
            pool,
            registry: Arc::new(Registry::new()),
        }
    }

    /// The registry handlers read.
    pub fn registry(&self) -> Arc<Registry> {
        self.registry.clone()
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Scans the repository and loads every model folder. A folder that fails
    /// (bad settings, bad ONNX file, unusable provider) is marked
    /// `UNAVAILABLE` with the reason; the others load.
    pub async fn load_all(&self) -> Result<(), String> {
        let dirs = scan::scan(&self.root, &self.defaults)?;
        let mut seen: HashMap<String, PathBuf> = HashMap::new();
        for md in dirs {
            if let Some(other) = seen.get(md.name()) {
                tracing::error!(
                    model = %md.name(), folder = %md.dir.display(), other = %other.display(),
                    "two folders declare the same model name; this one is skipped"
                );
                continue;
            }
            seen.insert(md.name().to_string(), md.dir.clone());
            self.load(md).await;
        }
        let ready = self
            .registry
            .list()
            .iter()
            .filter(|e| e.state == ModelState::Ready)
            .count();
        tracing::info!(ready, total = seen.len(), repository = %self.root.display(), "model repository loaded");
        Ok(())
    }

    /// Loads one model folder and publishes the result: `READY`, or
    /// `UNAVAILABLE` with the reason (also logged and counted).
    async fn load(&self, md: ModelDir) {
        let name = md.name().to_string();
        let version = md.settings.as_ref().ok().and_then(|s| s.version.clone());
        if md.settings.is_ok() {
            self.publish(&name, &md.dir, version.clone(), ModelState::Loading, None);
        }
        match self.build(&name, &md).await {
            Ok(handle) => {
                metrics::model_reload(&name, "loaded");
                self.publish(&name, &md.dir, version, ModelState::Ready, Some(Arc::new(handle)));
            }
            Err(reason) => {
                tracing::error!(model = %name, folder = %md.dir.display(), error = %reason, "model not loaded");
                metrics::model_reload(&name, "failed");
                self.publish(&name, &md.dir, version, ModelState::Unavailable { reason }, None);
            }
        }
    }

    /// Settings → sessions → warm-up → batcher → handle.
    async fn build(&self, name: &str, md: &ModelDir) -> Result<ModelHandle, String> {
        let mut settings = md.settings.clone()?;
        let path = md.dir.join(&settings.uri);
        let runtime = self.runtime.clone();
        let (n, p, s) = (name.to_string(), path.clone(), settings.clone());
        let loaded = tokio::task::spawn_blocking(move || runtime.load(&n, &p, &s))
            .await
            .map_err(|e| format!("loading panicked: {e}"))?
            .map_err(|e| error_chain(&e))?;
        if settings.batching.batching_enabled() && !loaded.signature.batchable() {
            tracing::warn!(
                model = %name,
                "the ONNX file fixes the first dimension of an input or output; serving with batching off"
            );
            settings.batching.max_batch_size = 1;
        }
        let devices: Vec<String> = loaded.sessions.iter().map(|(d, _)| d.to_string()).collect();
        let outputs: Vec<String> = loaded.signature.outputs.iter().map(|o| o.name.clone()).collect();
        let warm = match settings.warmup {
            true => warmup::batches(&loaded.signature, settings.batching.max_batch_size),
            false => Vec::new(),
        };
        let started = std::time::Instant::now();
        let (workers, warmed) = ModelWorkers::spawn(name, loaded.sessions, &self.pool, warm, outputs.clone());
        for w in warmed {
            w.await
                .map_err(|_| "a session thread died during warm-up".to_string())??;
        }
        let batcher = Batcher::spawn(name, settings.batching, Arc::new(workers), outputs);
        tracing::info!(
            model = %name,
            version = settings.version.as_deref().unwrap_or("-"),
            devices = %devices.join(","),
            provider = %loaded.provider_reason,
            inputs = %describe(&loaded.signature.inputs),
            outputs = %describe(&loaded.signature.outputs),
            max_batch_size = settings.batching.max_batch_size,
            policy = ?settings.batching.policy,
            warmup = ?started.elapsed(),
            "model ready"
        );
        Ok(ModelHandle::new(
            name.to_string(),
            settings,
            loaded.signature,
            loaded.provider_reason,
            batcher,
        ))
    }

    fn publish(
        &self,
        name: &str,
        dir: &Path,
        version: Option<String>,
        state: ModelState,
        handle: Option<Arc<ModelHandle>>,
    ) {
        metrics::model_ready(name, state == ModelState::Ready);
        self.registry.set(ModelEntry {
            name: name.to_string(),
            dir: dir.to_path_buf(),
            version,
            state,
            handle,
        });
    }
}

/// `name: DTYPE[dims]` for each tensor, for logs.
pub fn describe(specs: &[crate::tensor::TensorSpec]) -> String {
    specs
        .iter()
        .map(|t| format!("{}: {}{:?}", t.name, t.dtype, t.shape))
        .collect::<Vec<_>>()
        .join(", ")
}
