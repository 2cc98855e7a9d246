"""Fixtures for the sync-bridge tests: bridges that are always closed, local OTel providers."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from envlink._bridge import Bridge


def envlink_threads() -> set[threading.Thread]:
    """Live threads started by envlink."""
    return {t for t in threading.enumerate() if t.name.startswith("envlink")}


@pytest.fixture
def bridge() -> Iterator[Bridge]:
    b = Bridge()
    try:
        yield b
    finally:
        b.close()


@dataclass
class Otel:
    tracer_provider: TracerProvider
    meter_provider: MeterProvider
    exporter: InMemorySpanExporter
    reader: InMemoryMetricReader
    bridge: Bridge

    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def points(self, metric: str) -> list[Any]:
        """Histogram data points of ``metric`` (empty if it was never recorded)."""
        data = self.reader.get_metrics_data()
        found: list[Any] = []
        if data is None:
            return found
        for rm in data.resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    if m.name == metric:
                        found.extend(m.data.data_points)
        return found


@pytest.fixture
def otel() -> Iterator[Otel]:
    exporter = InMemorySpanExporter()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    mp = MeterProvider(metric_readers=[reader])
    b = Bridge(tracer_provider=tp, meter_provider=mp)
    try:
        yield Otel(tp, mp, exporter, reader, b)
    finally:
        b.close()
        tp.shutdown()
        mp.shutdown()
