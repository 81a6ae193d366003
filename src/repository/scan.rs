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

/// Why the entry `dir` of the repository `root` must not be served: it
/// leads, through a symlink, outside the repository (or to the repository
/// itself). `None` when its real path is inside, or when it does not exist.
/// Only the folder is checked: files inside a model folder may be symlinks
/// to anywhere (a ConfigMap's are; an operator may share one ONNX file).
pub fn outside_repository(root: &Path, dir: &Path) -> Option<String> {
    let real = dir.canonicalize().ok()?;
    let root = root.canonicalize().ok()?;
    if real.starts_with(&root) && real != root {
        return None;
    }
    let folder = dir.file_name().unwrap_or_default().to_string_lossy();
    tracing::warn!(
        folder = %dir.display(), target = %real.display(), repository = %root.display(),
        "model folder leads outside the model repository; refused"
    );
    Some(format!(
        "model folder `{folder}` is a symlink that leads outside the model repository; refused"
    ))
}

/// Lists the model folders of `root` (sub-folders holding a
/// `model-settings.json`; hidden folders, such as a ConfigMap's `..data`, are
/// skipped, and so are symlinks that lead outside `root`), sorted by folder name.
pub fn scan(root: &Path, defaults: &ModelDefaults) -> Result<Vec<ModelDir>, String> {
    let entries = std::fs::read_dir(root).map_err(|e| format!("model repository {}: {e}", root.display()))?;
    let mut dirs = Vec::new();
    for entry in entries.flatten() {
        let dir = entry.path();
        let folder = entry.file_name().to_string_lossy().into_owned();
        if folder.starts_with('.') || !dir.is_dir() {
            continue;
        }
        if outside_repository(root, &dir).is_some() {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn symlinked_folders_must_stay_inside_the_repository() {
        let repo = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        let root = repo.path();
        std::fs::create_dir(root.join("real")).unwrap();
        std::os::unix::fs::symlink(root.join("real"), root.join("alias")).unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), root.join("out")).unwrap();
        std::os::unix::fs::symlink("..", root.join("up")).unwrap();
        std::os::unix::fs::symlink(".", root.join("itself")).unwrap();
        assert_eq!(outside_repository(root, &root.join("real")), None);
        assert_eq!(outside_repository(root, &root.join("alias")), None);
        assert_eq!(outside_repository(root, &root.join("missing")), None);
        for bad in ["out", "up", "itself"] {
            let why = outside_repository(root, &root.join(bad)).expect(bad);
            assert!(why.contains(bad) && why.contains("outside"), "{why}");
        }
        // A relative root works as well as an absolute one.
        let cwd = std::env::current_dir().unwrap();
        let rel = pathdiff(root, &cwd);
        assert!(outside_repository(&rel, &rel.join("out")).is_some());
        assert_eq!(outside_repository(&rel, &rel.join("alias")), None);
    }

    /// `path` relative to `base` (both absolute), with `..` steps.
    fn pathdiff(path: &Path, base: &Path) -> PathBuf {
        let (p, b): (Vec<_>, Vec<_>) = (path.components().collect(), base.components().collect());
        let common = p.iter().zip(&b).take_while(|(x, y)| x == y).count();
        let mut out = PathBuf::new();
        for _ in common..b.len() {
            out.push("..");
        }
        for c in &p[common..] {
            out.push(c);
        }
        out
    }
}
