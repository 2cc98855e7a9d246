"""configure(): resource, environment variables, exporters, errors, Prometheus endpoint."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
import urllib.request

import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from envlink._telemetry.instruments import get_telemetry
from envlink.telemetry import TelemetryHandle, configure

pytestmark = pytest.mark.timeout(30)


def _scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        body: bytes = response.read()
    return body.decode()


def test_service_name_default_and_explicit() -> None:
    """service.name: 'envlink' by default, the argument when given, plus extra attributes."""
    with configure(set_global=False) as h:
        assert h.resource.attributes["service.name"] == "envlink"
        assert h.prometheus_port is None
        assert h.prometheus_url is None
    with configure(service_name="trainer", resource_attributes={"deployment.environment": "t"},
                   set_global=False) as h:
        assert h.resource.attributes["service.name"] == "trainer"
        assert h.resource.attributes["deployment.environment"] == "t"


def test_service_name_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES apply; explicit arguments win."""
    monkeypatch.setenv("OTEL_SERVICE_NAME", "from-env")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "team=rl,deployment.environment=prod")
    with configure(set_global=False) as h:
        assert h.resource.attributes["service.name"] == "from-env"
        assert h.resource.attributes["team"] == "rl"
    with configure(service_name="explicit", resource_attributes={"team": "x"},
                   set_global=False) as h:
        assert h.resource.attributes["service.name"] == "explicit"
        assert h.resource.attributes["team"] == "x"
        assert h.resource.attributes["deployment.environment"] == "prod"


def test_extra_exporters_and_readers_receive_telemetry() -> None:
    """Span exporters/processors and metric readers passed in get envlink's telemetry."""
    spans = InMemorySpanExporter()
    batched = InMemorySpanExporter()
    reader = InMemoryMetricReader()
    h = configure(span_exporters=[SimpleSpanProcessor(spans), batched],
                  metric_readers=[reader], set_global=False)
    tel = get_telemetry(h.tracer_provider, h.meter_provider)
    with tel.span("reset", kind=SpanKind.CLIENT):
        tel.record(tel.call_duration, 0.002, {"rpc.method": "reset"})
    assert [s.name for s in spans.get_finished_spans()] == ["reset"]
    data = reader.get_metrics_data()
    assert data is not None
    names = [m.name for rm in data.resource_metrics for sm in rm.scope_metrics
             for m in sm.metrics]
    assert names == ["rpc.client.call.duration"]
    h.shutdown()
    assert [s.name for s in batched.get_finished_spans()] == ["reset"]  # flushed
    h.shutdown()  # idempotent


def test_bad_protocol_is_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    """An unsupported OTLP protocol (argument or environment) raises ValueError."""
    with pytest.raises(ValueError, match="unsupported OTLP protocol 'http/json'"):
        configure(otlp_endpoint="http://127.0.0.1:1", otlp_protocol="http/json",  # type: ignore[arg-type]
                  set_global=False)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "thrift")
    with pytest.raises(ValueError, match="thrift"):
        configure(set_global=False)


@pytest.mark.parametrize(("module", "extra", "kwargs"), [
    ("opentelemetry.exporter.otlp.proto.http.trace_exporter", "otlp",
     {"otlp_endpoint": "http://127.0.0.1:1"}),
    ("opentelemetry.exporter.otlp.proto.grpc.metric_exporter", "otlp",
     {"otlp_endpoint": "http://127.0.0.1:1", "otlp_protocol": "grpc"}),
    ("opentelemetry.exporter.prometheus", "prometheus", {"prometheus_port": 0}),
])
def test_missing_extra_names_it(monkeypatch: pytest.MonkeyPatch, module: str, extra: str,
                                kwargs: dict[str, object]) -> None:
    """Without the exporter package, ImportError names the extra to install."""
    monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(ImportError, match=rf"pip install 'envlink\[{extra}\]'"):
        configure(set_global=False, **kwargs)  # type: ignore[arg-type]


def test_prometheus_scrape_shows_documented_series() -> None:
    """The scrape endpoint on 127.0.0.1 serves envlink's series under their documented names."""
    with configure(prometheus_port=0, set_global=False) as h:
        assert isinstance(h, TelemetryHandle)
        assert h.prometheus_port
        assert h.prometheus_url == (
            f"http://127.0.0.1:{h.prometheus_port}/metrics")
        tel = get_telemetry(h.tracer_provider, h.meter_provider)
        tel.record(tel.call_duration, 0.003, {"rpc.method": "step", "envlink.outcome": "ok"})
        tel.add(tel.attempts, 1, {"rpc.method": "step"})
        # In flight is observed at collection time from the clients' own counts.
        source = _Inflight({"step": 1})
        tel.add_inflight_source(source)
        tel.record(tel.message_size, 300, {"envlink.direction": "sent"})
        text = _scrape(h.prometheus_url)
        port = h.prometheus_port
    assert 'rpc_client_call_duration_seconds_bucket{envlink_outcome="ok",le="0.005"' in text
    assert "envlink_client_attempts_total{" in text
    assert "envlink_client_inflight{" in text
    assert "envlink_client_message_size_bytes_bucket{" in text
    assert 'service_name="envlink"' in text  # target_info
    with pytest.raises(ConnectionRefusedError), socket.create_connection(
        ("127.0.0.1", port), timeout=2
    ):
        pass  # the endpoint is closed by shutdown()


def test_prometheus_port_in_use_is_a_clear_oserror() -> None:
    """A taken port raises OSError naming host and port, and leaks no exporter threads."""
    import threading

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        before = {t.ident for t in threading.enumerate()}
        with pytest.raises(OSError, match=rf"cannot serve Prometheus metrics on 127.0.0.1:{port}"):
            configure(prometheus_port=port, console=True, otlp_endpoint="http://127.0.0.1:1",
                      set_global=False)
    leaked = [t for t in threading.enumerate() if t.ident not in before and t.is_alive()]
    assert leaked == []


def test_invalid_prometheus_port() -> None:
    """A port outside 0..65535 raises ValueError."""
    with pytest.raises(ValueError, match="prometheus_port"):
        configure(prometheus_port=70000, set_global=False)


def test_set_global_installs_providers_once() -> None:
    """set_global installs the providers; a second configure() warns and is not global."""
    code = textwrap.dedent("""
        import warnings
        from opentelemetry import metrics, trace
        from envlink.telemetry import configure
        h = configure()
        assert h.is_global
        assert trace.get_tracer_provider() is h.tracer_provider
        assert metrics.get_meter_provider() is h.meter_provider
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            h2 = configure()
        assert not h2.is_global
        assert any("already" in str(w.message) for w in caught), caught
        h2.shutdown(); h.shutdown()
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=20)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_console_exporters_print_spans_and_metrics() -> None:
    """console=True prints finished spans and, at shutdown, the metrics."""
    code = textwrap.dedent("""
        from opentelemetry.trace import SpanKind
        from envlink._telemetry.instruments import get_telemetry
        from envlink.telemetry import configure
        h = configure(console=True, set_global=False)
        tel = get_telemetry(h.tracer_provider, h.meter_provider)
        with tel.span("state", kind=SpanKind.CLIENT):
            tel.record(tel.call_duration, 0.001, {"rpc.method": "state"})
        h.shutdown()
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=20, check=True).stdout
    assert '"name": "state"' in out
    assert '"kind": "SpanKind.CLIENT"' in out
    assert "rpc.client.call.duration" in out


def test_shutdown_honours_its_timeout_with_a_hung_collector() -> None:
    """shutdown(timeout_s=1) returns within about a second when the collector never answers."""
    import socket
    import threading
    import time

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    held: list[object] = []
    threading.Thread(target=lambda: [held.append(listener.accept()) for _ in range(8)],
                     daemon=True).start()
    try:
        handle = configure(service_name="t", set_global=False, metric_export_interval=3600,
                           otlp_endpoint=f"http://127.0.0.1:{listener.getsockname()[1]}")
        tracer = handle.tracer_provider.get_tracer("t")
        for i in range(5):
            with tracer.start_as_current_span(f"s{i}"):
                pass
        start = time.monotonic()
        handle.shutdown(timeout_s=1.0)
        assert time.monotonic() - start < 3.0
    finally:
        listener.close()


class _Inflight:
    """A stand-in for a client's telemetry hook: calls in flight by method."""

    def __init__(self, inflight: dict[str, int]) -> None:
        self.inflight = inflight


def _span_and_record(h: TelemetryHandle, calls: int) -> None:
    tel = get_telemetry(h.tracer_provider, h.meter_provider)
    for _ in range(calls):
        with tel.span("step", kind=SpanKind.CLIENT):
            tel.record(tel.call_duration, 0.001, {"rpc.method": "step"})


def _duration_count(reader: InMemoryMetricReader) -> int:
    data = reader.get_metrics_data()
    assert data is not None
    return sum(p.count for rm in data.resource_metrics for sm in rm.scope_metrics
               for m in sm.metrics if m.name == "rpc.client.call.duration"
               for p in m.data.data_points)


@pytest.mark.parametrize(("ratio", "kept"), [(0.0, 0), (1.0, 50), (None, 50)])
def test_trace_sample_ratio_samples_traces_and_keeps_every_measurement(
        ratio: float | None, kept: int) -> None:
    """trace_sample_ratio drops (or keeps) new traces; the duration histogram counts every call."""
    spans = InMemorySpanExporter()
    reader = InMemoryMetricReader()
    with configure(span_exporters=[SimpleSpanProcessor(spans)], metric_readers=[reader],
                   set_global=False, trace_sample_ratio=ratio) as h:
        _span_and_record(h, 50)
        assert len(spans.get_finished_spans()) == kept
        assert _duration_count(reader) == 50


def test_trace_sample_ratio_keeps_the_decision_of_a_sampled_parent() -> None:
    """ParentBased: under a sampled parent a call is traced even at ratio 0."""
    spans = InMemorySpanExporter()
    with configure(span_exporters=[SimpleSpanProcessor(spans)], set_global=False,
                   trace_sample_ratio=0.0) as h:
        from opentelemetry import context, trace
        from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

        parent = SpanContext(trace_id=0x1234, span_id=0x5678, is_remote=True,
                             trace_flags=TraceFlags(TraceFlags.SAMPLED))
        token = context.attach(trace.set_span_in_context(NonRecordingSpan(parent)))
        try:
            _span_and_record(h, 3)
        finally:
            context.detach(token)
        finished = spans.get_finished_spans()
        assert len(finished) == 3
        assert {s.context.trace_id for s in finished} == {0x1234}


@pytest.mark.parametrize(("ratio", "error"), [
    (-0.1, ValueError), (1.5, ValueError), (float("nan"), ValueError),
    (True, TypeError), ("0.5", TypeError)])
def test_invalid_trace_sample_ratio_is_refused(ratio: object, error: type[Exception]) -> None:
    """A ratio outside 0..1, NaN, a bool or a string is refused before anything starts."""
    with pytest.raises(error, match="trace_sample_ratio"):
        configure(set_global=False, trace_sample_ratio=ratio)  # type: ignore[arg-type]
