#!/usr/bin/env bash
# RSS of a sluice server under steady inference load while nobody scrapes
# /metrics (the recorder's histogram buffers once grew ~75 bytes a request
# until a scrape drained them; the upkeep task frees them now).
#
#   scripts/rss-no-scrape.sh [BINARY] [MINUTES]     (defaults: target/release/sluice, 10)
#
# Serves model-repository/ on 127.0.0.1:$PORT (default 18080), sends V2 infer
# requests to `digits` from $CLIENTS (default 2) keep-alive client processes
# (Python standard library) for MINUTES, samples the server's VmRSS every
# 10 s, and prints the samples, then one summary line: RSS after the first
# minute (warm-up), at the end, the growth per minute after warm-up, requests
# and requests/s. Nothing requests /metrics. Needs ONNX Runtime as
# `sluice serve` does (.ort/ or ORT_DYLIB_PATH). $SERVE_ARGS is added to the
# command line (e.g. `--config old.toml` for a binary older than the config).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-target/release/sluice}
MINUTES=${2:-10}
PORT=${PORT:-18080}
CLIENTS=${CLIENTS:-2}
SECONDS_TOTAL=$((MINUTES * 60))

log=$(mktemp)
counts=$(mktemp)
"$BIN" serve --host 127.0.0.1 --http-port "$PORT" --grpc-port 0 \
    --model-repository model-repository ${SERVE_ARGS:-} 2>"$log" &
pid=$!
trap 'kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; rm -f "$log" "$counts"' EXIT
for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$PORT/v2/health/ready" >/dev/null && break
    sleep 0.1
done
curl -sf "http://127.0.0.1:$PORT/v2/health/ready" >/dev/null || { cat "$log"; exit 1; }

load() {
    python3 - "$PORT" "$SECONDS_TOTAL" >>"$counts" <<'EOF'
import http.client, json, sys, time
port, seconds = int(sys.argv[1]), float(sys.argv[2])
row = [0.0, 0.0, 0.6875, 1.0, 0.9375, 0.1875, 0.0, 0.0] * 8
body = json.dumps({"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": row}]})
conn = http.client.HTTPConnection("127.0.0.1", port)
n, end = 0, time.monotonic() + seconds
while time.monotonic() < end:
    conn.request("POST", "/v2/models/digits/infer", body, {"Content-Type": "application/json"})
    r = conn.getresponse()
    r.read()
    if r.status != 200:
        raise SystemExit(f"status {r.status}")
    n += 1
print(n)
EOF
}
for _ in $(seq "$CLIENTS"); do load & done

rss() { awk '/^VmRSS/ {print $2}' "/proc/$pid/status"; }
warm=""
start=$(date +%s)
while :; do
    t=$(($(date +%s) - start))
    r=$(rss)
    echo "t=${t}s rss_kib=$r"
    [ "$t" -ge 60 ] && [ -z "$warm" ] && warm=$r && warm_t=$t
    [ "$t" -ge "$SECONDS_TOTAL" ] && break
    sleep 10
done
wait $(jobs -p | grep -v "^$pid$") 2>/dev/null || true
end_rss=$(rss)
requests=$(awk '{s += $1} END {print s + 0}' "$counts")
python3 - "$warm" "$warm_t" "$end_rss" "$t" "$requests" "$SECONDS_TOTAL" <<'EOF'
import sys
warm, warm_t, end, t, requests, seconds = map(float, sys.argv[1:])
minutes = max((t - warm_t) / 60, 1e-9)
print(f"summary: rss_after_warmup_mib={warm/1024:.1f} rss_end_mib={end/1024:.1f} "
      f"growth_mib_per_min={(end - warm) / 1024 / minutes:+.2f} "
      f"growth_pct={(end - warm) / warm * 100:+.1f} requests={int(requests)} "
      f"req_per_s={requests / seconds:.0f} "
      f"bytes_per_request_after_warmup={(end - warm) * 1024 / max(requests * (t - warm_t) / seconds, 1):+.1f}")
EOF
