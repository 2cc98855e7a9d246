"""A provider that fails to stop: the provider's error is raised, and nothing new starts."""

from __future__ import annotations

import os
import stat
import threading
from typing import Any

import pytest

from envlink import DockerProvider, GenericEnvClient, LocalServerProvider, ProviderError, Timeout
from envlink.server import EnvServer

pytestmark = pytest.mark.timeout(60)


class StuckContainer(RuntimeError):
    """The provider's own stop failure (what OpenEnv's providers raise)."""


class Ledger:
    """A container provider whose servers are a real reference server; its stop fails
    ``stop_failures`` times (``-1``: always), and a start while one runs is recorded."""

    def __init__(self, url: str, *, stop_failures: int = 0, start_error: Exception | None = None,
                 runtime: bool = False) -> None:
        self.url = url
        self.stop_failures = stop_failures
        self.start_error = start_error
        self.events: list[tuple[str, int]] = []
        self.live: set[int] = set()
        self.current = 0
        if runtime:  # an OpenEnv RuntimeProvider: start() / stop()
            self.start, self.stop = self._start, self._stop
        else:
            self.start_container, self.stop_container = self._start, self._stop

    def _start(self) -> str:
        self.current += 1
        self.live.add(self.current)
        self.events.append(("start", self.current))
        if self.start_error is not None:
            raise self.start_error  # a provider may hold a resource before it fails
        return self.url

    def wait_for_ready(self, *args: Any, **kwargs: Any) -> None:
        self.events.append(("ready", self.current))

    def _stop(self) -> None:
        self.events.append(("stop", self.current))
        if self.stop_failures:
            self.stop_failures -= 1
            raise StuckContainer(f"container {self.current} is still running")
        self.live.discard(self.current)


@pytest.fixture(params=["container", "runtime"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def test_a_stop_that_fails_once_is_raised_and_close_again_stops(
        server: EnvServer, kind: str) -> None:
    """One failed stop_container()/stop(): close() raises the provider's own error (one
    try, as OpenEnv); close() again tries once more and stops; nothing is left."""
    provider = Ledger(server.url, stop_failures=1, runtime=kind == "runtime")
    client = GenericEnvClient(provider=provider, timeout=Timeout(20))
    await client.step({"message": "x"})
    with pytest.raises(StuckContainer):
        await client.close()
    await client.close()
    assert provider.events == [("start", 1), ("ready", 1), ("stop", 1), ("stop", 1)]
    assert provider.live == set()


async def test_a_stop_that_always_fails_is_raised_and_blocks_a_new_start(
        server: EnvServer, kind: str) -> None:
    """A stop failing every try: close() raises the provider's error (not wrapped in a
    ProviderError); no new server starts on that provider until a later stop succeeds."""
    provider = Ledger(server.url, stop_failures=-1, runtime=kind == "runtime")
    client = GenericEnvClient(provider=provider, timeout=Timeout(20))
    await client.connect()
    with pytest.raises(StuckContainer) as info:
        await client.close()
    error = info.value
    assert not isinstance(error, ProviderError)
    if hasattr(error, "__notes__"):  # Python 3.11+
        assert "still be running" in error.__notes__[0]
        assert "close() again" in error.__notes__[0]
    assert provider.events.count(("stop", 1)) == 1
    assert provider.live == {1}

    # Another client of the same provider: the stop is tried first, once, and fails.
    again = GenericEnvClient(provider=provider, timeout=Timeout(20))
    before = list(provider.events)
    with pytest.raises(StuckContainer):
        await again.connect()
    assert provider.events == [*before, ("stop", 1)]
    assert provider.live == {1}

    # close() again tries the stop; once it succeeds, a new server may start.
    provider.stop_failures = 0
    await client.close()
    assert provider.live == set()
    await again.step({"message": "y"})
    assert provider.events[-2:] == [("start", 2), ("ready", 2)]
    await again.close()
    assert provider.live == set()


async def test_a_failed_start_whose_stop_fails_keeps_the_start_error(server: EnvServer) -> None:
    """start fails and so does its cleanup: the start's own error is raised (the stop's
    noted), and the next connect tries the stop before it would start anything."""
    start_error = ValueError("no GPU")
    provider = Ledger(server.url, stop_failures=-1, start_error=start_error)
    client = GenericEnvClient(provider=provider, timeout=Timeout(20))
    with pytest.raises(ValueError, match="no GPU") as info:
        await client.connect()
    assert info.value is start_error
    if hasattr(info.value, "__notes__"):  # Python 3.11+
        assert "may still be running" in info.value.__notes__[0]
    assert provider.events == [("start", 1), ("stop", 1)]

    provider.start_error = None
    before = list(provider.events)
    with pytest.raises(StuckContainer):
        await client.connect()
    assert provider.events == [*before, ("stop", 1)]  # no ("start", 2)

    # close() tries the pending stop too, and raises while it fails.
    other = GenericEnvClient(provider=provider, timeout=Timeout(20))
    with pytest.raises(StuckContainer):
        await other.close()
    assert provider.events[-1] == ("stop", 1) and provider.live == {1}

    provider.stop_failures = 0
    await client.connect()
    assert provider.events[-3:] == [("stop", 1), ("start", 2), ("ready", 2)]
    assert provider.live == {2}
    await client.close()
    assert provider.live == set()


def test_the_blocking_client_raises_the_failed_stop_and_retries_it(
        server_thread: Any) -> None:
    """Plain code: close() raises the failed stop; close() again tries it once more."""
    provider = Ledger(server_thread.url, stop_failures=2)
    env = GenericEnvClient(provider=provider, timeout=Timeout(20))
    env.reset()
    with pytest.raises(StuckContainer):
        env.close()
    assert provider.live == {1}
    with pytest.raises(StuckContainer):
        env.close()
    env.close()  # the third try succeeds
    assert provider.live == set()
    env.close()  # stopped: never tried again
    assert provider.events.count(("stop", 1)) == 3


def test_docker_provider_raises_a_failed_removal_and_can_retry(tmp_path: Any) -> None:
    """DockerProvider.stop_container(): a failing `docker rm -f` is a ProviderError and the
    container is kept, so that a retry removes it."""
    script = tmp_path / "docker"
    log = tmp_path / "calls"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$@" >> {log}\n'
        'if [ "$1" = rm ] && [ -e "$0.fail" ]; then echo "daemon busy" >&2; exit 1; fi\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    (tmp_path / "docker.fail").write_text("")
    provider = DockerProvider(docker=str(script))
    provider.container_id = "abc123"
    with pytest.raises(ProviderError, match=r"docker rm -f abc123 failed.*daemon busy"):
        provider.stop_container()
    assert provider.container_id == "abc123"
    os.remove(tmp_path / "docker.fail")
    provider.stop_container()
    assert provider.container_id is None
    assert log.read_text().splitlines() == ["stop abc123", "rm -f abc123"] * 2


def test_a_local_server_provider_leaves_no_envlink_thread_after_close() -> None:
    """Plain code with LocalServerProvider: after close(), no envlink thread is left (the
    bridge's, the spawning thread and the process watchers all end)."""
    before = set(threading.enumerate())
    provider = LocalServerProvider()
    with GenericEnvClient(provider=provider, timeout=Timeout(30)) as env:
        assert env.reset().observation["echoed_message"]
        assert any(t.name.startswith("envlink-spawn") for t in threading.enumerate())
    leftover = [t for t in threading.enumerate()
                if t.name.startswith("envlink") and t not in before]
    for thread in leftover:
        thread.join(timeout=10)  # a watcher ends once it has seen its process exit
    assert [t.name for t in leftover if t.is_alive()] == []
    assert provider.pid is None
