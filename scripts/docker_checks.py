#!/usr/bin/env python3
"""Checks a running sluice container from the host, for scripts/docker-test.sh.

Standard library only. Prints one `PASS:` or `FAIL:` line per check and exits
with the number of failures (0 = all passed).

  docker_checks.py --container NAME --url http://127.0.0.1:PORT --grpc-port PORT \
                   --models DIR --expected tests/fixtures/digits_expected.json [--basic]

DIR is the host folder mounted at /models (the hot-reload and shutdown checks
edit DIR/digits/model-settings.json). --basic runs only readiness, the
process, the predictions and /metrics (for the CUDA image on a machine
without a GPU); the full run ends with `docker stop` of the container.
"""

import argparse
import concurrent.futures
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

MODEL = "digits"
TOLERANCE = 1e-5  # absolute, on probabilities (expected values: Python onnxruntime)
NON_ROOT_UID = 10001


class Report:
    def __init__(self):
        self.failures = 0
        self.passes = 0

    def check(self, ok, what, detail=""):
        line = f"{'PASS' if ok else 'FAIL'}: {what}"
        if detail:
            line += f" ({detail})"
        print(line, flush=True)
        if ok:
            self.passes += 1
        else:
            self.failures += 1
        return ok


def info(msg):
    print(f"  .. {msg}", flush=True)


# ---- HTTP --------------------------------------------------------------------


def http(method, url, body=None, timeout=30.0):
    """Returns (status, body bytes); status 0 when the connection failed."""
    data = None
    headers = {}
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except (urllib.error.URLError, ConnectionError, socket.timeout, OSError) as e:
        return 0, str(e).encode()


def wait_ready(url, timeout):
    deadline = time.monotonic() + timeout
    start = time.monotonic()
    status = 0
    while time.monotonic() < deadline:
        status, _ = http("GET", f"{url}/v2/health/ready", timeout=5)
        if status == 200:
            return True, time.monotonic() - start
        time.sleep(0.5)
    return False, f"last status {status} after {timeout:.0f} s"


# ---- /metrics ----------------------------------------------------------------

LABEL_RE = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text):
    """[(name, {label: value}, float)] for every sample line."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)", line)
        if not m:
            continue
        labels = dict(LABEL_RE.findall(m.group(2) or ""))
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        out.append((m.group(1), labels, value))
    return out


def get_metrics(url):
    status, body = http("GET", f"{url}/metrics")
    if status != 200:
        raise RuntimeError(f"/metrics answered {status}")
    return parse_metrics(body.decode())


def metric(samples, name, **labels):
    """Sum of the samples of `name` whose labels include `labels`."""
    vals = [v for n, l, v in samples if n == name and all(l.get(k) == x for k, x in labels.items())]
    return sum(vals) if vals else None


def reloads(url):
    """{result: count} of sluice_model_reloads_total for the model."""
    out = {}
    for n, l, v in get_metrics(url):
        if n == "sluice_model_reloads_total" and l.get("model") == MODEL:
            out[l.get("result", "")] = out.get(l.get("result", ""), 0) + v
    return out


# ---- predictions -------------------------------------------------------------


def compare(labels, probs, exp, rows):
    """None when every row matches the expected label and probabilities, else a reason."""
    if len(labels) != len(rows) or len(probs) != len(rows):
        return f"{len(labels)} labels / {len(probs)} probability rows for {len(rows)} inputs"
    worst = 0.0
    for got_l, got_p, i in zip(labels, probs, rows):
        if int(got_l) != exp["labels"][i]:
            return f"row {i}: label {got_l}, expected {exp['labels'][i]}"
        if len(got_p) != len(exp["probabilities"][i]):
            return f"row {i}: {len(got_p)} probabilities"
        for a, b in zip(got_p, exp["probabilities"][i]):
            worst = max(worst, abs(float(a) - b))
    if worst > TOLERANCE:
        return f"probabilities differ by {worst:.2e} > {TOLERANCE}"
    return None


def worst_diff(probs, exp, rows):
    return max(abs(float(a) - b) for p, i in zip(probs, rows) for a, b in zip(p, exp["probabilities"][i]))


def v1_predict(url, exp, rows, timeout=60):
    """KServe V1 predict; returns (status, labels, probability rows, raw)."""
    status, body = http(
        "POST", f"{url}/v1/models/{MODEL}:predict", {"instances": [exp["inputs"][i] for i in rows]}, timeout
    )
    if status != 200:
        return status, None, None, body[:300]
    preds = json.loads(body)["predictions"]
    labels, probs = [], []
    for p in preds:
        if isinstance(p, dict):
            labels.append(p["label"])
            probs.append(p["probabilities"])
        else:  # a bare value per instance would mean one output only: not this model
            return status, None, None, body[:300]
    return status, labels, probs, body[:300]


def v2_infer(url, exp, rows, timeout=60):
    """Open Inference Protocol infer; returns (status, labels, probability rows, raw)."""
    flat = [x for i in rows for x in exp["inputs"][i]]
    req = {"inputs": [{"name": "input", "shape": [len(rows), 64], "datatype": "FP32", "data": flat}]}
    status, body = http("POST", f"{url}/v2/models/{MODEL}/infer", req, timeout)
    if status != 200:
        return status, None, None, body[:300]
    outs = {o["name"]: o for o in json.loads(body)["outputs"]}
    lab, pr = outs["label"], outs["probabilities"]
    if lab["shape"] != [len(rows)] or pr["shape"] != [len(rows), 10]:
        return status, None, None, f"shapes {lab['shape']} {pr['shape']}".encode()
    probs = [pr["data"][k * 10 : (k + 1) * 10] for k in range(len(rows))]
    return status, lab["data"], probs, body[:300]


def check_predictions(rep, url, exp, when=""):
    rows = list(range(len(exp["inputs"])))
    suffix = f" {when}" if when else ""
    status, labels, probs, raw = v1_predict(url, exp, rows)
    if labels is None:
        rep.check(False, f"V1 predict on {MODEL}{suffix}", f"HTTP {status}: {raw!r}")
    else:
        why = compare(labels, probs, exp, rows)
        rep.check(
            why is None,
            f"V1 predict on {MODEL}{suffix}: {len(rows)} instances, labels as expected, probabilities within {TOLERANCE}",
            why or f"max |diff| {worst_diff(probs, exp, rows):.1e}",
        )
    status, labels, probs, raw = v2_infer(url, exp, rows)
    if labels is None:
        rep.check(False, f"V2 infer on {MODEL}{suffix}", f"HTTP {status}: {raw!r}")
    else:
        why = compare(labels, probs, exp, rows)
        rep.check(
            why is None,
            f"V2 infer on {MODEL}{suffix}: shape [{len(rows)},64], labels as expected, probabilities within {TOLERANCE}",
            why or f"max |diff| {worst_diff(probs, exp, rows):.1e}",
        )


# ---- docker ------------------------------------------------------------------


def docker(*args, timeout=120):
    r = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
    return r.returncode, r.stdout.strip(), r.stderr.strip()


def check_process(rep, container):
    rc, out, err = docker("inspect", "-f", "{{json .Config}}", container)
    if rc == 0:
        cfg = json.loads(out)
        rep.check(
            cfg.get("User") == f"{NON_ROOT_UID}:{NON_ROOT_UID}"
            and cfg.get("Entrypoint") == ["/usr/local/bin/sluice"]
            and (cfg.get("Cmd") or [None])[0] == "serve"
            and {"8080/tcp", "8081/tcp"} <= set(cfg.get("ExposedPorts") or {}),
            "image config: USER 10001:10001, ENTRYPOINT /usr/local/bin/sluice, CMD serve, EXPOSE 8080 8081",
            f"User={cfg.get('User')!r} Entrypoint={cfg.get('Entrypoint')} Cmd={cfg.get('Cmd')} "
            f"ExposedPorts={sorted(cfg.get('ExposedPorts') or {})}",
        )
    else:
        rep.check(False, "docker inspect", err)

    rc, out, err = docker("top", container, "-eo", "uid,pid,args")
    rows = [line.split(None, 2) for line in out.splitlines()[1:] if line.strip()]
    uids = {r[0] for r in rows}
    rep.check(
        rc == 0 and rows and uids == {str(NON_ROOT_UID)},
        "every process in the container runs as non-root uid 10001 (docker top)",
        "; ".join(" ".join(r) for r in rows) if rc == 0 else err,
    )

    # The container's init process (its PID 1) is sluice itself, so SIGTERM
    # from `docker stop` reaches it.
    rc, pid, err = docker("inspect", "-f", "{{.State.Pid}}", container)
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().split(b"\0")[0].decode()
        rep.check(cmd == "/usr/local/bin/sluice", "sluice is the container's PID 1", f"PID 1 is {cmd}")
    except OSError as e:
        info(f"cannot read /proc/{pid}/cmdline ({e}); PID 1 not checked (remote Docker engine?)")


# ---- the checks --------------------------------------------------------------


def edit_settings(models, change):
    """Rewrites digits/model-settings.json atomically (as an editor or a ConfigMap does)."""
    path = os.path.join(models, MODEL, "model-settings.json")
    with open(path) as f:
        settings = json.load(f)
    settings.update(change)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(settings, f, indent=2)
        f.write("\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
    return settings


def wait_reload(url, before, timeout=30):
    """Waits until a reload result counter of the model moves; returns {result: increase}."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = reloads(url)
        moved = {k: v - before.get(k, 0) for k, v in now.items() if v > before.get(k, 0)}
        if moved:
            return moved
        time.sleep(0.25)
    return {}


def hot_reload(rep, url, models, exp):
    before = reloads(url)
    info(f"reload counters before: {before}")
    edit_settings(models, {"max_batch_size": 8})
    info("edited digits/model-settings.json: max_batch_size 32 -> 8")
    moved = wait_reload(url, before)
    ok = bool(moved) and set(moved) <= {"updated", "reloaded"}
    rep.check(
        ok,
        'hot reload: sluice_model_reloads_total{model="digits",result="updated"|"reloaded"} moved after editing the mounted model-settings.json',
        ", ".join(f'result="{k}" +{v:g}' for k, v in moved.items()) or "no change within 30 s",
    )
    status, body = http("GET", f"{url}/v2/models/{MODEL}/config")
    if status == 200:
        mbs = json.loads(body).get("max_batch_size")
        rep.check(mbs == 8, "the new max_batch_size is in effect (/v2/models/digits/config)", f"max_batch_size {mbs}")
    check_predictions(rep, url, exp, when="after the reload")
    samples = get_metrics(url)
    rep.check(
        metric(samples, "sluice_model_ready", model=MODEL) == 1,
        'sluice_model_ready{model="digits"} still 1 after the reload',
    )


def shutdown_in_flight(rep, url, models, exp, container, n=20):
    # Fixed policy, a long max_batch_time, a batch larger than n: the
    # requests wait in the queue, so they are in flight when SIGTERM comes.
    before = reloads(url)
    edit_settings(models, {"batch_policy": "fixed", "max_batch_time": 2.0, "max_batch_size": 64})
    moved = wait_reload(url, before)
    rep.check(
        bool(moved),
        "settings for the shutdown check applied (batch_policy fixed, max_batch_time 2.0 s, max_batch_size 64)",
        ", ".join(f'result="{k}" +{v:g}' for k, v in moved.items()) or "no reload seen",
    )

    def one(i):
        t0 = time.monotonic()
        status, labels, probs, raw = v1_predict(url, exp, [i], timeout=90)
        why = compare(labels, probs, exp, [i]) if labels is not None else f"HTTP {status}: {raw!r}"
        return i, status, why, time.monotonic() - t0

    pool = concurrent.futures.ThreadPoolExecutor(max_workers=n)
    t_start = time.monotonic()
    futures = [pool.submit(one, i) for i in range(n)]
    queued = 0.0
    while time.monotonic() - t_start < 1.5:
        queued = metric(get_metrics(url), "sluice_queue_size", model=MODEL) or 0
        if queued >= n:
            break
        time.sleep(0.02)
    done_before = sum(f.done() for f in futures)
    info(
        f"{n} requests sent; sluice_queue_size{{model=\"digits\"}} = {queued:g}, "
        f"{done_before} answered, {time.monotonic() - t_start:.2f} s after the first: docker stop (SIGTERM)"
    )
    rep.check(
        queued >= 1 and done_before < n,
        "requests were in flight (queued in sluice) when docker stop sent SIGTERM",
        f"{queued:g} queued, {done_before} of {n} answered before",
    )
    t_stop = time.monotonic()
    rc, out, err = docker("stop", "-t", "60", container, timeout=120)
    stop_s = time.monotonic() - t_stop
    results = [f.result() for f in futures]
    pool.shutdown()
    bad = [(i, s, w) for i, s, w, _ in results if s != 200 or w is not None]
    rep.check(
        not bad,
        f"all {n} in-flight requests answered 200 with the right prediction",
        "; ".join(f"#{i}: {s} {w}" for i, s, w in bad[:5])
        or f"slowest {max(r[3] for r in results):.2f} s",
    )
    rc, code, err = docker("inspect", "-f", "{{.State.ExitCode}} {{.State.OOMKilled}}", container)
    exit_code = code.split()[0] if rc == 0 and code else f"? {err}"
    rep.check(
        exit_code == "0",
        "docker stop: the container exited with code 0 (SIGTERM drained, not SIGKILLed)",
        f"exit code {exit_code}, docker stop took {stop_s:.2f} s",
    )
    rc, out, err = docker("logs", container)
    logs = out + "\n" + err
    rep.check("SIGTERM received" in logs, 'the server logged "SIGTERM received"')


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--container", required=True)
    ap.add_argument("--url", required=True, help="http://127.0.0.1:PORT, the container's 8080")
    ap.add_argument("--grpc-port", type=int, help="the host port of the container's 8081")
    ap.add_argument("--models", required=True, help="host folder mounted at /models")
    ap.add_argument("--expected", required=True, help="tests/fixtures/digits_expected.json")
    ap.add_argument("--ready-timeout", type=float, default=180)
    ap.add_argument("--basic", action="store_true", help="no hot reload, no docker stop")
    args = ap.parse_args()
    url = args.url.rstrip("/")
    with open(args.expected) as f:
        exp = json.load(f)
    rep = Report()

    ok, detail = wait_ready(url, args.ready_timeout)
    rep.check(ok, "GET /v2/health/ready answers 200", f"after {detail:.1f} s" if ok else detail)
    if not ok:
        return rep.failures
    status, body = http("GET", f"{url}/v2/health/live")
    rep.check(status == 200, "GET /v2/health/live answers 200")
    status, body = http("GET", f"{url}/v2/models/{MODEL}/ready")
    rep.check(status == 200, f"GET /v2/models/{MODEL}/ready answers 200")
    if args.grpc_port:
        try:
            socket.create_connection(("127.0.0.1", args.grpc_port), timeout=5).close()
            rep.check(True, "the gRPC port (8081) accepts connections")
        except OSError as e:
            rep.check(False, "the gRPC port (8081) accepts connections", str(e))

    check_process(rep, args.container)
    check_predictions(rep, url, exp)

    samples = get_metrics(url)
    names = sorted({n for n, _, _ in samples if n.startswith("sluice_")})
    rep.check(
        metric(samples, "sluice_model_ready", model=MODEL) == 1,
        'GET /metrics: sluice_model_ready{model="digits"} 1',
    )
    requests = metric(samples, "sluice_requests_total", model=MODEL)
    rep.check(
        len(names) >= 5 and bool(requests),
        "GET /metrics: sluice_* series, digits requests counted",
        f"{len(names)} sluice_* series; sluice_requests_total{{model=\"digits\"}} = {requests}",
    )

    if not args.basic:
        hot_reload(rep, url, args.models, exp)
        shutdown_in_flight(rep, url, args.models, exp, args.container)

    print(f"checks: {rep.passes} passed, {rep.failures} failed", flush=True)
    return rep.failures


if __name__ == "__main__":
    sys.exit(main())
