"""The interop suite: envlink against the real ``openenv`` package, and back.

It needs a separate virtualenv with ``openenv==0.10.*`` (see ``.ci/interop.sh``),
named by ``ENVLINK_OPENENV_PYTHON``. Without it:

- a plain ``pytest`` (or ``pytest tests``) does not collect this directory at all;
- asking for it explicitly (``pytest tests/interop``) is a usage error, never a
  silent skip.

With it, every test must really run: a skipped or xfailed interop test is
reported as a failure, so a green run means every check passed.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from _interop_support import (
    HERE,
    OPENENV_PYTHON_VAR,
    TAG_HEADER,
    RecordingServer,
    ServerProcess,
    openenv_python,
    openenv_server,
)
from _proxy import CuttingProxy


def _targets_this_suite(config: pytest.Config) -> bool:
    base = Path(config.invocation_params.dir)
    for arg in config.args:
        path = (base / arg.split("::", 1)[0]).resolve()
        if path == HERE or HERE in path.parents:
            return True
    return False


def pytest_configure(config: pytest.Config) -> None:
    if openenv_python() is None and _targets_this_suite(config):
        raise pytest.UsageError(
            f"tests/interop needs the openenv virtualenv: set {OPENENV_PYTHON_VAR} to its "
            "python, or run `bash .ci/interop.sh`, which creates it and runs this suite."
        )


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    # Not configured and not asked for: stay out of the main suite entirely.
    if openenv_python() is None and (collection_path == HERE or HERE in collection_path.parents):
        return True
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.interop)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()  # type: ignore[attr-defined]
    if report.skipped:
        # A check that did not run must not look like one that passed.
        reason = getattr(report, "wasxfail", None) or str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"interop tests must all run, but this one was skipped/xfailed: {reason}"


# ----------------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def openenv_py() -> str:
    """The openenv virtualenv's python, checked to hold openenv 0.10.x."""
    python = openenv_python()
    assert python is not None
    probe = subprocess.run(
        [python, "-c", "import json, importlib.metadata as m; "
                       "print(json.dumps({'openenv': m.version('openenv')}))"],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert probe.returncode == 0, (
        f"{OPENENV_PYTHON_VAR}={python} cannot import openenv:\n{probe.stderr}")
    version = json.loads(probe.stdout)["openenv"]
    assert version.startswith("0.10."), f"openenv {version} installed, the suite targets 0.10.x"
    return python


@pytest.fixture(scope="session")
def server_logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where server stderr and frame logs go."""
    return tmp_path_factory.mktemp("servers")


def _shared_server(kind: str, python: str, logs: Path) -> Iterator[RecordingServer]:
    frame_log = logs / f"shared-{kind}.frames.jsonl"
    process = openenv_server(kind, python, logs, max_sessions=16, frame_log=frame_log,
                             name=f"shared-openenv-{kind}")
    try:
        process.start()
        yield RecordingServer(process, frame_log)
    finally:
        process.stop()


@pytest.fixture(scope="session")
def echo_server(openenv_py: str, server_logs: Path) -> Iterator[RecordingServer]:
    """A real OpenEnv echo server (MCP tools), shared by the tests, recording frames."""
    yield from _shared_server("echo", openenv_py, server_logs)


@pytest.fixture(scope="session")
def counter_server(openenv_py: str, server_logs: Path) -> Iterator[RecordingServer]:
    """A real OpenEnv typed counter server, shared by the tests, recording frames."""
    yield from _shared_server("counter", openenv_py, server_logs)


@pytest.fixture
def spawn_openenv(openenv_py: str, tmp_path: Path) -> Iterator[Callable[..., RecordingServer]]:
    """Start dedicated OpenEnv servers for one test; all are stopped afterwards."""
    started: list[ServerProcess] = []

    def spawn(kind: str, *, port: int = 0, max_sessions: int = 1,
              extra_args: Sequence[str] = ()) -> RecordingServer:
        index = len(started)
        frame_log = tmp_path / f"{kind}-{index}.frames.jsonl"
        process = openenv_server(kind, openenv_py, tmp_path, port=port,
                                 max_sessions=max_sessions, frame_log=frame_log,
                                 name=f"openenv-{kind}-{index}", extra_args=extra_args)
        started.append(process)
        process.start()
        return RecordingServer(process, frame_log)

    try:
        yield spawn
    finally:
        for process in reversed(started):
            process.stop()


@pytest.fixture
def tag(request: pytest.FixtureRequest) -> str:
    """A name for this test's connections in a shared server's frame log."""
    return request.node.nodeid


@pytest.fixture
def tag_headers(tag: str) -> dict[str, Any]:
    """Upgrade headers marking this test's connections."""
    return {TAG_HEADER: tag}


@pytest.fixture
def cutting_proxy() -> Iterator[Callable[[int], CuttingProxy]]:
    """Start loopback proxies that cut connections on demand; all stopped afterwards."""
    started: list[CuttingProxy] = []

    def start(target_port: int) -> CuttingProxy:
        proxy = CuttingProxy(target_port)
        started.append(proxy)
        proxy.start()
        return proxy

    try:
        yield start
    finally:
        for proxy in started:
            proxy.stop()
