#!/usr/bin/env python3
"""A fault soak over every protocol, with hostile neighbours (issues
"Reliability, round three" and "round four"): BINARY serves 16 faulted models
and two bystanders in `on_demand` residency, with client shared memory on and
an inference log pointed at a sick sink. The bystanders (`keep_sum`, a copy
of `scalar_out`, and `keep_ext`, of `external`) are `"pinned": true` in their
model-settings.json: loaded at start, never evicted, charged to the host
budget first. The budget is 4 MiB for the faulted models plus 1.5 MiB for the
bystanders; a start whose bystanders do not fit in it (the first model loaded
seems to be charged ONNX Runtime's one-time growth, 0.5 to 3 MiB in a debug
build, and the second is guessed at as much before it loads) is not ready,
and after 60 s it is stopped and started again with the bystanders' share
doubled, up to 4 starts. What the bystanders really hold
and what that leaves the faulted models are read from /metrics at the start
and reported, with each start's budget. The faulted models are loaded on
demand and evicted while, each in its own thread:

- four ordinary clients send requests to the faulted models over KServe V1,
  V2 JSON, V2 binary (tritonclient.http) and gRPC (tritonclient.grpc); every
  answer must be right (y = x . w for the `ext*` copies of `external`, row
  sums for the `sum*` copies of `scalar_out`) or a refusal with a reason;
- two bystander clients send to the bystanders only, each over V1, V2 JSON,
  V2 binary and gRPC in turn, 50 ms apart (unpaced, they would take the CPU
  the soak needs), their answers judged the same way: their
  success rate is the "other clients' success rate" of issue 48 (goal
  >= 99 %), the ordinary clients' one being low by construction;
- file faults break and repair the faulted models' files (never a
  bystander's): a model file cut short then written back whole in place,
  external data taken away and put back, a file replaced by rename with the
  same bytes, a permission taken away and given back (a no-op as root);
- root renames: every ~20 s the repository root (the bystanders' folders
  too) is renamed away for 1-2 s, then back (requests failing meanwhile are
  refusals, not wrong answers);
- a sick inference-log sink (an HTTP server in this script, the server's
  `inference_log.url`) that alternates every ~30 s between answering 500 at
  once and hanging 30 s before it answers;
- a shared-memory client (tritonclient.utils.shared_memory) that registers an
  input and an output region over HTTP, infers a faulted model with both in
  shared memory, checks the answer and unregisters; every 4th iteration it
  plays hostile instead: it truncates the input's or the output's object to
  0 bytes while it is registered and sends a request naming it (to the model
  it was last served by), which must be refused with a 4xx and must not kill
  the server (one still refused 503/504 after 3 s, the model unable to run at
  all, is counted as unjudged);
- a gRPC `ModelStreamInfer` stream (raw stubs, on its own channel) to `sum0`
  that sends 256 KiB requests forever and never reads an answer, open for the
  whole soak and the end check;
- a watch that the server process has not exited (a crash ends the soak).

At the end, with every file whole and the root in place, every model
(bystanders included) must answer right over every protocol within 30 s (the
stream still open, the sink still sick). A faulted model whose every
remaining answer is exactly the refusal of a size that can never fit ("model
`M` needs about N bytes on cpu, more than residency.host_bytes (N) less what
pinned models hold (N): it cannot be loaded; raise residency.host_bytes",
503 / UNAVAILABLE: a noisy measurement of its last load) is reported under
`refused_for_budget_at_end`, not as a model left broken; any other answer is.

Usage: .venv-clients/bin/python scripts/fault_soak.py BINARY [SECONDS]
  (SECONDS defaults to 600; a release build; needs .ort/ from make setup and
  .venv-clients from make test-clients; uses ports 18500 and 18501)
Prints a summary line on stderr and one JSON object on stdout: the other
(bystander) clients' success rate (goal >= 99 %) with their requests, right
answers, refusals by reason and wrong answers; the same for the faulted
models' clients (their rate, no goal); the budget, what the pinned
bystanders hold of it and the starts it took; crashes, models not serving at
the end, models refused for their budget at the end, the faults, root
renames and evictions, the sink's events, the shared-memory requests'
outcomes, the stream's, and how long it ran. Exits 1 on a wrong answer (any
client, shared memory included), a hang (a client's answer after more than
60 s), a crash, or a model left broken (a bystander included), and (with
only the starts on stderr) when no start became ready; neither success
rate, nor a model refused for its budget at the end, changes the exit
status.
"""
import http.server
import json
import os
import random
import re
import shutil
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

import grpc as grpclib
import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sluice_server import ROOT, serve  # noqa: E402

binary = sys.argv[1]
seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 600.0
HTTP, GRPC = 18500, 18501
W = np.array([1, 2, 3, 4], np.float32)
repo = tempfile.mkdtemp()
models = {}  # every model: the fixture it is a copy of
for i in range(8):
    shutil.copytree(f"{ROOT}/tests/fixtures/models/external", f"{repo}/ext{i}")
    models[f"ext{i}"] = "external"
    shutil.copytree(f"{ROOT}/tests/fixtures/models/scalar_out", f"{repo}/sum{i}")
    models[f"sum{i}"] = "scalar_out"
faulted = sorted(models)  # the models the faults, the churn and their clients work on
# The bystanders: pinned (loaded at start, never evicted, charged to the
# budget first), no file fault touches them, only the bystander clients
# send to them; the root renames move their folders too.
bystanders = {"keep_sum": "scalar_out", "keep_ext": "external"}
for m, fixture in bystanders.items():
    shutil.copytree(f"{ROOT}/tests/fixtures/models/{fixture}", f"{repo}/{m}")
    with open(f"{repo}/{m}/model-settings.json", "w") as f:
        json.dump({"pinned": True}, f)
    models[m] = fixture
whole = {m: {f: open(f"{repo}/{m}/{f}", "rb").read() for f in os.listdir(f"{repo}/{m}")} for m in faulted}
# The faulted models compete for about 4 MiB, as before the bystanders came;
# the pinned bystanders get BYSTANDER_BYTES more. The first model loaded (now
# a bystander, at start) is charged ONNX Runtime's one-time growth too, and
# the second one is guessed at about as much before it loads: a debug build
# measured 0.9 to 3 MiB for the first. A start whose bystanders do not fit
# is not ready (a pinned model that cannot load): after 60 s it is stopped
# and started again with the bystanders' share doubled, up to 4 starts.
# What they really hold, and so what is left, is read from /metrics and
# reported.
FAULTED_BYTES, BYSTANDER_BYTES = 4 << 20, 3 << 19

stop = threading.Event()  # the soak's threads
stop_stream = threading.Event()  # the never-reading stream, after the end check
stop_sink = threading.Event()  # the sink's hanging answers, at the very end
lock = threading.Lock()
files = threading.Lock()  # file faults and root renames, one at a time
stats = {"ok": 0, "refused": {}, "wrong": [], "requests": 0, "faults": 0, "renames": 0}  # faulted models' clients
by_stats = {"ok": 0, "refused": {}, "wrong": [], "requests": 0}  # the bystander clients
shm_stats = {"ok": 0, "refused": {}, "hostile_refused": {}, "hostile_unjudged": {}, "wrong": []}
stream_stats = {"opened": 0, "sent": 0, "ended": []}
sink_stats = {"events": 0, "answered_500": 0, "hung": 0}
crash = {}


def output_name(model):
    return "y" if models[model] == "external" else "total"


def expected(model, x):
    return x @ W if models[model] == "external" else x.sum(axis=1)


def right(model, x, y):
    return isinstance(y, np.ndarray) and y.shape == (x.shape[0],) and np.allclose(y, expected(model, x), rtol=1e-5)


def reason(status, message):
    """A refusal's key: its status and the start of its message, digits as N."""
    message = re.sub(r" ?\(since [^)]*\)", "", message)
    return f"{status}: " + re.sub(r"[0-9]+(\.[0-9]+)?", "N", message)[:100]


def count(table, key):
    with lock:
        table[key] = table.get(key, 0) + 1


class Refusal:
    """An answer that is not a result: a status and a reason."""

    def __init__(self, status, message):
        self.status, self.message = str(status), message

    def __str__(self):
        return f"{self.status} {self.message}"


# The sick sink: POSTed inference-log events are read whole and counted; the
# answer alternates every 30 s between 500 at once and a 30 s hang.
class Sink(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        hang = int((time.monotonic() - sink_t0) // 30) % 2 == 1
        with lock:
            sink_stats["events"] += 1
            sink_stats["hung" if hang else "answered_500"] += 1
        if hang:
            stop_sink.wait(30)
        try:
            self.send_response(200 if hang else 500)
            self.send_header("Content-Length", "0")
            self.end_headers()
        except OSError:  # the server gave up on it
            pass

    def log_message(self, *args):
        pass


sink = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Sink)
sink.daemon_threads = True
sink_t0 = time.monotonic()
threading.Thread(target=sink.serve_forever, daemon=True).start()

env = {"SLUICE_RESIDENCY__MODE": "on_demand",
       "SLUICE_RESIDENCY__MIN_IDLE_SECONDS": "0",
       "SLUICE_INFERENCE_LOG__URL": f"http://127.0.0.1:{sink.server_address[1]}/",
       "SLUICE_SHARED_MEMORY__ENABLED": "true"}
log = open(f"{repo}.log", "w")
starts = []  # each start's budget, and why one was not ready
for attempt in range(4):
    host_bytes = FAULTED_BYTES + (BYSTANDER_BYTES << attempt)
    env["SLUICE_RESIDENCY__HOST_BYTES"] = str(host_bytes)
    start_at = os.path.getsize(f"{repo}.log")
    try:
        p = serve(binary, repo, HTTP, GRPC, env=env, log=log, seconds=60)
        starts.append({"host_bytes": host_bytes, "ready": True})
        break
    except SystemExit as e:  # serve killed it
        log.flush()
        with open(f"{repo}.log", "rb") as f:
            f.seek(start_at)
            why = [line.split(" error=", 1)[-1].strip() for line in f.read().decode(errors="replace").splitlines()
                   if " ERROR " in line and any(f"model={m} " in line for m in bystanders)]
        starts.append({"host_bytes": host_bytes, "ready": False, "why": why[-1] if why else str(e.code)})
        if attempt == 3 or not str(e.code).startswith("sluice did not become ready"):
            print(json.dumps({"starts": starts, "log": f"{repo}.log"}, indent=1), file=sys.stderr)
            shutil.rmtree(repo, ignore_errors=True)
            raise
        time.sleep(2)  # the killed server's ports


def metric(text, name, **labels):
    """The sum of the samples of `name` in the Prometheus `text` whose labels
    include `labels`."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.split()[-1])
    return total


try:  # what the pinned bystanders hold, before any traffic
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{HTTP}/metrics", timeout=30).read().decode()
    budget = int(metric(metrics, "sluice_residency_budget_bytes", device="cpu"))
    pinned_bytes = {m: int(metric(metrics, "sluice_model_memory_bytes", model=m, device="cpu")) for m in bystanders}
    residency = {"host_bytes": budget, "bystanders_hold_bytes": pinned_bytes,
                 "left_for_faulted_bytes": budget - sum(pinned_bytes.values()), "starts": starts}
except OSError as e:
    residency = {"starts": starts, "metrics": f"no /metrics at the start: {e}"}


def server_gone():
    """Whether the server has exited (seen within a second): a request with no
    answer then is the crash, not one more wrong answer."""
    try:
        p.wait(1)
        return True
    except Exception:
        return p.poll() is not None


def close(call):
    try:
        getattr(call, "client", None) and call.client.close()
    except Exception:
        pass


def v1(model, x):
    body = json.dumps({"instances": x.tolist()}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{HTTP}/v1/models/{model}:predict", body,
                                 {"Content-Type": "application/json"})
    try:
        out = json.load(urllib.request.urlopen(req, timeout=60))
        return np.array(out["predictions"], np.float32)
    except urllib.error.HTTPError as e:
        why = json.load(e).get("error", "")
        if not why:
            raise RuntimeError(f"{e.code} without a reason")
        return Refusal(e.code, why)


def v2(client, binary_data):
    def run(model, x):
        inp = httpclient.InferInput("x", list(x.shape), "FP32")
        inp.set_data_from_numpy(x, binary_data=binary_data)
        out = httpclient.InferRequestedOutput(output_name(model), binary_data=binary_data)
        try:
            r = client.infer(model, [inp], outputs=[out])
        except InferenceServerException as e:  # an answer with an error status
            if not e.message():
                raise RuntimeError(f"{e.status()} without a reason")
            return Refusal(e.status(), e.message())
        return r.as_numpy(output_name(model))
    run.client = client
    return run


def grpc(client):
    def run(model, x):
        inp = grpcclient.InferInput("x", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        try:
            r = client.infer(model, [inp])
        except InferenceServerException as e:
            if not e.message():
                raise RuntimeError(f"{e.status()} without a reason")
            return Refusal(e.status(), e.message())
        return r.as_numpy(output_name(model))
    run.client = client
    return run


def client_loop(name, make):
    """An ordinary client: one protocol, the faulted models."""
    call = make()
    try:
        client_requests(name, [(name, call)], faulted, stats, 0)
    finally:
        close(call)


def bystander_loop(name, protocols):
    """A bystander client: the bystander models only, each request over the
    next of its `protocols` in turn, BYSTANDER_PAUSE seconds apart."""
    calls = [(n, makers[n]()) for n in protocols]
    try:
        client_requests(name, calls, sorted(bystanders), by_stats, BYSTANDER_PAUSE)
    finally:
        for _, call in calls:
            close(call)


def client_requests(name, calls, pool, table, pause):
    """Requests to the models of `pool` until the soak stops, each over the
    next of `calls` ((protocol, call) pairs), `pause` seconds apart, counted
    in `table`."""
    rng = random.Random(name)
    i = 0
    while not stop.is_set():
        protocol, call = calls[i % len(calls)]
        i += 1
        model = rng.choice(pool)
        x = np.array([[rng.random() for _ in range(4)] for _ in range(rng.randint(1, 3))], np.float32)
        t0 = time.monotonic()
        try:
            got = call(model, x)
        except Exception as e:  # no answer at all: a dropped connection, a crash
            if server_gone():
                break  # counted as the crash
            with lock:
                table["requests"] += 1
                table["wrong"].append((model, protocol, f"no answer: {e!r}"[:300]))
            continue
        with lock:
            table["requests"] += 1
            if time.monotonic() - t0 > 60:
                table["wrong"].append((model, protocol, f"hung {time.monotonic() - t0:.0f} s"))
            elif isinstance(got, Refusal):
                key = f"{protocol} {reason(got.status, got.message)}"
                table["refused"][key] = table["refused"].get(key, 0) + 1
            elif right(model, x, got):
                table["ok"] += 1
            else:
                table["wrong"].append((model, protocol, got.tolist()))
        if pause:
            stop.wait(pause)


def faults():
    rng = random.Random(7)
    while not stop.is_set():
        model = rng.choice(faulted)  # never a bystander
        kind = rng.choice(["cut", "weights", "rename", "chmod"])
        if kind == "weights" and models[model] != "external":
            kind = "cut"
        with files:
            d = f"{repo}/{model}"
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
        with files:  # waits while the root is away
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


def root_renames():
    rng = random.Random(20)
    while not stop.wait(rng.uniform(15, 25)):
        with files:
            os.rename(repo, repo + ".away")
            try:
                time.sleep(rng.uniform(1, 2))
            finally:
                os.rename(repo + ".away", repo)
        with lock:
            stats["renames"] += 1


def shm_loop():
    client = httpclient.InferenceServerClient(f"127.0.0.1:{HTTP}")
    rng = random.Random("shm")
    i, served = 0, None
    while not stop.is_set():
        i += 1
        hostile = ["in", "out"][i // 4 % 2] if i % 4 == 0 else None
        # A hostile request goes to the model last served, most likely loaded.
        model = served if hostile and served else rng.choice(faulted)
        x = np.array([[rng.random() for _ in range(4)] for _ in range(rng.randint(1, 3))], np.float32)
        in_bytes, out_bytes = x.nbytes, 4 * x.shape[0]
        tag = f"soak{os.getpid()}_{i}"
        ih = oh = None
        registered = []
        try:
            ih = shm.create_shared_memory_region(f"{tag}_in", f"/{tag}_in", in_bytes)
            oh = shm.create_shared_memory_region(f"{tag}_out", f"/{tag}_out", out_bytes)
            shm.set_shared_memory_region(ih, [x])
            try:
                for side, size in (("in", in_bytes), ("out", out_bytes)):
                    client.register_system_shared_memory(f"{tag}_{side}", f"/{tag}_{side}", size)
                    registered.append(side)
            except InferenceServerException as e:
                count(shm_stats["refused"], "register " + reason(e.status(), e.message()))
                continue
            if hostile:
                # The client's own mapping of this object must not be read
                # from now on: it would be a SIGBUS here.
                fd = os.open(f"/dev/shm/{tag}_{hostile}", os.O_RDWR)
                os.ftruncate(fd, 0)
                os.close(fd)
            inp = httpclient.InferInput("x", list(x.shape), "FP32")
            inp.set_shared_memory(f"{tag}_in", in_bytes)
            out = httpclient.InferRequestedOutput(output_name(model), binary_data=True)
            out.set_shared_memory(f"{tag}_out", out_bytes)
            for attempt in range(6 if hostile else 1):
                try:
                    r = client.infer(model, [inp], outputs=[out])
                    answer = None
                except InferenceServerException as e:
                    answer = Refusal(e.status(), e.message())
                # A hostile request refused for being unable to run at all
                # now (503, 504: a load, the budget) is tried again.
                if not (answer and answer.status in ("503", "504")):
                    break
                time.sleep(0.5)
            if hostile:
                if answer and answer.status.isdigit() and 400 <= int(answer.status) < 500:
                    count(shm_stats["hostile_refused"], f"{hostile} {reason(answer.status, answer.message)}")
                elif answer and answer.status in ("503", "504"):  # the model could not run at all
                    count(shm_stats["hostile_unjudged"], f"{hostile} {reason(answer.status, answer.message)}")
                else:
                    with lock:
                        shm_stats["wrong"].append((model, f"{hostile} truncated", str(answer or "answered 200")[:300]))
            elif answer:
                count(shm_stats["refused"], reason(answer.status, answer.message))
            else:
                o = r.get_output(output_name(model))
                y = shm.get_contents_as_numpy(oh, np.float32, o["shape"]) if o else None
                with lock:
                    if right(model, x, y):
                        shm_stats["ok"] += 1
                        served = model
                    else:
                        shm_stats["wrong"].append((model, "shm", None if y is None else y.tolist()))
        except Exception as e:  # no answer at all
            if server_gone():
                break  # counted as the crash
            with lock:
                shm_stats["wrong"].append((model, "shm", f"no answer: {e!r}"[:300]))
        finally:
            for side in registered:
                try:
                    client.unregister_system_shared_memory(f"{tag}_{side}")
                except Exception as e:
                    count(shm_stats["refused"], f"unregister {e}"[:90])
            for h in (ih, oh):
                if h is not None:
                    shm.destroy_shared_memory_region(h)
        time.sleep(0.02)
    client.close()


def never_reading_stream():
    rows = 256 * 1024 // 16  # 256 KiB of FP32 [rows, 4]
    req = service_pb2.ModelInferRequest(model_name="sum0")
    t = req.inputs.add()
    t.name, t.datatype = "x", "FP32"
    t.shape.extend([rows, 4])
    req.raw_input_contents.append(np.ones((rows, 4), np.float32).tobytes())

    def requests():
        while not stop_stream.is_set():
            yield req
            with lock:
                stream_stats["sent"] += 1

    while not stop_stream.is_set():
        channel = grpclib.insecure_channel(f"127.0.0.1:{GRPC}")
        call = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer(requests())
        with lock:
            stream_stats["opened"] += 1
        while not stop_stream.is_set() and not call.done():
            stop_stream.wait(0.5)
        if not stop_stream.is_set():  # the server ended it: note why, open another
            with lock:
                stream_stats["ended"].append(f"{call.code()}: {call.details()}"[:200])
            stop_stream.wait(1)
        call.cancel()
        channel.close()


def watch():
    while not stop_sink.is_set():
        if p.poll() is not None and not stop_sink.is_set():  # not our terminate
            crash["exit"] = p.returncode
            stop.set()
            return
        time.sleep(0.2)


makers = {
    "v1": lambda: v1,
    "v2-json": lambda: v2(httpclient.InferenceServerClient(f"127.0.0.1:{HTTP}"), False),
    "v2-binary": lambda: v2(httpclient.InferenceServerClient(f"127.0.0.1:{HTTP}"), True),
    "grpc": lambda: grpc(grpcclient.InferenceServerClient(f"127.0.0.1:{GRPC}")),
}
# Two bystander clients, each over every protocol in turn, in two orders,
# paced: in a trial unpaced (a debug build, 2 cores), they sent 14 times as
# many requests as the faulted models' clients, which sent 5 to 12 times
# fewer than in soaks without them (the CPU and the GIL they took); paced,
# about as many.
BYSTANDER_PAUSE = 0.05
bystander_clients = {"bystander-a": ["v1", "v2-json", "v2-binary", "grpc"],
                     "bystander-b": ["grpc", "v2-binary", "v2-json", "v1"]}


def never_fits(m, answer):
    """Whether `answer` is exactly the refusal of a model whose measured size
    is more than the budget less what the pinned models hold ("... it cannot
    be loaded; raise residency.host_bytes"): a budget refusal, not a fault
    left unrecovered."""
    name = re.escape(m)
    return (isinstance(answer, Refusal) and answer.status in ("503", "StatusCode.UNAVAILABLE")
            and re.fullmatch(rf"(model `{name}` is not ready: )?model `{name}` needs about [0-9]+ bytes on cpu, "
                             rf"more than residency\.host_bytes \([0-9]+\) less what pinned models hold "
                             rf"\([0-9]+\): it cannot be loaded; raise residency\.host_bytes", answer.message)
            is not None)


broken, refused_for_budget, evictions, soaked = [], {}, None, None
t0 = time.monotonic()
try:
    threads = [threading.Thread(target=client_loop, args=(n, m)) for n, m in makers.items()]
    threads += [threading.Thread(target=bystander_loop, args=(n, ps)) for n, ps in bystander_clients.items()]
    threads += [threading.Thread(target=f) for f in (faults, root_renames, shm_loop)]
    stream = threading.Thread(target=never_reading_stream)
    watcher = threading.Thread(target=watch, daemon=True)
    for t in [watcher, stream, *threads]:
        t.start()
    stop.wait(seconds)
    stop.set()
    for t in threads:
        t.join()
    soaked = time.monotonic() - t0
    # Every file whole and the root in place now: every model (bystanders
    # too) must answer right over every protocol within 30 s, the stream
    # still open; a faulted model refused only for a size that can never
    # fit the budget is reported apart (refused_for_budget_at_end).
    if not crash:
        x = np.array([[1, 0.5, 2, 3]], np.float32)
        calls = {name: make() for name, make in makers.items()}

        def answer(m, n):
            try:
                return calls[n](m, x)
            except Exception as e:
                return Refusal("no answer", repr(e))

        pending = [(m, n) for m in models for n in makers]
        deadline = time.monotonic() + 30
        while pending and time.monotonic() < deadline and not crash:
            pending = [(m, n) for m, n in pending if not right(m, x, answer(m, n))]
            if pending:
                time.sleep(0.5)
        last = [(m, n, answer(m, n)) for m, n in pending]
        for m in sorted({m for m, _, _ in last}):
            answers = [(n, a) for m2, n, a in last if m2 == m]
            if m in faulted and all(never_fits(m, a) for _, a in answers):
                refused_for_budget[m] = {"protocols": [n for n, _ in answers], "answer": str(answers[0][1])[:300]}
            else:
                broken += [(m, n, str(a)[:200]) for n, a in answers]
        for c in calls.values():
            close(c)
        try:
            metrics = urllib.request.urlopen(f"http://127.0.0.1:{HTTP}/metrics", timeout=30).read().decode()
            evictions = metric(metrics, "sluice_model_evictions_total")
        except OSError as e:
            evictions = f"no /metrics: {e}"
    stop_stream.set()
    stream.join()
finally:
    stop.set()
    stop_stream.set()
    stop_sink.set()
    if p.poll() is None:
        p.terminate()
        try:
            p.wait(30)
        except Exception:
            p.kill()
            p.wait()
    sink.shutdown()
    if os.path.isdir(repo + ".away") and not os.path.exists(repo):
        os.rename(repo + ".away", repo)
    shutil.rmtree(repo, ignore_errors=True)



def rate(table):
    return 100.0 * table["ok"] / table["requests"] if table["requests"] else 0.0


def clients(table, names):
    refused = dict(sorted(table["refused"].items(), key=lambda kv: -kv[1]))
    return {"clients": names, "requests": table["requests"], "ok": table["ok"],
            "refused_total": sum(refused.values()), "refused": refused,
            "wrong": len(table["wrong"]), "wrong_examples": table["wrong"][:10]}


wrong = len(stats["wrong"]) + len(by_stats["wrong"]) + len(shm_stats["wrong"])
not_serving = sorted({m for m, _, _ in broken}) if not crash else sorted(models)
print(f"other clients' success rate: {by_stats['ok']} of {by_stats['requests']} answered right "
      f"({rate(by_stats):.2f} %, goal >= 99 %; bystander clients of {len(bystanders)} pinned models no fault "
      f"touches); faulted models' clients: {stats['ok']} of {stats['requests']} ({rate(stats):.2f} %, "
      f"no goal); {wrong} wrong, {1 if crash else 0} crashes, {len(not_serving)} models not serving at the "
      f"end, {len(refused_for_budget)} refused for their budget at the end", file=sys.stderr)
print(json.dumps({
    "seconds": round(soaked if soaked is not None else time.monotonic() - t0),
    "bystander_success_rate_percent": round(rate(by_stats), 3), "success_goal_percent": 99,
    "bystanders": {"models": sorted(bystanders), "pinned": True,
                   **clients(by_stats, {n: ps for n, ps in bystander_clients.items()})},
    "faulted_success_rate_percent": round(rate(stats), 3),
    "faulted": {"models": len(faulted), **clients(stats, list(makers))},
    "residency": residency,
    "crashes": 1 if crash else 0, "server_exit": crash.get("exit"),
    "models_not_serving": not_serving,
    "broken_at_end": {m: {"protocols": [n for m2, n, _ in broken if m2 == m],
                          "answer": next(a for m2, _, a in broken if m2 == m)} for m in not_serving}
    if not crash else "the server crashed",
    "refused_for_budget_at_end": refused_for_budget,
    "faults": stats["faults"], "root_renames": stats["renames"], "evictions": evictions,
    "sink": sink_stats,
    "shm": {"ok": shm_stats["ok"], "refused_total": sum(shm_stats["refused"].values()),
            "refused": shm_stats["refused"],
            "hostile_refused_4xx": sum(shm_stats["hostile_refused"].values()),
            "hostile_refusals": shm_stats["hostile_refused"],
            "hostile_unjudged": shm_stats["hostile_unjudged"],
            "wrong": len(shm_stats["wrong"]), "wrong_examples": shm_stats["wrong"][:10]},
    "stream": stream_stats,
    "log": f"{repo}.log"}, indent=1))
sys.stdout.flush()
sys.stderr.flush()
# Not sys.exit: the threads' tritonclient.http clients would be finalized
# at exit outside their gevent hubs, each printing a traceback.
os._exit(1 if wrong or crash or not_serving else 0)
