"""The per-frame trace context: injected when there is one, skipped only when it cannot be."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.propagators.textmap import Setter, TextMapPropagator, default_setter
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from envlink._propagation import trace_carrier

_CTX = SpanContext(trace_id=0x1234, span_id=0x5678, is_remote=False,
                   trace_flags=TraceFlags(TraceFlags.SAMPLED))


class _Fixed(TextMapPropagator):
    """A propagator that injects a traceparent whether or not a span is current."""

    def __init__(self) -> None:
        self.calls = 0

    def extract(self, carrier: Any, context: Context | None = None,
                getter: Any = None) -> Context:
        return context or Context()

    def inject(self, carrier: Any, context: Context | None = None,
               setter: Setter[Any] = default_setter) -> None:
        self.calls += 1
        setter.set(carrier, "traceparent", "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01")

    @property
    def fields(self) -> set[str]:
        return {"traceparent"}


@pytest.fixture
def textmap() -> Iterator[None]:
    saved = propagate.get_global_textmap()
    yield
    propagate.set_global_textmap(saved)


def test_no_span_and_the_default_propagator_give_no_context(textmap: None) -> None:
    """Without a valid span the default W3C propagators would add nothing: the carrier is empty."""
    assert trace_carrier() == {}


def test_a_valid_span_context_is_sent(textmap: None) -> None:
    """A current span's context (sampled or not, recording or not) is injected as traceparent."""
    with trace.use_span(NonRecordingSpan(_CTX)):
        carrier = trace_carrier()
    assert carrier["traceparent"] == f"00-{0x1234:032x}-{0x5678:016x}-01"


def test_another_propagator_is_always_asked(textmap: None) -> None:
    """A non-default propagator is asked even without a span, and again after it is replaced."""
    fixed = _Fixed()
    propagate.set_global_textmap(fixed)
    assert trace_carrier()["traceparent"].startswith("00-abab")
    assert fixed.calls == 1
    from opentelemetry.propagators.composite import CompositePropagator
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    propagate.set_global_textmap(CompositePropagator([TraceContextTextMapPropagator()]))
    assert trace_carrier() == {}
    propagate.set_global_textmap(CompositePropagator([TraceContextTextMapPropagator(), fixed]))
    assert "traceparent" in trace_carrier()
    assert fixed.calls == 2
