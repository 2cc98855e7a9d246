"""The asyncio side of a session's connection: open it under the policy, keep it, end it.

What the session core decides about the link (flapping, resumption, a fresh
server session mid-episode) it decides from :meth:`SessionCore.on_connected` and
:meth:`SessionCore.on_dropped`; this module does the I/O: opening through the
:class:`~envlink._transports.base.Transport` under the one retry primitive, aborting,
closing, and ending abandoned server sessions. Operations whose every try opens a
connection (a resend, a resume, a replay) take their retry loop and their phase
reports from here too.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

from opentelemetry import propagate

from envlink._config import ConnectionOptions, Timeout, is_int
from envlink._deadlines import bounded
from envlink._errors import (
    CapacityReachedError,
    ConnectError,
    ConnectionLostError,
    DetachedSessionGone,
    EnvlinkError,
    ErrorCode,
    FactoryError,
    FeatureUnavailableError,
    NoAnswerError,
    NotWrittenError,
    OutcomeUnknownError,
    ProtocolError,
    ServerError,
    SessionError,
)
from envlink._events.client_events import ClientEvent, ClientHook, PhaseReport, PhaseStarted
from envlink._sansio import jsonrpc
from envlink._sansio.policies import ReconnectPolicy, is_retryable
from envlink._sansio.protocol import (
    RESUME_TOKEN_HEADER,
    ErrorFrame,
    StateFrame,
    decode_response,
    server_error,
)
from envlink._sansio.retry import BackoffDetails, Retry
from envlink._sansio.session import DropReason, SessionCore
from envlink._transports.base import (
    Connection,
    Endpoint,
    RpcAnswer,
    RpcTransport,
    Transport,
)
from envlink.names import (
    HOOK_RECONNECT,
    LOG_ATTACH_WAIT,
    LOG_CONNECTION_DISCARDED,
    LOG_DETACHED_UNAVAILABLE,
    LOG_DISCONNECT,
    LOG_RECONNECT_SCHEDULED,
    LOG_SESSION_RELEASE_FAILED,
)

__all__ = ["Connector", "DetachedSessionGone"]


#: How OpenEnv 0.10 refuses an attach to a session it does not know. Its frame has no
#: code of its own (``SESSION_ERROR`` covers every refusal), so this wording is the
#: only signal a stock server gives; envlink's reference server sends the same. Any
#: other ``SESSION_ERROR`` on attach is taken as a refusal for now and retried.
_UNKNOWN_SESSION = "Unknown session_id"

#: JSON-RPC's "method not found": a server without OpenEnv's session methods.
_METHOD_NOT_FOUND = -32601
#: JSON-RPC methods that never change anything: resent after a lost connection.
_METHOD_NOT_SENT = ("tools/list",)

#: Waiting for a server to let go of a session's old socket (an attach refused "for
#: now"): short backoffs, no count of tries; bounded by the call's deadline, not by the
#: reconnect policy's tries, and not charged to the retry budget (the server asked for
#: the wait: it is not a blind retry).
ATTACH_WAIT_POLICY = ReconnectPolicy(max_attempts=1 << 30, initial_delay=0.05,
                                     max_delay=0.5, max_elapsed=None, budget=None)


class Connector:
    """Opens, keeps and ends the one connection of a session.

    Args:
        endpoint: where the server is.
        options: how connections are opened.
        transport: the I/O seam.
        timeouts: the client's deadlines (``connect``, ``close``, ``release``).
        policy: the reconnect policy.
        offer_extensions: offer envlink's protocol extensions.
        core: the session core, told of every connection opened or lost.
        hook: where phases and events are reported.
    """

    def __init__(self, endpoint: Endpoint, options: ConnectionOptions, transport: Transport,
                 timeouts: Timeout, policy: ReconnectPolicy, offer_extensions: bool,
                 core: SessionCore, hook: ClientHook) -> None:
        self.endpoint = endpoint
        self.options = options
        self.transport = transport
        self.timeouts = timeouts
        self.policy = policy
        self.offer_extensions = offer_extensions
        self.core = core
        self.hook = hook
        self.conn: Connection | None = None
        #: Housekeeping tasks (session releases) still running; close() waits for them,
        #: bounded. Made when the first begins: an idle session keeps no empty set.
        self.background: set[asyncio.Task[Any]] | None = None
        #: The detached session's ``step_count`` read when this connection attached.
        self.attached_count: int | None = None
        #: Whether an attempt of the last :meth:`open` could not reach the server.
        self.saw_unreachable = False
        self._rpc_ids = 0
        #: Awaited before every open: starts a provider's server, waits for a Space.
        self.prepare: Callable[[], Awaitable[None]] | None = None

    @property
    def is_open(self) -> bool:
        """Whether a connection is open."""
        return self.conn is not None and self.conn.is_open

    def retry(self, operation: str) -> Retry:
        """The retry loop of an operation whose every try opens a connection (``resend``,
        ``resume``, ``replay``): no backoff of its own, since the connect inside each
        try backs off; each retry spends the retry budget all the same."""
        return Retry(self.policy, operation=operation, sleep=asyncio.sleep,
                     clock=self.core.clock, retry_on=_never, backoff=False)

    def report(self, phase: PhaseStarted) -> PhaseReport:
        """Report ``phase``, with the server's address, around a block."""
        endpoint = self.endpoint
        return PhaseReport(self.hook, phase._replace(server_address=endpoint.host,
                                                     server_port=endpoint.port))

    # ------------------------------------------------------------------ opening

    async def open(self, method: str, *, reason: str,
                   resume_token: str | None = None) -> Connection:
        """Open a connection under the reconnect policy.

        Raises:
            ConnectError: the policy gave up (the last attempt's error).
            ConnectionLostError: the connection keeps dropping (flapping).
            RetryBudgetExhaustedError: the shared budget refused a retry.
        """
        if self.prepare is not None:
            await self.prepare()
        core, hook = self.core, self.hook
        if reason != "connect":
            hook.event(ClientEvent(HOOK_RECONNECT, core.session_id, {"reason": reason}))
        used = core.connect_attempts_used(self.endpoint.display)

        def on_backoff(details: BackoffDetails) -> None:
            hook.event(ClientEvent(LOG_RECONNECT_SCHEDULED, core.session_id, {
                "operation": details.operation, "attempt": details.attempt,
                "delay": details.delay, "error": details.error, "reason": reason}))

        # An attach the server refuses "for now" is not a failed connect: it is
        # waited out (below), not retried against the connect policy's few tries.
        retry = Retry(self.policy, operation="connect", sleep=asyncio.sleep,
                      clock=core.clock, attempts_used=used, on_backoff=on_backoff,
                      retry_on=_retryable_connect)
        self.saw_unreachable = False
        tries = 0

        async def connect(_round: int) -> Connection:
            nonlocal tries
            try:
                return await retry.run(lambda attempt: self._open_once(
                    method, attempt + tries, reason, resume_token))
            finally:
                tries += retry.tries

        waited = core.clock()

        def on_wait(details: BackoffDetails) -> None:
            hook.event(ClientEvent(LOG_ATTACH_WAIT, core.session_id, {
                "attempt": details.attempt, "delay": details.delay,
                "waited": core.clock() - waited, "error": details.error}))

        # The server keeps the old socket attached until the request it is running
        # ends (OpenEnv 0.10 after an interrupted slow step): it says "not yet", as a
        # full server does. Asked again after short backoffs until it lets go, bounded
        # by the call's deadline (which cancels this); a call without one waits up to
        # the policy's max_elapsed.
        wait = Retry(ATTACH_WAIT_POLICY, operation="attach", sleep=asyncio.sleep,
                     clock=core.clock, retry_on=_attach_refused, on_backoff=on_wait,
                     deadline=None if self.policy.max_elapsed is None
                     else waited + self.policy.max_elapsed)
        conn = await wait.run(connect)
        core.connects_made(retry.tries)  # the refused attaches were no failed connects
        return conn

    async def open_session(self, method: str, *, reason: str,
                           resume_token: str | None = None) -> Connection:
        """:meth:`open` for a call outside recovery: a detached session found gone is
        replaced by a new one (no episode runs on it: a call in mid-episode recovers
        instead, and a reset starts a new episode anyway). With ``resume_token``, the
        envlink session the client holds is re-attached to (the server opens a fresh
        one where it no longer has it)."""
        try:
            return await self.open(method, reason=reason, resume_token=resume_token)
        except DetachedSessionGone:
            self.core.on_detached_gone()
            return await self.open(method, reason=reason)

    async def _open_once(self, method: str, attempt: int, reason: str,
                         resume_token: str | None) -> Connection:
        endpoint = self.endpoint
        try:
            with self.report(PhaseStarted("connect", method, attempt, reason)) as report:
                headers: dict[str, str] = {}
                propagate.inject(headers)  # the attempt's trace context, to the server
                if resume_token is not None:
                    headers[RESUME_TOKEN_HEADER] = resume_token
                reattached = False
                core = self.core
                if resume_token is None and core.wants_detached and isinstance(
                        self.transport, RpcTransport):
                    reattached = core.detached_id is not None
                    if core.detached_id is None:
                        await self._create_detached()
                    endpoint = endpoint.attached(core.detached_id)
                conn = await self.transport.connect(
                    endpoint, self.options, headers=headers, timeout=self.timeouts.connect,
                    offer_extensions=self.offer_extensions)
                report.session_id, report.extensions = core.session_id, conn.extensions.enabled
                if endpoint.session_id is not None:
                    await self._confirm_attached(conn)
                self._adopt(conn, reattached=reattached)
                report.session_id = core.session_id
                return conn
        except ConnectError as exc:
            if not isinstance(exc, (_AttachRefused, DetachedSessionGone)):
                self.saw_unreachable = True
            raise

    def _adopt(self, conn: Connection, *, reattached: bool = False) -> None:
        previous = self.conn
        if previous is not None and previous is not conn:
            previous.abort()
        self.conn = conn
        self.core.on_connected(conn.extensions, reattached=reattached)

    # ----------------------------------------------- OpenEnv detached sessions

    async def rpc(self, method: str, params: dict[str, Any], timeout: float | None, *,
                  token: str | None = None) -> RpcAnswer | None:
        """One JSON-RPC request to the server's ``/mcp``; ``None`` if the transport has none.

        ``token``: the session's resume token, sent as the ``envlink-resume`` header
        (the request is about that session).
        """
        transport = self.transport
        if not isinstance(transport, RpcTransport):
            return None
        self._rpc_ids += 1
        options = self.options
        if token is not None:
            options = dataclasses.replace(
                options, headers=(*options.headers, (RESUME_TOKEN_HEADER, token)))
        async with bounded(timeout):
            return await transport.rpc(self.endpoint, options, method, params,
                                       request_id=self._rpc_ids)

    async def _create_detached(self) -> None:
        """``openenv/session/create``: the server's session, kept across dropped sockets.

        A server that does not offer it (no ``/mcp``, or no such method) is noted, and
        the client uses plain sessions from then on.

        Raises:
            CapacityReachedError, FactoryError, ServerError: the server refused.
            ConnectError: the server could not be reached (retryable).
        """
        core = self.core
        try:
            answer = await self.rpc("openenv/session/create", {}, self.timeouts.connect)
        except TimeoutError as exc:
            raise ConnectError(f"timed out creating a session on {self.endpoint.mcp_url}",
                               retryable=True) from exc
        except NoAnswerError:
            # Accepted, then closed without a byte of HTTP: not an OpenEnv server
            # (websockets' server, for one, drops a request with a body this way).
            answer = None
        except ConnectionLostError as exc:
            # A session may have been created that we will never know of; the server's
            # reaper (if any) ends it. Retry: a new one is created.
            raise ConnectError(f"creating a session on {self.endpoint.mcp_url} failed: {exc}",
                               retryable=True) from exc
        body = None if answer is None else answer.body
        # 501 Not Implemented: the server has no POST at all there (a plain HTTP
        # server): no detached sessions, not a failure of the server.
        if answer is not None and answer.status >= 500 and answer.status != 501:
            raise ConnectError(f"{self.endpoint.mcp_url} answered HTTP {answer.status}",
                               retryable=True)
        result = body.get("result") if isinstance(body, dict) else None
        error = body.get("error") if isinstance(body, dict) else None
        if isinstance(result, dict) and isinstance(result.get("session_id"), str):
            core.on_detached_created(result["session_id"])
            return
        if isinstance(error, dict) and error.get("code") != _METHOD_NOT_FOUND and (
                answer is not None and answer.status == 200):
            raise _rpc_refusal(error)
        # No /mcp (404, 426...), no such method, or not JSON-RPC: an older server.
        core.on_detached_unavailable()
        self.hook.event(ClientEvent(LOG_DETACHED_UNAVAILABLE, core.session_id,
                                    {"status": None if answer is None else answer.status}))

    async def _confirm_attached(self, conn: Connection) -> None:
        """Read the attached session's state: the server refuses an attach only after
        accepting the socket, with a ``SESSION_ERROR`` frame. Keeps its ``step_count``."""
        self.attached_count = None
        text = self.core.encode("state", None, None)
        try:
            async with bounded(self.timeouts.connect):
                try:
                    await conn.send(text)
                    raw: str | bytes | None = await conn.recv()
                except NotWrittenError:
                    raw = await conn.take_buffered()
                except ConnectionLostError:
                    raw = await conn.take_buffered()
        except TimeoutError as exc:
            conn.abort()
            raise ConnectError("timed out attaching to the session", retryable=True) from exc
        if raw is None:
            conn.abort()
            raise ConnectError("the server closed the connection while attaching",
                               retryable=True)
        frame = decode_response(raw, max_size=self.options.max_message_size,
                                max_values=self.options.max_message_values)
        if isinstance(frame, StateFrame):
            value = frame.data.get("step_count")
            if is_int(value):
                self.attached_count = value
            return
        conn.abort()
        if isinstance(frame, ErrorFrame):
            error = server_error(frame)
            if isinstance(error, SessionError) and _UNKNOWN_SESSION in error.message:
                raise DetachedSessionGone(
                    f"the server no longer knows the session ({error.message.split(':')[0]})")
            if isinstance(error, SessionError):
                # Still attached to a dead previous socket the server has not noticed
                # yet, or still initialising: both pass; retry under the policy.
                raise _AttachRefused(f"the server refused the attach for now: "
                                     f"{error.message.split(':')[0]}") from error
            raise error
        raise ConnectError(f"unexpected {frame.type!r} frame while attaching", retryable=False)

    async def post_rpc(self, method: str, params: dict[str, Any]) -> Any:
        """A JSON-RPC request over ``POST /mcp`` with the session's id (production mode).

        Runs inside the caller's turn, under its deadline. A request that never left is
        retried under the reconnect policy; once ``tools/call`` may have been sent it is
        never resent.

        Raises:
            ConnectError: the server offers no HTTP MCP sessions, or cannot be reached.
            OutcomeUnknownError: the connection was lost after the request was sent.
            McpError, ProtocolError: the answer is an error, or not JSON-RPC.
        """
        if not self.is_open:
            await self.open_session("mcp", reason="connect")
        session_id = self.core.detached_id
        token = self.core.resume_token
        if session_id is not None:
            params = {**params, "session_id": session_id}
        elif token is None:
            raise FeatureUnavailableError(
                f"{method} in production mode goes over POST /mcp to the client's own "
                "session", feature="HTTP MCP sessions (OpenEnv 0.10's openenv/session/"
                "create) and envlink's session token",
                fix="start the server with detached sessions (envlink serve "
                    "--detached-sessions), or use mode='simulation' to call tools as "
                    "steps")
        policy = self.core.policy
        for attempt in range(1, policy.max_attempts + 1):
            try:
                # Without a detached session: the client's own envlink session, named by
                # its token (a secret, as a detached session's id is).
                answer = await self.rpc(method, params, None,
                                        token=None if session_id is not None else token)
            except ConnectError:
                if attempt == policy.max_attempts:
                    raise
            except ConnectionLostError as exc:
                if method not in _METHOD_NOT_SENT or attempt == policy.max_attempts:
                    raise OutcomeUnknownError(
                        f"the connection was lost after {method} was sent; the "
                        "server may or may not have run it") from exc
            else:
                if answer is None or not isinstance(answer.body, dict):
                    raise ProtocolError(f"POST /mcp answered {method} without JSON-RPC")
                # The connector numbers its own POSTs, one answer per request.
                return jsonrpc.rpc_result(answer.body, None)
            await asyncio.sleep(policy.delay(attempt))
        raise AssertionError("unreachable")  # pragma: no cover

    async def close_detached(self, session_id: str, timeout: float | None) -> None:
        """``openenv/session/close``: end a detached session. Best effort, bounded."""
        try:
            answer = await self.rpc("openenv/session/close", {"session_id": session_id},
                                    timeout)
        except (EnvlinkError, TimeoutError) as exc:
            self.hook.event(ClientEvent(LOG_SESSION_RELEASE_FAILED, None, {"error": str(exc)}))
            return
        body = None if answer is None else answer.body
        if isinstance(body, dict) and isinstance(body.get("error"), dict):
            self.hook.event(ClientEvent(LOG_SESSION_RELEASE_FAILED, None, {
                "error": str(body["error"].get("message"))}))

    def close_detached_later(self, session_id: str) -> None:
        """:meth:`close_detached` in the background (:meth:`wait_background` waits)."""
        limit, close = self.timeouts.release, self.timeouts.close
        seconds = limit if close is None else min(limit, close)
        self._in_background(asyncio.get_running_loop().create_task(
            self.close_detached(session_id, seconds)))

    def _in_background(self, task: asyncio.Task[Any]) -> None:
        background = self.background
        if background is None:
            background = self.background = set()
        background.add(task)
        task.add_done_callback(background.discard)

    # ------------------------------------------------------------------ ending

    def drop(self, reason: DropReason) -> None:
        """Let the connection go, for ``reason``.

        A failed connection is aborted and counted towards flapping; a distrusted one
        is aborted and reported; an inherited one (a forked child's copy, another
        loop's) is forgotten without any I/O, with the housekeeping tasks it had.
        """
        conn, self.conn = self.conn, None
        if reason is DropReason.INHERITED:
            self.background = None
            self.core.on_dropped(reason)
            return
        if reason is DropReason.DISTRUSTED:
            self.core.on_dropped(reason)
            if conn is not None:
                conn.abort()
                self.hook.event(ClientEvent(LOG_CONNECTION_DISCARDED, self.core.session_id, {}))
        elif conn is not None:
            conn.abort()
            self.core.on_dropped(reason)

    async def close(self, *, graceful: bool, timeout: float | None = None) -> None:
        """End the session: ``close`` frame (when graceful), closing handshake, drop;
        then ``openenv/session/close`` for a detached session, attached or not."""
        conn, self.conn = self.conn, None
        core = self.core
        detached = core.detached_id
        core.on_closed()
        seconds = self.timeouts.close if timeout is None else timeout
        if conn is not None:
            if graceful and conn.is_open:
                frame = core.encode("close", None, core.next_request_id())
                with contextlib.suppress(EnvlinkError, TimeoutError):
                    async with bounded(seconds):
                        await conn.send(frame)
            await conn.close(seconds)
            self.hook.event(ClientEvent(LOG_DISCONNECT, core.session_id, {}))
        if detached is not None:
            # After the socket: an attached session would only be marked for closing.
            await self.close_detached(detached, seconds)

    async def release(self, token: str, *, count_steps: bool = False) -> int | None:
        """End a detached server session the client gives up on. Best effort, bounded.

        Re-attaches with the resume token (taking the session over from any stalled
        connection) and sends ``close``; the server then destroys it at once instead
        of keeping it, and its slot, for the whole grace window.

        Returns:
            with ``count_steps``, the session's ``step_count`` read from its state
            just before closing it, when the server reported one; else ``None``.
        """
        limit, close = self.timeouts.release, self.timeouts.close
        seconds = limit if close is None else min(limit, close)
        count: int | None = None

        async def release() -> None:
            nonlocal count
            conn = await self.transport.connect(
                self.endpoint, self.options, headers={RESUME_TOKEN_HEADER: token},
                timeout=seconds)
            try:
                if conn.extensions.resumed:
                    if count_steps:
                        count = await self.count_steps(conn)
                    await conn.send(self.core.encode("close", None, None))
                    with contextlib.suppress(EnvlinkError):
                        await conn.recv()  # returns when the server has ended it
            finally:
                conn.abort()

        try:
            async with bounded(seconds):
                await release()
        except (EnvlinkError, TimeoutError) as exc:
            self.hook.event(ClientEvent(LOG_SESSION_RELEASE_FAILED, None, {"error": str(exc)}))
        return count

    async def count_steps(self, conn: Connection) -> int | None:
        """The session's ``step_count`` from its state, if the server reports one."""
        rid = self.core.next_request_id(always=True)
        await conn.send(self.core.encode("state", None, rid))
        while True:
            frame = decode_response(await conn.recv(), max_size=self.options.max_message_size,
                                    max_values=self.options.max_message_values)
            if frame.id in (rid, None):
                break
        if not isinstance(frame, StateFrame):
            return None
        value = frame.data.get("step_count")
        return value if is_int(value) else None

    def release_later(self, token: str) -> None:
        """:meth:`release` in the background; :meth:`wait_background` waits for it."""
        self._in_background(asyncio.get_running_loop().create_task(self.release(token)))

    async def wait_background(self, timeout: float | None) -> None:
        """Wait (bounded) for housekeeping still running."""
        if self.background:
            await asyncio.wait(set(self.background), timeout=timeout)


def _never(exc: BaseException) -> bool:
    return False


def _attach_refused(exc: BaseException) -> bool:
    return isinstance(exc, _AttachRefused)


def _retryable_connect(exc: BaseException) -> bool:
    return not isinstance(exc, _AttachRefused) and is_retryable(exc)


class _AttachRefused(ConnectError):
    """The server refused an attach for now (``already has an attached WebSocket``)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retryable=True)


def _rpc_refusal(error: dict[str, Any]) -> ServerError:
    """The typed error for a refused ``openenv/session/create`` (JSON-RPC error object)."""
    message = str(error.get("message", "the server refused to create a session"))
    data = error.get("data") if isinstance(error.get("data"), dict) else {}
    assert isinstance(data, dict)
    if "active_sessions" in data or "max_sessions" in data:
        counts = [v if is_int(v) and v >= 0 else None
                  for v in (data.get("active_sessions"), data.get("max_sessions"))]
        return CapacityReachedError(message, ErrorCode.CAPACITY_REACHED,
                                    active_sessions=counts[0], max_sessions=counts[1],
                                    details=dict(data))
    if "factory_name" in data:
        name = data.get("factory_name")
        return FactoryError(message, ErrorCode.FACTORY_ERROR,
                            factory_name=name if isinstance(name, str) else None,
                            details=dict(data))
    return ServerError(message, str(error.get("code", "MCP_ERROR")), details=dict(data))
