//! A model folder's `model-settings.json`, parsed and validated (SPEC §3). The wire names are
//! MLServer's (`name`, `max_batch_size`, `max_batch_time` in seconds, `parameters.uri/version`),
//! plus KServe's `batcher` object and sluice's own fields. As Triton's `model_config_utils` does,
//! the file is read into a `serde_json::Value` and walked by hand, so that *every* problem is
//! collected with a message that starts with its field path; then the values not given are
//! filled from the server-wide [`ModelDefaults`]. A [`ModelSettings`] is always in range.
//! [`ModelSettings::requires_new_sessions`] is hot reload's `ConfigChangeRequiresReload`.

use std::fmt;
use std::path::{Component, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize, Serializer};
use serde_json::{Map, Value};

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

const ARENA: &[(&str, ArenaExtendStrategy)] = &[
    ("kNextPowerOfTwo", ArenaExtendStrategy::NextPowerOfTwo),
    ("kSameAsRequested", ArenaExtendStrategy::SameAsRequested),
];
const CUDNN: &[(&str, CudnnConvAlgoSearch)] = &[
    ("EXHAUSTIVE", CudnnConvAlgoSearch::Exhaustive),
    ("HEURISTIC", CudnnConvAlgoSearch::Heuristic),
    ("DEFAULT", CudnnConvAlgoSearch::Default),
];

/// ONNX Runtime's CUDA `arena_extend_strategy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum ArenaExtendStrategy {
    /// Grow the arena by powers of two (`kNextPowerOfTwo`, Triton's `0`).
    #[serde(rename = "kNextPowerOfTwo")]
    NextPowerOfTwo,
    /// Grow the arena by exactly what was requested (`kSameAsRequested`, Triton's `1`).
    #[serde(rename = "kSameAsRequested")]
    SameAsRequested,
}

/// ONNX Runtime's CUDA `cudnn_conv_algo_search`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum CudnnConvAlgoSearch {
    /// Benchmark every algorithm (`EXHAUSTIVE`, Triton's `0`).
    Exhaustive,
    /// Pick by cuDNN's heuristics (`HEURISTIC`, Triton's `1`).
    Heuristic,
    /// Use the default algorithm (`DEFAULT`, Triton's `2`).
    Default,
}

/// CUDA provider options (the ones Triton's ONNX Runtime backend exposes); `None` = ONNX Runtime's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct CudaOptions {
    /// Most bytes the CUDA arena may hold.
    pub gpu_mem_limit: Option<u64>,
    /// How the CUDA arena grows.
    pub arena_extend_strategy: Option<ArenaExtendStrategy>,
    /// How cuDNN picks convolution algorithms.
    pub cudnn_conv_algo_search: Option<CudnnConvAlgoSearch>,
    /// Copy on the default CUDA stream.
    pub do_copy_in_default_stream: Option<bool>,
}

impl CudaOptions {
    /// True when no option is set.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
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
}

impl BatchSettings {
    /// True when requests may be batched together (`max_batch_size > 1`).
    pub fn batching_enabled(&self) -> bool {
        self.max_batch_size > 1
    }
}

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
    /// CUDA provider options.
    pub cuda: CudaOptions,
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
            "model name {name:?} does not match `{MODEL_NAME_PATTERN}`: {why}"
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
                   instances execution_provider device_ids intra_op_threads warmup cuda batcher";
const PARAMETERS: &str = "uri version";
const CUDA: &str = "gpu_mem_limit arena_extend_strategy cudnn_conv_algo_search do_copy_in_default_stream";
const BATCHER: &str = "maxBatchSize maxLatency timeout";
/// Fields of MLServer's or KServe's own settings that sluice does not take, with a hint.
const FOREIGN: &[(&str, &str)] = &[
    ("implementation", "sluice serves ONNX files itself; remove it"),
    ("parallel_workers", "use `instances` for sessions per model"),
    ("platform", "sluice serves ONNX files only; remove it"),
];

impl ModelSettings {
    /// Parses the JSON text of model-settings.json; `folder_name` is the model folder's name
    /// (default `name`). Fields not given come from `defaults`; JSON `null` counts as not given,
    /// except `intra_op_threads: null`, which means "derived from the cores".
    pub fn parse(
        json: &str,
        folder_name: &str,
        defaults: &ModelDefaults,
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

        let name = match get(top, "name") {
            Some(v) => w
                .string(v, "name", "a string")
                .and_then(|n| match validate_model_name(n) {
                    Ok(()) => Some(n.to_owned()),
                    Err(e) => w.push(format!("`name`: {e}")),
                }),
            None => match validate_model_name(folder_name) {
                Ok(()) => Some(folder_name.to_owned()),
                Err(e) => w.push(format!(
                    "`name` is not set and the folder name cannot be used: {e}"
                )),
            },
        };

        let params = get(top, "parameters").and_then(|v| w.object(v, "parameters.", PARAMETERS));
        let uri = match params.and_then(|p| get(p, "uri")) {
            Some(v) => w
                .string(v, "parameters.uri", "a relative path")
                .and_then(|s| w.uri(s)),
            None => Some(PathBuf::from("model.onnx")),
        };
        let version = params.and_then(|p| get(p, "version")).and_then(|v| {
            let expected = "1 to 64 characters of [A-Za-z0-9_.-]";
            let s = w.string(v, "parameters.version", expected)?;
            let ok = (1..=64).contains(&s.len())
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
            if ok {
                Some(s.to_owned())
            } else {
                w.bad("parameters.version", expected, v)
            }
        });

        let batcher = get(top, "batcher").and_then(|v| w.object(v, "batcher.", BATCHER));
        let kserve = |key: &str| batcher.and_then(|b| get(b, key));
        let max_batch_size = {
            let ml = get(top, "max_batch_size").and_then(|v| w.int(v, "max_batch_size", 0, 65536));
            let ks = kserve("maxBatchSize").and_then(|v| w.int(v, "batcher.maxBatchSize", 0, 65536));
            w.merge(
                ("max_batch_size", ml.map(|n| n as f64)),
                ("batcher.maxBatchSize", ks.map(|n| n as f64)),
                "",
            )
        };
        let max_batch_time = {
            let ml = get(top, "max_batch_time").and_then(|v| {
                w.number(v, "max_batch_time", "a number of seconds between 0 and 60", |x| {
                    (0.0..=60.0).contains(&x)
                })
            });
            let ks = kserve("maxLatency").and_then(|v| {
                let expected = "a number of milliseconds between 0 and 60000";
                w.number(v, "batcher.maxLatency", expected, |x| {
                    (0.0..=60_000.0).contains(&x)
                })
            });
            w.merge(
                ("max_batch_time", ml),
                ("batcher.maxLatency", ks.map(|ms| ms / 1000.0)),
                " s",
            )
        };
        let timeout = {
            let expected = "a number of seconds greater than 0 and at most 86400";
            let in_range = |x: f64| x > 0.0 && x <= 86_400.0;
            let ml = get(top, "timeout").and_then(|v| w.number(v, "timeout", expected, in_range));
            let ks = kserve("timeout").and_then(|v| w.number(v, "batcher.timeout", expected, in_range));
            w.merge(("timeout", ml), ("batcher.timeout", ks), " s")
        };
        let policy = get(top, "batch_policy").and_then(|v| w.choice(v, "batch_policy", POLICIES, false));
        let max_queue_size =
            get(top, "max_queue_size").and_then(|v| w.int(v, "max_queue_size", 1, 1_000_000));
        let instances = get(top, "instances").and_then(|v| w.int(v, "instances", 1, 64));
        let provider =
            get(top, "execution_provider").and_then(|v| w.choice(v, "execution_provider", PROVIDERS, false));
        let device_ids = get(top, "device_ids").map(|v| w.device_ids(v));
        let threads = "an integer between 1 and 1024 or null";
        let intra_op_threads = match top.get("intra_op_threads") {
            None => defaults.intra_op_threads,
            Some(Value::Null) => None,
            Some(v) => w
                .int_as(v, "intra_op_threads", 1, 1024, threads)
                .map(|n| n as usize),
        };
        let warmup = get(top, "warmup").and_then(|v| w.boolean(v, "warmup"));

        let mut cuda = CudaOptions::default();
        if let Some(c) = get(top, "cuda").and_then(|v| w.object(v, "cuda.", CUDA)) {
            let bytes = "an integer number of bytes, at least 1";
            cuda.gpu_mem_limit =
                get(c, "gpu_mem_limit").and_then(|v| w.int_as(v, "cuda.gpu_mem_limit", 1, u64::MAX, bytes));
            cuda.arena_extend_strategy = get(c, "arena_extend_strategy")
                .and_then(|v| w.choice(v, "cuda.arena_extend_strategy", ARENA, true));
            cuda.cudnn_conv_algo_search = get(c, "cudnn_conv_algo_search")
                .and_then(|v| w.choice(v, "cuda.cudnn_conv_algo_search", CUDNN, true));
            cuda.do_copy_in_default_stream = get(c, "do_copy_in_default_stream")
                .and_then(|v| w.boolean(v, "cuda.do_copy_in_default_stream"));
        }
        if provider == Some(ExecutionProvider::Cpu) && !cuda.is_empty() {
            w.problems.push(
                "`cuda` options are set but `execution_provider` is \"cpu\"; remove one of them".into(),
            );
        }

        if !w.problems.is_empty() {
            return Err(SettingsError { problems: w.problems });
        }
        Ok(ModelSettings {
            name: name.unwrap_or_default(),
            uri: uri.unwrap_or_default(),
            version,
            batching: BatchSettings {
                max_batch_size: max_batch_size.map_or(defaults.max_batch_size, |n| n as usize),
                max_batch_time: max_batch_time.map_or(defaults.max_batch_time, Duration::from_secs_f64),
                policy: policy.unwrap_or(defaults.batch_policy),
                max_queue_size: max_queue_size.map_or(defaults.max_queue_size, |n| n as usize),
                timeout: timeout.map_or(defaults.timeout, Duration::from_secs_f64),
            },
            instances: instances.map_or(defaults.instances, |n| n as usize),
            execution_provider: provider.unwrap_or(defaults.execution_provider),
            device_ids: device_ids.unwrap_or_else(|| vec![0]),
            intra_op_threads,
            warmup: warmup.unwrap_or(defaults.warmup),
            cuda,
        })
    }

    /// True when going from `self` to `new` needs new ONNX Runtime sessions: anything other than
    /// changes to the batching fields (`max_batch_size`, `max_batch_time`, `batch_policy`,
    /// `max_queue_size`, `timeout`) and the version label, with the name kept. A changed ONNX file
    /// under the same `uri` is not visible here: the caller compares the files.
    pub fn requires_new_sessions(&self, new: &ModelSettings) -> bool {
        let mut same_sessions = new.clone();
        same_sessions.batching = self.batching;
        same_sessions.version.clone_from(&self.version);
        same_sessions != *self
    }
}

/// Serializes a duration as fractional seconds.
fn secs<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

fn lookup<T: Copy>(options: &[(&str, T)], s: &str) -> Option<T> {
    options.iter().find(|(name, _)| *name == s).map(|(_, t)| *t)
}

/// A field's value, with `null` counting as absent.
fn get<'a>(obj: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    obj.get(key).filter(|v| !v.is_null())
}

/// A value as JSON text for messages, cut short when long.
fn describe(v: &Value) -> String {
    let s = v.to_string();
    match s.char_indices().nth(40) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s,
    }
}

/// Levenshtein distance, for did-you-mean suggestions.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diag = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let next = (diag + usize::from(ca != *cb))
                .min(row[j] + 1)
                .min(row[j + 1] + 1);
            diag = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

/// Walks the JSON value, collecting every problem. Each checker returns `None` on a problem.
#[derive(Default)]
struct Walker {
    problems: Vec<String>,
}

impl Walker {
    fn push<T>(&mut self, problem: String) -> Option<T> {
        self.problems.push(problem);
        None
    }

    fn bad<T>(&mut self, path: &str, expected: &str, got: &Value) -> Option<T> {
        self.push(format!("`{path}` must be {expected}, got {}", describe(got)))
    }

    /// `v` as an object whose keys are all in `known`; `prefix` is its path plus `.` (or empty).
    fn object<'a>(&mut self, v: &'a Value, prefix: &str, known: &str) -> Option<&'a Map<String, Value>> {
        let Some(obj) = v.as_object() else {
            // The caller reports a top level that is not an object itself.
            return if prefix.is_empty() {
                None
            } else {
                self.bad(prefix.trim_end_matches('.'), "an object", v)
            };
        };
        let fields = || known.split_whitespace();
        for key in obj.keys().filter(|k| !fields().any(|f| f == k.as_str())) {
            let foreign = FOREIGN.iter().find(|(f, _)| prefix.is_empty() && f == key);
            let hint = match (foreign, fields().map(|f| (edit_distance(key, f), f)).min()) {
                (Some((_, hint)), _) => hint.to_string(),
                (None, Some((..=2, f))) => format!("did you mean `{prefix}{f}`?"),
                _ => format!("known fields: `{}`", fields().collect::<Vec<_>>().join("`, `")),
            };
            let problem = format!("`{prefix}{key}` is an unknown field ({hint})");
            self.problems.push(problem);
        }
        Some(obj)
    }

    fn string<'a>(&mut self, v: &'a Value, path: &str, expected: &str) -> Option<&'a str> {
        v.as_str().or_else(|| self.bad(path, expected, v))
    }

    fn boolean(&mut self, v: &Value, path: &str) -> Option<bool> {
        v.as_bool().or_else(|| self.bad(path, "true or false", v))
    }

    fn int(&mut self, v: &Value, path: &str, lo: u64, hi: u64) -> Option<u64> {
        self.int_as(v, path, lo, hi, &format!("an integer between {lo} and {hi}"))
    }

    fn int_as(&mut self, v: &Value, path: &str, lo: u64, hi: u64, expected: &str) -> Option<u64> {
        v.as_u64()
            .filter(|n| (lo..=hi).contains(n))
            .or_else(|| self.bad(path, expected, v))
    }

    fn number(&mut self, v: &Value, path: &str, expected: &str, ok: impl Fn(f64) -> bool) -> Option<f64> {
        v.as_f64()
            .filter(|x| x.is_finite() && ok(*x))
            .or_else(|| self.bad(path, expected, v))
    }

    /// One of the named `options`, or (with `ints`) its index in them, as Triton writes it.
    fn choice<T: Copy>(&mut self, v: &Value, path: &str, options: &[(&str, T)], ints: bool) -> Option<T> {
        let found = match v {
            Value::String(s) => lookup(options, s),
            Value::Number(n) if ints => n.as_u64().and_then(|i| options.get(i as usize)).map(|(_, t)| *t),
            _ => None,
        };
        found.or_else(|| {
            let names: Vec<String> = options.iter().map(|(s, _)| format!("{s:?}")).collect();
            let ints = if ints {
                format!(" (or 0 to {})", options.len() - 1)
            } else {
                String::new()
            };
            self.bad(path, &format!("one of {}{ints}", names.join(", ")), v)
        })
    }

    /// A relative path inside the model folder, with `.` components removed.
    fn uri(&mut self, s: &str) -> Option<PathBuf> {
        let expected = "a relative path to a file inside the model folder";
        let path = std::path::Path::new(s);
        let why = if s.is_empty() {
            "it is empty"
        } else if path.has_root() || s.starts_with('\\') || s.get(1..2) == Some(":") {
            "absolute paths are not allowed"
        } else if path.components().any(|c| c == Component::ParentDir) {
            "`..` is not allowed"
        } else {
            let normal: PathBuf = path.components().filter(|c| *c != Component::CurDir).collect();
            if !s.ends_with('/') && normal.file_name().is_some() {
                return Some(normal);
            }
            "it names no file"
        };
        self.push(format!("`parameters.uri` must be {expected}, got {s:?} ({why})"))
    }

    fn device_ids(&mut self, v: &Value) -> Vec<u32> {
        let expected = "a non-empty array of GPU indices (integers between 0 and 63)";
        let ids = match v.as_array() {
            Some(a) if !a.is_empty() => a,
            _ => return self.bad("device_ids", expected, v).unwrap_or_default(),
        };
        let mut out: Vec<u32> = Vec::with_capacity(ids.len());
        for (i, id) in ids.iter().enumerate() {
            match self.int(id, &format!("device_ids[{i}]"), 0, 63) {
                Some(n) if out.contains(&(n as u32)) => {
                    self.problems
                        .push(format!("`device_ids` lists device {n} more than once"));
                }
                Some(n) => out.push(n as u32),
                None => {}
            }
        }
        out
    }

    /// Reconciles an MLServer field with its KServe twin (same unit): equal or one given is fine.
    fn merge(&mut self, ml: (&str, Option<f64>), ks: (&str, Option<f64>), unit: &str) -> Option<f64> {
        match (ml.1, ks.1) {
            (Some(a), Some(b)) if (a - b).abs() > 1e-9 => {
                let (m, k) = (ml.0, ks.0);
                self.push(format!(
                    "`{k}` and `{m}` disagree ({b}{unit} vs {a}{unit}); set only one of them"
                ))
            }
            (a, b) => a.or(b),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<ModelSettings, SettingsError> {
        ModelSettings::parse(json, "digits", &ModelDefaults::default())
    }

    fn problems(json: &str) -> Vec<String> {
        parse(json).expect_err("should fail").problems
    }

    fn ok(json: &str) -> ModelSettings {
        parse(json).unwrap_or_else(|e| panic!("{json}: {e}"))
    }

    #[test]
    fn empty_object_gives_defaults_and_folder_name() {
        let s = ok("{}");
        assert_eq!(s.name, "digits");
        assert_eq!(s.uri, PathBuf::from("model.onnx"));
        assert_eq!(s.version, None);
        let b = s.batching;
        assert_eq!(
            (b.max_batch_size, b.max_batch_time),
            (32, Duration::from_millis(10))
        );
        assert_eq!(
            (b.policy, b.max_queue_size, b.timeout),
            (BatchPolicyKind::Adaptive, 1024, Duration::from_secs(60))
        );
        assert!(b.batching_enabled());
        assert_eq!((s.instances, s.execution_provider), (1, ExecutionProvider::Auto));
        assert_eq!(
            (s.device_ids, s.intra_op_threads, s.warmup),
            (vec![0], None, true)
        );
        assert!(s.cuda.is_empty());
    }

    #[test]
    fn full_file_with_every_field() {
        let s = ok(r#"{
            "name": "mnist-v2", "parameters": {"uri": "./onnx/model.onnx", "version": "v0.1.0"},
            "max_batch_size": 64, "max_batch_time": 0.005, "batch_policy": "fixed", "max_queue_size": 10,
            "timeout": 2.5, "instances": 2, "execution_provider": "cuda", "device_ids": [1, 0],
            "intra_op_threads": 4, "warmup": false,
            "cuda": {"gpu_mem_limit": 1073741824, "arena_extend_strategy": "kSameAsRequested",
                     "cudnn_conv_algo_search": "HEURISTIC", "do_copy_in_default_stream": true}
        }"#);
        let batching = BatchSettings {
            max_batch_size: 64,
            max_batch_time: Duration::from_micros(5000),
            policy: BatchPolicyKind::Fixed,
            max_queue_size: 10,
            timeout: Duration::from_millis(2500),
        };
        let cuda = CudaOptions {
            gpu_mem_limit: Some(1 << 30),
            arena_extend_strategy: Some(ArenaExtendStrategy::SameAsRequested),
            cudnn_conv_algo_search: Some(CudnnConvAlgoSearch::Heuristic),
            do_copy_in_default_stream: Some(true),
        };
        let expected = ModelSettings {
            name: "mnist-v2".into(),
            uri: PathBuf::from("onnx/model.onnx"),
            version: Some("v0.1.0".into()),
            batching,
            instances: 2,
            execution_provider: ExecutionProvider::Cuda,
            device_ids: vec![1, 0],
            intra_op_threads: Some(4),
            warmup: false,
            cuda,
        };
        assert_eq!(s, expected);
    }

    #[test]
    fn server_defaults_fill_missing_fields_and_file_wins() {
        let defaults = ModelDefaults {
            max_batch_size: 8,
            max_batch_time: Duration::from_millis(3),
            batch_policy: BatchPolicyKind::Fixed,
            max_queue_size: 5,
            timeout: Duration::from_secs(7),
            instances: 3,
            execution_provider: ExecutionProvider::Cpu,
            intra_op_threads: Some(2),
            warmup: false,
        };
        let s = ModelSettings::parse("{}", "m", &defaults).unwrap();
        let b = s.batching;
        assert_eq!(
            (b.max_batch_size, b.max_batch_time, b.policy),
            (8, Duration::from_millis(3), BatchPolicyKind::Fixed)
        );
        assert_eq!(
            (b.max_queue_size, b.timeout, s.instances),
            (5, Duration::from_secs(7), 3)
        );
        assert_eq!(
            (s.execution_provider, s.intra_op_threads, s.warmup),
            (ExecutionProvider::Cpu, Some(2), false)
        );
        let s = ModelSettings::parse(
            r#"{"max_batch_size": 1, "intra_op_threads": null}"#,
            "m",
            &defaults,
        )
        .unwrap();
        assert_eq!((s.batching.max_batch_size, s.intra_op_threads), (1, None));
        assert!(!s.batching.batching_enabled());
        // A CPU-only server default does not make a model's cuda options a contradiction.
        assert!(ModelSettings::parse(r#"{"cuda": {"gpu_mem_limit": 1}}"#, "m", &defaults).is_ok());
    }

    #[test]
    fn defaults_validate_uses_the_same_ranges() {
        assert_eq!(ModelDefaults::default().validate(), Ok(()));
        let bad = ModelDefaults {
            max_batch_size: 70_000,
            max_batch_time: Duration::from_secs(61),
            ..Default::default()
        };
        let e = bad.validate().unwrap_err();
        assert_eq!(e.problems.len(), 2, "{e}");
        assert!(
            e.problems[0].starts_with("`max_batch_size` must be an integer between 0 and 65536"),
            "{e}"
        );
    }

    #[test]
    fn null_counts_as_not_given() {
        let s = ok(
            r#"{"name": null, "parameters": {"uri": null, "version": null}, "max_batch_size": null, "cuda": null}"#,
        );
        assert_eq!((s.name.as_str(), s.batching.max_batch_size), ("digits", 32));
        assert_eq!(s.uri, PathBuf::from("model.onnx"));
    }

    #[test]
    fn kserve_batcher_names_convert_milliseconds() {
        let s = ok(r#"{"batcher": {"maxBatchSize": 16, "maxLatency": 500, "timeout": 30}}"#);
        assert_eq!(s.batching.max_batch_size, 16);
        assert_eq!(s.batching.max_batch_time, Duration::from_millis(500));
        assert_eq!(s.batching.timeout, Duration::from_secs(30));
        // Equal values under both names are fine (10 ms == 0.01 s).
        let s = ok(
            r#"{"max_batch_time": 0.01, "max_batch_size": 8, "batcher": {"maxBatchSize": 8, "maxLatency": 10}}"#,
        );
        assert_eq!(
            (s.batching.max_batch_size, s.batching.max_batch_time),
            (8, Duration::from_millis(10))
        );
    }

    #[test]
    fn kserve_conflicts_name_both_fields() {
        let p = problems(
            r#"{"max_batch_size": 32, "max_batch_time": 0.01, "timeout": 5,
                "batcher": {"maxBatchSize": 16, "maxLatency": 500, "timeout": 6}}"#,
        );
        assert_eq!(
            p,
            [
                "`batcher.maxBatchSize` and `max_batch_size` disagree (16 vs 32); set only one of them",
                "`batcher.maxLatency` and `max_batch_time` disagree (0.5 s vs 0.01 s); set only one of them",
                "`batcher.timeout` and `timeout` disagree (6 s vs 5 s); set only one of them",
            ]
        );
        assert_eq!(
            problems(r#"{"batcher": {"maxLatency": 60001}}"#),
            ["`batcher.maxLatency` must be a number of milliseconds between 0 and 60000, got 60001"]
        );
    }

    #[test]
    fn unknown_fields_are_named_with_path_and_suggestion() {
        assert_eq!(
            problems(r#"{"max_batch_sise": 32}"#),
            ["`max_batch_sise` is an unknown field (did you mean `max_batch_size`?)"]
        );
        let p = problems(
            r#"{"parameters": {"url": "m.onnx"}, "cuda": {"gpu_mem_limt": 1}, "batcher": {"maxBatchsize": 2}}"#,
        );
        assert_eq!(
            p,
            [
                "`parameters.url` is an unknown field (did you mean `parameters.uri`?)",
                "`batcher.maxBatchsize` is an unknown field (did you mean `batcher.maxBatchSize`?)",
                "`cuda.gpu_mem_limt` is an unknown field (did you mean `cuda.gpu_mem_limit`?)",
            ]
        );
    }

    #[test]
    fn unknown_fields_without_suggestion_list_the_known_ones_or_hint() {
        assert_eq!(
            problems(r#"{"parameters": {"content_type": "np"}}"#),
            ["`parameters.content_type` is an unknown field (known fields: `uri`, `version`)"]
        );
        assert_eq!(
            problems(r#"{"implementation": "mlserver_sklearn.SKLearnModel", "parallel_workers": 2}"#),
            [
                "`implementation` is an unknown field (sluice serves ONNX files itself; remove it)",
                "`parallel_workers` is an unknown field (use `instances` for sessions per model)",
            ]
        );
    }

    #[test]
    fn wrong_types_name_field_expectation_and_value() {
        let p = problems(
            r#"{"max_batch_size": "32", "warmup": "yes", "name": 7, "parameters": [1],
                "device_ids": 0, "max_batch_time": "10ms", "cuda": true}"#,
        );
        assert_eq!(
            p,
            [
                "`name` must be a string, got 7",
                "`parameters` must be an object, got [1]",
                "`max_batch_size` must be an integer between 0 and 65536, got \"32\"",
                "`max_batch_time` must be a number of seconds between 0 and 60, got \"10ms\"",
                "`device_ids` must be a non-empty array of GPU indices (integers between 0 and 63), got 0",
                "`warmup` must be true or false, got \"yes\"",
                "`cuda` must be an object, got true",
            ]
        );
    }

    #[test]
    fn integer_ranges_are_named() {
        let p = problems(
            r#"{"max_batch_size": 65537, "max_queue_size": 0, "instances": 65, "intra_op_threads": 0,
                "cuda": {"gpu_mem_limit": 0}}"#,
        );
        assert_eq!(
            p,
            [
                "`max_batch_size` must be an integer between 0 and 65536, got 65537",
                "`max_queue_size` must be an integer between 1 and 1000000, got 0",
                "`instances` must be an integer between 1 and 64, got 65",
                "`intra_op_threads` must be an integer between 1 and 1024 or null, got 0",
                "`cuda.gpu_mem_limit` must be an integer number of bytes, at least 1, got 0",
            ]
        );
        assert_eq!(
            problems(r#"{"instances": 1.5}"#),
            ["`instances` must be an integer between 1 and 64, got 1.5"]
        );
        assert_eq!(
            problems(r#"{"instances": -1}"#),
            ["`instances` must be an integer between 1 and 64, got -1"]
        );
    }

    #[test]
    fn time_ranges_are_named() {
        let p = problems(r#"{"max_batch_time": 60.5, "timeout": 0}"#);
        assert_eq!(
            p,
            [
                "`max_batch_time` must be a number of seconds between 0 and 60, got 60.5",
                "`timeout` must be a number of seconds greater than 0 and at most 86400, got 0",
            ]
        );
        assert_eq!(problems(r#"{"max_batch_time": -0.001}"#).len(), 1);
        assert_eq!(problems(r#"{"timeout": 86400.5}"#).len(), 1);
    }

    #[test]
    fn range_boundaries_are_accepted() {
        let s = ok(
            r#"{"max_batch_size": 65536, "max_batch_time": 60, "max_queue_size": 1000000, "timeout": 86400,
                       "instances": 64, "intra_op_threads": 1024, "device_ids": [63]}"#,
        );
        assert_eq!(s.batching.max_batch_time, Duration::from_secs(60));
        let s = ok(
            r#"{"max_batch_size": 0, "max_batch_time": 0, "max_queue_size": 1, "timeout": 0.001,
                       "instances": 1, "intra_op_threads": 1, "device_ids": [0]}"#,
        );
        assert!(!s.batching.batching_enabled());
        assert_eq!(s.batching.max_batch_time, Duration::ZERO);
    }

    #[test]
    fn device_ids_are_checked_one_by_one() {
        let p = problems(r#"{"device_ids": [0, 64, 0, "1"]}"#);
        assert_eq!(
            p,
            [
                "`device_ids[1]` must be an integer between 0 and 63, got 64",
                "`device_ids` lists device 0 more than once",
                "`device_ids[3]` must be an integer between 0 and 63, got \"1\"",
            ]
        );
        assert_eq!(problems(r#"{"device_ids": []}"#).len(), 1);
    }

    #[test]
    fn enums_accept_names_and_triton_ints() {
        let s = ok(r#"{"cuda": {"arena_extend_strategy": 0, "cudnn_conv_algo_search": 2}}"#);
        assert_eq!(
            s.cuda.arena_extend_strategy,
            Some(ArenaExtendStrategy::NextPowerOfTwo)
        );
        assert_eq!(s.cuda.cudnn_conv_algo_search, Some(CudnnConvAlgoSearch::Default));
        let s = ok(
            r#"{"cuda": {"arena_extend_strategy": "kNextPowerOfTwo", "cudnn_conv_algo_search": "EXHAUSTIVE"}}"#,
        );
        assert_eq!(
            s.cuda.cudnn_conv_algo_search,
            Some(CudnnConvAlgoSearch::Exhaustive)
        );
        let p = problems(
            r#"{"batch_policy": "Fixed", "execution_provider": "gpu",
                "cuda": {"arena_extend_strategy": 2, "cudnn_conv_algo_search": "heuristic"}}"#,
        );
        assert_eq!(
            p,
            [
                "`batch_policy` must be one of \"adaptive\", \"fixed\", got \"Fixed\"",
                "`execution_provider` must be one of \"auto\", \"cpu\", \"cuda\", got \"gpu\"",
                "`cuda.arena_extend_strategy` must be one of \"kNextPowerOfTwo\", \"kSameAsRequested\" (or 0 to 1), got 2",
                "`cuda.cudnn_conv_algo_search` must be one of \"EXHAUSTIVE\", \"HEURISTIC\", \"DEFAULT\" (or 0 to 2), got \"heuristic\"",
            ]
        );
        assert_eq!(
            problems(r#"{"execution_provider": 1}"#).len(),
            1,
            "ints only where Triton uses them"
        );
    }

    #[test]
    fn cuda_options_contradict_cpu_provider() {
        assert_eq!(
            problems(r#"{"execution_provider": "cpu", "cuda": {"do_copy_in_default_stream": false}}"#),
            ["`cuda` options are set but `execution_provider` is \"cpu\"; remove one of them"]
        );
        assert!(parse(r#"{"execution_provider": "cpu", "cuda": {}}"#).is_ok());
        assert!(parse(r#"{"execution_provider": "auto", "cuda": {"gpu_mem_limit": 1}}"#).is_ok());
    }

    #[test]
    fn all_problems_are_collected_and_displayed_joined() {
        let e = parse(r#"{"max_batch_size": -1, "timeout": "x", "warmup": 1, "bogus": 1}"#).unwrap_err();
        assert_eq!(e.problems.len(), 4, "{e}");
        assert_eq!(e.to_string(), e.problems.join("; "));
        assert!(e.problems.iter().all(|p| p.starts_with('`')), "{e}");
    }

    #[test]
    fn invalid_json_reports_line_and_column() {
        let p = problems("{\n  \"max_batch_size\": 32,\n}");
        assert_eq!(p.len(), 1);
        assert!(
            p[0].starts_with("invalid JSON: ") && p[0].contains("line 3 column 1"),
            "{p:?}"
        );
        assert_eq!(
            problems("[1, 2]"),
            ["the file must hold a JSON object, got [1,2]"]
        );
        assert_eq!(
            problems(""),
            ["invalid JSON: EOF while parsing a value at line 1 column 0"]
        );
    }

    #[test]
    fn model_names_follow_the_pattern() {
        for good in ["a", "digits", "Res-Net_50.v2", "0", &"x".repeat(128)] {
            assert_eq!(validate_model_name(good), Ok(()), "{good}");
        }
        for bad in ["", "-a", ".hidden", "_x", "a b", "a/b", "é", &"x".repeat(129)] {
            assert!(validate_model_name(bad).is_err(), "{bad}");
        }
        let e = validate_model_name("my model").unwrap_err();
        assert_eq!(
            e,
            "model name \"my model\" does not match `[A-Za-z0-9][A-Za-z0-9_.-]{0,127}`: ' ' is not allowed"
        );
        assert_eq!(problems(r#"{"name": "a/b"}"#).len(), 1);
        assert!(problems(r#"{"name": "a/b"}"#)[0].starts_with("`name`: model name \"a/b\""));
    }

    #[test]
    fn invalid_folder_name_needs_an_explicit_name() {
        let defaults = ModelDefaults::default();
        let e = ModelSettings::parse("{}", "my model", &defaults).unwrap_err();
        assert!(
            e.problems[0].starts_with("`name` is not set and the folder name cannot be used: "),
            "{e}"
        );
        let s = ModelSettings::parse(r#"{"name": "my-model"}"#, "my model", &defaults).unwrap();
        assert_eq!(s.name, "my-model");
    }

    #[test]
    fn uri_must_stay_inside_the_folder() {
        let cases = [
            ("/etc/model.onnx", "absolute paths are not allowed"),
            ("../other/model.onnx", "`..` is not allowed"),
            ("sub/../../x.onnx", "`..` is not allowed"),
            ("", "it is empty"),
            ("./", "it names no file"),
        ];
        for (uri, why) in cases {
            let p = problems(&format!(r#"{{"parameters": {{"uri": "{uri}"}}}}"#));
            let expected = format!("`parameters.uri` must be a relative path to a file inside the model folder, got {uri:?} ({why})");
            assert_eq!(p, [expected]);
        }
        assert_eq!(
            ok(r#"{"parameters": {"uri": "./a/./b.onnx"}}"#).uri,
            PathBuf::from("a/b.onnx")
        );
        assert_eq!(
            problems(r#"{"parameters": {"uri": 3}}"#),
            ["`parameters.uri` must be a relative path, got 3"]
        );
    }

    #[test]
    fn version_label_is_checked() {
        assert_eq!(
            ok(r#"{"parameters": {"version": "1.2.3-rc_1"}}"#)
                .version
                .as_deref(),
            Some("1.2.3-rc_1")
        );
        let long = "v".repeat(65);
        for bad in ["", "v 1", long.as_str()] {
            let p = problems(&format!(r#"{{"parameters": {{"version": "{bad}"}}}}"#));
            assert_eq!(p.len(), 1);
            assert!(
                p[0].starts_with("`parameters.version` must be 1 to 64 characters of [A-Za-z0-9_.-], got")
            );
        }
    }

    #[test]
    fn batching_and_version_changes_keep_sessions() {
        let old = ok(r#"{"parameters": {"version": "1"}}"#);
        let new = ok(
            r#"{"parameters": {"version": "2"}, "max_batch_size": 4, "max_batch_time": 0.5,
                         "batch_policy": "fixed", "max_queue_size": 9, "timeout": 1}"#,
        );
        assert!(!old.requires_new_sessions(&new));
        assert!(!old.requires_new_sessions(&old.clone()));
    }

    #[test]
    fn other_changes_need_new_sessions() {
        let old = ok("{}");
        let changes = [
            r#"{"name": "other"}"#,
            r#"{"parameters": {"uri": "other.onnx"}}"#,
            r#"{"instances": 2}"#,
            r#"{"execution_provider": "cpu"}"#,
            r#"{"device_ids": [1]}"#,
            r#"{"intra_op_threads": 2}"#,
            r#"{"warmup": false}"#,
            r#"{"cuda": {"gpu_mem_limit": 1024}}"#,
        ];
        for json in changes {
            assert!(old.requires_new_sessions(&ok(json)), "{json}");
        }
    }

    #[test]
    fn serializes_durations_as_seconds_and_enums_by_name() {
        let s = ok(
            r#"{"max_batch_time": 0.25, "cuda": {"arena_extend_strategy": 1, "cudnn_conv_algo_search": 0}}"#,
        );
        let v = serde_json::to_value(&s).unwrap();
        assert_eq!(v["batching"]["max_batch_time"], 0.25);
        assert_eq!(v["batching"]["timeout"], 60.0);
        assert_eq!(v["batching"]["policy"], "adaptive");
        assert_eq!(v["execution_provider"], "auto");
        assert_eq!(v["uri"], "model.onnx");
        assert_eq!(v["cuda"]["arena_extend_strategy"], "kSameAsRequested");
        assert_eq!(v["cuda"]["cudnn_conv_algo_search"], "EXHAUSTIVE");
        assert_eq!(ExecutionProvider::Cuda.to_string(), "cuda");
        assert_eq!("fixed".parse::<BatchPolicyKind>(), Ok(BatchPolicyKind::Fixed));
        assert!("GPU".parse::<ExecutionProvider>().is_err());
    }
}
