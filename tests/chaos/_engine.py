"""The chaos engine: seeded episodes through every client face, faults, invariants, report.

An *episode* is a client (async, sync facade, or one sync facade shared by 8 caller
threads), a recovery policy (raise, replay, resume) and a protocol (plain OpenEnv or
envlink extensions), running resets, steps and state reads against the reference
server's deterministic environment while faults are injected. Everything is drawn from
one seeded RNG per episode, so ``seed`` + episode number reproduces it (timing aside).

After every episode the records of each segment (one reset seed) go through
:func:`_oracle.check_segment`, and what the episode's recorder wrote goes through
:func:`_recordings.check_recording`; threads, tasks, file descriptors and memory are
watched across episodes. Only the public envlink API and the reference server are used
(and envlink's own reader of rollout files).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import gc
import json
import os
import random
import shutil
import statistics
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import envlink
from envlink import (
    CallTimeoutError,
    EnvlinkError,
    GenericEnvClient,
    ReconnectPolicy,
    RolloutRecorder,
    SessionLostError,
    SyncEnvClient,
    Timeout,
)

from ._oracle import MAX_STEPS, Call, Ledger, check_segment, project
from ._recordings import check_recording
from ._servers import (
    CLIENT_MAX_MESSAGE,
    FAULT_KINDS,
    IN_PROCESS_KINDS,
    InProcessServers,
    ServeProcess,
)

__all__ = ["ChaosConfig", "ChaosRun", "Stats", "run_chaos"]

DRIVERS = ("async", "sync", "threads")
POLICIES = ("raise", "replay", "resume")
PROTOCOLS = ("plain", "ext")
THREADS = 8
#: Seconds a call may take beyond its own deadline.
TOLERANCE = 0.1
#: The recording checks' counts, in the report.
RECORDING_KEYS = ("phases", "files", "episodes", "steps", "unknown_steps", "broken_lines",
                  "incomplete")
_HARNESS_THREADS = ("chaos-", "envlink-test-server", "asyncio_")


@dataclass
class ChaosConfig:
    """How much chaos to run.

    Attributes:
        seed: the run's seed; episode ``n`` draws from ``Random(f"{seed}:{n}")``.
        episodes: in-process episodes (every fault kind but kill -9), at least.
        kill_episodes: episodes against ``envlink serve`` processes killed with SIGKILL,
            at least.
        fault_target: keep running episodes (of each stream) until every fault kind
            of that stream was injected this many times (0: no target).
        max_episodes: cap on the episodes of each stream when chasing a target.
        calls: calls per in-process episode (the threads driver makes ``THREADS *
            calls // 4`` calls, in waves).
        faults_per_episode: faults armed per in-process episode (several per episode,
            so that the soak reaches its per-kind counts with few episodes).
        kills_per_episode: kill -9 per kill episode.
        shard: ``(i, n)``: run only episodes whose number is ``i`` modulo ``n`` (workers).
        streams: ``"inprocess"`` and/or ``"kill"``.
        report: where the JSON report goes (default: a temporary directory).
        label: name of the run in the report and the summary.
        recordings: where each episode's recorder writes (a directory per episode,
            removed once checked; default: a temporary directory, removed at the end).
    """

    seed: int = 9
    episodes: int = 36
    kill_episodes: int = 4
    fault_target: int = 0
    max_episodes: int = 100_000
    calls: int = 12
    faults_per_episode: int = 6
    kills_per_episode: int = 3
    shard: tuple[int, int] = (0, 1)
    streams: tuple[str, ...] = ("inprocess", "kill")
    report: Path | None = None
    label: str = "bounded"
    recordings: Path | None = None

    @property
    def waves(self) -> int:
        return max(1, self.calls // 4)


@dataclass
class Stats:
    """What a chaos run did and found."""

    episodes: Counter[str] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)
    armed: Counter[str] = field(default_factory=Counter)
    calls: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)
    violation_count: int = 0
    leaks: list[str] = field(default_factory=list)
    late_max: float = 0.0
    #: Calls later than deadline + tolerance only by the CPU starvation measured in them.
    late_excused: int = 0
    rss_mb: list[float] = field(default_factory=list)
    fds: list[int] = field(default_factory=list)
    seconds: float = 0.0
    #: What the recording checks read: phases, files, episodes, steps, unknown steps,
    #: broken lines, incomplete episodes.
    recording: Counter[str] = field(default_factory=Counter)

    def violation(self, text: str) -> None:
        self.violation_count += 1
        if len(self.violations) < 200:
            self.violations.append(text)

    def to_dict(self, config: ChaosConfig) -> dict[str, Any]:
        return {
            "label": config.label,
            "seed": config.seed,
            "config": {k: (str(v) if isinstance(v, Path) else v)
                       for k, v in config.__dict__.items()},
            "envlink_version": envlink.__version__,
            "seconds": round(self.seconds, 2),
            "episodes": {"total": sum(v for k, v in self.episodes.items()
                                      if k.startswith("driver:")), **dict(self.episodes)},
            "faults": {kind: self.faults[kind] for kind in FAULT_KINDS},
            "faults_armed": {kind: self.armed[kind] for kind in FAULT_KINDS},
            "calls": dict(self.calls),
            "errors_by_type": dict(self.errors.most_common()),
            "violations": self.violation_count,
            "violation_samples": self.violations,
            "leaks": len(self.leaks),
            "leak_samples": self.leaks[:50],
            "max_seconds_past_deadline": round(self.late_max, 4),
            "late_excused_by_cpu_starvation": self.late_excused,
            "rss_mb": _trend(self.rss_mb),
            "fds": _trend([float(n) for n in self.fds]),
            "recording": {k: self.recording[k] for k in RECORDING_KEYS},
            "workers": 1,
        }


def _trend(samples: list[float]) -> dict[str, Any]:
    if not samples:
        return {"samples": 0}
    quarter = max(1, len(samples) // 4)
    return {"samples": len(samples), "first": samples[0], "last": samples[-1],
            "max": max(samples),
            "median_second_quarter": statistics.median(samples[quarter:2 * quarter] or
                                                       samples),
            "median_last_quarter": statistics.median(samples[-quarter:])}


def merge_reports(reports: list[dict[str, Any]], *, label: str, seed: int,
                  seconds: float) -> dict[str, Any]:
    """One report from the reports of the workers of one run."""
    def add(key: str) -> dict[str, int]:
        total: Counter[str] = Counter()
        for r in reports:
            total.update(r[key])
        return dict(total)

    return {
        "label": label,
        "seed": seed,
        "config": [r["config"] for r in reports],
        "envlink_version": envlink.__version__,
        "seconds": round(seconds, 2),
        "episodes": add("episodes"),
        "faults": {k: sum(r["faults"][k] for r in reports) for k in FAULT_KINDS},
        "faults_armed": {k: sum(r["faults_armed"][k] for r in reports) for k in FAULT_KINDS},
        "calls": add("calls"),
        "errors_by_type": dict(Counter(add("errors_by_type")).most_common()),
        "violations": sum(r["violations"] for r in reports),
        "violation_samples": [v for r in reports for v in r["violation_samples"]][:200],
        "leaks": sum(r["leaks"] for r in reports),
        "leak_samples": [v for r in reports for v in r["leak_samples"]][:50],
        "max_seconds_past_deadline": max(r["max_seconds_past_deadline"] for r in reports),
        "late_excused_by_cpu_starvation": sum(r["late_excused_by_cpu_starvation"]
                                              for r in reports),
        "rss_mb": [r["rss_mb"] for r in reports],
        "fds": [r["fds"] for r in reports],
        "recording": {k: sum(r["recording"][k] for r in reports) for k in RECORDING_KEYS},
        "workers": len(reports),
    }


def format_summary(report: dict[str, Any], path: Path | None = None) -> str:
    """The summary table of a report."""
    episodes = report["episodes"]
    rows = [f"envlink chaos run '{report['label']}' (seed {report['seed']}, "
            f"{report['workers']} worker(s)): {episodes['total']} episodes in "
            f"{report['seconds']:.1f} s",
            "  episodes by face/policy/protocol: " + ", ".join(
                f"{k}={v}" for k, v in sorted(episodes.items()) if k != "total"),
            f"  {'fault kind':<20}{'injected':>10}{'armed':>10}"]
    rows += [f"  {kind:<20}{report['faults'][kind]:>10}{report['faults_armed'][kind]:>10}"
             for kind in FAULT_KINDS]
    calls = report["calls"]
    rows.append(f"  calls: {sum(calls.values())} ("
                + ", ".join(f"{k}={v}" for k, v in sorted(calls.items())) + ")")
    rows.append("  errors by type: " + (", ".join(
        f"{k}={v}" for k, v in report["errors_by_type"].items()) or "none"))
    recording = report["recording"]
    rows.append(f"  recordings checked: {recording['phases']} phases, {recording['files']} "
                f"files, {recording['episodes']} episodes, {recording['steps']} steps, "
                f"{recording['unknown_steps']} steps of unknown outcome; "
                f"{recording['broken_lines']} broken lines, {recording['incomplete']} "
                "incomplete episodes")
    rows.append(f"  violations: {report['violations']}   leaks: {report['leaks']}   "
                f"max past deadline: {report['max_seconds_past_deadline'] * 1000:.0f} ms "
                f"(calls past deadline + {TOLERANCE * 1000:.0f} ms only by measured CPU "
                f"starvation: {report['late_excused_by_cpu_starvation']})")
    for what, unit in (("rss_mb", "MB"), ("fds", "fds")):
        trends = report[what] if isinstance(report[what], list) else [report[what]]
        parts = [f"{t['first']:.0f}->{t['median_second_quarter']:.0f}->"
                 f"{t['median_last_quarter']:.0f}" for t in trends if t.get("samples")]
        if parts:
            rows.append(f"  {what} (first -> 2nd-quarter median -> last-quarter median, "
                        f"{unit}): " + "; ".join(parts))
    rows += [f"  VIOLATION {v}" for v in report["violation_samples"][:20]]
    rows += [f"  LEAK {v}" for v in report["leak_samples"][:20]]
    if path is not None:
        rows.append(f"  report: {path}")
    return "\n".join(rows)


@dataclass
class ChaosRun:
    """The outcome of :func:`run_chaos`."""

    config: ChaosConfig
    stats: Stats
    report_path: Path

    @property
    def report(self) -> dict[str, Any]:
        return self.stats.to_dict(self.config)

    @property
    def total_episodes(self) -> int:
        return int(self.report["episodes"]["total"])

    def summary(self) -> str:
        return format_summary(self.report, self.report_path)


# ---------------------------------------------------------------------- helpers


def _client(url: str, policy: str, protocol: str, *, kill: bool = False,
            recorder: RolloutRecorder | None = None) -> GenericEnvClient:
    reconnect = ReconnectPolicy(
        max_attempts=40 if kill else 6, max_elapsed=8.0 if kill else 3.0,
        initial_delay=0.01, max_delay=0.1 if kill else 0.02, stable_after=0.5,
    )
    return GenericEnvClient(
        base_url=url, timeout=Timeout(3.0, connect=2.0, close=2.0), reconnect=reconnect,
        on_session_lost=policy,  # type: ignore[arg-type]
        extensions=protocol == "ext", ping_interval=None, ping_timeout=0.3,
        max_message_size=CLIENT_MAX_MESSAGE, recorder=recorder,
    )


def _run_delays() -> dict[int, int]:
    """Run-queue delay (ns) so far of this thread and of the client loop threads.

    From ``/proc/self/task/TID/schedstat`` (Linux): time a thread was runnable but had
    no CPU. Threads waiting for the GIL or for I/O are not runnable, so a client that
    blocks is never excused by this.
    """
    out: dict[int, int] = {}
    current = threading.current_thread()
    for thread in threading.enumerate():
        tid = thread.native_id
        if tid is None or not (thread is current or thread.name.startswith("envlink-bridge")):
            continue
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as fh:
                out[tid] = int(fh.read().split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return out


def _starved(before: dict[int, int]) -> float:
    after = _run_delays()
    return max((after[t] - before[t] for t in after if t in before), default=0) / 1e9


def _record(call: Call, fn: Callable[[], Any]) -> None:
    delays = _run_delays()
    call.started = time.monotonic()
    try:
        result = fn()
    except Exception as exc:
        call.ended = time.monotonic()
        _record_error(call, exc)
    else:
        call.ended = time.monotonic()
        _record_result(call, result)
    call.starved = _starved(delays)


async def _arecord(call: Call, fn: Callable[[], Awaitable[Any]]) -> None:
    delays = _run_delays()
    call.started = time.monotonic()
    try:
        result = await fn()
    except Exception as exc:
        call.ended = time.monotonic()
        _record_error(call, exc)
    else:
        call.ended = time.monotonic()
        _record_result(call, result)
    call.starved = _starved(delays)


def _record_result(call: Call, result: Any) -> None:
    call.ok = True
    if call.method == "state":
        call.answer = dict(result)
    else:
        call.answer = project({"observation": result.observation, "reward": result.reward,
                               "done": result.done})


def _record_error(call: Call, exc: Exception) -> None:
    call.error = type(exc).__name__
    if isinstance(exc, CallTimeoutError) and getattr(exc, "outcome_unknown", True) is False:
        call.error = "CallTimeoutError(not sent)"
    call.error_module = "envlink" if isinstance(exc, EnvlinkError) else None
    call.message = str(exc)[:300]
    if isinstance(exc, SessionLostError):
        if exc.journal is None:
            call.journal_missing = True
        else:
            call.journal = exc.journal.to_dict()


def _invoke(target: Any, call: Call) -> Any:
    """The API call for ``call`` on a client or a sync facade (returns what it returns)."""
    if call.method == "reset":
        return target.reset(seed=call.seed, max_steps=MAX_STEPS, timeout=call.timeout)
    if call.method == "step":
        return target.step({"move": call.move}, timeout=call.timeout)
    return target.state(timeout=call.timeout)


def _describe(calls: list[Call]) -> str:
    """A compact account of a segment's calls, for a violation report."""
    out = []
    for c in calls:
        what = f"{c.method}" + (f"({c.move})" if c.move else "")
        fault = f" [{c.fault}]" if c.fault else ""
        result = "ok" if c.ok else f"{c.error}"
        out.append(f"#{c.index} {what}{fault} -> {result} {c.elapsed:.2f}s/{c.timeout}s")
    return "; ".join(out)


def _fds() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:  # pragma: no cover - not Linux
        return 0


def _rss_mb() -> float:
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:  # pragma: no cover - not Linux
        import resource
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _stray_threads(before: set[int]) -> list[str]:
    return [f"{t.name}" for t in threading.enumerate()
            if t.ident not in before and t.is_alive()
            and not t.name.startswith(_HARNESS_THREADS)]


# ------------------------------------------------------------------- episodes


@dataclass
class _Segment:
    seed: int
    calls: list[Call] = field(default_factory=list)
    final_state: dict[str, Any] | None = None
    final_journal: dict[str, Any] | None = None


@dataclass
class _Plan:
    """What one in-process episode will do, drawn from its seeded RNG."""

    number: int
    driver: str
    policy: str
    protocol: str
    rng: random.Random
    faults: list[str | None]

    @property
    def base_seed(self) -> int:
        return self.number * 1000


def _plan(config: ChaosConfig, number: int, kinds_cycle: list[str]) -> _Plan:
    rng = random.Random(f"{config.seed}:{number}")
    driver = DRIVERS[number % 3]
    policy = POLICIES[(number // 3) % 3]
    protocol = PROTOCOLS[(number // 9) % 2]
    slots = config.waves if driver == "threads" else config.calls
    # Round-robin over the fault kinds (shuffled per episode) so that every kind gets
    # its share in few episodes; a few calls in each episode stay fault-free.
    kinds = [kinds_cycle[(number * config.faults_per_episode + i) % len(kinds_cycle)]
             for i in range(min(config.faults_per_episode, slots))]
    faults: list[str | None] = [*kinds, *([None] * (slots - len(kinds)))]
    rng.shuffle(faults)
    return _Plan(number, driver, policy, protocol, rng, faults)


def _timeout_for(kind: str | None, rng: random.Random) -> float:
    if kind in ("stall",):
        return 0.3
    if kind == "slow":
        return rng.choice((0.4, 0.6))
    return rng.choice((1.0, 2.0))


class _Runner:
    def __init__(self, config: ChaosConfig, stats: Stats, servers: InProcessServers | None,
                 ledger: Ledger) -> None:
        self.config = config
        self.stats = stats
        self.servers = servers
        self.ledger = ledger
        self.caller = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="chaos-caller")
        self._own_root = config.recordings is None
        self.recordings = (Path(tempfile.mkdtemp(prefix="envlink-chaos-recordings-"))
                           if config.recordings is None else config.recordings)
        self.recorder: RolloutRecorder | None = None
        self._recorded = 0

    def close(self) -> None:
        self.caller.shutdown(wait=True)
        if self.recorder is not None:
            self.recorder.close()
        if self._own_root:
            shutil.rmtree(self.recordings, ignore_errors=True)

    # -------------------------------------------------------------- recording

    def recording(self) -> RolloutRecorder:
        """A recorder of its own for the next episode's client (checked by :meth:`check`)."""
        if self.recorder is not None:  # an episode that was never checked
            self.recorder.close()
        self._recorded += 1
        self.recorder = RolloutRecorder(self.recordings / f"episode-{self._recorded}")
        return self.recorder

    def check_recording(self, segments: list[_Segment], *, sequential: bool,
                        tag: str) -> None:
        """What the episode's recorder wrote, against what its caller got; then removed."""
        recorder, self.recorder = self.recorder, None
        if recorder is None:
            return
        if not recorder.close(timeout=30.0):
            self.stats.violation(f"[{tag}] recording: not flushed within 30 s")
        violations, counts = check_recording(recorder.directory, segments,
                                             sequential=sequential, what=f"[{tag}] recording")
        for text in violations:
            self.stats.violation(text)
        dropped = recorder.stats.get("episodes_dropped", 0)
        if dropped:
            self.stats.violation(f"[{tag}] recording: {dropped} episodes dropped")
        self.stats.recording.update(counts)
        shutil.rmtree(recorder.directory, ignore_errors=True)

    # -------------------------------------------------------------- faults

    def _arm(self, protocol: str, kind: str, rng: random.Random,
             timeout: float) -> Any:
        assert self.servers is not None
        self.stats.armed[kind] += 1
        latency = 0.0
        if kind == "slow":
            latency = rng.choice((0.05, 0.15, timeout + 0.15))
        return self.servers.arm(protocol, kind, latency=latency, variant=rng.randrange(12))

    def _disarm(self, protocol: str, arming: Any) -> None:
        assert self.servers is not None
        if arming is not None and self.servers.disarm(protocol, arming):
            self.stats.faults[arming.kind] += 1

    # -------------------------------------------------------------- checking

    def check(self, segments: list[_Segment], *, policy: str, sequential: bool,
              in_process: bool, tag: str) -> None:
        stats = self.stats
        for seg in segments:
            for call in seg.calls:
                stats.calls[call.method] += 1
                if call.error:
                    stats.errors[call.error] += 1
                stats.late_max = max(stats.late_max, call.elapsed - call.timeout)
                if call.elapsed > call.timeout + TOLERANCE and not call.late_by(TOLERANCE):
                    stats.late_excused += 1
            servers = self.ledger.segments(seg.seed) if in_process else None
            for v in check_segment(seg.seed, seg.calls, servers, final_state=seg.final_state,
                                   final_journal=seg.final_journal, policy=policy,
                                   sequential=sequential, tolerance=TOLERANCE):
                stats.violation(f"[{tag}] {v} | calls: {_describe(seg.calls)}")
        self.ledger.forget(seg.seed for seg in segments)
        self.check_recording(segments, sequential=sequential, tag=tag)

    def after_episode(self, threads_before: set[int], tag: str) -> None:
        for name in _stray_threads(threads_before):
            self.stats.leaks.append(f"{tag}: thread {name!r} still running after close()")
        self.stats.rss_mb.append(round(_rss_mb(), 2))
        self.stats.fds.append(_fds())

    # -------------------------------------------------------------- sequential

    async def sequential_episode(self, plan: _Plan) -> list[_Segment]:
        """One client (async, or its sync facade called from a caller thread)."""
        assert self.servers is not None
        url = self.servers.url(plan.protocol)
        client = _client(url, plan.policy, plan.protocol, recorder=self.recording())
        facade: SyncEnvClient[Any, Any, Any] | None = None
        loop = asyncio.get_running_loop()
        if plan.driver == "sync":
            facade = client.sync()

        async def run(call: Call) -> None:
            if facade is None:
                await _arecord(call, lambda: _invoke(client, call))
            else:
                await loop.run_in_executor(
                    self.caller, _record, call, lambda: _invoke(facade, call))

        segments: list[_Segment] = []
        index = 0
        rng = plan.rng

        async def begin(number: int, carried: Any = None) -> _Segment | None:
            # ``carried``: a refused-upgrade or capacity fault whose call ended the
            # episode before reconnecting (policy raise): it meets the new reset instead.
            nonlocal index
            for attempt in range(4):
                seg = _Segment(plan.base_seed + number * 10 + attempt)
                segments.append(seg)
                arming, carried = carried, None
                if arming is None and attempt == 0 and number == 0 and rng.random() < 0.08:
                    self.stats.armed["capacity"] += 1
                    arming = self.servers.arm_capacity_only(plan.protocol)  # type: ignore[union-attr]
                call = Call(index, "reset", seg.seed, None, 2.0, 0, 0,
                            fault=arming.kind if arming else None)
                index += 1
                await run(call)
                self._disarm(plan.protocol, arming)
                seg.calls.append(call)
                if call.ok:
                    return seg
            return None

        number = 0
        seg = await begin(number)
        for kind in plan.faults:
            if seg is None:
                break
            method = "state" if rng.random() < 0.12 else "step"
            timeout = _timeout_for(kind, rng)
            call = Call(index, method, seg.seed, (1 << index) if method == "step" else None,
                        timeout, 0, 0, fault=kind)
            index += 1
            arming = self._arm(plan.protocol, kind, rng, timeout) if kind else None
            await run(call)
            lost = call.error in ("SessionLostError", "ReplayDivergedError", "SessionGoneError")
            carried = None
            if lost and arming is not None and arming.kind in ("refused_upgrade", "capacity") \
                    and plan.policy == "raise":
                carried = self.servers.carry(plan.protocol, arming)
            else:
                self._disarm(plan.protocol, arming)
            seg.calls.append(call)
            if lost:
                number += 1
                seg = await begin(number, carried)
        if seg is not None:
            call = Call(index, "state", seg.seed, None, 5.0, 0, 0)
            await run(call)
            seg.calls.append(call)
            if call.ok:
                seg.final_state = call.answer
                seg.final_journal = client.journal.to_dict()
        if facade is not None:
            await loop.run_in_executor(self.caller, facade.close)
        else:
            await client.close()
        self.servers.release_stalled(plan.protocol)
        return segments

    # -------------------------------------------------------------- threads

    def threads_episode(self, plan: _Plan) -> list[_Segment]:
        """One sync facade shared by 8 caller threads, in waves of concurrent calls."""
        assert self.servers is not None
        client = _client(self.servers.url(plan.protocol), plan.policy, plan.protocol,
                         recorder=self.recording())
        facade = client.sync()
        seg = _Segment(plan.base_seed)
        rng = plan.rng
        reset = Call(0, "reset", seg.seed, None, 2.0, 0, 0)
        _record(reset, lambda: _invoke(facade, reset))
        seg.calls.append(reset)
        waves: list[list[Call]] = []
        for w, kind in enumerate(plan.faults):
            timeout = _timeout_for(kind, rng) + (0.5 if kind not in ("stall", "slow") else 0.0)
            wave = []
            for t in range(THREADS):
                index = 1 + w * THREADS + t
                method = "state" if rng.random() < 0.12 else "step"
                wave.append(Call(index, method, seg.seed,
                                 (1 << index) if method == "step" else None, timeout, 0, 0,
                                 fault=kind))
            waves.append(wave)
        barrier = threading.Barrier(THREADS + 1)
        failures: list[BaseException] = []

        def worker(t: int) -> None:
            try:
                for wave in waves:
                    barrier.wait(60)
                    call = wave[t]
                    _record(call, lambda c=call: _invoke(facade, c))
                    barrier.wait(60)
            except BaseException as exc:  # a broken barrier: reported below
                failures.append(exc)

        workers = [threading.Thread(target=worker, args=(t,), name=f"chaos-worker-{t}")
                   for t in range(THREADS)]
        for thread in workers:
            thread.start()
        try:
            if reset.ok:
                for w, kind in enumerate(plan.faults):
                    arming = (self._arm(plan.protocol, kind, rng, waves[w][0].timeout)
                              if kind else None)
                    barrier.wait(60)
                    barrier.wait(60)
                    self._disarm(plan.protocol, arming)
            else:
                barrier.abort()
        finally:
            for thread in workers:
                thread.join(60)
        if reset.ok:
            if failures:
                self.stats.violation(f"threads episode {plan.number}: {failures[0]!r}")
            for wave in waves:
                seg.calls.extend(wave)
            final = Call(10_000, "state", seg.seed, None, 5.0, 0, 0)
            _record(final, lambda: _invoke(facade, final))
            seg.calls.append(final)
            if final.ok:
                seg.final_state = final.answer
                seg.final_journal = client.journal.to_dict()
        facade.close()
        self.servers.release_stalled(plan.protocol)
        return [seg]

    # -------------------------------------------------------------- kill -9

    def kill_episode(self, number: int, server: ServeProcess, kind: str, policy: str,
                     driver: str) -> list[_Segment]:
        """An episode on an ``envlink serve`` process that is killed with SIGKILL."""
        protocol = "ext" if kind == "kill9_store" or number % 2 else "plain"
        rng = random.Random(f"{self.config.seed}:kill:{number}")
        client = _client(server.url, policy, protocol, kill=True, recorder=self.recording())
        target: Any = client.sync() if driver == "sync" else None
        loop = asyncio.new_event_loop() if target is None else None

        def do(call: Call) -> None:
            if loop is not None:
                async def coro() -> None:
                    await _arecord(call, lambda: _invoke(client, call))
                loop.run_until_complete(coro())
            else:
                _record(call, lambda: _invoke(target, call))

        segments: list[_Segment] = []
        index = 0
        seg: _Segment | None = None

        def begin() -> None:
            nonlocal index, seg
            seg = _Segment(10_000_000 + number * 1000 + len(segments))
            segments.append(seg)
            call = Call(index, "reset", seg.seed, None, 8.0, 0, 0)
            index += 1
            do(call)
            seg.calls.append(call)
            if not call.ok:
                seg = None

        begin()
        kills = [True] * self.config.kills_per_episode + [False] * 3
        rng.shuffle(kills)
        for kill in kills:
            if seg is None:
                begin()
                if seg is None:
                    break
            call = Call(index, "step", seg.seed, 1 << index, 8.0, 0, 0,
                        fault=kind if kill else None)
            index += 1
            inflight = kill and rng.random() < 0.6
            restarts = server.restarts
            if kill:
                self.stats.armed[kind] += 1
                if inflight:
                    server.kill_on_next("request.step")
                else:
                    server.kill_now()
                    self.stats.faults[kind] += 1
            do(call)
            if inflight and server.disarm():
                self.stats.faults[kind] += 1
                server.wait_restarted(restarts + 1)
            seg.calls.append(call)
            if call.error in ("SessionLostError", "ReplayDivergedError", "SessionGoneError"):
                seg = None
        if seg is not None:
            final = Call(index, "state", seg.seed, None, 8.0, 0, 0)
            do(final)
            seg.calls.append(final)
            if final.ok:
                seg.final_state = final.answer
                seg.final_journal = client.journal.to_dict()
        if loop is not None:
            async def close() -> None:
                # Called inside a coroutine: with no loop running, close() would block.
                await client.close()
            loop.run_until_complete(close())
            pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
            if pending:
                self.stats.leaks.append(f"kill episode {number}: {len(pending)} tasks left")
            loop.close()
        else:
            target.close()
        return segments


# ------------------------------------------------------------------------ load


def load_async(servers: InProcessServers, ledger: Ledger, *, calls: int, policy: str,
               protocol: str, seed: int, stats: Stats) -> list[_Segment]:
    """``calls`` concurrent steps on one async client, with faults armed as they run.

    A helper thread waits (on the server's own request counter) for the step requests
    to reach fixed milestones and arms a fault at each: with the extensions a drop after
    apply, an error frame, a corrupt frame and slow answers; on the plain protocol,
    where a drop under a step in flight ends the episode by design, an error frame,
    slow answers and an oversize frame (replayed from).
    """
    runner = _Runner(ChaosConfig(seed=seed), stats, servers, ledger)
    client = _client(servers.url(protocol), policy, protocol, recorder=runner.recording())
    seg = _Segment(seed)
    if protocol == "ext":
        kinds = ["drop_after_apply", "error", "corrupt", "slow"]
    else:
        # The replay after the corrupt frame resends every step so far (and counts as
        # step requests): it comes last, so that no other milestone lands in it.
        kinds = ["error", "slow", "oversize"]
    milestones = [((i + 1) * calls // (len(kinds) + 1), kind) for i, kind in enumerate(kinds)]
    rng = random.Random(seed)
    done = threading.Event()

    def inject(base: int) -> None:
        for count, kind in milestones:
            if not servers.wait_requests(protocol, base + count, done):
                return
            stats.armed[kind] += 1
            arming = servers.arm(protocol, kind, latency=0.02, variant=rng.randrange(12))
            # Slow answers for 50 requests; a one-shot fault fires within them.
            servers.wait_requests(protocol, base + count + 50, done)
            runner._disarm(protocol, arming)

    async def main() -> None:
        reset = Call(0, "reset", seed, None, 5.0, 0, 0)
        await _arecord(reset, lambda: _invoke(client, reset))
        seg.calls.append(reset)
        base = servers.call(protocol, lambda s: s.counter("request.step"))
        batch = [Call(i, "step", seed, 1 << i, 60.0, 0, 0) for i in range(1, calls + 1)]
        injector = asyncio.get_running_loop().run_in_executor(runner.caller, inject, base)
        try:
            await asyncio.gather(*(_arecord(c, lambda c=c: _invoke(client, c)) for c in batch))
        finally:
            done.set()
        await injector
        servers.call(protocol, lambda s: s.faults.clear())
        seg.calls.extend(batch)
        final = Call(calls + 1, "state", seed, None, 10.0, 0, 0)
        await _arecord(final, lambda: _invoke(client, final))
        seg.calls.append(final)
        if final.ok:
            seg.final_state = final.answer
            seg.final_journal = client.journal.to_dict()
        await client.close()
        current = asyncio.current_task()
        pending = [t for t in asyncio.all_tasks() if t is not current and not t.done()]
        if pending:
            stats.leaks.append(f"load: {len(pending)} asyncio tasks left after close()")

    try:
        asyncio.run(main())
        runner.check([seg], policy=policy, sequential=False, in_process=True,
                     tag=f"load async {calls} calls {policy}/{protocol}")
    finally:
        runner.close()
    return [seg]


def load_threads(servers: InProcessServers, ledger: Ledger, *, waves: int, policy: str,
                 protocol: str, seed: int, stats: Stats) -> list[_Segment]:
    """8 caller threads sharing one sync facade for ``waves`` waves, faults in half."""
    config = ChaosConfig(seed=seed, calls=waves * 4)
    runner = _Runner(config, stats, servers, ledger)
    rng = random.Random(seed)
    # On the plain protocol a step whose outcome cannot be known (connection lost or
    # deadline expired with it in flight) ends the episode by design: keep to faults
    # that leave it running.
    kinds = list(IN_PROCESS_KINDS) if protocol == "ext" else ["error", "corrupt", "oversize"]
    faults: list[str | None] = [kinds[i // 2 % len(kinds)] if i % 2 else None
                                for i in range(waves)]
    plan = _Plan(seed, "threads", policy, protocol, rng, faults)
    try:
        segments = runner.threads_episode(plan)
        runner.check(segments, policy=policy, sequential=False, in_process=True,
                     tag=f"load {THREADS} threads {policy}/{protocol}")
    finally:
        runner.close()
    return segments


# ------------------------------------------------------------------------ run


def _kinds_cycle(seed: int) -> list[str]:
    kinds = list(IN_PROCESS_KINDS)
    random.Random(seed).shuffle(kinds)
    return kinds


def run_chaos(config: ChaosConfig) -> ChaosRun:
    """Run the configured episodes; every invariant is checked as they go."""
    stats = Stats()
    started = time.monotonic()
    ledger = Ledger()
    # The process-wide default bridge that sync clients share: started before the
    # baseline, so that its thread and fds, if a facade elsewhere keeps it running,
    # are not leaks (its thread ends when the last facade on it closes).
    envlink.default_bridge().call(asyncio.sleep, 0, timeout=10)
    # The process's one rollout writer thread (it lives as long as the process), too.
    with tempfile.TemporaryDirectory() as scratch:
        RolloutRecorder(scratch).flush()
    gc.collect()
    threads_before = {t.ident for t in threading.enumerate() if t.ident is not None}
    fds_before = _fds()
    cycle = _kinds_cycle(config.seed)
    with InProcessServers(ledger) as servers:
        runner = _Runner(config, stats, servers, ledger)
        try:
            _in_process_stream(config, runner, stats, cycle)
            _kill_stream(config, runner, stats)
        finally:
            runner.close()
    gc.collect()
    _final_leaks(stats, threads_before, fds_before)
    _memory_trend(stats)
    stats.seconds = time.monotonic() - started
    path = config.report or Path(tempfile.gettempdir()) / "envlink-chaos" / (
        f"chaos-{config.label}-seed{config.seed}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(stats.to_dict(config), indent=2) + "\n")
    return ChaosRun(config, stats, path)


def _numbers(config: ChaosConfig, minimum: int, short: Callable[[], bool]) -> Any:
    """Episode numbers of this shard: its share of ``minimum``, more while ``short()``.

    Episodes are dealt to shards by a seeded draw per episode number, not by the number
    modulo the shard count, which would give a shard only one face (the face is the
    number modulo 3).
    """
    index, count = config.shard
    done = 0
    number = -1
    while done < config.max_episodes and (done < _share(minimum, config.shard) or short()):
        number += 1
        if count > 1 and random.Random(f"{config.seed}:shard:{number}").randrange(count) != index:
            continue
        yield number
        done += 1


def _share(total: int, shard: tuple[int, int]) -> int:
    index, count = shard
    return total // count + (1 if index < total % count else 0)


def _target(config: ChaosConfig, stats: Stats, kinds: tuple[str, ...]) -> Callable[[], bool]:
    need = _share(config.fault_target, config.shard) if config.fault_target else 0
    return lambda: any(stats.faults[k] < need for k in kinds)


def _in_process_stream(config: ChaosConfig, runner: _Runner, stats: Stats,
                       cycle: list[str]) -> None:
    if "inprocess" not in config.streams:
        return
    short = _target(config, stats, IN_PROCESS_KINDS)
    for number in _numbers(config, config.episodes, short):
        plan = _plan(config, number, cycle)
        stats.episodes[f"driver:{plan.driver}"] += 1
        stats.episodes[f"policy:{plan.policy}"] += 1
        stats.episodes[f"protocol:{plan.protocol}"] += 1
        before = {t.ident for t in threading.enumerate() if t.ident is not None}
        if plan.driver == "threads":
            segments = runner.threads_episode(plan)
        else:
            segments = _run_async_episode(runner, plan, stats)
        runner.check(segments, policy=plan.policy, sequential=plan.driver != "threads",
                     in_process=True, tag=f"seed {config.seed} episode {plan.number} "
                     f"{plan.driver}/{plan.policy}/{plan.protocol}")
        runner.after_episode(before, f"episode {plan.number} ({plan.driver})")
        if number % 20 == 19:
            gc.collect()


def _run_async_episode(runner: _Runner, plan: _Plan, stats: Stats) -> list[_Segment]:
    async def main() -> list[_Segment]:
        segments = await runner.sequential_episode(plan)
        current = asyncio.current_task()
        pending = [t for t in asyncio.all_tasks() if t is not current and not t.done()]
        if pending:
            stats.leaks.append(f"episode {plan.number}: {len(pending)} asyncio tasks left "
                               f"after close(): {[t.get_coro() for t in pending][:3]}")
        return segments

    return asyncio.run(main())


def _kill_stream(config: ChaosConfig, runner: _Runner, stats: Stats) -> None:
    if "kill" not in config.streams:
        return
    short = _target(config, stats, ("kill9", "kill9_store"))
    store = tempfile.mkdtemp(prefix="envlink-chaos-store-")
    servers = {
        "kill9": ServeProcess(store=None, extensions=True),
        "kill9_store": ServeProcess(store=store, extensions=True),
    }
    plain = ServeProcess(store=None, extensions=False)
    try:
        for server in (*servers.values(), plain):
            server.start()
        for number in _numbers(config, config.kill_episodes, short):
            kind = ("kill9", "kill9_store")[number % 2]
            policy = POLICIES[(number // 2) % 3]
            driver = ("async", "sync")[(number // 6) % 2]
            server = servers[kind]
            if kind == "kill9" and number % 4 == 0:
                server = plain  # kill -9 under the plain protocol too
            protocol = "plain" if server is plain else "ext"
            stats.episodes[f"driver:{driver}"] += 1
            stats.episodes[f"policy:{policy}"] += 1
            stats.episodes[f"protocol:{protocol}"] += 1
            before = {t.ident for t in threading.enumerate() if t.ident is not None}
            segments = runner.kill_episode(number, server, kind, policy, driver)
            runner.check(segments, policy=policy, sequential=True, in_process=False,
                         tag=f"seed {config.seed} kill episode {number} {driver}/{policy}/"
                         f"{protocol}/{kind}")
            runner.after_episode(before, f"kill episode {number}")
    finally:
        for server in (*servers.values(), plain):
            server.stop()
        shutil.rmtree(store, ignore_errors=True)


def _final_leaks(stats: Stats, threads_before: set[int], fds_before: int) -> None:
    deadline = time.monotonic() + 5.0
    while True:
        stray = [t.name for t in threading.enumerate()
                 if t.ident not in threads_before and t.is_alive()]
        fds = _fds()
        if (not stray and fds <= fds_before) or time.monotonic() > deadline:
            break
        # Closed threads and sockets are reaped by the runtime; give it a moment.
        with contextlib.suppress(Exception):
            for t in threading.enumerate():
                if t.ident not in threads_before and t.is_alive():
                    t.join(0.1)
        gc.collect()
    for name in stray:
        stats.leaks.append(f"end of run: thread {name!r} still running")
    if fds > fds_before:
        stats.leaks.append(f"end of run: {fds - fds_before} file descriptors more than at "
                           f"the start ({fds_before} -> {fds})")


def _memory_trend(stats: Stats) -> None:
    samples = stats.rss_mb
    if len(samples) < 12:
        return
    quarter = len(samples) // 4
    early = statistics.median(samples[quarter:2 * quarter])  # after warm-up
    late = statistics.median(samples[-quarter:])
    allowed = max(24.0, early * 0.15)
    if late - early > allowed:
        stats.leaks.append(f"memory grows across episodes: median RSS {early:.1f} MB -> "
                           f"{late:.1f} MB (allowed +{allowed:.1f} MB)")
    fds = stats.fds
    early_fds = statistics.median(fds[quarter:2 * quarter])
    late_fds = statistics.median(fds[-quarter:])
    if late_fds - early_fds > 16:
        stats.leaks.append(f"file descriptors grow across episodes: {early_fds} -> {late_fds}")
