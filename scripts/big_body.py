#!/usr/bin/env python3
"""What one large JSON body costs the server (README, "Slow clients, connections and memory").

Starts a release `sluice` on a temporary copy of `digits`, then, while a
light client keeps sending one-row requests, posts one V2 JSON body of
about BODY_MIB MiB made of one-digit numbers (the worst case for a JSON
parser's memory: two bytes of text per element). Prints the server's
resident memory before, its peak (VmHWM) after, the growth as a multiple of
the body, and the small requests' latency (p50, p99, max) before and while
the big body is decoded and run.

Usage: scripts/big_body.py [BODY_MIB] [--binary target/release/sluice]
Python stdlib only; needs .ort/ (make setup) and a release build.
"""
import argparse
import http.client
import json
import os
import shutil
import signal
import statistics
import subprocess
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def status(pid, key):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def start(binary, repo):
    proc = subprocess.Popen(
        [binary, "serve", "--host", "127.0.0.1", "--http-port", "0", "--grpc-port", "0",
         "--model-repository", repo],
        stderr=subprocess.PIPE, text=True, cwd=ROOT)
    port = None
    for line in proc.stderr:
        if "sluice listening" in line:
            port = int(line.split("http=127.0.0.1:")[1].split()[0])
            break
    threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
    for _ in range(300):
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request("GET", "/v2/health/ready")
            if c.getresponse().status == 200:
                return proc, port
        except OSError:
            pass
        time.sleep(0.1)
    raise SystemExit("server not ready")


def small_client(port, stop, out):
    row = json.load(open(os.path.join(ROOT, "tests/fixtures/digits_expected.json")))["inputs"][0]
    body = json.dumps({"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": row}]})
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    while not stop.is_set():
        t = time.perf_counter()
        c.request("POST", "/v2/models/digits/infer", body, {"Content-Type": "application/json"})
        r = c.getresponse()
        r.read()
        out.append((time.perf_counter(), (time.perf_counter() - t) * 1000, r.status))
        time.sleep(0.005)


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("body_mib", nargs="?", type=float, default=64)
    ap.add_argument("--binary", default=os.path.join(ROOT, "target/release/sluice"))
    args = ap.parse_args()
    repo = tempfile.mkdtemp()
    shutil.copytree(os.path.join(ROOT, "model-repository/digits"), os.path.join(repo, "digits"))
    proc, port = start(args.binary, repo)
    try:
        rows = int(args.body_mib * (1 << 20) / (64 * 2))
        body = ('{"inputs":[{"name":"input","shape":[%d,64],"datatype":"FP32","data":[' % rows
                + ",".join(["0"] * (rows * 64)) + "]}]}").encode()
        before = status(proc.pid, "VmRSS")
        stop, lat = threading.Event(), []
        t = threading.Thread(target=small_client, args=(port, stop, lat))
        t.start()
        time.sleep(3)
        t_big = time.perf_counter()
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        c.request("POST", "/v2/models/digits/infer", body, {"Content-Type": "application/json"})
        r = c.getresponse()
        answer = r.read()
        t_done = time.perf_counter()
        time.sleep(1)
        stop.set()
        t.join()
        peak = status(proc.pid, "VmHWM")
        quiet = [ms for (at, ms, _) in lat if at < t_big]
        busy = [ms for (at, ms, _) in lat if t_big <= at <= t_done + 0.1]
        bad = sum(1 for (_, _, s) in lat if s != 200)
        mib = len(body) / (1 << 20)
        print(f"body: {mib:.1f} MiB of JSON ({rows} rows x 64 one-digit numbers): HTTP {r.status}, "
              f"{len(answer) / (1 << 20):.1f} MiB answer in {t_done - t_big:.1f} s")
        print(f"server RSS before {before / (1 << 20):.1f} MiB, peak {peak / (1 << 20):.1f} MiB: "
              f"growth {(peak - before) / (1 << 20):.1f} MiB = {(peak - before) / len(body):.1f}x the body")
        print(f"one-row requests, before: n={len(quiet)} p50 {pct(quiet, .5):.2f} ms p99 {pct(quiet, .99):.2f} ms; "
              f"while the big body ran: n={len(busy)} p50 {pct(busy, .5):.2f} ms p99 {pct(busy, .99):.2f} ms "
              f"max {max(busy) if busy else float('nan'):.1f} ms; non-200: {bad}")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        shutil.rmtree(repo)


if __name__ == "__main__":
    main()
