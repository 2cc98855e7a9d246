"""Head sampling through configure(): spans sampled, every call still measured."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from envlink import CallToolAction, EchoEnv
from envlink.server import ServerThread
from envlink.telemetry import configure

pytestmark = pytest.mark.timeout(30)

STEPS = 64
ACTION = CallToolAction(tool_name="echo_message", arguments={"message": "x"})


def _call_counts(reader: InMemoryMetricReader, metric: str) -> dict[str, int]:
    """Data points' counts of a histogram, by ``rpc.method``."""
    data = reader.get_metrics_data()
    assert data is not None
    counts: dict[str, int] = {}
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                if m.name == metric:
                    for p in m.data.data_points:
                        method = str(p.attributes.get("rpc.method"))
                        counts[method] = counts.get(method, 0) + p.count
    return counts


def _step_spans(spans: InMemorySpanExporter) -> list[Any]:
    return [s for s in spans.get_finished_spans() if s.name == "step"]


@pytest.mark.parametrize("ratio", [0.0, 0.5, 1.0])
def test_sync_steps_are_all_measured_while_their_spans_are_sampled(ratio: float) -> None:
    """With trace_sample_ratio, rpc.client.call.duration counts every sync step; spans follow
    the ratio (none at 0, some but not all at 0.5, every one at 1)."""
    spans, reader = InMemorySpanExporter(), InMemoryMetricReader()
    with configure(span_exporters=[SimpleSpanProcessor(spans)], metric_readers=[reader],
                   set_global=False, trace_sample_ratio=ratio) as h, \
            ServerThread(env="echo") as st, \
            EchoEnv(base_url=st.url, tracer_provider=h.tracer_provider,
                    meter_provider=h.meter_provider).sync() as env:
        env.reset()
        for _ in range(STEPS):
            env.step(ACTION)
        counts = _call_counts(reader, "rpc.client.call.duration")
        traced = _step_spans(spans)
    assert counts["step"] == STEPS
    assert counts["reset"] == 1
    if ratio == 0.0:
        assert traced == []
    elif ratio == 1.0:
        assert len(traced) == STEPS
    else:  # 2**-63 odds that 64 independent draws at 0.5 are all alike
        assert 0 < len(traced) < STEPS
    for span in traced:  # a sampled span still has the contract's attributes
        assert span.attributes is not None
        assert span.attributes["rpc.method"] == "step"
        assert "envlink.step.index" in span.attributes
        assert "envlink.bridge.queue_wait_s" in span.attributes


def test_async_steps_are_all_measured_when_no_trace_is_sampled() -> None:
    """At trace_sample_ratio=0 an async client records no span and still measures every step."""
    spans, reader = InMemorySpanExporter(), InMemoryMetricReader()

    async def episode(url: str, h: Any) -> None:
        async with EchoEnv(base_url=url, tracer_provider=h.tracer_provider,
                           meter_provider=h.meter_provider) as env:
            await env.reset()
            for _ in range(STEPS):
                await env.step(ACTION)

    with configure(span_exporters=[SimpleSpanProcessor(spans)], metric_readers=[reader],
                   set_global=False, trace_sample_ratio=0.0) as h, \
            ServerThread(env="echo") as st:
        asyncio.run(episode(st.url, h))
        counts = _call_counts(reader, "rpc.client.call.duration")
    assert counts["step"] == STEPS
    assert spans.get_finished_spans() == ()
