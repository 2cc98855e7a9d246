"""A process killed with SIGKILL after finishing episodes leaves them on disk, whole."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import load

pytestmark = [pytest.mark.timeout(60),
              pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")]

CHILD = """
import sys
from envlink import GenericEnvClient, RolloutRecorder
from envlink.server import ServerThread

recorder = RolloutRecorder(sys.argv[1])
with ServerThread(env="deterministic", ping_interval=None) as st:
    env = GenericEnvClient(st.url, recorder=recorder).sync()
    for seed in range(5):
        env.reset(seed=seed, max_steps=3)
        for move in (1, 2, 3):
            env.step({"move": move})
    print("finished", flush=True)
    sys.stdin.read()  # never closes the client or the recorder: killed here
"""


def _lines(directory: Path) -> list[str]:
    return [line for f in sorted(directory.glob("*.jsonl"))
            for line in f.read_text(encoding="utf-8").splitlines(keepends=True)]


def test_episodes_finished_before_a_sigkill_are_on_disk(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == "finished\n"
        # The writer has them within a second of each episode's end: wait for the
        # file, bounded, then kill.
        deadline = time.monotonic() + 5.0
        while len(_lines(tmp_path)) < 5 and time.monotonic() < deadline:
            time.sleep(0.02)
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
    lines = _lines(tmp_path)
    assert len(lines) == 5 and all(line.endswith("\n") for line in lines)
    records = load(tmp_path)
    assert [r["reset"]["kwargs"]["seed"] for r in records] == list(range(5))
    assert all(r["outcome"] == "done" and len(r["steps"]) == 3 for r in records)
    assert json.loads(lines[0])["pid"] == child.pid
