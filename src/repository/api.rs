//! The repository API's commands (`/v2/repository/models/{name}/load` and
//! `.../unload`, and their gRPC twins), run by the repository task like a
//! rescan: a load brings the named folder up to date and answers with what
//! happened to it; an unload pins the model unloaded until the next load.

use super::diff::Stamp;
use super::lifecycle::Event;
use super::scan::{self, ModelDir};
use super::{blocking, Repository};
use crate::error::Error;
use crate::metrics;
use crate::model::state::ModelState;
use crate::settings::validate_model_name;

impl Repository {
    pub(super) async fn api_load(&mut self, name: &str, config: Option<String>) -> Result<(), Error> {
        let config = match config {
            None => None,
            Some(json) => Some(crate::triton::config::from_json(&json).map_err(|e| {
                Error::invalid(format!(
                    "failed to load '{name}': the `config` parameter is not a model configuration: {e}"
                ))
            })?),
        };
        check_name(name)?;
        // The override stands in for the folder's configuration from now on;
        // a load without one goes back to the folder's own. Kept by folder,
        // as the scan reads them: a model's name may differ from its folder's.
        let folder = self
            .tracked
            .values()
            .find(|t| t.name == name)
            .and_then(|t| Some(t.dir.file_name()?.to_string_lossy().into_owned()))
            .unwrap_or_else(|| name.to_string());
        match config {
            Some(c) => self.overrides.insert(folder, c),
            None => self.overrides.remove(&folder),
        };
        // Every version the folder's policy selects (one, usually).
        let found = self.find_folder(name).await?;
        let keys: Vec<String> = found.iter().map(|(md, _)| md.folder.clone()).collect();
        let dir = found.first().map(|(md, _)| md.dir.clone());
        let stale: Vec<String> = self
            .tracked
            .values()
            .filter(|t| Some(&t.dir) == dir.as_ref() && !keys.contains(&t.folder))
            .map(|t| t.folder.clone())
            .collect();
        // What refused a load that left nothing refused behind: no room
        // under the residency budgets (the model stays on disk).
        let mut no_room = None;
        for (md, now) in found {
            let force = self
                .tracked
                .get(&md.folder)
                .is_some_and(|t| t.phase.serving().is_none());
            if let Err(e) = self.apply(md, now, force).await {
                no_room.get_or_insert(e);
            }
        }
        for key in stale {
            self.remove(&key);
        }
        for key in keys {
            let t = self
                .tracked
                .get(&key)
                .ok_or_else(|| Error::NotFound(format!("model `{name}`: not loaded")))?;
            if let Some(refused) = t.phase.refused() {
                return Err(refused.to_error(name));
            }
            match self.registry.entry(&t.name, &key) {
                Some(e) if e.state == ModelState::Ready => {}
                Some(e) if e.state == ModelState::OnDisk && no_room.is_some() => {
                    return Err(no_room.take().expect("checked"));
                }
                Some(e) => {
                    return Err(Error::invalid(format!(
                        "model `{name}` failed to load: {}",
                        e.state
                    )))
                }
                None => {
                    return Err(Error::NotFound(format!(
                        "model `{name}` not found in the repository"
                    )))
                }
            }
        }
        Ok(())
    }

    pub(super) fn api_unload(&mut self, name: &str) -> Result<(), Error> {
        check_name(name)?;
        let keys: Vec<String> = self
            .tracked
            .values()
            .filter(|t| t.name == name)
            .map(|t| t.folder.clone())
            .collect();
        if keys.is_empty() {
            return Err(Error::ModelNotFound(crate::error::clip(name).into_owned()));
        }
        tracing::info!(model = %name, "unloaded through the repository API; accepted requests finish first");
        metrics::model_reload(name, "unloaded");
        for key in keys {
            self.transition(&key, Event::ApiUnload);
        }
        Ok(())
    }

    /// The folder holding model `name`, as seen now: refuses names that are
    /// not a plain folder of the repository (`..`, `/`, absolute paths,
    /// symlinks out).
    async fn find_folder(&self, name: &str) -> Result<Vec<(ModelDir, Stamp)>, Error> {
        check_name(name)?;
        let (root, dir) = (self.root.clone(), self.root.join(name));
        let outside = blocking(move || Ok(scan::outside_repository(&root, &dir)));
        if let Some(why) = outside.await.map_err(Error::invalid)? {
            return Err(Error::invalid(why));
        }
        // A folder whose settings cannot be read is found by its model's last name.
        let tracked = self
            .tracked
            .values()
            .find(|t| t.name == name)
            .map(|t| t.folder.clone());
        let wanted = name.to_string();
        let found = self
            .survey(move |d| d.name() == wanted || d.folder == wanted || Some(&d.folder) == tracked.as_ref())
            .await
            .map_err(Error::invalid)?;
        if found.is_empty() {
            return Err(Error::NotFound(format!(
                "failed to load '{name}': no folder of the repository holds it"
            )));
        }
        Ok(self.keep_versions_serving(found))
    }
}

/// The parameters of a load request: `config` (a model configuration, JSON,
/// that stands in for the folder's own) is returned; `file:<path>` (model
/// files sent in the request) is refused: sluice serves the files on disk,
/// and the repository folder is the one place a model's files are written.
/// Other parameters are ignored, as Triton ignores the ones it does not know.
pub fn load_parameters<'a>(
    name: &str,
    params: impl IntoIterator<Item = (&'a str, Option<&'a str>)>,
) -> Result<Option<String>, Error> {
    let mut config = None;
    for (key, value) in params {
        if key.starts_with("file:") {
            return Err(Error::invalid(format!(
                "failed to load '{}': parameter `{key}` (model files sent with the request) is not supported: \
                 sluice serves the files of the repository folder; write them there, then load",
                crate::error::clip(name)
            )));
        }
        if key == "config" {
            let Some(json) = value else {
                return Err(Error::invalid(format!(
                    "failed to load '{}': parameter `config` must be a string holding the model configuration as JSON",
                    crate::error::clip(name)
                )));
            };
            config = Some(json.to_string());
        }
    }
    Ok(config)
}

/// A repository API name must be a plain model name, not a path.
fn check_name(name: &str) -> Result<(), Error> {
    validate_model_name(name).map_err(|e| {
        Error::invalid(format!(
            "`{}` is not a model name of this repository: {e}",
            crate::error::clip(name)
        ))
    })?;
    if name == "." || name == ".." {
        return Err(Error::invalid(format!(
            "`{name}` is not a model name of this repository"
        )));
    }
    Ok(())
}
