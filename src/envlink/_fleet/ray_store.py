"""The fleet's budget inside a Ray cluster: a named actor (``store="ray:NAME"``).

The state lives in one actor (:class:`LeaseBook`, made a Ray actor on first use,
detached so it outlives the process that made it, and found by name by every other
process of the cluster, shard actors included). Slots and queue places are leases on
the actor's clock, renewed by each process's worker in one call for all of them, so
a lost node's slots come back when they expire. Every call is bounded by
``FleetLimits.store_timeout``; a dead or unreachable actor is a ``FleetStoreError``.
"""

from __future__ import annotations

import itertools
import time
from collections import OrderedDict
from typing import Any

from envlink._errors import FleetStoreError
from envlink._fleet.backend import TOTAL, ScopeStatus, Want
from envlink._fleet.settings import effective_limit, lowered_limit, pace_window

__all__ = ["LeaseBook", "RayStore"]

#: (token, scope, limit or -1, total or -1) of one want, as sent to the actor.
_Wire = tuple[str, str, int, int]


class LeaseBook:
    """The fleet's state as leases, in one process (the actor). No I/O.

    Args:
        clock: the actor's clock (injectable for tests).
    """

    def __init__(self, clock: Any = time.time) -> None:
        self._clock = clock
        self._tickets = itertools.count(1)
        #: scope -> waiting token -> its expiry; insertion order is arrival order.
        self._queues: dict[str, OrderedDict[str, float]] = {}
        #: the session waiters with a total, in arrival order: token -> expiry.
        self._sessions: OrderedDict[str, float] = OrderedDict()
        #: scope -> token -> expiry.
        self._holders: dict[str, dict[str, float]] = {}
        self._lowered: dict[str, tuple[int, float]] = {}
        self._configured: dict[str, int] = {}
        self._paces: dict[str, list[float]] = {}

    def _prune(self, now: float) -> None:
        for queue in self._queues.values():
            for token in [t for t, exp in queue.items() if exp < now]:
                del queue[token]
        for token in [t for t, exp in self._sessions.items() if exp < now]:
            del self._sessions[token]
        for holders in self._holders.values():
            for token in [t for t, exp in holders.items() if exp < now]:
                del holders[token]

    def _limit(self, scope: str, configured: int | None, now: float, every: float
               ) -> int | None:
        lowered = self._lowered.get(scope)
        if lowered is None:
            return configured
        return effective_limit(configured, lowered[0], lowered[1], now, every)

    def join(self, want: _Wire, lease: float) -> int:
        token, scope, limit, total = want
        now = self._clock()
        self._queues.setdefault(scope, OrderedDict())[token] = now + lease
        if total >= 0:
            self._sessions[token] = now + lease
            self._configured[TOTAL] = total
        if limit >= 0:
            self._configured[scope] = limit
        return next(self._tickets)

    def join_all(self, wants: list[_Wire], lease: float) -> list[int]:
        return [self.join(want, lease) for want in wants]

    def grant(self, wants: list[_Wire], lease: float, every: float
              ) -> list[tuple[bool, int, int | None]]:
        now = self._clock()
        self._prune(now)
        out = []
        for token, scope, limit, total in wants:
            queue = self._queues.setdefault(scope, OrderedDict())
            holders = self._holders.setdefault(scope, {})
            cap = self._limit(scope, None if limit < 0 else limit, now, every)
            ok = next(iter(queue), None) == token and (cap is None or len(holders) < cap)
            if ok and total >= 0:
                ok = (next(iter(self._sessions), None) == token
                      and len(self._holders.setdefault(TOTAL, {})) < total)
            if ok:
                holders[token] = now + lease
                if total >= 0:
                    self._holders[TOTAL][token] = now + lease
                queue.pop(token, None)
                self._sessions.pop(token, None)
            out.append((ok, len(holders), cap))
        return out

    def leave(self, token: str, scope: str) -> None:
        self._queues.get(scope, OrderedDict()).pop(token, None)
        self._sessions.pop(token, None)

    def release(self, wants: list[tuple[str, str]]) -> None:
        for token, scope in wants:
            self._holders.get(scope, {}).pop(token, None)
            self._holders.get(TOTAL, {}).pop(token, None)

    def renew(self, wants: list[tuple[str, str]], lease: float) -> None:
        expiry = self._clock() + lease
        for token, scope in wants:
            for table in (self._holders.get(scope, {}), self._holders.get(TOTAL, {}),
                          self._queues.get(scope, OrderedDict()), self._sessions):
                if token in table:
                    table[token] = expiry

    def refused(self, scope: str, configured: int, every: float) -> int:
        now = self._clock()
        self._prune(now)
        current = self._limit(scope, None if configured < 0 else configured, now, every)
        new = lowered_limit(current, len(self._holders.get(scope, {})))
        self._lowered[scope] = (new, now)
        return new

    def pace(self, name: str, rate: float) -> float:
        window, most = pace_window(rate)
        now = self._clock()
        recent = [t for t in self._paces.get(name, []) if t > now - window]
        if len(recent) < most:
            recent.append(now)
            self._paces[name] = recent
            return 0.0
        self._paces[name] = recent
        return max(0.001, float(min(recent) + window - now))

    def status(self, every: float) -> list[dict[str, Any]]:
        now = self._clock()
        self._prune(now)
        scopes = sorted(set(self._queues) | set(self._holders))
        return [ScopeStatus(scope, len(self._holders.get(scope, {})),
                            len(self._queues.get(scope, {})),
                            self._limit(scope, self._configured.get(scope), now, every),
                            sorted({t.rsplit(":", 1)[0]
                                    for t in self._holders.get(scope, {})})).as_dict()
                for scope in scopes]


def _wire(want: Want) -> _Wire:
    return (want.token, want.scope, -1 if want.limit is None else want.limit,
            -1 if want.total is None else want.total)


class RayStore:
    """The budget of every process of a Ray cluster that names the same actor.

    Args:
        name: the actor's name (``store="ray:NAME"``).
        timeout: the longest one call may take.
        every: seconds after which a lowered limit grows by one.
        lease: seconds a slot or a queue place lives without renewal.
    """

    poll = 0.05

    def __init__(self, name: str, timeout: float, every: float, lease: float) -> None:
        self.shown = f"ray:{name}"
        self.timeout = timeout
        self.every = every
        self.lease = lease
        self.seen: dict[str, tuple[int, int | None]] = {}
        try:
            import ray
        except ImportError:
            raise FleetStoreError("a ray: store needs Ray: pip install 'envlink[ray]'",
                                  store=self.shown) from None
        self._ray = ray
        try:
            if not ray.is_initialized():
                raise FleetStoreError(f"the fleet store {self.shown} needs Ray started "
                                      "(ray.init) in this process", store=self.shown)
            actor = ray.remote(num_cpus=0)(LeaseBook)
            self._actor = actor.options(name=name, namespace="envlink-fleet",
                                        lifetime="detached", get_if_exists=True).remote()
        except FleetStoreError:
            raise
        except Exception as exc:
            raise FleetStoreError(f"the fleet store {self.shown} could not be made or "
                                  f"found: {type(exc).__name__}", store=self.shown) from None

    def _get(self, method: str, *args: Any) -> Any:
        try:
            return self._ray.get(getattr(self._actor, method).remote(*args),
                                 timeout=self.timeout)
        except Exception as exc:
            raise FleetStoreError(f"the fleet store {self.shown} could not be reached: "
                                  f"{type(exc).__name__}", store=self.shown) from None

    def join(self, wants: list[Want]) -> None:
        tickets = self._get("join_all", [_wire(w) for w in wants], self.lease)
        for want, ticket in zip(wants, tickets, strict=True):
            want.ticket = int(ticket)

    def grant(self, wants: list[Want]) -> list[bool]:
        out = self._get("grant", [_wire(w) for w in wants], self.lease, self.every)
        for want, (_, held, limit) in zip(wants, out, strict=True):
            self.seen[want.scope] = (held, limit)
        return [bool(ok) for ok, _, _ in out]

    def leave(self, want: Want) -> None:
        self._get("leave", want.token, want.scope)

    def release(self, wants: list[Want]) -> None:
        self._get("release", [(w.token, w.scope) for w in wants])

    def renew(self, wants: list[Want]) -> None:
        self._get("renew", [(w.token, w.scope) for w in wants], self.lease)

    def refused(self, scope: str, configured: int | None) -> int:
        return int(self._get("refused", scope, -1 if configured is None else configured,
                             self.every))

    def limit(self, scope: str, configured: int | None) -> int | None:
        for row in self.status():
            if row.scope == scope:
                return row.limit if row.limit is not None else configured
        return configured

    def holders(self, scope: str) -> int:
        return next((row.holders for row in self.status() if row.scope == scope), 0)

    def pace(self, name: str, rate: float) -> float:
        return float(self._get("pace", name, rate))

    def status(self) -> list[ScopeStatus]:
        return [ScopeStatus(**row) for row in self._get("status", self.every)]

    def close(self) -> None:
        """The actor stays: other processes use it."""
