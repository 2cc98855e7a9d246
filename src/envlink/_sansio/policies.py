"""Reconnect, retry-budget and session-recovery policies. No I/O.

What a retry may do is decided here; how it is done is ``_sansio/retry.py`` (the one
retry primitive, on tenacity). Delays are tenacity's exponential backoff with
full jitter (``wait_random_exponential``), and a shared :class:`RetryBudget`
(gRPC-style token bucket) stops a fleet of clients from stampeding a recovering
server. :func:`set_testing` removes every wait, for tests.
"""

from __future__ import annotations

import contextlib
import enum
import random
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from tenacity import RetryCallState, wait_exponential, wait_random_exponential
from tenacity.wait import wait_base

from envlink._config import check_count, check_number, check_timeout
from envlink._errors import (
    ConnectError,
    ConnectionLostError,
    HandshakeRejectedError,
    RetryBudgetExhaustedError,
)

__all__ = [
    "SESSION_LOST_POLICIES",
    "idempotent_mcp",
    "ReconnectPolicy",
    "RetryBudget",
    "POOL_NO_AUTO",
    "POOL_SESSION_LOST_POLICIES",
    "PoolSessionLostPolicy",
    "RecoveryMechanism",
    "RecoveryPolicy",
    "SessionLostPolicy",
    "is_retryable",
    "set_testing",
    "testing_enabled",
]

class RecoveryPolicy(str, enum.Enum):
    """What the user asks for when a session is lost mid-episode: ``on_session_lost``.

    Str-valued: ``"auto"`` and ``RecoveryPolicy.AUTO`` are the same value everywhere.
    """

    #: Nothing is rebuilt: the caller gets ``SessionLostError`` with the journal.
    RAISE = "raise"
    #: A new session, the journal replayed and verified.
    REPLAY = "replay"
    #: Re-attach to the same server session (envlink's or OpenEnv's mechanism).
    RESUME = "resume"
    #: Resume where the server can, else replay.
    AUTO = "auto"

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return self.value.__format__(spec)


class RecoveryMechanism(str, enum.Enum):
    """What carries (or would carry) a lost session on: ``client.recovery`` and the
    ``mechanism`` of events and telemetry. A policy comes to one of these per session,
    by what the server offered (:meth:`SessionCore.recovery_plan`).

    Str-valued: the values are the names telemetry has always emitted.
    """

    #: Nothing applies: the caller gets the journal.
    RAISE = "raise"
    #: A new session, the journal replayed and verified.
    REPLAY = "replay"
    #: envlink's extension: re-attach by resume token, the server de-duplicates requests.
    ENVLINK_RESUME = "envlink-resume"
    #: OpenEnv 0.10's detached sessions: re-attach with ``/ws?session_id=``, settle an
    #: interrupted step from the session's ``step_count``.
    OPENENV_RESUME = "openenv-resume"

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return self.value.__format__(spec)


#: The type of ``on_session_lost`` in signatures: :class:`RecoveryPolicy`'s values (a
#: type checker needs them spelled out; a test holds the two together).
SessionLostPolicy = Literal["raise", "replay", "resume", "auto"]
#: The ``on_session_lost`` values of a client.
SESSION_LOST_POLICIES: tuple[SessionLostPolicy, ...] = tuple(p.value for p in RecoveryPolicy)
PoolSessionLostPolicy = Literal["raise", "replay", "resume"]
#: The ``on_session_lost`` values of a pool: a client's, but ``"auto"``.
POOL_SESSION_LOST_POLICIES: tuple[PoolSessionLostPolicy, ...] = tuple(
    cast("PoolSessionLostPolicy", p.value) for p in RecoveryPolicy if p is not RecoveryPolicy.AUTO)
#: Why a pool does not take ``"auto"``.
POOL_NO_AUTO = ("a pool takes no 'auto': a client's 'auto' resumes on its own server or "
                "replays there, while a pool's 'replay' rebuilds on any endpoint and its "
                "'resume' stays on one; choose which")


def idempotent_mcp(method: str, data: Mapping[str, Any] | None) -> bool:
    """Whether an ``mcp`` request may be resent: listing tools reads only; a tool call
    may change the environment."""
    return method == "mcp" and data is not None and data.get("method") == "tools/list"


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
            check_number(value, name, above=0, finite=True, expected="a positive finite number")
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

    def __getstate__(self) -> dict[str, Any]:
        # A pickled budget (sent to another process: a Ray shard, a worker) is an
        # independent copy with the tokens it had; the lock is not shared.
        state = dict(self.__dict__)
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"RetryBudget(tokens={self._tokens:.2f}/{self.max_tokens})"


@dataclass(frozen=True)
class ReconnectPolicy:
    """How and how long to try (re)connecting.

    Attributes:
        max_attempts: the most tries of any one retried operation, the first
            included: opening a connection (per outage), sending one request,
            resuming or replaying a session. Every try after the first is a retry
            and spends a token of ``budget``.
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
        check_number(self.multiplier, "multiplier", minimum=1)
        if self.jitter not in ("full", "none"):
            raise ValueError(f"jitter must be 'full' or 'none', got {self.jitter!r}")
        if self.budget is not None and not isinstance(self.budget, RetryBudget):
            raise TypeError(f"budget must be a RetryBudget or None, "
                            f"got {type(self.budget).__name__}")

    def wait(self, rng: random.Random | None = None) -> wait_base:
        """This policy's backoff as a tenacity wait strategy.

        Full jitter is tenacity's ``wait_random_exponential`` (a delay drawn in
        ``[0, min(max_delay, initial_delay * multiplier ** (n - 1))]`` before try
        ``n + 1``); ``jitter="none"`` is ``wait_exponential`` (the cap itself).
        ``rng`` draws the jitter from a given generator (reproducible delays).
        """
        cap: dict[str, float] = {"multiplier": self.initial_delay, "max": self.max_delay,
                                 "exp_base": self.multiplier}
        if self.jitter == "none":
            return wait_exponential(**cap)
        if rng is None:
            return wait_random_exponential(**cap)
        return _SeededJitter(rng, **cap)

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Backoff before connection attempt ``attempt + 1`` (``attempt`` >= 1)."""
        state = RetryCallState(retry_object=None, fn=None, args=(), kwargs={})  # type: ignore[arg-type]
        state.attempt_number = attempt
        return float(self.wait(rng)(state))

    def delays(self, rng: random.Random | None = None) -> Iterator[float]:
        """The successive delays of one outage (pure; for inspection and tests)."""
        wait = self.wait(rng)
        state = RetryCallState(retry_object=None, fn=None, args=(), kwargs={})  # type: ignore[arg-type]
        for attempt in range(1, self.max_attempts):
            state.attempt_number = attempt
            yield float(wait(state))


class _SeededJitter(wait_random_exponential):
    """``wait_random_exponential`` drawing from a given ``random.Random``."""

    def __init__(self, rng: random.Random, **cap: float) -> None:
        super().__init__(**cap)
        self._rng = rng

    def __call__(self, retry_state: RetryCallState) -> float:
        high = wait_exponential.__call__(self, retry_state)
        return self._rng.uniform(self.min, high)


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
