"""Memory per idle session: tracemalloc, GC-tracked objects and RSS, envlink and OpenEnv.

Run::

    python3 benchmarks/bench_memory.py [--sessions 200] [--rounds 3] [--openenv-python PATH]

One envlink reference server (``envlink serve --env echo``); each measurement is a
fresh client process that opens ``--sessions`` sessions on one event loop (connect,
``reset()``, one ``step()`` each) and reports, per session, what opening them added:

* ``heap``: ``tracemalloc``'s traced memory and ``len(gc.get_objects())``
  (GC-tracked objects), with tracemalloc started before the first session;
* ``rss``: the resident set's growth, without tracemalloc (it also counts the
  allocator's arenas and pages touched once).

Clients: envlink (this interpreter) and, where its virtualenv exists
(``.venv-openenv``, or ``--openenv-python``), OpenEnv 0.10's ``GenericEnvClient``
importing its client modules alone (as ``run.py``'s scale section does); without it,
envlink only. Clients and measurements are interleaved round by round in a rotating
order; each figure is the median over ``--rounds`` with its range, and the ratio
envlink / OpenEnv is taken within each round.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

MEASURES = ("heap", "rss")


async def _open(client: str, url: str, sessions: int) -> list[Any]:
    from _driver import ACTION, openenv_client_class

    if client == "envlink":
        from envlink import GenericEnvClient

        clients = [GenericEnvClient(base_url=url) for _ in range(sessions)]
    else:
        cls = openenv_client_class("openenv")
        clients = [cls(base_url=url, message_timeout_s=120) for _ in range(sessions)]
    for i in range(0, sessions, 50):  # in batches: not the server's accept queue
        batch = clients[i:i + 50]
        if client != "envlink":
            await asyncio.gather(*(c.connect() for c in batch))
        await asyncio.gather(*(c.reset() for c in batch))
        await asyncio.gather(*(c.step(ACTION) for c in batch))
    return clients


def child(client: str, measure: str, url: str, sessions: int) -> dict[str, float]:
    """In a fresh process: open the sessions and report what each added."""
    import tracemalloc

    from _driver import openenv_client_class, rss_bytes

    # Imports first (the client's modules are not per-session memory): one session
    # opened and closed before measuring.
    if client == "envlink":
        import envlink  # noqa: F401
    else:
        openenv_client_class("openenv")

    async def main() -> dict[str, float]:
        for c in await _open(client, url, 1):
            await c.close()
        gc.collect()
        if measure == "heap":
            tracemalloc.start()
            before_mem, before_obj = tracemalloc.get_traced_memory()[0], len(gc.get_objects())
        else:
            before_rss = rss_bytes()
        clients = await _open(client, url, sessions)
        gc.collect()
        if measure == "heap":
            out = {"tracemalloc_kib": (tracemalloc.get_traced_memory()[0] - before_mem)
                   / sessions / 1024,
                   "gc_objects": (len(gc.get_objects()) - before_obj) / sessions}
            tracemalloc.stop()
        else:
            out = {"rss_kib": (rss_bytes() - before_rss) / sessions / 1024}
        await asyncio.gather(*(c.close() for c in clients))
        return out

    return asyncio.run(main())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--openenv-python", default=str(ROOT / ".venv-openenv" / "bin" / "python"))
    parser.add_argument("--json", default=None, metavar="PATH", help="also write the figures")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--measure", choices=MEASURES, default="heap", help=argparse.SUPPRESS)
    parser.add_argument("--url", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.measure, args.url, args.sessions)))
        return 0

    from run import envlink_server

    pythons = {"envlink": sys.executable}
    if Path(args.openenv_python).exists():
        pythons["openenv"] = args.openenv_python
    else:
        print(f"no OpenEnv virtualenv ({args.openenv_python}): envlink only", flush=True)
    server = envlink_server(sys.executable, max_sessions=2 * args.sessions + 8,
                            name="memory-echo")
    server.start(deadline=120.0)
    jobs = [(c, m) for m in MEASURES for c in pythons]
    got: dict[tuple[str, str], list[dict[str, float]]] = {job: [] for job in jobs}
    try:
        for r in range(args.rounds):
            for client, measure in jobs[r % len(jobs):] + jobs[:r % len(jobs)]:
                done = subprocess.run(
                    [pythons[client], __file__, "--child", client, "--measure", measure,
                     "--url", server.base_url, "--sessions", str(args.sessions)],
                    capture_output=True, text=True, timeout=600, check=False)
                if done.returncode != 0:
                    raise SystemExit(f"{client} {measure}: {done.stderr[-3000:]}")
                got[(client, measure)].append(json.loads(done.stdout.splitlines()[-1]))
    finally:
        server.stop()
    print(f"memory per idle session, {args.sessions} sessions on one loop (connect, reset, "
          f"one step each), Python {sys.version.split()[0]}, {args.rounds} interleaved "
          "rounds: median [range]")
    report: dict[str, Any] = {"sessions": args.sessions, "rounds": args.rounds,
                              "python": sys.version.split()[0], "clients": {}}
    keys = {"heap": ("tracemalloc_kib", "gc_objects"), "rss": ("rss_kib",)}
    labels = {"tracemalloc_kib": "tracemalloc KiB", "gc_objects": "GC-tracked objects",
              "rss_kib": "RSS growth KiB"}
    for measure in MEASURES:
        for key in keys[measure]:
            line = f"  {labels[key]:<20}"
            for client in pythons:
                values = [row[key] for row in got[(client, measure)]]
                report["clients"].setdefault(client, {})[key] = values
                line += (f"  {client}: {statistics.median(values):7.1f} "
                         f"[{min(values):.1f}-{max(values):.1f}]")
            if "openenv" in pythons:
                ratios = [e[key] / o[key] for e, o in zip(
                    got[("envlink", measure)], got[("openenv", measure)], strict=True)]
                report.setdefault("ratios", {})[key] = ratios
                line += f"  envlink / OpenEnv: {statistics.median(ratios):.2f}x"
            print(line)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
