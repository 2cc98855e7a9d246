"""One HTTP/1.1 request on a direct connection, on asyncio streams (no proxy).

Why a second path beside httpx: importing httpx with httpcore, h11 and anyio costs
60-500 ms on a busy machine, and a client under ``on_session_lost="auto"`` sends
``POST /mcp`` (``openenv/session/create``) before its first upgrade: that import was
almost all of what its first connect cost more than a ``"raise"`` one
(docs/performance.md). A direct request needs none of it: one TCP (or TLS)
connection, one request with ``Connection: close``, one answer read by its framing
(``Content-Length``, chunked, or until the server closes). A request through a proxy
still goes through httpx (:mod:`envlink._transports.http`), which also validates the
headers and follows redirects for both paths.

Failures are envlink's errors, as httpx's are translated there: :class:`ConnectError`
while connecting (not retried for TLS verification), :class:`NoAnswerError` for a
server that closed without a byte, :class:`ConnectionLostError` once the answer began,
:class:`ProtocolError` for an answer that is not HTTP/1.x or whose head is too large.
"""

from __future__ import annotations

import asyncio
import ssl as ssl_module
from urllib.parse import urlsplit

from envlink._errors import ConnectError, ConnectionLostError, ProtocolError

__all__ = ["MAX_HEAD", "MAX_HEADERS", "Answer", "exchange"]

#: Bounds on an answer's head, as h11's (64 KiB) and the standard library's (100 lines).
MAX_HEAD = 64 * 1024
MAX_HEADERS = 100

#: Status, headers (names in lower case), and the body or ``None`` when it was over the
#: limit on an error status (the status is the answer; the body is not needed).
Answer = tuple[int, dict[str, str], bytes | None]


class _Lost(Exception):
    """The server closed the connection before the answer was complete."""


async def exchange(method: str, url: str, head: list[tuple[str, str]], payload: bytes | None,
                   *, ssl: ssl_module.SSLContext | None, limit: int, where: str,
                   no_answer: type[ConnectionLostError]) -> Answer:
    """Send one request to ``url`` over a direct connection and read its answer.

    Args:
        method: ``GET``, ``POST``...
        url: an ``http://`` or ``https://`` URL (its path and query are sent).
        head: the request's headers, already validated (no CR/LF/NUL).
        payload: the body, or ``None``.
        ssl: the TLS context for ``https://``.
        limit: the largest body kept, in bytes.
        where: the URL as errors may show it (redacted).
        no_answer: the error for a server that closed without answering.

    Raises:
        ConnectError: the connection could not be made; nothing was sent.
        ConnectionLostError: the connection failed after the request was sent.
        ProtocolError: the answer is not HTTP/1.x, its head too large, or its body
            over ``limit`` on a success status.
    """
    parts = urlsplit(url)
    secure = parts.scheme == "https"
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    host = parts.hostname or ""
    port = parts.port or (443 if secure else 80)
    netloc = f"[{host}]" if ":" in host else host
    lines = [f"{method} {target} HTTP/1.1",
             f"Host: {netloc}" + ("" if port == (443 if secure else 80) else f":{port}")]
    lines += [f"{name}: {value}" for name, value in head]
    if payload is not None:
        lines.append(f"Content-Length: {len(payload)}")
    try:
        request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (payload or b"")
    except UnicodeEncodeError as exc:
        raise ConnectError(f"a header for {where} is not Latin-1 text (refused)",
                           retryable=False) from exc
    try:
        reader, writer = await asyncio.open_connection(
            host, port, ssl=ssl if secure else None,
            server_hostname=host if secure else None, limit=MAX_HEAD)
    except ssl_module.SSLCertVerificationError as exc:
        raise ConnectError(f"TLS verification failed for {where}: {exc.verify_message}",
                           retryable=False) from exc
    except ssl_module.SSLError as exc:
        raise ConnectError(f"TLS handshake with {where} failed: {exc}", retryable=False) from exc
    except OSError as exc:
        raise ConnectError(f"cannot connect to {where}: {exc.strerror or exc}",
                           retryable=True) from exc
    started = False
    try:
        writer.write(request)
        await writer.drain()
        status, fields = await _read_head(reader)
        started = True
        body = await _read_body(reader, fields, status, limit, where)
        return status, fields, body
    except _Lost as exc:
        if not started and not exc.args[0]:
            raise no_answer(f"{where} closed the connection without answering") from None
        when = "mid-answer" if started else "before answering"
        raise ConnectionLostError(f"{where} closed the connection {when}") from None
    except (asyncio.LimitOverrunError, ValueError) as exc:
        if not started:
            raise ProtocolError(f"the HTTP answer of {where} has oversized headers "
                                f"(over {MAX_HEAD} bytes)") from exc
        raise ProtocolError(f"the answer of {where} is not valid chunked HTTP") from exc
    except OSError as exc:
        when = "mid-answer" if started else "before answering"
        raise ConnectionLostError(f"{where} failed {when}: {exc.strerror or exc}") from exc
    finally:
        writer.transport.abort()  # the answer is read (or given up): nothing to say


async def _line(reader: asyncio.StreamReader, seen: bool) -> bytes:
    try:
        return await reader.readuntil(b"\n")
    except asyncio.IncompleteReadError as exc:
        raise _Lost(seen or bool(exc.partial)) from None


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    size, seen = 0, False
    while True:
        line = await _line(reader, seen)
        seen = True
        size += len(line)
        parts = line.decode("latin-1").rstrip("\r\n").split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not (
                len(parts[1]) == 3 and parts[1].isdigit()):
            raise ProtocolError("the server did not answer valid HTTP/1.x "
                                f"(status line {line[:40]!r})")
        status = int(parts[1])
        fields: dict[str, str] = {}
        count = 0
        while True:
            line = await _line(reader, True)
            size += len(line)
            if size > MAX_HEAD or count > MAX_HEADERS:
                raise ProtocolError(f"the HTTP answer has oversized headers (over "
                                    f"{MAX_HEADERS} header lines or {MAX_HEAD} bytes)")
            text = line.decode("latin-1").rstrip("\r\n")
            if not text:
                break
            name, sep, value = text.partition(":")
            if not sep or not name or any(c in name for c in " \t"):
                raise ProtocolError(f"the server did not answer valid HTTP/1.x "
                                    f"(header line {text[:40]!r})")
            count += 1
            key = name.lower()
            fields[key] = f"{fields[key]}, {value.strip()}" if key in fields else value.strip()
        if not 100 <= status < 200:  # an interim answer (100 Continue...) is skipped
            return status, fields


async def _read_body(reader: asyncio.StreamReader, fields: dict[str, str], status: int,
                     limit: int, where: str) -> bytes | None:
    def over() -> bytes | None:
        if status >= 400:
            return None
        raise ProtocolError(f"the answer of {where} exceeds {limit} bytes")

    if status in (204, 304):
        return b""
    if "chunked" in fields.get("transfer-encoding", "").lower():
        data = bytearray()
        while True:
            size = int((await _line(reader, True)).split(b";", 1)[0].strip(), 16)
            if size == 0:
                for _ in range(MAX_HEADERS + 1):  # trailers, then the blank line
                    if not (await _line(reader, True)).strip():
                        return bytes(data)
                raise ProtocolError(f"the answer of {where} has over {MAX_HEADERS} trailers")
            if len(data) + size > limit:
                return over()
            data += await _exactly(reader, size)
            await _exactly(reader, 2)  # the chunk's CRLF
    declared = fields.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise ProtocolError(f"the answer of {where} has a bad Content-Length")
        if int(declared) > limit:
            return over()
        return await _exactly(reader, int(declared))
    data = bytearray()
    while chunk := await reader.read(65536):
        data += chunk
        if len(data) > limit:
            return over()
    return bytes(data)


async def _exactly(reader: asyncio.StreamReader, n: int) -> bytes:
    try:
        return await reader.readexactly(n)
    except asyncio.IncompleteReadError:
        raise _Lost(True) from None
