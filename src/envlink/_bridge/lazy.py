""":class:`LazyCoroutine`: a call returned now, that runs when it is awaited or used.

What a call without ``await`` hands back (:class:`~envlink.AutoResult`) and what
``from_docker_image`` / ``from_env`` hand back (:class:`~envlink.Bootstrap`) are this
one thing: awaited (``await``, ``asyncio.run``, ``create_task``), it is a coroutine,
made on first use; resolved from blocking code instead, each says how. A coroutine is
made at most once, and one that is never made never warns that it was never awaited.
"""

from __future__ import annotations

from collections.abc import Coroutine, Generator
from typing import Any, TypeVar

__all__ = ["LazyCoroutine"]

T = TypeVar("T")


class LazyCoroutine(Coroutine[Any, Any, T]):
    """A coroutine made on the first ``await``, ``send`` or ``throw``: :meth:`_start`'s."""

    __slots__ = ("_coro",)

    def __init__(self) -> None:
        self._coro: Coroutine[Any, Any, T] | None = None

    def _start(self) -> Coroutine[Any, Any, T]:
        """Make the coroutine (called once); raise to refuse being awaited."""
        raise NotImplementedError

    def _unstarted_close(self) -> None:
        """:meth:`close` before the coroutine was made (nothing to do by default)."""

    def _coroutine(self) -> Coroutine[Any, Any, T]:
        coro = self._coro
        if coro is None:
            coro = self._coro = self._start()
        return coro

    def __await__(self) -> Generator[Any, None, T]:
        return self._coroutine().__await__()

    def send(self, value: Any) -> Any:
        """Run the call as a coroutine (what ``await`` and ``asyncio.create_task`` do)."""
        return self._coroutine().send(value)

    def throw(self, *args: Any) -> Any:
        """Throw into the call's coroutine."""
        return self._coroutine().throw(*args)

    def close(self) -> None:
        """Close the call's coroutine; a call never started is dropped without a warning."""
        if self._coro is not None:
            self._coro.close()
        else:
            self._unstarted_close()
