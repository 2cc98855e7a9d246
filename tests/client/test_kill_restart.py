"""The server process is killed (SIGKILL) mid-step and restarted: raise, replay, resume."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Iterator
from pathlib import Path
from typing import Any

import pytest

from envlink import GenericEnvClient, ReconnectPolicy, SessionLostError, Timeout, set_testing

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
