#!/usr/bin/env python3
"""An OTLP/HTTP trace receiver for agent/tests/traces.rs: decodes each `POST /v1/traces` with the
OpenTelemetry project's own generated messages (opentelemetry-proto, so a mistake in the agent's
hand-written encoding is caught against the real schema) and prints one JSON line per span.

Usage: otlp_receiver.py PORT [HOST] (127.0.0.1 by default). Prints `listening` first; answers 400 to a body that is no
ExportTraceServiceRequest (and prints an `error` line).
"""

import json
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


def value(any_value):
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind else None


class Receiver(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        request = ExportTraceServiceRequest()
        try:
            if self.path != "/v1/traces" or self.headers.get("content-type") != "application/x-protobuf":
                raise DecodeError(f"{self.path} {self.headers.get('content-type')}")
            request.ParseFromString(body)
        except DecodeError as error:
            print(json.dumps({"error": str(error)}), flush=True)
            self.send_response(400)
            self.end_headers()
            return
        for resource_spans in request.resource_spans:
            resource = {kv.key: value(kv.value) for kv in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    print(json.dumps({
                        "trace": span.trace_id.hex(),
                        "span": span.span_id.hex(),
                        "parent": span.parent_span_id.hex(),
                        "state": span.trace_state,
                        "name": span.name,
                        "kind": span.kind,
                        "start": span.start_time_unix_nano,
                        "end": span.end_time_unix_nano,
                        "attributes": {kv.key: value(kv.value) for kv in span.attributes},
                        "status": span.status.code,
                        "scope": scope_spans.scope.name,
                        "instance": resource.get("service.instance.id"),
                        "service": resource.get("service.name"),
                    }), flush=True)
        answer = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *_):
        pass


if __name__ == "__main__":
    host = sys.argv[2] if len(sys.argv) > 2 else "127.0.0.1"
    server = HTTPServer((host, int(sys.argv[1])), Receiver)
    print("listening", flush=True)
    server.serve_forever()
