"""TRL's async trainer contract: the factory pickled into a spawned child, calls from a
thread pool there (the trainer itself needs vLLM and a GPU, so its contract is run here)."""

from __future__ import annotations

import functools
import multiprocessing
import os
import pickle
from collections.abc import Iterator

import pytest

from envlink.server import ServerThread

from ._envs import AsyncEcho, Echo, child_main

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def echo_server() -> Iterator[ServerThread]:
    """An echo server with extensions, in its own thread."""
    with ServerThread(env="echo", ping_interval=None) as st:
        yield st


def spawn(factory: object, rows: list[dict[str, str]]) -> dict[str, object]:
    # TRL checks that the factory pickles before it spawns; so does this.
    pickle.dumps(factory)
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    child = ctx.Process(target=child_main, args=(factory, rows, results))
    child.start()
    try:
        out: dict[str, object] = results.get(timeout=90)
    finally:
        child.join(30)
    assert child.exitcode == 0
    return out


@pytest.mark.parametrize("cls", [Echo, AsyncEcho])
def test_factory_runs_in_a_spawned_child(echo_server: ServerThread, cls: type) -> None:
    """A partial of the class crosses the spawn; four concurrent rollouts reset, call a tool
    (sync from the pool, async on the child's loop) and score; one envlink loop thread; the
    child's sessions are released when it exits."""
    rows = [{"prompt": f"m{i}"} for i in range(4)]
    out = spawn(functools.partial(cls, base_url=echo_server.url), rows)
    expected_reward = 1.0  # Echo: the server's step count after one tool call; AsyncEcho: 1.0
    assert out["results"] == [[f"m{i}", expected_reward] for i in range(4)]
    assert len(out["envlink_threads"]) == 1, out
    seen = echo_server.call(lambda s: s._counters.snapshot())
    assert seen["applied.step"] == 4
    assert seen["applied.reset"] == 4
    # The child closed its sessions on its way out; the server ends each as its close
    # frame is handled, which may trail the child's exit by a moment: wait for that.
    echo_server.call(lambda s: s._counters.wait("session.destroyed", 4), timeout=30)
    assert echo_server.call(lambda s: len(s._registry)) == 0


def test_class_configured_by_environment_variable(echo_server: ServerThread,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The class itself as the factory, configured by ENVLINK_URL, which the child inherits
    (a class attribute set at run time does not cross a spawn; the environment does)."""
    monkeypatch.setenv("ENVLINK_URL", echo_server.url)
    assert os.environ["ENVLINK_URL"] == echo_server.url
    out = spawn(Echo, [{"prompt": "hi"}])
    assert out["results"] == [["hi", 1.0]]
