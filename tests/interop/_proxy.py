"""A TCP proxy on 127.0.0.1 that cuts connections at chosen moments.

Runs in envlink's interpreter, on its own event-loop thread, so sync and async
tests can both use it. It forwards bytes unchanged; on WebSocket connections it
also reads the frames (unmasking the client's copy for inspection only) so a test
can cut a connection at a precise point of the exchange:

- :meth:`CuttingProxy.cut_all` — now, between calls: every proxied connection
  is dropped (both sides, no close frame), as a network blip drops them;
- ``Cut(when="before_forward")`` — the client has written its request frame but
  the proxy drops it: the server never sees it;
- ``Cut(when="after_forward")`` — the request is forwarded and the connection
  dropped at once: whether the server applies it is the server's race;
- ``Cut(when="after_answer")`` — the request is forwarded, the server applies it
  and answers, and the proxy drops the answer: the server applied it, the client
  never learns the result.

A cut is armed once and fires on the ``nth`` client text message whose JSON
``type`` matches; :attr:`ArmedCut.fired` is a ``threading.Event`` for the test.
Plain HTTP (``POST /mcp``) passes through untouched. The one change the proxy
makes: it removes ``Sec-WebSocket-Extensions`` from upgrade requests, so no
compression is negotiated and every message can be read.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["ArmedCut", "Cut", "CuttingProxy"]

When = Literal["before_forward", "after_forward", "after_answer"]
_TIMEOUT = 10.0


@dataclass(frozen=True)
class Cut:
    """Where to cut: at the ``nth`` client message of JSON ``type`` ``frame_type``."""

    when: When
    frame_type: str = "step"
    nth: int = 1


@dataclass
class ArmedCut:
    """A cut waiting for its message; ``fired`` is set once the connection was cut."""

    cut: Cut
    seen: int = 0
    fired: threading.Event = field(default_factory=threading.Event)
    #: The client message that triggered the cut (parsed JSON).
    message: dict[str, Any] | None = None
    #: For ``after_answer``: the server's answer that was dropped (parsed JSON).
    dropped_answer: dict[str, Any] | None = None


class _Frames:
    """Incremental WebSocket frame reader for one direction of one connection."""

    def __init__(self, masked: bool) -> None:
        self._masked = masked
        self._buffer = bytearray()
        self._pending_raw = bytearray()
        self._pending_payload = bytearray()
        self._pending_opcode: int | None = None
        self._pending_compressed = False

    def feed(self, data: bytes) -> list[tuple[bytes, dict[str, Any] | None, bool]]:
        """Return complete units: (raw bytes, parsed JSON text message or None, is_text)."""
        self._buffer.extend(data)
        units: list[tuple[bytes, dict[str, Any] | None, bool]] = []
        while True:
            frame = self._take_frame()
            if frame is None:
                return units
            raw, fin, opcode, rsv1, payload = frame
            if opcode >= 0x8:  # control frames go through at once, even mid-message
                units.append((raw, None, False))
                continue
            if opcode in (0x1, 0x2):
                self._pending_opcode = opcode
                self._pending_compressed = rsv1
                self._pending_raw = bytearray()
                self._pending_payload = bytearray()
            self._pending_raw.extend(raw)
            self._pending_payload.extend(payload)
            if not fin:
                continue
            is_text = self._pending_opcode == 0x1
            parsed: dict[str, Any] | None = None
            if is_text and not self._pending_compressed:
                with contextlib.suppress(ValueError, UnicodeDecodeError):
                    value = json.loads(bytes(self._pending_payload).decode("utf-8"))
                    if isinstance(value, dict):
                        parsed = value
            units.append((bytes(self._pending_raw), parsed, is_text))
            self._pending_opcode = None

    def _take_frame(self) -> tuple[bytes, bool, int, bool, bytes] | None:
        buf = self._buffer
        if len(buf) < 2:
            return None
        fin = bool(buf[0] & 0x80)
        rsv1 = bool(buf[0] & 0x40)
        opcode = buf[0] & 0x0F
        masked = bool(buf[1] & 0x80)
        length = buf[1] & 0x7F
        offset = 2
        if length == 126:
            if len(buf) < 4:
                return None
            length = struct.unpack("!H", buf[2:4])[0]
            offset = 4
        elif length == 127:
            if len(buf) < 10:
                return None
            length = struct.unpack("!Q", buf[2:10])[0]
            offset = 10
        mask = b""
        if masked:
            if len(buf) < offset + 4:
                return None
            mask = bytes(buf[offset:offset + 4])
            offset += 4
        end = offset + length
        if len(buf) < end:
            return None
        payload = bytes(buf[offset:end])
        if masked:
            payload = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        raw = bytes(buf[:end])
        del buf[:end]
        return raw, fin, opcode, rsv1, payload


def _without_extensions(header: bytes) -> bytes:
    """An upgrade request without its Sec-WebSocket-Extensions offer (no compression)."""
    lines = header.split(b"\r\n")
    kept = [line for line in lines
            if not line.lower().startswith(b"sec-websocket-extensions:")]
    return b"\r\n".join(kept)


class _Link:
    """One proxied connection: client side and server side."""

    def __init__(self, client: asyncio.StreamWriter, server: asyncio.StreamWriter) -> None:
        self.client = client
        self.server = server
        self.path: str | None = None
        self.websocket = False
        self.cut = False
        #: Set when this link forwarded the message of an ``after_answer`` cut.
        self.awaiting_answer: ArmedCut | None = None

    def drop(self) -> None:
        """Drop both sides at once: no close frame, no flush of what is queued."""
        self.cut = True
        for writer in (self.client, self.server):
            writer.transport.abort()


class CuttingProxy:
    """A loopback TCP proxy in front of one server port.

    Args:
        target_port: the server's port on 127.0.0.1 (see :meth:`retarget`).
    """

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.base_events.Server | None = None
        self._links: set[_Link] = set()
        self._armed: ArmedCut | None = None
        self._lock = threading.Lock()
        #: Paths of every upgrade or HTTP request seen, in order (e.g. ``/ws?session_id=..``).
        self.requests: list[str] = []
        #: How many connections were cut, by any means.
        self.cuts = 0
        #: While True, every WebSocket upgrade is dropped before it reaches the server
        #: (plain HTTP still passes).
        self.refuse_websockets = False

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> int:
        """Start listening on a free loopback port; return it."""
        ready: threading.Event = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)

            async def serve() -> None:
                self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
                self.port = self._server.sockets[0].getsockname()[1]
                ready.set()

            loop.run_until_complete(serve())
            loop.run_forever()
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

        self._thread = threading.Thread(target=run, name="cutting-proxy", daemon=True)
        self._thread.start()
        if not ready.wait(_TIMEOUT):
            raise RuntimeError("the proxy did not start")
        assert self.port is not None
        return self.port

    def stop(self) -> None:
        """Close every connection and the listener; join the thread."""
        if self._loop is None or self._thread is None:
            return

        async def shutdown() -> None:
            if self._server is not None:
                self._server.close()
            for link in list(self._links):
                link.drop()

        with contextlib.suppress(Exception):
            self._call(shutdown)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(_TIMEOUT)

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT`` of the proxy."""
        assert self.port is not None, "proxy not started"
        return f"http://127.0.0.1:{self.port}"

    def retarget(self, port: int) -> None:
        """Send new connections to another server port (a restarted server)."""
        self.target_port = port

    # ---------------------------------------------------------------- controls

    def cut_all(self) -> int:
        """Drop every open proxied connection now; return how many were dropped."""

        async def cut() -> int:
            links = [link for link in self._links if not link.cut]
            for link in links:
                link.drop()
            self.cuts += len(links)
            return len(links)

        return self._call(cut)

    def arm(self, cut: Cut) -> ArmedCut:
        """Arm a one-shot cut; it fires on the matching client message."""
        armed = ArmedCut(cut)
        with self._lock:
            if self._armed is not None and not self._armed.fired.is_set():
                raise RuntimeError("a cut is already armed")
            self._armed = armed
        return armed

    def open_websockets(self) -> int:
        """How many proxied WebSocket connections are open now."""

        async def count() -> int:
            return sum(1 for link in self._links if link.websocket and not link.cut)

        return self._call(count)

    def _call(self, make: Callable[[], Any]) -> Any:
        assert self._loop is not None
        future = asyncio.run_coroutine_threadsafe(make(), self._loop)
        return future.result(_TIMEOUT)

    # ---------------------------------------------------------------- forwarding

    async def _handle(self, client_reader: asyncio.StreamReader,
                      client_writer: asyncio.StreamWriter) -> None:
        try:
            server_reader, server_writer = await asyncio.open_connection(
                "127.0.0.1", self.target_port)
        except OSError:
            # Nothing listens behind the proxy (a server being restarted): the
            # client sees its connection closed, as with a refused one.
            client_writer.transport.abort()
            return
        link = _Link(client_writer, server_writer)
        self._links.add(link)
        try:
            await asyncio.gather(
                self._pump(link, client_reader, server_writer, upstream=True),
                self._pump(link, server_reader, client_writer, upstream=False),
                return_exceptions=True,
            )
        finally:
            self._links.discard(link)
            if not link.cut:
                for writer in (client_writer, server_writer):
                    writer.transport.abort()

    async def _pump(self, link: _Link, reader: asyncio.StreamReader,
                    writer: asyncio.StreamWriter, *, upstream: bool) -> None:
        head = bytearray()
        frames: _Frames | None = None
        passthrough = False
        while not link.cut:
            try:
                data = await reader.read(65536)
            except (ConnectionError, OSError):
                break
            if not data:
                # Half-close: pass the FIN on, as TCP would.
                with contextlib.suppress(OSError, RuntimeError):
                    if writer.can_write_eof():
                        writer.write_eof()
                break
            if passthrough:
                writer.write(data)
                continue
            if frames is None:
                head.extend(data)
                end = head.find(b"\r\n\r\n")
                if end < 0:
                    continue
                header, rest = bytes(head[:end + 4]), bytes(head[end + 4:])
                if upstream:
                    header = _without_extensions(header)
                first_line = header.split(b"\r\n", 1)[0].decode("latin-1")
                if upstream and self.refuse_websockets and (
                        b"upgrade: websocket" in header.lower()):
                    self.requests.append(first_line.split(" ")[1] if " " in first_line else "")
                    link.drop()
                    self.cuts += 1
                    return
                writer.write(header)
                if upstream:
                    link.path = first_line.split(" ")[1] if " " in first_line else None
                    self.requests.append(link.path or "")
                    is_upgrade = b"upgrade: websocket" in header.lower()
                    if not is_upgrade:
                        passthrough = True
                        writer.write(rest)
                        continue
                    link.websocket = True
                else:
                    if " 101 " not in first_line + " ":
                        passthrough = True
                        writer.write(rest)
                        continue
                frames = _Frames(masked=upstream)
                data = rest
                if not data:
                    continue
            for raw, message, is_text in frames.feed(data):
                if link.cut:
                    return
                if upstream and is_text:
                    verdict = self._client_message(link, message, raw)
                    if verdict == "cut":
                        return
                    if verdict == "forwarded":
                        continue
                if not upstream and is_text and link.awaiting_answer is not None:
                    armed, link.awaiting_answer = link.awaiting_answer, None
                    armed.dropped_answer = message
                    self._fire(link, armed)
                    return
                writer.write(raw)
            with contextlib.suppress(ConnectionError, OSError):
                await writer.drain()

    def _client_message(self, link: _Link, message: dict[str, Any] | None, raw: bytes
                        ) -> Literal["pass", "forwarded", "cut"]:
        """Apply an armed cut to a client message (forwarding it itself if need be)."""
        with self._lock:
            armed = self._armed
            if (armed is None or armed.fired.is_set() or message is None
                    or message.get("type") != armed.cut.frame_type):
                return "pass"
            armed.seen += 1
            if armed.seen < armed.cut.nth:
                return "pass"
            armed.message = message
            self._armed = None
        when = armed.cut.when
        if when == "before_forward":
            self._fire(link, armed)
            return "cut"
        link.server.write(raw)
        if when == "after_forward":
            # Hand the frame to the kernel, then drop: it is on its way to the server.
            link.cut = True
            link.server.transport.close()  # flushes what is buffered, then FIN
            link.client.transport.abort()
            self.cuts += 1
            armed.fired.set()
            return "cut"
        link.awaiting_answer = armed
        return "forwarded"

    def _fire(self, link: _Link, armed: ArmedCut) -> None:
        link.drop()
        self.cuts += 1
        armed.fired.set()
