"""all-MiniLM-L6-v2 taking INT32 token inputs, as some exports do: the
int8 graph with each INT64 input (input_ids, attention_mask,
token_type_ids) renamed and fed through a Cast from a new INT32 input of the
old name. The computation is the original's.

Usage: minilm_int32.py MINILM.onnx OUT.onnx
"""

import sys

import onnx
from onnx import TensorProto, helper


def main() -> None:
    src, dst = sys.argv[1:]
    m = onnx.load(src)
    g = m.graph
    casts = []
    for inp in g.input:
        if inp.type.tensor_type.elem_type != TensorProto.INT64:
            continue
        old = inp.name
        inner = old + "_int64"
        for node in g.node:
            node.input[:] = [inner if x == old else x for x in node.input]
        casts.append(helper.make_node("Cast", [old], [inner], to=TensorProto.INT64, name=f"cast_{old}"))
        inp.type.tensor_type.elem_type = TensorProto.INT32
    nodes = casts + list(g.node)
    del g.node[:]
    g.node.extend(nodes)
    onnx.save(m, dst)


if __name__ == "__main__":
    main()
