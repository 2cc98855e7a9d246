"""The fleet's shared limits: many processes' pools against servers that hold fewer sessions.

Run: ``python benchmarks/bench_fleet.py [--processes 8] [--sessions 32] [--servers 2]
[--server-sessions 64] [--episodes 4] [--steps 10] [--store directory|redis|none]``
(``--quick``: 4 processes x 8 sessions against one server of 16); prints a table and
writes ``benchmarks/results/bench_fleet.json``. Needs envlink importable (run it with
the project's virtualenv, or ``PYTHONPATH=src``); ``--store redis`` needs
``redis-server`` on the PATH.

Starts ``--servers`` reference servers (``envlink serve --env echo --max-sessions
N``), then runs three variants, each with fresh servers:

* ``fit``: ``--processes / 2`` processes, which fit the servers' capacity exactly:
  the baseline of steps per second, no contention;
* ``none``: ``--processes`` processes, each an ``EnvPool(urls, --sessions)``, with no
  shared limit: they collide on ``CAPACITY_REACHED`` and each backs off alone;
* ``fleet``: the same with ``ClientConfig(fleet=FleetLimits(store,
  max_sessions=servers x server_sessions, max_sessions_per_endpoint=server_sessions))``.

Each process resets its pool and steps it for ``--steps`` steps, ``--episodes`` times,
then closes it; all start at one signal. The variants run ``--repeats`` rounds (3),
interleaved in a rotating order. Reported, as medians over the rounds: aggregate steps
per second and its ratio to ``fit`` within each round, the session opens the servers
refused (their ``/health`` counters), the most sessions a server held, errors callers
saw, and the slowest process's finish time over the median.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

LISTENING = re.compile(r"listening on (ws://\S+)")
HERE = Path(__file__).resolve().parent


# ------------------------------------------------------------------ worker (child)


def worker(spec: dict[str, Any]) -> None:
    import envlink

    fleet = spec.get("fleet")
    config = envlink.ClientConfig(
        fleet=None if fleet is None else envlink.FleetLimits(**fleet),
        timeout=envlink.Timeout(spec["timeout"]))
    print("ready", flush=True)
    sys.stdin.readline()                         # the start signal
    start = time.monotonic()
    steps = 0
    errors: dict[str, int] = {}
    actions = [{"message": "x"}] * spec["sessions"]
    with envlink.EnvPool(spec["urls"], spec["sessions"], client_config=config,
                         batch_timeout=spec["timeout"]).sync() as pool:
        for _ in range(spec["episodes"]):
            for result in pool.reset():
                if isinstance(result, BaseException):
                    errors[type(result).__name__] = errors.get(type(result).__name__, 0) + 1
            for _ in range(spec["steps"]):
                for result in pool.step(actions):
                    if isinstance(result, BaseException):
                        name = type(result).__name__
                        errors[name] = errors.get(name, 0) + 1
                    else:
                        steps += 1
    print(json.dumps({"steps": steps, "errors": errors, "start": start,
                      "end": time.monotonic()}), flush=True)


# ------------------------------------------------------------------ driver (parent)


def _servers(count: int, max_sessions: int) -> tuple[list[subprocess.Popen[str]], list[str]]:
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


def _health(url: str) -> dict[str, Any]:
    http = url.replace("ws://", "http://").rstrip("/") + "/health"
    with urllib.request.urlopen(http, timeout=10) as r:
        return json.loads(r.read())  # type: ignore[no-any-return]


def _redis() -> tuple[subprocess.Popen[str], str]:
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("--store redis needs redis-server on the PATH")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if "Ready to accept connections" in line:
            break
    return proc, f"redis://127.0.0.1:{port}/0"


def run_variant(name: str, args: argparse.Namespace, processes: int) -> dict[str, Any]:
    servers, urls = _servers(args.servers, args.server_sessions)
    extra: list[subprocess.Popen[str]] = []
    workdir = tempfile.mkdtemp(prefix="envlink-fleet-")
    try:
        fleet = None
        if name == "fleet":
            store = workdir
            if args.store == "redis":
                proc, store = _redis()
                extra.append(proc)
            fleet = {"store": store, "max_sessions": args.servers * args.server_sessions,
                     "max_sessions_per_endpoint": args.server_sessions}
        spec = {"urls": urls, "sessions": args.sessions, "episodes": args.episodes,
                "steps": args.steps, "timeout": args.timeout, "fleet": fleet}
        workers = [subprocess.Popen([sys.executable, __file__, "--worker", json.dumps(spec)],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    text=True) for _ in range(processes)]
        for w in workers:
            assert w.stdout is not None
            if w.stdout.readline().strip() != "ready":
                raise RuntimeError("a worker did not start")
        go = time.monotonic()
        for w in workers:
            assert w.stdin is not None
            w.stdin.write("go\n")
            w.stdin.flush()
        results = []
        for w in workers:
            assert w.stdout is not None
            results.append(json.loads(w.stdout.readline()))
            w.wait(timeout=60)
        wall = max(r["end"] for r in results) - go
        health = [_health(u) for u in urls]
        finish = [r["end"] - go for r in results]
        median = statistics.median(finish)
        errors: dict[str, int] = {}
        for r in results:
            for k, v in r["errors"].items():
                errors[k] = errors.get(k, 0) + v
        return {
            "variant": name, "processes": processes,
            "steps_per_s": sum(r["steps"] for r in results) / wall, "wall_s": wall,
            "refused": sum(h["counters"].get("capacity_refused", 0) for h in health),
            "server_peak": max(h["counters"].get("sessions_peak", 0) for h in health),
            "errors": errors, "slowest_over_median": max(finish) / median,
            "finish_s": sorted(finish),
        }
    finally:
        for p in [*servers, *extra]:
            p.kill()
            p.wait(timeout=10)
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true",
                        help="4 processes x 8 sessions, one server of 16, 2 episodes of 5")
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--sessions", type=int, default=32)
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--server-sessions", type=int, default=64)
    parser.add_argument("--episodes", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--store", choices=("directory", "redis"), default="directory")
    parser.add_argument("--variants", default="fit,none,fleet")
    parser.add_argument("--repeats", type=int, default=3,
                        help="rounds, the variants interleaved in a rotating order")
    parser.add_argument("--json", default=str(HERE / "results" / "bench_fleet.json"))
    args = parser.parse_args()
    if args.worker is not None:
        worker(json.loads(args.worker))
        return 0
    if args.quick:
        args.processes, args.sessions, args.servers = 4, 8, 1
        args.server_sessions, args.episodes, args.steps = 16, 2, 5
        args.repeats = 1
    names = args.variants.split(",")
    rounds: list[dict[str, dict[str, Any]]] = []
    for r in range(args.repeats):
        # Variants interleaved, in a rotating order: the machine's load changes.
        order = names[r % len(names):] + names[:r % len(names)]
        got = {}
        for name in order:
            processes = args.processes // 2 if name == "fit" else args.processes
            got[name] = run_variant(name, args, processes)
            print(json.dumps(got[name]), file=sys.stderr, flush=True)
        rounds.append(got)
    rows = []
    for name in names:
        runs = [got[name] for got in rounds]
        row = {"variant": name, "processes": runs[0]["processes"],
               "steps_per_s": statistics.median(x["steps_per_s"] for x in runs),
               "refused": int(statistics.median(x["refused"] for x in runs)),
               "server_peak": max(x["server_peak"] for x in runs),
               "slowest_over_median": statistics.median(
                   x["slowest_over_median"] for x in runs),
               "errors": {k: v for x in runs for k, v in x["errors"].items()},
               "runs": runs}
        if "fit" in names:
            ratios = [got[name]["steps_per_s"] / got["fit"]["steps_per_s"] for got in rounds]
            row["vs_fit"] = {"median": statistics.median(ratios), "min": min(ratios),
                             "max": max(ratios)}
        rows.append(row)
    print(f"{args.processes} processes x {args.sessions} sessions, {args.servers} servers x "
          f"{args.server_sessions} sessions, {args.episodes} episodes x {args.steps} steps, "
          f"store {args.store}, {args.repeats} round(s), load {os.getloadavg()[0]:.1f}")
    print(f"{'variant':<8} {'procs':>5} {'steps/s':>9} {'vs fit (range)':>18} {'refused':>8} "
          f"{'peak':>5} {'slowest/median':>15}  errors")
    for r in rows:
        ratio = ("" if "vs_fit" not in r else
                 f"{r['vs_fit']['median']:.2f}x ({r['vs_fit']['min']:.2f}-"
                 f"{r['vs_fit']['max']:.2f})")
        print(f"{r['variant']:<8} {r['processes']:>5} {r['steps_per_s']:>9.0f} {ratio:>18} "
              f"{r['refused']:>8} {r['server_peak']:>5} {r['slowest_over_median']:>15.2f}  "
              f"{r['errors'] or '-'}")
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "rows": rows,
                               "machine": {"cpus": os.cpu_count()}}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
