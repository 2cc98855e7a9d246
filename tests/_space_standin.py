"""A loopback stand-in for a Hugging Face Space that is asleep, waking up, then awake.

Its first answers are scripted (``503``, then the HTML waking page with status
200, as the Hub serves them); after the script, every connection is passed
through to a real reference server. It records the ``Authorization`` header of
every request, to check where a token went.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

__all__ = ["SLEEPING_PAGE", "SpaceStandIn"]

SLEEPING_PAGE = (b"<!DOCTYPE html><html><head><title>Space is sleeping</title></head>"
                 b"<body>This Space is waking up</body></html>")


def _answer(status: int, location: str | None = None) -> bytes:
    if status == 307:
        return (b"HTTP/1.1 307 Temporary Redirect\r\nLocation: %s\r\nContent-Length: 0\r\n"
                b"Connection: close\r\n\r\n" % (location or "/").encode())
    if status == 503:
        body, kind, reason = b"Service Unavailable", b"text/plain", b"Service Unavailable"
    else:
        body, kind, reason = SLEEPING_PAGE, b"text/html; charset=utf-8", b"OK"
    return (b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n"
            b"Connection: close\r\n\r\n" % (status, reason, kind, len(body))) + body


class SpaceStandIn:
    """A TCP server on 127.0.0.1: scripted answers first, then a pass-through.

    Args:
        target_port: the real server that answers once the script is played.
        script: statuses of the first requests (``503``; ``200`` for the HTML page;
            ``307`` for a redirect to ``redirect_to`` plus the request's path);
            ``forever`` repeats the first one and never wakes.
    """

    def __init__(self, target_port: int, script: Sequence[int] = (503, 200), *,
                 forever: bool = False, redirect_to: str | None = None) -> None:
        self.target_port = target_port
        self.redirect_to = redirect_to
        self.script = list(script)
        self.forever = forever
        self.requests: list[tuple[str, str | None]] = []  # (request line, Authorization)
        self._server: asyncio.Server | None = None
        self.port = 0

    async def __aenter__(self) -> SpaceStandIn:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def scripted_left(self) -> int:
        return len(self.script)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            writer.close()
            return
        lines = head.decode("latin-1").split("\r\n")
        auth = next((line.split(":", 1)[1].strip() for line in lines[1:]
                     if line.lower().startswith("authorization:")), None)
        self.requests.append((lines[0], auth))
        if self.script:
            status = self.script[0] if self.forever else self.script.pop(0)
            path = lines[0].split(" ")[1] if " " in lines[0] else "/"
            writer.write(_answer(status, f"{self.redirect_to}{path}"))
            with contextlib.suppress(ConnectionError):
                await writer.drain()
            writer.close()
            return
        await self._pass_through(head, reader, writer)

    async def _pass_through(self, head: bytes, reader: asyncio.StreamReader,
                            writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        up_writer.write(head)

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError, asyncio.CancelledError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            with contextlib.suppress(Exception):
                dst.close()

        await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))
