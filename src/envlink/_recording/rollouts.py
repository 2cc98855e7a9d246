"""The rollout format: one JSON object per episode (or part of a long one) per line,
read back, its parts joined, and summarised.

What a line holds is documented in ``docs/recording.md`` and checked by
``docs/rollout.schema.json``. Readers skip a line that is not a whole
``envlink.rollout`` record (the last line of a file whose process was killed
mid-write, a foreign line) and name it by file and line number.
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
    "CONTINUED",
    "OUTCOMES",
    "SCHEMA",
    "BadLine",
    "RolloutFiles",
    "answer_of",
    "episode_key",
    "find_files",
    "join_parts",
    "read_episodes",
    "read_records",
    "split_answer",
    "summarise",
]

#: The format's version, in every line's ``schema``.
SCHEMA = "envlink.rollout/1"

#: How a recorded episode ended: the environment said ``done``; the client began a
#: new episode (``reset``) or was closed (``close``) first; the session was lost.
OUTCOMES: tuple[str, ...] = ("done", "reset", "close", "lost")

#: The outcome of every part of a long episode but its last.
CONTINUED = "continued"

_FAMILY = "envlink.rollout/"

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


@dataclass(frozen=True)
class BadLine:
    """A line that is not an episode record: where it is and why.

    Attributes:
        file: the file.
        line: its line number (1-based).
        reason: what is wrong with it.
    """

    file: Path
    line: int
    reason: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.reason}"


@dataclass
class RolloutFiles:
    """What reading some rollout files found besides the episodes.

    Attributes:
        files: the files read.
        bad_lines: the lines skipped (not a whole JSON object, not an
            ``envlink.rollout`` record, a part repeated), each with its file and line
            number; a process killed mid-write leaves a partial last line.
        incomplete: episodes whose final part is missing (their parts so far joined,
            with ``incomplete: true``), in the order of their first part.
    """

    files: list[Path] = field(default_factory=list)
    bad_lines: list[BadLine] = field(default_factory=list)
    incomplete: list[dict[str, Any]] = field(default_factory=list)

    @property
    def skipped(self) -> int:
        """How many lines were skipped."""
        return len(self.bad_lines)


def _problem(record: Any) -> str | None:
    """Why a parsed line is not an episode record, or ``None`` when it is one."""
    if not isinstance(record, dict):
        return "not a JSON object"
    schema = record.get("schema")
    if not isinstance(schema, str) or not schema.startswith(_FAMILY):
        return "not an envlink.rollout record (no \"schema\": \"envlink.rollout/1\")"
    if schema != SCHEMA:
        return f"a record of another version ({schema!r}; this envlink reads {SCHEMA})"
    part = record.get("part", 1)
    if isinstance(part, bool) or not isinstance(part, int) or part < 1:
        return f"its part is not a positive integer: {part!r}"
    for name, kinds in (("episode_id", (str, type(None))), ("session_id", (str, type(None))),
                        ("pid", (int, type(None))), ("start", (int, float, type(None)))):
        if not isinstance(record.get(name), kinds):
            return f"its {name} is not a {' or '.join(k.__name__ for k in kinds)}"
    if not isinstance(record.get("steps"), list) or not all(
            isinstance(s, dict) and "action" in s for s in record["steps"]):
        return "its steps are not a list of objects with an action"
    reset = record.get("reset")
    if part == 1 and not isinstance(reset, dict):
        return "part 1 has no reset object"
    if isinstance(reset, dict) and not isinstance(reset.get("kwargs", {}), dict):
        return "its reset kwargs are not an object"
    if not isinstance(record.get("outcome"), str):
        return "it has no outcome"
    if not isinstance(record.get("unknown_steps", []), list):
        return "its unknown_steps are not a list"
    return None


def read_records(path: str | Path, report: RolloutFiles | None = None
                 ) -> Iterator[tuple[Path, int, dict[str, Any]]]:
    """Every record (one line: an episode, or a part of one) at ``path``, with its
    file and line number, in file order.

    A line that is not a whole ``envlink.rollout`` record is skipped and listed in
    ``report.bad_lines`` with its file, line number and reason.
    """
    files = find_files(path)
    if report is not None:
        report.files.extend(files)
    for file in files:
        with file.open("rb") as stream:
            for number, line in enumerate(stream, 1):
                if not line.strip():
                    continue
                reason: str | None
                try:
                    record: Any = json.loads(line)
                except ValueError:
                    reason = ("a partial last line (the process was stopped mid-write)"
                              if not line.endswith(b"\n") else "not JSON")
                else:
                    reason = _problem(record)
                    if reason is None and not line.endswith(b"\n"):
                        reason = "a partial last line (the process was stopped mid-write)"
                if reason is not None:
                    if report is not None:
                        report.bad_lines.append(BadLine(file, number, reason))
                    continue
                yield file, number, record


def episode_key(record: Mapping[str, Any]) -> tuple[Any, ...]:
    """What the parts of one episode share: ``episode_id``, ``session_id``, ``pid``
    and ``start``."""
    return (record.get("episode_id"), record.get("session_id"), record.get("pid"),
            record.get("start"))


def join_parts(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One episode from its parts in order (part 1 first): part 1's reset, every
    part's steps and unknown steps in order, and the last part's outcome, return and
    end. ``parts`` is how many lines it came from."""
    if len(parts) == 1:
        episode = dict(parts[0])
        episode.setdefault("part", 1)
        episode["parts"] = 1
        return episode
    first, last = parts[0], parts[-1]
    episode = dict(last)
    episode["reset"] = first.get("reset")
    episode["steps"] = [s for p in parts for s in p.get("steps") or ()]
    episode["unknown_steps"] = [u for p in parts for u in p.get("unknown_steps") or ()]
    episode["truncated"] = any(p.get("truncated") for p in parts)
    episode["redacted"] = any(p.get("redacted") for p in parts)
    episode["parts"] = len(parts)
    return episode


def read_episodes(path: str | Path, report: RolloutFiles | None = None
                  ) -> Iterator[dict[str, Any]]:
    """Every episode recorded at ``path`` (a file or a directory), its parts joined.

    An episode is yielded when its final part (an outcome other than
    ``continued``) has been read with every part before it; each carries ``where``
    (``FILE#LINE`` of its first part) and ``parts``. An episode whose final part is
    missing is not yielded: it goes to ``report.incomplete``. A line that is not a
    whole record, or a part read twice, goes to ``report.bad_lines``.
    """
    report = RolloutFiles() if report is None else report
    pending: dict[tuple[Any, ...], dict[int, tuple[str, dict[str, Any]]]] = {}
    order: dict[tuple[Any, ...], int] = {}
    for file, number, record in read_records(path, report):
        part = int(record.get("part", 1))
        where = f"{file.name}#{number}"
        if part == 1 and record["outcome"] != CONTINUED:
            episode = join_parts([record])
            episode["where"] = where
            yield episode
            continue
        key = episode_key(record)
        parts = pending.setdefault(key, {})
        order.setdefault(key, len(order))
        if part in parts:
            report.bad_lines.append(BadLine(
                file, number, f"part {part} of episode {record.get('episode_id')} "
                              f"again (first at {parts[part][0]})"))
            continue
        parts[part] = (where, record)
        final = [n for n, (_, r) in parts.items() if r["outcome"] != CONTINUED]
        if final and all(n in parts for n in range(1, min(final) + 1)):
            del pending[key]
            episode = join_parts([parts[n][1] for n in range(1, min(final) + 1)])
            episode["where"] = parts[1][0]
            yield episode
    for key in sorted(pending, key=order.__getitem__):
        parts = pending[key]
        have = [parts[n][1] for n in sorted(parts)]
        episode = join_parts(have)
        episode["where"] = parts[min(parts)][0]
        episode["incomplete"] = True
        numbers = sorted(parts)
        missing = [n for n in range(1, numbers[-1] + 1) if n not in parts]
        episode["missing"] = (f"parts {', '.join(map(str, missing))} missing" if missing
                              else "final part missing")
        report.incomplete.append(episode)


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
