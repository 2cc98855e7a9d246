"""envlink's HTTP requests (OpenEnv's ``POST /mcp``: :func:`post_rpc`, discovery GETs).

A direct request (no proxy) is one HTTP/1.1 exchange on asyncio streams
(:mod:`envlink._transports.http11`), which spares a client's first request the
import of httpx; a request through a proxy goes through httpx. One request per
call, with the client's headers (``Authorization``...), its SSL context, the proxy
chosen by :mod:`envlink._transports.proxy` (the same rule as the WebSocket path), a
bound on the answer's size (the body is read in pieces and the request dropped
past it, so a huge answer is never held), and an optional deadline. Redirects are
not followed unless asked; when they are, a cross-origin hop drops every credential
and ``https`` never becomes ``http``.

Both paths' errors are envlink's (httpx's translated in one table, :func:`_translate`):
:class:`~envlink.ConnectError` when the request provably never reached the server,
:class:`~envlink.ConnectionLostError` once it may have,
:class:`~envlink.ProtocolError` for an answer that is not HTTP, too large, or not
JSON. Nothing of httpx leaks past this module; URLs in messages are redacted.
"""

from __future__ import annotations

import email.utils
import json
import ssl as ssl_module
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urljoin, urlsplit

from envlink._config import is_sensitive_name, redact_text, redact_url
from envlink._deadlines import bounded
from envlink._errors import (
    ConnectError,
    ConnectionLostError,
    EnvlinkError,
    NoAnswerError,
    ProtocolError,
)
from envlink._sansio.jsonrpc import rpc_request
from envlink._transports.base import Endpoint, RpcAnswer
from envlink._transports.proxy import resolve_proxy

if TYPE_CHECKING:
    from envlink._config import ConnectionOptions

__all__ = ["HttpAnswer", "NoAnswerError", "get_json", "post_json", "post_rpc", "request_json",
           "retry_after_seconds"]

#: Default bound on an answer's body.
DEFAULT_MAX_ANSWER = 1024 * 1024
_MAX_REDIRECTS = 5

HeaderPairs = Mapping[str, str] | list[tuple[str, str]] | tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class HttpAnswer:
    """An HTTP answer.

    Attributes:
        status: the HTTP status.
        body: the JSON body (``None`` if empty, or not JSON on an error status).
        headers: the answer's headers, names in lower case.
    """

    status: int
    body: Any
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)


_plain_context: ssl_module.SSLContext | None = None


def _context(ssl: ssl_module.SSLContext | None) -> ssl_module.SSLContext:
    # httpx builds a verifying context per client unless given one: building one costs
    # milliseconds, so a default is made once and reused.
    global _plain_context
    if ssl is not None:
        return ssl
    if _plain_context is None:
        _plain_context = ssl_module.create_default_context()
    return _plain_context


def _pairs(headers: HeaderPairs) -> list[tuple[str, str]]:
    return list(headers.items()) if isinstance(headers, Mapping) else list(headers)


def _same_origin(a: str, b: str) -> bool:
    pa, pb = urlsplit(a), urlsplit(b)
    default = {"http": 80, "https": 443}
    return (pa.scheme, pa.hostname, pa.port or default.get(pa.scheme)) == (
        pb.scheme, pb.hostname, pb.port or default.get(pb.scheme))


def _translate(exc: BaseException, where: str, *, answered: bool) -> EnvlinkError:
    """httpx's failure as envlink's: the one table of this seam."""
    import httpx

    text = redact_text(str(exc))
    if isinstance(exc, httpx.ProxyError):
        return ConnectError(f"the proxy refused the request to {where}: {text}", retryable=True)
    if isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout)):
        cause = exc.__context__ or exc.__cause__
        while cause is not None and not isinstance(cause, ssl_module.SSLError):
            cause = cause.__context__ or cause.__cause__
        if isinstance(cause, ssl_module.SSLCertVerificationError):
            return ConnectError(f"TLS verification failed for {where}: {cause.verify_message}",
                                retryable=False)
        if isinstance(cause, ssl_module.SSLError):
            return ConnectError(f"TLS handshake with {where} failed: {cause}", retryable=False)
        return ConnectError(f"cannot connect to {where}: {text or type(exc).__name__}",
                            retryable=True)
    if isinstance(exc, (httpx.UnsupportedProtocol, httpx.InvalidURL)):
        return ConnectError(f"cannot request {where}: {text}", retryable=False)
    if isinstance(exc, httpx.LocalProtocolError):
        return ConnectError(f"the request to {where} is malformed: {text}", retryable=False)
    if isinstance(exc, httpx.RemoteProtocolError):
        if not answered and "without sending a response" in text:
            return NoAnswerError(f"{where} closed the connection without answering")
        if answered:
            return ConnectionLostError(f"{where} closed the connection mid-answer: {text}")
        if "buffer" in text.lower() or "too long" in text.lower() or "too large" in text.lower():
            return ProtocolError(f"the HTTP answer of {where} has oversized headers ({text})")
        return ProtocolError(f"{where} did not answer valid HTTP/1.x: {text}")
    if isinstance(exc, (httpx.ReadError, httpx.WriteError, httpx.ReadTimeout,
                        httpx.WriteTimeout, httpx.CloseError)):
        when = "mid-answer" if answered else "before answering"
        return ConnectionLostError(f"{where} failed {when}: {text or type(exc).__name__}")
    if isinstance(exc, ImportError):  # a socks5:// proxy without the socks extra
        return ConnectError(f"cannot connect to {where} through a SOCKS proxy: install "
                            f"envlink[socks] ({exc})", retryable=False)
    return ConnectionLostError(f"request to {where} failed: {type(exc).__name__}: {text}")


async def request_json(method: str, url: str, body: Any = None, *,
                       headers: HeaderPairs = (),
                       ssl: ssl_module.SSLContext | None = None,
                       proxy: str | bool | None = True,
                       max_size: int | None = DEFAULT_MAX_ANSWER,
                       timeout: float | None = None,
                       follow_redirects: bool = False) -> HttpAnswer:
    """Send one HTTP request (``body`` as JSON, if given) and read the JSON answer.

    Args:
        method: ``GET``, ``POST``...
        url: an ``http://`` or ``https://`` URL.
        body: a JSON-serialisable body, or ``None`` for none.
        headers: extra request headers (validated: no CR/LF).
        ssl: the SSL context for ``https://`` (a verifying one by default).
        proxy: ``True`` (the environment), ``None``/``False`` (none) or a proxy URL.
        max_size: the largest body read, in bytes (``None``: no bound).
        timeout: a deadline for the whole request, in seconds (``None``: the caller's).
        follow_redirects: follow up to 5 redirects (credentials dropped across origins,
            never from ``https`` to ``http``).

    Raises:
        ConnectError: the server (or the proxy) could not be reached; nothing was sent.
        ConnectionLostError: the connection failed after the request was sent.
        ProtocolError: the answer is not HTTP/1.x, too large, or not JSON.
        TimeoutError: ``timeout`` passed.
    """
    pairs = _pairs(headers)
    payload = None if body is None else json.dumps(
        body, separators=(",", ":"), allow_nan=False).encode()
    async with bounded(timeout):
        for _ in range(_MAX_REDIRECTS + 1):
            answer, location = await _one(method, url, payload, pairs, ssl, proxy, max_size)
            if location is None or not follow_redirects:
                return answer
            target = urljoin(url, location)
            if urlsplit(url).scheme == "https" and urlsplit(target).scheme != "https":
                raise ProtocolError(f"{redact_url(url)} redirected from https to "
                                    f"{urlsplit(target).scheme or 'a relative'}:// (refused)")
            if not _same_origin(url, target):
                pairs = [(k, v) for k, v in pairs if not is_sensitive_name(k)]
            if answer.status == 303 or (answer.status in (301, 302) and method == "POST"):
                method, payload = "GET", None
            url = target
        raise ProtocolError(f"{redact_url(url)}: more than {_MAX_REDIRECTS} redirects")


async def _one(method: str, url: str, payload: bytes | None, pairs: list[tuple[str, str]],
               ssl: ssl_module.SSLContext | None, proxy: str | bool | None,
               max_size: int | None) -> tuple[HttpAnswer, str | None]:
    where = redact_url(url)
    for name, value in pairs:
        if any(c in name or c in value for c in "\r\n\0") or not name.strip():
            raise ConnectError(f"header {name[:40]!r} for {where} contains CR, LF or NUL "
                               "(refused)", retryable=False)
    route = resolve_proxy(url, proxy)
    # identity: a compressed answer could inflate past max_size after it was counted.
    # One request per connection, as OpenEnv's clients do: nothing is kept open.
    merged = {"accept": ("Accept", "application/json"),
              "accept-encoding": ("Accept-Encoding", "identity"),
              "connection": ("Connection", "close"), "user-agent": ("User-Agent", "envlink")}
    if payload is not None:
        merged["content-type"] = ("Content-Type", "application/json")
    for name, value in pairs:
        if name.lower() in ("host", "content-length", "content-type", "accept",
                            "accept-encoding", "transfer-encoding", "connection"):
            continue
        merged[name.lower()] = (name, value)
    limit = max_size if max_size is not None else 1 << 62
    if route is None:
        # Direct: h11 on asyncio streams, no httpx (its import is most of a first
        # request's cost); imported here, so that `import envlink` loads neither.
        from envlink._transports import http11

        status, fields, body = await http11.exchange(
            method, url, list(merged.values()), payload, ssl=_context(ssl) if
            urlsplit(url).scheme == "https" else None, limit=limit, where=where,
            no_answer=NoAnswerError)
        return _answer(status, fields, body, where)
    import httpx

    sent = httpx.Headers(list(merged.values()))
    answered = False
    try:
        client = httpx.AsyncClient(verify=_context(ssl), proxy=route, trust_env=False,
                                   timeout=None, follow_redirects=False)
    except (ImportError, ValueError) as exc:
        raise _translate(exc, where, answered=False) from exc
    try:
        async with client, client.stream(method, url, content=payload, headers=sent) as r:
            answered = True
            status = r.status_code
            fields = {k.lower(): v for k, v in r.headers.items()}
            declared = fields.get("content-length", "")
            if declared.isdigit() and int(declared) > limit:
                if status >= 400:
                    return HttpAnswer(status, None, fields), None
                raise ProtocolError(f"the answer of {where} exceeds {limit} bytes "
                                    f"(Content-Length {declared})")
            data = bytearray()
            async for chunk in r.aiter_raw():
                data += chunk
                if len(data) > limit:
                    if status >= 400:  # the status is the answer; the body is not needed
                        return HttpAnswer(status, None, fields), None
                    raise ProtocolError(f"the answer of {where} exceeds {limit} bytes")
    except EnvlinkError:
        raise
    except (httpx.HTTPError, httpx.InvalidURL, ImportError, OSError, ValueError) as exc:
        raise _translate(exc, where, answered=answered) from exc
    return _answer(status, fields, bytes(data), where)


def _answer(status: int, fields: dict[str, str], data: bytes | None,
            where: str) -> tuple[HttpAnswer, str | None]:
    """The answer of either path, and where a redirect points (``None`` if none)."""
    location = fields.get("location") if 300 <= status < 400 else None
    if data is None:  # an error status whose body was over the limit
        return HttpAnswer(status, None, fields), None
    if fields.get("content-encoding", "identity").lower() not in ("identity", ""):
        raise ProtocolError(f"the answer of {where} is compressed ({fields['content-encoding']}),"
                            " which was not asked for")
    return _parse(status, data, fields, where), location


def _parse(status: int, data: bytes, fields: dict[str, str], where: str) -> HttpAnswer:
    if not data.strip():
        return HttpAnswer(status, None, fields)
    try:
        return HttpAnswer(status, json.loads(data), fields)
    except (ValueError, RecursionError) as exc:
        if status >= 400:
            return HttpAnswer(status, None, fields)
        raise ProtocolError(f"the answer of {where} is not JSON") from exc


async def post_json(url: str, body: Any, *,
                    headers: HeaderPairs = (),
                    ssl: ssl_module.SSLContext | None = None, proxy: str | bool | None = True,
                    max_size: int | None = DEFAULT_MAX_ANSWER,
                    timeout: float | None = None) -> HttpAnswer:
    """POST ``body`` as JSON to ``url`` and return the JSON answer (no redirects).

    The caller bounds it with its own deadline (it is cancellable throughout).

    Raises:
        ConnectError: the server (or the proxy) could not be reached; nothing was sent.
        ConnectionLostError: the connection failed after the request was sent.
        ProtocolError: the answer is not HTTP/1.x, too large, or not JSON.
    """
    return await request_json("POST", url, body, headers=headers, ssl=ssl, proxy=proxy,
                              max_size=max_size, timeout=timeout)


async def get_json(url: str, *, headers: HeaderPairs = (),
                   ssl: ssl_module.SSLContext | None = None, proxy: str | bool | None = True,
                   max_size: int | None = DEFAULT_MAX_ANSWER, timeout: float | None = None,
                   follow_redirects: bool = True) -> HttpAnswer:
    """GET ``url`` and return the JSON answer (see :func:`request_json`).

    Raises:
        ConnectError: the server (or the proxy) could not be reached.
        ConnectionLostError: the connection failed mid-answer.
        ProtocolError: the answer is not HTTP/1.x, too large, or not JSON.
        TimeoutError: ``timeout`` passed.
    """
    return await request_json("GET", url, headers=headers, ssl=ssl, proxy=proxy,
                              max_size=max_size, timeout=timeout,
                              follow_redirects=follow_redirects)


async def post_rpc(endpoint: Endpoint, options: ConnectionOptions, method: str,
                   params: Mapping[str, Any], *, request_id: int) -> RpcAnswer:
    """Post one JSON-RPC request, framed by :func:`~envlink._sansio.jsonrpc.rpc_request`,
    to ``endpoint.mcp_url`` with the connection's headers, credentials, SSL context,
    proxy and size bound (the transports' ``rpc``; the caller bounds it).

    Raises:
        ConnectError: the server (or the proxy) could not be reached; nothing was sent.
        ConnectionLostError: the connection failed after the request was sent.
        ProtocolError: the answer is not HTTP/1.x, too large, or not JSON.
    """
    headers: list[tuple[str, str]] = list(options.headers)
    if endpoint.auth_header is not None and not any(
        k.lower() == "authorization" for k, _ in headers
    ):
        headers.append(("Authorization", endpoint.auth_header))
    if options.user_agent is not None:
        headers.append(("User-Agent", options.user_agent))
    context = (options.ssl or ssl_module.create_default_context()) if endpoint.secure \
        else None
    answer = await post_json(endpoint.mcp_url, rpc_request(request_id, method, params),
                             headers=headers, ssl=context, proxy=options.proxy,
                             max_size=options.max_message_size)
    return RpcAnswer(answer.status, answer.body)


def retry_after_seconds(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header (a number or an HTTP date), else ``None``."""
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

