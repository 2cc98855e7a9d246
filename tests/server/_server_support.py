"""Helpers for the reference-server tests: raw WebSocket clients on loopback."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from websockets.asyncio.client import ClientConnection, connect

from envlink._sansio.protocol import EXTENSION_HEADER, RESUME_TOKEN_HEADER, SESSION_TOKEN_HEADER
from envlink.server import EnvServer

OPEN_TIMEOUT = 5.0


def open_ws(server: EnvServer | ServeProcess, *, extensions: bool = False,
            resume: str | None = None, headers: Mapping[str, str] | None = None,
            **kwargs: Any) -> Any:
    """``websockets`` ``connect`` to the server's ``/ws`` (an async context manager)."""
    extra: dict[str, str] = dict(headers or {})
    if extensions:
        extra[EXTENSION_HEADER] = "1"
    if resume is not None:
        extra[RESUME_TOKEN_HEADER] = resume
    return connect(server.ws_url, additional_headers=extra, open_timeout=OPEN_TIMEOUT,
                   **kwargs)


async def rpc(ws: ClientConnection, frame: Mapping[str, Any] | str) -> dict[str, Any]:
    """Send one frame, return the decoded answer."""
    await ws.send(frame if isinstance(frame, str) else json.dumps(frame))
    answer = await ws.recv()
    decoded: dict[str, Any] = json.loads(answer)
    return decoded


def token_of(ws: ClientConnection) -> str:
    """The session token the server gave this connection."""
    assert ws.response is not None
    return str(ws.response.headers[SESSION_TOKEN_HEADER])


RESET: dict[str, Any] = {"type": "reset", "data": {}}
STATE: dict[str, Any] = {"type": "state"}


def step(data: Mapping[str, Any], **extra: Any) -> dict[str, Any]:
    """A step frame."""
    return {"type": "step", "data": dict(data), **extra}


class ServeProcess:
    """``python -m envlink.server ARGS`` in a subprocess, with its announced URL."""

    def __init__(self, *args: str, env: Mapping[str, str] | None = None) -> None:
        import os
        import subprocess
        import sys

        self.proc = subprocess.Popen(
            [sys.executable, "-m", "envlink.server", *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=None if env is None else {**os.environ, **env},
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith(LISTENING):
            self.proc.kill()
            _, err = self.proc.communicate(timeout=5)
            raise AssertionError(f"unexpected first line {line!r}; stderr:\n{err}")
        self.url = line[len(LISTENING):].strip()
        self.port = int(self.url.rsplit(":", 1)[1])
        self.ws_url = self.url + "/ws"

    def kill9(self) -> None:
        """SIGKILL the process and reap it."""
        import signal

        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)
        self.close_pipes()

    def close_pipes(self) -> None:
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()

    def __enter__(self) -> ServeProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.close_pipes()


LISTENING = "envlink serve: listening on "
