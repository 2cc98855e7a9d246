"""The chaos suite's recording check finds each way a recording can be wrong."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envlink.server import DeterministicEnvironment

from ._oracle import MAX_STEPS, Call, project
from ._recordings import check_recording

SEED = 5


@dataclass
class _Seg:
    seed: int
    calls: list[Call] = field(default_factory=list)


def _caller() -> tuple[_Seg, dict[str, Any]]:
    """A segment (reset, step 2 answered, step 4 raised, step 8 answered) and the
    recording that matches it."""
    env = DeterministicEnvironment()
    reset = env.reset(seed=SEED, max_steps=MAX_STEPS).to_wire()
    seg = _Seg(SEED, [Call(0, "reset", SEED, None, 1.0, 0, 0, ok=True,
                           answer=project(reset))])
    steps = []
    for index, (move, ok) in enumerate(((2, True), (4, False), (8, True)), 1):
        call = Call(index, "step", SEED, move, 1.0, 0, 0, ok=ok)
        if ok:
            data = env.step({"move": move}).to_wire()
            call.answer = project(data)
            steps.append({"index": len(steps), "action": {"move": move},
                          "observation": data["observation"], "reward": data["reward"],
                          "done": data["done"], "start": 0.0, "latency": 0.0, "retries": 0,
                          "recovered": False})
        else:
            call.error = "OutcomeUnknownError"
        seg.calls.append(call)
    record = {"schema": "envlink.rollout/1", "episode_id": "e", "server": "ws://x/ws",
              "session_id": "s", "reset": {"kwargs": {"seed": SEED, "max_steps": MAX_STEPS},
                                           "observation": reset["observation"],
                                           "reward": reset["reward"], "done": False},
              "steps": steps, "unknown_steps": [{"action": {"move": 4}, "after": 1}],
              "outcome": "close", "return": 0.0, "start": 0.0, "end": 0.0,
              "truncated": False, "envlink": "0", "pid": 1}
    return seg, record


def _check(tmp_path: Path, seg: _Seg, *records: Any, tail: str = "") -> list[str]:
    (tmp_path / "r.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in records) + tail, encoding="utf-8")
    violations, _ = check_recording(tmp_path, [seg], sequential=True, what="t")
    return violations


def test_a_recording_of_what_the_caller_got_passes(tmp_path: Path) -> None:
    seg, record = _caller()
    assert _check(tmp_path, seg, record) == []


def test_each_defect_is_a_violation(tmp_path: Path) -> None:
    seg, record = _caller()
    (twice,) = _check(tmp_path, seg, record, record)
    assert "recorded more than once: episode e part 1 at r.jsonl:1 and again at r.jsonl:2" \
        in twice
    again = dict(record, session_id="s2")  # the same episode from another session
    (twice,) = _check(tmp_path, seg, record, again)
    assert "2 recorded episodes" in twice
    (missing,) = _check(tmp_path, seg)
    assert "0 recorded episodes" in missing
    applied = json.loads(json.dumps(record))
    applied["steps"].insert(1, dict(applied["steps"][0], action={"move": 4}))
    for i, step in enumerate(applied["steps"]):
        step["index"] = i
    found = _check(tmp_path, seg, applied)
    assert any("steps [4] recorded as applied although their calls raised" in v
               for v in found), found
    swapped = json.loads(json.dumps(record))
    swapped["steps"].reverse()
    assert any("are not the steps the caller was answered" in v
               for v in _check(tmp_path, seg, swapped))
    changed = json.loads(json.dumps(record))
    changed["steps"][1]["observation"]["draw"] += 1
    assert any("first at position 1" in v for v in _check(tmp_path, seg, changed))
    known = json.loads(json.dumps(record))
    known["unknown_steps"] = [{"action": {"move": 8}, "after": 1}]
    assert any("answered steps [8] listed as of unknown outcome" in v
               for v in _check(tmp_path, seg, known))
    assert any("broken line" in v for v in _check(tmp_path, seg, record, tail='{"sch'))
    stranger = dict(record, episode_id="f", reset=dict(record["reset"], kwargs={"seed": 99}))
    assert any("reset seed 99, which no reset of the caller began" in v
               for v in _check(tmp_path, seg, record, stranger))


def test_parts_are_joined_and_a_missing_last_part_is_a_violation(tmp_path: Path) -> None:
    seg, record = _caller()
    first = dict(record, part=1, steps=record["steps"][:1], unknown_steps=[],
                 outcome="continued")
    second = dict(record, part=2, reset=None, steps=record["steps"][1:])
    assert _check(tmp_path, seg, second, first) == []
    found = _check(tmp_path, seg, first)
    assert any("parts [1] (last continued) is incomplete" in v for v in found), found
