//! The `[model_repository]` section: where models come from, how changes
//! are noticed, and whether the repository API may change them.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Whether the repository API may load and unload models (checked by the `access` module).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ControlMode {
    /// Refused (403): models change only through the repository's files.
    #[default]
    None,
    /// Allowed (with `auth.control_api_key`, when set).
    Api,
}

/// How changes are noticed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WatchMode {
    /// inotify (or the platform's equivalent).
    Events,
    /// Poll file metadata every `poll_interval` (network filesystems where
    /// events do not arrive). Compares each entry's size, modification time
    /// (to the nanosecond), inode and symlink target: notify's `PollWatcher`
    /// compares whole seconds only, and missed an edit made in the same
    /// second as the one before it.
    Poll,
    /// No watching: changes apply only through the repository API.
    Off,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RepositoryConfig {
    pub path: PathBuf,
    /// Serve `path` itself as this one model (KServe's `/mnt/models` layout).
    pub model_name: Option<String>,
    /// Whether the repository API may load and unload models.
    pub control: ControlMode,
    /// How changes are noticed: `events`, `poll`, or `off`.
    pub watch: WatchMode,
    /// Seconds between polls when `watch = "poll"`, or while the event watch
    /// is lost (then also the first backoff of its retries).
    pub poll_interval_seconds: f64,
    /// Seconds of quiet that end a burst of changes (one rescan per burst).
    pub debounce_seconds: f64,
    /// Server readiness also needs every model to serve: not ready while one
    /// loads or failed to load (Triton's `--strict-readiness`). Off: ready
    /// once the start-up load is done, failed models reported in the index.
    /// With `model_name` readiness is always that model's.
    pub strict_readiness: bool,
}

impl Default for RepositoryConfig {
    fn default() -> Self {
        RepositoryConfig {
            path: PathBuf::from("model-repository"),
            model_name: None,
            control: ControlMode::None,
            watch: WatchMode::Events,
            poll_interval_seconds: 2.0,
            debounce_seconds: 0.25,
            strict_readiness: false,
        }
    }
}

impl RepositoryConfig {
    /// The section's problems, each naming its key.
    pub(super) fn validate(&self, errs: &mut Vec<String>) {
        let r = self;
        if !(r.poll_interval_seconds.is_finite() && (0.05..=3600.0).contains(&r.poll_interval_seconds)) {
            errs.push(format!(
                "model_repository.poll_interval_seconds must be 0.05..=3600, got {}",
                r.poll_interval_seconds
            ));
        }
        if let Some(name) = &r.model_name {
            if let Err(e) = crate::settings::validate_model_name(name) {
                errs.push(format!("model_repository.model_name (--model-name): {e}"));
            }
        }
        if !(r.debounce_seconds.is_finite() && (0.0..=60.0).contains(&r.debounce_seconds)) {
            errs.push(format!(
                "model_repository.debounce_seconds must be 0..=60, got {}",
                r.debounce_seconds
            ));
        }
    }
}
