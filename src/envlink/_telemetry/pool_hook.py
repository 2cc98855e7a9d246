"""envlink's OpenTelemetry and structlog emitter for the pools: a :class:`PoolHook`.

The pools report batches, session moves, placements, breaker changes and shard
replacements to their hook; this one turns the reports into the spans, metrics and
log events of ``docs/telemetry.md``. It is the only place that creates a pool's
spans, records its metrics or logs its events; it never raises into the caller.
"""

from __future__ import annotations

import contextlib
import time
import weakref
from typing import Any

from opentelemetry.metrics import Counter, MeterProvider
from opentelemetry.trace import TracerProvider

from envlink._events.pool_events import (
    BatchFinished,
    BatchStarted,
    BreakerChange,
    BreakerStates,
    PoolEvent,
    PoolHook,
)
from envlink._telemetry import logs as _logging
from envlink._telemetry.instruments import Telemetry, get_telemetry
from envlink.names import (
    ATTR_BREAKER_STATE,
    ATTR_OUTCOME,
    ATTR_PLACEMENT_RESULT,
    ATTR_POOL_ERROR_TYPE,
    ATTR_POOL_ERRORS,
    ATTR_POOL_MIN_READY,
    ATTR_POOL_SIZE,
    ATTR_POOL_SLOTS,
    ATTR_POOL_STRAGGLERS,
    ATTR_RAY_SHARD,
    ATTR_RAY_SHARDS,
    ATTR_REASON,
    ATTR_RPC_METHOD,
    ATTR_SERVER_ADDRESS,
    ATTR_SERVER_PORT,
    ATTR_SESSION_STATE,
    LOG_POOL_BREAKER_CHANGED,
    LOG_RAY_SHARD_LOST,
    LOG_SESSION_LOST,
    RAY_METRIC_SHARD_RESTARTS,
    SPAN_POOL_PREFIX,
    SPAN_POOL_RECV,
    SPAN_RAY_SHARD_PREFIX,
)

__all__ = ["PoolTelemetryHook"]

_log = _logging.get_logger()

#: ``envlink.ray.shard.restarts``, one counter per meter (created once: the SDK would
#: warn about a duplicate instrument for each new pool).
_restart_counters: weakref.WeakKeyDictionary[Telemetry, Counter] = weakref.WeakKeyDictionary()


def _restart_counter(tel: Telemetry) -> Counter:
    counter = _restart_counters.get(tel)
    if counter is None:
        counter = _restart_counters[tel] = tel.meter.create_counter(
            RAY_METRIC_SHARD_RESTARTS, unit="{restart}",
            description="Shard actors of a RayEnvPool replaced after they died or stopped "
                        "answering.")
    return counter


class PoolTelemetryHook(PoolHook):
    """Spans, metrics and log events of a pool, on the given providers (default: global).

    Args:
        tracer_provider: OpenTelemetry tracer provider (``None``: the global one).
        meter_provider: OpenTelemetry meter provider (``None``: the global one).
    """

    def __init__(self, tracer_provider: TracerProvider | None = None,
                 meter_provider: MeterProvider | None = None) -> None:
        self.tel = get_telemetry(tracer_provider, meter_provider)
        self._restarts: Counter | None = None

    def batch_started(self, batch: BatchStarted) -> tuple[float, Any]:
        tel = self.tel
        attrs: dict[str, Any] | None = None
        if batch.shard is not None:
            name = SPAN_RAY_SHARD_PREFIX + batch.method
            if tel.tracing_enabled():
                attrs = {ATTR_RAY_SHARD: batch.shard, ATTR_POOL_SIZE: batch.size,
                         ATTR_POOL_SLOTS: batch.slots}
        else:
            if batch.method == "recv":
                name = SPAN_POOL_RECV
            elif batch.method == "step_send":
                name = SPAN_POOL_PREFIX + "step"  # the steps' span: they start in it
            else:
                name = SPAN_POOL_PREFIX + batch.method
            if tel.tracing_enabled():
                attrs = {ATTR_POOL_SIZE: batch.size, ATTR_POOL_SLOTS: batch.slots}
                if batch.min_ready is not None:
                    attrs[ATTR_POOL_MIN_READY] = batch.min_ready
                if batch.shards is not None:
                    attrs[ATTR_RAY_SHARDS] = batch.shards
        scope = tel.span(name, attributes=attrs)
        span = scope.__enter__()
        return time.perf_counter(), (scope, span)

    def batch_finished(self, batch: BatchFinished, token: tuple[float, Any]) -> None:
        start, (scope, span) = token
        started, result, error = batch
        try:
            if (error is None and result is not None and started.shard is None
                    and started.method != "step_send"):
                self._record(span, started.method, result, start)
        finally:
            scope.__exit__(type(error) if error is not None else None, error, None)

    def _record(self, span: Any, method: str, batch: Any, start: float) -> None:
        tel = self.tel
        errors = batch.errors
        attrs = {ATTR_RPC_METHOD: method, ATTR_OUTCOME: "error" if errors else "ok"}
        tel.record(tel.pool_batch_duration, time.perf_counter() - start, attrs)
        if batch.stragglers:
            tel.add(tel.pool_stragglers, len(batch.stragglers), {ATTR_RPC_METHOD: "step"})
        if span.is_recording():
            with contextlib.suppress(Exception):
                span.set_attribute(ATTR_POOL_ERRORS, len(errors))
                span.set_attribute(ATTR_POOL_STRAGGLERS, len(batch.stragglers))
                if errors:
                    kinds = sorted({e.error_type for e in errors.values()})
                    span.set_attribute(ATTR_POOL_ERROR_TYPE,
                                       kinds[0] if len(kinds) == 1 else "mixed")

    def sessions_changed(self, host: str, port: int, state: str, delta: int) -> None:
        tel = self.tel
        tel.add(tel.pool_sessions, delta, {ATTR_SERVER_ADDRESS: host, ATTR_SERVER_PORT: port,
                                           ATTR_SESSION_STATE: state})

    def placement(self, host: str, port: int, result: str) -> None:
        tel = self.tel
        tel.add(tel.pool_placements, 1, {ATTR_SERVER_ADDRESS: host, ATTR_SERVER_PORT: port,
                                         ATTR_PLACEMENT_RESULT: result})

    def breaker_changed(self, change: BreakerChange) -> None:
        tel = self.tel
        tel.add(tel.pool_breaker_transitions, 1, {
            ATTR_SERVER_ADDRESS: change.host, ATTR_SERVER_PORT: change.port,
            ATTR_BREAKER_STATE: change.new})
        with contextlib.suppress(Exception):
            _log.warning(LOG_POOL_BREAKER_CHANGED, url=change.url, old=change.old,
                         new=change.new, failures=change.failures)

    def watch_breakers(self, source: BreakerStates) -> None:
        self.tel.add_breaker_source(source)  # envlink.pool.breaker.state

    def unwatch_breakers(self, source: BreakerStates) -> None:
        self.tel.remove_breaker_source(source)

    def shard_replaced(self, shard: int, kind: str, reason: str, policy: str) -> None:
        with contextlib.suppress(Exception):
            _log.warning(LOG_RAY_SHARD_LOST, shard=shard, reason=reason, policy=policy)
        if self._restarts is None:
            self._restarts = _restart_counter(self.tel)
        self.tel.add(self._restarts, 1, {ATTR_RAY_SHARD: shard, ATTR_REASON: kind})

    def event(self, event: PoolEvent) -> None:
        with contextlib.suppress(Exception):
            # A session the pool could not rebuild is a loss its caller sees.
            log = _log.warning if event.name == LOG_SESSION_LOST else _log.info
            log(event.name, **event.fields)
