"""The one retry primitive: every retry envlink makes goes through :class:`Retry`. No I/O.

Opening a connection, resending a request, resuming and replaying a session all
retry the same way: tenacity's ``AsyncRetrying`` with

- ``stop_after_attempt(max_attempts)``: :attr:`ReconnectPolicy.max_attempts` is
  the most tries of one operation, the first included, whatever the operation;
- ``stop_before_delay(max_elapsed)``: never start a backoff that would end past
  the elapsed-time cap, only to give up after it;
- or, for a *wait* (readiness, a capacity wait, a training adapter's opening step),
  ``deadline=`` (or ``waiting=True`` without one): no try cap; the backoff is cut to
  end at the deadline and one last try is made then, so the wait ends at its
  deadline, never before it;
- ``wait_random_exponential`` (full jitter; ``wait_exponential`` without jitter),
  raised to the server's ``Retry-After`` when it sent one;
- a retry predicate (:func:`~envlink._sansio.policies.is_retryable` for connects,
  the caller's own for the other operations);
- the shared :class:`RetryBudget`, charged before *every* retry of a failure: a retry
  the budget refuses ends the loop with :class:`RetryBudgetExhaustedError`. A wait's
  tries are not retries of a failure: a wait neither spends the budget nor earns it
  back.

Sleep and clock are injected: the asyncio driver passes ``asyncio.sleep`` and
``time.monotonic``, unit tests pass fakes. :func:`~envlink.set_testing` removes
every wait.
"""

from __future__ import annotations

import copy
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
    stop_before_delay,
    stop_never,
    wait_none,
)
from tenacity.stop import stop_base
from tenacity.wait import wait_base

from envlink._errors import HandshakeRejectedError, RetryBudgetExhaustedError
from envlink._sansio.policies import ReconnectPolicy, is_retryable, testing_enabled

__all__ = [
    "BackoffDetails",
    "Clock",
    "Retry",
    "Sleep",
    "again",
    "carried",
    "succeeded",
]

_T = TypeVar("_T")
#: The least time a try of a wait with a deadline gets, the last one (made at the
#: deadline) included: such a wait ends within ``deadline + LAST_TRY``, never before.
LAST_TRY = 0.5

#: An async sleep: ``asyncio.sleep`` in the driver, a recorder in tests.
Sleep = Callable[[float], Awaitable[None]]
#: A monotonic clock in seconds.
Clock = Callable[[], float]


class _Again(Exception):
    """Raised by an attempt to ask for another try because of ``error`` (:func:`again`).

    Control flow inside a :class:`Retry` loop only: :class:`Retry` retries it, and
    when the tries are used up raises ``error`` itself, never this wrapper.
    """

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


def again(error: BaseException) -> Exception:
    """What an attempt raises to ask for another try because of ``error``.

    For operations whose retry rule is decided case by case (the session core's
    idempotency rules): the :class:`Retry` loop tries again, and when the tries are
    used up raises ``error`` itself, never the request.
    """
    return _Again(error)


def carried(exc: BaseException) -> BaseException:
    """``exc``, or the error a request for another try (:func:`again`) carries."""
    return exc.error if isinstance(exc, _Again) else exc


def _again(exc: BaseException) -> bool:
    return isinstance(exc, _Again)


@dataclass(frozen=True)
class BackoffDetails:
    """What a retry loop reports before it sleeps and tries again.

    Attributes:
        operation: what is retried: ``"connect"``, ``"resend"``, ``"resume"`` or
            ``"replay"``.
        attempt: the number of the attempt that just failed (1 for the first).
        delay: seconds until the next attempt.
        error: the failure that caused the retry.
    """

    operation: str
    attempt: int
    delay: float
    error: BaseException | None


class _HonourRetryAfter(wait_base):
    """The policy's backoff, never shorter than a ``Retry-After`` the server sent."""

    def __init__(self, inner: wait_base) -> None:
        self._inner = inner

    def __call__(self, retry_state: RetryCallState) -> float:
        delay = float(self._inner(retry_state))
        outcome = retry_state.outcome
        exc = outcome.exception() if outcome is not None else None
        if isinstance(exc, HandshakeRejectedError) and exc.retry_after is not None:
            delay = max(delay, exc.retry_after)
        return delay


class _UntilDeadline(stop_base):
    """Stop once a try has ended at or after ``deadline`` (on the injected clock)."""

    def __init__(self, deadline: float, clock: Clock) -> None:
        self._deadline = deadline
        self._clock = clock

    def __call__(self, retry_state: RetryCallState) -> bool:
        return self._clock() >= self._deadline


class _EndAtDeadline(wait_base):
    """The inner wait, cut so that it ends at ``deadline``: the last try is made then."""

    def __init__(self, inner: wait_base, deadline: float, clock: Clock) -> None:
        self._inner = inner
        self._deadline = deadline
        self._clock = clock

    def __call__(self, retry_state: RetryCallState) -> float:
        delay = float(self._inner(retry_state))
        return max(0.0, min(delay, self._deadline - self._clock()))


class _OnClock(stop_base):
    """Evaluate a time-based tenacity stop against an injected clock."""

    def __init__(self, inner: stop_base, clock: Clock, start: float | None = None) -> None:
        self._inner = inner
        self._clock = clock
        self._start = clock() if start is None else start

    def __call__(self, retry_state: RetryCallState) -> bool:
        view = copy.copy(retry_state)
        view.start_time = self._start
        view.outcome_timestamp = self._clock()
        return bool(self._inner(view))


def succeeded(policy: ReconnectPolicy, result: _T) -> _T:
    """A first try succeeded: the shared budget earns back a fraction of a token."""
    budget = policy.budget
    if budget is not None:
        budget.record_success()
    return result


class Retry:
    """One retry loop of one operation under a :class:`ReconnectPolicy`.

    Args:
        policy: attempts, elapsed-time cap, backoff and budget.
        operation: what is retried (``connect``, ``resend``, ``resume``, ``replay``),
            reported in :class:`BackoffDetails`.
        sleep: the async sleep to wait with.
        clock: the monotonic clock the elapsed-time cap is measured on.
        retry_on: whether a failure may be retried (default: ``is_retryable``);
            a request for another try (:func:`again`) is always retried.
        attempts_used: tries of this operation already spent (a flapping
            connection continues its outage's count).
        backoff: wait between tries; ``False`` retries at once (an operation whose
            every try starts with a connect, which backs off itself).
        on_backoff: told before each wait; may raise to end the loop.
        rng: draw jitter from this generator (reproducible delays).
        deadline: for a wait that must last until a moment (on ``clock``): tries
            go on until one ends at or after it, each backoff cut to end at it, so
            the last try is made at the deadline. The policy's ``max_elapsed`` still
            applies; a waiting caller sets it to ``None``. Makes the loop a wait.
        waiting: the loop is a wait (implied by ``deadline``): the policy's
            ``max_attempts`` does not cap it and its budget is neither charged nor
            credited; without a deadline it ends only at ``max_elapsed``, if any.
    """

    def __init__(
        self,
        policy: ReconnectPolicy,
        *,
        operation: str,
        sleep: Sleep,
        clock: Clock = time.monotonic,
        retry_on: Callable[[BaseException], bool] = is_retryable,
        attempts_used: int = 0,
        backoff: bool = True,
        on_backoff: Callable[[BackoffDetails], None] | None = None,
        rng: random.Random | None = None,
        deadline: float | None = None,
        waiting: bool = False,
    ) -> None:
        self.policy = policy
        self.operation = operation
        self.attempts_used = attempts_used
        #: Tries made by the last :meth:`run` (or ``async for``) of this loop.
        self.tries = 0
        self._sleep = sleep
        self._clock = clock
        self._retry_on = retry_on
        self._backoff = backoff
        self._on_backoff = on_backoff
        self._rng = rng
        self._deadline = deadline
        self._waiting = waiting or deadline is not None

    def time_for_try(self) -> float | None:
        """Seconds a try may take: to the deadline, at least :data:`LAST_TRY` (``None``:
        no deadline)."""
        deadline = self._deadline
        return None if deadline is None else max(deadline - self._clock(), LAST_TRY)

    def retrying(self, start: float | None = None) -> AsyncRetrying:
        """A fresh tenacity ``AsyncRetrying`` for this loop (for ``async for``).

        Args:
            start: when the operation began on :attr:`clock` (default: now); the
                elapsed-time cap counts from it.
        """
        policy = self.policy
        stop: stop_base
        if self._waiting:
            stop = stop_never  # a wait ends at its deadline (or max_elapsed), never a count
        else:
            stop = stop_after_attempt(max(1, policy.max_attempts - self.attempts_used))
        if policy.max_elapsed is not None:
            stop = stop | _OnClock(stop_before_delay(policy.max_elapsed), self._clock, start)
        wait: wait_base = (_HonourRetryAfter(policy.wait(self._rng))
                           if self._backoff else wait_none())
        if self._deadline is not None:
            stop = stop | _UntilDeadline(self._deadline, self._clock)
            wait = _EndAtDeadline(wait, self._deadline, self._clock)
        return AsyncRetrying(
            stop=stop,
            wait=wait,
            retry=retry_if_exception(_again) | retry_if_exception(self._retry_on),
            sleep=self._wait,
            reraise=True,
            before_sleep=self._before_sleep,
        )

    async def run(self, attempt: Callable[[int], Awaitable[_T]]) -> _T:
        """Call ``attempt(n)`` until it succeeds or the policy gives up.

        ``n`` counts this operation's tries from 1, including ``attempts_used``.
        A success earns the budget back a fraction of a token.

        Raises:
            The last failure when it is not retryable or the tries are used up;
            RetryBudgetExhaustedError: the shared budget refused a retry.
        """
        return await self.continue_after(None, attempt, self._clock())

    async def continue_after(self, first: BaseException | None,
                             attempt: Callable[[int], Awaitable[_T]], start: float) -> _T:
        """:meth:`run` after a first try made by the caller failed with ``first``.

        For the per-call hot path (the driver's resend), which makes its first try
        itself and builds this loop only once that failed: the one first-try fast
        path. The result is what :meth:`run` would have given.

        Args:
            first: the first try's failure (``None``: no try made yet, as :meth:`run`).
            attempt: as for :meth:`run`.
            start: when the first try began, on :attr:`clock`.
        """
        self.tries = 0 if first is None else 1
        pending: BaseException | None = first
        try:
            async for state in self.retrying(start):
                with state:
                    if pending is not None:
                        failed, pending = pending, None
                        raise failed  # tenacity decides from the first try's outcome
                    self.tries += 1
                    result = await attempt(self.tries + self.attempts_used)
        except _Again as request:
            error: BaseException | None = request.error
        else:
            error = None
        if error is not None:
            raise error  # outside the handler: its context stays the original one
        return self._succeeded(result)

    def _succeeded(self, result: _T) -> _T:
        if self._waiting:
            return result  # a wait's success is no retry's: the budget earns nothing
        return succeeded(self.policy, result)

    async def _wait(self, seconds: float) -> None:
        if seconds > 0 and not testing_enabled():
            await self._sleep(seconds)

    def _before_sleep(self, state: RetryCallState) -> None:
        outcome = state.outcome
        exc = outcome.exception() if outcome is not None else None
        exc = carried(exc) if exc is not None else None
        budget = self.policy.budget
        if budget is not None and not self._waiting and not budget.try_spend():
            raise RetryBudgetExhaustedError(
                f"the shared retry budget refused a {self.operation} retry"
            ) from exc
        if self._on_backoff is not None:
            self._on_backoff(BackoffDetails(
                operation=self.operation, attempt=state.attempt_number + self.attempts_used,
                delay=float(state.upcoming_sleep), error=exc,
            ))
