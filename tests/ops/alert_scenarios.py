"""The failures behind each alert, produced for real: one scenario per process.

    python tests/ops/alert_scenarios.py SCENARIO [--duration S]

runs ``SCENARIO`` against reference servers of its own on 127.0.0.1, with envlink's
telemetry on a Prometheus scrape endpoint (its URL is printed as
``scenario: metrics URL``), until SIGTERM or ``--duration`` seconds have passed.
tests/ops/test_alerts_live.py runs every scenario at once under one Prometheus (one
scrape job each) and checks which alerts fire for which scenario.

Clients connect as the README shows (``with EchoEnv(url).sync() as env:``). Each
scenario keeps a steady background of successful calls where its failure alone
must not burn the error budget, and paces its failures so that the rates the
rules read (with the suite's shortened windows) cross the threshold of its own
alert and no other. The numbers are in :data:`PACE`.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from envlink import (
    CallToolAction,
    EchoEnv,
    EnvlinkError,
    EnvPool,
    GenericEnvClient,
    ReconnectPolicy,
    RetryBudget,
)
from envlink.server import ServerThread, StepResult
from envlink.telemetry import TelemetryHandle, configure

# Run as a script: the tests' shared helpers are one folder up.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _ports import restartable_port  # type: ignore[import-not-found]

#: The line printed once the scrape endpoint listens: ``PREFIX + url``.
METRICS_PREFIX = "scenario: metrics "

#: Seconds between failures, per scenario, chosen against the shortened rule windows
#: of the suite (5m -> 60s): e.g. a session lost under ``raise`` every 40 s keeps the
#: recovery-failure ratio defined in every 60 s window (at least one loss) while the
#: loss rate stays under 0.05/s (at most two losses: 0.033/s).
#: A counter's first increment creates its series, which rate() does not count: a
#: scenario's alert stands on its second failure of a kind and later ones.
PACE = {
    "budget": 30.0,          # one connect() refused by the budget every 30 s
    "sessions-lost": 3.0,    # a server restart mid-episode every 3 s (0.33/s)
    "lost-under-raise": 40.0,
    "recovery-failing": 35.0,  # resume, resume, replay, replay, ...
}
#: One injected error frame in this many calls (1 %: between the slow burn's 0.6 %
#: and the fast burn's 1.44 %).
SLOW_BURN_EVERY = 100
#: Seconds between the steady background's episodes (a reset and 9 steps): about 25
#: calls a second, enough that a scenario's own failures stay far below the slow
#: burn's 0.6 %, little enough that ten scenarios share two cores.
STEADY_PAUSE = 0.35
#: Clients of the flapping server: each reconnects after each restart (one a second),
#: so the reconnect rate is about this many per second (less the restarts' own time).
FLAPPING_CLIENTS = 6
#: Server latency of the latency scenario: above the 1 s SLO, within every timeout.
LATENCY_S = 1.3

_FAST = ReconnectPolicy(max_attempts=20, initial_delay=0.01, max_delay=0.05,
                        max_elapsed=5.0, stable_after=0.0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _step(env: Any, i: int) -> None:
    env.step(CallToolAction(tool_name="echo_message", arguments={"message": f"m{i}"}))


class Scenarios:
    """Every scenario, each a loop that runs until :attr:`stop` is set."""

    def __init__(self, handle: TelemetryHandle, stop: threading.Event,
                 armed: threading.Event) -> None:
        self.handle = handle
        self.stop = stop
        #: Set once Prometheus scrapes this process (``--armed-by-signal``), or at once.
        self.armed = armed
        self._threads: list[threading.Thread] = []

    # ----------------------------------------------------------------- helpers

    def client(self, url: str, **kwargs: Any) -> EchoEnv:
        kwargs.setdefault("reconnect", _FAST)
        return EchoEnv(base_url=url, meter_provider=self.handle.meter_provider, **kwargs)

    def background(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` in a thread of its own (joined when the scenario ends)."""
        thread = threading.Thread(target=fn, daemon=True)
        thread.start()
        self._threads.append(thread)

    def join(self) -> None:
        for thread in self._threads:
            thread.join(30)

    def steady(self, url: str, steps: int = 9, pause: float = STEADY_PAUSE) -> None:
        """Clean episodes (a reset and ``steps`` steps) until stopped: the calls that
        keep a scenario's own failures a small share of its traffic."""
        with self.client(url).sync() as env:
            while not self.stop.is_set():
                try:
                    env.reset()
                    for i in range(steps):
                        _step(env, i)
                except EnvlinkError:
                    if self.stop.is_set():
                        return  # the scenario's servers are stopping
                    raise
                self.stop.wait(pause)

    def every(self, seconds: float) -> Iterator[int]:
        """0, 1, 2... one every ``seconds`` (the first at once), until stopped."""
        for n in itertools.count():
            if self.stop.is_set():
                return
            yield n
            if self.stop.wait(seconds):
                return

    # --------------------------------------------------------------- scenarios

    def healthy(self) -> None:
        """Clean episodes only: no alert may fire."""
        with ServerThread(env="echo") as server:
            self.background(lambda: self.steady(server.url))
            self.steady(server.url)

    def outage(self) -> None:
        """Every server down: clients keep trying to connect, as the README shows."""
        url = f"http://127.0.0.1:{_free_port()}"  # nothing listens there
        policy = ReconnectPolicy(max_attempts=3, initial_delay=0.05, max_delay=0.1)

        def connect_forever() -> None:
            while not self.stop.is_set():
                with contextlib.suppress(EnvlinkError), \
                        self.client(url, reconnect=policy).sync() as env:
                    env.reset()
                self.stop.wait(0.2)

        self.background(connect_forever)
        connect_forever()

    def slow_burn(self) -> None:
        """1 % of calls answered with an error frame (the server's own failure).

        The calls are counted from :attr:`armed` on, so the first failure comes after
        ``SLOW_BURN_EVERY`` calls that Prometheus saw. A failure before the first
        scrape would put a failure and a handful of calls in a fresh Prometheus's
        first windows, a ratio above the fast burn's.
        """
        with ServerThread(env="echo") as server, self.client(server.url).sync() as env:
            calls = 0
            while not self.stop.is_set():
                armed = self.armed.is_set()
                env.reset()
                calls += armed
                for i in range(9):
                    calls += armed
                    if armed and calls % SLOW_BURN_EVERY == 0:
                        server.call(_set_faults(error_frames=1))
                    with contextlib.suppress(EnvlinkError):
                        _step(env, i)
                self.stop.wait(STEADY_PAUSE)

    def budget(self) -> None:
        """Upgrades refused until the shared retry budget runs out, while connecting."""
        with ServerThread(env="echo") as server:
            ready = threading.Event()

            def steady() -> None:
                with self.client(server.url).sync() as env:
                    ready.set()
                    while not self.stop.is_set():
                        env.reset()
                        for i in range(9):
                            _step(env, i)
                        self.stop.wait(STEADY_PAUSE)

            self.background(steady)
            ready.wait(10)
            # The server now refuses every new WebSocket upgrade (at capacity, say);
            # the steady client keeps the connection it has.
            server.call(_set_faults(refuse=10**9))
            budget = RetryBudget(max_tokens=2.0, token_ratio=0.1)
            policy = ReconnectPolicy(max_attempts=5, initial_delay=0.01, max_delay=0.02,
                                     budget=budget)
            for _ in self.every(PACE["budget"]):
                with contextlib.suppress(EnvlinkError), \
                        self.client(server.url, reconnect=policy).sync() as env:
                    env.reset()

    def latency(self) -> None:
        """Every answer delayed above the latency SLO."""
        with ServerThread(env="echo") as server:
            server.call(_set_faults(latency=LATENCY_S))
            for _ in range(3):
                self.background(lambda: self.steady(server.url, steps=3, pause=0.0))
            self.steady(server.url, steps=3, pause=0.0)

    def flapping(self) -> None:
        """A server that goes down and comes back every second, between episodes: each
        of its clients reconnects after every restart, no episode is interrupted."""
        port = restartable_port()
        url = f"http://127.0.0.1:{port}"
        quiet = _BetweenEpisodes()
        server = ServerThread(env="echo", port=port)
        server.start()

        def client() -> None:
            with self.client(url).sync() as env:
                while not self.stop.is_set():
                    with quiet.episode():
                        env.reset()
                        for i in range(3):
                            _step(env, i)
                    self.stop.wait(0.1)

        try:
            for _ in range(FLAPPING_CLIENTS):
                self.background(client)
            for _ in self.every(1.0):
                with quiet.restart():
                    server.stop()
                    server = ServerThread(env="echo", port=port)
                    server.start()
        finally:
            server.stop()

    def sessions_lost(self) -> None:
        """Servers killed mid-episode, the sessions rebuilt by replay on the restarted one."""
        self._killed_mid_episode(PACE["sessions-lost"], on_session_lost="replay")

    def lost_under_raise(self) -> None:
        """Servers killed mid-episode under ``on_session_lost="raise"``: episodes lost."""
        self._killed_mid_episode(PACE["lost-under-raise"], on_session_lost="raise")

    def _killed_mid_episode(self, pace: float, **options: Any) -> None:
        port = restartable_port()
        holder = [ServerThread(env="echo", port=port)]
        holder[0].start()
        with ServerThread(env="echo") as steady_server:
            self.background(lambda: self.steady(steady_server.url))
            try:
                with self.client(f"http://127.0.0.1:{port}", **options).sync() as env:
                    for _ in self.every(pace):
                        with contextlib.suppress(EnvlinkError):
                            env.reset()
                            _step(env, 0)
                            holder[0].stop()  # killed mid-episode, back at once
                            holder[0] = ServerThread(env="echo", port=port)
                            holder[0].start()
                            _step(env, 1)
            finally:
                holder[0].stop()

    def recovery_failing(self) -> None:
        """Recovery that cannot work: resuming on a server restarted without the session
        (resume impossible), and replaying on an environment that answers differently
        (replay diverging), each kind twice in a row (see :data:`PACE`)."""
        port = restartable_port()
        holder = [ServerThread(env="echo", port=port)]
        holder[0].start()
        generations = itertools.count()

        class Drifting:
            """Observations name the server's session: a replay never matches."""

            def __init__(self) -> None:
                self.generation = next(generations)

            def reset(self, **kwargs: Any) -> StepResult:
                return StepResult(observation={"generation": self.generation})

            def step(self, action: dict[str, Any]) -> StepResult:
                return StepResult(observation={"generation": self.generation})

            def state(self) -> dict[str, Any]:
                return {}

        with ServerThread(env="echo") as steady_server, \
                ServerThread(env=Drifting) as drifting:
            self.background(lambda: self.steady(steady_server.url))
            resuming = self.client(f"http://127.0.0.1:{port}",
                                   on_session_lost="resume").sync()
            replaying = GenericEnvClient(drifting.url, on_session_lost="replay",
                                         reconnect=_FAST,
                                         meter_provider=self.handle.meter_provider).sync()
            try:
                for n in self.every(PACE["recovery-failing"]):
                    with contextlib.suppress(EnvlinkError):
                        if n % 4 < 2:
                            resuming.reset()
                            _step(resuming, 0)
                            holder[0].stop()
                            holder[0] = ServerThread(env="echo", port=port)
                            holder[0].start()
                            _step(resuming, 1)
                        else:
                            replaying.reset()
                            replaying.step({})
                            drifting.call(_drop_newest)
                            replaying.step({})
            finally:
                resuming.close()
                replaying.close()
                holder[0].stop()

    def pool(self) -> None:
        """The demo workload's EnvPool cycle: a full steady server, a flapping one
        (its breaker opens, half-opens and closes), ready-first steps with a straggler."""
        sys.path.insert(0, str(_WORKLOAD_DIR))
        from workload import Workload  # type: ignore[import-not-found]

        with ServerThread(env="echo") as chaos, \
                ServerThread(env="echo", max_sessions=1) as full, \
                ServerThread(env="echo") as roomy, \
                self.client(full.url).sync() as squatter:
            squatter.reset()  # holds the full server's only session
            work = Workload(self.handle, chaos, None, 3)
            try:
                while not self.stop.is_set():
                    with contextlib.suppress(EnvlinkError):
                        work.pool()
                        # A new pool places one session on each endpoint; the full
                        # server refuses its one (capacity_reached), which is placed
                        # on the other endpoint instead.
                        with EnvPool([full.url, roomy.url], 2, client=EchoEnv,
                                     client_options={"reconnect": _FAST},
                                     meter_provider=self.handle.meter_provider).sync() as pool:
                            pool.reset(seeds=0)
                    self.stop.wait(0.5)
            finally:
                work.close()


class _BetweenEpisodes:
    """Clients run episodes side by side; a server restart waits until none is running
    (and holds new ones back until it is done), so it never interrupts an episode."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._active = 0
        self._restarting = False

    @contextlib.contextmanager
    def episode(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._restarting)
            self._active += 1
        try:
            yield
        finally:
            with self._cond:
                self._active -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def restart(self) -> Iterator[None]:
        with self._cond:
            self._restarting = True
            self._cond.wait_for(lambda: self._active == 0)
        try:
            yield
        finally:
            with self._cond:
                self._restarting = False
                self._cond.notify_all()


def _set_faults(**faults: Any) -> Callable[[Any], None]:
    def apply(server: Any) -> None:
        for key, value in faults.items():
            setattr(server.faults, key, value)
    return apply


def _drop_newest(server: Any) -> None:
    """The newest connection is aborted at its next request (no close frame)."""
    handle = server.connections[-1]
    handle.faults.drop_after = handle.requests + 1


#: The demo workload (deploy/workload/workload.py), whose EnvPool cycle the pool
#: scenario reuses.
_WORKLOAD_DIR = Path(__file__).resolve().parents[2] / "deploy" / "workload"

#: Scenario names (the command line's, and the suite's scrape jobs) and their loops.
SCENARIOS: dict[str, Callable[[Scenarios], None]] = {
    "healthy": Scenarios.healthy,
    "outage": Scenarios.outage,
    "slow-burn": Scenarios.slow_burn,
    "budget": Scenarios.budget,
    "latency": Scenarios.latency,
    "flapping": Scenarios.flapping,
    "sessions-lost": Scenarios.sessions_lost,
    "lost-under-raise": Scenarios.lost_under_raise,
    "recovery-failing": Scenarios.recovery_failing,
    "pool": Scenarios.pool,
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("scenario", choices=sorted(SCENARIOS))
    p.add_argument("--duration", type=float, default=None, help="stop after S seconds")
    p.add_argument("--armed-by-signal", action="store_true",
                   help="hold the failures that a scenario counts in calls (slow-burn) "
                        "until SIGUSR1, sent once Prometheus scrapes this process")
    args = p.parse_args(argv)
    stop, armed = threading.Event(), threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    if args.armed_by_signal:
        signal.signal(signal.SIGUSR1, lambda *_: armed.set())
    else:
        armed.set()
    if args.duration:
        threading.Timer(args.duration, stop.set).start()
    handle = configure(service_name=f"envlink-{args.scenario}", prometheus_port=0,
                       set_global=False)
    try:
        print(METRICS_PREFIX + str(handle.prometheus_url), flush=True)
        scenarios = Scenarios(handle, stop, armed)
        try:
            SCENARIOS[args.scenario](scenarios)
        finally:
            stop.set()
            scenarios.join()
    finally:
        handle.shutdown(timeout_s=10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
