//! Triton's model repository layout: a model folder with a `config.pbtxt`
//! (or none: the configuration then comes from the ONNX file, as Triton's
//! auto-complete does) and numbered version folders, `<model>/<n>/model.onnx`.
//! `config` reads the configuration, `mapping` turns it into sluice's
//! settings, and this file picks the version folder that serves.
//! Blocking file reads; no state.

pub mod config;
pub mod mapping;

use std::path::{Path, PathBuf};

use crate::protocol::grpc::inference::{model_version_policy::PolicyChoice, ModelConfig};
use crate::settings::{ModelDefaults, ModelSettings};

/// The configuration file of a Triton model folder.
pub const CONFIG_FILE: &str = "config.pbtxt";

/// The model file of a version folder when the configuration names none.
pub const DEFAULT_MODEL_FILENAME: &str = "model.onnx";

/// Whether `dir` is a Triton model folder: it holds a `config.pbtxt`, or a
/// numbered folder with an ONNX file in it.
pub fn is_model_folder(dir: &Path) -> bool {
    dir.join(CONFIG_FILE).exists()
        || !versions(dir, DEFAULT_MODEL_FILENAME)
            .unwrap_or_default()
            .is_empty()
}

/// Reads the Triton model folder `dir` (model `name`): its configuration,
/// and the settings of the version that serves (the highest selected one).
/// Messages name the file.
pub fn read_folder(dir: &Path, name: &str, defaults: &ModelDefaults) -> Result<ModelSettings, String> {
    read_versions(dir, name, defaults).map(Versions::highest)
}

/// The versions of a model folder that its `version_policy` selects, each
/// with its settings, ascending.
pub struct Versions {
    pub settings: Vec<ModelSettings>,
    /// The policy may select several (`all`, `specific`, `latest` with
    /// `num_versions` above 1): each selected version serves on its own,
    /// reached by its number. Else (Triton's default, the latest one) one
    /// version serves, and a newer folder replaces it in place.
    pub several: bool,
}

impl Versions {
    /// The settings of the highest selected version.
    pub fn highest(mut self) -> ModelSettings {
        self.settings.pop().expect("a selection is never empty")
    }
}

/// [`read_folder`], every selected version.
pub fn read_versions(dir: &Path, name: &str, defaults: &ModelDefaults) -> Result<Versions, String> {
    let file = dir.join(CONFIG_FILE);
    // Without a config.pbtxt, messages name the folder.
    let (config, shown) = match read_config(&file) {
        Ok(text) => {
            let config = config::from_text(&text).map_err(|e| format!("{}: {e}", file.display()))?;
            (config, file.display())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => (ModelConfig::default(), dir.display()),
        Err(e) => return Err(format!("{}: {e}", file.display())),
    };
    versions_for(dir, name, &config, defaults).map_err(|e| format!("{shown}: {e}"))
}

/// The settings of the highest version of `dir` that `config` selects.
pub fn settings_for(
    dir: &Path,
    name: &str,
    config: &ModelConfig,
    defaults: &ModelDefaults,
) -> Result<ModelSettings, String> {
    versions_for(dir, name, config, defaults).map(Versions::highest)
}

/// The settings of each version of `dir` that `config` selects (what a
/// model-control `load` with a configuration override also reads).
pub fn versions_for(
    dir: &Path,
    name: &str,
    config: &ModelConfig,
    defaults: &ModelDefaults,
) -> Result<Versions, String> {
    let filename = match config.default_model_filename.as_str() {
        "" => DEFAULT_MODEL_FILENAME,
        f => crate::settings::in_folder("default_model_filename", f)?,
    };
    // An ensemble's version folders hold no file (Triton's are empty).
    let filename = match config.platform == mapping::ensemble::PLATFORM {
        true => "",
        false => filename,
    };
    let on_disk = versions(dir, filename).map_err(|e| e.to_string())?;
    let chosen = select(&on_disk, config)?;
    if chosen.is_empty() {
        let found: Vec<String> = on_disk.iter().map(u64::to_string).collect();
        return Err(match found.is_empty() {
            true if filename.is_empty() => "no version folder: an ensemble needs an (empty) folder `1/`".into(),
            true => format!("no version folder holds `{filename}`: put the model at `1/{filename}`"),
            false => format!(
                "`version_policy` selects none of the versions on disk ({}); change `version_policy` or add the version",
                found.join(", ")
            ),
        });
    }
    let mut labels = std::collections::BTreeMap::new();
    for o in config.output.iter().filter(|o| !o.label_filename.is_empty()) {
        let field = format!("output `{}`: label_filename", o.name);
        let file = dir.join(crate::settings::in_folder(&field, &o.label_filename)?);
        let text = read_config(&file)
            .map_err(|e| format!("output `{}`: label_filename `{}`: {e}", o.name, o.label_filename))?;
        let lines: Vec<String> = text.lines().map(str::to_string).collect();
        labels.insert(o.name.clone(), std::sync::Arc::new(lines));
    }
    let settings = chosen
        .iter()
        .map(|version| {
            let uri = PathBuf::from(version.to_string()).join(filename);
            let mut settings = mapping::settings(config, name, &version.to_string(), &uri, defaults)?;
            settings.labels = labels.clone();
            Ok(settings)
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok(Versions {
        settings,
        several: several(config),
    })
}

/// Whether `config`'s `version_policy` may select more than one version.
fn several(config: &ModelConfig) -> bool {
    match config
        .version_policy
        .as_ref()
        .and_then(|p| p.policy_choice.as_ref())
    {
        None => false,
        Some(PolicyChoice::Latest(l)) => l.num_versions > 1,
        Some(PolicyChoice::All(_) | PolicyChoice::Specific(_)) => true,
    }
}

/// A `config.pbtxt`'s text; one over 4 MiB is refused (Triton's are a few KiB).
fn read_config(file: &Path) -> std::io::Result<String> {
    const LIMIT: u64 = 4 << 20;
    let meta = std::fs::metadata(file)?;
    if !meta.is_file() || meta.len() > LIMIT {
        return Err(std::io::Error::other(format!(
            "not a regular file of at most {} MiB",
            LIMIT >> 20
        )));
    }
    std::fs::read_to_string(file)
}

/// The numbered folders of `dir` holding `filename`, ascending.
fn versions(dir: &Path, filename: &str) -> std::io::Result<Vec<u64>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        // Triton's versions are positive integers with no sign or padding.
        let v = name.parse::<u64>().ok();
        let Some(v) = v.filter(|v| *v != 0 && !name.starts_with('0') && !name.starts_with('+')) else {
            if !name.starts_with('.') && entry.path().is_dir() {
                not_a_version(&entry.path());
            }
            continue;
        };
        if filename.is_empty() && entry.path().is_dir()
            || !filename.is_empty() && entry.path().join(filename).exists()
        {
            out.push(v);
        }
    }
    out.sort_unstable();
    Ok(out)
}

/// Says once per folder that it is not a version: Triton's versions are
/// folders named by a positive integer, and an operator who wrote `v1` or
/// `01` should learn why it is not served. Once: the repository is scanned
/// again at every change.
fn not_a_version(path: &Path) {
    static SAID: std::sync::Mutex<Option<std::collections::HashSet<std::path::PathBuf>>> =
        std::sync::Mutex::new(None);
    let mut said = SAID.lock().unwrap_or_else(|e| e.into_inner());
    if said
        .get_or_insert_with(Default::default)
        .insert(path.to_path_buf())
    {
        tracing::warn!(
            folder = %path.display(),
            "not a version folder (a version is a positive integer with no sign or leading zero, e.g. `1`); skipped"
        );
    }
}

/// The versions `config.version_policy` selects among `on_disk` (ascending;
/// Triton's default: the latest one).
fn select(on_disk: &[u64], config: &ModelConfig) -> Result<Vec<u64>, String> {
    let policy = config
        .version_policy
        .as_ref()
        .and_then(|p| p.policy_choice.as_ref());
    Ok(match policy {
        None => on_disk.iter().rev().take(1).copied().collect(),
        Some(PolicyChoice::Latest(l)) => {
            if l.num_versions == 0 {
                return Err("`version_policy.latest.num_versions` is 0: it must be 1 or more".into());
            }
            let mut v: Vec<u64> = on_disk
                .iter()
                .rev()
                .take(l.num_versions as usize)
                .copied()
                .collect();
            v.reverse();
            v
        }
        Some(PolicyChoice::All(_)) => on_disk.to_vec(),
        Some(PolicyChoice::Specific(s)) => {
            if s.versions.iter().any(|v| *v <= 0) {
                return Err("`version_policy.specific.versions` must be positive version numbers".into());
            }
            on_disk
                .iter()
                .copied()
                .filter(|v| s.versions.contains(&(*v as i64)))
                .collect()
        }
    })
}

#[cfg(test)]
mod tests;
