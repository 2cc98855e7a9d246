"""The recovery strategies' interface: a frozen context of the session's parts, no driver."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from envlink import ConnectionLostError
from envlink._client.recovery import RecoveryContext, ReplayStrategy, recover
from envlink._sansio.policies import RecoveryMechanism
from envlink._sansio.protocol import ObservationFrame
from envlink._sansio.session import Action, Call, Decision, DropReason, Episode, Frame
from envlink.hooks import ClientEvent, PhaseStarted
from envlink.names import HOOK_RECOVERY_FINISHED, LOG_SESSION_LOST

from ._parts import Parts, build, obs, turn

pytestmark = pytest.mark.timeout(30)


def counter(requests: list[tuple[str, Any]]) -> Any:
    def handler(request: dict[str, Any]) -> Any:
        requests.append((request["type"], request.get("data")))
        if request["type"] == "close":
            return None
        if request["type"] == "reset":
            return obs(n=0)
        return obs(n=request["data"]["move"])
    return handler


async def play(parts: Parts, method: str, data: dict[str, Any]) -> ObservationFrame:
    """One call through the driver, followed in the journal as the client does."""
    driver, core = parts.driver, parts.core

    async def run(call: Call) -> ObservationFrame:
        async with turn(driver, call):
            frame = driver.expect(await driver.request(call, data), ObservationFrame, method)
            core.answered(method, data, frame, call=call)
            return frame

    return await driver.call(method, 5.0, run)


def test_the_driver_hands_recovery_its_own_parts_frozen() -> None:
    """driver.recovery() carries this session's core, connector, hook, exchange and
    verifier, and a strategy cannot swap any of them."""
    parts = build(counter([]))
    ctx = parts.driver.recovery()
    assert ctx.core is parts.core
    assert ctx.connector is parts.connector
    assert ctx.hook is parts.hook
    assert ctx.exchange == parts.driver.exchange
    assert ctx.replay_verify({"a": 1}, {"a": 1}) and not ctx.replay_verify({"a": 1}, {"a": 2})
    with pytest.raises(dataclasses.FrozenInstanceError):
        ctx.core = parts.core  # type: ignore[misc]


async def test_replay_runs_on_the_context_alone() -> None:
    """recover() given only a RecoveryContext rebuilds the episode on a new connection
    opened by the connector (reason "replay"), replays the journal in order, then sends
    the interrupted step, and reports the loss and the recovery."""
    requests: list[tuple[str, Any]] = []
    parts = build(counter(requests), on_session_lost="replay")
    await play(parts, "reset", {"seed": 1})
    await play(parts, "step", {"move": 1})
    parts.connector.drop(DropReason.FAILED)
    requests.clear()

    ctx = parts.driver.recovery()
    frame = await recover(ctx, parts.core.lost_mid_episode(), Call("step"), {"move": 3}, None,
                          cause=ConnectionLostError("cut"), strategies={"replay": ReplayStrategy()})

    assert isinstance(frame, ObservationFrame) and frame.data.observation == {"n": 3}
    assert requests == [("reset", {"seed": 1}), ("step", {"move": 1}), ("step", {"move": 3})]
    assert parts.core.episode is Episode.ACTIVE
    connects = [p for p in parts.hook.of(PhaseStarted) if p.phase == "connect"]
    assert connects[-1].reason == "replay"
    assert connects[-1].server_address == "env.test"
    replays = [p for p in parts.hook.of(PhaseStarted) if p.phase == "replay"]
    assert [(p.attempt, p.replay_steps, p.server_address) for p in replays] == [
        (1, 1, "env.test")]
    events = parts.hook.events()
    assert events.index(LOG_SESSION_LOST) < events.index(HOOK_RECOVERY_FINISHED)
    await parts.driver.close(1.0)


async def test_a_new_strategy_needs_nothing_but_the_context() -> None:
    """A strategy registered by name is handed the context and may finish the call with
    the context's connector and exchange alone."""
    requests: list[tuple[str, Any]] = []
    parts = build(counter(requests), on_session_lost="replay")
    await play(parts, "reset", {"seed": 1})
    parts.connector.drop(DropReason.FAILED)
    seen: list[RecoveryContext] = []

    class Fresh:
        name = "replay"

        async def recover(self, ctx: RecoveryContext, call: Call, data: dict[str, Any] | None,
                          request_id: str | None, cause: BaseException | None) -> Frame | None:
            seen.append(ctx)
            conn = await ctx.connector.open("recover", reason="replay")
            return await ctx.exchange(conn, call.method, data, request_id, call=call)

    frame = await recover(parts.driver.recovery(), parts.core.lost_mid_episode(), Call("step"),
                          {"move": 5}, None, cause=None, strategies={"replay": Fresh()})
    assert isinstance(frame, ObservationFrame) and frame.data.observation == {"n": 5}
    assert len(seen) == 1 and seen[0].core is parts.core
    assert requests[-1] == ("step", {"move": 5})
    await parts.driver.close(1.0)


async def test_recover_carries_out_the_decision_it_is_given() -> None:
    """recover() ends exactly the server sessions the core's decision names, in the way it
    says, and reports the decision's mechanism: it does not apply the policy again."""
    parts = build(counter([]), on_session_lost="replay")
    await play(parts, "reset", {"seed": 1})
    parts.connector.drop(DropReason.FAILED)
    released: list[str] = []
    closed: list[str] = []
    parts.connector.release_later = released.append  # type: ignore[method-assign]
    parts.connector.close_detached_later = closed.append  # type: ignore[method-assign]
    decision = Decision(Action.RECOVER, strategy=RecoveryMechanism.REPLAY, release="tok-x",
                        close_detached="det-x")

    frame = await recover(parts.driver.recovery(), decision, Call("step"), {"move": 2}, None,
                          cause=None, strategies={"replay": ReplayStrategy()})

    assert isinstance(frame, ObservationFrame) and frame.data.observation == {"n": 2}
    assert (released, closed) == (["tok-x"], ["det-x"])
    lost = [e for e in parts.hook.of(ClientEvent) if e.name == LOG_SESSION_LOST]
    assert [e.fields["mechanism"] for e in lost] == ["replay"]
    await parts.driver.close(1.0)
