"""verifiers 0.4's OpenEnv taskset on envlink (taskset id ``envlink-openenv``), with the real
``verifiers`` package: its loaders, configs, tasks, messages and traces.

The model is a scripted player (no model can be served here): it answers each user turn
with the next scripted reply, through verifiers' own ``Segment`` and ``Trace`` types.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from tests.integrations._support import require

require("verifiers", "ENVLINK_REQUIRE_VERIFIERS", "bash .ci/verifiers.sh installs it")

import verifiers.v1 as vf  # noqa: E402
from verifiers.v1.agent import Segment  # noqa: E402
from verifiers.v1.trace import AgentInfo, Trace, TraceTask  # noqa: E402
from verifiers.v1.types import AssistantMessage  # noqa: E402
from verifiers.v1.utils.loaders import (  # noqa: E402
    environment_class,
    load_environment,
    taskset_class,
)

from envlink.integrations.verifiers import (  # noqa: E402
    EnvlinkOpenEnvEnv,
    EnvlinkOpenEnvTaskset,
)
from envlink.server import EnvServer, ServerThread  # noqa: E402

pytestmark = pytest.mark.timeout(60)

TASKSET = "envlink-openenv"


@pytest.fixture
def echo_server() -> Iterator[ServerThread]:
    """An echo server with extensions, in its own thread."""
    with ServerThread(env="echo", ping_interval=None) as st:
        yield st


class ScriptedInteraction:
    """One exchange: each turn records what the model was shown and returns the next reply."""

    def __init__(self, task: Any, replies: list[str]) -> None:
        self.trace = Trace(task=TraceTask(type=type(task).__name__, data=task.data,
                                          key=task.key, hash=task.hash),
                           agent=AgentInfo(config=vf.AgentConfig()))
        self.replies = list(replies)
        self.shown: list[dict[str, Any]] = []

    async def turn(self, message: str) -> Segment:
        self.shown.append(json.loads(message))
        if not self.replies:
            return Segment(messages=[], terminated=True)
        return Segment(messages=[AssistantMessage(content=self.replies.pop(0))])


class ScriptedPlayer:
    def __init__(self, replies: list[str]) -> None:
        self.replies = replies
        self.interactions: list[ScriptedInteraction] = []

    @contextlib.asynccontextmanager
    async def interaction(self, task: Any) -> AsyncIterator[ScriptedInteraction]:
        exchange = ScriptedInteraction(task, self.replies)
        self.interactions.append(exchange)
        yield exchange


class Agents:
    def __init__(self, replies: list[str]) -> None:
        self.player = ScriptedPlayer(replies)


def environment(url: str, resets: list[dict[str, Any]] | None = None) -> Any:
    """The run's env, built as verifiers builds it: from a config naming the taskset id."""
    config = vf.tasksets.openenv.OpenEnvEnvConfig(
        taskset={"id": TASKSET, "base_url": url, "resets": resets or [{}]})
    return load_environment(config)


def counters(st: ServerThread) -> dict[str, int]:
    return dict(st.call(lambda s: s._counters.snapshot()))


def test_verifiers_resolves_the_taskset_id() -> None:
    """verifiers' own loaders map the id to envlink's taskset and env classes."""
    assert taskset_class(TASKSET) is EnvlinkOpenEnvTaskset
    assert environment_class(TASKSET) is EnvlinkOpenEnvEnv


async def test_an_episode(echo_server: ServerThread) -> None:
    """Reset, then one step per reply until the script ends: the model sees the observation
    and the action schema read from /schema, and the rewards are summed on the trace."""
    env = environment(echo_server.http_url, resets=[{}, {"seed": 1}])
    tasks = list(env.taskset.load())
    assert len(tasks) == 2 and tasks[0].data.base_url == echo_server.http_url
    agents = Agents(['{"message": "hello"}', '{"message": "hi"}'])
    await env.run(tasks[0], agents)
    exchange = agents.player.interactions[0]
    assert len(exchange.shown) == 3  # after the reset and after each of the two steps
    async with httpx.AsyncClient(timeout=10) as http:
        served = (await http.get(f"{echo_server.http_url}/schema")).json()["action"]
    assert exchange.shown[0]["action_schema"] == served
    assert "hi" in json.dumps(exchange.shown[2]["observation"])
    assert exchange.trace.rewards["openenv_reward"].score == pytest.approx(0.7)
    assert counters(echo_server)["request.step"] == 2


async def test_an_empty_reply_ends_the_run(echo_server: ServerThread) -> None:
    """An empty reply cannot advance the environment: the run stops as verifiers' does."""
    env = environment(echo_server.http_url)
    agents = Agents(["   "])
    await env.run(next(iter(env.taskset.load())), agents)
    exchange = agents.player.interactions[0]
    assert exchange.trace.stop_condition == "empty_action"
    assert exchange.trace.rewards["openenv_reward"].score == 0.0


async def test_a_dropped_connection_mid_episode(echo_server: ServerThread) -> None:
    """The server applies a step and drops the connection before answering: the episode
    goes on, each step is applied once, and the summed reward is the same."""
    env = environment(echo_server.http_url)
    task = next(iter(env.taskset.load()))
    agents = Agents(['{"message": "one"}', '{"message": "two"}', '{"message": "hi"}'])

    def arm(server: EnvServer) -> None:
        server.faults.drop_after = 3  # the connection's third request: the second step
        server.faults.drop_mode = "after_apply"

    echo_server.call(arm)
    await env.run(task, agents)
    seen = counters(echo_server)
    assert seen["drop"] == 1
    assert seen["applied.step"] == 3  # each of the three steps, once
    assert agents.player.interactions[0].trace.rewards["openenv_reward"].score == \
        pytest.approx(0.3 + 0.3 + 0.2)
