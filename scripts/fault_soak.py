#!/usr/bin/env python3
"""A fault soak over every protocol, with hostile neighbours (issues
"Reliability, round three" and "round four"): BINARY serves 16 models in
`on_demand` residency under a host budget that holds only some of them, with
client shared memory on and an inference log pointed at a sick sink, while,
each in its own thread:

- four ordinary clients send requests over KServe V1, V2 JSON, V2 binary
  (tritonclient.http) and gRPC (tritonclient.grpc); every answer must be
  right (y = x . w for the `ext*` copies of `external`, row sums for the
  `sum*` copies of `scalar_out`) or a refusal with a reason;
- file faults break and repair the models' files: a model file cut short
  then written back whole in place, external data taken away and put back, a
  file replaced by rename with the same bytes, a permission taken away and
  given back (a no-op as root);
- root renames: every ~20 s the repository root is renamed away for 1-2 s,
  then back (requests failing meanwhile are refusals, not wrong answers);
- a sick inference-log sink (an HTTP server in this script, the server's
  `inference_log.url`) that alternates every ~30 s between answering 500 at
  once and hanging 30 s before it answers;
- a shared-memory client (tritonclient.utils.shared_memory) that registers an
  input and an output region over HTTP, infers a model with both in shared
  memory, checks the answer and unregisters; every 4th iteration it plays
  hostile instead: it truncates the input's or the output's object to 0 bytes
  while it is registered and sends a request naming it (to the model it was
  last served by), which must be refused with a 4xx and must not kill the
  server (one still refused 503/504 after 3 s, the model unable to run at
  all, is counted as unjudged);
- a gRPC `ModelStreamInfer` stream (raw stubs, on its own channel) that sends
  256 KiB requests forever and never reads an answer, open for the whole soak
  and the end check;
- a watch that the server process has not exited (a crash ends the soak).

At the end, with every file whole and the root in place, every model must
answer right over every protocol within 30 s (the stream still open, the
sink still sick).

Usage: .venv-clients/bin/python scripts/fault_soak.py BINARY [SECONDS]
  (SECONDS defaults to 600; a release build; needs .ort/ from make setup and
  .venv-clients from make test-clients; uses ports 18500 and 18501)
Prints a summary line on stderr and one JSON object on stdout: the ordinary
clients' requests, right answers, refusals by reason, wrong answers, success
rate (goal >= 99 %), crashes, models not serving at the end, the sink's
events, the shared-memory requests' outcomes, the stream's, and how long it
ran. Exits 1 on a wrong answer (any client, shared memory included), a hang,
a crash, or a model left broken; a success rate under the goal alone is only
reported.
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
models = {}
for i in range(8):
    shutil.copytree(f"{ROOT}/tests/fixtures/models/external", f"{repo}/ext{i}")
    models[f"ext{i}"] = "external"
    shutil.copytree(f"{ROOT}/tests/fixtures/models/scalar_out", f"{repo}/sum{i}")
    models[f"sum{i}"] = "scalar_out"
whole = {m: {f: open(f"{repo}/{m}/{f}", "rb").read() for f in os.listdir(f"{repo}/{m}")} for m in models}

stop = threading.Event()  # the soak's threads
stop_stream = threading.Event()  # the never-reading stream, after the end check
stop_sink = threading.Event()  # the sink's hanging answers, at the very end
lock = threading.Lock()
files = threading.Lock()  # file faults and root renames, one at a time
stats = {"ok": 0, "refused": {}, "wrong": [], "requests": 0, "faults": 0, "renames": 0}
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

env = {"SLUICE_RESIDENCY__MODE": "on_demand", "SLUICE_RESIDENCY__HOST_BYTES": str(4 << 20),
       "SLUICE_RESIDENCY__MIN_IDLE_SECONDS": "0",
       "SLUICE_INFERENCE_LOG__URL": f"http://127.0.0.1:{sink.server_address[1]}/",
       "SLUICE_SHARED_MEMORY__ENABLED": "true"}
log = open(f"{repo}.log", "w")
p = serve(binary, repo, HTTP, GRPC, env=env, log=log)


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
    call = make()
    try:
        client_requests(name, call)
    finally:
        close(call)


def client_requests(name, call):
    rng = random.Random(name)
    while not stop.is_set():
        model = rng.choice(list(models))
        x = np.array([[rng.random() for _ in range(4)] for _ in range(rng.randint(1, 3))], np.float32)
        t0 = time.monotonic()
        try:
            got = call(model, x)
        except Exception as e:  # no answer at all: a dropped connection, a crash
            if server_gone():
                break  # counted as the crash
            with lock:
                stats["requests"] += 1
                stats["wrong"].append((model, name, f"no answer: {e!r}"[:300]))
            continue
        with lock:
            stats["requests"] += 1
            if time.monotonic() - t0 > 60:
                stats["wrong"].append((model, name, f"hung {time.monotonic() - t0:.0f} s"))
            elif isinstance(got, Refusal):
                key = f"{name} {reason(got.status, got.message)}"
                stats["refused"][key] = stats["refused"].get(key, 0) + 1
            elif right(model, x, got):
                stats["ok"] += 1
            else:
                stats["wrong"].append((model, name, got.tolist()))


def faults():
    rng = random.Random(7)
    while not stop.is_set():
        model = rng.choice(list(models))
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
        model = served if hostile and served else rng.choice(list(models))
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
broken, evictions, soaked = [], None, None
t0 = time.monotonic()
try:
    threads = [threading.Thread(target=client_loop, args=(n, m)) for n, m in makers.items()]
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
    # Every file whole and the root in place now: every model must answer
    # right over every protocol within 30 s, the stream still open.
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
        broken = [(m, n, str(answer(m, n))[:200]) for m, n in pending]
        for c in calls.values():
            close(c)
        try:
            metrics = urllib.request.urlopen(f"http://127.0.0.1:{HTTP}/metrics", timeout=30).read().decode()
            evictions = sum(float(l.split()[-1]) for l in metrics.splitlines()
                            if l.startswith("sluice_model_evictions_total{"))
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

n, ok = stats["requests"], stats["ok"]
rate = 100.0 * ok / n if n else 0.0
wrong = len(stats["wrong"]) + len(shm_stats["wrong"])
not_serving = sorted({m for m, _, _ in broken}) if not crash else sorted(models)
print(f"ordinary clients: {ok} of {n} answered right ({rate:.2f} %, goal >= 99 %); "
      f"{wrong} wrong, {1 if crash else 0} crashes, {len(not_serving)} models not serving at the end",
      file=sys.stderr)
refused = dict(sorted(stats["refused"].items(), key=lambda kv: -kv[1]))
print(json.dumps({
    "seconds": round(soaked if soaked is not None else time.monotonic() - t0),
    "requests": n, "ok": ok, "refused_total": sum(refused.values()), "refused": refused,
    "wrong": len(stats["wrong"]), "wrong_examples": stats["wrong"][:10],
    "success_rate_percent": round(rate, 3), "success_goal_percent": 99,
    "crashes": 1 if crash else 0, "server_exit": crash.get("exit"),
    "models_not_serving": not_serving,
    "broken_at_end": {m: {"protocols": [n for m2, n, _ in broken if m2 == m],
                          "answer": next(a for m2, _, a in broken if m2 == m)} for m in not_serving}
    if not crash else "the server crashed",
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
