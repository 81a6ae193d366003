//! Loading a version of a model and swapping it in for the one that
//! serves (its queue handed over when the signature is the same), or, when
//! the load fails, keeping the last good version serving and saying why.

use std::sync::Arc;

use super::load::{self, LoadError};
use super::scan::ModelDir;
use super::Repository;
use crate::error::Error;
use crate::metrics;
use crate::model::state::ModelState;
use crate::model::ModelHandle;

impl Repository {
    /// Loads a new version beside the serving one and swaps it in.
    pub(super) async fn reload(&mut self, md: &ModelDir, settings: crate::settings::ModelSettings) {
        // The outcome is logged, published and counted where it happens.
        let _ = self.load_version(md, settings).await;
    }

    /// [`Repository::reload`], answering with the version that serves now.
    /// A model with no version serving first gets room under the residency
    /// budgets; when there is none it stays on disk (503, `Retry-After`).
    pub(super) async fn load_version(
        &mut self,
        md: &ModelDir,
        settings: crate::settings::ModelSettings,
    ) -> Result<Arc<ModelHandle>, Error> {
        let name = md.name().to_string();
        // Stamped at this scan: a file that cannot be read (missing, not a
        // regular file) never reaches the runtime.
        let seen = self.tracked.get(&md.folder).map(|t| t.seen.file.clone());
        let file = match seen.expect("tracked before reload") {
            Ok(file) => file,
            Err(why) => return Err(self.failed(&md.folder, LoadError::Files(why)).to_error(&name)),
        };
        let fresh = self.tracked.get(&md.folder).is_some_and(|t| t.serving.is_none());
        if fresh {
            if let Err(short) = self.make_room(&md.folder, &settings).await {
                let pinned = self.pinned(&settings);
                if pinned {
                    // A pinned model may not wait for room: an error naming it.
                    let error = LoadError::NoRoom(short.final_message(&name, true));
                    return Err(self.failed(&md.folder, error).to_error(&name));
                }
                let refusal = no_room(&name, &short);
                // Once per refused request: a metric, and a line only at debug.
                tracing::debug!(model = %name, "not loaded: {refusal}");
                metrics::dropped(&name, "no_room");
                // It stays loadable: a pinned model unpinned, or a budget
                // freed, may make room later.
                self.rest(&md.folder, &settings);
                return Err(refusal);
            }
        }
        match load::build(&self.runtime, &self.pool, &name, &md.dir, settings).await {
            Ok(handle) => {
                let handle = Arc::new(handle);
                self.remember(&md.folder, &handle);
                let t = self.tracked.get_mut(&md.folder).expect("tracked before reload");
                t.refused = None;
                let old = t.serving.replace((handle.clone(), file));
                let result = match old {
                    Some((old, _)) => {
                        // Same signature: the old version's queue runs on the new one.
                        if old.signature == handle.signature {
                            old.batcher().handoff_to(handle.batcher().clone());
                        }
                        old.batcher().retire();
                        tracing::info!(model = %name, "new version serves; the old one drains and unloads");
                        "reloaded"
                    }
                    None => "loaded",
                };
                metrics::model_reload(&name, result);
                metrics::model_load(&name, self.reason.as_str());
                self.publish(&name, &md.dir, ModelState::Ready, Some(handle.clone()), None);
                self.trim(&md.folder)
                    .map(|()| handle)
                    .map_err(|short| no_room(&name, &short))
            }
            Err(reason) => Err(self.failed(&md.folder, reason).to_error(&name)),
        }
    }

    /// A load or change failed: keep the serving version if there is one.
    /// Returns the error as clients see it (paths relative to the
    /// repository). It loads again when its files change or are touched.
    pub(super) fn failed(&mut self, folder: &str, error: LoadError) -> LoadError {
        // The log keeps the full paths; what clients see (the index, API
        // answers) names files relative to the repository.
        let reason = error.message().to_string();
        let error = error.map(|m| self.relative(m));
        let shown = error.message().to_string();
        let t = self.tracked.get_mut(folder).expect("tracked before failing");
        t.refused = Some(error.clone());
        // It loads again when its files change, not on a request.
        t.cold = None;
        let t = self.tracked.get(folder).expect("tracked before failing");
        let (name, dir) = (t.name.clone(), t.dir.clone());
        metrics::model_reload(&name, "failed");
        match &t.serving {
            Some((handle, _)) => {
                tracing::error!(model = %name, folder = %dir.display(), error = %reason, "change refused; the last good version keeps serving");
                let note = format!("last change refused, serving the previous version: {shown}");
                self.publish(&name, &dir, ModelState::Ready, Some(handle.clone()), Some(note));
            }
            None => {
                tracing::error!(model = %name, folder = %dir.display(), error = %reason, "model not loaded; it loads again when its files change");
                let since = httpdate::fmt_http_date(std::time::SystemTime::now());
                let reason = format!("failed to load (since {since}): {shown}");
                self.publish(&name, &dir, ModelState::Unavailable { reason }, None, None);
            }
        }
        error
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
