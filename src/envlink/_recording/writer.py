"""Finished episodes become lines on disk, on one background thread per process.

A client's tape hands a finished :class:`Episode` (small tuples, the frames as they
were on the wire) to :meth:`Sink.submit`, which only appends it to the process's
queue and wakes the writer: the client never waits for the disk, never serialises
anything. The writer thread cuts the payloads out of the frames, applies the
recorder's redaction, serialises each episode as one line and writes whole lines
with one ``write`` each, to a file of its own process (``pid`` and a random part in
its name), rotated by size. An episode is on disk well within a second of its end.

Memory is bounded per recorder, in bytes: an open episode reserves the size of its
frames in blocks that double as it grows, and keeps it until the writer has written it; past
``max_buffered_bytes`` (or ``max_buffered_steps`` steps waiting for the writer) an
episode is dropped whole, counted and logged; never waited for.

The writer cannot die: whatever goes wrong with one episode or one write is caught,
counted as dropped and logged, and a thread that ended all the same is started
again by the next submit. A write that stopped short (``ENOSPC``, a file size limit)
leaves a partial line, counted as dropped; the next line begins on a line of its own.

Process edges: a forked child starts with a recorder state of its own (writer,
counts, files; the parent's pending episodes are the parent's to write). At exit,
episodes still open are written as ``close`` and the rest flushed: from ``atexit``
and from ``multiprocessing``'s finalizers, which run before a child's ``os._exit``.
At ``SIGTERM`` (how a ``with multiprocessing.Pool()`` block ends its workers), the same,
for a bounded time, from a handler installed where SIGTERM's disposition is the default
(:func:`arm_sigterm`); the process then still ends by SIGTERM.
"""

from __future__ import annotations

import _thread
import atexit
import contextlib
import errno
import itertools
import logging
import os
import secrets
import signal
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic_core import from_json, to_json

from envlink._recording.rollouts import SCHEMA
from envlink._version import __version__

__all__ = [
    "ATTR_RECORDING_RESULT",
    "METRIC_RECORDING_EPISODES",
    "METRIC_RECORDING_STEPS",
    "Episode",
    "Sink",
    "Step",
    "arm_sigterm",
]

#: Episodes recorded (``written``) or ``dropped``, by ``envlink.recording.result``.
METRIC_RECORDING_EPISODES = "envlink.recording.episodes"
#: Steps of those episodes, by the same attribute.
METRIC_RECORDING_STEPS = "envlink.recording.steps"
#: ``written`` or ``dropped``.
ATTR_RECORDING_RESULT = "envlink.recording.result"

_log = logging.getLogger("envlink.recording")
#: Seconds the writer lets episodes gather once woken (unless a flush is waited for).
_GATHER = 0.05
#: Seconds the exit hook waits for the writer.
_EXIT_WAIT = 5.0
#: Seconds a SIGTERM waits for the writer before the process ends.
_SIGTERM_WAIT = 2.0

#: One step as a tape keeps it: whether the first two are frames (request and answer,
#: as on the wire) or payload texts, the action, the answer, its start
#: (``perf_counter``), latency (s), retries, recovery mechanism (or ``None``), and
#: ``(trace_id, span_id)`` (or ``None``).
Step = tuple[bool, Any, Any, float, float, int, "str | None", "tuple[int, int] | None"]


class Chain:
    """What the parts of one episode share: its return so far (summed by the writer,
    part after part) and whether a part was dropped (the later ones are then too)."""

    __slots__ = ("broken", "total")

    def __init__(self) -> None:
        self.total = 0.0
        self.broken = False


class Episode:
    """One episode, or one part of a long one, as a tape assembles it on the client's
    thread (nothing serialised).

    ``reset`` is ``(frames, request, answer)``: the reset's request and answer frames
    as on the wire (``frames`` true) or its kwargs and answer as payload texts; ``None``
    in parts after the first.
    """

    __slots__ = ("chain", "end", "episode_id", "first_index", "generation", "outcome", "part",
                 "reserved", "reset", "server", "session_id", "settled", "size",
                 "start_perf", "start_wall", "steps", "unknown")

    def __init__(self, server: str, session_id: str | None, episode_id: str | None,
                 reset: tuple[bool, Any, Any] | None) -> None:
        self.server = server
        self.session_id = session_id
        self.episode_id = episode_id
        self.reset = reset
        self.steps: list[Step] = []
        #: Steps sent whose outcome the client never learned: (action text, after step).
        self.unknown: list[tuple[str, int]] = []
        self.start_wall = time.time()
        self.start_perf = time.perf_counter()
        self.end = 0.0
        self.outcome = ""
        self.part = 1
        #: The episode-wide index of this part's first step.
        self.first_index = 0
        self.chain: Chain | None = None
        #: Bytes of frames held, and bytes reserved for them in the sink.
        self.size = 0 if reset is None else len(reset[1]) + len(reset[2])
        self.reserved = 0
        #: Whether the episode was counted, written or dropped.
        self.settled = False
        #: The process generation it was begun in (a fork child's is another).
        self.generation = _GENERATION

    def next_part(self) -> Episode:
        """The part that follows this one: same ids and start, no reset, the step
        indexes going on."""
        nxt = Episode.__new__(Episode)
        nxt.server, nxt.session_id, nxt.episode_id = (self.server, self.session_id,
                                                      self.episode_id)
        nxt.reset = None
        nxt.steps, nxt.unknown = [], []
        nxt.start_wall, nxt.start_perf = self.start_wall, self.start_perf
        nxt.end, nxt.outcome = 0.0, ""
        nxt.part = self.part + 1
        nxt.first_index = self.first_index + len(self.steps)
        if self.chain is None:
            self.chain = Chain()
        nxt.chain = self.chain
        nxt.size = nxt.reserved = 0
        nxt.settled = False
        nxt.generation = self.generation
        return nxt


_OWN = frozenset(("observation", "reward", "done"))


def _answer(data: Any, redact: Callable[[Any], Any] | None) -> tuple[Any, Any, bool,
                                                                    dict[str, Any] | None]:
    """An answer's ``observation``, ``reward``, ``done`` and other fields (``None`` if
    there are none), redacted (what :func:`~envlink._recording.rollouts.split_answer`
    keeps, written out: it runs for every step)."""
    get = data.get
    observation = get("observation")
    extra = None
    if data.keys() - _OWN:
        extra = {k: v for k, v in data.items() if k not in _OWN}
    if redact is not None:
        observation = redact(observation)
        if extra is not None:
            extra = {key: redact(value) for key, value in extra.items()}
    return observation, get("reward"), bool(get("done", False)), extra


def episode_record(ep: Episode, redact: Callable[[Any], Any] | None, *,
                   steps_too: bool = True) -> dict[str, Any]:
    """The JSON object of one episode or part (on the writer thread); ``steps``, its
    last member, left out unless ``steps_too``.

    Everything that came from the caller or the environment goes through ``redact``:
    the reset's kwargs (each value), observations, actions, every other field of an
    answer (each value: ``metadata``...) and the actions of unknown steps.
    """
    base_wall, base_perf = ep.start_wall, ep.start_perf
    reset: dict[str, Any] | None = None
    if ep.reset is not None:
        frames, request, reply = ep.reset
        if frames:
            kwargs, reset_data = from_json(request)["data"], from_json(reply)["data"]
        else:
            kwargs, reset_data = from_json(request), from_json(reply)
        if not isinstance(kwargs, dict):
            kwargs = {}
        if redact is not None:
            kwargs = {key: redact(value) for key, value in kwargs.items()}
        observation, reward, done, extra = _answer(reset_data, redact)
        reset = {"kwargs": kwargs, "observation": observation, "reward": reward,
                 "done": done}
        if extra is not None:
            reset["extra"] = extra
    steps: list[dict[str, Any]] = []
    append = steps.append
    chain = ep.chain
    total = 0.0 if chain is None else chain.total
    for index, (frames, action, reply, start, latency, retries, recovered,
                trace) in enumerate(ep.steps if steps_too else (), ep.first_index):
        if frames:
            action, reply = from_json(action)["data"], from_json(reply)["data"]
        else:
            action, reply = from_json(action), from_json(reply)
        if redact is not None:
            action = redact(action)
        observation, reward, done, extra = _answer(reply, redact)
        if reward.__class__ is float or (isinstance(reward, int)
                                         and not isinstance(reward, bool)):
            total += reward
        record: dict[str, Any] = {"index": index, "action": action,
                                  "observation": observation, "reward": reward,
                                  "done": done, "start": base_wall + (start - base_perf),
                                  "latency": latency, "retries": retries,
                                  "recovered": recovered is not None}
        if extra is not None:
            record["extra"] = extra
        if recovered is not None:
            record["recovery"] = recovered
        if trace is not None:
            record["trace_id"] = f"{trace[0]:032x}"
            record["span_id"] = f"{trace[1]:016x}"
        append(record)
    out: dict[str, Any] = {
        "schema": SCHEMA,
        "episode_id": ep.episode_id,
        "server": ep.server,
        "session_id": ep.session_id,
        "part": ep.part,
        "reset": reset,
        "unknown_steps": [{"action": from_json(action) if redact is None
                           else redact(from_json(action)), "after": after}
                          for action, after in ep.unknown],
        "outcome": ep.outcome,
        "return": total,
        "start": base_wall,
        "end": ep.end,
        "truncated": False,
        "envlink": __version__,
        "pid": _PID,
    }
    if redact is not None:  # what replay compares is not what the server answered
        out["redacted"] = True
    if steps_too:
        out["steps"] = steps
    if chain is not None and steps_too:
        chain.total = total  # only once the whole part could be made
    return out


#: Where a step request's data begins: envlink writes every request compactly, the
#: data last (``_sansio.protocol._dump``), so the action's text runs to the last byte
#: but one.
_STEP_DATA = b'"type":"step","data":'
#: How an observation frame begins, from envlink's server and OpenEnv's alike (both
#: compact, ``data`` second); what follows ``data`` is ``,"id":...}`` or ``}``.
_OBSERVATION = b'{"type":"observation","data":'
_ID = b',"id":'


def _answer_text(reply: bytes | str) -> tuple[bytes, Any] | None:
    """The text of an observation frame's ``data`` members (``"observation":...,
    "reward":...,"done":...``) and its reward, cut from the frame as it came.

    ``None`` unless the frame begins as :data:`_OBSERVATION` says and its data has
    those three members alone, a boolean ``done`` and a numeric or null reward. The
    cut begins where the data begins and must parse as one JSON value: a JSON value
    ends where it ends, so a cut that parses is the data's text, whatever follows.
    The text may hold line breaks (whitespace between tokens: a string's are escaped).
    """
    if isinstance(reply, str):  # a text frame as the websockets transport gives it
        reply = reply.encode()
    elif reply.__class__ is not bytes:
        return None
    if not reply.startswith(_OBSERVATION):
        return None
    begin = len(_OBSERVATION)
    end = reply.rfind(_ID)
    cut = reply[begin:end if end > begin else -1]
    try:
        data = from_json(cut)
    except ValueError:
        if end <= begin:
            return None
        cut = reply[begin:-1]  # an "id" member inside the data, none after it
        try:
            data = from_json(cut)
        except ValueError:
            return None
    if data.__class__ is not dict or data.keys() != _OWN:
        return None
    reward = data["reward"]
    if data["done"].__class__ is not bool or not (
            reward is None or reward.__class__ is float or reward.__class__ is int):
        return None
    return cut.strip()[1:-1], reward


def _steps_text(ep: Episode) -> tuple[bytes, float] | None:
    """The JSON text of ``ep``'s steps (a list) and the return after them, cut from the
    frames rather than parsed and serialised again; ``None`` where a step cannot be
    (answered through recovery, an answer with other members, a frame laid out
    otherwise): :func:`episode_record` then makes the whole record."""
    chain = ep.chain
    total = 0.0 if chain is None else chain.total
    base_wall, base_perf = ep.start_wall, ep.start_perf
    cuts: list[tuple[bytes, bytes, bytes]] = []
    numbers: list[float] = []
    index = ep.first_index
    for frames, sent, reply, start, latency, retries, recovered, trace in ep.steps:
        if not frames or sent.__class__ is not bytes or not sent.endswith(b"}"):
            return None
        at = sent.find(_STEP_DATA)
        cut = None if at < 0 else _answer_text(reply)
        if cut is None:
            return None
        members, reward = cut
        if reward is not None:
            total += reward
        tail = b'"recovered":false}' if recovered is None else (
            b'"recovered":true,"recovery":' + to_json(recovered) + b"}")
        if trace is not None:
            tail = b'"trace_id":"%032x","span_id":"%016x",%b' % (trace[0], trace[1], tail)
        cuts.append((sent[at + len(_STEP_DATA):-1], members, tail))
        numbers += (index, base_wall + (start - base_perf), latency, retries)
        index += 1
    # Every number of the steps in one call: a float's shortest text is dear in Python.
    texts = iter(to_json(numbers)[1:-1].split(b","))
    out: list[bytes] = [b"["]
    for action, members, tail in cuts:
        out += (b'{"index":', next(texts), b',"action":', action, b",", members,
                b',"start":', next(texts), b',"latency":', next(texts), b',"retries":',
                next(texts), b",", tail, b",")
    if cuts:
        out[-1] = b"]"
    else:
        out.append(b"]")
    text = b"".join(out)
    if b"\n" in text or b"\r" in text:  # only whitespace between tokens can be one
        text = text.replace(b"\n", b" ").replace(b"\r", b" ")
    return text, total


def episode_line(ep: Episode, redact: Callable[[Any], Any] | None) -> bytes:
    """One episode's line (without its newline), as :func:`episode_record` gives it.

    Without a redactor, the steps' actions and answers are cut from the frames as
    they were on the wire (each answer's cut checked by parsing it as one value), not
    parsed and serialised again: most of the writer's work per step.
    """
    if redact is None:
        try:
            cut = _steps_text(ep)
        except Exception:  # a frame of a kind not foreseen: the record is made whole
            cut = None
        if cut is not None:
            steps, total = cut
            record = episode_record(ep, None, steps_too=False)
            record["return"] = total
            if ep.chain is not None:
                ep.chain.total = total
            # "steps", the last member, is the one made here.
            return to_json(record, inf_nan_mode="constants")[:-1] + b',"steps":' + steps + b"}"
    return to_json(episode_record(ep, redact), inf_nan_mode="constants")


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


class _File:
    """A sink's open file descriptor, closed when the sink is garbage-collected."""

    __slots__ = ("fd",)

    def __init__(self) -> None:
        self.fd: int | None = None

    def close(self) -> None:
        fd, self.fd = self.fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


class Sink:
    """One recorder's files in this process, and its share of the writer's queue.

    ``lock`` guards the counts, the bytes and steps held, and ``closed``; ``io_lock``
    the file: the writer holds it while it writes, :meth:`close` takes it to close
    the file, so no file is opened or written after ``close()``.

    Args:
        directory: where the files go (made if missing).
        prefix: the files' name prefix.
        max_file_bytes: a file is closed and another begun past this size.
        max_buffered_steps: steps waiting for the writer past which a finished
            episode is dropped whole.
        max_buffered_bytes: bytes of frames held (open episodes, unknown steps and
            episodes waiting for the writer) past which an episode is dropped whole.
        redact: applied to what came from the caller or the environment, on the
            writer thread.
    """

    def __init__(self, directory: Path, prefix: str, max_file_bytes: int,
                 max_buffered_steps: int, redact: Callable[[Any], Any] | None,
                 max_buffered_bytes: int = 1 << 62) -> None:
        self.directory = directory
        self.prefix = prefix
        self.max_file_bytes = max_file_bytes
        self.max_buffered_steps = max_buffered_steps
        self.max_buffered_bytes = max_buffered_bytes
        self.redact = redact
        self.closed = False
        self._file = _File()
        weakref.finalize(self, self._file.close)
        self._fresh()
        _SINKS.add(self)

    def _fresh(self) -> None:
        """This process's state: no file, nothing held, nothing counted."""
        self.pid = os.getpid()
        self.tag = secrets.token_hex(4)
        self.index = itertools.count(1)
        self.lock = threading.Lock()
        self.io_lock = threading.Lock()
        self.size = 0
        #: Whether the file ends with a partial line (a write stopped short).
        self.partial = False
        #: Steps of finished episodes waiting for the writer, and bytes reserved.
        self.buffered = 0
        self.held_bytes = 0
        #: episodes and steps written and dropped (read by ``RolloutRecorder.stats``).
        self.counts = {"episodes_written": 0, "steps_written": 0,
                       "episodes_dropped": 0, "steps_dropped": 0}
        self._last_warning = 0.0
        self.files: list[Path] = []

    def after_fork_in_child(self) -> None:
        """A forked child: the inherited descriptor closed, a state of its own."""
        self._file.close()
        self._fresh()

    @property
    def fd(self) -> int | None:
        """The current file's descriptor, if one is open."""
        return self._file.fd

    # ------------------------------------------------------------ client side

    def reserve(self, size: int) -> bool:
        """Reserve ``size`` bytes for an open episode (``False``: past the bound)."""
        with self.lock:
            if self.held_bytes + size > self.max_buffered_bytes:
                return False
            self.held_bytes += size
            return True

    def release(self, size: int, steps: int = 0) -> None:
        """Give back an episode's reserved bytes (and its steps, if it was waiting)."""
        with self.lock:
            self.held_bytes -= size
            self.buffered -= steps

    def submit(self, ep: Episode) -> int:
        """Queue a finished episode for the writer, or drop it (never waits).

        Returns:
            The writer's sequence number of the episode (:meth:`wait`), 0 if dropped.
        """
        steps = len(ep.steps)
        if ep.generation != _GENERATION:
            return 0  # begun before a fork: the parent's, which writes it
        why = None
        with self.lock:
            if self.closed:
                why = "the recorder is closed"
            elif ep.chain is not None and ep.chain.broken:
                why = "an earlier part of the episode was dropped"
            elif self.buffered + steps > self.max_buffered_steps:
                why = "more steps are waiting for the disk than max_buffered_steps"
            else:
                self.buffered += steps
        if why is not None:
            self.dropped(ep, why)
            return 0
        return _process_writer().put(self, ep)

    def dropped(self, ep: Episode, why: str, *, waiting: bool = False) -> None:
        """Count an episode dropped, give back what it held (and warn, at most every
        10 s per recorder)."""
        if ep.settled:
            return
        ep.settled = True
        if ep.chain is not None:
            ep.chain.broken = True
        steps = len(ep.steps)
        with self.lock:
            self.held_bytes -= ep.reserved
            if waiting:
                self.buffered -= steps
            ep.reserved = 0
            counts = self.counts
            counts["episodes_dropped"] += 1
            counts["steps_dropped"] += steps
            dropped = counts["episodes_dropped"]
            now = time.monotonic()
            warn = now - self._last_warning >= 10.0 or self._last_warning == 0.0
            if warn:
                self._last_warning = now
        _COUNTERS.add("dropped", 1, steps)
        if warn:
            _log.warning("envlink rollout recorder dropped an episode (%s); %d dropped "
                         "so far in %s", why, dropped, self.directory)

    def written(self, episodes: list[Episode]) -> None:
        """Count episodes written and give back what they held."""
        steps = sum(len(ep.steps) for ep in episodes)
        size = sum(ep.reserved for ep in episodes)
        for ep in episodes:
            ep.settled = True
            ep.reserved = 0
        with self.lock:
            self.held_bytes -= size
            self.buffered -= steps
            counts = self.counts
            counts["episodes_written"] += len(episodes)
            counts["steps_written"] += steps
        _COUNTERS.add("written", len(episodes), steps)

    def snapshot(self) -> dict[str, int]:
        """The counts, all from one moment."""
        with self.lock:
            return dict(self.counts)

    def flush(self, timeout: float | None) -> bool:
        """Wait until every episode queued so far is written (``False``: timed out)."""
        writer = _process_writer()
        return writer.wait(writer.last(), timeout)

    def close(self, timeout: float | None) -> bool:
        """Flush, then close the file; later episodes are dropped (counted)."""
        flushed = self.flush(timeout)
        with self.lock:
            self.closed = True
        with self.io_lock:  # a write in progress ends first; none begins after
            self._file.close()
        return flushed

    # ------------------------------------------------------------ writer side

    def write(self, items: list[tuple[Episode, bytes]]) -> None:
        """Write whole lines to this process's current file, as many as fit in it with
        one ``write``, and count them written; a kill mid-write leaves one partial last
        line. A write that stops short counts the lines it did not finish as dropped,
        and the next line begins on a line of its own."""
        with self.io_lock:
            if self.closed:
                for ep, _ in items:
                    self.dropped(ep, "the recorder is closed", waiting=True)
                return
            chunk: list[tuple[Episode, bytes]] = []
            size = 0
            for item in items:
                line = item[1]
                if self._file.fd is None or (self.size + size and
                                             self.size + size + len(line) > self.max_file_bytes):
                    if not self._write_chunk(chunk):
                        chunk, size = [], 0
                        continue
                    chunk, size = [], 0
                    try:
                        self._next_file()
                    except OSError as exc:
                        self.dropped(item[0], f"no file could be opened: {exc}",
                                     waiting=True)
                        continue
                chunk.append(item)
                size += len(line)
            self._write_chunk(chunk)

    def _write_chunk(self, chunk: list[tuple[Episode, bytes]]) -> bool:
        """Write ``chunk`` with one ``write`` (more if the system writes less); count
        its lines written or dropped. ``False``: the write failed."""
        if not chunk:
            return True
        fd = self._file.fd
        assert fd is not None
        data = b"".join(line for _, line in chunk)
        if self.partial:
            data = b"\n" + data
        lead = len(data) - sum(len(line) for _, line in chunk)
        done = 0
        error: OSError | None = None
        view = memoryview(data)
        try:
            while done < len(data):
                written = os.write(fd, view[done:])
                if written == 0:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                done += written
        except OSError as exc:
            error = exc
        finally:
            view.release()
        self.size += done
        if error is None:
            self.partial = False
            self.written([ep for ep, _ in chunk])
            return True
        if done >= lead:
            self.partial = False  # the newline, at least, is there
        end = lead
        whole: list[Episode] = []
        for ep, line in chunk:
            end += len(line)
            if end <= done:
                whole.append(ep)
            else:
                if end - len(line) < done:
                    self.partial = True  # a line begun and not finished
                self.dropped(ep, f"it could not be written: {error}", waiting=True)
        if whole:
            self.written(whole)
        return False

    def _next_file(self) -> None:
        self._file.close()
        self.directory.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        path = self.directory / (f"{self.prefix}-{stamp}-{self.pid}-{self.tag}-"
                                 f"{next(self.index):04d}.jsonl")
        self._file.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.size = 0
        self.partial = False
        self.files.append(path)


class _Writer:
    """The process's writer thread and its queue."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.cond = threading.Condition(threading.Lock())
        self.queue: deque[tuple[Sink, Episode]] = deque()
        self.submitted = 0
        self.done = 0
        #: Whether the thread waits for work (a submit then wakes it), and whether a
        #: caller waits for the queue (the writer then does not gather).
        self.idle = False
        self.urgent = False
        self.thread = self._start()

    def _start(self) -> threading.Thread:
        thread = threading.Thread(target=self._run, name="envlink-rollout-writer",
                                  daemon=True)
        thread.start()
        return thread

    def put(self, sink: Sink, ep: Episode) -> int:
        with self.cond:
            self.queue.append((sink, ep))
            self.submitted += 1
            number = self.submitted
            if self.idle:  # else the writer takes it with what it is gathering
                self.idle = False
                self.cond.notify()
            if not self.thread.is_alive():
                self._restart()
        return number

    def _restart(self) -> None:
        """A thread of the writer's that ended all the same: another (none at
        interpreter shutdown, when no thread can start)."""
        try:
            self.thread = self._start()
        except RuntimeError:
            _log.warning("envlink rollout writer could not start again")

    def last(self) -> int:
        with self.cond:
            return self.submitted

    def wait(self, number: int, timeout: float | None) -> bool:
        """Wait until the episodes up to ``number`` are written or dropped."""
        with self.cond:
            if self.done >= number:
                return True
            if not self.thread.is_alive():
                self._restart()
            self.urgent = True
            self.cond.notify_all()
            return self.cond.wait_for(lambda: self.done >= number, timeout)

    def _run(self) -> None:
        while True:
            try:
                self._once()
            except BaseException:  # never ends the writer (a redactor's SystemExit...)
                _log.exception("envlink rollout writer failed; it goes on")

    def _once(self) -> None:
        cond, queue = self.cond, self.queue
        with cond:
            while not queue:
                self.idle = True
                cond.wait()
            self.idle = False
            # Let the episodes ending meanwhile join this batch: one wake-up and one
            # write per file for many episodes, each still on disk well within 1 s;
            # unless a caller waits.
            cond.wait_for(lambda: self.urgent, _GATHER)
            self.urgent = False
            batch = list(queue)
            queue.clear()
        try:
            self._write(batch)
        finally:
            with cond:
                self.done += len(batch)
                cond.notify_all()

    def _write(self, batch: list[tuple[Sink, Episode]]) -> None:
        by_sink: dict[Sink, list[tuple[Episode, bytes]]] = {}
        for sink, ep in batch:
            try:
                line = episode_line(ep, sink.redact) + b"\n"
            except BaseException as exc:  # a redaction or an answer that cannot be written
                sink.dropped(ep, f"it could not be serialised: {exc!r}", waiting=True)
                continue
            by_sink.setdefault(sink, []).append((ep, line))
        for sink, items in by_sink.items():
            try:
                sink.write(items)
            except BaseException as exc:
                for ep, _ in items:  # those not counted yet
                    sink.dropped(ep, f"it could not be written: {exc!r}", waiting=True)


_WRITER: _Writer | None = None
_WRITER_LOCK = threading.Lock()
#: This process's sinks and tapes (a forked child resets them; exit closes the tapes).
_SINKS: weakref.WeakSet[Sink] = weakref.WeakSet()
_TAPES: weakref.WeakSet[Any] = weakref.WeakSet()
#: The process whose exit hooks are registered.
_HOOKED_PID = 0
#: This process's generation: one more in a forked child; and its pid.
_GENERATION = 0
_PID = os.getpid()
#: Whether a recorder asked for writing at SIGTERM, and the process that decided
#: whether its SIGTERM handler is the recorder's (:func:`arm_sigterm`).
_SIGTERM_WANTED = False
_SIGTERM_PID = 0
#: Whether the handler has begun in this process; the process whose pipe is the
#: wakeup fd, and the pipe's ends (:func:`_watch_sigterm`).
_SIGTERM_BEGUN = False
_WAKE: tuple[int, int, int] | None = None
#: The process whose exit hook is running, and whether a SIGTERM waits for its end.
_EXITING = 0
_SIGTERM_DEFERRED = False
_CAN_SIGNAL = os.name == "posix"


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


def writer_number() -> tuple[_Writer, int]:
    """This process's writer and the number of the last episode queued to it."""
    writer = _process_writer()
    return writer, writer.last()


def track(tape: Any) -> None:
    """Know ``tape`` at exit; make sure this process's exit hooks are in place."""
    _TAPES.add(tape)
    pid = os.getpid()
    if pid != _HOOKED_PID:
        _hook_exit()
    if _SIGTERM_WANTED and pid != _SIGTERM_PID:  # a recorder made off the main thread
        arm_sigterm()


def _hook_exit() -> None:
    global _HOOKED_PID
    with _WRITER_LOCK:
        if os.getpid() == _HOOKED_PID:
            return
        _HOOKED_PID = os.getpid()
    # A multiprocessing child ends with os._exit after running these finalizers.
    mp_util = sys.modules.get("multiprocessing.util")
    if mp_util is not None:
        mp_util.Finalize(None, _write_at_exit, exitpriority=-100)


def _write_at_exit(timeout: float = _EXIT_WAIT) -> None:
    """The episodes still open end as ``close``; then everything queued is written
    (waited for at most ``timeout`` seconds). A SIGTERM that came meanwhile (the
    handler leaves the work to this hook) then ends the process."""
    global _EXITING
    _EXITING = os.getpid()
    try:
        for tape in list(_TAPES):
            try:
                tape.close(wait=False)
            except Exception:
                _log.exception("envlink rollout recorder could not end an episode at exit")
        writer = _WRITER
        if writer is not None and writer.pid == os.getpid():
            writer.wait(writer.last(), timeout)
    finally:
        _EXITING = 0
        if _SIGTERM_DEFERRED:
            _end_by_sigterm()


def arm_sigterm() -> None:
    """Write what waits for the disk when this process gets SIGTERM.

    Installs :func:`_on_sigterm` if SIGTERM's disposition is the default: a handler
    the application or a framework set stays, and so does ``SIG_IGN``. Only the main
    thread can install a handler; called from another, it does nothing, and the next
    use of a recorder in the main thread tries again. Called where a recorder is made
    (or unpickled), where a client's tape is made, and in a forked child; once a
    process has decided, it costs one comparison.
    """
    global _SIGTERM_WANTED, _SIGTERM_PID
    _SIGTERM_WANTED = True
    pid = os.getpid()
    if pid == _SIGTERM_PID or not _CAN_SIGNAL:
        return
    try:
        handler = signal.getsignal(signal.SIGTERM)
        if handler is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, handler := _on_sigterm)
    except ValueError:  # not the main thread (or not the main interpreter)
        return
    _SIGTERM_PID = pid
    if handler is _on_sigterm:
        _watch_sigterm()


def _watch_sigterm() -> None:
    """Start the thread that sees SIGTERM arrive (through the wakeup fd, unless the
    application uses it) and makes sure the main thread runs the handler.

    A signal meant for a Python handler can fail to interrupt the main thread, where
    alone the handler runs: taken by another thread, or arriving just before the
    main thread blocks. The main thread then stays blocked (a ``multiprocessing``
    queue's lock) without running it: forever in a pool worker whose queue its pool
    holds, which the default disposition would have ended. The thread sends SIGTERM
    again to the main thread itself, every 0.2 s, until the handler begins.
    """
    global _WAKE
    if _WAKE is not None and _WAKE[0] != os.getpid():  # a forked child: the parent's pipe
        for fd in _WAKE[1:]:
            with contextlib.suppress(OSError):
                os.close(fd)
        inherited, _WAKE = _WAKE[2], None
    else:
        inherited = -1
    if _WAKE is not None:
        return
    read, write = os.pipe()
    try:
        os.set_blocking(write, False)
        old = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        if old not in (-1, inherited):  # the application's (asyncio's): it stays
            signal.set_wakeup_fd(old)
            raise ValueError("the wakeup fd is in use")
        threading.Thread(target=_watch, args=(read, threading.get_ident()),
                         name="envlink-sigterm-watch", daemon=True).start()
    except (ValueError, OSError, RuntimeError):
        os.close(read)
        os.close(write)
        return
    _WAKE = (os.getpid(), read, write)


def _watch(fd: int, main: int) -> None:
    while True:
        try:
            data = os.read(fd, 512)
        except OSError:
            return
        if not data:
            return
        if signal.SIGTERM in data:
            break
    while True:
        time.sleep(0.2)  # the handler normally begins within microseconds
        if _SIGTERM_BEGUN or signal.getsignal(signal.SIGTERM) is not _on_sigterm:
            return
        try:
            signal.pthread_kill(main, signal.SIGTERM)
        except OSError:
            return


def _on_sigterm(signum: int, frame: Any) -> None:
    """SIGTERM: the episodes still open end as ``close`` and everything queued is
    written, waited for at most ``_SIGTERM_WAIT`` seconds; then the default disposition
    comes back and SIGTERM is sent again, so that the process ends by SIGTERM as it
    would have (its exit status unchanged). A SIGTERM meanwhile changes nothing.

    Python runs this on the main thread, between two of its bytecodes, perhaps while
    it holds a lock of the recorder's or of ``logging``'s: the work is done on a thread
    of its own, which such a lock can delay but never the end of the process.
    """
    global _SIGTERM_BEGUN, _SIGTERM_DEFERRED
    if _SIGTERM_BEGUN:
        return
    _SIGTERM_BEGUN = True
    if os.getpid() == _EXITING:
        # The exit hook runs on this thread (a worker ending as SIGTERM came), perhaps
        # with an episode in hand: it writes it, then ends the process.
        _SIGTERM_DEFERRED = True
        return
    try:
        done = _thread.allocate_lock()
        done.acquire()
        _thread.start_new_thread(_write_at_sigterm, (done,))
        done.acquire(timeout=_SIGTERM_WAIT)
    finally:
        _end_by_sigterm()


def _end_by_sigterm() -> None:
    """End the process by SIGTERM, as the default disposition does."""
    with contextlib.suppress(ValueError):  # not the main thread: the handler returns
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def _write_at_sigterm(done: Any) -> None:
    try:
        _write_at_exit(_SIGTERM_WAIT)
    except BaseException:  # the process ends all the same
        pass
    finally:
        done.release()


def _after_fork_in_child() -> None:
    global _WRITER, _WRITER_LOCK, _GENERATION, _PID, _SIGTERM_BEGUN, _SIGTERM_DEFERRED
    _WRITER, _WRITER_LOCK = None, threading.Lock()
    _GENERATION += 1
    _PID = os.getpid()
    for sink in list(_SINKS):
        sink.after_fork_in_child()
    for tape in list(_TAPES):
        tape.after_fork_in_child()
    _SIGTERM_BEGUN = _SIGTERM_DEFERRED = False
    if _SIGTERM_WANTED:  # the parent's handler is inherited; else, the child's own
        arm_sigterm()


# atexit runs its hooks last registered first: this one, registered at import, may run
# before a client's closes registered later; it ends the open episodes itself, and a
# client closed after it finds none.
atexit.register(_write_at_exit)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
