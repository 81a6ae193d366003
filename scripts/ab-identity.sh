#!/usr/bin/env bash
# Side-by-side server CPU per request of two or more sluice binaries (the
# request path's A/B runs, benches/README.md): each binary in turn serves
# `identity` (tests/fixtures/models/identity) and `mlp` on the built-in
# defaults, `wrk` sends one 16-float V2 JSON request per call on CONNS
# keep-alive connections, and the server's CPU comes from /proc/<pid>/stat over
# the measured window. Rounds are interleaved (the machine's noise hits every
# binary alike); compare the medians. Also prints each server's idle RSS
# (1 s after ready) and its RSS after the load.
#
# Usage: scripts/ab-identity.sh [--spread | --mlp] CONNS SECONDS ROUNDS BINARY...
#   --spread: the repository also holds 100 copies (identity_000..identity_099)
#             and the requests go round-robin over them (a batch per request).
#   --mlp:    the requests go to `mlp` instead: one row of 784 random FP32
#             values (each printed as the shortest text of its f64, keys
#             sorted, as the request-path bench's serde_json body), 15 KB.
#   e.g. git stash && cargo build --release && cp target/release/sluice /tmp/a
#        git stash pop && cargo build --release && cp target/release/sluice /tmp/b
#        scripts/ab-identity.sh 64 4 3 /tmp/a /tmp/b
# Needs: wrk (Debian's `wrk`), curl; ONNX Runtime as for `sluice serve`.
set -euo pipefail

die() { echo "ab-identity: error: $*" >&2; exit 1; }
spread=0 model=identity
if [[ "${1:-}" == --spread ]]; then
  spread=1
  shift
elif [[ "${1:-}" == --mlp ]]; then
  model=mlp
  shift
fi
[[ $# -ge 4 ]] || die "usage: $0 [--spread | --mlp] CONNS SECONDS ROUNDS BINARY..."
command -v wrk >/dev/null || die "wrk not found (apt-get install wrk)"
conns=$1 seconds=$2 rounds=$3
shift 3
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export ORT_DYLIB_PATH="${ORT_DYLIB_PATH:-$root/.ort/cpu/libonnxruntime.so.1.31.1}"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/repo"
cp -r "$root/tests/fixtures/models/identity" "$root/model-repository/mlp" "$work/repo/"
: > "$work/empty.toml"
cat > "$work/post.lua" <<'EOF'
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"inputs":[{"name":"input","shape":[1,16],"datatype":"FP32","data":[0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9,1.0,1.1,1.2,1.3,1.4,1.5,1.6]}]}'
EOF
if [[ $model == mlp ]]; then
  python3 - "$work/post.lua" <<'EOF'
import json, random, struct, sys
random.seed(11)
row = [struct.unpack("f", struct.pack("f", random.random()))[0] for _ in range(784)]
body = json.dumps({"inputs": [{"name": "input", "shape": [1, 784], "datatype": "FP32", "data": row}]},
                  sort_keys=True, separators=(",", ":"))
with open(sys.argv[1], "a") as f:
    f.write("wrk.body = '%s'\n" % body)
EOF
fi
if [[ $spread == 1 ]]; then
  for i in $(seq -w 0 99); do cp -r "$root/tests/fixtures/models/identity" "$work/repo/identity_0$i"; done
  cat >> "$work/post.lua" <<'EOF'
local i = 0
request = function()
  i = (i + 1) % 100
  return wrk.format(nil, string.format("/v2/models/identity_%03d/infer", i))
end
EOF
fi

port=18600
for _ in $(seq 1 "$rounds"); do
  for bin in "$@"; do
    port=$((port + 2))
    RUST_LOG=warn "$bin" serve --config "$work/empty.toml" --model-repository "$work/repo" \
      --host 127.0.0.1 --http-port "$port" --grpc-port "$((port + 1))" > "$work/server.log" 2>&1 &
    pid=$!
    for _ in $(seq 1 600); do
      [[ "$(curl -s -o /dev/null -w '%{http_code}' "localhost:$port/v2/health/ready" || true)" == 200 ]] && break
      sleep 0.1
    done
    sleep 1
    rss_idle=$(awk '/VmRSS/ {print $2}' "/proc/$pid/status")
    url="http://127.0.0.1:$port/v2/models/$model/infer"
    wrk -t1 -c"$conns" -d1s -s "$work/post.lua" "$url" > /dev/null 2>&1
    cpu0=$(awk '{print $14 + $15}' "/proc/$pid/stat")
    out=$(wrk -t1 -c"$conns" -d"${seconds}s" -s "$work/post.lua" "$url" 2>&1)
    cpu1=$(awk '{print $14 + $15}' "/proc/$pid/stat")
    rss_load=$(awk '/VmRSS/ {print $2}' "/proc/$pid/status")
    n=$(awk '/requests in/ {print $1}' <<< "$out")
    if grep -q "Non-2xx" <<< "$out"; then
      die "$bin answered errors: $(grep Non-2xx <<< "$out"); see $work/server.log"
    fi
    rps=$(awk '/Requests\/sec/ {print $2}' <<< "$out")
    ticks=$(getconf CLK_TCK)
    us=$(awk -v d="$((cpu1 - cpu0))" -v n="$n" -v t="$ticks" 'BEGIN {printf "%.1f", d * 1e6 / t / n}')
    echo "$bin conns=$conns req/s=$rps server_cpu_us_per_req=$us idle_rss_mib=$((rss_idle / 1024)) rss_after_load_mib=$((rss_load / 1024))"
    kill "$pid"
    wait "$pid" 2>/dev/null || true
  done
done
