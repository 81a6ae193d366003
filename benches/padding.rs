//! Padding benchmark: `cargo bench --bench padding`.
//! See `benches/README.md` (Padding) for the columns and the environment variables.
//!
//! All in this process, on the real all-MiniLM-L6-v2 int8 file
//! (`scripts/fetch-minilm.sh`):
//! 1. First-request latency: a server with two copies of MiniLM, one warmed
//!    (padded warm-up at power-of-two lengths) and one not; one request at
//!    each of a few lengths, the first time that model sees it, then the
//!    median of the same request repeated (steady state).
//! 2. Throughput, in rounds (`SLUICE_BENCH_ROUNDS`, default 3), each round
//!    running the three configurations one after the other for
//!    `SLUICE_BENCH_SECONDS` (default 10) each, so that a noisy machine hurts
//!    all three alike (each round starts one configuration later than the
//!    last); medians over rounds, and each round's ratio to padding off:
//!    - `padding on`: closed-loop load, `SLUICE_BENCH_CONCURRENCY` (64)
//!      clients, one sequence per request (V2 binary INT64), lengths 8..128
//!      skewed short, to `minilm` with `padding` (the shipped settings);
//!    - `padding off`: the same load to a copy without `padding`;
//!    - `raw`: every batch the `padding on` phase of the same round ran (rows
//!      and lengths, captured from the batcher's `sluice::batch` trace
//!      event), padded the same way and run back to back on a session built
//!      by sluice's runtime with the server's options, called directly (no
//!      HTTP, no batcher).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};
use bytes::Bytes;
use serde_json::{json, Value};
use sluice::config::Config;
use sluice::runtime::onnx::{find_library, OnnxRuntime, SessionDefaults};
use sluice::runtime::{Runtime, Session};
use sluice::settings::{ModelDefaults, ModelSettings};
use sluice::tensor::{Tensor, TensorData};
use tracing_subscriber::layer::{Context as LayerContext, SubscriberExt};
use tracing_subscriber::Layer;

/// The lengths of each batch the padded model ran, from the batcher's
/// `sluice::batch` trace event (`rows`, `lengths` of each entry).
/// (model, lengths) of each batch: the capture layer pushes from whatever
/// thread dispatches a batch (the batching tasks); `main`'s rounds take them.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<BatchOf>>>);

/// A model's name and the length of each sequence of one of its batches.
type BatchOf = (String, Vec<usize>);

impl Captured {
    /// The batches of `model` captured so far (one length per sequence); empties the record.
    fn take(&self, model: &str) -> Vec<Vec<usize>> {
        let all = std::mem::take(&mut *self.0.lock().unwrap());
        all.into_iter()
            .filter(|(m, _)| m == model)
            .map(|(_, b)| b)
            .collect()
    }
}

/// A tracing layer that records the padded batches of every model.
struct CaptureLayer {
    captured: Captured,
}

#[derive(Default)]
struct BatchFields {
    model: String,
    rows: String,
    lengths: String,
}

impl tracing::field::Visit for BatchFields {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        let v = format!("{value:?}");
        match field.name() {
            "model" => self.model = v,
            "rows" => self.rows = v,
            "dims" => self.lengths = v,
            _ => {}
        }
    }
}

impl<S: tracing::Subscriber> Layer<S> for CaptureLayer {
    fn on_event(&self, event: &tracing::Event<'_>, _: LayerContext<'_, S>) {
        if event.metadata().target() != "sluice::batch" {
            return;
        }
        let mut f = BatchFields::default();
        event.record(&mut f);
        let rows: Vec<usize> = serde_json::from_str(&f.rows).unwrap_or_default();
        let lengths: Vec<Vec<usize>> = serde_json::from_str(&f.lengths).unwrap_or_default();
        // One length per sequence (an entry of n rows is n sequences).
        let batch = rows
            .iter()
            .zip(&lengths)
            .flat_map(|(&r, l)| std::iter::repeat_n(l[0], r))
            .collect();
        self.captured.0.lock().unwrap().push((f.model, batch));
    }
}

const INPUTS: [&str; 3] = ["input_ids", "attention_mask", "token_type_ids"];
const PAD: &str = r#""padding": {"input_ids": 0, "attention_mask": 0, "token_type_ids": 0}"#;

/// Deterministic pseudo-random numbers.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> f64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// A length from 8 to 128, skewed short: log-normal with median `median`
/// tokens (`SLUICE_BENCH_MEDIAN_TOKENS`, default 24: mean about 29, 4 % at 8,
/// 0.3 % at 128) and σ = 0.6, clipped to 8..128.
fn length(rng: &mut Lcg, median: f64) -> usize {
    // Box-Muller: one standard normal from two uniforms.
    let (u, v) = (rng.next().max(1e-12), rng.next());
    let z = (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos();
    ((median.ln() + 0.6 * z).exp().round() as usize).clamp(8, 128)
}

/// One sequence of `len` tokens: [CLS] word pieces [SEP], full mask, segment 0.
fn sequence(rng: &mut Lcg, len: usize) -> [Vec<i64>; 3] {
    let ids = (0..len)
        .map(|i| match i {
            0 => 101,
            i if i == len - 1 => 102,
            _ => 1000 + (rng.next() * 29000.0) as i64,
        })
        .collect();
    [ids, vec![1; len], vec![0; len]]
}

/// A V2 binary request body of one sequence, and its header length.
fn encode(seq: &[Vec<i64>; 3]) -> (Bytes, usize) {
    let len = seq[0].len();
    let inputs: Vec<Value> = INPUTS
        .iter()
        .map(|n| json!({"name": n, "datatype": "INT64", "shape": [1, len], "parameters": {"binary_data_size": len * 8}}))
        .collect();
    let header =
        serde_json::to_vec(&json!({"inputs": inputs, "parameters": {"binary_data_output": true}})).unwrap();
    let mut body = header.clone();
    for v in seq {
        body.extend(v.iter().flat_map(|x| x.to_le_bytes()));
    }
    (Bytes::from(body), header.len())
}

fn env_num<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Starts a server on a temp repository of MiniLM copies `(folder, settings)`.
async fn server(
    runtime: Arc<OnnxRuntime>,
    model: &Path,
    models: &[(&str, String)],
) -> Result<(tempfile::TempDir, String, tokio::sync::oneshot::Sender<()>)> {
    let dir = tempfile::tempdir()?;
    for (folder, settings) in models {
        let d = dir.path().join(folder);
        std::fs::create_dir_all(&d)?;
        std::fs::copy(model, d.join("model.onnx"))?;
        std::fs::write(d.join("model-settings.json"), settings)?;
    }
    let mut cfg = Config::default();
    cfg.http.host = [127, 0, 0, 1].into();
    cfg.http.port = 0;
    cfg.grpc.port = 0;
    cfg.model_repository.path = dir.path().to_path_buf();
    let s = sluice::Server::bind(cfg, runtime).await?;
    let base = format!("http://{}", s.http_addr());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(s.run(async move {
        let _ = stopped.await;
    }));
    let client = reqwest::Client::new();
    for _ in 0..1200 {
        if client
            .get(format!("{base}/v2/health/ready"))
            .send()
            .await
            .is_ok_and(|r| r.status() == 200)
        {
            return Ok((dir, base, stop));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(anyhow!("the server did not turn ready in 60 s"))
}

async fn infer(client: &reqwest::Client, url: &str, body: &(Bytes, usize)) -> Result<()> {
    let r = client
        .post(url)
        .header("Inference-Header-Content-Length", body.1)
        .body(body.0.clone())
        .send()
        .await?;
    let status = r.status();
    let bytes = r.bytes().await?;
    if status != 200 {
        return Err(anyhow!("{status}: {}", String::from_utf8_lossy(&bytes)));
    }
    Ok(())
}

/// Phase 1: the first request at each length against the steady state.
async fn first_requests(runtime: Arc<OnnxRuntime>, model: &Path) -> Result<String> {
    let warmed = format!(r#"{{{PAD}, "max_batch_tokens": 4096}}"#);
    let cold = format!(r#"{{{PAD}, "max_batch_tokens": 4096, "warmup": false}}"#);
    let t = Instant::now();
    let (_dir, base, stop) = server(runtime, model, &[("warmed", warmed), ("cold", cold)]).await?;
    let load = t.elapsed();
    let client = reqwest::Client::new();
    let mut rng = Lcg(5);
    let mut out = format!(
        "server ready (both models loaded, one warmed) in {:.1} s\n\n\
         | length | cold: first request | warmed: first request | steady state (median of 9) |\n|---|---|---|---|\n",
        load.as_secs_f64()
    );
    for len in [16, 100, 128, 256] {
        let body = encode(&sequence(&mut rng, len));
        let mut firsts = Vec::new();
        for m in ["cold", "warmed"] {
            let url = format!("{base}/v2/models/{m}/infer");
            let t = Instant::now();
            infer(&client, &url, &body).await?;
            firsts.push(t.elapsed().as_secs_f64() * 1e3);
        }
        let url = format!("{base}/v2/models/warmed/infer");
        let mut steady = Vec::new();
        for _ in 0..9 {
            let t = Instant::now();
            infer(&client, &url, &body).await?;
            steady.push(t.elapsed().as_secs_f64() * 1e3);
        }
        let line = format!(
            "| {len} | {:.1} ms | {:.1} ms | {:.1} ms |\n",
            firsts[0],
            firsts[1],
            median(steady)
        );
        eprint!("{line}");
        out += &line;
    }
    let _ = stop.send(());
    Ok(out)
}

/// Closed-loop load: `concurrency` clients for `secs`; sequences per second.
async fn load(
    base: &str,
    model: &str,
    bodies: &Arc<Vec<(Bytes, usize)>>,
    concurrency: usize,
    secs: f64,
) -> Result<f64> {
    let url = format!("{base}/v2/models/{model}/infer");
    let end = Instant::now() + Duration::from_secs_f64(secs);
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..concurrency {
        let (url, bodies) = (url.clone(), bodies.clone());
        tasks.push(tokio::spawn(async move {
            let client = reqwest::Client::new();
            let mut i = c * 7919;
            let mut n = 0u64;
            while Instant::now() < end {
                infer(&client, &url, &bodies[i % bodies.len()]).await?;
                i += 1;
                n += 1;
            }
            Ok::<u64, anyhow::Error>(n)
        }));
    }
    let mut n = 0;
    for t in tasks {
        n += t.await??;
    }
    Ok(n as f64 / t0.elapsed().as_secs_f64())
}

/// CPU seconds this process has used (every thread).
fn cpu_seconds() -> f64 {
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes the struct it is given.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 * 1e-6;
    t(u.ru_utime) + t(u.ru_stime)
}

/// Replays captured batches on `session`: sequences per second, padding
/// ratio, CPU milliseconds per sequence.
fn raw(session: &mut dyn Session, batches: &[Vec<usize>]) -> Result<(f64, f64, f64)> {
    let mut rng = Lcg(9);
    // The inputs, padded as the batcher pads them, made before the clock starts.
    let inputs: Vec<Vec<Tensor>> = batches
        .iter()
        .map(|lengths| {
            let max = *lengths.iter().max().unwrap();
            let mut data = [
                vec![0i64; lengths.len() * max],
                vec![0; lengths.len() * max],
                vec![0; lengths.len() * max],
            ];
            for (r, &len) in lengths.iter().enumerate() {
                for (d, v) in data.iter_mut().zip(sequence(&mut rng, len)) {
                    d[r * max..r * max + len].copy_from_slice(&v);
                }
            }
            INPUTS
                .iter()
                .zip(data)
                .map(|(n, d)| Tensor::new(*n, vec![lengths.len(), max], TensorData::I64(d)).unwrap())
                .collect()
        })
        .collect();
    let outputs = vec!["last_hidden_state".to_string()];
    let (t0, cpu0) = (Instant::now(), cpu_seconds());
    for batch in &inputs {
        std::hint::black_box(session.run(batch, &outputs)?);
    }
    let secs = t0.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu0;
    let seqs: usize = batches.iter().map(Vec::len).sum();
    let real: usize = batches.iter().flatten().sum();
    let padded: usize = batches.iter().map(|b| b.len() * b.iter().max().unwrap()).sum();
    Ok((
        seqs as f64 / secs,
        (padded - real) as f64 / padded as f64,
        cpu * 1e3 / seqs as f64,
    ))
}

/// One configuration's numbers in one round.
#[derive(Default, Clone)]
struct Point {
    /// Sequences per second through the server.
    served: f64,
    /// CPU milliseconds of this process (server and load clients) per sequence.
    cpu_ms: f64,
    /// Mean sequences per batch.
    batch: f64,
    /// Mean ONNX Runtime run per batch in the server, and on the same
    /// batches back to back (raw), milliseconds.
    run_ms: f64,
    raw_run_ms: f64,
    /// Mean queue delay per request, milliseconds.
    queue_ms: f64,
    /// Raw ONNX Runtime on the same batches (padded models): sequences per
    /// second, padding ratio, CPU milliseconds per sequence.
    raw: Option<(f64, f64, f64)>,
}

/// Sums and counts of `model`'s histograms in `/metrics`: batch size, ONNX
/// Runtime run time and queue delay, as `[sum, count]` each.
async fn histograms(base: &str, model: &str) -> Result<[[f64; 2]; 3]> {
    let text = reqwest::get(format!("{base}/metrics")).await?.text().await?;
    let value = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name) && l.contains(&format!("model=\"{model}\"")))
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    Ok([
        sluice::metrics::BATCH_SIZE,
        sluice::metrics::INFERENCE_DURATION,
        sluice::metrics::QUEUE_DELAY,
    ]
    .map(|h| [value(&format!("{h}_sum")), value(&format!("{h}_count"))]))
}

/// The mean of each histogram between two readings of [`histograms`].
fn means(before: &[[f64; 2]; 3], after: &[[f64; 2]; 3]) -> [f64; 3] {
    std::array::from_fn(|i| (after[i][0] - before[i][0]) / (after[i][1] - before[i][1]).max(1.0))
}

/// The models to compare: the shipped `minilm` settings with padding, and
/// with each variant of `SLUICE_BENCH_VARIANTS` (comma-separated
/// `max_padding_ratio[:max_batch_tokens]`, e.g. `0.1:512,0.25`), then
/// without padding. `(folder, settings, padded)`.
fn configurations(root: &Path) -> Result<Vec<(String, String, bool)>> {
    let shipped: Value = serde_json::from_str(&std::fs::read_to_string(
        root.join("model-repository/minilm/model-settings.json"),
    )?)?;
    let mut shipped = shipped;
    // SLUICE_BENCH_SETTINGS: a JSON object whose keys replace the shipped
    // settings' in every configuration (e.g. `{"instances": 2}`).
    if let Ok(extra) = std::env::var("SLUICE_BENCH_SETTINGS") {
        let extra: Value = serde_json::from_str(&extra).map_err(|e| anyhow!("SLUICE_BENCH_SETTINGS: {e}"))?;
        for (k, v) in extra
            .as_object()
            .ok_or_else(|| anyhow!("SLUICE_BENCH_SETTINGS: not a JSON object"))?
        {
            shipped[k] = v.clone();
        }
    }
    let mut out = vec![("pad".to_string(), shipped.to_string(), true)];
    let variants = std::env::var("SLUICE_BENCH_VARIANTS").unwrap_or_default();
    for variant in variants.split(',').map(str::trim).filter(|r| !r.is_empty()) {
        let mut v = shipped.clone();
        let (ratio, tokens) = variant.split_once(':').unwrap_or((variant, ""));
        v["max_padding_ratio"] = json!(ratio.parse::<f64>()?);
        if !tokens.is_empty() {
            v["max_batch_tokens"] = json!(tokens.parse::<usize>()?);
        }
        out.push((format!("pad_{}", variant.replace(':', "_")), v.to_string(), true));
    }
    let mut off = shipped;
    for k in ["padding", "max_batch_tokens", "max_padding_ratio"] {
        off.as_object_mut().unwrap().remove(k);
    }
    out.push(("nopad".to_string(), off.to_string(), false));
    Ok(out)
}

/// Every round: each configuration under load for `secs`, then raw ONNX
/// Runtime on the batches each padded one ran. Returns `[round][configuration]`.
async fn rounds(
    runtime: Arc<OnnxRuntime>,
    model: &Path,
    configs: &[(String, String, bool)],
    captured: &Captured,
    (rounds, secs, concurrency): (usize, f64, usize),
) -> Result<Vec<Vec<Point>>> {
    let settings =
        ModelSettings::parse(&configs[0].1, "raw", &ModelDefaults::default()).map_err(|e| anyhow!("{e}"))?;
    let mut raw_model = runtime.load("raw", model, &settings)?;
    eprintln!("raw session: {}", raw_model.provider_reason);
    let session = &mut raw_model.sessions[0].1;
    let mut rng = Lcg(1);
    let bodies: Arc<Vec<_>> = Arc::new(
        (0..4096)
            .map(|_| {
                let len = length(&mut rng, env_num("SLUICE_BENCH_MEDIAN_TOKENS", 24.0));
                encode(&sequence(&mut rng, len))
            })
            .collect(),
    );
    let models: Vec<(&str, String)> = configs.iter().map(|(f, s, _)| (f.as_str(), s.clone())).collect();
    let (_dir, base, stop) = server(runtime.clone(), model, &models).await?;
    for (m, _, _) in configs {
        load(&base, m, &bodies, concurrency, 2.0).await?; // unmeasured warm-up load
    }
    let mut all = Vec::new();
    for round in 0..rounds {
        // Each round starts one configuration later than the one before, so
        // that none always runs first or last (a machine that slows down
        // within a round would otherwise favour the first).
        let mut points: Vec<Option<Point>> = configs.iter().map(|_| None).collect();
        for k in 0..configs.len() {
            let i = (round + k) % configs.len();
            let m = &configs[i].0;
            captured.take(m);
            let before = histograms(&base, m).await?;
            let (cpu0, t0) = (cpu_seconds(), Instant::now());
            let served = load(&base, m, &bodies, concurrency, secs).await?;
            let cpu_ms = (cpu_seconds() - cpu0) * 1e3 / (served * t0.elapsed().as_secs_f64());
            let [batch, run, queue] = means(&before, &histograms(&base, m).await?);
            let batches = captured.take(m);
            let raw = Some(raw(session.as_mut(), &batches)?);
            // Raw milliseconds per batch: the batches' sequences at raw's rate.
            let sequences: usize = batches.iter().map(Vec::len).sum();
            let raw_run_ms = raw.map_or(0.0, |r| {
                sequences as f64 / r.0 / batches.len().max(1) as f64 * 1e3
            });
            let (run_ms, queue_ms) = (run * 1e3, queue * 1e3);
            eprintln!(
                "round {round} {m}: {served:.1} seq/s, {cpu_ms:.1} CPU ms/seq, mean batch {batch:.1}, \
                 run {run_ms:.2} ms/batch (raw {raw_run_ms:.2}), queue delay {queue_ms:.2} ms, \
                 raw (seq/s, padding, CPU ms/seq) {raw:.3?}"
            );
            points[i] = Some(Point {
                served,
                cpu_ms,
                batch,
                run_ms,
                raw_run_ms,
                queue_ms,
                raw,
            });
        }
        all.push(points.into_iter().flatten().collect());
    }
    let _ = stop.send(());
    Ok(all)
}

fn main() -> Result<()> {
    // `cargo test --all-targets` runs harness = false benches without `--bench`: do nothing there.
    if !std::env::args().any(|a| a == "--bench") {
        println!("benches/padding.rs: skipped (not run by `cargo bench`); run `cargo bench --bench padding`");
        return Ok(());
    }
    let captured = Captured::default();
    let subscriber = tracing_subscriber::registry()
        .with(
            CaptureLayer {
                captured: captured.clone(),
            }
            .with_filter(
                tracing_subscriber::filter::Targets::new()
                    .with_target("sluice::batch", tracing::Level::TRACE),
            ),
        )
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_filter(tracing_subscriber::EnvFilter::new(
                    std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()),
                )),
        );
    tracing::subscriber::set_global_default(subscriber)?;
    // The checkout this bench was built in, or (a binary carried to another
    // machine, scripts/gpu-check.sh) the working directory.
    let root = Some(PathBuf::from(env!("CARGO_MANIFEST_DIR")))
        .filter(|r| r.join("model-repository").is_dir())
        .map_or_else(std::env::current_dir, Ok)?;
    // SLUICE_BENCH_MODEL: another MiniLM-shaped file (scripts/gpu-check.sh: the copy it carried).
    let model = std::env::var_os("SLUICE_BENCH_MODEL")
        .map_or_else(|| root.join("model-repository/minilm/model.onnx"), PathBuf::from);
    if !model.is_file() {
        return Err(anyhow!(
            "{} is missing: run scripts/fetch-minilm.sh",
            model.display()
        ));
    }
    let (rounds_n, secs, concurrency): (usize, f64, usize) = (
        env_num("SLUICE_BENCH_ROUNDS", 3),
        env_num("SLUICE_BENCH_SECONDS", 10.0),
        env_num("SLUICE_BENCH_CONCURRENCY", 64),
    );
    let cfg = Config::default();
    let lib = find_library(None).map_err(|e| anyhow!("{e}"))?;
    let runtime = Arc::new(OnnxRuntime::init(&lib, SessionDefaults::from_config(&cfg))?);
    let tokio = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let loadavg = || std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load_before = loadavg();
    eprintln!("load average before: {}", load_before.trim());

    let first = tokio.block_on(first_requests(runtime.clone(), &model))?;
    let configs = configurations(&root)?;
    for (m, settings, _) in &configs {
        eprintln!("{m}: {settings}");
    }
    let results = tokio.block_on(rounds(
        runtime,
        &model,
        &configs,
        &captured,
        (rounds_n, secs, concurrency),
    ))?;
    println!(
        "\n### Padding ({}, lengths 8..128 skewed short, concurrency {concurrency})\n",
        model.display()
    );
    println!(
        "{rounds_n} rounds of {secs} s per configuration, side by side; medians. Load average before: {}, after: {}\n",
        load_before.trim(),
        loadavg().trim()
    );
    report(&configs, &results)?;
    println!("\nGoals: padding on ≥ 1.3× padding off; ≥ 0.85× raw on the same batches.\n");
    println!("### First request after load\n\n{first}");
    Ok(())
}

/// The table: medians over rounds of each configuration (the last is padding off).
fn report(configs: &[(String, String, bool)], results: &[Vec<Point>]) -> Result<()> {
    let med = |i: usize, f: fn(&Point) -> f64| median(results.iter().map(|r| f(&r[i])).collect());
    let last = configs.len() - 1;
    let (off_raw, off_cpu) = (med(last, |p| p.raw.map_or(0.0, |r| r.0)), med(last, |p| p.cpu_ms));
    println!(
        "| configuration | sequences/s | ÷ off | CPU ms / sequence | sequences per CPU-second ÷ off | mean batch (sequences) | padding ratio | \
         raw ONNX Runtime, same batches: sequences/s | raw ÷ raw off | served ÷ raw | raw CPU ms / sequence | \
         ONNX Runtime ms / batch: server, raw | queue delay ms |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (i, (m, settings, padded)) in configs.iter().enumerate() {
        let served = med(i, |p| p.served);
        let cpu = med(i, |p| p.cpu_ms);
        let batch = med(i, |p| p.batch);
        let (run, raw_run, queue) = (
            med(i, |p| p.run_ms),
            med(i, |p| p.raw_run_ms),
            med(i, |p| p.queue_ms),
        );
        let raw_cpu = med(i, |p| p.raw.map_or(0.0, |r| r.2));
        let raw = med(i, |p| p.raw.map_or(0.0, |r| r.0));
        let ratio = med(i, |p| p.raw.map_or(0.0, |r| r.1));
        let v: Value = serde_json::from_str(settings)?;
        let name = match padded {
            true => format!(
                "{m} (max_padding_ratio {}, max_batch_tokens {})",
                v["max_padding_ratio"].as_f64().map_or_else(
                    || format!(
                        "default: {} on the CPU, {} on a GPU",
                        sluice::settings::DEFAULT_MAX_PADDING_RATIO,
                        sluice::settings::DEFAULT_MAX_PADDING_RATIO_GPU
                    ),
                    |x| x.to_string()
                ),
                v["max_batch_tokens"]
            ),
            false => format!("{m} (padding off)"),
        };
        // Each round's ratio to padding off in the same round, and their median.
        let rounds: Vec<f64> = results.iter().map(|r| r[i].served / r[last].served).collect();
        let each = rounds
            .iter()
            .map(|x| format!("{x:.2}"))
            .collect::<Vec<_>>()
            .join(", ");
        let paired = median(rounds);
        println!(
            "| {name} | {served:.1} | {paired:.2}× ({each}) | {cpu:.1} | {:.2}× | {batch:.1} | {ratio:.3} | {raw:.1} | {:.2}× | {:.2} | {raw_cpu:.1} | {run:.2}, {raw_run:.2} | {queue:.2} |",
            off_cpu / cpu,
            raw / off_raw,
            served / raw
        );
    }
    Ok(())
}
