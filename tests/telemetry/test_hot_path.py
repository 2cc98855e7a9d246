"""The SDK path of a sync call: one span and one duration record per call, wait sampled,
and a request frame whose traceparent names the call's span."""

from __future__ import annotations

import pytest
from opentelemetry.trace import SpanKind

from envlink import GenericEnvClient
from envlink._telemetry.bridge_hook import WAIT_SAMPLE
from envlink.names import METRIC_BRIDGE_WAIT_DURATION, METRIC_CALL_DURATION
from envlink.server import ServerThread

from .._otel_support import Otel

pytestmark = pytest.mark.timeout(30)

STEPS = WAIT_SAMPLE + 1


def _counts(otel: Otel, name: str) -> dict[str, int]:
    for metric in otel.metrics():
        if metric.name == name:
            return {dict(p.attributes)["rpc.method"]: p.count
                    for p in metric.data.data_points}
    return {}


def test_sync_steps_one_duration_record_each_wait_sampled(otel: Otel) -> None:
    """17 sync steps: 17 client spans and 17 call-duration records, but the bridge's wait
    recorded for steps 1 and 17 only; every server span is the child of its client span
    (the frame's traceparent)."""
    with ServerThread(env="echo", tracer_provider=otel.tracer_provider) as st:
        env = GenericEnvClient(base_url=st.url, tracer_provider=otel.tracer_provider,
                               meter_provider=otel.meter_provider).sync()
        try:
            env.reset()
            for n in range(STEPS):
                env.step({"message": str(n)})
        finally:
            env.close()
    assert _counts(otel, METRIC_CALL_DURATION)["step"] == STEPS
    assert _counts(otel, METRIC_BRIDGE_WAIT_DURATION)["step"] == 2
    spans = otel.spans()
    clients = {s.context.span_id: s for s in spans
               if s.name == "step" and s.kind is SpanKind.CLIENT}
    servers = [s for s in spans if s.name == "step" and s.kind is SpanKind.SERVER]
    assert len(clients) == len(servers) == STEPS
    for server in servers:
        assert server.parent is not None and server.parent.span_id in clients
        assert server.context.trace_id == clients[server.parent.span_id].context.trace_id
    assert all("envlink.bridge.queue_wait_s" in (s.attributes or {})
               for s in clients.values())
