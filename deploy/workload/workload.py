"""A demo workload: episodes through envlink, with faults injected, exporting telemetry.

Runs one cycle of scenarios after another until stopped (SIGTERM/SIGINT) or until
``--duration`` seconds have passed:

- clean episodes against ``--target`` (a reference server, e.g. the compose stack's)
  or, without one, against an in-process reference server;
- on an in-process reference server whose faults this script arms (the faults live
  in the server, so the workload owns one): an error frame (``server_error``), a
  refused WebSocket upgrade (reconnect, ``handshake_rejected``), a connection lost
  mid-episode recovered by ``replay`` and by ``resume``, one lost under
  ``on_session_lost="raise"`` (a failed recovery), a call over its deadline
  (``timeout``), and repeated refusals that exhaust a small retry budget
  (``retry_budget_exhausted``);
- one small ``EnvPool``, kept from cycle to cycle, over two in-process servers of
  its own: a steady one that takes 2 of its 3 sessions (``max_sessions=2``) and a
  flapping one, up one cycle and down the next. When it goes down its session is
  lost; the next batch reset finds it gone, its breaker opens, the steady server
  is full (``capacity_reached``), a half-open probe fails (``unreachable``) and
  that slot's reset fails. When it is back, the slot's reset probes it again and
  the breaker closes (``placed``). So every breaker transition (``open``,
  ``half_open``, ``closed``), the breaker-state gauge moving between them, batch
  resets and steps, and a ready-first step (``step_recv(min_ready=...)`` with one
  slow session) that leaves a straggler.

Telemetry: ``envlink.telemetry.configure()``; ``--prometheus-port`` serves a scrape
endpoint (its URL is printed as ``workload: metrics URL``), and the standard
``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_SERVICE_NAME`` variables send OTLP to a
Collector. ``--serve`` instead runs the reference server with OTLP tracing on.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from envlink import (
    CallToolAction,
    EchoEnv,
    EnvlinkError,
    EnvPool,
    ReconnectPolicy,
    RetryBudget,
    SyncEnvPool,
    Timeout,
)
from envlink.server import ServerThread
from envlink.telemetry import TelemetryHandle, configure

#: The line printed once the scrape endpoint listens: ``PREFIX + url``.
METRICS_PREFIX = "workload: metrics "
#: The line printed after each completed cycle: ``PREFIX + n``.
CYCLE_PREFIX = "workload: cycle "

_FAST = ReconnectPolicy(max_attempts=3, initial_delay=0.01, max_delay=0.05,
                        stable_after=0.0)
#: The workload's EnvPool: sessions, and how long a slot waits for room: longer than
#: the breaker's reset timeout (one half-open probe of the down server, which fails),
#: short enough that the slot gives up within the cycle.
POOL_SIZE = 3
_POOL_BREAKER_RESET = 0.1
_POOL_CAPACITY = ReconnectPolicy(max_attempts=20, initial_delay=0.02, max_delay=0.05,
                                 max_elapsed=0.3)


def _arm(st: ServerThread, **faults: Any) -> None:
    """Arm one-shot faults on the newest connection (``*_after`` relative to now)."""

    def apply(server: Any) -> None:
        handle = server.connections[-1]
        for key, value in faults.items():
            setattr(handle.faults, key, handle.requests + value if key.endswith("_after")
                    else value)

    st.call(apply)


def _server_faults(st: ServerThread, **faults: Any) -> None:
    """Set server-wide faults (upgrade refusals are server-wide only)."""

    def apply(server: Any) -> None:
        for key, value in faults.items():
            setattr(server.faults, key, value)

    st.call(apply)


@contextlib.contextmanager
def _slow_newest(st: ServerThread, seconds: float) -> Iterator[None]:
    """Delay every answer on the server's newest connection, until the block ends."""
    handles: list[Any] = []

    def slow(server: Any) -> None:
        handles.append(server.connections[-1])
        handles[0].faults.latency = seconds

    def restore(server: Any) -> None:
        handles[0].faults.latency = 0.0

    st.call(slow)
    try:
        yield
    finally:
        st.call(restore)


def _down_url() -> str:
    """A loopback URL nothing listens on (a port taken, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def _step(env: Any, i: int) -> None:
    env.step(CallToolAction(tool_name="echo_message", arguments={"message": f"m{i}" * 8}))


class Workload:
    """The scenarios, against one in-process fault server and an optional target."""

    def __init__(self, handle: TelemetryHandle, chaos: ServerThread, target: str | None,
                 steps: int) -> None:
        self._handle = handle
        self._chaos = chaos
        self._target = target or chaos.url
        self._chaos_url = chaos.url
        self._steps = steps
        # The pool's servers: a steady one with room for all but one of its sessions,
        # and one that is up every other cycle, on a port kept for it.
        self._steady = ServerThread(env="echo", max_sessions=POOL_SIZE - 1,
                                    tracer_provider=handle.tracer_provider)
        self._steady.start()
        self._flapping_url = _down_url()
        self._flapping_port = int(self._flapping_url.rsplit(":", 1)[1])
        self._flapping: ServerThread | None = None
        self._pool: SyncEnvPool[Any, Any] | None = None

    def _client(self, url: str, **kwargs: Any) -> EchoEnv:
        kwargs.setdefault("reconnect", _FAST)
        return EchoEnv(base_url=url, tracer_provider=self._handle.tracer_provider,
                       meter_provider=self._handle.meter_provider, **kwargs)

    def scenarios(self) -> list[Callable[[], None]]:
        return [self.clean, self.error_frame, self.refused_upgrade, self.replay,
                self.resume, self.lost, self.deadline, self.budget_exhausted, self.pool]

    def pool(self) -> None:
        # One pool for the workload's life (see the module docstring): the flapping
        # server toggles each cycle, so its breaker goes open -> half_open -> closed.
        self._flap()
        pool = self._ensure_pool()
        action = CallToolAction(tool_name="echo_message", arguments={"message": "p"})
        reset = pool.reset(seeds=0)
        live = [i not in reset.errors for i in range(POOL_SIZE)]
        if not any(live):
            return
        pool.step([action] * POOL_SIZE, mask=live)
        # Ready-first: the newest session of the steady server (always one of the
        # pool's) answers 0.2 s late, so a receive of all but one returns with it
        # still in flight (a straggler); the delay is removed once it is collected.
        pool.step_send([action] * POOL_SIZE, mask=live)
        if sum(live) > 1:
            with _slow_newest(self._steady, 0.2):
                first = pool.step_recv(min_ready=sum(live) - 1)
                if first.stragglers:
                    pool.step_recv()  # collect it
        else:
            pool.step_recv()

    def _ensure_pool(self) -> SyncEnvPool[Any, Any]:
        if self._pool is None:
            self._pool = EnvPool(
                [self._steady.url, self._flapping_url], POOL_SIZE, client=EchoEnv,
                client_options={"reconnect": _FAST}, batch_timeout=10.0,
                breaker_threshold=1, breaker_reset_timeout=_POOL_BREAKER_RESET,
                capacity=_POOL_CAPACITY,
                tracer_provider=self._handle.tracer_provider,
                meter_provider=self._handle.meter_provider).sync()
        return self._pool

    def _flap(self) -> bool:
        """Start the flapping server if it is down, stop it if it is up; whether it is up."""
        if self._flapping is not None:
            self._flapping.stop()
            self._flapping = None
            return False
        flapping = ServerThread(env="echo", port=self._flapping_port,
                                tracer_provider=self._handle.tracer_provider)
        try:
            flapping.start()
        except OSError as exc:  # the port was taken meanwhile: it stays down this cycle
            print(f"workload: flapping server: {exc}", file=sys.stderr, flush=True)
            return False
        self._flapping = flapping
        return True

    def close(self) -> None:
        """Close the pool and stop the pool's servers."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        if self._flapping is not None:
            self._flapping.stop()
            self._flapping = None
        self._steady.stop()

    def clean(self) -> None:
        # The deployed server requires a bearer token (ENVLINK_AUTH_TOKEN, from a
        # Kubernetes Secret or the compose env file); the in-process one does not.
        token = os.environ.get("ENVLINK_AUTH_TOKEN")
        auth = {"headers": {"Authorization": f"Bearer {token}"}} \
            if token and self._target != self._chaos_url else {}
        with self._client(self._target, **auth).sync() as env:
            env.reset()
            for i in range(self._steps):
                _step(env, i)
            env.state()

    def error_frame(self) -> None:
        with self._client(self._chaos.url).sync() as env, contextlib.suppress(EnvlinkError):
            env.reset()
            _arm(self._chaos, error_frames=1)
            _step(env, 0)

    def refused_upgrade(self) -> None:
        with self._client(self._chaos.url).sync() as env:
            env.state()
            # Lost before any episode: retried transparently, and the reconnect is
            # refused once (a scheduled reconnect after handshake_rejected).
            _server_faults(self._chaos, refuse=1)
            _arm(self._chaos, drop_after=1)
            env.state()

    def replay(self) -> None:
        with self._client(self._chaos.url, on_session_lost="replay").sync() as env:
            env.reset()
            _step(env, 0)
            _arm(self._chaos, drop_after=1)
            _step(env, 1)

    def resume(self) -> None:
        with self._client(self._chaos.url, on_session_lost="resume").sync() as env:
            env.reset()
            _step(env, 0)
            _arm(self._chaos, drop_after=1, drop_mode="after_apply")
            _step(env, 1)

    def lost(self) -> None:
        with self._client(self._chaos.url, on_session_lost="raise").sync() as env, \
                contextlib.suppress(EnvlinkError):
            env.reset()
            _arm(self._chaos, drop_after=1)
            _step(env, 0)

    def deadline(self) -> None:
        with self._client(self._chaos.url, timeout=Timeout(2.0, call=0.05)).sync() as env, \
                contextlib.suppress(EnvlinkError):
            env.reset()
            _arm(self._chaos, latency=0.2)  # this connection only
            _step(env, 0)

    def budget_exhausted(self) -> None:
        # A small shared budget: the first retry spends it down to half, so the
        # second reconnect attempt of this outage is refused by the budget.
        policy = ReconnectPolicy(max_attempts=5, initial_delay=0.01, max_delay=0.05,
                                 budget=RetryBudget(max_tokens=2.0, token_ratio=0.1))
        try:
            with self._client(self._chaos.url, reconnect=policy).sync() as env, \
                    contextlib.suppress(EnvlinkError):
                env.state()
                _server_faults(self._chaos, refuse=4)
                _arm(self._chaos, drop_after=1)
                env.state()
        finally:
            _server_faults(self._chaos, refuse=0)


def run(args: argparse.Namespace, stop: threading.Event) -> int:
    handle = configure(service_name=args.service_name, prometheus_port=args.prometheus_port,
                       prometheus_host=args.prometheus_host, set_global=False)
    try:
        if handle.prometheus_url is not None:
            print(METRICS_PREFIX + handle.prometheus_url, flush=True)
        with ServerThread(env="echo", tracer_provider=handle.tracer_provider) as chaos:
            work = Workload(handle, chaos, args.target, args.steps)
            try:
                _cycles(work, args, stop)
            finally:
                work.close()
    finally:
        handle.shutdown(timeout_s=10)
    return 0


def _cycles(work: Workload, args: argparse.Namespace, stop: threading.Event) -> None:
    """Run every scenario, cycle after cycle, until stopped or ``--duration`` is over."""
    deadline = time.monotonic() + args.duration if args.duration else None
    cycle = 0
    while not stop.is_set() and (deadline is None or time.monotonic() < deadline):
        for scenario in work.scenarios():
            if stop.is_set():
                break
            try:
                scenario()
            except EnvlinkError as exc:  # a fault that outlived its scenario
                print(f"workload: {scenario.__name__}: {type(exc).__name__}: {exc}",
                      file=sys.stderr, flush=True)
        cycle += 1
        print(f"{CYCLE_PREFIX}{cycle}", flush=True)
        stop.wait(args.pause)


def serve(args: argparse.Namespace, extra: list[str]) -> int:
    """The reference server with the OpenTelemetry SDK on (OTEL_* variables).

    Arguments the workload does not know are passed to ``envlink serve``
    (``--max-sessions``, ``--resume-grace``, ``--session-store``...).
    """
    from envlink.server import main as serve_main

    handle = configure(service_name=args.service_name)
    try:
        return serve_main(["--host", args.host, "--port", str(args.port), *extra])
    finally:
        handle.shutdown(timeout_s=10)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="workload", description=__doc__.splitlines()[0])
    p.add_argument("--target", default=None, metavar="URL",
                   help="reference server for clean episodes (default: the in-process one)")
    p.add_argument("--prometheus-port", type=int, default=None, metavar="P",
                   help="serve a Prometheus scrape endpoint (0: any free port)")
    p.add_argument("--prometheus-host", default="127.0.0.1")
    p.add_argument("--service-name", default=None,
                   help="service.name (default: OTEL_SERVICE_NAME, else envlink)")
    p.add_argument("--steps", type=int, default=5, help="steps per clean episode")
    p.add_argument("--pause", type=float, default=0.2, help="seconds between cycles")
    p.add_argument("--duration", type=float, default=None, help="stop after S seconds")
    p.add_argument("--serve", action="store_true",
                   help="run the traced reference server instead (--host, --port, and "
                        "any option of envlink serve)")
    p.add_argument("--host", default="0.0.0.0", help="with --serve: address to listen on")
    p.add_argument("--port", type=int, default=8000, help="with --serve: port")
    args, extra = p.parse_known_args(argv)
    if args.serve:
        return serve(args, extra)
    if extra:
        p.error(f"unrecognized arguments: {' '.join(extra)}")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return run(args, stop)


if __name__ == "__main__":
    sys.exit(main())
