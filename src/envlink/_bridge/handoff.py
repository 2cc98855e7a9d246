"""The call hand-off: a job crosses from the caller's thread to the loop and back.

The caller builds a :class:`Job`, schedules :func:`start_job` on the loop and
blocks on the job's lock (:func:`wait_for`); the loop thread runs the coroutine as
a task in the caller's copied context and releases the lock when it settles. A
caller that stops waiting (timeout, interrupt) asks the loop to cancel the task and
gives its cleanup a bounded grace.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import math
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, cast

from envlink._errors import (
    OUTCOME_CANCELLED,
    OUTCOME_ERROR,
    OUTCOME_TIMEOUT,
    CallTimeoutError,
    ClientClosedError,
)

if TYPE_CHECKING:
    from envlink._bridge.loop import LoopThread

__all__ = ["Job", "outcome_of", "request_cancel", "start_job", "wait_for"]

perf = time.perf_counter
# ``lock.acquire(timeout=...)`` rejects values above this; larger means "forever".
_TIMEOUT_MAX = threading.TIMEOUT_MAX


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
        # RuntimeError: already released by close(), the caller is awake.
        with contextlib.suppress(RuntimeError):
            self.waiter.release()


async def _run_job(job: Job) -> None:
    """Runs on the loop, as a task in the caller's copied context."""
    job.started = perf()
    try:
        job.result = await job.fn(*job.args, **job.kwargs)
    except BaseException as exc:  # handed to the caller; never kills the loop thread
        job.exc = exc
    finally:
        job.ended = perf()
        job.done = True
        job.wake()


def start_job(owner: LoopThread, job: Job) -> None:
    """Runs on the loop thread: turn a submitted job into a task."""
    if job.cancel_sent:
        # The caller stopped waiting and its cancellation is queued behind us: the
        # coroutine must not start (an eager task would run it right here).
        job.cancel_requested = True
    if job.cancel_requested or owner._closed:
        # Timed out, interrupted or closed before the loop got to it: never start it.
        if not job.cancel_requested:
            job.exc = ClientClosedError("the bridge was closed before the call started")
        job.done = True
        job.wake()
        return
    job.task = _create_task(cast(asyncio.AbstractEventLoop, owner._loop), job)


if sys.version_info >= (3, 12):
    # Eager start: the coroutine runs at once, inside this callback, up to its first
    # real suspension (for a client call: waiting for the answer), instead of one
    # loop iteration later. One loop iteration fewer per bridged call.
    def _create_task(loop: asyncio.AbstractEventLoop, job: Job) -> asyncio.Task[None]:
        return asyncio.Task(_run_job(job), loop=loop, context=job.ctx,  # type: ignore[call-arg]
                            eager_start=True)
elif sys.version_info >= (3, 11):
    def _create_task(loop: asyncio.AbstractEventLoop, job: Job) -> asyncio.Task[None]:
        return loop.create_task(_run_job(job), context=job.ctx)
else:  # pragma: no cover - Python 3.10
    # Before 3.11 a task copies the context current at its creation.
    def _create_task(loop: asyncio.AbstractEventLoop, job: Job) -> asyncio.Task[None]:
        return job.ctx.run(loop.create_task, _run_job(job))


def _cancel_job(job: Job) -> None:
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


def request_cancel(job: Job, loop: asyncio.AbstractEventLoop) -> None:
    """From the caller's thread: ask the loop to cancel ``job``."""
    job.cancel_sent = True
    with contextlib.suppress(RuntimeError):  # loop closed: nothing left to cancel
        loop.call_soon_threadsafe(_cancel_job, job)


def wait_for(owner: LoopThread, job: Job, loop: asyncio.AbstractEventLoop,
             timeout: float | None, method: str) -> BaseException | None:
    """Block until ``job`` settles; return its exception (or ours), None if it succeeded."""
    if timeout is None or timeout >= _TIMEOUT_MAX or math.isinf(timeout):
        woke = job.waiter.acquire()
    else:
        woke = job.waiter.acquire(timeout=timeout)
    if woke:
        exc = job.exc
        if job.done and not (owner._closed and isinstance(exc, asyncio.CancelledError)):
            return exc
        # Woken by close(), or cancelled by the loop's shutdown at close.
        return ClientClosedError("the bridge was closed during the call")
    # Timed out: cancel on the loop and give the cleanup a bounded grace.
    request_cancel(job, loop)
    job.waiter.acquire(timeout=owner._cancel_grace)
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
