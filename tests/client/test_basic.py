"""The async client against the real reference server: the OpenEnv surface, end to end."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import pytest

from envlink import (
    CallToolAction,
    CapacityReachedError,
    ClientClosedError,
    ConnectError,
    EchoEnv,
    EnvClient,
    ErrorCode,
    GenericEnvClient,
    ListToolsAction,
    ProtocolError,
    ServerError,
    StepResult,
    ToolCallError,
)
from envlink.server import EnvServer

pytestmark = pytest.mark.timeout(30)


def echo(message: str) -> CallToolAction:
    return CallToolAction(tool_name="echo_message", arguments={"message": message})


async def test_echo_episode_matches_openenv_echo(any_server: EnvServer) -> None:
    """Reset, call_tool, echo_with_length, list_tools and state behave like OpenEnv's echo."""
    async with EchoEnv(base_url=any_server.http_url) as env:
        reset = await env.reset()
        assert reset.observation.echoed_message == "Echo environment ready!"
        assert reset.done is False
        result = await env.step(echo("Hello, World!"))
        assert result.observation.result == "Hello, World!"
        sized = await env.step(CallToolAction(tool_name="echo_with_length",
                                              arguments={"message": "abc"}))
        assert sized.observation.result == {"message": "abc", "length": 3}
        tools = await env.step(ListToolsAction())
        assert {t["name"] for t in tools.observation.tools or []} == {
            "echo_message", "echo_with_length"}
        assert await env.call_tool("echo_message", message="x") == "x"
        state = await env.state()
        assert state["step_count"] == 4
        assert isinstance(state["episode_id"], str)


@pytest.mark.parametrize("form", ["http", "ws", "ws_path"])
async def test_generic_client_accepts_every_url_form(server: EnvServer, form: str) -> None:
    """http://, ws:// and ws://.../ws base URLs all reach the server; dict actions echo."""
    url = {"http": server.http_url, "ws": f"ws://127.0.0.1:{server.port}",
           "ws_path": f"ws://127.0.0.1:{server.port}/ws"}[form]
    client = GenericEnvClient(base_url=url)
    try:
        await client.reset()
        result = await client.step({"message": "plain"})
        assert result.observation["echoed_message"] == "plain"
        assert result.reward == pytest.approx(0.5)
    finally:
        await client.close()


@dataclass
class Shout:
    text: str


@dataclass
class Heard:
    words: str
    length: int


class ShoutEnv(EnvClient[Shout, Heard, int]):
    """A typed subclass using all three OpenEnv hooks."""

    def _step_payload(self, action: Shout) -> dict[str, Any]:
        return {"message": action.text.upper()}

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[Heard]:
        obs = payload["observation"]
        return StepResult(Heard(obs["echoed_message"], obs["message_length"]),
                          payload.get("reward"), payload["done"])

    def _parse_state(self, payload: dict[str, Any]) -> int:
        return int(payload["step_count"])


async def test_typed_subclass_hooks_shape_every_call(server: EnvServer) -> None:
    """_step_payload, _parse_result and _parse_state are used exactly as in OpenEnv."""
    async with ShoutEnv(server.url) as env:
        await env.reset()
        result = await env.step(Shout("hi"))
        assert result.observation == Heard("HI", 2)
        assert await env.state() == 1


class MisreadEnv(GenericEnvClient):
    """A typed client whose observation model does not match the server's."""

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[dict[str, Any]]:
        return StepResult(payload["observation"]["no_such_field"])


async def test_a_failing_parse_hook_is_a_protocol_error(server: EnvServer) -> None:
    """An observation the typed client cannot parse raises ProtocolError, not KeyError."""
    async with MisreadEnv(server.url) as env:
        with pytest.raises(ProtocolError, match="could not parse the server's observation") as info:
            await env.reset()
        assert isinstance(info.value.__cause__, KeyError)


async def test_error_frames_map_to_server_error_with_code(any_server: EnvServer) -> None:
    """An error frame raises ServerError carrying the server's code; the next call works."""
    async with GenericEnvClient(any_server.url) as env:
        await env.reset()
        any_server.faults.error_frames = 1
        any_server.faults.error_code = "EXECUTION_ERROR"
        with pytest.raises(ServerError) as info:
            await env.step({"message": "boom"})
        assert info.value.code is ErrorCode.EXECUTION_ERROR
        assert (await env.step({"message": "fine"})).observation["echoed_message"] == "fine"


async def test_invalid_action_is_a_validation_error(any_server: EnvServer) -> None:
    """An action the environment rejects comes back as ServerError(VALIDATION_ERROR)."""
    async with GenericEnvClient(any_server.url) as env:
        await env.reset()
        with pytest.raises(ServerError) as info:
            await env.step({"type": "call_tool", "arguments": "not-a-dict"})
        assert info.value.code is ErrorCode.VALIDATION_ERROR
        # The field errors are in the text, not only in .details.
        text = str(info.value)
        assert text.startswith("[VALIDATION_ERROR] ")
        assert "tool_name: Field required" in text, text
        assert "not-a-dict" not in text  # the rejected input stays out of the text


async def test_capacity_reached_is_typed() -> None:
    """Beyond max_sessions the server's CAPACITY_REACHED becomes CapacityReachedError."""
    async with EnvServer(env="echo", max_sessions=1) as srv:
        first = GenericEnvClient(srv.url)
        second = GenericEnvClient(srv.url)
        try:
            await first.reset()
            with pytest.raises(CapacityReachedError):
                await second.reset()
        finally:
            await first.close()
            await second.close()


@pytest.mark.parametrize(
    "kind", ["invalid_json", "array", "bad_data", "unknown_type", "missing_field", "binary"])
async def test_corrupt_frames_raise_protocol_error_and_never_leak(any_server: EnvServer,
                                                                  kind: str) -> None:
    """A corrupt answer raises ProtocolError; the next call still gets its own answer."""
    async with GenericEnvClient(any_server.url) as env:
        any_server.faults.corrupt_frames = 1
        any_server.faults.corrupt_kind = kind  # type: ignore[assignment]
        with pytest.raises(ProtocolError):
            await env.reset()
        reset = await env.reset()
        assert reset.observation["echoed_message"] == "Echo environment ready!"
        assert (await env.step({"message": kind})).observation["echoed_message"] == kind


async def test_oversize_frame_is_a_protocol_error() -> None:
    """A frame over max_message_size raises ProtocolError naming the limit; the client recovers."""
    async with (EnvServer(env="echo") as srv,
                GenericEnvClient(srv.url, max_message_size=64 * 1024) as env):
            srv.faults.corrupt_frames = 1
            srv.faults.corrupt_kind = "oversize"
            srv.faults.oversize_bytes = 200 * 1024
            with pytest.raises(ProtocolError, match=r"larger than the limit|exceeds"):
                await env.reset()
            assert (await env.reset()).observation["echoed_message"]


async def test_many_tasks_on_one_client_each_get_their_own_answer(server: EnvServer) -> None:
    """8 tasks x 500 steps on one client: every answer belongs to its caller, in FIFO order."""
    async with GenericEnvClient(server.url) as env:
        await env.reset()

        async def worker(w: int) -> list[str]:
            wrong = []
            for i in range(500):
                message = f"w{w}-{i}"
                got = (await env.step({"message": message})).observation["echoed_message"]
                if got != message:
                    wrong.append(f"{message}->{got}")
            return wrong

        results = await asyncio.gather(*(worker(w) for w in range(8)))
        assert results == [[]] * 8
        assert (await env.state())["step_count"] == 4000
    assert server.steps_applied == 4000


async def test_close_releases_and_a_later_call_opens_the_client_again(
        server: EnvServer) -> None:
    """As OpenEnv's: close() twice is fine and ends the connection; a later call opens a
    new connection and session. close(final=True) makes every later call raise
    ClientClosedError (a RuntimeError)."""
    env = GenericEnvClient(server.url)
    await env.reset()
    await env.close()
    await env.close()
    assert env.closed and not env.connected
    await server.wait_for_disconnect(1)
    result = await env.reset()
    assert result.observation["echoed_message"] == "Echo environment ready!"
    assert not env.closed and env.connected
    assert server.connections_opened == 2
    await env.connect()
    assert server.connections_opened == 2
    await env.close(final=True)
    for call in (env.reset, env.connect, env.new_session, env.health):
        with pytest.raises(RuntimeError, match=r"close\(final=True\)") as caught:
            await call()
        assert isinstance(caught.value, ClientClosedError)
    assert server.connections_opened == 2
    await env.close()  # still idempotent


async def test_async_with_twice_on_one_client(server: EnvServer) -> None:
    """The reconnect pattern of OpenEnv code: the same client in two `async with` blocks."""
    env = GenericEnvClient(server.url)
    for n in (1, 2):
        async with env:
            await env.reset()
            assert (await env.step({"message": str(n)})).observation["echoed_message"] == str(n)
        assert env.closed
    assert server.connections_opened == 2


async def test_close_fails_the_inflight_and_queued_calls(server: EnvServer) -> None:
    """A call stalled in flight and one queued behind it both get ClientClosedError on close."""
    env = GenericEnvClient(server.url)
    await env.reset()
    server.faults.stall_after = 2
    inflight = asyncio.create_task(env.step({"message": "stuck"}))
    queued = asyncio.create_task(env.step({"message": "behind"}))
    await server.wait_for_request("step", 1)
    await env.close()
    for task in (inflight, queued):
        with pytest.raises(ClientClosedError):
            await task


async def test_disconnect_keeps_the_client_usable(server: EnvServer) -> None:
    """disconnect() ends the session; the next call opens a new connection and session."""
    env = GenericEnvClient(server.url)
    try:
        await env.reset()
        first_session = env.session_id
        await env.disconnect()
        assert not env.connected
        await env.reset()
        assert env.session_id != first_session
        assert server.connections_opened == 2
    finally:
        await env.close()


async def test_extensions_are_negotiated_never_assumed(server: EnvServer,
                                                       plain_server: EnvServer) -> None:
    """Extensions are used only when the server advertises them and the client offers them."""
    async with GenericEnvClient(server.url) as env:
        await env.reset()
        assert env.extensions_active
        assert env.session_id in {s.id for s in server.sessions()}
    async with GenericEnvClient(plain_server.url) as env:
        await env.reset()
        assert not env.extensions_active
    async with GenericEnvClient(server.url, extensions=False) as env:
        await env.reset()
        assert not env.extensions_active


async def test_call_tool_failure_raises_tool_call_error(server: EnvServer) -> None:
    """An unknown tool or bad arguments raise ToolCallError with the server's error type."""
    async with EchoEnv(base_url=server.url) as env:
        await env.reset()
        with pytest.raises(ToolCallError) as info:
            await env.call_tool("no_such_tool", message="x")
        assert info.value.code == "tool_not_found"
        assert info.value.tool_name == "no_such_tool"
        with pytest.raises(ToolCallError) as bad:
            await env.call_tool("echo_message", wrong="x")
        assert bad.value.code == "invalid_args"
        assert await env.call_tool("echo_message", message="still fine") == "still fine"


async def test_proxy_variables_never_apply_to_loopback(server: EnvServer,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """HTTP(S)_PROXY pointing nowhere does not stop a client reaching a loopback server."""
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.setenv(var, "http://127.0.0.1:9")
    for var in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(var, raising=False)
    async with GenericEnvClient(f"ws://127.0.0.1:{server.port}") as env:
        assert (await env.reset()).observation["echoed_message"]
    async with GenericEnvClient(f"ws://localhost:{server.port}") as env:
        assert (await env.reset()).observation["echoed_message"]


@pytest.mark.parametrize("bad", [-1, 0, float("nan")])
async def test_nonsense_timeouts_are_value_errors(server: EnvServer, bad: float) -> None:
    """A negative, zero or NaN per-call timeout is refused before anything is sent."""
    async with GenericEnvClient(server.url) as env:
        with pytest.raises(ValueError, match="timeout must be a positive"):
            await env.reset(timeout=bad)
    assert server.counter("request.reset") == 0


async def test_unserialisable_action_is_a_type_error_and_nothing_is_lost(
        server: EnvServer) -> None:
    """An action JSON cannot carry raises TypeError naming it; the session carries on."""
    async with GenericEnvClient(server.url) as env:
        await env.reset()
        with pytest.raises(TypeError, match=r"action\.message: not JSON-serialisable"):
            await env.step({"message": object()})
        with pytest.raises(TypeError, match="must be a dict or a pydantic model"):
            await env.step(42)  # type: ignore[arg-type]
        assert (await env.step({"message": "ok"})).observation["echoed_message"] == "ok"
        assert (await env.state())["step_count"] == 1


async def test_non_string_keys_are_a_type_error(server: EnvServer) -> None:
    """An action with non-string keys raises TypeError, not a pydantic error."""
    async with GenericEnvClient(server.url) as env:
        await env.reset()
        with pytest.raises(TypeError, match="string keys"):
            await env.step({1: "x"})  # type: ignore[dict-item]


async def test_an_unusable_proxy_is_a_fatal_connect_error(server: EnvServer) -> None:
    """A proxy URL of an unsupported scheme is a non-retryable ConnectError."""
    env = GenericEnvClient(server.url, proxy="gopher://127.0.0.1:1")
    with pytest.raises(ConnectError) as info:
        await env.reset()
    assert info.value.retryable is False
    await env.close()
