"""Parity: the public-behaviour cases of OpenEnv 0.10's client tests, once with OpenEnv's
client and once with envlink's, on real loopback OpenEnv servers.

``clients/parity_cases.py`` holds the cases (written from what OpenEnv's own tests
check; the cases that pin OpenEnv's internals are listed in this directory's
README). It runs once per library, in that library's interpreter with only the
imports differing; each test here reads one case's outcome from one run, and for
envlink also checks that it returned what OpenEnv's client returned.

A case that fails with envlink only because another part of issue 33 is not merged
yet is a strict xfail naming that part: it turns into a failure when the part lands,
so the marker is removed then.
"""

from __future__ import annotations

import concurrent.futures
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .._ports import restartable_port
from ._interop_support import CLIENTS, RecordingServer, ServerProcess, openenv_server

pytestmark = pytest.mark.timeout(300)

DRIVER = CLIENTS / "parity_cases.py"
TOKEN = "Bearer parity-secret"

CASES = [
    "sync_close_leaves_no_loop_thread",
    "base_url_is_normalized_and_read_only",
    "client_without_url_or_provider_is_value_error",
    "generic_hooks_pass_dicts_through",
    "sync_wrapper_runs_an_episode",
    "plain_calls_block_and_return_results",
    "async_episode_with_async_with",
    "new_session_is_an_independent_child",
    "sync_wrapper_new_session_is_a_sync_client",
    "sync_client_exposes_async_client_and_hooks",
    "plain_call_after_async_connect_returns_a_result",
    "sync_locked_client_inside_a_running_loop_returns_the_result",
    "ping_and_timeout_options_are_accepted",
    "from_docker_image_is_lazy_then_sync_connects",
    "from_docker_image_awaited_gives_a_connected_client",
    "factory_handle_runs_under_asyncio_run",
    "factory_handle_is_single_use",
    "invalid_mode_leaves_no_container_running",
    "from_env_runs_the_spaces_registry_image",
    "provider_client_starts_once_shares_with_children_stops_once",
    "provider_start_error_keeps_its_type",
    "failed_provider_stop_is_raised_by_close",
    "capacity_refusal_is_a_runtime_error",
    "headers_reach_a_private_server",
    "refused_upgrade_is_a_connection_error",
    "mcp_tool_client_sends_headers",
    "modes_from_argument_and_environment",
    "mcp_tool_client_defaults_to_production",
    "mcp_tools_listed_cached_found_and_called",
    "mcp_tool_error_is_a_runtime_error",
    "mcp_sync_close_releases_the_session",
    "generic_sync_close_releases_the_session",
    "autoenv_skip_install_gives_a_generic_client",
    "autoaction_skip_install_gives_generic_action",
]

#: Cases envlink fails until another part of issue 33 lands, and that part.
PENDING: dict[str, str] = {
}


def _params() -> list[Any]:
    params = []
    for name in CASES:
        params.append(pytest.param("openenv", name, id=f"openenv-{name}"))
        marks = ([pytest.mark.xfail(strict=True, reason=PENDING[name])]
                 if name in PENDING else [])
        params.append(pytest.param("envlink", name, id=f"envlink-{name}", marks=marks))
    return params


@pytest.fixture(scope="module")
def parity_servers(openenv_py: str,
                   tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The servers only these cases need: a full one (one session), a private one (a
    token required), a small MCP one (two sessions)."""
    logs = tmp_path_factory.mktemp("parity")
    processes: list[ServerProcess] = [
        openenv_server("counter", openenv_py, logs, max_sessions=1, name="parity-capacity"),
        openenv_server("echo", openenv_py, logs, max_sessions=4, name="parity-private",
                       extra_args=("--require-header", f"authorization={TOKEN}")),
        openenv_server("echo", openenv_py, logs, max_sessions=2, name="parity-small"),
    ]
    try:
        # Started side by side: each spends seconds importing OpenEnv.
        with concurrent.futures.ThreadPoolExecutor(len(processes)) as starting:
            list(starting.map(lambda process: process.start(), processes))
        yield {"capacity": processes[0].base_url, "private": processes[1].base_url,
               "small": processes[2].base_url}
    finally:
        for process in processes:
            process.stop()


@pytest.fixture(scope="module")
def reports(openenv_py: str, parity_servers: dict[str, str], counter_server: RecordingServer,
            echo_server: RecordingServer) -> dict[str, dict[str, Any]]:
    """Every case's outcome per library: both runs at once, one process each."""
    config = json.dumps({**parity_servers, "counter": counter_server.base_url,
                         "echo": echo_server.base_url, "token": TOKEN,
                         "dead": f"http://127.0.0.1:{restartable_port()}"})
    runs = {lib: subprocess.Popen([python, str(DRIVER), lib, config], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
                                  cwd=Path(DRIVER).parent)
            for lib, python in (("openenv", openenv_py), ("envlink", sys.executable))}
    out: dict[str, dict[str, Any]] = {}
    for lib, run in runs.items():
        try:
            stdout, stderr = run.communicate(timeout=240)
        finally:
            run.kill()
        assert run.returncode == 0, f"{lib} run failed:\n{stderr[-4000:]}"
        out[lib] = json.loads(stdout.strip().splitlines()[-1])
        assert sorted(out[lib]) == sorted(CASES), "the case list here and the driver's differ"
    return out


@pytest.mark.parametrize(("lib", "name"), _params())
def test_parity(lib: str, name: str, reports: dict[str, dict[str, Any]]) -> None:
    """One OpenEnv client test's public behaviour, with one library; envlink's answer is
    OpenEnv's."""
    outcome = reports[lib][name]
    assert outcome["ok"], f"{lib}: {outcome['error']}\n{outcome['trace']}"
    if lib == "envlink":
        baseline = reports["openenv"][name]
        assert baseline["ok"], "OpenEnv's own client fails this case"
        assert outcome["value"] == baseline["value"]
