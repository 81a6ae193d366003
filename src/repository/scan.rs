//! Finding model folders in the repository and reading their settings.

use std::path::{Path, PathBuf};

use crate::model::settings::{ModelDefaults, ModelSettings};

/// The settings file every model folder holds.
pub const SETTINGS_FILE: &str = "model-settings.json";

/// A model folder found by [`scan`].
pub struct ModelDir {
    /// The folder's name (the default model name).
    pub folder: String,
    pub dir: PathBuf,
    /// Parsed settings, or why they are unusable (the message names the file).
    pub settings: Result<ModelSettings, String>,
}

impl ModelDir {
    /// The model's name: from its settings, else the folder name.
    pub fn name(&self) -> &str {
        self.settings
            .as_ref()
            .map(|s| s.name.as_str())
            .unwrap_or(&self.folder)
    }
}

/// Reads and validates `dir/model-settings.json`.
pub fn read_settings(dir: &Path, defaults: &ModelDefaults) -> Result<ModelSettings, String> {
    let file = dir.join(SETTINGS_FILE);
    let folder = dir
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default();
    let text = std::fs::read_to_string(&file).map_err(|e| format!("{}: {e}", file.display()))?;
    ModelSettings::parse(&text, &folder, defaults).map_err(|e| format!("{}: {e}", file.display()))
}

/// Lists the model folders of `root` (sub-folders holding a
/// `model-settings.json`; hidden folders, such as a ConfigMap's `..data`, are
/// skipped), sorted by folder name.
pub fn scan(root: &Path, defaults: &ModelDefaults) -> Result<Vec<ModelDir>, String> {
    let entries = std::fs::read_dir(root).map_err(|e| format!("model repository {}: {e}", root.display()))?;
    let mut dirs = Vec::new();
    for entry in entries.flatten() {
        let dir = entry.path();
        let folder = entry.file_name().to_string_lossy().into_owned();
        if folder.starts_with('.') || !dir.is_dir() {
            continue;
        }
        if !dir.join(SETTINGS_FILE).is_file() {
            tracing::warn!(folder = %dir.display(), "skipping folder without {SETTINGS_FILE}");
            continue;
        }
        let settings = read_settings(&dir, defaults);
        dirs.push(ModelDir {
            folder,
            dir,
            settings,
        });
    }
    dirs.sort_by(|a, b| a.folder.cmp(&b.folder));
    Ok(dirs)
}
