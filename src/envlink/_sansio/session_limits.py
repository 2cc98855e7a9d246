"""Sessions per endpoint, shared by a process's clients: :class:`Limits` and the ledger. No I/O.

:class:`Limits` is the configuration (httpx's ``Limits`` is the model): the most
sessions one process keeps open on one endpoint, process-wide by default
(:func:`set_limits`) or per client. :class:`SessionLedger` is the bookkeeping
behind it: per endpoint, the permits held and a FIFO queue of the waiters, with a
freed permit handed to the oldest waiter directly (a newcomer never overtakes a
waiter), and the oldest of the callers waiting on the *server's* refusal woken
when one of the process's sessions of that endpoint ends. Waiters are opaque
tokens: the asyncio layer (``envlink._client.capacity``) wakes them on their loops.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass

from envlink._config import check_count

__all__ = ["Limits", "SessionLedger", "get_limits", "set_limits"]


@dataclass(frozen=True)
class Limits:
    """How many sessions the process may hold per endpoint.

    Args:
        max_sessions_per_endpoint: the most sessions open at once on one endpoint
            (its ``/ws`` URL) by all of the process's clients, pools and
            integrations that use this limit; ``None`` (default): no local limit.

    Raises:
        TypeError: the limit is not an integer.
        ValueError: the limit is below 1.
    """

    max_sessions_per_endpoint: int | None = None

    def __post_init__(self) -> None:
        if self.max_sessions_per_endpoint is not None:
            check_count(self.max_sessions_per_endpoint, "max_sessions_per_endpoint", minimum=1)


_limits = Limits()


def set_limits(limits: Limits) -> Limits:
    """Set the process-wide :class:`Limits` of clients not given ``limits=``.

    Args:
        limits: the new process-wide limits.

    Returns:
        The previous limits (to restore them).

    Raises:
        TypeError: ``limits`` is not a :class:`Limits`.
    """
    global _limits
    if not isinstance(limits, Limits):
        raise TypeError(f"limits must be an envlink.Limits, got {type(limits).__name__}")
    previous, _limits = _limits, limits
    return previous


def get_limits() -> Limits:
    """The process-wide :class:`Limits` (default: no limit)."""
    return _limits


class _Endpoint:
    __slots__ = ("held", "waiters", "watchers")

    def __init__(self) -> None:
        self.held = 0
        self.waiters: deque[tuple[Hashable, int]] = deque()
        self.watchers: deque[Hashable] = deque()


class SessionLedger:
    """Permits held per endpoint and the FIFO queues of those waiting. Thread-safe.

    A permit is held by a client from its first session on an endpoint until it
    ends its session (``close``/``disconnect``) or fails to open one.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._endpoints: dict[str, _Endpoint] = {}

    def _get(self, key: str) -> _Endpoint:
        ep = self._endpoints.get(key)
        if ep is None:
            ep = self._endpoints[key] = _Endpoint()
        return ep

    def held(self, key: str) -> int:
        """Permits held on ``key`` now."""
        with self._lock:
            ep = self._endpoints.get(key)
            return 0 if ep is None else ep.held

    def acquire(self, key: str, limit: int | None, waiter: Hashable) -> bool:
        """Take a permit on ``key`` if one is free and nobody waits; else queue ``waiter``.

        Returns:
            ``True`` if the permit was taken; ``False`` if ``waiter`` was queued (it
            is handed a permit by :meth:`release`, or must call :meth:`cancel`).
        """
        with self._lock:
            ep = self._get(key)
            if limit is None or (ep.held < limit and not ep.waiters):
                ep.held += 1
                return True
            ep.waiters.append((waiter, limit))
            return False

    def try_acquire(self, key: str, limit: int | None) -> bool:
        """Take a permit on ``key`` only if one is free now and nobody waits."""
        with self._lock:
            ep = self._get(key)
            if limit is None or (ep.held < limit and not ep.waiters):
                ep.held += 1
                return True
            return False

    def cancel(self, key: str, waiter: Hashable) -> bool:
        """Withdraw a queued ``waiter``.

        Returns:
            ``True`` if it was still queued; ``False`` if a permit was handed to it
            meanwhile (the caller then holds it and must :meth:`release` it).
        """
        with self._lock:
            ep = self._get(key)
            for item in ep.waiters:
                if item[0] == waiter:
                    ep.waiters.remove(item)
                    return True
            if waiter in ep.watchers:
                ep.watchers.remove(waiter)
            return False

    def release(self, key: str) -> tuple[Hashable | None, Hashable | None]:
        """Give back a permit on ``key``.

        Returns:
            ``(granted, watcher)``: the queued waiter the permit was handed to (it
            now holds it), and the oldest caller waiting on the server's refusal, to
            wake (it is removed from the watch list); either may be ``None``.
        """
        with self._lock:
            ep = self._get(key)
            granted: Hashable | None = None
            ep.held = max(0, ep.held - 1)
            while ep.waiters:
                waiter, limit = ep.waiters[0]
                if limit is not None and ep.held >= limit:
                    break
                ep.waiters.popleft()
                ep.held += 1
                granted = waiter
                break
            watcher = ep.watchers.popleft() if ep.watchers else None
            return granted, watcher

    def watch(self, key: str, watcher: Hashable) -> None:
        """Queue ``watcher`` to be woken when a permit on ``key`` is released."""
        with self._lock:
            self._get(key).watchers.append(watcher)

    def unwatch(self, key: str, watcher: Hashable) -> None:
        """Remove ``watcher`` from the watch list of ``key`` (no-op if it was woken)."""
        with self._lock:
            ep = self._get(key)
            if watcher in ep.watchers:
                ep.watchers.remove(watcher)

    def reset(self) -> None:
        """Forget everything (a forked child starts with no session of its parent's)."""
        self._lock = threading.Lock()
        self._endpoints = {}
