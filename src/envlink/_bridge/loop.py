"""The bridge's event loop in a daemon thread: start, stop, fork and exit handling.

:class:`LoopThread` owns one asyncio loop running in a named daemon thread,
started lazily. Closing it stops the loop (leftover tasks are cancelled and given
a grace period to clean up) and joins the thread. An ``atexit`` hook closes loop
threads the program forgot; after ``os.fork()`` the child never touches the
parent's loop and starts a fresh one on first use.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import contextlib
import itertools
import logging
import os
import socket
import threading
import time
import weakref
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, TypeVar

from envlink._bridge.loops import loop_factory
from envlink._config import check_timeout
from envlink._errors import ClientClosedError

__all__ = ["Inbox", "LoopThread", "is_bridge_loop"]

_log = logging.getLogger("envlink.bridge")
_thread_ids = itertools.count(1)
SelfT = TypeVar("SelfT", bound="LoopThread")


class Inbox:
    """Calls handed to a loop from other threads, and the socket pair that wakes it.

    ``loop.call_soon_threadsafe`` does this for any callback, with a handle and
    several calls per hand-off and a self-pipe that asyncio reads until ``recv``
    raises. The bridge hands one call over per bridged call, so it keeps its own:
    :meth:`post` appends ``(fn, args)`` to a deque and writes one byte; the loop's
    reader reads what bytes there are once (up to 4096: what it leaves keeps the
    socket readable, and the level-triggered selector reports it again) and then
    runs every call in the deque, in order. Each call is in the deque before its
    byte is written and the deque is read after the bytes, so no call is left
    behind a wake-up that was read. Built and registered before the loop runs, with
    public API only. A loop that cannot watch a socket (``add_reader`` not
    implemented: Windows' proactor loop) gets its calls by ``call_soon_threadsafe``.
    """

    __slots__ = ("_calls", "_loop", "_reader", "_writer")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._calls: collections.deque[tuple[Callable[..., object], tuple[Any, ...]]] = (
            collections.deque())
        self._loop = loop
        reader, writer = socket.socketpair()
        self._reader: socket.socket | None = reader
        self._writer: socket.socket | None = writer
        reader.setblocking(False)
        writer.setblocking(False)
        try:
            loop.add_reader(reader.fileno(), self._run_posted)
        except NotImplementedError:
            reader.close()
            writer.close()
            self._reader = self._writer = None

    def post(self, fn: Callable[..., object], *args: Any) -> None:
        """From any thread: have the loop thread call ``fn(*args)`` soon.

        Raises:
            RuntimeError: the loop's thread has ended (the inbox is closed).
        """
        writer = self._writer
        if writer is None:  # the loop cannot watch a socket
            self._loop.call_soon_threadsafe(fn, *args)  # RuntimeError once it is closed
            return
        self._calls.append((fn, args))
        try:
            writer.send(b"\0")
        except BlockingIOError:
            pass  # the buffer is full of wake-ups the loop has yet to read: it will
        except OSError as exc:  # closed
            raise RuntimeError("the loop's thread has ended") from exc

    def _run_posted(self) -> None:
        try:  # noqa: SIM105 - runs on every wake-up (docs/performance.md, hot path)
            self._reader.recv(4096)  # type: ignore[union-attr]  # registered: set
        except (BlockingIOError, InterruptedError):
            pass
        calls = self._calls
        while calls:
            fn, args = calls.popleft()
            try:
                fn(*args)
            except Exception as exc:  # as a loop's handle would: reported, never raised
                self._loop.call_exception_handler({
                    "message": f"envlink bridge: exception in posted call {fn!r}",
                    "exception": exc})

    def close(self, loop: asyncio.AbstractEventLoop) -> None:
        """On the loop thread, before the loop closes: unregister and close the sockets."""
        reader, writer = self._reader, self._writer
        if reader is not None and writer is not None:
            loop.remove_reader(reader.fileno())
            reader.close()
            writer.close()
        self._calls.clear()


class LoopThread:
    """An event loop in a daemon thread, started on first use, closed once.

    Args:
        name: prefix of the loop thread's name (a counter is appended).
        cancel_grace: seconds to wait for cancelled tasks to finish their cleanup.
        join_timeout: seconds :meth:`close` waits for the loop thread to end.

    Raises:
        TypeError: a duration is not a number.
        ValueError: a duration is negative or NaN.
    """

    def __init__(self, *, name: str, cancel_grace: float, join_timeout: float) -> None:
        grace = check_timeout(cancel_grace, "cancel_grace", allow_zero=True)
        join = check_timeout(join_timeout, "join_timeout", allow_zero=True)
        if grace is None or join is None:
            raise TypeError("cancel_grace and join_timeout must be numbers of seconds, not None")
        self._name = name
        self._cancel_grace = grace
        self._join_timeout = join
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._inbox: Inbox | None = None
        self._thread: threading.Thread | None = None
        self._thread_ident: int | None = None
        self._closed = False
        _live.add(self)

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
        """The event loop, or ``None`` before the first call."""
        return self._loop

    def on_loop_thread(self) -> bool:
        """Whether the calling thread is this loop's thread."""
        # The ident first (cheap), then the thread itself: once the loop thread has
        # ended, the next thread started may be given its ident.
        return (self._thread_ident is not None and threading.get_ident() == self._thread_ident
                and threading.current_thread() is self._thread)

    def _thread_name(self) -> str:
        return f"{self._name}-{next(_thread_ids)}"

    def _ensure_started(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._closed:
                raise ClientClosedError("the bridge is closed: its close() was called")
            loop = self._loop
            if loop is not None:
                return loop
            loop = loop_factory()()  # uvloop where installed (envlink._bridge.loops)
            try:
                inbox = Inbox(loop)
            except BaseException:  # no socket pair (out of descriptors): no loop either
                loop.close()
                raise
            ready = threading.Event()
            thread = threading.Thread(
                target=_loop_main, args=(loop, inbox, ready, self._cancel_grace),
                name=self._thread_name(), daemon=True,
            )
            thread.start()
            # The loop must run before anyone submits to it, else a call could be
            # queued on a loop whose thread failed to start.
            if not ready.wait(max(self._join_timeout, 5.0)):  # pragma: no cover
                loop.call_soon_threadsafe(loop.stop)
                raise RuntimeError("the envlink bridge's loop thread did not start")
            self._thread = thread
            self._thread_ident = thread.ident
            self._inbox = inbox  # before the loop: a caller that sees the loop sees it
            self._loop = loop
            _bridge_loops.add(loop)
            return loop

    def _wake_waiters(self) -> None:
        """Release every caller blocked on the loop; called by :meth:`close`."""

    def close(self, timeout: float | None = None) -> None:
        """Close; idempotent.

        Waiting callers are released, leftover tasks are cancelled and given
        ``cancel_grace`` seconds to clean up, then the loop stops and its thread is
        joined. Called from the loop thread itself, it stops the loop without joining.

        Args:
            timeout: seconds to wait for the thread to end (default: ``join_timeout``).
        """
        timeout = check_timeout(timeout, allow_zero=True)
        with self._lock:
            if self._closed:
                return
            self._closed = True
            loop, thread = self._loop, self._thread
        self._wake_waiters()
        if loop is None or thread is None:
            return
        try:
            loop.call_soon_threadsafe(loop.stop)
        except RuntimeError:  # the loop is already closed
            return
        if self.on_loop_thread():
            return
        thread.join(self._join_timeout if timeout is None else timeout)
        if thread.is_alive():
            _log.warning("envlink bridge: loop thread %s did not end in time", thread.name)

    def __enter__(self: SelfT) -> SelfT:
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
            _abandoned.append((self._loop, self._inbox))
        self._lock = threading.Lock()
        self._loop = None
        self._inbox = None
        self._thread = None
        self._thread_ident = None

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("running" if self._loop else "idle")
        return f"<{type(self).__name__} {self._name!r} {state}>"


def _loop_main(loop: asyncio.AbstractEventLoop, inbox: Inbox, ready: threading.Event,
               cancel_grace: float) -> None:
    """Body of the loop thread. Holds no reference to its owner, so it can be collected."""
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
            inbox.close(loop)
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
    if not _interpreter_exiting():
        # At interpreter exit the executor's workers were joined already (by
        # concurrent.futures' own exit hook), and 3.12 forbids the thread that
        # shutdown_default_executor() starts to join them.
        loop.run_until_complete(_bounded(loop.shutdown_default_executor(), remaining))


def _interpreter_exiting() -> bool:
    """Whether the interpreter is ending: envlink's exit hook runs, or the main thread
    has stopped (its shutdown marks it so before the exit hooks run), which a loop
    thread closed by the collector can see at any moment."""
    return _exiting or not threading.main_thread().is_alive()


async def _bounded(aw: Awaitable[None], timeout: float) -> None:
    # No async generator here (bounded() is one): a generator first iterated after
    # shutdown_asyncgens() makes asyncio warn that it was scheduled too late.
    task = asyncio.ensure_future(aw)
    done, _ = await asyncio.wait((task,), timeout=timeout)
    if not done:
        task.cancel()
        _log.warning("envlink bridge: loop cleanup did not finish in time")
    elif not task.cancelled() and task.exception() is not None:
        exc = task.exception()
        if isinstance(exc, RuntimeError) and "interpreter shutdown" in str(exc):
            # The interpreter began to end while the cleanup ran, and refused the
            # thread that joins the executor's workers ("can't create new thread at
            # interpreter shutdown", from 3.12): its own exit hooks join them.
            return
        _log.warning("envlink bridge: loop cleanup failed", exc_info=exc)


def is_bridge_loop(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether ``loop`` is the event loop of an envlink loop thread (a bridge's)."""
    return loop in _bridge_loops


# ---------------------------------------------------------------------- process hooks

# Every loop a LoopThread started: code running there is envlink's own work for a
# blocking caller, which the client's plain-call dispatch must not take for async use.
_bridge_loops: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()

_live: weakref.WeakSet[LoopThread] = weakref.WeakSet()
# Loops inherited from the parent process across fork(): referenced forever so they
# are never collected (and closed) in the child.
_abandoned: list[tuple[asyncio.AbstractEventLoop, Inbox | None]] = []


#: Set while the atexit hook below runs the last closes.
_exiting = False


def _close_all_at_exit() -> None:
    global _exiting
    _exiting = True
    try:
        for owner in list(_live):
            with contextlib.suppress(Exception):  # never fail interpreter exit
                owner.close(timeout=owner._join_timeout)
    finally:
        _exiting = False


def _after_fork_in_child() -> None:
    for owner in list(_live):
        owner._after_fork_in_child()


atexit.register(_close_all_at_exit)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
