#!/usr/bin/env python3
"""A soak with file faults over every protocol (issue "Reliability, round
three"): BINARY serves 16 models in `on_demand` residency under a host budget
that holds only some of them, while clients send requests over KServe V1, V2
JSON, V2 binary (tritonclient.http) and gRPC (tritonclient.grpc), and a fault
thread breaks and repairs the models' files: a model file cut short then
written back whole in place, external data taken away and put back, a file
replaced by rename with the same bytes, a permission taken away and given back
(a no-op as root). Every answer must be right (y = x . w for the `external`
copies, row sums for the `scalar_out` ones) or a refusal with a reason; at the
end, with every file whole, every model must answer right over every protocol.

Usage: .venv-clients/bin/python scripts/fault_soak.py BINARY [SECONDS]
  (a release build; needs .ort/ from make setup and .venv-clients from make test-clients)
Prints one JSON object; exits 1 on a wrong answer, a hang, or a model left broken.
"""
import json
import os
import random
import shutil
import sys
import tempfile
import threading
import time

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sluice_server import ROOT, serve  # noqa: E402

binary = sys.argv[1]
seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 300.0
HTTP, GRPC = 18500, 18501
W = np.array([1, 2, 3, 4], np.float32)
repo = tempfile.mkdtemp()
models = {}
for i in range(8):
    shutil.copytree(f"{ROOT}/tests/fixtures/models/external", f"{repo}/ext{i}")
    models[f"ext{i}"] = "external"
    shutil.copytree(f"{ROOT}/tests/fixtures/models/scalar_out", f"{repo}/sum{i}")
    models[f"sum{i}"] = "scalar_out"
whole = {m: {f: open(f"{repo}/{m}/{f}", "rb").read() for f in os.listdir(f"{repo}/{m}")} for m in models}
env = {"SLUICE_RESIDENCY__MODE": "on_demand", "SLUICE_RESIDENCY__HOST_BYTES": str(4 << 20),
       "SLUICE_RESIDENCY__MIN_IDLE_SECONDS": "0"}
log = open(f"{repo}.log", "w")
p = serve(binary, repo, HTTP, GRPC, env=env, log=log)

stats = {"ok": 0, "refused": {}, "wrong": [], "faults": 0}
lock = threading.Lock()


def expected(model, x):
    return x @ W if models[model] == "external" else x.sum(axis=1)


def count_refusal(why):
    with lock:
        stats["refused"][why] = stats["refused"].get(why, 0) + 1


def check(model, x, y, how):
    with lock:
        if y is not None and np.allclose(y, expected(model, x), rtol=1e-5):
            stats["ok"] += 1
        else:
            stats["wrong"].append((model, how, None if y is None else y.tolist()))


def v1(model, x):
    body = json.dumps({"instances": x.tolist()}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{HTTP}/v1/models/{model}:predict", body,
                                 {"Content-Type": "application/json"})
    try:
        out = json.load(urllib.request.urlopen(req, timeout=30))
        return np.array(out["predictions"], np.float32)
    except urllib.error.HTTPError as e:
        reason = json.load(e).get("error", "")
        if not reason:
            raise RuntimeError(f"{e.code} without a reason")
        return e.code


def v2(client, binary_data):
    def run(model, x):
        inp = httpclient.InferInput("x", list(x.shape), "FP32")
        inp.set_data_from_numpy(x, binary_data=binary_data)
        out = httpclient.InferRequestedOutput("y" if models[model] == "external" else "total",
                                              binary_data=binary_data)
        try:
            r = client.infer(model, [inp], outputs=[out])
        except Exception as e:  # tritonclient raises InferenceServerException with the status
            if not str(e):
                raise RuntimeError("a refusal without a reason")
            return getattr(e, "status", lambda: "error")() or "error"
        return r.as_numpy("y" if models[model] == "external" else "total")
    return run


def grpc(client):
    def run(model, x):
        inp = grpcclient.InferInput("x", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        try:
            r = client.infer(model, [inp])
        except Exception as e:
            if not str(e):
                raise RuntimeError("a refusal without a reason")
            return getattr(e, "status", lambda: "error")() or "error"
        return r.as_numpy("y" if models[model] == "external" else "total")
    return run


stop = threading.Event()


def client_loop(name, make):
    call = make()
    rng = random.Random(name)
    while not stop.is_set():
        model = rng.choice(list(models))
        x = np.array([[rng.random() for _ in range(4)] for _ in range(rng.randint(1, 3))], np.float32)
        t0 = time.monotonic()
        try:
            got = call(model, x)
        except Exception as e:  # no answer at all: a dropped connection, a crash
            with lock:
                stats["wrong"].append((model, name, f"no answer: {e}"))
            continue
        if time.monotonic() - t0 > 60:
            with lock:
                stats["wrong"].append((model, name, "hung"))
        if isinstance(got, np.ndarray):
            check(model, x, got, name)
        else:
            count_refusal(f"{name} {got}")


def faults():
    rng = random.Random(7)
    while not stop.is_set():
        model = rng.choice(list(models))
        d = f"{repo}/{model}"
        kind = rng.choice(["cut", "weights", "rename", "chmod"])
        if kind == "weights" and models[model] != "external":
            kind = "cut"
        if kind == "cut":
            with open(f"{d}/model.onnx", "r+b") as f:
                f.truncate(len(whole[model]["model.onnx"]) // 2)
        elif kind == "weights":
            os.rename(f"{d}/weights.bin", f"{d}/.weights.bin")
        elif kind == "chmod":
            os.chmod(f"{d}/model.onnx", 0)
        else:
            with open(f"{d}/.incoming", "wb") as f:
                f.write(whole[model]["model.onnx"])
            os.rename(f"{d}/.incoming", f"{d}/model.onnx")
        time.sleep(rng.uniform(0.2, 2.0))
        if kind == "cut":
            with open(f"{d}/model.onnx", "r+b") as f:
                f.write(whole[model]["model.onnx"])
        elif kind == "weights":
            os.rename(f"{d}/.weights.bin", f"{d}/weights.bin")
        elif kind == "chmod":
            os.chmod(f"{d}/model.onnx", 0o644)
        with lock:
            stats["faults"] += 1
        time.sleep(rng.uniform(0.1, 1.0))


makers = {
    "v1": lambda: v1,
    "v2-json": lambda: v2(httpclient.InferenceServerClient(f"127.0.0.1:{HTTP}"), False),
    "v2-binary": lambda: v2(httpclient.InferenceServerClient(f"127.0.0.1:{HTTP}"), True),
    "grpc": lambda: grpc(grpcclient.InferenceServerClient(f"127.0.0.1:{GRPC}")),
}
threads = [threading.Thread(target=client_loop, args=(n, m)) for n, m in makers.items()]
threads.append(threading.Thread(target=faults))
t0 = time.monotonic()
for t in threads:
    t.start()
time.sleep(seconds)
stop.set()
for t in threads:
    t.join()
# Every file whole now: every model must answer right over every protocol within seconds.
x = np.array([[1, 0.5, 2, 3]], np.float32)
calls = {name: make() for name, make in makers.items()}
pending = [(m, n) for m in models for n in makers]
deadline = time.monotonic() + 20
while pending and time.monotonic() < deadline:
    answers = [(m, n, calls[n](m, x)) for m, n in pending]
    pending = [(m, n) for m, n, got in answers
               if not (isinstance(got, np.ndarray) and np.allclose(got, expected(m, x), rtol=1e-5))]
    time.sleep(0.5)
broken = [(m, n, str(calls[n](m, x))) for m, n in pending]
metrics = urllib.request.urlopen(f"http://127.0.0.1:{HTTP}/metrics").read().decode()
evictions = sum(float(l.split()[-1]) for l in metrics.splitlines() if l.startswith("sluice_model_evictions_total{"))
p.terminate()
p.wait()
print(json.dumps({"seconds": round(time.monotonic() - t0), "answered_right": stats["ok"], "wrong": stats["wrong"][:10],
                  "refused": stats["refused"], "faults": stats["faults"], "evictions": evictions,
                  "broken_at_end": broken, "log": f"{repo}.log"}, indent=1))
sys.exit(1 if stats["wrong"] or broken else 0)
