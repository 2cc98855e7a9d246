"""What every backend of the fleet's budget does: the :class:`Store` interface.

A store is used by one thread of a process (the fleet's worker, :mod:`.runtime`), so
its methods block; each is bounded by ``FleetLimits.store_timeout`` and raises
:class:`~envlink.FleetStoreError` when the store cannot be reached.

A *want* is one caller asking for one slot of a *scope*: the sessions of one endpoint
(``"session <ws url>"``), or the provider starts in flight (``"@starts"``). It joins
the scope's queue (arrival order, across processes), and :meth:`Store.grant` gives
it a slot once no live waiter is ahead of it and the scope (and, for a session, the
fleet's total) has room.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = ["STARTS", "TOTAL", "ScopeStatus", "Store", "Want", "session_scope"]

#: The scope of the provider starts in flight, and the fleet's total of sessions.
STARTS = "@starts"
TOTAL = "@total"

_tokens = itertools.count(1)


def session_scope(endpoint: str) -> str:
    """The scope of the sessions of one endpoint (its ``/ws`` URL)."""
    return f"session {endpoint}"


@dataclass(eq=False)
class Want:
    """One caller's request for one slot of ``scope``.

    Attributes:
        scope: what the slot is of.
        limit: the most slots of ``scope`` this caller's settings allow (``None``: no
            limit of the scope's own).
        total: the most sessions of the fleet in total, for a session (``None``: none).
        token: unique across processes and hosts: this want's name in the store.
        ticket: its place in the queue, set by the store when it joins.
    """

    scope: str
    limit: int | None
    total: int | None = None
    token: str = field(default_factory=lambda: f"{os.uname().nodename}:{os.getpid()}:"
                                                f"{next(_tokens)}")
    ticket: int = 0


@dataclass
class ScopeStatus:
    """One scope as a store sees it now (``envlink fleet status``)."""

    scope: str
    holders: int
    waiters: int
    limit: int | None
    processes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"scope": self.scope, "holders": self.holders, "waiters": self.waiters,
                "limit": self.limit, "processes": self.processes}


class Store(Protocol):
    """A backend of the fleet's budget (a directory, Redis, a Ray actor)."""

    #: Seconds between two polls of a store while callers wait on it.
    poll: float
    #: The holders and limit of each scope at the last :meth:`grant`.
    seen: dict[str, tuple[int, int | None]]

    def join(self, wants: list[Want]) -> None:
        """Queue ``wants``, in their order, behind every want that joined before: in one
        step, so that another process's wants never come between them."""

    def grant(self, wants: list[Want]) -> list[bool]:
        """Give a slot to each of ``wants`` (this process's, in the order they joined)
        that has no live waiter ahead of it and room; return which got one."""

    def leave(self, want: Want) -> None:
        """Withdraw a queued ``want`` (its caller gave up)."""

    def release(self, wants: list[Want]) -> None:
        """Give back the slots of ``wants``."""

    def renew(self, wants: list[Want]) -> None:
        """Keep the slots (and queue places) of ``wants`` alive: one call for all."""

    def refused(self, scope: str, configured: int | None) -> int:
        """The server refused a session of ``scope``: lower its limit; return it."""

    def limit(self, scope: str, configured: int | None) -> int | None:
        """The limit of ``scope`` now (``configured``, or lower after a refusal)."""

    def holders(self, scope: str) -> int:
        """Slots of ``scope`` held now, by every process."""

    def pace(self, name: str, rate: float) -> float:
        """Take one of ``rate`` per second of ``name`` if the window has room (return
        0.0), else return the seconds until it may have."""

    def status(self) -> list[ScopeStatus]:
        """Every scope's holders, waiters and limit."""

    def close(self) -> None:
        """Let go of the store (the slots still held are the process's until it ends)."""
