#!/usr/bin/env bash
# Fetch the CUDA 13 / cuDNN 9 user-space libraries that onnxruntime-gpu's CUDA
# provider links and dlopens, from NVIDIA's PyPI wheels pinned by version and
# sha256 in scripts/requirements-cuda.txt (the same set Dockerfile.cuda
# installs), into .cuda/ (git-ignored). About 1.8 GB on disk.
#
# Usage:
#   scripts/fetch-cuda-libs.sh        # prints the folder to put on LD_LIBRARY_PATH
#   LD_LIBRARY_PATH="$(scripts/fetch-cuda-libs.sh)" ...   (as `make serve-gpu` does)
#
# The driver's libcuda.so.1 is not among them: it comes with the NVIDIA
# driver (>= 580 for CUDA 13) on the machine.
#
# Idempotent: when .cuda/ holds what the current requirements file pins
# (a stamp records its sha256), it prints the folder and exits at once.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT="$(pwd -P)"
REQS="scripts/requirements-cuda.txt"
DEST="$ROOT/.cuda"
LIB="$DEST/lib"
PYTHON="${PYTHON:-python3}"
die() { echo "fetch-cuda-libs: error: $*" >&2; exit 1; }
log() { echo "fetch-cuda-libs: $*" >&2; }

# What the CUDA provider of onnxruntime-gpu 1.31 links (libcudart, libcublas,
# libcublasLt, libcurand) and dlopens (libcudnn, libcufft, libnvrtc), and
# what those need (libnvJitLink).
NEEDED=(libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libcurand.so.10
        libcufft.so.12 libcudnn.so.9 libnvrtc.so.13 libnvJitLink.so.13)

want="$(sha256sum "$REQS" | cut -d' ' -f1)"
complete() {
  [[ -f "$DEST/.requirements-sha256" && "$(cat "$DEST/.requirements-sha256")" == "$want" ]] || return 1
  local l
  for l in "${NEEDED[@]}"; do [[ -e "$LIB/$l" ]] || return 1; done
}
if complete; then
  echo "$LIB"
  exit 0
fi

"$PYTHON" -m pip --version >/dev/null 2>&1 || die "'$PYTHON -m pip' not found (set PYTHON=...)"
tmp="$DEST.tmp-$$"
rm -rf "$tmp"
trap 'rm -rf "$tmp"' EXIT
log "installing the pinned NVIDIA wheels ($REQS) into .cuda/ (about 2 GB) ..."
"$PYTHON" -m pip install --no-deps --require-hashes --only-binary=:all: \
    --disable-pip-version-check --no-cache-dir --no-compile --quiet --root-user-action=ignore \
    --target "$tmp/wheels" -r "$REQS" >&2 \
  || die "pip install -r $REQS failed (is PyPI reachable? see pip's output above)"
# One flat folder of links to the wheels' shared libraries, as Dockerfile.cuda
# copies them into /opt/nvidia/lib.
mkdir -p "$tmp/lib"
find "$tmp/wheels/nvidia" -name 'lib*.so*' -type f -print0 \
  | while IFS= read -r -d '' f; do ln -sf "${f#"$tmp"/}" "$tmp/lib/$(basename "$f")"; done
# The links are relative to .cuda/ (../wheels/...), so the folder can move.
for l in "$tmp"/lib/*; do ln -sfn "../$(readlink "$l")" "$l"; done
for l in "${NEEDED[@]}"; do
  [[ -e "$tmp/lib/$l" ]] || die "$l is not in the wheels of $REQS"
done
echo "$want" > "$tmp/.requirements-sha256"
rm -rf "$DEST"
mv "$tmp" "$DEST"
trap - EXIT
log "$(ls "$LIB" | wc -l) libraries linked into .cuda/lib/"
echo "$LIB"
