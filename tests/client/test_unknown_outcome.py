"""A step cut by a deadline or a cancellation after it was sent: outcome unknown, and the
journal follows what the server applied, so replay never silently diverges."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from structlog.testing import capture_logs

from envlink import CallTimeoutError, GenericEnvClient, SessionLostError
from envlink.server import EnvServer

pytestmark = pytest.mark.timeout(30)

MOVES = [1, -2, 3, 4, 5, -1]


async def control_run(moves: list[int], seed: int = 7) -> list[dict[str, Any]]:
    """The observations of an undisturbed episode, for comparison."""
    async with EnvServer(env="deterministic") as srv, GenericEnvClient(srv.url) as env:
        out = [(await env.reset(seed=seed, max_steps=100)).observation]
        for m in moves:
            out.append((await env.step({"move": m})).observation)
        return out


async def _start(env: GenericEnvClient) -> None:
    await env.reset(seed=7, max_steps=100)
    for m in MOVES[:3]:
        await env.step({"move": m})


async def _time_out_a_step_the_server_applies(srv: EnvServer, env: GenericEnvClient) -> None:
    """MOVES[3] times out, but the server applies it (its answer is merely late)."""
    srv.faults.latency = 0.3
    with pytest.raises(CallTimeoutError) as info:
        await env.step({"move": MOVES[3]}, timeout=0.05)
    assert info.value.outcome_unknown
    assert "may or may not have applied" in str(info.value)
    await srv.wait_for("applied.step", 4)
    srv.faults.latency = 0.0


async def test_late_answer_puts_the_applied_step_in_the_journal_and_replay_is_faithful(
        ) -> None:
    """With request ids the late answer settles the timed-out step into the journal; a
    later drop replays it, and the episode equals a fault-free run that includes it."""
    expected = await control_run(MOVES)
    async with EnvServer(env="deterministic") as srv:
        env = GenericEnvClient(srv.url, on_session_lost="replay")
        try:
            await _start(env)
            await _time_out_a_step_the_server_applies(srv, env)
            assert len(env.journal.unknown_steps) == 1
            # The next call reads the late answer first (dropped, but journaled).
            assert (await env.step({"move": MOVES[4]})).observation == expected[5]
            journal = env.journal
            assert journal.unknown_steps == []
            assert [e.response["observation"] for e in journal.entries] == expected[1:6]
            # Now the session is lost: replay must rebuild it with the applied step.
            first = srv.connections[0]
            first.faults.drop_after = first.requests + 1
            first.faults.drop_mode = "after_apply"
            assert (await env.step({"move": MOVES[5]})).observation == expected[6]
            assert (await env.state())["step_count"] == len(MOVES)
        finally:
            await env.close()


async def test_cancelled_step_is_settled_by_its_late_answer_too() -> None:
    """task.cancel() mid-step is the same as a deadline: the late answer is journaled."""
    expected = await control_run(MOVES[:5])
    async with EnvServer(env="deterministic") as srv:
        env = GenericEnvClient(srv.url, on_session_lost="replay")
        try:
            await _start(env)
            srv.faults.latency = 0.3
            task = asyncio.ensure_future(env.step({"move": MOVES[3]}))
            await srv.wait_for_request("step", 4)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert [json.loads(a) for a in env.journal.unknown_steps] == [{"move": MOVES[3]}]
            srv.faults.latency = 0.0
            assert (await env.step({"move": MOVES[4]})).observation == expected[5]
            assert [e.response["observation"] for e in env.journal.entries] == expected[1:6]
        finally:
            await env.close()


async def test_applied_step_whose_answer_never_arrived_makes_replay_refuse() -> None:
    """With request ids, a drop before the late answer is read: the old session's count
    shows the step was applied, its answer is lost, so replay raises SessionLostError
    saying the journal has a step of unknown outcome (never a silent divergence)."""
    async with EnvServer(env="deterministic") as srv:
        env = GenericEnvClient(srv.url, on_session_lost="replay")
        try:
            await _start(env)
            srv.faults.latency = 1.0  # the answer is still on its way when the drop comes
            with pytest.raises(CallTimeoutError):
                await env.step({"move": MOVES[3]}, timeout=0.05)
            await srv.wait_for("applied.step", 4)
            srv.connections[0].abort()
            await srv.wait_for_disconnect(1)
            srv.faults.latency = 0.0
            with pytest.raises(SessionLostError, match="unknown outcome") as info:
                await env.step({"move": MOVES[4]})
            journal = info.value.journal
            assert journal is not None
            assert [json.loads(a) for a in journal.unknown_steps] == [{"move": MOVES[3]}]
            assert journal.to_dict()["unknown_steps"] == [{"move": MOVES[3]}]
            assert len(journal.entries) == 3
            with pytest.raises(SessionLostError, match="call reset"):
                await env.step({"move": MOVES[4]})
        finally:
            await env.close()


async def test_plain_protocol_timed_out_step_makes_replay_refuse_not_diverge() -> None:
    """Without request ids the late answer cannot be read: the journal keeps the step as
    unknown and replay raises SessionLostError instead of rebuilding a different episode."""
    async with EnvServer(env="deterministic", extensions=False) as srv:
        env = GenericEnvClient(srv.url, on_session_lost="replay")
        try:
            await _start(env)
            await _time_out_a_step_the_server_applies(srv, env)
            assert srv.steps_applied == 4  # it did run: a replay of 3 steps would diverge
            with pytest.raises(SessionLostError, match="unknown outcome") as info:
                await env.step({"move": MOVES[4]})
            journal = info.value.journal
            assert journal is not None and not journal.replayable
            assert [json.loads(a) for a in journal.unknown_steps] == [{"move": MOVES[3]}]
            assert srv.steps_applied == 4  # nothing was replayed or resent
        finally:
            await env.close()


async def test_a_step_never_sent_leaves_no_unknown_outcome(server: EnvServer) -> None:
    """A deadline that expires while the call waits in the queue is not an unknown outcome."""
    async with GenericEnvClient(server.url) as env:
        await env.reset()
        server.faults.latency = 0.3
        slow = asyncio.ensure_future(env.step({"message": "slow"}))
        await server.wait_for_request("step", 1)
        with pytest.raises(CallTimeoutError) as info:
            await env.step({"message": "queued"}, timeout=0.05)
        assert not info.value.outcome_unknown
        await slow
        assert env.journal.unknown_steps == []
        assert env.journal.steps_applied == 1


async def test_a_timed_out_reset_does_not_let_the_old_episode_continue(
        server: EnvServer) -> None:
    """A reset cut after it was sent may have started a new episode: the old one is lost."""
    env = GenericEnvClient(server.url)
    try:
        await env.reset()
        await env.step({"message": "one"})
        server.faults.latency = 0.3
        with pytest.raises(CallTimeoutError) as info:
            await env.reset(timeout=0.05)
        assert info.value.outcome_unknown
        server.faults.latency = 0.0
        with pytest.raises(SessionLostError, match="call reset"):
            await env.step({"message": "two"})
        await env.reset()
        assert (await env.step({"message": "two"})).observation["echoed_message"] == "two"
    finally:
        await env.close()


async def test_resume_settles_a_step_the_server_never_applied_from_its_count() -> None:
    """Under resume, the resumed session's step count shows the cut step never ran: the
    journal drops it and describes exactly what the server applied."""
    async with EnvServer(env="deterministic") as srv:
        env = GenericEnvClient(srv.url, on_session_lost="resume", ping_timeout=0.2)
        try:
            await _start(env)
            first = srv.connections[0]
            first.faults.stall_after = first.requests + 1  # read, never applied
            with pytest.raises(CallTimeoutError) as info:
                await env.step({"move": MOVES[3]}, timeout=0.2)
            assert info.value.outcome_unknown
            assert len(env.journal.unknown_steps) == 1
            # The probe finds the stalled connection dead; resume re-attaches.
            await env.step({"move": MOVES[4]}, timeout=5)
            assert srv.resumes == 1
            journal = env.journal
            assert journal.unknown_steps == []
            assert (journal.steps_applied, journal.entries) == (4, [])  # none kept, all counted
            assert (await env.state())["step_count"] == 4
        finally:
            srv.unstall_all()
            await env.close()


async def test_the_error_after_a_timeout_that_dropped_the_connection_names_it() -> None:
    """Plain protocol: a timed-out step lets the connection go; the next call's
    SessionLostError names that CallTimeoutError (cause, message, the log's error=)."""
    async with EnvServer(env="deterministic", extensions=False) as srv:
        env = GenericEnvClient(srv.url)
        try:
            await _start(env)
            with capture_logs() as logs:
                await _time_out_a_step_the_server_applies(srv, env)
                with pytest.raises(SessionLostError) as info:
                    await env.step({"move": MOVES[4]})
            earlier = info.value.__cause__
            assert isinstance(earlier, CallTimeoutError)
            assert "earlier call failed: CallTimeoutError: step did not complete" in str(
                info.value)
            lost = [e for e in logs if e["event"] == "envlink.session_lost"]
            assert len(lost) == 1
            assert lost[0]["error"].startswith("CallTimeoutError: step did not complete")
            # Named once: a later reset starts afresh and its episode carries nothing over.
            await env.reset(seed=7, max_steps=100)
            await env.step({"move": 1})
        finally:
            await env.close()
