"""The server process is killed (SIGKILL) mid-step and restarted: raise, replay, resume."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Iterator
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from envlink import (
    ClientHook,
    GenericEnvClient,
    PhaseFinished,
    ReconnectPolicy,
    SessionGoneError,
    SessionLostError,
    Timeout,
    set_testing,
)
from envlink.telemetry import ClientTelemetryHook

from .._processes import ServerProcess

pytestmark = pytest.mark.timeout(60)

MOVES = [2, -1, 4, 3]


@pytest.fixture
def servers() -> Iterator[list[ServerProcess]]:
    started: list[ServerProcess] = []
    yield started
    for s in started:
        s.stop()


def policy() -> ReconnectPolicy:
    # Real backoff (not the test mode): the restarted process needs a moment to listen.
    return ReconnectPolicy(max_attempts=200, initial_delay=0.02, max_delay=0.1, max_elapsed=20)


async def control_run() -> list[dict[str, Any]]:
    from envlink.server import EnvServer

    async with EnvServer(env="deterministic") as srv, GenericEnvClient(srv.url) as env:
        out = [(await env.reset(seed=11, max_steps=50)).observation]
        for m in MOVES:
            out.append((await env.step({"move": m})).observation)
        return out


async def kill_mid_step(servers: list[ServerProcess], env: GenericEnvClient,
                        first: ServerProcess, restart_args: list[str],
                        ) -> tuple[list[dict[str, Any]], Awaitable[Any]]:
    """Run reset + 3 steps, start the 4th (which stalls), kill -9 and restart the server."""
    got = [(await env.reset(seed=11, max_steps=50)).observation]
    for m in MOVES[:3]:
        got.append((await env.step({"move": m})).observation)
    task = asyncio.ensure_future(env.step({"move": MOVES[3]}))
    # The server announces the stall of the 4th step (its 5th request): kill it then.
    await asyncio.wait_for(asyncio.to_thread(first.wait_event, "stall"), 20)
    first.kill()
    servers.append(ServerProcess(*restart_args, port=first.port))
    return got, task


async def test_raise_reports_session_lost_within_the_deadline(servers: list[ServerProcess]
                                                              ) -> None:
    """With 'raise', killing the server mid-step gives SessionLostError before the deadline."""
    first = ServerProcess("--no-extensions", "--stall-after", "5", events=True)
    servers.append(first)
    with set_testing(False):
        env = GenericEnvClient(first.url, timeout=Timeout(5.0), reconnect=policy())
        try:
            _, task = await kill_mid_step(servers, env, first, ["--no-extensions"])
            killed_at = time.monotonic()
            with pytest.raises(SessionLostError) as info:
                await task
            assert time.monotonic() - killed_at < 5.0
            assert info.value.journal is not None and info.value.journal.step_count == 3
            assert (await env.reset(seed=11, max_steps=50)).observation["step"] == 0
        finally:
            await env.close()


@pytest.mark.parametrize("extensions", [False, True], ids=["plain", "extensions"])
async def test_replay_rebuilds_the_episode_on_the_restarted_server(
        servers: list[ServerProcess], extensions: bool) -> None:
    """With 'replay', the episode continues with identical observations and exact step count."""
    expected = await control_run()
    flags = [] if extensions else ["--no-extensions"]
    first = ServerProcess(*flags, "--stall-after", "5", events=True)
    servers.append(first)
    with set_testing(False):
        env = GenericEnvClient(first.url, timeout=Timeout(15.0), reconnect=policy(),
                               on_session_lost="replay")
        try:
            got, task = await kill_mid_step(servers, env, first, flags)
            got.append((await task).observation)
            assert got == expected
            assert (await env.state())["step_count"] == len(MOVES)
            counters = servers[-1].health()["counters"]
            assert counters["applied.step"] == len(MOVES)  # 3 replayed + the interrupted one
        finally:
            await env.close()


async def test_resume_reattaches_after_restart_without_replay(servers: list[ServerProcess],
                                                              tmp_path: Path) -> None:
    """With 'resume' and a session store, the restarted server re-attaches: no replay, no twice."""
    expected = await control_run()
    store = str(tmp_path / "sessions")
    first = ServerProcess("--session-store", store, "--stall-after", "5", events=True)
    servers.append(first)
    with set_testing(False):
        env = GenericEnvClient(first.url, timeout=Timeout(15.0), reconnect=policy(),
                               on_session_lost="resume")
        try:
            got, task = await kill_mid_step(servers, env, first, ["--session-store", store])
            got.append((await task).observation)
            assert got == expected
            assert (await env.state())["step_count"] == len(MOVES)
            counters = servers[-1].health()["counters"]
            assert counters.get("applied.reset", 0) == 0  # nothing replayed
            assert counters["applied.step"] == 1  # only the interrupted step, once
            assert counters["resume"] == 1
        finally:
            await env.close()


class _FailedConnects(ClientHook):
    """Sets ``failed`` once a connection attempt failed (the client saw the server down)."""

    def __init__(self) -> None:
        self.failed = threading.Event()

    def phase_finished(self, phase: PhaseFinished, token: Any) -> None:
        if phase.phase.phase == "connect" and phase.error is not None:
            self.failed.set()


async def _step_across_a_restart(servers: list[ServerProcess], env: GenericEnvClient,
                                 hook: _FailedConnects, *, seen_down: bool) -> Any:
    """Reset and step, kill the server, restart it on its port (without a session store),
    and step again; with ``seen_down``, the client tries while the server is down."""
    first = servers[-1]
    await env.reset(seed=11, max_steps=50)
    await env.step({"move": MOVES[0]})
    first.kill()
    if not seen_down:  # back before the client calls: it never sees the server down
        servers.append(ServerProcess(port=first.port))
        return await env.step({"move": MOVES[1]})
    task = asyncio.ensure_future(env.step({"move": MOVES[1]}))
    assert await asyncio.to_thread(hook.failed.wait, 20)
    servers.append(await asyncio.to_thread(ServerProcess, port=first.port))
    return await task


@pytest.mark.parametrize(("seen_down", "reason"), [(True, "server_restarted"),
                                                   (False, "session_unknown")])
async def test_resume_on_a_restarted_server_raises_session_gone_with_its_reason(
        servers: list[ServerProcess], seen_down: bool, reason: str) -> None:
    """'resume' against envlink serve restarted without a session store: SessionGoneError
    with the README's reason (server_restarted once the client saw it down, else
    session_unknown) and the journal."""
    servers.append(ServerProcess())
    hook = _FailedConnects()
    with set_testing(False):
        env = GenericEnvClient(servers[0].url, timeout=Timeout(15.0), reconnect=policy(),
                               on_session_lost="resume", hooks=[hook])
        try:
            with pytest.raises(SessionGoneError) as info:
                await _step_across_a_restart(servers, env, hook, seen_down=seen_down)
            assert info.value.reason == reason
            assert info.value.journal is not None and info.value.journal.step_count == 1
        finally:
            await env.close()


async def test_auto_replays_on_a_restarted_server_and_logs_the_fallback(
        servers: list[ServerProcess]) -> None:
    """'auto' against envlink serve restarted without a session store: the episode is
    replayed there, and the documented envlink.recovery_fallback warning says why."""
    servers.append(ServerProcess())
    hook = _FailedConnects()
    with set_testing(False), capture_logs() as logs:
        env = GenericEnvClient(servers[0].url, timeout=Timeout(15.0), reconnect=policy(),
                               on_session_lost="auto", hooks=[ClientTelemetryHook(), hook])
        try:
            result = await _step_across_a_restart(servers, env, hook, seen_down=True)
            assert result.observation == (await control_run())[2]
        finally:
            await env.close()
    fallbacks = [e for e in logs if e["event"] == "envlink.recovery_fallback"]
    assert len(fallbacks) == 1, logs
    assert fallbacks[0]["log_level"] == "warning"
    assert (fallbacks[0]["mechanism"], fallbacks[0]["next"], fallbacks[0]["reason"]) == (
        "envlink-resume", "replay", "server_restarted")
