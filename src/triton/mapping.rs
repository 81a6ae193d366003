//! A Triton model configuration mapped onto sluice's settings: the result is
//! the JSON a `model-settings.json` would hold, read by the same validating
//! parser ([`ModelSettings::parse_with_uri`]), so that both layouts share one
//! set of checks and messages. What sluice does not honour is never dropped
//! in silence: each such field is listed by its path, with why, for the load
//! log line and `sluice check`.

use std::path::Path;

use serde_json::{json, Map, Value};

use crate::protocol::grpc::inference::{
    self, model_config::SchedulingChoice, model_instance_group::Kind, model_queue_policy::TimeoutAction,
    ModelConfig,
};
use crate::settings::{ModelDefaults, ModelSettings};
use crate::tensor::reshape::Reshape;

pub mod ensemble;
mod sequence;

/// The platform and backend names of ONNX models in Triton.
pub const PLATFORM: &str = "onnxruntime_onnx";
pub const BACKEND: &str = "onnxruntime";

/// Settings for version `version` of the model `name`, whose file is `uri`
/// (relative to the model folder). `Err`: why the configuration cannot be
/// served (another platform, a name that is not the folder's), naming the field.
pub fn settings(
    config: &ModelConfig,
    name: &str,
    version: &str,
    uri: &Path,
    defaults: &ModelDefaults,
) -> Result<ModelSettings, String> {
    let mut ignored = Vec::new();
    let top = map(config, name, version, &mut ignored)?;
    let text = Value::Object(top).to_string();
    let mut settings =
        ModelSettings::parse_with_uri(&text, name, defaults, uri).map_err(|e| e.to_string())?;
    settings.ignored = ignored;
    settings.reshape = reshapes(config);
    match &config.scheduling_choice {
        Some(SchedulingChoice::SequenceBatching(s)) => {
            settings.sequence = Some(sequence::settings(s, config.max_batch_size > 0)?)
        }
        Some(SchedulingChoice::EnsembleScheduling(e)) => {
            settings.pipeline = Some(ensemble::pipeline(config, e)?)
        }
        _ => {}
    }
    // Resolved against `[runtime] op_libraries` by file name when the model loads.
    settings.op_libraries = config
        .model_operations
        .as_ref()
        .map(|m| m.op_library_filename.clone())
        .unwrap_or_default();
    settings.triton_config = Some(super::config::to_json(config));
    Ok(settings)
}

/// Refuses a platform or backend other than ONNX Runtime's, and a `name`
/// that is not the folder's (Triton refuses it too).
fn check_identity(config: &ModelConfig, name: &str) -> Result<(), String> {
    let ensemble = matches!(
        config.scheduling_choice,
        Some(SchedulingChoice::EnsembleScheduling(_))
    );
    if ensemble != (config.platform == ensemble::PLATFORM) {
        return Err(match ensemble {
            true => "`ensemble_scheduling` needs `platform: \"ensemble\"`".into(),
            false => "`platform` is \"ensemble\" but there is no `ensemble_scheduling`: add its steps".into(),
        });
    }
    let platform_ok = config.platform.is_empty() || config.platform == PLATFORM || ensemble;
    let backend_ok = config.backend.is_empty() || config.backend == BACKEND;
    if !platform_ok {
        return Err(format!(
            "`platform` is {:?}: sluice serves ONNX models only (platform \"{PLATFORM}\" or backend \"{BACKEND}\")",
            config.platform
        ));
    }
    if !backend_ok {
        return Err(format!(
            "`backend` is {:?}: sluice serves ONNX models only (platform \"{PLATFORM}\" or backend \"{BACKEND}\")",
            config.backend
        ));
    }
    if !config.name.is_empty() && config.name != name {
        return Err(format!(
            "`name` is {:?} but the model folder is `{name}`: they must be the same (or leave `name` out)",
            config.name
        ));
    }
    Ok(())
}

fn map(
    config: &ModelConfig,
    name: &str,
    version: &str,
    ignored: &mut Vec<String>,
) -> Result<Map<String, Value>, String> {
    check_identity(config, name)?;
    let mut top = Map::new();
    top.insert("name".into(), json!(name));
    top.insert("parameters".into(), json!({ "version": version }));
    let max_batch_size = config.max_batch_size;
    if max_batch_size < 0 {
        return Err(format!(
            "`max_batch_size` is {max_batch_size}: it must be 0 (no batch dimension) or more"
        ));
    }
    top.insert("max_batch_size".into(), json!(max_batch_size));
    // Without `dynamic_batching` Triton runs requests as they come: no wait
    // for a batch to fill (requests queued behind a busy session still share one).
    top.insert("max_batch_time".into(), json!(0.0));
    match &config.scheduling_choice {
        Some(SchedulingChoice::DynamicBatching(d)) => dynamic_batching(d, &mut top, ignored),
        Some(SchedulingChoice::SequenceBatching(s)) => sequence::batching(s, &mut top, ignored),
        _ => {}
    }
    instance_groups(config, &mut top, ignored);
    backend_parameters(config, &mut top, ignored);
    let batched = max_batch_size > 0;
    top.insert("inputs".into(), tensors("input", &config.input, batched, ignored));
    top.insert(
        "outputs".into(),
        tensors("output", &config.output, batched, ignored),
    );
    unhonoured(config, ignored);
    Ok(top)
}

fn dynamic_batching(
    d: &inference::ModelDynamicBatching,
    top: &mut Map<String, Value>,
    ignored: &mut Vec<String>,
) {
    top.insert(
        "max_batch_time".into(),
        json!(d.max_queue_delay_microseconds as f64 / 1e6),
    );
    if !d.preferred_batch_size.is_empty() {
        ignored.push(
            "`dynamic_batching.preferred_batch_size`: the adaptive batcher closes a batch when waiting \
             cannot grow it, not at preferred sizes"
                .into(),
        );
    }
    if d.preserve_ordering {
        ignored.push("`dynamic_batching.preserve_ordering`: each request gets its own answer; there is no shared response order to keep".into());
    }
    if d.priority_levels > 0 {
        top.insert("priority_levels".into(), json!(d.priority_levels));
        if d.default_priority_level > 0 {
            top.insert("default_priority".into(), json!(d.default_priority_level));
        }
    }
    if !d.priority_queue_policy.is_empty() {
        ignored.push(
            "`dynamic_batching.priority_queue_policy`: every level shares `default_queue_policy`".into(),
        );
    }
    if let Some(q) = &d.default_queue_policy {
        if q.max_queue_size > 0 {
            top.insert("max_queue_size".into(), json!(q.max_queue_size));
        }
        if q.default_timeout_microseconds > 0 {
            top.insert(
                "timeout".into(),
                json!(q.default_timeout_microseconds as f64 / 1e6),
            );
        }
        if q.timeout_action == TimeoutAction::Delay as i32 {
            ignored.push("`dynamic_batching.default_queue_policy.timeout_action: DELAY`: a request past its timeout is refused (REJECT)".into());
        }
        if !q.allow_timeout_override && q.default_timeout_microseconds > 0 {
            ignored.push(
                "`dynamic_batching.default_queue_policy.allow_timeout_override: false`: a request's own `timeout` parameter still applies"
                    .into(),
            );
        }
    }
}

/// `instance_group`: the counts add up to `instances`; the kind picks the
/// execution provider; `gpus` are the device ids.
fn instance_groups(config: &ModelConfig, top: &mut Map<String, Value>, ignored: &mut Vec<String>) {
    let groups = &config.instance_group;
    if groups.is_empty() {
        return;
    }
    let count: i32 = groups.iter().map(|g| g.count.max(1)).sum();
    top.insert("instances".into(), json!(count.clamp(1, 64)));
    let kind = Kind::try_from(groups[0].kind).unwrap_or(Kind::Auto);
    match kind {
        Kind::Cpu => {
            top.insert("execution_provider".into(), json!("cpu"));
        }
        Kind::Gpu => {
            top.insert("execution_provider".into(), json!("cuda"));
        }
        Kind::Auto => {}
        Kind::Model => ignored.push(
            "`instance_group.kind: KIND_MODEL`: placed as KIND_AUTO (CUDA where a GPU is usable, else CPU)"
                .into(),
        ),
    }
    let mut gpus: Vec<i32> = groups.iter().flat_map(|g| g.gpus.iter().copied()).collect();
    gpus.sort_unstable();
    gpus.dedup();
    if !gpus.is_empty() && kind != Kind::Cpu {
        top.insert("device_ids".into(), json!(gpus));
    }
    if groups.iter().any(|g| g.kind != groups[0].kind) {
        ignored.push(
            "`instance_group`: groups of different kinds; every instance takes the first group's kind".into(),
        );
    }
    for (i, g) in groups.iter().enumerate() {
        let extras = [
            (g.rate_limiter.is_some(), "rate_limiter"),
            (!g.secondary_devices.is_empty(), "secondary_devices"),
            (!g.profile.is_empty(), "profile"),
            (g.passive, "passive"),
            (!g.host_policy.is_empty(), "host_policy"),
        ];
        for (_, field) in extras.iter().filter(|(set, _)| *set) {
            ignored.push(format!("`instance_group[{i}].{field}`: not supported"));
        }
    }
}

/// The ONNX Runtime backend's `parameters`: `intra_op_thread_count` is
/// honoured; the rest are named.
fn backend_parameters(config: &ModelConfig, top: &mut Map<String, Value>, ignored: &mut Vec<String>) {
    let mut keys: Vec<&String> = config.parameters.keys().collect();
    keys.sort();
    for key in keys {
        let value = &config.parameters[key].string_value;
        match (key.as_str(), value.trim().parse::<u64>()) {
            ("intra_op_thread_count", Ok(0)) => {}
            ("intra_op_thread_count", Ok(n)) => {
                top.insert("intra_op_threads".into(), json!(n));
            }
            _ => ignored.push(format!(
                "`parameters.{key}`: not an ONNX Runtime option sluice sets"
            )),
        }
    }
}

/// The inputs and outputs with a `reshape`: clients see their `dims`, the
/// model has `reshape.shape`.
fn reshapes(config: &ModelConfig) -> std::collections::BTreeMap<String, Reshape> {
    let batched = config.max_batch_size > 0;
    let inputs = config.input.iter().map(|t| (&t.name, &t.dims, &t.reshape));
    let outputs = config.output.iter().map(|t| (&t.name, &t.dims, &t.reshape));
    inputs
        .chain(outputs)
        .filter_map(|(name, dims, reshape)| {
            let r = Reshape {
                client: dims.clone(),
                model: reshape.as_ref()?.shape.clone(),
                batched,
            };
            Some((name.clone(), r))
        })
        .collect()
}

/// The declared tensors, their dims with the batch dimension in front when
/// the model batches (Triton's dims leave it out); a reshaped tensor is
/// declared as the model has it (`reshape.shape`).
fn tensors<T: Tensor>(field: &str, items: &[T], batched: bool, ignored: &mut Vec<String>) -> Value {
    let mut out = Vec::new();
    for (i, t) in items.iter().enumerate() {
        let mut shape: Vec<i64> = Vec::new();
        if batched {
            shape.push(-1);
        }
        shape.extend(t.model_dims());
        let mut entry = json!({ "name": t.name(), "shape": shape });
        if let Some(dt) = datatype(t.data_type()) {
            entry["datatype"] = json!(dt);
        }
        for extra in t.extras() {
            ignored.push(format!(
                "`{field}[{i}].{extra}`: not supported; the tensor is served as the ONNX file declares it"
            ));
        }
        out.push(entry);
    }
    Value::Array(out)
}

/// What [`tensors`] reads of a `ModelInput` or `ModelOutput`.
trait Tensor {
    fn name(&self) -> &str;
    fn data_type(&self) -> i32;
    /// The dims as the model has them: `reshape.shape` when given.
    fn model_dims(&self) -> Vec<i64>;
    /// The fields set that sluice does not honour.
    fn extras(&self) -> Vec<&'static str>;
}

impl Tensor for inference::ModelInput {
    fn name(&self) -> &str {
        &self.name
    }
    fn data_type(&self) -> i32 {
        self.data_type
    }
    fn model_dims(&self) -> Vec<i64> {
        self.reshape
            .as_ref()
            .map_or_else(|| self.dims.clone(), |r| r.shape.clone())
    }
    fn extras(&self) -> Vec<&'static str> {
        let set = [
            (self.is_shape_tensor, "is_shape_tensor"),
            (self.allow_ragged_batch, "allow_ragged_batch"),
            (self.optional, "optional"),
            (self.format != 0, "format"),
        ];
        set.iter().filter(|(s, _)| *s).map(|(_, f)| *f).collect()
    }
}

impl Tensor for inference::ModelOutput {
    fn name(&self) -> &str {
        &self.name
    }
    fn data_type(&self) -> i32 {
        self.data_type
    }
    fn model_dims(&self) -> Vec<i64> {
        self.reshape
            .as_ref()
            .map_or_else(|| self.dims.clone(), |r| r.shape.clone())
    }
    fn extras(&self) -> Vec<&'static str> {
        let set = [(self.is_shape_tensor, "is_shape_tensor")];
        set.iter().filter(|(s, _)| *s).map(|(_, f)| *f).collect()
    }
}

/// The Open Inference Protocol name of a `TYPE_*` (`None`: not given).
pub fn datatype(code: i32) -> Option<&'static str> {
    use inference::DataType as D;
    Some(match D::try_from(code).ok()? {
        D::TypeInvalid => return None,
        D::TypeBool => "BOOL",
        D::TypeUint8 => "UINT8",
        D::TypeUint16 => "UINT16",
        D::TypeUint32 => "UINT32",
        D::TypeUint64 => "UINT64",
        D::TypeInt8 => "INT8",
        D::TypeInt16 => "INT16",
        D::TypeInt32 => "INT32",
        D::TypeInt64 => "INT64",
        D::TypeFp16 => "FP16",
        D::TypeFp32 => "FP32",
        D::TypeFp64 => "FP64",
        D::TypeString => "BYTES",
        D::TypeBf16 => "BF16",
    })
}

/// The top-level fields sluice has no equivalent for, named when set.
fn unhonoured(config: &ModelConfig, ignored: &mut Vec<String>) {
    let o = config.optimization.as_ref();
    let accelerators = o
        .and_then(|o| o.execution_accelerators.as_ref())
        .map(|a| {
            let names = |v: &Vec<
                inference::model_optimization_policy::execution_accelerators::Accelerator,
            >| { v.iter().map(|a| a.name.clone()).collect::<Vec<_>>().join(", ") };
            (
                names(&a.gpu_execution_accelerator),
                names(&a.cpu_execution_accelerator),
            )
        })
        .unwrap_or_default();
    let fields = [
        (
            !config.runtime.is_empty(),
            "runtime",
            "sluice is its own ONNX Runtime backend",
        ),
        (
            !config.batch_input.is_empty(),
            "batch_input",
            "ragged batching is not supported",
        ),
        (
            !config.batch_output.is_empty(),
            "batch_output",
            "ragged batching is not supported",
        ),
        (
            !config.cc_model_filenames.is_empty(),
            "cc_model_filenames",
            "one model file per version",
        ),
        (
            !config.metric_tags.is_empty(),
            "metric_tags",
            "metrics carry the model label only",
        ),
        (
            config
                .model_transaction_policy
                .as_ref()
                .is_some_and(|p| p.decoupled),
            "model_transaction_policy.decoupled",
            "every request gets exactly one response",
        ),
        (
            config.model_repository_agents.is_some(),
            "model_repository_agents",
            "not supported",
        ),
        (
            config.response_cache.as_ref().is_some_and(|c| c.enable),
            "response_cache",
            "sluice keeps no response cache",
        ),
        (config.model_metrics.is_some(), "model_metrics", "not supported"),
        (
            o.is_some_and(|o| o.graph.is_some()),
            "optimization.graph",
            "ONNX Runtime's default graph optimizations run",
        ),
        (
            o.is_some_and(|o| o.cuda.is_some()),
            "optimization.cuda",
            "CUDA graphs are not captured",
        ),
        (
            o.is_some_and(|o| o.priority != 0),
            "optimization.priority",
            "not supported",
        ),
        (
            !accelerators.0.is_empty(),
            "optimization.execution_accelerators.gpu_execution_accelerator",
            "sluice runs ONNX Runtime's CUDA provider, without TensorRT",
        ),
        (
            !accelerators.1.is_empty(),
            "optimization.execution_accelerators.cpu_execution_accelerator",
            "sluice runs ONNX Runtime's CPU provider, without OpenVINO",
        ),
        (
            o.is_some_and(|o| o.input_pinned_memory.is_some() || o.output_pinned_memory.is_some()),
            "optimization.*_pinned_memory",
            "not supported",
        ),
    ];
    for (_, field, why) in fields.iter().filter(|(set, _, _)| *set) {
        ignored.push(format!("`{field}`: {why}"));
    }
}

#[cfg(test)]
mod tests;
