//! ONNX Runtime custom-op libraries (Triton's `model_operations`): the
//! operator names them in the server configuration (`[runtime]
//! op_libraries`; loading one runs its code, so a model only refers to one
//! by name), and may preload shared libraries they need (`[runtime]
//! preload`: onnxruntime-extensions' PyPI library is a Python extension
//! module that resolves its Python symbols from `libpython3`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use prost::Message;

/// Domains ONNX Runtime implements itself: a node of another is a custom op.
const BUILT_IN: &[&str] = &[
    "",
    "ai.onnx",
    "ai.onnx.ml",
    "ai.onnx.training",
    "ai.onnx.preview.training",
    "com.microsoft",
    "com.microsoft.nchwc",
    "com.microsoft.experimental",
    "com.ms.internal.nhwc",
];

/// Loads each library with its symbols global, for the op libraries
/// loaded after it; kept for the life of the process.
pub fn preload(paths: &[PathBuf]) -> Result<(), String> {
    for p in paths {
        // SAFETY: loading a library runs its initialisers; the operator
        // named it in the server configuration for this purpose.
        let lib = unsafe { libloading::os::unix::Library::open(Some(p), libc::RTLD_NOW | libc::RTLD_GLOBAL) }
            .map_err(|e| format!("[runtime] preload: cannot load {}: {e}", p.display()))?;
        std::mem::forget(lib);
        tracing::info!(library = %p.display(), "preloaded");
    }
    Ok(())
}

/// Checks at start that each configured op library is a readable file.
pub fn check_configured(configured: &BTreeMap<String, PathBuf>) -> Result<(), String> {
    for (name, path) in configured {
        if !path.is_file() {
            return Err(format!(
                "[runtime] op_libraries.{name}: {} is not a file",
                path.display()
            ));
        }
    }
    Ok(())
}

/// The configured libraries a model refers to: by name, or (as a
/// `config.pbtxt` gives `op_library_filename`) by the file's name or path.
pub fn resolve(wanted: &[String], configured: &BTreeMap<String, PathBuf>) -> Result<Vec<PathBuf>, String> {
    wanted
        .iter()
        .map(|w| {
            let file = Path::new(w).file_name();
            configured
                .iter()
                .find(|(name, path)| *name == w || path.as_path() == Path::new(w) || path.file_name() == file)
                .map(|(_, path)| path.clone())
                .ok_or_else(|| {
                    let known: Vec<&str> = configured.keys().map(String::as_str).collect();
                    format!(
                        "op library `{w}` is not configured: the operator names op libraries in the server \
                         configuration ([runtime] op_libraries, name = path; loading one runs its code){}",
                        match known.is_empty() {
                            true => String::new(),
                            false => format!("; configured: `{}`", known.join("`, `")),
                        }
                    )
                })
        })
        .collect()
}

/// The custom ops (`domain:op`) the graph at `path` uses, sorted, once each.
pub fn custom_ops(path: &Path) -> Vec<String> {
    let Ok(bytes) = std::fs::read(path) else {
        return Vec::new();
    };
    let Ok(model) = super::weights::onnx::ModelProto::decode(bytes.as_slice()) else {
        return Vec::new();
    };
    let mut ops: Vec<String> = model
        .graph
        .map(|g| g.node)
        .unwrap_or_default()
        .into_iter()
        .filter(|n| !BUILT_IN.contains(&n.domain.as_str()))
        .map(|n| format!("{}:{}", n.domain, n.op_type))
        .collect();
    ops.sort();
    ops.dedup();
    ops
}

/// A load error made plain when the graph uses custom ops that no library
/// the model refers to provides.
pub fn explain(message: String, path: &Path, libraries: &[String]) -> String {
    let missing_op = message.contains("is not a registered function/op")
        || message.contains("Could not find an implementation")
        || message.contains("No opset import for domain");
    if !missing_op {
        return message;
    }
    let ops = custom_ops(path);
    if ops.is_empty() {
        return message;
    }
    let with = match libraries.is_empty() {
        true => "the model refers to no op library (`op_libraries` in model-settings.json, \
                 `model_operations` in config.pbtxt)"
            .to_string(),
        false => format!(
            "the model's op libraries (`{}`) do not provide them all",
            libraries.join("`, `")
        ),
    };
    format!(
        "the graph uses custom ops that no op library provides: `{}`; {with} ({message})",
        ops.join("`, `")
    )
}
