"""Reconnect, retry-budget and session-recovery policies. No I/O.

The reconnect loop is built on tenacity; delays come from a pure function of the
attempt number (exponential backoff with full jitter), the server's
``Retry-After`` is honoured, and a shared :class:`RetryBudget` (gRPC-style token
bucket) stops a fleet of clients from stampeding a recovering server.
:func:`set_testing` removes every wait, for tests.
"""

from __future__ import annotations

import contextlib
import random
import threading
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Literal

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
    stop_after_delay,
)
from tenacity.stop import stop_base

from envlink._config import check_count, check_timeout
from envlink._errors import (
    ConnectError,
    ConnectionLostError,
    HandshakeRejectedError,
    RetryBudgetExhaustedError,
)

__all__ = [
    "ReconnectPolicy",
    "RetryBudget",
    "SessionLostPolicy",
    "build_retrying",
    "is_retryable",
    "set_testing",
    "testing_enabled",
]

SessionLostPolicy = Literal["raise", "replay", "resume"]


class RetryBudget:
    """A token bucket shared by clients, after gRPC's retry throttling.

    Each retry spends one token; each success earns ``token_ratio`` tokens, up to
    ``max_tokens``. Retries are allowed only while more than half the bucket is
    left, so when most calls in a fleet fail, retries stop instead of multiplying
    the load on a recovering server. Thread-safe: one budget may serve clients on
    many threads and loops.

    Args:
        max_tokens: bucket size.
        token_ratio: tokens earned per success.
    """

    def __init__(self, max_tokens: float = 10.0, token_ratio: float = 0.1) -> None:
        for name, value in (("max_tokens", max_tokens), ("token_ratio", token_ratio)):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"{name} must be a number, got {type(value).__name__}")
            if not value > 0 or value == float("inf"):
                raise ValueError(f"{name} must be a positive finite number, got {value!r}")
        self.max_tokens = float(max_tokens)
        self.token_ratio = float(token_ratio)
        self._tokens = float(max_tokens)
        self._lock = threading.Lock()

    @property
    def tokens(self) -> float:
        """Tokens currently in the bucket."""
        return self._tokens

    def try_spend(self) -> bool:
        """Spend a token for one retry; ``False`` if retries are throttled."""
        with self._lock:
            if self._tokens <= self.max_tokens / 2:
                return False
            self._tokens = max(0.0, self._tokens - 1.0)
            return True

    def record_success(self) -> None:
        """Earn back ``token_ratio`` tokens after a successful call or connection."""
        with self._lock:
            self._tokens = min(self.max_tokens, self._tokens + self.token_ratio)

    def __repr__(self) -> str:
        return f"RetryBudget(tokens={self._tokens:.2f}/{self.max_tokens})"


@dataclass(frozen=True)
class ReconnectPolicy:
    """How and how long to try (re)connecting.

    Attributes:
        max_attempts: connection attempts per outage, the first included.
        max_elapsed: give up after this many seconds of trying (``None``: no cap).
        initial_delay: cap of the first backoff delay, in seconds.
        max_delay: cap of any single delay.
        multiplier: growth of the delay cap per attempt.
        jitter: ``"full"`` draws each delay uniformly in ``[0, cap]`` (AWS "full
            jitter"); ``"none"`` uses the cap itself.
        stable_after: a connection that lived this long counts as stable: a drop
            after it starts a new outage with a fresh attempt count; a drop before
            it continues the previous outage's count (flapping is bounded too).
        budget: a shared :class:`RetryBudget`, or ``None``.
    """

    max_attempts: int = 5
    max_elapsed: float | None = 30.0
    initial_delay: float = 0.1
    max_delay: float = 5.0
    multiplier: float = 2.0
    jitter: Literal["full", "none"] = "full"
    stable_after: float = 30.0
    budget: RetryBudget | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        check_count(self.max_attempts, "max_attempts", minimum=1)
        check_timeout(self.max_elapsed, "max_elapsed")
        for name in ("initial_delay", "max_delay", "stable_after"):
            if check_timeout(getattr(self, name), name, allow_zero=True) is None:
                raise TypeError(f"{name} must be a number of seconds, got None")
        if isinstance(self.multiplier, bool) or not isinstance(self.multiplier, (int, float)):
            raise TypeError(f"multiplier must be a number, got {type(self.multiplier).__name__}")
        if not self.multiplier >= 1:
            raise ValueError(f"multiplier must be >= 1, got {self.multiplier!r}")
        if self.jitter not in ("full", "none"):
            raise ValueError(f"jitter must be 'full' or 'none', got {self.jitter!r}")
        if self.budget is not None and not isinstance(self.budget, RetryBudget):
            raise TypeError(f"budget must be a RetryBudget or None, "
                            f"got {type(self.budget).__name__}")

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Backoff before connection attempt ``attempt + 1`` (``attempt`` >= 1)."""
        cap = min(self.max_delay, self.initial_delay * self.multiplier ** (attempt - 1))
        if self.jitter == "none":
            return cap
        return (rng or random).uniform(0.0, cap)

    def delays(self, rng: random.Random | None = None) -> Iterator[float]:
        """The successive delays of one outage (pure; for inspection and tests)."""
        for attempt in range(1, self.max_attempts):
            yield self.delay(attempt, rng)


def is_retryable(exc: BaseException) -> bool:
    """Whether a failed connection attempt may be retried.

    Refused, reset, timed-out connections and 5xx/429 handshake answers are
    retryable; 401/403/404 and protocol violations are fatal.
    """
    if isinstance(exc, RetryBudgetExhaustedError):
        return False
    if isinstance(exc, HandshakeRejectedError):
        return exc.retryable
    if isinstance(exc, ConnectError):
        return exc.retryable
    return isinstance(exc, ConnectionLostError)


_testing = False


@contextlib.contextmanager
def set_testing(enabled: bool = True) -> Iterator[None]:
    """Remove every backoff wait while the context is active (for tests).

    Restores the previous setting on exit.
    """
    global _testing
    previous = _testing
    _testing = enabled
    try:
        yield
    finally:
        _testing = previous


def testing_enabled() -> bool:
    """Whether :func:`set_testing` currently removes backoff waits."""
    return _testing


class _Wait:
    def __init__(self, policy: ReconnectPolicy) -> None:
        self.policy = policy

    def __call__(self, state: RetryCallState) -> float:
        delay = self.policy.delay(state.attempt_number)
        exc = state.outcome.exception() if state.outcome is not None else None
        if isinstance(exc, HandshakeRejectedError) and exc.retry_after is not None:
            # The server said when to come back; never earlier than that.
            delay = max(delay, exc.retry_after)
        return delay


class _StopAfterElapsed(stop_base):
    def __init__(self, max_elapsed: float) -> None:
        self.max_elapsed = max_elapsed

    def __call__(self, state: RetryCallState) -> bool:
        # Also stop if the next wait would cross the cap, rather than sleeping
        # past it only to give up.
        upcoming = state.upcoming_sleep or 0.0
        return (state.seconds_since_start or 0.0) + upcoming >= self.max_elapsed


def build_retrying(
    policy: ReconnectPolicy,
    *,
    sleep: Callable[[float], Awaitable[None]],
    attempts_used: int = 0,
    before_sleep: Callable[[RetryCallState], Awaitable[None] | None] | None = None,
) -> AsyncRetrying:
    """A tenacity ``AsyncRetrying`` for one outage under ``policy``.

    Args:
        policy: the reconnect policy.
        sleep: the async sleep (the caller's I/O layer supplies it; this module has none).
        attempts_used: attempts already spent on this outage (a flapping connection).
        before_sleep: hook called before each backoff sleep (telemetry, logs).
    """
    remaining = max(1, policy.max_attempts - attempts_used)
    stop: stop_base = stop_after_attempt(remaining)
    if policy.max_elapsed is not None:
        stop = stop | _StopAfterElapsed(policy.max_elapsed) | stop_after_delay(policy.max_elapsed)
    return AsyncRetrying(
        stop=stop,
        wait=_Wait(policy),
        retry=retry_if_exception(is_retryable),
        sleep=sleep,
        reraise=True,
        before_sleep=before_sleep,
    )
