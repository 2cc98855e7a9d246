"""A provider's lifecycle as OpenEnv 0.10 runs it (its ``test_client_provider_cleanup.py``).

- a stop is tried once per user call, and the provider's own exception is raised
  unchanged (the same object);
- a failed stop stays pending: the next call (``new_session``, ``connect``, ``reset``,
  ``close``) tries it once, first, and nothing is allocated or connected meanwhile;
- once it succeeds, the original resource is stopped before a new one starts;
- a stop that succeeded is never tried again (``close()`` twice stops once);
- a provider's start or readiness error propagates unchanged.

The provider is a ledger of resources whose next start overwrites its only handle (so
a stop tried at the wrong time would lose one); the server is a MockTransport, whose
``connections`` count says whether anything connected. As in OpenEnv, a client is used
again after ``close()``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
from collections.abc import Iterator
from typing import Any
from unittest.mock import Mock

import pytest

from envlink import (
    ClientClosedError,
    GenericEnvClient,
    InvalidArgumentError,
    MockTransport,
    ProviderError,
)
from envlink._client.client import configured_client

pytestmark = pytest.mark.timeout(30)


class ResourceLedger:
    """A provider whose next start overwrites its sole resource handle (OpenEnv's)."""

    def __init__(self, start_name: str, stop_name: str) -> None:
        self.events: list[tuple[str, int | None]] = []
        self.live_resources: set[int] = set()
        self.current_resource: int | None = None
        self.allocations = 0
        self.start_error: BaseException | None = None
        self.readiness_error: BaseException | None = None
        self.stop_error: BaseException | None = None
        self.provider = Mock(spec=[start_name, stop_name, "wait_for_ready"])
        getattr(self.provider, start_name).side_effect = self.start
        getattr(self.provider, stop_name).side_effect = self.stop
        self.provider.wait_for_ready.side_effect = self.wait_for_ready
        self.ready_calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def start(self, *args: Any, **kwargs: Any) -> str:
        self.allocations += 1
        self.current_resource = self.allocations
        self.live_resources.add(self.current_resource)
        self.events.append(("start", self.current_resource))
        if self.start_error is not None:
            raise self.start_error  # a provider can hold a resource before it fails
        return f"http://127.0.0.1:{8000 + self.current_resource}"

    def wait_for_ready(self, *args: Any, **kwargs: Any) -> None:
        self.ready_calls.append((args, kwargs))
        self.events.append(("ready", self.current_resource))
        if self.readiness_error is not None:
            raise self.readiness_error

    def stop(self) -> None:
        self.events.append(("stop", self.current_resource))
        if self.stop_error is not None:
            raise self.stop_error
        # An accidental repeated stop fails, as with non-idempotent providers.
        assert self.current_resource is not None
        self.live_resources.remove(self.current_resource)


@pytest.fixture(params=[("start_container", "stop_container"), ("start", "stop")],
                ids=["container", "runtime"])
def ledger(request: pytest.FixtureRequest) -> ResourceLedger:
    return ResourceLedger(*request.param)


@pytest.fixture(params=["async", "sync"])
def execution_mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


class _Failing:
    """The child constructor's failure (OpenEnv's SessionClient.child_error)."""

    error: BaseException | None = None


@pytest.fixture
def client_type() -> Iterator[type[GenericEnvClient]]:
    class SessionClient(GenericEnvClient):
        def __init__(self, base_url: str | None = None, **kwargs: Any) -> None:
            if base_url is not None and _Failing.error is not None:
                raise _Failing.error
            super().__init__(base_url, **kwargs)

    yield SessionClient
    _Failing.error = None


@pytest.fixture
def transport(ledger: ResourceLedger) -> MockTransport:
    def answer(request: dict[str, Any]) -> dict[str, Any]:
        return {"type": "observation", "data": {
            "observation": {"resource": ledger.current_resource}, "done": False}}

    return MockTransport(answer)


def make_client(client_type: type[GenericEnvClient], ledger: ResourceLedger, mode: str,
                transport: MockTransport) -> Any:
    client = client_type(provider=ledger.provider, transport=transport)
    return client.sync() if mode == "sync" else client


#: The one thread the blocking calls of a test come from (a plain caller's thread, alive
#: for the whole test, so that it is never mistaken for a bridge's ended thread).
_CALLER: list[concurrent.futures.ThreadPoolExecutor] = []


@pytest.fixture(autouse=True)
def _caller_thread() -> Iterator[None]:
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as caller:
        caller.submit(lambda: None).result()
        _CALLER.append(caller)
        yield
        _CALLER.remove(caller)


async def blocking(fn: Any, *args: Any) -> Any:
    return await asyncio.get_running_loop().run_in_executor(_CALLER[-1], fn, *args)


async def invoke(client: Any, mode: str, method: str, *args: Any) -> Any:
    if mode == "async":
        return await getattr(client, method)(*args)
    # Plain code, from a thread without an event loop (as a blocking caller is).
    return await blocking(getattr(client, method), *args)


def fail_setup(ledger: ResourceLedger, failure: str) -> BaseException:
    error = ValueError(f"{failure} failed")
    if failure == "start":
        ledger.start_error = error
    elif failure == "readiness":
        ledger.readiness_error = error
    else:
        _Failing.error = error
    return error


def allow_setup(ledger: ResourceLedger) -> None:
    ledger.start_error = ledger.readiness_error = _Failing.error = None


async def close_quietly(client: Any, mode: str, ledger: ResourceLedger) -> None:
    ledger.stop_error = None
    await invoke(client, mode, "close")


@pytest.mark.parametrize("failure", ["start", "readiness", "constructor"])
@pytest.mark.parametrize("retry_method", ["connect", "new_session", "reset"])
async def test_pending_cleanup_blocks_allocation_and_retries_stop_once(
        ledger: ResourceLedger, execution_mode: str, client_type: type[GenericEnvClient],
        transport: MockTransport, failure: str, retry_method: str) -> None:
    client = make_client(client_type, ledger, execution_mode, transport)
    original_error = fail_setup(ledger, failure)
    cleanup_error = RuntimeError("resource is still running")
    ledger.stop_error = cleanup_error
    try:
        with pytest.raises(ValueError, match="failed") as caught:
            await invoke(client, execution_mode, "new_session")
        assert caught.value is original_error
        assert ledger.events.count(("stop", 1)) == 1
        allow_setup(ledger)

        # Repeated user calls retry the stop once each, but never allocate or connect.
        for _ in range(2):
            previous_events = list(ledger.events)
            with pytest.raises(RuntimeError) as caught:
                await invoke(client, execution_mode, retry_method)
            assert caught.value is cleanup_error
            assert ledger.events == [*previous_events, ("stop", 1)]
            assert ledger.live_resources == {1}
            assert transport.connections == 0
    finally:
        await close_quietly(client, execution_mode, ledger)
    assert ledger.live_resources == set()


@pytest.mark.parametrize("failure", ["start", "readiness", "constructor"])
async def test_recovered_cleanup_stops_original_resource_before_restart(
        ledger: ResourceLedger, execution_mode: str, client_type: type[GenericEnvClient],
        transport: MockTransport, failure: str) -> None:
    client = make_client(client_type, ledger, execution_mode, transport)
    original_error = fail_setup(ledger, failure)
    ledger.stop_error = RuntimeError("temporary cleanup failure")
    try:
        with pytest.raises(ValueError, match="failed") as caught:
            await invoke(client, execution_mode, "new_session")
        assert caught.value is original_error
        allow_setup(ledger)
        ledger.stop_error = None
        previous_events = list(ledger.events)

        child = await invoke(client, execution_mode, "new_session")

        assert ledger.events == [*previous_events, ("stop", 1), ("start", 2), ("ready", 2)]
        assert ledger.live_resources == {2}
        assert child.base_url == "http://127.0.0.1:8002"
        assert transport.connections == 1
        await invoke(client, execution_mode, "close")
        await invoke(client, execution_mode, "close")
        assert ledger.events.count(("stop", 2)) == 1
        assert ledger.live_resources == set()
    finally:
        await close_quietly(client, execution_mode, ledger)


@pytest.mark.parametrize("retry_method", ["connect", "new_session", "reset"])
async def test_failed_explicit_close_blocks_restart_until_cleanup_succeeds(
        ledger: ResourceLedger, execution_mode: str, client_type: type[GenericEnvClient],
        transport: MockTransport, retry_method: str) -> None:
    """close() raises the provider's own error; the next call tries the stop once, raises
    it again and connects nothing; once the stop succeeds, the call stops the original
    resource and starts a new one (the client reused after close(), sync and async)."""
    client = make_client(client_type, ledger, execution_mode, transport)
    cleanup_error = RuntimeError("close failed")
    try:
        await invoke(client, execution_mode, "connect")
        ledger.stop_error = cleanup_error
        with pytest.raises(RuntimeError) as caught:
            await invoke(client, execution_mode, "close")
        assert caught.value is cleanup_error
        previous_events = list(ledger.events)

        with pytest.raises(RuntimeError) as caught:
            await invoke(client, execution_mode, retry_method)
        assert caught.value is cleanup_error
        assert ledger.events == [*previous_events, ("stop", 1)]
        assert transport.connections == 1
        assert ledger.live_resources == {1}

        ledger.stop_error = None
        previous_events = list(ledger.events)
        await invoke(client, execution_mode, retry_method)
        assert ledger.events == [*previous_events, ("stop", 1), ("start", 2), ("ready", 2)]
        await invoke(client, execution_mode, "close")
        assert ledger.live_resources == set()
        await invoke(client, execution_mode, "close")  # stopped: never tried again
        assert ledger.events.count(("stop", 2)) == 1
    finally:
        await close_quietly(client, execution_mode, ledger)


@pytest.mark.parametrize("failure", ["start", "readiness"])
async def test_connect_preserves_setup_error_when_cleanup_also_fails(
        ledger: ResourceLedger, execution_mode: str, client_type: type[GenericEnvClient],
        transport: MockTransport, failure: str) -> None:
    client = make_client(client_type, ledger, execution_mode, transport)
    original_error = fail_setup(ledger, failure)
    ledger.stop_error = RuntimeError("cleanup failed")
    try:
        with pytest.raises(ValueError, match="failed") as caught:
            await invoke(client, execution_mode, "connect")
        assert caught.value is original_error
        assert not isinstance(caught.value, ProviderError)
        notes = getattr(caught.value, "__notes__", None)
        if notes is not None:  # Python 3.11+
            assert any("cleanup failed" in note and "still be running" in note
                       for note in notes)
        assert ledger.events.count(("stop", 1)) == 1
        assert ledger.live_resources == {1}
        assert transport.connections == 0
    finally:
        await close_quietly(client, execution_mode, ledger)
    assert ledger.live_resources == set()


async def test_sibling_constructor_failure_keeps_live_child_usable(
        ledger: ResourceLedger, execution_mode: str, client_type: type[GenericEnvClient],
        transport: MockTransport) -> None:
    client = make_client(client_type, ledger, execution_mode, transport)
    try:
        # The provider is owned by a parent with no connection of its own.
        child = await invoke(client, execution_mode, "new_session")
        original_error = fail_setup(ledger, "constructor")
        with pytest.raises(ValueError, match="failed") as caught:
            await invoke(client, execution_mode, "new_session")
        assert caught.value is original_error
        assert ledger.events == [("start", 1), ("ready", 1)]
        result = await invoke(child, execution_mode, "step", {})
        assert result.observation == {"resource": 1}
        assert transport.connections == 1
        await invoke(client, execution_mode, "close")
        assert ledger.live_resources == set()
    finally:
        await close_quietly(client, execution_mode, ledger)


async def test_multiple_failure_recovery_cycles_leave_no_orphaned_resources(
        ledger: ResourceLedger, execution_mode: str, client_type: type[GenericEnvClient],
        transport: MockTransport) -> None:
    """One client through three cycles of failure, recovery and close(): each cycle
    reuses the client closed by the one before."""
    client = make_client(client_type, ledger, execution_mode, transport)
    try:
        for cycle, failure in enumerate(["start", "readiness", "constructor"]):
            original_error = fail_setup(ledger, failure)
            ledger.stop_error = RuntimeError("cleanup temporarily unavailable")
            with pytest.raises(ValueError, match="failed") as caught:
                await invoke(client, execution_mode, "new_session")
            assert caught.value is original_error
            allow_setup(ledger)
            ledger.stop_error = None

            await invoke(client, execution_mode, "new_session")
            current_resource = 2 * cycle + 2
            assert ledger.live_resources == {current_resource}
            await invoke(client, execution_mode, "close")
            await invoke(client, execution_mode, "close")
            assert ledger.live_resources == set()
            assert ledger.events.count(("stop", current_resource)) == 1
    finally:
        await close_quietly(client, execution_mode, ledger)


@pytest.mark.parametrize("retry_method", ["connect", "new_session"])
@pytest.mark.parametrize("cleanup_recovers", [False, True])
async def test_factory_pending_cleanup_requires_explicit_close(
        ledger: ResourceLedger, execution_mode: str, transport: MockTransport,
        retry_method: str, cleanup_recovers: bool) -> None:
    """A client from a bootstrap handle: after a failed close(), other calls refuse
    without touching the provider; only close() tries the stop again."""
    bootstrap = GenericEnvClient.from_env(
        "audit/test-environment", provider=ledger.provider,
        use_docker=hasattr(ledger.provider, "start_container"))
    # The handle builds its client with the default transport: give it the mock one.
    bootstrap._build = _with_transport(bootstrap._build, transport)  # type: ignore[method-assign]
    client = (await blocking(bootstrap.sync) if execution_mode == "sync"
              else await bootstrap)
    try:
        ledger.stop_error = RuntimeError("cleanup temporarily unavailable")
        with pytest.raises(RuntimeError, match="cleanup temporarily unavailable"):
            await invoke(client, execution_mode, "close")
        if cleanup_recovers:
            ledger.stop_error = None
        previous_events = list(ledger.events)
        connections = transport.connections

        for _ in range(2):
            with pytest.raises(RuntimeError, match=r"close\(\)") as refused:
                await invoke(client, execution_mode, retry_method)
            assert isinstance(refused.value, ClientClosedError)
        assert ledger.events == previous_events
        assert ledger.live_resources == {1}
        assert transport.connections == connections

        ledger.stop_error = None
        await invoke(client, execution_mode, "close")
        await invoke(client, execution_mode, "close")
        assert ledger.events == [*previous_events, ("stop", 1)]
        assert not ledger.live_resources
    finally:
        await close_quietly(client, execution_mode, ledger)


def _with_transport(build: Any, transport: MockTransport) -> Any:
    def rebuilt() -> Any:
        client = build()
        return configured_client(type(client), None,
                                 dataclasses.replace(client.config, transport=transport),
                                 provider=client.provider)

    return rebuilt


# ------------------------------------------------------------------ envlink's own


async def test_close_twice_stops_once(ledger: ResourceLedger,
                                      transport: MockTransport) -> None:
    client = GenericEnvClient(provider=ledger.provider, transport=transport)
    await client.reset()
    await client.close()
    await client.close()
    assert ledger.events == [("start", 1), ("ready", 1), ("stop", 1)]


async def test_the_providers_own_readiness_timeout_applies(
        ledger: ResourceLedger, transport: MockTransport) -> None:
    """wait_for_ready gets no timeout_s unless the call was given one (OpenEnv leaves the
    provider's default: Sprites waits 180 s), whatever the client's call timeout."""
    client = GenericEnvClient(provider=ledger.provider, transport=transport, timeout=5)
    await client.reset()
    await client.close()
    assert [kwargs for _, kwargs in ledger.ready_calls] == [{}]

    again = GenericEnvClient(provider=ledger.provider, transport=transport)
    await again.connect(timeout=300)
    await again.close()
    assert ledger.ready_calls[-1][1] == {"timeout_s": 300}


async def test_a_start_longer_than_the_call_timeout_is_not_cut_short(
        transport: MockTransport) -> None:
    """The provider's start runs outside the call's deadline, as in OpenEnv: a start
    slower than the call timeout still gives a connected client."""
    gate = asyncio.Event()
    loop = asyncio.get_running_loop()
    events: list[str] = []

    class SlowProvider:
        def start(self) -> str:
            asyncio.run_coroutine_threadsafe(gate.wait(), loop).result(timeout=20)
            events.append("start")
            return "http://127.0.0.1:8001"

        def wait_for_ready(self, timeout_s: float = 180.0) -> None:
            events.append(f"ready {timeout_s}")

        def stop(self) -> None:
            events.append("stop")

    client = GenericEnvClient(provider=SlowProvider(), transport=transport, timeout=0.05)
    reset = asyncio.ensure_future(client.reset())
    done, _ = await asyncio.wait({reset}, timeout=0.3)
    assert not done  # still starting, past the 0.05 s call timeout
    gate.set()
    await reset
    await client.close()
    assert events == ["start", "ready 180.0", "stop"]


async def test_keyword_only_parameters_count_in_the_needs_an_image_check(
        transport: MockTransport) -> None:
    class NeedsImage:
        def start_container(self, *, image: str) -> str:
            raise AssertionError("started without an image")

        def wait_for_ready(self, base_url: str) -> None: ...

        def stop_container(self) -> None: ...

    client = GenericEnvClient(provider=NeedsImage(), transport=transport)
    with pytest.raises(InvalidArgumentError, match="requires image") as caught:
        await client.connect()
    assert isinstance(caught.value, ValueError)
    assert not isinstance(caught.value, ProviderError)
    await client.close()


async def test_a_start_error_is_the_providers_own(ledger: ResourceLedger,
                                                  transport: MockTransport) -> None:
    error = OSError("no quota")
    ledger.start_error = error
    client = GenericEnvClient(provider=ledger.provider, transport=transport)
    with pytest.raises(OSError, match="no quota") as caught:
        await client.reset()
    assert caught.value is error
    assert ledger.events == [("start", 1), ("stop", 1)]
    await client.close()
    assert ledger.events == [("start", 1), ("stop", 1)]  # stopped: not tried again


def test_from_env_without_docker_passes_workers_through() -> None:
    started: list[dict[str, Any]] = []

    class Runtime:
        def start(self, **kwargs: Any) -> str:
            started.append(kwargs)
            return "http://127.0.0.1:8001"

        def wait_for_ready(self, timeout_s: float = 30.0) -> None: ...

        def stop(self) -> None: ...

    handle = GenericEnvClient.from_env("owner/space", use_docker=False, provider=Runtime(),
                                       port=8001, workers=4)
    client = handle._consume()
    client.provider.start()
    assert started == [{"port": 8001, "workers": 4}]


async def test_a_bootstrap_handle_is_an_async_context_manager(
        ledger: ResourceLedger, transport: MockTransport) -> None:
    container = hasattr(ledger.provider, "start_container")
    handle = GenericEnvClient.from_env("owner/space", provider=ledger.provider,
                                       use_docker=container)
    handle._build = _with_transport(handle._build, transport)  # type: ignore[method-assign]
    async with handle as env:
        assert (await env.reset()).observation == {"resource": 1}
    assert env.closed
    assert ledger.events == [("start", 1), ("ready", 1), ("stop", 1)]


def test_a_bootstrap_handle_is_a_context_manager(ledger: ResourceLedger,
                                                 transport: MockTransport) -> None:
    container = hasattr(ledger.provider, "start_container")
    handle = GenericEnvClient.from_env("owner/space", provider=ledger.provider,
                                       use_docker=container)
    handle._build = _with_transport(handle._build, transport)  # type: ignore[method-assign]
    with handle as env:
        assert env.reset().observation == {"resource": 1}
    assert ledger.events == [("start", 1), ("ready", 1), ("stop", 1)]
    with pytest.raises(RuntimeError, match="already"):
        handle.sync()
