"""Portable sessions on a stock OpenEnv 0.10 server: detach() / attach() on its detached
sessions (``openenv/session/create``, ``/ws?session_id=``)."""

from __future__ import annotations

import pickle
from collections.abc import Callable

import pytest

import envlink

from ._interop_support import RecordingServer, read_rpc
from .test_stock_resume import (
    DELTAS,
    RESET,
    _assert_one_detached_session,
    _client,
    _expected,
    _steps_seen,
    _ws_conns,
)

pytestmark = pytest.mark.timeout(90)


async def test_detached_openenv_session_is_attached_by_another_client(
        spawn_openenv: Callable[..., RecordingServer], tag: str,
        tag_headers: dict[str, str]) -> None:
    """A session detached from one client and attached (from a pickled handle) by another is
    the same OpenEnv session: one create, every action applied once, step_count continues."""
    server = spawn_openenv("counter", max_sessions=2)
    first = _client(server.base_url, tag_headers)
    results = [await first.reset(**RESET)]
    for delta in DELTAS[:3]:
        results.append(await first.step({"delta": delta}))
    handle = await first.detach()
    assert handle.mechanism == "openenv-resume"
    assert handle.detached_id is not None and handle.detached_id not in repr(handle)
    moved = pickle.loads(pickle.dumps(handle))
    second = await envlink.GenericEnvClient.attach(moved, headers=tag_headers,
                                                   reconnect=envlink.ReconnectPolicy(
                                                       max_attempts=8, initial_delay=0.05))
    try:
        assert (await second.state())["step_count"] == 3
        for delta in DELTAS[3:]:
            results.append(await second.step({"delta": delta}))
        state = await second.state()
    finally:
        await second.close()
    assert [r.observation for r in results] == _expected()
    assert state["step_count"] == len(DELTAS)
    _assert_one_detached_session(server, tag)
    assert _steps_seen(_ws_conns(server, tag)) == [{"delta": d} for d in DELTAS]
    closes = [x for x in read_rpc(server.frame_log, tag) if x.method == "openenv/session/close"]
    assert len(closes) == 1  # by the attaching client's close(), not by detach()


async def test_attaching_a_session_the_openenv_server_lost_raises_session_gone(
        spawn_openenv: Callable[..., RecordingServer], tag_headers: dict[str, str]) -> None:
    """The OpenEnv server is restarted (its sessions are gone): attach raises SessionGoneError
    with the journal."""
    server = spawn_openenv("counter", max_sessions=2)
    first = _client(server.base_url, tag_headers)
    await first.reset(**RESET)
    await first.step({"delta": 1})
    handle = await first.detach()
    port = server.port
    server.process.stop()
    spawn_openenv("counter", port=port, max_sessions=2)
    with pytest.raises(envlink.SessionGoneError) as gone:
        await envlink.GenericEnvClient.attach(handle, headers=tag_headers)
    assert gone.value.journal is not None and gone.value.journal.step_count == 1
