"""The asyncio side of a session's connection: open it under the policy, keep it, end it.

What the session core decides about the link (flapping, resumption, a fresh
server session mid-episode) it decides from :meth:`SessionCore.connected` and
:meth:`SessionCore.dropped`; this module does the I/O: opening through the
:class:`~envlink._transport.Transport` under the one retry primitive, aborting,
closing, and ending abandoned server sessions.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from opentelemetry import propagate

from envlink._config import ConnectionOptions, Timeout
from envlink._errors import EnvlinkError
from envlink._hooks import ClientEvent, ClientHook, PhaseFinished, PhaseStarted
from envlink._policies import ReconnectPolicy
from envlink._protocol import RESUME_TOKEN_HEADER, StateFrame, decode_response
from envlink._retry import BackoffDetails, Retry
from envlink._session import SessionCore
from envlink._timeouts import bounded
from envlink._transport import Connection, Endpoint, Transport
from envlink.names import (
    HOOK_RECONNECT,
    LOG_CONNECTION_DISCARDED,
    LOG_DISCONNECT,
    LOG_RECONNECT_SCHEDULED,
    LOG_SESSION_RELEASE_FAILED,
)

__all__ = ["Connector"]


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
        #: Housekeeping tasks (session releases); close() waits for them, bounded.
        self.background: set[asyncio.Task[Any]] = set()

    @property
    def is_open(self) -> bool:
        """Whether a connection is open."""
        return self.conn is not None and self.conn.is_open

    # ------------------------------------------------------------------ opening

    async def open(self, method: str, *, reason: str,
                   resume_token: str | None = None) -> Connection:
        """Open a connection under the reconnect policy.

        Raises:
            ConnectError: the policy gave up (the last attempt's error).
            ConnectionLostError: the connection keeps dropping (flapping).
            RetryBudgetExhaustedError: the shared budget refused a retry.
        """
        core, hook = self.core, self.hook
        if reason != "connect":
            hook.event(ClientEvent(HOOK_RECONNECT, core.session_id, {"reason": reason}))
        used = core.connect_attempts_used(self.endpoint.display)

        def on_backoff(details: BackoffDetails) -> None:
            hook.event(ClientEvent(LOG_RECONNECT_SCHEDULED, core.session_id, {
                "operation": details.operation, "attempt": details.attempt,
                "delay": details.delay, "error": details.error, "reason": reason}))

        retry = Retry(self.policy, operation="connect", sleep=asyncio.sleep,
                      clock=core.clock, attempts_used=used, on_backoff=on_backoff)
        conn = await retry.run(lambda attempt: self._open_once(method, attempt, reason,
                                                               resume_token))
        core.connects_made(retry.tries)
        return conn

    async def _open_once(self, method: str, attempt: int, reason: str,
                         resume_token: str | None) -> Connection:
        endpoint = self.endpoint
        phase = PhaseStarted("connect", method, attempt, reason, server_address=endpoint.host,
                             server_port=endpoint.port)
        mark = self.hook.phase_started(phase)
        error: BaseException | None = None
        conn: Connection | None = None
        try:
            headers: dict[str, str] = {}
            propagate.inject(headers)  # the attempt's trace context, to the server
            if resume_token is not None:
                headers[RESUME_TOKEN_HEADER] = resume_token
            conn = await self.transport.connect(
                endpoint, self.options, headers=headers, timeout=self.timeouts.connect,
                offer_extensions=self.offer_extensions)
            self._adopt(conn)
            return conn
        except BaseException as exc:
            error = exc
            raise
        finally:
            self.hook.phase_finished(PhaseFinished(
                phase, error, self.core.session_id if conn is not None else None,
                conn.extensions.enabled if conn is not None else None), mark)

    def _adopt(self, conn: Connection) -> None:
        previous = self.conn
        if previous is not None and previous is not conn:
            previous.abort()
        self.conn = conn
        self.core.connected(conn.extensions)

    # ------------------------------------------------------------------ ending

    def forget(self) -> None:
        """The connection failed: drop it (the core keeps the flapping count)."""
        conn, self.conn = self.conn, None
        if conn is not None:
            conn.abort()
            self.core.dropped()

    def discard(self) -> None:
        """Drop a connection that can no longer be trusted."""
        conn, self.conn = self.conn, None
        self.core.discarded()
        if conn is not None:
            conn.abort()
            self.hook.event(ClientEvent(LOG_CONNECTION_DISCARDED, self.core.session_id, {}))

    def abandon(self) -> None:
        """Forget the connection without any I/O on it (a forked child's copy)."""
        self.conn = None
        self.background = set()

    async def close(self, *, graceful: bool, timeout: float | None = None) -> None:
        """End the session: ``close`` frame (when graceful), closing handshake, drop."""
        conn, self.conn = self.conn, None
        core = self.core
        core.closed()
        if conn is None:
            return
        seconds = self.timeouts.close if timeout is None else timeout
        if graceful and conn.is_open:
            frame = core.encode("close", None, core.next_request_id())
            with contextlib.suppress(EnvlinkError, TimeoutError):
                async with bounded(seconds):
                    await conn.send(frame)
        await conn.close(seconds)
        self.hook.event(ClientEvent(LOG_DISCONNECT, core.session_id, {}))

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
            frame = decode_response(await conn.recv(), max_size=self.options.max_message_size)
            if frame.id in (rid, None):
                break
        if not isinstance(frame, StateFrame):
            return None
        value = frame.data.get("step_count")
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def release_later(self, token: str) -> None:
        """:meth:`release` in the background; :meth:`wait_background` waits for it."""
        task = asyncio.get_running_loop().create_task(self.release(token))
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    async def wait_background(self, timeout: float | None) -> None:
        """Wait (bounded) for housekeeping still running."""
        if self.background:
            await asyncio.wait(set(self.background), timeout=timeout)
