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
    /// Written by the repository only; read by every handler. A std lock:
    /// critical sections are a map lookup and an `Arc` clone, never an await.
    models: RwLock<BTreeMap<String, ModelEntry>>,
    /// Asks the repository task for a load a request needs (set once when
    /// the task starts; the task answers on the reply).
    demands: OnceLock<Demand>,
}

/// Sends the repository task a request's load of model `name`, answered on
/// the reply; false when the task is gone. The task sets it when it starts
/// (it owns the queue; the registry need not know its commands).
pub type Demand = Box<dyn Fn(String, oneshot::Sender<Result<Arc<ModelHandle>, Error>>) -> bool + Send + Sync>;

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
                    "Request for unknown model: '{name}' version {v} is not found (available version: {have})"
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
        let cold = self.get(name).and_then(|e| e.cold);
        let (Some(cold), Some(demand)) = (cold, self.demands.get()) else {
            return Err(not_ready);
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
        if !demand(name.to_string(), reply) {
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
    pub fn servable(&self, name: &str, version: Option<&str>) -> Result<(), Error> {
        match self.ready(name, version) {
            Ok(_) => Ok(()),
            Err(e @ (Error::ModelNotFound(_) | Error::NotFound(_))) => Err(e),
            Err(e) => match self.get(name).and_then(|e| e.cold) {
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
        match rule {
            ReadyRule::Loaded => models.values().all(|e| {
                !e.pinned
                    || !matches!(&e.state, ModelState::Unavailable { reason } if reason != UNLOADED_BY_API)
            }),
            ReadyRule::Model(name) => models.get(name).is_some_and(|e| e.state == ModelState::Ready),
            ReadyRule::Strict => models.values().all(|e| match &e.state {
                ModelState::Ready | ModelState::OnDisk => true,
                ModelState::Unavailable { reason } => reason == UNLOADED_BY_API,
                // A load that requests asked for does not make the server unready.
                ModelState::Loading | ModelState::Unloading => e.cold.is_some(),
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
