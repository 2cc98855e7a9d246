"""RolloutRecorder: every episode once, every step once in order, as the caller got it,
through a connection dropped after the server applied a step (the reference server)."""

from __future__ import annotations

import asyncio
import dataclasses
import pickle
from pathlib import Path
from typing import Any

import pytest

from envlink import (
    ClientConfig,
    EnvPool,
    GenericEnvClient,
    RolloutRecorder,
    SessionLostError,
    StepResult,
)
from envlink._recording.rollouts import read_episodes, summarise
from envlink.server import EnvServer, ServerThread, Transition

from .._otel_support import Otel
from .conftest import load

pytestmark = pytest.mark.timeout(60)

MOVES = [3, 1, 4, 1, 5, 9, 2, 6]


def _same(step: dict[str, Any], got: StepResult[Any]) -> None:
    assert (step["observation"], step["reward"], step["done"]) == (
        got.observation, got.reward, got.done)


def _check(record: dict[str, Any], reset: StepResult[Any], got: list[StepResult[Any]],
           actions: list[dict[str, Any]], recovered_index: int | None) -> None:
    assert record["outcome"] == "done"
    assert record["reset"]["observation"] == reset.observation
    assert [s["index"] for s in record["steps"]] == list(range(len(got)))
    assert [s["action"] for s in record["steps"]] == actions
    for step, answer in zip(record["steps"], got, strict=True):
        _same(step, answer)
    assert record["return"] == pytest.approx(sum(g.reward or 0.0 for g in got))
    marked = [s["index"] for s in record["steps"] if s["recovered"]]
    assert marked == ([] if recovered_index is None else [recovered_index])
    assert record["unknown_steps"] == []


async def _episode(env: GenericEnvClient, srv: EnvServer, seed: int,
                   drop_at: int | None) -> tuple[StepResult[Any], list[StepResult[Any]],
                                                 list[dict[str, Any]]]:
    reset = await env.reset(seed=seed, max_steps=len(MOVES))
    got, actions = [], []
    for i, move in enumerate(MOVES):
        if i == drop_at:
            # This connection's next request is this step: dropped once applied.
            srv.faults.drop_after = 1
            srv.faults.drop_mode = "after_apply"
        action = {"move": move}
        actions.append(action)
        got.append(await env.step(action))
    return reset, got, actions


async def test_async_client_records_each_episode_as_the_caller_got_it(
        tmp_path: Path) -> None:
    recorder = RolloutRecorder(tmp_path)
    async with EnvServer(env="deterministic", ping_interval=None) as srv:
        env = GenericEnvClient(srv.url, on_session_lost="auto", recorder=recorder)
        try:
            runs = []
            for seed, drop_at in ((1, 3), (2, None)):
                # The fault counts requests on one connection: a fresh one per episode.
                await env.disconnect()
                srv.faults.drop_after = None
                await env.connect()
                runs.append((await _episode(env, srv, seed, drop_at), drop_at))
        finally:
            await env.close()
    assert recorder.close()
    records = load(tmp_path)
    assert len(records) == 2
    for record, ((reset, got, actions), drop_at) in zip(records, runs, strict=True):
        _check(record, reset, got, actions, drop_at)
        assert record["server"] == env.ws_url
    recovered = records[0]["steps"][3]
    assert recovered["recovery"] in ("envlink-resume", "openenv-resume")
    assert recorder.stats == {"episodes_written": 2, "steps_written": 16,
                              "episodes_dropped": 0, "steps_dropped": 0}


def test_sync_facade_records_through_a_dropped_connection(tmp_path: Path) -> None:
    with RolloutRecorder(tmp_path) as recorder, \
            ServerThread(env="deterministic", ping_interval=None) as st, \
            GenericEnvClient(st.url, on_session_lost="auto", recorder=recorder).sync() as env:
        reset = env.reset(seed=5, max_steps=len(MOVES))
        got = []
        for i, move in enumerate(MOVES):
            if i == 2:
                st.server.faults.drop_after = 1
                st.server.faults.drop_mode = "after_apply"
            got.append(env.step({"move": move}))
    (record,) = load(tmp_path)
    _check(record, reset, got, [{"move": m} for m in MOVES], 2)


async def test_a_pool_records_every_slot_once(tmp_path: Path) -> None:
    recorder = RolloutRecorder(tmp_path)
    config = ClientConfig(recorder=recorder)
    async with EnvServer(env="deterministic", ping_interval=None) as srv, \
            EnvPool(srv.url, 3, client_config=config, autoreset="disabled",
                    on_session_lost="resume") as pool:
        resets = (await pool.reset(seeds=10, max_steps=len(MOVES))).results()
        answers: list[list[StepResult[Any]]] = [[], [], []]
        for i, move in enumerate(MOVES):
            if i == 4:
                srv.faults.drop_after = 1  # one of the slots' next request
                srv.faults.drop_mode = "after_apply"
            batch = await pool.step([{"move": move + k} for k in range(3)])
            assert batch.errors == {}
            for k, result in enumerate(batch.results()):
                answers[k].append(result)
    recorder.close()
    records = load(tmp_path)
    assert len(records) == 3
    by_seed = {r["reset"]["kwargs"]["seed"]: r for r in records}
    assert sorted(by_seed) == [10, 11, 12]
    recovered = 0
    for k in range(3):
        record = by_seed[10 + k]
        assert record["outcome"] == "done"
        assert record["reset"]["observation"] == resets[k].observation
        assert [s["action"] for s in record["steps"]] == [{"move": m + k} for m in MOVES]
        for step, answer in zip(record["steps"], answers[k], strict=True):
            _same(step, answer)
        recovered += sum(s["recovered"] for s in record["steps"])
    assert recovered == 1


async def test_a_lost_step_is_recorded_as_unknown_never_as_applied(tmp_path: Path) -> None:
    recorder = RolloutRecorder(tmp_path)
    async with EnvServer(env="deterministic", ping_interval=None) as srv:
        env = GenericEnvClient(srv.url, recorder=recorder)  # on_session_lost="raise"
        try:
            await env.reset(seed=3, max_steps=100)
            for move in MOVES[:3]:
                await env.step({"move": move})
            srv.faults.drop_after = 5
            srv.faults.drop_mode = "after_apply"
            with pytest.raises(SessionLostError):
                await env.step({"move": 42})
            await env.reset(seed=4, max_steps=2)
        finally:
            await env.close()
    recorder.close()
    lost, closed = load(tmp_path)
    assert lost["outcome"] == "lost"
    assert [s["action"] for s in lost["steps"]] == [{"move": m} for m in MOVES[:3]]
    assert lost["unknown_steps"] == [{"action": {"move": 42}, "after": 3}]
    assert (closed["outcome"], closed["steps"]) == ("close", [])


class _Secretive:
    """An environment that echoes the reset's kwargs and the actions into observations
    and into ``metadata``: every value the caller or it produces is a secret."""

    def __init__(self) -> None:
        self.prompt = ""

    def reset(self, prompt: str = "", **kwargs: Any) -> Transition:
        self.prompt = prompt
        return Transition(observation={"text": f"obs-{prompt}"},
                          metadata={"token": f"meta-{prompt}"})

    def step(self, action: dict[str, Any]) -> Transition:
        word = action["word"]
        return Transition(observation={"text": f"obs-{word}"}, reward=1.0,
                          done=word == "last-secret", metadata={"token": f"meta-{word}"})

    def state(self) -> dict[str, Any]:
        return {"episode_id": None, "step_count": 0}


async def test_redaction_covers_everything_that_came_from_the_caller_or_the_environment(
        tmp_path: Path) -> None:
    seen: list[Any] = []

    def replace_everything(value: Any) -> Any:
        seen.append(value)
        return "R"

    recorder = RolloutRecorder(tmp_path, redact=replace_everything)
    async with EnvServer(env=_Secretive, ping_interval=None) as srv, \
            GenericEnvClient(srv.url, recorder=recorder,
                             headers={"Authorization": "Bearer s3cret"}) as env:
        await env.reset(prompt="prompt-secret", seed="seed-secret")
        await env.step({"word": "first-secret"})
        await env.step({"word": "last-secret"})
        await env.reset(prompt="open-secret")
        srv.faults.drop_after = 1  # the next step's answer is lost once applied
        srv.faults.drop_mode = "after_apply"
        with pytest.raises(SessionLostError):
            await env.step({"word": "unknown-secret"})
    recorder.close()
    done, lost = load(tmp_path)
    text = "".join(_text(tmp_path))
    for secret in ("secret", "s3cret"):
        assert secret not in text
    assert done["reset"]["kwargs"] == {"prompt": "R", "seed": "R"}
    assert done["reset"]["observation"] == "R" and done["reset"]["extra"] == {"metadata": "R"}
    assert [s["action"] for s in done["steps"]] == ["R", "R"]
    assert {s["observation"] for s in done["steps"]} == {"R"}
    assert [s["extra"] for s in done["steps"]] == [{"metadata": "R"}] * 2
    assert lost["unknown_steps"] == [{"action": "R", "after": 0}]
    for value in ("prompt-secret", {"word": "first-secret"}, {"word": "unknown-secret"},
                  {"token": "meta-last-secret"}):
        assert value in seen


async def test_a_recovery_outside_a_step_is_not_credited_to_the_next_step(
        tmp_path: Path) -> None:
    recorder = RolloutRecorder(tmp_path)
    async with EnvServer(env="deterministic", ping_interval=None) as srv, \
            GenericEnvClient(srv.url, on_session_lost="auto", recorder=recorder) as env:
        await env.reset(seed=1, max_steps=3)
        await env.step({"move": 1})
        srv.faults.drop_after = 1  # the state() call's connection drops
        srv.faults.drop_mode = "after_apply"
        await env.state()
        await env.step({"move": 2})
        srv.faults.drop_after = 1  # and this step's
        srv.faults.drop_mode = "after_apply"
        await env.step({"move": 3})
    recorder.close()
    (record,) = load(tmp_path)
    assert [s["recovered"] for s in record["steps"]] == [False, False, True]
    assert [s["retries"] for s in record["steps"]] == [0, 0, 0]


def _text(directory: Path) -> list[str]:
    return [p.read_text() for p in directory.glob("*.jsonl")]


def _append(path: Path, text: str) -> None:
    with path.open("a") as f:
        f.write(text)


def _redact(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: "redacted" if k in ("move", "draw") else v for k, v in value.items()}
    return value


def test_a_recorder_pickles_as_its_settings(tmp_path: Path) -> None:
    recorder = RolloutRecorder(tmp_path, redact=_redact, max_file_bytes=1000,
                               max_buffered_bytes=2000, part_steps=30, part_bytes=4000,
                               flush_on_sigterm=False)
    config = ClientConfig(recorder=recorder)
    copy = pickle.loads(pickle.dumps(config))
    assert copy.recorder is not recorder
    got = copy.recorder
    assert (got.directory, got.redact, got.max_file_bytes, got.max_buffered_bytes,
            got.part_steps, got.part_bytes, got.flush_on_sigterm) == (
        tmp_path, _redact, 1000, 2000, 30, 4000, False)
    assert pickle.loads(pickle.dumps(RolloutRecorder(tmp_path))).flush_on_sigterm is True
    with pytest.raises(TypeError, match="flush_on_sigterm"):
        RolloutRecorder(tmp_path, flush_on_sigterm=1)  # type: ignore[arg-type]
    for bad in ("max_buffered_bytes", "part_steps", "part_bytes"):
        with pytest.raises(ValueError, match=bad):
            RolloutRecorder(tmp_path, **{bad: 0})
    with pytest.warns(DeprecationWarning, match="part_steps"):
        assert RolloutRecorder(tmp_path, max_episode_steps=7).part_steps == 7
    assert dataclasses.replace(config, recorder=None).recorder is None
    with pytest.raises(TypeError, match="recorder"):
        ClientConfig(recorder="rollouts/")  # type: ignore[arg-type]


async def test_files_rotate_by_size_and_readers_skip_a_partial_line(tmp_path: Path) -> None:
    recorder = RolloutRecorder(tmp_path, max_file_bytes=1)
    async with EnvServer(env="deterministic", ping_interval=None) as srv, \
            GenericEnvClient(srv.url, recorder=recorder) as env:
        for seed in range(3):
            await env.reset(seed=seed, max_steps=1)
            await env.step({"move": 1})
    recorder.close()
    assert len(recorder.files) == 3
    _append(recorder.files[-1], '{"schema": "envlink.rollout/1", "steps": [')
    assert len(list(read_episodes(tmp_path))) == 3
    summary = summarise(read_episodes(tmp_path))
    assert summary["episodes"] == 3 and summary["outcomes"] == {"done": 3}
    assert summary["steps"] == 3


async def test_many_clients_share_one_recorder(tmp_path: Path) -> None:
    recorder = RolloutRecorder(tmp_path)
    async with EnvServer(env="deterministic", ping_interval=None) as srv:
        async def run(seed: int) -> None:
            async with GenericEnvClient(srv.url, recorder=recorder) as env:
                for episode in range(3):
                    await env.reset(seed=seed * 10 + episode, max_steps=2)
                    await env.step({"move": 1})
                    await env.step({"move": 2})

        await asyncio.gather(*(run(seed) for seed in range(8)))
    recorder.close()
    records = load(tmp_path)
    assert sorted(r["reset"]["kwargs"]["seed"] for r in records) == sorted(
        s * 10 + e for s in range(8) for e in range(3))
    assert all(len(r["steps"]) == 2 and r["outcome"] == "done" for r in records)


async def test_steps_carry_their_span_when_tracing_is_on(tmp_path: Path, otel: Otel) -> None:
    recorder = RolloutRecorder(tmp_path)
    async with EnvServer(env="deterministic", ping_interval=None) as srv, \
            GenericEnvClient(srv.url, recorder=recorder,
                             tracer_provider=otel.tracer_provider) as env:
        await env.reset(seed=1, max_steps=2)
        await env.step({"move": 1})
        await env.step({"move": 2})
    recorder.close()
    (record,) = load(tmp_path)
    spans = {(f"{s.context.trace_id:032x}", f"{s.context.span_id:016x}"): s.name
             for s in otel.spans()}
    for step in record["steps"]:
        assert "step" in spans[(step["trace_id"], step["span_id"])]


async def test_a_clients_close_returns_once_its_episodes_are_on_disk(tmp_path: Path) -> None:
    recorder = RolloutRecorder(tmp_path)
    async with EnvServer(env="deterministic", ping_interval=None) as srv:
        for seed in range(3):
            async with GenericEnvClient(srv.url, recorder=recorder) as env:
                await env.reset(seed=seed, max_steps=2)
                await env.step({"move": 1})
                await env.step({"move": 2})
                await env.reset(seed=seed + 100, max_steps=2)  # open: ends as "close"
            # No flush: the client's close waited for its episodes.
            assert len(load(tmp_path)) == 2 * (seed + 1)
    recorder.close()
