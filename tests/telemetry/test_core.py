"""The telemetry core: spans, error marking, the no-SDK fast path, never raising."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from opentelemetry import trace
from opentelemetry.trace import SpanKind, StatusCode

from envlink import CallTimeoutError, telemetry
from envlink._telemetry import instruments as _telemetry
from envlink._telemetry.instruments import Telemetry, error_type_of, get_telemetry

from .._otel_support import Otel

pytestmark = pytest.mark.timeout(30)


def test_span_records_name_kind_parent_attributes(otel: Otel) -> None:
    """Telemetry.span nests spans with the given kind and attributes."""
    tel = get_telemetry(otel.tracer_provider, otel.meter_provider)
    with tel.span("envlink.bridge step"), tel.span(
        "step", kind=SpanKind.CLIENT, attributes={"rpc.method": "step"}
    ):
        pass
    spans = {s.name: s for s in otel.exporter.get_finished_spans()}
    got = [(s.name, s.kind, s.parent.span_id if s.parent else None, dict(s.attributes or {}))
           for s in otel.exporter.get_finished_spans()]
    outer = spans["envlink.bridge step"].context.span_id
    assert got == [("step", SpanKind.CLIENT, outer, {"rpc.method": "step"}),
                   ("envlink.bridge step", SpanKind.INTERNAL, None, {})]


def test_span_marks_error_and_reraises_untouched(otel: Otel) -> None:
    """An escaping exception sets error.type + ERROR and propagates as the same object."""
    tel = get_telemetry(otel.tracer_provider, otel.meter_provider)
    exc = CallTimeoutError("deadline", method="step", timeout=1.0)
    with pytest.raises(CallTimeoutError) as caught, tel.span("step", kind=SpanKind.CLIENT):
        raise exc
    assert caught.value is exc
    (span,) = otel.exporter.get_finished_spans()
    assert span.status.status_code is StatusCode.ERROR
    assert dict(span.attributes or {}) == {"error.type": "timeout"}
    assert [e.name for e in span.events] == ["exception"]


def test_error_type_names() -> None:
    """error.type: envlink's own names, builtins by name, others fully qualified."""
    assert error_type_of(CallTimeoutError("x")) == "timeout"
    assert error_type_of(ValueError("x")) == "ValueError"
    assert error_type_of(subprocess.TimeoutExpired("c", 1)) == "subprocess.TimeoutExpired"


def test_no_sdk_span_is_noop_and_keeps_context() -> None:
    """With the API's no-op provider no span is started; the current context is untouched."""
    tel = Telemetry(trace.NoOpTracerProvider(), None)
    assert not tel.tracing_enabled()
    before = trace.get_current_span()
    with tel.span("step") as span:
        assert span is trace.INVALID_SPAN
        assert trace.get_current_span() is before
    with pytest.raises(KeyError), tel.span("step"):
        raise KeyError("x")


def test_instruments_never_raise(otel: Otel) -> None:
    """add/record swallow errors from a broken instrument."""
    tel = get_telemetry(otel.tracer_provider, otel.meter_provider)

    class Broken:
        def add(self, *a: object) -> None:
            raise RuntimeError("x")

        def record(self, *a: object) -> None:
            raise RuntimeError("x")

    tel.add(Broken(), 1)  # type: ignore[arg-type]
    tel.record(Broken(), 1.0)  # type: ignore[arg-type]


def test_get_telemetry_is_cached(otel: Otel) -> None:
    """get_telemetry returns one Telemetry per provider pair."""
    a = get_telemetry(otel.tracer_provider, otel.meter_provider)
    assert get_telemetry(otel.tracer_provider, otel.meter_provider) is a
    assert get_telemetry(otel.tracer_provider, None) is not a


def test_global_provider_installed_later_is_used() -> None:
    """A Telemetry made before the global SDK is installed records spans once it is."""
    code = textwrap.dedent("""
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
            InMemorySpanExporter)
        from envlink._telemetry.instruments import get_telemetry
        tel = get_telemetry()
        with tel.span("before"):
            pass
        assert not tel.tracing_enabled()
        exporter = InMemorySpanExporter()
        tp = TracerProvider()
        tp.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(tp)
        with tel.span("after"):
            pass
        print([s.name for s in exporter.get_finished_spans()])
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=20, check=True).stdout
    assert out.strip() == "['after']"


def test_public_module_reexports_names() -> None:
    """envlink.telemetry re-exports every name constant of the core, same values."""
    for name in _telemetry.__all__:
        if name.isupper():
            assert getattr(telemetry, name) == getattr(_telemetry, name), name
            assert name in telemetry.__all__
    assert set(telemetry.METRIC_NAMES) == {
        getattr(telemetry, n) for n in telemetry.__all__ if n.startswith("METRIC_")
        and n != "METRIC_NAMES"}


def test_public_module_all_is_complete() -> None:
    """Every name in envlink.telemetry.__all__ exists, and the API functions are there."""
    for name in telemetry.__all__:
        assert hasattr(telemetry, name), name
    assert {"configure", "TelemetryHandle", "add_trace_context", "configure_logging",
            "trace_context"} <= set(telemetry.__all__)


def test_telemetry_cache_keeps_no_provider_alive() -> None:
    """Providers an application drops are collected, and their cache entries go with them."""
    import gc
    import weakref

    from opentelemetry.sdk.metrics import MeterProvider as SdkMeterProvider
    from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider

    from envlink._telemetry import instruments as _telemetry

    refs = []
    for _ in range(20):
        tp, mp = SdkTracerProvider(), SdkMeterProvider()
        tel = _telemetry.get_telemetry(tp, mp)
        assert _telemetry.get_telemetry(tp, mp) is tel  # cached while alive
        with tel.span("x"):
            pass
        refs.append(weakref.ref(tp))
        key = (id(tp), id(mp))
        tp.shutdown()
        mp.shutdown()
        del tp, mp, tel
    gc.collect()
    assert [r for r in refs if r() is not None] == []
    assert key not in _telemetry._cache
