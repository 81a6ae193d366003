"""all-MiniLM-L6-v2 as sentence-transformers serves it: MiniLM's graph plus
mean pooling over the tokens the attention mask keeps, then L2
normalisation, as the only output `sentence_embedding` FP32 [batch, 384]
(the last two modules of the sentence-transformers pipeline, `Pooling` with
`pooling_mode_mean_tokens` and `Normalize`).

tests/padding.rs serves it with `padding`: the output has no `sequence` dim,
so nothing is cut back, and each request's embedding must still be the one
it gets alone, because the pooling divides by the request's own token count.

Usage: minilm_pooled.py MINILM.onnx OUT.onnx
"""

import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def main() -> None:
    src, dst = sys.argv[1:]
    m = onnx.load(src)
    g = m.graph
    (hidden,) = [o.name for o in g.output]  # last_hidden_state [batch, sequence, 384]
    g.initializer.extend([
        numpy_helper.from_array(np.array([2], np.int64), "pool_axis_2"),
        numpy_helper.from_array(np.array([1], np.int64), "pool_axis_1"),
        numpy_helper.from_array(np.array(1e-9, np.float32), "pool_min_count"),
    ])
    g.node.extend([
        helper.make_node("Cast", ["attention_mask"], ["pool_mask"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["pool_mask", "pool_axis_2"], ["pool_mask3"]),
        helper.make_node("Mul", [hidden, "pool_mask3"], ["pool_masked"]),
        helper.make_node("ReduceSum", ["pool_masked", "pool_axis_1"], ["pool_sum"], keepdims=0),
        helper.make_node("ReduceSum", ["pool_mask3", "pool_axis_1"], ["pool_count"], keepdims=0),
        helper.make_node("Max", ["pool_count", "pool_min_count"], ["pool_count_min"]),
        helper.make_node("Div", ["pool_sum", "pool_count_min"], ["pool_mean"]),
        helper.make_node("LpNormalization", ["pool_mean"], ["sentence_embedding"], axis=1, p=2),
    ])
    del g.output[:]
    g.output.append(helper.make_tensor_value_info("sentence_embedding", TensorProto.FLOAT, ["batch", 384]))
    onnx.checker.check_model(m)
    onnx.save(m, dst)
    print(f"wrote {dst}: {len(g.node)} nodes, output sentence_embedding [batch, 384]")


if __name__ == "__main__":
    main()
