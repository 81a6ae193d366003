"""A graph that uses onnxruntime-extensions' custom ops (domain
`ai.onnx.contrib`): text BYTES[N] -> `upper` = StringUpper(text),
`length` = StringLength(text) INT64[N]. Writes it, and prints the library
and the outputs Python ONNX Runtime gives with that library for the texts
given on stdin (a JSON list), as JSON.

Usage: op_library_model.py OUT.onnx < texts.json
"""

import json
import sys

import numpy as np
import onnx
import onnxruntime as ort
import onnxruntime_extensions
from onnx import TensorProto, helper


def main() -> None:
    out = sys.argv[1]
    texts = json.loads(sys.stdin.read())
    nodes = [
        helper.make_node("StringUpper", ["text"], ["upper"], domain="ai.onnx.contrib"),
        helper.make_node("StringLength", ["text"], ["length"], domain="ai.onnx.contrib"),
    ]
    graph = helper.make_graph(
        nodes,
        "op_library",
        [helper.make_tensor_value_info("text", TensorProto.STRING, ["N"])],
        [
            helper.make_tensor_value_info("upper", TensorProto.STRING, ["N"]),
            helper.make_tensor_value_info("length", TensorProto.INT64, ["N"]),
        ],
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.contrib", 1)],
        ir_version=8,
    )
    onnx.save(model, out)
    library = onnxruntime_extensions.get_library_path()
    opts = ort.SessionOptions()
    opts.register_custom_ops_library(library)
    s = ort.InferenceSession(out, opts, providers=["CPUExecutionProvider"])
    upper, length = s.run(None, {"text": np.array(texts, dtype=object)})
    print(json.dumps({"library": library, "upper": [str(u) for u in upper], "length": [int(n) for n in length]}))


if __name__ == "__main__":
    main()
