#!/usr/bin/env python3
"""How much can any batching of the padding bench's requests gain on this machine?

The padding goal is 1.3x the sequences/s of padding off (benches/README.md, Padding). The
served figure cannot beat raw ONNX Runtime on the batches it ran, so this
script measures the ceiling: raw ONNX Runtime (Python `onnxruntime`, the
server's session options: 2 intra-op threads, spinning off, all graph
optimisations) on the same kind of requests, batched in several ways that a
scheduler holding the same queue could choose.

The requests: `--count` sequence lengths, log-normal with median `--median`
tokens and sigma 0.6, clipped to 8..128 (the padding bench's mix). They are
cut into windows of `--window` requests (the queue that 64 closed-loop
clients can hold at most), and each window is batched by each strategy:

- `alone`: every request a batch of its own;
- `equal (nopad)`: equal lengths together, what padding off can do;
- `sorted K`: the window sorted by length, cut into batches of K, each padded
  to its longest;
- `bound B`: longest first, a batch grows while its padded elements stay at
  most B of all (sluice's `max_padding_ratio`), at most 32 rows.

Every strategy runs the same sequences back to back, `--rounds` times,
interleaved, so that a noisy machine hurts all alike; the table shows medians
and each strategy's sequences/s over `equal (nopad)`'s.

    .venv-clients/bin/python scripts/batching_ceiling.py                 # median 24, 1024 sequences, 3 rounds: ~5 min
    .venv-clients/bin/python scripts/batching_ceiling.py --median 12

(`make setup-test-clients` makes `.venv-clients` with `onnxruntime`.)
"""

import argparse
import statistics
import sys
import time

import numpy as np
import onnxruntime as ort


def windows_of(count, median, window, seed):
    rng = np.random.default_rng(seed)
    normal = rng.standard_normal(count)
    lengths = np.clip(np.round(np.exp(np.log(median) + 0.6 * normal)), 8, 128).astype(int)
    return lengths, [list(lengths[i:i + window]) for i in range(0, count, window)]


def alone(w):
    return [[n] for n in w]


def equal(w, rows=32):
    groups = {}
    for n in w:
        groups.setdefault(n, []).append(n)
    return [g[i:i + rows] for g in groups.values() for i in range(0, len(g), rows)]


def sorted_by(k):
    def batches(w):
        w = sorted(w)
        return [w[i:i + k] for i in range(0, len(w), k)]
    return batches


def bounded(ratio, rows=32):
    def batches(w):
        w = sorted(w, reverse=True)
        out = []
        while w:
            batch = [w.pop(0)]
            while w and len(batch) < rows:
                grown = batch + [w[0]]
                if 1 - sum(grown) / (max(grown) * len(grown)) > ratio:
                    break
                batch.append(w.pop(0))
            out.append(batch)
        return out
    return batches


def feeds(batch):
    """MiniLM's three inputs for one padded batch (attention mask 0 on the padding)."""
    longest = max(batch)
    ids = np.zeros((len(batch), longest), np.int64)
    mask = np.zeros_like(ids)
    for i, n in enumerate(batch):
        ids[i, :n] = 1000 + i
        mask[i, :n] = 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="model-repository/minilm/model.onnx")
    p.add_argument("--count", type=int, default=1024, help="sequences per strategy and round")
    p.add_argument("--median", type=float, default=24, help="median sequence length (tokens)")
    p.add_argument("--window", type=int, default=64, help="requests a scheduler can choose among")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2, help="intra-op threads")
    p.add_argument("--seed", type=int, default=7)
    a = p.parse_args()

    so = ort.SessionOptions()
    so.intra_op_num_threads = a.threads
    so.inter_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(a.model, so, providers=["CPUExecutionProvider"])

    lengths, windows = windows_of(a.count, a.median, a.window, a.seed)
    strategies = {"alone": alone, "equal (nopad)": equal}
    for k in (2, 4, 8, 16, 32):
        strategies[f"sorted {k}"] = sorted_by(k)
    for ratio in (0.05, 0.1, 0.2, 0.3):
        strategies[f"bound {ratio}"] = bounded(ratio)
    plans = {name: [feeds(b) for w in windows for b in f(w)] for name, f in strategies.items()}

    def shape(plan):
        rows = sum(len(f["input_ids"]) for f in plan)
        real = sum(int(f["attention_mask"].sum()) for f in plan)
        return rows / len(plan), 1 - real / sum(f["input_ids"].size for f in plan)

    for f in plans["sorted 8"][:3]:
        session.run(None, f)  # warm-up
    results = {name: [] for name in plans}
    for r in range(a.rounds):
        for name, plan in plans.items():
            wall, cpu = time.perf_counter(), time.process_time()
            for f in plan:
                session.run(None, f)
            results[name].append((a.count / (time.perf_counter() - wall),
                                  (time.process_time() - cpu) * 1e3 / a.count))
        print(f"round {r + 1} of {a.rounds} done", file=sys.stderr, flush=True)

    base = statistics.median(x[0] for x in results["equal (nopad)"])
    print(f"{a.count} sequences, median {a.median:g} tokens (mean {lengths.mean():.1f}), "
          f"windows of {a.window}, {a.threads} intra-op threads, {a.rounds} rounds, medians\n")
    print("| batching | mean batch | padding ratio | sequences/s | ÷ equal (nopad) | CPU ms / sequence |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, runs in results.items():
        rate = statistics.median(x[0] for x in runs)
        cpu = statistics.median(x[1] for x in runs)
        mean_batch, ratio = shape(plans[name])
        print(f"| {name} | {mean_batch:.1f} | {ratio:.3f} | {rate:.1f} | {rate / base:.2f}× | {cpu:.2f} |")


if __name__ == "__main__":
    main()
