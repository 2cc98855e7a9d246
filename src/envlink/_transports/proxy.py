"""One proxy resolver for every connection envlink opens (WebSocket and HTTP alike).

The same rule for both paths, so a request never leaves through a route its sibling
does not take: an explicit proxy URL is used as given; ``True`` reads the
environment as websockets does for a WebSocket (and so OpenEnv's client), after RFC
6455's advice to prefer a SOCKS proxy, then the HTTPS one:

- ``ws``/``http``: ``WS_PROXY``, ``SOCKS_PROXY``, ``HTTPS_PROXY``, ``HTTP_PROXY``;
- ``wss``/``https``: ``WSS_PROXY``, ``SOCKS_PROXY``, ``HTTPS_PROXY``;

then ``ALL_PROXY`` (as curl). Lower-case names win, as in curl and the standard
library; a ``SOCKS_PROXY`` given as ``http://`` or without a scheme means
``socks5h://``, as websockets reads it. The client's HTTP requests (``POST /mcp``,
``/health``...) go to the same host as its WebSocket and take the same route: an
``http://`` server reached through ``HTTPS_PROXY`` by its WebSocket is reached
through it by ``POST /mcp`` too. ``NO_PROXY`` is honoured (host names, domain
suffixes, ``host:port``, IP addresses and networks, ``*``), and the machine itself
(``localhost`` and loopback addresses) is never proxied, as OpenEnv's client never
proxies it; ``None``/``False`` means no proxy. The resolved URL is handed to
websockets and httpx explicitly: neither applies a rule of its own.
"""

from __future__ import annotations

import ipaddress
import os
from urllib.parse import urlsplit

from envlink._errors import ConnectError

__all__ = ["SUPPORTED_PROXY_SCHEMES", "check_proxy_url", "is_loopback", "resolve_proxy"]

#: The proxy schemes both paths support (SOCKS needs the ``socks`` extra).
SUPPORTED_PROXY_SCHEMES = ("http", "https", "socks5", "socks5h")

#: The variables read for a target, in order (websockets' order), before ``ALL_PROXY``.
_PLAIN_VARIABLES = ("ws_proxy", "socks_proxy", "https_proxy", "http_proxy")
_SECURE_VARIABLES = ("wss_proxy", "socks_proxy", "https_proxy")


def is_loopback(host: str) -> bool:
    """Whether ``host`` is this machine (``localhost`` or a loopback address)."""
    host = host.strip("[]").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_proxy_url(proxy: str, *, source: str = "proxy") -> str:
    """Validate a proxy URL's scheme and host.

    Raises:
        ConnectError: (not retryable) a scheme neither path supports, or no host.
    """
    parts = urlsplit(proxy)
    if parts.scheme.lower() not in SUPPORTED_PROXY_SCHEMES or not parts.hostname:
        raise ConnectError(
            f"unsupported {source} {parts.scheme or '(no scheme)'}:// "
            f"(supported: {', '.join(s + '://' for s in SUPPORTED_PROXY_SCHEMES)})",
            retryable=False)
    return proxy


def _env(name: str) -> str | None:
    # Lower case first; upper-case HTTP_PROXY is ignored in a CGI request, where a
    # client's "Proxy:" header would set it.
    value = os.environ.get(name.lower())
    if value is None and not (name == "http_proxy" and "REQUEST_METHOD" in os.environ):
        value = os.environ.get(name.upper())
    return value.strip() if value and value.strip() else None


def _bypassed(host: str, port: int, no_proxy: str) -> bool:
    host = host.strip("[]").lower()
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        address = None
    for raw in no_proxy.split(","):
        entry = raw.strip().lower()
        if not entry:
            continue
        if entry == "*":
            return True
        entry_port: int | None = None
        if entry.count(":") == 1 and not entry.endswith("]"):
            name, _, port_text = entry.partition(":")
            if port_text.isdigit():
                entry, entry_port = name, int(port_text)
        elif entry.startswith("[") and "]:" in entry:
            name, _, port_text = entry.partition("]:")
            entry, entry_port = name + "]", int(port_text) if port_text.isdigit() else None
        if entry_port is not None and entry_port != port:
            continue
        entry = entry.strip("[]")
        if address is not None:
            try:
                if address in ipaddress.ip_network(entry, strict=False):
                    return True
            except ValueError:
                pass
            continue
        entry = entry.lstrip("*").lstrip(".")
        if host == entry or host.endswith("." + entry):
            return True
    return False


def resolve_proxy(url: str, proxy: str | bool | None) -> str | None:
    """The proxy URL to use for ``url``, or ``None`` to connect directly.

    Args:
        url: where envlink connects (``http``, ``https``, ``ws`` or ``wss``).
        proxy: ``True`` (the environment), ``None``/``False`` (none) or a proxy URL.

    Raises:
        ConnectError: (not retryable) the proxy's scheme is not supported.
    """
    if proxy is None or proxy is False:
        return None
    if isinstance(proxy, str):
        return check_proxy_url(proxy)
    parts = urlsplit(url)
    host = parts.hostname or ""
    if is_loopback(host):
        return None
    scheme = parts.scheme.lower()
    secure = scheme in ("https", "wss")
    port = parts.port or (443 if secure else 80)
    no_proxy = _env("no_proxy")
    if no_proxy is not None and _bypassed(host, port, no_proxy):
        return None
    found: str | None = None
    for name in (*(_SECURE_VARIABLES if secure else _PLAIN_VARIABLES), "all_proxy"):
        found = _env(name)
        if found is None:
            continue
        if name == "socks_proxy":
            # websockets' reading: a SOCKS proxy given as http:// is SOCKS 5, named by host.
            address = found.split("://", 1)[1] if found.startswith("http://") else found
            found = address if "://" in address else "socks5h://" + address
        break
    if found is None:
        return None
    if "://" not in found:  # "proxy:3128", as curl accepts it
        found = "http://" + found
    return check_proxy_url(found, source=f"proxy from the environment for {scheme}://")
