"""Session recovery when the connection is lost mid-episode: raise, replay, resume."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator
from typing import Any

import pytest

from envlink import (
    CallTimeoutError,
    CapacityReachedError,
    ConnectionLostError,
    GenericEnvClient,
    ProtocolError,
    ReconnectPolicy,
    ReplayDivergedError,
    ServerError,
    SessionLostError,
)
from envlink.server import EnvServer, StepResult

pytestmark = pytest.mark.timeout(30)

MOVES = [1, -2, 3, 0, 5, -1, 2, 2]


async def control_run(moves: list[int], seed: int = 7) -> list[dict[str, Any]]:
    """The observations of an undisturbed episode, for comparison."""
    async with EnvServer(env="deterministic") as srv, GenericEnvClient(srv.url) as env:
        out = [(await env.reset(seed=seed, max_steps=100)).observation]
        for m in moves:
            out.append((await env.step({"move": m})).observation)
        return out


@pytest.fixture(params=[True, False], ids=["extensions", "plain"])
async def det(request: pytest.FixtureRequest) -> AsyncIterator[EnvServer]:
    async with EnvServer(env="deterministic", extensions=request.param) as srv:
        yield srv


@pytest.mark.parametrize("mode", ["before_apply", "after_apply", "mid_answer"])
async def test_raise_gives_the_journal_and_keeps_the_client_usable(det: EnvServer,
                                                                   mode: str) -> None:
    """on_session_lost='raise': SessionLostError with the journal (the reset and the
    count of steps, none of them kept); the next reset works."""
    env = GenericEnvClient(det.url)
    try:
        await env.reset(seed=3, max_steps=100)
        for m in MOVES[:3]:
            await env.step({"move": m})
        det.faults.drop_after = 5  # the 4th step on this connection
        det.faults.drop_mode = mode  # type: ignore[assignment]
        with pytest.raises(SessionLostError) as info:
            await env.step({"move": 9})
        journal = info.value.journal
        assert journal is not None
        assert journal.reset_kwargs == {"seed": 3, "max_steps": 100}
        assert (journal.steps_applied, journal.step_count, journal.entries) == (3, 3, [])
        assert not journal.replayable
        fresh = await env.reset(seed=3, max_steps=100)
        assert fresh.observation["step"] == 0
        if det.extensions:
            # The detached old session was ended in the background, not left for its
            # whole grace window.
            await asyncio.wait_for(det.wait_for("session.destroyed", 1), 5)
            assert len(det.sessions()) == 1
    finally:
        await env.close()


async def test_raise_with_record_steps_gives_every_step(det: EnvServer) -> None:
    """Under 'raise' with record_steps set, the lost episode's journal holds every step."""
    env = GenericEnvClient(det.url)
    env.record_steps = True
    try:
        await env.reset(seed=3, max_steps=100)
        for m in MOVES[:3]:
            await env.step({"move": m})
        det.faults.drop_after = 5
        det.faults.drop_mode = "after_apply"
        with pytest.raises(SessionLostError) as info:
            await env.step({"move": 9})
        journal = info.value.journal
        assert journal is not None and journal.replayable
        assert [e.action for e in journal.entries] == [{"move": m} for m in MOVES[:3]]
        assert journal.entries[-1].response["observation"]["step"] == 3
    finally:
        await env.close()


@pytest.mark.parametrize("mode", ["before_apply", "after_apply", "mid_answer"])
async def test_replay_continues_with_identical_observations(det: EnvServer, mode: str) -> None:
    """on_session_lost='replay': the episode continues as if nothing happened, counted exactly."""
    expected = await control_run(MOVES)
    env = GenericEnvClient(det.url, on_session_lost="replay")
    try:
        got = [(await env.reset(seed=7, max_steps=100)).observation]
        for i, m in enumerate(MOVES):
            if i == 4:
                det.faults.drop_after = 6  # reset + 4 steps, then this one
                det.faults.drop_mode = mode  # type: ignore[assignment]
            got.append((await env.step({"move": m})).observation)
        assert got == expected
        state = await env.state()
        assert state["step_count"] == len(MOVES)
        if det.extensions:
            # The detached old session was released (ended) before the replay's new one.
            assert det.connections_opened == 3
            assert det.counter("session.destroyed") == 1
            assert len(det.sessions()) == 1
        else:
            assert det.connections_opened == 2
    finally:
        await env.close()


async def test_replay_detects_divergence() -> None:
    """A server that answers differently on replay raises ReplayDivergedError at that step."""
    sessions = itertools.count()

    class Drifting:
        def __init__(self) -> None:
            self.generation = next(sessions)
            self.n = 0

        def reset(self, **kwargs: Any) -> StepResult:
            self.n = 0
            return StepResult(observation={"n": 0})

        def step(self, action: dict[str, Any]) -> StepResult:
            self.n += 1
            # From the second step on, a new session answers differently.
            return StepResult(observation={"n": self.n, "g": self.generation if self.n > 1 else 0})

        def state(self) -> dict[str, Any]:
            return {"step_count": self.n}

    async with EnvServer(env=Drifting, extensions=False) as srv:
        env = GenericEnvClient(srv.url, on_session_lost="replay")
        try:
            await env.reset()
            await env.step({})
            await env.step({})
            srv.faults.drop_after = 4
            with pytest.raises(ReplayDivergedError) as info:
                await env.step({})
            assert info.value.index == 1
            assert info.value.expected["observation"]["g"] == 0
            assert info.value.actual["observation"]["g"] == 1
        finally:
            await env.close()


async def test_replay_refuses_a_truncated_journal(det: EnvServer) -> None:
    """Past max_journal_steps replay is impossible and SessionLostError says why."""
    env = GenericEnvClient(det.url, on_session_lost="replay", max_journal_steps=2)
    try:
        await env.reset(seed=1, max_steps=100)
        for m in MOVES[:3]:
            await env.step({"move": m})
        det.faults.drop_after = 5
        with pytest.raises(SessionLostError, match="max_journal_steps=2"):
            await env.step({"move": 1})
    finally:
        await env.close()


@pytest.mark.parametrize("mode", ["before_apply", "after_apply", "mid_answer"])
async def test_resume_reattaches_without_replay_and_applies_once(mode: str) -> None:
    """on_session_lost='resume': same server session, no replay, the step applied exactly once."""
    expected = await control_run(MOVES)
    async with EnvServer(env="deterministic") as srv:
        env = GenericEnvClient(srv.url, on_session_lost="resume")
        try:
            got = [(await env.reset(seed=7, max_steps=100)).observation]
            for i, m in enumerate(MOVES):
                if i == 4:
                    srv.faults.drop_after = 6
                    srv.faults.drop_mode = mode  # type: ignore[assignment]
                got.append((await env.step({"move": m})).observation)
            assert got == expected
            assert srv.steps_applied == len(MOVES)  # nothing replayed, nothing twice
            assert srv.resumes == 1
            assert srv.dedup_hits == (0 if mode == "before_apply" else 1)
            assert (await env.state())["step_count"] == len(MOVES)
        finally:
            await env.close()


async def test_resume_after_the_grace_window_raises() -> None:
    """A session whose grace window is over cannot be resumed: SessionLostError."""
    async with EnvServer(env="deterministic", resume_grace=0) as srv:
        env = GenericEnvClient(srv.url, on_session_lost="resume")
        try:
            await env.reset(seed=1, max_steps=100)
            srv.faults.drop_after = 2
            with pytest.raises(SessionLostError):
                await env.step({"move": 1})
            assert (await env.reset(seed=1, max_steps=100)).observation["step"] == 0
        finally:
            await env.close()


async def test_resume_on_a_vanilla_server_says_it_is_unsupported() -> None:
    """Against a server without the extension, resume degrades to raise with the reason."""
    async with EnvServer(env="deterministic", extensions=False) as srv:
        env = GenericEnvClient(srv.url, on_session_lost="resume")
        try:
            await env.reset(seed=1, max_steps=100)
            srv.faults.drop_after = 2
            with pytest.raises(SessionLostError, match="does not offer session resumption"):
                await env.step({"move": 1})
        finally:
            await env.close()


async def test_state_mid_episode_is_recovered_by_replay(det: EnvServer) -> None:
    """A state() call that loses the connection replays, then answers for the rebuilt session."""
    env = GenericEnvClient(det.url, on_session_lost="replay")
    try:
        await env.reset(seed=2, max_steps=100)
        for m in MOVES[:3]:
            await env.step({"move": m})
        det.faults.drop_after = 5
        det.faults.drop_mode = "after_apply"
        state = await env.state()
        assert state["step_count"] == 3
        assert state["position"] == sum(MOVES[:3])
    finally:
        await env.close()


async def test_a_deadline_during_replay_loses_the_episode_loudly(det: EnvServer) -> None:
    """A replay cut short by the deadline leaves nothing half-built: later calls say so."""
    env = GenericEnvClient(det.url, on_session_lost="replay", ping_timeout=0.2)
    try:
        await env.reset(seed=5, max_steps=100)
        for m in MOVES[:4]:
            await env.step({"move": m})
        first = det.connections[0]
        first.faults.drop_after = first.requests + 1
        task = asyncio.ensure_future(env.step({"move": 1}, timeout=0.5))
        # With extensions the old session is released first (one more connection).
        replaying = await det.wait_for_connection(3 if det.extensions else 2)
        replaying.faults.stall_after = 3  # reset + 1 replayed step, then the replay stalls
        with pytest.raises(CallTimeoutError):
            await task
        with pytest.raises(SessionLostError, match="call reset"):
            await env.step({"move": 1})
        with pytest.raises(SessionLostError):
            await env.state()
        assert (await env.reset(seed=5, max_steps=100)).observation["step"] == 0
        assert (await env.step({"move": 1})).observation["step"] == 1
    finally:
        det.unstall_all()
        await env.close()


async def test_after_replay_diverged_no_call_runs_on_the_diverged_session() -> None:
    """After ReplayDivergedError the next step raises instead of using the half-replayed session."""
    sessions = itertools.count()

    class Drifting:
        def __init__(self) -> None:
            self.generation = next(sessions)

        def reset(self, **kwargs: Any) -> StepResult:
            return StepResult(observation={"g": self.generation})

        def step(self, action: dict[str, Any]) -> StepResult:
            return StepResult(observation={})

        def state(self) -> dict[str, Any]:
            return {}

    async with EnvServer(env=Drifting, extensions=False) as srv:
        env = GenericEnvClient(srv.url, on_session_lost="replay")
        try:
            await env.reset()
            srv.faults.drop_after = 2
            with pytest.raises(ReplayDivergedError):
                await env.step({})
            with pytest.raises(SessionLostError, match="call reset"):
                await env.step({})
        finally:
            await env.close()


async def test_a_failed_reset_on_a_fresh_session_does_not_continue_the_old_episode(
        plain_det: EnvServer) -> None:
    """Mid-episode drop, then a reset that fails: a step must not run on the fresh session."""
    env = GenericEnvClient(plain_det.url)
    try:
        await env.reset(seed=1, max_steps=100)
        for m in MOVES[:3]:
            await env.step({"move": m})
        plain_det.connections[0].abort()
        await plain_det.wait_for_disconnect(1)
        plain_det.faults.error_frames = 1
        with pytest.raises(ServerError):
            await env.reset(seed=1, max_steps=100)
        with pytest.raises(SessionLostError, match="call reset"):
            await env.step({"move": 1})
        assert plain_det.steps_applied == 3
    finally:
        await env.close()


async def test_resume_survives_a_second_drop_while_resuming() -> None:
    """A drop during the resumed resend is retried under the policy; applied exactly once."""
    async with EnvServer(env="deterministic") as srv:
        env = GenericEnvClient(srv.url, on_session_lost="resume")
        try:
            await env.reset(seed=9, max_steps=100)
            for m in MOVES[:3]:
                await env.step({"move": m})
            first = srv.connections[0]
            first.faults.drop_after = first.requests + 1
            first.faults.drop_mode = "after_apply"
            task = asyncio.ensure_future(env.step({"move": 7}, timeout=10))
            second = await srv.wait_for_connection(2)
            second.faults.drop_after = 1
            second.faults.drop_mode = "before_apply"
            result = await task
            assert result.observation["step"] == 4
            assert srv.steps_applied == 4
            assert srv.resumes == 2
            assert (await env.state())["step_count"] == 4
        finally:
            await env.close()


async def test_flapping_is_reported_once_then_the_client_recovers() -> None:
    """After 'keeps dropping', a later call against a healthy server works again."""
    policy = ReconnectPolicy(max_attempts=2, stable_after=60.0)
    async with EnvServer(env="echo") as srv:
        env = GenericEnvClient(srv.url, reconnect=policy)
        try:
            for _ in range(4):
                srv.faults.drop_after = 1
                srv.faults.drop_mode = "before_apply"
                with contextlib.suppress(ConnectionLostError):
                    await env.state()
            srv.faults.clear()
            assert (await env.state())["step_count"] == 0
        finally:
            await env.close()


@pytest.fixture
async def plain_det() -> AsyncIterator[EnvServer]:
    async with EnvServer(env="deterministic", extensions=False) as srv:
        yield srv


async def _lose_the_first_connection(srv: EnvServer, env: GenericEnvClient) -> None:
    """An episode of four steps whose connection the server then drops."""
    await env.reset(seed=4, max_steps=100)
    for m in MOVES[:4]:
        await env.step({"move": m})
    srv.connections[0].abort()
    await srv.wait_for_disconnect(1)


def _assert_lost_with_the_journal(lost: SessionLostError, cause: type[Exception]) -> None:
    assert not isinstance(lost, ReplayDivergedError), lost
    assert isinstance(lost.__cause__, cause), repr(lost.__cause__)
    assert lost.journal is not None
    assert lost.journal.reset_kwargs == {"seed": 4, "max_steps": 100}
    assert [e.action for e in lost.journal.entries] == [{"move": m} for m in MOVES[:4]]


async def test_replay_meeting_a_full_server_raises_session_lost_with_the_journal() -> None:
    """A replay refused for capacity is SessionLostError (journal, CapacityReachedError as
    cause), and the episode is lost consistently: the next step says so too."""
    async with EnvServer(env="deterministic", extensions=False, max_sessions=1) as srv:
        env = GenericEnvClient(srv.url, on_session_lost="replay")
        other = GenericEnvClient(srv.url)
        try:
            await _lose_the_first_connection(srv, env)
            await other.reset()  # takes the only slot
            with pytest.raises(SessionLostError) as info:
                await env.step({"move": 1})
            _assert_lost_with_the_journal(info.value, CapacityReachedError)
            with pytest.raises(SessionLostError, match="call reset"):
                await env.step({"move": 1})
        finally:
            await other.close()
            await env.close()


@pytest.mark.parametrize("extensions", [True, False], ids=["extensions", "plain"])
async def test_replay_meeting_a_corrupt_frame_raises_session_lost_with_the_journal(
        extensions: bool) -> None:
    """A replay cut by a protocol error is SessionLostError carrying the journal."""
    async with EnvServer(env="deterministic", extensions=extensions) as srv:
        env = GenericEnvClient(srv.url, on_session_lost="replay")
        try:
            await _lose_the_first_connection(srv, env)
            task = asyncio.ensure_future(env.step({"move": 1}))
            # With extensions the old session is released first (one more connection).
            replaying = await srv.wait_for_connection(3 if extensions else 2)
            replaying.faults.corrupt_frames = 1
            replaying.faults.corrupt_kind = "unknown_type"
            with pytest.raises(SessionLostError) as info:
                await task
            _assert_lost_with_the_journal(info.value, ProtocolError)
            with pytest.raises(SessionLostError, match="call reset"):
                await env.step({"move": 1})
        finally:
            await env.close()


@pytest.mark.parametrize("extensions", [True, False], ids=["extensions", "plain"])
async def test_replay_meeting_an_error_frame_is_not_a_divergence(extensions: bool) -> None:
    """An error frame answering the replayed reset is SessionLostError caused by the
    ServerError, not ReplayDivergedError("replay of step -1 ...")."""
    async with EnvServer(env="deterministic", extensions=extensions) as srv:
        env = GenericEnvClient(srv.url, on_session_lost="replay")
        try:
            await _lose_the_first_connection(srv, env)
            task = asyncio.ensure_future(env.step({"move": 1}))
            replaying = await srv.wait_for_connection(3 if extensions else 2)
            replaying.faults.error_frames = 1
            replaying.faults.error_code = "CAPACITY_REACHED"
            with pytest.raises(SessionLostError) as info:
                await task
            _assert_lost_with_the_journal(info.value, ServerError)
            with pytest.raises(SessionLostError, match="call reset"):
                await env.step({"move": 1})
        finally:
            await env.close()
