"""Reconnect policy against the real server: retries, fatal statuses, Retry-After, budget."""

from __future__ import annotations

import socket
import time

import pytest

from envlink import (
    CapacityReachedError,
    ConnectError,
    GenericEnvClient,
    HandshakeRejectedError,
    OutcomeUnknownError,
    ReconnectPolicy,
    RetryBudget,
    RetryBudgetExhaustedError,
    SessionLostError,
    set_testing,
)
from envlink.server import EnvServer, ServerThread

pytestmark = pytest.mark.timeout(30)


async def test_refused_upgrades_are_retried_until_the_server_accepts(server: EnvServer) -> None:
    """Two 503 refusals, then success: the call succeeds on the third connection attempt."""
    server.faults.refuse = 2
    async with GenericEnvClient(server.url) as env:
        await env.reset()
    assert server.counter("refused") == 2
    assert server.connections_opened == 1


@pytest.mark.parametrize("status", [401, 403, 404])
async def test_auth_and_not_found_are_fatal(server: EnvServer, status: int) -> None:
    """401/403/404 on the upgrade fail at once, without retrying."""
    server.faults.refuse = 5
    server.faults.refuse_status = status
    env = GenericEnvClient(server.url)
    with pytest.raises(HandshakeRejectedError) as info:
        await env.reset()
    assert info.value.status == status
    assert server.counter("refused") == 1
    await env.close()


async def test_attempts_are_capped(server: EnvServer) -> None:
    """A server that keeps refusing is tried max_attempts times, then the last error is raised."""
    server.faults.refuse = 100
    env = GenericEnvClient(server.url, reconnect=ReconnectPolicy(max_attempts=3))
    with pytest.raises(HandshakeRejectedError) as info:
        await env.connect()
    assert info.value.status == 503
    assert server.counter("refused") == 3
    await env.close()


async def test_retry_after_is_honoured(server: EnvServer) -> None:
    """A Retry-After of 0.3 s delays the next attempt by at least that, despite tiny backoff."""
    server.faults.refuse = 1
    server.faults.retry_after = 0.3
    with set_testing(False):
        env = GenericEnvClient(server.url, reconnect=ReconnectPolicy(initial_delay=0.001))
        start = time.perf_counter()
        await env.connect()
        assert time.perf_counter() - start >= 0.3
        await env.close()


async def test_shared_retry_budget_stops_a_stampede(server: EnvServer) -> None:
    """Clients sharing an almost-spent budget give up with RetryBudgetExhaustedError."""
    budget = RetryBudget(max_tokens=2, token_ratio=0.1)
    policy = ReconnectPolicy(max_attempts=10, budget=budget)
    server.faults.refuse = 100
    env = GenericEnvClient(server.url, reconnect=policy)
    with pytest.raises(RetryBudgetExhaustedError) as info:
        await env.connect()
    assert isinstance(info.value.__cause__, HandshakeRejectedError)
    assert server.counter("refused") == 2  # first try + the one retry the budget allowed
    await env.close()


async def test_connection_refused_is_a_connect_error() -> None:
    """Nothing listening: ConnectError after the policy's attempts, with the address."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = GenericEnvClient(f"ws://127.0.0.1:{port}", reconnect=ReconnectPolicy(max_attempts=2))
    with pytest.raises(ConnectError, match=f"127.0.0.1:{port}"):
        await env.reset()
    await env.close()


@pytest.mark.parametrize("mode", ["before_apply", "after_apply", "mid_answer"])
async def test_reset_is_retried_after_a_drop(any_server: EnvServer, mode: str) -> None:
    """reset is idempotent: a connection dropped during it is reopened and reset resent."""
    any_server.faults.drop_after = 1
    any_server.faults.drop_mode = mode  # type: ignore[assignment]
    async with GenericEnvClient(any_server.url) as env:
        reset = await env.reset()
        assert reset.observation["echoed_message"] == "Echo environment ready!"
    assert any_server.connections_opened == 2


def _arm_drop(server: EnvServer) -> None:
    server.faults.drop_after = 1  # the next request on the connection
    server.faults.drop_mode = "after_apply"


def _tally(server: EnvServer) -> dict[str, int]:
    names = ("drop", "resume", "applied.reset", "dedup", "session.created")
    return {"sessions": len(server.sessions()), **{n: server.counter(n) for n in names}}


@pytest.mark.parametrize("max_sessions", [1, 8])
@pytest.mark.parametrize("steps", [0, 1], ids=["first-reset", "mid-episode"])
def test_a_reset_resent_after_a_drop_leaves_one_server_session(steps: int,
                                                                max_sessions: int) -> None:
    """A reset dropped after the server applied it is resent on the same server session."""
    with ServerThread(env="echo", host="127.0.0.1", max_sessions=max_sessions) as st, \
            GenericEnvClient(st.url).sync() as env:
        if steps:
            env.reset()
            env.step({"message": "hi"})
        st.call(_arm_drop)
        assert env.reset().observation["echoed_message"] == "Echo environment ready!"
        assert env.state()["step_count"] == 0
        # One session, not two: the resent reset re-attached by its token and was answered
        # from the server's de-duplication cache (applied once).
        assert st.call(_tally) == {"sessions": 1, "drop": 1, "resume": 1,
                                   "applied.reset": steps + 1, "dedup": 1,
                                   "session.created": 1}


def test_a_connection_refused_for_capacity_is_not_taken_for_a_session() -> None:
    """The token of a connection refused at capacity names no session: the next reset gets
    a fresh one, and nothing is left behind."""
    with ServerThread(env="echo", host="127.0.0.1", max_sessions=1) as st:
        holder, env = GenericEnvClient(st.url).sync(), GenericEnvClient(st.url).sync()
        try:
            holder.reset()
            with pytest.raises(CapacityReachedError):
                env.reset()
            holder.close()
            st.call(lambda server: server.wait_for("session.destroyed", 1), timeout=5)
            env.reset()
            assert st.call(_tally) == {"sessions": 1, "drop": 0, "resume": 0,
                                       "applied.reset": 2, "dedup": 0, "session.created": 2}
        finally:
            env.close()
            holder.close()


async def test_state_is_retried_outside_an_episode(any_server: EnvServer) -> None:
    """state before any reset is read-only: a drop is retried transparently."""
    any_server.faults.drop_after = 1
    any_server.faults.drop_mode = "after_apply"
    async with GenericEnvClient(any_server.url) as env:
        state = await env.state()
        assert state["step_count"] == 0


async def test_step_outside_an_episode_is_never_resent(plain_server: EnvServer) -> None:
    """A step whose connection died after sending is not resent: the outcome is unknown."""
    plain_server.faults.drop_after = 1
    plain_server.faults.drop_mode = "after_apply"
    env = GenericEnvClient(plain_server.url)
    with pytest.raises(OutcomeUnknownError, match="not resent"):
        await env.step({"message": "once"})
    assert plain_server.steps_applied == 1
    await env.close()


async def test_dead_peer_is_detected_by_keepalive(server: EnvServer) -> None:
    """A server that stops answering pings is declared dead within interval + timeout."""
    env = GenericEnvClient(server.url, ping_interval=0.1, ping_timeout=0.1)
    try:
        await env.reset()
        server.faults.stall_after = 2
        start = time.perf_counter()
        with pytest.raises(SessionLostError):
            await env.step({"message": "into the void"}, timeout=10)
        assert time.perf_counter() - start < 1.0
    finally:
        server.unstall_all()
        await env.close()


async def test_a_non_websocket_answer_to_the_upgrade_is_fatal() -> None:
    """A server that answers the upgrade with plain HTTP 200 is a protocol violation: no retry."""
    import asyncio

    hits = 0

    async def http_only(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal hits
        hits += 1
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: nonsense\r\n"
                     b"Connection: Upgrade\r\n\r\n")
        await writer.drain()
        writer.close()

    srv = await asyncio.start_server(http_only, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    try:
        env = GenericEnvClient(f"ws://127.0.0.1:{port}")
        with pytest.raises(ConnectError, match="handshake") as info:
            await env.reset()
        assert info.value.retryable is False
        assert hits == 1
        await env.close()
    finally:
        srv.close()
        await srv.wait_closed()
