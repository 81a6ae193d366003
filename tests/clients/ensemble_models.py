"""The second model of tests/text.rs's Triton ensemble, and what the two
models give called in turn by Python ONNX Runtime.

Writes REPO/scale/1/model.onnx: x INT32[-1, 16] -> y = 3x + 1 (with its
config.pbtxt), then for the (INPUT0, INPUT1) pairs on stdin runs Triton's
`simple` (OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1) and feeds
its OUTPUT0 to `scale`; prints [[scaled sum, difference], ...] as JSON.

Usage: ensemble_models.py REPO < pairs.json
"""

import json
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

CONFIG = """name: "scale"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "x" data_type: TYPE_INT32 dims: [ 16 ] } ]
output [ { name: "y" data_type: TYPE_INT32 dims: [ 16 ] } ]
"""


def main() -> None:
    repo = Path(sys.argv[1])
    folder = repo / "scale" / "1"
    folder.mkdir(parents=True, exist_ok=True)
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "three"], ["t"]), helper.make_node("Add", ["t", "one"], ["y"])],
        "scale",
        [helper.make_tensor_value_info("x", TensorProto.INT32, ["batch", 16])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, ["batch", 16])],
        [numpy_helper.from_array(np.array(3, np.int32), "three"), numpy_helper.from_array(np.array(1, np.int32), "one")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save(model, folder / "model.onnx")
    (repo / "scale" / "config.pbtxt").write_text(CONFIG)
    simple = ort.InferenceSession(str(repo / "simple" / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    scale = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    out = []
    for a, b in json.loads(sys.stdin.read()):
        a, b = np.array([a], np.int32), np.array([b], np.int32)
        s, d = simple.run(["OUTPUT0", "OUTPUT1"], {"INPUT0": a, "INPUT1": b})
        (y,) = scale.run(["y"], {"x": s})
        out.append([y[0].tolist(), d[0].tolist()])
    print(json.dumps(out))


if __name__ == "__main__":
    main()
