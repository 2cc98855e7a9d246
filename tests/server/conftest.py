from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from envlink.server import EnvServer


@pytest.fixture
async def server() -> AsyncIterator[EnvServer]:
    """An echo server with extensions enabled, on a free loopback port."""
    async with EnvServer(env="echo", ping_interval=None) as srv:
        yield srv


@pytest.fixture
async def det_server() -> AsyncIterator[EnvServer]:
    """A deterministic-environment server with extensions enabled."""
    async with EnvServer(env="deterministic", ping_interval=None) as srv:
        yield srv
