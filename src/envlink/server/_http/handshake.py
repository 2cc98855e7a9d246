"""The WebSocket upgrade: ``/health``, refusals, extension negotiation, session resumption.

``process_request`` answers plain HTTP (``/health``, ``POST /mcp``, and the
routes of :mod:`envlink.server._http.routes`: ``/openapi.json``, ``/metadata``,
``/schema``, ``/reset``, ``/step``, ``/state``; 404 or 405 otherwise) and refuses
upgrades by fault injection; ``process_response`` negotiates the envlink extensions on a
successful upgrade and decides the connection's :class:`Plan` (a new session or
a resumed one, and the caller's trace context), which the connection handler
takes over.
"""

from __future__ import annotations

import http
import json
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import parse_qs, urlsplit

from opentelemetry import propagate
from opentelemetry.context import Context
from websockets.asyncio.server import ServerConnection
from websockets.datastructures import Headers
from websockets.http11 import Request, Response

from envlink import __version__
from envlink._config import is_sensitive_name, redact_url
from envlink._sansio.protocol import (
    EXTENSION_HEADER,
    EXTENSION_VERSION,
    RESUME_GRACE_HEADER,
    RESUME_TOKEN_HEADER,
    RESUMED_HEADER,
    SESSION_ID_HEADER,
    SESSION_TOKEN_HEADER,
)
from envlink.server._http.mcp_sessions import json_response, rpc_response
from envlink.server._http.routes import (
    ROUTES,
    HttpReply,
    describe_metadata,
    describe_schema,
    http_reset,
    http_state,
    http_step,
    openapi_document,
    task_api,
)
from envlink.server._store import Session, new_session_id, new_token

if TYPE_CHECKING:
    from envlink.server._counters import AwaitableCounters
    from envlink.server._faults import Faults
    from envlink.server._http.access import Access
    from envlink.server._registry import SessionRegistry

__all__ = ["REDACTING_LOGGER", "Handshake", "Plan", "format_seconds"]


class Served(Protocol):
    """What the upgrade reads of the server it serves (an ``EnvServer``): declared
    here, so that the HTTP layer does not import the server that imports it."""

    max_sessions: int
    access: Access
    extensions: bool
    faults: Faults
    detached_sessions: bool
    _counters: AwaitableCounters
    _registry: SessionRegistry


@dataclass
class Plan:
    """What the upgrade decided, handed from ``process_response`` to the handler."""

    extensions: bool = False
    token: str | None = None
    session: Session | None = None
    resumed: bool | None = None
    trace_context: Context | None = None
    #: Public id of the session the connection will get (advertised for telemetry).
    session_id: str | None = None
    #: ``/ws?session_id=``: the OpenEnv detached session to attach to.
    attach: str | None = None
    #: ``/harness``: a harness stream (RFC 005) instead of the Gym-style protocol.
    harness: bool = False


class Handshake:
    """The upgrade hooks of one server (``process_request`` / ``process_response``)."""

    def __init__(self, server: Served) -> None:
        self._server = server
        self._plans: dict[ServerConnection, Plan] = {}

    def take_plan(self, connection: ServerConnection) -> Plan:
        """The plan of a connection whose handler starts (a plain one if none)."""
        return self._plans.pop(connection, None) or Plan()

    def process_request(self, connection: ServerConnection,
                        request: Request) -> Response | None:
        server = self._server
        path = urlsplit(request.path).path
        if path == "/health":
            body = json.dumps({
                "status": "healthy",
                "sessions": len(server._registry),
                "max_sessions": server.max_sessions,
                "extensions": server.extensions,
                # For tests and operators watching a server in another process.
                "counters": server._counters.snapshot(),
            })
            response = connection.respond(http.HTTPStatus.OK, body)
            del response.headers["Content-Type"]
            response.headers["Content-Type"] = "application/json"
            return response
        refused = server.access.refuse(connection, request)
        if refused is not None:
            server._counters.incr("refused.access")
            return refused
        if path == "/mcp":
            return rpc_response(connection, server._registry, server.max_sessions,
                                server._counters, detached=server.detached_sessions,
                                token=_header(request.headers, RESUME_TOKEN_HEADER))
        if path not in ("/ws", "/harness"):
            return _plain_http(connection, server, path)
        faults = server.faults
        if faults.take_refusal():
            server._counters.incr("refused")
            response = connection.respond(faults.refuse_status, "Refused by fault injection.\n")
            if faults.retry_after is not None:
                response.headers["Retry-After"] = format_seconds(faults.retry_after)
            return response
        if path == "/harness":
            self._plans[connection] = Plan(harness=True)
        return None

    def process_response(self, connection: ServerConnection, request: Request,
                         response: Response) -> None:
        if response.status_code != http.HTTPStatus.SWITCHING_PROTOCOLS:
            self._plans.pop(connection, None)
            return
        if connection in self._plans:  # decided by the path (/harness)
            return
        server = self._server
        registry = server._registry
        plan = Plan(trace_context=propagate.extract(_carrier(request.headers)))
        if server.detached_sessions:
            wanted_ids = parse_qs(urlsplit(request.path).query).get("session_id")
            if wanted_ids:
                # Attaching to a detached session: plain OpenEnv semantics, checked by
                # the handler (which answers SESSION_ERROR as OpenEnv does).
                plan.attach = wanted_ids[0]
                self._plans[connection] = plan
                return
        offered = _header(request.headers, EXTENSION_HEADER) == EXTENSION_VERSION
        if server.extensions and offered:
            plan.extensions = True
            wanted = _header(request.headers, RESUME_TOKEN_HEADER)
            session = registry.by_token(wanted) if wanted else None
            if session is not None and not session.closed:
                previous = registry.claim(session, connection)
                if isinstance(previous, ServerConnection):
                    previous.transport.abort()
                plan.session = session
                plan.token = session.token
                plan.resumed = True
            else:
                plan.token = new_token()
                plan.session_id = new_session_id()
                plan.resumed = False if wanted else None
            assert plan.token is not None
            response.headers[EXTENSION_HEADER] = EXTENSION_VERSION
            response.headers[SESSION_TOKEN_HEADER] = plan.token
            response.headers[SESSION_ID_HEADER] = (
                plan.session.id if plan.session is not None else str(plan.session_id)
            )
            response.headers[RESUME_GRACE_HEADER] = format_seconds(registry.resume_grace)
            if plan.resumed is not None:
                response.headers[RESUMED_HEADER] = "1" if plan.resumed else "0"
        self._plans[connection] = plan
        # If the handshake fails after this point the handler never runs: give
        # back a claimed session then.
        connection.connection_lost_waiter.add_done_callback(
            lambda _f: self._abandon_plan(connection)
        )

    def _abandon_plan(self, connection: ServerConnection) -> None:
        plan = self._plans.pop(connection, None)
        if plan is not None and plan.session is not None:
            self._server._registry.release(connection, plan.session, destroy=False)


def _plain_http(connection: ServerConnection, server: Served, path: str) -> Response:
    """The HTTP routes of :mod:`envlink.server._http.routes` (404 or 405 for the rest)."""
    body = getattr(connection, "rpc_body", None)
    method = "GET" if body is None else "POST"
    factory = server._registry.factory
    if (method, path) not in ROUTES:
        try:
            payload = json.loads(body) if body else None
        except ValueError:
            payload = None
        tasks = task_api(factory, method, path, payload)
        if tasks is not None:
            return json_response(connection, tasks.status, tasks.encode())
        if any(route_path == path for _m, route_path in ROUTES):
            response = connection.respond(http.HTTPStatus.METHOD_NOT_ALLOWED,
                                          "Method Not Allowed\n")
            return response
        return connection.respond(http.HTTPStatus.NOT_FOUND, "Not Found\n")
    if path == "/openapi.json":
        reply = HttpReply(200, openapi_document("envlink reference server"))
    elif path == "/metadata":
        reply = HttpReply(200, describe_metadata(factory, __version__))
    elif path == "/schema":
        reply = HttpReply(200, describe_schema(factory))
    elif path == "/state":
        reply = http_state(factory)
    else:
        try:
            payload = json.loads(body) if body else None
        except ValueError:
            reply = HttpReply(422, {"detail": "the body is not valid JSON"})
        else:
            reply = (http_reset if path == "/reset" else http_step)(factory, payload)
    return json_response(connection, reply.status, reply.encode())


class _RedactingLogger(logging.LoggerAdapter):  # type: ignore[type-arg]
    """The ``websockets.server`` logger, with credentials removed from header debug lines.

    websockets logs every handshake header at DEBUG level as ``("< %s: %s", name, value)``.
    """

    _SECRET = frozenset({"authorization", "proxy-authorization", "cookie", "set-cookie",
                         RESUME_TOKEN_HEADER, SESSION_TOKEN_HEADER})

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        if (len(args) == 2 and isinstance(args[0], str)
                and (args[0].lower() in self._SECRET or is_sensitive_name(args[0]))):
            args = (args[0], "<redacted>")
        else:  # the request line: its query may carry a token or a session id
            args = tuple(redact_url(a) if isinstance(a, str) and a.startswith("/") else a
                         for a in args)
        super().log(level, msg, *args, **kwargs)


REDACTING_LOGGER = _RedactingLogger(logging.getLogger("websockets.server"), {})


def _header(headers: Headers, name: str) -> str | None:
    values = headers.get_all(name)
    return values[0].strip() if values else None


def _carrier(headers: Headers) -> dict[str, str]:
    # Never let Authorization (or any credential) travel further than needed.
    return {k.lower(): v for k, v in headers.raw_items()
            if k.lower() in ("traceparent", "tracestate", "baggage")}


def format_seconds(seconds: float) -> str:
    """Seconds as a header value: ``30`` rather than ``30.0``."""
    return str(int(seconds)) if float(seconds).is_integer() else repr(float(seconds))
