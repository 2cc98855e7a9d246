"""Connector on its own: opening under the policy, the three ways to drop, closing, release."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from envlink import ConnectError, MockTransport, ReconnectPolicy
from envlink._sansio.session import DropReason, Link
from envlink.hooks import PhaseFinished, PhaseStarted
from envlink.names import (
    HOOK_RECONNECT,
    LOG_CONNECTION_DISCARDED,
    LOG_DISCONNECT,
    LOG_RECONNECT_SCHEDULED,
    LOG_SESSION_RELEASE_FAILED,
)

from ._parts import build, obs

pytestmark = pytest.mark.timeout(30)


def echo(request: dict[str, Any]) -> Any:
    if request["type"] == "state":
        return {"type": "state", "data": {"step_count": 4}}
    if request["type"] == "close":
        return None
    return obs(ok=True)


async def test_open_reports_a_connect_phase_and_adopts_the_connection() -> None:
    """open() runs one connect phase with its reason; the core learns of the connection."""
    parts = build(echo)
    conn = await parts.connector.open("reset", reason="connect")
    assert parts.connector.conn is conn and parts.connector.is_open
    assert parts.core.link is Link.OPEN
    [phase] = parts.hook.of(PhaseStarted)
    assert (phase.phase, phase.method, phase.attempt, phase.reason) == (
        "connect", "reset", 1, "connect")
    [done] = parts.hook.of(PhaseFinished)
    assert done.error is None and done.session_id == parts.core.session_id
    assert HOOK_RECONNECT not in parts.hook.events()  # a first connect is no reconnect
    await parts.connector.close(graceful=True, timeout=1.0)


async def test_open_retries_under_the_policy_then_gives_up() -> None:
    """Refused connects are retried with a reconnect_scheduled event per backoff; after
    max_attempts the last ConnectError is raised."""
    def refuse(headers: Mapping[str, str]) -> None:
        raise ConnectError("refused", retryable=True)

    parts = build(echo, policy=ReconnectPolicy(max_attempts=3, initial_delay=0.001,
                                               max_delay=0.002))
    parts.transport = MockTransport(echo, on_connect=refuse)
    parts.connector.transport = parts.transport
    with pytest.raises(ConnectError, match="refused"):
        await parts.connector.open("reset", reason="retry")
    events = parts.hook.events()
    assert events[0] == HOOK_RECONNECT
    assert events.count(LOG_RECONNECT_SCHEDULED) == 2
    finished = parts.hook.of(PhaseFinished)
    assert [type(p.error) for p in finished] == [ConnectError] * 3
    assert parts.connector.saw_unreachable
    assert parts.connector.conn is None


@pytest.mark.parametrize("reason", list(DropReason))
async def test_each_drop_reason_lets_the_connection_go_its_own_way(reason: DropReason) -> None:
    """FAILED aborts it; DISTRUSTED aborts it and reports connection_discarded;
    INHERITED (a forked child's copy) does no I/O on it at all. The link is gone."""
    parts = build(echo)
    conn = await parts.connector.open("reset", reason="connect")
    parts.connector.drop(reason)
    assert parts.connector.conn is None
    assert conn.is_open is (reason is DropReason.INHERITED)
    assert (LOG_CONNECTION_DISCARDED in parts.hook.events()) is (
        reason is DropReason.DISTRUSTED)
    assert parts.core.link is Link.NONE


async def test_a_graceful_close_sends_close_and_reports_the_disconnect() -> None:
    """close(graceful=True) sends the close frame, closes the socket and reports it."""
    parts = build(echo)
    await parts.connector.open("reset", reason="connect")
    await parts.connector.close(graceful=True, timeout=1.0)
    assert parts.transport.requests[-1]["type"] == "close"
    assert parts.connector.conn is None
    assert parts.hook.events()[-1] == LOG_DISCONNECT


async def test_count_steps_reads_the_state_frames_step_count() -> None:
    """count_steps() asks for state on the given connection and returns step_count."""
    parts = build(echo)
    conn = await parts.connector.open("reset", reason="connect")
    assert await parts.connector.count_steps(conn) == 4
    await parts.connector.close(graceful=False, timeout=1.0)


async def test_a_failed_release_is_reported_not_raised() -> None:
    """release() is best effort: a refused connect becomes session_release_failed."""
    def refuse(headers: Mapping[str, str]) -> None:
        raise ConnectError("gone", retryable=False)

    parts = build(echo)
    parts.connector.transport = MockTransport(echo, on_connect=refuse)
    assert await parts.connector.release("token") is None
    assert parts.hook.events() == [LOG_SESSION_RELEASE_FAILED]
