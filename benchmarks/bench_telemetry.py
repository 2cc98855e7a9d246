"""Telemetry work per sync call, single-threaded: envlink's emitters, no network, no threads.

Run: ``python benchmarks/bench_telemetry.py [--iterations N] [--repeats R]``.

Drives envlink's two telemetry hooks exactly as one ``step`` through the sync
facade does (the bridge hook in the caller's context, then, in the copied
context, the client hook: call started (and the first attempt's phase if the hook
asks for it, as the driver does), the request frame's trace
context as the driver builds it on an envlink server, two messages, call
finished; then the bridge hook's end of call), with nothing else around them,
so the figure is the telemetry's own CPU per call. Configurations, measured in
one run against a baseline (building the hooks' input records only):

* ``no SDK``: the API's no-op providers (what a library user gets by default);
* ``SDK, merged``: SDK tracer (batch span processor, dropping exporter) and
  meter (in-memory reader, exemplars off as ``envlink.telemetry.configure()``
  sets them); the sync facade's default shape: one span per call;
* ``SDK, merged, SDK-default exemplars``: the same with the SDK's default
  ``trace_based`` exemplar filter;
* ``SDK, nested``: ``nested_spans=True``: the bridge's span and its
  ``envlink.bridge.call.duration`` as well (the earlier shape, for comparison);
* ``SDK, unsampled``: ``configure(trace_sample_ratio=0)``'s sampler, every trace
  dropped (what an unsampled call costs, metrics still recorded); ``SDK, 1 %
  sampled``: ``trace_sample_ratio=0.01``;
* ``SDK floor``: the SDK's own work for the same span and duration record, with
  nothing of envlink (see :func:`_sdk_floor`).

``--instructions`` counts each configuration under callgrind instead (two windows
of ``--iterations`` and three times as many calls, each a process of its own; per
call: the difference over the difference of calls) and prints the SDK path's cost
against the floor: (SDK, merged - no SDK) / SDK floor.

``benchmarks/run.py`` measures the same end to end (real server, real threads).
"""

from __future__ import annotations

import argparse
import contextvars
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry.sdk.metrics import AlwaysOffExemplarFilter, MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

from envlink import BridgeCallFinished, BridgeCallStarted
from envlink._client.propagation import trace_carrier
from envlink._events.client_events import CallFinished, CallStarted, PhaseFinished, PhaseStarted
from envlink.telemetry import BridgeTelemetryHook, ClientTelemetryHook


class _Drop(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def _make_call(bridge_hook: BridgeTelemetryHook | None,
               client_hook: ClientTelemetryHook | None) -> Callable[[], None]:
    """One sync step's worth of hook calls (``None`` hooks: the baseline)."""
    step = {"n": 0}
    first_phases = bool(getattr(client_hook, "first_attempt_phases", True))

    def on_loop() -> None:
        n = step["n"]
        started = CallStarted("step", "127.0.0.1", 8000, "s-1", "e-1")
        finished = CallFinished("step", "ok", 0.0004, None, 0.00001, n, "s-1", "127.0.0.1", 8000)
        if client_hook is None:
            return
        token = client_hook.call_started(started)
        attempt = mark = None
        if first_phases:  # the driver reports a first try's phase only to hooks that want it
            attempt = PhaseStarted("attempt", "step", 1)
            mark = client_hook.phase_started(attempt)
        trace_carrier()  # the request frame's traceparent (per-message extension)
        client_hook.message("sent", 120)
        client_hook.message("received", 240)
        if attempt is not None:
            client_hook.phase_finished(PhaseFinished(attempt, None), mark)
        client_hook.call_finished(finished, token)

    def call() -> None:
        step["n"] += 1
        ctx = contextvars.copy_context()
        begin = BridgeCallStarted("step", ctx)
        end = BridgeCallFinished("step", "ok", 0.00002, 0.0004, 0.00045, None)
        if bridge_hook is None:
            ctx.run(on_loop)
            return
        token = bridge_hook.call_started(begin)
        ctx.run(on_loop)
        bridge_hook.call_finished(end, token)

    return call


def _sdk_floor(tp: TracerProvider, mp: MeterProvider) -> Callable[[], None]:
    """The SDK's own work for what a sync step's contract needs, with nothing of envlink:
    the client span with its seven start and two end attributes, current while it
    runs, and one ``rpc.client.call.duration`` record with its five attributes."""
    from opentelemetry import context, trace
    from opentelemetry.trace import SpanKind

    tracer = tp.get_tracer("bench")
    histogram = mp.get_meter("bench").create_histogram("bench.duration", unit="s")
    start = {"server.address": "127.0.0.1", "server.port": 8000,
             "rpc.system.name": "openenv", "rpc.method": "step", "envlink.session.id": "s-1",
             "envlink.episode.id": "e-1", "envlink.bridge.queue_wait_s": 0.00001}
    record = {"rpc.system.name": "openenv", "server.address": "127.0.0.1",
              "server.port": 8000, "rpc.method": "step", "envlink.outcome": "ok"}

    def call() -> None:
        ctx = context.get_current()
        span = tracer.start_span("step", context=ctx, kind=SpanKind.CLIENT, attributes=start)
        token = context.attach(trace.set_span_in_context(span, ctx))
        span.set_attribute("envlink.queue_wait_s", 0.00001)
        span.set_attribute("envlink.step.index", 3)
        context.detach(token)
        span.end()
        histogram.record(0.0004, record)

    return call


def _count(fn: Callable[[], None], iterations: int) -> None:
    """Run ``iterations`` calls with callgrind counting around them (under valgrind)."""
    import gc
    import os

    from _callgrind import MARKS_VAR, Marks

    marks = Marks(os.environ[MARKS_VAR])
    for _ in range(300):
        fn()
    gc.collect()
    marks.start()
    for _ in range(iterations):
        fn()
    marks.stop()


def _per_call(fn: Callable[[], None], iterations: int) -> tuple[float, float]:
    """Wall-clock and this thread's CPU time per call (the CPU time leaves out the batch
    span processor's export thread and other processes sharing the machine)."""
    cpu = time.thread_time()
    start = time.perf_counter()
    for _ in range(iterations):
        fn()
    return ((time.perf_counter() - start) / iterations,
            (time.thread_time() - cpu) / iterations)


def _instructions(names: list[str], iterations: int, json_path: str | None = None) -> int:
    """Count each configuration's instructions per call under callgrind; print the table
    (and write it to ``json_path``)."""
    import json
    import os
    import subprocess
    import tempfile
    from pathlib import Path

    from _callgrind import MARKS_VAR, build_marks, read_total, valgrind_argv

    here = Path(__file__).resolve().parent
    marks = build_marks(here / "results" / ".callgrind")
    env = {**os.environ, MARKS_VAR: str(marks), "PYTHONHASHSEED": "0"}
    per_call: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            totals = []
            for calls in (iterations, 3 * iterations):
                dump = Path(tmp) / f"callgrind.{len(per_call)}.{calls}"
                subprocess.run([*valgrind_argv(dump), sys.executable, __file__, "--count",
                                name, "--iterations", str(calls)], env=env, check=True)
                totals.append(read_total(dump))
            per_call[name] = (totals[1] - totals[0]) / (2 * iterations)
            print(f"  {name:<40}{per_call[name] / 1000:>10.1f} k instructions per call",
                  flush=True)
    report: dict[str, Any] = {"python": sys.version.split()[0], "iterations": iterations,
                              "per_call": per_call}
    floor = per_call.get("SDK floor (the SDK's work alone)")
    if floor and "SDK, merged (default)" in per_call and "no SDK" in per_call:
        added = per_call["SDK, merged (default)"] - per_call["no SDK"]
        report.update(sdk_path=added, sdk_floor=floor, sdk_path_over_floor=added / floor)
        line = (f"python {sys.version.split()[0]}: what the SDK path adds to a sync call "
                f"(SDK, merged - no SDK) {added / 1000:.1f} k = {added / floor:.3f} x the SDK "
                f"floor ({floor / 1000:.1f} k)")
        if "SDK, unsampled (ratio 0)" in per_call:
            unsampled = per_call["SDK, unsampled (ratio 0)"] - per_call["no SDK"]
            line += f"; unsampled {unsampled / 1000:.1f} k ({unsampled / floor:.3f} x)"
        print(line)
    if json_path is not None:
        Path(json_path).write_text(json.dumps(report, indent=2) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--iterations", type=int, default=5000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--count", default=None,
                        help="under callgrind (ENVLINK_CALLGRIND_MARKS): count --iterations "
                             "calls of one configuration (its name as printed, or 'SDK floor')")
    parser.add_argument("--instructions", action="store_true",
                        help="count every configuration under callgrind (needs valgrind "
                             "and a C compiler); --iterations: the short window's calls")
    parser.add_argument("--only", action="append", default=None, metavar="NAME",
                        help="--instructions: count only the configurations whose names "
                             "start with NAME (repeatable), e.g. --only 'no SDK' --only "
                             "'SDK, merged' --only 'SDK floor'")
    parser.add_argument("--json", default=None, metavar="PATH",
                        help="--instructions: also write the counts to PATH")
    args = parser.parse_args(argv)

    tp = TracerProvider()
    # No timer exports (every 512 spans only): a count then does not depend on how long
    # the run took, which under valgrind varies with the load.
    tp.add_span_processor(BatchSpanProcessor(_Drop(), schedule_delay_millis=3_600_000))
    mp = MeterProvider(metric_readers=[InMemoryMetricReader()],
                       exemplar_filter=AlwaysOffExemplarFilter())
    mp_exemplars = MeterProvider(metric_readers=[InMemoryMetricReader()])
    variants: dict[str, Callable[[], None]] = {
        "baseline (records only)": _make_call(None, None),
        "no SDK": _make_call(BridgeTelemetryHook(nested=False), ClientTelemetryHook()),
        "SDK, merged (default)": _make_call(BridgeTelemetryHook(tp, mp, nested=False),
                                            ClientTelemetryHook(tp, mp)),
        "SDK, merged, SDK-default exemplars": _make_call(
            BridgeTelemetryHook(tp, mp_exemplars, nested=False),
            ClientTelemetryHook(tp, mp_exemplars)),
        "SDK, nested spans": _make_call(BridgeTelemetryHook(tp, mp, nested=True),
                                        ClientTelemetryHook(tp, mp)),
    }
    sampled: dict[str, TracerProvider] = {}
    for name, ratio in (("SDK, unsampled (ratio 0)", 0.0), ("SDK, 1 % sampled", 0.01)):
        sampled[name] = provider = TracerProvider(
            sampler=ParentBased(TraceIdRatioBased(ratio)))
        provider.add_span_processor(BatchSpanProcessor(_Drop(), schedule_delay_millis=3_600_000))
        variants[name] = _make_call(BridgeTelemetryHook(provider, mp, nested=False),
                                    ClientTelemetryHook(provider, mp))
    variants["SDK floor (the SDK's work alone)"] = _sdk_floor(tp, mp)
    if args.instructions:
        names = [n for n in variants
                 if args.only is None or any(n.startswith(o) for o in args.only)]
        if not names:
            raise SystemExit(f"--only: no configuration {args.only!r}")
        return _instructions(names, args.iterations, args.json)
    if args.count is not None:
        name = next((n for n in variants if n.startswith(args.count)), None)
        if name is None:
            raise SystemExit(f"--count: no configuration {args.count!r}")
        _count(variants[name], args.iterations)
        return 0
    for fn in variants.values():
        _per_call(fn, 500)  # warm up
    names = list(variants)
    times: dict[str, list[float]] = {n: [] for n in names}
    cpus: dict[str, list[float]] = {n: [] for n in names}
    for r in range(args.repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            wall, cpu = _per_call(variants[name], args.iterations)
            times[name].append(wall)
            cpus[name].append(cpu)
    print(f"python {sys.version.split()[0]}, {args.repeats} interleaved rounds x "
          f"{args.iterations} calls, single thread; median [range]")
    print(f"  {'configuration':<38}{'us/call':>20}{'added over baseline us':>26}"
          f"{'added CPU us (this thread)':>30}")
    report: dict[str, Any] = {}
    for name in names:
        us = [t * 1e6 for t in times[name]]
        added = [(t - b) * 1e6 for t, b in zip(times[name], times[names[0]], strict=True)]
        added_cpu = [(t - b) * 1e6 for t, b in zip(cpus[name], cpus[names[0]], strict=True)]
        report[name] = {"us": statistics.median(us), "added_us": statistics.median(added),
                        "added_cpu_us": statistics.median(added_cpu)}
        print(f"  {name:<38}{statistics.median(us):>9.1f} [{min(us):.1f}-{max(us):.1f}]"
              f"{statistics.median(added):>14.1f} [{min(added):.1f}-{max(added):.1f}]"
              f"{statistics.median(added_cpu):>16.1f} [{min(added_cpu):.1f}-"
              f"{max(added_cpu):.1f}]")
    tp.shutdown()
    for provider in sampled.values():
        provider.shutdown()
    mp.shutdown()
    mp_exemplars.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
