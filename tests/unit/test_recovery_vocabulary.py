"""Recovery's two vocabularies: the policy a user asks for, the mechanism that runs."""

from __future__ import annotations

import pytest

from envlink import GenericEnvClient
from envlink._sansio.policies import SESSION_LOST_POLICIES, RecoveryMechanism, RecoveryPolicy

pytestmark = pytest.mark.timeout(10)


def test_the_enums_are_the_strings_users_and_telemetry_see() -> None:
    """RecoveryPolicy's values are on_session_lost's (the Literal in signatures);
    RecoveryMechanism's are what client.recovery and telemetry name; both compare, hash
    and format as those strings."""
    assert tuple(RecoveryPolicy) == SESSION_LOST_POLICIES
    assert {m.value for m in RecoveryMechanism} == {
        "raise", "replay", "envlink-resume", "openenv-resume"}
    for member in (*RecoveryPolicy, *RecoveryMechanism):
        assert member == member.value and hash(member) == hash(member.value)
        assert str(member) == f"{member}" == member.value
    assert RecoveryPolicy("auto") is RecoveryPolicy.AUTO
    with pytest.raises(ValueError, match="is not a valid RecoveryPolicy"):
        RecoveryPolicy("envlink-resume")  # a mechanism is not a policy


def test_a_client_takes_either_form_and_shows_plain_strings() -> None:
    """on_session_lost accepts "auto" or RecoveryPolicy.AUTO and reads back as the plain
    string; client.recovery is a plain string too; an unknown value keeps its message."""
    env = GenericEnvClient("http://127.0.0.1:9", on_session_lost=RecoveryPolicy.AUTO)  # type: ignore[arg-type]
    assert type(env.on_session_lost) is str and env.on_session_lost == "auto"
    env.on_session_lost = "replay"
    assert env.on_session_lost == "replay"
    assert type(env.recovery) is str and env.recovery == "raise"  # nothing journaled yet
    with pytest.raises(ValueError, match="on_session_lost must be 'raise', 'replay', 'resume' "
                                         "or 'auto', got 'envlink-resume'"):
        env.on_session_lost = "envlink-resume"  # type: ignore[assignment]
