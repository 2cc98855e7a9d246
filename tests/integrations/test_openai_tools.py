"""envlink.integrations.openai_tools: MCP tool lists as OpenAI tool schemas and back."""

from __future__ import annotations

import pytest

from envlink import GenericEnvClient
from envlink.integrations.openai_tools import from_openai_tools, to_openai_tools
from envlink.integrations.openenv_harness import HarnessTool
from envlink.server import ServerThread

pytestmark = pytest.mark.timeout(30)


def test_the_servers_tools_become_openai_tools() -> None:
    """The echo server's listed tools (OpenEnv's list_tools action) convert to function tools
    that round-trip back to the same MCP specifications."""
    with ServerThread(env="echo", ping_interval=None) as st, \
            GenericEnvClient(st.url).sync() as env:
        env.reset()
        listed = env.step({"type": "list_tools"}).observation["tools"]
    tools = to_openai_tools(listed)
    assert [t["function"]["name"] for t in tools] == ["echo_message", "echo_with_length"]
    first = tools[0]
    assert first["type"] == "function"
    assert first["function"]["description"] == "Echo back the provided message."
    assert first["function"]["parameters"]["required"] == ["message"]
    back = from_openai_tools(tools)
    assert [t["inputSchema"] for t in back] == [t["input_schema"] for t in listed]
    assert to_openai_tools(back) == tools


def test_objects_and_mcp_spelling_are_accepted() -> None:
    """OpenEnv's Tool objects (attributes) and MCP's inputSchema spelling both convert; a tool
    without a schema takes no parameters."""
    tools = to_openai_tools([HarnessTool("a", "A", {"type": "object", "properties": {}}),
                             {"name": "b", "inputSchema": {"type": "object"}},
                             {"name": "c"}])
    assert [t["function"]["parameters"] for t in tools] == [
        {"type": "object", "properties": {}}, {"type": "object"},
        {"type": "object", "properties": {}}]


@pytest.mark.parametrize("bad", [[{"description": "no name"}],
                                 [{"name": "x"}, {"name": "x"}],
                                 [{"name": "x", "inputSchema": {"type": "string"}}]])
def test_malformed_tool_lists_are_refused(bad: list[dict[str, object]]) -> None:
    """A nameless tool, a duplicate name or a non-object schema is a clear ValueError."""
    with pytest.raises(ValueError, match="tool"):
        to_openai_tools(bad)


def test_non_function_openai_tools_are_refused() -> None:
    """from_openai_tools refuses tools that are not functions."""
    with pytest.raises(ValueError, match="not a function tool"):
        from_openai_tools([{"type": "web_search", "function": {"name": "x"}}])
