"""Process edges: every episode on disk exactly once through fork, spawn and forkserver
workers, a Pool's SIGTERM, ProcessPoolExecutor, sys.exit, an episode left open at
exit, and whichever envlink module was imported first (real processes, a real server)."""

from __future__ import annotations

import collections
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .._processes import ServerProcess
from .conftest import load

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(sys.platform == "win32", reason="fork, SIGTERM")]

SCRIPT = '''
import multiprocessing
import os
import sys
import time

MODE, URL, DIRECTORY, METHOD = sys.argv[1:5]
if MODE == "exit":
    # Another envlink module first: its exit hooks are registered before the recorder's.
    import envlink.integrations._runtime  # noqa: F401

from envlink import GenericEnvClient, RolloutRecorder

recorder = RolloutRecorder(DIRECTORY)


def episode(env, seed, steps=2, done=True):
    env.reset(seed=seed, max_steps=steps if done else steps + 5)
    for move in range(steps):
        env.step({"move": move})


def closed(seed):
    """A worker's function: its client closed, its episodes finished."""
    with GenericEnvClient(URL, recorder=recorder).sync() as env:
        episode(env, seed)
        episode(env, seed + 1000, done=False)  # ends as "close"
    return os.getpid()


def unclosed(seed):
    """A process that ends without closing its client: one episode done, one open."""
    env = GenericEnvClient(URL, recorder=recorder).sync()
    episode(env, seed)
    episode(env, seed + 1000, done=False)


if __name__ == "__main__":
    context = multiprocessing.get_context(METHOD) if METHOD != "-" else None
    parent = GenericEnvClient(URL, recorder=recorder).sync()
    # The parent's own: one finished just before the workers start (still queued for
    # its writer), one open across the fork (the parent's to write, as "close").
    episode(parent, 1)
    episode(parent, 2, done=False)
    if MODE == "pool":
        with context.Pool(2) as pool:
            pids = pool.map(closed, [10, 20, 30, 40])
        # The with block's exit terminated the workers (SIGTERM).
    elif MODE == "executor":
        from concurrent.futures import ProcessPoolExecutor
        with ProcessPoolExecutor(2, mp_context=context) as executor:
            pids = list(executor.map(closed, [10, 20, 30, 40]))
    elif MODE == "process":
        workers = [context.Process(target=unclosed, args=(seed,)) for seed in (10, 20)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(60)
            assert worker.exitcode == 0, worker.exitcode
    elif MODE == "osfork":
        assert recorder.flush() and recorder.stats["episodes_written"] == 1
        (parent_file,) = recorder.files
        pid = os.fork()
        if pid == 0:  # the child: a recorder state of its own
            fresh = (recorder.stats["episodes_written"] == 0 and recorder.files == []
                     and recorder.sink.fd is None)
            closed(10)
            recorder.close()
            ok = fresh and recorder.stats["episodes_written"] == 2
            ok = ok and parent_file not in recorder.files
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert recorder.files == [parent_file]
    elif MODE == "exit":
        unclosed(10)  # left open, never closed, no flush: sys.exit below
        sys.exit(3)
    elif MODE == "sigterm":
        with GenericEnvClient(URL, recorder=recorder).sync() as env:
            episode(env, 10)
        print("closed", flush=True)
        sys.stdin.read()  # terminated here
    parent.close()
    recorder.close()
'''


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    srv = ServerProcess("--max-sessions", "64")
    try:
        yield srv
    finally:
        srv.stop()


def _run(tmp_path: Path, server: ServerProcess, mode: str, method: str = "-",
         code: int = 0) -> list[dict[str, Any]]:
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    directory = tmp_path / "rollouts"
    done = subprocess.run([sys.executable, str(script), mode, server.url, str(directory),
                           method], capture_output=True, text=True, timeout=100)
    assert done.returncode == code, done.stderr
    return load(directory)


def _by_seed(records: list[dict[str, Any]]) -> dict[int, list[str]]:
    seen: dict[int, list[str]] = collections.defaultdict(list)
    for record in records:
        seen[record["reset"]["kwargs"]["seed"]].append(record["outcome"])
    return dict(seen)


def _check_once(records: list[dict[str, Any]], workers: list[int]) -> None:
    expected = {1: ["done"], 2: ["close"]}
    for seed in workers:
        expected[seed] = ["done"]
        expected[seed + 1000] = ["close"]
    assert _by_seed(records) == expected
    for record in records:
        assert len(record["steps"]) == 2
    parent_pid = {r["pid"] for r in records if r["reset"]["kwargs"]["seed"] in (1, 2)}
    worker_pids = {r["pid"] for r in records if r["reset"]["kwargs"]["seed"] >= 10}
    assert len(parent_pid) == 1 and not parent_pid & worker_pids


METHODS = ["fork", "spawn", "forkserver"]


@pytest.mark.parametrize("method", METHODS)
def test_pool_workers_every_episode_once(tmp_path: Path, server: ServerProcess,
                                         method: str) -> None:
    _check_once(_run(tmp_path, server, "pool", method), [10, 20, 30, 40])


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_process_pool_executor_every_episode_once(tmp_path: Path, server: ServerProcess,
                                                  method: str) -> None:
    _check_once(_run(tmp_path, server, "executor", method), [10, 20, 30, 40])


@pytest.mark.parametrize("method", METHODS)
def test_a_worker_that_never_closes_its_client_leaves_its_episodes_on_disk(
        tmp_path: Path, server: ServerProcess, method: str) -> None:
    # A multiprocessing child ends with os._exit: its finalizers write them.
    _check_once(_run(tmp_path, server, "process", method), [10, 20])


def test_a_forked_child_has_a_recorder_state_of_its_own(
        tmp_path: Path, server: ServerProcess) -> None:
    records = _run(tmp_path, server, "osfork")
    assert _by_seed(records) == {1: ["done"], 2: ["close"], 10: ["done"], 1010: ["close"]}
    assert len({r["pid"] for r in records}) == 2


def test_sys_exit_with_an_episode_open_and_another_module_imported_first(
        tmp_path: Path, server: ServerProcess) -> None:
    records = _run(tmp_path, server, "exit", code=3)
    assert _by_seed(records) == {1: ["done"], 2: ["close"], 10: ["done"], 1010: ["close"]}


def test_episodes_a_client_closed_are_on_disk_before_a_sigterm(
        tmp_path: Path, server: ServerProcess) -> None:
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    directory = tmp_path / "rollouts"
    child = subprocess.Popen([sys.executable, str(script), "sigterm", server.url,
                              str(directory), "-"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == "closed\n"
        child.send_signal(signal.SIGTERM)  # at once: nothing waited for
        assert child.wait(30) == -signal.SIGTERM
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
    # The parent's finished episode was queued first: written too; its open one is
    # written as "close" by the recorder's SIGTERM handler.
    assert _by_seed(load(directory)) == {1: ["done"], 2: ["close"], 10: ["done"]}
