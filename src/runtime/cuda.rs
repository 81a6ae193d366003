//! The CUDA execution provider's side of the ONNX Runtime seam: the
//! provider options a model's `cuda` settings set, and how a CUDA session
//! that could not be made is told in a log line.

use crate::settings::{ArenaExtendStrategy, CudaOptions, CudnnConvAlgoSearch};

/// ONNX Runtime's error for a CUDA session that could not be made, as a
/// log line should say it: the cause without the source location, on one
/// line, and what a missing driver library means.
pub fn failure_cause(e: &str) -> String {
    // "/onnxruntime_src/…cc:2043 onnxruntime::…Get() [ONNXRuntimeError] : 1 : FAIL : Failed to load …"
    let cause = e.rsplit_once("[ONNXRuntimeError] : ").map_or(e, |(_, c)| c);
    // Then the numeric status code.
    let cause = cause
        .split_once(" : ")
        .filter(|(code, _)| code.parse::<u32>().is_ok())
        .map_or(cause, |(_, rest)| rest);
    let cause = cause.split_whitespace().collect::<Vec<_>>().join(" ");
    match cause.contains("libcuda.so.1") {
        true => format!(
            "{cause} (libcuda.so.1 is the NVIDIA driver's: no driver or GPU is visible to this process)"
        ),
        false => cause,
    }
}

/// The CUDA provider options a model's `cuda` settings set, as ONNX Runtime's
/// own keys and values (`OrtCUDAProviderOptionsV2`; the 1.31 CUDA provider
/// still reads `do_copy_in_default_stream`, which `ort` has no setter for).
pub fn provider_options(o: &CudaOptions) -> Vec<(&'static str, String)> {
    let mut opts = Vec::new();
    if let Some(limit) = o.gpu_mem_limit {
        opts.push(("gpu_mem_limit", limit.to_string()));
    }
    if let Some(s) = o.arena_extend_strategy {
        let s = match s {
            ArenaExtendStrategy::NextPowerOfTwo => "kNextPowerOfTwo",
            ArenaExtendStrategy::SameAsRequested => "kSameAsRequested",
        };
        opts.push(("arena_extend_strategy", s.to_string()));
    }
    if let Some(s) = o.cudnn_conv_algo_search {
        let s = match s {
            CudnnConvAlgoSearch::Exhaustive => "EXHAUSTIVE",
            CudnnConvAlgoSearch::Heuristic => "HEURISTIC",
            CudnnConvAlgoSearch::Default => "DEFAULT",
        };
        opts.push(("cudnn_conv_algo_search", s.to_string()));
    }
    if let Some(b) = o.do_copy_in_default_stream {
        opts.push(("do_copy_in_default_stream", u8::from(b).to_string()));
    }
    opts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cuda_failure_is_told_by_its_cause_on_one_line() {
        // ONNX Runtime 1.31's error without a driver, as logged on this machine.
        let e = "/onnxruntime_src/onnxruntime/core/session/provider_bridge_ort.cc:2043 \
                 onnxruntime::Provider& onnxruntime::ProviderLibrary::Get() [ONNXRuntimeError] : 1 : FAIL : \
                 Failed to load library /x/libonnxruntime_providers_cuda.so with error: \
                 libcuda.so.1: cannot open shared object file: No such file or directory\n";
        assert_eq!(
            failure_cause(e),
            "FAIL : Failed to load library /x/libonnxruntime_providers_cuda.so with error: libcuda.so.1: \
             cannot open shared object file: No such file or directory (libcuda.so.1 is the NVIDIA driver's: \
             no driver or GPU is visible to this process)"
        );
        // Anything else passes through, on one line.
        assert_eq!(
            failure_cause("CUDA failure 100: no CUDA-capable device\n"),
            "CUDA failure 100: no CUDA-capable device"
        );
    }

    #[test]
    fn every_cuda_setting_reaches_onnx_runtime_under_its_own_key() {
        let o = CudaOptions {
            gpu_mem_limit: Some(2 << 30),
            arena_extend_strategy: Some(ArenaExtendStrategy::SameAsRequested),
            cudnn_conv_algo_search: Some(CudnnConvAlgoSearch::Heuristic),
            do_copy_in_default_stream: Some(false),
        };
        let got = provider_options(&o);
        let want = [
            ("gpu_mem_limit", "2147483648"),
            ("arena_extend_strategy", "kSameAsRequested"),
            ("cudnn_conv_algo_search", "HEURISTIC"),
            ("do_copy_in_default_stream", "0"),
        ];
        assert_eq!(got, want.map(|(k, v)| (k, v.to_string())));
        let on = CudaOptions {
            do_copy_in_default_stream: Some(true),
            ..CudaOptions::default()
        };
        assert_eq!(
            provider_options(&on),
            [("do_copy_in_default_stream", "1".to_string())]
        );
        assert!(provider_options(&CudaOptions::default()).is_empty());
    }
}
