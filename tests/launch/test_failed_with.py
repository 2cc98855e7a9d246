"""A `with` / `async with` whose connect fails stops the provider's server it started."""

from __future__ import annotations

from typing import Any

import pytest

from envlink import ConnectError, GenericEnvClient, Timeout

from .._ports import restartable_port

pytestmark = pytest.mark.timeout(60)


class DeadServerProvider:
    """A container provider whose servers start, but answer nothing at their URL."""

    def __init__(self) -> None:
        self.url = f"http://127.0.0.1:{restartable_port()}"
        self.events: list[str] = []

    def start_container(self, *args: Any, **kwargs: Any) -> str:
        self.events.append("start")
        return self.url

    def wait_for_ready(self, *args: Any, **kwargs: Any) -> None:
        self.events.append("ready")

    def stop_container(self) -> None:
        self.events.append("stop")


async def test_a_failed_async_with_stops_the_provider() -> None:
    """`async with` whose connect fails: the provider's server is stopped before the error
    propagates, as leaving the block would stop it, and the client is closed."""
    provider = DeadServerProvider()
    client = GenericEnvClient(provider=provider, timeout=Timeout(20))
    with pytest.raises(ConnectError):
        async with client:
            raise AssertionError("connected to a dead port")
    assert provider.events == ["start", "ready", "stop"]
    assert client.closed


def test_a_failed_with_stops_the_provider() -> None:
    """The same with a blocking `with`."""
    provider = DeadServerProvider()
    client = GenericEnvClient(provider=provider, timeout=Timeout(20))
    with pytest.raises(ConnectError), client:
        raise AssertionError("connected to a dead port")
    assert provider.events == ["start", "ready", "stop"]
    assert client.closed
