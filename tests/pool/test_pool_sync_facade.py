"""SyncEnvPool's waits and close(): the client facade's mechanism, waits from the configuration."""

from __future__ import annotations

import asyncio
import threading

import pytest

from envlink import ClientConfig, EnvPool, Timeout

from ..bridge.conftest import SpyBridge
from .conftest import dead_url

pytestmark = pytest.mark.timeout(30)


def test_the_sync_pool_waits_come_from_the_configured_timeouts() -> None:
    """view and step_send wait the batch deadline, close twice the sessions' close deadline,
    step_recv its own timeout, each plus the margin: no fixed number of seconds."""
    spy = SpyBridge()
    config = ClientConfig(timeout=Timeout(2.0, close=0.25))
    try:
        pool = EnvPool(dead_url(), 2, client_config=config, batch_timeout=3.0).sync(spy)
        pool.view()
        pool.step_recv(timeout=1.0)
        pool.close()
        assert spy.waits == [("view", 3.5), ("step_recv", 1.5), ("close", 1.0)]
        assert pool.async_pool.closed
    finally:
        spy.close()


def test_a_concurrent_second_sync_pool_close_waits_for_the_first() -> None:
    """close() from two threads at once: the second returns only once the pool is closed,
    as the client's facade does."""
    spy = SpyBridge()
    pool = EnvPool(dead_url(), 2).sync(spy)
    closing, finish = threading.Event(), threading.Event()
    inner = pool.async_pool
    original = inner.close

    async def held_close() -> None:
        closing.set()
        await asyncio.to_thread(finish.wait, 10)
        await original()

    inner.close = held_close  # type: ignore[method-assign]
    first = threading.Thread(target=pool.close)
    first.start()
    try:
        assert closing.wait(5)
        seen: list[bool] = []
        second = threading.Thread(target=lambda: (pool.close(), seen.append(inner.closed)))
        second.start()
        second.join(0.2)  # room to return early, which it must not
        finish.set()
        second.join(5)
        assert seen == [True]
    finally:
        finish.set()
        first.join(5)
        spy.close()
