"""The transport seam: how the client gets a connection to a server, httpx-style.

A :class:`Transport` opens a :class:`Connection` for an endpoint, with handshake
headers and a timeout; the connection sends and receives text frames. The
default is the ``websockets`` one (``_transports/websocket.py``); :class:`~envlink.MockTransport`
answers from a function, for tests without a server. A transport raises only
envlink's own errors (:class:`~envlink.ConnectError` on opening,
:class:`~envlink.ConnectionLostError` / :class:`~envlink.ProtocolError` on an open
connection), and :class:`NotWrittenError` when a frame provably never left.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable
from urllib.parse import unquote, urlencode, urlsplit, urlunsplit

from envlink._config import redact_url
from envlink._errors import InvalidURLError, NotWrittenError

if TYPE_CHECKING:
    from envlink._config import ConnectionOptions
    from envlink._sansio.protocol import Extensions

__all__ = [
    "Connection",
    "Endpoint",
    "NotWrittenError",
    "RpcAnswer",
    "RpcTransport",
    "Transport",
    "parse_endpoint",
]


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


@runtime_checkable
class RpcTransport(Protocol):
    """A transport that can also post JSON-RPC to the server's ``/mcp`` (optional).

    OpenEnv 0.10 creates and ends detached sessions there (``openenv/session/create``,
    ``openenv/session/close``). A transport without it (a ``MockTransport``, say)
    simply offers no detached sessions.
    """

    async def rpc(
        self,
        endpoint: Endpoint,
        options: ConnectionOptions,
        method: str,
        params: Mapping[str, Any],
        *,
        request_id: int,
    ) -> RpcAnswer:
        """Post one JSON-RPC request to ``endpoint.mcp_url`` (the caller bounds it).

        Raises:
            ConnectError: nothing reached the server.
            ConnectionLostError: the request may have reached it, no answer came.
            ProtocolError: the answer is not HTTP/JSON.
        """
        ...


@dataclass(frozen=True)
class RpcAnswer:
    """The HTTP status and the JSON body (``None`` if empty or not JSON on an error)."""

    status: int
    body: Any


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

    async def send(self, text: str | bytes) -> None:
        """Send one text frame (``bytes``: its UTF-8 text, sent as it is).

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


@dataclass(frozen=True)
class Endpoint:
    """A parsed server address. Credentials never appear in ``display``.

    Attributes:
        ws_url: the ``ws://``/``wss://`` URL of the ``/ws`` endpoint, without credentials.
        host: the server host (``server.address``).
        port: the server port (``server.port``).
        secure: whether TLS is used.
        auth_header: a ``Basic`` authorization value built from URL credentials, if any.
        session_id: the OpenEnv detached session to attach to (``/ws?session_id=``),
            or ``None`` for a plain connection (a new server session). A capability:
            never shown in ``display``.
        base_url: the base URL as given (without credentials or a trailing slash).
    """

    ws_url: str
    host: str
    port: int
    secure: bool
    auth_header: str | None = None
    session_id: str | None = None
    base_url: str = ""

    @property
    def display(self) -> str:
        """The URL safe to show in logs and errors (secret query values redacted)."""
        return redact_url(self.ws_url)

    @property
    def connect_url(self) -> str:
        """The URL to open: ``ws_url``, with ``?session_id=`` when attaching."""
        if self.session_id is None:
            return self.ws_url
        joiner = "&" if urlsplit(self.ws_url).query else "?"
        return f"{self.ws_url}{joiner}{urlencode({'session_id': self.session_id})}"

    @property
    def mcp_url(self) -> str:
        """The server's ``/mcp`` JSON-RPC URL (``http(s)://``, no query), as OpenEnv derives it."""
        return self.http_url("/mcp")

    def http_url(self, path: str) -> str:
        """The server's plain-HTTP URL of ``path`` (``/health``, ``/schema``...), no query."""
        parts = urlsplit(self.ws_url)
        scheme = "https" if parts.scheme == "wss" else "http"
        base = parts.path[:-len("/ws")] if parts.path.endswith("/ws") else parts.path
        return urlunsplit((scheme, parts.netloc, base.rstrip("/") + path, "", ""))

    def attached(self, session_id: str | None) -> Endpoint:
        """The same endpoint, attaching to ``session_id`` (``None``: a plain connection)."""
        return dataclasses.replace(self, session_id=session_id)


def parse_endpoint(base_url: str, argument: str = "base_url") -> Endpoint:
    """Turn an ``http(s)://`` or ``ws(s)://`` base URL into the ``/ws`` endpoint.

    Args:
        base_url: the URL.
        argument: the name of the argument that holds it, for the error.

    Raises:
        TypeError: ``base_url`` is not a string.
        InvalidURLError: (a ``ValueError``) for an empty URL, another or no scheme,
            no host, or a port that is not a number from 1 to 65535.
    """
    if not isinstance(base_url, str):
        raise TypeError(f"{argument} must be a str such as 'http://127.0.0.1:8000', "
                        f"got {type(base_url).__name__}")
    text = base_url.strip()
    shown = redact_url(text)
    if not text:
        raise InvalidURLError(f"{argument} is empty; pass a URL such as "
                              "'http://127.0.0.1:8000'", argument=argument, url=shown)

    def invalid(reason: str) -> InvalidURLError:
        return InvalidURLError(f"{argument} {shown!r} is not a usable URL: {reason}",
                               argument=argument, url=shown)

    try:
        parts = urlsplit(text)
    except ValueError as exc:  # urllib's reason says it all: no chain
        raise invalid(str(exc)) from None
    scheme = {"http": "ws", "https": "wss", "ws": "ws", "wss": "wss"}.get(parts.scheme.lower())
    if scheme is None:
        if "://" not in text:
            raise invalid(f"it has no scheme (did you mean 'http://{shown}'?)")
        raise invalid(f"the scheme must be http, https, ws or wss, not {parts.scheme!r}")
    if not parts.hostname:
        raise invalid("it has no host")
    try:
        given_port = parts.port
    except ValueError:
        given_port = 0
    if given_port == 0 and parts.netloc.rpartition("@")[2].rpartition("]")[2].count(":"):
        raise invalid("its port must be a number from 1 to 65535")
    secure = scheme == "wss"
    port = given_port or (443 if secure else 80)
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
    # As OpenEnv's client reports it: the URL as given, without a trailing slash (and
    # here without credentials, which are never shown).
    given = redact_url(urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), parts.query,
                                   "")))
    return Endpoint(ws_url=ws_url, host=host, port=port, secure=secure, auth_header=auth,
                    base_url=given)


