"""EnvPool's sync facade (one bridge thread) and its telemetry (spans and metrics)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from envlink import Bridge, EnvPool, ReentrantCallError, StepResult, default_bridge
from envlink.server import ServerThread

from .conftest import dead_url

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def server() -> Iterator[ServerThread]:
    with ServerThread(env="deterministic", max_sessions=3) as st:
        yield st


def _bridge_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("envlink-pool")]


def test_sync_pool_runs_every_session_on_one_thread(server: ServerThread) -> None:
    """The sync facade steps 6 sessions on two servers from the process-wide default bridge's
    one loop thread, and leaves that bridge open on close."""
    with ServerThread(env="deterministic", max_sessions=3) as other, \
            EnvPool([server.url, other.url], 6).sync() as pool:
        first = pool.reset(seeds=0)
        assert first.ok
        assert pool.bridge is default_bridge()
        assert _bridge_threads() == []
        batch = pool.step([{"move": 1}] * 6)
        assert [r.observation["step"] for r in batch.results()] == [1] * 6
        pool.step_send([{"move": 1}] * 6)
        rest = pool.step_recv(min_ready=6)
        assert rest.ready == tuple(range(6))
        assert pool.reset_at(0, seed=0).observation == first.results()[0].observation
        view = pool.view()
        assert [e.sessions for e in view.endpoints] == [3, 3]
    assert pool.async_pool.closed
    assert not default_bridge().closed


def test_sync_pool_on_a_shared_bridge_leaves_it_open(server: ServerThread) -> None:
    """A pool given a bridge closes the pool but not the bridge; close is idempotent."""
    with Bridge() as bridge:
        pool = EnvPool(server.url, 2).sync(bridge)
        assert pool.reset().ok
        pool.close()
        pool.close()
        assert not bridge.closed
        assert pool.async_pool.closed

        async def reenter() -> None:
            pool2.close()

        pool2 = EnvPool(server.url, 1).sync(bridge)
        with pytest.raises(ReentrantCallError):
            bridge.call(reenter, timeout=5)
        pool2.close()


def test_spans_nest_and_metrics_are_recorded(server: ServerThread) -> None:
    """Bridge span > pool batch span > each session's client span; pool metrics recorded."""
    exporter = InMemorySpanExporter()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    mp = MeterProvider(metric_readers=[reader])
    try:
        with EnvPool([dead_url(), server.url], 3, tracer_provider=tp, meter_provider=mp,
                     breaker_threshold=1, breaker_reset_timeout=60).sync() as pool:
            pool.reset(seeds=0)
            pool.step([{"move": 1}] * 3)
            pool.step_send([{"move": 1}] * 3)
            pool.step_recv()
        spans = exporter.get_finished_spans()
        by_id = {s.context.span_id: s for s in spans}
        (pool_step,) = [s for s in spans if s.name == "envlink.pool step"
                        and by_id[s.parent.span_id].name == "envlink.bridge step"]
        assert pool_step.attributes["envlink.pool.size"] == 3
        children = [s for s in spans if s.name == "step" and s.parent is not None
                    and s.parent.span_id == pool_step.context.span_id]
        assert len(children) == 3
        assert any(s.name == "envlink.pool recv" for s in spans)
        data = reader.get_metrics_data()
        assert data is not None
        metrics = {m.name: m for rm in data.resource_metrics for sm in rm.scope_metrics
                   for m in sm.metrics}
        durations = metrics["envlink.pool.batch.duration"].data.data_points
        assert {p.attributes["rpc.method"] for p in durations} == {"reset", "step", "recv"}
        transitions = metrics["envlink.pool.breaker.transitions"].data.data_points
        assert [p.attributes["envlink.breaker.state"] for p in transitions] == ["open"]
        placements = {(p.attributes["envlink.placement.result"], p.value)
                      for p in metrics["envlink.pool.placements"].data.data_points}
        assert ("placed", 3) in placements
        # Placements run concurrently: more than one may try the dead endpoint before
        # the first failure opens its breaker.
        assert any(result == "unreachable" and n >= 1 for result, n in placements)
        sessions = {(p.attributes["server.port"], p.attributes["envlink.pool.session.state"]):
                    p.value for p in metrics["envlink.pool.sessions"].data.data_points}
        # Closed at the end: every placed session was counted in, then out again.
        assert sessions[(server.port, "active")] == 0
    finally:
        tp.shutdown()
        mp.shutdown()


def test_sessions_gauge_counts_by_endpoint_and_state(server: ServerThread) -> None:
    """While open, envlink.pool.sessions shows each endpoint's sessions by state."""
    reader = InMemoryMetricReader()
    mp = MeterProvider(metric_readers=[reader])
    try:
        with EnvPool(server.url, 2, meter_provider=mp).sync() as pool:
            pool.reset()
            data = reader.get_metrics_data()
            assert data is not None
            points = [p for rm in data.resource_metrics for sm in rm.scope_metrics
                      for m in sm.metrics if m.name == "envlink.pool.sessions"
                      for p in m.data.data_points]
            values: dict[Any, Any] = {
                (p.attributes["server.port"], p.attributes["envlink.pool.session.state"]):
                p.value for p in points}
            assert values[(server.port, "active")] == 2
            assert isinstance(pool.reset_at(1), StepResult)
    finally:
        mp.shutdown()


def test_a_typed_client_class_gives_typed_observations() -> None:
    """client=EchoEnv with client_options: typed actions in, EchoObservation out, per slot."""
    from envlink import CallToolAction, EchoEnv, EchoObservation, Timeout

    with ServerThread(env="echo") as st, EnvPool(
            st.url, 3, client=EchoEnv, client_options={"timeout": Timeout(10.0)}).sync() as pool:
        pool.reset()
        batch = pool.step([CallToolAction(tool_name="echo_message",
                                          arguments={"message": f"m{i}"}) for i in range(3)])
        for result in batch.results():
            assert isinstance(result.observation, EchoObservation)
        assert all(isinstance(c, EchoEnv) and c.timeouts.call == 10.0
                   for c in pool.clients())
