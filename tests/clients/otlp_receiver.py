"""A minimal OTLP/HTTP trace receiver for tests/telemetry.rs.

Listens on 127.0.0.1 (port 0: the OS picks one), prints `port N` on stdout,
and for every `POST /v1/traces` decodes the protobuf body with the official
`opentelemetry-proto` package (ExportTraceServiceRequest) and appends one
JSON object per span to the file named on the command line:

  {"trace_id", "span_id", "parent_span_id" (hex), "name", "kind",
   "attributes": {key: value}, "links": [{"trace_id", "span_id"}],
   "status": {"code", "message"}, "resource": {key: value}}

A body that does not decode is answered 400 and recorded as
{"error": "..."} so that the test fails on it. Runs until killed.

Usage: otlp_receiver.py OUT.jsonl
"""

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

OUT = sys.argv[1]
# Handlers run on threads of their own; one writes the file at a time.
LOCK = threading.Lock()


def value(v):
    """An AnyValue as a plain Python value."""
    kind = v.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: value(kv.value) for kv in v.kvlist_value.values}
    if kind == "bytes_value":
        return v.bytes_value.hex()
    return getattr(v, kind)


def attributes(kvs):
    return {kv.key: value(kv.value) for kv in kvs}


def spans(request):
    for rs in request.resource_spans:
        resource = attributes(rs.resource.attributes)
        for ss in rs.scope_spans:
            for s in ss.spans:
                yield {
                    "trace_id": s.trace_id.hex(),
                    "span_id": s.span_id.hex(),
                    "parent_span_id": s.parent_span_id.hex(),
                    "name": s.name,
                    "kind": s.kind,
                    "attributes": attributes(s.attributes),
                    "links": [
                        {"trace_id": l.trace_id.hex(), "span_id": l.span_id.hex()}
                        for l in s.links
                    ],
                    "status": {"code": s.status.code, "message": s.status.message},
                    "start_ns": s.start_time_unix_nano,
                    "end_ns": s.end_time_unix_nano,
                    "resource": resource,
                }


def record(lines):
    with LOCK, open(OUT, "a", encoding="utf-8") as f:
        for line in lines:
            f.write(json.dumps(line) + "\n")


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.path != "/v1/traces":
            record([{"error": f"POST to {self.path}, not /v1/traces"}])
            self.send_response(404)
            self.end_headers()
            return
        try:
            if self.headers.get("Content-Type") != "application/x-protobuf":
                raise ValueError(f"Content-Type {self.headers.get('Content-Type')!r}")
            request = ExportTraceServiceRequest.FromString(body)
        except Exception as e:  # noqa: BLE001 - any failure is the test's failure
            record([{"error": f"undecodable export: {e}"}])
            self.send_response(400)
            self.end_headers()
            return
        record(spans(request))
        reply = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args):
        pass


def main():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(f"port {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
