"""OTLP end to end: configure() exports real protobuf to receivers on 127.0.0.1."""

from __future__ import annotations

import pytest
from opentelemetry.trace import SpanKind

from envlink._telemetry.instruments import get_telemetry
from envlink.telemetry import configure

from .conftest import Receiver

pytestmark = pytest.mark.timeout(30)

_CLIENT = 3  # opentelemetry.proto.trace.v1.Span.SPAN_KIND_CLIENT


def _emit(handle_tp: object, handle_mp: object) -> None:
    tel = get_telemetry(handle_tp, handle_mp)  # type: ignore[arg-type]
    with tel.span("envlink.bridge step"), tel.span(
        "step", kind=SpanKind.CLIENT,
        attributes={"rpc.system.name": "openenv", "rpc.method": "step",
                    "server.address": "127.0.0.1", "server.port": 8000},
    ):
        tel.record(tel.call_duration, 0.004, {"rpc.method": "step", "envlink.outcome": "ok"})
        tel.add(tel.attempts, 1, {"rpc.method": "step"})


def _check(receiver: Receiver) -> None:
    spans = {s.name: s for s in receiver.received.spans()}
    assert set(spans) == {"step", "envlink.bridge step"}
    step = spans["step"]
    assert step.kind == _CLIENT
    assert step.parent_span_id == spans["envlink.bridge step"].span_id
    attrs = {kv.key: (kv.value.string_value or kv.value.int_value) for kv in step.attributes}
    assert attrs == {"rpc.system.name": "openenv", "rpc.method": "step",
                     "server.address": "127.0.0.1", "server.port": 8000}
    assert {"rpc.client.call.duration", "envlink.client.attempts"} <= (
        receiver.received.metric_names())
    for resource in receiver.received.resources():
        assert resource["service.name"] == "otlp-test"
    hist = next(m for req in receiver.received.metrics for rm in req.resource_metrics
            for sm in rm.scope_metrics for m in sm.metrics
            if m.name == "rpc.client.call.duration")
    assert hist.unit == "s"
    point = hist.histogram.data_points[0]
    assert list(point.explicit_bounds)[:3] == [0.005, 0.01, 0.025]  # semconv seconds buckets


def test_otlp_http_export(otlp_http_receiver: Receiver) -> None:
    """Over OTLP/HTTP, spans and metrics reach /v1/traces and /v1/metrics as protobuf."""
    h = configure(service_name="otlp-test", otlp_endpoint=otlp_http_receiver.endpoint,
                  set_global=False)
    _emit(h.tracer_provider, h.meter_provider)
    h.shutdown()  # flushes: both exports have completed when it returns
    assert set(otlp_http_receiver.received.paths) == {"/v1/traces", "/v1/metrics"}
    _check(otlp_http_receiver)


def test_otlp_grpc_export(otlp_grpc_receiver: Receiver) -> None:
    """Over OTLP/gRPC, spans and metrics reach the generated servicers."""
    h = configure(service_name="otlp-test", otlp_endpoint=otlp_grpc_receiver.endpoint,
                  otlp_protocol="grpc", set_global=False)
    _emit(h.tracer_provider, h.meter_provider)
    h.shutdown()
    _check(otlp_grpc_receiver)


def test_otlp_from_environment(otlp_grpc_receiver: Receiver,
                               monkeypatch: pytest.MonkeyPatch) -> None:
    """OTEL_EXPORTER_OTLP_ENDPOINT/PROTOCOL and OTEL_SERVICE_NAME alone enable OTLP export."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", otlp_grpc_receiver.endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "otlp-test")
    h = configure(set_global=False)
    _emit(h.tracer_provider, h.meter_provider)
    h.shutdown()
    _check(otlp_grpc_receiver)


def test_otlp_http_from_environment_base_url(otlp_http_receiver: Receiver,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """With OTEL_EXPORTER_OTLP_ENDPOINT as a base URL, HTTP export appends the signal paths."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", otlp_http_receiver.endpoint + "/")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "otlp-test")
    h = configure(set_global=False)
    _emit(h.tracer_provider, h.meter_provider)
    h.shutdown()
    assert set(otlp_http_receiver.received.paths) == {"/v1/traces", "/v1/metrics"}
    _check(otlp_http_receiver)
