"""OpenEnv 0.10's Task API as client calls, against the reference server on loopback."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from envlink import GenericEnvClient, HttpStatusError
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
        assert env.list_environments() == ["deterministic"]
        assert env.splits() == [{"name": "train", "type": "train"},
                                {"name": "test", "type": "test"}]
        assert env.num_tasks("test") == 8
        assert env.num_tasks() == 32  # the default split
        assert env.task("test", 2) == {"seed": 1002, "max_steps": 10}
        assert env.task_range("train", 30, 99) == [{"seed": 30, "max_steps": 10},
                                                   {"seed": 31, "max_steps": 10}]
        assert [t["seed"] for t in env.tasks("test")] == list(range(1000, 1008))
    finally:
        env.close()


def test_a_task_resets_an_episode(tasks_server: ServerThread) -> None:
    """A task is the reset arguments of an episode: async calls, then reset with it."""

    async def main() -> int:
        async with GenericEnvClient(base_url=tasks_server.url) as env:
            task = await env.task("train", 5, env_name="deterministic")
            await env.reset(**task)
            state = await env.state()
            return int(state["seed"])

    assert asyncio.run(main()) == 5


def test_errors_are_typed(tasks_server: ServerThread) -> None:
    """An index outside the split is HTTP 400, another environment's name 404, an unknown
    split 400, each an HttpStatusError with its status."""
    with GenericEnvClient(base_url=tasks_server.url).sync() as env:
        with pytest.raises(HttpStatusError) as index:
            env.task("test", 8)
        assert index.value.status == 400
        with pytest.raises(HttpStatusError) as name:
            env.splits(env_name="other")
        assert name.value.status == 404
        with pytest.raises(HttpStatusError) as split:
            env.num_tasks("nope")
        assert split.value.status == 400


def test_an_environment_without_tasks_answers_501(server_thread: ServerThread) -> None:
    """The echo environment has no tasks: OpenEnv's 501, as a typed error."""
    with GenericEnvClient(base_url=server_thread.url).sync() as env:
        assert env.list_environments() == ["echo_env"]
        with pytest.raises(HttpStatusError) as exc:
            env.splits()
        assert exc.value.status == 501
