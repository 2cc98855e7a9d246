"""FleetLimits as a value: checked, picklable as its settings, no secret in its repr."""

from __future__ import annotations

import pickle

import pytest

import envlink
from envlink._fleet.settings import effective_limit, lowered_limit, pace_window


def test_fleet_limits_pickle_as_their_settings_inside_a_config() -> None:
    """A ClientConfig with fleet= pickles and compares equal (pools, Ray shards, spawn)."""
    fleet = envlink.FleetLimits("redis://:pw@127.0.0.1:6379/0", max_sessions=128,
                                max_sessions_per_endpoint=64, session_rate=50.0,
                                provider_start_rate=2, max_provider_starts=4)
    config = envlink.ClientConfig(fleet=fleet)
    assert pickle.loads(pickle.dumps(config)) == config
    assert pickle.loads(pickle.dumps(fleet)) == fleet
    assert fleet.kind == "redis"
    assert "pw" not in repr(fleet) and "pw" not in repr(config)
    assert envlink.FleetLimits("ray:budget").kind == "ray"
    assert envlink.FleetLimits("/tmp/x").kind == "directory"


@pytest.mark.parametrize(("kwargs", "error"), [
    ({"max_sessions": 0}, ValueError), ({"max_sessions_per_endpoint": True}, TypeError),
    ({"session_rate": -1}, ValueError), ({"provider_start_rate": float("inf")}, ValueError),
    ({"on_store_error": "ignore"}, ValueError), ({"lease": 0}, ValueError),
    ({"jitter": 2}, ValueError),
])
def test_bad_settings_are_refused(kwargs: dict[str, object], error: type[Exception]) -> None:
    """Each setting out of range or of the wrong type raises at once."""
    with pytest.raises(error):
        envlink.FleetLimits("/tmp/x", **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("store", ["", "http://host/", "ray:"])
def test_a_store_that_names_no_backend_is_refused(store: str) -> None:
    """A store that is none of the three backends is refused when the value is made."""
    with pytest.raises((TypeError, ValueError)):
        envlink.FleetLimits(store)


def test_a_config_refuses_a_fleet_of_another_type() -> None:
    """ClientConfig(fleet=) takes a FleetLimits only."""
    with pytest.raises(TypeError, match="FleetLimits"):
        envlink.ClientConfig(fleet="/tmp/x")  # type: ignore[arg-type]


def test_refusal_lowers_to_what_the_server_held_and_grows_back() -> None:
    """Decrease to holders - 1 (never below 1), then +1 per interval, up to the setting."""
    assert lowered_limit(None, 129) == 128
    assert lowered_limit(64, 129) == 63
    assert lowered_limit(5, 1) == 1
    assert effective_limit(128, 100, since=0.0, now=9.9, every=5.0) == 101
    assert effective_limit(128, 100, since=0.0, now=1e6, every=5.0) == 128
    assert effective_limit(None, None, since=0.0, now=1.0, every=5.0) is None


def test_pace_window_never_lets_a_second_hold_more_than_the_rate() -> None:
    """The window is at least a second (1/rate below one) and holds at most the rate."""
    assert pace_window(3)[1] == 3 and pace_window(3)[0] >= 1.0
    assert pace_window(2.5)[1] == 2
    seconds, most = pace_window(0.5)
    assert most == 1 and seconds >= 2.0
