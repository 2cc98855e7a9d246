"""Fixtures for EnvPool tests: reference servers on 127.0.0.1, no backoff waits."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AsyncExitStack
from typing import Any

import pytest

from envlink import GenericEnvClient, set_testing
from envlink.server import EnvServer

from .._ports import restartable_port


@pytest.fixture(autouse=True)
def _no_backoff_waits() -> Iterator[None]:
    with set_testing():
        yield


@pytest.fixture
async def det_servers() -> AsyncIterator[Callable[..., Any]]:
    """Start deterministic servers on demand: ``await det_servers(max_sessions=...)``."""
    async with AsyncExitStack() as stack:

        async def start(**kwargs: Any) -> EnvServer:
            kwargs.setdefault("env", "deterministic")
            return await stack.enter_async_context(EnvServer(**kwargs))

        yield start


def dead_url() -> str:
    """A loopback URL where nothing listens (a test may start a server there later)."""
    return f"ws://127.0.0.1:{restartable_port()}"


async def solo_run(url: str, reset_kwargs: dict[str, Any], actions: list[Any]
                   ) -> list[dict[str, Any]]:
    """Observations of one client, alone, doing a reset then the actions."""
    async with GenericEnvClient(url) as env:
        out = [(await env.reset(**reset_kwargs)).observation]
        for action in actions:
            out.append((await env.step(action)).observation)
    return out
