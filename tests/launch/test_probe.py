"""`envlink probe`: a true one-screen answer, and an exit status a readiness probe can use.

Against the real reference server on loopback (plain, with a token, over TLS, by a
Space's name), a dead port, and a plain HTTP server that is not an environment
server. The OpenEnv server is in tests/interop/test_probe_openenv.py.
"""

from __future__ import annotations

import asyncio
import functools
import http.server
import json
import socket
import ssl
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import trustme

from envlink._cli.main import main
from envlink._cli.probe import EXIT_HEALTHY, EXIT_UNHEALTHY, EXIT_USAGE, probe
from envlink._launch.lifecycle import override_space_urls
from envlink.server import EnvServer, ServerThread

from .._ports import restartable_port

pytestmark = pytest.mark.timeout(30)


async def test_reference_server_healthy_with_extensions_capacity_tools_and_latency() -> None:
    """The reference server: healthy, envlink's extensions, envlink-resume, its sessions,
    schema, both tools and a latency sample of the asked size; the probe's session ends."""
    async with EnvServer(env="echo", max_sessions=7) as srv:
        ended = asyncio.Event()
        srv.add_counter_listener(
            lambda name, _value: ended.set() if name == "session.destroyed" else None)
        report = await probe(srv.url, samples=5)
        data = report.as_json()
        assert report.exit_code == EXIT_HEALTHY, data["problems"]
        assert data["health"]["healthy"] is True
        assert data["capacity"] == {"sessions": 0, "max_sessions": 7}
        assert data["protocol"] == "envlink" and data["recovery"] == "envlink-resume"
        assert data["mode"] == "simulation"
        assert data["tools"] == ["echo_message", "echo_with_length"]
        assert data["latency"]["samples"] == 5
        assert 0 < data["latency"]["p50_ms"] <= data["latency"]["p99_ms"]
        assert "message" in json.dumps(data["schema"])
        await asyncio.wait_for(ended.wait(), 10)  # the probe ended its session


@pytest.mark.parametrize("forced", ["websockets", "picows"])
async def test_the_probe_names_the_transport(forced: str, monkeypatch: pytest.MonkeyPatch
                                             ) -> None:
    """The report names the transport the probe's session used (ENVLINK_TRANSPORT)."""
    pytest.importorskip("picows")
    monkeypatch.setenv("ENVLINK_TRANSPORT", forced)
    async with EnvServer(env="echo") as srv:
        report = await probe(srv.url, samples=2)
    assert report.as_json()["transport"] == forced
    assert ("transport", forced) in report.lines


async def test_dead_port_is_unreachable_and_exits_1() -> None:
    """Nothing listening: exit 1, 'unreachable', and no question asked after /health."""
    report = await probe(f"http://127.0.0.1:{restartable_port()}", timeout=5.0)
    data = report.as_json()
    assert report.exit_code == EXIT_UNHEALTHY
    assert data["health"]["reachable"] is False
    assert "session" not in data and "latency" not in data
    assert report.problems[0].startswith("health: unreachable")


@pytest.fixture
async def not_an_env_server() -> AsyncIterator[str]:
    """A plain HTTP server on loopback that answers 404 to every request."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        body = b"not found"
        writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Type: text/plain\r\n"
                     b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.close()
        await server.wait_closed()


async def test_plain_http_server_is_not_an_environment_server(not_an_env_server: str) -> None:
    """An HTTP server without /health or /ws: exit 1, both 404s named, no mode guessed."""
    report = await probe(not_an_env_server, timeout=5.0)
    data = report.as_json()
    assert report.exit_code == EXIT_UNHEALTHY
    assert data["health"] == {"reachable": True, "status": 404}
    assert data["session"] == {"opened": False, "status": 404}
    assert "mode" not in data
    assert "not an OpenEnv environment server" in report.problems[0]


@pytest.fixture
def python_http_server(tmp_path: Any) -> Iterator[str]:
    """Python's own http.server on loopback, serving an empty folder: HTTP/1.0 answers,
    404 to every GET and 501 to every POST (which auto recovery's POST /mcp meets)."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


async def test_python_http_server_names_the_missing_endpoints_first(
        python_http_server: str) -> None:
    """The first line names what is missing (/health and /ws), not the 501 that auto
    recovery's POST /mcp met; nothing is asked after that."""
    report = await probe(python_http_server, timeout=5.0)
    data = report.as_json()
    assert report.exit_code == EXIT_UNHEALTHY
    assert report.lines[0] == (
        "missing", "/health and /ws (HTTP 404): not an OpenEnv environment server at this URL")
    assert data["missing"] == ["/health", "/ws"]
    assert data["session"]["status"] == 404
    assert not any("/mcp" in p or "501" in p for p in report.problems), report.problems
    assert "schema" not in data and "mode" not in data


async def test_reference_environments_describe_their_actions_in_the_schema() -> None:
    """The deterministic environment's /schema gives its action ({"move": n}) and its
    observation's fields, so the probe prints them instead of '-'."""
    async with EnvServer(env="deterministic") as srv:
        report = await probe(srv.url, samples=1)
    schema = report.as_json()["schema"]
    assert schema["action"] == ["move"]
    assert schema["observation"][:3] == ["position", "draw", "step"]
    assert "seed" in schema["state"]


async def test_a_token_server_explains_401_and_opens_with_the_header() -> None:
    """/health is open but the upgrade wants a token: 401 explained; with -H, healthy."""
    async with EnvServer(env="echo", auth_token="s3cret-token") as srv:
        refused = await probe(srv.url, samples=1)
        assert refused.exit_code == EXIT_UNHEALTHY
        assert refused.as_json()["session"]["status"] == 401
        assert "wants credentials" in refused.problems[0]
        allowed = await probe(srv.url, samples=1,
                              headers={"Authorization": "Bearer s3cret-token"})
        assert allowed.exit_code == EXIT_HEALTHY, allowed.problems
    assert "s3cret-token" not in json.dumps([refused.as_json(), allowed.as_json()])


async def test_a_refused_origin_is_explained_as_403() -> None:
    """An Origin the server does not allow: the upgrade's 403 is named, with what to check."""
    async with EnvServer(env="echo", allowed_origins=["http://good.example"]) as srv:
        report = await probe(srv.url, samples=1, headers={"Origin": "http://evil.example"})
    assert report.exit_code == EXIT_UNHEALTHY
    assert report.as_json()["session"]["status"] == 403
    assert "allowed origins" in report.problems[0]


async def test_an_untrusted_certificate_is_explained_in_one_line() -> None:
    """TLS with a certificate from an unknown CA: exit 1, one line naming the fix."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    trustme.CA().issue_cert("127.0.0.1").configure_cert(context)
    async with EnvServer(env="echo", ssl=context) as srv:
        report = await probe(srv.http_url, timeout=5.0)
    assert report.exit_code == EXIT_UNHEALTHY
    problem = report.problems[0]
    assert "certificate is not trusted" in problem and "SSL_CERT_FILE" in problem
    assert "\n" not in problem


async def test_a_space_by_name_is_probed_at_its_url() -> None:
    """`owner/space` resolves as the client resolves it, and the Space is probed there."""
    async with EnvServer(env="echo") as srv:
        with override_space_urls({"owner/echo": srv.http_url}):
            report = await probe("owner/echo", samples=2)
    assert report.exit_code == EXIT_HEALTHY, report.problems
    assert report.url == srv.http_url.rstrip("/")


@pytest.fixture
def server_thread_for_cli() -> Iterator[ServerThread]:
    with ServerThread(env="echo") as st:
        yield st


def test_cli_prints_one_screen_and_json_with_exit_codes(
        server_thread_for_cli: ServerThread, capsys: pytest.CaptureFixture[str]) -> None:
    """`envlink probe`: a table of at most 24 lines, --json, and 0 / 1 / 2 as documented."""
    url = server_thread_for_cli.url
    assert main(["probe", url, "-n", "3"]) == EXIT_HEALTHY
    table = capsys.readouterr().out
    assert len(table.splitlines()) <= 24
    assert table.splitlines()[-1] == "result: healthy (exit 0)"
    assert main(["probe", url, "-n", "3", "--json"]) == EXIT_HEALTHY
    data = json.loads(capsys.readouterr().out)
    assert data["healthy"] is True and data["exit_code"] == 0
    assert main(["probe", f"http://127.0.0.1:{restartable_port()}", "--json"]) == EXIT_UNHEALTHY
    assert json.loads(capsys.readouterr().out)["healthy"] is False
    assert main(["probe", url, "-n", "0"]) == EXIT_USAGE
    assert main(["probe", "htp://nowhere"]) == EXIT_USAGE
    assert main(["probe", url, "-H", "no colon"]) == EXIT_USAGE
    assert "envlink probe: error:" in capsys.readouterr().err


def _answer_one_poll_not_ready(listener: socket.socket) -> bytes:
    """Accept one connection on ``listener``, read its request and answer 503 (a server
    still starting); the request line is returned."""
    conn, _ = listener.accept()
    with conn:
        conn.settimeout(20)
        request = b""
        while b"\r\n\r\n" not in request:
            chunk = conn.recv(4096)
            if not chunk:
                break
            request += chunk
        conn.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n"
                     b"Connection: close\r\n\r\n")
    return request.split(b"\r\n", 1)[0]


def test_wait_polls_until_the_server_is_ready() -> None:
    """--wait: the probe's first poll fails (the port answers 503, as a server still
    starting does); only then does the server start on that port, and the probe, still
    polling, finds it healthy (the real command)."""
    port = restartable_port()
    listener = socket.create_server(("127.0.0.1", port))
    listener.settimeout(20)
    prober = subprocess.Popen(
        [sys.executable, "-m", "envlink", "probe", f"http://127.0.0.1:{port}", "--wait", "20",
         "-n", "2", "--json"], stdout=subprocess.PIPE, text=True)
    try:
        with listener:
            first = _answer_one_poll_not_ready(listener)  # the probe has failed once
        assert first.startswith(b"GET /health "), first
        with ServerThread(env="echo", port=port):
            out, _ = prober.communicate(timeout=25)
    finally:
        prober.kill()
    assert prober.returncode == EXIT_HEALTHY, out
    health = json.loads(out)["health"]
    assert health["healthy"] is True
    # The request is timed apart from the wait (which includes the failed poll).
    assert health["waited_s"] > 0
    assert health["ms"] < health["waited_s"] * 1000
