"""The fleet's shared limits as a value: :class:`FleetLimits`, and the rules every store
applies (the additive increase after a decrease, the pace's window). No I/O."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Literal

from envlink._config import check_count, check_number, redact_url

__all__ = ["FleetLimits", "StoreErrorMode", "effective_limit", "lowered_limit", "pace_window"]

#: What a process does when the store cannot be reached: fail, or go on under its own limits.
StoreErrorMode = Literal["raise", "local"]


@dataclass(frozen=True)
class FleetLimits:
    """Session, start and open-rate limits shared by every process with the same store.

    Given as ``ClientConfig(fleet=...)`` (so pools, Ray shards, the adapters and the
    harness factory get it), it makes every process whose ``FleetLimits`` has the same
    ``store`` count against one budget. A step never touches the store: only opening
    or closing a session and starting a provider do. Waiters are served in arrival
    order across processes. Picklable as its settings. See ``docs/fleet.md``.

    Args:
        store: where the budget lives: a directory path (one host; slots are held by
            ``flock`` on files, so a dead process's slots come back at once),
            ``"redis://host:port/db"`` (many hosts; slots are leases renewed while
            held), or ``"ray:NAME"`` (a named Ray actor, inside a Ray cluster).
        max_sessions: the most sessions open at once in total, on every endpoint.
        max_sessions_per_endpoint: the most sessions open at once on one endpoint (its
            ``/ws`` URL). A ``CAPACITY_REACHED`` from the server lowers it for every
            process (to what the server held), and it grows back by one every
            ``increase_every`` seconds without a refusal.
        session_rate: the most session opens per second, fleet-wide.
        provider_start_rate: the most provider starts per second, fleet-wide.
        max_provider_starts: the most provider starts in flight, fleet-wide.
        on_store_error: ``"raise"`` (default): a store that cannot be reached raises
            :class:`~envlink.FleetStoreError`; ``"local"``: the process goes on under
            its own limits (``envlink.Limits``) alone until the store answers again.
        lease: seconds a Redis or Ray slot lives without renewal (renewed every third
            of it by one timer per process): a lost host's slots come back after it.
        increase_every: seconds without a refusal after which a lowered endpoint limit
            grows by one.
        store_timeout: the longest one store operation may take before it counts as
            unreachable.
        jitter: share of a pace's wait added at random, so that waiters do not wake
            together.

    Raises:
        TypeError: a value of the wrong type.
        ValueError: a value out of range, or a ``store`` that is none of the three.
    """

    store: str
    max_sessions: int | None = None
    max_sessions_per_endpoint: int | None = None
    session_rate: float | None = None
    provider_start_rate: float | None = None
    max_provider_starts: int | None = None
    on_store_error: StoreErrorMode = "raise"
    lease: float = 10.0
    increase_every: float = 5.0
    store_timeout: float = 2.0
    jitter: float = 0.1

    def __post_init__(self) -> None:
        store = self.store
        if isinstance(store, os.PathLike):
            store = os.fspath(store)
            object.__setattr__(self, "store", store)
        if not isinstance(store, str) or not store.strip():
            raise TypeError(f"store must be a directory path, a redis:// URL or 'ray:NAME', "
                            f"got {type(self.store).__name__}")
        if store.startswith("ray:") and not store[4:].strip():
            raise ValueError("store 'ray:NAME' needs the actor's name after 'ray:'")
        if "://" in store and not store.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(f"store must be a directory path, a redis:// URL or 'ray:NAME', "
                             f"got {redact_url(store)!r}")
        for name in ("max_sessions", "max_sessions_per_endpoint", "max_provider_starts"):
            value = getattr(self, name)
            if value is not None:
                check_count(value, name, minimum=1)
        for name in ("session_rate", "provider_start_rate"):
            check_number(getattr(self, name), name, above=0, finite=True, optional=True)
        if self.on_store_error not in ("raise", "local"):
            raise ValueError(f"on_store_error must be 'raise' or 'local', "
                             f"got {self.on_store_error!r}")
        for name in ("lease", "increase_every", "store_timeout"):
            check_number(getattr(self, name), name, above=0, finite=True)
        check_number(self.jitter, "jitter", minimum=0, maximum=1)

    @property
    def kind(self) -> Literal["directory", "redis", "ray"]:
        """Which backend ``store`` names."""
        if self.store.startswith(("redis://", "rediss://", "unix://")):
            return "redis"
        if self.store.startswith("ray:"):
            return "ray"
        return "directory"

    @property
    def shown_store(self) -> str:
        """``store`` without credentials, for errors, spans and logs."""
        return redact_url(self.store) if self.kind == "redis" else self.store

    def __repr__(self) -> str:
        shown = [f"store={self.shown_store!r}"]
        for name in ("max_sessions", "max_sessions_per_endpoint", "session_rate",
                     "provider_start_rate", "max_provider_starts"):
            value = getattr(self, name)
            if value is not None:
                shown.append(f"{name}={value!r}")
        if self.on_store_error != "raise":
            shown.append(f"on_store_error={self.on_store_error!r}")
        return f"FleetLimits({', '.join(shown)})"


def effective_limit(configured: int | None, lowered: int | None, since: float, now: float,
                    every: float) -> int | None:
    """An endpoint's limit now: ``configured``, or the ``lowered`` value of a refusal at
    ``since`` grown by one per ``every`` seconds since then, up to ``configured``."""
    if lowered is None:
        return configured
    grown = lowered + max(0, math.floor((now - since) / every))
    return grown if configured is None else min(configured, grown)


def lowered_limit(current: int | None, holders: int) -> int:
    """An endpoint's limit after the server refused a session while the fleet held
    ``holders`` there (the refused one included): at most what the server held."""
    base = holders if current is None else min(current, holders)
    return max(1, base - 1)


def pace_window(rate: float) -> tuple[float, int]:
    """The sliding window of a pace of ``rate`` per second: ``(seconds, most in it)``.

    No window of one second (or of ``1 / rate`` seconds, for a rate below one) holds more
    than ``rate`` of them; the window is 2 % longer, for the time between a caller's turn
    and what it does with it.
    """
    if rate >= 1:
        return _SPARE, max(1, math.floor(rate))
    return _SPARE / rate, 1


_SPARE = 1.02
