"""Where a step's client time goes: cProfile of sequential steps, per thread.

Run (in the benchmark virtualenv, from the repository root)::

    .venv-bench/bin/python benchmarks/profile_step.py [--mode sync|async]
        [--telemetry off|sdk] [--steps 3000] [--top 25]

Starts envlink's reference server as a separate process, runs ``--steps``
sequential echo steps with envlink's ``GenericEnvClient`` (``.sync()`` or
async), and profiles the client with cProfile in every thread that runs client
code (the caller and, for ``.sync()``, the bridge's loop thread). Prints the
Python function calls per step and the functions with the most own time per
step, so that a change can be judged by what it removed. cProfile slows
everything down (roughly 2x): read the figures as shares, not as latencies.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import pstats
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
ACTION: dict[str, Any] = {"type": "call_tool", "tool_name": "echo_message",
                          "arguments": {"message": "hello"}}


def _start_server() -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen([sys.executable, "-m", "envlink.server", "--port", "0",
                             "--env", "echo"], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    prefix = "envlink serve: listening on "
    if not line.startswith(prefix):
        proc.kill()
        raise SystemExit(f"server did not start: {line!r}")
    return proc, line[len(prefix):].strip()


def _configure(telemetry: str) -> Any:
    if telemetry == "off":
        return None
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    import envlink.telemetry

    class Drop(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    return envlink.telemetry.configure(service_name="profile", span_exporters=[Drop()],
                                       metric_readers=[InMemoryMetricReader()])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=["sync", "async"], default="sync")
    parser.add_argument("--telemetry", choices=["off", "sdk"], default="sdk")
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()

    handle = _configure(args.telemetry)
    from envlink import GenericEnvClient

    server, url = _start_server()
    profilers: list[tuple[str, cProfile.Profile]] = []
    try:
        main_prof = cProfile.Profile()
        profilers.append(("caller thread", main_prof))
        if args.mode == "sync":
            env = GenericEnvClient(base_url=url).sync()
            env.reset()
            for _ in range(200):
                env.step(ACTION)
            loop_prof = cProfile.Profile()
            profilers.append(("bridge loop thread", loop_prof))
            env.bridge.call(_enable_on_loop, loop_prof, timeout=10)
            t0 = time.perf_counter()
            main_prof.enable()
            for _ in range(args.steps):
                env.step(ACTION)
            main_prof.disable()
            wall = time.perf_counter() - t0
            env.bridge.call(_disable_on_loop, loop_prof, timeout=10)
            env.close()
        else:
            async def run() -> float:
                aenv = GenericEnvClient(base_url=url)
                await aenv.reset()
                for _ in range(200):
                    await aenv.step(ACTION)
                t0 = time.perf_counter()
                main_prof.enable()
                for _ in range(args.steps):
                    await aenv.step(ACTION)
                main_prof.disable()
                wall = time.perf_counter() - t0
                await aenv.close()
                return wall

            wall = asyncio.run(run())
    finally:
        server.terminate()
        server.wait(10)
        if handle is not None:
            handle.shutdown()

    print(f"{args.mode} steps, telemetry {args.telemetry}, {args.steps} steps, "
          f"{wall / args.steps * 1e6:.0f} us/step under the profiler")
    for name, prof in profilers:
        stats = pstats.Stats(prof)
        calls = sum(v[1] for v in stats.stats.values())  # type: ignore[attr-defined]
        total = sum(v[2] for v in stats.stats.values())  # type: ignore[attr-defined]
        print(f"\n== {name}: {calls / args.steps:.0f} Python-level calls per step, "
              f"{total / args.steps * 1e6:.0f} us own time per step (profiled)")
        groups: dict[str, list[float]] = {}
        for (filename, _line, func), v in stats.stats.items():  # type: ignore[attr-defined]
            group = _group(filename, func)
            acc = groups.setdefault(group, [0.0, 0.0])
            acc[0] += v[1]
            acc[1] += v[2]
        print(f"{'calls/step':>10} {'own us/step':>12}  where")
        for group, (ncalls, own) in sorted(groups.items(), key=lambda kv: -kv[1][1]):
            print(f"{ncalls / args.steps:>10.1f} {own / args.steps * 1e6:>12.1f}  {group}")
        print()
        out = io.StringIO()
        stats.stream = out  # type: ignore[attr-defined]
        stats.sort_stats("tottime").print_stats(args.top)
        lines = out.getvalue().splitlines()
        start = next((i for i, line in enumerate(lines) if "ncalls" in line), len(lines))
        print(f"{'calls/step':>10} {'own us/step':>12}  function")
        for line in lines[start + 1:]:
            parts = line.split(None, 5)
            if len(parts) < 6:
                continue
            ncalls = int(parts[0].split("/")[0])
            print(f"{ncalls / args.steps:>10.2f} {float(parts[1]) / args.steps * 1e6:>12.2f}"
                  f"  {parts[5]}")
    return 0


_WAITS = ("poll' of 'select.epoll", "acquire' of '_thread.lock")


def _group(filename: str, func: str) -> str:
    """A coarse bucket for a profiled function: blocked, or which package ran it."""
    if any(w in func for w in _WAITS):
        return "blocked (epoll, lock wait)"
    if "socket" in func:
        return "socket syscalls"
    for key in ("opentelemetry", "envlink", "asyncio", "websockets", "pydantic", "json",
                "structlog", "contextvars"):
        if f"/{key}/" in filename or f"'{key}" in func or f"{key}." in func:
            return key
    if filename == "~":
        return "builtins (isinstance, ...)"
    return "other Python"


def _enable_on_loop(prof: cProfile.Profile) -> Any:
    async def go() -> None:
        prof.enable()
    return go()


def _disable_on_loop(prof: cProfile.Profile) -> Any:
    async def go() -> None:
        prof.disable()
    return go()


if __name__ == "__main__":
    raise SystemExit(main())
