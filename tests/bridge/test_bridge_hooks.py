"""Bridge hooks: the records a hook receives, several hooks, failing hooks, no hooks."""

from __future__ import annotations

import asyncio
import contextvars
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider

from envlink import (
    Bridge,
    BridgeCallFinished,
    BridgeCallStarted,
    CallTimeoutError,
    ClientClosedError,
)
from envlink.telemetry import BridgeTelemetryHook

from .._otel_support import Otel

pytestmark = pytest.mark.timeout(20)

tag: contextvars.ContextVar[str] = contextvars.ContextVar("tag", default="-")


class Recorder:
    """A hook that keeps what it is told, and tags the coroutine's context."""

    def __init__(self, name: str = "r", log: list[str] | None = None) -> None:
        self.name = name
        self.log = log if log is not None else []
        self.started: list[BridgeCallStarted] = []
        self.finished: list[tuple[BridgeCallFinished, Any]] = []

    def call_started(self, call: BridgeCallStarted) -> str:
        self.started.append(call)
        self.log.append(f"start {self.name}")
        call.context.run(tag.set, f"set by {self.name}")
        return f"token {self.name}"

    def call_finished(self, call: BridgeCallFinished, token: Any) -> None:
        self.log.append(f"finish {self.name}")
        self.finished.append((call, token))


async def read_tag() -> str:
    return tag.get()


async def fail() -> None:
    raise KeyError("nope")


async def hang() -> None:
    await asyncio.Event().wait()


def test_a_hook_sees_each_call_and_can_set_the_coroutines_context() -> None:
    """call_started gets the method and the copied context (what it sets there the coroutine
    sees, the caller does not); call_finished gets outcome, timings and its token back."""
    hook = Recorder()
    with Bridge(hooks=[hook]) as bridge:
        assert bridge.call(read_tag, timeout=5, method="read") == "set by r"
    assert tag.get() == "-"
    ((started,), ((finished, token),)) = (hook.started, hook.finished)
    assert started.method == "read"
    assert token == "token r"
    assert finished.method == "read"
    assert finished.outcome == "ok"
    assert finished.error is None and finished.error_type is None
    assert finished.run_time is not None
    assert 0 <= finished.queue_wait <= finished.duration
    assert 0 <= finished.run_time <= finished.duration < 5


def test_failures_and_timeouts_reach_the_hook_as_outcomes() -> None:
    """A coroutine's exception is outcome=error with that error; the bridge's timeout is
    outcome=timeout with the CallTimeoutError the caller got."""
    hook = Recorder()
    with Bridge(hooks=[hook]) as bridge:
        with pytest.raises(KeyError):
            bridge.call(fail, timeout=5)
        with pytest.raises(CallTimeoutError) as timed_out:
            bridge.call(hang, timeout=0.01)
    (error, _), (timeout, _) = hook.finished
    assert (error.outcome, error.error_type) == ("error", KeyError)
    assert (timeout.outcome, timeout.error) == ("timeout", timed_out.value)


def test_records_are_frozen() -> None:
    """The detail records cannot be changed by a hook."""
    hook = Recorder()
    with Bridge(hooks=[hook]) as bridge:
        bridge.call(read_tag, timeout=5)
    with pytest.raises(AttributeError):
        hook.finished[0][0].outcome = "error"  # type: ignore[misc]


def test_several_hooks_start_in_order_and_finish_in_reverse() -> None:
    """Hooks nest like context managers; each gets its own token back."""
    log: list[str] = []
    first, second = Recorder("a", log), Recorder("b", log)
    with Bridge(hooks=[first, second]) as bridge:
        assert bridge.call(read_tag, timeout=5) == "set by b"
    assert log == ["start a", "start b", "finish b", "finish a"]
    assert [t for _, t in first.finished] == ["token a"]
    assert [t for _, t in second.finished] == ["token b"]


class Broken:
    def call_started(self, call: BridgeCallStarted) -> None:
        raise RuntimeError("hook bug")

    def call_finished(self, call: BridgeCallFinished, token: Any) -> None:
        raise RuntimeError("hook bug")


class BrokenAtEnd(Recorder):
    def call_finished(self, call: BridgeCallFinished, token: Any) -> None:
        raise RuntimeError("hook bug")


@pytest.mark.parametrize("hooks", [[Broken()], [BrokenAtEnd()], [Broken(), Recorder()]])
def test_a_failing_hook_never_reaches_the_caller(hooks: list[Any]) -> None:
    """Whatever a hook raises is logged; the caller gets the coroutine's result or error."""
    with Bridge(hooks=hooks) as bridge:
        assert bridge.call(read_tag, timeout=5) in ("-", "set by r")
        with pytest.raises(KeyError):
            bridge.call(fail, timeout=5)


def test_no_hooks_means_no_telemetry(otel: Otel) -> None:
    """hooks=() turns the bridge's telemetry off, even with an SDK configured."""
    with Bridge(hooks=()) as bridge:
        tracer = otel.tracer_provider.get_tracer("test")
        with tracer.start_as_current_span("caller"):
            bridge.call(read_tag, timeout=5)
    assert [s.name for s in otel.spans()] == ["caller"]


def test_the_telemetry_hook_combines_with_others(otel: Otel) -> None:
    """BridgeTelemetryHook passed explicitly emits the same span as the default hook."""
    hook = Recorder()
    with Bridge(hooks=[BridgeTelemetryHook(otel.tracer_provider, otel.meter_provider),
                       hook]) as bridge:
        bridge.call(read_tag, timeout=5, method="reset")
    assert [s.name for s in otel.spans()] == ["envlink.bridge reset"]
    assert len(hook.finished) == 1


def test_providers_and_hooks_together_are_refused() -> None:
    """Providers configure the default hooks; giving both is a caller error."""
    with pytest.raises(ValueError, match="default hooks"):
        Bridge(hooks=[Recorder()], tracer_provider=TracerProvider())


def test_a_call_refused_before_the_hand_off_is_not_reported() -> None:
    """A call on a closed bridge raises at once and reaches no hook."""
    hook = Recorder()
    bridge = Bridge(hooks=[hook])
    bridge.close()
    with pytest.raises(ClientClosedError):
        bridge.call(read_tag, timeout=5)
    assert hook.started == hook.finished == []


class BrokenAtStart(Recorder):
    def call_started(self, call: BridgeCallStarted) -> str:
        super().call_started(call)
        raise RuntimeError("hook bug")


def test_a_lone_failing_hook_follows_the_chains_rules(caplog: pytest.LogCaptureFixture) -> None:
    """A lone hook, called directly by the bridge, is treated as a chain treats its hooks:
    its failure is logged on envlink.bridge, and a hook whose start raised is not finished."""
    hook = BrokenAtStart()
    with caplog.at_level("WARNING", logger="envlink.bridge"), Bridge(hooks=[hook]) as bridge:
        assert bridge.call(read_tag, timeout=5) == "set by r"
    assert len(hook.started) == 1 and hook.finished == []
    (record,) = [r for r in caplog.records if r.name == "envlink.bridge"]
    assert record.getMessage().startswith("envlink bridge: hook <") and record.exc_info
