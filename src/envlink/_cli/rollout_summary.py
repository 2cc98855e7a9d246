"""``envlink rollouts PATH``: a summary of recorded episodes, for a person.

Episodes (their parts joined) by outcome, the mean and spread of their return, steps, step latency
p50/p99, recovered steps and episodes per server; ``--json`` for machine output.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from envlink._recording.rollouts import RolloutFiles, read_episodes, summarise

__all__ = ["DESCRIPTION", "add_arguments", "plural", "report_bad_lines", "rollouts_from_args"]

DESCRIPTION = ("Summarise recorded episodes: outcomes, return, steps, step latency, "
               "recoveries and servers.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``envlink rollouts``."""
    parser.add_argument("path", help="a rollout file, or a directory of *.jsonl files")
    parser.add_argument("--json", action="store_true", help="machine output")


def plural(count: int, word: str) -> str:
    """``1 episode``, ``2 episodes``."""
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


#: How many skipped lines are named one by one before the rest are counted.
_NAMED_LINES = 20


def report_bad_lines(command: str, report: RolloutFiles) -> None:
    """Name each skipped line on stderr by file and line number (the first 20)."""
    for bad in report.bad_lines[:_NAMED_LINES]:
        sys.stderr.write(f"{command}: skipped {bad}\n")
    if len(report.bad_lines) > _NAMED_LINES:
        sys.stderr.write(f"{command}: ... and {len(report.bad_lines) - _NAMED_LINES} more "
                         "lines skipped\n")


def _num(value: Any, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def rollouts_from_args(args: argparse.Namespace, _parser: argparse.ArgumentParser) -> int:
    """Run ``envlink rollouts`` with parsed arguments; the exit status."""
    report = RolloutFiles()
    try:
        summary = summarise(read_episodes(args.path, report))
    except OSError as exc:
        sys.stderr.write(f"envlink rollouts: error: {exc}\n")
        return 2
    report_bad_lines("envlink rollouts", report)
    if not summary["episodes"] and not report.incomplete:
        sys.stderr.write(f"envlink rollouts: error: no recorded episode in {args.path}\n")
        return 2
    summary["files"] = len(report.files)
    summary["skipped_lines"] = report.skipped
    summary["incomplete"] = len(report.incomplete)
    if args.json:
        sys.stdout.write(json.dumps(summary) + "\n")
        return 0
    ret, latency = summary["return"], summary["latency"]
    outcomes = ", ".join(f"{k} {v}" for k, v in summary["outcomes"].items()) or "none"
    notes = []
    if report.incomplete:
        notes.append(f"{len(report.incomplete)} incomplete (final part missing)")
    if report.skipped:
        notes.append(f"{plural(report.skipped, 'line')} skipped")
    lines = [
        f"{plural(summary['episodes'], 'episode')} in {plural(summary['files'], 'file')}"
        + (f" ({'; '.join(notes)})" if notes else ""),
        f"  outcomes:  {outcomes}",
        f"  return:    mean {_num(ret['mean'])}, std {_num(ret['std'])}, "
        f"min {_num(ret['min'])}, max {_num(ret['max'])}",
        f"  steps:     {summary['steps']} ({_num(summary['steps_per_episode'], 1)} per episode)",
        f"  latency:   p50 {_num(_ms(latency['p50']), 2)} ms, "
        f"p99 {_num(_ms(latency['p99']), 2)} ms",
        f"  recovered: {plural(summary['recovered_steps'], 'step')}, "
        f"{plural(summary['retries'], 'retry').replace('retrys', 'retries')}, "
        f"{plural(summary['unknown_steps'], 'step')} of unknown outcome",
        "  servers:",
        *(f"    {server}: {plural(count, 'episode')}"
          for server, count in summary["servers"].items()),
    ]
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000
