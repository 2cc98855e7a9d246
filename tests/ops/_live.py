"""Helpers of the live tests: a real Prometheus on 127.0.0.1 and the processes it scrapes."""

from __future__ import annotations

import json
import math
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

__all__ = ["free_port", "get", "has_number", "query", "read_line", "start_prometheus",
           "stop", "wait_targets_up"]


def free_port() -> int:
    """A loopback port nothing listens on (taken, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def get(url: str) -> Any:
    """The JSON answer of a GET."""
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def query(api: str, expr: str) -> list[dict[str, Any]]:
    """An instant query's result vector."""
    data = get(f"{api}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
    assert data["status"] == "success", (expr, data)
    result: list[dict[str, Any]] = data["data"]["result"]
    return result


def has_number(result: list[dict[str, Any]]) -> bool:
    """Whether a result vector holds at least one sample that is a number (not NaN)."""
    return any(not math.isnan(float(r["value"][1])) for r in result)


def read_line(stream: Any, prefix: str, timeout: float) -> tuple[str, threading.Thread]:
    """The first line of ``stream`` starting with ``prefix``, and the thread reading it."""
    found: list[str] = []
    done = threading.Event()

    def reader() -> None:
        # Reads to the end, so the process never blocks on a full pipe.
        for line in stream:
            if not found and line.startswith(prefix):
                found.append(line[len(prefix):].strip())
                done.set()
        done.set()

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    done.wait(timeout)
    assert found, f"no {prefix!r} line within {timeout} s"
    return found[0], thread


def stop(proc: subprocess.Popen[Any]) -> None:
    """Terminate ``proc`` (kill it if it does not exit within 15 s)."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def start_prometheus(prometheus: str, tmp: Path, config: dict[str, Any]
                     ) -> tuple[subprocess.Popen[Any], str]:
    """Prometheus with ``config`` on a free loopback port: the process and its API URL."""
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config), encoding="utf-8")
    port = free_port()
    with (tmp / "prometheus.log").open("w") as log:
        proc = subprocess.Popen(
            [prometheus, f"--config.file={tmp / 'prometheus.yml'}",
             f"--storage.tsdb.path={tmp / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
            stdout=subprocess.DEVNULL, stderr=log)
    return proc, f"http://127.0.0.1:{port}"


def wait_targets_up(api: str, prom: subprocess.Popen[Any], log: Path, count: int,
                    timeout: float, alive: Any = None) -> None:
    """Poll (bounded) until Prometheus scrapes ``count`` targets, all up.

    ``alive()``, if given, is asserted on each round (the scraped processes still run).
    """
    deadline = time.monotonic() + timeout
    while True:
        assert prom.poll() is None, log.read_text()
        if alive is not None:
            alive()
        try:
            targets = get(f"{api}/api/v1/targets")["data"]["activeTargets"]
            if len(targets) == count and all(t["health"] == "up" for t in targets):
                return
        except OSError:
            pass  # not listening yet
        assert time.monotonic() < deadline, "Prometheus did not scrape every target in time"
        time.sleep(0.2)  # polling interval, not synchronisation
