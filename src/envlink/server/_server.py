"""The reference OpenEnv-compatible environment server, on the ``websockets`` asyncio server.

Wire behaviour follows OpenEnv's ``/ws`` endpoint: one environment per connection,
JSON text frames, the same answers and error codes (invalid JSON and unknown types
are answered and the session continues; a frame that is JSON but not an object,
or a binary frame, ends the session with ``SESSION_ERROR``; extra envelope fields
are a ``VALIDATION_ERROR``; at capacity the server sends ``CAPACITY_REACHED`` as
soon as the connection opens, then closes it).

On top of that, and only when negotiated, the envlink extensions: request ids with
de-duplication, per-message trace context, and session resumption (optionally
persisted to disk). Fault injection hooks make it a test double for the client.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import http
import json
import logging
import os
import ssl as ssl_module
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import parse_qs, urlsplit

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, TracerProvider
from pydantic import ValidationError
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from envlink import __version__
from envlink._errors import ErrorCode, ProtocolError
from envlink._protocol import (
    EXTENSION_HEADER,
    EXTENSION_VERSION,
    RESUME_GRACE_HEADER,
    RESUME_TOKEN_HEADER,
    RESUMED_HEADER,
    SESSION_ID_HEADER,
    SESSION_TOKEN_HEADER,
    CloseRequest,
    ResetRequest,
    StateRequest,
    StepRequest,
    decode_request,
    encode_response,
)
from envlink._telemetry import (
    ATTR_ERROR_TYPE,
    ATTR_RPC_METHOD,
    ATTR_RPC_SYSTEM,
    ATTR_SESSION_ID,
    RPC_SYSTEM,
)
from envlink.server._connection import ConnectionHandle
from envlink.server._counters import AwaitableCounters
from envlink.server._deterministic import DeterministicEnvironment
from envlink.server._echo import EchoEnvironment
from envlink.server._environment import (
    EnvironmentFactory,
    InvalidActionError,
    StepResult,
    accepted_kwargs,
)
from envlink.server._faults import Faults, corrupt_frame
from envlink.server._mcp_http import HttpAwareConnection, rpc_error, rpc_result
from envlink.server._session import (
    Session,
    SessionInfo,
    SessionStore,
    new_session_id,
    new_token,
)

__all__ = ["DEFAULT_MAX_MESSAGE_SIZE", "ENVIRONMENTS", "EnvServer"]

_log = logging.getLogger("envlink.server")

#: The built-in environments, by the name ``EnvServer(env=...)`` accepts.
ENVIRONMENTS: Mapping[str, EnvironmentFactory] = {
    "echo": EchoEnvironment,
    "deterministic": DeterministicEnvironment,
}
#: OpenEnv's server (uvicorn) accepts WebSocket messages up to 16 MiB.
DEFAULT_MAX_MESSAGE_SIZE = 16 * 1024 * 1024

_KEEP_HANDLES = 1024
_METHODS = frozenset({"reset", "step", "state", "close"})
_EXTENSION_FIELDS = ("id", "traceparent", "tracestate")
_Request = ResetRequest | StepRequest | StateRequest | CloseRequest


class _Outcome(enum.Enum):
    CONTINUE = "continue"
    CLOSE = "close"  # the client asked to close: destroy the session
    END = "end"  # the server ends the session (SESSION_ERROR)
    LOST = "lost"  # the connection is gone (dropped, aborted, closed by peer)


@dataclass
class _Plan:
    """What the upgrade decided, handed from ``process_response`` to the handler."""

    extensions: bool = False
    token: str | None = None
    session: Session | None = None
    resumed: bool | None = None
    trace_context: Context | None = None
    #: Public id of the session the connection will get (advertised for telemetry).
    session_id: str | None = None
    #: ``/ws?session_id=``: the detached session to attach to (OpenEnv 0.10).
    attach: str | None = None


@dataclass
class _Frame:
    """A received frame, classified."""

    kind: str  # "reset" | "step" | "state" | "close" | "invalid"
    request: _Request | None = None
    request_id: str | None = None
    error: dict[str, Any] | None = None
    fatal: bool = False


class EnvServer:
    """An OpenEnv-compatible environment server with envlink extensions and fault injection.

    Use it as an async context manager (``async with EnvServer() as server``) or call
    :meth:`start` and :meth:`stop`. Every method must be called on the server's loop.

    Args:
        env: ``"echo"``, ``"deterministic"``, or a zero-argument factory returning an
            :class:`~envlink.server.Environment`; called once per session.
        host: address to listen on (loopback by default).
        port: port to listen on; ``0`` picks a free one (kept across :meth:`restart`).
        max_sessions: sessions allowed at once (detached ones included); beyond it a
            new connection gets a ``CAPACITY_REACHED`` error frame and is closed.
        max_message_size: largest incoming message in bytes (bigger: close 1009).
        extensions: offer the envlink extensions to clients that ask for them.
        resume_grace: seconds a detached extension session is kept for resumption.
        session_store: directory where extension sessions are persisted, so that a
            restarted process can resume them; ``None`` keeps them in memory only.
        faults: server-wide faults (a fresh :class:`Faults` if ``None``).
        tracer_provider: OpenTelemetry tracer provider (the global one if ``None``).
        ping_interval: seconds between keepalive pings, ``None`` to disable.
        ping_timeout: seconds to wait for a pong before closing.
        close_timeout: seconds to wait for the client's close frame.
        ssl: an ``ssl.SSLContext`` to serve ``wss://`` (and ``https://`` health).
        detached_sessions: offer OpenEnv 0.10's detached sessions on the same port:
            ``POST /mcp`` ``openenv/session/create`` / ``openenv/session/close``, and
            ``/ws?session_id=`` to attach (``SESSION_ERROR`` for an unknown or already
            attached session). A detached session outlives its sockets until closed.
    """

    def __init__(
        self,
        env: str | EnvironmentFactory = "echo",
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        max_sessions: int = 64,
        max_message_size: int | None = DEFAULT_MAX_MESSAGE_SIZE,
        extensions: bool = True,
        resume_grace: float = 30.0,
        session_store: str | os.PathLike[str] | None = None,
        faults: Faults | None = None,
        tracer_provider: TracerProvider | None = None,
        ping_interval: float | None = 20.0,
        ping_timeout: float | None = 20.0,
        close_timeout: float = 5.0,
        ssl: ssl_module.SSLContext | None = None,
        detached_sessions: bool = False,
    ) -> None:
        if isinstance(env, str):
            try:
                factory = ENVIRONMENTS[env]
            except KeyError:
                raise ValueError(
                    f"unknown environment {env!r}; expected one of {sorted(ENVIRONMENTS)}"
                ) from None
        else:
            factory = env
        if max_sessions < 1:
            raise ValueError("max_sessions must be at least 1")
        if resume_grace < 0:
            raise ValueError("resume_grace must not be negative")
        self._factory: EnvironmentFactory = factory
        self.host = host
        self.port = port
        self.max_sessions = max_sessions
        self.max_message_size = max_message_size
        self.extensions = extensions
        self.resume_grace = resume_grace
        self.faults = faults if faults is not None else Faults()
        self._store = SessionStore(session_store) if session_store is not None else None
        self._tracer = trace.get_tracer(
            "envlink.server", __version__, tracer_provider=tracer_provider
        )
        self._ping_interval = ping_interval
        self._ping_timeout = ping_timeout
        self._close_timeout = close_timeout
        self._ssl = ssl
        self.detached_sessions = detached_sessions

        self._ws: Server | None = None
        self._started = False
        self._sessions: dict[str, Session] = {}
        self._by_token: dict[str, Session] = {}
        self._plans: dict[ServerConnection, _Plan] = {}
        self._handles: dict[ServerConnection, ConnectionHandle] = {}
        self._opened: dict[int, ConnectionHandle] = {}  # by sequence number
        self._seq = 0
        self._counters = AwaitableCounters()

    # ------------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> EnvServer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    async def start(self) -> None:
        """Load persisted sessions (if a store is set) and start listening.

        Raises:
            RuntimeError: the server is already started.
            OSError: the address cannot be bound.
        """
        if self._started:
            raise RuntimeError("the server is already started")
        if self._store is not None:
            self._load_sessions(self._store)
        await self._listen()
        self._started = True

    async def restart(self) -> None:
        """Close the listener and abort every connection, then listen again on the same port.

        Plain sessions die with their connections; extension sessions are detached
        and stay resumable (in memory) for their grace window.
        """
        if not self._started:
            raise RuntimeError("the server is not started")
        await self._close_listener(abort=True)
        await self._listen()
        self._counters.incr("restart")

    async def stop(self) -> None:
        """Stop listening and close every connection (idempotent).

        Extension sessions persisted in a session store stay on disk, so a new
        server on the same store can resume them.
        """
        if not self._started:
            return
        self._started = False
        await self._close_listener(abort=False)
        for session in list(self._sessions.values()):
            if session.timer is not None:
                session.timer.cancel()
                session.timer = None
            with contextlib.suppress(Exception):
                close = getattr(session.env, "close", None)
                if callable(close):
                    close()
        self._sessions.clear()
        self._by_token.clear()

    async def _listen(self) -> None:
        self._ws = await serve(
            self._handle,
            self.host,
            self.port,
            process_request=self._process_request,
            process_response=self._process_response,
            max_size=self.max_message_size,
            ping_interval=self._ping_interval,
            ping_timeout=self._ping_timeout,
            close_timeout=self._close_timeout,
            logger=_REDACTING_LOGGER,
            ssl=self._ssl,
            create_connection=HttpAwareConnection if self.detached_sessions else None,
        )
        if self.port == 0:
            self.port = int(self._ws.sockets[0].getsockname()[1])

    async def _close_listener(self, *, abort: bool) -> None:
        ws, self._ws = self._ws, None
        if ws is None:
            return
        for handle in list(self._handles.values()):
            if abort or handle.stalled:
                handle.abort()
        if abort:
            for connection in list(ws.connections):
                connection.transport.abort()
        ws.close(close_connections=not abort)
        try:
            await asyncio.wait_for(ws.wait_closed(), timeout=self._close_timeout + 1.0)
        except asyncio.TimeoutError:
            for connection in list(ws.connections):
                connection.transport.abort()
            for handle in list(self._handles.values()):
                handle.abort()
            await ws.wait_closed()

    # ------------------------------------------------------------------ addresses

    @property
    def url(self) -> str:
        """The server's base URL, ``ws://HOST:PORT`` (the endpoint is ``url + "/ws"``).

        ``wss://`` when the server has TLS.
        """
        return f"{'wss' if self._ssl else 'ws'}://{self._netloc}"

    @property
    def ws_url(self) -> str:
        """The WebSocket endpoint, ``ws://HOST:PORT/ws``."""
        return f"{self.url}/ws"

    @property
    def http_url(self) -> str:
        """``http://HOST:PORT`` (``/health`` lives there); ``https://`` with TLS."""
        return f"{'https' if self._ssl else 'http'}://{self._netloc}"

    @property
    def _netloc(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    # ------------------------------------------------------------ observation hooks

    @property
    def steps_applied(self) -> int:
        """Steps applied server-wide (successful ``step`` requests, not de-duplicated ones)."""
        return self._counters.get("applied.step")

    @property
    def connections_opened(self) -> int:
        """WebSocket connections accepted so far."""
        return self._counters.get("connection.opened")

    @property
    def connections_closed(self) -> int:
        """WebSocket connections whose handler has finished."""
        return self._counters.get("connection.closed")

    @property
    def active_connections(self) -> int:
        """Connections currently open."""
        return len(self._handles)

    @property
    def resumes(self) -> int:
        """Connections that re-attached to a detached session."""
        return self._counters.get("resume")

    @property
    def dedup_hits(self) -> int:
        """Requests answered from the de-duplication cache instead of being re-applied."""
        return self._counters.get("dedup")

    @property
    def connections(self) -> list[ConnectionHandle]:
        """Handles of the connections currently open, oldest first."""
        return list(self._handles.values())

    def counter(self, name: str) -> int:
        """Any counter :meth:`wait_for` accepts."""
        return self._counters.get(name)

    def sessions(self) -> list[SessionInfo]:
        """Every live session (attached or detached)."""
        now = time.time()
        return [s.info(now) for s in self._sessions.values()]

    def session(self, session_id: str) -> SessionInfo:
        """The session with this public id.

        Raises:
            KeyError: no such live session.
        """
        return self._sessions[session_id].info(time.time())

    def session_step_counts(self) -> dict[str, int]:
        """Steps applied per live session, by public session id."""
        return {s.id: s.step_count for s in self._sessions.values()}

    def add_counter_listener(self, listener: Callable[[str, int], None]) -> None:
        """Call ``listener(name, value)`` on the server loop whenever a counter changes.

        ``envlink serve --events`` uses it to announce events on stdout, so that tests
        driving a server in another process can wait for them without polling.
        """
        self._counters.listeners.append(listener)

    async def wait_for(self, name: str, count: int = 1) -> None:
        """Return once the counter ``name`` has reached ``count``.

        Counters: ``request`` (every frame) and ``request.<kind>`` with kind ``reset``,
        ``step``, ``state``, ``close`` or ``invalid`` (counted on arrival, before any
        fault); ``applied.<method>`` (applied successfully); ``connection.opened``,
        ``connection.closed``; ``session.created``, ``session.destroyed``,
        ``session.detached``, ``session.expired``; ``resume``; ``dedup``;
        ``stall``; ``drop``; ``refused``; ``restart``.
        """
        await self._counters.wait(name, count)

    async def wait_for_request(self, kind: str | None = None, count: int = 1) -> None:
        """Return when the ``count``-th request of ``kind`` (any if ``None``) has arrived."""
        await self._counters.wait("request" if kind is None else f"request.{kind}", count)

    async def wait_for_connection(self, count: int = 1) -> ConnectionHandle:
        """Return the ``count``-th connection (1-based) once it is open.

        Raises:
            LookupError: that connection is closed and no longer remembered (the
                server keeps the handles of the last 1024 connections).
        """
        await self._counters.wait("connection.opened", count)
        try:
            return self._opened[count]
        except KeyError:
            raise LookupError(f"connection {count} closed long ago and was forgotten") from None

    async def wait_for_disconnect(self, count: int = 1) -> None:
        """Return when ``count`` connections have closed."""
        await self._counters.wait("connection.closed", count)

    def stall_all(self) -> None:
        """Stall every open connection (see :meth:`ConnectionHandle.stall`)."""
        for handle in self._handles.values():
            handle.stall()

    def unstall_all(self) -> None:
        """Undo :meth:`stall_all` (and any other stall)."""
        for handle in self._handles.values():
            handle.unstall()

    # ------------------------------------------------------------------ handshake

    def _process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        path = urlsplit(request.path).path
        if path == "/health":
            body = json.dumps({
                "status": "healthy",
                "sessions": len(self._sessions),
                "max_sessions": self.max_sessions,
                "extensions": self.extensions,
                # For tests and operators watching a server in another process.
                "counters": self._counters.snapshot(),
            })
            response = connection.respond(http.HTTPStatus.OK, body)
            del response.headers["Content-Type"]
            response.headers["Content-Type"] = "application/json"
            return response
        if path == "/mcp" and self.detached_sessions:
            return self._rpc(connection)
        if path != "/ws":
            return connection.respond(http.HTTPStatus.NOT_FOUND, "Not Found\n")
        if self.faults.take_refusal():
            self._counters.incr("refused")
            status = self.faults.refuse_status
            response = connection.respond(status, "Refused by fault injection.\n")
            if self.faults.retry_after is not None:
                response.headers["Retry-After"] = _format_seconds(self.faults.retry_after)
            return response
        return None

    def _process_response(self, connection: ServerConnection, request: Request,
                          response: Response) -> None:
        if response.status_code != http.HTTPStatus.SWITCHING_PROTOCOLS:
            return
        plan = _Plan(trace_context=propagate.extract(_carrier(request.headers)))
        if self.detached_sessions:
            wanted_ids = parse_qs(urlsplit(request.path).query).get("session_id")
            if wanted_ids:
                # Attaching to a detached session: plain OpenEnv semantics (checked by
                # the handler, which answers SESSION_ERROR as OpenEnv does).
                plan.attach = wanted_ids[0]
                self._plans[connection] = plan
                return
        offered = _header(request.headers, EXTENSION_HEADER) == EXTENSION_VERSION
        if self.extensions and offered:
            plan.extensions = True
            wanted = _header(request.headers, RESUME_TOKEN_HEADER)
            session = self._by_token.get(wanted) if wanted else None
            if session is not None and not session.closed:
                self._claim(session, connection)
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
            response.headers[RESUME_GRACE_HEADER] = _format_seconds(self.resume_grace)
            if plan.resumed is not None:
                response.headers[RESUMED_HEADER] = "1" if plan.resumed else "0"
        self._plans[connection] = plan
        # If the handshake fails after this point the handler never runs: give
        # back a claimed session then.
        connection.connection_lost_waiter.add_done_callback(
            lambda _f: self._abandon_plan(connection)
        )

    def _claim(self, session: Session, connection: ServerConnection) -> None:
        """Attach ``session`` to ``connection``, taking it over from a previous one."""
        if session.timer is not None:
            session.timer.cancel()
            session.timer = None
        session.expires_at = None
        previous = session.connection
        session.connection = connection
        if isinstance(previous, ServerConnection):
            previous.transport.abort()

    def _abandon_plan(self, connection: ServerConnection) -> None:
        plan = self._plans.pop(connection, None)
        if plan is not None and plan.session is not None:
            self._release(connection, plan.session, destroy=False)

    # ------------------------------------------------------------------ sessions

    def _new_session(self, plan: _Plan, connection: ServerConnection) -> Session:
        env = self._factory()
        session = Session(
            id=plan.session_id or new_session_id(), env=env, extensions=plan.extensions,
            token=plan.token,
            connection=connection,
        )
        self._sessions[session.id] = session
        if session.token is not None:
            self._by_token[session.token] = session
        self._counters.incr("session.created")
        self._persist(session)
        return session

    def _release(self, connection: ServerConnection, session: Session, *, destroy: bool) -> None:
        if session.connection is not connection:
            return  # taken over by a resumed connection
        session.connection = None
        if session.detached:
            # Outlives its sockets ("close" included) until openenv/session/close.
            if session.pending_close:
                self._destroy(session)
            else:
                self._counters.incr("session.detached")
            return
        if destroy or not session.extensions:
            self._destroy(session)
        else:
            self._detach(session)

    def _detach(self, session: Session) -> None:
        session.expires_at = time.time() + self.resume_grace
        loop = asyncio.get_running_loop()
        session.timer = loop.call_later(self.resume_grace, self._expire, session)
        self._counters.incr("session.detached")
        self._persist(session)

    def _expire(self, session: Session) -> None:
        session.timer = None
        if session.connection is None and not session.closed:
            self._destroy(session)
            self._counters.incr("session.expired")

    def _destroy(self, session: Session) -> None:
        if session.closed:
            return
        session.closed = True
        if session.timer is not None:
            session.timer.cancel()
            session.timer = None
        # Only this exact session's entries: a duplicate must never evict the live one.
        if self._sessions.get(session.id) is session:
            del self._sessions[session.id]
        if session.token is not None and self._by_token.get(session.token) is session:
            del self._by_token[session.token]
        if self._store is not None:
            self._store.delete(session)
        with contextlib.suppress(Exception):
            close = getattr(session.env, "close", None)
            if callable(close):
                close()
        self._counters.incr("session.destroyed")

    # ------------------------------------------------- OpenEnv detached sessions

    def _rpc(self, connection: ServerConnection) -> Response:
        """Answer one ``POST /mcp`` JSON-RPC request (HTTP 200 with a JSON-RPC body)."""
        body = getattr(connection, "rpc_body", None)
        request_id: Any = None
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
                    request_id = request.get("id")
                    params = request.get("params")
                    answer = self._rpc_method(request_id, request["method"],
                                              params if isinstance(params, dict) else {})
        self._counters.incr("rpc")
        response = connection.respond(http.HTTPStatus.OK, "")
        response.body = answer
        del response.headers["Content-Type"]
        del response.headers["Content-Length"]
        response.headers["Content-Type"] = "application/json"
        response.headers["Content-Length"] = str(len(answer))
        return response

    def _rpc_method(self, request_id: Any, method: str, params: dict[str, Any]) -> bytes:
        if method == "openenv/session/create":
            if len(self._sessions) >= self.max_sessions:
                return rpc_error(
                    request_id, -32000,
                    f"Server at capacity: {len(self._sessions)}/{self.max_sessions} sessions "
                    "active. Cannot accept new connections.",
                    {"active_sessions": len(self._sessions), "max_sessions": self.max_sessions})
            try:
                env = self._factory()
            except Exception as exc:
                return rpc_error(request_id, -32000, str(exc) or type(exc).__name__, {
                    "factory_name": getattr(self._factory, "__name__",
                                            type(self._factory).__name__)})
            created = Session(id=str(uuid.uuid4()), env=env, extensions=False, detached=True)
            self._sessions[created.id] = created
            self._counters.incr("session.created")
            return rpc_result(request_id, {"session_id": created.id})
        if method == "openenv/session/close":
            target = params.get("session_id")
            if not isinstance(target, str) or not target:
                return rpc_error(request_id, -32602, "Invalid params - 'session_id' is required")
            found = self._sessions.get(target)
            if found is None or not found.detached:
                return rpc_error(request_id, -32602, f"Unknown session_id: {target}")
            if found.connection is not None:
                found.pending_close = True
                return rpc_result(request_id, {"session_id": target, "closed": False,
                                               "closing": True})
            self._destroy(found)
            return rpc_result(request_id, {"session_id": target, "closed": True})
        return rpc_error(request_id, -32601, f"Method not found: {method}")

    def _attach(self, session_id: str, connection: ServerConnection
                ) -> tuple[Session | None, dict[str, Any] | None]:
        """Attach a socket to a detached session, or the SESSION_ERROR OpenEnv answers."""
        session = self._sessions.get(session_id)
        if session is None or not session.detached or session.closed:
            message = f"Unknown session_id: {session_id}"
        elif session.connection is not None:
            message = f"Session {session_id} already has an attached WebSocket"
        else:
            session.connection = connection
            self._counters.incr("session.attached")
            return session, None
        return None, {"message": message, "code": ErrorCode.SESSION_ERROR.value}

    def _persist(self, session: Session) -> None:
        if self._store is not None and session.extensions and not session.closed:
            self._store.save(session)

    def _load_sessions(self, store: SessionStore) -> None:
        now = time.time()
        loop = asyncio.get_running_loop()
        for record in store.load():
            expires_at = record.get("expires_at")
            if isinstance(expires_at, (int, float)) and expires_at <= now:
                store.delete_record(record)
                continue
            try:
                env = self._factory()
                env.restore(record["env"])  # type: ignore[attr-defined]
                session = Session(
                    id=str(record["id"]), env=env, extensions=True, token=str(record["token"]),
                    step_count=int(record["step_count"]),
                    last_request_id=record.get("last_request_id"),
                    last_answer=record.get("last_answer"),
                )
            except Exception:
                _log.warning("envlink.server.store_record_invalid", exc_info=True)
                store.delete_record(record)
                continue
            # A session that was attached when the process died gets a full grace window.
            remaining = (expires_at - now) if isinstance(expires_at, (int, float)) \
                else self.resume_grace
            session.expires_at = now + remaining
            session.timer = loop.call_later(remaining, self._expire, session)
            assert session.token is not None
            self._sessions[session.id] = session
            self._by_token[session.token] = session
            self._counters.incr("session.loaded")

    # ------------------------------------------------------------------ connection

    async def _handle(self, connection: ServerConnection) -> None:
        plan = self._plans.pop(connection, None) or _Plan()
        self._seq += 1
        handle = ConnectionHandle(
            self._seq, connection, extensions=plan.extensions, resumed=plan.resumed
        )
        self._opened[handle.id] = handle
        self._handles[connection] = handle
        session: Session | None = plan.session
        destroy = False
        try:
            refusal: dict[str, Any] | None = None
            if plan.attach is not None:
                session, refusal = self._attach(plan.attach, connection)
            elif session is None:
                if len(self._sessions) >= self.max_sessions:
                    refusal = {
                        "message": f"Server at capacity: {len(self._sessions)}/"
                                   f"{self.max_sessions} sessions active. "
                                   "Cannot accept new connections.",
                        "code": ErrorCode.CAPACITY_REACHED.value,
                        "active_sessions": len(self._sessions),
                        "max_sessions": self.max_sessions,
                    }
                else:
                    try:
                        session = self._new_session(plan, connection)
                    except Exception as exc:
                        refusal = {
                            "message": str(exc) or type(exc).__name__,
                            "code": ErrorCode.FACTORY_ERROR.value,
                            "factory_name": getattr(self._factory, "__name__",
                                                    type(self._factory).__name__),
                        }
            elif plan.resumed:
                self._counters.incr("resume")
            handle.session_id = session.id if session is not None else None
            self._counters.incr("connection.opened")
            if refusal is not None or session is None:
                with contextlib.suppress(ConnectionClosed):
                    await connection.send(encode_response("error", refusal or {}))
                if plan.attach is not None:
                    with contextlib.suppress(ConnectionClosed):
                        await connection.close()
                return
            outcome = await self._serve(connection, handle, session, plan)
            destroy = outcome in (_Outcome.CLOSE, _Outcome.END)
        finally:
            if session is not None:
                self._release(connection, session, destroy=destroy)
            del self._handles[connection]
            handle._mark_closed()
            self._forget_old_handles()
            self._counters.incr("connection.closed")

    def _forget_old_handles(self) -> None:
        # A long-running server must not keep every handle; tests look at recent ones.
        excess = len(self._opened) - _KEEP_HANDLES
        if excess <= 0:
            return
        # Oldest first, skipping handles still open (a long-lived connection must not
        # pin every later one).
        for handle_id in [h.id for h in self._opened.values() if h.closed][:excess]:
            del self._opened[handle_id]

    async def _serve(self, connection: ServerConnection, handle: ConnectionHandle,
                     session: Session, plan: _Plan) -> _Outcome:
        while True:
            try:
                raw = await connection.recv()
            except ConnectionClosed:
                return _Outcome.LOST
            handle.requests += 1
            frame = _classify(raw, extensions=session.extensions)
            self._counters.incr("request")
            self._counters.incr(f"request.{frame.kind}")
            if frame.kind in _METHODS:
                with self._span(frame, session, plan) as span:
                    outcome = await self._process(connection, handle, session, frame, span)
            else:
                outcome = await self._process(connection, handle, session, frame, None)
            if outcome is not _Outcome.CONTINUE:
                return outcome

    async def _process(self, connection: ServerConnection, handle: ConnectionHandle,
                       session: Session, frame: _Frame, span: Span | None) -> _Outcome:
        number = handle.requests
        if handle.faults.take_stall(number) or self.faults.take_stall(number):
            self._counters.incr("stall")
            handle.stall()
        if handle.stalled and not await handle.wait_unstalled():
            _fail(span, "fault_injected", "connection lost while stalled")
            return _Outcome.LOST
        drop = handle.faults.take_drop(number) or self.faults.take_drop(number)
        if drop == "before_apply":
            return self._drop(handle, span)

        answer: str | bytes | None
        outcome = _Outcome.CONTINUE
        if frame.kind == "close" and frame.error is None:
            answer = None
            outcome = _Outcome.CLOSE
            self._counters.incr("applied.close")
        elif (code := handle.faults.take_error() or self.faults.take_error()) is not None:
            answer = encode_response(
                "error", {"message": "injected by fault injection", "code": code},
                request_id=frame.request_id,
            )
            _fail(span, code, "injected error frame")
        elif (kind := handle.faults.take_corrupt() or self.faults.take_corrupt()) is not None:
            answer = corrupt_frame(
                kind, request_type=frame.kind, request_id=frame.request_id,
                oversize_bytes=handle.faults.oversize_bytes if handle.faults.corrupt_frames
                else self.faults.oversize_bytes,
            )
            _fail(span, "fault_injected", f"corrupt frame: {kind}")
        elif frame.error is not None:
            answer = encode_response("error", frame.error, request_id=frame.request_id)
            _fail(span, str(frame.error["code"]), str(frame.error["message"]))
            if frame.fatal:
                outcome = _Outcome.END
        else:
            answer = self._answer(session, frame, span)

        if drop is not None:
            if drop == "mid_answer" and answer is not None:
                _write_partial(connection, answer)
            self._drop(handle, span)
            return outcome if outcome is not _Outcome.CONTINUE else _Outcome.LOST

        latency = handle.faults.latency + self.faults.latency
        if latency > 0:
            # Injected latency, cut short if the connection goes away (or the server
            # stops) meanwhile: a stopping server must not wait it out.
            delay = asyncio.ensure_future(asyncio.sleep(latency))
            try:
                await asyncio.wait({delay, handle.lost}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                delay.cancel()
            if handle.lost.done():
                _fail(span, "connection_lost", "connection lost during injected latency")
                return _Outcome.LOST
        if handle.stalled and not await handle.wait_unstalled():
            _fail(span, "fault_injected", "connection lost while stalled")
            return _Outcome.LOST
        if answer is not None:
            try:
                await connection.send(answer)
            except ConnectionClosed:
                _fail(span, "connection_lost", "connection lost before the answer was sent")
                return _Outcome.LOST
        return outcome

    def _drop(self, handle: ConnectionHandle, span: Span | None) -> _Outcome:
        self._counters.incr("drop")
        _fail(span, "fault_injected", "connection dropped by fault injection")
        handle.abort()
        return _Outcome.LOST

    def _answer(self, session: Session, frame: _Frame, span: Span | None) -> str:
        """Apply a valid request (or replay its cached answer) and encode the answer."""
        rid = frame.request_id
        if rid is not None and rid == session.last_request_id and session.last_answer is not None:
            self._counters.incr("dedup")
            if span is not None:
                span.set_attribute("envlink.server.dedup", True)
            return session.last_answer
        kind, data = self._apply(session, frame)
        answer = encode_response(kind, data, request_id=rid)
        if kind == "error":
            _fail(span, str(data["code"]), str(data["message"]))
        if session.extensions:
            if rid is not None:
                session.last_request_id = rid
                session.last_answer = answer
            self._persist(session)
        return answer

    def _apply(self, session: Session,
               frame: _Frame) -> tuple[Literal["observation", "state", "error"], dict[str, Any]]:
        request = frame.request
        env = session.env
        try:
            if isinstance(request, ResetRequest):
                result = env.reset(**accepted_kwargs(env.reset, request.data))
                data = _result_data(result)
            elif isinstance(request, StepRequest):
                result = env.step(dict(request.data))
                data = _result_data(result)
                session.step_count += 1
            elif isinstance(request, StateRequest):
                data = dict(env.state())
                json.dumps(data)
                self._counters.incr("applied.state")
                return "state", data
            else:  # pragma: no cover - close is handled by the caller
                raise AssertionError(f"unexpected request {request!r}")
        except ValidationError as exc:
            return "error", _validation_error(exc)
        except InvalidActionError as exc:
            return "error", {"message": str(exc), "code": ErrorCode.VALIDATION_ERROR.value}
        except Exception as exc:
            return "error", {"message": str(exc) or type(exc).__name__,
                             "code": ErrorCode.EXECUTION_ERROR.value}
        self._counters.incr(f"applied.{frame.kind}")
        return "observation", data

    @contextlib.contextmanager
    def _span(self, frame: _Frame, session: Session, plan: _Plan) -> Iterator[Span]:
        context = plan.trace_context
        request = frame.request
        if request is not None and request.traceparent:
            carrier = {"traceparent": request.traceparent}
            if request.tracestate:
                carrier["tracestate"] = request.tracestate
            context = propagate.extract(carrier)
        with self._tracer.start_as_current_span(
            frame.kind,
            context=context,
            kind=SpanKind.SERVER,
            attributes={
                ATTR_RPC_SYSTEM: RPC_SYSTEM,
                ATTR_RPC_METHOD: frame.kind,
                ATTR_SESSION_ID: session.id,
            },
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            try:
                yield span
            except BaseException as exc:
                _fail(span, type(exc).__qualname__, str(exc))
                raise


# ---------------------------------------------------------------------- helpers


def _classify(raw: str | bytes, *, extensions: bool) -> _Frame:
    """Sort a received frame the way OpenEnv's ``/ws`` endpoint does."""
    if isinstance(raw, bytes):
        # OpenEnv reads text only; a binary frame fails the session.
        return _Frame("invalid", fatal=True, error={
            "message": "binary frames are not supported; send JSON text frames",
            "code": ErrorCode.SESSION_ERROR.value,
        })
    try:
        obj = json.loads(raw)
    except ValueError as exc:
        return _Frame("invalid", error={"message": f"Invalid JSON: {exc}",
                                        "code": ErrorCode.INVALID_JSON.value})
    if not isinstance(obj, dict):
        # OpenEnv fails the whole session on a JSON value that is not an object.
        return _Frame("invalid", fatal=True, error={
            "message": f"'{type(obj).__name__}' object has no attribute 'get'",
            "code": ErrorCode.SESSION_ERROR.value,
        })
    rid = obj.get("id") if extensions and isinstance(obj.get("id"), str) else None
    kind = obj.get("type", "")
    if not isinstance(kind, str) or kind not in _METHODS:
        return _Frame("invalid", request_id=rid, error={
            "message": f"Unknown message type: {kind}", "code": ErrorCode.UNKNOWN_TYPE.value,
        })
    if not extensions:
        extra = [name for name in _EXTENSION_FIELDS if name in obj]
        if extra:
            return _Frame(kind, error={
                "message": "Invalid message",
                "code": ErrorCode.VALIDATION_ERROR.value,
                "errors": [{"type": "extra_forbidden", "loc": [name],
                            "msg": "Extra inputs are not permitted", "input": obj[name]}
                           for name in extra],
            })
    try:
        request = decode_request(raw)
    except ProtocolError as exc:
        cause = exc.__cause__
        if isinstance(cause, ValidationError):
            error = _validation_error(cause, tag=kind)
        else:
            error = {"message": "Invalid message", "code": ErrorCode.VALIDATION_ERROR.value}
        return _Frame(kind, request_id=rid, error=error)
    return _Frame(kind, request=request, request_id=request.id if extensions else None)


def _validation_error(exc: ValidationError, *, tag: str | None = None) -> dict[str, Any]:
    errors = json.loads(exc.json(include_url=False, include_context=False))
    if tag is not None:  # drop the union's tag, so locations read like OpenEnv's
        for error in errors:
            loc = error.get("loc")
            if isinstance(loc, list) and loc[:1] == [tag]:
                error["loc"] = loc[1:]
    return {"message": "Invalid message", "code": ErrorCode.VALIDATION_ERROR.value,
            "errors": errors}


def _result_data(result: StepResult) -> dict[str, Any]:
    if not isinstance(result, StepResult):
        raise TypeError(f"environment returned {type(result).__name__}, expected StepResult")
    data = result.to_wire()
    json.dumps(data)  # fail here (EXECUTION_ERROR) rather than while sending
    return data


def _fail(span: Span | None, error_type: str, description: str) -> None:
    if span is None or not span.is_recording():
        return
    with contextlib.suppress(Exception):
        span.set_attribute(ATTR_ERROR_TYPE, error_type)
        # The failure is an answer, not always a Python exception: the conventions'
        # exception event, with what the client is told.
        span.add_event("exception", {"exception.type": error_type,
                                     "exception.message": description[:256]})
        span.set_status(Status(StatusCode.ERROR, description[:256]))


def _write_partial(connection: ServerConnection, answer: str | bytes) -> None:
    """Write the first half of ``answer``'s frame bytes straight to the socket."""
    with contextlib.suppress(Exception):
        payload = answer.encode() if isinstance(answer, str) else answer
        if isinstance(answer, str):
            connection.protocol.send_text(payload)
        else:
            connection.protocol.send_binary(payload)
        data = b"".join(connection.protocol.data_to_send())
        connection.transport.write(data[: max(1, len(data) // 2)])


class _RedactingLogger(logging.LoggerAdapter):  # type: ignore[type-arg]
    """The ``websockets.server`` logger, with credentials removed from header debug lines.

    websockets logs every handshake header at DEBUG level as ``("< %s: %s", name, value)``.
    """

    _SECRET = frozenset({"authorization", "proxy-authorization", "cookie", "set-cookie",
                         RESUME_TOKEN_HEADER, SESSION_TOKEN_HEADER})

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        if (len(args) == 2 and isinstance(args[0], str)
                and args[0].lower() in self._SECRET):
            args = (args[0], "<redacted>")
        super().log(level, msg, *args, **kwargs)


_REDACTING_LOGGER = _RedactingLogger(logging.getLogger("websockets.server"), {})


def _header(headers: Headers, name: str) -> str | None:
    values = headers.get_all(name)
    return values[0].strip() if values else None


def _carrier(headers: Headers) -> dict[str, str]:
    # Never let Authorization (or any credential) travel further than needed.
    return {k.lower(): v for k, v in headers.raw_items()
            if k.lower() in ("traceparent", "tracestate", "baggage")}


def _format_seconds(seconds: float) -> str:
    return str(int(seconds)) if float(seconds).is_integer() else repr(float(seconds))
