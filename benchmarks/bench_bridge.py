"""Per-call overhead of envlink's sync bridge, relative to run_coroutine_threadsafe.

Run: ``python benchmarks/bench_bridge.py [--rounds N] [--calls N] [--json PATH]``
(under a minute; ``benchmarks/run.py`` runs it as its first section).
``--open-close N`` measures a sync client's open and close instead (see ``_open_close``).

Every variant runs a no-op coroutine on an asyncio event loop in a daemon thread
and blocks the calling (main) thread until it returns:

* ``baseline``: ``asyncio.run_coroutine_threadsafe(noop(), loop).result()``,
  on a plain loop thread started the same way as the bridge's;
* ``anyio portal`` (when anyio is installed): ``portal.call(noop)`` on a
  blocking portal from ``anyio.from_thread.start_blocking_portal()``;
* ``bridge, telemetry off``: ``Bridge().call(noop, timeout=...)`` with no
  OpenTelemetry SDK configured (the API's no-op tracer and meter);
* ``bridge, telemetry on (batch)``: the same with an SDK ``TracerProvider``
  (``BatchSpanProcessor`` with an exporter that drops spans, as in production)
  and an SDK ``MeterProvider`` (``InMemoryMetricReader``, exemplars off as
  ``envlink.telemetry.configure()`` sets them): one span and two histogram
  records per call (a bare bridge has no client span to merge its span into);
* ``bridge, telemetry on (batch, SDK-default exemplars)``: the same with the
  SDK's default ``trace_based`` exemplar filter;
* ``bridge, telemetry on (simple)``: the batch variant with a ``SimpleSpanProcessor``.

Variants are interleaved round by round, in a rotating order (so that machine
noise hits them all alike); the figure reported per variant is the median over
rounds of its time per call, and the ratio is the median over rounds of
(variant / baseline in the same round), with its range. Targets: ratio
<= 1.0 with telemetry off, <= 1.3 with it on.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence

from opentelemetry.sdk.metrics import AlwaysOffExemplarFilter, MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)

from envlink._bridge import Bridge


class _DropExporter(SpanExporter):
    """Exports nothing: measures the cost of producing spans, not of shipping them."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


async def noop() -> None:
    return None


def _plain_loop_thread() -> tuple[asyncio.AbstractEventLoop, threading.Thread]:
    loop = asyncio.new_event_loop()
    ready = threading.Event()

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.call_soon(ready.set)
        loop.run_forever()
        loop.close()

    thread = threading.Thread(target=run, name="bench-baseline-loop", daemon=True)
    thread.start()
    ready.wait()
    return loop, thread


def _time_per_call(fn: Callable[[], object], calls: int) -> tuple[float, float]:
    """Wall-clock and process CPU time (every thread: caller, loop, exporters) per call."""
    gc.collect()
    cpu = time.process_time()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls, (time.process_time() - cpu) / calls


def _open_close(cycles: int, rounds: int) -> int:
    """``--open-close``: one ``with client.sync()`` opened and closed, one at a time, on
    the default bridge (its thread starts with the first client and ends with the
    last) and on a bridge of the caller's own (its thread kept), against an in-process
    fake server (``MockTransport``); interleaved rounds."""
    from envlink import GenericEnvClient, MockTransport

    def handler(request: dict[str, object]) -> dict[str, object]:
        return {"type": "observation", "data": {"observation": {}}}

    own = Bridge()

    def cycle(bridge: Bridge | None) -> Callable[[], object]:
        def run() -> None:
            client = GenericEnvClient("ws://127.0.0.1:1", transport=MockTransport(handler))
            with client.sync(bridge) as env:
                env.reset()
        return run

    variants = {"default bridge": cycle(None), "a bridge of your own": cycle(own)}
    for fn in variants.values():
        _time_per_call(fn, 20)  # warm up
    names = list(variants)
    times: dict[str, list[float]] = {name: [] for name in names}
    cpus: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            wall, cpu = _time_per_call(variants[name], cycles)
            times[name].append(wall)
            cpus[name].append(cpu)
    own.close()
    print(f"python {sys.version.split()[0]}: open, reset() and close of one "
          f"`with client.sync()` against MockTransport, {cycles} in a row, one at a time, "
          f"{rounds} interleaved rounds: median ms per cycle [range], wall and CPU")
    for name in names:
        ms = [t * 1e3 for t in times[name]]
        cpu_ms = [t * 1e3 for t in cpus[name]]
        print(f"  {name:<22} {statistics.median(ms):6.3f} ms [{min(ms):.3f}-{max(ms):.3f}]"
              f"   CPU {statistics.median(cpu_ms):6.3f} ms "
              f"[{min(cpu_ms):.3f}-{max(cpu_ms):.3f}]")
    for label, got in (("wall", times), ("CPU", cpus)):
        ratios = [d / o for d, o in zip(got[names[0]], got[names[1]], strict=True)]
        print(f"  default / own, {label}, within a round: {statistics.median(ratios):.1f}x "
              f"[{min(ratios):.1f}-{max(ratios):.1f}]")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    parser.add_argument("--open-close", type=int, default=None, metavar="N",
                        help="instead: N open/close cycles of a sync client per round, on "
                             "the default bridge and on one of your own")
    args = parser.parse_args(argv)
    if args.open_close is not None:
        return _open_close(args.open_close, min(args.rounds, 7))

    loop, thread = _plain_loop_thread()
    bridge_off = Bridge()
    batch_provider = TracerProvider()
    batch_provider.add_span_processor(BatchSpanProcessor(_DropExporter()))
    simple_provider = TracerProvider()
    simple_provider.add_span_processor(SimpleSpanProcessor(_DropExporter()))
    meter_provider = MeterProvider(metric_readers=[InMemoryMetricReader()],
                                   exemplar_filter=AlwaysOffExemplarFilter())
    exemplar_provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    bridge_batch = Bridge(tracer_provider=batch_provider, meter_provider=meter_provider)
    bridge_exemplars = Bridge(tracer_provider=batch_provider, meter_provider=exemplar_provider)
    bridge_simple = Bridge(tracer_provider=simple_provider, meter_provider=meter_provider)

    stack = contextlib.ExitStack()
    variants: dict[str, Callable[[], object]] = {
        "baseline (run_coroutine_threadsafe)":
            lambda: asyncio.run_coroutine_threadsafe(noop(), loop).result(),
    }
    try:
        from anyio.from_thread import start_blocking_portal
    except ImportError:
        print("anyio not installed: its portal is left out", file=sys.stderr)
    else:
        portal = stack.enter_context(start_blocking_portal())
        variants["anyio from_thread portal"] = lambda: portal.call(noop)
    variants.update({
        "bridge, telemetry off": lambda: bridge_off.call(noop, timeout=10.0),
        "bridge, telemetry on (batch)": lambda: bridge_batch.call(noop, timeout=10.0),
        "bridge, telemetry on (batch, SDK-default exemplars)":
            lambda: bridge_exemplars.call(noop, timeout=10.0),
        "bridge, telemetry on (simple)": lambda: bridge_simple.call(noop, timeout=10.0),
    })
    for fn in variants.values():  # warm up: threads started, caches filled
        _time_per_call(fn, 500)

    names = list(variants)
    times: dict[str, list[float]] = {name: [] for name in variants}
    cpus: dict[str, list[float]] = {name: [] for name in variants}
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            wall, cpu = _time_per_call(variants[name], args.calls)
            times[name].append(wall)
            cpus[name].append(cpu)

    base = times[names[0]]
    cpu_base = cpus[names[0]]
    targets = {"bridge, telemetry off": 1.0, "bridge, telemetry on (batch)": 1.3,
               "bridge, telemetry on (simple)": 1.3}
    print(f"python {sys.version.split()[0]}, {args.rounds} rounds x {args.calls} calls, "
          "no-op coroutine, median per call [range over rounds]; CPU: the process's CPU "
          "time per call (all threads), less sensitive to other load than wall time")
    report: dict[str, dict[str, float]] = {}
    for name, samples in times.items():
        ratios = [s / b for s, b in zip(samples, base, strict=True)]
        ratio = statistics.median(ratios)
        cpu_ratios = [c / b for c, b in zip(cpus[name], cpu_base, strict=True)]
        report[name] = {"us_per_call": statistics.median(samples) * 1e6,
                        "us_min": min(samples) * 1e6, "us_max": max(samples) * 1e6,
                        "ratio": ratio, "ratio_min": min(ratios), "ratio_max": max(ratios),
                        "cpu_us_per_call": statistics.median(cpus[name]) * 1e6,
                        "cpu_ratio": statistics.median(cpu_ratios),
                        "cpu_ratio_min": min(cpu_ratios), "cpu_ratio_max": max(cpu_ratios)}
        target = targets.get(name)
        verdict = "" if target is None else (
            f"   (target <= {target:.1f}: {'met' if ratio <= target else 'NOT met'})")
        print(f"  {name:<38} {statistics.median(samples) * 1e6:8.1f} us/call"
              f"   ratio {ratio:5.2f} [{min(ratios):.2f}-{max(ratios):.2f}]{verdict}")
        print(f"  {'':<38} {statistics.median(cpus[name]) * 1e6:8.1f} us CPU/call"
              f"  ratio {statistics.median(cpu_ratios):5.2f} "
              f"[{min(cpu_ratios):.2f}-{max(cpu_ratios):.2f}]")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rounds": args.rounds, "calls": args.calls, "variants": report}, f,
                      indent=1)

    stack.close()
    for bridge in (bridge_off, bridge_batch, bridge_exemplars, bridge_simple):
        bridge.close()
    batch_provider.shutdown()
    simple_provider.shutdown()
    meter_provider.shutdown()
    exemplar_provider.shutdown()
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
