"""The pool layer's seams: one interface, one set of options, one hook, no private reach."""

from __future__ import annotations

import ast
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import envlink._pool.pool
from envlink import ClientClosedError, EnvPool, ReconnectPolicy, StepResult
from envlink._events.pool_events import (
    EVENTS,
    BatchFinished,
    BatchStarted,
    BreakerChange,
    PoolEvent,
)
from envlink._pool import AsyncPool, BatchRunner, PoolHook, PoolOptions

pytestmark = pytest.mark.timeout(30)

SRC = Path(__file__).resolve().parents[2] / "src" / "envlink"


class Recorder(PoolHook):
    """A hook that keeps what it is told."""

    def __init__(self) -> None:
        self.batches: list[tuple[str, int, str, int]] = []
        self.sessions: dict[tuple[int, str], int] = {}
        self.placements: list[str] = []
        self.events: list[PoolEvent] = []
        self.breakers: list[BreakerChange] = []

    def batch_started(self, batch: BatchStarted) -> Any:
        return batch.method

    def batch_finished(self, batch: BatchFinished, token: Any) -> None:
        answers = batch.batch
        self.batches.append((token, batch.started.slots,
                             type(batch.error).__name__ if batch.error else "ok",
                             -1 if answers is None else len(answers.ready)))

    def sessions_changed(self, host: str, port: int, state: str, delta: int) -> None:
        key = (port, state)
        self.sessions[key] = self.sessions.get(key, 0) + delta

    def placement(self, host: str, port: int, result: str) -> None:
        self.placements.append(result)

    def event(self, event: PoolEvent) -> None:
        self.events.append(event)

    def breaker_changed(self, change: BreakerChange) -> None:
        self.breakers.append(change)


def test_the_in_process_pool_is_an_async_pool() -> None:
    """EnvPool is an AsyncPool, and its facade's pool is typed as one."""
    pool = EnvPool("ws://127.0.0.1:9", 2)
    assert AsyncPool in type(pool).__mro__
    facade = pool.sync()
    try:
        assert facade.async_pool is pool
    finally:
        facade.close()


def test_the_options_refuse_what_the_pool_refuses() -> None:
    """PoolOptions raises the pool's own errors, so both pools refuse the same input."""
    cases: list[dict[str, Any]] = [
        {"size": 0}, {"on_session_lost": "auto"}, {"autoreset": "sometimes"},
        {"batch_timeout": 0}, {"max_inflight": True},
        {"client_options": {"on_session_lost": "raise"}}, {"breaker_threshold": 0},
        {"client": int}, {"endpoints": "ftp://127.0.0.1"},
    ]
    for case in cases:
        args = {"endpoints": "ws://127.0.0.1:9", "size": 2, **case}
        with pytest.raises((ValueError, TypeError)) as from_pool:
            EnvPool(**args)
        with pytest.raises(type(from_pool.value)) as from_options:
            PoolOptions(**args)
        assert str(from_options.value) == str(from_pool.value), case


def test_the_options_travel_to_a_shard_whole() -> None:
    """The options pickle (Ray sends them to the actors) and a shard's keep all but size."""
    options = PoolOptions(["ws://127.0.0.1:9", "ws://127.0.0.1:10"], 6, autoreset="same_step",
                          max_inflight=2, breaker_threshold=5)
    part = pickle.loads(pickle.dumps(options.for_shard(3)))
    assert part.size == 3 and part.urls == options.urls
    assert {k: v for k, v in part.arguments().items() if k not in ("size", "endpoints")} == {
        k: v for k, v in options.arguments().items() if k not in ("size", "endpoints")}
    assert EnvPool(**part.arguments()).endpoints == options.urls


async def test_the_pool_reports_through_its_hook(det_servers: Callable[..., Any],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Each batch call, placement and session move reaches the pool's hook, and nothing
    else is needed to see them."""
    recorder = Recorder()
    monkeypatch.setattr(envlink._pool.pool, "pool_telemetry_hook", lambda *_: recorder)
    server = await det_servers()
    async with EnvPool(server.url, 2) as pool:
        assert (await pool.reset(seeds=0)).ok
        assert recorder.placements == ["placed", "placed"]
        assert recorder.sessions == {(server.port, "active"): 2}
        await pool.step([{"move": 1}] * 2)
        await pool.step_send([{"move": 1}, None], mask=[True, False])
        recv = await pool.step_recv()
        assert isinstance(recv[0], StepResult)
        with pytest.raises(ValueError, match="mask must be"):
            await pool.step([{"move": 1}] * 2, mask=[True])
    assert recorder.batches == [("reset", 2, "ok", 2), ("step", 2, "ok", 2),
                                ("step_send", 1, "ok", -1), ("recv", 1, "ok", 1)]
    assert recorder.sessions[(server.port, "active")] == 0


async def test_the_events_carry_the_fields_listed(det_servers: Callable[..., Any],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A capacity wait, a session moved by replay and one replay could not rebuild reach
    the hook with exactly the fields EVENTS lists; the dead endpoint's breaker change
    comes with them."""
    recorder = Recorder()
    monkeypatch.setattr(envlink._pool.pool, "pool_telemetry_hook", lambda *_: recorder)
    full = await det_servers(max_sessions=1)
    policy = ReconnectPolicy(max_attempts=2, initial_delay=0.001, max_delay=0.001)
    async with EnvPool(full.url, 2, capacity=policy) as pool:
        assert len((await pool.reset()).errors) == 1
    a, b = await det_servers(), await det_servers()
    async with EnvPool([a.url, b.url], 2, on_session_lost="replay", breaker_threshold=1,
                       breaker_reset_timeout=60) as pool:
        assert (await pool.reset(seeds=0)).ok
        await a.stop()
        assert (await pool.step([{"move": 1}] * 2)).ok
    # A replay with nowhere to go: the loss its caller sees.
    c, d = await det_servers(), await det_servers()
    async with EnvPool([c.url, d.url], 2, on_session_lost="replay", breaker_threshold=1,
                       breaker_reset_timeout=60) as pool:
        assert (await pool.reset(seeds=0)).ok
        await c.stop()
        await d.stop()
        assert len((await pool.step([{"move": 1}] * 2)).errors) == 2
    names = {e.name for e in recorder.events}
    assert names == set(EVENTS)
    for event in recorder.events:
        assert tuple(event.fields) == EVENTS[event.name], event
    assert [(b.port, b.new) for b in recorder.breakers][:1] == [(a.port, "open")]


async def test_a_shard_style_recv_sees_a_closed_pool(det_servers: Callable[..., Any]) -> None:
    """step_recv_first with nothing in flight is the pool's ValueError; steps of a pool
    closed under it answer ClientClosedError (covered with held steps in the shard tests)."""
    server = await det_servers()
    pool: EnvPool[Any, Any] = EnvPool(server.url, 1)
    try:
        await pool.reset()
        with pytest.raises(ValueError, match="no step in flight"):
            await pool.step_recv_first()
        await pool.step_send([{"move": 1}])
        answer = await pool.step_recv_first()
        assert answer.ready == (0,) and isinstance(answer[0], StepResult)
    finally:
        await pool.close()
    with pytest.raises(ClientClosedError):
        await pool.step_send([{"move": 1}])


async def test_a_closed_batch_answers_a_callers_bug_per_slot() -> None:
    """Sent steps collected after the pool closed: one that had ended with a caller's bug
    goes to ``bugs`` for its slot when asked (the others answer ClientClosedError), and
    is raised otherwise, as a receive does."""
    runner: BatchRunner[Any] = BatchRunner(2, PoolHook())
    runner.expect([0, 1])
    runner.fail([0], TypeError("action must be a dict"))
    sent = dict(runner.inflight)
    await runner.cancel_all()  # the pool closed before the bug was collected
    bugs: dict[int, Exception] = {}
    batch = runner.closed_batch(sent, bugs)
    assert batch.ready == (0, 1) and batch[0] is None
    assert isinstance(batch[1], ClientClosedError)
    assert set(bugs) == {0} and isinstance(bugs[0], TypeError)
    with pytest.raises(TypeError, match="action must be a dict"):
        runner.closed_batch(sent)


def _pool_layer() -> list[Path]:
    return [*sorted((SRC / "_pool").glob("*.py")), SRC / "ray.py"]


#: OpenEnv's documented override hook of a typed client, compared, never called.
_OPENENV_HOOKS = {"_step_payload"}


def test_the_pool_layer_touches_no_private_attribute_of_another_object() -> None:
    """In _pool/ and envlink.ray, a private attribute is only ever read on ``self`` (the
    shard drives its pool through the pool's methods, the driver its journals through
    theirs)."""
    found = []
    for path in _pool_layer():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Attribute) and node.attr.startswith("_")
                    and not node.attr.startswith("__")):
                continue
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            if node.attr in _OPENENV_HOOKS:
                continue
            found.append(f"{path.name}:{node.lineno} .{node.attr}")
    assert found == []


def test_the_pool_layer_never_casts_one_pool_to_the_other() -> None:
    """No ``cast`` in the pool layer: where one pool stands for the other, it is typed as
    the interface both are."""
    for path in _pool_layer():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
                 and isinstance(n.func, ast.Name) and n.func.id == "cast"]
        assert calls == [], path.name
