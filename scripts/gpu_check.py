"""Checks a running sluice on a CUDA GPU (scripts/gpu-check.sh starts it).

Every expected value comes from Python ONNX Runtime on the CPU, run on the
same file with each request alone and unpadded: never from sluice.

Usage: gpu_check.py URL REPOSITORY SLUICE_PID OUT.md

What it checks, and prints as Markdown (also written to OUT.md):
1. Each model's provider, from the repository index and the log (the shell
   script greps the log; here the index's `reason`/state).
2. `mlp` (float32 MLP): 64 concurrent one-row requests, half V2 JSON, half
   V2 binary. Tolerance: relative L2 error 2e-3 per request. ONNX Runtime's
   CUDA provider multiplies float32 matrices in TF32 by default (10-bit
   mantissa), whose error on a 784-wide dot product is a few 1e-4 relative.
3. `minilm` (padding on): 48 concurrent requests of lengths 1..128, half
   JSON, half binary. Each answer must be its own length and match the CPU
   run on that request alone: relative L2 5e-3. The file stores its weights
   as int8 but computes in float32 (each weight is `Cast` then `Mul` by its
   scale, folded when the session loads), so on CUDA its matrix products are
   TF32 too, through six layers. Batches of more than one request must show
   in `/metrics`.
4. Memory: `sluice_model_memory_bytes{device="cuda:0"}` of every model,
   the statistics' `memory_usage`, against `nvidia-smi`'s figure for the
   sluice process.
"""

import concurrent.futures as cf
import json
import os
import re
import subprocess
import sys
import time
import urllib.request

import numpy as np
import onnxruntime as ort

FAILURES = []
LINES = []


def say(line=""):
    print(line, flush=True)
    LINES.append(line)


def check(ok, what):
    say(f"- {'PASS' if ok else 'FAIL'}: {what}")
    if not ok:
        FAILURES.append(what)


def http(method, url, body=None, headers=None):
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    with urllib.request.urlopen(req, timeout=120) as r:
        return r.status, dict(r.headers), r.read()


def get_json(url):
    return json.loads(http("GET", url)[2])


def wait_ready(url, seconds=300):
    end = time.time() + seconds
    while time.time() < end:
        try:
            if http("GET", f"{url}/v2/health/ready")[0] == 200:
                return True
        except Exception:
            pass
        time.sleep(0.5)
    return False


NP = {"FP32": np.float32, "INT64": np.int64}
ONNX_TO_V2 = {"tensor(float)": "FP32", "tensor(int64)": "INT64"}


def infer_json(url, model, feeds):
    body = {
        "inputs": [
            {"name": n, "shape": list(a.shape), "datatype": dt, "data": a.reshape(-1).tolist()}
            for n, (a, dt) in feeds.items()
        ]
    }
    _, _, raw = http("POST", f"{url}/v2/models/{model}/infer", json.dumps(body).encode(),
                     {"Content-Type": "application/json"})
    out = json.loads(raw)["outputs"][0]
    return np.asarray(out["data"], dtype=np.float32).reshape(out["shape"])


def infer_binary(url, model, feeds, output):
    header = {
        "inputs": [
            {"name": n, "shape": list(a.shape), "datatype": dt,
             "parameters": {"binary_data_size": a.nbytes}}
            for n, (a, dt) in feeds.items()
        ],
        "outputs": [{"name": output, "parameters": {"binary_data": True}}],
    }
    h = json.dumps(header).encode()
    body = h + b"".join(np.ascontiguousarray(a).tobytes() for a, _ in feeds.values())
    _, headers, raw = http("POST", f"{url}/v2/models/{model}/infer", body, {
        "Content-Type": "application/octet-stream",
        "Inference-Header-Content-Length": str(len(h)),
    })
    n = int({k.lower(): v for k, v in headers.items()}["inference-header-content-length"])
    out = json.loads(raw[:n])["outputs"][0]
    return np.frombuffer(raw[n:], dtype=np.float32).reshape(out["shape"])


def rel_l2(got, want):
    want = want.astype(np.float64)
    return float(np.linalg.norm(got.astype(np.float64) - want) / max(np.linalg.norm(want), 1e-30))


def metric_lines(url, name):
    text = http("GET", f"{url}/metrics")[2].decode()
    return [l for l in text.splitlines() if l.startswith(name)]


def metric_value(lines, prefix):
    for l in lines:
        if l.startswith(prefix):
            return float(l.rsplit(" ", 1)[1])
    return 0.0  # no series before the first observation


def compare_many(url, model, path, cases, tol, output):
    """cases: list of feeds dicts {name: (array, datatype)}; half JSON, half binary."""
    cpu = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    want = [cpu.run([output], {n: a for n, (a, _) in f.items()})[0] for f in cases]
    before = metric_lines(url, "sluice_batch_size")
    s0 = metric_value(before, f'sluice_batch_size_sum{{model="{model}"}}')
    c0 = metric_value(before, f'sluice_batch_size_count{{model="{model}"}}')

    def one(i):
        f = cases[i]
        if i % 2 == 0:
            return infer_json(url, model, f)
        return infer_binary(url, model, f, output)

    t0 = time.time()
    with cf.ThreadPoolExecutor(len(cases)) as pool:
        got = list(pool.map(one, range(len(cases))))
    wall = time.time() - t0
    errs = [rel_l2(g, w) for g, w in zip(got, want)]
    shapes_ok = all(g.shape == w.shape for g, w in zip(got, want))
    maxabs = max(float(np.max(np.abs(g.astype(np.float64) - w))) for g, w in zip(got, want))
    after = metric_lines(url, "sluice_batch_size")
    s1 = metric_value(after, f'sluice_batch_size_sum{{model="{model}"}}')
    c1 = metric_value(after, f'sluice_batch_size_count{{model="{model}"}}')
    batches, rows = c1 - c0, s1 - s0
    check(shapes_ok, f"`{model}`: every answer has the shape of its request alone ({len(cases)} requests)")
    check(max(errs) <= tol,
          f"`{model}`: relative L2 error against CPU ONNX Runtime {ort.__version__}: max {max(errs):.2e}, "
          f"median {sorted(errs)[len(errs) // 2]:.2e} (tolerance {tol:g}); max abs {maxabs:.2e}")
    check(batches > 0 and rows / batches > 1.0,
          f"`{model}`: {rows:.0f} rows in {batches:.0f} batches (mean {rows / max(batches, 1):.1f}); wall {wall:.2f} s")


def mlp_cases(path, n):
    s = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    i = s.get_inputs()[0]
    width = i.shape[1]
    rng = np.random.default_rng(7)
    dt = ONNX_TO_V2[i.type]
    return [{i.name: (rng.standard_normal((1, width)).astype(NP[dt]), dt)} for _ in range(n)], s.get_outputs()[0].name


def minilm_cases(n):
    rng = np.random.default_rng(11)
    lengths = [1, 2, 3, 5, 8, 13, 16, 21, 32, 50, 64, 77, 100, 127, 128]
    lengths += [int(x) for x in rng.integers(1, 129, n - len(lengths))]
    cases = []
    for length in lengths:
        ids = rng.integers(1000, 30000, (1, length), dtype=np.int64)
        ids[0, 0] = 101
        ids[0, -1] = 102
        cases.append({
            "input_ids": (ids, "INT64"),
            "attention_mask": (np.ones((1, length), np.int64), "INT64"),
            "token_type_ids": (np.zeros((1, length), np.int64), "INT64"),
        })
    return cases


def nvidia_smi_process_mib(pid):
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=30).stdout
    except Exception as e:
        return None, f"nvidia-smi failed: {e}"
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0] == str(pid):
            return float(parts[1]), out.strip()
    return None, out.strip() or "(no compute processes listed)"


def main():
    url, repo, pid, out_path = sys.argv[1:5]
    say("## sluice on a CUDA GPU: checks")
    say()
    check(wait_ready(url), "server ready")
    index = json.loads(http("POST", f"{url}/v2/repository/index", b"{}")[2])
    for m in index:
        say(f"- index: `{json.dumps(m)}`")

    cases, output = mlp_cases(f"{repo}/mlp/model.onnx", 64)
    compare_many(url, "mlp", f"{repo}/mlp/model.onnx", cases, 2e-3, output)
    compare_many(url, "minilm", f"{repo}/minilm/model.onnx", minilm_cases(48), 5e-3, "last_hidden_state")
    ratio = metric_lines(url, "sluice_batch_padding_ratio_count")
    say(f"- padding ratio histogram counts: {'; '.join(ratio) or 'none'}")

    say()
    say("### Device memory")
    say()
    mem = metric_lines(url, "sluice_model_memory_bytes")
    cuda = {}
    for l in mem:
        say(f"- `{l}`")
        m = re.search(r'model="([^"]+)".*device="(cuda:\d+)"', l) or re.search(r'device="(cuda:\d+)".*model="([^"]+)"', l)
        if m:
            model = m.group(1) if m.group(2).startswith("cuda") else m.group(2)
            cuda[model] = float(l.rsplit(" ", 1)[1])
    for model in sorted(os.listdir(repo)):
        stats = get_json(f"{url}/v2/models/{model}/stats")["model_stats"][0]
        say(f"- `{model}` statistics memory_usage: {json.dumps(stats.get('memory_usage'))}")
    smi_mib, smi_raw = nvidia_smi_process_mib(pid)
    total = sum(cuda.values())
    say(f"- nvidia-smi compute apps: {smi_raw!r}")
    check(len(cuda) >= 2 and all(v > 0 for v in cuda.values()),
          f"every CUDA model reports device bytes: {json.dumps({k: int(v) for k, v in cuda.items()})}")
    if smi_mib is not None:
        smi = smi_mib * 1048576
        say(f"- sum over models {total / 1048576:.0f} MiB; nvidia-smi for pid {pid}: {smi_mib:.0f} MiB "
            f"(the difference is the CUDA context and what is not a model's: {(smi - total) / 1048576:.0f} MiB)")
        check(0 < total <= smi, "models' device bytes are positive and within the process's total")
    say()
    say(f"**{len(FAILURES)} failed**" + (": " + "; ".join(FAILURES) if FAILURES else ""))
    with open(out_path, "w") as f:
        f.write("\n".join(LINES) + "\n")
    sys.exit(1 if FAILURES else 0)


if __name__ == "__main__":
    main()
