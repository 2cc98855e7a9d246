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
import contextvars
import threading
import time
import weakref
from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import Any, Protocol

from opentelemetry import context as otel_context
from opentelemetry import metrics, trace
from opentelemetry.metrics import (
    CallbackOptions,
    Counter,
    Histogram,
    Meter,
    MeterProvider,
    ObservableGauge,
    ObservableUpDownCounter,
    Observation,
    UpDownCounter,
)
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
from envlink._speedups import meter_provider_checks, tracer_provider_unset_check
from envlink._version import __version__
from envlink.names import *  # noqa: F403 - the single list of names, re-exported
from envlink.names import (
    ATTR_BREAKER_STATE,
    ATTR_ERROR_TYPE,
    ATTR_RPC_METHOD,
    ATTR_SERVER_ADDRESS,
    ATTR_SERVER_PORT,
    DURATION_BUCKETS,
    METRIC_ATTEMPTS,
    METRIC_BRIDGE_CALL_DURATION,
    METRIC_BRIDGE_WAIT_DURATION,
    METRIC_CALL_DURATION,
    METRIC_CONNECT_DURATION,
    METRIC_ERRORS,
    METRIC_FLEET_HOLDERS,
    METRIC_FLEET_LIMIT,
    METRIC_FLEET_WAIT_DURATION,
    METRIC_INFLIGHT,
    METRIC_MESSAGE_SIZE,
    METRIC_POOL_BATCH_DURATION,
    METRIC_POOL_BREAKER_STATE,
    METRIC_POOL_BREAKER_TRANSITIONS,
    METRIC_POOL_PLACEMENTS,
    METRIC_POOL_SESSIONS,
    METRIC_POOL_STRAGGLERS,
    METRIC_RECONNECTS,
    METRIC_RECOVERIES,
    RPC_DURATION_BUCKETS,
    SCOPE_NAME,
    SIZE_BUCKETS,
    SLOT_BUCKETS,
)

__all__ = [
    *names.__all__,
    "Telemetry",
    "end_current_span",
    "error_type_of",
    "get_telemetry",
    "mark_error",
    "start_current_span",
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


class BridgeHop:
    """A sync call on its way to the bridge's loop, for the client's span to take over.

    The bridge's telemetry hook puts one in the copied context of each bridged call
    (:data:`BRIDGE_HOP`); the first client call that runs in that context *claims*
    it: the client's span then starts when the caller called (``start_ns``) and
    carries the queue wait, and the bridge emits no span of its own. One span per
    bridged call instead of two.
    """

    __slots__ = ("claimed", "start_ns", "submitted")

    def __init__(self, start_ns: int) -> None:
        self.start_ns = start_ns  # wall clock, for the span's start; 0 when not tracing
        self.submitted = time.perf_counter()
        self.claimed = False

    def claim(self) -> bool:
        """Take the hop over (once); ``False`` if another call already did."""
        if self.claimed:
            return False
        self.claimed = True
        return True


#: The bridged call the current context belongs to, if any (see :class:`BridgeHop`).
BRIDGE_HOP: contextvars.ContextVar[BridgeHop | None] = contextvars.ContextVar(
    "envlink_bridge_hop", default=None)


class InflightSource(Protocol):
    """Something that counts its calls in flight, by method (a client's telemetry hook)."""

    @property
    def inflight(self) -> Mapping[str, int]: ...


class BreakerSource(Protocol):
    """What ``envlink.pool.breaker.state`` reads: ``(host, port, state)`` per endpoint.

    Called on the thread that collects metrics: it must only read, never move a
    breaker (see :meth:`~envlink._pool.breaker.CircuitBreaker.peek`).
    """

    def breaker_states(self) -> Iterable[tuple[str, int, str]]: ...


#: The states of ``envlink.breaker.state`` on the breaker-state gauge (a state set).
_BREAKER_STATES = ("closed", "open", "half_open")

#: Every synchronous instrument, by the :class:`Telemetry` attribute that holds it:
#: (kind, name, unit, description, histogram buckets). The client's, the bridge's,
#: then the pool's.
_SYNC_INSTRUMENTS: dict[str, tuple[type, str, str, str, tuple[float, ...]]] = {
    "call_duration": (Histogram, METRIC_CALL_DURATION, "s",
                      "Duration of envlink protocol calls, from the caller's view.",
                      RPC_DURATION_BUCKETS),
    "connect_duration": (Histogram, METRIC_CONNECT_DURATION, "s",
                         "Duration of connection attempts (WebSocket opening handshakes).",
                         DURATION_BUCKETS),
    "attempts": (Counter, METRIC_ATTEMPTS, "{attempt}",
                 "Attempts made for protocol calls; attempt > 1 is a retry.", ()),
    "reconnects": (Counter, METRIC_RECONNECTS, "{reconnect}",
                   "Reconnections after a lost or failed connection, by reason.", ()),
    "errors": (Counter, METRIC_ERRORS, "{error}",
               "Protocol calls that failed, by error.type.", ()),
    "message_size": (Histogram, METRIC_MESSAGE_SIZE, "By",
                     "Size of WebSocket messages, by direction.", SIZE_BUCKETS),
    "recoveries": (Counter, METRIC_RECOVERIES, "{recovery}",
                   "Session recoveries after a lost connection, by policy and result.", ()),
    "bridge_wait_duration": (
        Histogram, METRIC_BRIDGE_WAIT_DURATION, "s",
        "Time a sync call waited for the bridge's event loop to start it.", DURATION_BUCKETS),
    "bridge_call_duration": (Histogram, METRIC_BRIDGE_CALL_DURATION, "s",
                             "Whole duration of a call made through the sync bridge.",
                             DURATION_BUCKETS),
    "pool_batch_duration": (
        Histogram, METRIC_POOL_BATCH_DURATION, "s",
        "Duration of an EnvPool batch call (reset, step, ready-first recv).", DURATION_BUCKETS),
    "pool_stragglers": (Counter, METRIC_POOL_STRAGGLERS, "{session}",
                        "Sessions still in flight when a ready-first receive returned.", ()),
    "pool_sessions": (UpDownCounter, METRIC_POOL_SESSIONS, "{session}",
                      "EnvPool sessions placed on each endpoint, by state.", ()),
    "pool_breaker_transitions": (
        Counter, METRIC_POOL_BREAKER_TRANSITIONS, "{transition}",
        "Circuit-breaker transitions of EnvPool endpoints, by new state.", ()),
    "pool_placements": (Counter, METRIC_POOL_PLACEMENTS, "{placement}",
                        "Attempts to place an EnvPool session on an endpoint, by result.", ()),
    "fleet_wait_duration": (Histogram, METRIC_FLEET_WAIT_DURATION, "s",
                            "Time a caller waited for a fleet slot or pace token.",
                            DURATION_BUCKETS),
    "fleet_holders": (Histogram, METRIC_FLEET_HOLDERS, "{slot}",
                      "Slots the fleet held on the scope when a wait for one ended.",
                      SLOT_BUCKETS),
    "fleet_limit": (Histogram, METRIC_FLEET_LIMIT, "{slot}",
                    "The fleet's limit on the scope when a wait for a slot ended.",
                    SLOT_BUCKETS),
}


class Telemetry:
    """Tracer, meter and instruments for one pair of providers.

    Obtain one with :func:`get_telemetry`; never per call. Its synchronous
    instruments are those of :data:`_SYNC_INSTRUMENTS`, one attribute each.
    """

    call_duration: Histogram
    connect_duration: Histogram
    attempts: Counter
    reconnects: Counter
    errors: Counter
    message_size: Histogram
    recoveries: Counter
    bridge_wait_duration: Histogram
    bridge_call_duration: Histogram
    pool_batch_duration: Histogram
    pool_stragglers: Counter
    pool_sessions: UpDownCounter
    pool_breaker_transitions: Counter
    pool_placements: Counter
    fleet_wait_duration: Histogram
    fleet_holders: Histogram
    fleet_limit: Histogram

    def __init__(
        self,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
    ) -> None:
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
        self._metrics_noop: bool | None = (
            isinstance(meter_provider, metrics.NoOpMeterProvider)
            if meter_provider is not None else None
        )
        m = self.meter
        for attr, (kind, name, unit, description, buckets) in _SYNC_INSTRUMENTS.items():
            if kind is Histogram:
                instrument: Any = m.create_histogram(
                    name, unit=unit, description=description,
                    explicit_bucket_boundaries_advisory=list(buckets))
            elif kind is Counter:
                instrument = m.create_counter(name, unit=unit, description=description)
            else:
                instrument = m.create_up_down_counter(name, unit=unit, description=description)
            setattr(self, attr, instrument)
        # In flight: each client keeps plain counts per method (no metric operation
        # per call); they are read when the SDK collects.
        self._inflight_sources: weakref.WeakSet[InflightSource] = weakref.WeakSet()
        self._inflight_lock = threading.Lock()
        #: Every method ever counted: its series stays (at 0) when its clients are gone.
        self.inflight_methods: set[str] = set()
        self.inflight: ObservableUpDownCounter = m.create_observable_up_down_counter(
            METRIC_INFLIGHT, callbacks=[self._observe_inflight], unit="{call}",
            description="Protocol calls currently in flight (queued or running).",
        )
        # Breaker states: each pool's endpoints are read when the SDK collects.
        self._breaker_sources: weakref.WeakSet[BreakerSource] = weakref.WeakSet()
        self.pool_breaker_state: ObservableGauge = m.create_observable_gauge(
            METRIC_POOL_BREAKER_STATE, callbacks=[self._observe_breakers], unit="{breaker}",
            description="EnvPool endpoints' circuit breakers in each state (1: the current "
                        "state, 0: the others).",
        )

    # ------------------------------------------------------------------ helpers

    def add_inflight_source(self, source: InflightSource) -> None:
        """Count ``source.inflight`` (method -> calls in flight) in ``envlink.client.inflight``."""
        with self._inflight_lock:
            self._inflight_sources.add(source)

    def _observe_inflight(self, options: CallbackOptions) -> list[Observation]:
        totals = dict.fromkeys(list(self.inflight_methods), 0)
        with self._inflight_lock:
            sources = list(self._inflight_sources)
        for source in sources:
            for method, count in list(source.inflight.items()):
                totals[method] = totals.get(method, 0) + count
        return [Observation(count, {ATTR_RPC_METHOD: method})
                for method, count in totals.items()]

    def add_breaker_source(self, source: BreakerSource) -> None:
        """Report ``source``'s breakers in ``envlink.pool.breaker.state`` until removed."""
        with self._inflight_lock:
            self._breaker_sources.add(source)

    def remove_breaker_source(self, source: BreakerSource) -> None:
        """Stop reporting ``source``'s breakers (its series end at the next collection)."""
        with self._inflight_lock:
            self._breaker_sources.discard(source)

    def _observe_breakers(self, options: CallbackOptions) -> list[Observation]:
        with self._inflight_lock:
            sources = list(self._breaker_sources)
        counts: dict[tuple[str, int], dict[str, int]] = {}
        for source in sources:
            for host, port, state in source.breaker_states():
                by_state = counts.setdefault((host, port), dict.fromkeys(_BREAKER_STATES, 0))
                by_state[state] = by_state.get(state, 0) + 1
        return [Observation(n, {ATTR_SERVER_ADDRESS: host, ATTR_SERVER_PORT: port,
                                ATTR_BREAKER_STATE: state})
                for (host, port), by_state in counts.items() for state, n in by_state.items()]

    def metrics_enabled(self) -> bool:
        """Whether measurements would be recorded: ``False`` under the API's no-op providers.

        As :meth:`tracing_enabled`: cheap per operation, cached once a global SDK
        meter provider is installed.
        """
        noop = self._metrics_noop
        if noop is not None:
            return not noop
        if _meter_provider_unset():
            return False  # no global provider yet; one may be installed later
        provider = metrics.get_meter_provider()
        if _is_proxy_meter_provider(provider):
            return False
        self._metrics_noop = isinstance(provider, metrics.NoOpMeterProvider)
        return not self._metrics_noop

    def span(
        self,
        name: str,
        *,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: Mapping[str, Any] | None = None,
        start_time: int | None = None,
    ) -> contextlib.AbstractContextManager[Span]:
        """A span that records an escaping exception as ``error.type`` + ERROR status.

        The exception itself is re-raised untouched. With no SDK configured (the
        API's no-op provider) no span is started at all: the current context, and
        with it any propagated trace context, is left as it is.
        """
        return _SpanScope(self, name, kind, attributes, start_time)

    def tracing_enabled(self) -> bool:
        """Whether spans would be recorded: ``False`` under the API's no-op providers.

        Cheap enough to call per operation; once a global SDK provider is installed
        (which OpenTelemetry allows only once) the answer is cached.
        """
        noop = self._tracing_noop
        if noop is not None:
            return not noop
        if _tracer_provider_unset():
            return False  # no global provider yet; one may be installed later
        provider = trace.get_tracer_provider()
        if isinstance(provider, trace.ProxyTracerProvider):
            return False
        self._tracing_noop = isinstance(provider, trace.NoOpTracerProvider)
        return not self._tracing_noop

    def add(self, counter: Counter | UpDownCounter, value: int,
            attributes: Mapping[str, Any] | None = None) -> None:
        """Add to a counter; never raises."""
        try:  # noqa: SIM105 - runs on every call (docs/performance.md, hot path)
            counter.add(value, attributes)
        except Exception:  # telemetry never raises into the caller
            pass

    def record(self, histogram: Histogram, value: float,
               attributes: Mapping[str, Any] | None = None) -> None:
        """Record into a histogram; never raises."""
        try:  # noqa: SIM105 - runs on every call (docs/performance.md, hot path)
            histogram.record(value, attributes)
        except Exception:  # telemetry never raises into the caller
            pass


#: Whether no global provider is installed yet (the hot no-SDK case), and whether a
#: meter provider is the API's stand-in for one to come.
_tracer_provider_unset = tracer_provider_unset_check()
_meter_provider_unset, _is_proxy_meter_provider = meter_provider_checks()


class _SpanScope(contextlib.AbstractContextManager[Span]):
    """What :meth:`Telemetry.span` returns; a class rather than a generator for speed.

    It starts the span and attaches it to the current context itself (the SDK's
    ``start_as_current_span`` goes through two generator-based context managers).
    """

    __slots__ = ("_attributes", "_kind", "_name", "_span", "_start_time", "_tel", "_token")

    def __init__(self, tel: Telemetry, name: str, kind: SpanKind,
                 attributes: Mapping[str, Any] | None, start_time: int | None = None) -> None:
        self._tel = tel
        self._start_time = start_time
        self._name = name
        self._kind = kind
        self._attributes = attributes
        self._token: object = None
        self._span: Span = INVALID_SPAN

    def __enter__(self) -> Span:
        if not self._tel.tracing_enabled():
            return INVALID_SPAN
        started = start_current_span(self._tel.tracer, self._name, self._kind,
                                     self._attributes, self._start_time)
        if started is None:
            return INVALID_SPAN
        self._span, self._token = started
        return self._span

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        token = self._token
        if token is None:
            return
        self._token = None
        end_current_span(self._span, token, exc)


_attach = otel_context.attach
_detach = otel_context.detach
_get_current = otel_context.get_current
_set_span_in_context = trace.set_span_in_context


def start_current_span(tracer: Tracer, name: str, kind: SpanKind,
                       attributes: Mapping[str, Any] | None,
                       start_time: int | None) -> tuple[Span, object] | None:
    """Start a span, child of the current context, and attach it: ``(span, token)``.

    The current context is read once and handed to the SDK (which otherwise reads
    it three times: parent, sampler, parent's trace state). ``None`` if the SDK
    failed: a failing span processor must never fail the call.
    """
    try:
        ctx = _get_current()
        span = tracer.start_span(name, context=ctx, kind=kind, attributes=attributes,
                                 start_time=start_time)
    except Exception:
        return None
    try:
        return span, _attach(_set_span_in_context(span, ctx))
    except Exception:  # pragma: no cover - the context API does not fail
        try:  # noqa: SIM105 - runs on every call (docs/performance.md, hot path)
            span.end()
        except Exception:
            pass
        return None


def end_current_span(span: Span, token: object, exc: BaseException | None) -> None:
    """End what :func:`start_current_span` started (``exc``: the call failed by it).

    The span's context is detached before ``end()`` runs, so nothing is left
    attached; a span processor's ``on_end`` may fail: the caller's own outcome
    (result, or its exception, which still propagates) must not be replaced.
    """
    if exc is not None:
        mark_error(span, exc)
    try:  # noqa: SIM105 - runs on every call (docs/performance.md, hot path)
        _detach(token)  # type: ignore[arg-type]
    except Exception:
        pass
    try:  # noqa: SIM105 - runs on every call (docs/performance.md, hot path)
        span.end()
    except Exception:
        pass


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
