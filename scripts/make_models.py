#!/usr/bin/env python3
"""Generate the example and test ONNX models for sluice, plus expected outputs.

Run from anywhere (paths are resolved from the repository root):

    scripts/setup-python.sh
    .venv/bin/python scripts/make_models.py

Writes:
  model-repository/digits/   sklearn MLPClassifier on load_digits (skl2onnx)
  model-repository/mlp/      784-1024-1024-10 Gemm+Relu MLP, random weights
  tests/fixtures/digits_expected.json, mlp_expected.json, multi_io_expected.json
                             inputs + outputs computed with Python onnxruntime
  tests/fixtures/models/{dtypes,bf16,multi_io,fixed_batch,scalar_out,scalar_out_v2,broken,varlen,slow}/
                             small hand-built models for server edge cases
  tests/fixtures/models/{detector,stateful,generated_names,scalars}/
                             bare folders (no settings) whose batch is not plain
                             dim 0: a data-dependent row count, a state batched
                             on axis 1 beside a 0-d input, generated dim names
  tests/fixtures/models/strings/
                             BYTES[N] -> the same (the byte budget's BYTES test)
  tests/fixtures/models/external/
                             FP32[N,4] -> x . w, w in weights.bin (external data)
  tests/fixtures/models/identity/
                             FP32[N,16] -> the same, for the request-path bench
                             (benches/request_path.rs): per-request cost, no compute

Only some models: name them, e.g. `.venv/bin/python scripts/make_models.py identity`
(names: the make_* functions without `make_`).

Deterministic: fixed seeds, single-threaded BLAS / onnxruntime, explicit graph
names, so running it twice gives byte-identical files (on the same machine and
package versions; float results may differ in the last bits on another CPU, so
compare them with a tolerance).
"""

import os

# Single-threaded BLAS before numpy is imported: keeps MLP training bit-for-bit
# reproducible (threaded reductions may sum in a different order).
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import json
import sys
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parent.parent
REPO = ROOT / "model-repository"
FIXTURES = ROOT / "tests" / "fixtures"
TEST_MODELS = FIXTURES / "models"

OPSET = 17
IR_VERSION = 8  # the IR version that goes with opset 17 (onnx 1.12)
PRODUCER = "sluice-make_models"


# --------------------------------------------------------------------------- helpers


def write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def write_settings(folder: Path, settings: dict) -> None:
    """model-settings.json, keys in the given order, 2-space indent, trailing newline."""
    write_bytes(folder / "model-settings.json", (json.dumps(settings, indent=2) + "\n").encode())


def dump_json(value, indent: int = 0) -> str:
    """JSON with one line per innermost list (row), so fixtures stay diff-friendly.

    Floats are written with Python's shortest round-trip repr of the float64
    value; callers pass float(np.float32), which is exact, so parsing back to
    f32 gives the original bits.
    """
    pad = "  " * indent
    inner = "  " * (indent + 1)
    if isinstance(value, dict):
        if not value:
            return "{}"
        items = [f"{inner}{json.dumps(k)}: {dump_json(v, indent + 1)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(value, list) and value and isinstance(value[0], (list, dict)):
        items = [f"{inner}{dump_json(v, indent + 1)}" for v in value]
        return "[\n" + ",\n".join(items) + "\n" + pad + "]"
    return json.dumps(value, separators=(", ", ": "), allow_nan=False)


def write_json(path: Path, value) -> None:
    write_bytes(path, (dump_json(value) + "\n").encode())


def f32_list(a: np.ndarray):
    """float32 array -> nested Python floats holding the exact float32 values."""
    a = np.asarray(a, dtype=np.float32)
    if a.ndim == 0:
        return float(a)
    return [f32_list(x) for x in a] if a.ndim > 1 else [float(x) for x in a]


def int_list(a: np.ndarray):
    return np.asarray(a).tolist()


def finish_model(graph: onnx.GraphProto) -> onnx.ModelProto:
    """Wrap a graph as an opset-17 / IR-8 model and validate it."""
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name=PRODUCER)
    m.ir_version = IR_VERSION
    onnx.checker.check_model(m, full_check=True)  # full_check also runs shape inference
    return m


def save_model(folder: Path, model: onnx.ModelProto, settings: dict | None) -> Path:
    """Writes model.onnx, and model-settings.json unless `settings` is None
    (a bare folder, as a user drops one in)."""
    path = folder / "model.onnx"
    write_bytes(path, model.SerializeToString())
    if settings is not None:
        write_settings(folder, settings)
    return path


def session(path: Path) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1  # deterministic reference outputs
    so.inter_op_num_threads = 1
    so.log_severity_level = 3  # errors only
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def describe(sess: ort.InferenceSession) -> str:
    ins = ", ".join(f"{i.name}:{i.type}{i.shape}" for i in sess.get_inputs())
    outs = ", ".join(f"{o.name}:{o.type}{o.shape}" for o in sess.get_outputs())
    return f"({ins}) -> ({outs})"


def rel(p: Path) -> str:
    return str(p.relative_to(ROOT))


# --------------------------------------------------------------------------- digits


def make_digits() -> None:
    from sklearn.datasets import load_digits
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.model_selection import train_test_split
    from sklearn.neural_network import MLPClassifier
    from skl2onnx import to_onnx
    from skl2onnx.common.data_types import FloatTensorType

    # load_digits is bundled with scikit-learn: no download.
    X, y = load_digits(return_X_y=True)
    X = (X / 16.0).astype(np.float32)
    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.25, random_state=0)
    clf = MLPClassifier(hidden_layer_sizes=(64,), max_iter=500, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf.fit(Xtr, ytr)

    onx = to_onnx(
        clf,
        initial_types=[("input", FloatTensorType([None, 64]))],
        options={id(clf): {"zipmap": False}},  # plain probabilities tensor, not seq(map)
        target_opset=OPSET,
        name="digits",  # otherwise skl2onnx may use a random uuid as graph name
    )
    onnx.checker.check_model(onx)
    folder = REPO / "digits"
    path = save_model(
        folder,
        onx,
        {"name": "digits", "max_batch_size": 32, "max_batch_time": 0.005, "parameters": {"version": "1"}},
    )

    sess = session(path)
    labels, probs = sess.run(["label", "probabilities"], {"input": Xte})
    sk_pred = clf.predict(Xte)
    print(f"digits: {rel(path)} ({path.stat().st_size} B, ir {onx.ir_version}) {describe(sess)}")
    print(
        f"  test accuracy ({len(yte)} rows): sklearn {clf.score(Xte, yte):.4f}, "
        f"onnxruntime {float((labels == yte).mean()):.4f}; "
        f"onnxruntime==sklearn on {int((labels == sk_pred).sum())}/{len(yte)}; "
        f"outputs label {labels.dtype}{list(labels.shape)}, probabilities {probs.dtype}{list(probs.shape)}"
    )

    n = 64
    labels, probs = sess.run(["label", "probabilities"], {"input": Xte[:n]})
    write_json(
        FIXTURES / "digits_expected.json",
        {
            "inputs": f32_list(Xte[:n]),
            "labels_true": int_list(yte[:n]),
            "labels_sklearn": int_list(sk_pred[:n]),
            "labels": int_list(labels),
            "probabilities": f32_list(probs),
        },
    )
    print(f"  fixture: {n} rows, {int((labels == yte[:n]).sum())}/{n} correct")


# --------------------------------------------------------------------------- mlp


def make_mlp() -> None:
    rng = np.random.default_rng(0)
    dims = [784, 1024, 1024, 10]
    nodes, inits = [], []
    prev = "input"
    for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
        W = (rng.standard_normal((a, b)) / np.sqrt(a)).astype(np.float32)
        B = np.zeros((b,), np.float32)
        inits += [numpy_helper.from_array(W, f"W{i}"), numpy_helper.from_array(B, f"B{i}")]
        nodes.append(helper.make_node("Gemm", [prev, f"W{i}", f"B{i}"], [f"h{i}"]))
        if i < len(dims) - 2:
            nodes.append(helper.make_node("Relu", [f"h{i}"], [f"r{i}"]))
            prev = f"r{i}"
        else:
            prev = f"h{i}"
    nodes.append(helper.make_node("Identity", [prev], ["logits"]))
    g = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 784])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])],
        initializer=inits,
    )
    path = save_model(REPO / "mlp", finish_model(g), {"name": "mlp", "max_batch_size": 64, "max_batch_time": 0.002})

    sess = session(path)
    x = np.random.default_rng(1).random((16, 784), dtype=np.float32)
    (logits,) = sess.run(["logits"], {"input": x})
    write_json(FIXTURES / "mlp_expected.json", {"inputs": f32_list(x), "logits": f32_list(logits)})
    print(f"mlp: {rel(path)} ({path.stat().st_size} B) {describe(sess)}")
    print(f"  fixture: 16 rows, logits {logits.dtype}{list(logits.shape)}")


# --------------------------------------------------------------------------- test-only models

# suffix -> (ONNX type, numpy dtype used to feed/check it)
DTYPES = [
    ("bool", TensorProto.BOOL, np.bool_),
    ("uint8", TensorProto.UINT8, np.uint8),
    ("uint16", TensorProto.UINT16, np.uint16),
    ("uint32", TensorProto.UINT32, np.uint32),
    ("uint64", TensorProto.UINT64, np.uint64),
    ("int8", TensorProto.INT8, np.int8),
    ("int16", TensorProto.INT16, np.int16),
    ("int32", TensorProto.INT32, np.int32),
    ("int64", TensorProto.INT64, np.int64),
    ("fp16", TensorProto.FLOAT16, np.float16),
    ("fp32", TensorProto.FLOAT, np.float32),
    ("fp64", TensorProto.DOUBLE, np.float64),
    ("bytes", TensorProto.STRING, np.object_),  # KServe BYTES == ONNX STRING
]


def sample(suffix: str, dtype, n: int) -> np.ndarray:
    if suffix == "bool":
        return (np.arange(n * 2) % 2 == 0).reshape(n, 2)
    if suffix == "bytes":
        return np.array([f"s{i}" for i in range(n * 2)], dtype=object).reshape(n, 2)
    return np.arange(n * 2).astype(dtype).reshape(n, 2)


def make_dtypes() -> None:
    inputs, outputs, nodes = [], [], []
    for suffix, onnx_type, _ in DTYPES:
        inputs.append(helper.make_tensor_value_info(f"in_{suffix}", onnx_type, ["N", 2]))
        outputs.append(helper.make_tensor_value_info(f"out_{suffix}", onnx_type, ["N", 2]))
        nodes.append(helper.make_node("Identity", [f"in_{suffix}"], [f"out_{suffix}"], name=f"id_{suffix}"))
    g = helper.make_graph(nodes, "dtypes", inputs, outputs)
    path = save_model(TEST_MODELS / "dtypes", finish_model(g), {})

    # Every type must load and run in onnxruntime, and come back unchanged.
    sess = session(path)
    feeds = {f"in_{s}": sample(s, dt, 3) for s, _, dt in DTYPES}
    results = sess.run([f"out_{s}" for s, _, _ in DTYPES], feeds)
    ok = []
    for (suffix, _, dt), out in zip(DTYPES, results):
        want = feeds[f"in_{suffix}"]
        if out.dtype != want.dtype or out.shape != want.shape or not np.array_equal(out, want):
            sys.exit(f"make_models: error: dtypes model: out_{suffix} came back as {out.dtype}{out.shape}: {out!r}")
        ok.append(suffix)
    print(f"dtypes: {rel(path)} ({path.stat().st_size} B): Identity round-trip OK for {', '.join(ok)}")


def make_bf16() -> None:
    """BF16 in and out: `y` = Identity(x) and `f` = Cast(x, FLOAT), so a client
    can check the BF16 round trip against the exact float32 values. ONNX
    Runtime's CPU provider runs these two ops on bfloat16 (not Add or Mul).
    numpy has no bfloat16, so onnxruntime's Python binding cannot feed it:
    only the session is built here; the Rust end-to-end tests run it."""
    g = helper.make_graph(
        [
            helper.make_node("Identity", ["x"], ["y"], name="id_bf16"),
            helper.make_node("Cast", ["x"], ["f"], to=TensorProto.FLOAT, name="bf16_to_fp32"),
        ],
        "bf16",
        [helper.make_tensor_value_info("x", TensorProto.BFLOAT16, ["N", 2])],
        [
            helper.make_tensor_value_info("y", TensorProto.BFLOAT16, ["N", 2]),
            helper.make_tensor_value_info("f", TensorProto.FLOAT, ["N", 2]),
        ],
    )
    path = save_model(TEST_MODELS / "bf16", finish_model(g), {})
    sess = session(path)
    print(f"bf16: {rel(path)} ({path.stat().st_size} B) {describe(sess)}")


def make_multi_io() -> None:
    g = helper.make_graph(
        [
            helper.make_node("Add", ["a", "one"], ["sum"], name="add_one"),
            helper.make_node("Cast", ["b"], ["b_f"], to=TensorProto.FLOAT, name="cast_b"),
            helper.make_node("Unsqueeze", ["b_f", "axis1"], ["b_col"], name="b_to_column"),
            helper.make_node("Mul", ["a", "b_col"], ["scaled"], name="scale_rows"),
            helper.make_node("Mul", ["b", "two"], ["b_twice"], name="double_b"),
        ],
        "multi_io",
        [
            helper.make_tensor_value_info("a", TensorProto.FLOAT, ["N", 3]),
            helper.make_tensor_value_info("b", TensorProto.INT64, ["N"]),
        ],
        [
            helper.make_tensor_value_info("sum", TensorProto.FLOAT, ["N", 3]),
            helper.make_tensor_value_info("scaled", TensorProto.FLOAT, ["N", 3]),
            helper.make_tensor_value_info("b_twice", TensorProto.INT64, ["N"]),
        ],
        initializer=[
            numpy_helper.from_array(np.array(1.0, np.float32), "one"),
            numpy_helper.from_array(np.array(2, np.int64), "two"),
            numpy_helper.from_array(np.array([1], np.int64), "axis1"),
        ],
    )
    path = save_model(TEST_MODELS / "multi_io", finish_model(g), {"max_batch_size": 8})

    sess = session(path)
    a = np.random.default_rng(2).random((5, 3), dtype=np.float32)
    b = np.arange(5, dtype=np.int64)
    s, sc, b2 = sess.run(["sum", "scaled", "b_twice"], {"a": a, "b": b})
    # Independent check of the graph against numpy.
    assert np.array_equal(s, a + np.float32(1)) and np.array_equal(sc, a * b[:, None].astype(np.float32))
    assert np.array_equal(b2, b * 2)
    write_json(
        FIXTURES / "multi_io_expected.json",
        {
            "inputs": {"a": f32_list(a), "b": int_list(b)},
            "outputs": {"sum": f32_list(s), "scaled": f32_list(sc), "b_twice": int_list(b2)},
        },
    )
    print(f"multi_io: {rel(path)} ({path.stat().st_size} B) {describe(sess)}")


def make_fixed_batch() -> None:
    g = helper.make_graph(
        [helper.make_node("Mul", ["x", "x"], ["y"], name="square")],
        "fixed_batch",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 2])],
    )
    path = save_model(TEST_MODELS / "fixed_batch", finish_model(g), {})
    sess = session(path)
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    assert np.array_equal(sess.run(["y"], {"x": x})[0], x * x)
    try:
        sess.run(["y"], {"x": np.zeros((5, 2), np.float32)})
        rejected = "NOT rejected"
    except Exception:  # onnxruntime raises InvalidArgument for the wrong dimension
        rejected = "rejected"
    print(f"fixed_batch: {rel(path)} ({path.stat().st_size} B) {describe(sess)}; batch 5 {rejected}")


def make_scalar_out() -> None:
    g = helper.make_graph(
        [helper.make_node("ReduceSum", ["x", "axis1"], ["total"], keepdims=0, name="row_sum")],
        "scalar_out",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("total", TensorProto.FLOAT, ["N"])],
        initializer=[numpy_helper.from_array(np.array([1], np.int64), "axis1")],
    )
    path = save_model(TEST_MODELS / "scalar_out", finish_model(g), {})
    sess = session(path)
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    assert np.array_equal(sess.run(["total"], {"x": x})[0], np.array([6, 22], np.float32))
    print(f"scalar_out: {rel(path)} ({path.stat().st_size} B) {describe(sess)}")


def make_scalar_out_v2() -> None:
    """scalar_out's signature, different values (row sums * 2): the hot-reload
    tests replace scalar_out's model.onnx with it and tell the versions apart."""
    g = helper.make_graph(
        [
            helper.make_node("ReduceSum", ["x", "axis1"], ["sum"], keepdims=0, name="row_sum"),
            helper.make_node("Mul", ["sum", "two"], ["total"], name="double"),
        ],
        "scalar_out_v2",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("total", TensorProto.FLOAT, ["N"])],
        initializer=[
            numpy_helper.from_array(np.array([1], np.int64), "axis1"),
            numpy_helper.from_array(np.array(2.0, np.float32), "two"),
        ],
    )
    path = save_model(TEST_MODELS / "scalar_out_v2", finish_model(g), {})
    sess = session(path)
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    assert np.array_equal(sess.run(["total"], {"x": x})[0], np.array([12, 44], np.float32))
    print(f"scalar_out_v2: {rel(path)} ({path.stat().st_size} B) {describe(sess)}")


def make_broken() -> None:
    folder = TEST_MODELS / "broken"
    write_bytes(folder / "model.onnx", b"not an onnx file\n")
    write_settings(folder, {})
    try:
        session(folder / "model.onnx")
        status = "UNEXPECTEDLY loaded"
    except Exception:
        status = "fails to load, as intended"
    print(f"broken: {rel(folder / 'model.onnx')} {status}")


def make_varlen() -> None:
    """x FP32[N, M] with both dims dynamic -> y = 2x: requests with different M must never share a batch."""
    g = helper.make_graph(
        [helper.make_node("Mul", ["x", "two"], ["y"], name="double")],
        "varlen",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "M"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", "M"])],
        initializer=[numpy_helper.from_array(np.array(2.0, np.float32), "two")],
    )
    settings = {"max_batch_size": 16, "max_batch_time": 0.05, "batch_policy": "fixed"}
    path = save_model(TEST_MODELS / "varlen", finish_model(g), settings)
    sess = session(path)
    for shape in [(2, 3), (1, 5)]:
        x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
        assert np.array_equal(sess.run(["y"], {"x": x})[0], x * 2)
    print(f"varlen: {rel(path)} ({path.stat().st_size} B) {describe(sess)}")


# Work of the `slow` model: SLOW_MATMULS products of SLOW_DIM x SLOW_DIM matrices per run,
# whatever the batch size (about 80 ms on 2 cores of a 2020s x86 CPU).
SLOW_DIM = 512
SLOW_MATMULS = 16


def make_slow() -> None:
    """x FP32[N, 4] -> y = 2x, after a fixed amount of work that depends on x (so ONNX Runtime
    cannot fold it away) but not on N: a batch takes as long as one request, for queue,
    deadline and fairness tests. The work matrix W is built in the graph (Range -> Cos), so the
    file stays tiny; ONNX Runtime folds W to a constant when the session loads."""
    d = SLOW_DIM
    nodes = [
        helper.make_node("Range", ["r_start", "r_limit", "r_delta"], ["w_idx"], name="w_index"),
        helper.make_node("Reshape", ["w_idx", "w_shape"], ["w_square"], name="w_square"),
        helper.make_node("Cos", ["w_square"], ["w_cos"], name="w_cos"),
        helper.make_node("Mul", ["w_cos", "w_scale"], ["W"], name="w_scale"),
        # The work starts from W + sum(x), so it depends on the input.
        helper.make_node("ReduceSum", ["x"], ["x_sum"], keepdims=0, name="sum_x"),
        helper.make_node("Add", ["W", "x_sum"], ["a0"], name="seed_work"),
    ]
    for i in range(SLOW_MATMULS):
        nodes.append(helper.make_node("MatMul", [f"a{i}", "W"], [f"a{i + 1}"], name=f"work{i}"))
    nodes += [
        # y = 2x + 0 * mean(work): the work is needed for y but does not change it.
        helper.make_node("ReduceMean", [f"a{SLOW_MATMULS}"], ["work_mean"], keepdims=0, name="mean_work"),
        helper.make_node("Mul", ["work_mean", "zero"], ["work_zero"], name="zero_work"),
        helper.make_node("Mul", ["x", "two"], ["x2"], name="double_x"),
        helper.make_node("Add", ["x2", "work_zero"], ["y"], name="keep_work"),
    ]
    scalar = lambda v, name: numpy_helper.from_array(np.array(v, np.float32), name)  # noqa: E731
    g = helper.make_graph(
        nodes,
        "slow",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
        initializer=[
            scalar(0.0, "r_start"),
            scalar(float(d * d), "r_limit"),
            scalar(1.0, "r_delta"),
            numpy_helper.from_array(np.array([d, d], np.int64), "w_shape"),
            scalar(1.0 / np.sqrt(d), "w_scale"),
            scalar(0.0, "zero"),
            scalar(2.0, "two"),
        ],
    )
    path = save_model(TEST_MODELS / "slow", finish_model(g), {"max_batch_size": 8})

    import time

    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    timings = []
    for rows in [1, 1, 8, 1]:
        x = np.random.default_rng(3).random((rows, 4), dtype=np.float32) * 10
        start = time.perf_counter()
        (y,) = sess.run(["y"], {"x": x})
        timings.append(f"{rows} rows {1000 * (time.perf_counter() - start):.0f} ms")
        if not np.array_equal(y, x * 2):
            sys.exit(f"make_models: error: slow model: y != 2x for {rows} rows (work not finite?)")
    print(f"slow: {rel(path)} ({path.stat().st_size} B) {describe(sess)}; runs: {', '.join(timings[1:])}")


# Width of the `identity` model: small, so that a request costs its path through the
# server (HTTP, JSON, batching, the session call) and not the copy of its data.
IDENTITY_WIDTH = 16


def make_identity() -> None:
    """input FP32[N, 16] -> output = input (Identity): the request-path bench's model."""
    g = helper.make_graph(
        [helper.make_node("Identity", ["input"], ["output"], name="identity")],
        "identity",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", IDENTITY_WIDTH])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["N", IDENTITY_WIDTH])],
    )
    path = save_model(TEST_MODELS / "identity", finish_model(g), {})
    sess = session(path)
    x = np.random.default_rng(4).random((3, IDENTITY_WIDTH), dtype=np.float32)
    (y,) = sess.run(["output"], {"input": x})
    if not np.array_equal(y, x):
        sys.exit("make_models: error: identity model: output != input")
    print(f"identity: {rel(path)} ({path.stat().st_size} B) {describe(sess)}")


# --------------------------------------------------------------------------- main


def make_detector() -> None:
    """A detector's tail: candidate boxes [x1, y1, x2, y2, score] in, the
    ones scoring over 0.5 out (`dets`) with their indices (`keep`), as
    detectors end after non-maximum suppression: a data-dependent count of
    rows, not the batch. Its dims carry exporter-generated names, so only
    warm-up or a served batch can show that it does not batch."""
    g = helper.make_graph(
        [
            helper.make_node("Gather", ["boxes", "four"], ["score"], axis=1, name="score"),
            helper.make_node("Greater", ["score", "half"], ["kept"], name="over_half"),
            helper.make_node("Compress", ["boxes", "kept"], ["dets"], axis=0, name="compress"),
            helper.make_node("NonZero", ["kept"], ["nz"], name="nonzero"),
            helper.make_node("Squeeze", ["nz", "zero"], ["keep"], name="indices"),
        ],
        "detector",
        [helper.make_tensor_value_info("boxes", TensorProto.FLOAT, ["unk__0", 5])],
        [
            helper.make_tensor_value_info("dets", TensorProto.FLOAT, ["unk__1", 5]),
            helper.make_tensor_value_info("keep", TensorProto.INT64, ["unk__2"]),
        ],
        initializer=[
            numpy_helper.from_array(np.array(4, np.int64), "four"),
            numpy_helper.from_array(np.array(0.5, np.float32), "half"),
            numpy_helper.from_array(np.array([0], np.int64), "zero"),
        ],
    )
    path = save_model(TEST_MODELS / "detector", finish_model(g), None)
    sess = session(path)
    boxes = np.array([[0, 0, 1, 1, 0.9], [0, 0, 2, 2, 0.1], [1, 1, 3, 3, 0.7]], np.float32)
    dets, keep = sess.run(None, {"boxes": boxes})
    assert np.array_equal(dets, boxes[[0, 2]]) and np.array_equal(keep, [0, 2])
    print(f"detector: {rel(path)} ({path.stat().st_size} B) {describe(sess)}")


def make_stateful() -> None:
    """A voice-activity model's shape: audio `input` [batch, samples], a
    recurrent `state` [2, batch, 3] (batch on axis 1) and a 0-d sample rate
    `sr`; out a probability `output` [batch, 1] and the next `stateN`
    [2, batch, 3]. A reflect pad of 2 needs at least 3 samples, so a
    zero-filled warm-up of 1 sample is rejected. Each row depends on its own
    row alone, so batching along `state`'s axis 1 gives each request what it
    would get alone."""
    w = np.array([[0.5, -1.0, 2.0]], np.float32)
    g = helper.make_graph(
        [
            helper.make_node("Pad", ["input", "pads"], ["padded"], mode="reflect", name="reflect_pad"),
            helper.make_node("ReduceMean", ["padded"], ["mean"], axes=[1], keepdims=1, name="mean"),
            helper.make_node("MatMul", ["mean", "w"], ["proj"], name="proj"),
            helper.make_node("Gather", ["state", "i0"], ["s0"], axis=0, name="state0"),
            helper.make_node("Gather", ["state", "i1"], ["s1"], axis=0, name="state1"),
            helper.make_node("Mul", ["s1", "halfc"], ["s1h"], name="half_state1"),
            helper.make_node("Add", ["proj", "s0"], ["a"], name="add0"),
            helper.make_node("Add", ["a", "s1h"], ["b"], name="add1"),
            helper.make_node("Cast", ["sr"], ["srf"], to=TensorProto.FLOAT, name="sr_float"),
            helper.make_node("Div", ["srf", "rate"], ["scale"], name="scale"),
            helper.make_node("Mul", ["b", "scale"], ["c"], name="scaled"),
            helper.make_node("Tanh", ["c"], ["h"], name="tanh"),
            helper.make_node("ReduceSum", ["h", "axis1"], ["hs"], keepdims=1, name="sum"),
            helper.make_node("Sigmoid", ["hs"], ["output"], name="prob"),
            helper.make_node("Mul", ["h", "halfc"], ["hh"], name="half_h"),
            helper.make_node("Unsqueeze", ["h", "zero"], ["u0"], name="u0"),
            helper.make_node("Unsqueeze", ["hh", "zero"], ["u1"], name="u1"),
            helper.make_node("Concat", ["u0", "u1"], ["stateN"], axis=0, name="next_state"),
        ],
        "stateful",
        [
            helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", "samples"]),
            helper.make_tensor_value_info("state", TensorProto.FLOAT, [2, "batch", 3]),
            helper.make_tensor_value_info("sr", TensorProto.INT64, []),
        ],
        [
            helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", 1]),
            helper.make_tensor_value_info("stateN", TensorProto.FLOAT, [2, "batch", 3]),
        ],
        initializer=[
            numpy_helper.from_array(np.array([0, 2, 0, 2], np.int64), "pads"),
            numpy_helper.from_array(np.array([1], np.int64), "axis1"),
            numpy_helper.from_array(np.array([0], np.int64), "zero"),
            numpy_helper.from_array(w, "w"),
            numpy_helper.from_array(np.array(0, np.int64), "i0"),
            numpy_helper.from_array(np.array(1, np.int64), "i1"),
            numpy_helper.from_array(np.array(0.5, np.float32), "halfc"),
            numpy_helper.from_array(np.array(16000.0, np.float32), "rate"),
        ],
    )
    path = save_model(TEST_MODELS / "stateful", finish_model(g), None)
    sess = session(path)
    x = np.arange(8, dtype=np.float32).reshape(2, 4) / 8
    state = np.zeros((2, 2, 3), np.float32)
    out, state_n = sess.run(None, {"input": x, "state": state, "sr": np.array(16000, np.int64)})
    mean = np.pad(x, ((0, 0), (2, 2)), mode="reflect").mean(axis=1, keepdims=True)
    h = np.tanh(mean @ w)
    assert np.allclose(out, 1 / (1 + np.exp(-h.sum(axis=1, keepdims=True))), atol=1e-6)
    assert state_n.shape == (2, 2, 3) and np.allclose(state_n[1], h * 0.5, atol=1e-6)
    try:
        sess.run(None, {"input": x[:, :1], "state": state, "sr": np.array(16000, np.int64)})
        one = "NOT rejected"
    except Exception:  # onnxruntime: a reflect pad of 2 needs 3 samples
        one = "rejected"
    print(f"stateful: {rel(path)} ({path.stat().st_size} B) {describe(sess)}; 1 sample {one}")


def make_generated_names() -> None:
    """A classifier exported with a different generated name for one batch
    dim on each side (`unk__214` in, `unk__215` out): it must batch."""
    w = np.arange(8, dtype=np.float32).reshape(4, 2) / 8
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="logits")],
        "generated_names",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["unk__214", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["unk__215", 2])],
        initializer=[numpy_helper.from_array(w, "w")],
    )
    path = save_model(TEST_MODELS / "generated_names", finish_model(g), None)
    sess = session(path)
    x = np.ones((3, 4), np.float32)
    assert np.allclose(sess.run(None, {"x": x})[0], x @ w)
    print(f"generated_names: {rel(path)} ({path.stat().st_size} B) {describe(sess)}")


def make_scalars() -> None:
    """Every datatype as a 0-d tensor, in and out (Identity): no input has a
    batch dim, so the model runs each request alone."""
    inputs, outputs, nodes = [], [], []
    for suffix, onnx_type, _ in DTYPES:
        inputs.append(helper.make_tensor_value_info(f"in_{suffix}", onnx_type, []))
        outputs.append(helper.make_tensor_value_info(f"out_{suffix}", onnx_type, []))
        nodes.append(helper.make_node("Identity", [f"in_{suffix}"], [f"out_{suffix}"], name=f"id_{suffix}"))
    g = helper.make_graph(nodes, "scalars", inputs, outputs)
    path = save_model(TEST_MODELS / "scalars", finish_model(g), None)
    sess = session(path)
    feeds = {f"in_{s}": sample(s, dt, 1).reshape(-1)[0].reshape(()) if s != "bytes" else np.array("s0", dtype=object)
             for s, _, dt in DTYPES}
    feeds = {k: np.asarray(v) for k, v in feeds.items()}
    for (suffix, _, _), out in zip(DTYPES, sess.run(None, feeds)):
        assert out.shape == () and out == feeds[f"in_{suffix}"], suffix
    print(f"scalars: {rel(path)} ({path.stat().st_size} B): 0-d Identity round-trip OK")


def make_strings() -> None:
    """BYTES in, the same out: x BYTES[N] -> y (Identity), for what many
    short strings cost once decoded."""
    g = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"], name="id_strings")],
        "strings",
        [helper.make_tensor_value_info("x", TensorProto.STRING, ["N"])],
        [helper.make_tensor_value_info("y", TensorProto.STRING, ["N"])],
    )
    path = save_model(TEST_MODELS / "strings", finish_model(g), {})
    sess = session(path)
    x = np.array(["a", "", "é"], dtype=object)
    assert list(sess.run(None, {"x": x})[0]) == list(x)
    print(f"strings: {rel(path)} ({path.stat().st_size} B) {describe(sess)}")


# The weights of `external`: y = x . w, w in weights.bin (model.onnx names the file).
EXTERNAL_W = np.array([1, 2, 3, 4], np.float32)
EXTERNAL_W_V2 = np.array([10, 20, 30, 40], np.float32)


def make_external() -> None:
    """x FP32[N, 4] -> y FP32[N] = x . w, with w stored as external data in
    weights.bin (as models over 2 GB must be): the repository tests swap
    weights.bin for tests/fixtures/external-weights-v2.bin (w * 10) beside a
    byte-identical model.onnx, and take it away and back."""
    folder = TEST_MODELS / "external"
    w = numpy_helper.from_array(EXTERNAL_W, "w")
    w.ClearField("raw_data")
    w.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "weights.bin"), ("offset", "0"), ("length", str(EXTERNAL_W.nbytes))):
        entry = w.external_data.add()
        entry.key, entry.value = key, value
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="dot")],
        "external",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N"])],
        initializer=[w],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)], producer_name=PRODUCER)
    m.ir_version = IR_VERSION
    write_bytes(folder / "weights.bin", EXTERNAL_W.tobytes())
    path = save_model(folder, m, {})
    onnx.checker.check_model(str(path), full_check=True)
    write_bytes(FIXTURES / "external-weights-v2.bin", EXTERNAL_W_V2.tobytes())
    sess = session(path)
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    assert np.array_equal(sess.run(["y"], {"x": x})[0], x @ EXTERNAL_W)
    print(f"external: {rel(path)} ({path.stat().st_size} B) + weights.bin {describe(sess)}")


def make_simple_identity() -> None:
    """Triton's example repository's `simple_identity` is a Python-backend
    model (BYTES INPUT0 -> OUTPUT0, unchanged); its stand-in is an ONNX
    Identity with the same config.pbtxt, its platform ONNX."""
    folder = FIXTURES / "triton" / "model_repository" / "simple_identity"
    g = helper.make_graph(
        [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"], name="identity")],
        "simple_identity",
        [helper.make_tensor_value_info("INPUT0", TensorProto.STRING, ["batch", "n"])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.STRING, ["batch", "n"])],
    )
    path = folder / "1" / "model.onnx"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_bytes(path, finish_model(g).SerializeToString())
    original = (FIXTURES / "triton" / "simple_identity.config.pbtxt.orig").read_text()
    config = original.replace('backend: "python"', 'platform: "onnxruntime_onnx"')
    assert config != original
    (folder / "config.pbtxt").write_text(config)
    sess = session(path)
    x = np.array([["a", "bc"]], dtype=object)
    assert sess.run(None, {"INPUT0": x})[0].tolist() == x.tolist()
    print(f"simple_identity: {rel(path)} ({path.stat().st_size} B) {describe(sess)}")


MAKERS = {
    "simple_identity": make_simple_identity,
    "digits": make_digits,
    "mlp": make_mlp,
    "dtypes": make_dtypes,
    "bf16": make_bf16,
    "multi_io": make_multi_io,
    "fixed_batch": make_fixed_batch,
    "scalar_out": make_scalar_out,
    "scalar_out_v2": make_scalar_out_v2,
    "broken": make_broken,
    "varlen": make_varlen,
    "slow": make_slow,
    "identity": make_identity,
    "detector": make_detector,
    "stateful": make_stateful,
    "generated_names": make_generated_names,
    "scalars": make_scalars,
    "strings": make_strings,
    "external": make_external,
}


def main() -> None:
    names = sys.argv[1:] or list(MAKERS)
    unknown = [n for n in names if n not in MAKERS]
    if unknown:
        sys.exit(f"make_models: error: unknown model(s) {', '.join(unknown)}; known: {', '.join(MAKERS)}")
    print(f"onnx {onnx.__version__}, onnxruntime {ort.__version__}, numpy {np.__version__}")
    for name in names:
        MAKERS[name]()


if __name__ == "__main__":
    main()
