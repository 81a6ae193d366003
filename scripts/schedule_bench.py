#!/usr/bin/env python3
"""Deadlines and priorities under overload, measured: the `slow` model
offered 1.2 times its saturation rate, open loop, two priority classes,
against two builds of sluice side by side.

    .venv-clients/bin/python scripts/schedule_bench.py BEFORE AFTER
        [--seconds 60] [--load 1.2] [--timeout 1.0] [--high 0.2] [--minutes]

BEFORE, AFTER: release builds (BEFORE: one without the scheduler's cost
model, e.g. a build of 37cde55; "-" skips a run). Each serves
tests/fixtures/models/slow made 8 times slower (--matmuls; its run costs
the same whatever its rows), with
`max_batch_size` 8 and `timeout` --timeout; AFTER also gets
`priority_levels` 2 (requests without `priority` are level 2). The
saturation rate is measured once, on the first run's server (16 clients back to back for
10 s); both runs are then offered the same Poisson arrivals at --load times
it for --seconds, a fraction --high of them asking `priority` 1 (BEFORE
ignores the parameter). Latency counts from the scheduled send time.

Prints per run: requests offered, goodput (answers within the timeout per
second), p50/p99 of the high and the low class's answers (ms), 503s, 504s;
with --minutes, goodput and median latency per minute (the no-drift run:
--seconds 600).
"""
import argparse
import http.client
import json
import os
import queue
import random
import tempfile
import threading
import time

from sluice_server import serve

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HTTP, GRPC = 18700, 18701
BODY = json.dumps({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]})


def slower(src, dst, matmuls):
    """The slow fixture with `matmuls` products in its chain of work instead
    of 16 (its run still costs the same whatever its rows)."""
    import onnx
    from onnx import helper

    m = onnx.load(src)
    nodes = list(m.graph.node)
    work = [n for n in nodes if n.name.startswith("work")]
    last = work[-1].output[0]
    at = nodes.index(work[-1]) + 1
    extra = []
    for i in range(matmuls - len(work)):
        out = f"more{i}"
        extra.append(helper.make_node("MatMul", [last, "W"], [out], name=f"more_work{i}"))
        last = out
    for n in nodes[at:]:
        if n.name == "mean_work":
            n.input[0] = last
    del m.graph.node[:]
    m.graph.node.extend(nodes[:at] + extra + nodes[at:])
    onnx.save(m, dst)


def repo(timeout, levels, matmuls):
    out = tempfile.mkdtemp()
    folder = os.path.join(out, "slow")
    os.makedirs(folder)
    slower(os.path.join(ROOT, "tests", "fixtures", "models", "slow", "model.onnx"),
           os.path.join(folder, "model.onnx"), matmuls)
    # One core computes, the other serves HTTP and runs this client: with
    # both computing, the client's sends themselves are late.
    settings = {"max_batch_size": 8, "timeout": timeout, "intra_op_threads": 1}
    if levels:
        settings["priority_levels"] = 2
    with open(os.path.join(folder, "model-settings.json"), "w") as f:
        json.dump(settings, f)
    return out


def send(conn, high):
    body = BODY if not high else json.dumps({**json.loads(BODY), "parameters": {"priority": 1}})
    conn.request("POST", "/v2/models/slow/infer", body, {"Content-Type": "application/json"})
    r = conn.getresponse()
    r.read()
    return r.status


def saturation(seconds=10.0, clients=16):
    done = []
    stop = time.monotonic() + seconds

    def client():
        conn = http.client.HTTPConnection("127.0.0.1", HTTP)
        n = 0
        while time.monotonic() < stop:
            n += send(conn, False) == 200
        done.append(n)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(done) / seconds


def open_loop(rate, seconds, high_fraction, seed=7):
    """Sends on a Poisson schedule; returns (scheduled offset, high, status, latency) per request."""
    rng = random.Random(seed)
    jobs, results = queue.Queue(), []
    lock = threading.Lock()

    def worker():
        conn = http.client.HTTPConnection("127.0.0.1", HTTP, timeout=60)
        while True:
            job = jobs.get()
            if job is None:
                return
            due, offset, high = job
            try:
                status = send(conn, high)
            except (OSError, http.client.HTTPException):
                conn = http.client.HTTPConnection("127.0.0.1", HTTP, timeout=60)
                status = 0
            with lock:
                results.append((offset, high, status, time.monotonic() - due))

    workers = [threading.Thread(target=worker, daemon=True) for _ in range(int(rate * 2) + 32)]
    for w in workers:
        w.start()
    start = time.monotonic()
    offset = 0.0
    while True:
        offset += rng.expovariate(rate)
        if offset >= seconds:
            break
        delay = start + offset - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        jobs.put((start + offset, offset, rng.random() < high_fraction))
    for _ in workers:
        jobs.put(None)
    for w in workers:
        w.join()
    return results


def pct(values, q):
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def report(name, results, args):
    ok = [r for r in results if r[2] == 200]
    good = [r for r in ok if r[3] <= args.timeout]
    hi = [r[3] * 1e3 for r in ok if r[1]]
    lo = [r[3] * 1e3 for r in ok if not r[1]]
    line = {
        "run": name,
        "offered": len(results),
        "goodput_per_s": round(len(good) / args.seconds, 1),
        "high_p50_ms": round(pct(hi, 0.5), 1),
        "high_p99_ms": round(pct(hi, 0.99), 1),
        "low_p50_ms": round(pct(lo, 0.5), 1),
        "low_p99_ms": round(pct(lo, 0.99), 1),
        "503": sum(r[2] == 503 for r in results),
        "504": sum(r[2] == 504 for r in results),
        "other": sum(r[2] not in (200, 503, 504) for r in results),
    }
    print(json.dumps(line), flush=True)
    if args.minutes:
        for m in range(int(args.seconds // 60)):
            part = [r for r in good if m * 60 <= r[0] < (m + 1) * 60]
            print(json.dumps({"run": name, "minute": m + 1, "goodput_per_s": round(len(part) / 60, 1),
                              "p50_ms": round(pct([r[3] * 1e3 for r in part], 0.5), 1)}), flush=True)
    return line


def main():
    p = argparse.ArgumentParser()
    p.add_argument("before")
    p.add_argument("after")
    p.add_argument("--seconds", type=float, default=60)
    p.add_argument("--load", type=float, default=1.2)
    p.add_argument("--timeout", type=float, default=1.0)
    p.add_argument("--high", type=float, default=0.2)
    p.add_argument("--minutes", action="store_true", help="goodput and median latency per minute")
    p.add_argument("--rate", type=float, default=0, help="offer this rate instead of measuring saturation")
    p.add_argument("--matmuls", type=int, default=128,
                   help="products of 512x512 matrices per run (the fixture has 16: too fast a model "
                        "makes the Python client, not the server, the limit)")
    args = p.parse_args()
    rate = args.rate
    runs = []
    for name, binary, levels in [("before", args.before, False), ("after", args.after, True)]:
        if binary == "-":
            continue
        server = serve(binary, repo(args.timeout, levels, args.matmuls), HTTP, GRPC)
        try:
            if not rate:
                sat = saturation()
                rate = sat * args.load
                print(json.dumps({"saturation_per_s": round(sat, 1), "offered_per_s": round(rate, 1)}), flush=True)
            runs.append(report(name, open_loop(rate, args.seconds, args.high), args))
        finally:
            server.terminate()
            server.wait()
    if len(runs) == 2:
        b, a = runs
        print(json.dumps({
            "goodput_after_over_before": round(a["goodput_per_s"] / max(b["goodput_per_s"], 1e-9), 2),
            "high_p99_after_over_before": round(a["high_p99_ms"] / b["high_p99_ms"], 2),
        }), flush=True)


if __name__ == "__main__":
    main()
