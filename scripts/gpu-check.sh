#!/usr/bin/env bash
# sluice on a CUDA GPU: correctness, device memory and the padding benchmark,
# in one run on a machine with an NVIDIA GPU (driver >= 580), Python 3 with
# numpy, onnx and onnxruntime (CPU is enough: it computes expected values),
# and the CUDA 13 / cuDNN 9 libraries of NVIDIA's PyPI wheels (as PyTorch's
# `nvidia-*` packages install them). No Rust toolchain is needed there.
#
# Usage:
#   scripts/gpu-check.sh pack [PART_MIB]   # here: build, strip and pack into .gpu/parts/
#   scripts/gpu-check.sh unpack            # there: .gpu/parts/* -> .gpu/run/ (checks sha256)
#   scripts/gpu-check.sh run [OUT_DIR]     # there: the checks and the benchmark
#   scripts/gpu-check.sh residency [OUT_DIR]  # there: device budgets (scripts/gpu_residency.py)
#
# GPU_PACK_LIGHT=1 packs only sluice and the ONNX Runtime libraries (enough
# for `residency`): no padding bench, no MiniLM.
#
# `pack` puts into one xz-compressed tar, split into parts of PART_MIB
# (default 51) so that each fits one transfer: the release `sluice` binary
# and the padding benchmark (stripped), the onnxruntime-gpu 1.31.1 libraries
# (scripts/fetch-onnxruntime.sh --gpu) and the MiniLM file. Parts may also
# be moved one by one to a folder named by GPU_PARTS before `unpack`.
#
# `run`:
#   1. Starts `sluice serve` on a copy of model-repository/ with every model
#      on `execution_provider = "cuda"`, except `digits` on `auto`. The log
#      must say each model's provider.
#   2. scripts/gpu_check.py: answers against CPU ONNX Runtime on each request
#      alone, batches in /metrics, and each model's device bytes against
#      nvidia-smi.
#   3. SIGTERM; sluice must exit 0. Then GPU_EXIT_CYCLES (default 3) more
#      start / answer / SIGTERM cycles, each of which must exit 0.
#   4. `cargo bench --bench padding`'s binary, once per JSON object in
#      GPU_BENCH_SETTINGS (`;`-separated, default `{}`: SLUICE_BENCH_SETTINGS),
#      with GPU_BENCH_VARIANTS as SLUICE_BENCH_VARIANTS; rounds and seconds:
#      GPU_BENCH_ROUNDS, GPU_BENCH_SECONDS (default 3 and 5). When `pack` was
#      given GPU_PACK_BASE_BENCH (another build's padding bench binary, e.g.
#      the commit before a change), each settings object runs that binary and
#      this one alternately, GPU_BENCH_PASSES times (default 2), side by side.
# Results go to OUT_DIR (default $OUT, else .gpu/out): gpu-check.md,
# sluice.log, bench.md and bench.log (every bench run appended, each headed
# by its binary, pass and settings); the rest to stdout.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT="$(pwd -P)"
STAGE="$ROOT/.gpu"
RUN="$STAGE/run"
log() { echo "gpu-check: $*" >&2; }
die() { echo "gpu-check: error: $*" >&2; exit 1; }

pack() {
  local part_mib="${1:-51}" ort
  ort="$(dirname "$(scripts/fetch-onnxruntime.sh --gpu)")"
  cargo build --release --locked --bin sluice
  rm -rf "$STAGE/pack" "$STAGE/parts" && mkdir -p "$STAGE/pack/ort" "$STAGE/parts"
  cp -L "$ort"/libonnxruntime.so.1.31.1 "$ort"/libonnxruntime_providers_{shared,cuda}.so "$STAGE/pack/ort/"
  strip -o "$STAGE/pack/sluice" target/release/sluice
  if [[ -n "${GPU_PACK_LIGHT:-}" ]]; then
    (cd "$STAGE/pack" && sha256sum ort/* sluice > SHA256SUMS)
    compress "$part_mib"
    return
  fi
  scripts/fetch-minilm.sh >/dev/null
  local bench
  bench="$(cargo bench --locked --bench padding --no-run --message-format=json 2>/dev/null \
    | python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "padding" and m.get("executable"):
        print(m["executable"])')"
  [[ -x "$bench" ]] || die "no padding bench binary (cargo bench --bench padding --no-run)"
  strip -o "$STAGE/pack/padding-bench" "$bench"
  local base=()
  if [[ -n "${GPU_PACK_BASE_BENCH:-}" ]]; then
    strip -o "$STAGE/pack/padding-bench-base" "$GPU_PACK_BASE_BENCH"
    base=(padding-bench-base)
  fi
  cp model-repository/minilm/model.onnx "$STAGE/pack/minilm.onnx"
  (cd "$STAGE/pack" && sha256sum ort/* sluice padding-bench "${base[@]}" minilm.onnx > SHA256SUMS)
  compress "$part_mib"
}

compress() { # part_mib
  log "compressing (xz -9, a few minutes) ..."
  tar -C "$STAGE/pack" -cf - . | xz -9 -T0 | split -b "${1}M" -d - "$STAGE/parts/part-"
  (cd "$STAGE/parts" && sha256sum part-* > ../parts.sha256 && mv ../parts.sha256 .)
  ls -l "$STAGE/parts" >&2
}

# What `run` and `residency` start from: OUT_DIR made, the unpacked files
# there, ONNX Runtime's and CUDA's libraries found, the GPU shown.
prepare() { # out_dir
  mkdir -p "$1"
  [[ -x "$RUN/sluice" ]] || die "$RUN/sluice missing: run 'scripts/gpu-check.sh unpack' first"
  export LD_LIBRARY_PATH="$RUN/ort:$(cuda_library_path):${LD_LIBRARY_PATH:-}"
  export ORT_DYLIB_PATH="$RUN/ort/libonnxruntime.so.1.31.1"
  nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv
}

# Device budgets on the GPU: scripts/gpu_residency.py.
residency() {
  local out="${1:-${OUT:-$STAGE/out}}"
  prepare "$out"
  python3 scripts/gpu_residency.py "$RUN/sluice" "$ORT_DYLIB_PATH" "$out" \
    --models "${GPU_RESIDENCY_MODELS:-40}" --seconds "${GPU_RESIDENCY_SECONDS:-40}"
}

unpack() {
  local parts="${GPU_PARTS:-$STAGE/parts}"
  (cd "$parts" && sha256sum -c --quiet parts.sha256) || die "a part is damaged or missing in $parts"
  rm -rf "$RUN" && mkdir -p "$RUN"
  cat "$parts"/part-* | python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.stdin.buffer), sys.stdout.buffer, 1 << 20)' \
    | tar -C "$RUN" -xf -
  (cd "$RUN" && sha256sum -c --quiet SHA256SUMS) || die "unpacked files do not match their sums"
  ln -sf libonnxruntime.so.1.31.1 "$RUN/ort/libonnxruntime.so"
  ln -sf libonnxruntime.so.1.31.1 "$RUN/ort/libonnxruntime.so.1"
  log "unpacked into $RUN"
}

# CUDA/cuDNN libraries from the Python environment's NVIDIA wheels.
cuda_library_path() {
  local site
  site="$(python3 -c 'import site; print(site.getsitepackages()[0])')"
  find "$site/nvidia" -name 'lib*.so*' -printf '%h\n' 2>/dev/null | sort -u | paste -sd:
}

settings() { # folder provider
  python3 - "$1/model-settings.json" "$2" <<'PY'
import json, sys
path, provider = sys.argv[1:]
s = json.load(open(path))
s["execution_provider"] = provider
json.dump(s, open(path, "w"), indent=1)
PY
}

run() {
  local out="${1:-${OUT:-$STAGE/out}}"
  prepare "$out"

  local repo=/tmp/sluice-gpu-repo
  rm -rf "$repo" && cp -r model-repository "$repo"
  cp "$RUN/minilm.onnx" "$repo/minilm/model.onnx"
  for m in mlp minilm; do settings "$repo/$m" cuda; done
  settings "$repo/digits" auto

  local port=18080 status=0
  RUST_LOG=info "$RUN/sluice" serve --model-repository "$repo" --http-port $port --grpc-port 18081 \
    --host 127.0.0.1 --onnxruntime-library "$ORT_DYLIB_PATH" > "$out/sluice.log" 2>&1 &
  local pid=$!
  python3 scripts/gpu_check.py "http://127.0.0.1:$port" "$repo" "$pid" "$out/gpu-check.md" || status=1
  echo "--- provider lines from the log:"
  { grep -E "provider=" "$out/sluice.log" || true; } | cut -c1-400
  kill -TERM "$pid"
  local rc=0; wait "$pid" || rc=$?
  echo "sluice exited with $rc after SIGTERM"; [[ $rc == 0 ]] || status=1
  echo "warn/error lines in the log: $(grep -ciE ' (warn|error) ' "$out/sluice.log" || true)"
  { grep -iE " (warn|error) " "$out/sluice.log" || true; } | head -20

  # Clean exits: start on the GPU, answer, SIGTERM, exit 0, GPU_EXIT_CYCLES times.
  local cycle
  for ((cycle = 1; cycle <= ${GPU_EXIT_CYCLES:-3}; cycle++)); do
    "$RUN/sluice" serve --model-repository "$repo" --http-port $port --grpc-port 18081 \
      --host 127.0.0.1 --onnxruntime-library "$ORT_DYLIB_PATH" > "$out/exit.log" 2>&1 &
    pid=$!
    for _ in $(seq 300); do
      curl -sf "http://127.0.0.1:$port/v2/health/ready" > /dev/null && break; sleep 0.1
    done
    curl -sf -XPOST "http://127.0.0.1:$port/v2/models/digits/infer" -o /dev/null \
      -d "{\"inputs\":[{\"name\":\"input\",\"shape\":[1,64],\"datatype\":\"FP32\",\"data\":[$(seq -s, 64 | sed 's/[0-9]\+/0.5/g')]}]}" \
      || { echo "exit cycle $cycle: no answer"; status=1; }
    kill -TERM "$pid"; rc=0; wait "$pid" || rc=$?
    echo "exit cycle $cycle: sluice exited with $rc after SIGTERM"; [[ $rc == 0 ]] || { status=1; tail -3 "$out/exit.log"; }
  done
  rm -f "$out/exit.log"

  local rounds="${GPU_BENCH_ROUNDS:-3}" secs="${GPU_BENCH_SECONDS:-5}" extra bin pass
  local bins=(padding-bench) passes=1
  if [[ -x "$RUN/padding-bench-base" ]]; then
    bins=(padding-bench-base padding-bench) passes="${GPU_BENCH_PASSES:-2}"
  fi
  : > "$out/bench.md"; : > "$out/bench.log"
  local IFS=';'
  for extra in ${GPU_BENCH_SETTINGS:-'{}'}; do
    for ((pass = 1; pass <= passes; pass++)); do
      for bin in "${bins[@]}"; do
        local head="--- $bin, pass $pass, MiniLM, $rounds rounds of $secs s, settings $extra, variants ${GPU_BENCH_VARIANTS:-none}"
        echo "$head" | tee -a "$out/bench.md" >> "$out/bench.log"
        SLUICE_BENCH_MODEL="$RUN/minilm.onnx" SLUICE_BENCH_ROUNDS="$rounds" SLUICE_BENCH_SECONDS="$secs" \
          SLUICE_BENCH_SETTINGS="$extra" SLUICE_BENCH_VARIANTS="${GPU_BENCH_VARIANTS:-}" \
          timeout 300 "$RUN/$bin" --bench > "$out/bench-one.md" 2> "$out/bench-one.log" || status=1
        cat "$out/bench-one.md" >> "$out/bench.md"; cat "$out/bench-one.log" >> "$out/bench.log"
        echo "$head"; grep -E "^\| " "$out/bench-one.md" || true; grep -E "raw session|round " "$out/bench-one.log" || true
      done
    done
  done
  rm -f "$out/bench-one.md" "$out/bench-one.log"
  return $status
}

case "${1:-}" in
  pack) shift; pack "$@" ;;
  unpack) unpack ;;
  run) shift; run "$@" ;;
  residency) shift; residency "$@" ;;
  *) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0" >&2; exit 2 ;;
esac
