//! ONNX Runtime's own log messages, as `tracing` events with the target
//! `ort::logging`: what `RUST_LOG=ort=…` selects (sluice keeps `ort` at
//! `warn` unless `RUST_LOG` names it, `main.rs`), with the message's log id
//! and source location as fields.
//!
//! One warning is told at `info`: ONNX Runtime's notice that it kept some
//! nodes (shape computations) on the CPU beside the CUDA provider. It gives
//! it for nearly every model on a GPU (three of three on the H200,
//! benches/README.md "On a GPU"), it says itself that this is done "to
//! improve perf", and it asks nothing of the operator.

use std::sync::atomic::{AtomicBool, Ordering};

use ort::logging::LogLevel;
use tracing::Level;

/// Whether the operator asked for ONNX Runtime's messages (`RUST_LOG`
/// names `ort`): set by `main` as logging starts, read as each session is
/// made. Without it, a session's per-run messages are off (see
/// [`run_messages`]).
static ASKED: AtomicBool = AtomicBool::new(false);

/// Records whether `RUST_LOG` names `ort` (`main`'s logging set-up).
pub fn set_asked(asked: bool) {
    ASKED.store(asked, Ordering::Relaxed);
}

/// Whether a session logs its runs' own messages. A failed run's error
/// comes back to sluice, which answers it and logs it where it is the
/// server's fault; ONNX Runtime's ERROR line for it would repeat it, once
/// per bad request a client sends. So only when the operator asked.
pub fn run_messages() -> bool {
    ASKED.load(Ordering::Relaxed)
}

/// The start of ONNX Runtime's notice that shape computations stay on the CPU.
const NODES_ON_THE_CPU: &str = "Some nodes were not assigned to the preferred execution providers";

/// The level a message of ONNX Runtime's is logged at.
pub fn level_of(level: LogLevel, message: &str) -> Level {
    match level {
        LogLevel::Verbose => Level::TRACE,
        LogLevel::Info => Level::INFO,
        LogLevel::Warning if message.starts_with(NODES_ON_THE_CPU) => Level::INFO,
        LogLevel::Warning => Level::WARN,
        LogLevel::Error | LogLevel::Fatal => Level::ERROR,
    }
}

/// ONNX Runtime's logging callback (`EnvironmentBuilder::with_logger`);
/// called from whichever thread ONNX Runtime logs on.
pub fn forward(level: LogLevel, _category: &str, id: &str, location: &str, message: &str) {
    macro_rules! event {
        ($level:expr) => {
            tracing::event!(target: "ort::logging", $level, id, location, "{message}")
        };
    }
    match level_of(level, message) {
        Level::TRACE => event!(Level::TRACE),
        Level::INFO => event!(Level::INFO),
        Level::WARN => event!(Level::WARN),
        _ => event!(Level::ERROR),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_notice_that_shape_nodes_stay_on_the_cpu_is_info_and_other_warnings_stay_warnings() {
        // ONNX Runtime 1.31's message, as the H200 runs logged it.
        let notice = "Some nodes were not assigned to the preferred execution providers which may or \
                      may not have an negative impact on performance. e.g. ORT explicitly assigns shape \
                      related ops to CPU to improve perf.";
        assert_eq!(level_of(LogLevel::Warning, notice), Level::INFO);
        let memcpy = "2 Memcpy nodes are added to the graph digits for CUDAExecutionProvider. It might \
                      have negative impact on performance (including unable to run CUDA graph).";
        assert_eq!(level_of(LogLevel::Warning, memcpy), Level::WARN);
        assert_eq!(level_of(LogLevel::Verbose, "x"), Level::TRACE);
        assert_eq!(level_of(LogLevel::Info, "x"), Level::INFO);
        assert_eq!(level_of(LogLevel::Error, notice), Level::ERROR);
        assert_eq!(level_of(LogLevel::Fatal, "x"), Level::ERROR);
    }
}
