//! A model's lifecycle state (Triton's `ModelReadyState`).

use std::fmt;

/// Where a model is in its lifecycle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelState {
    /// Sessions are being built or warmed up; inference is refused (503).
    Loading,
    /// Serving; inference allowed.
    Ready,
    /// Failed to load (or was unloaded); inference refused (503), `reason` says why.
    Unavailable { reason: String },
    /// Draining before unload: accepted requests finish, new ones are refused.
    Unloading,
    /// Not loaded, to leave memory to others (`[residency]`): its next
    /// request loads it. Triton's index calls it `UNAVAILABLE`.
    OnDisk,
}

/// The `reason` of a model that is not resident.
pub const ON_DISK: &str = "not resident (residency): its next request loads it";

impl ModelState {
    /// The repository-index name (`READY`, `LOADING`, ...), as Triton spells it.
    pub fn as_str(&self) -> &'static str {
        match self {
            ModelState::Loading => "LOADING",
            ModelState::Ready => "READY",
            ModelState::Unavailable { .. } | ModelState::OnDisk => "UNAVAILABLE",
            ModelState::Unloading => "UNLOADING",
        }
    }

    /// Why the model is not ready, if it is not.
    pub fn reason(&self) -> Option<&str> {
        match self {
            ModelState::Ready => None,
            ModelState::Loading => Some("loading"),
            ModelState::Unavailable { reason } => Some(reason),
            ModelState::Unloading => Some("unloading"),
            ModelState::OnDisk => Some(ON_DISK),
        }
    }
}

impl fmt::Display for ModelState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.reason() {
            Some(r) if !matches!(self, ModelState::Loading | ModelState::Unloading) => {
                write!(f, "{}: {r}", self.as_str())
            }
            _ => f.write_str(self.as_str()),
        }
    }
}
