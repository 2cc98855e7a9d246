"""SyncEnvClient against a fake async client: methods, timeouts, lifecycle, shared bridges."""

from __future__ import annotations

import asyncio
import contextvars
import threading
from typing import Any

import pytest

from envlink import (
    UNSET,
    Bridge,
    CallTimeoutError,
    ClientClosedError,
    EnvClient,
    ReentrantCallError,
    SyncEnvClient,
    default_bridge,
)
from envlink._sync.sync_client import TIMEOUT_MARGIN

from .conftest import SpyBridge, envlink_threads

pytestmark = pytest.mark.timeout(20)

trace_tag: contextvars.ContextVar[str] = contextvars.ContextVar("trace_tag", default="-")


class FakeTimeouts:
    connect = 1.0
    call = 2.0
    close = 0.5


class FakeClient:
    """Shaped like envlink.EnvClient: coroutine methods with a keyword ``timeout``."""

    call_deadline = EnvClient.call_deadline  # the real mapping, on these timeouts

    def __init__(self) -> None:
        self.timeouts = FakeTimeouts()
        self.tracer_provider = None
        self.meter_provider = None
        self.calls: list[tuple[str, Any, Any]] = []
        self.closed = False
        self.loop_threads: set[int] = set()

    def _record(self, method: str, timeout: Any, payload: Any = None) -> None:
        if self.closed:
            raise ClientClosedError("client closed")
        self.loop_threads.add(threading.get_ident())
        self.calls.append((method, timeout, payload))

    async def connect(self, *, timeout: Any = UNSET) -> FakeClient:
        self._record("connect", timeout)
        return self

    async def reset(self, *, timeout: Any = UNSET, **kwargs: Any) -> dict[str, Any]:
        self._record("reset", timeout, kwargs)
        return {"observation": "reset", "kwargs": kwargs, "tag": trace_tag.get()}

    async def step(self, action: Any, *, timeout: Any = UNSET, **kwargs: Any) -> dict[str, Any]:
        self._record("step", timeout, action)
        await asyncio.sleep(0)
        return {"observation": action}

    async def state(self, *, timeout: Any = UNSET) -> dict[str, Any]:
        self._record("state", timeout)
        return {"step_count": sum(1 for c in self.calls if c[0] == "step")}

    async def disconnect(self, *, timeout: Any = UNSET) -> None:
        self._record("disconnect", timeout)

    async def close(self, *, timeout: Any = UNSET) -> None:
        if not self.closed:
            self._record("close", timeout)
            self.closed = True

    async def list_tools(self, *, timeout: Any = UNSET) -> list[str]:
        self._record("list_tools", timeout)
        return ["echo"]

    async def ping(self, payload: str) -> str:
        return payload

    def sync(self, bridge: Bridge | None = None, *,
             nested_spans: bool = False) -> SyncEnvClient[Any, Any, Any]:
        return SyncEnvClient(self, bridge=bridge,  # type: ignore[arg-type]
                             nested_spans=nested_spans)


class DuckClient:
    """The minimal duck type: methods without a ``timeout`` parameter of their own."""

    timeouts = FakeTimeouts()
    call_deadline = EnvClient.call_deadline

    def __init__(self) -> None:
        self.kwargs: list[dict[str, Any]] = []

    async def reset(self, **kwargs: Any) -> dict[str, Any]:
        self.kwargs.append(kwargs)
        return kwargs

    async def close(self) -> None:
        pass


def test_explicit_methods_forward_and_return() -> None:
    """connect/reset/step/state/disconnect run the client's coroutines on the bridge thread."""
    fake = FakeClient()
    env = fake.sync()
    try:
        assert env.connect() is env
        assert env.reset(seed=7)["kwargs"] == {"seed": 7}
        assert env.step({"message": "hi"}) == {"observation": {"message": "hi"}}
        assert env.state() == {"step_count": 1}
        env.disconnect()
        assert [c[0] for c in fake.calls] == ["connect", "reset", "step", "state", "disconnect"]
        assert fake.loop_threads == {env.bridge.thread.ident}  # type: ignore[union-attr]
    finally:
        env.close()


def test_default_waits_exceed_the_clients_deadlines() -> None:
    """Without timeout=, nothing is forwarded and the bridge waits the client's deadline for
    that method plus the margin, so the client's own timeout fires first."""
    fake, spy = FakeClient(), SpyBridge()
    try:
        env = fake.sync(bridge=spy)
        env.connect()
        env.reset()
        env.step("a")
        env.state()
        env.disconnect()
        env.close()
        m = TIMEOUT_MARGIN
        assert spy.waits == [("connect", 2.0 + m), ("reset", 2.0 + m), ("step", 2.0 + m),
                             ("state", 2.0 + m), ("disconnect", 0.5 + m), ("close", 1.0 + m)]
        assert all(timeout is UNSET for _, timeout, _ in fake.calls)
    finally:
        spy.close()


def test_explicit_timeout_is_forwarded_to_the_client() -> None:
    """timeout= is passed on to a client method that takes one; the bridge waits a margin
    longer; timeout=None means no limit on either side."""
    fake, spy = FakeClient(), SpyBridge()
    try:
        env = fake.sync(bridge=spy)
        env.reset(timeout=3.0, seed=1)
        env.step("a", timeout=None)
        assert fake.calls == [("reset", 3.0, {"seed": 1}), ("step", None, "a")]
        assert spy.waits == [("reset", 3.0 + TIMEOUT_MARGIN), ("step", None)]
    finally:
        spy.close()


def test_timeout_is_popped_for_a_client_without_one() -> None:
    """For a method without its own timeout parameter, timeout= only bounds the bridge wait."""
    duck, spy = DuckClient(), SpyBridge()
    try:
        env: Any = SyncEnvClient(duck, bridge=spy)  # type: ignore[arg-type]
        assert env.reset(timeout=3.0, seed=1) == {"seed": 1}
        assert duck.kwargs == [{"seed": 1}]
        assert spy.waits == [("reset", 3.0)]
    finally:
        spy.close()


def test_context_manager_connects_and_closes_owned_bridge() -> None:
    """`with client.sync(nested_spans=True) as env` (a facade that owns its bridge) connects
    on entry; exit closes the client and the owned bridge: no envlink thread is left."""
    before = envlink_threads()
    fake = FakeClient()
    with fake.sync(nested_spans=True) as env:
        assert fake.calls[0][0] == "connect"
        env.reset()
        bridge = env.bridge
        assert bridge is not default_bridge()
    assert fake.closed
    assert bridge.closed
    assert envlink_threads() - before == set()
    with pytest.raises(ClientClosedError):
        env.reset()


def test_context_manager_on_the_default_bridge_ends_its_thread_with_the_last_facade() -> None:
    """`with client.sync() as env` runs on the process-wide default bridge: its one thread
    serves every open facade, ends when the last one closes, and starts again after."""
    before = set(threading.enumerate())
    fake, other = FakeClient(), FakeClient()
    with fake.sync() as env, other.sync() as env2:
        env.reset()
        env2.step(1)
        assert env.bridge is env2.bridge is default_bridge()
        thread = default_bridge().thread
        assert thread is not None
    assert fake.closed and other.closed
    assert fake.loop_threads == other.loop_threads == {thread.ident}
    thread.join(timeout=10)
    assert not thread.is_alive()
    fake.closed = False  # an EnvClient opens again on its next call
    env.reset()  # ... and its closed facade leases the default bridge again
    assert env.bridge is default_bridge() and env.bridge.thread is not thread
    env.close()
    third = FakeClient()
    with third.sync() as env3:
        env3.step(2)
        assert env3.bridge is default_bridge() and env3.bridge is not env.bridge
        assert env3.bridge.thread is not None and env3.bridge.thread is not thread
    assert third.loop_threads and not any(
        t.name.startswith("envlink") for t in threading.enumerate() if t not in before)


def test_close_is_idempotent() -> None:
    """close() twice closes the client once."""
    fake = FakeClient()
    env = fake.sync()
    env.reset()
    env.close()
    env.close()
    assert [c[0] for c in fake.calls].count("close") == 1


def test_shared_bridge_outlives_its_clients() -> None:
    """Clients sharing a bridge share its one thread; closing a client leaves the bridge."""
    with Bridge() as shared:
        clients = [FakeClient() for _ in range(20)]
        envs = [c.sync(bridge=shared) for c in clients]
        for i, env in enumerate(envs):
            env.step(i)
        threads = set().union(*(c.loop_threads for c in clients))
        assert threads == {shared.thread.ident}  # type: ignore[union-attr]
        for env in envs:
            env.close()
        assert all(c.closed for c in clients)
        assert not shared.closed
        assert shared.thread.is_alive()


def test_close_with_a_closed_shared_bridge_is_quiet() -> None:
    """Closing a facade whose shared bridge is already closed does not raise."""
    shared = Bridge()
    env = FakeClient().sync(bridge=shared)
    env.reset()
    shared.close()
    env.close()


def test_getattr_bridges_other_coroutine_methods() -> None:
    """Other coroutine methods are available in blocking form, cached, with timeout= handling."""
    fake, spy = FakeClient(), SpyBridge()
    try:
        env: Any = fake.sync(bridge=spy)
        assert env.list_tools() == ["echo"]
        assert env.list_tools is env.list_tools
        env.list_tools(timeout=1.0)
        assert env.ping("x") == "x"
        assert fake.calls[-1] == ("list_tools", 1.0, None)
        assert spy.waits == [("list_tools", 2.0 + TIMEOUT_MARGIN),
                             ("list_tools", 1.0 + TIMEOUT_MARGIN), ("ping", 2.0 + TIMEOUT_MARGIN)]
        assert env.timeouts is fake.timeouts  # plain attributes pass through
    finally:
        spy.close()


def test_async_client_property() -> None:
    """.async_client is the wrapped client."""
    fake = FakeClient()
    env = fake.sync()
    try:
        assert env.async_client is fake
    finally:
        env.close()


def test_caller_context_reaches_the_client() -> None:
    """The caller's ContextVars are visible inside the async client's call."""
    env = FakeClient().sync()
    try:
        trace_tag.set("req-9")
        assert env.reset()["tag"] == "req-9"
    finally:
        env.close()


def test_200_facades_leave_no_thread_alive() -> None:
    """200 facades with their own bridges, used and closed: no envlink thread left."""
    before = envlink_threads()
    for i in range(200):
        env = FakeClient().sync()
        assert env.step(i) == {"observation": i}
        env.close()
    assert envlink_threads() - before == set()


class SlowClosingClient(FakeClient):
    """A fake whose close() takes a while and says when it has begun."""

    def __init__(self) -> None:
        super().__init__()
        self.closing = threading.Event()

    async def close(self, *, timeout: Any = UNSET) -> None:
        self.closing.set()
        await asyncio.sleep(0.2)
        self.closed = True


def test_a_concurrent_second_close_waits_for_the_first() -> None:
    """close() from two threads at once: both return only when the thread is gone."""
    before = envlink_threads()
    client = SlowClosingClient()
    env = SyncEnvClient(client)  # type: ignore[arg-type]
    env.step(1)
    first = threading.Thread(target=env.close)
    first.start()
    assert client.closing.wait(5)
    env.close()  # the second caller
    assert client.closed
    assert envlink_threads() - before == set()
    first.join(5)


class HeldClosingClient(FakeClient):
    """A fake whose close() waits until the test lets it finish."""

    def __init__(self) -> None:
        super().__init__()
        self.closing = threading.Event()
        self.finish = threading.Event()

    async def close(self, *, timeout: Any = UNSET) -> None:
        self.closing.set()
        await asyncio.to_thread(self.finish.wait, 10)
        self.closed = True


def test_a_second_close_waits_no_longer_than_its_close_deadline() -> None:
    """A second close() waits for the first only as long as a close may take (its own
    timeout= doubled, as the client's close deadline is, plus the margin), then raises
    CallTimeoutError; the first close still finishes."""
    client = HeldClosingClient()
    env = SyncEnvClient(client, timeout_margin=0.05)  # type: ignore[arg-type]
    env.step(1)
    first = threading.Thread(target=env.close)
    first.start()
    try:
        assert client.closing.wait(5)
        with pytest.raises(CallTimeoutError) as caught:
            env.close(timeout=0.05)  # the second caller: 2 * 0.05 + 0.05 s
        assert caught.value.method == "close"
        assert caught.value.timeout == pytest.approx(0.15)
        assert not client.closed
    finally:
        client.finish.set()
        first.join(5)
    assert client.closed
    env.close()  # once the first has finished, a later close returns at once


def test_close_from_the_loop_thread_raises_and_leaves_close_possible() -> None:
    """close() on the loop thread raises ReentrantCallError; a later close() still closes."""
    client = FakeClient()
    env = SyncEnvClient(client)  # type: ignore[arg-type]
    env.step(1)

    async def close_from_loop() -> BaseException | None:
        try:
            env.close()
        except ReentrantCallError as exc:
            return exc
        return None

    assert isinstance(env.bridge.call(close_from_loop, timeout=5), ReentrantCallError)
    env.close()
    assert client.closed


def test_the_client_names_each_calls_deadline() -> None:
    """EnvClient.call_deadline: connect and protocol calls take the call deadline, disconnect
    the close deadline, close twice that (it waits for the call in flight first); an explicit
    timeout replaces the default, None means no limit."""
    from envlink import GenericEnvClient, Timeout

    client = GenericEnvClient(base_url="ws://127.0.0.1:9", timeout=Timeout(3.0, close=0.25))
    assert [client.call_deadline(m) for m in ("connect", "reset", "step", "state", "ping")] \
        == [3.0] * 5
    assert client.call_deadline("disconnect") == 0.25
    assert client.call_deadline("close") == 0.5
    assert client.call_deadline("step", 7.0) == 7.0
    assert client.call_deadline("close", 1.0) == 2.0
    assert client.call_deadline("step", None) is None
    assert client.call_deadline("close", None) is None
