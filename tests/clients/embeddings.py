"""OpenAI's own Python client against sluice's /v1/embeddings, each vector
checked against Python: Hugging Face `tokenizers` on the folder's
tokenizer.json (truncated at sentence_bert_config.json's max_seq_length,
as sentence-transformers does), ONNX Runtime on the same ONNX file with that
text alone, mean pooling over the attention mask, L2 normalisation.

Texts run from 1 to 300 tokens. Asked one at a time, in batches, as token
ids, base64, with `dimensions`, and from 16 threads at once. Every cosine
must be >= 0.9999 and `usage` must count the tokens. Prints a JSON summary.

Usage: embeddings.py BASE_URL MODEL FOLDER [--reference TEXTS_JSON]
  --reference: print only the reference vectors of the texts (a JSON list).
"""

import base64
import concurrent.futures
import json
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer


class Reference:
    def __init__(self, folder: Path):
        cfg = json.loads((folder / "sentence_bert_config.json").read_text())
        self.tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.tok.no_padding()
        self.tok.enable_truncation(cfg["max_seq_length"])
        self.sess = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])

    def ids(self, text: str) -> list[int]:
        return self.tok.encode(text).ids

    def vector(self, text: str) -> np.ndarray:
        e = self.tok.encode(text)
        feed = {
            "input_ids": np.array([e.ids], np.int64),
            "attention_mask": np.array([e.attention_mask], np.int64),
            "token_type_ids": np.array([e.type_ids], np.int64),
        }
        h = self.sess.run(None, feed)[0]
        m = feed["attention_mask"][..., None].astype(np.float32)
        v = (h * m).sum(1) / np.maximum(m.sum(1), 1e-9)
        v = v[0]
        return v / max(np.linalg.norm(v), 1e-12)


WORDS = ("river stone lantern quietly seventeen orbit harbour violet engine whisper "
         "gravity marble canyon ledger falcon tundra opal cipher meadow").split()


def texts(ref: Reference) -> list[str]:
    """Texts of 1 to 300 tokens (the tokenizer's count, [CLS] and [SEP] included)."""
    out = []
    for n in [1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 128, 200, 254, 255, 256, 257, 300, 420]:
        words = [WORDS[(i * 7 + n) % len(WORDS)] for i in range(n)]
        out.append(" ".join(words) + ("." if n % 2 else ""))
    out += ["", "Ünïcødé — 日本語のテキスト 🙂", "  spaces   and\ttabs\n"]
    return out


def cosine(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def main() -> None:
    base, model, folder = sys.argv[1:4]
    ref = Reference(Path(folder))
    if len(sys.argv) > 4 and sys.argv[4] == "--reference":
        print(json.dumps([ref.vector(t).tolist() for t in json.loads(sys.argv[5])]))
        return
    import openai

    client = openai.OpenAI(base_url=base + "/v1", api_key=sys.argv[5] if len(sys.argv) > 5 else "unused")
    # OpenAI's model list: the served model is there, as an OpenAI model.
    listed = {m.id: m for m in client.models.list()}
    assert model in listed, list(listed)
    assert listed[model].object == "model" and isinstance(listed[model].created, int), listed[model]
    all_texts = texts(ref)
    want = {t: ref.vector(t) for t in all_texts}
    tokens = {t: len(ref.ids(t)) for t in all_texts}
    worst = 1.0
    checked = 0

    def check(batch, resp, dims=None):
        nonlocal worst, checked
        assert resp.model == model, resp.model
        assert [d.index for d in resp.data] == list(range(len(batch))), "indices out of order"
        assert resp.usage.prompt_tokens == sum(tokens[t] for t in batch), (resp.usage, batch)
        for t, d in zip(batch, resp.data):
            v = np.asarray(d.embedding, np.float32)
            w = want[t]
            if dims:
                assert v.shape == (dims,), v.shape
                w = w[:dims] / np.linalg.norm(w[:dims])
                assert abs(np.linalg.norm(v) - 1) < 1e-4
            c = cosine(v, w)
            worst = min(worst, c)
            checked += 1
            assert c >= 0.9999, f"cosine {c} for a text of {tokens[t]} tokens"

    # One at a time (a plain string).
    for t in all_texts:
        check([t], client.embeddings.create(model=model, input=t))
    # Batches.
    for size in (4, 8, 21):
        for i in range(0, len(all_texts), size):
            batch = all_texts[i : i + size]
            check(batch, client.embeddings.create(model=model, input=batch))
    # Token ids: the tokenizer step is skipped, the vector is the same.
    batch = all_texts[:6]
    check(batch, client.embeddings.create(model=model, input=[ref.ids(t) for t in batch]))
    # base64 (the client decodes it when it asked for it itself).
    raw = client.embeddings.with_raw_response.create(model=model, input=batch, encoding_format="base64")
    for t, d in zip(batch, json.loads(raw.text)["data"]):
        v = np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4")
        c = cosine(v, want[t])
        worst = min(worst, c)
        checked += 1
        assert c >= 0.9999, c
    # `dimensions`: the leading ones, scaled back to length 1.
    check(batch, client.embeddings.create(model=model, input=batch, dimensions=128), dims=128)

    # 16 threads at once, mixed batch sizes.
    def one(i):
        batch = [all_texts[(i * 5 + j) % len(all_texts)] for j in range(1 + i % 6)]
        return batch, client.embeddings.create(model=model, input=batch)

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        for batch, resp in pool.map(one, range(96)):
            check(batch, resp)
    print(json.dumps({"checked": checked, "worst_cosine": worst, "max_tokens": max(tokens.values())}))


if __name__ == "__main__":
    main()
