"""Circuit breaker and placement rules, on a fake clock (no I/O)."""

from __future__ import annotations

import pytest

from envlink import ReconnectPolicy
from envlink._pool.breaker import BreakerState, CircuitBreaker
from envlink._pool.placement import Placement, parse_endpoints

pytestmark = pytest.mark.timeout(10)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_breaker_opens_after_consecutive_failures_and_probes_once() -> None:
    """Closed → open after N failures → half-open after the timeout, with exactly one probe."""
    clock = Clock()
    changes: list[tuple[str, str]] = []
    b = CircuitBreaker(2, 5.0, clock=clock,
                       on_change=lambda old, new: changes.append((old.value, new.value)))
    b.record_failure()
    assert b.state is BreakerState.CLOSED and b.allow()
    b.record_failure()
    assert b.state is BreakerState.OPEN and not b.allow()
    assert b.retry_in() == pytest.approx(5.0)
    clock.now += 5.0
    assert b.available()
    assert b.allow()            # the probe
    assert not b.allow()        # only one
    assert not b.available()
    b.record_failure()          # the probe failed: open again, for another timeout
    assert b.state is BreakerState.OPEN
    clock.now += 5.0
    assert b.allow()
    b.record_success()
    assert b.state is BreakerState.CLOSED and b.consecutive_failures == 0
    assert changes == [("closed", "open"), ("open", "half_open"), ("half_open", "open"),
                       ("open", "half_open"), ("half_open", "closed")]


def test_a_success_resets_the_failure_count() -> None:
    """Failures must be consecutive to open the breaker."""
    b = CircuitBreaker(2, 1.0, clock=Clock())
    b.record_failure()
    b.record_success()
    b.record_failure()
    assert b.state is BreakerState.CLOSED


def test_a_cancelled_probe_frees_the_half_open_slot() -> None:
    """release_probe() lets another caller probe."""
    clock = Clock()
    b = CircuitBreaker(1, 0.0, clock=clock)
    b.record_failure()
    assert b.allow() and not b.allow()
    b.release_probe()
    assert b.allow()


@pytest.mark.parametrize(("threshold", "timeout"), [(0, 1.0), (1, -1.0)])
def test_breaker_rejects_bad_settings(threshold: int, timeout: float) -> None:
    """A threshold below 1 or a negative timeout is a ValueError."""
    with pytest.raises(ValueError, match="must be"):
        CircuitBreaker(threshold, timeout)


def _placement(n: int, clock: Clock, threshold: int = 1) -> Placement:
    eps = parse_endpoints([f"ws://127.0.0.1:{9000 + i}" for i in range(n)])
    return Placement(eps, lambda i: CircuitBreaker(threshold, 10.0, clock=clock),
                     capacity_backoff=ReconnectPolicy(initial_delay=1.0, max_delay=1.0,
                                                      jitter="none"), clock=clock)


def test_least_loaded_first_and_reserved_at_once() -> None:
    """Choices spread round the endpoints, each reserved as it is chosen."""
    p = _placement(3, Clock())
    chosen = [p.choose() for _ in range(6)]
    assert [ep.index for ep in chosen if ep] == [0, 1, 2, 0, 1, 2]
    p.release(p.endpoints[1])
    chosen_ep = p.choose()
    assert chosen_ep is not None and chosen_ep.index == 1


def test_capacity_refusal_marks_full_until_backoff_or_a_release() -> None:
    """A refused endpoint is skipped until its backoff passes or one of our sessions frees."""
    clock = Clock()
    p = _placement(2, clock)
    a = p.choose()
    assert a is not None and a.index == 0
    p.refused(a, active_sessions=4, max_sessions=4)
    assert a.server_max == 4 and a.refusals == 1
    assert [p.choose().index for _ in range(2)] == [1, 1]  # type: ignore[union-attr]
    assert p.next_change() == pytest.approx(1.0)
    clock.now += 1.0
    b = p.choose()
    assert b is not None and b.index == 0
    p.refused(b, active_sessions=4, max_sessions=4)
    p.release(b)  # one of ours there ended
    assert b.full_until == 0.0


def test_known_limit_is_never_exceeded() -> None:
    """Once the server said its limit, no more of our sessions than that go there."""
    p = _placement(1, Clock())
    ep = p.endpoints[0]
    ep.server_max = 2
    assert p.choose() is ep and p.choose() is ep
    assert p.choose() is None


def test_unreachable_opens_the_breaker_and_skips_the_endpoint() -> None:
    """A connection failure (threshold 1) opens the breaker: the endpoint is not chosen."""
    clock = Clock()
    p = _placement(2, clock)
    a = p.choose()
    assert a is not None
    p.unreachable(a)
    assert a.breaker.state is BreakerState.OPEN and a.sessions == 0
    assert {p.choose().index for _ in range(3)} == {1}  # type: ignore[union-attr]
    assert p.next_change() == pytest.approx(10.0)
    assert p.choose(exclude={p.endpoints[1]}) is None


@pytest.mark.parametrize(("endpoints", "error"), [
    ([], ValueError), (["http://"], ValueError), (["ws://h:99999"], ValueError),
    (["ws://h:1", "ws://h:1/"], ValueError), ([1], TypeError)])
def test_parse_endpoints_rejects_bad_urls(endpoints: list[object], error: type) -> None:
    """Empty lists, hostless or bad-port URLs, duplicates and non-strings are refused."""
    with pytest.raises(error):
        parse_endpoints(endpoints)  # type: ignore[arg-type]


def test_peek_reads_the_state_without_moving_it() -> None:
    """peek() says half_open once the timeout passed, yet no transition happens until state."""
    clock = Clock()
    changes: list[str] = []
    b = CircuitBreaker(1, 5.0, clock=clock, on_change=lambda old, new: changes.append(new.value))
    assert b.peek() is BreakerState.CLOSED
    b.record_failure()
    assert b.peek() is BreakerState.OPEN
    clock.now += 5.0
    assert b.peek() is BreakerState.HALF_OPEN
    assert changes == ["open"]  # peek moved nothing
    assert b.state is BreakerState.HALF_OPEN
    assert changes == ["open", "half_open"]
