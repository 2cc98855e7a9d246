"""Async iterators, async context managers and SyncProxy attribute wrapping."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from types import TracebackType
from typing import Any

import pytest

from envlink import Bridge, CallTimeoutError, SyncProxy

pytestmark = pytest.mark.timeout(20)


class Resource:
    """A fake async object with every kind of member the proxy handles."""

    label = "plain attribute"

    def __init__(self) -> None:
        self.entered = 0
        self.exited: list[type[BaseException] | None] = []
        self.gen_finally = threading.Event()
        self.loop_thread: int | None = None

    async def double(self, x: int) -> int:
        await asyncio.sleep(0)
        return 2 * x

    async def counter(self, n: int) -> AsyncIterator[int]:
        self.loop_thread = threading.get_ident()
        try:
            for i in range(n):
                await asyncio.sleep(0)
                yield i
        finally:
            self.gen_finally.set()

    async def stall(self) -> AsyncIterator[int]:
        yield 0
        await asyncio.Event().wait()
        yield 1  # pragma: no cover

    def sync_method(self) -> str:
        return "sync"

    async def __aenter__(self) -> Resource:
        self.entered += 1
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> bool:
        self.exited.append(exc_type)
        return exc_type is not None and issubclass(exc_type, LookupError)

    def __aiter__(self) -> AsyncIterator[int]:
        return self.counter(3)


# ---------------------------------------------------------------- iterate


def test_iterate_yields_all_items(bridge: Bridge) -> None:
    """Bridge.iterate yields every item of an async iterable, fetched on the loop thread."""
    res = Resource()
    assert list(bridge.iterate(lambda: res.counter(4), timeout=5)) == [0, 1, 2, 3]
    assert res.loop_thread == bridge.thread.ident  # type: ignore[union-attr]
    assert res.gen_finally.is_set()


def test_iterate_break_closes_the_async_iterator(bridge: Bridge) -> None:
    """Breaking out of the loop runs the async generator's finally (aclose on the loop)."""
    res = Resource()
    for item in bridge.iterate(lambda: res.counter(100), timeout=5):
        if item == 2:
            break
    assert res.gen_finally.is_set()


def test_iterate_exception_in_body_closes_the_async_iterator(bridge: Bridge) -> None:
    """An exception in the loop body also closes the async generator."""
    res = Resource()

    def consume() -> None:
        for _ in bridge.iterate(lambda: res.counter(100), timeout=5):
            raise ZeroDivisionError

    with pytest.raises(ZeroDivisionError):
        consume()
    assert res.gen_finally.is_set()


def test_iterate_closed_on_the_loop_thread_keeps_its_aclose_until_it_ends() -> None:
    """An iterator closed on the loop thread schedules aclose() there, and nothing else
    refers to that task: the collector does not destroy it while it waits, and the
    bridge's close still cancels it, the generator's cleanup run to its end."""
    reached = threading.Event()
    seen: list[str] = []

    async def gen() -> AsyncIterator[int]:
        try:
            yield 0
            yield 1  # pragma: no cover
        finally:
            reached.set()
            try:
                await asyncio.Event().wait()  # referenced only by the aclose task
            except asyncio.CancelledError:
                seen.append("cancelled")
                raise

    bridge = Bridge()
    held = [bridge.iterate(gen, timeout=5)]
    assert next(held[0]) == 0

    async def close_on_loop() -> None:
        held.pop().close()  # and no reference to it stays

    bridge.call(close_on_loop, timeout=5)
    assert reached.wait(5)
    gc.collect()
    bridge.close()
    assert seen == ["cancelled"]


def test_iterate_item_timeout(bridge: Bridge) -> None:
    """Each item is fetched under the timeout."""
    res = Resource()
    it = bridge.iterate(res.stall, timeout=0.1)
    assert next(it) == 0
    with pytest.raises(CallTimeoutError):
        next(it)


def test_iterate_is_lazy(bridge: Bridge) -> None:
    """Nothing runs on the loop until the first item is requested."""
    called = threading.Event()

    def factory() -> AsyncIterator[int]:
        called.set()
        return Resource().counter(1)

    it = bridge.iterate(factory, timeout=5)
    assert not called.is_set()
    assert bridge.thread is None
    assert list(it) == [0]
    assert called.is_set()


# ---------------------------------------------------------------- enter


def test_enter_bridges_an_async_context_manager(bridge: Bridge) -> None:
    """Bridge.enter runs __aenter__ and __aexit__ on the loop."""
    res = Resource()
    with bridge.enter(res, timeout=5) as value:
        assert value is res
        assert res.entered == 1
    assert res.exited == [None]


def test_enter_passes_the_exception_and_honours_suppression(bridge: Bridge) -> None:
    """The body's exception reaches __aexit__; its return value decides suppression."""
    res = Resource()
    with bridge.enter(res, timeout=5):
        raise KeyError("suppressed: KeyError is a LookupError")
    with pytest.raises(ValueError, match="kept"), bridge.enter(res, timeout=5):
        raise ValueError("kept")
    assert res.exited == [KeyError, ValueError]


def test_enter_asynccontextmanager_finally_runs(bridge: Bridge) -> None:
    """An @asynccontextmanager's cleanup runs, also when the body raises."""
    events: list[str] = []

    @asynccontextmanager
    async def managed() -> AsyncIterator[str]:
        events.append("enter")
        try:
            yield "value"
        finally:
            events.append("exit")

    def body() -> None:
        with bridge.enter(managed(), timeout=5) as value:
            assert value == "value"
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        body()
    assert events == ["enter", "exit"]


class StubbornEntry(Resource):
    """Finishes entering even when its entry is cancelled (a shielded setup)."""

    async def __aenter__(self) -> Resource:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.Event().wait()  # until the bridge's timeout cancels it
        return await super().__aenter__()


def test_enter_leaves_a_context_entered_after_its_caller_gave_up(bridge: Bridge) -> None:
    """__aenter__ finished on the loop after the caller's timeout: the caller gets the
    timeout, and the context is left again (no __exit__ follows a failed __enter__)."""
    res = StubbornEntry()
    with pytest.raises(CallTimeoutError), bridge.enter(res, timeout=0.05):
        raise AssertionError("entered")  # pragma: no cover
    assert res.entered == 1
    assert res.exited == [CallTimeoutError]


class LateEntry(Resource):
    """Ignores its entry's cancellation and finishes entering only when told, after the
    bridge's cancel grace has run out; says when it was left."""

    def __init__(self) -> None:
        super().__init__()
        self.cancelled = threading.Event()
        self.finish = threading.Event()
        self.left = threading.Event()

    async def __aenter__(self) -> Resource:
        try:
            await asyncio.Event().wait()  # until the bridge's timeout cancels it
        except asyncio.CancelledError:
            self.cancelled.set()
        await asyncio.get_running_loop().run_in_executor(None, self.finish.wait, 10)
        return await super().__aenter__()

    async def __aexit__(self, *exc: Any) -> bool:
        try:
            return await super().__aexit__(*exc)
        finally:
            self.left.set()


def test_enter_leaves_a_context_entered_after_the_cancel_grace() -> None:
    """__aenter__ finished on the loop only after the bridge's cancel grace, when the
    caller had already got its timeout: the bridge still leaves the context (entered
    once, exited once), on the loop."""
    bridge = Bridge(cancel_grace=0.01)
    try:
        res = LateEntry()
        with pytest.raises(CallTimeoutError), bridge.enter(res, timeout=0.05):
            raise AssertionError("entered")  # pragma: no cover
        assert res.cancelled.is_set() and res.entered == 0
        res.finish.set()
        assert res.left.wait(10)
        assert res.entered == 1
        assert res.exited == [CallTimeoutError]
    finally:
        bridge.close()


def test_enter_rejects_non_context_managers(bridge: Bridge) -> None:
    """enter() of something that is not an async context manager is a TypeError."""
    with pytest.raises(TypeError):
        bridge.enter(object(), timeout=5)


# ---------------------------------------------------------------- SyncProxy


def test_proxy_wraps_coroutine_methods(bridge: Bridge) -> None:
    """A coroutine method becomes a blocking method; timeout= is the bridge's."""
    proxy = SyncProxy(Resource(), bridge, timeout=5)
    assert proxy.double(21) == 42
    assert proxy.double(1, timeout=1) == 2


def test_proxy_caches_wrappers(bridge: Bridge) -> None:
    """The wrapper is built once per name and cached on the proxy (no more __getattr__)."""
    proxy = SyncProxy(Resource(), bridge, timeout=5)
    first = proxy.double
    assert "double" in vars(proxy)
    assert proxy.double is first
    assert first.__name__ == "double"
    assert first.__wrapped__ == proxy._envlink_target.double


def test_proxy_returns_other_attributes_as_is(bridge: Bridge) -> None:
    """Plain attributes and sync methods are returned unwrapped and not cached."""
    proxy = SyncProxy(Resource(), bridge)
    assert proxy.label == "plain attribute"
    assert proxy.sync_method() == "sync"
    assert "label" not in vars(proxy)
    with pytest.raises(AttributeError):
        _ = proxy.missing


def test_proxy_async_generator_method_becomes_iterator(bridge: Bridge) -> None:
    """An async-generator method becomes a blocking iterator; break closes it."""
    res = Resource()
    proxy = SyncProxy(res, bridge, timeout=5)
    assert list(proxy.counter(3)) == [0, 1, 2]
    res.gen_finally.clear()
    for _ in proxy.counter(10):
        break
    assert res.gen_finally.is_set()


def test_proxy_is_a_context_manager_and_iterable(bridge: Bridge) -> None:
    """`with proxy` bridges the object's async context manager (and returns the proxy when
    __aenter__ returns the object); iterating the proxy iterates its __aiter__."""
    res = Resource()
    proxy = SyncProxy(res, bridge, timeout=5)
    with proxy as entered:
        assert entered is proxy
    assert res.entered == 1
    assert res.exited == [None]
    assert list(proxy) == [0, 1, 2]


def test_proxy_dir_includes_target_members(bridge: Bridge) -> None:
    """dir(proxy) lists the wrapped object's members (for completion in a REPL)."""
    assert {"double", "counter", "label"} <= set(dir(SyncProxy(Resource(), bridge)))


def test_proxy_default_timeout_applies() -> None:
    """The proxy's default timeout bounds calls made without timeout=."""

    class Slow:
        async def hang(self) -> None:
            await asyncio.Event().wait()

    with Bridge() as b:
        proxy: Any = SyncProxy(Slow(), b, timeout=0.05)
        with pytest.raises(CallTimeoutError):
            proxy.hang()
