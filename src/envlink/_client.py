"""The hardened async client for the OpenEnv WebSocket protocol.

One :class:`EnvClient` is one session: at most one request in flight, callers
queued FIFO, a deadline on every call, reconnects under a
:class:`~envlink.ReconnectPolicy`, session recovery under ``on_session_lost``,
and never a step applied twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import itertools
import os
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

from opentelemetry import propagate
from opentelemetry.metrics import MeterProvider
from opentelemetry.trace import Span, SpanKind, TracerProvider
from pydantic import BaseModel, ValidationError
from tenacity import RetryCallState

from envlink import _logging
from envlink._config import (
    DEFAULT_MAX_MESSAGE_SIZE,
    UNSET,
    ConnectionOptions,
    Timeout,
    TimeoutTypes,
    UnsetType,
)
from envlink._errors import (
    CallTimeoutError,
    ClientClosedError,
    ConnectError,
    ConnectionLostError,
    EnvlinkError,
    OutcomeUnknownError,
    ProtocolError,
    ReplayDivergedError,
    RetryBudgetExhaustedError,
    ServerError,
    SessionLostError,
)
from envlink._journal import EpisodeJournal
from envlink._policies import ReconnectPolicy, SessionLostPolicy, build_retrying, testing_enabled
from envlink._protocol import (
    RESUME_TOKEN_HEADER,
    CloseRequest,
    ErrorFrame,
    ObservationFrame,
    ResetRequest,
    StateFrame,
    StateRequest,
    StepRequest,
    decode_response,
    encode_request,
)
from envlink._telemetry import (
    ATTR_ATTEMPT,
    ATTR_DELAY,
    ATTR_DIRECTION,
    ATTR_EPISODE_ID,
    ATTR_ERROR_TYPE,
    ATTR_EXTENSIONS,
    ATTR_OUTCOME,
    ATTR_POLICY,
    ATTR_QUEUE_WAIT,
    ATTR_REASON,
    ATTR_REPLAY_STEPS,
    ATTR_RESULT,
    ATTR_RETRY,
    ATTR_RPC_METHOD,
    ATTR_RPC_SYSTEM,
    ATTR_SERVER_ADDRESS,
    ATTR_SERVER_PORT,
    ATTR_SESSION_ID,
    ATTR_STEP_INDEX,
    ATTR_TRANSPARENT,
    EVENT_RECONNECT_SCHEDULED,
    EVENT_SESSION_LOST,
    RPC_SYSTEM,
    error_type_of,
    get_telemetry,
)
from envlink._transport import Connection, NotWrittenError, open_connection, parse_endpoint

if TYPE_CHECKING:
    from envlink._bridge import Bridge
    from envlink._sync import SyncEnvClient

__all__ = ["EnvClient", "GenericEnvClient", "StepResult"]

ActT = TypeVar("ActT")
ObsT = TypeVar("ObsT")
StateT = TypeVar("StateT")
_R = TypeVar("_R")

_Frame = ObservationFrame | StateFrame | ErrorFrame
_Request = ResetRequest | StepRequest | StateRequest | CloseRequest

_log = _logging.get_logger()



@dataclass
class StepResult(Generic[ObsT]):
    """The result of a reset or a step, as in OpenEnv.

    Attributes:
        observation: the environment's observation.
        reward: the reward, if the environment gives one.
        done: whether the episode is over.
        metadata: extra data the server sent beside the observation.
    """

    observation: ObsT
    reward: float | None = None
    done: bool = False
    metadata: dict[str, Any] | None = None


class _State(enum.Enum):
    IDLE = "idle"
    CLOSED = "closed"


# Methods that may be resent after a connection failure whatever happened to the
# first request: reset starts the episode over, state only reads.
_IDEMPOTENT = frozenset({"reset", "state"})

if sys.version_info >= (3, 11):

    @contextlib.asynccontextmanager
    async def _deadline(seconds: float | None, method: str) -> AsyncIterator[None]:
        if seconds is None:
            yield
            return
        try:
            async with asyncio.timeout(seconds) as cm:
                yield
        except TimeoutError as exc:
            if cm.expired():
                raise CallTimeoutError(
                    f"{method} did not complete within {seconds:g} s", method=method,
                    timeout=seconds,
                ) from exc
            raise
else:  # pragma: no cover - exercised on Python 3.10 only

    @contextlib.asynccontextmanager
    async def _deadline(seconds: float | None, method: str) -> AsyncIterator[None]:
        if seconds is None:
            yield
            return
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        fired = False

        def expire() -> None:
            nonlocal fired
            fired = True
            task.cancel()

        handle = loop.call_later(seconds, expire)
        try:
            yield
        except asyncio.CancelledError as exc:
            if fired:
                raise CallTimeoutError(
                    f"{method} did not complete within {seconds:g} s", method=method,
                    timeout=seconds,
                ) from exc
            raise
        finally:
            handle.cancel()


class EnvClient(Generic[ActT, ObsT, StateT]):
    """Async client for one session on an OpenEnv-compatible server.

    Same surface as OpenEnv's ``EnvClient`` (``connect``, ``reset``, ``step``,
    ``state``, ``close``, ``async with``, the ``_step_payload`` / ``_parse_result`` /
    ``_parse_state`` hooks, ``sync()``), plus deadlines, reconnects and recovery.
    Used as is, actions may be dicts or pydantic models and observations are dicts.

    Args:
        base_url: ``http(s)://`` or ``ws(s)://`` URL of the server (``/ws`` is added).
        timeout: a :class:`Timeout`, a number for every phase, or ``None`` for none.
        headers: extra handshake headers (e.g. ``Authorization``); never logged.
        reconnect: the :class:`ReconnectPolicy` for opening connections.
        on_session_lost: ``"raise"`` (default), ``"replay"`` or ``"resume"``.
        replay_verify: compares a recorded answer with the replayed one during
            ``replay`` (default: equality of the whole ``data`` object).
        max_journal_steps: bound on the steps recorded for ``replay``.
        ping_interval: keepalive ping interval in seconds (``None``: off).
        ping_timeout: seconds without a pong before the peer is declared dead.
        max_message_size: largest accepted frame, in bytes.
        compression: ``None`` (default) or ``"deflate"``.
        ssl: an ``ssl.SSLContext`` for ``wss://`` (default: verified system trust).
        proxy: ``True`` (honour proxy env vars), ``None`` or a proxy URL.
        extensions: offer envlink's protocol extensions to the server.
        tracer_provider: OpenTelemetry tracer provider (default: the global one).
        meter_provider: OpenTelemetry meter provider (default: the global one).
        connect_timeout_s: OpenEnv-compatible alias for ``Timeout(connect=...)``.
        message_timeout_s: OpenEnv-compatible alias for ``Timeout(call=...)``.
        max_message_size_mb: OpenEnv-compatible alias for ``max_message_size``.
        websocket_ping_interval_s: OpenEnv-compatible alias for ``ping_interval``.
        websocket_ping_timeout_s: OpenEnv-compatible alias for ``ping_timeout``.

    Raises:
        ValueError: for a malformed URL or option.
    """

    def __init__(
        self,
        base_url: str,
        *,
        timeout: TimeoutTypes | UnsetType = UNSET,
        headers: Mapping[str, str] | None = None,
        reconnect: ReconnectPolicy | None = None,
        on_session_lost: SessionLostPolicy = "raise",
        replay_verify: Callable[[dict[str, Any], dict[str, Any]], bool] | None = None,
        max_journal_steps: int = 10_000,
        ping_interval: float | None = 20.0,
        ping_timeout: float | None = 20.0,
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
        compression: str | None = None,
        ssl: Any = None,
        proxy: str | bool | None = True,
        extensions: bool = True,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
        connect_timeout_s: float | None = None,
        message_timeout_s: float | None = None,
        max_message_size_mb: float | None = None,
        websocket_ping_interval_s: float | UnsetType | None = UNSET,
        websocket_ping_timeout_s: float | UnsetType | None = UNSET,
    ) -> None:
        if on_session_lost not in ("raise", "replay", "resume"):
            raise ValueError(
                f"on_session_lost must be 'raise', 'replay' or 'resume', got {on_session_lost!r}"
            )
        self._endpoint = parse_endpoint(base_url)
        base = Timeout() if timeout is UNSET else Timeout.coerce(timeout)
        self.timeouts: Timeout = Timeout(
            connect=connect_timeout_s if connect_timeout_s is not None else base.connect,
            call=message_timeout_s if message_timeout_s is not None else base.call,
            close=base.close,
        )
        if max_message_size_mb is not None:
            max_message_size = int(max_message_size_mb * 1024 * 1024)
        if websocket_ping_interval_s is not UNSET:
            ping_interval = websocket_ping_interval_s
        if websocket_ping_timeout_s is not UNSET:
            ping_timeout = websocket_ping_timeout_s
        self._options = ConnectionOptions(
            headers=tuple((headers or {}).items()),
            ping_interval=ping_interval,
            ping_timeout=ping_timeout,
            max_message_size=max_message_size,
            compression=compression,
            ssl=ssl,
            proxy=proxy,
        )
        self.reconnect_policy: ReconnectPolicy = reconnect or ReconnectPolicy()
        self.on_session_lost: SessionLostPolicy = on_session_lost
        self._replay_verify = replay_verify or _same_answer
        self._offer_extensions = extensions
        self.tracer_provider = tracer_provider
        self.meter_provider = meter_provider
        self._tel = get_telemetry(tracer_provider, meter_provider)

        self._state = _State.IDLE
        self._pid = os.getpid()
        self._conn: Connection | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock: asyncio.Lock | None = None
        self._active: asyncio.Task[Any] | None = None
        self._journal = EpisodeJournal(max_steps=max_journal_steps)
        self._in_episode = False
        # Set when an episode could not continue on any session (recovery failed or a
        # fresh session replaced its own): step/state then raise until reset().
        self._lost_journal: EpisodeJournal | None = None
        self._session_id: str | None = None
        self._resume_token: str | None = None
        # Set when a call timed out but its connection was kept (request ids make a
        # late answer harmless); the next call first checks that the peer is alive.
        self._suspect = False
        self._background: set[asyncio.Task[None]] = set()
        self._last_conn_short_lived = False
        self._last_drop_at = 0.0
        self._flap_attempts = 0
        self._request_ids = itertools.count(1)
        self._id_prefix = uuid.uuid4().hex[:12]
        self._base_attrs: dict[str, Any] = {
            ATTR_RPC_SYSTEM: RPC_SYSTEM,
            ATTR_SERVER_ADDRESS: self._endpoint.host,
            ATTR_SERVER_PORT: self._endpoint.port,
        }

    # ------------------------------------------------------------------ properties

    @property
    def base_url(self) -> str:
        """The server's ``/ws`` URL (without credentials)."""
        return self._endpoint.ws_url

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called; a closed client cannot be reopened."""
        return self._state is _State.CLOSED

    @property
    def connected(self) -> bool:
        """Whether a connection is currently open."""
        return self._conn is not None and self._conn.is_open

    @property
    def session_id(self) -> str | None:
        """The server's public session id when it advertised one, else a client-side id.

        Never the resume token, which is a secret.
        """
        return self._session_id

    @property
    def journal(self) -> EpisodeJournal:
        """A copy of the current episode's journal."""
        return self._journal.snapshot()

    @property
    def extensions_active(self) -> bool:
        """Whether the current connection negotiated envlink's extensions."""
        return self._conn is not None and self._conn.extensions.enabled

    # ------------------------------------------------------------- typed-client hooks

    def _step_payload(self, action: ActT) -> dict[str, Any]:
        """Turn an action into the ``data`` of a step frame (override in typed clients)."""
        if isinstance(action, BaseModel):
            return action.model_dump(mode="json", exclude_none=True)
        if isinstance(action, Mapping):
            return dict(action)
        raise TypeError(
            f"action must be a dict or a pydantic model, got {type(action).__name__}; "
            "override _step_payload for other action types"
        )

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[ObsT]:
        """Turn an observation frame's ``data`` into a :class:`StepResult` (override)."""
        return StepResult(
            observation=cast(ObsT, payload.get("observation", {})),
            reward=payload.get("reward"),
            done=bool(payload.get("done", False)),
            metadata=payload.get("metadata"),
        )

    def _parse_state(self, payload: dict[str, Any]) -> StateT:
        """Turn a state frame's ``data`` into the state type (override)."""
        return cast(StateT, payload)

    # -------------------------------------------------------------------- public API

    async def connect(
        self, *, timeout: float | UnsetType | None = UNSET
    ) -> EnvClient[ActT, ObsT, StateT]:
        """Open the connection now (otherwise the first call opens it).

        Raises:
            ConnectError: the server could not be reached within the reconnect policy.
            CallTimeoutError: the deadline expired.
            ClientClosedError: the client was closed.
        """
        # The connect phase timeout bounds each attempt; the whole (re)connect loop is
        # bounded like any call.
        seconds = self._seconds(timeout)

        async def run(span: Span) -> None:
            async with self._serialised(span):
                if not self.connected:
                    await self._open(reason="connect", span=span)

        await self._traced("connect", run, seconds)
        return self

    async def reset(self, *, timeout: float | UnsetType | None = UNSET,
                    **kwargs: Any) -> StepResult[ObsT]:
        """Start a new episode.

        Args:
            timeout: this call's deadline (default: the client's call timeout).
            **kwargs: reset arguments for the environment (seed, episode_id, ...).

        Raises:
            ServerError: the server answered with an error frame.
            CallTimeoutError, ConnectError, ConnectionLostError, ProtocolError,
            ClientClosedError.
        """
        data = dict(kwargs)

        async def run(span: Span) -> StepResult[ObsT]:
            async with self._serialised(span):
                frame = await self._exchange_reliably("reset", data, span)
                obs = self._expect(frame, ObservationFrame, "reset")
                self._journal.record_reset(data, obs.raw_data)
                self._journal.episode_id = kwargs.get("episode_id") or uuid.uuid4().hex
                self._in_episode = True
                self._lost_journal = None
                return self._parse(self._parse_result, obs.raw_data, "observation")

        return await self._traced("reset", run, self._seconds(timeout))

    async def step(self, action: ActT, *, timeout: float | UnsetType | None = UNSET,
                   **kwargs: Any) -> StepResult[ObsT]:
        """Apply one action. Never applied twice, whatever fails.

        Args:
            action: the action (a dict, a pydantic model, or what ``_step_payload`` takes).
            timeout: this call's deadline (default: the client's call timeout).
            **kwargs: accepted for OpenEnv compatibility; unused.

        Raises:
            SessionLostError: the connection was lost mid-episode and the session could
                not be recovered under ``on_session_lost`` (carries the journal).
            ReplayDivergedError: replay gave a different observation.
            OutcomeUnknownError: the connection was lost after sending, outside an episode.
            ServerError, CallTimeoutError, ProtocolError, ClientClosedError.
        """
        payload = self._step_payload(action)

        async def run(span: Span) -> StepResult[ObsT]:
            async with self._serialised(span):
                if span.is_recording():
                    span.set_attribute(ATTR_STEP_INDEX, self._journal.step_count)
                frame = await self._exchange_reliably("step", payload, span)
                obs = self._expect(frame, ObservationFrame, "step")
                if self._in_episode:
                    self._journal.record_step(payload, obs.raw_data)
                return self._parse(self._parse_result, obs.raw_data, "observation")

        return await self._traced("step", run, self._seconds(timeout))

    async def state(self, *, timeout: float | UnsetType | None = UNSET) -> StateT:
        """Read the environment's state (episode id, step count, ...).

        Raises:
            SessionLostError, ServerError, CallTimeoutError, ProtocolError, ClientClosedError.
        """

        async def run(span: Span) -> StateT:
            async with self._serialised(span):
                frame = await self._exchange_reliably("state", None, span)
                st = self._expect(frame, StateFrame, "state")
                episode_id = st.data.get("episode_id")
                if isinstance(episode_id, str) and self._in_episode:
                    self._journal.episode_id = episode_id
                return self._parse(self._parse_state, st.data, "state")

        return await self._traced("state", run, self._seconds(timeout))

    async def disconnect(self, *, timeout: float | UnsetType | None = UNSET) -> None:
        """End the session (``{"type": "close"}``) and close the connection.

        The client stays usable: the next call opens a new connection and session.
        """
        seconds = self.timeouts.close if timeout is UNSET else self._seconds(timeout)
        if self.closed:
            return

        async def run(span: Span) -> None:
            async with self._serialised(span):
                await self._close_connection(graceful=True)

        await self._traced("disconnect", run, seconds)

    async def close(self, *, timeout: float | UnsetType | None = UNSET) -> None:
        """Close the client for good. Idempotent.

        A call in flight is cancelled and its caller gets :class:`ClientClosedError`,
        as does every queued or later call.
        """
        if self._state is _State.CLOSED:
            return
        seconds = self.timeouts.close if timeout is UNSET else self._seconds(timeout)
        self._drop_if_inherited()
        self._state = _State.CLOSED
        active = self._active
        if active is not None and not active.done() and active is not asyncio.current_task():
            active.cancel()
            # asyncio.wait raises nothing of the task's; a cancellation of the closer
            # itself is passed on.
            await asyncio.wait({active}, timeout=seconds)
        if self._background:
            await asyncio.wait(set(self._background), timeout=seconds)
        with self._tel.span("close", kind=SpanKind.CLIENT,
                            attributes=self._attrs("close")
                            if self._tel.tracing_enabled() else None):
            await self._close_connection(graceful=True, timeout=seconds)
        _log.debug("envlink.client_closed", session_id=self._session_id)

    async def __aenter__(self) -> EnvClient[ActT, ObsT, StateT]:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def sync(self, bridge: Bridge | None = None) -> SyncEnvClient[ActT, ObsT, StateT]:
        """A blocking facade that runs this client on a background event-loop thread.

        Args:
            bridge: share an existing :class:`~envlink.Bridge` (one thread for many
                clients); by default the facade owns a new one.
        """
        from envlink._sync import SyncEnvClient

        return SyncEnvClient(self, bridge=bridge)

    def call_deadline(self, method: str,
                      timeout: float | UnsetType | None = UNSET) -> float | None:
        """Seconds a call of ``method`` with this ``timeout`` may last at most (None: no limit).

        The sync facade waits this long, plus a margin, so that the client's own
        deadline (which cleans up properly) always fires before the bridge's.

        Args:
            method: ``connect``, ``reset``, ``step``, ``state``, ``disconnect``,
                ``close`` or any other coroutine method (bounded by the call deadline).
            timeout: the ``timeout=`` the call gets; ``UNSET`` for the default.
        """
        if method in ("disconnect", "close"):
            seconds = self.timeouts.close if timeout is UNSET else timeout
            # close() waits for the call in flight, then for the closing handshake.
            if method == "close" and seconds is not None:
                return 2 * seconds
            return seconds
        # connect() is bounded by the call deadline too (the connect phase bounds each
        # attempt within it).
        return self.timeouts.call if timeout is UNSET else timeout

    # --------------------------------------------------------------------- internals

    def _seconds(self, timeout: float | UnsetType | None) -> float | None:
        if timeout is UNSET:
            return self.timeouts.call
        if timeout is not None and not timeout > 0:
            raise ValueError(f"timeout must be a positive number of seconds or None, "
                             f"got {timeout!r}")
        return timeout

    def _attrs(self, method: str) -> dict[str, Any]:
        attrs = dict(self._base_attrs)
        attrs[ATTR_RPC_METHOD] = method
        if self._session_id is not None:
            attrs[ATTR_SESSION_ID] = self._session_id
        if self._in_episode and self._journal.episode_id is not None:
            attrs[ATTR_EPISODE_ID] = self._journal.episode_id
        return attrs

    async def _traced(self, method: str, run: Callable[[Span], Awaitable[_R]],
                      seconds: float | None) -> _R:
        """Run one public call under its span, deadline and metrics."""
        if self._state is _State.CLOSED:
            raise ClientClosedError("the client is closed")
        tel = self._tel
        metric_attrs = {ATTR_RPC_METHOD: method}
        tel.add(tel.inflight, 1, metric_attrs)
        start = time.perf_counter()
        outcome = "ok"
        error_type: str | None = None
        try:
            attributes = self._attrs(method) if tel.tracing_enabled() else None
            with tel.span(method, kind=SpanKind.CLIENT, attributes=attributes) as span:
                try:
                    async with _deadline(seconds, method):
                        return await run(span)
                except asyncio.CancelledError as exc:
                    if self.closed:
                        raise ClientClosedError(f"the client was closed during {method}") from exc
                    raise
        except BaseException as exc:
            error_type = error_type_of(exc)
            outcome = "timeout" if isinstance(exc, CallTimeoutError) else (
                "cancelled" if isinstance(exc, asyncio.CancelledError) else "error")
            if isinstance(exc, Exception):
                tel.add(tel.errors, 1, {ATTR_RPC_METHOD: method, ATTR_ERROR_TYPE: error_type})
                _log.info("envlink.call_failed", method=method, error_type=error_type,
                          error=str(exc), session_id=self._session_id)
            raise
        finally:
            tel.add(tel.inflight, -1, metric_attrs)
            attrs: dict[str, Any] = {ATTR_RPC_SYSTEM: RPC_SYSTEM, ATTR_RPC_METHOD: method,
                                     ATTR_OUTCOME: outcome}
            if error_type is not None:
                attrs[ATTR_ERROR_TYPE] = error_type
            tel.record(tel.call_duration, time.perf_counter() - start, attrs)

    @contextlib.asynccontextmanager
    async def _serialised(self, span: Span) -> AsyncIterator[None]:
        """One request in flight per session; callers wait FIFO (asyncio.Lock is fair)."""
        lock = self._bind_loop()
        queued = time.perf_counter()
        async with lock:
            if span.is_recording():
                span.set_attribute(ATTR_QUEUE_WAIT, time.perf_counter() - queued)
            if self._state is _State.CLOSED:
                raise ClientClosedError("the client is closed")
            self._active = asyncio.current_task()
            try:
                yield
            finally:
                self._active = None

    def _lose_episode(self) -> None:
        """The episode cannot go on: later step/state calls raise until reset()."""
        if self._in_episode:
            self._lost_journal = self._journal.snapshot()
        self._in_episode = False

    def _drop_if_inherited(self) -> None:
        """In a forked child, forget the parent's connection without any I/O on it.

        The socket is shared with the parent: a close frame or even a shutdown from
        the child would end the parent's session. The child starts afresh instead.
        """
        if self._pid != os.getpid():
            self._pid = os.getpid()
            self._conn = None
            self._loop = None
            self._lock = None
            self._active = None
            self._lose_episode()
            self._suspect = False
            self._resume_token = None
            self._background = set()

    def _bind_loop(self) -> asyncio.Lock:
        self._drop_if_inherited()
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._lock is None:
            if (
                self._loop is not None and not self._loop.is_closed()
                and self._conn is not None and self._conn.is_open
            ):
                raise EnvlinkError(
                    "this client has an open connection on another event loop; use one "
                    "client per loop (or client.sync() from threads)"
                )
            self._loop = loop
            self._lock = asyncio.Lock()
            self._conn = None
            self._background = set()  # tasks of a previous loop are not ours to await
            self._lose_episode()
        return self._lock

    def _expect(self, frame: _Frame, kind: type[Any], method: str) -> Any:
        if isinstance(frame, ErrorFrame):
            raise ServerError.from_frame(frame.data.message, frame.data.code)
        if not isinstance(frame, kind):
            # A valid frame of the wrong kind: the stream is out of step, which on the
            # plain protocol means it can no longer be trusted.
            self._discard_connection()
            raise ProtocolError(f"expected a {kind.__name__} in answer to {method}, "
                                f"got a {frame.type!r} frame")
        return frame

    def _parse(self, hook: Callable[[dict[str, Any]], _R], data: dict[str, Any],
               what: str) -> _R:
        try:
            return hook(data)
        except EnvlinkError:
            raise
        except Exception as exc:
            raise ProtocolError(f"could not parse the server's {what}: {exc}") from exc

    async def _exchange_reliably(self, method: str, data: dict[str, Any] | None,
                                 span: Span) -> _Frame:
        """Send one request and return its answer, reconnecting/recovering per policy."""
        if self._lost_journal is not None and method != "reset":
            raise SessionLostError(
                f"the episode was lost after {self._lost_journal.step_count} steps and could "
                f"not be recovered; call reset() to start a new one before {method}()",
                journal=self._lost_journal.snapshot(),
            )
        request_id: str | None = None
        attempt = 0
        limit = self.reconnect_policy.max_attempts + 1
        while True:
            attempt += 1
            conn = self._conn
            if conn is not None and self._suspect:
                self._suspect = False
                if method == "reset":
                    # A new episode need not queue behind the old one's late answer;
                    # the old session is ended rather than left holding a server slot.
                    token = self._resume_token
                    self._discard_connection()
                    conn = None
                    if token is not None:
                        await self._release_session(token)
                elif not await conn.probe(self._probe_timeout()):
                    _log.info("envlink.peer_unresponsive", session_id=self._session_id)
                    self._discard_connection()
                    conn = None
            if conn is None or not conn.is_open:
                self._conn = None
                if self._in_episode and method != "reset":
                    return await self._recover(method, data, span, request_id, cause=None)
                conn = await self._open(reason="connect" if attempt == 1 else "retry", span=span)
            if request_id is None and conn.extensions.enabled:
                request_id = self._next_id()
            self._tel.add(self._tel.attempts, 1,
                          {ATTR_RPC_METHOD: method, ATTR_RETRY: attempt > 1})
            try:
                if attempt == 1:
                    return await self._exchange(conn, method, data, request_id)
                with self._tel.span(f"{method} attempt", attributes={
                    ATTR_ATTEMPT: attempt, ATTR_TRANSPARENT: True, ATTR_RPC_METHOD: method,
                }):
                    return await self._exchange(conn, method, data, request_id)
            except NotWrittenError:
                # Provably never reached the server: resending is safe for every method.
                self._forget_connection()
                if attempt >= limit:
                    raise
            except ConnectionLostError as exc:
                self._forget_connection()
                if self._in_episode and method != "reset":
                    return await self._recover(method, data, span, request_id, cause=exc)
                if method not in _IDEMPOTENT:
                    raise OutcomeUnknownError(
                        f"connection lost after {method} was sent; the server may or may not "
                        "have applied it, so it is not resent"
                    ) from exc
                if attempt >= limit:
                    raise

    def _probe_timeout(self) -> float:
        return min(self._options.ping_timeout or 2.0, 2.0)

    def _next_id(self) -> str:
        return f"{self._id_prefix}-{next(self._request_ids)}"

    def _make_request(self, method: str, data: dict[str, Any] | None,
                      request_id: str | None) -> _Request:
        ext: dict[str, Any] = {}
        if request_id is not None:
            carrier: dict[str, str] = {}
            propagate.inject(carrier)
            ext = {"id": request_id, "traceparent": carrier.get("traceparent"),
                   "tracestate": carrier.get("tracestate")}
        try:
            if method == "reset":
                return ResetRequest(data=data or {}, **ext)
            if method == "step":
                return StepRequest(data=data or {}, **ext)
        except ValidationError as exc:
            raise TypeError(f"{method} data must be a JSON object with string keys: "
                            f"{exc.errors(include_url=False)[0]['msg']}") from exc
        if method == "state":
            return StateRequest(**ext)
        return CloseRequest(**ext)

    async def _exchange(self, conn: Connection, method: str, data: dict[str, Any] | None,
                        request_id: str | None) -> _Frame:
        """One request, one answer, on one connection. No retry here."""
        text = encode_request(self._make_request(method, data, request_id))
        tel = self._tel
        tel.record(tel.message_size, len(text), {ATTR_DIRECTION: "sent"})
        # From the moment send() is entered the frame may be on the wire (websockets
        # buffers it whole, then waits for the buffer to drain): only NotWrittenError
        # proves otherwise. A cancellation after this point must treat it as sent.
        sent = True
        try:
            try:
                await conn.send(text)
            except NotWrittenError:
                sent = False
                buffered = await conn.take_buffered()
                if buffered is not None:
                    early = decode_response(buffered, max_size=self._options.max_message_size)
                    if isinstance(early, ErrorFrame):
                        raise ServerError.from_frame(early.data.message, early.data.code) from None
                raise
            while True:
                raw = await conn.recv()
                tel.record(tel.message_size, len(raw), {ATTR_DIRECTION: "received"})
                try:
                    frame = decode_response(raw, max_size=self._options.max_message_size)
                except ProtocolError as exc:
                    if conn.late_answers:
                        raise self._unattributable(conn, exc) from exc
                    raise
                if request_id is not None and frame.id != request_id:
                    if frame.id is None:
                        if conn.late_answers:
                            raise self._unattributable(conn, None)
                        return frame  # an answer without id can only be ours
                    # The late answer of an earlier, timed-out call: never deliver it.
                    conn.late_answers = max(0, conn.late_answers - 1)
                    _log.debug("envlink.stale_answer_dropped", id=frame.id, expected=request_id)
                    continue
                return frame
        except ProtocolError:
            if not conn.extensions.enabled:
                # Without request ids a bad frame leaves the stream's alignment unknown.
                self._discard_connection()
            raise
        except (asyncio.CancelledError, CallTimeoutError):
            if sent:
                if conn.extensions.enabled and request_id is not None:
                    self._suspect = True
                    conn.late_answers += 1
                else:
                    # An answer may still arrive and would be read by the next call.
                    self._discard_connection()
            raise

    async def _release_session(self, token: str) -> None:
        """End a detached server session the client gives up on. Best effort, bounded.

        Re-attaches with the resume token (taking the session over from any stalled
        connection) and sends ``close``; the server then destroys it at once instead
        of keeping it, and its slot, for the whole grace window.
        """
        seconds = min(self.timeouts.close or 5.0, 5.0)

        async def release() -> None:
            conn = await open_connection(
                self._endpoint, self._options, extra_headers={RESUME_TOKEN_HEADER: token},
                open_timeout=seconds,
            )
            try:
                if conn.extensions.resumed:
                    await conn.send(encode_request(CloseRequest()))
                    with contextlib.suppress(EnvlinkError):
                        await conn.recv()  # returns when the server has ended it
            finally:
                conn.abort()

        try:
            await asyncio.wait_for(release(), seconds)
        except (EnvlinkError, asyncio.TimeoutError, TimeoutError) as exc:
            _log.debug("envlink.session_release_failed", error=str(exc))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run housekeeping in the background; close() waits for it (bounded)."""
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _unattributable(self, conn: Connection, cause: ProtocolError | None
                        ) -> ConnectionLostError:
        """A frame that may answer a timed-out request: the stream can't be trusted."""
        _log.info("envlink.unattributable_frame", session_id=self._session_id,
                  reason=cause.reason if cause else "frame without request id")
        # Handled like a lost connection: recovery (resume with the same request id,
        # which the server de-duplicates) finishes the current call safely.
        return ConnectionLostError(
            "a frame arrived that may answer an earlier, timed-out request "
            f"({cause.reason if cause else 'no request id'}); the connection was dropped"
        )

    def _forget_connection(self) -> None:
        """The connection failed: drop it, and remember whether it had been stable."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        conn.abort()
        self._last_drop_at = time.monotonic()
        if self._last_drop_at - conn.opened_at < self.reconnect_policy.stable_after:
            # Flapping: the next outage continues this one's attempt count.
            self._last_conn_short_lived = True
        else:
            self._last_conn_short_lived = False
            self._flap_attempts = 0

    def _discard_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.abort()
            _log.debug("envlink.connection_discarded", session_id=self._session_id)

    async def _close_connection(self, *, graceful: bool, timeout: float | None = None) -> None:
        conn, self._conn = self._conn, None
        self._in_episode = False
        self._lost_journal = None
        self._resume_token = None
        self._suspect = False
        if conn is None:
            return
        seconds = self.timeouts.close if timeout is None else timeout
        if graceful and conn.is_open:
            rid = self._next_id() if conn.extensions.enabled else None
            frame = encode_request(self._make_request("close", None, rid))
            with contextlib.suppress(EnvlinkError, asyncio.TimeoutError, TimeoutError):
                await asyncio.wait_for(conn.send(frame), seconds)
        await conn.close(seconds)
        _log.debug("envlink.disconnect", session_id=self._session_id)

    async def _open(self, *, reason: str, span: Span | None = None,
                    resume_token: str | None = None) -> Connection:
        """Open a connection under the reconnect policy (tenacity)."""
        policy = self.reconnect_policy
        if self._last_conn_short_lived and (
                time.monotonic() - self._last_drop_at > policy.stable_after):
            # Quiet for long enough since the last drop: that outage is over.
            self._last_conn_short_lived = False
            self._flap_attempts = 0
        used = self._flap_attempts if self._last_conn_short_lived else 0
        is_reconnect = reason != "connect"
        if is_reconnect:
            self._tel.add(self._tel.reconnects, 1, {ATTR_REASON: reason})

        async def before_sleep(state: RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome else None
            delay = state.upcoming_sleep
            etype = error_type_of(exc) if exc is not None else "unknown"
            if span is not None and span.is_recording():
                span.add_event(EVENT_RECONNECT_SCHEDULED, {
                    ATTR_DELAY: delay, ATTR_ERROR_TYPE: etype,
                    ATTR_ATTEMPT: state.attempt_number,
                })
            _log.info("envlink.reconnect_scheduled", delay_s=round(delay, 4), error_type=etype,
                      attempt=state.attempt_number, reason=reason, url=self._endpoint.display)

        if used >= policy.max_attempts:
            # Report the flapping once; the next call starts a new outage.
            self._last_conn_short_lived = False
            self._flap_attempts = 0
            raise ConnectionLostError(
                f"the connection to {self._endpoint.display} keeps dropping: {used} reconnects "
                f"without a connection lasting {policy.stable_after:g} s"
            )
        retrying = build_retrying(policy, sleep=_backoff_sleep, attempts_used=used,
                                  before_sleep=before_sleep)
        last_exc: BaseException | None = None
        conn: Connection | None = None
        tries = 0
        async for attempt in retrying:
            with attempt:
                tries += 1
                number = tries + used
                if tries > 1 and policy.budget is not None and not policy.budget.try_spend():
                    raise RetryBudgetExhaustedError(
                        "the shared retry budget refused a reconnect attempt"
                    ) from last_exc
                try:
                    conn = await self._open_once(number, reason, resume_token)
                except EnvlinkError as exc:
                    last_exc = exc
                    raise
        assert conn is not None
        if self._last_conn_short_lived:
            self._flap_attempts += tries
        if policy.budget is not None:
            policy.budget.record_success()
        return conn

    async def _open_once(self, attempt: int, reason: str, resume_token: str | None) -> Connection:
        attrs = dict(self._base_attrs)
        attrs[ATTR_ATTEMPT] = attempt
        attrs[ATTR_REASON] = reason
        with self._tel.span("connect", kind=SpanKind.CLIENT, attributes=attrs) as span:
            headers: dict[str, str] = {}
            propagate.inject(headers)
            if resume_token is not None:
                headers[RESUME_TOKEN_HEADER] = resume_token
            _log.debug("envlink.connect", url=self._endpoint.display, attempt=attempt,
                       reason=reason)
            conn = await open_connection(
                self._endpoint, self._options, extra_headers=headers,
                open_timeout=self.timeouts.connect, offer_extensions=self._offer_extensions,
            )
            self._on_connected(conn)
            if span.is_recording():
                span.set_attribute(ATTR_SESSION_ID, self._session_id or "")
                span.set_attribute(ATTR_EXTENSIONS, conn.extensions.enabled)
            _log.debug("envlink.connected", url=self._endpoint.display,
                       session_id=self._session_id, extensions=conn.extensions.enabled)
            return conn

    def _on_connected(self, conn: Connection) -> None:
        previous = self._conn
        if previous is not None and previous is not conn:
            previous.abort()
        self._conn = conn
        ext = conn.extensions
        if self._in_episode and not ext.resumed:
            # A fresh server session cannot carry on this episode; replay rebuilds it
            # (and says so), anything else must not run on it unnoticed.
            self._lose_episode()
        # The resume token is a secret: telemetry gets the server's public id, or ours.
        self._session_id = ext.session_id or uuid.uuid4().hex[:16]
        self._resume_token = ext.session_token if ext.can_resume else None

    # ---------------------------------------------------------------- session recovery

    async def _recover(self, method: str, data: dict[str, Any] | None, span: Span,
                       request_id: str | None, *, cause: BaseException | None) -> _Frame:
        """The session was lost mid-episode: apply ``on_session_lost``, then finish the call."""
        policy = self.on_session_lost
        journal = self._journal
        tel = self._tel
        _log.warning("envlink.session_lost", method=method, policy=policy,
                     session_id=self._session_id, steps=journal.step_count,
                     error=str(cause) if cause else None)
        if span.is_recording():
            span.add_event(EVENT_SESSION_LOST, {ATTR_POLICY: policy})
        token = self._resume_token
        result = "failed"
        if token is not None and policy != "resume":
            # The server keeps the detached session for its grace window: end it, so it
            # does not hold a slot (replay needs one right away; "raise" does not wait).
            self._resume_token = None
            if policy == "replay":
                await self._release_session(token)
            else:
                self._spawn(self._release_session(token))
        try:
            try:
                if policy == "resume" and token is not None:
                    frame = await self._resume(method, data, token, request_id)
                    if frame is not None:
                        result = "ok"
                        return frame
                elif policy == "replay" and journal.replayable:
                    frame = await self._replay_then(method, data)
                    result = "ok"
                    return frame
                elif policy == "replay":
                    raise SessionLostError(
                        "the session was lost and cannot be replayed: the journal exceeded "
                        f"max_journal_steps={journal.max_steps}", journal=journal.snapshot()
                    ) from cause
            except (ConnectError, ConnectionLostError) as exc:
                raise SessionLostError(
                    f"connection lost mid-episode during {method}; {policy} recovery failed: "
                    f"{exc}", journal=journal.snapshot(),
                ) from exc
            reason = ("the server does not offer session resumption"
                      if policy == "resume" and token is None else
                      "the server no longer has the session" if policy == "resume" else
                      "on_session_lost='raise'")
            if method == "step" and cause is not None:
                reason += "; the outcome of the interrupted step is unknown"
            raise SessionLostError(
                f"connection lost mid-episode during {method} ({reason}); the episode cannot "
                f"continue after {journal.step_count} steps", journal=journal.snapshot(),
            ) from cause
        except BaseException as exc:
            if isinstance(exc, ReplayDivergedError):
                result = "diverged"
            # Whatever was half rebuilt is not the episode: never run a later call on it.
            self._discard_connection()
            self._in_episode = False
            self._lost_journal = journal.snapshot()
            raise
        finally:
            tel.add(tel.recoveries, 1, {ATTR_POLICY: policy, ATTR_RESULT: result})
            if result == "ok":
                _log.info("envlink.session_recovered", policy=policy,
                          session_id=self._session_id, steps=journal.step_count)

    async def _resume(self, method: str, data: dict[str, Any] | None, token: str,
                      request_id: str | None) -> _Frame | None:
        # Same request id on every resend: if the server applied it before a drop,
        # its de-duplication answers from cache instead of applying it again.
        rid = request_id or self._next_id()
        limit = self.reconnect_policy.max_attempts
        for round_ in range(1, limit + 1):
            with self._tel.span("resume", attributes={ATTR_RPC_METHOD: method,
                                                      ATTR_ATTEMPT: round_}):
                conn = await self._open(reason="resume", resume_token=token)
                if not conn.extensions.resumed:
                    # The server no longer has the session (grace window over).
                    return None
                try:
                    return await self._exchange(conn, method, data, rid)
                except ConnectionLostError:
                    self._forget_connection()
                    if round_ >= limit:
                        raise
        raise AssertionError("unreachable")  # pragma: no cover

    async def _replay_then(self, method: str, data: dict[str, Any] | None) -> _Frame:
        journal = self._journal
        limit = self.reconnect_policy.max_attempts
        for round_ in range(1, limit + 1):
            with self._tel.span("replay", attributes={
                ATTR_ATTEMPT: round_, ATTR_REPLAY_STEPS: journal.step_count,
            }):
                conn = await self._open(reason="replay")
                try:
                    await self._replay(conn, journal)
                    rid = self._next_id() if conn.extensions.enabled else None
                    return await self._exchange(conn, method, data, rid)
                except ConnectionLostError:
                    self._forget_connection()
                    if round_ >= limit:
                        raise
        raise AssertionError("unreachable")  # pragma: no cover

    async def _replay(self, conn: Connection, journal: EpisodeJournal) -> None:
        def check(index: int, recorded: dict[str, Any] | None, frame: _Frame) -> None:
            if isinstance(frame, ErrorFrame):
                raise ReplayDivergedError(
                    f"replay of step {index} failed on the server: [{frame.data.code}] "
                    f"{frame.data.message}", index=index, expected=recorded,
                    actual=frame.data.model_dump(), journal=journal.snapshot())
            actual = frame.raw_data if isinstance(frame, ObservationFrame) else frame.data
            if recorded is None or not self._replay_verify(recorded, actual):
                _log.error("envlink.replay_diverged", index=index, session_id=self._session_id)
                raise ReplayDivergedError(
                    f"replay diverged at {'reset' if index < 0 else f'step {index}'}: the server "
                    "answered differently than it did originally", index=index,
                    expected=recorded, actual=actual, journal=journal.snapshot())

        rid = self._next_id() if conn.extensions.enabled else None
        check(-1, journal.reset_response,
              await self._exchange(conn, "reset", journal.reset_kwargs, rid))
        for index, entry in enumerate(journal.entries):
            rid = self._next_id() if conn.extensions.enabled else None
            check(index, entry.response, await self._exchange(conn, "step", entry.action, rid))
        self._in_episode = True
        self._lost_journal = None


async def _backoff_sleep(seconds: float) -> None:
    if seconds > 0 and not testing_enabled():
        await asyncio.sleep(seconds)


def _same_answer(recorded: dict[str, Any], actual: dict[str, Any]) -> bool:
    return recorded == actual


class GenericEnvClient(EnvClient[dict[str, Any], dict[str, Any], dict[str, Any]]):
    """A client for any environment, with dict actions, observations and state.

    Actions may also be pydantic models (dumped to dicts).
    """
