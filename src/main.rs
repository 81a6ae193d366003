//! The `sluice` binary: parses the command line, loads the configuration,
//! sets up logging and ONNX Runtime, and hands over to `sluice::Server`.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;

use sluice::config::{CliOverrides, Config};
use sluice::runtime::onnx::{find_library, OnnxRuntime, SessionDefaults};
use sluice::runtime::Runtime;
use sluice::telemetry::export::{OtelLayer, Tracing};

/// sluice: serve every ONNX model folder of a model repository over KServe V1
/// and the Open Inference Protocol (V2), each model behind its own batcher.
///
/// Configuration layers, lowest first: built-in defaults, config/sluice.toml
/// (or --config), SLUICE_* environment variables (SLUICE_HTTP__PORT=9000),
/// then these flags. Logging: RUST_LOG (default "info"; ONNX Runtime's own
/// messages, target `ort`, stay at warn unless RUST_LOG names `ort`).
#[derive(Parser, Debug)]
#[command(name = "sluice", version, about, long_about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Serve the model repository over HTTP and gRPC.
    Serve {
        /// Configuration file [default: config/sluice.toml if present].
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
        /// Folder holding one sub-folder per model [config: model_repository.path].
        #[arg(long, value_name = "DIR")]
        model_repository: Option<PathBuf>,
        /// Serve the repository folder itself as this one model: the folder holds
        /// model.onnx (or exactly one *.onnx) and optionally model-settings.json, as
        /// KServe's storage initializer writes /mnt/models [config: model_repository.model_name].
        #[arg(long, value_name = "NAME")]
        model_name: Option<String>,
        /// Log lines as readable text or one JSON object per line [config: log.format].
        #[arg(long, value_name = "FORMAT")]
        log_format: Option<sluice::config::LogFormat>,
        /// Address to listen on [config: http.host; default 0.0.0.0].
        #[arg(long, value_name = "ADDR")]
        host: Option<IpAddr>,
        /// HTTP port; 0 picks a free one and logs it [config: http.port; default 8080].
        #[arg(long, value_name = "N")]
        http_port: Option<u16>,
        /// gRPC port; 0 picks a free one and logs it [config: grpc.port; default 8081].
        #[arg(long, value_name = "N")]
        grpc_port: Option<u16>,
        /// Path to libonnxruntime.so.1.31.x [config: runtime.onnxruntime_library;
        /// else ORT_DYLIB_PATH, else .ort/ from scripts/fetch-onnxruntime.sh].
        #[arg(long, value_name = "PATH")]
        onnxruntime_library: Option<PathBuf>,
    },
    /// Validate one model folder (settings and ONNX file) and print its signature, without serving.
    Check {
        /// The model folder (model-settings.json and/or one *.onnx file).
        dir: PathBuf,
        /// Configuration file, for the server-wide model defaults.
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
        /// Path to libonnxruntime.so.1.31.x (as for `serve`).
        #[arg(long, value_name = "PATH")]
        onnxruntime_library: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve {
            config,
            model_repository,
            model_name,
            log_format,
            host,
            http_port,
            grpc_port,
            onnxruntime_library,
        } => {
            let cli = CliOverrides {
                model_repository,
                model_name,
                log_format,
                host,
                http_port,
                grpc_port,
                onnxruntime_library,
            };
            serve(config.as_deref(), &cli)
        }
        Command::Check {
            dir,
            config,
            onnxruntime_library,
        } => {
            let cli = CliOverrides {
                onnxruntime_library,
                ..Default::default()
            };
            check(&dir, config.as_deref(), &cli)
        }
    }
}

/// The log filter: `RUST_LOG` (default `info`), with the libraries whose
/// INFO lines are noise for an operator (ONNX Runtime's `ort`, about 110
/// lines per model load, and the file watcher's `notify`) kept at `warn`
/// unless `RUST_LOG` names them.
fn log_filter(rust_log: Option<&str>) -> String {
    let mut filter = rust_log
        .filter(|s| !s.trim().is_empty())
        .unwrap_or("info")
        .to_string();
    for quiet in ["ort", "notify"] {
        if !names(&filter, quiet) {
            filter.push_str(&format!(",{quiet}=warn"));
        }
    }
    filter
}

/// Whether a `RUST_LOG` filter has a directive for `target` itself.
fn names(filter: &str, target: &str) -> bool {
    filter
        .split(',')
        .any(|d| d.trim().split(['=', ':', '[']).next() == Some(target))
}

/// Starts logging to stderr in `format`; each line shows its target
/// (`ort::logging` for ONNX Runtime's own messages). `otel`, when tracing is
/// on, turns sluice's spans into OpenTelemetry spans; `RUST_LOG` filters
/// only the log lines, never those spans, and the log lines look the same
/// either way.
fn init_logging(format: sluice::config::LogFormat, otel: Option<OtelLayer>) {
    use tracing_subscriber::filter::{filter_fn, FilterExt};
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;

    let rust_log = std::env::var("RUST_LOG").ok();
    sluice::runtime::ort_log::set_asked(rust_log.as_deref().is_some_and(|f| names(f, "ort")));
    let filter = log_filter(rust_log.as_deref());
    let filter = EnvFilter::try_new(&filter).unwrap_or_else(|e| {
        eprintln!("warning: RUST_LOG={filter:?} is not a valid filter ({e}); using \"info\"");
        EnvFilter::new(log_filter(None))
    });
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let fmt = match format {
        sluice::config::LogFormat::Json => fmt
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(false)
            .boxed(),
        sluice::config::LogFormat::Text => fmt
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .boxed(),
    };
    tracing_subscriber::registry()
        .with(otel)
        .with(fmt.with_filter(filter.and(filter_fn(sluice::telemetry::export::logged))))
        .init();
}

/// Prints one line to stderr and returns exit code 2.
fn fail(msg: impl std::fmt::Display) -> ExitCode {
    eprintln!("error: {msg}");
    ExitCode::from(2)
}

/// Loads and checks the configuration, then starts logging as it says
/// and, with `tracing` (`serve`), the OpenTelemetry exporter when the
/// configuration or the `OTEL_*` environment names an endpoint.
fn load_config(
    file: Option<&Path>,
    cli: &CliOverrides,
    tracing: bool,
) -> Result<(Config, Option<Tracing>), String> {
    let cfg = Config::load(file, cli)?;
    cfg.validate()
        .map_err(|errs| format!("invalid configuration: {}", errs.join("; ")))?;
    let export = match tracing {
        true => cfg.tracing.resolve(|k| std::env::var(k).ok())?,
        false => None,
    };
    let (exporter, layer) = match &export {
        Some(e) => {
            let (exporter, layer) = sluice::telemetry::export::install(e)?;
            (Some(exporter), Some(layer))
        }
        None => (None, None),
    };
    init_logging(cfg.log.format, layer);
    let ignored = sluice::config::ignored_env(std::env::vars_os().filter_map(|(k, _)| k.into_string().ok()));
    if !ignored.is_empty() {
        tracing::info!(
            variables = %ignored.join(", "),
            "SLUICE_* variables without a section (SLUICE_<SECTION>__<KEY>) are not configuration; ignored \
             (Kubernetes writes SLUICE_SERVICE_* and SLUICE_PORT* for a Service named sluice)"
        );
    }
    if let Some(e) = &export {
        for w in &e.warnings {
            tracing::warn!("{w}");
        }
        tracing::info!(endpoint = %e.traces_url, service = ?e.service_name, "OpenTelemetry traces on");
    }
    Ok((cfg, exporter))
}

fn runtime(cfg: &Config) -> Result<OnnxRuntime, String> {
    let lib = find_library(cfg.runtime.onnxruntime_library.as_deref()).map_err(|e| e.to_string())?;
    let rt = OnnxRuntime::init(&lib, SessionDefaults::from_config(cfg)).map_err(|e| e.to_string())?;
    tracing::info!(library = %lib.display(), "ONNX Runtime loaded");
    sluice::runtime::op_library::preload(&cfg.runtime.preload)?;
    sluice::runtime::op_library::check_configured(&cfg.runtime.op_libraries)?;
    Ok(rt)
}

fn serve(file: Option<&Path>, cli: &CliOverrides) -> ExitCode {
    let (cfg, exporter) = match load_config(file, cli, true) {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    // ONNX Runtime first: when it is missing, the one line of stderr is the
    // error that says how to get it.
    let rt = match runtime(&cfg) {
        Ok(r) => r,
        Err(e) => return fail(e),
    };
    tracing::info!(config = ?cfg, "effective configuration");
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all();
    if cfg.http.worker_threads > 0 {
        builder.worker_threads(cfg.http.worker_threads);
    }
    let tokio = match builder.build() {
        Ok(t) => t,
        Err(e) => return fail(format!("cannot start the async runtime: {e}")),
    };
    tracing::info!(
        cpu_concurrent_batches = cfg.cpu_concurrent_batches(),
        default_intra_op_threads = cfg.default_intra_op_threads(),
        async_worker_threads = tokio.metrics().num_workers(),
        "CPU thread budget"
    );
    let result = tokio.block_on(async move {
        let server = sluice::Server::bind(cfg, Arc::new(rt)).await?;
        server.run(sluice::shutdown::signal()).await
    });
    // The runtime has stopped: every request span has ended. Send what the
    // exporter still holds before the process exits.
    drop(tokio);
    // With the runtime gone, so are the models: their session threads drop
    // their sessions and exit. A CUDA session must be gone before the
    // process tears down its libraries.
    let running = sluice::pool::wait_for_session_threads(Duration::from_secs(10));
    if running > 0 {
        tracing::warn!(
            running,
            "session threads still running 10 s after shutdown; exiting anyway"
        );
    }
    if let Some(exporter) = exporter {
        exporter.shutdown();
    }
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(format!("{e:#}")),
    }
}

/// The model folder `dir` names: itself, or for a Triton version folder
/// (`tmlp/1/`, a positive integer inside a folder with a `config.pbtxt`),
/// the model folder that holds it, which names the model and its config.
fn model_folder_of(dir: &Path) -> std::path::PathBuf {
    let real = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    let version = real
        .file_name()
        .and_then(|n| n.to_str())
        .filter(|n| !n.starts_with('0') && n.parse::<u64>().is_ok_and(|v| v > 0));
    match (version, real.parent()) {
        (Some(v), Some(parent)) if parent.join("config.pbtxt").is_file() => {
            println!(
                "{} is version {v} of the model folder {}: checking that folder",
                dir.display(),
                parent.display()
            );
            parent.to_path_buf()
        }
        _ => dir.to_path_buf(),
    }
}

/// The settings of the model folder `dir`, as the repository scan reads them.
fn folder_settings(dir: &Path, cfg: &Config) -> Result<sluice::settings::ModelSettings, String> {
    // The folder's parent is the repository an absolute `parameters.uri` must stay inside.
    let root = dir
        .canonicalize()
        .ok()
        .and_then(|d| d.parent().map(Path::to_path_buf));
    let root = root.unwrap_or_else(|| dir.to_path_buf());
    let folder = dir
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default();
    match sluice::repository::scan::read_folder(&root, dir, &folder, &cfg.model_defaults()) {
        Ok(Some(s)) => Ok(s),
        Ok(None) => Err(format!(
            "{}: no model-settings.json, no config.pbtxt, no version folder and no *.onnx file: not a model folder",
            dir.display()
        )),
        Err(e) => Err(e.to_string()),
    }
}

fn check(dir: &Path, file: Option<&Path>, cli: &CliOverrides) -> ExitCode {
    let cfg = match load_config(file, cli, false) {
        Ok((c, _)) => c,
        Err(e) => return fail(e),
    };
    let dir = &model_folder_of(dir);
    let settings = match folder_settings(dir, &cfg) {
        Ok(s) => s,
        Err(e) => return fail(e),
    };
    let rt = match runtime(&cfg) {
        Ok(r) => r,
        Err(e) => return fail(e),
    };
    if sluice::repository::pipeline_without_file(&settings) {
        return match sluice::repository::pipeline_report(dir, &settings, None) {
            Ok(lines) => {
                println!("model {} OK (a pipeline)", settings.name);
                lines.iter().for_each(|l| println!("{l}"));
                ExitCode::SUCCESS
            }
            Err(e) => fail(format!("model `{}`: {e}", settings.name)),
        };
    }
    let path = dir.join(&settings.uri);
    sluice::runtime::release_free_memory();
    let before = sluice::runtime::resident_bytes();
    let loaded = match rt.load(&settings.name, &path, &settings) {
        Ok(l) => l,
        Err(e) => return fail(format!("model `{}`: {e}", settings.name)),
    };
    let mut settings = settings;
    // The load's own checks (declared signature, `padding`), so that a folder
    // `check` passes is one `serve` loads.
    let name = settings.name.clone();
    let checked = match sluice::repository::check_loaded(&name, &mut settings, &loaded.signature) {
        Ok(c) => c,
        Err(e) => return fail(format!("model `{name}`: {}", e.message())),
    };
    let padding = checked.padding;
    let pipeline = match sluice::repository::pipeline_report(dir, &settings, Some(&loaded.signature)) {
        Ok(lines) => lines,
        Err(e) => return fail(format!("model `{name}`: {e}")),
    };
    println!("model {} OK ({})", settings.name, path.display());
    pipeline.iter().for_each(|l| println!("{l}"));
    println!("provider: {}", loaded.provider_reason);
    for field in &settings.ignored {
        println!("not honoured: {field}");
    }
    let mut loaded = loaded;
    for line in evidence(dir, &name, &settings, &mut loaded, checked.layout) {
        println!("{line}");
    }
    sluice::runtime::release_free_memory();
    let grown = sluice::runtime::resident_bytes().saturating_sub(before);
    println!(
        "memory: {grown} bytes of host memory after load and warm-up, {} of weights \
         (what residency charges it on the CPU: the larger)",
        loaded.weights_bytes
    );
    for (kind, specs) in [
        ("input", &loaded.signature.inputs),
        ("output", &loaded.signature.outputs),
    ] {
        for t in specs.iter() {
            println!("{kind:<6} {:<24} {:<6} {}", t.name, t.dtype.as_str(), dims(t));
        }
    }
    // The settings in force on the provider chosen (an unset padding bound
    // takes that device's default).
    let gpu = loaded.sessions.iter().any(|(d, _)| d.is_cuda());
    settings.batching = settings.batching.on_device(gpu);
    if let Some(p) = &padding {
        let b = &settings.batching;
        let tokens = b
            .max_batch_tokens
            .map_or_else(|| "no bound".into(), |n| n.to_string());
        println!(
            "padding: `{}` padded across requests (max_padding_ratio {}, max_batch_tokens {tokens})",
            p.symbols().join("`, `"),
            b.max_padding()
        );
    }
    match serde_json::to_string_pretty(&settings) {
        Ok(json) => println!("settings: {json}"),
        Err(e) => return fail(format!("cannot print settings: {e}")),
    }
    ExitCode::SUCCESS
}

/// What `sluice check` says of batching and warm-up: what a load would
/// find (the file's evidence, then warm-up's probe on the first session).
fn evidence(
    dir: &Path,
    name: &str,
    settings: &sluice::settings::ModelSettings,
    loaded: &mut sluice::runtime::LoadedModel,
    file: Result<sluice::batcher::Layout, String>,
) -> Vec<String> {
    let session = loaded.sessions.first_mut().filter(|_| settings.warmup);
    let from_file = file.is_ok();
    let e = sluice::repository::warm::gather(
        name,
        dir,
        settings,
        &loaded.signature,
        session.map(|(_, s)| s.as_mut()),
        file,
    );
    let mut lines = Vec::new();
    if let Some(why) = &e.samples_skipped {
        lines.push(format!("warm-up samples: skipped: {why}"));
    } else if !e.samples.is_empty() {
        let from = match settings
            .triton_config
            .as_ref()
            .and_then(|c| c.get("model_warmup"))
        {
            Some(w) if w.as_array().is_some_and(|w| !w.is_empty()) => {
                "config.pbtxt's `model_warmup`".to_string()
            }
            _ => format!("{}/", sluice::model::warmup::SAMPLES_DIR),
        };
        lines.push(format!(
            "warm-up samples: {} request(s) from {from}",
            e.samples.len()
        ));
    }
    let enabled = settings.batching.batching_enabled();
    let layout = e.layout.as_ref().map_err(String::as_str);
    let verdict = sluice::batcher::layout::verdict(layout, enabled, &loaded.signature);
    let whole = "each request runs alone and gets its outputs whole";
    let why = match (&e.layout, from_file) {
        (Err(_), false) => format!(" (the ONNX file's dims); {whole}"),
        (Err(_), true) => format!("; {whole}"),
        (Ok(_), _) if enabled => " (a served batch may still show otherwise)".into(),
        (Ok(_), _) => String::new(),
    };
    lines.push(format!("batching: {verdict}{why}"));
    lines.push(match e.probe {
        None => "warm-up: off (`warmup` is false)".into(),
        Some(p) => match (p.rejected, p.off) {
            (Some(why), _) => format!("warm-up: rejected by the model, which serves cold: {why}"),
            (None, Some(off)) if off.contains("for a batch of 1 row") => {
                "warm-up: a batch of 1 row ran".into()
            }
            (None, _) if !from_file => "warm-up: a request-sized batch ran".into(),
            (None, _) => "warm-up: a batch of 1 row and one of 2 ran".into(),
        },
    });
    lines
}

/// A tensor's dims as `sluice check` prints them: `[batch, sequence, 384]`,
/// each dynamic dim by the ONNX file's name for it (`padding` goes by these
/// names), or `-1` where it names none.
fn dims(t: &sluice::tensor::TensorSpec) -> String {
    let each: Vec<String> = (0..t.shape.len())
        .map(|i| match (t.shape[i], t.dim_name(i)) {
            (-1, Some(name)) => name.to_string(),
            (d, _) => d.to_string(),
        })
        .collect();
    format!("[{}]", each.join(", "))
}

#[cfg(test)]
mod tests {

    use super::log_filter;

    #[test]
    fn ort_and_notify_stay_at_warn_unless_rust_log_names_them() {
        assert_eq!(log_filter(None), "info,ort=warn,notify=warn");
        assert_eq!(log_filter(Some("debug")), "debug,ort=warn,notify=warn");
        assert_eq!(log_filter(Some("info,ort=info")), "info,ort=info,notify=warn");
        assert_eq!(
            log_filter(Some("notify=debug,sluice=trace")),
            "notify=debug,sluice=trace,ort=warn"
        );
        // `ort_x` or `sort` are other crates.
        assert_eq!(log_filter(Some("sort=info")), "sort=info,ort=warn,notify=warn");
    }

    #[test]
    fn a_filter_names_ort_only_with_a_directive_for_ort_itself() {
        use super::names;
        // What turns ONNX Runtime's per-run messages on (`ort_log::set_asked`).
        assert!(names("info,ort=info", "ort"));
        assert!(names("ort", "ort"));
        assert!(names("debug, ort[span]=trace", "ort"));
        assert!(!names("info", "ort"));
        assert!(!names("sort=info,ort_x=debug", "ort"));
    }
}
