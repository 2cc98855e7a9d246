"""The reference server as deployed: a bearer token, an Origin check, a connection cap,
idle timeouts for detached and attached sessions (the real `envlink serve` process
where the command line is what is checked)."""

from __future__ import annotations

import asyncio
import json
import urllib.request

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from envlink import GenericEnvClient, HandshakeRejectedError, ReconnectPolicy, set_testing
from envlink.server import EnvServer

from .._processes import ServerProcess

pytestmark = pytest.mark.timeout(40)

TOKEN = "t0ken-for-the-test-only"


async def test_serve_with_an_auth_token_refuses_a_client_without_it() -> None:
    """`envlink serve --auth-token T`: 401 HandshakeRejectedError without T, served with it."""
    server = ServerProcess("--auth-token", TOKEN)
    try:
        bare = GenericEnvClient(server.url, reconnect=ReconnectPolicy(max_attempts=1))
        with pytest.raises(HandshakeRejectedError) as info:
            await bare.reset()
        assert info.value.status == 401
        await bare.close()
        wrong = GenericEnvClient(server.url, headers={"Authorization": "Bearer nope"},
                                 reconnect=ReconnectPolicy(max_attempts=1))
        with pytest.raises(HandshakeRejectedError):
            await wrong.reset()
        await wrong.close()
        async with GenericEnvClient(server.url,
                                    headers={"Authorization": f"Bearer {TOKEN}"}) as env:
            result = await env.reset(seed=1)
            assert result.done is False
        # /health stays open (liveness probes carry no token) and shows no secret.
        health = await asyncio.to_thread(server.health)
        assert health["status"] == "healthy" and TOKEN not in json.dumps(health)
    finally:
        server.stop()


async def test_the_token_can_come_from_a_file(tmp_path: object) -> None:
    """--auth-token-file reads the token; the token is not on the command line."""
    path = tmp_path / "token"  # type: ignore[operator]
    path.write_text(TOKEN + "\n")
    server = ServerProcess("--auth-token-file", str(path))
    try:
        with pytest.raises(InvalidStatus) as info:
            async with connect(f"{server.url}/ws"):
                pass
        assert info.value.response.status_code == 401
        async with connect(f"{server.url}/ws",
                           additional_headers={"Authorization": f"Bearer {TOKEN}"}) as ws:
            await ws.send(json.dumps({"type": "reset", "data": {}}))
            assert json.loads(await ws.recv())["type"] == "observation"
    finally:
        server.stop()


async def test_origins_are_checked() -> None:
    """A browser Origin not listed gets 403; a listed one and no Origin are served."""
    server = ServerProcess("--allowed-origins", "https://app.example")
    try:
        with pytest.raises(InvalidStatus) as info:
            async with connect(f"{server.url}/ws", origin="https://evil.example"):  # type: ignore[arg-type]
                pass
        assert info.value.response.status_code == 403
        async with connect(f"{server.url}/ws", origin="https://app.example"):  # type: ignore[arg-type]
            pass
        async with connect(f"{server.url}/ws"):
            pass
    finally:
        server.stop()


async def test_no_browser_origin_is_allowed_by_default() -> None:
    """Without --allowed-origins, any web page's Origin is refused (403)."""
    async with EnvServer() as server:
        with pytest.raises(InvalidStatus) as info:
            async with connect(server.ws_url, origin="http://localhost:3000"):  # type: ignore[arg-type]
                pass
        assert info.value.response.status_code == 403


async def test_max_connections_drops_connections_beyond_the_cap() -> None:
    """--max-connections 3: three idle TCP connections are held, the fourth is dropped."""
    server = ServerProcess("--max-connections", "3")
    held: list[asyncio.StreamWriter] = []
    try:
        for _ in range(3):
            _reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            held.append(writer)
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        held.append(writer)
        try:  # dropped unanswered: EOF or a reset, never an answer
            writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            answer = await asyncio.wait_for(reader.read(), timeout=10)
        except ConnectionResetError:
            answer = b""
        assert answer == b""
        for w in held:
            w.transport.abort()
        held.clear()
        # Once the idle ones are gone, a client is served again.
        async with GenericEnvClient(server.url) as env:
            await env.reset()
    finally:
        for w in held:
            w.transport.abort()
        server.stop()


async def test_detached_sessions_nobody_attaches_to_expire() -> None:
    """Four unauthenticated creates fill max_sessions=4 only until their idle timeout."""
    async with EnvServer(detached_sessions=True, max_sessions=4,
                         detached_idle_timeout=0.3) as server:
        url = server.http_url + "/mcp"
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "openenv/session/create",
                           "params": {}}).encode()

        def create() -> dict[str, object]:
            request = urllib.request.Request(url, data=body,
                                             headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=10) as answer:
                return json.loads(answer.read())  # type: ignore[no-any-return]

        for _ in range(4):
            assert "result" in await asyncio.to_thread(create)
        assert "error" in await asyncio.to_thread(create)  # full
        await server.wait_for("session.expired", 4)
        assert "result" in await asyncio.to_thread(create)


async def test_an_idle_connection_is_closed_after_the_idle_timeout() -> None:
    """idle_timeout: a client that sends nothing is closed with 1001; resumable later."""
    with set_testing():
        async with EnvServer(idle_timeout=0.3) as server:
            async with connect(server.ws_url) as ws:
                with pytest.raises(ConnectionClosed) as info:
                    await asyncio.wait_for(ws.recv(), timeout=10)
            assert info.value.rcvd is not None and info.value.rcvd.code == 1001


def test_the_access_flags_reach_the_server_options(tmp_path: object) -> None:
    """Every access flag lands in the server's options; a bad combination exits."""
    from envlink.server._command import build_parser, options_from_args

    args = build_parser().parse_args([
        "--auth-token", TOKEN, "--allowed-origins", "https://a.example, https://b.example",
        "--max-connections", "7", "--idle-timeout", "30", "--detached-idle-timeout", "60"])
    options = options_from_args(args)
    assert options["auth_token"] == TOKEN
    assert options["allowed_origins"] == ["https://a.example", "https://b.example"]
    assert (options["max_connections"], options["idle_timeout"],
            options["detached_idle_timeout"]) == (7, 30.0, 60.0)
    with pytest.raises(SystemExit):
        options_from_args(build_parser().parse_args(["--keyfile", "k.pem"]))


async def test_serve_tls_from_the_command_line(tmp_path: object) -> None:
    """--certfile/--keyfile: `envlink serve` speaks wss://; a verifying client connects."""
    import ssl
    import subprocess
    import sys

    import trustme

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    chain = tmp_path / "chain.pem"  # type: ignore[operator]
    key = tmp_path / "key.pem"  # type: ignore[operator]
    cert.private_key_pem.write_to_path(str(key))
    chain.write_bytes(b"".join(blob.bytes() for blob in cert.cert_chain_pems))
    proc = await asyncio.to_thread(
        subprocess.Popen, [sys.executable, "-m", "envlink.server", "--port", "0",
                           "--certfile", str(chain), "--keyfile", str(key)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "wss://127.0.0.1:" in line, line
        url = line.strip().rsplit(" ", 1)[1]
        context = ssl.create_default_context()
        ca.configure_trust(context)
        async with GenericEnvClient(url, ssl=context) as env:
            await env.reset()
    finally:
        proc.kill()
        proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()
