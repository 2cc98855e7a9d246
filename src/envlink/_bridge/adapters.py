"""Async iterators and async context managers, used from blocking code through a bridge."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterator
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

from envlink._speedups import running_loop_getter

if TYPE_CHECKING:
    from envlink._bridge.bridge import Bridge

__all__ = ["BridgedContext", "iterate"]

T = TypeVar("T")
_log = logging.getLogger("envlink.bridge")
_get_running_loop = running_loop_getter()
#: Closes scheduled on the loop thread, held until they end: the loop keeps only a weak
#: reference to a task, and nothing else refers to these.
_closing: set[asyncio.Task[Any]] = set()


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


def iterate(bridge: Bridge, factory: Callable[[], AsyncIterable[T]], timeout: float | None,
            name: str) -> Iterator[T]:
    """A blocking iterator over ``factory()``'s items; each one fetched under ``timeout``.

    Ended early (``break``, an exception, closed or collected), it awaits the async
    iterator's ``aclose()`` so that its ``finally`` blocks run.
    """
    async def open_iterator() -> AsyncIterator[T]:
        return aiter(factory())

    ait = bridge.call(open_iterator, timeout=timeout, method=name)
    finished = False
    try:
        while True:
            item = bridge.call(_anext_or_stop, ait, timeout=timeout, method=name)
            if item is _STOP:
                finished = True
                return
            yield cast(T, item)
    finally:
        if not finished:
            _aclose(bridge, ait, timeout, name)


def _aclose(bridge: Bridge, ait: AsyncIterator[Any], timeout: float | None, name: str) -> None:
    aclose = getattr(ait, "aclose", None)
    if aclose is None or bridge.closed:
        return
    loop = bridge.loop
    if loop is not None and _get_running_loop() is loop:
        # Collected or closed on the loop thread: cannot block here, schedule it.
        task = loop.create_task(aclose())
        _closing.add(task)
        task.add_done_callback(_closing.discard)
        return
    try:
        bridge.call(aclose, timeout=timeout, method=name)
    except Exception:
        # Often runs from a generator's finalizer, where raising only prints noise.
        _log.warning("envlink bridge: closing async iterator %r failed", ait, exc_info=True)


async def _exit_late(acm: Any, exc: BaseException) -> None:
    """Leave ``acm``, entered after its caller gave up with ``exc``; a failure is logged
    (nobody is left to raise it to)."""
    try:
        await type(acm).__aexit__(acm, type(exc), exc, exc.__traceback__)
    except Exception:
        _log.warning("envlink bridge: leaving %r after its abandoned entry failed", acm,
                     exc_info=True)


class BridgedContext(Generic[T]):
    """A context manager that runs an async context manager's ``__aenter__``/``__aexit__``
    on a bridge, each under ``timeout``. It keeps no state between the two, so one
    instance may be entered again, and a fresh one may exit what another entered.
    """

    __slots__ = ("_acm", "_bridge", "_method", "_timeout")

    def __init__(self, bridge: Bridge, acm: Any, timeout: float | None, method: str) -> None:
        if not (hasattr(acm, "__aenter__") and hasattr(acm, "__aexit__")):
            raise TypeError(f"{type(acm).__qualname__} is not an async context manager")
        self._bridge = bridge
        self._acm = acm
        self._timeout = timeout
        self._method = method

    def __enter__(self) -> T:
        acm = self._acm
        # Who leaves a context entered after its caller stopped waiting: the caller, if
        # the entry finished first, else the entry itself, on the loop. The lock makes
        # the two checks one decision.
        decided = threading.Lock()
        entered = False
        abandoned: BaseException | None = None

        async def enter() -> Any:
            nonlocal entered
            result = await type(acm).__aenter__(acm)
            with decided:
                entered = True
                gave_up = abandoned
            if gave_up is not None:
                # Finished after the caller's wait and its cancel grace (the entry
                # ignored the cancellation): nobody will exit it but this task, and a
                # cancellation still on its way must not cut the exit short.
                await asyncio.shield(_exit_late(acm, gave_up))
            return result

        try:
            return cast(T, self._bridge.call(enter, timeout=self._timeout,
                                             method=f"{self._method}.__aenter__"))
        except BaseException as exc:
            with decided:
                abandoned = exc
                left_to_caller = entered
            if left_to_caller:
                # Entered on the loop, but this caller stopped waiting first (its
                # timeout came too late to cancel the entry, or an interrupt): no
                # __exit__ follows, so leave the context now.
                self._exit_abandoned(exc)
            raise

    def _exit_abandoned(self, exc: BaseException) -> None:
        acm = self._acm
        try:
            self._bridge.call(type(acm).__aexit__, acm, type(exc), exc, exc.__traceback__,
                              timeout=self._timeout, method=f"{self._method}.__aexit__")
        except Exception:
            _log.warning("envlink bridge: leaving %r after its abandoned entry failed", acm,
                         exc_info=True)

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> bool:
        acm = self._acm
        return bool(self._bridge.call(type(acm).__aexit__, acm, exc_type, exc, tb,
                                      timeout=self._timeout,
                                      method=f"{self._method}.__aexit__"))
