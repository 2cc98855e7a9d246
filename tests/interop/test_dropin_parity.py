"""Drop-in parity: each OpenEnv 0.10 client idiom, once with OpenEnv's client and once
with envlink's, only the import changed, against a real OpenEnv 0.10 server.

Each idiom is one script. It runs under the openenv virtualenv with OpenEnv's imports
and under envlink's interpreter with envlink's; both must succeed (the script's own
asserts) and print the same JSON report.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Any

import pytest

from ._interop_support import RecordingServer, read_connections, read_rpc

pytestmark = pytest.mark.timeout(120)

SCRIPT_DEADLINE = 50.0

IMPORTS = {
    "openenv": """
        from openenv.core import EnvClient, GenericEnvClient
        from openenv.core.client_types import StepResult
        from openenv.core.env_server.types import State
    """,
    "envlink": """
        from envlink import EnvClient, GenericEnvClient, StepResult, State
    """,
}

# A user's typed client, written against OpenEnv's hooks.
TYPED_CLIENT = """
class CounterEnv(EnvClient):
    def _step_payload(self, action):
        return dict(action)

    def _parse_result(self, payload):
        return StepResult(observation=payload.get("observation", {}),
                          reward=payload.get("reward"), done=bool(payload.get("done")))

    def _parse_state(self, payload):
        return State(**payload)
"""

IDIOMS = {
    "plain_blocking_calls": """
        env = GenericEnvClient(base_url=URL)
        first = env.reset(start=2, target=9)
        second = env.step({"delta": 3})
        state = env.state()
        env.close()
        assert not hasattr(second, "__await__"), type(second)
        report(start=first.observation["total"], total=second.observation["total"],
               reward=second.reward, steps=state["step_count"])
    """,
    "plain_calls_inside_a_running_loop": """
        import asyncio

        async def main():
            env = GenericEnvClient(base_url=URL)
            first = env.reset(start=1)
            start = first.observation["total"]   # resolved on first use
            second = env.step({"delta": 4})
            total = second.observation["total"]
            text = str(env.step({"delta": 1}).observation)
            env.close()
            return start, total, "'total': 6" in text

        start, total, shown = asyncio.run(main())
        report(start=start, total=total, shown=shown)
    """,
    "sync_inside_someone_elses_loop": """
        import asyncio

        async def main():
            with GenericEnvClient(base_url=URL).sync() as env:
                env.reset(start=5)
                return env.step({"delta": 2}).observation["total"], env.state()["step_count"]

        total, steps = asyncio.run(main())
        report(total=total, steps=steps)
    """,
    "typed_state_attributes": TYPED_CLIENT + textwrap.dedent("""
        with CounterEnv(base_url=URL).sync() as env:
            env.reset(start=0, episode_id="parity-typed")
            env.step({"delta": 1})
            env.step({"delta": 2})
            state = env.state()
        env = CounterEnv(base_url=URL)
        env.reset(start=0, episode_id="parity-plain")
        plain = env.state()
        env.close()
        report(episode=state.episode_id, steps=state.step_count, total=state.total,
               plain_episode=plain.episode_id, plain_steps=plain.step_count)
    """),
    "new_session_children": TYPED_CLIENT + textwrap.dedent("""
        import asyncio

        async def main():
            async with CounterEnv(base_url=URL) as env:
                await env.reset(start=10)
                await env.step({"delta": 1})
                child = await env.new_session()
                await child.reset(start=20)
                child_total = (await child.step({"delta": 5})).observation["total"]
                parent = await env.state()
                return child_total, parent.step_count, (await child.state()).step_count

        child_total, parent_steps, child_steps = asyncio.run(main())
        with GenericEnvClient(base_url=URL).sync() as env:
            env.reset(start=0)
            child = env.new_session()
            child.reset(start=3)
            sync_total = child.step({"delta": 3}).observation["total"]
        report(child_total=child_total, parent_steps=parent_steps, child_steps=child_steps,
               sync_child_total=sync_total)
    """),
}

EXPECTED = {
    "plain_blocking_calls": {"start": 2, "total": 5, "reward": 3.0, "steps": 1},
    "plain_calls_inside_a_running_loop": {"start": 1, "total": 5, "shown": True},
    "sync_inside_someone_elses_loop": {"total": 7, "steps": 1},
    "typed_state_attributes": {"episode": "parity-typed", "steps": 2, "total": 3,
                               "plain_episode": "parity-plain", "plain_steps": 0},
    "new_session_children": {"child_total": 25, "parent_steps": 1, "child_steps": 1,
                             "sync_child_total": 6},
}


def _script(client: str, idiom: str, url: str) -> str:
    head = textwrap.dedent(IMPORTS[client])
    body = textwrap.dedent(IDIOMS[idiom])
    return (f"import json\nURL = {url!r}\n{head}\n"
            "def report(**values):\n    print('REPORT ' + json.dumps(values))\n\n" + body)


def _run(python: str, client: str, idiom: str, url: str) -> dict[str, Any]:
    done = subprocess.run([python, "-c", _script(client, idiom, url)], capture_output=True,
                          text=True, timeout=SCRIPT_DEADLINE, check=False,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, f"{client} / {idiom} failed:\n{done.stderr[-4000:]}"
    lines = [line for line in done.stdout.splitlines() if line.startswith("REPORT ")]
    assert len(lines) == 1, done.stdout
    report: dict[str, Any] = json.loads(lines[0][len("REPORT "):])
    return report


@pytest.mark.parametrize("idiom", sorted(IDIOMS))
def test_idiom_runs_alike_on_both_clients(idiom: str, openenv_py: str,
                                          counter_server: RecordingServer) -> None:
    """The idiom succeeds with OpenEnv's client and with envlink's (only the import
    changed), and both report the same values, the expected ones."""
    url = counter_server.base_url
    theirs = _run(openenv_py, "openenv", idiom, url)
    ours = _run(sys.executable, "envlink", idiom, url)
    assert theirs == EXPECTED[idiom]
    assert ours == theirs


def test_production_mode_tool_calls_over_post_mcp(echo_server: RecordingServer,
                                                  tag: str, tag_headers: dict[str, Any]) -> None:
    """mode="production" on OpenEnv's echo server: tool calls are JSON-RPC on POST /mcp
    carrying the session id the WebSocket attached to (as OpenEnv's MCPToolClient sends
    them), answered by the same environment, and they are not steps."""
    from envlink import EchoEnv

    with EchoEnv(echo_server.base_url, mode="production", headers=tag_headers) as env:
        env.reset()
        assert "echo_message" in [tool["name"] for tool in env.list_tools()]
        assert env.call_tool("echo_message", message="prod") == "prod"
        assert env.state().step_count == 0
    rpc = read_rpc(echo_server.frame_log, tag)
    methods = [exchange.method for exchange in rpc]
    assert methods[0] == "openenv/session/create"
    assert {"tools/list", "tools/call", "openenv/session/close"} <= set(methods)
    created = rpc[0].response
    assert created is not None
    session_id = created["result"]["session_id"]
    for exchange in rpc[1:]:
        assert exchange.request is not None
        assert exchange.request["params"]["session_id"] == session_id
    attached = {conn.session_id for conn in read_connections(echo_server.frame_log, tag)}
    assert attached == {session_id}
