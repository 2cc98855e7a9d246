"""OpenEnv 0.10's client surface beyond reset/step/state, as a mixin of the client.

``new_session()``, and the ``mcp`` message type: ``tools/list`` and ``tools/call``
(JSON-RPC) go to the session's own environment around ``step()`` (a tool call is
not a step), through the client's driver, with its deadline, queueing and recovery.
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from envlink._client.dispatch import dispatched
from envlink._config import UNSET, UnsetType
from envlink._errors import ClientClosedError, McpError, ProtocolError, ToolCallError
from envlink._sansio.protocol import McpFrame
from envlink._sansio.session import Call

if TYPE_CHECKING:
    from envlink._client.driver import SessionDriver

__all__ = ["McpMethods"]

_C = TypeVar("_C", bound="McpMethods")


class McpMethods:
    """The ``mcp_*`` methods of the client."""

    _driver: SessionDriver
    _mcp_ids: itertools.count[int]
    _init_kwargs: dict[str, Any]
    _children: list[Any]

    _execution_mode: str | None

    if TYPE_CHECKING:  # provided by EnvClient
        def _seconds(self, timeout: float | UnsetType | None) -> float | None: ...

        @property
        def closed(self) -> bool: ...

        async def connect(self) -> Any: ...

        async def close(self) -> None: ...

    @dispatched
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


    @dispatched
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
        rpc_id = next(self._mcp_ids)
        data = {"jsonrpc": "2.0", "id": rpc_id, "method": method,
                "params": dict(params or {})}
        driver = self._driver

        async def run(call: Call) -> Any:
            async with driver.turn(call):
                frame = driver.expect(await driver.request(call, data), McpFrame, "mcp")
            answer = frame.data
            if answer.get("id") not in (rpc_id, None):
                raise ProtocolError(f"mcp answer has id {answer.get('id')!r}, expected {rpc_id}")
            error = answer.get("error")
            if isinstance(error, dict):
                code = error.get("code")
                raise McpError(str(error.get("message", "JSON-RPC error")),
                               code if isinstance(code, int) else 0, data=error.get("data"))
            if "result" not in answer:
                raise ProtocolError("mcp answer has neither result nor error")
            return answer["result"]

        return await driver.call("mcp", self._seconds(timeout), run)

    @dispatched
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

    @dispatched
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

