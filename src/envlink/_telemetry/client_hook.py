"""envlink's OpenTelemetry and structlog emitter for the client: a :class:`ClientHook`.

The client reports what happens (calls, attempts, connects, recovery rounds,
messages, events) to its hooks; this one turns the reports into the spans,
metrics and log events of ``docs/telemetry.md``. It is the only client module
that creates spans, records metrics or logs; it never raises into the caller.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import Mapping
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.metrics import MeterProvider
from opentelemetry.trace import (
    INVALID_SPAN,
    Span,
    SpanKind,
    TracerProvider,
    get_current_span,
)

from envlink._config import check_number
from envlink._errors import ServerError
from envlink._events.client_events import (
    CallFinished,
    CallStarted,
    ClientEvent,
    ClientHook,
    PhaseFinished,
    PhaseStarted,
)
from envlink._sansio.policies import RecoveryMechanism
from envlink._speedups import context_attacher, current_context_getter, span_key
from envlink._telemetry import logs as _logging
from envlink._telemetry.instruments import (
    BRIDGE_HOP,
    Telemetry,
    end_current_span,
    error_type_of,
    get_telemetry,
)
from envlink.names import (
    ATTR_ATTEMPT,
    ATTR_BRIDGE_QUEUE_WAIT,
    ATTR_DELAY,
    ATTR_DIRECTION,
    ATTR_EPISODE_ID,
    ATTR_ERROR_TYPE,
    ATTR_EXTENSIONS,
    ATTR_OUTCOME,
    ATTR_POLICY,
    ATTR_QUEUE_WAIT,
    ATTR_REASON,
    ATTR_RECOVERY,
    ATTR_REPLAY_STEPS,
    ATTR_RESULT,
    ATTR_RETRY,
    ATTR_RPC_METHOD,
    ATTR_RPC_STATUS_CODE,
    ATTR_RPC_SYSTEM,
    ATTR_SERVER_ADDRESS,
    ATTR_SERVER_PORT,
    ATTR_SESSION_ID,
    ATTR_STEP_INDEX,
    ATTR_TRANSPARENT,
    EVENT_ATTACH_WAIT,
    EVENT_RECONNECT_SCHEDULED,
    EVENT_SESSION_LOST,
    HOOK_RECONNECT,
    HOOK_RECOVERY_FINISHED,
    LOG_ATTACH_WAIT,
    LOG_CALL_FAILED,
    LOG_CONNECT,
    LOG_CONNECTED,
    LOG_RECONNECT_SCHEDULED,
    LOG_REPLAY_DIVERGED,
    LOG_SESSION_LOST,
    LOG_SESSION_RECOVERED,
    OUTCOME_CANCELLED,
    OUTCOME_ERROR,
    OUTCOME_OK,
    OUTCOME_TIMEOUT,
    RPC_METHOD_CONNECT,
    RPC_SYSTEM,
    SPAN_CONNECT,
)

__all__ = ["ClientTelemetryHook", "outcome_of"]

_log = _logging.get_logger()

#: ``connect()`` is not an RPC method: an INTERNAL span, no RPC metrics.
_NOT_RPC = frozenset({RPC_METHOD_CONNECT})
#: Log level of each event that is only logged.
_LEVELS: Mapping[str, str] = {
    "envlink.peer_unresponsive": "info",
    "envlink.unattributable_frame": "info",
    "envlink.stale_answer_dropped": "debug",
    "envlink.connection_discarded": "debug",
    "envlink.disconnect": "debug",
    "envlink.client_closed": "debug",
    "envlink.session_release_failed": "debug",
    "envlink.unknown_step_settled": "info",
    "envlink.recovery_fallback": "warning",
    # A provider's server may still run (and be billed): never hidden.
    "envlink.provider_stop_failed": "error",
    # An expected absence (most servers have no detached sessions), not a fault.
    "envlink.detached_sessions_unavailable": "debug",
}
_SENT = {ATTR_DIRECTION: "sent"}


def outcome_of(exc: BaseException) -> str:
    """``envlink.outcome`` of a failed call or connection attempt."""
    if getattr(type(exc), "error_type", None) == "timeout":
        return OUTCOME_TIMEOUT
    return OUTCOME_CANCELLED if isinstance(exc, asyncio.CancelledError) else OUTCOME_ERROR
_RECEIVED = {ATTR_DIRECTION: "received"}


#: The span of the call in progress in this task, while it records: span events of
#: the call (``reconnect_scheduled``, ``envlink.session_lost``) go on it.
_CALL_SPAN: contextvars.ContextVar[Span | None] = contextvars.ContextVar(
    "envlink_call_span", default=None)


class _Method:
    """What every call of one method to one endpoint shares, built once per client.

    The span's start attributes (those of the last session and episode seen, kept
    while they stay the same, as they do for every step of an episode), the
    successful call's duration attributes: the hot path looks up one object and
    allocates no dict of its own.
    """

    __slots__ = ("address", "base", "episode_id", "kind", "ok_attrs", "port", "rpc",
                 "session_attrs", "session_id")

    def __init__(self, method: str, address: str, port: int) -> None:
        self.address = address
        self.port = port
        self.rpc = rpc = method not in _NOT_RPC
        self.kind = _CLIENT if rpc else _INTERNAL
        base: dict[str, Any] = {ATTR_SERVER_ADDRESS: address, ATTR_SERVER_PORT: port}
        if rpc:
            base[ATTR_RPC_SYSTEM] = RPC_SYSTEM
            base[ATTR_RPC_METHOD] = method
        self.base = base
        #: The session and episode of ``session_attrs``.
        self.session_id: str | None = None
        self.episode_id: str | None = None
        self.session_attrs = base
        self.ok_attrs: dict[str, Any] = {
            ATTR_RPC_SYSTEM: RPC_SYSTEM, ATTR_SERVER_ADDRESS: address,
            ATTR_SERVER_PORT: port, ATTR_RPC_METHOD: method, ATTR_OUTCOME: OUTCOME_OK}

    def start_attributes(self, session_id: str | None,
                         episode_id: str | None) -> dict[str, Any]:
        """The span's start attributes for this session and episode (no bridge hop)."""
        if not self.rpc:
            return self.base
        if session_id != self.session_id or episode_id != self.episode_id:
            attrs = dict(self.base)
            if session_id is not None:
                attrs[ATTR_SESSION_ID] = session_id
            if episode_id is not None:
                attrs[ATTR_EPISODE_ID] = episode_id
            self.session_id = session_id
            self.episode_id = episode_id
            self.session_attrs = attrs
        return self.session_attrs


#: A call's token: its span, the token of the span's attached context (``None``: no
#: span), its :class:`_Method`, whether the span records (asked once), the token of
#: ``_CALL_SPAN`` (while it records) and the span's context (its measurements' context).
#: A tuple, not an object: built on every call (docs/performance.md, hot path).
_Token = tuple[Span, Any, "_Method | None", bool, Any, Any]
#: The token of every call traced without a span (no SDK, tracing off, the SDK failed).
_NO_SPAN: _Token = (INVALID_SPAN, None, None, False, None, None)

_perf = time.perf_counter
_CLIENT = SpanKind.CLIENT
_INTERNAL = SpanKind.INTERNAL
_get_current = current_context_getter()
_attach, _detach = context_attacher()
_set_span_in_context = trace.set_span_in_context
_Context = Context
#: The context key of the current span, when known (see ``_speedups``).
_SPAN_KEY: Any = span_key()

#: Default: one message in this many (per direction) is recorded in
#: ``envlink.client.message.size``, the first one included.
MESSAGE_SAMPLE = 16


class ClientTelemetryHook(ClientHook):
    """The spans, metrics and log events of ``docs/telemetry.md`` for one client.

    It is the default hook of every client; pass it explicitly to combine it with
    hooks of your own: ``EnvClient(url, hooks=[ClientTelemetryHook(), mine])``.

    Per call it does the least that keeps the contract: one span (the client's; a
    sync call's bridge hop is merged into it), one duration record, counters only
    when something happened (a retry, an error), calls in flight counted in plain
    integers read at collection time, message sizes sampled. With no SDK
    configured it allocates nothing per call.

    Args:
        tracer_provider: OpenTelemetry tracer provider (default: the global one).
        meter_provider: OpenTelemetry meter provider (default: the global one).
        url: the server URL shown in log events (never with credentials).
        message_sample: record the size of one message in this many, per
            direction (``1``: every message). Sizes are a distribution, not a
            count: the number of calls is ``rpc.client.call.duration``'s count.
    """

    #: Every method swallows its own failures: no chain is needed around it.
    never_raises = True
    #: A first attempt is measured as the call (rpc.client.call.duration).
    first_attempt_phases = False

    def __init__(self, tracer_provider: TracerProvider | None = None,
                 meter_provider: MeterProvider | None = None, *, url: str = "",
                 message_sample: int = MESSAGE_SAMPLE) -> None:
        check_number(message_sample, "message_sample", integer=True, minimum=1,
                     mistyped=ValueError, expected="an int >= 1")
        self.tel: Telemetry = get_telemetry(tracer_provider, meter_provider)
        self.url = url
        self.message_sample = message_sample
        self._sent = self._received = 0
        #: Calls in flight, by method; read when the SDK collects envlink.client.inflight.
        self.inflight: dict[str, int] = {}
        self.tel.add_inflight_source(self)
        #: Per method: what its calls share (attribute dicts built once, not per call).
        self._methods: dict[str, _Method] = {}

    # ------------------------------------------------------------------ calls

    def _method(self, call: CallStarted | CallFinished) -> _Method:
        """The :class:`_Method` of ``call``'s method and endpoint."""
        info = self._methods.get(call.method)
        if info is None or info.address != call.server_address \
                or info.port != call.server_port:
            info = _Method(call.method, call.server_address, call.server_port)
            self._methods[call.method] = info
        return info

    def call_started(self, call: CallStarted) -> _Token:
        method = call.method
        rpc = method not in _NOT_RPC
        if rpc:
            inflight = self.inflight
            count = inflight.get(method)
            if count is None:  # first call of this method: its series exists from now on
                self.tel.inflight_methods.add(method)
                count = 0
            inflight[method] = count + 1
        hop = BRIDGE_HOP.get()
        if hop is not None:
            if hop.claimed:
                hop = None
            else:
                hop.claimed = True
        tel = self.tel
        if not tel.tracing_enabled():
            return _NO_SPAN
        info = self._methods.get(method)
        if info is None or info.address != call.server_address \
                or info.port != call.server_port:
            info = self._method(call)
        session_id, episode_id = call.session_id, call.episode_id
        if session_id == info.session_id and episode_id == info.episode_id and info.rpc:
            attributes = info.session_attrs  # every step of an episode after its first
        else:
            attributes = info.start_attributes(session_id, episode_id)
        start_time = None
        if hop is not None:
            # A sync call: this span starts when the caller called and shows the hop.
            attributes = dict(attributes)
            attributes[ATTR_BRIDGE_QUEUE_WAIT] = _perf() - hop.submitted
            start_time = hop.start_ns or None
        # The current context read once: the span's parent, and the context it is
        # attached in (the SDK would otherwise read it three times).
        try:
            ctx = _get_current()
            span = tel.tracer.start_span(method, ctx, info.kind, attributes, None, start_time)
        except Exception:  # a failing span processor must never fail the call
            return _NO_SPAN
        try:
            # set_span_in_context's result, built in one step where the span's key is known.
            ctx = _Context({**ctx, _SPAN_KEY: span}) if _SPAN_KEY is not None \
                else _set_span_in_context(span, ctx)
            attached = _attach(ctx)
        except Exception:  # pragma: no cover - the context API does not fail
            try:  # noqa: SIM105
                span.end()
            except Exception:
                pass
            return _NO_SPAN
        if span.is_recording():
            return (span, attached, info, True, _CALL_SPAN.set(span), ctx)
        return (span, attached, info, False, None, ctx)

    def call_finished(self, call: CallFinished, token: _Token) -> None:
        span, attached, info, recording, reset, ctx = token
        error = call.error
        method = call.method
        rpc = method not in _NOT_RPC
        if rpc:
            self.inflight[method] -= 1
        if recording:
            if call.queue_wait is not None:
                span.set_attribute(ATTR_QUEUE_WAIT, call.queue_wait)
            if call.step_index is not None:
                span.set_attribute(ATTR_STEP_INDEX, call.step_index)
            _CALL_SPAN.reset(reset)
        tel = self.tel
        if error is None:
            if attached is not None:
                try:  # noqa: SIM105 - runs on every call (docs/performance.md, hot path)
                    _detach(attached)
                except Exception:
                    pass
                try:  # noqa: SIM105
                    span.end()
                except Exception:  # a failing span processor must never fail the call
                    pass
            if rpc and tel.metrics_enabled():
                if info is None or info.address != call.server_address \
                        or info.port != call.server_port:
                    info = self._method(call)
                try:  # noqa: SIM105
                    # In the call span's context (None: the current one); an exemplar,
                    # when they are on, then points at the call's own span.
                    tel.call_duration.record(call.duration, info.ok_attrs, ctx)
                except Exception:  # telemetry never raises into the caller
                    pass
            return
        error_type = error_type_of(error)
        if isinstance(error, Exception):
            # A failed connect() is counted too (rpc.method "connect"): a client that
            # never connects makes no protocol call, and the availability SLO and the
            # retry-budget alert must still see it. Failures only: a successful
            # connect is not a call, and costs nothing here.
            tel.add(tel.errors, 1, {ATTR_RPC_METHOD: call.method, ATTR_ERROR_TYPE: error_type})
            _log.info(LOG_CALL_FAILED, method=call.method, error_type=error_type,
                      error=str(error), session_id=call.session_id)
        if attached is not None:
            end_current_span(span, attached, error)
        if rpc:
            tel.record(tel.call_duration, call.duration, self._duration_attrs(call, error))

    @staticmethod
    def _duration_attrs(call: CallFinished, error: BaseException | None) -> dict[str, Any]:
        attrs: dict[str, Any] = {ATTR_RPC_SYSTEM: RPC_SYSTEM,
                                 ATTR_SERVER_ADDRESS: call.server_address,
                                 ATTR_SERVER_PORT: call.server_port,
                                 ATTR_RPC_METHOD: call.method, ATTR_OUTCOME: call.outcome}
        if error is not None:
            attrs[ATTR_ERROR_TYPE] = error_type_of(error)
            if isinstance(error, ServerError):  # the status the server answered with
                attrs[ATTR_RPC_STATUS_CODE] = str(getattr(error.code, "value", error.code))
        return attrs

    # ----------------------------------------------------------------- phases

    def phase_started(self, phase: PhaseStarted) -> Any:
        tel = self.tel
        name = phase.phase
        if name == "attempt":
            if phase.attempt == 1:
                return None  # counted by rpc.client.call.duration; only retries here
            tel.add(tel.attempts, 1, {ATTR_RPC_METHOD: phase.method, ATTR_RETRY: True})
            scope = tel.span(f"{phase.method} attempt", attributes={
                ATTR_ATTEMPT: phase.attempt, ATTR_TRANSPARENT: True,
                ATTR_RPC_METHOD: phase.method})
        elif name == "connect":
            scope = tel.span(SPAN_CONNECT, kind=SpanKind.CLIENT, attributes={
                ATTR_SERVER_ADDRESS: phase.server_address, ATTR_SERVER_PORT: phase.server_port,
                ATTR_ATTEMPT: phase.attempt, ATTR_REASON: phase.reason})
            _log.debug(LOG_CONNECT, url=self.url, attempt=phase.attempt, reason=phase.reason)
        elif name == "resume":
            scope = tel.span("resume", attributes={
                ATTR_RPC_METHOD: phase.method, ATTR_ATTEMPT: phase.attempt,
                ATTR_RECOVERY: phase.mechanism or RecoveryMechanism.ENVLINK_RESUME.value})
        elif name == "replay":
            scope = tel.span("replay", attributes={ATTR_ATTEMPT: phase.attempt,
                                                   ATTR_REPLAY_STEPS: phase.replay_steps,
                                                   ATTR_RECOVERY: RecoveryMechanism.REPLAY.value})
        elif name == "close":
            attrs = None
            if tel.tracing_enabled():
                attrs = {ATTR_RPC_SYSTEM: RPC_SYSTEM, ATTR_SERVER_ADDRESS: phase.server_address,
                         ATTR_SERVER_PORT: phase.server_port, ATTR_RPC_METHOD: "close"}
            scope = tel.span("close", kind=SpanKind.CLIENT, attributes=attrs)
        else:
            return None
        return (scope, scope.__enter__(), time.perf_counter())

    def phase_finished(self, phase: PhaseFinished, token: Any) -> None:
        started = phase.phase
        error = phase.error
        if started.phase == "connect":
            self._connect_finished(phase, token)
        if token is None:
            return
        scope, span, _ = token
        if started.phase == "connect" and error is None and span.is_recording():
            span.set_attribute(ATTR_SESSION_ID, phase.session_id or "")
            span.set_attribute(ATTR_EXTENSIONS, bool(phase.extensions))
        scope.__exit__(None if error is None else type(error), error, None)

    def _connect_finished(self, phase: PhaseFinished, token: Any) -> None:
        # A connection attempt (the WebSocket opening handshake) is not an RPC: its
        # span carries no rpc.* attribute and it has its own duration histogram.
        tel, started, error = self.tel, phase.phase, phase.error
        attrs: dict[str, Any] = {ATTR_SERVER_ADDRESS: started.server_address,
                                 ATTR_SERVER_PORT: started.server_port,
                                 ATTR_REASON: started.reason}
        if error is None:
            attrs[ATTR_OUTCOME] = OUTCOME_OK
            _log.debug(LOG_CONNECTED, url=self.url, session_id=phase.session_id,
                       extensions=bool(phase.extensions))
        else:
            attrs[ATTR_OUTCOME] = outcome_of(error)
            attrs[ATTR_ERROR_TYPE] = error_type_of(error)
        tel.record(tel.connect_duration, time.perf_counter() - token[2], attrs)

    # ------------------------------------------------------------ messages, events

    def message(self, direction: str, size: int) -> None:
        # Sampled: one message in `message_sample` per direction, the first included.
        if direction == "sent":
            n = self._sent
            self._sent = n + 1
            attrs = _SENT
        else:
            n = self._received
            self._received = n + 1
            attrs = _RECEIVED
        if n % self.message_sample == 0:
            tel = self.tel
            tel.record(tel.message_size, size, attrs)

    def event(self, event: ClientEvent) -> None:
        tel = self.tel
        name, fields = event.name, event.fields
        if name == HOOK_RECONNECT:
            tel.add(tel.reconnects, 1, {ATTR_REASON: fields["reason"]})
        elif name == LOG_RECONNECT_SCHEDULED:
            error = fields.get("error")
            etype = error_type_of(error) if error is not None else "unknown"
            delay = fields["delay"]
            span = _CALL_SPAN.get()
            # On the call's span, for the call's own (re)connects; recovery rounds have
            # spans of their own and report there by logs only, as documented.
            if span is not None and fields["reason"] not in ("resume", "replay"):
                span.add_event(EVENT_RECONNECT_SCHEDULED, {
                    ATTR_DELAY: delay, ATTR_ERROR_TYPE: etype, ATTR_ATTEMPT: fields["attempt"]})
            _log.info(LOG_RECONNECT_SCHEDULED, delay_s=round(delay, 4), error_type=etype,
                      attempt=fields["attempt"], reason=fields["reason"], url=self.url)
        elif name == LOG_ATTACH_WAIT:
            # On the span open now: the resume's (or the call's own connect's).
            delay, waited = fields["delay"], fields["waited"]
            span = get_current_span()
            if span.is_recording():
                span.add_event(EVENT_ATTACH_WAIT, {
                    ATTR_DELAY: delay, ATTR_ATTEMPT: fields["attempt"]})
            _log.info(LOG_ATTACH_WAIT, delay_s=round(delay, 4), waited_s=round(waited, 4),
                      attempt=fields["attempt"], session_id=event.session_id, url=self.url)
        elif name == LOG_SESSION_LOST:
            # Logged once recovery ends (HOOK_RECOVERY_FINISHED): a recovered session
            # is one info line, a loss the caller sees one warning.
            span = _CALL_SPAN.get()
            if span is not None:
                attrs = {ATTR_POLICY: fields["policy"]}
                if fields.get("mechanism"):
                    attrs[ATTR_RECOVERY] = fields["mechanism"]
                span.add_event(EVENT_SESSION_LOST, attrs)
        elif name == HOOK_RECOVERY_FINISHED:
            tel.add(tel.recoveries, 1, {ATTR_POLICY: fields["policy"],
                                        ATTR_RESULT: fields["result"]})
            if fields["result"] == OUTCOME_OK:
                _log.info(LOG_SESSION_RECOVERED, policy=fields["policy"],
                          recovery=fields.get("mechanism"), session_id=event.session_id,
                          steps=fields["steps"])
            elif not fields.get("planned") and not fields.get("owner_recovers"):
                # (A session its owner rebuilds, a replaying pool's, is its owner's to
                # report: rebuilt, or lost.)
                _log.warning(
                    LOG_SESSION_LOST, method=fields.get("method"), policy=fields["policy"],
                    recovery=fields.get("mechanism"), session_id=event.session_id,
                    steps=fields["steps"], error=fields.get("error"))
        elif name == LOG_REPLAY_DIVERGED:
            _log.error(LOG_REPLAY_DIVERGED, index=fields["index"], session_id=event.session_id)
        else:
            level = _LEVELS.get(name, "debug")
            extra = dict(fields)
            if "session_id" not in extra and name != "envlink.session_release_failed" \
                    and name != "envlink.stale_answer_dropped":
                extra["session_id"] = event.session_id
            getattr(_log, level)(name, **extra)
