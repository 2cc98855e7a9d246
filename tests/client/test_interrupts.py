"""Ctrl-C during a blocking call: a real SIGINT in the main thread cancels the call's work
as a deadline does, the client stays usable, nothing waits behind it, nothing is applied
twice, and the next call's error names the interrupt."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

from envlink import GenericEnvClient, SessionLostError
from envlink.server import ServerThread

from .._interrupts import SLOW, interrupt_when_steps_arrive
from .._interrupts import _sigint_raises as _sigint_raises  # autouse
from .._interrupts import server as server  # the fixture

pytestmark = pytest.mark.timeout(30)


def _interrupted_step(server: ServerThread, step: Callable[[dict[str, Any]], Any]) -> float:
    """Run the client's second step under SLOW latency, Ctrl-C it; return how long it held."""
    server.call(lambda s: setattr(s.faults, "latency", SLOW))
    fired = interrupt_when_steps_arrive(server, 2)
    start = time.perf_counter()
    try:
        with pytest.raises(KeyboardInterrupt):
            step({"move": 2})
        held = time.perf_counter() - start
    finally:
        fired.join(20)
        server.call(lambda s: setattr(s.faults, "latency", 0.0))
    return held


def _applied(server: ServerThread) -> int:
    applied: int = server.call(lambda s: s.steps_applied)
    return applied


@pytest.mark.parametrize("form", ["sync", "no-await"])
def test_ctrl_c_mid_step_leaves_the_client_usable_and_nothing_twice(
        server: ServerThread, form: str) -> None:
    """Under resume: the interrupt is prompt, the step is in journal.unknown_steps, the next
    step does not wait behind the interrupted one, and the server applied each step once."""
    client = GenericEnvClient(base_url=server.url, on_session_lost="resume")
    env: Any = client.sync() if form == "sync" else client
    try:
        env.reset(seed=1, max_steps=100)
        start = time.perf_counter()
        env.step({"move": 1})
        one_step = time.perf_counter() - start
        assert _interrupted_step(server, env.step) < 1.5
        assert [u for u in client.journal.unknown_steps] == ['{"move":2}']
        start = time.perf_counter()
        result = env.step({"move": 3})
        assert time.perf_counter() - start < 1.0 + one_step
        assert result.observation["step"] == 3  # the interrupted step was applied, once
        assert env.state()["step_count"] == 3
        assert _applied(server) == 3
    finally:
        env.close()


def test_the_error_after_a_ctrl_c_names_it(server: ServerThread) -> None:
    """Under raise: the next step fails at once with SessionLostError naming the interrupt
    (message and cause); reset() then starts a new episode on the same client."""
    env = GenericEnvClient(base_url=server.url).sync()
    try:
        env.reset(seed=1, max_steps=100)
        env.step({"move": 1})
        assert _interrupted_step(server, env.step) < SLOW  # interrupted, not answered
        start = time.perf_counter()
        with pytest.raises(SessionLostError, match="blocking caller was interrupted") as info:
            env.step({"move": 3})
        assert time.perf_counter() - start < 1.5
        assert "interrupted" in str(info.value.__cause__)
        assert info.value.journal is not None
        assert info.value.journal.unknown_steps == ['{"move":2}']
        assert _applied(server) == 2
        env.reset(seed=1, max_steps=100)
        assert env.step({"move": 1}).observation["step"] == 1
    finally:
        env.close()


def test_an_interrupt_is_seen_when_the_cancellation_loses_its_message(
        server: ServerThread, monkeypatch: pytest.MonkeyPatch) -> None:
    """Code between the loop and the client (a library that catches a cancellation and
    raises a new one) may drop the message saying the blocking caller was interrupted:
    the call is still known as abandoned, so its connection goes and the next step
    fails at once instead of being sent behind the unanswered one."""
    from envlink._transports.websocket import WebSocketConnection

    classes: list[Any] = [WebSocketConnection]
    try:
        from envlink._transports.picows_ws import PicowsConnection
    except ImportError:  # without the fast extra
        pass
    else:
        classes.append(PicowsConnection)
    for cls in classes:
        original = cls.recv

        async def recv(self: Any, _original: Any = original) -> Any:
            try:
                return await _original(self)
            except asyncio.CancelledError:
                raise asyncio.CancelledError() from None  # the message is gone

        monkeypatch.setattr(cls, "recv", recv)
    env = GenericEnvClient(base_url=server.url).sync()
    try:
        env.reset(seed=1, max_steps=100)
        env.step({"move": 1})
        _interrupted_step(server, env.step)
        start = time.perf_counter()
        with pytest.raises(SessionLostError):
            env.step({"move": 3})
        assert time.perf_counter() - start < 1.5
        assert _applied(server) == 2
    finally:
        env.close()
