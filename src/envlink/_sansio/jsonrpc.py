"""MCP's JSON-RPC framing and tool results, as OpenEnv 0.10 sends and answers them. No I/O.

A session's ``mcp_*`` calls carry one JSON-RPC request each: as an ``mcp`` message on the
session's socket, or over ``POST /mcp`` with the session's id in OpenEnv's production
mode (the connector's :meth:`~envlink._client.connector.Connector.post_rpc`). Both are
framed and read back here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from envlink._errors import McpError, ProtocolError, ToolCallError

__all__ = ["rpc_request", "rpc_result", "tool_list", "tool_value"]


def rpc_request(rpc_id: int, method: str, params: Mapping[str, Any] | None) -> dict[str, Any]:
    """The ``data`` of an ``mcp`` message: one JSON-RPC request.

    Raises:
        TypeError: ``method`` is not a non-empty string.
    """
    if not isinstance(method, str) or not method:
        raise TypeError(f"method must be a non-empty str, got {method!r}")
    return {"jsonrpc": "2.0", "id": rpc_id, "method": method, "params": dict(params or {})}


def tool_list(result: Any) -> list[dict[str, Any]]:
    """The tools of a ``tools/list`` result.

    Raises:
        ProtocolError: the result has no list of tool objects.
    """
    tools = result.get("tools") if isinstance(result, dict) else None
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise ProtocolError("tools/list answered without a list of tools")
    return tools


def tool_value(name: str, result: Any) -> Any:
    """The value of a ``tools/call`` result: a FastMCP result's ``data``, as OpenEnv's
    client unwraps it, else the whole result.

    Raises:
        ToolCallError: the result reports the tool's error.
    """
    if isinstance(result, dict):
        if result.get("is_error") or result.get("isError"):
            content = result.get("content")
            text = "; ".join(str(c.get("text")) for c in content
                             if isinstance(c, dict) and c.get("text")) \
                if isinstance(content, list) else ""
            raise ToolCallError(text or f"tool {name!r} failed", "tool_error", tool_name=name)
        if "data" in result:
            return result["data"]
    return result


def rpc_result(answer: dict[str, Any], rpc_id: int | None) -> Any:
    """The ``result`` of a JSON-RPC answer; its error object is :class:`McpError`."""
    if rpc_id is not None and answer.get("id") not in (rpc_id, None):
        raise ProtocolError(f"mcp answer has id {answer.get('id')!r}, expected {rpc_id}")
    error = answer.get("error")
    if isinstance(error, dict):
        code = error.get("code")
        raise McpError(str(error.get("message", "JSON-RPC error")),
                       code if isinstance(code, int) else 0, data=error.get("data"))
    if "result" not in answer:
        raise ProtocolError("mcp answer has neither result nor error")
    return answer["result"]

