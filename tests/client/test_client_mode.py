"""mode= and OPENENV_CLIENT_MODE as in OpenEnv 0.10, against the real reference server."""

from __future__ import annotations

import pytest

from envlink import EchoEnv, FeatureUnavailableError, GenericEnvClient, McpError
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


@pytest.mark.parametrize("mode", ["extensions", "detached"])
def test_production_tool_calls_go_over_post_mcp_in_every_mode(mode: str) -> None:
    """In production mode tool calls go as JSON-RPC to POST /mcp, to the client's own
    session (the server's echo counts them: they are not the client's steps), and steps
    stay on the socket: on a server with detached sessions through the one the client
    holds, on a default one through its envlink session's token. A new_session() child
    is in production mode too."""
    with ServerThread(env="echo", detached_sessions=mode == "detached") as st, \
            EchoEnv(base_url=st.url, mode="production") as env:
        env.reset()
        assert env.call_tool("echo_message", message="hi") == "hi"
        assert [t.name for t in env.list_tools(use_cache=False)] == [
            "echo_message", "echo_with_length"]
        with pytest.raises(McpError, match="Unknown tool"):
            env.call_tool("nope")
        # Three tool calls ran on this session's environment, none as a client step.
        assert env.state().step_count == 3
        assert env.journal.step_count == 0
        assert (env._core.detached_id is not None) == (mode == "detached")
        child = env.new_session()
        assert child.async_client.mode == "production"
        if mode == "detached":
            assert child.async_client._core.detached_id not in (None, env._core.detached_id)
    assert env.closed


def test_production_on_a_server_without_http_mcp_sessions_names_the_fix() -> None:
    """A plain OpenEnv-protocol server without detached sessions gives a production-mode
    tool call no session to run on: a FeatureUnavailableError (a RuntimeError, as
    OpenEnv raises) naming what is missing and the fix, never a ConnectError."""
    with ServerThread(env="echo", extensions=False) as st, \
            EchoEnv(base_url=st.url, mode="production") as env:
        env.reset()
        with pytest.raises(FeatureUnavailableError, match="--detached-sessions") as caught:
            env.call_tool("echo_message", message="hi")
        assert isinstance(caught.value, RuntimeError)
        assert "HTTP MCP sessions" in caught.value.feature
