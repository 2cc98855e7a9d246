"""EnvPool at scale: 1,000 sessions on one loop thread against reference server processes.

Run: ``python benchmarks/bench_pool.py [--sessions 1000] [--servers 3] [--rounds 20]
[--repeats 3]`` (a few minutes; prints a table and writes
``benchmarks/results/bench_pool.json``).

Starts ``--servers`` reference server processes (``envlink serve --env echo``, with
``--max-sessions`` high enough), then measures, each variant in a fresh Python
process so that memory figures do not share an allocator:

* ``pool``: one :class:`envlink.EnvPool` of ``--sessions`` sessions through its
  sync facade (one bridge thread for all of them): ``reset`` once, then
  ``--rounds`` batched ``step`` calls. Reported: batch time p50/p99, aggregate
  steps per second, resident memory per idle session (RSS after the sessions are
  open and reset, minus RSS before, divided by the sessions), the client
  process's CPU time per batch (all its threads), and p99 of one session's step
  latency inside a batch (the client's own ``step`` call, from its
  start to its answer).
* ``pool, max_inflight=W``: the same with a window of ``--window`` session calls
  running at once (each session's call then measures the server and network, not
  the pool's own queue; the batch still waits for every slot).
* ``pool N=1``: the same with one session: the latency baseline.
* ``threads``: OpenEnv's way, one sync client per environment, each with its own
  event-loop thread, stepped from a ``ThreadPoolExecutor`` (``--pool-threads``
  workers). OpenEnv's client lives in a separate virtualenv in this project, so
  the stand-in is envlink's own ``GenericEnvClient(url).sync()`` per environment
  (one bridge, hence one thread, each): the same architecture as OpenEnv's
  ``EnvClient(...).sync()``, with envlink's per-call costs.

Variants run interleaved, ``--repeats`` times in a rotating order; the table shows
medians, and each ratio is the median of the ratios within a repetition.

Targets: RSS per idle session <= 100 KiB; p99 session step at N=1000
<= 20x N=1; the pool faster per batch and far smaller than the threads. Not a
test: figures are noisy, read ratios of one run.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

LISTENING = re.compile(r"listening on (ws://\S+)")


def _status_kib(field: str) -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def _rss_kib() -> int:
    return _status_kib("VmRSS")


def _vm_kib() -> int:
    return _status_kib("VmSize")


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))
    return ordered[index]


def _action(i: int, r: int) -> dict[str, str]:
    return {"message": f"s{i}r{r}"}


# ------------------------------------------------------------------ variants (child)


def run_pool(urls: list[str], sessions: int, rounds: int, window: int | None = None
             ) -> dict[str, Any]:
    """The EnvPool variant, in this (fresh) process."""
    from envlink import ClientConfig, EnvPool, GenericEnvClient, Timeout

    latencies: list[float] = []

    class TimedClient(GenericEnvClient):
        async def step(self, action: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return await super().step(action, **kwargs)
            finally:
                latencies.append(time.perf_counter() - start)

    gc.collect()
    rss0, vm0 = _rss_kib(), _vm_kib()
    pool = EnvPool(urls, sessions, client=TimedClient, max_inflight=window,
                   client_config=ClientConfig(timeout=Timeout(60.0))).sync()
    try:
        first = pool.reset()
        errors = len(first.errors)
        gc.collect()
        rss1, vm1 = _rss_kib(), _vm_kib()
        batches: list[float] = []
        cpu: list[float] = []
        latencies.clear()
        for r in range(rounds):
            actions = [_action(i, r) for i in range(sessions)]
            start, cpu0 = time.perf_counter(), time.process_time()
            batch = pool.step(actions)
            batches.append(time.perf_counter() - start)
            cpu.append(time.process_time() - cpu0)
            errors += len(batch.errors)
        per_endpoint = [e.sessions for e in pool.view().endpoints]
    finally:
        pool.close()
    return {"batches": batches, "cpu": cpu, "latencies": latencies, "rss_kib": rss1 - rss0,
            "vm_kib": vm1 - vm0, "errors": errors, "per_endpoint": per_endpoint}


def run_threads(urls: list[str], sessions: int, rounds: int, workers: int) -> dict[str, Any]:
    """OpenEnv's way, in this (fresh) process: a sync client (own thread) per environment."""
    from envlink import GenericEnvClient, Timeout

    gc.collect()
    rss0, vm0 = _rss_kib(), _vm_kib()
    envs = [GenericEnvClient(urls[i % len(urls)], timeout=Timeout(60.0)).sync()
            for i in range(sessions)]
    latencies: list[float] = []
    errors = 0

    def timed_step(env: Any, action: dict[str, str]) -> None:
        start = time.perf_counter()
        env.step(action)
        latencies.append(time.perf_counter() - start)

    try:
        with ThreadPoolExecutor(max_workers=workers) as executor:
            for outcome in executor.map(lambda e: e.reset(), envs):
                del outcome
            gc.collect()
            rss1, vm1 = _rss_kib(), _vm_kib()
            threads = sum(1 for _ in os.listdir("/proc/self/task"))
            batches: list[float] = []
            cpu: list[float] = []
            for r in range(rounds):
                start, cpu0 = time.perf_counter(), time.process_time()
                futures = [executor.submit(timed_step, env, _action(i, r))
                           for i, env in enumerate(envs)]
                for f in futures:
                    if f.exception() is not None:
                        errors += 1
                batches.append(time.perf_counter() - start)
                cpu.append(time.process_time() - cpu0)
    finally:
        with ThreadPoolExecutor(max_workers=workers) as executor:
            list(executor.map(lambda e: e.close(), envs))
    return {"batches": batches, "cpu": cpu, "latencies": latencies, "rss_kib": rss1 - rss0,
            "vm_kib": vm1 - vm0, "errors": errors, "threads": threads}


# ------------------------------------------------------------------ driver (parent)


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


def _child(variant: str, urls: list[str], args: argparse.Namespace, sessions: int
           ) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", variant, "--urls", ",".join(urls),
         "--sessions", str(sessions), "--rounds", str(args.rounds),
         "--pool-threads", str(args.pool_threads), "--window", str(args.window)],
        check=True, capture_output=True, text=True)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def _summary(raw: dict[str, Any], sessions: int) -> dict[str, Any]:
    batches, lat = raw["batches"], raw["latencies"]
    total = sum(batches)
    return {
        "sessions": sessions,
        "batch_p50_ms": 1e3 * statistics.median(batches),
        "batch_p99_ms": 1e3 * _pct(batches, 99),
        "cpu_per_batch_ms": 1e3 * statistics.median(raw["cpu"]),
        "steps_per_s": sessions * len(batches) / total if total else 0.0,
        "step_p50_ms": 1e3 * statistics.median(lat),
        "step_p99_ms": 1e3 * _pct(lat, 99),
        "rss_per_session_kib": raw["rss_kib"] / sessions,
        "vm_per_session_kib": raw["vm_kib"] / sessions,
        "errors": raw["errors"],
        **{k: raw[k] for k in ("per_endpoint", "threads") if k in raw},
    }


def _median_row(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out = dict(rows[0])
    for key, value in rows[0].items():
        if isinstance(value, float):
            out[key] = statistics.median(r[key] for r in rows)
    out["errors"] = sum(r["errors"] for r in rows)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--servers", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3,
                        help="interleaved repetitions of every variant")
    parser.add_argument("--pool-threads", type=int, default=64,
                        help="ThreadPoolExecutor workers for the threads variant")
    parser.add_argument("--json", default=str(Path(__file__).resolve().parent / "results"
                                              / "bench_pool.json"),
                        help="where to write results")
    parser.add_argument("--window", type=int, default=64,
                        help="max_inflight of the windowed EnvPool variant")
    parser.add_argument("--child", choices=["pool", "window", "threads"],
                        help=argparse.SUPPRESS)
    parser.add_argument("--urls", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.child:
        urls = args.urls.split(",")
        if args.child == "threads":
            raw = run_threads(urls, args.sessions, args.rounds, args.pool_threads)
        else:
            raw = run_pool(urls, args.sessions, args.rounds,
                           args.window if args.child == "window" else None)
        print(json.dumps(raw))
        return 0

    procs, urls = _start_servers(args.servers, args.sessions + 16)
    variants = [("pool", args.sessions), ("window", args.sessions), ("pool_n1", 1),
                ("threads", args.sessions)]
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in variants}
    try:
        _child("pool", urls, args, 1)  # warm-up: imports, server caches
        # Variants interleaved, in a rotating order, so that noise from other work on
        # the machine hits them alike; ratios are taken within each repetition.
        for rep in range(args.repeats):
            order = variants[rep % len(variants):] + variants[:rep % len(variants)]
            for name, n in order:
                child = "pool" if name == "pool_n1" else name
                runs[name].append(_summary(_child(child, urls, args, n), n))
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=10)

    def ratio(top: str, key_top: str, bottom: str, key_bottom: str) -> float:
        return statistics.median(
            a[key_top] / max(b[key_bottom], 1e-9)
            for a, b in zip(runs[top], runs[bottom], strict=True))

    ratios = {
        "step_p99_n_vs_1": ratio("pool", "step_p99_ms", "pool_n1", "step_p99_ms"),
        "step_p99_n_vs_1_window": ratio("window", "step_p99_ms", "pool_n1", "step_p99_ms"),
        "threads_vs_pool_batch_p50": ratio("threads", "batch_p50_ms", "pool", "batch_p50_ms"),
        "threads_vs_pool_cpu": ratio("threads", "cpu_per_batch_ms", "pool", "cpu_per_batch_ms"),
        "threads_vs_pool_rss": ratio("threads", "rss_per_session_kib",
                                     "pool", "rss_per_session_kib"),
        "threads_vs_pool_vm": ratio("threads", "vm_per_session_kib",
                                    "pool", "vm_per_session_kib"),
    }
    med = {name: _median_row(rows) for name, rows in runs.items()}
    pool, window, one, threads = med["pool"], med["window"], med["pool_n1"], med["threads"]
    n = args.sessions
    print(f"python {platform.python_version()}, {os.cpu_count()} cpus, {n} sessions, "
          f"{args.servers} server processes (echo), {args.rounds} batched steps; "
          f"medians of {args.repeats} interleaved repetitions")
    head = f"{'variant':<34}{'batch p50':>11}{'batch p99':>11}{'CPU/batch':>11}" \
           f"{'steps/s':>9}{'step p50':>10}{'step p99':>10}{'RSS/sess':>11}{'errors':>7}"
    print(head)
    for name, row in ((f"EnvPool, 1 loop thread, N={n}", pool),
                      (f"EnvPool, max_inflight={args.window}", window),
                      ("EnvPool, N=1", one),
                      (f"sync client+thread per env, N={n}", threads)):
        print(f"{name:<34}{row['batch_p50_ms']:>9.1f}ms{row['batch_p99_ms']:>9.1f}ms"
              f"{row['cpu_per_batch_ms']:>9.1f}ms{row['steps_per_s']:>9.0f}"
              f"{row['step_p50_ms']:>8.2f}ms{row['step_p99_ms']:>8.2f}ms"
              f"{row['rss_per_session_kib']:>8.1f}KiB{row['errors']:>7}")
    print(f"sessions per endpoint: {pool.get('per_endpoint')}; "
          f"threads in the thread-per-env process: {threads.get('threads')}")
    print(f"RSS per idle session:          {pool['rss_per_session_kib']:.1f} KiB "
          f"(target <= 100 KiB: {'met' if pool['rss_per_session_kib'] <= 100 else 'NOT met'})")
    for label, key in (("", "step_p99_n_vs_1"), (f", window {args.window}",
                                                 "step_p99_n_vs_1_window")):
        value = ratios[key]
        print(f"step p99, N={n} vs N=1{label}: {value:.1f}x "
              f"(target <= 20x: {'met' if value <= 20 else 'NOT met'})")
    print(f"thread-per-env / pool, batch p50: {ratios['threads_vs_pool_batch_p50']:.2f}x "
          f"(per repetition: " + ", ".join(
              f"{t['batch_p50_ms'] / p['batch_p50_ms']:.2f}"
              for t, p in zip(runs["threads"], runs["pool"], strict=True)) + ")")
    print(f"thread-per-env / pool, client CPU per batch: "
          f"{ratios['threads_vs_pool_cpu']:.2f}x")
    print(f"load average after the run: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cpus")
    print(f"thread-per-env / pool, memory: {ratios['threads_vs_pool_rss']:.2f}x RSS, "
          f"{ratios['threads_vs_pool_vm']:.0f}x virtual "
          f"({threads['vm_per_session_kib']:.0f} vs {pool['vm_per_session_kib']:.1f} KiB "
          "of address space per session: each thread reserves a stack)")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    with open(args.json, "w", encoding="utf-8") as f:
        json.dump({"sessions": n, "servers": args.servers, "rounds": args.rounds,
                   "repeats": args.repeats, "window": args.window, "medians": med,
                   "runs": runs, "ratios": ratios,
                   "baseline": "envlink GenericEnvClient(...).sync() per environment "
                               "(openenv's client is not installed in this venv)"},
                  f, indent=2)
    print(f"wrote {args.json}")
    return 0 if all(r["errors"] == 0 for rows in runs.values() for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
