"""The fast transport, on ``picows``: the only module that imports it.

:class:`PicowsTransport` implements the :class:`~envlink._transports.base.Transport`
seam with the same contract as the ``websockets`` one (``_transports/websocket.py``):
the same frame size and JSON value limits, keepalive pings with the same settings,
the same close codes and typed errors, handshake headers and credentials, TLS with a
verifying default context. picows parses frames in C and hands each one to a
listener; this module assembles fragmented messages, answers close frames and turns
every picows, ``OSError`` and ``asyncio`` failure into envlink's own tree.

Two things picows does not do are left to the ``websockets`` transport, each said
once in the log: a proxied connection (``HTTPS_PROXY``..., or ``proxy=``: one rule,
``envlink._transports.proxy``) and ``compression="deflate"`` (permessage-deflate).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import socket
import ssl as ssl_module
import urllib.parse
from collections.abc import Mapping
from typing import Any

from picows import (
    WSCloseCode,
    WSError,
    WSFrame,
    WSHandshakeError,
    WSInvalidStatusError,
    WSListener,
    WSMsgType,
    WSProtocolError,
    WSTransport,
    ws_connect,
)

from envlink._config import ConnectionOptions, is_sensitive_name, redact_text
from envlink._deadlines import bounded
from envlink._errors import (
    ConnectError,
    ConnectionLostError,
    EnvlinkError,
    HandshakeRejectedError,
    ProtocolError,
)
from envlink._sansio.protocol import EXTENSION_HEADER, EXTENSION_VERSION, Extensions
from envlink._transports.base import Endpoint, NotWrittenError, RpcAnswer, Transport
from envlink._transports.http import post_rpc, retry_after_seconds
from envlink._transports.proxy import resolve_proxy

__all__ = ["PicowsConnection", "PicowsTransport"]

_log = logging.getLogger("envlink.transport")

_TEXT = WSMsgType.TEXT
_BINARY = WSMsgType.BINARY
_CONTINUATION = WSMsgType.CONTINUATION
_CLOSE = WSMsgType.CLOSE
_PONG = WSMsgType.PONG

# WebSocket close codes (RFC 6455, section 7.4.1).
_PROTOCOL_ERROR = 1002
_INVALID_DATA = 1007
_TOO_BIG = 1009
#: Redirects followed on one upgrade, as websockets does.
_MAX_REDIRECTS = 10
#: picows's read buffer per connection starts this small and grows with the frames:
#: an idle session keeps only this much.
_READ_BUFFER = 2048
#: The marker recv() is woken with when the connection is gone.
_GONE = object()


class _QuietLogger(logging.LoggerAdapter):  # type: ignore[type-arg]
    """picows's log, at DEBUG: it reports each connection and each failure at INFO and
    ERROR, which envlink reports itself (typed errors, its own events).

    Its own lower level (the raw upgrade request and response, credentials and the
    resume token in them) is never enabled. An adapter, not a ``Logger``: picows then
    keeps no child logger per connection.
    """

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        if level >= logging.DEBUG and self.logger.isEnabledFor(logging.DEBUG):
            super().log(logging.DEBUG, msg, *(
                redact_text(a) if isinstance(a, str) else "<bytes>"
                if isinstance(a, (bytes, bytearray, memoryview)) else a for a in args),
                **kwargs)

    def isEnabledFor(self, level: int) -> bool:
        return level >= logging.DEBUG and bool(self.logger.isEnabledFor(logging.DEBUG))


_PICOWS_LOGGER = _QuietLogger(logging.getLogger("picows.client"), {})


class _Listener(WSListener):
    """Receives picows's frames: whole messages queued for :meth:`PicowsConnection.recv`.

    Slots, and a queue made only while a message waits for ``recv()`` (an answer
    usually finds its waiter): an idle connection keeps neither a ``__dict__`` nor a
    deque's first block (about 0.9 KiB together).
    """

    __slots__ = ("gone", "max_size", "messages", "parts", "parts_size", "pongs", "waiter")

    def __init__(self, max_size: int) -> None:
        self.max_size = max_size
        self.messages: collections.deque[str | bytes] | None = None
        self.waiter: asyncio.Future[Any] | None = None
        self.parts: list[bytes] | None = None
        self.parts_size = 0
        self.gone = False
        #: The probes' pings waiting for their pong (made with the first probe).
        self.pongs: dict[bytes, asyncio.Future[None]] | None = None

    def _deliver(self, message: str | bytes) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(message)
        elif self.messages is None:
            self.messages = collections.deque((message,))
        else:
            self.messages.append(message)

    def take(self) -> str | bytes:
        """The oldest queued message (there is one); the queue goes once empty."""
        messages = self.messages
        assert messages is not None
        message = messages.popleft()
        if not messages:
            self.messages = None
        return message

    def on_ws_frame(self, transport: WSTransport, frame: WSFrame) -> None:
        kind = frame.msg_type
        if kind is _TEXT and frame.fin and self.parts is None:  # the common frame
            # Its bytes, not a str: the frame decoder's parser reads (and checks) UTF-8.
            self._deliver(frame.get_payload_as_bytes())
            return
        if kind is _TEXT or kind is _BINARY:
            if self.parts is not None:
                raise WSProtocolError(WSCloseCode.PROTOCOL_ERROR,
                                      "a new message began inside a fragmented one")
            payload = frame.get_payload_as_bytes()
            if frame.fin:
                self._deliver(payload)
                return
            self.parts, self.parts_size = [payload], len(payload)
        elif kind is _CONTINUATION:
            parts = self.parts
            if parts is None:
                raise WSProtocolError(WSCloseCode.PROTOCOL_ERROR,
                                      "a continuation frame without a message")
            self.parts_size += frame.payload_size
            if self.parts_size > self.max_size:
                # The whole message is held to its limit, not each frame only.
                raise WSProtocolError(WSCloseCode.MESSAGE_TOO_BIG,
                                      f"message larger than {self.max_size} bytes")
            parts.append(frame.get_payload_as_bytes())
            if frame.fin:
                self.parts = None
                self._deliver(b"".join(parts))
        elif kind is _CLOSE:
            # Answer the peer's close (once: picows sends nothing after its own), then
            # end the TCP connection: the closing handshake is complete.
            transport.send_close(frame.get_close_code())
            transport.disconnect()
        elif kind is _PONG:
            self._pong(frame.get_payload_as_bytes())

    def is_user_specific_pong(self, frame: WSFrame) -> bool:
        # Asked only while picows's keepalive waits for a pong: a probe's pong is one too.
        if frame.msg_type is _PONG:
            self._pong(frame.get_payload_as_bytes())
            return True
        return False

    def _pong(self, payload: bytes) -> None:
        waiter = None if self.pongs is None else self.pongs.pop(payload, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def on_ws_disconnected(self, transport: WSTransport) -> None:
        self.gone = True
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(_GONE)
        pongs, self.pongs = self.pongs, None
        for pong in (pongs or {}).values():
            if not pong.done():
                pong.set_exception(ConnectionResetError("connection closed"))


class PicowsConnection:
    """One open WebSocket connection on picows to a server's ``/ws`` endpoint.

    Attributes:
        extensions: what the server advertised in its upgrade response.
    """

    __slots__ = ("_close_timeout", "_last_frame_wait", "_listener", "_ws", "extensions")

    def __init__(self, ws: WSTransport, listener: _Listener, extensions: Extensions,
                 options: ConnectionOptions) -> None:
        self._ws = ws
        self._listener = listener
        self.extensions = extensions
        self._last_frame_wait = options.last_frame_wait
        self._close_timeout = options.close_timeout

    @property
    def is_open(self) -> bool:
        """Whether frames can still be sent."""
        ws = self._ws
        return not (ws.is_disconnected or ws.is_close_frame_sent or self._listener.gone)

    async def send(self, text: str | bytes) -> None:
        """Send one text frame (``bytes``: its UTF-8 text, as it is).

        Raises:
            NotWrittenError: the connection was closed before anything was written.
            ConnectionLostError: the connection failed while writing.
        """
        ws = self._ws
        if ws.is_disconnected or ws.is_close_frame_sent:
            raise NotWrittenError("connection is closed; the request was not sent")
        try:
            ws.send(_TEXT, text)
        except (OSError, WSError, RuntimeError) as exc:
            raise ConnectionLostError(f"connection lost while sending: {exc}") from exc

    async def recv(self) -> str | bytes:
        """Receive one message: its bytes (a text message's UTF-8, as it came).

        Raises:
            ConnectionLostError: the connection closed or the peer stopped answering pings.
            ProtocolError: the peer broke the WebSocket protocol (e.g. an oversize frame).
        """
        listener = self._listener
        if listener.messages:
            return listener.take()
        if listener.gone:
            raise self._closed_error()
        waiter = listener.waiter = asyncio.get_running_loop().create_future()
        try:
            message = await waiter
        finally:
            listener.waiter = None
        if message is _GONE:
            raise self._closed_error()
        return message  # type: ignore[no-any-return]

    def _closed_error(self) -> EnvlinkError:
        """Sort a closed connection as the websockets transport does: the peer's fault
        or ours is not a lost connection (not retried, no recovery)."""
        handshake = self._ws.close_handshake
        sent = handshake.sent if handshake is not None else None
        received = handshake.recv if handshake is not None else None
        sent_code = _code(sent.code) if sent is not None and received is None else None
        received_code = _code(received.code) if received is not None else None
        reason = _close_reason(sent if received is None else received)
        if sent_code == _TOO_BIG:
            return ProtocolError(f"server sent a frame larger than the limit ({reason})")
        if sent_code in (_PROTOCOL_ERROR, _INVALID_DATA):
            return ProtocolError(f"server broke the WebSocket protocol ({reason})")
        if received_code == _TOO_BIG:
            return ProtocolError(f"server refused a message larger than its size limit "
                                 f"({reason})")
        return ConnectionLostError(f"connection lost: {reason}")

    async def probe(self, timeout: float) -> bool:
        """Ping the peer; ``True`` if it answered within ``timeout``. Never raises."""
        if not self.is_open:
            return False
        payload = os.urandom(4)
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        listener = self._listener
        if listener.pongs is None:
            listener.pongs = {}
        listener.pongs[payload] = waiter
        try:
            async with bounded(timeout):
                self._ws.send_ping(payload)
                await waiter
        except (TimeoutError, OSError, WSError, RuntimeError):
            return False
        finally:
            if listener.pongs is not None:
                listener.pongs.pop(payload, None)
        return True

    async def take_buffered(self) -> str | bytes | None:
        """A frame the server sent before closing, if one is still buffered.

        A server at capacity answers the upgrade, sends an unsolicited error frame
        and closes; that frame explains the close and must not be lost.
        """
        if self.is_open:
            return None
        listener = self._listener
        if listener.messages:
            return listener.take()
        if listener.gone:
            return None
        try:
            async with bounded(self._last_frame_wait):
                return await self.recv()
        except (EnvlinkError, TimeoutError):
            return None

    async def close(self, timeout: float | None) -> None:
        """Close gracefully, waiting at most ``timeout``; then drop.

        Raises nothing but a cancellation of the caller, which is passed on (after
        dropping the connection) rather than swallowed.
        """
        ws = self._ws
        # As websockets' close(): the peer's answer is awaited close_timeout at most.
        wait = self._close_timeout if timeout is None else min(timeout, self._close_timeout)
        try:
            if not ws.is_disconnected:
                ws.send_close(WSCloseCode.OK)
                async with bounded(wait):
                    await ws.wait_disconnected()
        except asyncio.CancelledError:
            self.abort()
            raise
        except Exception:
            self.abort()

    def abort(self) -> None:
        """Drop the TCP connection at once, without a closing handshake."""
        with contextlib.suppress(Exception):
            self._ws.disconnect(False)


def _code(code: Any) -> int:
    return int(getattr(code, "value", code))


def _close_reason(info: Any) -> str:
    if info is None:
        return "no close frame (connection dropped)"
    code = _code(info.code)
    if code == 0:
        return "no close frame (connection dropped)"
    reason = f" {info.reason}" if info.reason else ""
    return f"close code {code}{reason}"


async def _socket_for(host: str, port: int, holder: list[socket.socket]) -> socket.socket:
    """A connected TCP socket to ``host:port``, kept in ``holder`` so that the caller
    can shut it down if the handshake is abandoned (picows would leave it open)."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    last: OSError | None = None
    for family, kind, proto, _name, address in infos:
        sock = socket.socket(family, kind, proto)
        try:
            sock.setblocking(False)
            await loop.sock_connect(sock, address)
        except OSError as exc:
            sock.close()
            last = exc
            continue
        except BaseException:
            sock.close()
            raise
        holder.append(sock)
        return sock
    raise last if last is not None else OSError(f"no address found for {host}")


def _origin(url: str) -> tuple[bool, str, int]:
    parts = urllib.parse.urlsplit(url)
    secure = parts.scheme == "wss"
    return secure, (parts.hostname or "").lower(), parts.port or (443 if secure else 80)


async def _open(url: str, headers: list[tuple[str, str]], options: ConnectionOptions,
                where: str) -> tuple[WSTransport, _Listener]:
    """The upgrade, redirects followed as websockets follows them (credentials are not
    sent to another origin, ``wss`` never goes to ``ws``)."""
    ping_interval, ping_timeout = options.ping_interval, options.ping_timeout
    keepalive = ping_interval is not None and ping_timeout is not None
    for _ in range(_MAX_REDIRECTS + 1):
        secure, host, port = _origin(url)
        holder: list[socket.socket] = []

        async def connected(_parsed: Any, host: str = host, port: int = port,
                            holder: list[socket.socket] = holder) -> socket.socket:
            return await _socket_for(host, port, holder)

        kwargs: dict[str, Any] = {}
        if secure:
            kwargs["ssl_context"] = options.ssl or ssl_module.create_default_context()
            kwargs["server_hostname"] = host
        try:
            ws, listener = await ws_connect(
                lambda: _Listener(options.max_message_size), url,
                websocket_handshake_timeout=None, logger_name=_PICOWS_LOGGER,
                enable_auto_ping=keepalive,
                # picows pings after this long without data from the peer (websockets
                # pings every interval): a dead peer is found within the same bound.
                auto_ping_idle_timeout=max(ping_interval or 0.0, ping_timeout or 0.0),
                auto_ping_reply_timeout=ping_timeout or 0.0,
                max_frame_size=options.max_message_size, extra_headers=headers,
                max_redirects=0, read_buffer_init_size=_READ_BUFFER,
                socket_factory=connected, use_aiofastnet=False, **kwargs)
        except WSInvalidStatusError as exc:
            response = exc.response
            status = int(response.status) if response is not None else 0
            location = response.headers.get("Location") if response is not None else None
            if status in (301, 302, 303, 307, 308) and location:
                target = urllib.parse.urljoin(url, location)
                target = target.replace("http://", "ws://", 1).replace("https://", "wss://", 1)
                new = _origin(target)
                if secure and not new[0]:
                    raise ConnectError(f"{where}: cannot follow a redirect to a non-secure URL",
                                       retryable=False) from exc
                if new != (secure, host, port):
                    headers = [(k, v) for k, v in headers if not is_sensitive_name(k)]
                url = target
                continue
            raise HandshakeRejectedError(
                status, retry_after=retry_after_seconds(
                    response.headers.get("Retry-After") if response is not None else None)
            ) from exc
        except BaseException:
            for sock in holder:  # the handshake was abandoned: end its connection
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
            raise
        if not isinstance(listener, _Listener):  # picows's sign of a connection closed
            raise ConnectError(f"{where} closed the connection during the handshake",
                               retryable=True)
        return ws, listener
    raise ConnectError(f"{where} redirected more than {_MAX_REDIRECTS} times", retryable=False)


async def open_connection(
    endpoint: Endpoint,
    options: ConnectionOptions,
    *,
    extra_headers: Mapping[str, str] | None = None,
    open_timeout: float | None = None,
    offer_extensions: bool = True,
) -> PicowsConnection:
    """Open a WebSocket connection on picows, offering envlink's extensions.

    Raises:
        ConnectError: refused, unreachable, timed out, TLS failure (retryable or not).
        HandshakeRejectedError: the server answered the upgrade with an HTTP error.
    """
    headers: list[tuple[str, str]] = list(options.headers)
    if endpoint.auth_header is not None and not any(
            k.lower() == "authorization" for k, _ in headers):
        headers.append(("Authorization", endpoint.auth_header))
    if offer_extensions:
        headers.append((EXTENSION_HEADER, EXTENSION_VERSION))
    if extra_headers:
        headers.extend(extra_headers.items())
    if options.user_agent is not None:
        headers.append(("User-Agent", options.user_agent))
    where = endpoint.display
    try:
        async with bounded(open_timeout):
            ws, listener = await _open(endpoint.connect_url, headers, options, where)
    except EnvlinkError:
        raise
    except ssl_module.SSLCertVerificationError as exc:
        raise ConnectError(f"TLS verification failed for {where}: {exc.verify_message}",
                           retryable=False) from exc
    except (asyncio.TimeoutError, TimeoutError) as exc:
        raise ConnectError(f"timed out opening {where}", retryable=True) from exc
    except WSHandshakeError as exc:
        # An answer that is not a WebSocket upgrade is a protocol violation: fatal.
        raise ConnectError(f"WebSocket handshake with {where} failed: "
                           f"{redact_text(str(exc))}", retryable=False) from exc
    except OSError as exc:
        reason = exc.strerror or exc.__class__.__name__
        raise ConnectError(f"cannot connect to {where}: {reason}", retryable=True) from exc
    except (WSError, ValueError, RuntimeError) as exc:
        raise ConnectError(f"cannot connect to {where}: {redact_text(str(exc))}",
                           retryable=False) from exc
    response = ws.response
    response_headers: dict[str, str] = {}
    if response is not None:
        response_headers = dict(response.headers.items())
        # Read once, here: the response and request the connection keeps no longer
        # hold the headers, nor the credentials and the session token among them.
        response.headers.clear()
    request = ws.request
    if request is not None:
        request.headers.clear()
    return PicowsConnection(ws, listener, Extensions.from_headers(response_headers), options)


class PicowsTransport:
    """A :class:`~envlink._transports.base.Transport` on picows, for ``ws://`` and ``wss://``.

    A proxied URL and ``compression="deflate"`` go through ``fallback`` (the
    websockets transport), said once in the log.
    """

    __slots__ = ("_fallback",)

    def __init__(self, fallback: Transport | None = None) -> None:
        self._fallback = fallback

    def _websockets(self, why: str) -> Any:
        if why not in _said:
            _said.add(why)
            _log.info("envlink.transport_fallback: %s: using the websockets transport", why)
        if self._fallback is None:
            from envlink._transports.websocket import WebSocketTransport

            self._fallback = WebSocketTransport()
        return self._fallback

    async def connect(
        self,
        endpoint: Endpoint,
        options: ConnectionOptions,
        *,
        headers: Mapping[str, str],
        timeout: float | None,
        offer_extensions: bool = True,
    ) -> Any:
        """Open one connection (see :func:`open_connection`).

        Raises:
            ConnectError: it could not be opened (``retryable`` says whether to retry).
        """
        if options.compression is not None:
            return await self._websockets("picows has no permessage-deflate").connect(
                endpoint, options, headers=headers, timeout=timeout,
                offer_extensions=offer_extensions)
        if resolve_proxy(endpoint.ws_url, options.proxy) is not None:
            return await self._websockets("a proxied connection").connect(
                endpoint, options, headers=headers, timeout=timeout,
                offer_extensions=offer_extensions)
        return await open_connection(endpoint, options, extra_headers=headers,
                                     open_timeout=timeout, offer_extensions=offer_extensions)

    async def rpc(
        self,
        endpoint: Endpoint,
        options: ConnectionOptions,
        method: str,
        params: Mapping[str, Any],
        *,
        request_id: int,
    ) -> RpcAnswer:
        """Post one JSON-RPC request to the server's ``/mcp`` (see :class:`RpcTransport`)."""
        return await post_rpc(endpoint, options, method, params, request_id=request_id)

    def __repr__(self) -> str:
        return "PicowsTransport()"


#: The fallbacks already said in the log (once each per process).
_said: set[str] = set()
