"""Helpers of the interop suite: server subprocesses and the frame log they write.

Runs in envlink's own interpreter. The OpenEnv servers run in the separate
openenv virtualenv, found through ``ENVLINK_OPENENV_PYTHON``.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

HERE = Path(__file__).resolve().parent
SERVERS = HERE / "servers"
CLIENTS = HERE / "clients"
REPO_ROOT = HERE.parent.parent

#: Environment variable naming the python of the openenv virtualenv.
OPENENV_PYTHON_VAR = "ENVLINK_OPENENV_PYTHON"
#: Upgrade-request header each test puts on its connections, so the frames of one
#: test can be picked out of the log of a server shared by many tests.
TAG_HEADER = "x-interop-test"
#: Envelope keys of the plain OpenEnv protocol; anything else is an extension.
PLAIN_ENVELOPE_KEYS = frozenset({"type", "data"})
PLAIN_REQUEST_TYPES = frozenset({"reset", "step", "state", "close"})

#: Lifecycle lines the interop servers print (``servers/_harness.py``, ``announce``).
EVENT_PREFIX = "openenv serve: event "
_READY = re.compile(r"listening on (?:ws|http)://127\.0\.0\.1:(\d+)")
STARTUP_DEADLINE = 45.0


def openenv_python() -> str | None:
    """The openenv virtualenv's python, or ``None`` if the suite was not configured."""
    value = os.environ.get(OPENENV_PYTHON_VAR, "").strip()
    return value or None


class ServerStartError(RuntimeError):
    """A server subprocess died or did not announce itself in time."""


@dataclass
class ServerProcess:
    """A server subprocess that prints ``listening on ...://127.0.0.1:PORT`` when ready."""

    argv: Sequence[str]
    name: str
    log_dir: Path
    env: dict[str, str] | None = None
    port: int | None = None
    proc: subprocess.Popen[str] | None = None
    stdout_lines: list[str] = field(default_factory=list)
    _lines_changed: threading.Condition = field(default_factory=threading.Condition, repr=False)

    @property
    def stderr_path(self) -> Path:
        return self.log_dir / f"{self.name}.stderr"

    @property
    def base_url(self) -> str:
        assert self.port is not None, "server not started"
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        assert self.port is not None, "server not started"
        return f"ws://127.0.0.1:{self.port}"

    def start(self, deadline: float = STARTUP_DEADLINE) -> int:
        """Start the process and wait (bounded) for its readiness line; return the port."""
        env = dict(os.environ if self.env is None else self.env)
        env.setdefault("PYTHONUNBUFFERED", "1")
        # OpenEnv's create_app would mount a Gradio UI if this were set.
        env["ENABLE_WEB_INTERFACE"] = "false"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        stderr = open(self.stderr_path, "ab")  # noqa: SIM115 - handed to the child
        try:
            self.proc = subprocess.Popen(
                list(self.argv), stdout=subprocess.PIPE, stderr=stderr, stdin=subprocess.DEVNULL,
                text=True, cwd=REPO_ROOT, env=env,
            )
        finally:
            stderr.close()
        lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, args=(lines,), daemon=True,
                         name=f"{self.name}-stdout").start()
        end = time.monotonic() + deadline
        while True:
            remaining = end - time.monotonic()
            if remaining <= 0:
                self.stop()
                raise ServerStartError(
                    f"{self.name} not ready after {deadline}s\n{self.diagnostics()}")
            try:
                line = lines.get(timeout=remaining)
            except queue.Empty:
                continue
            if line is None:
                self.stop()
                raise ServerStartError(
                    f"{self.name} exited before it was ready\n{self.diagnostics()}")
            match = _READY.search(line)
            if match:
                self.port = int(match.group(1))
                return self.port

    def _pump(self, lines: queue.Queue[str | None]) -> None:
        assert self.proc is not None
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._lines_changed:
                self.stdout_lines.append(line)
                self._lines_changed.notify_all()
            lines.put(line)
        lines.put(None)
        with self._lines_changed:
            self._lines_changed.notify_all()

    def events(self, name: str) -> list[dict[str, Any]]:
        """The lifecycle events ``name`` the server printed so far (see ``announce``)."""
        prefix = f"{EVENT_PREFIX}{name} "
        with self._lines_changed:
            lines = list(self.stdout_lines)
        return [json.loads(line[len(prefix):]) for line in lines if line.startswith(prefix)]

    def wait_for_event(self, name: str, *, deadline: float, **match: Any) -> dict[str, Any]:
        """Block (bounded) until the server prints event ``name`` with fields ``match``.

        Woken by each new stdout line, never by polling.
        """
        end = time.monotonic() + deadline
        with self._lines_changed:
            while True:
                for event in self.events(name):
                    if all(event.get(k) == v for k, v in match.items()):
                        return event
                remaining = end - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(
                        f"{self.name}: no event {name} {match} within {deadline}s\n"
                        f"{self.diagnostics()}")
                self._lines_changed.wait(remaining)

    def kill(self) -> None:
        """SIGKILL the process (a crash: no close frames, no cleanup) and reap it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        """Terminate the process, killing it if it does not exit promptly."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def diagnostics(self) -> str:
        try:
            err = self.stderr_path.read_text(errors="replace")[-4000:]
        except OSError:
            err = ""
        return f"--- stdout\n{''.join(self.stdout_lines)[-2000:]}\n--- stderr\n{err}"


def openenv_server(kind: str, python: str, log_dir: Path, *, port: int = 0,
                   max_sessions: int = 1, frame_log: Path | None = None,
                   name: str | None = None, extra_args: Sequence[str] = ()) -> ServerProcess:
    """A (not yet started) real OpenEnv server from ``servers/<kind>_server.py``."""
    argv = [python, str(SERVERS / f"{kind}_server.py"), "--port", str(port),
            "--max-sessions", str(max_sessions), *extra_args]
    if frame_log is not None:
        argv += ["--frame-log", str(frame_log)]
    return ServerProcess(argv, name=name or f"openenv-{kind}", log_dir=log_dir)


@dataclass
class RecordingServer:
    """A running server and the frame log it writes."""

    process: ServerProcess
    frame_log: Path

    @property
    def base_url(self) -> str:
        return self.process.base_url

    @property
    def port(self) -> int:
        assert self.process.port is not None
        return self.process.port

    def ended_connections(self, tag: str, count: int = 1,
                          deadline: float = 15.0) -> list[Connection]:
        """The connections tagged ``tag``, once the server is done with ``count`` of them.

        A client's ``close()`` can return before the server's app has read the
        last frames (the close handshake is the transport's, not the app's): the
        server announces each connection's end, and this waits for them.
        """
        end = time.monotonic() + deadline
        changed = self.process._lines_changed
        with changed:
            while sum(e.get("tag") == tag for e in self.process.events("ws_end")) < count:
                remaining = end - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(
                        f"fewer than {count} connections tagged {tag!r} ended within "
                        f"{deadline}s\n{self.process.diagnostics()}")
                changed.wait(remaining)
        return read_connections(self.frame_log, tag)


# ------------------------------------------------------------------- the frame log


@dataclass
class Connection:
    """The recorded WebSocket events of one connection to a recording server."""

    conn: int
    request_headers: dict[str, str]
    query: str = ""
    accept_headers: dict[str, str] | None = None
    sent: list[dict[str, Any]] = field(default_factory=list)  # client -> server, parsed
    received: list[dict[str, Any]] = field(default_factory=list)  # server -> client, parsed

    @property
    def errors(self) -> list[dict[str, Any]]:
        return [frame for frame in self.received if frame.get("type") == "error"]

    @property
    def session_id(self) -> str | None:
        """The ``session_id`` this connection attached to (``/ws?session_id=``), if any."""
        values = parse_qs(self.query).get("session_id")
        return values[0] if values else None


@dataclass
class RpcExchange:
    """One recorded ``POST /mcp`` JSON-RPC exchange."""

    conn: int
    headers: dict[str, str]
    request: dict[str, Any] | None
    status: int | None
    response: dict[str, Any] | None

    @property
    def method(self) -> str | None:
        return None if self.request is None else self.request.get("method")


def read_rpc(frame_log: Path, tag: str | None = None) -> list[RpcExchange]:
    """The ``POST /mcp`` exchanges of a frame log (those with ``TAG_HEADER: tag``)."""
    exchanges: list[RpcExchange] = []
    if not frame_log.exists():
        return exchanges
    for line in frame_log.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        event = json.loads(line)
        if event["event"] != "http":
            continue
        if tag is not None and event["headers"].get(TAG_HEADER) != tag:
            continue

        def parsed(text: str) -> dict[str, Any] | None:
            try:
                value = json.loads(text)
            except ValueError:
                return None
            return value if isinstance(value, dict) else None

        exchanges.append(RpcExchange(event["conn"], event["headers"], parsed(event["request"]),
                                     event["status"], parsed(event["response"])))
    return exchanges


def read_connections(frame_log: Path, tag: str | None = None) -> list[Connection]:
    """Parse a frame log; keep the connections whose upgrade carried ``TAG_HEADER: tag``."""
    conns: dict[int, Connection] = {}
    if not frame_log.exists():
        return []
    for line in frame_log.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        event = json.loads(line)
        number = event["conn"]
        if event["event"] == "upgrade":
            conns[number] = Connection(number, event["headers"], event.get("query", ""))
            continue
        conn = conns.get(number)
        if conn is None:
            continue
        if event["event"] == "accept":
            conn.accept_headers = event["headers"]
        elif event["event"] == "in" and event.get("text") is not None:
            conn.sent.append(json.loads(event["text"]))
        elif event["event"] == "out" and event.get("text") is not None:
            conn.received.append(json.loads(event["text"]))
    selected = [c for c in conns.values()
                if tag is None or c.request_headers.get(TAG_HEADER) == tag]
    return sorted(selected, key=lambda c: c.conn)


def assert_plain_protocol(conns: Sequence[Connection]) -> None:
    """Every frame the client sent is plain OpenEnv, and no extension was advertised."""
    assert conns, "no connection was recorded for this test"
    for conn in conns:
        assert conn.accept_headers is not None, f"connection {conn.conn} was never accepted"
        assert "envlink-protocol" not in conn.accept_headers, conn.accept_headers
        for frame in conn.sent:
            extra = set(frame) - PLAIN_ENVELOPE_KEYS
            assert not extra, f"extension envelope fields {sorted(extra)} sent: {frame}"
            assert frame.get("type") in PLAIN_REQUEST_TYPES, frame


def python_command(*args: str) -> list[str]:
    """A command line running envlink's own interpreter."""
    return [sys.executable, *args]
