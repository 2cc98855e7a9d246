"""envlink.adopt(): an environment package's OpenEnv client class, used through envlink unedited.

The package and OpenEnv's class shapes come from a stand-in written into a temporary
directory (``_openenv_standin.py``), whose OpenEnv I/O fails if it ever runs: each
call must go through envlink. The real OpenEnv packages are covered by the interop
suite (``tests/interop/test_adopt_openenv.py``).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import envlink
from envlink import ReconnectPolicy
from envlink.server import EnvServer, ServerThread

from .._ports import restartable_port
from ._openenv_standin import STANDIN_PACKAGES, write_standin

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def standin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, ModuleType]]:
    """The stand-in OpenEnv and its packages, importable for this test only."""
    monkeypatch.syspath_prepend(str(write_standin(tmp_path)))
    before = set(sys.modules)
    import echo_tools_env
    import tally_env

    yield {"tally_env": tally_env, "echo_tools_env": echo_tools_env}
    for name in set(sys.modules) - before:
        if name.split(".")[0] in STANDIN_PACKAGES:  # envlink's own stay loaded
            del sys.modules[name]


def test_adopted_class_keeps_name_hooks_models_and_methods(
        standin: dict[str, ModuleType]) -> None:
    """The rebuilt class has the package class's name, module, hooks, extra methods,
    mixins and type arguments, on envlink's EnvClient, and is made once."""
    tally = standin["tally_env"]
    TallyEnv = envlink.adopt(tally.TallyEnv)
    assert envlink.adopt(tally.TallyEnv) is TallyEnv
    assert envlink.adopt(TallyEnv) is TallyEnv  # already envlink's: returned as is
    assert issubclass(TallyEnv, envlink.EnvClient)
    assert TallyEnv.__name__ == "TallyEnv" and TallyEnv.__module__ == "tally_env.client"
    assert issubclass(TallyEnv, tally.client.Labelled)
    assert TallyEnv.__envlink_adopted__ is tally.TallyEnv  # type: ignore[attr-defined]
    assert TallyEnv.default_action() == tally.TallyAction(message="TallyEnv")
    env = TallyEnv(base_url="http://127.0.0.1:9")
    assert env.constructed_by_package is True
    assert env.kind == "tally:TallyEnv"
    # The package's override and its super() call (into the rebuilt base) both run.
    assert env._step_payload(tally.TallyAction(message="hi")) == {"message": "HI"}


def test_adopt_refuses_what_is_not_an_openenv_client(standin: dict[str, ModuleType]) -> None:
    """A class that is no OpenEnv client, or an instance, is a TypeError naming it."""
    with pytest.raises(TypeError, match="subclass of OpenEnv's EnvClient"):
        envlink.adopt(dict)
    with pytest.raises(TypeError, match="subclass of OpenEnv's EnvClient"):
        envlink.adopt(object())  # type: ignore[arg-type]


def test_adopt_refuses_an_override_of_openenv_private_io(
        standin: dict[str, ModuleType]) -> None:
    """A package class overriding OpenEnv's own I/O (_send_and_receive) is refused with
    the method's name: envlink does that I/O and could not honour it."""
    base = standin["tally_env"].client._TallyBase

    class Chatty(base):  # type: ignore[misc,valid-type]
        async def _send_and_receive(self, message: Any) -> Any:
            return message

    with pytest.raises(TypeError, match="_send_and_receive"):
        envlink.adopt(Chatty)


def test_adopted_typed_client_blocking_and_sync_facade(
        standin: dict[str, ModuleType], server_thread: ServerThread) -> None:
    """Plain calls, `with`, .sync() and the package's own coroutine method (called
    without await) all run through envlink, with the package's models."""
    tally = standin["tally_env"]
    TallyEnv = envlink.adopt(tally.TallyEnv)
    with TallyEnv(base_url=server_thread.url, on_session_lost="auto") as env:
        env.reset()
        result = env.step(tally.TallyAction(message="abc"))
        assert isinstance(result.observation, tally.TallyObservation)
        assert result.observation.echoed_message == "ABC"
        assert env.shout("hey") == "HEY"
        state = env.state()
        assert isinstance(state, tally.TallyState) and state.step_count == 2
    facade = TallyEnv(base_url=server_thread.url).sync()
    with facade:
        facade.reset()
        assert facade.shout("quiet") == "QUIET"
        assert facade.state().step_count == 1


async def test_adopted_typed_client_async(standin: dict[str, ModuleType],
                                          server: EnvServer) -> None:
    """With await, the adopted client and its package methods are plain coroutines."""
    tally = standin["tally_env"]
    TallyEnv = envlink.adopt(tally.TallyEnv)
    async with TallyEnv(base_url=server.url) as env:
        await env.reset()
        assert await env.shout("x") == "X"
        child = await env.new_session()
        assert type(child) is TallyEnv and child.constructed_by_package is True
        assert (await child.state()).step_count == 0


def test_adopted_mcp_client_lists_and_calls_tools(standin: dict[str, ModuleType]) -> None:
    """An MCPToolClient subclass gets OpenEnv's MCP surface on envlink: production mode
    by default (simulation refused, as OpenEnv does), Tool objects and OpenEnv's hooks."""
    EchoTools = envlink.adopt(standin["echo_tools_env"].EchoToolsEnv)
    assert issubclass(EchoTools, envlink.MCPToolClient)
    env = EchoTools(base_url="http://127.0.0.1:9")
    assert env.mode == "production"
    for name in ("list_tools", "call_tool", "get_tool", "has_tool"):
        assert callable(getattr(env, name))
    with pytest.raises(ValueError, match="production"):
        EchoTools(base_url="http://127.0.0.1:9", mode="simulation")
    mcp = sys.modules["openenv.core.mcp_client"]
    parsed = env._parse_result({"observation": {"tool_name": "t", "result": 3}})
    assert isinstance(parsed.observation, mcp.CallToolObservation)
    tool = env._tool({"name": "echo", "inputSchema": {"type": "object"}})
    assert isinstance(tool, mcp.Tool) and tool.input_schema == {"type": "object"}


@pytest.mark.parametrize("detached_sessions", [False, True],
                         ids=["default", "detached-sessions"])
async def test_adopted_mcp_client_calls_tools_on_envlink_serve_in_every_mode(
        standin: dict[str, ModuleType], detached_sessions: bool) -> None:
    """The reference server offers OpenEnv 0.10's HTTP MCP (tools/list, tools/call over
    POST /mcp) in every mode: an adopted OpenEnv MCP client lists OpenEnv Tool objects
    and calls tools on its own session, unchanged."""
    EchoTools = envlink.adopt(standin["echo_tools_env"].EchoToolsEnv)
    mcp = sys.modules["openenv.core.mcp_client"]
    server = EnvServer(env="echo", detached_sessions=detached_sessions)
    async with server, EchoTools(base_url=server.url) as env:
        await env.reset()
        tools = await env.list_tools()
        assert [t.name for t in tools] == ["echo_message", "echo_with_length"]
        assert all(isinstance(t, mcp.Tool) for t in tools)
        assert await env.call_tool("echo_message", message="hi") == "hi"
        assert await env.call_tool("echo_with_length", message="abc") == {
            "message": "abc", "length": 3}
        with pytest.raises(envlink.McpError, match="Unknown tool"):
            await env.call_tool("nope")


@pytest.mark.parametrize("detached_sessions", [False, True],
                         ids=["default", "detached-sessions"])
async def test_adopted_mcp_client_never_lists_no_tools_for_could_not_ask(
        standin: dict[str, ModuleType], detached_sessions: bool) -> None:
    """list_tools() is never [] for a question that got no tool list: an environment
    without MCP is the server's JSON-RPC error, a plain-protocol server without HTTP MCP
    sessions a FeatureUnavailableError naming the fix, and a server that cannot be
    reached a ConnectError."""
    EchoTools = envlink.adopt(standin["echo_tools_env"].EchoToolsEnv)
    server = EnvServer(env="deterministic", detached_sessions=detached_sessions)
    async with server, EchoTools(base_url=server.url) as env:
        with pytest.raises(envlink.McpError, match="does not support MCP"):
            await env.list_tools()
        assert env._tools_cache is None
    plain = EnvServer(env="echo", extensions=False)
    async with plain, EchoTools(base_url=plain.url) as env:
        with pytest.raises(envlink.FeatureUnavailableError,
                           match=r"HTTP MCP sessions.*--detached-sessions"):
            await env.list_tools()
    dead = EchoTools(base_url=f"http://127.0.0.1:{restartable_port()}",
                     reconnect=ReconnectPolicy(max_attempts=1))
    try:
        with pytest.raises(envlink.ConnectError):
            await dead.list_tools()
    finally:
        await dead.close()


def test_adopted_client_in_a_pool_and_the_trl_adapter(
        standin: dict[str, ModuleType], server_thread: ServerThread) -> None:
    """An adopted class is a client class like any other: EnvPool builds its sessions from
    it, and the TRL adapter steps through it, with the package's models."""
    from envlink.integrations.trl import EnvlinkEnvironment

    tally = standin["tally_env"]
    TallyEnv = envlink.adopt(tally.TallyEnv)
    with envlink.EnvPool(server_thread.url, 2, client=TallyEnv).sync() as pool:
        pool.reset()
        batch = pool.step([tally.TallyAction(message="a"), tally.TallyAction(message="bc")])
        assert [r.observation.echoed_message for r in batch.results()] == ["A", "BC"]

    class Shout(EnvlinkEnvironment):
        client_class = TallyEnv

        def shout(self, message: str) -> str:
            """Shout a message.

            Args:
                message: what to shout.
            """
            return str(self._step(tally.TallyAction(message=message)).observation.echoed_message)

    tool = Shout(base_url=server_thread.url, session_mode="release")
    tool.reset()
    assert tool.shout("trl") == "TRL"
