"""MCP tool lists as the tool schemas models are prompted with, and back.

``client.mcp_list_tools()``, an MCP client's ``list_tools()`` (:class:`envlink.Tool`
objects) and OpenEnv's ``list_tools`` step action give MCP tool
specifications: ``name``, ``description`` and a JSON-Schema ``inputSchema`` (OpenEnv
spells it ``input_schema``). Chat templates, OpenAI-style APIs, TRL and verifiers
want OpenAI function tools: ``{"type": "function", "function": {"name", "description",
"parameters"}}``. :func:`to_openai_tools` converts the one to the other;
:func:`from_openai_tools` goes back (for a trainer that hands OpenAI tools to an
MCP server, or to compare the two).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["from_openai_tools", "to_openai_tools"]

_EMPTY_OBJECT: dict[str, Any] = {"type": "object", "properties": {}}


def _field(tool: Any, *names: str) -> Any:
    for name in names:
        if isinstance(tool, Mapping):
            if name in tool:
                return tool[name]
        elif hasattr(tool, name):
            return getattr(tool, name)
    return None


def to_openai_tools(tools: Iterable[Any]) -> list[dict[str, Any]]:
    """OpenAI function-tool schemas for MCP tool specifications.

    Args:
        tools: MCP tools as dicts (``mcp_list_tools()``'s result, OpenEnv's
            ``list_tools`` observation) or objects with ``name``, ``description`` and
            ``input_schema`` / ``inputSchema`` attributes (``envlink.Tool`` from an MCP
            client's ``list_tools()``, OpenEnv's ``Tool``).

    Returns:
        ``[{"type": "function", "function": {"name", "description", "parameters"}}]``,
        in the same order; a tool without an input schema takes no parameters.

    Raises:
        ValueError: a tool without a name, a non-object input schema, or two tools
            with the same name.
    """
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for tool in tools:
        name = _field(tool, "name")
        if not isinstance(name, str) or not name:
            raise ValueError(f"an MCP tool needs a non-empty name, got {name!r}")
        if name in seen:
            raise ValueError(f"two MCP tools are named {name!r}")
        seen.add(name)
        schema = _field(tool, "inputSchema", "input_schema", "parameters")
        if schema is None:
            schema = dict(_EMPTY_OBJECT)
        if not isinstance(schema, Mapping) or schema.get("type", "object") != "object":
            raise ValueError(f"tool {name!r}: the input schema must be a JSON-Schema object")
        function: dict[str, Any] = {"name": name,
                                    "description": str(_field(tool, "description") or ""),
                                    "parameters": {"type": "object", **dict(schema)}}
        out.append({"type": "function", "function": function})
    return out


def from_openai_tools(tools: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """MCP tool specifications (``name``, ``description``, ``inputSchema``) for OpenAI tools.

    Args:
        tools: ``{"type": "function", "function": {...}}`` dicts (or the bare
            ``function`` objects).

    Returns:
        MCP tool dicts, in the same order.

    Raises:
        ValueError: a tool that is not a function tool, or has no name.
    """
    out: list[dict[str, Any]] = []
    for tool in tools:
        if "function" in tool:
            if tool.get("type", "function") != "function":
                raise ValueError(f"not a function tool: type {tool.get('type')!r}")
            function = tool["function"]
        else:
            function = tool
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError(f"an OpenAI tool needs a non-empty name, got {name!r}")
        out.append({"name": name, "description": str(function.get("description") or ""),
                    "inputSchema": dict(function.get("parameters") or _EMPTY_OBJECT)})
    return out
