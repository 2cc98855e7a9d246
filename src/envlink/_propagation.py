"""The trace context sent in each request frame, without work when there is none.

``propagate.inject`` walks the global propagator (16 Python calls per frame with
the default one) even when there is no span to propagate. With the default W3C
propagators nothing envlink sends (``traceparent``, ``tracestate``) is injected
without a valid span context, so that walk is skipped then; any other propagator
is always asked, since it may inject without a span.
"""

from __future__ import annotations

from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

__all__ = ["trace_carrier"]

_W3C = (TraceContextTextMapPropagator, W3CBaggagePropagator)
#: The global propagator last checked, and whether it is W3C trace context and
#: baggage only (the check is redone whenever the global propagator changes).
_checked: list[Any] = [None, False]


def _w3c_only(textmap: Any) -> bool:
    if _checked[0] is not textmap:
        # CompositePropagator keeps its parts in ``_propagators`` (no public accessor);
        # an unknown shape counts as "not only W3C", so it is always asked.
        parts = getattr(textmap, "_propagators", None) \
            if isinstance(textmap, CompositePropagator) else [textmap]
        only = parts is not None and all(type(p) in _W3C for p in parts)
        _checked[:] = [textmap, only]
    return bool(_checked[1])


def trace_carrier() -> dict[str, str]:
    """The current trace context as message headers (empty when there is none to send)."""
    carrier: dict[str, str] = {}
    if trace.get_current_span().get_span_context().is_valid \
            or not _w3c_only(propagate.get_global_textmap()):
        propagate.inject(carrier)
    return carrier
