"""One HTTP/1.1 request on a direct connection (no proxy): h11 driven on asyncio streams.

Why a second path beside httpx: importing httpx with httpcore and anyio costs 60-500
ms on a busy machine, and a client under ``on_session_lost="auto"`` sends ``POST
/mcp`` (``openenv/session/create``) before its first upgrade: that import was almost
all of what its first connect cost more than a ``"raise"`` one (docs/performance.md).
A direct request needs only one TCP (or TLS) connection, one request with
``Connection: close`` and one answer; the HTTP/1.1 framing and parsing are h11's (the
sans-I/O library httpcore itself uses, about 10 ms to import), this module only moves
the bytes. A request through a proxy still goes through httpx
(:mod:`envlink._transports.http`), which also validates the headers and follows
redirects for both paths.

Failures are envlink's errors, as httpx's are translated there: :class:`ConnectError`
while connecting (not retried for TLS verification) or for a request h11 refuses to
write, :class:`NoAnswerError` for a server that closed without a byte,
:class:`ConnectionLostError` for one that closed or failed mid-answer,
:class:`ProtocolError` for an answer that is not HTTP/1.x or whose head is too large.
"""

from __future__ import annotations

import asyncio
import ssl as ssl_module
from urllib.parse import urlsplit

import h11

from envlink._errors import ConnectError, ConnectionLostError, ProtocolError

__all__ = ["MAX_HEAD", "Answer", "exchange"]

#: Bound on an answer's head (status line and headers), as httpcore sets h11's.
MAX_HEAD = 64 * 1024
_READ = 64 * 1024

#: Status, headers (names in lower case), and the body or ``None`` when it was over the
#: limit on an error status (the status is the answer; the body is not needed).
Answer = tuple[int, dict[str, str], bytes | None]


async def exchange(method: str, url: str, head: list[tuple[str, str]], payload: bytes | None,
                   *, ssl: ssl_module.SSLContext | None, limit: int, where: str,
                   no_answer: type[ConnectionLostError]) -> Answer:
    """Send one request to ``url`` over a direct connection and read its answer.

    Args:
        method: ``GET``, ``POST``...
        url: an ``http://`` or ``https://`` URL (its path and query are sent).
        head: the request's headers, already checked for CR/LF/NUL.
        payload: the body, or ``None``.
        ssl: the TLS context for ``https://``.
        limit: the largest body kept, in bytes.
        where: the URL as errors may show it (redacted).
        no_answer: the error for a server that closed without answering.

    Raises:
        ConnectError: the connection could not be made, or the request cannot be
            written; nothing was sent.
        ConnectionLostError: the connection failed after the request was sent.
        ProtocolError: the answer is not HTTP/1.x, its head too large, or its body
            over ``limit`` on a success status.
    """
    parts = urlsplit(url)
    secure = parts.scheme == "https"
    host = parts.hostname or ""
    port = parts.port or (443 if secure else 80)
    netloc = f"[{host}]" if ":" in host else host
    if port != (443 if secure else 80):
        netloc += f":{port}"
    headers = [("Host", netloc), *head]
    if payload is not None:
        headers.append(("Content-Length", str(len(payload))))
    conn = h11.Connection(our_role=h11.CLIENT, max_incomplete_event_size=MAX_HEAD)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    try:
        request = conn.send(h11.Request(method=method, target=target, headers=headers))
        if payload:
            request += conn.send(h11.Data(data=payload))
        request += conn.send(h11.EndOfMessage())
    except (h11.LocalProtocolError, UnicodeEncodeError) as exc:
        raise ConnectError(f"the request to {where} is malformed: {exc}",
                           retryable=False) from None
    try:
        reader, writer = await asyncio.open_connection(
            host, port, ssl=ssl if secure else None, server_hostname=host if secure else None)
    except ssl_module.SSLCertVerificationError as exc:
        raise ConnectError(f"TLS verification failed for {where}: {exc.verify_message}",
                           retryable=False) from exc
    except ssl_module.SSLError as exc:
        raise ConnectError(f"TLS handshake with {where} failed: {exc}", retryable=False) from exc
    except OSError as exc:
        raise ConnectError(f"cannot connect to {where}: {exc.strerror or exc}",
                           retryable=True) from exc
    reading = _Reading(conn, reader, limit, where)
    try:
        writer.write(request)
        await writer.drain()
        return await reading.answer()
    except h11.RemoteProtocolError as exc:
        if reading.eof:  # h11 says the server closed before the answer was complete
            if not reading.seen:
                raise no_answer(f"{where} closed the connection without answering") from None
            when = "mid-answer" if reading.status is not None else "before answering"
            raise ConnectionLostError(f"{where} closed the connection {when}") from None
        if reading.status is None and reading.buffered > MAX_HEAD:
            raise ProtocolError(f"the HTTP answer of {where} has oversized headers "
                                f"(over {MAX_HEAD} bytes)") from None
        raise ProtocolError(f"{where} did not answer valid HTTP/1.x: {exc}") from None
    except OSError as exc:
        when = "mid-answer" if reading.status is not None else "before answering"
        raise ConnectionLostError(f"{where} failed {when}: {exc.strerror or exc}") from exc
    finally:
        writer.transport.abort()  # the answer is read (or given up): nothing to say


class _Reading:
    """The answer as h11 parses it from the bytes read, and how far it got."""

    def __init__(self, conn: h11.Connection, reader: asyncio.StreamReader, limit: int,
                 where: str) -> None:
        self.conn, self.reader, self.limit, self.where = conn, reader, limit, where
        self.status: int | None = None
        self.seen = False  # any byte of an answer arrived
        self.eof = False
        self.buffered = 0  # bytes read while no answer head was complete

    async def next_event(self) -> object:
        while (event := self.conn.next_event()) is h11.NEED_DATA:
            data = await self.reader.read(_READ)
            self.seen = self.seen or bool(data)
            self.eof = not data
            if self.status is None:
                self.buffered += len(data)
            self.conn.receive_data(data)  # b"": the server closed its side
        return event

    async def answer(self) -> Answer:
        fields: dict[str, str] = {}
        while True:
            event = await self.next_event()
            if isinstance(event, h11.Response):
                break  # an InformationalResponse (100 Continue...) is skipped
        self.status = status = event.status_code
        for name, value in event.headers:
            key, text = name.decode("latin-1"), value.decode("latin-1")
            fields[key] = f"{fields[key]}, {text}" if key in fields else text
        declared = fields.get("content-length", "")
        if declared.isdigit() and int(declared) > self.limit:
            return self.over(status, fields)
        body = bytearray()
        while not isinstance(event := await self.next_event(), h11.EndOfMessage):
            if isinstance(event, h11.Data):
                body += event.data
                if len(body) > self.limit:
                    return self.over(status, fields)
        return status, fields, bytes(body)

    def over(self, status: int, fields: dict[str, str]) -> Answer:
        if status >= 400:  # the status is the answer; the body is not needed
            return status, fields, None
        raise ProtocolError(f"the answer of {self.where} exceeds {self.limit} bytes")
