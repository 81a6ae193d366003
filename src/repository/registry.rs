//! The name → model map that request handlers read. Only the repository
//! (its loading code, and later its one writer task) writes it; handlers take
//! a cheap snapshot (`Arc<ModelHandle>`) and never hold the lock across an
//! `.await`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, RwLock};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::error::Error;
use crate::model::state::ModelState;
use crate::model::ModelHandle;

/// One model of the repository (one version of it, where several serve
/// side by side), ready or not.
#[derive(Clone)]
pub struct ModelEntry {
    pub name: String,
    /// The repository's key for it: its folder, or `<folder>@<version>`
    /// where several versions of a folder serve side by side.
    pub key: String,
    /// The model's folder in the repository.
    pub dir: PathBuf,
    pub version: Option<String>,
    pub state: ModelState,
    /// Set when `state` is `Ready` (or `Unloading`: still draining).
    pub handle: Option<Arc<ModelHandle>>,
    /// Why the last change was refused while this version keeps serving.
    pub note: Option<String>,
    /// Set while the model is not resident, and while it loads for the
    /// requests that found it so: they wait for the load.
    pub cold: Option<Arc<Cold>>,
    /// Its settings pin it (`pinned`): the server is not ready while it
    /// cannot be loaded.
    pub pinned: bool,
}

/// How requests wait for a model that is not resident: within its
/// `timeout`, and at most `max_queue_size` of them at once.
#[derive(Debug)]
pub struct Cold {
    pub timeout: Duration,
    pub max_queue_size: usize,
    /// Requests waiting for the load now.
    waiting: AtomicUsize,
}

impl Cold {
    pub fn new(settings: &crate::settings::BatchSettings) -> Cold {
        Cold {
            timeout: settings.timeout,
            max_queue_size: settings.max_queue_size,
            waiting: AtomicUsize::new(0),
        }
    }
}

/// A waiting request's place among [`Cold::waiting`], given back on drop.
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What server readiness (`/v2/health/ready`, gRPC `ServerReady`) asks of
/// the models, once the start-up load is done and until shutdown begins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadyRule {
    /// Nothing more (Triton's default): a model that failed to load is
    /// reported in the index and the others serve; only a pinned model
    /// that cannot be loaded keeps the server unready.
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
    /// By name, then by the repository's key (one per version serving side
    /// by side). Written by the repository only; read by every handler. A
    /// std lock: critical sections are a map lookup and an `Arc` clone,
    /// never an await.
    models: RwLock<BTreeMap<String, Versions>>,
    /// Asks the repository task for a load a request needs (set once when
    /// the task starts; the task answers on the reply).
    demands: OnceLock<Demand>,
}

/// Sends the repository task a request's load of the model of a key, answered on
/// the reply; false when the task is gone. The task sets it when it starts
/// (it owns the queue; the registry need not know its commands).
pub type Demand = Box<dyn Fn(String, oneshot::Sender<Result<Arc<ModelHandle>, Error>>) -> bool + Send + Sync>;

/// The entries of one model name, by the repository's key.
type Versions = BTreeMap<String, ModelEntry>;

/// The entry a request for `version` (none: Triton's choice) reaches: that
/// version; without one, the highest version that serves, else the highest.
fn pick<'a>(name: &str, versions: &'a Versions, version: Option<&str>) -> Result<&'a ModelEntry, Error> {
    if let Some(v) = version {
        return versions
            .values()
            .find(|e| e.version.as_deref() == Some(v))
            .ok_or_else(|| {
                let mut have: Vec<&str> = versions.values().filter_map(|e| e.version.as_deref()).collect();
                have.sort_by_key(|v| version_order(v));
                let have = if have.is_empty() {
                    "none".to_string()
                } else {
                    have.join(", ")
                };
                Error::NotFound(format!(
                    "Request for unknown model: '{name}' version {v} is not found (available version: {have})"
                ))
            });
    }
    // Almost every model has one entry: no ordering to do per request.
    if versions.len() == 1 {
        return Ok(versions.values().next().expect("one entry"));
    }
    let highest = |ready: bool| {
        versions
            .values()
            .filter(|e| !ready || e.state == ModelState::Ready)
            .max_by_key(|e| e.version.as_deref().map(version_order))
    };
    highest(true)
        .or_else(|| highest(false))
        .ok_or_else(|| Error::ModelNotFound(crate::error::clip(name).into_owned()))
}

/// Versions order by number (Triton's are numbers), then as text.
fn version_order(v: &str) -> (u64, &str) {
    (v.parse().unwrap_or(0), v)
}

impl Registry {
    pub fn new() -> Registry {
        Registry::default()
    }

    /// A snapshot of the entry a request without a version reaches.
    pub fn get(&self, name: &str) -> Option<ModelEntry> {
        let models = self.models.read().expect("registry lock poisoned");
        pick(name, models.get(name)?, None).ok().cloned()
    }

    /// A snapshot of the entry of the repository's `key` for model `name`.
    pub fn entry(&self, name: &str, key: &str) -> Option<ModelEntry> {
        let models = self.models.read().expect("registry lock poisoned");
        models.get(name)?.get(key).cloned()
    }

    /// The model's handle if it serves, or the error a request should get.
    /// `version`: the version asked for in the URL, if any.
    pub fn ready(&self, name: &str, version: Option<&str>) -> Result<Arc<ModelHandle>, Error> {
        // Runs once per request: read under the lock, clone only the handle.
        let models = self.models.read().expect("registry lock poisoned");
        let versions = models
            .get(name)
            .ok_or_else(|| Error::ModelNotFound(crate::error::clip(name).into_owned()))?;
        let entry = pick(name, versions, version)?;
        match (&entry.state, &entry.handle) {
            (ModelState::Ready, Some(h)) => Ok(h.clone()),
            (state, _) => Err(Error::ModelNotReady {
                name: name.to_string(),
                reason: state.to_string(),
            }),
        }
    }

    /// The model's handle, loading it first when it is not resident (see
    /// [`ModelState::OnDisk`]): the request waits for the load within its
    /// deadline (`arrival` + the model's `timeout`), counted against its
    /// `max_queue_size`; concurrent first requests share one load.
    pub async fn serve(
        &self,
        name: &str,
        version: Option<&str>,
        arrival: Instant,
    ) -> Result<Arc<ModelHandle>, Error> {
        let not_ready = match self.ready(name, version) {
            Ok(h) => return Ok(h),
            Err(e) => e,
        };
        let entry = {
            let models = self.models.read().expect("registry lock poisoned");
            models
                .get(name)
                .and_then(|v| pick(name, v, version).ok())
                .cloned()
        };
        let Some(entry) = entry else { return Err(not_ready) };
        // Read apart from the first look: the load may have finished in
        // between (no longer cold), so the model is asked for again.
        let (Some(cold), Some(demand)) = (entry.cold, self.demands.get()) else {
            return self.ready(name, version);
        };
        let before = cold.waiting.fetch_add(1, Ordering::AcqRel);
        let _waiting = Waiting(&cold.waiting);
        if before >= cold.max_queue_size {
            return Err(Error::Overloaded {
                model: name.to_string(),
                max_queue_size: cold.max_queue_size,
                retry_after: Duration::from_secs(1),
            });
        }
        let (reply, rx) = oneshot::channel();
        if !demand(entry.key, reply) {
            return Err(Error::ShuttingDown);
        }
        let started = Instant::now();
        let deadline = tokio::time::Instant::from_std(arrival + cold.timeout);
        let handle = match tokio::time::timeout_at(deadline, rx).await {
            Err(_) => {
                return Err(Error::DeadlineExceeded {
                    model: name.to_string(),
                    timeout: cold.timeout,
                })
            }
            Ok(Err(_)) => return Err(Error::ShuttingDown),
            Ok(Ok(answer)) => answer?,
        };
        crate::metrics::cold_start(name, started.elapsed());
        Ok(handle)
    }

    /// Whether a request for the model would be served: it serves now, or
    /// it is not resident and its next request loads it (model readiness).
    /// A pipeline is servable when its steps' models are too (as Triton's
    /// ensemble is ready when its composing models are).
    pub fn servable(&self, name: &str, version: Option<&str>) -> Result<(), Error> {
        self.servable_at(name, version, 0)
    }

    /// [`Registry::servable`], `depth` pipelines down (a pipeline that runs
    /// itself through others stops at a bound).
    fn servable_at(&self, name: &str, version: Option<&str>, depth: usize) -> Result<(), Error> {
        match self.ready(name, version) {
            Ok(h) => match h.pipeline() {
                Some(p) if depth < 8 => {
                    for step in p.step_models() {
                        self.servable_at(&step, None, depth + 1)
                            .map_err(|e| Error::ModelNotReady {
                                name: name.to_string(),
                                reason: format!("its step model `{step}` is not: {e}"),
                            })?;
                    }
                    Ok(())
                }
                _ => Ok(()),
            },
            Err(e @ (Error::ModelNotFound(_) | Error::NotFound(_))) => Err(e),
            Err(e) => match self
                .models
                .read()
                .expect("registry lock poisoned")
                .get(name)
                .and_then(|v| pick(name, v, version).ok()?.cold.clone())
            {
                Some(_) => Ok(()),
                None => Err(e),
            },
        }
    }

    /// Where [`Registry::serve`] sends the loads it asks for (the repository task, once).
    pub(super) fn take_demands(&self, demand: Demand) {
        let _ = self.demands.set(demand);
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
        let mut all = models.values().flat_map(|v| v.values());
        match rule {
            ReadyRule::Loaded => all.all(|e| {
                !e.pinned
                    || !matches!(&e.state, ModelState::Unavailable { reason } if reason != UNLOADED_BY_API)
            }),
            ReadyRule::Model(name) => models
                .get(name)
                .is_some_and(|v| v.values().any(|e| e.state == ModelState::Ready)),
            ReadyRule::Strict => all.all(|e| match &e.state {
                ModelState::Ready | ModelState::OnDisk => true,
                ModelState::Unavailable { reason } => reason == UNLOADED_BY_API,
                // A load that requests asked for does not make the server unready.
                ModelState::Loading | ModelState::Unloading => e.cold.is_some(),
            }),
        }
    }

    /// The entries of model `name` (one per version serving side by side).
    pub fn versions(&self, name: &str) -> Vec<ModelEntry> {
        let models = self.models.read().expect("registry lock poisoned");
        models
            .get(name)
            .map(|v| v.values().cloned().collect())
            .unwrap_or_default()
    }

    /// The versions of model `name` that serve, ascending (model metadata's `versions`).
    pub fn ready_versions(&self, name: &str) -> Vec<String> {
        let mut out: Vec<String> = self
            .versions(name)
            .into_iter()
            .filter(|e| e.state == ModelState::Ready)
            .filter_map(|e| e.version)
            .collect();
        out.sort_by(|a, b| version_order(a).cmp(&version_order(b)));
        out
    }

    /// Every entry, sorted by name, then by version. A pipeline whose step
    /// models do not all serve is listed UNAVAILABLE, naming the step, as
    /// its readiness says (the index and readiness agree).
    pub fn list(&self) -> Vec<ModelEntry> {
        let mut out = Vec::new();
        {
            let models = self.models.read().expect("registry lock poisoned");
            for versions in models.values() {
                let mut entries: Vec<&ModelEntry> = versions.values().collect();
                entries.sort_by_key(|e| e.version.as_deref().map(version_order));
                out.extend(entries.into_iter().cloned());
            }
        }
        for e in out.iter_mut().filter(|e| e.state == ModelState::Ready) {
            if e.handle.as_ref().is_some_and(|h| h.pipeline().is_some()) {
                if let Err(why) = self.servable(&e.name, e.version.as_deref()) {
                    e.state = ModelState::Unavailable {
                        reason: why.to_string(),
                    };
                }
            }
        }
        out
    }

    /// Removes the entry of `key` (repository only); requests already
    /// holding its handle finish on it.
    pub(crate) fn remove(&self, name: &str, key: &str) {
        let mut models = self.models.write().expect("registry lock poisoned");
        if let Some(versions) = models.get_mut(name) {
            versions.remove(key);
            if versions.is_empty() {
                models.remove(name);
            }
        }
    }

    /// Inserts or replaces an entry (repository only).
    pub(crate) fn set(&self, entry: ModelEntry) {
        self.models
            .write()
            .expect("registry lock poisoned")
            .entry(entry.name.clone())
            .or_default()
            .insert(entry.key.clone(), entry);
    }
}
