//! Building one version of a model: settings → ONNX Runtime sessions →
//! warm-up on every session → batcher → handle. Runs beside the version that
//! serves; nothing here touches the registry.

use std::sync::Arc;
use std::time::Instant;

use super::describe;
use crate::batcher::{Batcher, Padding};
use crate::error::error_chain;
use crate::model::settings::ModelSettings;
use crate::model::warmup;
use crate::model::ModelHandle;
use crate::pool::{ModelWorkers, Pool};
use crate::runtime::Runtime;

/// Loads `settings` from the folder `dir` into a new, warmed-up version.
/// The error names what failed (file, provider, warm-up).
pub async fn build(
    runtime: &Arc<dyn Runtime>,
    pool: &Pool,
    name: &str,
    dir: &std::path::Path,
    mut settings: ModelSettings,
) -> Result<ModelHandle, String> {
    let path = dir.join(&settings.uri);
    let rt = runtime.clone();
    let (n, p, s) = (name.to_string(), path.clone(), settings.clone());
    let loaded = tokio::task::spawn_blocking(move || rt.load(&n, &p, &s))
        .await
        .map_err(|e| format!("loading panicked: {e}"))?
        .map_err(|e| error_chain(&e))?;
    settings.check_declared(&loaded.signature)?;
    // `padding` against the ONNX file's inputs, outputs and dim names.
    let padding = Padding::new(&loaded.signature, &settings.padding)?;
    if !settings.unused.is_empty() {
        tracing::info!(
            model = %name,
            fields = %settings.unused.join(", "),
            "MLServer fields accepted but not used by sluice"
        );
    }
    if settings.batching.batching_enabled() && !loaded.signature.batchable() {
        tracing::warn!(
            model = %name,
            "the ONNX file fixes the first dimension of an input or output; serving with batching off"
        );
        settings.batching.max_batch_size = 1;
    }
    let devices: Vec<String> = loaded.sessions.iter().map(|(d, _)| d.to_string()).collect();
    let outputs: Vec<String> = loaded.signature.outputs.iter().map(|o| o.name.clone()).collect();
    let warm = match settings.warmup {
        true => warmup::plan(
            &loaded.signature,
            settings.batching.max_batch_size,
            padding.as_ref(),
            settings.batching.max_batch_tokens,
        ),
        false => Vec::new(),
    };
    let padded = padding.as_ref().map(|p| p.symbols().join(","));
    let started = Instant::now();
    let (workers, warmed) = ModelWorkers::spawn(name, loaded.sessions, pool, warm, outputs.clone());
    for w in warmed {
        w.await
            .map_err(|_| "a session thread died during warm-up".to_string())??;
    }
    let batcher = Batcher::spawn(name, settings.batching, Arc::new(workers), outputs, padding);
    tracing::info!(
        model = %name,
        version = settings.version.as_deref().unwrap_or("-"),
        devices = %devices.join(","),
        provider = %loaded.provider_reason,
        inputs = %describe(&loaded.signature.inputs),
        outputs = %describe(&loaded.signature.outputs),
        max_batch_size = settings.batching.max_batch_size,
        policy = ?settings.batching.policy,
        padded = padded.as_deref().unwrap_or("-"),
        warmup = ?started.elapsed(),
        "model ready"
    );
    Ok(ModelHandle::new(
        name.to_string(),
        settings,
        loaded.signature,
        loaded.provider_reason,
        batcher,
    ))
}

/// `settings` as a model that cannot batch must run them: `max_batch_size`
/// stays 1 when the serving version found the first dimension fixed.
pub fn effective(serving: &ModelHandle, mut settings: ModelSettings) -> ModelSettings {
    if !serving.signature.batchable() {
        settings.batching.max_batch_size = settings.batching.max_batch_size.min(1);
    }
    settings
}
