#!/usr/bin/env python3
"""Slowloris against a running sluice: open N connections that never finish
their headers, then probe with fresh clients and report how they fare.

    scripts/slowloris.py --port 8080 --connections 3000 --duration 60

Each slow connection sends the start of a request (`GET ... HTTP/1.1` and one
header, no blank line) and then nothing, unless --trickle S sends one more
header byte every S seconds. With --grpc-port P they go to the gRPC port
instead, each sending the HTTP/2 preface and a SETTINGS frame and then
nothing (an idle gRPC channel), and the probes also open fresh gRPC
connections: the time from connect to the server's SETTINGS frame. With
--body they send a whole request head (a POST with Content-Length 100000)
and one byte of its body instead: a slow upload. Every --probe-interval seconds a fresh client
opens a new connection and sends `GET /v2/health/live`; its latency is the
time from connect to the status line (timeout 5 s). The report (one JSON
line) gives the probes' latency percentiles, how many went unanswered, how
many slow connections could be opened, and how many the server has closed.

Python standard library only. The script raises its own open-file limit to
the hard one; start the server under `ulimit -n 1024` (say) to reproduce the
descriptor exhaustion that the connection cap prevents (README, "Slow clients,
connections and memory").
"""

import argparse
import json
import resource
import select
import socket
import time


def raise_file_limit():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


SLOW_HTTP = b"GET /v2/health/live HTTP/1.1\r\nHost: slowloris\r\n"
# The HTTP/2 connection preface and an empty SETTINGS frame.
H2_HELLO = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])


def open_slow(host, port, n, wait=10.0, first=SLOW_HTTP):
    """Starts n connections at once and sends each the start of a request
    once it connects; returns (connected sockets, failed, still connecting
    after `wait` seconds: a full accept queue)."""
    pending = {}
    poller = select.poll()
    for _ in range(n):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        s.connect_ex((host, port))
        pending[s.fileno()] = s
        poller.register(s, select.POLLOUT)
    conns, failed = [], 0
    deadline = time.monotonic() + wait
    while pending and time.monotonic() < deadline:
        for fd, _ in poller.poll(100):
            s = pending.pop(fd)
            poller.unregister(fd)
            if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) != 0:
                failed += 1
                s.close()
                continue
            try:
                s.send(first)
                conns.append(s)
            except OSError:
                failed += 1
                s.close()
    for s in pending.values():
        s.close()
    return conns, failed, len(pending)


def closed_by_server(conns):
    """How many of `conns` the server has closed (EOF or reset)."""
    poller = select.poll()
    by_fd = {}
    for s in conns:
        poller.register(s, select.POLLIN)
        by_fd[s.fileno()] = s
    closed = 0
    for fd, _ in poller.poll(0):
        # Whatever the server sent before closing (an HTTP/2 server's
        # SETTINGS frame) is read first: closed is an empty read after it.
        try:
            while True:
                chunk = by_fd[fd].recv(65536, socket.MSG_DONTWAIT)
                if chunk == b"":
                    closed += 1
                    break
        except BlockingIOError:
            pass
        except OSError:
            closed += 1
    return closed


def trickle(conns):
    for s in conns:
        try:
            s.send(b"X")
        except OSError:
            pass


def probe(host, port, timeout=5.0):
    """Seconds from connect to the status line of a fresh request, or None."""
    t0 = time.monotonic()
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.settimeout(max(0.001, timeout - (time.monotonic() - t0)))
            s.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: probe\r\nConnection: close\r\n\r\n")
            data = b""
            while b"\r\n" not in data:
                chunk = s.recv(256)
                if not chunk:
                    return None
                data += chunk
            return time.monotonic() - t0 if data.startswith(b"HTTP/1.1 200") else None
    except OSError:
        return None


def probe_grpc(host, port, timeout=5.0):
    """Seconds from connect to the server's SETTINGS frame on a fresh HTTP/2
    connection to the gRPC port, or None."""
    t0 = time.monotonic()
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.settimeout(max(0.001, timeout - (time.monotonic() - t0)))
            s.sendall(H2_HELLO)
            data = b""
            while len(data) < 9:
                chunk = s.recv(64)
                if not chunk:
                    return None
                data += chunk
            return time.monotonic() - t0 if data[3] == 4 else None
    except OSError:
        return None


def percentile(values, p):
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(p / 100 * len(values)))]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8080)
    ap.add_argument("--connections", type=int, default=3000)
    ap.add_argument("--duration", type=float, default=60.0, help="seconds of probing")
    ap.add_argument("--probe-interval", type=float, default=0.1)
    ap.add_argument("--trickle", type=float, default=0.0, help="send a header byte every S seconds (0: never)")
    ap.add_argument("--grpc-port", type=int, default=0, help="open the slow connections on this gRPC port instead")
    ap.add_argument("--body", action="store_true", help="slow bodies: whole headers, then one body byte")
    ap.add_argument("--model", default="identity", help="the model --body posts to")
    args = ap.parse_args()

    limit = raise_file_limit()
    t0 = time.monotonic()
    if args.grpc_port:
        conns, failed, stuck = open_slow(args.host, args.grpc_port, args.connections, first=H2_HELLO)
    elif args.body:
        head = (f"POST /v2/models/{args.model}/infer HTTP/1.1\r\nHost: slowloris\r\n"
                "Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n{").encode()
        conns, failed, stuck = open_slow(args.host, args.port, args.connections, first=head)
    else:
        conns, failed, stuck = open_slow(args.host, args.port, args.connections)
    opened_in = time.monotonic() - t0
    latencies, unanswered = [], 0
    grpc_latencies, grpc_unanswered = [], 0
    start = last_trickle = time.monotonic()
    while time.monotonic() - start < args.duration:
        lat = probe(args.host, args.port)
        if lat is None:
            unanswered += 1
        else:
            latencies.append(lat)
        if args.grpc_port:
            lat = probe_grpc(args.host, args.grpc_port)
            if lat is None:
                grpc_unanswered += 1
            else:
                grpc_latencies.append(lat)
        if args.trickle and time.monotonic() - last_trickle >= args.trickle:
            trickle(conns)
            last_trickle = time.monotonic()
        time.sleep(args.probe_interval)
    ms = lambda v: None if v is None else round(v * 1000, 2)
    report = {
        "slow_connections_wanted": args.connections,
        "slow_connections_opened": len(conns),
        "slow_connect_failures": failed,
        "slow_still_connecting_after_10s": stuck,
        "seconds_to_open": round(opened_in, 2),
        "slow_closed_by_server_at_end": closed_by_server(conns),
        "probes": len(latencies) + unanswered,
        "probes_unanswered": unanswered,
        "probe_ms_p50": ms(percentile(latencies, 50)),
        "probe_ms_p99": ms(percentile(latencies, 99)),
        "probe_ms_max": ms(max(latencies) if latencies else None),
        "probes_over_100ms": sum(1 for v in latencies if v > 0.1),
        "client_open_file_limit": limit,
    }
    if args.grpc_port:
        report.update({
            "grpc_probes": len(grpc_latencies) + grpc_unanswered,
            "grpc_probes_unanswered": grpc_unanswered,
            "grpc_probe_ms_p50": ms(percentile(grpc_latencies, 50)),
            "grpc_probe_ms_p99": ms(percentile(grpc_latencies, 99)),
        })
    print(json.dumps(report))
    for s in conns:
        s.close()


if __name__ == "__main__":
    main()
