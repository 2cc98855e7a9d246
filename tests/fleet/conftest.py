"""Fleet tests: real processes sharing one store, against real servers on loopback."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

WORKER = Path(__file__).with_name("_worker.py")


class Workers:
    """Worker processes of a test (``_worker.py``), killed at its end."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[str]] = []

    def start(self, **spec: Any) -> subprocess.Popen[str]:
        proc = subprocess.Popen([sys.executable, str(WORKER), json.dumps(spec)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        self.procs.append(proc)
        return proc

    @staticmethod
    def line(proc: subprocess.Popen[str]) -> str:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line:
            assert proc.stderr is not None
            raise AssertionError(f"worker ended: {proc.wait()} {proc.stderr.read()[-2000:]}")
        return line.strip()

    def result(self, proc: subprocess.Popen[str]) -> dict[str, Any]:
        out = self.line(proc)
        if out == "ready":
            out = self.line(proc)
        return json.loads(out)  # type: ignore[no-any-return]

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()


@pytest.fixture
def workers() -> Iterator[Workers]:
    w = Workers()
    try:
        yield w
    finally:
        w.close()


def most_at_once(spans: list[list[float]]) -> int:
    """The most intervals ``[start, end]`` open at one time."""
    edges = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans],
                   key=lambda edge: (edge[0], edge[1]))
    now = best = 0
    for _, delta in edges:
        now += delta
        best = max(best, now)
    return best
