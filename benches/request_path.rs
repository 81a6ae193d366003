//! The request path at the hardware limit: `cargo bench --bench request_path`.
//! See `benches/README.md` (Request path) for the figures and the variables.
//!
//! It asserts nothing: it measures each figure of the goals table in
//! one run, on this machine, and prints it next to its goal.
//!
//! 1. Idle RSS: a `sluice` child process serving only `identity` and `mlp`,
//!    `VmRSS` one second after it turned ready (before any request); then
//!    stopped.
//! 2. Decode: in this process, the server's own decoder
//!    (`protocol::v2_binary::decode_request`, what `POST .../infer` calls) on
//!    the V2 JSON body of one 784-float row; median of many timed calls.
//! 3. Load: a second `sluice` child serving `identity`, `mlp` and 100 copies
//!    of `identity` (`identity_000`..`identity_099`), driven by closed-loop
//!    clients of this process (one tokio thread) in five phases: `identity`
//!    at 64 clients and at 1, the 100 copies at 64 clients (each client
//!    round-robin over them), `mlp` at 64 clients in V2 JSON and in the
//!    binary tensor extension; one row per request. Server CPU from
//!    `/proc/<pid>/stat`, client CPU from `getrusage(RUSAGE_THREAD)`, mean
//!    batch from `/metrics`. After the two `mlp` phases, raw ONNX Runtime in
//!    this process at each phase's mean batch size (rounded) for the CPU per
//!    item to compare with. All of it `SLUICE_BENCH_REPEAT` times, phases
//!    interleaved; medians.

mod common;

use std::collections::btree_map::Entry;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};

use common::client::{
    body_text, closed_loop, connect, encode_request, get, infer_path, infer_request, send, Encoded, LoadPoint,
};
use common::raw::{self, RawPoint, FEATURES};
use common::server::ServerProcess;
use common::{cpu_model, env_num, fmt_opt, loadavg, median, ms, random_floats, verdict};
use sluice::config::Config;
use sluice::runtime::onnx::find_library;

/// Width of the `identity` model (`input` FP32[-1,16] -> `output`): small,
/// so that a request costs its path through the server, not its data.
const IDENTITY_WIDTH: usize = 16;
/// Copies of `identity` for the spread phase.
const SPREAD: usize = 100;
/// Clients of the saturated phases.
const CLIENTS: usize = 64;

struct Opts {
    /// Measured seconds per phase and per raw point.
    seconds: f64,
    /// Rounds of all load phases (interleaved); the report shows medians.
    repeat: usize,
    /// Timed decode calls (each timed on its own; the median is reported).
    decode_runs: usize,
    /// Unmeasured load before each phase (and each raw point).
    warmup: Duration,
}

impl Opts {
    fn from_env() -> Result<Opts> {
        Ok(Opts {
            seconds: common::env_seconds()?,
            repeat: env_num("SLUICE_BENCH_REPEAT", 3usize)?.max(1),
            decode_runs: env_num("SLUICE_BENCH_DECODE_RUNS", 20_000usize)?.max(1),
            warmup: Duration::from_millis(500),
        })
    }

    fn measured(&self) -> Duration {
        Duration::from_secs_f64(self.seconds)
    }
}

/// A load phase: which models, how many clients, what they send.
struct Phase {
    key: &'static str,
    models: Vec<String>,
    clients: usize,
    encoding: &'static str,
    bodies: Arc<Vec<Encoded>>,
}

// ---------------------------------------------------------------- repositories

/// Copies model folder `from` (model.onnx + model-settings.json) to `repo/name`.
fn copy_model(from: &Path, repo: &Path, name: &str) -> Result<()> {
    let dir = repo.join(name);
    std::fs::create_dir_all(&dir)?;
    for file in ["model.onnx", "model-settings.json"] {
        std::fs::copy(from.join(file), dir.join(file))
            .with_context(|| format!("cannot copy {}", from.join(file).display()))?;
    }
    Ok(())
}

/// `root/<folder>` with `identity` and `mlp`, and `spread` copies of `identity`.
fn make_repository(root: &Path, folder: &str, spread: usize) -> Result<PathBuf> {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let identity = src.join("tests/fixtures/models/identity");
    let repo = root.join(folder);
    copy_model(&identity, &repo, "identity")?;
    copy_model(&src.join("model-repository/mlp"), &repo, "mlp")?;
    for i in 0..spread {
        copy_model(&identity, &repo, &spread_name(i))?;
    }
    Ok(repo)
}

fn spread_name(i: usize) -> String {
    format!("identity_{i:03}")
}

// ---------------------------------------------------------------- 1. idle RSS, 2. decode

/// VmRSS of a server with only `identity` and `mlp`, 1 s after ready.
async fn idle_rss(exe: &Path, work: &Path, lib: &Path) -> Result<(u64, Duration)> {
    let repo = make_repository(work, "repo-idle", 0)?;
    let dir = work.join("server-idle");
    std::fs::create_dir_all(&dir)?;
    let started = Instant::now();
    let mut server = ServerProcess::start(exe, &dir, &repo, lib)?;
    let ready = server.wait_ready(started).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    Ok((server.rss_bytes()?, ready))
}

/// Median µs of `decode_request` on `body` (no binary header), each call timed.
fn decode_median_us(body: &[u8], runs: usize) -> Result<f64> {
    let decode =
        || sluice::protocol::v2_binary::decode_request(body, None, &sluice::protocol::shm::NoRegions);
    decode().map_err(|e| anyhow!("the decoder refused the body: {e}"))?;
    for _ in 0..runs.div_ceil(10) {
        std::hint::black_box(decode().is_ok());
    }
    let mut us = Vec::with_capacity(runs);
    for _ in 0..runs {
        let t = Instant::now();
        let r = std::hint::black_box(decode());
        us.push(t.elapsed().as_secs_f64() * 1e6);
        drop(r);
    }
    Ok(median(&us))
}

// ---------------------------------------------------------------- 3. load

/// Every model of every phase ready, and one request to each phase's first
/// model answered 2xx; refuses to go on otherwise.
async fn check_phases(server: &ServerProcess, phases: &[Phase]) -> Result<()> {
    for m in phases.iter().flat_map(|p| &p.models) {
        let (status, body) = get(server.addr, &format!("/v2/models/{m}/ready")).await?;
        if status != 200 {
            bail!("model {m} is not ready ({status}): {}", body_text(&body));
        }
    }
    let mut conn = connect(server.addr).await?;
    for p in phases {
        let path = infer_path(&p.models[0]);
        let req = infer_request(server.addr, &path, &p.bodies[0]);
        let (status, body) = send(&mut conn, req).await?;
        if !(200..300).contains(&status) {
            bail!(
                "{} ({}): {path} answered {status}: {}",
                p.key,
                p.encoding,
                body_text(&body)
            );
        }
    }
    Ok(())
}

/// Everything measured in one round.
struct Round {
    points: BTreeMap<&'static str, LoadPoint>,
    /// Raw ONNX Runtime at the rounded mean batch of each `mlp` phase.
    raw: BTreeMap<&'static str, RawPoint>,
}

async fn load_round(
    server: &ServerProcess,
    phases: &[Phase],
    session: &mut ort::session::Session,
    opts: &Opts,
    round: usize,
) -> Result<Round> {
    let mut points = BTreeMap::new();
    for p in phases {
        let rows = 1;
        let point = closed_loop(
            server,
            p.key,
            &p.models,
            p.clients,
            rows,
            &p.bodies,
            opts.warmup,
            opts.measured(),
        )
        .await?;
        eprintln!(
            "round {round} {:<14} c={:<3}: {:>7.0} req/s, server {} µs/req, client {} µs/req, mean batch {}, {} errors",
            p.key,
            p.clients,
            point.items_per_s(),
            fmt_opt(point.server_us_per_request(), |v| format!("{v:.1}")),
            fmt_opt(point.client_us_per_request(), |v| format!("{v:.1}")),
            fmt_opt(point.mean_batch, |b| format!("{b:.1}")),
            point.errors
        );
        points.insert(p.key, point);
    }
    // Raw ONNX Runtime at each mlp phase's mean batch (the server idles now).
    let mut by_batch: BTreeMap<usize, RawPoint> = BTreeMap::new();
    let mut raw = BTreeMap::new();
    for key in ["mlp_json", "mlp_binary"] {
        let Some(b) = points.get(key).and_then(|p| p.mean_batch) else {
            continue;
        };
        let batch = (b.round() as usize).max(1);
        let r = match by_batch.entry(batch) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => {
                let r = raw::measure(session, batch, 1000 + batch as u64, opts.warmup, opts.measured())?;
                eprintln!(
                    "round {round} raw batch {batch:>3}: {:.1} CPU µs/item, median {:.3} ms/run",
                    r.cpu_per_1000() * 1e3,
                    ms(r.median)
                );
                e.insert(r)
            }
        };
        raw.insert(key, r.clone());
    }
    Ok(Round { points, raw })
}

// ---------------------------------------------------------------- the report

/// Values of `f` over the rounds (those that have one).
fn over<T>(rounds: &[Round], f: impl Fn(&Round) -> Option<T>) -> Vec<T> {
    rounds.iter().filter_map(f).collect()
}

fn fmt_each(values: &[f64], digits: usize) -> String {
    values
        .iter()
        .map(|v| format!("{v:.digits$}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Server CPU per item ÷ raw CPU per item of the same round, for an mlp phase.
fn raw_ratio(r: &Round, key: &str) -> Option<f64> {
    let p = r.points.get(key)?;
    let raw = r.raw.get(key)?;
    Some(p.cpu_per_1000()? / raw.cpu_per_1000())
}

struct Setup {
    intra: usize,
    cpu_batches: usize,
    load_start: String,
    ready_idle: Duration,
    ready_load: Duration,
    rss: u64,
    decode_us: f64,
    decode_bytes: usize,
}

fn report(opts: &Opts, c: &Setup, phases: &[Phase], rounds: &[Round]) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "## sluice request-path benchmark\n");
    let _ = writeln!(o, "Command: `{}`\n", common::command_line("request_path"));
    let _ = writeln!(
        o,
        "Machine: {} cores available, {}; load average (1/5/15 min) {} at start, {} at end.\n",
        sluice::config::cores(),
        cpu_model(),
        c.load_start,
        loadavg()
    );
    let _ = writeln!(
        o,
        "Server: release `sluice`, built-in default configuration (cpu_concurrent_batches = {}, \
         intra_op_threads = {}, spinning off), repository `identity` (FP32[-1,{IDENTITY_WIDTH}] → same, \
         model-settings `{{}}`: max_batch_size 32, max_batch_time 10 ms, adaptive), `mlp` \
         (model-repository/mlp: max_batch_size 64, max_batch_time 2 ms) and `identity_000`..`identity_{:03}`; \
         ready {:.1} s after spawn. Client: this process, one tokio thread, one keep-alive HTTP/1.1 \
         connection per client, one row per request, {:.1} s per phase after {:.1} s warm-up, \
         {} round(s) interleaved; medians over rounds.",
        c.cpu_batches,
        c.intra,
        SPREAD - 1,
        c.ready_load.as_secs_f64(),
        opts.seconds,
        opts.warmup.as_secs_f64(),
        rounds.len()
    );
    let med = |key: &str, f: fn(&LoadPoint) -> Option<f64>| -> Option<f64> {
        let v = over(rounds, |r| r.points.get(key).and_then(f));
        (!v.is_empty()).then(|| median(&v))
    };
    let spread_ratio = over(rounds, |r| {
        Some(
            r.points.get("spread")?.server_us_per_request()?
                / r.points.get("identity")?.server_us_per_request()?,
        )
    });
    let ratio_bin = over(rounds, |r| raw_ratio(r, "mlp_binary"));
    let ratio_json = over(rounds, |r| raw_ratio(r, "mlp_json"));
    let batch_of = |key: &str| med(key, |p| p.mean_batch);

    let _ = writeln!(o, "\n### Goals\n");
    let _ = writeln!(o, "| figure | measured | goal | met? |");
    let _ = writeln!(o, "|---|---:|---:|---|");
    let mut row = |figure: String, v: Option<f64>, unit: &str, goal: f64| {
        let _ = writeln!(
            o,
            "| {figure} | {} | ≤ {goal}{unit} | {} |",
            fmt_opt(v, |v| format!("{v:.2}{unit}")),
            v.map_or("–", |v| verdict(v <= goal))
        );
    };
    row(
        format!("server CPU µs per `identity` request, V2 JSON, {CLIENTS} clients"),
        med("identity", LoadPoint::server_us_per_request),
        " µs",
        12.0,
    );
    row(
        "same, 1 client".into(),
        med("identity_1", LoadPoint::server_us_per_request),
        " µs",
        40.0,
    );
    let nz = |v: &Vec<f64>| (!v.is_empty()).then(|| median(v));
    row(
        format!(
            "`mlp` 1 row, {CLIENTS} clients, binary tensor extension: server CPU per item ÷ raw ONNX Runtime \
             at the mean batch ({})",
            fmt_opt(batch_of("mlp_binary"), |b| format!("{b:.1}"))
        ),
        nz(&ratio_bin),
        "×",
        1.6,
    );
    row(
        format!(
            "same, V2 JSON (mean batch {})",
            fmt_opt(batch_of("mlp_json"), |b| format!("{b:.1}"))
        ),
        nz(&ratio_json),
        "×",
        2.0,
    );
    row(
        format!(
            "decode of a 784-float V2 JSON body ({} B), median of {} calls",
            c.decode_bytes, opts.decode_runs
        ),
        Some(c.decode_us),
        " µs",
        6.0,
    );
    row(
        format!(
            "`identity` spread over {SPREAD} models ÷ one model, server CPU per request, {CLIENTS} clients"
        ),
        nz(&spread_ratio),
        "×",
        1.3,
    );
    row(
        format!(
            "idle RSS with `identity` + `mlp` loaded (1 s after ready, before any request; ready in {:.1} s)",
            c.ready_idle.as_secs_f64()
        ),
        Some(c.rss as f64 / (1024.0 * 1024.0)),
        " MiB",
        60.0,
    );
    let _ = writeln!(
        o,
        "\nRatios are taken per round (server and raw of the same round, spread and one model of \
         the same round), then the median; each round's: binary [{}]; JSON [{}]; spread [{}].",
        fmt_each(&ratio_bin, 2),
        fmt_each(&ratio_json, 2),
        fmt_each(&spread_ratio, 2)
    );

    let _ = writeln!(o, "\n### Phases (medians over rounds)\n");
    let _ = writeln!(
        o,
        "| phase | model(s) | clients | encoding | requests/s | p50 ms | p99 ms | mean batch \
         | server CPU µs / request | client CPU µs / request | client < server | server cores busy \
         | server CPU µs / request, each round | errors |"
    );
    let _ = writeln!(
        o,
        "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---|---:|---|---:|"
    );
    for p in phases {
        let each = over(rounds, |r| {
            r.points.get(p.key).and_then(|x| x.server_us_per_request())
        });
        let server = med(p.key, LoadPoint::server_us_per_request);
        let client = med(p.key, LoadPoint::client_us_per_request);
        let models = if p.models.len() == 1 {
            format!("`{}`", p.models[0])
        } else {
            format!(
                "`{}`..`{}` round-robin",
                p.models[0],
                p.models[p.models.len() - 1]
            )
        };
        let errors: u64 = over(rounds, |r| r.points.get(p.key).map(|x| x.errors))
            .iter()
            .sum();
        let _ = writeln!(
            o,
            "| {} | {models} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {errors} |",
            p.key,
            p.clients,
            p.encoding,
            fmt_opt(med(p.key, |x| Some(x.items_per_s())), |v| format!("{v:.0}")),
            fmt_opt(med(p.key, |x| Some(ms(x.p50))), |v| format!("{v:.2}")),
            fmt_opt(med(p.key, |x| Some(ms(x.p99))), |v| format!("{v:.2}")),
            fmt_opt(med(p.key, |x| x.mean_batch), |v| format!("{v:.1}")),
            fmt_opt(server, |v| format!("{v:.1}")),
            fmt_opt(client, |v| format!("{v:.1}")),
            match (client, server) {
                (Some(c), Some(s)) => verdict(c < s),
                _ => "–",
            },
            fmt_opt(med(p.key, |x| Some(x.server_cpu / x.wall)), |v| format!("{v:.2}")),
            fmt_each(&each, 1),
        );
    }

    let _ = writeln!(
        o,
        "\n### `mlp` against raw ONNX Runtime (in-process `ort`, same session options)\n"
    );
    let _ = writeln!(
        o,
        "| phase | round | mean batch | batches of one row | raw batch | server CPU µs / item | raw CPU µs / item | server ÷ raw |"
    );
    let _ = writeln!(o, "|---|---:|---:|---:|---:|---:|---:|---:|");
    for key in ["mlp_binary", "mlp_json"] {
        for (i, r) in rounds.iter().enumerate() {
            let (Some(p), Some(raw)) = (r.points.get(key), r.raw.get(key)) else {
                continue;
            };
            let _ = writeln!(
                o,
                "| {key} | {} | {} | {} | {} | {} | {:.1} | {} |",
                i + 1,
                fmt_opt(p.mean_batch, |b| format!("{b:.1}")),
                fmt_opt(p.one_row_batches, |f| format!("{:.0} %", f * 100.0)),
                raw.batch,
                fmt_opt(p.cpu_per_1000(), |v| format!("{:.1}", v * 1e3)),
                raw.cpu_per_1000() * 1e3,
                fmt_opt(raw_ratio(r, key), |v| format!("{v:.2}")),
            );
        }
    }
    o
}

// ---------------------------------------------------------------- main

fn main() -> Result<()> {
    if !common::run_by_cargo_bench() {
        println!("benches/request_path.rs: skipped (not run by `cargo bench`); run `cargo bench --bench request_path`");
        return Ok(());
    }
    let opts = Opts::from_env()?;
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let lib = find_library(None).map_err(|e| anyhow!("{e}"))?;
    let cfg = Config::default();
    let intra = cfg.default_intra_op_threads();
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_sluice"));
    let load_start = loadavg();
    eprintln!(
        "sluice request-path bench: {}",
        common::command_line("request_path")
    );
    eprintln!("ONNX Runtime: {}; server: {}", lib.display(), exe.display());
    let tokio = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let work = tempfile::tempdir()?;

    // 1. Idle RSS, on its own server (stopped when `idle_rss` returns).
    let (rss, ready_idle) = tokio.block_on(idle_rss(&exe, work.path(), &lib))?;
    eprintln!("idle RSS with identity + mlp: {:.1} MiB", rss as f64 / 1048576.0);

    // The bodies: 64 different rows each, cycled by the clients.
    let bodies = |width: usize, input: &str, binary: bool| -> Arc<Vec<Encoded>> {
        Arc::new(
            (0..64)
                .map(|i| encode_request(input, &random_floats(width, 100 + i), 1, width, binary))
                .collect(),
        )
    };
    let identity = bodies(IDENTITY_WIDTH, "input", false);
    let mlp_json = bodies(FEATURES, "input", false);

    // 2. Decode, in this process, of the first body the mlp JSON phase sends.
    let decode_us = decode_median_us(&mlp_json[0].body, opts.decode_runs)?;
    eprintln!(
        "decode of a {} B body: median {decode_us:.2} µs",
        mlp_json[0].body.len()
    );

    // 3. Load.
    let phase = |key, models: Vec<String>, clients, encoding, bodies: &Arc<Vec<Encoded>>| Phase {
        key,
        models,
        clients,
        encoding,
        bodies: bodies.clone(),
    };
    let (one, json) = (|m: &str| vec![m.to_string()], "V2 JSON");
    let phases = vec![
        phase("identity", one("identity"), CLIENTS, json, &identity),
        phase("identity_1", one("identity"), 1, json, &identity),
        phase(
            "spread",
            (0..SPREAD).map(spread_name).collect(),
            CLIENTS,
            json,
            &identity,
        ),
        phase("mlp_json", one("mlp"), CLIENTS, json, &mlp_json),
        phase(
            "mlp_binary",
            one("mlp"),
            CLIENTS,
            "binary tensors",
            &bodies(FEATURES, "input", true),
        ),
    ];
    let env = raw::environment(&lib)?;
    let mut session = raw::session(&env, &root.join("model-repository/mlp/model.onnx"), intra)?;
    let repo = make_repository(work.path(), "repo-load", SPREAD)?;
    let dir = work.path().join("server-load");
    std::fs::create_dir_all(&dir)?;
    let started = Instant::now();
    let mut server = ServerProcess::start(&exe, &dir, &repo, &lib)?;
    let loaded = tokio.block_on(async {
        let ready = server.wait_ready(started).await?;
        eprintln!(
            "server ready after {:.1} s (pid {}, {})",
            ready.as_secs_f64(),
            server.pid(),
            server.addr
        );
        check_phases(&server, &phases).await?;
        let mut rounds = Vec::new();
        for round in 1..=opts.repeat {
            rounds.push(load_round(&server, &phases, &mut session, &opts, round).await?);
        }
        anyhow::Ok((ready, rounds))
    });
    drop(server);
    let (ready_load, rounds) = loaded?;

    let c = Setup {
        intra,
        cpu_batches: cfg.cpu_concurrent_batches(),
        load_start,
        ready_idle,
        ready_load,
        rss,
        decode_us,
        decode_bytes: mlp_json[0].body.len(),
    };
    println!("\n{}", report(&opts, &c, &phases, &rounds));
    Ok(())
}
