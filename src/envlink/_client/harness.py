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

import json
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import replace
from enum import Enum
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, Field, ValidationError

from envlink._bridge import SyncProxy
from envlink._client.events import CallFinished, CallStarted, ClientHook, combine_client_hooks
from envlink._config import (
    UNSET,
    ConnectionOptions,
    Timeout,
    TimeoutTypes,
    UnsetType,
    check_timeout,
)
from envlink._deadlines import deadline
from envlink._errors import (
    CallTimeoutError,
    ClientClosedError,
    EnvlinkError,
    ProtocolError,
    ServerError,
)
from envlink._transports.base import Connection, Transport, parse_endpoint
from envlink.names import (
    OUTCOME_CANCELLED,
    OUTCOME_ERROR,
    OUTCOME_OK,
    OUTCOME_TIMEOUT,
    SPAN_HARNESS_TURN,
)

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import TracerProvider

    from envlink._bridge import Bridge

__all__ = ["HarnessClient", "HarnessEvent", "HarnessEventType", "HarnessProtocolError",
           "HarnessTurnError", "SyncHarnessClient"]

HARNESS_TURN = SPAN_HARNESS_TURN


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


class HarnessProtocolError(ServerError):
    """The server rejected a frame with a recoverable ``protocol_error``; no turn ran.

    The session is still usable: correct the message and send again.
    """

    error_type = "harness_protocol_error"


class HarnessTurnError(ServerError):
    """The turn failed with a terminal ``error`` event; the server ended the session."""

    error_type = "harness_turn_error"


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
        transport: how the connection is opened (default: ``websockets``).
        hooks: observers (each turn is a call ``harness_turn``); default envlink's
            OpenTelemetry emitter on the given providers.
        tracer_provider: OpenTelemetry tracer provider (default: the global one).
        meter_provider: OpenTelemetry meter provider (default: the global one).

    Raises:
        ValueError: for a malformed URL.
    """

    def __init__(self, base_url: str, *, timeout: TimeoutTypes | UnsetType = UNSET,
                 headers: Mapping[str, str] | None = None, transport: Transport | None = None,
                 hooks: Sequence[ClientHook] | None = None,
                 tracer_provider: TracerProvider | None = None,
                 meter_provider: MeterProvider | None = None) -> None:
        endpoint = parse_endpoint(base_url)
        ws = endpoint.ws_url
        self._endpoint = replace(endpoint, ws_url=ws[: -len("/ws")] + "/harness")
        self.timeouts = Timeout() if timeout is UNSET else Timeout.coerce(timeout)
        self._options = ConnectionOptions(headers=tuple((headers or {}).items()))
        if transport is None:
            from envlink._transports.websocket import WebSocketTransport

            transport = WebSocketTransport()
        self._transport = transport
        if hooks is None:
            from envlink._telemetry.client_hook import ClientTelemetryHook

            self._hook: ClientHook = ClientTelemetryHook(tracer_provider, meter_provider,
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
        seconds = self.timeouts.call if timeout is UNSET else check_timeout(timeout)
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
            async with deadline(seconds, HARNESS_TURN):
                message: dict[str, Any] = {"type": "message", "content": content}
                if sampling is not None:
                    message["sampling"] = dict(sampling)
                await conn.send(json.dumps(message))
                while True:
                    frame = _decode(await conn.recv())
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


class SyncHarnessClient(SyncProxy[HarnessClient]):
    """The blocking form of a :class:`HarnessClient` (see :meth:`HarnessClient.sync`).

    Each turn's wait is bounded by the client's call timeout (plus a margin), each
    event of ``send()`` by the same; ``close()`` ends the session, and the bridge if
    the facade owns it.
    """

    def __init__(self, client: HarnessClient, bridge: Bridge | None = None) -> None:
        owns = bridge is None
        if bridge is None:
            from envlink._bridge import Bridge as _Bridge

            bridge = _Bridge()
        call = client.timeouts.call
        super().__init__(client, bridge, timeout=None if call is None else call + 0.5)
        self._envlink_owns = owns

    def close(self) -> None:
        """End the session (and the owned bridge). Idempotent."""
        bridge = self._envlink_bridge
        try:
            if not bridge.closed:
                bridge.call(self._envlink_target.close, timeout=self._envlink_timeout)
        finally:
            if self._envlink_owns:
                bridge.close()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> Literal[False]:
        self.close()
        return False


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
