"""Which WebSocket transport a client uses: ``"auto"``, ``"websockets"`` or ``"picows"``.

``"auto"`` is picows when it is installed (the ``fast`` extra), else websockets;
the default (no transport given) is :data:`DEFAULT_TRANSPORT`. ``ENVLINK_TRANSPORT``
forces one for every client that names none or ``"auto"`` (a name given in the
configuration wins). The transport a process uses is said once in the
log, at its first connection's client.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from typing import TYPE_CHECKING, Final, Literal

from envlink._errors import InvalidArgumentError
from envlink._transports.base import Endpoint, Transport
from envlink._transports.proxy import resolve_proxy

if TYPE_CHECKING:
    from envlink._config import ConnectionOptions

__all__ = ["DEFAULT_TRANSPORT", "TRANSPORT_NAMES", "TRANSPORT_VARIABLE", "TransportName",
           "picows_installed", "resolve_transport", "transport_label", "transport_named"]

TransportName = Literal["auto", "websockets", "picows"]
#: The names ``ClientConfig(transport=...)`` and ``ENVLINK_TRANSPORT`` take.
TRANSPORT_NAMES: Final = ("auto", "websockets", "picows")
#: The environment variable that says what ``"auto"`` (and no transport) means.
TRANSPORT_VARIABLE: Final = "ENVLINK_TRANSPORT"
#: What a client that names no transport uses (unless ``ENVLINK_TRANSPORT`` says).
DEFAULT_TRANSPORT: Final[str] = "auto"

_log = logging.getLogger("envlink.transport")
_said: set[str] = set()
_installed: bool | None = None


def picows_installed() -> bool:
    """Whether picows can be imported (looked up once, without importing it)."""
    global _installed
    if _installed is None:
        _installed = importlib.util.find_spec("picows") is not None
    return _installed


def resolve_transport(name: str | None) -> Literal["websockets", "picows"]:
    """The transport ``name`` stands for in this process (``None``: the default).

    Raises:
        InvalidArgumentError: an unknown name (given, or in ``ENVLINK_TRANSPORT``), or
            ``"picows"`` without picows installed.
    """
    source = "transport"
    if name is None or name == "auto":
        forced = os.environ.get(TRANSPORT_VARIABLE, "").strip().lower()
        if forced:
            name, source = forced, TRANSPORT_VARIABLE
        elif name is None:
            name = DEFAULT_TRANSPORT
        if name == "auto":
            return "picows" if picows_installed() else "websockets"
    if name == "websockets":
        return "websockets"
    if name == "picows":
        if not picows_installed():
            raise InvalidArgumentError(
                f"{source} is 'picows' but picows is not installed: "
                "pip install 'envlink[fast]', or use transport='websockets'")
        return "picows"
    raise InvalidArgumentError(f"{source} must be one of {', '.join(TRANSPORT_NAMES)}, "
                               f"got {name!r}")


def transport_named(name: str | None) -> Transport:
    """A new transport for ``name`` (see :func:`resolve_transport`), said in the log the
    first time a process uses it.

    Raises:
        InvalidArgumentError: as :func:`resolve_transport`.
    """
    chosen = resolve_transport(name)
    if chosen not in _said:
        _said.add(chosen)
        _log.info("envlink.transport: connections use the %s transport (transport=%r)",
                  chosen, name)
    if chosen == "picows":
        from envlink._transports.picows_ws import PicowsTransport

        return PicowsTransport()
    from envlink._transports.websocket import WebSocketTransport

    return WebSocketTransport()


def transport_label(given: Transport | str | None, endpoint: Endpoint,
                    options: ConnectionOptions) -> str:
    """What opens a client's connections to ``endpoint``, in words (``envlink probe``).

    Raises:
        InvalidArgumentError: as :func:`resolve_transport`.
    """
    if given is not None and not isinstance(given, str):
        return type(given).__name__
    chosen = resolve_transport(given)
    if chosen == "picows":
        if options.compression is not None:
            return "websockets (picows has no permessage-deflate)"
        try:
            proxied = resolve_proxy(endpoint.ws_url, options.proxy) is not None
        except Exception:  # an unsupported proxy: the connection will say so
            proxied = False
        if proxied:
            return "websockets (picows leaves a proxied URL to it)"
    return chosen
