//! Building one version of a model: settings → ONNX Runtime sessions →
//! warm-up on every session → batcher → handle. Runs beside the version that
//! serves; nothing here touches the registry.

use std::sync::Arc;
use std::time::Instant;

use super::warm;
use crate::batcher::{layout, Batcher, Batching, Layout, Padding};
use crate::error::error_chain;
use crate::error::Error;
use crate::model::{DeviceBytes, Memory, ModelHandle};
use crate::pool::Pool;
use crate::runtime::{device_memory, Device, Runtime, RuntimeError};
use crate::settings::{ExecutionProvider, ModelSettings};
use crate::tensor::Signature;

/// Why a version of a model could not be loaded, by what it takes to fix it
/// (the repository API answers with the matching status).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoadError {
    /// The operator's files: settings, the ONNX file, a declared signature (400).
    Files(String),
    /// The execution provider cannot be had on this machine (503).
    Provider(String),
    /// A crash inside sluice or ONNX Runtime while loading (500).
    Internal(String),
    /// The residency budgets can never hold it: a pinned model that does not
    /// fit beside the other pinned ones, or one larger than a whole budget (503).
    NoRoom(String),
}

impl LoadError {
    /// The message, naming what failed.
    pub fn message(&self) -> &str {
        match self {
            LoadError::Files(m) | LoadError::Provider(m) | LoadError::Internal(m) | LoadError::NoRoom(m) => m,
        }
    }

    /// The same error with its message rewritten (e.g. paths made relative).
    pub fn map(self, f: impl FnOnce(&str) -> String) -> LoadError {
        match &self {
            LoadError::Files(m) => LoadError::Files(f(m)),
            LoadError::Provider(m) => LoadError::Provider(f(m)),
            LoadError::Internal(m) => LoadError::Internal(f(m)),
            LoadError::NoRoom(m) => LoadError::NoRoom(f(m)),
        }
    }

    /// What the repository API answers for model `name`.
    pub fn to_error(&self, name: &str) -> Error {
        let msg = format!("model `{name}` failed to load: {}", self.message());
        match self {
            LoadError::Files(_) => Error::InvalidInput(msg),
            LoadError::Provider(m) | LoadError::NoRoom(m) => Error::ModelNotReady {
                name: name.to_string(),
                reason: m.clone(),
            },
            LoadError::Internal(_) => Error::Internal(msg),
        }
    }
}

impl From<RuntimeError> for LoadError {
    fn from(e: RuntimeError) -> Self {
        match &e {
            RuntimeError::Provider(_) => LoadError::Provider(error_chain(&e)),
            RuntimeError::Library(_) | RuntimeError::Run(_) | RuntimeError::Panicked(_) => {
                LoadError::Internal(error_chain(&e))
            }
            _ => LoadError::Files(error_chain(&e)),
        }
    }
}

/// Loads `settings` from the folder `dir` into a new, warmed-up version.
/// The error names what failed (file, provider). A warm-up the model
/// rejects is a warning: the version serves cold.
pub async fn build(
    runtime: &Arc<dyn Runtime>,
    pool: &Pool,
    name: &str,
    dir: &std::path::Path,
    mut settings: ModelSettings,
    steps: crate::model::pipeline::Steps,
) -> Result<ModelHandle, LoadError> {
    if super::pipeline::without_file(&settings) {
        return super::pipeline::build(pool, name, dir, settings, steps);
    }
    let path = dir.join(&settings.uri);
    let rt = runtime.clone();
    let (n, p, s) = (name.to_string(), path.clone(), settings.clone());
    // Each CUDA device's memory in use before the load (empty on the CPU).
    // The first reading creates the CUDA context; host memory is read after
    // it, so that the context's host pages are not charged to this model.
    let maybe_gpu = settings.execution_provider != ExecutionProvider::Cpu;
    let (mut loaded, gpu_before, resident_before) = tokio::task::spawn_blocking(move || {
        let before = if maybe_gpu {
            device_memory::used_per_device()
        } else {
            Vec::new()
        };
        crate::runtime::release_free_memory();
        let resident = crate::runtime::resident_bytes();
        rt.load(&n, &p, &s).map(|l| (l, before, resident))
    })
    .await
    .map_err(|e| LoadError::Internal(format!("loading {} panicked: {e}", path.display())))??;
    let Checked { padding, layout } = check_loaded(name, &mut settings, &loaded.signature)?;
    read_initial_states(&mut settings, dir, &loaded.signature)?;
    let devices: Vec<Device> = loaded.sessions.iter().map(|(d, _)| *d).collect();
    let outputs: Vec<String> = loaded.signature.outputs.iter().map(|o| o.name.clone()).collect();
    let started = Instant::now();
    let padded = padding.as_ref().map(|p| p.symbols().join(","));
    let warmed = warm::warm(name, dir, pool, &settings, padding.as_ref(), &mut loaded, layout).await?;
    let batching_log = match &warmed.layout {
        Ok(l) => format!("on, {}", l.describe(&loaded.signature)),
        Err(why) => format!("off ({why})"),
    };
    let batching = Batching::new(name, &loaded.signature, warmed.layout);
    let workers = Arc::new(warmed.workers);
    let batcher = Batcher::spawn(
        name,
        settings.version.as_deref(),
        settings.batching,
        workers,
        outputs,
        padding,
        batching,
    );
    // The padded dims, and the bound the batcher enforces (its device's default when unset).
    let padded =
        padded.map(|dims| format!("{dims} (max_padding_ratio {})", batcher.settings().max_padding()));
    let device_bytes = device_growth(&gpu_before, &devices).await;
    // What warm-up allocated and freed is not the model's.
    crate::runtime::release_free_memory();
    let memory = Memory {
        host_bytes: crate::runtime::resident_bytes().saturating_sub(resident_before),
        weights_bytes: loaded.weights_bytes,
        device_bytes,
    };
    tracing::info!(
        model = %name,
        version = settings.version.as_deref().unwrap_or("-"),
        devices = %devices.iter().map(Device::to_string).collect::<Vec<_>>().join(","),
        provider = %loaded.provider_reason,
        inputs = %describe(&loaded.signature.inputs),
        outputs = %describe(&loaded.signature.outputs),
        batching = %batching_log,
        max_batch_size = settings.batching.max_batch_size,
        policy = ?settings.batching.policy,
        padded = padded.as_deref().unwrap_or("-"),
        warmup = ?started.elapsed(),
        host_bytes = memory.host_bytes,
        weights_bytes = memory.weights_bytes,
        "model ready"
    );
    let budget = steps.budget.clone();
    let pipeline = match settings.pipeline.is_some() {
        true => Some(super::pipeline::pipeline(
            dir,
            &settings,
            Some(&loaded.signature),
            steps,
        )?),
        false => None,
    };
    let mut handle = ModelHandle::new(
        name.to_string(),
        settings,
        loaded.signature,
        loaded.provider_reason,
        memory,
        batcher,
    );
    handle.warmup_rejected = warmed.rejected;
    if let (Some(s), Some(b)) = (handle.sequences(), budget) {
        s.hold_in(b);
    }
    Ok(match pipeline {
        Some(p) => handle.with_pipeline(p),
        None => handle,
    })
}

/// Reads each sequence state's initial value file, and checks that it holds
/// one sequence's state as the ONNX file declares the input (1 on its batch
/// axis).
fn read_initial_states(
    settings: &mut ModelSettings,
    dir: &std::path::Path,
    sig: &Signature,
) -> Result<(), LoadError> {
    let axes = settings.batch_axes.clone();
    let Some(seq) = settings.sequence.as_mut() else {
        return Ok(());
    };
    for st in &mut seq.states {
        let Some(file) = &st.initial else { continue };
        let what = format!("the initial state of `{}` ({})", st.input, file.display());
        let bytes = std::fs::read(dir.join(file)).map_err(|e| LoadError::Files(format!("{what}: {e}")))?;
        let spec = sig.input(&st.input).ok_or_else(|| {
            LoadError::Files(format!("{what}: `{}` is not an input of the ONNX file", st.input))
        })?;
        let axis = axes.get(&st.input).copied().unwrap_or(0);
        let shape: Option<Vec<usize>> = spec
            .shape
            .iter()
            .enumerate()
            .map(|(i, d)| {
                if i == axis {
                    Some(1)
                } else {
                    usize::try_from(*d).ok()
                }
            })
            .collect();
        let shape = shape.ok_or_else(|| {
            LoadError::Files(format!(
                "{what}: the input's shape {:?} has a dynamic dim besides its batch axis",
                spec.shape
            ))
        })?;
        crate::protocol::binary::decode(&what, spec.dtype, &shape, &bytes)
            .map_err(|e| LoadError::Files(e.to_string()))?;
        st.initial_bytes = Some(std::sync::Arc::new(bytes));
    }
    Ok(())
}

/// A sequence model's control and state inputs, and its state outputs,
/// must be the ONNX file's: a name it lacks fails the load, not every request.
fn check_sequence(settings: &ModelSettings, sig: &Signature) -> Result<(), String> {
    let Some(seq) = &settings.sequence else {
        return Ok(());
    };
    let inputs = seq
        .controls
        .iter()
        .map(|c| ("control input", &c.input))
        .chain(seq.states.iter().map(|s| ("state input", &s.input)));
    let mut missing: Vec<String> = inputs
        .filter(|(_, name)| sig.input(name).is_none())
        .map(|(what, name)| format!("{what} `{name}`"))
        .collect();
    missing.extend(
        seq.states
            .iter()
            .filter(|s| sig.output(&s.output).is_none())
            .map(|s| format!("state output `{}`", s.output)),
    );
    if missing.is_empty() {
        return Ok(());
    }
    let names = |specs: &[crate::tensor::TensorSpec]| {
        specs
            .iter()
            .map(|t| t.name.as_str())
            .collect::<Vec<_>>()
            .join("`, `")
    };
    Err(format!(
        "the sequence settings name {} that the ONNX file does not have (its inputs: `{}`; its outputs: `{}`)",
        missing.join(", "),
        names(&sig.inputs),
        names(&sig.outputs)
    ))
}

/// What [`check_loaded`] found in a loaded file.
pub struct Checked {
    /// How requests of different lengths share batches (`padding`).
    pub padding: Option<Padding>,
    /// The file's batch axes, or why the file says the model cannot batch.
    pub layout: Result<Layout, String>,
}

/// Checks a loaded file against its settings: the declared signature,
/// `padding` and `batch_axes` against the file's inputs, outputs and dim
/// names, and what the file says of batching (`batcher::layout::decide`).
/// Logs the MLServer fields that are accepted but unused. Every load runs
/// it, and so does `sluice check`, so that a folder the check passes is one
/// the server loads.
pub fn check_loaded(
    name: &str,
    settings: &mut ModelSettings,
    signature: &Signature,
) -> Result<Checked, LoadError> {
    super::sentence::fit(settings, signature).map_err(LoadError::Files)?;
    settings.check_declared(signature).map_err(LoadError::Files)?;
    check_sequence(settings, signature).map_err(LoadError::Files)?;
    let padding = Padding::new(signature, &settings.padding).map_err(LoadError::Files)?;
    layout::check_declared(signature, &settings.batch_axes).map_err(LoadError::Files)?;
    if !settings.unused.is_empty() {
        tracing::info!(
            model = %name,
            fields = %settings.unused.join(", "),
            "MLServer fields accepted but not used by sluice"
        );
    }
    for field in &settings.ignored {
        tracing::warn!(model = %name, "config.pbtxt field not honoured: {field}");
    }
    let layout = layout::decide(signature, &settings.batch_axes);
    if let (Err(why), true) = (&layout, settings.batching.batching_enabled()) {
        tracing::info!(model = %name, reason = %why, "serving with batching off: each request runs alone and gets its outputs whole");
    }
    Ok(Checked { padding, layout })
}

/// The GPU memory each CUDA device of `devices` gained since `before` was read (empty
/// for a model on the CPU).
async fn device_growth(before: &[u64], devices: &[Device]) -> Vec<DeviceBytes> {
    let cuda_ids: Vec<u32> = devices
        .iter()
        .filter_map(|d| match d {
            Device::Cuda(id) => Some(*id),
            Device::Cpu => None,
        })
        .collect();
    if cuda_ids.is_empty() {
        return Vec::new();
    }
    let after = tokio::task::spawn_blocking(device_memory::used_per_device)
        .await
        .unwrap_or_default();
    device_memory::growth(before, &after, &cuda_ids)
        .into_iter()
        .map(|(device, bytes)| DeviceBytes { device, bytes })
        .collect()
}

/// `settings` as the serving version runs them: `max_batch_size` stays 1
/// when it was found not to batch.
pub fn effective(serving: &ModelHandle, mut settings: ModelSettings) -> ModelSettings {
    if serving.batcher().batching().off().is_some() {
        settings.batching.max_batch_size = settings.batching.max_batch_size.min(1);
    }
    settings
}

/// `name: DTYPE[dims]` for each tensor, for logs.
pub fn describe(specs: &[crate::tensor::TensorSpec]) -> String {
    specs
        .iter()
        .map(|t| format!("{}: {}{:?}", t.name, t.dtype, t.shape))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::sequence::{Control, ControlKind, ControlValues, SequenceSettings, State};
    use crate::tensor::{DataType, TensorSpec};

    #[test]
    fn sequence_names_the_file_lacks_fail_the_load() {
        let spec = |name: &str| TensorSpec {
            name: name.into(),
            dtype: DataType::F32,
            shape: vec![-1, 1],
            dim_names: vec![],
        };
        let sig = Signature {
            inputs: vec![spec("x"), spec("START"), spec("state")],
            outputs: vec![spec("y"), spec("stateN")],
        };
        let mut settings = ModelSettings::parse("{}", "m", &Default::default()).unwrap();
        let state = |input: &str, output: &str| State {
            input: input.into(),
            output: output.into(),
            ..Default::default()
        };
        let control = |input: &str| Control {
            input: input.into(),
            kind: ControlKind::Start,
            values: ControlValues::Int32([0, 1]),
        };
        settings.sequence = Some(SequenceSettings {
            controls: vec![control("START")],
            states: vec![state("state", "stateN")],
            idle: std::time::Duration::from_secs(1),
            max_sequences: 4,
            batched: true,
        });
        assert_eq!(check_sequence(&settings, &sig), Ok(()));
        let seq = settings.sequence.as_mut().unwrap();
        seq.controls.push(control("READY"));
        seq.states.push(state("h", "hN"));
        let e = check_sequence(&settings, &sig).unwrap_err();
        for says in [
            "control input `READY`",
            "state input `h`",
            "state output `hN`",
            "its inputs: `x`, `START`, `state`",
        ] {
            assert!(e.contains(says), "{says:?} not in {e}");
        }
    }
}
