"""A reference server in its own process, for tests that kill it (shared by test packages)."""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import urllib.request
from typing import Any

from ._ports import restartable_port

__all__ = ["ServerProcess", "process_gone"]

LISTENING = re.compile(r"listening on ws://127\.0\.0\.1:(\d+)")


def process_gone(pid: int, timeout: float = 20.0) -> bool:
    """Whether process ``pid`` has exited within ``timeout`` (waited on with a pidfd, not
    by sleeping)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        return bool(poller.poll(timeout * 1000))
    finally:
        os.close(fd)


class ServerProcess:
    """``python -m envlink.server`` in a subprocess on 127.0.0.1."""

    def __init__(self, *args: str, port: int | None = None, events: bool = False) -> None:
        # Tests kill and restart it on its port: one no outgoing connection can take.
        port = restartable_port() if port is None else port
        # --events: the server announces its events on stdout (read by wait_event; a
        # server whose stdout nobody reads must not get it, or the pipe fills up).
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "envlink.server", "--host", "127.0.0.1",
             "--port", str(port), "--env", "deterministic",
             *(["--events"] if events else []), *args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        match = LISTENING.search(line)
        assert match, f"server did not start: {line!r}"
        self.port = int(match.group(1))

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def wait_event(self, name: str) -> None:
        """Block until the server announces ``name`` on stdout (``--events``)."""
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.split()[2:4] == ["event", name]:
                return
        raise AssertionError(f"server exited before event {name!r}")

    def health(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5) as r:
            return json.loads(r.read())  # type: ignore[no-any-return]

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
