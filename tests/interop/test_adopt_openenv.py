"""envlink.adopt() on real environment packages' OpenEnv clients, against OpenEnv's servers.

The packages are unedited subclasses of OpenEnv 0.10's own client bases: the one
``openenv init`` generates (OpenEnv's template, with its own action and observation
models), an ``MCPToolClient`` subclass shaped as OpenEnv's echo client, and a typed
counter client with its own action, observation and state models
(``packages/``). Each runs in ``clients/adopt_driver.py``, in envlink's interpreter
with the openenv virtualenv on its path, as a user who has both installed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from .._ports import restartable_port
from ._interop_support import (
    CLIENTS,
    HERE,
    SERVERS,
    TAG_HEADER,
    RecordingServer,
    ServerProcess,
    python_command,
    read_connections,
    read_rpc,
)
from ._proxy import Cut, CuttingProxy, When

pytestmark = pytest.mark.timeout(180)

DRIVER = CLIENTS / "adopt_driver.py"
PACKAGES = HERE / "packages"


@pytest.fixture(scope="module")
def openenv_site(openenv_py: str) -> str:
    """The openenv virtualenv's site-packages."""
    done = subprocess.run([openenv_py, "-c", "import sysconfig; "
                           "print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, timeout=60, check=True)
    return done.stdout.strip()


@pytest.fixture(scope="module")
def template_dir(openenv_py: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A package made by OpenEnv's own ``openenv init tally_env``."""
    root = tmp_path_factory.mktemp("template")
    cli = Path(openenv_py).parent / "openenv"
    subprocess.run([str(cli), "init", "tally_env"], cwd=root, capture_output=True,
                   timeout=120, check=True, stdin=subprocess.DEVNULL)
    assert (root / "tally_env" / "client.py").is_file()
    return root


def _drive(scenario: str, url: str, openenv_py: str, site: str, *packages: Path,
           timeout: float = 150, **env: str) -> dict[str, Any]:
    environ = {**os.environ, "OPENENV_SITE": site, "OPENENV_PYTHON": openenv_py,
               "PACKAGE_SERVER": str(SERVERS / "package_server.py"),
               "ADOPT_PACKAGES": os.pathsep.join(str(p) for p in packages), **env}
    assert sysconfig.get_paths()["purelib"] != site, "the driver needs both interpreters"
    done = subprocess.run([sys.executable, str(DRIVER), scenario, url], capture_output=True,
                          text=True, timeout=timeout, check=False, env=environ,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, f"{scenario}: {done.stderr[-4000:]}"
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def test_openenv_init_package_client_works_every_way_through_envlink(
        openenv_py: str, openenv_site: str, template_dir: Path, tmp_path: Path) -> None:
    """OpenEnv's template client, adopted: plain calls, .sync(), await, from_docker_image
    and from_env (an OpenEnv container provider), the pool and the TRL adapter all give
    what OpenEnv's own class gives, with the package's models; providers are stopped."""
    server = ServerProcess(
        [openenv_py, str(SERVERS / "package_server.py"), "--port", "0", "--max-sessions", "8",
         "--package-dir", str(template_dir), "--package", "tally_env"],
        name="openenv-template", log_dir=tmp_path)
    server.start()
    try:
        out = _drive("template", server.base_url, openenv_py, openenv_site, template_dir,
                     TEMPLATE_DIR=str(template_dir))
    finally:
        server.stop()
    assert out["adopted_is_envlink"] is True and out["name"] == "TallyEnv"
    baseline = out["openenv"]
    assert baseline[1]["observation"]["class"] == "TallyObservation"
    assert baseline[1]["observation"]["echoed_message"] == "hello"
    assert baseline[3] == 2  # step_count
    for way in ("plain", "facade", "async", "from_docker_image", "from_env"):
        assert out[way] == baseline, way
    assert out["providers"] == {
        "images": ["tally-env:latest", "registry.hf.space/someone-tally-env:latest"],
        "stopped": [True, True]}
    assert [r["observation"]["echoed_message"] for r in out["pool"]] == [
        "Tally Env environment ready!"] * 2 + ["a", "bcd"]
    assert out["pool"][3]["observation"]["class"] == "TallyObservation"
    assert out["trl"] == ["tool", pytest.approx(0.4)]


def test_mcp_tool_client_package_matches_openenv(openenv_py: str, openenv_site: str,
                                                 echo_server: RecordingServer) -> None:
    """The echo package's MCPToolClient subclass, adopted, answers as OpenEnv's class does:
    Tool objects with input_schema, the tools cache, get_tool/has_tool, call_tool over
    POST /mcp (not a step), step() with OpenEnv's CallToolObservation; plain calls too."""
    out = _drive("echo", echo_server.base_url, openenv_py, openenv_site, PACKAGES)
    assert out["openenv"]["tools"] == ["echo_message", "echo_with_length"]
    assert out["openenv"]["step_count"] == 1  # call_tool is not a step; step() is
    assert out["adopted"] == out["openenv"]
    assert out["plain"] == [["echo_message", "echo_with_length"], "plain"]


@pytest.mark.parametrize("mode", ["default", "detached-sessions"])
def test_adopted_mcp_client_calls_tools_on_envlink_serve(
        mode: str, openenv_py: str, openenv_site: str, tmp_path: Path) -> None:
    """`envlink serve` offers OpenEnv 0.10's HTTP MCP in every mode: the echo package's
    MCPToolClient, adopted, lists OpenEnv Tool objects and calls tools over POST /mcp on
    its own session, unchanged; an unknown tool is a typed error (a RuntimeError, as
    OpenEnv's). With detached sessions OpenEnv's own class does exactly the same."""
    port = restartable_port()
    extra = ["--detached-sessions"] if mode == "detached-sessions" else []
    server = ServerProcess(
        python_command("-m", "envlink.server", "--port", str(port), "--env", "echo", *extra),
        name=f"envlink-echo-{mode}", log_dir=tmp_path)
    server.start()
    try:
        out = _drive("echo_on_envlink", server.base_url, openenv_py, openenv_site, PACKAGES,
                     WITH_OPENENV="1" if extra else "0")
    finally:
        server.stop()
    adopted = out["adopted"]
    assert adopted["tools"] == ["echo_message", "echo_with_length"]
    assert adopted["tool_class"] == "Tool"
    assert adopted["call"] == "Hello!"
    assert adopted["call_length"] == {"message": "Test", "length": 4}
    assert adopted["unknown"] == ["McpError", True]
    # list_tools, two calls and the refused one ran on the client's own session.
    assert adopted["step_count"] == 4
    if extra:
        assert out["openenv"] == {**adopted, "unknown": ["RuntimeError", True]}


@pytest.mark.parametrize("when", ["before_forward", "after_forward", "after_answer"])
def test_typed_package_client_survives_a_dropped_connection(
        when: When, openenv_py: str, openenv_site: str, counter_server: RecordingServer,
        cutting_proxy: Callable[[int], CuttingProxy], tag: str) -> None:
    """The counter package's typed client, adopted, under on_session_lost="resume": the
    connection is cut at its third step (before the server, racing it, or after it applied
    and answered); the session is resumed and the server applies each action exactly once."""
    server = counter_server  # shared: this test's connections carry its tag
    proxy = cutting_proxy(server.port)
    armed = proxy.arm(Cut(when, nth=3))
    out = _drive("counter", proxy.base_url, openenv_py, openenv_site, PACKAGES,
                 ADOPT_HEADERS=json.dumps({TAG_HEADER: tag}))
    assert armed.fired.is_set()
    assert out["recovery"] == "openenv-resume"
    assert out["step_count"] == 6 and out["total"] == 21
    for unknown in out["unknown"]:
        # Only a step the server applied can be of unknown outcome here, and it was settled.
        assert unknown == {"index": 2, "applied": True}
    if when == "after_answer":
        assert out["unknown"], "the answer was dropped after the server applied the step"
    conns = [c for c in read_connections(server.frame_log, tag) if c.request_headers]
    steps = [f["data"]["delta"] for c in conns for f in c.sent if f["type"] == "step"]
    assert steps == [1, 2, 3, 4, 5, 6], "an action was lost or applied twice"
    creates = [x for x in read_rpc(server.frame_log, tag)
               if x.method == "openenv/session/create"]
    assert len(creates) == 1 and len(conns) >= 2
