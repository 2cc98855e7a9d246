"""SessionDriver on its own: hooks, deadlines, the FIFO turn, frame checks, close."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from envlink import CallTimeoutError, ClientClosedError, ConnectionOptions, ProtocolError, Timeout
from envlink._client.driver import end_turn, take_turn, wait_turn
from envlink._sansio.protocol import ObservationFrame, StateFrame
from envlink._sansio.session import Call
from envlink.hooks import CallFinished, CallStarted, PhaseFinished, PhaseStarted
from envlink.names import LOG_CLIENT_CLOSED, LOG_CONNECTION_DISCARDED

from ._parts import build, obs, turn

pytestmark = pytest.mark.timeout(30)


def echo(request: dict[str, Any]) -> Any:
    if request["type"] == "state":
        return {"type": "state", "data": {"step_count": 0}}
    if request["type"] == "close":
        return None
    return obs(got=request.get("data"))


async def test_a_call_reports_start_and_finish_with_its_outcome() -> None:
    """call() brackets the run with CallStarted/CallFinished, passing the start's token."""
    parts = build(echo)
    driver = parts.driver

    async def run(call: Call) -> Any:
        async with turn(driver, call):
            return driver.expect(await driver.request(call, {"n": 1}), ObservationFrame,
                                 "reset")

    frame = await driver.call("reset", 5.0, run)
    assert frame.data.observation == {"got": {"n": 1}}
    started = parts.hook.of(CallStarted)
    assert [c.method for c in started] == ["reset"]
    finished = parts.hook.of(CallFinished)
    assert len(finished) == 1
    record = finished[0]
    assert (record.outcome, record.error) == ("ok", None)
    assert ("call", "reset") in parts.hook.tokens
    assert record.queue_wait is not None and record.queue_wait >= 0
    phases = [p.phase for p in parts.hook.of(PhaseStarted)]
    assert phases == ["connect", "attempt"]
    assert all(p.error is None for p in parts.hook.of(PhaseFinished))
    await driver.close(1.0)


async def test_a_sent_request_that_times_out_has_an_unknown_outcome() -> None:
    """A deadline after the frame was sent: CallTimeoutError says the outcome is unknown,
    and the call finishes with outcome "timeout"."""
    parts = build(lambda request: None if request["type"] == "step" else echo(request))
    driver = parts.driver

    async def run(call: Call) -> Any:
        async with turn(driver, call):
            return await driver.request(call, {"n": 1})

    await driver.call("reset", 5.0, run)
    with pytest.raises(CallTimeoutError) as info:
        await driver.call("step", 0.05, run)
    assert info.value.outcome_unknown
    assert "may or may not have applied it" in str(info.value)
    finished = parts.hook.of(CallFinished)
    assert [f.outcome for f in finished] == ["ok", "timeout"]
    await driver.close(1.0)


async def test_a_closed_driver_opens_again_unless_closed_for_good() -> None:
    """After close(), the next call() opens the driver again; after close(final=True),
    call() raises ClientClosedError before anything is reported."""
    parts = build(echo)
    await parts.driver.close(1.0)
    assert parts.driver.closed
    assert parts.hook.events() == [LOG_CLIENT_CLOSED]

    async def ran(call: Call) -> Any:
        return "ran"

    assert await parts.driver.call("reset", 1.0, ran) == "ran"
    assert not parts.driver.closed
    await parts.driver.close(1.0, final=True)
    started = len(parts.hook.of(CallStarted))

    async def run(call: Call) -> Any:
        raise AssertionError("never run")

    with pytest.raises(ClientClosedError, match=r"final=True"):
        await parts.driver.call("reset", 1.0, run)
    assert len(parts.hook.of(CallStarted)) == started


async def test_close_cancels_the_call_in_flight() -> None:
    """close() cancels the task holding the turn; that call raises ClientClosedError."""
    answered = asyncio.Event()

    async def stall(request: dict[str, Any]) -> Any:
        if request["type"] == "step":
            answered.set()
            await asyncio.Event().wait()
        return echo(request)

    parts = build(stall)
    driver = parts.driver

    async def run(call: Call) -> Any:
        async with turn(driver, call):
            return await driver.request(call, {"n": 1})

    await driver.call("reset", 5.0, run)
    pending = asyncio.ensure_future(driver.call("step", 10.0, run))
    await answered.wait()
    await driver.close(1.0)
    with pytest.raises(RuntimeError, match=r"close\(\) was called during step") as caught:
        await pending
    assert isinstance(caught.value, ClientClosedError)


async def test_turns_are_taken_first_come_first_served() -> None:
    """Callers waiting for the session's turn enter in arrival order, one at a time."""
    parts = build(echo)
    driver = parts.driver
    order: list[int] = []
    inside = 0
    release = asyncio.Event()

    async def take(n: int) -> None:
        nonlocal inside
        async with turn(driver, Call("state")):
            inside += 1
            assert inside == 1
            if n == 0:
                await release.wait()
            order.append(n)
            inside -= 1

    tasks = [asyncio.ensure_future(take(n)) for n in range(5)]
    for _ in range(5):
        await asyncio.sleep(0)  # let every task queue on the lock
    release.set()
    await asyncio.gather(*tasks)
    assert order == [0, 1, 2, 3, 4]


async def test_a_free_turn_is_not_taken_ahead_of_a_woken_waiter() -> None:
    """take_turn() declines while a woken waiter has not run yet: a step stays in FIFO order."""
    driver = build(echo).driver
    order: list[str] = []
    held = await wait_turn(driver, Call("step"))

    async def step(name: str) -> None:
        call = Call("step")
        lock = take_turn(driver, call) or await wait_turn(driver, call)
        order.append(name)
        end_turn(driver, lock)

    waiting = asyncio.ensure_future(step("queued first"))
    await asyncio.sleep(0)  # it queues on the held lock
    end_turn(driver, held)  # wakes it; it has not run yet
    assert take_turn(driver, Call("step")) is None
    await asyncio.gather(waiting, step("came later"))
    assert order == ["queued first", "came later"]


async def test_an_answer_of_the_wrong_kind_discards_the_connection() -> None:
    """expect(): a valid frame of another kind is a ProtocolError and the stream is dropped."""
    parts = build(echo)
    driver = parts.driver

    async def run(call: Call) -> Any:
        async with turn(driver, call):
            return driver.expect(await driver.request(call, None), StateFrame, "state")

    with pytest.raises(ProtocolError):
        await driver.call("state", 5.0, run)  # echo answers state with a state frame...
        await driver.call("reset", 5.0, run)  # ...and reset with an observation
    assert not parts.connector.is_open
    assert LOG_CONNECTION_DISCARDED in parts.hook.events()
    await driver.close(1.0)


@pytest.mark.parametrize(("probe", "ping", "expected"),
                         [(2.0, None, 2.0), (2.0, 0.5, 0.5), (0.3, 5.0, 0.3)])
def test_the_probe_waits_no_longer_than_the_keepalive(probe: float, ping: float | None,
                                                      expected: float) -> None:
    """probe_timeout() is Timeout.probe, capped by ping_timeout when there is one."""
    parts = build(echo, timeouts=Timeout(5.0, probe=probe),
                  options=ConnectionOptions(ping_timeout=ping))
    assert parts.driver.probe_timeout() == expected
