"""``POST /mcp`` on the WebSocket port: OpenEnv 0.10's HTTP MCP.

``tools/list`` and ``tools/call`` are served in every mode, as OpenEnv's server
serves them: on the session named by ``params.session_id`` (an OpenEnv detached
session), or by the ``envlink-resume`` header (the caller's own envlink session,
named by its secret token), else on a temporary environment. They run the
environment's ``list_tools`` / ``call_tool`` actions outside the episode's steps
(an environment without them answers ``-32603`` "Environment does not support
MCP", as OpenEnv's does), and answer a FastMCP-shaped result (``content``,
``structured_content``, ``data``, ``is_error``); a tool's error is a JSON-RPC error.
The detached-session methods (``openenv/session/create`` and ``close``) are served
with ``detached`` only (``--detached-sessions``).

websockets' HTTP parser serves the opening handshake and refuses a request with a
body before ``process_request`` sees it. :class:`HttpAwareConnection` reads a
``POST /mcp`` itself: it keeps the JSON body on the connection and hands
websockets the same request without a body (as a ``GET``), so that the server's
``process_request`` can answer it like ``/health``. Every other request goes to
websockets untouched.
"""

from __future__ import annotations

import contextlib
import http
import json
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError
from websockets.asyncio.server import ServerConnection
from websockets.http11 import Response

from envlink._errors import ActionRejectedError

if TYPE_CHECKING:
    from envlink.server._counters import AwaitableCounters
    from envlink.server._registry import SessionRegistry

__all__ = ["MAX_RPC_BODY", "HttpAwareConnection", "json_response", "rpc_error", "rpc_response",
           "rpc_result"]

#: Largest JSON-RPC body accepted on ``POST /mcp``.
MAX_RPC_BODY = 1024 * 1024
_MAX_HEAD = 64 * 1024


class HttpAwareConnection(ServerConnection):
    """A websockets server connection that also takes ``POST /mcp`` with a JSON body.

    Attributes:
        rpc_body: the body of a ``POST`` request (``b""`` if empty), ``None`` for a ``GET``.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rpc_body: bytes | None = None
        self._head = bytearray()
        self._sorted = False

    def data_received(self, data: bytes) -> None:
        if self._sorted:
            super().data_received(data)
            return
        self._head.extend(data)
        prefix = bytes(self._head[:5])
        if not b"POST ".startswith(prefix):
            self._pass_on(bytes(self._head))  # not a POST: websockets' own request
            return
        if len(prefix) < 5:
            return
        end = self._head.find(b"\r\n\r\n")
        if end < 0:
            if len(self._head) > _MAX_HEAD:
                self.transport.abort()
            return
        head = bytes(self._head[:end])
        lines = head.split(b"\r\n")
        length = 0
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                try:
                    length = int(value.strip())
                except ValueError:
                    length = -1
        if length < 0 or length > MAX_RPC_BODY:
            self.transport.abort()
            return
        body = bytes(self._head[end + 4:end + 4 + length])
        if len(body) < length:
            return  # wait for the rest of the body
        self.rpc_body = body
        # The same request for websockets, as a GET without a body (it then calls
        # process_request, which answers it; it never becomes a WebSocket).
        request_line = lines[0].replace(b"POST ", b"GET ", 1)
        kept = [line for line in lines[1:] if line.split(b":", 1)[0].strip().lower()
                not in (b"content-length", b"transfer-encoding")]
        self._pass_on(b"\r\n".join([request_line, *kept]) + b"\r\n\r\n")

    def _pass_on(self, data: bytes) -> None:
        self._sorted = True
        self._head = bytearray()
        super().data_received(data)


def rpc_result(request_id: Any, result: Any) -> bytes:
    """A JSON-RPC 2.0 success response."""
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "result": result}).encode()


def rpc_error(request_id: Any, code: int, message: str, data: Any = None) -> bytes:
    """A JSON-RPC 2.0 error response."""
    return json.dumps({"jsonrpc": "2.0", "id": request_id,
                       "error": {"code": code, "message": message, "data": data}}).encode()


def rpc_response(connection: ServerConnection, registry: SessionRegistry, max_sessions: int,
                 counters: AwaitableCounters, *, detached: bool = True,
                 token: str | None = None) -> Response:
    """Answer one ``POST /mcp`` JSON-RPC request (HTTP 200 with a JSON-RPC body, as OpenEnv).

    Without ``detached`` the session methods are unknown (``-32601``, as a server
    without detached sessions answers), so clients fall back to plain sessions; the
    tool methods are served all the same. ``token``: the request's ``envlink-resume``
    header (the tools then run on that session).
    """
    body = getattr(connection, "rpc_body", None)
    if body is None:
        answer = rpc_error(None, -32600, "POST a JSON-RPC 2.0 request to /mcp")
    else:
        try:
            request = json.loads(body)
        except ValueError:
            answer = rpc_error(None, -32700, "Parse error")
        else:
            if not isinstance(request, dict) or request.get("jsonrpc") != "2.0" or (
                    not isinstance(request.get("method"), str)):
                answer = rpc_error(None, -32600, "Invalid Request")
            else:
                params = request.get("params")
                method = request["method"]
                if not detached and method.startswith("openenv/session/"):
                    answer = rpc_error(request.get("id"), -32601, f"Method not found: {method}")
                elif method in ("tools/list", "tools/call"):
                    answer = _tools(registry, request.get("id"), method,
                                    params if isinstance(params, dict) else {}, token)
                    counters.incr(f"rpc.{method}")
                else:
                    answer = _method(registry, max_sessions, request.get("id"), method,
                                     params if isinstance(params, dict) else {})
    counters.incr("rpc")
    return json_response(connection, http.HTTPStatus.OK, answer)


def json_response(connection: ServerConnection, status: int, body: bytes) -> Response:
    """An HTTP response with a JSON body (for ``process_request`` to return)."""
    response = connection.respond(http.HTTPStatus(status), "")
    response.body = body
    del response.headers["Content-Type"]
    del response.headers["Content-Length"]
    response.headers["Content-Type"] = "application/json"
    response.headers["Content-Length"] = str(len(body))
    return response


def _method(registry: SessionRegistry, max_sessions: int, request_id: Any, method: str,
            params: dict[str, Any]) -> bytes:
    if method == "openenv/session/create":
        if len(registry) >= max_sessions:
            return rpc_error(
                request_id, -32000,
                f"Server at capacity: {len(registry)}/{max_sessions} sessions active. "
                "Cannot accept new connections.",
                {"active_sessions": len(registry), "max_sessions": max_sessions})
        try:
            created = registry.create_detached()
        except Exception as exc:
            factory = registry.factory
            return rpc_error(request_id, -32000, str(exc) or type(exc).__name__, {
                "factory_name": getattr(factory, "__name__", type(factory).__name__)})
        return rpc_result(request_id, {"session_id": created.id})
    if method == "openenv/session/close":
        target = params.get("session_id")
        if not isinstance(target, str) or not target:
            return rpc_error(request_id, -32602, "Invalid params - 'session_id' is required")
        closed = registry.close_detached(target)
        if closed is None:
            return rpc_error(request_id, -32602, f"Unknown session_id: {target}")
        if not closed:
            return rpc_result(request_id, {"session_id": target, "closed": False,
                                           "closing": True})
        return rpc_result(request_id, {"session_id": target, "closed": True})
    return rpc_error(request_id, -32601, f"Method not found: {method}")


def _tools(registry: SessionRegistry, request_id: Any, method: str, params: dict[str, Any],
           token: str | None) -> bytes:
    """``tools/list`` / ``tools/call`` on the named session's environment, or a
    temporary one (closed afterwards)."""
    target = params.get("session_id")
    session = None
    if target is not None:
        session = registry.find(target) if isinstance(target, str) else None
        if session is None:
            return rpc_error(request_id, -32602, f"Unknown session_id: {target}")
    elif token is not None:
        session = registry.by_token(token)
        if session is None:
            return rpc_error(request_id, -32602, "Unknown session (envlink-resume token)")
    env = session.env if session is not None else registry.factory()
    try:
        if method == "tools/list":
            listed = _tool_step(env, {"type": "list_tools"}).get("tools")
            if not isinstance(listed, list):
                return rpc_error(request_id, -32603, "Environment does not support MCP")
            return rpc_result(request_id, {"tools": listed})
        name = params.get("name")
        if not isinstance(name, str) or not name:
            return rpc_error(request_id, -32602, "Missing 'name' in params")
        arguments = params.get("arguments", {})
        answer = _tool_step(env, {"type": "call_tool", "tool_name": name,
                                  "arguments": arguments if isinstance(arguments, dict)
                                  else {}})
        if "tool_name" not in answer:
            return rpc_error(request_id, -32603, "Environment does not support MCP")
        error = answer.get("error")
        if isinstance(error, dict):
            return rpc_error(request_id, -32603, str(error.get("message", "tool failed")),
                             {"error_type": error.get("error_type")})
        value = answer.get("result")
        text = value if isinstance(value, str) else json.dumps(value)
        return rpc_result(request_id, {
            "content": [{"type": "text", "text": text}],
            "structured_content": {"result": value}, "data": value, "is_error": False})
    except _NoTools:
        return rpc_error(request_id, -32603, "Environment does not support MCP")
    except Exception as exc:
        return rpc_error(request_id, -32603, str(exc) or type(exc).__name__)
    finally:
        if session is None:
            close = getattr(env, "close", None)
            if callable(close):
                with contextlib.suppress(Exception):
                    close()


class _NoTools(Exception):
    """The environment refused the MCP-style action: it has no tools."""


def _tool_step(env: Any, action: dict[str, Any]) -> dict[str, Any]:
    try:
        result = env.step(action)
    except (ActionRejectedError, ValidationError) as exc:
        raise _NoTools from exc
    observation = result.observation
    return dict(observation) if isinstance(observation, dict) else {}
