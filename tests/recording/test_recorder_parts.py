"""A long episode is written in parts, never dropped: every step on disk, once, in order,
the parts joined by (episode_id, session_id, pid, start)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from envlink import GenericEnvClient, RolloutRecorder, SessionLostError
from envlink.server import EnvServer

from .conftest import load

pytestmark = pytest.mark.timeout(60)


def _key(record: dict[str, Any]) -> tuple[Any, ...]:
    return (record["episode_id"], record["session_id"], record["pid"], record["start"])


async def test_a_long_episode_is_written_in_parts_with_every_step(tmp_path: Path) -> None:
    recorder = RolloutRecorder(tmp_path, part_steps=3)
    async with EnvServer(env="deterministic", ping_interval=None) as srv, \
            GenericEnvClient(srv.url, recorder=recorder) as env:
        reset = await env.reset(seed=7, max_steps=8)
        got = [await env.step({"move": move}) for move in range(8)]
        assert got[-1].done
        # An episode of exactly part_steps steps that ends done is one line.
        await env.reset(seed=8, max_steps=3)
        short = [await env.step({"move": move}) for move in range(3)]
    recorder.close()
    records = load(tmp_path)
    assert [(r["part"], r["outcome"], len(r["steps"])) for r in records] == [
        (1, "continued", 3), (2, "continued", 3), (3, "done", 2), (1, "done", 3)]
    parts, (alone,) = records[:3], records[3:]
    assert len({_key(r) for r in parts}) == 1 and _key(alone) != _key(parts[0])
    assert parts[0]["reset"]["observation"] == reset.observation
    assert parts[0]["reset"]["kwargs"] == {"seed": 7, "max_steps": 8}
    assert [r["reset"] for r in parts[1:]] == [None, None]
    steps = [s for r in parts for s in r["steps"]]
    assert [s["index"] for s in steps] == list(range(8))
    assert [s["action"] for s in steps] == [{"move": m} for m in range(8)]
    assert [s["observation"] for s in steps] == [g.observation for g in got]
    rewards = [g.reward or 0.0 for g in got]
    assert [r["return"] for r in parts] == pytest.approx(
        [sum(rewards[:3]), sum(rewards[:6]), sum(rewards)])
    assert alone["return"] == pytest.approx(sum(g.reward or 0.0 for g in short))
    assert recorder.stats == {"episodes_written": 4, "steps_written": 11,
                              "episodes_dropped": 0, "steps_dropped": 0}


async def test_parts_by_size_and_unknown_steps_in_the_part_where_they_happened(
        tmp_path: Path) -> None:
    recorder = RolloutRecorder(tmp_path, part_bytes=1)  # each step a part of its own
    async with EnvServer(env="deterministic", ping_interval=None) as srv, \
            GenericEnvClient(srv.url, recorder=recorder) as env:
        await env.reset(seed=1, max_steps=10)
        for move in range(3):
            await env.step({"move": move})
        srv.faults.drop_after = 1
        srv.faults.drop_mode = "after_apply"
        with pytest.raises(SessionLostError):
            await env.step({"move": 42})
    recorder.close()
    records = load(tmp_path)
    assert [(r["part"], r["outcome"], [s["index"] for s in r["steps"]])
            for r in records] == [(1, "continued", [0]), (2, "continued", [1]),
                                  (3, "continued", [2]), (4, "lost", [])]
    assert [r["unknown_steps"] for r in records] == [
        [], [], [], [{"action": {"move": 42}, "after": 3}]]
    assert records[-1]["return"] == pytest.approx(records[2]["return"])


async def test_an_episode_much_longer_than_a_part_loses_no_step(tmp_path: Path) -> None:
    recorder = RolloutRecorder(tmp_path, part_steps=10)
    async with EnvServer(env="deterministic", ping_interval=None) as srv, \
            GenericEnvClient(srv.url, recorder=recorder) as env:
        await env.reset(seed=2, max_steps=250)
        for _ in range(250):
            await env.step({"move": 1})
    recorder.close()
    records = load(tmp_path)
    assert [s["index"] for r in records for s in r["steps"]] == list(range(250))
    assert records[-1]["outcome"] == "done" and records[-1]["part"] == 25
    assert recorder.stats["episodes_dropped"] == 0
