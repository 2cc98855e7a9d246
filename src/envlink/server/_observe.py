"""Observing the reference server: its spans, and the counters and waits tests use.

:class:`ServerTelemetry` makes one SERVER span per request, a child of the
caller's trace context (from the upgrade request, or from the frame itself with
the extensions). :class:`Observable` is the part of :class:`~envlink.server.EnvServer`
that tests read: counters that can be awaited (deterministic synchronisation
without sleeps), connections, sessions.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, TracerProvider

from envlink import __version__
from envlink.names import (
    ATTR_ERROR_TYPE,
    ATTR_RPC_METHOD,
    ATTR_RPC_SYSTEM,
    ATTR_SESSION_ID,
    RPC_SYSTEM,
)
from envlink.server._connection import ConnectionHandle
from envlink.server._counters import AwaitableCounters
from envlink.server._frames import Frame
from envlink.server._registry import SessionRegistry
from envlink.server._store import SessionInfo

if TYPE_CHECKING:
    from websockets.asyncio.server import ServerConnection

__all__ = ["ATTR_SERVER_DEDUP", "Observable", "ServerTelemetry", "fail"]

#: Set on a request's span when it was answered from the de-duplication cache.
ATTR_SERVER_DEDUP = "envlink.server.dedup"


class ServerTelemetry:
    """The server's tracer, and the span of each request."""

    def __init__(self, tracer_provider: TracerProvider | None) -> None:
        self._tracer = trace.get_tracer("envlink.server", __version__,
                                        tracer_provider=tracer_provider)

    @contextlib.contextmanager
    def span(self, frame: Frame, session_id: str, context: Context | None) -> Iterator[Span]:
        """The SERVER span of one request, named for its method."""
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
                ATTR_SESSION_ID: session_id,
            },
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            try:
                yield span
            except BaseException as exc:
                fail(span, type(exc).__qualname__, str(exc))
                raise


def fail(span: Span | None, error_type: str, description: str) -> None:
    """Mark a request's span failed (``error.type`` and ERROR status); never raises."""
    if span is None or not span.is_recording():
        return
    with contextlib.suppress(Exception):
        span.set_attribute(ATTR_ERROR_TYPE, error_type)
        # The failure is an answer, not always a Python exception: the conventions'
        # exception event, with what the client is told.
        span.add_event("exception", {"exception.type": error_type,
                                     "exception.message": description[:256]})
        span.set_status(Status(StatusCode.ERROR, description[:256]))


class Observable:
    """What tests and operators can read from a server, and wait for."""

    _counters: AwaitableCounters
    _registry: SessionRegistry
    _handles: dict[ServerConnection, ConnectionHandle]
    _opened: dict[int, ConnectionHandle]

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
        return self._registry.infos()

    def session(self, session_id: str) -> SessionInfo:
        """The session with this public id.

        Raises:
            KeyError: no such live session.
        """
        return self._registry.get(session_id).info(time.time())

    def session_step_counts(self) -> dict[str, int]:
        """Steps applied per live session, by public session id."""
        return self._registry.step_counts()

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

