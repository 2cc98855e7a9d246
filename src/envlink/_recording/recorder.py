"""``RolloutRecorder``: every episode a client runs, recorded as the caller got it.

A recorder is given to a client (``recorder=``) or in a ``ClientConfig``. Each client
it is given to makes a :class:`Tape` of its own: the client tells it, where it
hands the caller an answer (after reconnects, resume, replay, the server's
de-duplication), what the reset or the step sent and received; the tape appends one
small tuple per step (the frames as they were on the wire, not serialised) and, when
the episode ends (``done``, a new reset, ``close()``, a lost session), hands it to the
process's writer thread (:mod:`envlink._recording.writer`).

Retries and recovery are seen through the client's hook: the tape wraps the client's
hook, intercepting only the phases and events that say a step was retried or answered
through recovery (not on the path of a call that is neither). A retry or a recovery
of another call (``state()``, an MCP call) is not a step's.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

from opentelemetry import trace

from envlink._config import check_count
from envlink._events.client_events import ClientEvent, ClientHook, PhaseStarted
from envlink._recording.writer import Episode, Sink
from envlink._sansio.journal import encode_payload
from envlink.names import HOOK_RECOVERY_FINISHED

__all__ = ["RecordingHook", "RolloutRecorder", "Tape"]

_perf = time.perf_counter
_get_current_span = trace.get_current_span
_LOST = "lost"


class RolloutRecorder:
    """Records every episode of the clients it is given to, as ``*.jsonl`` files.

    One JSON object per episode per line (``docs/recording.md``), written by a
    background thread: a step costs its client one small tuple appended to a list,
    never a wait for the disk. An episode is on disk within a second of its end;
    :meth:`flush`, :meth:`close` and the context manager wait for the rest.

    Picklable as its settings: a ``ClientConfig`` that carries one crosses to Ray
    workers and subprocesses, and each process writes files of its own (its pid and
    a random part in their names) into the same directory.

    Args:
        directory: where the files go (made when the first episode is written).
        redact: applied to every action and observation before it is written (on the
            writer thread); returns what to write instead. Headers and tokens are
            never recorded.
        max_file_bytes: a file is closed and the next begun past this size.
        max_buffered_steps: bound on the steps of finished episodes waiting for the
            disk; past it an episode is dropped whole, counted and logged.
        max_episode_steps: an episode longer than this is dropped whole (counted)
            rather than held in memory.
        prefix: the files' name prefix.

    Raises:
        TypeError: ``redact`` is not callable, or a bound is not a whole number.
        ValueError: a bound below 1.
    """

    def __init__(self, directory: str | os.PathLike[str], *,
                 redact: Callable[[Any], Any] | None = None,
                 max_file_bytes: int = 64 * 1024 * 1024,
                 max_buffered_steps: int = 1_000_000,
                 max_episode_steps: int = 100_000,
                 prefix: str = "rollouts") -> None:
        if redact is not None and not callable(redact):
            raise TypeError(f"redact must be callable or None, got {type(redact).__name__}")
        if not isinstance(prefix, str) or not prefix or "/" in prefix or os.sep in prefix:
            raise ValueError(f"prefix must be a file name part, got {prefix!r}")
        self.directory = Path(directory)
        self.redact = redact
        self.max_file_bytes = check_count(max_file_bytes, "max_file_bytes", minimum=1)
        self.max_buffered_steps = check_count(max_buffered_steps, "max_buffered_steps",
                                              minimum=1)
        self.max_episode_steps = check_count(max_episode_steps, "max_episode_steps",
                                             minimum=1)
        self.prefix = prefix
        self._sink: Sink | None = None

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (str(self.directory), self.redact, self.max_file_bytes,
                           self.max_buffered_steps, self.max_episode_steps, self.prefix))

    def __repr__(self) -> str:
        return f"RolloutRecorder({str(self.directory)!r})"

    @property
    def sink(self) -> Sink:
        """This process's files of the recorder."""
        sink = self._sink
        if sink is None:
            sink = self._sink = Sink(self.directory, self.prefix, self.max_file_bytes,
                                     self.max_buffered_steps, self.redact)
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
        """Episodes and steps written and dropped so far by this process."""
        return dict(self.sink.counts)

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
             max_buffered_steps: int, max_episode_steps: int,
             prefix: str) -> RolloutRecorder:
    return RolloutRecorder(directory, redact=redact, max_file_bytes=max_file_bytes,
                           max_buffered_steps=max_buffered_steps,
                           max_episode_steps=max_episode_steps, prefix=prefix)


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

    __slots__ = ("_limit", "_sink", "_tracing", "episode", "first", "lost", "recovered",
                 "recovering", "retries", "server")

    def __init__(self, recorder: RolloutRecorder, server: str, tracing: bool) -> None:
        self._sink = recorder.sink
        self._limit = recorder.max_episode_steps
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
        framed = call.answer is frame
        answer = call.received if framed else encode_payload(frame.raw_data)
        self.episode = Episode(self.server, core.session_id, core.journal.episode_id,
                               encode_payload(kwargs), answer, framed)

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
            entry = (True, call.sent, call.received, started, now - started, self.retries,
                     self.recovered, ids)
        else:  # answered through recovery: the answer the caller gets, as text now
            entry = (False, encode_payload(action), encode_payload(frame.raw_data), started,
                     now - started, self.retries, self.recovered, ids)
        steps = ep.steps
        steps.append(entry)
        self.retries, self.recovered = 0, None
        if len(steps) > self._limit:
            ep.truncated = True  # dropped whole (counted) rather than held
            self._finish(_LOST)
        elif frame.raw_data.get("done"):
            self._finish("done")

    def step_failed(self, call: Any, action: dict[str, Any], core: Any) -> None:
        """A step raised: if its request may have reached the server unanswered, its
        outcome is unknown (never recorded as applied); if the session lost the
        episode, the episode ends as ``lost``."""
        self.retries, self.recovered = 0, None
        ep = self.episode
        if ep is None:
            return
        if call.unanswered:
            # An action that cannot be written is not what the step raises.
            with contextlib.suppress(Exception):
                ep.unknown.append((encode_payload(action), len(ep.steps)))
        if core.episode.value == _LOST:
            self._finish(_LOST)

    def close(self) -> None:
        """The client closed: the episode in progress ends as ``close``."""
        if self.episode is not None:
            self._finish("close")

    def _finish(self, outcome: str) -> None:
        ep, self.episode = self.episode, None
        assert ep is not None
        ep.outcome = outcome
        ep.end = time.time()
        self._sink.submit(ep)


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
