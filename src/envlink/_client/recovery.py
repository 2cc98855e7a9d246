"""Session recovery: ``raise``, ``replay`` and ``resume`` as strategies behind one interface.

When the connection is lost mid-episode, the session core names the mechanisms
that apply (:meth:`~envlink._sansio.session.SessionCore.recovery_plan`) and
:func:`recover` runs their strategies: it reports the loss, ends an abandoned server
session, runs the strategies in order, and on any failure leaves the episode marked lost
with its journal in the error. A strategy works with a :class:`RecoveryContext`: the
session's core, its connector (opening, counting steps, ending sessions, the retry
loop, phase reports) and the driver's one exchange. A new strategy (the stock-OpenEnv
resume) is a new class registered in :data:`STRATEGIES`, not a new branch in the
client.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol, TypeVar

from envlink._client.connector import Connector, DetachedSessionGone
from envlink._errors import (
    ConnectError,
    ConnectionLostError,
    EnvlinkError,
    OutcomeUnknownError,
    ReplayDivergedError,
    SessionGoneError,
    SessionLostError,
)
from envlink._events.client_events import ClientEvent, ClientHook, PhaseStarted
from envlink._sansio.journal import EpisodeJournal
from envlink._sansio.policies import RecoveryMechanism, idempotent_mcp
from envlink._sansio.protocol import ErrorFrame, ObservationFrame, server_error
from envlink._sansio.replay import RESET, JournalReplay, ReplayVerify
from envlink._sansio.retry import again
from envlink._sansio.session import Call, Decision, DropReason, Frame, SessionCore, describe
from envlink._transports.base import Connection
from envlink.names import (
    HOOK_RECOVERY_FINISHED,
    LOG_RECOVERY_FALLBACK,
    LOG_REPLAY_DIVERGED,
    LOG_SESSION_LOST,
    LOG_UNKNOWN_STEP_SETTLED,
)

__all__ = [
    "STRATEGIES",
    "Exchange",
    "OpenEnvResumeStrategy",
    "RaiseStrategy",
    "RecoveryContext",
    "RecoveryStrategy",
    "ReplayStrategy",
    "ResumeStrategy",
    "recover",
]

_T = TypeVar("_T")


class Exchange(Protocol):
    """One request, one answer, on one connection, no retry (the driver's ``exchange``)."""

    async def __call__(self, conn: Connection, method: str, data: dict[str, Any] | None,
                       request_id: str | None, *, call: Call | None = None) -> Frame:
        """Send ``method`` on ``conn`` and return its answer (``call``: the public call
        whose own request this is; it learns whether its request may be unanswered)."""
        ...


@dataclass(frozen=True)
class RecoveryContext:
    """What a recovery strategy works with, built by the driver for one recovery.

    Attributes:
        core: the session's state and decisions (journal, tokens, request ids).
        connector: the session's connection: opening it under the reconnect policy,
            letting it go, counting a session's steps, ending abandoned sessions,
            the retry loop of a recovery round and its phase reports.
        hook: where events are reported.
        exchange: the driver's one request-and-answer on a connection.
        replay_verify: compares a recorded answer with a replayed one.
    """

    core: SessionCore
    connector: Connector
    hook: ClientHook
    exchange: Exchange
    replay_verify: ReplayVerify


class RecoveryStrategy(Protocol):
    """One way to carry an episode over a lost connection."""

    #: The mechanism it implements.
    name: RecoveryMechanism

    async def recover(self, ctx: RecoveryContext, call: Call, data: dict[str, Any] | None,
                      request_id: str | None, cause: BaseException | None) -> Frame | None:
        """Rebuild the session and finish the interrupted call.

        Returns:
            the interrupted call's answer, or ``None`` when the strategy found it
            cannot apply after all (the error then names why).
        """
        ...


class RaiseStrategy:
    """``on_session_lost="raise"``: nothing to rebuild; the caller gets the journal."""

    name = RecoveryMechanism.RAISE

    async def recover(self, ctx: RecoveryContext, call: Call, data: dict[str, Any] | None,
                      request_id: str | None, cause: BaseException | None) -> Frame | None:
        return None


class ResumeStrategy:
    """``on_session_lost="resume"``: re-attach to the same server session by its token."""

    name = RecoveryMechanism.ENVLINK_RESUME

    async def recover(self, ctx: RecoveryContext, call: Call, data: dict[str, Any] | None,
                      request_id: str | None, cause: BaseException | None) -> Frame | None:
        core, method = ctx.core, call.method
        token = core.resume_token
        if token is None:
            return None
        # Same request id on every resend: if the server applied it before a drop,
        # its de-duplication answers from cache instead of applying it again.
        rid = request_id or core.next_request_id()

        async def round_(number: int) -> Frame | None:
            conn = await ctx.connector.open("recover", reason="resume", resume_token=token)
            if not conn.extensions.resumed:
                # The server no longer has the session: restarted without a session
                # store, or its resume grace window is over.
                raise _gone(ctx, "it restarted (a restarted envlink server without "
                                 "--session-store has lost every session)",
                            "its resume grace window is over, or it was ended")
            with _LostMeansAgain(ctx.connector):
                frame = await ctx.exchange(conn, method, data, rid, call=call)
            if core.journal.unknown_steps:
                await _settle_from_count(ctx, conn, call, frame)
            return frame

        return await _rounds(ctx, "resume", round_, lambda number: PhaseStarted(
            "resume", method, number, mechanism=self.name.value))


class OpenEnvResumeStrategy:
    """Resume on a stock OpenEnv 0.10 server: re-attach to its detached session.

    The session was created with ``openenv/session/create`` and is kept by the
    server across dropped sockets; re-attaching (``/ws?session_id=``) finds it as it
    was. The server keeps no answers, so a step whose outcome is unknown (its frame
    written, no answer read) is settled from the session's ``step_count`` (read on
    attaching) against the count before it: one more, it was applied and the call
    raises :class:`OutcomeUnknownError` with ``applied=True`` (its answer is lost);
    the same, it never was and is sent again. Never applied twice.
    """

    name = RecoveryMechanism.OPENENV_RESUME

    async def recover(self, ctx: RecoveryContext, call: Call, data: dict[str, Any] | None,
                      request_id: str | None, cause: BaseException | None) -> Frame | None:
        core, method = ctx.core, call.method
        if core.detached_id is None:
            return None
        journal = core.journal

        async def round_(number: int) -> Frame:
            conn, count = await _attach(ctx, reason="resume")
            # What may have reached the old socket unanswered: earlier steps cut by
            # a deadline, and this call's own request.
            own = call.unanswered and method in ("step", "mcp")
            if own and method == "step":
                journal.record_unknown(data or {}, None)
            if journal.unknown_steps:
                before, pending = journal.steps_applied, len(journal.unknown_steps)
                applied = None if count is None else journal.settle_applied(count)
                ctx.hook.event(ClientEvent(LOG_UNKNOWN_STEP_SETTLED, core.session_id, {
                    "applied": applied, "source": "step_count"}))
                if applied is None:
                    call.unanswered = False
                    raise OutcomeUnknownError(
                        f"the connection was lost after {method} was sent and the "
                        f"session's step_count ({count}) cannot settle it (the client "
                        f"counted {before} steps before it); it is not resent",
                        applied=None)
                # The server applies in order: the own step, last, was applied iff
                # every unknown step was.
                if own and method == "step" and applied == pending:
                    call.unanswered = False
                    if core.lost_answer_replayable:
                        raise _AnswerLost(count)  # "auto": replay answers it
                    raise OutcomeUnknownError(
                        "the connection was lost after step was sent; the step WAS "
                        f"applied (the session's step_count is {count}, which counts "
                        "it) but its answer was lost; it is not resent", applied=True)
            if own and method == "mcp" and not idempotent_mcp(method, data):
                call.unanswered = False
                raise OutcomeUnknownError(
                    "the connection was lost after an mcp tools/call was sent; a tool "
                    "call does not count as a step, so whether the server ran it "
                    "cannot be told; it is not resent", applied=None)
            with _LostMeansAgain(ctx.connector):
                return await ctx.exchange(conn, method, data, core.next_request_id(),
                                          call=call)

        return await _rounds(ctx, "resume", round_, lambda number: PhaseStarted(
            "resume", method, number, mechanism=self.name.value))


class _AnswerLost(Exception):
    """The interrupted step was applied on the resumed session, its answer lost, and
    the policy may replay (``auto``): :func:`recover` answers it by replay."""

    def __init__(self, count: int | None) -> None:
        super().__init__(count)
        self.count = count


async def _replay_lost_answer(ctx: RecoveryContext, call: Call, data: dict[str, Any] | None,
                              request_id: str | None, cause: BaseException | None,
                              lost: _AnswerLost) -> Frame:
    """Answer a step applied on the resumed session whose answer was lost: replay the
    episode on a fresh session (each earlier answer checked), send the step there, and
    end the old session. A replay that cannot be made or diverges leaves the client on
    the old session, the step applied, as resume alone does.

    Raises:
        OutcomeUnknownError: ``applied=True``, when the replay failed.
    """
    core, connector = ctx.core, ctx.connector
    core.replay_lost_answer()
    connector.drop(DropReason.DETACHED)  # the old session stays, to close or return to
    try:
        frame = await STRATEGIES[RecoveryMechanism.REPLAY].recover(
            ctx, call, data, request_id, cause)
        if frame is None:  # not replayable after all
            raise SessionLostError("the episode's journal cannot be replayed")
    except BaseException as exc:
        connector.drop(DropReason.DISTRUSTED)
        created = core.lost_answer_kept()
        if created is not None:
            connector.close_detached_later(created)
        call.unanswered = False
        if not isinstance(exc, Exception):
            raise
        with contextlib.suppress(EnvlinkError):
            await _attach(ctx, reason="resume")  # else the next call re-attaches
        raise OutcomeUnknownError(
            "the connection was lost after step was sent; the step WAS applied (the "
            f"session's step_count is {lost.count}, which counts it) but its answer was "
            f"lost, and replaying the episode to recover it failed ({type(exc).__name__}: "
            f"{exc}); it is not resent", applied=True) from exc
    old = core.lost_answer_replayed()
    if old is not None:
        connector.close_detached_later(old)
    return frame


async def _attach(ctx: RecoveryContext, *, reason: str) -> tuple[Connection, int | None]:
    """Re-attach to the client's OpenEnv detached session under the reconnect policy.

    Returns:
        the connection and the session's ``step_count`` read when attaching.

    Raises:
        SessionGoneError: the server no longer knows the session.
    """
    connector, core = ctx.connector, ctx.core
    try:
        conn = await connector.open("recover", reason=reason)
    except DetachedSessionGone as exc:
        core.on_detached_gone()
        raise _gone(ctx, "it restarted (a restarted OpenEnv server has lost every "
                         "session)",
                    "its idle reaper destroyed it (OpenEnv's session_timeout) or it was "
                    "closed (openenv/session/close); a stock OpenEnv server does not say "
                    "which") from exc
    return conn, connector.attached_count


def _gone(ctx: RecoveryContext, restarted: str, unknown: str) -> SessionGoneError:
    """The server was reached and no longer knows the session: ``server_restarted`` when
    it was unreachable first (``restarted`` says why), else ``session_unknown``."""
    journal = ctx.core.journal
    if ctx.connector.saw_unreachable:
        reason = "server_restarted"
        what = f"the server was unreachable, then no longer knew the session: {restarted}"
    else:
        reason = "session_unknown"
        what = f"the server no longer knows the session: {unknown}"
    return SessionGoneError(
        f"cannot resume the episode after {journal.step_count} steps: {what}",
        reason=reason, journal=journal.snapshot())


async def _rounds(ctx: RecoveryContext, operation: str,
                  body: Callable[[int], Awaitable[_T]],
                  phase: Callable[[int], PhaseStarted]) -> _T:
    """The recovery round: each try of ``body`` reported as its phase, under the
    retry loop of ``operation`` (a lost connection asks for another round)."""

    connector = ctx.connector

    async def round_(number: int) -> _T:
        with connector.report(phase(number)):
            return await body(number)

    return await connector.retry(operation).run(round_)


class _LostMeansAgain:
    """A connection lost inside the block is dropped and the round tried again."""

    __slots__ = ("_connector",)

    def __init__(self, connector: Connector) -> None:
        self._connector = connector

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if isinstance(exc, ConnectionLostError):
            self._connector.drop(DropReason.FAILED)
            raise again(exc) from None


class ReplayStrategy:
    """``on_session_lost="replay"``: a new session, the journal replayed and verified."""

    name = RecoveryMechanism.REPLAY

    async def recover(self, ctx: RecoveryContext, call: Call, data: dict[str, Any] | None,
                      request_id: str | None, cause: BaseException | None) -> Frame | None:
        core, method = ctx.core, call.method
        journal = core.journal
        if not journal.replayable:
            return None

        async def round_(number: int) -> Frame:
            conn = await ctx.connector.open("recover", reason="replay")
            with _LostMeansAgain(ctx.connector):
                await _replay(ctx, conn, journal)
                return await ctx.exchange(conn, method, data, core.next_request_id(),
                                          call=call)

        return await _rounds(ctx, "replay", round_, lambda number: PhaseStarted(
            "replay", method, number, replay_steps=journal.step_count,
            mechanism=self.name.value))


async def _replay(ctx: RecoveryContext, conn: Connection, journal: EpisodeJournal) -> None:
    """Reset a new session and resend the journal's steps, each answer checked."""
    core, exchange = ctx.core, ctx.exchange
    replay = JournalReplay(journal, ctx.replay_verify)

    def check(index: int, frame: Frame) -> None:
        answer = (server_error(frame) if isinstance(frame, ErrorFrame)
                  else frame.raw_data if isinstance(frame, ObservationFrame) else frame.data)
        try:
            replay.check(index, answer)
        except ReplayDivergedError:
            ctx.hook.event(ClientEvent(LOG_REPLAY_DIVERGED, core.session_id,
                                       {"index": index}))
            raise

    check(RESET, await exchange(conn, "reset", replay.reset_kwargs, core.next_request_id()))
    for index, entry in enumerate(replay.entries):
        check(index, await exchange(conn, "step", entry.action, core.next_request_id()))
    core.recovered()


async def _settle_from_count(ctx: RecoveryContext, conn: Connection, call: Call,
                             frame: Frame) -> None:
    """After a resume, settle steps of unknown outcome from the session's step count."""
    core = ctx.core
    # Until the call returns, a cut here leaves its own (applied) step unknown.
    call.unanswered = True
    with contextlib.suppress(EnvlinkError):
        count = await ctx.connector.count_steps(conn)
        # The count includes the call's own step if the server applied it.
        own = call.method == "step" and isinstance(frame, ObservationFrame)
        if core.settle_count(count, own_applied=own):
            ctx.hook.event(ClientEvent(LOG_UNKNOWN_STEP_SETTLED, core.session_id, {
                "applied": False, "source": "step_count"}))
    call.unanswered = False


#: The strategies by mechanism (what :meth:`SessionCore.recovery_plan` lists).
STRATEGIES: Mapping[RecoveryMechanism, RecoveryStrategy] = {
    s.name: s for s in (RaiseStrategy(), ReplayStrategy(), ResumeStrategy(),
                        OpenEnvResumeStrategy())
}


async def recover(ctx: RecoveryContext, decision: Decision, call: Call,
                  data: dict[str, Any] | None, request_id: str | None, *,
                  cause: BaseException | None, earlier: BaseException | None = None,
                  closed: BaseException | None = None,
                  strategies: Mapping[RecoveryMechanism, RecoveryStrategy] = STRATEGIES
                  ) -> Frame:
    """The session was lost mid-episode: carry out the core's decision, then finish the call.

    Args:
        decision: the core's ``RECOVER`` decision
            (:meth:`~envlink._sansio.session.SessionCore.lost_mid_episode`): the
            mechanism to report and the abandoned server sessions to end.
        cause: the failure during this call that lost the connection (``None``: it
            was gone before the call was sent).
        earlier: the failure of an earlier call that let the connection go (a
            deadline, an interrupt), named by the log line and by the error.
        closed: the error a connection that closed between calls ended with (``cause``
            is ``None``): the error's ``__cause__`` and the log line's ``error``.

    Raises:
        SessionLostError: the episode could not be carried on (with its journal);
            ``ReplayDivergedError`` when replay answered differently.
    """
    core, connector, hook, method = ctx.core, ctx.connector, ctx.hook, call.method
    policy = core.on_session_lost
    journal = core.journal
    mechanism = decision.strategy
    assert mechanism is not None, "recover() carries out a RECOVER decision"
    why = cause or closed
    error = str(why) if why else describe(earlier) if earlier else None
    if not decision.planned:  # an attach's resume is reported as a recovery, not a loss
        hook.event(ClientEvent(LOG_SESSION_LOST, core.session_id, {
            "method": method, "policy": policy.value, "steps": journal.step_count,
            "error": error, "mechanism": mechanism.value}))
    result = "failed"
    if decision.close_detached is not None:
        connector.close_detached_later(decision.close_detached)
    token = decision.release
    if token is not None:
        if decision.release_now:
            # Steps of unknown outcome are settled from the old session's own count
            # first, where it can tell (the session still exists and reports one).
            count = await connector.release(token, count_steps=decision.count_released)
            if core.settle_count(count):
                hook.event(ClientEvent(LOG_UNKNOWN_STEP_SETTLED, core.session_id, {
                    "applied": False, "source": "step_count"}))
        else:
            connector.release_later(token)
    # After the old session's count settled what it could (replay may apply now).
    plan = core.recovery_plan()
    try:
        try:
            frame = None
            for index, name in enumerate(plan):
                try:
                    frame = await strategies[name].recover(ctx, call, data, request_id, cause)
                except _AnswerLost as lost:
                    # "auto": resuming re-attached, but only replay can give the answer.
                    hook.event(ClientEvent(LOG_RECOVERY_FALLBACK, core.session_id, {
                        "mechanism": name.value, "next": RecoveryMechanism.REPLAY.value,
                        "reason": "answer_lost"}))
                    frame = await _replay_lost_answer(ctx, call, data, request_id, cause,
                                                      lost)
                    mechanism = RecoveryMechanism.REPLAY
                except SessionGoneError as exc:
                    if index + 1 == len(plan):
                        raise
                    # "auto": resuming is impossible, the next strategy rebuilds.
                    hook.event(ClientEvent(LOG_RECOVERY_FALLBACK, core.session_id, {
                        "mechanism": name.value, "next": plan[index + 1].value,
                        "reason": exc.reason}))
                    continue
                if frame is not None:
                    break
        except OutcomeUnknownError:
            raise  # the session is back; only the interrupted call's outcome is not
        except (ConnectError, ConnectionLostError) as exc:
            raise SessionLostError(
                f"connection lost mid-episode during {method}; {policy} recovery failed: "
                f"{exc}", journal=journal.snapshot(),
            ) from exc
        except SessionLostError:
            raise
        except EnvlinkError as exc:
            # A full server, a corrupt frame, a refused retry...: the episode is lost
            # all the same (below), and the caller is told so with its journal; the
            # reason stays the cause.
            raise SessionLostError(
                f"connection lost mid-episode during {method}; {policy} recovery failed "
                f"({type(exc).__name__}: {exc}); the episode cannot continue after "
                f"{journal.step_count} steps", journal=journal.snapshot(),
            ) from exc
        if frame is None:
            raise core.cannot_recover(method, cause, earlier) from why or earlier
        result = "ok"
        return frame
    except OutcomeUnknownError:
        # Re-attached to the same session: the episode goes on; the error says what
        # became of the interrupted call (and the journal follows the server).
        result = "ok"
        raise
    except BaseException as exc:
        if isinstance(exc, ReplayDivergedError):
            result = "diverged"
        # Whatever was half rebuilt is not the episode: never run a later call on it.
        connector.drop(DropReason.DISTRUSTED)
        core.recovery_failed()
        raise
    finally:
        # A loss under "raise" whose journal keeps its steps is rebuilt by the client's
        # owner (a replaying pool), which reports it: ``owner_recovers``.
        hook.event(ClientEvent(HOOK_RECOVERY_FINISHED, core.session_id, {
            "policy": policy.value, "result": result, "steps": journal.step_count,
            "mechanism": mechanism.value, "method": method, "error": error,
            "planned": decision.planned,
            "owner_recovers": (mechanism is RecoveryMechanism.RAISE
                               and journal.keep_steps)}))
