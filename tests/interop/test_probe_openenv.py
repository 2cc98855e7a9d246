"""`envlink probe` against a real OpenEnv 0.10 server: a true answer, exit 0, nothing left.

The stock echo server offers detached sessions and MCP tools but no envlink
extensions and no capacity figures; the probe says so, and ends the detached session
it created (``openenv/session/close``) without stepping it.
"""

from __future__ import annotations

from typing import Any

import pytest

from envlink._cli.probe import EXIT_HEALTHY, probe

from ._interop_support import RecordingServer, read_connections, read_rpc

pytestmark = pytest.mark.timeout(60)


async def test_probe_reads_an_openenv_server_truly(echo_server: RecordingServer, tag: str,
                                                   tag_headers: dict[str, Any]) -> None:
    """Healthy, plain OpenEnv protocol, openenv-resume under auto, simulation mode, the
    echo tools, a latency sample; its one detached session is closed and never stepped."""
    report = await probe(echo_server.base_url, samples=4, headers=tag_headers)
    data = report.as_json()
    assert report.exit_code == EXIT_HEALTHY, data["problems"]
    assert data["health"]["healthy"] is True and data["capacity"] is None
    assert data["protocol"] == "openenv"
    assert data["detached_sessions"] is True and data["recovery"] == "openenv-resume"
    assert data["mode"] == "simulation"
    assert data["metadata"]["name"] == "EchoEnvironment"
    assert "echo_message" in data["tools"]
    assert data["latency"]["samples"] == 4
    methods = [x.method for x in read_rpc(echo_server.frame_log, tag)]
    assert methods.count("openenv/session/create") == 1
    assert methods.count("openenv/session/close") == 1
    sent = [f["type"] for c in read_connections(echo_server.frame_log, tag) for f in c.sent]
    assert "step" not in sent and "reset" not in sent
    assert sent.count("state") >= 4
