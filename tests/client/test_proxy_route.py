"""With only HTTPS_PROXY set, a ws:// server on another host is reached through that proxy,
and POST /mcp to it takes the same route (websockets' rule, and so OpenEnv's client's)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import pytest

from envlink import EchoEnv, GenericEnvClient
from envlink.server import ServerThread

pytestmark = pytest.mark.timeout(60)

#: A host name that resolves nowhere: only a proxy can reach it (the proxy maps it to
#: 127.0.0.1). Loopback targets themselves are never proxied.
REMOTE = "envlink-remote.invalid"


class ConnectProxy:
    """A real HTTP proxy on 127.0.0.1: CONNECT tunnels and absolute-form requests, for
    :data:`REMOTE` only, which it reaches on 127.0.0.1; it records each request line."""

    def __init__(self) -> None:
        self.requests: list[str] = []
        self.url = ""
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> ConnectProxy:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            line = head.split(b"\r\n", 1)[0].decode("ascii")
            self.requests.append(line)
            method, target, version = line.split(" ")
            if method == "CONNECT":
                host, _, port = target.rpartition(":")
                prefix = b""
            else:
                parts = urlsplit(target)
                host, port = parts.hostname or "", str(parts.port)
                path = parts.path + (f"?{parts.query}" if parts.query else "")
                prefix = head.replace(line.encode("ascii"),
                                      f"{method} {path} {version}".encode("ascii"), 1)
            if host != REMOTE:
                writer.write(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
                return
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", int(port))
            if method == "CONNECT":
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            else:
                up_writer.write(prefix)
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        except (OSError, asyncio.IncompleteReadError, ValueError):
            pass
        finally:
            writer.close()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(65536):
            writer.write(chunk)
            await writer.drain()
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            writer.close()


@pytest.fixture
async def https_proxy_only(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[ConnectProxy]:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "WS_PROXY",
                 "WSS_PROXY", "SOCKS_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    async with ConnectProxy() as proxy:
        monkeypatch.setenv("HTTPS_PROXY", proxy.url)
        yield proxy


async def test_a_ws_server_is_reached_through_https_proxy_alone(
        https_proxy_only: ConnectProxy) -> None:
    """ws://remote with only HTTPS_PROXY: the WebSocket goes through the proxy (CONNECT),
    as websockets (and OpenEnv's client) send it."""
    with ServerThread(env="echo") as st:
        url = f"ws://{REMOTE}:{st.port}"
        async with GenericEnvClient(url) as env:
            assert (await env.step({"message": "via proxy"})).observation[
                "echoed_message"] == "via proxy"
    assert https_proxy_only.requests == [f"CONNECT {REMOTE}:{st.port} HTTP/1.1"]


async def test_post_mcp_takes_the_websockets_route(https_proxy_only: ConnectProxy) -> None:
    """In production mode, tool calls go as POST /mcp to the same host, and through the same
    proxy as the WebSocket."""
    with ServerThread(env="echo", detached_sessions=True) as st:
        async with EchoEnv(base_url=f"http://{REMOTE}:{st.port}", mode="production") as env:
            await env.reset()
            # The reference server's answer, via POST.
            assert await env.call_tool("echo_message", message="hi") == "hi"
    lines = https_proxy_only.requests
    assert f"CONNECT {REMOTE}:{st.port} HTTP/1.1" in lines
    assert f"POST http://{REMOTE}:{st.port}/mcp HTTP/1.1" in lines
    assert all(line.startswith(("CONNECT ", f"POST http://{REMOTE}:{st.port}/"))
               for line in lines), lines
