//! A sentence-transformers folder (`modules.json`, `tokenizer.json`,
//! `1_Pooling/config.json`, an ONNX file at `model.onnx` or
//! `onnx/model.onnx`) is a model: text in, one vector per text out, as the
//! pipeline tokenizer → the folder's ONNX file → pooling (→ normalize).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::settings::pipeline::{self, PipelineSettings, PoolingStep, Step, StepKind, TokenizerStep};
use crate::settings::ModelSettings;
use crate::tensor::{DataType, Signature};

/// The file that makes a folder a sentence-transformers one.
pub const MODULES_FILE: &str = "modules.json";

/// The pipeline's input and output as clients see them.
pub const TEXT: &str = "text";
pub const EMBEDDING: &str = "embedding";

/// Whether `dir` is laid out as sentence-transformers saves a model.
pub fn is_folder(dir: &Path) -> bool {
    dir.join(MODULES_FILE).is_file()
}

/// Where the ONNX file is when the settings name none: `model.onnx`, else
/// `onnx/model.onnx` (as the Hugging Face hub's exports place it).
pub fn default_uri(dir: &Path) -> Option<PathBuf> {
    ["model.onnx", "onnx/model.onnx"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| dir.join(p).is_file())
}

/// Adds the folder's pipeline to `settings` (unless they give one), and
/// pads the encoder's token inputs across requests unless they say how.
/// Messages name the file.
pub fn apply(dir: &Path, settings: &mut ModelSettings) -> Result<(), String> {
    if settings.pipeline.is_some() {
        return Ok(());
    }
    let read = |file: &Path| -> Result<Value, String> {
        let text = std::fs::read_to_string(dir.join(file))
            .map_err(|e| format!("{}: {e}", dir.join(file).display()))?;
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", dir.join(file).display()))
    };
    let modules = read(Path::new(MODULES_FILE))?;
    let modules = modules.as_array().ok_or_else(|| {
        format!(
            "{}: must be an array of modules",
            dir.join(MODULES_FILE).display()
        )
    })?;
    let (mut transformer, mut pooling, mut normalize) = (None, None, false);
    for m in modules {
        let kind = m.get("type").and_then(Value::as_str).unwrap_or("");
        let path = PathBuf::from(m.get("path").and_then(Value::as_str).unwrap_or(""));
        match kind.rsplit('.').next().unwrap_or("") {
            "Transformer" if transformer.is_none() => transformer = Some(path),
            "Pooling" if pooling.is_none() => pooling = Some(path),
            "Normalize" => normalize = true,
            _ => {
                return Err(format!(
                    "{}: module `{kind}` is not supported; sluice serves Transformer → Pooling → Normalize",
                    dir.join(MODULES_FILE).display()
                ))
            }
        }
    }
    let (Some(transformer), Some(pooling)) = (transformer, pooling) else {
        return Err(format!(
            "{}: needs a Transformer and a Pooling module",
            dir.join(MODULES_FILE).display()
        ));
    };
    let mode = pipeline::pooling_mode_of(&read(&pooling.join("config.json"))?)
        .map_err(|e| format!("{}: {e}", dir.join(pooling.join("config.json")).display()))?;
    // sentence-transformers truncates at the Transformer's `max_seq_length`.
    let bert = transformer.join("sentence_bert_config.json");
    let max_length = match dir.join(&bert).is_file() {
        true => read(&bert)?
            .get("max_seq_length")
            .and_then(Value::as_u64)
            .map(|n| n as usize),
        false => None,
    };
    let tokenizer = TokenizerStep {
        file: transformer.join("tokenizer.json"),
        max_length,
        // Fitted to the ONNX file's token inputs when it loads (`fit`).
        int32: false,
        max_texts: crate::settings::pipeline::DEFAULT_MAX_TEXTS,
        max_text_bytes: crate::settings::pipeline::DEFAULT_MAX_TEXT_BYTES,
    };
    if !dir.join(&tokenizer.file).is_file() {
        return Err(format!(
            "{}: missing; a sentence-transformers folder needs its tokenizer.json",
            dir.join(&tokenizer.file).display()
        ));
    }
    let tokens = ["input_ids", "attention_mask", "token_type_ids"];
    let mut tokenize = Step::builtin("tokenizer", StepKind::Tokenizer(tokenizer));
    tokenize.inputs = BTreeMap::from([("text".into(), TEXT.into())]);
    let encoder = Step {
        name: "encoder".into(),
        kind: StepKind::Own,
        inputs: pipeline::same_names(&tokens),
        // Fitted to the file's output when it loads (`fit`).
        outputs: BTreeMap::from([("last_hidden_state".into(), "token_embeddings".into())]),
    };
    let mut pool = Step::builtin("pooling", StepKind::Pooling(PoolingStep { mode, normalize }));
    pool.outputs = BTreeMap::from([("embedding".into(), EMBEDDING.into())]);
    settings.pipeline = Some(PipelineSettings {
        steps: vec![tokenize, encoder, pool],
        outputs: vec![EMBEDDING.into()],
    });
    if settings.padding.is_empty() {
        settings.padding = tokens.iter().map(|t| (t.to_string(), Value::from(0))).collect();
    }
    Ok(())
}

/// Fits a sentence-transformers folder's pipeline to its ONNX file once
/// loaded: token inputs the file does not take (`token_type_ids`) are left
/// out, and its token vectors are its first 3-D FP32 output.
pub fn fit(settings: &mut ModelSettings, sig: &Signature) -> Result<(), String> {
    let Some(p) = settings.pipeline.as_mut() else {
        return Ok(());
    };
    let Some(encoder) = p
        .steps
        .iter_mut()
        .find(|s| s.name == "encoder" && s.kind == StepKind::Own)
    else {
        return Ok(());
    };
    if !encoder.outputs.values().any(|t| t == "token_embeddings") {
        return Ok(());
    }
    encoder.inputs.retain(|name, _| sig.input(name).is_some());
    let int32 = sig.input("input_ids").is_some_and(|t| t.dtype == DataType::I32);
    let hidden = sig
        .outputs
        .iter()
        .find(|o| o.dtype == DataType::F32 && o.shape.len() == 3)
        .ok_or_else(|| {
            "the ONNX file has no FP32 output [batch, tokens, dim] (token vectors) to pool".to_string()
        })?;
    encoder.outputs = BTreeMap::from([(hidden.name.clone(), "token_embeddings".into())]);
    for s in &mut p.steps {
        if let StepKind::Tokenizer(t) = &mut s.kind {
            t.int32 = int32;
        }
    }
    settings.padding.retain(|name, _| sig.input(name).is_some());
    Ok(())
}
