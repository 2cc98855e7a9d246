"""The recording check of the chaos suite: what the recorder wrote, against the caller.

Every chaos client runs with a :class:`~envlink.RolloutRecorder`; after each phase
the files are read back (by a reader of the documented format of its own here, parts
joined; not envlink's, which is under test too) and compared with the calls the
caller made (:class:`_oracle.Call`, one segment per reset seed):

- every line whole (no partial, malformed or foreign line, no incomplete episode);
- every episode once: one record for each segment whose reset the caller got, none
  for a reset that failed, none of a seed no caller's reset began;
- the reset's answer as the caller got it;
- every applied step once and in order, equal to what the caller got: the recorded
  steps are exactly the steps the caller was answered, in the order they were
  applied (for calls made one after another, the order they were made), each with
  the answer the caller received, indexed 0, 1, 2...;
- a step whose call raised is never recorded as applied, and a step the caller was
  answered is never listed among ``unknown_steps``;
- the outcome is one of the format's, never ``done`` (chaos episodes never end).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ._oracle import Call, project

__all__ = ["RecordingCounts", "check_recording"]


class _Segment(Protocol):
    seed: int
    calls: list[Call]


@dataclass
class RecordingCounts:
    """What the recording checks covered (summed over a run)."""

    counts: Counter[str] = field(default_factory=Counter)

    def add(self, other: Counter[str]) -> None:
        self.counts.update(other)

    def to_dict(self) -> dict[str, int]:
        keys = ("phases", "files", "episodes", "steps", "unknown_steps", "broken_lines",
                "incomplete")
        return {k: self.counts[k] for k in keys}


#: The outcomes the format allows an episode (``continued`` only ends a part).
OUTCOMES = ("done", "reset", "close", "lost")


@dataclass
class _Read:
    files: int = 0
    broken: list[str] = field(default_factory=list)
    incomplete: list[str] = field(default_factory=list)
    repeated: list[str] = field(default_factory=list)


def _lines(directory: Path, read: _Read) -> Iterator[tuple[str, dict[str, Any]]]:
    for path in sorted(directory.rglob("*.jsonl")):
        read.files += 1
        with path.open("rb") as stream:
            for number, line in enumerate(stream, 1):
                where = f"{path.name}:{number}"
                try:
                    record = json.loads(line)
                except ValueError:
                    record = None
                if not line.endswith(b"\n") or not isinstance(record, dict) \
                        or record.get("schema") != "envlink.rollout/1":
                    read.broken.append(where)
                    continue
                yield where, record


def read_recording(directory: Path, read: _Read) -> list[dict[str, Any]]:
    """The episodes in ``directory``, a long one's parts joined (docs/recording.md):
    parts share ``episode_id``, ``session_id``, ``pid`` and ``start``, are numbered from
    1, all but the last with outcome ``continued``; the reset is part 1's, the steps and
    unknown steps every part's in order, the outcome and return the last part's."""
    parts: dict[tuple[Any, ...], list[tuple[int, str, dict[str, Any]]]] = {}
    for where, record in _lines(directory, read):
        key = (record.get("episode_id"), record.get("session_id"), record.get("pid"),
               record.get("start"))
        parts.setdefault(key, []).append((int(record.get("part", 1)), where, record))
    episodes = []
    for key, all_parts in parts.items():
        all_parts.sort(key=lambda p: p[0])
        found = []
        for number, where, record in all_parts:
            if found and found[-1][0] == number:
                read.repeated.append(f"episode {key[0]} part {number} at {found[-1][1]} "
                                     f"and again at {where}")
            else:
                found.append((number, where, record))
        numbers = [n for n, _, _ in found]
        last = found[-1][2]
        if numbers != list(range(1, len(found) + 1)) or last.get("outcome") == "continued":
            read.incomplete.append(f"episode {key[0]}: parts {numbers} "
                                   f"(last {last.get('outcome')})")
            continue
        episode = dict(last, reset=found[0][2].get("reset"), where=found[0][1],
                       steps=[s for _, _, r in found for s in r.get("steps") or ()],
                       unknown_steps=[u for _, _, r in found
                                      for u in r.get("unknown_steps") or ()])
        episodes.append(episode)
    return episodes


def _answer(record: dict[str, Any]) -> dict[str, Any]:
    return project({"observation": record.get("observation"), "reward": record.get("reward"),
                    "done": record.get("done")})


def _move(action: Any) -> Any:
    return action.get("move") if isinstance(action, dict) else action


def check_recording(directory: Path, segments: Sequence[_Segment], *, sequential: bool,
                    what: str, optional: frozenset[int] = frozenset()
                    ) -> tuple[list[str], Counter[str]]:
    """The violations of the recording in ``directory`` against the caller's
    ``segments``, and what was checked.

    ``optional``: seeds of episodes that may be missing (left open at a process's end,
    or dropped by a full disk; the caller checks why); when present, checked alike.
    """
    read = _Read()
    episodes = read_recording(directory, read) if directory.exists() else []
    counts: Counter[str] = Counter(phases=1, files=read.files, episodes=len(episodes),
                                   broken_lines=len(read.broken),
                                   incomplete=len(read.incomplete))
    v = [f"{what}: recording has a broken line: {bad}" for bad in read.broken]
    v += [f"{what}: recorded {text} is incomplete" for text in read.incomplete]
    v += [f"{what}: recorded more than once: {text}" for text in read.repeated]
    by_seed: dict[Any, list[dict[str, Any]]] = {}
    for episode in episodes:
        seed = ((episode.get("reset") or {}).get("kwargs") or {}).get("seed")
        by_seed.setdefault(seed, []).append(episode)
        counts["steps"] += len(episode.get("steps") or ())
        counts["unknown_steps"] += len(episode.get("unknown_steps") or ())
    known = {seg.seed for seg in segments}
    for seed in by_seed:
        if seed not in known:
            v.append(f"{what}: recorded an episode of reset seed {seed}, which no reset of "
                     "the caller began")
    for seg in segments:
        found = by_seed.get(seg.seed, [])
        if seg.seed in optional and not found:
            counts["missing_optional"] += 1
            continue
        v += _check_segment(seg, found, sequential=sequential, what=f"{what} seed {seg.seed}")
    return v, counts


def _check_segment(seg: _Segment, recorded: list[dict[str, Any]], *, sequential: bool,
                   what: str) -> list[str]:
    resets = [c for c in seg.calls if c.method == "reset"]
    began = any(c.ok for c in resets)
    if len(recorded) != (1 if began else 0):
        told = "answered" if began else "failed"
        return [f"{what}: {len(recorded)} recorded episodes for a reset the caller was "
                f"{told} ({[e.get('where') for e in recorded]})"]
    if not recorded:
        return []
    episode = recorded[0]
    v: list[str] = []
    reset_call = next(c for c in resets if c.ok)
    if _answer(episode.get("reset") or {}) != reset_call.answer:
        v.append(f"{what}: recorded reset answer {_answer(episode.get('reset') or {})} is not "
                 f"the caller's {reset_call.answer}")
    answered = [c for c in seg.calls if c.method == "step" and c.ok and c.answer is not None]
    if not sequential:  # concurrent calls: the order the server applied them
        answered.sort(key=lambda c: c.answer["step"])  # type: ignore[index]
    want = [(c.move, c.answer) for c in answered]
    steps = list(episode.get("steps") or ())
    got = [(_move(s.get("action")), _answer(s)) for s in steps]
    if got != want:
        v.append(f"{what}: recorded steps {[m for m, _ in got]} are not the steps the caller "
                 f"was answered, in order, with their answers {[m for m, _ in want]}"
                 + _first_difference(got, want))
    if [s.get("index") for s in steps] != list(range(len(steps))):
        v.append(f"{what}: recorded step indexes {[s.get('index') for s in steps]}")
    failed = {c.move for c in seg.calls if c.method == "step" and not c.ok}
    wrongly = failed & {m for m, _ in got}
    if wrongly:
        v.append(f"{what}: steps {sorted(wrongly)} recorded as applied although their calls "
                 "raised")
    unknown = {_move(u.get("action")) for u in episode.get("unknown_steps") or ()}
    answered_moves = {c.move for c in answered}
    if unknown & answered_moves:
        v.append(f"{what}: answered steps {sorted(unknown & answered_moves)} listed as of "
                 "unknown outcome")
    outcome = episode.get("outcome")
    if outcome not in OUTCOMES or outcome == "done":
        v.append(f"{what}: recorded outcome {outcome!r}")
    return v


def _first_difference(got: list[tuple[Any, Any]], want: list[tuple[Any, Any]]) -> str:
    for i, (a, b) in enumerate(zip(got, want, strict=False)):
        if a != b:
            return f"; first at position {i}: recorded {a}, caller {b}"
    return f"; {len(got)} recorded, {len(want)} answered"
