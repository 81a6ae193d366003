//! The seam between sluice and an inference engine. `Runtime` loads a model
//! into sessions; a `Session` runs one batch. The real implementation is
//! ONNX Runtime (`runtime::onnx`); unit tests use a fake behind the same
//! traits. Sessions are blocking: they run on the pool's dedicated OS
//! threads, never on the async runtime.

pub mod cuda;
pub mod device_memory;
pub mod onnx;
pub mod op_library;
pub mod ort_log;
mod values;
pub mod weights;

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use crate::settings::ModelSettings;
use crate::tensor::{Signature, Tensor};

/// Where a model's sessions run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Device {
    Cpu,
    Cuda(u32),
}

impl Device {
    /// True for a CUDA device.
    pub fn is_cuda(self) -> bool {
        matches!(self, Device::Cuda(_))
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(id) => write!(f, "cuda:{id}"),
        }
    }
}

/// The process's resident memory in bytes (0 where /proc is not readable).
pub fn resident_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    // SAFETY: sysconf only reads a system constant.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    pages * u64::try_from(page).unwrap_or(4096)
}

/// Gives the heap's free pages back to the system (glibc keeps them after
/// a model is dropped), so that the next reading of [`resident_bytes`]
/// shows what the loaded models hold, not what unloaded ones left behind.
pub fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks and trims the allocator's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// A model loaded into `instances` sessions.
pub struct LoadedModel {
    /// Inputs and outputs as the ONNX file declares them.
    pub signature: Signature,
    /// One session per instance, each with the device it runs on.
    pub sessions: Vec<(Device, Box<dyn Session>)>,
    /// Why the provider was chosen (logged once per load).
    pub provider_reason: String,
    /// Bytes of the weights (initializers) in the ONNX file.
    pub weights_bytes: u64,
}

/// Loads models. Shared by every model; cheap to call from a blocking thread.
pub trait Runtime: Send + Sync + 'static {
    /// Builds `settings.instances` sessions for the ONNX file at `path`.
    /// Blocking: call it from `spawn_blocking` or a dedicated thread.
    fn load(&self, model: &str, path: &Path, settings: &ModelSettings) -> Result<LoadedModel, RuntimeError>;

    /// Brings the runtime's one-time costs (its code paged in, its global
    /// state) into the process before the first model is measured, so that
    /// model is not charged them (`sluice_model_memory_bytes`, residency).
    /// Blocking.
    fn prime(&self) {}
}

/// One ONNX Runtime session (not thread-safe: one thread runs it at a time).
pub trait Session: Send + 'static {
    /// Runs `inputs` (in signature order, already validated) and returns the
    /// outputs named in `outputs`, in that order.
    fn run(&mut self, inputs: &[Tensor], outputs: &[String]) -> Result<Vec<Tensor>, RuntimeError>;

    /// A handle that cancels this session's runs from another thread (the
    /// shutdown path, once the grace period is over); `None`: its runs
    /// cannot be cancelled and are waited for.
    fn canceller(&self) -> Option<Arc<dyn Cancel>> {
        None
    }
}

/// Cancels a session's runs from another thread.
pub trait Cancel: Send + Sync {
    /// Makes the session's run in progress, and every later one, stop early
    /// with an error.
    fn cancel(&self);
}

/// What went wrong inside the runtime.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The ONNX Runtime library could not be found or loaded.
    #[error("{0}")]
    Library(String),
    /// The model file could not be turned into a session.
    #[error("cannot load {path}: {message}")]
    Load { path: String, message: String },
    /// The model declares something sluice cannot serve (e.g. a map output).
    #[error("{0}")]
    Unsupported(String),
    /// The requested execution provider is not usable on this machine.
    #[error("{0}")]
    Provider(String),
    /// An input value ONNX Runtime cannot take (e.g. non-UTF-8 BYTES).
    #[error("{0}")]
    InvalidInput(String),
    /// `Session::run` failed.
    #[error("{0}")]
    Run(#[source] ort::Error),
    /// `Session::run` panicked (a bug below sluice's code): the batch fails,
    /// the session and its thread go on.
    #[error("the session panicked while running the batch: {0}")]
    Panicked(String),
}
