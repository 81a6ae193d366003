//! The model repository: one task (the actor in this file) owns every
//! registry write. It scans the folder at start-up, rescans when the
//! watcher says something changed, and serves the repository API's
//! load/unload commands, one at a time, so that reloads of a model are
//! serialized. Handlers only read the [`Registry`].
//!
//! Per folder, a rescan decides what changed (see `diff.rs`) and hands it
//! to the folder's lifecycle (`lifecycle.rs`, one pure transition function)
//! as an event; `effects.rs` carries out what the lifecycle says: added →
//! load (or rest on disk, as residency says); removed → retire (accepted
//! requests still finish: they hold the old version's `Arc`);
//! batching-only change → applied to the running batcher in place; file or
//! session change → load the new version beside the old, warm it, swap,
//! hand the old version's queue to the new one; broken change → keep the
//! last good version serving and report why (log, index, metric).

mod api;
pub mod diff;
mod effects;
pub mod files;
pub mod lifecycle;
mod load;
mod pipeline;
pub mod registry;
pub mod residency;
mod resident;
pub mod scan;
pub mod sentence;
pub mod warm;
pub mod watcher;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};

pub use api::load_parameters;
pub use load::{check_loaded, describe, Checked};
pub use pipeline::{report as pipeline_report, without_file as pipeline_without_file};
pub use registry::{ModelEntry, ReadyRule, Registry};

use crate::error::Error;
use crate::metrics;
use crate::model::ModelHandle;
use crate::pool::Pool;
use crate::runtime::Runtime;
use crate::settings::ModelDefaults;
use diff::{classify, Change, FileStamp, Stamp};
use lifecycle::{Event, Phase};
use load::LoadError;
use scan::ModelDir;

/// Requests to the repository task.
enum Command {
    /// The folder changed (from the watcher): rescan everything.
    Rescan,
    /// Repository API: (re)load the model of this name, with this
    /// configuration (JSON, Triton's `config` parameter) if given.
    Load {
        name: String,
        config: Option<String>,
        reply: oneshot::Sender<Result<(), Error>>,
    },
    /// Repository API: unload the model of this name.
    Unload {
        name: String,
        reply: oneshot::Sender<Result<(), Error>>,
    },
    /// A request found the model not resident: load it (evicting others if
    /// the budgets need it) and answer with it.
    Demand {
        /// The repository's key for it (its folder, or `<folder>@<version>`).
        key: String,
        reply: oneshot::Sender<Result<Arc<ModelHandle>, Error>>,
    },
}

/// Handle to the repository task. Cheap to clone.
#[derive(Clone)]
pub struct RepositoryHandle {
    /// Commands to the repository task, which holds the receiver; it stops
    /// when every handle (and the watcher's forwarder) is gone.
    commands: mpsc::UnboundedSender<Command>,
    registry: Arc<Registry>,
}

impl RepositoryHandle {
    /// The registry handlers read.
    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    /// Asks for a rescan (what the watcher does; the table tests drive
    /// the repository task with it).
    #[cfg(test)]
    pub(crate) fn rescan(&self) {
        let _ = self.commands.send(Command::Rescan);
    }

    /// Loads (or reloads, if its folder changed) the model `name`; a model
    /// unloaded through [`RepositoryHandle::unload`] serves again. `config`:
    /// a model configuration (JSON) that stands in for the folder's own until
    /// the next load without one.
    pub async fn load(&self, name: &str, config: Option<String>) -> Result<(), Error> {
        let (reply, rx) = oneshot::channel();
        let _ = self.commands.send(Command::Load {
            name: name.to_string(),
            config,
            reply,
        });
        rx.await.map_err(|_| Error::ShuttingDown)?
    }

    /// Unloads the model `name`: new requests are refused, accepted ones
    /// finish; it stays unloaded (whatever its folder does) until `load`.
    pub async fn unload(&self, name: &str) -> Result<(), Error> {
        let (reply, rx) = oneshot::channel();
        let _ = self.commands.send(Command::Unload {
            name: name.to_string(),
            reply,
        });
        rx.await.map_err(|_| Error::ShuttingDown)?
    }
}

/// What the task knows of one model folder.
struct Tracked {
    folder: String,
    dir: PathBuf,
    /// The model's name (registry key).
    name: String,
    /// What the folder looked like at the last attempt (so an unchanged
    /// broken folder is not retried on every rescan).
    seen: Stamp,
    /// Where it is in its life; set only by `Repository::transition`.
    phase: Phase<Version>,
    /// While it is on disk or loading for requests: how those requests
    /// wait for it (`[residency]`).
    cold: Option<Arc<registry::Cold>>,
    /// What its last load of this file held, per device: its charge
    /// against the residency budgets before its next load.
    known: Option<(FileStamp, residency::Charge)>,
    /// Its last load failed while its folder was away (the repository root
    /// renamed, a volume remounting) or a file vanished under it: the next
    /// rescan tries it again although its files look as they did.
    retry: bool,
}

/// A version that serves: its handle (settings inside) and the file stamp
/// it was built from.
#[derive(Clone)]
pub(crate) struct Version {
    handle: Arc<ModelHandle>,
    file: FileStamp,
}

/// The repository task's state.
pub struct Repository {
    root: PathBuf,
    /// `--model-name`: the root is this one model's folder (KServe's `/mnt/models`).
    model_name: Option<String>,
    defaults: ModelDefaults,
    runtime: Arc<dyn Runtime>,
    pool: Arc<Pool>,
    registry: Arc<Registry>,
    /// By folder name.
    tracked: BTreeMap<String, Tracked>,
    /// `[residency]`: which models load at start, and the budgets.
    residency: crate::config::Residency,
    /// Each GPU's default budget, read from the device when first needed.
    device_totals: Option<Vec<u64>>,
    /// Why the load running now was asked for (`sluice_model_loads_total`'s `reason`).
    reason: LoadReason,
    /// Configurations given with a model-control load, by folder.
    overrides: scan::Overrides,
    /// The server's byte budget, which pipelines hold their steps' tensors in.
    budget: Option<crate::budget::ByteBudget>,
}

/// Why a model loads (`sluice_model_loads_total{reason}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LoadReason {
    /// The start-up scan.
    Start,
    /// A request found it not resident.
    OnDemand,
    /// Its folder changed, or a new folder appeared.
    Reload,
    /// The repository API.
    Api,
}

impl LoadReason {
    fn as_str(self) -> &'static str {
        match self {
            LoadReason::Start => "start",
            LoadReason::OnDemand => "on_demand",
            LoadReason::Reload => "reload",
            LoadReason::Api => "api",
        }
    }
}

impl Repository {
    pub fn new(
        root: PathBuf,
        model_name: Option<String>,
        defaults: ModelDefaults,
        runtime: Arc<dyn Runtime>,
        pool: Arc<Pool>,
    ) -> Repository {
        Repository {
            root,
            model_name,
            defaults,
            runtime,
            pool,
            registry: Arc::new(Registry::new()),
            tracked: BTreeMap::new(),
            residency: crate::config::Residency::default(),
            device_totals: None,
            reason: LoadReason::Start,
            overrides: scan::Overrides::new(),
            budget: None,
        }
    }

    /// The byte budget pipelines hold their steps' tensors in.
    pub fn with_budget(mut self, budget: crate::budget::ByteBudget) -> Repository {
        self.budget = Some(budget);
        self
    }

    /// Which models stay loaded when they do not all fit (`[residency]`).
    pub fn with_residency(mut self, residency: crate::config::Residency) -> Repository {
        self.residency = residency;
        self
    }

    /// Starts the repository task: it loads every model folder, then sends
    /// the outcome on the returned receiver (Err: the folder is unreadable),
    /// then follows `rescan` signals (from the watcher) and API commands.
    pub fn spawn(
        self,
        mut rescan: mpsc::UnboundedReceiver<()>,
    ) -> (RepositoryHandle, oneshot::Receiver<Result<(), String>>) {
        let (commands, mut rx) = mpsc::unbounded_channel();
        // A request's load joins the same queue as rescans and API
        // commands, so that it runs after the changes queued before it.
        // Weak: the task stops when the last handle is gone.
        let demands = commands.downgrade();
        self.registry.take_demands(Box::new(move |key, reply| {
            demands
                .upgrade()
                .is_some_and(|tx| tx.send(Command::Demand { key, reply }).is_ok())
        }));
        let handle = RepositoryHandle {
            commands: commands.clone(),
            registry: self.registry.clone(),
        };
        let (loaded_tx, loaded_rx) = oneshot::channel();
        // Forwards the watcher's signals as commands.
        tokio::spawn(async move {
            while rescan.recv().await.is_some() {
                if commands.send(Command::Rescan).is_err() {
                    break;
                }
            }
        });
        let mut repo = self;
        tokio::spawn(async move {
            let rt = repo.runtime.clone();
            let _ = tokio::task::spawn_blocking(move || rt.prime()).await;
            repo.publish_budgets();
            let first = supervised("the start-up scan", repo.rescan())
                .await
                .unwrap_or_else(|e| Err(e.to_string()));
            repo.reason = LoadReason::Reload;
            let _ = loaded_tx.send(first);
            while let Some(cmd) = rx.recv().await {
                repo.run(cmd).await;
            }
        });
        (handle, loaded_rx)
    }

    /// Runs one command. A panic inside it is caught and logged, and the
    /// caller answered with an internal error: the task goes on to the next
    /// command, so one bug cannot stop every later reload.
    async fn run(&mut self, cmd: Command) {
        match cmd {
            Command::Rescan => {
                // A panic (Err) was logged by `supervised`.
                if let Ok(Err(e)) = supervised("a rescan", self.rescan()).await {
                    tracing::error!(error = %e, "cannot rescan the model repository");
                }
            }
            Command::Load { name, config, reply } => {
                let what = format!("loading `{name}`");
                self.reason = LoadReason::Api;
                let r = supervised(&what, self.api_load(&name, config)).await;
                self.reason = LoadReason::Reload;
                let _ = reply.send(r.and_then(|r| r));
            }
            Command::Demand { key, reply } => {
                let what = format!("loading `{key}` for a request");
                self.reason = LoadReason::OnDemand;
                let r = supervised(&what, self.demand(&key)).await;
                self.reason = LoadReason::Reload;
                let _ = reply.send(r.and_then(|r| r));
            }
            Command::Unload { name, reply } => {
                let what = format!("unloading `{name}`");
                let r = supervised(&what, async { self.api_unload(&name) }).await;
                let _ = reply.send(r.and_then(|r| r));
            }
        }
    }

    /// Scans the folder and applies every difference. A folder that cannot
    /// be read is still present (its error keeps the last good version
    /// serving); a repository that cannot be listed changes nothing.
    async fn rescan(&mut self) -> Result<(), String> {
        let dirs = self.survey(|_| true).await?;
        let mut dirs = self.keep_versions_serving(dirs);
        let present: Vec<&str> = dirs.iter().map(|(d, _)| d.folder.as_str()).collect();
        let (mut gone, mut gone_versions) = (Vec::new(), Vec::new());
        for t in self
            .tracked
            .values()
            .filter(|t| !present.contains(&t.folder.as_str()))
        {
            // A version of a folder still there goes once the versions that
            // replace it serve; a folder gone goes first (its name may have
            // moved to another folder).
            match dirs.iter().any(|(d, _)| d.dir == t.dir) {
                true => gone_versions.push(t.folder.clone()),
                false => gone.push(t.folder.clone()),
            }
        }
        for folder in gone {
            self.remove(&folder);
        }
        // Pinned models first: they are counted against the budgets first.
        // Pipelines last: their steps' models serve by then, so their
        // signatures are known.
        dirs.sort_by_key(|(md, _)| {
            let s = md.settings.as_ref().ok();
            (
                !s.is_some_and(|s| s.pinned),
                s.is_some_and(|s| s.pipeline.is_some()),
            )
        });
        for (md, now) in dirs {
            let _ = self.apply(md, now, false).await;
        }
        for key in gone_versions {
            self.remove(&key);
        }
        Ok(())
    }

    /// A folder whose versions serve side by side, and whose configuration
    /// breaks, is one folder with an error: each of its versions gets the
    /// error (and keeps serving), instead of going.
    fn keep_versions_serving(&self, dirs: Vec<(ModelDir, Stamp)>) -> Vec<(ModelDir, Stamp)> {
        let mut out = Vec::with_capacity(dirs.len());
        for (md, now) in dirs {
            let versions: Vec<&Tracked> = match (&md.settings, self.tracked.contains_key(&md.folder)) {
                (Err(_), false) => self.tracked.values().filter(|t| t.dir == md.dir).collect(),
                _ => Vec::new(),
            };
            if versions.is_empty() {
                out.push((md, now));
                continue;
            }
            for t in versions {
                let md = ModelDir {
                    folder: t.folder.clone(),
                    dir: md.dir.clone(),
                    settings: md.settings.clone(),
                };
                out.push((md, now.clone()));
            }
        }
        out
    }

    /// `msg` with the repository's path (as configured, and as resolved)
    /// taken off the paths it names: `digits/model.onnx`, not the host's
    /// `/srv/models/digits/model.onnx`.
    fn relative(&self, msg: &str) -> String {
        let mut out = msg.to_string();
        let resolved = self.root.canonicalize().ok();
        for root in std::iter::once(self.root.as_path()).chain(resolved.as_deref()) {
            let shown = root.display().to_string();
            if shown.is_empty() || shown == "/" {
                continue;
            }
            out = out.replace(&format!("{shown}/"), "");
            // The root itself (the single-model layout's files are in it).
            out = out.replace(&shown, "the model repository");
        }
        out
    }

    /// Scans the repository and stamps the ONNX file of each folder that
    /// `keep` selects, on a blocking thread: a file or folder that never
    /// answers blocks that thread, never an async worker.
    async fn survey<F>(&self, keep: F) -> Result<Vec<(ModelDir, Stamp)>, String>
    where
        F: Fn(&ModelDir) -> bool + Send + 'static,
    {
        let (root, model_name, defaults) = (self.root.clone(), self.model_name.clone(), self.defaults);
        let overrides = self.overrides.clone();
        let previous: BTreeMap<String, FileStamp> = self
            .tracked
            .iter()
            .filter_map(|(folder, t)| Some((folder.clone(), t.seen.file.clone().ok()?)))
            .collect();
        blocking(move || {
            let layout = scan::Layout {
                root: &root,
                model_name: model_name.as_deref(),
                defaults: &defaults,
                overrides: &overrides,
            };
            let dirs = scan::scan(&layout)?.into_iter().filter(|d| keep(d));
            Ok(dirs
                .map(|md| {
                    let now = diff::stamp_of(&md, previous.get(&md.folder));
                    (md, now)
                })
                .collect())
        })
        .await
    }

    /// Brings one folder, seen as `now`, up to date (`force`: load it now
    /// whatever residency says, also when unchanged; the repository API's
    /// load of a model with nothing serving).
    async fn apply(&mut self, md: ModelDir, now: Stamp, force: bool) -> Result<(), Error> {
        // Unusable settings cannot rename a model: it keeps its name (and
        // its last good version) instead of counting as removed.
        let name = match (&md.settings, self.tracked.get(&md.folder)) {
            (Err(_), Some(t)) => t.name.clone(),
            _ => md.name().to_string(),
        };
        // Versions of one folder share its name.
        if let Some(owner) = self.tracked.values().find(|t| t.name == name && t.dir != md.dir) {
            tracing::error!(
                model = %name, folder = %md.dir.display(), other = %owner.dir.display(),
                "two folders declare the same model name; this one is ignored"
            );
            return Ok(());
        }
        let folder = md.folder.clone();
        let Some(t) = self.tracked.get_mut(&folder) else {
            return self.add(md, now).await;
        };
        if matches!(t.phase, Phase::Unloaded) && !force {
            t.seen = now;
            return Ok(());
        }
        if t.name != name {
            // Renamed through `name`: the old model goes, the new one comes.
            self.remove(&folder);
            return self.add(md, now).await;
        }
        let serving = t.phase.serving().map(|v| (&v.handle.settings, &v.file));
        // A load that failed is tried again when any of its files is
        // touched (a permission restored, the same bytes written again, a
        // file that reappears): its content may be whole now although its
        // digest is what it was when the load failed.
        let retry = t.phase.refused().is_some()
            && (std::mem::take(&mut t.retry)
                || match (&t.seen.file, &now.file) {
                    (Ok(seen), Ok(file)) => file.touched_since(seen),
                    (seen, file) => seen.is_err() != file.is_err(),
                });
        let before = if force || retry {
            Stamp {
                settings: Err(String::new()),
                file: Err(String::new()),
            }
        } else {
            t.seen.clone()
        };
        let change = classify(&before, &now, serving);
        let changed = before != now;
        t.seen = now;
        let resting = t.phase.resting();
        let at = std::time::SystemTime::now();
        let event = match change {
            // The folder changed back to exactly what serves (a refused edit
            // was undone): the note about the refused change no longer holds.
            Change::None if changed => Event::Unchanged,
            Change::None => return Ok(()),
            Change::Invalid(reason) => {
                let error = self.refusal(&folder, LoadError::Files(reason));
                match force {
                    true => Event::ApiLoad {
                        refused: Some((error, at)),
                    },
                    false => Event::Failed { error, at },
                }
            }
            Change::BatchingOnly(_) => Event::BatchingChanged,
            Change::Reload(_) if force => Event::ApiLoad { refused: None },
            // Not resident, or failed with nothing serving: the change
            // applies as residency says (now, or at its next request).
            Change::Reload(settings) if resting => Event::Usable {
                now: self.loads_now(&folder, &settings),
            },
            Change::Reload(_) => Event::Usable { now: true },
        };
        // The outcome is logged, published and counted where it happens.
        self.drive(&folder, event).await
    }

    /// A folder seen for the first time.
    async fn add(&mut self, md: ModelDir, now: Stamp) -> Result<(), Error> {
        let folder = md.folder.clone();
        self.tracked.insert(
            folder.clone(),
            Tracked {
                folder: folder.clone(),
                dir: md.dir.clone(),
                name: md.name().to_string(),
                seen: now.clone(),
                phase: Phase::OnDisk,
                cold: None,
                known: None,
                retry: false,
            },
        );
        let event = match now.settings {
            Err(reason) => Event::Failed {
                error: self.refusal(&folder, LoadError::Files(reason)),
                at: std::time::SystemTime::now(),
            },
            Ok(settings) => Event::Usable {
                now: self.loads_now(&folder, &settings),
            },
        };
        self.drive(&folder, event).await
    }

    /// A folder disappeared: the model stops taking requests; accepted ones
    /// finish on the version they hold, which then unloads.
    fn remove(&mut self, folder: &str) {
        let Some(t) = self.tracked.get(folder) else { return };
        let queued = t.phase.serving().map_or(0, |v| v.handle.batcher().queued());
        tracing::info!(model = %t.name, queued, "model folder removed; draining, then unloading");
        metrics::model_reload(&t.name, "unloaded");
        self.transition(folder, Event::Removed);
    }
}

/// Awaits `fut`, turning a panic inside it into [`Error::Internal`] (and an
/// error line naming `what`) instead of ending the repository task.
async fn supervised<T>(what: &str, fut: impl std::future::Future<Output = T>) -> Result<T, Error> {
    use futures_util::FutureExt;
    std::panic::AssertUnwindSafe(fut).catch_unwind().await.map_err(|panic| {
        let msg = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic".into());
        tracing::error!(error = %msg, "the repository task panicked while {what}; it goes on with the next command");
        Error::Internal(format!("the model repository panicked while {what}: {msg}"))
    })
}

/// Runs repository file I/O on a blocking thread.
async fn blocking<T: Send + 'static>(
    io: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Result<T, String> {
    tokio::task::spawn_blocking(io)
        .await
        .map_err(|e| format!("reading the model repository panicked: {e}"))?
}

/// Zeroes the device-memory gauges of a version that stops serving.
fn forget_device_memory(name: &str, handle: &ModelHandle) {
    for d in &handle.memory.device_bytes {
        metrics::model_memory(name, &format!("cuda:{}", d.device), 0);
    }
}

#[cfg(test)]
mod tests;
