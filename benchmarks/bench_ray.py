"""The same 256-session batch in one process (EnvPool) and on 2 and 4 Ray shards.

Run: ``python benchmarks/bench_ray.py [--sessions 256] [--servers 2] [--rounds 20]
[--repeats 3] [--shards 2,4]`` (needs ``envlink[ray]``; about a minute; prints a
table and writes ``bench_ray.json``).

Starts ``--servers`` reference server processes (``envlink serve --env echo``) and
one local Ray (``ray.init(num_cpus=<cores>)`` on 127.0.0.1), then measures, for each
variant, ``reset`` once and ``--rounds`` batched ``step`` calls of ``--sessions``
sessions through the async API:

* ``in-process``: one :class:`envlink.EnvPool` on this process's event loop;
* ``ray N``: one :class:`envlink.ray.RayEnvPool` with ``N`` shard actors.

Variants run interleaved, ``--repeats`` times in a rotating order (each repetition
builds its pools afresh: actor start-up and session placement are outside the
timed rounds); the table shows the median steps per second and batch time, and
each ratio against ``in-process`` is the median of the ratios within a
repetition. Also printed: the machine's cores and load average, because on a
small, busy machine Ray's per-call costs (serialising each batch, one actor call
per shard and per batch, the actors' own processes competing for the same cores)
can outweigh the parallelism of the shards. Not a test: figures are noisy.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from typing import Any

LISTENING = re.compile(r"listening on (ws://\S+)")


def _start_servers(count: int, max_sessions: int) -> tuple[list[subprocess.Popen[str]], list[str]]:
    procs, urls = [], []
    for _ in range(count):
        proc = subprocess.Popen(
            [sys.executable, "-m", "envlink.server", "--host", "127.0.0.1", "--port", "0",
             "--env", "echo", "--max-sessions", str(max_sessions)],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        assert proc.stdout is not None
        match = LISTENING.search(proc.stdout.readline())
        if match is None:
            raise RuntimeError("a reference server did not start")
        procs.append(proc)
        urls.append(match.group(1))
    return procs, urls


async def _measure(pool: Any, sessions: int, rounds: int) -> dict[str, Any]:
    batch = await pool.reset()
    if not batch.ok:
        raise RuntimeError(f"reset failed: {batch.errors}")
    times = []
    for r in range(rounds):
        actions = [{"message": f"s{i} r{r}"} for i in range(sessions)]
        start = time.perf_counter()
        batch = await pool.step(actions)
        times.append(time.perf_counter() - start)
        if not batch.ok:
            raise RuntimeError(f"step failed: {batch.errors}")
    return {"batch_s": statistics.median(times),
            "steps_per_s": sessions * rounds / sum(times)}


async def _run(variant: str, urls: list[str], args: argparse.Namespace) -> dict[str, Any]:
    from envlink import EnvPool

    if variant == "in-process":
        async with EnvPool(urls, args.sessions) as pool:
            return await _measure(pool, args.sessions, args.rounds)
    from envlink.ray import RayEnvPool

    shards = int(variant.split()[1])
    async with RayEnvPool(urls, args.sessions, shards=shards) as ray_pool:
        return await _measure(ray_pool, args.sessions, args.rounds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sessions", type=int, default=256)
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--shards", default="2,4", help="shard counts, comma-separated")
    parser.add_argument("--json", default="bench_ray.json", help="where to write results")
    args = parser.parse_args(argv)

    import ray

    cores = os.cpu_count() or 1
    variants = ["in-process"] + [f"ray {n}" for n in args.shards.split(",")]
    procs, urls = _start_servers(args.servers, args.sessions + 16)
    ray.init(num_cpus=cores, _node_ip_address="127.0.0.1", include_dashboard=False,
             log_to_driver=False, configure_logging=False)
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    try:
        for rep in range(args.repeats):
            order = variants[rep % len(variants):] + variants[:rep % len(variants)]
            for variant in order:
                result = asyncio.run(_run(variant, urls, args))
                runs[variant].append(result)
                print(f"  rep {rep + 1} {variant:<11} {result['steps_per_s']:9.0f} steps/s",
                      file=sys.stderr)
    finally:
        ray.shutdown()
        for proc in procs:
            proc.kill()
            proc.wait()

    base = runs["in-process"]
    rows = []
    for variant in variants:
        sps = statistics.median(r["steps_per_s"] for r in runs[variant])
        batch = statistics.median(r["batch_s"] for r in runs[variant])
        ratio = statistics.median(r["steps_per_s"] / b["steps_per_s"]
                                  for r, b in zip(runs[variant], base, strict=True))
        rows.append({"variant": variant, "steps_per_s": sps, "batch_ms": batch * 1000,
                     "vs_in_process": ratio})
    load = os.getloadavg()
    print(f"\n{args.sessions} sessions, {args.servers} echo servers, {args.rounds} rounds, "
          f"{args.repeats} repetitions; {cores} cores, load average "
          f"{load[0]:.1f} {load[1]:.1f} {load[2]:.1f}; Python {platform.python_version()}, "
          f"Ray {ray.__version__}")
    print(f"{'variant':<12} {'steps/s':>9} {'batch p50 ms':>13} {'vs in-process':>14}")
    for row in rows:
        print(f"{row['variant']:<12} {row['steps_per_s']:>9.0f} {row['batch_ms']:>13.1f} "
              f"{row['vs_in_process']:>13.2f}x")
    with open(args.json, "w", encoding="utf-8") as f:
        json.dump({"args": vars(args), "cores": cores, "load": load, "rows": rows,
                   "runs": runs}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
