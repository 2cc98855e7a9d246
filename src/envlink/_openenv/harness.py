"""A client for OpenEnv 0.10's ``/harness`` stream (RFC 005): typed events of agent turns.

One :class:`HarnessClient` is one harness session on the server's ``/harness``
WebSocket. The server starts it with ``session_started``; each :meth:`~HarnessClient.send`
is one turn, an async iterator of :class:`HarnessEvent` (``llm_request``,
``llm_response``, ``llm_chunk``, ``tool_call``, ``tool_result``, ``text_output``,
``error``, ``turn_complete``) ending with ``turn_complete``. A frame the server
rejects gets a recoverable ``protocol_error`` (:class:`HarnessProtocolError`; the
session goes on); a failed turn a terminal ``error`` event
(:class:`HarnessTurnError`; the server ends the session). Each turn has a deadline
and is reported to the client's hooks as a call ``harness_turn`` (a span).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Iterator, Mapping
from dataclasses import replace
from enum import Enum
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, Field, ValidationError

from envlink._bridge.dispatch import close_after_failed_enter
from envlink._client.configuration import COMMON_OPTIONS, CommonOptions, check_keywords
from envlink._config import (
    UNSET,
    ConnectionOptions,
    Timeout,
    UnsetType,
    call_seconds,
)
from envlink._deadlines import bounded_at, deadline
from envlink._errors import (
    CallTimeoutError,
    ClientClosedError,
    EnvlinkError,
    HarnessProtocolError,
    HarnessTurnError,
    ProtocolError,
    ServerError,
)
from envlink._events.client_events import (
    CallFinished,
    CallStarted,
    ClientHook,
    combine_client_hooks,
)
from envlink._sync.facade import TIMEOUT_MARGIN, BlockingFacade, blocking_iterate
from envlink._transports.base import Connection, parse_endpoint
from envlink.names import (
    OUTCOME_CANCELLED,
    OUTCOME_ERROR,
    OUTCOME_OK,
    OUTCOME_TIMEOUT,
    SPAN_HARNESS_TURN,
)

if sys.version_info >= (3, 11):
    from typing import Unpack
else:  # typing_extensions comes with pydantic
    from typing_extensions import Unpack

if TYPE_CHECKING:
    from envlink._bridge import Bridge

__all__ = ["HarnessClient", "HarnessEvent", "HarnessEventType", "HarnessProtocolError",
           "HarnessTurnError", "SyncHarnessClient"]

HARNESS_TURN = SPAN_HARNESS_TURN

_T = TypeVar("_T")


class HarnessEventType(str, Enum):
    """The kinds of events of a harness turn (OpenEnv's ``HarnessEventType``)."""

    LLM_REQUEST = "llm_request"
    LLM_RESPONSE = "llm_response"
    LLM_CHUNK = "llm_chunk"
    TOOL_CALL = "tool_call"
    TOOL_RESULT = "tool_result"
    TEXT_OUTPUT = "text_output"
    ERROR = "error"
    TURN_COMPLETE = "turn_complete"


class HarnessEvent(BaseModel):
    """One event of a harness turn, as OpenEnv's ``HarnessEvent``.

    Attributes:
        type: what happened.
        timestamp: when (Unix time, the server's clock).
        data: the event's payload (``tool_name``/``arguments`` of a ``tool_call``,
            ``text`` of a ``text_output``, ``response`` of a ``turn_complete``...).
    """

    type: HarnessEventType
    timestamp: float = Field(default_factory=time.time)
    data: dict[str, Any] = Field(default_factory=dict)


class HarnessClient:
    """A harness session on an OpenEnv 0.10 server's ``/harness`` endpoint.

    Example::

        async with HarnessClient("http://127.0.0.1:8000") as harness:
            async for event in harness.send("list the files"):
                print(event.type, event.data)

    From blocking code, :meth:`sync`::

        with HarnessClient("http://127.0.0.1:8000").sync() as harness:
            for event in harness.send("list the files"):
                print(event.type, event.data)

    Args:
        base_url: ``http(s)://`` or ``ws(s)://`` URL of the server (``/harness`` is added).
        timeout: a :class:`~envlink.Timeout`; ``connect`` bounds opening the session,
            ``call`` each turn (from the message to ``turn_complete``), ``close`` closing.
        headers: extra handshake headers (e.g. ``Authorization``); never logged.
        transport: how the connection is opened: a transport, or ``"auto"``
            (default), ``"websockets"`` or ``"picows"`` (as :class:`~envlink.ClientConfig`'s).
        hooks: observers (each turn is a call ``harness_turn``); default envlink's
            OpenTelemetry emitter on the given providers.
        tracer_provider: OpenTelemetry tracer provider (default: the global one).
        meter_provider: OpenTelemetry meter provider (default: the global one).

    These keywords are the ones every envlink client takes, declared once in
    ``CommonOptions`` (``envlink._client.configuration``).

    Raises:
        ValueError: for a malformed URL.
        TypeError: a keyword it does not take (``reconnect``..., which are
            :class:`~envlink.EnvClient`'s alone).
    """

    def __init__(self, base_url: str, **options: Unpack[CommonOptions]) -> None:
        if options and not COMMON_OPTIONS.issuperset(options):
            check_keywords(options, COMMON_OPTIONS, f"{type(self).__name__}()")
        timeout = options.get("timeout", UNSET)
        headers = options.get("headers")
        transport = options.get("transport")
        hooks = options.get("hooks")
        endpoint = parse_endpoint(base_url)
        ws = endpoint.ws_url
        self._endpoint = replace(endpoint, ws_url=ws[: -len("/ws")] + "/harness")
        self.timeouts = Timeout() if timeout is UNSET else Timeout.coerce(timeout)
        self._options = ConnectionOptions(headers=tuple((headers or {}).items()))
        if transport is None or isinstance(transport, str):
            from envlink._transports.choice import transport_named

            transport = transport_named(transport)
        self._transport = transport
        if hooks is None:
            from envlink._telemetry.client_hook import ClientTelemetryHook

            self._hook: ClientHook = ClientTelemetryHook(
                options.get("tracer_provider"), options.get("meter_provider"),
                url=self._endpoint.display)
        else:
            self._hook = combine_client_hooks(list(hooks))
        self._conn: Connection | None = None
        self._closed = False
        self._busy = False
        #: ``session_id`` and ``harness`` of the server's ``session_started``.
        self.session_id: str | None = None
        self.harness: str | None = None
        #: Whether the server's ``session_started`` advertised training captures
        #: (``training_trace: true``, envlink's extension): each model call's
        #: ``llm_response`` then carries a ``training_turn``.
        self.training_trace = False

    async def connect(self) -> HarnessClient:
        """Open the session and wait for ``session_started`` (under the connect timeout).

        Raises:
            ConnectError: the server could not be reached or refused the upgrade.
            ServerError: the server refused the session (``CAPACITY_REACHED``...).
            ProtocolError: the server's first frame is not ``session_started``.
            CallTimeoutError, ClientClosedError.
        """
        if self._closed:
            raise ClientClosedError("the harness client is closed")
        if self._conn is not None:
            return self
        seconds = self.timeouts.connect
        conn = await self._transport.connect(self._endpoint, self._options, headers={},
                                             timeout=seconds, offer_extensions=False)
        try:
            async with deadline(seconds, "harness connect"):
                frame = _decode(await conn.recv())
        except BaseException:
            conn.abort()
            raise
        if frame.get("type") == "error":
            conn.abort()
            data = _data(frame)
            raise ServerError.from_frame(
                str(data.get("message", "session refused")), str(data.get("code", "UNKNOWN")),
                active_sessions=data.get("active_sessions"), max_sessions=data.get("max_sessions"))
        if frame.get("type") != "session_started":
            conn.abort()
            raise ProtocolError(f"expected session_started on /harness, got {frame.get('type')!r}")
        data = _data(frame)
        self.session_id = data.get("session_id") if isinstance(data.get("session_id"), str) \
            else None
        self.harness = data.get("harness") if isinstance(data.get("harness"), str) else None
        self.training_trace = data.get("training_trace") is True
        self._conn = conn
        return self

    async def send(self, content: str, *, timeout: float | UnsetType | None = UNSET,
                   sampling: Mapping[str, Any] | None = None) -> AsyncIterator[HarnessEvent]:
        """Run one turn: send ``content``, yield its events through ``turn_complete``.

        Args:
            content: the user message of the turn.
            timeout: the turn's deadline (default: the client's call timeout).
            sampling: the sampling policy the harness's model calls should use (a
                trainer's policy, for loop-owning training), sent with the message as
                ``sampling``; a server that does not know the field ignores it.

        Raises:
            HarnessProtocolError: the server rejected the message (recoverable).
            HarnessTurnError: the turn failed (terminal: the session is over).
            CallTimeoutError: the turn did not complete in time (the session is dropped:
                its late events could not be told from the next turn's).
            ProtocolError, ConnectionLostError, ClientClosedError.
        """
        if not isinstance(content, str):
            raise TypeError(f"content must be a str, got {type(content).__name__}")
        seconds = call_seconds(timeout, self.timeouts.call)
        if self._busy:
            raise EnvlinkError("a turn is already streaming on this harness session")
        conn = self._conn or (await self.connect())._conn
        assert conn is not None
        endpoint = self._endpoint
        token = self._hook.call_started(CallStarted(
            HARNESS_TURN, endpoint.host, endpoint.port, self.session_id, None))
        start = time.perf_counter()
        error: BaseException | None = None
        self._busy = True
        try:
            # The turn's deadline bounds each wait, not a block around the yields: each
            # item of a blocking iteration is fetched by a task of its own.
            when = None if seconds is None else asyncio.get_running_loop().time() + seconds
            message: dict[str, Any] = {"type": "message", "content": content}
            if sampling is not None:
                message["sampling"] = dict(sampling)
            await _by(when, seconds, conn.send(json.dumps(message)))
            while True:
                frame = _decode(await _by(when, seconds, conn.recv()))
                kind = frame.get("type")
                if kind == "protocol_error":
                    data = _data(frame)
                    raise HarnessProtocolError(str(data.get("message", "protocol error")),
                                               str(data.get("code", "PROTOCOL_ERROR")))
                try:
                    event = HarnessEvent.model_validate(frame)
                except ValidationError as exc:
                    self._drop()
                    raise ProtocolError(f"not a harness event: {exc}") from exc
                if event.type is HarnessEventType.ERROR and not event.data.get(
                        "recoverable", False):
                    self._drop()
                    raise HarnessTurnError(str(event.data.get("message", "turn failed")),
                                           "HARNESS_ERROR", details=event.data)
                yield event
                if event.type is HarnessEventType.TURN_COMPLETE:
                    return
        except CallTimeoutError as exc:
            error = exc
            self._drop()
            raise
        except BaseException as exc:
            error = exc
            raise
        finally:
            self._busy = False
            outcome = OUTCOME_OK if error is None else (
                OUTCOME_TIMEOUT if isinstance(error, CallTimeoutError) else
                OUTCOME_CANCELLED if isinstance(error, GeneratorExit) else OUTCOME_ERROR)
            self._hook.call_finished(CallFinished(
                HARNESS_TURN, outcome, time.perf_counter() - start,
                None if isinstance(error, GeneratorExit) else error, None, None,
                self.session_id, endpoint.host, endpoint.port), token)

    async def turn(self, content: str, *, timeout: float | UnsetType | None = UNSET,
                   sampling: Mapping[str, Any] | None = None) -> list[HarnessEvent]:
        """Run one turn and return all its events (the last one is ``turn_complete``).

        Raises:
            As :meth:`send`.
        """
        return [event async for event in self.send(content, timeout=timeout,
                                                   sampling=sampling)]

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.abort()

    def call_deadline(self, method: str,
                      timeout: float | UnsetType | None = UNSET) -> float | None:
        """Seconds a call of ``method`` with this ``timeout`` may last at most (None: no limit).

        The sync facade waits this long, plus a margin, so that the client's own
        deadline always fires first. ``connect`` opens the connection and then waits for
        ``session_started``, each under the connect deadline; a turn (``send``,
        ``turn``) opens the session first when it is not open, then runs under its
        ``timeout`` (default: the call deadline); ``close`` closes under the close deadline.

        Args:
            method: ``connect``, ``send``, ``turn``, ``close``, or another coroutine method
                (bounded as a turn).
            timeout: the ``timeout=`` the call gets; ``UNSET`` for the default.
        """
        timeouts = self.timeouts
        if method == "close":
            return timeouts.close if timeout is UNSET else timeout
        connect = None if timeouts.connect is None else 2 * timeouts.connect
        if method == "connect":
            return connect if timeout is UNSET else timeout
        call = timeouts.call if timeout is UNSET else timeout
        return None if call is None or connect is None else connect + call

    async def close(self) -> None:
        """End the session (closes the connection; the server ends the harness). Idempotent."""
        self._closed = True
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.close(self.timeouts.close)

    async def __aenter__(self) -> HarnessClient:
        return await self.connect()

    def sync(self, bridge: Bridge | None = None) -> SyncHarnessClient:
        """A blocking facade on a bridge: ``send()`` is an iterator, ``turn()`` blocks.

        Args:
            bridge: share an existing :class:`~envlink.Bridge`; by default the facade
                owns a new one, closed with the session.
        """
        return SyncHarnessClient(self, bridge)

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class SyncHarnessClient(BlockingFacade[HarnessClient]):
    """The blocking form of a :class:`HarnessClient` (see :meth:`HarnessClient.sync`).

    The blocking facade of the client and the pool (:class:`~envlink.SyncEnvClient`), on
    a harness session: each wait is the client's own deadline for the call
    (:meth:`HarnessClient.call_deadline`, from its :class:`~envlink.Timeout`) plus the
    margin, so that the client's :class:`~envlink.CallTimeoutError` comes first; a
    ``timeout=`` given is checked once and becomes the turn's own deadline. ``close()``
    is the facade's: idempotent, a second caller waits for the first, the owned bridge
    closed after the session.

    Args:
        client: the async harness client.
        bridge: a bridge to share (left open on :meth:`close`); by default the facade
            owns a new one, closed with the session.
        timeout_margin: seconds the bridge waits beyond the client's own deadline.
    """

    def __init__(self, client: HarnessClient, bridge: Bridge | None = None, *,
                 timeout_margin: float = TIMEOUT_MARGIN) -> None:
        owns = bridge is None
        if bridge is None:
            from envlink._bridge import Bridge as _Bridge

            bridge = _Bridge()
        super().__init__(client, bridge, owns_bridge=owns, timeout_margin=timeout_margin)

    def connect(self) -> SyncHarnessClient:
        """Open the session now (otherwise the first turn opens it).

        Raises:
            As :meth:`HarnessClient.connect`.
        """
        self._envlink_call("connect", self._envlink_target.connect, (), {}, UNSET)
        return self

    def send(self, content: str, *, timeout: float | UnsetType | None = UNSET,
             sampling: Mapping[str, Any] | None = None) -> Iterator[HarnessEvent]:
        """Run one turn: an iterator of its events through ``turn_complete``.

        Args:
            content: the user message of the turn.
            timeout: the turn's deadline (default: the client's call timeout).
            sampling: as :meth:`HarnessClient.send`.

        Raises:
            As :meth:`HarnessClient.send`, while iterating.
        """
        target = self._envlink_target
        return blocking_iterate(self._envlink_bridge, target, self._envlink_margin, "send",
                                target.send, (content,), {"sampling": sampling}, timeout)

    def turn(self, content: str, *, timeout: float | UnsetType | None = UNSET,
             sampling: Mapping[str, Any] | None = None) -> list[HarnessEvent]:
        """Run one turn and return all its events (see :meth:`HarnessClient.turn`)."""
        events: list[HarnessEvent] = self._envlink_call(
            "turn", self._envlink_target.turn, (content,), {"sampling": sampling}, timeout)
        return events

    def close(self, *, timeout: float | UnsetType | None = UNSET) -> None:
        """End the session, and the bridge if this facade owns it. Idempotent.

        A second caller (another thread) waits for the first close to finish.

        Args:
            timeout: deadline in seconds (default: the client's close deadline).

        Raises:
            CallTimeoutError: the session did not close in time (the owned bridge is
                closed anyway), or, for a second caller, the first close did not.
            ReentrantCallError: called from the bridge's own loop thread.
        """
        super().close(timeout=timeout)

    def __enter__(self) -> SyncHarnessClient:
        """``with client.sync() as harness``: open the session now.

        If that fails, the facade is closed before the error propagates, as leaving
        the block would close it (its own bridge's thread ends).

        Raises:
            As :meth:`HarnessClient.connect`.
        """
        try:
            return self.connect()
        except BaseException as exc:
            close_after_failed_enter(exc, self.close)
            raise


async def _by(when: float | None, seconds: float | None, wait: Awaitable[_T]) -> _T:
    """``await wait`` by the turn's deadline, the loop's time ``when``.

    Raises:
        CallTimeoutError: the deadline passed first.
    """
    try:
        async with bounded_at(when) as expiry:
            return await wait
    except TimeoutError as exc:
        if not expiry.expired() or isinstance(exc, CallTimeoutError):
            raise  # not this deadline's
        assert seconds is not None
        raise CallTimeoutError(f"{HARNESS_TURN} did not complete within {seconds:g} s",
                               method=HARNESS_TURN, timeout=seconds) from exc


def _decode(raw: str | bytes) -> dict[str, Any]:
    try:
        frame = json.loads(raw)
    except ValueError as exc:
        raise ProtocolError(f"/harness sent a frame that is not JSON: {exc}") from exc
    if not isinstance(frame, dict):
        raise ProtocolError("/harness sent a frame that is not a JSON object")
    return frame


def _data(frame: dict[str, Any]) -> dict[str, Any]:
    data = frame.get("data")
    return data if isinstance(data, dict) else {}
