#!/usr/bin/env bash
# Fetch the ONNX Runtime shared library that sluice loads at run time
# (the ort crate is built with `load-dynamic`, so nothing is linked at build time).
#
# Usage:
#   scripts/fetch-onnxruntime.sh               # CPU build  -> .ort/cpu/
#   scripts/fetch-onnxruntime.sh --gpu         # CUDA build -> .ort/gpu/ (255 MB wheel)
#   scripts/fetch-onnxruntime.sh --print-path  # only print where the lib is / would be
#
# What it does:
#   1. Downloads the pinned PyPI wheel (onnxruntime or onnxruntime-gpu 1.31.1) into
#      .cache/wheels/ with `pip download` (no install, no deps). The wheel is the
#      official Microsoft build; we only need the C API library from it.
#   2. Verifies the wheel's sha256 against the hash pinned below.
#   3. Extracts the shared libraries from onnxruntime/capi/ into .ort/<variant>/ and
#      adds the `libonnxruntime.so` / `libonnxruntime.so.1` symlinks the wheel lacks.
#
# stdout gets exactly one line: the absolute path of libonnxruntime.so.1.31.1, so
#   export ORT_DYLIB_PATH="$(scripts/fetch-onnxruntime.sh)"
# works. Progress messages go to stderr.
#
# Idempotent: when .ort/<variant>/ already holds the libraries extracted from the
# pinned wheel (recorded in a stamp file), it prints the path and exits at once
# without touching the network.
set -euo pipefail

# ---- pinned versions / hashes ------------------------------------------------
ORT_VERSION="1.31.1"

# CPU wheel (onnxruntime==1.31.1, cp311 manylinux_2_28_x86_64), 23,753,652 bytes.
CPU_PKG="onnxruntime"
CPU_WHEEL="onnxruntime-1.31.1-cp311-cp311-manylinux_2_28_x86_64.whl"
CPU_SHA256="5752bd508126ae7c49894d3b9d2e83f0c3d487319246d04c444b393308d7ad7f"
CPU_LIBS=(
  "libonnxruntime.so.${ORT_VERSION}"
  "libonnxruntime_providers_shared.so"
)

# GPU wheel (onnxruntime-gpu==1.31.1, CUDA 13 / cuDNN 9), 255,560,985 bytes.
GPU_PKG="onnxruntime-gpu"
GPU_WHEEL="onnxruntime_gpu-1.31.1-cp311-cp311-manylinux_2_28_x86_64.whl"
GPU_SHA256="e26c475fe361b2015f45b4b824bd13f0bb20204e59b62814e6f0acd5f3d491a6"
GPU_LIBS=(
  "libonnxruntime.so.${ORT_VERSION}"
  "libonnxruntime_providers_shared.so"
  "libonnxruntime_providers_cuda.so"
  "libonnxruntime_providers_tensorrt.so"
)

# The wheel's .so files do not depend on the Python version; cp311 is simply the
# one we pin (pip download fetches it for any host interpreter).
PY_VERSION="3.11"
PLATFORM="manylinux_2_28_x86_64"
PYTHON="${PYTHON:-python3}"

# ---- helpers -----------------------------------------------------------------
die() { echo "fetch-onnxruntime: error: $*" >&2; exit 1; }
log() { echo "fetch-onnxruntime: $*" >&2; }

usage() {
  sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0" >&2
}

# ---- arguments ---------------------------------------------------------------
variant="cpu"
print_only=0
for arg in "$@"; do
  case "$arg" in
    --gpu) variant="gpu" ;;
    --cpu) variant="cpu" ;;
    --print-path) print_only=1 ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument '$arg' (try --help)" ;;
  esac
done

# Work from the repository root (this script lives in <root>/scripts/).
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT="$(pwd -P)"

if [[ "$variant" == "gpu" ]]; then
  pkg="$GPU_PKG"; wheel="$GPU_WHEEL"; want_sha="$GPU_SHA256"; libs=("${GPU_LIBS[@]}")
else
  pkg="$CPU_PKG"; wheel="$CPU_WHEEL"; want_sha="$CPU_SHA256"; libs=("${CPU_LIBS[@]}")
fi

wheel_dir="$ROOT/.cache/wheels"
dest="$ROOT/.ort/$variant"
lib_path="$dest/libonnxruntime.so.${ORT_VERSION}"
stamp="$dest/.wheel-sha256"

if (( print_only )); then
  echo "$lib_path"
  exit 0
fi

# ---- fast path: already extracted from the pinned wheel ----------------------
already_done() {
  [[ -f "$stamp" && "$(cat "$stamp")" == "$want_sha" ]] || return 1
  local f
  for f in "${libs[@]}"; do [[ -f "$dest/$f" ]] || return 1; done
  [[ -L "$dest/libonnxruntime.so" && -e "$dest/libonnxruntime.so" ]] || return 1
}
if already_done; then
  echo "$lib_path"
  exit 0
fi

command -v "$PYTHON" >/dev/null 2>&1 || die "'$PYTHON' not found (needed for pip download and unzipping; set PYTHON=...)"
command -v sha256sum >/dev/null 2>&1 || die "sha256sum not found (coreutils)"

# ---- 1. download (skipped when the wheel is already cached) ------------------
mkdir -p "$wheel_dir"
if [[ ! -f "$wheel_dir/$wheel" ]]; then
  log "downloading $pkg==$ORT_VERSION into .cache/wheels/ ..."
  "$PYTHON" -m pip download "$pkg==$ORT_VERSION" \
      --no-deps --only-binary=:all: \
      --platform "$PLATFORM" --python-version "$PY_VERSION" --implementation cp \
      --disable-pip-version-check --quiet \
      -d "$wheel_dir" >&2 \
    || die "pip download of $pkg==$ORT_VERSION failed (is PyPI reachable? see pip output above)"
  [[ -f "$wheel_dir/$wheel" ]] \
    || die "pip download succeeded but $wheel is not in .cache/wheels/ (PyPI file name changed?)"
fi

# ---- 2. verify ---------------------------------------------------------------
got_sha="$(sha256sum "$wheel_dir/$wheel" | cut -d' ' -f1)"
if [[ "$got_sha" != "$want_sha" ]]; then
  die "sha256 mismatch for .cache/wheels/$wheel: expected $want_sha, got $got_sha (delete the file to re-download; if it persists, the upload changed)"
fi
log "verified $wheel (sha256 $got_sha)"

# ---- 3. extract --------------------------------------------------------------
# Extract into a temporary folder beside the destination and swap it in, so an
# interrupted run never leaves a half-written .ort/<variant>/.
tmp="$ROOT/.ort/.tmp-$variant-$$"
rm -rf "$tmp"
mkdir -p "$tmp"
trap 'rm -rf "$tmp"' EXIT

# Python's zipfile, because `unzip` is not installed everywhere.
"$PYTHON" - "$wheel_dir/$wheel" "$tmp" "${libs[@]}" <<'PY' || die "failed to extract libraries from the wheel"
import os, shutil, sys, zipfile
wheel, out, names = sys.argv[1], sys.argv[2], sys.argv[3:]
with zipfile.ZipFile(wheel) as z:
    for name in names:
        member = f"onnxruntime/capi/{name}"
        try:
            info = z.getinfo(member)
        except KeyError:
            sys.exit(f"fetch-onnxruntime: error: {member} is not in {os.path.basename(wheel)}")
        target = os.path.join(out, name)
        with z.open(info) as src, open(target, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        os.chmod(target, 0o755)
PY

# The wheel ships only the versioned file; dlopen("libonnxruntime.so") (ort's
# default when ORT_DYLIB_PATH is unset) needs the plain name, and the SONAME is
# libonnxruntime.so.1. Relative links, so the folder can be moved.
ln -s "libonnxruntime.so.${ORT_VERSION}" "$tmp/libonnxruntime.so"
ln -s "libonnxruntime.so.${ORT_VERSION}" "$tmp/libonnxruntime.so.1"
echo "$want_sha" > "$tmp/.wheel-sha256"

rm -rf "$dest"
mv "$tmp" "$dest"
trap - EXIT

log "extracted ${#libs[@]} libraries into .ort/$variant/"
echo "$lib_path"
