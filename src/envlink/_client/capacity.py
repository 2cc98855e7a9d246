"""A client's share of the process-wide session limit, and waiting for capacity.

Every :class:`~envlink.EnvClient` of a process counts against one
:class:`~envlink._sansio.session_limits.SessionLedger`: it takes a permit for its endpoint
before it opens its first session there, and gives it back when it ends that
session (``close``, ``disconnect``) or fails to open one. With a limit set
(:class:`~envlink.Limits`, process-wide or per client), a client finding the
endpoint full either fails at once with :class:`~envlink.CapacityReachedError`
(``on_capacity="raise"``, the default) or queues, FIFO, until a session of that
endpoint ends (``on_capacity="wait"``). Under ``"wait"``, a ``CAPACITY_REACHED``
answer from the server is waited out too: through the one retry primitive, as a wait
(no try cap, the retry budget not spent), sleeping the backoff or until one of the
process's sessions of that endpoint ends, whichever comes first. Both waits end at
the call's deadline, with the typed error, never a hang.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Literal, TypeVar

from envlink._errors import CapacityReachedError, ConnectError, FleetStoreError
from envlink._fleet.settings import FleetLimits
from envlink._sansio.policies import ReconnectPolicy
from envlink._sansio.retry import Retry
from envlink._sansio.session_limits import Limits, SessionLedger, get_limits

if TYPE_CHECKING:
    from envlink._fleet.reporting import Providers
    from envlink._fleet.worker import Hold

__all__ = ["CAPACITY_POLICY", "CapacityGate", "CapacityMode", "LEDGER"]

_R = TypeVar("_R")

#: What a client does when its endpoint is full: fail at once, or wait for room.
CapacityMode = Literal["raise", "wait"]

#: Waiting for the server to have room: many short waits (each also ended early by
#: a session of that endpoint ending), bounded by the call's deadline.
CAPACITY_POLICY = ReconnectPolicy(initial_delay=0.05, max_delay=1.0, max_elapsed=None,
                                  budget=None)

#: The process's one ledger: every client, pool and integration counts against it.
LEDGER = SessionLedger()
# Capacity waits end this share of the call's deadline before it (within bounds), so
# that they end with CapacityReachedError rather than racing the deadline's
# CallTimeoutError on a busy loop.
_MARGIN_SHARE, _MARGIN_MIN, _MARGIN_MAX = 0.1, 0.02, 0.5
_ids = itertools.count(1)
_pid = os.getpid()


def _after_fork_in_child() -> None:
    # The parent's sessions are not the child's: a forked child starts with none, and
    # the permits its inherited clients held are not held any more.
    global _pid
    _pid = os.getpid()
    LEDGER.reset()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def check_mode(mode: object) -> CapacityMode:
    """Validate ``on_capacity``.

    Raises:
        ValueError: it is neither ``"raise"`` nor ``"wait"``.
    """
    if mode not in ("raise", "wait"):
        raise ValueError(f"on_capacity must be 'raise' or 'wait', got {mode!r}")
    return mode


class _Waker:
    """One waiting caller: a future on its own loop, woken from any thread."""

    __slots__ = ("future", "id", "loop")

    def __init__(self) -> None:
        self.id = next(_ids)
        self.loop = asyncio.get_running_loop()
        self.future: asyncio.Future[None] = self.loop.create_future()

    def wake(self) -> None:
        def done() -> None:
            if not self.future.done():
                self.future.set_result(None)
        # A closed loop has nobody waiting on it any more.
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(done)


_wakers: dict[int, _Waker] = {}


def _wake(token: object) -> None:
    waker = _wakers.pop(token, None) if isinstance(token, int) else None
    if waker is not None:
        waker.wake()


class CapacityGate:
    """One client's permit on its endpoint and its waits for capacity.

    Args:
        key: the endpoint (its ``/ws`` URL, no credentials).
        limits: the client's own :class:`Limits` (``None``: the process-wide ones,
            read at each session's start).
        mode: ``"raise"`` or ``"wait"``.
        fleet: the fleet's shared limits (``None``: none): a session also takes a
            slot of the fleet's, waiting for it in arrival order across processes, and
            a ``CAPACITY_REACHED`` lowers the endpoint's shared limit and is retried.
        providers: the client's tracer and meter providers (for the fleet's waits).
    """

    def __init__(self, key: str, limits: Limits | None, mode: CapacityMode,
                 fleet: FleetLimits | None = None,
                 providers: Providers | None = None) -> None:
        if limits is not None and not isinstance(limits, Limits):
            raise TypeError(f"limits must be an envlink.Limits or None, "
                            f"got {type(limits).__name__}")
        self.key = key
        self.limits = limits
        self.mode: CapacityMode = check_mode(mode)
        self._held_pid: int | None = None
        self._acquiring: asyncio.Future[None] | None = None
        self.fleet = fleet
        self._providers = providers
        #: The fleet's slot held with the permit (``None``: no fleet, or none yet).
        self._hold: Hold | None = None

    @property
    def held(self) -> bool:
        """Whether this client holds a permit (it has, or is opening, a session)."""
        return self._held_pid == _pid

    def passes(self, method: str) -> bool:
        """Whether ``method`` needs nothing of the gate (the hot path: a held permit)."""
        return self._held_pid == _pid and self.mode == "raise" and method != "disconnect"

    def _limit(self) -> int | None:
        return (self.limits or get_limits()).max_sessions_per_endpoint

    def release(self) -> None:
        """Give the permit back (the client's session ended); idempotent."""
        held, self._held_pid = self.held, None
        hold, self._hold = self._hold, None
        if not held:
            return
        if hold is not None and self.fleet is not None:
            from envlink._fleet.worker import fleet_for
            fleet_for(self.fleet).release(hold)
        granted, watcher = LEDGER.release(self.key)
        _wake(granted)
        _wake(watcher)

    async def call(self, method: str, seconds: float | None,
                   attempt: Callable[[], Awaitable[_R]]) -> _R:
        """Run one call of the client under its permit; inside the call's deadline.

        Args:
            method: the client method.
            seconds: the call's deadline (its waits end just before it).
            attempt: runs the call once.

        Raises:
            CapacityReachedError: the endpoint is full (locally or on the server) and
                ``on_capacity`` is ``"raise"``, or it stayed full until the deadline.
        """
        if method in ("close", "disconnect"):
            try:
                return await attempt()
            finally:
                if method == "disconnect":
                    self.release()
        start = time.monotonic()
        expires = None if seconds is None else start + seconds - min(
            max(seconds * _MARGIN_SHARE, _MARGIN_MIN), _MARGIN_MAX)
        acquired = False
        if not self.held:
            pending = self._acquiring
            if pending is not None and not pending.done():
                # Another caller of this client is getting its permit: one is enough.
                await asyncio.shield(pending)
            if not self.held:
                mine = self._acquiring = asyncio.get_running_loop().create_future()
                try:
                    await self._acquire(expires)
                finally:
                    self._acquiring = None
                    if not mine.done():
                        mine.set_result(None)
                acquired = True
        try:
            if acquired and self.fleet is not None:
                return await self._with_fleet(self.fleet, attempt, expires)
            if self.mode == "raise":
                return await attempt()
            return await self._with_retries(attempt, expires)
        except (CapacityReachedError, ConnectError, FleetStoreError):
            # No session was opened: the permit is not this client's to keep.
            if acquired:
                self.release()
            raise
        except BaseException:
            if acquired and method == "connect":
                self.release()
            raise

    async def _acquire(self, expires: float | None) -> None:
        limit = self._limit()
        if self.mode == "raise" or limit is None:
            if not LEDGER.try_acquire(self.key, limit):
                raise _local_refusal(self.key, limit)
            self._held_pid = _pid
            return
        waker = _Waker()
        _wakers[waker.id] = waker
        if LEDGER.acquire(self.key, limit, waker.id):
            _wakers.pop(waker.id, None)
            self._held_pid = _pid
            return
        try:
            left = _left(expires)
            if left is None:
                await waker.future
            else:
                await asyncio.wait_for(asyncio.shield(waker.future), max(0.0, left))
        except BaseException as exc:
            _wakers.pop(waker.id, None)
            if not LEDGER.cancel(self.key, waker.id):
                # The permit was handed over as we gave up: pass it on to the next.
                self._held_pid = _pid
                self.release()
            if isinstance(exc, asyncio.TimeoutError):
                raise _local_refusal(self.key, limit, waited=True) from None
            raise
        self._held_pid = _pid

    async def _with_fleet(self, limits: FleetLimits, attempt: Callable[[], Awaitable[_R]],
                          expires: float | None) -> _R:
        # A slot of the fleet's for the session, in arrival order across processes;
        # the server's refusal lowers the endpoint's shared limit, and the session
        # queues again under it, until the deadline.
        from envlink._fleet.backend import session_scope
        from envlink._fleet.worker import PLACING_TURN, fleet_for
        fleet = fleet_for(limits)
        scope = session_scope(self.key)
        # A pool's session in the queue: once all of them are, its turn passes on.
        turn = PLACING_TURN.get()
        while True:
            self._hold = await fleet.session(self.key, expires, self._providers,
                                             None if turn is None else turn.placed)
            turn = None
            try:
                return await attempt()
            except CapacityReachedError as exc:
                if (exc.details or {}).get("local"):
                    raise
                hold, self._hold = self._hold, None
                try:
                    await fleet.call_async(lambda store: store.refused(
                        scope, limits.max_sessions_per_endpoint))
                except FleetStoreError:
                    if limits.on_store_error == "raise":
                        raise
                finally:
                    if hold is not None:
                        fleet.release(hold)
                left = _left(expires)
                if left is not None and left <= 0:
                    raise
                if hold is None or hold.local:
                    # No shared queue to wait in (the store is unreachable): back off.
                    await asyncio.sleep(min(0.05, left if left is not None else 0.05))

    async def _with_retries(self, attempt: Callable[[], Awaitable[_R]],
                            expires: float | None) -> _R:
        key = self.key

        def retryable(exc: BaseException) -> bool:
            return isinstance(exc, CapacityReachedError)

        async def sleep(seconds: float) -> None:
            # The backoff (cut to end at the deadline by the loop), cut short when a
            # session of this endpoint ends.
            waker = _Waker()
            _wakers[waker.id] = waker
            LEDGER.watch(key, waker.id)
            try:
                await asyncio.wait_for(asyncio.shield(waker.future), max(0.0, seconds))
            except asyncio.TimeoutError:
                pass
            finally:
                _wakers.pop(waker.id, None)
                LEDGER.unwatch(key, waker.id)

        async def one(_: int) -> _R:
            return await attempt()

        # Tries go on until one ends at the deadline, the last backoff cut to end there.
        # A wait, not a retry of a failure: no try cap, and the client's retry budget
        # is not spent.
        retry = Retry(CAPACITY_POLICY, operation="capacity", sleep=sleep,
                      retry_on=retryable, deadline=expires, waiting=True)
        return await retry.run(one)


def _left(expires: float | None) -> float | None:
    if expires is None:
        return None
    return max(0.0, expires - time.monotonic())


def _local_refusal(key: str, limit: int | None, *, waited: bool = False) -> CapacityReachedError:
    held = LEDGER.held(key)
    how = "stayed full until the call's deadline" if waited else "is full"
    return CapacityReachedError(
        f"the process's session limit for {key} ({limit} per endpoint, "
        f"envlink.Limits) {how}", active_sessions=held, max_sessions=limit,
        details={"local": True})
