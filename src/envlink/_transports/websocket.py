"""The default transport, on ``websockets``: the only module that imports it.

:class:`WebSocketTransport` implements the :class:`~envlink._transports.base.Transport`
seam. Every ``websockets``/``OSError``/``asyncio`` failure is translated here into
envlink's own tree, ``raise ... from exc``; nothing of websockets leaks past this
module.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl as ssl_module
from collections.abc import Mapping
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.datastructures import Headers
from websockets.exceptions import (
    ConnectionClosed,
    InvalidHandshake,
    InvalidProxy,
    InvalidStatus,
    InvalidURI,
    PayloadTooBig,
)
from websockets.exceptions import (
    ProtocolError as WsProtocolError,
)
from websockets.protocol import State
from websockets.uri import parse_uri

from envlink._config import REDACTED, ConnectionOptions, is_sensitive_name, redact_text, redact_url
from envlink._deadlines import bounded
from envlink._errors import (
    ConnectError,
    ConnectionLostError,
    EnvlinkError,
    HandshakeRejectedError,
    ProtocolError,
)
from envlink._sansio.protocol import EXTENSION_HEADER, EXTENSION_VERSION, Extensions
from envlink._speedups import text_sender, warm_read_buffers
from envlink._transports.base import Endpoint, NotWrittenError, RpcAnswer
from envlink._transports.http import post_rpc, retry_after_seconds
from envlink._transports.proxy import resolve_proxy

__all__ = ["CLIENT_LOGGER", "WebSocketConnection", "WebSocketTransport", "open_connection"]


class _RedactingLogger(logging.LoggerAdapter):  # type: ignore[type-arg]
    """The ``websockets.client`` logger, with every credential removed.

    At DEBUG websockets logs the request line (``> GET %s``, whose query may carry a
    token or a detached session's id) and each header as ``("> %s: %s", name,
    value)``, the server's resume token (``envlink-session``) included.
    """

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        if len(args) == 2 and isinstance(args[0], str) and is_sensitive_name(args[0]):
            args = (args[0], REDACTED)
        else:
            args = tuple(redact_url(a) if isinstance(a, str) and a.startswith("/")
                         else redact_text(a) if isinstance(a, str) else a for a in args)
        super().log(level, msg, *args, **kwargs)


class _Connect(connect):
    """websockets' ``connect``, dropping every credential on a cross-origin redirect.

    websockets drops ``Authorization`` and ``Cookie`` only; ``X-Api-Key``, the resume
    token and the other sensitive headers must not reach another origin either.
    (A redirect from ``wss`` to ``ws`` is refused by websockets itself.)
    """

    def process_redirect(self, exc: Exception) -> Exception | str:
        old = parse_uri(self.uri)  # self.uri: the URI being opened, on every websockets >= 15
        target = super().process_redirect(exc)
        if isinstance(target, str) and self.additional_headers is not None:
            new = parse_uri(target)
            if (old.secure, old.host, old.port) != (new.secure, new.host, new.port):
                self.additional_headers = Headers(
                    (k, v) for k, v in Headers(self.additional_headers).raw_items()
                    if not is_sensitive_name(k))
        return target


#: Given to every client connection (the server has its own, to the same rule).
CLIENT_LOGGER = _RedactingLogger(logging.getLogger("websockets.client"), {})


class _BoundedCloseConnection(ClientConnection):
    """websockets' client connection, dropped ``close_timeout`` after it failed.

    When websockets fails a connection (an oversize frame, a broken frame, a bad
    upgrade answer) it sends its close frame or EOF and waits for the peer to close
    TCP; a hostile peer that never does would hold ``recv()`` (or the handshake)
    for as long as it likes. Here the transport is aborted once ``close_timeout``
    has passed, which ends the wait with the error that caused it.
    """

    _abort_scheduled = False

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if not self._abort_scheduled and self.protocol.close_expected():
            self._abort_scheduled = True
            self.loop.call_later(self.close_timeout or 0.0, self.transport.abort)


def _retry_after(headers: Headers) -> float | None:
    return retry_after_seconds(headers.get("Retry-After"))


class WebSocketConnection:
    """One open WebSocket connection to a server's ``/ws`` endpoint.

    Attributes:
        extensions: what the server advertised in its upgrade response.
    """

    def __init__(self, ws: ClientConnection, extensions: Extensions,
                 last_frame_wait: float = 0.05) -> None:
        self._ws = ws
        self.extensions = extensions
        self._last_frame_wait = last_frame_wait
        self._fast_send = text_sender(ws, State.OPEN)

    @property
    def is_open(self) -> bool:
        """Whether frames can still be sent."""
        return self._ws.state is State.OPEN

    async def send(self, text: str | bytes) -> None:
        """Send one text frame (``bytes``: its UTF-8 text, sent as it is).

        Raises:
            NotWrittenError: the connection was closed before anything was written.
            ConnectionLostError: the connection failed while writing.
        """
        if self._ws.state is not State.OPEN:
            raise NotWrittenError("connection is closed; the request was not sent")
        try:
            fast = self._fast_send
            if fast is None:
                await self._ws.send(text, text=True)
            else:
                await fast(text)
        except ConnectionClosed as exc:
            raise ConnectionLostError(
                f"connection lost while sending: {_closed_reason(exc)}"
            ) from exc
        except OSError as exc:
            raise ConnectionLostError(f"connection lost while sending: {exc}") from exc

    async def probe(self, timeout: float) -> bool:
        """Ping the peer; ``True`` if it answered within ``timeout``. Never raises."""
        if self._ws.state is not State.OPEN:
            return False
        try:
            async with bounded(timeout):
                waiter = await self._ws.ping()
                await waiter
        except (ConnectionClosed, TimeoutError, OSError, RuntimeError):
            return False
        return True

    async def take_buffered(self) -> str | bytes | None:
        """A frame the server sent before closing, if one is still buffered.

        A server at capacity answers the upgrade, sends an unsolicited error frame
        and closes; that frame explains the close and must not be lost.
        """
        if self._ws.state is State.OPEN:
            return None
        try:
            async with bounded(self._last_frame_wait):
                return await self._ws.recv()
        except (ConnectionClosed, TimeoutError, OSError):
            return None

    async def recv(self) -> str | bytes:
        """Receive one frame (text, or bytes for a binary frame).

        Raises:
            ConnectionLostError: the connection closed or the peer stopped answering pings.
            ProtocolError: the peer broke the WebSocket protocol (e.g. an oversize frame).
        """
        try:
            return await self._ws.recv()
        except ConnectionClosed as exc:
            raise _closed_error(exc) from exc
        except WsProtocolError as exc:
            raise ProtocolError(f"WebSocket protocol violation: {exc}") from exc
        except OSError as exc:
            raise ConnectionLostError(f"connection lost: {exc}") from exc

    async def close(self, timeout: float | None) -> None:
        """Close gracefully, waiting at most ``timeout``; then drop.

        Raises nothing but a cancellation of the caller, which is passed on (after
        dropping the connection) rather than swallowed.
        """
        try:
            async with bounded(timeout):
                await self._ws.close()
        except asyncio.CancelledError:
            self.abort()
            raise
        except Exception:
            self.abort()

    def abort(self) -> None:
        """Drop the TCP connection at once, without a closing handshake."""
        with contextlib.suppress(Exception):
            self._ws.transport.abort()


def _closed_error(exc: ConnectionClosed) -> EnvlinkError:
    """Sort a closed connection: the peer's fault or ours is not a lost connection.

    Those are not retried (a resend would fail the same way) and start no recovery.
    """
    sent = exc.sent.code if exc.sent is not None and exc.rcvd is None else None
    received = exc.rcvd.code if exc.rcvd is not None else None
    if isinstance(exc.__cause__, PayloadTooBig) or sent == _TOO_BIG:
        return ProtocolError(f"server sent a frame larger than the limit ({_closed_reason(exc)})")
    if sent in (_PROTOCOL_ERROR, _INVALID_DATA):
        return ProtocolError(f"server broke the WebSocket protocol ({_closed_reason(exc)})")
    if received == _TOO_BIG:
        return ProtocolError(
            f"server refused a message larger than its size limit ({_closed_reason(exc)})"
        )
    return ConnectionLostError(f"connection lost: {_closed_reason(exc)}")


# WebSocket close codes (RFC 6455, section 7.4.1).
_PROTOCOL_ERROR = 1002
_INVALID_DATA = 1007
_TOO_BIG = 1009


def _closed_reason(exc: ConnectionClosed) -> str:
    frame = exc.rcvd or exc.sent
    if frame is None:
        return "no close frame (connection dropped)"
    reason = f" {frame.reason}" if frame.reason else ""
    return f"close code {frame.code}{reason}"


async def open_connection(
    endpoint: Endpoint,
    options: ConnectionOptions,
    *,
    extra_headers: Mapping[str, str] | None = None,
    open_timeout: float | None = None,
    offer_extensions: bool = True,
) -> WebSocketConnection:
    """Open a WebSocket connection, offering envlink's extensions.

    Args:
        endpoint: where to connect.
        options: connection options.
        extra_headers: per-connection headers (trace context, resume token).
        open_timeout: deadline for TCP + TLS + handshake.
        offer_extensions: send the ``envlink-protocol`` header (a server that does not
            know it ignores it).

    Raises:
        ConnectError: refused, unreachable, timed out, TLS failure (retryable or not).
        HandshakeRejectedError: the server answered the upgrade with an HTTP error.
    """
    warm_read_buffers()
    headers: list[tuple[str, str]] = list(options.headers)
    if endpoint.auth_header is not None and not any(
        k.lower() == "authorization" for k, _ in headers
    ):
        headers.append(("Authorization", endpoint.auth_header))
    if offer_extensions:
        headers.append((EXTENSION_HEADER, EXTENSION_VERSION))
    if extra_headers:
        headers.extend(extra_headers.items())
    kwargs: dict[str, Any] = {
        "additional_headers": headers,
        "open_timeout": open_timeout,
        "ping_interval": options.ping_interval,
        "ping_timeout": options.ping_timeout,
        # websockets waits this long for the peer's close frame, also after a keepalive
        # timeout: keep it short so a dead peer is reported within ping_interval +
        # ping_timeout (our own graceful close has its own deadline).
        "close_timeout": min(options.close_timeout, options.ping_timeout or options.close_timeout),
        "max_size": options.max_message_size,
        "compression": options.compression,
        "logger": CLIENT_LOGGER,
        "create_connection": _BoundedCloseConnection,
    }
    if options.user_agent is not None:
        kwargs["user_agent_header"] = options.user_agent
    if endpoint.secure:
        kwargs["ssl"] = options.ssl or ssl_module.create_default_context()
    where = endpoint.display
    # One rule for both paths (see envlink._transports.proxy), given to websockets
    # explicitly so that its own resolver never applies.
    kwargs["proxy"] = resolve_proxy(endpoint.ws_url, options.proxy)
    try:
        ws = await _Connect(endpoint.connect_url, **kwargs)
    except InvalidStatus as exc:
        response = exc.response
        raise HandshakeRejectedError(
            response.status_code, retry_after=_retry_after(response.headers)
        ) from exc
    except InvalidURI as exc:
        raise ConnectError(f"invalid server URL {where}", retryable=False) from exc
    except InvalidProxy as exc:
        raise ConnectError(f"invalid proxy for {where}: {redact_text(str(exc))}",
                           retryable=False) from exc
    except ImportError as exc:  # e.g. a socks:// proxy without python-socks installed
        raise ConnectError(f"cannot connect to {where}: {exc}", retryable=False) from exc
    except ssl_module.SSLCertVerificationError as exc:
        raise ConnectError(f"TLS verification failed for {where}: {exc.verify_message}",
                           retryable=False) from exc
    except (asyncio.TimeoutError, TimeoutError) as exc:
        raise ConnectError(f"timed out opening {where}", retryable=True) from exc
    except InvalidHandshake as exc:
        # A handshake cut short (EOF, reset) is transient; a server that answers the
        # upgrade with something that is not WebSocket is a protocol violation: fatal.
        transient = isinstance(exc.__cause__, (EOFError, OSError))
        cause = f" ({exc.__cause__})" if exc.__cause__ is not None and not transient else ""
        raise ConnectError(f"WebSocket handshake with {where} failed: "
                           f"{redact_text(str(exc))}{redact_text(cause)}",
                           retryable=transient) from exc
    except ConnectionClosed as exc:
        raise ConnectError(f"{where} closed the connection during the handshake",
                           retryable=True) from exc
    except OSError as exc:
        reason = exc.strerror or exc.__class__.__name__
        raise ConnectError(f"cannot connect to {where}: {reason}", retryable=True) from exc
    response_headers: dict[str, str] = {}
    if ws.response is not None:
        response_headers = {k: v for k, v in ws.response.headers.raw_items()}
        # Read once, here: emptied, the response the connection keeps no longer holds
        # the headers' two dozen objects per session, nor the session token among them.
        ws.response.headers.clear()
    # Nothing reads the upgrade request after the handshake: not keeping it spares each
    # session its headers (a third of an idle session's handshake memory) and keeps its
    # credentials (Authorization, the resume token) no longer than the handshake.
    ws.request = None
    return WebSocketConnection(ws, Extensions.from_headers(response_headers),
                               options.last_frame_wait)


class WebSocketTransport:
    """The default :class:`~envlink._transports.base.Transport`: ``websockets``' asyncio client."""

    async def connect(
        self,
        endpoint: Endpoint,
        options: ConnectionOptions,
        *,
        headers: Mapping[str, str],
        timeout: float | None,
        offer_extensions: bool = True,
    ) -> WebSocketConnection:
        """Open one connection (see :func:`open_connection`)."""
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
        return "WebSocketTransport()"
