#!/usr/bin/env python3
"""NVIDIA's tritonclient (HTTP and gRPC) against a running sluice, unchanged.

Run by tests/standard_clients.rs with the interpreter of .venv-clients
(scripts/setup-test-clients.sh), against a server whose repository holds the
fixture models `dtypes`, `bf16`, `digits` and `mlp`:

    .venv-clients/bin/python tests/clients/test_tritonclient.py \
        --http 127.0.0.1:8080 --grpc 127.0.0.1:8081 --fixtures tests/fixtures

Expected values come from elsewhere, never from sluice: the `dtypes` and
`bf16` models are identities (the values sent), `digits` and `mlp` outputs
were computed by Python onnxruntime (tests/fixtures/*_expected.json).
Prints one line per check and closes with "N passed, N failed"; exits 1 on
any failure.
"""

import argparse
import json
import sys
import traceback
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

# (input suffix of the dtypes model, protocol datatype, numpy dtype)
DTYPES = [
    ("bool", "BOOL", np.bool_),
    ("uint8", "UINT8", np.uint8),
    ("uint16", "UINT16", np.uint16),
    ("uint32", "UINT32", np.uint32),
    ("uint64", "UINT64", np.uint64),
    ("int8", "INT8", np.int8),
    ("int16", "INT16", np.int16),
    ("int32", "INT32", np.int32),
    ("int64", "INT64", np.int64),
    ("fp16", "FP16", np.float16),
    ("fp32", "FP32", np.float32),
    ("fp64", "FP64", np.float64),
    ("bytes", "BYTES", np.object_),
]

RESULTS = {"passed": 0, "failed": 0}


def check(name):
    """Runs the decorated function as one named check."""

    def wrap(fn):
        try:
            fn()
            RESULTS["passed"] += 1
            print(f"ok   {name}", flush=True)
        except Exception:  # noqa: BLE001 - report every failure and go on
            RESULTS["failed"] += 1
            print(f"FAIL {name}\n{traceback.format_exc()}", flush=True)
        return fn

    return wrap


def sample(suffix, np_dtype, rows=3):
    """Values that exercise each type's range (extremes, negatives, non-ASCII)."""
    n = rows * 2
    if suffix == "bool":
        return (np.arange(n) % 3 == 0).reshape(rows, 2)
    if suffix == "bytes":
        words = ["a", "", "h\u00e9llo", "\u65e5\u672c", "x" * 40, "end"]
        return np.array([w.encode() for w in words[:n]], dtype=np.object_).reshape(rows, 2)
    if np.issubdtype(np_dtype, np.integer):
        info = np.iinfo(np_dtype)
        vals = [info.min, info.max, 0, 1, info.max // 3, info.min // 5]
        return np.array(vals[:n], dtype=np_dtype).reshape(rows, 2)
    vals = [0.0, -1.5, 0.099975586, 1024.25, -65504.0, 3.0e-5]
    if np_dtype != np.float16:
        vals[5] = 1.0e-30
    return np.array(vals[:n], dtype=np_dtype).reshape(rows, 2)


def same(got, want, what):
    assert got is not None, f"{what}: output missing"
    assert got.shape == want.shape, f"{what}: shape {got.shape}, want {want.shape}"
    if want.dtype == np.object_:
        # JSON BYTES come back as str, binary ones as bytes.
        as_bytes = [x.encode() if isinstance(x, str) else bytes(x) for x in got.flatten()]
        assert as_bytes == list(want.flatten()), f"{what}: {got} != {want}"
    else:
        assert got.dtype == want.dtype, f"{what}: dtype {got.dtype}, want {want.dtype}"
        assert np.array_equal(got, want), f"{what}: {got} != {want}"


def http_infer(client, model, arrays, binary, outputs=None, datatypes=None):
    inputs = []
    for name, arr in arrays.items():
        dt = (datatypes or {}).get(name) or _datatype(arr)
        i = httpclient.InferInput(name, list(arr.shape), dt)
        i.set_data_from_numpy(arr, binary_data=binary)
        inputs.append(i)
    outs = None if outputs is None else [httpclient.InferRequestedOutput(n, binary_data=b) for n, b in outputs]
    return client.infer(model, inputs, outputs=outs)


def grpc_infer(client, model, arrays, outputs=None, datatypes=None):
    inputs = []
    for name, arr in arrays.items():
        dt = (datatypes or {}).get(name) or _datatype(arr)
        i = grpcclient.InferInput(name, list(arr.shape), dt)
        i.set_data_from_numpy(arr)
        inputs.append(i)
    outs = None if outputs is None else [grpcclient.InferRequestedOutput(n) for n in outputs]
    return client.infer(model, inputs, outputs=outs)


def _datatype(arr):
    return np_to_triton_dtype(arr.dtype)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--http", required=True)
    ap.add_argument("--grpc", required=True)
    ap.add_argument("--fixtures", required=True)
    args = ap.parse_args()
    fixtures = Path(args.fixtures)
    http = httpclient.InferenceServerClient(args.http)
    grpc = grpcclient.InferenceServerClient(args.grpc)

    @check("health and server metadata (HTTP, gRPC)")
    def _():
        assert http.is_server_live() and http.is_server_ready()
        assert grpc.is_server_live() and grpc.is_server_ready()
        for meta in (http.get_server_metadata(), grpc.get_server_metadata(as_json=True)):
            assert meta["name"] == "sluice", meta
            for ext in ("binary_tensor_data", "model_repository", "model_configuration", "statistics"):
                assert ext in meta["extensions"], meta
        assert http.is_model_ready("mlp") and grpc.is_model_ready("mlp")

    @check("model metadata and config (HTTP, gRPC)")
    def _():
        hm, gm = http.get_model_metadata("mlp"), grpc.get_model_metadata("mlp", as_json=True)
        for m in (hm, gm):
            assert m["platform"] == "onnxruntime_onnx", m
            assert [int(d) for d in m["inputs"][0]["shape"]] == [-1, 784], m
        hc = http.get_model_config("mlp")
        gc = grpc.get_model_config("mlp", as_json=True)["config"]
        for c in (hc, gc):
            assert c["name"] == "mlp" and c["platform"] == "onnxruntime_onnx", c
            assert int(c["max_batch_size"]) == 64, c
            assert c["input"][0]["data_type"] == "TYPE_FP32", c
            assert [int(d) for d in c["input"][0]["dims"]] == [784], c
            assert [int(d) for d in c["output"][0]["dims"]] == [10], c
            assert int(c["dynamic_batching"]["max_queue_delay_microseconds"]) == 2000, c
        bytes_in = next(t for t in http.get_model_config("dtypes")["input"] if t["name"] == "in_bytes")
        assert bytes_in["data_type"] == "TYPE_STRING", bytes_in

    # The dtypes model needs every input in each request; each check sends
    # all 13 and compares all 13 outputs, so every datatype goes every way.
    arrays = {f"in_{s}": sample(s, t) for s, _, t in DTYPES}

    def check_dtypes(result, what):
        for s, dt, _ in DTYPES:
            same(result.as_numpy(f"out_{s}"), arrays[f"in_{s}"], f"{what} {dt}")

    def http_dtypes(input_binary, output_binary):
        inputs = []
        for i, (s, dt, _) in enumerate(DTYPES):
            inp = httpclient.InferInput(f"in_{s}", [3, 2], dt)
            inp.set_data_from_numpy(arrays[f"in_{s}"], binary_data=input_binary(i))
            inputs.append(inp)
        outputs = [
            httpclient.InferRequestedOutput(f"out_{s}", binary_data=output_binary(i))
            for i, (s, _, _) in enumerate(DTYPES)
        ]
        return http.infer("dtypes", inputs, outputs=outputs)

    @check("every datatype: HTTP binary in and out")
    def _():
        r = http_dtypes(lambda i: True, lambda i: True)
        check_dtypes(r, "HTTP binary")
        assert all(r.get_output(f"out_{s}")["parameters"]["binary_data_size"] > 0 for s, _, _ in DTYPES)

    @check("every datatype: HTTP JSON in and out (binary_data=False)")
    def _():
        r = http_dtypes(lambda i: False, lambda i: False)
        check_dtypes(r, "HTTP JSON")
        assert all("data" in r.get_output(f"out_{s}") for s, _, _ in DTYPES)

    @check("every datatype: HTTP binary and JSON mixed in one request and one response")
    def _():
        check_dtypes(http_dtypes(lambda i: i % 2 == 0, lambda i: i % 3 == 0), "HTTP mixed")

    @check("every datatype: HTTP binary in, every output binary by default (no outputs named)")
    def _():
        check_dtypes(http_infer(http, "dtypes", arrays, True), "HTTP default outputs")

    @check("every datatype: gRPC (raw_input_contents / raw_output_contents)")
    def _():
        check_dtypes(grpc_infer(grpc, "dtypes", arrays), "gRPC")

    bf16 = np.array([[1.5, -2.0], [0.0078125, 3.0e38], [-0.5, 256.0]], dtype=np.float32)

    @check("BF16: HTTP binary and gRPC (values exactly representable in bfloat16)")
    def _():
        for r in (
            http_infer(http, "bf16", {"x": bf16}, True, datatypes={"x": "BF16"}),
            grpc_infer(grpc, "bf16", {"x": bf16}, datatypes={"x": "BF16"}),
        ):
            # `y` is BF16 (the client widens it to float32), `f` = Cast(x, FLOAT).
            want = bf16.astype(np.float32).view(np.uint32) & 0xFFFF0000
            assert np.array_equal(r.as_numpy("y").view(np.uint32), want), r.as_numpy("y")
            assert np.array_equal(r.as_numpy("f").view(np.uint32), want), r.as_numpy("f")

    digits = json.loads((fixtures / "digits_expected.json").read_text())
    x = np.array(digits["inputs"], dtype=np.float32)
    labels = np.array(digits["labels"], dtype=np.int64)
    probs = np.array(digits["probabilities"], dtype=np.float32)

    def check_digits(r, what):
        assert np.array_equal(r.as_numpy("label"), labels), what
        assert np.allclose(r.as_numpy("probabilities"), probs, atol=1e-5), what

    @check("digits (64 rows, real data): HTTP binary, HTTP JSON, gRPC")
    def _():
        check_digits(http_infer(http, "digits", {"input": x}, True), "HTTP binary")
        check_digits(
            http_infer(http, "digits", {"input": x}, False, outputs=[("label", False), ("probabilities", False)]),
            "HTTP JSON",
        )
        check_digits(grpc_infer(grpc, "digits", {"input": x}), "gRPC")

    mlp = json.loads((fixtures / "mlp_expected.json").read_text())
    mx = np.array(mlp["inputs"], dtype=np.float32)
    logits = np.array(mlp["logits"], dtype=np.float32)

    @check("mlp (16 rows): HTTP binary, HTTP JSON, gRPC")
    def _():
        for what, r in (
            ("HTTP binary", http_infer(http, "mlp", {"input": mx}, True)),
            ("HTTP JSON", http_infer(http, "mlp", {"input": mx}, False, outputs=[("logits", False)])),
            ("gRPC", grpc_infer(grpc, "mlp", {"input": mx})),
        ):
            assert np.allclose(r.as_numpy("logits"), logits, rtol=1e-4, atol=1e-4), what

    @check("statistics count what ran (HTTP, gRPC)")
    def _():
        before = http.get_inference_statistics("mlp")["model_stats"][0]
        grpc_infer(grpc, "mlp", {"input": mx[:3]})
        after = grpc.get_inference_statistics("mlp", as_json=True)["model_stats"][0]
        assert after["name"] == "mlp" and after["version"] == "1", after
        assert int(after["inference_count"]) == int(before["inference_count"]) + 3, (before, after)
        s = after["inference_stats"]
        assert int(s["success"]["count"]) == int(before["inference_stats"]["success"]["count"]) + 1
        c = [int(s[k]["count"]) for k in ("compute_input", "compute_infer", "compute_output")]
        assert c[0] == c[1] == c[2] > 0, s

    @check("repository index (HTTP, gRPC)")
    def _():
        for idx in (http.get_model_repository_index(), grpc.get_model_repository_index(as_json=True)["models"]):
            by = {m["name"]: m for m in idx}
            assert by["mlp"]["state"] == "READY", idx
            assert by["digits"]["version"] == "1", idx

    @check("errors: status codes and messages name the problem")
    def _():
        bad = np.zeros((2, 5), dtype=np.float32)
        for fn, code in (
            (lambda: grpc_infer(grpc, "mlp", {"input": bad}), "StatusCode.INVALID_ARGUMENT"),
            (lambda: grpc_infer(grpc, "nope", {"input": bad}), "StatusCode.NOT_FOUND"),
            (lambda: http_infer(http, "mlp", {"input": bad}, True), "400"),
            (lambda: http_infer(http, "nope", {"input": bad}, True), "404"),
        ):
            try:
                fn()
            except InferenceServerException as e:
                assert str(e.status()) == code, (e.status(), e.message())
                assert "input" in e.message() or "nope" in e.message(), e.message()
            else:
                raise AssertionError(f"no error, expected {code}")

    print(f"{RESULTS['passed']} passed, {RESULTS['failed']} failed")
    return 0 if RESULTS["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
