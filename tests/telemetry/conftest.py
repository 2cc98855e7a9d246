"""Fixtures for the telemetry tests: local SDK providers and real OTLP receivers.

The receivers decode real OTLP protobuf (HTTP and gRPC) on 127.0.0.1; nothing is
mocked between ``configure()`` and the bytes on the wire.
"""

from __future__ import annotations

import gzip
import http.server
import threading
import zlib
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import pytest
from opentelemetry.proto.collector.metrics.v1 import (
    metrics_service_pb2,
    metrics_service_pb2_grpc,
)
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from _otel_support import Otel


@pytest.fixture(autouse=True)
def _clean_otel_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No OTEL_* setting or proxy of the host leaks into a test."""
    import os

    for name in list(os.environ):
        if name.startswith("OTEL_") or name.lower() in ("http_proxy", "https_proxy",
                                                         "all_proxy", "grpc_proxy"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")


@dataclass
class Received:
    """What an OTLP receiver decoded."""

    traces: list[trace_service_pb2.ExportTraceServiceRequest] = field(default_factory=list)
    metrics: list[metrics_service_pb2.ExportMetricsServiceRequest] = field(
        default_factory=list)
    paths: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

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
        if self.path == "/v1/traces":
            req: Any = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
            response = trace_service_pb2.ExportTraceServiceResponse()
            with self.received.lock:
                self.received.traces.append(req)
                self.received.paths.append(self.path)
        elif self.path == "/v1/metrics":
            req = metrics_service_pb2.ExportMetricsServiceRequest.FromString(body)
            response = metrics_service_pb2.ExportMetricsServiceResponse()
            with self.received.lock:
                self.received.metrics.append(req)
                self.received.paths.append(self.path)
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
    endpoint: str
    received: Received


@pytest.fixture
def otlp_http_receiver() -> Iterator[Receiver]:
    """An OTLP/HTTP receiver on 127.0.0.1 decoding real protobuf requests."""
    received = Received()
    handler = type("Handler", (_OtlpHttpHandler,), {"received": received})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, name="otlp-http", daemon=True)
    thread.start()
    yield Receiver(f"http://127.0.0.1:{server.server_port}", received)
    server.shutdown()
    server.server_close()
    thread.join(5)


class _TraceServicer(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, received: Received) -> None:
        self.received = received

    def Export(self, request: Any, context: Any) -> Any:
        with self.received.lock:
            self.received.traces.append(request)
        return trace_service_pb2.ExportTraceServiceResponse()


class _MetricsServicer(metrics_service_pb2_grpc.MetricsServiceServicer):
    def __init__(self, received: Received) -> None:
        self.received = received

    def Export(self, request: Any, context: Any) -> Any:
        with self.received.lock:
            self.received.metrics.append(request)
        return metrics_service_pb2.ExportMetricsServiceResponse()


@pytest.fixture
def otlp_grpc_receiver() -> Iterator[Receiver]:
    """An OTLP/gRPC receiver (grpcio, generated servicers) on 127.0.0.1."""
    import grpc

    received = Received()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_TraceServicer(received), server)
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(
        _MetricsServicer(received), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield Receiver(f"http://127.0.0.1:{port}", received)
    server.stop(grace=None).wait(5)


# ------------------------------------------------------------------- real episodes


@dataclass
class Episode:
    """Everything one scripted run against the reference server emitted."""

    spans: list[Any]
    metrics: list[Any]  # opentelemetry.sdk.metrics.export.Metric
    logs: list[dict[str, Any]]
    server_port: int
    session_ids: list[str]


def _arm(st: Any, **faults: Any) -> None:
    """Arm one-shot faults on the newest open connection (``*_after`` relative to now)."""

    def apply(server: Any) -> None:
        handle = server.connections[-1]
        for key, value in faults.items():
            setattr(handle.faults, key, handle.requests + value if key.endswith("_after")
                    else value)

    st.call(apply)


def run_scripted_episode() -> Episode:
    """Drive the sync facade against the reference server through normal calls and faults.

    Covers: refused upgrade (reconnect scheduled), a retried ``state`` before the
    episode, reset and steps, a server error frame, a lost connection mid-episode
    recovered by ``replay`` and by ``resume``.
    """
    from structlog.testing import capture_logs

    from envlink import CallToolAction, EchoEnv, ListToolsAction, ServerError, set_testing
    from envlink.server import ServerThread

    session_ids: list[str] = []
    with Otel.capture() as otel:
        tp, mp = otel.tracer_provider, otel.meter_provider
        with capture_logs() as logs, set_testing(), \
                ServerThread(env="echo", tracer_provider=tp) as st:
            port = st.port
            st.call(lambda server: setattr(server.faults, "refuse", 1))
            replaying = EchoEnv(base_url=st.url, tracer_provider=tp, meter_provider=mp,
                                on_session_lost="replay")
            with replaying.sync() as env:
                _arm(st, drop_after=1)
                env.state()  # lost before the episode: retried transparently
                env.reset()
                for i in range(2):
                    env.step(CallToolAction(tool_name="echo_message",
                                            arguments={"message": f"m{i}"}))
                _arm(st, error_frames=1)
                try:
                    env.step(ListToolsAction())
                except ServerError:
                    pass
                else:  # pragma: no cover - the fault must fire
                    raise AssertionError("the injected error frame did not raise")
                _arm(st, drop_after=1)
                env.step(CallToolAction(tool_name="echo_message", arguments={"message": "r"}))
                env.state()
                session_ids.append(replaying.session_id or "")
            resuming = EchoEnv(base_url=st.url, tracer_provider=tp, meter_provider=mp,
                               on_session_lost="resume")
            with resuming.sync() as env:
                env.reset()
                env.step(CallToolAction(tool_name="echo_with_length",
                                        arguments={"message": "abc"}))
                _arm(st, drop_after=1)
                env.step(CallToolAction(tool_name="echo_message", arguments={"message": "s"}))
                session_ids.append(resuming.session_id or "")
        return Episode(otel.spans(), otel.metrics(), list(logs), port, session_ids)


@pytest.fixture(scope="module")
def scripted_episode() -> Episode:
    """One scripted run (see run_scripted_episode), shared by a module's tests."""
    return run_scripted_episode()
