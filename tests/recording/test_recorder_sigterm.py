"""SIGTERM: a process ended by it while its client is open still leaves every episode it
finished on disk (the open one as ``close``), and still ends by SIGTERM; an application's
own SIGTERM handler (or ``SIG_IGN``) stays. Real processes, a real server: a script, pool
workers under fork, spawn and forkserver, ``ProcessPoolExecutor`` workers.

The finished episodes are made to wait for the writer thread (it gathers for a minute
unless something waits for it), so that what a SIGTERM would lose is there to lose."""

from __future__ import annotations

import json
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
              pytest.mark.skipif(sys.platform == "win32", reason="SIGTERM, fork")]

SCRIPT = '''
import json
import multiprocessing
import os
import signal
import sys
import threading

import envlink._recording.writer as writer

MODE, URL, DIRECTORY, METHOD = sys.argv[1:5]
# Finished episodes wait for the writer until something waits for them.
writer._GATHER = 60.0

from envlink import GenericEnvClient, RolloutRecorder

CLIENTS = []  # open until the process ends


def handler_name():
    handler = signal.getsignal(signal.SIGTERM)
    if handler is writer._on_sigterm:
        return "recorder"
    if handler in (signal.SIG_DFL, signal.SIG_IGN):
        return handler.name
    return getattr(handler, "__name__", repr(handler))


def episode(env, seed, steps=2, done=True):
    env.reset(seed=seed, max_steps=steps if done else steps + 5)
    for move in range(steps):
        env.step({"move": move})


def worker(recorder, seed):
    """A worker's function: two episodes finished, one left open, its client too."""
    env = GenericEnvClient(URL, recorder=recorder).sync()
    CLIENTS.append(env)
    episode(env, seed)
    episode(env, seed + 1)
    episode(env, seed + 2, done=False)
    return os.getpid(), recorder.stats["episodes_written"], handler_name()


def app_handler(signum, frame):
    print("the application's handler", flush=True)
    os._exit(7)


if __name__ == "__main__":
    if MODE == "app":
        signal.signal(signal.SIGTERM, app_handler)
    elif MODE == "ignored":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    recorder = RolloutRecorder(DIRECTORY, flush_on_sigterm=MODE != "off")
    if MODE == "pool":
        with multiprocessing.get_context(METHOD).Pool(2) as pool:
            results = pool.starmap(worker, [(recorder, 10), (recorder, 20)])
            processes = list(pool._pool)  # the stdlib's list of the pool's workers
        # The with block's exit terminated the workers (SIGTERM); a worker may have
        # begun to end normally first, on the block's sentinel.
        print(json.dumps({"results": results,
                          "exitcodes": [p.exitcode for p in processes]}), flush=True)
    elif MODE == "executor":
        from concurrent.futures import ProcessPoolExecutor
        context = multiprocessing.get_context(METHOD)
        with ProcessPoolExecutor(1, mp_context=context) as executor:
            result = executor.submit(worker, recorder, 10).result()
            os.kill(result[0], signal.SIGTERM)  # its main thread waits for the next task
        print(json.dumps({"results": [result]}), flush=True)
    elif MODE == "blocked":
        result = worker(recorder, 10)
        lock = multiprocessing.Lock()
        lock.acquire()

        def signal_from_here():
            # Delivered to this thread, SIGTERM leaves the main thread blocked.
            sys.stdin.readline()
            signal.pthread_kill(threading.get_ident(), signal.SIGTERM)

        threading.Thread(target=signal_from_here, daemon=True).start()
        print(json.dumps({"results": [result]}), flush=True)
        lock.acquire()  # never released: as a pool worker whose pool holds its queue
    else:
        result = worker(recorder, 10)
        print(json.dumps({"results": [result]}), flush=True)
        sys.stdin.read()  # the test sends SIGTERM here
'''


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    srv = ServerProcess("--max-sessions", "64")
    try:
        yield srv
    finally:
        srv.stop()


def _start(tmp_path: Path, server: ServerProcess, mode: str,
           method: str = "-") -> tuple[subprocess.Popen[str], Path]:
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    directory = tmp_path / "rollouts"
    child = subprocess.Popen([sys.executable, str(script), mode, server.url, str(directory),
                              method], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    return child, directory


def _terminated(tmp_path: Path, server: ServerProcess, mode: str
                ) -> tuple[dict[str, Any], int, str, Path]:
    """The script in ``mode``, sent SIGTERM once its worker function returned: what it
    printed, its exit status, the rest of its stdout and the recordings' directory."""
    child, directory = _start(tmp_path, server, mode)
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line, child.stderr.read() if child.stderr else ""
        report = json.loads(line)
        child.send_signal(signal.SIGTERM)
        out, _err = child.communicate(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate(timeout=10)
    return report, child.returncode, out, directory


def _outcomes(directory: Path) -> dict[int, list[str]]:
    seen: dict[int, list[str]] = {}
    for record in load(directory):
        assert len(record["steps"]) == 2
        seen.setdefault(record["reset"]["kwargs"]["seed"], []).append(record["outcome"])
    return seen


def _every_episode(seeds: list[int]) -> dict[int, list[str]]:
    expected: dict[int, list[str]] = {}
    for seed in seeds:
        expected |= {seed: ["done"], seed + 1: ["done"], seed + 2: ["close"]}
    return expected


def test_a_sigterm_writes_the_waiting_episodes_and_still_ends_the_process(
        tmp_path: Path, server: ServerProcess) -> None:
    report, code, _out, directory = _terminated(tmp_path, server, "script")
    ((_pid, written, handler),) = report["results"]
    assert (written, handler) == (0, "recorder")  # both finished episodes waiting
    assert code == -signal.SIGTERM
    assert _outcomes(directory) == _every_episode([10])


def test_a_sigterm_that_misses_a_blocked_main_thread_still_ends_the_process(
        tmp_path: Path, server: ServerProcess) -> None:
    # A SIGTERM taken by another thread does not interrupt the main thread's blocking
    # call (a multiprocessing lock), where alone the handler can run: the recorder's
    # watch thread sends it on to the main thread.
    child, directory = _start(tmp_path, server, "blocked")
    try:
        assert child.stdout is not None and child.stdin is not None
        line = child.stdout.readline()
        assert line, child.stderr.read() if child.stderr else ""
        assert json.loads(line)["results"][0][1:] == [0, "recorder"]
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.wait(30) == -signal.SIGTERM
    finally:
        if child.poll() is None:
            child.kill()
        child.communicate(timeout=10)
    assert _outcomes(directory) == _every_episode([10])


def test_without_flush_on_sigterm_no_handler_is_installed(
        tmp_path: Path, server: ServerProcess) -> None:
    # What the handler saves: without it, the waiting episodes go with the process.
    report, code, _out, directory = _terminated(tmp_path, server, "off")
    ((_pid, written, handler),) = report["results"]
    assert (written, handler) == (0, "SIG_DFL")
    assert code == -signal.SIGTERM
    assert not directory.exists() or load(directory) == []


def test_an_applications_sigterm_handler_stays(tmp_path: Path,
                                               server: ServerProcess) -> None:
    report, code, out, _directory = _terminated(tmp_path, server, "app")
    assert report["results"][0][2] == "app_handler"
    assert (code, out) == (7, "the application's handler\n")


def test_an_ignored_sigterm_stays_ignored(tmp_path: Path, server: ServerProcess) -> None:
    child, directory = _start(tmp_path, server, "ignored")
    out, err = child.communicate("", timeout=60)  # stdin closed: the script ends
    assert child.returncode == 0, err
    assert json.loads(out)["results"][0][2] == "SIG_IGN"
    assert _outcomes(directory) == _every_episode([10])  # written at exit


def _run(tmp_path: Path, server: ServerProcess, mode: str,
         method: str) -> tuple[dict[str, Any], Path]:
    child, directory = _start(tmp_path, server, mode, method)
    out, err = child.communicate("", timeout=100)
    assert child.returncode == 0, err
    return json.loads(out), directory


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_pool_workers_terminated_with_a_client_open_leave_every_episode(
        tmp_path: Path, server: ServerProcess, method: str) -> None:
    # The recorder crosses to the workers as an argument: unpickled there (under spawn
    # and forkserver, the workers' only recorder), or inherited with its handler (fork).
    # The block's exit sends each worker SIGTERM; one that took the block's sentinel
    # first ends normally (its exit hooks write), the others by the handler.
    report, directory = _run(tmp_path, server, "pool", method)
    assert [r[1:] for r in report["results"]] == [[0, "recorder"]] * 2
    assert set(report["exitcodes"]) <= {0, -signal.SIGTERM}, report["exitcodes"]
    seeds = [10, 20]
    assert _outcomes(directory) == _every_episode(seeds)


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_process_pool_executor_worker_sent_sigterm_leaves_every_episode(
        tmp_path: Path, server: ServerProcess, method: str) -> None:
    report, directory = _run(tmp_path, server, "executor", method)
    assert [r[1:] for r in report["results"]] == [[0, "recorder"]]
    assert _outcomes(directory) == _every_episode([10])
