"""Fixtures: real reference servers on 127.0.0.1, and no backoff waits."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from envlink import set_testing
from envlink.server import EnvServer


@pytest.fixture(autouse=True)
def _no_backoff_waits() -> Iterator[None]:
    with set_testing():
        yield


@pytest.fixture
async def server() -> AsyncIterator[EnvServer]:
    """An echo server with envlink's extensions."""
    async with EnvServer(env="echo") as srv:
        yield srv


@pytest.fixture
async def plain_server() -> AsyncIterator[EnvServer]:
    """An echo server speaking only the vanilla OpenEnv protocol."""
    async with EnvServer(env="echo", extensions=False) as srv:
        yield srv


@pytest.fixture(params=["plain", "extensions"])
async def any_server(request: pytest.FixtureRequest) -> AsyncIterator[EnvServer]:
    """An echo server, once plain and once with extensions."""
    async with EnvServer(env="echo", extensions=request.param == "extensions") as srv:
        yield srv


@pytest.fixture
async def det_server() -> AsyncIterator[EnvServer]:
    """A deterministic (seeded) environment server with extensions."""
    async with EnvServer(env="deterministic") as srv:
        yield srv
