#!/usr/bin/env python3
"""Which queue signal predicts overload best, for an autoscaler: the `slow`
model offered open-loop Poisson load from 0.5 to 1.5 times its saturation
rate, with /metrics sampled every half second, one release build.

    .venv-clients/bin/python scripts/autoscale_signal.py target/release/sluice [--seconds 20]

Signals, each as an autoscaler's query would read it:
- predicted wait: `sluice_queue_wait_predicted_seconds` (the scheduler's
  prediction of a request's queue wait, from the queue and the fitted batch cost);
- pending: `nv_inference_pending_request_count` (Triton's queue size);
- average queue time: Triton's HPA rule,
  rate(nv_inference_queue_duration_us) / (1 + rate(nv_inference_request_success));
- utilisation: the session's busy share, rate(sluice_inference_duration_seconds_sum).

Prints per load: goodput share (answers within the timeout), each signal's
median and its 90th percentile over the samples. A good scaling signal is
near zero below 1x, clearly above its low-load values from 1x on, and
steady (small p90/median spread) at each load.
"""
import argparse
import json
import os
import statistics
import threading
import time
import urllib.request

import schedule_bench as sb
from sluice_server import serve


def scrape():
    text = urllib.request.urlopen(f"http://127.0.0.1:{sb.HTTP}/metrics", timeout=5).read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or 'model="slow"' not in line:
            continue
        name = line.split("{")[0]
        try:
            out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
        except ValueError:
            pass
    return out


def sampled(rate, seconds):
    samples, stop = [], threading.Event()

    def sampler():
        prev = (time.monotonic(), scrape())
        while not stop.wait(0.5):
            now = (time.monotonic(), scrape())
            dt = now[0] - prev[0]
            d = lambda k: (now[1].get(k, 0.0) - prev[1].get(k, 0.0)) / dt
            samples.append({
                "predicted_wait_s": now[1].get("sluice_queue_wait_predicted_seconds", 0.0),
                "pending": now[1].get("nv_inference_pending_request_count", 0.0),
                "avg_queue_us": d("nv_inference_queue_duration_us") / (1 + d("nv_inference_request_success")),
                "utilisation": d("sluice_inference_duration_seconds_sum"),
            })
            prev = now

    t = threading.Thread(target=sampler)
    t.start()
    results = sb.open_loop(rate, seconds, 0.0)
    stop.set()
    t.join()
    return results, samples


def main():
    p = argparse.ArgumentParser()
    p.add_argument("binary")
    p.add_argument("--seconds", type=float, default=20)
    p.add_argument("--timeout", type=float, default=1.0)
    p.add_argument("--matmuls", type=int, default=128)
    args = p.parse_args()
    repo = sb.repo(args.timeout, False, args.matmuls)
    server = serve(args.binary, repo, sb.HTTP, sb.GRPC)
    try:
        sat = sb.saturation()
        print(json.dumps({"saturation_per_s": round(sat, 1)}), flush=True)
        keys = ["predicted_wait_s", "pending", "avg_queue_us", "utilisation"]
        medians = {}
        for load in [0.5, 0.75, 0.9, 1.0, 1.1, 1.25, 1.5]:
            results, samples = sampled(sat * load, args.seconds)
            good = sum(1 for r in results if r[2] == 200 and r[3] <= args.timeout)
            line = {"load": load, "goodput_share": round(good / max(1, len(results)), 3)}
            for k in keys:
                v = sorted(s[k] for s in samples[2:])  # the first second settles
                line[k] = [round(statistics.median(v), 4), round(v[int(0.9 * (len(v) - 1))], 4)] if v else None
                medians.setdefault(k, {})[load] = statistics.median(v) if v else float("nan")
            print(json.dumps(line), flush=True)
        # Separation: the least overloaded median over the most of the
        # loads that keep up (above 1: the signal tells them apart).
        for k in keys:
            low = max(v for l, v in medians[k].items() if l <= 0.9)
            high = min(v for l, v in medians[k].items() if l >= 1.1)
            print(json.dumps({"signal": k, "separation": round(high / low, 2) if low > 0 else None}), flush=True)
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
