"""A pool that fails over to another server records each episode once."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from envlink import (
    ClientConfig,
    EnvPool,
    ReplayDivergedError,
    RolloutRecorder,
    SessionLostError,
    StepResult,
)

from .._processes import ServerProcess
from .conftest import load

pytestmark = pytest.mark.timeout(60)

STEPS = 6
LOST_AT = 3  # the step (from 0) whose server is killed


def _pool(urls: list[str], recorder: RolloutRecorder, **options: Any) -> EnvPool[Any]:
    return EnvPool(urls, 1, on_session_lost="replay", breaker_threshold=1,
                   breaker_reset_timeout=60, client_config=ClientConfig(recorder=recorder),
                   **options)


def _step_answers(record: dict[str, Any]) -> list[tuple[Any, Any, Any, Any]]:
    return [(s["action"], s["observation"], s["reward"], s["done"]) for s in record["steps"]]


@pytest.mark.parametrize("mid_step", [False, True])
async def test_a_failed_over_episode_is_recorded_once(
        tmp_path: Path, processes: Callable[..., ServerProcess], mid_step: bool) -> None:
    """A server killed mid-episode (between steps, or with a step on the wire): one record,
    every step once as the caller got it, the step answered through the rebuild marked
    recovered by replay, no step left unknown."""
    # --stall-after 5: the reset and three steps are answered, the fourth step stalls.
    victim = processes("--stall-after", str(LOST_AT + 2) if mid_step else "1000")
    other = processes()
    recorder = RolloutRecorder(tmp_path)
    got: list[tuple[Any, Any, Any, Any]] = []
    async with _pool([victim.url, other.url], recorder) as pool:
        reset = (await pool.reset(seeds=7, max_steps=STEPS)).results()[0]
        assert pool.view().slot_endpoints == (victim.url,)
        for k in range(STEPS):
            action = {"move": k + 1}
            if k == LOST_AT and not mid_step:
                victim.kill()
            await pool.step_send([action])
            if k == LOST_AT and mid_step:
                await asyncio.wait_for(asyncio.to_thread(victim.wait_event, "stall"), 20)
                victim.kill()
            result = (await pool.step_recv()).results()[0]
            assert isinstance(result, StepResult)
            got.append((action, result.observation, result.reward, result.done))
        assert pool.view().slot_endpoints == (other.url,)
    assert recorder.close()
    [record] = load(tmp_path)
    assert record["outcome"] == "done"
    assert record["reset"]["observation"] == reset.observation
    assert _step_answers(record) == got
    assert [s["index"] for s in record["steps"]] == list(range(STEPS))
    assert [s.get("recovery") for s in record["steps"]] == [
        "replay" if k == LOST_AT else None for k in range(STEPS)]
    assert [s["recovered"] for s in record["steps"]] == [k == LOST_AT for k in range(STEPS)]
    assert record.get("unknown_steps", []) == []


async def test_a_rebuild_that_fails_records_the_lost_episode_once(
        tmp_path: Path, processes: Callable[..., ServerProcess]) -> None:
    """A rebuild whose replay diverges: the episode is written once, as lost, with the
    steps the caller got; nothing of the rebuild's reset and re-sent steps."""
    victim, other = processes(), processes()
    recorder = RolloutRecorder(tmp_path)
    got = []
    async with _pool([victim.url, other.url], recorder,
                     replay_verify=lambda recorded, replayed: False) as pool:
        await pool.reset(seeds=7, max_steps=STEPS)
        for k in range(LOST_AT):
            result = (await pool.step([{"move": k + 1}])).results()[0]
            assert isinstance(result, StepResult)
            got.append(result.observation)
        victim.kill()
        (error,) = (await pool.step([{"move": 9}])).errors.values()
        assert isinstance(error, ReplayDivergedError)
    assert recorder.close()
    [record] = load(tmp_path)
    assert record["outcome"] == "lost"
    assert [s["observation"] for s in record["steps"]] == got
    assert not any(s["recovered"] for s in record["steps"])


async def test_an_episode_taken_over_from_a_dead_shard_is_recorded_once(
        tmp_path: Path, processes: Callable[..., ServerProcess]) -> None:
    """A Ray shard's way to take over an episode of a dead process (``restore_slot``): the
    rebuild's steps are the record (the first copy died with its process), each marked
    recovered by replay, as is the next step; the episode is one record."""
    server = processes()
    recorder = RolloutRecorder(tmp_path)
    got = []
    # The first pool stands for the shard actor that dies: it records nothing.
    async with EnvPool([server.url], 1, on_session_lost="replay") as first:
        await first.reset(seeds=7, max_steps=STEPS)
        for k in range(LOST_AT):
            result = (await first.step([{"move": k + 1}])).results()[0]
            assert isinstance(result, StepResult)
            got.append(result.observation)
        client = first.slot_record(0).client
        assert client is not None
        journal = client.journal
    async with _pool([server.url], recorder) as second:
        await second.restore_slot(0, journal, reset_kwargs=journal.reset_kwargs, episodes=1)
        for k in range(LOST_AT, STEPS):
            result = (await second.step([{"move": k + 1}])).results()[0]
            assert isinstance(result, StepResult)
            got.append(result.observation)
    assert recorder.close()
    [record] = load(tmp_path)
    assert record["outcome"] == "done"
    assert [s["observation"] for s in record["steps"]] == got
    assert [s.get("recovery") for s in record["steps"]] == [
        "replay" if k <= LOST_AT else None for k in range(STEPS)]


async def test_a_failed_take_over_from_a_dead_shard_records_the_episode_once_as_lost(
        tmp_path: Path, processes: Callable[..., ServerProcess]) -> None:
    """``restore_slot`` whose replay diverges: the episode is written once, as lost, as
    the caller got it (the journal's reset and answers), nothing of the rebuild's
    diverged reset and re-sent steps; the slot is lost."""
    server = processes()
    recorder = RolloutRecorder(tmp_path)
    got = []
    async with EnvPool([server.url], 1, on_session_lost="replay") as first:
        reset = (await first.reset(seeds=7, max_steps=STEPS)).results()[0]
        for k in range(LOST_AT):
            result = (await first.step([{"move": k + 1}])).results()[0]
            assert isinstance(result, StepResult)
            got.append(({"move": k + 1}, result.observation, result.reward))
        client = first.slot_record(0).client
        assert client is not None
        journal = client.journal
    async with _pool([server.url], recorder,
                     replay_verify=lambda recorded, replayed: False) as second:
        with pytest.raises(ReplayDivergedError):
            await second.restore_slot(0, journal, reset_kwargs=journal.reset_kwargs,
                                      episodes=1)
    assert recorder.close()
    [record] = load(tmp_path)
    assert record["outcome"] == "lost"
    assert record["reset"]["observation"] == reset.observation
    assert record["reset"]["kwargs"] == journal.reset_kwargs
    assert [(s["action"], s["observation"], s["reward"]) for s in record["steps"]] == got
    assert not any(s["recovered"] for s in record["steps"])
    assert record["unknown_steps"] == []


async def test_a_failed_take_over_of_a_journal_without_every_step_writes_nothing(
        tmp_path: Path, processes: Callable[..., ServerProcess]) -> None:
    """A journal that did not keep every step (truncated) cannot be replayed, and a
    record made from it would not be the episode the caller got: nothing is written."""
    server = processes()
    recorder = RolloutRecorder(tmp_path)
    async with EnvPool([server.url], 1, on_session_lost="replay") as first:
        await first.reset(seeds=7, max_steps=STEPS)
        for k in range(LOST_AT):
            await first.step([{"move": k + 1}])
        client = first.slot_record(0).client
        assert client is not None
        journal = client.journal
    journal.entries = journal.entries[1:]  # as a journal past its max_steps keeps them
    journal.truncated = True
    async with _pool([server.url], recorder) as second:
        with pytest.raises(SessionLostError):
            await second.restore_slot(0, journal, reset_kwargs=journal.reset_kwargs,
                                      episodes=1)
    assert recorder.close()
    assert load(tmp_path) == []
