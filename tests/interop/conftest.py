"""The interop suite: envlink against the real ``openenv`` package, and back.

It needs a separate virtualenv with ``openenv==0.10.*`` (see ``.ci/interop.sh``),
named by ``ENVLINK_OPENENV_PYTHON``. Without it, every interop test is reported as
skipped with the reason (how to create the virtualenv), and with
``ENVLINK_REQUIRE_OPENENV=1`` (set by ``.ci/interop.sh``) each of those skips is a failure.

With it, every test must really run: a skipped or xfailed interop test is
reported as a failure, so a green run means every check passed. One exception: a
strict xfail whose reason starts with ``issue NN:`` (:data:`PENDING_PREFIX`) stays
an xfail; it marks a parity case that waits for another part of that issue, and
turns into a failure (an unexpected pass) when that part lands.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from .._ports import restartable_port
from ._interop_support import (
    HERE,
    OPENENV_PYTHON_VAR,
    TAG_HEADER,
    RecordingServer,
    ServerProcess,
    openenv_python,
    openenv_server,
)
from ._proxy import CuttingProxy

#: Set to 1 where the suite must run (CI): a missing openenv virtualenv is then a failure.
REQUIRE_VAR = "ENVLINK_REQUIRE_OPENENV"
#: The reason of a strict xfail that waits for another part of an open issue.
PENDING_PREFIX = "issue "
MISSING = (f"the interop suite needs the openenv virtualenv: set {OPENENV_PYTHON_VAR} to its "
           "python, or run `bash .ci/interop.sh`, which creates it and runs this suite")


def _must_run() -> bool:
    return openenv_python() is not None or os.environ.get(REQUIRE_VAR) == "1"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    missing = openenv_python() is None
    for item in items:
        if HERE in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.interop)
            if missing:
                item.add_marker(pytest.mark.skip(reason=MISSING))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()  # type: ignore[attr-defined]
    if report.skipped and HERE in Path(str(item.path)).parents and _must_run():
        # A check that did not run must not look like one that passed.
        reason = getattr(report, "wasxfail", None) or str(report.longrepr)
        if _pending(item, reason):
            return
        report.outcome = "failed"
        report.longrepr = f"interop tests must all run, but this one was skipped/xfailed: {reason}"


def _pending(item: pytest.Item, reason: str) -> bool:
    """A strict xfail waiting for another part of an open issue (see the module)."""
    marker = item.get_closest_marker("xfail")
    return (marker is not None and bool(marker.kwargs.get("strict"))
            and reason.startswith(PENDING_PREFIX) and ":" in reason)


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

    def spawn(kind: str, *, port: int | None = None, max_sessions: int = 1,
              extra_args: Sequence[str] = ()) -> RecordingServer:
        # Tests restart servers on their port: one no outgoing connection can take.
        port = restartable_port() if port is None else port
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
