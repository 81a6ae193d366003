#!/usr/bin/env bash
# Runs the perf_analyzer that scripts/setup-test-clients.sh installed into
# .venv-clients, with its shared libraries (libcudart.so.12 from the
# nvidia-cuda-runtime-cu12 wheel) on the library path. Arguments go to
# perf_analyzer unchanged, e.g.
#   scripts/perf-analyzer.sh -m mlp -u 127.0.0.1:8081 -i grpc --concurrency-range 4
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv-clients"
[[ -x "$venv/bin/perf_analyzer" ]] || { echo "perf-analyzer: run scripts/setup-test-clients.sh first" >&2; exit 2; }
cudart="$(echo "$venv"/lib/python3*/site-packages/nvidia/cuda_runtime/lib)"
export LD_LIBRARY_PATH="$cudart${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
exec "$venv/bin/perf_analyzer" "$@"
