"""Finished episodes become lines on disk, on one background thread per process.

A client's tape hands a finished :class:`Episode` (small tuples, the frames as they
were on the wire) to :meth:`Sink.submit`, which only appends it to the process's
queue and wakes the writer: the client never waits for the disk, never serialises
anything. The writer thread cuts the payloads out of the frames, applies the
recorder's redaction, serialises each episode as one line and writes whole lines
with one ``write`` each, to a file of its own process (``pid`` and a random part in
its name), rotated by size. An episode is on disk well within a second of its end.

Memory is bounded per recorder: past ``max_buffered_steps`` steps waiting for the
writer, a finished episode is dropped whole, counted and logged; never waited for.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import os
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic_core import from_json, to_json

from envlink._recording.rollouts import SCHEMA, split_answer
from envlink._version import __version__

__all__ = [
    "ATTR_RECORDING_RESULT",
    "METRIC_RECORDING_EPISODES",
    "METRIC_RECORDING_STEPS",
    "Episode",
    "Sink",
    "Step",
]

#: Episodes recorded (``written``) or ``dropped``, by ``envlink.recording.result``.
METRIC_RECORDING_EPISODES = "envlink.recording.episodes"
#: Steps of those episodes, by the same attribute.
METRIC_RECORDING_STEPS = "envlink.recording.steps"
#: ``written`` or ``dropped``.
ATTR_RECORDING_RESULT = "envlink.recording.result"

_log = logging.getLogger("envlink.recording")
#: Seconds the writer lets episodes gather once woken.
_GATHER = 0.05

#: One step as a tape keeps it: whether the first two are frames (request and answer,
#: as on the wire) or payload texts, the action, the answer, its start
#: (``perf_counter``), latency (s), retries, recovery mechanism (or ``None``), and
#: ``(trace_id, span_id)`` (or ``None``).
Step = tuple[bool, Any, Any, float, float, int, "str | None", "tuple[int, int] | None"]


class Episode:
    """One episode as a tape assembles it on the client's thread (nothing serialised)."""

    __slots__ = ("end", "episode_id", "outcome", "reset_answer", "reset_frames",
                 "reset_kwargs", "server", "session_id", "start_perf", "start_wall",
                 "steps", "truncated", "unknown")

    def __init__(self, server: str, session_id: str | None, episode_id: str | None,
                 reset_kwargs: str, reset_answer: Any, reset_frames: bool) -> None:
        self.server = server
        self.session_id = session_id
        self.episode_id = episode_id
        self.reset_kwargs = reset_kwargs
        self.reset_answer = reset_answer
        self.reset_frames = reset_frames
        self.steps: list[Step] = []
        #: Steps sent whose outcome the client never learned: (action text, after step).
        self.unknown: list[tuple[str, int]] = []
        self.start_wall = time.time()
        self.start_perf = time.perf_counter()
        self.end = 0.0
        self.outcome = ""
        self.truncated = False


def _data(text: Any) -> Any:
    """The ``data`` of a frame's JSON text."""
    return from_json(text)["data"]


def episode_record(ep: Episode, redact: Callable[[Any], Any] | None) -> dict[str, Any]:
    """The JSON object of one episode (on the writer thread)."""
    def clean(value: Any) -> Any:
        return value if redact is None else redact(value)

    base_wall, base_perf = ep.start_wall, ep.start_perf
    reset_data = _data(ep.reset_answer) if ep.reset_frames else from_json(ep.reset_answer)
    reset = split_answer(reset_data)
    reset["observation"] = clean(reset["observation"])
    steps = []
    total = 0.0
    for index, (frames, action, answer, start, latency, retries, recovered,
                trace) in enumerate(ep.steps):
        if frames:
            action_data, answer_data = _data(action), _data(answer)
        else:
            action_data, answer_data = from_json(action), from_json(answer)
        step = split_answer(answer_data)
        reward = step["reward"]
        if isinstance(reward, (int, float)) and not isinstance(reward, bool):
            total += reward
        step["observation"] = clean(step["observation"])
        record: dict[str, Any] = {"index": index, "action": clean(action_data), **step,
                                  "start": base_wall + (start - base_perf),
                                  "latency": latency, "retries": retries,
                                  "recovered": recovered is not None}
        if recovered is not None:
            record["recovery"] = recovered
        if trace is not None:
            record["trace_id"] = f"{trace[0]:032x}"
            record["span_id"] = f"{trace[1]:016x}"
        steps.append(record)
    out: dict[str, Any] = {
        "schema": SCHEMA,
        "episode_id": ep.episode_id,
        "server": ep.server,
        "session_id": ep.session_id,
        "reset": {"kwargs": from_json(ep.reset_kwargs), **reset},
        "steps": steps,
        "unknown_steps": [{"action": clean(from_json(action)), "after": after}
                          for action, after in ep.unknown],
        "outcome": ep.outcome,
        "return": total,
        "start": base_wall,
        "end": ep.end,
        "truncated": ep.truncated,
        "envlink": __version__,
        "pid": os.getpid(),
    }
    if redact is not None:  # what replay compares is not what the server answered
        out["redacted"] = True
    return out


class _Counters:
    """The OpenTelemetry counters, made on first use (the global meter provider)."""

    def __init__(self) -> None:
        self._made: tuple[Any, Any] | None = None

    def add(self, result: str, episodes: int, steps: int) -> None:
        try:
            if self._made is None:
                from opentelemetry import metrics

                meter = metrics.get_meter("envlink", __version__)
                self._made = (
                    meter.create_counter(METRIC_RECORDING_EPISODES, unit="{episode}",
                                         description="episodes recorded or dropped"),
                    meter.create_counter(METRIC_RECORDING_STEPS, unit="{step}",
                                         description="steps of episodes recorded or dropped"))
            attributes = {ATTR_RECORDING_RESULT: result}
            self._made[0].add(episodes, attributes)
            self._made[1].add(steps, attributes)
        except Exception:  # telemetry never reaches the caller
            pass


_COUNTERS = _Counters()


class Sink:
    """One recorder's files in this process, and its share of the writer's queue.

    Args:
        directory: where the files go (made if missing).
        prefix: the files' name prefix.
        max_file_bytes: a file is closed and another begun past this size.
        max_buffered_steps: steps waiting for the writer past which a finished
            episode is dropped whole.
        redact: applied to actions and observations on the writer thread.
    """

    def __init__(self, directory: Path, prefix: str, max_file_bytes: int,
                 max_buffered_steps: int, redact: Callable[[Any], Any] | None) -> None:
        self.directory = directory
        self.prefix = prefix
        self.max_file_bytes = max_file_bytes
        self.max_buffered_steps = max_buffered_steps
        self.redact = redact
        self.pid = os.getpid()
        self.tag = secrets.token_hex(4)
        self.index = itertools.count(1)
        self.fd: int | None = None
        self.size = 0
        self.buffered = 0
        self.closed = False
        #: episodes and steps written and dropped (read by ``RolloutRecorder.stats``).
        self.counts = {"episodes_written": 0, "steps_written": 0,
                       "episodes_dropped": 0, "steps_dropped": 0}
        self._last_warning = 0.0
        self.files: list[Path] = []

    # ------------------------------------------------------------ client side

    def submit(self, ep: Episode) -> None:
        """Queue a finished episode for the writer, or drop it (never waits)."""
        writer = _process_writer()
        steps = len(ep.steps)
        with writer.cond:
            if self.closed or ep.truncated or self.buffered + steps > self.max_buffered_steps:
                dropped = True
            else:
                dropped = False
                self.buffered += steps
                writer.queue.append((self, ep))
                writer.submitted += 1
                if writer.idle:  # else the writer takes it with what it is gathering
                    writer.idle = False
                    writer.cond.notify()
        if dropped:
            self.dropped(steps, "the recorder is closed" if self.closed else
                         "the episode exceeded max_episode_steps" if ep.truncated else
                         "more steps are waiting for the disk than max_buffered_steps")

    def dropped(self, steps: int, why: str) -> None:
        """Count an episode dropped (and warn, at most every 10 s per recorder)."""
        counts = self.counts
        counts["episodes_dropped"] += 1
        counts["steps_dropped"] += steps
        _COUNTERS.add("dropped", 1, steps)
        now = time.monotonic()
        if now - self._last_warning >= 10.0 or self._last_warning == 0.0:
            self._last_warning = now
            _log.warning("envlink rollout recorder dropped an episode (%s); %d dropped "
                         "so far in %s", why, counts["episodes_dropped"], self.directory)

    def flush(self, timeout: float | None) -> bool:
        """Wait until every episode queued so far is written (``False``: timed out)."""
        writer = _process_writer()
        with writer.cond:
            target = writer.submitted
            return writer.cond.wait_for(lambda: writer.done >= target, timeout)

    def close(self, timeout: float | None) -> bool:
        """Flush, then close the file; later episodes are dropped (counted)."""
        flushed = self.flush(timeout)
        writer = _process_writer()
        with writer.cond:
            self.closed = True
            fd, self.fd = self.fd, None
        if fd is not None:
            os.close(fd)
        return flushed

    # ------------------------------------------------------------ writer side

    def write(self, lines: list[bytes]) -> None:
        """Write whole lines to this process's current file: as many whole lines as
        fit in it with one ``write`` (a kill mid-write leaves one partial last line)."""
        if self.pid != os.getpid():  # a forked child: files of its own
            self.pid, self.fd, self.size = os.getpid(), None, 0
            self.tag = secrets.token_hex(4)
        chunk: list[bytes] = []
        size = 0
        for line in lines:
            if self.fd is None or (self.size + size and
                                   self.size + size + len(line) > self.max_file_bytes):
                self._write_all(b"".join(chunk))
                chunk, size = [], 0
                self._next_file()
            chunk.append(line)
            size += len(line)
        self._write_all(b"".join(chunk))

    def _write_all(self, data: bytes) -> None:
        if not data:
            return
        assert self.fd is not None
        view = memoryview(data)
        while view:
            written = os.write(self.fd, view)
            view = view[written:]
        self.size += len(data)

    def _next_file(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        self.directory.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        path = self.directory / (f"{self.prefix}-{stamp}-{self.pid}-{self.tag}-"
                                 f"{next(self.index):04d}.jsonl")
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.size = 0
        self.files.append(path)


class _Writer:
    """The process's writer thread and its queue."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.cond = threading.Condition()
        self.queue: deque[tuple[Sink, Episode]] = deque()
        self.submitted = 0
        self.done = 0
        #: Whether the thread waits for work (a submit then wakes it).
        self.idle = False
        self.thread = threading.Thread(target=self._run, name="envlink-rollout-writer",
                                       daemon=True)
        self.thread.start()

    def _run(self) -> None:
        cond, queue = self.cond, self.queue
        while True:
            with cond:
                while not queue:
                    self.idle = True
                    cond.wait()
                self.idle = False
            # Let the episodes ending meanwhile join this batch: one wake-up and one
            # write per file for many episodes, each still on disk well within 1 s.
            time.sleep(_GATHER)
            with cond:
                batch = list(queue)
                queue.clear()
            self._write(batch)
            with cond:
                self.done += len(batch)
                cond.notify_all()

    def _write(self, batch: list[tuple[Sink, Episode]]) -> None:
        by_sink: dict[Sink, list[tuple[Episode, bytes]]] = {}
        for sink, ep in batch:
            try:
                line = to_json(episode_record(ep, sink.redact),
                               inf_nan_mode="constants") + b"\n"
            except Exception as exc:  # a redaction or an answer that cannot be written
                with self.cond:
                    sink.buffered -= len(ep.steps)
                sink.dropped(len(ep.steps), f"it could not be serialised: {exc!r}")
                continue
            by_sink.setdefault(sink, []).append((ep, line))
        for sink, items in by_sink.items():
            steps = sum(len(ep.steps) for ep, _ in items)
            try:
                if sink.closed:
                    raise OSError("the recorder is closed")
                sink.write([line for _, line in items])
            except OSError as exc:
                with self.cond:
                    sink.buffered -= steps
                for ep, _ in items:
                    sink.dropped(len(ep.steps), f"it could not be written: {exc}")
                continue
            with self.cond:
                sink.buffered -= steps
            counts = sink.counts
            counts["episodes_written"] += len(items)
            counts["steps_written"] += steps
            _COUNTERS.add("written", len(items), steps)


_WRITER: _Writer | None = None
_WRITER_LOCK = threading.Lock()


def _process_writer() -> _Writer:
    """This process's writer (a forked child starts its own)."""
    global _WRITER
    writer = _WRITER
    if writer is not None and writer.pid == os.getpid():
        return writer
    with _WRITER_LOCK:
        if _WRITER is None or _WRITER.pid != os.getpid():
            _WRITER = _Writer()
        return _WRITER


def _flush_at_exit() -> None:
    writer = _WRITER
    if writer is None or writer.pid != os.getpid():
        return
    with writer.cond:
        target = writer.submitted
        writer.cond.wait_for(lambda: writer.done >= target, 5.0)


atexit.register(_flush_at_exit)
