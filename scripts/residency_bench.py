#!/usr/bin/env python3
"""More models than memory, measured: the same Zipf traffic against every
model resident, then against a host budget that holds a fraction of them.

    .venv-clients/bin/python scripts/residency_bench.py BINARY
        [--models 200] [--fraction 0.1] [--zipf 1.1] [--seconds 60] [--clients 6] [--rate 0]

BINARY: a release build. Run 1 serves every model (eager, no budget) and
sums what they hold (`sluice_model_memory_bytes`, cpu); run 2 serves them
on demand under `residency.host_bytes` = fraction × that sum. Both runs get
the same requests (tests/clients/residency.py drive, same seed); with
--rate, both runs are offered the same requests per second (open loop),
so the hits' latencies compare at the same load. Prints
one line per run: requests/s, hit ratio, p50/p99 of hits and of cold
requests (ms), loads/s, evictions, peak charged bytes ÷ budget, RSS; then
the ratio of the hits' p99 to run 1's p99.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import urllib.request

from sluice_server import serve

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DRIVER = os.path.join(ROOT, "tests", "clients", "residency.py")
HTTP, GRPC = 18600, 18601


def drive(out, pid, args):
    cmd = [sys.executable, DRIVER, "drive", out, "--http", f"127.0.0.1:{HTTP}", "--grpc", f"127.0.0.1:{GRPC}",
           "--pid", str(pid), "--seconds", str(args.seconds), "--clients", str(args.clients), "--zipf", str(args.zipf),
           "--rate", str(args.rate)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"the driver failed:\n{r.stdout}\n{r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def held_bytes():
    text = urllib.request.urlopen(f"http://127.0.0.1:{HTTP}/metrics").read().decode()
    return sum(float(v) for v in re.findall(r'sluice_model_memory_bytes\{[^}]*device="cpu"[^}]*\} (\S+)', text))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("binary")
    p.add_argument("--models", type=int, default=200)
    p.add_argument("--fraction", type=float, default=0.1)
    p.add_argument("--zipf", type=float, default=1.1)
    p.add_argument("--seconds", type=float, default=60)
    p.add_argument("--clients", type=int, default=6)
    p.add_argument("--rate", type=float, default=0,
                   help="open loop at this many requests/s (use more --clients); 0: closed loop")
    args = p.parse_args()
    out = tempfile.mkdtemp()
    subprocess.run([sys.executable, DRIVER, "build", out, "--models", str(args.models)], check=True, capture_output=True)
    repo = os.path.join(out, "repo")

    server = serve(args.binary, repo, HTTP, GRPC)
    total = held_bytes()
    resident = drive(out, server.pid, args)
    server.terminate()
    server.wait()

    budget = int(total * args.fraction)
    server = serve(args.binary, repo, HTTP, GRPC, {"SLUICE_RESIDENCY__MODE": "on_demand", "SLUICE_RESIDENCY__HOST_BYTES": str(budget)})
    budgeted = drive(out, server.pid, args)
    server.terminate()
    server.wait()

    offered = f"open loop at {args.rate:.0f} req/s" if args.rate else "closed loop"
    print(f"{args.models} models holding {total / 2**20:.0f} MiB, budget {budget / 2**20:.0f} MiB "
          f"({args.fraction}), zipf {args.zipf}, {args.clients} clients, {offered}, {args.seconds:.0f} s per run")
    print("run          req/s  hit ratio  hit p50/p99 ms   cold p50/p99 ms  loads/s  evictions  peak/budget  RSS MiB")
    for name, r in (("all resident", resident), ("budgeted", budgeted)):
        hp, cp = r["hit_ms_p50_p99"], r["cold_ms_p50_p99"]
        peak = r["peak_used_over_budget"]
        print(f"{name:12} {r['requests_per_s']:6.0f} {r['hit_ratio']:10.3f} {hp[0]:7.2f}/{hp[1]:<7.2f} "
              f"{(cp[0] or 0):8.2f}/{(cp[1] or 0):<8.2f} {r['loads_per_s']:7.1f} {r['evictions']:10.0f} "
              f"{(peak if peak is not None else float('nan')):12.3f} {r['rss_median_mib_by_third'][-1]:8.1f}")
    print(f"hits' p99 ÷ all-resident p99: {budgeted['hit_ms_p50_p99'][1] / resident['latency_ms_p50_p99'][1]:.2f}")


if __name__ == "__main__":
    main()
