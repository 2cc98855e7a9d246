"""Deadlines: prompt CallTimeoutError, cancelled work, and no late answer delivered later."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator

import pytest

from envlink import (
    CallTimeoutError,
    ConnectError,
    GenericEnvClient,
    ProtocolError,
    ReconnectPolicy,
    SessionLostError,
    Timeout,
)
from envlink.server import EnvServer

pytestmark = pytest.mark.timeout(30)


async def test_deadline_during_a_stall_is_prompt_and_next_call_is_clean(
        any_server: EnvServer) -> None:
    """A stalled call fails with CallTimeoutError soon after its deadline; later calls are clean."""
    env = GenericEnvClient(any_server.url, on_session_lost="replay", ping_timeout=0.2)
    try:
        await env.reset()
        await env.step({"message": "one"})
        any_server.faults.stall_after = 3  # reset=1, step=2, this step=3
        start = time.perf_counter()
        with pytest.raises(CallTimeoutError) as info:
            await env.step({"message": "stalled"}, timeout=0.2)
        elapsed = time.perf_counter() - start
        assert isinstance(info.value, TimeoutError)
        assert info.value.method == "step"
        assert info.value.outcome_unknown  # the frame was sent: the server may have run it
        assert 0.2 <= elapsed < 1.0, elapsed  # a missed deadline would hang on the stall
        if not any_server.extensions:
            # The plain protocol cannot learn whether the stalled step ran: replaying
            # without it could silently diverge, so the episode is lost, and says why.
            with pytest.raises(SessionLostError, match="unknown outcome") as lost:
                await env.step({"message": "two"}, timeout=5)
            assert lost.value.journal is not None
            assert [json.loads(a) for a in lost.value.journal.unknown_steps] == [
                {"message": "stalled"}]
            return
        # With extensions the old session's own count shows the stalled step never ran;
        # the next step gets its own answer, replayed onto a new session.
        got = await env.step({"message": "two"}, timeout=5)
        assert got.observation["echoed_message"] == "two"
        assert (await env.state())["step_count"] == 2
        assert env.journal.unknown_steps == []
    finally:
        any_server.unstall_all()
        await env.close()


async def test_late_answer_is_dropped_by_request_id(server: EnvServer) -> None:
    """With extensions, a timed-out call's late answer is dropped and the connection kept."""
    async with GenericEnvClient(server.url) as env:
        await env.reset()
        server.faults.latency = 0.3
        with pytest.raises(CallTimeoutError):
            await env.step({"message": "late"}, timeout=0.05)
        server.faults.latency = 0.0
        # This request queues behind the late one on the server; the late answer
        # arrives first and must not be taken for this one.
        got = await env.step({"message": "mine"}, timeout=5)
        assert got.observation["echoed_message"] == "mine"
        assert env.connected
        assert server.connections_opened == 1


async def test_late_answer_on_plain_protocol_discards_the_connection(
        plain_server: EnvServer) -> None:
    """Without request ids, a timed-out call's connection is discarded, never read again."""
    env = GenericEnvClient(plain_server.url)
    try:
        await env.reset()
        plain_server.faults.latency = 0.3
        with pytest.raises(CallTimeoutError):
            await env.step({"message": "late"}, timeout=0.05)
        plain_server.faults.latency = 0.0
        assert not env.connected
        # Mid-episode and the session went with the connection: "raise" says so.
        with pytest.raises(SessionLostError):
            await env.step({"message": "next"})
        reset = await env.reset()
        assert reset.observation["echoed_message"] == "Echo environment ready!"
    finally:
        await env.close()


async def test_deadline_covers_queue_wait(server: EnvServer) -> None:
    """A call queued behind a slow one times out on its own deadline, then the queue moves on."""
    async with GenericEnvClient(server.url) as env:
        await env.reset()
        server.faults.latency = 0.3
        slow = asyncio.create_task(env.step({"message": "slow"}))
        await server.wait_for_request("step", 1)
        with pytest.raises(CallTimeoutError):
            await env.step({"message": "queued"}, timeout=0.05)
        assert (await slow).observation["echoed_message"] == "slow"
        server.faults.latency = 0.0
        assert (await env.step({"message": "after"})).observation["echoed_message"] == "after"


@pytest.fixture
async def silent_listener() -> AsyncIterator[int]:
    """A TCP listener on 127.0.0.1 that accepts and never answers the handshake."""
    held: list[asyncio.StreamWriter] = []

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    srv = await asyncio.start_server(accept, "127.0.0.1", 0)
    try:
        yield srv.sockets[0].getsockname()[1]
    finally:
        for w in held:
            w.close()
        srv.close()
        await srv.wait_closed()


async def test_connect_phase_has_its_own_deadline(silent_listener: int) -> None:
    """A handshake that never completes fails after the connect timeout, per attempt."""
    env = GenericEnvClient(f"ws://127.0.0.1:{silent_listener}",
                           timeout=Timeout(5.0, connect=0.1),
                           reconnect=ReconnectPolicy(max_attempts=2))
    start = time.perf_counter()
    with pytest.raises(ConnectError, match="timed out"):
        await env.reset()
    assert time.perf_counter() - start < 1.0
    await env.close()


async def test_call_deadline_bounds_reconnect_attempts(silent_listener: int) -> None:
    """The call deadline wins over a long reconnect policy: CallTimeoutError, promptly."""
    env = GenericEnvClient(f"ws://127.0.0.1:{silent_listener}",
                           timeout=Timeout(0.3, connect=0.1),
                           reconnect=ReconnectPolicy(max_attempts=100, max_elapsed=None))
    start = time.perf_counter()
    with pytest.raises(CallTimeoutError):
        await env.reset()
    assert time.perf_counter() - start < 3.0  # 100 attempts would take over 10 s
    await env.close()


async def test_deadline_while_sending_a_large_frame_never_shifts_answers(
        plain_server: EnvServer) -> None:
    """A deadline that fires while a big frame drains counts it as sent: no answer is shifted."""
    env = GenericEnvClient(plain_server.url, on_session_lost="replay")
    try:
        await env.reset()
        with pytest.raises(CallTimeoutError) as info:
            await env.step({"message": "x" * (12 * 1024 * 1024)}, timeout=0.01)
        assert info.value.outcome_unknown
        # The big step may have run: replay would be a guess, so the episode is lost
        # (loudly); the next episode gets its own answers, none shifted.
        with pytest.raises(SessionLostError, match="unknown outcome"):
            await env.step({"message": "second"}, timeout=10)
        await env.reset(timeout=10)
        for word in ("second", "third"):
            got = await env.step({"message": word}, timeout=10)
            assert got.observation["echoed_message"] == word
    finally:
        await env.close()


async def test_late_corrupt_answer_is_never_blamed_on_the_next_call(server: EnvServer) -> None:
    """With request ids, a late unattributable frame drops the connection; resume answers."""
    env = GenericEnvClient(server.url, on_session_lost="resume")
    try:
        await env.reset()
        server.faults.latency = 0.3
        server.faults.corrupt_frames = 1
        server.faults.corrupt_kind = "invalid_json"
        with pytest.raises(CallTimeoutError):
            await env.step({"message": "late"}, timeout=0.05)
        server.faults.latency = 0.0
        state = await env.state(timeout=5)
        assert state["step_count"] == 0  # the corrupt answer replaced the step: never applied
        assert server.resumes == 1
        got = await env.step({"message": "fine"}, timeout=5)
        assert got.observation["echoed_message"] == "fine"
    finally:
        await env.close()


async def test_a_request_over_the_servers_limit_is_a_protocol_error_not_a_storm() -> None:
    """The server's 1009 close for our oversize message is a ProtocolError, never retried."""
    async with EnvServer(env="echo", max_message_size=64 * 1024) as srv:
        env = GenericEnvClient(srv.url, on_session_lost="replay")
        try:
            await env.reset()
            with pytest.raises(ProtocolError, match="larger than its size limit"):
                await env.step({"message": "x" * 100_000})
            assert srv.connections_opened == 1
            got = await env.step({"message": "small"})  # replayed onto a new session
            assert got.observation["echoed_message"] == "small"
        finally:
            await env.close()


async def test_an_abandoned_session_does_not_hold_a_server_slot() -> None:
    """A reset after a kept timeout ends the old session: a 1-session server accepts the new one."""
    async with EnvServer(env="echo", max_sessions=1) as srv:
        env = GenericEnvClient(srv.url)
        try:
            await env.reset()
            srv.faults.latency = 0.3
            with pytest.raises(CallTimeoutError):
                await env.step({"message": "late"}, timeout=0.05)
            srv.faults.latency = 0.0
            reset = await env.reset(timeout=5)
            assert reset.observation["echoed_message"] == "Echo environment ready!"
            assert srv.counter("session.destroyed") == 1
        finally:
            await env.close()


@pytest.mark.parametrize("policy", ["raise", "replay", "resume"])
async def test_health_check_cut_by_a_deadline_leaves_the_connection_suspect(
        server: EnvServer, policy: str) -> None:
    """A probe cut short by a caller's deadline keeps the connection suspect: the next
    call probes again and fails over after the probe time, not its whole deadline."""
    env = GenericEnvClient(server.url, on_session_lost=policy)  # type: ignore[arg-type]
    try:
        await env.reset()
        server.faults.stall_after = 2  # reset=1, this step=2: the server stops reading
        for _ in range(2):  # the first times out on the stall, the second during the ping
            with pytest.raises(CallTimeoutError):
                await env.step({"message": "stalled"}, timeout=0.3)
        start = time.perf_counter()
        with contextlib.suppress(SessionLostError):
            await env.step({"message": "after"}, timeout=5)
        elapsed = time.perf_counter() - start
        # The probe waits at most 2 s; then the dead connection is given up at once.
        assert elapsed < 3.5, elapsed
    finally:
        server.unstall_all()
        await env.close()


async def _timed_step(env: GenericEnvClient, timeout: float) -> float:
    start = time.perf_counter()
    with contextlib.suppress(CallTimeoutError):
        await env.step({"message": "x"}, timeout=timeout)
    return time.perf_counter() - start


@pytest.mark.timeout(90)
async def test_concurrent_deadlines_are_kept_when_the_answer_is_late(
        server: EnvServer) -> None:
    """Two concurrent step(timeout=0.3) against a server answering 0.5 s late: every call
    returns near its deadline, run after run (a swallowed cancellation made the call send
    its step anyway and return after about 1 s)."""
    late: list[float] = []
    for _ in range(60):
        env = GenericEnvClient(server.url)
        try:
            await env.reset()
            server.faults.latency = 0.5
            times = await asyncio.gather(_timed_step(env, 0.3), _timed_step(env, 0.3))
            # deadline + 100 ms is the target; 200 ms of slack here absorbs scheduling
            # delays on a loaded machine (the server shares this event loop), far
            # below the 0.7 s a swallowed cancellation costs.
            late.extend(t for t in times if t > 0.5)
        finally:
            server.faults.latency = 0.0
            await env.close(timeout=0.5)
    assert late == [], late
