"""Expected MiniLM outputs for tests/padding.rs and benches/padding.rs.

Runs Python ONNX Runtime (the release sluice loads, tests/clients/requirements.txt)
on each request alone, with no padding: the answer sluice must give for it
whatever batch it shares.

Usage: minilm_expected.py MODEL.onnx REQUESTS.json OUT.f32 [OUTPUT]
  REQUESTS.json: a JSON list of {"input_ids": [[...]], "attention_mask": [[...]],
                 "token_type_ids": [[...]]} (INT64, [rows, length])
  OUT.f32:       every request's OUTPUT (default `last_hidden_state`, [rows,
                 length, 384]) as little-endian float32, one request after the other
"""

import json
import sys

import numpy as np
import onnxruntime as ort


def main() -> None:
    model, requests_path, out_path = sys.argv[1:4]
    output = sys.argv[4] if len(sys.argv) > 4 else "last_hidden_state"
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    with open(requests_path) as f:
        requests = json.load(f)
    with open(out_path, "wb") as out:
        for r in requests:
            feeds = {name: np.asarray(v, dtype=np.int64) for name, v in r.items()}
            (y,) = session.run([output], feeds)
            out.write(np.ascontiguousarray(y, dtype="<f4").tobytes())
    print(f"{len(requests)} requests, onnxruntime {ort.__version__}")


if __name__ == "__main__":
    main()
