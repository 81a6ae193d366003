"""The conformance corpus: ONNX files nobody on this project made, served as
bare folders (no settings) from one repository, each answering its reference
inputs with its reference outputs over V2 JSON, the binary extension and gRPC,
one request at a time and with requests arriving together.

The corpus:
  - the onnx wheel's backend test models (`onnx/backend/test/data/`):
    `pytorch-converted`, `pytorch-operator`, `simple` (reference inputs and
    outputs shipped beside each model) and `light` (CNNs whose weights are
    ConstantOfShape nodes; inputs as onnx's own runner makes them, outputs
    shipped);
  - the three models of the `rapidocr-onnxruntime` wheel (a text detector with
    dynamic height and width, a recognizer, a direction classifier), whose
    expected outputs come from Python ONNX Runtime on the same request.

A model is left out only when Python ONNX Runtime (the release sluice loads)
cannot run it on its reference inputs, or disagrees with its reference
outputs: the reason is ONNX Runtime's own, and is printed.

Usage:
  conformance.py build OUT [--rapidocr-wheel WHL]
      writes OUT/repo/<model>/model.onnx, OUT/cases.pkl and prints the counts
  conformance.py check OUT --http HOST:PORT --grpc HOST:PORT
      sends every case over every protocol; exit status 0 when all pass
"""

import argparse
import concurrent.futures
import glob
import os
import pickle
import shutil
import sys
import threading
import zipfile

import numpy as np
import onnx
import onnx.numpy_helper
import onnxruntime as ort

FAMILIES = ["pytorch-converted", "pytorch-operator", "simple"]
# As onnx's backend test runner compares.
RTOL, ATOL = 1e-3, 1e-5


def data_dir() -> str:
    return os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data")


def read_pb(path: str):
    """A reference tensor (TensorProto), or a sequence of them (SequenceProto)."""
    with open(path, "rb") as f:
        raw = f.read()
    t = onnx.TensorProto()
    try:
        t.ParseFromString(raw)
        if t.data_type != 0:
            return onnx.numpy_helper.to_array(t)
    except Exception:
        pass
    s = onnx.SequenceProto()
    s.ParseFromString(raw)
    return [onnx.numpy_helper.to_array(x) for x in s.tensor_values]


def backend_cases():
    """(name, model path, inputs list, expected outputs list or None)."""
    for family in FAMILIES:
        for test in sorted(os.listdir(os.path.join(data_dir(), family))):
            folder = os.path.join(data_dir(), family, test)
            model = os.path.join(folder, "model.onnx")
            sets = sorted(glob.glob(os.path.join(folder, "test_data_set_*")))
            if not os.path.exists(model) or not sets:
                continue
            inputs = [read_pb(p) for p in sorted(glob.glob(os.path.join(sets[0], "input_*.pb")))]
            outputs = [read_pb(p) for p in sorted(glob.glob(os.path.join(sets[0], "output_*.pb")))]
            yield f"{family}.{test}", model, inputs, outputs
    light = os.path.join(data_dir(), "light")
    for model in sorted(glob.glob(os.path.join(light, "*.onnx"))):
        m = onnx.load(model, load_external_data=False)
        inits = {i.name for i in m.graph.initializer}
        inputs = []
        for x in m.graph.input:
            if x.name in inits:
                continue
            # As onnx's runner makes them (Runner.generate_dummy_data, random=False).
            shape = tuple(d.dim_value if d.HasField("dim_value") else 1 for d in x.type.tensor_type.shape.dim)
            n = int(np.prod(shape))
            inputs.append((np.arange(n).reshape(shape) / n).astype(np.float32))
        prefix = os.path.splitext(model)[0]
        outputs = [read_pb(p) for p in sorted(glob.glob(prefix + "_output_*.pb"))]
        yield "light." + os.path.basename(prefix)[len("light_"):], model, inputs, outputs


def rapidocr_cases(wheel: str, out: str):
    """The wheel's three models, each with one deterministic request."""
    rng = np.random.default_rng(7)
    shapes = {
        # Text detection: dynamic height and width (multiples of 32).
        "det": (1, 3, 96, 160),
        # Recognition: height 48, dynamic width.
        "rec": (1, 3, 48, 192),
        # Direction classifier: 48 x 192.
        "cls": (1, 3, 48, 192),
    }
    with zipfile.ZipFile(wheel) as z:
        for member in z.namelist():
            if not member.endswith(".onnx"):
                continue
            base = os.path.basename(member)
            kind = "det" if "_det_" in base else "rec" if "_rec_" in base else "cls"
            path = os.path.join(out, base)
            with z.open(member) as src, open(path, "wb") as dst:
                shutil.copyfileobj(src, dst)
            x = rng.standard_normal(shapes[kind]).astype(np.float32)
            yield f"rapidocr.{kind}", path, [x], None


def close(got, want) -> str | None:
    """None when `got` equals `want` (floats within tolerance), else why not."""
    if isinstance(want, list):
        return "a sequence output"
    got = np.asarray(got)
    if got.shape != want.shape:
        return f"shape {list(got.shape)}, expected {list(want.shape)}"
    if want.dtype.kind in "fc":
        if got.dtype != want.dtype and not (want.dtype == np.float16 and got.dtype == np.float16):
            got = got.astype(want.dtype)
        if not np.allclose(got.astype(np.float64), want.astype(np.float64), rtol=RTOL, atol=ATOL, equal_nan=True):
            diff = np.nanmax(np.abs(got.astype(np.float64) - want.astype(np.float64))) if got.size else 0
            return f"values differ (max abs diff {diff:g})"
        return None
    if want.dtype.kind in "OSU":
        g = [v.decode() if isinstance(v, bytes) else str(v) for v in got.reshape(-1)]
        w = [v.decode() if isinstance(v, bytes) else str(v) for v in want.reshape(-1)]
        return None if g == w else f"strings {g[:4]}, expected {w[:4]}"
    return None if np.array_equal(got, want) else "values differ"


def build(out: str, wheel: str | None) -> None:
    repo = os.path.join(out, "repo")
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(repo)
    scratch = os.path.join(out, "wheel")
    os.makedirs(scratch)
    sources = list(backend_cases())
    if wheel:
        sources += list(rapidocr_cases(wheel, scratch))
    cases, left_out = [], []
    opts = ort.SessionOptions()
    opts.log_severity_level = 4
    for name, model, inputs, outputs in sources:
        try:
            sess = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
            in_names = [i.name for i in sess.get_inputs()]
            out_names = [o.name for o in sess.get_outputs()]
            if len(inputs) != len(in_names):
                raise RuntimeError(f"{len(inputs)} reference inputs for {len(in_names)} model inputs")
            feeds = dict(zip(in_names, inputs))
            got = sess.run(None, feeds)
        except Exception as e:  # noqa: BLE001 - ONNX Runtime's own reason is the report
            left_out.append((name, f"Python ONNX Runtime cannot run it: {str(e).splitlines()[0][:200]}"))
            continue
        if any(isinstance(v, list) for v in inputs) or any(isinstance(g, list) for g in got):
            left_out.append((name, "a sequence-typed input or output (not a tensor: no inference protocol carries it)"))
            continue
        if outputs:
            bad = [f"{n}: {why}" for n, g, w in zip(out_names, got, outputs) if (why := close(g, w))]
            if bad or len(outputs) != len(got):
                left_out.append((name, f"Python ONNX Runtime disagrees with the reference outputs ({'; '.join(bad)})"))
                continue
            expected = outputs
        else:
            expected = got
        folder = os.path.join(repo, name)
        os.makedirs(folder)
        shutil.copy(model, os.path.join(folder, "model.onnx"))
        cases.append({
            "name": name,
            "inputs": dict(zip(in_names, inputs)),
            "outputs": dict(zip(out_names, expected)),
        })
    shutil.rmtree(scratch)
    with open(os.path.join(out, "cases.pkl"), "wb") as f:
        pickle.dump({"cases": cases, "left_out": left_out}, f)
    print(f"corpus: {len(sources)} models, {len(cases)} that Python ONNX Runtime runs, {len(left_out)} left out")
    for name, why in left_out:
        print(f"  left out {name}: {why}")


TRITON_DTYPES = {
    "b": "BOOL", "u1": "UINT8", "u2": "UINT16", "u4": "UINT32", "u8": "UINT64",
    "i1": "INT8", "i2": "INT16", "i4": "INT32", "i8": "INT64",
    "f2": "FP16", "f4": "FP32", "f8": "FP64",
}


def triton_dtype(a: np.ndarray) -> str:
    if a.dtype.kind in "OSU":
        return "BYTES"
    key = a.dtype.kind + str(a.dtype.itemsize) if a.dtype.kind != "b" else "b"
    return TRITON_DTYPES[key]


def as_sent(a: np.ndarray) -> np.ndarray:
    if a.dtype.kind in "SU":
        return np.array([v.encode() if isinstance(v, str) else v for v in a.reshape(-1)], dtype=np.object_).reshape(a.shape)
    return a


def infer(case, protocol: str, clients) -> str | None:
    """Sends `case` once over `protocol`; None when every output is right."""
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    lib = grpcclient if protocol == "grpc" else httpclient
    client = clients[protocol]
    inputs = []
    for name, value in case["inputs"].items():
        value = as_sent(np.asarray(value))
        i = lib.InferInput(name, list(value.shape), triton_dtype(value))
        if protocol == "grpc":
            i.set_data_from_numpy(value)
        else:
            i.set_data_from_numpy(value, binary_data=protocol == "binary")
        inputs.append(i)
    if protocol == "grpc":
        outputs = [lib.InferRequestedOutput(n) for n in case["outputs"]]
    else:
        outputs = [lib.InferRequestedOutput(n, binary_data=protocol == "binary") for n in case["outputs"]]
    try:
        result = client.infer(case["name"], inputs, outputs=outputs)
    except Exception as e:  # noqa: BLE001
        return f"request failed: {str(e)[:300]}"
    for name, want in case["outputs"].items():
        got = result.as_numpy(name)
        if got is None:
            return f"output {name} missing"
        if (why := close(got, want)) is not None:
            return f"output {name}: {why}"
    return None


def check(out: str, http: str, grpc: str) -> int:
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    with open(os.path.join(out, "cases.pkl"), "rb") as f:
        corpus = pickle.load(f)
    cases = corpus["cases"]
    clients = {
        "json": httpclient.InferenceServerClient(http, concurrency=16, network_timeout=300),
        "binary": httpclient.InferenceServerClient(http, concurrency=16, network_timeout=300),
        "grpc": grpcclient.InferenceServerClient(grpc),
    }
    protocols = ["json", "binary", "grpc"]
    failed = {}
    # One request at a time.
    for case in cases:
        for p in protocols:
            if (why := infer(case, p, clients)) is not None:
                failed.setdefault(case["name"], []).append(f"{p}: {why}")
    # Together: every model's request four times over each protocol at once,
    # so requests to one model arrive together and may share batches. The
    # HTTP client runs on gevent, which is not thread-safe: one per thread.
    local = threading.local()

    def together(case, p):
        if not hasattr(local, "clients"):
            local.clients = {
                "json": httpclient.InferenceServerClient(http, network_timeout=300),
                "binary": httpclient.InferenceServerClient(http, network_timeout=300),
                "grpc": clients["grpc"],
            }
        return infer(case, p, local.clients)

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        jobs = {
            pool.submit(together, case, p): (case["name"], p)
            for case in cases
            for p in protocols
            for _ in range(4)
        }
        for job, (name, p) in jobs.items():
            if (why := job.result()) is not None:
                failed.setdefault(name, []).append(f"{p} (together): {why}")
    total = len(cases) + len(corpus["left_out"])
    print(f"conformance: {total} models; {len(cases)} that Python ONNX Runtime runs: "
          f"{len(cases) - len(failed)} passed, {len(failed)} failed; {len(corpus['left_out'])} left out")
    for name, why in corpus["left_out"]:
        print(f"  left out {name}: {why}")
    for name, whys in sorted(failed.items()):
        print(f"  FAILED {name}: {whys[0]}" + (f" (and {len(whys) - 1} more)" if len(whys) > 1 else ""))
    return 1 if failed else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("out")
    b.add_argument("--rapidocr-wheel")
    c = sub.add_parser("check")
    c.add_argument("out")
    c.add_argument("--http", required=True)
    c.add_argument("--grpc", required=True)
    args = ap.parse_args()
    if args.cmd == "build":
        build(args.out, args.rapidocr_wheel)
        return 0
    return check(args.out, args.http, args.grpc)


if __name__ == "__main__":
    sys.exit(main())
