"""Run the envlink chaos suite from the command line, over several worker processes.

    python tests/chaos/run_chaos.py --soak                  # the documented soak
    python tests/chaos/run_chaos.py --episodes 200 --kill-episodes 40 --workers 2
    python tests/chaos/run_chaos.py --soak --seed 7 --report /tmp/soak.json

The in-process episodes are sharded over ``--workers - 1`` processes (each episode number
dealt to a shard by a seeded draw; an episode's plan depends only on the seed and its
number);
one more worker runs the kill -9 episodes. Each worker checks its own episodes, leaks
and memory; the reports are merged, the summary table is printed and the JSON written.
Exit status 1 if any violation or leak was found, or a soak target was missed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# Run as a script, the repository root is not on the path; as a module it already is.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.chaos._engine import ChaosConfig, format_summary, merge_reports, run_chaos
from tests.chaos._servers import FAULT_KINDS

#: The soak's targets: episodes in all, and injected faults of every kind.
SOAK_EPISODES = 1000
SOAK_FAULTS = 500
#: In-process / kill -9 episodes the soak starts from (more run while a kind is short).
SOAK_IN_PROCESS = 700
SOAK_KILL = 300


def soak_enabled(config: Any) -> bool:
    """Whether a pytest session runs the chaos suite in soak mode."""
    return bool(config.getoption("--soak")) or os.environ.get(
        "ENVLINK_CHAOS_SOAK", "") not in ("", "0")


def soak_config(seed: int) -> dict[str, Any]:
    """Arguments of the soak: per-stream minimum episodes and the per-kind target."""
    return {"episodes": SOAK_IN_PROCESS, "kill_episodes": SOAK_KILL,
            "fault_target": SOAK_FAULTS, "calls": 16, "faults_per_episode": 10,
            "kills_per_episode": 4, "seed": seed}


def run_workers(*, seed: int, workers: int, episodes: int, kill_episodes: int,
                fault_target: int, calls: int, faults_per_episode: int,
                kills_per_episode: int, label: str,
                report: Path | None) -> tuple[dict[str, Any], Path]:
    """Run the episodes over ``workers`` processes; return the merged report and its path."""
    if workers < 2:
        raise ValueError("at least 2 workers: one kill -9 worker and one in-process worker")
    started = time.monotonic()
    shards = workers - 1
    with tempfile.TemporaryDirectory(prefix="envlink-chaos-workers-") as tmp:
        procs = []
        for index in range(workers):
            kill = index == shards
            out = Path(tmp) / f"worker-{index}.json"
            args = [sys.executable, __file__, "--worker",
                    "--seed", str(seed), "--label", f"{label}-w{index}",
                    "--report", str(out),
                    "--episodes", str(0 if kill else episodes),
                    "--kill-episodes", str(kill_episodes if kill else 0),
                    "--fault-target", str(fault_target), "--calls", str(calls),
                    "--faults-per-episode", str(faults_per_episode),
                    "--kills-per-episode", str(kills_per_episode),
                    "--streams", "kill" if kill else "inprocess",
                    "--shard", "0/1" if kill else f"{index}/{shards}"]
            procs.append((subprocess.Popen(args, stdout=subprocess.DEVNULL,
                                           stderr=subprocess.DEVNULL), out))
        reports = []
        for proc, out in procs:
            code = proc.wait()
            if not out.exists():
                raise RuntimeError(f"chaos worker exited with {code} and wrote no report")
            reports.append(json.loads(out.read_text()))
    merged = merge_reports(reports, label=label, seed=seed,
                           seconds=time.monotonic() - started)
    path = report or Path(tempfile.gettempdir()) / "envlink-chaos" / (
        f"chaos-{label}-seed{seed}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(merged, indent=2) + "\n")
    return merged, path


def soak_shortfalls(report: dict[str, Any]) -> list[str]:
    """What a soak report misses of the targets."""
    short = [f"{kind}: {report['faults'][kind]} injected < {SOAK_FAULTS}"
             for kind in FAULT_KINDS if report["faults"][kind] < SOAK_FAULTS]
    if report["episodes"]["total"] < SOAK_EPISODES:
        short.append(f"episodes: {report['episodes']['total']} < {SOAK_EPISODES}")
    return short


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--soak", action="store_true", help="the soak's targets (>= 1,000 "
                   "episodes, >= 500 injected faults of every kind)")
    p.add_argument("--seed", type=int, default=int(os.environ.get("ENVLINK_CHAOS_SEED", 9)))
    p.add_argument("--workers", type=int,
                   default=int(os.environ.get("ENVLINK_CHAOS_WORKERS", 3)))
    p.add_argument("--episodes", type=int, default=36)
    p.add_argument("--kill-episodes", type=int, default=12)
    p.add_argument("--fault-target", type=int, default=0)
    p.add_argument("--calls", type=int, default=12)
    p.add_argument("--faults-per-episode", type=int, default=6)
    p.add_argument("--kills-per-episode", type=int, default=3)
    p.add_argument("--report", type=Path, default=None)
    p.add_argument("--label", default=None)
    # Internal: one worker's share.
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--streams", default="inprocess,kill", help=argparse.SUPPRESS)
    p.add_argument("--shard", default="0/1", help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    if args.worker:
        index, count = (int(x) for x in args.shard.split("/"))
        run = run_chaos(ChaosConfig(
            seed=args.seed, episodes=args.episodes, kill_episodes=args.kill_episodes,
            fault_target=args.fault_target, calls=args.calls,
            faults_per_episode=args.faults_per_episode,
            kills_per_episode=args.kills_per_episode, shard=(index, count),
            streams=tuple(args.streams.split(",")), report=args.report,
            label=args.label or "worker"))
        return 0 if not run.stats.violation_count and not run.stats.leaks else 1

    options: dict[str, Any] = {
        "seed": args.seed, "episodes": args.episodes, "kill_episodes": args.kill_episodes,
        "fault_target": args.fault_target, "calls": args.calls,
        "faults_per_episode": args.faults_per_episode,
        "kills_per_episode": args.kills_per_episode,
    }
    if args.soak:
        options.update(soak_config(args.seed))
    label = args.label or ("soak" if args.soak else "custom")
    report, path = run_workers(workers=args.workers, label=label, report=args.report,
                               **options)
    print(format_summary(report, path))
    failed = bool(report["violations"] or report["leaks"])
    if args.soak:
        for line in soak_shortfalls(report):
            print(f"  SHORT {line}")
            failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
