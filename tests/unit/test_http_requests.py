"""envlink's HTTP requests (direct, or through a proxy on httpx) and its one proxy rule,
against loopback servers.

Each case is a defect of the former hand-written client or a promise of the new
one: refused CR/LF headers, close-delimited answers read whole, huge headers
reported as such, credentials dropped across origins, one proxy route for the
WebSocket and the HTTP paths.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

import envlink
from envlink import ConnectError, ConnectionLostError, ProtocolError
from envlink._transports.base import parse_endpoint
from envlink._transports.http import NoAnswerError, get_json, post_json, request_json
from envlink._transports.proxy import resolve_proxy
from envlink._transports.websocket import WebSocketTransport

pytestmark = pytest.mark.timeout(30)

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@pytest.fixture
async def http_server() -> AsyncIterator[Callable[[Handler], Awaitable[str]]]:
    """Loopback TCP servers answering with a scripted handler; closed afterwards."""
    servers: list[asyncio.base_events.Server] = []

    async def start(handler: Handler) -> str:
        server = await asyncio.start_server(handler, "127.0.0.1", 0)
        servers.append(server)
        return f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"

    yield start
    for server in servers:
        server.close()
        await server.wait_closed()


async def _head(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            await reader.readexactly(int(line.split(b":")[1]))
    return head


async def test_a_close_delimited_answer_in_two_pieces_is_read_whole(
        http_server: Callable[[Handler], Awaitable[str]]) -> None:
    """An answer without Content-Length, sent in two writes, arrives whole."""
    halves = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _head(reader)
        writer.write(b'HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n{"result":')
        await writer.drain()
        await asyncio.sleep(0)  # a second segment, after the first was flushed
        halves.set()
        writer.write(b' {"session_id": "abc"}}')
        await writer.drain()
        writer.close()

    answer = await post_json(await http_server(handler) + "/mcp", {}, proxy=None)
    assert answer.body == {"result": {"session_id": "abc"}}
    assert halves.is_set()


@pytest.mark.parametrize("value", ["a\r\nX-Injected: 1", "a\nb", "a\rb"])
async def test_a_header_with_cr_or_lf_is_refused_before_anything_is_sent(
        http_server: Callable[[Handler], Awaitable[str]], value: str) -> None:
    """CR/LF in a header value is a typed ConnectError; the server receives nothing."""
    seen: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await reader.read(65536))
        writer.close()

    url = await http_server(handler)
    with pytest.raises(ConnectError, match="CR, LF") as caught:
        await post_json(url + "/mcp", {}, headers=[("X-Api-Key", value)], proxy=None)
    assert not caught.value.retryable
    assert seen == []


async def test_five_thousand_response_headers_are_reported_as_oversized_headers(
        http_server: Callable[[Handler], Awaitable[str]]) -> None:
    """A head of 5,000 headers is a ProtocolError naming headers, not a connect timeout."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _head(reader)
        writer.write(b"HTTP/1.1 200 OK\r\n" + b"".join(
            b"X-Filler-%d: %s\r\n" % (i, b"v" * 40) for i in range(5000)) + b"\r\n{}")
        await writer.drain()
        writer.close()

    with pytest.raises(ProtocolError, match="header"):
        await post_json(await http_server(handler) + "/mcp", {}, proxy=None)


async def test_an_error_answer_larger_than_the_limit_is_not_held(
        http_server: Callable[[Handler], Awaitable[str]]) -> None:
    """A 500 with a body far over max_size returns its status, without the body."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _head(reader)
        writer.write(b"HTTP/1.1 500 Oops\r\nTransfer-Encoding: chunked\r\n\r\n")
        for _ in range(64):  # 4 MiB, far over the 64 KiB limit
            writer.write(b"10000\r\n" + b"x" * 65536 + b"\r\n")
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        writer.close()

    answer = await post_json(await http_server(handler) + "/mcp", {}, proxy=None,
                             max_size=65536)
    assert (answer.status, answer.body) == (500, None)


async def test_get_json_and_a_deadline(http_server: Callable[[Handler], Awaitable[str]]) -> None:
    """get_json reads a JSON answer; a server that never answers ends at the deadline."""
    stall = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await _head(reader)
        if b"/slow" in head:
            await stall.wait()
        body = json.dumps({"status": "healthy"}).encode()
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        writer.close()

    url = await http_server(handler)
    assert (await get_json(url + "/health", proxy=None)).body == {"status": "healthy"}
    with pytest.raises(TimeoutError):
        await get_json(url + "/slow", proxy=None, timeout=0.3)
    stall.set()


async def test_a_cross_origin_redirect_drops_credentials(
        http_server: Callable[[Handler], Awaitable[str]]) -> None:
    """Authorization, X-Api-Key and the resume token reach the first origin only."""
    heads: dict[str, bytes] = {}

    async def other(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        heads["other"] = await _head(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
        await writer.drain()
        writer.close()

    other_url = await http_server(other)
    # Another port on the same host is another origin.

    async def first(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        heads["first"] = await _head(reader)
        writer.write(b"HTTP/1.1 302 Found\r\nLocation: %s/next\r\nContent-Length: 0\r\n\r\n"
                     % other_url.encode())
        await writer.drain()
        writer.close()

    secrets = [("Authorization", "Bearer SECRET1"), ("X-Api-Key", "SECRET2"),
               ("envlink-resume", "SECRET3"), ("X-Trace", "kept")]
    answer = await get_json(await http_server(first) + "/start", headers=secrets, proxy=None)
    assert answer.status == 200
    assert b"SECRET1" in heads["first"] and b"SECRET2" in heads["first"]
    assert b"SECRET" not in heads["other"]
    assert b"X-Trace: kept" in heads["other"]


async def test_redirect_loops_end_in_a_protocol_error(
        http_server: Callable[[Handler], Awaitable[str]]) -> None:
    """A server redirecting to itself forever ends in a typed error after 5 hops."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _head(reader)
        writer.write(b"HTTP/1.1 307 Again\r\nLocation: /again\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()
        writer.close()

    with pytest.raises(ProtocolError, match="redirects"):
        await request_json("GET", await http_server(handler) + "/x", proxy=None,
                           follow_redirects=True)


# ------------------------------------------------------------------ one proxy rule


PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "WS_PROXY", "WSS_PROXY",
                   "SOCKS_PROXY")


def _clear_proxy_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)


@pytest.mark.parametrize(("env", "plain", "secure"), [
    # websockets' order (RFC 6455: SOCKS, then the HTTPS proxy), for ws:// and http:// alike.
    ({"HTTPS_PROXY": "http://s:1"}, "http://s:1", "http://s:1"),
    ({"HTTP_PROXY": "http://p:1"}, "http://p:1", None),
    ({"HTTP_PROXY": "http://p:1", "HTTPS_PROXY": "http://s:1"}, "http://s:1", "http://s:1"),
    ({"WS_PROXY": "http://w:1", "WSS_PROXY": "http://ws:1", "HTTPS_PROXY": "http://s:1"},
     "http://w:1", "http://ws:1"),
    ({"SOCKS_PROXY": "http://k:1080", "HTTPS_PROXY": "http://s:1"},
     "socks5h://k:1080", "socks5h://k:1080"),
    ({"socks_proxy": "k:1080"}, "socks5h://k:1080", "socks5h://k:1080"),
    ({"ALL_PROXY": "http://a:1"}, "http://a:1", "http://a:1"),
])
def test_websocket_targets_take_the_proxy_websockets_takes(
        monkeypatch: pytest.MonkeyPatch, env: dict[str, str], plain: str | None,
        secure: str | None) -> None:
    """The variables websockets reads, in its order; an HTTP request to the same host
    (POST /mcp, /health) takes the WebSocket's route."""
    _clear_proxy_variables(monkeypatch)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert resolve_proxy("ws://h/ws", True) == resolve_proxy("http://h/mcp", True) == plain
    assert resolve_proxy("wss://h/ws", True) == resolve_proxy("https://h/mcp", True) == secure


def test_the_rule_matches_websockets_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where websockets' get_proxy() picks a proxy for a remote ws:// or wss:// URL,
    resolve_proxy picks the same one (NO_PROXY included)."""
    from websockets.uri import parse_uri

    try:
        from websockets.proxy import get_proxy
    except ImportError:  # websockets < 16 (the floor, 15.0) keeps it in websockets.uri
        from websockets.uri import get_proxy  # type: ignore[attr-defined,no-redef]

    cases = [{"HTTPS_PROXY": "http://s:1"}, {"HTTP_PROXY": "http://p:1"},
             {"HTTP_PROXY": "http://p:1", "HTTPS_PROXY": "http://s:1"},
             {"WSS_PROXY": "http://ws:1", "HTTPS_PROXY": "http://s:1"},
             {"HTTPS_PROXY": "http://s:1", "NO_PROXY": "h.example"},
             {"HTTPS_PROXY": "http://s:1", "NO_PROXY": ".example"}]
    for env in cases:
        _clear_proxy_variables(monkeypatch)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        for url in ("ws://h.example:8000/ws", "wss://h.example/ws"):
            assert resolve_proxy(url, True) == get_proxy(parse_uri(url)), (env, url)


def test_all_proxy_no_proxy_and_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    """ALL_PROXY is the fallback; NO_PROXY (names, suffixes, networks) and loopback bypass."""
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "all_proxy",
                 "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ALL_PROXY", "socks5h://p:1080")
    monkeypatch.setenv("NO_PROXY", "internal.example, 10.0.0.0/8,.corp,exact:8443")
    assert resolve_proxy("ws://h/ws", True) == "socks5h://p:1080"
    assert resolve_proxy("https://h/mcp", True) == "socks5h://p:1080"
    assert resolve_proxy("ws://a.internal.example/ws", True) is None
    assert resolve_proxy("ws://10.1.2.3/ws", True) is None
    assert resolve_proxy("ws://x.corp/ws", True) is None
    assert resolve_proxy("https://exact:8443/", True) is None
    assert resolve_proxy("https://exact:9443/", True) == "socks5h://p:1080"
    assert resolve_proxy("ws://127.0.0.1:8000/ws", True) is None
    assert resolve_proxy("ws://localhost/ws", True) is None
    assert resolve_proxy("ws://[::1]/ws", True) is None
    assert resolve_proxy("ws://127.0.0.1/ws", "http://explicit:1") == "http://explicit:1"
    assert resolve_proxy("ws://h/ws", None) is None


def test_an_unsupported_proxy_scheme_is_a_typed_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """ftp:// or socks4:// as a proxy: a ConnectError that is not retried, without secrets."""
    monkeypatch.setenv("ALL_PROXY", "socks4://user:PW@p:1080")
    monkeypatch.delenv("all_proxy", raising=False)
    monkeypatch.delenv("HTTP_PROXY", raising=False)
    monkeypatch.delenv("http_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    with pytest.raises(ConnectError, match="unsupported") as caught:
        resolve_proxy("ws://h/ws", True)
    assert not caught.value.retryable and "PW" not in str(caught.value)


async def test_both_paths_leave_through_the_same_proxy(
        http_server: Callable[[Handler], Awaitable[str]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With ALL_PROXY only, the WebSocket and POST /mcp both go to that proxy."""
    seen: list[bytes] = []

    async def proxy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append((await reader.readuntil(b"\r\n")).strip())
        writer.write(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()
        writer.close()

    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "all_proxy",
                 "no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ALL_PROXY", await http_server(proxy))
    endpoint = parse_endpoint("http://envlink-test.invalid:8000")
    transport = WebSocketTransport()
    options = envlink.ConnectionOptions()
    with pytest.raises(envlink.EnvlinkError):
        await transport.connect(endpoint, options, headers={}, timeout=5)
    answer = await transport.rpc(endpoint, options, "tools/list", {}, request_id=1)
    assert answer.status == 502
    assert len(seen) == 2
    assert seen[0] == b"CONNECT envlink-test.invalid:8000 HTTP/1.1"
    assert seen[1].startswith(b"POST http://envlink-test.invalid:8000/mcp")


# ---------------------------------------------- direct requests (no proxy): http11


async def _answering(http_server: Callable[[Handler], Awaitable[str]], raw: bytes,
                     *, close: bool = True) -> str:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _head(reader)
        writer.write(raw)
        await writer.drain()
        if close:
            writer.close()

    return await http_server(handler)


async def test_a_chunked_answer_with_trailers_after_an_interim_answer_is_read_whole(
        http_server: Callable[[Handler], Awaitable[str]]) -> None:
    """100 Continue is skipped; a chunked body (with a trailer) is joined; headers kept."""
    url = await _answering(http_server, (
        b"HTTP/1.1 100 Continue\r\n\r\n"
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-Served-By: a\r\n\r\n"
        b"5\r\n{\"ok\"\r\n6;ext=1\r\n: true\r\n1\r\n}\r\n0\r\nX-Trailer: t\r\n\r\n"))
    answer = await post_json(url + "/mcp", {}, proxy=None)
    assert (answer.status, answer.body) == (200, {"ok": True})
    assert answer.headers["x-served-by"] == "a"


async def test_a_server_closing_without_a_byte_is_no_answer_and_mid_answer_is_lost(
        http_server: Callable[[Handler], Awaitable[str]]) -> None:
    """Closed before any byte: NoAnswerError; closed inside the body: ConnectionLostError."""
    silent = await _answering(http_server, b"")
    with pytest.raises(NoAnswerError, match="without answering"):
        await post_json(silent + "/mcp", {}, proxy=None)
    cut = await _answering(http_server, b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\n{\"a\"")
    with pytest.raises(ConnectionLostError, match="mid-answer") as caught:
        await post_json(cut + "/mcp", {}, proxy=None)
    assert not isinstance(caught.value, NoAnswerError)


@pytest.mark.parametrize("raw", [
    b"SSH-2.0-OpenSSH_9.6\r\n\r\n",
    b"HTTP/1.1 2OO OK\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nBad Header Name: x\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 2, 3\r\n\r\n{}",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
])
async def test_an_answer_that_is_not_http_is_a_protocol_error(
        http_server: Callable[[Handler], Awaitable[str]], raw: bytes) -> None:
    """Not HTTP, a bad status or header line, a conflicting length, bad chunks: typed."""
    url = await _answering(http_server, raw)
    with pytest.raises(ProtocolError):
        await post_json(url + "/mcp", {}, proxy=None)


async def test_a_success_over_the_limit_is_refused_and_redirects_are_still_followed(
        http_server: Callable[[Handler], Awaitable[str]]) -> None:
    """A 200 over max_size is a ProtocolError; a 307 on the direct path is followed."""
    big = await _answering(http_server, b"HTTP/1.1 200 OK\r\nContent-Length: 9999\r\n\r\n")
    with pytest.raises(ProtocolError, match="exceeds 100 bytes"):
        await get_json(big + "/x", proxy=None, max_size=100)

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await _head(reader)
        if b"GET /old " in head:
            writer.write(b"HTTP/1.1 307 Moved\r\nLocation: /new\r\nContent-Length: 0\r\n\r\n")
        else:
            writer.write(b'HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\n{"new": 1} ')
        await writer.drain()
        writer.close()

    url = await http_server(handler)
    assert (await get_json(url + "/old", proxy=None)).body == {"new": 1}


async def test_a_direct_request_sends_one_well_formed_head(
        http_server: Callable[[Handler], Awaitable[str]]) -> None:
    """Host with the port, the caller's headers once (its User-Agent wins), the body's
    length, Connection: close; the restricted names are not overridden."""
    heads: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        heads.append(await _head(reader))
        writer.write(b"HTTP/1.1 204 No Content\r\n\r\n")
        await writer.drain()
        writer.close()

    url = await http_server(handler)
    answer = await post_json(url + "/mcp?x=1", {"a": 1}, proxy=None, headers=[
        ("User-Agent", "mine"), ("Authorization", "Bearer t"), ("Host", "evil"),
        ("Content-Length", "0")])
    assert (answer.status, answer.body) == (204, None)
    lines = heads[0].decode().split("\r\n")
    assert lines[0] == "POST /mcp?x=1 HTTP/1.1"
    fields = [line.split(":", 1)[0].lower() for line in lines[1:] if line]
    assert sorted(fields) == sorted({*fields})  # each header once
    assert f"Host: {url.split('://')[1]}" in lines and "Connection: close" in lines
    assert "User-Agent: mine" in lines and "Authorization: Bearer t" in lines
    assert "Content-Length: 7" in lines
