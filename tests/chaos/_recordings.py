"""The recording check of the chaos suite: what the recorder wrote, against the caller.

Every chaos client runs with a :class:`~envlink.RolloutRecorder`; after each phase
the files are read back (``envlink rollouts``' reader, parts joined) and compared
with the calls the caller made (:class:`_oracle.Call`, one segment per reset seed):

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

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from envlink._recording.rollouts import OUTCOMES, RolloutFiles, read_episodes

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
    report = RolloutFiles()
    episodes = list(read_episodes(directory, report)) if directory.exists() else []
    counts: Counter[str] = Counter(phases=1, files=len(report.files), episodes=len(episodes),
                                   broken_lines=len(report.bad_lines),
                                   incomplete=len(report.incomplete))
    v = [f"{what}: recording has a broken line: {bad}" for bad in report.bad_lines]
    v += [f"{what}: recorded episode {e.get('episode_id')} is incomplete ({e.get('missing')})"
          for e in report.incomplete]
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
