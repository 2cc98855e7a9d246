"""The asyncio driver of a session: it runs calls and does the I/O the core decides.

One call: the client-closed check, the caller's deadline, the FIFO queue (one
request in flight per session), then :meth:`SessionDriver.request`: ask the core
what to do before sending (:class:`~envlink._sansio.session.Preflight`), send, read
frames through the core, and on a lost connection (or an episode found without
one) follow the core's :class:`~envlink._sansio.session.Decision` (resend through
the one retry primitive, recover through :mod:`envlink._client.recovery`, or fail).
Everything it observes goes to the client's hook; it logs and measures nothing itself.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from envlink._bridge import was_abandoned
from envlink._client.capacity import CapacityGate
from envlink._client.connector import Connector
from envlink._client.propagation import trace_carrier
from envlink._client.recovery import RecoveryContext, recover
from envlink._config import ConnectionOptions, Timeout
from envlink._deadlines import bounded, deadline
from envlink._errors import (
    CallTimeoutError,
    ClientClosedError,
    ConnectionLostError,
    EnvlinkError,
    ProtocolError,
    shorten,
)
from envlink._events.client_events import (
    CallFinished,
    CallStarted,
    ClientEvent,
    ClientHook,
    PhaseFinished,
    PhaseStarted,
)
from envlink._sansio.journal import EpisodeJournal
from envlink._sansio.protocol import (
    ErrorFrame,
    McpFrame,
    ObservationFrame,
    StateFrame,
    decode_response,
    server_error,
)
from envlink._sansio.retry import again, succeeded
from envlink._sansio.session import (
    Action,
    Call,
    Dropped,
    DropReason,
    Episode,
    Frame,
    Link,
    Preflight,
    SessionCore,
)
from envlink._speedups import (
    lock_fast_path,
    lock_turns,
    new_record,
    running_loop_getter,
    task_of_loop_getter,
)
from envlink._transports.base import Connection, NotWrittenError
from envlink.names import (
    LOG_CLIENT_CLOSED,
    LOG_PEER_UNRESPONSIVE,
    LOG_STALE_ANSWER_DROPPED,
    LOG_UNATTRIBUTABLE_FRAME,
    LOG_UNKNOWN_STEP_SETTLED,
    OUTCOME_CANCELLED,
    OUTCOME_ERROR,
    OUTCOME_OK,
    OUTCOME_TIMEOUT,
)

__all__ = ["SessionDriver", "end_turn", "take_turn", "wait_turn"]

_get_running_loop = running_loop_getter()
_task_of = task_of_loop_getter()
_FREE_LOCKS = lock_fast_path()
_take_free_lock, _give_lock = lock_turns()
_record = new_record
_getpid = os.getpid
_perf = time.perf_counter

_R = TypeVar("_R")
_F = TypeVar("_F", ObservationFrame, StateFrame, McpFrame)


class _Lifecycle(enum.Enum):
    OPEN = "open"
    #: close() was called; the next call opens the client again.
    CLOSED = "closed"
    #: close(final=True) was called: every later call is refused.
    FINAL = "final"


_OPEN = _Lifecycle.OPEN
_CLOSED = _Lifecycle.CLOSED


class SessionDriver:
    """Runs one session's calls on an event loop around a :class:`SessionCore`.

    Args:
        core: the session's state and decisions.
        connector: the session's connection.
        hook: where calls, phases and events are reported.
        options: connection options (the frame size limit).
        timeouts: the client's deadlines (``probe``).
        replay_verify: compares a recorded answer with a replayed one.
    """

    def __init__(self, core: SessionCore, connector: Connector, hook: ClientHook,
                 options: ConnectionOptions, timeouts: Timeout,
                 replay_verify: Callable[[dict[str, Any], dict[str, Any]], bool]) -> None:
        self.core = core
        self.connector = connector
        self.hook = hook
        self._first_phases = bool(getattr(hook, "first_attempt_phases", True))
        self.options = options
        self.timeouts = timeouts
        self.replay_verify = replay_verify
        self.lifecycle = _Lifecycle.OPEN
        self._pid = os.getpid()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock: asyncio.Lock | None = None
        #: The task of the call in flight, cancelled by close().
        self.active: asyncio.Task[Any] | None = None
        #: The client's share of the process's session limit (None: not counted).
        self.capacity: CapacityGate | None = None

    @property
    def closed(self) -> bool:
        """Whether the client was closed, and no call has opened it again since."""
        return self.lifecycle is not _OPEN

    def reopen(self) -> None:
        """A call on a closed client: open it again, as OpenEnv's client does after
        ``close()`` (the call then opens a new connection).

        Raises:
            ClientClosedError: the client was closed with ``close(final=True)``.
        """
        self.check_reopen()
        self.lifecycle = _OPEN

    def check_reopen(self) -> None:
        """Whether a call may open the client again (:meth:`reopen`).

        Raises:
            ClientClosedError: the client was closed with ``close(final=True)``.
        """
        if self.lifecycle is _Lifecycle.FINAL:
            raise ClientClosedError(
                "the client is closed for good: its close(final=True) was called; "
                "create a new client")

    def make_final(self) -> None:
        """``close(final=True)`` on a closed client: refuse every later call."""
        self.lifecycle = _Lifecycle.FINAL

    # -------------------------------------------------------------------- calls

    async def call(self, method: str, seconds: float | None,
                   run: Callable[[Call], Awaitable[_R]]) -> _R:
        """Run one public call: its hooks, its deadline, its turn in the queue."""
        if self.lifecycle is not _OPEN:
            self.reopen()
        core, endpoint = self.core, self.connector.endpoint
        call = Call(method)
        hook = self.hook
        # The records are built from their fields' tuple (no NamedTuple __new__ frame).
        token = hook.call_started(_record(CallStarted, (
            method, endpoint.host, endpoint.port, core.session_id,
            core.journal.episode_id if core.episode is Episode.ACTIVE else None)))
        start = _perf()
        error: BaseException | None = None
        try:
            try:
                try:
                    # The deadline's own start and finish, without a coroutine to enter or
                    # leave (``async with deadline(...)`` calls the same two).
                    timer = deadline(seconds, method)
                    timer.start()
                    try:
                        gate = self.capacity
                        if gate is None or gate.passes(method):
                            result = await run(call)
                        else:
                            result = await gate.call(method, seconds, lambda: run(call))
                    except BaseException as exc:
                        timer.finish(exc)
                        raise
                    timer.finish(None)
                    return result
                except asyncio.CancelledError as exc:
                    if self.lifecycle is not _OPEN:
                        raise ClientClosedError(
                            f"the client's close() was called during {method}") from exc
                    raise
                except CallTimeoutError as exc:
                    if call.unanswered:
                        exc.outcome_unknown = True
                        exc.args = (f"{exc.args[0]}; the request was sent, so the server "
                                    "may or may not have applied it (see "
                                    "journal.unknown_steps)",)
                    raise
            except BaseException as exc:
                error = exc
                core.call_failed(exc)
                if not isinstance(exc, EnvlinkError):
                    raise
            # Raised outside the handler, so that the traceback is the shortened one on
            # every Python: the retry loop's and the driver's frames say nothing.
            raise shorten(error)
        finally:
            outcome = OUTCOME_OK if error is None else (
                OUTCOME_TIMEOUT if isinstance(error, CallTimeoutError) else
                OUTCOME_CANCELLED if isinstance(error, asyncio.CancelledError) else OUTCOME_ERROR)
            hook.call_finished(_record(CallFinished, (
                method, outcome, _perf() - start, error, call.queue_wait,
                call.step_index, core.session_id, endpoint.host, endpoint.port)), token)

    def drop_if_inherited(self) -> None:
        """In a forked child, forget the parent's connection without any I/O on it.

        The socket is shared with the parent: a close frame or even a shutdown from
        the child would end the parent's session. The child starts afresh instead.
        """
        if self._pid != os.getpid():
            self._pid = os.getpid()
            self.connector.drop(DropReason.INHERITED)
            self._loop = None
            self._lock = None
            self.active = None
            self.core.on_forked()

    def serves_live_loop(self) -> bool:
        """Whether the client is connected on an event loop that is still open."""
        loop = self._loop
        return loop is not None and not loop.is_closed() and self.connector.is_open

    def _bind_loop(self, loop: asyncio.AbstractEventLoop) -> asyncio.Lock:
        self.drop_if_inherited()
        if self._loop is not loop or self._lock is None:
            if (self._loop is not None and not self._loop.is_closed()
                    and self.connector.is_open):
                raise EnvlinkError(
                    "this client has an open connection on another event loop; use one "
                    "client per loop (or client.sync() from threads)"
                )
            self._loop = loop
            self._lock = asyncio.Lock()
            # The previous loop's connection and tasks are not ours.
            self.connector.drop(DropReason.INHERITED)
            self.core.lose_episode()
        return self._lock

    def restore(self, journal: EpisodeJournal, *, session_id: str | None,
                resume_token: str | None, detached_id: str | None) -> None:
        """Give the session an episode held elsewhere (``attach()``), its connection lost.

        Call it on the event loop the session will run on, before its first call:
        binding to a loop later would lose the episode. After calling this method:
        make a call; it resumes the session (:meth:`SessionCore.restore`).
        """
        self._bind_loop(asyncio.get_running_loop())
        self.core.restore(journal, session_id=session_id, resume_token=resume_token,
                          detached_id=detached_id)

    async def hand_off(self, seconds: float | None) -> None:
        """Let the connection go without the protocol's close request, so the server
        keeps the session for whoever holds its handle (``detach()``).

        Call it in the session's turn, once the handle holds the session's resume
        secrets: the core forgets them. After calling this method: close the client.
        """
        connector = self.connector
        conn, connector.conn = connector.conn, None
        self.core.on_dropped(DropReason.DETACHED)
        if conn is not None:
            await conn.close(seconds)

    async def close(self, seconds: float | None, *, final: bool = False) -> None:
        """Close: cancel the call in flight, end the session, bounded.

        After calling this method: the next call opens the client again
        (:meth:`reopen`), unless ``final``.
        """
        self.drop_if_inherited()
        self.lifecycle = _Lifecycle.FINAL if final else _CLOSED
        active = self.active
        if active is not None and not active.done() and active is not asyncio.current_task():
            active.cancel()
            # asyncio.wait raises nothing of the task's; a cancellation of the closer
            # itself is passed on.
            await asyncio.wait({active}, timeout=seconds)
        await self.connector.wait_background(seconds)
        try:
            with self.connector.report(PhaseStarted("close", "close")):
                await self.connector.close(graceful=True, timeout=seconds)
        finally:
            if self.capacity is not None:
                self.capacity.release()
        self.hook.event(ClientEvent(LOG_CLIENT_CLOSED, self.core.session_id, {}))

    # ------------------------------------------------------------------ requests

    async def request(self, call: Call, data: dict[str, Any] | None) -> Frame:
        """Send the call's request and return its answer, reconnecting or recovering."""
        core = self.core
        core.check_call(call.method)
        call.request_id = None  # a new request (a capacity wait may make the call again)
        try:
            # The first try is made here; the retry loop is built only once it failed.
            start = core.clock()
            try:
                result = await self.attempt(call, data, 1)
            except BaseException as exc:
                first = exc
            else:
                return succeeded(self.connector.policy, result)
            return await self.connector.retry("resend").continue_after(
                first, functools.partial(self.attempt, call, data), start)
        except asyncio.CancelledError:
            # A deadline or a cancellation once the frame may be on the wire: the
            # server may have applied it; the journal says so until the client learns
            # the outcome (a late answer, the server's step count).
            core.interrupted(call, data)
            raise

    async def attempt(self, call: Call, data: dict[str, Any] | None, number: int) -> Frame:
        """Try number ``number`` of the call's request: every try, the first included.

        Every try sends the same request id (``call.request_id``, taken by the first
        that sends). A lost connection is resent (:func:`again`), recovered or fails.
        """
        core, method = self.core, call.method
        conn: Connection | None = self.connector.conn
        if conn is None or core.link is not Link.OPEN or not conn.is_open:
            # Anything but a trusted open connection: ask the core what to do.
            dead = conn if conn is not None and not conn.is_open else None
            conn = await self._connection_for(method, number)
            if conn is None:
                return await recover(self.recovery(), core.lost_mid_episode(), call, data,
                                     call.request_id, cause=None,
                                     earlier=core.take_lost_by(),
                                     closed=None if dead is None else await _closed_with(dead))
        request_id = call.request_id
        if request_id is None:
            request_id = call.request_id = core.next_request_id()
        try:
            if number == 1 and not self._first_phases:
                return await self.exchange(conn, method, data, request_id, call=call)
            # PhaseReport's work written out, as this runs on every call
            # (docs/performance.md, hot path).
            phase = PhaseStarted("attempt", method, number)
            hook = self.hook
            mark = hook.phase_started(phase)
            try:
                answer = await self.exchange(conn, method, data, request_id, call=call)
            except BaseException as exc:
                hook.phase_finished(PhaseFinished(phase, exc), mark)
                raise
            hook.phase_finished(PhaseFinished(phase, None), mark)
            return answer
        except ConnectionLostError as exc:
            return await self._lost(exc, call, data, request_id)

    async def _lost(self, exc: ConnectionLostError, call: Call, data: dict[str, Any] | None,
                    request_id: str | None) -> Frame:
        """The connection was lost during a try: resend (:func:`again`), recover or fail."""
        self.connector.drop(DropReason.FAILED)
        decision = self.core.after_failure(call.method, exc,
                                           written=not isinstance(exc, NotWrittenError),
                                           data=data)
        if decision.action is Action.RESEND:
            raise again(exc) from None
        if decision.action is Action.RECOVER:
            return await recover(self.recovery(), decision, call, data, request_id, cause=exc)
        assert decision.error is not None
        raise decision.error from exc

    async def _connection_for(self, method: str, number: int) -> Connection | None:
        """The connection to send on, after the core's preflight; ``None``: recover."""
        connector, core = self.connector, self.core
        conn = connector.conn
        # A connection that died since the last call (the server restarted or cut it)
        # is reopened as a reconnect, as one lost during a call is: a crash-looping
        # server shows in the reconnect rate even when its clients are between calls.
        lost = conn is not None and not conn.is_open
        todo = core.preflight(method, connection_open=conn is not None and conn.is_open)
        if todo is Preflight.REPLACE:
            # A new episode need not queue behind the old one's late answer; the old
            # session is ended rather than left holding a server slot.
            token = core.release_session()
            connector.drop(DropReason.DISTRUSTED)
            if token is not None:
                await connector.release(token)
            todo = Preflight.CONNECT
        elif todo is Preflight.PROBE:
            assert conn is not None
            alive = await conn.probe(self.probe_timeout())
            core.probed(alive)
            if alive:
                return conn
            self.hook.event(ClientEvent(LOG_PEER_UNRESPONSIVE, core.session_id, {}))
            connector.drop(DropReason.DISTRUSTED)
            todo = core.preflight(method, connection_open=False)
        if todo is Preflight.SEND:
            return conn
        connector.conn = None
        if todo is Preflight.RECOVER:
            return None
        # REATTACH: the session the client holds is resumed (or replaced by the server
        # if it has none by that token) rather than left detached beside a new one.
        return await connector.open_session(
            method, reason="connect" if number == 1 and not lost else "retry",
            resume_token=core.resume_token if todo is Preflight.REATTACH else None)

    def expect(self, frame: Frame, kind: type[_F], method: str) -> _F:
        """The answer as ``kind``; an error frame raises ``ServerError``.

        A valid frame of the wrong kind means the stream is out of step, which on
        the plain protocol means it can no longer be trusted.
        """
        if isinstance(frame, ErrorFrame):
            raise server_error(frame)
        if not isinstance(frame, kind):
            error = self.core.unexpected_frame(frame, kind, method)
            self.connector.drop(DropReason.DISTRUSTED)
            raise error
        return frame

    def probe_timeout(self) -> float:
        """The health-check wait: ``Timeout.probe``, never longer than ``ping_timeout``."""
        probe, ping = self.timeouts.probe, self.options.ping_timeout
        return probe if ping is None else min(probe, ping)

    async def exchange(self, conn: Connection, method: str, data: dict[str, Any] | None,
                       request_id: str | None, *, call: Call | None = None) -> Frame:
        """One request, one answer, on one connection. No retry here.

        ``call``: the public call whose own request this is (not a replayed one); it
        learns whether its request may be on the wire unanswered.
        """
        core, hook = self.core, self.hook
        carrier: dict[str, str] | None = None
        if request_id is not None:
            carrier = trace_carrier()  # per-message trace context (negotiated extension)
        text = core.encode(method, data, request_id, carrier)
        hook.message("sent", len(text))
        max_size = self.options.max_message_size
        # From the moment send() is entered the frame may be on the wire (websockets
        # buffers it whole, then waits for the buffer to drain): only NotWrittenError
        # proves otherwise. A cancellation after this point must treat it as sent.
        sent = True
        if call is not None:
            call.unanswered = True
            call.request_id = request_id
        try:
            try:
                await conn.send(text)
            except NotWrittenError:
                sent = False
                if call is not None:
                    call.unanswered = False
                buffered = await conn.take_buffered()
                if buffered is not None:
                    early = decode_response(buffered, max_size=max_size,
                                            max_values=self.options.max_message_values)
                    if isinstance(early, ErrorFrame):
                        raise server_error(early) from None
                raise
            while True:
                raw = await conn.recv()
                hook.message("received", len(raw))
                try:
                    frame = core.receive(raw, request_id, max_size,
                                         self.options.max_message_values)
                except ConnectionLostError as exc:
                    reason = exc.__cause__.reason if isinstance(exc.__cause__, ProtocolError) \
                        else "frame without request id"
                    hook.event(ClientEvent(LOG_UNATTRIBUTABLE_FRAME, core.session_id,
                                           {"reason": reason}))
                    raise
                if isinstance(frame, Dropped):
                    if frame.settled is not None:
                        hook.event(ClientEvent(LOG_UNKNOWN_STEP_SETTLED, core.session_id, {
                            "applied": frame.settled, "source": "late_answer"}))
                    hook.event(ClientEvent(LOG_STALE_ANSWER_DROPPED, core.session_id,
                                           {"id": frame.id, "expected": request_id}))
                    continue
                if call is not None:
                    call.unanswered = False
                    call.answer, call.sent, call.received = frame, text, raw
                return frame
        except ProtocolError:
            if core.protocol_error():
                self.connector.drop(DropReason.DISTRUSTED)
            raise
        except (asyncio.CancelledError, CallTimeoutError) as exc:
            abandoned = isinstance(exc, asyncio.CancelledError) and was_abandoned(exc)
            if not core.deadline_expired(method, data, request_id, sent=sent,
                                         abandoned=abandoned):
                # An answer may still arrive and would be read by the next call.
                self.connector.drop(DropReason.DISTRUSTED)
            raise

    def recovery(self) -> RecoveryContext:
        """What the recovery strategies work with, for one recovery of this session."""
        return RecoveryContext(self.core, self.connector, self.hook, self.exchange,
                               self.replay_verify)


def take_turn(driver: SessionDriver, call: Call) -> asyncio.Lock | None:
    """The session's turn taken at once, when nobody holds it or waits for it.

    What ``asyncio.Lock.acquire()`` does then, without its coroutine. Returns the
    lock, or ``None``: then ``await`` :func:`wait_turn`. After either: run the call,
    then :func:`end_turn`, whatever happens.
    """
    loop = _get_running_loop()
    lock = driver._lock
    if (not _FREE_LOCKS or lock is None or driver._loop is not loop
            or driver.lifecycle is not _OPEN or driver._pid != _getpid()
            or not _take_free_lock(lock)):
        return None
    call.queue_wait = 0.0
    driver.active = _task_of(loop)
    return lock


async def wait_turn(driver: SessionDriver, call: Call) -> asyncio.Lock:
    """The session's turn, waited for in FIFO order (``asyncio.Lock`` is fair)."""
    loop = _get_running_loop()
    task = _task_of(loop)
    lock = driver._lock
    if driver._loop is not loop or lock is None or driver._pid != _getpid():
        lock = driver._bind_loop(asyncio.get_running_loop() if loop is None else loop)
    if _take_free_lock(lock):
        # What acquire() does when nobody holds the lock or waits for it, without
        # its coroutine: the call did not queue.
        call.queue_wait = 0.0
    else:
        queued = _perf()
        await lock.acquire()
        call.queue_wait = _perf() - queued
    if driver.lifecycle is not _OPEN:
        lock.release()
        raise ClientClosedError("the client's close() was called while the call waited "
                                "for its turn")
    driver.active = task
    return lock


def end_turn(driver: SessionDriver, lock: asyncio.Lock | None) -> None:
    """Give the session's turn back (after :func:`take_turn` or :func:`wait_turn`)."""
    driver.active = None
    if lock is not None:
        _give_lock(lock)


#: How long `_closed_with` reads a closed connection for its error.
_CLOSED_READ_WAIT = 0.5


async def _closed_with(conn: Connection) -> EnvlinkError | None:
    """The error a connection that closed between calls ended with (the server's close
    code and reason, a reset): what its ``recv`` raises now, after any frame it still
    buffered (stale: no call was waiting for it). ``None`` if it does not say in time.
    """
    try:
        async with bounded(_CLOSED_READ_WAIT):
            for _ in range(64):
                await conn.recv()
    except (ConnectionLostError, ProtocolError) as exc:
        return exc
    except (TimeoutError, EnvlinkError):
        return None
    return None
