"""envlink's client against real, unmodified OpenEnv 0.10 servers.

The servers (``servers/``) are built with OpenEnv's own server API and run in the
openenv virtualenv; envlink runs here, in its own interpreter. Each server
records every WebSocket event, so the tests check both what envlink returned
and what it really put on the wire.
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from pydantic import BaseModel, ConfigDict

import envlink

from ._interop_support import (
    CLIENTS,
    TAG_HEADER,
    Connection,
    RecordingServer,
    assert_plain_protocol,
    read_connections,
)

pytestmark = pytest.mark.timeout(60)

#: Reconnect fast: the restarted server is already listening when the client retries.
FAST_RECONNECT = envlink.ReconnectPolicy(max_attempts=5, initial_delay=0.05, max_delay=0.5,
                                         max_elapsed=15.0)
CALL_TIMEOUT = 15.0


# ------------------------------------------------------------- a typed client


@dataclass(frozen=True)
class CounterAction:
    """The counter server's action, as a plain dataclass on the client side."""

    delta: int
    label: str = ""


class CounterObservation(BaseModel):
    """Exactly the fields the counter server sends (extra fields would fail parsing)."""

    model_config = ConfigDict(extra="forbid")

    total: int
    target: int
    history: list[int]
    label: str
    metadata: dict[str, Any]
    reward: float | None = None
    done: bool = False


class CounterState(BaseModel):
    """The counter server's ``State`` subclass."""

    model_config = ConfigDict(extra="forbid")

    episode_id: str | None
    step_count: int
    total: int
    target: int


class CounterEnv(envlink.EnvClient[CounterAction, CounterObservation, CounterState]):
    """A typed client, written as an OpenEnv user writes one."""

    def _step_payload(self, action: CounterAction) -> dict[str, Any]:
        return {"delta": action.delta, "label": action.label}

    def _parse_result(self, payload: dict[str, Any]) -> envlink.StepResult[CounterObservation]:
        observation = CounterObservation(**payload["observation"], reward=payload.get("reward"),
                                         done=payload.get("done", False))
        return envlink.StepResult(observation=observation, reward=payload.get("reward"),
                                  done=payload.get("done", False))

    def _parse_state(self, payload: dict[str, Any]) -> CounterState:
        return CounterState.model_validate(payload)


def _only(conns: list[Connection]) -> Connection:
    assert len(conns) == 1, f"expected one connection, got {len(conns)}"
    return conns[0]


def _types(conn: Connection) -> list[str]:
    return [frame["type"] for frame in conn.sent]


# ------------------------------------------------------------- episodes


async def test_generic_client_runs_mcp_episode_on_openenv_echo(
        echo_server: RecordingServer, tag: str, tag_headers: dict[str, str]) -> None:
    """GenericEnvClient: reset, list_tools, call_tool, state and close work on OpenEnv's echo."""
    async with envlink.GenericEnvClient(echo_server.base_url, headers=tag_headers,
                                        timeout=CALL_TIMEOUT) as env:
        reset = await env.reset()
        listed = await env.step({"type": "list_tools"})
        called = await env.step({"type": "call_tool", "tool_name": "echo_with_length",
                                 "arguments": {"message": "four"}})
        state = await env.state()

    assert reset.observation["echoed_message"] == "Echo environment ready!"
    assert reset.reward == 0.0
    assert reset.done is False
    assert [t["name"] for t in listed.observation["tools"]] == ["echo_message",
                                                                 "echo_with_length"]
    assert called.observation["tool_name"] == "echo_with_length"
    assert called.observation["error"] is None
    assert called.observation["result"]["data"] == {"message": "four", "length": 4}
    assert state["step_count"] == 2

    conn = _only(echo_server.ended_connections(tag))
    assert_plain_protocol([conn])
    assert conn.errors == []
    assert _types(conn) == ["reset", "step", "step", "state", "close"]
    assert conn.sent[2]["data"] == {"type": "call_tool", "tool_name": "echo_with_length",
                                    "arguments": {"message": "four"}}


async def test_echo_env_typed_mcp_actions_on_openenv_echo(
        echo_server: RecordingServer, tag: str, tag_headers: dict[str, str]) -> None:
    """envlink.EchoEnv's ListToolsAction/CallToolAction are accepted by OpenEnv's echo server."""
    async with envlink.EchoEnv(echo_server.base_url, headers=tag_headers,
                               timeout=CALL_TIMEOUT) as env:
        reset = await env.reset()
        listed = await env.step(envlink.ListToolsAction())
        called = await env.step(envlink.CallToolAction(tool_name="echo_message",
                                                       arguments={"message": "hi"}))

    assert reset.observation.echoed_message == "Echo environment ready!"
    assert [t["name"] for t in listed.observation.tools or []] == ["echo_message",
                                                                    "echo_with_length"]
    assert called.observation.tool_name == "echo_message"
    assert called.observation.error is None
    conn = _only(read_connections(echo_server.frame_log, tag))
    assert_plain_protocol([conn])
    assert conn.errors == []
    # EchoEnv is an MCPToolClient in production mode: its socket is attached to an HTTP
    # MCP session (read with a state frame first); the steps are sent as they are.
    assert conn.session_id is not None
    steps = [frame["data"] for frame in conn.sent if frame["type"] == "step"]
    assert steps == [{"type": "list_tools"},
                     {"type": "call_tool", "tool_name": "echo_message",
                      "arguments": {"message": "hi"}}]


async def test_echo_env_call_tool_returns_tool_value_from_openenv_echo(
        echo_server: RecordingServer, tag_headers: dict[str, str]) -> None:
    """EchoEnv.call_tool returns the tool's value from a real OpenEnv server, as OpenEnv's does."""
    # OpenEnv's MCPEnvironment answers a FastMCP CallToolResult ({"content": ...,
    # "data": value, ...}); OpenEnv's MCPToolClient.call_tool unwraps "data".
    async with envlink.EchoEnv(echo_server.base_url, headers=tag_headers,
                               timeout=CALL_TIMEOUT) as env:
        await env.reset()
        assert await env.call_tool("echo_message", message="hi") == "hi"
        assert await env.call_tool("echo_with_length", message="four") == {
            "message": "four", "length": 4}
        assert [t["name"] for t in await env.list_tools()] == ["echo_message",
                                                                "echo_with_length"]


async def test_echo_env_call_tool_failure_raises_on_openenv_echo(
        echo_server: RecordingServer, tag_headers: dict[str, str]) -> None:
    """A failed tool call (unknown tool, bad arguments) raises ServerError, never returns None."""
    # OpenEnv answers these with a normal observation whose "error" is set
    # ({"error_type": "tool_not_found" | "invalid_args", "message": ...});
    # OpenEnv's MCPToolClient.call_tool raises, and EchoEnv.call_tool documents
    # "Raises: ServerError: the server reported the call failed".
    async with envlink.EchoEnv(echo_server.base_url, headers=tag_headers,
                               timeout=CALL_TIMEOUT) as env:
        await env.reset()
        with pytest.raises(envlink.ServerError, match="nope"):
            await env.call_tool("nope", message="x")
        with pytest.raises(envlink.ServerError):
            await env.call_tool("echo_message", wrong=1)


async def test_typed_client_episode_on_openenv_counter(
        counter_server: RecordingServer, tag: str, tag_headers: dict[str, str]) -> None:
    """A typed EnvClient subclass gets typed results from its hooks, through to done."""
    async with CounterEnv(counter_server.base_url, headers=tag_headers,
                          timeout=CALL_TIMEOUT) as env:
        reset = await env.reset(seed=1, start=2, target=5)
        first = await env.step(CounterAction(1, "a"))
        second = await env.step(CounterAction(2, "b"))
        state = await env.state()

    assert isinstance(reset.observation, CounterObservation)
    assert (reset.observation.total, reset.observation.history) == (2, [])
    assert (first.observation.total, first.reward, first.done) == (3, 1.0, False)
    assert (second.observation.total, second.observation.history) == (5, [1, 2])
    assert second.observation.label == "b"
    assert second.done is True
    assert state == CounterState(episode_id="counter-1", step_count=2, total=5, target=5)
    conn = _only(read_connections(counter_server.frame_log, tag))
    assert_plain_protocol([conn])
    assert conn.errors == []
    assert conn.sent[0] == {"type": "reset", "data": {"seed": 1, "start": 2, "target": 5}}
    assert conn.sent[1] == {"type": "step", "data": {"delta": 1, "label": "a"}}


def test_sync_facade_typed_episode_on_openenv_counter(
        counter_server: RecordingServer, tag: str, tag_headers: dict[str, str]) -> None:
    """The sync facade runs a typed episode on a real OpenEnv server and closes cleanly."""
    with CounterEnv(counter_server.base_url, headers=tag_headers,
                    timeout=CALL_TIMEOUT).sync() as env:
        reset = env.reset(seed=2, target=3)
        with pytest.raises(envlink.ServerError) as rejected:
            env.step(CounterAction(1000))
        result = env.step(CounterAction(3))
        state = env.state()

    assert rejected.value.code == "VALIDATION_ERROR"
    assert reset.observation.total == 0
    assert (result.observation.total, result.done) == (3, True)
    assert state.step_count == 1
    conn = _only(counter_server.ended_connections(tag))
    assert_plain_protocol([conn])
    assert [e["data"]["code"] for e in conn.errors] == ["VALIDATION_ERROR"]
    assert _types(conn) == ["reset", "step", "step", "state", "close"]


def test_sync_facade_disconnect_ends_the_openenv_session(
        echo_server: RecordingServer, tag: str, tag_headers: dict[str, str]) -> None:
    """disconnect() sends close and the next call gets a fresh OpenEnv session."""
    env = envlink.GenericEnvClient(echo_server.base_url, headers=tag_headers,
                                   timeout=CALL_TIMEOUT).sync()
    try:
        env.connect()
        env.reset()
        env.step({"type": "list_tools"})
        assert env.state()["step_count"] == 1
        env.disconnect()
        # A new connection is a new server-side session: its step count starts over.
        assert env.state()["step_count"] == 0
    finally:
        env.close()

    conns = echo_server.ended_connections(tag, count=2)
    assert len(conns) == 2
    assert_plain_protocol(conns)
    assert [_types(c) for c in conns] == [["reset", "step", "state", "close"],
                                          ["state", "close"]]
    assert all(c.errors == [] for c in conns)


async def test_only_the_plain_protocol_reaches_openenv(
        counter_server: RecordingServer, tag: str, tag_headers: dict[str, str]) -> None:
    """Extensions are offered, not advertised back, so envlink sends only plain frames."""
    provider = TracerProvider()
    tracer = provider.get_tracer("interop")
    with tracer.start_as_current_span("episode") as span:
        async with envlink.GenericEnvClient(counter_server.base_url, headers=tag_headers,
                                            timeout=CALL_TIMEOUT,
                                            tracer_provider=provider) as env:
            await env.reset(seed=3)
            await env.step({"delta": 1})
            assert env.extensions_active is False
            await env.state()
    trace_id = format(span.get_span_context().trace_id, "032x")

    conn = _only(read_connections(counter_server.frame_log, tag))
    # Offered on the upgrade request; a vanilla OpenEnv server does not answer it.
    assert conn.request_headers.get("envlink-protocol") == "1"
    assert "envlink-protocol" not in (conn.accept_headers or {})
    # Trace context rides on the upgrade request only, never inside frames.
    assert conn.request_headers["traceparent"].split("-")[1] == trace_id
    assert conn.request_headers[TAG_HEADER] == tag
    assert_plain_protocol([conn])
    assert conn.errors == [], "the OpenEnv server rejected a frame envlink sent"
    assert len(conn.received) == 3


def test_loopback_server_reached_despite_proxy_variables(
        echo_server: RecordingServer, openenv_py: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """With HTTP(S)_PROXY set, envlink still reaches a loopback server, as OpenEnv's client does."""
    dead_proxy = "http://127.0.0.1:9"  # nothing listens there: a proxied connection fails
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.setenv(name, dead_proxy)
    for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    # OpenEnv's client bypasses proxies for localhost URLs (its _is_localhost_ws_url).
    baseline = subprocess.run(
        [openenv_py, str(CLIENTS / "openenv_client_driver.py"), "echo_async",
         echo_server.base_url, "--tag", "proxy-baseline"],
        capture_output=True, text=True, timeout=45, check=False, stdin=subprocess.DEVNULL)
    assert baseline.returncode == 0, baseline.stderr[-2000:]
    client = envlink.GenericEnvClient(echo_server.base_url, timeout=CALL_TIMEOUT,
                                      reconnect=envlink.ReconnectPolicy(max_attempts=1))
    with client.sync() as env:
        result = env.reset()
    assert result.observation["echoed_message"] == "Echo environment ready!"


# ------------------------------------------------------------- error frames


async def test_invalid_action_is_a_validation_server_error(
        counter_server: RecordingServer, tag: str, tag_headers: dict[str, str]) -> None:
    """OpenEnv's VALIDATION_ERROR frame becomes ServerError(code) and the session survives."""
    async with CounterEnv(counter_server.base_url, headers=tag_headers,
                          timeout=CALL_TIMEOUT) as env:
        await env.reset(seed=4)
        await env.step(CounterAction(1))
        with pytest.raises(envlink.ServerError) as bad_type:
            await env.step(CounterAction("not-a-number"))  # type: ignore[arg-type]
        with pytest.raises(envlink.ServerError) as out_of_range:
            await env.step(CounterAction(1000))
        after = await env.step(CounterAction(2))

    for error in (bad_type.value, out_of_range.value):
        assert not isinstance(error, envlink.CapacityReachedError)
        assert error.code == envlink.ErrorCode.VALIDATION_ERROR
        assert error.code == "VALIDATION_ERROR"
        assert error.message == "Invalid message"
    # The errors did not end the session: the episode goes on where it was.
    assert after.observation.history == [1, 2]
    conn = _only(read_connections(counter_server.frame_log, tag))
    assert [e["data"]["code"] for e in conn.errors] == ["VALIDATION_ERROR"] * 2
    assert_plain_protocol([conn])


async def test_capacity_reached_is_a_typed_error(
        spawn_openenv: Callable[..., RecordingServer]) -> None:
    """Beyond OpenEnv's session limit envlink raises CapacityReachedError, then recovers."""
    server = spawn_openenv("counter", max_sessions=1)
    holder = envlink.GenericEnvClient(server.base_url, timeout=CALL_TIMEOUT)
    extra = envlink.GenericEnvClient(server.base_url, timeout=CALL_TIMEOUT,
                                     reconnect=FAST_RECONNECT)
    try:
        await holder.reset(seed=5)
        with pytest.raises(envlink.CapacityReachedError) as refused:
            await extra.reset(seed=6)
        assert isinstance(refused.value, envlink.ServerError)
        assert refused.value.code == "CAPACITY_REACHED"
        await holder.close()
        # The slot is free again: the refused client can now start its episode.
        result = await extra.reset(seed=6)
        assert result.observation["total"] == 0
    finally:
        await holder.close()
        await extra.close()

    conns = read_connections(server.frame_log)
    refusals = [c for c in conns if any(e["data"]["code"] == "CAPACITY_REACHED"
                                        for e in c.errors)]
    assert refusals, "the server never refused a session"
    assert_plain_protocol(conns)


# ------------------------------------------------------------- server restarts


async def _start_episode(env: CounterEnv) -> None:
    await env.reset(seed=7, start=0, target=100)
    await env.step(CounterAction(1, "one"))
    await env.step(CounterAction(2, "two"))


def _restart(spawn: Callable[..., RecordingServer], server: RecordingServer,
             *extra_args: str) -> RecordingServer:
    """SIGKILL the server (no close frames) and start a fresh one on the same port."""
    server.process.kill()
    return spawn("counter", port=server.port, max_sessions=4, extra_args=extra_args)


async def test_restart_with_raise_policy_raises_session_lost(
        spawn_openenv: Callable[..., RecordingServer]) -> None:
    """on_session_lost="raise": SessionLostError with the journal; nothing replayed or resent."""
    first = spawn_openenv("counter", max_sessions=4)
    env = CounterEnv(first.base_url, timeout=CALL_TIMEOUT, reconnect=FAST_RECONNECT,
                     on_session_lost="raise")
    try:
        await _start_episode(env)
        second = _restart(spawn_openenv, first)
        with pytest.raises(envlink.SessionLostError) as lost:
            await env.step(CounterAction(3, "three"))
        assert not isinstance(lost.value, envlink.ReplayDivergedError)
        journal = lost.value.journal
        assert journal is not None
        assert journal.reset_kwargs == {"seed": 7, "start": 0, "target": 100}
        # Under raise the journal counts the steps and keeps none (nothing to replay).
        assert (journal.steps_applied, journal.entries) == (2, [])
        # The fresh server never saw the interrupted step (nor a replay of the others).
        steps = [f for c in read_connections(second.frame_log) for f in c.sent
                 if f["type"] == "step"]
        assert steps == []
        # The client is still usable: a new episode starts on the new server.
        again = await env.reset(seed=8)
        assert again.observation.total == 0
    finally:
        await env.close()
    assert_plain_protocol(read_connections(second.frame_log))


async def test_restart_with_replay_policy_continues_the_episode(
        spawn_openenv: Callable[..., RecordingServer]) -> None:
    """on_session_lost="replay": the episode is rebuilt on the new server and goes on."""
    first = spawn_openenv("counter", max_sessions=4)
    env = CounterEnv(first.base_url, timeout=CALL_TIMEOUT, reconnect=FAST_RECONNECT,
                     on_session_lost="replay")
    try:
        await _start_episode(env)
        second = _restart(spawn_openenv, first)
        result = await env.step(CounterAction(3, "three"))
        state = await env.state()
    finally:
        await env.close()

    assert (result.observation.total, result.observation.history) == (6, [1, 2, 3])
    assert (state.step_count, state.total) == (3, 6)
    _assert_replayed(first, second)


async def test_replay_waits_out_a_server_that_is_down(
        spawn_openenv: Callable[..., RecordingServer]) -> None:
    """A step issued while the server is down reconnects under the policy once it is back."""
    first = spawn_openenv("counter", max_sessions=4)
    patient = envlink.ReconnectPolicy(max_attempts=200, initial_delay=0.05, max_delay=0.25,
                                      max_elapsed=40.0)
    env = CounterEnv(first.base_url, timeout=45.0, reconnect=patient, on_session_lost="replay")
    try:
        await _start_episode(env)
        first.process.kill()
        # The step starts while nothing listens on the port; the server comes back
        # (a few seconds: OpenEnv's imports) while the client is backing off.
        pending = asyncio.ensure_future(env.step(CounterAction(3, "three")))
        second = await asyncio.to_thread(spawn_openenv, "counter", port=first.port,
                                         max_sessions=4)
        result = await pending
    finally:
        await env.close()

    assert result.observation.history == [1, 2, 3]
    _assert_replayed(first, second)


def test_restart_with_replay_policy_through_sync_facade(
        spawn_openenv: Callable[..., RecordingServer]) -> None:
    """The same replay recovery works through the sync facade."""
    first = spawn_openenv("counter", max_sessions=4)
    with CounterEnv(first.base_url, timeout=CALL_TIMEOUT, reconnect=FAST_RECONNECT,
                    on_session_lost="replay").sync() as env:
        env.reset(seed=7, start=0, target=100)
        env.step(CounterAction(1, "one"))
        env.step(CounterAction(2, "two"))
        second = _restart(spawn_openenv, first)
        result = env.step(CounterAction(3, "three"))
        state = env.state()

    assert result.observation.history == [1, 2, 3]
    assert state.step_count == 3
    _assert_replayed(first, second)


def _assert_replayed(first: RecordingServer, second: RecordingServer) -> None:
    """The new server got reset + the recorded steps + the interrupted one, all accepted,
    and answered the replayed ones exactly as the killed server had."""
    old = _only([c for c in read_connections(first.frame_log) if c.sent])
    new = [c for c in read_connections(second.frame_log) if c.sent]
    assert_plain_protocol(new)
    replayed = new[-1]
    assert replayed.errors == [], "the OpenEnv server rejected a replayed frame"
    assert replayed.sent[:4] == [
        {"type": "reset", "data": {"seed": 7, "start": 0, "target": 100}},
        {"type": "step", "data": {"delta": 1, "label": "one"}},
        {"type": "step", "data": {"delta": 2, "label": "two"}},
        {"type": "step", "data": {"delta": 3, "label": "three"}},
    ]
    assert replayed.received[:3] == old.received[:3]
    # Each action reached the new server exactly once.
    all_steps = [f for c in new for f in c.sent if f["type"] == "step"]
    assert len(all_steps) == 3


async def test_replay_against_a_changed_server_diverges(
        spawn_openenv: Callable[..., RecordingServer]) -> None:
    """A restarted server answering differently makes replay raise ReplayDivergedError."""
    first = spawn_openenv("counter", max_sessions=4)
    env = CounterEnv(first.base_url, timeout=CALL_TIMEOUT, reconnect=FAST_RECONNECT,
                     on_session_lost="replay")
    try:
        await _start_episode(env)
        second = _restart(spawn_openenv, first, "--offset", "1000")
        with pytest.raises(envlink.ReplayDivergedError) as diverged:
            await env.step(CounterAction(3, "three"))
    finally:
        await env.close()

    error = diverged.value
    assert isinstance(error, envlink.SessionLostError)
    assert error.journal is not None
    assert error.journal.reset_kwargs == {"seed": 7, "start": 0, "target": 100}
    # The reset answered differently, so not one step was replayed on the new server.
    steps = [f for c in read_connections(second.frame_log) for f in c.sent
             if f["type"] == "step"]
    assert steps == []


def test_the_task_api_of_an_openenv_server(counter_server: RecordingServer) -> None:
    """envlink's Task API calls against OpenEnv 0.10's own routes: environments, splits
    (normalised by OpenEnv), counts, one task, a range, a split; a task resets an episode;
    an index outside the split is OpenEnv's 400 as an HttpStatusError."""
    with CounterEnv(counter_server.base_url).sync() as env:
        assert env.tasks.list_environments() == ["counter_env"]
        assert [s["name"] for s in env.tasks.splits()] == ["train", "eval"]
        assert env.tasks.num_tasks("train") == 6
        assert env.tasks.get_task("eval", 0) == {"start": 100, "target": 101}
        assert env.tasks.get_task_range("train", 4, 10) == [{"start": 4, "target": 9},
                                                            {"start": 5, "target": 10}]
        assert len(env.tasks.list_tasks("train")) == 6
        result = env.reset(**env.tasks.get_task("train", 3))
        assert result.observation.total == 3
        with pytest.raises(envlink.HttpStatusError) as exc:
            env.tasks.get_task("eval", 5)
        assert exc.value.status == 400


def test_openenv_clients_have_no_task_api_calls_to_alias(openenv_py: str) -> None:
    """OpenEnv 0.10's EnvClient, GenericEnvClient and SyncEnvClient have none of the Task
    API's names (envlink's client.tasks, or its earlier client methods), so envlink's
    EnvClient keeps no alias of them."""
    names = sorted({n for n in dir(envlink.EnvClient(base_url="http://127.0.0.1:9").tasks)
                    if not n.startswith("_")} | {"task", "task_range", "tasks"})
    script = ("import json\nfrom openenv.core import EnvClient, GenericEnvClient, "
              "SyncEnvClient\n"
              f"names = {names!r}\n"
              "print(json.dumps(sorted(n for c in (EnvClient, GenericEnvClient, "
              "SyncEnvClient) for n in names if hasattr(c, n))))\n")
    done = subprocess.run([openenv_py, "-c", script], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
    assert not any(hasattr(envlink.EnvClient, n) for n in names if n != "tasks")
