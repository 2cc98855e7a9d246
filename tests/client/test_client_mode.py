"""mode= and OPENENV_CLIENT_MODE as in OpenEnv 0.10, against the real reference server."""

from __future__ import annotations

import pytest

from envlink import ConnectError, EchoEnv, GenericEnvClient, McpError
from envlink.server import ServerThread

pytestmark = pytest.mark.timeout(30)

URL = "http://127.0.0.1:9"


def test_mode_defaults_to_simulation(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without mode= or OPENENV_CLIENT_MODE, the client is in simulation mode."""
    monkeypatch.delenv("OPENENV_CLIENT_MODE", raising=False)
    assert GenericEnvClient(URL).mode == "simulation"


def test_environment_variable_and_argument(monkeypatch: pytest.MonkeyPatch) -> None:
    """OPENENV_CLIENT_MODE sets the default (case-insensitive); mode= takes precedence."""
    monkeypatch.setenv("OPENENV_CLIENT_MODE", "PRODUCTION")
    assert GenericEnvClient(URL).mode == "production"
    assert GenericEnvClient(URL, mode="Simulation").mode == "simulation"


@pytest.mark.parametrize("bad", ["gym", "", 3])
def test_an_unknown_mode_is_refused(bad: object, monkeypatch: pytest.MonkeyPatch) -> None:
    """Anything but simulation/production is a ValueError naming both sources."""
    monkeypatch.delenv("OPENENV_CLIENT_MODE", raising=False)
    with pytest.raises(ValueError, match="OPENENV_CLIENT_MODE"):
        GenericEnvClient(URL, mode=bad)  # type: ignore[arg-type]


def test_mode_is_fixed_after_creation() -> None:
    """As in OpenEnv, the mode cannot be changed on a client."""
    env = GenericEnvClient(URL, mode="production")
    with pytest.raises(AttributeError):
        env.mode = "simulation"  # type: ignore[misc]


def test_production_without_http_sessions_is_a_clear_error(server_thread: ServerThread) -> None:
    """A server without OpenEnv's HTTP MCP sessions gets a ConnectError saying so, not a
    silent fall-back to the socket."""
    with EchoEnv(base_url=server_thread.url, mode="production") as env, \
            pytest.raises(ConnectError, match="production mode needs"):
        env.list_tools()


def test_production_tool_calls_go_over_post_mcp() -> None:
    """In production mode the client holds a detached session and sends tool calls as
    JSON-RPC to POST /mcp (the reference server answers them "method not found" there,
    where over the socket it answers an error frame), while steps stay on the socket; a
    new_session() child is in production mode too."""
    with ServerThread(env="echo", detached_sessions=True) as st, \
            EchoEnv(base_url=st.url, mode="production") as env:
        env.reset()
        with pytest.raises(McpError) as caught:
            env.call_tool("echo_message", message="hi")
        assert caught.value.rpc_code == -32601
        assert env._core.detached_id is not None
        child = env.new_session()
        assert child.async_client.mode == "production"
        assert child.async_client._core.detached_id not in (None, env._core.detached_id)
    assert env.closed
