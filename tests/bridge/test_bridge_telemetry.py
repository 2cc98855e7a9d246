"""Telemetry of bridged calls: the sync-hop span and the two bridge histograms (wait sampled)."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from opentelemetry.trace import SpanKind, StatusCode

from envlink import Bridge, CallTimeoutError, ClientClosedError
from envlink._telemetry.bridge_hook import WAIT_SAMPLE
from envlink.names import (
    ATTR_BRIDGE_QUEUE_WAIT,
    ATTR_BRIDGE_RUN_TIME,
    ATTR_ERROR_TYPE,
    ATTR_OUTCOME,
    ATTR_RPC_METHOD,
    DURATION_BUCKETS,
    METRIC_BRIDGE_CALL_DURATION,
    METRIC_BRIDGE_WAIT_DURATION,
)
from envlink.telemetry import BridgeTelemetryHook

from .._otel_support import Otel

pytestmark = pytest.mark.timeout(20)

HISTOGRAMS = (METRIC_BRIDGE_WAIT_DURATION, METRIC_BRIDGE_CALL_DURATION)


async def noop() -> None:
    await asyncio.sleep(0)


async def fail() -> None:
    raise KeyError("nope")


async def hang() -> None:
    await asyncio.Event().wait()


def by_attrs(points: list[Any]) -> dict[frozenset[tuple[str, Any]], Any]:
    return {frozenset(p.attributes.items()): p for p in points}


def test_ok_call_span_attributes(otel: Otel) -> None:
    """A successful call makes one INTERNAL span 'envlink.bridge <method>' with rpc.method,
    queue wait and run time, unset status, parented to the caller's span."""
    tracer = otel.tracer_provider.get_tracer("test")
    with tracer.start_as_current_span("caller") as caller:
        otel.bridge.call(noop, timeout=5)
    (hop,) = [s for s in otel.spans() if s.name.startswith("envlink.bridge")]
    assert hop.name == "envlink.bridge noop"
    assert hop.kind is SpanKind.INTERNAL
    assert hop.status.status_code is StatusCode.UNSET
    assert set(hop.attributes or {}) == {ATTR_RPC_METHOD, ATTR_BRIDGE_QUEUE_WAIT,
                                         ATTR_BRIDGE_RUN_TIME}
    attrs = hop.attributes or {}
    assert attrs[ATTR_RPC_METHOD] == "noop"
    assert 0 <= attrs[ATTR_BRIDGE_QUEUE_WAIT] < 5  # type: ignore[operator]
    assert 0 <= attrs[ATTR_BRIDGE_RUN_TIME] < 5  # type: ignore[operator]
    assert hop.parent is not None
    assert hop.parent.span_id == caller.get_span_context().span_id


def test_method_name_override(otel: Otel) -> None:
    """method= names the span and sets rpc.method on the span and the histograms."""
    otel.bridge.call(noop, timeout=5, method="reset")
    (hop,) = otel.spans()
    assert hop.name == "envlink.bridge reset"
    assert (hop.attributes or {})[ATTR_RPC_METHOD] == "reset"
    (point,) = otel.points(METRIC_BRIDGE_CALL_DURATION)
    assert point.attributes[ATTR_RPC_METHOD] == "reset"


def test_error_call_span_and_histograms(otel: Otel) -> None:
    """A failing call: span has error.type and ERROR status; histograms carry
    outcome=error and error.type."""
    with pytest.raises(KeyError):
        otel.bridge.call(fail, timeout=5)
    (hop,) = otel.spans()
    assert hop.status.status_code is StatusCode.ERROR
    assert (hop.attributes or {})[ATTR_ERROR_TYPE] == "KeyError"
    expected = {ATTR_RPC_METHOD: "fail", ATTR_OUTCOME: "error", ATTR_ERROR_TYPE: "KeyError"}
    for name in HISTOGRAMS:
        (point,) = otel.points(name)
        assert dict(point.attributes) == expected
        assert point.count == 1


def test_timeout_outcome(otel: Otel) -> None:
    """A timed-out call is recorded with outcome=timeout and error.type=timeout."""
    with pytest.raises(CallTimeoutError):
        otel.bridge.call(hang, timeout=0.05)
    (hop,) = otel.spans()
    assert hop.status.status_code is StatusCode.ERROR
    assert (hop.attributes or {})[ATTR_ERROR_TYPE] == "timeout"
    for name in HISTOGRAMS:
        (point,) = otel.points(name)
        assert dict(point.attributes) == {ATTR_RPC_METHOD: "hang", ATTR_OUTCOME: "timeout",
                                          ATTR_ERROR_TYPE: "timeout"}


def test_cancelled_outcome_when_closed_during_call(otel: Otel) -> None:
    """A call cut short by close() is recorded with outcome=cancelled."""
    started = threading.Event()

    async def wait_forever() -> None:
        started.set()
        await asyncio.Event().wait()

    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(otel.bridge.call, wait_forever, timeout=None)
        assert started.wait(5)
        otel.bridge.close()
        with pytest.raises(ClientClosedError):
            future.result(5)
    (point,) = otel.points(METRIC_BRIDGE_CALL_DURATION)
    assert dict(point.attributes) == {ATTR_RPC_METHOD: "wait_forever",
                                      ATTR_OUTCOME: "cancelled",
                                      ATTR_ERROR_TYPE: "client_closed"}


def test_histograms_count_every_call(otel: Otel) -> None:
    """With wait_sample=1 both histograms get one point per call, by (rpc.method, outcome), in
    seconds with the envlink bucket boundaries; a call lasts at least as long as its wait."""
    hook = BridgeTelemetryHook(otel.tracer_provider, otel.meter_provider, wait_sample=1)
    with Bridge(hooks=[hook]) as bridge:
        for _ in range(5):
            bridge.call(noop, timeout=5)
        bridge.call(noop, timeout=5, method="other")
    key = frozenset({ATTR_RPC_METHOD: "noop", ATTR_OUTCOME: "ok"}.items())
    wait = by_attrs(otel.points(METRIC_BRIDGE_WAIT_DURATION))
    call = by_attrs(otel.points(METRIC_BRIDGE_CALL_DURATION))
    assert set(wait) == set(call) == {
        key, frozenset({ATTR_RPC_METHOD: "other", ATTR_OUTCOME: "ok"}.items())}
    assert wait[key].count == call[key].count == 5
    assert 0 <= wait[key].sum <= call[key].sum < 5
    assert tuple(call[key].explicit_bounds) == DURATION_BUCKETS


def test_wait_histogram_sampled_by_default(otel: Otel) -> None:
    """By default the wait is recorded for one successful call in 16 per method (the first
    included) and for every failed call, while the call duration counts every call."""
    for _ in range(WAIT_SAMPLE * 2 + 1):
        otel.bridge.call(noop, timeout=5)
    otel.bridge.call(noop, timeout=5, method="other")
    for _ in range(3):
        with pytest.raises(KeyError):
            otel.bridge.call(fail, timeout=5)
    ok = frozenset({ATTR_RPC_METHOD: "noop", ATTR_OUTCOME: "ok"}.items())
    other = frozenset({ATTR_RPC_METHOD: "other", ATTR_OUTCOME: "ok"}.items())
    failed = frozenset({ATTR_RPC_METHOD: "fail", ATTR_OUTCOME: "error",
                        ATTR_ERROR_TYPE: "KeyError"}.items())
    wait = by_attrs(otel.points(METRIC_BRIDGE_WAIT_DURATION))
    call = by_attrs(otel.points(METRIC_BRIDGE_CALL_DURATION))
    assert call[ok].count == WAIT_SAMPLE * 2 + 1
    assert wait[ok].count == 3  # calls 1, 17 and 33
    assert wait[other].count == call[other].count == 1  # a method's first call is recorded
    assert wait[failed].count == call[failed].count == 3


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "16", None])
def test_wait_sample_must_be_a_positive_int(bad: Any) -> None:
    """wait_sample= rejects anything but an int >= 1 with a ValueError."""
    with pytest.raises(ValueError, match="wait_sample"):
        BridgeTelemetryHook(wait_sample=bad)


def test_metric_units_are_seconds(otel: Otel) -> None:
    """Both bridge histograms are declared in seconds."""
    otel.bridge.call(noop, timeout=5)
    data = otel.reader.get_metrics_data()
    assert data is not None
    units = {m.name: m.unit for rm in data.resource_metrics for sm in rm.scope_metrics
             for m in sm.metrics}
    assert units[METRIC_BRIDGE_WAIT_DURATION] == units[METRIC_BRIDGE_CALL_DURATION] == "s"


def test_outcome_of_errors_raised_by_the_coroutine(otel: Otel) -> None:
    """The coroutine's own CallTimeoutError counts as a timeout, its ClientClosedError (a
    closed client, not the bridge closing) as an error."""

    async def client_deadline() -> None:
        raise CallTimeoutError("step did not complete", method="step", timeout=1.0)

    async def client_closed() -> None:
        raise ClientClosedError("the client is closed")

    with pytest.raises(CallTimeoutError):
        otel.bridge.call(client_deadline, timeout=5)
    with pytest.raises(ClientClosedError):
        otel.bridge.call(client_closed, timeout=5)
    outcomes = {p.attributes[ATTR_RPC_METHOD]: p.attributes[ATTR_OUTCOME]
                for p in otel.points(METRIC_BRIDGE_CALL_DURATION)}
    assert outcomes == {"client_deadline": "timeout", "client_closed": "error"}


def test_wait_sampling_state_is_bounded(otel: Otel, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the bound of counted methods a new method's calls are all recorded (nothing more
    is remembered), while the counted methods keep their sampling."""
    import envlink._telemetry.bridge_hook as tb

    monkeypatch.setattr(tb, "_MAX_SAMPLED_METHODS", 1)
    hook = BridgeTelemetryHook(otel.tracer_provider, otel.meter_provider)
    with Bridge(hooks=[hook]) as bridge:
        for _ in range(3):
            bridge.call(noop, timeout=5)
            bridge.call(noop, timeout=5, method="late")
    wait = {p.attributes[ATTR_RPC_METHOD]: p.count
            for p in otel.points(METRIC_BRIDGE_WAIT_DURATION)}
    assert wait == {"noop": 1, "late": 3}
    assert set(hook._seen) == {"noop"}
