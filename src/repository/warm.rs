//! Warming a loaded version up, and what warm-up shows of batching: the
//! folder's sample requests (`warmup/`), the probe (a batch of 1 row and one
//! of 2 on one session, `model::warmup::probe`), then the warm-up batches on
//! every session. A rejected warm-up is a warning, never a failed load.
//! `sluice check` runs [`gather`] too, so it says what a load would find.

use std::path::Path;

use super::load::LoadError;
use crate::batcher::{Layout, Padding};
use crate::model::warmup::{self, Probe};
use crate::pool::{ModelWorkers, Pool};
use crate::runtime::{Device, LoadedModel, Session};
use crate::settings::ModelSettings;
use crate::tensor::{Signature, Tensor};

/// What the file and warm-up's probe showed.
#[derive(Debug, Clone)]
pub struct Evidence {
    /// The batch axes, or why the model does not batch: the file's verdict,
    /// unless the probe showed otherwise.
    pub layout: Result<Layout, String>,
    /// The sample requests of the folder's `warmup/` (empty: zero-filled).
    pub samples: Vec<Vec<Tensor>>,
    /// Why the samples were not used (a file that is not a request for the model).
    pub samples_skipped: Option<String>,
    /// What the probe showed (`None`: it did not run, `warmup` is false).
    pub probe: Option<Probe>,
}

/// Reads the folder's samples (a Triton folder's `model_warmup`, from
/// `settings`, else `warmup/*.json`) and runs the probe on `session`
/// (blocking). `file`: what the ONNX file says of batching
/// (`batcher::layout::decide`).
pub fn gather(
    name: &str,
    dir: &Path,
    settings: &ModelSettings,
    sig: &Signature,
    session: Option<&mut dyn Session>,
    file: Result<Layout, String>,
) -> Evidence {
    let triton = settings
        .triton_config
        .as_ref()
        .and_then(|c| crate::triton::config::from_value(c).ok())
        .filter(|c| !c.model_warmup.is_empty());
    let read = match &triton {
        Some(config) => warmup::triton::samples(dir, name, config, sig),
        None => warmup::samples(dir, name, sig),
    };
    let (samples, samples_skipped) = match read {
        Ok(s) => (s, None),
        Err(why) => (Vec::new(), Some(why)),
    };
    let probe = session.map(|session| {
        let shape = warmup::Shape {
            sig,
            layout: file.as_ref().ok(),
            samples: &samples,
        };
        let outputs: Vec<String> = sig.outputs.iter().map(|o| o.name.clone()).collect();
        warmup::probe(session, shape, &outputs)
    });
    let layout = match (file, probe.as_ref().and_then(|p| p.off.clone())) {
        (Ok(_), Some(why)) => Err(why),
        (file, _) => file,
    };
    Evidence {
        layout,
        samples,
        samples_skipped,
        probe,
    }
}

/// A version's sessions, warmed up, on their threads.
pub struct Warmed {
    pub workers: ModelWorkers,
    /// The batch axes, or why the model does not batch.
    pub layout: Result<Layout, String>,
    /// Why the model rejected its warm-up, when it did (it serves cold).
    pub rejected: Option<String>,
}

/// Gathers the evidence on the first session (off the async runtime), then
/// starts every session's thread, each running the warm-up batches first.
pub async fn warm(
    name: &str,
    dir: &Path,
    pool: &Pool,
    settings: &ModelSettings,
    padding: Option<&Padding>,
    loaded: &mut LoadedModel,
    file: Result<Layout, String>,
) -> Result<Warmed, LoadError> {
    let outputs: Vec<String> = loaded.signature.outputs.iter().map(|o| o.name.clone()).collect();
    let evidence = match (settings.warmup, loaded.sessions.pop()) {
        (true, Some((device, session))) => {
            let (session, evidence) =
                probe_on(name, dir, settings, &loaded.signature, (device, session), file).await?;
            loaded.sessions.push(session);
            evidence
        }
        (_, first) => {
            loaded.sessions.extend(first);
            gather(name, dir, settings, &loaded.signature, None, file)
        }
    };
    if let Some(why) = &evidence.samples_skipped {
        tracing::warn!(model = %name, reason = %why, "warm-up samples skipped (fix or remove the file); warming up with zeros");
    }
    let mut rejected = evidence.probe.as_ref().and_then(|p| p.rejected.clone());
    let plan = match (settings.warmup, &rejected) {
        (true, None) => warmup::plan(
            warmup::Shape {
                sig: &loaded.signature,
                layout: evidence.layout.as_ref().ok(),
                samples: &evidence.samples,
            },
            settings.batching.max_batch_size,
            padding,
            settings.batching.max_batch_tokens,
        ),
        _ => Vec::new(),
    };
    let sessions = std::mem::take(&mut loaded.sessions);
    let (workers, warmed) = ModelWorkers::spawn(name, sessions, pool, plan, outputs);
    for w in warmed {
        let result = w
            .await
            .map_err(|_| LoadError::Internal("a session thread died during warm-up".into()))?;
        if let (Err(why), None) = (result, &rejected) {
            rejected = Some(why);
        }
    }
    if let Some(why) = &rejected {
        tracing::warn!(model = %name, reason = %why, "the model rejected its warm-up; it serves cold (its first requests may be slower)");
    }
    Ok(Warmed {
        workers,
        layout: evidence.layout,
        rejected,
    })
}

/// [`gather`] on a blocking thread; the session comes back with the evidence.
async fn probe_on(
    name: &str,
    dir: &Path,
    settings: &ModelSettings,
    sig: &Signature,
    (device, mut session): (Device, Box<dyn Session>),
    file: Result<Layout, String>,
) -> Result<((Device, Box<dyn Session>), Evidence), LoadError> {
    let (n, d, s) = (name.to_string(), dir.to_path_buf(), sig.clone());
    let settings = settings.clone();
    tokio::task::spawn_blocking(move || {
        let evidence = gather(&n, &d, &settings, &s, Some(session.as_mut()), file);
        ((device, session), evidence)
    })
    .await
    .map_err(|e| match e.is_cancelled() {
        // The runtime is shutting down.
        true => LoadError::Internal(format!(
            "the warm-up of {name} was cancelled: the server is stopping"
        )),
        false => LoadError::Internal(format!("the warm-up of {name} panicked: {e}")),
    })
}
