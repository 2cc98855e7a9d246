"""OpenEnv 0.10's MCP tool client surface and its `except` clauses, once with OpenEnv's
client and once with envlink's (only the import changed), on real servers.

Each idiom is one script, run under the openenv virtualenv with OpenEnv's imports and
under envlink's interpreter with envlink's; both must succeed and report the same JSON.
The MCP idioms run against OpenEnv's echo server (an ``MCPEnvironment`` with HTTP MCP
sessions); the error idiom against OpenEnv's echo server at its session limit, envlink's
reference server refusing an upgrade (403), and a closed port.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ._interop_support import RecordingServer, ServerProcess, python_command, read_rpc

pytestmark = pytest.mark.timeout(120)

SCRIPT_DEADLINE = 50.0

IMPORTS = {
    "openenv": """
        from openenv.core import GenericEnvClient
        from openenv.core.env_server.mcp_types import CallToolAction
        from openenv.core.mcp_client import MCPToolClient
    """,
    "envlink": """
        from envlink import CallToolAction, GenericEnvClient, MCPToolClient
    """,
}

IDIOMS = {
    "mcp_tool_client_async": """
        import asyncio

        async def main():
            async with MCPToolClient(base_url=URL, headers=HEADERS) as env:
                await env.reset()
                tools = await env.list_tools()
                again = await env.list_tools()
                fresh = await env.list_tools(use_cache=False)
                tool = await env.get_tool("echo_with_length")
                out = dict(
                    names=[t.name for t in tools], cached=again is tools,
                    fresh=[t.name for t in fresh], schema=tools[0].input_schema.get("type"),
                    described=bool(tool.description),
                    missing=(await env.get_tool("nope")) is None,
                    has=[await env.has_tool("echo_message"), await env.has_tool("nope")],
                    value=await env.call_tool("echo_message", message="hi"),
                    length=await env.call_tool("echo_with_length", message="four"),
                    steps=(await env.state()).step_count,
                )
                step = await env.step(CallToolAction(tool_name="nope", arguments={}))
                error = step.observation.error
                out["error_type"] = error.error_type.value
                out["error_named"] = "nope" in error.message
                try:
                    await env.call_tool("nope")
                    out["unknown_tool"] = "no error"
                except RuntimeError:
                    out["unknown_tool"] = "RuntimeError"
                out["steps_after"] = (await env.state()).step_count
            return out

        report(**asyncio.run(main()))
    """,
    "mcp_tool_client_sync": """
        with MCPToolClient(base_url=URL, headers=HEADERS).sync() as env:
            env.reset()
            names = [t.name for t in env.list_tools()]
            value = env.call_tool("echo_message", message="sync")
            has = env.has_tool("echo_with_length")
            steps = env.state().step_count
        report(names=names, value=value, has=has, steps=steps)
    """,
    "except_clauses": """
        out = {}
        holder = GenericEnvClient(base_url=URL).sync()
        holder.connect()
        holder.reset()
        try:
            with GenericEnvClient(base_url=URL).sync() as extra:
                extra.reset()
            out["full_server"] = "no error"
        except RuntimeError:
            out["full_server"] = "RuntimeError"
        try:
            holder.step({"not_an_action": True})
            out["error_frame"] = "no error"
        except RuntimeError:
            out["error_frame"] = "RuntimeError"
        holder.close()
        try:
            refused = GenericEnvClient(base_url=FORBIDDING_URL,
                                       headers={"Origin": "http://elsewhere.example"})
            with refused.sync() as env:
                env.reset()
            out["refused_upgrade"] = "no error"
        except ConnectionError:
            out["refused_upgrade"] = "ConnectionError"
        try:
            with GenericEnvClient(base_url=CLOSED_URL).sync() as env:
                env.reset()
            out["closed_port"] = "no error"
        except ConnectionError:
            out["closed_port"] = "ConnectionError"
        try:
            GenericEnvClient()
            out["no_arguments"] = "no error"
        except ValueError:
            out["no_arguments"] = "ValueError"
        report(**out)
    """,
}

ECHO = ["echo_message", "echo_with_length"]
EXPECTED: dict[str, dict[str, Any]] = {
    "mcp_tool_client_async": {
        "names": ECHO, "cached": True, "fresh": ECHO, "schema": "object", "described": True,
        "missing": True, "has": [True, False], "value": "hi",
        "length": {"message": "four", "length": 4},
        "steps": 0,  # production mode: tool calls over POST /mcp are not steps
        "error_type": "tool_not_found", "error_named": True, "unknown_tool": "RuntimeError",
        "steps_after": 1,
    },
    "mcp_tool_client_sync": {"names": ECHO, "value": "sync", "has": True, "steps": 0},
    "except_clauses": {"full_server": "RuntimeError", "error_frame": "RuntimeError",
                       "refused_upgrade": "ConnectionError", "closed_port": "ConnectionError",
                       "no_arguments": "ValueError"},
}


def _script(client: str, idiom: str, values: dict[str, Any]) -> str:
    head = textwrap.dedent(IMPORTS[client])
    body = textwrap.dedent(IDIOMS[idiom])
    constants = "".join(f"{name} = {value!r}\n" for name, value in values.items())
    return (f"import json\n{constants}{head}\n"
            "def report(**values):\n    print('REPORT ' + json.dumps(values))\n\n" + body)


def _run(python: str, client: str, idiom: str, values: dict[str, Any]) -> dict[str, Any]:
    done = subprocess.run([python, "-c", _script(client, idiom, values)],
                          capture_output=True, text=True, timeout=SCRIPT_DEADLINE,
                          check=False, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, f"{client} / {idiom} failed:\n{done.stderr[-4000:]}"
    lines = [line for line in done.stdout.splitlines() if line.startswith("REPORT ")]
    assert len(lines) == 1, done.stdout
    report: dict[str, Any] = json.loads(lines[0][len("REPORT "):])
    return report


@pytest.mark.parametrize("idiom", ["mcp_tool_client_async", "mcp_tool_client_sync"])
def test_mcp_tool_client_runs_alike_on_both_clients(
        idiom: str, openenv_py: str, echo_server: RecordingServer, tag: str) -> None:
    """list_tools (Tool objects, cached, use_cache=False), get_tool, has_tool, call_tool
    (not a step: production by default), a typed observation.error and a RuntimeError for
    an unknown tool: the same with OpenEnv's MCPToolClient and envlink's, async and sync;
    both send their tool calls as POST /mcp."""
    values = {"URL": echo_server.base_url}
    theirs = _run(openenv_py, "openenv", idiom, {**values, "HEADERS": {"x-interop-test":
                                                                      f"{tag}-openenv"}})
    ours = _run(sys.executable, "envlink", idiom, {**values, "HEADERS": {"x-interop-test":
                                                                        f"{tag}-envlink"}})
    assert theirs == EXPECTED[idiom]
    assert ours == theirs
    for client in ("openenv", "envlink"):
        methods = {exchange.method for exchange in read_rpc(echo_server.frame_log,
                                                            f"{tag}-{client}")}
        assert {"openenv/session/create", "tools/list", "tools/call"} <= methods, client


@pytest.fixture
def forbidding_server(tmp_path: Path) -> Iterator[str]:
    """envlink's reference server, which answers an upgrade from a foreign Origin 403."""
    process = ServerProcess(python_command("-m", "envlink.server", "--port", "0", "--env",
                                           "echo"), name="forbidding", log_dir=tmp_path)
    try:
        process.start()
        yield process.base_url
    finally:
        process.stop()


def test_except_clauses_catch_alike_on_both_clients(
        openenv_py: str, spawn_openenv: Callable[..., RecordingServer],
        forbidding_server: str) -> None:
    """`except RuntimeError` (a full server, an error frame), `except ConnectionError`
    (a 403 upgrade, a closed port) and `except ValueError` (no arguments) catch with
    OpenEnv's client and with envlink's alike."""
    server = spawn_openenv("echo", max_sessions=1)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{sock.getsockname()[1]}"
    values = {"URL": server.base_url, "FORBIDDING_URL": forbidding_server,
              "CLOSED_URL": closed}
    theirs = _run(openenv_py, "openenv", "except_clauses", values)
    ours = _run(sys.executable, "envlink", "except_clauses", values)
    assert theirs == EXPECTED["except_clauses"]
    assert ours == theirs
