"""What a worker process of the chaos suite's process-edge phases runs.

It runs seeded episodes against a deterministic reference server through a recording
client, and writes what its caller got (the caller's ledger) as JSON lines to a file
of its own, flushed after every call, so that the parent knows what the caller got
even when the worker is killed. Each step moves the walker by a distinct power of two.

Run as a function (a ``multiprocessing`` worker: :func:`run_episodes`) or as a script
(``python _edge_worker.py MODE URL RECORDINGS LEDGER``) for the phases that signal
or end the process:

- ``finish``: the episodes, then the client closed, then a normal return;
- ``open``: the episodes, then one more begun and left open; the process then waits
  for a line on stdin (the parent sends SIGTERM or SIGKILL) or, with ``exit``, ends
  at once through interpreter exit with the episode still open (``envlink.integrations``
  imported before the recorder is first used).

Self-contained (envlink and the standard library only), importable by path.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

EPISODES = 3
STEPS = 4


def _project(result: Any) -> dict[str, Any]:
    obs = result.observation
    return {"position": obs.get("position"), "draw": obs.get("draw"),
            "step": obs.get("step"), "reward": result.reward, "done": result.done}


class _Ledger:
    """The caller's ledger: one JSON line per call, flushed at once."""

    def __init__(self, path: str) -> None:
        self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - lives with the worker

    def write(self, **entry: Any) -> None:
        self._file.write(json.dumps({"pid": os.getpid(), **entry}) + "\n")
        self._file.flush()


def _episode(env: Any, ledger: _Ledger, seed: int, steps: int) -> None:
    try:
        result = env.reset(seed=seed, max_steps=1_000_000)
    except Exception as exc:
        ledger.write(seed=seed, method="reset", ok=False, error=type(exc).__name__)
        return
    ledger.write(seed=seed, method="reset", ok=True, answer=_project(result))
    for i in range(steps):
        move = 1 << i
        try:
            result = env.step({"move": move})
        except Exception as exc:
            ledger.write(seed=seed, method="step", move=move, ok=False,
                         error=type(exc).__name__)
            return
        ledger.write(seed=seed, method="step", move=move, ok=True, answer=_project(result))


def run_episodes(url: str, recorder: Any, ledger_path: str, first_seed: int,
                 episodes: int = EPISODES, steps: int = STEPS) -> int:
    """``episodes`` episodes of ``steps`` steps on one recording client, closed at the
    end (its ``with`` block); the worker's pid."""
    from envlink import GenericEnvClient

    if recorder is None:  # a fork worker: the parent's recorder, inherited
        recorder = INHERITED[0]
    ledger = _Ledger(ledger_path)
    with GenericEnvClient(url, recorder=recorder, ping_interval=None).sync() as env:
        for n in range(episodes):
            _episode(env, ledger, first_seed + n, steps)
    return os.getpid()


#: Episodes of the ``enospc`` mode; its writes to the recordings, counted from 1, go:
#: 1 whole, 2 short (half its bytes), 3 ENOSPC (the rest of 2), 4 whole, 5 ENOSPC,
#: then whole again (the disk has room again).
ENOSPC_EPISODES = 6
_SHORT, _FULL = {2}, {3, 5}


def _fill_the_disk(recordings: str) -> None:
    """``os.write`` to a file under ``recordings``: a short write, then ``ENOSPC``, as a
    disk that fills up and is freed again gives them."""
    import errno

    real = os.write
    target = os.path.realpath(recordings)
    count = [0]

    def write(fd: int, data: Any) -> int:
        try:
            path = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            path = ""
        if path.startswith(target):
            count[0] += 1
            if count[0] in _SHORT:
                return real(fd, bytes(data)[: len(data) // 2])
            if count[0] in _FULL:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd, data)

    os.write = write


#: The recorder a fork worker inherits from its parent (set before the pool starts).
INHERITED: list[Any] = []


def main(argv: list[str]) -> int:
    mode, url, recordings, ledger_path = argv[:4]
    first_seed = int(argv[4]) if len(argv) > 4 else 0
    if mode == "exit":
        import envlink.integrations  # noqa: F401  (before the recorder is first used)
    from envlink import GenericEnvClient, RolloutRecorder

    if mode == "enospc":
        _fill_the_disk(recordings)
    recorder = RolloutRecorder(recordings)
    ledger = _Ledger(ledger_path)
    env = GenericEnvClient(url, recorder=recorder, ping_interval=None).sync()
    if mode == "enospc":  # one write per episode: each ended by the next reset
        for n in range(ENOSPC_EPISODES):
            _episode(env, ledger, first_seed + n, STEPS)
            recorder.flush()
        env.close()
        recorder.close()
        sys.stdout.write(json.dumps(recorder.stats) + "\n")
        return 0
    for n in range(EPISODES):
        _episode(env, ledger, first_seed + n, STEPS)
    if mode == "finish":
        env.close()
        return 0
    # One more episode, left open: its reset and steps answered, no end.
    _episode(env, ledger, first_seed + EPISODES, STEPS)
    if mode == "kill":  # SIGKILL loses what is not on disk: wait for the finished ones
        recorder.flush()
    sys.stdout.write("open\n")
    sys.stdout.flush()
    if mode == "exit":
        return 0  # interpreter exit with the client and the episode open
    sys.stdin.readline()  # the parent signals the process meanwhile
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
