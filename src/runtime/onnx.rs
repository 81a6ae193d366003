//! ONNX Runtime behind the `Runtime` seam: the one process-wide
//! `Environment`, finding the shared library, building sessions with the
//! execution provider a model asks for (CUDA with CPU fallback under `auto`),
//! and converting tensors to and from `ort` values.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use ort::environment::Environment;
use ort::ep::{self, ArbitrarilyConfigurableExecutionProvider as _, ExecutionProvider as _};
use ort::session::builder::{GraphOptimizationLevel, PrepackedWeights, SessionBuilder};
use ort::session::RunOptions;
use ort::value::{TensorElementType, ValueType};

use super::values::{from_value, to_value};
use super::{cuda, Cancel, Device, LoadedModel, Runtime, RuntimeError, Session};
use crate::settings::{ExecutionProvider, ModelSettings};
use crate::tensor::{DataType, Signature, Tensor, TensorData, TensorSpec};

/// The ONNX Runtime release sluice is built against (`api-31`).
pub const ORT_VERSION: &str = "1.31.1";
const LIB_FILE: &str = "libonnxruntime.so.1.31.1";

/// ONNX Runtime allows one environment per process, for the process
/// lifetime: created once by [`OnnxRuntime::init`], shared by every session.
static ENVIRONMENT: OnceLock<(Environment, PathBuf)> = OnceLock::new();

/// Finds the ONNX Runtime library: the configured path, then
/// `ORT_DYLIB_PATH`, then the project's `.ort/{gpu,cpu}/` folder (looked up
/// from the working directory and from the executable's folders).
pub fn find_library(configured: Option<&Path>) -> Result<PathBuf, RuntimeError> {
    let fix = "run scripts/fetch-onnxruntime.sh, or point --onnxruntime-library / ORT_DYLIB_PATH at libonnxruntime.so.1.31.x";
    if let Some(p) = configured {
        return if p.is_file() {
            Ok(p.to_path_buf())
        } else {
            Err(RuntimeError::Library(format!(
                "ONNX Runtime library {} (from --onnxruntime-library or runtime.onnxruntime_library) does not exist; {fix}",
                p.display()
            )))
        };
    }
    if let Some(p) = std::env::var_os("ORT_DYLIB_PATH").filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(RuntimeError::Library(format!(
                "ORT_DYLIB_PATH={} does not exist; {fix}",
                p.display()
            )))
        };
    }
    let mut roots = vec![std::env::current_dir().unwrap_or_default()];
    if let Ok(exe) = std::env::current_exe() {
        roots.extend(exe.ancestors().skip(1).map(Path::to_path_buf));
    }
    roots.push(PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    for root in &roots {
        for flavour in ["gpu", "cpu"] {
            let p = root.join(".ort").join(flavour).join(LIB_FILE);
            if p.is_file() {
                return Ok(p);
            }
        }
    }
    Err(RuntimeError::Library(format!(
        "ONNX Runtime {ORT_VERSION} not found (no .ort/cpu/{LIB_FILE}); {fix}"
    )))
}

/// Session options every model gets unless its settings say otherwise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionDefaults {
    /// Intra-op threads when a model does not set `intra_op_threads` (the
    /// pool's thread budget, see `Config::default_intra_op_threads`).
    pub intra_op_threads: usize,
    /// Let intra-op threads spin while waiting for work.
    pub spinning: bool,
    /// Instances of one model share one copy of their prepacked weights.
    pub share_weights: bool,
    /// Custom-op libraries models may refer to, by name (`[runtime] op_libraries`).
    pub op_libraries: std::collections::BTreeMap<String, std::path::PathBuf>,
}

impl SessionDefaults {
    /// The defaults `[runtime]` and the pool's thread budget set.
    pub fn from_config(cfg: &crate::config::Config) -> SessionDefaults {
        SessionDefaults {
            intra_op_threads: cfg.default_intra_op_threads(),
            spinning: cfg.runtime.intra_op_spinning,
            share_weights: cfg.runtime.share_weights,
            op_libraries: cfg.runtime.op_libraries.clone(),
        }
    }
}

/// The ONNX Runtime implementation of [`Runtime`].
pub struct OnnxRuntime {
    env: &'static Environment,
    library: &'static Path,
    defaults: SessionDefaults,
}

impl OnnxRuntime {
    /// Loads the library (once per process) and creates the environment.
    /// A second call reuses the first environment.
    pub fn init(library: &Path, defaults: SessionDefaults) -> Result<OnnxRuntime, RuntimeError> {
        // Serializes the first creation: two callers racing past `get()` would
        // both create an environment, and ONNX Runtime refuses the second.
        static CREATING: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _creating = CREATING.lock().unwrap_or_else(|e| e.into_inner());
        let (env, lib) = match ENVIRONMENT.get() {
            Some(e) => e,
            None => {
                let env = ort::init_from(library)
                    .map_err(|e| {
                        RuntimeError::Library(format!(
                            "cannot load ONNX Runtime from {}: {e}; run scripts/fetch-onnxruntime.sh for {ORT_VERSION}",
                            library.display()
                        ))
                    })?
                    .with_name("sluice")
                    .with_telemetry(false)
                    .with_logger(std::sync::Arc::new(super::ort_log::forward))
                    .build()
                    .map_err(|e| RuntimeError::Library(format!("cannot create the ONNX Runtime environment: {e}")))?;
                let _ = ENVIRONMENT.set((env, library.to_path_buf()));
                ENVIRONMENT
                    .get()
                    .expect("environment was just set. This is a bug.")
            }
        };
        Ok(OnnxRuntime {
            env,
            library: lib,
            defaults,
        })
    }

    fn builder(&self, settings: &ModelSettings) -> ort::Result<SessionBuilder> {
        // The pool bounds how many batches run at once on the CPU; the
        // default intra-op threads share the cores among those batches.
        let intra = settings
            .intra_op_threads
            .unwrap_or(self.defaults.intra_op_threads.max(1));
        Ok(ort::session::Session::builder(self.env)?
            .with_optimization_level(GraphOptimizationLevel::Level3)?
            .with_intra_threads(intra)?
            .with_intra_op_spinning(self.defaults.spinning)?
            .with_log_id("sluice")?)
    }

    fn cuda_ep(settings: &ModelSettings, device: u32) -> ep::ExecutionProviderDispatch {
        let mut cuda = ep::CUDA::default().with_device_id(device as i32);
        for (key, value) in cuda::provider_options(&settings.cuda) {
            cuda = cuda.with_arbitrary_config(key, value);
        }
        cuda.build().error_on_failure()
    }

    /// One session on `device` (CUDA registration failures are errors here;
    /// the fallback decision is made by the caller).
    fn session_on(
        &self,
        path: &Path,
        settings: &ModelSettings,
        device: Device,
        shared: &Sharing,
    ) -> Result<OnnxSession, String> {
        let mut builder = self.builder(settings).map_err(|e| e.to_string())?;
        for lib in super::op_library::resolve(&settings.op_libraries, &self.defaults.op_libraries)? {
            builder = builder
                .with_operator_library(&lib)
                .map_err(|e| format!("op library {}: {e}", lib.display()))?;
        }
        // Instances of one model share one copy of their weights, and of
        // the prepacked form ONNX Runtime derives from them.
        // On a GPU each session keeps its weights in device memory: ONNX
        // Runtime cannot use host initializers there (it says so once per
        // initializer, at WARN), so only CPU sessions share.
        let (weights, prepacked) = match device {
            Device::Cpu => shared.get(),
            Device::Cuda(_) => (None, None),
        };
        if let Some(weights) = weights {
            for (name, value) in &weights.values {
                builder = builder
                    .with_initializer(name, value.clone())
                    .map_err(|e| ort::Error::<()>::from(e).to_string())?;
            }
        }
        if let Some(prepacked) = prepacked {
            builder = builder
                .with_prepacked_weights(prepacked)
                .map_err(|e| ort::Error::<()>::from(e).to_string())?;
        }
        if let Device::Cuda(id) = device {
            builder = builder
                .with_execution_providers([Self::cuda_ep(settings, id)])
                .map_err(|e| ort::Error::<()>::from(e).to_string())?;
        }
        let session = builder.commit_from_file(path).map_err(|e| e.to_string())?;
        let mut run_options = RunOptions::new().map_err(|e| format!("cannot create run options: {e}"))?;
        // Per-run messages only when asked for (`ort_log::run_messages`).
        if !super::ort_log::run_messages() {
            run_options
                .set_log_level(ort::logging::LogLevel::Fatal)
                .map_err(|e| format!("cannot set the run log level: {e}"))?;
        }
        let run_options = Arc::new(run_options);
        Ok(OnnxSession { session, run_options })
    }
}

/// A tiny model (`y = relu(x·I + 0)`, FP32[batch, 8]) that [`Runtime::prime`] loads and runs once.
const PRIMER: &[u8] = include_bytes!("primer.onnx");

impl OnnxRuntime {
    /// Loads and runs [`PRIMER`] (see [`Runtime::prime`]).
    fn prime_now(&self) {
        let path = std::env::temp_dir().join(format!("sluice-primer-{}.onnx", std::process::id()));
        let settings = ModelSettings::parse(
            r#"{"execution_provider": "cpu", "warmup": false}"#,
            "primer",
            &crate::settings::ModelDefaults::default(),
        );
        let primed = std::fs::write(&path, PRIMER)
            .map_err(|e| e.to_string())
            .and_then(|()| settings.map_err(|e| e.to_string()))
            .and_then(|s| self.load("primer", &path, &s).map_err(|e| e.to_string()))
            .and_then(|mut m| {
                let x = Tensor::new("x", vec![1, 8], TensorData::F32(vec![0.5; 8]))?;
                let (_, session) = m.sessions.first_mut().ok_or("no session")?;
                session
                    .run(&[x], &["y".into()])
                    .map(drop)
                    .map_err(|e| e.to_string())
            });
        let _ = std::fs::remove_file(&path);
        if let Err(e) = primed {
            tracing::debug!(error = %e, "could not prime ONNX Runtime; the first model loaded is charged its one-time costs");
        }
    }
}

impl Runtime for OnnxRuntime {
    fn prime(&self) {
        // The costs are the process's: once is enough, whatever number of
        // repositories (servers in one test process) start.
        static PRIMED: std::sync::Once = std::sync::Once::new();
        PRIMED.call_once(|| self.prime_now());
    }

    fn load(&self, model: &str, path: &Path, settings: &ModelSettings) -> Result<LoadedModel, RuntimeError> {
        let load_err = |message: String| RuntimeError::Load {
            path: path.display().to_string(),
            message: super::op_library::explain(message, path, &settings.op_libraries),
        };
        regular_file(path).map_err(load_err)?;
        let cuda_built = ep::CUDA::is_available().unwrap_or(false);
        let no_cuda = || {
            format!(
                "the ONNX Runtime library {} has no CUDA provider (CPU build); run scripts/fetch-onnxruntime.sh --gpu",
                self.library.display()
            )
        };
        // Decide the provider with the first instance, then place the rest.
        let devices: Vec<u32> = settings.device_ids.clone();
        let shared = Sharing::new(model, path, settings.instances, self.defaults.share_weights);
        let cpu = |why: String| {
            Ok::<_, RuntimeError>((
                self.session_on(path, settings, Device::Cpu, &shared)
                    .map_err(load_err)?,
                false,
                why,
            ))
        };
        let cuda0 = Device::Cuda(devices[0]);
        let (first, on_cuda, reason) = match settings.execution_provider {
            ExecutionProvider::Cpu => cpu("cpu (execution_provider \"cpu\")".into())?,
            ExecutionProvider::Cuda if !cuda_built => {
                return Err(RuntimeError::Provider(format!(
                    "execution_provider \"cuda\": {}",
                    no_cuda()
                )));
            }
            ExecutionProvider::Cuda => match self.session_on(path, settings, cuda0, &shared) {
                Ok(s) => (s, true, format!("{cuda0} (execution_provider \"cuda\")")),
                Err(e) => {
                    return Err(RuntimeError::Provider(format!(
                        "execution_provider \"cuda\": CUDA device {} is not usable: {}",
                        devices[0],
                        cuda::failure_cause(&e)
                    )))
                }
            },
            ExecutionProvider::Auto if !cuda_built => {
                cpu("cpu (auto: this ONNX Runtime build has no CUDA provider)".into())?
            }
            ExecutionProvider::Auto => match self.session_on(path, settings, cuda0, &shared) {
                Ok(s) => (s, true, format!("{cuda0} (auto: CUDA is usable)")),
                Err(e) => cpu(format!(
                    "cpu (auto: CUDA device {} is not usable: {})",
                    devices[0],
                    cuda::failure_cause(&e)
                ))?,
            },
        };
        let signature = signature_of(&first.session)
            .map_err(|e| RuntimeError::Unsupported(format!("model `{model}`: {e}")))?;
        let device_of = |i: usize| {
            if on_cuda {
                Device::Cuda(devices[i % devices.len()])
            } else {
                Device::Cpu
            }
        };
        let mut sessions: Vec<(Device, Box<dyn Session>)> = vec![(device_of(0), Box::new(first))];
        for i in 1..settings.instances {
            let s = self
                .session_on(path, settings, device_of(i), &shared)
                .map_err(load_err)?;
            sessions.push((device_of(i), Box::new(s)));
        }
        Ok(LoadedModel {
            signature,
            sessions,
            provider_reason: reason,
            weights_bytes: super::weights::size(path).map_err(load_err)?,
        })
    }
}

/// Only a regular file (symlinks followed) reaches ONNX Runtime: a FIFO or
/// a device would block or never end its read.
fn regular_file(path: &Path) -> Result<(), String> {
    match std::fs::metadata(path) {
        Ok(m) if m.file_type().is_file() => Ok(()),
        Ok(_) => Err("not a regular file (a FIFO, device, socket or folder); refused".into()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err("file not found".into()),
        Err(e) => Err(e.to_string()),
    }
}

fn dtype_of(ty: TensorElementType) -> Option<DataType> {
    Some(match ty {
        TensorElementType::Bool => DataType::Bool,
        TensorElementType::Uint8 => DataType::U8,
        TensorElementType::Uint16 => DataType::U16,
        TensorElementType::Uint32 => DataType::U32,
        TensorElementType::Uint64 => DataType::U64,
        TensorElementType::Int8 => DataType::I8,
        TensorElementType::Int16 => DataType::I16,
        TensorElementType::Int32 => DataType::I32,
        TensorElementType::Int64 => DataType::I64,
        TensorElementType::Float16 => DataType::F16,
        TensorElementType::Bfloat16 => DataType::Bf16,
        TensorElementType::Float32 => DataType::F32,
        TensorElementType::Float64 => DataType::F64,
        TensorElementType::String => DataType::Bytes,
        _ => return None,
    })
}

fn spec_of(name: &str, ty: &ValueType) -> Result<TensorSpec, String> {
    match ty {
        ValueType::Tensor {
            ty,
            shape,
            dimension_symbols,
        } => {
            let dtype = dtype_of(*ty)
                .ok_or_else(|| format!("`{name}` has element type {ty}, which sluice cannot serve"))?;
            Ok(TensorSpec {
                name: name.to_string(),
                dtype,
                shape: shape.iter().map(|&d| if d < 0 { -1 } else { d }).collect(),
                // The ONNX file's `dim_param`s ("batch", "sequence"): padding goes by them.
                dim_names: dimension_symbols.iter().map(|s| s.to_string()).collect(),
            })
        }
        other => Err(format!(
            "`{name}` is a {other:?}, not a tensor; sluice serves tensor inputs and outputs only"
        )),
    }
}

fn signature_of(session: &ort::session::Session) -> Result<Signature, String> {
    let inputs = session
        .inputs()
        .iter()
        .map(|o| spec_of(o.name(), o.dtype()))
        .collect::<Result<_, _>>()?;
    let outputs = session
        .outputs()
        .iter()
        .map(|o| spec_of(o.name(), o.dtype()))
        .collect::<Result<_, _>>()?;
    Ok(Signature { inputs, outputs })
}

/// What the CPU instances of one model share (nothing when it has one
/// instance): read from the file when the first CPU session is built.
struct Sharing<'a> {
    model: &'a str,
    path: &'a Path,
    instances: usize,
    enabled: bool,
    loaded: std::sync::OnceLock<(Option<super::weights::SharedWeights>, Option<PrepackedWeights>)>,
}

impl<'a> Sharing<'a> {
    fn new(model: &'a str, path: &'a Path, instances: usize, enabled: bool) -> Sharing<'a> {
        Sharing {
            model,
            path,
            instances,
            enabled,
            loaded: std::sync::OnceLock::new(),
        }
    }

    /// The shared weights and prepacked store (loaded on the first call).
    fn get(&self) -> (Option<&super::weights::SharedWeights>, Option<&PrepackedWeights>) {
        let (weights, prepacked) = self.loaded.get_or_init(|| self.load());
        (weights.as_ref(), prepacked.as_ref())
    }

    fn load(&self) -> (Option<super::weights::SharedWeights>, Option<PrepackedWeights>) {
        let (model, instances) = (self.model, self.instances);
        if !self.enabled || instances < 2 {
            return (None, None);
        }
        let weights = match super::weights::load(self.path) {
            Ok(w) => {
                tracing::info!(
                    model,
                    instances,
                    shared_bytes = w.bytes,
                    "instances share one copy of the weights"
                );
                Some(w)
            }
            Err(e) => {
                // ONNX Runtime reports a bad file by itself; without sharing,
                // each instance keeps its own copy.
                tracing::warn!(model, error = %e, "cannot read the weights to share them");
                None
            }
        };
        (weights, Some(PrepackedWeights::new()))
    }
}

/// One `ort` session, owned by one pool thread.
struct OnnxSession {
    session: ort::session::Session,
    /// Every run of this session uses these options; the pool's shutdown
    /// path holds a clone (as a [`Cancel`]) and sets their terminate flag.
    run_options: Arc<RunOptions>,
}

/// Sets the terminate flag of a session's run options: ONNX Runtime stops
/// the run in progress between nodes and fails it, and fails later runs at once.
struct TerminateRuns(Arc<RunOptions>);

impl Cancel for TerminateRuns {
    fn cancel(&self) {
        if let Err(e) = self.0.terminate() {
            tracing::warn!(error = %e, "cannot cancel a session's run");
        }
    }
}

/// A failed run. ONNX Runtime's `INVALID_ARGUMENT` is a kernel's verdict on
/// the request's values (a token id past the vocabulary in a `Gather`, a
/// shape a `Reshape` cannot take): the client's to fix, so a 400 naming the
/// node and the value, as Triton answers it. Anything else is the server's
/// (a 500).
fn run_error(e: ort::Error) -> RuntimeError {
    match e.code() {
        ort::ErrorCode::InvalidArgument => {
            RuntimeError::InvalidInput(format!("the model rejected the input: {}", e.message()))
        }
        _ => RuntimeError::Run(e),
    }
}

impl Session for OnnxSession {
    fn run(&mut self, inputs: &[Tensor], outputs: &[String]) -> Result<Vec<Tensor>, RuntimeError> {
        let values = inputs
            .iter()
            .map(|t| Ok((t.name.as_str(), to_value(t)?)))
            .collect::<Result<Vec<_>, RuntimeError>>()?;
        let result = self
            .session
            .run_with_options(values, &self.run_options)
            .map_err(run_error)?;
        outputs
            .iter()
            .map(|name| {
                let v = result.get(name).ok_or_else(|| {
                    RuntimeError::Unsupported(format!("the session produced no output `{name}`"))
                })?;
                from_value(name, v)
            })
            .collect()
    }

    fn canceller(&self) -> Option<Arc<dyn Cancel>> {
        Some(Arc::new(TerminateRuns(self.run_options.clone())))
    }
}
