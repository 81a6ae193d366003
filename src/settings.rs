//! A model folder's `model-settings.json`, parsed and validated (SPEC §3). The wire names are
//! MLServer's (`name`, `max_batch_size`, `max_batch_time` in seconds, `parameters.uri/version`),
//! plus KServe's `batcher` object and sluice's own fields. As Triton's `model_config_utils` does,
//! the file is read into a `serde_json::Value` and walked by hand, so that *every* problem is
//! collected with a message that starts with its field path; then the values not given are
//! filled from the server-wide [`ModelDefaults`]. A [`ModelSettings`] is always in range.
//! [`ModelSettings::requires_new_sessions`] is hot reload's `ConfigChangeRequiresReload`.

use std::fmt;
use std::path::{Component, Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize, Serializer};
use serde_json::Value;

use crate::tensor::{DataType, Signature};

/// How a model's batcher decides to close a batch (SPEC §5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BatchPolicyKind {
    /// Dispatch at once when waiting cannot grow the batch; otherwise behave like `Fixed`.
    #[default]
    Adaptive,
    /// Wait until `max_batch_size` rows are queued or `max_batch_time` has passed.
    Fixed,
}

/// The ONNX Runtime execution provider a model's sessions use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ExecutionProvider {
    /// CUDA when a usable GPU is present, else CPU (the runtime logs which and why).
    #[default]
    Auto,
    /// CPU only.
    Cpu,
    /// CUDA only: loading fails when no usable GPU is present.
    Cuda,
}

const POLICIES: &[(&str, BatchPolicyKind)] = &[
    ("adaptive", BatchPolicyKind::Adaptive),
    ("fixed", BatchPolicyKind::Fixed),
];
const PROVIDERS: &[(&str, ExecutionProvider)] = &[
    ("auto", ExecutionProvider::Auto),
    ("cpu", ExecutionProvider::Cpu),
    ("cuda", ExecutionProvider::Cuda),
];

impl fmt::Display for ExecutionProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(PROVIDERS.iter().find(|(_, p)| p == self).map_or("", |(s, _)| s))
    }
}

impl FromStr for ExecutionProvider {
    type Err = String;
    /// Parses `auto`, `cpu` or `cuda` (as a CLI flag or config value would give it).
    fn from_str(s: &str) -> Result<Self, String> {
        lookup(PROVIDERS, s).ok_or_else(|| format!("expected one of \"auto\", \"cpu\", \"cuda\", got {s:?}"))
    }
}

impl FromStr for BatchPolicyKind {
    type Err = String;
    /// Parses `adaptive` or `fixed`.
    fn from_str(s: &str) -> Result<Self, String> {
        lookup(POLICIES, s).ok_or_else(|| format!("expected one of \"adaptive\", \"fixed\", got {s:?}"))
    }
}

/// A model's validated batching and queueing settings: the part hot reload applies in place.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct BatchSettings {
    /// Most rows (dim 0) in one batch; `0` or `1` turns batching off.
    pub max_batch_size: usize,
    /// Longest a batch waits to fill, timed from its oldest request (0 to 60 s).
    #[serde(serialize_with = "secs")]
    pub max_batch_time: Duration,
    /// How the batcher decides to close a batch.
    pub policy: BatchPolicyKind,
    /// Most requests waiting for this model; more are refused.
    pub max_queue_size: usize,
    /// How long a request may take, queue included.
    #[serde(serialize_with = "secs")]
    pub timeout: Duration,
    /// Most padded tokens in one batch of a padded model: rows × the product
    /// of the padded dims' lengths (TEI's `max_batch_tokens`); `None` = no bound.
    pub max_batch_tokens: Option<usize>,
    /// Padded models: most padded elements ÷ all elements of a batch; a request that would
    /// push its batch past it waits for another (the oldest request always runs).
    /// `None`: the default for the device the model runs on, which its batcher
    /// fills in ([`BatchSettings::on_device`]).
    pub max_padding_ratio: Option<Fraction>,
    /// Priority levels a request may ask for (`priority_levels`, Triton's queue policy):
    /// 1 is the highest; 0 turns priorities off (every request is equal).
    pub priority_levels: u32,
    /// The level of a request that names none (`default_priority`, 1 to `priority_levels`).
    pub default_priority: u32,
    /// Refuse at once (503) a request predicted to miss its deadline
    /// (`refuse_predicted_late`, default true), instead of a 504 when it passes.
    pub refuse_predicted_late: bool,
}

impl BatchSettings {
    /// True when requests may be batched together (`max_batch_size > 1`).
    pub fn batching_enabled(&self) -> bool {
        self.max_batch_size > 1
    }

    /// The padding bound in force: the one set, else the CPU default.
    pub fn max_padding(&self) -> f64 {
        self.max_padding_ratio
            .map_or(DEFAULT_MAX_PADDING_RATIO, Fraction::get)
    }

    /// These settings on a model whose sessions run on a GPU (`gpu`) or the
    /// CPU: an unset `max_padding_ratio` takes that device's default.
    pub fn on_device(mut self, gpu: bool) -> BatchSettings {
        let default = if gpu {
            DEFAULT_MAX_PADDING_RATIO_GPU
        } else {
            DEFAULT_MAX_PADDING_RATIO
        };
        self.max_padding_ratio = self.max_padding_ratio.or(Fraction::new(default));
        self
    }
}

/// A number from 0 to 1 (never NaN, so it compares as a total order).
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd, Serialize)]
pub struct Fraction(f64);

impl Eq for Fraction {}

impl Fraction {
    /// `x` when it is from 0 to 1.
    pub fn new(x: f64) -> Option<Fraction> {
        (0.0..=1.0).contains(&x).then_some(Fraction(x))
    }

    pub fn get(self) -> f64 {
        self.0
    }
}

/// Default `max_padding_ratio` on the CPU, where every padded token costs its
/// share of compute (see `benches/README.md`, padding).
pub const DEFAULT_MAX_PADDING_RATIO: f64 = 0.05;

/// Default `max_padding_ratio` on a GPU, where a batch's run time barely
/// grows with its padding and bigger batches pay: on an H200, MiniLM served
/// 3,615 sequences/s at 0.05, 8,455 at 0.5 and 10,600 at 1.0 (no bound
/// but `max_batch_tokens`). 0.5 takes most of that gain while bounding the
/// compute a batch can waste at 2× its tokens, for models bigger than
/// MiniLM where padding is not free (`scripts/gpu-check.sh`;
/// benches/README.md, On a GPU).
pub const DEFAULT_MAX_PADDING_RATIO_GPU: f64 = 0.5;

/// Server-wide defaults for the fields a `model-settings.json` leaves out. `config.rs` fills
/// them from `config/sluice.toml` and `SLUICE_MODEL_MAX_BATCH_SIZE` / `SLUICE_MODEL_MAX_BATCH_TIME`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ModelDefaults {
    /// Default `max_batch_size` (32).
    pub max_batch_size: usize,
    /// Default `max_batch_time` (10 ms).
    #[serde(serialize_with = "secs")]
    pub max_batch_time: Duration,
    /// Default `batch_policy` (adaptive).
    pub batch_policy: BatchPolicyKind,
    /// Default `max_queue_size` (1024).
    pub max_queue_size: usize,
    /// Default `timeout` (60 s).
    #[serde(serialize_with = "secs")]
    pub timeout: Duration,
    /// Default `instances` (1).
    pub instances: usize,
    /// Default `execution_provider` (auto).
    pub execution_provider: ExecutionProvider,
    /// Default `intra_op_threads`; `None` = derived from the cores by the runtime.
    pub intra_op_threads: Option<usize>,
    /// Default `warmup` (true).
    pub warmup: bool,
}

impl Default for ModelDefaults {
    fn default() -> Self {
        Self {
            max_batch_size: 32,
            max_batch_time: Duration::from_millis(10),
            batch_policy: BatchPolicyKind::Adaptive,
            max_queue_size: 1024,
            timeout: Duration::from_secs(60),
            instances: 1,
            execution_provider: ExecutionProvider::Auto,
            intra_op_threads: None,
            warmup: true,
        }
    }
}

impl ModelDefaults {
    /// Checks the defaults against the ranges a `model-settings.json` must respect, with the same
    /// messages (each starting with the field name, e.g. `` `max_batch_size` ``).
    pub fn validate(&self) -> Result<(), SettingsError> {
        let json = serde_json::to_string(self).expect("ModelDefaults serializes");
        ModelSettings::parse(&json, "defaults", self).map(drop)
    }
}

/// A model's validated settings, defaults filled in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ModelSettings {
    /// The model's name: `name`, else the folder's name.
    pub name: String,
    /// The ONNX file, relative to the model folder, normalized (no `.` components).
    pub uri: PathBuf,
    /// Version label reported in metadata (`parameters.version`).
    pub version: Option<String>,
    /// Batching and queueing.
    pub batching: BatchSettings,
    /// ONNX Runtime sessions for this model in the pool (1 to 64).
    pub instances: usize,
    /// Execution provider of the model's sessions.
    pub execution_provider: ExecutionProvider,
    /// GPUs the instances are placed on (non-empty, distinct, each 0 to 63).
    pub device_ids: Vec<u32>,
    /// Intra-op threads per session; `None` = derived from the cores by the runtime.
    pub intra_op_threads: Option<usize>,
    /// Run each power-of-two batch size up to `max_batch_size` once before turning ready.
    pub warmup: bool,
    /// Loaded at start whatever `residency.mode` says, never evicted, and counted against the
    /// residency budgets first (`pinned`).
    pub pinned: bool,
    /// CUDA provider options.
    pub cuda: CudaOptions,
    /// Pad value per input name (`padding`): requests whose padded inputs differ only in
    /// their symbolic dims share batches (empty = padding off). Each value is a JSON number,
    /// boolean or string, checked against the input's datatype when the ONNX file is loaded.
    pub padding: std::collections::BTreeMap<String, Value>,
    /// Batch axis per input or output name (`batch_axes`), for a model whose batch is not dim 0
    /// of every tensor (a recurrent state `[layers, batch, hidden]` batches on axis 1); the rest
    /// batch on dim 0, and a 0-d input is shared by the requests of a batch. Checked against the
    /// ONNX file when it is loaded (`batcher::layout`).
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub batch_axes: std::collections::BTreeMap<String, usize>,
    /// The signature the file declares (MLServer's `inputs` / `outputs`), checked against the
    /// ONNX file's at load time; `None` where not declared.
    pub declared: Declared,
    /// MLServer fields that were accepted (type-checked) but have no effect in sluice, for a log
    /// line at load: `implementation`, `parallel_workers`, `parameters.content_type`, ...
    pub unused: Vec<String>,
    /// A `config.pbtxt`'s fields that sluice does not honour, each with why (`src/triton/`),
    /// for a warning at load and `sluice check`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ignored: Vec<String>,
    /// A `config.pbtxt` model's configuration as read, in Triton's JSON shape: what the
    /// config endpoint answers (with Triton's defaults filled in).
    #[serde(skip)]
    pub triton_config: Option<Value>,
    /// Class labels per output (a `config.pbtxt` output's `label_filename`, one per
    /// line), for Triton's classification extension.
    #[serde(skip)]
    pub labels: std::collections::BTreeMap<String, std::sync::Arc<Vec<String>>>,
    /// Inputs and outputs whose shape clients see differently from the
    /// model (a `config.pbtxt` tensor's `reshape`), by name.
    #[serde(skip)]
    pub reshape: std::collections::BTreeMap<String, crate::tensor::reshape::Reshape>,
    /// A sequence model's settings (a `config.pbtxt`'s `sequence_batching`):
    /// requests then belong to sequences, and the server fills their control inputs.
    #[serde(skip)]
    pub sequence: Option<sequence::SequenceSettings>,
    /// A pipeline's steps (`pipeline`, a `config.pbtxt`'s `ensemble_scheduling`,
    /// or a sentence-transformers folder): requests run through them instead of
    /// (or around) the folder's ONNX file.
    #[serde(skip)]
    pub pipeline: Option<pipeline::PipelineSettings>,
    /// Custom-op libraries the model's graph needs, by the name the server
    /// configuration gives them (`[runtime] op_libraries`); a `config.pbtxt`'s
    /// `model_operations.op_library_filename` may give their file names.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub op_libraries: Vec<String>,
}

/// MLServer's declared `inputs` and `outputs` (ModelMesh's MLServer adapter writes them).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct Declared {
    pub inputs: Option<Vec<DeclaredTensor>>,
    pub outputs: Option<Vec<DeclaredTensor>>,
}

/// One declared tensor: its name, and its datatype and shape when given (`-1` = any size).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeclaredTensor {
    pub name: String,
    pub datatype: Option<DataType>,
    pub shape: Option<Vec<i64>>,
}

/// Every problem found in a `model-settings.json`, each starting with its field path in
/// backticks. Display joins them with `"; "`; the caller prefixes the file path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", problems.join("; "))]
pub struct SettingsError {
    /// The problems, in the order found.
    pub problems: Vec<String>,
}

/// The pattern model names must match, as shown in error messages.
pub const MODEL_NAME_PATTERN: &str = "[A-Za-z0-9][A-Za-z0-9_.-]{0,127}";

/// Checks `name` against `[A-Za-z0-9][A-Za-z0-9_.-]{0,127}`; the error says what is wrong.
pub fn validate_model_name(name: &str) -> Result<(), String> {
    let fail = |why: String| {
        Err(format!(
            "model name {:?} does not match `{MODEL_NAME_PATTERN}`: {why}",
            crate::error::clip(name)
        ))
    };
    let bad = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')));
    match name.chars().next() {
        None => fail("it is empty".into()),
        Some(c) if !c.is_ascii_alphanumeric() => fail(format!("it starts with {c:?}, not a letter or digit")),
        _ if name.len() > 128 => fail(format!("it is {} bytes long, the limit is 128", name.len())),
        _ => bad.map_or(Ok(()), |c| fail(format!("{c:?} is not allowed"))),
    }
}

/// The known fields of each object, space-separated.
const TOP: &str = "name parameters max_batch_size max_batch_time batch_policy max_queue_size timeout \
                   instances execution_provider device_ids intra_op_threads warmup pinned cuda batcher priority_levels default_priority refuse_predicted_late \
                   padding max_batch_tokens max_padding_ratio batch_axes inputs outputs implementation parallel_workers warm_workers platform versions cache_enabled \
                   sequence pipeline op_libraries";
const PARAMETERS: &str = "uri version content_type format extra";
/// What `intra_op_threads` takes.
const THREADS: &str = "an integer between 1 and 1024 or null";
const BATCHER: &str = "maxBatchSize maxLatency timeout";
const TENSOR: &str = "name datatype shape parameters";
/// The file name a `model-settings.json` without `parameters.uri` points at.
pub const DEFAULT_URI: &str = "model.onnx";

/// The batching fields of `top` (the batcher's, the schedule's and
/// padding's), with `defaults` for those not given; and `padding` itself.
fn batching(
    w: &mut Walker,
    top: &serde_json::Map<String, Value>,
    defaults: &ModelDefaults,
) -> (BatchSettings, std::collections::BTreeMap<String, Value>) {
    let Batcher {
        max_batch_size,
        max_batch_time,
        timeout,
    } = w.batcher_fields(top);
    let policy = get(top, "batch_policy").and_then(|v| w.choice(v, "batch_policy", POLICIES, false));
    let max_queue_size = get(top, "max_queue_size").and_then(|v| w.int(v, "max_queue_size", 1, 1_000_000));
    let priority_levels = get(top, "priority_levels").and_then(|v| w.int(v, "priority_levels", 0, 1000));
    let levels = priority_levels.unwrap_or(0);
    let default_priority = match get(top, "default_priority") {
        None => (levels > 0).then_some(levels),
        Some(_) if levels == 0 => {
            w.problems.push(
                "`default_priority` is set but `priority_levels` is not; set `priority_levels` (1 is the highest level)"
                    .into(),
            );
            None
        }
        Some(v) => w.int(v, "default_priority", 1, levels),
    };
    let refuse_predicted_late =
        get(top, "refuse_predicted_late").and_then(|v| w.boolean(v, "refuse_predicted_late"));
    let (padding, max_batch_tokens, max_padding_ratio) = w.padding_fields(top);
    let batching = BatchSettings {
        max_batch_size: max_batch_size.map_or(defaults.max_batch_size, |n| n as usize),
        max_batch_time: max_batch_time.map_or(defaults.max_batch_time, Duration::from_secs_f64),
        policy: policy.unwrap_or(defaults.batch_policy),
        max_queue_size: max_queue_size.map_or(defaults.max_queue_size, |n| n as usize),
        timeout: timeout.map_or(defaults.timeout, Duration::from_secs_f64),
        max_batch_tokens,
        max_padding_ratio: max_padding_ratio.map(|x| Fraction::new(x).expect("checked to be from 0 to 1")),
        priority_levels: levels as u32,
        default_priority: default_priority.unwrap_or(0) as u32,
        refuse_predicted_late: refuse_predicted_late.unwrap_or(true),
    };
    (batching, padding)
}

impl ModelSettings {
    /// Parses the JSON text of model-settings.json; `folder_name` is the model folder's name
    /// (default `name`). Fields not given come from `defaults`; JSON `null` counts as not given,
    /// except `intra_op_threads: null`, which means "derived from the cores".
    pub fn parse(
        json: &str,
        folder_name: &str,
        defaults: &ModelDefaults,
    ) -> Result<ModelSettings, SettingsError> {
        Self::parse_with_uri(json, folder_name, defaults, Path::new(DEFAULT_URI))
    }

    /// [`ModelSettings::parse`], with `default_uri` as the ONNX file when `parameters.uri` is not
    /// given (the repository scan passes the folder's only `*.onnx` when there is no `model.onnx`).
    pub fn parse_with_uri(
        json: &str,
        folder_name: &str,
        defaults: &ModelDefaults,
        default_uri: &Path,
    ) -> Result<ModelSettings, SettingsError> {
        let root: Value = serde_json::from_str(json).map_err(|e| SettingsError {
            problems: vec![format!("invalid JSON: {e}")],
        })?;
        let mut w = Walker::default();
        let Some(top) = w.object(&root, "", TOP) else {
            let got = describe(&root);
            return Err(SettingsError {
                problems: vec![format!("the file must hold a JSON object, got {got}")],
            });
        };

        let name = w.model_name(top, folder_name);
        let params = get(top, "parameters").and_then(|v| w.object(v, "parameters.", PARAMETERS));
        let uri = match params.and_then(|p| get(p, "uri")) {
            Some(v) => w.string(v, "parameters.uri", "a path").and_then(|s| w.uri(s)),
            None => Some(default_uri.to_path_buf()),
        };
        let version = params.and_then(|p| get(p, "version")).and_then(|v| w.version(v));
        let (batching, padding) = batching(&mut w, top, defaults);
        let instances = get(top, "instances").and_then(|v| w.int(v, "instances", 1, 64));
        let provider =
            get(top, "execution_provider").and_then(|v| w.choice(v, "execution_provider", PROVIDERS, false));
        let device_ids = get(top, "device_ids").map(|v| w.device_ids(v));
        let intra_op_threads = match top.get("intra_op_threads") {
            None => defaults.intra_op_threads,
            Some(Value::Null) => None,
            Some(v) => w
                .int_as(v, "intra_op_threads", 1, 1024, THREADS)
                .map(|n| n as usize),
        };
        let warmup = get(top, "warmup").and_then(|v| w.boolean(v, "warmup"));
        let pinned = get(top, "pinned").and_then(|v| w.boolean(v, "pinned"));
        let batch_axes = get(top, "batch_axes")
            .map(|v| w.batch_axes(v))
            .unwrap_or_default();
        let cuda = get(top, "cuda").map_or_else(CudaOptions::default, |v| w.cuda_options(v));
        let sequence = get(top, "sequence").and_then(|v| w.sequence(v));
        let pipeline = get(top, "pipeline").and_then(|v| w.pipeline(v));
        let op_libraries = match get(top, "op_libraries") {
            None => Vec::new(),
            Some(Value::Array(a)) if a.iter().all(|x| x.as_str().is_some_and(|s| !s.is_empty())) => {
                a.iter().filter_map(|x| x.as_str().map(str::to_string)).collect()
            }
            Some(v) => w
                .bad(
                    "op_libraries",
                    "an array of op library names ([runtime] op_libraries)",
                    v,
                )
                .unwrap_or_default(),
        };
        if !batch_axes.is_empty() && !padding.is_empty() {
            w.problems.push(
                "`batch_axes` and `padding` are both set: a padded model batches on dim 0; remove one of them".into(),
            );
        }
        if provider == Some(ExecutionProvider::Cpu) && !cuda.is_empty() {
            w.problems.push(
                "`cuda` options are set but `execution_provider` is \"cpu\"; remove one of them".into(),
            );
        }

        let declared = Declared {
            inputs: get(top, "inputs").and_then(|v| w.tensors(v, "inputs", TENSOR)),
            outputs: get(top, "outputs").and_then(|v| w.tensors(v, "outputs", TENSOR)),
        };
        let unused = w.unused(top, params);

        if !w.problems.is_empty() {
            return Err(SettingsError { problems: w.problems });
        }
        Ok(ModelSettings {
            name: name.unwrap_or_default(),
            uri: uri.unwrap_or_default(),
            version,
            batching,
            instances: instances.map_or(defaults.instances, |n| n as usize),
            execution_provider: provider.unwrap_or(defaults.execution_provider),
            device_ids: device_ids.unwrap_or_else(|| vec![0]),
            intra_op_threads,
            warmup: warmup.unwrap_or(defaults.warmup),
            pinned: pinned.unwrap_or(false),
            cuda,
            padding,
            batch_axes,
            declared,
            unused,
            ignored: Vec::new(),
            triton_config: None,
            labels: Default::default(),
            reshape: Default::default(),
            sequence,
            pipeline,
            op_libraries,
        })
    }

    /// Checks the declared `inputs` / `outputs` against the ONNX file's signature: each declared
    /// tensor must exist with the declared datatype and a compatible shape (a declared `-1`
    /// matches any size; a shape one dim shorter than the file's is taken without the batch
    /// dim, as Triton writes it). The error names every mismatch.
    pub fn check_declared(&self, signature: &Signature) -> Result<(), String> {
        let mut problems = Vec::new();
        // Named as the file the operator wrote names them.
        let (file, fields, datatype, shape_key) = match self.triton_config.is_some() {
            true => ("config.pbtxt", ["input", "output"], "data_type", "dims"),
            false => ("model-settings.json", ["inputs", "outputs"], "datatype", "shape"),
        };
        for (field, declared, actual) in [
            (fields[0], &self.declared.inputs, &signature.inputs),
            (fields[1], &self.declared.outputs, &signature.outputs),
        ] {
            for (i, d) in declared.iter().flatten().enumerate() {
                let Some(a) = actual.iter().find(|a| a.name == d.name) else {
                    let names: Vec<&str> = actual.iter().map(|a| a.name.as_str()).collect();
                    problems.push(format!(
                        "`{field}[{i}]` declares `{}`, which the ONNX file does not have (its {field}: `{}`)",
                        d.name,
                        names.join("`, `")
                    ));
                    continue;
                };
                if let Some(dt) = d.datatype.filter(|dt| *dt != a.dtype) {
                    problems.push(format!(
                        "`{field}[{i}].{datatype}` of `{}` is {dt}, but the ONNX file says {}",
                        d.name, a.dtype
                    ));
                }
                if let Some(shape) = d.shape.as_ref().filter(|s| !shape_fits(s, &a.shape)) {
                    problems.push(format!(
                        "`{field}[{i}].{shape_key}` of `{}` is {shape:?}, but the ONNX file says {:?} (-1: any size)",
                        d.name, a.shape
                    ));
                }
            }
        }
        match problems.is_empty() {
            true => Ok(()),
            false => Err(format!(
                "{file} declares a signature the ONNX file does not have: {}",
                problems.join("; ")
            )),
        }
    }

    /// True when going from `self` to `new` needs new ONNX Runtime sessions: anything other than
    /// changes to the batching fields (`max_batch_size`, `max_batch_time`, `batch_policy`,
    /// `max_queue_size`, `timeout`, `max_batch_tokens`, `max_padding_ratio`) and the version label, with the name kept. A changed ONNX file
    /// under the same `uri` is not visible here: the caller compares the files.
    pub fn requires_new_sessions(&self, new: &ModelSettings) -> bool {
        let mut same_sessions = new.clone();
        same_sessions.batching = self.batching;
        same_sessions.version.clone_from(&self.version);
        same_sessions.unused.clone_from(&self.unused);
        same_sessions.ignored.clone_from(&self.ignored);
        same_sessions.triton_config.clone_from(&self.triton_config);
        same_sessions.pinned = self.pinned;
        same_sessions != *self
    }
}

/// True when a declared shape fits the file's: same rank (or one less, without the batch dim),
/// and equal sizes wherever both are fixed.
fn shape_fits(declared: &[i64], actual: &[i64]) -> bool {
    let actual = match actual.len().checked_sub(declared.len()) {
        Some(0) => actual,
        Some(1) => &actual[1..],
        _ => return false,
    };
    declared
        .iter()
        .zip(actual)
        .all(|(d, a)| *d < 0 || *a < 0 || d == a)
}

/// Serializes a duration as fractional seconds.
fn secs<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

mod cuda;
mod fields;
pub mod pipeline;
pub mod sequence;
mod walk;

pub use cuda::{ArenaExtendStrategy, CudaOptions, CudnnConvAlgoSearch};
use fields::Batcher;
pub use walk::in_folder;
use walk::{describe, get, lookup, Walker};

#[cfg(test)]
mod tests;
