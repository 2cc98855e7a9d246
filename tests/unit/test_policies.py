"""Reconnect policy, retry budget and error classification, without any network."""

from __future__ import annotations

import random
import threading

import pytest
from tenacity import RetryCallState

from envlink import (
    ConnectError,
    ConnectionLostError,
    HandshakeRejectedError,
    ProtocolError,
    ReconnectPolicy,
    RetryBudget,
    RetryBudgetExhaustedError,
    set_testing,
)
from envlink._sansio import policies as _policies
from envlink._sansio.policies import is_retryable
from envlink._sansio.retry import Retry, _HonourRetryAfter

pytestmark = pytest.mark.timeout(30)


def test_full_jitter_delays_stay_within_the_exponential_cap() -> None:
    """Each delay is drawn in [0, min(max_delay, initial * multiplier**(n-1))]."""
    policy = ReconnectPolicy(max_attempts=8, initial_delay=0.1, max_delay=1.0, multiplier=2.0)
    rng = random.Random(1)
    for attempt in range(1, 8):
        cap = min(1.0, 0.1 * 2 ** (attempt - 1))
        draws = [policy.delay(attempt, rng) for _ in range(200)]
        assert all(0.0 <= d <= cap for d in draws)
        assert max(draws) > cap * 0.8  # jitter really spreads over the range


def test_no_jitter_gives_the_cap_and_delays_counts_attempts() -> None:
    """Without jitter the delays are the caps; an outage has max_attempts - 1 of them."""
    policy = ReconnectPolicy(max_attempts=4, initial_delay=0.5, max_delay=1.5, jitter="none")
    assert list(policy.delays()) == [0.5, 1.0, 1.5]


def test_retry_after_is_never_undercut() -> None:
    """A Retry-After from the server raises the computed backoff to at least its value."""
    policy = ReconnectPolicy(initial_delay=0.01, max_delay=0.01)
    state = RetryCallState(retry_object=None, fn=None, args=(), kwargs={})  # type: ignore[arg-type]
    state.attempt_number = 1
    state.set_exception((HandshakeRejectedError, HandshakeRejectedError(503, retry_after=7.0),
                         None))
    assert _HonourRetryAfter(policy.wait())(state) == 7.0


@pytest.mark.parametrize(
    ("exc", "retryable"),
    [
        (ConnectError("refused"), True),
        (ConnectError("tls", retryable=False), False),
        (HandshakeRejectedError(503), True),
        (HandshakeRejectedError(502), True),
        (HandshakeRejectedError(429), True),
        (HandshakeRejectedError(401), False),
        (HandshakeRejectedError(403), False),
        (HandshakeRejectedError(404), False),
        (ConnectionLostError("reset"), True),
        (ProtocolError("garbage"), False),
        (RetryBudgetExhaustedError("empty"), False),
        (ValueError("bug"), False),
    ],
)
def test_classification_of_connection_failures(exc: Exception, retryable: bool) -> None:
    """Refused/reset/5xx/429 are retryable; auth, not-found and protocol faults are fatal."""
    assert is_retryable(exc) is retryable


def test_retry_budget_throttles_below_half_and_refills_on_success() -> None:
    """Retries stop once half the bucket is spent; successes earn tokens back."""
    budget = RetryBudget(max_tokens=4, token_ratio=0.5)
    assert [budget.try_spend() for _ in range(4)] == [True, True, False, False]
    budget.record_success()
    assert budget.tokens == 2.5
    assert budget.try_spend() is True
    assert budget.try_spend() is False


def test_retry_budget_is_thread_safe() -> None:
    """Concurrent spenders never take more tokens than the bucket allows."""
    budget = RetryBudget(max_tokens=100, token_ratio=0.1)
    granted: list[bool] = []
    lock = threading.Lock()

    def spend() -> None:
        for _ in range(50):
            ok = budget.try_spend()
            with lock:
                granted.append(ok)

    threads = [threading.Thread(target=spend) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert granted.count(True) == 50  # exactly down to the half-way floor


def test_set_testing_is_a_restoring_context_manager() -> None:
    """set_testing removes waits inside its block and restores the old value after."""
    assert not _policies.testing_enabled()
    with set_testing():
        assert _policies.testing_enabled()
        with set_testing(False):
            assert not _policies.testing_enabled()
        assert _policies.testing_enabled()
    assert not _policies.testing_enabled()


async def test_retry_stops_after_max_attempts_and_reraises() -> None:
    """The tenacity loop tries max_attempts times, sleeps between, and re-raises the last error."""
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    calls = 0

    async def attempt(number: int) -> None:
        nonlocal calls
        calls += 1
        assert number == calls
        raise ConnectError(f"refused {calls}")

    with set_testing(False), pytest.raises(ConnectError, match="refused 3"):
        await Retry(ReconnectPolicy(max_attempts=3, jitter="none", initial_delay=0.1),
                    operation="connect", sleep=sleep).run(attempt)
    assert calls == 3
    assert slept == [0.1, 0.2]


async def test_retry_does_not_retry_fatal_errors() -> None:
    """A fatal error (HTTP 403) ends the loop at once."""
    calls = 0

    async def sleep(seconds: float) -> None:
        raise AssertionError("must not sleep")

    async def attempt(number: int) -> None:
        nonlocal calls
        calls += 1
        raise HandshakeRejectedError(403)

    with pytest.raises(HandshakeRejectedError):
        await Retry(ReconnectPolicy(), operation="connect", sleep=sleep).run(attempt)
    assert calls == 1


def test_policy_validates_its_fields() -> None:
    """Nonsense policies are refused at construction."""
    with pytest.raises(ValueError, match="max_attempts"):
        ReconnectPolicy(max_attempts=0)
    with pytest.raises(ValueError, match="multiplier"):
        ReconnectPolicy(multiplier=0.5)


def test_a_pickled_budget_is_an_independent_copy() -> None:
    """A RetryBudget crosses processes (a Ray shard) as its own budget with the same tokens."""
    import pickle

    budget = RetryBudget(max_tokens=4.0)
    assert budget.try_spend()
    copy = pickle.loads(pickle.dumps(budget))
    assert copy.tokens == budget.tokens == 3.0 and copy.max_tokens == 4.0
    assert copy.try_spend() and copy.tokens == 2.0 and budget.tokens == 3.0
