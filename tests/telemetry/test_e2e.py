"""End to end: the sync facade against the reference server, exported for real."""

from __future__ import annotations

import urllib.request
from typing import Any

import pytest
from opentelemetry.trace import SpanKind
from structlog.testing import capture_logs

from envlink import CallToolAction, EchoEnv, ServerError
from envlink.server import ServerThread
from envlink.telemetry import configure

from .._otel_support import Otel
from .conftest import Receiver, _arm

pytestmark = pytest.mark.timeout(30)


def _by_id(spans: Any) -> dict[int, Any]:
    return {s.context.span_id: s for s in spans}


@pytest.mark.parametrize("nested", [False, True], ids=["merged", "nested"])
def test_step_span_tree_and_attributes(otel: Otel, nested: bool) -> None:
    """A sync step: CLIENT step (the hop merged into it; with nested_spans, under the bridge
    span) → SERVER step, with exact attributes."""
    tracer = otel.tracer_provider.get_tracer("test")
    with ServerThread(env="echo", tracer_provider=otel.tracer_provider) as st:
        client = EchoEnv(base_url=st.url, tracer_provider=otel.tracer_provider,
                         meter_provider=otel.meter_provider)
        with client.sync(nested_spans=nested) as env:
            env.reset()
            otel.exporter.clear()
            with tracer.start_as_current_span("caller"):
                env.step(CallToolAction(tool_name="echo_message", arguments={"message": "x"}))
            session_id, episode_id = client.session_id, client.journal.episode_id
        port = st.port
    (caller,) = [s for s in otel.exporter.get_finished_spans() if s.name == "caller"]
    spans = [s for s in otel.exporter.get_finished_spans()
             if s.context.trace_id == caller.context.trace_id]
    ids = _by_id(spans)

    def row(s: Any) -> tuple[Any, ...]:
        parent = ids[s.parent.span_id].name if s.parent and s.parent.span_id in ids else None
        attrs = {k: (type(v).__name__ if k.endswith("_s") else v)
                 for k, v in (s.attributes or {}).items()}
        if s.kind is SpanKind.SERVER:
            # The server names its sessions itself (not the client's id): a string.
            attrs["envlink.session.id"] = type(attrs["envlink.session.id"]).__name__
        return (s.name, s.kind, parent, attrs)

    client_attrs = {
        "rpc.system.name": "openenv", "rpc.method": "step",
        "server.address": "127.0.0.1", "server.port": port,
        "envlink.session.id": session_id, "envlink.episode.id": episode_id,
        "envlink.step.index": 0, "envlink.queue_wait_s": "float"}
    expected = [
        ("caller", SpanKind.INTERNAL, None, {}),
        ("step", SpanKind.SERVER, "step", {
            "rpc.system.name": "openenv", "rpc.method": "step",
            "envlink.session.id": "str"}),
    ]
    if nested:
        expected += [
            ("envlink.bridge step", SpanKind.INTERNAL, "caller", {
                "rpc.method": "step", "envlink.bridge.queue_wait_s": "float",
                "envlink.bridge.run_time_s": "float"}),
            ("step", SpanKind.CLIENT, "envlink.bridge step", client_attrs),
        ]
    else:
        expected.append(("step", SpanKind.CLIENT, "caller",
                         {**client_attrs, "envlink.bridge.queue_wait_s": "float"}))
    assert sorted(map(row, spans), key=str) == sorted(expected, key=str)


def test_failed_call_log_and_span_share_the_trace(otel: Otel) -> None:
    """A failing step marks its spans with error.type and logs call_failed in the same trace."""
    with capture_logs() as logs, ServerThread(
        env="echo", tracer_provider=otel.tracer_provider
    ) as st:
        client = EchoEnv(base_url=st.url, tracer_provider=otel.tracer_provider,
                         meter_provider=otel.meter_provider)
        with client.sync() as env:
            env.reset()
            otel.exporter.clear()
            _arm(st, error_frames=1)
            with pytest.raises(ServerError):
                env.step(CallToolAction(tool_name="echo_message", arguments={"message": "x"}))
    step = next(s for s in otel.exporter.get_finished_spans()
                if s.name == "step" and s.kind is SpanKind.CLIENT)
    assert step.attributes["error.type"] == "server_error"
    (failed,) = [e for e in logs if e["event"] == "envlink.call_failed"]
    assert failed["trace_id"] == format(step.context.trace_id, "032x")
    assert failed["error_type"] == "server_error"


def _episode(tp: Any, mp: Any) -> None:
    with ServerThread(env="echo", tracer_provider=tp) as st, \
            EchoEnv(base_url=st.url, tracer_provider=tp, meter_provider=mp).sync() as env:
        env.reset()
        env.step(CallToolAction(tool_name="echo_message", arguments={"message": "x"}))
        env.state()


def _otlp_span_rows(receiver: Receiver) -> set[tuple[str, int, str | None]]:
    spans = receiver.received.spans()
    names = {s.span_id: s.name for s in spans}
    return {(s.name, s.kind, names.get(s.parent_span_id)) for s in spans}


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_episode_exported_over_otlp(protocol: str, otlp_http_receiver: Receiver,
                                    otlp_grpc_receiver: Receiver) -> None:
    """A real episode's client and server spans and metrics arrive at an OTLP receiver."""
    receiver = otlp_grpc_receiver if protocol == "grpc" else otlp_http_receiver
    h = configure(service_name="e2e", otlp_endpoint=receiver.endpoint,
                  otlp_protocol=protocol, set_global=False)  # type: ignore[arg-type]
    _episode(h.tracer_provider, h.meter_provider)
    h.shutdown()
    internal, server, client = 1, 2, 3
    # One span per sync call (the client's); close, which no client call covers, has the
    # bridge's span. Retries (envlink.client.attempts) are exported in test_otlp.py's episode.
    rows = _otlp_span_rows(receiver)
    assert {("step", client, None), ("step", server, "step"), ("reset", server, "reset"),
            ("state", server, "state"), ("envlink.bridge close", internal, None)} <= rows
    assert not {row for row in rows if row[0] == "envlink.bridge step"}
    assert {"rpc.client.call.duration", "envlink.bridge.call.duration",
            "envlink.bridge.wait.duration",
            "envlink.client.inflight", "envlink.client.message.size"} <= (
        receiver.received.metric_names())


def test_episode_scraped_by_prometheus() -> None:
    """After a real episode, the scrape endpoint serves the documented series with labels."""
    with configure(prometheus_port=0, set_global=False) as h:
        _episode(h.tracer_provider, h.meter_provider)
        assert h.prometheus_url is not None
        with urllib.request.urlopen(h.prometheus_url, timeout=10) as response:
            text = response.read().decode()
    for series in (
        'rpc_client_call_duration_seconds_bucket{envlink_outcome="ok"',
        'envlink_bridge_call_duration_seconds_count{envlink_outcome="ok"',
        "envlink_bridge_wait_duration_seconds_sum{",
        "envlink_client_inflight{",
        'envlink_client_message_size_bytes_bucket{envlink_direction="received"',
    ):
        assert series in text, series
    assert 'rpc_method="step"' in text
