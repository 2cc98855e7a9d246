"""OpenEnv 0.10's own client against envlink's reference server: the other direction.

envlink's server runs here as a subprocess of envlink's interpreter; OpenEnv's
client runs in the openenv virtualenv (``clients/openenv_client_driver.py``) and
prints what happened as JSON. Where it makes sense, the same scenario also runs
against a real OpenEnv server and the answers are compared.
"""

from __future__ import annotations

import json
import queue
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from .._ports import restartable_port
from ._interop_support import (
    CLIENTS,
    RecordingServer,
    ServerProcess,
    python_command,
)

pytestmark = pytest.mark.timeout(60)

DRIVER = CLIENTS / "openenv_client_driver.py"
DRIVER_DEADLINE = 45.0


@pytest.fixture
def envlink_server(tmp_path: Path) -> Iterator[Callable[..., ServerProcess]]:
    """Start envlink's reference server (``python -m envlink.server``); stopped afterwards."""
    started: list[ServerProcess] = []

    def start(env: str, *extra: str, port: int | None = None) -> ServerProcess:
        port = restartable_port() if port is None else port
        process = ServerProcess(
            python_command("-m", "envlink.server", "--port", str(port), "--env", env, *extra),
            name=f"envlink-{env}-{len(started)}", log_dir=tmp_path)
        started.append(process)
        process.start()
        return process

    try:
        yield start
    finally:
        for process in reversed(started):
            process.stop()


def run_driver(python: str, scenario: str, url: str, *args: str) -> dict[str, Any]:
    """Run one OpenEnv-client scenario to completion and return its JSON report."""
    completed = subprocess.run(
        [python, str(DRIVER), scenario, url, *args], capture_output=True, text=True,
        timeout=DRIVER_DEADLINE, check=False, stdin=subprocess.DEVNULL,
    )
    assert completed.returncode == 0, (
        f"OpenEnv client scenario {scenario!r} crashed:\n{completed.stderr[-4000:]}")
    report: dict[str, Any] = json.loads(completed.stdout.strip().splitlines()[-1])
    return report


def _tool_value(result: Any) -> Any:
    # What OpenEnv's MCPToolClient.call_tool returns: a FastMCP CallToolResult's
    # "data", else the result itself.
    if isinstance(result, dict) and "data" in result:
        return result["data"]
    return result


def _assert_echo_episode(report: dict[str, Any]) -> None:
    reset = report["reset"]
    assert reset["observation"]["echoed_message"] == "Echo environment ready!"
    assert (reset["reward"], reset["done"]) == (0.0, False)
    listed, echoed, measured = report["steps"]
    assert [t["name"] for t in listed["observation"]["tools"]] == ["echo_message",
                                                                    "echo_with_length"]
    assert echoed["observation"]["tool_name"] == "echo_message"
    assert echoed["observation"]["error"] is None
    assert _tool_value(echoed["observation"]["result"]) == "hello"
    assert _tool_value(measured["observation"]["result"]) == {"message": "four", "length": 4}
    assert report["state"]["step_count"] == 3
    assert isinstance(report["state"]["episode_id"], str)


# ------------------------------------------------------------------ episodes


def test_openenv_async_client_runs_echo_episode_on_envlink_server(
        openenv_py: str, envlink_server: Callable[..., ServerProcess]) -> None:
    """OpenEnv's GenericEnvClient runs an MCP echo episode on envlink's server."""
    server = envlink_server("echo")
    report = run_driver(openenv_py, "echo_async", server.ws_url)
    _assert_echo_episode(report)
    # OpenEnv's client offered no extension, so none may be advertised back.
    assert "envlink-protocol" not in report["response_headers"]


def test_openenv_sync_client_runs_echo_episode_on_envlink_server(
        openenv_py: str, envlink_server: Callable[..., ServerProcess]) -> None:
    """OpenEnv's sync wrapper (.sync() as a context manager) works on envlink's server."""
    server = envlink_server("echo")
    _assert_echo_episode(run_driver(openenv_py, "echo_sync", server.base_url))


def test_envlink_echo_answers_like_openenv_echo(
        openenv_py: str, envlink_server: Callable[..., ServerProcess],
        echo_server: RecordingServer) -> None:
    """OpenEnv's client reads the same echo answers from envlink's server as from OpenEnv's."""
    server = envlink_server("echo")
    ours = run_driver(openenv_py, "echo_async", server.base_url)
    theirs = run_driver(openenv_py, "echo_async", echo_server.base_url, "--tag",
                        "echo-comparison")

    assert ours["reset"] == theirs["reset"]
    for mine, real in zip(ours["steps"], theirs["steps"], strict=True):
        assert (mine["reward"], mine["done"]) == (real["reward"], real["done"])
        assert set(mine["observation"]) == set(real["observation"])
    tools = [{k: t[k] for k in ("name", "description")} | {
        "required": t["input_schema"].get("required")}
        for t in ours["steps"][0]["observation"]["tools"]]
    real_tools = [{k: t[k] for k in ("name", "description")} | {
        "required": t["input_schema"].get("required")}
        for t in theirs["steps"][0]["observation"]["tools"]]
    assert tools == real_tools
    for mine, real in zip(ours["steps"][1:], theirs["steps"][1:], strict=True):
        assert _tool_value(mine["observation"]["result"]) == _tool_value(
            real["observation"]["result"])
    assert set(ours["state"]) == set(theirs["state"])
    assert ours["state"]["step_count"] == theirs["state"]["step_count"]


def test_openenv_typed_client_on_envlink_deterministic_env(
        openenv_py: str, envlink_server: Callable[..., ServerProcess]) -> None:
    """A typed OpenEnv EnvClient subclass runs on envlink's server; one seed, one episode."""
    server = envlink_server("deterministic")
    report = run_driver(openenv_py, "typed", server.base_url)
    first, second = report["episodes"]
    assert first == second, "the same seed and actions must give the same observations"
    assert [r["observation"]["position"] for r in first] == [0, 1, -1, 4]
    assert [r["done"] for r in first] == [False, False, False, True]
    assert report["state"]["step_count"] == 3
    assert (report["state"]["seed"], report["state"]["max_steps"]) == (11, 3)


def test_openenv_typed_sync_client_on_envlink_deterministic_env(
        openenv_py: str, envlink_server: Callable[..., ServerProcess]) -> None:
    """The typed OpenEnv client through its sync wrapper gets the same episode."""
    server = envlink_server("deterministic")
    report = run_driver(openenv_py, "typed_sync", server.base_url)
    typed = run_driver(openenv_py, "typed", server.base_url)
    assert [report["reset"], *report["steps"]] == typed["episodes"][0]
    assert report["state"]["position"] == 4


# ------------------------------------------------------------------ error frames


def test_openenv_client_sees_validation_error_from_envlink_server(
        openenv_py: str, envlink_server: Callable[..., ServerProcess]) -> None:
    """envlink's VALIDATION_ERROR frame reads as OpenEnv's server error; the session survives."""
    server = envlink_server("echo")
    report = run_driver(openenv_py, "echo_errors", server.base_url)
    error = report["bad_step"]["error"]
    assert error["type"] == "RuntimeError"
    assert error["message"].endswith("(code: VALIDATION_ERROR)")
    assert _tool_value(report["good_step"]["observation"]["result"]) == "ok"
    assert report["state"]["step_count"] == 1


def test_openenv_client_sees_capacity_reached_from_envlink_server(
        openenv_py: str, envlink_server: Callable[..., ServerProcess]) -> None:
    """Past envlink's --max-sessions OpenEnv's client gets CAPACITY_REACHED, as from OpenEnv."""
    server = envlink_server("deterministic", "--max-sessions", "2")
    report = run_driver(openenv_py, "capacity", server.base_url, "--count", "2")
    error = report["extra"]["error"]
    assert error["type"] == "RuntimeError"
    assert error["message"].endswith("(code: CAPACITY_REACHED)")
    # Once a session is closed its slot is free again.
    assert report["after_release"]["observation"]["step"] == 0


def test_openenv_client_gets_same_capacity_answer_from_both_servers(
        openenv_py: str, envlink_server: Callable[..., ServerProcess],
        spawn_openenv: Callable[..., RecordingServer]) -> None:
    """The capacity refusal reads the same through OpenEnv's client from either server."""
    ours = run_driver(openenv_py, "capacity",
                      envlink_server("echo", "--max-sessions", "1").base_url)
    theirs = run_driver(openenv_py, "capacity",
                        spawn_openenv("echo", max_sessions=1).base_url)
    assert ours["extra"]["error"]["type"] == theirs["extra"]["error"]["type"]
    assert ours["extra"]["error"]["message"].endswith("(code: CAPACITY_REACHED)")
    assert theirs["extra"]["error"]["message"].endswith("(code: CAPACITY_REACHED)")
    assert ours["after_release"] == theirs["after_release"]


# ------------------------------------------------------------------ restart


def test_openenv_client_across_envlink_server_restart(
        openenv_py: str, envlink_server: Callable[..., ServerProcess], tmp_path: Path) -> None:
    """OpenEnv's client survives envlink's server being killed and restarted mid-episode."""
    first = envlink_server("deterministic")
    stderr_path = tmp_path / "driver.stderr"
    with open(stderr_path, "wb") as stderr:
        driver = subprocess.Popen(
            [openenv_py, str(DRIVER), "restart", first.base_url, "--tag", "restart"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True,
        )
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert driver.stdout is not None
        for line in driver.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True, name="driver-stdout").start()
    output: list[str] = []
    try:
        line = lines.get(timeout=DRIVER_DEADLINE)
        assert line == "CHECKPOINT\n", f"no checkpoint: {line!r}\n{stderr_path.read_text()}"
        assert first.port is not None
        first.kill()
        envlink_server("deterministic", port=first.port)
        assert driver.stdin is not None
        driver.stdin.write("go\n")
        driver.stdin.close()
        while (line := lines.get(timeout=DRIVER_DEADLINE)) is not None:
            output.append(line)
        assert driver.wait(timeout=DRIVER_DEADLINE) == 0, stderr_path.read_text()[-4000:]
    finally:
        if driver.poll() is None:
            driver.kill()
        driver.wait(timeout=10)
    report = json.loads(output[-1])
    # OpenEnv's client reconnects silently, so the interrupted step reaches a fresh
    # session that was never reset: envlink's server answers it with an error frame.
    assert "error" in report["interrupted"], report["interrupted"]
    assert report["new_episode"] == report["before"]
    assert report["new_first_step"] == report["first_step"]


def test_openenv_production_client_uses_detached_sessions_on_envlink_server(
        openenv_py: str, envlink_server: Callable[..., ServerProcess]) -> None:
    """OpenEnv's MCPToolClient (production mode) creates, attaches to and closes a detached
    session on envlink's server started with --detached-sessions, as on its own server."""
    import urllib.request

    server = envlink_server("echo", "--detached-sessions")
    report = run_driver(openenv_py, "detached", server.base_url)
    assert isinstance(report["session_id"], str) and report["session_id"]
    assert report["reset"]["observation"]["echoed_message"] == "Echo environment ready!"
    assert report["step"]["observation"]["tool_name"] == "echo_message"
    assert report["state"] == {"step_count": 1}
    with urllib.request.urlopen(f"{server.base_url}/health", timeout=10) as answer:
        counters = json.loads(answer.read())["counters"]
    # One session, created by POST /mcp (not by the socket), and two JSON-RPC calls:
    # openenv/session/create and the openenv/session/close of OpenEnv's close().
    assert counters.get("session.created") == 1
    assert counters.get("session.attached") == 1
    assert counters.get("rpc") == 2
