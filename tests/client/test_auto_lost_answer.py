"""``auto`` on OpenEnv-style detached sessions: a step applied whose answer was lost is
answered by replaying the episode on a fresh session; ``resume`` alone reports it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from envlink import (
    GenericEnvClient,
    OutcomeUnknownError,
    RolloutRecorder,
    StepResult,
    set_testing,
)

from .._processes import ServerProcess
from ..recording.conftest import load

pytestmark = pytest.mark.timeout(60)

MOVES = [1, -2, 3, 4, 5, -1]
LOST = 3  # the step (from 0) whose answer the server drops after applying it
# Requests on the first connection (the attach's confirming state read is not counted,
# in every server mode): the reset, steps 0..2, then step LOST arrives as the 5th:
# applied, its answer never sent.
DROP = ["--detached-sessions", "--no-extensions", "--drop-after", str(LOST + 2),
        "--drop-mode", "after_apply"]


@pytest.fixture(autouse=True)
def _no_backoff_waits() -> Iterator[None]:
    with set_testing():
        yield


@pytest.fixture
def server() -> Iterator[Callable[..., ServerProcess]]:
    """``envlink serve`` (its module) in a process with the given options; stopped at the end."""
    started: list[ServerProcess] = []

    def start(*args: str) -> ServerProcess:
        started.append(ServerProcess(*args))
        return started[-1]

    yield start
    for proc in started:
        proc.stop()


async def _fault_free(url: str) -> list[tuple[Any, Any, bool]]:
    async with GenericEnvClient(url) as env:
        await env.reset(seed=5, max_steps=len(MOVES))
        return [_answer(await env.step({"move": m})) for m in MOVES]


def _answer(result: StepResult[Any]) -> tuple[Any, Any, bool]:
    return (result.observation, result.reward, result.done)


async def test_auto_answers_a_lost_answer_by_replay(
        tmp_path: Path, server: Callable[..., ServerProcess]) -> None:
    """The caller gets every answer (as a fault-free run's), the recording is what the
    caller got with the lost step marked recovered by replay, and the old session is
    closed on the server."""
    srv = server(*DROP)
    recorder = RolloutRecorder(tmp_path)
    got = []
    async with GenericEnvClient(srv.url, on_session_lost="auto", timeout=10.0,
                                recorder=recorder) as env:
        reset = await env.reset(seed=5, max_steps=len(MOVES))
        for m in MOVES:
            got.append(_answer(await env.step({"move": m})))
        assert env.recovery == "openenv-resume"
        journal = env.journal
    health = srv.health()
    counters = health["counters"]
    assert (counters["drop"], counters["session.created"]) == (1, 2)
    # On the old session steps 0..LOST; on the replay's, 0..LOST-1 again, then the rest.
    assert counters["applied.step"] == LOST + 1 + len(MOVES)
    assert health["sessions"] == 0  # both closed
    assert got == await _fault_free(srv.url)
    assert [e.response is not None for e in journal.entries] == [True] * len(MOVES)
    assert recorder.close()
    [record] = load(tmp_path)
    assert record["outcome"] == "done"
    assert record["reset"]["observation"] == reset.observation
    assert [(s["observation"], s["reward"], s["done"]) for s in record["steps"]] == got
    assert [s["action"] for s in record["steps"]] == [{"move": m} for m in MOVES]
    assert [s.get("recovery") for s in record["steps"]] == [
        "replay" if k == LOST else None for k in range(len(MOVES))]
    assert record.get("unknown_steps", []) == []


@pytest.mark.parametrize("why", ["resume", "diverged", "truncated"])
async def test_without_a_replay_the_step_is_reported_applied(
        tmp_path: Path, server: Callable[..., ServerProcess], why: str) -> None:
    """``resume`` alone, a replay that answers differently, a journal that cannot be
    replayed: OutcomeUnknownError(applied=True), and the episode goes on on the old
    session (the step applied once, no session left behind); the recording lists that
    step among the unknown steps, never as an applied step with an answer."""
    srv = server(*DROP)
    recorder = RolloutRecorder(tmp_path)
    options: dict[str, Any] = {"on_session_lost": "resume" if why == "resume" else "auto",
                               "recorder": recorder}
    if why == "diverged":
        options["replay_verify"] = lambda recorded, replayed: False
    if why == "truncated":
        options["max_journal_steps"] = 2
    async with GenericEnvClient(srv.url, timeout=10.0, **options) as env:
        await env.reset(seed=5, max_steps=len(MOVES))
        for k, m in enumerate(MOVES[:LOST + 2]):
            if k == LOST:
                with pytest.raises(OutcomeUnknownError) as unknown:
                    await env.step({"move": m})
                assert unknown.value.applied is True
                continue
            await env.step({"move": m})
        state = await env.state()
    # Every session is closed (the client's close waits for the background closes).
    assert srv.health()["sessions"] == 0
    assert state["step_count"] == LOST + 2
    assert state["position"] == sum(MOVES[:LOST + 2])
    recorder.close()
    [record] = load(tmp_path)
    assert [s["action"] for s in record["steps"]] == [
        {"move": m} for k, m in enumerate(MOVES[:LOST + 2]) if k != LOST]
    assert [(u["action"], u["after"]) for u in record["unknown_steps"]] == [
        ({"move": MOVES[LOST]}, LOST)]
