"""Fleet tests: real processes sharing one store, against real servers on loopback."""

from __future__ import annotations

import json
import os
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


def require_redis() -> None:
    """Skip the calling module without the ``redis`` client library; fail instead under
    ``ENVLINK_REQUIRE_REDIS=1`` (set by ``.ci/run``)."""
    try:
        import redis  # noqa: F401
    except ImportError:
        if os.environ.get("ENVLINK_REQUIRE_REDIS") == "1":
            pytest.fail("ENVLINK_REQUIRE_REDIS=1: the redis client is not installed",
                        pytrace=False)
        pytest.skip("the redis client is not installed (envlink[redis])",
                    allow_module_level=True)


class RedisServer:
    """A real ``redis-server`` on a free loopback port, no persistence."""

    def __init__(self, workdir: Path) -> None:
        import shutil
        import socket

        binary = shutil.which("redis-server") or (
            "/usr/bin/redis-server" if Path("/usr/bin/redis-server").exists() else None)
        if binary is None:
            if os.environ.get("ENVLINK_REQUIRE_REDIS") == "1":
                pytest.fail("redis-server is required (ENVLINK_REQUIRE_REDIS=1) but missing")
            pytest.skip("redis-server is not installed")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(workdir)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if "Ready to accept connections" in line:
                break
        else:
            raise AssertionError(f"redis-server did not start: {self.proc.wait()}")
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path)
    try:
        yield server
    finally:
        server.stop()
