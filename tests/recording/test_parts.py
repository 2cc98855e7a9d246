"""Long episodes written in parts: envlink rollouts and envlink replay join them.

The part files are written by hand here, from a real recording split the way the
format says (docs/recording.md, "Long episodes in parts"): each part a line of the
same episode_id, session_id, pid and start; part numbers from 1; every part but the
last with outcome "continued"; the reset in part 1 only; steps keeping their
episode-wide index; each part's return the episode's return so far.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from envlink import GenericEnvClient, RolloutRecorder
from envlink._cli.main import main
from envlink._recording.rollouts import RolloutFiles, read_episodes
from envlink.server import ServerThread

from .conftest import SCHEMA, load

pytestmark = pytest.mark.timeout(60)


def split(record: dict[str, Any], cuts: list[int]) -> list[dict[str, Any]]:
    """``record`` as parts, cut before each step index in ``cuts``."""
    steps = record["steps"]
    bounds = [0, *cuts, len(steps)]
    parts = []
    total = 0.0
    for number, (lo, hi) in enumerate(itertools.pairwise(bounds), 1):
        total += sum(s["reward"] for s in steps[lo:hi])
        last = hi == len(steps)
        part = dict(record, part=number, steps=steps[lo:hi],
                    reset=record["reset"] if number == 1 else None,
                    outcome=record["outcome"] if last else "continued",
                    unknown_steps=record["unknown_steps"] if last else [])
        part["return"] = record["return"] if last else total
        jsonschema.validate(part, SCHEMA)
        parts.append(part)
    return parts


def lines(records: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """Two real episodes of 5 steps each (seeds 7 and 8)."""
    directory = tmp_path_factory.mktemp("recorded")
    with ServerThread(env="deterministic", ping_interval=None) as st, \
            RolloutRecorder(directory) as recorder, \
            GenericEnvClient(st.url, recorder=recorder).sync() as env:
        for seed in (7, 8):
            env.reset(seed=seed, max_steps=5)
            for move in (1, 2, 3, 4, 5):
                env.step({"move": move})
    return load(directory)


def test_parts_across_files_are_joined_into_one_episode(
        tmp_path: Path, recorded: list[dict[str, Any]],
        capsys: pytest.CaptureFixture[str]) -> None:
    long, short = recorded
    one, two, three = split(long, [2, 4])
    # Part 1 and the short episode in one file, parts 2 and 3 in the next (rotation).
    (tmp_path / "a-0001.jsonl").write_text(lines([one, short]), encoding="utf-8")
    (tmp_path / "a-0002.jsonl").write_text(lines([two, three]), encoding="utf-8")

    report = RolloutFiles()
    episodes = list(read_episodes(tmp_path, report))
    assert report.bad_lines == [] and report.incomplete == []
    assert [(e["episode_id"], e["parts"]) for e in episodes] == [
        (short["episode_id"], 1), (long["episode_id"], 3)]
    joined = episodes[1]
    assert [s["index"] for s in joined["steps"]] == [0, 1, 2, 3, 4]
    assert joined["steps"] == long["steps"] and joined["reset"] == long["reset"]
    assert (joined["outcome"], joined["return"]) == (long["outcome"], long["return"])
    assert joined["where"] == "a-0001.jsonl#1"

    assert main(["rollouts", str(tmp_path), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["episodes"], summary["steps"], summary["incomplete"]) == (2, 10, 0)
    assert summary["outcomes"] == {"done": 2}
    assert summary["return"]["mean"] == pytest.approx((long["return"] + short["return"]) / 2)


def test_an_episode_without_its_final_part_is_incomplete(
        tmp_path: Path, recorded: list[dict[str, Any]],
        capsys: pytest.CaptureFixture[str]) -> None:
    long, short = recorded
    one, two, _three = split(long, [2, 4])
    (tmp_path / "a.jsonl").write_text(lines([one, two, short]), encoding="utf-8")
    assert main(["rollouts", str(tmp_path), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["episodes"], summary["steps"], summary["incomplete"]) == (1, 5, 1)
    assert main(["rollouts", str(tmp_path)]) == 0
    assert "1 episode in 1 file (1 incomplete (final part missing))" in capsys.readouterr().out

    # A middle part missing: incomplete as well, and named.
    (tmp_path / "a.jsonl").write_text(lines([one, _three]), encoding="utf-8")
    report = RolloutFiles()
    assert list(read_episodes(tmp_path, report)) == []
    (incomplete,) = report.incomplete
    assert incomplete["missing"] == "parts 2 missing"


def test_a_part_read_twice_is_a_bad_line(tmp_path: Path,
                                         recorded: list[dict[str, Any]]) -> None:
    one, two = split(recorded[0], [3])
    (tmp_path / "a.jsonl").write_text(lines([one, one, two]), encoding="utf-8")
    report = RolloutFiles()
    (episode,) = read_episodes(tmp_path, report)
    assert len(episode["steps"]) == 5
    (bad,) = report.bad_lines
    assert bad.line == 2 and "part 1 of episode" in bad.reason


def test_replay_joins_the_parts(tmp_path: Path, recorded: list[dict[str, Any]],
                                capsys: pytest.CaptureFixture[str]) -> None:
    long, short = recorded
    one, two, three = split(long, [1, 3])
    (tmp_path / "a.jsonl").write_text(lines([one, short, two, three]), encoding="utf-8")
    with ServerThread(env="deterministic", ping_interval=None) as st:
        assert main(["replay", str(tmp_path), "--url", st.url]) == 0
        out = capsys.readouterr().out
        assert out.count("reproduced (5 steps)") == 2

        two["steps"][1]["observation"]["position"] += 1  # step 2, in part 2
        (tmp_path / "a.jsonl").write_text(lines([one, two, three]), encoding="utf-8")
        assert main(["replay", str(tmp_path), "--url", st.url]) == 1
        assert f"episode {long['episode_id']} (a.jsonl#1): differs at step 2" in (
            capsys.readouterr().out)

        (tmp_path / "a.jsonl").write_text(lines([one, two]), encoding="utf-8")
        assert main(["replay", str(tmp_path), "--url", st.url]) == 0
        out = capsys.readouterr().out
        assert "incomplete (final part missing), not replayed" in out
        assert "1 episode: 0 reproduced, 0 differ, 1 incomplete" in out


def test_the_recorders_own_parts_are_joined_and_replayed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Parts as the recorder writes them (part_steps=2): one episode to rollouts, replay
    and the export, its return the last part's."""
    with ServerThread(env="deterministic", ping_interval=None) as st:
        with RolloutRecorder(tmp_path / "rec", part_steps=2) as recorder, \
                GenericEnvClient(st.url, recorder=recorder).sync() as env:
            env.reset(seed=4, max_steps=5)
            rewards = [env.step({"move": m}).reward for m in (1, 2, 3, 4, 5)]
        lines = load(tmp_path / "rec")
        assert [r.get("part", 1) for r in lines] == [1, 2, 3]
        assert main(["rollouts", str(tmp_path / "rec"), "--json"]) == 0
        summary = json.loads(capsys.readouterr().out)
        assert (summary["episodes"], summary["steps"], summary["incomplete"]) == (1, 5, 0)
        assert summary["return"]["mean"] == pytest.approx(sum(rewards))
        assert main(["replay", str(tmp_path / "rec"), "--url", st.url]) == 0
        assert "reproduced (5 steps)" in capsys.readouterr().out
