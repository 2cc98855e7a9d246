"""Local OpenTelemetry SDK providers for one test: in-memory spans and metrics."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from envlink import Bridge


@dataclass
class Otel:
    """SDK providers of one test (never the global ones), with what they recorded."""

    tracer_provider: TracerProvider
    meter_provider: MeterProvider
    exporter: InMemorySpanExporter
    reader: InMemoryMetricReader
    _bridge: Bridge | None = field(default=None, repr=False)

    @classmethod
    @contextlib.contextmanager
    def capture(cls) -> Iterator[Otel]:
        """Fresh providers for the block; shut down (and the bridge closed) after it."""
        exporter = InMemorySpanExporter()
        tp = TracerProvider()
        tp.add_span_processor(SimpleSpanProcessor(exporter))
        reader = InMemoryMetricReader()
        mp = MeterProvider(metric_readers=[reader])
        otel = cls(tp, mp, exporter, reader)
        try:
            yield otel
        finally:
            if otel._bridge is not None:
                otel._bridge.close()
            tp.shutdown()
            mp.shutdown()

    @property
    def bridge(self) -> Bridge:
        """A bridge emitting to these providers (created on first use, closed at the end)."""
        if self._bridge is None:
            self._bridge = Bridge(tracer_provider=self.tracer_provider,
                                  meter_provider=self.meter_provider)
        return self._bridge

    def spans(self) -> list[ReadableSpan]:
        """The finished spans, in order."""
        return list(self.exporter.get_finished_spans())

    def metrics(self) -> list[Any]:
        """Every metric recorded so far (the SDK's ``Metric`` objects)."""
        data = self.reader.get_metrics_data()
        if data is None:
            return []
        return [m for rm in data.resource_metrics for sm in rm.scope_metrics
                for m in sm.metrics]

    def points(self, metric: str) -> list[Any]:
        """Data points of ``metric`` (empty if it was never recorded)."""
        return [p for m in self.metrics() if m.name == metric for p in m.data.data_points]
