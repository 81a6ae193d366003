//! End-to-end serving benchmark: `cargo bench --bench serving`.
//! See `benches/README.md` for the environment variables and the columns.
//!
//! It asserts nothing and is not a timed test: it measures, on this machine,
//! in one run, and prints Markdown tables.
//!
//! 1. Raw ONNX Runtime, in this process, through `ort` directly: one session
//!    on `model-repository/mlp/model.onnx` built like the server builds one
//!    (graph optimisation level 3, the server's default intra-op threads,
//!    spinning off); items/s, median time per run, and CPU seconds per 1000
//!    items from `getrusage(RUSAGE_SELF)` (this process does nothing else
//!    during the phase) at each batch size.
//! 2. The `sluice` binary Cargo built for this bench (release profile) as a
//!    child process on 127.0.0.1 port 0, over a temp repository holding four
//!    copies of the MLP with different batch settings, run with the built-in
//!    default configuration (an empty `--config` file, and `SLUICE_*`
//!    variables removed from its environment).
//! 3. Closed-loop load from this process (one tokio thread, one keep-alive
//!    HTTP/1.1 connection per client, one request in flight per client, one
//!    row per request unless `SLUICE_BENCH_ROWS` says otherwise, bodies
//!    serialized beforehand) at each concurrency,
//!    against the batching and the non-batching model: items/s, latency
//!    p50/p99, the server's CPU seconds from `/proc/<pid>/stat`, and the
//!    mean batch size from its `/metrics`.
//! 4. Low load: sequential single requests with a pause between them, to a
//!    model with `max_batch_time = 0.5` under `adaptive` and under `fixed`.

mod common;

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};

use common::client::{
    body_text, closed_loop, connect, encode_request, infer_path, infer_request, send, Encoded, LoadPoint,
};
use common::metrics::{snapshot, Edge};
use common::raw::{self, RawPoint, FEATURES, OUTPUTS};
use common::server::ServerProcess;
use common::{
    cpu_model, env_flag, env_list, env_num, fmt_opt, loadavg, ms, percentile, random_floats, verdict,
};
use sluice::config::Config;
use sluice::runtime::onnx::find_library;

/// The models of the temp repository: (folder, model-settings.json).
const MODELS: [(&str, &str); 4] = [
    ("mlp_batch", r#"{"max_batch_size": 32, "max_batch_time": 0.002}"#),
    ("mlp_nobatch", r#"{"max_batch_size": 1}"#),
    (
        "mlp_adaptive",
        r#"{"max_batch_size": 32, "max_batch_time": 0.5, "batch_policy": "adaptive"}"#,
    ),
    (
        "mlp_fixed",
        r#"{"max_batch_size": 32, "max_batch_time": 0.5, "batch_policy": "fixed"}"#,
    ),
];

// ---------------------------------------------------------------- options

/// Settings from `SLUICE_BENCH_*` environment variables.
struct Opts {
    /// Measured seconds per raw batch size and per load point.
    seconds: f64,
    /// Shorter warm-ups and fewer low-load requests (smoke runs).
    quick: bool,
    /// Rows per request in the load phases (the low-load phase always sends 1).
    rows: usize,
    /// Send the binary tensor extension instead of JSON (falls back to JSON if refused).
    binary: bool,
    raw_batches: Vec<usize>,
    concurrency: Vec<usize>,
    adaptive_requests: usize,
    fixed_requests: usize,
    /// Pause between two low-load requests.
    gap: Duration,
    /// Unmeasured load before each measured load point (and each raw batch size).
    warmup: Duration,
}

impl Opts {
    fn from_env() -> Result<Opts> {
        let quick = env_flag("SLUICE_BENCH_QUICK");
        let seconds = common::env_seconds()?;
        Ok(Opts {
            seconds,
            quick,
            binary: env_flag("SLUICE_BENCH_BINARY"),
            rows: env_num("SLUICE_BENCH_ROWS", 1usize)?.max(1),
            raw_batches: env_list("SLUICE_BENCH_RAW_BATCHES", &[1, 8, 32])?,
            concurrency: env_list("SLUICE_BENCH_CONCURRENCY", &[1, 8, 64])?,
            adaptive_requests: env_num("SLUICE_BENCH_ADAPTIVE_REQUESTS", if quick { 20 } else { 50 })?,
            fixed_requests: env_num("SLUICE_BENCH_FIXED_REQUESTS", if quick { 4 } else { 10 })?,
            gap: Duration::from_millis(env_num("SLUICE_BENCH_GAP_MS", 10)?),
            warmup: Duration::from_millis(if quick { 200 } else { 500 }),
        })
    }

    fn measured(&self) -> Duration {
        Duration::from_secs_f64(self.seconds)
    }
}

/// The command that reproduces this run: the `SLUICE_BENCH_*` variables set, then cargo.
fn command_line() -> String {
    common::command_line("serving")
}

// ---------------------------------------------------------------- 1. raw ONNX Runtime

/// The raw phase's results.
struct Raw {
    points: Vec<RawPoint>,
    /// Median batch-1 run after an idle pause of `Opts::gap`, as the low-load
    /// requests see it (ONNX Runtime's threads, spinning off, have gone to sleep).
    idle_batch1: Duration,
}

fn raw_onnxruntime(lib: &Path, model: &Path, intra: usize, opts: &Opts) -> Result<Raw> {
    let env = raw::environment(lib)?;
    let mut session = raw::session(&env, model, intra)?;
    let mut points = Vec::new();
    for (i, &batch) in opts.raw_batches.iter().enumerate() {
        let p = raw::measure(&mut session, batch, 1000 + i as u64, opts.warmup, opts.measured())?;
        eprintln!(
            "raw batch {batch:>3}: {:>8.0} items/s, median {:.3} ms/run, {:.4} CPU s/1000 items",
            p.items_per_s(),
            ms(p.median),
            p.cpu_per_1000()
        );
        points.push(p);
    }
    let xs = random_floats(FEATURES, 999);
    let mut lat = Vec::new();
    for _ in 0..opts.adaptive_requests.max(1) {
        std::thread::sleep(opts.gap);
        let t = Instant::now();
        raw::run(&mut session, 1, &xs)?;
        lat.push(t.elapsed());
    }
    lat.sort();
    let idle_batch1 = percentile(&lat, 50.0);
    eprintln!(
        "raw batch   1 after {} ms idle: median {:.3} ms/run",
        opts.gap.as_millis(),
        ms(idle_batch1)
    );
    Ok(Raw { points, idle_batch1 })
}

/// The raw point nearest to a batch size (by ratio, so 16 is as near 8 as 32).
fn nearest_raw(raw: &[RawPoint], batch: f64) -> &RawPoint {
    let d = |p: &RawPoint| (p.batch as f64 / batch.max(1.0)).ln().abs();
    raw.iter()
        .min_by(|a, b| d(a).total_cmp(&d(b)))
        .expect("at least one raw batch size")
}

// ---------------------------------------------------------------- 2. the server child process

/// A temp repository with the four MLP copies of [`MODELS`].
fn make_repository(root: &Path, model: &Path) -> Result<PathBuf> {
    let repo = root.join("repo");
    for (name, settings) in MODELS {
        let dir = repo.join(name);
        std::fs::create_dir_all(&dir)?;
        std::fs::copy(model, dir.join("model.onnx"))
            .with_context(|| format!("cannot copy {}", model.display()))?;
        std::fs::write(dir.join("model-settings.json"), settings)?;
    }
    Ok(repo)
}

// ---------------------------------------------------------------- HTTP checks

/// Checks a V2 response holds `logits` with one row of 10 numbers.
fn check_response(body: &[u8]) -> Result<()> {
    let v: serde_json::Value = serde_json::from_slice(body).context("response is not JSON")?;
    let out = v["outputs"]
        .as_array()
        .and_then(|o| o.iter().find(|o| o["name"] == "logits"))
        .ok_or_else(|| anyhow!("no `logits` output in {v}"))?;
    let n = out["data"].as_array().map_or(0, Vec::len);
    if n != OUTPUTS {
        bail!("`logits` has {n} values, expected {OUTPUTS}: {out}");
    }
    Ok(())
}

/// JSON, or binary when asked for and the server accepts it.
async fn choose_encoding(addr: SocketAddr, want_binary: bool) -> Result<(bool, Option<String>)> {
    let row = random_floats(FEATURES, 7);
    let path = infer_path("mlp_batch");
    let mut note = None;
    if want_binary {
        let mut conn = connect(addr).await?;
        let (status, body) = send(
            &mut conn,
            infer_request(addr, &path, &encode_request("input", &row, 1, FEATURES, true)),
        )
        .await?;
        match (status, check_response(&body)) {
            (200..=299, Ok(())) => return Ok((true, None)),
            (200..=299, Err(e)) => {
                note = Some(format!(
                    "binary request: unexpected answer ({e}); falling back to JSON"
                ))
            }
            _ => {
                note = Some(format!(
                    "binary request answered {status}: {}; falling back to JSON",
                    body_text(&body)
                ))
            }
        }
        eprintln!("{}", note.as_deref().unwrap_or_default());
    }
    let mut conn = connect(addr).await?;
    let (status, body) = send(
        &mut conn,
        infer_request(addr, &path, &encode_request("input", &row, 1, FEATURES, false)),
    )
    .await?;
    if !(200..300).contains(&status) {
        bail!("JSON request answered {status}: {}", body_text(&body));
    }
    check_response(&body)?;
    Ok((false, note))
}

// ---------------------------------------------------------------- 3. closed-loop load

/// One load point on `model` (common::client::closed_loop), with its progress line.
async fn load_point(
    server: &ServerProcess,
    model: &'static str,
    concurrency: usize,
    bodies: &Arc<Vec<Encoded>>,
    opts: &Opts,
) -> Result<LoadPoint> {
    let p = closed_loop(
        server,
        model,
        &[model],
        concurrency,
        opts.rows,
        bodies,
        opts.warmup,
        opts.measured(),
    )
    .await?;
    eprintln!(
        "{model:<12} c={concurrency:<3}: {:>7.0} items/s, p50 {:.2} ms, p99 {:.2} ms, mean batch {}, {} errors",
        p.items_per_s(),
        ms(p.p50),
        ms(p.p99),
        p.mean_batch.map_or("-".into(), |b| format!("{b:.1}")),
        p.errors
    );
    Ok(p)
}

// ---------------------------------------------------------------- 4. low load

struct LowLoad {
    model: &'static str,
    policy: &'static str,
    requests: usize,
    p50: Duration,
    max: Duration,
    queue_delay: Option<f64>,
    session_run: Option<f64>,
}

async fn low_load(
    server: &ServerProcess,
    model: &'static str,
    policy: &'static str,
    requests: usize,
    bodies: &[Encoded],
    opts: &Opts,
) -> Result<LowLoad> {
    let addr = server.addr;
    let path = infer_path(model);
    let mut conn = connect(addr).await?;
    // One unmeasured request (first use of the connection and of the batcher).
    send(&mut conn, infer_request(addr, &path, &bodies[0])).await?;
    let before = snapshot(addr, server.pid(), Edge::Start).await?;
    let mut lat = Vec::with_capacity(requests);
    for i in 0..requests {
        tokio::time::sleep(opts.gap).await;
        let req = infer_request(addr, &path, &bodies[(i + 1) % bodies.len()]);
        let t = Instant::now();
        let (status, body) = send(&mut conn, req).await?;
        let took = t.elapsed();
        if !(200..300).contains(&status) {
            bail!("{model}: answered {status}: {}", body_text(&body));
        }
        lat.push(took);
    }
    let after = snapshot(addr, server.pid(), Edge::End).await?;
    lat.sort();
    let l = LowLoad {
        model,
        policy,
        requests,
        p50: percentile(&lat, 50.0),
        max: lat.last().copied().unwrap_or_default(),
        queue_delay: before.mean_since(&after, "sluice_queue_delay_seconds", model),
        session_run: before.mean_since(&after, "sluice_inference_duration_seconds", model),
    };
    eprintln!(
        "{model:<12} low load: p50 {:.3} ms over {requests} requests",
        ms(l.p50)
    );
    Ok(l)
}

// ---------------------------------------------------------------- the report

struct ServedReport {
    binary: bool,
    encoding_note: Option<String>,
    ready_after: Duration,
    load: Vec<LoadPoint>,
    low: Vec<LowLoad>,
}

async fn serve_phases(server: &mut ServerProcess, opts: &Opts, started: Instant) -> Result<ServedReport> {
    let ready_after = server.wait_ready(started).await?;
    eprintln!(
        "server ready after {:.1} s (pid {}, {})",
        ready_after.as_secs_f64(),
        server.pid(),
        server.addr
    );
    let (binary, encoding_note) = choose_encoding(server.addr, opts.binary).await?;
    // 64 different bodies, cycled by the clients.
    let encode = |rows: usize| -> Arc<Vec<Encoded>> {
        Arc::new(
            (0..64)
                .map(|i| {
                    encode_request(
                        "input",
                        &random_floats(rows * FEATURES, 100 + i),
                        rows,
                        FEATURES,
                        binary,
                    )
                })
                .collect(),
        )
    };
    let bodies = encode(opts.rows);
    let single = encode(1);
    let mut load = Vec::new();
    for model in ["mlp_batch", "mlp_nobatch"] {
        for &c in &opts.concurrency {
            load.push(load_point(server, model, c, &bodies, opts).await?);
        }
    }
    let low = vec![
        low_load(
            server,
            "mlp_adaptive",
            "adaptive",
            opts.adaptive_requests,
            &single,
            opts,
        )
        .await?,
        low_load(server, "mlp_fixed", "fixed", opts.fixed_requests, &single, opts).await?,
    ];
    Ok(ServedReport {
        binary,
        encoding_note,
        ready_after,
        load,
        low,
    })
}

#[allow(clippy::too_many_arguments)]
fn report(
    opts: &Opts,
    intra: usize,
    cpu_batches: usize,
    load_start: &str,
    load_end: &str,
    raw_result: &Raw,
    s: &ServedReport,
) -> String {
    let raw = &raw_result.points[..];
    let mut o = String::new();
    let encoding = if s.binary {
        "V2 binary tensor extension"
    } else {
        "V2 JSON"
    };
    let _ = writeln!(o, "## sluice serving benchmark\n");
    let _ = writeln!(o, "Command: `{}`\n", command_line());
    let _ = writeln!(
        o,
        "Machine: {} cores available, {}; load average (1/5/15 min) {} at start, {} at end.",
        sluice::config::cores(),
        cpu_model(),
        load_start,
        load_end
    );
    let _ = writeln!(
        o,
        "Server: release `sluice`, built-in default configuration (cpu_concurrent_batches = {cpu_batches}, \
         intra_op_threads = {intra}, spinning off), ready {:.1} s after spawn. \
         Client: this process, one tokio thread on the same machine, {encoding}, {} row(s) per request, \
         {:.1} s per point after {:.1} s warm-up.",
        s.ready_after.as_secs_f64(),
        opts.rows,
        opts.seconds,
        opts.warmup.as_secs_f64()
    );
    if let Some(n) = &s.encoding_note {
        let _ = writeln!(o, "\nNote: {n}");
    }
    if opts.quick {
        let _ = writeln!(
            o,
            "\nQUICK run (SLUICE_BENCH_QUICK): short warm-ups and few low-load requests."
        );
    }

    let _ = writeln!(
        o,
        "\n### Raw ONNX Runtime (in-process `ort`, same session options, intra_op_threads = {intra})\n"
    );
    let _ = writeln!(
        o,
        "| batch | runs | items/s | median ms/run | CPU s / 1000 items | CPU cores busy |"
    );
    let _ = writeln!(o, "|---:|---:|---:|---:|---:|---:|");
    for p in raw {
        let _ = writeln!(
            o,
            "| {} | {} | {:.0} | {:.3} | {:.4} | {:.2} |",
            p.batch,
            p.runs,
            p.items_per_s(),
            ms(p.median),
            p.cpu_per_1000(),
            p.cpu / p.wall
        );
    }

    let _ = writeln!(o, "\n### Served (closed loop, {encoding})\n");
    let _ = writeln!(
        o,
        "| model | batching | clients | items/s | p50 ms | p99 ms | mean batch | mean queue delay ms \
         | server CPU s / 1000 items \
         | server cores busy | client cores busy | raw CPU s / 1000 items (batch) | server ÷ raw | errors |"
    );
    let _ = writeln!(
        o,
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for p in &s.load {
        let near = nearest_raw(raw, p.mean_batch.unwrap_or(1.0));
        let batching = if p.label == "mlp_batch" {
            "on (32, 2 ms)"
        } else {
            "off"
        };
        let _ = writeln!(
            o,
            "| {} | {batching} | {} | {:.0} | {:.2} | {:.2} | {} | {} | {} | {:.2} | {:.2} | {:.4} ({}) | {} | {} |",
            p.label,
            p.concurrency,
            p.items_per_s(),
            ms(p.p50),
            ms(p.p99),
            fmt_opt(p.mean_batch, |b| format!("{b:.1}")),
            fmt_opt(p.queue_delay, |d| format!("{:.3}", d * 1e3)),
            fmt_opt(p.cpu_per_1000(), |c| format!("{c:.4}")),
            p.server_cpu / p.wall,
            p.client_cpu / p.wall,
            near.cpu_per_1000(),
            near.batch,
            fmt_opt(p.cpu_per_1000(), |c| format!("{:.2}", c / near.cpu_per_1000())),
            p.errors
        );
    }

    let raw1 = raw.iter().find(|p| p.batch == 1);
    let _ = writeln!(
        o,
        "\n### Low load (sequential requests, {} ms pause between them, max_batch_size 32, max_batch_time 0.5 s)\n",
        opts.gap.as_millis()
    );
    let _ = writeln!(
        o,
        "| model | policy | requests | p50 ms | max ms | mean queue delay ms | mean session run ms \
         | raw batch-1 median ms | raw batch-1 after the same pause ms | p50 − raw batch-1 ms |"
    );
    let _ = writeln!(o, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for l in &s.low {
        let _ = writeln!(
            o,
            "| {} | {} | {} | {:.3} | {:.3} | {} | {} | {} | {:.3} | {} |",
            l.model,
            l.policy,
            l.requests,
            ms(l.p50),
            ms(l.max),
            fmt_opt(l.queue_delay, |d| format!("{:.3}", d * 1e3)),
            fmt_opt(l.session_run, |d| format!("{:.3}", d * 1e3)),
            raw1.map_or("–".into(), |r| format!("{:.3}", ms(r.median))),
            ms(raw_result.idle_batch1),
            raw1.map_or("–".into(), |r| format!("{:+.3}", ms(l.p50) - ms(r.median))),
        );
    }

    let _ = writeln!(o, "\n### Targets\n");
    let _ = writeln!(o, "| target | measured | goal | met |");
    let _ = writeln!(o, "|---|---:|---:|---|");
    let at = |model: &str| {
        let c = opts.concurrency.iter().copied().max().unwrap_or(0);
        s.load.iter().find(|p| p.label == model && p.concurrency == c)
    };
    if let Some(p) = at("mlp_batch") {
        if let Some(cpu) = p.cpu_per_1000() {
            let near = nearest_raw(raw, p.mean_batch.unwrap_or(1.0));
            let r = cpu / near.cpu_per_1000();
            let _ = writeln!(
                o,
                "| server CPU per item at saturation (mlp_batch, {} clients, mean batch {}) ÷ raw at batch {} \
                 | {r:.2}× | ≤ 1.15× | {} |",
                p.concurrency,
                fmt_opt(p.mean_batch, |b| format!("{b:.1}")),
                near.batch,
                verdict(r <= 1.15)
            );
        }
    }
    if let Some(p) = at("mlp_nobatch") {
        if let Some(cpu) = p.cpu_per_1000() {
            // Batching off: each batch is one request, so its rows (1, or
            // SLUICE_BENCH_ROWS) are the batch size to compare with.
            let near = nearest_raw(raw, p.mean_batch.unwrap_or(1.0));
            let r = cpu / near.cpu_per_1000();
            let _ = writeln!(
                o,
                "| server CPU per item at saturation, batching off (mlp_nobatch, {} clients) ÷ raw at batch {} \
                 | {r:.2}× | ≤ 1.15× | {} |",
                p.concurrency,
                near.batch,
                verdict(r <= 1.15)
            );
        }
    }
    if let (Some(l), Some(r1)) = (s.low.iter().find(|l| l.policy == "adaptive"), raw1) {
        let d = ms(l.p50) - ms(r1.median);
        let _ = writeln!(
            o,
            "| adaptive low-load p50 − raw batch-1 compute (max_batch_time 0.5 s) | {d:+.3} ms | ≤ 1 ms | {} |",
            verdict(d <= 1.0)
        );
        let d = ms(l.p50) - ms(raw_result.idle_batch1);
        let _ = writeln!(
            o,
            "| (same, against raw batch-1 after the same {} ms pause, {:.3} ms) | {d:+.3} ms | ≤ 1 ms | {} |",
            opts.gap.as_millis(),
            ms(raw_result.idle_batch1),
            verdict(d <= 1.0)
        );
    }
    if let (Some(on), Some(off)) = (at("mlp_batch"), at("mlp_nobatch")) {
        let r = on.items_per_s() / off.items_per_s();
        let _ = writeln!(
            o,
            "| items/s batching on ÷ off at {} clients | {r:.2}× | ≥ 3× | {} |",
            on.concurrency,
            verdict(r >= 3.0)
        );
    }
    o
}

// ---------------------------------------------------------------- main

fn main() -> Result<()> {
    // `cargo test --all-targets` (make test) runs harness = false benches too,
    // without `--bench`: do nothing there.
    if !common::run_by_cargo_bench() {
        println!("benches/serving.rs: skipped (not run by `cargo bench`); run `cargo bench --bench serving`");
        return Ok(());
    }
    let opts = Opts::from_env()?;
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let model = root.join("model-repository/mlp/model.onnx");
    let lib = find_library(None).map_err(|e| anyhow!("{e}"))?;
    let cfg = Config::default();
    let intra = cfg.default_intra_op_threads();
    // Cargo builds the binary with the bench profile (release) before the bench.
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_sluice"));
    let load_start = loadavg();
    eprintln!("sluice serving bench: {}", command_line());
    eprintln!("ONNX Runtime: {}; server: {}", lib.display(), exe.display());

    let raw = raw_onnxruntime(&lib, &model, intra, &opts)?;

    let work = tempfile::tempdir()?;
    let repo = make_repository(work.path(), &model)?;
    let started = Instant::now();
    let mut server = ServerProcess::start(&exe, work.path(), &repo, &lib)?;
    let tokio = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let served = tokio.block_on(serve_phases(&mut server, &opts, started));
    drop(server);
    let served = served?;

    println!(
        "\n{}",
        report(
            &opts,
            intra,
            cfg.cpu_concurrent_batches(),
            &load_start,
            &loadavg(),
            &raw,
            &served
        )
    );
    Ok(())
}
