"""``RolloutRecorder``: every episode a client runs, recorded as the caller got it.

A recorder is given to a client (``recorder=``) or in a ``ClientConfig``. Each client
it is given to makes a :class:`Tape` of its own: the client tells it, where it
hands the caller an answer (after reconnects, resume, replay, the server's
de-duplication), what the reset or the step sent and received; the tape appends one
small tuple per step (the frames as they were on the wire, not serialised) and, when
the episode ends (``done``, a new reset, ``close()``, a lost session), hands it to the
process's writer thread (:mod:`envlink._recording.writer`). A long episode goes to
the writer in parts, each of ``part_steps`` steps or ``part_bytes`` bytes at most.

Retries and recovery are seen through the client's hook: the tape wraps the client's
hook, intercepting only the phases and events that say a step was retried or answered
through recovery (not on the path of a call that is neither). A retry or a recovery
of another call (``state()``, an MCP call) is not a step's.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

from opentelemetry import trace

from envlink._config import check_count
from envlink._errors import OutcomeUnknownError
from envlink._events.client_events import ClientEvent, ClientHook, PhaseStarted
from envlink._recording.writer import Episode, Sink, arm_sigterm, track, writer_number
from envlink._sansio.journal import encode_payload
from envlink.names import HOOK_RECOVERY_FINISHED

__all__ = ["RecordingHook", "RolloutRecorder", "Tape"]

_perf = time.perf_counter
_get_current_span = trace.get_current_span
_LOST = "lost"
#: Seconds a client's close waits for its episodes to be on disk.
CLOSE_WAIT = 10.0
#: Bytes an episode reserves first against ``max_buffered_bytes`` (then doubling).
_FIRST_RESERVE = 4096


class RolloutRecorder:
    """Records every episode of the clients it is given to, as ``*.jsonl`` files.

    One JSON object per episode per line (``docs/recording.md``), written by a
    background thread: a step costs its client one small tuple appended to a list,
    never a wait for the disk. An episode is on disk within a second of its end, and
    when its client's ``close()`` returns; :meth:`flush`, :meth:`close` and the
    context manager wait for the rest. A long episode is written in parts (lines
    with the same ``episode_id`` and ``part`` 1, 2, ...), never dropped for its length.

    Picklable as its settings: a ``ClientConfig`` that carries one crosses to Ray
    workers and subprocesses, and each process writes files of its own (its pid and
    a random part in their names) into the same directory. A forked child starts
    with files, counts and a writer of its own.

    At SIGTERM, what waits for the disk is written (open episodes as ``close``, for
    at most 2 s), then the process ends by SIGTERM as it would have: the recorder
    installs a handler, where it is made (or unpickled) on the main thread, if
    SIGTERM's disposition is the default; never in place of the application's.

    Args:
        directory: where the files go (made when the first episode is written).
        redact: applied, on the writer thread, to everything that came from the
            caller or the environment: each action, each observation, each reset
            keyword argument's value, each other field of an answer (``metadata``...)
            and each unknown step's action; returns what to write instead. Headers
            and tokens are never recorded.
        max_file_bytes: a file is closed and the next begun past this size.
        max_buffered_bytes: bound on the bytes held for the disk, open episodes,
            unknown steps and finished episodes waiting for the writer together; past
            it an episode is dropped whole, counted and logged.
        max_buffered_steps: bound on the steps of finished episodes waiting for the
            disk; past it an episode is dropped whole, counted and logged.
        part_steps: an episode is written in parts of at most this many steps.
        part_bytes: ... and of at most about this many bytes of frames.
        prefix: the files' name prefix.
        max_episode_steps: the former name of ``part_steps`` (deprecated).
        flush_on_sigterm: whether to install that SIGTERM handler (``False``: a
            SIGTERM ends the process with what waits for the disk lost, unless
            another recorder of the process installed it).

    Raises:
        TypeError: ``redact`` is not callable, a bound is not a whole number, or
            ``flush_on_sigterm`` is not a bool.
        ValueError: a bound below 1.
    """

    def __init__(self, directory: str | os.PathLike[str], *,
                 redact: Callable[[Any], Any] | None = None,
                 max_file_bytes: int = 64 * 1024 * 1024,
                 max_buffered_bytes: int = 1024 * 1024 * 1024,
                 max_buffered_steps: int = 1_000_000,
                 part_steps: int = 10_000,
                 part_bytes: int = 16 * 1024 * 1024,
                 prefix: str = "rollouts",
                 max_episode_steps: int | None = None,
                 flush_on_sigterm: bool = True) -> None:
        if redact is not None and not callable(redact):
            raise TypeError(f"redact must be callable or None, got {type(redact).__name__}")
        if not isinstance(flush_on_sigterm, bool):
            raise TypeError("flush_on_sigterm must be a bool, got "
                            f"{type(flush_on_sigterm).__name__}")
        if not isinstance(prefix, str) or not prefix or "/" in prefix or os.sep in prefix:
            raise ValueError(f"prefix must be a file name part, got {prefix!r}")
        if max_episode_steps is not None:
            warnings.warn("max_episode_steps is now part_steps: a longer episode is "
                          "written in parts", DeprecationWarning, stacklevel=2)
            part_steps = max_episode_steps
        self.directory = Path(directory)
        self.redact = redact
        self.max_file_bytes = check_count(max_file_bytes, "max_file_bytes", minimum=1)
        self.max_buffered_bytes = check_count(max_buffered_bytes, "max_buffered_bytes",
                                              minimum=1)
        self.max_buffered_steps = check_count(max_buffered_steps, "max_buffered_steps",
                                              minimum=1)
        self.part_steps = check_count(part_steps, "part_steps", minimum=1)
        self.part_bytes = check_count(part_bytes, "part_bytes", minimum=1)
        self.prefix = prefix
        self.flush_on_sigterm = flush_on_sigterm
        self._sink: Sink | None = None
        if flush_on_sigterm:
            arm_sigterm()

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (str(self.directory), self.redact, self.max_file_bytes,
                           self.max_buffered_steps, self.part_steps, self.prefix,
                           self.max_buffered_bytes, self.part_bytes,
                           self.flush_on_sigterm))

    def __repr__(self) -> str:
        return f"RolloutRecorder({str(self.directory)!r})"

    @property
    def sink(self) -> Sink:
        """This process's files of the recorder."""
        sink = self._sink
        if sink is None:
            sink = self._sink = Sink(self.directory, self.prefix, self.max_file_bytes,
                                     self.max_buffered_steps, self.redact,
                                     self.max_buffered_bytes)
        return sink

    def tape(self, server: str, *, tracing: bool = False) -> Tape:
        """A new tape for one client session on ``server`` (its URL, no credentials)."""
        return Tape(self, server, tracing)

    @property
    def files(self) -> list[Path]:
        """The files this process has written so far."""
        return list(self.sink.files)

    @property
    def stats(self) -> dict[str, int]:
        """Episodes and steps written and dropped so far by this process (a part of a
        long episode counts as an episode)."""
        return self.sink.snapshot()

    def flush(self, timeout: float | None = 10.0) -> bool:
        """Wait until the episodes finished so far are on disk.

        Returns:
            ``False`` if ``timeout`` seconds passed first.
        """
        return self.sink.flush(timeout)

    def close(self, timeout: float | None = 10.0) -> bool:
        """Flush and close the files; episodes finished later are dropped (counted).

        Episodes still running are not waited for: close their clients first (a
        client's ``close()`` ends its episode as ``close``).
        """
        return self.sink.close(timeout)

    def __enter__(self) -> RolloutRecorder:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def _rebuild(directory: str, redact: Callable[[Any], Any] | None, max_file_bytes: int,
             max_buffered_steps: int, part_steps: int, prefix: str,
             max_buffered_bytes: int = 1024 * 1024 * 1024,
             part_bytes: int = 16 * 1024 * 1024,
             flush_on_sigterm: bool = True) -> RolloutRecorder:
    return RolloutRecorder(directory, redact=redact, max_file_bytes=max_file_bytes,
                           max_buffered_bytes=max_buffered_bytes,
                           max_buffered_steps=max_buffered_steps,
                           part_steps=part_steps, part_bytes=part_bytes, prefix=prefix,
                           flush_on_sigterm=flush_on_sigterm)


def _span_ids() -> tuple[int, int] | None:
    ctx = _get_current_span().get_span_context()
    return (ctx.trace_id, ctx.span_id) if ctx.is_valid else None


class Tape:
    """One client session's recording: the episode in progress.

    The client calls :meth:`reset_started` and :meth:`reset_answered` around a
    reset, :meth:`step_answered` where it hands the caller a step's answer,
    :meth:`step_failed` where a step raises, :meth:`close` when it closes.
    Everything runs on the client's event loop, one call at a time.
    """

    __slots__ = ("__weakref__", "_last", "_part_bytes", "_part_steps", "_sink", "_tracing",
                 "episode", "first", "keeping", "kept", "lost", "recovered", "recovering",
                 "retries", "server")

    def __init__(self, recorder: RolloutRecorder, server: str, tracing: bool) -> None:
        self._sink = recorder.sink
        self._part_steps = recorder.part_steps
        self._part_bytes = recorder.part_bytes
        self._tracing = tracing
        self.server = server
        self.episode: Episode | None = None
        #: Tries after the first of the step in progress, and the recovery mechanism
        #: that answered it (from the client's hook).
        self.retries = 0
        self.recovered: str | None = None
        #: The call whose session recovery is in progress (only a step's counts).
        self.recovering: str | None = None
        #: Whether the session had lost the episode when a reset began.
        self.lost = False
        #: Whether no step was recorded yet (the first tells whether tracing is on).
        self.first = True
        #: The writer's number of this tape's last episode (what close waits for).
        self._last = 0
        #: Whether a lost episode is kept for a rebuild elsewhere (:meth:`keep_lost`),
        #: and the one kept.
        self.keeping = False
        self.kept: Episode | None = None
        track(self)

    def wrap(self, hook: ClientHook) -> ClientHook:
        """The client's hook, with this tape watching retries and recoveries."""
        return RecordingHook(hook, self)  # type: ignore[return-value]

    def reset_started(self, core: Any) -> None:
        """A reset is about to be sent: note whether the session had lost the episode."""
        self.lost = core.episode.value == _LOST

    def reset_answered(self, call: Any, kwargs: dict[str, Any], frame: Any, core: Any) -> None:
        """A reset was answered (after ``core.answered``): the episode before ends
        (``reset``, or ``lost`` when the session had lost it), a new one begins."""
        if self.episode is not None:
            self._finish(_LOST if self.lost else "reset")
        self.retries, self.recovered, self.lost = 0, None, False
        if call.answer is frame:  # the frames as on the wire: nothing serialised here
            reset = (True, call.sent, call.received)
        else:
            reset = (False, encode_payload(kwargs), encode_payload(frame.raw_data))
        # Its bytes are reserved with its first step's (one lock less per episode).
        self.episode = Episode(self.server, core.session_id, core.journal.episode_id, reset)

    def step_answered(self, call: Any, action: dict[str, Any], frame: Any,
                      started: float) -> None:
        """A step was answered: what was sent and received, as the caller got it."""
        ep = self.episode
        if ep is None:
            return  # no reset seen by this client (an attached session), or after done
        now = _perf()
        ids = None
        if self._tracing:
            ids = _span_ids()
            if ids is None and not ep.steps and self.first:
                # No span around this session's first step: tracing is off (no SDK, or
                # a hook of the user's own); the later steps skip the look-up.
                self._tracing = False
            self.first = False
        if call.answer is frame:  # the frames as on the wire: nothing serialised here
            sent, received = call.sent, call.received
            entry = (True, sent, received, started, now - started, self.retries,
                     self.recovered, ids)
        else:  # answered through recovery: the answer the caller gets, as text now
            sent, received = encode_payload(action), encode_payload(frame.raw_data)
            entry = (False, sent, received, started, now - started, self.retries,
                     self.recovered, ids)
        steps = ep.steps
        steps.append(entry)
        self.retries, self.recovered = 0, None
        size = ep.size = ep.size + len(sent) + len(received)
        if size > ep.reserved and not self._hold(ep):
            return
        if frame.raw_data.get("done"):
            self._finish("done")
        elif len(steps) >= self._part_steps or size >= self._part_bytes:
            self._next_part(ep)

    def step_failed(self, call: Any, action: dict[str, Any], core: Any) -> None:
        """A step raised: if its request may have reached the server unanswered, or the
        step raises :class:`~envlink.OutcomeUnknownError` (applied, its answer lost),
        its outcome is unknown (never recorded as applied); if the session lost the
        episode, the episode ends as ``lost``. Called while the step's error is being
        handled."""
        self.retries, self.recovered = 0, None
        ep = self.episode
        if ep is None:
            return
        if call.unanswered or isinstance(sys.exc_info()[1], OutcomeUnknownError):
            # An action that cannot be written is not what the step raises.
            with contextlib.suppress(Exception):
                text = encode_payload(action)
                ep.unknown.append((text, ep.first_index + len(ep.steps)))
                ep.size += len(text)
                if ep.size > ep.reserved and not self._hold(ep):
                    return
        if core.episode.value == _LOST:
            self._finish(_LOST)

    def close(self, wait: bool = True) -> None:
        """The client closed: the episode in progress ends as ``close``; then, unless
        ``wait`` is false, wait (bounded) until this tape's episodes are on disk."""
        if self.episode is not None:
            self._finish("close")
        kept = self.hand_over()
        if kept is not None:  # lost, and no rebuild took it
            self._last = self._sink.submit(kept) or self._last
        if wait and self._last:
            writer, last = writer_number()
            writer.wait(min(self._last, last), CLOSE_WAIT)

    def after_fork_in_child(self) -> None:
        """A forked child: the episode in progress is the parent's (which writes it)."""
        self.episode, self._last = None, 0

    def _hold(self, ep: Episode) -> bool:
        """Reserve bytes for ``ep``'s frames (doubling); past ``max_buffered_bytes`` the
        episode is dropped whole (counted, logged) and ``False`` returned."""
        more = max(ep.size - ep.reserved, ep.reserved, _FIRST_RESERVE)
        if self._sink.reserve(more):
            ep.reserved += more
            return True
        self.episode = None
        self._sink.dropped(ep, "more bytes are held for the disk than max_buffered_bytes")
        return False

    def _next_part(self, ep: Episode) -> None:
        """The steps so far go to the writer as one part; the episode goes on."""
        self.episode = ep.next_part()
        ep.outcome = "continued"
        ep.end = time.time()
        self._last = self._sink.submit(ep) or self._last

    def _finish(self, outcome: str) -> None:
        ep, self.episode = self.episode, None
        assert ep is not None
        ep.outcome = outcome
        ep.end = time.time()
        if self.keeping and outcome == _LOST:
            if self.kept is not None:
                self._last = self._sink.submit(self.kept) or self._last
            self.kept = ep  # written by close() unless a rebuild takes it
            return
        self._last = self._sink.submit(ep) or self._last

    # A pool that rebuilds a lost session on another server re-sends the episode
    # through a new client: the new session's tape continues the episode the old one
    # lost, so that it is recorded once (docs/recording.md, "Failover").

    def keep_lost(self) -> None:
        """From now on, an episode this session loses is kept for :meth:`hand_over`
        (written as ``lost`` by :meth:`close` if nothing takes it)."""
        self.keeping = True

    def hand_over(self) -> Episode | None:
        """The episode this session lost, kept by :meth:`keep_lost`, if any; this
        tape no longer writes it."""
        ep, self.kept = self.kept, None
        return ep

    def continue_episode(self, episode: Episode | None, mechanism: str = "replay") -> None:
        """This session has just rebuilt an episode (a reset and the re-sent steps).

        With ``episode`` (what the session that lost it handed over), the rebuild's
        reset and re-sent steps are dropped, not recorded twice, and ``episode`` goes
        on here; its step whose outcome the lost session never learned is the one
        re-sent next (no longer unknown). Without one (the first copy went with its
        process, as a dead Ray shard's), the rebuild's own steps are the record, each
        marked recovered by ``mechanism``. Either way, the next step answered is
        marked recovered by ``mechanism``.
        """
        if episode is not None:
            self._discard()
            after = episode.first_index + len(episode.steps)
            episode.unknown = [u for u in episode.unknown if u[1] != after]
            episode.outcome = ""
            self.episode = episode
        elif self.episode is not None:
            self.episode.steps[:] = [(*s[:6], mechanism, s[7])
                                     for s in self.episode.steps]
        self.retries, self.recovered = 0, mechanism

    def rebuild_failed(self, episode: Episode | None) -> None:
        """A rebuild that this session began failed: its reset and re-sent steps are
        dropped, and ``episode`` (handed over by the session that lost it) is written
        as ``lost``."""
        self._discard()
        if episode is not None:
            episode.outcome = _LOST
            self._last = self._sink.submit(episode) or self._last

    def restore_failed(self, journal: Any) -> None:
        """The rebuild of an episode that another process recorded (a dead Ray shard's,
        :meth:`continue_episode` without an episode) failed: its reset and re-sent steps
        are dropped (a diverged replay's answers are not what the caller got), and the
        episode is written once, as ``lost``, as the caller got it: the journal's reset
        and answered steps, its unanswered ones in ``unknown_steps``. Their times are
        not known here: each step starts when the rebuild failed, latency 0."""
        self._discard()
        self.retries, self.recovered = 0, None
        if journal.reset_response_json is None or journal.truncated \
                or len(journal.entries) != journal.steps_applied:
            # No reset answered, or steps the journal did not keep: a record of it
            # would not be the episode the caller got.
            return
        ep = Episode(self.server, None, journal.episode_id,
                     (False, encode_payload(journal.reset_kwargs), journal.reset_response_json))
        for entry in journal.entries:
            if entry.response_json is None:
                ep.unknown.append((entry.action_json, len(ep.steps)))
            else:
                ep.steps.append((False, entry.action_json, entry.response_json,
                                 ep.start_perf, 0.0, 0, None, None))
        ep.unknown += [(action, len(ep.steps)) for action in journal.unknown_steps]
        ep.outcome = _LOST
        ep.end = time.time()
        self._last = self._sink.submit(ep) or self._last

    def _discard(self) -> None:
        """Forget the episode in progress (a rebuild's copy): its bytes given back."""
        ep, self.episode = self.episode, None
        if ep is not None and not ep.settled:
            ep.settled = True
            self._sink.release(ep.reserved)
            ep.reserved = 0


class RecordingHook:
    """A client's hook, with a tape told of retried attempts and finished recoveries.

    Every other method is the wrapped hook's own bound method: a call that is neither
    retried nor recovered costs nothing more.
    """

    def __init__(self, inner: ClientHook, tape: Tape) -> None:
        self.inner = inner
        self.tape = tape
        self.first_attempt_phases = getattr(inner, "first_attempt_phases", True)
        self.call_started = inner.call_started
        self.call_finished = inner.call_finished
        self.phase_finished = inner.phase_finished
        self.message = inner.message

    def phase_started(self, phase: PhaseStarted) -> Any:
        kind = phase.phase
        if kind == "attempt":
            if phase.attempt > 1 and phase.method == "step":
                self.tape.retries += 1
        elif kind in ("resume", "replay"):
            self.tape.recovering = phase.method
        return self.inner.phase_started(phase)

    def event(self, event: ClientEvent) -> None:
        if event.name == HOOK_RECOVERY_FINISHED:
            tape = self.tape
            if event.fields.get("result") == "ok" and tape.recovering == "step":
                mechanism = event.fields.get("mechanism")
                tape.recovered = mechanism if isinstance(mechanism, str) else "unknown"
            tape.recovering = None
        self.inner.event(event)
