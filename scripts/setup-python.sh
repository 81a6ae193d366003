#!/usr/bin/env bash
# Create the Python virtual environment used to generate the ONNX test models
# (scripts/make_models.py). The Rust server itself does not need Python.
#
# Usage: scripts/setup-python.sh
#   then: .venv/bin/python scripts/make_models.py
#
# - Creates .venv (python3 -m venv) in the repository root if it is missing.
# - Installs the pinned packages from scripts/requirements-models.txt.
# - Idempotent: after a successful install it writes a stamp file holding the
#   sha256 of the requirements file plus the interpreter version; when the stamp
#   matches, nothing is installed and the script returns at once.
#
# Environment: PYTHON (default python3) picks the interpreter used to create .venv.
set -euo pipefail

die() { echo "setup-python: error: $*" >&2; exit 1; }
log() { echo "setup-python: $*" >&2; }

# Work from the repository root (this script lives in <root>/scripts/).
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PYTHON="${PYTHON:-python3}"
VENV=".venv"
REQS="scripts/requirements-models.txt"
STAMP="$VENV/.sluice-requirements.stamp"

[[ -f "$REQS" ]] || die "$REQS not found"

# 1. Create the venv if needed.
if [[ ! -e "$VENV/bin/python" ]]; then
  command -v "$PYTHON" >/dev/null 2>&1 || die "'$PYTHON' not found (set PYTHON=/path/to/python3.11)"
  log "creating $VENV with $("$PYTHON" --version 2>&1)"
  "$PYTHON" -m venv "$VENV" \
    || die "'$PYTHON -m venv' failed (on Debian/Ubuntu install the python3-venv package)"
fi
"$VENV/bin/python" -c 'import sys' 2>/dev/null \
  || die "$VENV/bin/python does not run (interpreter moved or removed?); delete $VENV and run again"

# 2. Install unless the stamp says this exact requirement list is already installed.
want_stamp="$(sha256sum "$REQS" | cut -d' ' -f1) $("$VENV/bin/python" -c 'import platform; print(platform.python_version())')"
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$want_stamp" ]]; then
  log "$VENV is up to date with $REQS"
  exit 0
fi

log "installing $REQS into $VENV ..."
rm -f "$STAMP"
"$VENV/bin/python" -m pip install --disable-pip-version-check --quiet \
    --only-binary=:all: -r "$REQS" \
  || die "pip install -r $REQS failed (see pip output above)"
echo "$want_stamp" > "$STAMP"
log "done: $("$VENV/bin/python" -c 'import numpy, onnx, sklearn, skl2onnx, onnxruntime as o; print(f"numpy {numpy.__version__}, onnx {onnx.__version__}, scikit-learn {sklearn.__version__}, skl2onnx {skl2onnx.__version__}, onnxruntime {o.__version__}")')"
