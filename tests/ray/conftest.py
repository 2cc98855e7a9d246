"""Fixtures for envlink.ray: one local Ray for the whole session, reference servers.

Ray is an optional extra: without it these tests are skipped with the reason, unless
``ENVLINK_REQUIRE_RAY=1`` (set by ``.ci/run``), which turns the skip into a failure.
(No ``__init__.py`` here: a package named ``ray`` would shadow Ray itself.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from .._processes import ServerProcess
from ..telemetry.conftest import otlp_http_receiver  # noqa: F401  (reused OTLP receiver)


@pytest.fixture(scope="session")
def ray_local() -> Iterator[Any]:
    """A local Ray (2 CPUs, 127.0.0.1, no dashboard), started once per test session."""
    import ray

    ray.init(num_cpus=2, _node_ip_address="127.0.0.1", include_dashboard=False,
             log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def server_processes() -> Iterator[list[ServerProcess]]:
    """Two ``envlink serve`` processes (deterministic environment) on 127.0.0.1."""
    procs = [ServerProcess(), ServerProcess()]
    yield procs
    for proc in procs:
        proc.stop()


@pytest.fixture
def threads() -> Iterator[Callable[..., Any]]:
    """Start in-process reference servers (own thread each) on demand; stopped at the end."""
    from envlink.server import ServerThread

    started: list[ServerThread] = []

    def start(**kwargs: Any) -> ServerThread:
        kwargs.setdefault("env", "deterministic")
        st = ServerThread(**kwargs)
        st.start()
        started.append(st)
        return st

    yield start
    for st in started:
        st.stop()
