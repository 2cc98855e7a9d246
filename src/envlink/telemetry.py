"""envlink's public telemetry module: one-call SDK setup, log correlation, names.

envlink's library code depends on the OpenTelemetry *API* only: it emits to
whatever providers the application configured, or to the providers passed to a
client (``tracer_provider=``, ``meter_provider=``). Applications that already
configure the OpenTelemetry SDK need nothing from here. For scripts, notebooks
and the demo, :func:`configure` sets up the SDK in one call::

    from envlink.telemetry import configure

    handle = configure(service_name="trainer", otlp_endpoint="http://127.0.0.1:4318",
                       prometheus_port=9464)
    ...
    handle.shutdown()   # flushes spans and metrics

The names of every span, metric and attribute envlink emits are a public
contract, documented in ``docs/telemetry.md`` and re-exported here as constants.
"""

from __future__ import annotations

import contextlib
import os
import threading
import warnings
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
)
from opentelemetry.sdk.trace.sampling import ParentBased, Sampler, TraceIdRatioBased

from envlink import names
from envlink._config import check_number
from envlink._telemetry.bridge_hook import BridgeTelemetryHook
from envlink._telemetry.client_hook import ClientTelemetryHook
from envlink._telemetry.logs import add_trace_context, configure_logging, trace_context
from envlink.names import *  # noqa: F403 - the single list of names, re-exported

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

__all__ = [
    *names.__all__,
    "BridgeTelemetryHook",
    "ClientTelemetryHook",
    "OtlpProtocol",
    "TelemetryHandle",
    "add_trace_context",
    "configure",
    "configure_logging",
    "trace_context",
]

OtlpProtocol = Literal["http/protobuf", "grpc"]

_DEFAULT_SERVICE_NAME = "envlink"
_PROTOCOLS: tuple[str, ...] = ("http/protobuf", "grpc")


class TelemetryHandle:
    """The SDK providers :func:`configure` built, and how to stop them.

    Attributes:
        tracer_provider: the SDK tracer provider (pass it to clients and servers
            when ``set_global=False``).
        meter_provider: the SDK meter provider.
        resource: the resource (service name and attributes) on all telemetry.
        prometheus_port: the port the Prometheus endpoint is bound to, or
            ``None`` when no endpoint was requested.
        prometheus_url: ``http://host:port/metrics`` of that endpoint, or ``None``.
        is_global: whether the providers were installed as the global ones.
    """

    def __init__(
        self,
        tracer_provider: TracerProvider,
        meter_provider: MeterProvider,
        *,
        prometheus_server: WSGIServer | None = None,
        prometheus_host: str | None = None,
        is_global: bool = False,
    ) -> None:
        self.tracer_provider = tracer_provider
        self.meter_provider = meter_provider
        self.resource: Resource = tracer_provider.resource
        self.is_global = is_global
        self._prometheus_server = prometheus_server
        self.prometheus_port: int | None = (
            int(prometheus_server.server_port) if prometheus_server is not None else None
        )
        self.prometheus_url: str | None = (
            f"http://{_url_host(prometheus_host or '127.0.0.1')}:{self.prometheus_port}/metrics"
            if prometheus_server is not None
            else None
        )
        self._lock = threading.Lock()
        self._closed = False

    def force_flush(self, timeout_s: float = 30.0) -> bool:
        """Export every span and metric recorded so far.

        Args:
            timeout_s: the longest to wait, in seconds.

        Returns:
            ``True`` if both providers flushed within the timeout.
        """
        millis = int(timeout_s * 1000)
        spans_ok = self.tracer_provider.force_flush(millis)
        metrics_ok = self.meter_provider.force_flush(millis)
        return bool(spans_ok and metrics_ok)

    def shutdown(self, timeout_s: float = 30.0) -> None:
        """Flush and shut down both providers and stop the Prometheus endpoint.

        Idempotent; later calls do nothing.

        Args:
            timeout_s: the longest to wait for the final exports, in all.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True

        def stop_providers() -> None:
            try:
                self.tracer_provider.shutdown()
            finally:
                # An export that missed the deadline is reported by the SDK's own log;
                # shutting down must not raise into the application's exit path.
                with contextlib.suppress(Exception):
                    self.meter_provider.shutdown(timeout_millis=timeout_s * 1000)

        # Exporters stuck on an unreachable collector can block far longer than
        # timeout_s (the SDK's tracer shutdown takes no timeout, and a flush exports in
        # the calling thread): run it on a helper thread and wait at most timeout_s.
        stopper = threading.Thread(target=stop_providers, name="envlink-telemetry-shutdown",
                                   daemon=True)
        try:
            stopper.start()
            stopper.join(timeout_s)
        finally:
            server = self._prometheus_server
            if server is not None:
                server.shutdown()
                server.server_close()

    def __enter__(self) -> TelemetryHandle:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        name = self.resource.attributes.get(SERVICE_NAME)
        return (
            f"<TelemetryHandle service={name!r} prometheus_port={self.prometheus_port} "
            f"global={self.is_global}>"
        )


def configure(
    *,
    service_name: str | None = None,
    resource_attributes: Mapping[str, Any] | None = None,
    console: bool = False,
    otlp_endpoint: str | None = None,
    otlp_protocol: OtlpProtocol | None = None,
    prometheus_port: int | None = None,
    prometheus_host: str = "127.0.0.1",
    span_exporters: Sequence[SpanExporter | SpanProcessor] = (),
    metric_readers: Sequence[MetricReader] = (),
    metric_export_interval: float | None = None,
    set_global: bool = True,
    exemplars: bool | None = None,
    trace_sample_ratio: float | None = None,
) -> TelemetryHandle:
    """Set up the OpenTelemetry SDK for envlink in one call (scripts, notebooks, demo).

    The standard ``OTEL_*`` environment variables are respected: ``OTEL_SERVICE_NAME``
    and ``OTEL_RESOURCE_ATTRIBUTES`` (explicit arguments win over them),
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` and its ``_TRACES_``/``_METRICS_`` variants
    (which enable OTLP export when ``otlp_endpoint`` is not given),
    ``OTEL_EXPORTER_OTLP_PROTOCOL`` (and per-signal variants), and everything the
    exporters and processors read themselves (``OTEL_EXPORTER_OTLP_HEADERS``,
    ``..._TIMEOUT``, ``..._COMPRESSION``, ``OTEL_BSP_*``, ``OTEL_METRIC_EXPORT_INTERVAL``,
    ``OTEL_METRICS_EXEMPLAR_FILTER``, ``OTEL_SDK_DISABLED``).

    Args:
        service_name: ``service.name`` of the resource. Default: from the
            environment, else ``"envlink"``.
        resource_attributes: more resource attributes (``deployment.environment``...).
        console: print spans as they end and metrics at each export (and at
            shutdown) to standard output.
        otlp_endpoint: base URL of an OTLP receiver, such as a Collector
            (``http://127.0.0.1:4318`` for HTTP, ``http://127.0.0.1:4317`` for
            gRPC). For HTTP, ``/v1/traces`` and ``/v1/metrics`` are appended.
            Needs the ``otlp`` extra.
        otlp_protocol: ``"http/protobuf"`` or ``"grpc"``. Default: from
            ``OTEL_EXPORTER_OTLP_PROTOCOL``, else ``"http/protobuf"``.
        prometheus_port: serve a Prometheus scrape endpoint on this port (``0``:
            any free port, see :attr:`TelemetryHandle.prometheus_port`). Needs
            the ``prometheus`` extra.
        prometheus_host: address the scrape endpoint binds to.
        span_exporters: more span exporters, each behind a batching processor,
            or span processors, used as they are (pass
            ``SimpleSpanProcessor(InMemorySpanExporter())`` to read spans at once).
        metric_readers: more metric readers (``InMemoryMetricReader``, ...).
        metric_export_interval: seconds between periodic metric exports (console,
            OTLP). Default: ``OTEL_METRIC_EXPORT_INTERVAL``, else 60 s. Every
            reader also exports at :meth:`TelemetryHandle.shutdown`.
        set_global: install the providers as OpenTelemetry's global providers,
            so every envlink client created without explicit providers uses them.
        exemplars: attach exemplars (the trace and span id of a sampled
            measurement) to metric points. Default: off, unless
            ``OTEL_METRICS_EXEMPLAR_FILTER`` says otherwise. The SDK's own default
            (``trace_based``) makes every measurement taken inside a sampled span
            offer an exemplar, which adds a filter check and a reservoir offer to
            every measurement (its cost is in ``docs/performance.md``); pass
            ``True`` for the SDK's trace-based filter.
        trace_sample_ratio: head sampling of traces: keep this fraction of new
            traces (``ParentBased(TraceIdRatioBased(ratio))``: a call inside a
            sampled parent is always kept, one inside an unsampled parent never).
            Metrics still count every call. Default: every trace, unless
            ``OTEL_TRACES_SAMPLER`` says otherwise. An unsampled call makes no
            recording span, which removes about half of the SDK's cost per call;
            the duration record that keeps the metrics exact remains
            (``docs/performance.md``, "The SDK path at scale").

    Returns:
        A :class:`TelemetryHandle`; call its ``shutdown()`` before exiting to flush.

    Raises:
        ImportError: OTLP or Prometheus export was requested but its extra
            (``envlink[otlp]``, ``envlink[prometheus]``) is not installed.
        ValueError: ``otlp_protocol`` (or ``OTEL_EXPORTER_OTLP_PROTOCOL``) is
            not one of ``http/protobuf``, ``grpc``; ``prometheus_port`` is
            out of range; or ``trace_sample_ratio`` is not within 0..1.
        OSError: the Prometheus endpoint could not bind its port (e.g. in use).
    """
    check_number(prometheus_port, "prometheus_port", integer=True, minimum=0, maximum=65535,
                 optional=True)
    sampler = _sampler(trace_sample_ratio)
    resource = _make_resource(service_name, resource_attributes)
    interval_ms = metric_export_interval * 1000 if metric_export_interval is not None else None

    processors: list[SpanProcessor] = []
    readers: list[MetricReader] = []
    prometheus_server: WSGIServer | None = None
    try:
        if console:
            from opentelemetry.sdk.metrics.export import ConsoleMetricExporter
            from opentelemetry.sdk.trace.export import ConsoleSpanExporter

            processors.append(SimpleSpanProcessor(ConsoleSpanExporter()))
            readers.append(PeriodicExportingMetricReader(
                ConsoleMetricExporter(), export_interval_millis=interval_ms))
        traces_endpoint = otlp_endpoint or _env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                                                "OTEL_EXPORTER_OTLP_ENDPOINT")
        metrics_endpoint = otlp_endpoint or _env("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
                                                 "OTEL_EXPORTER_OTLP_ENDPOINT")
        if traces_endpoint:
            protocol = _protocol(otlp_protocol, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
            processors.append(BatchSpanProcessor(_otlp_span_exporter(protocol, otlp_endpoint)))
        if metrics_endpoint:
            protocol = _protocol(otlp_protocol, "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL")
            readers.append(PeriodicExportingMetricReader(
                _otlp_metric_exporter(protocol, otlp_endpoint),
                export_interval_millis=interval_ms))
        if prometheus_port is not None:
            reader, prometheus_server = _start_prometheus(prometheus_host, prometheus_port)
            readers.append(reader)
    except BaseException:
        # Processors and periodic readers run threads from construction: stop the
        # ones built here before the failure (the caller's objects are untouched).
        for processor in processors:
            processor.shutdown()
        for own_reader in readers:
            own_reader.shutdown()
        raise
    for item in span_exporters:
        processors.append(item if isinstance(item, SpanProcessor) else BatchSpanProcessor(item))
    readers.extend(metric_readers)

    tracer_provider = (TracerProvider(resource=resource) if sampler is None
                       else TracerProvider(resource=resource, sampler=sampler))
    for processor in processors:
        tracer_provider.add_span_processor(processor)
    meter_provider = MeterProvider(resource=resource, metric_readers=readers,
                                   **_exemplar_filter(exemplars))

    is_global = False
    if set_global:
        is_global = _install_global(tracer_provider, meter_provider)
    return TelemetryHandle(
        tracer_provider, meter_provider, prometheus_server=prometheus_server,
        prometheus_host=prometheus_host, is_global=is_global,
    )


# ---------------------------------------------------------------------------- helpers


def _sampler(ratio: float | None) -> Sampler | None:
    """``ParentBased(TraceIdRatioBased(ratio))``, or None for the SDK's default."""
    if ratio is None:
        return None
    check_number(ratio, "trace_sample_ratio", minimum=0, maximum=1)
    return ParentBased(TraceIdRatioBased(float(ratio)))


def _exemplar_filter(exemplars: bool | None) -> dict[str, Any]:
    """The MeterProvider's exemplar filter: off unless asked for (argument, then env)."""
    from opentelemetry.sdk.metrics import AlwaysOffExemplarFilter, TraceBasedExemplarFilter

    if exemplars is None:
        if _env("OTEL_METRICS_EXEMPLAR_FILTER"):
            return {}  # the SDK reads the variable itself
        exemplars = False
    return {"exemplar_filter": TraceBasedExemplarFilter() if exemplars
            else AlwaysOffExemplarFilter()}


def _env(*names: str) -> str | None:
    for name in names:
        value = os.environ.get(name, "").strip()
        if value:
            return value
    return None


def _make_resource(service_name: str | None,
                   resource_attributes: Mapping[str, Any] | None) -> Resource:
    attributes = dict(resource_attributes or {})
    if service_name is not None:
        attributes[SERVICE_NAME] = service_name
    resource = Resource.create(attributes)
    name = resource.attributes.get(SERVICE_NAME)
    if SERVICE_NAME not in attributes and (
        not isinstance(name, str) or name.startswith("unknown_service")
    ):
        # Neither the caller nor the environment named the service.
        resource = resource.merge(Resource({SERVICE_NAME: _DEFAULT_SERVICE_NAME}))
    return resource


def _protocol(explicit: str | None, signal_env: str) -> str:
    protocol = explicit or _env(signal_env, "OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf"
    if protocol not in _PROTOCOLS:
        raise ValueError(
            f"unsupported OTLP protocol {protocol!r}; expected one of {', '.join(_PROTOCOLS)}"
        )
    return protocol


def _missing_extra(extra: str, what: str, exc: ImportError) -> ImportError:
    err = ImportError(
        f"{what} needs the '{extra}' extra, which is not installed: "
        f"pip install 'envlink[{extra}]' ({exc})"
    )
    err.name = exc.name
    return err


def _http_url(base: str, path: str) -> str:
    return base.rstrip("/") + path


def _otlp_span_exporter(protocol: str, endpoint: str | None) -> SpanExporter:
    # endpoint None: the exporter resolves OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT itself.
    try:
        if protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
                OTLPSpanExporter as GrpcSpanExporter,
            )

            return GrpcSpanExporter(endpoint=endpoint)
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
            OTLPSpanExporter as HttpSpanExporter,
        )
    except ImportError as exc:
        raise _missing_extra("otlp", f"OTLP span export over {protocol}", exc) from exc
    return HttpSpanExporter(endpoint=_http_url(endpoint, "/v1/traces") if endpoint else None)


def _otlp_metric_exporter(protocol: str, endpoint: str | None) -> Any:
    try:
        if protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (
                OTLPMetricExporter as GrpcMetricExporter,
            )

            return GrpcMetricExporter(endpoint=endpoint)
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
            OTLPMetricExporter as HttpMetricExporter,
        )
    except ImportError as exc:
        raise _missing_extra("otlp", f"OTLP metric export over {protocol}", exc) from exc
    return HttpMetricExporter(endpoint=_http_url(endpoint, "/v1/metrics") if endpoint else None)


def _start_prometheus(host: str, port: int) -> tuple[MetricReader, WSGIServer]:
    try:
        from opentelemetry.exporter.prometheus import PrometheusMetricReader
        from prometheus_client import CollectorRegistry, start_http_server
    except ImportError as exc:
        raise _missing_extra("prometheus", "the Prometheus endpoint", exc) from exc

    class _ScrapeOnlyReader(PrometheusMetricReader):
        """The exporter's reader, collected by one scrape at a time and by scrapes only.

        The exporter queues every collection it receives and renders each queued
        snapshot as a full set of families, so a collection that no scrape asked for
        (``force_flush()``, which collects every reader) or two scrapes collecting at
        once (an HA pair of Prometheus servers) would put every family twice into
        one exposition. Here a scrape holds a lock for its whole collection and only
        the collection made by the scraping thread reaches the exporter; others are
        dropped, which loses nothing: temporality is cumulative, so the next scrape's
        snapshot contains everything.
        """

        def __init__(self) -> None:
            # The exporter's collector lives in a registry of its own, read only by
            # :meth:`scrape`; the served registry holds the serialising collector.
            self._exporter_registry = CollectorRegistry()
            self._scrape_lock = threading.Lock()
            self._scraping_thread: int | None = None
            super().__init__(registry=self._exporter_registry)

        def _receive_metrics(self, metrics_data: Any, timeout_millis: float = 10_000,
                             **kwargs: Any) -> None:
            if self._scraping_thread == threading.get_ident():
                super()._receive_metrics(metrics_data, timeout_millis, **kwargs)

        def collect_for_scrape(self) -> list[Any]:
            with self._scrape_lock:
                self._scraping_thread = threading.get_ident()
                try:
                    return list(self._exporter_registry.collect())
                finally:
                    self._scraping_thread = None

    class _SerialisedCollector:
        """What the served registry collects: the reader, one scrape at a time."""

        def __init__(self, reader: _ScrapeOnlyReader) -> None:
            self._reader = reader

        def describe(self) -> list[Any]:
            return []  # no collection when registered: nothing is set up yet

        def collect(self) -> list[Any]:
            return self._reader.collect_for_scrape()

    # A registry of our own: several handles (tests, libraries) never collide on
    # prometheus_client's global registry, and the endpoint shows envlink's metrics.
    registry = CollectorRegistry()
    reader = _ScrapeOnlyReader()
    registry.register(_SerialisedCollector(reader))
    try:
        server, _thread = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        reader.shutdown()
        raise OSError(
            exc.errno,
            f"cannot serve Prometheus metrics on {_url_host(host)}:{port}: "
            f"{exc.strerror or exc}",
        ) from exc
    return reader, server


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _install_global(tracer_provider: TracerProvider, meter_provider: MeterProvider) -> bool:
    trace.set_tracer_provider(tracer_provider)
    metrics.set_meter_provider(meter_provider)
    installed = (trace.get_tracer_provider() is tracer_provider
                 and metrics.get_meter_provider() is meter_provider)
    if not installed:
        warnings.warn(
            "envlink.telemetry.configure(): global OpenTelemetry providers were already "
            "set, and OpenTelemetry allows setting them only once; pass "
            "handle.tracer_provider / handle.meter_provider to clients explicitly",
            RuntimeWarning,
            stacklevel=3,
        )
    return installed
