//! End-to-end serving benchmark (issue 3): `cargo bench --bench serving`.
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

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write as _};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::header::{CONTENT_TYPE, HOST};
use hyper_util::rt::TokioIo;
use ort::session::builder::GraphOptimizationLevel;
use ort::session::Session;
use ort::value::TensorRef;

use sluice::config::Config;
use sluice::runtime::onnx::find_library;

/// The MLP's input width and output width (`input` FP32[-1,784] -> `logits` FP32[-1,10]).
const FEATURES: usize = 784;
const OUTPUTS: usize = 10;

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

fn env_var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

fn env_num<T: std::str::FromStr>(name: &str, default: T) -> Result<T> {
    match env_var(name) {
        None => Ok(default),
        Some(v) => v
            .trim()
            .parse()
            .map_err(|_| anyhow!("{name}={v} is not a valid number")),
    }
}

fn env_list(name: &str, default: &[usize]) -> Result<Vec<usize>> {
    match env_var(name) {
        None => Ok(default.to_vec()),
        Some(v) => {
            let list = v
                .split(',')
                .map(|x| x.trim().parse::<usize>().ok().filter(|&n| n > 0))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| anyhow!("{name}={v}: expected a comma-separated list of positive integers"))?;
            if list.is_empty() {
                bail!("{name} is empty");
            }
            Ok(list)
        }
    }
}

fn env_flag(name: &str) -> bool {
    env_var(name).is_some_and(|v| !matches!(v.trim(), "0" | "false" | "no"))
}

impl Opts {
    fn from_env() -> Result<Opts> {
        let quick = env_flag("SLUICE_BENCH_QUICK");
        let seconds: f64 = env_num("SLUICE_BENCH_SECONDS", 3.0)?;
        if !(seconds.is_finite() && seconds > 0.0) {
            bail!("SLUICE_BENCH_SECONDS must be > 0, got {seconds}");
        }
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
    let mut vars: Vec<String> = std::env::vars()
        .filter(|(k, v)| k.starts_with("SLUICE_BENCH_") && !v.is_empty())
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    vars.sort();
    vars.push("cargo bench --bench serving".into());
    vars.join(" ")
}

// ---------------------------------------------------------------- measuring helpers

/// Deterministic pseudo-random floats in [0, 1) (xorshift64*), so runs send the same data.
fn random_floats(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            let x = s.wrapping_mul(0x2545_F491_4F6C_DD1D);
            (x >> 40) as f32 / (1u64 << 24) as f32
        })
        .collect()
}

/// User + system CPU seconds of this process, all threads (getrusage).
fn self_cpu_seconds() -> f64 {
    let mut ru = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes a complete `rusage` into the pointer on success.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, ru.as_mut_ptr()) };
    assert_eq!(rc, 0, "getrusage failed");
    // SAFETY: zero-initialised, then filled by getrusage.
    let ru = unsafe { ru.assume_init() };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// User + system CPU seconds of process `pid`, all threads (`/proc/<pid>/stat`,
/// utime and stime in clock ticks).
fn process_cpu_seconds(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("cannot read /proc/{pid}/stat"))?;
    // The command name (field 2) is in parentheses and may hold spaces; the
    // fields after it start with field 3 (state), so utime (14) is index 11.
    let rest = stat
        .rfind(')')
        .map(|i| &stat[i + 1..])
        .ok_or_else(|| anyhow!("unexpected /proc/{pid}/stat: {stat}"))?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |i: usize| -> Result<u64> {
        fields
            .get(i)
            .and_then(|f| f.parse().ok())
            .ok_or_else(|| anyhow!("unexpected /proc/{pid}/stat: {stat}"))
    };
    let ticks = field(11)? + field(12)?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if hz <= 0 {
        bail!("sysconf(_SC_CLK_TCK) failed");
    }
    Ok(ticks as f64 / hz as f64)
}

/// Nearest-rank percentile of sorted samples.
fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "?".into())
}

// ---------------------------------------------------------------- 1. raw ONNX Runtime

struct RawPoint {
    batch: usize,
    runs: u64,
    wall: f64,
    cpu: f64,
    median: Duration,
}

impl RawPoint {
    fn items(&self) -> f64 {
        (self.runs * self.batch as u64) as f64
    }
    fn items_per_s(&self) -> f64 {
        self.items() / self.wall
    }
    fn cpu_per_1000(&self) -> f64 {
        self.cpu / self.items() * 1000.0
    }
}

/// The session as the server builds it (`runtime::onnx::OnnxRuntime::builder`),
/// without the shared prepacked-weights container, which only matters with
/// several instances.
fn raw_session(env: &ort::environment::Environment, model: &Path, intra: usize) -> ort::Result<Session> {
    Session::builder(env)?
        .with_optimization_level(GraphOptimizationLevel::Level3)?
        .with_intra_threads(intra)?
        .with_intra_op_spinning(false)?
        .commit_from_file(model)
}

/// One run: input view, session run, output copied out (the server copies it too).
fn raw_run(session: &mut Session, batch: usize, xs: &[f32]) -> Result<()> {
    let outputs =
        session.run(ort::inputs!["input" => TensorRef::from_array_view(([batch, FEATURES], xs))?])?;
    let (_, logits) = outputs["logits"].try_extract_tensor::<f32>()?;
    if logits.len() != batch * OUTPUTS {
        bail!("raw run: {} logits for batch {batch}", logits.len());
    }
    std::hint::black_box(logits.to_vec());
    Ok(())
}

/// The raw phase's results.
struct Raw {
    points: Vec<RawPoint>,
    /// Median batch-1 run after an idle pause of `Opts::gap`, as the low-load
    /// requests see it (ONNX Runtime's threads, spinning off, have gone to sleep).
    idle_batch1: Duration,
}

fn raw_onnxruntime(lib: &Path, model: &Path, intra: usize, opts: &Opts) -> Result<Raw> {
    let env = ort::init_from(lib)
        .map_err(|e| anyhow!("cannot load ONNX Runtime from {}: {e}", lib.display()))?
        .with_name("sluice-bench")
        .with_telemetry(false)
        .build()
        .map_err(|e| anyhow!("cannot create the ONNX Runtime environment: {e}"))?;
    let mut session =
        raw_session(&env, model, intra).map_err(|e| anyhow!("cannot load {}: {e}", model.display()))?;
    let mut points = Vec::new();
    for (i, &batch) in opts.raw_batches.iter().enumerate() {
        let xs = random_floats(batch * FEATURES, 1000 + i as u64);
        let warm_end = Instant::now() + opts.warmup;
        while Instant::now() < warm_end {
            raw_run(&mut session, batch, &xs)?;
        }
        let mut lat = Vec::new();
        let cpu0 = self_cpu_seconds();
        let t0 = Instant::now();
        let end = t0 + opts.measured();
        while Instant::now() < end {
            let t = Instant::now();
            raw_run(&mut session, batch, &xs)?;
            lat.push(t.elapsed());
        }
        let wall = t0.elapsed().as_secs_f64();
        let cpu = self_cpu_seconds() - cpu0;
        lat.sort();
        let p = RawPoint {
            batch,
            runs: lat.len() as u64,
            wall,
            cpu,
            median: percentile(&lat, 50.0),
        };
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
        raw_run(&mut session, 1, &xs)?;
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

/// The `sluice` child process; killed (SIGTERM, then SIGKILL) when dropped,
/// including while a panic unwinds.
struct ServerProcess {
    child: Child,
    addr: SocketAddr,
    log: PathBuf,
}

/// `... sluice listening http=127.0.0.1:PORT repository=...` -> the address.
fn listening_addr(line: &str) -> Option<SocketAddr> {
    if !line.contains("sluice listening") {
        return None;
    }
    let at = line.find("http=")? + "http=".len();
    line[at..].split_whitespace().next()?.parse().ok()
}

impl ServerProcess {
    fn start(exe: &Path, workdir: &Path, repo: &Path, lib: &Path) -> Result<ServerProcess> {
        let log = workdir.join("server.log");
        // An empty configuration file: the server runs on its built-in
        // defaults. (Without `--config` it reads `config/sluice.toml` from its
        // working directory, and fails if there is none.)
        let config = workdir.join("sluice.toml");
        std::fs::write(&config, "# sluice serving bench: built-in defaults\n")?;
        let mut cmd = Command::new(exe);
        cmd.arg("serve")
            .arg("--config")
            .arg(&config)
            .arg("--model-repository")
            .arg(repo)
            .args(["--host", "127.0.0.1", "--http-port", "0", "--grpc-port", "0"])
            .arg("--onnxruntime-library")
            .arg(lib)
            .current_dir(workdir)
            .env("RUST_LOG", "info,ort=warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        // The server reads SLUICE_* as configuration and refuses unknown keys
        // (SLUICE_BENCH_SECONDS would be `bench_seconds`).
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("SLUICE_") {
                cmd.env_remove(k);
            }
        }
        let mut child = cmd
            .spawn()
            .with_context(|| format!("cannot start {}", exe.display()))?;
        let stderr = child.stderr.take().expect("stderr is piped");
        let mut server = ServerProcess {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            log: log.clone(),
        };
        let mut file =
            std::fs::File::create(&log).with_context(|| format!("cannot create {}", log.display()))?;
        let (tx, rx) = mpsc::channel();
        // Drains the child's stderr into the log file for its whole life (a
        // full pipe would block the server) and reports the listening line.
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                let _ = writeln!(file, "{line}");
                if let Some(addr) = listening_addr(&line) {
                    if let Some(tx) = tx.take() {
                        let _ = tx.send(addr);
                    }
                }
            }
        });
        server.addr = rx.recv_timeout(Duration::from_secs(120)).map_err(|_| {
            anyhow!(
                "the server did not log `sluice listening http=...`; its log:\n{}",
                server.log_tail()
            )
        })?;
        Ok(server)
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// Polls `/v2/health/ready` until 200; returns how long it took.
    async fn wait_ready(&mut self, started: Instant) -> Result<Duration> {
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!(
                    "the server exited ({status}) before it was ready; its log:\n{}",
                    self.log_tail()
                );
            }
            if let Ok((200, _)) = get(self.addr, "/v2/health/ready").await {
                return Ok(started.elapsed());
            }
            if started.elapsed() > Duration::from_secs(300) {
                bail!(
                    "the server was not ready after 300 s; its log:\n{}",
                    self.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        // Graceful first (no request is open, so it exits at once), then SIGKILL.
        // SAFETY: kill(2) on our own child's pid, which has not been reaped yet.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM);
        }
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(5) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

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

// ---------------------------------------------------------------- HTTP client

type Conn = SendRequest<Full<Bytes>>;

/// One keep-alive HTTP/1.1 connection.
async fn connect(addr: SocketAddr) -> Result<Conn> {
    let stream = tokio::net::TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(sender)
}

async fn send(conn: &mut Conn, req: hyper::Request<Full<Bytes>>) -> Result<(u16, Bytes)> {
    conn.ready().await?;
    let resp = conn.send_request(req).await?;
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await?.to_bytes();
    Ok((status, body))
}

/// A GET on a fresh connection (health, metrics).
async fn get(addr: SocketAddr, path: &str) -> Result<(u16, Bytes)> {
    let mut conn = connect(addr).await?;
    let req = hyper::Request::get(path)
        .header(HOST, addr.to_string())
        .body(Full::new(Bytes::new()))?;
    send(&mut conn, req).await
}

/// One pre-serialized inference request body.
#[derive(Clone)]
struct Encoded {
    content_type: &'static str,
    /// `Inference-Header-Content-Length` (binary tensor extension only).
    header_len: Option<usize>,
    body: Bytes,
}

/// A V2 inference request for `rows` rows of `input` (`xs` holds
/// `rows * FEATURES` floats): JSON, or with `binary` the binary tensor data
/// extension (JSON header, then the raw little-endian FP32 bytes; outputs
/// are asked for as JSON).
fn encode_request(xs: &[f32], rows: usize, binary: bool) -> Encoded {
    debug_assert_eq!(xs.len(), rows * FEATURES);
    if binary {
        let header = serde_json::json!({"inputs": [{
            "name": "input", "shape": [rows, FEATURES], "datatype": "FP32",
            "parameters": {"binary_data_size": xs.len() * 4},
        }]});
        let mut body = serde_json::to_vec(&header).expect("JSON");
        let header_len = body.len();
        for x in xs {
            body.extend_from_slice(&x.to_le_bytes());
        }
        Encoded {
            content_type: "application/octet-stream",
            header_len: Some(header_len),
            body: body.into(),
        }
    } else {
        let v = serde_json::json!({"inputs": [{
            "name": "input", "shape": [rows, FEATURES], "datatype": "FP32", "data": xs,
        }]});
        Encoded {
            content_type: "application/json",
            header_len: None,
            body: serde_json::to_vec(&v).expect("JSON").into(),
        }
    }
}

fn infer_request(addr: SocketAddr, path: &str, e: &Encoded) -> hyper::Request<Full<Bytes>> {
    let mut b = hyper::Request::post(path)
        .header(HOST, addr.to_string())
        .header(CONTENT_TYPE, e.content_type);
    if let Some(n) = e.header_len {
        b = b.header("inference-header-content-length", n);
    }
    b.body(Full::new(e.body.clone())).expect("a valid request")
}

fn infer_path(model: &str) -> String {
    format!("/v2/models/{model}/infer")
}

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

fn body_text(body: &[u8]) -> String {
    let s = String::from_utf8_lossy(body);
    s.chars().take(300).collect()
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
            infer_request(addr, &path, &encode_request(&row, 1, true)),
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
        infer_request(addr, &path, &encode_request(&row, 1, false)),
    )
    .await?;
    if !(200..300).contains(&status) {
        bail!("JSON request answered {status}: {}", body_text(&body));
    }
    check_response(&body)?;
    Ok((false, note))
}

// ---------------------------------------------------------------- metrics

/// `(metric name, model label)` -> value, summed over the other labels.
type Metrics = HashMap<(String, String), f64>;

fn parse_metrics(text: &str) -> Metrics {
    let mut m = Metrics::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.parse::<f64>() else { continue };
        let (name, labels) = series.split_once('{').unwrap_or((series, ""));
        if !(name.ends_with("_sum") || name.ends_with("_count")) {
            continue;
        }
        let Some(model) = labels
            .split_once("model=\"")
            .and_then(|(_, rest)| rest.split_once('"'))
            .map(|(m, _)| m.to_string())
        else {
            continue;
        };
        *m.entry((name.to_string(), model)).or_default() += value;
    }
    m
}

/// The server's CPU time and metrics at one instant.
struct Snapshot {
    cpu: f64,
    metrics: Metrics,
}

/// Which end of a measured window a snapshot is taken at: the CPU time is
/// read on the window's side of the `/metrics` request, so rendering the
/// metrics is never counted in the window.
#[derive(Clone, Copy, PartialEq)]
enum Edge {
    Start,
    End,
}

async fn snapshot(addr: SocketAddr, pid: u32, edge: Edge) -> Result<Snapshot> {
    let mut cpu = if edge == Edge::End {
        process_cpu_seconds(pid)?
    } else {
        0.0
    };
    let (status, body) = get(addr, "/metrics").await?;
    if status != 200 {
        bail!("/metrics answered {status}");
    }
    if edge == Edge::Start {
        cpu = process_cpu_seconds(pid)?;
    }
    Ok(Snapshot {
        cpu,
        metrics: parse_metrics(&String::from_utf8_lossy(&body)),
    })
}

impl Snapshot {
    /// Mean of histogram `name` for `model` between `self` and `later` (None without observations).
    fn mean_since(&self, later: &Snapshot, name: &str, model: &str) -> Option<f64> {
        let v = |s: &Snapshot, suffix: &str| {
            s.metrics
                .get(&(format!("{name}_{suffix}"), model.to_string()))
                .copied()
                .unwrap_or(0.0)
        };
        let count = v(later, "count") - v(self, "count");
        (count > 0.0).then(|| (v(later, "sum") - v(self, "sum")) / count)
    }
}

// ---------------------------------------------------------------- 3. closed-loop load

struct LoadPoint {
    model: &'static str,
    concurrency: usize,
    items: u64,
    errors: u64,
    wall: f64,
    p50: Duration,
    p99: Duration,
    server_cpu: f64,
    /// CPU seconds of this process (the load client) in the window.
    client_cpu: f64,
    mean_batch: Option<f64>,
    /// Mean seconds from a request's arrival to its batch's dispatch.
    queue_delay: Option<f64>,
}

impl LoadPoint {
    fn items_per_s(&self) -> f64 {
        self.items as f64 / self.wall
    }
    fn cpu_per_1000(&self) -> Option<f64> {
        (self.items > 0).then(|| self.server_cpu / self.items as f64 * 1000.0)
    }
}

/// One client: requests back to back on its connection until `until`
/// (reconnecting if the server closes it). Returns the latency of each
/// successful request and the number of failed ones.
async fn client(
    addr: SocketAddr,
    path: Arc<str>,
    mut conn: Conn,
    bodies: Arc<Vec<Encoded>>,
    first: usize,
    until: Instant,
) -> Result<(Conn, Vec<Duration>, u64)> {
    let mut lat = Vec::new();
    let mut errors = 0;
    let mut i = first;
    while Instant::now() < until {
        let req = infer_request(addr, &path, &bodies[i % bodies.len()]);
        i += 1;
        let t = Instant::now();
        match send(&mut conn, req).await {
            Ok((200..=299, _)) => lat.push(t.elapsed()),
            Ok(_) => errors += 1,
            Err(_) => {
                errors += 1;
                conn = connect(addr).await?;
            }
        }
    }
    Ok((conn, lat, errors))
}

/// Every connection runs a client until `until`; waits for all of them.
async fn phase(
    addr: SocketAddr,
    path: &Arc<str>,
    conns: Vec<Conn>,
    bodies: &Arc<Vec<Encoded>>,
    until: Instant,
) -> Result<(Vec<Conn>, Vec<Duration>, u64)> {
    let mut set = tokio::task::JoinSet::new();
    let n = bodies.len();
    for (i, conn) in conns.into_iter().enumerate() {
        set.spawn(client(addr, path.clone(), conn, bodies.clone(), i * 7 % n, until));
    }
    let (mut conns, mut lat, mut errors) = (Vec::new(), Vec::new(), 0);
    while let Some(r) = set.join_next().await {
        let (c, l, e) = r??;
        conns.push(c);
        lat.extend(l);
        errors += e;
    }
    Ok((conns, lat, errors))
}

async fn closed_loop(
    server: &ServerProcess,
    model: &'static str,
    concurrency: usize,
    bodies: &Arc<Vec<Encoded>>,
    opts: &Opts,
) -> Result<LoadPoint> {
    let addr = server.addr;
    let path: Arc<str> = infer_path(model).into();
    let mut conns = Vec::with_capacity(concurrency);
    for _ in 0..concurrency {
        conns.push(connect(addr).await?);
    }
    let (conns, _, _) = phase(addr, &path, conns, bodies, Instant::now() + opts.warmup).await?;
    // Measured window: from here to the moment the last client's last
    // request returned. Items are the requests answered in it.
    let before = snapshot(addr, server.pid(), Edge::Start).await?;
    let client_cpu0 = self_cpu_seconds();
    let t0 = Instant::now();
    let (conns, mut lat, errors) = phase(addr, &path, conns, bodies, t0 + opts.measured()).await?;
    let wall = t0.elapsed().as_secs_f64();
    let client_cpu = self_cpu_seconds() - client_cpu0;
    let after = snapshot(addr, server.pid(), Edge::End).await?;
    drop(conns);
    lat.sort();
    let p = LoadPoint {
        model,
        concurrency,
        items: (lat.len() * opts.rows) as u64,
        errors,
        wall,
        p50: percentile(&lat, 50.0),
        p99: percentile(&lat, 99.0),
        server_cpu: after.cpu - before.cpu,
        client_cpu,
        mean_batch: before.mean_since(&after, "sluice_batch_size", model),
        queue_delay: before.mean_since(&after, "sluice_queue_delay_seconds", model),
    };
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
                .map(|i| encode_request(&random_floats(rows * FEATURES, 100 + i), rows, binary))
                .collect(),
        )
    };
    let bodies = encode(opts.rows);
    let single = encode(1);
    let mut load = Vec::new();
    for model in ["mlp_batch", "mlp_nobatch"] {
        for &c in &opts.concurrency {
            load.push(closed_loop(server, model, c, &bodies, opts).await?);
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

fn fmt_opt(v: Option<f64>, f: impl Fn(f64) -> String) -> String {
    v.map_or_else(|| "–".into(), f)
}

fn verdict(ok: bool) -> &'static str {
    if ok {
        "yes"
    } else {
        "no"
    }
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
        let batching = if p.model == "mlp_batch" {
            "on (32, 2 ms)"
        } else {
            "off"
        };
        let _ = writeln!(
            o,
            "| {} | {batching} | {} | {:.0} | {:.2} | {:.2} | {} | {} | {} | {:.2} | {:.2} | {:.4} ({}) | {} | {} |",
            p.model,
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
        s.load.iter().find(|p| p.model == model && p.concurrency == c)
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
    if !std::env::args().any(|a| a == "--bench") {
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
