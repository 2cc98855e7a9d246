"""A minimal HTTP/1.1 client for OpenEnv's ``POST /mcp`` (JSON-RPC) and ``GET /health``
(``/schema``, ``/metadata``), on asyncio streams.

Only what envlink needs and no new dependency: one JSON request per connection
(``Connection: close``), the client's handshake headers (``Authorization``...),
TLS with the client's SSL context, an HTTP(S) proxy through ``CONNECT`` (proxy
variables as for the WebSocket: the caller passes ``proxy=None`` for loopback),
``Content-Length``,
chunked or close-delimited answers, a bound on the answer's size.

Errors are envlink's: :class:`~envlink.ConnectError` when the request provably
never reached the server, :class:`~envlink.ConnectionLostError` once it may have,
:class:`~envlink.ProtocolError` for an answer that is not HTTP or not JSON.
"""

from __future__ import annotations

import asyncio
import base64
import json
import ssl as ssl_module
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from envlink._errors import ConnectError, ConnectionLostError, ProtocolError

__all__ = ["HttpAnswer", "NoAnswerError", "get_json", "post_json"]

_MAX_HEAD = 64 * 1024


class NoAnswerError(ConnectionLostError):
    """The server accepted the request, then closed without sending a byte back."""


@dataclass(frozen=True)
class HttpAnswer:
    """An HTTP answer: status and the JSON body (``None`` if the body was empty)."""

    status: int
    body: Any


def _proxy_for(scheme: str, host: str, proxy: str | bool | None) -> str | None:
    if proxy is None or proxy is False:
        return None
    if isinstance(proxy, str):
        return proxy
    import urllib.request  # (email, http.client...) only when a proxy may be configured

    if urllib.request.proxy_bypass(host):
        return None
    proxies = urllib.request.getproxies()
    return proxies.get(scheme) or proxies.get("all")


async def post_json(url: str, body: Any, *,
                    headers: Mapping[str, str] | list[tuple[str, str]] = (),  # type: ignore[assignment]
                    ssl: ssl_module.SSLContext | None = None, proxy: str | bool | None = True,
                    max_size: int | None = 1024 * 1024) -> HttpAnswer:
    """POST ``body`` as JSON to ``url`` and return the JSON answer.

    The caller bounds it with its own deadline (it is cancellable throughout).

    Raises:
        ConnectError: the server (or the proxy) could not be reached; nothing was sent.
        ConnectionLostError: the connection failed after the request was sent.
        ProtocolError: the answer is not HTTP/1.x, too large, or not JSON.
    """
    payload = json.dumps(body, separators=(",", ":")).encode()
    return await _request("POST", url, payload, headers=headers, ssl=ssl, proxy=proxy,
                          max_size=max_size)


async def get_json(url: str, *,
                   headers: Mapping[str, str] | list[tuple[str, str]] = (),  # type: ignore[assignment]
                   ssl: ssl_module.SSLContext | None = None, proxy: str | bool | None = True,
                   max_size: int | None = 1024 * 1024) -> HttpAnswer:
    """GET ``url`` and return the JSON answer (options and errors as :func:`post_json`).

    Redirects are not followed (a 3xx is returned as it is), so headers such as
    ``Authorization`` never reach another host.
    """
    return await _request("GET", url, None, headers=headers, ssl=ssl, proxy=proxy,
                          max_size=max_size)


async def _request(method: str, url: str, payload: bytes | None, *,
                   headers: Mapping[str, str] | list[tuple[str, str]],
                   ssl: ssl_module.SSLContext | None, proxy: str | bool | None,
                   max_size: int | None) -> HttpAnswer:
    parts = urlsplit(url)
    secure = parts.scheme == "https"
    host = parts.hostname or ""
    port = parts.port or (443 if secure else 80)
    where = f"{parts.scheme}://{host}:{port}{parts.path}"
    pairs = list(headers.items()) if isinstance(headers, Mapping) else list(headers)
    target = parts.path or "/"
    if parts.query:
        target += "?" + parts.query
    host_header = f"[{host}]" if ":" in host else host
    if parts.port is not None:
        host_header += f":{parts.port}"
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host_header}"]
    if payload is not None:
        lines += ["Content-Type: application/json", f"Content-Length: {len(payload)}"]
    lines += ["Accept: application/json", "Connection: close"]
    taken = {"host", "content-type", "accept", "content-length", "connection"}
    lines += [f"{k}: {v}" for k, v in pairs if k.lower() not in taken]
    request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (payload or b"")

    reader, writer = await _open(host, port, secure, ssl, _proxy_for(parts.scheme, host, proxy),
                                 where)
    try:
        try:
            writer.write(request)
            await writer.drain()
        except OSError as exc:
            raise ConnectionLostError(f"{method} {where} failed while sending: {exc}") from exc
        return await _read_answer(reader, max_size, where)
    finally:
        writer.transport.abort()


async def _open(host: str, port: int, secure: bool, context: ssl_module.SSLContext | None,
                proxy: str | None, where: str
                ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    tls = (context or ssl_module.create_default_context()) if secure else None
    try:
        if proxy is None:
            return await asyncio.open_connection(
                host, port, ssl=tls, server_hostname=host if tls else None)
        proxy_parts = urlsplit(proxy)
        if proxy_parts.scheme not in ("http", "https") or not proxy_parts.hostname:
            raise ConnectError(f"unsupported proxy {proxy_parts.scheme}:// for {where} "
                               "(only http:// and https:// proxies)", retryable=False)
        proxy_port = proxy_parts.port or (443 if proxy_parts.scheme == "https" else 80)
        reader, writer = await asyncio.open_connection(
            proxy_parts.hostname, proxy_port,
            ssl=ssl_module.create_default_context() if proxy_parts.scheme == "https" else None)
        connect = [f"CONNECT {host}:{port} HTTP/1.1", f"Host: {host}:{port}"]
        if proxy_parts.username is not None:
            raw = f"{unquote(proxy_parts.username)}:{unquote(proxy_parts.password or '')}"
            connect.append("Proxy-Authorization: Basic "
                           + base64.b64encode(raw.encode()).decode("ascii"))
        writer.write(("\r\n".join(connect) + "\r\n\r\n").encode("latin-1"))
        await writer.drain()
        status, _ = await _read_head(reader, where)
        if status != 200:
            writer.transport.abort()
            raise ConnectError(f"the proxy refused CONNECT to {where} (HTTP {status})",
                               retryable=status >= 500)
        if tls is not None:
            if sys.version_info < (3, 11):  # pragma: no cover - Python 3.10 only
                writer.transport.abort()
                raise ConnectError(f"POST {where} through a proxy needs Python 3.11 or later",
                                   retryable=False)
            await writer.start_tls(tls, server_hostname=host)
        return reader, writer
    except ConnectError:
        raise
    except ssl_module.SSLCertVerificationError as exc:
        raise ConnectError(f"TLS verification failed for {where}: {exc.verify_message}",
                           retryable=False) from exc
    except (OSError, asyncio.IncompleteReadError, ProtocolError) as exc:
        raise ConnectError(f"cannot connect to {where}: {exc}", retryable=True) from exc


async def _read_head(reader: asyncio.StreamReader, where: str) -> tuple[int, dict[str, str]]:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.LimitOverrunError as exc:
        raise ProtocolError(f"the HTTP answer of {where} has an oversized head") from exc
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            raise NoAnswerError(f"{where} closed the connection without answering") from exc
        raise ConnectionLostError(f"{where} closed the connection mid-answer") from exc
    except OSError as exc:
        raise ConnectionLostError(f"{where} closed the connection before answering") from exc
    if len(head) > _MAX_HEAD:
        raise ProtocolError(f"the HTTP answer of {where} has an oversized head")
    text = head.decode("latin-1").split("\r\n")
    status_line = text[0].split(" ", 2)
    if len(status_line) < 2 or not status_line[0].startswith("HTTP/1.") or (
            not status_line[1].isdigit()):
        raise ProtocolError(f"{where} did not answer HTTP/1.x: {text[0][:80]!r}")
    fields: dict[str, str] = {}
    for line in text[1:]:
        if ":" in line:
            name, value = line.split(":", 1)
            fields[name.strip().lower()] = value.strip()
    return int(status_line[1]), fields


async def _read_answer(reader: asyncio.StreamReader, max_size: int | None,
                       where: str) -> HttpAnswer:
    status, fields = await _read_head(reader, where)
    limit = max_size if max_size is not None else 1 << 62
    try:
        if "chunked" in fields.get("transfer-encoding", "").lower():
            body = bytearray()
            while True:
                size_line = await reader.readuntil(b"\r\n")
                size = int(size_line.split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    break
                if len(body) + size > limit:
                    raise ProtocolError(f"the answer of {where} exceeds {limit} bytes")
                body += await reader.readexactly(size)
                await reader.readexactly(2)
        elif "content-length" in fields:
            length = int(fields["content-length"])
            if length > limit:
                raise ProtocolError(f"the answer of {where} exceeds {limit} bytes")
            body = bytearray(await reader.readexactly(length))
        else:
            body = bytearray(await reader.read(limit + 1))
            if len(body) > limit:
                raise ProtocolError(f"the answer of {where} exceeds {limit} bytes")
    except ValueError as exc:
        raise ProtocolError(f"the HTTP answer of {where} is malformed: {exc}") from exc
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError) as exc:
        raise ConnectionLostError(f"{where} closed the connection mid-answer") from exc
    if not body.strip():
        return HttpAnswer(status, None)
    try:
        return HttpAnswer(status, json.loads(body))
    except ValueError as exc:
        if status >= 400:
            return HttpAnswer(status, None)
        raise ProtocolError(f"the answer of {where} is not JSON") from exc
