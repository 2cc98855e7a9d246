"""The transport seam: how the client gets a connection to a server, httpx-style.

A :class:`Transport` opens a :class:`Connection` for an endpoint, with handshake
headers and a timeout; the connection sends and receives text frames. The
default is the ``websockets`` one (``_websocket.py``); :class:`~envlink.MockTransport`
answers from a function, for tests without a server. A transport raises only
envlink's own errors (:class:`~envlink.ConnectError` on opening,
:class:`~envlink.ConnectionLostError` / :class:`~envlink.ProtocolError` on an open
connection), and :class:`NotWrittenError` when a frame provably never left.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol
from urllib.parse import unquote, urlsplit, urlunsplit

from envlink._errors import ConnectionLostError

if TYPE_CHECKING:
    from envlink._config import ConnectionOptions
    from envlink._protocol import Extensions

__all__ = ["Connection", "Endpoint", "NotWrittenError", "Transport", "parse_endpoint"]


class Transport(Protocol):
    """Opens connections to an OpenEnv ``/ws`` endpoint (the client's I/O seam)."""

    async def connect(
        self,
        endpoint: Endpoint,
        options: ConnectionOptions,
        *,
        headers: Mapping[str, str],
        timeout: float | None,
        offer_extensions: bool = True,
    ) -> Connection:
        """Open one connection.

        Args:
            endpoint: where to connect.
            options: how (handshake headers, keepalive, limits, TLS, proxy).
            headers: this connection's own headers (trace context, resume token).
            timeout: deadline for opening it (TCP, TLS, handshake).
            offer_extensions: offer envlink's protocol extensions.

        Raises:
            ConnectError: it could not be opened (``retryable`` says whether to retry).
        """
        ...


class Connection(Protocol):
    """One open connection: text frames out, frames in, one session on the server.

    Attributes:
        extensions: what the server advertised when the connection opened.
    """

    extensions: Extensions

    @property
    def is_open(self) -> bool:
        """Whether frames can still be sent."""
        ...

    async def send(self, text: str) -> None:
        """Send one text frame.

        Raises:
            NotWrittenError: the connection was closed before anything was written.
            ConnectionLostError: the connection failed while writing.
        """
        ...

    async def recv(self) -> str | bytes:
        """Receive one frame.

        Raises:
            ConnectionLostError: the connection closed or the peer stopped answering.
            ProtocolError: the peer broke the transport's protocol.
        """
        ...

    async def probe(self, timeout: float) -> bool:
        """Whether the peer answers a health check within ``timeout``. Never raises."""
        ...

    async def take_buffered(self) -> str | bytes | None:
        """A frame the server sent before closing, if one is still buffered."""
        ...

    async def close(self, timeout: float | None) -> None:
        """Close gracefully within ``timeout``, then drop; passes on a cancellation."""
        ...

    def abort(self) -> None:
        """Drop the connection at once."""
        ...


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


