"""envlink.integrations.skyrl: a SkyRL-shaped text environment (SkyRL not installed)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from envlink import SessionLostError
from envlink.integrations.skyrl import EnvlinkTextEnv
from envlink.server import ServerThread

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def echo_server() -> Iterator[ServerThread]:
    """An echo server with extensions, in its own thread."""
    with ServerThread(env="echo", ping_interval=None) as st:
        yield st


def test_a_trajectory(echo_server: ServerThread) -> None:
    """No connection in __init__; init/step/get_metrics/close in SkyRL's shapes; the URL and
    max_turns come from extras and env_config."""
    env = EnvlinkTextEnv({"max_turns": 2}, {"envlink_url": echo_server.url})
    assert echo_server.call(lambda s: s._counters.get("connection.opened")) == 0
    prompt = [{"role": "user", "content": "talk"}]
    conversation, meta = env.init(prompt)
    assert conversation[0] == prompt[0] and meta["session_id"]
    out = env.step("hello")
    assert out["done"] is False and out["reward"] == pytest.approx(0.5)
    assert "hello" in out["observations"][0]["content"]
    out = env.step("hi")
    assert out["done"] is True and out["observations"] == []
    assert env.get_metrics() == {"envlink/steps": 2, "envlink/turns": 2,
                                 "envlink/reward_sum": pytest.approx(0.7)}
    env.close()
    # The server ends the session as it handles the close, which may trail close().
    echo_server.call(lambda s: s._counters.wait("session.destroyed", 1), timeout=30)
    assert echo_server.call(lambda s: len(s._registry)) == 0


def test_environment_errors_are_errors_not_rewards(echo_server: ServerThread) -> None:
    """A session the server lost (killed sessions, no recovery possible) raises from step;
    it is never turned into a reward."""
    env = EnvlinkTextEnv(None, {"envlink_url": echo_server.url,
                                "client_options": {"on_session_lost": "raise"}})
    env.init([])
    echo_server.call(lambda s: setattr(s.faults, "drop_after", 2))
    with pytest.raises(SessionLostError):
        env.step("lost")
    env.close()


def test_a_missing_url_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a URL anywhere, construction says where to put one."""
    monkeypatch.delenv("ENVLINK_URL", raising=False)
    with pytest.raises(ValueError, match="envlink_url"):
        EnvlinkTextEnv({}, {})
