"""A `with` / `async with` whose connect fails stops the provider's server it started."""

from __future__ import annotations

import asyncio
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


class FailingProvider:
    """A container provider whose server never becomes ready and whose stop fails."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.not_ready = ValueError("never ready")
        self.stop_error = RuntimeError("stop failed")

    def start_container(self, *args: Any, **kwargs: Any) -> str:
        self.events.append("start")
        return f"http://127.0.0.1:{restartable_port()}"

    def wait_for_ready(self, *args: Any, **kwargs: Any) -> None:
        self.events.append("ready")
        raise self.not_ready

    def stop_container(self) -> None:
        self.events.append("stop")
        raise self.stop_error


@pytest.mark.parametrize("how", ["async with", "with", "with sync()", "bootstrap",
                                 "async with bootstrap", "connect"])
async def test_a_failed_with_tries_the_stop_once(how: str) -> None:
    """One user call, one stop try: a `with` / `async with` (of a client, its facade or
    a from_docker_image handle) whose readiness fails and whose stop fails too tries the
    stop once, and raises the readiness error with the failed stop noted."""
    provider = FailingProvider()

    async def run() -> None:
        if how == "async with":
            async with GenericEnvClient(provider=provider):
                raise AssertionError("entered")  # pragma: no cover
        elif how == "with":
            await asyncio.to_thread(_enter, GenericEnvClient(provider=provider))
        elif how == "with sync()":
            await asyncio.to_thread(_enter, GenericEnvClient(provider=provider).sync())
        elif how == "bootstrap":
            await asyncio.to_thread(_enter, GenericEnvClient.from_docker_image(
                "img", provider=provider))
        elif how == "async with bootstrap":
            async with GenericEnvClient.from_docker_image("img", provider=provider):
                raise AssertionError("entered")  # pragma: no cover
        else:
            await GenericEnvClient(provider=provider).connect()

    with pytest.raises(ValueError, match="never ready") as caught:
        await run()
    assert caught.value is provider.not_ready
    assert provider.events == ["start", "ready", "stop"]


def _enter(manager: Any) -> None:
    with manager:
        raise AssertionError("entered")  # pragma: no cover
