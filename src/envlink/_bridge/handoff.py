"""The call hand-off: a job crosses from the caller's thread to the loop and back.

The :class:`~envlink._bridge.bridge.Bridge` builds a :class:`Job` in the caller's
thread, has the loop thread turn it into a task (:func:`create_task`: the coroutine
runs in the caller's copied context) and blocks on the job's lock, which the task
releases when it settles. A caller that stops waiting (timeout, interrupt) asks the
loop to cancel the task (:func:`request_cancel`). What belongs to the bridge (whether
it is closed, the grace a cancelled coroutine gets) stays in the bridge; this module
knows only the job and the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import sys
import threading
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

from envlink._errors import (
    OUTCOME_CANCELLED,
    OUTCOME_ERROR,
    OUTCOME_TIMEOUT,
    ClientClosedError,
)

__all__ = ["INTERRUPTED", "TIMEOUT_MAX", "Job", "abandon", "create_task", "outcome_of", "perf",
           "request_cancel", "was_abandoned"]

perf = time.perf_counter
#: The cancellation message of a call whose caller was interrupted (``KeyboardInterrupt``
#: or any other ``BaseException`` in the caller's thread): the caller gave up on it, so
#: the coroutine may let go of what a timed-out call would keep for a late answer.
INTERRUPTED = "the blocking caller was interrupted (KeyboardInterrupt or another BaseException)"
#: The tasks of calls whose blocking caller was interrupted, marked before they are
#: cancelled: the cancellation's message says so too, but code on the way (a library
#: that catches a cancellation and raises a new one) may drop it.
_abandoned: weakref.WeakSet[asyncio.Task[Any]] = weakref.WeakSet()


def was_abandoned(exc: asyncio.CancelledError) -> bool:
    """Whether ``exc``, a cancellation caught in a coroutine on the loop, is that of a
    call whose blocking caller gave up on it (was interrupted): its message, or the
    current task marked as such when the cancellation was requested."""
    return exc.args == (INTERRUPTED,) or asyncio.current_task() in _abandoned


def abandon(task: asyncio.Task[Any]) -> None:
    """On the loop's thread: cancel ``task`` as the call of a blocking caller that gave
    up on it (marked, and with the :data:`INTERRUPTED` message): its late answer is not
    waited for. What the bridge does to an interrupted call's task, and what a call
    that runs others (a pool's batch) does to them when it is abandoned itself."""
    _abandoned.add(task)
    task.cancel(INTERRUPTED)


#: ``lock.acquire(timeout=...)`` rejects values above this; larger means "forever".
TIMEOUT_MAX = threading.TIMEOUT_MAX


class Job:
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
        # The caller holds this lock, and the loop thread (or close()) releases it to
        # wake the caller. A lock is lighter than a Future with a Condition, and that is
        # most of what the bridge gains over run_coroutine_threadsafe.
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
        try:  # noqa: SIM105 - runs on every call (docs/performance.md, hot path)
            self.waiter.release()
        except RuntimeError:  # already released by close(): the caller is awake
            pass


#: Jobs whose coroutine is running. A task is referenced by its caller's job only, and
#: a caller woken by close() lets go of it: held here, the task cannot be collected
#: (its cleanup never run) before the loop's shutdown cancels it.
_running: set[Job] = set()


async def _run_job(job: Job) -> None:
    """Runs on the loop, as a task in the caller's copied context."""
    job.started = perf()
    _running.add(job)
    try:
        job.result = await job.fn(*job.args, **job.kwargs)
    except BaseException as exc:  # handed to the caller; never kills the loop thread
        job.exc = exc
    finally:
        _running.discard(job)
        job.ended = perf()
        job.done = True
        job.wake()


if sys.version_info >= (3, 12):
    # Eager start: the coroutine runs at once, inside this callback, up to its first
    # real suspension (for a client call: waiting for the answer), instead of one
    # loop iteration later. One loop iteration fewer per bridged call.
    def create_task(loop: asyncio.AbstractEventLoop, job: Job) -> asyncio.Task[None]:
        """On the loop thread: run ``job`` as a task in the caller's copied context."""
        return asyncio.Task(_run_job(job), loop=loop, context=job.ctx,  # type: ignore[call-arg]
                            eager_start=True)
elif sys.version_info >= (3, 11):
    def create_task(loop: asyncio.AbstractEventLoop, job: Job) -> asyncio.Task[None]:
        # What loop.create_task does on the bridge's own loop, which has no task
        # factory: the Task itself, without that method's frame.
        return asyncio.Task(_run_job(job), loop=loop, context=job.ctx)
else:  # pragma: no cover - Python 3.10
    # Before 3.11 a task copies the context current at its creation.
    def create_task(loop: asyncio.AbstractEventLoop, job: Job) -> asyncio.Task[None]:
        return job.ctx.run(loop.create_task, _run_job(job))


def _cancel_job(job: Job, message: str | None) -> None:
    """Runs on the loop thread: cancel a job whose caller stopped waiting."""
    if job.done:
        return
    job.cancel_requested = True
    if job.task is not None:
        if message == INTERRUPTED:
            abandon(job.task)
        else:
            job.task.cancel(message)
        if not job.started:
            # Cancelled before its first step: the coroutine never runs, so _run_job's
            # finally will not wake the caller. Do it here, sparing it the grace wait.
            job.done = True
            job.wake()


def request_cancel(job: Job, loop: asyncio.AbstractEventLoop,
                   message: str | None = None) -> None:
    """From the caller's thread: ask the loop to cancel ``job`` (with ``message``:
    :data:`INTERRUPTED` when the caller was interrupted)."""
    job.cancel_sent = True
    with contextlib.suppress(RuntimeError):  # loop closed: nothing left to cancel
        loop.call_soon_threadsafe(_cancel_job, job, message)


def outcome_of(exc: BaseException, from_bridge: bool) -> str:
    """The outcome of a failed call.

    The bridge's own errors are its timeout and the bridge closing under the call
    (cancelled); the coroutine's are classified by type, so that a client's own
    deadline also counts as a timeout.
    """
    if isinstance(exc, TimeoutError):
        return OUTCOME_TIMEOUT
    if isinstance(exc, asyncio.CancelledError) or (
            from_bridge and isinstance(exc, ClientClosedError)):
        return OUTCOME_CANCELLED
    return OUTCOME_ERROR
