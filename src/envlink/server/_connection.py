"""A test-facing handle on one server-side WebSocket connection."""

from __future__ import annotations

import asyncio
from typing import Any

from websockets.asyncio.server import ServerConnection

from envlink.server._faults import Faults

__all__ = ["ConnectionHandle"]


class ConnectionHandle:
    """One accepted WebSocket connection, as tests see it.

    Attributes:
        id: 1-based sequence number of the connection on this server.
        faults: faults for this connection only; checked before the server's.
        extensions: whether the envlink extensions were negotiated.
        resumed: ``True``/``False`` if the client asked to resume, else ``None``.
        session_id: public id of the session it is attached to (``None`` if the
            session could not be created, e.g. at capacity).
        requests: frames received so far (the count the ``*_after`` faults use), but
            the state read that confirms an attach to a detached session, which is
            part of opening the connection.
    """

    def __init__(self, seq: int, connection: ServerConnection, *, extensions: bool,
                 resumed: bool | None) -> None:
        self.id = seq
        self.faults = Faults()
        self.extensions = extensions
        self.resumed = resumed
        self.session_id: str | None = None
        self.requests = 0
        self._connection: ServerConnection | None = connection
        self._lost: asyncio.Future[None] = connection.connection_lost_waiter
        self._unstalled = asyncio.Event()
        self._unstalled.set()
        self._closed = asyncio.Event()

    def __repr__(self) -> str:
        return (f"<ConnectionHandle id={self.id} session={self.session_id} "
                f"extensions={self.extensions} requests={self.requests}>")

    @property
    def stalled(self) -> bool:
        """Whether the connection is stalled (not reading, not answering)."""
        return not self._unstalled.is_set()

    @property
    def closed(self) -> bool:
        """Whether the connection's handler has finished."""
        return self._closed.is_set()

    @property
    def lost(self) -> asyncio.Future[None]:
        """Done when the TCP connection is gone."""
        return self._lost

    def abort(self) -> None:
        """Drop the TCP connection at once, without a WebSocket close frame."""
        if self._connection is not None:
            self._connection.transport.abort()

    def stall(self) -> None:
        """Stop reading from the socket (pings go unanswered) and stop answering."""
        if self._connection is None:
            return
        self._unstalled.clear()
        self._connection.transport.pause_reading()

    def unstall(self) -> None:
        """Undo :meth:`stall`: read again and answer what is pending."""
        if self.stalled:
            self._unstalled.set()
            if self._connection is not None and not self._connection.transport.is_closing():
                self._connection.transport.resume_reading()

    async def wait_unstalled(self) -> bool:
        """Wait while stalled; ``False`` if the connection was lost meanwhile."""
        if not self.stalled:
            return not self.lost.done()
        waiter: asyncio.Future[Any] = asyncio.ensure_future(self._unstalled.wait())
        lost: asyncio.Future[Any] = self.lost
        try:
            await asyncio.wait({waiter, lost}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
        return not self.lost.done()

    async def wait_closed(self) -> None:
        """Return when the connection's handler has finished."""
        await self._closed.wait()

    def _mark_closed(self) -> None:
        self._closed.set()
        # The server remembers the handles of recent connections for tests; a closed one
        # must not keep its whole connection (parsed request, buffers) alive with it.
        self._connection = None
