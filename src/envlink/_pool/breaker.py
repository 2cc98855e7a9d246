"""A circuit breaker per endpoint: stop sending sessions to a server that keeps failing. No I/O.

Closed: traffic flows; ``failure_threshold`` consecutive connection failures open
it. Open: no new session is placed there until ``reset_timeout`` seconds have
passed; then it is half-open and lets exactly one probe through. The probe's
success closes it, its failure opens it again for another ``reset_timeout``.
Only failures to *reach* the server count (refused, reset, timed-out connects):
a server that answers, even with an error frame or ``CAPACITY_REACHED``, is up.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable

from envlink._config import check_number

__all__ = ["BreakerState", "CircuitBreaker"]


class BreakerState(str, enum.Enum):
    """The state of a :class:`CircuitBreaker`."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class CircuitBreaker:
    """One endpoint's breaker.

    Args:
        failure_threshold: consecutive connection failures that open it.
        reset_timeout: seconds it stays open before letting one probe through.
        clock: monotonic clock in seconds (injectable for tests).
        on_change: called with ``(old, new)`` on every transition.

    Raises:
        TypeError: ``failure_threshold`` is not an int, or ``reset_timeout`` not a number.
        ValueError: ``failure_threshold`` < 1 or ``reset_timeout`` < 0.
    """

    def __init__(self, failure_threshold: int = 3, reset_timeout: float = 5.0, *,
                 clock: Callable[[], float] = time.monotonic,
                 on_change: Callable[[BreakerState, BreakerState], None] | None = None,
                 ) -> None:
        check_number(failure_threshold, "failure_threshold", integer=True, minimum=1)
        check_number(reset_timeout, "reset_timeout", minimum=0)
        self.failure_threshold = failure_threshold
        self.reset_timeout = float(reset_timeout)
        self._clock = clock
        self._on_change = on_change
        self._state = BreakerState.CLOSED
        self._failures = 0
        self._opened_at = 0.0
        self._probing = False

    @property
    def state(self) -> BreakerState:
        """The current state (an open breaker past its timeout reads as half-open)."""
        if self._state is BreakerState.OPEN and self._timed_out():
            self._move(BreakerState.HALF_OPEN)
        return self._state

    def peek(self) -> BreakerState:
        """The state :attr:`state` would read now, without moving it (no ``on_change``).

        A plain read, safe from any thread (metric collection reads it).
        """
        state = self._state
        if state is BreakerState.OPEN and self._timed_out():
            return BreakerState.HALF_OPEN
        return state

    @property
    def consecutive_failures(self) -> int:
        """Connection failures since the last success."""
        return self._failures

    def retry_in(self) -> float:
        """Seconds until an open breaker lets a probe through (0 if it would now)."""
        if self._state is not BreakerState.OPEN:
            return 0.0
        return max(0.0, self._opened_at + self.reset_timeout - self._clock())

    def allow(self) -> bool:
        """Whether a new connection may be tried now; in half-open, claims the one probe."""
        state = self.state
        if state is BreakerState.CLOSED:
            return True
        if state is BreakerState.HALF_OPEN and not self._probing:
            self._probing = True
            return True
        return False

    def available(self) -> bool:
        """Whether :meth:`allow` would say yes, without claiming the probe."""
        state = self.state
        return state is BreakerState.CLOSED or (
            state is BreakerState.HALF_OPEN and not self._probing)

    def record_success(self) -> None:
        """A connection to the endpoint worked: close the breaker."""
        self._failures = 0
        self._probing = False
        if self._state is not BreakerState.CLOSED:
            self._move(BreakerState.CLOSED)

    def record_failure(self) -> None:
        """A connection to the endpoint failed."""
        self._failures += 1
        probing, self._probing = self._probing, False
        if probing or self._state is BreakerState.HALF_OPEN or (
                self._state is BreakerState.CLOSED
                and self._failures >= self.failure_threshold):
            self._opened_at = self._clock()
            self._move(BreakerState.OPEN)
        elif self._state is BreakerState.OPEN:
            # A session placed before the breaker opened failed too: the outage goes on.
            self._opened_at = self._clock()

    def release_probe(self) -> None:
        """The probe ended without telling anything about the endpoint (e.g. cancelled)."""
        self._probing = False

    def _timed_out(self) -> bool:
        return self._clock() - self._opened_at >= self.reset_timeout

    def _move(self, new: BreakerState) -> None:
        old, self._state = self._state, new
        if self._on_change is not None and old is not new:
            self._on_change(old, new)

    def __repr__(self) -> str:
        return (f"CircuitBreaker({self.state.value}, failures={self._failures}/"
                f"{self.failure_threshold})")
