"""MCP on a session: JSON-RPC framing, tool results, and ``POST /mcp`` in production mode.

The client's ``mcp_*`` methods send ``tools/list`` and ``tools/call`` as ``mcp``
messages on the session's socket, to the session's own environment around
``step()`` (a tool call is not a step), through its driver, with its deadline,
queueing and recovery. In OpenEnv 0.10's production mode they go over
``POST /mcp`` with the session's id instead (:func:`post_rpc`).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from envlink._errors import (
    ConnectError,
    ConnectionLostError,
    McpError,
    OutcomeUnknownError,
    ProtocolError,
    ToolCallError,
)

if TYPE_CHECKING:
    from envlink._client.driver import SessionDriver

__all__ = ["CLIENT_MODES", "client_mode", "post_rpc", "rpc_request", "rpc_result", "tool_list",
           "tool_value"]

#: OpenEnv 0.10's communication modes: Gym-style calls on the WebSocket, or
#: "production", where MCP tool calls go over ``POST /mcp`` with the session's id.
CLIENT_MODES = ("simulation", "production")
_METHOD_NOT_SENT = ("tools/list",)


def client_mode(mode: str | None, default: str | None = None) -> str:
    """``mode=``, else the client class's ``default`` (``"production"`` for MCP clients,
    which, as OpenEnv's, do not read the variable), else ``OPENENV_CLIENT_MODE``, else
    ``"simulation"`` (case-insensitive).

    Raises:
        ValueError: not ``simulation`` or ``production``.
    """
    if mode is None and default is not None:
        mode = default
    raw = os.environ.get("OPENENV_CLIENT_MODE", "simulation") if mode is None else mode
    if not isinstance(raw, str) or raw.lower() not in CLIENT_MODES:
        raise ValueError(f"mode must be 'simulation' or 'production' (the mode= argument "
                         f"or OPENENV_CLIENT_MODE), got {raw!r}")
    return raw.lower()

def rpc_request(rpc_id: int, method: str, params: Mapping[str, Any] | None) -> dict[str, Any]:
    """The ``data`` of an ``mcp`` message: one JSON-RPC request.

    Raises:
        TypeError: ``method`` is not a non-empty string.
    """
    if not isinstance(method, str) or not method:
        raise TypeError(f"method must be a non-empty str, got {method!r}")
    return {"jsonrpc": "2.0", "id": rpc_id, "method": method, "params": dict(params or {})}


async def post_rpc(driver: SessionDriver, method: str, params: dict[str, Any]) -> Any:
    """A JSON-RPC request over ``POST /mcp`` with the session's id (production mode).

    Runs inside the caller's turn, under its deadline. A request that never left is
    retried under the reconnect policy; once ``tools/call`` may have been sent it is
    never resent.

    Raises:
        ConnectError: the server offers no HTTP MCP sessions, or cannot be reached.
        OutcomeUnknownError: the connection was lost after the request was sent.
        McpError, ProtocolError: the answer is an error, or not JSON-RPC.
    """
    connector = driver.connector
    if not connector.is_open:
        await connector.open_session("mcp", reason="connect")
    session_id = driver.core.detached_id
    if session_id is None:
        raise ConnectError(
            f"production mode needs the server's OpenEnv 0.10 HTTP MCP sessions "
            f"({connector.endpoint.mcp_url}); this server offers none", retryable=False)
    policy = driver.core.policy
    for attempt in range(1, policy.max_attempts + 1):
        try:
            answer = await connector.rpc(method, {**params, "session_id": session_id}, None)
        except ConnectError:
            if attempt == policy.max_attempts:
                raise
        except ConnectionLostError as exc:
            if method not in _METHOD_NOT_SENT or attempt == policy.max_attempts:
                raise OutcomeUnknownError(
                    f"the connection was lost after {method} was sent; the "
                    "server may or may not have run it") from exc
        else:
            if answer is None or not isinstance(answer.body, dict):
                raise ProtocolError(f"POST /mcp answered {method} without JSON-RPC")
            # The connector numbers its own POSTs, one answer per request.
            return rpc_result(answer.body, None)
        await asyncio.sleep(policy.delay(attempt))
    raise AssertionError("unreachable")  # pragma: no cover


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
