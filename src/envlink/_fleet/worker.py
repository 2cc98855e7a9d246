"""A process's side of the fleet's budget: one worker thread per store.

Every store operation of the process runs on that thread, so an event loop never
blocks on a file lock or a Redis round trip, and the thread is the one timer a
process keeps for its held slots (Redis and Ray leases are renewed in one call for
all of them). Callers wait on futures: ``await Fleet.acquire(...)`` on a loop,
``Fleet.acquire_blocking(...)`` in a thread (a provider start). A store that cannot be
reached fails its waiters with :class:`~envlink.FleetStoreError`, or, with
``on_store_error="local"``, lets them through (the process's own limits still apply).
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import contextvars
import os
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from envlink._errors import CapacityReachedError, FleetStoreError
from envlink._fleet.backend import STARTS, Store, Want, session_scope
from envlink._fleet.reporting import Providers, record_wait
from envlink._fleet.settings import FleetLimits

__all__ = ["PLACING", "PLACING_TURN", "Fleet", "Hold", "PlacingTurn", "fleet_for",
           "open_store"]

#: The scope of a pool's turn to place its sessions (one pool at a time, fleet-wide).
PLACING = "@placing"

_T = TypeVar("_T")


def open_store(limits: FleetLimits) -> Store:
    """The backend ``limits.store`` names (its client made, nothing held yet).

    Raises:
        FleetStoreError: the store cannot be used.
    """
    kind = limits.kind
    if kind == "redis":
        try:
            from envlink._fleet.redis_store import RedisStore
        except ImportError:
            raise FleetStoreError("a redis:// store needs the redis client: pip install "
                                  "'envlink[redis]'", store=limits.shown_store) from None
        return RedisStore(limits.store, limits.store_timeout, limits.increase_every,
                          limits.lease)
    if kind == "ray":
        from envlink._fleet.ray_store import RayStore
        return RayStore(limits.store[4:], limits.store_timeout, limits.increase_every,
                        limits.lease)
    from envlink._fleet.directory import DirectoryStore
    return DirectoryStore(limits.store, limits.store_timeout, limits.increase_every)


@dataclass(eq=False)
class Hold:
    """A slot a caller holds (``local``: granted while the store was unreachable)."""

    want: Want
    local: bool = False


class PlacingTurn:
    """A pool's turn to queue its sessions, ended once each of them is in the queue (or
    by the pool at the end of the batch, whichever comes first): a pool's wants are then
    one after another in the queue, which serves them in that order.

    Args:
        fleet: the process's fleet.
        hold: the turn's slot.
        sessions: how many sessions the pool places in this turn.
    """

    def __init__(self, fleet: Fleet, hold: Hold, sessions: int) -> None:
        self._fleet = fleet
        self._hold = hold
        self._left = sessions
        self._ended = False

    def placed(self) -> None:
        """One of the pool's sessions is in the queue (called on the fleet's worker)."""
        self._left -= 1
        if self._left <= 0:
            self.end()

    def end(self) -> None:
        """Give the turn to the next pool; idempotent."""
        if not self._ended:
            self._ended = True
            self._fleet.release(self._hold)


#: The turn of the pool whose batch is running (the slots' tasks inherit it).
PLACING_TURN: contextvars.ContextVar[PlacingTurn | None] = contextvars.ContextVar(
    "envlink_placing_turn", default=None)


class _Wait:
    __slots__ = ("future", "joined", "on_joined", "want")

    def __init__(self, want: Want, on_joined: Callable[[], None] | None = None) -> None:
        self.want = want
        self.on_joined = on_joined
        self.future: concurrent.futures.Future[Hold] = concurrent.futures.Future()
        self.joined = False


class Fleet:
    """This process's use of one store: its waiters, its held slots, its worker thread.

    Args:
        limits: the fleet's settings.
    """

    def __init__(self, limits: FleetLimits) -> None:
        self.limits = limits
        self._cond = threading.Condition()
        self._new: list[_Wait] = []
        self._waiting: list[_Wait] = []
        self._leaving: list[_Wait] = []
        self._releases: list[Want] = []
        self._ops: list[tuple[Callable[[Store], Any], concurrent.futures.Future[Any]]] = []
        self._held: dict[str, Want] = {}
        self._store: Store | None = None
        self._thread: threading.Thread | None = None
        self._closed = False
        self._renewed = time.monotonic()
        #: Polls in a row that granted nothing: the next poll waits longer (up to 50 ms).
        self._misses = 0
        #: The last holders and limit seen per scope (for telemetry and errors).
        self.seen: dict[str, tuple[int, int | None]] = {}

    # ------------------------------------------------------------------ callers

    async def acquire(self, scope: str, limit: int | None, total: int | None,
                      expires: float | None, kind: str,
                      providers: Providers | None = None,
                      on_joined: Callable[[], None] | None = None) -> Hold:
        """Wait (FIFO across processes) for a slot of ``scope``, until ``expires``;
        ``on_joined`` is called (on the worker) once the want is in the queue.

        Raises:
            CapacityReachedError: no slot came before ``expires`` (``details["fleet"]``).
            FleetStoreError: the store cannot be reached (``on_store_error="raise"``).
        """
        start = time.monotonic()
        wait = self._submit(Want(scope, limit, total), on_joined)
        try:
            left = None if expires is None else max(0.0, expires - time.monotonic())
            hold = await asyncio.wait_for(asyncio.wrap_future(wait.future), left)
        except asyncio.TimeoutError:
            self._give_up(wait)
            raise self._refusal(scope, limit, time.monotonic() - start) from None
        except BaseException:
            self._give_up(wait)
            raise
        self._report(kind, scope, time.monotonic() - start, providers)
        return hold

    def acquire_blocking(self, scope: str, limit: int | None, expires: float | None,
                         kind: str) -> Hold:
        """:meth:`acquire` for a thread that may block (a provider start)."""
        start = time.monotonic()
        wait = self._submit(Want(scope, limit))
        try:
            left = None if expires is None else max(0.0, expires - time.monotonic())
            hold = wait.future.result(left)
        except concurrent.futures.TimeoutError:
            self._give_up(wait)
            raise self._refusal(scope, limit, time.monotonic() - start) from None
        except BaseException:
            self._give_up(wait)
            raise
        self._report(kind, scope, time.monotonic() - start, None)
        return hold

    def _report(self, kind: str, scope: str, waited: float,
                providers: Providers | None) -> None:
        holders, limit = self.seen.get(scope, (None, None))
        record_wait(kind, scope, waited, holders, limit, providers)

    def release(self, hold: Hold) -> None:
        """Give a slot back (at once for this process, in the store on the worker)."""
        if hold.local:
            return
        with self._cond:
            if self._held.pop(hold.want.token, None) is None:
                return
            self._releases.append(hold.want)
            self._cond.notify()

    def call(self, op: Callable[[Store], _T], timeout: float | None = None) -> _T:
        """Run ``op`` on the store, on the worker thread, and return its result (blocking).

        Raises:
            FleetStoreError: the store cannot be reached.
        """
        future: concurrent.futures.Future[_T] = concurrent.futures.Future()
        with self._cond:
            self._ops.append((op, future))
            self._start()
            self._cond.notify()
        return future.result(timeout if timeout is not None else self.limits.store_timeout * 3)

    async def call_async(self, op: Callable[[Store], _T]) -> _T:
        """:meth:`call` awaited on a loop."""
        future: concurrent.futures.Future[_T] = concurrent.futures.Future()
        with self._cond:
            self._ops.append((op, future))
            self._start()
            self._cond.notify()
        return await asyncio.wrap_future(future)

    def refused(self, scope: str, configured: int | None) -> int | None:
        """Tell the store the server refused a session of ``scope``; the limit now."""
        try:
            return self.call(lambda store: store.refused(scope, configured))
        except FleetStoreError:
            if self.limits.on_store_error == "raise":
                raise
            return configured

    async def pace(self, name: str, rate: float, expires: float | None, kind: str,
                   providers: Providers | None = None) -> None:
        """Wait for one of ``rate`` per second of ``name`` (fleet-wide), until ``expires``."""
        start = time.monotonic()
        while True:
            wait = await self.call_async(lambda store: self._paced(store, name, rate))
            if wait <= 0:
                break
            wait += random.uniform(0, wait * self.limits.jitter)
            if expires is not None and time.monotonic() + wait > expires:
                raise self._refusal(name, None, time.monotonic() - start, paced=rate)
            await asyncio.sleep(wait)
        self._report(kind, name, time.monotonic() - start, providers)

    def pace_blocking(self, name: str, rate: float, expires: float | None, kind: str) -> None:
        """:meth:`pace` for a thread that may block."""
        start = time.monotonic()
        while True:
            wait = self.call(lambda store: self._paced(store, name, rate))
            if wait <= 0:
                break
            wait += random.uniform(0, wait * self.limits.jitter)
            if expires is not None and time.monotonic() + wait > expires:
                raise self._refusal(name, None, time.monotonic() - start, paced=rate)
            time.sleep(wait)
        self._report(kind, name, time.monotonic() - start, None)

    def _paced(self, store: Store, name: str, rate: float) -> float:
        try:
            return store.pace(name, rate)
        except FleetStoreError:
            if self.limits.on_store_error == "local":
                return 0.0
            raise

    def _refusal(self, scope: str, limit: int | None, waited: float,
                 paced: float | None = None) -> CapacityReachedError:
        holders, now = self.seen.get(scope, (None, limit))
        what = (f"turn of its pace of {paced:g} per second" if paced is not None
                else f"slot of {scope} (limit {now}, {holders} held)")
        return CapacityReachedError(
            f"the fleet's shared limits ({self.limits.shown_store}) gave no {what} in "
            f"{waited:.3g} s, before the call's deadline",
            active_sessions=holders, max_sessions=now, details={"fleet": True, "local": True})

    # ------------------------------------------------------------------ session helpers

    async def session(self, endpoint: str, expires: float | None,
                      providers: Providers | None = None,
                      on_joined: Callable[[], None] | None = None) -> Hold:
        """Pace (``session_rate``), then a session slot of ``endpoint``."""
        limits = self.limits
        if limits.session_rate is not None:
            await self.pace("@session-opens", limits.session_rate, expires, "session_rate",
                            providers)
        return await self.acquire(session_scope(endpoint), limits.max_sessions_per_endpoint,
                                  limits.max_sessions, expires, "session", providers,
                                  on_joined)

    @contextlib.contextmanager
    def provider_start(self, expires: float | None) -> Iterator[None]:
        """Around one provider start (blocking): its pace, then a start slot."""
        limits = self.limits
        hold = None
        if limits.max_provider_starts is not None:
            hold = self.acquire_blocking(STARTS, limits.max_provider_starts, expires,
                                         "provider_start")
        try:
            # The turn last, right before the start: the pace is of starts, not of waits.
            if limits.provider_start_rate is not None:
                self.pace_blocking("@provider-starts", limits.provider_start_rate, expires,
                                   "provider_start_rate")
            yield
        finally:
            if hold is not None:
                self.release(hold)

    # ------------------------------------------------------------------ the worker

    def _submit(self, want: Want, on_joined: Callable[[], None] | None = None) -> _Wait:
        wait = _Wait(want, on_joined)
        with self._cond:
            if self._closed:
                raise FleetStoreError("the fleet's store was closed (the process is ending)",
                                      store=self.limits.shown_store)
            self._new.append(wait)
            self._start()
            self._cond.notify()
        return wait

    def _give_up(self, wait: _Wait) -> None:
        if not wait.future.cancel():
            # Granted (or failed) as the caller gave up: a granted slot goes back.
            try:
                hold = wait.future.result(self.limits.store_timeout)
            except BaseException:
                return
            self.release(hold)
            return
        with self._cond:
            self._leaving.append(wait)
            self._cond.notify()

    def _start(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, daemon=True,
                                            name="envlink-fleet")
            self._thread.start()

    def _run(self) -> None:
        while True:
            with self._cond:
                renew_every = self.limits.lease / 3
                while not (self._new or self._leaving or self._releases or self._ops
                           or self._closed):
                    if self._waiting:
                        timeout = self._poll()
                    elif self._held:
                        timeout = max(0.0, self._renewed + renew_every - time.monotonic())
                    else:
                        timeout = None
                    if timeout == 0.0 or not self._cond.wait(timeout):
                        break
                new, self._new = self._new, []
                leaving, self._leaving = self._leaving, []
                releases, self._releases = self._releases, []
                ops, self._ops = self._ops, []
                closed = self._closed
            self._work(new, leaving, releases, ops)
            if closed:
                return

    def _poll(self) -> float:
        # Waiting costs the host little: polls that found nothing come less often, and a
        # grant or a release of the process's own brings them back to the store's pace.
        store = self._store
        base = store.poll if store is not None else 0.05
        return min(base * (1 << min(self._misses, 8)), max(base, 0.05))

    def _open(self) -> Store:
        if self._store is None:
            self._store = open_store(self.limits)
        return self._store

    def _work(self, new: list[_Wait], leaving: list[_Wait], releases: list[Want],
              ops: list[tuple[Callable[[Store], Any], concurrent.futures.Future[Any]]]) -> None:
        self._waiting.extend(new)
        if new or releases:
            self._misses = 0
        try:
            store = self._open()
            if releases:
                store.release(releases)
            for wait in leaving:
                if wait in self._waiting:
                    self._waiting.remove(wait)
                if wait.joined:
                    store.leave(wait.want)
            joining = [wait for wait in self._waiting if not wait.joined]
            if joining:
                store.join([wait.want for wait in joining])
                for wait in joining:
                    wait.joined = True
                    if wait.on_joined is not None:
                        with contextlib.suppress(Exception):
                            wait.on_joined()
            for op, future in ops:
                try:
                    future.set_result(op(store))
                except BaseException as exc:
                    future.set_exception(exc)
            ops = []
            if self._waiting:
                self._grant(store)
            if time.monotonic() - self._renewed >= self.limits.lease / 3:
                with self._cond:
                    held = list(self._held.values())
                # The queue places are leases too (Redis, Ray): kept with the slots.
                held += [w.want for w in self._waiting]
                if held:
                    store.renew(held)
                self._renewed = time.monotonic()
        except FleetStoreError as exc:
            self._store_failed(exc, ops)

    def _grant(self, store: Store) -> None:
        waiting = self._waiting
        granted = store.grant([w.want for w in waiting])
        self._misses = 0 if any(granted) else self._misses + 1
        # Before a caller wakes: it reports what the store held.
        self.seen.update(store.seen)
        keep = []
        for wait, ok in zip(waiting, granted, strict=True):
            if not ok:
                keep.append(wait)
                continue
            hold = Hold(wait.want)
            with self._cond:
                self._held[wait.want.token] = wait.want
            if wait.future.cancelled() or not wait.future.set_running_or_notify_cancel():
                self.release(hold)
                continue
            wait.future.set_result(hold)
        self._waiting = keep

    def _store_failed(self, exc: FleetStoreError, ops: list[tuple[Any, Any]]) -> None:
        for _, future in ops:
            if not future.done():
                future.set_exception(exc)
        local = self.limits.on_store_error == "local"
        for wait in self._waiting:
            if wait.future.cancelled() or not wait.future.set_running_or_notify_cancel():
                continue
            if local:
                wait.future.set_result(Hold(wait.want, local=True))
            else:
                wait.future.set_exception(exc)
        self._waiting = []

    def close(self) -> None:
        """Give back every slot this process holds (at exit), bounded."""
        with self._cond:
            self._releases.extend(self._held.values())
            self._held.clear()
            self._closed = True
            self._cond.notify()
            thread = self._thread
        if thread is not None and thread.is_alive():
            thread.join(self.limits.store_timeout)


_fleets: dict[FleetLimits, Fleet] = {}
_fleets_lock = threading.Lock()


def fleet_for(limits: FleetLimits) -> Fleet:
    """The process's :class:`Fleet` of ``limits`` (one per distinct settings)."""
    with _fleets_lock:
        fleet = _fleets.get(limits)
        if fleet is None:
            fleet = _fleets[limits] = Fleet(limits)
        return fleet


def _after_fork_in_child() -> None:
    # The parent's slots and worker are not the child's.
    global _fleets_lock
    _fleets_lock = threading.Lock()
    _fleets.clear()


def _at_exit() -> None:
    with _fleets_lock:
        fleets = list(_fleets.values())
    for fleet in fleets:
        fleet.close()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_at_exit)
