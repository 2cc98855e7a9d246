"""OpenEnv 0.10's client surface beyond reset/step/state, as a mixin of the client.

``new_session()``, and the ``mcp`` message type: ``tools/list`` and ``tools/call``
(JSON-RPC) go to the session's own environment around ``step()`` (a tool call is
not a step), through the client's driver, with its deadline, queueing and recovery.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from envlink._config import UNSET, UnsetType
from envlink._errors import (
    ClientClosedError,
    ConnectError,
    ConnectionLostError,
    McpError,
    OutcomeUnknownError,
    ProtocolError,
    ToolCallError,
)
from envlink._sansio.protocol import McpFrame
from envlink._sansio.session import Call

if TYPE_CHECKING:
    from envlink._client.driver import SessionDriver

__all__ = ["CLIENT_MODES", "McpMethods", "client_mode"]

#: OpenEnv 0.10's communication modes: Gym-style calls on the WebSocket, or
#: "production", where MCP tool calls go over ``POST /mcp`` with the session's id.
CLIENT_MODES = ("simulation", "production")
_METHOD_NOT_SENT = ("tools/list",)


def client_mode(mode: str | None) -> str:
    """``mode=``, else ``OPENENV_CLIENT_MODE``, else ``"simulation"`` (case-insensitive).

    Raises:
        ValueError: not ``simulation`` or ``production``.
    """
    raw = os.environ.get("OPENENV_CLIENT_MODE", "simulation") if mode is None else mode
    if not isinstance(raw, str) or raw.lower() not in CLIENT_MODES:
        raise ValueError(f"mode must be 'simulation' or 'production' (the mode= argument "
                         f"or OPENENV_CLIENT_MODE), got {raw!r}")
    return raw.lower()

_C = TypeVar("_C", bound="McpMethods")


class McpMethods:
    """The ``mcp_*`` methods of the client."""

    _driver: SessionDriver
    _mcp_ids: itertools.count[int]
    _init_kwargs: dict[str, Any]
    _children: list[Any]

    _execution_mode: str | None
    _mode: str

    if TYPE_CHECKING:  # provided by EnvClient
        def _seconds(self, timeout: float | UnsetType | None) -> float | None: ...

        @property
        def closed(self) -> bool: ...

        @property
        def connected(self) -> bool: ...

        async def connect(self) -> Any: ...

        async def close(self) -> None: ...

    @property
    def mode(self) -> str:
        """``"simulation"`` or ``"production"`` (OpenEnv's ``mode=``); fixed at creation."""
        return self._mode

    async def new_session(self: _C) -> _C:
        """Open another session on the same server, as OpenEnv's ``new_session()`` does.

        The child is a connected client of the same class with the same options (and
        its own episode); :meth:`close` closes it with this client.

        Raises:
            ConnectError, CapacityReachedError, ClientClosedError: as :meth:`connect`.
        """
        if self.closed:
            raise ClientClosedError("the client is closed")
        signature = inspect.signature(type(self))
        takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD
                        for p in signature.parameters.values())
        kwargs = {k: v for k, v in self._init_kwargs.items()
                  if takes_any or k in signature.parameters}
        child = type(self)(**kwargs)
        try:
            await child.connect()
        except BaseException:
            await child.close()
            raise
        self._children.append(child)
        return child


    async def mcp_request(self, method: str, params: Mapping[str, Any] | None = None, *,
                          timeout: float | UnsetType | None = UNSET) -> Any:
        """Send one JSON-RPC request as an ``mcp`` message on the session's socket.

        OpenEnv 0.10 answers ``tools/list`` and ``tools/call`` this way, on the
        session's own environment, around ``step()`` (a tool call is not a step).

        Returns:
            the JSON-RPC ``result``.

        Raises:
            McpError: the server answered with a JSON-RPC error object (``rpc_code``).
            ServerError: the server does not know the ``mcp`` message type (an error
                frame, e.g. ``UNKNOWN_TYPE``).
            OutcomeUnknownError: the connection was lost after a ``tools/call`` was
                sent (it is never resent); ``tools/list`` is resent.
            CallTimeoutError, ProtocolError, SessionLostError, ClientClosedError.
        """
        if not isinstance(method, str) or not method:
            raise TypeError(f"method must be a non-empty str, got {method!r}")
        if self._mode == "production":
            return await self._production_request(method, dict(params or {}), timeout)
        rpc_id = next(self._mcp_ids)
        data = {"jsonrpc": "2.0", "id": rpc_id, "method": method,
                "params": dict(params or {})}
        driver = self._driver

        async def run(call: Call) -> Any:
            async with driver.turn(call):
                frame = driver.expect(await driver.request(call, data), McpFrame, "mcp")
            return _rpc_result(frame.data, rpc_id)

        return await driver.call("mcp", self._seconds(timeout), run)

    async def _production_request(self, method: str, params: dict[str, Any],
                                  timeout: float | UnsetType | None) -> Any:
        """``mcp_request`` in production mode: ``POST /mcp`` with the session's id, in the
        session's turn, under the call's deadline; a request that never left is retried
        under the reconnect policy, ``tools/call`` is never resent once it may have."""
        driver = self._driver
        connector = driver.connector

        async def run(call: Call) -> Any:
            async with driver.turn(call):
                if not self.connected:
                    await connector.open_session("mcp", reason="connect")
                session_id = driver.core.detached_id
                if session_id is None:
                    raise ConnectError(
                        f"production mode needs the server's OpenEnv 0.10 HTTP MCP sessions "
                        f"({connector.endpoint.mcp_url}); this server offers none", retryable=False)
                policy = driver.core.policy
                for attempt in range(1, policy.max_attempts + 1):
                    try:
                        answer = await connector.rpc(
                            method, {**params, "session_id": session_id}, None)
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
                        return _rpc_result(answer.body, None)
                    await asyncio.sleep(policy.delay(attempt))
                raise AssertionError("unreachable")  # pragma: no cover

        return await driver.call("mcp", self._seconds(timeout), run)

    async def mcp_list_tools(self, *, timeout: float | UnsetType | None = UNSET
                             ) -> list[dict[str, Any]]:
        """The environment's tools (``tools/list`` as an ``mcp`` message): name,
        description and input schema of each.

        Raises:
            McpError, ProtocolError and the errors of :meth:`mcp_request`.
        """
        result = await self.mcp_request("tools/list", timeout=timeout)
        tools = result.get("tools") if isinstance(result, dict) else None
        if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
            raise ProtocolError("tools/list answered without a list of tools")
        return tools

    async def mcp_call_tool(self, name: str, arguments: Mapping[str, Any] | None = None, *,
                            timeout: float | UnsetType | None = UNSET, **kwargs: Any) -> Any:
        """Call a tool (``tools/call`` as an ``mcp`` message) and return its value.

        Args:
            name: the tool.
            arguments: its arguments (or pass them as keyword arguments).
            timeout: this call's deadline.

        Returns:
            the tool's value (the ``data`` of a FastMCP result, as OpenEnv's client
            unwraps it), else the whole result.

        Raises:
            ToolCallError: the tool reported an error.
            McpError: unknown tool, bad arguments, an environment without MCP...
            OutcomeUnknownError: the connection was lost after the call was sent.
        """
        args = {**dict(arguments or {}), **kwargs}
        result = await self.mcp_request("tools/call", {"name": name, "arguments": args},
                                        timeout=timeout)
        if isinstance(result, dict):
            if result.get("is_error") or result.get("isError"):
                content = result.get("content")
                text = "; ".join(str(c.get("text")) for c in content
                                 if isinstance(c, dict) and c.get("text")) \
                    if isinstance(content, list) else ""
                raise ToolCallError(text or f"tool {name!r} failed", "tool_error",
                                    tool_name=name)
            if "data" in result:
                return result["data"]
        return result



def _rpc_result(answer: dict[str, Any], rpc_id: int | None) -> Any:
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
