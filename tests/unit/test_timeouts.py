"""Deadlines never swallow a caller's cancellation."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import pytest
from websockets.protocol import State

from envlink import CallTimeoutError
from envlink._deadlines import bounded, bounded_at, deadline
from envlink._sansio.protocol import Extensions
from envlink._transports.websocket import WebSocketConnection as Connection

pytestmark = pytest.mark.timeout(10)

SRC = Path(__file__).resolve().parents[2] / "src" / "envlink"


class _PingOnlyWs:
    """Just enough of a websockets connection for Connection.probe."""

    state = State.OPEN

    def __init__(self) -> None:
        self.pong: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self.pinged = asyncio.Event()

    async def ping(self) -> asyncio.Future[float]:
        self.pinged.set()
        return self.pong


async def test_probe_passes_on_a_cancellation_that_coincides_with_the_pong() -> None:
    """A caller cancelled in the same loop iteration as the pong arrives stays cancelled
    (asyncio.wait_for on 3.11 returned the pong and lost the cancellation)."""
    ws = _PingOnlyWs()
    conn = Connection(ws, Extensions.from_headers({}))  # type: ignore[arg-type]
    went_on = False

    async def call() -> None:
        nonlocal went_on
        await conn.probe(2.0)
        went_on = True  # a step would be sent here, after the caller gave up

    task = asyncio.create_task(call())
    await ws.pinged.wait()
    ws.pong.set_result(0.0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not went_on


async def test_bounded_passes_on_a_cancellation_that_coincides_with_completion() -> None:
    """bounded() re-raises the outer cancellation even if the inner work just finished."""
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    started = asyncio.Event()

    async def call() -> str:
        async with bounded(2.0):
            started.set()
            await done
        return "went on"

    task = asyncio.create_task(call())
    await started.wait()
    done.set_result(None)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_blocks_with_one_deadline_expire_together() -> None:
    """Two blocks given the same loop time: the one waiting for what the other holds
    expires with it and never gets it (a batch slot queued behind a stalled call is
    never sent after the batch deadline)."""
    loop = asyncio.get_running_loop()
    until = loop.time() + 0.05
    window = asyncio.Semaphore(1)
    holding = asyncio.Event()
    entered: list[str] = []

    async def slot(name: str, hold: bool) -> str:
        try:
            async with bounded_at(until) as expiry, window:
                entered.append(name)
                holding.set()
                if hold:
                    await asyncio.Event().wait()  # a call that never answers
                return "answered"
        except TimeoutError:
            assert expiry.expired()
            return "expired"

    first = asyncio.ensure_future(slot("stalled", True))
    await holding.wait()
    second = asyncio.ensure_future(slot("queued", False))
    assert await asyncio.gather(first, second) == ["expired", "expired"]
    assert entered == ["stalled"]


async def test_bounded_counts_its_seconds_from_now() -> None:
    """bounded(s) is bounded_at(now + s); None never expires."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    with pytest.raises(TimeoutError):
        async with bounded(0.02):
            await asyncio.Event().wait()
    assert loop.time() - start >= 0.02
    async with bounded(None) as expiry:
        await asyncio.sleep(0)
    assert not expiry.expired()


async def test_deadline_raises_call_timeout_only_for_its_own_expiry() -> None:
    """deadline() turns its own expiry into CallTimeoutError, and passes inner ones on."""
    with pytest.raises(CallTimeoutError) as info:
        async with deadline(0.01, "step"):
            await asyncio.Event().wait()
    assert info.value.method == "step" and info.value.timeout == 0.01
    with pytest.raises(TimeoutError) as inner:
        async with deadline(5.0, "step"), bounded(0.01):
            await asyncio.Event().wait()
    assert not isinstance(inner.value, CallTimeoutError)


async def test_deadlines_sharing_one_timer_each_expire_on_their_own() -> None:
    """Deadlines of one loop share a lazily re-armed timer: a short one entered while a
    long one holds the timer still expires, after many finished calls too, and the long
    one is untouched by the short one's expiry."""
    long_entered = asyncio.Event()

    async def long_call() -> str:
        async with deadline(30.0, "long"):
            long_entered.set()
            await asyncio.sleep(0)
            await asyncio.Event().wait()
        return "unreachable"

    long_task = asyncio.create_task(long_call())
    await long_entered.wait()
    for _ in range(100):  # finished calls leave the timer armed for their 30 s
        async with deadline(30.0, "step"):
            await asyncio.sleep(0)
    for method in ("first", "second"):  # shorter than the armed timer: it is re-armed
        with pytest.raises(CallTimeoutError) as info:
            async with deadline(0.02, method):
                await asyncio.Event().wait()
        assert info.value.method == method
    both = [deadline(0.02, "a"), deadline(0.03, "b")]

    async def stalled(scope: object) -> None:
        async with scope:  # type: ignore[attr-defined]
            await asyncio.Event().wait()

    results = await asyncio.gather(*(stalled(d) for d in both), return_exceptions=True)
    assert [type(r) for r in results] == [CallTimeoutError, CallTimeoutError]
    assert not long_task.done()  # the long deadline is still pending, not expired
    long_task.cancel()
    with pytest.raises(asyncio.CancelledError):  # the caller's cancellation, passed on
        await long_task


def test_no_wait_for_in_the_client_library() -> None:
    """No module of the client library uses asyncio.wait_for (it can lose cancellations)."""
    users = []
    for path in SRC.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "wait_for" and isinstance(
                    node.value, ast.Name) and node.value.id == "asyncio":
                users.append(path.name)
    assert users == []


async def test_deadline_passes_on_a_cancellation_that_coincides_with_its_expiry() -> None:
    """A cancellation from outside that lands with the deadline's own is the caller's:
    it stays a CancelledError (the deadline cannot claim it as its timeout)."""
    entered = asyncio.Event()

    async def call() -> None:
        async with deadline(0.0, "step"):  # expires on the next loop iteration
            entered.set()
            await asyncio.Event().wait()

    task = asyncio.create_task(call())
    await entered.wait()  # runs before the expiry, in the same iteration
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_deadline_that_did_not_expire_leaves_the_task_uncancelled() -> None:
    """A block that ends in time leaves no pending cancellation and no live timer."""
    for _ in range(3):
        async with deadline(0.05, "step"):
            await asyncio.sleep(0)
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0
    await asyncio.sleep(0.1)  # past every deadline above: none fires late
    assert task.cancelling() == 0
