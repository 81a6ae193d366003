//! Measures the resident memory that each extra instance (ONNX Runtime
//! session) of one model costs, with and without sharing its weights
//! (`runtime.share_weights`: one copy of the initializers plus ONNX
//! Runtime's prepacked-weights container).
//!
//! ```sh
//! MALLOC_ARENA_MAX=1 cargo run --release --example instance_memory -- model-repository/mlp/model.onnx
//! ```
//! (`MALLOC_ARENA_MAX=1`: glibc's per-thread arenas otherwise make RSS move
//! by several MiB between identical runs.)
//! Each configuration runs in a fresh child process (RSS is per process):
//! the parent re-executes itself with `--one INSTANCES SHARE`.

use std::path::Path;
use std::process::Command;

use sluice::config::Config;
use sluice::runtime::onnx::{find_library, OnnxRuntime, SessionDefaults};
use sluice::runtime::Runtime;
use sluice::settings::{ModelDefaults, ModelSettings};

fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).expect("VmRSS");
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

fn one(model: &Path, instances: usize, share: bool) {
    let mut defaults = SessionDefaults::from_config(&Config::default());
    defaults.share_weights = share;
    let rt = OnnxRuntime::init(&find_library(None).expect("ONNX Runtime"), defaults).expect("init");
    let settings = ModelSettings::parse(
        &format!(r#"{{"instances": {instances}}}"#),
        "m",
        &ModelDefaults::default(),
    )
    .unwrap();
    let before = rss_kib();
    let loaded = rt.load("m", model, &settings).expect("load");
    let after = rss_kib();
    println!("{instances} {share} {before} {after}");
    drop(loaded);
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--one") {
        let model = Path::new(&args[2]);
        return one(model, args[3].parse().unwrap(), args[4] == "true");
    }
    let model = args
        .get(1)
        .cloned()
        .unwrap_or_else(|| "model-repository/mlp/model.onnx".into());
    let exe = std::env::current_exe().unwrap();
    println!("| instances | weights | RSS of the sessions (MiB) | per extra instance (MiB) |");
    println!("|---|---|---|---|");
    for share in [false, true] {
        let mut first = None;
        for instances in [1usize, 2, 4, 8] {
            let out = Command::new(&exe)
                .args(["--one", &model, &instances.to_string(), &share.to_string()])
                .output()
                .expect("child");
            let text = String::from_utf8_lossy(&out.stdout);
            let f: Vec<u64> = text
                .split_whitespace()
                .skip(2)
                .map(|x| x.parse().unwrap())
                .collect();
            let used = (f[1] - f[0]) as f64 / 1024.0;
            let base = *first.get_or_insert(used);
            let per = if instances > 1 {
                format!("{:.1}", (used - base) / (instances - 1) as f64)
            } else {
                "-".into()
            };
            let how = if share { "shared" } else { "one copy each" };
            println!("| {instances} | {how} | {used:.1} | {per} |");
        }
    }
}
