"""Sessions that move between processes: detach() → SessionHandle → attach()."""

from __future__ import annotations

import json
import multiprocessing
import pickle
from collections.abc import Iterator
from typing import Any

import pytest
from structlog.testing import capture_logs

from envlink import (
    CallTimeoutError,
    EnvlinkError,
    GenericEnvClient,
    ReconnectPolicy,
    SessionGoneError,
    SessionHandle,
)
from envlink.server import EnvServer, ServerThread

from .._processes import ServerProcess

pytestmark = pytest.mark.timeout(60)

MOVES = [2, -1, 4]


@pytest.fixture
def server() -> Iterator[ServerThread]:
    with ServerThread(env="deterministic") as st:
        yield st


def _continue_in_child(handle_json: str, results: Any) -> None:
    """Runs in a spawned child: attach, read the state, step once more, close."""
    try:
        handle = SessionHandle.from_json(handle_json)
        env = handle.attach_sync()
        try:
            before = env.state()["step_count"]
            observation = env.step({"move": 1}).observation
            after = env.state()["step_count"]
            results.put(("ok", env.session_id, before, after, observation,
                         env.async_client.journal.step_count))
        finally:
            env.close()
    except BaseException as exc:
        results.put(("error", repr(exc)))


def test_detached_session_continues_in_a_spawned_child(server: ServerThread) -> None:
    """A session detached here and attached in a spawned child (multiprocessing spawn) is the
    same server session: same id, same step count, and the child's step is its next one."""
    env = GenericEnvClient(server.url).sync()
    env.reset(seed=5, max_steps=50)
    for move in MOVES:
        env.step({"move": move})
    handle = env.detach()
    assert env.async_client.closed
    # The server kept the session, detached, with its three steps.
    assert server.call(lambda srv: srv.session_step_counts()) == {handle.session_id: 3}

    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    child = ctx.Process(target=_continue_in_child, args=(handle.to_json(), results))
    child.start()
    try:
        outcome = results.get(timeout=45)
    finally:
        child.join(15)
    assert outcome[0] == "ok", outcome
    _, session_id, before, after, observation, journal_steps = outcome
    assert session_id == handle.session_id
    assert (before, after, journal_steps) == (3, 4, 4)
    assert observation["step"] == 4
    assert child.exitcode == 0
    # The child closed it: the server session is gone, not left for a reaper.
    server.call(lambda srv: srv.wait_for("session.destroyed", 1), timeout=10)
    assert server.call(lambda srv: srv.session_step_counts()) == {}


async def test_attach_in_the_same_process_and_the_handles_forms(server: ServerThread) -> None:
    """detach() then EnvClient.attach() continues the episode; the handle pickles and
    round-trips through JSON, and neither its repr nor its str shows the resume secret."""
    env = GenericEnvClient(server.url)
    await env.reset(seed=1, max_steps=50)
    await env.step({"move": 3})
    handle = await env.detach()
    assert handle.resume_token
    for text in (repr(handle), str(handle)):
        assert handle.resume_token not in text
        assert handle.session_id in text  # type: ignore[operator]
    copy = pickle.loads(pickle.dumps(handle))
    again = SessionHandle.from_json(json.dumps(json.loads(handle.to_json())))
    for other in (copy, again):
        assert (other.base_url, other.session_id, other.resume_token, other.mechanism) == (
            handle.base_url, handle.session_id, handle.resume_token, "envlink-resume")
        assert other.journal.to_dict() == handle.journal.to_dict()
    attached = await GenericEnvClient.attach(again)
    try:
        assert attached.session_id == handle.session_id
        assert (await attached.step({"move": 1})).observation["step"] == 2
        assert (await attached.state())["step_count"] == 2
    finally:
        await attached.close()


def test_detach_and_attach_in_plain_code_block_and_return(server: ServerThread) -> None:
    """Without await, detach() returns the handle and EnvClient.attach(handle) the attached
    client (blocking, as every other method), which goes on with plain calls."""
    env = GenericEnvClient(server.url)
    env.reset(seed=1, max_steps=50)
    env.step({"move": 3})
    handle = env.detach()
    assert isinstance(handle, SessionHandle) and env.closed
    attached = GenericEnvClient.attach(handle)
    try:
        assert isinstance(attached, GenericEnvClient)
        assert attached.session_id == handle.session_id
        assert attached.step({"move": 1}).observation["step"] == 2
        assert attached.state()["step_count"] == 2
    finally:
        attached.close()


def _drop_next_answer(server: ServerThread, session_id: str | None) -> None:
    """The server drops the session's connection at its next request, after applying it."""
    def arm(srv: EnvServer) -> bool:
        for handle in srv.connections:
            if handle.session_id == session_id:
                handle.faults.drop_mode = "after_apply"
                handle.faults.drop_after = handle.requests + 1
                return True
        return False

    assert server.call(arm)


def _assert_a_resume_not_a_loss(attach_logs: list[dict[str, Any]],
                                logs: list[dict[str, Any]]) -> None:
    events = [entry["event"] for entry in attach_logs]
    assert "envlink.session_lost" not in events, attach_logs
    assert "envlink.session_recovered" in events, attach_logs
    # A connection lost after the attach and resumed: one info line, no warning.
    assert [entry["event"] for entry in logs].count("envlink.session_recovered") == 2, logs
    assert "envlink.session_lost" not in [entry["event"] for entry in logs], logs


@pytest.mark.parametrize("form", ["EnvClient.attach", "handle.attach_sync"])
def test_attaching_reports_a_resume_not_a_lost_session(server: ServerThread, form: str) -> None:
    """attach() resumes a session let go on purpose: it logs envlink.session_recovered and no
    envlink.session_lost warning; nor does a connection lost after the attach and resumed."""
    env = GenericEnvClient(server.url)
    env.reset(seed=1, max_steps=50)
    env.step({"move": 3})
    handle = env.detach()
    with capture_logs() as logs:
        attached: Any = (GenericEnvClient.attach(handle) if form == "EnvClient.attach"
                         else handle.attach_sync())
        attach_logs = list(logs)
        try:
            _drop_next_answer(server, attached.session_id)
            assert attached.step({"move": 1}).observation["step"] == 2
        finally:
            attached.close()
    _assert_a_resume_not_a_loss(attach_logs, logs)


async def test_attaching_with_await_reports_a_resume_not_a_lost_session(
        server: ServerThread) -> None:
    """The same in async code."""
    env = GenericEnvClient(server.url)
    await env.reset(seed=1, max_steps=50)
    await env.step({"move": 3})
    handle = await env.detach()
    with capture_logs() as logs:
        attached = await GenericEnvClient.attach(handle)
        attach_logs = list(logs)
        try:
            _drop_next_answer(server, attached.session_id)
            assert (await attached.step({"move": 1})).observation["step"] == 2
        finally:
            await attached.close()
    _assert_a_resume_not_a_loss(attach_logs, logs)


async def test_detach_needs_an_episode_and_a_resumable_session() -> None:
    """detach() before a reset, or on a server offering no resumption, is a typed error and
    leaves the client usable; junk handles are refused."""
    async with EnvServer(env="deterministic", extensions=False) as plain:
        env = GenericEnvClient(plain.url)
        try:
            with pytest.raises(EnvlinkError, match="reset first"):
                await env.detach()
            await env.reset(seed=0)
            with pytest.raises(EnvlinkError, match="cannot be detached"):
                await env.detach()
            assert (await env.step({"move": 1})).observation["step"] == 1
        finally:
            await env.close()
    with pytest.raises(ValueError, match="session handle"):
        SessionHandle.from_json('{"format": 1}')
    with pytest.raises(TypeError, match="SessionHandle"):
        await GenericEnvClient.attach({"base_url": "ws://127.0.0.1:1"})  # type: ignore[arg-type]


async def test_attach_after_a_restart_without_the_store_raises_session_gone() -> None:
    """The server is killed and restarted without its session store: attaching the handle
    raises SessionGoneError carrying the journal (its steps, when the client records them)."""
    first = ServerProcess()
    second: ServerProcess | None = None
    try:
        env = GenericEnvClient(first.url)
        env.record_steps = True
        await env.reset(seed=2, max_steps=50)
        await env.step({"move": 1})
        await env.step({"move": 2})
        handle = await env.detach()
        first.kill()
        second = ServerProcess(port=first.port)
        policy = ReconnectPolicy(max_attempts=50, initial_delay=0.02, max_delay=0.1)
        with pytest.raises(SessionGoneError) as gone:
            await GenericEnvClient.attach(handle, reconnect=policy)
        assert gone.value.journal is not None
        assert gone.value.journal.step_count == 2
        assert [e.action for e in gone.value.journal.entries] == [{"move": 1}, {"move": 2}]
    finally:
        first.stop()
        if second is not None:
            second.stop()


async def test_a_step_of_unknown_outcome_is_settled_on_attach(server: ServerThread) -> None:
    """A step cut by its deadline before detach (outcome unknown) is settled from the
    server's step_count when the handle is attached: the journal matches the server, and the
    next step is the server's next one (never applied twice)."""
    env = GenericEnvClient(server.url)
    await env.reset(seed=4, max_steps=50)
    await env.step({"move": 1})
    server.call(lambda srv: srv.stall_all())
    with pytest.raises(CallTimeoutError):
        await env.step({"move": 2}, timeout=0.3)
    server.call(lambda srv: srv.unstall_all())
    server.call(lambda srv: srv.wait_for_request("step", 2), timeout=10)
    handle = await env.detach()
    attached = await GenericEnvClient.attach(handle)
    try:
        applied = server.call(lambda srv: srv.session_step_counts())[handle.session_id]
        journal = attached.journal
        assert journal.unknown_steps == []
        assert journal.step_count == applied == 2
        assert (await attached.step({"move": 3})).observation["step"] == 3
    finally:
        await attached.close()
