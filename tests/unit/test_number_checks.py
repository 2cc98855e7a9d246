"""The one number validator: what it refuses, with which error, and the places it guards."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest

from envlink import ConnectionOptions, ReconnectPolicy, RetryBudget, Timeout
from envlink._config import check_count, check_number, check_timeout, is_int
from envlink._pool.batch import recv_want
from envlink._pool.breaker import CircuitBreaker
from envlink.telemetry import BridgeTelemetryHook, ClientTelemetryHook

pytestmark = pytest.mark.timeout(10)


@pytest.mark.parametrize(("value", "kwargs"), [
    (1, {}), (0.5, {"above": 0}), (0, {"minimum": 0}), (None, {"optional": True}),
    (1, {"minimum": 0, "maximum": 1}), (math.inf, {"above": 0}), (3, {"integer": True}),
])
def test_numbers_within_bounds_pass(value: object, kwargs: dict[str, Any]) -> None:
    """A value of the right kind within its bounds is accepted (infinity unless finite)."""
    check_number(value, "x", **kwargs)


@pytest.mark.parametrize(("value", "kwargs", "error", "message"), [
    (True, {}, TypeError, "x must be a number, got bool True"),
    ("5", {}, TypeError, "x must be a number, got str '5'"),
    (None, {}, TypeError, "x must be a number, got NoneType None"),
    (1.5, {"integer": True}, TypeError, "x must be an int, got float 1.5"),
    ("5", {"optional": True}, TypeError, "x must be a number or None, got str '5'"),
    (math.nan, {"minimum": 0}, ValueError, "x must be >= 0, got nan"),
    (0, {"above": 0}, ValueError, "x must be positive, got 0"),
    (math.nan, {"above": 0}, ValueError, "x must be positive, got nan"),
    (-1, {"minimum": 0, "optional": True}, ValueError, "x must be >= 0 or None, got -1"),
    (2, {"minimum": 0, "maximum": 1}, ValueError, "x must be within 0..1, got 2"),
    (math.inf, {"above": 0, "finite": True}, ValueError, "x must be positive, got inf"),
    (0, {"integer": True, "minimum": 1, "mistyped": ValueError, "expected": "a positive integer"},
     ValueError, "x must be a positive integer, got 0"),
    ("1", {"integer": True, "minimum": 1, "mistyped": ValueError,
           "expected": "a positive integer"}, ValueError, "x must be a positive integer, got '1'"),
])
def test_what_is_refused_and_how_it_is_said(value: object, kwargs: dict[str, Any],
                                            error: type[Exception], message: str) -> None:
    """Bools and non-numbers are type errors (unless told otherwise), NaN and values out of
    bounds value errors; the message names the parameter, the bound and the value."""
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        check_number(value, "x", **kwargs)


def test_timeouts_and_counts_keep_their_messages() -> None:
    """check_timeout and check_count, the validator's two common forms, say what they said."""
    assert check_timeout(2) == 2.0 and check_timeout(None) is None
    assert check_timeout(0, allow_zero=True) == 0.0
    with pytest.raises(TypeError, match=re.escape("timeout must be a number of seconds or None, "
                                                  "got str '5'")):
        check_timeout("5")
    with pytest.raises(ValueError, match=re.escape("grace must be a >= 0 number of seconds or "
                                                   "None, got -1")):
        check_timeout(-1, "grace", allow_zero=True)
    with pytest.raises(ValueError, match=re.escape("timeout must be a positive number of "
                                                   "seconds or None, got 0.0")):
        check_timeout(0.0)
    assert check_count(3, "n") == 3
    with pytest.raises(ValueError, match=re.escape("n must be >= 1, got 0")):
        check_count(0, "n", minimum=1)
    with pytest.raises(TypeError, match=re.escape("n must be an int, got bool True")):
        check_count(True, "n")


def test_is_int_refuses_bools() -> None:
    """is_int is the one int-but-not-bool predicate."""
    assert is_int(3) and is_int(-1)
    assert not is_int(True) and not is_int(3.0) and not is_int("3")


@pytest.mark.parametrize(("build", "error", "pattern"), [
    (lambda: ConnectionOptions(max_message_size=True), TypeError, "max_message_size"),
    (lambda: ConnectionOptions(max_message_size=0), ValueError,
     "max_message_size must be positive"),
    (lambda: ConnectionOptions(max_message_values=-1), ValueError,
     "max_message_values must be positive or None"),
    (lambda: ConnectionOptions(close_timeout=0), ValueError, "close_timeout must be positive"),
    (lambda: ConnectionOptions(last_frame_wait=-1), ValueError, "last_frame_wait must be >= 0"),
    (lambda: Timeout(probe=True), ValueError, "probe must be a positive number of seconds"),
    (lambda: RetryBudget(token_ratio="0.1"), TypeError, "token_ratio must be a number"),
    (lambda: ReconnectPolicy(multiplier=0.5), ValueError, "multiplier must be >= 1, got 0.5"),
    (lambda: CircuitBreaker(failure_threshold=True), TypeError, "failure_threshold"),
    (lambda: CircuitBreaker(reset_timeout=-1), ValueError, "reset_timeout must be >= 0"),
    (lambda: recv_want(2, 3, None), ValueError, r"min_ready must be in 1\.\.2"),
    (lambda: recv_want(2, None, math.nan), ValueError, "timeout must be >= 0 or None"),
    (lambda: BridgeTelemetryHook(wait_sample=0), ValueError, "wait_sample must be an int >= 1"),
    (lambda: ClientTelemetryHook(message_sample=True), ValueError,
     "message_sample must be an int >= 1"),
])
def test_each_place_refuses_through_the_validator(build: Any, error: type[Exception],
                                                  pattern: str) -> None:
    """Options, policies, the breaker, the pool's batch checks and the telemetry hooks refuse
    bools, NaN and out-of-bounds values alike, each with its own parameter's name."""
    with pytest.raises(error, match=pattern):
        build()
