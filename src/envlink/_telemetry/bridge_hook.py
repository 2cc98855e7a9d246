"""envlink's OpenTelemetry emitter for the sync bridge: a :class:`~envlink.BridgeHook`.

For the sync facade's calls (*merged*, what :class:`~envlink.SyncEnvClient`'s own
bridge does), one span per bridged call: the bridge puts a
:class:`~envlink._telemetry.instruments.BridgeHop` in the coroutine's context, and the
client call that runs there *claims* it: the client's span starts when the
caller called and carries the queue wait (``envlink.bridge.queue_wait_s``); the
bridge records only ``envlink.bridge.wait.duration`` (the loop's saturation
signal). A bridged call no client claims (a :class:`~envlink.SyncProxy` of some
other object, ``close``) gets the bridge's own INTERNAL span ``envlink.bridge
<method>`` after the fact (from the caller's call to its wake-up, queue wait and
run time as attributes) and both histograms.

*Nested* (the default of a :class:`~envlink.Bridge`, which may run any
coroutine, and an option of the sync facade): every bridged call gets its
INTERNAL span, started in the caller's thread and made the current span of the
coroutine's context (so it is the parent of the client's span), and records
``envlink.bridge.call.duration``.

``envlink.bridge.wait.duration`` is *sampled* in both shapes: one successful call
in ``wait_sample`` (16) per method, the first included, and every failed one, so
that a call on the hot path makes one duration record, not two. The wait is a
distribution (dashboards read its quantiles); every call's own wait is on its
span (``envlink.bridge.queue_wait_s``). With no SDK configured nothing is
allocated or recorded. The names are the contract of ``docs/telemetry.md``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.metrics import MeterProvider
from opentelemetry.trace import Span, SpanKind, TracerProvider

from envlink._bridge import OUTCOMES, BridgeCallFinished, BridgeCallStarted, BridgeHook
from envlink._config import check_number
from envlink._telemetry.instruments import (
    BRIDGE_HOP,
    BridgeHop,
    error_type_of,
    get_telemetry,
    mark_error,
)
from envlink.names import (
    ATTR_BRIDGE_QUEUE_WAIT,
    ATTR_BRIDGE_RUN_TIME,
    ATTR_ERROR_TYPE,
    ATTR_OUTCOME,
    ATTR_RPC_METHOD,
    SPAN_BRIDGE_PREFIX,
)

__all__ = ["WAIT_SAMPLE", "BridgeTelemetryHook", "default_bridge_hooks"]

_log = logging.getLogger("envlink.bridge")
_INTERNAL = SpanKind.INTERNAL


class _MethodInfo:
    """Per-method constants, built once so that the hot path allocates nothing."""

    __slots__ = ("attrs", "error_attrs", "method", "span_attrs", "span_name")

    def __init__(self, method: str) -> None:
        self.method = method
        self.span_name = f"{SPAN_BRIDGE_PREFIX}{method}"
        #: Given at the span's start: validated once there, not set under the span's lock.
        self.span_attrs = {ATTR_RPC_METHOD: method}
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


#: Bridged calls that get the bridge's own (nested) span even when merging: the
#: facade's close, which no client call covers and which logs after its last span.
_OWN_SPAN = frozenset({"close"})
#: Token of a call recorded without a span (no tracing, or a nested hook without SDK).
_METRICS_ONLY = object()
_time_ns = time.time_ns
_get_current = otel_context.get_current
_attach = otel_context.attach
_set_span_in_context = trace.set_span_in_context

#: Default: one successful call in this many (per method) is recorded in
#: ``envlink.bridge.wait.duration``, the first one included; failed calls always.
WAIT_SAMPLE = 16
#: Methods whose calls are counted for that sampling; beyond, every call's wait is recorded.
_MAX_SAMPLED_METHODS = 4096


class BridgeTelemetryHook:
    """The span and histograms of every bridged call, on the given providers.

    It is the default hook of every :class:`~envlink.Bridge`; pass it explicitly
    to combine it with hooks of your own: ``Bridge(hooks=[BridgeTelemetryHook(),
    my_hook])``. It never raises into the caller.

    Args:
        tracer_provider: OpenTelemetry tracer provider (default: the global one).
        meter_provider: OpenTelemetry meter provider (default: the global one).
        nested: give every bridged call its own span, current in the coroutine
            (so spans the coroutine creates are its children), and both
            histograms: the default, right for any coroutine. ``False`` (what
            the sync facade's own bridge uses): one span per bridged call, the
            client's, with the hop merged into it (see the module doc).
        wait_sample: record the queue wait of one successful call in this many,
            per method, in ``envlink.bridge.wait.duration`` (the first one
            included; failed calls always; ``1``: every call). The histogram is
            a distribution of waits, not a count of calls.

    Raises:
        ValueError: ``wait_sample`` is not an int >= 1.
    """

    __slots__ = ("_nested", "_seen", "_tel", "wait_sample")

    def __init__(self, tracer_provider: TracerProvider | None = None,
                 meter_provider: MeterProvider | None = None, *, nested: bool = True,
                 wait_sample: int = WAIT_SAMPLE) -> None:
        check_number(wait_sample, "wait_sample", integer=True, minimum=1, mistyped=ValueError,
                     expected="an int >= 1")
        self._tel = get_telemetry(tracer_provider, meter_provider)
        self._nested = bool(nested)
        self.wait_sample = wait_sample
        #: Successful calls seen per method, for the wait's sampling. Not locked:
        #: concurrent callers may both read one count, which only shifts the sample.
        self._seen: dict[str, int] = {}

    @property
    def nested(self) -> bool:
        """Whether every bridged call gets its own span (else: merged into the client's)."""
        return self._nested

    def call_started(self, call: BridgeCallStarted) -> Any:
        """Merged: hand the call's start to the client's span. Nested: start the span."""
        tel = self._tel
        tracing = tel.tracing_enabled()
        if not self._nested and call.method not in _OWN_SPAN:
            if not tracing and not tel.metrics_enabled():
                return None  # no SDK: nothing to do, nothing allocated
            hop = BridgeHop(_time_ns() if tracing else 0)
            call.context.run(BRIDGE_HOP.set, hop)
            return hop
        if not tracing:
            return _METRICS_ONLY if tel.metrics_enabled() else None
        method = call.method
        info = _method_infos.get(method) or _method_info(method)
        try:
            # The caller's OpenTelemetry context, read once: the span's parent, and the
            # context the coroutine's copy gets with the span in it.
            parent = _get_current()
            span = tel.tracer.start_span(info.span_name, context=parent, kind=_INTERNAL,
                                         attributes=info.span_attrs)
        except Exception:  # a failing span processor must never fail the call
            return _METRICS_ONLY
        if span.is_recording():
            call.context.run(_attach, _set_span_in_context(span, parent))
        return span

    def call_finished(self, call: BridgeCallFinished, token: Any) -> None:
        """Record the histograms (and end or emit the bridge's span where it has one)."""
        if token is None:
            return
        try:
            method = call.method
            error = call.error
            sampled = True
            if error is None:
                seen = self._seen
                n = seen.get(method)
                if n is None:  # a method's first call, or one past the bound: recorded
                    if len(seen) < _MAX_SAMPLED_METHODS:  # names come from code; bounded
                        seen[method] = 1
                else:
                    seen[method] = n + 1
                    sampled = n % self.wait_sample == 0
                if not sampled and type(token) is BridgeHop and token.claimed:
                    return  # the client's span covers the call and shows the wait
            tel = self._tel
            info = _method_infos.get(method) or _method_info(method)
            attrs = info.attributes(call.outcome,
                                    None if error is None else error_type_of(error))
            wait = call.queue_wait
            if sampled:
                tel.bridge_wait_duration.record(wait, attrs)
            if type(token) is BridgeHop:
                if token.claimed:
                    return  # the client's span covers the call and shows the wait
                tel.bridge_call_duration.record(call.duration, attrs)
                if token.start_ns:
                    self._span_after_the_fact(call, info, token.start_ns)
                return
            tel.bridge_call_duration.record(call.duration, attrs)
            if token is not _METRICS_ONLY:
                span: Span = token
                if span.is_recording():
                    # One call (one lock, one validation) for both attributes.
                    span.set_attributes(
                        {ATTR_BRIDGE_QUEUE_WAIT: wait} if call.run_time is None else
                        {ATTR_BRIDGE_QUEUE_WAIT: wait, ATTR_BRIDGE_RUN_TIME: call.run_time})
                    if error is not None:
                        mark_error(span, error)
                span.end()
        except Exception:  # pragma: no cover - defensive
            _log.debug("envlink bridge: telemetry failed", exc_info=True)

    def _span_after_the_fact(self, call: BridgeCallFinished, info: _MethodInfo,
                             start_ns: int) -> None:
        """The bridge's span of a call no client span covered, from its start to now."""
        try:
            attributes: dict[str, Any] = {ATTR_RPC_METHOD: call.method,
                                          ATTR_BRIDGE_QUEUE_WAIT: call.queue_wait}
            if call.run_time is not None:
                attributes[ATTR_BRIDGE_RUN_TIME] = call.run_time
            span = self._tel.tracer.start_span(info.span_name, kind=_INTERNAL,
                                               attributes=attributes, start_time=start_ns)
            if call.error is not None:
                mark_error(span, call.error)  # (a no-op on a span that does not record)
            span.end()
        except Exception:  # a failing span processor must never fail the call
            _log.debug("envlink bridge: span processor failed", exc_info=True)


def default_bridge_hooks(tracer_provider: TracerProvider | None,
                         meter_provider: MeterProvider | None) -> Sequence[BridgeHook]:
    """The hooks of a bridge created without ``hooks=``: this emitter."""
    return (BridgeTelemetryHook(tracer_provider, meter_provider),)
