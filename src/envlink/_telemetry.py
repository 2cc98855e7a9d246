"""envlink's OpenTelemetry plumbing: tracer, meter and instruments, created once.

Library code uses the OpenTelemetry *API* only. Tracer, meter and instruments are
created once per (tracer provider, meter provider) pair and cached; with no SDK
configured they are the API's no-op (proxy) objects and cost close to nothing.
Nothing here raises into the caller: a failing exporter or a bad attribute is
swallowed, the caller's own exception always propagates untouched.

The names are a public contract and live in :mod:`envlink.names` (re-exported
here for envlink's own modules).
"""

from __future__ import annotations

import contextlib
import os
import threading
import weakref
from collections.abc import Mapping
from types import TracebackType
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.metrics import Counter, Histogram, Meter, MeterProvider, UpDownCounter
from opentelemetry.trace import (
    INVALID_SPAN,
    Span,
    SpanKind,
    Status,
    StatusCode,
    Tracer,
    TracerProvider,
)

from envlink import names
from envlink.names import *  # noqa: F403 - the single list of names, re-exported
from envlink.names import (
    ATTR_ERROR_TYPE,
    DURATION_BUCKETS,
    METRIC_ATTEMPTS,
    METRIC_BRIDGE_CALL_DURATION,
    METRIC_BRIDGE_WAIT_DURATION,
    METRIC_CALL_DURATION,
    METRIC_CONNECT_DURATION,
    METRIC_ERRORS,
    METRIC_INFLIGHT,
    METRIC_MESSAGE_SIZE,
    METRIC_RECONNECTS,
    METRIC_RECOVERIES,
    RPC_DURATION_BUCKETS,
    SCOPE_NAME,
    SIZE_BUCKETS,
)

__all__ = [
    *names.__all__,
    "Telemetry",
    "error_type_of",
    "get_telemetry",
    "mark_error",
]

def error_type_of(exc: BaseException) -> str:
    """Low-cardinality ``error.type`` for an exception.

    envlink errors name themselves (``timeout``, ``connection_lost``, ...); anything
    else is reported by its fully qualified class name, as the conventions suggest.
    """
    named = getattr(type(exc), "error_type", None)
    if isinstance(named, str):
        return named
    cls = type(exc)
    if cls.__module__ == "builtins":
        return cls.__qualname__
    return f"{cls.__module__}.{cls.__qualname__}"


class Telemetry:
    """Tracer, meter and instruments for one pair of providers.

    Obtain one with :func:`get_telemetry`; never per call.
    """

    def __init__(
        self,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
    ) -> None:
        from envlink import __version__

        self.tracer: Tracer = trace.get_tracer(
            SCOPE_NAME, __version__, tracer_provider=tracer_provider
        )
        self.meter: Meter = metrics.get_meter(
            SCOPE_NAME, __version__, meter_provider=meter_provider
        )
        # None: decide per call (global providers not installed yet).
        self._tracing_noop: bool | None = (
            isinstance(tracer_provider, trace.NoOpTracerProvider)
            if tracer_provider is not None else None
        )
        m = self.meter
        self.call_duration: Histogram = m.create_histogram(
            METRIC_CALL_DURATION, unit="s",
            description="Duration of envlink protocol calls, from the caller's view.",
            explicit_bucket_boundaries_advisory=list(RPC_DURATION_BUCKETS),
        )
        self.connect_duration: Histogram = m.create_histogram(
            METRIC_CONNECT_DURATION, unit="s",
            description="Duration of connection attempts (WebSocket opening handshakes).",
            explicit_bucket_boundaries_advisory=list(DURATION_BUCKETS),
        )
        self.bridge_wait_duration: Histogram = m.create_histogram(
            METRIC_BRIDGE_WAIT_DURATION, unit="s",
            description="Time a sync call waited for the bridge's event loop to start it.",
            explicit_bucket_boundaries_advisory=list(DURATION_BUCKETS),
        )
        self.bridge_call_duration: Histogram = m.create_histogram(
            METRIC_BRIDGE_CALL_DURATION, unit="s",
            description="Whole duration of a call made through the sync bridge.",
            explicit_bucket_boundaries_advisory=list(DURATION_BUCKETS),
        )
        self.attempts: Counter = m.create_counter(
            METRIC_ATTEMPTS, unit="{attempt}",
            description="Attempts made for protocol calls; attempt > 1 is a retry.",
        )
        self.reconnects: Counter = m.create_counter(
            METRIC_RECONNECTS, unit="{reconnect}",
            description="Reconnections after a lost or failed connection, by reason.",
        )
        self.errors: Counter = m.create_counter(
            METRIC_ERRORS, unit="{error}",
            description="Protocol calls that failed, by error.type.",
        )
        self.inflight: UpDownCounter = m.create_up_down_counter(
            METRIC_INFLIGHT, unit="{call}",
            description="Protocol calls currently in flight (queued or running).",
        )
        self.message_size: Histogram = m.create_histogram(
            METRIC_MESSAGE_SIZE, unit="By",
            description="Size of WebSocket messages, by direction.",
            explicit_bucket_boundaries_advisory=list(SIZE_BUCKETS),
        )
        self.recoveries: Counter = m.create_counter(
            METRIC_RECOVERIES, unit="{recovery}",
            description="Session recoveries after a lost connection, by policy and result.",
        )

    # ------------------------------------------------------------------ helpers

    def span(
        self,
        name: str,
        *,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: Mapping[str, Any] | None = None,
    ) -> contextlib.AbstractContextManager[Span]:
        """A span that records an escaping exception as ``error.type`` + ERROR status.

        The exception itself is re-raised untouched. With no SDK configured (the
        API's no-op provider) no span is started at all: the current context, and
        with it any propagated trace context, is left as it is.
        """
        return _SpanScope(self, name, kind, attributes)

    def tracing_enabled(self) -> bool:
        """Whether spans would be recorded: ``False`` under the API's no-op providers.

        Cheap enough to call per operation; once a global SDK provider is installed
        (which OpenTelemetry allows only once) the answer is cached.
        """
        noop = self._tracing_noop
        if noop is not None:
            return not noop
        if _global_tracer_provider_unset():
            return False  # no global provider yet; one may be installed later
        provider = trace.get_tracer_provider()
        if isinstance(provider, trace.ProxyTracerProvider):
            return False
        self._tracing_noop = isinstance(provider, trace.NoOpTracerProvider)
        return not self._tracing_noop

    def add(self, counter: Counter | UpDownCounter, value: int,
            attributes: Mapping[str, Any] | None = None) -> None:
        """Add to a counter; never raises."""
        # try/except, not contextlib.suppress: this runs per call and must be cheap.
        try:  # noqa: SIM105
            counter.add(value, attributes)
        except Exception:  # telemetry never raises into the caller
            pass

    def record(self, histogram: Histogram, value: float,
               attributes: Mapping[str, Any] | None = None) -> None:
        """Record into a histogram; never raises."""
        try:  # noqa: SIM105
            histogram.record(value, attributes)
        except Exception:  # telemetry never raises into the caller
            pass


def _global_tracer_provider_unset() -> bool:
    """True while no global tracer provider is installed (the hot no-SDK case).

    ``trace.get_tracer_provider()`` reads ``os.environ`` on every call while none is
    set, which costs more than the rest of a no-op span; the API module's global is
    read directly when it exists, the public function is the fallback.
    """
    if _HAVE_PRIVATE_GLOBAL and "OTEL_PYTHON_TRACER_PROVIDER" not in _ENV_AT_IMPORT:
        return trace._TRACER_PROVIDER is None
    return isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


_HAVE_PRIVATE_GLOBAL = hasattr(trace, "_TRACER_PROVIDER")
_ENV_AT_IMPORT = frozenset(os.environ)


class _SpanScope(contextlib.AbstractContextManager[Span]):
    """What :meth:`Telemetry.span` returns; a class rather than a generator for speed."""

    __slots__ = ("_attributes", "_cm", "_kind", "_name", "_span", "_tel")

    def __init__(self, tel: Telemetry, name: str, kind: SpanKind,
                 attributes: Mapping[str, Any] | None) -> None:
        self._tel = tel
        self._name = name
        self._kind = kind
        self._attributes = attributes
        self._cm: contextlib.AbstractContextManager[Span] | None = None
        self._span: Span = INVALID_SPAN

    def __enter__(self) -> Span:
        if not self._tel.tracing_enabled():
            return INVALID_SPAN
        try:
            cm = self._tel.tracer.start_as_current_span(
                self._name, kind=self._kind, attributes=self._attributes,
                record_exception=False, set_status_on_exception=False,
            )
            self._span = cm.__enter__()
        except Exception:  # a failing span processor must never fail the call
            return INVALID_SPAN
        self._cm = cm
        return self._span

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        cm = self._cm
        if cm is None:
            return
        self._cm = None
        if exc is not None:
            mark_error(self._span, exc)
        # A span processor's on_end may fail: the caller's own outcome (result, or its
        # exception, which still propagates) must not be replaced by that. The span's
        # context is detached before end() runs, so nothing is left attached.
        with contextlib.suppress(Exception):
            cm.__exit__(exc_type, exc, tb)


def mark_error(span: Span, exc: BaseException) -> None:
    """Mark ``span`` failed by ``exc``: ``error.type``, ERROR status, exception event."""
    if not span.is_recording():
        return
    with contextlib.suppress(Exception):
        span.set_attribute(ATTR_ERROR_TYPE, error_type_of(exc))
        span.record_exception(exc)
        span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"[:256]))


_cache: dict[tuple[int, int], Telemetry] = {}
_cache_lock = threading.Lock()


def get_telemetry(
    tracer_provider: TracerProvider | None = None,
    meter_provider: MeterProvider | None = None,
) -> Telemetry:
    """The :class:`Telemetry` for these providers (``None``: the global ones), cached."""
    key = (id(tracer_provider), id(meter_provider))
    tel = _cache.get(key)
    if tel is None:
        with _cache_lock:
            tel = _cache.get(key)
            if tel is None:
                tel = Telemetry(tracer_provider, meter_provider)
                _cache[key] = tel
                # Keyed by id, so the entry must go when a provider does (its id may
                # then be reused). Nothing here keeps a provider alive: an application
                # that drops its providers gets their memory back.
                for provider in (tracer_provider, meter_provider):
                    if provider is not None:
                        weakref.finalize(provider, _evict, key)
    return tel


def _evict(key: tuple[int, int]) -> None:
    # No lock: this runs from the garbage collector, possibly on a thread that holds
    # _cache_lock already (inside get_telemetry); dict.pop is atomic on its own.
    _cache.pop(key, None)
