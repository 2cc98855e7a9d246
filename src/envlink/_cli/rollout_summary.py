"""``envlink rollouts PATH``: a summary of recorded episodes, for a person.

Episodes by outcome, the mean and spread of their return, steps, step latency
p50/p99, recovered steps and episodes per server; ``--json`` for machine output.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from envlink._recording.rollouts import RolloutFiles, read_episodes, summarise

__all__ = ["DESCRIPTION", "add_arguments", "rollouts_from_args"]

DESCRIPTION = ("Summarise recorded episodes: outcomes, return, steps, step latency, "
               "recoveries and servers.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``envlink rollouts``."""
    parser.add_argument("path", help="a rollout file, or a directory of *.jsonl files")
    parser.add_argument("--json", action="store_true", help="machine output")


def _num(value: Any, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def rollouts_from_args(args: argparse.Namespace, _parser: argparse.ArgumentParser) -> int:
    """Run ``envlink rollouts`` with parsed arguments; the exit status."""
    report = RolloutFiles()
    try:
        summary = summarise(read_episodes(args.path, report))
    except FileNotFoundError as exc:
        sys.stderr.write(f"envlink rollouts: error: {exc}\n")
        return 2
    summary["files"] = len(report.files)
    summary["partial_lines"] = report.skipped
    if args.json:
        sys.stdout.write(json.dumps(summary) + "\n")
        return 0
    ret, latency = summary["return"], summary["latency"]
    outcomes = ", ".join(f"{k} {v}" for k, v in summary["outcomes"].items()) or "none"
    lines = [
        f"{summary['episodes']} episodes in {summary['files']} files"
        + (f" ({report.skipped} partial lines skipped)" if report.skipped else ""),
        f"  outcomes:  {outcomes}",
        f"  return:    mean {_num(ret['mean'])}, std {_num(ret['std'])}, "
        f"min {_num(ret['min'])}, max {_num(ret['max'])}",
        f"  steps:     {summary['steps']} ({_num(summary['steps_per_episode'], 1)} per episode)",
        f"  latency:   p50 {_num(_ms(latency['p50']), 2)} ms, "
        f"p99 {_num(_ms(latency['p99']), 2)} ms",
        f"  recovered: {summary['recovered_steps']} steps, {summary['retries']} retries, "
        f"{summary['unknown_steps']} steps of unknown outcome",
        "  servers:",
        *(f"    {server}: {count} episodes" for server, count in summary["servers"].items()),
    ]
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000
