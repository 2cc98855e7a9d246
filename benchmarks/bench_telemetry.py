"""Cost of envlink's telemetry path per call, with and without an SDK configured.

Run: ``python benchmarks/bench_telemetry.py [--iterations N] [--repeats R]``.

Every figure is measured in this run and printed next to a baseline measured in
the same run, so ratios stay meaningful on any machine:

* ``baseline``: the work a protocol call does around its telemetry (building the
  attribute dict, two ``perf_counter()`` reads), with no telemetry at all;
* ``no-op``: the same plus everything envlink emits per call (bridge span and its
  two histograms, client span with its attributes, in-flight up/down, attempt
  counter, two message-size records, call-duration record) against the
  OpenTelemetry API with **no SDK configured** (the proxy/no-op providers);
* ``direct``: as ``no-op`` but with spans started on the tracer directly
  (``tracer.start_as_current_span``) instead of ``Telemetry.span``, which skips
  span creation when no SDK is installed;
* ``sdk``: the same against an SDK with an in-memory span exporter and metric
  reader, for contrast.

If the reference server and client are importable, one real loopback ``step``
through the sync facade is timed too, to put the overhead in proportion.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from opentelemetry.trace import SpanKind

from envlink._logging import get_logger
from envlink._telemetry import (
    ATTR_DIRECTION,
    ATTR_EPISODE_ID,
    ATTR_OUTCOME,
    ATTR_RPC_METHOD,
    ATTR_RPC_SYSTEM,
    ATTR_SERVER_ADDRESS,
    ATTR_SERVER_PORT,
    ATTR_SESSION_ID,
    ATTR_STEP_INDEX,
    RPC_SYSTEM,
    SPAN_BRIDGE_PREFIX,
    Telemetry,
    get_telemetry,
)

_ADDRESS, _PORT = "127.0.0.1", 8000
_LOG = get_logger()


def _baseline() -> float:
    start = time.perf_counter()
    attrs = {
        ATTR_RPC_SYSTEM: RPC_SYSTEM, ATTR_RPC_METHOD: "step", ATTR_SERVER_ADDRESS: _ADDRESS,
        ATTR_SERVER_PORT: _PORT, ATTR_SESSION_ID: "s-1", ATTR_EPISODE_ID: "e-1",
        ATTR_STEP_INDEX: 3,
    }
    return time.perf_counter() - start + len(attrs)


def _make_direct(tel: Telemetry) -> Callable[[], float]:
    """As _make_instrumented, but spans started on the tracer directly (no fast path)."""
    method_attrs = {ATTR_RPC_METHOD: "step"}
    sent = {ATTR_DIRECTION: "sent"}
    received = {ATTR_DIRECTION: "received"}
    ok = {ATTR_RPC_METHOD: "step", ATTR_OUTCOME: "ok"}
    tracer = tel.tracer

    def call() -> float:
        start = time.perf_counter()
        with tracer.start_as_current_span(SPAN_BRIDGE_PREFIX + "step"):
            tel.record(tel.bridge_wait_duration, 0.0001, method_attrs)
            attrs = {
                ATTR_RPC_SYSTEM: RPC_SYSTEM, ATTR_RPC_METHOD: "step",
                ATTR_SERVER_ADDRESS: _ADDRESS, ATTR_SERVER_PORT: _PORT,
                ATTR_SESSION_ID: "s-1", ATTR_EPISODE_ID: "e-1", ATTR_STEP_INDEX: 3,
            }
            with tracer.start_as_current_span("step", kind=SpanKind.CLIENT, attributes=attrs,
                                              record_exception=False,
                                              set_status_on_exception=False):
                tel.add(tel.inflight, 1, method_attrs)
                tel.add(tel.attempts, 1, method_attrs)
                tel.record(tel.message_size, 120, sent)
                tel.record(tel.message_size, 240, received)
                tel.add(tel.inflight, -1, method_attrs)
                tel.record(tel.call_duration, time.perf_counter() - start, ok)
            tel.record(tel.bridge_call_duration, time.perf_counter() - start, ok)
        return time.perf_counter() - start

    return call


def _make_instrumented(tel: Telemetry) -> Callable[[], float]:
    method_attrs = {ATTR_RPC_METHOD: "step"}
    sent = {ATTR_DIRECTION: "sent"}
    received = {ATTR_DIRECTION: "received"}
    ok = {ATTR_RPC_METHOD: "step", ATTR_OUTCOME: "ok"}

    def call() -> float:
        start = time.perf_counter()
        with tel.span(SPAN_BRIDGE_PREFIX + "step"):
            tel.record(tel.bridge_wait_duration, 0.0001, method_attrs)
            attrs = {
                ATTR_RPC_SYSTEM: RPC_SYSTEM, ATTR_RPC_METHOD: "step",
                ATTR_SERVER_ADDRESS: _ADDRESS, ATTR_SERVER_PORT: _PORT,
                ATTR_SESSION_ID: "s-1", ATTR_EPISODE_ID: "e-1", ATTR_STEP_INDEX: 3,
            }
            with tel.span("step", kind=SpanKind.CLIENT, attributes=attrs):
                tel.add(tel.inflight, 1, method_attrs)
                tel.add(tel.attempts, 1, method_attrs)
                tel.record(tel.message_size, 120, sent)
                tel.record(tel.message_size, 240, received)
                tel.add(tel.inflight, -1, method_attrs)
                tel.record(tel.call_duration, time.perf_counter() - start, ok)
            tel.record(tel.bridge_call_duration, time.perf_counter() - start, ok)
        return time.perf_counter() - start

    return call


_SDK_TRACER: Any = None


def _log_in_span() -> None:
    with _SDK_TRACER.start_as_current_span("bench"):
        _LOG.info("envlink.bench")


def _time_per_call(fn: Callable[[], Any], iterations: int, repeats: int) -> float:
    """Best-of-``repeats`` mean seconds per call over ``iterations`` calls."""
    for _ in range(min(iterations, 1000)):  # warm up
        fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        for _ in range(iterations):
            fn()
        best = min(best, (time.perf_counter_ns() - t0) / iterations / 1e9)
    return best


def _real_step_latency(iterations: int) -> float | None:
    try:
        from envlink import CallToolAction, EchoEnv
        from envlink.server import ServerThread
    except ImportError:
        return None
    samples: list[float] = []
    with ServerThread(env="echo") as st, EchoEnv(base_url=st.url).sync() as env:
        env.reset()
        action = CallToolAction(tool_name="echo_message", arguments={"message": "hi"})
        for _ in range(50):
            env.step(action)
        for _ in range(iterations):
            t0 = time.perf_counter()
            env.step(action)
            samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--real-steps", type=int, default=300,
                        help="loopback steps to time (0: skip)")
    args = parser.parse_args(argv)

    import structlog

    # An application that logs warnings and above: envlink's info lines are dropped.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))

    noop = _make_instrumented(get_telemetry())  # no SDK configured: API proxies
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    tp = TracerProvider()
    exporter = InMemorySpanExporter()
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    mp = MeterProvider(metric_readers=[InMemoryMetricReader()])
    global _SDK_TRACER
    _SDK_TRACER = TracerProvider().get_tracer("bench")
    sdk_call = _make_instrumented(get_telemetry(tp, mp))

    def sdk() -> float:
        result = sdk_call()
        exporter.clear()
        return result

    base = _time_per_call(_baseline, args.iterations, args.repeats)
    t_noop = _time_per_call(noop, args.iterations, args.repeats)
    t_direct = _time_per_call(_make_direct(get_telemetry()), args.iterations, args.repeats)
    t_sdk = _time_per_call(sdk, max(args.iterations // 10, 100), args.repeats)

    print(f"python {sys.version.split()[0]}, {args.iterations} iterations, "
          f"best of {args.repeats}")
    print(f"{'path':<34}{'per call':>12}{'vs baseline':>14}")
    print(f"{'baseline (no telemetry)':<34}{base * 1e6:>10.2f}us{1.0:>13.1f}x")
    print(f"{'telemetry, no SDK (no-op API)':<34}{t_noop * 1e6:>10.2f}us"
          f"{t_noop / base:>13.1f}x")
    print(f"{'same, spans via tracer directly':<34}{t_direct * 1e6:>10.2f}us"
          f"{t_direct / base:>13.1f}x")
    print(f"{'telemetry, SDK + in-memory export':<34}{t_sdk * 1e6:>10.2f}us"
          f"{t_sdk / base:>13.1f}x")
    overhead = t_noop - base
    t_log = _time_per_call(lambda: _LOG.info("envlink.bench"), args.iterations // 4,
                           args.repeats)
    t_log_span = _time_per_call(_log_in_span, args.iterations // 4, args.repeats)
    print(f"{'one log line, filtered out':<34}{t_log * 1e6:>10.2f}us")
    print(f"{'one log line + span ids (SDK span)':<34}{t_log_span * 1e6:>10.2f}us")
    print(f"no-SDK telemetry overhead per call: {overhead * 1e6:.2f}us")
    if args.real_steps > 0:
        real = _real_step_latency(args.real_steps)
        if real is None:
            print("real loopback step: client or reference server not importable, skipped")
        else:
            print(f"real loopback step (sync facade, median of {args.real_steps}): "
                  f"{real * 1e6:.0f}us; no-SDK telemetry = {overhead / real:.2%} of it")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
