"""A real OTLP/HTTP receiver on 127.0.0.1 that decodes the protobuf it is sent.

Shared by the telemetry tests (the ``otlp_http_receiver`` fixture) and by
``benchmarks/run.py``, which runs it as its own process so that decoding costs
no client CPU::

    python tests/telemetry/_otlp_receiver.py [--port 0]

prints ``otlp receiver: listening on http://127.0.0.1:PORT`` once it accepts
requests, then serves until terminated.
"""

from __future__ import annotations

import argparse
import gzip
import http.server
import threading
import zlib
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

__all__ = ["Received", "Receiver", "start_http_receiver"]


@dataclass
class Received:
    """What an OTLP receiver decoded."""

    traces: list[trace_service_pb2.ExportTraceServiceRequest] = field(default_factory=list)
    metrics: list[metrics_service_pb2.ExportMetricsServiceRequest] = field(
        default_factory=list)
    paths: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: Keep only counts, not the decoded requests (a long benchmark run).
    count_only: bool = False
    span_count: int = 0

    def spans(self) -> list[Any]:
        with self.lock:
            return [span for req in self.traces for rs in req.resource_spans
                    for ss in rs.scope_spans for span in ss.spans]

    def metric_names(self) -> set[str]:
        with self.lock:
            return {m.name for req in self.metrics for rm in req.resource_metrics
                    for sm in rm.scope_metrics for m in sm.metrics}

    def resources(self) -> list[dict[str, Any]]:
        with self.lock:
            out = [rs.resource for req in self.traces for rs in req.resource_spans]
            out += [rm.resource for req in self.metrics for rm in req.resource_metrics]
        return [{kv.key: kv.value.string_value for kv in r.attributes} for r in out]


class _OtlpHttpHandler(http.server.BaseHTTPRequestHandler):
    received: Received

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        encoding = self.headers.get("Content-Encoding", "")
        if encoding == "gzip":
            body = gzip.decompress(body)
        elif encoding == "deflate":
            body = zlib.decompress(body)
        response: Any
        received = self.received
        if self.path == "/v1/traces":
            req: Any = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
            response = trace_service_pb2.ExportTraceServiceResponse()
            with received.lock:
                received.span_count += sum(len(ss.spans) for rs in req.resource_spans
                                           for ss in rs.scope_spans)
                if not received.count_only:
                    received.traces.append(req)
                    received.paths.append(self.path)
        elif self.path == "/v1/metrics":
            req = metrics_service_pb2.ExportMetricsServiceRequest.FromString(body)
            response = metrics_service_pb2.ExportMetricsServiceResponse()
            with received.lock:
                if not received.count_only:
                    received.metrics.append(req)
                    received.paths.append(self.path)
        else:
            self.send_error(404)
            return
        payload = response.SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@dataclass
class Receiver:
    """A running receiver: its base URL, what it decoded, and how to stop it."""

    endpoint: str
    received: Received
    server: http.server.ThreadingHTTPServer | None = None
    thread: threading.Thread | None = None

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
        if self.thread is not None:
            self.thread.join(5)


def start_http_receiver(port: int = 0, *, count_only: bool = False) -> Receiver:
    """Start an OTLP/HTTP receiver on 127.0.0.1 in a daemon thread."""
    received = Received(count_only=count_only)
    handler = type("Handler", (_OtlpHttpHandler,), {"received": received})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
    thread = threading.Thread(target=server.serve_forever, name="otlp-http", daemon=True)
    thread.start()
    return Receiver(f"http://127.0.0.1:{server.server_port}", received, server, thread)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    receiver = start_http_receiver(args.port, count_only=True)
    print(f"otlp receiver: listening on {receiver.endpoint}", flush=True)
    assert receiver.thread is not None
    receiver.thread.join()


if __name__ == "__main__":
    main()
