//! The name → model map that request handlers read. Only the repository
//! (its loading code, and later its one writer task) writes it; handlers take
//! a cheap snapshot (`Arc<ModelHandle>`) and never hold the lock across an
//! `.await`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use crate::error::Error;
use crate::model::state::ModelState;
use crate::model::ModelHandle;

/// One model of the repository, ready or not.
#[derive(Clone)]
pub struct ModelEntry {
    pub name: String,
    /// The model's folder in the repository.
    pub dir: PathBuf,
    pub version: Option<String>,
    pub state: ModelState,
    /// Set when `state` is `Ready` (or `Unloading`: still draining).
    pub handle: Option<Arc<ModelHandle>>,
    /// Why the last change was refused while this version keeps serving.
    pub note: Option<String>,
}

/// What server readiness (`/v2/health/ready`, gRPC `ServerReady`) asks of
/// the models, once the start-up load is done and until shutdown begins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadyRule {
    /// Nothing more (Triton's default): a model that failed to load is
    /// reported in the index and the others serve.
    Loaded,
    /// This one model serves (single-model mode, `--model-name`): a pod
    /// whose one model cannot serve must not join its Service.
    Model(String),
    /// Every model of the repository serves: none loading, none failed
    /// (`model_repository.strict_readiness`, Triton's `--strict-readiness`).
    /// Models unloaded through the repository API do not count.
    Strict,
}

/// The `reason` of a model unloaded through the repository API.
pub const UNLOADED_BY_API: &str = "unloaded through the repository API";

/// Registry of every model the repository knows about.
#[derive(Default)]
pub struct Registry {
    /// Written by the repository only; read by every handler. A std lock:
    /// critical sections are a map lookup and an `Arc` clone, never an await.
    models: RwLock<BTreeMap<String, ModelEntry>>,
}

impl Registry {
    pub fn new() -> Registry {
        Registry::default()
    }

    /// A snapshot of one entry.
    pub fn get(&self, name: &str) -> Option<ModelEntry> {
        self.models
            .read()
            .expect("registry lock poisoned")
            .get(name)
            .cloned()
    }

    /// The model's handle if it serves, or the error a request should get.
    /// `version`: the version asked for in the URL, if any.
    pub fn ready(&self, name: &str, version: Option<&str>) -> Result<Arc<ModelHandle>, Error> {
        // Runs once per request: read under the lock, clone only the handle.
        let models = self.models.read().expect("registry lock poisoned");
        let entry = models
            .get(name)
            .ok_or_else(|| Error::ModelNotFound(crate::error::clip(name).into_owned()))?;
        if let Some(v) = version {
            if entry.version.as_deref() != Some(v) {
                let have = entry.version.as_deref().unwrap_or("none");
                return Err(Error::NotFound(format!(
                    "model `{name}` has no version `{v}` (available version: {have})"
                )));
            }
        }
        match (&entry.state, &entry.handle) {
            (ModelState::Ready, Some(h)) => Ok(h.clone()),
            (state, _) => Err(Error::ModelNotReady {
                name: name.to_string(),
                reason: state.to_string(),
            }),
        }
    }

    /// `model` when the registry knows it, else [`crate::metrics::UNKNOWN_MODEL`]:
    /// keeps the `model` label of request metrics to a closed set.
    pub fn metric_label<'a>(&self, model: &'a str) -> &'a str {
        // A lookup only: this runs once per request, no entry is cloned.
        if self
            .models
            .read()
            .expect("registry lock poisoned")
            .contains_key(model)
        {
            model
        } else {
            crate::metrics::UNKNOWN_MODEL
        }
    }

    /// Whether the models meet `rule` now.
    pub fn meets(&self, rule: &ReadyRule) -> bool {
        let models = self.models.read().expect("registry lock poisoned");
        match rule {
            ReadyRule::Loaded => true,
            ReadyRule::Model(name) => models.get(name).is_some_and(|e| e.state == ModelState::Ready),
            ReadyRule::Strict => models.values().all(|e| match &e.state {
                ModelState::Ready => true,
                ModelState::Unavailable { reason } => reason == UNLOADED_BY_API,
                ModelState::Loading | ModelState::Unloading => false,
            }),
        }
    }

    /// Every entry, sorted by name.
    pub fn list(&self) -> Vec<ModelEntry> {
        self.models
            .read()
            .expect("registry lock poisoned")
            .values()
            .cloned()
            .collect()
    }

    /// Removes an entry (repository only); requests already holding its
    /// handle finish on it.
    pub(crate) fn remove(&self, name: &str) {
        self.models.write().expect("registry lock poisoned").remove(name);
    }

    /// Inserts or replaces an entry (repository only).
    pub(crate) fn set(&self, entry: ModelEntry) {
        self.models
            .write()
            .expect("registry lock poisoned")
            .insert(entry.name.clone(), entry);
    }
}
