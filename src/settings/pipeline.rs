//! A pipeline's settings: steps that are other models of the repository,
//! the folder's own ONNX file, or built-in text steps, wired by tensor name.
//! Written as `model-settings.json`'s `pipeline` object, mapped from a
//! `config.pbtxt`'s `ensemble_scheduling` (`src/triton/mapping/ensemble.rs`),
//! or made for a sentence-transformers folder (`repository/sentence.rs`).

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde_json::Value;

use super::walk::{get, Walker};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PipelineSettings {
    /// In the order written; a step runs once its inputs exist, so
    /// independent steps run at once whatever their order.
    pub steps: Vec<Step>,
    /// The pipeline tensors it answers with (a step's output each).
    pub outputs: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// How errors name the step: `name`, else `step N (what it runs)`.
    pub name: String,
    pub kind: StepKind,
    /// The step's input name → the pipeline tensor it takes (Triton's `input_map`).
    pub inputs: BTreeMap<String, String>,
    /// The step's output name → the pipeline tensor it makes (Triton's `output_map`).
    pub outputs: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepKind {
    /// Another model of the repository, through its own batcher.
    Model { model: String, version: Option<String> },
    /// The folder's own ONNX file, through the pipeline's batcher.
    Own,
    /// Texts (BYTES) → `input_ids`, `attention_mask`, `token_type_ids`.
    Tokenizer(TokenizerStep),
    /// Token embeddings and their attention mask → one vector per text.
    Pooling(PoolingStep),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenizerStep {
    /// A Hugging Face `tokenizer.json`, relative to the model folder.
    pub file: PathBuf,
    /// Tokens kept per text (`[CLS]` and `[SEP]` included); the file's own
    /// truncation when unset.
    pub max_length: Option<usize>,
    /// Token ids and masks as INT32 instead of INT64 (for an encoder that takes INT32).
    pub int32: bool,
    /// The most texts one request may carry (`max_texts`).
    pub max_texts: usize,
    /// The longest text, in bytes of UTF-8 (`max_text_bytes`), checked before
    /// tokenizing: a text is cut to `max_length` tokens only after all of it
    /// has been tokenized.
    pub max_text_bytes: usize,
}

/// `max_texts` when unset: OpenAI's limit of inputs per embeddings request.
pub const DEFAULT_MAX_TEXTS: usize = 2048;
/// `max_text_bytes` when unset: more than the context of common encoders
/// (8,192 tokens) in any script.
pub const DEFAULT_MAX_TEXT_BYTES: usize = 128 << 10;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolingStep {
    pub mode: PoolingMode,
    /// Scale each vector to length 1 (sentence-transformers' `Normalize`).
    pub normalize: bool,
}

/// How token vectors become one (sentence-transformers' `pooling_mode_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolingMode {
    /// The mean of the tokens the attention mask keeps.
    Mean,
    /// The first token's vector (`[CLS]`).
    Cls,
    /// The largest value of each dimension over the kept tokens.
    Max,
    /// The sum of the kept tokens over the square root of their count.
    MeanSqrtLen,
}

impl StepKind {
    /// What the step runs, for messages.
    pub fn describe(&self) -> String {
        match self {
            StepKind::Model { model, version: None } => format!("model `{model}`"),
            StepKind::Model {
                model,
                version: Some(v),
            } => format!("model `{model}` version {v}"),
            StepKind::Own => "the folder's ONNX file".into(),
            StepKind::Tokenizer(_) => "tokenizer".into(),
            StepKind::Pooling(_) => "pooling".into(),
        }
    }
}

impl Step {
    /// A built-in step's standard names, mapped to pipeline tensors of the same names.
    pub fn builtin(name: &str, kind: StepKind) -> Step {
        let (ins, outs) = builtin_names(&kind);
        Step {
            name: name.to_string(),
            inputs: same_names(ins),
            outputs: same_names(outs),
            kind,
        }
    }
}

/// Each name mapped to the pipeline tensor of the same name.
pub fn same_names(names: &[&str]) -> BTreeMap<String, String> {
    names.iter().map(|n| (n.to_string(), n.to_string())).collect()
}

/// The input and output names of a built-in step.
pub fn builtin_names(kind: &StepKind) -> (&'static [&'static str], &'static [&'static str]) {
    match kind {
        StepKind::Tokenizer(_) => (&["text"], &["input_ids", "attention_mask", "token_type_ids"]),
        StepKind::Pooling(_) => (&["token_embeddings", "attention_mask"], &["embedding"]),
        StepKind::Model { .. } | StepKind::Own => (&[], &[]),
    }
}

impl PipelineSettings {
    /// Every tensor some step consumes and no step makes: the pipeline's inputs.
    pub fn inputs(&self) -> Vec<String> {
        let made: std::collections::BTreeSet<&String> =
            self.steps.iter().flat_map(|s| s.outputs.values()).collect();
        let mut out: Vec<String> = Vec::new();
        for t in self.steps.iter().flat_map(|s| s.inputs.values()) {
            if !made.contains(t) && !out.contains(t) {
                out.push(t.clone());
            }
        }
        out
    }

    /// Checks the wiring: every step's input is a pipeline input or another
    /// step's output, no tensor is made twice, no step waits on itself
    /// through others, and every output is made. Problems name the step.
    pub fn check(&self) -> Vec<String> {
        let mut problems = Vec::new();
        let mut maker: BTreeMap<&str, &str> = BTreeMap::new();
        for s in &self.steps {
            for t in s.outputs.values() {
                if let Some(first) = maker.insert(t, &s.name) {
                    problems.push(format!("tensor `{t}` is made by both {first} and {}", s.name));
                }
            }
        }
        for o in &self.outputs {
            if !maker.contains_key(o.as_str()) {
                problems.push(format!(
                    "output `{o}` is made by no step; map a step's output to it"
                ));
            }
        }
        if self.steps.is_empty() {
            problems.push("a pipeline needs at least one step".into());
        }
        if problems.is_empty() {
            if let Err(stuck) = self.order() {
                problems.push(format!("steps wait on each other in a cycle: {stuck}"));
            }
        }
        problems
    }

    /// The steps in an order they can run in, or the names of those that
    /// never can (their inputs wait on themselves through others).
    pub fn order(&self) -> Result<Vec<usize>, String> {
        let mut have: std::collections::BTreeSet<String> = self.inputs().into_iter().collect();
        let mut order = Vec::with_capacity(self.steps.len());
        loop {
            let ready: Vec<usize> = (0..self.steps.len())
                .filter(|i| !order.contains(i) && self.steps[*i].inputs.values().all(|t| have.contains(t)))
                .collect();
            if ready.is_empty() {
                break;
            }
            for i in ready {
                have.extend(self.steps[i].outputs.values().cloned());
                order.push(i);
            }
        }
        let stuck: Vec<&str> = (0..self.steps.len())
            .filter(|i| !order.contains(i))
            .map(|i| self.steps[i].name.as_str())
            .collect();
        match stuck.is_empty() {
            true => Ok(order),
            false => Err(stuck.join(", ")),
        }
    }
}

const PIPELINE: &str = "steps outputs";
const STEP: &str = "name model version tokenizer pooling inputs outputs";
const TOKENIZER: &str = "file max_length dtype max_texts max_text_bytes";
const POOLING: &str = "mode normalize";
const MODES: &[(&str, PoolingMode)] = &[
    ("mean", PoolingMode::Mean),
    ("cls", PoolingMode::Cls),
    ("max", PoolingMode::Max),
    ("mean_sqrt_len", PoolingMode::MeanSqrtLen),
];

impl Walker {
    /// `model-settings.json`'s `pipeline` object.
    pub(super) fn pipeline(&mut self, v: &Value) -> Option<PipelineSettings> {
        let obj = self.object(v, "pipeline.", PIPELINE)?;
        let mut steps = Vec::new();
        let list = match get(obj, "steps") {
            Some(Value::Array(a)) => a.as_slice(),
            other => {
                let got = other.cloned().unwrap_or(Value::Null);
                return self.bad("pipeline.steps", "an array of steps", &got);
            }
        };
        for (i, s) in list.iter().enumerate() {
            if let Some(step) = self.step(i, s) {
                steps.push(step);
            }
        }
        let outputs = match get(obj, "outputs") {
            Some(Value::Array(a)) if a.iter().all(Value::is_string) => {
                a.iter().filter_map(|x| x.as_str().map(str::to_string)).collect()
            }
            Some(v) => return self.bad("pipeline.outputs", "an array of tensor names", v),
            None => {
                return self
                    .push("`pipeline.outputs` is missing: name the tensors the pipeline answers with".into())
            }
        };
        let out = PipelineSettings { steps, outputs };
        for p in out.check() {
            self.push::<()>(format!("`pipeline`: {p}"));
        }
        Some(out)
    }

    fn step(&mut self, i: usize, v: &Value) -> Option<Step> {
        let path = format!("pipeline.steps[{i}]");
        let obj = self.object(v, &format!("{path}."), STEP)?;
        let what: Vec<&str> = ["model", "tokenizer", "pooling"]
            .into_iter()
            .filter(|k| obj.contains_key(*k))
            .collect();
        let kind = match what.as_slice() {
            ["model"] => {
                let model = self.string(&obj["model"], &format!("{path}.model"), "a model name")?;
                let version = match get(obj, "version") {
                    None => None,
                    Some(Value::Number(n)) if n.is_u64() => Some(n.to_string()),
                    Some(Value::String(s)) => Some(s.clone()),
                    Some(v) => return self.bad(&format!("{path}.version"), "a version number", v),
                };
                StepKind::Model {
                    model: model.to_string(),
                    version,
                }
            }
            ["tokenizer"] => StepKind::Tokenizer(self.tokenizer(&obj["tokenizer"], &path)?),
            ["pooling"] => StepKind::Pooling(self.pooling(&obj["pooling"], &path)?),
            _ => {
                return self.push(format!(
                "`{path}` needs exactly one of `model` (a model of the repository), `tokenizer` or `pooling`"
            ))
            }
        };
        let name = match get(obj, "name") {
            Some(v) => self.string(v, &format!("{path}.name"), "a name")?.to_string(),
            None => format!("step {i} ({})", kind.describe()),
        };
        let (ins, outs) = builtin_names(&kind);
        let inputs = self.tensor_map(obj, &path, "inputs", ins)?;
        let outputs = self.tensor_map(obj, &path, "outputs", outs)?;
        Some(Step {
            name,
            kind,
            inputs,
            outputs,
        })
    }

    /// A step's `inputs` or `outputs`: its tensor name → a pipeline tensor.
    /// A built-in step's names are fixed (`known`); left out, each maps to
    /// the pipeline tensor of its own name.
    fn tensor_map(
        &mut self,
        obj: &serde_json::Map<String, Value>,
        path: &str,
        key: &str,
        known: &[&str],
    ) -> Option<BTreeMap<String, String>> {
        let at = format!("{path}.{key}");
        let map = match get(obj, key) {
            None if !known.is_empty() => return Some(same_names(known)),
            None => {
                return self.push(format!(
                    "`{at}` is missing: map the step's tensors to pipeline tensors"
                ))
            }
            Some(Value::Object(m)) => m,
            Some(v) => return self.bad(&at, "an object of step tensor → pipeline tensor", v),
        };
        let mut out = BTreeMap::new();
        for (k, v) in map {
            if !known.is_empty() && !known.contains(&k.as_str()) {
                return self.push(format!(
                    "`{at}.{k}`: the step has no tensor `{k}` (its tensors: `{}`)",
                    known.join("`, `")
                ));
            }
            let t = self.string(v, &format!("{at}.{k}"), "a pipeline tensor name")?;
            out.insert(k.clone(), t.to_string());
        }
        Some(out)
    }

    fn tokenizer(&mut self, v: &Value, path: &str) -> Option<TokenizerStep> {
        let path = format!("{path}.tokenizer");
        let obj = self.object(v, &format!("{path}."), TOKENIZER)?;
        let file = match get(obj, "file") {
            None => PathBuf::from("tokenizer.json"),
            Some(v) => {
                let expected = "a tokenizer.json of the model folder";
                let f = self.string(v, &format!("{path}.file"), expected)?;
                if super::in_folder("file", f).is_err() {
                    return self.bad(&format!("{path}.file"), expected, v);
                }
                PathBuf::from(f)
            }
        };
        let max_length = match get(obj, "max_length") {
            None => None,
            Some(v) => Some(self.int(v, &format!("{path}.max_length"), 2, 1 << 20)? as usize),
        };
        let int32 = match get(obj, "dtype").map(|v| (v, v.as_str())) {
            None | Some((_, Some("INT64"))) => false,
            Some((_, Some("INT32"))) => true,
            Some((v, _)) => return self.bad(&format!("{path}.dtype"), "\"INT64\" or \"INT32\"", v),
        };
        let max_texts = match get(obj, "max_texts") {
            None => DEFAULT_MAX_TEXTS,
            Some(v) => self.int(v, &format!("{path}.max_texts"), 1, 1 << 24)? as usize,
        };
        let max_text_bytes = match get(obj, "max_text_bytes") {
            None => DEFAULT_MAX_TEXT_BYTES,
            Some(v) => self.int(v, &format!("{path}.max_text_bytes"), 1, 1 << 30)? as usize,
        };
        Some(TokenizerStep {
            file,
            max_length,
            int32,
            max_texts,
            max_text_bytes,
        })
    }

    fn pooling(&mut self, v: &Value, path: &str) -> Option<PoolingStep> {
        let path = format!("{path}.pooling");
        let obj = self.object(v, &format!("{path}."), POOLING)?;
        let mode = match get(obj, "mode") {
            None => PoolingMode::Mean,
            Some(v) => self.choice(v, &format!("{path}.mode"), MODES, false)?,
        };
        let normalize = match get(obj, "normalize") {
            None => false,
            Some(v) => self.boolean(v, &format!("{path}.normalize"))?,
        };
        Some(PoolingStep { mode, normalize })
    }
}

/// The pooling mode a sentence-transformers `1_Pooling/config.json` turns on.
pub fn pooling_mode_of(config: &Value) -> Result<PoolingMode, String> {
    let on = |k: &str| config.get(k).and_then(Value::as_bool).unwrap_or(false);
    let modes = [
        ("pooling_mode_mean_tokens", PoolingMode::Mean),
        ("pooling_mode_cls_token", PoolingMode::Cls),
        ("pooling_mode_max_tokens", PoolingMode::Max),
        ("pooling_mode_mean_sqrt_len_tokens", PoolingMode::MeanSqrtLen),
    ];
    let chosen: Vec<_> = modes.iter().filter(|(k, _)| on(k)).collect();
    match chosen.as_slice() {
        [(_, m)] => Ok(*m),
        [] => {
            Err("no `pooling_mode_*` is true; sluice pools by mean, cls, max or mean_sqrt_len tokens".into())
        }
        many => Err(format!(
            "{} pooling modes are on (`{}`); sluice pools by one",
            many.len(),
            many.iter().map(|(k, _)| *k).collect::<Vec<_>>().join("`, `")
        )),
    }
}
