"""The trace context sent in each request frame, without the propagator walk when it can.

``propagate.inject`` walks the global propagator for every frame: the composite,
then W3C trace context, then W3C baggage (docs/performance.md counts the calls).
When the global propagator is made of W3C trace context and baggage only (the
default), what it would write is known: nothing without a valid span
context; else ``traceparent`` (and ``tracestate`` when the span context has
one), plus ``baggage`` when baggage is set and the baggage propagator is there.
The common case (a valid span, no trace state, no baggage) is formatted here,
exactly as the W3C propagator formats it; everything else, and any other
propagator, goes through ``propagate.inject``.
"""

from __future__ import annotations

from typing import Any

from opentelemetry import baggage, propagate, trace
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from envlink._speedups import (
    baggage_key,
    composite_parts,
    current_context_getter,
    span_context_fields,
    span_key,
)

__all__ = ["trace_carrier"]

_W3C = (TraceContextTextMapPropagator, W3CBaggagePropagator)
#: The global propagator last checked, whether it is W3C trace context and baggage
#: only, and whether it includes the baggage propagator (redone when it changes; one
#: tuple, so that a reader never sees half of a change).
_checked: tuple[Any, bool, bool] = (None, False, False)
_get_current = current_context_getter()
_get_current_span = trace.get_current_span
_get_global_textmap = propagate.get_global_textmap
_Span = trace.Span
_INVALID = trace.INVALID_SPAN_CONTEXT
_NO_STATE = trace.DEFAULT_TRACE_STATE
_TRACEPARENT = "00-%032x-%016x-%02x"
#: Types of spans already found to be ``trace.Span``s: one set look-up instead of the
#: ABC's ``isinstance`` per frame (bounded: span classes are a handful).
_SPAN_TYPES: set[type] = set()
#: Whether a span context unpacks into its fields (see ``_speedups``).
_UNPACK = span_context_fields()
#: The context key of the baggage, when known; without it, the public ``baggage.get_all``.
_BAGGAGE_KEY: Any = baggage_key()
#: The context key of the current span, when known; without it, ``get_current_span``.
_SPAN_KEY: Any = span_key()


def _has_baggage(ctx: Any) -> bool:
    if _BAGGAGE_KEY is not None:
        return bool(ctx.get(_BAGGAGE_KEY))
    return bool(baggage.get_all(ctx))  # pragma: no cover - API without the private key


def _check(textmap: Any) -> tuple[Any, bool, bool]:
    global _checked
    # A composite whose parts are unknown counts as "not only W3C", so it is always asked.
    parts = composite_parts(textmap) if isinstance(textmap, CompositePropagator) \
        else [textmap]
    only = parts is not None and all(type(p) in _W3C for p in parts)
    with_baggage = only and any(type(p) is W3CBaggagePropagator for p in parts or ())
    _checked = (textmap, only, with_baggage)
    return _checked


def trace_carrier() -> dict[str, str]:
    """The current trace context as message headers (empty when there is none to send)."""
    textmap = _get_global_textmap()
    checked = _checked
    if checked[0] is not textmap:
        checked = _check(textmap)
    if not checked[1]:
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        return carrier
    ctx = _get_current()
    if checked[2] and (ctx.get(_BAGGAGE_KEY) if _BAGGAGE_KEY is not None
                       else _has_baggage(ctx)):
        carrier = {}
        propagate.inject(carrier, ctx)
        return carrier
    if _SPAN_KEY is not None:
        span = ctx.get(_SPAN_KEY)
        if span is None:  # no span: what get_current_span gives is the invalid one
            return {}
        if type(span) not in _SPAN_TYPES:
            if not isinstance(span, _Span):  # as get_current_span: the invalid one
                return {}
            if len(_SPAN_TYPES) < 64:
                _SPAN_TYPES.add(type(span))
    else:
        span = _get_current_span(ctx)
    span_context = span.get_span_context()
    if span_context == _INVALID:  # what the W3C propagator leaves out (not `is_valid`)
        return {}
    if _UNPACK:
        trace_id, span_id, _, flags, state, _ = span_context
    else:
        trace_id, span_id, flags, state = (span_context.trace_id, span_context.span_id,
                                           span_context.trace_flags, span_context.trace_state)
    # A root span's state is the shared default one: no Mapping length call for it.
    if state is not _NO_STATE and state:
        carrier = {}
        propagate.inject(carrier, ctx)
        return carrier
    # TraceContextTextMapPropagator.inject's format, written directly as it runs per request
    # (docs/performance.md, hot path).
    return {"traceparent": _TRACEPARENT % (trace_id, span_id, flags)}
