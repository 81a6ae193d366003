"""Every request answered as Python ONNX Runtime answers it alone.

Computes each request's expected outputs with Python ONNX Runtime (the
release sluice loads) on the model file and that request alone, then sends
every request to sluice over V2 JSON, the binary extension and gRPC (the
standard tritonclient), first one at a time, then all of them at once,
`--together` times over, so that requests to the model arrive together and
may share batches. Exit status 0 when every answer equals its expected one.

Usage: alone.py MODEL.onnx NAME REQUESTS.json --http HOST:PORT --grpc HOST:PORT [--together N]
  REQUESTS.json: a list of requests, each {input name: {"datatype": "FP32",
                 "shape": [...], "data": [flat values]}}
"""

import argparse
import concurrent.futures
import json
import os
import sys
import threading

import numpy as np
import onnxruntime as ort

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conformance import infer  # noqa: E402

NUMPY = {
    "BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
    "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64,
    "FP16": np.float16, "FP32": np.float32, "FP64": np.float64, "BYTES": np.object_,
}


def tensor(spec) -> np.ndarray:
    if spec["datatype"] == "BYTES":
        flat = [s.encode() for s in spec["data"]]
        return np.array(flat, dtype=np.object_).reshape(spec["shape"])
    return np.array(spec["data"], dtype=NUMPY[spec["datatype"]]).reshape(spec["shape"])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("name")
    ap.add_argument("requests")
    ap.add_argument("--http", required=True)
    ap.add_argument("--grpc", required=True)
    ap.add_argument("--together", type=int, default=4)
    args = ap.parse_args()

    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(args.model, opts, providers=["CPUExecutionProvider"])
    out_names = [o.name for o in sess.get_outputs()]
    with open(args.requests) as f:
        requests = json.load(f)
    cases = []
    for i, r in enumerate(requests):
        inputs = {name: tensor(spec) for name, spec in r.items()}
        feeds = {
            k: (np.vectorize(lambda b: b.decode(), otypes=[object])(v) if v.dtype == np.object_ else v)
            for k, v in inputs.items()
        }
        expected = sess.run(None, feeds)
        cases.append({"name": args.name, "inputs": inputs, "outputs": dict(zip(out_names, expected)), "i": i})

    protocols = ["json", "binary", "grpc"]
    clients = {
        "json": httpclient.InferenceServerClient(args.http, network_timeout=60),
        "binary": httpclient.InferenceServerClient(args.http, network_timeout=60),
        "grpc": grpcclient.InferenceServerClient(args.grpc),
    }
    failed = []
    for case in cases:
        for p in protocols:
            if (why := infer(case, p, clients)) is not None:
                failed.append(f"request {case['i']} over {p}, alone: {why}")
    local = threading.local()

    def together(case, p):
        if not hasattr(local, "clients"):
            local.clients = {
                "json": httpclient.InferenceServerClient(args.http, network_timeout=60),
                "binary": httpclient.InferenceServerClient(args.http, network_timeout=60),
                "grpc": clients["grpc"],
            }
        return infer(case, p, local.clients)

    sent = 0
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        jobs = []
        for _ in range(args.together):
            for case in cases:
                for p in protocols:
                    jobs.append((pool.submit(together, case, p), case["i"], p))
        for job, i, p in jobs:
            sent += 1
            if (why := job.result()) is not None:
                failed.append(f"request {i} over {p}, together: {why}")
    print(f"{args.name}: {len(cases)} requests x {len(protocols)} protocols alone, then {sent} together: "
          f"{len(failed)} wrong")
    for f in failed[:20]:
        print(f"  {f}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
