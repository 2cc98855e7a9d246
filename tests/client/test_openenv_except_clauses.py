"""The migration guide's table: each `except` clause written for OpenEnv 0.10's client
still catches what envlink raises in the same situation, on a real loopback server.

Each case raises the real situation (a full server, a refused upgrade, an error frame,
a late answer, a closed port, a client built with no arguments, a failing provider)
and catches it with the builtin class OpenEnv raised there, and with envlink's own.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import envlink
from envlink import (
    CallTimeoutError,
    CapacityReachedError,
    ConnectError,
    EchoEnv,
    EnvlinkError,
    ExecutionModeError,
    GenericEnvClient,
    HandshakeRejectedError,
    InvalidArgumentError,
    LocalServerProvider,
    ProviderError,
    ReconnectPolicy,
    ServerError,
    ServerValidationError,
    Timeout,
    ToolCallError,
)
from envlink.server import ServerThread

pytestmark = pytest.mark.timeout(60)

NO_RETRY = ReconnectPolicy(max_attempts=1)


@pytest.fixture
def full_server() -> Iterator[ServerThread]:
    """A reference server that allows one session."""
    with ServerThread(env="echo", max_sessions=1) as st:
        yield st


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_an_error_frame_is_a_runtime_error(server_thread: ServerThread) -> None:
    """OpenEnv: `except RuntimeError` around a step the server refuses. envlink: the
    same clause catches ServerValidationError (a ServerError)."""
    with GenericEnvClient(server_thread.url) as env:
        env.reset()
        with pytest.raises(RuntimeError) as caught:
            env.step({"type": "call_tool", "arguments": "not-a-dict"})
        assert isinstance(caught.value, ServerValidationError)
        server_thread.call(lambda s: setattr(s.faults, "error_frames", 1))
        try:
            env.step({"message": "x"})
        except RuntimeError as exc:
            assert type(exc) is ServerError and exc.code == "EXECUTION_ERROR"
        else:
            raise AssertionError("the injected error frame was not raised")


def test_a_full_server_is_a_runtime_error(full_server: ServerThread) -> None:
    """OpenEnv: `except RuntimeError` around a session on a full server (its error frame).
    envlink: the same clause catches CapacityReachedError."""
    with GenericEnvClient(full_server.url) as first:
        first.reset()
        try:
            with GenericEnvClient(full_server.url, reconnect=NO_RETRY) as second:
                second.reset()
        except RuntimeError as exc:
            assert isinstance(exc, CapacityReachedError)
        else:
            raise AssertionError("the second session was not refused")


def test_a_refused_upgrade_is_a_connection_error(server_thread: ServerThread) -> None:
    """OpenEnv: `except ConnectionError` around connect() when the server answers the
    upgrade with 403. envlink: the same clause catches HandshakeRejectedError."""
    server_thread.call(lambda s: (setattr(s.faults, "refuse", 1),
                                  setattr(s.faults, "refuse_status", 403)))
    try:
        with pytest.raises(ConnectionError) as caught:
            GenericEnvClient(server_thread.url, reconnect=NO_RETRY).connect()
    finally:
        server_thread.call(lambda s: setattr(s.faults, "refuse", 0))
    assert isinstance(caught.value, HandshakeRejectedError) and caught.value.status == 403


def test_a_closed_port_is_a_connection_error() -> None:
    """OpenEnv: `except ConnectionError` when nothing listens. envlink: ConnectError."""
    env = GenericEnvClient(f"http://127.0.0.1:{_closed_port()}", reconnect=NO_RETRY)
    with pytest.raises(ConnectionError) as caught:
        env.reset()
    assert isinstance(caught.value, ConnectError)
    env.close()


def test_a_connect_that_does_not_finish_is_a_connection_error() -> None:
    """OpenEnv: `except ConnectionError` when the upgrade is not answered within
    connect_timeout_s. envlink: the same clause catches ConnectError."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # accepts TCP connections, never answers the upgrade
        port = silent.getsockname()[1]
        env = GenericEnvClient(f"http://127.0.0.1:{port}", connect_timeout_s=0.3,
                               reconnect=NO_RETRY)
        with pytest.raises(ConnectionError, match="timed out") as caught:
            env.reset()
        env.close()
    assert isinstance(caught.value, ConnectError)


def test_a_late_answer_is_a_timeout_error(server_thread: ServerThread) -> None:
    """OpenEnv: `except asyncio.TimeoutError` (the builtin TimeoutError) when an answer is
    late. envlink: the same clause catches CallTimeoutError."""
    async def run() -> None:
        async with GenericEnvClient(server_thread.url, timeout=Timeout(call=0.2)) as env:
            await env.reset()
            server_thread.call(lambda s: setattr(s.faults, "latency", 2.0))
            try:
                with pytest.raises(asyncio.TimeoutError) as caught:
                    await env.step({"message": "slow"})
            finally:
                server_thread.call(lambda s: setattr(s.faults, "latency", 0.0))
            assert isinstance(caught.value, CallTimeoutError)

    asyncio.run(run())


def test_a_tool_error_is_a_runtime_error(server_thread: ServerThread) -> None:
    """OpenEnv: `except RuntimeError` around call_tool of an unknown tool. envlink: the
    same clause catches ToolCallError."""
    with EchoEnv(server_thread.url) as env:
        env.reset()
        with pytest.raises(RuntimeError) as caught:
            env.call_tool("no_such_tool", message="x")
    assert isinstance(caught.value, ToolCallError)


@pytest.mark.parametrize("make", [lambda: GenericEnvClient(), lambda: EchoEnv()],
                         ids=["GenericEnvClient", "EchoEnv"])
def test_a_client_without_a_server_is_a_value_error(make: Callable[[], Any]) -> None:
    """OpenEnv: `except ValueError` for a client given neither base_url nor provider.
    envlink: the same clause catches InvalidArgumentError."""
    with pytest.raises(ValueError, match="base_url") as caught:
        make()
    assert isinstance(caught.value, InvalidArgumentError)


def test_an_unknown_mode_is_a_value_error() -> None:
    """OpenEnv: `except ValueError` for mode="gym". envlink: the same."""
    with pytest.raises(ValueError, match="mode"):
        GenericEnvClient("http://127.0.0.1:9", mode="gym")


def test_mixing_await_and_plain_calls_is_a_runtime_error(server_thread: ServerThread) -> None:
    """OpenEnv: `except RuntimeError` when a client used by plain calls is then used with
    `async with`. envlink: the same clause catches ExecutionModeError."""
    env = GenericEnvClient(server_thread.url)
    env.reset()
    try:
        async def mix() -> None:
            async with env:
                pass

        with pytest.raises(RuntimeError) as caught:
            asyncio.run(mix())
        assert isinstance(caught.value, ExecutionModeError)
    finally:
        env.close()


class _Failing:
    """An OpenEnv-style runtime provider whose start or readiness fails as OpenEnv's do."""

    def __init__(self, error: BaseException, *, when: str) -> None:
        self.error = error
        self.when = when
        self.stopped = 0

    def start(self, port: int | None = None, env_vars: Any = None, **kwargs: Any) -> str:
        if self.when == "start":
            raise self.error
        return "http://127.0.0.1:9"

    def wait_for_ready(self, timeout_s: float = 30.0) -> None:
        raise self.error

    def stop(self) -> None:
        self.stopped += 1


@pytest.mark.parametrize(("error", "when", "kind"), [
    (RuntimeError("docker is not running"), "start", RuntimeError),
    (TimeoutError("not ready after 30s"), "ready", TimeoutError),
])
def test_a_provider_failure_keeps_its_class(error: BaseException, when: str,
                                            kind: type[BaseException]) -> None:
    """OpenEnv: `except RuntimeError` / `except TimeoutError` around a client whose
    provider fails (its exception unchanged). envlink raises it unchanged too (the same
    object); nothing is left started."""
    provider = _Failing(error, when=when)
    env = GenericEnvClient(provider=provider)
    with pytest.raises(kind) as caught:
        env.reset()
    assert caught.value is error
    assert provider.stopped == 1
    env.close()


def test_a_provider_that_exits_is_a_runtime_error() -> None:
    """OpenEnv: `except RuntimeError` when the server process dies before it is ready
    (UVProvider, LocalDockerProvider). envlink's LocalServerProvider: the same clause
    catches its ProviderError."""
    provider = LocalServerProvider(["python3", "-c", "raise SystemExit(3)"])
    env = GenericEnvClient(provider=provider)
    with pytest.raises(RuntimeError, match="exited with code 3") as caught:
        env.reset()
    assert isinstance(caught.value, ProviderError)
    env.close()


def test_every_error_of_the_tree_is_still_an_envlink_error() -> None:
    """The builtin bases add to the tree and take nothing away: every exported error is
    an EnvlinkError, and the builtin it also is matches the migration guide."""
    builtins = {
        "ConnectError": ConnectionError, "HandshakeRejectedError": ConnectionError,
        "NotReadyError": TimeoutError, "ProviderError": ConnectionError,
        "ServerError": RuntimeError, "CapacityReachedError": RuntimeError,
        "ToolCallError": RuntimeError, "McpError": RuntimeError,
        "CallTimeoutError": TimeoutError, "InvalidArgumentError": ValueError,
        "ExecutionModeError": RuntimeError, "ClientClosedError": RuntimeError,
    }
    for name, builtin in builtins.items():
        cls = getattr(envlink, name)
        assert issubclass(cls, EnvlinkError) and issubclass(cls, builtin), name


def test_a_closed_client_or_bridge_is_a_runtime_error(server_thread: ServerThread) -> None:
    """OpenEnv: `except RuntimeError` for a call on a client that cannot run (closed, or
    its cleanup pending). envlink: the same clause, and `except EnvlinkError`, catch
    ClientClosedError, whose message names close()."""
    bridge = envlink.Bridge()
    env = GenericEnvClient(server_thread.url).sync(bridge=bridge)
    bridge.close()
    for clause in (RuntimeError, EnvlinkError):
        with pytest.raises(clause, match=r"close\(\)") as caught:
            env.reset()
        assert isinstance(caught.value, envlink.ClientClosedError)
    env.close()
