//! Raw ONNX Runtime on the MLP (`model-repository/mlp`, `input`
//! FP32[-1,784] -> `logits` FP32[-1,10]), in the bench process, through `ort`
//! directly, with the session options the server uses.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Result};
use ort::session::builder::GraphOptimizationLevel;
use ort::session::Session;
use ort::value::TensorRef;

use super::{percentile, random_floats, self_cpu_seconds};

/// The MLP's input width and output width.
pub const FEATURES: usize = 784;
pub const OUTPUTS: usize = 10;

/// The process-wide ONNX Runtime environment, from the library at `lib`.
pub fn environment(lib: &Path) -> Result<ort::environment::Environment> {
    ort::init_from(lib)
        .map_err(|e| anyhow!("cannot load ONNX Runtime from {}: {e}", lib.display()))?
        .with_name("sluice-bench")
        .with_telemetry(false)
        .build()
        .map_err(|e| anyhow!("cannot create the ONNX Runtime environment: {e}"))
}

/// The session as the server builds it (`runtime::onnx::OnnxRuntime::builder`),
/// without the shared prepacked-weights container, which only matters with
/// several instances.
pub fn session(env: &ort::environment::Environment, model: &Path, intra: usize) -> Result<Session> {
    let build = || -> ort::Result<Session> {
        Session::builder(env)?
            .with_optimization_level(GraphOptimizationLevel::Level3)?
            .with_intra_threads(intra)?
            .with_intra_op_spinning(false)?
            .commit_from_file(model)
    };
    build().map_err(|e| anyhow!("cannot load {}: {e}", model.display()))
}

/// One run: input view, session run, output copied out (the server copies it too).
pub fn run(session: &mut Session, batch: usize, xs: &[f32]) -> Result<()> {
    let outputs =
        session.run(ort::inputs!["input" => TensorRef::from_array_view(([batch, FEATURES], xs))?])?;
    let (_, logits) = outputs["logits"].try_extract_tensor::<f32>()?;
    if logits.len() != batch * OUTPUTS {
        bail!("raw run: {} logits for batch {batch}", logits.len());
    }
    std::hint::black_box(logits.to_vec());
    Ok(())
}

/// Runs at one batch size, back to back.
#[derive(Clone)]
pub struct RawPoint {
    pub batch: usize,
    pub runs: u64,
    pub wall: f64,
    /// CPU seconds of this process over the window (it does nothing else then).
    pub cpu: f64,
    pub median: Duration,
}

impl RawPoint {
    pub fn items(&self) -> f64 {
        (self.runs * self.batch as u64) as f64
    }
    pub fn items_per_s(&self) -> f64 {
        self.items() / self.wall
    }
    pub fn cpu_per_1000(&self) -> f64 {
        self.cpu / self.items() * 1000.0
    }
}

/// `warmup` of runs at `batch`, then runs back to back for `measured`.
pub fn measure(
    session: &mut Session,
    batch: usize,
    seed: u64,
    warmup: Duration,
    measured: Duration,
) -> Result<RawPoint> {
    let xs = random_floats(batch * FEATURES, seed);
    let warm_end = Instant::now() + warmup;
    while Instant::now() < warm_end {
        run(session, batch, &xs)?;
    }
    let mut lat = Vec::new();
    let cpu0 = self_cpu_seconds();
    let t0 = Instant::now();
    let end = t0 + measured;
    while Instant::now() < end {
        let t = Instant::now();
        run(session, batch, &xs)?;
        lat.push(t.elapsed());
    }
    let wall = t0.elapsed().as_secs_f64();
    let cpu = self_cpu_seconds() - cpu0;
    lat.sort();
    Ok(RawPoint {
        batch,
        runs: lat.len() as u64,
        wall,
        cpu,
        median: percentile(&lat, 50.0),
    })
}
