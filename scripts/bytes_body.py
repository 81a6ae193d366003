#!/usr/bin/env python3
"""What several large BYTES bodies at once cost the server, against its byte
budget (`http.max_inflight_bytes`).

Starts BINARY on a temporary repository holding the `strings` fixture
(BYTES[N] identity) with a 384 MiB budget, posts COUNT (6) V2 JSON bodies of
63 MiB of empty strings (`""`, three bytes of text per element, each one a
element once decoded) at once, and prints the server's resident memory
before, its peak growth (VmHWM), and each answer's status and seconds.

Usage: scripts/bytes_body.py BINARY [COUNT] [BODY_MIB] [MAX_BATCH]
  (a release build; needs .ort/ from make setup). BODY_MIB: each body's size
  (63); MAX_BATCH: the model's max_batch_size (the fixture's own when unset;
  0 serves it unbatched, so the bodies reach ONNX Runtime, which holds each
  string as a std::string for the input and again for the output).
Python stdlib only.
"""
import http.client
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

binary = sys.argv[1]
count = int(sys.argv[2]) if len(sys.argv) > 2 else 6
body_mib = int(sys.argv[3]) if len(sys.argv) > 3 else 63
max_batch = sys.argv[4] if len(sys.argv) > 4 else None
root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
repo = tempfile.mkdtemp()
shutil.copytree(f"{root}/tests/fixtures/models/strings", f"{repo}/strings")
if max_batch is not None:
    open(f"{repo}/strings/model-settings.json", "w").write(json.dumps({"max_batch_size": int(max_batch)}))
env = dict(os.environ, ORT_DYLIB_PATH=f"{root}/.ort/cpu/libonnxruntime.so.1.31.1", SLUICE_HTTP__MAX_INFLIGHT_BYTES=str(384 << 20))
p = subprocess.Popen([binary, "serve", "--model-repository", repo, "--http-port", "18400", "--grpc-port", "18401"], env=env, cwd=tempfile.gettempdir(), stderr=subprocess.DEVNULL)
def kb(key):
    for l in open(f"/proc/{p.pid}/status"):
        if l.startswith(key): return int(l.split()[1])
for _ in range(100):
    try:
        c = http.client.HTTPConnection("127.0.0.1", 18400, timeout=2); c.request("GET", "/v2/health/ready")
        if c.getresponse().status == 200: break
    except OSError: pass
    time.sleep(0.1)
n = (body_mib << 20) // 3
body = (b'{"inputs": [{"name": "x", "datatype": "BYTES", "shape": [' + str(n).encode() + b'], "data": [' + b",".join([b'""'] * n) + b"]}]}")
rss0 = kb("VmRSS:")
results = []
def post():
    t0 = time.monotonic()
    c = http.client.HTTPConnection("127.0.0.1", 18400, timeout=120)
    try:
        c.request("POST", "/v2/models/strings/infer", body=body)
        r = c.getresponse(); text = r.read()[:160]
        results.append((r.status, round(time.monotonic() - t0, 2), text))
    except OSError as e:
        # Refused (503) before its body was read: the server closed the connection under the send.
        results.append(("closed", round(time.monotonic() - t0, 2), str(e).encode()))
ts = [threading.Thread(target=post) for _ in range(count)]
for t in ts: t.start()
for t in ts: t.join()
print(json.dumps({"body_mib": round(len(body) / 2**20, 1), "rss_before_mib": rss0 // 1024, "peak_growth_mib": (kb("VmHWM:") - rss0) // 1024,
                  "answers": [(s, t) for s, t, _ in results],
                  "errors": sorted({text.decode(errors="replace") for s, _, text in results if s != 200})}, indent=1))
p.terminate(); p.wait()
