"""Deadlines that never swallow a caller's cancellation, and timeout validation.

``asyncio.wait_for`` must not be used in envlink: on Python 3.11 it returns the
inner result when the caller's cancellation (or an enclosing deadline, which is a
cancellation too) arrives in the same loop iteration as that result, and the
cancellation is lost. :func:`bounded` is the replacement (``asyncio.timeout`` on
3.11+, an equivalent on 3.10) and :func:`deadline` the per-call form raising
:class:`~envlink.CallTimeoutError`. (The one validation of every ``timeout=`` envlink
accepts is :func:`envlink._config.check_timeout`.)
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import math
import sys
import threading
import time
from collections.abc import AsyncIterator
from types import TracebackType

from envlink._errors import CallTimeoutError
from envlink._speedups import running_loop_getter, task_of_loop_getter

__all__ = ["bounded", "bounded_at", "deadline"]


class _Expiry:
    """Whether a :func:`bounded` block's own deadline expired."""

    __slots__ = ("fired",)

    def __init__(self) -> None:
        self.fired = False

    def expired(self) -> bool:
        """``True`` once the deadline has expired."""
        return self.fired


def bounded(seconds: float | None) -> contextlib.AbstractAsyncContextManager[_Expiry]:
    """Cancel the block after ``seconds`` and raise :class:`TimeoutError`.

    A cancellation from outside (the caller's, or an enclosing deadline's) is always
    passed on, even when it coincides with the block finishing. Called in a running
    loop: the deadline is ``seconds`` from now (:func:`bounded_at` takes the time).
    """
    return bounded_at(None if seconds is None
                      else asyncio.get_running_loop().time() + seconds)


if sys.version_info >= (3, 11):

    @contextlib.asynccontextmanager
    async def bounded_at(when: float | None) -> AsyncIterator[_Expiry]:
        """Cancel the block at the loop's time ``when`` and raise :class:`TimeoutError`.

        Blocks given the same ``when`` expire in the same loop iteration: none of them
        runs on after another has expired (a batch's shared deadline).
        """
        expiry = _Expiry()
        try:
            async with asyncio.timeout_at(when) as cm:
                yield expiry
        except TimeoutError:
            expiry.fired = cm.expired()
            raise

else:  # pragma: no cover - exercised on Python 3.10 only

    _EXPIRED = "envlink: deadline expired"

    @contextlib.asynccontextmanager
    async def bounded_at(when: float | None) -> AsyncIterator[_Expiry]:
        """Cancel the block at the loop's time ``when`` and raise :class:`TimeoutError`.

        A cancellation from outside is passed on: only a cancellation carrying this
        deadline's own message becomes a :class:`TimeoutError` (a later ``cancel()``
        by anyone else replaces the message on 3.10, so it is never mistaken for ours).
        """
        expiry = _Expiry()
        if when is None:
            yield expiry
            return
        task = asyncio.current_task()
        assert task is not None

        def expire() -> None:
            expiry.fired = True
            task.cancel(_EXPIRED)

        handle = asyncio.get_running_loop().call_at(when, expire)
        try:
            yield expiry
        except asyncio.CancelledError as exc:
            if expiry.fired and exc.args == (_EXPIRED,):
                raise TimeoutError from exc
            raise
        finally:
            handle.cancel()


if sys.version_info >= (3, 11):

    _get_running_loop = running_loop_getter()
    _task_of = task_of_loop_getter()
    # asyncio runs a timer this early (``BaseEventLoop._clock_resolution``).
    _RESOLUTION = time.get_clock_info("monotonic").resolution
    # A timer's callback needs no caller's context; an empty one holds no reference
    # to the caller's context variables while it waits.
    _NO_CONTEXT = contextvars.Context()

    class _Timers:
        """One loop's call deadlines behind one armed timer, re-armed lazily.

        Calls come and go far faster than their deadlines expire, and most have the
        same length: a timer per call (``loop.call_at`` then ``cancel()``, what
        ``asyncio.timeout`` does) costs more than the rest of the deadline. Here a
        call's deadline is an entry in a set; the one timer is armed for the earliest
        deadline when it is earlier than the timer, and when it fires it expires the
        calls that are due and re-arms itself for the earliest of the others. Used
        only on its loop's thread.
        """

        __slots__ = ("active", "handle", "loop", "when")

        def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
            self.loop = loop
            self.active: set[_Deadline] = set()
            self.handle: asyncio.TimerHandle | None = None
            self.when = math.inf

        def add(self, entry: _Deadline, when: float) -> None:
            self.active.add(entry)
            if when < self.when:
                if self.handle is not None:
                    self.handle.cancel()
                self.when = when
                self.handle = self.loop.call_at(when, self._fire, context=_NO_CONTEXT)

        def _fire(self) -> None:
            self.handle = None
            self.when = math.inf
            active = self.active
            if not active:
                return
            now = self.loop.time() + _RESOLUTION
            due = [entry for entry in active if entry.when <= now]
            for entry in due:
                active.discard(entry)
                entry.expire()
            if active:
                when = min(entry.when for entry in active)
                self.when = when
                self.handle = self.loop.call_at(when, self._fire, context=_NO_CONTEXT)

    class _Cache(threading.local):
        timers: _Timers | None = None

    # The timers of the loop this thread ran last (a loop runs in one thread).
    _cache = _Cache()

    def _timers_of(loop: asyncio.AbstractEventLoop) -> _Timers:
        timers = _cache.timers
        if timers is None or timers.loop is not loop:
            # A new loop in this thread (or back to an earlier one): new timers. Each
            # deadline keeps the timers it joined, so older ones still expire theirs.
            timers = _cache.timers = _Timers(loop)
        return timers

    class _Deadline:
        """:func:`deadline` on 3.11+: what ``asyncio.timeout`` does, for a call.

        The task's cancel/uncancel count is kept as ``asyncio.Timeout`` keeps it (so a
        cancellation from outside is told from the deadline's own exactly as it tells
        them), without its object, its state machine, its two extra running-loop
        look-ups per call (each one a ``getpid()`` system call on 3.11), and without
        a timer handle per call (:class:`_Timers`).
        """

        __slots__ = ("_cancelling", "_expired", "_method", "_seconds", "_task", "_timers",
                     "when")

        def __init__(self, seconds: float | None, method: str) -> None:
            self._seconds = seconds
            self._method = method
            self._timers: _Timers | None = None
            self._expired = False

        def start(self) -> None:
            """Start the deadline (what entering the block does), without a coroutine.

            After calling this method: run the call, then call :meth:`finish` with the
            exception it raised, or ``None``, whatever happens.
            """
            seconds = self._seconds
            if seconds is None:
                return
            loop = _get_running_loop()
            task = _task_of(loop)
            if task is None:
                raise RuntimeError("a deadline must be used inside a task")
            self._task = task
            self._cancelling = task.cancelling()
            timers = _cache.timers
            if timers is None or timers.loop is not loop:
                timers = _timers_of(loop)
            self._timers = timers
            self.when = when = loop.time() + seconds
            timers.add(self, when)

        def expire(self) -> None:
            """Called by the timers when this deadline is due."""
            self._expired = True
            self._task.cancel()

        def finish(self, exc: BaseException | None) -> None:
            """End the deadline (what leaving the block does) after :meth:`start`.

            Raises:
                CallTimeoutError: the deadline expired and ``exc`` is its cancellation
                    (or a ``TimeoutError`` raised after it expired).
            """
            timers = self._timers
            if timers is None:
                return
            self._timers = None
            timers.active.discard(self)
            if not self._expired:
                return
            # Ours only if no other cancellation was requested since the block began.
            if self._task.uncancel() <= self._cancelling \
                    and isinstance(exc, asyncio.CancelledError):
                timeout = TimeoutError()
                timeout.__cause__ = exc
                raise self._timed_out() from timeout
            if isinstance(exc, TimeoutError) and not isinstance(exc, CallTimeoutError):
                raise self._timed_out() from exc  # as bounded() + deadline() did

        def _timed_out(self) -> CallTimeoutError:
            seconds = self._seconds
            assert seconds is not None
            return CallTimeoutError(f"{self._method} did not complete within {seconds:g} s",
                                    method=self._method, timeout=seconds)

        async def __aenter__(self) -> None:
            self.start()

        async def __aexit__(self, exc_type: type[BaseException] | None,
                            exc: BaseException | None, tb: TracebackType | None) -> None:
            self.finish(exc)

    #: A call's deadline, ``deadline(seconds, method)``: :class:`~envlink.CallTimeoutError`
    #: when it expires inside the block. The class itself, as it is entered on every call.
    deadline = _Deadline

else:  # pragma: no cover - exercised on Python 3.10 only

    class _Deadline310:
        """:func:`deadline` on 3.10: a timer per call that cancels the task with its
        own message (a later ``cancel()`` by anyone else replaces it on 3.10)."""

        __slots__ = ("_fired", "_handle", "_method", "_seconds")

        def __init__(self, seconds: float | None, method: str) -> None:
            self._seconds = seconds
            self._method = method
            self._handle: asyncio.TimerHandle | None = None
            self._fired = False

        def start(self) -> None:
            """Start the deadline; then :meth:`finish` it whatever happens."""
            seconds = self._seconds
            if seconds is None:
                return
            task = asyncio.current_task()
            if task is None:
                raise RuntimeError("a deadline must be used inside a task")
            loop = asyncio.get_running_loop()

            def expire() -> None:
                self._fired = True
                task.cancel(_EXPIRED)

            self._handle = loop.call_at(loop.time() + seconds, expire)

        def finish(self, exc: BaseException | None) -> None:
            """End the deadline after :meth:`start`.

            Raises:
                CallTimeoutError: the deadline expired inside the block.
            """
            handle = self._handle
            if handle is None:
                return
            self._handle = None
            handle.cancel()
            if not self._fired:
                return
            seconds = self._seconds
            assert seconds is not None
            error = CallTimeoutError(f"{self._method} did not complete within {seconds:g} s",
                                     method=self._method, timeout=seconds)
            if isinstance(exc, asyncio.CancelledError) and exc.args == (_EXPIRED,):
                timeout = TimeoutError()
                timeout.__cause__ = exc
                raise error from timeout
            if isinstance(exc, TimeoutError) and not isinstance(exc, CallTimeoutError):
                raise error from exc

        async def __aenter__(self) -> None:
            self.start()

        async def __aexit__(self, exc_type: type[BaseException] | None,
                            exc: BaseException | None, tb: TracebackType | None) -> None:
            self.finish(exc)

    #: A call's deadline, ``deadline(seconds, method)``: :class:`~envlink.CallTimeoutError`
    #: when it expires inside the block.
    deadline = _Deadline310
