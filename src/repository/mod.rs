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
use crate::model::settings::ModelDefaults;
use crate::model::state::ModelState;
use crate::model::ModelHandle;
use crate::pool::ModelWorkers;
use crate::runtime::Runtime;

/// Owns the repository folder and every registry write.
pub struct Repository {
    root: PathBuf,
    defaults: ModelDefaults,
    runtime: Arc<dyn Runtime>,
    registry: Arc<Registry>,
}

impl Repository {
    pub fn new(root: PathBuf, defaults: ModelDefaults, runtime: Arc<dyn Runtime>) -> Repository {
        Repository {
            root,
            defaults,
            runtime,
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

    /// Loads one model folder and publishes the result.
    async fn load(&self, md: ModelDir) {
        let name = md.name().to_string();
        let settings = match md.settings {
            Ok(s) => s,
            Err(reason) => {
                tracing::error!(model = %name, error = %reason, "model settings are invalid; model not loaded");
                self.publish(&name, &md.dir, None, ModelState::Unavailable { reason }, None);
                return;
            }
        };
        let version = settings.version.clone();
        self.publish(&name, &md.dir, version.clone(), ModelState::Loading, None);
        let path = md.dir.join(&settings.uri);
        let runtime = self.runtime.clone();
        let (n, p, s) = (name.clone(), path.clone(), settings.clone());
        let loaded = tokio::task::spawn_blocking(move || runtime.load(&n, &p, &s)).await;
        let loaded = match loaded {
            Ok(Ok(l)) => l,
            Ok(Err(e)) => {
                let reason = error_chain(&e);
                tracing::error!(model = %name, file = %path.display(), error = %reason, "model failed to load");
                self.publish(&name, &md.dir, version, ModelState::Unavailable { reason }, None);
                return;
            }
            Err(join) => {
                let reason = format!("loading panicked: {join}");
                tracing::error!(model = %name, file = %path.display(), error = %reason, "model failed to load");
                self.publish(&name, &md.dir, version, ModelState::Unavailable { reason }, None);
                return;
            }
        };
        let mut settings = settings;
        if settings.batching.batching_enabled() && !loaded.signature.batchable() {
            tracing::warn!(
                model = %name,
                "the ONNX file fixes the first dimension of an input or output; serving with batching off"
            );
            settings.batching.max_batch_size = 1;
        }
        let devices: Vec<String> = loaded.sessions.iter().map(|(d, _)| d.to_string()).collect();
        let workers = Arc::new(ModelWorkers::spawn(&name, loaded.sessions));
        let batcher = Batcher::new(&name, settings.batching.clone(), workers);
        tracing::info!(
            model = %name,
            version = version.as_deref().unwrap_or("-"),
            devices = %devices.join(","),
            provider = %loaded.provider_reason,
            inputs = %describe(&loaded.signature.inputs),
            outputs = %describe(&loaded.signature.outputs),
            max_batch_size = settings.batching.max_batch_size,
            "model ready"
        );
        let handle = ModelHandle::new(
            name.clone(),
            settings,
            loaded.signature,
            loaded.provider_reason,
            batcher,
        );
        self.publish(&name, &md.dir, version, ModelState::Ready, Some(Arc::new(handle)));
    }

    fn publish(
        &self,
        name: &str,
        dir: &Path,
        version: Option<String>,
        state: ModelState,
        handle: Option<Arc<ModelHandle>>,
    ) {
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
