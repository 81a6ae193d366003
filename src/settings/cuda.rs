//! A model's `cuda` settings: the CUDA provider options Triton's ONNX Runtime
//! backend exposes, parsed from `model-settings.json`'s `cuda` object
//! (`runtime/cuda.rs` hands them to ONNX Runtime).

use serde::Serialize;
use serde_json::Value;

use super::walk::{get, Walker};

const ARENA: &[(&str, ArenaExtendStrategy)] = &[
    ("kNextPowerOfTwo", ArenaExtendStrategy::NextPowerOfTwo),
    ("kSameAsRequested", ArenaExtendStrategy::SameAsRequested),
];
const CUDNN: &[(&str, CudnnConvAlgoSearch)] = &[
    ("EXHAUSTIVE", CudnnConvAlgoSearch::Exhaustive),
    ("HEURISTIC", CudnnConvAlgoSearch::Heuristic),
    ("DEFAULT", CudnnConvAlgoSearch::Default),
];

/// ONNX Runtime's CUDA `arena_extend_strategy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum ArenaExtendStrategy {
    /// Grow the arena by powers of two (`kNextPowerOfTwo`, Triton's `0`).
    #[serde(rename = "kNextPowerOfTwo")]
    NextPowerOfTwo,
    /// Grow the arena by exactly what was requested (`kSameAsRequested`, Triton's `1`).
    #[serde(rename = "kSameAsRequested")]
    SameAsRequested,
}

/// ONNX Runtime's CUDA `cudnn_conv_algo_search`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum CudnnConvAlgoSearch {
    /// Benchmark every algorithm (`EXHAUSTIVE`, Triton's `0`).
    Exhaustive,
    /// Pick by cuDNN's heuristics (`HEURISTIC`, Triton's `1`).
    Heuristic,
    /// Use the default algorithm (`DEFAULT`, Triton's `2`).
    Default,
}

/// CUDA provider options (the ones Triton's ONNX Runtime backend exposes); `None` = ONNX Runtime's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct CudaOptions {
    /// Most bytes the CUDA arena may hold.
    pub gpu_mem_limit: Option<u64>,
    /// How the CUDA arena grows.
    pub arena_extend_strategy: Option<ArenaExtendStrategy>,
    /// How cuDNN picks convolution algorithms.
    pub cudnn_conv_algo_search: Option<CudnnConvAlgoSearch>,
    /// Copy inputs and outputs on the default CUDA stream (passed to ONNX
    /// Runtime as `do_copy_in_default_stream`).
    pub do_copy_in_default_stream: Option<bool>,
}

impl CudaOptions {
    /// True when no option is set.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// The fields of the `cuda` object.
const CUDA: &str = "gpu_mem_limit arena_extend_strategy cudnn_conv_algo_search do_copy_in_default_stream";

impl Walker {
    /// The `cuda` object's options (each problem recorded with its field path).
    pub(super) fn cuda_options(&mut self, v: &Value) -> CudaOptions {
        let mut cuda = CudaOptions::default();
        let Some(c) = self.object(v, "cuda.", CUDA) else {
            return cuda;
        };
        let bytes = "an integer number of bytes, at least 1";
        cuda.gpu_mem_limit =
            get(c, "gpu_mem_limit").and_then(|v| self.int_as(v, "cuda.gpu_mem_limit", 1, u64::MAX, bytes));
        cuda.arena_extend_strategy = get(c, "arena_extend_strategy")
            .and_then(|v| self.choice(v, "cuda.arena_extend_strategy", ARENA, true));
        cuda.cudnn_conv_algo_search = get(c, "cudnn_conv_algo_search")
            .and_then(|v| self.choice(v, "cuda.cudnn_conv_algo_search", CUDNN, true));
        cuda.do_copy_in_default_stream = get(c, "do_copy_in_default_stream")
            .and_then(|v| self.boolean(v, "cuda.do_copy_in_default_stream"));
        cuda
    }
}
