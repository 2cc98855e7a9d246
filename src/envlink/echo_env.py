"""A typed client for the echo environment (OpenEnv's echo example), with its MCP actions.

``from envlink.echo_env import CallToolAction, EchoEnv`` as OpenEnv's ``from echo_env import
CallToolAction, EchoEnv``; the actions are the MCP ones (also ``envlink.CallToolAction``).
"""

from __future__ import annotations

from typing import Any, ClassVar

from envlink._openenv.mcp_client import (
    CallToolAction,
    ListToolsAction,
    MCPObservation,
    MCPToolClient,
)

__all__ = ["CallToolAction", "EchoEnv", "EchoObservation", "ListToolsAction"]


class EchoObservation(MCPObservation):
    """An echo-environment observation.

    Known fields are typed (``tools`` are :class:`~envlink.Tool` objects, ``error``
    a :class:`~envlink.ToolError`); whatever else the server sends is kept and
    readable as an attribute or by key (``obs.echoed_message``, ``obs["echoed_message"]``).
    """

    echoed_message: str | None = None


EchoAction = CallToolAction | ListToolsAction | dict[str, Any]


class EchoEnv(MCPToolClient[EchoObservation]):
    """Client for the echo environment: tools ``echo_message`` and ``echo_with_length``.

    An :class:`~envlink.MCPToolClient`, as OpenEnv's ``EchoEnv``: in production mode
    (the default) on a server with HTTP MCP sessions, ``call_tool`` is not a step.

    Example::

        with EchoEnv(base_url="http://127.0.0.1:8000") as env:
            env.reset()
            print([tool.name for tool in env.list_tools()])
            assert env.call_tool("echo_message", message="Hello, World!") == "Hello, World!"
            result = env.step(CallToolAction(tool_name="echo_message",
                                             arguments={"message": "Hello, World!"}))
            assert result.observation.result == "Hello, World!"

    ``state()`` returns a :class:`~envlink.State`.
    """

    _observation_type: ClassVar[type[MCPObservation]] = EchoObservation
