"""Named counters that tests can await: deterministic synchronisation without sleeps."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable

__all__ = ["AwaitableCounters"]


class AwaitableCounters:
    """Counters by name; :meth:`wait` returns once a counter reaches a value.

    Used from one event loop only.
    """

    def __init__(self) -> None:
        self._values: Counter[str] = Counter()
        self._waiters: dict[str, list[tuple[int, asyncio.Future[None]]]] = {}
        self.listeners: list[Callable[[str, int], None]] = []

    def get(self, name: str) -> int:
        """The current value of ``name`` (0 if never incremented)."""
        return self._values[name]

    def incr(self, name: str, amount: int = 1) -> int:
        """Add ``amount`` to ``name``, wake the waiters it satisfies, return the new value."""
        self._values[name] += amount
        value = self._values[name]
        for listener in self.listeners:
            listener(name, value)
        waiters = self._waiters.get(name)
        if waiters:
            still = []
            for target, fut in waiters:
                if fut.done():
                    continue
                if value >= target:
                    fut.set_result(None)
                else:
                    still.append((target, fut))
            self._waiters[name] = still
        return value

    async def wait(self, name: str, count: int) -> None:
        """Return when ``name`` has reached ``count``."""
        if self._values[name] >= count:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(name, []).append((count, fut))
        await fut

    def snapshot(self) -> dict[str, int]:
        """All counters, for debugging."""
        return dict(self._values)
