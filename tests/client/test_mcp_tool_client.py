"""MCPToolClient / MCPClientBase with OpenEnv 0.10's surface, on the real reference server:
Tool objects (cached), get_tool / has_tool, typed tool errors, production by default."""

from __future__ import annotations

import asyncio
import pickle
import warnings
from typing import Any, ClassVar

import pytest
from pydantic import BaseModel, model_serializer

from envlink import (
    CallToolAction,
    CallToolObservation,
    EchoEnv,
    EchoObservation,
    GenericEnvClient,
    ListToolsAction,
    ListToolsObservation,
    MCPClientBase,
    MCPObservation,
    MCPToolClient,
    State,
    Tool,
    ToolCallError,
    ToolError,
    ToolErrorType,
)
from envlink.integrations.openai_tools import to_openai_tools
from envlink.server import ServerThread

pytestmark = pytest.mark.timeout(30)

URL = "http://127.0.0.1:9"
ECHO_TOOLS = ["echo_message", "echo_with_length"]


def test_echo_env_is_an_mcp_tool_client() -> None:
    """EchoEnv is an MCPToolClient (an MCPClientBase), as OpenEnv's echo client."""
    assert issubclass(EchoEnv, MCPToolClient) and issubclass(MCPToolClient, MCPClientBase)


def test_mcp_clients_default_to_production(monkeypatch: pytest.MonkeyPatch) -> None:
    """An MCP client is in production mode unless mode= says otherwise, whatever
    OPENENV_CLIENT_MODE says (OpenEnv's MCP clients do not read it); a plain client still
    defaults to simulation."""
    monkeypatch.setenv("OPENENV_CLIENT_MODE", "simulation")
    assert MCPToolClient(URL).mode == "production"
    assert EchoEnv(URL).mode == "production"
    assert EchoEnv(URL, mode="simulation").mode == "simulation"
    assert MCPToolClient(URL).use_production_mode is True
    assert EchoEnv(URL, mode="simulation").use_production_mode is False
    assert GenericEnvClient(URL).mode == "simulation"
    monkeypatch.delenv("OPENENV_CLIENT_MODE")
    assert GenericEnvClient(URL).mode == "simulation"


@pytest.mark.parametrize("detached", [False, True], ids=["plain", "detached-sessions"])
def test_list_tools_returns_cached_tool_objects(detached: bool) -> None:
    """list_tools() gives Tool objects (name, description, input_schema), the same list
    again from the cache, a fresh one with use_cache=False; get_tool and has_tool use it.
    On envlink's server (which runs tools only as steps) a default-mode client lists them
    with a step, with or without HTTP MCP sessions."""
    with ServerThread(env="echo", detached_sessions=detached) as st, EchoEnv(st.url) as env:
        env.reset()
        tools = env.list_tools()
        assert all(isinstance(t, Tool) for t in tools)
        assert [t.name for t in tools] == ECHO_TOOLS
        assert tools[0].description and tools[0].input_schema["type"] == "object"
        assert env.list_tools() is tools
        assert env.state().step_count == 1  # the cached call did not reach the server
        fresh = env.list_tools(use_cache=False)
        assert fresh is not tools and fresh == tools
        assert env.get_tool("echo_with_length") == tools[1]
        assert env.get_tool("nope") is None
        assert env.has_tool("echo_message") and not env.has_tool("nope")
        assert env.state().step_count == 2


def test_tools_read_by_key_as_the_dicts_they_were() -> None:
    """A Tool is also readable by key (name, description, input_schema or inputSchema),
    as list_tools()'s dicts were, and to_openai_tools takes Tool objects."""
    tool = Tool.from_payload({"name": "t", "description": "d",
                              "inputSchema": {"type": "object", "properties": {}}})
    assert tool["name"] == "t" and tool.get("description") == "d"
    assert tool["inputSchema"] == tool["input_schema"] == tool.input_schema
    assert dict(**tool)["name"] == "t"
    assert to_openai_tools([tool]) == to_openai_tools([{"name": "t", "description": "d",
                                                        "inputSchema": tool.input_schema}])


def test_call_tool_is_a_step_where_the_server_has_no_http_tools(
        server_thread: ServerThread) -> None:
    """On a server without HTTP MCP sessions a default-mode call_tool is a call_tool step
    (the only way that server runs a tool) and returns the tool's value."""
    with EchoEnv(server_thread.url) as env:
        env.reset()
        assert env.call_tool("echo_message", message="hi") == "hi"
        assert env.call_tool("echo_with_length", message="four") == {"message": "four",
                                                                      "length": 4}
        assert env.state().step_count == 2


def test_use_production_mode_is_settable_with_openenvs_effect(
        server_thread: ServerThread) -> None:
    """As in OpenEnv, `env.use_production_mode = False` runs tools as steps on a client
    made in production mode (which calls them over POST /mcp, not as steps), and
    `= True` sends a simulation client's tool calls over POST /mcp; `mode` stays."""
    with EchoEnv(server_thread.url, mode="production") as env:
        env.reset()
        assert env.call_tool("echo_message", message="hi") == "hi"
        assert server_thread.server.counter("rpc.tools/call") == 1  # over POST /mcp
        env.use_production_mode = False
        assert env.use_production_mode is False and env.mode == "production"
        assert env.call_tool("echo_message", message="hi") == "hi"
        assert [t.name for t in env.list_tools()] == ECHO_TOOLS
        assert server_thread.server.counter("rpc.tools/call") == 1  # as steps
        assert env.state().step_count == 3
    with EchoEnv(server_thread.url, mode="simulation") as env:
        env.reset()
        assert env.call_tool("echo_message", message="hi") == "hi"
        assert server_thread.server.counter("rpc.tools/call") == 1  # a step
        env.use_production_mode = True
        assert env.use_production_mode is True and env.mode == "simulation"
        assert env.call_tool("echo_message", message="hi") == "hi"
        assert server_thread.server.counter("rpc.tools/call") == 2  # over POST /mcp
    with pytest.raises(TypeError, match="bool"):
        EchoEnv(URL).use_production_mode = 1  # type: ignore[assignment]


def test_a_tool_error_is_typed(server_thread: ServerThread) -> None:
    """A failed call_tool step's observation.error is a ToolError (.error_type, .message),
    and call_tool raises ToolCallError (a RuntimeError) in OpenEnv's wording."""
    with EchoEnv(server_thread.url) as env:
        env.reset()
        result = env.step(CallToolAction(tool_name="nope", arguments={}))
        error = result.observation.error
        assert isinstance(error, ToolError)
        assert error.error_type is ToolErrorType.TOOL_NOT_FOUND and "nope" in error.message
        assert error["error_type"] == "tool_not_found"  # as the dict it was
        ok = env.step(CallToolAction(tool_name="echo_message", arguments={"message": "x"}))
        assert ok.observation.error is None and ok.observation.result == "x"
        with pytest.raises(ToolCallError, match=r"Tool 'echo_message' failed: .*invalid_args"):
            env.call_tool("echo_message", wrong="x")


def test_tool_errors_from_other_servers_are_kept() -> None:
    """An error kind OpenEnv does not list, or an error sent as text, is still a ToolError
    with its kind and message."""
    observation = MCPObservation.model_validate(
        {"tool_name": "t", "error": {"error_type": "rate_limited", "message": "slow down"}})
    assert observation.error is not None
    assert observation.error.error_type.value == "rate_limited"
    text = MCPObservation.model_validate({"tool_name": "t", "error": "boom"})
    assert text.error == ToolError(error_type=ToolErrorType.EXECUTION_ERROR, message="boom")
    assert MCPObservation.model_validate({"tool_name": "t", "error": None}).error is None


def test_methods_are_awaitable_in_async_code(server_thread: ServerThread) -> None:
    """In async code list_tools, get_tool, has_tool and call_tool are awaited, as the
    client's other methods; inside a loop, a result used without await still works."""
    async def run() -> None:
        async with EchoEnv(server_thread.url) as env:
            await env.reset()
            assert [t.name for t in await env.list_tools(use_cache=False)] == ECHO_TOOLS
            assert (await env.get_tool("echo_message")) is not None
            assert await env.has_tool("echo_with_length")
            assert await env.call_tool("echo_message", message="a") == "a"
        plain = EchoEnv(server_thread.url)
        with warnings.catch_warnings():
            # The bridge's warning that this blocks the running loop (once per bridge).
            warnings.simplefilter("ignore", RuntimeWarning)
            try:
                assert plain.has_tool("echo_message")  # used, not awaited: blocks for it
            finally:
                plain.close()

    asyncio.run(run())


def test_a_subclass_override_still_dispatches(server_thread: ServerThread) -> None:
    """A typed client overriding call_tool with a coroutine is still callable without
    await in plain code, and its super() call reaches the tool."""
    class Loud(MCPToolClient[MCPObservation]):
        async def call_tool(self, name: str, /, **kwargs: Any) -> Any:
            value = await super().call_tool(name, **kwargs)
            return str(value).upper()

    with Loud(server_thread.url) as env:
        env.reset()
        assert env.call_tool("echo_message", message="hi") == "HI"
        assert isinstance(env.state(), State)


# ------------------------------------------------------------ typed observations (issue 41)


@pytest.mark.parametrize("client_class", [MCPToolClient, EchoEnv])
def test_tool_steps_give_openenv_typed_observations(server_thread: ServerThread,
                                                    client_class: type[MCPToolClient[Any]]) -> None:
    """step(CallToolAction) gives a CallToolObservation (tool_name, result, error with an
    error_type of ToolErrorType, done, reward, metadata) and step(ListToolsAction) a
    ListToolsObservation of Tool objects, as OpenEnv's MCP client; both stay
    MCPObservations readable by key, and EchoEnv's are EchoObservations too. A reset's
    observation is the client's own type."""
    with client_class(server_thread.url) as env:
        reset = env.reset().observation
        assert not isinstance(reset, CallToolObservation | ListToolsObservation)
        assert isinstance(reset, EchoObservation if client_class is EchoEnv else MCPObservation)

        ok = env.step(CallToolAction(tool_name="echo_message", arguments={"message": "hi"}))
        obs = ok.observation
        assert isinstance(obs, CallToolObservation) and isinstance(obs, MCPObservation)
        assert (obs.tool_name, obs.result, obs.error) == ("echo_message", "hi", None)
        assert (obs.done, obs.reward, obs.metadata) == (ok.done, ok.reward, {})
        assert obs["result"] == "hi" and obs.get("tool_name") == "echo_message"
        assert obs.tools is None  # MCPObservation's field, as before
        if client_class is EchoEnv:
            assert isinstance(obs, EchoObservation) and type(obs).__name__ == "EchoObservation"

        failed = env.step(CallToolAction(tool_name="nope")).observation
        assert isinstance(failed, CallToolObservation) and failed.error is not None
        assert failed.error.error_type is ToolErrorType.TOOL_NOT_FOUND
        assert failed["error"]["error_type"] == "tool_not_found"

        listed = env.step(ListToolsAction()).observation
        assert isinstance(listed, ListToolsObservation)
        assert not isinstance(listed, CallToolObservation)
        assert [t.name for t in listed.tools] == ECHO_TOOLS
        assert all(isinstance(t, Tool) for t in listed.tools)
        assert [t["name"] for t in listed["tools"]] == ECHO_TOOLS


def test_parse_result_types_observations_as_openenv() -> None:
    """An MCP client's _parse_result (what a typed subclass's override calls) types a tool
    listing (MCP's inputSchema spelling too) and a tool call; done, reward and metadata
    come from the step, the observation's metadata when the step has none."""
    client = MCPToolClient(URL)
    listed = client._parse_result({"observation": {"tools": [
        {"name": "t", "description": "d", "inputSchema": {"type": "object"}}]},
        "reward": 1.0, "done": True})
    assert isinstance(listed.observation, ListToolsObservation)
    assert listed.observation.tools == [Tool(name="t", description="d",
                                             input_schema={"type": "object"})]
    assert (listed.observation.done, listed.observation.reward) == (True, 1.0)
    called = client._parse_result({"observation": {
        "tool_name": "t", "result": {"x": 1}, "metadata": {"m": 1},
        "error": {"error_type": "invalid_args", "message": "bad"}}})
    obs = called.observation
    assert isinstance(obs, CallToolObservation)
    assert obs.error == ToolError(error_type=ToolErrorType.INVALID_ARGS, message="bad")
    assert (obs.metadata, obs.done, obs.reward) == ({"m": 1}, False, None)
    top = client._parse_result({"observation": {"tool_name": "t", "metadata": {"m": 1}},
                                "metadata": {"top": 2}})
    assert top.observation.metadata == {"top": 2}
    plain = client._parse_result({"observation": {"echoed_message": "x"}})
    assert type(plain.observation) is MCPObservation
    assert Tool.model_validate({"name": "t", "inputSchema": {"a": 1}}).input_schema == {"a": 1}


def test_a_typed_subclass_keeps_its_observation_type() -> None:
    """A client's own observation type (_observation_type) is kept on tool steps: the
    observation is an instance of both, with the subclass's fields; the class is made once
    and its observations pickle and copy."""
    class GameObservation(MCPObservation):
        score: int = 0

    class GameClient(MCPToolClient[GameObservation]):
        _observation_type: ClassVar[type[MCPObservation]] = GameObservation

    client = GameClient(URL)
    first = client._parse_result({"observation": {"tool_name": "t", "score": 3}}).observation
    second = client._parse_result({"observation": {"tool_name": "u"}}).observation
    assert isinstance(first, CallToolObservation) and isinstance(first, GameObservation)
    assert first.score == 3 and type(first) is type(second)
    assert first.model_copy() == first
    listed = client._parse_result({"observation": {"tools": []}}).observation
    assert isinstance(listed, ListToolsObservation) and isinstance(listed, GameObservation)

    echo = EchoEnv(URL)._parse_result({"observation": {"tool_name": "echo_message",
                                                       "result": "hi"}}).observation
    restored = pickle.loads(pickle.dumps(echo))
    assert type(restored) is type(echo) and restored == echo
    assert isinstance(restored, EchoObservation) and isinstance(restored, CallToolObservation)
    plain = pickle.loads(pickle.dumps(CallToolObservation(tool_name="t", result=1)))
    assert type(plain) is CallToolObservation and plain.result == 1


def test_openenv_shapes_build_directly() -> None:
    """CallToolObservation needs a tool_name, as OpenEnv's; ListToolsObservation takes tools
    as payloads in either schema spelling."""
    with pytest.raises(ValueError, match="tool_name"):
        CallToolObservation()  # type: ignore[call-arg]
    listed = ListToolsObservation(tools=[{"name": "t", "inputSchema": {"a": 1}}])  # type: ignore[list-item]
    assert listed.tools[0].input_schema == {"a": 1} and listed.done is False


def test_reading_an_observation_by_key_dumps_that_field_alone() -> None:
    """obs[key] and obs.get(key) give the field as model_dump() does (a tool error as a
    dict) without dumping the rest of the observation (a large result is not copied
    for each key read)."""
    dumped: list[str] = []

    class Counted(BaseModel):
        name: str

        @model_serializer
        def _dump(self) -> dict[str, str]:
            dumped.append(self.name)
            return {"name": self.name}

    obs = CallToolObservation(
        tool_name="t", result={"big": Counted(name="result")},
        error={"error_type": "execution_error", "message": "m"}, note=Counted(name="note"))
    assert obs["tool_name"] == "t" and obs.get("tool_name") == "t"
    assert obs.get("missing", 7) == 7
    with pytest.raises(KeyError):
        obs["missing"]
    assert dumped == []
    assert obs["error"] == obs.model_dump()["error"] == {
        "error_type": ToolErrorType.EXECUTION_ERROR, "message": "m"}
    dumped.clear()
    assert obs["note"] == {"name": "note"} and dumped == ["note"]
