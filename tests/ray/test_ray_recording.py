"""envlink.ray with a recorder: each episode once through a server's death and a shard's."""

from __future__ import annotations

from ._ray_support import require_ray

require_ray()

from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402

from envlink import ClientConfig, RolloutRecorder, StepResult  # noqa: E402
from envlink.ray import RayEnvPool  # noqa: E402

from .._processes import ServerProcess  # noqa: E402
from ..recording.conftest import load  # noqa: E402
from .test_ray_pool import _kill_mid_batch  # noqa: E402

pytestmark = pytest.mark.timeout(120)

STEPS = 4


def _by_slot(directory: Path) -> dict[int, dict[str, Any]]:
    records = load(directory)
    slots = {r["reset"]["kwargs"]["seed"]: r for r in records}
    assert len(slots) == len(records), "an episode was recorded twice"
    return slots


def _recoveries(record: dict[str, Any]) -> list[str | None]:
    return [s.get("recovery") for s in record["steps"]]


async def test_a_server_killed_under_a_shard_records_each_episode_once(
        ray_local: Any, tmp_path: Path) -> None:
    """A shard rebuilds a killed server's session on the other: one record per episode,
    the step answered through the rebuild marked recovered by replay."""
    victim, other = ServerProcess(), ServerProcess()
    got: list[list[Any]] = [[], []]
    try:
        async with RayEnvPool([victim.url, other.url], 2, shards=1,
                              on_session_lost="replay", breaker_threshold=1,
                              breaker_reset_timeout=60,
                              client_config=ClientConfig(
                                  recorder=RolloutRecorder(tmp_path))) as pool:
            await pool.reset(seeds=0, max_steps=STEPS)
            on_victim = pool.view().slot_endpoints.index(victim.url)
            for t in range(STEPS):
                if t == 2:
                    victim.kill()
                for i, r in enumerate(await pool.step([{"move": 1}, {"move": 2}])):
                    assert isinstance(r, StepResult)
                    got[i].append(r.observation)
    finally:
        victim.stop()
        other.stop()
    records = _by_slot(tmp_path)
    assert sorted(records) == [0, 1]
    for i, record in records.items():
        assert record["outcome"] == "done"
        assert [s["observation"] for s in record["steps"]] == got[i]
        assert _recoveries(record) == [
            "replay" if i == on_victim and t == 2 else None for t in range(STEPS)]


async def test_a_killed_shard_records_each_episode_once(
        ray_local: Any, threads: Any, tmp_path: Path) -> None:
    """ray.kill of a shard mid-batch: its episodes, rebuilt on the new actor, are recorded
    once (the first copy died with the actor), every step answered through the rebuild
    marked recovered by replay; the other shard's are untouched."""
    st = threads()
    size = 4
    got: list[list[Any]] = [[] for _ in range(size)]
    async with RayEnvPool([st.url], size, shards=2, on_session_lost="replay",
                          client_config=ClientConfig(
                              recorder=RolloutRecorder(tmp_path))) as pool:
        await pool.reset(seeds=0, max_steps=STEPS)
        for t in range(STEPS):
            if t == 2:
                batch = await _kill_mid_batch(ray_local, st, pool, size, shard=0)
            else:
                batch = await pool.step([{"move": 1}] * size)
            for i, r in enumerate(batch):
                assert isinstance(r, StepResult)
                got[i].append(r.observation)
    records = _by_slot(tmp_path)
    assert sorted(records) == list(range(size))
    for i, record in records.items():
        assert record["outcome"] == "done"
        assert [s["observation"] for s in record["steps"]] == got[i]
        # Shard 0 holds slots 0 and 1: their steps up to the interrupted one came
        # through the rebuild.
        assert _recoveries(record) == [
            "replay" if i < size // 2 and t <= 2 else None for t in range(STEPS)]
