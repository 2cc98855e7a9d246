"""Sequential steps against envlink's server: this tree, another tree, OpenEnv 0.10.

Run (after ``benchmarks/run.py`` has made ``.venv-bench`` and ``.venv-openenv``)::

    python3 benchmarks/ab_server.py --base /path/to/other/checkout/src
        [--mode async|sync] [--rounds 5] [--steps 2000]

Starts envlink's reference server, then runs each variant in a fresh process
(one client, ``--steps`` sequential echo steps after a warm-up), interleaved and
rotated per round. Prints the median client CPU per step and p50 latency, and the
per-round ratios of this tree against the other two. A short A/B for one change,
not the benchmark of record (that is ``benchmarks/run.py``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_CHILD = r"""
import asyncio, sys, time
client, mode, url, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
ACTION = {"type": "call_tool", "tool_name": "echo_message", "arguments": {"message": "hello"}}
if client == "envlink":
    from envlink import GenericEnvClient as C
    kw = {}
else:
    from openenv.core import GenericEnvClient as C
    kw = {"message_timeout_s": 60}
perf = time.perf_counter
lat = [0.0] * n
if mode == "async":
    async def main():
        c = C(base_url=url, **kw)
        if client == "openenv":
            await c.connect()
        await c.reset()
        for _ in range(300):
            await c.step(ACTION)
        cpu0 = time.process_time()
        for i in range(n):
            s = perf(); await c.step(ACTION); lat[i] = perf() - s
        cpu = time.process_time() - cpu0
        await c.close()
        return cpu
    cpu = asyncio.run(main())
else:
    c = C(base_url=url, **kw).sync()
    c.connect(); c.reset()
    for _ in range(300):
        c.step(ACTION)
    cpu0 = time.process_time()
    for i in range(n):
        s = perf(); c.step(ACTION); lat[i] = perf() - s
    cpu = time.process_time() - cpu0
    c.close()
lat.sort()
print(cpu / n * 1e6, lat[n // 2] * 1e6)
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the other tree's src directory")
    parser.add_argument("--mode", choices=["async", "sync"], default="async")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=2000)
    args = parser.parse_args()
    bench = ROOT / ".venv-bench" / "bin" / "python"
    openenv = ROOT / ".venv-openenv" / "bin" / "python"
    server = subprocess.Popen([str(bench), "-m", "envlink.server", "--port", "0", "--env", "echo"],
                              stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        url = line.rsplit(" ", 1)[-1].strip().replace("ws://", "http://")
        variants = {"this": (bench, {}, "envlink"),
                    "base": (bench, {"PYTHONPATH": args.base}, "envlink"),
                    "openenv": (openenv, {}, "openenv")}
        names = list(variants)
        samples: dict[str, list[tuple[float, float]]] = {n: [] for n in names}
        for r in range(args.rounds):
            for name in names[r % 3:] + names[:r % 3]:
                python, env, client = variants[name]
                out = subprocess.run([str(python), "-c", _CHILD, client, args.mode, url,
                                      str(args.steps)], env={**os.environ, **env},
                                     capture_output=True, text=True, cwd="/", check=True)
                cpu, p50 = map(float, out.stdout.split()[-2:])
                samples[name].append((cpu, p50))
    finally:
        server.terminate()
        server.wait(10)
    print(f"{args.mode}: {args.rounds} rounds x {args.steps} steps, envlink server")
    for name, rows in samples.items():
        cpu_values, p50_values = [c for c, _ in rows], [p for _, p in rows]
        print(f"  {name:8} CPU/step {statistics.median(cpu_values):6.1f} us "
              f"[{min(cpu_values):.0f}-{max(cpu_values):.0f}]  "
              f"p50 {statistics.median(p50_values):6.1f} us")
    for other in ("base", "openenv"):
        cpu_r = [a[0] / b[0] for a, b in zip(samples["this"], samples[other], strict=True)]
        p50_r = [a[1] / b[1] for a, b in zip(samples["this"], samples[other], strict=True)]
        print(f"  this/{other}: CPU {statistics.median(cpu_r):.2f} "
              f"[{min(cpu_r):.2f}-{max(cpu_r):.2f}]  p50 {statistics.median(p50_r):.2f} "
              f"[{min(p50_r):.2f}-{max(p50_r):.2f}]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
