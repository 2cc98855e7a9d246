"""envlink.pool.breaker.state: each endpoint's breaker state, read when metrics are collected."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

import envlink._pool.pool
from envlink import EnvPool, ReconnectPolicy
from envlink._pool.breaker import CircuitBreaker

from .conftest import dead_url

pytestmark = pytest.mark.timeout(30)

STATES = {"closed", "open", "half_open"}


class Clock:
    """The breakers' clock, moved by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _points(reader: InMemoryMetricReader, name: str) -> list[Any]:
    data = reader.get_metrics_data()
    if data is None:
        return []
    return [p for rm in data.resource_metrics for sm in rm.scope_metrics
            for m in sm.metrics if m.name == name for p in m.data.data_points]


def _states(reader: InMemoryMetricReader) -> dict[int, dict[str, int]]:
    """Port -> state -> value of envlink.pool.breaker.state, from one collection."""
    out: dict[int, dict[str, int]] = {}
    for p in _points(reader, "envlink.pool.breaker.state"):
        out.setdefault(p.attributes["server.port"], {})[p.attributes["envlink.breaker.state"]] = (
            p.value)
    return out


def _one_hot(state: str) -> dict[str, int]:
    return {s: int(s == state) for s in STATES}


async def test_the_gauge_shows_open_then_half_open_then_closed(
        det_servers: Callable[..., Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """A dead endpoint's breaker reads open, half_open past its timeout, closed once healed."""
    clock = Clock()
    monkeypatch.setattr(envlink._pool.pool, "CircuitBreaker",
                        lambda *a, **kw: CircuitBreaker(*a, clock=clock, **kw))
    reader = InMemoryMetricReader()
    mp = MeterProvider(metric_readers=[reader])
    live = await det_servers(max_sessions=1)
    url = dead_url()
    port = int(url.rsplit(":", 1)[1])
    # Many short waits for room: the slot that finds no room keeps waiting until healed.
    patient = ReconnectPolicy(max_attempts=100_000, initial_delay=0.01, max_delay=0.01,
                              max_elapsed=25.0)
    try:
        pool = EnvPool([url, live.url], 2, breaker_threshold=1, breaker_reset_timeout=30.0,
                       capacity=patient, meter_provider=mp)
        assert _states(reader) == {}  # nothing before the pool is used
        task = asyncio.ensure_future(pool.reset())
        # One session on the live server and one refused there: the slot that went
        # first to the dead endpoint (listed first) came to the live one after it failed.
        await live.wait_for_connection(2)
        assert not task.done()
        assert _states(reader) == {port: _one_hot("open"), live.port: _one_hot("closed")}
        healed = await det_servers(port=port)
        clock.now += 30.0
        # Read at once (no await: the waiting slot cannot probe in between).
        assert _states(reader)[port] == _one_hot("half_open")
        transitions = {p.attributes["envlink.breaker.state"]: p.value
                       for p in _points(reader, "envlink.pool.breaker.transitions")
                       if p.attributes["server.port"] == port}
        assert transitions == {"open": 1}  # collecting moved no breaker
        batch = await asyncio.wait_for(task, 10)
        assert batch.ok
        assert len(healed.sessions()) == 1
        assert _states(reader) == {port: _one_hot("closed"), live.port: _one_hot("closed")}
        await pool.close()
        assert _states(reader) == {}  # the closed pool's series end
    finally:
        mp.shutdown()


async def test_two_pools_on_one_endpoint_count_their_breakers(
        det_servers: Callable[..., Any]) -> None:
    """Two pools sharing an endpoint: the gauge counts their breakers in each state."""
    reader = InMemoryMetricReader()
    mp = MeterProvider(metric_readers=[reader])
    live = await det_servers()
    url = dead_url()
    port = int(url.rsplit(":", 1)[1])
    try:
        async with EnvPool([url, live.url], 1, breaker_threshold=1, breaker_reset_timeout=60,
                           meter_provider=mp) as first, \
                EnvPool([url, live.url], 1, breaker_threshold=5, breaker_reset_timeout=60,
                        meter_provider=mp) as second:
            assert (await first.reset()).ok
            assert (await second.reset()).ok
            assert [e.breaker for e in first.view().endpoints] == ["open", "closed"]
            assert [e.breaker for e in second.view().endpoints] == ["closed", "closed"]
            assert _states(reader) == {port: {"closed": 1, "open": 1, "half_open": 0},
                                       live.port: {"closed": 2, "open": 0, "half_open": 0}}
            await first.close()
            assert _states(reader) == {port: _one_hot("closed"), live.port: _one_hot("closed")}
    finally:
        mp.shutdown()
