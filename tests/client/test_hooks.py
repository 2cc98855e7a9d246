"""Client hooks: what a user's hook is told, and that a failing hook never fails a call."""

from __future__ import annotations

from typing import Any

import pytest

from envlink import (
    CallFinished,
    CallStarted,
    ClientEvent,
    ClientHook,
    ConnectionLostError,
    GenericEnvClient,
    MockTransport,
    OutcomeUnknownError,
    PhaseFinished,
    PhaseStarted,
)
from envlink.telemetry import ClientTelemetryHook

pytestmark = pytest.mark.timeout(30)


class Recorder(ClientHook):
    def __init__(self) -> None:
        self.seen: list[tuple[str, Any]] = []

    def call_started(self, call: CallStarted) -> str:
        self.seen.append(("call_started", call))
        return f"token-{call.method}"

    def call_finished(self, call: CallFinished, token: Any) -> None:
        assert token == f"token-{call.method}"
        self.seen.append(("call_finished", call))

    def phase_started(self, phase: PhaseStarted) -> Any:
        self.seen.append(("phase_started", phase))
        return phase

    def phase_finished(self, phase: PhaseFinished, token: Any) -> None:
        assert token is phase.phase
        self.seen.append(("phase_finished", phase))

    def message(self, direction: str, size: int) -> None:
        self.seen.append(("message", (direction, size)))

    def event(self, event: ClientEvent) -> None:
        self.seen.append(("event", event))


def handler(request: dict[str, Any]) -> Any:
    if request["type"] == "close":
        return None
    if request["type"] == "step" and request["data"].get("drop"):
        raise ConnectionLostError("server crashed")
    return {"type": "observation", "data": {"observation": {}}}


async def test_a_user_hook_sees_calls_phases_and_messages_with_frozen_records() -> None:
    """call_started/finished pair with their token; attempts and connects are phases."""
    rec = Recorder()
    async with GenericEnvClient("http://env.test", transport=MockTransport(handler),
                                hooks=[rec]) as env:
        await env.reset()
        await env.step({"a": 1})
    kinds = [k for k, _ in rec.seen]
    assert kinds.count("call_started") == kinds.count("call_finished") == 3  # connect too
    finished = [r for k, r in rec.seen if k == "call_finished"]
    assert [(c.method, c.outcome, c.error) for c in finished] == [
        ("connect", "ok", None), ("reset", "ok", None), ("step", "ok", None)]
    step = finished[-1]
    assert step.step_index == 0 and step.queue_wait is not None and step.duration > 0
    assert (step.server_address, step.server_port) == ("env.test", 80)
    phases = [(p.phase, p.method, p.attempt) for k, p in rec.seen if k == "phase_started"]
    assert phases[:3] == [("connect", "connect", 1), ("attempt", "reset", 1),
                          ("attempt", "step", 1)]
    assert ("close", "close", 1) in phases
    messages = [m for k, m in rec.seen if k == "message"]
    assert [d for d, _ in messages] == ["sent", "received", "sent", "received"]
    with pytest.raises(AttributeError):
        step.outcome = "error"  # type: ignore[misc]


async def test_failures_are_reported_with_the_error_and_events() -> None:
    """A failed call's record carries its error; a drop outside an episode is no recovery."""
    rec = Recorder()
    async with GenericEnvClient("http://env.test", transport=MockTransport(handler),
                                hooks=[rec]) as env:
        with pytest.raises(OutcomeUnknownError):
            await env.step({"drop": True})
    (failed,) = [r for k, r in rec.seen if k == "call_finished" and r.method == "step"]
    assert failed.outcome == "error" and isinstance(failed.error, OutcomeUnknownError)
    attempt_end = [p for k, p in rec.seen if k == "phase_finished" and p.phase.phase == "attempt"]
    assert isinstance(attempt_end[-1].error, ConnectionLostError)


async def test_a_failing_user_hook_never_fails_the_call() -> None:
    """Exceptions from a user's hook are logged and dropped; the call's result stands."""

    class Broken(ClientHook):
        def call_started(self, call: CallStarted) -> Any:
            raise RuntimeError("hook bug")

        def message(self, direction: str, size: int) -> None:
            raise RuntimeError("hook bug")

        def event(self, event: ClientEvent) -> None:
            raise RuntimeError("hook bug")

    rec = Recorder()
    async with GenericEnvClient("http://env.test", transport=MockTransport(handler),
                                hooks=[Broken(), rec]) as env:
        assert (await env.reset()).observation == {}
    assert any(k == "call_finished" for k, _ in rec.seen)
    async with GenericEnvClient("http://env.test", transport=MockTransport(handler),
                                hooks=[Broken()]) as env:  # alone, too
        assert (await env.reset()).observation == {}


async def test_the_telemetry_hook_combines_with_a_users_own() -> None:
    """hooks= replaces the default; ClientTelemetryHook keeps envlink's telemetry beside it."""
    rec = Recorder()
    hooks = [ClientTelemetryHook(), rec]
    async with GenericEnvClient("http://env.test", transport=MockTransport(handler),
                                hooks=hooks) as env:
        await env.reset()
    assert any(k == "call_finished" for k, _ in rec.seen)


async def test_several_user_hooks_nest_around_each_call_and_phase() -> None:
    """Two hooks start in order and finish in reverse order, phases inside calls, on a real
    call through the client (the chain's order, as the bridge's hooks have it)."""
    log: list[str] = []

    class Named(ClientHook):
        def __init__(self, name: str) -> None:
            self.name = name

        def call_started(self, call: CallStarted) -> Any:
            log.append(f"call {call.method} {self.name}")

        def call_finished(self, call: CallFinished, token: Any) -> None:
            log.append(f"/call {call.method} {self.name}")

        def phase_started(self, phase: PhaseStarted) -> Any:
            log.append(f"phase {phase.phase} {self.name}")

        def phase_finished(self, phase: PhaseFinished, token: Any) -> None:
            log.append(f"/phase {phase.phase.phase} {self.name}")

    async with GenericEnvClient("http://env.test", transport=MockTransport(handler),
                                hooks=[Named("a"), Named("b")]) as env:
        await env.connect()
        log.clear()
        await env.reset()
    reset = log[:log.index("/call reset a") + 1]
    assert reset == ["call reset a", "call reset b", "phase attempt a", "phase attempt b",
                     "/phase attempt b", "/phase attempt a", "/call reset b", "/call reset a"]


async def test_a_hook_may_decline_the_first_attempts_phase() -> None:
    """first_attempt_phases = False: no attempt phase for a first try (the call reports
    it); a resend is still an attempt phase. Beside a hook that wants them, both get them."""

    class RetriesOnly(Recorder):
        first_attempt_phases = False

    drops = {"n": 0}

    def flaky(request: dict[str, Any]) -> Any:
        if request["type"] == "state" and drops["n"] == 0:
            drops["n"] += 1
            raise ConnectionLostError("cut before the answer")
        if request["type"] == "state":
            return {"type": "state", "data": {"step_count": 0}}
        return handler(request)

    rec = RetriesOnly()
    async with GenericEnvClient("http://env.test", transport=MockTransport(flaky),
                                hooks=[rec]) as env:
        await env.state()  # a read outside an episode: resent after the lost connection
    attempts = [(p.method, p.attempt) for k, p in rec.seen
                if k == "phase_started" and p.phase == "attempt"]
    assert attempts == [("state", 2)]
    ends = [p.phase.attempt for k, p in rec.seen
            if k == "phase_finished" and p.phase.phase == "attempt"]
    assert ends == [2]
    assert [c.method for k, c in rec.seen if k == "call_finished"][-1] == "state"

    both, wanting = RetriesOnly(), Recorder()
    async with GenericEnvClient("http://env.test", transport=MockTransport(handler),
                                hooks=[both, wanting]) as env:
        await env.reset()
    for hook in (both, wanting):
        assert ("reset", 1) in [(p.method, p.attempt) for k, p in hook.seen
                                if k == "phase_started" and p.phase == "attempt"]
