"""The sync bridge: run coroutines of any async object from blocking code.

A :class:`Bridge` owns one asyncio event loop running in a named daemon thread
(``envlink-bridge...``), started on first use. Any number of async objects (and
thousands of sessions) can share one bridge. Every bridged call

* runs in a *copy of the caller's* :mod:`contextvars` context, so the caller's
  OpenTelemetry span and baggage, and structlog context variables, are the
  context of the coroutine on the loop thread;
* is wrapped in an INTERNAL span ``envlink.bridge <method>`` started in the
  caller's thread (so it is the parent of whatever the coroutine creates) and
  recorded in the ``envlink.bridge.wait.duration`` and
  ``envlink.bridge.call.duration`` histograms;
* has a ``timeout``: on expiry the coroutine is cancelled on the loop, the
  bridge waits up to ``cancel_grace`` seconds for its cleanup, then raises
  :class:`~envlink.CallTimeoutError`;
* refuses to deadlock: a call from the bridge's own loop thread raises
  :class:`~envlink.ReentrantCallError` at once.

:class:`SyncProxy` is a generic blocking view of an async object built on a
bridge: its coroutine methods become blocking methods, its async-generator
methods become iterators, and an async context manager becomes a context
manager.

The bridge knows nothing about environments; :mod:`envlink._sync` builds the
environment client's sync facade on it.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import contextvars
import functools
import inspect
import itertools
import logging
import math
import os
import sys
import threading
import time
import warnings
import weakref
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any, Generic, Literal, TypeVar, cast

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.metrics import MeterProvider
from opentelemetry.trace import INVALID_SPAN, SpanKind, TracerProvider

from envlink._config import check_timeout
from envlink._errors import CallTimeoutError, ClientClosedError, ReentrantCallError
from envlink._telemetry import (
    ATTR_BRIDGE_QUEUE_WAIT,
    ATTR_BRIDGE_RUN_TIME,
    ATTR_ERROR_TYPE,
    ATTR_OUTCOME,
    ATTR_RPC_METHOD,
    Telemetry,
    error_type_of,
    get_telemetry,
    mark_error,
)
from envlink._timeouts import bounded

__all__ = [
    "OUTCOME_CANCELLED",
    "OUTCOME_ERROR",
    "OUTCOME_OK",
    "OUTCOME_TIMEOUT",
    "Bridge",
    "ForeignLoopPolicy",
    "SyncProxy",
]

T = TypeVar("T")
ObjT = TypeVar("ObjT")

ForeignLoopPolicy = Literal["allow", "warn", "raise"]

#: Values of the ``envlink.outcome`` attribute on the bridge histograms.
OUTCOME_OK = "ok"
OUTCOME_ERROR = "error"
OUTCOME_TIMEOUT = "timeout"
OUTCOME_CANCELLED = "cancelled"

_log = logging.getLogger("envlink.bridge")

_perf = time.perf_counter
_get_running_loop = asyncio._get_running_loop
_copy_context = contextvars.copy_context
_INTERNAL = SpanKind.INTERNAL
# ``lock.acquire(timeout=...)`` rejects values above this; larger means "forever".
_TIMEOUT_MAX = threading.TIMEOUT_MAX
_thread_ids = itertools.count(1)


class _MethodInfo:
    """Per-method constants, built once so that the hot path allocates nothing."""

    __slots__ = ("attrs", "error_attrs", "method", "span_name")

    def __init__(self, method: str) -> None:
        self.method = method
        self.span_name = f"envlink.bridge {method}"
        self.attrs = {
            outcome: {ATTR_RPC_METHOD: method, ATTR_OUTCOME: outcome}
            for outcome in (OUTCOME_OK, OUTCOME_ERROR, OUTCOME_TIMEOUT, OUTCOME_CANCELLED)
        }
        self.error_attrs: dict[tuple[str, str], dict[str, str]] = {}

    def attributes(self, outcome: str, error_type: str | None) -> dict[str, str]:
        if error_type is None:
            return self.attrs[outcome]
        key = (outcome, error_type)
        attrs = self.error_attrs.get(key)
        if attrs is None:
            attrs = {ATTR_RPC_METHOD: self.method, ATTR_OUTCOME: outcome,
                     ATTR_ERROR_TYPE: error_type}
            if len(self.error_attrs) < 256:  # bounded: error types are a small set
                self.error_attrs[key] = attrs
        return attrs


_method_infos: dict[str, _MethodInfo] = {}


def _method_info(method: str) -> _MethodInfo:
    info = _method_infos.get(method)
    if info is None:
        info = _MethodInfo(method)
        if len(_method_infos) < 4096:  # method names come from code; guard anyway
            _method_infos[method] = info
    return info


class _Job:
    """One bridged call. Written by the loop thread, read by the caller after wake-up."""

    __slots__ = (
        "args", "cancel_requested", "cancel_sent", "ctx", "done", "ended", "exc", "fn", "kwargs",
        "result", "started", "submitted", "task", "waiter",
    )

    def __init__(self, fn: Callable[..., Awaitable[Any]], args: tuple[Any, ...],
                 kwargs: dict[str, Any], ctx: contextvars.Context) -> None:
        self.fn = fn
        self.args = args
        self.kwargs = kwargs
        self.ctx = ctx
        # The caller holds this lock; the loop thread (or close()) releases it to wake
        # the caller. Cheaper than a Future + Condition, which is where the speed-up over
        # run_coroutine_threadsafe comes from.
        self.waiter = threading.Lock()
        self.waiter.acquire()
        self.task: asyncio.Task[None] | None = None
        self.done = False
        self.cancel_requested = False  # set on the loop thread
        self.cancel_sent = False  # set in the caller's thread
        self.result: Any = None
        self.exc: BaseException | None = None
        self.submitted = 0.0
        self.started = 0.0
        self.ended = 0.0

    def wake(self) -> None:
        # RuntimeError: already released by close(), the caller is awake.
        with contextlib.suppress(RuntimeError):
            self.waiter.release()


async def _run_job(job: _Job) -> None:
    """Runs on the loop, as a task in the caller's copied context."""
    job.started = _perf()
    try:
        job.result = await job.fn(*job.args, **job.kwargs)
    except BaseException as exc:  # handed to the caller; never kills the loop thread
        job.exc = exc
    finally:
        job.ended = _perf()
        job.done = True
        job.wake()


def _start_job(bridge: Bridge, job: _Job) -> None:
    """Runs on the loop thread: turn a submitted job into a task."""
    if job.cancel_requested or bridge._closed:
        # Timed out, interrupted or closed before the loop got to it: never start it.
        if not job.cancel_requested:
            job.exc = ClientClosedError("the bridge was closed before the call started")
        job.done = True
        job.wake()
        return
    job.task = _create_task(cast(asyncio.AbstractEventLoop, bridge._loop), job)


if sys.version_info >= (3, 11):
    def _create_task(loop: asyncio.AbstractEventLoop, job: _Job) -> asyncio.Task[None]:
        return loop.create_task(_run_job(job), context=job.ctx)
else:  # pragma: no cover - Python 3.10
    # Before 3.11 a task copies the context current at its creation.
    def _create_task(loop: asyncio.AbstractEventLoop, job: _Job) -> asyncio.Task[None]:
        return job.ctx.run(loop.create_task, _run_job(job))


def _cancel_job(job: _Job) -> None:
    """Runs on the loop thread: cancel a job whose caller stopped waiting."""
    if job.done:
        return
    job.cancel_requested = True
    if job.task is not None:
        job.task.cancel()
        if not job.started:
            # Cancelled before its first step: the coroutine never runs, so _run_job's
            # finally will not wake the caller. Do it here, sparing it the grace wait.
            job.done = True
            job.wake()


def _loop_main(loop: asyncio.AbstractEventLoop, ready: threading.Event,
               cancel_grace: float) -> None:
    """Body of the loop thread. Holds no reference to the Bridge, so it can be collected."""
    asyncio.set_event_loop(loop)
    loop.call_soon(ready.set)
    try:
        loop.run_forever()
    finally:
        try:
            _shutdown_loop(loop, cancel_grace)
        except Exception:  # pragma: no cover - defensive: the thread must end
            _log.exception("envlink bridge: error while shutting down the event loop")
        finally:
            asyncio.set_event_loop(None)
            loop.close()


def _shutdown_loop(loop: asyncio.AbstractEventLoop, grace: float) -> None:
    """Cancel leftover tasks and wait for them at most ``grace`` seconds in all."""
    deadline = time.monotonic() + grace
    cancelled: set[asyncio.Task[Any]] = set()
    while True:
        tasks = asyncio.all_tasks(loop)
        remaining = deadline - time.monotonic()
        if not tasks or remaining <= 0:
            break
        for task in tasks - cancelled:
            task.cancel()
        cancelled |= tasks
        loop.run_until_complete(asyncio.wait(tasks, timeout=remaining))
    if tasks:
        _log.warning("envlink bridge: %d task(s) ignored cancellation at close", len(tasks))
        return
    # A floor, so that a grace used up by the tasks does not fail these quick steps.
    remaining = max(deadline - time.monotonic(), 0.1)
    loop.run_until_complete(_bounded(loop.shutdown_asyncgens(), remaining))
    loop.run_until_complete(_bounded(loop.shutdown_default_executor(), remaining))


async def _bounded(aw: Awaitable[None], timeout: float) -> None:
    try:
        async with bounded(timeout):
            await aw
    except Exception:
        _log.warning("envlink bridge: loop cleanup did not finish in time", exc_info=True)


class Bridge:
    """An event loop in a daemon thread that runs coroutines for blocking callers.

    The thread starts lazily, on the first call. A bridge can be shared by any
    number of objects and threads. Use it as a context manager, or call
    :meth:`close`; an ``atexit`` hook closes bridges the program forgot. After
    ``os.fork()`` the child's first call starts a fresh loop thread; the parent's
    loop is never touched.

    Args:
        name: prefix of the loop thread's name (a counter is appended).
        on_foreign_loop: what to do when a call comes from a thread that runs
            another event loop (a Jupyter cell, a coroutine calling sync code): the
            call works but blocks that loop. ``"warn"`` (default) emits one
            :class:`RuntimeWarning` per bridge, ``"allow"`` is silent, ``"raise"``
            raises :class:`~envlink.ReentrantCallError`.
        cancel_grace: seconds to wait for a cancelled coroutine to finish its
            cleanup (after a timeout, an interrupt, or at close).
        join_timeout: seconds :meth:`close` waits for the loop thread to end.
        tracer_provider: OpenTelemetry tracer provider (default: the global one).
        meter_provider: OpenTelemetry meter provider (default: the global one).

    Raises:
        ValueError: for an unknown ``on_foreign_loop`` or a negative duration.
    """

    def __init__(
        self,
        *,
        name: str = "envlink-bridge",
        on_foreign_loop: ForeignLoopPolicy = "warn",
        cancel_grace: float = 1.0,
        join_timeout: float = 5.0,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
    ) -> None:
        if on_foreign_loop not in ("allow", "warn", "raise"):
            raise ValueError(f"on_foreign_loop must be allow, warn or raise, "
                             f"not {on_foreign_loop!r}")
        grace = check_timeout(cancel_grace, "cancel_grace", allow_zero=True)
        join = check_timeout(join_timeout, "join_timeout", allow_zero=True)
        if grace is None or join is None:
            raise TypeError("cancel_grace and join_timeout must be numbers of seconds, not None")
        self._name = name
        self._on_foreign_loop = on_foreign_loop
        self._cancel_grace = grace
        self._join_timeout = join
        self._tel: Telemetry = get_telemetry(tracer_provider, meter_provider)
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._thread_ident: int | None = None
        self._closed = False
        self._warned_foreign = False
        # Jobs whose callers are blocked, so that close() can wake them. Set
        # add/discard/copy are atomic under the GIL.
        self._pending: set[_Job] = set()
        _live_bridges.add(self)

    # ------------------------------------------------------------------ properties

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    @property
    def thread(self) -> threading.Thread | None:
        """The loop thread, or ``None`` before the first call (and after a fork)."""
        return self._thread

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The bridge's event loop, or ``None`` before the first call."""
        return self._loop

    # ------------------------------------------------------------------ lifecycle

    def _ensure_started(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._closed:
                raise ClientClosedError("the bridge is closed")
            loop = self._loop
            if loop is not None:
                return loop
            loop = asyncio.new_event_loop()
            ready = threading.Event()
            thread = threading.Thread(
                target=_loop_main, args=(loop, ready, self._cancel_grace),
                name=f"{self._name}-{next(_thread_ids)}", daemon=True,
            )
            thread.start()
            # The loop must run before anyone submits to it, else a call could be
            # queued on a loop whose thread failed to start.
            if not ready.wait(max(self._join_timeout, 5.0)):  # pragma: no cover
                loop.call_soon_threadsafe(loop.stop)
                raise RuntimeError("the envlink bridge's loop thread did not start")
            self._thread = thread
            self._thread_ident = thread.ident
            self._loop = loop
            return loop

    def close(self, timeout: float | None = None) -> None:
        """Close the bridge; idempotent.

        Callers still waiting get :class:`~envlink.ClientClosedError`, leftover
        tasks are cancelled and given ``cancel_grace`` seconds to clean up, then the
        loop stops and its thread is joined. Called from the loop thread itself, it
        stops the loop without joining.

        Args:
            timeout: seconds to wait for the thread to end (default: ``join_timeout``).
        """
        timeout = check_timeout(timeout, allow_zero=True)
        with self._lock:
            if self._closed:
                return
            self._closed = True
            loop, thread = self._loop, self._thread
        for job in self._pending.copy():
            job.wake()
        if loop is None or thread is None:
            return
        try:
            loop.call_soon_threadsafe(loop.stop)
        except RuntimeError:  # the loop is already closed
            return
        if threading.get_ident() == self._thread_ident:
            return
        thread.join(self._join_timeout if timeout is None else timeout)
        if thread.is_alive():
            _log.warning("envlink bridge: loop thread %s did not end in time", thread.name)

    def __enter__(self) -> Bridge:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def __del__(self) -> None:
        # Best effort only: stop the loop so the daemon thread ends; never join here
        # (the collector may run on the loop thread itself).
        try:
            if not self._closed and self._loop is not None:
                self._closed = True
                self._loop.call_soon_threadsafe(self._loop.stop)
        except Exception:
            pass

    def _after_fork_in_child(self) -> None:
        # The parent's loop and thread do not exist for the child: keep references
        # (never close or use them, their fds are shared with the parent) and start
        # afresh on the next call.
        if self._loop is not None:
            _abandoned.append(self._loop)
        self._lock = threading.Lock()
        self._loop = None
        self._thread = None
        self._thread_ident = None
        self._pending = set()

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("running" if self._loop else "idle")
        return f"<Bridge {self._name!r} {state}>"

    # ------------------------------------------------------------------ calls

    def on_loop_thread(self) -> bool:
        """Whether the calling thread is this bridge's event-loop thread."""
        return self._thread_ident is not None and threading.get_ident() == self._thread_ident

    def _check_running_loop(self, running: asyncio.AbstractEventLoop) -> None:
        if running is self._loop:
            raise ReentrantCallError(
                "blocking bridged call from the bridge's own event-loop thread would "
                "deadlock; await the coroutine instead"
            )
        policy = self._on_foreign_loop
        if policy == "allow":
            return
        if policy == "raise":
            raise ReentrantCallError(
                "blocking bridged call from a thread that runs an event loop; it would "
                "block that loop (on_foreign_loop='raise')"
            )
        if not self._warned_foreign:
            self._warned_foreign = True
            warnings.warn(
                "envlink: blocking bridged call from a thread that runs an event loop "
                "(e.g. Jupyter); it blocks that loop while it waits. Use the async API "
                "there. (Warned once per bridge.)",
                RuntimeWarning, stacklevel=3,
            )

    def call(
        self,
        fn: Callable[..., Awaitable[T]],
        /,
        *args: Any,
        timeout: float | None,
        method: str | None = None,
        **kwargs: Any,
    ) -> T:
        """Run ``fn(*args, **kwargs)`` on the bridge's loop and wait for its result.

        ``fn`` is called on the loop thread, in a copy of the caller's context.
        An exception raised by the coroutine is re-raised here unchanged.

        Args:
            fn: a coroutine function (or any callable returning an awaitable).
            *args: positional arguments for ``fn``.
            timeout: seconds to wait; ``None`` waits forever. On expiry the
                coroutine is cancelled and given ``cancel_grace`` to clean up.
            method: name used in telemetry (default: ``fn.__name__``).
            **kwargs: keyword arguments for ``fn``.

        Returns:
            What the coroutine returned.

        Raises:
            CallTimeoutError: the timeout expired (the coroutine was cancelled).
            ClientClosedError: the bridge is closed, or was closed during the call.
            ReentrantCallError: called from the bridge's own loop thread (or from a
                thread running another loop, with ``on_foreign_loop="raise"``).
            TypeError: ``timeout`` is not a number (a bool is not a duration).
            ValueError: ``timeout`` is negative or NaN.
            BaseException: whatever the coroutine raised.
        """
        if self._closed:
            raise ClientClosedError("the bridge is closed")
        running = _get_running_loop()
        if running is not None:
            self._check_running_loop(running)
        timeout = check_timeout(timeout, allow_zero=True)
        loop = self._loop
        if loop is None:
            loop = self._ensure_started()
        if method is None:
            method = getattr(fn, "__name__", "call")
        info = _method_infos.get(method) or _method_info(method)
        tel = self._tel

        # The sync hop's span starts here, in the caller's context, and is made the
        # current span of the copied context: it is the coroutine's parent.
        try:
            span = tel.tracer.start_span(info.span_name, kind=_INTERNAL)
        except Exception:  # a failing span processor must never fail the call
            span = INVALID_SPAN
        ctx = _copy_context()
        recording = span.is_recording()
        if recording:
            span.set_attribute(ATTR_RPC_METHOD, method)
            ctx.run(otel_context.attach, trace.set_span_in_context(span))

        job = _Job(fn, args, kwargs, ctx)
        pending = self._pending
        job.submitted = submitted = _perf()
        outcome = OUTCOME_OK
        error: BaseException | None = None
        # Everything from the submission on is inside this try: an interrupt
        # (KeyboardInterrupt) can land on any bytecode, and must cancel the coroutine.
        try:
            pending.add(job)
            try:
                # Checked again after registering: close() sets the flag before it wakes
                # the pending jobs, so a racing close() is either seen here or wakes us.
                if self._closed:
                    raise RuntimeError("closed")
                loop.call_soon_threadsafe(_start_job, self, job)
            except RuntimeError:  # closed, or the loop closed under us
                error = ClientClosedError("the bridge is closed")
            else:
                error = self._wait(job, loop, timeout, method)
            if error is not None:
                outcome = _outcome_of(error, error is not job.exc)
        except BaseException as exc:  # interrupted while waiting
            error = exc
            outcome = OUTCOME_CANCELLED
            if not job.done and not job.cancel_sent:
                # Cancel the coroutine and give it the grace to clean up (a second
                # interrupt cuts that short), then let the interrupt propagate.
                self._request_cancel(job, loop)
                job.waiter.acquire(timeout=self._cancel_grace)
            raise
        finally:
            pending.discard(job)
            end = _perf()
            # Telemetry never raises into the caller.
            try:
                started = job.started
                wait = (started - submitted) if started else (end - submitted)
                error_type = None if error is None else error_type_of(error)
                attrs = info.attributes(outcome, error_type)
                tel.bridge_wait_duration.record(wait, attrs)
                tel.bridge_call_duration.record(end - submitted, attrs)
                if recording:
                    span.set_attribute(ATTR_BRIDGE_QUEUE_WAIT, wait)
                    if started:
                        span.set_attribute(ATTR_BRIDGE_RUN_TIME, (job.ended or end) - started)
                    if error is not None:
                        mark_error(span, error)
                span.end()
            except Exception:  # pragma: no cover - defensive
                _log.debug("envlink bridge: telemetry failed", exc_info=True)
        if error is None:
            return cast(T, job.result)
        # Break the cycle exception -> traceback -> _run_job frame -> job -> exception.
        job.exc = None
        job = None  # type: ignore[assignment]
        try:
            raise error
        finally:
            error = None

    def _wait(self, job: _Job, loop: asyncio.AbstractEventLoop, timeout: float | None,
              method: str) -> BaseException | None:
        """Block until ``job`` settles; return its exception (or ours), None if it succeeded."""
        if timeout is None or timeout >= _TIMEOUT_MAX or math.isinf(timeout):
            woke = job.waiter.acquire()
        else:
            woke = job.waiter.acquire(timeout=timeout)
        if woke:
            exc = job.exc
            if job.done and not (self._closed and isinstance(exc, asyncio.CancelledError)):
                return exc
            # Woken by close(), or cancelled by the loop's shutdown at close.
            return ClientClosedError("the bridge was closed during the call")
        # Timed out: cancel on the loop and give the cleanup a bounded grace.
        self._request_cancel(job, loop)
        job.waiter.acquire(timeout=self._cancel_grace)
        if job.done and not job.cancel_requested:
            # It finished before the cancellation reached the loop: its own outcome stands.
            return job.exc
        exc = job.exc
        # The bridge cannot tell whether the coroutine's work reached its destination.
        err = CallTimeoutError(f"bridged call {method!r} timed out after {timeout}s",
                               method=method, timeout=timeout, outcome_unknown=True)
        if exc is not None and not isinstance(exc, asyncio.CancelledError):
            err.__cause__ = exc  # it failed while being cancelled: keep that visible
        else:
            err.__suppress_context__ = True
        return err

    def _request_cancel(self, job: _Job, loop: asyncio.AbstractEventLoop) -> None:
        job.cancel_sent = True
        with contextlib.suppress(RuntimeError):  # loop closed: nothing left to cancel
            loop.call_soon_threadsafe(_cancel_job, job)

    def iterate(
        self,
        aiterable_factory: Callable[[], AsyncIterable[T]],
        *,
        timeout: float | None,
        method: str | None = None,
    ) -> Iterator[T]:
        """Iterate an async iterable from blocking code.

        ``aiterable_factory`` is called on the loop thread (e.g.
        ``lambda: obj.stream(x)``). Each item is fetched under ``timeout``. When
        the iteration ends early (``break``, an exception, the iterator being
        closed or collected) the async iterator's ``aclose()`` is awaited, so its
        ``finally`` blocks run.

        Args:
            aiterable_factory: returns the async iterable; called on the loop.
            timeout: seconds allowed for each item (and for the final ``aclose``).
            method: name used in telemetry (default: the factory's ``__name__``).

        Raises:
            CallTimeoutError: fetching one item took longer than ``timeout``.
            ClientClosedError: the bridge is closed.
        """
        name = method or str(getattr(aiterable_factory, "__name__", "iterate"))
        return self._iterate(aiterable_factory, timeout, name)

    def _iterate(self, factory: Callable[[], AsyncIterable[T]], timeout: float | None,
                 name: str) -> Iterator[T]:
        async def open_iterator() -> AsyncIterator[T]:
            return aiter(factory())

        ait = self.call(open_iterator, timeout=timeout, method=name)
        finished = False
        try:
            while True:
                item = self.call(_anext_or_stop, ait, timeout=timeout, method=name)
                if item is _STOP:
                    finished = True
                    return
                yield cast(T, item)
        finally:
            if not finished:
                self._aclose(ait, timeout, name)

    def _aclose(self, ait: AsyncIterator[Any], timeout: float | None, name: str) -> None:
        aclose = getattr(ait, "aclose", None)
        if aclose is None or self._closed:
            return
        loop = self._loop
        if loop is not None and _get_running_loop() is loop:
            # Collected or closed on the loop thread: cannot block here, schedule it.
            loop.create_task(aclose())
            return
        try:
            self.call(aclose, timeout=timeout, method=name)
        except Exception:
            # Often runs from a generator's finalizer, where raising only prints noise.
            _log.warning("envlink bridge: closing async iterator %r failed", ait, exc_info=True)

    def enter(self, acm: Any, *, timeout: float | None,
              method: str | None = None) -> AbstractContextManager[Any]:
        """Use an async context manager from blocking code (``with bridge.enter(acm)``).

        ``__aenter__`` and ``__aexit__`` run on the loop, each under ``timeout``.

        Args:
            acm: an object with ``__aenter__``/``__aexit__``.
            timeout: seconds allowed for each of ``__aenter__`` and ``__aexit__``.
            method: name used in telemetry (default: the type's name).

        Raises:
            TypeError: ``acm`` is not an async context manager.
        """
        if not (hasattr(acm, "__aenter__") and hasattr(acm, "__aexit__")):
            raise TypeError(f"{type(acm).__qualname__} is not an async context manager")
        return _BridgedContext(self, acm, timeout, method or type(acm).__name__)


class _Stop:
    __slots__ = ()


_STOP = _Stop()


async def _anext_or_stop(ait: AsyncIterator[Any]) -> Any:
    # The end of an iteration is not an error: keep StopAsyncIteration out of the
    # telemetry (and out of the caller's thread, where it would mean nothing).
    try:
        return await ait.__anext__()
    except StopAsyncIteration:
        return _STOP


class _BridgedContext(Generic[T]):
    """A context manager that runs an async context manager on a bridge."""

    __slots__ = ("_acm", "_bridge", "_method", "_timeout")

    def __init__(self, bridge: Bridge, acm: Any, timeout: float | None, method: str) -> None:
        self._bridge = bridge
        self._acm = acm
        self._timeout = timeout
        self._method = method

    def __enter__(self) -> T:
        acm = self._acm
        return cast(T, self._bridge.call(type(acm).__aenter__, acm, timeout=self._timeout,
                                         method=f"{self._method}.__aenter__"))

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> bool:
        acm = self._acm
        return bool(self._bridge.call(type(acm).__aexit__, acm, exc_type, exc, tb,
                                      timeout=self._timeout,
                                      method=f"{self._method}.__aexit__"))


def _outcome_of(exc: BaseException, from_bridge: bool) -> str:
    """``envlink.outcome`` of a failed call.

    The bridge's own errors are its timeout and the bridge closing under the call
    (cancelled); the coroutine's are classified by type, so that the client's own
    deadline also counts as a timeout.
    """
    if isinstance(exc, TimeoutError):
        return OUTCOME_TIMEOUT
    if isinstance(exc, asyncio.CancelledError) or (
            from_bridge and isinstance(exc, ClientClosedError)):
        return OUTCOME_CANCELLED
    return OUTCOME_ERROR


# ---------------------------------------------------------------------- SyncProxy

_UNSET: Any = object()


class SyncProxy(Generic[ObjT]):
    """A blocking view of an async object, running it on a :class:`Bridge`.

    Attribute access is forwarded to the wrapped object:

    * a coroutine method becomes a blocking method that takes an extra keyword
      ``timeout=`` (default: the proxy's ``timeout``);
    * an async-generator method becomes a method returning a blocking iterator
      (each item under the timeout, ``aclose`` on early exit);
    * any other attribute is returned as it is.

    Wrappers are cached on the proxy, per name, on first access. The proxy is a
    context manager when the wrapped object is an async context manager.

    The proxy does not own the bridge: close the bridge when done. Its own
    attributes are prefixed ``_envlink_`` so that they never hide the wrapped
    object's.

    Args:
        target: the async object.
        bridge: the bridge that runs its coroutines.
        timeout: default ``timeout`` of the wrapped methods (``None``: no limit).
    """

    def __init__(self, target: ObjT, bridge: Bridge, *, timeout: float | None = None) -> None:
        self._envlink_target = target
        self._envlink_bridge = bridge
        self._envlink_timeout = check_timeout(timeout, allow_zero=True)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_envlink_"):  # not yet set (during __init__ / unpickling)
            raise AttributeError(name)
        attr = getattr(self._envlink_target, name)
        wrapper = self._envlink_wrap(name, attr)
        if wrapper is None:
            return attr
        # Cache in the instance dict: later lookups never reach __getattr__.
        self.__dict__[name] = wrapper
        return wrapper

    def _envlink_wrap(self, name: str, attr: Any) -> Callable[..., Any] | None:
        """The blocking wrapper for attribute ``name``, or None to return it as is.

        Subclasses override this to change how arguments and timeouts are passed.
        """
        return _wrap(self, name, attr)

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(dir(self._envlink_target)))

    def __repr__(self) -> str:
        return f"<{type(self).__name__} of {self._envlink_target!r}>"

    def __enter__(self) -> Any:
        target: Any = self._envlink_target
        if not hasattr(target, "__aenter__"):
            raise TypeError(f"{type(target).__qualname__} is not an async context manager")
        result = self._envlink_bridge.call(
            type(target).__aenter__, target, timeout=self._envlink_timeout,
            method=f"{type(target).__name__}.__aenter__")
        # `async with obj as obj` is the common case: keep the caller in sync land.
        return self if result is target else result

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> bool:
        target: Any = self._envlink_target
        return bool(self._envlink_bridge.call(
            type(target).__aexit__, target, exc_type, exc, tb,
            timeout=self._envlink_timeout, method=f"{type(target).__name__}.__aexit__"))

    def __iter__(self) -> Iterator[Any]:
        target = self._envlink_target
        if not hasattr(target, "__aiter__"):
            raise TypeError(f"{type(target).__qualname__} is not async iterable")
        return self._envlink_bridge.iterate(lambda: target, timeout=self._envlink_timeout,
                                            method=f"{type(target).__name__}.__anext__")


def _wrap(proxy: SyncProxy[Any], name: str, attr: Any) -> Callable[..., Any] | None:
    """The blocking wrapper for ``attr``, or None if it is not async."""
    # Captured by value, not through the proxy: no reference cycle proxy -> wrapper.
    bridge = proxy._envlink_bridge
    default = proxy._envlink_timeout
    wrapper: Callable[..., Any]
    if inspect.iscoroutinefunction(attr):
        def call(*args: Any, timeout: float | None = _UNSET, **kwargs: Any) -> Any:
            # Bound here, so that an argument of the target named `method` (or anything
            # Bridge.call takes for itself) reaches the target, not the bridge.
            fn = functools.partial(attr, *args, **kwargs) if args or kwargs else attr
            return bridge.call(fn, timeout=default if timeout is _UNSET else timeout,
                               method=name)

        wrapper = call
    elif inspect.isasyncgenfunction(attr):
        def iterate(*args: Any, timeout: float | None = _UNSET, **kwargs: Any) -> Iterator[Any]:
            return bridge.iterate(lambda: attr(*args, **kwargs),
                                  timeout=default if timeout is _UNSET else timeout,
                                  method=name)

        wrapper = iterate
    else:
        return None
    wrapper.__name__ = name
    wrapper.__qualname__ = f"{type(proxy).__name__}.{name}"
    wrapper.__doc__ = getattr(attr, "__doc__", None)
    wrapper.__wrapped__ = attr  # type: ignore[union-attr]
    return wrapper


# ---------------------------------------------------------------------- process hooks

_live_bridges: weakref.WeakSet[Bridge] = weakref.WeakSet()
# Loops inherited from the parent process across fork(): referenced forever so they
# are never collected (and closed) in the child.
_abandoned: list[asyncio.AbstractEventLoop] = []


def _close_all_at_exit() -> None:
    for bridge in list(_live_bridges):
        with contextlib.suppress(Exception):  # never fail interpreter exit
            bridge.close(timeout=bridge._join_timeout)


def _after_fork_in_child() -> None:
    for bridge in list(_live_bridges):
        bridge._after_fork_in_child()


atexit.register(_close_all_at_exit)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
