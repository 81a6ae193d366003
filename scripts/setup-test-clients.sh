#!/usr/bin/env bash
# Install the standard Open Inference Protocol clients that the end-to-end
# tests drive against a real sluice (tests/standard_clients.rs):
#   - NVIDIA's `tritonclient` (HTTP and gRPC) in the virtual environment .venv-clients/
#   - the rapidocr-onnxruntime and silero-vad wheels, for their ONNX models
#   - `perf_analyzer`, the binary that ships inside the tritonclient 2.41.1 manylinux
#     wheel (bin/perf_analyzer), with what it needs at run time:
#       libb64.so.0d    from Debian's libb64-0d (apt-get, only when missing)
#       libcudart.so.12 from PyPI's nvidia-cuda-runtime-cu12 (no GPU needed)
#
# Usage: scripts/setup-test-clients.sh
#   then: .venv-clients/bin/python tests/clients/test_tritonclient.py ...
#         scripts/perf-analyzer.sh -m mlp -u 127.0.0.1:8081 -i grpc   (see that script)
#
# Pinned to tritonclient 2.41.1: later perf_analyzer builds need a newer glibc
# than Debian 12's. Idempotent: a stamp file holds the hash of the requirement
# list; when it matches (and libb64 is present) the script returns at once.
#
# Environment: PYTHON (default python3) picks the interpreter used to create the venv.
set -euo pipefail

die() { echo "setup-test-clients: error: $*" >&2; exit 1; }
log() { echo "setup-test-clients: $*" >&2; }

cd "$(dirname "${BASH_SOURCE[0]}")/.."

PYTHON="${PYTHON:-python3}"
VENV=".venv-clients"
REQS="tests/clients/requirements.txt"
STAMP="$VENV/.sluice-requirements.stamp"

[[ -f "$REQS" ]] || die "$REQS not found"

# 1. libb64 (perf_analyzer links against libb64.so.0d).
if ! ldconfig -p 2>/dev/null | grep -q 'libb64\.so\.0d'; then
  command -v apt-get >/dev/null 2>&1 \
    || die "libb64.so.0d is missing and apt-get is not available: install Debian's libb64-0d (or your system's libb64)"
  sudo=""
  if [[ "$(id -u)" != 0 ]]; then
    command -v sudo >/dev/null 2>&1 || die "libb64.so.0d is missing: run 'apt-get install libb64-0d' as root"
    sudo="sudo"
  fi
  log "installing Debian's libb64-0d (for perf_analyzer) ..."
  $sudo apt-get update -qq >&2 || die "apt-get update failed"
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends libb64-0d >&2 \
    || die "apt-get install libb64-0d failed"
fi

# 1b. The en_US.UTF-8 locale: ONNX Runtime's StringNormalizer (four models
#     of the conformance corpus, tests/models_as_they_come.rs) builds it and
#     fails without it. Generated when missing; without root the four are
#     left out of the corpus, named with ONNX Runtime's reason.
if ! locale -a 2>/dev/null | grep -qi '^en_US\.utf-\?8$'; then
  sudo=""
  [[ "$(id -u)" != 0 ]] && command -v sudo >/dev/null 2>&1 && sudo="sudo"
  if [[ "$(id -u)" == 0 || -n "$sudo" ]]; then
    log "generating the en_US.UTF-8 locale (for ONNX Runtime's StringNormalizer) ..."
    if ! command -v locale-gen >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
      DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends locales >&2 || true
    fi
    if [[ -f /etc/locale.gen ]]; then
      $sudo sed -i 's/^# *en_US.UTF-8 UTF-8/en_US.UTF-8 UTF-8/' /etc/locale.gen
      $sudo locale-gen >&2 || log "locale-gen failed: the StringNormalizer models are left out"
    fi
  else
    log "no en_US.UTF-8 locale and no root: the StringNormalizer models are left out of the conformance corpus"
  fi
fi

# 2. The virtual environment.
if [[ ! -e "$VENV/bin/python" ]]; then
  command -v "$PYTHON" >/dev/null 2>&1 || die "'$PYTHON' not found (set PYTHON=/path/to/python3)"
  log "creating $VENV with $("$PYTHON" --version 2>&1)"
  "$PYTHON" -m venv "$VENV" || die "'$PYTHON -m venv' failed (on Debian install python3-venv)"
fi
"$VENV/bin/python" -c 'import sys' 2>/dev/null \
  || die "$VENV/bin/python does not run; delete $VENV and run again"

want_stamp="$(sha256sum "$REQS" | cut -d' ' -f1) $("$VENV/bin/python" -c 'import platform; print(platform.python_version())')"
if [[ ! -f "$STAMP" || "$(cat "$STAMP")" != "$want_stamp" ]]; then
  log "installing $REQS into $VENV ..."
  rm -f "$STAMP"
  "$VENV/bin/python" -m pip install --disable-pip-version-check --quiet --only-binary=:all: -r "$REQS" \
    || die "pip install -r $REQS failed (see pip output above)"
  echo "$want_stamp" > "$STAMP"
fi

# 3. The rapidocr-onnxruntime wheel, for its three ONNX models (a text
#    detector, a recognizer, a direction classifier) in the conformance
#    corpus (tests/models_as_they_come.rs). Only downloaded, never installed:
#    its dependencies (OpenCV) are not needed to read the files.
RAPIDOCR="$VENV/wheels/rapidocr_onnxruntime-1.4.4-py3-none-any.whl"
RAPIDOCR_SHA256=971d7d5f223a7a808662229df1ef69893809d8457d834e6373d3854bc1782cbf
if [[ ! -f "$RAPIDOCR" ]] || ! echo "$RAPIDOCR_SHA256  $RAPIDOCR" | sha256sum -c --quiet - 2>/dev/null; then
  log "downloading the rapidocr-onnxruntime 1.4.4 wheel (its ONNX models) ..."
  "$VENV/bin/python" -m pip download --disable-pip-version-check --quiet --no-deps --only-binary=:all: \
    --dest "$VENV/wheels" rapidocr-onnxruntime==1.4.4 || die "pip download rapidocr-onnxruntime failed"
  echo "$RAPIDOCR_SHA256  $RAPIDOCR" | sha256sum -c --quiet - || die "$RAPIDOCR: unexpected sha256"
fi

# 3b. The silero-vad wheel, for silero_vad.onnx (a voice-activity detector
#     whose recurrent state the server keeps: tests/sequences.rs). Only
#     downloaded, never installed: its dependencies (torch) are not needed.
SILERO="$VENV/wheels/silero_vad-6.2.3-py3-none-any.whl"
SILERO_SHA256=7b7f5436cfcb02fae583a05b512ea96467fd449fe54cb49a5e4f06c51a1e43b8
if [[ ! -f "$SILERO" ]] || ! echo "$SILERO_SHA256  $SILERO" | sha256sum -c --quiet - 2>/dev/null; then
  log "downloading the silero-vad 6.2.3 wheel (its ONNX model) ..."
  "$VENV/bin/python" -m pip download --disable-pip-version-check --quiet --no-deps --only-binary=:all: \
    --dest "$VENV/wheels" silero-vad==6.2.3 || die "pip download silero-vad failed"
  echo "$SILERO_SHA256  $SILERO" | sha256sum -c --quiet - || die "$SILERO: unexpected sha256"
fi

# 4. perf_analyzer: the wheel installs it as $VENV/bin/perf_analyzer.
[[ -x "$VENV/bin/perf_analyzer" ]] || die "$VENV/bin/perf_analyzer not found: the tritonclient wheel changed?"
if ! scripts/perf-analyzer.sh --version >/dev/null 2>&1; then
  scripts/perf-analyzer.sh --version >&2 || true
  die "perf_analyzer does not start (missing library? see above)"
fi
log "ready: $("$VENV/bin/python" -c 'import numpy; from importlib.metadata import version; print("tritonclient", version("tritonclient"), "numpy", numpy.__version__)'), $(scripts/perf-analyzer.sh --version 2>&1 | tail -1)"
