"""envlink.ray telemetry: one trace from the driver through the shard actors to the server."""

from __future__ import annotations

from ._ray_support import require_ray

require_ray()

from typing import Any  # noqa: E402

import pytest  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)

from envlink.ray import RayEnvPool, ShardTelemetry  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def _provider() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


async def test_one_trace_from_driver_to_shards_to_server(
        ray_local: Any, threads: Any, otlp_http_receiver: Any) -> None:
    """A batch's trace holds the driver's span, each shard's spans (over OTLP), the server's."""
    server_tp, server_spans = _provider()
    st = threads(tracer_provider=server_tp)
    driver_tp, driver_spans = _provider()
    telemetry = ShardTelemetry(otlp_endpoint=otlp_http_receiver.endpoint,
                               resource_attributes={"deployment.environment": "test"})
    async with RayEnvPool([st.url], 4, shards=2, telemetry=telemetry,
                          tracer_provider=driver_tp) as pool:
        await pool.reset(seeds=0)
        with driver_tp.get_tracer("test").start_as_current_span("train step") as root:
            assert (await pool.step([{"move": 1}] * 4)).ok
        assert await pool.flush_telemetry()
    trace_id = root.get_span_context().trace_id
    driver = {s.name: s for s in driver_spans.get_finished_spans()
              if s.context.trace_id == trace_id}
    assert set(driver) == {"train step", "envlink.pool step"}
    batch_span_id = driver["envlink.pool step"].context.span_id
    assert driver["envlink.pool step"].attributes["envlink.ray.shards"] == 2

    actor = [s for s in otlp_http_receiver.received.spans()
             if int.from_bytes(s.trace_id, "big") == trace_id]
    shard_spans = [s for s in actor if s.name == "envlink.ray.shard step"]
    assert len(shard_spans) == 2
    assert all(int.from_bytes(s.parent_span_id, "big") == batch_span_id for s in shard_spans)
    shard_ids = {s.span_id for s in shard_spans}
    pools = [s for s in actor if s.name == "envlink.pool step"]
    assert len(pools) == 2 and {s.parent_span_id for s in pools} == shard_ids
    sessions = [s for s in actor if s.name == "step"]
    assert len(sessions) == 4 and {s.parent_span_id for s in sessions} == {
        s.span_id for s in pools}
    shards_seen = {r.get("envlink.ray.shard") for r in otlp_http_receiver.received.resources()}
    assert {"0", "1"} <= shards_seen
    resources = otlp_http_receiver.received.resources()
    assert all(r.get("service.name") == "envlink-ray-shard" for r in resources)
    assert all(r.get("deployment.environment") == "test" for r in resources)

    server = [s for s in server_spans.get_finished_spans() if s.context.trace_id == trace_id]
    session_ids = {int.from_bytes(s.span_id, "big") for s in sessions}
    assert len(server) >= 4
    assert {s.parent.span_id for s in server if s.parent is not None} & session_ids
