"""envlink.integrations.skyrl under the real skyrl_gym: registered, built by make, stepped."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.integrations._support import require

require("skyrl_gym", "ENVLINK_REQUIRE_SKYRL", "bash .ci/skyrl.sh installs it")

import skyrl_gym  # noqa: E402
from skyrl_gym.envs.base_text_env import BaseTextEnv  # noqa: E402

from envlink.integrations.skyrl import EnvlinkTextEnv, register  # noqa: E402
from envlink.server import EnvServer, ServerThread  # noqa: E402

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def echo_server() -> Iterator[ServerThread]:
    """An echo server with extensions, in its own thread."""
    with ServerThread(env="echo", ping_interval=None) as st:
        yield st


@pytest.fixture
def env_id() -> Iterator[str]:
    """envlink's text environment registered in SkyRL's registry, removed afterwards."""
    register("envlink-test")
    yield "envlink-test"
    skyrl_gym.envs.registration.deregister("envlink-test")


def counters(st: ServerThread) -> dict[str, int]:
    return dict(st.call(lambda s: s._counters.snapshot()))


def test_make_builds_a_skyrl_env(echo_server: ServerThread, env_id: str) -> None:
    """skyrl_gym.make accepts the class (a real BaseTextEnv) and the generator's calls work:
    init, step to done, get_metrics, SkyRL's aggregate_metrics, close."""
    env = skyrl_gym.make(env_id, env_config={"max_turns": 2},
                         extras={"envlink_url": echo_server.url})
    assert isinstance(env, EnvlinkTextEnv)
    assert isinstance(env, BaseTextEnv) and isinstance(env, skyrl_gym.Env)
    assert env.spec is not None and env.spec.id == env_id
    conversation, meta = env.init([{"role": "user", "content": "talk"}])
    assert conversation[0]["content"] == "talk" and meta["session_id"]
    first = env.step("hello")
    assert first["done"] is False and "hello" in first["observations"][0]["content"]
    last = env.step("bye")
    assert last["done"] is True and last["observations"] == []
    metrics = env.get_metrics()
    assert metrics["envlink/steps"] == 2 and metrics["envlink/turns"] == 2
    summary = EnvlinkTextEnv.aggregate_metrics([metrics, metrics])
    assert summary["envlink/steps"] == pytest.approx(2.0)
    env.close()
    echo_server.call(lambda s: s._counters.wait("session.destroyed", 1), timeout=30)


def test_a_dropped_connection_mid_trajectory(echo_server: ServerThread, env_id: str) -> None:
    """The server applies a step and drops the connection before answering: the trajectory
    goes on (the adapter's default recovery), and each step is applied exactly once."""
    env: Any = skyrl_gym.make(env_id, env_config={"max_turns": 4},
                              extras={"envlink_url": echo_server.url})
    env.init([])
    env.step("one")

    def arm(server: EnvServer) -> None:
        server.faults.drop_after = 3  # this connection's next request: the second step
        server.faults.drop_mode = "after_apply"

    echo_server.call(arm)
    out = env.step("two")
    assert "two" in out["observations"][0]["content"]
    env.step("three")
    assert counters(echo_server)["drop"] == 1
    state = env.client.state()
    assert state["step_count"] == 3  # applied once each, the dropped one included
    assert env.get_metrics()["envlink/steps"] == 3
    env.close()


def test_make_passes_registry_kwargs(echo_server: ServerThread) -> None:
    """register()'s defaults reach the constructor, and make()'s arguments override them."""
    register("envlink-defaults", env_config={"max_turns": 1},
             extras={"envlink_url": echo_server.url})
    try:
        env: Any = skyrl_gym.make("envlink-defaults")
        assert env.max_turns == 1 and env.base_url == echo_server.url
        other: Any = skyrl_gym.make("envlink-defaults", env_config={"max_turns": 5})
        assert other.max_turns == 5
    finally:
        skyrl_gym.envs.registration.deregister("envlink-defaults")
