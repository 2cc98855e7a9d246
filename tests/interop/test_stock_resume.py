"""Resume on stock OpenEnv 0.10 servers, and the rest of 0.10's session surface.

A real OpenEnv server (``servers/counter_server.py``, OpenEnv's own server API)
keeps a session created with ``POST /mcp`` ``openenv/session/create`` alive
across a dropped socket; envlink's ``resume`` re-attaches to it with
``/ws?session_id=`` and settles an interrupted step from the server's
``step_count``. A loopback proxy (``_proxy.py``) cuts the connection at chosen
moments. Each server records every frame and every ``/mcp`` exchange, so the
tests check what the server really saw: one session, each action applied once.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

import envlink

from ._interop_support import Connection, RecordingServer, read_connections, read_rpc
from ._proxy import Cut, CuttingProxy, When

pytestmark = pytest.mark.timeout(60)

FAST_RECONNECT = envlink.ReconnectPolicy(max_attempts=8, initial_delay=0.05, max_delay=0.5,
                                         max_elapsed=20.0)
CALL_TIMEOUT = 15.0
RESET = {"seed": 11, "start": 0, "target": 1000}
DELTAS = [1, 2, 3, 4, 5, 6]


def _client(url: str, headers: dict[str, str], policy: str = "resume",
            **options: Any) -> envlink.GenericEnvClient:
    return envlink.GenericEnvClient(url, headers=headers,
                                    timeout=options.pop("timeout", CALL_TIMEOUT),
                                    reconnect=options.pop("reconnect", FAST_RECONNECT),
                                    on_session_lost=policy, **options)  # type: ignore[arg-type]


def _expected() -> list[dict[str, Any]]:
    """What the counter answers for RESET then DELTAS (it is deterministic)."""
    observations = [{"metadata": {}, "total": 0, "target": 1000, "history": [], "label": ""}]
    total, history = 0, []
    for delta in DELTAS:
        total += delta
        history = [*history, delta]
        observations.append({"metadata": {}, "total": total, "target": 1000,
                             "history": history, "label": ""})
    return observations


def _records(directory: Path) -> list[dict[str, Any]]:
    """Every line a recorder wrote into ``directory``."""
    return [json.loads(text) for file in sorted(directory.glob("*.jsonl"))
            for text in file.read_text(encoding="utf-8").splitlines()]


def _ws_conns(server: RecordingServer, tag: str) -> list[Connection]:
    return [c for c in read_connections(server.frame_log, tag) if c.request_headers]


def _steps_seen(conns: list[Connection]) -> list[dict[str, Any]]:
    return [f["data"] for c in conns for f in c.sent if f["type"] == "step"]


def _assert_one_detached_session(server: RecordingServer, tag: str) -> str:
    """The client created exactly one session, and every socket attached to it."""
    creates = [x for x in read_rpc(server.frame_log, tag)
               if x.method == "openenv/session/create"]
    assert len(creates) == 1, f"expected one openenv/session/create, got {len(creates)}"
    assert creates[0].response is not None
    session_id = creates[0].response["result"]["session_id"]
    conns = _ws_conns(server, tag)
    assert conns, "no WebSocket connection was recorded"
    assert {c.session_id for c in conns} == {session_id}, (
        "a WebSocket connection did not attach to the created session "
        "(a plain /ws would have made the server create a second one)")
    return str(session_id)


@pytest.fixture
def stock(spawn_openenv: Callable[..., RecordingServer],
          cutting_proxy: Callable[[int], CuttingProxy]) -> tuple[RecordingServer, CuttingProxy]:
    """A real OpenEnv counter server behind a cutting proxy."""
    server = spawn_openenv("counter", max_sessions=4)
    return server, cutting_proxy(server.port)


# ------------------------------------------------------------------ cuts, resumed


async def test_resume_after_a_cut_between_steps(
        stock: tuple[RecordingServer, CuttingProxy], tag: str,
        tag_headers: dict[str, str]) -> None:
    """A cut between steps: re-attached to the same session, no replay, same observations."""
    server, proxy = stock
    env = _client(proxy.base_url, tag_headers)
    try:
        results = [await env.reset(**RESET)]
        assert env.recovery == "openenv-resume"
        for index, delta in enumerate(DELTAS):
            if index == 3:
                assert proxy.cut_all() == 1
            results.append(await env.step({"delta": delta}))
        state = await env.state()
    finally:
        await env.close()

    assert [r.observation for r in results] == _expected()
    assert state["step_count"] == len(DELTAS)
    _assert_one_detached_session(server, tag)
    conns = _ws_conns(server, tag)
    assert len(conns) == 2, "the client should have attached twice (before and after the cut)"
    # No replay: one reset, and each action reached the server once.
    assert sum(f["type"] == "reset" for c in conns for f in c.sent) == 1
    assert _steps_seen(conns) == [{"delta": d} for d in DELTAS]


async def test_resume_settles_a_step_that_never_reached_the_server(
        stock: tuple[RecordingServer, CuttingProxy], tag: str,
        tag_headers: dict[str, str]) -> None:
    """Written but dropped before the server: step_count unchanged, so it is sent again once."""
    server, proxy = stock
    env = _client(proxy.base_url, tag_headers)
    try:
        results = [await env.reset(**RESET)]
        for index, delta in enumerate(DELTAS):
            if index == 2:
                armed = proxy.arm(Cut("before_forward"))
            results.append(await env.step({"delta": delta}))
        state = await env.state()
    finally:
        await env.close()

    assert armed.fired.is_set() and armed.message == {"type": "step", "data": {"delta": 3}}
    assert [r.observation for r in results] == _expected()
    assert state["step_count"] == len(DELTAS)
    _assert_one_detached_session(server, tag)
    assert _steps_seen(_ws_conns(server, tag)) == [{"delta": d} for d in DELTAS]


async def test_resume_settles_a_step_that_was_applied(
        stock: tuple[RecordingServer, CuttingProxy], tag: str,
        tag_headers: dict[str, str]) -> None:
    """Applied, answer lost: OutcomeUnknownError says it WAS applied; never sent twice."""
    server, proxy = stock
    env = _client(proxy.base_url, tag_headers)
    try:
        results = [await env.reset(**RESET)]
        for index, delta in enumerate(DELTAS):
            if index == 2:
                armed = proxy.arm(Cut("after_answer"))
                with pytest.raises(envlink.OutcomeUnknownError) as unknown:
                    await env.step({"delta": delta})
                continue
            results.append(await env.step({"delta": delta}))
        state = await env.state()
        journal = env.journal
    finally:
        await env.close()

    assert armed.fired.is_set() and armed.dropped_answer is not None
    assert unknown.value.applied is True
    assert "was applied" in str(unknown.value).lower()
    # The episode went on where the server was: the later answers are the baseline's.
    expected = _expected()
    assert [r.observation for r in results] == expected[:3] + expected[4:]
    assert state["step_count"] == len(DELTAS)
    # The journal follows what the server applied (the lost answer's step counted;
    # under resume it counts steps and keeps none).
    assert (journal.steps_applied, journal.unknown_steps) == (len(DELTAS), [])
    _assert_one_detached_session(server, tag)
    assert _steps_seen(_ws_conns(server, tag)) == [{"delta": d} for d in DELTAS]


async def test_auto_answers_a_step_applied_with_its_answer_lost_by_replay(
        stock: tuple[RecordingServer, CuttingProxy], tag: str,
        tag_headers: dict[str, str], tmp_path: Path) -> None:
    """auto: applied, answer lost: the episode is replayed on a fresh session and the
    step's answer comes from it; the caller gets every answer, the recording matches,
    the old session is closed."""
    server, proxy = stock
    rollouts = tmp_path / "rollouts"  # apart from the server's frame log
    recorder = envlink.RolloutRecorder(rollouts)
    env = _client(proxy.base_url, tag_headers, "auto", recorder=recorder)
    try:
        results = [await env.reset(**RESET)]
        for index, delta in enumerate(DELTAS):
            if index == 2:
                armed = proxy.arm(Cut("after_answer"))
            results.append(await env.step({"delta": delta}))
        state = await env.state()
    finally:
        await env.close()

    assert armed.fired.is_set() and armed.dropped_answer is not None
    assert [r.observation for r in results] == _expected()
    assert state["step_count"] == len(DELTAS)
    rpc = read_rpc(server.frame_log, tag)
    created = [x.response["result"]["session_id"] for x in rpc
               if x.method == "openenv/session/create" and x.response]
    closed = [x.request["params"]["session_id"] for x in rpc
              if x.method == "openenv/session/close" and x.request]
    assert len(created) == 2 and sorted(closed) == sorted(created)
    # The old session applied the first three steps; the new one all six (three again).
    by_session: dict[str | None, list[Any]] = {}
    for conn in _ws_conns(server, tag):
        by_session.setdefault(conn.session_id, []).extend(
            f["data"]["delta"] for f in conn.sent if f["type"] == "step")
    assert by_session == {created[0]: DELTAS[:3], created[1]: DELTAS}
    assert recorder.close()
    [line] = _records(rollouts)
    assert [s["observation"] for s in line["steps"]] == _expected()[1:]
    assert [s.get("recovery") for s in line["steps"]] == [
        "replay" if index == 2 else None for index in range(len(DELTAS))]
    assert line["outcome"] == "close"


async def test_resume_after_a_cut_racing_the_server(
        stock: tuple[RecordingServer, CuttingProxy], tag: str,
        tag_headers: dict[str, str]) -> None:
    """Forwarded, then cut at once: whichever way the race goes, applied exactly once."""
    server, proxy = stock
    env = _client(proxy.base_url, tag_headers)
    outcome: BaseException | None = None
    try:
        await env.reset(**RESET)
        for index, delta in enumerate(DELTAS):
            if index == 4:
                armed = proxy.arm(Cut("after_forward"))
                try:
                    await env.step({"delta": delta})
                except envlink.OutcomeUnknownError as exc:
                    outcome = exc
                continue
            await env.step({"delta": delta})
        state = await env.state()
    finally:
        await env.close()

    assert armed.fired.is_set()
    if outcome is not None:
        assert outcome.applied is True  # type: ignore[attr-defined]
    assert state["step_count"] == len(DELTAS)
    assert state["total"] == sum(DELTAS)
    _assert_one_detached_session(server, tag)
    assert _steps_seen(_ws_conns(server, tag)) == [{"delta": d} for d in DELTAS]


def test_resume_through_the_sync_facade(
        stock: tuple[RecordingServer, CuttingProxy], tag: str,
        tag_headers: dict[str, str]) -> None:
    """The same resume works through the sync facade (two cuts, one of them mid-step)."""
    server, proxy = stock
    with _client(proxy.base_url, tag_headers).sync() as env:
        results = [env.reset(**RESET)]
        for index, delta in enumerate(DELTAS):
            if index == 1:
                proxy.cut_all()
            if index == 4:
                proxy.arm(Cut("before_forward"))
            results.append(env.step({"delta": delta}))
        assert env.state()["step_count"] == len(DELTAS)
    assert [r.observation for r in results] == _expected()
    _assert_one_detached_session(server, tag)
    assert len(_ws_conns(server, tag)) == 3


# ------------------------------------- an interrupted slow step, default policies

#: A step that takes this long on the server, interrupted on the client well before.
SLOW_STEP_S = 3.0


@pytest.mark.parametrize("policy", ["auto", "resume"])
@pytest.mark.parametrize("interrupt", ["timeout", "cancel"])
async def test_the_step_after_an_interrupted_slow_step_gets_its_own_answer(
        stock: tuple[RecordingServer, CuttingProxy], tag: str, tag_headers: dict[str, str],
        policy: str, interrupt: str) -> None:
    """A slow step cut short on the client (its deadline, or the caller's cancellation
    as Ctrl-C gives) keeps OpenEnv's old socket attached until the step ends on the
    server: the next step waits for the re-attach within its own deadline, under the
    client's default reconnect policy, and returns its own answer, each step applied
    once."""
    server, _proxy = stock
    # Straight to the server (no proxy): the default policies, only the recovery chosen.
    env = envlink.GenericEnvClient(f"http://127.0.0.1:{server.port}", headers=tag_headers,
                                   on_session_lost=policy)  # type: ignore[arg-type]
    with capture_logs() as logs:
        try:
            await _slow_step(env, interrupt)
            result = await env.step({"delta": 2})
            state = await env.state()
        finally:
            await env.close()
    # Its own answer: the slow step (5) was applied once, then this one (2).
    assert result.observation["total"] == 7
    assert result.observation["history"] == [5, 2]
    assert state["step_count"] == 2
    assert _steps_seen(_ws_conns(server, tag)) == [_SLOW, {"delta": 2}]
    # It said that it waited for the server to let the old socket go.
    waits = [e for e in logs if e["event"] == "envlink.attach_wait"]
    assert waits and all(e["waited_s"] >= 0 and e["delay_s"] > 0 for e in waits)


_SLOW = {"delta": 5, "sleep_s": SLOW_STEP_S}


async def _slow_step(env: envlink.GenericEnvClient, interrupt: str) -> None:
    """Reset, then a slow step interrupted on the client at 0.5 s."""
    await env.reset(**RESET)
    if interrupt == "timeout":
        with pytest.raises(envlink.CallTimeoutError):
            await env.step(_SLOW, timeout=0.5)
        return
    task = asyncio.ensure_future(env.step(_SLOW))
    done, _ = await asyncio.wait({task}, timeout=0.5)
    assert not done, "the slow step answered before it was interrupted"
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


# ------------------------------------------------------------- resume impossible


#: A restarted OpenEnv server takes seconds to import (more on a busy machine): the
#: client waits it out under a patient policy, and these tests get more time.
RESTART_DEADLINE = 100.0
PATIENT = envlink.ReconnectPolicy(max_attempts=100_000, initial_delay=0.05, max_delay=0.25,
                                  max_elapsed=RESTART_DEADLINE)


def _restart_while_down(spawn: Callable[..., RecordingServer], server: RecordingServer
                        ) -> Callable[[], RecordingServer]:
    """SIGKILL the server now; the returned function starts its successor on the same port."""
    server.process.kill()
    return lambda: spawn("counter", port=server.port, max_sessions=4)


@pytest.mark.timeout(2 * RESTART_DEADLINE)
async def test_kill_9_under_resume_reports_the_session_gone_with_the_journal(
        spawn_openenv: Callable[..., RecordingServer], tag_headers: dict[str, str]) -> None:
    """Server killed: resume says the server restarted, with the journal; nothing replayed."""
    first = spawn_openenv("counter", max_sessions=4)
    env = _client(first.base_url, tag_headers, reconnect=PATIENT, timeout=RESTART_DEADLINE)
    try:
        await env.reset(**RESET)
        await env.step({"delta": 1})
        await env.step({"delta": 2})
        start_again = _restart_while_down(spawn_openenv, first)
        pending = asyncio.ensure_future(env.step({"delta": 3}))
        second = await asyncio.to_thread(start_again)
        with pytest.raises(envlink.SessionGoneError) as gone:
            await pending
        # Still usable: a new episode starts on the new server, in a new session.
        again = await env.reset(seed=12)
    finally:
        await env.close()

    error = gone.value
    assert isinstance(error, envlink.SessionLostError)
    assert error.reason == "server_restarted"
    assert error.journal is not None
    assert error.journal.reset_kwargs == RESET
    assert error.journal.steps_applied == 2
    assert again.observation["total"] == 0
    # The restarted server never saw the interrupted step, nor a replay.
    assert _steps_seen(read_connections(second.frame_log)) == []


@pytest.mark.timeout(2 * RESTART_DEADLINE)
async def test_kill_9_under_auto_replays_on_the_restarted_server(
        spawn_openenv: Callable[..., RecordingServer], tag_headers: dict[str, str]) -> None:
    """Server killed: "auto" cannot resume, so it replays the journal on the new server."""
    first = spawn_openenv("counter", max_sessions=4)
    env = _client(first.base_url, tag_headers, policy="auto", reconnect=PATIENT,
                  timeout=RESTART_DEADLINE)
    try:
        await env.reset(**RESET)
        assert env.recovery == "openenv-resume"
        await env.step({"delta": 1})
        await env.step({"delta": 2})
        start_again = _restart_while_down(spawn_openenv, first)
        pending = asyncio.ensure_future(env.step({"delta": 3}))
        second = await asyncio.to_thread(start_again)
        result = await pending
        state = await env.state()
        # The rebuilt episode is again in a detached session: resumable after this.
        assert env.recovery == "openenv-resume"
    finally:
        await env.close()

    assert result.observation["history"] == [1, 2, 3]
    assert state["step_count"] == 3
    conns = [c for c in read_connections(second.frame_log) if c.sent]
    replayed = conns[-1]
    assert replayed.session_id is not None, "the replay ran in a plain, non-resumable session"
    # The attach is checked with a state read, then the journal is replayed.
    assert [f["type"] for f in replayed.sent[:5]] == ["state", "reset", "step", "step", "step"]
    assert replayed.errors == []


async def test_a_reaped_session_gives_the_typed_error_not_a_dead_environment(
        spawn_openenv: Callable[..., RecordingServer],
        cutting_proxy: Callable[[int], CuttingProxy], tag: str,
        tag_headers: dict[str, str]) -> None:
    """OpenEnv's idle reaper destroys the detached session: the next call says so, typed."""
    server = spawn_openenv("counter", max_sessions=4, extra_args=("--session-timeout", "1"))
    proxy = cutting_proxy(server.port)
    env = _client(proxy.base_url, tag_headers)
    try:
        await env.reset(seed=21, target=1000)
        await env.step({"delta": 1})
        proxy.cut_all()  # detached now, and idle
        server.process.wait_for_event("environment_closed", deadline=30.0,
                                      episode_id="counter-21")
        with pytest.raises(envlink.SessionGoneError) as gone:
            await env.step({"delta": 2})
        with pytest.raises(envlink.SessionLostError):
            await env.state()  # still lost until reset()
    finally:
        await env.close()

    assert gone.value.reason == "session_unknown"
    assert gone.value.journal is not None
    assert gone.value.journal.steps_applied == 1
    # The step after the reaping never reached an environment.
    conns = _ws_conns(server, tag)
    assert _steps_seen(conns) == [{"delta": 1}]
    assert all(e["data"]["code"] == "SESSION_ERROR" for c in conns for e in c.errors)


async def test_a_reaped_session_under_auto_is_replayed(
        spawn_openenv: Callable[..., RecordingServer],
        cutting_proxy: Callable[[int], CuttingProxy], tag_headers: dict[str, str]) -> None:
    """Under "auto" the reaped episode is rebuilt by replay and the step goes on."""
    server = spawn_openenv("counter", max_sessions=4, extra_args=("--session-timeout", "1"))
    proxy = cutting_proxy(server.port)
    env = _client(proxy.base_url, tag_headers, policy="auto")
    try:
        await env.reset(seed=22, target=1000)
        await env.step({"delta": 1})
        proxy.cut_all()
        server.process.wait_for_event("environment_closed", deadline=30.0,
                                      episode_id="counter-22")
        result = await env.step({"delta": 2})
        state = await env.state()
    finally:
        await env.close()
    assert result.observation["history"] == [1, 2]
    assert state["step_count"] == 2


async def test_an_attached_session_outlives_the_reaper(
        spawn_openenv: Callable[..., RecordingServer],
        cutting_proxy: Callable[[int], CuttingProxy], tag_headers: dict[str, str]) -> None:
    """While attached, a resumable session is exempt from the reaper; a detached one is not."""
    server = spawn_openenv("counter", max_sessions=4, extra_args=("--session-timeout", "1"))
    proxy = cutting_proxy(server.port)
    kept = _client(server.base_url, tag_headers)
    dropped = _client(proxy.base_url, tag_headers)
    try:
        await kept.reset(seed=31, target=1000)
        await dropped.reset(seed=32, target=1000)
        # Both in detached sessions: only the reaper (not the socket closing) ends one.
        assert kept.recovery == dropped.recovery == "openenv-resume"
        proxy.cut_all()  # only `dropped` goes through the proxy
        # Both idle from here; the reaper destroys the detached one first...
        server.process.wait_for_event("environment_closed", deadline=30.0,
                                      episode_id="counter-32")
        # ...and at that tick the attached one, idle just as long, was spared.
        result = await kept.step({"delta": 5})
    finally:
        await kept.close()
        await dropped.close()
    assert result.observation["total"] == 5
    assert not [e for e in server.process.events("environment_closed")
                if e["episode_id"] == "counter-31" and e["step_count"] == 0]


async def test_resume_on_a_server_without_detached_sessions_is_typed(
        spawn_openenv: Callable[..., RecordingServer], tag_headers: dict[str, str]) -> None:
    """No resume offered: "resume" raises SessionGoneError(resume_unsupported); "auto" replays."""
    # envlink's reference server with its extensions off offers neither kind of resume.
    from envlink.server import EnvServer

    async with EnvServer(env="deterministic", extensions=False) as srv:
        for policy in ("resume", "auto"):
            env = _client(srv.url, tag_headers, policy=policy)
            try:
                await env.reset(seed=1)
                await env.step({"move": 1})
                assert env.recovery == ("raise" if policy == "resume" else "replay")
                for handle in srv.connections:
                    handle.abort()
                if policy == "resume":
                    with pytest.raises(envlink.SessionGoneError) as gone:
                        await env.step({"move": 1})
                    assert gone.value.reason == "resume_unsupported"
                    assert gone.value.journal is not None
                    assert gone.value.journal.steps_applied == 1
                else:
                    result = await env.step({"move": 1})
                    assert result.observation["position"] == 2
            finally:
                await env.close()


# -------------------------------------------------------------------- close()


async def test_close_ends_the_detached_session(
        stock: tuple[RecordingServer, CuttingProxy], tag: str,
        tag_headers: dict[str, str]) -> None:
    """close() ends the session with openenv/session/close; the server destroys it."""
    server, proxy = stock
    env = _client(proxy.base_url, tag_headers)
    await env.reset(seed=41, target=1000)
    await env.step({"delta": 1})
    await env.close()
    server.process.wait_for_event("environment_closed", deadline=15.0, episode_id="counter-41")
    session_id = _assert_one_detached_session(server, tag)
    closes = [x for x in read_rpc(server.frame_log, tag) if x.method == "openenv/session/close"]
    assert [x.request["params"] for x in closes if x.request] == [{"session_id": session_id}]
    # Closed at once, or (if the server had not yet seen the socket go) when it does.
    assert closes[0].response is not None
    result = closes[0].response["result"]
    assert result["closed"] is True or result.get("closing") is True


async def test_close_ends_a_session_that_was_never_attached(
        stock: tuple[RecordingServer, CuttingProxy], tag: str,
        tag_headers: dict[str, str]) -> None:
    """A session created but never attached (every upgrade dropped) is still closed."""
    server, proxy = stock
    proxy.refuse_websockets = True
    env = _client(proxy.base_url, tag_headers,
                  reconnect=envlink.ReconnectPolicy(max_attempts=2, initial_delay=0.01))
    with pytest.raises(envlink.ConnectError):
        await env.connect()
    await env.close()
    creates = [x for x in read_rpc(server.frame_log, tag)
               if x.method == "openenv/session/create"]
    closes = [x for x in read_rpc(server.frame_log, tag) if x.method == "openenv/session/close"]
    assert len(creates) == 1
    assert _ws_conns(server, tag) == []
    session_id = creates[0].response["result"]["session_id"]  # type: ignore[index]
    assert [x.request["params"] for x in closes if x.request] == [{"session_id": session_id}]
    assert closes[0].response["result"]["closed"] is True  # type: ignore[index]


# ------------------------------------------------- 0.10's surface: errors, mcp, sessions


async def test_capacity_error_carries_the_servers_counts(
        spawn_openenv: Callable[..., RecordingServer]) -> None:
    """A real CAPACITY_REACHED fills active_sessions and max_sessions (and details)."""
    server = spawn_openenv("counter", max_sessions=1)
    holder = envlink.GenericEnvClient(server.base_url, timeout=CALL_TIMEOUT)
    extra = envlink.GenericEnvClient(server.base_url, timeout=CALL_TIMEOUT,
                                     reconnect=envlink.ReconnectPolicy(max_attempts=1))
    try:
        await holder.reset(seed=5)
        with pytest.raises(envlink.CapacityReachedError) as refused:
            await extra.reset(seed=6)
    finally:
        await holder.close()
        await extra.close()
    assert (refused.value.active_sessions, refused.value.max_sessions) == (1, 1)
    assert refused.value.details == {"active_sessions": 1, "max_sessions": 1}


async def test_validation_error_carries_the_servers_errors(
        counter_server: RecordingServer, tag_headers: dict[str, str]) -> None:
    """A real VALIDATION_ERROR keeps the server's per-field errors as an attribute."""
    async with envlink.GenericEnvClient(counter_server.base_url, headers=tag_headers,
                                        timeout=CALL_TIMEOUT) as env:
        await env.reset(seed=4)
        with pytest.raises(envlink.ServerValidationError) as invalid:
            await env.step({"delta": 1000})
        after = await env.step({"delta": 1})
    error = invalid.value
    assert isinstance(error, envlink.ServerError)
    assert error.code == envlink.ErrorCode.VALIDATION_ERROR
    assert [(e["loc"], e["type"]) for e in error.errors] == [(["delta"], "less_than_equal")]
    assert error.details["errors"] == error.errors
    assert after.observation["total"] == 1


async def test_unknown_session_is_a_session_error(
        counter_server: RecordingServer) -> None:
    """SESSION_ERROR from the server is its own error class."""
    with pytest.raises(envlink.SessionError) as refused:
        await envlink.GenericEnvClient(
            counter_server.base_url.replace("http://", "ws://") + "/ws?session_id=nope",
            timeout=CALL_TIMEOUT).state()
    assert refused.value.code == envlink.ErrorCode.SESSION_ERROR
    assert "Unknown session_id" in refused.value.message


async def test_mcp_methods_on_the_session_socket(
        echo_server: RecordingServer, tag: str, tag_headers: dict[str, str]) -> None:
    """tools/list and tools/call ride the session socket as "mcp" messages (JSON-RPC)."""
    async with envlink.GenericEnvClient(echo_server.base_url, headers=tag_headers,
                                        timeout=CALL_TIMEOUT) as env:
        await env.reset()
        tools = await env.mcp_list_tools()
        value = await env.mcp_call_tool("echo_with_length", message="four")
        with pytest.raises(envlink.McpError) as failed:
            await env.mcp_request("no/such/method")
        state = await env.state()
    assert [t["name"] for t in tools] == ["echo_message", "echo_with_length"]
    assert value == {"message": "four", "length": 4}
    assert failed.value.rpc_code == -32601
    # The tool call went around step(): the environment counted no step.
    assert state["step_count"] == 0
    conn = read_connections(echo_server.frame_log, tag)[0]
    mcp = [f for f in conn.sent if f["type"] == "mcp"]
    assert [f["data"]["method"] for f in mcp] == ["tools/list", "tools/call", "no/such/method"]
    assert all(f["data"]["jsonrpc"] == "2.0" for f in mcp)


async def test_new_session_is_a_second_session_closed_with_its_parent(
        spawn_openenv: Callable[..., RecordingServer]) -> None:
    """new_session(): another session on the same server, same options, closed with the parent."""
    server = spawn_openenv("counter", max_sessions=2)
    parent = envlink.GenericEnvClient(server.base_url + "/", timeout=CALL_TIMEOUT)
    try:
        assert parent.base_url == server.base_url  # as OpenEnv's: normalised, no /ws
        await parent.reset(seed=51, target=1000)
        child = await parent.new_session()
        assert type(child) is type(parent)
        assert child.base_url == parent.base_url
        assert child.connected
        await child.reset(seed=52, target=1000)
        await parent.step({"delta": 1})
        assert (await child.state())["step_count"] == 0
    finally:
        await parent.close()
    assert child.closed
    for seed in (51, 52):
        server.process.wait_for_event("environment_closed", deadline=15.0,
                                      episode_id=f"counter-{seed}")


def test_stock_resume_mechanism_is_visible(
        stock: tuple[RecordingServer, CuttingProxy], tag_headers: dict[str, str]) -> None:
    """The recovery mechanism shows in client.recovery and on the recovery span."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    _, proxy = stock
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with _client(proxy.base_url, tag_headers, policy="auto",
                 tracer_provider=provider).sync() as env:
        env.reset(**RESET)
        assert env.recovery == "openenv-resume"
        proxy.cut_all()
        env.step({"delta": 1})
    recoveries = [s for s in exporter.get_finished_spans() if s.name == "resume"]
    assert recoveries, [s.name for s in exporter.get_finished_spans()]
    assert recoveries[0].attributes is not None
    assert recoveries[0].attributes["envlink.recovery"] == "openenv-resume"


def test_proxy_cuts_where_it_is_told(
        stock: tuple[RecordingServer, CuttingProxy]) -> None:
    """The harness itself: each kind of cut drops the connection at its moment."""
    server, proxy = stock

    async def one(when: When) -> tuple[bool, dict[str, Any] | None]:
        import json

        import websockets

        async with websockets.connect(proxy.base_url.replace("http", "ws") + "/ws") as ws:
            await ws.send(json.dumps({"type": "reset", "data": {}}))
            await ws.recv()
            armed = proxy.arm(Cut(when))
            await ws.send(json.dumps({"type": "step", "data": {"delta": 1}}))
            with pytest.raises(websockets.ConnectionClosed):
                await ws.recv()
            assert armed.fired.is_set()
            return armed.fired.is_set(), armed.dropped_answer

    for when in ("before_forward", "after_forward", "after_answer"):
        fired, dropped = asyncio.run(one(when))  # type: ignore[arg-type]
        assert fired
        assert (dropped is not None) == (when == "after_answer")
    steps = [f for c in read_connections(server.frame_log) for f in c.sent
             if f["type"] == "step"]
    # before_forward never reached the server; the other two did.
    assert len(steps) == 2
