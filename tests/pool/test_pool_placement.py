"""EnvPool placement: spread over servers, capacity waits, circuit breakers."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from envlink import (
    CapacityReachedError,
    ConnectError,
    EnvPool,
    GenericEnvClient,
    ReconnectPolicy,
    RetryBudget,
    RetryBudgetExhaustedError,
)

from .conftest import dead_url, solo_run

pytestmark = pytest.mark.timeout(30)

MOVES = [1, -2, 3]


async def test_a_batch_larger_than_one_servers_limit_is_spread(det_servers: Callable[..., Any]
                                                               ) -> None:
    """Seven sessions on servers of limit 3, 3 and 4 all start, none above a server's limit."""
    servers = [await det_servers(max_sessions=n) for n in (3, 3, 4)]
    async with EnvPool([s.url for s in servers], 7) as pool:
        batch = await pool.reset(seeds=50)
        assert batch.ok and batch.ready == tuple(range(7))
        for srv in servers:
            assert len(srv.sessions()) <= srv.max_sessions
        assert sum(len(s.sessions()) for s in servers) == 7
        view = pool.view()
        assert [e.sessions for e in view.endpoints] == [len(s.sessions()) for s in servers]
        assert set(view.slots) == {"active"}
        assert all(url is not None for url in view.slot_endpoints)


async def test_results_match_one_client_at_a_time(det_servers: Callable[..., Any]) -> None:
    """Every slot's observations equal those of a lone client with the same seed and actions."""
    a = await det_servers(max_sessions=2)
    b = await det_servers(max_sessions=8)
    size = 5
    got: list[list[dict[str, Any]]] = [[] for _ in range(size)]
    async with EnvPool([a.url, b.url], size) as pool:
        for i, r in enumerate((await pool.reset(seeds=10, max_steps=20)).results()):
            got[i].append(r.observation)
        for m in MOVES:
            for i, r in enumerate((await pool.step([{"move": m + i} for i in range(size)]))
                                  .results()):
                got[i].append(r.observation)
    for i in range(size):
        want = await solo_run(b.url, {"seed": 10 + i, "max_steps": 20},
                              [{"move": m + i} for m in MOVES])
        assert got[i] == want, i


async def test_all_full_waits_and_proceeds_when_a_session_frees(
        det_servers: Callable[..., Any]) -> None:
    """With every server full the pool waits, and places the session once one frees."""
    srv = await det_servers(max_sessions=2)
    holder = GenericEnvClient(srv.url)
    await holder.reset()
    pool: EnvPool[Any, Any] = EnvPool(srv.url, 2)
    try:
        task = asyncio.ensure_future(pool.reset(seeds=1))
        # holder, slot A placed, slot B refused, then refused again after its first
        # wait: four connections, B still waiting.
        await srv.wait_for_connection(4)
        assert not task.done()
        assert pool.view().endpoints[0].server_max == 2
        await holder.close()
        batch = await asyncio.wait_for(task, 10)
        assert batch.ok
        assert len(srv.sessions()) == 2
    finally:
        await holder.close()
        await pool.close()


async def test_all_full_past_the_wait_limit_is_a_per_slot_capacity_error(
        det_servers: Callable[..., Any]) -> None:
    """When the capacity wait gives up, that slot answers CapacityReachedError; others succeed."""
    srv = await det_servers(max_sessions=1)
    policy = ReconnectPolicy(max_attempts=2, initial_delay=0.001, max_delay=0.001)
    async with EnvPool(srv.url, 2, capacity=policy) as pool:
        batch = await pool.reset()
        assert sorted(type(r).__name__ for r in batch) == ["CapacityReachedError", "StepResult"]
        error = next(iter(batch.errors.values()))
        assert isinstance(error, CapacityReachedError)
        assert (error.active_sessions, error.max_sessions) == (1, 1)
        assert pool.view().slots.count("empty") == 1


async def test_the_retry_budget_bounds_capacity_waits(det_servers: Callable[..., Any]) -> None:
    """An exhausted retry budget stops the capacity wait with RetryBudgetExhaustedError."""
    srv = await det_servers(max_sessions=1)
    budget = RetryBudget(max_tokens=2)
    policy = ReconnectPolicy(max_attempts=50, initial_delay=0.001, max_delay=0.001,
                             budget=budget)
    async with EnvPool(srv.url, 2, capacity=policy) as pool:
        batch = await pool.reset()
        (error,) = batch.errors.values()
        assert isinstance(error, RetryBudgetExhaustedError)
        assert isinstance(error.__cause__, CapacityReachedError)


async def test_a_dead_endpoint_opens_its_breaker_and_gets_no_sessions(
        det_servers: Callable[..., Any]) -> None:
    """Sessions go to the live server; the dead one's breaker opens after its failures."""
    live = await det_servers()
    dead = dead_url()
    async with EnvPool([dead, live.url], 4, breaker_threshold=1,
                       breaker_reset_timeout=60) as pool:
        batch = await pool.reset(seeds=0)
        assert batch.ok
        view = pool.view()
        assert view.endpoints[0].breaker == "open"
        assert view.endpoints[0].sessions == 0
        assert view.endpoints[1].sessions == 4
        assert set(view.slot_endpoints) == {live.url}


async def test_only_dead_endpoints_give_per_slot_connect_errors() -> None:
    """With no endpoint reachable, each slot answers ConnectError; the batch itself returns."""
    policy = ReconnectPolicy(max_attempts=2, initial_delay=0.001, max_delay=0.001)
    async with EnvPool([dead_url(), dead_url()], 3, capacity=policy,
                       breaker_threshold=2) as pool:
        batch = await pool.reset()
        assert len(batch.errors) == 3
        assert all(isinstance(e, ConnectError) for e in batch.errors.values())
        assert {e.breaker for e in pool.view().endpoints} == {"open"}


async def test_a_healed_endpoint_gets_traffic_back_after_a_half_open_probe(
        det_servers: Callable[..., Any]) -> None:
    """A breaker opened by a dead server lets a probe through later; its success closes it."""
    live = await det_servers(max_sessions=2)
    url = dead_url()
    port = int(url.rsplit(":", 1)[1])
    async with EnvPool([url, live.url], 3, breaker_threshold=1,
                       breaker_reset_timeout=0.0) as pool:
        task = asyncio.ensure_future(pool.reset())
        # Two sessions placed on the live server and a third refused there: slot 0
        # (first to choose, all endpoints empty) connected there only after the dead
        # endpoint, listed first, refused it.
        await live.wait_for_connection(3)
        assert pool.view().endpoints[0].consecutive_failures >= 1
        assert not task.done()
        healed = await det_servers(port=port)
        assert healed.url == url
        batch = await asyncio.wait_for(task, 10)
        assert batch.ok
        view = pool.view()
        assert view.endpoints[0].breaker == "closed"
        assert view.endpoints[0].sessions == 1
        assert len(healed.sessions()) == 1
