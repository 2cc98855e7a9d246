"""The sans-I/O session core: the state of one session and every decision about it.

In the manner of websockets' ``protocol.py``: no asyncio, no websockets, no
OpenTelemetry, and an injectable clock. What comes in:

- what the caller asks (:meth:`SessionCore.check_call`, :meth:`SessionCore.encode`);
- frames received (:meth:`SessionCore.receive`) and answers (:meth:`SessionCore.answered`);
- a connection opened (:meth:`SessionCore.on_connected`) or let go
  (:meth:`SessionCore.on_dropped`), a request lost with it, written or not
  (:meth:`SessionCore.after_failure`), an episode found without its connection
  (:meth:`SessionCore.lost_mid_episode`);
- a deadline expired (:meth:`SessionCore.deadline_expired`);
- what the server said of its OpenEnv detached sessions
  (:meth:`SessionCore.on_detached_created` and its siblings), a session moved in
  from another process (:meth:`SessionCore.restore`), a fork, and the caller's
  settings (:meth:`SessionCore.set_reconnect_policy` and its siblings).

The core's fields are read by the layers above and written only by the core itself,
through these inputs (a rule in ``tests/test_layering.py`` holds the asyncio layer
to it).

What goes out: the text to send, the frame for the caller, or a decision
(:class:`Preflight` before a send; :class:`Decision` after a failure: resend,
recover by which strategy, or fail with which typed error; the recovery plan of
:meth:`SessionCore.recovery_plan`). Each method's docstring says what the caller
must do next. The asyncio driver (:class:`~envlink._client.driver.SessionDriver`),
its connector and the recovery strategies do the I/O these decisions call for and
nothing else.
"""

from __future__ import annotations

import enum
import itertools
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from envlink._errors import (
    ConnectionLostError,
    EnvlinkError,
    OutcomeUnknownError,
    ProtocolError,
    SessionGoneError,
    SessionLostError,
)
from envlink._sansio.journal import EpisodeJournal, JournalEntry
from envlink._sansio.limits import DEFAULT_MAX_MESSAGE_VALUES
from envlink._sansio.policies import (
    ReconnectPolicy,
    RecoveryMechanism,
    RecoveryPolicy,
    SessionLostPolicy,
    idempotent_mcp,
)
from envlink._sansio.protocol import (
    EXTENSION_VERSION,
    ErrorFrame,
    Extensions,
    McpFrame,
    ObservationFrame,
    StateFrame,
    decode_response,
    encode_call,
)

__all__ = [
    "IDEMPOTENT",
    "Action",
    "Call",
    "Decision",
    "DropReason",
    "Dropped",
    "Episode",
    "Frame",
    "Link",
    "Preflight",
    "SessionCore",
    "describe",
]

Frame = ObservationFrame | StateFrame | ErrorFrame | McpFrame


def describe(error: BaseException) -> str:
    """``Type: message`` of an earlier failure, as a later error or log line names it."""
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


#: Methods that may be resent after a connection failure whatever happened to the
#: first request: reset starts the episode over, state only reads.
IDEMPOTENT = frozenset({"reset", "state"})


class Episode(enum.Enum):
    """Where the session's episode stands."""

    #: No episode: before the first reset, or after a disconnect.
    NONE = "none"
    #: An episode is running on the server session; the journal records it.
    ACTIVE = "active"
    #: The episode was lost and not recovered: step and state raise until reset().
    LOST = "lost"


class DropReason(enum.Enum):
    """Why a connection is let go: the one vocabulary for dropping one."""

    #: It failed (the peer went away, a send or read broke): counts towards flapping.
    FAILED = "failed"
    #: The client no longer trusts what it carries (a late answer may follow, the
    #: stream is out of step, a probe went unanswered, recovery half-built it).
    DISTRUSTED = "distrusted"
    #: It belongs to a parent process (after a fork) or to another event loop: let go
    #: without any I/O on it.
    INHERITED = "inherited"
    #: The session was handed to another process (``detach()``): let go without the
    #: protocol's close request, so the server keeps the session.
    DETACHED = "detached"


class Link(enum.Enum):
    """Where the session's connection stands."""

    #: No usable connection: the next call opens one (or recovers the episode).
    NONE = "none"
    #: Open and trusted.
    OPEN = "open"
    #: Open, but a call timed out on it (request ids made keeping it safe): the
    #: peer is health-checked before the next call uses it.
    SUSPECT = "suspect"


class Preflight(enum.Enum):
    """What to do before sending a request."""

    #: The connection is usable: send.
    SEND = "send"
    #: Health-check the suspect connection first (:meth:`SessionCore.probed`).
    PROBE = "probe"
    #: A reset on a suspect connection: drop it (and release its server session)
    #: rather than queue behind the old episode's late answer.
    REPLACE = "replace"
    #: No connection: open one.
    CONNECT = "connect"
    #: No connection, but the client still holds a server session (its resume token):
    #: open one that re-attaches to it, rather than a second session beside it.
    REATTACH = "reattach"
    #: No connection mid-episode: a new connection is a new server session, so the
    #: episode must be recovered under ``on_session_lost``.
    RECOVER = "recover"


class Action(enum.Enum):
    """What a failure leads to."""

    RESEND = "resend"
    RECOVER = "recover"
    FAIL = "fail"


@dataclass(frozen=True)
class Decision:
    """The core's answer to a failed exchange, or to an episode without its connection.

    Attributes:
        action: resend the request, recover the session, or fail.
        strategy: for ``RECOVER``, the mechanism that applies (``envlink-resume``,
            ``openenv-resume``, ``replay``, or ``raise`` when nothing can rebuild the
            episode), as the recovery reports it.
        error: for ``FAIL``, the error to raise instead of the original one
            (``None``: raise the original).
        release: for ``RECOVER``, the resume token of the server session the policy
            will not resume (the core has forgotten it): end that session, so that
            it holds no server slot for its grace window. A secret: never shown.
        release_now: end it before recovering (replay needs the slot right away),
            rather than in the background.
        count_released: read the released session's step count as it ends, and
            settle the journal's steps of unknown outcome from it
            (:meth:`SessionCore.settle_count`).
        close_detached: for ``RECOVER``, the OpenEnv detached session the policy will
            not resume (forgotten by the core): close it in the background. A
            capability: never shown.
        planned: for ``RECOVER``, the connection was let go on purpose (the session
            was detached, and this is the attach's resume): report the recovery, not
            a loss.
    """

    action: Action
    strategy: RecoveryMechanism | None = None
    error: EnvlinkError | None = None
    release: str | None = field(default=None, repr=False)
    release_now: bool = False
    count_released: bool = False
    close_detached: str | None = field(default=None, repr=False)
    planned: bool = False


class Dropped(NamedTuple):
    """A frame that answers an earlier request whose caller gave up: never delivered.

    Attributes:
        id: its request id.
        settled: if it answered a step of unknown outcome: ``True`` (it was
            applied: now in the journal) or ``False`` (an error: never applied);
            ``None`` otherwise.
    """

    id: str
    settled: bool | None = None


class Call:
    """What one public call's own request went through (for its error and journal)."""

    __slots__ = ("answer", "method", "queue_wait", "received", "request_id", "sent",
                 "step_index", "unanswered")

    def __init__(self, method: str) -> None:
        self.method = method
        self.queue_wait: float | None = None
        self.step_index: int | None = None
        #: The request frame may be on the wire and no answer to it was read.
        self.unanswered = False
        #: Its request id, when the connection uses them.
        self.request_id: str | None = None
        #: The answer returned to the call, with the frames as sent and received
        #: (the journal keeps those rather than serialising the payloads again).
        self.answer: Frame | None = None
        self.sent: str | bytes = ""
        self.received: str | bytes = ""


_RESEND = Decision(Action.RESEND)
_FAIL = Decision(Action.FAIL)


_RESUMING = (RecoveryPolicy.RESUME, RecoveryPolicy.AUTO)
_REPLAYING = (RecoveryPolicy.REPLAY, RecoveryPolicy.AUTO)


class SessionCore:
    """The protocol state of one client session, and every decision about it.

    One call goes: :meth:`check_call`, :meth:`preflight` (and what it asks for),
    :meth:`next_request_id` and :meth:`encode`, then :meth:`receive` for each frame
    read until the answer, then :meth:`answered`. A lost connection goes to
    :meth:`after_failure`, an expired deadline to :meth:`deadline_expired` and
    :meth:`interrupted`; a lost episode is carried on by the strategies of
    :meth:`recovery_plan`.

    Args:
        policy: the reconnect policy (``stable_after`` and ``max_attempts`` for
            flapping).
        on_session_lost: the recovery policy.
        max_journal_steps: bound on the steps recorded for replay.
        record_steps: whether the journal keeps each step (``None``: only where the
            recovery policy replays; see :attr:`record_steps`).
        production: OpenEnv's production mode (see the attribute).
        clock: monotonic seconds (injectable for tests).
        id_prefix: prefix of request ids (random by default).

    Attributes:
        journal: the current episode's journal.
        episode: the episode state.
        link: the connection state.
        extensions: what the current connection negotiated.
        session_id: the session's public id (the server's, else ours); never the
            resume token.
        resume_token: the secret token for resuming the server session, if offered.
        detached_id: the OpenEnv detached session held (a capability, never logged).
        detached_offered: whether the server offers detached sessions (``None``:
            not known yet).
        production: OpenEnv's production mode: tool calls go over ``POST /mcp`` to
            the detached session.
    """

    def __init__(
        self,
        *,
        policy: ReconnectPolicy,
        on_session_lost: SessionLostPolicy | RecoveryPolicy = "raise",
        max_journal_steps: int = 10_000,
        record_steps: bool | None = None,
        production: bool = False,
        clock: Callable[[], float] = time.monotonic,
        id_prefix: str | None = None,
    ) -> None:
        self.policy = policy
        self.on_session_lost = RecoveryPolicy(on_session_lost)
        #: Whether the journal keeps each step, set by the caller (``None``: per policy).
        self.record_steps_setting = record_steps
        self.clock = clock
        self.journal = EpisodeJournal(max_steps=max_journal_steps,
                                      keep_steps=self.record_steps)
        self.episode = Episode.NONE
        self.lost_journal: EpisodeJournal | None = None
        self.link = Link.NONE
        self.extensions = Extensions()
        self.session_id: str | None = None
        self.resume_token: str | None = None
        self.detached_id: str | None = None
        self.detached_offered: bool | None = None
        self.production = production
        #: Requests whose callers gave up while their answer may still come, by id.
        self.late: dict[str, tuple[str, dict[str, Any] | None]] = {}
        #: The failure that let the connection go mid-episode (a deadline, an interrupt,
        #: a corrupt frame), named by the error of the next call, which finds it gone.
        self.lost_by: BaseException | None = None
        #: Set by :meth:`restore`: the next loss decided is the attach's own resume.
        self.restored = False
        #: While a replay answers a step whose answer was lost: its journal entry and
        #: the detached session it was applied on (:meth:`replay_lost_answer`).
        self._answer_lost: tuple[JournalEntry, str | None, str | None] | None = None
        self._ids = itertools.count(1)
        self._id_prefix = id_prefix or uuid.uuid4().hex[:12]
        # Flapping: connections that die young continue one outage's attempt count.
        self._opened_at = 0.0
        self._dropped_at = 0.0
        self._short_lived = False
        self._flap_attempts = 0

    @property
    def record_steps(self) -> bool:
        """Whether the journal keeps each step's action and answer: what replay needs.

        By default only under ``replay`` and ``auto``; under ``raise`` and ``resume``
        nothing is kept per step (the journal counts them), so a long episode's
        memory does not grow. A caller that replays the journal itself (a pool
        rebuilding a lost episode elsewhere) sets it. A change applies from the next
        reset: a journal that did not keep an episode's first steps cannot replay it.
        """
        setting = self.record_steps_setting
        if setting is not None:
            return setting
        return self.on_session_lost in _REPLAYING

    # --------------------------------------------------------------- the settings

    def set_reconnect_policy(self, policy: ReconnectPolicy) -> None:
        """The caller changed the reconnect policy (its flapping bounds apply from now).

        After calling this method: open connections and retry under the same policy.
        """
        self.policy = policy

    def set_recovery_policy(self, policy: SessionLostPolicy | RecoveryPolicy) -> RecoveryPolicy:
        """The caller changed ``on_session_lost``: it decides the next loss.

        Returns:
            the policy as the core holds it.

        After calling this method: nothing; whether the journal keeps each step
        follows from the next reset (:attr:`record_steps`).

        Raises:
            ValueError: not a recovery policy.
        """
        self.on_session_lost = checked = RecoveryPolicy(policy)
        return checked

    def set_production(self, value: bool) -> None:
        """The caller switched OpenEnv's production mode (``use_production_mode``).

        After calling this method: nothing; the next connection opens accordingly
        (:attr:`production`).
        """
        self.production = value

    def set_record_steps(self, value: bool | None) -> None:
        """The caller decided whether the journal keeps each step (``None``: per policy).

        After calling this method: nothing; it applies from the next reset
        (:attr:`record_steps`).
        """
        self.record_steps_setting = value

    # ------------------------------------------------------------------ the caller

    def check_call(self, method: str) -> None:
        """Refuse a call the session cannot serve.

        After calling this method: call :meth:`preflight` before sending.

        Raises:
            SessionLostError: the episode was lost; only ``reset`` may start anew.
        """
        lost = self.lost_journal
        if self.episode is Episode.LOST and method != "reset" and lost is not None:
            raise SessionLostError(
                f"the episode was lost after {lost.step_count} steps and could not be "
                f"recovered; call reset() to start a new one before {method}()",
                journal=lost.snapshot(),
            )

    def next_request_id(self, *, always: bool = False) -> str | None:
        """A fresh request id if the connection negotiated ids (or ``always``), else ``None``.

        After calling this method: call :meth:`encode` with it, and pass it to
        :meth:`receive` for every frame read until the answer.
        """
        if not (always or self.extensions.version == EXTENSION_VERSION):  # .enabled
            return None
        return f"{self._id_prefix}-{next(self._ids)}"

    #: The text frame of a request (:func:`~envlink._sansio.protocol.encode_call`,
    #: the one way a request is written): envelope extensions (id, trace context) only
    #: with a request id, which exists only when the server negotiated them. After
    #: calling it: send the text, then read frames through :meth:`receive`. A plain
    #: function, so that calling it through the core costs no extra frame.
    encode = staticmethod(encode_call)

    def preflight(self, method: str, *, connection_open: bool) -> Preflight:
        """What to do before sending ``method``.

        After calling this method, for what it returns:

        - ``SEND``: send on the current connection.
        - ``PROBE``: health-check the connection and call :meth:`probed`.
        - ``REPLACE``: let the connection go (:meth:`on_dropped` with
          ``DISTRUSTED``), end its server session if :meth:`release_session` names
          one, then open a new connection.
        - ``CONNECT``: open a connection and call :meth:`on_connected`.
        - ``REATTACH``: open a connection presenting :attr:`resume_token` and call
          :meth:`on_connected`: the server resumes the session the token names, or
          opens a fresh one where it has none by that token (it refused that
          connection, at capacity for one, or the grace window is over).
        - ``RECOVER``: carry the episode on with the strategies of
          :meth:`recovery_plan`.
        """
        if self.link is Link.SUSPECT and connection_open:
            return Preflight.REPLACE if method == "reset" else Preflight.PROBE
        if self.link is Link.NONE or not connection_open:
            self.link = Link.NONE
            if self.episode is Episode.ACTIVE and method != "reset":
                return Preflight.RECOVER
            # A reset (or a call outside an episode) starts over on the session the
            # client holds: a new one beside it would leave the old one detached on
            # the server, holding a slot until its resume grace ends.
            return Preflight.CONNECT if self.resume_token is None else Preflight.REATTACH
        return Preflight.SEND

    def probed(self, alive: bool) -> None:
        """The health check of a suspect connection answered (or not).

        After calling this method: send if it was alive; else let the connection go
        (:meth:`on_dropped` with ``DISTRUSTED``) and call :meth:`preflight` again
        with ``connection_open=False``.
        """
        # Cleared only once the probe has really answered: a probe cut short by a
        # deadline leaves the connection suspect, so the next call probes it again.
        self.link = Link.OPEN if alive else Link.NONE

    # ------------------------------------------------------------------ frames in

    def receive(self, raw: str | bytes, request_id: str | None,
                max_size: int | None = None,
                max_values: int | None = DEFAULT_MAX_MESSAGE_VALUES) -> Frame | Dropped:
        """Decode a frame received while waiting for ``request_id``'s answer.

        Returns:
            the answer, or :class:`Dropped` for the late answer of an earlier,
            timed-out request (it is never delivered to this call).

        After calling this method: on :class:`Dropped`, read the next frame; on an
        answer of the wrong kind, call :meth:`unexpected_frame`; on any other
        answer (an error frame included), the exchange is over, and a successful
        one goes to :meth:`answered`. On ``ProtocolError`` call
        :meth:`protocol_error`; on ``ConnectionLostError`` treat the connection as
        lost (:meth:`after_failure`).

        Raises:
            ProtocolError: the frame is malformed (and could answer nothing late).
            ConnectionLostError: the frame may answer a timed-out request but cannot
                be attributed: the stream can no longer be trusted.
        """
        try:
            frame = decode_response(raw, max_size=max_size, max_values=max_values)
        except ProtocolError as exc:
            if self.late:
                raise self._unattributable(exc.reason) from exc
            raise
        if request_id is None or frame.id == request_id:
            return frame
        if frame.id is None:
            if self.late:
                raise self._unattributable("frame without request id")
            return frame  # an answer without id can only be ours
        return Dropped(frame.id, self.late_answer(frame))

    def late_answer(self, frame: Frame) -> bool | None:
        """The answer of a request whose caller gave up arrived: it settles that request.

        Returns:
            for a step of unknown outcome: whether it was applied (see :class:`Dropped`).
        """
        if frame.id is None:
            return None
        self.late.pop(frame.id, None)
        journal = self.journal
        if self.episode is not Episode.ACTIVE or not journal.unknown_steps:
            return None
        if isinstance(frame, ObservationFrame):
            return True if journal.settle(frame.id, frame.raw_data) else None
        if isinstance(frame, ErrorFrame):
            return False if journal.settle(frame.id, None) else None
        return None

    def interrupted(self, call: Call, data: dict[str, Any] | None) -> None:
        """A deadline or a cancellation cut ``call`` after its frame may have left.

        The server may have applied it: a step stays in the journal's unknown steps
        until the client learns its outcome; a reset may have started a new episode,
        so the old one cannot be carried on.

        After calling this method: let the cancellation or timeout propagate.
        """
        if not call.unanswered:
            return
        if call.method == "reset":
            self.lose_episode()
        elif call.method == "step" and self.episode is Episode.ACTIVE:
            self.journal.record_unknown(data or {}, call.request_id)

    def settle_count(self, count: int | None, *, own_applied: bool = False) -> bool:
        """Settle unknown steps from the server session's step count (resume, release).

        Args:
            count: the session's ``step_count``, if the server reported one.
            own_applied: the count includes the interrupted call's own step.

        Returns:
            whether unknown steps were settled (as not applied): report it.
        """
        if count is None or not self.journal.unknown_steps:
            return False
        return self.journal.settle_count(count - (1 if own_applied else 0))

    def _unattributable(self, reason: str) -> ConnectionLostError:
        # Handled like a lost connection: recovery (resume with the same request id,
        # which the server de-duplicates) finishes the current call safely.
        self.link = Link.NONE
        return ConnectionLostError(
            "a frame arrived that may answer an earlier, timed-out request "
            f"({reason}); the connection was dropped"
        )

    def unexpected_frame(self, frame: Frame, expected: type[Any], method: str) -> ProtocolError:
        """A valid frame of the wrong kind: on the plain protocol the stream is out of step.

        After calling this method: let the connection go (:meth:`on_dropped` with
        ``DISTRUSTED``) and raise the returned error.
        """
        self.link = Link.NONE
        return ProtocolError(f"expected a {expected.__name__} in answer to {method}, "
                             f"got a {frame.type!r} frame")

    def protocol_error(self) -> bool:
        """A malformed frame: whether the connection must be let go.

        Without request ids a bad frame leaves the stream's alignment unknown.

        After calling this method: if it returned ``True``, let the connection go
        (:meth:`on_dropped` with ``DISTRUSTED``); raise the ``ProtocolError`` either way.
        """
        if self.extensions.enabled:
            return False
        self.link = Link.NONE
        return True

    def answered(self, method: str, data: dict[str, Any] | None, frame: Frame,
                 *, episode_id: str | None = None, call: Call | None = None) -> None:
        """A request was answered (not with an error): follow it in the journal (from
        ``call``'s frames as sent and received when it holds ``frame``)."""
        if method == "reset" and isinstance(frame, ObservationFrame):
            self.journal.record_reset(data or {}, frame.raw_data, keep_steps=self.record_steps)
            self.journal.episode_id = episode_id or uuid.uuid4().hex
            self.episode = Episode.ACTIVE
            self.lost_journal = None
        elif method == "step" and isinstance(frame, ObservationFrame):
            if self.episode is Episode.ACTIVE:
                if call is not None and call.answer is frame:
                    self.journal.record_frames(call.sent, call.received)
                else:
                    self.journal.record_step(data or {}, frame.raw_data)
        elif method == "state" and isinstance(frame, StateFrame):
            found = frame.data.get("episode_id")
            if isinstance(found, str) and self.episode is Episode.ACTIVE:
                self.journal.episode_id = found

    # -------------------------------------------------------- deadlines and failures

    def deadline_expired(self, method: str, data: dict[str, Any] | None,
                         request_id: str | None, *, sent: bool,
                         abandoned: bool = False) -> bool:
        """A call's deadline (or a cancellation) interrupted it.

        Args:
            abandoned: the caller gave up on the call (a blocking caller was
                interrupted, e.g. by Ctrl-C): its late answer is not waited for,
                since the server answers in order and the next call would wait
                behind it; the connection goes, and recovery settles the step.

        Returns:
            whether the connection may be kept. Once the frame may be on the wire,
            its answer may still come: with a request id it will be recognised and
            dropped (the connection becomes suspect); without, it would be read by
            the next call, so the connection must go.

        After calling this method: if it returned ``False``, let the connection go
        (:meth:`on_dropped` with ``DISTRUSTED``); then call :meth:`interrupted` for
        the public call it cut.
        """
        if not sent:
            return True
        if self.extensions.enabled and request_id is not None and not abandoned:
            self.link = Link.SUSPECT
            self.late[request_id] = (method, data)
            return True
        self.link = Link.NONE
        return False

    def after_failure(self, method: str, exc: ConnectionLostError, *, written: bool,
                      data: dict[str, Any] | None = None) -> Decision:
        """The idempotency rules: what a lost connection during ``method`` leads to.

        Args:
            method: the interrupted method.
            exc: the failure.
            written: whether the request may have reached the server (``False``
                only when it provably never left).

        Before calling this method: let the connection go (:meth:`on_dropped` with
        ``FAILED``). After, for the decision's action: ``RESEND``, send again on a
        new connection under the retry policy; ``RECOVER``, recover as
        :meth:`lost_mid_episode` says; ``FAIL``, raise ``decision.error`` from the
        failure.
        """
        if method == "reset" and written:
            # The server may have started the new episode: the old one cannot go on,
            # whichever session the resent reset then reaches.
            self.lose_episode()
        if self.episode is Episode.ACTIVE and method != "reset":
            # A new connection is a new server session: only recovery continues the
            # episode (resume re-attaches with the same request id, de-duplicated).
            return self.lost_mid_episode()
        if not written or method in IDEMPOTENT or idempotent_mcp(method, data):
            return _RESEND
        return Decision(Action.FAIL, error=OutcomeUnknownError(
            f"connection lost after {method} was sent; the server may or may not "
            "have applied it, so it is not resent"
        ))

    def lost_mid_episode(self) -> Decision:
        """The episode's connection is gone and a call needs it: how to recover.

        The one place the policy is applied to a loss: the mechanism reported, and
        which server sessions the policy will not resume (forgotten here, named in
        the decision for the caller to end).

        Returns:
            a ``RECOVER`` decision.

        After calling this method: report the loss with ``decision.strategy``; close
        ``decision.close_detached`` in the background; end ``decision.release`` (at
        once when ``release_now``, reading its step count for :meth:`settle_count`
        when ``count_released``; else in the background); then run the strategies
        of :meth:`recovery_plan` in order (read after the settling, which may make
        the journal replayable).
        """
        strategy = self.mechanism
        planned, self.restored = self.restored, False
        resuming = self.on_session_lost in _RESUMING
        if resuming:
            return Decision(Action.RECOVER, strategy=strategy, planned=planned)
        # The server keeps an abandoned session for its grace window (an envlink one)
        # or until its reaper runs (an OpenEnv detached one): the caller ends them.
        detached, self.detached_id = self.detached_id, None
        token = self.release_session()
        replaying = self.on_session_lost is RecoveryPolicy.REPLAY
        return Decision(
            Action.RECOVER, strategy=strategy, release=token,
            release_now=replaying and token is not None,
            count_released=replaying and token is not None and bool(self.journal.unknown_steps),
            close_detached=detached, planned=planned)

    def call_failed(self, error: BaseException) -> None:
        """A call failed: if that let the connection go mid-episode, remember why.

        After calling this method: let the error propagate. The next call finds the
        connection gone and recovers; :meth:`take_lost_by` gives it this error to name.
        """
        if self.link is Link.NONE and self.episode is Episode.ACTIVE:
            self.lost_by = error

    def take_lost_by(self) -> BaseException | None:
        """The failure that let the connection go since the last call, once."""
        error, self.lost_by = self.lost_by, None
        return error

    def cannot_recover(self, method: str, cause: BaseException | None,
                       earlier: BaseException | None = None) -> SessionLostError:
        """The error for an episode that no strategy could carry on.

        Args:
            method: the call that found the session lost.
            cause: the failure during that call (``None``: the connection was gone
                before it was sent).
            earlier: the failure of an earlier call that let the connection go.

        After calling this method: call :meth:`recovery_failed` and raise the error
        from ``cause`` (or ``earlier``).
        """
        policy, journal = self.on_session_lost, self.journal
        since = "" if earlier is None else (
            f"; the connection was let go when an earlier call failed: {describe(earlier)}")
        if policy is RecoveryPolicy.REPLAY and journal.unknown_steps:
            return SessionLostError(
                "the session was lost and cannot be replayed faithfully: the journal "
                f"has {len(journal.unknown_steps)} step(s) of unknown outcome (sent, "
                "then cut by a deadline or a cancellation; the server may have "
                f"applied them), see journal.unknown_steps{since}",
                journal=journal.snapshot())
        if policy is RecoveryPolicy.REPLAY and not journal.replayable:
            why = (f"the journal exceeded max_journal_steps={journal.max_steps}"
                   if journal.keep_steps else
                   "the journal did not record this episode's steps (they are recorded "
                   "from the reset after on_session_lost becomes 'replay')")
            return SessionLostError(
                f"the session was lost and cannot be replayed: {why}{since}",
                journal=journal.snapshot())
        if policy in _RESUMING and self.resume_token is None and self.detached_id is None:
            more = ("" if policy is RecoveryPolicy.RESUME else
                    "; the journal cannot be replayed either")
            return SessionGoneError(
                f"connection lost mid-episode during {method}: the server does not offer session "
                f"resumption (neither envlink's extension nor OpenEnv detached sessions){more}; "
                f"the episode cannot continue after {journal.step_count} steps{since}",
                reason="resume_unsupported", journal=journal.snapshot())
        reason = ("the server no longer has the session" if policy in _RESUMING else
                  "on_session_lost='raise'")
        if method == "step" and cause is not None:
            reason += "; the outcome of the interrupted step is unknown"
        return SessionLostError(
            f"connection lost mid-episode during {method} ({reason}); the episode cannot "
            f"continue after {journal.step_count} steps{since}", journal=journal.snapshot())

    def recovery_failed(self) -> None:
        """Recovery failed: whatever was half rebuilt is not the episode.

        After calling this method: let the connection go (:meth:`on_dropped` with
        ``DISTRUSTED``) if it is still held; later calls raise until ``reset``.
        """
        self.link = Link.NONE
        self.episode = Episode.LOST
        self.lost_journal = self.journal.snapshot()

    def recovered(self) -> None:
        """Replay rebuilt the episode on a new server session."""
        self.episode = Episode.ACTIVE
        self.lost_journal = None

    @property
    def lost_answer_replayable(self) -> bool:
        """Whether a step applied on the resumed session, its answer lost, may be
        answered by replaying the episode on a fresh session (``auto``, with a journal
        that records the whole episode)."""
        return (self.on_session_lost is RecoveryPolicy.AUTO and self.journal.replayable
                and bool(self.journal.entries))

    def replay_lost_answer(self) -> None:
        """The interrupted step was applied on the resumed session and its answer lost
        (the journal's last entry, settled from the step count): replay will answer it.

        After calling this method: let the connection go, open a fresh session (the
        detached one is no longer held), replay the journal and send the step again;
        then :meth:`lost_answer_replayed` (and end the session it returns), or
        :meth:`lost_answer_kept` if the replay failed.
        """
        journal = self.journal
        entry = journal.entries.pop()
        journal.steps_applied -= 1
        self._answer_lost = (entry, self.detached_id, self.session_id)
        self.detached_id = None

    def lost_answer_replayed(self) -> str | None:
        """The replay answered the step: the old detached session to end (or ``None``)."""
        kept, self._answer_lost = self._answer_lost, None
        return None if kept is None else kept[1]

    def lost_answer_kept(self) -> str | None:
        """The replay failed: the journal and the detached session are as they were
        before :meth:`replay_lost_answer` (the step applied, its answer lost).

        Returns:
            the detached session the failed replay created, to end (or ``None``).

        After calling this method: re-attach to the old session (the next call does,
        if this cannot) and report the step's outcome as applied.
        """
        kept, self._answer_lost = self._answer_lost, None
        created = self.detached_id
        if kept is not None:
            entry, self.detached_id, self.session_id = kept
            self.journal.entries.append(entry)
            self.journal.steps_applied += 1
            # The old session still holds the episode (the fresh one lost it).
            self.episode, self.lost_journal = Episode.ACTIVE, None
        return created

    def lose_episode(self) -> None:
        """The episode cannot go on: later step/state calls raise until reset()."""
        if self.episode is Episode.ACTIVE:
            self.lost_journal = self.journal.snapshot()
            self.episode = Episode.LOST

    # -------------------------------------------------------------------- the link

    def on_connected(self, extensions: Extensions, *, reattached: bool = False) -> None:
        """A connection opened: fresh, re-attached by token, or ``reattached`` to the
        OpenEnv detached session the client already held (the same server session).

        After calling this method: the connection is trusted; a fresh server session
        in mid-episode has lost the episode, which only replay rebuilds.
        """
        self.link = Link.OPEN
        self.extensions = extensions
        self.late.clear()
        self.lost_by = None
        self._opened_at = self.clock()
        if self.episode is Episode.ACTIVE and not extensions.resumed and not reattached:
            # A fresh server session cannot carry on this episode; replay rebuilds it
            # (and says so), anything else must not run on it unnoticed.
            self.lose_episode()
        # The resume token is a secret: telemetry gets the server's public id, or ours.
        if not (reattached and self.session_id is not None):
            self.session_id = extensions.session_id or uuid.uuid4().hex[:16]
        self.resume_token = extensions.session_token if extensions.can_resume else None

    def on_dropped(self, reason: DropReason) -> None:
        """The connection was let go. A failure is remembered with whether the
        connection had been stable (flapping); the client's own drops are not.

        ``DETACHED``: the session was handed to another process, which now holds what
        would end or resume it; the core forgets its resume token and detached session.

        After calling this method: close or abort the connection as ``reason`` says
        (the connector's ``drop``); the next call finds no connection.
        """
        self.link = Link.NONE
        if reason is not DropReason.FAILED:
            if reason is DropReason.DETACHED:
                self.resume_token = self.detached_id = None
            return
        self._dropped_at = self.clock()
        if self._dropped_at - self._opened_at < self.policy.stable_after:
            # Flapping: the next outage continues this one's attempt count.
            self._short_lived = True
        else:
            self._short_lived = False
            self._flap_attempts = 0

    def release_session(self) -> str | None:
        """The client gives up the server session it holds (to start afresh, or for a
        recovery that does not resume it).

        Returns:
            its resume token, now forgotten; ``None`` if it holds none.

        After calling this method: end the session the token names (the connector's
        ``release``) so that it does not hold a server slot for its grace window.
        """
        token, self.resume_token = self.resume_token, None
        return token

    def on_forked(self) -> None:
        """This process is a fork of the one that held the session: the parent keeps
        the episode and its server session.

        After calling this method: forget the parent's connection without any I/O on
        it (:meth:`on_dropped` with ``INHERITED``); the child starts afresh, its
        episode lost until it resets.
        """
        self.lose_episode()
        self.resume_token = None

    def restore(self, journal: EpisodeJournal, *, session_id: str | None,
                resume_token: str | None, detached_id: str | None) -> None:
        """A session held elsewhere (a detached session's handle) becomes this one:
        its episode in progress, its connection lost.

        Args:
            journal: the episode's journal (the core keeps it: pass a copy).
            session_id: the session's public id.
            resume_token: envlink's resume token for it, if the server offered one.
            detached_id: the OpenEnv detached session, if that is how it resumes.

        After calling this method: make a call; it finds no connection mid-episode
        (:meth:`preflight` says ``RECOVER``) and resumes the session under the
        recovery policy.
        """
        self.journal = journal
        self.episode = Episode.ACTIVE
        self.lost_journal = None
        self.link = Link.NONE
        self.session_id = session_id
        self.resume_token = resume_token
        self.detached_id = detached_id
        self.restored = True

    def on_closed(self) -> None:
        """The client ended the session (disconnect, close, or a forked child)."""
        self.link = Link.NONE
        self.episode = Episode.NONE
        self.lost_journal = None
        self.resume_token = None
        self.detached_id = None

    def connect_attempts_used(self, where: str) -> int:
        """Connection attempts this outage has already used (a flapping connection).

        Call this method before opening a connection, and :meth:`connects_made`
        once it opened.

        Raises:
            ConnectionLostError: the connection keeps dropping: reported once, the
                next call starts a new outage.
        """
        if self._short_lived and self.clock() - self._dropped_at > self.policy.stable_after:
            # Quiet for long enough since the last drop: that outage is over.
            self._short_lived = False
            self._flap_attempts = 0
        used = self._flap_attempts if self._short_lived else 0
        if used >= self.policy.max_attempts:
            self._short_lived = False
            self._flap_attempts = 0
            raise ConnectionLostError(
                f"the connection to {where} keeps dropping: {used} reconnects "
                f"without a connection lasting {self.policy.stable_after:g} s"
            )
        return used

    def connects_made(self, tries: int) -> None:
        """A connection opened after ``tries`` attempts."""
        if self._short_lived:
            self._flap_attempts += tries

    # -------------------------------------------------------------------- recovery

    @property
    def wants_detached(self) -> bool:
        """Whether to hold the session as an OpenEnv detached session (to resume it,
        or to reach it over ``POST /mcp`` in production mode).

        Read it before opening a connection: when ``True``, create the detached
        session (then call :meth:`on_detached_created` or
        :meth:`on_detached_unavailable`) or re-attach to the one held.
        """
        return (self.production or self.on_session_lost in _RESUMING) and (
            self.detached_offered is not False)

    def on_detached_created(self, detached_id: str) -> None:
        """The server created an OpenEnv detached session for this client.

        After calling this method: open the connection attached to it
        (``/ws?session_id=``); :attr:`detached_id` holds it from now on.
        """
        self.detached_id = detached_id
        self.detached_offered = True

    def on_detached_unavailable(self) -> None:
        """The server offers no detached sessions (an older or a non-OpenEnv server).

        After calling this method: open a plain connection; :attr:`wants_detached`
        is ``False`` from now on.
        """
        self.detached_offered = False

    def on_detached_gone(self) -> None:
        """The server no longer has the detached session the client held.

        After calling this method: a call outside an episode opens a new session
        (:attr:`wants_detached` creates another); a recovery reports the session gone.
        """
        self.detached_id = None

    def recovery_plan(self) -> list[RecoveryMechanism]:
        """The mechanisms to try now, in order: ``resume``/``auto`` use envlink's token,
        else an OpenEnv detached session; ``auto`` then ``replay``. Empty: none applies.

        After calling this method: run the strategies in order until one finishes
        the interrupted call. If none does, raise :meth:`cannot_recover`; if one
        fails, call :meth:`recovery_failed` and raise.
        """
        policy = self.on_session_lost
        plan: list[RecoveryMechanism] = []
        if policy in _RESUMING:
            if self.resume_token is not None:
                plan.append(RecoveryMechanism.ENVLINK_RESUME)
            elif self.detached_id is not None:
                plan.append(RecoveryMechanism.OPENENV_RESUME)
        if policy in _REPLAYING and self.journal.replayable:
            plan.append(RecoveryMechanism.REPLAY)
        return plan

    @property
    def mechanism(self) -> RecoveryMechanism:
        """How a lost session would be recovered now (``client.recovery``): the first of
        :meth:`recovery_plan`, ``raise`` when none applies."""
        plan = self.recovery_plan()
        return plan[0] if plan else RecoveryMechanism.RAISE
