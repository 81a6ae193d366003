//! Server configuration: built-in defaults, then `config/sluice.toml` (or
//! `--config FILE`), then `SLUICE_*` environment variables, then CLI flags
//! (figment layering, SPEC §10). Every key is documented in
//! `config/sluice.toml`. `validate()` collects every problem at once and
//! converts raw numbers to typed values at this boundary, so the rest of the
//! code never sees a raw float.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use figment::providers::{Env, Format, Serialized, Toml};
use figment::Figment;
use serde::{Deserialize, Serialize};

use crate::settings::{BatchPolicyKind, ExecutionProvider, ModelDefaults};

mod env;
mod network;
mod repository;
mod residency;
mod signals;
mod telemetry;
mod tls;

pub use env::ignored_env;
pub use network::{AuthConfig, GrpcConfig, HttpConfig, HttpLimits};
pub use repository::{ControlMode, RepositoryConfig, WatchMode};
pub use residency::{Residency, ResidencyConfig, ResidencyMode};
pub use signals::{InferenceLogConfig, LogMode, MetricsConfig};
pub use telemetry::{TracingConfig, TracingExport};
pub use tls::{TlsConfig, TlsFiles};

/// Read when no `--config` is given, if it exists (relative to the working directory).
pub const DEFAULT_FILE: &str = "config/sluice.toml";

/// The whole configuration file, as written (raw values).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub http: HttpConfig,
    pub grpc: GrpcConfig,
    pub model_repository: RepositoryConfig,
    pub residency: ResidencyConfig,
    pub runtime: RuntimeConfig,
    pub model_defaults: ModelDefaultsConfig,
    pub pool: PoolConfig,
    pub shutdown: ShutdownConfig,
    pub log: LogConfig,
    pub auth: AuthConfig,
    pub tls: TlsConfig,
    pub tracing: TracingConfig,
    pub shared_memory: SharedMemoryConfig,
    pub metrics: MetricsConfig,
    pub inference_log: InferenceLogConfig,
}

/// `[shared_memory]`: Triton's system shared-memory extension.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SharedMemoryConfig {
    /// Whether clients may register system shared-memory regions. Off by
    /// default (Triton's `--allow-client-shm`): a client that may register
    /// can read and overwrite any POSIX shared-memory object the server's
    /// user can open. Off, a register is refused.
    pub enabled: bool,
    /// The most regions registered at once (each holds a file descriptor).
    pub max_regions: usize,
}

impl Default for SharedMemoryConfig {
    fn default() -> Self {
        SharedMemoryConfig {
            enabled: false,
            max_regions: 256,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// `text` (one readable line per event) or `json` (one object per line).
    pub format: LogFormat,
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// `<UTC timestamp>  INFO sluice::repository::load: model ready model=digits ...`
    #[default]
    Text,
    /// `{"timestamp": ..., "level": "INFO", "target": ..., "message": ..., "model": ...}`
    Json,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PoolConfig {
    /// Batches that may run at once on the CPU, across all models; 0 = auto.
    pub cpu_concurrent_batches: usize,
    /// Batches that may run at once on each GPU, across all models.
    pub gpu_concurrent_batches: usize,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            cpu_concurrent_batches: 0,
            gpu_concurrent_batches: 2,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RuntimeConfig {
    /// Path to `libonnxruntime.so.1.31.x`; empty = `ORT_DYLIB_PATH`, then `.ort/`.
    pub onnxruntime_library: Option<PathBuf>,
    /// Let ONNX Runtime's intra-op threads spin while waiting for work.
    pub intra_op_spinning: bool,
    /// CPU instances of one model share one copy of their weights and prepacked weights (CUDA sessions never do).
    pub share_weights: bool,
    /// ONNX Runtime custom-op libraries models may refer to, by name (`name = "/path/lib.so"`).
    pub op_libraries: std::collections::BTreeMap<String, PathBuf>,
    /// Shared libraries loaded (symbols global) before any op library, for those that need them.
    pub preload: Vec<PathBuf>,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            onnxruntime_library: None,
            intra_op_spinning: false,
            share_weights: true,
            op_libraries: Default::default(),
            preload: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelDefaultsConfig {
    pub max_batch_size: usize,
    pub max_batch_time: f64,
    pub batch_policy: BatchPolicyKind,
    pub max_queue_size: usize,
    pub timeout: f64,
    pub instances: usize,
    pub execution_provider: ExecutionProvider,
    pub intra_op_threads: Option<usize>,
    pub warmup: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ShutdownConfig {
    pub grace_period_seconds: f64,
}

impl Default for ModelDefaultsConfig {
    fn default() -> Self {
        let d = ModelDefaults::default();
        ModelDefaultsConfig {
            max_batch_size: d.max_batch_size,
            max_batch_time: d.max_batch_time.as_secs_f64(),
            batch_policy: d.batch_policy,
            max_queue_size: d.max_queue_size,
            timeout: d.timeout.as_secs_f64(),
            instances: d.instances,
            execution_provider: d.execution_provider,
            intra_op_threads: d.intra_op_threads,
            warmup: d.warmup,
        }
    }
}

impl Default for ShutdownConfig {
    fn default() -> Self {
        ShutdownConfig {
            grace_period_seconds: 30.0,
        }
    }
}

/// Overrides from the command line; `None` leaves the lower layers alone.
#[derive(Debug, Clone, Default, Serialize)]
pub struct CliOverrides {
    pub model_repository: Option<PathBuf>,
    pub log_format: Option<LogFormat>,
    pub model_name: Option<String>,
    pub host: Option<IpAddr>,
    pub http_port: Option<u16>,
    pub grpc_port: Option<u16>,
    pub onnxruntime_library: Option<PathBuf>,
}

/// A provider's values with numbers in exponent form (`1e1`, `2.5E-3`) read
/// as floats, as TOML reads them: figment's environment parser takes a float
/// only when it has a `.`, and keeps `1e1` a string no float key accepts.
struct ExponentFloats<P>(P);

impl<P: figment::Provider> figment::Provider for ExponentFloats<P> {
    fn metadata(&self) -> figment::Metadata {
        self.0.metadata()
    }

    fn data(&self) -> Result<figment::value::Map<figment::Profile, figment::value::Dict>, figment::Error> {
        use figment::value::Value;
        fn fix(v: &mut Value) {
            match v {
                Value::String(tag, text)
                    if text.contains(['e', 'E'])
                        && text.starts_with(|c: char| {
                            c.is_ascii_digit() || c == '-' || c == '+' || c == '.'
                        }) =>
                {
                    if let Some(x) = text.parse::<f64>().ok().filter(|x| x.is_finite()) {
                        *v = Value::Num(*tag, x.into());
                    }
                }
                Value::Dict(_, d) => d.values_mut().for_each(fix),
                Value::Array(_, a) => a.iter_mut().for_each(fix),
                _ => {}
            }
        }
        let mut data = self.0.data()?;
        for dict in data.values_mut() {
            dict.values_mut().for_each(fix);
        }
        Ok(data)
    }
}

/// The largest `http.max_body_bytes` and `grpc.max_message_bytes` (4 GiB;
/// a protobuf message cannot be larger).
pub const MAX_MESSAGE_BYTES: usize = 4 << 30;

impl Config {
    /// Layers defaults, the config file, `SLUICE_*` variables and CLI flags.
    ///
    /// `file`: an explicit `--config` (must exist) or `None` for
    /// `config/sluice.toml` if it exists.
    pub fn load(file: Option<&Path>, cli: &CliOverrides) -> Result<Config, String> {
        let mut fig = Figment::new().merge(Serialized::defaults(Config::default()));
        match file {
            Some(f) if !f.is_file() => return Err(format!("config file {} does not exist", f.display())),
            Some(f) => fig = fig.merge(Toml::file_exact(f)),
            // The default file is optional: without it, defaults and env apply.
            None if Path::new(DEFAULT_FILE).is_file() => fig = fig.merge(Toml::file_exact(DEFAULT_FILE)),
            None => {}
        }
        fig = fig
            // Nested keys with a double underscore: SLUICE_HTTP__PORT=9000.
            // Every key is in a section, so a variable without one is not
            // configuration (see [`env::ignored_env`]).
            .merge(ExponentFloats(
                Env::prefixed("SLUICE_")
                    .filter(|k| k.as_str().contains("__"))
                    .split("__"),
            ))
            // MLServer-style global overrides (MLSERVER_MODEL_MAX_BATCH_SIZE there).
            .merge(
                Env::raw()
                    .only(&["SLUICE_MODEL_MAX_BATCH_SIZE", "SLUICE_MODEL_MAX_BATCH_TIME"])
                    .map(|k| match k.as_str() {
                        "SLUICE_MODEL_MAX_BATCH_SIZE" => "model_defaults.max_batch_size".into(),
                        _ => "model_defaults.max_batch_time".into(),
                    }),
            );
        let mut cfg: Config = fig.extract().map_err(|e| format!("configuration: {e}"))?;
        if let Some(p) = &cli.model_repository {
            cfg.model_repository.path = p.clone();
        }
        if let Some(f) = cli.log_format {
            cfg.log.format = f;
        }
        if let Some(n) = &cli.model_name {
            cfg.model_repository.model_name = Some(n.clone());
        }
        if let Some(h) = cli.host {
            cfg.http.host = h;
        }
        if let Some(p) = cli.http_port {
            cfg.http.port = p;
        }
        if let Some(p) = cli.grpc_port {
            cfg.grpc.port = p;
        }
        if let Some(p) = &cli.onnxruntime_library {
            cfg.runtime.onnxruntime_library = Some(p.clone());
        }
        Ok(cfg)
    }

    /// Checks every value; returns all problems, each naming its key.
    pub fn validate(&self) -> Result<(), Vec<String>> {
        let mut errs = Vec::new();
        self.model_defaults.validate(&mut errs);
        if self.pool.cpu_concurrent_batches > 1024 || !(1..=64).contains(&self.pool.gpu_concurrent_batches) {
            errs.push(format!(
                "pool.cpu_concurrent_batches must be 0..=1024 and pool.gpu_concurrent_batches 1..=64, got {} and {}",
                self.pool.cpu_concurrent_batches, self.pool.gpu_concurrent_batches
            ));
        }
        self.model_repository.validate(&mut errs);
        self.residency.validate(&mut errs);
        // A request larger than 4 GiB is no request an inference client
        // sends, and its decoded tensors would be several times that.
        if !(1024..=MAX_MESSAGE_BYTES).contains(&self.http.max_body_bytes) {
            errs.push(format!(
                "http.max_body_bytes must be 1024..={MAX_MESSAGE_BYTES} (4 GiB), got {}",
                self.http.max_body_bytes
            ));
        }
        self.http.validate(&mut errs);
        self.tls.validate(&mut errs);
        self.tracing.validate(&mut errs);
        if let Err(e) = self.inference_log.validate() {
            errs.push(e);
        }
        self.grpc.validate(&mut errs);
        if !(1..=65536).contains(&self.grpc.max_outstanding_per_stream) {
            errs.push(format!(
                "grpc.max_outstanding_per_stream must be 1..=65536, got {}",
                self.grpc.max_outstanding_per_stream
            ));
        }
        if !(1024..=MAX_MESSAGE_BYTES).contains(&self.grpc.max_message_bytes) {
            errs.push(format!(
                "grpc.max_message_bytes must be 1024..={MAX_MESSAGE_BYTES} (4 GiB), got {}",
                self.grpc.max_message_bytes
            ));
        }
        let g = self.shutdown.grace_period_seconds;
        if !(g.is_finite() && (0.0..=3600.0).contains(&g)) {
            errs.push(format!("shutdown.grace_period_seconds must be 0..=3600, got {g}"));
        }
        if errs.is_empty() {
            Ok(())
        } else {
            Err(errs)
        }
    }

    /// The validated HTTP limits. Call after [`Config::validate`].
    pub fn http_limits(&self) -> HttpLimits {
        self.http.limits()
    }

    /// The validated per-model defaults. Call after [`Config::validate`].
    pub fn model_defaults(&self) -> ModelDefaults {
        let d = &self.model_defaults;
        ModelDefaults {
            max_batch_size: d.max_batch_size,
            max_batch_time: Duration::from_secs_f64(d.max_batch_time),
            batch_policy: d.batch_policy,
            max_queue_size: d.max_queue_size,
            timeout: Duration::from_secs_f64(d.timeout),
            instances: d.instances,
            execution_provider: d.execution_provider,
            intra_op_threads: d.intra_op_threads,
            warmup: d.warmup,
        }
    }

    /// Batches that may run at once on the CPU: the configured value, or
    /// half the cores (at least 1), since two intra-op threads per session is
    /// where ONNX Runtime's per-batch speed-up flattens on small models.
    pub fn cpu_concurrent_batches(&self) -> usize {
        match self.pool.cpu_concurrent_batches {
            0 => (cores() / 2).max(1),
            n => n,
        }
    }

    /// Intra-op threads of a session whose model does not set
    /// `intra_op_threads`: the cores shared out among the batches that may
    /// run at once, so concurrently running sessions never oversubscribe.
    pub fn default_intra_op_threads(&self) -> usize {
        (cores() / self.cpu_concurrent_batches()).max(1)
    }

    pub fn grace_period(&self) -> Duration {
        Duration::from_secs_f64(self.shutdown.grace_period_seconds)
    }
}

/// Cores this process may use.
pub fn cores() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

impl ModelDefaultsConfig {
    /// Checks each default; a problem names its key.
    fn validate(&self, errs: &mut Vec<String>) {
        let d = self;
        if d.max_batch_size > 65536 {
            errs.push(format!(
                "model_defaults.max_batch_size must be 0..=65536, got {}",
                d.max_batch_size
            ));
        }
        if !(d.max_batch_time.is_finite() && (0.0..=60.0).contains(&d.max_batch_time)) {
            errs.push(format!(
                "model_defaults.max_batch_time must be 0..=60 seconds, got {}",
                d.max_batch_time
            ));
        }
        if !(1..=1_000_000).contains(&d.max_queue_size) {
            errs.push(format!(
                "model_defaults.max_queue_size must be 1..=1000000, got {}",
                d.max_queue_size
            ));
        }
        if !(d.timeout.is_finite() && d.timeout > 0.0 && d.timeout <= 86400.0) {
            errs.push(format!(
                "model_defaults.timeout must be > 0 and <= 86400 seconds, got {}",
                d.timeout
            ));
        }
        if !(1..=64).contains(&d.instances) {
            errs.push(format!(
                "model_defaults.instances must be 1..=64, got {}",
                d.instances
            ));
        }
        if let Some(t) = d.intra_op_threads {
            if !(1..=1024).contains(&t) {
                errs.push(format!(
                    "model_defaults.intra_op_threads must be 1..=1024, got {t}"
                ));
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::result_large_err)] // figment::Jail's closures return figment::Error
mod tests;
