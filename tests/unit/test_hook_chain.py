"""The one hook chain: the same rules for the client's hooks and the bridge's."""

from __future__ import annotations

import contextvars
import logging
from typing import Any

import pytest

from envlink import (
    BridgeCallFinished,
    BridgeCallStarted,
    CallFinished,
    CallStarted,
    ClientEvent,
    ClientHook,
    PhaseFinished,
    PhaseStarted,
)
from envlink._bridge.hook_chain import HookChain, combine
from envlink._bridge.observers import combine_hooks
from envlink._events.client_events import combine_client_hooks
from envlink.telemetry import ClientTelemetryHook

pytestmark = pytest.mark.timeout(10)

CALL = CallStarted("step", "h", 1, None, None)
CALL_END = CallFinished("step", "ok", 0.1, None, 0.0, 0, None, "h", 1)
PHASE = PhaseStarted("attempt", "step")
PHASE_END = PhaseFinished(PHASE, None)
BRIDGE_CALL = BridgeCallStarted("step", contextvars.copy_context())
BRIDGE_END = BridgeCallFinished("step", "ok", 0.0, 0.1, 0.1, None)


class Recorder(ClientHook):
    """Answers both hook protocols; logs what it is told and checks its own token."""

    def __init__(self, name: str, log: list[str], *, fail: frozenset[str] = frozenset()):
        self.name, self.log, self.fail = name, log, fail

    def _note(self, what: str) -> None:
        self.log.append(f"{what} {self.name}")
        if what in self.fail:
            raise RuntimeError(f"{self.name} broke in {what}")

    def call_started(self, call: Any) -> str:
        self._note("call_started")
        return f"call {self.name}"

    def call_finished(self, call: Any, token: Any) -> None:
        assert token == f"call {self.name}"
        self._note("call_finished")

    def phase_started(self, phase: PhaseStarted) -> str:
        self._note("phase_started")
        return f"phase {self.name}"

    def phase_finished(self, phase: PhaseFinished, token: Any) -> None:
        assert token == f"phase {self.name}"
        self._note("phase_finished")

    def message(self, direction: str, size: int) -> None:
        self._note("message")

    def event(self, event: ClientEvent) -> None:
        self._note("event")

    def __repr__(self) -> str:
        return f"<hook {self.name}>"


def _client_call(hook: ClientHook) -> None:
    """A call with one phase inside it, as the client reports them."""
    call = hook.call_started(CALL)
    phase = hook.phase_started(PHASE)
    hook.message("sent", 3)
    hook.event(ClientEvent("envlink.x", None, {}))
    hook.phase_finished(PHASE_END, phase)
    hook.call_finished(CALL_END, call)


def _bridge_call(hook: Any) -> None:
    token = hook.call_started(BRIDGE_CALL)
    hook.call_finished(BRIDGE_END, token)


def test_client_hooks_start_in_order_finish_in_reverse_and_nest() -> None:
    """A phase's hooks nest inside the call's, each level started a, b and finished b, a;
    notifications go to every hook in order; each hook gets its own token back."""
    log: list[str] = []
    _client_call(combine_client_hooks([Recorder("a", log), Recorder("b", log)]))
    assert log == ["call_started a", "call_started b", "phase_started a", "phase_started b",
                   "message a", "message b", "event a", "event b",
                   "phase_finished b", "phase_finished a", "call_finished b", "call_finished a"]


def test_bridge_hooks_start_in_order_and_finish_in_reverse() -> None:
    """The bridge's chain follows the same order, each hook with its own token."""
    log: list[str] = []
    _bridge_call(combine_hooks([Recorder("a", log), Recorder("b", log)]))
    assert log == ["call_started a", "call_started b", "call_finished b", "call_finished a"]


def test_a_chain_of_chains_nests_as_one() -> None:
    """A combined hook combined again keeps the order: its hooks nest inside the outer ones."""
    log: list[str] = []
    inner = combine_client_hooks([Recorder("b", log), Recorder("c", log)])
    _client_call(combine_client_hooks([Recorder("a", log), inner]))
    calls = [e for e in log if e.startswith("call_")]
    assert calls == ["call_started a", "call_started b", "call_started c",
                     "call_finished c", "call_finished b", "call_finished a"]


@pytest.mark.parametrize(("combine_for", "run", "logger", "owner"), [
    (combine_client_hooks, _client_call, "envlink.client", "envlink client"),
    (combine_hooks, _bridge_call, "envlink.bridge", "envlink bridge"),
])
@pytest.mark.parametrize("broken", ["call_started", "call_finished"])
def test_a_raising_hook_is_logged_and_skipped_by_either_chain(
        caplog: pytest.LogCaptureFixture, combine_for: Any, run: Any, logger: str, owner: str,
        broken: str) -> None:
    """Whatever a hook raises never leaves the chain: it is logged (with the hook and the
    traceback) on the owner's logger, the other hooks still run, and a hook whose start
    raised is not finished."""
    log: list[str] = []
    hooks = [Recorder("a", log), Recorder("b", log, fail=frozenset({broken})),
             Recorder("c", log)]
    with caplog.at_level(logging.WARNING, logger=logger):
        run(combine_for(hooks))
    calls = [e for e in log if e.startswith("call_")]
    if broken == "call_started":
        assert calls == ["call_started a", "call_started b", "call_started c",
                         "call_finished c", "call_finished a"]
    else:
        assert calls == ["call_started a", "call_started b", "call_started c",
                         "call_finished c", "call_finished b", "call_finished a"]
    (record,) = [r for r in caplog.records if r.name == logger]
    assert record.getMessage() == f"{owner}: hook <hook b> failed"
    assert record.exc_info is not None and "b broke in" in str(record.exc_info[1])


def test_a_raising_notification_is_logged_and_the_others_still_hear_it(
        caplog: pytest.LogCaptureFixture) -> None:
    """message and event follow the same rule as the paired methods."""
    log: list[str] = []
    chain = combine_client_hooks([Recorder("a", log, fail=frozenset({"message", "event"})),
                                  Recorder("b", log)])
    with caplog.at_level(logging.WARNING, logger="envlink.client"):
        chain.message("sent", 1)
        chain.event(ClientEvent("envlink.x", None, {}))
    assert log == ["message a", "message b", "event a", "event b"]
    assert len([r for r in caplog.records if r.name == "envlink.client"]) == 2


def test_an_interrupt_goes_through_the_chain() -> None:
    """Only an Exception is a hook's failure: KeyboardInterrupt reaches the caller."""

    class Interrupting(ClientHook):
        def call_started(self, call: CallStarted) -> None:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        combine_client_hooks([Interrupting(), ClientHook()]).call_started(CALL)


def test_what_combine_returns_for_none_and_one() -> None:
    """No hooks: the owner's stand-in. One hook: itself where it declares never_raises or
    its owner catches (the bridge), else a chain (a user's lone client hook)."""
    assert combine([], HookChain) is None
    assert combine_hooks([]) is None
    assert type(combine_client_hooks([])) is ClientHook
    emitter = ClientTelemetryHook()
    assert combine_client_hooks([emitter]) is emitter
    mine = Recorder("a", [])
    assert combine_hooks([mine]) is mine
    chained = combine_client_hooks([mine])
    assert isinstance(chained, HookChain) and chained.hooks == (mine,)
    assert isinstance(combine_hooks([mine, mine]), HookChain)
