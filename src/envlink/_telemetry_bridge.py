"""envlink's OpenTelemetry emitter for the sync bridge: a :class:`~envlink.BridgeHook`.

Per bridged call: an INTERNAL span ``envlink.bridge <method>`` started in the
caller's thread and made the current span of the coroutine's context (so it is
the parent of the client's span), with the queue wait and run time as attributes;
and one record in each of ``envlink.bridge.wait.duration`` and
``envlink.bridge.call.duration``, by ``rpc.method``, ``envlink.outcome`` and
``error.type``. The names are the contract of ``docs/telemetry.md``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.metrics import MeterProvider
from opentelemetry.trace import INVALID_SPAN, Span, SpanKind, TracerProvider

from envlink._bridge import OUTCOMES, BridgeCallFinished, BridgeCallStarted, BridgeHook
from envlink._telemetry import (
    ATTR_BRIDGE_QUEUE_WAIT,
    ATTR_BRIDGE_RUN_TIME,
    ATTR_ERROR_TYPE,
    ATTR_OUTCOME,
    ATTR_RPC_METHOD,
    SPAN_BRIDGE_PREFIX,
    error_type_of,
    get_telemetry,
    mark_error,
)

__all__ = ["BridgeTelemetryHook", "default_bridge_hooks"]

_log = logging.getLogger("envlink.bridge")
_INTERNAL = SpanKind.INTERNAL


class _MethodInfo:
    """Per-method constants, built once so that the hot path allocates nothing."""

    __slots__ = ("attrs", "error_attrs", "method", "span_name")

    def __init__(self, method: str) -> None:
        self.method = method
        self.span_name = f"{SPAN_BRIDGE_PREFIX}{method}"
        self.attrs = {outcome: {ATTR_RPC_METHOD: method, ATTR_OUTCOME: outcome}
                      for outcome in OUTCOMES}
        self.error_attrs: dict[tuple[str, str], dict[str, str]] = {}

    def attributes(self, outcome: str, error_type: str | None) -> dict[str, str]:
        if error_type is None:
            return self.attrs[outcome]
        key = (outcome, error_type)
        attrs = self.error_attrs.get(key)
        if attrs is None:
            attrs = {ATTR_RPC_METHOD: self.method, ATTR_OUTCOME: outcome,
                     ATTR_ERROR_TYPE: error_type}
            if len(self.error_attrs) < 256:  # bounded: error types are a small set
                self.error_attrs[key] = attrs
        return attrs


_method_infos: dict[str, _MethodInfo] = {}


def _method_info(method: str) -> _MethodInfo:
    info = _method_infos.get(method)
    if info is None:
        info = _MethodInfo(method)
        if len(_method_infos) < 4096:  # method names come from code; guard anyway
            _method_infos[method] = info
    return info


class BridgeTelemetryHook:
    """The span and histograms of every bridged call, on the given providers.

    It is the default hook of every :class:`~envlink.Bridge`; pass it explicitly
    to combine it with hooks of your own: ``Bridge(hooks=[BridgeTelemetryHook(),
    my_hook])``. It never raises into the caller.

    Args:
        tracer_provider: OpenTelemetry tracer provider (default: the global one).
        meter_provider: OpenTelemetry meter provider (default: the global one).
    """

    __slots__ = ("_call_duration", "_tracer", "_tracing_enabled", "_wait_duration")

    def __init__(self, tracer_provider: TracerProvider | None = None,
                 meter_provider: MeterProvider | None = None) -> None:
        tel = get_telemetry(tracer_provider, meter_provider)
        # Held directly: this runs twice per bridged call.
        self._tracer = tel.tracer
        self._tracing_enabled = tel.tracing_enabled
        self._wait_duration = tel.bridge_wait_duration
        self._call_duration = tel.bridge_call_duration

    def call_started(self, call: BridgeCallStarted) -> Span:
        """Start the sync hop's span and make it the coroutine's current span."""
        if not self._tracing_enabled():
            return INVALID_SPAN  # no SDK: no span to start (as for the client's spans)
        method = call.method
        info = _method_infos.get(method) or _method_info(method)
        try:
            span = self._tracer.start_span(info.span_name, kind=_INTERNAL)
        except Exception:  # a failing span processor must never fail the call
            return INVALID_SPAN
        if span.is_recording():
            span.set_attribute(ATTR_RPC_METHOD, method)
            call.context.run(otel_context.attach, trace.set_span_in_context(span))
        return span

    def call_finished(self, call: BridgeCallFinished, token: Span) -> None:
        """Record both histograms and end the span."""
        try:
            method, outcome, wait, run_time, duration, error = call
            info = _method_infos.get(method) or _method_info(method)
            attrs = info.attributes(outcome, None if error is None else error_type_of(error))
            self._wait_duration.record(wait, attrs)
            self._call_duration.record(duration, attrs)
            if token.is_recording():
                token.set_attribute(ATTR_BRIDGE_QUEUE_WAIT, wait)
                if run_time is not None:
                    token.set_attribute(ATTR_BRIDGE_RUN_TIME, run_time)
                if error is not None:
                    mark_error(token, error)
            token.end()
        except Exception:  # pragma: no cover - defensive
            _log.debug("envlink bridge: telemetry failed", exc_info=True)


def default_bridge_hooks(tracer_provider: TracerProvider | None,
                         meter_provider: MeterProvider | None) -> Sequence[BridgeHook]:
    """The hooks of a bridge created without ``hooks=``: this emitter."""
    return (BridgeTelemetryHook(tracer_provider, meter_provider),)
