"""envlink.ray against a real local Ray and real reference servers on 127.0.0.1."""

from __future__ import annotations

from ._ray_support import require_ray

require_ray()

import asyncio  # noqa: E402
import contextlib  # noqa: E402
import threading  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402
from opentelemetry.sdk.metrics import MeterProvider  # noqa: E402
from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: E402

from envlink import (  # noqa: E402
    CallTimeoutError,
    ClientClosedError,
    EnvPool,
    GenericEnvClient,
    InvalidActionError,
    SessionLostError,
    StepResult,
)
from envlink.ray import RayEnvPool  # noqa: E402

from .._processes import ServerProcess  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def _actions(n: int, t: int) -> list[dict[str, int]]:
    return [{"move": (i * 7 + t) % 5 - 2} for i in range(n)]


def _rows(batch: list[Any]) -> list[Any]:
    out = []
    for r in batch:
        if isinstance(r, StepResult):
            out.append((r.observation, r.reward, r.done))
        else:
            out.append(r if r is None else type(r).__name__)
    return out


async def _episode(pool: Any, n: int, steps: int) -> list[Any]:
    rows = [_rows(await pool.reset(seeds=0, max_steps=4))]
    for t in range(steps):
        batch = await pool.step(_actions(n, t))
        rows.append((_rows(batch), batch.autoreset, sorted(batch.final)))
    return rows


@pytest.mark.parametrize(("shards", "size", "autoreset"),
                         [(2, 16, "next_step"), (3, 24, "same_step"), (4, 32, "next_step")])
async def test_same_results_as_the_in_process_pool(
        ray_local: Any, server_processes: list[ServerProcess], shards: int, size: int,
        autoreset: Any) -> None:
    """2-4 shards x 16-32 sessions answer exactly what one in-process EnvPool answers."""
    urls = [p.url for p in server_processes]
    async with EnvPool(urls, size, autoreset=autoreset) as local:
        expected = await _episode(local, size, 6)
    async with RayEnvPool(urls, size, shards=shards, autoreset=autoreset) as remote:
        got = await _episode(remote, size, 6)
        view = remote.view()
    assert got == expected
    assert any(auto for _rows_, auto, _final in expected[1:])  # episodes ended and restarted
    assert sum(e.sessions for e in view.endpoints) == size
    assert set(view.slots) == {"active"}


async def test_masks_ready_first_and_sync_facade(
        ray_local: Any, server_processes: list[ServerProcess]) -> None:
    """Masks, step_send/step_recv(min_ready) across shards and the blocking facade."""
    urls = [p.url for p in server_processes]
    pool = RayEnvPool(urls, 8, shards=2)
    sync = pool.sync()
    try:
        first = await asyncio.to_thread(sync.reset, 0, mask=[i % 2 == 0 for i in range(8)])
        assert first.ready == (0, 2, 4, 6) and first[1] is None
        assert isinstance(first[0], StepResult)
        with pytest.raises(ValueError, match="actions must be"):
            await asyncio.to_thread(sync.step, [{"move": 1}] * 3)
        await asyncio.to_thread(sync.reset, 0)
        await asyncio.to_thread(sync.step_send, [{"move": 1}] * 8)
        with pytest.raises(ValueError, match="in flight"):
            await asyncio.to_thread(sync.step, [{"move": 1}] * 8)
        some = await asyncio.to_thread(sync.step_recv, 3)
        assert len(some.ready) >= 3
        assert set(some.ready) | set(some.stragglers) == set(range(8))
        rest = await asyncio.to_thread(sync.step_recv)
        assert set(rest.ready) == set(some.stragglers)
        merged = [some[i] if i in some.ready else rest[i] for i in range(8)]
        assert all(isinstance(r, StepResult) and r.observation["position"] == 1
                   for r in merged)
        empty = await asyncio.to_thread(sync.step_recv)
        assert empty.ready == () and list(empty) == [None] * 8
    finally:
        await asyncio.to_thread(sync.close)
    with pytest.raises(Exception, match="closed"):
        await pool.step([{"move": 1}] * 8)


def _stall_next(st: Any) -> int:
    """Make every open connection hold its next request unanswered; the step count now."""

    def apply(server: Any) -> int:
        for handle in server.connections:
            handle.faults.stall_after = handle.requests + 1
        return int(server._counters.get("request.step"))

    return int(st.call(apply))


async def _kill_mid_batch(ray: Any, st: Any, pool: RayEnvPool[Any, Any], size: int,
                          shard: int) -> Any:
    """Step every slot, wait until every step reached the server (held), kill ``shard``."""
    before = _stall_next(st)
    task = asyncio.ensure_future(pool.step([{"move": 1}] * size))
    await asyncio.to_thread(st.call, lambda s: s.wait_for_request("step", before + size))
    actor = pool.actors()[shard]
    ray.kill(actor, no_restart=True)
    # ray.kill returns before the actor is gone, and until then the shard could still pass
    # the released answers on: release them only once a call to the actor fails.
    while True:
        try:
            await actor.view.remote()
        except ray.exceptions.RayActorError:
            break
    st.call(lambda s: s.unstall_all())
    return await task


async def test_killed_shard_under_raise_answers_lost_with_journals(
        ray_local: Any, threads: Any) -> None:
    """ray.kill mid-batch, raise: that shard's slots answer SessionLostError with journals
    (the reset, and the steps counted: under raise none is kept)."""
    st = threads()
    async with RayEnvPool([st.url], 8, shards=2) as pool:
        await pool.reset(seeds=0, max_steps=50)
        for _ in range(2):
            assert (await pool.step([{"move": 1}] * 8)).ok
        batch = await _kill_mid_batch(ray_local, st, pool, 8, shard=1)
        assert [isinstance(r, StepResult) for r in batch] == [True] * 4 + [False] * 4
        for i in range(4, 8):
            err = batch[i]
            assert isinstance(err, SessionLostError) and "shard actor (1)" in str(err)
            assert err.journal is not None and err.journal.step_count == 2
            assert err.journal.reset_kwargs == {"seed": i, "max_steps": 50}
            assert (err.journal.entries, err.journal.steps_applied) == ([], 2)  # counted
        assert pool.view().slots[4:] == ("lost",) * 4
        # Lost until reset: the next step answers the same error without touching a server.
        again = await pool.step([{"move": 1}] * 8)
        assert isinstance(again[5], SessionLostError) and again[5].journal is not None
        assert isinstance(again[0], StepResult) and again[0].observation["position"] == 4
        fresh = await pool.reset(seeds=0, mask=[i >= 4 for i in range(8)], max_steps=50)
        assert all(isinstance(fresh[i], StepResult) for i in range(4, 8))
        assert (await pool.step([{"move": 1}] * 8)).ok


async def test_killed_shard_under_replay_rebuilds_the_episodes(
        ray_local: Any, threads: Any) -> None:
    """ray.kill mid-batch, replay: a new shard replays each episode; answers are unchanged."""
    st = threads()
    async with EnvPool([st.url], 8) as local:
        await local.reset(seeds=0, max_steps=50)
        expected = [_rows(await local.step([{"move": m}] * 8)) for m in (1, -1, 1, 1)]
    async with RayEnvPool([st.url], 8, shards=2, on_session_lost="replay") as pool:
        first_actor = pool.actors()[0]
        await pool.reset(seeds=0, max_steps=50)
        got = [_rows(await pool.step([{"move": m}] * 8)) for m in (1, -1)]
        got.append(_rows(await _kill_mid_batch(ray_local, st, pool, 8, shard=0)))
        got.append(_rows(await pool.step([{"move": 1}] * 8)))
        assert pool.actors()[0] is not first_actor
    assert got == expected


@pytest.mark.parametrize("policy", ["raise", "replay"])
async def test_killed_shard_with_sent_steps(ray_local: Any, threads: Any, policy: Any) -> None:
    """A shard killed with ready-first steps in flight: per-slot errors, or replayed steps."""
    st = threads()
    async with RayEnvPool([st.url], 4, shards=2, on_session_lost=policy) as pool:
        await pool.reset(seeds=0)
        assert (await pool.step([{"move": 2}] * 4)).ok
        before = _stall_next(st)
        await pool.step_send([{"move": 1}] * 4)
        await asyncio.to_thread(st.call, lambda s: s.wait_for_request("step", before + 4))
        ray_local.kill(pool.actors()[0], no_restart=True)
        first = await pool.step_recv(min_ready=2)
        st.call(lambda s: s.unstall_all())
        rest = await pool.step_recv()
        answers = {i: (first[i] if i in first.ready else rest[i]) for i in range(4)}
        assert set(first.ready) | set(rest.ready) == set(range(4))
        for i in range(4):
            answer = answers[i]
            if policy == "raise" and i < 2:
                assert isinstance(answer, SessionLostError)
                assert answer.journal is not None and answer.journal.step_count == 1
            else:
                assert isinstance(answer, StepResult)
                assert answer.observation["position"] == 3 and answer.observation["step"] == 2


def _release_unstalled(server: Any) -> None:
    """Let every connection not already holding a request answer its next ones."""
    for handle in server.connections:
        if not handle.stalled:
            handle.faults.stall_after = None


def _pool_of(kind: str, url: str, size: int, *, shards: int) -> Any:
    """The pool a two-pool comparison runs on: in-process (the reference) or on Ray."""
    if kind == "in_process":
        return EnvPool([url], size)
    return RayEnvPool([url], size, shards=shards)


def _restarts(reader: InMemoryMetricReader) -> dict[tuple[int, str], int]:
    """envlink.ray.shard.restarts by (shard, reason)."""
    data = reader.get_metrics_data()
    points = [] if data is None else [
        p for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
        if m.name == "envlink.ray.shard.restarts" for p in m.data.data_points]
    return {(p.attributes["envlink.ray.shard"], p.attributes["envlink.reason"]): p.value
            for p in points}


async def test_idle_shard_death_and_a_callers_bug(ray_local: Any, threads: Any) -> None:
    """A shard that died between calls is replaced; a bad action raises the TypeError itself."""
    st = threads()
    reader = InMemoryMetricReader()
    mp = MeterProvider(metric_readers=[reader])
    async with RayEnvPool([st.url], 4, shards=2, meter_provider=mp) as pool:
        await pool.reset(seeds=0)
        assert _restarts(reader) == {}
        ray_local.kill(pool.actors()[1], no_restart=True)
        batch = await pool.step([{"move": 1}] * 4)
        assert isinstance(batch[0], StepResult)
        assert all(isinstance(batch[i], SessionLostError) for i in (2, 3))
        assert _restarts(reader) == {(1, "died"): 1}  # the restart is counted once
        assert (await pool.reset(seeds=0)).ok
        with pytest.raises(TypeError):
            await pool.step([{"move": 1}, {"move": 1}, 3, {"move": 1}])
    mp.shutdown()


def test_public_names_and_validation(ray_local: Any) -> None:
    """envlink.ray exports its names; bad options raise ValueError/TypeError at once."""
    import envlink.ray

    assert set(envlink.ray.__all__) == {"RayEnvPool", "ShardTelemetry"}
    with pytest.raises(ValueError, match="shards"):
        RayEnvPool("ws://127.0.0.1:9", 4, shards=0)
    with pytest.raises(ValueError, match="cannot exceed"):
        RayEnvPool("ws://127.0.0.1:9", 2, shards=3)
    with pytest.raises(ValueError, match="autoreset"):
        RayEnvPool("ws://127.0.0.1:9", 4, autoreset="sometimes")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        RayEnvPool("ws://127.0.0.1:9", 4, client=int)  # type: ignore[arg-type]


def test_the_driver_checks_options_without_building_a_pool(
        ray_local: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """RayEnvPool is an AsyncPool and checks its options with the in-process pool's
    PoolOptions (same errors), without building an EnvPool on the driver."""
    import envlink._pool.pool
    from envlink._pool import AsyncPool, PoolOptions

    assert AsyncPool in RayEnvPool.__mro__

    def no_pool(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the driver built an EnvPool")

    monkeypatch.setattr(envlink._pool.pool.EnvPool, "__init__", no_pool)
    bad: list[dict[str, Any]] = [{"max_inflight": 0}, {"batch_timeout": -1.0},
                                 {"on_session_lost": "auto"}, {"breaker_threshold": 0}]
    for options in bad:
        with pytest.raises(ValueError, match="must be") as from_ray:
            RayEnvPool("ws://127.0.0.1:9", 4, **options)
        with pytest.raises(ValueError, match="must be") as from_options:
            PoolOptions("ws://127.0.0.1:9", 4, **options)
        assert str(from_ray.value) == str(from_options.value), options


async def test_an_unresponsive_shard_is_replaced(ray_local: Any, threads: Any) -> None:
    """A shard that stops answering (its loop blocked) is killed and replaced: no hang."""
    import time

    st = threads()
    # Slot 0's automatic reset blocks its shard's event loop (a stuck actor).
    stuck = lambda slot, episode: (time.sleep(120) if slot == 0 else None) or {}  # noqa: E731
    reader = InMemoryMetricReader()
    mp = MeterProvider(metric_readers=[reader])
    async with RayEnvPool([st.url], 4, shards=2, autoreset_kwargs=stuck,
                          shard_timeout_margin=1.0, meter_provider=mp) as pool:
        first_actor = pool.actors()[0]
        await pool.reset(seeds=0, max_steps=1)
        assert all(r.done for r in (await pool.step([{"move": 1}] * 4)).results())
        started = time.monotonic()
        batch = await pool.step([{"move": 1}] * 4, timeout=1.0)
        # Two bounded waits at most: the call, then its retry on the new actor.
        assert time.monotonic() - started < 30
        assert batch.autoreset == (2, 3)
        assert all(isinstance(batch[i], StepResult) for i in (2, 3))
        for i in (0, 1):
            assert isinstance(batch[i], SessionLostError)
            assert "no answer within 2 s" in str(batch[i])
        assert pool.actors()[0] is not first_actor
        assert _restarts(reader) == {(0, "unresponsive"): 1}
    mp.shutdown()


async def test_a_batch_deadline_on_a_shard_says_whether_the_step_was_sent(
        ray_local: Any, threads: Any) -> None:
    """Through Ray as in-process: a step sent then cut is outcome_unknown, one never sent not."""
    st = threads()

    def latency(seconds: float) -> int:
        """Answers leave the server ``seconds`` late (it keeps reading); the step count now."""

        def apply(server: Any) -> int:
            server.faults.latency = seconds
            return int(server._counters.get("request.step"))

        return int(st.call(apply))

    async with RayEnvPool([st.url], 2, shards=1, max_inflight=1) as pool:
        assert (await pool.reset(seeds=0)).ok
        # Slot 0's step reaches the server and is answered 5 s late (a long deadline:
        # it keeps the window of one); slot 1's step, in a batch of its own with a
        # short deadline, waits behind it and is never sent.
        before = latency(5.0)
        await pool.step_send([{"move": 1}, None], mask=[True, False], timeout=60)
        await asyncio.to_thread(st.call, lambda s: s.wait_for_request("step", before + 1))
        alone = await pool.step([None, {"move": 1}], mask=[False, True], timeout=0.5)
        unsent = alone[1]
        assert isinstance(unsent, CallTimeoutError) and unsent.outcome_unknown is False
        assert "was sent" not in str(unsent)
        assert st.call(lambda s: int(s._counters.get("request.step"))) == before + 1
        assert isinstance((await pool.step_recv())[0], StepResult)
        # Now slot 0's step is sent and cut by its deadline: its outcome is unknown.
        before = latency(3.0)
        batch = await pool.step([{"move": 1}, None], mask=[True, False], timeout=1.0)
        assert st.call(lambda s: int(s._counters.get("request.step"))) == before + 1
        latency(0.0)
        sent = batch[0]
        assert isinstance(sent, CallTimeoutError)
        assert sent.outcome_unknown is True and sent.method == "step"
        assert "was sent" in str(sent)


async def test_ready_first_sees_a_step_sent_while_its_shard_waits(
        ray_local: Any, threads: Any) -> None:
    """A second step_send's answers reach step_recv while the shard still waits on a held step."""
    st = threads()
    async with RayEnvPool([st.url], 2, shards=1) as pool:
        assert (await pool.reset(seeds=0)).ok
        before = _stall_next(st)
        await pool.step_send([{"move": 1}, None], mask=[True, False])
        # Slot 0's step is held at the server (its shard now waits to collect it); the
        # other connection is not stalled after all.
        await asyncio.to_thread(st.call, lambda s: s.wait_for_request("step", before + 1))

        st.call(_release_unstalled)
        await pool.step_send([None, {"move": 2}], mask=[False, True])
        # A bound, not a timing check: slot 1 answers at once, slot 0 not before it is freed.
        first = await pool.step_recv(min_ready=1, timeout=30)
        assert first.ready == (1,) and first.stragglers == (0,)
        assert isinstance(first[1], StepResult) and first[1].observation["position"] == 2
        st.call(lambda s: s.unstall_all())
        rest = await pool.step_recv()
        assert rest.ready == (0,)
        assert isinstance(rest[0], StepResult) and rest[0].observation["position"] == 1
        assert (await pool.step([{"move": 1}] * 2)).ok


async def test_closing_under_a_waiting_step_recv(ray_local: Any, threads: Any) -> None:
    """Closing the pool while step_recv waits on held steps answers ClientClosedError per
    slot, as the in-process pool does, and leaves nothing in flight."""
    st = threads()
    pool = RayEnvPool([st.url], 2, shards=1)
    try:
        assert (await pool.reset(seeds=0)).ok
        before = _stall_next(st)
        await pool.step_send([{"move": 1}] * 2)
        await asyncio.to_thread(st.call, lambda s: s.wait_for_request("step", before + 2))
        # The callback runs once step_recv first suspends, that is once it waits.
        closing: list[asyncio.Future[None]] = []
        asyncio.get_running_loop().call_soon(
            lambda: closing.append(asyncio.ensure_future(pool.close())))
        batch = await asyncio.wait_for(pool.step_recv(), 30)
        await closing[0]
        assert batch.ready == (0, 1)
        assert all(isinstance(r, ClientClosedError) for r in batch)
        assert len(await pool.step_recv()) == 2  # nothing left in flight: an empty batch
    finally:
        st.call(lambda s: s.unstall_all())
        await pool.close()


@pytest.mark.parametrize("kind", ["in_process", "ray"])
async def test_a_callers_bug_in_a_ready_first_receive(
        ray_local: Any, threads: Any, kind: str) -> None:
    """A bad action raised while its shard collects ready-first is raised for that slot
    alone, as in-process: the slot steps again, the held slot stays in flight and answers."""
    st = threads()
    pool = _pool_of(kind, st.url, 2, shards=1)
    try:
        assert (await pool.reset(seeds=0)).ok
        before = _stall_next(st)
        await pool.step_send([{"move": 1}, 3])  # slot 0 held at the server; 3 is no action
        await asyncio.to_thread(st.call, lambda s: s.wait_for_request("step", before + 1))

        st.call(_release_unstalled)
        with pytest.raises(TypeError, match="action must be"):
            await pool.step_recv(min_ready=1, timeout=30)
        again = await pool.step([None, {"move": 2}], mask=[False, True])
        assert isinstance(again[1], StepResult) and again[1].observation["position"] == 2
        with pytest.raises(ValueError, match=r"slots \[0\] still have a call in flight"):
            await pool.step([{"move": 1}, None], mask=[True, False])
        st.call(lambda s: s.unstall_all())
        rest = await asyncio.wait_for(pool.step_recv(), 30)
        assert rest.ready == (0,) and rest.stragglers == ()
        assert isinstance(rest[0], StepResult) and rest[0].observation["position"] == 1
        batch = await pool.step([{"move": 1}] * 2)
        assert [r.observation["position"] for r in batch.results()] == [2, 3]
    finally:
        st.call(lambda s: s.unstall_all())
        await pool.close()


@pytest.mark.parametrize("kind", ["in_process", "ray"])
async def test_a_callers_bug_in_a_whole_batch_step_waits_for_every_slot(
        ray_local: Any, threads: Any, kind: str) -> None:
    """A bad action in one shard's slot is raised, as in-process, only once every slot of
    the step answered (the other shard's included): nothing is left running, and a step
    of a slot still running is refused with the driver's slot number."""
    st = threads()
    pool = _pool_of(kind, st.url, 2, shards=2)
    try:
        assert (await pool.reset(seeds=0)).ok
        before = _stall_next(st)
        task = asyncio.ensure_future(pool.step([3, {"move": 1}]))  # 3 is no action
        # Slot 1's step is held at the server; slot 0's bad action never left its client.
        await asyncio.to_thread(st.call, lambda s: s.wait_for_request("step", before + 1))

        st.call(_release_unstalled)
        # A bound, not a synchronisation: the step cannot end while slot 1 is held.
        done, _ = await asyncio.wait({task}, timeout=1.0)
        assert not done  # the bug waits for slot 1's answer
        with pytest.raises(ValueError, match=r"slots \[1\] still have a call in flight"):
            await pool.step([None, {"move": 2}], mask=[False, True])
        st.call(lambda s: s.unstall_all())
        with pytest.raises(TypeError, match="action must be a dict or a pydantic model"):
            await asyncio.wait_for(task, 30)
        # Slot 1's step was applied and settled: it steps again at once.
        again = await pool.step([None, {"move": 2}], mask=[False, True])
        assert isinstance(again[1], StepResult) and again[1].observation["position"] == 3
        batch = await pool.step([{"move": 1}] * 2)
        assert [r.observation["position"] for r in batch.results()] == [1, 4]
    finally:
        st.call(lambda s: s.unstall_all())
        await pool.close()


async def test_a_cancelled_batch_keeps_its_slots_busy_until_their_shard_answers(
        ray_local: Any, threads: Any) -> None:
    """A step cancelled on the driver still runs in its shards: its slots are refused as
    in flight, with the driver's slot numbers, until they answer (their answers kept);
    closing the pool under such a step ends it without replacing a shard."""
    st = threads()
    pool = RayEnvPool([st.url], 2, shards=2)

    async def cancelled_step(move: int) -> None:
        before = _stall_next(st)
        task = asyncio.ensure_future(pool.step([{"move": move}] * 2))
        await asyncio.to_thread(st.call, lambda s: s.wait_for_request("step", before + 2))
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    try:
        assert (await pool.reset(seeds=0)).ok
        actors = pool.actors()
        await cancelled_step(1)
        with pytest.raises(ValueError, match=r"slots \[1\] still have a call in flight"):
            await pool.step([None, {"move": 2}], mask=[False, True])
        st.call(lambda s: s.unstall_all())
        # The driver's only handle on what the shards still run: wait for their answers.
        await asyncio.wait_for(asyncio.gather(*pool._cancelled), 30)
        batch = await pool.step([{"move": 2}] * 2)  # the cancelled step was applied
        assert [r.observation["position"] for r in batch.results()] == [3, 3]
        await cancelled_step(1)
        await asyncio.wait_for(pool.close(), 60)  # the held steps end with the actors
        assert not pool._cancelled
        assert pool.actors() == actors  # no shard was taken for dead and replaced
    finally:
        st.call(lambda s: s.unstall_all())
        await pool.close()


@pytest.mark.parametrize("kind", ["in_process", "ray"])
async def test_an_action_that_cannot_reach_its_shard_answers_for_its_own_slot(
        ray_local: Any, threads: Any, kind: str) -> None:
    """An action Ray cannot pickle to its shard answers InvalidActionError for its own slot,
    ready-first, in a whole step or reset, as in-process a value JSON cannot carry does:
    nothing is left to wait on, and the other slots' steps are applied."""
    st = threads()
    pool = _pool_of(kind, st.url, 4, shards=2)
    try:
        assert (await pool.reset(seeds=0)).ok
        actions = [{"move": 1}, {"move": 1}, {"move": 1}, {"move": threading.Lock()}]
        await asyncio.wait_for(pool.step_send(actions), 30)
        sent = await asyncio.wait_for(pool.step_recv(), 30)
        whole = await pool.step(actions)
        for batch in (sent, whole):
            assert batch.ready == (0, 1, 2, 3)
            assert isinstance(batch[3], InvalidActionError) and batch[3].path.startswith("action")
            if kind == "ray":
                assert "slot 3: cannot be pickled to its shard actor" in str(batch[3])
        assert [whole[i].observation["position"] for i in range(3)] == [2, 2, 2]
        batch = await pool.step([{"move": 1}] * 4)
        assert [r.observation["position"] for r in batch.results()] == [3, 3, 3, 1]
        # Reset arguments that cannot be pickled: no slot's own value, the whole call.
        refused = await pool.reset(seeds=0, mask=[False, False, False, True],
                                   bad=threading.Lock())
        assert isinstance(refused[3], InvalidActionError)
        assert refused[3].path.startswith("reset")
        if kind == "ray":
            assert "slot 3: the call to its shard actor cannot be pickled" in str(refused[3])
            assert "\n" not in str(refused[3])  # Ray's first line, not its long report
    finally:
        await pool.close()


@pytest.mark.parametrize(("kind", "hops"), [("in_process", 1), ("ray", 1), ("ray", 2)])
async def test_a_cancelled_step_send_still_sends_every_slot(
        ray_local: Any, threads: Any, kind: str, hops: int) -> None:
    """A step_send cancelled once it began (before or after its shards' calls left) still
    sends every slot, as an in-process one (which never waits) does: step_recv collects
    each of them, none is left to wait on nothing."""
    st = threads()
    pool = _pool_of(kind, st.url, 4, shards=2)
    try:
        assert (await pool.reset(seeds=0)).ok
        loop = asyncio.get_running_loop()
        task = asyncio.ensure_future(pool.step_send([{"move": 1}] * 4))
        # The cancel lands after the send's first `hops` turns of the loop: at its first
        # wait (no shard call has left yet), or once each shard's call has left.
        cancel: Any = task.cancel
        for _ in range(hops - 1):
            cancel = (lambda inner: lambda: loop.call_soon(inner))(cancel)
        loop.call_soon(cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await task
        batch = await asyncio.wait_for(pool.step_recv(), 30)
        assert batch.ready == (0, 1, 2, 3)
        assert [r.observation["position"] for r in batch.results()] == [1] * 4
        batch = await pool.step([{"move": 1}] * 4)
        assert [r.observation["position"] for r in batch.results()] == [2] * 4
    finally:
        await pool.close()


async def test_an_answer_that_cannot_reach_the_driver_fails_its_own_slot_only(
        ray_local: Any, threads: Any) -> None:
    """A collected step whose result cannot be pickled to the driver is raised for its own
    (driver) slot; the shard's held step stays in flight, refused as such with the
    driver's slot number, and answers once freed. In a whole-batch step it is raised once
    every slot answered, the other slots' steps kept."""

    class Unpicklable(GenericEnvClient):
        """Answers the action "lock" without the server, with an unpicklable observation."""

        async def step(self, action: Any, **kwargs: Any) -> Any:
            if action == "lock":
                return StepResult(observation={"lock": threading.Lock()}, reward=0.0,
                                  done=False)
            return await super().step(action, **kwargs)

    st = threads()
    pool = RayEnvPool([st.url], 4, shards=2, client=Unpicklable)
    try:
        assert (await pool.reset(seeds=0)).ok
        before = _stall_next(st)
        # Slot 2 is held at the server; slot 3 (the same shard) answers at once.
        await pool.step_send([None, None, {"move": 1}, "lock"], mask=[False, False, True, True])
        await asyncio.to_thread(st.call, lambda s: s.wait_for_request("step", before + 1))

        st.call(_release_unstalled)
        with pytest.raises(RuntimeError, match=r"^slot 3: its answer could not be sent"):
            await pool.step_recv(min_ready=1, timeout=30)
        with pytest.raises(ValueError, match=r"slots \[2\] still have a call in flight"):
            await pool.step([None, None, {"move": 1}, None], mask=[False, False, True, False])
        st.call(lambda s: s.unstall_all())
        rest = await asyncio.wait_for(pool.step_recv(), 30)
        assert rest.ready == (2,) and rest.stragglers == ()
        assert isinstance(rest[2], StepResult) and rest[2].observation["position"] == 1
        batch = await pool.step([{"move": 1}] * 4)
        assert [r.observation["position"] for r in batch.results()] == [1, 1, 2, 1]
        with pytest.raises(RuntimeError, match=r"^slot 3: its answer could not be sent"):
            await pool.step([{"move": 1}, {"move": 1}, {"move": 1}, "lock"])
        batch = await pool.step([{"move": 1}] * 4)
        assert [r.observation["position"] for r in batch.results()] == [3, 3, 4, 2]
    finally:
        st.call(lambda s: s.unstall_all())
        await pool.close()


async def test_a_large_buffer_in_a_result_reaches_the_driver(
        ray_local: Any, threads: Any) -> None:
    """A result holding a 1 MiB buffer (as an array does; Ray passes it out of band)
    reaches the driver equal, in a whole-batch step and a ready-first receive."""

    class Frame:
        def __init__(self, data: bytearray) -> None:
            self.data = data

        def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
            import pickle

            return Frame, (pickle.PickleBuffer(self.data) if protocol >= 5
                           else bytes(self.data),)

    class Framed(GenericEnvClient):
        """Answers the action "frame" without the server, with a 1 MiB observation."""

        async def step(self, action: Any, **kwargs: Any) -> Any:
            if action == "frame":
                return StepResult(observation=Frame(bytearray(b"f" * (1 << 20))),
                                  reward=0.0, done=False)
            return await super().step(action, **kwargs)

    st = threads()
    async with RayEnvPool([st.url], 2, shards=1, client=Framed) as pool:
        assert (await pool.reset(seeds=0)).ok
        batch = await pool.step(["frame", {"move": 1}])
        assert bytes(batch[0].observation.data) == b"f" * (1 << 20)
        assert batch[1].observation["position"] == 1
        await pool.step_send(["frame", None], mask=[True, False])
        got = await asyncio.wait_for(pool.step_recv(), 30)
        assert got.ready == (0,) and bytes(got[0].observation.data) == b"f" * (1 << 20)
