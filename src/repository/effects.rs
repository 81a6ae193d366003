//! Carrying out a model's life (`lifecycle.rs`). Every phase change of a
//! folder goes through [`Repository::transition`]: it sets the phase the
//! lifecycle gives, retires what stops serving, applies batching in place,
//! and publishes the phase to the registry. [`Repository::drive`] also
//! runs the loads the lifecycle asks for, feeding each outcome back in.

use std::sync::Arc;
use std::time::SystemTime;

use super::lifecycle::{self, Effect, Event, Phase};
use super::load::{self, LoadError};
use super::registry::{Cold, ModelEntry, UNLOADED_BY_API};
use super::{forget_device_memory, Repository, Version};
use crate::error::Error;
use crate::metrics;
use crate::model::state::ModelState;

impl Repository {
    /// Applies `event` to `folder`'s phase and carries out its effects but
    /// loads; returns whether the lifecycle asks for a load.
    pub(super) fn transition(&mut self, folder: &str, event: Event<Version>) -> bool {
        let Some(t) = self.tracked.get_mut(folder) else {
            return false;
        };
        // A load that failed while the folder was away is tried again at
        // the next rescan, which comes once the folder is back.
        if let Event::Failed { error, .. } = &event {
            t.retry = !t.dir.is_dir() || error.message().contains("(os error 2)");
        }
        // New settings wait on disk under their own timeout and queue size.
        let renew = matches!(event, Event::Usable { .. });
        let batching = t.seen.settings.as_ref().ok().map(|s| s.batching);
        let batching = batching.or_else(|| t.phase.serving().map(|v| v.handle.settings.batching));
        let (phase, effects) = lifecycle::step(std::mem::replace(&mut t.phase, Phase::Gone), event);
        t.phase = phase;
        t.cold = match (t.phase.cold(), t.cold.take(), batching) {
            (true, Some(cold), _) if !renew => Some(cold),
            (true, _, Some(b)) => Some(Arc::new(Cold::new(&b))),
            _ => None,
        };
        let mut load = false;
        for effect in effects {
            match effect {
                Effect::Load => load = true,
                Effect::ApplyInPlace => self.apply_in_place(folder),
                Effect::Retire { version, hand_over } => self.retire(folder, version, hand_over),
            }
        }
        self.publish(folder);
        if matches!(self.tracked.get(folder).map(|t| &t.phase), Some(Phase::Gone)) {
            self.tracked.remove(folder);
        }
        load
    }

    /// [`Repository::transition`], then the loads it asks for, until the
    /// folder rests. Answers with the last load's outcome, as a client of
    /// the load (a request, the repository API) sees it.
    pub(super) async fn drive(&mut self, folder: &str, mut event: Event<Version>) -> Result<(), Error> {
        let mut outcome = Ok(());
        loop {
            let loaded = matches!(event, Event::Loaded(_));
            let load = self.transition(folder, event);
            if loaded {
                if let Err(short) = self.trim(folder) {
                    let name = self.tracked.get(folder).map_or(folder, |t| t.name.as_str());
                    outcome = Err(no_room(name, &short));
                }
            }
            if !load {
                return outcome;
            }
            (event, outcome) = self.load(folder).await;
        }
    }

    /// Builds a version of `folder`'s model from its files as last seen
    /// (beside the serving one, if any). A model with nothing serving first
    /// gets room under the residency budgets.
    async fn load(&mut self, folder: &str) -> (Event<Version>, Result<(), Error>) {
        let t = self.tracked.get(folder).expect("tracked before loading");
        let (name, dir, replaces) = (t.name.clone(), t.dir.clone(), t.phase.serving().is_some());
        // Stamped at this scan: a file that cannot be read (missing, not a
        // regular file) never reaches the runtime.
        let (settings, file) = match (t.seen.settings.clone(), t.seen.file.clone()) {
            (Ok(s), Ok(f)) => (s, f),
            (Err(why), _) | (_, Err(why)) => return self.failed(folder, LoadError::Files(why)),
        };
        if !replaces {
            if let Err(short) = self.make_room(folder, &settings).await {
                let pinned = self.pinned(&settings);
                if pinned {
                    // A pinned model may not wait for room: an error naming it.
                    let error = self.refusal(folder, LoadError::NoRoom(short.final_message(&name, true)));
                    let answer = error.to_error(&name);
                    let at = SystemTime::now();
                    return (Event::NoRoom { pinned, error, at }, Err(answer));
                }
                let refusal = no_room(&name, &short);
                // Once per refused request: a metric, and a line only at debug.
                tracing::debug!(model = %name, "not loaded: {refusal}");
                metrics::dropped(&name, "no_room");
                // It stays loadable: a pinned model unpinned, or a budget
                // freed, may make room later.
                let error = LoadError::NoRoom(refusal.to_string());
                let at = SystemTime::now();
                return (Event::NoRoom { pinned, error, at }, Err(refusal));
            }
        }
        let steps = super::pipeline::steps(&self.registry, self.budget.clone());
        match load::build(&self.runtime, &self.pool, &name, &dir, settings, steps).await {
            Ok(handle) => {
                let handle = Arc::new(handle);
                self.remember(folder, &handle);
                let result = match replaces {
                    true => {
                        tracing::info!(model = %name, "new version serves; the old one drains and unloads");
                        "reloaded"
                    }
                    false => "loaded",
                };
                metrics::model_reload(&name, result);
                metrics::model_load(&name, self.reason.as_str());
                (Event::Loaded(Version { handle, file }), Ok(()))
            }
            Err(reason) => self.failed(folder, reason),
        }
    }

    /// A load that failed: the event, and the answer to whoever asked for it.
    fn failed(&self, folder: &str, error: LoadError) -> (Event<Version>, Result<(), Error>) {
        let error = self.refusal(folder, error);
        let name = self.tracked.get(folder).map_or(folder, |t| t.name.as_str());
        let answer = error.to_error(name);
        let at = SystemTime::now();
        (Event::Failed { error, at }, Err(answer))
    }

    /// Logs and counts a refused load or change of `folder`'s model, and
    /// returns the error as clients see it (paths relative to the
    /// repository; the log keeps the full paths). The serving version, if
    /// any, keeps serving; the model loads again when its files change or
    /// are touched.
    pub(super) fn refusal(&self, folder: &str, error: LoadError) -> LoadError {
        let reason = error.message().to_string();
        let error = error.map(|m| self.relative(m));
        let Some(t) = self.tracked.get(folder) else {
            return error;
        };
        metrics::model_reload(&t.name, "failed");
        match t.phase.serving() {
            Some(_) => {
                tracing::error!(model = %t.name, folder = %t.dir.display(), error = %reason, "change refused; the last good version keeps serving")
            }
            None => {
                tracing::error!(model = %t.name, folder = %t.dir.display(), error = %reason, "model not loaded; it loads again when its files change")
            }
        }
        error
    }

    /// A version stops serving: it takes no new requests, those it accepted
    /// finish on it (on its successor with `hand_over`, when the signature
    /// is the same), then it unloads.
    fn retire(&self, folder: &str, old: Version, hand_over: bool) {
        let Some(t) = self.tracked.get(folder) else { return };
        let successor = t.phase.serving().map(|v| &v.handle);
        match successor {
            // Live sequences finish on the version they started on.
            Some(new) if hand_over && old.handle.live_sequences() > 0 => {
                tracing::info!(model = %t.name, sequences = old.handle.live_sequences(), "live sequences finish on the old version; new ones start on the new");
                new.follow(old.handle.clone());
            }
            Some(new) if hand_over && old.handle.signature == new.signature => {
                old.handle.batcher().handoff_to(new.batcher().clone());
            }
            Some(_) => {}
            None => forget_device_memory(&t.name, &old.handle),
        }
        old.handle.batcher().retire();
    }

    /// New batching settings (the folder as last seen) applied to the serving version.
    fn apply_in_place(&mut self, folder: &str) {
        let Some(t) = self.tracked.get_mut(folder) else {
            return;
        };
        let (Phase::Serving { version, .. }, Ok(settings)) = (&mut t.phase, &t.seen.settings) else {
            return;
        };
        let settings = load::effective(&version.handle, settings.clone());
        version.handle.batcher().update(settings.batching);
        version.handle = Arc::new(version.handle.with_settings(settings));
        tracing::info!(model = %t.name, batching = ?version.handle.settings.batching, "batching settings applied in place");
        metrics::model_reload(&t.name, "updated");
    }

    /// Writes `folder`'s phase to the registry (and the model's gauges).
    fn publish(&self, folder: &str) {
        let Some(t) = self.tracked.get(folder) else { return };
        let name = t.name.clone();
        let handle = t.phase.serving().map(|v| v.handle.clone());
        let (state, note) = match &t.phase {
            Phase::Gone => {
                self.registry.remove(&name, folder);
                return self.publish_gauges(&name);
            }
            Phase::OnDisk => (ModelState::OnDisk, None),
            Phase::Loading { .. } => (ModelState::Loading, None),
            Phase::Serving { refused, .. } => {
                let note = refused.as_ref().map(|e| {
                    format!(
                        "last change refused, serving the previous version: {}",
                        e.message()
                    )
                });
                (ModelState::Ready, note)
            }
            Phase::Refused { error, since } => {
                let since = httpdate::fmt_http_date(*since);
                let reason = format!("failed to load (since {since}): {}", error.message());
                (ModelState::Unavailable { reason }, None)
            }
            Phase::Unloaded => {
                let reason = UNLOADED_BY_API.to_string();
                (ModelState::Unavailable { reason }, None)
            }
        };
        // A version not serving is the one its folder holds now.
        let version = match &handle {
            Some(h) => h.settings.version.clone(),
            None => t.seen.settings.as_ref().ok().and_then(|s| s.version.clone()),
        };
        self.registry.set(ModelEntry {
            name: name.clone(),
            key: folder.to_string(),
            dir: t.dir.clone(),
            version,
            state,
            handle,
            note,
            cold: t.cold.clone(),
            pinned: t.seen.settings.as_ref().is_ok_and(|s| s.pinned),
        });
        self.publish_gauges(&name);
    }

    /// Model `name`'s readiness and memory gauges, over the versions that
    /// serve side by side: ready while one serves, the memory they all hold.
    fn publish_gauges(&self, name: &str) {
        let handles: Vec<_> = self
            .registry
            .versions(name)
            .into_iter()
            .filter_map(|e| e.handle.filter(|_| e.state == ModelState::Ready))
            .collect();
        metrics::model_ready(name, !handles.is_empty());
        let host = handles.iter().map(|h| h.memory.host_bytes).sum();
        metrics::model_memory(name, "cpu", host);
        let mut devices = std::collections::BTreeMap::<u32, u64>::new();
        for d in handles.iter().flat_map(|h| &h.memory.device_bytes) {
            *devices.entry(d.device).or_default() += d.bytes;
        }
        for (device, bytes) in devices {
            metrics::model_memory(name, &format!("cuda:{device}"), bytes);
        }
    }
}

/// The answer to a request for model `name` that `short` leaves no room
/// for: "retry later" (503, `Retry-After`) while evictions or finished
/// requests may make room, else an error that says no wait will (503).
fn no_room(name: &str, short: &super::residency::NoRoom) -> Error {
    let message = short.final_message(name, false);
    match short.never() {
        true => Error::ModelNotReady {
            name: name.to_string(),
            reason: message,
        },
        false => Error::Busy {
            message,
            retry_after: std::time::Duration::from_secs(1),
        },
    }
}
