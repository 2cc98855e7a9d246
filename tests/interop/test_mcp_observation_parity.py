"""Typed MCP observations: OpenEnv 0.10 code that checks what ``step(CallToolAction(...))``
and ``step(ListToolsAction())`` give, once with OpenEnv's MCP client and once with
envlink's (only the imports changed), on OpenEnv's own echo server (an ``MCPEnvironment``).

The script checks ``isinstance(observation, CallToolObservation)`` /
``ListToolsObservation``, reads ``observation.error.error_type`` as a ``ToolErrorType``,
and goes through a typed client's ``_parse_result`` override; both clients must report
the same JSON.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import textwrap
from typing import Any

import pytest

from ._interop_support import RecordingServer

pytestmark = pytest.mark.timeout(120)

SCRIPT_DEADLINE = 50.0

IMPORTS = {
    "openenv": """
        from openenv.core.env_server.mcp_types import (
            CallToolAction, CallToolObservation, ListToolsAction, ListToolsObservation, Tool,
            ToolError, ToolErrorType)
        from openenv.core.mcp_client import MCPToolClient
    """,
    "envlink": """
        from envlink import (
            CallToolAction, CallToolObservation, ListToolsAction, ListToolsObservation,
            MCPToolClient, Tool, ToolError, ToolErrorType)
    """,
    # Only the client import swapped: OpenEnv's types, envlink's client (both installed).
    "mixed": """
        import os, sys
        sys.path.append(os.environ["OPENENV_SITE"])
        from openenv.core.env_server.mcp_types import (
            CallToolAction, CallToolObservation, ListToolsAction, ListToolsObservation, Tool,
            ToolError, ToolErrorType)
        from envlink import MCPToolClient
    """,
}

SCRIPT = """
import asyncio

seen = []


class Tracing(MCPToolClient):
    # A typed client's override: OpenEnv's parsing, then its own look at the result.
    def _parse_result(self, payload):
        result = super()._parse_result(payload)
        obs = result.observation
        # (A reset's class differs by name: OpenEnv's GenericMCPObservation, envlink's
        # MCPObservation.)
        typed = isinstance(obs, CallToolObservation | ListToolsObservation)
        seen.append(type(obs).__name__ if typed else "other")
        return result


def typed(obs):
    return {"call": isinstance(obs, CallToolObservation),
            "list": isinstance(obs, ListToolsObservation)}


async def episode(env):
    out = {}
    reset = await env.reset()
    out["reset"] = typed(reset.observation)
    listed = (await env.step(ListToolsAction())).observation
    out["listed"] = typed(listed)
    out["tools"] = [tool.name for tool in listed.tools]
    out["tools_are_tools"] = all(isinstance(tool, Tool) for tool in listed.tools)
    out["schema"] = listed.tools[0].input_schema.get("type")
    out["listed_step"] = [listed.done, listed.reward]
    step = await env.step(CallToolAction(tool_name="echo_message",
                                         arguments={"message": "hi"}))
    obs = step.observation
    out["called"] = typed(obs)
    out["tool_name"] = obs.tool_name
    out["error"] = obs.error
    out["result"] = obs.result
    out["called_step"] = [obs.done, obs.reward, step.done, step.reward]
    failed = (await env.step(CallToolAction(tool_name="nope", arguments={}))).observation
    error = failed.error
    out["failed"] = typed(failed)
    out["error_is_tool_error"] = isinstance(error, ToolError)
    out["error_type_is_enum"] = isinstance(error.error_type, ToolErrorType)
    out["error_type"] = error.error_type.value
    out["not_found"] = error.error_type == ToolErrorType.TOOL_NOT_FOUND
    out["not_found_is"] = error.error_type is ToolErrorType.TOOL_NOT_FOUND
    out["names_tool"] = "nope" in error.message
    return out


async def main():
    async with MCPToolClient(base_url=URL) as env:
        plain = await episode(env)
    async with Tracing(base_url=URL) as env:
        traced = await episode(env)
    with MCPToolClient(base_url=URL).sync() as env:
        env.reset()
        sync_obs = env.step(CallToolAction(tool_name="echo_with_length",
                                           arguments={"message": "four"})).observation
        sync = {**typed(sync_obs), "error": sync_obs.error}
    return {"plain": plain, "traced": traced, "seen": seen, "sync": sync}


print("REPORT " + json.dumps(asyncio.run(main()), default=repr))
"""


def _run(python: str, client: str, url: str, **env: str) -> dict[str, Any]:
    script = (f"import json\nURL = {url!r}\n" + textwrap.dedent(IMPORTS[client])
              + textwrap.dedent(SCRIPT))
    done = subprocess.run([python, "-c", script], capture_output=True, text=True,
                          timeout=SCRIPT_DEADLINE, check=False, stdin=subprocess.DEVNULL,
                          env={**os.environ, **env})
    assert done.returncode == 0, f"{client} failed:\n{done.stderr[-4000:]}"
    lines = [line for line in done.stdout.splitlines() if line.startswith("REPORT ")]
    assert len(lines) == 1, done.stdout
    report: dict[str, Any] = json.loads(lines[0][len("REPORT "):])
    return report


def test_tool_step_observations_are_typed_alike(openenv_py: str,
                                                echo_server: RecordingServer) -> None:
    """isinstance(observation, CallToolObservation / ListToolsObservation), Tool objects,
    observation.error.error_type as a ToolErrorType, the step's done and reward on the
    observation, and the class a typed client's _parse_result override sees: the same
    with OpenEnv's MCPToolClient and envlink's, async and sync."""
    theirs = _run(openenv_py, "openenv", echo_server.base_url)
    ours = _run(sys.executable, "envlink", echo_server.base_url)
    plain = theirs["plain"]
    assert plain["reset"] == {"call": False, "list": False}
    assert plain["listed"] == {"call": False, "list": True}
    assert plain["called"] == plain["failed"] == {"call": True, "list": False}
    assert plain["tools"] == ["echo_message", "echo_with_length"]
    assert plain["error_type"] == "tool_not_found" and plain["not_found"] is True
    assert plain["not_found_is"] is True
    assert plain["error_is_tool_error"] and plain["error_type_is_enum"]
    assert theirs["sync"] == {"call": True, "list": False, "error": None}
    assert theirs["seen"] == ["other", "ListToolsObservation", "CallToolObservation",
                              "CallToolObservation"]
    assert ours == theirs


def test_openenv_types_hold_with_only_the_client_import_swapped(
        openenv_py: str, echo_server: RecordingServer) -> None:
    """OpenEnv code that swapped only its client import (envlink's MCPToolClient, OpenEnv's
    mcp_types, both installed): isinstance against OpenEnv's CallToolObservation,
    ListToolsObservation, Tool and ToolError, and `error.error_type is
    ToolErrorType.TOOL_NOT_FOUND`, hold as with OpenEnv's own client."""
    done = subprocess.run([openenv_py, "-c", "import sysconfig; "
                           "print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, timeout=60, check=True)
    site = done.stdout.strip()
    assert sysconfig.get_paths()["purelib"] != site, "the check needs both interpreters"
    theirs = _run(openenv_py, "openenv", echo_server.base_url)
    mixed = _run(sys.executable, "mixed", echo_server.base_url, OPENENV_SITE=site)
    assert mixed == theirs
