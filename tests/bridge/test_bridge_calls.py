"""Bridge.call: results, errors, context propagation, timeouts, re-entrancy, interrupts."""

from __future__ import annotations

import asyncio
import contextvars
import signal
import threading
import time
import traceback
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from opentelemetry import baggage, trace
from opentelemetry import context as otel_context

from envlink import Bridge, CallTimeoutError, ReentrantCallError, SyncProxy

from .._otel_support import Otel

pytestmark = pytest.mark.timeout(20)

request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")


async def echo(value: Any) -> Any:
    await asyncio.sleep(0)
    return value


async def read_request_id() -> str:
    await asyncio.sleep(0)
    return request_id.get()


def in_threads(n: int, fn: Callable[[int], Any]) -> list[Any]:
    """Run fn(i) in n fresh threads at once and return the results in order."""
    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(fn, range(n)))


# ---------------------------------------------------------------- results and errors


def test_call_returns_the_coroutine_result(bridge: Bridge) -> None:
    """A bridged call returns what the coroutine returned, args and kwargs passed through."""

    async def add(a: int, b: int, *, c: int = 0) -> int:
        return a + b + c

    assert bridge.call(add, 1, 2, c=3, timeout=5) == 6


def test_loop_thread_is_named_daemon_and_lazy(bridge: Bridge) -> None:
    """The loop thread starts on the first call, is a daemon, and is named envlink-bridge-*."""
    assert bridge.thread is None
    assert bridge.loop is None
    bridge.call(echo, 1, timeout=5)
    thread = bridge.thread
    assert thread is not None
    assert thread.daemon
    assert thread.is_alive()
    assert thread.name.startswith("envlink-bridge")


def test_coroutine_runs_on_the_loop_thread(bridge: Bridge) -> None:
    """The coroutine runs on the bridge's thread, not the caller's."""

    async def where() -> int:
        return threading.get_ident()

    assert bridge.call(where, timeout=5) == bridge.thread.ident  # type: ignore[union-attr]
    assert bridge.call(where, timeout=5) != threading.get_ident()


def test_exception_is_reraised_unchanged(bridge: Bridge) -> None:
    """The coroutine's exception object reaches the caller, with the coroutine's frames."""
    raised: list[BaseException] = []

    async def fail() -> None:
        err = KeyError("missing")
        raised.append(err)
        raise err

    with pytest.raises(KeyError) as info:
        bridge.call(fail, timeout=5)
    assert info.value is raised[0]
    frames = [f.name for f in traceback.extract_tb(info.value.__traceback__)]
    assert "fail" in frames
    assert "test_exception_is_reraised_unchanged" in frames
    assert info.value.__context__ is None


# ---------------------------------------------------------------- context propagation


def test_contextvar_propagates_from_main_thread(bridge: Bridge) -> None:
    """The caller's ContextVar value is visible inside the coroutine (main thread)."""
    token = request_id.set("main-42")
    try:
        assert bridge.call(read_request_id, timeout=5) == "main-42"
    finally:
        request_id.reset(token)


def test_contextvar_propagates_from_8_threads(bridge: Bridge) -> None:
    """Each of 8 threads sees its own ContextVar value inside its coroutines."""
    barrier = threading.Barrier(8)

    def worker(i: int) -> list[str]:
        request_id.set(f"thread-{i}")
        barrier.wait()
        return [bridge.call(read_request_id, timeout=5) for _ in range(20)]

    for i, seen in enumerate(in_threads(8, worker)):
        assert seen == [f"thread-{i}"] * 20


def test_coroutine_changes_do_not_leak_into_caller(bridge: Bridge) -> None:
    """The coroutine runs in a copy: its ContextVar writes do not reach the caller."""

    async def write() -> None:
        request_id.set("from-coroutine")

    bridge.call(write, timeout=5)
    assert request_id.get() == "-"


def test_otel_parent_span_and_baggage_from_main_thread(otel: Otel) -> None:
    """A span created in the coroutine is a child of the bridge span, itself a child of the
    caller's span; baggage crosses too."""
    tracer = otel.tracer_provider.get_tracer("test")

    async def work() -> str | None:
        with tracer.start_as_current_span("inner"):
            value = baggage.get_baggage("tenant")
            return None if value is None else str(value)

    token = otel_context.attach(baggage.set_baggage("tenant", "acme"))
    try:
        with tracer.start_as_current_span("outer") as outer:
            assert otel.bridge.call(work, timeout=5) == "acme"
    finally:
        otel_context.detach(token)
    spans = {s.name: s for s in otel.spans()}
    hop, inner = spans["envlink.bridge work"], spans["inner"]
    assert hop.parent is not None
    assert hop.parent.span_id == outer.get_span_context().span_id
    assert inner.parent is not None
    assert inner.parent.span_id == hop.context.span_id
    assert inner.context.trace_id == outer.get_span_context().trace_id


def test_otel_parent_span_from_8_threads(otel: Otel) -> None:
    """From 8 threads at once, each coroutine's span descends from its own caller's span."""
    tracer = otel.tracer_provider.get_tracer("test")
    barrier = threading.Barrier(8)

    async def work(i: int) -> int:
        with tracer.start_as_current_span(f"inner-{i}") as span:
            await asyncio.sleep(0)
            return span.get_span_context().span_id

    def worker(i: int) -> tuple[int, int]:
        barrier.wait()
        with tracer.start_as_current_span(f"outer-{i}") as outer:
            otel.bridge.call(work, i, timeout=5)
            return outer.get_span_context().span_id, outer.get_span_context().trace_id

    outers = in_threads(8, worker)
    spans = otel.spans()
    by_id = {s.context.span_id: s for s in spans}
    for i, (outer_id, trace_id) in enumerate(outers):
        inner = next(s for s in spans if s.name == f"inner-{i}")
        assert inner.parent is not None
        hop = by_id[inner.parent.span_id]
        assert hop.name == "envlink.bridge work"
        assert hop.parent is not None
        assert hop.parent.span_id == outer_id
        assert inner.context.trace_id == trace_id


def test_caller_span_is_direct_parent_without_bridge_telemetry(otel: Otel,
                                                              bridge: Bridge) -> None:
    """With the bridge on no-op providers, a span created in the coroutine is a direct child
    of the caller's span, from the main thread and from 8 threads."""
    tracer = otel.tracer_provider.get_tracer("test")

    async def work(i: int) -> None:
        with tracer.start_as_current_span(f"inner-{i}"):
            await asyncio.sleep(0)

    def caller(i: int) -> int:
        with tracer.start_as_current_span(f"outer-{i}") as outer:
            bridge.call(work, i, timeout=5)
            return outer.get_span_context().span_id

    outer_ids = [caller(0), *in_threads(8, lambda i: caller(i + 1))]
    spans = {s.name: s for s in otel.spans()}
    for i, outer_id in enumerate(outer_ids):
        parent = spans[f"inner-{i}"].parent
        assert parent is not None
        assert parent.span_id == outer_id


def test_no_sdk_still_propagates_caller_span(bridge: Bridge) -> None:
    """Without an SDK the bridge adds no span, and the caller's current span is still seen."""
    ctx = trace.SpanContext(trace_id=0xABC, span_id=0xDEF, is_remote=False,
                            trace_flags=trace.TraceFlags(1))

    async def current() -> int:
        return trace.get_current_span().get_span_context().span_id

    with trace.use_span(trace.NonRecordingSpan(ctx)):
        assert bridge.call(current, timeout=5) == 0xDEF


# ---------------------------------------------------------------- timeouts


def test_timeout_cancels_the_coroutine() -> None:
    """On timeout the coroutine observes CancelledError (and may clean up); the caller gets
    CallTimeoutError promptly."""
    cancelled = threading.Event()
    started = threading.Event()

    async def hang() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    with Bridge() as bridge:
        t0 = time.perf_counter()
        with pytest.raises(CallTimeoutError) as info:
            bridge.call(hang, timeout=0.2)
        elapsed = time.perf_counter() - t0
    assert started.is_set()
    assert cancelled.is_set()
    assert isinstance(info.value, TimeoutError)
    assert info.value.method == "hang"
    assert info.value.timeout == 0.2
    # Sanity bound only (the target is timeout + 50 ms; CI machines are noisy).
    assert elapsed < 0.2 + 1.0


def test_timeout_before_the_loop_starts_it() -> None:
    """A call that times out while the loop is busy never starts its coroutine."""
    release = threading.Event()
    ran = threading.Event()
    blocking = threading.Event()

    async def block_loop() -> None:
        blocking.set()
        release.wait(10)  # deliberately blocks the loop thread

    async def late() -> None:
        ran.set()

    with Bridge() as bridge, ThreadPoolExecutor(1) as pool:
        first = pool.submit(bridge.call, block_loop, timeout=10)
        assert blocking.wait(5)
        try:
            with pytest.raises(CallTimeoutError):
                bridge.call(late, timeout=0.05)
        finally:
            release.set()
        first.result(5)
        assert bridge.call(echo, "after", timeout=5) == "after"
    assert not ran.is_set()


def test_cleanup_error_during_cancel_is_the_cause() -> None:
    """If the coroutine fails while being cancelled, that error is the timeout's __cause__."""

    async def bad_cleanup() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            raise OSError("cleanup failed") from None

    with Bridge() as bridge, pytest.raises(CallTimeoutError) as info:
        bridge.call(bad_cleanup, timeout=0.05)
    assert isinstance(info.value.__cause__, OSError)


def test_cancel_grace_bounds_a_stubborn_cleanup() -> None:
    """A coroutine that ignores cancellation delays the timeout by at most cancel_grace."""
    release = threading.Event()

    async def stubborn() -> None:
        while not release.is_set():
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                continue

    with Bridge(cancel_grace=0.1) as bridge:
        try:
            with pytest.raises(CallTimeoutError):
                bridge.call(stubborn, timeout=0.05)
        finally:
            release.set()
        bridge.close()  # its task is cancelled again at close; release lets it end


def test_negative_timeout_is_rejected(bridge: Bridge) -> None:
    """A negative or NaN timeout is a ValueError, not an infinite wait."""
    for bad in (-1.0, float("nan")):
        with pytest.raises(ValueError, match="timeout"):
            bridge.call(echo, 1, timeout=bad)


def test_infinite_timeout_waits(bridge: Bridge) -> None:
    """timeout=None and timeout=inf both wait for the result."""
    assert bridge.call(echo, 1, timeout=None) == 1
    assert bridge.call(echo, 2, timeout=float("inf")) == 2


def test_keyboard_interrupt_cancels_the_coroutine() -> None:
    """Ctrl-C in the waiting (main) thread cancels the coroutine, then re-raises."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals are delivered to the main thread only")
    started = threading.Event()
    cancelled = threading.Event()

    async def hang() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    main_ident = threading.get_ident()

    def interrupt() -> None:
        if started.wait(5):
            signal.pthread_kill(main_ident, signal.SIGINT)

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    killer = threading.Thread(target=interrupt)
    try:
        with Bridge() as bridge:
            killer.start()
            with pytest.raises(KeyboardInterrupt):
                bridge.call(hang, timeout=10)
            assert cancelled.wait(5)
    finally:
        killer.join(5)
        signal.signal(signal.SIGINT, previous)


# ---------------------------------------------------------------- no deadlocks


def test_reentrant_call_raises_instead_of_hanging(bridge: Bridge) -> None:
    """A blocking call from the bridge's own loop thread raises ReentrantCallError at once."""

    async def reenter() -> None:
        bridge.call(echo, 1, timeout=5)

    with pytest.raises(ReentrantCallError):
        bridge.call(reenter, timeout=5)
    assert bridge.call(echo, "still works", timeout=5) == "still works"


def test_foreign_loop_warns_once_per_bridge() -> None:
    """A call from a thread running another loop works, with one RuntimeWarning per bridge."""

    async def jupyter_cell(b: Bridge) -> list[Any]:
        return [b.call(echo, i, timeout=5) for i in range(3)]

    for _ in range(2):
        with Bridge() as b, warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert asyncio.run(jupyter_cell(b)) == [0, 1, 2]
        assert [w.category for w in caught] == [RuntimeWarning]
        assert "event loop" in str(caught[0].message)


def test_foreign_loop_allow_is_silent() -> None:
    """on_foreign_loop='allow' calls from a foreign loop without warning."""

    async def cell(b: Bridge) -> Any:
        return b.call(echo, "ok", timeout=5)

    with Bridge(on_foreign_loop="allow") as b, warnings.catch_warnings():
        warnings.simplefilter("error")
        assert asyncio.run(cell(b)) == "ok"


def test_foreign_loop_raise_refuses() -> None:
    """on_foreign_loop='raise' refuses a call from a thread running a loop."""

    async def cell(b: Bridge) -> Any:
        return b.call(echo, "no", timeout=5)

    with Bridge(on_foreign_loop="raise") as b, pytest.raises(ReentrantCallError):
        asyncio.run(cell(b))


def test_bad_foreign_loop_policy_is_rejected() -> None:
    """An unknown on_foreign_loop value is a ValueError."""
    with pytest.raises(ValueError, match="on_foreign_loop"):
        Bridge(on_foreign_loop="ignore")  # type: ignore[arg-type]


# ---------------------------------------------------------------- concurrency


class Echo:
    async def echo(self, value: Any) -> Any:
        await asyncio.sleep(0)
        return value


def test_8_threads_x_500_calls_on_one_proxy(bridge: Bridge) -> None:
    """8 threads x 500 calls through one SyncProxy: no wrong answer, no error."""
    proxy = SyncProxy(Echo(), bridge, timeout=10)
    barrier = threading.Barrier(8)

    def worker(i: int) -> tuple[int, int]:
        barrier.wait()
        wrong = errors = 0
        for n in range(500):
            value = (i, n)
            try:
                if proxy.echo(value) != value:
                    wrong += 1
            except Exception:
                errors += 1
        return wrong, errors

    assert in_threads(8, worker) == [(0, 0)] * 8


def test_timeout_before_the_job_starts_skips_the_cancel_grace() -> None:
    """A call that times out before its coroutine ever ran returns without the grace wait."""
    import threading
    import time

    started, timed_out = threading.Event(), threading.Event()

    async def hold_the_loop() -> None:
        # Blocks the loop itself (on purpose) until the call below has timed out (at
        # most 1 s): that call's job is still unstarted when it times out, however late
        # this thread runs and whatever order the loop takes its wake-ups in.
        started.set()
        timed_out.wait(1.0)

    with Bridge(cancel_grace=3.0) as b:
        b.call(echo, 1, timeout=5)  # the loop is running
        holder = threading.Thread(target=b.call, args=(hold_the_loop,), kwargs={"timeout": 5})
        holder.start()
        assert started.wait(5)
        start = time.perf_counter()
        with pytest.raises(CallTimeoutError):
            b.call(echo, 2, timeout=0.05)
        timed_out.set()
        assert time.perf_counter() - start < 2.0  # not the 3 s cancel grace
        holder.join(5)


def test_arguments_named_like_bridge_keywords_reach_the_target(bridge: Bridge) -> None:
    """A target method with a `method` parameter gets it; it does not collide with the bridge's."""

    class Http:
        async def request(self, method: str, url: str) -> str:
            return f"{method} {url}"

    proxy = SyncProxy(Http(), bridge, timeout=5)
    assert proxy.request(method="GET", url="/x") == "GET /x"
    assert proxy.request("PUT", "/y") == "PUT /y"
