"""The servers chaos episodes run against, and the faults injected into them.

- :class:`InProcessServers`: one reference server per protocol (envlink extensions on,
  and off = plain OpenEnv), each in a :class:`~envlink.server.ServerThread`, serving
  :class:`~_oracle.LedgerEnvironment` sessions. Faults are armed through the public
  :class:`~envlink.server.Faults` controls for "the next request" and counted only when
  the server says they fired.
- :class:`ServeProcess`: a real ``envlink serve --events`` process that the chaos suite
  kills with SIGKILL and restarts on the same port (with or without
  ``--session-store``); the kill is timed by the server's own event lines, never by
  sleeping.
"""

from __future__ import annotations

import contextlib
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from websockets.asyncio.client import connect

from envlink.server import EnvServer, ServerThread

from ._oracle import Ledger, LedgerEnvironment

__all__ = ["FAULT_KINDS", "Arming", "InProcessServers", "ServeProcess"]

#: Every kind of fault the suite injects (the soak reaches a count of each).
FAULT_KINDS = (
    "drop_before_apply", "drop_after_apply", "drop_mid_answer", "stall", "slow", "error",
    "corrupt", "oversize", "refused_upgrade", "capacity", "kill9", "kill9_store",
)
IN_PROCESS_KINDS = FAULT_KINDS[:-2]

CORRUPT = ("invalid_json", "array", "bad_data", "unknown_type", "missing_field", "binary")
#: Clients in the suite accept frames up to this size; oversize frames are bigger.
CLIENT_MAX_MESSAGE = 256 * 1024
MAX_SESSIONS = 64

_COUNTERS = ("drop", "stall", "refused", "request", "connection.opened", "session.created",
             "resume")


@dataclass
class Arming:
    """A fault armed for the next request (and whatever it needs to take effect)."""

    kind: str
    latency: float = 0.0
    before: dict[str, int] | None = None


class InProcessServers:
    """Reference servers for both protocols, in server threads, sharing one ledger."""

    def __init__(self, ledger: Ledger, *, resume_grace: float = 30.0) -> None:
        self.ledger = ledger
        self._threads: dict[str, ServerThread] = {}
        self._fillers: dict[str, Any] = {}
        self._resume_grace = resume_grace

    def __enter__(self) -> InProcessServers:
        for protocol in ("plain", "ext"):
            st = ServerThread(
                lambda: LedgerEnvironment(self.ledger), extensions=protocol == "ext",
                max_sessions=MAX_SESSIONS, resume_grace=self._resume_grace,
                ping_interval=None,
            )
            st.start()
            self._threads[protocol] = st
            # One idle session held for the whole run: with max_sessions lowered to 1,
            # it keeps the server full (capacity faults), without touching the client.
            self._fillers[protocol] = st.call(_open_filler)
        return self

    def __exit__(self, *exc: object) -> None:
        for protocol, st in self._threads.items():
            filler = self._fillers.pop(protocol, None)
            if filler is not None:
                with contextlib.suppress(Exception):
                    st.call(lambda _s, f=filler: f.close(), timeout=10)
            st.stop()
        self._threads.clear()

    def url(self, protocol: str) -> str:
        return self._threads[protocol].url

    def call(self, protocol: str, fn: Callable[[EnvServer], Any]) -> Any:
        return self._threads[protocol].call(fn)

    def wait_requests(self, protocol: str, count: int, stop: threading.Event) -> bool:
        """Wait for the server's ``count``-th step request; ``False`` once ``stop`` is set.

        The wait is the server's own counter (an event, not polling); the 0.5 s bound
        only lets the waiter notice that the load it watches has ended.
        """
        while True:
            try:
                self._threads[protocol].call(lambda s: s.wait_for_request("step", count),
                                             timeout=0.5)
                return True
            except TimeoutError:
                if stop.is_set():
                    return False

    def release_stalled(self, protocol: str) -> None:
        """Un-stall every connection once its episode is over.

        A stalled server connection does not read, so it never notices that the client
        went away; un-stalling it lets the server see the close and free it.
        """
        self.call(protocol, lambda s: s.unstall_all())

    def counters(self, protocol: str) -> dict[str, int]:
        return dict(self.call(protocol, lambda s: {n: s.counter(n) for n in _COUNTERS}))

    # ----------------------------------------------------------------- faults

    def arm(self, protocol: str, kind: str, *, latency: float = 0.0,
            variant: int = 0) -> Arming:
        """Arm one fault of ``kind`` for the server's next request."""
        arming = Arming(kind, latency=latency, before=self.counters(protocol))

        def apply(server: EnvServer) -> None:
            f = server.faults
            if kind.startswith("drop_"):
                f.drop_after = 1
                f.drop_mode = kind[len("drop_"):]  # type: ignore[assignment]
            elif kind == "stall":
                f.stall_after = 1
            elif kind == "slow":
                f.latency = latency
            elif kind == "error":
                f.error_frames = 1
                f.error_code = ("EXECUTION_ERROR", "VALIDATION_ERROR")[variant % 2]
            elif kind == "corrupt":
                f.corrupt_frames = 1
                f.corrupt_kind = CORRUPT[variant % len(CORRUPT)]  # type: ignore[assignment]
            elif kind == "oversize":
                f.corrupt_frames = 1
                f.corrupt_kind = "oversize"
                f.oversize_bytes = CLIENT_MAX_MESSAGE + 4096
            elif kind == "refused_upgrade":
                # A dropped connection, then the reconnect's upgrades are refused.
                f.drop_after = 1
                f.drop_mode = "before_apply"
                f.refuse = 1 + variant % 2
                f.refuse_status = (503, 429)[variant % 2]
                f.retry_after = (None, 0.01)[variant % 2]
            elif kind == "capacity":
                # The server is full (the filler holds the one slot): the reconnect after
                # the drop cannot get a new session (a resumed one is fine).
                server.max_sessions = 1
                f.drop_after = 1
                f.drop_mode = ("before_apply", "after_apply")[variant % 2]
            else:
                raise ValueError(kind)

        self.call(protocol, apply)
        return arming

    def carry(self, protocol: str, arming: Arming) -> Arming:
        """Keep ``arming``'s refusal or full server for the next new connection only."""
        def keep(server: EnvServer) -> None:
            f = server.faults
            f.drop_after = None  # the vehicle: a reset on a new connection needs none
            if arming.kind == "refused_upgrade" and f.refuse == 0:
                f.refuse = 1
        self.call(protocol, keep)
        return arming

    def arm_capacity_only(self, protocol: str) -> Arming:
        """The server is full for the next new session (a reset on a new client)."""
        arming = Arming("capacity", before=self.counters(protocol))

        def apply(server: EnvServer) -> None:
            server.max_sessions = 1

        self.call(protocol, apply)
        return arming

    def disarm(self, protocol: str, arming: Arming) -> bool:
        """Remove what is left of ``arming``; whether the fault fired on the server."""
        def clear(server: EnvServer) -> tuple[bool, dict[str, int]]:
            f = server.faults
            kind = arming.kind
            if kind == "error":
                fired = f.error_frames == 0
            elif kind in ("corrupt", "oversize"):
                fired = f.corrupt_frames == 0
            else:
                fired = False
            f.clear()
            server.max_sessions = MAX_SESSIONS
            return fired, {n: server.counter(n) for n in _COUNTERS}

        fired, after = self.call(protocol, clear)
        before = arming.before or {}

        def delta(name: str) -> int:
            return after[name] - before.get(name, 0)

        kind = arming.kind
        if kind.startswith("drop_"):
            return delta("drop") > 0
        if kind == "stall":
            return delta("stall") > 0
        if kind == "slow":
            return delta("request") > 0
        if kind == "refused_upgrade":
            return delta("refused") > 0
        if kind == "capacity":
            return delta("connection.opened") > delta("session.created") + delta("resume")
        return bool(fired)


async def _open_filler(server: EnvServer) -> Any:
    ws = await connect(server.ws_url, open_timeout=5)
    await server.wait_for("session.created", 1)
    return ws


class ServeProcess:
    """``envlink serve --events`` as a real process, killed with SIGKILL and restarted.

    The server processes are forked from a warm parent that has imported envlink
    (``envlink.server.main``, the ``envlink serve`` entry point, runs in each child), so
    a restart after kill -9 takes milliseconds instead of a cold interpreter start; what
    runs, and what is killed, is an ``envlink serve`` process like any other.

    A supervisor thread reads the event lines; :meth:`kill_on_next` arms a SIGKILL for
    the moment the server announces the next request of a kind (the request has
    arrived; it may or may not be applied when the signal lands), and the same thread
    restarts the server on the same port right after. :meth:`kill_now` does it at once.
    """

    def __init__(self, *, store: str | None, extensions: bool) -> None:
        self._args = ["--env", "deterministic", "--events", "--max-sessions", "1000",
                      "--resume-grace", "5"]
        if store is not None:
            self._args += ["--session-store", store]
        if not extensions:
            self._args.append("--no-extensions")
        self.port = 0
        self.kills = 0
        self.restarts = 0
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}
        self._trigger: tuple[str, int] | None = None
        self._pid: int | None = None
        self._events: Any = None
        self._supervisor: threading.Thread | None = None
        self._restarted: queue.Queue[int] = queue.Queue()
        self._stopping = False
        self._dir = tempfile.mkdtemp(prefix="envlink-chaos-fifo-")
        self._spawned = 0
        self._zygote = subprocess.Popen(
            [sys.executable, "-c", _ZYGOTE, *self._args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            text=True,
        )

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def start(self) -> None:
        self._spawn()
        self._supervisor = threading.Thread(target=self._supervise,
                                            name="chaos-serve-supervisor", daemon=True)
        self._supervisor.start()

    def _spawn(self) -> None:
        self._spawned += 1
        fifo = os.path.join(self._dir, f"events-{self._spawned}")
        os.mkfifo(fifo)
        zygote = self._zygote
        assert zygote.stdin is not None and zygote.stdout is not None
        zygote.stdin.write(f"{self.port} {fifo}\n")
        zygote.stdin.flush()
        pid = int(zygote.stdout.readline())
        events = open(fifo, encoding="utf-8")  # noqa: SIM115 - owned by the supervisor
        os.unlink(fifo)
        line = events.readline()
        prefix = "envlink serve: listening on "
        if not line.startswith(prefix):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            events.close()
            raise RuntimeError(f"envlink serve did not start: {line!r}")
        self.port = int(line.strip().rsplit(":", 1)[1])
        with self._lock:
            self._counts = {}
            self._pid = pid
            self._events = events

    def _supervise(self) -> None:
        while True:
            with self._lock:
                events, pid = self._events, self._pid
            assert events is not None and pid is not None
            for line in events:
                parts = line.split()  # "envlink serve: event NAME VALUE"
                if len(parts) != 5 or parts[2] != "event":
                    continue
                name, value = parts[3], int(parts[4])
                with self._lock:
                    self._counts[name] = value
                    fire = self._trigger is not None and self._trigger[0] == name \
                        and value >= self._trigger[1]
                    if fire:
                        self._trigger = None
                        self._kill_locked()
            # End of the event stream: the process is gone (killed).
            events.close()
            with self._lock:
                self._pid = None
                stopping = self._stopping
            if stopping:
                return
            self._spawn()
            self.restarts += 1
            self._restarted.put(self.restarts)

    def _kill_locked(self) -> None:
        # The pid is live until its event stream ends (the supervisor clears it then).
        if self._pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._pid, signal.SIGKILL)
            self.kills += 1

    def kill_on_next(self, event: str) -> None:
        """SIGKILL (then restart) when the server announces the next ``event``."""
        with self._lock:
            self._trigger = (event, self._counts.get(event, 0) + 1)

    def disarm(self) -> bool:
        """Cancel an armed kill; whether it had already fired."""
        with self._lock:
            fired = self._trigger is None
            self._trigger = None
        return fired

    def kill_now(self, timeout: float = 30.0) -> None:
        """SIGKILL the server and return once its successor listens on the same port."""
        expected = self.restarts + 1
        with self._lock:
            self._kill_locked()
        self.wait_restarted(expected, timeout)

    def wait_restarted(self, count: int, timeout: float = 30.0) -> None:
        """Return once the server has been restarted ``count`` times in all."""
        while self.restarts < count:
            self._restarted.get(timeout=timeout)

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
            self._kill_locked()
            self.kills -= 1  # not a chaos kill
        if self._supervisor is not None:
            self._supervisor.join(30)
        zygote = self._zygote
        if zygote.stdin is not None:
            zygote.stdin.close()
        zygote.wait(10)
        if zygote.stdout is not None:
            zygote.stdout.close()
        shutil.rmtree(self._dir, ignore_errors=True)


# The warm parent: imports envlink once, then forks one ``envlink serve`` per line read
# ("PORT FIFO"), the child's stdout going to FIFO; answers with the child's pid.
_ZYGOTE = """
import os, signal, sys
from envlink.server import main
signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
for line in sys.stdin:
    port, fifo = line.split()
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        fd = os.open(fifo, os.O_WRONLY)
        os.dup2(fd, 1)
        os.close(fd)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os._exit(main(["--port", port, *sys.argv[1:]]))
    print(pid, flush=True)
"""
