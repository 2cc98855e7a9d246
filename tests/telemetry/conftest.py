"""Fixtures for the telemetry tests: local SDK providers and real OTLP receivers.

The receivers decode real OTLP protobuf (HTTP and gRPC) on 127.0.0.1; nothing is
mocked between ``configure()`` and the bytes on the wire.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass
from typing import Any

import pytest
from opentelemetry.proto.collector.metrics.v1 import (
    metrics_service_pb2,
    metrics_service_pb2_grpc,
)
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from .._otel_support import Otel
from ._otlp_receiver import Received, Receiver, start_http_receiver


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


@pytest.fixture
def otlp_http_receiver() -> Iterator[Receiver]:
    """An OTLP/HTTP receiver on 127.0.0.1 decoding real protobuf requests."""
    receiver = start_http_receiver()
    yield receiver
    receiver.stop()


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
    #: Ports of the endpoints the scripted EnvPool finds dead (nothing listens).
    dead_ports: tuple[int, ...] = ()


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
            from envlink import HarnessClient
            with HarnessClient(st.url, tracer_provider=tp, meter_provider=mp).sync() as harness:
                harness.turn("one harness turn")
            _run_scripted_fleet(st, tp, mp)
            dead_port, while_open = _run_scripted_pool(st, otel)
        metrics = otel.metrics()
        # Gauges read from a live pool (breaker states) end with it: take them as
        # collected while it was open.
        ended = {m.name for m in metrics}
        metrics += [m for m in while_open if m.name not in ended]
        return Episode(otel.spans(), metrics, list(logs), port, session_ids, (dead_port,))


def _run_scripted_fleet(st: Any, tp: Any, mp: Any) -> None:
    """A session under the fleet's shared limits (a directory store): its wait reported."""
    import tempfile

    from envlink import EchoEnv, FleetLimits

    with tempfile.TemporaryDirectory() as store, EchoEnv(
            base_url=st.url, tracer_provider=tp, meter_provider=mp,
            fleet=FleetLimits(store, max_sessions_per_endpoint=4)).sync() as env:
        env.reset()


def _run_scripted_pool(st: Any, otel: Otel) -> tuple[int, list[Any]]:
    """An EnvPool over the server and a dead endpoint: breaker, replay elsewhere, stragglers.

    Returns the dead endpoint's port and the metrics collected while the pool was open.
    """
    import socket

    from envlink import ConnectError, EnvPool, ReconnectPolicy

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"ws://127.0.0.1:{s.getsockname()[1]}"
    say = [{"message": f"p{i}"} for i in range(2)]
    tp, mp = otel.tracer_provider, otel.meter_provider
    with EnvPool([dead, st.url], 2, on_session_lost="replay", breaker_threshold=1,
                 breaker_reset_timeout=600, tracer_provider=tp,
                 meter_provider=mp).sync() as pool:
        pool.reset()          # the dead endpoint's breaker opens
        while_open = otel.metrics()
        pool.step(say)
        _arm(st, drop_after=1)
        pool.step(say)        # one session is dropped and rebuilt by replay
        st.call(lambda server: server.connections[-1].stall())
        pool.step_send(say)
        pool.step_recv(min_ready=1)   # one straggler
        st.call(lambda server: server.unstall_all())
        pool.step_recv()
    # Nowhere to go: the pool waits once for room, then gives up.
    with EnvPool(dead, 1, breaker_threshold=1, tracer_provider=tp, meter_provider=mp,
                 capacity=ReconnectPolicy(max_attempts=1, initial_delay=0.001)).sync() as pool:
        (error,) = pool.reset()
        assert isinstance(error, ConnectError)
    return int(dead.rsplit(":", 1)[1]), while_open


@pytest.fixture(scope="module")
def scripted_episode() -> Episode:
    """One scripted run (see run_scripted_episode), shared by a module's tests."""
    return run_scripted_episode()
