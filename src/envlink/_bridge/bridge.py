"""The :class:`Bridge`: blocking callers hand coroutines to a loop thread and wait, bounded."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import math
import warnings
from collections.abc import AsyncIterable, Awaitable, Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from envlink._bridge.adapters import BridgedContext, iterate
from envlink._bridge.handoff import (
    INTERRUPTED,
    TIMEOUT_MAX,
    Job,
    create_task,
    outcome_of,
    perf,
    request_cancel,
)
from envlink._bridge.loop import LoopThread
from envlink._bridge.observers import (
    BridgeCallFinished,
    BridgeCallStarted,
    BridgeHook,
    combine_hooks,
    default_hooks,
)
from envlink._config import check_timeout
from envlink._errors import (
    OUTCOME_CANCELLED,
    OUTCOME_OK,
    CallTimeoutError,
    ClientClosedError,
    EnvlinkError,
    ReentrantCallError,
    shorten,
)
from envlink._speedups import new_record, running_loop_getter

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import TracerProvider

__all__ = ["Bridge", "ForeignLoopPolicy"]

T = TypeVar("T")
ForeignLoopPolicy = Literal["allow", "warn", "raise"]

_log = logging.getLogger("envlink.bridge")
_get_running_loop = running_loop_getter()
_copy_context = contextvars.copy_context
# Two records per bridged call are built without the generated Python ``__new__``.
_record = new_record


class Bridge(LoopThread):
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
        tracer_provider: OpenTelemetry tracer provider of the default hooks
            (default: the global one).
        meter_provider: OpenTelemetry meter provider of the default hooks
            (default: the global one).
        hooks: observers of every call (:class:`~envlink.BridgeHook`), called in
            order. Default: envlink's OpenTelemetry emitter (a span and an
            ``envlink.bridge.call.duration`` record per call, the wait sampled; see
            ``docs/telemetry.md``) on the providers above; ``()`` for none.

    Raises:
        TypeError: a duration is not a number.
        ValueError: for an unknown ``on_foreign_loop``, a negative duration, or
            providers given together with ``hooks`` (they configure the default hooks).
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
        hooks: Sequence[BridgeHook] | None = None,
    ) -> None:
        if on_foreign_loop not in ("allow", "warn", "raise"):
            raise ValueError(f"on_foreign_loop must be allow, warn or raise, "
                             f"not {on_foreign_loop!r}")
        if hooks is None:
            hooks = default_hooks(tracer_provider, meter_provider)
        elif tracer_provider is not None or meter_provider is not None:
            raise ValueError("tracer_provider and meter_provider configure the default hooks; "
                             "with hooks=, pass them to your telemetry hook instead")
        super().__init__(name=name, cancel_grace=cancel_grace, join_timeout=join_timeout)
        self._on_foreign_loop = on_foreign_loop
        self._hook = combine_hooks(hooks)
        self._warned_foreign = False
        # Jobs whose callers are blocked, so that close() can wake them. Set
        # add/discard/copy are atomic under the GIL.
        self._pending: set[Job] = set()

    def _wake_waiters(self) -> None:
        for job in self._pending.copy():
            job.wake()

    def _after_fork_in_child(self) -> None:
        super()._after_fork_in_child()
        self._pending = set()

    # ------------------------------------------------------------------ calls

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
                RuntimeWarning, stacklevel=4,
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
            method: name given to the hooks (default: ``fn.__name__``).
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
        return self._call_packed(fn, args, kwargs, timeout, method)

    def _call_packed(self, fn: Callable[..., Awaitable[T]], args: tuple[Any, ...],
                    kwargs: dict[str, Any], timeout: float | None, method: str | None) -> T:
        """:meth:`call` with the arguments already packed: ``fn(*args, **kwargs)``.

        The one implementation of a bridged call. A caller that holds the arguments as a
        tuple and a dict (the blocking facades) passes them as they are: unpacking them
        into :meth:`call` would pack them again, for thousands of instructions per call.
        ``kwargs`` may hold ``timeout`` and ``method`` for ``fn``. Raises as :meth:`call`.
        """
        if self._closed:
            raise ClientClosedError("the bridge is closed: its close() was called")
        running = _get_running_loop()
        if running is not None:
            self._check_running_loop(running)
        if type(timeout) is not float or not timeout >= 0:  # check_timeout's own first test
            timeout = check_timeout(timeout, allow_zero=True)
        loop = self._loop
        if loop is None:
            loop = self._ensure_started()
        if method is None:
            method = getattr(fn, "__name__", "call")

        ctx = _copy_context()
        hook = self._hook
        token: Any = None
        if hook is not None:
            # In the caller's thread, before the hand-off: a hook may make its span the
            # current span of the copied context, i.e. the coroutine's parent.
            try:
                token = hook.call_started(_record(BridgeCallStarted, (method, ctx)))
            except Exception:
                _log.warning("envlink bridge: hook %r failed", hook, exc_info=True)
                hook = None

        job = Job(fn, args, kwargs, ctx)
        pending = self._pending
        job.submitted = submitted = perf()
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
                self._inbox.post(_start_job, self, job)  # type: ignore[union-attr]  # started
            except RuntimeError:  # closed, or the loop closed under us
                error = ClientClosedError("the bridge is closed: its close() was called")
            else:
                error = self._wait_for(job, loop, timeout, method)
            if error is not None:
                outcome = outcome_of(error, error is not job.exc)
        except BaseException as exc:  # interrupted while waiting
            error = exc
            outcome = OUTCOME_CANCELLED
            if not job.done and not job.cancel_sent:
                # Cancel the coroutine, saying the caller gave up on it (so that nothing
                # is kept for its late answer), and give it the grace to clean up (a
                # second interrupt cuts that short); then let the interrupt propagate.
                request_cancel(job, loop, INTERRUPTED)
                job.waiter.acquire(timeout=self._cancel_grace)
            raise
        finally:
            pending.discard(job)
            if hook is not None:
                end = perf()
                started = job.started
                # Hooks never raise into the caller. The record is not bound to a
                # name: it holds the error, whose traceback holds this frame.
                try:
                    hook.call_finished(_record(BridgeCallFinished, (
                        method, outcome,
                        (started - submitted) if started else (end - submitted),
                        ((job.ended or end) - started) if started else None,
                        end - submitted, error)), token)
                except Exception:
                    _log.warning("envlink bridge: hook %r failed", hook, exc_info=True)
        if error is None:
            result: T = job.result  # annotated, as typing.cast is a call at run time
            return result
        # Break the cycle exception -> traceback -> _run_job frame -> job -> exception.
        job.exc = None
        job = None  # type: ignore[assignment]
        if isinstance(error, EnvlinkError):
            # The loop thread's frames (the hand-off, the client's layers) say nothing
            # to a blocking caller: its own frames, then where the error arose.
            shorten(error)
        try:
            raise error
        finally:
            error = None

    def _start_job(self, job: Job) -> None:
        """Runs on the loop thread: turn a submitted job into a task."""
        if job.cancel_sent:
            # The caller stopped waiting and its cancellation is queued behind us: the
            # coroutine must not start (an eager task would run it right here).
            job.cancel_requested = True
        if job.cancel_requested or self._closed:
            # Timed out, interrupted or closed before the loop got to it: never start it.
            if not job.cancel_requested:
                job.exc = ClientClosedError(
                    "the bridge's close() was called before the call started")
            job.done = True
            job.wake()
            return
        job.task = create_task(self._loop, job)  # type: ignore[arg-type]  # running: set

    def _wait_for(self, job: Job, loop: asyncio.AbstractEventLoop, timeout: float | None,
                  method: str) -> BaseException | None:
        """Block until ``job`` settles; its exception (or the bridge's), ``None`` if it
        succeeded."""
        if timeout is None or timeout >= TIMEOUT_MAX or math.isinf(timeout):
            woke = job.waiter.acquire()
        else:
            woke = job.waiter.acquire(timeout=timeout)
        if woke:
            exc = job.exc
            if job.done and not (self._closed and isinstance(exc, asyncio.CancelledError)):
                return exc
            # Woken by close(), or cancelled by the loop's shutdown at close.
            return ClientClosedError("the bridge's close() was called during the call")
        # Timed out: cancel on the loop and give the cleanup a bounded grace.
        request_cancel(job, loop)
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
            method: name given to the hooks (default: the factory's ``__name__``).

        Raises:
            CallTimeoutError: fetching one item took longer than ``timeout``.
            ClientClosedError: the bridge is closed.
        """
        name = method or str(getattr(aiterable_factory, "__name__", "iterate"))
        return iterate(self, aiterable_factory, timeout, name)

    def enter(self, acm: Any, *, timeout: float | None,
              method: str | None = None) -> AbstractContextManager[Any]:
        """Use an async context manager from blocking code (``with bridge.enter(acm)``).

        ``__aenter__`` and ``__aexit__`` run on the loop, each under ``timeout``.

        Args:
            acm: an object with ``__aenter__``/``__aexit__``.
            timeout: seconds allowed for each of ``__aenter__`` and ``__aexit__``.
            method: name given to the hooks (default: the type's name).

        Raises:
            TypeError: ``acm`` is not an async context manager.
        """
        return BridgedContext(self, acm, timeout, method or type(acm).__name__)


# The loop runs the function with the bridge as its argument, so that no bound method
# is built for each call.
_start_job = Bridge._start_job
