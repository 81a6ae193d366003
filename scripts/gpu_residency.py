#!/usr/bin/env python3
"""Residency on a GPU (`scripts/gpu-check.sh residency`): device budgets
checked against nvidia-smi, and the memory an eviction gives back.

    gpu_residency.py SLUICE ORT_LIBRARY OUT [--models 40] [--seconds 40]

1. Builds MODELS small models (tests/clients/residency.py build), each on
   `execution_provider = "cuda"`, and serves them all (eager, no budget):
   each model's device bytes from the index, their sum, and the GPU's memory
   in use (nvidia-smi) before and after.
2. Serves them on demand under `residency.device_bytes` = a quarter of that
   sum; Zipf traffic (V1: tritonclient is not there) for SECONDS while sampling the
   charged bytes (`sluice_residency_used_bytes{device="cuda:0"}`) and
   nvidia-smi. Every answer must be k·x.
3. Unloads every loaded model through the repository API and reads how much
   nvidia-smi's figure fell, against what those models were charged.
Writes OUT/gpu-residency.md and prints it. Python stdlib and numpy, onnx.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import sluice_server

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DRIVER = os.path.join(ROOT, "tests", "clients", "residency.py")
HTTP, GRPC = 18700, 18701
PROVIDER = "cuda"
URL = f"http://127.0.0.1:{HTTP}"


def smi_used():
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True).stdout
    return int(out.split()[0]) * 2**20  # MiB


def serve(args, repo, env, log):
    """sluice on `repo` with the ONNX Runtime library of the command line."""
    ort = os.path.abspath(args.ort)
    env = {"RUST_LOG": "info,sluice::repository::resident=debug", "ORT_DYLIB_PATH": ort, **env}
    return sluice_server.serve(args.sluice, repo, HTTP, GRPC, env=env, log=log, seconds=600,
                               args=["--host", "127.0.0.1", "--onnxruntime-library", ort])


def index():
    req = urllib.request.Request(f"{URL}/v2/repository/index", data=b"{}", method="POST")
    return json.loads(urllib.request.urlopen(req, timeout=30).read())


def device_bytes(entry):
    memory = entry.get("memory") or {}
    if PROVIDER == "cpu":  # a dry run of this script on a machine without a GPU
        return memory.get("host_bytes", 0)
    return sum(d["bytes"] for d in memory.get("device_bytes", []))


def stop(p):
    p.terminate()
    p.wait(timeout=60)


def main():
    a = argparse.ArgumentParser()
    a.add_argument("sluice")
    a.add_argument("ort")
    a.add_argument("out")
    a.add_argument("--models", type=int, default=40)
    a.add_argument("--seconds", type=float, default=40)
    a.add_argument("--provider", default="cuda", help="cpu: a dry run of the script without a GPU")
    args = a.parse_args()
    global PROVIDER
    PROVIDER = args.provider
    os.makedirs(args.out, exist_ok=True)
    log = open(os.path.join(args.out, "residency-sluice.log"), "w")
    work = tempfile.mkdtemp()
    subprocess.run([sys.executable, DRIVER, "build", work, "--models", str(args.models)], check=True)
    repo = os.path.join(work, "repo")
    for name in os.listdir(repo):
        with open(os.path.join(repo, name, "model-settings.json"), "w") as f:
            json.dump({"execution_provider": args.provider}, f)
    lines = ["# Residency on a GPU", ""]
    failed = []

    # 1. Every model resident.
    idle = smi_used()
    t0 = time.monotonic()
    p = serve(args, repo, {}, log)
    load_s = time.monotonic() - t0
    entries = index()
    per_model = sorted(device_bytes(e) for e in entries)
    total = sum(per_model)
    smi_all = smi_used()
    stop(p)
    mib = lambda b: f"{b / 2**20:.0f} MiB"
    lines += [
        f"{args.models} models (y = x·kI, d 128..1024) on CUDA, eager, no budget: ready in {load_s:.0f} s.",
        f"Device bytes per model (index): min {mib(per_model[0])}, median {mib(per_model[len(per_model) // 2])}, "
        f"max {mib(per_model[-1])}; sum {mib(total)}. nvidia-smi: {mib(idle)} before, {mib(smi_all)} with all loaded "
        f"(+{mib(smi_all - idle)}; the sum is {100 * total / max(1, smi_all - idle):.0f} % of that).",
        "",
    ]

    # 2. A quarter of that as the device budget, Zipf traffic.
    budget = total // 4
    key = "HOST_BYTES" if PROVIDER == "cpu" else "DEVICE_BYTES"
    env = {"SLUICE_RESIDENCY__MODE": "on_demand", f"SLUICE_RESIDENCY__{key}": str(budget),
           "SLUICE_MODEL_REPOSITORY__CONTROL": "api"}
    p = serve(args, repo, env, log)
    base = smi_used()
    peak = [base]
    done = threading.Event()

    def sample():
        while not done.wait(0.25):
            peak[0] = max(peak[0], smi_used())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    drive = subprocess.run([sys.executable, DRIVER, "drive", work, "--http", f"127.0.0.1:{HTTP}", "--grpc",
                            f"127.0.0.1:{GRPC}", "--pid", str(p.pid), "--seconds", str(args.seconds),
                            "--clients", "4", "--protos", "v1",
                            "--device", "cpu" if PROVIDER == "cpu" else "cuda:0"],
                           capture_output=True, text=True)
    done.set()
    sampler.join()
    try:
        summary = json.loads(drive.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        summary = {}
        failed.append(f"the driver printed no summary: {drive.stderr[-1500:]}")
    if drive.returncode != 0:
        failed.append(f"wrong answers or undocumented errors: {summary.get('answers')}")
    largest = per_model[-1]
    charged = summary.get("max_used") or 0
    if charged > budget + largest:
        failed.append(f"charged {charged} bytes, over the budget {budget} by more than one model ({largest})")
    lines += [
        f"On demand, `residency.device_bytes` = {mib(budget)} (a quarter), Zipf 1.1, 4 clients, V1 (no tritonclient there), "
        f"{args.seconds:.0f} s: answers {summary.get('answers')}, hit ratio {summary.get('hit_ratio')}, "
        f"hit p50/p99 {summary.get('hit_ms_p50_p99')} ms, cold p50/p99 {summary.get('cold_ms_p50_p99')} ms, "
        f"{summary.get('loads_per_s')} loads/s, {summary.get('evictions')} evictions.",
        f"Charged at most {mib(charged)} ({charged / budget:.3f} of the budget); nvidia-smi at most "
        f"{mib(peak[0])} (the server started at {mib(base)}).",
        "",
    ]

    # 3. What unloading every loaded model gives back.
    loaded = [e for e in index() if e["state"] == "READY"]
    held = sum(device_bytes(e) for e in loaded)
    before = smi_used()
    for e in loaded:
        req = urllib.request.Request(f"{URL}/v2/repository/models/{e['name']}/unload", data=b"{}", method="POST")
        urllib.request.urlopen(req, timeout=60).read()
    time.sleep(3)
    after = smi_used()
    stop(p)
    # What the process holds with no model loaded (CUDA's context, the
    # libraries' handles) is outside the budget; the models' part is not.
    if peak[0] - after > budget + largest:
        failed.append(f"nvidia-smi peaked {peak[0] - after} bytes above the server without models, "
                      f"over the budget {budget} by more than one model ({largest})")
    lines += [
        f"Unloading the {len(loaded)} loaded models (charged {mib(held)}): nvidia-smi {mib(before)} -> {mib(after)}, "
        f"{mib(before - after)} given back ({100 * (before - after) / max(1, held):.0f} % of their charge); "
        f"the peak under traffic was {mib(peak[0] - after)} above that (budget {mib(budget)}).",
        "",
        "verdict: " + ("PASS" if not failed else "FAIL: " + "; ".join(failed)),
    ]
    text = "\n".join(lines)
    open(os.path.join(args.out, "gpu-residency.md"), "w").write(text + "\n")
    print(text)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
