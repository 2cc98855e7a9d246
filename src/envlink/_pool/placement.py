"""Where a pool's sessions go: least-loaded endpoint first, capacity- and breaker-aware. No I/O.

Each :class:`PoolServer` counts the pool's sessions placed on it (or being placed),
remembers the server's session limit once a ``CAPACITY_REACHED`` frame told it,
and has a :class:`~envlink._pool.breaker.CircuitBreaker`. :class:`Placement` picks the
endpoint for the next session: among those whose breaker lets traffic through,
that are not known to be full, the one with the fewest of the pool's sessions.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from envlink._config import redact_url
from envlink._errors import InvalidURLError
from envlink._pool.breaker import BreakerState, CircuitBreaker
from envlink._sansio.policies import ReconnectPolicy

__all__ = ["PoolServer", "Placement", "parse_endpoints"]

_DEFAULT_PORTS = {"http": 80, "ws": 80, "https": 443, "wss": 443}


def parse_endpoints(endpoints: str | Sequence[str]) -> list[tuple[str, str, int]]:
    """``(url, host, port)`` for each endpoint URL, in order.

    Raises:
        TypeError: ``endpoints`` is neither a URL nor a sequence of URLs.
        ValueError: no endpoint, or a duplicate.
        InvalidURLError: (a ``ValueError``) a URL that is not http(s)/ws(s) with a host
            and a valid port.
    """
    urls = [endpoints] if isinstance(endpoints, str) else list(endpoints)
    if not urls:
        raise ValueError("EnvPool needs at least one endpoint")
    out: list[tuple[str, str, int]] = []
    seen: set[str] = set()
    for url in urls:
        if not isinstance(url, str):
            raise TypeError(f"an endpoint must be a URL string, got {type(url).__name__}")
        shown = redact_url(url)
        try:
            parts = urlsplit(url)
            scheme, host = parts.scheme, parts.hostname
        except ValueError:  # unparsable (a broken IPv6 literal)
            scheme, host = "", None
        if scheme not in _DEFAULT_PORTS or not host:
            raise InvalidURLError(f"endpoint {shown!r} must be an http(s):// or ws(s):// URL "
                                  "with a host", argument="endpoints", url=shown)
        try:
            port = parts.port or _DEFAULT_PORTS[scheme]
        except ValueError:
            port = 0
        if not port:
            raise InvalidURLError(f"endpoint {shown!r} has an invalid port (not 1 to 65535)",
                                  argument="endpoints", url=shown)
        key = url.rstrip("/")
        if key in seen:
            raise ValueError(f"endpoint {redact_url(url)!r} is listed twice")
        seen.add(key)
        out.append((url, host, port))
    return out


@dataclass(eq=False)
class PoolServer:
    """One server of the pool, as the pool sees it (its load and its breaker).

    Attributes:
        url: the base URL sessions are opened on.
        host: its host (``server.address`` in telemetry).
        port: its port (``server.port`` in telemetry).
        breaker: its circuit breaker.
        sessions: the pool's sessions on it, those being placed included.
        server_max: the server's session limit, once a ``CAPACITY_REACHED`` said it.
        refusals: consecutive ``CAPACITY_REACHED`` answers since the last placement.
        full_until: monotonic time before which the endpoint is treated as full.
    """

    url: str
    host: str
    port: int
    breaker: CircuitBreaker
    sessions: int = 0
    server_max: int | None = None
    refusals: int = 0
    full_until: float = 0.0
    index: int = field(default=0, repr=False)

    @property
    def display(self) -> str:
        """The URL safe to show (no userinfo, secret query values redacted)."""
        return redact_url(self.url)

    @property
    def address(self) -> str:
        """``host:port``."""
        return f"{self.host}:{self.port}"


class Placement:
    """Chooses endpoints for new sessions and keeps the per-endpoint counts.

    Args:
        endpoints: ``(url, host, port)`` of each endpoint (see :func:`parse_endpoints`).
        make_breaker: builds each endpoint's breaker (called with the endpoint's index).
        capacity_backoff: delays after ``CAPACITY_REACHED`` (grows with consecutive
            refusals of one endpoint).
        clock: monotonic clock in seconds (injectable for tests).
    """

    def __init__(self, endpoints: Sequence[tuple[str, str, int]],
                 make_breaker: Callable[[int], CircuitBreaker], *,
                 capacity_backoff: ReconnectPolicy,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.endpoints: list[PoolServer] = [
            PoolServer(url, host, port, make_breaker(i), index=i)
            for i, (url, host, port) in enumerate(endpoints)
        ]
        self._backoff = capacity_backoff
        self._clock = clock

    def _has_room(self, ep: PoolServer, now: float) -> bool:
        if now < ep.full_until:
            return False
        return ep.server_max is None or ep.sessions < ep.server_max

    def choose(self, exclude: frozenset[PoolServer] | set[PoolServer] = frozenset()
               ) -> PoolServer | None:
        """The endpoint for the next session, or ``None`` if none can take one now.

        The choice is reserved at once (its ``sessions`` count grows), so that a
        batch of placements spreads out; call :meth:`release` if it is not used.
        A half-open breaker's single probe is claimed by the choice.
        """
        now = self._clock()
        best: PoolServer | None = None
        for ep in self.endpoints:
            if ep in exclude or not self._has_room(ep, now) or not ep.breaker.available():
                continue
            if best is None or self._load(ep) < self._load(best):
                best = ep
        if best is None or not best.breaker.allow():
            return None
        best.sessions += 1
        return best

    @staticmethod
    def _load(ep: PoolServer) -> tuple[float, int]:
        # Fewest of our sessions first; where the server's limit is known, the share
        # of it that we use breaks ties (a bigger server takes more); then list order.
        share = ep.sessions / ep.server_max if ep.server_max else 0.0
        return (ep.sessions + share, ep.index)

    def release(self, ep: PoolServer) -> None:
        """One of the pool's sessions left ``ep`` (or a reservation was not used)."""
        ep.sessions = max(0, ep.sessions - 1)
        # A slot we held there is free now: it may take a waiting session at once.
        ep.full_until = 0.0

    def placed(self, ep: PoolServer) -> None:
        """A session was opened on ``ep``: the server is up and had room."""
        ep.refusals = 0
        ep.breaker.record_success()

    def refused(self, ep: PoolServer, *, active_sessions: int | None,
                max_sessions: int | None) -> None:
        """``ep`` answered ``CAPACITY_REACHED`` (the reservation is released too).

        The server is up (its breaker records a success). It is treated as full for
        a backoff delay that grows with consecutive refusals, or until one of the
        pool's own sessions there ends. When the server said its limit, the pool
        never places more of its sessions there than that limit.
        """
        ep.sessions = max(0, ep.sessions - 1)
        ep.breaker.record_success()
        if max_sessions is not None and max_sessions > 0:
            ep.server_max = max_sessions
        ep.refusals += 1
        ep.full_until = self._clock() + max(self._backoff.delay(ep.refusals), 0.001)

    def unreachable(self, ep: PoolServer) -> None:
        """A connection to ``ep`` failed (the reservation is released too)."""
        ep.sessions = max(0, ep.sessions - 1)
        ep.breaker.record_failure()

    def next_change(self) -> float:
        """Seconds until some endpoint may take a session again (``inf``: unknown)."""
        now = self._clock()
        soonest = math.inf
        for ep in self.endpoints:
            if ep.breaker.state is BreakerState.OPEN:
                wait = ep.breaker.retry_in()
                if now < ep.full_until:
                    wait = max(wait, ep.full_until - now)
            elif now < ep.full_until:
                wait = ep.full_until - now
            else:
                continue
            soonest = min(soonest, wait)
        return soonest
