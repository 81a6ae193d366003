//! Sequence benchmark: `cargo bench --bench sequences`.
//! See `benches/README.md` (Sequences) for what it reports.
//!
//! silero-vad (`silero_vad.onnx` from the `silero-vad` wheel that
//! `scripts/setup-test-clients.sh` downloads), its recurrent state kept by
//! the server, streamed by `SLUICE_BENCH_STREAMS` (64) concurrent clients,
//! each sending clips of `CHUNKS` 512-sample chunks, one sequence per clip,
//! over V2 JSON on its own keep-alive connection. In rounds
//! (`SLUICE_BENCH_ROUNDS`, 3), each for `SLUICE_BENCH_SECONDS` (5):
//! - `batched`: the model with `max_batch_size` 64 (requests of many
//!   sequences share batches, the state on its axis 1);
//! - `one at a time`: the same file with `max_batch_size` 1;
//! - `direct`: ONNX Runtime called in this process, one clip after another
//!   with its state carried by hand (no HTTP, no server): the floor of
//!   running the same chunks one at a time.
//!
//! Streams (clips) per second, and per server CPU-second (the server
//! process's CPU; this process's CPU for the direct runs, ONNX Runtime's
//! threads included).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Result};
use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{CONTENT_TYPE, HOST};
use ort::value::TensorRef;
use serde_json::json;
use sluice::runtime::onnx::find_library;

use common::client::{connect, send};
use common::server::ServerProcess;
use common::{env_num, median, self_cpu_seconds};

/// Chunks (requests) per clip (sequence).
const CHUNKS: usize = 16;

/// Throughput of one configuration in one round.
struct Point {
    streams: u64,
    wall: f64,
    cpu: f64,
}

impl Point {
    fn per_s(&self) -> f64 {
        self.streams as f64 / self.wall
    }
    fn per_cpu_s(&self) -> f64 {
        self.streams as f64 / self.cpu.max(1e-9)
    }
}

/// silero_vad.onnx, out of the wheel.
fn extract_model(dest: &Path) -> Result<PathBuf> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let wheel = root.join(".venv-clients/wheels/silero_vad-6.2.3-py3-none-any.whl");
    if !wheel.is_file() {
        bail!(
            "{} is missing: run scripts/setup-test-clients.sh",
            wheel.display()
        );
    }
    let model = dest.join("silero_vad.onnx");
    let script = "import sys, zipfile; open(sys.argv[2], 'wb').write(zipfile.ZipFile(sys.argv[1]).read('silero_vad/data/silero_vad.onnx'))";
    let ok = Command::new(root.join(".venv-clients/bin/python"))
        .args(["-c", script])
        .arg(&wheel)
        .arg(&model)
        .status()?
        .success();
    if !ok {
        bail!("cannot extract silero_vad.onnx from {}", wheel.display());
    }
    Ok(model)
}

/// The repository: `silero` (batched) and `silero_alone` (`max_batch_size` 1).
fn make_repository(dir: &Path, model: &Path) -> Result<PathBuf> {
    let repo = dir.join("repo");
    for (name, max_batch) in [("silero", 64), ("silero_alone", 1)] {
        let folder = repo.join(name);
        std::fs::create_dir_all(&folder)?;
        std::fs::copy(model, folder.join("model.onnx"))?;
        let settings = json!({
            "max_batch_size": max_batch,
            "max_batch_time": 0.002,
            "batch_axes": {"state": 1, "stateN": 1},
            "sequence": {"state": [{"input": "state", "output": "stateN"}], "idle_timeout": 60},
        });
        std::fs::write(folder.join("model-settings.json"), settings.to_string())?;
    }
    Ok(repo)
}

/// A clip's chunks: a tone in noise, seeded.
fn clip(seed: u64) -> Vec<Vec<f32>> {
    let noise = common::random_floats(512 * CHUNKS, seed);
    (0..CHUNKS)
        .map(|k| {
            (0..512)
                .map(|i| {
                    let t = (k * 512 + i) as f32 / 16000.0;
                    0.4 * (2.0 * std::f32::consts::PI * (180.0 + seed as f32) * t).sin()
                        + 0.05 * noise[k * 512 + i]
                })
                .collect()
        })
        .collect()
}

/// `streams` clients streaming clips to `model` for `seconds`.
async fn serve_round(server: &ServerProcess, model: &str, streams: usize, seconds: f64) -> Result<Point> {
    let addr = server.addr;
    let done = Arc::new(AtomicU64::new(0));
    let stop = Instant::now() + Duration::from_secs_f64(seconds);
    let cpu0 = server.cpu_seconds()?;
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for s in 0..streams {
        let (done, model) = (done.clone(), model.to_string());
        let chunks = clip(s as u64);
        // Pre-serialized bodies: the client's cost stays off the measure.
        let bodies: Vec<Vec<String>> = (0..2)
            .map(|parity| {
                (0..CHUNKS)
                    .map(|k| {
                        let id = format!("s{s}-{parity}");
                        json!({
                            "inputs": [
                                {"name": "input", "datatype": "FP32", "shape": [1, 512], "data": chunks[k]},
                                {"name": "sr", "datatype": "INT64", "shape": [], "data": [16000]},
                            ],
                            "parameters": {"sequence_id": id, "sequence_start": k == 0, "sequence_end": k == CHUNKS - 1},
                        })
                        .to_string()
                    })
                    .collect()
            })
            .collect();
        tasks.push(tokio::spawn(async move {
            let mut conn = connect(addr).await?;
            let path = format!("/v2/models/{model}/infer");
            let mut parity = 0;
            while Instant::now() < stop {
                for body in &bodies[parity] {
                    let req = hyper::Request::post(&path)
                        .header(HOST, addr.to_string())
                        .header(CONTENT_TYPE, "application/json")
                        .body(Full::new(Bytes::from(body.clone())))?;
                    let (status, answer) = send(&mut conn, req).await?;
                    if status != 200 {
                        bail!("{model}: {status} {}", String::from_utf8_lossy(&answer));
                    }
                }
                done.fetch_add(1, Ordering::Relaxed);
                parity ^= 1;
            }
            Ok::<_, anyhow::Error>(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(Point {
        streams: done.load(Ordering::Relaxed),
        wall: t0.elapsed().as_secs_f64(),
        cpu: server.cpu_seconds()? - cpu0,
    })
}

/// ONNX Runtime in this process: clips one after another, state carried.
fn direct_round(session: &mut ort::session::Session, seconds: f64) -> Result<Point> {
    let clips: Vec<Vec<Vec<f32>>> = (0..8).map(clip).collect();
    let (t0, cpu0) = (Instant::now(), self_cpu_seconds());
    let mut streams = 0u64;
    while t0.elapsed().as_secs_f64() < seconds {
        let chunks = &clips[streams as usize % clips.len()];
        let mut state = vec![0f32; 2 * 128];
        for chunk in chunks {
            let sr = [16000i64];
            let outputs = session.run(ort::inputs![
                "input" => TensorRef::from_array_view(([1usize, 512], chunk.as_slice()))?,
                "state" => TensorRef::from_array_view(([2usize, 1, 128], state.as_slice()))?,
                "sr" => TensorRef::from_array_view((Vec::<usize>::new(), &sr[..]))?,
            ])?;
            let (_, next) = outputs["stateN"].try_extract_tensor::<f32>()?;
            state = next.to_vec();
            let (_, p) = outputs["output"].try_extract_tensor::<f32>()?;
            std::hint::black_box(p[0]);
        }
        streams += 1;
    }
    Ok(Point {
        streams,
        wall: t0.elapsed().as_secs_f64(),
        cpu: self_cpu_seconds() - cpu0,
    })
}

fn main() -> Result<()> {
    if !common::run_by_cargo_bench() {
        println!(
            "benches/sequences.rs: skipped (not run by `cargo bench`); run `cargo bench --bench sequences`"
        );
        return Ok(());
    }
    let streams: usize = env_num("SLUICE_BENCH_STREAMS", 64)?;
    let rounds: usize = env_num("SLUICE_BENCH_ROUNDS", 3)?;
    let seconds: f64 = env_num("SLUICE_BENCH_SECONDS", 5.0)?;
    let lib = find_library(None).map_err(|e| anyhow!("{e}"))?;
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_sluice"));
    let work = tempfile::tempdir()?;
    let model = extract_model(work.path())?;
    let repo = make_repository(work.path(), &model)?;
    eprintln!(
        "sluice sequence bench: {streams} streams, {CHUNKS} chunks a clip, {rounds} rounds of {seconds} s"
    );

    let env = common::raw::environment(&lib)?;
    let intra = sluice::config::Config::default().default_intra_op_threads();
    let mut session = common::raw::session(&env, &model, intra)?;

    let mut server = ServerProcess::start(&exe, work.path(), &repo, &lib)?;
    let tokio = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    tokio.block_on(server.wait_ready(Instant::now()))?;
    let mut rows: Vec<(&str, Vec<Point>)> =
        vec![("batched", vec![]), ("one at a time", vec![]), ("direct", vec![])];
    for _ in 0..rounds {
        rows[0]
            .1
            .push(tokio.block_on(serve_round(&server, "silero", streams, seconds))?);
        rows[1]
            .1
            .push(tokio.block_on(serve_round(&server, "silero_alone", streams, seconds))?);
        rows[2].1.push(direct_round(&mut session, seconds)?);
    }
    drop(server);
    println!("\n| configuration | streams/s (median) | streams per CPU-second (median) | ÷ direct (streams per CPU-second) |");
    println!("|---|---|---|---|");
    let direct = median(&rows[2].1.iter().map(Point::per_cpu_s).collect::<Vec<_>>());
    for (name, points) in &rows {
        let per_s = median(&points.iter().map(Point::per_s).collect::<Vec<_>>());
        let per_cpu = median(&points.iter().map(Point::per_cpu_s).collect::<Vec<_>>());
        println!("| {name} | {per_s:.1} | {per_cpu:.2} | {:.2} |", per_cpu / direct);
    }
    Ok(())
}
