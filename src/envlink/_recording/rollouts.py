"""The rollout format: one JSON object per episode per line, read back and summarised.

What a line holds is documented in ``docs/recording.md`` and checked by
``docs/rollout.schema.json``. Readers skip a line that is not a whole JSON object
(the last line of a file whose process was killed mid-write), and count it.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "OUTCOMES",
    "SCHEMA",
    "RolloutFiles",
    "answer_of",
    "find_files",
    "read_episodes",
    "split_answer",
    "summarise",
]

#: The format's version, in every line's ``schema``.
SCHEMA = "envlink.rollout/1"

#: How a recorded episode ended: the environment said ``done``; the client began a
#: new episode (``reset``) or was closed (``close``) first; the session was lost.
OUTCOMES: tuple[str, ...] = ("done", "reset", "close", "lost")

#: The fields of an observation frame's ``data`` that a step keeps as its own.
_OWN = ("observation", "reward", "done")


def split_answer(data: Mapping[str, Any]) -> dict[str, Any]:
    """An answer's ``data`` as a record keeps it: ``observation``, ``reward``, ``done``,
    and the other fields (``metadata``...) under ``extra`` when there are any."""
    out = {"observation": data.get("observation"), "reward": data.get("reward"),
           "done": bool(data.get("done", False))}
    extra = {k: v for k, v in data.items() if k not in _OWN}
    if extra:
        out["extra"] = extra
    return out


def answer_of(record: Mapping[str, Any]) -> dict[str, Any]:
    """The answer a step or reset record stands for, in the form replay compares:
    ``observation``, ``reward``, ``done`` and the extra fields (what
    :func:`split_answer` kept), so that a recorded and a replayed answer compare alike."""
    out = {"observation": record.get("observation"), "reward": record.get("reward"),
           "done": bool(record.get("done", False))}
    extra = record.get("extra")
    if isinstance(extra, Mapping):
        out.update(extra)
    return out


def find_files(path: str | Path) -> list[Path]:
    """The rollout files at ``path``: the file itself, or a directory's ``*.jsonl``
    (recursively), sorted by name.

    Raises:
        FileNotFoundError: nothing at ``path``.
    """
    root = Path(path)
    if root.is_file():
        return [root]
    if root.is_dir():
        return sorted(p for p in root.rglob("*.jsonl") if p.is_file())
    raise FileNotFoundError(f"no such file or directory: {path}")


@dataclass
class RolloutFiles:
    """What reading some rollout files found besides the episodes.

    Attributes:
        files: the files read.
        skipped: lines that were not a whole JSON object (a partial last line).
    """

    files: list[Path] = field(default_factory=list)
    skipped: int = 0


def read_episodes(path: str | Path, report: RolloutFiles | None = None
                  ) -> Iterator[dict[str, Any]]:
    """Every episode recorded at ``path`` (a file or a directory), in file order.

    A line that is not a whole JSON object (a process killed mid-write) is skipped
    and counted in ``report.skipped``.
    """
    files = find_files(path)
    if report is not None:
        report.files.extend(files)
    for file in files:
        with file.open("rb") as stream:
            for line in stream:
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except ValueError:
                    record = None
                if not isinstance(record, dict) or not line.endswith(b"\n"):
                    if report is not None:
                        report.skipped += 1
                    continue
                yield record


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    rank = max(0, math.ceil(q * len(ordered)) - 1)
    return ordered[rank]


def summarise(episodes: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """A summary for a person: episodes by outcome, return (mean, spread), steps,
    step latency p50/p99, recovered steps and episodes per server."""
    outcomes: Counter[str] = Counter()
    servers: Counter[str] = Counter()
    returns: list[float] = []
    latencies: list[float] = []
    steps = recoveries = retries = unknown = count = 0
    for ep in episodes:
        count += 1
        outcomes[str(ep.get("outcome"))] += 1
        servers[str(ep.get("server"))] += 1
        value = ep.get("return")
        if isinstance(value, (int, float)):
            returns.append(float(value))
        for step in ep.get("steps") or ():
            steps += 1
            latency = step.get("latency")
            if isinstance(latency, (int, float)):
                latencies.append(float(latency))
            if step.get("recovered"):
                recoveries += 1
            retries += int(step.get("retries") or 0)
        unknown += len(ep.get("unknown_steps") or ())
    mean = sum(returns) / len(returns) if returns else None
    spread = (math.sqrt(sum((r - mean) ** 2 for r in returns) / len(returns))
              if returns and mean is not None else None)
    return {
        "episodes": count,
        "outcomes": dict(sorted(outcomes.items())),
        "return": {"mean": mean, "std": spread,
                   "min": min(returns) if returns else None,
                   "max": max(returns) if returns else None},
        "steps": steps,
        "steps_per_episode": steps / count if count else None,
        "latency": {"p50": _percentile(latencies, 0.5), "p99": _percentile(latencies, 0.99)},
        "recovered_steps": recoveries,
        "retries": retries,
        "unknown_steps": unknown,
        "servers": dict(sorted(servers.items())),
    }
