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

This module is the I/O layer: listening, one handler per connection, stalls, drops
and latency. The rest lives on its seams: the upgrade in ``_http.handshake``, sessions in
``_registry``, what a frame means and what to answer in ``_frames`` (pure), the
fault decisions in ``_faults``, spans and test-facing observation in ``_observe``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl as ssl_module
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.trace import Span, TracerProvider
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from envlink._config import check_number
from envlink._deadlines import bounded
from envlink._errors import ErrorCode
from envlink._sansio.limits import SERVER_MAX_MESSAGE_VALUES
from envlink._sansio.protocol import encode_response
from envlink._speedups import warm_read_buffers
from envlink.server._connection import ConnectionHandle
from envlink.server._counters import AwaitableCounters
from envlink.server._environments.deterministic import DeterministicEnvironment
from envlink.server._environments.echo import EchoEnvironment
from envlink.server._environments.echo_harness import serve_harness
from envlink.server._environments.environment import EnvironmentFactory
from envlink.server._faults import FaultChain, Faults
from envlink.server._frames import METHODS, Frame, Outcome, Reply, classify, respond
from envlink.server._http.access import Access, capped_connection
from envlink.server._http.handshake import REDACTING_LOGGER, Handshake, Plan
from envlink.server._http.mcp_sessions import HttpAwareConnection
from envlink.server._observe import ATTR_SERVER_DEDUP, Observable, ServerTelemetry, fail
from envlink.server._registry import SessionRegistry
from envlink.server._store import Session, SessionStore

__all__ = ["DEFAULT_MAX_MESSAGE_SIZE", "ENVIRONMENTS", "EnvServer"]

#: The built-in environments, by the name ``EnvServer(env=...)`` accepts.
ENVIRONMENTS: Mapping[str, EnvironmentFactory] = {
    "echo": EchoEnvironment,
    "deterministic": DeterministicEnvironment,
}
#: OpenEnv's server (uvicorn) accepts WebSocket messages up to 16 MiB.
DEFAULT_MAX_MESSAGE_SIZE = 16 * 1024 * 1024

_KEEP_HANDLES = 1024


class EnvServer(Observable):
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
        max_message_size: largest incoming message in bytes (bigger: close 1009);
            with compression, the inflated size is what counts.
        max_message_values: most JSON values an incoming message may hold, counted
            before parsing (bigger: an ``INVALID_JSON`` error frame); this, not the
            length, bounds a parsed message's memory.
        compression: ``None`` (default) or ``"deflate"`` (permessage-deflate).
        detached_idle_timeout: seconds an OpenEnv detached session is kept with no
            socket attached (``None``: until ``openenv/session/close``).
        idle_timeout: seconds a connection may stay without sending a request before
            the server closes it (``None``: no limit; keepalive pings do not count).
        auth_token: require ``Authorization: Bearer <auth_token>`` on every route but
            ``/health`` (compared in constant time; ``401`` otherwise); ``/health`` stays
            open. ``None``: no authentication.
        allowed_origins: browser origins allowed to connect (``"*"``: any); a request
            with another ``Origin`` header gets ``403``. Programs send none.
        max_connections: TCP connections open at once; more are dropped on accept.
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
        max_message_values: int | None = SERVER_MAX_MESSAGE_VALUES,
        compression: str | None = None,
        detached_idle_timeout: float | None = 600.0,
        idle_timeout: float | None = None,
        auth_token: str | None = None,
        allowed_origins: Sequence[str] | None = None,
        max_connections: int | None = None,
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
        check_number(max_sessions, "max_sessions", integer=True, minimum=1,
                     expected="at least 1")
        check_number(resume_grace, "resume_grace", minimum=0, expected="non-negative")
        self.host = host
        self.port = port
        self.max_sessions = max_sessions
        self.max_message_size = max_message_size
        if compression not in (None, "deflate"):
            raise ValueError(f"compression must be None or 'deflate', got {compression!r}")
        self.max_message_values = max_message_values
        self.compression = compression
        self.idle_timeout = idle_timeout
        self.access = Access.build(auth_token, allowed_origins)
        check_number(max_connections, "max_connections", integer=True, minimum=1,
                     optional=True, expected="at least 1 or None")
        self._connection_class = capped_connection(HttpAwareConnection, max_connections)
        self.extensions = extensions
        self.faults = faults if faults is not None else Faults()
        #: Whether ``/harness`` turns carry training captures (advertised in
        #: ``session_started``); tests turn it off to play a server that has none.
        self.harness_training_trace = True
        self._counters = AwaitableCounters()
        self._registry = SessionRegistry(
            factory, resume_grace=resume_grace, counters=self._counters,
            detached_idle=detached_idle_timeout,
            store=SessionStore(session_store) if session_store is not None else None)
        self._handshake = Handshake(self)
        self._telemetry = ServerTelemetry(tracer_provider)
        self._ping_interval = ping_interval
        self._ping_timeout = ping_timeout
        self._close_timeout = close_timeout
        self._ssl = ssl
        self.detached_sessions = detached_sessions

        self._ws: Server | None = None
        self._started = False
        self._handles: dict[ServerConnection, ConnectionHandle] = {}
        self._opened: dict[int, ConnectionHandle] = {}  # by sequence number
        self._seq = 0

    @property
    def resume_grace(self) -> float:
        """Seconds a detached extension session is kept for resumption (may be changed)."""
        return self._registry.resume_grace

    @resume_grace.setter
    def resume_grace(self, seconds: float) -> None:
        self._registry.resume_grace = seconds

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
        self._registry.load()
        try:
            await self._listen()
        except BaseException:
            # Not started: the loaded sessions' timers and environments go (their
            # records stay on disk, for a server that does start).
            self._registry.drop_all()
            raise
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
        self._registry.drop_all()

    async def _listen(self) -> None:
        warm_read_buffers()  # every frame received is read into a 256 KiB buffer
        self._ws = await serve(
            self._handle,
            self.host,
            self.port,
            process_request=self._handshake.process_request,
            process_response=self._handshake.process_response,
            max_size=self.max_message_size,
            # Off unless asked: a compressed message costs the sender a fraction of
            # what it costs this server to inflate and parse.
            compression=self.compression,
            ping_interval=self._ping_interval,
            ping_timeout=self._ping_timeout,
            close_timeout=self._close_timeout,
            logger=REDACTING_LOGGER,
            ssl=self._ssl,
            # Always: a POST (a client probing for detached sessions) then gets a plain
            # 404 instead of a failed handshake logged with its traceback.
            create_connection=self._connection_class,
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

    # ------------------------------------------------------------------ connection

    async def _handle(self, connection: ServerConnection) -> None:
        plan = self._handshake.take_plan(connection)
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
            if plan.harness:
                session, refusal = self._open_session(plan, connection)
                if session is not None:
                    handle.session_id = session.id
                    self._counters.incr("connection.opened")
                    await serve_harness(connection, session.id,
                                        training_trace=self.harness_training_trace)
                    destroy = True
                    return
            elif plan.attach is not None:
                session, message = self._registry.attach(plan.attach, connection)
                if message is not None:
                    refusal = {"message": message, "code": ErrorCode.SESSION_ERROR.value}
            elif session is None:
                session, refusal = self._open_session(plan, connection)
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
            destroy = outcome in (Outcome.CLOSE, Outcome.END)
        finally:
            if session is not None:
                self._registry.release(connection, session, destroy=destroy)
            del self._handles[connection]
            handle._mark_closed()
            self._forget_old_handles()
            self._counters.incr("connection.closed")

    def _open_session(self, plan: Plan, connection: ServerConnection
                      ) -> tuple[Session | None, dict[str, Any] | None]:
        """A new session for the connection, or the error frame refusing it."""
        registry = self._registry
        if len(registry) >= self.max_sessions:
            # Read from /health by benchmarks and operators (refusals, and the peak below).
            self._counters.incr("capacity_refused")
            return None, {
                "message": f"Server at capacity: {len(registry)}/"
                           f"{self.max_sessions} sessions active. "
                           "Cannot accept new connections.",
                "code": ErrorCode.CAPACITY_REACHED.value,
                "active_sessions": len(registry),
                "max_sessions": self.max_sessions,
            }
        try:
            session = registry.create(session_id=plan.session_id, token=plan.token,
                                      extensions=plan.extensions, connection=connection)
            peak = self._counters.get("sessions_peak")
            if len(registry) > peak:
                self._counters.incr("sessions_peak", len(registry) - peak)
            return session, None
        except Exception as exc:
            factory = registry.factory
            return None, {
                "message": str(exc) or type(exc).__name__,
                "code": ErrorCode.FACTORY_ERROR.value,
                "factory_name": getattr(factory, "__name__", type(factory).__name__),
            }

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
                     session: Session, plan: Plan) -> Outcome:
        # A client that attaches to a detached session (/ws?session_id=) may read its
        # state first to confirm the attach (envlink's does). That read is part of
        # opening the connection: faults neither count it nor fire on it, so that
        # --drop-after N and the other fault flags land on the same request in every
        # mode.
        confirming = plan.attach is not None
        while True:
            try:
                if self.idle_timeout is None:
                    raw = await connection.recv()
                else:
                    async with bounded(self.idle_timeout):
                        raw = await connection.recv()
            except ConnectionClosed:
                return Outcome.LOST
            except TimeoutError:
                # Idle: closed like a going-away server; a resumable session stays
                # resumable for its grace window.
                await connection.close(1001, "idle timeout")
                return Outcome.LOST
            frame = classify(raw, extensions=session.extensions,
                             max_values=self.max_message_values)
            exempt = confirming and frame.kind == "state"
            confirming = False
            if not exempt:
                handle.requests += 1
            self._counters.incr("request")
            self._counters.incr(f"request.{frame.kind}")
            if frame.kind in METHODS:
                with self._telemetry.span(frame, session.id, plan.trace_context) as span:
                    outcome = await self._process(connection, handle, session, frame, span,
                                                  exempt=exempt)
            else:
                outcome = await self._process(connection, handle, session, frame, None,
                                              exempt=exempt)
            if outcome is not Outcome.CONTINUE:
                return outcome

    async def _process(self, connection: ServerConnection, handle: ConnectionHandle,
                       session: Session, frame: Frame, span: Span | None, *,
                       exempt: bool = False) -> Outcome:
        number = handle.requests
        faults = FaultChain() if exempt else FaultChain(handle.faults, self.faults)
        if faults.take_stall(number):
            self._counters.incr("stall")
            handle.stall()
        if handle.stalled and not await handle.wait_unstalled():
            fail(span, "fault_injected", "connection lost while stalled")
            return Outcome.LOST
        drop = faults.take_drop(number)
        if drop == "before_apply":
            return self._drop(handle, span)

        reply = respond(session, frame, faults=faults, count=self._counters.incr)
        self._observe(reply, session, span)
        answer, outcome = reply.answer, reply.outcome

        if drop is not None:
            if drop == "mid_answer" and answer is not None:
                _write_partial(connection, answer)
            self._drop(handle, span)
            return outcome if outcome is not Outcome.CONTINUE else Outcome.LOST

        latency = faults.latency
        if latency > 0:
            # Injected latency, cut short if the connection goes away (or the server
            # stops) meanwhile: a stopping server must not wait it out.
            delay = asyncio.ensure_future(asyncio.sleep(latency))
            try:
                await asyncio.wait({delay, handle.lost}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                delay.cancel()
            if handle.lost.done():
                fail(span, "connection_lost", "connection lost during injected latency")
                return Outcome.LOST
        if handle.stalled and not await handle.wait_unstalled():
            fail(span, "fault_injected", "connection lost while stalled")
            return Outcome.LOST
        if answer is not None:
            try:
                await connection.send(answer)
            except ConnectionClosed:
                fail(span, "connection_lost", "connection lost before the answer was sent")
                return Outcome.LOST
        return outcome

    def _observe(self, reply: Reply, session: Session, span: Span | None) -> None:
        """Carry out what a reply says beyond its answer: persist, and mark the span."""
        if reply.changed:
            self._registry.persist(session)
        if reply.dedup and span is not None:
            span.set_attribute(ATTR_SERVER_DEDUP, True)
        if reply.failure is not None:
            fail(span, *reply.failure)

    def _drop(self, handle: ConnectionHandle, span: Span | None) -> Outcome:
        self._counters.incr("drop")
        fail(span, "fault_injected", "connection dropped by fault injection")
        handle.abort()
        return Outcome.LOST


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
