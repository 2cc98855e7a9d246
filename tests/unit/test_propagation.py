"""The per-frame trace context: injected when there is one, skipped only when it cannot be."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry import baggage, propagate, trace
from opentelemetry import context as otel_context
from opentelemetry.context import Context
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.propagators.textmap import Setter, TextMapPropagator, default_setter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from envlink._client.propagation import trace_carrier

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
    propagate.set_global_textmap(CompositePropagator([TraceContextTextMapPropagator()]))
    assert trace_carrier() == {}
    propagate.set_global_textmap(CompositePropagator([TraceContextTextMapPropagator(), fixed]))
    assert "traceparent" in trace_carrier()
    assert fixed.calls == 2


def _expected(ctx: Context | None = None) -> dict[str, str]:
    carrier: dict[str, str] = {}
    propagate.inject(carrier, ctx)
    return carrier


_ids = st.integers(min_value=0, max_value=2**128 - 1)


@settings(max_examples=200, deadline=None)
@given(trace_id=_ids, span_id=st.integers(min_value=0, max_value=2**64 - 1),
       flags=st.integers(min_value=0, max_value=255), remote=st.booleans(),
       state=st.lists(st.tuples(st.from_regex(r"[a-z][a-z0-9_\-*/]{0,10}", fullmatch=True),
                                st.from_regex(r"[a-zA-Z0-9]{1,8}", fullmatch=True)),
                      max_size=3, unique_by=lambda kv: kv[0]),
       bag=st.dictionaries(st.from_regex(r"[a-z]{1,6}", fullmatch=True),
                           st.from_regex(r"[a-z0-9]{1,6}", fullmatch=True), max_size=2))
def test_carrier_equals_what_propagate_inject_writes(
        trace_id: int, span_id: int, flags: int, remote: bool,
        state: list[tuple[str, str]], bag: dict[str, str]) -> None:
    """For any span context (valid or not, any flags, with or without trace state) and any
    baggage, under the default propagator, the frame's carrier is exactly what
    propagate.inject writes."""
    span_context = SpanContext(trace_id=trace_id, span_id=span_id, is_remote=remote,
                               trace_flags=TraceFlags(flags), trace_state=TraceState(state))
    ctx = trace.set_span_in_context(NonRecordingSpan(span_context))
    for key, value in bag.items():
        ctx = baggage.set_baggage(key, value, ctx)
    token = otel_context.attach(ctx)
    try:
        assert trace_carrier() == _expected()
    finally:
        otel_context.detach(token)


def test_sdk_span_carrier_equals_inject(textmap: None) -> None:
    """Inside a real SDK span (sampled, the common case) the carrier is inject's traceparent,
    and without baggage propagator baggage is not sent."""
    tracer = TracerProvider().get_tracer("t")
    with tracer.start_as_current_span("s"):
        assert trace_carrier() == _expected()
        assert set(trace_carrier()) == {"traceparent"}
        token = otel_context.attach(baggage.set_baggage("k", "v"))
        try:
            assert trace_carrier() == _expected()
            assert "baggage" in trace_carrier()
            propagate.set_global_textmap(
                CompositePropagator([TraceContextTextMapPropagator()]))
            assert trace_carrier() == _expected()
            assert "baggage" not in trace_carrier()
        finally:
            otel_context.detach(token)


def test_baggage_without_span_is_sent(textmap: None) -> None:
    """Baggage with no span is injected as the default propagator would (baggage only)."""
    token = otel_context.attach(baggage.set_baggage("k", "v"))
    try:
        assert trace_carrier() == _expected() == {"baggage": "k=v"}
    finally:
        otel_context.detach(token)
