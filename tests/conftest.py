"""Shared test fixtures: reference servers on 127.0.0.1, and local OpenTelemetry providers.

Every test that needs a server gets it from one factory here: an :class:`EnvServer`
on the test's own event loop (``server``, ``plain_server``, ``any_server``,
``det_server``), or one in a thread for blocking code (``server_thread``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from envlink.server import EnvServer, ServerThread

from ._otel_support import Otel
from ._processes import ServerProcess

#: Options of every test server: no keepalive pings (nothing happens in the background
#: that a test did not ask for).
SERVER_OPTIONS: dict[str, Any] = {"ping_interval": None}


async def _serve(**options: Any) -> AsyncIterator[EnvServer]:
    async with EnvServer(**{**SERVER_OPTIONS, **options}) as srv:
        yield srv


@pytest.fixture
async def server() -> AsyncIterator[EnvServer]:
    """An echo server with envlink's extensions, on a free loopback port."""
    async for srv in _serve(env="echo"):
        yield srv


@pytest.fixture
async def plain_server() -> AsyncIterator[EnvServer]:
    """An echo server speaking only the vanilla OpenEnv protocol."""
    async for srv in _serve(env="echo", extensions=False):
        yield srv


@pytest.fixture(params=["plain", "extensions"])
async def any_server(request: pytest.FixtureRequest) -> AsyncIterator[EnvServer]:
    """An echo server, once plain and once with extensions."""
    async for srv in _serve(env="echo", extensions=request.param == "extensions"):
        yield srv


@pytest.fixture
async def det_server() -> AsyncIterator[EnvServer]:
    """A deterministic (seeded) environment server with extensions."""
    async for srv in _serve(env="deterministic"):
        yield srv


@pytest.fixture
async def traced_server(otel: Otel) -> AsyncIterator[EnvServer]:
    """An echo server with extensions whose spans go to ``otel``."""
    async for srv in _serve(env="echo", tracer_provider=otel.tracer_provider):
        yield srv


@pytest.fixture(scope="module")
def server_thread() -> Iterator[ServerThread]:
    """An echo server with extensions in its own thread, for blocking code; one per module."""
    with ServerThread(env="echo", **SERVER_OPTIONS) as st:
        yield st


@pytest.fixture
def otel() -> Iterator[Otel]:
    """SDK providers of this test only, with in-memory span exporter and metric reader
    (and ``otel.bridge``, a bridge emitting to them)."""
    with Otel.capture() as captured:
        yield captured


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("envlink chaos")
    group.addoption("--soak", action="store_true", default=False,
                    help="run the chaos suite in soak mode (>= 1,000 episodes, >= 500 "
                         "injected faults of every kind; also ENVLINK_CHAOS_SOAK=1)")
    group.addoption("--chaos-report", default=None, metavar="PATH",
                    help="where the chaos suite writes its JSON report (also "
                         "ENVLINK_CHAOS_REPORT; default: a temporary directory)")
    group.addoption("--chaos-seed", default=None, type=int, metavar="N",
                    help="seed of the chaos suite (also ENVLINK_CHAOS_SEED)")


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    # The chaos suite's summary tables (tests/chaos), printed even when output is captured.
    for text in getattr(config, "envlink_chaos_summaries", []):
        terminalreporter.write_sep("=", "envlink chaos")
        terminalreporter.write_line(text)


@pytest.fixture
def processes() -> Iterator[Callable[..., ServerProcess]]:
    """Reference servers (``envlink serve``'s module) in processes, started on demand;
    all stopped at the end."""
    started: list[ServerProcess] = []

    def start(*args: str) -> ServerProcess:
        proc = ServerProcess(*args, events=True)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop()
