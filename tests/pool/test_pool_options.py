"""The pool's on_session_lost values: one list, and "auto" refused with the reason."""

from __future__ import annotations

import typing

import pytest

from envlink import EnvPool, SessionLostPolicy
from envlink._sansio.policies import (
    POOL_SESSION_LOST_POLICIES,
    SESSION_LOST_POLICIES,
    PoolSessionLostPolicy,
)

pytestmark = pytest.mark.timeout(30)


def test_the_value_lists_match_their_types() -> None:
    """The tuples the constructors check are the Literal types they are annotated with,
    and a pool's are a client's without "auto"."""
    assert typing.get_args(SessionLostPolicy) == SESSION_LOST_POLICIES
    assert typing.get_args(PoolSessionLostPolicy) == POOL_SESSION_LOST_POLICIES
    assert set(SESSION_LOST_POLICIES) - set(POOL_SESSION_LOST_POLICIES) == {"auto"}


def test_a_pool_refuses_auto_and_says_why() -> None:
    """EnvPool(on_session_lost="auto") is a ValueError naming the choice to make."""
    with pytest.raises(ValueError, match="a pool takes no 'auto'"):
        EnvPool("ws://127.0.0.1:9", 2, on_session_lost="auto")  # type: ignore[arg-type]


@pytest.mark.parametrize("policy", POOL_SESSION_LOST_POLICIES)
def test_a_pool_takes_each_of_its_values(policy: PoolSessionLostPolicy) -> None:
    """Every listed value builds a pool."""
    assert EnvPool("ws://127.0.0.1:9", 1, on_session_lost=policy).on_session_lost == policy
