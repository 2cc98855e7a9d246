"""The WebSocket transport: the only module that imports ``websockets``.

A two-method-ish seam (open a connection; send, receive, close on it). Every
``websockets``/``OSError``/``asyncio`` failure is translated here into envlink's
own tree, ``raise ... from exc``; nothing of websockets leaks past this module.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import ipaddress
import ssl as ssl_module
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

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

from envlink._config import ConnectionOptions
from envlink._errors import (
    ConnectError,
    ConnectionLostError,
    EnvlinkError,
    HandshakeRejectedError,
    ProtocolError,
)
from envlink._protocol import EXTENSION_HEADER, EXTENSION_VERSION, Extensions
from envlink._timeouts import bounded

__all__ = ["Connection", "Endpoint", "NotWrittenError", "open_connection", "parse_endpoint"]


class NotWrittenError(ConnectionLostError):
    """The connection was already closed: the frame was provably never written."""


@dataclass(frozen=True)
class Endpoint:
    """A parsed server address. Credentials never appear in ``display``.

    Attributes:
        ws_url: the ``ws://``/``wss://`` URL of the ``/ws`` endpoint, without credentials.
        host: the server host (``server.address``).
        port: the server port (``server.port``).
        secure: whether TLS is used.
        auth_header: a ``Basic`` authorization value built from URL credentials, if any.
    """

    ws_url: str
    host: str
    port: int
    secure: bool
    auth_header: str | None = None

    @property
    def display(self) -> str:
        """The URL safe to show in logs and errors."""
        return self.ws_url


def parse_endpoint(base_url: str) -> Endpoint:
    """Turn an ``http(s)://`` or ``ws(s)://`` base URL into the ``/ws`` endpoint.

    Raises:
        TypeError: ``base_url`` is not a string.
        ValueError: for another scheme or a URL without a host.
    """
    if not isinstance(base_url, str):
        raise TypeError(f"base_url must be a str such as 'http://127.0.0.1:8000', "
                        f"got {type(base_url).__name__} {base_url!r}")
    parts = urlsplit(base_url.strip())
    scheme = {"http": "ws", "https": "wss", "ws": "ws", "wss": "wss"}.get(parts.scheme.lower())
    if scheme is None:
        raise ValueError(
            f"base_url must start with http://, https://, ws:// or wss://, got scheme "
            f"{parts.scheme!r}"
        )
    if not parts.hostname:
        raise ValueError("base_url has no host")
    secure = scheme == "wss"
    port = parts.port or (443 if secure else 80)
    auth = None
    if parts.username is not None:
        import base64

        raw = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
        auth = "Basic " + base64.b64encode(raw).decode("ascii")
    host = parts.hostname
    netloc = f"[{host}]" if ":" in host else host
    if parts.port is not None:
        netloc = f"{netloc}:{parts.port}"
    path = parts.path.rstrip("/")
    if not path.endswith("/ws"):
        path = f"{path}/ws"
    ws_url = urlunsplit((scheme, netloc, path, parts.query, ""))
    return Endpoint(ws_url=ws_url, host=host, port=port, secure=secure, auth_header=auth)


def _is_loopback(host: str) -> bool:
    # Proxy environment variables never apply to the machine itself (as in OpenEnv's
    # client and most HTTP clients); an explicit proxy URL still does.
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _retry_after(headers: Headers) -> float | None:
    value = headers.get("Retry-After")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:  # an HTTP date
        parsed = email.utils.parsedate_to_datetime(value)
        return max(0.0, parsed.timestamp() - time.time())
    except (ValueError, TypeError, IndexError, OverflowError):
        return None  # unreadable: ignored, as if the server had not sent one


class Connection:
    """One open WebSocket connection to a server's ``/ws`` endpoint.

    Attributes:
        extensions: what the server advertised in its upgrade response.
        opened_at: ``time.monotonic()`` when the connection opened.
        late_answers: answers still due to timed-out requests (kept connections only).
    """

    def __init__(self, ws: ClientConnection, extensions: Extensions) -> None:
        self._ws = ws
        self.extensions = extensions
        self.opened_at = time.monotonic()
        #: Answers still due to requests whose callers gave up (request ids only).
        self.late_answers = 0

    @property
    def is_open(self) -> bool:
        """Whether frames can still be sent."""
        return self._ws.state is State.OPEN

    async def send(self, text: str) -> None:
        """Send one text frame.

        Raises:
            NotWrittenError: the connection was closed before anything was written.
            ConnectionLostError: the connection failed while writing.
        """
        if self._ws.state is not State.OPEN:
            raise NotWrittenError("connection is closed; the request was not sent")
        try:
            await self._ws.send(text)
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
            async with bounded(0.05):
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
) -> Connection:
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
        "close_timeout": min(1.0, options.ping_timeout or 1.0),
        "max_size": options.max_message_size,
        "compression": options.compression,
        "proxy": None if _is_loopback(endpoint.host) and options.proxy is True else options.proxy,
    }
    if options.user_agent is not None:
        kwargs["user_agent_header"] = options.user_agent
    if endpoint.secure:
        kwargs["ssl"] = options.ssl or ssl_module.create_default_context()
    where = endpoint.display
    try:
        ws = await connect(endpoint.ws_url, **kwargs)
    except InvalidStatus as exc:
        response = exc.response
        raise HandshakeRejectedError(
            response.status_code, retry_after=_retry_after(response.headers)
        ) from exc
    except InvalidURI as exc:
        raise ConnectError(f"invalid server URL {where}", retryable=False) from exc
    except InvalidProxy as exc:
        raise ConnectError(f"invalid proxy for {where}: {exc}", retryable=False) from exc
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
        raise ConnectError(f"WebSocket handshake with {where} failed: {exc}",
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
    return Connection(ws, Extensions.from_headers(response_headers))
