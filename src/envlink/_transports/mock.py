"""A transport that answers from a function: test code that uses envlink without a server.

In the manner of ``httpx.MockTransport``::

    def handler(request):
        if request["type"] == "reset":
            return {"type": "observation", "data": {"observation": {"n": 0}}}
        ...

    client = GenericEnvClient("http://env.test", transport=MockTransport(handler))

The client above it is the real one (deadlines, retries, recovery, telemetry):
only the network is replaced.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from envlink._config import ConnectionOptions
from envlink._errors import ConnectionLostError, EnvlinkError
from envlink._sansio.protocol import (
    EXTENSION_HEADER,
    EXTENSION_VERSION,
    SESSION_ID_HEADER,
    Extensions,
)
from envlink._transports.base import Endpoint, NotWrittenError

__all__ = ["MockTransport"]

#: What a handler returns: a frame as a dict (JSON-encoded for it), raw text (sent as
#: is, e.g. to test a malformed frame), a list of those (sent in order: a late answer
#: before the current one, say), or ``None`` for no answer at all.
Answer = Mapping[str, Any] | str | list[Mapping[str, Any] | str] | None
Handler = Callable[[dict[str, Any]], Answer | Awaitable[Answer]]


class MockTransport:
    """A :class:`~envlink._transports.base.Transport` whose server is a function.

    Each request frame the client sends is decoded and passed to ``handler``
    (plain or ``async``), which returns the answer frame: a dict, raw text, a list
    of frames to send in order, or ``None`` to send nothing (the call then runs
    into its deadline). A handler
    that raises :class:`~envlink.ConnectionLostError` drops the connection after
    the request was written, as a server crash would; any other exception it
    raises drops the connection too and is re-raised by :meth:`raise_handler_errors`.

    Args:
        handler: turns one request frame into its answer.
        extensions: advertise envlink's protocol extensions; the answer then gets
            the request's ``id`` when the handler did not set one.
        on_connect: called with each connection's handshake headers; may raise a
            :class:`~envlink.ConnectError` to refuse it.

    Attributes:
        requests: every request frame received, in order.
        connections: how many connections were opened.
    """

    def __init__(
        self,
        handler: Handler,
        *,
        extensions: bool = False,
        on_connect: Callable[[Mapping[str, str]], None] | None = None,
    ) -> None:
        if not callable(handler):
            raise TypeError(f"handler must be callable, got {type(handler).__name__}")
        self._handler = handler
        self._extensions = extensions
        self._on_connect = on_connect
        self.requests: list[dict[str, Any]] = []
        self.connections = 0
        self._errors: list[BaseException] = []

    async def connect(
        self,
        endpoint: Endpoint,
        options: ConnectionOptions,
        *,
        headers: Mapping[str, str],
        timeout: float | None,
        offer_extensions: bool = True,
    ) -> _MockConnection:
        """Open a connection to the handler (no I/O)."""
        if self._on_connect is not None:
            self._on_connect(dict(headers))
        self.connections += 1
        ext = Extensions()
        if self._extensions and offer_extensions:
            ext = Extensions.from_headers({
                EXTENSION_HEADER: EXTENSION_VERSION,
                SESSION_ID_HEADER: f"mock-{self.connections}",
            })
        return _MockConnection(self, ext)

    def raise_handler_errors(self) -> None:
        """Re-raise the first unexpected exception a handler raised, if any."""
        if self._errors:
            raise self._errors[0]

    async def _answer(self, request: dict[str, Any]) -> Answer:
        self.requests.append(request)
        answer = self._handler(request)
        if inspect.isawaitable(answer):
            answer = await answer
        return answer

    def __repr__(self) -> str:
        return f"MockTransport({getattr(self._handler, '__name__', self._handler)!r})"


class _MockConnection:
    """One connection of a :class:`MockTransport`."""

    def __init__(self, transport: MockTransport, extensions: Extensions) -> None:
        self.extensions = extensions
        self._transport = transport
        self._inbox: asyncio.Queue[str | BaseException] = asyncio.Queue()
        self._open = True

    @property
    def is_open(self) -> bool:
        return self._open

    async def send(self, text: str | bytes) -> None:
        if not self._open:
            raise NotWrittenError("connection is closed; the request was not sent")
        request = json.loads(text)
        try:
            answer = await self._transport._answer(request)
        except ConnectionLostError as exc:
            self._drop(exc)
            return
        except Exception as exc:  # a handler bug: surface it, never hang the caller
            self._transport._errors.append(exc)
            self._drop(ConnectionLostError(f"mock handler raised {type(exc).__name__}: {exc}"))
            return
        if answer is None:
            return
        for item in answer if isinstance(answer, list) else [answer]:
            if isinstance(item, str):
                self._inbox.put_nowait(item)
                continue
            frame = dict(item)
            if self.extensions.enabled and "id" in request and "id" not in frame:
                frame["id"] = request["id"]
            self._inbox.put_nowait(json.dumps(frame))

    async def recv(self) -> str:
        if not self._open and self._inbox.empty():
            raise ConnectionLostError("connection lost: the mock connection is closed")
        item = await self._inbox.get()
        if isinstance(item, BaseException):
            raise item
        return item

    async def probe(self, timeout: float) -> bool:
        return self._open

    async def take_buffered(self) -> str | None:
        return None

    async def close(self, timeout: float | None) -> None:
        self._drop(ConnectionLostError("connection lost: closed by the client"))

    def abort(self) -> None:
        self._drop(ConnectionLostError("connection lost: aborted by the client"))

    def _drop(self, error: EnvlinkError) -> None:
        if self._open:
            self._open = False
            self._inbox.put_nowait(error)

