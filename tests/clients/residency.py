#!/usr/bin/env python3
"""More models than memory: a repository of many small models, Zipf traffic.

    residency.py build OUT [--models 200]
        OUT/repo/mNNN/: y = x @ (k I_d), x FP32[-1, d], k = NNN + 1, d one of
        128, 256, 512, 1024 (weights of 64 KiB to 4 MiB); OUT/models.json.
    residency.py drive OUT --http H:P --grpc H:P --pid PID --seconds S
                   [--clients 6] [--zipf 1.1] [--changes] [--seed 1] [--rate R]
        Zipf-distributed requests from several clients over V2 JSON, the
        binary extension, gRPC and V1 (--protos picks some); every answer must be k·x exactly (small
        integers). With --changes: settings edits every 2 s, a folder added at
        a third of the run and one removed at half. Meanwhile samples the
        server's residency gauges (/metrics) and resident memory (PID).
        Prints one JSON summary; exits 1 on a wrong answer or an error other
        than the documented 503s.

Python stdlib, numpy, onnx and tritonclient (.venv-clients).
"""
import argparse
import http.client
import json
import os
import queue
import random
import re
import shutil
import sys
import threading
import time
from pathlib import Path

import numpy as np

DIMS = (128, 256, 512, 1024)


def build(out, n):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    repo = Path(out) / "repo"
    repo.mkdir(parents=True, exist_ok=True)
    models = []
    for i in range(n):
        name, d, k = f"m{i:03d}", DIMS[i % len(DIMS)], float(i + 1)
        models.append({"name": name, "d": d, "k": k})
        write_model(repo / name, d, k)
    (Path(out) / "models.json").write_text(json.dumps(models))
    print(f"built {n} models in {repo}")


def write_model(folder, d, k):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array((np.eye(d, dtype=np.float32) * np.float32(k)), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "scaled_identity",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", d])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", d])],
        [w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(folder / "model.onnx"))


def rss_bytes(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def gauges(host, device="cpu"):
    c = http.client.HTTPConnection(*host.split(":"), timeout=10)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    out = {}
    for key in ("sluice_residency_used_bytes", "sluice_residency_budget_bytes"):
        m = re.search(key + r'\{device="' + device + r'"\} (\S+)', text)
        out[key] = float(m.group(1)) if m else None
    sizes = [float(v) for v in re.findall(r'sluice_model_memory_bytes\{[^}]*device="' + device + r'"[^}]*\} (\S+)', text)]
    out["largest_model"] = max(sizes, default=0.0)
    for key in ("sluice_model_loads_total", "sluice_model_evictions_total"):
        out[key] = sum(float(v) for v in re.findall(key + r"\{[^}]*\} (\S+)", text))
    counts = re.findall(r"sluice_model_cold_start_seconds_count\{[^}]*\} (\S+)", text)
    out["cold_starts"] = sum(float(v) for v in counts)
    return out


def index(host):
    c = http.client.HTTPConnection(*host.split(":"), timeout=10)
    c.request("POST", "/v2/repository/index", body=b"{}")
    return {e["name"]: e for e in json.loads(c.getresponse().read())}


class Traffic:
    """Which models requests go to, by Zipf rank; changed by the mutator."""

    def __init__(self, models, s, seed):
        rng = random.Random(seed)
        self.models = list(models)
        rng.shuffle(self.models)
        self.s = s
        self.lock = threading.Lock()
        self._weights()

    def _weights(self):
        w = np.array([1.0 / (r + 1) ** self.s for r in range(len(self.models))])
        self.p = w / w.sum()

    def pick(self, rng):
        with self.lock:
            return self.models[rng.choice(len(self.models), p=self.p)]

    def add(self, model):
        with self.lock:
            self.models.append(model)
            self._weights()

    def drop(self, name):
        with self.lock:
            self.models = [m for m in self.models if m["name"] != name]
            self._weights()


def infer(proto, clients, model, x):
    """y for x over `proto`, or raises (status, message)."""
    name = model["name"]
    if proto == "v1":
        c = clients["v1"]
        c.request("POST", f"/v1/models/{name}:predict", body=json.dumps({"instances": x.tolist()}))
        r = c.getresponse()
        body = r.read()
        if r.status != 200:
            raise Failure(r.status, json.loads(body).get("error", body.decode()))
        return np.array(json.loads(body)["predictions"], dtype=np.float32)
    if proto == "grpc":
        import tritonclient.grpc as g

        inp = g.InferInput("x", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        try:
            return clients["grpc"].infer(name, [inp]).as_numpy("y")
        except Exception as e:  # tritonclient's InferenceServerException
            raise Failure(str(getattr(e, "status", lambda: "?")()), str(e.message() if hasattr(e, "message") else e))
    import tritonclient.http as h

    binary = proto == "binary"
    inp = h.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=binary)
    out = h.InferRequestedOutput("y", binary_data=binary)
    try:
        return clients["http"].infer(name, [inp], outputs=[out]).as_numpy("y")
    except Exception as e:
        raise Failure(str(getattr(e, "status", lambda: "?")()), str(e.message() if hasattr(e, "message") else e))


class Failure(Exception):
    def __init__(self, status, message):
        super().__init__(f"{status}: {message}")
        self.status, self.message = str(status), message


def documented(f):
    """The 503s residency documents: no room under the budget, or a full queue."""
    unavailable = f.status in ("503", "StatusCode.UNAVAILABLE")
    return unavailable and ("residency." in f.message or "overloaded" in f.message)


def client(i, args, traffic, stop, tally, latencies, jobs=None):
    """Sends requests back to back, or, with `jobs` (open loop), one per
    scheduled time taken from it; a latency counts from the scheduled time,
    so a request that waited for a free client is not flattered."""
    protos = args.protos.split(",")
    rng = np.random.default_rng(args.seed * 1000 + i)
    host, port = args.http.split(":")
    clients = {"v1": http.client.HTTPConnection(host, int(port), timeout=120)}
    if "json" in protos or "binary" in protos:
        import tritonclient.http as h

        clients["http"] = h.InferenceServerClient(args.http, network_timeout=120)
    if "grpc" in protos:
        import tritonclient.grpc as g

        clients["grpc"] = g.InferenceServerClient(args.grpc)
    n = 0
    while not stop.is_set():
        scheduled = None
        if jobs is not None:
            try:
                scheduled = jobs.get(timeout=0.1)
            except queue.Empty:
                continue
        model = traffic.pick(rng)
        proto = protos[(i + n) % len(protos)]
        n += 1
        rows = int(rng.integers(1, 4))
        x = rng.integers(-8, 9, size=(rows, model["d"])).astype(np.float32)
        t0 = scheduled if scheduled is not None else time.monotonic()
        try:
            y = infer(proto, clients, model, x)
        except Failure as f:
            key = "documented_503" if documented(f) else f"{f.status}: {f.message[:160]}"
            if model.get("removed") and f.status in ("404", "StatusCode.NOT_FOUND"):
                key = "removed_404"
            with tally["lock"]:
                tally[key] = tally.get(key, 0) + 1
            if proto == "v1":
                clients["v1"] = http.client.HTTPConnection(host, int(port), timeout=120)
            continue
        latencies.append(time.monotonic() - t0)
        ok = y.shape == x.shape and np.array_equal(y, x * np.float32(model["k"]))
        with tally["lock"]:
            tally["ok" if ok else "wrong"] = tally.get("ok" if ok else "wrong", 0) + 1
            if not ok and "first_wrong" not in tally:
                tally["first_wrong"] = f"{model['name']} over {proto}: {y.ravel()[:4]} for {x.ravel()[:4]}"


def dispatch(rate, stop, jobs):
    """Open loop: schedules requests at `rate` per second (Poisson arrivals)."""
    rng = random.Random(7)
    due = time.monotonic()
    while not stop.is_set():
        due += rng.expovariate(rate)
        delay = due - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        jobs.put(due)


def mutate(args, traffic, stop, events):
    """Settings edits every 2 s; a folder added at a third of the run, one removed at half."""
    repo = Path(args.out) / "repo"
    rng = random.Random(args.seed)
    t0 = time.monotonic()
    added = removed = False
    while not stop.wait(2.0):
        m = rng.choice(traffic.models)
        settings = repo / m["name"] / "model-settings.json"
        if settings.parent.exists():
            kept = json.loads(settings.read_text()) if settings.exists() else {}
            kept["max_batch_size"] = rng.choice([4, 8])
            settings.write_text(json.dumps(kept))
            events.append(f"edited {m['name']}")
        elapsed = time.monotonic() - t0
        if not added and elapsed > args.seconds / 3:
            added = True
            extra = {"name": "extra", "d": 128, "k": 1000.0}
            write_model(repo / "extra", extra["d"], extra["k"])
            for _ in range(100):
                if "extra" in index(args.http):
                    break
                time.sleep(0.1)
            traffic.add(extra)
            events.append("added extra")
        if not removed and elapsed > args.seconds / 2:
            removed = True
            victim = traffic.models[len(traffic.models) // 2]
            victim["removed"] = True
            traffic.drop(victim["name"])
            time.sleep(0.5)
            shutil.rmtree(repo / victim["name"])
            for _ in range(100):
                if victim["name"] not in index(args.http):
                    break
                time.sleep(0.1)
            else:
                events.append(f"{victim['name']} still in the index 10 s after its folder went")
            events.append(f"removed {victim['name']}")


def drive(args):
    models = json.loads((Path(args.out) / "models.json").read_text())
    traffic = Traffic(models, args.zipf, args.seed)
    stop = threading.Event()
    tally = {"lock": threading.Lock()}
    latencies, samples, events = [], [], []
    jobs = queue.Queue() if args.rate else None
    threads = [
        threading.Thread(target=client, args=(i, args, traffic, stop, tally, latencies, jobs), daemon=True)
        for i in range(args.clients)
    ]
    if jobs is not None:
        threads.append(threading.Thread(target=dispatch, args=(args.rate, stop, jobs), daemon=True))
    if args.changes:
        threads.append(threading.Thread(target=mutate, args=(args, traffic, stop, events), daemon=True))
    t0 = time.monotonic()
    for t in threads:
        t.start()
    while time.monotonic() - t0 < args.seconds:
        g = gauges(args.http, args.device)
        g["t"] = time.monotonic() - t0
        g["rss"] = rss_bytes(args.pid)
        samples.append(g)
        time.sleep(0.1)
    stop.set()
    for t in threads:
        t.join(timeout=150)
    end = gauges(args.http, args.device)
    tally.pop("lock")
    budget = end["sluice_residency_budget_bytes"]
    over = [s for s in samples if budget and s["sluice_residency_used_bytes"] is not None
            and s["sluice_residency_used_bytes"] > budget]
    thirds = [
        [s["rss"] for s in samples if k * args.seconds / 3 <= s["t"] < (k + 1) * args.seconds / 3]
        for k in range(3)
    ]
    lat = sorted(latencies)

    def pct(values, q):
        return round(1e3 * values[min(len(values) - 1, int(q * len(values)))], 2) if values else None

    # A cold request waits for a load, which takes longer than any hit: the
    # `cold_starts` slowest answers are the cold ones, the rest hits.
    n_cold = min(len(lat), int(end["cold_starts"]))
    hits, cold = lat[: len(lat) - n_cold], lat[len(lat) - n_cold :]
    summary = {
        "answers": tally,
        "requests_per_s": round(len(lat) / args.seconds, 1),
        "budget": budget,
        "max_used": max((s["sluice_residency_used_bytes"] or 0) for s in samples),
        "largest_model": max(s["largest_model"] for s in samples),
        "samples_over_budget": len(over),
        "rss_median_mib_by_third": [round(float(np.median(t)) / 2**20, 1) if t else None for t in thirds],
        "loads": end["sluice_model_loads_total"],
        "evictions": end["sluice_model_evictions_total"],
        "cold_starts": end["cold_starts"],
        "latency_ms_p50_p99": [pct(lat, 0.5), pct(lat, 0.99)],
        "hit_ratio": round(1 - n_cold / len(lat), 3) if lat else None,
        "hit_ms_p50_p99": [pct(hits, 0.5), pct(hits, 0.99)],
        "cold_ms_p50_p99": [pct(cold, 0.5), pct(cold, 0.99)],
        "loads_per_s": round(end["sluice_model_loads_total"] / args.seconds, 1),
        "peak_used_over_budget": round(max((s["sluice_residency_used_bytes"] or 0) for s in samples) / budget, 3)
        if budget
        else None,
        "events": events,
    }
    print(json.dumps(summary))
    bad = tally.get("wrong", 0) or any(k not in ("ok", "documented_503", "removed_404") for k in tally)
    sys.exit(1 if bad else 0)


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("out")
    b.add_argument("--models", type=int, default=200)
    d = sub.add_parser("drive")
    d.add_argument("out")
    d.add_argument("--http", required=True)
    d.add_argument("--grpc", required=True)
    d.add_argument("--pid", type=int, required=True)
    d.add_argument("--seconds", type=float, default=60)
    d.add_argument("--clients", type=int, default=6)
    d.add_argument("--zipf", type=float, default=1.1)
    d.add_argument("--changes", action="store_true")
    d.add_argument("--seed", type=int, default=1)
    d.add_argument("--rate", type=float, default=0,
                   help="open loop: requests per second, Poisson arrivals (0: each client back to back)")
    d.add_argument("--device", default="cpu", help="whose residency gauges to sample: cpu, cuda:0, ...")
    d.add_argument("--protos", default="json,binary,grpc,v1", help="comma-separated: json, binary, grpc, v1")
    args = p.parse_args()
    if args.cmd == "build":
        build(args.out, args.models)
    else:
        drive(args)


if __name__ == "__main__":
    main()
