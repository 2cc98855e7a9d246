"""A hostile WebSocket server on loopback: it completes the upgrade, then does as scripted.

Written on raw asyncio streams so that it can break every rule a real server keeps
(oversize frames, silence after a close, floods, trickles, bogus heads).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from typing import Any

__all__ = ["Script", "accept_upgrade", "frame", "hostile_server"]

_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def accept_upgrade(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                         extra: bytes = b"") -> bytes:
    """Read the client's upgrade request and accept it; return the request's head."""
    head = await reader.readuntil(b"\r\n\r\n")
    key = b""
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"sec-websocket-key:"):
            key = line.split(b":", 1)[1].strip()
    accept = base64.b64encode(hashlib.sha1(key + _GUID).digest())
    writer.write(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                 b"Connection: Upgrade\r\nSec-WebSocket-Accept: " + accept + b"\r\n"
                 + extra + b"\r\n")
    await writer.drain()
    return head


def frame(payload: bytes, *, opcode: int = 1, length: int | None = None, fin: bool = True) -> bytes:
    """An unmasked server frame; ``length`` may lie about the payload's size."""
    size = len(payload) if length is None else length
    first = (0x80 if fin else 0) | opcode
    if size < 126:
        header = struct.pack("!BB", first, size)
    elif size < 1 << 16:
        header = struct.pack("!BBH", first, 126, size)
    else:
        header = struct.pack("!BBQ", first, 127, size)
    return header + payload


@asynccontextmanager
async def hostile_server(script: Script, ssl: Any = None) -> AsyncIterator[str]:
    """Serve ``script`` on 127.0.0.1 (TLS with ``ssl``); yield its URL; abort all after."""
    writers: list[asyncio.StreamWriter] = []
    tasks: set[asyncio.Task[None]] = set()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        task = asyncio.current_task()
        assert task is not None
        tasks.add(task)  # type: ignore[arg-type]
        with suppress(ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            await script(reader, writer)

    server = await asyncio.start_server(handle, "127.0.0.1", 0, limit=1 << 20, ssl=ssl)
    try:
        yield f"{'wss' if ssl else 'ws'}://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        for writer in writers:
            writer.transport.abort()
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await server.wait_closed()
