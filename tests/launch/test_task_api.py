"""OpenEnv 0.10's Task API as client calls, against the reference server on loopback."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from envlink import Bridge, GenericEnvClient, HttpStatusError
from envlink.hooks import BridgeCallFinished, BridgeCallStarted
from envlink.server import ServerThread

pytestmark = pytest.mark.timeout(30)


@pytest.fixture(scope="module")
def tasks_server() -> Iterator[ServerThread]:
    """The deterministic environment, which offers tasks (train: 32, test: 8)."""
    with ServerThread(env="deterministic") as st:
        yield st


def test_plain_calls_enumerate_the_tasks(tasks_server: ServerThread) -> None:
    """Environments, splits, counts, one task, a range and a whole split, as plain calls."""
    env = GenericEnvClient(base_url=tasks_server.url)
    try:
        assert env.tasks.list_environments() == ["deterministic"]
        assert env.tasks.splits() == [{"name": "train", "type": "train"},
                                      {"name": "test", "type": "test"}]
        assert env.tasks.num_tasks("test") == 8
        assert env.tasks.num_tasks() == 32  # the default split
        assert env.tasks.get_task("test", 2) == {"seed": 1002, "max_steps": 10}
        assert env.tasks.get_task_range("train", 30, 99) == [
            {"seed": 30, "max_steps": 10}, {"seed": 31, "max_steps": 10}]
        assert [t["seed"] for t in env.tasks.list_tasks("test")] == list(range(1000, 1008))
    finally:
        env.close()


def test_a_task_resets_an_episode(tasks_server: ServerThread) -> None:
    """A task is the reset arguments of an episode: async calls, then reset with it."""

    async def main() -> int:
        async with GenericEnvClient(base_url=tasks_server.url) as env:
            task = await env.tasks.get_task("train", 5, env_name="deterministic")
            await env.reset(**task)
            state = await env.state()
            return int(state["seed"])

    assert asyncio.run(main()) == 5


def test_errors_are_typed(tasks_server: ServerThread) -> None:
    """An index outside the split is HTTP 400, another environment's name 404, an unknown
    split 400, each an HttpStatusError with its status."""
    with GenericEnvClient(base_url=tasks_server.url).sync() as env:
        with pytest.raises(HttpStatusError) as index:
            env.tasks.get_task("test", 8)
        assert index.value.status == 400
        with pytest.raises(HttpStatusError) as name:
            env.tasks.splits(env_name="other")
        assert name.value.status == 404
        with pytest.raises(HttpStatusError) as split:
            env.tasks.num_tasks("nope")
        assert split.value.status == 400


def test_an_environment_without_tasks_answers_501(server_thread: ServerThread) -> None:
    """The echo environment has no tasks: OpenEnv's 501, as a typed error."""
    with GenericEnvClient(base_url=server_thread.url).sync() as env:
        assert env.tasks.list_environments() == ["echo_env"]
        with pytest.raises(HttpStatusError) as exc:
            env.tasks.splits()
        assert exc.value.status == 501


class _Methods:
    """A bridge hook that records the name of each call it sees."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def call_started(self, call: BridgeCallStarted) -> None:
        self.seen.append(call.method)

    def call_finished(self, call: BridgeCallFinished, token: object) -> None:
        pass


def test_a_facades_task_calls_block_on_its_own_bridge(tasks_server: ServerThread) -> None:
    """client.sync(bridge=...).tasks runs each call on that facade's bridge, with the
    caller's deadline, and makes no second facade for the client."""
    methods = _Methods()
    bridge = Bridge(hooks=[methods])
    client = GenericEnvClient(base_url=tasks_server.url)
    try:
        with client.sync(bridge=bridge) as env:
            assert env.tasks.num_tasks("test", timeout=5) == 8
            assert env.tasks.get_task("test", 0)["seed"] == 1000
            assert methods.seen == ["connect", "tasks.num_tasks", "tasks.get_task"]
            assert client._envlink_auto is None  # no facade of its own on another bridge
            with pytest.raises(ValueError, match="timeout"):
                env.tasks.splits(timeout=-1)
    finally:
        bridge.close()

