"""``envlink rollouts PATH``: a summary of recorded episodes, for a person.

Episodes (their parts joined) by outcome, the mean and spread of their return, steps, step latency
p50/p99, recovered steps and episodes per server; ``--json`` for machine output.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from typing import Any

from envlink._recording.rollouts import RolloutFiles, read_episodes, summarise

__all__ = ["DESCRIPTION", "add_arguments", "plural", "report_bad_lines", "rollouts_from_args"]

DESCRIPTION = ("Summarise recorded episodes: outcomes, return, steps, step latency, "
               "recoveries and servers.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``envlink rollouts``."""
    parser.add_argument("path", help="a rollout file, or a directory of *.jsonl files")
    parser.add_argument("--json", action="store_true", help="machine output")
    parser.add_argument("--export", metavar="OUT", default=None,
                        help="write the episodes as a table instead, to OUT: Parquet "
                             "(OUT.parquet, needs pyarrow) or JSON lines (OUT.jsonl); "
                             "observations, actions, reset kwargs and extra fields as JSON "
                             "text columns, so that any recording loads as one dataset")
    parser.add_argument("--per", choices=("episode", "step"), default="episode",
                        help="with --export: a row per episode (its parts joined; the "
                             "default) or per step")


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
    if args.export is not None:
        return _export(args, report)
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


def _export(args: argparse.Namespace, report: RolloutFiles) -> int:
    from envlink._recording.export import export, format_of

    episodes = 0

    def counted() -> Iterator[dict[str, Any]]:
        nonlocal episodes
        for episode in read_episodes(args.path, report):
            episodes += 1
            yield episode

    try:
        format_of(args.export)  # a wrong suffix is a usage error before anything is read
        count = export(counted(), args.export, per=args.per)
    except (OSError, ValueError, ImportError) as exc:
        sys.stderr.write(f"envlink rollouts: error: {exc}\n")
        return 2
    report_bad_lines("envlink rollouts", report)
    if not episodes and not report.incomplete:
        sys.stderr.write(f"envlink rollouts: error: no recorded episode in {args.path}\n")
        return 2
    done = {"exported": str(args.export), "rows": count, "per": args.per,
            "episodes": episodes, "files": len(report.files),
            "incomplete": len(report.incomplete), "skipped_lines": report.skipped}
    if args.json:
        sys.stdout.write(json.dumps(done) + "\n")
    else:
        left = (f"; {len(report.incomplete)} incomplete left out" if report.incomplete
                else "")
        sys.stdout.write(f"wrote {plural(count, args.per + ' row')} to {args.export} (from "
                         f"{plural(episodes, 'episode')} in "
                         f"{plural(len(report.files), 'file')}{left})\n")
    return 0


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000
