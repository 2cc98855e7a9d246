"""The one retry primitive: attempts, elapsed-time cap, budget, hooks, on a fake clock."""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable

import pytest

from envlink import (
    ConnectError,
    ConnectionLostError,
    HandshakeRejectedError,
    ReconnectPolicy,
    RetryBudget,
    RetryBudgetExhaustedError,
    set_testing,
)
from envlink._sansio.retry import BackoffDetails, Retry

pytestmark = pytest.mark.timeout(30)


class FakeTime:
    """A clock that only moves when the retry loop sleeps."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def failing(exc_factory: type[Exception] = ConnectError,
            ) -> tuple[list[int], Callable[[int], Awaitable[None]]]:
    numbers: list[int] = []

    async def attempt(number: int) -> None:
        numbers.append(number)
        raise exc_factory(f"try {number}")

    return numbers, attempt


async def test_elapsed_cap_stops_before_a_backoff_that_would_cross_it() -> None:
    """stop_before_delay on the injected clock: no sleep that would end past max_elapsed."""
    t = FakeTime()
    policy = ReconnectPolicy(max_attempts=100, max_elapsed=1.0, initial_delay=0.3,
                             multiplier=1.0, max_delay=0.3, jitter="none")
    numbers, attempt = failing()
    with set_testing(False), pytest.raises(ConnectError):
        await Retry(policy, operation="connect", sleep=t.sleep, clock=t.clock).run(attempt)
    # 0.3 + 0.3 + 0.3 = 0.9 elapsed; one more 0.3 wait would end at 1.2 > 1.0.
    assert t.slept == [0.3, 0.3, 0.3]
    assert numbers == [1, 2, 3, 4]


async def test_a_deadline_cuts_the_last_backoff_and_tries_once_more_at_it() -> None:
    """A wait with a deadline lasts until it: the backoff that would cross it is cut to
    end there, and one last try is made at the deadline (never a wait ended early)."""
    t = FakeTime()
    policy = ReconnectPolicy(max_attempts=100, max_elapsed=None, initial_delay=0.3,
                             multiplier=1.0, max_delay=0.3, jitter="none")
    numbers, attempt = failing()
    with set_testing(False), pytest.raises(ConnectError, match="try 5"):
        await Retry(policy, operation="ready", sleep=t.sleep, clock=t.clock,
                    deadline=t.now + 1.0).run(attempt)
    # 0.3 + 0.3 + 0.3, then the last wait cut to the 0.1 left: a try at the deadline.
    assert t.slept == pytest.approx([0.3, 0.3, 0.3, 0.1])
    assert t.now == pytest.approx(101.0)
    assert numbers == [1, 2, 3, 4, 5]


async def test_a_wait_ends_at_its_deadline_whatever_the_budget_and_the_try_cap() -> None:
    """A wait (deadline=) is no retry of a failure: a policy allowing 2 tries and an empty
    retry budget neither end it early; it neither spends nor earns the budget back."""
    t = FakeTime()
    budget = RetryBudget(max_tokens=2, token_ratio=0.5)
    assert budget.try_spend() and not budget.try_spend()  # down to half: it refuses now
    left = budget.tokens
    policy = ReconnectPolicy(max_attempts=2, max_elapsed=None, initial_delay=0.25,
                             multiplier=1.0, max_delay=0.25, jitter="none", budget=budget)
    numbers, attempt = failing()
    with set_testing(False), pytest.raises(ConnectError):
        await Retry(policy, operation="capacity", sleep=t.sleep, clock=t.clock,
                    deadline=t.now + 1.0).run(attempt)
    assert t.now == pytest.approx(101.0)
    assert numbers == [1, 2, 3, 4, 5]
    assert budget.tokens == left

    async def later(number: int) -> str:
        if number < 5:
            raise ConnectError("not yet")
        return "ready"

    assert await Retry(policy, operation="ready", sleep=t.sleep, clock=t.clock,
                       waiting=True).run(later) == "ready"
    assert budget.tokens == left


async def test_a_deadline_honours_a_longer_retry_after_only_up_to_the_deadline() -> None:
    """A server's Retry-After longer than the time left is cut to the deadline too."""
    t = FakeTime()

    async def attempt(number: int) -> None:
        raise HandshakeRejectedError(503, retry_after=5.0)

    with set_testing(False), pytest.raises(HandshakeRejectedError):
        await Retry(ReconnectPolicy(max_attempts=100, max_elapsed=None), operation="ready",
                    sleep=t.sleep, clock=t.clock, deadline=t.now + 2.0).run(attempt)
    assert t.slept == pytest.approx([2.0])


async def test_attempts_used_continue_the_count_and_shorten_the_loop() -> None:
    """A flapping outage's earlier tries count: numbering continues, fewer tries remain."""
    t = FakeTime()
    numbers, attempt = failing()
    with pytest.raises(ConnectError, match="try 5"):
        await Retry(ReconnectPolicy(max_attempts=5), operation="connect", sleep=t.sleep,
                    clock=t.clock, attempts_used=3).run(attempt)
    assert numbers == [4, 5]


async def test_every_retry_spends_the_budget_whatever_the_operation() -> None:
    """Resend, resume and replay retries are charged to the budget like connects."""
    for operation in ("connect", "resend", "resume", "replay"):
        budget = RetryBudget(max_tokens=4, token_ratio=0.1)
        policy = ReconnectPolicy(max_attempts=10, budget=budget)
        numbers, attempt = failing(ConnectionLostError)
        with pytest.raises(RetryBudgetExhaustedError) as info:
            await Retry(policy, operation=operation, sleep=FakeTime().sleep,
                        backoff=operation == "connect").run(attempt)
        assert numbers == [1, 2, 3], operation  # two retries allowed down to half the bucket
        assert isinstance(info.value.__cause__, ConnectionLostError)
        assert operation in str(info.value)


async def test_success_earns_budget_back_and_reports_tries() -> None:
    """A loop that succeeds records the success on the budget and counts its tries."""
    budget = RetryBudget(max_tokens=10, token_ratio=0.5)
    calls: list[int] = []

    async def attempt(number: int) -> str:
        calls.append(number)
        if number < 3:
            raise ConnectError("refused")
        return "ok"

    retry = Retry(ReconnectPolicy(budget=budget), operation="connect", sleep=FakeTime().sleep)
    assert await retry.run(attempt) == "ok"
    assert retry.tries == 3
    assert budget.tokens == 10 - 2 + 0.5  # two retries spent, one success earned back


async def test_backoff_hook_gets_a_frozen_record_per_retry() -> None:
    """on_backoff is told the operation, failed attempt, delay and error before each wait."""
    seen: list[BackoffDetails] = []
    _, attempt = failing()
    with pytest.raises(ConnectError):
        await Retry(ReconnectPolicy(max_attempts=3, jitter="none", initial_delay=0.5),
                    operation="connect", sleep=FakeTime().sleep, on_backoff=seen.append,
                    ).run(attempt)
    assert [(d.operation, d.attempt, d.delay) for d in seen] == [
        ("connect", 1, 0.5), ("connect", 2, 1.0)]
    assert all(isinstance(d.error, ConnectError) for d in seen)
    with pytest.raises(AttributeError):
        seen[0].delay = 0  # type: ignore[misc]


async def test_custom_predicate_and_no_backoff() -> None:
    """A resend loop retries only what its predicate allows, and never sleeps."""
    t = FakeTime()
    numbers, attempt = failing(ConnectionLostError)
    with set_testing(False), pytest.raises(ConnectionLostError):
        await Retry(ReconnectPolicy(max_attempts=4), operation="resend", sleep=t.sleep,
                    retry_on=lambda exc: isinstance(exc, ConnectionLostError),
                    backoff=False).run(attempt)
    assert numbers == [1, 2, 3, 4] and t.slept == []


async def test_retry_after_raises_the_delay_and_seeded_jitter_is_reproducible() -> None:
    """A Retry-After is waited at least; an rng makes full-jitter delays repeatable."""
    t = FakeTime()

    async def attempt(number: int) -> None:
        if number == 1:
            raise HandshakeRejectedError(503, retry_after=2.5)

    with set_testing(False):
        await Retry(ReconnectPolicy(initial_delay=0.01), operation="connect", sleep=t.sleep,
                    clock=t.clock).run(attempt)
    assert t.slept == [2.5]
    policy = ReconnectPolicy(max_attempts=6)
    assert list(policy.delays(random.Random(7))) == list(policy.delays(random.Random(7)))


def test_policy_wait_is_tenacitys_full_jitter() -> None:
    """ReconnectPolicy.wait() is tenacity's wait_random_exponential, or wait_exponential."""
    from tenacity import wait_exponential, wait_random_exponential

    assert type(ReconnectPolicy().wait()) is wait_random_exponential
    assert type(ReconnectPolicy(jitter="none").wait()) is wait_exponential


async def test_again_is_retried_and_the_original_error_is_raised_at_the_end() -> None:
    """An attempt asks for another try with again(error); when tries run out, error is raised."""
    from envlink._sansio.retry import again

    lost = ConnectionLostError("dropped")
    numbers: list[int] = []

    async def attempt(number: int) -> None:
        numbers.append(number)
        raise again(lost)

    with pytest.raises(ConnectionLostError) as info:
        await Retry(ReconnectPolicy(max_attempts=3), operation="resend", sleep=FakeTime().sleep,
                    retry_on=lambda exc: False, backoff=False).run(attempt)
    assert info.value is lost
    assert numbers == [1, 2, 3]


async def test_the_elapsed_cap_counts_the_first_try_too() -> None:
    """The first try runs outside tenacity, but the elapsed cap still counts from its start."""
    t = FakeTime()

    async def attempt(number: int) -> None:
        t.now += 0.8  # each try takes 0.8 s on the injected clock
        raise ConnectError(f"try {number}")

    policy = ReconnectPolicy(max_attempts=10, max_elapsed=1.0, initial_delay=0.1,
                             max_delay=0.1, jitter="none")
    with set_testing(False), pytest.raises(ConnectError, match="try 2"):
        await Retry(policy, operation="connect", sleep=t.sleep, clock=t.clock).run(attempt)
    # After try 1 (0.8 s) a 0.1 s wait ends at 0.9 < 1.0: try 2 runs; after it (1.7 s), stop.
    assert t.slept == [0.1]
