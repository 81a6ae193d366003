//! What the end-to-end benches share (`benches/serving.rs`,
//! `benches/request_path.rs`): the `sluice` child process ([`server`]), the
//! in-tree load client ([`client`]), `/metrics` snapshots ([`metrics`]), raw
//! ONNX Runtime on the MLP ([`raw`]), and here the small measuring helpers:
//! CPU time of a process or a thread, percentiles, the machine's description
//! and `SLUICE_BENCH_*` options.
//!
//! Each bench compiles its own copy of this module and uses part of it.
#![allow(dead_code)]

pub mod client;
pub mod metrics;
pub mod raw;
pub mod server;

use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};

// ---------------------------------------------------------------- options

pub fn env_var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

pub fn env_num<T: std::str::FromStr>(name: &str, default: T) -> Result<T> {
    match env_var(name) {
        None => Ok(default),
        Some(v) => v
            .trim()
            .parse()
            .map_err(|_| anyhow!("{name}={v} is not a valid number")),
    }
}

pub fn env_list(name: &str, default: &[usize]) -> Result<Vec<usize>> {
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

pub fn env_flag(name: &str) -> bool {
    env_var(name).is_some_and(|v| !matches!(v.trim(), "0" | "false" | "no"))
}

/// `SLUICE_BENCH_SECONDS` (default 3), checked to be a positive number.
pub fn env_seconds() -> Result<f64> {
    let seconds: f64 = env_num("SLUICE_BENCH_SECONDS", 3.0)?;
    if !(seconds.is_finite() && seconds > 0.0) {
        bail!("SLUICE_BENCH_SECONDS must be > 0, got {seconds}");
    }
    Ok(seconds)
}

/// The command that reproduces this run: the `SLUICE_BENCH_*` variables set, then cargo.
pub fn command_line(bench: &str) -> String {
    let mut vars: Vec<String> = std::env::vars()
        .filter(|(k, v)| k.starts_with("SLUICE_BENCH_") && !v.is_empty())
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    vars.sort();
    vars.push(format!("cargo bench --bench {bench}"));
    vars.join(" ")
}

/// `cargo test --all-targets` (make test) runs harness = false benches too,
/// without `--bench`: they do nothing there.
pub fn run_by_cargo_bench() -> bool {
    std::env::args().any(|a| a == "--bench")
}

// ---------------------------------------------------------------- measuring helpers

/// Deterministic pseudo-random floats in [0, 1) (xorshift64*), so runs send the same data.
pub fn random_floats(n: usize, seed: u64) -> Vec<f32> {
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

fn rusage_seconds(who: libc::c_int) -> f64 {
    let mut ru = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes a complete `rusage` into the pointer on success.
    let rc = unsafe { libc::getrusage(who, ru.as_mut_ptr()) };
    assert_eq!(rc, 0, "getrusage failed");
    // SAFETY: zero-initialised, then filled by getrusage.
    let ru = unsafe { ru.assume_init() };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// User + system CPU seconds of this process, all threads (getrusage).
pub fn self_cpu_seconds() -> f64 {
    rusage_seconds(libc::RUSAGE_SELF)
}

/// User + system CPU seconds of the calling thread (getrusage RUSAGE_THREAD):
/// the load client's, which runs on one current-thread tokio runtime.
pub fn thread_cpu_seconds() -> f64 {
    rusage_seconds(libc::RUSAGE_THREAD)
}

/// User + system CPU seconds of process `pid`, all threads (`/proc/<pid>/stat`,
/// utime and stime in clock ticks).
pub fn process_cpu_seconds(pid: u32) -> Result<f64> {
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

/// Resident memory of process `pid` in bytes (`VmRSS` of `/proc/<pid>/status`).
pub fn process_rss_bytes(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("cannot read /proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kib| kib * 1024)
        .ok_or_else(|| anyhow!("no VmRSS in /proc/{pid}/status"))
}

/// Nearest-rank percentile of sorted samples.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Median of numbers (the mean of the two middle ones for an even count); NaN when empty.
pub fn median(values: &[f64]) -> f64 {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| !x.is_nan()).collect();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

pub fn cpu_model() -> String {
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

pub fn fmt_opt(v: Option<f64>, f: impl Fn(f64) -> String) -> String {
    v.map_or_else(|| "–".into(), f)
}

pub fn verdict(ok: bool) -> &'static str {
    if ok {
        "yes"
    } else {
        "no"
    }
}
