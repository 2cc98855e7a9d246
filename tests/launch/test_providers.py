"""provider=: servers the client starts and stops, with no orphan process left behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from typing import Any

import pytest

from envlink import (
    DockerProvider,
    GenericEnvClient,
    InvalidArgumentError,
    LocalServerProvider,
    NotReadyError,
    ProviderError,
    Timeout,
)
from envlink._launch.lifecycle import _uv_provider
from envlink._launch.providers import docker_run_command

from .._processes import process_gone

pytestmark = pytest.mark.timeout(60)

NEVER_READY = [sys.executable, "-c", "import time; time.sleep(120)"]


class RecordingContainer:
    """An OpenEnv-style ContainerProvider that runs the reference server locally."""

    def __init__(self, *, fail_ready: bool = False) -> None:
        self.calls: list[tuple[str, Any]] = []
        self._local = LocalServerProvider()
        self._fail_ready = fail_ready

    def start_container(self, image: str = "echo:latest", port: int | None = None,
                        env_vars: dict[str, str] | None = None, **kwargs: Any) -> str:
        self.calls.append(("start_container", (image, kwargs)))
        return self._local.start(port)

    def wait_for_ready(self, base_url: str, timeout_s: float = 30.0) -> None:
        self.calls.append(("wait_for_ready", (base_url, timeout_s)))
        if self._fail_ready:
            raise TimeoutError(f"{base_url} did not become ready")
        self._local.wait_for_ready(timeout_s)

    def stop_container(self) -> None:
        self.calls.append(("stop_container", None))
        self._local.stop()

    @property
    def pid(self) -> int | None:
        return self._local.pid


async def test_runtime_provider_started_on_connect_and_stopped_on_close() -> None:
    """A LocalServerProvider starts on the first call (base_url unknown until then) and its
    process is gone after close()."""
    provider = LocalServerProvider()
    client = GenericEnvClient(provider=provider, timeout=Timeout(30))
    assert client.base_url is None and provider.pid is None
    result = await client.reset()
    assert result.observation["echoed_message"] == "Echo environment ready!"
    pid = provider.pid
    assert pid is not None and client.base_url == provider.base_url
    await client.close()
    assert provider.pid is None and process_gone(pid)


async def test_children_share_the_provider_until_the_last_closes() -> None:
    """new_session() children use the same server; it stops only when the last user closes."""
    provider = LocalServerProvider()
    parent = GenericEnvClient(provider=provider, timeout=Timeout(30))
    await parent.connect()
    pid = provider.pid
    assert pid is not None
    child = await parent.new_session()
    assert child.base_url == parent.base_url
    await child.close()
    assert provider.pid == pid  # still serving the parent
    await parent.step({"message": "still up"})
    await parent.close()
    assert provider.pid is None and process_gone(pid)


async def test_container_provider_is_driven_as_openenv_does() -> None:
    """A duck-typed ContainerProvider: start_container(), wait_for_ready(url) (its own
    readiness timeout, as OpenEnv leaves it), and stop_container() on close."""
    provider = RecordingContainer()
    async with GenericEnvClient(provider=provider, timeout=Timeout(20)) as client:
        await client.step({"message": "x"})
        pid = provider.pid
    names = [name for name, _ in provider.calls]
    assert names == ["start_container", "wait_for_ready", "stop_container"]
    assert provider.calls[1][1] == (client.base_url, 30.0)  # the provider's default
    assert pid is not None and process_gone(pid)


async def test_failed_readiness_stops_what_was_started() -> None:
    """wait_for_ready failing: its own error (unchanged, as OpenEnv lets it through), and
    the started container is stopped."""
    provider = RecordingContainer(fail_ready=True)
    client = GenericEnvClient(provider=provider, timeout=Timeout(20))
    with pytest.raises(TimeoutError, match="did not become ready") as info:
        await client.connect()
    assert not isinstance(info.value, ProviderError)
    assert [n for n, _ in provider.calls][-1] == "stop_container"
    assert provider.pid is None
    await client.close()


async def test_a_server_that_exits_or_never_answers_is_stopped() -> None:
    """A command that exits early, or never becomes ready (within the timeout the call
    was given): ProviderError, no process left."""
    exits = LocalServerProvider([sys.executable, "-c", "raise SystemExit(3)"])
    client = GenericEnvClient(provider=exits, timeout=Timeout(20))
    with pytest.raises(ProviderError, match="exited with code 3"):
        await client.connect()
    await client.close()

    stuck = LocalServerProvider(NEVER_READY)
    client = GenericEnvClient(provider=stuck, timeout=Timeout(1.0))
    started: list[int] = []
    real_start = stuck.start

    def start(*args: Any, **kwargs: Any) -> str:
        url = real_start(*args, **kwargs)
        assert stuck.pid is not None
        started.append(stuck.pid)
        return url

    stuck.start = start  # type: ignore[method-assign]
    with pytest.raises(NotReadyError):
        await client.connect(timeout=1.0)  # the readiness wait's timeout, given
    assert started and process_gone(started[0]) and stuck.pid is None
    await client.close()


async def test_a_provider_that_needs_an_image_is_refused_clearly() -> None:
    """A container provider whose start_container() needs arguments cannot start itself:
    OpenEnv's ValueError (an InvalidArgumentError), with OpenEnv's wording."""
    class NeedsImage:
        def start_container(self, image: str) -> str:
            raise AssertionError("not called")

        def wait_for_ready(self, base_url: str, timeout_s: float = 30.0) -> None: ...

        def stop_container(self) -> None: ...

    client = GenericEnvClient(provider=NeedsImage())
    with pytest.raises(InvalidArgumentError,
                       match=r"start_container\(\) requires image") as info:
        await client.connect()
    assert isinstance(info.value, ValueError) and not isinstance(info.value, ProviderError)
    await client.close()
    with pytest.raises(ProviderError, match="is not a provider"):
        GenericEnvClient(provider=object())


async def test_from_docker_image_with_a_provider_await_and_close() -> None:
    """from_docker_image(image, provider=...) is lazy; awaited it is connected; close stops it."""
    provider = RecordingContainer()
    handle = GenericEnvClient.from_docker_image("echo-env:1", provider=provider, flag=True)
    assert provider.calls == [] and "pending" in repr(handle)
    client = await handle
    assert client.connected
    assert provider.calls[0] == ("start_container", ("echo-env:1", {"flag": True}))
    with pytest.raises(RuntimeError, match="already"):  # as a coroutine: resolves once
        await handle
    with pytest.raises(RuntimeError, match="already resolved"):
        handle.sync()
    await client.close()
    assert provider.calls[-1][0] == "stop_container"


def test_from_docker_image_sync() -> None:
    """.sync() on the handle gives a connected blocking facade; closing it stops the server."""
    provider = RecordingContainer()
    env = GenericEnvClient.from_docker_image("echo-env:1", provider=provider).sync()
    pid = provider.pid
    assert env.step({"message": "hi"}).observation["echoed_message"] == "hi"
    env.close()
    assert pid is not None and process_gone(pid) and provider.calls[-1][0] == "stop_container"


async def test_from_env_uses_the_space_image() -> None:
    """from_env(repo_id) runs registry.hf.space/<subdomain>:<tag> in the container provider."""
    provider = RecordingContainer()
    client = await GenericEnvClient.from_env("OpenEnv/echo_env", provider=provider, tag="v2")
    assert provider.calls[0][1][0] == "registry.hf.space/openenv-echo-env:v2"
    await client.close()


def test_docker_paths_without_a_container_engine() -> None:
    """The docker command line as OpenEnv's (port on loopback), and a typed error without
    docker."""
    assert docker_run_command("img:1", name="n", port=1234, env_vars={"A": "b"}) == [
        "docker", "run", "-d", "--name", "n", "-p", "127.0.0.1:1234:8000", "-e", "A=b", "img:1"]
    with pytest.raises(ProviderError, match="docker is not available"):
        DockerProvider(docker="envlink-no-such-docker").start_container("img:1")
    handle = GenericEnvClient.from_docker_image(
        "img:1", provider=DockerProvider(docker="envlink-no-such-docker"))
    with pytest.raises(ProviderError, match="docker is not available"):
        handle.sync()


def test_from_env_without_docker_runs_uv_on_a_checkout(tmp_path: Any) -> None:
    """use_docker=False runs `uv run ... uvicorn` on a local checkout; without one it says so."""
    provider = _uv_provider("o/s", {"project_path": str(tmp_path), "app": "server.app:app"})
    assert provider.command[:5] == ["uv", "run", "--isolated", "--project", str(tmp_path)]
    assert "uvicorn" in provider.command and "server.app:app" in provider.command
    with pytest.raises(ProviderError, match="needs a local checkout"):
        _uv_provider("o/s", {})
    with pytest.raises(ValueError, match="owner/space"):
        GenericEnvClient.from_env("not-a-space")


INTERRUPTED_CALLER = textwrap.dedent("""
    import asyncio, json, sys
    import envlink

    provider = envlink.LocalServerProvider({command!r})

    async def main():
        client = envlink.GenericEnvClient(provider=provider, timeout=60)
        real_start = provider.start
        def start(*args, **kwargs):
            url = real_start(*args, **kwargs)
            print(json.dumps({{"pid": provider.pid}}), flush=True)
            return url
        provider.start = start
        await client.connect()

    asyncio.run(main())
""")


def test_no_orphan_when_the_caller_is_killed_mid_start() -> None:
    """The caller killed (SIGKILL) while it waits for its provider: the server dies too."""
    script = INTERRUPTED_CALLER.format(command=NEVER_READY)
    caller = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=os.environ.copy())
    try:
        assert caller.stdout is not None
        line = caller.stdout.readline()
        assert line, caller.stderr.read() if caller.stderr else "no output"
        pid = json.loads(line)["pid"]
        os.kill(pid, 0)  # the server runs
        caller.send_signal(signal.SIGKILL)
        caller.wait(15)
        assert process_gone(pid), f"server {pid} outlived its killed caller"
    finally:
        if caller.poll() is None:
            caller.kill()
            caller.wait(15)
